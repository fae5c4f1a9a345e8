"""The error bounds' own-error draws (hloexec/kernels/normal_draws.py): the hash is SplitMix64 (its published
test vectors), each draw is the inverse normal CDF (Python's statistics.NormalDist) of its 32 bits within a
table cell, and 10^7 draws are standard normal (mean, variance, kurtosis, tail probabilities to 5 sigma, the
CDF) and independent between neighbouring elements, samples, pair halves, instructions and groups. The rounding
draws (fill_rounding_draws): each a quarter of the hash, as written; 10^7 of them uniform of variance 1; the same
independence."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest
from numba import njit

from hloexec.kernels.normal_draws import GOLDEN, mix64, rounding_draws, standard_normals

NORMAL = NormalDist()
NO_KEYS = np.empty(0, np.int64)


@njit
def _hash(key, counter):
    return mix64(key + counter * GOLDEN)


def _draws(key, n, first=0, keys=NO_KEYS, samples=4, kernel=standard_normals) -> np.ndarray:
    out = np.empty((samples, n), np.float32)
    kernel(np.uint64(key), first, keys, out)
    return out


KERNELS = pytest.mark.parametrize("kernel", [standard_normals, rounding_draws])


def test_the_hash_is_splitmix64():
    """SplitMix64 (Steele, Lea, Flood 2014; Vigna's splitmix64.c) seeded 1234567: its first five outputs, the
    Weyl terms seed + j x GOLDEN, j = 1..5."""
    want = [6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431,
            16408922859458223821]
    assert [int(_hash(np.uint64(1234567), np.uint64(j))) for j in range(1, 6)] == want


def test_each_draw_is_the_inverse_normal_cdf_of_its_bits():
    """Element i's samples 2p and 2p + 1 are the low and high halves of the hash of counter 2i + p (four samples:
    two pairs); a half u's draw has u's top bit as its sign and lies within a table cell (1/256 of a binade of
    w) of Phi^-1(1 - w / 2), w = (2 x its low 23 bits + 1) 2^-24, here from NormalDist."""
    key, n = 0x0123456789ABCDEF, 3000
    got = _draws(key, n)
    for i in range(n):
        for p in range(2):
            z = int(_hash(np.uint64(key), np.uint64(2 * i + p)))
            for half, u in enumerate((z & 0xFFFFFFFF, z >> 32)):
                w = (2 * (u & 0x7FFFFF) + 1) * 2.0**-24
                exact = -NORMAL.inv_cdf(w / 2) * (-1 if u >> 31 else 1)
                draw = float(got[2 * p + half, i])
                assert np.signbit(draw) == bool(u >> 31)
                # (a cell's width in z: w / 256 of probability over the density there, 1/256 of |z|'s slope)
                width = (w / 256) / (2 * NORMAL.pdf(exact)) + 1e-6
                assert abs(draw - exact) <= width, (i, p, half, draw, exact)


def test_each_rounding_draw_is_a_quarter_of_the_hash():
    """Element i's rounding draws 4q..4q + 3 are the 16-bit quarters f of the hash of counter i x quads + q (here
    eight samples: two quads), each (2f - 65535) 2^-16 sqrt(3) in float32: the odd multiples of 2^-16 in (-1, 1)
    scaled to a uniform of variance 1."""
    key, n = 0x0123456789ABCDEF, 3000
    got = _draws(key, n, samples=8, kernel=rounding_draws)
    scale = np.float32(np.sqrt(3) * 2.0**-16)
    for i in range(n):
        for q in range(2):
            z = int(_hash(np.uint64(key), np.uint64(2 * i + q)))
            for j in range(4):
                f = (z >> (16 * j)) & 0xFFFF
                assert got[4 * q + j, i] == np.float32(2 * f - 65535) * scale, (i, q, j)


def test_ten_million_rounding_draws_are_uniform_of_variance_one():
    """A single rounding's error model: uniform on (-sqrt 3, sqrt 3) (variance 1, fourth moment 9/5, symmetric),
    its CDF within the Kolmogorov-Smirnov 0.1% level plus one step (2^-16)."""
    d = _draws(np.random.default_rng(8).integers(0, 2**64, dtype=np.uint64), 2_500_000, kernel=rounding_draws)
    d = d.ravel().astype(np.float64)
    n, edge = d.size, np.sqrt(3)
    assert np.max(np.abs(d)) < edge
    assert abs(d.mean()) < 5 / np.sqrt(n)
    assert abs(d.var() - 1) < 5 * np.sqrt(0.8 / n)  # (Var U^2 = 9/5 - 1)
    assert abs(np.mean(d**4) - 1.8) < 5 * np.sqrt((9 - 1.8**2) / n)  # (E U^8 = 3^4 / 9)
    ordered = np.sort(d)
    grid = np.linspace(-edge, edge, 4001)
    empirical = np.searchsorted(ordered, grid, side="right") / n
    assert np.max(np.abs(empirical - (grid + edge) / (2 * edge))) < 1.95 / np.sqrt(n) + 2.0**-16


@pytest.fixture(scope="module")
def many() -> np.ndarray:
    """10^7 draws: four samples of 2.5M elements under a random key."""
    return _draws(np.random.default_rng(8).integers(0, 2**64, dtype=np.uint64), 2_500_000)


def test_ten_million_draws_are_standard_normal(many):
    d = many.ravel().astype(np.float64)
    n = d.size
    assert abs(d.mean()) < 5 / np.sqrt(n)
    assert abs(d.var() - 1) < 5 * np.sqrt(2 / n)
    assert abs(np.mean(d**4) - 3) < 5 * np.sqrt(96 / n)  # (Var Z^4 = 105 - 9)
    for t in (0.5, 1, 2, 3, 4, 4.5, 5):
        expected = n * 2 * NORMAL.cdf(-t)
        seen = np.count_nonzero(np.abs(d) > t)
        assert abs(seen - expected) < 5 * np.sqrt(expected) + 1, (t, seen, expected)
    # the CDF everywhere: within the Kolmogorov-Smirnov 0.1% level plus half a body cell's probability (2^-12)
    ordered = np.sort(d)
    grid = np.linspace(-5, 5, 4001)
    empirical = np.searchsorted(ordered, grid, side="right") / n
    normal = np.array([NORMAL.cdf(g) for g in grid])
    assert np.max(np.abs(empirical - normal)) < 1.95 / np.sqrt(n) + 2.0**-12


def _correlations(x, y) -> tuple[float, float]:
    """The correlation of x and y and of their squares (a dependence the first may not show)."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    return float(np.corrcoef(x, y)[0, 1]), float(np.corrcoef(x * x, y * y)[0, 1])


@pytest.fixture(scope="module")
def many_rounding() -> np.ndarray:
    """10^7 rounding draws under a random key."""
    return _draws(np.random.default_rng(8).integers(0, 2**64, dtype=np.uint64), 2_500_000, kernel=rounding_draws)


@KERNELS
def test_draws_are_independent_between_elements_samples_and_instructions(kernel, many, many_rounding):
    """Correlations (and of squares) within 5 standard errors of 0: neighbouring elements (lags 1, 2, 3, 2^k),
    every pair of samples (0 and 1, 2 and 3: the halves of one hash; the rounding draws' 0-3: its quarters), the
    same element's draws of two instructions (keys drawn as ErrorBounds draws them, and keys 1 apart), and
    across them at small lags."""
    many = (many if kernel is standard_normals else many_rounding)[:, : 1 << 20]
    n = many.shape[1]
    limit = 5 / np.sqrt(n - 4096)
    for k in range(4):
        for lag in (1, 2, 3, 4, 64, 4096):
            assert max(map(abs, _correlations(many[k, :-lag], many[k, lag:]))) < limit, (k, lag)
    for k in range(4):
        for j in range(k + 1, 4):
            assert max(map(abs, _correlations(many[k], many[j]))) < limit, (k, j)
    rng = np.random.default_rng(9)
    keys = [*rng.integers(0, 2**64, 2, dtype=np.uint64), np.uint64(41), np.uint64(42)]
    for a, b in ((keys[0], keys[1]), (keys[2], keys[3])):
        one, other = _draws(a, n, kernel=kernel), _draws(b, n, kernel=kernel)
        for k, j in ((0, 0), (1, 1), (0, 3)):
            for lag in (0, 1, 2):
                got = _correlations(one[k, : n - lag], other[j, lag:])
                assert max(map(abs, got)) < limit, (a, b, k, j, lag, got)


@KERNELS
def test_a_span_of_elements_draws_what_the_whole_draws(kernel):
    """The draws of elements first.. are the whole value's there (the passes split over the cores agree)."""
    whole = _draws(5, 10_000, kernel=kernel)
    np.testing.assert_array_equal(_draws(5, 3_000, first=4_321, kernel=kernel), whole[:, 4_321:7_321])
    keys = np.where(np.arange(10_000) % 3 == 0, -1, np.arange(10_000) % 17)
    grouped = _draws(5, 10_000, 0, keys, kernel=kernel)
    np.testing.assert_array_equal(_draws(5, 3_000, 4_321, keys[4_321:7_321], kernel=kernel), grouped[:, 4_321:7_321])


@KERNELS
def test_a_group_has_one_draw_per_sample_and_its_own_independent_ones(kernel):
    """Elements of one group (keys[i] = g >= 0) share each sample's draw; the others (-1) keep their own (the
    unkeyed draws); the groups' draws have mean 0 and variance 1 and are independent of the elements' and across
    samples."""
    rng = np.random.default_rng(10)
    n, groups = 400_000, 100_000
    keys = np.where(rng.random(n) < 0.25, -1, rng.integers(0, groups, n))
    got, own = _draws(77, n, keys=keys, kernel=kernel), _draws(77, n, kernel=kernel)
    np.testing.assert_array_equal(got[:, keys < 0], own[:, keys < 0])
    grouped = np.nonzero(keys >= 0)[0]
    _, first, group = np.unique(keys[grouped], return_index=True, return_inverse=True)
    np.testing.assert_array_equal(got[:, grouped], got[:, grouped[first]][:, group])
    shared = got[:, grouped[first]].astype(np.float64)  # one column per group
    assert len(np.unique(shared.T, axis=0)) == shared.shape[1]  # (no two groups with the same draws)
    limit = 5 / np.sqrt(shared.shape[1])
    assert abs(shared.mean()) < 5 / np.sqrt(shared.size) and abs(shared.var() - 1) < 5 * np.sqrt(2 / shared.size)
    for k, j in ((0, 1), (0, 2), (1, 3)):
        assert max(map(abs, _correlations(shared[k], shared[j]))) < limit
    assert max(map(abs, _correlations(shared[0], own[0, : shared.shape[1]]))) < limit
