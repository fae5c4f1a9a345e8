"""Numerical validation bench: the shadow run and `numerics` against the program's own run (issue 13).

    python bench/bench_numerics.py                  # the GPT d256 train steps of bench/workloads.py
    python bench/bench_numerics.py gpt_step_d256_bf16_pre

Per workload, in this process, best of 3 after a first run (bench/timing.py):
  op by op     the program at its precision, op by op (use_numba=False): the tier observed runs use;
  shadow       its shadow (every float type in f64) op by op, and with the default tiers (compiled fusions, warm);
  run --shadow tools.numerics.shadow_run: both runs, observed where discrete values are compared;
  numerics     tools.numerics.attribute: the run paired with its shadow instruction by instruction (one run);
and the plans' peak memory estimates of the program and of its shadow.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as wl  # noqa: E402
from timing import best_of  # noqa: E402


def measure(name: str) -> dict:
    import hloexec
    from hloexec.exec.shadow import shadow_module
    from hloexec.tools.arrays import nested
    from hloexec.tools.numerics import attribute, shadow_run
    from hloexec.tools.xla_cpu import load_arrays
    [workload] = [w for w in wl.workloads() if w.name == name]
    [path], [inputs_path] = workload.files()
    text = Path(path).read_text()
    program = hloexec.load(text, use_numba=False)
    inputs = nested(list(load_arrays(str(inputs_path)).values()), [p.shape for p in program.parameters])
    shadow = shadow_module(program.module)
    wide = shadow.inputs(inputs)
    shadow_numpy = hloexec.Executable(shadow.module, use_numba=False)
    shadow_tiered = hloexec.Executable(shadow.module, compile="eager")
    row = {"workload": name, "discrete": len(shadow.discrete),
           "op by op": best_of(lambda: program.run(*inputs), 3),
           "shadow op by op": best_of(lambda: shadow_numpy.run(*wide), 3),
           "shadow tiered": best_of(lambda: shadow_tiered.run(*wide), 3),
           "run --shadow": best_of(lambda: shadow_run(hloexec.load(text), inputs), 1),
           "peak": program.peak_bytes(), "shadow peak": shadow_numpy.peak_bytes()}
    start = time.perf_counter()
    report = attribute(hloexec.load(text), inputs)
    row["numerics"] = time.perf_counter() - start
    row["mode"] = report.mode
    return row


def main(names) -> None:
    names = names or [w.name for w in wl.workloads() if w.name.startswith("gpt_step_d256")]
    print("| workload | op by op | shadow op by op | shadow tiered (warm) | run --shadow | numerics | peak / shadow peak |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        r = measure(name)
        base = r["op by op"]
        print(f"| {name} | {base * 1e3:.0f} ms | {r['shadow op by op'] * 1e3:.0f} ms ({r['shadow op by op'] / base:.2f}x) "
              f"| {r['shadow tiered'] * 1e3:.0f} ms ({r['shadow tiered'] / base:.2f}x) "
              f"| {r['run --shadow']:.2f} s ({r['run --shadow'] / base:.1f}x) "
              f"| {r['numerics']:.1f} s ({r['numerics'] / base:.0f}x, {r['mode']}) "
              f"| {r['peak'] / 2**20:.0f} / {r['shadow peak'] / 2**20:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
