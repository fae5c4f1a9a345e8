"""Comparing a module's outputs with expected arrays, by the rules of XLA's literal_comparison.cc.

An element of a floating-point output fails only when its error exceeds BOTH bounds: absolute error
> atol and relative error (|actual - expected| / |expected|, infinite when expected is 0) > rtol
(NearComparator::CompareValues). NaN matches NaN; NaN against a number, and an infinity against
anything but the same infinity, fail whatever the bounds. Integer and pred outputs must be equal
(EqualHelper); complex outputs compare their real and imaginary parts as floats. A dtype or shape
difference fails the whole output (EqualShapes).

XLA's `run_hlo_module` applies one bound to every type (1e-3 abs and rel); here the defaults depend
on the output's type (DEFAULT_TOLERANCES) and `atol` / `rtol` override both. Errors are computed in
float64, so the absolute error is exact for every type up to f32 (XLA subtracts in the element type).

A dump taken without --xla_dump_large_constants=true writes large constants as `constant({...})`: their values
are lost (hloexec reads zeros, XLA's parser arbitrary values). An output that depends on such a constant is
reported with their names (`elided_constants`): a difference there may be theirs alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import ml_dtypes
import numpy as np

from ..exec.inputs import from_npz_void
from ..ir.dtypes import element_type_of

# element type name -> (atol, rtol): about one unit in the last place at 1.0 for the 16-bit types,
# room for reassociated sums (dots, reductions) for f32/f64.
DEFAULT_TOLERANCES = {
    "f64": (1e-12, 1e-12),
    "c128": (1e-12, 1e-12),
    "f32": (1e-5, 1e-5),
    "c64": (1e-5, 1e-5),
    "f16": (1e-3, 1e-3),
    "bf16": (1e-2, 1e-2),
}
WORST_COUNT = 5  # as XLA's kTopRelativeErrorCount


def default_tolerance(dtype) -> tuple[float, float]:
    """(atol, rtol) for an output of `dtype`: the table above; other floats (fp8, fp6, fp4) one
    epsilon of their type; integers and pred exact (0, 0)."""
    dtype = np.dtype(dtype)
    if dtype_name(dtype) in DEFAULT_TOLERANCES:
        return DEFAULT_TOLERANCES[dtype_name(dtype)]
    if is_float(dtype):
        eps = float(ml_dtypes.finfo(dtype).eps)
        return eps, eps
    return 0.0, 0.0


@dataclass
class Element:
    index: tuple[int, ...]
    actual: float | int | bool | str
    expected: float | int | bool | str
    abs_error: float
    rel_error: float


@dataclass
class OutputComparison:
    index: int
    shape: tuple[int, ...]
    dtype: str
    atol: float
    rtol: float
    total: int = 0
    mismatches: int = 0
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    max_ulp: float = 0  # max error in ulps of the output's type at its scale (max |expected|);
    # integers: the largest integer distance
    nan_mismatches: int = 0  # NaN on one side only
    inf_mismatches: int = 0  # an infinity on one side, or of the other sign
    worst: list[Element] = field(default_factory=list)
    problem: str = ""  # dtype / shape difference: the output was not compared
    elided_constants: list[str] = field(default_factory=list)  # constants it depends on whose values are lost

    @property
    def passed(self) -> bool:
        return not self.problem and self.mismatches == 0


@dataclass
class CompareReport:
    outputs: list[OutputComparison]
    problem: str = ""  # e.g. a different number of outputs

    @property
    def passed(self) -> bool:
        return not self.problem and all(o.passed for o in self.outputs)

    def to_dict(self) -> dict:
        """Plain JSON data; infinite errors as the string 'inf' (JSON has no infinity)."""
        return jsonable(
            {
                "passed": self.passed,
                "problem": self.problem or None,
                "outputs": [dict(asdict(o), passed=o.passed, problem=o.problem or None) for o in self.outputs],
            }
        )


def jsonable(value):
    """`value` with NaN and infinities (which JSON lacks) as the strings 'nan', 'inf', '-inf'."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return value


def compare_outputs(actual, expected, atol: float | None = None, rtol: float | None = None) -> CompareReport:
    """Compare two lists of arrays (flattened outputs) element by element; see the module docstring."""
    actual, expected = list(actual), list(expected)
    problem = "" if len(actual) == len(expected) else f"{len(actual)} outputs, expected {len(expected)}"
    return CompareReport(
        [compare_array(i, np.asarray(a), np.asarray(e), atol, rtol) for i, (a, e) in enumerate(zip(actual, expected))],
        problem,
    )


def compare_array(
    index: int, actual: np.ndarray, expected: np.ndarray, atol: float | None = None, rtol: float | None = None
) -> OutputComparison:
    expected, actual = from_npz_void(expected, actual.dtype), from_npz_void(actual, expected.dtype)
    default_atol, default_rtol = default_tolerance(expected.dtype)
    out = OutputComparison(
        index,
        tuple(expected.shape),
        dtype_name(expected.dtype),
        default_atol if atol is None else atol,
        default_rtol if rtol is None else rtol,
        total=expected.size,
    )
    if actual.dtype != expected.dtype:
        out.problem = f"dtype {dtype_name(actual.dtype)}, expected {dtype_name(expected.dtype)}"
    elif actual.shape != expected.shape:
        out.problem = f"shape {list(actual.shape)}, expected {list(expected.shape)}"
    elif expected.dtype.kind == "c":
        _compare_complex(out, actual, expected)
    elif is_float(expected.dtype):
        _compare_float(out, actual, expected)
    else:
        _compare_exact(out, actual, expected)
    return out


def dtype_name(dtype) -> str:
    """The HLO element type name of a numpy dtype (f32, bf16, pred), else numpy's name."""
    try:
        return element_type_of(dtype).name
    except KeyError:
        return np.dtype(dtype).name


def is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or (
        dtype.kind == "V" and dtype.type.__module__.startswith("ml_dtypes") and "float" in dtype.name
    )


def _float_errors(actual: np.ndarray, expected: np.ndarray):
    """(abs error, rel error, nan mismatch, inf mismatch) per element, as XLA's CompareValues defines them."""
    a = actual.astype(np.float64).ravel()
    e = expected.astype(np.float64).ravel()
    a_nan, e_nan = np.isnan(a), np.isnan(e)
    nan_mismatch = a_nan != e_nan
    inf_mismatch = (np.isinf(a) | np.isinf(e)) & (a != e) & ~a_nan & ~e_nan
    with np.errstate(all="ignore"):
        abs_err = np.abs(a - e)
        rel_err = np.where(e != 0, abs_err / np.abs(e), np.where(abs_err == 0, 0.0, np.inf))
    infinite = nan_mismatch | inf_mismatch
    abs_err[infinite] = np.inf
    rel_err[infinite] = np.inf
    equal = (a == e) | (a_nan & e_nan)  # also the same infinity
    abs_err[equal] = 0.0
    rel_err[equal] = 0.0
    return abs_err, rel_err, nan_mismatch, inf_mismatch


def ulp_at(magnitude, dtype) -> np.ndarray:
    """The ulp of float (or complex) type `dtype` at `magnitude` (elementwise), floored at the ulp of the type's
    smallest normal."""
    dtype = np.dtype(dtype)
    info = np.finfo(dtype.char.lower()) if dtype.kind == "c" else ml_dtypes.finfo(dtype)
    magnitude = np.asarray(np.maximum(np.abs(np.asarray(magnitude, np.float64)), float(info.tiny)))
    if info.nmant < 52:
        # the ulp is a power of two whose f64 exponent field is the magnitude's less nmant (never below 1: the
        # magnitude is at least the type's smallest normal); a non-finite magnitude's (field 2047) is 1's
        field = np.asarray(magnitude.view(np.int64) >> 52)
        field[field == 2047] = 1023
        field -= info.nmant
        return (field << 52).view(np.float64)
    mantissa, exponent = np.frexp(magnitude)  # magnitude = mantissa * 2^exponent, mantissa in [0.5, 1)
    return np.ldexp(1.0, np.where(np.isfinite(mantissa), exponent - 1, 0) - info.nmant)


def output_scale(expected: np.ndarray) -> float:
    """max |expected| over its finite elements (0 when there are none)."""
    if expected.dtype.kind == "f":  # without an array of magnitudes (a NaN or infinity: below)
        largest = max(float(expected.max(initial=0)), -float(expected.min(initial=0)))
    else:
        largest = float(np.abs(expected).max(initial=0))
    if largest == largest and largest != float("inf"):
        return largest
    magnitude = np.abs(expected)
    finite = magnitude[np.isfinite(magnitude)]
    return float(finite.max()) if finite.size else 0.0


# Outputs computed from other inputs (or by another module) are off nearly everywhere, each element by the order of
# its own value: past this share of elements off by this much of their own magnitude `compare` asks whether they
# were (a hint; the verdict is unchanged). Correct results are not: a result's rounding leaves few elements 10% off.
ELSEWHERE_SHARE, ELSEWHERE_OFF, ELSEWHERE_LEAST = 0.9, 0.1, 8


def computed_elsewhere_hint(name: str, outputs: list, reference: list) -> str:
    """ "" unless nearly every element of `outputs` (file `name`'s) is off from `reference`'s (hloexec's run of the
    module on the same inputs, or its exact answer) by more than a tenth of its own magnitude: then the question
    to ask."""
    far = total = 0
    for a, e in zip(outputs, reference):
        a, e = np.asarray(a), np.asarray(e)
        if a.shape != e.shape or not (is_float(e.dtype) or e.dtype.kind == "c"):
            continue
        wide = np.complex128 if e.dtype.kind == "c" else np.float64
        a, e = a.astype(wide), e.astype(wide)
        with np.errstate(invalid="ignore", over="ignore"):
            off = (np.abs(a - e) > ELSEWHERE_OFF * np.abs(e)) | (np.isfinite(e) & ~np.isfinite(a))
        far, total = far + int(np.count_nonzero(off)), total + a.size
    if total < ELSEWHERE_LEAST or far < ELSEWHERE_SHARE * total:
        return ""
    return (
        f"{name}: {far} of {total} elements are off by more than {ELSEWHERE_OFF:.0%} of their own value: were these "
        "outputs computed from these inputs (and this module)?"
    )


def _ulps_at_scale(abs_err: np.ndarray, expected: np.ndarray) -> float:
    """The largest finite error in ulps of the output type at the output's scale (max |expected|): ULPs that
    mean something for tiny elements too (two values of opposite sign near 0 are not billions of ULPs apart)."""
    finite = abs_err[np.isfinite(abs_err)]
    return float(finite.max() / ulp_at(output_scale(expected), expected.dtype)) if finite.size else 0.0


def _record(out: OutputComparison, abs_err, rel_err, mismatch, actual_flat, expected_flat, ulp) -> None:
    out.mismatches = int(np.count_nonzero(mismatch))
    out.max_abs_error = float(abs_err.max()) if abs_err.size else 0.0
    out.max_rel_error = float(rel_err.max()) if rel_err.size else 0.0
    out.max_ulp = ulp
    # The worst elements: mismatches first, by relative then absolute error (XLA lists mismatches by
    # relative error); when nothing fails, the largest differences.
    candidates = np.flatnonzero(mismatch) if out.mismatches else np.flatnonzero(abs_err > 0)
    if candidates.size:
        for flat in _worst_first(candidates, abs_err, rel_err):
            out.worst.append(
                Element(
                    tuple(int(i) for i in np.unravel_index(flat, out.shape)),
                    plain_scalar(actual_flat[flat]),
                    plain_scalar(expected_flat[flat]),
                    float(abs_err[flat]),
                    float(rel_err[flat]),
                )
            )


def _worst_first(candidates, abs_err, rel_err, k: int = WORST_COUNT):
    """The `k` candidates of largest relative, then absolute, error, in that order: a full sort of millions of
    mismatches took 24 s on a 16M-element output; partitions keep it linear."""
    if candidates.size > 8 * k:
        rel = rel_err[candidates]
        threshold = np.partition(rel, rel.size - k)[rel.size - k]  # the k-th largest relative error
        tied = rel == threshold
        if np.count_nonzero(tied) > 8 * k:  # many ties (infinite relative errors): the largest absolute
            absolute = abs_err[candidates[tied]]
            floor = np.partition(absolute, absolute.size - k)[absolute.size - k]
            tied[tied] = absolute >= floor
        candidates = candidates[(rel > threshold) | tied]
    return candidates[np.lexsort((-abs_err[candidates], -rel_err[candidates]))[:k]]


def _compare_float(out: OutputComparison, actual: np.ndarray, expected: np.ndarray) -> None:
    abs_err, rel_err, nan_mismatch, inf_mismatch = _float_errors(actual, expected)
    mismatch = (abs_err > out.atol) & (rel_err > out.rtol)
    out.nan_mismatches = int(np.count_nonzero(nan_mismatch))
    out.inf_mismatches = int(np.count_nonzero(inf_mismatch))
    a, e = actual.ravel(), expected.ravel()
    _record(out, abs_err, rel_err, mismatch, a, e, _ulps_at_scale(abs_err, expected))


def _compare_complex(out: OutputComparison, actual: np.ndarray, expected: np.ndarray) -> None:
    """Real and imaginary parts as two float comparisons; an element fails when either part does."""
    parts = [_float_errors(f(actual), f(expected)) for f in (np.real, np.imag)]
    abs_err = np.maximum(parts[0][0], parts[1][0])
    rel_err = np.maximum(parts[0][1], parts[1][1])
    mismatch = np.zeros(abs_err.shape, bool)
    for part_abs, part_rel, _, _ in parts:
        mismatch |= (part_abs > out.atol) & (part_rel > out.rtol)
    out.nan_mismatches = int(np.count_nonzero(parts[0][2] | parts[1][2]))
    out.inf_mismatches = int(np.count_nonzero(parts[0][3] | parts[1][3]))
    _record(out, abs_err, rel_err, mismatch, actual.ravel(), expected.ravel(), _ulps_at_scale(abs_err, expected))


def _exact_distance(a: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """|a - e| and |e| as uint64, exact for every pair of integers of one type. A 64-bit difference may overflow
    int64: it is taken modulo 2**64 from the larger operand, which is exact (Python ints took 28 s on 25M s64)."""
    if a.dtype.itemsize < 8:
        a64, e64 = a.astype(np.int64), e.astype(np.int64)
        return np.abs(a64 - e64).astype(np.uint64), np.abs(e64).astype(np.uint64)
    au, eu = a.view(np.uint64), e.view(np.uint64)
    return np.where(a >= e, au - eu, eu - au), np.where(e < 0, np.negative(eu), eu)


def _compare_exact(out: OutputComparison, actual: np.ndarray, expected: np.ndarray) -> None:
    a, e = actual.ravel(), expected.ravel()
    if np.array_equal(a, e):  # the usual verdict, in one pass: the defaults say no error
        return
    distance, e_abs = _exact_distance(a, e)
    abs_err = distance.astype(np.float64)
    e_abs = e_abs.astype(np.float64)
    with np.errstate(all="ignore"):
        rel_err = np.where(e_abs != 0, abs_err / e_abs, np.where(abs_err == 0, 0.0, np.inf))
    _record(out, abs_err, rel_err, a != e, a, e, int(distance.max()) if distance.size else 0)


def plain_scalar(value):
    """A JSON-friendly Python scalar; NaN and infinities as the strings 'nan', 'inf', '-inf'."""
    dtype = np.dtype(type(value)) if isinstance(value, np.generic) else np.asarray(value).dtype
    if dtype == np.bool_:
        return bool(value)
    if dtype.kind == "c":
        return str(complex(value))
    if not is_float(dtype):
        return int(value)
    return jsonable(float(value))


def format_report(report: CompareReport) -> str:
    """The text `hloexec compare` prints: one line per output, then the worst elements of failing ones."""

    def row(*cells):
        widths = (4, -20, -6, 16, 9, 9, 10, -13)  # negative: left-aligned
        return "  ".join(f"{c:<{-w}}" if w < 0 else f"{c:>{w}}" for c, w in zip(cells, widths)) + "  " + cells[-1]

    lines = [f"MISMATCH: {report.problem}"] if report.problem else []
    lines.append(row("out", "shape", "dtype", "mismatches", "max abs", "max rel", "ulp@scale", "atol/rtol", "result"))
    for o in report.outputs:
        shape = "[" + ",".join(map(str, o.shape)) + "]"
        if o.problem:
            lines.append(row(str(o.index), shape, o.dtype, "", "", "", "", "", f"FAIL: {o.problem}"))
            continue
        patterns = [f"{n} {what} pattern" for n, what in ((o.nan_mismatches, "NaN"), (o.inf_mismatches, "Inf")) if n]
        if o.elided_constants:
            patterns.append(
                f"depends on {len(o.elided_constants)} elided constant{'s' if len(o.elided_constants) != 1 else ''}"
            )
        result = ("ok" if o.passed else "FAIL") + (f" ({', '.join(patterns)})" if patterns else "")
        lines.append(
            row(
                str(o.index),
                shape,
                o.dtype,
                f"{o.mismatches}/{o.total}",
                _g(o.max_abs_error),
                _g(o.max_rel_error),
                _g(o.max_ulp),
                f"{_g(o.atol)}/{_g(o.rtol)}",
                result,
            )
        )
    for o in report.outputs:
        if o.passed or not o.worst:
            continue
        lines.append(f"output {o.index}: worst elements")
        for w in o.worst:
            index = "[" + ",".join(map(str, w.index)) + "]"
            lines.append(
                f"  {index:<18} actual {_v(w.actual):>15}  expected {_v(w.expected):>15}  "
                f"abs {_g(w.abs_error):>9}  rel {_g(w.rel_error):>9}"
            )
    failed = sum(not o.passed for o in report.outputs)
    lines.append(
        "PASS: all outputs match"
        if report.passed
        else f"FAIL: {failed} of {len(report.outputs)} outputs differ"
        + (f"; {report.problem}" if report.problem else "")
    )
    unknown = sum(not o.passed and bool(o.elided_constants) for o in report.outputs)
    if unknown:
        lines.append(
            f"note: {unknown} of the differing outputs depend on constants the dump elided ({{...}}: "
            "values not in the text): their differences may come from those values alone"
        )
    return "\n".join(lines)


def _g(x: float) -> str:
    return f"{x:.3g}"


def _v(x) -> str:
    return f"{x:.9g}" if isinstance(x, float) else str(x)


def elided_dependencies(module) -> list[list[str]]:
    """Per output (flattened, in order): the names of the elided constants (`constant({...})`) it depends on,
    through operands and the computations instructions call."""
    from ..exec.plan import schedule  # the op registry: not at startup

    if not module.elided_constants():
        return [[] for _ in module.entry.root.shape.leaves()]
    in_comp: dict[int, set] = {}

    def depends(comp) -> dict[int, set]:
        """instruction id -> the elided constants its value depends on, for every instruction of `comp`."""
        deps: dict[int, set] = {}
        for inst in schedule(comp):
            found = {inst.name} if inst.literal_elided else set()
            for c in inst.called_computations:
                if id(c) not in in_comp:
                    in_comp[id(c)] = set()  # (a cycle, invalid HLO, adds nothing)
                    in_comp[id(c)] = set().union(*depends(c).values())
                found |= in_comp[id(c)]
            deps[id(inst)] = found.union(*(deps[id(o)] for o in inst.operands))
        return deps

    deps = depends(module.entry)

    def leaves(inst, shape) -> list[set]:
        if shape.is_tuple and inst.opcode == "tuple":
            return [d for o in inst.operands for d in leaves(o, o.shape)]
        return [deps[id(inst)]] * (len(list(shape.leaves())) if shape.is_tuple else 1)

    root = module.entry.root
    return [sorted(d) for d in leaves(root, root.shape)]


def mark_elided(report: CompareReport, *modules) -> CompareReport:
    """Name, on each output of `report`, the elided constants of `modules` (the compared ones) it depends on."""
    for module in modules:
        for out, names in zip(report.outputs, elided_dependencies(module)):
            out.elided_constants = sorted(set(out.elided_constants) | set(names))
    return report
