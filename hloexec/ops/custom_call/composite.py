"""composite"""
from __future__ import annotations
