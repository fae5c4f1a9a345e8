"""The dot's error bound (tools/bounds.py's module docstring says the rule) and the products of non-negative terms
it is made of, computed in float32 as upper bounds of their float64 forms (kernels/bound_products.py says why
they are)."""

from __future__ import annotations

import numpy as np

from ..kernels.bound_products import (
    add_unscaled,
    dot_variance,
    least_magnitude,
    finish_samples,
    least_relative,
    scaled_terms,
    unscaling,
)
from ..kernels.bound_products import (
    squared_terms as squared_terms_of,
    top_exponent,
)
from ..ir.dtypes import element_type
from ..kernels.dot_algorithms import FP8_K_BLOCK, fp8_fast_accumulation
from ..ir.module import Instruction
from ..ops.contraction import dot_general, ragged_masks
from ..options.devices import ALGORITHM_ARITHMETIC
from .bound_samples import CALIBRATION_BLOCK, FLUSHED_BELOW, SAMPLES, SIGMAS, perturbed_product
from .bound_elementwise import rounding_rule
from .bound_generic import with_floor
from .bound_store import SAMPLE_STORAGE, has_error
from .bound_shared import along_contraction, dot_rounding

# significand bits (the implicit one counted) of the types dots operate and accumulate in (a complex type's: its
# parts'; c64's dots were taken for f64's; tf32: the part type of the tf32 algorithms)
SIGNIFICAND = {"f16": 11, "bf16": 8, "tf32": 11, "f32": 24, "f64": 53, "c64": 24, "c128": 53}
# their smallest subnormals (tf32: f32's exponent range, 10 stored bits); a type's smallest normal is it times
# 2^(SIGNIFICAND - 1)
SMALLEST = {"f16": 2.0**-24, "bf16": 2.0**-133, "tf32": 2.0**-136, "f32": 2.0**-149, "f64": 2.0**-1074}
FLOAT32_TERMS = 1 << 20  # the float32 products' factor bounds their rounding up to this many terms (longer: f64)
# a dot's sum of squares is bounded from its operands' errors (dot_bounds) where its term is then at most this share
# of them (the bound grows by at most half of it: 2^-13)
ESTIMATED_SHARE = 2.0**-12
FLOOR_STEPS = 1 << 20  # the steps a dot's floor may always take, an order (dot_floor)
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def widest(a: str, b: str) -> str:
    return a if SIGNIFICAND.get(a, 53) >= SIGNIFICAND.get(b, 53) else b


class Terms:
    """An operand's non-negative terms (|x| or x^2) for `UpperDot`: in float32 times 2^-shift, or float64 as they
    are (contractions too long for float32's factor)."""

    def __init__(self, x, square: bool, contracted: int, scaled: tuple | None = None):
        """`scaled`: (the float32 terms, shift) made already (squared_terms); x: their shape."""
        if scaled is not None:
            self.values, self.shift = scaled[0].reshape(np.shape(x)), scaled[1]
            self.below = top_exponent(contracted) - self.shift
            return
        x = np.abs(x) if np.iscomplexobj(x) else np.asarray(x)
        if contracted > FLOAT32_TERMS:
            self.values, self.shift = np.square(x, dtype=_F64) if square else np.abs(x, dtype=_F64), 0
            self.below = 0  # (not read: float64 terms' samples are float64 dots)
            return
        self.values = np.empty(x.shape, _F32)
        flat = np.ravel(x)  # (a copy where x is not contiguous or broadcast)
        self.shift = int(scaled_terms(flat, square, top_exponent(contracted), self.values.reshape(-1)))
        # every finite term is below 2^below (of x^2 where squared)
        self.below = top_exponent(contracted) - self.shift


class UpperDot:
    """The dot `inst` of non-negative terms, added up into float64 results never below the exact dots: each a
    float32 product of scaled terms times 1 + (K + 2) 2^-23 (K: the contraction's length; kernels/bound_products.py
    proves the bound)."""

    def __init__(self, inst, contracted: int):
        self.dims = [list(inst.attr(f"{s}_{d}_dims", ())) for d in ("batch", "contracting") for s in ("lhs", "rhs")]
        self.factor = 1.0 + (contracted + 2) * 2.0**-23

    def product(self, lhs: Terms, rhs: Terms) -> tuple[np.ndarray, float, int]:
        """(the dot of `lhs`'s and `rhs`'s terms as computed, flat; factor; shift): float64(product) x factor x
        2^shift is the upper bound (kernels/bound_products.add_unscaled; float64 terms: the product itself)."""
        lb, rb, lc, rc = self.dims
        if lhs.values.dtype == _F64:
            return dot_general(lhs.values, rhs.values, lb, rb, lc, rc, _F64).reshape(-1), 1.0, 0
        product = dot_general(lhs.values, rhs.values, lb, rb, lc, rc, _F32)
        return product.reshape(-1), self.factor, -(lhs.shift + rhs.shift)

    def add(self, out: np.ndarray | None, lhs: Terms, rhs: Terms, shape: tuple) -> np.ndarray:
        """out += the dot of `lhs`'s and `rhs`'s terms (an upper bound; `shape`: the dot's); returns out (None: a
        new array of it)."""
        product, factor, shift = self.product(lhs, rhs)
        made = np.empty(shape) if out is None else out
        add_unscaled(product, factor, shift, made.reshape(-1), out is not None)
        return made


def _error(bounds, leaf):
    """The stored bound of a dot's operand (float32 or float64, its shape), None where it has none or it is 0
    (has_error: stops at a first nonzero, where np.any reads every element)."""
    e = bounds._stored_bound(leaf)
    return np.broadcast_to(e, np.shape(leaf)) if has_error(e) else None


def squared_terms(x, error, contracted: int) -> tuple[Terms, Terms | None, float]:
    """(Terms of x^2, Terms of error^2, _least_relative(error, x)) of a dot operand and its bound (None: (x^2's,
    None, 0)): float32 terms of real operands in two passes (kernels/bound_products.squared_terms: the same
    bits)."""
    if error is None:
        return Terms(x, True, contracted), None, 0.0
    if contracted > FLOAT32_TERMS or np.iscomplexobj(x):
        return Terms(x, True, contracted), Terms(error, True, contracted), _least_relative(error, x)
    flat, error_flat = np.ravel(x), np.ravel(error)  # (copies where not contiguous or broadcast)
    made = np.empty(flat.size, _F32), np.empty(flat.size, _F32)
    x_shift, error_shift, relative = squared_terms_of(flat, error_flat, top_exponent(contracted), *made)
    return (
        Terms(x, True, contracted, (made[0], x_shift)),
        Terms(x, True, contracted, (made[1], error_shift)),
        relative,
    )


def float32_noise(contracted: int, a2: Terms, b2: Terms) -> tuple[float, float]:
    """(noise, floor): the samples' deviations of a dot whose operands both have samples may be a float32 product
    less the dot, (a + da)(b + db) - x (one product per sample at float32's speed, bound_samples.perturbed_product),
    instead of float64 dots, where on every element noise (squares + x^2) + floor <= the operands' errors'
    variance (SIGMAS sigmas squared; kernels/bound_products.dot_variance checks it): float32's rounding there,
    u^2 K (squares + x^2) by the accumulation's model (u = 2^-24; the product's accumulation, the operands' and
    x's rounding to float32), plus the flushing of the perturbed operands' magnitudes below F = FLUSHED_BELOW (at
    most 3 K^2 F^2 (max a^2 + max b^2 + F^2)), at most 2^-12 of it: what float32 adds to the samples is 1/64 of
    the rule's sigma (measured on the GPT step's dots: 1e-4 of the samples' RMS at most). Infinite (never) where
    |a| |b| K may reach float32's overflow (a2, b2: the operands' squares, below 2^below) or the terms are float64."""
    if not all(t.values.dtype == _F32 for t in (a2, b2)) or (a2.below + b2.below) // 2 + contracted.bit_length() > 120:
        return np.inf, np.inf
    u, flushed, margin = 2.0**-24, FLUSHED_BELOW**2, SIGMAS * SIGMAS * 2.0**12
    floor = 3.0 * contracted * contracted * flushed * (2.0**a2.below + 2.0**b2.below + flushed)
    return margin * u * u * contracted, margin * floor


def _arithmetic(bounds, inst, orig, a, b) -> tuple[float, str, str]:
    """The dot's arithmetic under the device (DeviceProfile.dot_algorithm, ALGORITHM_ARITHMETIC): the unit
    roundoff its operands are rounded to (0: none), the type it accumulates in, the algorithm ("": none)."""
    types = [o.shape.element_type for o in orig.operands]
    free = [  # each side's free dims (neither batch nor contracting)
        o.ndim - len(inst.attr(f"{s}_contracting_dims", ())) - len(inst.attr(f"{s}_batch_dims", ()))
        for o, s in ((a, "lhs"), (b, "rhs"))
    ]
    algorithm = bounds.device.dot_algorithm(
        inst.attr("algorithm", "") or "",
        tuple(inst.attr("operand_precision", ()) or ()),
        all(t is not None and t.name == "f32" for t in types),
        0 in free,
    )
    # without an algorithm, 16-bit dots accumulate in f32 on every XLA backend (CPU, cuBLAS, the MXU)
    bits, accumulator = ALGORITHM_ARITHMETIC.get(algorithm, (0, widest(orig.shape.element_type.name, "f32")))
    if algorithm:
        bounds.algorithms.add(algorithm)
    if not bits or bits >= min(SIGNIFICAND.get(t.name, 53) for t in types):
        return 0.0, accumulator, algorithm
    return 2.0**-bits * (2 if _truncates(bounds, algorithm) else 1), accumulator, algorithm


def _truncates(bounds, algorithm: str) -> bool:
    return algorithm.startswith("dot_tf32") and bounds.device.tf32_rounding == "truncate"


def subnormal_allowance(bounds, inst, orig, x, a, b, algorithm: str, accumulator: str) -> np.ndarray | None:
    """The most a dot's roundings below the types' normals can add to each element (flat, float64), beyond the
    rule's relative terms (u |x|); None where no operand is small enough for any (a pass over each operand for
    its least nonzero magnitude decides: a normal dot's bound is not touched).

    - Operands rounded to the algorithm's part type (f32 operands of a tf32, bf16 or f16 algorithm, every pass
      of X3 / X6 / X9 too: the parts all lie on that type's grid): an operand below the part type's smallest
      normal keeps only its subnormal bits, an error up to half their spacing h (TF32 truncated: h whole), not
      u |a| (f32's subnormal 2^-140 -> TF32's 2^-136 grid: all of it): h (|b| (1 + u) + h) per such term. On a
      device that flushes (DAZ), an f32 or bf16 operand below f32's smallest normal is read as 0: |a| |b| more,
      added linearly (the terms' errors are their values: they add up as the dot does, not as independent ones).
    - Products (and FMA steps) rounded in the accumulator below its smallest normal: an error up to half its
      smallest subnormal e (a device that flushes: up to its smallest normal), each pass's product of each term.
      Only a term with |a b| < e 2^(2p) can have one
      (p: the operand type's significand bits: every part's last bit is at least 2^-p of its operand, so the
      exact product's is at least |a b| 2^-2p, on e's grid above that): counted per element as the terms with
      |a| < t or |b| < e 2^(2p) / t (t its square root, about), at most K."""
    types = {o.shape.element_type.name for o in orig.operands}
    if len(types) != 1 or np.iscomplexobj(a) or np.iscomplexobj(b) or a.dtype.kind != "f" or b.dtype.kind != "f":
        return None
    operand = types.pop()
    if operand not in SMALLEST or accumulator not in SMALLEST:
        return None
    least = least_magnitude(a), least_magnitude(b)
    part = algorithm.split("_")[1] if algorithm.startswith(("dot_tf32", "dot_bf16", "dot_f16")) else ""
    rounded = operand == "f32" and part in SMALLEST
    flushing = bounds.device.flush_subnormals and operand in ("f32", "bf16")
    # operands below twice this may lose their subnormal bits (the shadow's are the device's within their errors)
    tiny = max(
        SMALLEST[part] * 2.0 ** (SIGNIFICAND[part] - 1) if rounded else 0.0,
        SMALLEST["f32"] * 2.0 ** (SIGNIFICAND["f32"] - 1) if flushing else 0.0,
    )
    e = SMALLEST[accumulator]
    below = e * 2.0 ** (2 * SIGNIFICAND[operand])  # a term's product can round below the normals under it
    if min(least) >= 2 * tiny and least[0] * least[1] >= below:
        return None
    contracted = int(np.prod([a.shape[d] for d in inst.attr("lhs_contracting_dims", ())], dtype=np.int64))
    lb, rb, lc, rc = (list(inst.attr(f"{s}_{d}_dims", ())) for d in ("batch", "contracting") for s in ("lhs", "rhs"))
    allowance = np.zeros(np.size(x))
    if min(least) < 2 * tiny:
        h = SMALLEST[part] * (1.0 if _truncates(bounds, algorithm) else 0.5) if rounded else 0.0
        grow = 1 + 2.0 ** -SIGNIFICAND[part] if rounded else 1.0
        for k, (o, other) in enumerate(((a, b), (b, a))):
            if least[k] < 2 * tiny:
                below_tiny = (np.abs(o) < 2 * tiny) & (o != 0)
                lost = np.where(below_tiny, h + (np.abs(o) if flushing else 0.0), 0.0)  # (flushed: read as 0)
                magnitudes = np.abs(other, dtype=np.float64)
                lhs, rhs = (lost, magnitudes) if k == 0 else (magnitudes, lost)
                allowance += grow * np.ravel(dot_general(lhs, rhs, lb, rb, lc, rc, np.float64))
        allowance += h * h * contracted
    if least[0] * least[1] < below:
        passes = int(algorithm.rsplit("_x", 1)[1]) if "_x" in algorithm else 1
        t_a = 2.0 ** (int(np.log2(below)) // 2)
        counts = [
            along_contraction(((np.abs(o) < t) & (o != 0)).astype(np.float64), inst, side, np.sum)
            for o, side, t in ((a, "lhs", t_a), (b, "rhs", below / t_a))
        ]
        terms = np.minimum(counts[0][:, :, None] + counts[1][:, None, :], contracted)
        # (a device that flushes makes such a product or step 0: an error up to the smallest normal)
        step = e * 2.0 ** (SIGNIFICAND[accumulator] - 1) if bounds.device.flush_subnormals else e / 2
        allowance += step * passes * np.ravel(terms)
    return allowance


def fast_accumulation_allowance(bounds, inst, orig, a, b) -> np.ndarray | None:
    """The most an fp8 GEMM's fast accumulation (kernels/dot_algorithms.fp8_fast_accumulation: Hopper's partial
    sums never promoted to f32) can add to each element (flat, float64), beyond the f32 accumulation's rule; None
    where the dot has none. The device profile's model: the products summed in f32 FP8_K_BLOCK contracting elements
    at a time, the running sum truncated to `fp8_accumulator_bits` = p significand bits after each block (DeepSeek-V3
    report, 3.3.2: about 14 bits). A truncation loses less than 2^(1-p) of the sum it cuts, always towards zero, so
    the errors do not average out: after block j of n the running sum s_j loses at most 2^(1-p) |s_j|, each sum
    carrying the errors before it: at most 2^(1-p) (1 + 2^(1-p))^n sum_j |s_j|, the s_j the exact prefix sums (of
    the shadow's operands: the fp8 values the device reads)."""
    types = [o.shape.element_type.name for o in orig.operands[:2]]
    if not fp8_fast_accumulation(bounds.device, inst.attr("algorithm"), inst.attr("operand_precision"), *types):
        return None
    ka, kb = (tuple(inst.attr(f"{side}_contracting_dims", ())) for side in ("lhs", "rhs"))
    if len(ka) != 1:  # (the kernel refuses it: kernels/dot_algorithms._blocked)
        return None
    lb, rb = (list(inst.attr(f"{side}_batch_dims", ())) for side in ("lhs", "rhs"))
    lost = 2.0 ** (1 - bounds.device.fp8_accumulator_bits)
    total, prefix, blocks = None, None, range(0, a.shape[ka[0]], FP8_K_BLOCK)
    for k in blocks:
        part = dot_general(
            np.take(a, range(k, min(k + FP8_K_BLOCK, a.shape[ka[0]])), axis=ka[0]),
            np.take(b, range(k, min(k + FP8_K_BLOCK, b.shape[kb[0]])), axis=kb[0]),
            lb,
            rb,
            list(ka),
            list(kb),
            _F64,
        )
        prefix = part if prefix is None else prefix + part
        total = np.abs(prefix) if total is None else total + np.abs(prefix)
    if total is None:
        return None
    return np.ravel(total) * (lost * (1 + lost) ** len(blocks))


def _added(*allowances) -> np.ndarray | None:
    """Allowances (flat float64 arrays, None: none) added up; None where every one is None."""
    present = [x for x in allowances if x is not None]
    return None if not present else present[0] if len(present) == 1 else sum(present)


def _least_relative(error, value) -> float:
    """A lower bound of a dot operand's least relative error (kernels/bound_products.least_relative)."""
    magnitude = np.abs(value) if np.iscomplexobj(value) else value
    return least_relative(np.ravel(np.broadcast_to(error, np.shape(value))), np.ravel(magnitude))


def dot_bounds(bounds, inst, orig, x, operands) -> tuple:
    """A dot's bound (ErrorBounds' rule, stored) and (its own error, SIGMAS sigmas; a function giving its ceiling)
    for the samples' calibration. Marks `bounds.current.dot_samples_in_f32` (float32_noise). Where every operand
    term's relative error is large enough that the sum of squares' share of the bound is at most ESTIMATED_SHARE of
    the operands' errors, the sum of squares is bounded from those errors instead of a product: with r an operand's
    least relative error e_k / |b_k|, sum_k a_k^2 b_k^2 <= (sum_k a_k^2 e_k^2) / r^2 <= errors / r^2."""
    a, b = operands
    contracted = int(np.prod([a.shape[d] for d in inst.attr("lhs_contracting_dims", ())], dtype=np.int64))
    upper = UpperDot(inst, contracted)
    ea, eb = _error(bounds, a), _error(bounds, b)
    # an integer operand (bf16 x s4 weights) as float64, exactly: the compiled passes type no ml_dtypes int4
    a, b = (o if o.dtype.kind in "fc" else o.astype(np.float64) for o in (a, b))
    # the operands' squares and bounds' squares as float32 terms, each operand's least relative error (0: none)
    (a2, ea2, relative_a), (b2, eb2, relative_b) = squared_terms(a, ea, contracted), squared_terms(b, eb, contracted)
    # the operands' errors, independent across the contraction: sum_k a^2 e_b^2, sum_k e_a^2 b^2 (empty: none)
    none = np.empty(0, np.float32), 1.0  # (a product and its scale: kernels/bound_products.unscaling)
    from_b = from_a = none
    # ... but for a part all terms may share (a bias's rounding): the operands' sums times the other's least bound
    sums = [along_contraction(o, inst, side, np.sum) for o, side in ((a, "lhs"), (b, "rhs"))]
    least = [np.empty((len(s), 0)) for s in sums]  # (none: that operand has no errors)
    if eb is not None and eb2 is not None:
        from_b = unscaling(*upper.product(a2, eb2))
        least[1] = along_contraction(eb, inst, "rhs", np.min)
    if ea is not None and ea2 is not None:
        from_a = unscaling(*upper.product(ea2, b2))
        least[0] = along_contraction(ea, inst, "lhs", np.min)
    del ea2, eb2
    operand_u, accumulator, algorithm = _arithmetic(bounds, inst, orig, a, b)
    # (a complex dot's parts are real sums of 2K products, ar br - ai bi: the rule on moduli with 2K terms is the
    # root-sum-square of the parts' real rules, as the moduli's squares, |a|^2 |b|^2, are the four products')
    terms = contracted * (2 if np.iscomplexobj(x) else 1)
    accumulation = (SIGMAS * 2.0 ** -SIGNIFICAND.get(accumulator, 53)) ** 2 / 3 * terms
    r = max(relative_a, relative_b)
    estimated = operand_u == 0 and r > 0 and accumulation <= ESTIMATED_SHARE * r * r
    squares = none if estimated else unscaling(*upper.product(a2, b2))
    noise, floor = float32_noise(contracted, a2, b2)
    del a2, b2
    # its bound after the final rounding (ErrorBounds._round's) and its own error, in the same pass
    rule = rounding_rule(orig.shape.element_type, "dot")
    bound = np.empty(x.shape, np.float32 if rule and getattr(bounds.current, "narrow", False) else np.float64)
    local = np.empty(x.shape)
    bounds.current.dot_samples_in_f32 = dot_variance(
        np.empty(0),
        from_b[0],
        from_a[0],
        squares[0],
        np.array([from_b[1], from_a[1], squares[1]]),
        np.ravel(np.abs(x) if np.iscomplexobj(x) else x),  # (the rule reads |x|^2)
        sums[0],
        least[1],
        sums[1],
        least[0],
        (1 + 2.0**-50) / (r * r) if estimated else 0.0,  # (1 / r^2 rounded twice: raised by 2^-50)
        accumulation,
        operand_u,
        SIGMAS * np.sqrt(2 / 3),
        noise,
        floor,
        np.empty(0),
        (bound.reshape(-1), local.reshape(-1), rule),
        _added(
            subnormal_allowance(bounds, inst, orig, x, a, b, algorithm, accumulator),
            fast_accumulation_allowance(bounds, inst, orig, a, b),
        ),
    )
    del from_b, from_a, squares
    bounds._put(x, bound)

    def ceiling():  # the operands' errors all adding up, and its own (computed only if the samples raise it)
        linear = np.array(local, np.float64)
        if eb is not None:
            upper.add(linear, Terms(a, False, contracted), Terms(eb, False, contracted), x.shape)
        if ea is not None:
            upper.add(linear, Terms(ea, False, contracted), Terms(np.abs(b) + bounds.of(b), False, contracted), x.shape)
        return linear

    return local, ceiling


def dot_floor(bounds, inst, orig, x, operands) -> np.ndarray | None:
    """A real dot's floor (bound_generic.with_floor's) where its products repeat (bound_shared.dot_rounding), in
    its accumulation type (f16, bf16, f32: f64 is the shadow's own; fp8 operands' GEMMs keep other bits), in at
    most its operands' size of steps an order, or FLOOR_STEPS (~1 ms)."""
    a, b = operands
    if not all(np.asarray(o).dtype.kind == "f" for o in (a, b, x)):
        return None
    _, accumulator, _ = _arithmetic(bounds, inst, orig, a, b)
    if SIGNIFICAND.get(accumulator, 53) > 24 or any(o.shape.element_type.bits <= 8 for o in orig.operands):
        return None
    count = int(np.prod([a.shape[d] for d in inst.attr("lhs_contracting_dims", ())], dtype=np.int64))
    coefficient = (SIGMAS * 2.0 ** -SIGNIFICAND[accumulator]) ** 2 / 3 * count
    types = [o.shape.element_type.numpy for o in orig.operands]
    accumulation = element_type(accumulator).numpy
    return dot_rounding(inst, a, b, types, accumulation, x, coefficient, max(a.size + b.size, FLOOR_STEPS))


def store_dot_samples(bounds, inst, x, operands, held, own, ceiling, floor=None) -> None:
    """The samples of a dot whose operands both have them (`held`: as kept), float32 suffices (float32_noise), into
    `bounds` with its bound calibrated, as ErrorBounds._sample makes them (the same bits, the same draws' key):
    their float32 product (bound_samples.perturbed_product), then one pass (kernels/bound_products.finish_samples)
    taking x off, adding the own-error draws of `own` (SIGMAS sigmas), tallying the calibration's block statistics
    and encoding the samples as kept; `ceiling`: dot_bounds'; `floor`: dot_floor's (bound_generic.with_floor)."""
    moved = perturbed_product(inst, operands, held)
    noisy = own is not None and bool(np.any(own))
    key = bounds.draw_key() if noisy else np.uint64(0)  # (drawn where _sample draws one)
    bound = bounds._stored_bound(x)
    samples = np.empty(moved.shape, np.uint16)
    stats = finish_samples(
        moved.reshape(SAMPLES, -1),
        np.ravel(x),
        np.ravel(np.broadcast_to(np.asarray(own, np.float64), np.shape(x))) if noisy else np.empty(0),
        key,
        SIGMAS,
        np.zeros(np.size(x), np.float32) if bound is None else np.ravel(bound),
        CALIBRATION_BLOCK,
        samples.reshape(SAMPLES, -1),
    )
    del moved
    kept = samples.view(SAMPLE_STORAGE)
    bound = bounds._calibrate(bound, kept, ceiling, stats=stats)
    bounds._put(x, with_floor(bound, kept, floor), bounds._decided_or_none(x), kept)


def ragged_dot_bounds(bounds, inst, orig, x, operands) -> tuple:
    """A ragged-dot's bound (stored) and (its own error, its ceiling) as dot_bounds gives them for the dot it is
    group by group: the lhs masked to each group's elements (ops/contraction.ragged_masks) with a leading group
    dim, a batch dim of both sides (the rhs's group dim; a contracting ragged dim: the rhs repeated). A
    non-contracting ragged dim's result is the groups' results added (one group an element, the others exact
    zeros); a contracting one's is the groups' results (each group's sum counted as the whole contraction's: its
    accumulation bound is that of the longer sum); a batch one is a plain dot."""
    lhs, rhs, sizes = operands
    lb, rb, lc, rc = (list(inst.attr(f"{s}_{d}_dims", ())) for d in ("batch", "contracting") for s in ("lhs", "rhs"))
    group = list(inst.attr("rhs_group_dims", ()) or ())
    if list(inst.attr("lhs_ragged_dims"))[0] in lb:  # (a plain dot)
        lhs_dims, rhs_dims, a, b, mask = (lb, lc), (rb, rc), lhs, rhs, None
    else:
        mask = ragged_masks(inst, lhs.shape, sizes)
        a = np.where(mask, lhs[None], np.zeros((), lhs.dtype))
        bounds._put(a, np.where(mask, bounds.of(lhs)[None], 0.0))
        lhs_dims = ([0] + [d + 1 for d in lb], [d + 1 for d in lc])
        if group:  # (the rhs's group dim is the groups' batch dim)
            b, rhs_dims = rhs, (group + rb, rc)
        else:
            b = np.broadcast_to(rhs, (mask.shape[0], *rhs.shape))
            bounds._put(b, np.broadcast_to(bounds.of(rhs), b.shape))
            rhs_dims = ([0] + [d + 1 for d in rb], [d + 1 for d in rc])
    attrs = {
        f"{side}_{kind}_dims": "{" + ",".join(map(str, dims[k])) + "}"
        for side, dims in (("lhs", lhs_dims), ("rhs", rhs_dims))
        for k, kind in enumerate(("batch", "contracting"))
    }
    attrs.update({k: v for k, v in inst.attrs.items() if k in ("operand_precision", "algorithm")})
    dot = Instruction(inst.name, "dot", inst.shape, [inst.operands[0], inst.operands[1]], attrs)
    orig_dot = Instruction(orig.name, "dot", orig.shape, [orig.operands[0], orig.operands[1]], attrs)
    if not group:  # (the groups' results are the ragged-dot's: a batch or contracting ragged dim)
        return dot_bounds(bounds, dot, orig_dot, x, [a, b])
    groups = dot_general(a, b, lhs_dims[0], rhs_dims[0], lhs_dims[1], rhs_dims[1], np.result_type(x, np.float64))
    local, ceiling = dot_bounds(bounds, dot, orig_dot, groups, [a, b])
    bounds._put(x, np.sum(bounds.of(groups), axis=0))
    return np.sum(local, axis=0), lambda: np.sum(ceiling(), axis=0)
