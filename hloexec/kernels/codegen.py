"""What both kernel generators (`kernels/fusion.py`: a fused computation as one loop nest; `kernels/program.py`:
a control-flow region as one function) share: declining, constants as a kernel sees them, row-major strides,
index expressions folded when they hold no name (`Ix`), and the module text around a generated `kernel`
function (loaded through `kernels/cache.py`)."""
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
    head = [f"# hloexec {kind} kernel (generated; helpers {helpers_hash()})",
            "from numba import njit",
            "from hloexec.kernels.scalar import (" + ", ".join(ew.HELPERS) + ")",
            "",
            "",
            "@njit(cache=True, error_model='numpy', nogil=True)",
            f"def kernel({', '.join(params)}):"]
    return "\n".join(head + body) + "\n"


# -- index expressions ------------------------------------------------------------------------------------
def is_name(c) -> bool:
    """Whether index component `c` (source text) is a name (a loop variable, a computed index), not a literal."""
    return isinstance(c, str) and (c[0].isalpha() or c[0] == "_")


_INDEX_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod,
              ">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt, "==": operator.eq}


class Ix:
    """An integer index expression `a <op> b` (or comparison) over names, integer literals and other Ix, as
    the generators write it: `str()` is its source, parenthesized if `paren` (unparenthesized only where
    precedence keeps the meaning: a product inside a sum, a sum left of a subtraction or comparison);
    `folded()` its value when it holds no name (Python's integer semantics, which are the generated code's on
    these non-overflowing int64 indices: floor division and modulo)."""
    __slots__ = ("op", "a", "b", "paren")

    def __init__(self, op: str, a, b, paren: bool = True):
        self.op, self.a, self.b, self.paren = op, _operand(a), _operand(b), paren

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


def index_src(e) -> str:
    """The source of index expression `e` (an Ix, a name or a literal), folded to its value if it holds no name."""
    value = e.folded() if isinstance(e, Ix) else None
    return str(e if value is None else value)


_INT = re.compile(r"-?\d+")
_INT_START = frozenset("-0123456789")


def _operand(x):
    """An Ix operand: an Ix, an int, or source text ("3" is the literal 3; other text, a name or a call such as
    `np.int64(v3)`, stays as it is)."""
    return int(x) if isinstance(x, str) and x[0] in _INT_START and _INT.fullmatch(x) else x
