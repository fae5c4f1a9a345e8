"""Micro-benchmark: the mixed-precision Adam step's all-finite check as XLA:CPU's optimized module computes it
(a kLoop fusion of one reduce-window over pred[4096,1024], window 32x32, to pred[128,32]), compiled by
hloexec.kernels.fusion and op by op (numpy over a strided window view), timed warm, next to a numpy copy.

    python bench/bench_reduce_window.py [--repeat N]
"""
from __future__ import annotations

import sys

import numpy as np

import hloexec
from timing import best_of

ALL_FINITE = """HloModule all_finite
and_pred { a = pred[] parameter(0)
  b = pred[] parameter(1)
  ROOT c = pred[] and(a, b) }
fused { p0 = pred[4096,1024] parameter(0)
  t = pred[] constant(true)
  ROOT r = pred[128,32] reduce-window(p0, t), window={size=32x32 stride=32x32}, to_apply=and_pred }
ENTRY e { a = pred[4096,1024] parameter(0)
  ROOT f = pred[128,32] fusion(a), kind=kLoop, calls=fused }
"""


def main():
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 30
    x = np.ones((4096, 1024), bool)
    tiers = {"compiled": hloexec.load(ALL_FINITE, compile="eager"), "op by op": hloexec.load(ALL_FINITE, use_numba=False)}
    times = {name: best_of(lambda e=e: e.run(x), repeat) for name, e in tiers.items()}
    dst = np.empty_like(x)
    t_copy = best_of(lambda: np.copyto(dst, x), repeat)
    for name, t in times.items():
        print(f"all-finite reduce-window {name}: {t * 1e3:.2f} ms, {x.nbytes / t / 1e9:.2f} GB/s read")
    print(f"numpy copy of the operand: {t_copy * 1e3:.2f} ms, {2 * x.nbytes / t_copy / 1e9:.1f} GB/s; "
          f"op by op / compiled: {times['op by op'] / times['compiled']:.1f}x")


if __name__ == "__main__":
    main()
