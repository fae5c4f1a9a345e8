"""The process heap kept for reuse between runs instead of handed back to the kernel.

A run frees each buffer after its last use and makes new ones of the same sizes on the next run. glibc's malloc
returns such memory to the kernel (arrays from 128 KiB up are mmap'd and unmapped; the heap's top is trimmed
once 256 KiB of it are free), so every warm run faults its buffers' pages in again: ~10,000 minor faults per
run of the GPT d256 step, 15-20% of its warm time (bench/README.md, "Page faults"). Here buffers up to 32 MiB
(glibc's limit) come from the heap, and up to `KEPT_BYTES` of freed heap stay mapped for the next run. The
price: what a run freed stays resident after it (up to `KEPT_BYTES`), and the heap's fragments can raise the
peak a little (measured: the GPT d256 steps' peak RSS unchanged, the mixed-precision Adam step's 420 -> 478 MiB).

Process-wide, so it is applied by the first `hloexec.load`, not at import, and only where nobody chose: not
with glibc's own MALLOC_TRIM_THRESHOLD_ / MALLOC_MMAP_THRESHOLD_ set, and not with HLOEXEC_KEEP_FREED_MEMORY=0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

KEPT_BYTES = 1 << 30  # freed heap kept mapped at most
MMAP_FROM_BYTES = 32 << 20  # allocations from here up are mapped on their own (glibc's largest threshold)

_M_TRIM_THRESHOLD = -1  # mallopt parameters, malloc.h
_M_MMAP_THRESHOLD = -3
_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Tune glibc's malloc once for the process (see the module's docstring); whether it is tuned."""
    global _applied
    if _applied is None:
        _applied = _tune()
    return _applied


def _tune() -> bool:
    if os.environ.get("HLOEXEC_KEEP_FREED_MEMORY", "1") == "0":
        return False
    if "MALLOC_TRIM_THRESHOLD_" in os.environ or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc only: other C libraries' mallopt parameters differ
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_TRIM_THRESHOLD, KEPT_BYTES)) and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_FROM_BYTES))
