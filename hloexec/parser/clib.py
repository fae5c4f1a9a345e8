"""The package's C libraries (built by CMakeLists.txt into the package directory: the scanner `hlo_scan`, the
thread pool's spin wait `hlo_spin`), found and opened with cffi in ABI mode: the one loader of C code."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def library_candidates(stem: str) -> list[Path]:
    """Where the built library `stem` (e.g. "hlo_scan") may be: next to the package (wheel install), in another
    entry of the package path (scikit-build-core editable), or in the installed distribution when the source tree
    shadows it (`import hloexec` from a checkout's root after `pip install .`: the sources have no built library)."""
    hloexec = sys.modules[__name__.partition(".")[0]]  # the package, imported before any module of it
    names = {
        "linux": [f"lib{stem}.so"],
        "darwin": [f"lib{stem}.dylib", f"lib{stem}.so"],
        "win32": [f"{stem}.dll", f"lib{stem}.dll"],
    }.get(sys.platform, [f"lib{stem}.so"])
    dirs: list[Path] = []
    file = getattr(hloexec, "__file__", None)
    if file:
        dirs.append(Path(file).parent)
    dirs += [Path(d) for d in getattr(hloexec, "__path__", [])]
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dirs.append(Path(str(distribution("hloexec").locate_file("hloexec"))))
    except (PackageNotFoundError, ValueError):
        pass
    dirs = list(dict.fromkeys(dirs))
    return [d / n for d in dirs for n in names]


def open_library(stem: str, ffi, override_variable: str | None = None):
    """(the library opened with `ffi`, its path); ImportError naming the places looked at when it is not built.
    `override_variable`: an environment variable that may name another build to use instead."""
    override = os.environ.get(override_variable) if override_variable else None
    tried = [Path(override)] if override else library_candidates(stem)
    for path in tried:
        if path.is_file():
            return ffi.dlopen(str(path)), path
    raise ImportError(
        f"hloexec's C library {stem} not found (looked for {', '.join(map(str, tried))}); build it "
        "with `pip install --no-build-isolation -e .` or `pip install .`"
    )
