"""The HLO IR: Module -> Computations -> Instructions, fully linked.

Built by `hloexec.parser` from the C scanner's tables; a parsed computation makes its Instruction
objects on first use (see Computation), so counting needs no objects (`Module.opcode_counts`,
`Module.shape_counts`, `Module.instruction_count`). Raw attribute text is kept as written
(`inst.attrs`, in order); `inst.attr(key)` decodes one on first use through
`hloexec.ir.attributes`, and an attribute hloexec does not know stays raw text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any
from functools import cached_property

from ..errors import HloParseError
from .shape import Shape
from .printer import module_to_text

# Attribute keys whose value names computations (a list for branch_computations / called_computations).
COMPUTATION_ATTRS = (
    "calls",
    "to_apply",
    "condition",
    "body",
    "branch_computations",
    "true_computation",
    "false_computation",
    "called_computations",
    "select",
    "scatter",
    "comparator",
)


class AttrTable:
    """The attribute spans of one parsed text; an instruction decodes its `attrs` from here on first access.

    Holds the parsed buffer (for a file, its read-only mmap: it stays mapped while instructions that have
    not decoded their attributes are alive), the scanner's attribute table `rows` (a numpy structured
    array with key_off, key_len, value_off, value_len) and `error(message, offset) -> HloParseError`.
    """

    __slots__ = ("buf", "rows", "keys", "error")

    def __init__(self, buf, rows, error):
        self.buf, self.rows, self.error = buf, rows, error
        self.keys: dict[bytes, str] = {}

    def _key(self, off: int, length: int) -> str:
        raw = self.buf[off : off + length]
        key = self.keys.get(raw)
        if key is None:
            key = self.keys[raw] = raw.decode("utf-8", "replace")
        return key

    def key(self, row: int) -> str:
        key_off, key_len, _, _ = self.rows[row].item()
        return self._key(key_off, key_len)

    def value(self, row: int) -> str:
        _, _, value_off, value_len = self.rows[row].item()
        return self.buf[value_off : value_off + value_len].decode("utf-8", "replace")

    def value_off(self, row: int) -> int:
        return int(self.rows["value_off"][row])

    def to_dict(self, begin: int, count: int) -> dict[str, str]:
        buf, key = self.buf, self._key
        return {
            key(ko, kl): buf[vo : vo + vl].decode("utf-8", "replace")
            for ko, kl, vo, vl in self.rows[begin : begin + count].tolist()
        }

    def value_offset(self, begin: int, count: int, key: str) -> int | None:
        """Byte offset of the value of `key` among rows begin..begin+count (the last one written wins)."""
        for r in range(begin + count - 1, begin - 1, -1):
            if self.key(r) == key:
                return self.value_off(r)
        return None


class TextSpan:
    """Text kept as a span of the parsed buffer (a large constant's literal): decoded only when asked for,
    so a 10M-element constant is not held as bytes and str beside the mapped file."""

    __slots__ = ("buf", "offset", "length")

    def __init__(self, buf, offset: int, length: int):
        self.buf, self.offset, self.length = buf, offset, length

    def text(self) -> str:
        return self.buf[self.offset : self.offset + self.length].decode("utf-8", "replace")


def _line_text(buf, line: int) -> str:
    """Line `line` (1-based) of the parsed text `buf`, for an error's caret line (its first 100,000 bytes)."""
    start = 0
    for _ in range(line - 1):
        start = buf.find(b"\n", start) + 1
        if start == 0:
            return ""
    end = buf.find(b"\n", start)
    return bytes(buf[start : min(end if end >= 0 else len(buf), start + 100_000)]).decode("utf-8", "replace")


class Instruction:
    __slots__ = (
        "name",
        "opcode",
        "shape",
        "operands",
        "_attrs",
        "_attr_rows",
        "_args",
        "computation",
        "users",
        "line",
        "column",
        "is_root",
        "called",
        "_decoded",
        "__weakref__",
    )

    def __init__(
        self,
        name: str,
        opcode: str,
        shape: Shape,
        operands: list[Instruction],
        attrs: dict[str, str] | None = None,
        args: str | TextSpan = "",
        line: int = 0,
        column: int = 0,
        attr_rows: tuple[AttrTable, int, int] | None = None,
    ):
        self.name = name
        self.opcode = opcode
        self.shape = shape
        self.operands = operands
        self._attrs = attrs if attrs is not None or attr_rows is not None else {}
        self._attr_rows = attr_rows  # (table, first row, count): `attrs` is decoded from it on first access
        self._args = args  # raw text between the parentheses (literal of a constant, parameter number)
        self.computation: Computation | None = None
        self.users: list[Instruction] = []
        self.line = line
        self.column = column
        self.is_root = False
        self.called: dict[str, Computation | list[Computation]] = {}  # attr key -> computation(s)
        self._decoded: dict | None = None

    @property
    def parent(self) -> Computation:
        """The computation holding this instruction (`computation`, for code that reads a module's instructions:
        every one of those has it; an instruction not placed in a computation yet raises)."""
        if self.computation is None:
            raise ValueError(f"%{self.name} is in no computation")
        return self.computation

    @property
    def args(self) -> str:
        """The raw text between the parentheses (decoded here if the parser kept it as a TextSpan)."""
        args = self._args
        return args if isinstance(args, str) else args.text()

    @args.setter
    def args(self, args: str):
        self._args = args

    # -- attributes --------------------------------------------------------------
    @property
    def attrs(self) -> dict[str, str]:
        """key -> raw value text, in written order."""
        attrs = self._attrs
        if attrs is None:
            assert self._attr_rows is not None  # __init__ keeps one of the two
            table, begin, count = self._attr_rows
            attrs = self._attrs = table.to_dict(begin, count)
        return attrs

    @attrs.setter
    def attrs(self, attrs: dict[str, str]):
        self._attrs, self._attr_rows = attrs, None

    def attr(self, key: str, default=None):
        """The decoded value of attribute `key` (see hloexec.ir.attributes), or `default` if absent.

        A value XLA's parser would reject raises HloParseError at the value's file:line:col."""
        raw = self.attrs.get(key)
        if raw is None:
            return default
        decoded = self._decoded
        if decoded is None:
            decoded = self._decoded = {}
        elif key in decoded:
            return decoded[key]
        from .attributes import AttributeSyntaxError, decode_attribute

        try:
            value = decoded[key] = decode_attribute(key, raw, self)
        except AttributeSyntaxError as e:
            raise self.attr_error(key, str(e)) from None
        return value

    def with_operands(self, operands: list[Instruction]) -> Instruction:
        """A copy (outside any computation) reading `operands`: same name, shape, attributes and source site."""
        copy = Instruction(
            self.name,
            self.opcode,
            self.shape,
            operands,
            self._attrs,
            self._args,
            self.line,
            self.column,
            self._attr_rows,
        )
        copy.called = self.called
        copy._decoded = self._decoded
        for o in operands:
            o.users.append(copy)
        return copy

    def wrapped_as(self, opcode: str, shape: Shape) -> Instruction:
        """This instruction seen as the op an async shorthand wraps (XLA reads `all-to-all-start(x), ...` as an
        async-start whose computation is one all-to-all): `opcode` with the wrapped result `shape`, the same
        operands, attributes, called computations and source site; no instruction's user."""
        view = Instruction(
            self.name, opcode, shape, self.operands, self._attrs, self._args, self.line, self.column, self._attr_rows
        )
        view.called, view._decoded, view.computation = self.called, self._decoded, self.computation
        return view

    def attr_error(self, key: str, message: str) -> HloParseError:
        """HloParseError pointing at the value of attribute `key` in the parsed text (else at the instruction)."""
        if self._attr_rows is not None:
            table, begin, count = self._attr_rows
            offset = table.value_offset(begin, count, key)
            if offset is not None:
                return table.error(f"in %{self.name}: {message}", offset)
        return self.parse_error(message)

    def parse_error(self, message: str) -> HloParseError:
        """HloParseError at this instruction's file:line:col (for text decoded lazily, after parsing)."""
        module = self.computation.module if self.computation is not None else None
        tables = self.computation.tables if self.computation is not None else None
        return HloParseError(
            f"in %{self.name}: {message}",
            path=module.path if module is not None else None,
            line=self.line,
            column=self.column,
            line_text=_line_text(tables.buf, self.line) if tables is not None and self.line > 0 else "",
        )

    def has_attr(self, key: str) -> bool:
        return key in self.attrs

    def called_computation(self, key: str) -> Computation:
        """The one computation attribute `key` names (to_apply, calls, condition, body, ...; `called` holds a list
        for branch_computations and called_computations)."""
        called = self.called[key]
        if isinstance(called, list):
            raise self.attr_error(key, f"{key} names {len(called)} computations where one was expected")
        return called

    @property
    def called_computations(self) -> list[Computation]:
        out = []
        for value in self.called.values():
            out.extend(value if isinstance(value, list) else [value])
        return out

    @property
    def parameter_number(self) -> int:
        return int(self.args)

    @property
    def metadata(self) -> dict:
        return self.attr("metadata", {}) or {}

    @property
    def source_location(self) -> str:
        """'file:line' of the framework code that produced this instruction, '' if unknown."""
        md = self.metadata
        file, line = md.get("source_file"), md.get("source_line")
        module = self.computation.module if self.computation is not None else None
        if file is None and "stack_frame_id" in md and module is not None:
            frame = module.stack_frame(int(md["stack_frame_id"]))
            if frame:
                file, line = frame
        if not file:
            return ""
        return f"{file}:{line}" if line is not None else file

    # -- constants -----------------------------------------------------------------
    # Instructions keep __slots__ (no __dict__ for cached_property), so the decoded literal is cached in `_decoded`.
    @property
    def literal(self):
        """The numpy value of a constant, decoded on first use."""
        decoded = self._decoded
        if decoded is None:
            decoded = self._decoded = {}
        if "__literal__" not in decoded:
            from .literal import LiteralSyntaxError, parse_literal

            try:
                decoded["__literal__"] = parse_literal(self._args, self.shape, self)
            except LiteralSyntaxError as e:
                raise self.parse_error(f"bad literal: {e}") from None
        return decoded["__literal__"]

    @property
    def literal_elided(self) -> bool:
        """Whether this is a constant whose values the text does not hold: `constant({...})`, as XLA dumps large
        constants without --xla_dump_large_constants=true."""
        if self.opcode != "constant":
            return False
        args = self._args
        if not isinstance(args, str):
            if args.length > 16:  # a long literal is a real one (spans are kept for those only)
                return False
            args = args.text()
        from .literal import literal_elided

        return literal_elided(args)

    def __repr__(self):
        return f"<%{self.name} = {self.shape.to_text()} {self.opcode}>"


class Computation:
    """A computation; `instructions` in text order.

    Made by the parser with `tables` and `row` (and `instructions=None`, `root=None`): its Instruction
    objects are then built from the parser's tables on first access of `instructions`, `root`, iteration,
    `by_name` or `parameters`, all linked exactly as if made eagerly. `tables` provides
    `instruction_count(row)`, `build(comp, row) -> (instructions, root)`, `signature(row)` and the
    column-wise counts `opcode_counts(rows)` / `shape_counts(rows)` that Module uses.
    """

    # slots: a large dump has ~10^5 computations made at parse time ("__dict__" keeps other attributes possible)
    __slots__ = (
        "name",
        "_instructions",
        "_root",
        "is_entry",
        "_signature",
        "attrs",
        "line",
        "module",
        "tables",
        "row",
        "__dict__",
        "__weakref__",
    )

    def __init__(
        self,
        name: str,
        instructions: list[Instruction] | None,
        root: Instruction | None,
        *,
        is_entry: bool = False,
        signature: str | None = "",
        attrs: dict[str, str] | None = None,
        line: int = 0,
        tables=None,
        row: int = -1,
    ):
        self.name = name
        self._instructions = instructions  # None until built from `tables`
        self._root = root
        self.is_entry = is_entry
        self._signature = signature  # None: read from `tables` when asked
        self.attrs = attrs if attrs is not None else {}
        self.line = line
        self.module: Module | None = None
        self.tables, self.row = tables, row
        if instructions is not None:
            for inst in instructions:
                inst.computation = self

    @classmethod
    def of_tables(cls, name: str, tables, row: int, is_entry: bool, attrs: dict[str, str], line: int) -> Computation:
        """A parsed computation, not built yet (as `Computation(name, None, None, signature=None, ...)`, without
        keyword handling: a dump's ~10^4 computations are made in every parse)."""
        comp = cls.__new__(cls)
        comp.name, comp._instructions, comp._root, comp.is_entry, comp._signature = name, None, None, is_entry, None
        comp.attrs, comp.line, comp.module, comp.tables, comp.row = attrs, line, None, tables, row
        return comp

    @property
    def is_built(self) -> bool:
        """Whether the Instruction objects exist (False: still only rows of the parser's tables)."""
        return self._instructions is not None

    def _build(self) -> tuple[list[Instruction], Instruction]:
        self._instructions, self._root = built = self.tables.build(self, self.row)
        return built

    @property
    def instructions(self) -> list[Instruction]:
        """In text order."""
        instructions = self._instructions
        return instructions if instructions is not None else self._build()[0]

    @instructions.setter
    def instructions(self, instructions: list[Instruction]):
        self._instructions = instructions

    @property
    def root(self) -> Instruction:
        root = self._root
        return root if root is not None else self._build()[1]

    @root.setter
    def root(self, root: Instruction):
        if self._instructions is None:
            self._build()
        self._root = root

    @property
    def signature(self) -> str:
        """Raw '(p: f32[8]) -> f32[8]', '' if not written."""
        if self._signature is None:
            self._signature = self.tables.signature(self.row)
        return self._signature

    @cached_property
    def parameters(self) -> list[Instruction]:
        """Parameter instructions ordered by parameter number."""
        params = [i for i in self.instructions if i.opcode == "parameter"]
        params.sort(key=lambda i: i.parameter_number)
        return params

    def check_parameter_numbers(self) -> None:
        """HloParseError at a parameter unless they are numbered 0..N-1, once each (XLA's rule; a run binds its
        arguments by number). Not at parse: the text of such a computation still prints."""
        params = self.parameters
        n = len(params)
        out_of_range = [p for p in params if not 0 <= p.parameter_number < n]
        repeated = [p for k, p in enumerate(params) if p.parameter_number != k]
        if out_of_range or repeated:
            p = (out_of_range or repeated)[0]
            raise p.parse_error(
                f"parameter number {p.parameter_number}: computation %{self.name} has {n} parameter(s), "
                f"numbered 0..{n - 1} once each"
            )

    @cached_property
    def by_name(self) -> dict[str, Instruction]:
        return {i.name: i for i in self.instructions}

    def __getitem__(self, name: str) -> Instruction:
        return self.by_name[name.lstrip("%")]

    def __iter__(self):
        return iter(self.instructions)

    def __len__(self):
        if self._instructions is None:
            return self.tables.instruction_count(self.row)
        return len(self._instructions)

    def __repr__(self):
        return f"<computation %{self.name}: {len(self)} instructions>"


class Module:
    """An HLO module: `computations` in text order (the entry is usually last).

    Made by the parser with `computations=None` and `computation_rows=(source, begin, end)`: the list is then
    `source.make(begin, end)`, made on first access of `computations` (a dump's computations are not needed to
    parse it, run its entry or count its instructions by opcode). Until then `source.made[row]` holds the
    computations already made (else None) and `source.tables` counts the rest (see Computation)."""

    def __init__(
        self,
        name: str,
        computations: list[Computation] | None,
        entry: Computation,
        *,
        attrs: dict[str, str] | None = None,
        has_header: bool = True,
        line: int = 0,
        path: str | None = None,
        stack_frames: dict[int, tuple[str, int]] | Callable[[], dict[int, tuple[str, int]]] | None = None,
        computation_rows: tuple | None = None,
    ):
        self.name = name
        self._computations = computations
        self._computation_rows = computation_rows
        self.entry = entry
        self.attrs = attrs or {}  # header attributes, raw text
        self.has_header = has_header
        self.line = line  # line of the header (or first computation) in the source
        self.path = path
        self._stack_frames = stack_frames or {}  # or a function making it, called on first use
        for comp in computations or ():
            comp.module = self

    @property
    def computations(self) -> list[Computation]:
        """In text order; the entry is usually last."""
        if self._computations is None:
            assert self._computation_rows is not None  # __init__ takes one of the two
            source, begin, end = self._computation_rows
            self._computations = source.make(begin, end)
        return self._computations

    @computations.setter
    def computations(self, computations: list[Computation]):
        self._computations = computations

    def attr(self, key: str, default=None):
        raw = self.attrs.get(key)
        if raw is None:
            return default
        from .attributes import decode_attribute

        return decode_attribute(key, raw, None)

    @property
    def num_partitions(self) -> int:
        return int(self.attrs.get("num_partitions", 1))

    @property
    def replica_count(self) -> int:
        return int(self.attrs.get("replica_count", 1))

    def stack_frame(self, frame_id: int) -> tuple[str, int] | None:
        """(file, line) of a stack frame id from the module's StackFrames table."""
        frames = self._stack_frames
        if callable(frames):
            frames = self._stack_frames = frames()
        return frames.get(frame_id)

    @cached_property
    def by_name(self) -> dict[str, Computation]:
        return {c.name: c for c in self.computations}

    def __getitem__(self, name: str) -> Computation:
        return self.by_name[name.lstrip("%")]

    def instructions(self):
        for comp in self.computations:
            yield from comp.instructions

    @property
    def instruction_count(self) -> int:
        made, tables, rows = self._parts()
        return sum(len(c) for c in made) + (tables.instruction_total(rows) if rows else 0)

    def _parts(self) -> tuple[list[Computation], Any, list[int]]:
        """(the computation objects, the tables and rows of those not made yet): counting a parsed module
        makes no objects (a 1 GB dump has ~270k computations)."""
        if self._computations is not None:
            return self._computations, None, []
        assert self._computation_rows is not None  # __init__ takes one of the two
        source, begin, end = self._computation_rows
        made = source.made[begin:end]
        return [c for c in made if c is not None], source.tables, [begin + i for i, c in enumerate(made) if c is None]

    def elided_constants(self) -> list[Instruction]:
        """The constants whose values the text does not hold (`constant({...})`): hloexec runs them as zeros."""
        return [inst for inst in self.instructions() if inst.literal_elided]

    def opcode_counts(self) -> Counter:
        """opcode -> number of instructions, without building Instruction objects that do not exist yet."""
        return self._counts("opcode_counts", lambda inst: inst.opcode)

    def shape_counts(self) -> Counter:
        """Shape -> number of instructions of that shape (as opcode_counts)."""
        return self._counts("shape_counts", lambda inst: inst.shape)

    def _counts(self, column: str, of_instruction) -> Counter:
        counts: Counter = Counter()
        rows_by_tables: dict[int, tuple] = {}
        made, tables, rows = self._parts()
        if rows:
            rows_by_tables[id(tables)] = (tables, rows)
        for comp in made:
            if comp.is_built:
                counts.update(map(of_instruction, comp.instructions))
            else:
                rows_by_tables.setdefault(id(comp.tables), (comp.tables, []))[1].append(comp.row)
        for tables, rows in rows_by_tables.values():
            counts.update(getattr(tables, column)(rows))
        return counts

    def to_text(self) -> str:
        """HLO text that XLA's parser reads back into the same module."""
        return module_to_text(self)

    def __repr__(self):
        return f"<HloModule {self.name}: {len(self.computations)} computations, {self.instruction_count} instructions>"


def pick_module(modules: list[Module], name: str | None = None) -> Module:
    """The module named `name` among `modules` (those of one file or text), or the only one when `name` is None;
    ValueError naming the modules found otherwise."""
    if name is None:
        if len(modules) != 1:
            names = ", ".join(m.name for m in modules)
            raise ValueError(f"the source holds {len(modules)} modules ({names}); pick one with module=NAME")
        return modules[0]
    for m in modules:
        if m.name == name:
            return m
    raise ValueError(f"no module named {name!r}; found: {', '.join(m.name for m in modules)}")
