"""Issue 29's goals in one run: every goal measured in one sitting, one markdown table (goal | measured | target |
met? | cause of the gap).

    python bench/issue_goals.py --markdown                 # everything (~20-25 min on a quiet 2-core machine)
    python bench/issue_goals.py --skip-seeds --markdown    # without the two seeds (~10 min less)
    python bench/issue_goals.py --quick                    # small modules only: a smoke test (~1 min)

Each goal is measured by the bench that owns it, called here (nothing is measured twice):
- no run slower than 1.5x the first, and time to warm speed <= XLA:CPU's parse + compile + first run:
  bench_warmup.py (a fresh process per module running it for `--seconds`; XLA:CPU in fresh processes too); the
  cause of a slow time to warm: the kernels' compile CPU time by the direct compiler (bench_compile.py);
- warm <= 1.0x XLA:CPU: profile_warm.py (each side's runs in blocks taking turns); the cause: the profiled warm
  run's time by class of step (dots, fusions, reductions, ..., dispatch between steps);
- the dots at >= 95% of the best BLAS installed: which_blas.py over the GPT d256 step's products;
- parse >= 10x XLA's parser on every dump: parse_ratio.py over the seeds and the corpus;
- the seeds within 1.5x of their GEMM roofline: roofline.py; the cause: the seed's run by class of step.
Each block is timed on its own (hloexec's and XLA's runs are never interleaved: in separate processes, or in
blocks of their own); the machine, the commit and the load before and after each block are printed with the table.
A seed that is missing (../shared/seeds or $HLOEXEC_SHARED/seeds) is a row saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import bench_compile  # noqa: E402
import bench_warmup  # noqa: E402
import parse_ratio  # noqa: E402
import profile_warm  # noqa: E402
import roofline  # noqa: E402
import which_blas  # noqa: E402
import workloads  # noqa: E402

FIRST_RUN_LIMIT = 1.5  # no later run slower than this x the first
ROOFLINE_LIMIT = 1.5
BLAS_SHARE = 0.95
PARSE_RATIO = parse_ratio.GOAL


@dataclass
class Plan:
    """What a run measures: the modules of each goal and how long each takes."""

    warmup: list[str]  # HLO files or workload names (bench_warmup.py)
    warmup_seconds: float
    compile: list[str]  # their kernels' compile time (bench_compile.py)
    warm: list[str]  # workload names (profile_warm.py)
    warm_pairs: int
    blas_module: str
    blas_reps: int
    parse: list[Path]
    seeds: list[str]  # roofline.py's seed names


def full_plan(skip_seeds: bool) -> Plan:
    steps = ["gpt_step_d256_f32_pre", "gpt_step_d256_f32_opt", "adam_mixed_9.4M_opt"]
    return Plan(
        warmup=["examples/gpt_step.opt.hlo", *steps],
        warmup_seconds=60.0,
        compile=steps,
        warm=["gpt_step_d256_f32_pre", "gpt_step_d256_f32_opt", "adam_mixed_9.4M_pre", "adam_mixed_9.4M_opt"],
        warm_pairs=15,
        blas_module="gpt_step_d256_f32_pre",
        blas_reps=15,
        parse=parse_ratio.default_files(),
        seeds=[] if skip_seeds else list(roofline.RUNS),
    )


def quick_plan() -> Plan:
    examples = BENCH.parent / "examples"
    return Plan(
        warmup=["examples/adam.opt.hlo"],
        warmup_seconds=1.0,
        compile=[],
        warm=["small:adam.opt"],
        warm_pairs=3,
        blas_module=str(examples / "mlp.pre.hlo"),
        blas_reps=2,
        parse=[examples / "adam.opt.hlo", examples / "mlp.opt.hlo"],
        seeds=[],
    )


@dataclass
class Row:
    goal: str
    measured: str
    target: str
    met: bool | None  # None: not measured (a seed missing) or nothing to compare with
    cause: str = ""


@dataclass
class Block:
    name: str
    seconds: float
    load: tuple[float, float]


class Blocks:
    """Times each block of measurements and the load around it."""

    def __init__(self, echo: bool):
        self.done: list[Block] = []
        self.echo = echo

    def run(self, name: str, f):
        load, start = os.getloadavg()[0], time.perf_counter()
        if self.echo:
            print(f"[{time.strftime('%H:%M:%S')}] {name} (load {load:.1f})", file=sys.stderr, flush=True)
        result = f()
        self.done.append(Block(name, time.perf_counter() - start, (load, os.getloadavg()[0])))
        return result


def machine() -> dict:
    def out(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=BENCH).stdout.strip()
        except OSError:
            return ""

    lscpu = dict(line.split(":", 1) for line in out(["lscpu"]).splitlines() if ":" in line)
    dirty = " (with uncommitted changes)" if out(["git", "status", "--porcelain", "--untracked-files=no"]) else ""
    return {
        "cpu": lscpu.get("Model name", platform.processor()).strip(),
        "cores": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
        "commit": out(["git", "log", "-1", "--format=%h %cd", "--date=format:%Y-%m-%d %H:%M"]) + dirty,
        "python": platform.python_version(),
    }


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1e-3 else f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.1f} s"


# -- goal 1 and 2: the second run waits for no compiler; time to warm ---------------------------------------------
def warmup_rows(plan: Plan, blocks: Blocks) -> list[Row]:
    xla = blocks.run("XLA:CPU parse + compile + first run (fresh processes)", lambda: {
        name: bench_warmup.measure_xla(name) for name in plan.warmup
    })
    ours = blocks.run(f"hloexec, fresh processes for {plan.warmup_seconds:.0f} s each (compile=background)", lambda: {
        name: bench_warmup.measure_hloexec(name, "background", plan.warmup_seconds, 3) for name in plan.warmup
    })
    compiled = blocks.run("kernel compile CPU time (direct compiler, fresh processes)", lambda: {
        name: bench_compile.measure(name, []) for name in plan.compile
    })
    rows = []
    for name in plan.warmup:
        r, x = ours[name], xla[name]
        if "error" in r:
            rows.append(Row(f"later runs <= {FIRST_RUN_LIMIT}x the first: {name}", r["error"], "", False))
            continue
        slow = r["slowest_ratio"] > FIRST_RUN_LIMIT
        rows.append(Row(
            f"later runs <= {FIRST_RUN_LIMIT}x the first: {name}",
            f"first {_ms(r['first_s'])}, slowest later (run {r['slowest_run']}) {_ms(r['slowest_later_s'])}: "
            f"{r['slowest_ratio']:.2f}x",
            f"<= {FIRST_RUN_LIMIT}x",
            not slow,
            _slow_run_cause(r) if slow else "",
        ))
        if "cold_s" not in x:
            rows.append(Row(f"time to warm <= XLA:CPU's first run: {name}", "XLA:CPU: " + x.get("error", "?"), "",
                            None))
            continue
        late = r["warm_at_s"] > x["cold_s"]
        rows.append(Row(
            f"time to warm <= XLA:CPU's parse + compile + first run: {name}",
            f"{r['warm_at_s']:.1f} s (warm run {_ms(r['warm_s'])}) against {x['cold_s']:.2f} s: "
            f"{r['warm_at_s'] / x['cold_s']:.1f}x",
            "<= 1.0x",
            not late,
            _compile_cause(r, compiled.get(name)) if late else "",
        ))
    return rows


def _slow_run_cause(r: dict) -> str:
    ready, kernels = r["kernels_ready_by_slowest"], r["kernels"]
    when = f"run {r['slowest_run']} of {r['runs']} ended at {r['slowest_end_s']:.1f} s"
    if ready < kernels:
        return f"{when} with {ready} of {kernels} kernels ready: the background compile shares the cores with the run"
    return (f"{when} with every kernel ready ({kernels}): not the compiler; one slow run of a "
            f"{_ms(r['warm_s'])} warm run (the machine: see the load)")


def _compile_cause(r: dict, c: dict | None) -> str:
    last = "no kernel" if r["last_kernel_s"] is None else f"last kernel ready at {r['last_kernel_s']:.1f} s"
    if r["pending"]:
        last += f", {r['pending']} still pending when the process ended"
    if c is None:
        return last
    numba = f", {sum(c['declined'].values())} left to Numba" if c["declined"] else ""
    share = f" ({c['direct_s'] / r['last_kernel_s']:.0%} of the time to the last kernel)" if r["last_kernel_s"] else ""
    return (f"{last}; compiling its {c['distinct']} distinct kernels ({c['lines']} generated lines) takes "
            f"{c['direct_s']:.1f} s of CPU in the direct compiler{share}, "
            f"{c['direct_s'] / max(c['translated_lines'], 1) * 1e3:.1f} ms a line{numba}")


# -- goal 3: warm speed ----------------------------------------------------------------------------------------------
def warm_rows(plan: Plan, blocks: Blocks) -> list[Row]:
    results = blocks.run(f"warm runs, hloexec and XLA:CPU in blocks ({plan.warm_pairs} runs each)", lambda: [
        profile_warm.measure(name, 4 if plan.warm_pairs > 5 else 2, plan.warm_pairs) for name in plan.warm
    ])
    rows = []
    for r in results:
        ratio = r["warm_best_s"] / r["xla_warm_best_s"]
        rows.append(Row(
            f"warm <= 1.0x XLA:CPU: {r['workload']}",
            f"{_ms(r['warm_best_s'])} against {_ms(r['xla_warm_best_s'])}: {ratio:.2f}x (pairs' median "
            f"{r['pair_ratio_median']:.2f}x)",
            "<= 1.0x",
            ratio <= 1.0,
            _warm_breakdown(r),
        ))
    return rows


def _warm_breakdown(r: dict) -> str:
    """The profiled warm run by class of step, largest first (given met or not: where the time goes)."""
    run = r["profiled_s"]
    parts = [(c, v["s"], v["n"]) for c, v in r["classes"].items() if v["n"]] + [("dispatch", r["dispatch_s"], 0)]
    parts.sort(key=lambda p: -p[1])
    return f"profiled run {_ms(run)}: " + "; ".join(
        f"{c} {_ms(s)} ({s / run:.0%}{f', {n} steps' if n else ''})" for c, s, n in parts
    )


# -- goal 3: the BLAS ------------------------------------------------------------------------------------------------
def blas_row(plan: Plan, blocks: Blocks) -> Row:
    from hloexec.kernels import mkl

    path = _module_path(plan.blas_module)
    rates = blocks.run("one-thread sgemm of each BLAS installed", lambda: which_blas.compare(path, plan.blas_reps))
    used = next((n for n in rates if n.startswith("MKL")), None) if mkl.AVAILABLE else None
    used = used or next(n for n in rates if n.startswith("numpy's OpenBLAS"))
    best = max(rates, key=rates.__getitem__)
    share = rates[used] / rates[best]
    listed = ", ".join(f"{n} {v / 1e9:.0f}" for n, v in rates.items())
    return Row(
        f"dots >= {BLAS_SHARE:.0%} of the best BLAS installed ({Path(plan.blas_module).name}'s products, one thread)",
        f"in use: {used}, {share:.0%} of the best ({listed} GFLOP/s)",
        f">= {BLAS_SHARE:.0%}",
        None if len(rates) == 1 else share >= BLAS_SHARE,
        "only one BLAS installed: nothing to compare with (`pip install mkl scipy-openblas32 blis` adds the others)"
        if len(rates) == 1
        else "" if share >= BLAS_SHARE else f"hloexec uses {used}; {best} is faster (the `mkl` extra installs MKL)",
    )


def _module_path(name: str) -> Path:
    path = Path(name)
    if path.exists():
        return path
    (hlo,), _ = workloads.by_name()[name].files()
    return hlo


# -- goal 4: parse ---------------------------------------------------------------------------------------------------
def parse_row(plan: Plan, blocks: Blocks) -> Row:
    rows, skipped = blocks.run(f"parse: hloexec then XLA's parser, per file ({len(plan.parse)} files)",
                               lambda: parse_ratio.compare(plan.parse))
    ratios = {name: theirs / ours for name, _, ours, theirs in rows}
    worst = min(ratios, key=ratios.__getitem__)
    under = [(name, mb, ours) for name, mb, ours, theirs in rows if ratios[name] < PARSE_RATIO]
    mb = sum(r[1] for r in rows)
    measured = (f"{len(rows)} dumps: min {ratios[worst]:.1f}x ({worst}), median {statistics.median(ratios.values()):.1f}x;"
                f" {len(under)} under {PARSE_RATIO:.0f}x; all: hloexec {mb / sum(r[2] for r in rows):.0f} MB/s, XLA "
                f"{mb / sum(r[3] for r in rows):.1f} MB/s" + (f" ({len(skipped)} not compared)" if skipped else ""))
    cause = ""
    if under:
        sizes = sorted(m * 1024 for _, m, _ in under)
        smallest = sorted(rows, key=lambda r: r[1])[: max(1, len(rows) // 10)]
        cause = (f"the {len(under)} dumps under {PARSE_RATIO:.0f}x are {sizes[0]:.0f}-{sizes[-1]:.0f} KB (median "
                 f"{statistics.median(sizes):.0f} KB) and parse at {sum(m for _, m, _ in under) / sum(s for *_, s in under):.0f}"
                 f" MB/s (all dumps: {statistics.median(r[1] * 1024 for r in rows):.0f} KB median); a parse's fixed "
                 f"cost, the median time on the smallest tenth (up to {smallest[-1][1] * 1024:.1f} KB): hloexec "
                 f"{statistics.median(r[2] for r in smallest) * 1e6:.0f} us, XLA {statistics.median(r[3] for r in smallest) * 1e6:.0f} us")
    return Row(f"parse >= {PARSE_RATIO:.0f}x XLA's parser on every dump", measured, f">= {PARSE_RATIO:.0f}x",
               not under, cause)


# -- goal 5: the seeds' roofline -------------------------------------------------------------------------------------
def seed_rows(plan: Plan, blocks: Blocks) -> list[Row]:
    rows = []
    for name in plan.seeds:
        r = blocks.run(f"seed {name}: sgemm rate, then its run (fresh processes)", lambda: roofline.measure(name, 3))
        goal = f"{roofline.RUNS[name][0]} within {ROOFLINE_LIMIT}x of its GEMM roofline"
        if r is None:
            rows.append(Row(goal, "seed not found", f"<= {ROOFLINE_LIMIT}x", None))
            continue
        rows.append(Row(
            goal,
            f"execute {r['execute_s']:.1f} s against {r['roofline_s']:.1f} s ({r['gemm_flops'] / 1e12:.2f} TFLOP at "
            f"{r['sgemm_rate'] / 1e9:.0f} GFLOP/s): {r['ratio']:.2f}x",
            f"<= {ROOFLINE_LIMIT}x",
            r["ratio"] <= ROOFLINE_LIMIT,
            roofline.where_time_goes(r),
        ))
    return rows


def markdown(rows: list[Row], info: dict, blocks: list[Block], seconds: float, load: tuple[float, float]) -> str:
    lines = [
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory_gb']} GB; commit {info['commit']}; "
        f"load {load[0]:.1f} at the start, {load[1]:.1f} at the end; {seconds / 60:.1f} min in all.",
        "",
        "| goal | measured | target | met? | cause of the gap (a measured breakdown) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        met = {True: "yes", False: "**no**", None: "n/a"}[r.met]
        lines.append(f"| {r.goal} | {r.measured} | {r.target} | {met} | {r.cause} |")
    lines += ["", "| block | time | load before -> after |", "|---|---|---|"]
    lines += [f"| {b.name} | {b.seconds:.0f} s | {b.load[0]:.1f} -> {b.load[1]:.1f} |" for b in blocks]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small modules only, seconds not minutes (a smoke test)")
    ap.add_argument("--skip-seeds", action="store_true", help="leave out the seeds' roofline runs (heavy)")
    ap.add_argument("--markdown", action="store_true", help="print only the markdown (no progress on stderr)")
    ap.add_argument("--json", type=Path, help="also write the rows, blocks and machine here")
    args = ap.parse_args(argv)
    plan = quick_plan() if args.quick else full_plan(args.skip_seeds)
    os.chdir(BENCH.parent)  # bench_warmup's module names are relative to the repository
    start, load_start = time.perf_counter(), os.getloadavg()[0]
    info = machine()
    blocks = Blocks(echo=not args.markdown)
    rows = warmup_rows(plan, blocks) + warm_rows(plan, blocks) + [blas_row(plan, blocks), parse_row(plan, blocks)]
    rows += seed_rows(plan, blocks)
    seconds, load = time.perf_counter() - start, (load_start, os.getloadavg()[0])
    print(markdown(rows, info, blocks.done, seconds, load))
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "load": load, "seconds": seconds,
                                         "rows": [asdict(r) for r in rows],
                                         "blocks": [asdict(b) for b in blocks.done]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
