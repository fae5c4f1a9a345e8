"""Bench fixtures: the machine's measured limits, and the execution table printed after the run.

The table (markdown, the format of bench/README.md) is printed in the terminal summary and written with
the raw numbers to $HLOEXEC_BENCH_DIR/exec_results.{md,json} (default ~/.cache/hloexec/bench).
"""
from __future__ import annotations

import json
import platform
import statistics
import subprocess

import numpy as np
import pytest

from timing import best_of
from workloads import scale, work_dir

_RESULTS: list[dict] = []


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor()


@pytest.fixture(scope="session")
def machine_limits() -> dict:
    """Memory bandwidth of a numpy copy (read + write bytes / s) and numpy's sgemm GFLOP/s, measured now."""
    src = np.ones(64 * 2**20, np.float32)       # 256 MiB: far past the caches
    dst = np.empty_like(src)
    copy_gbs = 2 * src.nbytes / best_of(lambda: np.copyto(dst, src)) / 1e9
    a = np.random.default_rng(0).standard_normal((2048, 2048), dtype=np.float32)
    sgemm = 2 * 2048**3 / best_of(lambda: a @ a) / 1e9
    return {"copy_GBps": copy_gbs, "sgemm_GFLOPps": sgemm, "cpu": _cpu_model(), "scale": scale()}


@pytest.fixture(scope="session")
def exec_results() -> list[dict]:
    return _RESULTS


def _fmt_s(x) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.2f} s"


def _median(xs):
    return statistics.median(xs) if xs else None


def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def table(rows: list[dict]) -> str:
    if not rows:
        return ""
    lim = rows[0]["limits"]
    head = (f"Machine: {lim['cpu']}, numpy copy {lim['copy_GBps']:.1f} GB/s, numpy sgemm "
            f"{lim['sgemm_GFLOPps']:.0f} GFLOP/s; HLOEXEC_BENCH_SCALE={lim['scale']}\n\n"
            "| workload | hloexec cold | after import | cold, cached | 2nd run | warm | XLA cold | XLA warm "
            "| cold ratio | after import | cached ratio | warm ratio | throughput "
            "| peak RSS; over RSS after import / plan peak |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        c, k, x = r["hloexec_cold"], r["hloexec_cached"], r["xla"]
        err = c.get("error") or k.get("error")
        hw, xw = _median(k.get("warm")), _median(x.get("warm"))
        xc = x.get("cold_s")
        if err:
            lines.append(f"| {r['workload']} | fails: {err} | | | | | {_fmt_s(xc)} | {_fmt_s(xw)} | | | | | | |")
            continue
        if x.get("error"):
            xc = None
            thr_note = f"XLA fails: {x['error'][:80]}"
        else:
            thr_note = ""
        thr = "-"
        if hw:
            if r["flops"]:
                thr = f"{r['flops'] / hw / 1e9:.1f} GFLOP/s ({r['flops'] / hw / 1e9 / lim['sgemm_GFLOPps']:.0%} sgemm)"
            elif r["bytes_moved"]:
                gbs = r["bytes_moved"] / hw / 1e9
                thr = f"{gbs:.1f} GB/s ({gbs / lim['copy_GBps']:.0%} copy)"
            if xw and r["flops"]:
                thr += f"; XLA {r['flops'] / xw / 1e9:.1f}"
            elif xw and r["bytes_moved"]:
                thr += f"; XLA {r['bytes_moved'] / xw / 1e9:.1f}"
        if r["kind"] == "many" and xc:
            thr = f"{r['modules'] / k['cold_s']:.0f} modules/s vs XLA {r['modules'] / xc:.0f} ({xc / k['cold_s']:.1f}x)"
        if thr_note:
            thr = f"{thr}; {thr_note}"
        rss = "-"
        if k.get("rss_peak") and k.get("peak_bytes"):
            over = k["rss_peak"] - k["rss_base"]
            rss = (f"{k['rss_peak'] / 2**20:.0f} MiB; +{over / 2**20:.0f} over import / plan {k['peak_bytes'] / 2**20:.0f}"
                   f" MiB ({over / k['peak_bytes']:.2f}x)")
        # the cold: after `import hloexec` (XLA's excludes `import jax` and the client start-up)
        after_import = c["load_s"] + c["first_s"]
        lines.append(f"| {r['workload']} | {_fmt_s(c['cold_s'])} | {_fmt_s(after_import)} | {_fmt_s(k['cold_s'])} "
                     f"| {_fmt_s(k.get('second_s'))} | {_fmt_s(hw)} "
                     f"| {_fmt_s(xc)} | {_fmt_s(xw)} | {_ratio(c['cold_s'], xc)} | {_ratio(after_import, xc)} "
                     f"| {_ratio(k['cold_s'], xc)} "
                     f"| {_ratio(hw, xw)} | {thr} | {rss} |")
    return head + "\n".join(lines) + "\n"


def pytest_terminal_summary(terminalreporter):
    if not _RESULTS:
        return
    text = table(_RESULTS)
    terminalreporter.write_sep("=", "hloexec vs XLA:CPU (ratios: hloexec / XLA; cold = import+load+first run; after import = load+first run)")
    terminalreporter.write(text)
    d = work_dir()
    d.mkdir(parents=True, exist_ok=True)
    (d / "exec_results.md").write_text(text)
    (d / "exec_results.json").write_text(json.dumps(_RESULTS, indent=1))
