"""Bit-identical outputs across runs and across thread counts (fused kernels, BLAS).

Why it holds (docs/robustness.md): a fused kernel's thread split cuts only the first *output* dimension, and
each output element reduces its own elements in order inside one thread, so no reduced axis is ever split
across threads; numpy's reductions run single-threaded. Each configuration runs in a fresh subprocess, as
thread counts are read at import.

OpenBLAS partitions a dot's output rows between its threads and the rows at a partition edge go through
different micro-kernels, so hloexec runs every BLAS call on one OpenBLAS thread and cuts large products
into blocks fixed by the shapes, spread over its own threads (hloexec/kernels/blas.py): dots and
convolutions are identical whatever OPENBLAS_NUM_THREADS is.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hloexec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# a fused row reduction big enough to be split over threads (see hloexec.kernels.fusion.PARALLEL_THRESHOLD), a full
# reduction to a scalar, and a dot big enough for BLAS to use its threads
REDUCTIONS = """HloModule reductions
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
fused_rows {
  a = f32[512,4096] parameter(0)
  e = f32[512,4096] exponential(a)
  z = f32[] constant(0)
  ROOT r = f32[512] reduce(e, z), dimensions={1}, to_apply=add
}
ENTRY main {
  a = f32[512,4096] parameter(0)
  b = f32[4096,384] parameter(1)
  rows = f32[512] fusion(a), kind=kLoop, calls=fused_rows
  z = f32[] constant(0)
  total = f32[] reduce(a, z), dimensions={0,1}, to_apply=add
  d = f32[512,384] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (f32[512], f32[], f32[512,384]) tuple(rows, total, d)
}
"""

SOURCES = {"reductions": REDUCTIONS, "mlp": EXAMPLES / "mlp.opt.hlo",
           "layernorm_bwd": EXAMPLES / "layernorm_bwd.opt.hlo", "conv": EXAMPLES / "conv.opt.hlo"}

CHILD = """
import hashlib, json, sys
import numpy as np
import hloexec
digests = {}
for name, source in json.loads(sys.argv[1]).items():
    executable = hloexec.load(source)
    inputs = executable.random_inputs(seed=7)
    digests[name] = []
    for run in range(2):        # the first run interprets fusions, the second runs them compiled
        outputs = executable.run(*inputs)
        leaves = list(outputs) if isinstance(outputs, tuple) else [outputs]
        digests[name].append(hashlib.sha256(b"".join(np.ascontiguousarray(x).tobytes() for x in leaves)).hexdigest())
print(json.dumps(digests))
"""


def _digests(kernel_threads: int, blas_threads: int) -> dict[str, str]:
    env = dict(os.environ, HLOEXEC_NUM_THREADS=str(kernel_threads), NUMBA_NUM_THREADS=str(kernel_threads),
               OPENBLAS_NUM_THREADS=str(blas_threads),
               OMP_NUM_THREADS=str(blas_threads), MKL_NUM_THREADS=str(blas_threads))
    sources = {k: str(v) for k, v in SOURCES.items()}
    done = subprocess.run([sys.executable, "-P", "-c", CHILD, json.dumps(sources)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_parallel_path_is_exercised():
    from hloexec.kernels.fusion import compile_fusion
    module = hloexec.parse(REDUCTIONS)[0]
    assert compile_fusion(module["fused_rows"]).parallel


@pytest.mark.parametrize("compile_after", [0, 1])
def test_same_outputs_across_runs_in_process(compile_after):
    """Once a module's fused kernels are compiled (at once, or after `compile_after` op-by-op runs),
    every further run gives the same bits."""
    executable = hloexec.load(REDUCTIONS, compile="eager", compile_after=compile_after)
    inputs = executable.random_inputs(seed=3)
    runs = [executable.run(*inputs) for _ in range(compile_after + 2)]
    for a, b in zip(runs[-2], runs[-1]):
        assert a.tobytes() == b.tobytes()


def test_same_outputs_with_one_and_two_kernel_threads_and_across_processes():
    one, two, two_again = _digests(1, 1), _digests(2, 1), _digests(2, 1)
    assert one == two == two_again
    assert len({d for runs in one.values() for d in runs}) >= len(SOURCES)   # they hash something


def test_same_outputs_with_one_and_two_blas_threads():
    assert _digests(2, 1) == _digests(2, 2)
