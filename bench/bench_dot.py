"""Dots: hloexec's `dot` vs numpy's sgemm vs XLA:CPU, warm, in GFLOP/s (issue 6).

    pytest bench/bench_dot.py --benchmark-only

hloexec's dot multiplies through hloexec.kernels.blas: blocks of the output fixed by the shapes, one
single-threaded BLAS call each, over the calling thread and a pool (bit-identical for any thread
count). The benchmark stat is hloexec's warm `Executable.run` of a one-dot module; in the same test,
best of 5 each: numpy `a @ b` with OpenBLAS on its default threads (the target: >= 80%) and on one thread
(what hloexec ran before), and XLA:CPU on the same HLO (`run_on_xla_cpu_timed`, warm: includes the
host->device put and the copy back, as hloexec's run takes and returns numpy arrays). The table is
printed after the last case.

`test_gpt_step_dots` takes every dot of the GPT d256 train steps (bench/workloads.py, f32 and bf16,
pre-optimization) and times hloexec's dot (`dot_general` on operands of the instruction's shapes and types,
transposes and conversions included) against numpy's sgemm of the same [B,M,K] @ [B,K,N] on contiguous f32
operands, all of hloexec's dots then all of numpy's, best of 7 each, on the default threads and on one: the
goal's "GFLOP/s of the step's GEMMs against the machine's sgemm".
"""
from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import hloexec
from hloexec.ops.contraction import dot_general
from hloexec.tools.xla_cpu import run_on_xla_cpu_timed, xla_cpu_available
from timing import best_of
from workloads import by_name

CASES = {       # name: (batch, M, K, N), f32
    "square_2048": (0, 2048, 2048, 2048),
    "gpt_512x4096x1024": (0, 512, 4096, 1024),
    "attention_16x512x64x512": (16, 512, 64, 512),
}

_ROWS: list[dict] = []


def dot_module(batch: int, M: int, K: int, N: int) -> str:
    if not batch:
        return (f"HloModule dot\nENTRY main {{\n  a = f32[{M},{K}] parameter(0)\n  b = f32[{K},{N}] parameter(1)\n"
                f"  ROOT d = f32[{M},{N}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}\n")
    return (f"HloModule dot\nENTRY main {{\n  a = f32[{batch},{M},{K}] parameter(0)\n"
            f"  b = f32[{batch},{K},{N}] parameter(1)\n  ROOT d = f32[{batch},{M},{N}] dot(a, b), "
            "lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}\n}\n")


@pytest.fixture(scope="module")
def dot_table(request):
    yield _ROWS
    if not _ROWS:
        return
    lines = ["| dot (f32) | hloexec GFLOP/s | numpy sgemm (default threads) | hloexec / numpy | numpy, 1 BLAS thread "
             "| XLA:CPU | hloexec / XLA |", "|---|---|---|---|---|---|---|"]
    for r in _ROWS:
        xla, vs_xla = (f"{r['xla']:.0f}", f"{r['hloexec'] / r['xla']:.2f}") if r["xla"] else ("-", "-")
        lines.append(f"| {r['name']} | {r['hloexec']:.0f} | {r['numpy']:.0f} | {r['hloexec'] / r['numpy']:.2f} "
                     f"| {r['numpy_1']:.0f} | {xla} | {vs_xla} |")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        reporter.write_sep("=", "dots: GFLOP/s, warm, best of 5")
        reporter.write_line("\n".join(lines))


@pytest.mark.parametrize("name", CASES)
def test_dot(name, benchmark, dot_table):
    batch, M, K, N = CASES[name]
    lead = (batch,) if batch else ()
    rng = np.random.default_rng(0)
    a = rng.standard_normal(lead + (M, K), np.float32)
    b = rng.standard_normal(lead + (K, N), np.float32)
    flop = 2 * max(batch, 1) * M * N * K
    text = dot_module(batch, M, K, N)
    executable = hloexec.load(text, compile="eager")
    benchmark.pedantic(executable.run, args=(a, b), rounds=5, warmup_rounds=1)
    t_hloexec = benchmark.stats.stats.min if benchmark.enabled else best_of(lambda: executable.run(a, b))
    t_numpy = best_of(lambda: np.matmul(a, b))
    with threadpool_limits(1, user_api="blas"):
        t_numpy_1 = best_of(lambda: np.matmul(a, b))
    t_xla = run_on_xla_cpu_timed(text, [a, b])[1]["warm_run_min_s"] if xla_cpu_available() else None
    row = {"name": name, "hloexec": flop / t_hloexec / 1e9, "numpy": flop / t_numpy / 1e9,
           "numpy_1": flop / t_numpy_1 / 1e9, "xla": flop / t_xla / 1e9 if t_xla else None}
    benchmark.extra_info.update(row)
    dot_table.append(row)


@pytest.mark.parametrize("workload", ["gpt_step_d256_f32_pre", "gpt_step_d256_bf16_pre"])
def test_gpt_step_dots(workload, request):
    (path,), _ = by_name()[workload].files()
    module = hloexec.parse(path.read_text())[0]
    rng = np.random.default_rng(0)
    dots = []       # (hloexec's product, numpy's sgemm of the same sizes, flop)
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode != "dot":
                continue
            dims = [tuple(inst.attr(k, ())) for k in ("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims",
                                                       "rhs_contracting_dims")]
            lhs, rhs = (rng.standard_normal(o.shape.dims).astype(o.shape.dtype) for o in inst.operands)
            lb, _, lc, _ = dims
            B = int(np.prod([lhs.shape[d] for d in lb]))
            K = int(np.prod([lhs.shape[d] for d in lc]))
            M = lhs.size // (B * K)
            N = rhs.size // (B * K)
            a = rng.standard_normal((B, M, K), np.float32)
            b = rng.standard_normal((B, K, N), np.float32)
            dots.append((partial(dot_general, lhs, rhs, *dims, inst.shape.dtype), partial(np.matmul, a, b),
                         2 * B * M * N * K))
    flop = {"total": sum(f for _, _, f in dots)}
    times = {}
    # each side's dots in a block of their own, never interleaved: after numpy's two-thread sgemm, OpenBLAS's
    # threads spin on for a while, and a product timed then shares its cores with them (interleaved per dot,
    # hloexec's two threads measured no faster than one: 86 against 91 GFLOP/s)
    for suffix, limit in (("", None), ("_1", 1)):
        with threadpool_limits(limit, user_api="blas"):
            times["hloexec" + suffix] = sum(best_of(ours, 7) for ours, _, _ in dots)
            times["numpy" + suffix] = sum(best_of(sgemm, 7) for _, sgemm, _ in dots)
    gflops = {k: flop["total"] / v / 1e9 for k, v in times.items()}
    line = (f"{workload}: {flop['total'] / 1e9:.2f} GFLOP of dots; default threads: hloexec {gflops['hloexec']:.0f}"
            f" GFLOP/s, numpy sgemm {gflops['numpy']:.0f} ({gflops['hloexec'] / gflops['numpy']:.0%}); one BLAS "
            f"thread: hloexec {gflops['hloexec_1']:.0f}, numpy {gflops['numpy_1']:.0f} "
            f"({gflops['hloexec_1'] / gflops['numpy_1']:.0%})")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        reporter.write_line(line)
