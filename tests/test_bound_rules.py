"""The bounds' compiled rules (hloexec/kernels/bound_rules.py) against numpy forms of the same formulas, written
here from the rules' documentation (tools/bounds.py `_round`, tools/bound_samples.calibrate, ErrorBounds._sample):
random data with infinities, NaN, zeros, subnormals and values of the types mixed in."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from scipy import optimize, stats

from hloexec.kernels import bound_rules
from hloexec.kernels.bound_rules import LONE, NEAR, add_noise, block_ratios, round_bounds, scale_blocks
from hloexec.kernels.normal_draws import rounding_draws, standard_normals
from hloexec.tools.bound_samples import CALIBRATION_BLOCK, MEASURED_FROM, CUT_BELOW, POOLED_FROM, SAMPLE_MARGIN
from hloexec.tools.bound_samples import SAMPLES, SIGMAS, calibrate, margin

HALF_ULPS = 0.5 * SIGMAS / np.sqrt(3)
WIDE_ULPS = 4.0 * SIGMAS / np.sqrt(3)
CAP = np.sqrt(3) / SIGMAS


@pytest.fixture(params=["one pass", "split"])
def passes(request, monkeypatch):
    """The compiled passes whole, or split (kernels/bound_rules.over_cores) into spans of about 100 elements
    (whole calibration blocks where they tally blocks) taken by two threads."""
    if request.param == "split":
        monkeypatch.setattr(bound_rules, "SPLIT_FROM", 0)
        monkeypatch.setattr(bound_rules, "SPAN", 100)
        monkeypatch.setenv("HLOEXEC_NUM_THREADS", "2")
    return request.param


def _ulp(magnitude, dtype) -> np.ndarray:
    """The ulp at |magnitude| (floored at the smallest normal's; a non-finite magnitude's is 1's), from frexp."""
    info = ml_dtypes.finfo(dtype)
    m = np.maximum(np.abs(np.asarray(magnitude, np.float64)), float(info.tiny))
    mantissa, exponent = np.frexp(m)
    return np.ldexp(1.0, np.where(np.isfinite(mantissa), exponent - 1, 0) - info.nmant)


def _awkward(rng, n, dtype) -> np.ndarray:
    """Values of every kind: normal, subnormal (of `dtype` and of f64), zeros, infinities, NaN, values of the type
    (a float of `dtype` widened), huge ones beyond its range."""
    info = ml_dtypes.finfo(dtype)
    kinds = [
        rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n),
        rng.uniform(-1, 1, n) * float(info.tiny),
        rng.uniform(-1, 1, n) * 1e-310,
        np.zeros(n),
        np.full(n, np.inf) * rng.choice([-1, 1], n),
        np.full(n, np.nan),
        rng.standard_normal(n).astype(dtype).astype(np.float64),
        rng.standard_normal(n) * float(info.max) * 2,
        np.full(n, float(info.max)),
    ]
    return np.stack(kinds)[rng.integers(0, len(kinds), n), np.arange(n)]


def _numpy_round(x, variance, at, dtype, opcode_kind, precision_bits=None):
    """The rule in numpy: own = half an ulp (as SIGMAS sigmas of a uniform error) at |x| + bound, reduce-precision's
    floor, a transcendental's 4 more f32 ulps, 0 for an exact operand's representable value; then
    min(root-sum-square, bound + largest error)."""
    bound = np.sqrt(variance)
    magnitude = np.abs(x) + (bound if at is None else at)
    own = HALF_ULPS * _ulp(magnitude, dtype)
    if precision_bits is not None:
        # (the constant first: magnitude x SIGMAS / sqrt(3) overflows near the largest f64 where the result does not)
        own = np.maximum(own, SIGMAS / np.sqrt(3) * 2.0 ** -(precision_bits + 1) * magnitude)
    if opcode_kind == "transcendental":
        own = own + WIDE_ULPS * _ulp(magnitude, np.float32)
    elif opcode_kind == "elementwise":
        representable = np.asarray(x).astype(dtype).astype(np.float64) == x
        own = np.where((bound == 0) & representable, 0.0, own)
    return np.minimum(np.sqrt(np.square(bound) + np.square(own)), bound + own * CAP), own


def _compiled_round(x, variance, at, dtype, opcode_kind, precision_bits=None, out_dtype=np.float64):
    info = ml_dtypes.finfo(dtype)
    own, bound = np.empty(x.shape), np.empty(x.shape, out_dtype)
    precision = 0.0 if precision_bits is None else SIGMAS / np.sqrt(3) * 2.0 ** -(precision_bits + 1)
    round_bounds(x, variance, np.empty(0) if at is None else at, own, bound, int(info.nmant), float(info.tiny),
                 float(HALF_ULPS), int(np.finfo(np.float32).nmant), float(np.finfo(np.float32).tiny),
                 float(WIDE_ULPS) if opcode_kind == "transcendental" else 0.0, precision,
                 opcode_kind == "elementwise", float(info.max),
                 bool(np.isinf(np.asarray(np.inf).astype(dtype))), float(CAP))
    return bound, own


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64,
                                   ml_dtypes.float8_e4m3fn])
@pytest.mark.parametrize("kind", ["elementwise", "transcendental", "sum", "reduce-precision", "at"])
def test_round_bounds_is_the_numpy_rule(dtype, kind, passes):
    rng = np.random.default_rng(7)
    n = 20000
    x = _awkward(rng, n, dtype)
    if dtype == np.float32:
        x = x.astype(np.float32)                    # (a narrowed shadow's values)
    variance = np.square(_awkward(rng, n, dtype))
    variance[rng.random(n) < 0.3] = 0.0             # exact operands
    at = np.abs(_awkward(rng, n, dtype)) if kind == "at" else None
    bits = 5 if kind == "reduce-precision" else None
    with np.errstate(all="ignore"):
        want_bound, want_own = _numpy_round(x, variance, at, dtype, kind, bits)
    bound, own = _compiled_round(x, variance, at, dtype, kind, bits)
    np.testing.assert_array_equal(own, want_own)
    np.testing.assert_array_equal(bound, want_bound)
    narrow, _ = _compiled_round(x, variance, at, dtype, kind, bits, out_dtype=np.float32)
    np.testing.assert_array_equal(narrow, want_bound.astype(np.float32))
    if kind == "elementwise":                       # the exemption happened, and not everywhere
        assert 0 < np.count_nonzero(own == 0) < n


def _numpy_calibrate(bound, deviations, ceiling=None):
    """calibrate's rule in numpy (per block of CALIBRATION_BLOCK: the largest and the mean ratio of the samples'
    sum of squares to the bound squared over the elements with finite positive bounds and finite samples)."""
    squares = np.einsum("k...,k...->...", deviations, deviations).reshape(-1)
    flat = np.reshape(bound, -1)
    seen = (flat > 0) & (flat < np.inf)
    finite = np.isfinite(squares)
    if np.any(~finite & (flat < np.inf)):
        return bound
    seen &= finite
    if not seen.any():
        return bound
    ratio = np.divide(squares, np.square(flat, dtype=np.float64), where=seen, out=np.zeros(flat.shape))
    pad = -flat.size % CALIBRATION_BLOCK

    def per_block(v, fill):
        return np.pad(v, (0, pad), constant_values=fill).reshape(-1, CALIBRATION_BLOCK)

    largest, counted = per_block(ratio, 0).max(axis=1), per_block(seen, False).sum(axis=1)
    spread = SIGMAS / np.sqrt(len(deviations))
    enough, pooled = counted >= MEASURED_FROM, counted >= POOLED_FROM
    # the margin where the samples of the elements within NEAR of the block's largest ratio are few independent
    # draws: P, the participation ratio of the Gram matrix of their directions (at most its rank), draws each below
    # 1 / M of their sigma with probability P(chi2_S < S / M^2): M with that to the power P - 1/2 at CUT_BELOW, at
    # least SAMPLE_MARGIN; in a block of fewer than MEASURED_FROM elements P - 1, and at least the margin for its
    # count n of elements whose samples moved (n - 1 others each below LONE / M of their sigma); fewer than
    # POOLED_FROM: one draw's (P = 1)
    s = len(deviations)
    p = np.where(pooled, _numpy_participation(flat, deviations, ratio, seen, largest), 1.0)
    draws = np.clip(p - np.where(enough, 0.5, np.where(pooled, 1.0, 0.5)), 1, s)
    worth = np.maximum(SAMPLE_MARGIN, np.sqrt(s / stats.chi2.ppf(CUT_BELOW ** (1 / draws), s)))
    moved = per_block(seen & (squares > 0), False).sum(axis=1)
    for j in np.flatnonzero(pooled & ~enough & (moved >= POOLED_FROM)):
        worth[j] = max(worth[j], _scipy_small_margin(moved[j]))
    factor = np.where(largest > 0, np.minimum(1.0, worth * spread * np.sqrt(largest)), 1.0)
    repeat = lambda per: np.repeat(per, CALIBRATION_BLOCK)[: flat.size].reshape(np.shape(bound))  # noqa: E731
    calibrated = repeat(factor.astype(flat.dtype)) * bound
    # a cut block's one or two elements whose bound is below a third of its third smallest (finite positive bounds,
    # samples finite and not all 0): cut by their own samples alone, no further (their largest ratio, their P's margin)
    cut = factor < 1
    for j, members in enumerate(_numpy_lone(flat, deviations, squares)):
        if cut[j] and pooled[j] and members.size:
            gram = _numpy_gram(np.asarray(deviations, np.float64).reshape(s, -1)[:, members])
            p = np.trace(gram) ** 2 / np.sum(gram**2)
            own = np.sqrt(s / stats.chi2.ppf(CUT_BELOW ** (1 / np.clip(p - 0.5, 1, s)), s))
            floor = np.minimum(1.0, max(own, SAMPLE_MARGIN) * spread * np.sqrt(ratio[members].max()))
            calibrated.reshape(-1)[members] = np.maximum(calibrated.reshape(-1)[members], floor * flat[members])
    if ceiling is None:
        return calibrated
    short = np.where(enough, spread * np.sqrt(per_block(ratio, 0).sum(axis=1) / np.maximum(counted, 1)), 1.0)
    if not np.any(short > 1):
        return calibrated
    return np.maximum(calibrated, np.minimum(bound * repeat(short), ceiling()))


def _scipy_small_margin(n: int) -> float:
    """M with P(chi2_4 < 4 / M^2) P(chi2_4 < 4 LONE^2 / M^2)^(n - 1) = CUT_BELOW (scipy's CDF and root finder)."""
    cdf = lambda x: stats.chi2.cdf(x, SAMPLES)  # noqa: E731
    return optimize.brentq(lambda m: cdf(4 / m**2) * cdf(4 * LONE**2 / m**2) ** (n - 1) - CUT_BELOW, 1, 8, xtol=1e-12)


def _numpy_lone(flat, deviations, squares):
    """Per block, the indices of its elements whose bound is below a third of the third smallest bound among its
    elements with finite positive bounds and finite samples not all 0 (all of them where fewer than three are)."""
    squares = np.asarray(squares, np.float64)
    judged = (flat > 0) & (flat < np.inf) & (squares > 0) & np.isfinite(squares)
    out = []
    for lo in range(0, flat.size, CALIBRATION_BLOCK):
        at = lo + np.flatnonzero(judged[lo:lo + CALIBRATION_BLOCK])
        third = np.sort(flat[at])[2] if at.size > 2 else np.inf
        out.append(at[3 * flat[at] < third])
    return out


def _numpy_gram(u):
    """The Gram matrix of the directions of the columns of `u` (samples, elements)."""
    u = u / np.sqrt(np.sum(u**2, axis=0))
    return u @ u.T


def _numpy_participation(flat, deviations, ratio, seen, largest):
    """Per block, the participation ratio P = trace(G)^2 / |G|^2 of the Gram matrix G of the directions of the
    samples of its elements within NEAR of its largest ratio (`ratio`: the samples' sum of squares over the bound
    squared where `seen`); 0 where none counts."""
    s = len(deviations)
    pad = -flat.size % CALIBRATION_BLOCK
    near = seen & (ratio >= np.repeat(largest / NEAR, CALIBRATION_BLOCK)[: flat.size]) & (ratio > 0)
    scale = np.sqrt(np.where(near, ratio, 1.0)) * np.where(seen, flat, 1.0)
    u = np.where(near, np.asarray(deviations, np.float64).reshape(s, -1) / scale, 0.0)
    blocks = np.pad(u, ((0, 0), (0, pad))).reshape(s, -1, CALIBRATION_BLOCK)
    gram = np.einsum("kbt,lbt->bkl", blocks, blocks)
    squares = np.sum(gram**2, axis=(1, 2))
    return np.divide(np.trace(gram, axis1=1, axis2=2) ** 2, squares, where=squares > 0, out=np.zeros(len(gram)))


@pytest.mark.parametrize("kept", [np.float32, ml_dtypes.bfloat16])
def test_participation_ratios_only_in_the_blocks_being_cut(kept, passes):
    """participation_ratios computes a block's P (the numpy rule) only where `cut` says, leaving the other blocks'
    `out` as it was; the samples read as kept: float32, or bfloat16 as their bits (uint16, no float32 copy), the
    same values as decoded by ml_dtypes. Blocks of independent deviations (P ~4), of one shared deviation times a
    factor per element (1), one tight element among loose ones (1), a shorter last one."""
    rng = np.random.default_rng(13)
    blocks, n = 12, 12 * CALIBRATION_BLOCK - 40
    bound = np.abs(rng.standard_normal(n)) + 0.5
    deviations = rng.standard_normal((SAMPLES, n))
    shared = slice(3 * CALIBRATION_BLOCK, 5 * CALIBRATION_BLOCK)  # blocks 3, 4: one deviation per sample
    deviations[:, shared] = rng.standard_normal((SAMPLES, 1)) * rng.uniform(0.5, 2, shared.stop - shared.start)
    bound[6 * CALIBRATION_BLOCK + 1 : 7 * CALIBRATION_BLOCK] *= 1000  # block 6: element 0 tight alone
    bound[9 * CALIBRATION_BLOCK + 5] = np.inf  # (not seen)
    stored = deviations.astype(kept)
    squares = np.sum(stored.astype(np.float32) ** 2, axis=0, dtype=np.float32)
    seen = np.isfinite(bound)
    ratio = np.where(seen, squares / bound**2, 0)
    largest = np.pad(ratio, (0, -n % CALIBRATION_BLOCK)).reshape(blocks, -1).max(axis=1)
    want = _numpy_participation(bound, stored.astype(np.float64), ratio, seen, largest)
    assert want[0] > 3.5 and max(want[3], want[4], want[6]) < 1.01  # (the premise: both kinds)
    cut = np.zeros(blocks, bool)
    cut[[0, 3, 6, 9, 11]] = True
    out = np.full(blocks, -1.0)
    samples = stored.view(np.uint16) if kept == ml_dtypes.bfloat16 else stored
    lone = np.full((blocks, 2), -1, np.int64), np.zeros(blocks), np.zeros(blocks)
    bound_rules.participation_ratios(samples, bound, CALIBRATION_BLOCK, largest, cut, out, lone)
    np.testing.assert_allclose(out[cut], want[cut], rtol=1e-9)
    assert np.all(out[~cut] == -1)
    members = _numpy_lone(bound, stored.astype(np.float64), squares)
    assert list(members[6]) == [6 * CALIBRATION_BLOCK]            # (the lone element; the others none, or two)
    for j in range(blocks):
        want_members = list(members[j]) if cut[j] else []
        assert sorted(lone[0][j][lone[0][j] >= 0]) == want_members, j
        if want_members:
            gram = _numpy_gram(stored.astype(np.float64)[:, want_members])
            np.testing.assert_allclose(lone[2][j], np.trace(gram) ** 2 / np.sum(gram**2), rtol=1e-9)
            np.testing.assert_allclose(lone[1][j], ratio[want_members].max(), rtol=1e-6)


def test_calibrate_reads_bfloat16_samples_as_their_float32_values():
    """Samples as kept (bfloat16, with the statistics their pass tallied) calibrate a bound as the same values in
    float32 do, bit for bit (the participation ratio reads their bits): loose blocks of independent deviations and
    of one shared deviation, both cut."""
    rng = np.random.default_rng(17)
    bound = np.full((64, CALIBRATION_BLOCK), 20.0 * SIGMAS, np.float32)
    deviations = rng.standard_normal((SAMPLES, 64, CALIBRATION_BLOCK))
    deviations[:, ::2] = rng.standard_normal((SAMPLES, 32, 1))  # even blocks: one deviation each
    kept = deviations.astype(ml_dtypes.bfloat16)
    decoded = kept.astype(np.float32)
    stats = block_ratios(decoded.reshape(SAMPLES, -1), bound.reshape(-1), CALIBRATION_BLOCK)  # (a pass's)
    got = calibrate(bound, kept, stats=stats)
    np.testing.assert_array_equal(got, calibrate(bound, decoded, stats=stats))
    cut = got[:, 0] / bound[:, 0]
    assert np.all(cut < 1) and np.median(cut[::2]) > np.median(cut[1::2])  # (a wider margin where one draw)


def test_calibrate_reads_complex_samples_as_their_moduli():
    """A complex value's bound is on its error's modulus: calibrate reads complex deviations d as |d| (Re^2 + Im^2
    summed over the samples), and its margin from the real draws they are made of. Loose blocks of independent
    deviations and of one real deviation shared by the block: deviations real, imaginary, or times unit complex
    factors of any phase (the shared draw stays one draw: its parts together span two directions, each part one)
    calibrate as their moduli's real deviations do, the shared blocks at the one-draw margin (a wider cut)."""
    rng = np.random.default_rng(23)
    bound = np.full((64, CALIBRATION_BLOCK), 20.0 * SIGMAS)
    real = rng.standard_normal((SAMPLES, 64, CALIBRATION_BLOCK))
    real[:, ::2] = rng.standard_normal((SAMPLES, 32, 1)) * rng.uniform(0.5, 1, (1, 32, CALIBRATION_BLOCK))
    phase = np.exp(1j * rng.uniform(0, 2 * np.pi, (1, 64, CALIBRATION_BLOCK)))
    want = calibrate(bound, real.astype(np.float32))
    assert np.all(want < bound) and np.median(want[::2, 0]) > np.median(want[1::2, 0])
    for factor in (1, 1j, phase):
        got = calibrate(bound, (real * factor).astype(np.complex64))
        np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("bound_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["loose", "short", "specials", "nonfinite-samples", "few", "small"])
def test_calibrate_is_the_numpy_rule(bound_dtype, case, passes):
    rng = np.random.default_rng(11)
    shape = (37, 300)                               # blocks cross rows; a shorter last block
    bound = np.abs(rng.standard_normal(shape)).astype(bound_dtype)
    deviations = (rng.standard_normal((4, *shape)) * (0.01 if case in ("loose", "small") else 1.0)).astype(np.float32)
    deviations[:, rng.random(shape) < 0.05] = 0.0
    if case in ("specials", "nonfinite-samples"):
        flat = bound.reshape(-1)
        picks = rng.integers(0, flat.size, 400)
        flat[picks[:100]] = np.inf
        flat[picks[100:200]] = 0.0
        flat[picks[200:300]] = np.nan
        flat[picks[300:]] = 1e-30 if bound_dtype == np.float32 else 1e-300
        deviations.reshape(4, -1)[:, picks[:100]] = np.inf     # (beyond an infinite bound: not judged)
    if case == "nonfinite-samples":
        deviations[1, 3, 4] = np.nan
    if case == "few":
        bound[:, 1:] = np.inf
    if case == "small":                             # (blocks of 17-20 elements: small values pooled)
        bound[:, 20:] = np.inf
    ceiling = lambda: bound * 3.0  # noqa: E731
    with np.errstate(all="ignore"):
        for with_ceiling in (None, ceiling):
            want = _numpy_calibrate(bound, deviations, with_ceiling)
            got = calibrate(bound, deviations, with_ceiling)
            assert got.dtype == want.dtype and got.shape == want.shape
            # (equal but for the last bits: the samples' float32 squares are summed in another order than einsum's)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
            assert np.array_equal(np.isnan(got), np.isnan(want))
    if case in ("loose", "short", "small"):         # the rule acted (divided / raised somewhere)
        assert not np.array_equal(calibrate(bound, deviations, ceiling), bound)


@pytest.mark.parametrize("profile", ["8 equal", "32 equal", "63 equal", "16 one hidden 3x tighter",
                                     "8 sharing a draw", "32 log-ramp"])
def test_small_values_of_8_to_63_elements_are_cut_by_their_count_at_most_at_its_probability(profile):
    """Values of POOLED_FROM to MEASURED_FROM elements (each at the start of its own block, the rest not judged),
    numpy's Gaussian deviations of sigma 1, bounds 10 SIGMAS sigma: equally loose ones were cut at one draw's
    margin times their largest ratio, ~9.5-10x SIGMAS sigma (hardly cut); now at the margin of their draws less a
    half and at least small_margin(n), 3.7-4.4x. The tightest element stays below SIGMAS sigma at most at CUT_BELOW:
    equally loose; one element 3x tighter by its sigma whose bound says nothing (the same bound as the others: the
    looseness small_margin is made for, exactly CUT_BELOW there); 97% of the variance one shared draw; a log-ramp
    of looseness 1-100x."""
    rng = np.random.default_rng(17)
    n, values = int(profile.split()[0]), 8000
    sigma = np.ones((values, CALIBRATION_BLOCK))
    looseness = np.full((values, CALIBRATION_BLOCK), 10.0)
    deviations = rng.standard_normal((SAMPLES, values, CALIBRATION_BLOCK))
    if "hidden" in profile:                         # element 0: sigma 3x, looseness 3x less, the same bound
        sigma[:, 0], looseness[:, 1:n] = 3.0, 30.0
    if profile.endswith("log-ramp"):
        looseness[:, :n] *= np.geomspace(1, 100, n)
    if profile.endswith("draw"):
        deviations = math.sqrt(0.97) * rng.standard_normal((SAMPLES, values, 1)) + math.sqrt(0.03) * deviations
    bound = SIGMAS * looseness * sigma
    bound[:, n:] = np.inf
    left = calibrate(bound, (deviations * sigma).astype(np.float32)) / (SIGMAS * sigma)   # per sigma
    below = np.mean(left[:, 0] < 1)
    assert below <= CUT_BELOW + 4 * math.sqrt(CUT_BELOW / values), below
    if profile.endswith("equal"):
        assert np.median(left[:, :n]) < 4.5, np.median(left[:, :n])   # (main: 9.5-10)


def test_the_small_values_margin_is_its_probability():
    """small_margin(n) is the M where P(chi2_4 < 4 / M^2) P(chi2_4 < 4 LONE^2 / M^2)^(n - 1) = CUT_BELOW (scipy's);
    one element's is one draw's (margin(1)); numpy's chi-square draws of n elements, one tight and the others LONE x
    looser, all below the cut's thresholds in CUT_BELOW of trials."""
    from hloexec.tools.bound_samples import small_margin
    counts = np.arange(1, MEASURED_FROM)
    np.testing.assert_allclose(small_margin(counts), [_scipy_small_margin(n) for n in counts], rtol=1e-9)
    assert math.isclose(float(small_margin(1)), float(margin(1.0)), rel_tol=1e-9)
    assert np.all(np.diff(small_margin(counts)) < 0) and small_margin(MEASURED_FROM - 1) < 2.1
    rng = np.random.default_rng(29)
    trials = 10**6
    for n in (POOLED_FROM, 32):
        m = float(small_margin(n))
        tight = rng.chisquare(SAMPLES, trials) < SAMPLES / m**2
        others = np.all(rng.chisquare(SAMPLES, (n - 1, trials)) < SAMPLES * LONE**2 / m**2, axis=0)
        assert abs(np.mean(tight & others) - CUT_BELOW) < 4 * math.sqrt(CUT_BELOW / trials)


def _chi2_4_below(x: float) -> float:
    """P(chi2_4 < x)."""
    return 1 - math.exp(-x / 2) * (1 + x / 2)


def test_calibration_cuts_a_lone_tight_element_by_four_draws_margin():
    """docs/verdicts.md "Sampled calibration": with d_s ~ N(0, sigma^2) an element's sum of squares over S samples is
    sigma^2 chi2_S, and its bound (SIGMAS sigma) is cut below SIGMAS sigma when the margin x the samples' RMS
    falls below sigma. In a block where it is the one tight element (the others 1000x looser) its four draws are
    all the block shows: the margin for one draw M, P(chi2_4 < 4 / M^2) = 0.1% (SAMPLE_MARGIN's was
    P(chi2_4 < 1) = 9.0%). A block of equally tight elements (bounds 10x loose) is cut at SAMPLE_MARGIN, never below
    SIGMAS."""
    rng = np.random.default_rng(5)
    blocks = 4000
    bound = np.full((blocks, CALIBRATION_BLOCK), 1000.0 * SIGMAS)
    bound[:, 0] = SIGMAS
    deviations = rng.standard_normal((SAMPLES, blocks, CALIBRATION_BLOCK)).astype(np.float32)
    below = np.mean(calibrate(bound, deviations)[:, 0] < SIGMAS)
    few = _chi2_4_below(SAMPLES / margin(1.0) ** 2)
    assert few < 0.0011 and below <= few + 3 * math.sqrt(few / blocks)
    loose = np.full((blocks, CALIBRATION_BLOCK), 10 * SIGMAS)
    calibrated = calibrate(loose, deviations)
    assert np.all(calibrated >= SIGMAS) and np.mean(calibrated[:, 0] < loose[:, 0]) > 0.99


def test_calibration_cuts_a_block_whose_elements_carry_one_deviation_by_four_draws_margin():
    """A block whose elements' samples are one draw per sample times a factor per element (a broadcast row
    value's deviation c_s times x_t: the f16 LayerNorm backward's mul.41) shows four draws, not 1,024: its bound
    is cut at the margin for one draw, below SIGMAS sigma in ~0.1% of blocks (at SAMPLE_MARGIN: 9%); the same bounds with
    independent deviations of the same sigma are cut at SAMPLE_MARGIN, never below."""
    rng = np.random.default_rng(7)
    blocks = 4000
    x = rng.uniform(0.5, 2, (blocks, CALIBRATION_BLOCK))
    bound = 10 * SIGMAS * x                         # 10x SIGMAS sigma: loose enough to be cut
    common = rng.standard_normal((SAMPLES, blocks, 1)) * x
    calibrated = calibrate(bound, common.astype(np.float32))
    few = _chi2_4_below(SAMPLES / margin(1.0) ** 2)
    assert np.mean(calibrated[:, 0] < SIGMAS * x[:, 0]) <= few + 3 * math.sqrt(few / blocks)
    assert np.mean(calibrated[:, 0] < bound[:, 0]) > 0.5      # (cut: a wider margin, not none)
    own = rng.standard_normal((SAMPLES, blocks, CALIBRATION_BLOCK)) * x
    calibrated = calibrate(bound, own.astype(np.float32))
    assert np.mean(calibrated[:, 0] < bound[:, 0]) > 0.99 and np.all(calibrated >= SIGMAS * x)


def test_the_margin_is_chi_squares_quantiles_computed_only_below_independent_draws(monkeypatch):
    """margin(P) = max(SAMPLE_MARGIN, sqrt(SAMPLES / chi2_4's quantile at CUT_BELOW^(1 / (P - 1/2)))) (scipy's
    quantile, P clipped to 1.5-4.5 as the formula clips P - 1/2 to 1-4; NaN: NaN), the quantile computed only for
    the participation ratios below INDEPENDENT: from there up the formula is below SAMPLE_MARGIN."""
    from hloexec.tools import bound_samples

    def formula(p):
        below = CUT_BELOW ** (1 / np.clip(p - 0.5, 1, SAMPLES))
        return np.maximum(SAMPLE_MARGIN, np.sqrt(SAMPLES / stats.chi2.ppf(below, SAMPLES)))

    p = np.concatenate([np.linspace(0.5, 4.5, 4001), [np.nan, np.inf]])
    got = margin(p)
    assert np.allclose(got, formula(p), rtol=1e-9, equal_nan=True) and np.isnan(got[-2])
    assert formula(np.linspace(bound_samples.INDEPENDENT, SAMPLES, 1001)).max() == SAMPLE_MARGIN
    assert math.isclose(float(margin(1.0)), formula(1.0), rel_tol=1e-9)  # (a scalar)
    quantiles = []
    quantile = bound_samples._chi2_4_quantile
    monkeypatch.setattr(bound_samples, "_chi2_4_quantile", lambda q: quantiles.append(np.size(q)) or quantile(q))
    mostly_independent = np.concatenate([np.full(1000, 3.9), [1.0, 2.0, 3.0]])
    assert np.allclose(margin(mostly_independent), formula(mostly_independent), rtol=1e-9)
    assert quantiles == [3]


@pytest.mark.parametrize("draws", [1, 2, 3, 4, "shared and own"])
def test_the_margin_for_few_draws_cuts_below_sigmas_at_most_at_its_probability(draws):
    """Blocks whose elements carry `draws` independent draws (a row value's deviation shared by ~256 / draws
    elements, times a factor; or one shared draw with 97% of the variance, the rest each element's own), equally
    loose. The tightest element is cut below SIGMAS sigma only where every draw's RMS is below 1 / M of its sigma:
    numpy's chi-square draws (not the calibration's) put that at most at CUT_BELOW for M = margin(draws) (k draws
    show a participation ratio of at most k), exactly there for one draw. calibrate cuts such blocks below SIGMAS
    sigma no more often, and blocks of two or more draws by less than one draw's margin (it cut them all at four
    draws' 6.6: a two-draw block's bound stayed ~7.3x SIGMAS sigma, ~5.5x now)."""
    rng = np.random.default_rng(3)
    one_draw = math.sqrt(SAMPLES / stats.chi2.ppf(CUT_BELOW, SAMPLES))     # (6.64)
    if draws != "shared and own":
        trials = 10**6
        m = margin(float(draws))
        all_small = np.all(rng.chisquare(SAMPLES, (draws, trials)) < SAMPLES / m**2, axis=0).mean()
        assert all_small <= CUT_BELOW + 4 * math.sqrt(CUT_BELOW / trials)
        assert draws > 1 or all_small > CUT_BELOW - 4 * math.sqrt(CUT_BELOW / trials)
        assert draws == 1 or m < one_draw
    blocks = 8000
    x = rng.uniform(0.5, 2, (blocks, CALIBRATION_BLOCK))
    if draws == "shared and own":
        own = rng.standard_normal((SAMPLES, blocks, CALIBRATION_BLOCK))
        deviations = math.sqrt(0.97) * rng.standard_normal((SAMPLES, blocks, 1)) + math.sqrt(0.03) * own
    else:
        shared = rng.standard_normal((SAMPLES, blocks, draws))
        deviations = shared[..., np.arange(CALIBRATION_BLOCK) * draws // CALIBRATION_BLOCK]
    bound = 10 * SIGMAS * x                                     # 10x SIGMAS sigma: loose enough to be cut
    looseness = calibrate(bound, (deviations * x).astype(np.float32)) / (SIGMAS * x)
    below = np.mean(looseness.min(axis=1) < 1)
    assert below <= CUT_BELOW + 4 * math.sqrt(CUT_BELOW / blocks)
    assert np.median(looseness) < (one_draw if draws not in (1, "shared and own") else 10)


@pytest.mark.parametrize("profile", ["scalar", "3 log-ramp", "8 sharing a draw", "32 one tight"])
def test_a_small_values_elements_are_cut_below_sigmas_at_most_at_one_draws_probability(profile):
    """Values of fewer than MEASURED_FROM elements (each at the start of its own block, the rest of the block not
    judged: infinite bounds), numpy's Gaussian deviations of sigma 1, bounds SIGMAS x their looseness: a scalar; 3
    elements 1x / 10x / 100x as loose as the tightest (the margin in P cut it below SIGMAS sigma in 0.42% of them);
    8 sharing a draw with 97% of the variance (0.19%); 32 of which one is 10x tighter. Each is cut (main kept them
    whole): under POOLED_FROM elements at one draw's margin, from there as below; its tightest element is below
    SIGMAS sigma at most at CUT_BELOW."""
    rng = np.random.default_rng(13)
    n, values = int(profile.split()[0]) if profile != "scalar" else 1, 8000
    looseness = np.full((values, CALIBRATION_BLOCK), np.inf)
    deviations = rng.standard_normal((SAMPLES, values, CALIBRATION_BLOCK))
    looseness[:, :n] = 10.0
    if profile.endswith("log-ramp"):
        looseness[:, :n] *= np.geomspace(1, 100, n)
    if profile.endswith("one tight"):
        looseness[:, 1:n] *= 10
    if profile.endswith("draw"):
        deviations = math.sqrt(0.97) * rng.standard_normal((SAMPLES, values, 1)) + math.sqrt(0.03) * deviations
    left = calibrate(SIGMAS * looseness, deviations.astype(np.float32)) / SIGMAS          # per sigma
    below = np.mean(left[:, 0] < 1)
    assert below <= CUT_BELOW + 4 * math.sqrt(CUT_BELOW / values), below
    assert np.median(left[:, 0]) < 9 and np.all(np.isinf(left[:, n:]))     # (cut: 10x SIGMAS sigma before)


@pytest.mark.parametrize("looser", [4.0, 6.0, 10.0])
def test_a_lone_tight_element_is_cut_below_sigmas_at_most_at_its_probability(looser):
    """Blocks of independent Gaussian deviations (numpy's) whose first element's bound is SIGMAS x 10 sigma and the
    others' `looser` times that. Where the tight element's four draws happen small it falls out of the elements
    near the block's largest ratio (or is one of many there): the block is cut at the margin of many independent
    draws (2), below SIGMAS sigma for the tight one in 4-9% of blocks. Its bound is below a third of the block's
    third smallest (lone): it is cut by its own samples alone no further, below SIGMAS sigma at most at CUT_BELOW; the
    others' bounds are the block's cut, as before (one factor per block)."""
    rng = np.random.default_rng(5)
    blocks = 8000
    looseness = np.full((blocks, CALIBRATION_BLOCK), 10.0 * looser)
    looseness[:, 0] = 10.0
    deviations = rng.standard_normal((SAMPLES, blocks, CALIBRATION_BLOCK)).astype(np.float32)
    left = calibrate(SIGMAS * looseness, deviations) / SIGMAS          # per sigma
    below = np.mean(left[:, 0] < 1)
    assert below <= CUT_BELOW + 4 * math.sqrt(CUT_BELOW / blocks), below
    factor = left[:, 1:] / looseness[:, 1:]                          # (the others: one factor per block)
    np.testing.assert_allclose(factor, factor[:, :1] * np.ones_like(factor), rtol=1e-6)
    assert np.mean(factor[:, 0] < 1) > 0.9 and np.median(left[:, 0]) < 7   # (cut; the tight one ~6 sigma)


def test_block_ratios_counts_and_tail(passes):
    bound = np.ones(2 * CALIBRATION_BLOCK + 3)
    deviations = np.zeros((4, bound.size), np.float32)
    deviations[:, -1] = 2.0                          # 4 x 4 / 1 in the last (3-element) block
    largest, total, counted, seen, unjudged = block_ratios(deviations, bound, CALIBRATION_BLOCK)
    assert list(counted) == [CALIBRATION_BLOCK, CALIBRATION_BLOCK, 3] and seen == bound.size and not unjudged
    assert list(largest) == [0, 0, 16.0] and list(total) == [0, 0, 16.0]
    out = np.empty(bound.size)
    scale_blocks(bound, np.array([1.0, 2.0, 3.0]), CALIBRATION_BLOCK, out)
    assert out[0] == 1 and out[CALIBRATION_BLOCK] == 2 and out[-1] == 3


@pytest.mark.parametrize("rounding", [False, True])
def test_add_noise_is_the_numpy_rule(rounding, passes):
    """add_noise adds each sample's draw (kernels/normal_draws' under the key: normal, or where the own error is
    one `rounding`, uniform: the elementwise pass's for an element) times float32(own / SIGMAS)."""
    rng = np.random.default_rng(3)
    samples = rng.standard_normal((4, 1000)).astype(np.float32)
    key = np.uint64(0xDEADBEEF12345678)
    noise = np.empty((4, 1000), np.float32)
    (rounding_draws if rounding else standard_normals)(key, 0, np.empty(0, np.int64), noise)
    own = np.abs(rng.standard_normal(1000)) * 10.0 ** rng.integers(-40, 5, 1000)
    own[:10] = [0, np.inf, np.nan, 1e-320, 0, 0, 1, 2, 3, 4]
    with np.errstate(all="ignore"):
        want = samples + noise * (own / SIGMAS).astype(np.float32)
        add_noise(samples, key, own, SIGMAS, rounding)
    np.testing.assert_array_equal(samples, want)
    assert math.isnan(samples[0, 1]) or math.isinf(samples[0, 1])


class _Dot:
    """A dot's dimension numbers, as an instruction's attributes."""

    def __init__(self, **dims):
        self.dims = dims

    def attr(self, name, default=None):
        return self.dims.get(name, default)


@pytest.mark.parametrize("dims, lhs, rhs", [
    (dict(lhs_contracting_dims=(1,), rhs_contracting_dims=(0,)), (5, 7), (7, 3)),
    (dict(lhs_contracting_dims=(0,), rhs_contracting_dims=(1,)), (7, 5), (3, 7)),
    (dict(lhs_batch_dims=(0,), rhs_batch_dims=(0,), lhs_contracting_dims=(2,), rhs_contracting_dims=(1,)),
     (2, 5, 7), (2, 7, 3)),
    (dict(lhs_batch_dims=(2, 0), rhs_batch_dims=(0, 3), lhs_contracting_dims=(1, 3), rhs_contracting_dims=(2, 1)),
     (2, 4, 3, 6), (3, 6, 4, 2)),
    (dict(lhs_contracting_dims=(0,), rhs_contracting_dims=(0,)), (7,), (7, 4)),
])
def test_a_dots_shared_part_is_the_dot_with_the_least_bound(dims, lhs, rhs):
    """along_contraction's sums and least bounds, as the dot rule combines them (|sums_a[b, m]| least_b[b, n] in the
    output's (batch, lhs free, rhs free) order), against the dot itself of the values with the other side's bound
    at its smallest along the contraction, broadcast back (an einsum here)."""
    from hloexec.tools.bound_shared import along_contraction
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(lhs), rng.standard_normal(rhs)
    ea, eb = np.abs(rng.standard_normal(lhs)), np.abs(rng.standard_normal(rhs))
    inst = _Dot(**dims)
    la, lb = list(range(len(lhs))), list(range(10, 10 + len(rhs)))
    for k, (i, j) in enumerate(zip(dims.get("lhs_batch_dims", ()), dims.get("rhs_batch_dims", ()))):
        lb[j] = la[i] = 20 + k
    for i, j in zip(dims["lhs_contracting_dims"], dims["rhs_contracting_dims"]):
        lb[j] = la[i]
    batch = [la[i] for i in dims.get("lhs_batch_dims", ())]
    out = batch + [la[i] for i in range(len(lhs)) if la[i] not in lb] + [lb[j] for j in range(len(rhs))
                                                                        if lb[j] not in la]
    least = lambda e, c: np.broadcast_to(np.min(e, axis=c, keepdims=True), e.shape)  # noqa: E731
    want_b = np.abs(np.einsum(a, la, least(eb, dims["rhs_contracting_dims"]), lb, out))
    want_a = np.abs(np.einsum(least(ea, dims["lhs_contracting_dims"]), la, b, lb, out))
    sums_a, sums_b = along_contraction(a, inst, "lhs", np.sum), along_contraction(b, inst, "rhs", np.sum)
    least_a, least_b = along_contraction(ea, inst, "lhs", np.min), along_contraction(eb, inst, "rhs", np.min)
    got_b = np.abs(sums_a)[:, :, None] * least_b[:, None, :]
    got_a = least_a[:, :, None] * np.abs(sums_b)[:, None, :]
    np.testing.assert_allclose(got_b.reshape(want_b.shape), want_b, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(got_a.reshape(want_a.shape), want_a, rtol=1e-12, atol=1e-13)


def _numpy_variance(opcode, x, a, b, ea, eb, same):
    """The bound before the rounding, squared, in numpy: first order (its bound times its places; a multiply's
    other magnitude times it, (2|a| + e) e for x * x, plus (e_a e_b)^2); a divide's from the quotients at the ends
    of each operand's interval (max |f(end) - x|, NaN -> inf) and at the four corners beyond them (tools/bounds.py
    `_evaluated`), with the divisor's interval holding 0 deciding the element."""
    decided = np.zeros(x.shape, bool)
    if opcode != "divide":
        multiply, want = opcode == "multiply", np.zeros(x.shape)
        if ea is not None:
            want = want + np.square((2 * np.abs(a) + ea) * ea if multiply and same else np.abs(b) * ea if multiply
                                    else (2 if same else 1) * ea)
        if eb is not None:
            want = want + np.square(np.abs(a) * eb if multiply else eb)
        if multiply and ea is not None and eb is not None:
            want = want + np.square(ea * eb)
        return want, decided
    ends = lambda up, down: np.where(np.isnan(d := np.maximum(np.abs(up - x), np.abs(down - x))), np.inf, d)  # noqa
    want, moved = np.zeros(x.shape), []
    if ea is not None:
        moved.append(ends((a + ea) / (a + ea), (a - ea) / (a - ea)) if same else ends((a + ea) / b, (a - ea) / b))
        decided |= (np.abs(a) <= ea) & (ea > 0) if same else False
    if eb is not None:
        moved.append(ends(a / (b + eb), a / (b - eb)))
        decided |= (np.abs(b) <= eb) & (eb > 0)
    for m in moved:
        want = want + np.square(m)
    if len(moved) == 2:
        worst = np.zeros(x.shape)
        for sa in (1, -1):
            for sb in (1, -1):
                worst = np.maximum(worst, np.abs((a + sa * ea) / (b + sb * eb) - x))
        excess = worst - moved[0] - moved[1]
        want = want + np.square(np.where(np.isnan(excess), np.inf, np.maximum(excess, 0.0)))
    return want, decided


def _numpy_deviations(opcode, x, a, b, da, db):
    """The samples' deviations in numpy float32: the linear ops on the operands' (0 for none), a multiply's
    (a + da)(b + db) - ab = da (b + db) + a db, a divide's (a + da) / (b + db) - a / b = (da - x db) / (b + db)."""
    zero = np.float32(0)
    pa, pb = (zero if d is None else d for d in (da, db))
    a32, b32, x32 = (np.asarray(v, np.float32) for v in (a, b, x))
    if opcode == "add":
        return pa + pb
    if opcode == "subtract":
        return pa - pb
    if opcode in ("negate", "convert"):
        return -pa if opcode == "negate" else +pa
    if opcode == "multiply":
        return (0 if da is None else da * (b32 + pb)) + (0 if db is None else a32 * db)
    if db is None:
        return zero if da is None else da / b32
    return (pa - x32 * db) / (b32 + db)


def _elementwise_case(opcode, which, keyed, n):
    """elementwise_pass' inputs on random data with infinities, NaN, zeros and subnormals (half of it ordinary,
    enough to calibrate), as a dict of its arguments by name, the operands' bounds and deviations None where
    `which` says they have none, and empty outputs."""
    from hloexec.tools.bound_elementwise import rounding_rule
    from hloexec.ir.dtypes import ELEMENT_TYPES
    unary = opcode in ("negate", "convert")
    rng = np.random.default_rng(abs(hash((opcode, which, keyed, n))) % 2**32)
    a = _awkward(rng, n, ml_dtypes.bfloat16)
    b = a if which == "same" or unary else _awkward(rng, n, ml_dtypes.bfloat16)
    a[: n // 2] = rng.standard_normal(n // 2)                        # enough ordinary elements to calibrate
    b[: n // 2] = a[: n // 2] if b is a else rng.standard_normal(n // 2)
    with np.errstate(all="ignore"):
        x = {"add": a + b, "subtract": a - b, "negate": -a, "convert": a, "multiply": a * b, "divide": a / b}[opcode]
        errs = [np.abs(_awkward(rng, n, np.float32)).astype(np.float32) * 1e-3 for _ in range(2)]
    errs[0][rng.random(n) < 0.2] = 0.0
    with np.errstate(over="ignore"):
        devs = [_awkward(rng, 4 * n, ml_dtypes.bfloat16).reshape(4, n).astype(ml_dtypes.bfloat16) for _ in range(2)]
    for d in devs:  # (the first half ordinary: enough to calibrate)
        d[:, : n // 2] = rng.standard_normal((4, n // 2)) * 1e-3
    da = devs[0] if which in ("both", "a", "same") else None
    # exact operands where both bounds are 0: no own error there (x is a bfloat16 value), the deviations' sums kept
    # as they are, ties among them
    exact = rng.random(n) < 0.3
    errs[0][exact], errs[1][exact] = 0.0, 0.0
    x = np.where(exact, np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float64), x)
    return dict(
        x=x, a=a, b=b, ea=errs[0] if which in ("both", "a", "same") else None,
        eb=errs[1] if which in ("both", "b") and not unary else None, da=da,
        db=da if which == "same" else devs[1] if which in ("both", "b") and not unary else None,
        rule=rounding_rule(ELEMENT_TYPES["bf16"], opcode), key=rng.integers(0, 2**64, dtype=np.uint64),
        keys=np.where(rng.random(n) < 0.3, -1, rng.integers(0, 40, n)) if keyed else np.empty(0, np.int64),
        bound=np.empty(n, np.float32), samples=np.empty((4, n), np.uint16), decided=np.zeros(n, bool))


def _elementwise_pass(opcode, which, c):
    """kernels/bound_rules.elementwise_pass on a `_elementwise_case` (its draws under the case's key)."""
    from hloexec.kernels.bound_rules import elementwise_pass
    from hloexec.tools.bound_elementwise import FUSED
    unary = opcode in ("negate", "convert")
    none = np.empty(0, np.float32)
    rows = lambda d: np.empty((4, 0), np.uint16) if d is None else d.view(np.uint16)  # noqa: E731
    with np.errstate(all="ignore"):
        return elementwise_pass(
            FUSED[opcode], which == "same" and not unary, opcode != "negate", c["x"], c["a"], c["b"],
            none if c["ea"] is None else c["ea"], none if c["eb"] is None else c["eb"], rows(c["da"]),
            rows(None if unary else c["db"]), c["rule"], (c["key"], c["keys"], float(SIGMAS)),
            c["bound"], c["samples"], c["decided"], CALIBRATION_BLOCK)


@pytest.mark.parametrize("opcode", ["add", "subtract", "negate", "convert", "multiply", "divide"])
@pytest.mark.parametrize("which", ["both", "a", "b", "none", "same"])
@pytest.mark.parametrize("keyed", [False, True])
def test_elementwise_pass_is_the_numpy_rules(opcode, which, keyed, passes):
    """kernels/bound_rules.elementwise_pass (an elementwise op's bound, rounding, samples with their own-error
    draws, and calibration's statistics in one pass) against numpy forms of each rule on data with infinities,
    NaN, zeros and subnormals: the bound before the rounding (`_numpy_variance`), the rounding (`_numpy_round`),
    the deviations plus each draw (kernels/normal_draws' rounding draws, under the instruction's key) times
    float32(own / SIGMAS) (a group's one draw where keyed), the calibration
    it feeds (`_numpy_calibrate`), a divide's rounding-decided elements."""
    unary = opcode in ("negate", "convert")
    if unary and which in ("b", "same"):
        pytest.skip("one operand")
    n = 3 * CALIBRATION_BLOCK + 17                                  # a shorter last block
    c = _elementwise_case(opcode, which, keyed, n)
    x, a, b, ea, eb, da, db, key, keys = (c[k] for k in ("x", "a", "b", "ea", "eb", "da", "db", "key", "keys"))
    bound, samples, decided = c["bound"], c["samples"], c["decided"]
    any_own, *stats = _elementwise_pass(opcode, which, c)
    rounds = opcode != "negate"
    with np.errstate(all="ignore"):
        variance, want_decided = _numpy_variance(opcode, x, a, b, None if ea is None else ea.astype(np.float64),
                                                 None if eb is None else eb.astype(np.float64), which == "same")
        if rounds:
            want_bound, own = _numpy_round(x, variance, None, ml_dtypes.bfloat16, "elementwise")
        else:
            want_bound, own = np.sqrt(variance), np.zeros(n)
        draws = np.empty((4, n), np.float32)  # (one rounding's uniform draws: tests/test_normal_draws.py)
        rounding_draws(key, 0, keys, draws)
        da, db = (None if d is None else d.astype(np.float32) for d in (da, None if unary else db))
        want_samples = _numpy_deviations(opcode, x, a, b, da, db) + draws * (own / SIGMAS).astype(np.float32)
        want_samples = np.broadcast_to(np.asarray(want_samples, np.float32), (4, n))
        stored = want_samples.astype(ml_dtypes.bfloat16)  # (stored rounded to nearest even, as ml_dtypes casts)
    if opcode in ("add", "subtract") and which == "both":  # (sums of bfloat16 values: halfway cases stored too)
        assert np.count_nonzero(want_samples.view(np.uint32) & 0xFFFF == 0x8000) > 10
    np.testing.assert_array_equal(bound, want_bound.astype(np.float32))
    np.testing.assert_array_equal(samples.view(ml_dtypes.bfloat16).astype(np.float32), stored.astype(np.float32))
    assert any_own == bool(np.any(own))
    if opcode == "divide":
        np.testing.assert_array_equal(decided, want_decided)
    with np.errstate(all="ignore"):
        # (calibration reads the float32 deviations, before their rounding to bfloat16)
        np.testing.assert_allclose(calibrate(bound, samples, stats=stats), _numpy_calibrate(bound, want_samples),
                                   rtol=1e-6)


def test_block_ratios_totals_are_the_exact_sums_rounded(passes):
    """Each block's total (summed in eight lanes, kernels/bound_rules._lane_sum) is the exact sum of its ratios
    (math.fsum of the float64 sums of squares over the bound squared) within a few float64 roundings, blocks of
    every length mod 8 (a shorter last block, blocks of 1 to 9 elements)."""
    rng = np.random.default_rng(5)
    for block, n in ((CALIBRATION_BLOCK, 40 * CALIBRATION_BLOCK + 13), (9, 1000), (1, 50), (7, 31)):
        deviations = rng.standard_normal((4, n)).astype(np.float32) * np.float32(10.0) ** rng.integers(-3, 4, n)
        bound = np.abs(rng.standard_normal(n)).astype(np.float32) + np.float32(0.1)
        _, total, counted, seen, _ = block_ratios(deviations, bound, block)
        squares = np.zeros(n)
        for row in deviations.astype(np.float64):  # (in sample order, as the pass adds them)
            squares += row * row
        ratios = squares.astype(np.float64) / np.square(bound.astype(np.float64))
        exact = [math.fsum(ratios[j : j + block]) for j in range(0, n, block)]
        np.testing.assert_allclose(total, exact, rtol=8 * 2.0**-52, atol=0)
        assert list(counted) == [min(block, n - j) for j in range(0, n, block)] and seen == n


def test_elementwise_pass_refuses_a_rule_it_does_not_compute():
    """The pass rounds by an arithmetic op's rule only (its loop leaves the wider type's ulps and the
    reduce-precision floor out): a transcendental's rule is an error, not a smaller bound."""
    from hloexec.ir.dtypes import ELEMENT_TYPES
    from hloexec.tools.bound_elementwise import FUSED, rounding_rule

    n = 8
    x = np.ones(n, np.float32)
    rows = np.empty((4, 0), np.uint16)
    with pytest.raises(ValueError, match="arithmetic op"):
        bound_rules.elementwise_pass(FUSED["multiply"], False, True, x, x, x, x, x, rows, rows,
                                     rounding_rule(ELEMENT_TYPES["bf16"], "tanh"), (np.uint64(1), np.empty(0, np.int64),
                                     float(SIGMAS)), np.empty(n, np.float32), np.empty((4, 0), np.uint16),
                                     np.zeros(n, bool), CALIBRATION_BLOCK)  # fmt: skip


@pytest.mark.parametrize("opcode, which, keyed", [("add", "both", True), ("subtract", "b", True),
                                                  ("multiply", "both", False), ("divide", "both", False),
                                                  ("divide", "same", False), ("convert", "a", False)])
def test_a_split_elementwise_pass_is_one_pass_bit_for_bit(monkeypatch, opcode, which, keyed):
    """elementwise_pass split into spans taken by two threads (kernels/bound_rules.over_cores) against one pass
    on one thread: every bound, sample, rounding-decided mark and block statistic the same bits (keyed draws,
    divides' decided elements, spans of whole calibration blocks and a shorter last block)."""
    n = 40 * CALIBRATION_BLOCK + 17
    one = _elementwise_case(opcode, which, keyed, n)
    whole = _elementwise_pass(opcode, which, one)
    monkeypatch.setattr(bound_rules, "SPLIT_FROM", 0)
    monkeypatch.setattr(bound_rules, "SPAN", 3 * CALIBRATION_BLOCK)
    monkeypatch.setenv("HLOEXEC_NUM_THREADS", "2")
    split = _elementwise_case(opcode, which, keyed, n)
    spans = _elementwise_pass(opcode, which, split)
    for k in ("bound", "samples", "decided"):
        assert one[k].tobytes() == split[k].tobytes(), k
    assert [np.asarray(v).tobytes() for v in whole] == [np.asarray(v).tobytes() for v in spans]
    assert 0 < np.count_nonzero(np.isfinite(one["bound"])) < n and (opcode != "divide" or one["decided"].any())


@pytest.mark.parametrize("multiply", [False, True])
@pytest.mark.parametrize("case", ["both", "a", "b", "same", "unary"])
def test_first_order_variance_is_the_numpy_rule(multiply, case):
    """Per operand with errors, what it moves the value by, squared and added in operand order (a multiply: the
    other's magnitude times the bound, (2|a| + e) e for x * x, plus (e_a e_b)^2), against numpy."""
    from hloexec.kernels.bound_rules import first_order_variance
    rng = np.random.default_rng(9)
    n = 5000
    a, b = _awkward(rng, n, np.float32), _awkward(rng, n, np.float32)
    ea = np.abs(_awkward(rng, n, np.float32)).astype(np.float32)
    eb = np.abs(_awkward(rng, n, np.float64))
    if case in ("same", "unary"):
        b = a
    with np.errstate(all="ignore"):
        want = np.zeros(n)
        if case in ("both", "a", "same", "unary"):
            e = ea.astype(np.float64)
            places = 2 if case == "same" else 1
            if not multiply:
                want = want + np.square(places * e)
            else:
                want = want + np.square((2 * np.abs(a) + e) * e if case == "same" else np.abs(b) * e)
        if case in ("both", "b"):
            want = want + np.square(np.abs(a) * eb if multiply else eb)
        if multiply and case == "both":
            want = want + np.square(ea.astype(np.float64) * eb)
        got = np.empty(n)
        first_order_variance(multiply, case == "same", a, b, ea if case != "b" else np.empty(0),
                             eb if case in ("both", "b") else np.empty(0), got)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("side", [0, 1])
@pytest.mark.parametrize("dims, lhs, rhs", [
    (dict(lhs_contracting_dims=(1,), rhs_contracting_dims=(0,)), (5, 7), (7, 3)),
    (dict(lhs_batch_dims=(2, 0), rhs_batch_dims=(0, 3), lhs_contracting_dims=(1, 3), rhs_contracting_dims=(2, 1)),
     (2, 4, 3, 6), (3, 6, 4, 2)),
    (dict(lhs_batch_dims=(0,), rhs_batch_dims=(0,), lhs_contracting_dims=(2,), rhs_contracting_dims=(1,)),
     (2, 5, 7), (2, 7, 3)),
])
def test_dot_samples_are_the_perturbed_dots(side, dims, lhs, rhs):
    """A dot with one operand's samples: each sample's deviation against the perturbed run's
    dot(a + da, b) - dot(a, b) in f64 (float32 deviations: equal to float32's precision)."""
    from hloexec.ops.contraction import dot_general
    from hloexec.tools.bound_samples import dot_samples
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(lhs), rng.standard_normal(rhs)
    d = (rng.standard_normal((4, *(lhs if side == 0 else rhs))) * 1e-3).astype(np.float32)
    inst = _Dot(**dims)
    lb, rb, lc, rc = (list(dims.get(k, ())) for k in ("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims",
                                                      "rhs_contracting_dims"))
    f64 = np.dtype(np.float64)
    x = dot_general(a, b, lb, rb, lc, rc, f64)
    want = np.stack([dot_general(a + d[k], b, lb, rb, lc, rc, f64) if side == 0 else
                     dot_general(a, b + d[k], lb, rb, lc, rc, f64) for k in range(4)]) - x
    out = dot_samples(inst, [a, b], [d, None] if side == 0 else [None, d])
    assert out.flags.c_contiguous and out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("dtype, other", [(np.float16, np.float16), (ml_dtypes.bfloat16, np.float32),
                                          (np.float64, np.float64)])
def test_rounding_groups_are_the_numpy_rule(dtype, other, passes):
    """kernels/bound_rules.rounding_groups (tools/bound_samples.shared_rounding's groups) against numpy: where the
    other operand's ulp in its type is at least x's, the group (BINADE_OFFSET + binade) * count + source (binade:
    the exponent of x's ulp), else -1; on data with infinities, NaN, zeros and subnormals."""
    from hloexec.kernels.bound_rules import BINADE_OFFSET, rounding_groups
    rng = np.random.default_rng(2)
    n, count = 4000, 37
    x, o = _awkward(rng, n, dtype), _awkward(rng, n, other)
    source = rng.integers(0, count, n)
    binade = np.frexp(_ulp(x, dtype))[1]
    coarse = _ulp(o, other) >= _ulp(x, dtype)
    want = np.where(coarse, (BINADE_OFFSET + binade) * count + source, -1)
    assert want[coarse].min() >= 0
    got = np.empty(n, np.int64)
    info, other_info = ml_dtypes.finfo(dtype), ml_dtypes.finfo(other)
    result = rounding_groups(x, o, source, count, int(info.nmant), float(info.tiny), int(other_info.nmant),
                             float(other_info.tiny), got)
    np.testing.assert_array_equal(got, want)
    assert result == bool(coarse.any())
    assert 0 < np.count_nonzero(coarse) < n



def _all_magnitudes(rng, n: int) -> np.ndarray:
    """float64 values from far below float32's subnormals to beyond its range, both signs, with exact ties of the
    subnormal grid, float32's edges, zeros, infinities and NaN."""
    spread = rng.standard_normal(n) * 2.0 ** rng.integers(-160, 140, n).astype(np.float64)
    ties = (rng.integers(0, 2**23, n // 10) + 0.5) * 2.0**-149
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-126, 2.0**-126 * (1 - 2**-30), 2.0**-149, 2.0**-150,
             2.0**-150 * (1 + 2**-40), 3 * 2.0**-151, float(np.finfo(np.float32).max) * (1 + 2**-30)]  # fmt: skip
    return np.concatenate([spread, ties, -ties, edges])


def test_f64_to_f32_is_numpys_cast():
    """kernels/half.f64_to_f32 (the subnormal results made from their bits) is numpy's float64 -> float32 cast bit
    for bit, on every magnitude."""
    from numba import njit

    from hloexec.kernels.half import f64_to_f32

    @njit
    def cast(x, out):
        for i in range(x.size):
            out[i] = f64_to_f32(x[i])

    x = _all_magnitudes(np.random.default_rng(11), 200_000)
    out = np.empty(x.size, np.float32)
    cast(x, out)
    with np.errstate(over="ignore"):
        assert np.array_equal(out.view(np.uint32), x.astype(np.float32).view(np.uint32))


def test_scale_blocks_float32_is_numpys_product(passes):
    """A float32 bound scaled per block (blocks with products below float32's normals made by f64_to_f32) is numpy's
    float32 product bit for bit, with infinities, NaN, zeros and subnormals among the bounds and factors."""
    rng = np.random.default_rng(12)
    blocks = 64
    bound = _all_magnitudes(rng, blocks * CALIBRATION_BLOCK)[: blocks * CALIBRATION_BLOCK]
    bound = np.abs(rng.permutation(bound)).astype(np.float32)
    bound[: 8 * CALIBRATION_BLOCK] *= np.float32(2.0**-120)  # (whole blocks of tiny bounds)
    factor = rng.random(blocks).astype(np.float32)
    factor[:3] = [0.0, 1.0, 2.0**-20]
    factor[-1] = np.nan
    out = np.empty_like(bound)
    scale_blocks(bound, factor, CALIBRATION_BLOCK, out)
    with np.errstate(invalid="ignore"):
        expected = (bound.reshape(blocks, -1) * factor[:, None]).reshape(-1)
    assert np.array_equal(out.view(np.uint32), expected.view(np.uint32))
    assert np.count_nonzero((expected > 0) & (expected < 2.0**-126)) > 1000  # (the subnormal path taken)


def _tiny_beside_ordinary(rng, n):
    """(deviations (4, n) bfloat16, bounds float32): ordinary elements (bound 1, samples ~1e-3: loose) and, in the
    first block, elements whose samples and bounds are tiny (1e-25 to 1e-38: a softmax's tiny probabilities) and
    tight, ratio ~1 to 100."""
    deviations = (rng.standard_normal((4, n)) * 1e-3).astype(ml_dtypes.bfloat16)
    bound = np.ones(n, np.float32)
    tiny = rng.choice(CALIBRATION_BLOCK, 24, replace=False)
    scale = 10.0 ** rng.uniform(-38, -25, tiny.size)
    deviations[:, tiny] = (rng.standard_normal((4, tiny.size)) * scale).astype(ml_dtypes.bfloat16)
    bound[tiny] = (scale * rng.uniform(0.1, 1, tiny.size)).astype(np.float32)
    return deviations, bound, tiny


def _select(d, e):
    """select_pass choosing its true branch everywhere, values 0, the branch's bound `e`, deviations `d`."""
    from hloexec.kernels.bound_generic import select_pass

    n, none = e.size, np.empty(0)
    zeros, bits = np.zeros(n), np.empty((4, n), np.uint16)
    return select_pass(np.ones(n, bool), zeros, zeros, zeros, e, none, (none, none, none), np.empty((4, 0), bool),
                       d.view(np.uint16), np.empty((4, 0), np.uint16), np.empty(n, np.float32), np.empty(n, bool),
                       bits, CALIBRATION_BLOCK)  # fmt: skip


def _unary(d, e):
    """unary_pass of the identity on 0, its operand's bound `e` and deviations `d`, no rounding of its own."""
    from hloexec.kernels.bound_generic import unary_pass
    from hloexec.tools.bound_elementwise import rounding_rule
    from hloexec.ir.dtypes import ELEMENT_TYPES

    n = e.size
    return unary_pass(lambda rows, lo, hi: rows, (False, False, False), np.zeros(n), np.zeros(n), e,
                      d.view(np.uint16), rounding_rule(ELEMENT_TYPES["f32"], "negate"), (np.uint64(1), float(SIGMAS)),
                      np.empty(n, np.float32), np.empty((4, n), np.uint16), np.empty(n, bool), CALIBRATION_BLOCK)[1:]  # fmt: skip


def _negate(d, e):
    """elementwise_pass of a negate of 0, its operand's bound `e` and deviations `d` (no rounding of its own)."""
    from hloexec.ir.dtypes import ELEMENT_TYPES
    from hloexec.kernels.bound_rules import elementwise_pass
    from hloexec.tools.bound_elementwise import FUSED, rounding_rule

    n, none = e.size, np.empty(0, np.float32)
    return elementwise_pass(FUSED["negate"], False, False, np.zeros(n), np.zeros(n), np.zeros(n), e, none,
                            d.view(np.uint16), np.empty((4, 0), np.uint16), rounding_rule(ELEMENT_TYPES["f32"], "negate"),
                            (np.uint64(1), np.empty(0, np.int64), float(SIGMAS)), np.empty(n, np.float32),
                            np.empty((4, n), np.uint16), np.empty(n, bool), CALIBRATION_BLOCK)[1:]  # fmt: skip


def _finish(d, e):
    """bound_products.finish_samples of products `d` (float32) less 0, no own error."""
    from hloexec.kernels.bound_products import finish_samples

    n = e.size
    moved = d.astype(np.float32)
    return finish_samples(moved, np.zeros(n), np.empty(0), np.uint64(1), SIGMAS, e, CALIBRATION_BLOCK,
                          np.empty((4, n), np.uint16))  # fmt: skip


TALLIES = {
    "block_ratios": lambda d, e: block_ratios(d.astype(np.float32), e, CALIBRATION_BLOCK),
    "elementwise_pass": _negate,
    "unary_pass": _unary,
    "select_pass": _select,
    "finish_samples": _finish,
}


@pytest.mark.parametrize("kernel", sorted(TALLIES))
def test_tiny_elements_ratios_are_their_samples_squares_over_their_bounds(kernel, passes):
    """Every pass that tallies calibration's block statistics: a tiny element's ratio (sum of its samples' squares
    over its bound squared) is the exact one (float64 squares of the float32 deviations, as written), its block's
    largest, and calibration keeps its bound (its samples reach it) where it cuts the loose ordinary elements' of
    the other blocks. On main the squares were float32: deviations below ~1e-19 squared to 0 (or subnormals), the
    tiny elements showed ratio 0 and were cut by the ordinary elements' factor, ~100x below their samples."""
    rng = np.random.default_rng(3)
    n = 3 * CALIBRATION_BLOCK + 5
    deviations, bound, tiny = _tiny_beside_ordinary(rng, n)
    with np.errstate(all="ignore"):
        largest, total, counted, seen, unjudged = TALLIES[kernel](deviations, bound)
    d = deviations.astype(np.float64)
    ratio = (d * d).sum(axis=0) / np.square(bound.astype(np.float64))
    assert ratio[tiny].max() > 1 and ratio[tiny].max() == ratio[:CALIBRATION_BLOCK].max()  # (the premise)
    want = [ratio[j : j + CALIBRATION_BLOCK] for j in range(0, n, CALIBRATION_BLOCK)]
    np.testing.assert_allclose(largest, [r.max() for r in want], rtol=1e-15)
    np.testing.assert_allclose(total, [math.fsum(r) for r in want], rtol=1e-13)
    assert list(counted) == [r.size for r in want] and seen == n and not unjudged
    calibrated = calibrate(bound, deviations.astype(np.float32), stats=(largest, total, counted, seen, unjudged))
    assert np.array_equal(calibrated[:CALIBRATION_BLOCK], bound[:CALIBRATION_BLOCK])
    assert np.all(calibrated[CALIBRATION_BLOCK : 3 * CALIBRATION_BLOCK] < 0.1)  # (the last 5: too few to cut)
