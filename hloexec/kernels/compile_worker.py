"""A compile worker process (started by kernels/workers.py): reads the kernels handed to it on stdin, compiles each
into Numba's disk cache (kernels/cache.py) and answers its key on stdout; exits with the process it compiles for."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import warnings

from . import workers
from .cache import clear_cache, compile_signature, load_kernel


def _watch_parent(parent: int) -> None:
    """Exit as soon as the process this worker compiles for is gone (killed: its exit could not stop us)."""
    while os.getppid() == parent:
        time.sleep(workers.WATCH_PARENT_SECONDS)
    os._exit(0)


def serve() -> None:
    """A worker: compile each (key, source, signature, cache dir, direct) read from stdin, answer its key on
    stdout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the process, which stops its workers
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    niceness = os.environ.get("HLOEXEC_COMPILE_NICENESS", "")
    os.nice(int(niceness) if niceness.isdigit() else workers.WORKER_NICENESS)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what Numba prints goes to stderr, not into the answers
    warnings.simplefilter("ignore")  # the process, compiling again on a failure, shows what matters
    stdin = sys.stdin.buffer
    while True:
        try:
            key, source, signature, cache, direct = pickle.load(stdin)
        except EOFError:
            return
        os.environ["HLOEXEC_CACHE_DIR"] = cache
        os.environ["HLOEXEC_DIRECT_KERNELS"] = "1" if direct else "0"  # as the process compiles it
        try:
            compile_signature(load_kernel(source, key, signature), signature, source.count("\n"))
        except Exception:  # noqa: BLE001  the process compiles it again and reports the error
            pass
        clear_cache(disk=False)  # it is on disk: the worker keeps no kernel (0.2-0.3 GB resident)
        pickle.dump(key, out)
        out.flush()
