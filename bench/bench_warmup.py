"""Warm-up bench (issue 29): a fresh process runs a module again and again for about a minute; per run its time.

    python bench/bench_warmup.py                                   # the examples and the issue's workloads
    python bench/bench_warmup.py --seconds 30 examples/adam.opt.hlo gpt_step_d256_f32_opt
    python bench/bench_warmup.py --modes background,eager --markdown

Each module (an HLO file with its inputs npz beside it, `<stem>.inputs.npz` as the examples have, else seeded
random inputs; or a workload name of bench/workloads.py, generated with jax) is run in fresh child processes, one
after the other, never interleaved:

* hloexec, per compile mode (`hloexec.load(..., compile=MODE)`), an empty kernel cache dir: import, then load and
  run until `--seconds` have passed (at least `--min-runs` runs). Reported: the first run, the slowest later run
  (and its ratio to the first: the goal is <= 1.5), the warm speed (median of the last five runs), the time to
  warm speed (from the start of `load` to the end of the first run within 1.2x of the warm speed) and when the
  last kernel was ready (the background compiler's events);
* XLA:CPU (hloexec.tools.xla_cpu.run_on_xla_cpu_timed): parse + convert + compile + first run of the same text
  (of the pre-optimization module for an optimized dump: XLA:CPU does not re-ingest its own optimized text), and
  its warm run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["examples/gpt_step.pre.hlo", "examples/gpt_step.opt.hlo", "examples/adam.opt.hlo",
           "gpt_step_d256_f32_pre", "gpt_step_d256_f32_opt", "adam_mixed_9.4M_opt"]
WARM_WITHIN = 1.2       # a run this close to the warm speed is warm
WARM_RUNS = 5           # the warm speed: median of the last runs


def module_files(name: str) -> tuple[Path, Path | None, Path]:
    """(module, its inputs npz or None, the module XLA:CPU runs) of a file or a bench workload."""
    path = Path(name) if Path(name).is_absolute() else ROOT / name
    if path.exists():
        stem = path.name.split(".")[0]
        npz = path.with_name(f"{stem}.inputs.npz")
        pre = path.with_name(path.name.replace(".opt.", ".pre."))
        return path, npz if npz.exists() else None, pre if pre.exists() else path
    sys.path.insert(0, str(ROOT / "bench"))
    import workloads
    workload = workloads.by_name()[name]
    (hlo,), (npz,) = workload.files()
    xla = workload.xla_files()[0][0] if workload.xla_files else hlo
    return hlo, npz, xla


# ------------------------------------------------------------------------------------ child side
def _inputs(exe, npz):
    if npz is None:
        return exe.random_inputs(0)
    from hloexec.tools.xla_cpu import load_arrays
    arrays = load_arrays(npz)
    return [arrays[f"arg{i}"] for i in range(len(arrays))]


def child_hloexec(path: str, npz: str | None, mode: str, seconds: float, min_runs: int) -> dict:
    import hloexec
    from hloexec import ops  # noqa: F401  (the op registry: part of import, not of load)
    start = time.perf_counter()
    exe = hloexec.load(path, compile=mode)
    load_s = time.perf_counter() - start
    inputs = _inputs(exe, npz)
    runs, ends = [], []
    while len(runs) < min_runs or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        exe.run(*inputs)
        runs.append(time.perf_counter() - t)
        ends.append(time.perf_counter() - start)
    report = exe.compile_report()
    return {"load_s": load_s, "runs": runs, "ends": ends, "pending": report.get("pending", 0),
            "ready": [e["ready"] for e in report.get("events", [])]}


def child_xla(path: str, npz: str | None) -> dict:
    import hloexec
    from hloexec.tools.xla_cpu import run_on_xla_cpu_timed
    exe = hloexec.load(path, compile="never")
    inputs = _inputs(exe, npz)
    import jax
    jax.devices("cpu")      # the client's start-up is not part of the module's time
    _, t = run_on_xla_cpu_timed(Path(path).read_text(), inputs, warm_runs=5)
    return {"cold_s": t["parse_s"] + t["convert_s"] + t["compile_s"] + t["first_run_s"], **t}


def run_child(args: list[str], env: dict) -> dict:
    p = subprocess.run([sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("@@RESULT "):
            return json.loads(line[len("@@RESULT "):])
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"child exited {p.returncode}: {tail[0][:300]}"}


# ----------------------------------------------------------------------------------- parent side
def measure_xla(name: str) -> dict:
    """XLA:CPU's parse + compile + first run and warm run of the module, in a fresh process."""
    _, npz, xla_hlo = module_files(name)
    return run_child(["xla", str(xla_hlo), str(npz or "")], dict(os.environ, JAX_PLATFORMS="cpu"))


def measure_hloexec(name: str, mode: str, seconds: float, min_runs: int) -> dict:
    """`summary` of a fresh process running the module for `seconds` (compile `mode`, an empty kernel cache)."""
    hlo, npz, _ = module_files(name)
    with tempfile.TemporaryDirectory(prefix="hloexec-warmup-") as cache:
        res = run_child(["hloexec", str(hlo), str(npz or ""), mode, str(seconds), str(min_runs)],
                        dict(os.environ, HLOEXEC_CACHE_DIR=cache))
    return {"error": res["error"]} if "error" in res else summary(res)


def summary(res: dict) -> dict:
    runs, ends = res["runs"], res["ends"]
    warm = sorted(runs[-WARM_RUNS:])[len(runs[-WARM_RUNS:]) // 2]
    warm_at = next(end for run, end in zip(runs, ends) if run <= WARM_WITHIN * warm)
    first = runs[0]
    slowest = max(range(1, len(runs)), key=runs.__getitem__, default=None)
    later = runs[slowest] if slowest else float("nan")
    return {"load_s": res["load_s"], "first_s": first, "slowest_later_s": later, "slowest_ratio": later / first,
            "slowest_run": slowest and slowest + 1, "slowest_end_s": slowest and ends[slowest],
            "kernels_ready_by_slowest": slowest and sum(r <= ends[slowest] for r in res["ready"]),
            "kernels": len(res["ready"]) + res["pending"], "warm_s": warm, "warm_at_s": warm_at, "runs": len(runs),
            "last_kernel_s": max(res["ready"], default=None), "pending": res["pending"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", default=DEFAULT, help="HLO files or bench/workloads.py names")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each hloexec process runs")
    parser.add_argument("--min-runs", type=int, default=10)
    parser.add_argument("--modes", default="background", help="compile modes, comma-separated")
    parser.add_argument("--markdown", action="store_true", help="print the bench/README.md table")
    args = parser.parse_args(argv)
    rows = []
    for name in args.modules:
        xla = measure_xla(name)
        for mode in args.modes.split(","):
            row = {"module": name, "mode": mode, "xla": xla, **measure_hloexec(name, mode, args.seconds, args.min_runs)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.markdown:
        print(markdown(rows))
    return 0


def markdown(rows: list[dict]) -> str:
    lines = ["| module | compile | load | first run | slowest later run (x first) | warm run | time to warm speed "
             "| last kernel ready | runs | XLA parse+compile+first run | XLA warm | time to warm / XLA's first |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        xla = r["xla"]
        xla_cold = f"{xla['cold_s']:.2f} s" if "cold_s" in xla else xla.get("error", "")
        xla_warm = f"{xla['warm_run_s'] * 1e3:.1f} ms" if "warm_run_s" in xla else ""
        if "error" in r:
            lines.append(f"| {r['module']} | {r['mode']} | {r['error']} | | | | | | | {xla_cold} | {xla_warm} | |")
            continue
        last = "" if r["last_kernel_s"] is None else f"{r['last_kernel_s']:.1f} s"
        if r["pending"]:
            last += f" ({r['pending']} pending)"
        ratio = f"{r['warm_at_s'] / xla['cold_s']:.2f}" if "cold_s" in xla else ""
        lines.append(f"| {r['module']} | {r['mode']} | {r['load_s']:.2f} s | {r['first_s'] * 1e3:.1f} ms | {r['slowest_later_s'] * 1e3:.1f}"
                     f" ms ({r['slowest_ratio']:.2f}x) | {r['warm_s'] * 1e3:.1f} ms | {r['warm_at_s']:.1f} s | {last} "
                     f"| {r['runs']} | {xla_cold} | {xla_warm} | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        kind, path, npz, *rest = sys.argv[2:]
        result = (child_hloexec(path, npz or None, rest[0], float(rest[1]), int(rest[2])) if kind == "hloexec"
                  else child_xla(path, npz or None))
        print("@@RESULT " + json.dumps(result), flush=True)
        sys.exit(0)
    sys.exit(main())
