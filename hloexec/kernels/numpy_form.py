"""The numpy interpreter of the scalar semantics (kernels/semantics.py): `numpy_form(opcode, cls, dtype, bits)`,
a callable on numpy arrays of the compute dtype, which the op-by-op tier (ops/elementwise.py) runs; the
primitives' numpy forms (`_numpy_calls`, and the machine's own that kernels/scalar.py registers in
`MACHINE_UFUNCS`); and the integer / float bit views the ops share."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .semantics import _ARITH, _COMPARE, LIBM_F32, Expr, arity, expression


def as_unsigned(x: np.ndarray, bits: int) -> np.ndarray:
    """The low `bits` bits of integers x as unsigned integers of x's size (its bit pattern)."""
    u = x.view(np.dtype(f"u{x.dtype.itemsize}"))
    return u if bits == x.dtype.itemsize * 8 else u & u.dtype.type((1 << bits) - 1)


def as_signed(x: np.ndarray, bits: int) -> np.ndarray:
    """The low `bits` bits of integers x read as a two's complement number, in the signed type of x's size."""
    sdt = np.dtype(f"i{x.dtype.itemsize}")
    if bits == x.dtype.itemsize * 8:
        return x.view(sdt)
    sign = sdt.type(1 << (bits - 1))
    return (as_unsigned(x, bits).view(sdt) ^ sign) - sign


def float_total_order_key(x: np.ndarray) -> np.ndarray:
    """Floats -> same-size signed ints whose order is IEEE totalOrder (-NaN < -inf < ... < -0 < +0 < ... < NaN):
    negative floats get their magnitude bits flipped."""
    it = np.dtype(f"i{x.dtype.itemsize}")
    b = np.ascontiguousarray(x).view(it) if x.ndim else np.asarray(x).view(it)
    return b ^ ((b >> it.type(x.dtype.itemsize * 8 - 1)) & it.type(np.iinfo(it).max))


def _np_trunc_div(a, b):
    if a.dtype.kind == "u":
        return np.floor_divide(a, b)
    q, r = np.divmod(a, b)
    return q + ((r != 0) & ((a < 0) != (b < 0))).astype(q.dtype)  # floor -> toward zero


def _np_int_pow(a, b):
    """a ** b (b >= 0) by squaring, wrapping, elementwise."""
    acc = np.ones(np.broadcast_shapes(np.shape(a), np.shape(b)), a.dtype)
    base = np.broadcast_to(a, acc.shape).copy()
    e = np.broadcast_to(b, acc.shape).copy()
    one = e.dtype.type(1)
    while e.any():  # ufuncs, not operators: numpy scalars (0-d operands) then wrap without a warning
        acc = np.where(np.bitwise_and(e, one).astype(bool), np.multiply(acc, base), acc)
        base = np.multiply(base, base)
        e = np.right_shift(e, one)
    return acc


def _np_bit_length(u, bits: int):
    """Number of significant bits of unsigned `u` (0 for 0): a binary search over the `bits` bits."""
    x = np.array(u, copy=True)
    n = np.zeros(x.shape, x.dtype)
    s = bits // 2
    while s >= 1:
        hi = x >> x.dtype.type(s)
        m = hi != 0
        x = np.where(m, hi, x)
        n += np.where(m, x.dtype.type(s), x.dtype.type(0))
        s //= 2
    return n + (x != 0).astype(x.dtype)


def _erf(x):
    from scipy import special

    return special.erf(x).astype(x.dtype, copy=False)


def _np_maximum(a, b):
    """IEEE 754-2019 maximum: np.maximum (NaN-propagating) with +0 > -0 (+0 + -0 = +0)."""
    r = np.maximum(a, b)
    z = (a == 0) & (b == 0)
    return np.where(z, a + b, r) if z.any() else r


def _np_minimum(a, b):
    """IEEE 754-2019 minimum: np.minimum (NaN-propagating) with -0 < +0 (-((-0) + (-(+0))) = -0)."""
    r = np.minimum(a, b)
    z = (a == 0) & (b == 0)
    return np.where(z, -((-a) + (-b)), r) if z.any() else r


def _np_fma32(a, b, c):
    """a * b + c rounded once to float32: the product and the sum's rounding error (TwoSum) are exact in float64;
    where the float64 sum is inexact and falls on the midpoint of two float32 values, it moves one float64 step
    toward the exact sum first (no double rounding)."""
    p = np.multiply(a, b, dtype=np.float64)
    c = np.asarray(c, np.float64)
    s = p + c
    pc = s - p
    error = (p - (s - pc)) + (c - pc)
    r = s.astype(np.float32)
    near = r.astype(np.float64)
    side = np.nextafter(r, np.where(s > near, np.float32(np.inf), np.float32(-np.inf))).astype(np.float64)
    tie = (error != 0) & (s != near) & (s - near == side - s)
    if tie.any():
        nudged = np.nextafter(s, np.where(error > 0, np.inf, -np.inf)).astype(np.float32)
        r = np.where(tie, nudged, r)
    return r


def _numpy_calls(bits: int, floats: bool):
    return {
        "trunc_div": _np_trunc_div,
        "trunc_rem": np.fmod,
        "int_pow": _np_int_pow,
        "max": _np_maximum if floats else np.maximum,
        "min": _np_minimum if floats else np.minimum,
        "abs": np.abs,
        "floor": np.floor,
        "ceil": np.ceil,
        "trunc": np.trunc,
        "rint": np.rint,
        "sqrt": np.sqrt,
        "copysign": np.copysign,
        "fmod": np.fmod,
        "isnan": np.isnan,
        "isfinite": np.isfinite,
        "popcount": lambda u: np.bitwise_count(u).astype(u.dtype),
        "clz": lambda u: u.dtype.type(bits) - _np_bit_length(u, bits),
        "total_order_key": float_total_order_key,
        "cbrt": np.cbrt,
        "exp": np.exp,
        "expm1": np.expm1,
        "log": np.log,
        "log1p": np.log1p,
        "sin": np.sin,
        "cos": np.cos,
        "tan": np.tan,
        "tanh": np.tanh,
        "erf": _erf,
        "power": np.power,
        "arctan2": np.arctan2,
        "fma": _np_fma32,
        "to_int": lambda x: x.astype(f"i{bits // 8}"),
        "to_float": lambda s: s.astype(f"f{bits // 8}"),
        "rsqrt_estimate": _machine("rsqrt_estimate"),
        **{name: _machine(name) for name in LIBM_F32.values()},
    }


# The primitives only the machine has (the C library's sinf..., rsqrtss) have no numpy form of their own: their
# Numba helpers as ufuncs, which kernels/scalar.py registers here when it is imported (this table stays below it).
MACHINE_UFUNCS: dict = {}


def _machine(name: str):
    def call(*xs):
        if name not in MACHINE_UFUNCS:
            raise RuntimeError(f"the machine primitive {name} is registered by hloexec.kernels.scalar: import it first")
        return MACHINE_UFUNCS[name](*xs)

    return call


# From this many elements on, a where whose condition is all true or all false computes only the branch it takes
# (maximum: x + y only where both are zeros); below, checking costs more than it saves.
LAZY_WHERE_MIN_SIZE = 4096


def _taken(c) -> tuple[int, np.ndarray]:
    """Which branches a where needs: 1 only the first (c all true), -1 only the second (all false), 0 both; and
    the condition."""
    if np.size(c) >= LAZY_WHERE_MIN_SIZE:
        if not c.any():
            return -1, c
        if c.all():
            return 1, c
    return 0, c


def _count_uses(e: Expr, uses: dict) -> None:
    uses[id(e)] = uses.get(id(e), 0) + 1
    if uses[id(e)] == 1:
        for a in e.args:
            if isinstance(a, Expr):
                _count_uses(a, uses)


class _NumpySource:
    """Writes an expression as a Python function of numpy arrays (generated source: a call costs the numpy calls
    and little else). A node used once is written inside its user's expression, so numpy frees its array as soon
    as that is computed; a node used more than once gets a name, assigned where the first path needing it does
    (inside a `where`'s branch it is known to that branch only). A `where` on a large array whose condition is
    all true or all false computes only the branch it takes."""

    def __init__(self, dtype: np.dtype, bits: int, uses: dict):
        self.dtypes = {"T": dtype, "bool": np.dtype(np.bool_)}
        if dtype.kind in "iuf":  # the integer patterns of the type's width
            self.dtypes.update(U=np.dtype(f"u{dtype.itemsize}"), S=np.dtype(f"i{dtype.itemsize}"))
        self.bits, self.uses, self.calls = bits, uses, _numpy_calls(bits, dtype.kind in "fc")
        self.globals = {"np": np, "taken": _taken}
        self.lines: list[str] = []
        self.known: dict[int, str] = {}  # id(node) -> the name holding its value on the current path
        self.indent = 1

    def value(self, obj, prefix: str) -> str:
        """A name for `obj` among the generated function's globals."""
        name = f"{prefix}{len(self.globals)}"
        self.globals[name] = obj
        return name

    def line(self, text: str) -> None:
        self.lines.append("    " * self.indent + text)

    def emit(self, e: Expr) -> str:
        """An expression text for node `e`, statements it needs written first."""
        if id(e) in self.known:
            return self.known[id(e)]
        text = self._emit(e)
        if self.uses[id(e)] > 1 and e.op not in ("arg", "const"):
            name = f"t{len(self.lines)}"
            self.line(f"{name} = {text}")
            self.known[id(e)] = text = name
        return text

    def _emit(self, e: Expr) -> str:
        op, args = e.op, e.args
        if op == "arg":
            return f"x{args[0]}"
        if op == "const":
            return self.value(self.dtypes[e.tag].type(args[0]), "c")
        if op == "where":
            return self._where(*args)
        if op == "cast":
            return self._cast(args[0].tag, e.tag, self.emit(args[0]))
        fn, operands = self.function(e)
        return f"{self.value(fn, 'f')}({', '.join(self.emit(a) for a in operands)})"

    def _where(self, c: Expr, a: Expr, b: Expr) -> str:
        at = len(self.lines)
        taken, va, vb = f"k{at}", f"a{at}", f"b{at}"
        self.line(f"{taken} = taken({self.emit(c)})")
        cond = f"{taken}[1]"
        for test, name, node in ((">= 0", va, a), ("<= 0", vb, b)):
            self.line(f"if {taken}[0] {test}:")
            known, self.indent = dict(self.known), self.indent + 1
            self.line(f"{name} = {self.emit(node)}")
            self.known, self.indent = known, self.indent - 1
        result = f"w{at}"
        self.line(f"{result} = {va} if {taken}[0] > 0 else {vb} if {taken}[0] < 0 else np.where({cond}, {va}, {vb})")
        self.line(f"{va} = {vb} = {taken} = None")  # numpy frees what only the where needed
        return result

    def function(self, e: Expr):
        """The numpy function of an operator or call node, and its operand nodes."""
        if e.op == "call":
            return self.calls[e.args[0]], e.args[1:]
        if e.op == "neg":
            return np.negative, e.args
        if e.op == "~":
            return np.invert, e.args
        return getattr(np, _ARITH.get(e.op) or _COMPARE[e.op]), e.args

    def _cast(self, src: str, dst: str, x: str) -> str:
        if src == "T" and self.dtypes["T"].kind == {"U": "u", "S": "i"}.get(dst):
            return x  # already that (a sub-byte value is held extended)
        if dst in ("U", "S"):
            return f"{self.value(as_unsigned if dst == 'U' else as_signed, 'f')}({x}, {self.bits})"
        return f"{x}.view({self.value(self.dtypes['T'], 'd')})"  # an integer pattern back to the type


def _is_operand(e: Expr, i: int, dtype: np.dtype) -> bool:
    """Whether node `e` is operand `i` as it is: the operand itself, or its cast to the pattern type it already
    has (a signed compare of a signed type: S(x) is x)."""
    if e.op == "cast" and e.args[0].tag == "T" and dtype.kind == {"U": "u", "S": "i"}.get(e.tag):
        e = e.args[0]
    return e.op == "arg" and e.args[0] == i


def _as_result(r, xs: tuple) -> np.ndarray:
    """The kernel's result where it differs from its operands' shape (a where that chose a constant, or scalar
    operands: clamp's bounds) or is one of them."""
    shape = np.broadcast_shapes(*(np.shape(x) for x in xs))
    if r.shape != shape:
        return np.array(np.broadcast_to(r, shape), order="C")
    return r.copy() if any(r is x for x in xs) else r


def _numpy_function(e: Expr, n: int, dtype: np.dtype, bits: int, name: str):
    uses: dict = {}
    _count_uses(e, uses)
    source = _NumpySource(dtype, bits, uses)
    if e.op == "where" and all(_is_operand(a, i, dtype) for i, a in enumerate(e.args)):
        return np.where  # select: its operands are computed already, nothing to skip
    if e.op not in ("arg", "const", "where", "cast"):
        fn, operands = source.function(e)
        if len(operands) == n and all(_is_operand(a, i, dtype) for i, a in enumerate(operands)):
            return fn  # one numpy function of the operands in order (add, exp, compare...): that function
    xs = [f"x{i}" for i in range(n)]
    if dtype.kind in "fc":  # overflow in a discarded branch of a where (x + y of maximum)
        source.line("with np.errstate(all='ignore'):")
        source.indent += 1
    source.line(f"r = np.asarray({source.emit(e)})")
    source.indent = 1
    same = " and ".join(f"r.shape == np.shape({x}) and r is not {x}" for x in xs)
    source.line(f"return r if {same} else as_result(r, ({', '.join(xs)},))")
    source.globals["as_result"] = _as_result
    text = "\n".join([f"def kernel({', '.join(xs)}):", *source.lines])
    exec(compile(text, f"<numpy form of {name}>", "exec"), source.globals)
    kernel: Any = source.globals["kernel"]  # the function just generated, carrying its text for error reports
    kernel.source = text
    return kernel


@functools.cache
def numpy_form(opcode: str, cls: str, dtype: np.dtype, bits: int, define=None):
    """The numpy function of `opcode` on arrays of `dtype` (the compute dtype of type class `cls`; a sub-byte
    type's byte container, `bits` its width). Returns an array of `dtype` (bool for compares). `define`: another
    definition of it (see `expression`)."""
    return _numpy_function(
        expression(opcode, cls, bits, define),
        arity(opcode),
        np.dtype(dtype),
        bits,
        f"{opcode} on {np.dtype(dtype)}{'' if define is None else ' (' + define.__name__ + ')'}",
    )
