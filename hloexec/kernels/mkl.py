"""Intel MKL's sgemm for blas.py's f32 blocks, where the optional `mkl` package is installed
(`pip install 'hloexec[mkl]'`: ~1.1 GB, so not a default dependency).

Why: on this project's Intel machine (AVX-512) MKL's one-thread sgemm ran 7-10% faster than the OpenBLAS
numpy ships (SkylakeX kernels) over the GPT d256 step's products, up to 2x on its small batched attention
products (bench/README.md, "Which BLAS"). BLIS (the `blis` package) ran at a third of either.

MKL runs sequential (no threads of its own: blas.py's blocks are the parallelism) and in conditional numerical
reproducibility mode AUTO (results independent of the operands' alignment), so a block gives the same bits on
every thread and in every run, as blas.py requires. $HLOEXEC_BLAS=openblas keeps numpy's BLAS even where MKL
is installed; so does a process that loaded MKL before (numpy built with MKL: its matmul is MKL's already).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

import numpy as np

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL
_CBWR_AUTO = 2  # MKL_CBWR_AUTO
_F32 = np.dtype(np.float32)


def _library_path() -> str | None:
    """libmkl_rt of the installed `mkl` distribution (its wheel puts it in the environment's lib/)."""
    from importlib import metadata

    try:
        files = metadata.distribution("mkl").files or ()
    except metadata.PackageNotFoundError:
        return None
    found = [f for f in files if f.name.startswith("libmkl_rt.so")]
    return str(found[0].locate()) if found else None


_rejected: list[int] = []  # parameter numbers MKL rejected


@ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int)
def _on_bad_parameter(name, number, length):
    _rejected.append(number[0])


def _loaded_already() -> bool:
    """Whether MKL is in the process already (numpy or scipy built with MKL): its threading layer is then
    process-wide and someone else's, and numpy's matmul is MKL's anyway."""
    try:
        with open("/proc/self/maps") as maps:
            return "libmkl_rt" in maps.read()
    except OSError:
        return False


def _load() -> tuple[Callable[..., None], Callable[..., None]] | None:
    """MKL's (cblas_sgemm_batch_strided, cblas_gemm_f16f16f32) set up as the module docstring says, or None (not
    installed, not loadable, or $HLOEXEC_BLAS=openblas)."""
    if os.environ.get("HLOEXEC_BLAS", "").lower() == "openblas":
        return None
    path = _library_path()
    if path is None or _loaded_already():
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    lib.MKL_Set_Threading_Layer(ctypes.c_int(_SEQUENTIAL))  # before any other call: no OpenMP runtime
    if lib.MKL_CBWR_Set(ctypes.c_int(_CBWR_AUTO)) != 0:  # MKL_CBWR_SUCCESS
        return None
    lib.mkl_set_xerbla(_on_bad_parameter)  # instead of printing and computing nothing
    i, p, f = ctypes.c_int, ctypes.c_void_p, ctypes.c_float
    sgemm, f16 = lib.cblas_sgemm_batch_strided, lib.cblas_gemm_f16f16f32
    sgemm.argtypes = [i, i, i, i, i, i, f, p, i, i, p, i, i, f, p, i, i, i]
    f16.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    sgemm.restype = f16.restype = None
    return sgemm, f16


_functions = _load()
AVAILABLE = _functions is not None
_F16 = np.dtype(np.float16)


def _layout(x: np.ndarray):
    """(transposed?, leading dimension, leading dimension x outer count) of a [B, rows, cols] view whose
    matrices BLAS can read or write in place (row-major, or column-major read as transposed), else None; in
    elements. Leading dimensions follow BLAS's rules (>= the row length, >= 1), so MKL never rejects a call here;
    it also wants batch strides of at least the third value."""
    B, rows, cols = x.shape
    if any(st % x.itemsize or st < 0 for st in x.strides):
        return None
    _, sr, sc = (st // x.itemsize for st in x.strides)
    if sc == 1 or cols == 1:
        ld = sr if rows > 1 else cols
        if ld >= max(cols, 1):
            return False, max(ld, 1), max(ld, 1) * rows
    if sr == 1 or rows == 1:
        ld = sc if cols > 1 else rows
        if ld >= max(rows, 1):
            return True, max(ld, 1), max(ld, 1) * cols
    return None


def _batch_stride(x: np.ndarray, extent: int):
    """The element stride between x's matrices if MKL takes it (the least it takes for a single matrix), else
    None (then one call per matrix)."""
    s = x.strides[0] // x.itemsize
    return extent if x.shape[0] == 1 else s if s >= extent else None


def matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out[...] = a @ b for f32 or f16 [B, M, K] @ [B, K, N] (both operands of one type) into an f32 [B, M, N]
    view that `can_write`; operands BLAS cannot read in place are copied first. f16 operands are read as they
    are (cblas_gemm_f16f16f32: the same bits as sgemm of the operands widened to f32, measured, without the
    widening pass)."""
    if _functions is None:
        raise RuntimeError("MKL is not loaded (callers check AVAILABLE)")
    sgemm_batch_strided, gemm_f16f16f32 = _functions
    B, M, K = a.shape
    N = b.shape[2]
    if out.size == 0:
        return
    if K == 0:
        out[...] = 0
        return
    la, lb, lc = _layout(a), _layout(b), _layout(out)
    if la is None:
        a = np.ascontiguousarray(a)
        la = _layout(a)
    if lb is None:
        b = np.ascontiguousarray(b)
        lb = _layout(b)
    transposes = _TRANS if la[0] else _NO_TRANS, _TRANS if lb[0] else _NO_TRANS
    if a.dtype == _F16:
        for i in range(B):
            gemm_f16f16f32(
                _ROW_MAJOR,
                *transposes,
                M,
                N,
                K,
                1.0,
                a[i].ctypes.data,
                la[1],
                b[i].ctypes.data,
                lb[1],
                0.0,
                out[i].ctypes.data,
                lc[1],
            )
        _raise_if_rejected("gemm_f16f16f32", M, N, K, la, lb, lc)
        return
    strides = [_batch_stride(x, layout[2]) for x, layout in ((a, la), (b, lb), (out, lc))]
    if None in strides:  # one call per matrix, with strides MKL takes: it rejects (prints, computes nothing)
        calls = [(i, 1) for i in range(B)]  # a stride below ld x the outer count
        sa, sb, sc = la[2], lb[2], lc[2]
    else:
        calls = [(0, B)]
        sa, sb, sc = strides
    for first, count in calls:
        sgemm_batch_strided(
            _ROW_MAJOR,
            *transposes,
            M,
            N,
            K,
            1.0,
            a[first:].ctypes.data,
            la[1],
            sa,
            b[first:].ctypes.data,
            lb[1],
            sb,
            0.0,
            out[first:].ctypes.data,
            lc[1],
            sc,
            count,
        )
    _raise_if_rejected("sgemm_batch_strided", M, N, K, la, lb, lc)


def _raise_if_rejected(function: str, M: int, N: int, K: int, *layouts):
    if _rejected:
        raise RuntimeError(
            f"MKL rejected parameter {_rejected.pop()} of {function} (M={M} N={N} K={K}, layouts {layouts})"
        )


def can_write(out: np.ndarray) -> bool:
    """Whether `matmul_into` can write this [B, M, N] view: f32, each matrix row-major in place."""
    layout = _layout(out) if out.dtype == _F32 else None
    return layout is not None and not layout[0]
