"""The generator of `_scan_ffi.py`: cffi's out-of-line ABI module holding csrc/hlo_scan.h's declarations
pre-parsed, so importing hloexec neither imports pycparser nor parses C (~35 ms), and the header stays
the one place the structs, flags and error codes are written. scan.py checks every struct's size
against the library at load.

After changing csrc/hlo_scan.h:  python hloexec/parser/scan_cdef.py   (a file, not -m: the package imports
the module it writes; tests/test_scan.py checks they are in sync)
"""
from __future__ import annotations

import re
from pathlib import Path

HEADER = Path(__file__).resolve().parents[2] / "csrc" / "hlo_scan.h"
MODULE = Path(__file__).with_name("_scan_ffi.py")


def cdef(header: Path = HEADER) -> str:
    """The header as cffi declarations: preprocessor lines dropped except integer #defines, plus the C
    runtime's free (scan.py frees the tables' arrays with it)."""
    lines = [line for line in header.read_text().splitlines()
             if not line.startswith("#") or re.match(r"#define \w+ \d+\b", line)]
    return "\n".join(lines) + "\nvoid free(void *p);\n"


def generate(path: Path = MODULE, header: Path = HEADER) -> None:
    """Write the cffi module for the header's declarations to `path`."""
    from cffi import FFI
    builder = FFI()
    builder.cdef(cdef(header))
    builder.set_source("hloexec.parser._scan_ffi", None)
    builder.emit_python_code(str(path))


if __name__ == "__main__":
    generate()
