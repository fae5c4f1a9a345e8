"""The dot rule's float32 arithmetic (hloexec/kernels/bound_products.py, tools/bound_dots.py) against forms written
here from the rules' documentation: its products of non-negative terms never below the exact dots (longdouble
einsums) on data with infinities, NaN, zeros, subnormals and values beyond float32's range, and within their
stated factor of them; the rule's per-element formula against numpy in float64; the samples' float32 products
against the perturbed float64 dots."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
from test_bound_rules import _awkward, _Dot, passes  # noqa: F401 (passes: a fixture, used by dot_passes)

import hloexec
from hloexec.kernels import bound_products
from hloexec.tools import bound_dots
from hloexec.kernels.bound_products import (
    add_unscaled,
    dot_variance,
    finish_samples,
    least_relative,
    perturbed_float32,
    scaled_terms,
    squared_terms,
    unscaling,
)
from hloexec.kernels.bound_rules import add_noise, block_ratios, round_bounds
from hloexec.kernels.half import from_f32
from hloexec.ir.dtypes import element_type
from hloexec.ops.contraction import dot_general
from hloexec.options import device_profile
from hloexec.tools.bound_dots import (
    ESTIMATED_SHARE,
    FLOAT32_TERMS,
    Terms,
    UpperDot,
    dot_bounds,
    float32_noise,
)
from hloexec.tools.bound_elementwise import rounding_rule
from hloexec.tools.bound_samples import CALIBRATION_BLOCK, FLUSHED_BELOW, SIGMAS, perturbed_product

DIMS = [
    (dict(lhs_contracting_dims=(1,), rhs_contracting_dims=(0,)), (6, 300), (300, 5)),
    (dict(lhs_batch_dims=(2, 0), rhs_batch_dims=(0, 3), lhs_contracting_dims=(1, 3), rhs_contracting_dims=(2, 1)),
     (2, 9, 3, 20), (3, 20, 9, 2)),
    (dict(lhs_contracting_dims=(0,), rhs_contracting_dims=(0,)), (1000,), (1000, 4)),
]


@pytest.fixture
def dot_passes(passes, monkeypatch):
    """The dot rule's compiled passes whole, or split into spans of about 100 elements taken by two threads."""
    if passes == "split":
        monkeypatch.setattr(bound_products, "SPAN", 100)
    return passes


_UNIT = np.ones(3)  # (dot_variance's products taken as they are: scale 1)


def _variance(errors, squares, *rest, **keywords):
    """dot_variance of float64 errors (and squares) taken as they are: (the total, whether noise suffices)."""
    total = np.empty(errors.size)
    return total, dot_variance(total, errors, np.empty(0), squares, _UNIT, *rest, **keywords)


def _dims(dims: dict) -> list[list[int]]:
    return [list(dims.get(f"{s}_{d}_dims", ())) for d in ("batch", "contracting") for s in ("lhs", "rhs")]


def _exact(p, q, dims: dict) -> np.ndarray:
    """The dot of |p| and |q| in longdouble (64 significand bits: within K 2^-64 of exact), by einsum."""
    lb, rb, lc, rc = _dims(dims)
    la, lq = list(range(p.ndim)), list(range(10, 10 + q.ndim))
    for k, (i, j) in enumerate(zip(lb, rb)):
        lq[j] = la[i] = 20 + k
    for i, j in zip(lc, rc):
        lq[j] = la[i]
    out = [la[i] for i in lb] + [la[i] for i in range(p.ndim) if la[i] not in lq]
    out += [lq[j] for j in range(q.ndim) if lq[j] not in la]
    with np.errstate(all="ignore"):
        return np.einsum(np.abs(p).astype(np.longdouble), la, np.abs(q).astype(np.longdouble), lq, out)


@pytest.mark.parametrize("square", [True, False])
@pytest.mark.parametrize("data", ["awkward", "wide", "normal"])
@pytest.mark.parametrize("dims, lhs, rhs", DIMS)
def test_float32_products_of_non_negative_terms_are_never_below_the_exact_dot(dims, lhs, rhs, data, square, dot_passes):
    """UpperDot of Terms (|x| or x^2, scaled into float32) against the exact dot of the float64 terms: never
    below it (NaN where it is NaN: inf x 0), and on data in float32's range within 1 + 2 (K + 2) 2^-23 of it (the
    factor 1 + (K + 2) 2^-23 times a float32 dot as far above the exact one as it may be below)."""
    rng = np.random.default_rng(7)
    if data == "awkward":  # infinities, NaN, zeros, subnormals of f32 and of f64, beyond f32's range
        a, b = (_awkward(rng, int(np.prod(s)), np.float32).reshape(s) for s in (lhs, rhs))
    elif data == "wide":  # magnitudes over 2^-300 .. 2^300: the scaled terms' floor raises the smallest
        a, b = (rng.standard_normal(s) * 2.0 ** rng.integers(-300, 300, s) for s in (lhs, rhs))
    else:
        a, b = (rng.standard_normal(s) for s in (lhs, rhs))
    inst = _Dot(**dims)
    contracted = int(np.prod([a.shape[d] for d in dims["lhs_contracting_dims"]]))
    with np.errstate(all="ignore"):
        p, q = (np.square(x) if square else np.abs(x) for x in (a, b))
        exact = _exact(p, q, dims)
        got = UpperDot(inst, contracted).add(np.zeros(exact.shape), Terms(a, square, contracted),
                                             Terms(b, square, contracted), exact.shape)
        made = UpperDot(inst, contracted).add(None, Terms(a, square, contracted), Terms(b, square, contracted),
                                              exact.shape)
    np.testing.assert_array_equal(made, got)  # (a new array: the same bits as added to zeros)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(exact))
    finite = np.isfinite(exact)
    assert np.all(got[~finite & ~np.isnan(exact)] == np.inf)
    assert np.all(got[finite] >= exact[finite]), np.max((exact - got)[finite])
    if data == "normal":
        assert np.all(got <= exact * (1 + (contracted + 2) * 2.0 ** -22)), np.max(got / exact)
        assert np.max(got / exact) > 1  # (the factor is applied)


def test_longer_contractions_than_float32s_factor_covers_keep_float64():
    a, b = np.full((1, FLOAT32_TERMS + 1), 3.0), np.full((FLOAT32_TERMS + 1, 1), 0.5)
    inst = _Dot(lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    terms = Terms(a, True, FLOAT32_TERMS + 1), Terms(b, True, FLOAT32_TERMS + 1)
    assert terms[0].values.dtype == np.float64
    got = UpperDot(inst, FLOAT32_TERMS + 1).add(np.zeros((1, 1)), *terms, (1, 1))
    assert got[0, 0] == 9.0 * 0.25 * (FLOAT32_TERMS + 1)


@pytest.mark.parametrize("sides", ["both", "lhs", "rhs", "none"])
def test_the_dot_rules_formula_is_the_numpy_rule(sides, dot_passes):
    """dot_variance per element of a (B, M, N) output against numpy: shared = |sums_a[b, m]| least_b[b, n] +
    |sums_b[b, n]| least_a[b, m] (the terms of the operands with errors), arithmetic = (u_op (|x| + spread
    sqrt(squares)))^2 + accumulation (squares + x^2) (+ absolute^2), total = (sqrt(errors) + shared)^2 + arithmetic;
    and whether noise (squares + x^2) + floor <= errors everywhere."""
    rng = np.random.default_rng(3)
    shape = (3, 40, 30)
    n = int(np.prod(shape))
    errors, squares = (np.abs(_awkward(rng, n, np.float64)) for _ in range(2))
    x = _awkward(rng, n, np.float32)
    sums_a, sums_b = _awkward(rng, 3 * 40, np.float64).reshape(3, 40), _awkward(rng, 3 * 30, np.float64).reshape(3, 30)
    least_a = np.abs(_awkward(rng, 3 * 40, np.float64)).reshape(3, 40) if sides in ("both", "lhs") else np.empty((3, 0))
    least_b = np.abs(_awkward(rng, 3 * 30, np.float64)).reshape(3, 30) if sides in ("both", "rhs") else np.empty((3, 0))
    with np.errstate(all="ignore"):
        shared = np.zeros(shape)
        if least_b.size:
            shared = shared + np.abs(sums_a)[:, :, None] * least_b[:, None, :]
        if least_a.size:
            shared = shared + np.abs(sums_b)[:, None, :] * least_a[:, :, None]
        shared = shared.reshape(-1)
        subnormal = np.abs(_awkward(rng, n, np.float64))  # (the absolute allowance below the normals)
        for operand_u, absolute in ((0.0, None), (2.0 ** -11, None), (2.0 ** -11, subnormal)):
            arithmetic = np.empty(n)
            total, suffices = _variance(errors, squares, x, sums_a, least_b, sums_b, least_a, 0.0, 1e-12, operand_u,
                                        3.3, 1e-10, 1e-30, arithmetic, absolute=absolute)
            want = 1e-12 * (squares + x * x)
            if operand_u:
                want = want + np.square(operand_u * (np.abs(x) + 3.3 * np.sqrt(squares)))
            if absolute is not None:
                want = want + absolute * absolute
            np.testing.assert_array_equal(arithmetic, want)
            np.testing.assert_array_equal(total, np.square(np.sqrt(errors) + shared) + want)
            assert not suffices  # (NaN and large terms among them)
    tame = np.abs(rng.standard_normal(n))
    for floor, want in ((1e-30, True), (10.0, False)):
        assert _variance(tame, tame * 1e-6, tame * 1e-3, sums_a, least_b, sums_b, least_a, 0.0, 1e-12,
                         0.0, 0.0, 1e-3, floor, np.empty(n))[1] == want


@pytest.mark.parametrize("shifts", [(-40, 12, 3), (1500, -1200, 0)])  # (beyond MAX_SHIFT: ldexp after the factor)
def test_the_rule_reads_its_float32_products_as_add_unscaled_makes_them(shifts, dot_passes):
    """dot_variance on the float32 products with their factors and shifts: bit for bit what it gives on the float64
    errors and squares add_unscaled makes of them (from_b's, then from_a's added), with either product absent."""
    rng = np.random.default_rng(12)
    shape = (2, 30, 20)
    n = int(np.prod(shape))
    from_b, from_a, squares = (np.abs(_awkward(rng, n, np.float32)) for _ in range(3))
    x = _awkward(rng, n, np.float64)
    sums_a, sums_b = rng.standard_normal((2, 30)), rng.standard_normal((2, 20))
    least_a, least_b = np.abs(rng.standard_normal((2, 30))), np.abs(rng.standard_normal((2, 20)))
    factor = 1 + 7 * 2.0**-23
    rest = (x, sums_a, least_b, sums_b, least_a, 0.0, 1e-12, 2.0**-11, 3.3, 1e-10, 1e-30)
    empty = np.empty(0, np.float32)
    with np.errstate(all="ignore"):
        for b_side, a_side, sq in ((from_b, from_a, squares), (empty, from_a, squares), (from_b, empty, empty)):
            errors = np.zeros(n)
            for k, p in enumerate((b_side, a_side)):
                if p.size:
                    add_unscaled(p, factor, shifts[k], errors, True)
            wide_squares = np.empty(n) if sq.size else np.empty(0)
            if sq.size:
                add_unscaled(sq, factor, shifts[2], wide_squares, False)
            want_arithmetic, got_arithmetic, got = np.empty(n), np.empty(n), np.empty(n)
            want = _variance(errors, wide_squares, *rest, want_arithmetic)
            read = [unscaling(p, factor, shift) if p.size else (p, 1.0) for p, shift in zip((b_side, a_side, sq), shifts)]
            fits = dot_variance(got, *(p for p, _ in read), np.array([c for _, c in read]), *rest, got_arithmetic)
            np.testing.assert_array_equal(got, want[0])
            np.testing.assert_array_equal(got_arithmetic, want_arithmetic)
            assert fits == want[1]


@pytest.mark.parametrize("etype", ["bf16", "f16", "f32", "f64", "c64"])
def test_the_final_rounding_in_the_rules_pass_is_the_separate_passes(etype, dot_passes):
    """dot_variance with `rounding`: bit for bit the separate passes it replaces -- the total and arithmetic
    written, the value's rounding by kernels/bound_rules.round_bounds at |x| + sqrt(total) (a float32 bound where
    the store keeps them narrow; no rule, a complex dot: sqrt(total) and no rounding of its own), then its own
    error sqrt(own^2 + arithmetic) as numpy computes it -- on data with infinities, NaN, zeros and subnormals."""
    rng = np.random.default_rng(21)
    shape = (2, 30, 40)
    n = int(np.prod(shape))
    from_b, from_a, squares = (np.abs(_awkward(rng, n, np.float32)) for _ in range(3))
    x = _awkward(rng, n, np.float64)
    x[::7] = 0.0  # (bound 0 where the errors are: exact values)
    from_b[::7] = from_a[::7] = 0.0
    sums_a, sums_b = rng.standard_normal((2, 30)), rng.standard_normal((2, 40))
    least_a, least_b = np.abs(rng.standard_normal((2, 30))), np.abs(rng.standard_normal((2, 40)))
    args = (from_b, from_a, squares, np.array([2.0**-30, 2.0**-20, 2.0**-40]), x, sums_a, least_b, sums_b, least_a,
            0.0, 1e-12, 2.0**-9, 3.3, 1e-10, 1e-30)  # fmt: skip
    rule = rounding_rule(element_type(etype), "dot")
    assert (rule is None) == (etype == "c64")
    with np.errstate(all="ignore"):
        total, arithmetic = np.empty(n), np.empty(n)
        fits = dot_variance(total, *args, arithmetic)
        for narrow in (False, True):
            kind = np.float32 if rule and narrow else np.float64
            want_bound, want_own = np.sqrt(total).astype(kind), np.zeros(n)
            if rule is not None:
                round_bounds(x, total, np.empty(0), want_own, want_bound, *rule)
            want_own = np.sqrt(np.square(want_own) + arithmetic)
            bound, own = np.empty(n, kind), np.empty(n)
            assert dot_variance(np.empty(0), *args, np.empty(0), (bound, own, rule)) == fits
            np.testing.assert_array_equal(bound.view(np.uint32 if kind == np.float32 else np.uint64),
                                          want_bound.view(np.uint32 if kind == np.float32 else np.uint64))
            np.testing.assert_array_equal(own.view(np.uint64), want_own.view(np.uint64))
            assert np.isnan(bound).any() and np.isinf(bound).any() and (own > 0).any()


@pytest.mark.parametrize("data", ["awkward", "wide", "normal"])
@pytest.mark.parametrize("dims, lhs, rhs", DIMS)
def test_a_sum_of_squares_bounded_from_the_errors_is_never_below_it(dims, lhs, rhs, data):
    """dot_variance with no squares given bounds sum_k a^2 b^2 by errors / r^2 (errors: UpperDot's a^2 e_b^2 +
    e_a^2 b^2, r: least_relative of either side, the larger): never below the exact sum of squares (longdouble)
    on data with infinities, NaN, zeros and subnormals (the lhs: its r is 0), magnitudes over 2^-300 .. 2^300 and
    relative errors that vary; near it where the relative errors are all alike."""
    rng = np.random.default_rng(5)
    if data == "normal":
        a, b = (rng.standard_normal(s) for s in (lhs, rhs))
        ea, eb = np.abs(a) * 2.0**-9, np.abs(b) * 2.0**-6  # (r: the rhs's, the larger)
    else:
        a = _awkward(rng, int(np.prod(lhs)), np.float32).reshape(lhs).astype(np.float64)
        b = rng.standard_normal(rhs) * (2.0 ** rng.integers(-300, 300, rhs) if data == "wide" else 1.0)
        b.reshape(-1)[::5] = 0.0
        ea, eb = (np.abs(x) * 2.0 ** rng.uniform(-30, -5, x.shape) for x in (a, b))
    inst = _Dot(**dims)
    contracted = int(np.prod([a.shape[d] for d in dims["lhs_contracting_dims"]]))
    upper = UpperDot(inst, contracted)
    with np.errstate(all="ignore"):
        exact = _exact(np.square(a), np.square(b), dims).astype(np.float64)
        shape = exact.shape
        errors = upper.add(np.zeros(shape), Terms(a, True, contracted), Terms(eb, True, contracted), shape)
        errors = upper.add(errors, Terms(ea, True, contracted), Terms(b, True, contracted), shape)
        r = max(least_relative(ea.reshape(-1), a.reshape(-1)), least_relative(eb.reshape(-1), b.reshape(-1)))
        batch = shape[0] if dims.get("lhs_batch_dims") else 1  # (the output as (B, M, N): batch, lhs free, rhs free)
        sums_a, sums_b = np.zeros((batch, errors.size // batch // shape[-1])), np.zeros((batch, shape[-1]))
        none = np.empty((batch, 0))
        squares = np.empty(errors.size)  # (the arithmetic with accumulation 1 and x = 0: the sum of squares)
        _variance(errors.reshape(-1), np.empty(0), np.zeros(errors.size), sums_a, none, sums_b, none,
                  (1 + 2.0**-50) / (r * r), 1.0, 0.0, 0.0, 0.0, 0.0, squares)
    assert 0 < r < np.inf
    squares = squares.reshape(shape)
    judged = ~np.isnan(squares) & ~np.isnan(exact)
    assert np.all(squares[judged] >= exact[judged]), np.min(squares[judged] / exact[judged])
    assert not np.any(np.isfinite(errors[np.isnan(exact)]))  # (inf x 0 there: the bound is not finite anyway)
    if data == "normal":  # errors = (2^-12 + 2^-18) a^2 b^2, r^2 = 2^-12: (1 + 2^-6) the sum, within the factor
        assert np.all(squares <= (1 + 2.0**-6) * exact * (1 + (contracted + 3) * 2.0**-22)), np.max(squares / exact)


def test_the_least_relative_error_is_a_lower_bound(dot_passes):
    """least_relative against the least quotient in longdouble: never above it, within 2^-49 below where it is a
    float64 normal; 0 where an error or value is not finite or the least is below float64's normals; inf where
    every value is 0."""
    rng = np.random.default_rng(8)
    for trial in range(200):
        n = int(rng.integers(1, 50))
        value = rng.standard_normal(n) * 2.0 ** rng.integers(-1000, 1000, n)
        error = np.abs(value) * 2.0 ** rng.uniform(-60, 60, n)
        value[rng.random(n) < 0.2] = 0.0
        if trial % 5 == 0:
            (error if trial % 10 else value)[rng.integers(0, n)] = [np.inf, np.nan][trial % 3 == 0]
        with np.errstate(all="ignore"):
            got = least_relative(error, value)
            nonzero = value != 0
            quotients = error[nonzero].astype(np.longdouble) / np.abs(value[nonzero]).astype(np.longdouble)
        if not (np.all(np.isfinite(error)) and np.all(np.isfinite(value))):
            assert got == 0
        elif not nonzero.any():
            assert got == np.inf
        elif quotients.min() < np.finfo(np.float64).tiny:
            assert got == 0
        else:
            least = quotients.min()
            assert least * (1 - 2.0**-49) <= got <= least, (got, least)


@pytest.mark.parametrize("data", ["awkward", "wide", "squares overflow", "zeros"])
def test_an_operands_squared_terms_and_least_relative_error_in_two_passes(data, dot_passes):
    """squared_terms: bit for bit scaled_terms of x^2 and of its error^2 and least_relative (one pass for the
    largests and the least quotient, one for both scalings), on data with infinities, NaN, zeros, subnormals,
    magnitudes over 2^-300 .. 2^300 and finite values whose squares overflow."""
    rng = np.random.default_rng(13)
    n = 3001
    x = {"awkward": lambda: _awkward(rng, n, np.float64), "wide": lambda: rng.standard_normal(n) * 2.0 **
         rng.integers(-300, 300, n), "squares overflow": lambda: rng.standard_normal(n) * 1e200,
         "zeros": lambda: np.zeros(n)}[data]()
    error = np.abs(_awkward(rng, n, np.float32)) if data == "awkward" else np.abs(x) * 2.0**-9
    for top in (55, 20):
        with np.errstate(all="ignore"):
            want_x, want_e = np.empty(n, np.float32), np.empty(n, np.float32)
            shifts = scaled_terms(x, True, top, want_x), scaled_terms(error, True, top, want_e)
            relative = least_relative(error, x)
            got_x, got_e = np.empty(n, np.float32), np.empty(n, np.float32)
            got = squared_terms(x, error, top, got_x, got_e)
        assert got[:2] == shifts
        np.testing.assert_array_equal(got_x, want_x)
        np.testing.assert_array_equal(got_e, want_e)
        assert got[2] == relative or (np.isnan(got[2]) and np.isnan(relative))


def test_perturbed_operands_flush_float32_subnormals():
    rng = np.random.default_rng(2)
    n = 3000
    values = _awkward(rng, n, np.float32)
    deviations = np.where(rng.random((4, n)) < 0.5, rng.standard_normal((4, n)) * 1e-40,
                          rng.standard_normal((4, n)) * 1e-3).astype(np.float32)
    out = np.empty((4, n), np.float32)
    with np.errstate(all="ignore"):
        perturbed_float32(values, deviations, FLUSHED_BELOW, out)
        d = np.where(np.abs(deviations) < FLUSHED_BELOW, np.float32(0), deviations)
        want = values.astype(np.float32) + d
        want = np.where(np.abs(want) < FLUSHED_BELOW, np.float32(0), want)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("n", [3000, 300_001])  # (one span; spans over the cores)
def test_perturbed_operands_read_bfloat16_samples_as_their_float32_values(n):
    """The samples kept as bfloat16 bits give the operands their float32 reading gives (bit for bit)."""
    rng = np.random.default_rng(3)
    values = _awkward(rng, n, np.float32)
    deviations = np.where(rng.random((4, n)) < 0.3, rng.standard_normal((4, n)) * 1e-40,
                          rng.standard_normal((4, n)) * 1e-3).astype(ml_dtypes.bfloat16)
    deviations[:, :8] = [np.inf, -np.inf, np.nan, 0, -0.0, 1e-39, -3e38, 2.0**-61]
    got, want = np.empty((4, n), np.float32), np.empty((4, n), np.float32)
    with np.errstate(all="ignore"):
        perturbed_float32(values, deviations.view(np.uint16), FLUSHED_BELOW, got)
        perturbed_float32(values, deviations.astype(np.float32), FLUSHED_BELOW, want)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("noisy", [True, False])
@pytest.mark.parametrize("n", [3000, 70_001])  # (a last block and chunk cut short)
def test_the_samples_finishing_pass_is_the_separate_passes(n, noisy, passes):
    """finish_samples bit for bit as the passes it replaces: numpy's float32 subtraction of x rounded to float32,
    bound_rules.add_noise's draws (or none), block_ratios' statistics of the result against the bound, and the
    result rounded to bfloat16 as ml_dtypes (from_f32), on data with infinities, NaN, zeros and subnormals."""
    rng = np.random.default_rng(14)
    moved = _awkward(rng, 4 * n, np.float32).reshape(4, n)
    moved[:, 100:] = rng.standard_normal((4, n - 100))  # (most blocks finite: judged)
    x = _awkward(rng, n, np.float64)
    x[100:] = moved[0, 100:] + rng.standard_normal(n - 100) * 1e-3
    own = np.abs(rng.standard_normal(n)) * 1e-3 if noisy else np.empty(0)
    bound = np.abs(_awkward(rng, n, np.float32))
    bound[100:] = 1e-2
    key = np.uint64(0x1234_5678_9ABC_DEF0)
    with np.errstate(all="ignore"):
        want = moved - x.astype(np.float32)
        if noisy:
            add_noise(want, key, own, SIGMAS)
        want_stats = block_ratios(want, bound, CALIBRATION_BLOCK)
        got = np.empty((4, n), np.uint16)
        got_stats = finish_samples(moved, x, own, key, SIGMAS, bound, CALIBRATION_BLOCK, got)
    np.testing.assert_array_equal(got, from_f32(want, ml_dtypes.bfloat16).view(np.uint16))
    # the block totals within a few roundings: summed in lanes, a float32 square's last bits (its noise's product
    # made in another order) can survive where an element-order sum absorbed them
    np.testing.assert_allclose(got_stats[1], want_stats[1], rtol=1e-12)
    for i in (0, 2, 3, 4):
        np.testing.assert_array_equal(got_stats[i], want_stats[i])
    assert got_stats[3] > CALIBRATION_BLOCK and got_stats[4]  # (judged elements and unjudged ones among them)


@pytest.mark.parametrize("dims, lhs, rhs", DIMS)
def test_float32_dot_samples_of_both_operands_are_the_perturbed_dots(dims, lhs, rhs):
    """Both operands with samples: (a + da)(b + db) - x in float32 against the perturbed dots in float64, within
    the rounding float32_noise allows for (bf16-sized deviations: far below them)."""
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(lhs), rng.standard_normal(rhs)
    da, db = ((rng.standard_normal((4, *s)) * 2.0 ** -9).astype(np.float32) for s in (lhs, rhs))
    da[:, ..., :3] = 1e-41  # (subnormal deviations: flushed)
    inst = _Dot(**dims)
    lb, rb, lc, rc = _dims(dims)
    f64 = np.dtype(np.float64)
    x = dot_general(a, b, lb, rb, lc, rc, f64)
    want = np.stack([dot_general(a + da[k], b + db[k], lb, rb, lc, rc, f64) for k in range(4)]) - x
    moved = perturbed_product(inst, [a, b], [da, db])
    assert moved.flags.c_contiguous and moved.dtype == np.float32
    scale = np.sqrt(np.mean(want**2))
    np.testing.assert_allclose(moved - x.astype(np.float32), want, rtol=0, atol=1e-3 * scale)
    # samples kept as bfloat16: the same as their float32 reading
    kept = [d.astype(ml_dtypes.bfloat16) for d in (da, db)]
    read = [d.astype(np.float32) for d in kept]
    np.testing.assert_array_equal(perturbed_product(inst, [a, b], kept), perturbed_product(inst, [a, b], read))


class _Bounds:
    """What dot_bounds reads and writes of ErrorBounds: the operands' stored bounds; the bound it stores."""

    def __init__(self, device, stored: dict):
        self.device, self.stored, self.algorithms, self.current = device, stored, set(), threading.local()

    def _stored_bound(self, leaf):
        return self.stored.get(id(leaf))

    def of(self, leaf):
        return np.broadcast_to(self.stored.get(id(leaf), 0.0), np.shape(leaf))

    def _put(self, x, bound):
        self.bound = bound


def _typed(name):
    return SimpleNamespace(shape=SimpleNamespace(element_type=SimpleNamespace(name=name)))


@pytest.mark.parametrize("profile, operands, sampled", [
    ("reference", "bf16", True),  # bf16 operands' errors: float32 samples
    ("a100", "f32", False),  # TF32 rounding of f32 operands, f32-sized errors: float64 samples
    ("reference", "exact", False),  # one exact operand, the other's errors f32-sized: float64 samples
])
def test_the_dot_rule_is_its_float64_form(profile, operands, sampled, dot_passes, monkeypatch):
    """dot_bounds' variance before the final rounding (its result type given no rounding rule: the stored bound is
    its root) against the rule written in numpy float64 (a 2-D dot):
    (sqrt(A^2 e_B^2 + e_A^2 B^2) + |sum_k a| min_k e_b + |sum_k b| min_k e_a)^2 + (SIGMAS u_acc)^2 / 3 K (A^2 B^2 +
    x^2) (+ TF32's operand rounding): never below, within float32's factor above."""
    rng = np.random.default_rng(11)
    m, k, n = 40, 300, 30
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    relative = {"bf16": 2.0 ** -8, "f32": 2.0 ** -24, "exact": 2.0 ** -24}[operands]  # (a few roundings)
    ea = np.abs(a) * relative * rng.uniform(0.5, 1, (m, k))
    eb = np.zeros((k, n)) if operands == "exact" else np.abs(b) * relative * rng.uniform(0.5, 1, (k, n))
    ea[3] = 0.0  # (an exact row)
    bounds = _Bounds(device_profile(profile), {id(a): ea.astype(np.float32), id(b): eb})
    inst = _Dot(lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    kind = "f32" if operands != "bf16" else "bf16"
    orig = SimpleNamespace(operands=[_typed(kind), _typed(kind)], shape=SimpleNamespace(
        element_type=SimpleNamespace(name="f32")))
    x = a @ b
    monkeypatch.setattr(bound_dots, "rounding_rule", lambda *_: None)
    local, ceiling = dot_bounds(bounds, inst, orig, x, [a, b])
    variance = np.square(bounds.bound)
    ea64 = ea.astype(np.float32).astype(np.float64)
    errors = (a * a) @ (eb * eb) + (ea64 * ea64) @ (b * b)
    shared = np.abs(a.sum(1))[:, None] * eb.min(0)[None, :] + ea64.min(1)[:, None] * np.abs(b.sum(0))[None, :]
    squares = (a * a) @ (b * b)
    arithmetic = (SIGMAS * 2.0 ** -24) ** 2 / 3 * k * (squares + x * x)
    if profile == "a100":  # TF32: operands rounded to 11 bits
        arithmetic = arithmetic + np.square(2.0 ** -11 * (np.abs(x) + SIGMAS * np.sqrt(2 / 3) * np.sqrt(squares)))
        assert bounds.algorithms
    want = np.square(np.sqrt(errors) + shared) + arithmetic
    # where the sum of squares is bounded from the errors (bf16's: ESTIMATED_SHARE), its term is at most that share
    estimate = ESTIMATED_SHARE * errors if sampled else 0.0
    assert np.all(variance >= want * (1 - 1e-14)), np.min(variance / want)
    assert np.all(variance <= (want + estimate) * (1 + (k + 3) * 2.0 ** -22)), np.max(variance / want)
    assert np.all(local**2 >= arithmetic * (1 - 1e-14))
    assert np.all(local**2 <= (arithmetic + estimate) * (1 + (k + 3) * 2.0 ** -22))
    if not sampled:
        np.testing.assert_allclose(local, np.sqrt(arithmetic), rtol=(k + 3) * 2.0 ** -23)
    else:  # (the estimate taken: above the sum of squares' term)
        assert np.max(local**2 / arithmetic) > 1.01
    assert bounds.current.dot_samples_in_f32 == sampled
    linear = ceiling()
    terms = np.abs(a) @ eb + ea64 @ (np.abs(b) + eb)
    assert np.all(linear >= (np.sqrt(arithmetic) + terms) * (1 - 1e-14))
    assert np.all(linear <= (np.sqrt(arithmetic + estimate) + terms) * (1 + k * 2.0 ** -22))


def test_float32_samples_are_refused_where_float32_may_overflow():
    big = np.full((2, 4), 2.0 ** 70)
    terms = Terms(big, True, 4)
    assert float32_noise(4, terms, terms) == (np.inf, np.inf)
    small = Terms(np.ones((2, 4)), True, 4)
    noise, floor = float32_noise(4, small, small)
    assert noise == SIGMAS**2 * 2.0**12 * 2.0**-48 * 4 and 0 < floor < 1e-25


SUMS = """HloModule sums
add { x = f32[] parameter(0)  y = f32[] parameter(1)  ROOT s = f32[] add(x, y) }
ENTRY e {
  a = f32[48,300] parameter(0)
  b = f32[48,300] parameter(1)
  c = f32[48,300] multiply(a, b)
  zero = f32[] constant(0)
  rows = f32[48] reduce(c, zero), dimensions={1}, to_apply=add
  windows = f32[48,100] reduce-window(c, zero), window={size=1x5 stride=1x3 pad=0_0x1_1}, to_apply=add
  ROOT t = (f32[48], f32[48,100]) tuple(rows, windows)
}
"""


def test_a_sums_samples_are_its_kernel_on_the_terms_deviations():
    """An add reduce's and reduce-window's samples' deviations (the sum of the terms' float32 deviations, no
    perturbed float64 run) against the perturbed sums in float64 less the sums, plus the sum's own draw: within a
    few float32 roundings of the deviations, the own draw apart (add_noise skipped for the sums)."""
    from hloexec.exec.shadow import shadow_module
    from hloexec.tools import bound_generic
    from hloexec.tools import bounds as bounds_module
    from hloexec.tools.bounds import ErrorBounds
    from hloexec.tools.numerics import Runner, executable_like

    exe = hloexec.load(SUMS)
    shadow = shadow_module(exe.module)
    shadow_exe = executable_like(exe, shadow.module, use_numba=False)
    bounds = ErrorBounds(shadow, shadow_exe.context, device_profile("reference"))
    checked = []

    def observe(_device, inst, value, operands):
        if inst.opcode not in ("reduce", "reduce-window"):
            bounds(inst, value, operands)
            return
        terms = bounds._samples_or_none(operands[0])
        kernel = bounds._kernel(inst)
        want = np.stack([kernel(operands[0] + terms[k], operands[1]) - value for k in range(len(terms))])
        with pytest.MonkeyPatch.context() as patch:  # (no own draw: the deviations alone)
            patch.setattr(bounds_module, "add_noise", lambda *_, **__: None)
            patch.setattr(bound_generic, "add_noise", lambda *_, **__: None)  # (an add reduce's: store_summed draws)
            bounds(inst, value, operands)
        got = bounds._samples_or_none(value)
        # (the store keeps samples in bfloat16, rounded to nearest: 2^-9 of each, tools/bound_store.py)
        np.testing.assert_allclose(got, want, rtol=2.0**-8, atol=1e-5 * np.sqrt(np.mean(want**2)))
        checked.append(inst.opcode)

    r = np.random.default_rng(1)
    inputs = [r.standard_normal((48, 300)).astype(np.float32) for _ in range(2)]
    Runner().run(shadow_exe, shadow.inputs(inputs), observe, observe_operands=True)
    assert sorted(checked) == ["reduce", "reduce-window"]


def test_a_complex_dot_is_bounded_from_its_magnitudes():
    """A c64 dot: the rule's terms are |a|^2, |b|^2 and |x|^2 (float products of magnitudes), a finite bound."""
    from hloexec.tools.numerics import shadow_run

    exe = hloexec.load("HloModule c\nENTRY e {\n  a = c64[4,8] parameter(0)\n  b = c64[8,3] parameter(1)\n"
                       "  ROOT d = c64[4,3] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n")
    r = np.random.default_rng(0)
    a, b = ((r.standard_normal(s) + 1j * r.standard_normal(s)).astype(np.complex64) for s in ((4, 8), (8, 3)))
    with np.errstate(all="ignore"):
        run = shadow_run(exe, [a, b], devices=[device_profile("reference")])
    [bound] = run.bounds["reference"].bounds
    assert bound.shape == (4, 3) and np.all(np.isfinite(bound)) and np.all(bound > 0)
