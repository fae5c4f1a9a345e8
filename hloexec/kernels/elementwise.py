"""Elementwise ops as Numba source snippets for the generated kernels (plain Python: no Numba import here).

`unary_src`, `binary_src`, `compare_src`, `select_src`, `clamp_src`, `convert_src`, `bitcast_convert_src` return
a Python expression (source text) computing one element, used by both generators (kernels/fusion.py,
kernels/program.py); operand sources must be simple names or literals (a snippet may repeat them). What an op
means -- unary, binary, compare, clamp, select, convert's steps -- is the scalar-semantics table's
(kernels/semantics.py), which the op-by-op tier (ops/elementwise.py) reads too; this module renders it in the
kernels' types and adds what is the compiled tier's own: f16 / bf16 held as float32 and stored as uint16
(`load_src`, `store_src`, `round_src`), the vectorizable transcendentals (`_WIDE_UNARY`), bitcasts between the
kernels' types. The rounding rule of add / multiply reductions (the `reductions` option: `accumulates_in_f32`,
`in_order`, `reducer_step_src`) is defined here too, for the generators and the op-by-op tier
(ops/reduction.py) alike.

Values inside a kernel are carried in their *compute type*: pred -> bool, sN/uN -> numpy int scalars,
f32 / f64 -> float32 / float64, and f16 / bf16 -> float32 holding a value already rounded to the type
(the caller applies `round_src` after every op unless excess precision is allowed). Every snippet
casts its result to the compute type explicitly, so Numba's integer promotion (int32 + int32 -> int64)
and float32 -> float64 promotion never leak: wrap-around and f32 rounding match XLA.
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.compiled_for import ynn_computations
from ..ir.dtypes import element_type
from . import approximations, semantics

# Element types the kernels handle, and the numpy constructor of each one's compute type.
COMPUTE = {
    "pred": "np.bool_",
    "s8": "np.int8",
    "s16": "np.int16",
    "s32": "np.int32",
    "s64": "np.int64",
    "u8": "np.uint8",
    "u16": "np.uint16",
    "u32": "np.uint32",
    "u64": "np.uint64",
    "f16": "np.float32",
    "bf16": "np.float32",
    "f32": "np.float32",
    "f64": "np.float64",
}
# The dtype a kernel sees for an array of each type (f16 / bf16 as uint16 bit patterns).
STORAGE = {
    k: np.dtype(v)
    for k, v in {
        "pred": np.bool_,
        "s8": np.int8,
        "s16": np.int16,
        "s32": np.int32,
        "s64": np.int64,
        "u8": np.uint8,
        "u16": np.uint16,
        "u32": np.uint32,
        "u64": np.uint64,
        "f16": np.uint16,
        "bf16": np.uint16,
        "f32": np.float32,
        "f64": np.float64,
    }.items()
}
BITS = {
    "s8": 8,
    "s16": 16,
    "s32": 32,
    "s64": 64,
    "u8": 8,
    "u16": 16,
    "u32": 32,
    "u64": 64,
    "f16": 16,
    "bf16": 16,
    "f32": 32,
    "f64": 64,
    "pred": 8,
}
FLOATS = ("f16", "bf16", "f32", "f64")
SIGNED = ("s8", "s16", "s32", "s64")
UNSIGNED = ("u8", "u16", "u32", "u64")
INTS = SIGNED + UNSIGNED

# Ops whose result on values already rounded to f16 / bf16 is exactly representable again: no rounding.
EXACT_OPS = frozenset(
    {
        "abs",
        "negate",
        "sign",
        "copy",
        "select",
        "clamp",
        "maximum",
        "minimum",
        "ceil",
        "floor",
        "round-nearest-afz",
        "round-nearest-even",
    }
)
COMPARE_OPS = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}


def supported_type(name: str) -> bool:
    return name in COMPUTE


def ctype(name: str) -> str:
    return COMPUTE[name]


def _unsigned(name: str) -> str:
    return f"np.uint{BITS[name]}"


def _int_min(name: str) -> int:
    return -(1 << (BITS[name] - 1)) if name in SIGNED else 0


def _int_max(name: str) -> int:
    return (1 << (BITS[name] - 1)) - 1 if name in SIGNED else (1 << BITS[name]) - 1


def literal_src(name: str, value) -> str:
    """Source of a scalar constant of element type `name`, in its compute type."""
    T = COMPUTE[name]
    if name == "pred":
        return "True" if bool(value) else "False"
    if name in INTS:
        return f"{T}({int(value)})"
    v = float(value)
    if name in ("f16", "bf16", "f32"):
        v = float(np.float32(v))
    if math.isnan(v):
        return f"{T}(np.nan)"
    if math.isinf(v):
        return f"{T}({'-' if v < 0 else ''}np.inf)"
    return f"{T}({v!r})"


def round_src(name: str, expr: str, excess_precision: bool = False) -> str:
    """Round a value computed in f32 to f16 / bf16 (identity for other types or with excess precision)."""
    if excess_precision:
        return expr
    if name == "f16":
        return f"round_f16({expr})"
    if name == "bf16":
        return f"round_bf16({expr})"
    return expr


def load_src(name: str, expr: str, simd: bool = False) -> str:
    """An array element (storage type) -> its compute-type value; `simd`: in a loop LLVM vectorizes."""
    if name == "f16":
        return f"f16_to_f32_simd({expr})" if simd else f"f16_to_f32({expr})"
    if name == "bf16":
        return f"bf16_to_f32({expr})"
    return expr


def store_src(name: str, expr: str) -> str:
    """A compute-type value -> what is stored in the output array."""
    if name == "f16":
        return f"f32_to_f16({expr})"
    if name == "bf16":
        return f"f32_to_bf16({expr})"
    return expr


# XLA:CPU's f32 approximations (transcendentals = "xla-cpu"): the Numba helper of each (kernels/scalar.py makes
# them from approximations.approximation_src at their first import; a kernel imports those it calls, codegen.py)
XLA_CPU_HELPERS = {op: "xla_cpu_" + op.replace("-", "_") for op in approximations.XLA_CPU_APPROXIMATIONS}

# Names generated kernels import from hloexec.kernels.scalar (the Numba helpers the snippets call).
HELPERS = (
    "np",
    "math",
    "fmax_nan",
    "fmin_nan",
    "trunc_div",
    "trunc_rem",
    "int_pow",
    "total_order_key32",
    "total_order_key64",
    "popcount",
    "count_leading_zeros",
    "f16_to_f32",
    "f32_to_f16",
    "bf16_to_f32",
    "f32_to_bf16",
    "round_f16",
    "round_bf16",
    "bitcast_f32_to_i32",
    "bitcast_f32_to_u32",
    "bitcast_i32_to_f32",
    "bitcast_u32_to_f32",
    "bitcast_f64_to_i64",
    "bitcast_f64_to_u64",
    "bitcast_i64_to_f64",
    "bitcast_u64_to_f64",
    "exp_wide",
    "expm1_wide",
    "log_wide",
    "log1p_wide",
    "tanh_wide",
    "logistic_wide",
    "narrow_to_f16",
    "narrow_to_bf16",
    "f16_to_f32_simd",
    "stack_array",
    "add_lanes",
)


# -- the ops of the scalar-semantics table (kernels/semantics.py) ---------------------------------------------
_CLASS = {
    **dict.fromkeys(FLOATS, "float"),
    **dict.fromkeys(SIGNED, "signed"),
    **dict.fromkeys(UNSIGNED, "unsigned"),
    "pred": "pred",
}


def _table_src(opcode: str, name: str, *vals: str) -> str | None:
    if name not in COMPUTE or not semantics.defines(opcode, _CLASS[name]) or semantics.arity(opcode) != len(vals):
        return None
    return semantics.numba_src(opcode, _CLASS[name], name, *vals, compute=COMPUTE, bits=BITS[name], literal=literal_src)


# Transcendentals of f32 / f16 / bf16 values, an implementation choice of the compiled tier: straight-line
# helpers computing in f64 (kernels/scalar.py), which LLVM vectorizes (a libm call costs several ns an element
# and keeps the whole loop scalar), their result rounded once to the type -- no double rounding through f32 for
# f16 / bf16, which therefore come out rounded with excess precision too. Correctly rounded; 1 ULP off only when
# the exact value lies within 2**-51 of a rounding boundary. f64 takes the table's definition (libm calls).
_WIDE_UNARY = {
    "exponential": "exp_wide",
    "exponential-minus-one": "expm1_wide",
    "log": "log_wide",
    "log-plus-one": "log1p_wide",
    "tanh": "tanh_wide",
    "logistic": "logistic_wide",
}
_NARROW = {"f32": "np.float32", "f16": "narrow_to_f16", "bf16": "narrow_to_bf16"}


def unary_src(opcode: str, name: str, x: str, transcendentals: str = "accurate") -> str | None:
    """Source of a unary elementwise op on a value of element type `name` (result in the same type), f32
    transcendentals by the `transcendentals` rule (hloexec.options.devices.TRANSCENDENTALS)."""
    if approximations.approximated(opcode, name, transcendentals):
        return f"{XLA_CPU_HELPERS[opcode]}({x})"
    if name in _NARROW and opcode in _WIDE_UNARY:
        return f"{_NARROW[name]}({_WIDE_UNARY[opcode]}({x}))"
    return _table_src(opcode, name, x)


def binary_src(opcode: str, name: str, a: str, b: str, transcendentals: str = "accurate") -> str | None:
    """Source of a binary elementwise op (not compare) with both operands and the result of type `name`."""
    if approximations.approximated(opcode, name, transcendentals):
        return f"{XLA_CPU_HELPERS[opcode]}({a}, {b})"
    return _table_src(opcode, name, a, b)


def compare_src(direction: str, name: str, a: str, b: str, total_order: bool = False) -> str | None:
    if name not in COMPUTE:
        return None
    order = ("TOTALORDER" if total_order else "FLOAT") if name in FLOATS else "SIGNED" if name in SIGNED else "UNSIGNED"
    return _table_src(semantics.compare_opcode(direction, order), name, a, b)


def select_src(name: str, p: str, a: str, b: str) -> str | None:
    return _table_src("select", name, p, a, b)


def clamp_src(name: str, lo: str, x: str, hi: str) -> str | None:
    return _table_src("clamp", name, lo, x, hi)


def convert_src(src: str, dst: str, x: str, excess_precision: bool = False) -> str | None:
    """Source converting a compute-type value of element type `src` to element type `dst`: the conversion steps of
    kernels/semantics.py. With excess precision a value held in f32 (f16 / bf16 / f32) is not rounded to f16 /
    bf16."""
    if src not in COMPUTE or dst not in COMPUTE:
        return None
    steps = semantics.conversion(element_type(src), element_type(dst))
    if steps is None:  # complex -> real: no convert
        return None
    at, keep_f32 = src, excess_precision and src in ("f16", "bf16", "f32")
    for step in steps:
        x = _step_src(step, at, x, keep_f32)
        at = step.to.name
    return x


def _step_src(step, src: str, x: str, keep_f32: bool) -> str:
    dst = step.to.name
    T = COMPUTE[dst]
    if step.kind == "copy":
        return x
    if step.kind == "nonzero":
        return f"({x} != 0)"
    if src == "pred":
        return f"{T}(1 if {x} else 0)"
    if step.kind == "wrap":
        return f"{T}({x})"
    if step.kind == "saturate":  # compared in f64, where the bounds of every compute type are exact
        lo, hi = (literal_src("f64", b) for b in semantics.saturation_bounds(element_type(src), step.to))
        return (
            f"({T}(0) if {x} != {x} else ({T}({_int_min(dst)}) if np.float64({x}) <= {lo} else "
            f"({T}({_int_max(dst)}) if np.float64({x}) >= {hi} else {T}(np.float64({x})))))"
        )
    # round: f16 / bf16 / f32 values are held as float32 already
    if dst in ("f16", "bf16"):
        return x if keep_f32 else round_src(dst, x)
    if dst == "f32" and src in ("f16", "bf16", "f32"):
        return x
    return f"{T}({x})"


def bitcast_convert_src(src: str, dst: str, x: str) -> str | None:
    """Reinterpret the bits of a value of type `src` as type `dst` (same bit width only)."""
    if src not in COMPUTE or dst not in COMPUTE or BITS[src] != BITS[dst] or "pred" in (src, dst):
        return None
    if src == dst:
        return x
    T = COMPUTE[dst]
    # source -> unsigned bit pattern
    if src == "f16":
        bits = f"f32_to_f16({x})"
    elif src == "bf16":
        bits = f"f32_to_bf16({x})"
    elif src == "f32":
        bits = f"bitcast_f32_to_u32({x})"
    elif src == "f64":
        bits = f"bitcast_f64_to_u64({x})"
    else:
        bits = f"{_unsigned(src)}({x})"
    # bit pattern -> destination
    if dst == "f16":
        return f"f16_to_f32({bits})"
    if dst == "bf16":
        return f"bf16_to_f32({bits})"
    if dst == "f32":
        return f"bitcast_u32_to_f32(np.uint32({bits}))"
    if dst == "f64":
        return f"bitcast_u64_to_f64(np.uint64({bits}))"
    return f"{T}({bits})"


def iota_src(name: str, index: str) -> str | None:
    """The value of an iota element whose index (an int64 expression) is `index`."""
    if name not in COMPUTE or name == "pred":
        return None
    return convert_src("s64", name, index)


def instruction_src(
    inst, vals: list[str], excess_precision: bool = False, transcendentals: str = "accurate"
) -> str | None:
    """Source of elementwise instruction `inst` on operand values `vals` (compute-type names or literals),
    rounded to its type after the op unless exact; None if unsupported. `excess_precision`, `transcendentals`:
    the rules of hloexec.options."""
    op, et = inst.opcode, inst.shape.element_type.name
    src_et = inst.operands[0].shape.element_type.name if inst.operands else et
    if op == "convert":
        return convert_src(src_et, et, vals[0], excess_precision)
    if op == "bitcast-convert":
        return bitcast_convert_src(src_et, et, vals[0])
    if op == "compare":
        total = (inst.attr("type") or "").upper() == "TOTALORDER"
        return compare_src(inst.attr("direction"), src_et, vals[0], vals[1], total_order=total)
    if op == "select":
        return select_src(et, *vals)
    if op == "is-finite":  # a float operand, a pred result: the operand's type picks the definition
        return unary_src(op, src_et, vals[0])
    if op == "clamp":
        return clamp_src(et, *vals)
    if len(vals) == 1:
        expr = unary_src(op, et, vals[0], transcendentals)
    elif len(vals) == 2:
        expr = binary_src(op, et, vals[0], vals[1], transcendentals)
    else:
        return None
    if expr is None or op in EXACT_OPS:
        return expr
    return round_src(et, expr, excess_precision)


UNARY_OPS = frozenset(op for op in semantics.DEFINITIONS if semantics.arity(op) == 1)
BINARY_OPS = frozenset(op for op in semantics.DEFINITIONS if semantics.arity(op) == 2 and not op.startswith("compare "))
# Every op computing each element from its operands' elements at the same index.
ELEMENTWISE_OPS = UNARY_OPS | BINARY_OPS | {"select", "clamp", "convert", "compare", "bitcast-convert"}


def dot_accumulator(name: str) -> str:
    """The element type a dot or convolution producing element type `name` accumulates in (XLA:CPU): f32 for
    the floats narrower than 32 bits, s64 for pred (true when any product is), else the type itself (integers
    wrap)."""
    et = element_type(name)
    if et.kind == "pred":
        return "s64"
    return "f32" if et.kind == "float" and et.bits < 32 else name


# -- reductions ---------------------------------------------------------------------------------------
# How reductions (reduce, reduce-window) apply an add / multiply reducer: the `reductions` rule of
# hloexec.options (REDUCTIONS says what "accumulate", "per-step" and "xla-cpu" mean).


def accumulates_in_f32(reductions: str, opcode: str, element_type) -> bool:
    """Whether a reduction applying `opcode` to values of `element_type` (an ir.dtypes.ElementType) keeps an
    f32 accumulator and rounds once at the end; otherwise every application of the reducer rounds to the type."""
    return (
        reductions == "accumulate"
        and opcode in ("add", "multiply")
        and element_type.is_float
        and element_type.bits < 32
    )


def in_order(reductions: str, opcode: str, element_type) -> bool:
    """Whether a reduction must apply `opcode` to the elements in row-major order: float sums and products
    under "per-step" and "xla-cpu" (a fixed order gives every tier the same bits). Exact reducers (max, min, and,
    or, integer add / multiply) give the same bits in any order."""
    return (
        reductions in ("per-step", "xla-cpu")
        and opcode in ("add", "multiply")
        and element_type.kind in ("float", "complex")
    )


def sums_in_ynn_order(comp, reductions: str) -> bool:
    """Whether fused computation `comp` holds a reduce or a dot XLA:CPU runs through YNNPACK (under "xla-cpu"): its
    order (hloexec/ops/reduction.py ynn_row_sum, kernels/ynn_dot.py) has no generated form, the computation runs op
    by op."""
    module = getattr(comp, "module", None)
    return (
        reductions == "xla-cpu"
        and module is not None
        and comp.name in ynn_computations(module)
        and any(inst.opcode in ("reduce", "dot") for inst in comp.instructions)
    )


YNN_DECLINED = "a YNNPACK fusion's sums and dots (reductions=xla-cpu) run op by op, in YNNPACK's order"


def reducer_step_src(reductions: str, opcode: str, name: str, acc: str, x: str) -> str:
    """Source of one application of reducer `opcode` to accumulator `acc` and value `x` of element type `name`:
    rounded to the type unless the reduction accumulates in f32 (then `reduction_result_src` rounds once)."""
    expr = binary_src(opcode, name, acc, x)
    if expr is None:  # the generators take only reducers they recognised
        raise ValueError(f"no source for reducer {opcode} on {name}")
    if opcode in EXACT_OPS or accumulates_in_f32(reductions, opcode, element_type(name)):
        return expr
    return round_src(name, expr)


def reduction_result_src(reductions: str, opcode: str, name: str, acc: str, excess_precision: bool = False) -> str:
    """Source of a reduction's value from its accumulator: rounded once if it accumulated in f32."""
    if accumulates_in_f32(reductions, opcode, element_type(name)):
        return round_src(name, acc, excess_precision)
    return acc
