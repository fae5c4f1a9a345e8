"""BLAS products with results that do not depend on the thread count, computed on every core.

OpenBLAS splits a call between its threads at points that depend on the thread count, and elements at
a split come out of other micro-kernels or other partial sums. Measured (OpenBLAS 0.3.31, 1 vs 2
threads): 8,949 of 196,608 elements of a 512x4096 @ 4096x384 f32 GEMM differ, and so does an f64 vector
dot of 20,000 elements, a complex64 GEMV of 150,000 multiply-adds and a complex `x @ x.T` (SYRK, which
has no size threshold) of 1,024. So every BLAS call made here runs with BLAS on one thread, and large
products get the cores back through a split of our own that depends on the shapes only: the output is
cut into a fixed set of blocks (batch items, else row or column ranges: `_blocks`), each block is one
single-threaded BLAS call writing its slice of a preallocated output, and the calling thread and a
small pool take blocks until none is left. A block gives the same bits whichever thread computes it, so
results are identical for any pool size, OPENBLAS_NUM_THREADS or core count.
Integer products (numpy's own loops, exact) are left to numpy. Where the optional `mkl` package is
installed, f32 blocks computed with floating-point errors ignored are MKL's sgemm, sequential and
reproducible (kernels/mkl.py): 7-10% faster than numpy's OpenBLAS on this project's Intel machine; f16
operands that would be widened to f32 are read by MKL as they are (the same bits, no widening pass).

The BLAS thread count is process-wide: it is set to one while any call here runs and restored when the
last one returns (counted: SPMD participants run dots from several threads at once), so BLAS calls
elsewhere in the process keep their threads outside ours. How many threads compute blocks follows the
BLAS's own setting as found on entry (OPENBLAS_NUM_THREADS, threadpoolctl limits; by default the
available cores), so a process that limited BLAS to one thread gets one thread here too. Not covered:
an OpenBLAS built on OpenMP keeps its count per thread (numpy's wheels use pthreads), and a thread that
changes the BLAS setting while a product here runs.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading

import numpy as np

from . import mkl
from .threads import CORES, ranges, run_blocks

# Measured on 2 cores (bench/README.md, "Dots"). Every block packs the whole other operand again, so
# blocks are few and wide: a 2048^3 sgemm in 8 blocks of 256 rows ran 7% slower than in 4 of 512.
_BLOCK_WORK = 1 << 23  # multiply-adds per block at least: ~0.15 ms of sgemm, vs ~10 us to hand it off
_MAX_BLOCKS = 8  # blocks per product at most (balances up to 8 threads)
_MIN_SIDE = 512  # rows (or columns) per block at least ...
_MIN_HALF = 128  # ... but a product may be halved down to 128 (256^3: 1.3x one thread's speed)
_GRANULE = 16  # block edges at multiples of 16 rows/columns: whole micro-kernel tiles
_EVERY = slice(None)
# MKL's call costs more than OpenBLAS's (a 64x32x64 sgemm: ~5 against ~2.5 us, plus ~8 us of ctypes and layout
# checks here): smaller products stay with numpy
_MKL_MIN_WORK = 1 << 22
_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
# OpenBLAS runs a real (f32, f64) call this small on the calling thread whatever its thread setting (interface/
# gemm.c: M*N*K up to 65536 x GEMM_MULTITHREAD_THRESHOLD (4); gemv and dot: observed single-threaded here up to
# 40,000 / 20,000 elements), so the bits do not depend on the setting and switching it (~4-60 us, most of a small
# dot's time) is skipped. Complex GEMVs are threaded from a few thousand elements on, and SYRK (`x @ x.T` of one
# buffer) splits at any size: those, and operands that may share memory, still switch.
_ONE_THREAD_ANYWAY = 8192


class _OneBlasThread:
    """Context manager holding the process' BLAS at one thread while any thread is inside it.

    Entering gives how many threads the BLAS had before the first entry (the process' own setting),
    at most the available cores.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.inside = 0
        self.libraries = None  # (its thread-count getter, setter) per BLAS
        self.stale = False  # a BLAS was loaded since `libraries` was found
        self.restore = []  # (setter, thread count) to put back on the last exit
        self.setting = 1

    def __enter__(self) -> int:
        with self.lock:
            if self.inside == 0:
                if self.libraries is None or self.stale:
                    from threadpoolctl import ThreadpoolController

                    self.stale = False
                    found = ThreadpoolController().select(user_api="blas").lib_controllers
                    self.libraries = [_controls(lib) for lib in found]
                self.setting = CORES
                self.restore = []
                for get_num_threads, set_num_threads in self.libraries:
                    n = get_num_threads()
                    self.setting = min(self.setting, n)
                    if n != 1:
                        set_num_threads(1)
                        self.restore.append((set_num_threads, n))
            self.inside += 1
            return self.setting

    def __exit__(self, *exc_info):
        with self.lock:
            self.inside -= 1
            if self.inside == 0:
                for set_num_threads, n in self.restore:
                    set_num_threads(n)


def one_thread():
    """The context holding every BLAS the process has loaded at one thread: LAPACK calls run inside it, so
    their results do not depend on the thread count either."""
    return _one_blas_thread


def find_new_libraries():
    """Look for BLAS libraries again on the next entry (after importing one: scipy's)."""
    with _one_blas_thread.lock:
        _one_blas_thread.stale = True


def _controls(lib) -> tuple:
    """(get, set) the library's thread count, called on every hold. An OpenBLAS on its own threads: its C
    functions called keeping the GIL (ctypes.PyDLL: each reads or writes a counter; released and taken back,
    as threadpoolctl's calls do, the GIL cost ~8 us of CPU a call on the GPT step, other threads waiting for
    it). Else threadpoolctl's: its OpenBLAS `set_num_threads` works only in the first thread that called it
    and silently does nothing in any other (here: SPMD participants, or every thread once the main thread has
    set it); `_OneBlasThread`'s count is the coordination that rule stands in for, so it calls the setter
    underneath."""
    affixes = getattr(lib, "_symbol_prefix", None), getattr(lib, "_symbol_suffix", None)
    if lib.internal_api == "openblas" and getattr(lib, "threading_layer", None) == "pthreads" and None not in affixes:
        try:
            library = ctypes.PyDLL(lib.filepath)
            get, set_ = (getattr(library, f"{affixes[0]}openblas_{f}_num_threads{affixes[1]}") for f in ("get", "set"))
        except (OSError, AttributeError):
            pass
        else:
            get.restype, get.argtypes, set_.restype, set_.argtypes = ctypes.c_int, [], None, [ctypes.c_int]
            return get, set_
    return (lambda: lib.num_threads), getattr(lib, "_real_set_num_threads", lib.set_num_threads)


_one_blas_thread = _OneBlasThread()


def _forget_hold():
    """In a forked child: the parent's holders do not exist there."""
    global _one_blas_thread
    _one_blas_thread = _OneBlasThread()


os.register_at_fork(after_in_child=_forget_hold)


def _blocks(B: int, M: int, N: int, K: int):
    """The (batch, row, column) slices of a [B, M, N] output computed one BLAS call each, from the shapes
    alone; None for one call."""
    wanted = min(_MAX_BLOCKS, B * M * N * K // _BLOCK_WORK)
    if wanted < 2:
        return None
    wanted = 1 << (wanted.bit_length() - 1)  # a power of two: even shares for 2, 4, 8 threads
    if B >= wanted:
        return [(s, _EVERY, _EVERY) for s in ranges(B, wanted, 1)]
    side = max(M, N)  # cut the longer side: each block re-packs the other operand, K x (the shorter side)
    cuts = max(side // _MIN_SIDE, 2 if side >= 2 * _MIN_HALF else 1)
    per_item = max(1, min(-(-wanted // B), cuts))
    if M >= N:
        blocks = [(slice(b, b + 1), r, _EVERY) for b in range(B) for r in ranges(M, per_item, _GRANULE)]
    else:
        blocks = [(slice(b, b + 1), _EVERY, c) for b in range(B) for c in ranges(N, per_item, _GRANULE)]
    return blocks if len(blocks) > 1 else None


def matmul(
    a: np.ndarray, b: np.ndarray, *, threads: int | None = None, widen=None, narrow=None, dtype=None
) -> np.ndarray:
    """np.matmul of [B, M, K] @ [B, K, N], bit-identical whatever the thread count.

    `threads`: how many threads compute the blocks (default: the BLAS's thread setting, at most the
    available cores); it never changes the result.
    `widen(x)`: a slice of an operand in the dtype BLAS multiplies in (f16/bf16 operands), `narrow(r)`: a
    block of the product in `dtype` (default np.result_type(a, b)). Both run inside the blocks, on the
    threads computing them: the operand the blocks cut is converted a block at a time, never whole, and
    so is the product; the operand every block reads whole (the other side of a row or column split) is
    widened once, first.
    """
    B, M, K = a.shape
    N = b.shape[-1]
    dtype = np.result_type(a, b) if dtype is None else dtype
    if widen is None and a.dtype.kind not in "fc":  # numpy's own loops (integers): exact, no BLAS
        return np.matmul(a, b)
    widen = widen or _unchanged
    if a.dtype == b.dtype == _F16 and widen(a[:0, :0, :0]).dtype == _F32 and _mkl_takes(a, b):
        widen = _unchanged  # MKL reads f16 operands itself (kernels/mkl.py): no widening pass, the same bits
    if M * N * K <= _ONE_THREAD_ANYWAY and a.dtype.kind == b.dtype.kind == "f" and not np.may_share_memory(a, b):
        r = _product(widen(a), widen(b))
        return r if narrow is None else narrow(r)
    blocks = _blocks(B, M, N, K)
    with _one_blas_thread as setting:
        if blocks is None:
            r = _product(widen(a), widen(b))
            return r if narrow is None else narrow(r)
        rows_cut, cols_cut = blocks[0][1] != _EVERY, blocks[0][2] != _EVERY
        a = widen(a) if cols_cut else a  # read whole by every block of a column split
        b = widen(b) if rows_cut else b
        out = np.empty((B, M, N), dtype)

        def run(i):
            bs, rs, cs = blocks[i]
            if narrow is None:
                _product(widen(a[bs, rs]), widen(b[bs, :, cs]), out[bs, rs, cs])
            else:
                out[bs, rs, cs] = narrow(_product(widen(a[bs, rs]), widen(b[bs, :, cs])))

        run_blocks(len(blocks), run, threads or setting)
    return out


def _mkl_takes(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether MKL computes x @ y: the `mkl` extra installed (kernels/mkl.py), f32 or f16 operands of one type,
    a product big enough for its call cost, and floating-point errors ignored (dot_general's case; MKL reports
    none, so a caller asking for warnings or errors gets numpy's matmul, which does)."""
    return (
        mkl.AVAILABLE
        and x.dtype == y.dtype
        and x.dtype in (_F32, _F16)
        and x.shape[0] == y.shape[0]
        and x.shape[0] * x.shape[1] * x.shape[2] * y.shape[2] >= _MKL_MIN_WORK
        and all(v == "ignore" for v in np.geterr().values())
    )


def _product(x: np.ndarray, y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """[B, M, K] @ [B, K, N] (into `out`) on the calling thread: MKL where it takes it, else numpy's matmul."""
    if _mkl_takes(x, y):
        if out is None:
            out = np.empty(x.shape[:2] + y.shape[2:], _F32)
        if mkl.can_write(out):
            mkl.matmul_into(x, y, out)
            return out
    if x.dtype == _F16:  # left unwidened for MKL, which did not take this block: widen here (exact)
        x, y = x.astype(_F32), y.astype(_F32)
    return np.matmul(x, y, out=out)


def _unchanged(x):
    return x


def tensordot(a: np.ndarray, b: np.ndarray, axes, *, threads: int | None = None) -> np.ndarray:
    """np.tensordot(a, b, axes=(a_axes, b_axes)) through `matmul`: result dims = a's free, b's free."""
    a_axes, b_axes = list(axes[0]), list(axes[1])
    a_free = [d for d in range(a.ndim) if d not in a_axes]
    b_free = [d for d in range(b.ndim) if d not in b_axes]
    M = math.prod(a.shape[d] for d in a_free)
    N = math.prod(b.shape[d] for d in b_free)
    K = math.prod(a.shape[d] for d in a_axes)
    a3 = a.transpose(a_free + a_axes).reshape(1, M, K)
    b3 = b.transpose(b_axes + b_free).reshape(1, K, N)
    r = matmul(a3, b3, threads=threads)
    return r.reshape([a.shape[d] for d in a_free] + [b.shape[d] for d in b_free])
