"""The error bound of an fft (tools/bounds.py): a linear map, so its operand's errors propagate through its
matrix, plus the transform's own rounding.

Propagated: output element k of a transform over N points (the fft_length dims) is sum_j F_kj x_j with |F_kj| = 1
(FFT, RFFT), 1/N (IFFT) or at most 2/N (IRFFT: the half spectrum's terms count twice); the operand's errors
taken as independent give sqrt(sum_j |F_kj|^2 e_j^2), plus an error all the terms may share (at most their least
bound: a bias's rounding) summed through F as the dot's rule has it: |F . min_j e_j|, the transform of that
constant (at the zero frequency only). Own rounding: Cooley-Tukey in the output's precision u is normwise
||fl(y) - y||_2 <= log2(N) eta ||y||_2, eta = mu + gamma_4 (sqrt 2 + mu) ~ (1 + 4 sqrt 2) u with twiddle
factors mu ~ u (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Theorem 24.2): that is
an RMS per output element of log2(N) eta times the outputs' RMS, taken as the element's bound (its own
rounding: one element may take more than the RMS only where the rounding errors gather in it)."""

from __future__ import annotations

import math

import numpy as np

from ..ops.common import ints, str_attr

# eta / u of the normwise bound: 1 + 4 sqrt(2), rounded up
FFT_ROUNDING = 6.7


def fft_bounds(bounds, inst, orig, x, operands) -> np.ndarray:
    """Puts `x`'s bound (an fft of `operands[0]`) into `bounds` (an ErrorBounds); returns its own rounding's."""
    a = operands[0]
    if np.size(a) == 0 or np.size(x) == 0:  # (nothing to bound)
        bounds._put(x, np.zeros(np.shape(x)))
        return np.zeros(np.shape(x))
    lengths = ints(orig.attr("fft_length"))
    axes = tuple(range(-len(lengths), 0))
    points = math.prod(lengths)
    kind = (str_attr(orig, "fft_type") or "FFT").upper()
    gain = {"FFT": 1.0, "RFFT": 1.0, "IFFT": 1.0 / points}.get(kind, 2.0 / points)  # the largest |F_kj|
    e = bounds.of(a)
    propagated = gain * np.sqrt(np.sum(np.square(e), axis=axes, keepdims=True))
    least = np.min(e, axis=axes, keepdims=True)
    shared = np.abs(bounds._kernel(inst)(np.broadcast_to(least, np.shape(a)).astype(np.asarray(a).dtype)))
    u = float(np.finfo(orig.shape.element_type.numpy).eps) / 2  # (c64's: f32's)
    # the outputs' RMS per transform (RFFT's half spectrum: sqrt(2) x the whole's at most)
    rms = np.sqrt(np.mean(np.square(np.abs(x)), axis=axes, keepdims=True)) * (math.sqrt(2) if kind == "RFFT" else 1)
    own = np.broadcast_to(FFT_ROUNDING * u * max(math.log2(points), 1.0) * rms, np.shape(x))
    bound = propagated + own + shared
    bounds._put(x, np.where(np.isnan(bound), np.inf, bound))
    return own
