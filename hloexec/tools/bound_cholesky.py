"""The error bound of a cholesky (tools/bounds.py): its backward error and its operand's errors, through the
factorization's first-order perturbation.

Backward error: the computed factor L of A satisfies L L^T = A + dA with |dA| <= gamma_{n+1} |L| |L^T|,
gamma_k = k u / (1 - k u), whatever the order of its inner products (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., Theorem 10.3); the operand's own errors add their bounds E (on the triangle the op reads, as
the symmetric matrix it stands for). Perturbation: A + dA = (L + dL)(L + dL)^T gives, to first order,
L^-1 dA L^-T = M + M^T with M = L^-1 dL lower triangular, so dL = L Phi(L^-1 dA L^-T) (Phi: the strictly lower
triangle and half the diagonal) and |dL| <= |L| Phi(|L^-1| |dA| |L^-T|) elementwise. First order, as the
elementwise rules are: the neglected terms are of order rho = ||L^-1 dA L^-T||, bounded by the largest row sum
of |L^-1| |dA| |L^-T|; the bound is divided by 1 - rho, and a matrix with rho >= 1/2 (within its errors of
not being positive definite) gets none (infinite), as does one the shadow found not positive definite (NaN)."""

from __future__ import annotations

import numpy as np


def cholesky_bounds(bounds, inst, orig, x, operands) -> np.ndarray | None:
    """Puts `x`'s bound (the cholesky factor of `operands[0]`) into `bounds` (an ErrorBounds); returns its own
    rounding's part (None where it has no rule: complex)."""
    a = np.asarray(operands[0])
    if np.iscomplexobj(a) or np.iscomplexobj(x):
        return None
    lower = bool(inst.attr("lower", False))
    n = a.shape[-1]
    flip = (lambda m: m) if lower else (lambda m: np.swapaxes(m, -1, -2))  # (the upper factor: the lower's transpose)
    factor = flip(np.asarray(x, np.float64))
    read = np.tril(flip(np.broadcast_to(bounds.of(a), a.shape).astype(np.float64)))
    operand = read + np.swapaxes(np.tril(read, -1), -1, -2)  # (the symmetric matrix the read triangle stands for)
    u = float(np.finfo(orig.shape.element_type.numpy).eps) / 2  # (f16, bf16: theirs, whatever a device computes in)
    gamma = (n + 1) * u / (1 - (n + 1) * u)
    magnitude = np.abs(factor)
    own = gamma * magnitude @ np.swapaxes(magnitude, -1, -2)
    diagonal = np.diagonal(factor, axis1=-2, axis2=-1)
    factored = (np.all(diagonal > 0, axis=-1) & np.all(np.isfinite(factor), axis=(-2, -1)))[..., None, None]
    with np.errstate(all="ignore"):
        inverse = np.abs(np.linalg.inv(np.where(factored, factor, np.eye(n))))
        through = [inverse @ d @ np.swapaxes(inverse, -1, -2) for d in (operand, own)]
        rho = np.max(np.sum(through[0] + through[1], axis=-1), axis=-1)[..., None, None]
        scale = np.where(factored & (rho < 0.5), 1 / (1 - rho), np.inf)
        parts = [np.tril(magnitude @ (np.tril(t, -1) + np.eye(n) * t / 2) * scale) for t in through]
    bound, local = (flip(np.where(np.isnan(p), np.inf, p)) for p in (parts[0] + parts[1], parts[1]))
    bounds._put(x, bound)
    return local
