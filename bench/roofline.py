"""The seeds against their GEMM roofline (issue 29 item 5): run time / (GEMM FLOPs / measured sgemm rate).

    python bench/roofline.py                      # the 16-device GPT seed (--spmd) and the Llama pipeline stage
    python bench/roofline.py llama --markdown     # one of them, a table row

Per seed (../shared/seeds/ or $HLOEXEC_SHARED/seeds/; skipped with a message when absent):
- FLOPs: the GEMMs of every participant's step (dots and cuBLAS gemm custom-calls, `hloexec stats`'s count:
  the 16-device GPT seed runs its entry 16 times under `--spmd`).
- The sgemm rate of the BLAS in use: hloexec's own product (`kernels/blas.py`: every core, MKL where the
  `mkl` extra is installed, else numpy's OpenBLAS) on f32 operands of each distinct GEMM shape of the seed
  (over 4 GFLOP: a slice of its longer side, at least 512 wide), best of `--reps`, weighted by the shape's
  FLOPs and how often it occurs; numpy's own
  two-thread sgemm of a [4096,4096]x[4096,1024] product beside it for scale.
- Roofline: FLOPs / that rate, the least time the GEMMs alone can take here.
- Run: `hloexec run SEED [--spmd] --json` in a fresh process (random inputs, background compile); its
  `execute` seconds (what the GEMMs are part of) and the process's wall time. A one-participant seed runs
  with `--profile` (every step of the run timed): its time by class (`breakdown`: GEMMs, collectives, other
  fusions, other steps, and the time between steps) says where the time beyond the GEMMs goes. `hloexec run
  --spmd` has no per-step profile: an SPMD seed is profiled in a second run of one participant alone.
Ratio = execute / roofline (goal: <= 1.5). The rate and the run are taken one after the other, so a load that
changes between them moves the ratio: report `uptime` with the numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SEEDS = Path(os.environ.get("HLOEXEC_SHARED") or ROOT.parent / "shared") / "seeds"
RUNS = {"gpt16": ("gpt_train_step_shard_parallel_16dev.hlo", ["--spmd"], 16),
        "llama": ("llama_train_step_pipeshard_mesh1.hlo", [], 1)}


def gemm_shapes(path: Path) -> Counter:
    """(B, M, K, N) of every dot and gemm custom-call of the module's entry and what it calls, with counts."""
    import hloexec
    from hloexec.ops.contraction import _dot_plan
    from hloexec.tools.stats import GEMM_TARGETS, _target
    module = hloexec.parse(path.read_text())[0]
    shapes: Counter = Counter()
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode == "dot":
                dims = [tuple(inst.attr(k, ())) for k in ("lhs_batch_dims", "rhs_batch_dims",
                                                          "lhs_contracting_dims", "rhs_contracting_dims")]
            elif inst.opcode == "custom-call" and _target(inst) in GEMM_TARGETS:
                config = inst.attr("backend_config")
                numbers = config.get("gemm_backend_config", config)["dot_dimension_numbers"]
                dims = [tuple(int(d) for d in numbers.get(k, ())) for k in (
                    "lhs_batch_dimensions", "rhs_batch_dimensions", "lhs_contracting_dimensions",
                    "rhs_contracting_dimensions")]
            else:
                continue
            _, _, (B, M, K), (_, _, N), _ = _dot_plan(tuple(inst.operands[0].shape.dims),
                                                     tuple(inst.operands[1].shape.dims), *dims)
            shapes[(B, M, K, N)] += 1
    return shapes


def _best(f, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


SAMPLE_FLOPS = 4e9     # a bigger product is timed on a slice of its longer side (the side blas.py cuts)


def sgemm_rate(shapes: Counter, reps: int) -> float:
    """FLOP/s of hloexec's product over these shapes, each weighted by its FLOPs x count (f32 operands)."""
    from hloexec.kernels import blas
    rng = np.random.default_rng(0)
    flops = seconds = 0.0
    for (B, M, K, N), count in shapes.items():
        f = 2.0 * B * M * K * N
        m, n = M, N
        if f > SAMPLE_FLOPS:
            keep = max(SAMPLE_FLOPS / f, 512 / max(M, N))
            m, n = (max(1, round(M * keep)), N) if M >= N else (M, max(1, round(N * keep)))
        a = rng.standard_normal((B, m, K), np.float32)
        b = rng.standard_normal((B, K, n), np.float32)
        with np.errstate(all="ignore"):
            s = _best(lambda: blas.matmul(a, b), reps)
        flops += f * count
        seconds += s * (M * N) / (m * n) * count
    return flops / seconds


def numpy_sgemm_rate() -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4096, 4096), np.float32)
    b = rng.standard_normal((4096, 1024), np.float32)
    return 2.0 * 4096 * 4096 * 1024 / _best(lambda: a @ b, 3)


STEP_CLASSES = ("GEMMs", "collectives", "fusions", "other")


def step_classes(path: Path) -> dict[str, str]:
    """The class of every instruction of the module by name: a GEMM (a dot, a gemm custom-call, a fusion holding
    a dot), a collective, a fusion, or other."""
    import hloexec
    from hloexec.ir.opcodes import COLLECTIVES
    from hloexec.tools.stats import GEMM_TARGETS, _target

    def is_gemm(inst) -> bool:
        if inst.opcode == "fusion":
            return any(is_gemm(i) for c in inst.called_computations for i in c.instructions)
        return inst.opcode == "dot" or (inst.opcode == "custom-call" and _target(inst) in GEMM_TARGETS)

    module = hloexec.parse(path.read_text())[0]
    return {inst.name: "GEMMs" if is_gemm(inst) else "collectives" if inst.opcode in COLLECTIVES
            else "fusions" if inst.opcode == "fusion" else "other"
            for comp in module.computations for inst in comp.instructions}


def breakdown(rows: list[dict], classes: dict[str, str], execute_s: float) -> dict:
    """Seconds of the profiled run by class (a group of hloexec's fusion pass counts as a fusion), "between
    steps" (the run's time its steps do not account for), and the three slowest opcodes of "other"."""
    by_class = dict.fromkeys(STEP_CLASSES, 0.0)
    other: Counter = Counter()
    for row in rows:
        c = classes.get(row["name"], "other")
        c = "fusions" if c == "other" and row["fused"] else c
        by_class[c] += row["ms"] / 1e3
        if c == "other":
            other[row["opcode"]] += row["ms"] / 1e3
    by_class["between steps"] = execute_s - sum(by_class.values())
    return {"seconds": by_class, "other_opcodes": dict(other.most_common(3))}


def run_seed(path: Path, flags: list[str], profiled: bool = False) -> dict:
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hloexec", "run", str(path), "--json", *flags,
                           *(["--profile", str(1 << 30)] if profiled else [])], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"hloexec run {path.name} failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    peak = (report.get("memory") or {}).get("peak_bytes")      # not in --spmd reports
    execute = report["seconds"]["execute"]
    classes = breakdown(report["profile"], step_classes(path), execute) if profiled else None
    return {"wall_s": wall, "execute_s": execute, "peak_bytes": peak, "breakdown": classes}


def measure(name: str, reps: int) -> dict | None:
    file, flags, participants = RUNS[name]
    path = SEEDS / file
    if not path.exists():
        print(f"{name}: {path} not found, skipped", file=sys.stderr)
        return None
    shapes = gemm_shapes(path)
    flops = participants * sum(2.0 * B * M * K * N * c for (B, M, K, N), c in shapes.items())
    load_before = os.getloadavg()[0]
    rate = sgemm_rate(shapes, reps)
    run = run_seed(path, flags, profiled=not flags)
    # an SPMD seed's steps are timed on one participant run alone (its collectives mirrored: exec/communicators.py)
    one = run_seed(path, [], profiled=True) if flags else run
    roofline = flops / rate
    return {"seed": name, "file": file, "participants": participants, "gemms": sum(shapes.values()),
            "gemm_flops": flops, "sgemm_rate": rate, "numpy_sgemm_rate": numpy_sgemm_rate(), "roofline_s": roofline,
            **run, "ratio": run["execute_s"] / roofline, "load": [load_before, os.getloadavg()[0]],
            "profiled": {"execute_s": one["execute_s"], "breakdown": one["breakdown"],
                         "roofline_s": roofline / participants}}


def row(r: dict) -> str:
    peak = f", peak {r['peak_bytes'] / 2**30:.1f} GiB" if r["peak_bytes"] else ""
    return (f"| {r['file']} | {r['participants']} x {r['gemms']} | {r['gemm_flops'] / 1e12:.2f} TFLOP | "
            f"{r['sgemm_rate'] / 1e9:.0f} GFLOP/s (numpy {r['numpy_sgemm_rate'] / 1e9:.0f}) | {r['roofline_s']:.1f} s | "
            f"{r['execute_s']:.1f} s (process {r['wall_s']:.1f} s{peak}) | "
            f"**{r['ratio']:.2f}** | {r['load'][0]:.1f} / {r['load'][1]:.1f} | {where_time_goes(r)} |")


def where_time_goes(r: dict) -> str:
    """The profiled run's time by class, largest first, and its GEMMs' time against their roofline."""
    p = r["profiled"]
    seconds = p["breakdown"]["seconds"]
    parts = []
    for c, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        if s > 0:
            ops = ", ".join(f"{op} {t:.1f} s" for op, t in p["breakdown"]["other_opcodes"].items())
            parts.append(f"{c} {s:.1f} s ({s / p['execute_s']:.0%}{f': {ops}' if c == 'other' and ops else ''})")
    who = "one participant alone" if r["participants"] > 1 else "the run"
    return (f"{who} {p['execute_s']:.1f} s: " + "; ".join(parts)
            + f"; GEMMs at {seconds['GEMMs'] / p['roofline_s']:.2f}x their roofline")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("seeds", nargs="*", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--reps", type=int, default=3, help="timings per GEMM shape, best taken (default 3)")
    ap.add_argument("--markdown", action="store_true", help="print table rows")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    if args.markdown:
        print("| seed | participants x GEMMs | GEMM FLOPs | sgemm rate (BLAS in use) | roofline | run: execute | "
              "execute / roofline | load before / after | the run's time by class |")
        print("|---|---|---|---|---|---|---|---|---|")
    results = []
    for name in args.seeds:         # each row as it is measured: a seed takes minutes
        r = measure(name, args.reps)
        if r:
            results.append(r)
            print(row(r) if args.markdown else json.dumps(r), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
