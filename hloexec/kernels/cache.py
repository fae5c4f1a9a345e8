"""The kernel cache: where generated kernel sources live and how their compiled functions are loaded.

Both generators (`kernels/fusion.py`, `kernels/program.py`) produce a module's source text defining
`kernel`, decorated `@njit(cache=True)`, and a key (a hash of that source). Structurally equal computations
give the same source, hence the same key, and share one compiled function:

* in-process through a dict keyed by the key;
* across processes through Numba's on-disk cache: the source is written to `<cache dir>/hx_<key>.py`
  (cache dir: $HLOEXEC_CACHE_DIR, read on every load, or ~/.cache/hloexec/kernels), the directory is put
  on sys.path and the module imported by name, so that `cache=True` finds its cache again.

Numba's disk cache does not track the functions a cached function calls: every generated source names
`helpers_hash()` (a hash of the helper modules) in its first line, so a change to the helpers changes the
key. This module is the only one touching the dict, sys.path and the `hx_*` modules in sys.modules.

Kernels about to compile may be handed to worker processes first (`compile_elsewhere`, `kernels/workers.py`):
`load_kernel` then waits for the worker compiling one, and finds it in the disk cache.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import sys
import tempfile
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..errors import CompileWarning
from . import workers

_KERNELS: dict[str, object] = {}  # key -> Numba dispatcher
_DIRECT: dict[tuple, object] = {}  # (key, signature) -> direct_kernels.compile_kernel's function
_LOCK = threading.Lock()
_COMPILE_LOCK = threading.Lock()  # Numba compiles one function at a time anyway (its global compiler lock)
_HELPERS_HASH: str | None = None
_MODULE_PREFIX = "hx_"


def helpers_hash() -> str:
    """Hash of the helper modules generated kernels call (`kernels/half.py`, `kernels/scalar.py`; `semantics.py`
    defines the xla-cpu approximations scalar.py makes helpers of)."""
    global _HELPERS_HASH
    if _HELPERS_HASH is None:
        h = hashlib.sha256()
        here = Path(__file__).parent
        for name in ("half.py", "scalar.py", "semantics.py"):
            h.update((here / name).read_bytes())
        _HELPERS_HASH = h.hexdigest()[:12]
    return _HELPERS_HASH


def source_key(source: str, prefix: str = "") -> str:
    """The cache key of a generated source: `prefix` and a hash of the source, 24 characters in all."""
    return prefix + hashlib.sha256(source.encode()).hexdigest()[: 24 - len(prefix)]


_PINNED = threading.local()  # the calling thread's cache dir, if pinned (pinned_cache_dir)


def cache_dir() -> Path:
    pinned = getattr(_PINNED, "dir", None)
    if pinned is not None:
        return pinned
    d = os.environ.get("HLOEXEC_CACHE_DIR")
    return Path(d) if d else Path.home() / ".cache" / "hloexec" / "kernels"


@contextmanager
def pinned_cache_dir(directory: Path):
    """Make the calling thread's loads use `directory` meanwhile, whatever $HLOEXEC_CACHE_DIR says by then: a
    background compile finishes in the cache dir its kernels were handed over in (and its workers compiled into)."""
    _PINNED.dir = directory
    try:
        yield
    finally:
        _PINNED.dir = None


def direct_enabled() -> bool:
    """Whether kernels the direct compiler translates skip Numba ($HLOEXEC_DIRECT_KERNELS=0: all through Numba)."""
    return os.environ.get("HLOEXEC_DIRECT_KERNELS", "1") != "0"


def load_kernel(source: str, key: str, signature):
    """The `kernel` function of generated `source` for `signature`: compiled by the direct compiler
    (kernels/direct.py) if it translates the source, from its object file in the cache dir (a worker's, not
    translated again here) or compiled now; else -- or if LLVM fails on it (a CompileWarning) -- a Numba
    dispatcher, from this process's dict, else written to the cache dir (unless the same text is there) and
    imported (compile_signature compiles it)."""
    direct = direct_enabled()
    fn = _DIRECT.get((key, signature)) if direct else None
    if fn is not None:
        return fn
    workers.claim(key)  # a worker compiling it: its object file or Numba's cache entry is on disk after
    if direct:
        fn = _direct_kernel(source, key, signature)
        if fn is not None:
            return fn
    with _LOCK:
        fn = _KERNELS.get(key)
        if fn is not None:
            return fn
        d = cache_dir()
        d.mkdir(parents=True, exist_ok=True)
        if str(d) not in sys.path:
            sys.path.append(str(d))
        modname = _MODULE_PREFIX + key
        path = d / f"{modname}.py"
        if not path.exists() or path.read_text() != source:
            fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{modname}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(source)
                os.replace(tmp, path)  # atomic: another process importing it sees the old or the new text
            except BaseException:  # interrupted (Ctrl-C, SIGTERM in the CLI) or failed: leave no part file
                Path(tmp).unlink(missing_ok=True)
                raise
            importlib.invalidate_caches()
        module = sys.modules.get(modname) or importlib.import_module(modname)
        fn = module.kernel
        _KERNELS[key] = fn
        return fn


def _direct_kernel(source: str, key: str, signature):
    """The direct compiler's function of kernel `key`, or None if it does not translate the source or LLVM fails
    on it (a CompileWarning: it goes through Numba)."""
    from . import direct_kernels

    with _LOCK:
        fn = _DIRECT.get((key, signature))
        if fn is None:
            try:
                fn = _DIRECT[(key, signature)] = direct_kernels.compile_kernel(source, key, signature, cache_dir())
            # (the classes direct_kernels raises: a module imported again -- pytester's in-process runs drop the
            # modules a run imported -- makes new ones, which a fresh import here would name instead)
            except direct_kernels.Untranslatable:
                return None
            except direct_kernels.MachineCodeError as e:
                warnings.warn(f"kernel {key}: {e}; it is compiled through Numba", CompileWarning, stacklevel=3)
                return None
    return fn


def compile_elsewhere(tasks, background: bool = False) -> None:
    """Have worker processes compile `tasks`, (key, source, signature) each, into the disk cache, but for the
    kernels this process has loaded already (kernels/workers.py; `background`: see workers.submit)."""
    tasks = [t for t in tasks if t[0] not in _KERNELS and (t[0], t[2]) not in _DIRECT]
    workers.submit(tasks, cache_dir(), background, direct_enabled())


def array_arg(dtype, ndim: int, readonly: bool) -> tuple:
    """A C-contiguous array argument of a kernel signature (see numba_signature)."""
    return ("array", np.dtype(dtype).name, max(ndim, 1), readonly)


INT64_ARG = ("scalar", "int64")


def numba_signature(signature) -> tuple:
    """The Numba types of a kernel signature given as plain tuples (array_arg, INT64_ARG: picklable without
    importing Numba, so that handing kernels to workers does not import it in the process)."""
    from numba import types
    from numba.np.numpy_support import from_dtype

    return tuple(
        types.Array(from_dtype(np.dtype(arg[1])), arg[2], "C", readonly=arg[3])
        if arg[0] == "array"
        else from_dtype(np.dtype(arg[1]))
        for arg in signature
    )


def compile_signature(fn, signature, lines: int = 0) -> None:
    """Compile dispatcher `fn` for `signature` (numba_signature's plain tuples; operands typed read-only), then
    stop it compiling at call time. `lines`: of its generated source (Numba's SSA pass recurses once per block:
    up to one per line).

    Numba types a read-only array (a constant, a caller's read-only input) apart from a writable one and,
    while it may compile, compiles a second specialisation for it at the call. Compiled for read-only operands
    with compiling disabled, a call with writable ones converts to that signature (a safe conversion) instead:
    one specialisation, whatever the operands' flags. A direct kernel (load_kernel) is compiled already."""
    if not hasattr(fn, "disable_compile"):
        return
    with _COMPILE_LOCK:  # another kernel sharing `fn` (same source) may add its own signature
        fn.disable_compile(False)
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20 * lines))
        try:
            fn.compile(numba_signature(signature))
        finally:
            sys.setrecursionlimit(limit)
            if fn.signatures:  # Numba asserts it has one (which would hide why the compile failed)
                fn.disable_compile()


class GeneratedKernel:
    """A kernel generated as Python source (fusion.py, program.py): its Numba dispatcher loaded from the cache on
    first use and compiled for its one `signature` (which each kind of kernel says)."""

    def __init__(self, source: str, key: str):
        self._fn = None
        self.source = source
        self.key = key
        self.lines = source.count("\n")

    @property
    def fn(self):
        """The compiled function: a direct kernel, or the Numba dispatcher from the generated module (imported,
        and Numba with it, on first use)."""
        if self._fn is None:
            self._fn = load_kernel(self.source, self.key, self.signature)
        return self._fn

    @property
    def signature(self) -> tuple:
        """numba_signature's plain tuples of its arguments."""
        raise NotImplementedError

    @property
    def compile_task(self) -> tuple:
        """What a worker process compiles it from (compile_elsewhere): (key, source, signature)."""
        return self.key, self.source, self.signature

    def compile(self):
        """Compile now (or load from the disk cache): one specialisation, for read-only or writable operands."""
        compile_signature(self.fn, self.signature, self.lines)
        return self


def clear_cache(disk: bool = True):
    """Forget compiled kernels in this process; with `disk`, also delete the on-disk sources and caches."""
    with _LOCK:
        _KERNELS.clear()
        _DIRECT.clear()
        for name in [m for m in sys.modules if m.startswith(_MODULE_PREFIX)]:
            del sys.modules[name]
        if disk:
            d = cache_dir()
            if d.is_dir():
                for pattern in (f"{_MODULE_PREFIX}*.py", f"{_MODULE_PREFIX}*.o", f"{_MODULE_PREFIX}*.untranslatable"):
                    for p in d.glob(pattern):
                        p.unlink(missing_ok=True)
                shutil.rmtree(d / "__pycache__", ignore_errors=True)
        importlib.invalidate_caches()
