"""The thread pool (hloexec/kernels/threads.py): every block runs once, errors reach the caller, the pool keeps
nothing of a finished call, and waiting spins in C (csrc/spin_wait.c) with the GIL released."""
from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest

from hloexec.kernels import threads


def test_every_block_runs_once_on_at_most_the_threads_asked():
    for count, wanted in [(1, 2), (2, 2), (7, 2), (64, 3), (5, 1)]:
        seen: list[tuple[int, str]] = []
        lock = threading.Lock()

        def run(i):
            time.sleep(0.0005)
            with lock:
                seen.append((i, threading.current_thread().name))
        threads.run_blocks(count, run, wanted)
        assert sorted(i for i, _ in seen) == list(range(count))
        assert len({name for _, name in seen}) <= wanted


def test_a_block_error_reaches_the_caller_after_the_other_blocks():
    done = []

    def run(i):
        if i == 3:
            raise ValueError("block 3")
        time.sleep(0.001)
        done.append(i)
    with pytest.raises(ValueError, match="block 3"):
        threads.run_blocks(8, run, 2)
    assert sorted(done) == [0, 1, 2, 4, 5, 6, 7]


def test_the_pool_keeps_no_reference_to_a_finished_call():
    class Payload:       # what a block's closure holds: a product's operands and output, say
        pass
    payload = Payload()
    ref = weakref.ref(payload)

    def run(i, payload=payload):
        time.sleep(0.0005)
    threads.run_blocks(4, run, 2)
    queue = threads._BlockQueue(3, run, 0)  # a finished call's queue, as a pool thread's frame may still hold it
    queue.work()
    del run, payload
    gc.collect()
    assert ref() is None      # at once: not when a helper leaves its last block's frame, after the caller returned
    assert queue.finished.is_set()


def test_errstate_of_the_caller_holds_in_the_helpers():
    import numpy as np
    flags = []

    def run(i):
        flags.append(np.geterr()["divide"])
        time.sleep(0.001)
    with np.errstate(divide="raise"):
        threads.run_blocks(6, run, 2)
    assert flags == ["raise"] * 6


@pytest.mark.skipif(threads._spin_while_equal is None, reason="the spin-wait library (hlo_spin) is not built")
def test_a_call_that_does_not_linger_leaves_the_pool_asleep(monkeypatch):
    """After run_blocks(..., linger=False) the pool threads sleep at once (no CPU while the caller sleeps); after
    a lingering call they spin for the next one (SPIN_SECONDS, here 0.5 s)."""
    monkeypatch.setattr(threads, "SPIN_SECONDS", 0.5)

    def cpu_while_asleep(seconds: float) -> float:
        t = time.process_time()
        time.sleep(seconds)
        return time.process_time() - t
    threads.run_blocks(4, lambda i: time.sleep(0.001), 2, linger=False)
    assert cpu_while_asleep(0.2) < 0.05
    threads.run_blocks(4, lambda i: time.sleep(0.001), 2)
    assert cpu_while_asleep(0.4) > 0.01  # (0.4 s of spinning: 0.01 s even with a tenth of a core, on a loaded CI)


@pytest.mark.skipif(threads._spin_while_equal is None, reason="the spin-wait library (hlo_spin) is not built")
def test_spin_while_equal_returns_on_a_change_or_at_its_deadline():
    spin = threads._spin_while_equal
    word = threads._word()
    word[0] = 5
    assert spin(word, 4, 10**9, 0) == 5          # already different: at once
    t = time.perf_counter()
    assert spin(word, 5, 2_000_000, 0) == 5      # unchanged: after ~2 ms
    assert 0.0015 < time.perf_counter() - t < 1.0

    def change():
        time.sleep(0.02)
        word[0] = 6
    changer = threading.Thread(target=change)
    t = time.perf_counter()
    changer.start()     # the change lands while this thread spins in C: cffi released the GIL
    assert spin(word, 5, 5 * 10**9, 1000) == 6
    assert time.perf_counter() - t < 2.0
    changer.join()
