"""cudnn"""
from __future__ import annotations
