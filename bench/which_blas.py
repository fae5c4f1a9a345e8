"""Which BLAS is fastest here: one-thread sgemm of every BLAS installed, on a module's own GEMM shapes.

    python bench/which_blas.py                          # the GPT d256 f32 pre step's 39 products
    python bench/which_blas.py path/to/module.hlo --reps 3

One thread, because that is how kernels/blas.py calls a BLAS (each block of a product is one single-threaded
call; the blocks are the parallelism). Candidates, each where installed (`pip install mkl scipy-openblas32
blis` in a scratch environment; the first is hloexec's `mkl` extra): numpy's OpenBLAS, Intel MKL (sequential,
CNR mode AUTO as kernels/mkl.py sets it), scipy-openblas32 (a newer OpenBLAS build), BLIS (the `blis`
package). For each distinct shape the libraries take turns, best of `--reps`; GFLOP/s over all products,
each shape weighted by its count.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roofline import gemm_shapes  # noqa: E402

_ROW_MAJOR, _NO_TRANS = 101, 111


def _cblas(function, int_type):
    """A contiguous 2-D f32 product through a cblas_sgemm of this integer width."""
    p = ctypes.c_void_p
    function.argtypes = [ctypes.c_int] * 3 + [int_type] * 3 + [ctypes.c_float, p, int_type, p, int_type,
                                                                 ctypes.c_float, p, int_type]
    function.restype = None

    def sgemm(a, b, c):
        (M, K), N = a.shape, b.shape[1]
        function(_ROW_MAJOR, _NO_TRANS, _NO_TRANS, M, N, K, 1.0, a.ctypes.data, K, b.ctypes.data, N, 0.0,
                 c.ctypes.data, N)
    return sgemm


def libraries() -> dict:
    found = {}
    from threadpoolctl import threadpool_info
    for info in threadpool_info():
        if info["internal_api"] == "openblas" and "numpy" in info["filepath"]:
            lib = ctypes.CDLL(info["filepath"])
            suffix = "64_" if hasattr(lib, "scipy_cblas_sgemm64_") else ""
            found[f"numpy's OpenBLAS {info['version']}"] = _cblas(getattr(lib, f"scipy_cblas_sgemm{suffix}"),
                                                                  ctypes.c_int64 if suffix else ctypes.c_int)
    from hloexec.kernels import mkl
    if mkl.AVAILABLE:
        found["MKL (sequential, CNR AUTO)"] = _cblas(ctypes.CDLL(mkl._library_path()).cblas_sgemm, ctypes.c_int)
    try:
        import scipy_openblas32
        lib = ctypes.CDLL(os.path.join(scipy_openblas32.get_lib_dir(), "libscipy_openblas.so"))
        lib.scipy_openblas_set_num_threads(ctypes.c_int(1))
        found[f"scipy-openblas32 {scipy_openblas32.__version__}"] = _cblas(lib.scipy_cblas_sgemm, ctypes.c_int)
    except ImportError:
        pass
    try:
        import blis.py
        found["BLIS (blis package)"] = lambda a, b, c: blis.py.gemm(a, b, out=c, beta=0.0)
    except ImportError:
        pass
    return found


def compare(path: Path, reps: int) -> dict[str, float]:
    """One-thread FLOP/s of each BLAS installed over the module's GEMMs (each shape by its count)."""
    from threadpoolctl import threadpool_limits
    shapes = gemm_shapes(path)
    with threadpool_limits(1, user_api="blas"):
        return _rates(shapes, libraries(), reps)


def _rates(shapes, libs: dict, reps: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    seconds = dict.fromkeys(libs, 0.0)
    flops = 0.0
    for (B, M, K, N), count in sorted(shapes.items()):
        a = rng.standard_normal((B, M, K), np.float32)
        b = rng.standard_normal((B, K, N), np.float32)
        c = np.empty((B, M, N), np.float32)
        best = dict.fromkeys(libs, float("inf"))
        for _ in range(reps):
            for name, sgemm in libs.items():
                t = time.perf_counter()
                for i in range(B):
                    sgemm(a[i], b[i], c[i])
                best[name] = min(best[name], time.perf_counter() - t)
        for name in libs:
            seconds[name] += best[name] * count
        flops += 2.0 * B * M * K * N * count
    return {name: flops / s for name, s in seconds.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("module", nargs="?", help="an HLO file (default: bench/workloads.py's GPT d256 f32 pre step)")
    ap.add_argument("--reps", type=int, default=15, help="timings per shape and library, best taken")
    args = ap.parse_args(argv)
    if args.module:
        path = Path(args.module)
    else:
        import workloads
        (path,), _ = workloads.by_name()["gpt_step_d256_f32_pre"].files()
    print(f"load {os.getloadavg()[0]:.1f}; {sum(gemm_shapes(path).values())} products of {path.name}")
    rates = compare(path, args.reps)
    top = max(rates.values())
    print("| BLAS (one thread) | GFLOP/s | of the best |\n|---|---|---|")
    for name, rate in rates.items():
        print(f"| {name} | {rate / 1e9:.0f} | {rate / top:.0%} |")
    print(f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
