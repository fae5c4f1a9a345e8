"""The one small thread pool behind hloexec's parallel work: row blocks of GEMMs (blas.py) and outer-loop
ranges of fused kernels (fusion.py).

Work is cut into blocks from the shapes alone, and a block gives the same bits whichever thread computes
it, so results never depend on the thread count. The calling thread and up to `threads - 1` pool threads
take blocks from a shared counter until none is left: a pool thread that is slow to start (the machine
busy, the pool serving another caller) finds nothing left, and nobody waits for it -- unlike a fork-join
team, where every member must check in and one descheduled thread stalls the whole call for a time slice.
Kernels release the GIL (numpy's BLAS calls, Numba's nogil kernels), so the blocks run in parallel.

Waiting spins before it sleeps: a pool thread that finished its blocks watches for the next call for
`SPIN_SECONDS` ($HLOEXEC_SPIN_US; 0 on a machine shared with other work), and the caller watches for the
last block in flight, both in C with the GIL released (csrc/spin_wait.c). A thread asleep in the kernel
takes 50-100 us to run again once woken on this VM, and the GPT d256 step makes ~120 parallel calls: 20-25 ms
of one core's waiting per step, 5-13% of the step's time won back by spinning (bench/README.md, "Waking the
pool"). A call may ask the pool not to linger after it (the error bounds' passes, kernels/bound_rules.py: their
next call comes past the spin).
"""

from __future__ import annotations

import contextvars
import itertools
import os
import threading

from ..parser.clib import open_library
from ._spin_ffi import ffi  # csrc/spin_wait.h's declarations, pre-parsed (parser/scan_cdef.py)

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
SPIN_SECONDS = float(os.environ.get("HLOEXEC_SPIN_US", 300)) * 1e-6  # 0: sleep at once
GRACE_SECONDS = 10e-6  # spun on after the word changed: see csrc/spin_wait.c (5-20 us measured best)


def default_threads() -> int:
    """Threads for parallel work: $HLOEXEC_NUM_THREADS, else the available cores."""
    return int(os.environ.get("HLOEXEC_NUM_THREADS") or CORES)


def _spin_library():
    """csrc/spin_wait.c's library (its own, opened through cffi, which releases the GIL during a call); None where
    it is not built: waiting then sleeps at once. Kept open while the module lives (cffi closes a collected one)."""
    try:
        return open_library("hlo_spin", ffi)[0]
    except ImportError:
        return None


_SPIN_LIBRARY = _spin_library()
# hlo_spin_while_equal(word, value, max_ns, grace_ns)
_spin_while_equal = None if _SPIN_LIBRARY is None else _SPIN_LIBRARY.hlo_spin_while_equal


def _word():
    """A 64-bit word spinning threads watch: `word[0]`."""
    return ffi.new("int64_t *")


def _spin(word, value: int) -> int:
    """Spin while word[0] == value, at most SPIN_SECONDS; the word's last value."""
    if _spin_while_equal is None or SPIN_SECONDS <= 0:
        return word[0]
    return _spin_while_equal(word, value, int(SPIN_SECONDS * 1e9), int(GRACE_SECONDS * 1e9))


class _Pool:
    """Helper threads taking blocks of the newest posted queue; between queues each spins, then sleeps."""

    def __init__(self, workers: int):
        self.workers = workers
        self.generation = _word()  # bumped by each post: what spinning helpers watch
        self.queue: _BlockQueue | None = None
        self.wake = threading.Condition()
        self.sleeping = 0
        for i in range(workers):
            threading.Thread(target=self._serve, name=f"hloexec-{i}", daemon=True).start()

    def post(self, queue: _BlockQueue) -> None:
        with self.wake:
            self.queue = queue
            self.generation[0] += 1
            if self.sleeping:
                self.wake.notify_all()

    def retire(self, queue: _BlockQueue) -> None:
        """Drop a finished queue, and what its blocks reference, unless a newer one was posted."""
        with self.wake:
            if self.queue is queue:
                self.queue = None

    def _serve(self) -> None:
        seen, linger = 0, True
        while True:
            generation = _spin(self.generation, seen) if linger else self.generation[0]
            if generation == seen:
                with self.wake:
                    self.sleeping += 1
                    while self.generation[0] == seen:
                        self.wake.wait()
                    self.sleeping -= 1
                    generation = self.generation[0]
            seen = generation
            linger = self._help()

    def _help(self) -> bool:
        """Take blocks of the newest queue, if it has a seat left (its own frame: nothing of it stays
        referenced while this thread waits). Returns whether to spin for the next one (the queue's `linger`)."""
        queue = self.queue
        if queue is not None and queue.seat() < queue.helpers:
            queue.context.copy().run(queue.work)  # the caller's np.errstate
        return queue is None or queue.linger


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _forget_threads():
    """In a forked child: the parent's pool threads and lock holders do not exist there."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_threads)


def _helper_pool(workers: int) -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is None or _pool.workers < workers:  # a smaller old pool's threads keep serving: harmless
            _pool = _Pool(workers)
        return _pool


class _BlockQueue:
    """Blocks 0..count-1 taken in turn by whichever thread is free; `finished` is set after the last."""

    def __init__(self, count: int, run, helpers: int, linger: bool = True):
        self.count = count
        self.run = run
        self.helpers = helpers
        self.linger = linger
        self.seat = itertools.count().__next__  # a helper joins with a seat below `helpers`
        self.take = itertools.count().__next__  # atomic under the GIL
        self.left = count
        self.lock = threading.Lock()
        self.finished = threading.Event()
        self.done = _word()  # 1 after the last block: what the spinning caller watches
        self.context = contextvars.copy_context()
        self.error: BaseException | None = None

    def work(self):
        while (i := self.take()) < self.count:
            try:
                self.run(i)
            except BaseException as e:  # re-raised by the caller
                self.error = self.error or e
            finally:
                with self.lock:
                    self.left -= 1
                    if self.left == 0:
                        # what the blocks' function holds (the call's arrays) freed now, not when the last pool
                        # thread to leave this frame (preempted, perhaps) drops the queue
                        self.run = None
                        self.done[0] = 1
                        self.finished.set()


def run_blocks(count: int, run, threads: int | None = None, linger: bool = True) -> None:
    """run(i) for every block i, on the calling thread and up to threads - 1 pool threads (default
    `default_threads()`). Returns when every block is done; the first error a block raised is re-raised.
    `linger`: whether a pool thread done with these blocks spins for the next call (SPIN_SECONDS) before it
    sleeps."""
    helpers = min(threads or default_threads(), count) - 1
    if helpers <= 0:
        for i in range(count):
            run(i)
        return
    queue = _BlockQueue(count, run, helpers, linger)
    pool = _helper_pool(helpers)
    pool.post(queue)
    queue.work()
    if not queue.finished.is_set():  # blocks still running on helpers
        _spin(queue.done, 0)
        queue.finished.wait()
    pool.retire(queue)
    if queue.error is not None:
        raise queue.error


def ranges(n: int, parts: int, granule: int = 1) -> list[slice]:
    """[0, n) cut into at most `parts` ranges whose edges are multiples of `granule`."""
    step = -(-n // max(parts, 1))
    step = -(-step // granule) * granule
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]
