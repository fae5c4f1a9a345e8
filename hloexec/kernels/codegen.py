"""What both kernel generators (`kernels/fusion.py`: a fused computation as one loop nest; `kernels/program.py`:
a control-flow region as one function) share: declining, constants as a kernel sees them, row-major strides,
the blocks the source is assembled from (`Block`), index expressions folded when they hold no name (`Ix`),
and the module text around a generated `kernel` function (loaded through `kernels/cache.py`)."""

from __future__ import annotations

import operator
import re

import numpy as np

from ..errors import TierUnsupported
from . import elementwise as ew
from .cache import helpers_hash


def need(cond, why: str):
    """Decline the computation (TierUnsupported) unless `cond` holds."""
    if not cond:
        raise TierUnsupported(why)


def scalar_literal(inst):
    """A rank-0 constant's value as a Python number."""
    return np.asarray(inst.literal).reshape(()).item()


def constant_storage(inst) -> np.ndarray:
    """An array constant as a kernel sees it: C-contiguous, in its storage type (f16/bf16 as uint16)."""
    et = inst.shape.element_type
    arr = np.ascontiguousarray(np.asarray(inst.literal).reshape(inst.shape.dims))
    storage = ew.STORAGE[et.name]
    return arr.view(storage) if et.is_half_float else arr.astype(storage, copy=False)


def row_major_strides(dims) -> list[int]:
    """Element strides of a row-major array of `dims`."""
    strides, s = [], 1
    for d in reversed(dims):
        strides.append(s)
        s *= d
    return strides[::-1]


def kernel_module(kind: str, params: list[str], body: list[str]) -> str:
    """The source of a module defining `kernel(*params)` with `body` (lines indented one level), jitted with the
    disk cache on and the scalar helpers imported; its first line names the helpers' hash (see kernels/cache.py)."""
    approximations = [h for h in ew.XLA_CPU_HELPERS.values() if any(f"{h}(" in line for line in body)]
    head = [
        f"# hloexec {kind} kernel (generated; helpers {helpers_hash()})",
        "from numba import njit",
        "from hloexec.kernels.scalar import (" + ", ".join(ew.HELPERS + tuple(approximations)) + ")",
        "",
        "",
        "@njit(cache=True, error_model='numpy', nogil=True)",
        f"def kernel({', '.join(params)}):",
    ]
    return "\n".join(head + body) + "\n"


# -- blocks ------------------------------------------------------------------------------------------------
class Block:
    """A block of generated source: header lines (`for i1 in range(48):`; none for the function body), then
    items -- source lines (anything whose str() is one) and child blocks -- one level deeper (`pass` if none).
    Statements go in at `insert_pos`: a child being built keeps it before itself, so what is placed in this
    block meanwhile (a value hoisted out of the child) precedes the child. `trips`: executions of the block
    per execution of its parent; `is_guard`: an `if` whose guarded loads may not be hoisted out of it."""

    __slots__ = ("parent", "header", "items", "insert_pos", "depth", "trips", "is_guard")

    def __init__(
        self, parent: Block | None = None, header: tuple[str, ...] = (), trips: int = 1, is_guard: bool = False
    ):
        self.parent = parent
        self.header = header
        self.items: list = []
        self.insert_pos = 0
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.trips = trips
        self.is_guard = is_guard

    def insert(self, item):
        """Add a line (or a finished block) at the insert position; the next one goes after it."""
        self.items.insert(self.insert_pos, item)
        self.insert_pos += 1

    def open(self, header: str, *, trips: int = 1, is_guard: bool = False) -> Block:
        """A new child block at the insert position, which stays before it until `close(child)`."""
        child = Block(self, (header,), trips, is_guard)
        self.items.insert(self.insert_pos, child)
        return child

    def close(self, child: Block):
        """Statements placed here from now on go after `child`."""
        self.insert_pos = self.items.index(child, self.insert_pos) + 1  # (it is at insert_pos)

    def insert_before(self, child: Block, item):
        """Add `item` just before child block `child` (an allocation moved out of a loop)."""
        at = self.items.index(child)
        self.items.insert(at, item)
        if self.insert_pos > at:
            self.insert_pos += 1

    def take(self, kind: type, pred, taken: list | None = None) -> list:
        """Remove the items of type `kind` (not a Block) for which `pred` holds from this block and the blocks
        inside it; they are returned in source order."""
        taken = [] if taken is None else taken
        gone = []
        for k, item in enumerate(self.items):
            if isinstance(item, kind):
                if pred(item):
                    taken.append(item)
                    gone.append(k)
            elif isinstance(item, Block):
                item.take(kind, pred, taken)
        if gone:
            for k in reversed(gone):
                del self.items[k]
            self.insert_pos -= sum(k < self.insert_pos for k in gone)
        return taken

    def total_trips(self) -> int:
        """Executions of this block per call of the function."""
        t = 1
        b: Block | None = self
        while b is not None:
            t *= b.trips
            b = b.parent
        return t

    def render(self, indent: int = 0, out: list[str] | None = None) -> list[str]:
        """The source lines, the header indented `indent` levels (4 spaces each)."""
        out = [] if out is None else out
        pad = "    " * indent
        out += [pad + line for line in self.header]
        inner = indent + 1 if self.header else indent
        pad = "    " * inner
        if not self.items:
            out.append(pad + "pass")
        for item in self.items:
            if isinstance(item, Block):
                item.render(inner, out)
            else:
                out.append(f"{pad}{item}")
        return out


def innermost(outermost: Block, names, defined_in: dict) -> Block:
    """The deepest of `outermost` and the blocks `defined_in` maps `names` to (all on one path from the root;
    names it lacks are skipped): the outermost block in which all those names are defined -- where a statement
    using them goes (loop-invariant code motion)."""
    best = outermost
    for name in names:
        b = defined_in.get(name)
        if b is not None and b.depth > best.depth:
            best = b
    return best


# -- index expressions ------------------------------------------------------------------------------------
def is_name(c) -> bool:
    """Whether index component `c` (source text) is a name (a loop variable, a computed index), not a literal."""
    return isinstance(c, str) and (c[0].isalpha() or c[0] == "_")


_INDEX_OPS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "//": operator.floordiv,
    "%": operator.mod,
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
}


class Ix:
    """An integer index expression `a <op> b` (or comparison) over names, integer literals and other Ix, as
    the generators write it: `str()` is its source, parenthesized if `paren` (unparenthesized only where
    precedence keeps the meaning: a product inside a sum, a sum left of a subtraction or comparison);
    `folded()` its value when it holds no name (Python's integer semantics, which are the generated code's on
    these non-overflowing int64 indices: floor division and modulo)."""

    __slots__ = ("op", "a", "b", "paren")

    def __init__(self, op: str, a, b, paren: bool = True):
        self.op, self.a, self.b, self.paren = op, index_operand(a), index_operand(b), paren

    def __str__(self):
        s = f"{self.a} {self.op} {self.b}"
        return f"({s})" if self.paren else s

    def names(self) -> list[str]:
        return [n for x in (self.a, self.b) for n in (x.names() if isinstance(x, Ix) else [x] if is_name(x) else [])]

    def folded(self):
        """The value (an int, a bool for a comparison), or None if the expression holds a name."""
        a = self.a.folded() if isinstance(self.a, Ix) else self.a
        b = self.b.folded() if isinstance(self.b, Ix) else self.b
        if isinstance(a, int) and isinstance(b, int):
            return _INDEX_OPS[self.op](a, b)
        return None


_NAME = re.compile(r"[A-Za-z_]\w*")


def names_in(e) -> list[str]:
    """The identifiers index expression or source text `e` uses (a generator keeps those it defined: its names'
    blocks say where a statement using them may go)."""
    return e.names() if isinstance(e, Ix) else _NAME.findall(str(e))


def index_src(e) -> str:
    """The source of index expression `e` (an Ix, a name or a literal), folded to its value if it holds no name."""
    value = e.folded() if isinstance(e, Ix) else None
    return str(e if value is None else value)


_INT = re.compile(r"-?\d+")
_INT_START = frozenset("-0123456789")


def index_operand(x):
    """An Ix operand: an Ix, an int, or source text ("3" is the literal 3; other text, a name or a call such as
    `np.int64(v3)`, stays as it is)."""
    return int(x) if isinstance(x, str) and x[0] in _INT_START and _INT.fullmatch(x) else x
