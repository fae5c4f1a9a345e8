"""Where a warm run's time goes, by kind of step, next to XLA:CPU's warm time in the same process (issue 17).

    python bench/profile_warm.py                       # GPT d256 f32 pre/opt, the example GPT opt, mixed Adam pre/opt
    python bench/profile_warm.py adam_mixed_9.4M_opt --repeat 5

Per workload (bench/workloads.py): `hloexec.load`, `--repeat` runs (the first op by op, the second compiles),
then `--pairs` warm runs of hloexec (the fast path of `exec/runner.py`) and of XLA:CPU: by default in blocks,
a block of hloexec runs then one of XLA:CPU runs, `--rounds` times (`--order blocks`: a run right after the other
side's meets its thread pool still spinning, which interleaving measures as the other's time; the blocks take
turns so that a load changing over the minutes meets both sides), or alternating run by run (`--order
alternate`: on a shared machine both sides then see the same load); the ratio is of the best of each side, and
the median of the pairs' ratios is given too. Then the fastest of 3
profiled runs
(`run(profile=...)`, the checked path: each step of the entry timed, a fused group under its root, as
`hloexec run --profile` does).
Each step is put in one class by what it holds: dot (a dot or convolution, alone or in a fusion),
reduce-window, reduce, other fusion (a `fusion` instruction or a group of hloexec's fusion pass; "small" ones,
whose values are under MIN_COMPILED_BYTES, run op by op), other (transposes, scatters, copies, slices, ...).
"dispatch" is the profiled run's time minus its steps' sum: the time between steps (the checked path's
Python per step; the unprofiled fast path spends less). Shares are of the profiled run. XLA:CPU: the same
program (the pre-optimization module for `*_opt`), compiled by `run_on_xla_cpu_timed`, each run including the
host<->device copies.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as wl  # noqa: E402

CLASSES = ("dot", "reduce-window", "reduce", "fusion (compiled size)", "fusion (small, op by op)", "other")


def _members(inst, groups):
    if inst.opcode == "fusion":
        return [i for c in inst.called_computations for i in c.instructions]
    return groups.get(id(inst), [inst])


def classify(inst, groups, min_bytes) -> str:
    members = _members(inst, groups)
    ops = {i.opcode for i in members}
    if ops & {"dot", "convolution"}:
        return "dot"
    if "reduce-window" in ops:
        return "reduce-window"
    if "reduce" in ops:
        return "reduce"
    if inst.opcode == "fusion" or id(inst) in groups:
        touched = [inst.shape] + [i.operands[0].shape for i in members if i.opcode in ("reduce", "reduce-window")]
        small = max(s.nbytes for s in touched) < min_bytes
        return "fusion (small, op by op)" if small else "fusion (compiled size)"
    return "other"


def _timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def measure(name: str, repeat: int, pairs: int, order: str = "blocks", rounds: int = 3) -> dict:
    import hloexec
    from hloexec.exec.tiering import MIN_COMPILED_BYTES
    from hloexec.tools.xla_cpu import load_arrays, run_on_xla_cpu, run_on_xla_cpu_timed
    w = wl.by_name()[name]
    (path,), (npz,) = w.files()
    inputs = list(load_arrays(str(npz)).values())
    exe = hloexec.load(str(path), compile="eager", compile_after=1)
    for _ in range(repeat):
        exe.run(*inputs)
    xla_path, xla_npz = w.xla_files() if w.xla_files else ([path], [npz])
    xla_text = Path(xla_path[0]).read_text()
    xla_inputs = list(load_arrays(str(xla_npz[0])).values())
    _, xt = run_on_xla_cpu_timed(xla_text, xla_inputs, warm_runs=1)
    run_on_xla_cpu(xla_text, xla_inputs)     # compiled again once, then cached by text
    warm, xla_warm = [], []
    if order == "alternate":
        for _ in range(pairs):
            warm.append(_timed(lambda: exe.run(*inputs)))
            xla_warm.append(_timed(lambda: run_on_xla_cpu(xla_text, xla_inputs)))
    else:
        for r in range(rounds):     # blocks taking turns: a load that changes over the minutes meets both sides
            n = pairs // rounds + (r < pairs % rounds)
            warm += [_timed(lambda: exe.run(*inputs)) for _ in range(n)]
            time.sleep(0.5)         # the pool's threads stop spinning
            xla_warm += [_timed(lambda: run_on_xla_cpu(xla_text, xla_inputs)) for _ in range(n)]
            time.sleep(0.5)
    profiled_s, profile = float("inf"), {}
    for _ in range(3):      # the fastest of 3 profiled runs
        p: dict = {}
        t = time.perf_counter()
        exe.run(*inputs, profile=p)
        if time.perf_counter() - t < profiled_s:
            profiled_s, profile = time.perf_counter() - t, p
    groups = {id(g.root): g.members for g in exe.plan.fused_groups}
    by_class, count = defaultdict(float), defaultdict(int)
    for inst, s in profile.items():
        c = classify(inst, groups, MIN_COMPILED_BYTES)
        by_class[c] += s
        count[c] += 1
    ratios = sorted(a / b for a, b in zip(warm, xla_warm))
    return {"workload": name, "warm_best_s": min(warm), "profiled_s": profiled_s, "steps": len(profile),
            "classes": {c: {"s": by_class[c], "n": count[c]} for c in CLASSES},
            "dispatch_s": profiled_s - sum(profile.values()), "xla_warm_best_s": min(xla_warm),
            "pair_ratio_median": ratios[len(ratios) // 2], "xla_compile_s": xt["compile_s"]}


def report(r: dict) -> None:
    best, run = r["warm_best_s"], r["profiled_s"]
    parts = [f"{c} {v['s'] * 1e3:.1f} ms ({v['s'] / run:.0%}, {v['n']})" for c, v in r["classes"].items() if v["n"]]
    print(f"| {r['workload']} | {best * 1e3:.1f} ms | {r['xla_warm_best_s'] * 1e3:.1f} ms | "
          f"{best / r['xla_warm_best_s']:.2f} ({r['pair_ratio_median']:.2f}) | {run * 1e3:.1f} ms: {'; '.join(parts)} | {r['dispatch_s'] * 1e3:.1f} ms "
          f"({r['dispatch_s'] / run:.0%}; {r['steps']} steps) |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workloads", nargs="*", default=["gpt_step_d256_f32_pre", "gpt_step_d256_f32_opt",
                                                     "small:gpt_step.opt", "adam_mixed_9.4M_pre",
                                                     "adam_mixed_9.4M_opt"])
    ap.add_argument("--repeat", type=int, default=4, help="runs before the measured ones (default 4)")
    ap.add_argument("--pairs", type=int, default=15, help="warm runs of each side (default 15)")
    ap.add_argument("--order", choices=("blocks", "alternate"), default="blocks",
                    help="each side's runs in one block (default) or alternating run by run")
    ap.add_argument("--rounds", type=int, default=3,
                    help="with --order blocks: the two sides' blocks take turns this many times (default 3)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    print(f"| workload | hloexec warm (best of {args.pairs}) | XLA:CPU warm (best of {args.pairs}, {args.order}) | ratio "
          "(median of the pairs' ratios) | profiled run: steps by class "
          "(ms, share, count) | dispatch (profiled run - its steps) |")
    print("|---|---|---|---|---|---|")
    results = []
    for name in args.workloads:
        r = measure(name, args.repeat, args.pairs, args.order, args.rounds)
        results.append(r)
        report(r)
        sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
