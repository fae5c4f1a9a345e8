"""The scalar meaning of HLO's elementwise ops: one definition per opcode and type class, two interpreters.
Converts, which go from one type to another, are a path of typed steps (`conversion`, at the end).

A definition (`DEFINITIONS[opcode][cls]`, cls one of "float", "signed", "unsigned", "pred") is a Python function
`(t, *operands) -> Expr` building an expression over a small vocabulary of primitives: Python operators
(+ - * & | ^ << >> ~ unary -, comparisons), `where(c, a, b)`, casts (`U`, `S`: the same bits as an unsigned /
signed integer of the type's width; `T`: back to the compute type), typed constants (`t.INT_MIN`,
`t.ALL_ONES`, `t.BITS`, and Python numbers taking the type of the other operand) and the calls of `PRIMITIVES`
(`trunc_div`, `isnan`, `copysign`, `exp`...). It is written once and read twice:

* `numpy_form(opcode, cls, dtype, bits)` (kernels/numpy_form.py): a callable on numpy arrays of the compute dtype (what the op-by-op
  tier, ops/elementwise.py, runs); a definition that is one numpy function of its operands (add, exp, a
  compare) is that function, any other a generated Python function (its `.source`). Eager: both sides of a `where` may be computed (on large arrays only the one
  taken when its condition is all true or all false), so a definition must be safe on the values the
  `where` discards -- it divides by `where(b == 0, 1, b)`, shifts by an amount masked to the width.
* `numba_src(opcode, cls, name, *operand_sources, ...)`: the source of one element in a generated Numba kernel (what
  kernels/elementwise.py hands both generators); `where` becomes a lazy ternary.

The primitives are the only thing with two implementations ("the machine": `_numpy_calls` in numpy_form.py and the
numpy ufuncs of the operators; `_NUMBA_CALLS` and the Numba helpers in kernels/scalar.py); tests/test_semantics.py
checks that the two forms of every definition agree bit for bit on edge values. Plain Python: no Numba
import here.

Types inside an expression are tags: "T" (the compute type: a numpy int / float scalar or array; f16 / bf16 /
fp8 computed in f32, rounded by the caller), "U" / "S" (the unsigned / signed integer of the type's width,
in the numpy tier a sub-byte type's pattern of `bits` bits in its byte container) and "bool".
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import ml_dtypes
import numpy as np

from ..ir import opcodes
from ..ir.dtypes import ElementType, element_type

# -- the expression ------------------------------------------------------------------------------------------
# Operators -> the numpy ufunc of each (Numba: the operator itself).
_ARITH = {
    "+": "add",
    "-": "subtract",
    "*": "multiply",
    "/": "divide",
    "&": "bitwise_and",
    "|": "bitwise_or",
    "^": "bitwise_xor",
    "<<": "left_shift",
    ">>": "right_shift",
}
_COMPARE = {"==": "equal", "!=": "not_equal", "<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal"}


class Expr:
    """A node: `op` ("arg", "const", an operator, "where", "cast", "call"), its arguments, its type tag."""

    __slots__ = ("op", "args", "tag")

    def __init__(self, op: str, args: tuple, tag: str):
        self.op, self.args, self.tag = op, args, tag

    def _other(self, v):
        return v if isinstance(v, Expr) else Expr("const", (v,), self.tag)

    def _binary(self, op, other, reflected=False):
        a, b = (self._other(other), self) if reflected else (self, self._other(other))
        if a.tag != b.tag:
            raise TypeError(f"{op} of {a.tag} and {b.tag}")
        return Expr(op, (a, b), "bool" if op in _COMPARE else a.tag)

    def __add__(self, o):
        return self._binary("+", o)

    def __radd__(self, o):
        return self._binary("+", o, True)

    def __sub__(self, o):
        return self._binary("-", o)

    def __rsub__(self, o):
        return self._binary("-", o, True)

    def __mul__(self, o):
        return self._binary("*", o)

    def __rmul__(self, o):
        return self._binary("*", o, True)

    def __truediv__(self, o):
        return self._binary("/", o)

    def __rtruediv__(self, o):
        return self._binary("/", o, True)

    def __and__(self, o):
        return self._binary("&", o)

    def __or__(self, o):
        return self._binary("|", o)

    def __xor__(self, o):
        return self._binary("^", o)

    def __lshift__(self, o):
        return self._binary("<<", o)

    def __rshift__(self, o):
        return self._binary(">>", o)

    def __eq__(self, o):
        return self._binary("==", o)  # builds an expression: Exprs are not hashable

    def __ne__(self, o):
        return self._binary("!=", o)

    def __lt__(self, o):
        return self._binary("<", o)

    def __le__(self, o):
        return self._binary("<=", o)

    def __gt__(self, o):
        return self._binary(">", o)

    def __ge__(self, o):
        return self._binary(">=", o)

    def __neg__(self):
        return Expr("neg", (self,), self.tag)

    def __invert__(self):
        return Expr("~", (self,), self.tag)

    __hash__ = None  # type: ignore[assignment]  # == builds an Expr: an Expr is no dict key


def where(c: Expr, a, b) -> Expr:
    """a where c holds, else b (numpy: both may be computed; Numba: only the chosen one)."""
    if isinstance(a, Expr):
        b = a._other(b)
    else:
        a = b._other(a)
    if a.tag != b.tag or c.tag != "bool":
        raise TypeError(f"where({c.tag}, {a.tag}, {b.tag})")
    return Expr("where", (c, a, b), a.tag)


def U(x: Expr) -> Expr:
    """x's bits as an unsigned integer of the type's width."""
    return x if x.tag == "U" else Expr("cast", (x,), "U")


def S(x: Expr) -> Expr:
    """x's bits as a signed (two's complement) integer of the type's width."""
    return x if x.tag == "S" else Expr("cast", (x,), "S")


def T(x: Expr) -> Expr:
    """An integer pattern of the type's width (U or S) as the compute type."""
    return x if x.tag == "T" else Expr("cast", (x,), "T")


# Calls: name -> (result tag or None for the argument's, whether the result is exact in both tiers).
# "Approximate" ones are libm / numpy-SIMD functions whose two implementations may differ in the last bit.
PRIMITIVES = {
    "trunc_div": (None, True),  # integer a / b rounded toward zero; needs b != 0 and not INT_MIN / -1
    "trunc_rem": (None, True),  # integer a - b * trunc_div(a, b) (sign of a); the same preconditions
    "int_pow": (None, True),  # integer a ** b by squaring, wrapping; needs b >= 0
    # the larger / smaller: for floats IEEE 754-2019 maximum / minimum (as llvm.maximum, XLA:CPU): NaN if either
    # is NaN (the first), and -0 < +0
    "max": (None, True),
    "min": (None, True),
    "abs": (None, True),
    "floor": (None, True),
    "ceil": (None, True),
    "trunc": (None, True),
    "rint": (None, True),
    "sqrt": (None, True),
    "copysign": (None, True),
    "fmod": (None, True),
    "isnan": ("bool", True),
    "isfinite": ("bool", True),
    "popcount": (None, True),  # set bits of an unsigned value of the type's width
    "clz": (None, True),  # leading zero bits of an unsigned value of the type's width
    "total_order_key": ("S", True),  # float -> signed int whose order is IEEE totalOrder
    "cbrt": (None, False),
    "exp": (None, False),
    "expm1": (None, False),
    "log": (None, False),
    "log1p": (None, False),
    "sin": (None, False),
    "cos": (None, False),
    "tan": (None, False),
    "tanh": (None, False),
    "erf": (None, False),
    "power": (None, False),
    "arctan2": (None, False),
    "fma": (None, True),  # a * b + c rounded once (f32 only)
    "to_int": ("S", True),  # float -> the signed integer of its width, rounded toward zero; needs it in range
    "to_float": ("T", True),  # a signed integer of the type's width -> the float type (rounded)
    # x86's rsqrtss: 1 / sqrt(x) to 12 bits from the processor's own table (f32 only; both forms run it)
    "rsqrt_estimate": (None, True),
}
# The C library's f32 functions XLA:CPU calls for these ops (its LLVM IR's llvm.sin.f32... become calls of sinf...):
# both forms call the same function of this process's C library (kernels/scalar.py).
LIBM_F32 = {"sine": "sinf", "cosine": "cosf", "tan": "tanf", "atan2": "atan2f", "power": "powf", "cbrt": "cbrtf"}
PRIMITIVES.update(dict.fromkeys(LIBM_F32.values(), (None, True)))


def call(name: str, *args: Expr) -> Expr:
    tag, _ = PRIMITIVES[name]
    return Expr("call", (name, *args), tag or args[0].tag)


def _calls(name):
    return lambda *args: call(name, *args)


# the calls the definitions below spell by name (the others through `_fn`)
trunc_div, trunc_rem, int_pow, max_, min_, abs_, trunc, sqrt, copysign, isnan, total_order_key = map(
    _calls,
    ("trunc_div", "trunc_rem", "int_pow", "max", "min", "abs", "trunc", "sqrt", "copysign", "isnan", "total_order_key"),
)
fma, floor, to_int, to_float = map(_calls, ("fma", "floor", "to_int", "to_float"))


def exact(e: Expr) -> bool:
    """Whether both forms of `e` give the same bits (no approximate primitive in it)."""
    if e.op == "call":
        return PRIMITIVES[e.args[0]][1] and all(exact(a) for a in e.args[1:])
    return all(exact(a) for a in e.args if isinstance(a, Expr))


class TypeInfo:
    """What a definition knows of its element type: the named constants of its class and width (typed Exprs)."""

    def __init__(self, cls: str, bits: int):
        if cls in ("signed", "unsigned"):
            signed = cls == "signed"
            self.INT_MIN = self.c(-(1 << (bits - 1)) if signed else 0)
            self.ALL_ONES = self.c(-1 if signed else (1 << bits) - 1)
            # shift amounts are read as unsigned
            self.BITS = Expr("const", (bits,), "U")
            self.TOP_BIT = Expr("const", (bits - 1,), "U")

    @staticmethod
    def c(value) -> Expr:
        """A constant of the compute type."""
        return Expr("const", (value,), "T")


# -- the definitions -------------------------------------------------------------------------------------
def _signed_divide(t, x, y):
    # XLA: x / 0 = -1, INT_MIN / -1 = INT_MIN, else rounded toward zero.
    zero, overflow = y == 0, (x == t.INT_MIN) & (y == -1)
    return where(zero, -1, where(overflow, t.INT_MIN, trunc_div(x, where(zero | overflow, 1, y))))


def _unsigned_divide(t, x, y):
    zero = y == 0
    return where(zero, t.ALL_ONES, trunc_div(x, where(zero, 1, y)))


def _signed_remainder(t, x, y):
    # XLA: x % 0 = x, INT_MIN % -1 = 0 (x % -1 = 0 = x % 1); the sign of the dividend.
    zero = y == 0
    return where(zero, x, trunc_rem(x, where(zero | (y == -1), 1, y)))


def _unsigned_remainder(t, x, y):
    zero = y == 0
    return where(zero, x, trunc_rem(x, where(zero, 1, y)))


def _signed_power(t, x, y):
    # A negative exponent: 1 for base 1, +-1 for base -1 by the exponent's parity, else 0 (XLA:CPU).
    negative = y < 0
    return where(
        negative,
        where(x == 1, 1, where(x == -1, where((y & 1) != 0, t.c(-1), 1), 0)),
        int_pow(x, where(negative, 0, y)),
    )


def _shift_left(t, x, y):
    # The amount is read as unsigned: >= the width (a negative one too) gives 0.
    n = U(y)
    return where(n >= t.BITS, 0, T(U(x) << (n & t.TOP_BIT)))


def _shift_right_logical(t, x, y):
    n = U(y)
    return where(n >= t.BITS, 0, T(U(x) >> (n & t.TOP_BIT)))


def _shift_right_arithmetic(t, x, y):
    # An amount >= the width fills with the sign bit (a shift by width - 1).
    n = U(y)
    return T(S(x) >> S(where(n >= t.BITS, t.TOP_BIT, n)))


def _int_sign(t, x):
    return where(x > 0, 1, where(x < 0, t.c(-1), 0))


def _float_sign(t, x):
    # sign(+-0) = +-0, sign(NaN) = NaN, else +-1.
    return where(isnan(x) | (x == 0), x, copysign(x._other(1), x))


def _round_afz(t, x):
    # Round half away from zero (C round).
    r = trunc(x)
    return where(abs_(x - r) >= 0.5, r + copysign(x._other(1), x), r)


def _bits_op(prim):
    return lambda t, x: T(call(prim, U(x)))


def _fn(name):
    return lambda t, *xs: call(name, *xs)


def _op(f):
    return lambda t, *xs: f(*xs)


def _compare(direction: str, order: str):
    key = {"FLOAT": lambda x: x, "TOTALORDER": total_order_key, "SIGNED": S, "UNSIGNED": U}[order]
    test = {"EQ": "__eq__", "NE": "__ne__", "LT": "__lt__", "LE": "__le__", "GT": "__gt__", "GE": "__ge__"}[direction]
    return lambda t, x, y: getattr(key(x), test)(key(y))


DIRECTIONS = ("EQ", "NE", "LT", "LE", "GT", "GE")
# The orders of compare's type= attribute each class takes; pred compares False < True under its UNSIGNED.
_ORDERS = {"float": ("FLOAT", "TOTALORDER"), "signed": ("SIGNED", "UNSIGNED"), "unsigned": ("SIGNED", "UNSIGNED")}


def compare_opcode(direction: str, order: str) -> str:
    """The table's key of compare with direction= and type= (one of the class's `_ORDERS`)."""
    return f"compare {direction} {order}"


_FLOAT_SIMPLE_UNARY = ("floor", "ceil", "sqrt", "cbrt", "erf")
_FLOAT_CALLS = {
    "exponential": "exp",
    "exponential-minus-one": "expm1",
    "log": "log",
    "log-plus-one": "log1p",
    "sine": "sin",
    "cosine": "cos",
    "tan": "tan",
    "tanh": "tanh",
    "round-nearest-even": "rint",
}

DEFINITIONS: dict[str, dict[str, object]] = {
    # binary
    "add": {
        "float": _op(lambda x, y: x + y),
        "signed": _op(lambda x, y: x + y),
        "unsigned": _op(lambda x, y: x + y),
        "pred": _op(lambda x, y: x | y),
    },
    "subtract": {c: _op(lambda x, y: x - y) for c in ("float", "signed", "unsigned")},
    "multiply": {
        "float": _op(lambda x, y: x * y),
        "signed": _op(lambda x, y: x * y),
        "unsigned": _op(lambda x, y: x * y),
        "pred": _op(lambda x, y: x & y),
    },
    "divide": {"float": _op(lambda x, y: x / y), "signed": _signed_divide, "unsigned": _unsigned_divide},
    "remainder": {"float": _fn("fmod"), "signed": _signed_remainder, "unsigned": _unsigned_remainder},
    "power": {"float": _fn("power"), "signed": _signed_power, "unsigned": _op(int_pow)},
    "atan2": {"float": _fn("arctan2")},
    "maximum": {**{c: _op(max_) for c in ("float", "signed", "unsigned")}, "pred": _op(lambda x, y: x | y)},
    "minimum": {**{c: _op(min_) for c in ("float", "signed", "unsigned")}, "pred": _op(lambda x, y: x & y)},
    "and": {c: _op(lambda x, y: x & y) for c in ("signed", "unsigned", "pred")},
    "or": {c: _op(lambda x, y: x | y) for c in ("signed", "unsigned", "pred")},
    "xor": {c: _op(lambda x, y: x ^ y) for c in ("signed", "unsigned", "pred")},
    "shift-left": {c: _shift_left for c in ("signed", "unsigned")},
    "shift-right-logical": {c: _shift_right_logical for c in ("signed", "unsigned")},
    "shift-right-arithmetic": {c: _shift_right_arithmetic for c in ("signed", "unsigned")},
    # unary
    "abs": {"float": _op(abs_), "signed": _op(abs_), "unsigned": _op(lambda x: x)},
    "negate": {c: _op(lambda x: -x) for c in ("float", "signed", "unsigned")},
    "sign": {"float": _float_sign, "signed": _int_sign, "unsigned": lambda t, x: where(x > 0, 1, t.c(0))},
    "not": {c: _op(lambda x: ~x) for c in ("signed", "unsigned", "pred")},
    "copy": {c: _op(lambda x: x) for c in ("float", "signed", "unsigned", "pred")},
    "popcnt": {c: _bits_op("popcount") for c in ("signed", "unsigned")},
    "count-leading-zeros": {c: _bits_op("clz") for c in ("signed", "unsigned")},
    "round-nearest-afz": {"float": _round_afz},
    "rsqrt": {"float": _op(lambda x: 1 / sqrt(x))},
    # XLA expands logistic(x) to 1 / (1 + exp(-x)) (LogisticExpander, kExp form).
    "logistic": {"float": _op(lambda x: 1 / (call("exp", -x) + 1))},
    "is-finite": {"float": _fn("isfinite")},
    **{op: {"float": _fn(op)} for op in _FLOAT_SIMPLE_UNARY},
    **{op: {"float": _fn(fn)} for op, fn in _FLOAT_CALLS.items()},
    # clamp(lo, x, hi) = minimum(maximum(x, lo), hi)
    "clamp": {
        **{c: _op(lambda lo, x, hi: min_(max_(x, lo), hi)) for c in ("float", "signed", "unsigned")},
        "pred": _op(lambda lo, x, hi: hi & (x | lo)),
    },
    **{compare_opcode(d, "UNSIGNED"): {"pred": _compare(d, "FLOAT")} for d in DIRECTIONS},
    # select(p, a, b): a where p holds, else b -- any element type (complex and narrow floats as they are stored)
    "select": {"any": _op(where)},
}
for _cls, _orders in _ORDERS.items():
    for _order in _orders:
        for _d in DIRECTIONS:
            DEFINITIONS.setdefault(compare_opcode(_d, _order), {})[_cls] = _compare(_d, _order)


def arity(opcode: str) -> int:
    """A definition's operand count: its opcode's (ir/opcodes.py; the compare keys are compare's)."""
    return opcodes.elementwise_arity(opcode.split(" ", 1)[0])


def type_class(kind: str) -> str | None:
    """The definition class of an ir.dtypes kind ("float", "sint", "uint", "pred"); None for complex."""
    return {"float": "float", "sint": "signed", "uint": "unsigned", "pred": "pred"}.get(kind)


def defines(opcode: str, cls: str) -> bool:
    return bool({cls, "any"} & DEFINITIONS.get(opcode, {}).keys())


# Operands that are not of the op's type (the others are "T").
_OPERAND_TAGS = {"select": ("bool", "T", "T")}


@functools.cache
def expression(opcode: str, cls: str, bits: int, define=None) -> Expr:
    """The definition of `opcode` on type class `cls` of `bits` bits, applied to operands x0, x1, ...; `define`:
    another definition of it to apply (a device's approximation, kernels/approximations.py)."""
    t = TypeInfo(cls, bits)
    tags = _OPERAND_TAGS.get(opcode, ("T",) * arity(opcode))
    if define is None:
        definitions = DEFINITIONS[opcode]
        define = definitions.get(cls, definitions.get("any"))
    return define(t, *(Expr("arg", (i,), tag) for i, tag in enumerate(tags)))


# -- the Numba source interpreter --------------------------------------------------------------------------------
# Numba source of each call; {T} is the compute type's constructor.
_NUMBA_CALLS = {
    "trunc_div": "trunc_div({0}, {1})",
    "trunc_rem": "trunc_rem({0}, {1})",
    "int_pow": "int_pow({0}, {1}, {T}(1))",
    "max": "max({0}, {1})",
    "min": "min({0}, {1})",
    "abs": "abs({0})",
    "floor": "np.floor({0})",
    "ceil": "np.ceil({0})",
    "trunc": "np.trunc({0})",
    "rint": "np.rint({0})",
    "sqrt": "np.sqrt({0})",
    "copysign": "np.copysign({0}, {1})",
    "fmod": "np.fmod({0}, {1})",
    "isnan": "np.isnan({0})",
    "isfinite": "np.isfinite({0})",
    "popcount": "popcount({0})",
    "clz": "count_leading_zeros({0})",
    "cbrt": "np.cbrt({0})",
    "exp": "np.exp({0})",
    "expm1": "np.expm1({0})",
    "log": "np.log({0})",
    "log1p": "np.log1p({0})",
    "sin": "np.sin({0})",
    "cos": "np.cos({0})",
    "tan": "np.tan({0})",
    "tanh": "np.tanh({0})",
    "erf": "math.erf({0})",
    "power": "np.power({0}, {1})",
    "arctan2": "np.arctan2({0}, {1})",
    "total_order_key": "total_order_key{B}({0})",
    "fma": "fma_f32({0}, {1}, {2})",
    "to_int": "np.int{B}({0})",
    "to_float": "{T}({0})",
    "rsqrt_estimate": "rsqrt_estimate({0})",
    **{function: f"{function}({', '.join(f'{{{i}}}' for i in range(arity(op)))})" for op, function in LIBM_F32.items()},
}


# Floats: IEEE maximum / minimum (Python's max / min do not propagate NaN, nor order -0 < +0).
_NUMBA_FLOAT_CALLS = {"max": "fmax_nan({0}, {1})", "min": "fmin_nan({0}, {1})"}
# Unsigned operands need no sign fix-up (and Numba's helpers would mix them with signed literals: float64).
_NUMBA_UNSIGNED_CALLS = {"trunc_div": "{0} // {1}", "trunc_rem": "{0} % {1}"}


def _numba_ctor(tag: str, name: str, bits: int, compute: dict) -> str | None:
    if tag == "T":
        return None if name == "pred" else compute[name]
    return {"U": f"np.uint{bits}", "S": f"np.int{bits}"}.get(tag)


def numba_src(opcode: str, cls: str, name: str, *operands: str, compute: dict, bits: int, literal) -> str:
    """Source of `opcode` on element type `name` (of class `cls`, `bits` wide) applied to `operands` (sources of
    compute-type values that a snippet may repeat: names or literals). `compute` maps a type to its compute
    type's constructor, `literal(name, value)` renders a constant (kernels/elementwise.py passes both)."""
    e = expression(opcode, cls, bits)
    if cls == "float":
        bits = 64 if compute[name] == "np.float64" else 32  # the compute type's (f16 / bf16 held as float32)
    return _render(e, operands, cls, name, bits, compute, literal)


def _render(e: Expr, operands, cls, name, bits, compute, literal) -> str:
    r = functools.partial(_render, operands=operands, cls=cls, name=name, bits=bits, compute=compute, literal=literal)
    op, args = e.op, e.args
    ctor = _numba_ctor(e.tag, name, bits, compute)
    if op == "arg":
        return operands[args[0]]
    if op == "const":
        if e.tag == "bool" or (e.tag == "T" and name == "pred"):
            return "True" if args[0] else "False"
        return literal(name, args[0]) if e.tag == "T" else f"{ctor}({args[0]})"
    if op == "where":
        return f"({r(args[1])} if {r(args[0])} else {r(args[2])})"
    if op == "cast":
        if args[0].tag == "T" and compute[name] == ctor:
            return r(args[0])
        if cls == "float":  # a float's bits and back: a bitcast, not a conversion
            src, dst = ("f" if t == "T" else t.lower().replace("s", "i") for t in (args[0].tag, e.tag))
            return f"bitcast_{src}{bits}_to_{dst}{bits}({r(args[0])})"
        return f"{ctor}({r(args[0])})"
    if op == "call":
        if args[0] in _NUMBA_FLOAT_CALLS and cls == "float":
            src = _NUMBA_FLOAT_CALLS[args[0]].format(*map(r, args[1:]))
        elif args[0] in _NUMBA_UNSIGNED_CALLS and cls == "unsigned":
            src = _NUMBA_UNSIGNED_CALLS[args[0]].format(*map(r, args[1:]))
        else:
            src = _NUMBA_CALLS[args[0]].format(*map(r, args[1:]), T=compute[name], B=bits)
    elif op == "neg":
        src = f"-{r(args[0])}"
    elif op == "~":
        return f"(not {r(args[0])})" if ctor is None else f"{ctor}(~{r(args[0])})"
    else:
        src = f"{r(args[0])} {op} {r(args[1])}"
    if e.tag == "bool" or ctor is None:
        return f"({src})"
    return f"{ctor}({src})"


# -- conversions -------------------------------------------------------------------------------------------------
class Step(NamedTuple):
    """One step of a conversion, producing a value of element type `to`:
    "copy" (the same type), "nonzero" (to pred: x != 0), "wrap" (integer / pred -> integer: two's complement,
    pred as 0 / 1), "saturate" (float -> integer: NaN -> 0, at or beyond a bound -> that end of the range
    (`saturation_bounds`), else rounded toward zero), "round" (to a float or complex type: correctly rounded,
    exact when the value fits), "round-to-odd" (f64 -> f32 so that a second rounding to a narrower type is
    exact)."""

    kind: str
    to: ElementType


_F32 = element_type("f32")


def conversion(src: ElementType, dst: ElementType) -> tuple[Step, ...] | None:
    """How convert takes a value of type `src` to type `dst`, as XLA:CPU does it (measured); None where convert
    is not defined (complex -> real)."""
    if src is dst:
        return (Step("copy", dst),)
    if dst.kind == "pred":
        return (Step("nonzero", dst),)
    if src.kind == "complex" and dst.kind != "complex":
        return None
    if dst.kind in ("sint", "uint"):
        return (Step("saturate" if src.kind == "float" else "wrap", dst),)
    if dst.kind == "float" and dst.bits < 32:
        if src.kind != "float":
            return Step("round", _F32), Step("round", dst)  # integers: through f32, two roundings
        if src.name == "f64":
            # f64 -> f16 / bf16 rounds twice, through f32 (1 + 2^-11 + 2^-40 -> 1.0); f64 -> fp8 once
            return (Step("round", _F32) if dst.is_half_float else Step("round-to-odd", _F32)), Step("round", dst)
    return (Step("round", dst),)


def saturation_bounds(src: ElementType, dst: ElementType) -> tuple[float, float]:
    """The bounds of float -> integer saturation: the integer type's minimum and maximum rounded to the float type
    `src`, as floats (f4e2m1fn 6.0 -> s4 is 7: F(7) = 6; f32 2^31 -> s32 is INT_MAX: F(2^31 - 1) = 2^31). A bound
    the type cannot hold is NaN (no value reaches it)."""
    info = ml_dtypes.iinfo(dst.numpy)
    with np.errstate(over="ignore", invalid="ignore"):
        low, high = (float(np.array(v, np.float64).astype(src.numpy)) for v in (info.min, info.max))
    return low, high
