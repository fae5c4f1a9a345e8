"""The error bounds of the hot elementwise ops (tools/bounds.py) in one compiled pass per element: add, subtract,
negate, convert, multiply and divide. Each element's bound before the rounding (the first-order rule; a divide's
at its operands' interval ends and corners), its own rounding, its samples' deviations (the op on its operands'
deviations, the bilinear identities) plus their own-error draws, and calibration's block statistics are computed
in one loop (kernels/bound_rules.elementwise_pass): the same formulas, in the same order, as the separate rules
of ErrorBounds (`_elementwise`, `_round`, `_sample`), which made ~8 passes with temporaries. The draws are the
same too (kernels/normal_draws' under a key drawn where `_sample` would draw it, and not drawn where the value
has no own error), so the bounds are the same bit for bit."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

from ..ir import opcodes
from ..kernels.bound_rules import ADD, CONVERT, DIVIDE, MULTIPLY, NEGATE, SUBTRACT, elementwise_pass
from ..kernels.normal_draws import rounding_draws
from .bound_samples import CALIBRATION_BLOCK, SAMPLES, SIGMAS, broadcast_sources, shared_rounding
from .bound_store import SAMPLE_STORAGE, contiguous, has_error

TRANSCENDENTAL_ULPS = 4.0  # f32 ulps of XLA's transcendental approximations, beyond the final rounding
# (rsqrt too: XLA:CPU's is rsqrtss and two Newton steps, CUDA's rsqrtf 2 ulps; rsqrt(1) is not 1 on every device)
TRANSCENDENTAL = opcodes.TRANSCENDENTAL_UNARY | {"power", "atan2", "rsqrt"}
# ops whose own rounding counts even where the bound before it is 0 and the value is one of its type (that
# exemption is for elementwise ops on exact operands: a constant 1 converted to f16)
ROUNDED_ONCE = frozenset({"reduce-precision", "reduce", "scatter", "dot"})
FUSED = {"add": ADD, "subtract": SUBTRACT, "negate": NEGATE, "convert": CONVERT, "multiply": MULTIPLY, "divide": DIVIDE}
_NO_KEYS = np.empty(0, np.int64)
_NO_ERRORS = np.empty(0, np.float32)
_NO_DEVIATIONS = np.empty((SAMPLES, 0), np.uint16)
for _none in (_NO_KEYS, _NO_ERRORS, _NO_DEVIATIONS):
    _none.flags.writeable = False


@functools.cache
def rounding_rule(etype, opcode: str, mantissa_bits: int = 0) -> tuple | None:
    """kernels/bound_rules.round_bounds' scalars (from `nmant` on) for a value of `etype` rounded by `opcode`
    (`mantissa_bits`: a reduce-precision's); None where nothing rounds (not a float type)."""
    if etype is None or etype.kind != "float":
        return None
    info = ml_dtypes.finfo(etype.numpy) if etype.numpy is not None else None
    wide = np.finfo(np.float32 if etype.bits <= 32 else np.float64)
    precision = SIGMAS / np.sqrt(3) * 2.0 ** -(mantissa_bits + 1) if opcode == "reduce-precision" else 0.0
    return (
        int(info.nmant) if info is not None else 0,
        float(info.tiny) if info is not None else 0.0,
        float(0.5 * SIGMAS / np.sqrt(3)),
        int(wide.nmant),
        float(wide.tiny),
        float(TRANSCENDENTAL_ULPS * SIGMAS / np.sqrt(3)) if opcode in TRANSCENDENTAL else 0.0,
        float(precision),
        # where the operands are exact and x is a value of the type (a constant 1 converted to f16) nothing
        # rounds (an error known to be nonzero keeps the statistical bound: sums of such add up as random ones do)
        info is not None and opcode not in TRANSCENDENTAL and opcode not in ROUNDED_ONCE,
        float(info.max) if info is not None else 0.0,
        bool(np.isinf(np.asarray(np.inf).astype(etype.numpy))) if info is not None else False,
        float(np.sqrt(3) / SIGMAS),  # a single rounding's largest error, in its SIGMAS sigmas
    )


def _flat(array, rows: int = 1) -> np.ndarray:
    """`array` as elementwise_pass reads it: C-ordered, 1-D (or `rows` rows), read-only (every input the same
    Numba type whether or not it came writable: one compiled signature, not one per combination)."""
    if not array.flags.c_contiguous:  # (a broadcast operand's or a transposed view's: copied on the cores)
        array = contiguous(array)
    flat = array.reshape(-1 if rows == 1 else (rows, -1)).view()  # (the method: np.reshape's wrapper costs a call)
    flat.flags.writeable = False
    return flat


def _real_float(v) -> bool:
    """An f32 or f64 array (the compiled pass's types; ml_dtypes' f8 types are kind "f" too)."""
    return isinstance(v, (np.ndarray, np.generic)) and v.dtype.type in (np.float32, np.float64)


def fused_elementwise(bounds, inst, orig, x, operands) -> bool:
    """`x`'s bound, rounding-decided marks and samples (calibrated) into `bounds` (an ErrorBounds) in one pass,
    where `inst` is one of FUSED on real floats; False (nothing done) otherwise."""
    kind = FUSED.get(inst.opcode)
    etype = orig.shape.element_type
    if kind is None or not _real_float(x) or not all(_real_float(o) for o in operands):
        return False
    rule, rounds = rounding_rule(etype, inst.opcode), kind != NEGATE
    if rule is None:
        return False
    same = len(operands) == 2 and operands[0] is operands[1]
    errors = []  # per distinct operand: its bound, none where it is exact
    for o in operands[:1] if same else operands:
        e = bounds._stored_bound(o)
        errors.append(
            _flat(e if np.shape(e) == np.shape(x) else np.broadcast_to(e, np.shape(x))) if has_error(e) else _NO_ERRORS
        )
    stored = [bounds._stored_samples(o) for o in operands]
    if any(s is not None and s.dtype != SAMPLE_STORAGE for s in stored):
        return False
    deviations = [_NO_DEVIATIONS if s is None else _flat(s.view(np.uint16), SAMPLES) for s in stored]
    if kind == DIVIDE and not same and bounds.device.divide_by_reciprocal and reciprocated(inst.operands[1], etype):
        errors[1], deviations[1] = reciprocal_divisor(bounds, inst, orig, x, operands[1], errors[1], deviations[1])
    sampled = rounds or any(s is not None for s in stored)
    samples = np.empty((SAMPLES, *np.shape(x)) if sampled else (SAMPLES, 0), np.uint16)  # (bfloat16 bits)
    bound = np.empty(np.shape(x), np.float32 if getattr(bounds.current, "narrow", False) else np.float64)
    decided = np.zeros(np.shape(x) if kind == DIVIDE else 0, bool)
    draws = (bounds.draw_key(), _groups(inst, orig, x, operands)) if rounds else (np.uint64(0), _NO_KEYS)
    any_own, *stats = elementwise_pass(
        kind,
        same,
        rounds,
        _flat(x),
        _flat(operands[0]),
        _flat(operands[-1]),
        errors[0],
        errors[1] if len(errors) == 2 else _NO_ERRORS,
        deviations[0],
        deviations[-1] if len(operands) == 2 else _NO_DEVIATIONS,
        rule,
        (*draws, float(SIGMAS)),
        bound.reshape(-1),
        samples.reshape(SAMPLES, -1),
        decided.reshape(-1),
        CALIBRATION_BLOCK,
    )
    made = samples.view(SAMPLE_STORAGE) if sampled else None
    unused = draws[0] if rounds and not any_own else None
    store_pass(bounds, x, operands, bound, decided if kind == DIVIDE else None, made, stats, unused)
    return True


# XLA:CPU's f32 rsqrt (rsqrtss and a Newton step) beyond the correctly rounded 1 / sqrt(x), in f32 ulps: measured at
# most 1.66 ulps from 1 / sqrt(x) over 2^20 values log-uniform in 2^-120..2^120 (jaxlib 0.10.2)
RSQRT_ULPS = 1.25


def reciprocated(divisor, etype) -> bool:
    """Whether XLA's HandleDivide makes a divide by `divisor` a multiply by its reciprocal: A / broadcast(B) (on
    CPU), A / constant (1 / c folded in the type: the same rounding), A / sqrt(B) as A * rsqrt(B) (f16, f32: bf16 is
    converted to f32 around the sqrt first, and the rule does not see it)."""
    return divisor.opcode in ("broadcast", "constant") or (divisor.opcode == "sqrt" and etype.name in ("f16", "f32"))


def reciprocal_divisor(bounds, inst, orig, x, divisor, error, deviations) -> tuple[np.ndarray, np.ndarray]:
    """The divisor's bound and deviations (flat, as fused_elementwise passes them) where the device computes
    x / broadcast(m) as x * broadcast(1 / m), x / c as x * (1 / c), x / sqrt(m) as x * rsqrt(m)
    (DeviceProfile.divide_by_reciprocal): fl(1 / m) = (1 / m)(1 + d) is
    x divided by m / (1 + d), so m carries |m| |d| / (1 - |d|) more error, one rounding draw per element of m
    (every quotient made from it shares it). |d|: the reciprocal type's relative rounding (f64's, f16's after
    f32's; f32, and the narrower types computed in f32, f32's -- twice for those: the product rounds to f32
    before their own rounding; an f32 rsqrt's RSQRT_ULPS, its largest: m is the sqrt, whose rounding its bound
    holds), or where 1 / m lies below the normals its subnormal step's, or all of it where f32 flushes them."""
    dtype = orig.shape.element_type.numpy
    rsqrt = RSQRT_ULPS * 2.0**-23 if inst.operands[1].opcode == "sqrt" else 0.0
    if dtype == np.float64:
        unit, step, flushes = 2.0**-53, 2.0**-1075, False
    elif dtype == np.float16:  # (1 / m in f32, then rounded to f16)
        unit, step, flushes = 2.0**-11 + 2.0**-24 + rsqrt, 2.0**-25 + 2.0**-150, False
    else:
        unit = rsqrt or (2.0**-24 if dtype == np.float32 else 2.0**-23 * (1 + 2.0**-24))
        step, flushes = 2.0**-150, bounds.device.flush_subnormals
    m = np.abs(_flat(divisor), dtype=np.float64)
    d = np.maximum(unit, step * m)
    if flushes:
        d[m > 2.0**126] = 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        extra = np.where(d < 1, m * d / (1 - d), np.inf)
    extra[(m == 0) | ~np.isfinite(m)] = 0.0  # (1 / 0 and 1 / inf are exact)
    # (a rounding's largest error, as SIGMAS sigmas of a uniform one; an f32 rsqrt's measured largest as it is)
    own = extra if rsqrt and dtype == np.float32 else extra * (SIGMAS / np.sqrt(3))
    e = error.astype(np.float64) if error.size else 0.0
    bound = np.minimum(np.sqrt(e * e + own * own), e + extra) * (1 + 2.0**-23)  # (kept up through float32)
    narrow = error.dtype if error.size else (np.float32 if getattr(bounds.current, "narrow", False) else np.float64)
    if inst.operands[1].opcode == "broadcast":
        source, _ = broadcast_sources(inst.operands[1], np.shape(x))
    else:  # (a constant, a sqrt: every element its own)
        source = np.arange(np.size(x)).reshape(np.shape(x))
    keys = contiguous(np.broadcast_to(source, np.shape(x))).reshape(-1)
    draws = np.empty((4 * ((SAMPLES + 3) // 4), keys.size), np.float32)
    rounding_draws(bounds.draw_key(), 0, keys, draws)
    moved = deviations.view(SAMPLE_STORAGE).astype(np.float32) if deviations.size else 0.0
    scale = np.where(np.isfinite(extra), extra / np.sqrt(3), 0.0).astype(np.float32)
    moved = (moved + draws[:SAMPLES] * scale).astype(SAMPLE_STORAGE)
    return bound.astype(narrow), np.ascontiguousarray(moved.view(np.uint16))


def store_pass(bounds, x, operands, bound, marks, samples, stats, unused_key=None) -> None:
    """A compiled pass's result for `x` into `bounds`: `unused_key` given back where given (the pass drew a key
    for own errors it turned out not to have: `_sample` draws one only where a value has some), the operands'
    rounding-decided marks carried onto the op's own `marks` (None: none; each distinct operand's once), the bound
    (the pass's new array: scaled in place) calibrated by its `samples` (None: not sampled) with the pass's block
    statistics `stats`."""
    if unused_key is not None:
        bounds.give_back_key(unused_key)
    for m in {id(o): bounds._decided_or_none(o) for o in operands}.values():
        if m is not None:
            marks = np.array(m, bool) if marks is None else marks | m
    if samples is not None:
        bound = bounds._calibrate(bound, samples, stats=stats, in_place=True)  # (the pass's own array)
    bounds._put(x, bound, marks, samples)


def _groups(inst, orig, x, operands) -> np.ndarray:
    """elementwise_pass's `keys`: each element's group where the program makes one error for a group of elements
    (`shared_rounding`; -1: its own), none where no element shares one."""
    keys = shared_rounding(inst, orig, x, operands)
    return _NO_KEYS if keys is None else _flat(keys)
