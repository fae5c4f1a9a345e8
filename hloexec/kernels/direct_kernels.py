"""The direct compiler's kernels (kernels/direct.py translates, kernels/machine_code.py compiles and loads):
each named by its source's key, its signature and what its machine code depends on, its object file in the
kernel cache dir, loaded once per process.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from pathlib import Path

from ..errors import CompileWarning
from .direct import Untranslatable, translate
from .machine_code import MachineCodeError, llvm_engine, load_object, loaded, object_code, object_layout


def _identity() -> str:
    """What an object file depends on besides its source and signature: the translator, how machine code is
    made, LLVM, the CPU."""
    if not _IDENTITY:
        import llvmlite.binding as llvm

        llvm_engine()
        h = hashlib.sha256()
        for module in ("direct.py", "machine_code.py", "direct_kernels.py"):
            h.update((Path(__file__).parent / module).read_bytes())
        h.update(
            repr(
                (
                    llvm.llvm_version_info,
                    llvm.get_host_cpu_name(),
                    llvm.get_host_cpu_features().flatten(),
                    object_layout(),
                )
            ).encode()
        )
        _IDENTITY.append(h.hexdigest())
    return _IDENTITY[0]


_IDENTITY: list = []


def object_name(key: str, signature) -> str:
    """The function's (and its object file's) name for kernel `key` compiled for `signature`."""
    return f"hx_{key}_" + hashlib.sha256(repr((signature, _identity())).encode()).hexdigest()[:12]


_TRANSLATIONS: dict = {}  # (key, signature) -> LLVM IR text (until compiled), or why it is not taken


def translation(source: str, key: str, signature, directory: Path | None = None) -> str:
    """translate's IR of kernel `key` for `signature`, made once (raises Untranslatable, every time). With a cache
    `directory`, a source found untranslatable is marked there, and a marked one is not parsed again: a compile
    worker's verdict reaches the process without an ast.parse in its background thread (CPython 3.11's ast.parse
    fails, "AST constructor recursion depth mismatch", when two threads parse at once)."""
    got = _TRANSLATIONS.get((key, signature))
    marker = None if directory is None else directory / f"{object_name(key, signature)}.untranslatable"
    if got is None and marker is not None and marker.exists():
        got = Untranslatable(marker.read_text(errors="replace"))
    if got is None:
        try:
            got = translate(source, signature, object_name(key, signature))
        except Untranslatable as e:
            got = e
            if marker is not None:
                try:
                    _write_atomically(marker, str(e).encode())
                except OSError:
                    pass  # (a cache dir it cannot write: parsed again next time)
        except Exception as e:  # noqa: BLE001 - a translator bug costs the kernel Numba's compile time, said once
            got = Untranslatable(f"the direct compiler failed ({type(e).__name__}: {e})")
            warnings.warn(f"kernel {key}: {got}; it is compiled through Numba", CompileWarning, stacklevel=2)
        _TRANSLATIONS[(key, signature)] = got
    if isinstance(got, Untranslatable):
        raise Untranslatable(str(got))
    return got


def translates(source: str, key: str, signature) -> bool:
    """Whether compile_kernel takes kernel `key` (compiled or not yet)."""
    if loaded(object_name(key, signature)) is not None:
        return True
    try:
        translation(source, key, signature)
    except Untranslatable:
        return False
    return True


def compile_kernel(source: str, key: str, signature, directory: Path):
    """Kernel `key` (generated `source`) for `signature`, from its object file in `directory` or translated and
    compiled now and written there (atomically: renamed into place). Raises Untranslatable, or MachineCodeError
    if LLVM fails to make or load it (a cache entry it cannot load is made again first); translates is False
    for the kernel from then on."""
    name = object_name(key, signature)
    if loaded(name) is not None:
        return loaded(name)
    path = directory / f"{name}.o"
    try:
        try:
            return load_object(path.read_bytes(), name)
        except OSError:
            pass
        except MachineCodeError:
            path.unlink(missing_ok=True)  # damaged, or made by another build: made again
        return load_object(_compile_into(path, translation(source, key, signature, directory)), name)
    except MachineCodeError as e:
        _TRANSLATIONS[(key, signature)] = Untranslatable(str(e))
        raise
    finally:
        if isinstance(_TRANSLATIONS.get((key, signature)), str):
            del _TRANSLATIONS[(key, signature)]  # compiled: its IR is not needed again


def _compile_into(path: Path, ir_text: str) -> bytes:
    """The object file of `ir_text`, written to `path` too."""
    code = object_code(ir_text)
    _write_atomically(path, code)
    return code


def _write_atomically(path: Path, data: bytes) -> None:
    """`data` into `path`, renamed into place: another process reads the whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
