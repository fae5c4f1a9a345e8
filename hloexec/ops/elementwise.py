"""Elementwise HLO ops: unary, binary, compare, select, clamp, convert, bitcast-convert, reduce-precision.

Semantics follow XLA (operation_semantics, the HloEvaluator and XLA:CPU's elemental IR emitter) and are
tested bit-exactly against XLA:CPU (tests/test_ops_elementwise.py). The rules worth knowing:

* Arithmetic precision: f16/bf16/fp8 compute in f32 and round to their type once per op (as XLA:CPU
  does); f32 computes in f32, f64 in f64. Complex c64/c128 use numpy's complex arithmetic.
* Denormals: hloexec does NOT flush denormals. XLA:CPU runs with FTZ/DAZ for f32 and f64 arithmetic
  (a denormal input reads as 0 and a denormal result becomes 0; abs/negate/select/convert-by-bits pass
  them through). XLA's HloEvaluator does not flush; we follow it. Tests compare after flushing.
* Integer divide: x / 0 = -1 (all ones: UINT_MAX for unsigned), INT_MIN / -1 = INT_MIN; division
  truncates toward zero. Remainder: x % 0 = x, INT_MIN % -1 = 0; the sign follows the dividend.
* Shifts: the shift amount is read as unsigned; an amount >= the bit width gives 0 for shift-left and
  shift-right-logical and the sign fill (0 or -1) for shift-right-arithmetic.
* Integer power: square-and-multiply with wrap-around; a negative exponent gives 1 for base 1, +-1 for
  base -1 (by the exponent's parity) and 0 otherwise; x^0 = 1.
* Float -> float convert: f64 -> f16/bf16 rounds twice (through f32) like XLA's evaluator and XLA:CPU on hosts
  without AVX512-FP16 (with it, XLA:CPU rounds f64 -> f16 once); f64 -> fp8 rounds once.
* Float -> int convert saturates (x <= INT_MIN -> INT_MIN, x >= INT_MAX -> INT_MAX), NaN -> 0;
  float -> unsigned maps x <= 0 and NaN to 0. To pred: x != 0 (NaN -> true).
* maximum/minimum are IEEE 754-2019 maximum/minimum: NaN propagates, and -0 < +0.
* compare type=TOTALORDER orders floats as -NaN < -inf < ... < -0 < +0 < ... < inf < +NaN.
* Sub-byte integers (s2, s4, u2, u4; ml_dtypes arrays, one element a byte) compute in a byte (int8 / uint8
  holding the value) and wrap back to their width; the bit ops (shifts, clz, popcnt, not, bitcast-convert)
  act on their own 2- or 4-bit pattern, as XLA's evaluator does (shift-right-arithmetic of a u4 fills with
  the pattern's top bit, as for u8). popcnt counts the pattern's bits (s4 popcnt(-3) = 3, as StableHLO's
  spec; XLA:CPU counts the sign-extended byte: 7).

The scalar meaning of the unary, binary, compare, clamp and select ops on float, integer and pred values is the
scalar-semantics table's (hloexec/kernels/semantics.py), and so are converts' steps (`conversion`): the kernels
here take its numpy form (`_table`) or interpret the steps (`convert_kernel`) and add what is this tier's own:
f16 / bf16 / fp8 lifted to f32 and rounded back (`float_lifted`), sub-byte integers in their byte container
(`_int_kernel`), complex values (the float definitions whose primitives numpy extends to complex, plus
complex-only functions), bitcasts of every type.
"""

from __future__ import annotations

import functools
import sys

import ml_dtypes
import numpy as np

from ..errors import UnsupportedError
from ..ir import opcodes
from ..kernels import approximations, numpy_form, semantics
from .common import SUB_BYTE_CONTAINER, as_unsigned
from .registry import ALL, FLOATS, op

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_F16 = np.dtype(np.float16)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_HALF = (_F16, _BF16)
_F16_NAN, _F16_NEG_NAN = np.array([0x7E00, 0xFE00], np.uint16).view(_F16)

INTS = "s2-s64, u2-u64"
NUMERIC = "s2-s64, u2-u64, f16, bf16, f32, f64, f8, f6, f4, c64, c128"
FLOAT_C = "f16, bf16, f32, f64, f8, f6, f4, c64, c128"


# -- helpers ---------------------------------------------------------------------------
def _etype(shape):
    return shape.element_type


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype arithmetic runs in: f32 for the <32-bit float types, else the type itself."""
    if dtype.kind == "V" or (dtype.kind == "f" and dtype.itemsize < 4) or _is_ml_float(dtype):
        return _F32
    return dtype


def _is_ml_float(dtype: np.dtype) -> bool:
    return dtype.type.__module__.startswith("ml_dtypes") and dtype.kind not in "iub"


# Element counts from which hloexec.kernels.half's Numba converters beat numpy's astype (measured: a call costs
# ~1 us) once that module is loaded, as fused kernels do. Loading it (and Numba) costs ~0.5 s, which only f16
# arrays of NUMBA_LOAD_MIN_SIZE elements trigger: numpy's f16 casts are ~10x slower than the converters (~1.3 ns
# an element), so one such conversion saves ~20 ms and a module making them makes many; a one-shot run of a
# module with 1M-element f16 arrays would not earn the load back. ml_dtypes' bf16 casts are at most ~2.5x slower.
NUMBA_TO_F32_MIN_SIZE = {_F16: 1024, _BF16: 65536}
NUMBA_FROM_F32_MIN_SIZE = {_F16: 1024, _BF16: 4096}
NUMBA_LOAD_MIN_SIZE = {_F16: 1 << 24}
_HALF_MODULE = __name__.rsplit(".", 2)[0] + ".kernels.half"


def _numba_converters(size: int, dtype: np.dtype):
    """hloexec.kernels.half if it is loaded or converting `size` elements of `dtype` is worth loading it,
    else None."""
    half = sys.modules.get(_HALF_MODULE)
    if half is not None and getattr(half.__spec__, "_initializing", False):
        # another thread is loading it (a paired run's program and shadow threads): its entry is there before its
        # names, as importlib marks it; numpy's casts meanwhile (waiting for the import instead can meet the
        # background compiler's import of Numba and be handed a half-made module: importlib's deadlock escape)
        return None
    if half is None and size >= NUMBA_LOAD_MIN_SIZE.get(dtype, np.inf):
        from ..kernels import half
    return half


@functools.cache
def _f16_to_f32_table() -> np.ndarray:
    """The f32 value of every f16 bit pattern, signaling NaNs made quiet (XLA:CPU's vcvtph2ps does; numpy's
    astype keeps them signaling)."""
    table = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(_F16).astype(_F32)
    bits = table.view(np.uint32)
    bits[(bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)] |= np.uint32(0x400000)
    return table


def low_to_f32(x, quiet: bool = True) -> np.ndarray:
    """f16 / bf16 / fp8 values as f32, bit-identical to XLA:CPU's convert (see kernels.half.to_f32: f16
    signaling NaNs come out quiet). `quiet=False` lets them stay signaling on small arrays (numpy's astype,
    saving a table lookup) for callers that only compare the values or do arithmetic on them, which quiets a
    NaN keeping its payload as the conversion would have."""
    if x.size >= NUMBA_TO_F32_MIN_SIZE.get(x.dtype, np.inf) and (half := _numba_converters(x.size, x.dtype)):
        return half.to_f32(x)
    if quiet and x.dtype == _F16:
        return np.asarray(_f16_to_f32_table().take(x.view(np.uint16)))
    return x.astype(_F32)


def f32_to_low(x, dtype: np.dtype, signaling_nans: bool = False):
    """f32 (or f64) values rounded to the f16 / bf16 / fp8 numpy `dtype`, bit-identical to XLA:CPU's convert
    for f16 / bf16 (see kernels.half.from_f32); fp8 as ml_dtypes. XLA:CPU makes f32 signaling NaNs quiet in
    f16: pass `signaling_nans` when x may hold some (raw f32 data, bf16 widened by low_to_f32); values
    computed from f16 ones widened by low_to_f32 never do (its NaNs are quiet, and numpy arithmetic,
    maximum/minimum and where keep them so), and skipping the quieting saves a pass on small arrays."""
    if x.size >= NUMBA_FROM_F32_MIN_SIZE.get(dtype, np.inf) and (half := _numba_converters(x.size, dtype)):
        return half.from_f32(x, dtype)
    if x.dtype == _F64:  # XLA:CPU goes through f32 (two roundings) ...
        r = x.astype(_F32).astype(dtype)
        if dtype == _F16 and np.isnan(x).any():  # ... but makes f64 NaNs canonical in f16
            r = np.where(np.isnan(x), np.where(np.signbit(x), _F16_NEG_NAN, _F16_NAN), r)
        return r
    if signaling_nans and dtype == _F16:
        x = x * _F32.type(1)  # quiets signaling NaNs, payload kept, as vcvtps2ph does (numpy doesn't)
    return _rounded(x, dtype)


# Float types without NaN: XLA:CPU converts a NaN (of either sign) to -0 (measured on f4e2m1fn; ml_dtypes gives
# -0 for NaN, +0 for -NaN).
_NO_NAN = {np.dtype(t) for t in (ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn)}


def _rounded(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Float values x rounded to the float type `dtype` (numpy's / ml_dtypes' cast, NaN -> -0 where the
    type has no NaN)."""
    r = x.astype(dtype)
    if dtype in _NO_NAN:
        nan = np.isnan(x)
        if nan.any():
            r[nan] = dtype.type(-0.0)
    return r


def _int_kernel(inst, build, operand: int = 0):
    """The kernel of an integer op: `build(dtype, bits)` makes it for the numpy type `dtype` of operand `operand`,
    of `bits` bits. A sub-byte type's kernel gets its operands widened to their byte type (values sign- or
    zero-extended) and its result, if sub-byte, wrapped back to its width."""
    et = inst.operands[operand].shape.element_type
    container = SUB_BYTE_CONTAINER.get(et.numpy)
    if container is None:
        return build(et.numpy, et.bits)
    kernel = build(container, et.bits)
    out = inst.shape.dtype if inst.shape.dtype in SUB_BYTE_CONTAINER else None

    def widened(*xs):
        r = kernel(*(x.astype(SUB_BYTE_CONTAINER[x.dtype]) if x.dtype in SUB_BYTE_CONTAINER else x for x in xs))
        return r if out is None else r.astype(out)

    return widened


def float_lifted(fn, dtype: np.dtype, nan_passing: bool = False):
    """Wrap a float function so it computes in the compute dtype and rounds once to `dtype`. `nan_passing`: fn
    may return an operand's NaN as it is rather than computing with it (which would make it quiet)."""
    if _compute_dtype(dtype) == dtype:

        def kernel(*xs):
            with np.errstate(all="ignore"):
                return fn(*xs)
    else:
        quiet = nan_passing

        def kernel(*xs):
            with np.errstate(all="ignore"):
                return f32_to_low(fn(*(low_to_f32(x, quiet) for x in xs)), dtype)

    return kernel


def _require(cond: bool, what: str, inst):
    if not cond:
        raise UnsupportedError(what, inst)


def _kind(inst, i=0) -> str:
    return inst.operands[i].shape.element_type.kind


def _table(opcode: str, kind: str, dtype: np.dtype, bits: int | None = None):
    """The numpy form of `opcode` from the scalar-semantics table, on arrays of `dtype` (a compute dtype; a
    complex one for the float definitions numpy's functions extend to complex)."""
    cls = "float" if kind == "complex" else semantics.type_class(kind)
    return numpy_form.numpy_form(opcode, cls, np.dtype(dtype), bits or np.dtype(dtype).itemsize * 8)


def _int_table(inst, opcode: str, operand: int = 0):
    """The table's numpy form of integer op `opcode`, sub-byte types in their byte container."""
    kind = _kind(inst, operand)
    return _int_kernel(inst, lambda dtype, bits: _table(opcode, kind, dtype, bits), operand)


def _device_approximation(inst, ctx):
    """The device's own approximation of f32 op `inst` (the `transcendentals` rule: XLA:CPU's), or None: its
    compiled tier's helper as a ufunc (the numpy form, tens of numpy passes with exact FMAs, is ~100x slower)
    unless Numba is off."""
    if not approximations.approximated(inst.opcode, inst.shape.element_type.name, ctx.options.device.transcendentals):
        return None
    if ctx.use_numba:
        from ..kernels.elementwise import XLA_CPU_HELPERS
        from ..kernels.scalar import numpy_ufunc

        ufunc = numpy_ufunc(XLA_CPU_HELPERS[inst.opcode], semantics.arity(inst.opcode))
        return lambda *xs: np.asarray(ufunc(*xs))
    from ..kernels import scalar  # noqa: F401  (registers the machine's primitives with the semantics table)

    return approximations.numpy_approximation(inst.opcode)


# Ops whose float definition may return an operand's NaN as it is (see float_lifted).
_NAN_PASSING = {"sign", "maximum", "minimum"}


def _float_table(opcode: str, dtype: np.dtype):
    """The table's float `opcode` computed in `dtype`'s compute dtype, rounded once to `dtype`."""
    return float_lifted(_table(opcode, "float", _compute_dtype(dtype)), dtype, opcode in _NAN_PASSING)


# -- unary ops ------------------------------------------------------------------------------
_FLOAT_UNARY = (
    "floor",
    "ceil",
    "round-nearest-afz",
    "round-nearest-even",
    "sqrt",
    "rsqrt",
    *sorted(opcodes.TRANSCENDENTAL_UNARY),
)
# The float definitions whose primitives numpy extends to complex values.
_COMPLEX_UNARY = {"sqrt", "rsqrt"} | (opcodes.TRANSCENDENTAL_UNARY - {"cbrt", "erf"})


@op(
    *_FLOAT_UNARY,
    dtypes=FLOAT_C,
    notes="f16/bf16/fp8 computed in f32, rounded once; logistic = 1/(1+exp(-x)); no denormal flushing",
)
def _prepare_float_unary(inst, ctx):
    dtype = inst.shape.dtype
    kind = _kind(inst)
    if kind == "complex":
        _require(inst.opcode in _COMPLEX_UNARY, f"{inst.opcode} of a complex operand", inst)
        return float_lifted(_table(inst.opcode, kind, dtype), dtype)
    _require(kind == "float", f"{inst.opcode} of a {inst.operands[0].shape.element_type.name} operand", inst)
    return _device_approximation(inst, ctx) or _float_table(inst.opcode, dtype)


@op("abs", dtypes=NUMERIC, notes="abs(INT_MIN) = INT_MIN; complex -> real modulus")
def _prepare_abs(inst, ctx):
    kind = _kind(inst)
    dtype = inst.shape.dtype
    if kind in ("sint", "uint"):
        return _int_table(inst, "abs")
    if kind == "complex":

        def kernel(x):  # XLA: NaN if either part is NaN (even with an infinite other part)
            r = np.abs(x).astype(dtype, copy=False)
            return np.where(np.isnan(x.real) | np.isnan(x.imag), dtype.type(np.nan), r)

        return kernel
    _require(kind == "float", "abs of pred", inst)
    return _table("abs", kind, dtype)  # a bit operation: exact on the stored type, no lifting


@op("negate", dtypes=NUMERIC, notes="wraps for integers")
def _prepare_negate(inst, ctx):
    kind = _kind(inst)
    _require(kind != "pred", "negate of pred", inst)
    if kind in ("sint", "uint"):
        return _int_table(inst, "negate")
    return _table("negate", kind, inst.shape.dtype)  # a bit operation for floats: exact on the stored type


@op("sign", dtypes=NUMERIC, notes="sign(+-0) = +-0, sign(NaN) = NaN")
def _prepare_sign(inst, ctx):
    kind = _kind(inst)
    _require(kind != "pred", "sign of pred", inst)
    if kind in ("sint", "uint"):
        return _int_table(inst, "sign")
    if kind == "complex":
        dtype = inst.shape.dtype

        def kernel(x):
            with np.errstate(all="ignore"):
                m = np.abs(x)
                return np.where(m == 0, x, x / m).astype(dtype, copy=False)

        return kernel
    return _float_table("sign", inst.shape.dtype)


@op("is-finite", dtypes=FLOATS)
def _prepare_is_finite(inst, ctx):
    _require(_kind(inst) == "float", "is-finite of a non-float operand", inst)
    return _table("is-finite", "float", inst.operands[0].shape.dtype)  # exact on the stored type


@op("not", dtypes="pred, " + INTS)
def _prepare_not(inst, ctx):
    kind = _kind(inst)
    if kind == "pred":
        return _table("not", kind, np.dtype(np.bool_))
    _require(kind in ("sint", "uint"), "not of a float operand", inst)
    return _int_table(inst, "not")


@op(
    "popcnt",
    dtypes=INTS,
    notes="counts the bits of the value's own width: s4 popcnt(-3) = 3 as StableHLO's spec (XLA:CPU counts the "
    "sign-extended byte: 7)",
)
def _prepare_popcnt(inst, ctx):
    _require(_kind(inst) in ("sint", "uint"), "popcnt of a non-integer operand", inst)
    return _int_table(inst, "popcnt")


@op("count-leading-zeros", dtypes=INTS, notes="clz(0) = bit width")
def _prepare_clz(inst, ctx):
    _require(_kind(inst) in ("sint", "uint"), "count-leading-zeros of a non-integer operand", inst)
    return _int_table(inst, "count-leading-zeros")


@op("real", "imag", dtypes="c64, c128, floats", notes="real(x)=x, imag(x)=0 for real x")
def _prepare_real_imag(inst, ctx):
    dtype = inst.shape.dtype
    if _kind(inst) != "complex":
        if inst.opcode == "real":
            return lambda x: x.copy()
        return lambda x: np.zeros(x.shape, dtype)
    if inst.opcode == "real":
        return lambda x: np.array(x.real, dtype, order="C")
    return lambda x: np.array(x.imag, dtype, order="C")


@op("complex", dtypes="f32, f64 -> c64, c128")
def _prepare_complex(inst, ctx):
    dtype = inst.shape.dtype

    def kernel(re, im):
        out = np.empty(np.broadcast_shapes(re.shape, im.shape), dtype)
        out.real = re
        out.imag = im
        return out

    return kernel


# -- binary arithmetic ------------------------------------------------------------------------
_BINARY = ("add", "subtract", "multiply", "divide", "remainder", "power", "maximum", "minimum", "atan2")


@op(
    *_BINARY,
    dtypes=NUMERIC,
    notes="integer x/0 = -1, INT_MIN/-1 = INT_MIN, x%0 = x; max/min IEEE 754-2019 (NaN, -0 < +0); "
    "f16/bf16/fp8 computed in f32, rounded once",
)
def _prepare_binary(inst, ctx):
    kind = _kind(inst)
    dtype = inst.shape.dtype
    opc = inst.opcode
    if kind in ("sint", "uint"):
        _require(opc != "atan2", "atan2 of integers", inst)
        return _int_table(inst, opc)
    if kind == "pred":
        # XLA allows a few arithmetic ops on pred (they act on 0/1 as u1: add = or, multiply = and).
        _require(semantics.defines(opc, "pred"), f"{opc} of pred operands", inst)
        return _table(opc, kind, dtype)
    if kind == "complex":
        _require(opc in ("add", "subtract", "multiply", "divide", "power", "atan2"), f"{opc} of complex operands", inst)
        if opc == "atan2":
            return _complex_atan2
        return float_lifted(_table(opc, kind, dtype), dtype)
    kernel = _device_approximation(inst, ctx) or _float_table(opc, dtype)
    if _compute_dtype(dtype) == dtype and any(
        o.shape.element_type is not inst.shape.element_type for o in inst.operands
    ):
        # wider operands (a TPU dump's bf16 = multiply(f32, f32), in a shadow with 16-bit floats in f32: an f32
        # result of f64 operands) are rounded once to the result's type
        return lambda *xs: np.asarray(kernel(*xs)).astype(dtype, copy=False)
    return kernel


def _int_mulhi(dtype: np.dtype, bits: int):
    """The high `bits` bits of the 2*bits-bit product, signed for a signed type (XLA's mulhi, jax's lax.mulhi)."""
    signed = dtype.kind == "i"
    if bits <= 32:
        wide = np.dtype(f"{'i' if signed else 'u'}8")
        return lambda a, b: ((a.astype(wide) * b.astype(wide)) >> wide.type(bits)).astype(dtype)
    u64, half = np.dtype(np.uint64), np.uint64(32)
    low = np.uint64(0xFFFFFFFF)

    def kernel(a, b):
        x, y = a.view(u64), b.view(u64)
        xl, xh, yl, yh = x & low, x >> half, y & low, y >> half
        ll, lh, hl = xl * yl, xl * yh, xh * yl
        cross = (lh & low) + (hl & low) + (ll >> half)
        hi = xh * yh + (lh >> half) + (hl >> half) + (cross >> half)  # of the unsigned product
        if signed:  # x * y = ux * uy - 2^64 (x < 0 ? uy : 0) - 2^64 (y < 0 ? ux : 0), mod 2^128
            hi = hi - np.where(a < 0, y, u64.type(0)) - np.where(b < 0, x, u64.type(0))
        return hi.view(dtype)

    return kernel


@op("mulhi", dtypes=INTS, notes="the high half of the double-width product (signed for signed types): jax's lax.mulhi")
def _prepare_mulhi(inst, ctx):
    _require(_kind(inst) in ("sint", "uint"), "mulhi of non-integer operands", inst)
    return _int_kernel(inst, _int_mulhi)


def _complex_atan2(y, x):
    """XLA's complex atan2 (HloEvaluator, the elemental IR emitter): -i log((x + i y) / sqrt(x^2 + y^2))."""
    with np.errstate(all="ignore"):
        return (-1j * np.log((x + 1j * y) / np.sqrt(x * x + y * y))).astype(x.dtype)


@op("and", "or", "xor", dtypes="pred, " + INTS)
def _prepare_bitwise(inst, ctx):
    kind = _kind(inst)
    _require(kind in ("pred", "sint", "uint"), f"{inst.opcode} of float operands", inst)
    if kind == "pred":
        return _table(inst.opcode, kind, np.dtype(np.bool_))
    return _int_table(inst, inst.opcode)


@op(
    "shift-left",
    "shift-right-arithmetic",
    "shift-right-logical",
    dtypes=INTS,
    notes="amount read as unsigned; amount >= bit width: 0 (left, logical) or the sign fill (arithmetic)",
)
def _prepare_shift(inst, ctx):
    _require(_kind(inst) in ("sint", "uint"), f"{inst.opcode} of non-integer operands", inst)
    return _int_table(inst, inst.opcode)


# -- compare / select / clamp -------------------------------------------------------------------
@op(
    "compare",
    dtypes=ALL,
    notes="direction EQ/NE/LT/LE/GT/GE; type FLOAT (IEEE, NaN unordered), TOTALORDER, SIGNED, UNSIGNED",
)
def _prepare_compare(inst, ctx):
    direction = inst.attr("direction")
    _require(direction in semantics.DIRECTIONS, f"compare direction {direction!r}", inst)
    kind = _kind(inst)
    dtype = inst.operands[0].shape.dtype
    ctype = inst.attr("type")
    if ctype is None:
        ctype = {"float": "FLOAT", "complex": "FLOAT", "uint": "UNSIGNED", "pred": "UNSIGNED"}.get(kind, "SIGNED")
    if kind == "complex":
        _require(direction in ("EQ", "NE"), f"compare {direction} of complex operands", inst)
        return _table(semantics.compare_opcode(direction, "FLOAT"), kind, dtype)
    if kind == "float":
        _require(ctype in ("FLOAT", "TOTALORDER"), f"compare type {ctype} of float operands", inst)
        if ctype == "TOTALORDER":  # on the stored bits: no lifting
            return _table(semantics.compare_opcode(direction, ctype), kind, dtype)
        fn = _table(semantics.compare_opcode(direction, ctype), kind, _compute_dtype(dtype))
        if _compute_dtype(dtype) != dtype:
            return lambda a, b: fn(low_to_f32(a, quiet=False), low_to_f32(b, quiet=False))
        return fn
    if kind in ("sint", "uint"):
        _require(ctype in ("SIGNED", "UNSIGNED"), f"compare type {ctype} of integer operands", inst)
        return _int_table(inst, semantics.compare_opcode(direction, ctype))
    return _table(semantics.compare_opcode(direction, "UNSIGNED"), kind, dtype)  # pred: False < True


@op("select", dtypes=ALL, notes="a scalar pred selects whole arrays")
def _prepare_select(inst, ctx):
    if inst.operands[0].shape.rank == 0 and inst.shape.rank > 0:
        return lambda p, a, b: (a if p else b).copy()
    return numpy_form.numpy_form("select", "any", inst.shape.dtype, inst.shape.element_type.bits)


@op("clamp", dtypes=NUMERIC, notes="clamp(lo, x, hi) = min(max(x, lo), hi), NaN-propagating; scalar bounds allowed")
def _prepare_clamp(inst, ctx):
    dtype = inst.shape.dtype
    kind = inst.shape.element_type.kind
    _require(kind != "complex", "clamp of complex operands", inst)
    if kind == "pred":
        return _table("clamp", kind, dtype)
    if kind in ("sint", "uint"):
        return _int_table(inst, "clamp", operand=1)
    fn = _table("clamp", kind, _compute_dtype(dtype))  # the result has x's shape (bounds may be scalars)
    if _compute_dtype(dtype) == dtype:
        return fn
    return lambda lo, x, hi: f32_to_low(fn(low_to_f32(lo), low_to_f32(x), low_to_f32(hi)), dtype)


# -- convert: kernels/semantics.py's conversion steps on numpy arrays ----------------------------------------
def _saturate(src: np.dtype, dst: np.dtype, bounds: tuple[float, float]):
    lo, hi = bounds
    info = ml_dtypes.iinfo(dst)
    t = dst.type
    wdt = _F64 if src.itemsize <= 8 else src

    def kernel(x):
        xf = low_to_f32(x, quiet=False).astype(wdt) if src in _HALF else x.astype(wdt, copy=False)
        with np.errstate(all="ignore"):
            low, high = xf <= lo, xf >= hi  # a NaN bound: never
            r = np.where(low | high | np.isnan(xf), 0, xf).astype(dst)
        r = np.where(low, t(info.min), r)
        r = np.where(high, t(info.max), r)
        return r

    return kernel


def _f64_to_f32_round_to_odd(x: np.ndarray) -> np.ndarray:
    r = x.astype(_F32)
    inexact = np.isfinite(r) & (r.astype(_F64) != x)
    if inexact.any():
        even = (r.view(np.uint32) & np.uint32(1)) == 0
        toward = np.nextafter(r, np.where(x > r.astype(_F64), np.float32(np.inf), np.float32(-np.inf)))
        r = np.where(inexact & even, toward, r)
    return r


def _round(src: np.dtype, dst: np.dtype, from_float: bool):
    """Rounding values of numpy type `src` to the float / complex type `dst` (exact through f32 between narrow
    types: every one fits in f32). `from_float`: the conversion's source is a float (may hold signaling NaNs)."""
    if src in _HALF and dst == _F32:
        return low_to_f32
    if src in _HALF and dst == _F64:
        return lambda x: low_to_f32(x).astype(_F64)  # f16 signaling NaNs quieted, as XLA:CPU
    if _is_ml_float(dst) or (dst.kind == "f" and dst.itemsize < 4):
        if src == _F32:
            return lambda x: f32_to_low(x, dst, signaling_nans=from_float)
        if _is_ml_float(src) or src.itemsize < 4:
            return lambda x: f32_to_low(low_to_f32(x), dst, signaling_nans=True)
    return lambda x: _rounded(x, dst)


def _numpy_step(step, src: np.dtype, from_float: bool):
    dst = step.to.numpy
    if step.kind == "copy":
        return lambda x: x.copy()
    if step.kind == "nonzero":
        return lambda x: x != 0
    if step.kind == "wrap":  # ml_dtypes casts between its own sub-byte types only through a wider one
        if src in SUB_BYTE_CONTAINER and dst in SUB_BYTE_CONTAINER:
            return lambda x: x.astype(np.int8).astype(dst)
        return lambda x: x.astype(dst)
    if step.kind == "round-to-odd":
        return _f64_to_f32_round_to_odd
    return _round(src, dst, from_float)


_F8E5M2 = np.dtype(ml_dtypes.float8_e5m2)
_F8E5M2_NAN = np.array(0x7F, np.uint8).view(_F8E5M2)


def _half_to_f8e5m2(x: np.ndarray) -> np.ndarray:
    """f16 / bf16 -> f8e5m2 as XLA:CPU converts: rounded, but every NaN (either sign, any payload) becomes 0x7f
    (measured; ml_dtypes, and XLA:CPU from f32, keep the sign and the payload's top bits: 0x7e / 0xfe)."""
    return np.where(np.isnan(x), _F8E5M2_NAN, x.astype(_F8E5M2))


def convert_kernel(src_t, dst_t, inst):
    steps = semantics.conversion(src_t, dst_t)
    _require(steps is not None, f"convert {src_t.name} -> {dst_t.name}", inst)
    src, dst = src_t.numpy, dst_t.numpy
    if steps[0].kind == "saturate":
        return _saturate(src, dst, semantics.saturation_bounds(src_t, dst_t))
    if src == _F64 and dst in _HALF:
        return lambda x: f32_to_low(x, dst, signaling_nans=True)  # both roundings, f64 NaNs made canonical
    if src in _HALF and dst == _F8E5M2:
        return _half_to_f8e5m2
    fns, at = [], src
    for step in steps:
        fns.append(_numpy_step(step, at, src_t.kind == "float"))
        at = step.to.numpy
    if len(fns) == 1:
        return fns[0]
    first, second = fns
    return lambda x: second(first(x))


@op("convert", dtypes=ALL, notes="float->int saturates, NaN->0; to pred: x != 0; int->bf16/f16/fp8 via f32")
def _prepare_convert(inst, ctx):
    fn = convert_kernel(inst.operands[0].shape.element_type, inst.shape.element_type, inst)

    def kernel(x):
        with np.errstate(all="ignore"):
            return fn(x)

    return kernel


@op(
    "bitcast-convert",
    dtypes=ALL,
    kernel="numpy",
    notes="view; a wider source adds a trailing dimension, a narrower one removes it (little-endian)",
)
def _prepare_bitcast_convert(inst, ctx):
    src_t, dst_t = inst.operands[0].shape.element_type, inst.shape.element_type
    small, big = sorted((src_t.bits, dst_t.bits))
    _require(
        small > 0
        and big % small == 0
        and src_t.numpy is not None
        and dst_t.numpy is not None
        and src_t.kind != "pred"
        and dst_t.kind != "pred"
        or src_t is dst_t,
        f"bitcast-convert {src_t.name} -> {dst_t.name}",
        inst,
    )
    dst = dst_t.numpy
    dims, src_dims = tuple(inst.shape.dims), tuple(inst.operands[0].shape.dims)
    ratio = big // small
    expected = (
        src_dims
        if src_t.bits == dst_t.bits
        else src_dims + (ratio,)
        if src_t.bits > dst_t.bits
        else src_dims[:-1]
        if src_dims[-1:] == (ratio,)
        else None
    )
    _require(
        expected == dims,
        f"bitcast-convert {inst.operands[0].shape.to_text(False)} -> "
        f"{inst.shape.to_text(False)} (XLA's shape rule: same dims, or a trailing dimension of "
        f"{ratio} added or removed)",
        inst,
    )
    if small % 8:
        return _bitcast_sub_byte(src_t, dst_t, dims)
    if src_t.bits == dst_t.bits:
        return lambda x: x.view(dst)
    if src_t.bits > dst_t.bits:  # f32[N] -> u8[N,4]
        return lambda x: x.reshape(x.shape + (1,)).view(dst).reshape(dims)
    return lambda x: x.view(dst).reshape(dims)  # u8[N,4] -> f32[N]: the last axis is contiguous


def _bitcast_sub_byte(src_t, dst_t, dims):
    """bitcast-convert to or from a sub-byte type (s4[N,2] <-> s8[N], f16[N] -> u4[N,4], s4 <-> u4), on the
    bit patterns: a wider element holds the narrower ones lowest bits first (XLA's little-endian packing)."""

    def pattern(x, t):
        return as_unsigned(x.view(np.uint8) if t.bits < 8 else x, t.bits).astype(np.uint64)

    def from_pattern(p, t):
        return p.astype(np.dtype(f"u{max(t.bits // 8, 1)}")).view(t.numpy)

    ratio = max(src_t.bits, dst_t.bits) // min(src_t.bits, dst_t.bits)
    shifts = np.arange(ratio, dtype=np.uint64) * np.uint64(min(src_t.bits, dst_t.bits))
    if src_t.bits > dst_t.bits:
        mask = np.uint64((1 << dst_t.bits) - 1)
        return lambda x: from_pattern((pattern(x, src_t)[..., None] >> shifts) & mask, dst_t).reshape(dims)
    if src_t.bits < dst_t.bits:
        return lambda x: from_pattern(np.bitwise_or.reduce(pattern(x, src_t) << shifts, axis=-1), dst_t).reshape(dims)
    return lambda x: from_pattern(pattern(x, src_t), dst_t)


# -- reduce-precision ------------------------------------------------------------------------------------
_IEEE_LAYOUT = {  # numpy dtype -> (total bits, mantissa bits)
    np.dtype(np.float16): (16, 10),
    np.dtype(ml_dtypes.bfloat16): (16, 7),
    np.dtype(np.float32): (32, 23),
    np.dtype(np.float64): (64, 52),
}


def reduce_precision_bits(x: np.ndarray, exponent_bits: int, mantissa_bits: int) -> np.ndarray:
    """XLA's EmitReducePrecisionIR (quiet_nans=false) on x's own bit pattern."""
    nbits, src_mant = _IEEE_LAYOUT[x.dtype]
    src_exp = nbits - 1 - src_mant
    udt = np.dtype(f"u{nbits // 8}")
    ut = udt.type
    bits = x.view(udt).copy()
    abs_bits = bits & ut((1 << (nbits - 1)) - 1)
    exp_mask = ((1 << src_exp) - 1) << src_mant
    is_nan = abs_bits > ut(exp_mask)
    if mantissa_bits < src_mant:
        shift = src_mant - mantissa_bits
        last = 1 << shift
        base_bias = (last >> 1) - 1
        bias = ((bits & ut(last)) >> ut(shift)) + ut(base_bias)
        with np.errstate(all="ignore"):
            bits = (bits + bias) & ut(~(last - 1) & ((1 << nbits) - 1))
    if exponent_bits < src_exp:
        sign_mask = 1 << (nbits - 1)
        exp_bias = (1 << (src_exp - 1)) - 1
        red_bias = (1 << (exponent_bits - 1)) - 1
        red_max, red_min = exp_bias + red_bias, exp_bias - red_bias
        x_exp = bits & ut(exp_mask)
        overflow = x_exp > ut(red_max << src_mant)
        underflow = x_exp <= ut(red_min << src_mant)
        signed_zero = bits & ut(sign_mask)
        signed_inf = signed_zero | ut(exp_mask)
        bits = np.where(overflow, signed_inf, bits)
        bits = np.where(underflow, signed_zero, bits)
    # NaN stays NaN. (XLA's emitter source turns NaN into inf when mantissa_bits = 0, but XLA:CPU as
    # measured keeps the NaN, and XLA:CPU is the reference.)
    return np.where(is_nan, x, bits.view(x.dtype))


@op(
    "reduce-precision",
    dtypes="f16, bf16, f32, f64",
    notes="XLA's bit algorithm: round mantissa to nearest even, exponent overflow -> inf, "
    "underflow (incl. denormals) -> signed zero, NaN kept",
)
def _prepare_reduce_precision(inst, ctx):
    dtype = inst.shape.dtype
    _require(dtype in _IEEE_LAYOUT, f"reduce-precision of {inst.shape.element_type.name}", inst)
    e, m = inst.attr("exponent_bits"), inst.attr("mantissa_bits")
    _require(
        e is not None and m is not None and e >= 1 and m >= 0,
        "reduce-precision without exponent_bits/mantissa_bits",
        inst,
    )
    return lambda x: reduce_precision_bits(x, int(e), int(m))


# Opcodes this module registers, for tests and the op coverage table (docs/custom-calls.md).
OPCODES = tuple(
    sorted(
        {
            *_FLOAT_UNARY,
            "abs",
            "negate",
            "sign",
            "is-finite",
            "not",
            "popcnt",
            "count-leading-zeros",
            "mulhi",
            "real",
            "imag",
            "complex",
            *_BINARY,
            "and",
            "or",
            "xor",
            "shift-left",
            "shift-right-arithmetic",
            "shift-right-logical",
            "compare",
            "select",
            "clamp",
            "convert",
            "bitcast-convert",
            "reduce-precision",
        }
    )
)
