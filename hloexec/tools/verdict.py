"""Error-aware verdicts: is a result as close to the exact answer as the program's precision allows?

Two correct implementations of one f16 program differ, so equality is the wrong question. Here every
candidate's outputs (a device's, XLA:CPU's, another dump's, hloexec's own) are measured against the
program's *shadow* (its exact answer up to f64 rounding, hloexec/exec/shadow.py) and judged against a
*baseline*: the same program run at its own precision in the most pessimistic plausible order (hloexec's
run with `reductions="per-step"`: every f16/bf16 sum rounds at every step, in index order). An f16-
accumulated sum is then judged against what f16 accumulation gives, not against an f32 accumulator.

The rule (`Rule`, constants measured in docs/numerics.md, "Verdicts"). Per output, with e = |x - shadow|
elementwise for the candidate (c) and the baseline (b), the output's scale = max |shadow| (finite
elements; at least the type's smallest normal) and `ulp` = the output type's ulp at that scale:

1. RMS, PyTorch's accuracy check: rms(e_c) <= rms_multiplier * rms(e_b) + rms_floor_ulps * ulp.
2. Elementwise, for what an RMS cannot see (one element off by 1% among 10^5): every element
   e_c[i] <= element_multiplier * e_b[i] + element_floor_rms * rms(e_b) + element_floor_ulps * ulp(shadow[i])
   (ulp(shadow[i]): the type's ulp at the element's own magnitude, its final rounding).
3. Non-finite elements: a NaN or infinity where the shadow is finite is consistent only where the
   baseline has one too (an overflow the precision causes), and an infinity must match the shadow's sign.
   With bounds: only where the bounds' may-be-non-finite mark allows its kind (tools/bound_overflow.py: an
   order or a rounding the device allows can make it), or the baseline's is the same (NaN, the same infinity).
4. Integer and pred outputs: every element equals the shadow's or the baseline's.

ULPs are always "at the output's scale": an error in units of the ulp of the output's largest magnitude,
so tiny elements of opposite signs do not count billions of ULPs.

With per-element error bounds (tools/bounds.py, computed alongside the shadow run under a device profile: the
single-participant runs), rule 2 becomes: every element e_c[i] <= bound_factor * max(bound[i], ulp(shadow[i]) / 2)
-- its own bound (which holds its final rounding), not a sample of one order -- except rounding-decided elements
(a sign, a comparison, a division decided by rounding: counted, not failed) and elements without a bound (after
an op bounds.py has no rule for); rule 1 then allows the larger of the baseline's and the bounds' RMS (over the
judged elements). docs/verdicts.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import ml_dtypes
import numpy as np

from .compare import dtype_name, is_float, jsonable, output_scale, plain_scalar, ulp_at

WORST_COUNT = 5


@dataclass(frozen=True)
class Rule:
    """The constants of the rule above (measured: docs/numerics.md, "Verdicts")."""

    rms_multiplier: float = 2.0
    rms_floor_ulps: float = 0.5
    element_multiplier: float = 1.0
    element_floor_rms: float = 3.0
    element_floor_ulps: float = 4.0
    # an element's error may reach this many times its bound (docs/verdicts.md): 7 sigmas; correct bf16 gradients
    # reach 1.52x (bench/bench_verdict.py), and a change of 2x the bound is still caught
    bound_factor: float = 1.75


RULE = Rule()


@dataclass
class Errors:
    """One candidate's error on one output against the shadow. Relative errors are to the output's scale."""

    max_abs: float = 0.0
    max_rel: float = 0.0  # max |x - shadow| / scale
    rms_rel: float = 0.0  # rms(x - shadow) / scale
    max_ulps: float = 0.0  # max |x - shadow| in ulps of the output type at the output's scale
    nonfinite: int = 0  # non-finite where the shadow is finite, or of another kind than the shadow's
    mismatches: int = 0  # integer/pred outputs: elements equal to neither the shadow nor the baseline


@dataclass
class Element:
    index: tuple[int, ...]
    value: float | int | bool | str
    shadow: float | int | bool | str
    baseline: float | int | bool | str
    error: float
    allowed: float
    exact: float | int | bool | str | None = None  # the shadow's value (with bounds)
    bound: float | None = None  # the element's error bound (with bounds)
    ratio: float | None = None  # error / bound
    devices: list[int] | None = None  # SPMD: the participants that hold the element


@dataclass
class CandidateVerdict:
    name: str
    errors: Errors
    consistent: bool
    reasons: list[str] = field(default_factory=list)
    worst: list[Element] = field(default_factory=list)
    bound_violations: int = 0  # elements beyond bound_factor x their bound
    rounding_decided: int = 0  # elements whose value rounding decides (not judged)
    unbounded: int = 0  # elements without a bound (not judged by one)
    nonfinite_allowed: int = 0  # elements an order or a rounding the arithmetic allows may make non-finite
    explained: float | None = None  # the share of its error the device's rules allow beyond the reference's
    device: str = ""  # the arithmetic its bounds are of ("": judged by the baseline's errors)


@dataclass
class OutputVerdict:
    index: int
    shape: tuple[int, ...]
    dtype: str
    scale: float
    ulp: float
    baseline: Errors
    candidates: list[CandidateVerdict]
    problem: str = ""
    bound_violations: int = 0  # over the candidates
    worst: dict | None = None  # the worst element over the candidates (candidate, index, value, exact, bound,
    # ratio)
    device_rules: list[str] = field(default_factory=list)  # the device's dot algorithms on the output's path


@dataclass
class Verdict:
    outputs: list[OutputVerdict]
    rule: Rule = RULE
    problem: str = ""
    device: str = ""  # the profile the bounds are of ("": no bounds)
    by_device: dict = field(default_factory=dict)  # several devices judged: name -> Verdict

    @property
    def candidates(self) -> list[str]:
        return [c.name for c in self.outputs[0].candidates] if self.outputs else []

    def consistent(self, name: str | None = None) -> bool:
        """Whether candidate `name` (None: every candidate) is consistent on every output."""
        return not self.problem and all(
            c.consistent and not o.problem for o in self.outputs for c in o.candidates if name is None or c.name == name
        )

    def explaining(self) -> dict[str, list[str]]:
        """Several devices judged: candidate -> the devices under whose arithmetic it is consistent."""
        return {n: [d for d, v in self.by_device.items() if v.consistent(n)] for n in self.candidates}

    def to_dict(self) -> dict:
        data = {
            "consistent": self.consistent(),
            "problem": self.problem or None,
            "rule": asdict(self.rule),
            "device": self.device or None,
            "candidates": {n: self.consistent(n) for n in self.candidates},
            "outputs": [asdict(o) for o in self.outputs],
        }
        if self.by_device:
            data["devices"] = {
                d: {"consistent": v.consistent(), "candidates": {n: v.consistent(n) for n in v.candidates}}
                for d, v in self.by_device.items()
            }
            data["explained_by"] = self.explaining()
        return jsonable(data)


def error_stats(values, shadow) -> Errors:
    """A value's error against its shadow, without a verdict (what `numerics` and `run --shadow` print)."""
    values, shadow = np.asarray(values), np.asarray(shadow)
    if not is_float(values.dtype) and values.dtype.kind != "c":
        return Errors(mismatches=int(np.count_nonzero(values != shadow)))
    scale, ulp = _scale(shadow, values.dtype)
    e, bad = element_errors(values, shadow)
    return _summary(e, bad, scale, ulp)


def judge(
    shadow: list,
    baseline: list,
    candidates: dict[str, list],
    rule: Rule = RULE,
    bounds=None,
    reference_bounds=None,
    candidate_bounds: dict | None = None,
) -> Verdict:
    """Judge each candidate's outputs (name -> list of arrays, the program's output order) against the shadow's,
    with `baseline` (the program at its own precision, pessimistic order) as the measure of what the precision
    gives and, given `bounds` (numerics.OutputBounds: per output, every element's error bound under a device's
    arithmetic), every element against its own bound. `candidate_bounds`: name -> OutputBounds of the candidates
    whose arithmetic is known to be another (XLA:CPU's). `reference_bounds` (the reference arithmetic's, when the
    device is another): how much of each candidate's error the device's rules explain. Returns a Verdict (see
    the module docstring for the rule)."""
    counts = {len(shadow), len(baseline), *map(len, candidates.values())}
    problem = (
        ""
        if len(counts) == 1
        else f"different numbers of outputs: shadow {len(shadow)}, baseline {len(baseline)}, "
        + ", ".join(f"{n} {len(v)}" for n, v in candidates.items())
    )
    own = {n: (candidate_bounds or {}).get(n, bounds) for n in candidates}

    def of(b, i):
        return None if b is None else (b.bounds[i], b.decided[i], b.nonfinite[i] if b.nonfinite else None)

    outputs = [
        _judge_output(
            i,
            np.asarray(s),
            np.asarray(b),
            {n: np.asarray(v[i]) for n, v in candidates.items()},
            rule,
            {n: of(ob, i) for n, ob in own.items()},
            of(reference_bounds, i),
        )
        for i, (s, b) in enumerate(zip(shadow, baseline))
        if i < min(counts)
    ]
    for o in outputs:
        for c in o.candidates:
            c.device = own[c.name].device if own.get(c.name) is not None else ""
        if bounds is not None and reference_bounds is not None:
            o.device_rules = list(bounds.algorithms)
    return Verdict(outputs, rule, problem, bounds.device if bounds is not None else "")


def _judge_output(
    index: int,
    shadow: np.ndarray,
    baseline: np.ndarray,
    candidates: dict,
    rule: Rule,
    bounds: dict | None = None,
    reference_bounds=None,
) -> OutputVerdict:
    """`bounds`: candidate name -> (bound, decided, may-be-non-finite marks or None) of this output (None: judged by
    the baseline's errors)."""
    dtype = baseline.dtype
    out = OutputVerdict(index, tuple(baseline.shape), dtype_name(dtype), 0.0, 0.0, Errors(), [])
    if shadow.shape != baseline.shape:
        out.problem = f"shadow shape {list(shadow.shape)}, program's {list(baseline.shape)}"
        return out
    if not (is_float(dtype) or dtype.kind == "c"):
        return _judge_discrete_output(out, candidates, shadow, baseline)
    out.scale, out.ulp = _scale(shadow, dtype)
    e_b, bad_b = element_errors(baseline, shadow)
    out.baseline = _summary(e_b, bad_b, out.scale, out.ulp)
    rms_b = out.baseline.rms_rel * out.scale
    magnitude = np.where(np.isfinite(shadow), np.abs(shadow), 0.0)
    reference_allowed = (
        allowed_error(reference_bounds[0], magnitude, dtype, rule)
        if reference_bounds is not None and reference_bounds[0] is not None
        else None
    )
    allowances: dict[int, tuple] = {}  # id(bound) -> (allowed, judged, the bounds' rms): one per arithmetic

    def allowance(own):
        if own is None or own[0] is None or np.shape(own[0]) != shadow.shape:
            if None not in allowances:
                allowances[None] = (
                    rule.element_multiplier * np.where(bad_b, 0.0, e_b)
                    + rule.element_floor_rms * rms_b
                    + rule.element_floor_ulps * ulp_at(magnitude, dtype),
                    None,
                    0.0,
                )
            return allowances[None]
        if id(own[0]) not in allowances:
            allowed = allowed_error(own[0], magnitude, dtype, rule)
            judged = ~own[1] & np.isfinite(allowed)
            rms = float(np.sqrt(np.mean(np.square(allowed[judged])))) / rule.bound_factor if judged.any() else 0.0
            allowances[id(own[0])] = (allowed, judged, rms)
        return allowances[id(own[0])]

    for name, c in candidates.items():
        if c.shape != baseline.shape or c.dtype != dtype:
            wrong = f"{dtype_name(c.dtype)}{list(c.shape)}, expected {dtype_name(dtype)}{list(baseline.shape)}"
            out.candidates.append(CandidateVerdict(name, Errors(), False, [wrong]))
            continue
        own = (bounds or {}).get(name)
        allowed, judged, bound_rms = allowance(own)
        bounded = judged is not None
        if bounded and own is not None:  # judged only where `own` holds a bound
            bound, decided, marks = own
        e_c, bad_c = element_errors(c, shadow)
        errors = _summary(e_c, bad_c, out.scale, out.ulp)
        reasons = []
        rms_c = errors.rms_rel * out.scale
        if bounded:  # rounding-decided elements are not judged: nor counted in the RMS
            kept = e_c[judged & ~bad_c]
            rms_c = float(np.sqrt(np.mean(np.square(kept)))) if kept.size else 0.0
        limit = rule.rms_multiplier * out.baseline.rms_rel * out.scale + rule.rms_floor_ulps * out.ulp
        if rms_c > max(limit, bound_rms):
            reasons.append(
                f"rms error {rms_c:.3g} > {rule.rms_multiplier:g} x baseline's "
                f"{out.baseline.rms_rel * out.scale:.3g} + {rule.rms_floor_ulps:g} ulp"
                + (f" and > the bounds' rms {bound_rms:.3g}" if bounded else "")
            )
        unexplained, over = _beyond(
            c, shadow, baseline, e_c, bad_c, bad_b, allowed, judged, marks if bounded else None, rule, reasons
        )
        worst = (
            _worst(unexplained | over, e_c, allowed, c, shadow, baseline, bound if bounded else None) if reasons else []
        )
        verdict = CandidateVerdict(name, errors, not reasons, reasons, worst, bound_violations=int(over.sum()))
        if bounded:
            verdict.rounding_decided = int(np.count_nonzero(decided))
            verdict.unbounded = int(np.count_nonzero(~np.isfinite(allowed)))
            verdict.nonfinite_allowed = 0 if marks is None else int(np.count_nonzero(marks))
            if reference_allowed is not None:
                verdict.explained = _explained(np.where(bad_c, 0.0, e_c), allowed, reference_allowed)
        out.candidates.append(verdict)
    out.bound_violations = sum(c.bound_violations for c in out.candidates)
    out.worst = _worst_beyond_bound(out.candidates)
    return out


def _beyond(c, shadow, baseline, e_c, bad_c, bad_b, allowed, judged, marks, rule: Rule, reasons: list) -> tuple:
    """(non-finite elements nothing explains, finite ones beyond their allowance) of candidate `c`, their reasons
    appended to `reasons`; judged by the bounds where `judged` is not None (`marks`: the may-be-non-finite ones)."""
    bounded = judged is not None
    unexplained = bad_c & ~bad_b
    if bounded:
        unexplained = bad_c & ~(_may_be(c, shadow, marks) | _same_nonfinite(c, baseline))
    over = ~bad_c & (e_c > allowed)
    if bounded:
        over &= judged
    if unexplained.any():
        reasons.append(
            f"{int(unexplained.sum())} non-finite element(s) where the shadow is finite and no order or "
            "rounding the arithmetic allows makes one (or of another kind)"
            if bounded
            else f"{int(unexplained.sum())} non-finite element(s) where the shadow and the baseline "
            "are finite (or of another kind)"
        )
    if over.any():
        reasons.append(
            f"{int(over.sum())} element(s) beyond {rule.bound_factor:g} x their error bound"
            if bounded
            else f"{int(over.sum())} element(s) beyond {rule.element_multiplier:g} x the baseline's "
            f"error + {rule.element_floor_rms:g} x its rms + {rule.element_floor_ulps:g} ulp"
        )
    return unexplained, over


def _may_be(c: np.ndarray, shadow: np.ndarray, marks) -> np.ndarray:
    """Where `c`'s non-finite element is of a kind the marks (tools/bound_overflow.py) allow, or the shadow's NaN
    is one the device's arithmetic may have dropped, or its non-finite value one a rewritten form the device
    computes does not make (DROPPED_NAN: any value of `c`)."""
    if marks is None or c.dtype.kind == "c":
        return np.zeros(c.shape, bool)
    # (here: the CLI's parser imports this module, not Numba)
    from .bound_overflow import DROPPED_NAN, NAN, NEG_INF, POS_INF

    with np.errstate(invalid="ignore"):
        return (
            ((c == np.inf) & (marks & POS_INF > 0))
            | ((c == -np.inf) & (marks & NEG_INF > 0))
            | (np.isnan(c) & (marks & NAN > 0))
            | (~np.isfinite(shadow) & (marks & DROPPED_NAN > 0))
        )


def _same_nonfinite(c: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """Where `c` is the baseline's own non-finite value (NaN, or the same infinity): one run of the program's
    arithmetic made it, whatever the bounds say (their rules can miss one: an f32 product below the smallest
    subnormal bounded 0, x^3 / max(x^3) 0 / 0, the soundness search's seed 2)."""
    with np.errstate(invalid="ignore"):
        return (np.isnan(c) & np.isnan(baseline)) | (np.isinf(c) & (c == baseline))


def _judge_discrete_output(out: OutputVerdict, candidates: dict, shadow, baseline) -> OutputVerdict:
    """Integers and predicates: judged by mismatches (an exact answer has no error to bound)."""
    for name, c in candidates.items():
        out.candidates.append(_judge_discrete(name, c, shadow, baseline))
    out.baseline = Errors(mismatches=int(np.count_nonzero(baseline != shadow)))
    return out


def _worst_beyond_bound(candidates: list) -> dict | None:
    """The output's worst element beyond its bound over every candidate (JSON `worst`), None if none is."""
    flagged = [(c.worst[0], c.name) for c in candidates if c.worst and c.worst[0].bound is not None]
    if not flagged:
        return None
    w, name = max(flagged, key=lambda x: x[0].ratio if x[0].ratio == x[0].ratio else np.inf)
    return {"candidate": name, "index": w.index, "value": w.value, "exact": w.exact, "bound": w.bound, "ratio": w.ratio}


def allowed_error(bound: np.ndarray, magnitude: np.ndarray, dtype, rule: Rule) -> np.ndarray:
    """What an element may be off by: the factor times its bound. The bound already holds the element's final
    rounding (tools/bounds.py), so that rounding is not added again (adding it let an element rounded once be off
    by 3x its bound); it is only a floor, half an ulp of the output type at the exact value, which a bound cut by
    the sampled calibration, or an exact one, may lie below."""
    return rule.bound_factor * np.maximum(np.where(np.isnan(bound), np.inf, bound), 0.5 * ulp_at(magnitude, dtype))


def _explained(e: np.ndarray, allowed: np.ndarray, reference_allowed: np.ndarray) -> float:
    """The share of the error the device's rules allow beyond what the reference arithmetic allows."""
    total = float(e.sum())
    if total == 0:
        return 0.0
    gained = (
        np.minimum(e, np.where(np.isfinite(allowed), allowed, e)).sum()
        - np.minimum(e, np.where(np.isfinite(reference_allowed), reference_allowed, e)).sum()
    )
    return max(0.0, float(gained) / total)


def _judge_discrete(name: str, c: np.ndarray, shadow: np.ndarray, baseline: np.ndarray) -> CandidateVerdict:
    if c.shape != baseline.shape or c.dtype != baseline.dtype:
        return CandidateVerdict(
            name,
            Errors(),
            False,
            [f"{dtype_name(c.dtype)}{list(c.shape)}, expected {dtype_name(baseline.dtype)}{list(baseline.shape)}"],
        )
    wrong = (c != shadow) & (c != baseline)
    errors = Errors(mismatches=int(np.count_nonzero(wrong)))
    if not errors.mismatches:
        return CandidateVerdict(name, errors, True)
    flat = np.flatnonzero(wrong)[:WORST_COUNT]
    worst = [
        Element(
            tuple(int(i) for i in np.unravel_index(k, c.shape)),
            plain_scalar(c.ravel()[k]),
            plain_scalar(shadow.ravel()[k]),
            plain_scalar(baseline.ravel()[k]),
            1.0,
            0.0,
        )
        for k in flat
    ]
    return CandidateVerdict(
        name, errors, False, [f"{errors.mismatches} element(s) equal neither the shadow's nor the baseline's"], worst
    )


def _scale(shadow: np.ndarray, dtype) -> tuple[float, float]:
    """(max |shadow| over finite elements, at least the type's smallest normal; the ulp of `dtype` there)."""
    scale = output_scale(shadow)
    info = np.finfo(np.dtype(dtype).char.lower()) if np.dtype(dtype).kind == "c" else ml_dtypes.finfo(dtype)
    return max(scale, float(info.tiny)), float(ulp_at(scale, dtype))


def element_errors(x: np.ndarray, shadow: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|x - shadow| in f64, with 0 where both are the same non-finite value or x is the infinity the exact value
    rounds to in x's type (beyond its largest value: every correct result overflows there); where x is
    non-finite and the shadow is not, or they are different non-finite values)."""
    dtype = x.dtype
    wide = np.complex128 if x.dtype.kind == "c" else np.float64
    e = x.astype(wide)  # a copy: the errors are made in it (no other temporary of its size: page faults)
    with np.errstate(all="ignore"):
        if e.dtype.kind == "f" and shadow.dtype.kind != "c" and e.shape == shadow.shape:
            np.abs(np.subtract(e, shadow, out=e), out=e)
        else:
            e = np.abs(e - shadow)
    if np.isfinite(e.max(initial=0.0)):  # no non-finite element anywhere (the usual case): one pass less
        return e, np.zeros(e.shape, bool)
    x = x.astype(wide)
    x_fin, s_fin = np.isfinite(x), np.isfinite(shadow)
    same = (x == shadow) | (np.isnan(x) & np.isnan(shadow))
    if dtype.kind != "c":
        with np.errstate(over="ignore"):
            same |= np.isinf(x) & (np.asarray(shadow).astype(dtype).astype(wide) == x)
    bad = (~x_fin | ~s_fin) & ~same
    e = np.where(x_fin & s_fin, e, np.where(same, 0.0, np.inf))
    return e, bad


def _summary(e: np.ndarray, bad: np.ndarray, scale: float, ulp: float) -> Errors:
    finite = e[~bad] if bad.any() else e.ravel()
    max_abs = float(finite.max()) if finite.size else 0.0
    rms = float(np.sqrt(np.mean(np.square(finite)))) if finite.size else 0.0
    return Errors(
        max_abs=max_abs,
        max_rel=max_abs / scale,
        rms_rel=rms / scale,
        max_ulps=max_abs / ulp,
        nonfinite=int(np.count_nonzero(bad)),
    )


def _worst(
    failing: np.ndarray, e: np.ndarray, allowed: np.ndarray, c, shadow, baseline, bound: np.ndarray | None = None
) -> list[Element]:
    """The failing elements with the largest error / allowed ratio (with `bound`: their bounds and ratios)."""
    flat = np.flatnonzero(failing)
    with np.errstate(all="ignore"):
        ratio = e.ravel()[flat] / allowed.ravel()[flat]
    order = flat[np.argsort(-ratio, kind="stable")[:WORST_COUNT]]
    worst = []
    for k in order:
        w = Element(
            tuple(int(i) for i in np.unravel_index(k, c.shape)),
            plain_scalar(c.ravel()[k]),
            plain_scalar(shadow.ravel()[k]),
            plain_scalar(baseline.ravel()[k]),
            float(e.ravel()[k]),
            float(allowed.ravel()[k]),
        )
        if bound is not None:
            b = float(bound.ravel()[k])
            with np.errstate(all="ignore"):
                w.exact, w.bound, w.ratio = w.shadow, b, float(np.float64(w.error) / b) if b else float("inf")
        worst.append(w)
    return worst


def _held_by(w: Element) -> str:
    """SPMD: which participants hold the element."""
    if w.devices is None:
        return ""
    ids = w.devices
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"  devices {ids[0]}-{ids[-1]}"
    return f"  device{'s' if len(ids) > 1 else ''} {','.join(map(str, ids))}"


def format_verdict(verdict: Verdict) -> str:
    """The text `compare --reference shadow` prints: per output the baseline's and each candidate's errors."""

    def row(*cells):
        widths = (4, -16, -5, 9, -24, 10, 10, 10, 10, -0)
        return "  ".join(f"{c:<{-w}}" if w < 0 else f"{c:>{w}}" for c, w in zip(cells, widths)).rstrip()

    lines = [f"PROBLEM: {verdict.problem}"] if verdict.problem else []
    lines.append(row("out", "shape", "dtype", "scale", "run", "max abs", "max rel", "rms rel", "ulp@scale", "verdict"))
    for o in verdict.outputs:
        shape = "[" + ",".join(map(str, o.shape)) + "]"
        if o.problem:
            lines.append(row(str(o.index), shape, o.dtype, "", "", "", "", "", "", f"PROBLEM: {o.problem}"))
            continue
        first = [str(o.index), shape, o.dtype, _g(o.scale)]
        for name, errors, verdict_text in [("baseline (per-step)", o.baseline, "")] + [
            (c.name, c.errors, "consistent" if c.consistent else "NOT consistent") for c in o.candidates
        ]:
            if errors.mismatches or not (o.scale or o.ulp):
                cells = ["", "", "", f"{errors.mismatches} diff"]
            else:
                cells = [_g(errors.max_abs), _g(errors.max_rel), _g(errors.rms_rel), f"{errors.max_ulps:.3g}"]
            if errors.nonfinite:
                verdict_text += f" ({errors.nonfinite} non-finite)"
            lines.append(row(*first, name, *cells, verdict_text))
            first = ["", "", "", ""]
    for o in verdict.outputs:
        for c in o.candidates:
            if c.rounding_decided or c.unbounded:
                notes = [f"rounding-decided: {c.rounding_decided} element{'s' if c.rounding_decided != 1 else ''}"]
                if c.unbounded:
                    notes.append(f"{c.unbounded} without a bound")
                lines.append(f"output {o.index}: {', '.join(notes)} (not judged)")
            if c.nonfinite_allowed:
                lines.append(
                    f"output {o.index}: {c.nonfinite_allowed} element(s) may be non-finite (an overflow or a "
                    "division by an interval holding 0 the arithmetic allows)"
                )
            if c.rounding_decided or c.unbounded or c.nonfinite_allowed:
                break  # the same elements for every candidate
    lines += _explanations(verdict)
    others = {c.name: c.device for o in verdict.outputs for c in o.candidates if c.device != verdict.device}
    lines += [f"{name}: judged by {device}'s arithmetic" for name, device in others.items() if device]
    for o in verdict.outputs:
        for c in o.candidates:
            if c.consistent:
                continue
            lines.append(f"output {o.index}, {c.name}: " + "; ".join(c.reasons))
            for w in c.worst:
                index = "[" + ",".join(map(str, w.index)) + "]"
                if w.bound is not None:
                    lines.append(
                        f"  {index:<16} value {_v(w.value):>13}  exact {_v(w.exact):>13}  error "
                        f"{_g(w.error):>9}  bound {_g(w.bound):>9}  ratio {_g(w.ratio):>7}{_held_by(w)}"
                    )
                else:
                    lines.append(
                        f"  {index:<16} value {_v(w.value):>13}  shadow {_v(w.shadow):>13}  baseline "
                        f"{_v(w.baseline):>13}  error {_g(w.error):>9}  allowed {_g(w.allowed):>9}{_held_by(w)}"
                    )
    bad = [n for n in verdict.candidates if not verdict.consistent(n)]
    under = f" under {verdict.device}'s arithmetic" if verdict.device else ""
    lines.append(
        f"CONSISTENT: every candidate is as close to the exact answer as the program's precision allows{under}"
        if not bad and not verdict.problem
        else f"NOT CONSISTENT{under}: {', '.join(bad) or verdict.problem}"
    )
    if verdict.by_device:
        for other in verdict.by_device.values():
            if other is not verdict:
                lines += _explanations(other)
        for name, devices in verdict.explaining().items():
            lines.append(
                f"{name}: consistent under {', '.join(devices)}"
                if devices
                else f"{name}: consistent under none of {', '.join(verdict.by_device)}"
            )
    return "\n".join(lines)


def _explanations(verdict: Verdict) -> list[str]:
    """Which of the device's rules explain each candidate's error ("TF32 dots explain 97% of ...")."""
    return [
        f"output {o.index}, {c.name}: {verdict.device}'s {', '.join(o.device_rules)} dots explain "
        f"{c.explained:.0%} of its error"
        for o in verdict.outputs
        for c in o.candidates
        if c.explained is not None and c.explained >= 0.01 and o.device_rules
    ]


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _v(x) -> str:
    return f"{x:.7g}" if isinstance(x, float) else str(x)
