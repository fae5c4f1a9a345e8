"""compile="background" (exec/tiering.py's BackgroundCompiler): no run waits for the compiler, each run uses the
kernels ready when it reaches them, and

* the outputs are the same bits whichever kernels are ready (the module's ops are exact, so that every tier
  agrees: the op-by-op run with compile="never" is the reference), kernels made ready one at a time in
  several orders, a loop switching to its compiled function in the middle of a run;
* a kernel that does not compile leaves its fusion op by op, said by a CompileWarning;
* a process exiting (or killed) while its workers compile leaves no worker behind and no cache entry that
  does not load.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import hloexec
from hloexec.errors import CompileWarning
from hloexec.exec import tiering
from hloexec.kernels import cache, workers
from tiers import tier_kernels

# four fusions of exact ops (f32[256,64]: 64 KiB, worth compiling) and a while loop of exact ops; the loop's
# fusion is compiled with it, never on its own
EXACT = """HloModule exact
f1 { p = f32[256,64] parameter(0)
  q = f32[256,64] multiply(p, p)
  ROOT s = f32[256,64] subtract(q, p) }
f2 { p = f32[256,64] parameter(0)
  c = f32[] constant(3)
  b = f32[256,64] broadcast(c), dimensions={}
  m = f32[256,64] multiply(p, b)
  ROOT x = f32[256,64] maximum(m, p) }
f3 { p = f32[256,64] parameter(0)
  q = f32[256,64] parameter(1)
  s = f32[256,64] subtract(p, q)
  z = f32[] constant(0)
  zb = f32[256,64] broadcast(z), dimensions={}
  lt = pred[256,64] compare(s, zb), direction=LT
  n = f32[256,64] negate(s)
  ROOT r = f32[256,64] select(lt, n, s) }
f4 { p = f32[256,64] parameter(0)
  h = f32[] constant(0.5)
  hb = f32[256,64] broadcast(h), dimensions={}
  ROOT m = f32[256,64] multiply(p, hb) }
body { t = (s32[], f32[256,64]) parameter(0)
  k = s32[] get-tuple-element(t), index=0
  x = f32[256,64] get-tuple-element(t), index=1
  one = s32[] constant(1)
  k1 = s32[] add(k, one)
  y = f32[256,64] fusion(x), kind=kLoop, calls=f4
  a = f32[256,64] add(y, x)
  c = f32[] constant(0.25)
  cb = f32[256,64] broadcast(c), dimensions={}
  x1 = f32[256,64] multiply(a, cb)
  ROOT r = (s32[], f32[256,64]) tuple(k1, x1) }
cond { t = (s32[], f32[256,64]) parameter(0)
  k = s32[] get-tuple-element(t), index=0
  n = s32[] constant(STEPS)
  ROOT lt = pred[] compare(k, n), direction=LT }
ENTRY e { x = f32[256,64] parameter(0)
  a = f32[256,64] fusion(x), kind=kLoop, calls=f1
  b = f32[256,64] fusion(a), kind=kLoop, calls=f2
  c = f32[256,64] fusion(a, b), kind=kLoop, calls=f3
  zero = s32[] constant(0)
  t = (s32[], f32[256,64]) tuple(zero, c)
  w = (s32[], f32[256,64]) while(t), condition=cond, body=body
  ROOT r = f32[256,64] get-tuple-element(w), index=1 }
"""
STEPS = 6


def exact(steps: int = STEPS) -> str:
    return EXACT.replace("STEPS", str(steps))


@pytest.fixture(name="kernel_dir", scope="module")
def _kernel_dir(tmp_path_factory):
    """This module's kernel cache: its tests share the kernels (Numba compiles the loop in ~5-15 s)."""
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(name="in_process")
def _in_process(kernel_dir, monkeypatch):
    """No kernel loaded in this process yet; the background thread compiles in this process (no workers)."""
    monkeypatch.setenv("HLOEXEC_CACHE_DIR", str(kernel_dir))
    monkeypatch.setenv("HLOEXEC_COMPILE_WORKERS", "0")
    cache.clear_cache(disk=False)
    yield kernel_dir
    cache.clear_cache(disk=False)       # this test's keys point into kernel_dir


class Stepper:
    """Holds the background thread before each kernel it compiles until `step()` lets one through."""

    def __init__(self, monkeypatch):
        self.go = threading.Semaphore(0)

        def await_compiled(key):
            assert self.go.acquire(timeout=120), "the test never let the kernel through"
        monkeypatch.setattr(tiering, "await_compiled", await_compiled)

    def step(self, exe, timeout: float = 120) -> None:
        """Let the next kernel compile, and wait until it is swapped in."""
        ready = len(exe.compile_events)
        self.go.release()
        deadline = time.monotonic() + timeout
        while len(exe.compile_events) == ready:
            assert time.monotonic() < deadline, "the kernel never became ready"
            time.sleep(0.005)


def bits(value) -> bytes:
    return np.ascontiguousarray(value).tobytes()


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (3, 2, 1, 0), (2, 0, 3, 1)])
def test_the_same_bits_whichever_kernels_are_ready(in_process, monkeypatch, order):
    """Kernels become ready one at a time, in `order` (by their tier's index: the entry's fusions, then the loop),
    a run between each: every run gives the op-by-op bits. (The loop body's two fusions, f4 and the group
    hloexec makes of its add and multiply, are asked for at their first call, last.)"""
    x = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    reference = bits(hloexec.load(exact(), compile="never").run(x))
    priority: dict = {}
    # the thread's order: the highest priority first; the loop body's fusion (asked for at its first call) last
    monkeypatch.setattr(tiering, "_priority", lambda tier: priority.get(tier, -len(priority)))
    stepper = Stepper(monkeypatch)
    module = hloexec.parse(exact())[0]
    exe = hloexec.Executable(module, compile="background", compile_after=0, compile_kernels=False)
    fusions, (loop,) = tier_kernels(exe)
    entry = [s.kernel for s in exe.plan.steps if s.kernel in fusions]
    tiers = entry + [loop]
    assert len(tiers) == 4
    for rank, index in enumerate(order):
        priority[tiers[index]] = -rank
    assert bits(exe.run(x)) == reference        # nothing ready: op by op, interpreted
    for n, index in enumerate(order, 1):
        stepper.step(exe)
        assert [exe.compile_events[-1].name] == [tiers[index].name] and tiers[index].compiled is not None
        assert sum(t.compiled is not None for t in tiers) == n
        assert bits(exe.run(x)) == reference, f"with {n} kernels ready"
    while not exe.wait_compiled(timeout=0):     # the body's fusions, asked for while the loop ran interpreted
        stepper.step(exe)
    assert len(exe.compile_events) == 6
    assert all(e.compiled for e in exe.compile_events)


def test_a_loop_switches_to_its_compiled_function_mid_run(in_process, monkeypatch):
    """The loop's kernel becomes ready while a run is in its third step: the rest of that run is compiled."""
    x = np.random.default_rng(1).standard_normal((256, 64)).astype(np.float32)
    steps = 10
    reference = bits(hloexec.load(exact(steps), compile="never").run(x))
    stepper = Stepper(monkeypatch)
    exe = hloexec.load(exact(steps), compile="background", compile_after=0, compile_kernels=False)
    fusions, (loop,) = tier_kernels(exe)
    interpreted = []
    body = loop.body

    def stepping(state):
        interpreted.append(state[0])
        if len(interpreted) == 3:
            while loop.compiled is None:        # the fusions first (most work first), then the loop
                stepper.step(exe)
        return body(state)
    loop.body = stepping
    assert bits(exe.run(x)) == reference
    assert len(interpreted) == 3 and loop.compiled is not None     # steps 4-10 ran compiled
    assert exe.compile_events[-1].name == loop.name
    while not exe.wait_compiled(timeout=0):     # the body's fusions: the thread must not outlive the stepper
        stepper.step(exe)


def test_a_background_compile_ends_in_the_cache_dir_it_began_in(in_process, tmp_path, monkeypatch):
    """$HLOEXEC_CACHE_DIR changed while kernels compile (a test's fixture ending): they are loaded from, and
    written to, the dir they were handed over in -- where the workers compiled them."""
    from hloexec.kernels import direct_kernels, machine_code
    loaded_before = set(machine_code._LOADED)   # direct kernels an earlier test loaded: not written again
    stepper = Stepper(monkeypatch)
    exe = hloexec.load(exact(), compile="background", compile_after=0, compile_kernels=False)
    exe.run(np.zeros((256, 64), np.float32))
    monkeypatch.setenv("HLOEXEC_CACHE_DIR", str(tmp_path / "elsewhere"))
    while not exe.wait_compiled(timeout=0):
        stepper.step(exe)
    fusions, (loop,) = tier_kernels(exe)
    assert all(any(in_process.glob(f"hx_{t.compiled.key}*"))      # a source or object file
               or direct_kernels.object_name(t.compiled.key, t.compiled.signature) in loaded_before
               for t in fusions)
    assert not (tmp_path / "elsewhere").exists()


def test_a_kernel_that_does_not_compile_runs_op_by_op_with_a_warning(in_process, monkeypatch):
    from hloexec.kernels.fusion import FusedKernel
    x = np.random.default_rng(2).standard_normal((256, 64)).astype(np.float32)
    reference = bits(hloexec.load(exact(), compile="never").run(x))
    exe = hloexec.load(exact(), compile="background", compile_after=0, compile_kernels=False)
    fusions, _ = tier_kernels(exe)
    broken = next(s.kernel for s in exe.plan.steps if s.kernel in fusions)
    compile_fused = FusedKernel.compile

    def compile_or_fail(kernel):
        if kernel is broken.kernel:
            raise RuntimeError("Numba says no")
        return compile_fused(kernel)
    monkeypatch.setattr(FusedKernel, "compile", compile_or_fail)
    # said by the run's own check or when waited for: a direct compile may be over before the run ends
    with pytest.warns(CompileWarning, match="did not compile.*Numba says no"):
        assert bits(exe.run(x)) == reference
        assert exe.wait_compiled(timeout=120)
    assert broken.compiled is broken.interpret                 # op by op for good
    assert [e.name for e in exe.compile_events if not e.compiled] == [broken.name]
    assert exe.context.tier_report.to_dict()["fusion"]["reasons"] == {tiering.NOT_COMPILED: [broken.name]}
    assert bits(exe.run(x)) == reference


# two fusions the direct compiler takes (no loop: program kernels go through Numba, ~5-15 s), of this test's
# own (a kernel loaded once stays in the process, and in a worker, whatever the cache dir)
TWO_FUSIONS = """HloModule two
f1 { p = f32[256,64] parameter(0)
  q = f32[256,64] multiply(p, p)
  ROOT s = f32[256,64] add(q, p) }
f2 { p = f32[256,64] parameter(0)
  h = f32[] constant(0.8125)
  hb = f32[256,64] broadcast(h), dimensions={}
  ROOT m = f32[256,64] multiply(p, hb) }
ENTRY e { x = f32[256,64] parameter(0)
  a = f32[256,64] fusion(x), kind=kLoop, calls=f1
  ROOT b = f32[256,64] fusion(a), kind=kLoop, calls=f2 }
"""


def test_direct_kernels_compile_in_a_niced_worker_session_not_in_the_process(tmp_path, monkeypatch):
    """In the background the process translates nothing (the direct compiler's Python would hold the GIL its
    runs need): a worker compiles, the process loads the object files. The worker runs niced, in a session of
    its own (where Linux schedules sessions as groups: a group of its own, not a part of the process's)."""
    from hloexec.kernels import direct_kernels, machine_code
    monkeypatch.setenv("HLOEXEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HLOEXEC_COMPILE_WORKERS", "1")
    monkeypatch.delenv("HLOEXEC_DIRECT_KERNELS", raising=False)
    monkeypatch.delenv("HLOEXEC_COMPILE_NICENESS", raising=False)
    cache.clear_cache(disk=False)
    translated = []
    translate = direct_kernels.translate
    monkeypatch.setattr(direct_kernels, "translate", lambda *a: translated.append(a[2]) or translate(*a))
    x = np.random.default_rng(7).standard_normal((256, 64)).astype(np.float32)
    reference = bits(hloexec.load(TWO_FUSIONS, compile="never").run(x))
    exe = hloexec.load(TWO_FUSIONS, compile="background", compile_after=0, compile_kernels=False)
    assert bits(exe.run(x)) == reference
    assert exe.wait_compiled(timeout=120)
    fusions, _ = tier_kernels(exe)
    assert len(fusions) == 2 and all(e.compiled for e in exe.compile_events)
    names = [direct_kernels.object_name(t.compiled.key, t.compiled.signature) for t in fusions]
    assert all(machine_code.loaded(n) is not None and (tmp_path / f"{n}.o").exists() for n in names)
    assert translated == []
    assert bits(exe.run(x)) == reference
    for proc in (p for p in workers._POOL.workers if p is not None and p.poll() is None):
        assert os.getsid(proc.pid) != os.getsid(0)
        niceness = os.getpriority(os.PRIO_PROCESS, proc.pid) - os.getpriority(os.PRIO_PROCESS, 0)
        assert niceness == min(workers.WORKER_NICENESS, 19 - os.getpriority(os.PRIO_PROCESS, 0))
        if os.path.exists("/proc/self/autogroup"):  # sessions scheduled as groups: a group of its own
            with open("/proc/self/autogroup") as mine, open(f"/proc/{proc.pid}/autogroup") as its:
                my_group, its_group = mine.read().split(), its.read().split()
            # Empty where a cgroup's cpu controller groups the tasks instead (containers): no autogroup to compare.
            if my_group and its_group:
                assert its_group[0] != my_group[0]
    cache.clear_cache(disk=False)


class _FakeKernel:
    def __init__(self, key: str, lines: int):
        self.key, self.lines, self.compile_task = key, lines, (key, "", ())


class _FakeTier:
    """What BackgroundCompiler reads of a tier (a loop's step_work stands for the work)."""

    def __init__(self, name: str, key: str, lines: int, work: int):
        self.name, self.kernel, self.step_work, self.queued = name, _FakeKernel(key, lines), work, False


def test_the_most_work_per_line_compiles_first_and_equal_kernels_count_together(monkeypatch):
    """The workers take, and the thread swaps in, one order: op-by-op work per line of the kernel, the tiers
    sharing a kernel summed (one compile serves them all) and swapped in together."""
    submitted, swapped = [], []
    monkeypatch.setattr(tiering, "compile_elsewhere", lambda tasks, background: submitted.extend(t[0] for t in tasks))
    background = tiering.BackgroundCompiler()
    monkeypatch.setattr(background, "_compile", lambda tier, requested, directory: swapped.append(tier.name))
    tiers = [
        _FakeTier("big", "K1", lines=100, work=1000),  # 10 a line
        _FakeTier("short", "K2", lines=10, work=300),  # 30 a line
        _FakeTier("shared.a", "K3", lines=20, work=250),  # 12.5 a line, but three of them: 37.5
        _FakeTier("shared.b", "K3", lines=20, work=250),
        _FakeTier("shared.c", "K3", lines=20, work=250),
        _FakeTier("small", "K4", lines=10, work=10),  # 1 a line
    ]
    background.request(tiers)
    deadline = time.monotonic() + 60
    while len(swapped) < len(tiers):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert swapped == ["shared.a", "shared.b", "shared.c", "short", "big", "small"]
    assert submitted == ["K4", "K1", "K2", "K3", "K3", "K3"]  # workers take the last submitted first


def test_never_compiles_nothing_and_keeps_the_groups(in_process):
    pre = (hloexec.parse(exact())[0])
    exe = hloexec.Executable(pre, compile="never")
    assert tier_kernels(exe) == ([], [])
    reasons = exe.context.tier_report.to_dict()
    # the body's add and multiply grouped as for the compiled tiers (fused.x1), run op by op
    assert reasons["fusion"]["reasons"] == {tiering.NEVER_COMPILED: ["f1", "f2", "f3", "f4", "fused.x1"]}
    assert reasons["loop"]["reasons"] == {tiering.NEVER_COMPILED: ["w"]}
    assert exe.wait_compiled(timeout=0) and exe.compile_events == []
    with pytest.raises(ValueError, match="compile='later': expected one of 'background', 'eager', 'never'"):
        hloexec.load(exact(), compile="later")


def test_by_default_a_one_shot_run_compiles_nothing(in_process):
    """compile_after=1: a fusion is handed over at its second call, at the latest when the next run starts (a
    module run once, as a test's reference or a dump validated, costs no compile)."""
    exe = hloexec.load(exact())
    fusions, (loop,) = tier_kernels(exe)
    x = np.random.default_rng(5).standard_normal((256, 64)).astype(np.float32)
    entry = [s.kernel for s in exe.plan.steps if s.kernel in fusions]
    first = bits(exe.run(x))
    assert not any(t.queued for t in entry) and not loop.queued     # (the body's fusions ran more than once)
    assert bits(exe.run(x)) == first
    assert all(t.queued for t in entry)
    assert exe.wait_compiled(timeout=120) and all(t.compiled is not None for t in entry + [loop])
    assert bits(exe.run(x)) == first


def test_eager_first_run_waits_for_every_kernel(in_process):
    exe = hloexec.load(exact(), compile="eager")
    fusions, (loop,) = tier_kernels(exe)
    entry = [s.kernel for s in exe.plan.steps if s.kernel in fusions]
    assert all(t.compiled is not None for t in entry)   # compiled while prepared
    x = np.random.default_rng(3).standard_normal((256, 64)).astype(np.float32)
    exe.run(x)
    assert loop.compiled is not None and exe.compile_events == []


# A child process loads a module of many distinct fusions (one key each), runs it once, waits until a worker
# is compiling, says its workers' pids, and ends -- normally, or killed.
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import hloexec
    from hloexec.kernels import workers
    exe = hloexec.load(sys.argv[1], compile="background")
    exe.run(*exe.random_inputs(0))
    assert not exe.wait_compiled(timeout=0)       # every kernel handed over now
    deadline = time.monotonic() + 60
    while not (workers._POOL is not None and workers._POOL.compiling):
        assert time.monotonic() < deadline, "no worker started compiling"
        time.sleep(0.01)
    print(" ".join(str(p.pid) for p in workers._POOL.workers if p is not None), flush=True)
    if sys.argv[2] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
""")


def many_fusions(n: int) -> str:
    fusions = "\n".join(f"""g{k} {{ p = f32[256,64] parameter(0)
  c = f32[] constant({k + 2})
  b = f32[256,64] broadcast(c), dimensions={{}}
  m = f32[256,64] multiply(p, b)
  ROOT s = f32[256,64] subtract(m, p) }}""" for k in range(n))
    calls = "\n".join(f"  y{k} = f32[256,64] fusion(y{k - 1}), kind=kLoop, calls=g{k}" for k in range(1, n))
    return f"""HloModule many
{fusions}
ENTRY e {{ x = f32[256,64] parameter(0)
  y0 = f32[256,64] fusion(x), kind=kLoop, calls=g0
{calls}
  ROOT r = f32[256,64] copy(y{n - 1}) }}
"""


def gone(pid: int) -> bool:
    """The process `pid` has ended (a zombie waiting for its new parent to reap it counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("end", ["exits", "killed"])
def test_a_process_ending_mid_compile_leaves_nothing_behind(tmp_path, monkeypatch, end):
    path = tmp_path / "many.hlo"
    path.write_text(many_fusions(12))
    kernels = tmp_path / "kernels"
    # through Numba: kernels the direct compiler takes compile on the background thread, not in workers
    env = dict(os.environ, HLOEXEC_CACHE_DIR=str(kernels), HLOEXEC_COMPILE_WORKERS="1", HLOEXEC_DIRECT_KERNELS="0")
    child = subprocess.run([sys.executable, "-c", CHILD, str(path), end], env=env, capture_output=True, text=True,
                           timeout=120)
    assert child.returncode == (0 if end == "exits" else -9), child.stderr
    pids = [int(p) for p in child.stdout.split()]
    assert pids
    deadline = time.monotonic() + 10
    while not all(gone(p) for p in pids):
        assert time.monotonic() < deadline, f"compile workers {pids} outlived their process"
        time.sleep(0.05)
    # whatever the workers left in the cache loads and runs: every kernel compiled (or loaded) here
    monkeypatch.setenv("HLOEXEC_CACHE_DIR", str(kernels))
    monkeypatch.setenv("HLOEXEC_COMPILE_WORKERS", "0")
    cache.clear_cache(disk=False)
    try:
        x = np.random.default_rng(4).standard_normal((256, 64)).astype(np.float32)
        exe = hloexec.load(str(path), compile="eager")
        fusions, _ = tier_kernels(exe)
        assert len(fusions) == 12 and all(t.compiled is not None and t.compiled is not t.interpret
                                          for t in fusions)
        assert bits(exe.run(x)) == bits(hloexec.load(str(path), compile="never").run(x))
    finally:
        cache.clear_cache(disk=False)


CHILD_DIRECT = textwrap.dedent("""
    import os, signal, sys, time
    import hloexec
    exe = hloexec.load(sys.argv[1], compile="background")
    exe.run(*exe.random_inputs(0))
    exe.wait_compiled(timeout=float(sys.argv[2]))     # killed while the background thread compiles
    print(len(exe.compile_events), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("after", [0.0, 0.3])
def test_a_process_killed_mid_direct_compile_leaves_no_part_file(tmp_path, monkeypatch, after):
    path = tmp_path / "many.hlo"
    path.write_text(many_fusions(12))
    kernels = tmp_path / "kernels"
    env = dict(os.environ, HLOEXEC_CACHE_DIR=str(kernels))
    env.pop("HLOEXEC_DIRECT_KERNELS", None)
    child = subprocess.run([sys.executable, "-c", CHILD_DIRECT, str(path), str(after)], env=env,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -9, child.stderr
    assert not list(kernels.glob(".*")), "a part file was left"
    monkeypatch.setenv("HLOEXEC_CACHE_DIR", str(kernels))
    cache.clear_cache(disk=False)
    try:
        x = np.random.default_rng(4).standard_normal((256, 64)).astype(np.float32)
        exe = hloexec.load(str(path), compile="eager")
        fusions, _ = tier_kernels(exe)
        assert len(fusions) == 12 and all(isinstance(t.compiled.fn, type(len)) for t in fusions)
        assert bits(exe.run(x)) == bits(hloexec.load(str(path), compile="never").run(x))
    finally:
        cache.clear_cache(disk=False)


def test_run_compile_and_profile_say_what_compiled_when(in_process, tmp_path, capsys):
    import json

    from hloexec.tools.cli import main
    path = tmp_path / "exact.hlo"
    path.write_text(exact())
    assert main(["run", str(path), "--compile", "never", "--profile", "3", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["compile"] == {"mode": "never"}
    assert document["tiers"]["fusion"]["compiled"] == 0
    assert main(["run", str(path), "--compile", "eager", "--profile", "3"]) == 0
    assert "compile='eager': every kernel due compiled before the call that needed it" in capsys.readouterr().out
    assert main(["run", str(path), "--repeat", "2", "--profile", "3", "--json"]) == 0     # background
    report = json.loads(capsys.readouterr().out)["compile"]
    assert report["mode"] == "background"
    assert {e["name"] for e in report["events"]} <= {"f1", "f2", "f3", "f4", "fused.x1", "w"}
    assert len(report["events"]) + report["pending"] >= 3      # the entry's fusions, handed over at the 2nd run
    assert main(["run", str(path), "--compile", "later"]) == 2
    for thread in threading.enumerate():    # the background run's compiles end here, not in a later test
        if thread.name == "hloexec-background-compile":
            thread.join(timeout=120)
