"""The one small thread pool behind hloexec's parallel work: row blocks of GEMMs (blas.py) and outer-loop
ranges of fused kernels (fusion.py).

Work is cut into blocks from the shapes alone, and a block gives the same bits whichever thread computes
it, so results never depend on the thread count. The calling thread and up to `threads - 1` pool threads
take blocks from a shared counter until none is left: a pool thread that is slow to start (the machine
busy, the pool serving another caller) finds nothing left, and nobody waits for it -- unlike a fork-join
team, where every member must check in and one descheduled thread stalls the whole call for a time slice.
Kernels release the GIL (numpy's BLAS calls, Numba's nogil kernels), so the blocks run in parallel.
"""
from __future__ import annotations

import contextvars
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_threads() -> int:
    """Threads for parallel work: $HLOEXEC_NUM_THREADS, else the available cores."""
    return int(os.environ.get("HLOEXEC_NUM_THREADS") or CORES)


_pool: ThreadPoolExecutor | None = None
_pool_workers = 0
_pool_lock = threading.Lock()


def _forget_threads():
    """In a forked child: the parent's pool threads and lock holders do not exist there."""
    global _pool, _pool_workers, _pool_lock
    _pool, _pool_workers, _pool_lock = None, 0, threading.Lock()


os.register_at_fork(after_in_child=_forget_threads)


def _helper_pool(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_workers
    with _pool_lock:
        if _pool_workers < workers:     # the old pool's threads exit once it is collected
            _pool, _pool_workers = ThreadPoolExecutor(workers, thread_name_prefix="hloexec"), workers
        return _pool


class _BlockQueue:
    """Blocks 0..count-1 taken in turn by whichever thread is free; `finished` is set after the last."""

    def __init__(self, count: int, run):
        self.count = count
        self.run = run
        self.take = itertools.count().__next__      # atomic under the GIL
        self.left = count
        self.lock = threading.Lock()
        self.finished = threading.Event()
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
                        self.finished.set()


def run_blocks(count: int, run, threads: int | None = None) -> None:
    """run(i) for every block i, on the calling thread and up to threads - 1 pool threads (default
    `default_threads()`). Returns when every block is done; the first error a block raised is re-raised."""
    helpers = min(threads or default_threads(), count) - 1
    if helpers <= 0:
        for i in range(count):
            run(i)
        return
    queue = _BlockQueue(count, run)
    pool = _helper_pool(helpers)
    for _ in range(helpers):
        pool.submit(contextvars.copy_context().run, queue.work)    # the caller's np.errstate
    queue.work()
    queue.finished.wait()
    if queue.error is not None:
        raise queue.error


def ranges(n: int, parts: int, granule: int = 1) -> list[slice]:
    """[0, n) cut into at most `parts` ranges whose edges are multiples of `granule`."""
    step = -(-n // max(parts, 1))
    step = -(-step // granule) * granule
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]
