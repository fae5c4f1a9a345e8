"""The C declarations the scanner binding uses (mirror csrc/hlo_scan.h), and the generator of
`_scan_ffi.py`: cffi's out-of-line ABI module holding them pre-parsed, so importing hloexec does not
import pycparser and parse C (~35 ms). scan.py checks every struct's size against the library at load.

After changing csrc/hlo_scan.h:  python hloexec/parser/scan_cdef.py   (a file, not -m: the package imports
the module it writes; tests/test_scan.py checks they are in sync)
"""
from __future__ import annotations

from pathlib import Path

CDEF = """
typedef struct { uint64_t off; uint64_t len; } hlo_span;
typedef struct {
  hlo_span name; hlo_span shape; hlo_span opcode; hlo_span args;
  uint32_t operand_begin; uint32_t operand_count;
  uint32_t attr_begin; uint32_t attr_count;
  uint32_t line; uint32_t column; uint32_t flags; int32_t computation;
} hlo_instr;
typedef struct {
  hlo_span name; hlo_span shape; int32_t target; int32_t pad_;
} hlo_operand;
typedef struct { hlo_span key; hlo_span value; } hlo_attr;
typedef struct {
  hlo_span name; hlo_span signature;
  uint32_t instr_begin; uint32_t instr_count;
  uint32_t attr_begin; uint32_t attr_count;
  uint32_t line; uint32_t flags; int32_t root; int32_t module;
} hlo_comp;
typedef struct {
  hlo_span name; hlo_span text; hlo_span preamble;
  uint32_t attr_begin; uint32_t attr_count;
  uint32_t comp_begin; uint32_t comp_count;
  uint32_t line; uint32_t flags; int32_t entry; int32_t pad_;
} hlo_module;
typedef struct {
  hlo_module *modules;  uint64_t n_modules;
  hlo_comp *comps;      uint64_t n_comps;
  hlo_instr *instrs;    uint64_t n_instrs;
  hlo_operand *operands; uint64_t n_operands;
  hlo_attr *attrs;      uint64_t n_attrs;
  int32_t error;
  uint64_t error_offset;
  const char *error_message;
} hlo_tables;
hlo_tables *hlo_scan(const char *buf, uint64_t len, int allow_junk);
void hlo_tables_free(hlo_tables *t);
void free(void *p);
uint64_t hlo_struct_size(int which);
"""

MODULE = Path(__file__).with_name("_scan_ffi.py")


def generate(path: Path = MODULE) -> None:
    """Write the cffi module for CDEF to `path`."""
    from cffi import FFI
    builder = FFI()
    builder.cdef(CDEF)
    builder.set_source("hloexec.parser._scan_ffi", None)
    builder.emit_python_code(str(path))


if __name__ == "__main__":
    generate()
