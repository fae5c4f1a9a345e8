"""The one timer the benches share: best of `repeat` runs after a warm-up run."""
import time


def best_of(fn, repeat: int = 5, clock=time.perf_counter) -> float:
    """`clock` = time.thread_time measures the calling thread's CPU time (a shared machine's other
    processes then add little, for code that runs in that thread)."""
    fn()
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)
