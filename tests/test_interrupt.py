"""A run stopped mid-way (Ctrl-C, SIGTERM) leaves nothing behind: no temporary files, no child or compile worker
processes, no half-written kernel cache entries. The CLI turns SIGTERM into an exception in the main thread
(exit 143), so the same `finally` blocks and atexit handlers that Ctrl-C runs (exit 130) clean up."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hloexec.kernels import cache

GOOD = "HloModule good\n\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT r = f32[4] negate(p)\n}\n"


def wait_for(predicate, seconds: float = 120.0, what: str = ""):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:            # a zombie has exited
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return found


def _as_a_terminal_starts_it():
    """Ctrl-C and SIGTERM at their defaults in the child, as a shell starts a command: a pytest worker may run with
    SIGINT ignored (a test before this one, a library), which a child would inherit, and Python then installs no
    KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def hloexec(tmp_path, *argv, **env) -> subprocess.Popen:
    scratch = tmp_path / "tmp"
    scratch.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-P", "-m", "hloexec", *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, TMPDIR=str(scratch), **env),
                            preexec_fn=_as_a_terminal_starts_it)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_minimize_ends_the_check_and_removes_the_scratch_files(tmp_path, sig, code):
    (tmp_path / "m.hlo").write_text(GOOD)
    pid_file, sleep_file = tmp_path / "check.pid", tmp_path / "sleep.pid"
    check = f"sleep 300 & echo $! > {sleep_file}; echo $$ > {pid_file}; wait; false"
    proc = hloexec(tmp_path, "minimize", tmp_path / "m.hlo", "--check", check, "-o", tmp_path / "out.hlo")
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the check to start")
    check_pid, sleep_pid = int(pid_file.read_text()), int(sleep_file.read_text())
    assert os.listdir(tmp_path / "tmp"), "the candidate's scratch directory"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert os.listdir(tmp_path / "tmp") == []
    assert not alive(check_pid) and not alive(sleep_pid), "the check (its shell, what it started) outlived the run"


def test_an_interrupted_cache_write_leaves_no_part_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOEXEC_CACHE_DIR", str(tmp_path))

    def interrupted(src, dst):
        raise KeyboardInterrupt
    monkeypatch.setattr(cache.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache.load_kernel("def kernel():\n    return 1\n", "interrupted_test_key", ())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_sigterm_while_kernels_compile_stops_the_compile_workers(tmp_path):
    """Many distinct fusions compiling on the warm run, with two compile workers on a cold cache."""
    lines = ["HloModule many", "", "ENTRY e {", "  p = f32[65536] parameter(0)"]
    ops = ["negate", "exponential", "sine", "cosine", "tanh", "abs", "sqrt", "log-plus-one"]
    outs = []
    for k in range(24):
        a, b = ops[k % len(ops)], ops[(k // len(ops) + 1 + k) % len(ops)]
        lines += [f"  a{k} = f32[65536] {a}(p)", f"  b{k} = f32[65536] {b}(a{k})",
                  f"  c{k} = f32[65536] multiply(b{k}, p)"]
        outs.append(f"c{k}")
    lines += [f"  ROOT t = ({', '.join(['f32[65536]'] * len(outs))}) tuple({', '.join(outs)})", "}"]
    (tmp_path / "many.hlo").write_text("\n".join(lines) + "\n")
    proc = hloexec(tmp_path, "run", tmp_path / "many.hlo", "--repeat", "3", HLOEXEC_COMPILE_WORKERS="2",
                   HLOEXEC_CACHE_DIR=str(tmp_path / "cache"))
    workers = wait_for(lambda: children(proc.pid), seconds=300, what="the compile workers")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    wait_for(lambda: not any(alive(w) for w in workers), seconds=30, what="the workers to stop")
    assert not list((tmp_path / "cache").glob(".*.tmp"))
