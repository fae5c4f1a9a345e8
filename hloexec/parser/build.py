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
import stat
from contextlib import contextmanager
from functools import cached_property, partial
from typing import cast

import numpy as np

from ..errors import HloParseError, not_a_regular_file
from ..ir.attributes import AttributeSyntaxError, decode_attribute
from ..ir.module import COMPUTATION_ATTRS, AttrTable, Computation, Instruction, Module, TextSpan
from ..ir.shape import Shape, ShapeSyntaxError, parse_shape, tuple_shape
from ..ir.shape_inference import ShapeInferenceError, infer_shape
from .scan import (
    CALL_BRACED,
    CALL_DTYPE,
    CALL_INLINE,
    CALL_UNKNOWN,
    COMP_ENTRY,
    INSTR_ANONYMOUS,
    INSTR_NO_SHAPE,
    INSTR_ROOT,
    MODULE_HEADER,
    ScanError,
    link,
    scan,
)

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
        self.path: str | None
        self.buf: bytes | mmap.mmap
        if isinstance(source, os.PathLike) or (
            isinstance(source, str)
            and "\n" not in source
            and len(source) < 4096
            and os.path.exists(source)
            and not os.path.isdir(source)
        ):
            self.path = str(source)
            with open(self.path, "rb") as f:
                status = os.fstat(f.fileno())
                if not stat.S_ISREG(status.st_mode):  # /dev/zero maps as 0 bytes: it was "empty input"
                    raise not_a_regular_file(self.path, status.st_mode, "HLO text is read by mapping a regular file")
                if status.st_size == 0:
                    self.buf = b""
                else:
                    self._mmap = self.buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        elif isinstance(source, str) and _LOOKS_LIKE_A_PATH.fullmatch(source):
            raise FileNotFoundError(f"no such file: {source}")
        elif isinstance(source, (str, bytes, bytearray, memoryview)):
            self.path = path
            self.buf = source.encode("utf-8", "surrogateescape") if isinstance(source, str) else bytes(source)
        else:  # bytes(5) would be five NUL bytes
            raise TypeError(f"expected HLO text (str or bytes) or a path, not {type(source).__name__}")

    def text(self, off: int, length: int) -> str:
        return self.buf[off : off + length].decode("utf-8", "replace")

    def position(self, offset: int) -> tuple[int, int, str]:
        """(line, column, line text) of a byte offset, all 1-based."""
        offset = max(0, min(offset, len(self.buf)))
        line_start = self.buf.rfind(b"\n", 0, offset) + 1
        line_end = self.buf.find(b"\n", offset)
        if line_end < 0:
            line_end = len(self.buf)
        line = self.buf[:line_start].count(b"\n") + 1
        shown = self.buf[line_start : min(line_end, line_start + 100_000)]
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
    with _collections_paused():  # ~2 objects per computation
        builder = Builder(src, tables)
        del tables  # the builder drops what it no longer needs
        return builder.modules()


@contextmanager
def _collections_paused():
    """No cyclic garbage collection inside (making many objects at once, none of them garbage yet)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


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

    def __init__(
        self,
        buf,
        instrs: np.ndarray,
        comps: np.ndarray,
        targets: np.ndarray,
        opcode_ids: np.ndarray,
        opcodes: list[str],
        shape_ids: np.ndarray,
        shapes: list[Shape],
        attr_table: AttrTable,
    ):
        self.buf, self.instrs, self.comps, self.targets = buf, instrs, comps, targets
        self.opcode_ids, self.opcodes, self.shape_ids, self.shapes = opcode_ids, opcodes, shape_ids, shapes
        self.attr_table = attr_table
        self.with_args = {i for i, op in enumerate(opcodes) if op in ("constant", "parameter")}
        self._columns: tuple[int, list[list], int, list[int]] = (0, [[]], 0, [])
        # the attributes naming computations (see Builder.link_called): linked to instructions as they are built
        self.calls, self.call_targets = np.zeros(0, CALL_DTYPE), np.zeros(0, np.int32)
        self.computations: ComputationTable | None = None  # the Computation of each row, made on first use
        self.inline: dict[int, Computation] = {}  # call index -> the computation written inline

    @cached_property
    def anonymous(self) -> np.ndarray:
        """Rows of the nested (anonymous) instructions."""
        return np.flatnonzero(self.instrs["flags"] & INSTR_ANONYMOUS)

    def instruction_count(self, row: int) -> int:
        return int(self.comps["instr_count"][row])

    def instruction_total(self, rows: list[int]) -> int:
        return int(self.comps["instr_count"][rows].sum())

    def signature(self, row: int) -> str:
        off, length = self.comps[["signature_off", "signature_len"]][row].item()
        return self.buf[off : off + length].decode("utf-8", "replace")

    def name(self, row: int) -> str:
        """The name of instruction `row` (`<opcode>.anonN` for the N-th nested one of the text)."""
        off, length, flags = self.instrs[["name_off", "name_len", "flags"]][row].item()
        if flags & INSTR_ANONYMOUS:
            return f"{self.opcode(row)}.anon{int(np.searchsorted(self.anonymous, row)) + 1}"
        return self.buf[off : off + length].decode("utf-8", "replace")

    def opcode(self, row: int) -> str:
        return self.opcodes[self.opcode_ids[row]]

    def opcode_counts(self, comp_rows: list[int]) -> dict[str, int]:
        counts = np.bincount(self.opcode_ids[instruction_rows(self.comps, comp_rows)], minlength=len(self.opcodes))
        out: dict[str, int] = {}
        for opcode, n in zip(self.opcodes, counts.tolist()):
            if n:  # two byte strings may decode to one name
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
            targets = self.targets[
                first_operand : int(ins["operand_begin"][hi - 1] + ins["operand_count"][hi - 1])
            ].tolist()
            self._columns = lo, cols, first_operand, targets
        return self._columns

    def build(self, comp: Computation, row: int) -> tuple[list[Instruction], Instruction]:
        """The Instruction objects of computation `row`, linked (operands, users, called), and its root."""
        # ~4 linked objects per instruction: collections while making them would rescan all made so far
        with _collections_paused():
            return self._build(comp, row)

    def _build(self, comp: Computation, row: int) -> tuple[list[Instruction], Instruction]:
        _, _, _, _, begin, count, _, _, _, _, root, _ = self.comps[row].item()
        end = begin + count
        lo, cols, first_operand, targets = self.columns(begin, end)
        buf, opcodes, shapes, with_args, attr_table = (
            self.buf,
            self.opcodes,
            self.shapes,
            self.with_args,
            self.attr_table,
        )
        anonymous = int(np.searchsorted(self.anonymous, begin)) if len(self.anonymous) else 0
        insts: list[Instruction] = []
        append = insts.append
        for no, nl, ao, al, ob, oc, ab, ac, line, column, flags, op, sh in zip(
            *(col[begin - lo : end - lo] for col in cols)
        ):
            if oc:
                ob -= first_operand
                operands = [insts[t - begin] for t in targets[ob : ob + oc]]
            else:
                operands = []
            if flags & INSTR_ANONYMOUS:
                anonymous += 1
                name = f"{opcodes[op]}.anon{anonymous}"
            else:
                name = buf[no : no + nl].decode("utf-8", "replace")
            args: str | TextSpan
            if op not in with_args:
                args = ""
            elif al > _SPAN_ARGS_OVER:
                args = TextSpan(buf, ao, al)
            else:
                args = buf[ao : ao + al].decode("utf-8", "replace")
            inst = Instruction(
                name,
                opcodes[op],
                shapes[sh],
                operands,
                None if ac else {},
                args,
                line,
                column,
                (attr_table, ab, ac) if ac else None,
            )
            inst.computation = comp
            if flags & INSTR_ROOT:
                inst.is_root = True
            for o in operands:
                o.users.append(inst)
            append(inst)
        calls = self.calls
        first, last = np.searchsorted(calls["owner"], (begin, end)).tolist()
        if first < last:
            assert self.computations is not None  # made before any computation is built
            call_targets, computation_of_row = self.call_targets, self.computations.get
            for i, (owner, key, flags, target_begin, target_count) in enumerate(
                calls[["owner", "key", "flags", "target_begin", "target_count"]][first:last].tolist(), first
            ):
                key = COMPUTATION_ATTRS[key]
                value: Computation | list[Computation]
                if flags & CALL_INLINE:
                    value = self.inline[i]
                else:
                    rows = call_targets[target_begin : target_begin + target_count].tolist()
                    called = [computation_of_row(t) for t in rows]
                    value = called if flags & CALL_BRACED or key in _LIST_VALUED else called[0]
                insts[owner - begin].called[key] = value
        root = insts[root - begin] if root >= 0 else insts[-1]
        root.is_root = True
        return insts, root


_LIST_VALUED = ("branch_computations", "called_computations")  # a list even when one name is written without {}
_BUILD_FIELDS = (
    "name_off",
    "name_len",
    "args_off",
    "args_len",
    "operand_begin",
    "operand_count",
    "attr_begin",
    "attr_count",
    "line",
    "column",
    "flags",
)
_COLUMN_ROWS = 4096  # instruction rows turned into Python lists at once when building computations


class ComputationTable:
    """The Computation objects of one parse by computation row, each made on first use: a module's list
    (`Module.computations`, through `make`), an entry, a called computation (`get`); `made[row]` is the
    object made for a row, else None."""

    def __init__(self, buf, rows: np.ndarray, attr_table: AttrTable, tables: InstructionTables):
        self.buf, self.rows, self.attr_table, self.tables = buf, rows, attr_table, tables
        self.made: list[Computation | None] = [None] * len(rows)
        self.modules: dict[int, Module] = {}  # module row -> Module (add_module)

    def add_module(self, row: int, module: Module, begin: int, end: int):
        """`module` holds computation rows begin..end: those made from now on, and those made already, are its."""
        self.modules[row] = module
        for comp in self.made[begin:end]:
            if comp is not None:
                comp.module = module

    def get(self, row: int) -> Computation:
        comp = self.made[row]
        return comp if comp is not None else self.make(row, row + 1)[0]

    def make(self, begin: int, end: int) -> list[Computation]:
        """The computations of rows begin..end (made where not yet)."""
        buf, made, make, attrs, tables = self.buf, self.made, Computation.of_tables, self.attr_table, self.tables
        out = []
        rows = self.rows[["name_off", "name_len", "attr_begin", "attr_count", "line", "flags", "module"]][begin:end]
        for row, (name_off, name_len, attr_begin, attr_count, line, flags, module) in enumerate(rows.tolist(), begin):
            comp = made[row]
            if comp is None:
                comp = made[row] = make(
                    buf[name_off : name_off + name_len].decode("utf-8", "replace"),
                    tables,
                    row,
                    bool(flags & COMP_ENTRY),
                    attrs.to_dict(attr_begin, attr_count) if attr_count else {},
                    line,
                )
                comp.module = self.modules.get(module)
            out.append(comp)
        return out


# -- checking the tables ------------------------------------------------------------------------------
class Builder:
    """Checks the scanner's tables of one text and makes its Modules, whose computations build lazily."""

    def __init__(self, src: Source, tables):
        self.src = src
        self.buf = src.buf
        # the scanner's tables, one by one: the operand table (~1/5 of the text's size) goes after the checks
        self.module_rows, self.comp_rows, self.instr_rows = tables.modules, tables.comps, tables.instrs
        self.operand_rows, self.attr_rows = tables.operands, tables.attrs
        self.links = link(self.buf, tables, COMPUTATION_ATTRS)  # interned, checked and resolved in C
        self.shapes: dict[bytes, Shape] = {}
        self.inline: list[tuple[Computation, Module]] = []  # (user, the module parsed from inline text)
        self.attr_table = AttrTable(self.buf, tables.attrs, src.error)

    def shape(self, off: int, length: int) -> Shape:
        raw = self.buf[off : off + length]
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
        for row, (
            begin,
            count,
            entry_row,
            flags,
            name_off,
            name_len,
            attr_begin,
            attr_count,
            line,
            text_off,
            preamble_off,
            preamble_len,
        ) in enumerate(
            self.module_rows[
                [
                    "comp_begin",
                    "comp_count",
                    "entry",
                    "flags",
                    "name_off",
                    "name_len",
                    "attr_begin",
                    "attr_count",
                    "line",
                    "text_off",
                    "preamble_off",
                    "preamble_len",
                ]
            ].tolist()
        ):
            if not count:
                raise self.src.error("module has no computations", text_off)
            entry = comps.get(entry_row if entry_row >= 0 else begin + count - 1)
            has_header = bool(flags & MODULE_HEADER)
            name = self.src.text(name_off, name_len) if has_header else entry.name
            frames = partial(stack_frames, self.src, preamble_off, preamble_len) if preamble_len else None
            attrs = self.attrs(attr_begin, attr_count)
            for key in ("num_partitions", "replica_count"):  # XLA's parser takes a count; 0 made no participant
                if key in attrs and not (attrs[key].isdigit() and int(attrs[key]) >= 1):
                    raise self.src.error(f"{key}={attrs[key]}: expected a count >= 1", text_off)
            module = Module(
                name,
                None,
                entry,
                attrs=attrs,
                has_header=has_header,
                line=line,
                path=self.src.path,
                stack_frames=frames,
                computation_rows=(comps, begin, begin + count),
            )
            comps.add_module(row, module, begin, begin + count)
            entry.is_entry = True
            modules.append(module)
        for module in modules:
            self.insert_inline_computations(module)
        return modules

    def instruction_tables(self) -> InstructionTables:
        """Opcode and shape ids of every instruction, after checking all an Instruction will need.

        Of several problems, the one met first reading the text is reported: the earliest instruction,
        and in one instruction its operands, then its shape, then its parameter number."""
        ins, links = self.instr_rows, self.links
        problems: list[tuple[int, int, HloParseError]] = []  # (instruction row, rank in the row, error)
        if links.bad_operand >= 0:
            problems.append((links.bad_operand_owner, 0, self.unknown_operand(links.bad_operand)))
        targets = self.operand_rows["target"].copy()
        self.operand_rows = None

        opcodes = [self.src.text(o, n) for o, n in ins[["opcode_off", "opcode_len"]][links.opcode_first].tolist()]
        shapes: list[Shape | None] = []  # each distinct written shape text parsed once (None: a problem)
        for row, (off, length) in zip(
            links.shape_first.tolist(), ins[["shape_off", "shape_len"]][links.shape_first].tolist()
        ):
            try:
                shapes.append(self.shape(off, length))
            except HloParseError as e:
                shapes.append(None)
                problems.append((row, 1, e))
        if links.bad_parameter >= 0:
            offset = int(ins["args_off"][links.bad_parameter])
            problems.append(
                (
                    links.bad_parameter,
                    2,
                    self.src.error("expects a parameter number (a non-negative 64-bit integer)", offset),
                )
            )

        # the None shapes are problems: the first is raised before the tables are returned
        parsed = cast("list[Shape]", shapes)
        tables = InstructionTables(
            self.buf, ins, self.comp_rows, targets, links.opcode_ids, opcodes, links.shape_ids, parsed, self.attr_table
        )
        first_problem = min(problems, key=lambda p: p[:2]) if problems else None
        self.omitted_shapes(tables, np.flatnonzero(links.shape_ids < 0), first_problem)
        if first_problem is not None:
            raise first_problem[2]
        return tables

    def omitted_shapes(self, tables: InstructionTables, rows: np.ndarray, first_problem):
        """Shapes of instructions without a written one, and of recv-done, in text order (they chain).

        Stops before an instruction past the first problem found so far (its operands may be unusable)."""
        ins, shape_ids, shapes = self.instr_rows, tables.shape_ids, tables.shapes
        for row in rows.tolist():
            if first_problem is not None and (row, 1) > first_problem[:2]:
                break
            so, sl, oo, ob, oc, ab, ac, flags = ins[
                [
                    "shape_off",
                    "shape_len",
                    "opcode_off",
                    "operand_begin",
                    "operand_count",
                    "attr_begin",
                    "attr_count",
                    "flags",
                ]
            ][row].item()
            opcode = tables.opcode(row)
            operands = [shapes[shape_ids[t]] for t in tables.targets[ob : ob + oc].tolist()]
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
        return self.src.error(
            f"unknown operand %{name}: no instruction of that name in this computation", int(op["name_off"])
        )

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
                at = self.attr_table.value_offset(ab, ac, key)
                raise self.src.error(str(e), offset if at is None else at) from None

        try:
            return infer_shape(opcode, operands, attr)
        except ShapeInferenceError as e:
            raise self.src.error(
                f"the shape of this {opcode} is omitted and cannot be inferred ({e}); write it", offset
            ) from None

    def computations(self, tables: InstructionTables) -> ComputationTable:
        """The computations, made on first use, after checking that each has instructions."""
        empty = np.flatnonzero(self.comp_rows["instr_count"] == 0)
        if len(empty):
            name_off, name_len = self.comp_rows[["name_off", "name_len"]][empty[0]].item()
            raise self.src.error(f"computation %{self.src.text(name_off, name_len)} has no instructions", name_off)
        comps = tables.computations = ComputationTable(self.buf, self.comp_rows, self.attr_table, tables)
        return comps

    def link_called(self, tables: InstructionTables, comps: ComputationTable):
        """Check what calls=, to_apply=, body=, branch_computations=, ... name (resolved by `link`), parse the
        computations written inline, and hand the rest to `tables` (linked as instructions are built)."""
        calls = self.links.calls
        odd = calls["flags"] & (CALL_INLINE | CALL_UNKNOWN) if len(calls) else ()
        for i in np.flatnonzero(odd).tolist():
            owner, attr, key, flags, _, _, name_off, name_len = calls[i].item()
            key = COMPUTATION_ATTRS[key]
            if flags & CALL_INLINE:
                tables.inline[i] = self.inline_computation(self.attr_table.value(attr), tables, comps, owner)
            else:
                raise self.src.error(
                    f"{key} names unknown computation %{self.src.text(name_off, name_len)}",
                    self.attr_table.value_off(attr),
                )
        tables.calls, tables.call_targets = calls, self.links.call_targets

    def inline_computation(
        self, raw: str, tables: InstructionTables, comps: ComputationTable, owner: int
    ) -> Computation:
        """`to_apply={ ... }`: a computation written inline, parsed as a bare computation."""
        name = f"{tables.name(owner)}.{tables.opcode(owner)}_computation"
        inner = parse(f"{name} {raw}\n", path=self.src.path)[0]
        inner.entry.is_entry = False
        self.inline.append((comps.get(int(self.instr_rows["computation"][owner])), inner))
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


_FRAME_ROW = re.compile(r"(\d+)\s+(.*)")
_FRAME_FIELD = re.compile(r"(\w+)=(\d+)")


def stack_frames(src: Source, off: int, length: int) -> dict[int, tuple[str, int]]:
    """StackFrames id -> (file, line), through FileLocations and FileNames, from the preamble at src[off:off+length]
    (decoded when a module first asks: a dump's preamble can be a tenth of its text)."""
    files: dict[int, str] = {}
    locations: dict[int, tuple[int, int]] = {}  # id -> (file id, line)
    frames: dict[int, int] = {}  # id -> location id
    section = None
    for line in src.text(off, length).splitlines():
        line = line.strip()
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = line
            continue
        m = _FRAME_ROW.match(line)
        if not m:
            continue
        key, rest = int(m.group(1)), m.group(2)
        fields = dict(_FRAME_FIELD.findall(rest))
        if section == "FileNames":
            files[key] = rest.strip().strip('"')
        elif section == "FileLocations":
            locations[key] = (int(fields.get("file_name_id", 0)), int(fields.get("line", 0)))
        elif section == "StackFrames":
            frames[key] = int(fields.get("file_location_id", 0))
    out = {}
    for frame, loc in frames.items():
        if loc in locations:
            file_id, line_number = locations[loc]
            out[frame] = (files.get(file_id, "?"), line_number)
    return out
