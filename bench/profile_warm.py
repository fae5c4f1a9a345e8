"""Where a warm run's time goes, by kind of step, next to XLA:CPU's warm time in the same process (issue 17).

    python bench/profile_warm.py                       # GPT d256 f32 pre/opt, mixed-precision Adam pre/opt
    python bench/profile_warm.py adam_mixed_9.4M_opt --repeat 5

Per workload (bench/workloads.py): `hloexec.load`, `--repeat` runs (the first op by op, the second compiles),
then the best of 5 unprofiled warm runs (the fast path of `exec/runner.py`), then the fastest of 3 profiled runs
(`run(profile=...)`, the checked path: each step of the entry timed, a fused group under its root, as
`hloexec run --profile` does).
Each step is put in one class by what it holds: dot (a dot or convolution, alone or in a fusion),
reduce-window, reduce, other fusion (a `fusion` instruction or a group of hloexec's fusion pass; "small" ones,
whose values are under MIN_COMPILED_BYTES, run op by op), other (transposes, scatters, copies, slices, ...).
"dispatch" is the profiled run's time minus its steps' sum: the time between steps (the checked path's
Python per step; the unprofiled fast path spends less). Shares are of the profiled run. XLA:CPU:
`run_on_xla_cpu_timed` on the same program (pre-optimization module for `*_opt`), best of 5 warm runs
including the host<->device copies.
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


def measure(name: str, repeat: int) -> dict:
    import hloexec
    from hloexec.exec.tiering import MIN_COMPILED_BYTES
    from hloexec.tools.xla_cpu import load_arrays, run_on_xla_cpu_timed
    w = wl.by_name()[name]
    (path,), (npz,) = w.files()
    inputs = list(load_arrays(str(npz)).values())
    exe = hloexec.load(str(path), compile="eager", compile_after=1)
    for _ in range(repeat):
        exe.run(*inputs)
    warm = []
    for _ in range(5):
        t = time.perf_counter()
        exe.run(*inputs)
        warm.append(time.perf_counter() - t)
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
    xla_path, xla_npz = w.xla_files() if w.xla_files else ([path], [npz])
    _, xt = run_on_xla_cpu_timed(Path(xla_path[0]).read_text(), list(load_arrays(str(xla_npz[0])).values()))
    best = min(warm)
    return {"workload": name, "warm_best_s": best, "profiled_s": profiled_s, "steps": len(profile),
            "classes": {c: {"s": by_class[c], "n": count[c]} for c in CLASSES},
            "dispatch_s": profiled_s - sum(profile.values()), "xla_warm_best_s": xt["warm_run_min_s"],
            "xla_compile_s": xt["compile_s"]}


def report(r: dict) -> None:
    best, run = r["warm_best_s"], r["profiled_s"]
    parts = [f"{c} {v['s'] * 1e3:.1f} ms ({v['s'] / run:.0%}, {v['n']})" for c, v in r["classes"].items() if v["n"]]
    print(f"| {r['workload']} | {best * 1e3:.1f} ms | {r['xla_warm_best_s'] * 1e3:.1f} ms | "
          f"{best / r['xla_warm_best_s']:.2f} | {run * 1e3:.1f} ms: {'; '.join(parts)} | {r['dispatch_s'] * 1e3:.1f} ms "
          f"({r['dispatch_s'] / run:.0%}; {r['steps']} steps) |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workloads", nargs="*", default=["gpt_step_d256_f32_pre", "gpt_step_d256_f32_opt",
                                                     "adam_mixed_9.4M_pre", "adam_mixed_9.4M_opt"])
    ap.add_argument("--repeat", type=int, default=4, help="runs before the measured ones (default 4)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    print("| workload | hloexec warm (best of 5) | XLA:CPU warm (best of 5) | ratio | profiled run: steps by class "
          "(ms, share, count) | dispatch (profiled run - its steps) |")
    print("|---|---|---|---|---|---|")
    results = []
    for name in args.workloads:
        r = measure(name, args.repeat)
        results.append(r)
        report(r)
        sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
