"""Micro-benchmark: a 20M-element f32 Adam update fusion (f16 gradients) compiled by
hloexec.kernels.fusion, timed warm, reported in GB/s next to a numpy copy of the same bytes.

    python bench/bench_fusion_adam.py [N] [--serial]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from hloexec.kernels import fusion
from timing import best_of

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_kernels_fusion import adam as adam_fusion  # noqa: E402  (the fusion the kernel tests check)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 20_000_000
    parallel = False if "--serial" in sys.argv else None
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32),
            rng.random(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32).astype(np.float16),
            np.float32(1e-3)]
    t = time.perf_counter()
    kernel = fusion.compile_fusion(adam_fusion(n), parallel=parallel)
    compile_s = time.perf_counter() - t
    kernel(*args)
    t_kernel = best_of(lambda: kernel(*args))
    moved = 3 * n * 4 + n * 2 + 3 * n * 4              # read p, m, v, g; write p', m', v'
    src = np.empty(moved // 8, np.float32)             # a copy reading half the bytes and writing half:
    src[:] = 1                                          # the same memory traffic as the kernel
    dst = np.empty_like(src)
    t_copy = best_of(lambda: np.copyto(dst, src))
    gbs = moved / t_kernel / 1e9
    copy_gbs = 2 * src.nbytes / t_copy / 1e9
    print(f"adam n={n} parallel={kernel.parallel}: compile/load {compile_s * 1e3:.0f} ms, "
          f"kernel {t_kernel * 1e3:.1f} ms = {gbs:.1f} GB/s; numpy copy moving the same {moved / 1e6:.0f} MB "
          f"{t_copy * 1e3:.1f} ms = {copy_gbs:.1f} GB/s; ratio {gbs / copy_gbs:.2f}")

    # numpy reference of the same update, for scale
    p, m, v, g, lr = args

    def numpy_adam():
        gf = g.astype(np.float32)
        m2 = m * np.float32(0.9) + gf * np.float32(0.1)
        v2 = v * np.float32(0.999) + gf * gf * np.float32(0.001)
        return p - m2 * lr / (np.sqrt(v2) + np.float32(1e-8)), m2, v2
    print(f"numpy (unfused) adam {best_of(numpy_adam, 3) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
