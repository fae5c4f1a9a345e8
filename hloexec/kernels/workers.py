"""Compiling generated kernels side by side, in worker processes.

Numba compiles one function at a time in a process (its global compiler lock), 0.1-2.5 s each, and a module's
second run may compile a hundred. `submit(tasks)` hands kernels about to be compiled to worker processes
(`kernels/compile_worker.py`, started at the first submit worth one and kept for the process's life),
which compile them into Numba's disk cache (`kernels/cache.py`). The process itself compiles them in order as
before: `claim(key)`, which `cache.load_kernel` calls first, takes back a kernel no worker has started (compiled
here), or waits for the worker compiling it (then loaded from the disk cache, ~30 ms). Workers take the last
submitted first, so the process and its workers meet in the middle. A kernel is the same machine code wherever it
compiled: the same source, Numba, LLVM and host. A worker that fails (a generator bug, a crash) only hands the
kernel back: the process compiles it and sees the error itself.

HLOEXEC_COMPILE_WORKERS sets the number of workers (0: none). By default, as many as the machine has idle cores
(the usable cores minus the 1-minute load average, rounded; the process's own recent work counts in that load),
at most one fewer than the usable cores and MAX_WORKERS: on a busy machine a worker only takes CPU from the
process (measured at load 7 on 2 cores: the GPT d256 pre step's compiling run 7% slower with one worker).

Kernels compiled in the background (`submit(..., background=True)`, exec/tiering.py's BackgroundCompiler) are
compiled by workers only (at least one, even on a busy machine: the process keeps running op by op meanwhile),
and the background thread waits for them (`await_compiled`) rather than taking them back. Workers run
WORKER_NICENESS lower than the process (`nice`; HLOEXEC_COMPILE_NICENESS sets it): the process's runs come
first. Measured at load 10 on 2 cores, the GPT d256 pre step's runs before any kernel was in, 30 s each
(median): 0.55 s / 0.39 s with nothing compiling, 1.02 s with a worker at the same priority (15 kernels in),
0.38 s niced by 5 (5 kernels in), 0.53 s niced by 10 (none in: on a busy machine it starves). Each worker runs
in a session of its own: where Linux schedules sessions as groups of equal weight (autogroups: the default on
desktops, and on the machine measured), a worker in the process's session shares that session's CPU with the
process's runs -- a niced one still takes a quarter of it, and gets little -- while in a session of its own it
takes a session's share from the whole machine. Measured on the GPT d256 opt step's warm-up at load 11-13 on 2
cores (bench/bench_warmup.py): every kernel in at 32 s and the slowest later run 1.02x the first, against 119 of
168 kernels still pending after a minute (slowest 1.67x) with the worker's session niced by 5 too. They exit when the
process does: killed at its exit, or, if it was killed, within WATCH_PARENT_SECONDS (they compile into
temporary files renamed into place, Numba's cache files as the sources, so a killed worker leaves no
half-written cache entry).
"""

from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path

from ..errors import ExecutionError

MAX_WORKERS = 4
WORKER_NICENESS = 5
MAX_STARTS = 4 * MAX_WORKERS  # workers that died are replaced, up to this many started in all
WATCH_PARENT_SECONDS = 0.2
WORKER_MAIN = "from hloexec.kernels.compile_worker import serve; serve()"  # a worker process's program


def worker_count(at_least: int = 0) -> int:
    """Workers to use: $HLOEXEC_COMPILE_WORKERS, else the idle cores but `at_least` (see the module's doc)."""
    value = os.environ.get("HLOEXEC_COMPILE_WORKERS")
    if value is not None:
        try:
            return max(0, int(value))
        except ValueError:
            raise ExecutionError(f"HLOEXEC_COMPILE_WORKERS must be a number of processes, got {value!r}") from None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    idle = round(cores - os.getloadavg()[0]) if hasattr(os, "getloadavg") else cores
    return max(at_least, min(idle, cores - 1, MAX_WORKERS))


class _Pool:
    """The queue of submitted kernels and the worker processes draining it, one feeding thread each."""

    def __init__(self):
        self.pid = os.getpid()  # a forked child starts its own pool: it has none of these threads
        self.cond = threading.Condition()
        self.queue: deque = deque()  # keys no worker has started, in submission order
        self.tasks: dict[str, tuple] = {}  # key -> (source, signature, cache dir, direct), queued or compiling
        self.compiling: set[str] = set()
        self.workers: list[subprocess.Popen | None] = []  # None: one that did not start
        self.alive = 0  # workers started and not dead

    def submit(self, tasks, cache, background: bool, direct: bool) -> None:
        with self.cond:
            for key, source, signature in tasks:
                if key not in self.tasks:
                    self.tasks[key] = (source, signature, str(cache), direct)
                    self.queue.append(key)
            self.cond.notify_all()
            if background:  # nobody else compiles them: at least one worker, one per kernel at most
                wanted = min(worker_count(at_least=1), len(self.queue) + len(self.compiling))
            else:  # a lone kernel would only be raced for: the process compiles it at once
                wanted = min(worker_count(), len(self.queue) - 1)
        while self.alive < wanted and len(self.workers) < MAX_STARTS and self.start_worker():
            pass

    def start_worker(self) -> bool:
        """Start a worker and the thread feeding it; False if no process starts (the process compiles all)."""
        # the worker imports this very hloexec (-P: not one in the working directory)
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=package_root + (os.pathsep + path if path else ""))
        try:
            proc = subprocess.Popen(  # a session of its own: see the module's doc (autogroups)
                [sys.executable, "-P", "-c", WORKER_MAIN],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except OSError:
            self.workers.append(None)  # counted: not tried again
            return False
        self.workers.append(proc)
        with self.cond:
            self.alive += 1
        threading.Thread(target=self.feed, args=(proc,), name="hloexec-compile-worker", daemon=True).start()
        return True

    def feed(self, proc) -> None:
        """Hand `proc` the last queued kernel, wait for it to be compiled, repeat; a worker that dies hands its
        kernel back to the process (claim stops waiting) and is not replaced."""
        while True:
            with self.cond:
                while not self.queue:
                    self.cond.wait()
                key = self.queue.pop()
                self.compiling.add(key)
                source, signature, cache, direct = self.tasks[key]
            alive = False
            try:
                pickle.dump((key, source, signature, cache, direct), proc.stdin)
                proc.stdin.flush()
                alive = pickle.load(proc.stdout) == key
            except (OSError, EOFError, pickle.PickleError):  # the worker died
                pass
            finally:  # whatever happened, nobody waits for this kernel any more
                with self.cond:
                    self.compiling.discard(key)
                    del self.tasks[key]
                    self.cond.notify_all()
                if not alive:
                    proc.kill()
                    with self.cond:
                        self.alive -= 1
                        self.cond.notify_all()
            if not alive:
                return

    def claim(self, key) -> None:
        with self.cond:
            if key in self.tasks and key not in self.compiling:
                self.queue.remove(key)
                del self.tasks[key]
            while key in self.compiling:
                self.cond.wait()

    def await_compiled(self, key) -> None:
        with self.cond:
            while key in self.tasks and self.alive > 0:
                self.cond.wait()
        self.claim(key)  # no worker left: it compiles in the process

    def stop(self) -> None:
        if os.getpid() != self.pid:  # a forked child's exit: the workers are its parent's
            return
        for proc in self.workers:
            if proc is not None:
                proc.kill()
                proc.wait()


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def submit(tasks, cache: Path, background: bool = False, direct: bool = True) -> None:
    """Compile `tasks`, (key, source, signature) each, in worker processes into cache dir `cache` (kernels that
    are queued or compiling already are not queued again). `background`: for a thread that waits for them
    (await_compiled) while the process runs on; else the process compiles them itself too (claim). `direct`:
    whether the direct compiler may take them (the process's choice, whatever the workers started with)."""
    global _POOL
    tasks = list(tasks)
    if not tasks or worker_count(at_least=int(background)) == 0 or not background and len(tasks) < 2:
        return
    with _POOL_LOCK:  # (one thread at a time starts workers)
        if _POOL is None or _POOL.pid != os.getpid():
            _POOL = _Pool()
            atexit.register(_POOL.stop)
        _POOL.submit(tasks, cache, background, direct)


def claim(key: str) -> None:
    """Before kernel `key` is loaded: take it back if no worker has started it, else wait until its worker is done
    (it is then in the disk cache, or the worker failed and it compiles here)."""
    pool = _POOL
    if pool is not None and pool.pid == os.getpid():
        pool.claim(key)


def await_compiled(key: str) -> None:
    """Before kernel `key` is loaded by a background thread: wait until a worker has compiled it (it is then in
    the disk cache); if no worker is left to, take it back (it compiles in the process)."""
    pool = _POOL
    if pool is not None and pool.pid == os.getpid():
        pool.await_compiled(key)
