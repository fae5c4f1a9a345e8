"""neuron"""
from __future__ import annotations
