"""How often the calibration (tools/bound_samples.calibrate) cuts a block's tightest element below SIGMAS sigma, and
how loose it leaves the bounds, on blocks of CALIBRATION_BLOCK elements whose samples are made as the bounds'
model says (Gaussian deviations of sigma 1; an element's bound SIGMAS x its looseness L): a lone tight element
among looser ones, k tight ones, elements sharing few draws (a broadcast row value's), a shared draw plus each
element's own, ramps of looseness; and values of fewer elements (1, 3, 8, 32, 63: a block of their own), equally
loose (Gaussian or uniform samples: one rounding's), a log-ramp, one tight (by its bound, or by its sigma alone), a
shared draw (docs/verdicts.md
"Sampled calibration").

    python bench/bench_calibration.py [--blocks N] [--rule step] [--near X] [--lone off] [--small one-draw]

`--rule step`: the margin as it was before the margin continuous in P (four draws' 6.6 where m = 3P / (4 - P) < 64,
else SAMPLE_MARGIN); `--near X`: the participation ratio over the elements within X (not NEAR) of the block's
largest ratio; `--lone off`: as before the lone elements' floor (bound_samples._lone_floors: none); `--small
one-draw`: as before branch smallmid, every value of fewer than MEASURED_FROM elements cut at one draw's margin. Prints a
markdown table: per profile the participation ratio's 0.1% / 50% / 99.9% quantiles, the share of blocks whose
tightest element is cut below SIGMAS sigma, and its calibrated bound's median / SIGMAS sigma."""

from __future__ import annotations

import argparse
import math

import numpy as np

from hloexec.kernels.bound_rules import NEAR, block_ratios
from hloexec.tools import bound_samples as bs

PROFILES = [
    ("lone", 1000.0), ("lone", 10.0), ("lone", 6.0), ("lone", 4.0), ("lone", 3.0), ("lone", 2.0),
    ("tight", 2, 10.0), ("tight", 2, 4.0), ("tight", 3, 4.0), ("tight", 2, 1000.0), ("tight", 3, 1000.0), ("tight", 4, 1000.0), ("tight", 8, 1000.0), ("tight", 64, 1000.0),
    ("tight", 4, 3.0), ("draws", 1), ("draws", 2), ("draws", 3), ("draws", 4), ("draws", 16),
    ("shared", 0.5), ("shared", 0.9), ("shared", 0.97), ("shared", 0.99),
    ("ramp", 16.0), ("log-ramp", 100.0), ("equal",),
    ("small", 1, "equal"), ("small", 1, "uniform"),
    *(("small", n, shape) for n in (3, 8, 32, 63)
      for shape in ("equal", "uniform", "log-ramp", "lone 4", "lone 10", "hidden 3", "shared")),
]  # fmt: skip
LOOSE = 10.0  # the tightest elements' looseness: loose enough to be cut


def _profile(kind, args, blocks, rng) -> tuple[np.ndarray, np.ndarray, str, np.ndarray | float]:
    """(looseness (blocks, CALIBRATION_BLOCK), deviations (SAMPLES, blocks, CALIBRATION_BLOCK), the profile's
    name, the elements' sigma (the bound: SIGMAS x looseness x sigma))."""
    block, samples = bs.CALIBRATION_BLOCK, bs.SAMPLES
    looseness = np.full((blocks, block), LOOSE)
    own = rng.standard_normal((samples, blocks, block), dtype=np.float32)
    if kind == "lone":  # one tight element, the others args[0] x looser
        looseness[:, 1:] *= args[0]
        return looseness, own, f"lone tight element, others {args[0]:g}x looser", 1.0
    if kind == "tight":  # k tight elements, the others c x looser
        k, c = args
        looseness[:, k:] *= c
        return looseness, own, f"{k} tight, others {c:g}x looser", 1.0
    if kind == "draws":  # the elements carry k draws (a row value's deviation each, ~block / k elements)
        k = args[0]
        draws = rng.standard_normal((samples, blocks, k), dtype=np.float32)
        return looseness, draws[..., np.arange(block) * k // block], f"{k} draw(s) shared by all", 1.0
    if kind == "shared":  # one shared draw with this share of the variance, the rest each element's own
        f = args[0]
        shared = rng.standard_normal((samples, blocks, 1), dtype=np.float32)
        return looseness, math.sqrt(f) * shared + math.sqrt(1 - f) * own, f"one draw {f:.0%} of the variance", 1.0
    if kind == "small":  # a value of n elements (a block of its own: the rest of the block not judged)
        n, shape = args
        sigma = 1.0
        if shape == "uniform":  # (one rounding's error: uniform of sigma 1)
            own = rng.uniform(-math.sqrt(3), math.sqrt(3), own.shape).astype(np.float32)
        elif shape == "log-ramp":
            looseness[:, :n] *= np.geomspace(1, 100, n)
        elif shape.startswith("lone"):
            looseness[:, 1:n] *= float(shape.split()[1])
        elif shape.startswith("hidden"):  # one tight by its sigma, its bound the same as the others'
            sigma = np.ones((blocks, block))
            sigma[:, 0] = float(shape.split()[1])
            looseness[:, 1:n] *= sigma[:, :1]
        elif shape == "shared":
            own = math.sqrt(0.97) * rng.standard_normal((samples, blocks, 1), dtype=np.float32) + math.sqrt(0.03) * own
        looseness[:, n:], own[..., n:] = np.inf, 0
        return looseness, own * sigma, f"a value of {n}: {_SMALL[shape]}", sigma
    if kind == "ramp":
        looseness *= np.linspace(1, args[0], block)
        return looseness, own, f"looseness ramp 1-{args[0]:g}x", 1.0
    if kind == "log-ramp":
        looseness *= np.geomspace(1, args[0], block)
        return looseness, own, f"looseness log-ramp 1-{args[0]:g}x", 1.0
    return looseness, own, "equally loose, independent", 1.0


_SMALL = {  # the small values' profiles (a value of n elements), by name
    "equal": "equally loose, independent",
    "uniform": "equally loose, uniform samples",
    "log-ramp": "looseness log-ramp 1-100x",
    "lone 4": "one tight, the others 4x looser",
    "lone 10": "one tight, the others 10x looser",
    "hidden 3": "one 3x tighter by its sigma, its bound the same",
    "shared": "one draw 97% of the variance",
}


def _step_margin(draws):
    """The margin before: four draws' 6.6 where m = 3P / (4 - P) < 64 (P < 3.82), else SAMPLE_MARGIN."""
    return np.where(np.asarray(draws) < 4 * 64 / 67, 6.6, bs.SAMPLE_MARGIN)


def measure(blocks: int, seed: int = 1) -> list[tuple]:
    rows = []
    for kind, *args in PROFILES:
        rng = np.random.default_rng(seed)
        looseness, deviations, name, sigma = _profile(kind, args, blocks, rng)
        bound = bs.SIGMAS * looseness * sigma
        deviations = deviations.astype(np.float32)
        stats = block_ratios(deviations.reshape(bs.SAMPLES, -1), bound.reshape(-1), bs.CALIBRATION_BLOCK)
        p = bs.participation(bound, deviations, stats[0], np.ones(stats[0].size, bool))[0]  # (every block's)
        left = bs.calibrate(bound, deviations, stats=stats) / (bs.SIGMAS * sigma)  # per sigma
        tightest = left[np.arange(blocks), looseness.argmin(axis=1)]
        rows.append((name, *np.quantile(p, [0.001, 0.5, 0.999]), np.mean(tightest < 1), np.median(tightest)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=20_000)
    parser.add_argument("--rule", choices=["continuous", "step"], default="continuous")
    parser.add_argument("--near", type=float, default=NEAR)
    parser.add_argument("--lone", choices=["on", "off"], default="on")
    parser.add_argument("--small", choices=["pooled", "one-draw"], default="pooled")
    args = parser.parse_args()
    if args.lone == "off":
        bs._lone_floors = lambda bound, lone, spread: None
    if args.small == "one-draw":
        bs.POOLED_FROM = bs.MEASURED_FROM
    if args.rule == "step":
        bs.margin = _step_margin
    if args.near != NEAR:  # (the kernel counts the elements within largest / NEAR: scale what it is given)
        participation = bs.participation
        bs.participation = lambda bound, deviations, largest, cut: participation(
            bound, deviations, largest * NEAR / args.near, cut
        )
    print(
        f"{args.blocks:,} blocks per profile, margin {args.rule}, NEAR {args.near:g}, lone {args.lone}, "
        f"small {args.small}\n"
    )
    print("| blocks | P: 0.1% / 50% / 99.9% | tightest below SIGMAS sigma | its bound's median / SIGMAS sigma |")
    print("|---|---|---|---|")
    for name, low, mid, high, below, median in measure(args.blocks):
        print(f"| {name} | {low:.2f} / {mid:.2f} / {high:.2f} | {below:.3%} | {median:.2f} |")


if __name__ == "__main__":
    main()
