"""How far a short sum's repeated roundings reach against the rule's accumulation bound: the largest |row-major sum,
every step rounded to the type, less the exact sum| / 4 sigma of the rule (4 u / sqrt(3) sqrt(n (sum x^2 + S^2)))
over adversarial term vectors of each length n (equal terms, one large then equal ones, two alternating values,
near-equal, signed powers of two), f16 and f32. Below 1 a reduce-window of that many terms a window needs no floor
(tools/bound_sums.py WINDOW_FLOOR_TERMS; docs/verdicts.md "Dots, reduce-windows and add scatters").

    python bench/bench_window_repeats.py [trials]
"""

from __future__ import annotations

import sys

import numpy as np


def ratio(x: np.ndarray, dtype, u: float) -> float:
    """x's row-major sum in `dtype` (each step's exact sum rounded) against the rule's 4 sigma."""
    held = x.astype(dtype).astype(np.float64)
    acc = dtype(0)
    for v in held:
        acc = dtype(np.float64(acc) + v)
    exact = held.sum()
    allowed = 4 * u / np.sqrt(3) * np.sqrt(len(x) * (np.sum(held**2) + exact**2))
    return abs(float(acc) - exact) / allowed


def vector(kind: int, n: int, rng) -> np.ndarray:
    p = rng.uniform(0.5, 1) * 2.0 ** rng.integers(-3, 3)
    if kind == 0:
        return np.full(n, p)
    if kind == 1:
        return np.concatenate([[p * 2.0 ** rng.integers(1, 12)], np.full(n - 1, p)])
    if kind == 2:
        return np.where(np.arange(n) % 2, p, p * rng.uniform(0.3, 3))
    if kind == 3:
        return p * rng.uniform(0.9, 1.1, n)
    return p * 2.0 ** -rng.integers(0, 12, n) * rng.choice([1, 1, 1, -1], n)


def main(trials: int = 3000) -> None:
    rng = np.random.default_rng(0)
    print("| terms | f16 | f32 |\n|---:|---:|---:|")
    for n in (4, 6, 8, 12, 16, 24, 32):
        worst = [max(ratio(vector(t % 5, n, rng), d, u) for t in range(trials)) for d, u in
                 ((np.float16, 2.0**-11), (np.float32, 2.0**-24))]  # fmt: skip
        print(f"| {n} | {worst[0]:.2f} | {worst[1]:.2f} |")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
