"""The heap kept between runs (hloexec/kernels/heap.py): a warm run reuses the pages the last one freed instead of
faulting fresh ones in, and nothing is changed where the user chose malloc's settings or opted out."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc only")

# Four 2 MiB temporaries and a 2 MiB result per run, op by op (numpy's own allocations: below its 4 MiB huge-page hint).
_RUN = r'''
import resource
import numpy as np
import hloexec
from hloexec.kernels import heap
text = """HloModule m
ENTRY main {
  p = f32[512,1024] parameter(0)
  q = f32[512,1024] parameter(1)
  a = f32[512,1024] multiply(p, q)
  b = f32[512,1024] add(a, p)
  c = f32[512,1024] exponential(b)
  d = f32[512,1024] subtract(c, q)
  ROOT e = f32[512,1024] multiply(d, a)
}
"""
exe = hloexec.load(text, use_numba=False)
args = [np.ones((512, 1024), np.float32)] * 2
for _ in range(3):
    exe.run(*args)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    exe.run(*args)
print(heap.keep_freed_memory(), (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
'''


def _faults_per_run(**env) -> tuple[bool, float]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    out = subprocess.run([sys.executable, "-c", _RUN], env=environ, capture_output=True, text=True, check=True)
    tuned, faults = out.stdout.split()
    return tuned == "True", float(faults)


def test_warm_runs_reuse_the_freed_pages():
    tuned, faults = _faults_per_run()
    untuned, faults_untuned = _faults_per_run(HLOEXEC_KEEP_FREED_MEMORY="0")
    assert tuned and not untuned
    assert faults_untuned > 500                     # ~1,500 here: glibc hands the temporaries back each run
    assert faults < faults_untuned / 20


def test_malloc_settings_the_user_chose_are_left_alone():
    tuned, _ = _faults_per_run(MALLOC_TRIM_THRESHOLD_="131072")
    assert not tuned
