"""Execution bench: hloexec and XLA:CPU side by side on the same HLO text and inputs (issue 6).

    pytest bench/bench_exec.py --benchmark-only                       # everything, full scale
    HLOEXEC_BENCH_SCALE=0.05 pytest bench/bench_exec.py --benchmark-only -k "adam or one_op"

Per workload, three fresh child processes (so nothing is cached in memory):
  1. hloexec cold: empty kernel cache dir (HLOEXEC_CACHE_DIR) -- import hloexec (+ ops, Numba) -> load -> first outputs;
  2. hloexec cold with the disk cache the first child left warm, a second run (it compiles the fused kernels
     the first ran op by op), then warm runs (median) and peak RSS;
  3. XLA:CPU via hloexec.tools.xla_cpu.run_on_xla_cpu_timed: parse + convert + compile + first run, warm runs.
The benchmark fixture times child 2 (fresh process to first outputs with a warm disk cache); every other
number goes into `extra_info` and the table printed at the end of the session (bench/conftest.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as wl  # noqa: E402

CHILD_TIMEOUT_S = float(os.environ.get("HLOEXEC_BENCH_TIMEOUT", "2400"))
WARM_BUDGET_S = 2.0     # warm runs: until this much time is spent (at least 3, at most 30)


# ------------------------------------------------------------------------------------ child side
def _rss_now_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rss_peak_bytes() -> int:
    """VmHWM: unlike ru_maxrss it is not inherited from the (big) parent across fork + exec."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _inputs(path: str, npz: str | None):
    from hloexec.tools.xla_cpu import load_arrays
    if npz:
        return list(load_arrays(npz).values())
    import hloexec
    from hloexec.exec.inputs import random_inputs
    return random_inputs(hloexec.parse(path)[0], 0)


def _leaves(values) -> list:
    out = []
    for v in values:
        out.extend(_leaves(v) if isinstance(v, tuple) else [v])
    return out


def _nbytes(values) -> int:
    return sum(getattr(v, "nbytes", 0) for v in _leaves(values if isinstance(values, (list, tuple)) else [values]))


def _warm_times(fn) -> list[float]:
    times, spent = [], 0.0
    while len(times) < 3 or (spent < WARM_BUDGET_S and len(times) < 30):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        spent += times[-1]
    return times


def child_hloexec(spec: dict) -> dict:
    t0 = time.perf_counter()
    import hloexec
    from hloexec import ops  # noqa: F401  (the op registry; imports Numba)
    from hloexec.exec import executor  # noqa: F401
    import_s = time.perf_counter() - t0
    rss_base = _rss_now_bytes()
    load_s = first_s = 0.0
    io_bytes = peak_bytes = 0
    exe = inputs = None
    for path, npz in zip(spec["modules"], spec["inputs"]):
        inputs = _inputs(path, npz)
        t = time.perf_counter()
        exe = hloexec.load(path, compile="eager", compile_after=1)     # the second run compiles
        t1 = time.perf_counter()
        out = exe.run(*inputs)
        t2 = time.perf_counter()
        load_s += t1 - t
        first_s += t2 - t1
        io_bytes += _nbytes(inputs) + _nbytes(out)
        peak_bytes = max(peak_bytes, exe.peak_bytes())
        del out
    res = {"import_s": import_s, "load_s": load_s, "first_s": first_s, "cold_s": import_s + load_s + first_s,
           "io_bytes": io_bytes, "peak_bytes": peak_bytes, "rss_base": rss_base}
    if spec.get("warm") and len(spec["modules"]) == 1:
        t = time.perf_counter()
        exe.run(*inputs)        # fused kernels ran op by op once; this run compiles them (TieredKernel)
        res["second_s"] = time.perf_counter() - t
        res["warm"] = _warm_times(lambda: exe.run(*inputs))
    res["rss_peak"] = _rss_peak_bytes()
    return res


def child_xla(spec: dict) -> dict:
    from hloexec.tools.xla_cpu import run_on_xla_cpu_timed
    cold_s, warm = 0.0, []
    parts = {"parse_s": 0.0, "convert_s": 0.0, "compile_s": 0.0, "first_run_s": 0.0}
    rss_base = None
    for path, npz in zip(spec["modules"], spec["inputs"]):
        leaves = _leaves(_inputs(path, npz))
        text = Path(path).read_text()
        if rss_base is None:
            import jax
            jax.devices("cpu")      # client start-up is not part of any module's cold time
            rss_base = _rss_now_bytes()
        _, t = run_on_xla_cpu_timed(text, leaves, warm_runs=5 if spec.get("warm") else 1)
        for k in parts:
            parts[k] += t[k]
        cold_s += t["parse_s"] + t["convert_s"] + t["compile_s"] + t["first_run_s"]
        warm.append(t["warm_run_s"])
    return {"cold_s": cold_s, **parts, "warm": warm if len(warm) == 1 else [], "rss_base": rss_base,
            "rss_peak": _rss_peak_bytes()}


def _child_main(argv) -> int:
    kind, spec = argv[0], json.loads(argv[1])
    try:
        res = (child_hloexec if kind == "hloexec" else child_xla)(spec)
    except Exception as e:  # reported in the table, not a crash of the bench
        res = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    print("@@RESULT " + json.dumps(res), flush=True)
    return 0


# ----------------------------------------------------------------------------------- parent side
def run_child(kind: str, spec: dict, cache_dir: str) -> dict:
    env = dict(os.environ, HLOEXEC_CACHE_DIR=cache_dir, JAX_PLATFORMS="cpu")
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, "--child", kind, json.dumps(spec)], env=env,
                           capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {CHILD_TIMEOUT_S:.0f} s"}
    wall = time.perf_counter() - t
    for line in p.stdout.splitlines():
        if line.startswith("@@RESULT "):
            res = json.loads(line[len("@@RESULT "):])
            res["process_wall_s"] = wall
            return res
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"child exited {p.returncode}: {tail[0][:200]}"}


WORKLOADS = wl.workloads()


@pytest.mark.parametrize("workload", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_exec(workload, benchmark, machine_limits, exec_results):
    modules, inputs = workload.files()
    spec = {"modules": [str(m) for m in modules], "inputs": [str(i) if i else None for i in inputs]}
    with tempfile.TemporaryDirectory(prefix="hloexec-bench-cache-") as cache_dir:
        cold = run_child("hloexec", spec, cache_dir)
        cached = {}

        def cold_cached():
            cached.update(run_child("hloexec", dict(spec, warm=True), cache_dir))
        benchmark.pedantic(cold_cached, rounds=1, iterations=1)
    xla_modules, xla_inputs = workload.xla_files() if workload.xla_files else (modules, inputs)
    xla_spec = {"modules": [str(m) for m in xla_modules], "inputs": [str(i) if i else None for i in xla_inputs]}
    xla = run_child("xla", dict(xla_spec, warm=True), tempfile.gettempdir())
    row = {"workload": workload.name, "kind": workload.kind, "modules": len(modules), "flops": workload.flops,
           "bytes_moved": workload.bytes_moved or cached.get("io_bytes", 0), "notes": workload.notes,
           "hloexec_cold": cold, "hloexec_cached": cached, "xla": xla, "limits": machine_limits}
    benchmark.extra_info.update(row)
    exec_results.append(row)


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--child":
    sys.exit(_child_main(sys.argv[2:]))
