"""Text -> IR: the C scanner (scan.py, over csrc/) and the builder that links its tables (build.py)."""

from .build import parse  # noqa: F401
