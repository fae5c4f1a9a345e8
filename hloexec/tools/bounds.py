"""Per-element error bounds, computed alongside the shadow run: how far the program's arithmetic (under a device
profile) may take each element of each value from its exact value.

The shadow's run is observed instruction by instruction (fusions opened up, loops per iteration); each float
value it makes gets a bound array (f64, its shape), from its operands' bounds and the instruction's own rounding.
A bound stands for SIGMAS standard deviations of the element's error: independent contributions combine as a
root-sum-square, a single rounding counts as the largest error it can make.

- moving ops (reshape, transpose, broadcast, slice, concatenate, pad, gather, dynamic-(update-)slice, copy...)
  move their operands' bounds: the op's own kernel run on the bounds;
- elementwise ops: first-order propagation measured on the op itself, per operand max |f(.., a_k +- e_k, ..) -
  f(a)| (the op's own kernel at the ends of the operand's interval: exact for monotone ops, no derivative table;
  one value passed twice, x * x, moves in both places at once), the operands' contributions combined as
  independent, plus what two operands' errors do together beyond first order (multiply, divide, power: at the
  corners of both intervals), plus the op's own rounding: half an ulp of the program's type at the value as
  SIGMAS sigmas of a uniform error (0 where the operands are exact and x is a value of the type),
  transcendentals TRANSCENDENTAL_ULPS more ulps of f32 (XLA's f32 approximations); a bf16 value converted to f32
  keeps its bf16 bound (the convert is exact, the bound flows through);
- add-reductions: the larger of the root-sum-square of the terms' bounds and a part they may all share, at most
  the smallest of them, times their count plus the root-sum-square of the rest (an error shared by the terms --
  a row's mean or scale, a bias's rounding -- adds up: measured on an f16 LayerNorm's gradient, the
  root-sum-square alone was 2x short; a one-term sum keeps its term's bound; a reduce-window's terms' bounds are
  added), plus the accumulation's rounding in the device's accumulation type (its
  `reductions` rule: "per-step", the HLO's own meaning, every reducer step rounding in the reduction's type;
  "accumulate", 16-bit sums in f32 and one final rounding) as a probabilistic bound: SIGMAS standard
  deviations of a sequential sum's rounding error, whose variance
  (u^2/3) * sum_k s_k^2 over its partial sums s_k is estimated as n * (sum x_i^2 + S^2) (a random walk plus a
  drift to the total S), whatever the order; max/min reductions move bounds; product reductions (reduces and
  reduce-windows, real and complex) and reducers rounding each step to a narrower type: tools/bound_sums.py;
- dots: sqrt(A^2 e_B^2 + e_A^2 B^2) (the operands' errors taken as independent along the contraction: measured,
  the linear |A| e_B + e_A |B| through a transformer block's dots grows past any use) plus |A . min_k e_B| +
  |min_k e_A . B| (an error every term may share, at most the smallest bound along the contraction: a bias's
  bf16 rounding reaching every position of a tied embedding's gradient), plus
  the device's arithmetic (DeviceProfile.dot_algorithm, ALGORITHM_ARITHMETIC):
  operands rounded to the algorithm's significand bits (bf16 passes, TF32: u |x| + SIGMAS sigma of the K
  independent product errors), the accumulation in its type (as a reduction's; without an algorithm the wider
  of the result type and f32: what XLA's CPU, GPU and TPU dots do), the final rounding;
- convolutions: one that is a dot (no spatial dims, one group: a TPU program's matmul) as that dot; the others
  by the convolution itself on the operands' squares and bounds (tools/bound_convolution.py);
- compare and select: a comparison whose operands' intervals overlap is *rounding-decided*; a select on it may
  take either branch, so its bound is the branches' distance plus their bounds.

Calibrated by sampled runs: the rules above cannot see errors cancel (x - mean(x), a softmax's normalization,
a LayerNorm gradient's terms): through a transformer block their bounds grew to 20-800x the errors. So SAMPLES
perturbed runs are carried along (each instruction's kernel on its operands moved by the samples' deviations,
plus a draw of its own error: one per element, but one per group where the program makes one error, the
rounding of an add of a broadcast value, `shared_rounding`), and per block of elements a bound is divided by
how loose the samples show it is (`_sample`, `_calibrate`; not a moved value's: its block holds copies). A sum's or dot's bound is also raised
to SIGMAS x its samples' RMS over the block where the rules fall short of it (up to its terms' bounds added): a term rounded once is bounded by its largest error, half an ulp, only 1.73 of its
sigmas, so the root-sum-square of such terms is 1.73 sigmas of their sum, not SIGMAS (an f16 LayerNorm
gradient's f32 row sum of f16-rounded terms reached 2.09x it on a correct run).

Rounding-decided elements (`decided`): where an operand's interval reaches a discontinuity -- the sign of a
near-zero value (sign, floor, a comparison), a division by, or sqrt / rsqrt / log / power of, an interval
that holds 0 (Adam's m / sqrt(v) at its first step, where the gradient's sign is rounding's choice). Elementwise
and moving ops carry the mark; reductions and dots do not (one decided term among thousands is averaged).

May-be-non-finite marks (tools/bound_overflow.py, after each instruction's rule): where an order or a rounding
the device allows can make an element +inf, -inf or NaN though its exact value is finite (a sum whose partial sums
may pass the type's range, a value whose interval reaches an infinity, a division by an interval holding 0), carried
through later ops; the verdict accepts a non-finite element of the kinds its mark allows.

Collectives (SPMD runs, one ErrorBounds per participant, each called from its participant's thread): the
collective's own kernel run on the operands' bounds (and on each sample's deviations; a max / min all-reduce's on
its perturbed operands, less the value) exchanges them with the group as the values were, so every participant
makes the same extra exchanges in the same order. Moving ones (all-gather, all-to-all, ragged-all-to-all,
collective-permute, -broadcast, a max/min all-reduce) move the bounds; an add all-reduce or reduce-scatter is a
reduction of n terms, one per participant: their bounds added (the samples calibrate that down where they are
independent) plus the accumulation's rounding as a reduce's, every
step rounding to the collective's type whatever the device's reductions rule (the partial sums travel between
participants in it: a ring's, a tree's, hloexec's fold in group order).

Sorts, top-k, radix sorts (their payloads too), fft and cholesky: tools/bound_sorts.py, tools/bound_fft.py,
tools/bound_cholesky.py. A map: its computation's steps observed on whole arrays (`_map`).

Complex values (c64, c128): a bound on the modulus of the error, |computed - exact| (the verdict's measure).
Their elementwise ops (real, imag and complex too): tools/bound_complex.py. Dots and add-reductions: the real
rules on the moduli (|a|^2 |b|^2 is the sum of the four real products' squares; a complex dot's part sums 2K real
products: tools/bound_dots.py). Samples: complex deviations (complex64), calibrated on their moduli
(tools/bound_complex.py, bound_samples.calibrate).

Variadic reduces: one whose reducer selects (argmax) by its interval ends (tools/bound_sorts.py); one whose reducer
makes each result from its own two values (sums, a (max, sum) pair) as one reduce per result (InstructionPlans.parts),
its sums rounding every step in their type; any other reducer of elementwise steps folded (tools/bound_reducers.py).
A send and the recv-done of its channel: a collective that moves. ragged-dot: its groups' dot (bound_dots.py).

What it cannot see: ops it has no rule for (custom-calls computing their own way, reducers that call computations,
sorts by comparators sort_keys does not read...) get an infinite bound (`unbounded` names them): their elements are not judged. Propagation is
first order beyond the binary ops' corners (a long chain of large relative errors is underestimated); the
root-sum-squares assume errors that do not conspire: two operands carrying one shared error through different
paths, a dot whose terms share one (a softmax row's scale), a sum sorted so its partial sums grow before they
cancel can exceed them. Data-dependent control flow (a loop's trip count, a branch) follows the shadow's values.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from ..ir import opcodes
from ..kernels.bound_products import least_magnitude
from ..kernels.bound_rules import add_noise, first_order_variance, round_bounds
from ..ops.collectives import participants
from ..ops.custom_call.registry import target_of
from ..ops.registry import async_shorthand
from ..exec.shadow import PINNED_SUFFIX
from ..options.devices import DeviceProfile
from ..spmd.devices import GROUPED
from .bound_cholesky import cholesky_bounds
from .bound_complex import BILINEAR, COMPLEX_LINEAR, add_complex_noise, bilinear_samples, complex_elementwise, corners
from .bound_complex import involves_complex, resolves_deviations, scaled_samples, select_samples, squared_magnitude
from .bound_convolution import convolution_bounds
from .bound_epilogues import epilogue_bounds
from .bound_dots import dot_bounds, dot_floor, ragged_dot_bounds, store_dot_samples
from .bound_fft import fft_bounds
from .bound_reducers import elementwise_steps, folded_reduce, observe_steps
from .bound_indices import Choices, follow
from .bound_sorts import selecting_reduce, selects, sorted_bounds, swapped_samples
from .bound_elementwise import FUSED, TRANSCENDENTAL, fused_elementwise, rounding_rule
from .bound_plans import InstructionPlans
from .bound_overflow import collective_marks, dot_marks, mark_overflows
from .bound_rewrites import rewritten
from .bound_store import EXACT_ELEMENTWISE, VIEW_MOVES, BoundStore, has_error, sample_dtype, widens_exactly
from .bound_store import leaves as _leaves
from .bound_store import float_leaf as _float
from .bound_generic import evaluated_elementwise, fused_select, moved_samples, store_summed, with_floor
from .bound_samples import SAMPLES, SIGMAS, calibrate, dot_samples
from .bound_sums import accumulation_variance, reduce_bounds, scatter_bounds

# twice f32's (and bf16's) smallest normal: a flushing device's subnormals (DAZ, FTZ) lie below it, and the values whose
# device values may be there (within half their magnitude)
FLUSHED_FROM = 2.0**-125
# Ops whose bound is their operands' bounds moved by the op itself (linear in the values, exact).
MOVES = (
    frozenset(
        {
            "dynamic-update-slice",
            "gather",
            "get-tuple-element",
            "tuple",
            "real",
            "imag",
            "complex",
        }
    )
    | opcodes.MOVEMENT
    | opcodes.PASS_THROUGH
)
# Collectives whose kernel (one exchange with the group) is linear in its operands: run on the bounds and the
# samples' deviations, it exchanges them as it exchanged the values (ragged-all-to-all's rows too: its offsets and
# sizes, exact integers, are the same in every exchange). A send's exchange queues what arrives for the recv-done
# of its channel, which takes it off: the two together move the data, its bound and its samples' deviations, in
# that order (a recv's own value is a placeholder: EXACT).
COLLECTIVES = frozenset(GROUPED) - {"recv"} | {"recv-done"}
ASYNC_WRAPPERS = frozenset({"async-start", "async-update", "async-done"})  # (of a called computation: `calls=`)
EXACT = frozenset({"parameter", "constant", "iota", "rng", "rng-bit-generator", "partition-id", "replica-id", "recv"})
ROUNDING_ELEMENTWISE = (
    frozenset(
        {
            "add",
            "subtract",
            "multiply",
            "divide",
            "remainder",
            "sqrt",
            "rsqrt",
            "convert",
            "reduce-precision",
        }
    )
    | TRANSCENDENTAL
)
# op -> operands at which an interval holding 0 is a discontinuity or a singularity
SINGULAR_AT_ZERO = {
    "sign": (0,),
    "divide": (1,),
    "sqrt": (0,),
    "rsqrt": (0,),
    "log": (0,),
    "power": (0,),
    "atan2": (0, 1),
    "remainder": (1,),
}
# op -> its divisor: an interval holding 0 there may make the value infinite (x / +-0) or NaN (0 / 0) in the
# device's arithmetic (tools/bound_overflow.py; sqrt, log... of such an interval are not marked: their operand is
# mostly a square or a norm, never negative however it rounds, and Adam's first step's sqrt(v) marked 328,304
# updates of the GPT step NaN)
DIVIDES_BY = {"divide": (1,), "remainder": (1,)}
# elementwise ops that move their value by at most what an operand moves (1-Lipschitz in each operand)
LIPSCHITZ = frozenset({"add", "subtract", "negate", "convert", "abs", "maximum", "minimum"})
# nonlinear binary ops: their operands' errors also act together (second order)
SECOND_ORDER = frozenset({"multiply", "divide", "power", "atan2", "remainder"})
# elementwise ops whose complex operands or results ErrorBounds gives to tools/bound_complex.py
COMPLEX_ELEMENTWISE = ROUNDING_ELEMENTWISE | EXACT_ELEMENTWISE | {"real", "imag", "complex"}
PREDICATE_LOGIC = frozenset({"and", "or", "not", "xor", "select"})  # (on predicates: what rounding decides, passed on)
STEPS = frozenset({"sign", "floor", "ceil", "round-nearest-afz", "round-nearest-even"})
# ops `_elementwise` evaluates at their operands' interval ends (`_evaluated`) -> (the places singular at 0, a step,
# rounds): those of one operand with errors in one compiled pass (tools/bound_generic.py)
EVALUATED = {
    op: (SINGULAR_AT_ZERO.get(op, ()), op in STEPS, op in ROUNDING_ELEMENTWISE)
    for op in (ROUNDING_ELEMENTWISE | EXACT_ELEMENTWISE) - LIPSCHITZ - {"multiply"}
}


def _of_no_terms(opcode: str, operands) -> bool:
    """A reduction over nothing (a reduce, reduce-window, dot or convolution of a zero-size operand): its result is
    its init value or zeros, moved from its operands as they are, with no rounding of its own."""
    return opcode in ("reduce", "reduce-window", "dot", "convolution") and any(
        isinstance(o, np.ndarray) and o.size == 0 for o in operands
    )


def _sums(inst) -> bool:
    """Whether `inst` is a reduce or reduce-window of one operand whose reducer adds, or a scatter of one whose
    combiner does (linear in its float operands)."""
    reducer = inst.called.get("to_apply")
    return (
        (inst.opcode in ("reduce", "reduce-window") and len(inst.operands) == 2)
        or (inst.opcode == "scatter" and len(inst.operands) == 3)
    ) and (reducer is not None and reducer.root.opcode == "add")


def _started(opcode: str) -> str:
    """The collective `opcode` starts where it is an async shorthand (all-to-all-start: an all-to-all), else itself."""
    shorthand = async_shorthand(opcode)
    return shorthand[1] if shorthand is not None and shorthand[0] == "async-start" else opcode


def _exchanges_linearly(inst) -> bool:
    """Whether collective `inst` is linear in its operands: it moves them, or its reducer adds (a max / min
    all-reduce is not: its samples are its kernel on the perturbed operands, as an elementwise op's)."""
    reducer = inst.called.get("to_apply")
    return reducer is None or reducer.root.opcode == "add"


def has_subnormals(leaf) -> bool:
    """Whether a real float value has an element a device that flushes may read or make as 0 (flushed)."""
    return (
        isinstance(leaf, np.ndarray)
        and leaf.dtype.kind == "f"
        and leaf.size > 0
        and least_magnitude(leaf) < FLUSHED_FROM
    )


def flushed(leaf, bound, samples) -> tuple:
    """(bound, samples) of `leaf` on a device that flushes f32 subnormals (DeviceProfile.flush_subnormals): an
    element below FLUSHED_FROM may be read or made as 0, an error of its magnitude: its bound at least that; each
    sample whose value (the element plus its deviation) is below f32's smallest normal flushed as the device does
    (its deviation -x), so what is made from it carries the flush and its calibration keeps it. Where the exact
    value is at least FLUSHED_FROM, its device value is not subnormal unless its error is over half of it."""
    x = np.asarray(leaf)
    at = (np.abs(x) < FLUSHED_FROM) & (x != 0)
    raised = np.zeros(x.shape) if bound is None else np.array(np.broadcast_to(bound, x.shape), np.float64)
    raised[at] = np.maximum(raised[at], np.abs(x[at]))
    if samples is None:
        made = np.zeros((SAMPLES, *x.shape), np.float32)
    else:
        made = np.array(np.broadcast_to(samples, (len(samples), *x.shape)))
    deviations = made[:, at].astype(np.float64)
    below = np.abs(x[at] + deviations) < FLUSHED_FROM / 2  # (f32's smallest normal)
    made[:, at] = np.where(below, -x[at], deviations).astype(made.dtype)
    return raised, made


def _holds_its_operands(value, operands) -> bool:
    """Whether every leaf of `value` is a leaf of `operands` (the same array): a leaf of a value made by a rule has
    an entry, so one without is exact (a parameter, a constant)."""
    held = {id(leaf) for o in operands for leaf in _leaves(o)}
    return all(id(leaf) in held for leaf in _leaves(value))


class ErrorBounds(BoundStore):
    """An observer of the shadow's run (`observe(inst, value, operands)`) that keeps, for every float value alive
    in it, a bound on its error under `device`'s arithmetic (see the module docstring). `of(value)` is the bound of
    a value (an output), `decided_of(value)` its rounding-decided elements. Values are known by identity while
    they live: bounds go when their values go (the run's memory, doubled at most)."""

    def __init__(self, shadow, context, device: DeviceProfile, seed: int = 0, plans: InstructionPlans | None = None):
        super().__init__()
        # per-instruction decisions (SPMD: the participants' observers share them)
        self.plans = plans or InstructionPlans(shadow, context)
        self.device = device
        self.unbounded: dict[str, str] = {}  # instruction -> why it has no bound
        self.algorithms: set[str] = set()  # dot algorithms the device's rules chose (not the types' own)
        self.rng = np.random.default_rng(seed)  # the draws' keys (draw_key; SPMD: one seed per participant)
        self.unused_key: np.uint64 | None = None  # a key drawn and given back (give_back_key): the next one drawn
        self.current = threading.local()  # .narrow: the observed instruction's float types are 32 bits or fewer
        self.choices = Choices()  # the integers rounding decides (tools/bound_indices.py)
        self.pending: dict[int, list] = {}  # an inner divide -> its operands and bounds, until its rewritten user
        # reads them (bound_rewrites.py; devices with divide_of_divides)

    def _kernel(self, inst):
        return self.plans.kernel(inst)

    # -- the observer ------------------------------------------------------------------------------------------
    def __call__(self, inst, value, operands) -> None:
        parts = self.plans.parts(inst)
        if parts is not None:  # (a variadic reduce of separate reducers: its results' reduces, each observed)
            for k, part in enumerate(parts):
                self(part, value[k], [operands[k], operands[len(parts) + k]])
            return
        self._observe(inst, value, operands)
        if self.choices.marked(operands):  # (integers rounding decides: what the op makes of them)
            with np.errstate(all="ignore"):
                follow(self, inst, value, operands)
        if inst.opcode not in EXACT:
            with np.errstate(all="ignore"):
                collective = _started(inst.opcode) in COLLECTIVES  # (its rule exchanged the marks)
                mark_overflows(self, inst, value, operands, DIVIDES_BY.get(inst.opcode, ()), not collective)
                rewritten(self, inst, value, operands)  # (the device's compiler's rewrites: bound_rewrites.py)

    def _observe(self, inst, value, operands) -> None:
        leaves = _leaves(value)
        floats = [v for v in leaves if _float(v)]
        opcode = inst.opcode
        if self.device.flush_subnormals:  # (inputs and constants it may read as 0: known, with that error, by _put)
            for o in operands:
                if _float(o) and self._entry(o) is None:
                    self._put(o, None)
        if opcode == "compare" or (opcode in PREDICATE_LOGIC and np.asarray(value).dtype == np.bool_):
            self._compare(inst, value, operands)
            return
        if opcode == "custom-call" and self.plans.original(inst) is None:  # pinned: its own way, at its own types
            kinds = [leaf.element_type.kind for _, leaf in inst.shape.leaves()]  # (bf16's numpy kind is not "f")
            self._no_rule(inst, [v for v, kind in zip(leaves, kinds) if kind in ("float", "complex")])
            return
        if not floats or opcode in EXACT:
            return
        if _started(opcode) in COLLECTIVES:  # never skipped: every participant exchanges the bounds the same way
            with np.errstate(all="ignore"):
                self._sample(inst, value, operands, *self._collective(inst, value, operands))
            return
        if opcode not in ROUNDING_ELEMENTWISE and all(self._entry(v) is not None for v in floats):
            return  # tuples, get-tuple-element, fusion and loop results: their leaves are known
        # (an async wrapper's leaves are its operands' and those its computation made, observed inside it)
        if opcode in ASYNC_WRAPPERS or (opcode == "tuple" and _holds_its_operands(value, operands)):
            for v in floats:  # the others' entries kept (re-moved, they lost their samples); these are exact
                if self._entry(v) is None:
                    self._put(v, None)
            return
        _, orig, self.current.narrow, dot = self.plans.plan(inst)
        inst = dot or inst  # (a convolution that is a dot: bounded and sampled as one)
        opcode = inst.opcode
        local = None  # the instruction's own error (SIGMAS sigmas), where its rule has one
        summed = None  # an add reduce's samples' deviations, summed already
        ceiling = None  # a sum's or dot's: the most its terms' errors make it, what its calibration may raise it to
        floor = None  # a sum's own error in its known order, where its roundings may repeat (_reduce)
        swaps = None  # a sort's payloads' samples' swaps within their keys' clusters (bound_sorts)
        with np.errstate(all="ignore"):
            if orig is None:  # the shadow's own helpers around pinned instructions
                self._pass_through(inst, value, operands)
                return
            elif opcode in VIEW_MOVES and len(operands) == 1 and isinstance(value, np.ndarray):
                self._view_move(inst, value, operands[0])
                return
            elif opcode == "convert" and widens_exactly(orig.operands[0].shape.element_type, orig.shape.element_type):
                # (its operand's entry as it is: no error of its own, so its samples show nothing new; the operand's
                # bound was calibrated by them already, or, moved, is a block of copies a move leaves uncalibrated)
                self._share(value, operands[0])
                return
            elif opcode in COMPLEX_ELEMENTWISE and involves_complex(value, operands):
                local = complex_elementwise(self, inst, orig, value, operands, SINGULAR_AT_ZERO.get(opcode, ()))
            elif opcode in MOVES or _of_no_terms(opcode, operands):
                self._move(inst, value, operands)
            elif opcode == "select" and fused_select(self, value, operands):
                return
            elif opcode == "select":
                self._select(value, operands)
            elif fused_elementwise(self, inst, orig, value, operands):
                return
            elif opcode in EVALUATED and evaluated_elementwise(self, inst, orig, value, operands, *EVALUATED[opcode]):
                return
            elif opcode in ROUNDING_ELEMENTWISE or opcode in EXACT_ELEMENTWISE:
                local = self._elementwise(inst, orig, value, operands)
            elif opcode in ("reduce", "reduce-window") and folded_reduce(self, inst, orig, value, operands):
                return
            elif opcode in ("reduce", "reduce-window") and len(operands) == 2:
                local, ceiling, summed, floor = reduce_bounds(
                    self, inst, orig, value, operands, self.plans.is_part(inst)
                )
            elif opcode == "dot":
                local, ceiling = dot_bounds(self, inst, orig, value, operands)
                floor = dot_floor(self, inst, orig, value, operands)
                dot_marks(self, inst, orig, value, operands)
            elif opcode == "ragged-dot":
                local, ceiling = ragged_dot_bounds(self, inst, orig, value, operands)
            elif opcode == "convolution" and len(operands) == 2:
                local, ceiling = convolution_bounds(self, inst, orig, value, operands)
                dot_marks(self, inst, orig, value, operands)
            elif opcode == "scatter" and len(operands) == 3:
                local, floor = scatter_bounds(self, inst, orig, value, operands)
            elif opcode == "fft":
                local = fft_bounds(self, inst, orig, value, operands)
            elif opcode == "cholesky" and (local := cholesky_bounds(self, inst, orig, value, operands)) is not None:
                pass  # (sampled below)
            elif opcode == "custom-call" and (epilogue := self.plans.epilogue(inst)) is not None:
                local, ceiling = epilogue_bounds(self, inst, orig, value, operands, epilogue)
            elif selects(inst) and (swaps := sorted_bounds(self, inst, value, operands)) is not None:
                pass  # (sampled below)
            elif opcode == "reduce" and selecting_reduce(self, inst, value, operands):
                pass  # (sampled below)
            elif opcode == "map" and self._map(inst, value, operands):
                return
            else:
                self._no_rule(inst, floats)
                return
            self._sample(inst, value, operands, local, ceiling, summed, floor)
            swapped_samples(self, swaps)

    def _sample(self, inst, value, operands, local, ceiling=None, summed=None, floor=None) -> None:
        """Carry SAMPLES perturbed runs along (Monte Carlo arithmetic): the instruction's kernel on its operands
        moved by each sample's deviations, plus a draw of its own error (`local`, SIGMAS sigmas: a Gaussian of
        that sigma). Unlike the bound's rules the samples keep their signs: errors that cancel (x - mean(x),
        a softmax's normalization, a LayerNorm gradient's three terms) cancel in them. Few samples cannot bound
        one element, but over a block of elements they show how loose its bounds are: where all the block's
        bounds exceed SAMPLE_MARGIN x SIGMAS x their samples' RMS by a common factor, they are divided by it
        (`_calibrate`). A pred value's samples are the perturbed decisions (a select follows them); a complex
        value's are complex deviations (tools/bound_complex.py); a value whose samples are unknown (no rule; a
        c128 program's complex op that is not smooth) has NaN samples, and nothing after it is calibrated. `local`:
        one array for every leaf, or a list of them (one per leaf of the value). `summed`: the samples'
        deviations where the rule summed them already (an add reduce's, tools/bound_generic.sum_terms). `floor`: a
        sum's error in its known order (one array, or a list per leaf): see bound_generic.with_floor."""
        if summed is not None:  # (an add reduce's: its rule summed them, no kernel to run)
            store_summed(self, value, local, ceiling, summed, floor)
            return
        held = [self._stored_samples(o) if isinstance(o, (np.ndarray, np.generic)) else None for o in operands]
        leaves = _leaves(value)
        if local is None and all(p is None for p in held):
            return
        if moved_samples(self, inst, value, operands, held):
            return
        kept = [self._entry(v) is not None and all(v is not o for o in operands) for v in leaves]  # (not a send's data)
        complex_ = any(np.iscomplexobj(v) for v in [*leaves, *operands] if isinstance(v, (np.ndarray, np.generic)))
        by_dot = (  # (dot_samples, or store_dot_samples, makes the samples' array)
            inst.opcode == "dot"
            and not complex_
            and all(_float(o) for o in operands)
            and kept[0]
            and (
                sum(p is not None for p in held) == 1
                or (all(p is not None for p in held) and getattr(self.current, "dot_samples_in_f32", False))
            )
        )
        # (a dot of two sampled operands reads their samples as kept: its product's operands are built from them,
        # then one pass takes x off, draws its own errors, tallies the calibration's statistics and encodes; a dot
        # of one reads them whole; the others a sample at a time where decoded)
        if by_dot and all(p is not None for p in held):
            store_dot_samples(self, inst, value, operands, held, local, ceiling, floor)
            return
        read = self._read_samples if by_dot else self._read_per_sample
        perturbed = [read(p) for p in held]
        del held
        made = [
            np.empty((SAMPLES, *np.shape(v)), sample_dtype(v) if _float(v) else np.asarray(v).dtype)
            if keep and not by_dot
            else None
            for v, keep in zip(leaves, kept)
        ]
        kernel = self._kernel(inst)
        if by_dot:
            made[0] = dot_samples(inst, operands, perturbed)
        elif complex_ and inst.opcode in BILINEAR and len(operands) == 2:
            bilinear_samples(kernel, operands, perturbed, made[0])
        elif (
            inst.opcode in MOVES
            or _sums(inst)
            or (_started(inst.opcode) in COLLECTIVES and _exchanges_linearly(inst))
            or (complex_ and inst.opcode in COMPLEX_LINEAR)
        ):
            # linear in its float operands: the op on their deviations alone (no perturbed run to subtract; a sum of
            # float32 deviations in float32 is off by ~2^-24 of them, far below the sum's own rounding draw)
            unmoved = [
                np.zeros(np.shape(o), sample_dtype(o)) if p is None and _float(o) else o
                for o, p in zip(operands, perturbed)
            ]
            for k in range(SAMPLES):
                args = [u if p is None else p[k] for u, p in zip(unmoved, perturbed)]
                for moved, out in zip(_leaves(kernel(*args)), made):
                    if out is not None:
                        out[k] = moved
        elif complex_ and inst.opcode == "select" and made[0] is not None:
            select_samples(operands, perturbed, value, made[0])
        elif complex_ and all(map(_float, leaves)) and not resolves_deviations(self.plans.original(inst)):
            # (a comparison's perturbed decisions are its kernel's on the perturbed operands: nothing subtracted)
            if not scaled_samples(inst, kernel, operands, perturbed, leaves, made):
                for out in made:
                    if out is not None:
                        out[...] = np.nan
        else:
            for k in range(SAMPLES):
                args = [o if p is None else (o + p[k] if _float(o) else p[k]) for o, p in zip(operands, perturbed)]
                for leaf, moved, out in zip(leaves, _leaves(kernel(*args)), made):
                    if out is None:
                        continue
                    if _float(leaf):  # (float32: the deviations need a few digits, not the values')
                        np.subtract(moved, leaf, out=out[k : k + 1], casting="unsafe")
                    else:
                        out[k] = moved
        del perturbed  # (decoded copies: not held through the draws and the calibration)
        self._finish_samples(inst, leaves, made, local, ceiling, floor)

    def _finish_samples(self, inst, leaves, made, local, ceiling, floor) -> None:
        """_sample's last step: each leaf's samples `made` (None: not kept) get their own-error draws, then
        calibrate its bound (not a move's or a select's), which is put with them."""
        for k, (leaf, out) in enumerate(zip(leaves, made)):
            if out is None:
                continue
            if not _float(leaf):
                _, bound, decided = self._entry(leaf)[:3]
                self._put(leaf, bound, decided, out)
                continue
            own = local[k] if isinstance(local, list) else local
            if has_error(own) and np.iscomplexobj(out):
                add_complex_noise(out, self.draw_key(), np.broadcast_to(np.asarray(own, np.float64), np.shape(leaf)))
            elif has_error(own):
                add_noise(
                    out.reshape(SAMPLES, -1),
                    self.draw_key(),
                    np.ravel(np.broadcast_to(np.asarray(own, np.float64), np.shape(leaf))),
                    SIGMAS,
                    rounding=inst.opcode in FUSED,  # (one rounding: drawn as the elementwise pass draws it)
                )
            bound = self._stored_bound(leaf)
            if inst.opcode not in MOVES and not selects(inst):  # (a moved value's block holds copies)
                bound = self._calibrate(bound, out, ceiling)
            bound = with_floor(bound, out, floor[k] if isinstance(floor, list) else floor)
            self._put(leaf, bound, self._decided_or_none(leaf), out)

    def _put(self, leaf, bound, decided=None, samples=None) -> None:
        if self.device.flush_subnormals and has_subnormals(leaf):
            bound, samples = flushed(leaf, bound, samples)
        super()._put(leaf, bound, decided, samples)

    def _no_rule(self, inst, floats) -> None:
        """`inst` has no rule: its float results get an infinite bound and NaN samples (not judged, nor is anything
        made from them; calibration stops there), and it is named in `unbounded` (a custom-call with its target)."""
        why = f"custom-call {target_of(inst)}" if inst.opcode == "custom-call" else inst.opcode
        for v in floats:
            if self._entry(v) is None:
                self.unbounded.setdefault(inst.name.removesuffix(PINNED_SUFFIX), why)
                self._put(v, np.full(v.shape, np.inf), None, np.full((SAMPLES, *v.shape), np.nan, np.float32))

    def _map(self, inst, value, operands) -> bool:
        """A map's bound: its computation's steps observed on whole arrays, as a fusion's are (every element is made
        by the ops an elementwise op over the arrays makes); its value keeps its root's entry. False (nothing done)
        where a step is not elementwise."""
        steps = elementwise_steps(inst.called.get("to_apply"))
        if steps is None or steps[-1].opcode == "tuple":
            return False
        self._share(value, observe_steps(self, steps, operands, np.shape(value))[0])
        return True

    def draw_key(self) -> np.uint64:
        """A key for an instruction's own-error draws (kernels/normal_draws.py), from the observer's rng: the run's
        draws depend on its seed and the instructions' order only."""
        key, self.unused_key = self.unused_key, None
        if key is not None:
            return key
        return np.uint64(self.rng.bit_generator.random_raw())  # (rng.integers(0, 2**64, np.uint64)'s, 3x cheaper)

    def give_back_key(self, key: np.uint64) -> None:
        """`key` (draw_key's last) was not used: a compiled pass drew it for own errors the value turned out not to
        have, where `_sample` draws none. The next draw_key returns it: the keys `_sample`'s order gives (no rng
        state read and put back: ~10 us a call)."""
        self.unused_key = key

    _calibrate = staticmethod(calibrate)  # (a method: tests replace it)

    def _pass_through(self, inst, value, operands) -> None:
        """A helper of a pinned instruction: its one float operand's bound (same shape), else exact."""
        if not _float(value):  # (a tuple: its leaves, taken out by helpers, are exact)
            return
        src = [o for o in operands if _float(o) and np.shape(o) == np.shape(value)]
        if src:
            entry = self._entry(src[0])
            self._put(value, *(entry[1:] if entry is not None else (None,)))

    def _substituted(self, inst, operands, pick) -> object:
        """`inst`'s kernel on its operands with every float one replaced by `pick(operand)` (a bound)."""
        args = [pick(o) if _float(o) else o for o in operands]
        return self._kernel(inst)(*args)

    def _move(self, inst, value, operands) -> None:
        floats = [o for o in operands if _float(o)]
        bounds = None  # (moved from exact operands: none kept)
        if any(self._stored_bound(o) is not None for o in floats):
            bounds = _leaves(self._substituted(inst, operands, self.of))
        marks = None
        if any(self._decided_or_none(o) is not None for o in floats):
            marks = _leaves(self._substituted(inst, operands, lambda o: self.decided_of(o).astype(np.float64)))
        for i, v in enumerate(_leaves(value)):  # (known even where exact: a loop's or a tuple's leaves are)
            if _float(v):
                bound = None if bounds is None else np.asarray(np.real(bounds[i]), np.float64)
                self._put(v, bound, None if marks is None else np.real(marks[i]) > 0)

    def _compare(self, inst, value, operands) -> None:
        """A comparison's rounding-decided marks (its operands' intervals overlap) and perturbed decisions; a logic
        op's or a select's on predicates: any operand's marks (a flip may pass through it)."""
        if inst.opcode != "compare":
            self._put(value, None, functools.reduce(np.logical_or, map(self.decided_of, operands)))
            self._sample(inst, value, operands, None)
            return
        a, b = operands[0], operands[1]
        if not (_float(a) and isinstance(value, (np.ndarray, np.generic))):
            return
        slack = (self.of(a) + self.of(b)) * (a is not b)  # (x compared with itself: its NaN test, decided)
        with np.errstate(all="ignore"):
            undecided = (np.abs(np.asarray(a) - np.asarray(b)) <= slack) & (slack > 0)
        for o in (a, b):
            d = self._decided_or_none(o)
            if d is not None:
                undecided = undecided | d
            may_be = self.marks_of(o)  # (an operand that may be non-finite: any answer, tools/bound_overflow.py)
            if may_be is not None:
                undecided = undecided | (may_be > 0)
        self._put(value, None, undecided)
        self._sample(inst, value, operands, None)

    def _select(self, value, operands) -> None:
        p, t, f = operands
        et, ef = self.of(t), self.of(f)
        bound = np.where(p, et, ef)
        decided = np.where(p, self.decided_of(t), self.decided_of(f))
        undecided = self._decided_or_none(p)
        if undecided is not None:
            bound = np.where(undecided, np.maximum(et, ef) + np.abs(t - f), bound)
            decided = decided | undecided
        self._put(value, bound, decided)

    def _elementwise(self, inst, orig, x, operands) -> np.ndarray | None:
        opcode = inst.opcode
        decided = np.zeros(x.shape, bool)
        groups: dict[int, list[int]] = {}  # one value passed several times (x * x) moves in all its places at once
        for k, a in enumerate(operands):
            if _float(a):
                groups.setdefault(id(a), []).append(k)
        for places in groups.values():
            marks = self._decided_or_none(operands[places[0]])
            if marks is not None:
                decided |= marks
        # bounds combine as SIGMAS standard deviations of independent errors
        if opcode in LIPSCHITZ or opcode == "multiply":
            variance = self._first_order(opcode, x, operands, groups)
        else:
            variance = self._evaluated(inst, x, operands, groups, decided)
        if opcode in ROUNDING_ELEMENTWISE:
            bound, own = self._round(orig, x, variance, opcode)
        else:
            bound, own = np.sqrt(variance), None
        self._put(x, bound, decided)
        return own

    def _evaluated(self, inst, x, operands, groups, decided) -> np.ndarray:
        """The bound before the rounding, squared, of an op evaluated at the ends of its operands' intervals
        (`_moved_by`), plus what two operands' errors do together (`_second_order`)."""
        variance = np.zeros(x.shape)
        moved = []  # (places, value, bound, what it moves x by) of the operands with errors
        for places in groups.values():
            a = operands[places[0]]
            e = self._bound_or_none(a)
            if not has_error(e):
                continue
            delta = self._moved_by(inst, x, operands, places, a, e, decided)
            variance = variance + np.square(delta)
            moved.append((places, a, e, delta))
        if len(moved) == 2 and inst.opcode in SECOND_ORDER:
            variance = variance + np.square(self._second_order(self._kernel(inst), x, operands, moved))
        return variance

    def _first_order(self, opcode, x, operands, groups) -> np.ndarray:
        """A 1-Lipschitz op's or a multiply's bound before its rounding, squared, in one pass
        (kernels/bound_rules.first_order_variance)."""
        bounds = []
        for places in groups.values():
            e = self._stored_bound(operands[places[0]])
            bounds.append(np.ravel(np.broadcast_to(e, x.shape)) if has_error(e) else np.empty(0))
        if not any(part.size for part in bounds):  # (exact operands, or a convert from an integer)
            return np.zeros(x.shape)
        variance = np.empty(x.shape)
        first_order_variance(
            opcode == "multiply",
            len(groups) == 1 and len(operands) == 2,
            np.ravel(operands[0]),
            np.ravel(operands[-1]),
            bounds[0],
            bounds[1] if len(bounds) == 2 else np.empty(0),
            variance.reshape(-1),
        )
        return variance

    def _moved_by(self, inst, x, operands, places, a, e, decided) -> np.ndarray:
        """max |f(.., a +- e, ..) - f(..)|: the op's own kernel at the ends of `a`'s interval (in all its `places`);
        marks in `decided` the elements where the interval reaches a discontinuity of the op."""
        kernel = self._kernel(inst)
        args = list(operands)
        for k in places:
            args[k] = a + e
        up = kernel(*args)
        for k in places:
            args[k] = a - e
        down = kernel(*args)
        delta = np.maximum(np.abs(up - x), np.abs(down - x))
        if set(places) & set(SINGULAR_AT_ZERO.get(inst.opcode, ())):
            decided |= (np.abs(a) <= e) & (e > 0)
        if inst.opcode in STEPS:
            decided |= up != down
        return np.where(np.isnan(delta), np.inf, delta)

    @staticmethod
    def _second_order(kernel, x, operands, moved) -> np.ndarray:
        """What both operands' errors do together beyond the sum of what each does alone (a * b: e_a * e_b), at
        the four corners of their intervals: first order misses it where relative errors reach 1 (a gradient
        squared whose sign rounding decides; a complex operand's: its disk's axis points, `corners`)."""
        worst = np.zeros(x.shape)
        (pa, a, ea, da), (pb, b, eb, db) = moved
        for sa in corners(a):
            for sb in corners(b):
                args = list(operands)
                for k in pa:
                    args[k] = a + sa * ea
                for k in pb:
                    args[k] = b + sb * eb
                worst = np.maximum(worst, np.abs(kernel(*args) - x))
        excess = worst - da - db
        return np.where(np.isnan(excess), np.inf, np.maximum(excess, 0.0))

    def _round(self, orig, x, variance, opcode, etype=None, at=None) -> tuple:
        """The value's bound after the instruction's own rounding, and that rounding as a bound of SIGMAS standard
        deviations: half an ulp of its type (`etype`: a tuple's leaf's; default the instruction's) at the value
        (+ the transcendental's error), uniform, so sigma = that / sqrt(3) (SIGMAS > sqrt(3): never below the
        rounding's largest error). `variance`: the bound before the rounding, squared; the magnitude the ulp is
        taken at is |x| plus that bound (or `at`, where given). The bound after it: the root-sum-square, but never
        more than the bound plus the rounding's largest error (own * sqrt(3) / SIGMAS): a single rounding of an
        exact value is at most half an ulp, not SIGMAS sigmas of one (a value rounded once, or re-rounded to bf16,
        was allowed 2.3x its largest error). One pass per element (kernels/bound_rules.round_bounds)."""
        shape = np.shape(x)
        bits = int(orig.attr("mantissa_bits")) if opcode == "reduce-precision" else 0
        rule = rounding_rule(etype or orig.shape.element_type, opcode, bits)
        if rule is None:
            return np.sqrt(variance), np.zeros(shape)
        own = np.empty(shape)
        bound = np.empty(shape, np.float32 if getattr(self.current, "narrow", False) else np.float64)
        round_bounds(
            np.ravel(x),
            np.ravel(np.broadcast_to(variance, shape)),
            np.empty(0) if at is None else np.ravel(np.broadcast_to(np.asarray(at, np.float64), shape)),
            own.reshape(-1),
            bound.reshape(-1),
            *rule,
        )
        return bound, own

    def _collective(self, inst, value, operands) -> tuple:
        """A collective's bounds: its kernel on its operands' bounds (see the module docstring); an add all-reduce or
        reduce-scatter also rounds as it accumulates, its kernel run on the operands' squares giving the sums'
        terms' (one per participant of the group), and its partial sums' own error, known (the participants' values
        as the program holds them, folded in group order in the type: repeated_rounding's, exchanged). Returns
        _sample's arguments: the instruction's own error per leaf of its value (SIGMAS sigmas), no ceiling or
        summed deviations, and the floors (with_floor) per leaf, None where it sums nothing."""
        bounds = _leaves(self._substituted(inst, operands, self.of))
        leaves = _leaves(value)
        own_errors: list = [np.zeros(())] * len(leaves)
        results = [(k, v) for k, v in enumerate(leaves) if _float(v) and not any(v is o for o in operands)]
        orig = self.plans.original(inst)
        etypes = [leaf.element_type for _, leaf in orig.shape.leaves()]  # (the value's leaves, in order)
        collective_marks(self, inst, value, operands, etypes)
        reducer = inst.called.get("to_apply")
        if _started(inst.opcode) not in ("all-reduce", "all-reduce-start", "reduce-scatter") or (
            reducer is None or reducer.root.opcode != "add"
        ):
            for k, v in results:
                self._put(v, np.asarray(np.real(bounds[k]), np.float64))
            return own_errors, None, None, None
        types = [o.shape.element_type.numpy for o in orig.operands]
        held = [np.asarray(o).astype(t) if _float(o) else o for o, t in zip(operands, types)]
        folded = _leaves(self._kernel(inst)(*held))  # (the collective's fold: group order, every step in the type)
        floors: list = [None] * len(leaves)
        squares = _leaves(self._substituted(inst, operands, squared_magnitude))
        count = len(participants(inst, self.plans.context.device))  # (every element sums one term per participant)
        for k, v in results:
            # (the partial sums travel between participants in the collective's type: every step rounds to it)
            accumulation = accumulation_variance(self, etypes[k], count, squares[k], v, per_step=True)
            bound, own = self._round(orig, v, np.square(bounds[k]) + accumulation, "reduce", etypes[k])
            self._put(v, bound)
            own_errors[k] = np.sqrt(accumulation + np.square(own))
            if etypes[k].kind == "float":  # (real: a complex sum's parts are not judged by it)
                floors[k] = np.asarray(folded[k], np.float64) - np.asarray(v, np.float64)
        return own_errors, None, None, floors
