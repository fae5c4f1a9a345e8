"""Text -> IR: run the C scanner, check its tables column by column, hand out Modules that build lazily.

The scanner has already split the text into instructions, operands and attributes and resolved operand
names. `parse` checks, over whole columns with numpy, what the scanner could not (shape text, operands
defined before use, parameter numbers, called computations, omitted shapes), so bad text fails inside
`parse` with one HloParseError naming file:line:col. Instruction objects are made per computation on
first use (`InstructionTables.build`) from the same tables, linked exactly as if made here.
"""
from __future__ import annotations

import gc
import mmap
import os
import re
from bisect import bisect_left

import numpy as np

from ..errors import HloParseError
from ..ir.attributes import AttributeSyntaxError, decode_attribute
from ..ir.module import COMPUTATION_ATTRS, AttrTable, Computation, Instruction, Module, TextSpan
from ..ir.shape import Shape, ShapeSyntaxError, parse_shape, tuple_shape
from ..ir.shape_inference import ShapeInferenceError, infer_shape
from .scan import INSTR_ANONYMOUS, INSTR_NO_SHAPE, INSTR_ROOT, COMP_ENTRY, MODULE_HEADER, ScanError, scan

TOKEN = parse_shape("token[]")
# A constant's literal longer than this stays a span of the buffer until decoded (see TextSpan).
_SPAN_ARGS_OVER = 4096
# A one-line string naming a file (no HLO punctuation, a dump's suffix) that does not exist is a mistake,
# not HLO text: say so rather than "no HLO module found".
_LOOKS_LIKE_A_PATH = re.compile(r"[^\n{}()=%]+\.(?:hlo|txt|mlir|pbtxt)\s*")
_HLO_START = re.compile(rb"\A(?:\s|//[^\n]*\n|/\*.*?\*/)*(?:HloModule\b|ENTRY\b|%?[\w.\-]+\s*[({])", re.S)


class Source:
    """The bytes being parsed (a memory-mapped file or encoded text) and how to point into them."""

    def __init__(self, source, path: str | None = None):
        self._mmap = None
        if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source
                                                 and len(source) < 4096 and os.path.isfile(source)):
            self.path = str(source)
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    self.buf = b""
                else:
                    self._mmap = self.buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        elif isinstance(source, str) and _LOOKS_LIKE_A_PATH.fullmatch(source):
            raise FileNotFoundError(f"no such file: {source}")
        else:
            self.path = path
            self.buf = source.encode("utf-8", "surrogateescape") if isinstance(source, str) else bytes(source)

    def text(self, off: int, length: int) -> str:
        return self.buf[off:off + length].decode("utf-8", "replace")

    def position(self, offset: int) -> tuple[int, int, str]:
        """(line, column, line text) of a byte offset, all 1-based."""
        offset = max(0, min(offset, len(self.buf)))
        line_start = self.buf.rfind(b"\n", 0, offset) + 1
        line_end = self.buf.find(b"\n", offset)
        if line_end < 0:
            line_end = len(self.buf)
        line = self.buf[:line_start].count(b"\n") + 1
        shown = self.buf[line_start:min(line_end, line_start + 100_000)]
        return line, offset - line_start + 1, shown.decode("utf-8", "replace")

    def error(self, message: str, offset: int) -> HloParseError:
        line, column, line_text = self.position(offset)
        return HloParseError(message, path=self.path, line=line, column=column, line_text=line_text)


def parse(source, *, path: str | None = None) -> list[Module]:
    """All modules in a file path or HLO text (a path is memory-mapped, not read into a string)."""
    src = Source(source, path)
    if len(src.buf) == 0:
        raise src.error("empty input: no HLO module or computation found", 0)
    try:
        tables = scan(src.buf, allow_junk=False)
    except ScanError as strict:
        # A module inside a log: skip what is not HLO, unless the text starts as HLO (then the error is real).
        if _HLO_START.match(src.buf[:65536]):
            raise src.error(strict.message, strict.offset) from None
        try:
            tables = scan(src.buf, allow_junk=True)
        except ScanError as e:
            raise src.error(e.message, e.offset) from None
    if len(tables.modules) == 0:
        raise src.error("no HLO module or computation found", 0)
    builder = Builder(src, tables)
    del tables          # the builder drops what it no longer needs
    return builder.modules()


def _is_parameter_number(args: str) -> bool:
    number = args.strip()
    return number.isascii() and number.isdigit() and len(number) <= 19 and int(number) < 1 << 63


# -- spans of text as numpy columns -----------------------------------------------------------------
_BYTE_MASKS = np.array([(1 << 8 * k) - 1 for k in range(9)], dtype=np.uint64)   # the low k bytes
_SPAN_WORDS = 4      # spans up to 32 bytes are compared as words; longer ones (a few tuple shapes) as bytes
_CHUNK_ROWS = 1 << 19   # rows per numpy pass over a column: bounds the temporaries for a GB dump
_MIX = np.uint64(0x9E3779B97F4A7C15)
_COMPUTATION_ATTR_KEYS = {key.encode(): key for key in COMPUTATION_ATTRS}


def span_words(buf, off: np.ndarray, length: np.ndarray, nwords: int) -> list[np.ndarray]:
    """Bytes 8k..8k+7 of every span buf[off:off+length] as a little-endian uint64 (zero past the span)."""
    if len(buf) < 8:
        buf = bytes(buf) + bytes(8)
    last = len(buf) - 8
    at = np.ndarray((last + 1,), dtype="<u8", buffer=buf, strides=(1,))   # the 8 bytes from each offset
    near_end = len(off) and int(off.max()) + 8 * (nwords - 1) > last
    words = []
    for k in range(nwords):
        start = off + 8 * k
        if near_end:       # read from earlier and shift the span's bytes down
            clipped = np.minimum(start, last)
            word = at[clipped] >> (np.minimum(start - clipped, 7) * 8).astype(np.uint64)
        else:
            word = at[start]
        words.append(word & _BYTE_MASKS[np.clip(length - 8 * k, 0, 8)])
    return words


def intern_spans(buf, off: np.ndarray, length: np.ndarray, rows: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(id of every span, first row of every id) of the spans buf[off:off+length] (of `rows`, else all):
    spans with equal bytes, and only those, share an id. Works in chunks of rows to bound its memory."""
    n = len(off) if rows is None else len(rows)
    if n <= _CHUNK_ROWS:
        if rows is not None:
            off, length = off[rows], length[rows]
        return _intern_chunk(buf, off, length)
    ids = np.empty(n, np.int32)
    firsts: list[int] = []
    seen: dict[bytes, int] = {}          # text of each span found so far -> its id
    for lo in range(0, n, _CHUNK_ROWS):
        chunk = slice(lo, lo + _CHUNK_ROWS) if rows is None else rows[lo:lo + _CHUNK_ROWS]
        chunk_off, chunk_len = off[chunk], length[chunk]
        chunk_ids, chunk_first = _intern_chunk(buf, chunk_off, chunk_len)
        to_global = np.empty(len(chunk_first), np.int32)
        for i, (r, o, k) in enumerate(zip(chunk_first.tolist(), chunk_off[chunk_first].tolist(),
                                          chunk_len[chunk_first].tolist())):
            raw = buf[o:o + k]
            g = seen.get(raw)
            if g is None:
                g = seen[raw] = len(firsts)
                firsts.append(lo + r)
            to_global[i] = g
        ids[lo:lo + len(chunk_ids)] = to_global[chunk_ids]
    return ids, np.array(firsts, np.int64)


def _intern_chunk(buf, off: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    off, length = off.astype(np.int64), length.astype(np.int64)
    ids = np.empty(len(off), np.int32)
    short = np.flatnonzero(length <= 8 * _SPAN_WORDS)
    first = np.zeros(0, np.int64)
    if len(short):
        s_len = length[short]
        words = span_words(buf, off[short], s_len, max(1, -(-int(s_len.max()) // 8)))
        key = s_len.astype(np.uint64)
        for word in words:
            key = (key ^ word) * _MIX
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        same = first[inverse]
        if not (np.array_equal(s_len[same], s_len) and all(np.array_equal(w[same], w) for w in words)):
            # two texts with one key: unique over the words themselves
            _, first, inverse = np.unique(np.stack([s_len.astype(np.uint64), *words], axis=1), axis=0,
                                          return_index=True, return_inverse=True)
        ids[short] = inverse.reshape(-1)
        first = short[first]
    long_rows = np.flatnonzero(length > 8 * _SPAN_WORDS)
    if len(long_rows):
        seen: dict[bytes, int] = {}
        extra = []
        for r, o, n in zip(long_rows.tolist(), off[long_rows].tolist(), length[long_rows].tolist()):
            raw = buf[o:o + n]
            i = seen.get(raw)
            if i is None:
                i = seen[raw] = len(first) + len(extra)
                extra.append(r)
            ids[r] = i
        first = np.concatenate([first, np.array(extra, np.int64)])
    return ids, first


def instruction_rows(comps: np.ndarray, comp_rows: list[int]) -> slice | np.ndarray:
    """Instruction rows of some computation rows: a slice when they are one run (a whole module)."""
    begin = comps["instr_begin"][comp_rows].astype(np.int64)
    end = begin + comps["instr_count"][comp_rows]
    if np.array_equal(begin[1:], end[:-1]):
        return slice(int(begin[0]), int(end[-1])) if len(begin) else slice(0, 0)
    count = end - begin
    return np.repeat(begin - (np.cumsum(count) - count), count) + np.arange(int(count.sum()))


# -- the lazily built IR ------------------------------------------------------------------------------
class InstructionTables:
    """What a parsed computation builds its Instruction objects from (see Computation), and counts over.

    The scanner's instruction and computation tables, the buffer their spans point into, the operand
    targets, and per instruction an opcode id (into `opcodes`) and a shape id (into `shapes`); operand
    rows are in instruction order (the scanner appends an instruction's operands with it)."""

    def __init__(self, buf, instrs: np.ndarray, comps: np.ndarray, targets: np.ndarray, opcode_ids: np.ndarray,
                 opcodes: list[str], shape_ids: np.ndarray, shapes: list[Shape], attr_table: AttrTable):
        self.buf, self.instrs, self.comps, self.targets = buf, instrs, comps, targets
        self.opcode_ids, self.opcodes, self.shape_ids, self.shapes = opcode_ids, opcodes, shape_ids, shapes
        self.attr_table = attr_table
        self.with_args = {i for i, op in enumerate(opcodes) if op in ("constant", "parameter")}
        self.anonymous = np.flatnonzero(instrs["flags"] & INSTR_ANONYMOUS)
        self._columns = (0, [[]], 0, [])
        self.called_owners: list[int] = []                   # instruction row of each entry of `called`
        self.called: list[tuple[int, str, Computation | list[Computation]]] = []   # (row, attr key, value)

    def instruction_count(self, row: int) -> int:
        return int(self.comps["instr_count"][row])

    def signature(self, row: int) -> str:
        off, length = self.comps[["signature_off", "signature_len"]][row].item()
        return self.buf[off:off + length].decode("utf-8", "replace")

    def name(self, row: int) -> str:
        """The name of instruction `row` (`<opcode>.anonN` for the N-th nested one of the text)."""
        off, length, flags = self.instrs[["name_off", "name_len", "flags"]][row].item()
        if flags & INSTR_ANONYMOUS:
            return f"{self.opcode(row)}.anon{int(np.searchsorted(self.anonymous, row)) + 1}"
        return self.buf[off:off + length].decode("utf-8", "replace")

    def opcode(self, row: int) -> str:
        return self.opcodes[self.opcode_ids[row]]

    def opcode_counts(self, comp_rows: list[int]) -> dict[str, int]:
        counts = np.bincount(self.opcode_ids[instruction_rows(self.comps, comp_rows)], minlength=len(self.opcodes))
        out: dict[str, int] = {}
        for opcode, n in zip(self.opcodes, counts.tolist()):
            if n:    # two byte strings may decode to one name
                out[opcode] = out.get(opcode, 0) + n
        return out

    def shape_counts(self, comp_rows: list[int]) -> dict[Shape, int]:
        counts = np.bincount(self.shape_ids[instruction_rows(self.comps, comp_rows)], minlength=len(self.shapes))
        out: dict[Shape, int] = {}
        for shape, n in zip(self.shapes, counts.tolist()):
            if n:
                out[shape] = out.get(shape, 0) + n
        return out

    def columns(self, begin: int, end: int) -> tuple[int, list[list], int, list[int]]:
        """Python lists of the instruction columns from row `begin` on: (first row, columns, first operand
        row, operand targets). Kept for the next call: computations are mostly built in text order."""
        lo, cols, first_operand, targets = self._columns
        if not lo <= begin <= end <= lo + len(cols[0]):
            ins, lo = self.instrs, begin
            hi = max(end, min(len(ins), begin + _COLUMN_ROWS))
            cols = [ins[field][lo:hi].tolist() for field in _BUILD_FIELDS]
            cols += [self.opcode_ids[lo:hi].tolist(), self.shape_ids[lo:hi].tolist()]
            first_operand = int(ins["operand_begin"][lo])
            targets = self.targets[first_operand:int(ins["operand_begin"][hi - 1] + ins["operand_count"][hi - 1])].tolist()
            self._columns = lo, cols, first_operand, targets
        return self._columns

    def build(self, comp: Computation, row: int) -> tuple[list[Instruction], Instruction]:
        """The Instruction objects of computation `row`, linked (operands, users, called), and its root."""
        # ~4 linked objects per instruction: collections while making them would rescan all made so far
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._build(comp, row)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _build(self, comp: Computation, row: int) -> tuple[list[Instruction], Instruction]:
        _, _, _, _, begin, count, _, _, _, _, root, _ = self.comps[row].item()
        end = begin + count
        lo, cols, first_operand, targets = self.columns(begin, end)
        buf, opcodes, shapes, with_args, attr_table = self.buf, self.opcodes, self.shapes, self.with_args, self.attr_table
        anonymous = int(np.searchsorted(self.anonymous, begin)) if len(self.anonymous) else 0
        insts: list[Instruction] = []
        append = insts.append
        for no, nl, ao, al, ob, oc, ab, ac, line, column, flags, op, sh in zip(
                *(col[begin - lo:end - lo] for col in cols)):
            if oc:
                ob -= first_operand
                operands = [insts[t - begin] for t in targets[ob:ob + oc]]
            else:
                operands = []
            if flags & INSTR_ANONYMOUS:
                anonymous += 1
                name = f"{opcodes[op]}.anon{anonymous}"
            else:
                name = buf[no:no + nl].decode("utf-8", "replace")
            if op not in with_args:
                args = ""
            elif al > _SPAN_ARGS_OVER:
                args = TextSpan(buf, ao, al)
            else:
                args = buf[ao:ao + al].decode("utf-8", "replace")
            inst = Instruction(name, opcodes[op], shapes[sh], operands, None if ac else {}, args,
                               line, column, (attr_table, ab, ac) if ac else None)
            inst.computation = comp
            if flags & INSTR_ROOT:
                inst.is_root = True
            for o in operands:
                o.users.append(inst)
            append(inst)
        called = self.called
        for i in range(bisect_left(self.called_owners, begin), bisect_left(self.called_owners, end)):
            owner, key, value = called[i]
            insts[owner - begin].called[key] = value
        root = insts[root - begin] if root >= 0 else insts[-1]
        root.is_root = True
        return insts, root


_BUILD_FIELDS = ("name_off", "name_len", "args_off", "args_len", "operand_begin", "operand_count", "attr_begin",
                 "attr_count", "line", "column", "flags")
_COLUMN_ROWS = 4096      # instruction rows turned into Python lists at once when building computations


# -- checking the tables ------------------------------------------------------------------------------
class Builder:
    """Checks the scanner's tables of one text and makes its Modules, whose computations build lazily."""

    def __init__(self, src: Source, tables):
        self.src = src
        self.buf = src.buf
        # the scanner's tables, one by one: the operand table (~1/5 of the text's size) goes after the checks
        self.module_rows, self.comp_rows, self.instr_rows = tables.modules, tables.comps, tables.instrs
        self.operand_rows, self.attr_rows = tables.operands, tables.attrs
        self.shapes: dict[bytes, Shape] = {}
        self.attr_table = AttrTable(self.buf, tables.attrs, src.error)

    def shape(self, off: int, length: int) -> Shape:
        raw = self.buf[off:off + length]
        shape = self.shapes.get(raw)
        if shape is None:
            try:
                shape = self.shapes[raw] = parse_shape(raw.decode("utf-8", "replace"))
            except ShapeSyntaxError as e:
                raise self.src.error(str(e), off + e.offset) from None
        return shape

    def attrs(self, begin: int, count: int) -> dict[str, str]:
        return self.attr_table.to_dict(begin, count)

    def modules(self) -> list[Module]:
        tables = self.instruction_tables()
        comps = self.computations(tables)
        self.link_called(tables, comps)
        modules = []
        for row in self.module_rows:
            mcomps = comps[row["comp_begin"]:row["comp_begin"] + row["comp_count"]]
            if not mcomps:
                raise self.src.error("module has no computations", int(row["text_off"]))
            entry = comps[row["entry"]] if row["entry"] >= 0 else mcomps[-1]
            has_header = bool(row["flags"] & MODULE_HEADER)
            name = self.src.text(int(row["name_off"]), int(row["name_len"])) if has_header else entry.name
            module = Module(name, mcomps, entry, attrs=self.attrs(int(row["attr_begin"]), int(row["attr_count"])),
                            has_header=has_header, line=int(row["line"]), path=self.src.path,
                            stack_frames=self.stack_frames(int(row["preamble_off"]), int(row["preamble_len"])))
            entry.is_entry = True
            modules.append(module)
        for module in modules:
            self.insert_inline_computations(module)
        return modules

    def instruction_tables(self) -> InstructionTables:
        """Opcode and shape ids of every instruction, after checking all an Instruction will need.

        Of several problems, the one met first reading the text is reported: the earliest instruction,
        and in one instruction its operands, then its shape, then its parameter number."""
        ins, buf = self.instr_rows, self.buf
        problems: list[tuple[int, int, HloParseError]] = []      # (instruction row, rank in the row, error)
        targets = self.operand_rows["target"].copy()
        owners = np.repeat(np.arange(len(ins), dtype=np.int32), ins["operand_count"])
        bad = np.flatnonzero((targets < 0) | (targets >= owners))
        if len(bad):
            problems.append((int(owners[bad[0]]), 0, self.unknown_operand(int(bad[0]))))
        del owners, bad
        self.operand_rows = None

        opcode_ids, first = intern_spans(buf, ins["opcode_off"], ins["opcode_len"])
        opcodes = [self.src.text(o, n) for o, n in ins[["opcode_off", "opcode_len"]][first].tolist()]
        opcode_id = {name: i for i, name in enumerate(opcodes)}

        # written shapes: each distinct text parsed once
        written = (ins["flags"] & INSTR_NO_SHAPE) == 0
        if "recv-done" in opcode_id:     # XLA's parser builds recv-done from its operand: decided below
            written &= opcode_ids != opcode_id["recv-done"]
        written = np.flatnonzero(written)
        shape_ids = np.full(len(ins), -1, np.int32)
        ids, first = intern_spans(buf, ins["shape_off"], ins["shape_len"], written)
        shape_ids[written] = ids
        first = written[first]
        del written, ids
        shapes = []
        for row, (off, length) in zip(first.tolist(), ins[["shape_off", "shape_len"]][first].tolist()):
            try:
                shapes.append(self.shape(off, length))
            except HloParseError as e:
                shapes.append(None)
                problems.append((row, 1, e))

        if "parameter" in opcode_id:
            problems += self.bad_parameter_numbers(np.flatnonzero(opcode_ids == opcode_id["parameter"]))

        tables = InstructionTables(buf, ins, self.comp_rows, targets, opcode_ids, opcodes, shape_ids, shapes,
                                   self.attr_table)
        first_problem = min(problems, key=lambda p: p[:2]) if problems else None
        self.omitted_shapes(tables, np.flatnonzero(shape_ids < 0), first_problem)
        if first_problem is not None:
            raise first_problem[2]
        return tables

    def bad_parameter_numbers(self, rows: np.ndarray) -> list:
        """The first parameter whose number is not a non-negative 64-bit integer, as a problem."""
        ins = self.instr_rows
        off, length = ins["args_off"][rows].astype(np.int64), ins["args_len"][rows].astype(np.int64)
        (word,) = span_words(self.buf, off, np.minimum(length, 8), 1)
        chars = word.astype("<u8").view(np.uint8).reshape(-1, 8)        # up to 8 digits: checked here
        digit = ((chars >= ord("0")) & (chars <= ord("9"))) | (np.arange(8) >= length[:, None])
        plain = (length >= 1) & (length <= 8) & digit.all(axis=1)
        for row, o, n in zip(rows[~plain].tolist(), off[~plain].tolist(), length[~plain].tolist()):
            if not _is_parameter_number(self.src.text(o, n)):
                return [(row, 2, self.src.error("expects a parameter number (a non-negative 64-bit integer)", o))]
        return []

    def omitted_shapes(self, tables: InstructionTables, rows: np.ndarray, first_problem):
        """Shapes of instructions without a written one, and of recv-done, in text order (they chain).

        Stops before an instruction past the first problem found so far (its operands may be unusable)."""
        ins, shape_ids, shapes = self.instr_rows, tables.shape_ids, tables.shapes
        for row in rows.tolist():
            if first_problem is not None and (row, 1) > first_problem[:2]:
                break
            so, sl, oo, ob, oc, ab, ac, flags = ins[["shape_off", "shape_len", "opcode_off", "operand_begin",
                                                     "operand_count", "attr_begin", "attr_count", "flags"]][row].item()
            opcode = tables.opcode(row)
            operands = [shapes[shape_ids[t]] for t in tables.targets[ob:ob + oc].tolist()]
            if flags & INSTR_NO_SHAPE:
                shape = self.infer_shape(opcode, operands, ab, ac, oo)
            elif operands and operands[0].is_tuple and operands[0].tuple_shapes:
                # recv-done: XLA's parser builds it from its operand and ignores the written shape
                shape = tuple_shape((operands[0].tuple_shapes[0], TOKEN))
            else:
                shape = self.shape(so, sl)
            shape_ids[row] = len(shapes)
            shapes.append(shape)

    def unknown_operand(self, row: int) -> HloParseError:
        op = self.operand_rows[row]
        name = self.src.text(int(op["name_off"]), int(op["name_len"]))
        if op["target"] >= 0:
            return self.src.error(f"operand %{name} is used before it is defined", int(op["name_off"]))
        return self.src.error(f"unknown operand %{name}: no instruction of that name in this computation",
                              int(op["name_off"]))

    def infer_shape(self, opcode: str, operands: list[Shape], ab: int, ac: int, offset: int) -> Shape:
        """The shape of an instruction written without one, by ir/shape_inference.py (XLA's parser infers it
        the same way); a parse error at its opcode when there is no rule or the operands do not allow one."""
        raw = self.attrs(ab, ac)

        def attr(key: str):
            if key not in raw:
                return None
            try:
                return decode_attribute(key, raw[key], None)
            except AttributeSyntaxError as e:
                raise self.src.error(str(e), self.attr_table.value_offset(ab, ac, key)) from None
        try:
            return infer_shape(opcode, operands, attr)
        except ShapeInferenceError as e:
            raise self.src.error(f"the shape of this {opcode} is omitted and cannot be inferred ({e}); write it",
                                 offset) from None

    def computations(self, tables: InstructionTables) -> list[Computation]:
        comps = []
        rows = self.comp_rows[["name_off", "name_len", "instr_count", "attr_begin", "attr_count", "line", "flags"]]
        for row, (name_off, name_len, count, attr_begin, attr_count, line, flags) in enumerate(rows.tolist()):
            name = self.src.text(name_off, name_len)
            if not count:
                raise self.src.error(f"computation %{name} has no instructions", name_off)
            comps.append(Computation(name, None, None, is_entry=bool(flags & COMP_ENTRY), signature=None,
                                     attrs=self.attrs(attr_begin, attr_count) if attr_count else {}, line=line,
                                     tables=tables, row=row))
        return comps

    def computation_attr_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(attribute rows, their instruction rows) that may be calls=, to_apply=, body=, ...

        Picked out of the attribute table with numpy (key length and first/last byte), so the
        ~10 attributes per instruction of a dump are never decoded here; the caller checks the key."""
        at, it = self.attr_rows, self.instr_rows
        none = np.zeros(0, np.int64)
        if len(at) == 0 or len(it) == 0:
            return none, none
        text = np.frombuffer(self.buf, dtype=np.uint8)
        koff = at["key_off"].astype(np.int64)
        klen = at["key_len"].astype(np.int64)
        signature = (klen << 16) | (text[koff].astype(np.int64) << 8) | text[koff + np.maximum(klen - 1, 0)]
        del text    # the view pins an mmap until released
        wanted = [(len(k) << 16) | (ord(k[0]) << 8) | ord(k[-1]) for k in COMPUTATION_ATTRS]
        rows = np.flatnonzero(np.isin(signature, wanted) & (klen > 0))
        begins = it["attr_begin"].astype(np.int64)
        owners = np.searchsorted(begins, rows, side="right") - 1
        inside = (owners >= 0) & (rows < begins[np.maximum(owners, 0)] + it["attr_count"][np.maximum(owners, 0)])
        return rows[inside], owners[inside]

    def link_called(self, tables: InstructionTables, comps: list[Computation]):
        """Resolve computation names in calls=, to_apply=, body=, branch_computations=, ..."""
        buf, at = self.buf, self.attr_rows
        rows, owners = self.computation_attr_rows()
        module_rows = self.comp_rows["module"][self.instr_rows["computation"][owners]]
        comp_module = self.comp_rows["module"].tolist()
        by_module: dict[int, dict[str, Computation]] = {}
        self.inline: list[tuple[Computation, Module]] = []
        for row, owner, module_row, ko, kl, vo, vl in zip(rows.tolist(), owners.tolist(), module_rows.tolist(),
                                                          *(at[f][rows].tolist() for f in ("key_off", "key_len", "value_off", "value_len"))):
            key = _COMPUTATION_ATTR_KEYS.get(buf[ko:ko + kl])
            if key is None:
                continue
            raw = buf[vo:vo + vl].decode("utf-8", "replace")
            if raw.startswith("{") and "=" in raw:
                tables.called.append((owner, key, self.inline_computation(raw, tables, comps, owner)))
                continue
            by_name = by_module.get(module_row)
            if by_name is None:
                by_name = by_module[module_row] = {c.name: c for c, m in zip(comps, comp_module) if m == module_row}
            if "," in raw or "{" in raw or "}" in raw:
                names = [n.strip().lstrip("%") for n in raw.strip("{}").split(",") if n.strip()]
            else:         # one name (a value has no whitespace outside brackets and strings)
                names = [raw.lstrip("%")]
            try:
                called = [by_name[n] for n in names]
            except KeyError as e:
                raise self.src.error(f"{key} names unknown computation %{e.args[0]}", vo) from None
            list_valued = key in ("branch_computations", "called_computations") or raw.startswith("{")
            tables.called.append((owner, key, called if list_valued else called[0]))
        tables.called_owners = [owner for owner, _, _ in tables.called]

    def inline_computation(self, raw: str, tables: InstructionTables, comps: list[Computation],
                           owner: int) -> Computation:
        """`to_apply={ ... }`: a computation written inline, parsed as a bare computation."""
        name = f"{tables.name(owner)}.{tables.opcode(owner)}_computation"
        inner = parse(f"{name} {raw}\n", path=self.src.path)[0]
        inner.entry.is_entry = False
        self.inline.append((comps[self.instr_rows["computation"][owner]], inner))
        return inner.entry

    def insert_inline_computations(self, module: Module):
        """Put each inline computation (and what it calls) before the computation that uses it."""
        for user, inner in self.inline:
            if user.module is not module:
                continue
            for comp in inner.computations:
                comp.module = module
                module.computations.insert(module.computations.index(user), comp)
        module.__dict__.pop("by_name", None)

    def stack_frames(self, off: int, length: int) -> dict[int, tuple[str, int]]:
        """StackFrames id -> (file, line), through FileLocations and FileNames."""
        if not length:
            return {}
        text = self.src.text(off, length)
        files, locations, frames = {}, {}, {}
        section = None
        for line in text.splitlines():
            line = line.strip()
            if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
                section = line
                continue
            m = re.match(r"(\d+)\s+(.*)", line)
            if not m:
                continue
            key, rest = int(m.group(1)), m.group(2)
            fields = dict(re.findall(r"(\w+)=(\d+)", rest))
            if section == "FileNames":
                files[key] = rest.strip().strip('"')
            elif section == "FileLocations":
                locations[key] = (int(fields.get("file_name_id", 0)), int(fields.get("line", 0)))
            elif section == "StackFrames":
                frames[key] = int(fields.get("file_location_id", 0))
        out = {}
        for frame, loc in frames.items():
            if loc in locations:
                file_id, line = locations[loc]
                out[frame] = (files.get(file_id, "?"), line)
        return out
