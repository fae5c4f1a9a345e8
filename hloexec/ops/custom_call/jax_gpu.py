"""jax_gpu"""
from __future__ import annotations
