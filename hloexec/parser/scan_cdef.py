"""The generator of the cffi modules of hloexec's C libraries (`parser/_scan_ffi.py` for csrc/hlo_scan.h,
`kernels/_spin_ffi.py` for csrc/spin_wait.h): cffi's out-of-line ABI modules holding a header's declarations
pre-parsed, so importing hloexec neither imports pycparser nor parses C (~35 ms), and each header stays the one
place its structs, flags, error codes and functions are written. scan.py checks every struct's size against
the library at load; parser/clib.py opens the libraries.

After changing a header:  python hloexec/parser/scan_cdef.py   (a file, not -m: the package imports
the modules it writes; tests/test_scan.py checks they are in sync)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

CSRC = Path(__file__).resolve().parents[2] / "csrc"
PACKAGE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Binding:
    """A header of csrc/ and the cffi module generated from it (`extra`: declarations the header lacks)."""

    header: str
    module: str
    extra: str = ""

    @property
    def path(self) -> Path:
        """The generated module's file in the package."""
        return PACKAGE.joinpath(*self.module.split(".")[1:]).with_suffix(".py")


BINDINGS = (
    # the C runtime's free: scan.py frees the tables' arrays with it
    Binding("hlo_scan.h", "hloexec.parser._scan_ffi", extra="void free(void *p);"),
    Binding("spin_wait.h", "hloexec.kernels._spin_ffi"),
)


def cdef(binding: Binding, csrc: Path = CSRC) -> str:
    """The header as cffi declarations: preprocessor lines dropped except integer #defines, plus `extra`."""
    lines = [
        line
        for line in (csrc / binding.header).read_text().splitlines()
        if not line.startswith("#") or re.match(r"#define \w+ \d+\b", line)
    ]
    return "\n".join(lines) + "\n" + binding.extra + "\n"


def generate(binding: Binding, path: Path | None = None, csrc: Path = CSRC) -> None:
    """Write the cffi module of `binding`'s header (in `csrc`) to `path` (default: the package's)."""
    from cffi import FFI

    builder = FFI()
    builder.cdef(cdef(binding, csrc))
    builder.set_source(binding.module, None)
    builder.emit_python_code(str(path or binding.path))


if __name__ == "__main__":
    for b in BINDINGS:
        generate(b)
