"""hloexec.kernels.workers: kernels compiled by worker processes into the disk cache run as those compiled in the
process; a worker's failure leaves the error to the process; a module's due kernels all compile (side by side)
before the run that needs them starts."""
import os
import time

import numpy as np
import pytest
from numba.core.errors import TypingError

import hloexec
from hloexec.errors import ExecutionError
from hloexec.kernels import cache, fusion, workers
from test_exec_plan import FUSED_LOOP
from test_kernels_fusion import adam, adam_args, bits_equal, layernorm_rows


@pytest.fixture(name="pool_dir")
def _pool_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOEXEC_CACHE_DIR", str(tmp_path / "pool"))
    monkeypatch.setenv("HLOEXEC_COMPILE_WORKERS", "1")
    monkeypatch.setenv("HLOEXEC_DIRECT_KERNELS", "0")     # Numba's cache statistics (direct: test_kernels_direct)
    cache.clear_cache(disk=False)
    yield tmp_path
    cache.clear_cache(disk=False)       # this test's keys point into tmp_path


def test_worker_count(monkeypatch):
    monkeypatch.setenv("HLOEXEC_COMPILE_WORKERS", "3")
    assert workers.worker_count() == 3
    monkeypatch.setenv("HLOEXEC_COMPILE_WORKERS", "some")
    with pytest.raises(ExecutionError, match="HLOEXEC_COMPILE_WORKERS"):
        workers.worker_count()
    monkeypatch.delenv("HLOEXEC_COMPILE_WORKERS")
    monkeypatch.setattr(os, "getloadavg", lambda: (99.0, 99.0, 99.0))
    assert workers.worker_count() == 0          # a busy machine: the process compiles alone
    assert workers.worker_count(at_least=1) == 1    # ... but in the background, a worker compiles
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert workers.worker_count() == min(len(os.sched_getaffinity(0)) - 1, workers.MAX_WORKERS)


def _started(key: str) -> None:
    """Wait until a worker has taken `key` (or finished it)."""
    pool, deadline = workers._POOL, time.monotonic() + 120
    while key in pool.tasks and key not in pool.compiling:
        assert time.monotonic() < deadline, "no worker took the kernel"
        time.sleep(0.01)


def _hits_and_misses(kernel) -> tuple[int, int]:
    stats = kernel.fn.stats
    return sum(stats.cache_hits.values()), sum(stats.cache_misses.values())


def test_a_kernel_compiled_by_a_worker_gives_the_in_process_bits(pool_dir):
    rows, cols = 64, 256
    x = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32) * 30
    x[0, :3] = [np.inf, -np.inf, np.nan]
    first, last = (fusion.compile_fusion(c, eager=False) for c in (adam(1000), layernorm_rows(rows, cols)))
    cache.compile_elsewhere([first.compile_task, last.compile_task])
    _started(last.key)                  # workers take the last submitted first
    last.compile()                      # waits for the worker, then loads its machine code from the disk cache
    assert _hits_and_misses(last) == (1, 0)
    first.compile()                     # taken back, or compiled by the worker meanwhile: either way the same
    assert bits_equal(first(*adam_args(1000))[0], fusion.compile_fusion(adam(1000))(*adam_args(1000))[0])

    cache.clear_cache(disk=True)
    here = fusion.compile_fusion(layernorm_rows(rows, cols))
    assert here.key == last.key and _hits_and_misses(here) == (0, 1)     # compiled in this process
    assert bits_equal(last(x), here(x))


def test_a_worker_compiles_a_kernel_as_the_process_would_whatever_it_started_with(pool_dir, monkeypatch):
    """Workers live as long as the process: one started while the direct compiler was on still compiles
    through Numba for a process that has turned it off since (else the process finds no Numba cache entry)."""
    monkeypatch.setenv("HLOEXEC_COMPILE_WORKERS", "2")
    monkeypatch.setenv("HLOEXEC_DIRECT_KERNELS", "1")
    on = fusion.compile_fusion(adam(1002), eager=False)
    cache.compile_elsewhere([on.compile_task], background=True)     # starts the workers, direct compiler on
    workers.await_compiled(on.key)
    assert any(pool_dir.glob(f"pool/hx_{on.key}_*.o"))              # compiled by the direct compiler
    monkeypatch.setenv("HLOEXEC_DIRECT_KERNELS", "0")
    rows, cols = 64, 128
    first, last = (fusion.compile_fusion(c, eager=False) for c in (adam(1003), layernorm_rows(rows, cols)))
    cache.compile_elsewhere([first.compile_task, last.compile_task])
    _started(last.key)
    last.compile()
    assert _hits_and_misses(last) == (1, 0)                           # Numba's, from the worker


def test_a_worker_that_fails_leaves_the_error_to_the_process(pool_dir):
    bad = f"# test kernel (helpers {cache.helpers_hash()})\nfrom numba import njit\n\n\n" \
          "@njit(cache=True)\ndef kernel(x):\n    return x + 'a'\n"
    good = bad.replace("x + 'a'", "x + 1")
    tasks = [(cache.source_key(s, "w"), s, (("scalar", "float64"),)) for s in (good, bad)]
    cache.compile_elsewhere(tasks)
    bad_key = tasks[1][0]
    _started(bad_key)
    fn = cache.load_kernel(bad, bad_key, tasks[1][2])        # waits until the worker gave up on it
    with pytest.raises(TypingError):
        cache.compile_signature(fn, (("scalar", "float64"),))
    good_fn = cache.load_kernel(good, tasks[0][0], tasks[0][2])
    cache.compile_signature(good_fn, (("scalar", "float64"),))
    assert good_fn(2.0) == 3.0 and workers._POOL.workers[0].poll() is None   # the worker lives on


THREE_FUSIONS = """HloModule three
f1 { p = f32[256,64] parameter(0)
  ROOT e = f32[256,64] exponential(p) }
f2 { p = f32[256,64] parameter(0)
  c = f32[] constant(3)
  b = f32[256,64] broadcast(c), dimensions={}
  ROOT m = f32[256,64] multiply(p, b) }
f3 { p = f32[256,64] parameter(0)
  q = f32[256,64] parameter(1)
  ROOT s = f32[256,64] subtract(p, q) }
ENTRY e { x = f32[256,64] parameter(0)
  a = f32[256,64] fusion(x), kind=kLoop, calls=f1
  b = f32[256,64] fusion(a), kind=kLoop, calls=f2
  ROOT c = f32[256,64] fusion(a, b), kind=kLoop, calls=f3 }
"""


@pytest.mark.parametrize("compile_workers", ["0", "1"])
def test_the_second_run_compiles_its_kernels_before_it_starts(pool_dir, monkeypatch, compile_workers):
    """compile="eager", compile_after=1: the first run op by op; at the start of the second, every kernel the first ran compiles
    (CompilePolicy.compile_due), with and without workers, and gives the compiled tier's bits."""
    monkeypatch.setenv("HLOEXEC_COMPILE_WORKERS", compile_workers)
    exe = hloexec.load(THREE_FUSIONS, compile="eager", compile_after=1)
    tiers = [s.kernel for s in exe.plan.steps]
    assert len({t.kernel.key for t in tiers}) == 3
    x = np.random.default_rng(2).standard_normal((256, 64)).astype(np.float32)
    exe.run(x)
    assert all(t.compiled is None for t in tiers)
    compiled_at_first_step = []
    second = exe.run(x, progress=lambda done, total: compiled_at_first_step.append(
        [t.compiled is not None for t in tiers]))
    assert compiled_at_first_step[0] == [True, True, True]
    a = tiers[0].compiled(x)
    assert bits_equal(second, tiers[2].compiled(a, tiers[1].compiled(a)))


# the body's multiply as a fusion of its own
FUSION_IN_A_LOOP = FUSED_LOOP.replace("body {", """halve { x = f32[65536] parameter(0)
  h = f32[] constant(0.5)
  hb = f32[65536] broadcast(h), dimensions={}
  ROOT m = f32[65536] multiply(x, hb) }
body {""").replace("x1 = f32[65536] multiply(x, hb)", "x1 = f32[65536] fusion(x), kind=kLoop, calls=halve")


def test_a_fusion_inside_a_loop_compiled_whole_is_not_compiled_on_its_own(pool_dir, monkeypatch):
    """Only the entry's due kernels compile before a run: a loop body's fusion ran op by op while the loop was
    interpreted, but once the loop compiles whole nothing calls it again."""
    from hloexec.exec import tiering
    from tiers import tier_kernels
    monkeypatch.setattr(tiering, "LOOP_COMPILE_WORK", 1)
    monkeypatch.setattr(tiering, "LOOP_WORK_PER_LINE", 0)
    exe = hloexec.load(FUSION_IN_A_LOOP, compile="eager", compile_after=1)
    fusions, (loop,) = tier_kernels(exe)
    (entry,) = [s.kernel for s in exe.plan.steps if s.kernel in fusions]
    (in_body,) = [t for t in fusions if t is not entry]
    p = np.random.default_rng(3).standard_normal(65536).astype(np.float32)
    first = exe.run(p)
    assert loop.compiled is not None and in_body.calls and entry.compiled is None
    second = exe.run(p)
    assert entry.compiled is not None and in_body.compiled is None
    assert first.tobytes() == second.tobytes()          # exact ops: every tier agrees
