"""cffi (ABI mode) binding of the C scanner ``csrc/hlo_scan.c``.

``scan(buf, allow_junk=False)`` runs one pass of the C scanner over HLO text
and returns a :class:`ScanTables` of five NumPy structured arrays that take
over the scanner's C tables (freed with the arrays). Rows link to each other
by index; text is referenced by byte spans into ``buf``, so the caller keeps
``buf`` (bytes or mmap) to slice it.

Field naming: every ``hlo_span`` field ``x`` of a C struct becomes two
``uint64`` fields ``x_off`` and ``x_len``; other fields keep their C name and
type (``pad_`` fields are kept and always 0). Tables and their fields (see ``csrc/hlo_scan.h`` for the meaning):

``modules``   name_off/len, text_off/len, preamble_off/len, attr_begin,
              attr_count, comp_begin, comp_count, line, flags
              (``MODULE_HEADER``), entry (comp row or -1), pad_
``comps``     name_off/len, signature_off/len, instr_begin, instr_count,
              attr_begin, attr_count, line, flags (``COMP_ENTRY``),
              root (instr row or -1), module
``instrs``    name_off/len (len 0 when anonymous), shape_off/len (len 0 when
              omitted), opcode_off/len, args_off/len (raw text between the
              parentheses), operand_begin, operand_count, attr_begin,
              attr_count, line, column, flags (``INSTR_ROOT``,
              ``INSTR_ANONYMOUS``, ``INSTR_NO_SHAPE``), computation
``operands``  name_off/len (len 0 for a nested instruction), shape_off/len
              (len 0 if none written), target (instr row, -1 = unknown
              name: report it), pad_
``attrs``     key_off/len, value_off/len

Instruction rows of a computation are contiguous
(``instr_begin .. instr_begin+instr_count``) and in text order, except that
nested operand instructions (``add(f32[] multiply(a, b), c)``) are hoisted
into anonymous rows placed just before their user. ``line``/``column`` are
1-based (column in bytes). ``constant`` and ``parameter`` have no operand
rows; their literal / number is ``args``.

Errors raise :class:`ScanError` with ``code`` (``ERR_*``), byte ``offset``
and a static ``message`` saying what was expected.

``link(buf, tables, call_keys)`` runs the linking pass ``csrc/hlo_link.c``
over those tables (see :class:`Links`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ._scan_ffi import ffi  # the cdef of scan_cdef.py, pre-parsed by cffi (no pycparser at import)
from .clib import open_library

__all__ = [
    "ScanError",
    "ScanTables",
    "scan",
    "Links",
    "link",
    "span_bytes",
    "span_str",
    "INSTR_ROOT",
    "INSTR_ANONYMOUS",
    "INSTR_NO_SHAPE",
    "COMP_ENTRY",
    "MODULE_HEADER",
]


_TABLES = [
    ("modules", "hlo_module"),
    ("comps", "hlo_comp"),
    ("instrs", "hlo_instr"),
    ("operands", "hlo_operand"),
    ("attrs", "hlo_attr"),
]

# HLOEXEC_SCAN_LIBRARY: use another build of the scanner (.ci/sanitize.sh loads an ASan/UBSan one)
lib, LIBRARY_PATH = open_library("hlo_scan", ffi, "HLOEXEC_SCAN_LIBRARY")
try:
    _free = lib.free  # the C runtime's free, reached through the library (what its tables were malloc'd with)
except AttributeError:  # not reachable that way (Windows DLLs): scan() copies the tables instead
    _free = None

# flags and error codes, as csrc/hlo_scan.h defines them
INSTR_ROOT, INSTR_ANONYMOUS, INSTR_NO_SHAPE = lib.HLO_INSTR_ROOT, lib.HLO_INSTR_ANONYMOUS, lib.HLO_INSTR_NO_SHAPE
COMP_ENTRY, MODULE_HEADER = lib.HLO_COMP_ENTRY, lib.HLO_MODULE_HEADER
ERR_SYNTAX, ERR_UNTERMINATED, ERR_TOO_DEEP = lib.HLO_ERR_SYNTAX, lib.HLO_ERR_UNTERMINATED, lib.HLO_ERR_TOO_DEEP
ERR_NO_MEMORY, ERR_DUPLICATE, ERR_TOO_LARGE = lib.HLO_ERR_NO_MEMORY, lib.HLO_ERR_DUPLICATE, lib.HLO_ERR_TOO_LARGE
CALL_BRACED, CALL_INLINE, CALL_UNKNOWN = lib.HLO_CALL_BRACED, lib.HLO_CALL_INLINE, lib.HLO_CALL_UNKNOWN

for _name in ("span", "instr", "operand", "attr", "comp", "module", "tables", "call", "links"):
    _c, _py = lib.hlo_struct_size(getattr(lib, f"HLO_STRUCT_{_name.upper()}")), ffi.sizeof(f"hlo_{_name}")
    if _c != _py:
        raise ImportError(
            f"{LIBRARY_PATH}: sizeof(hlo_{_name}) is {_c} in C but {_py} in hloexec/parser/_scan_ffi.py; "
            "rebuild the library, or regenerate the module (python hloexec/parser/scan_cdef.py)"
        )


def _dtype(cname: str) -> np.dtype:
    """NumPy dtype with the C layout of struct `cname` (spans split in _off/_len)."""
    names: list[str] = []
    formats: list[type[np.generic]] = []
    offsets: list[int] = []
    span_off = ffi.offsetof("hlo_span", "off")
    span_len = ffi.offsetof("hlo_span", "len")
    for fname, f in ffi.typeof(cname).fields:
        t = f.type
        if t.kind == "struct":
            assert t.cname == "hlo_span", t.cname
            names += [fname + "_off", fname + "_len"]
            formats += [np.uint64, np.uint64]
            offsets += [f.offset + span_off, f.offset + span_len]
        else:
            names.append(fname)
            integers: dict[str, type[np.generic]] = {"uint32_t": np.uint32, "int32_t": np.int32, "uint64_t": np.uint64}
            formats.append(integers[t.cname])
            offsets.append(f.offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": ffi.sizeof(cname)})


DTYPES: dict[str, np.dtype] = {tab: _dtype(c) for tab, c in _TABLES}
CALL_DTYPE = _dtype("hlo_call")


class ScanError(Exception):
    """The C scanner rejected the text: `code` (ERR_*), byte `offset`, `message`."""

    def __init__(self, code: int, offset: int, message: str):
        super().__init__(f"{message} (at byte {offset}, code {code})")
        self.code = code
        self.offset = offset
        self.message = message


@dataclass(frozen=True, slots=True)
class ScanTables:
    """Structured arrays (see the module docstring for the fields)."""

    modules: np.ndarray
    comps: np.ndarray
    instrs: np.ndarray
    operands: np.ndarray
    attrs: np.ndarray


def scan(buf, allow_junk: bool = False) -> ScanTables:
    """Scan HLO text in `buf` (bytes, bytearray, memoryview or mmap)."""
    if isinstance(buf, str):
        raise TypeError("scan() takes bytes or a buffer, not str; encode it as UTF-8")
    cbuf = ffi.from_buffer(buf)
    n = len(cbuf)
    t = lib.hlo_scan(cbuf, n, 1 if allow_junk else 0)
    if t == ffi.NULL:
        raise MemoryError("hlo_scan: out of memory")
    try:
        if t.error:
            msg = ffi.string(t.error_message).decode() if t.error_message != ffi.NULL else "scan error"
            raise ScanError(int(t.error), int(t.error_offset), msg)
        out = {}
        for tab, cname in _TABLES:
            count = int(getattr(t, "n_" + tab))
            dt = DTYPES[tab]
            if count == 0:
                out[tab] = np.zeros(0, dtype=dt)
            else:
                size = count * dt.itemsize
                if _free is None:
                    out[tab] = np.frombuffer(ffi.buffer(getattr(t, tab), size), dtype=dt).copy()
                else:  # the array takes the C table over: no copy (a 1 GB dump's tables are ~0.7 GB)
                    owned = ffi.gc(getattr(t, tab), _free, size)
                    setattr(t, tab, ffi.NULL)
                    out[tab] = np.frombuffer(ffi.buffer(owned, size), dtype=dt)
        return ScanTables(**out)
    finally:
        lib.hlo_tables_free(t)
        del cbuf


def span_bytes(buf, off, length) -> bytes:
    """buf[off:off+len] as bytes (for spans from the tables)."""
    off = int(off)
    return bytes(buf[off : off + int(length)])


def span_str(buf, off, length) -> str:
    """buf[off:off+len] decoded as UTF-8 (invalid bytes replaced)."""
    return span_bytes(buf, off, length).decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Links:
    """What `link` found (see "Linking" in csrc/hlo_scan.h): per instruction `opcode_ids` and `shape_ids`
    (-1: no written shape, or recv-done), the first row of each id (`opcode_first`, `shape_first`), the first
    bad operand row and its instruction, the first bad parameter row (each -1 if none), and `calls`
    (structured, fields of hlo_call) with the computation rows they name in `call_targets`."""

    opcode_ids: np.ndarray
    opcode_first: np.ndarray
    shape_ids: np.ndarray
    shape_first: np.ndarray
    bad_operand: int
    bad_operand_owner: int
    bad_parameter: int
    calls: np.ndarray
    call_targets: np.ndarray


def _rows(table: np.ndarray, ctype: str) -> tuple:
    """(pointer to the first row, row count) of a table for C."""
    return (ffi.cast(ctype, ffi.from_buffer(table)) if len(table) else ffi.NULL), len(table)


@functools.lru_cache(maxsize=8)
def _c_strings(strings: tuple[str, ...]) -> tuple:
    """(C array of the strings, the strings): the array does not keep its items alive, the tuple does."""
    items = [ffi.new("char[]", s.encode()) for s in strings]
    return ffi.new("char *[]", items), items


def link(buf, tables: ScanTables, call_keys: tuple[str, ...]) -> Links:
    """Intern opcodes and shapes, check operands and parameter numbers, and resolve the attributes with a key
    in `call_keys` to computation rows, over the tables `scan(buf)` made (in C, row by row)."""
    cbuf = ffi.from_buffer(buf)
    ct = ffi.new("hlo_tables *")
    ct.modules, ct.n_modules = _rows(tables.modules, "hlo_module *")
    ct.comps, ct.n_comps = _rows(tables.comps, "hlo_comp *")
    ct.instrs, ct.n_instrs = _rows(tables.instrs, "hlo_instr *")
    ct.operands, ct.n_operands = _rows(tables.operands, "hlo_operand *")
    ct.attrs, ct.n_attrs = _rows(tables.attrs, "hlo_attr *")
    keys, _ = _c_strings(call_keys)
    n = len(tables.instrs)
    ids, first = np.empty((2, n), np.int32), np.empty((2, n), np.int32)  # opcode's, shape's
    ids_out, first_out = (ffi.cast("int32_t *", ffi.from_buffer(a)) if n else ffi.NULL for a in (ids, first))
    links = lib.hlo_link(cbuf, len(cbuf), ct, keys, len(call_keys), ids_out, first_out, ids_out + n, first_out + n)
    if links == ffi.NULL:
        raise MemoryError("hlo_link: out of memory")
    try:
        if links.error:
            raise (
                MemoryError("hlo_link: out of memory")
                if links.error == ERR_NO_MEMORY
                else ScanError(int(links.error), 0, "a table would exceed 2^31 rows")
            )
        calls = (
            np.frombuffer(ffi.buffer(links.calls, links.n_calls * CALL_DTYPE.itemsize), CALL_DTYPE).copy()
            if links.n_calls
            else np.zeros(0, CALL_DTYPE)
        )
        targets = (
            np.frombuffer(ffi.buffer(links.call_targets, links.n_call_targets * 4), np.int32).copy()
            if links.n_call_targets
            else np.zeros(0, np.int32)
        )
        return Links(
            ids[0],
            first[0, : links.n_opcodes].copy(),
            ids[1],
            first[1, : links.n_shapes].copy(),
            int(links.bad_operand),
            int(links.bad_operand_owner),
            int(links.bad_parameter),
            calls,
            targets,
        )
    finally:
        lib.hlo_links_free(links)
        del cbuf
