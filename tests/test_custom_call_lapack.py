"""jax's CPU LAPACK custom-calls (lapack_*_ffi) against XLA:CPU: each jax.numpy / jax.scipy / lax.linalg
function is lowered to its pre-optimization HLO (which holds the custom-call), run by hloexec, and compared
with the same jitted function's outputs on XLA:CPU, bit for bit: both call the same LAPACK routine (scipy's)
with the same arguments and workspace sizes. Every routine runs in all four types s/d/c/z."""
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest

import hloexec
from op_helpers import random_matrix, spd_matrix

pytestmark = pytest.mark.xla
jax.config.update("jax_enable_x64", True)
TYPES = [np.float32, np.float64, np.complex64, np.complex128]




def _tridiagonal(rs, dt):
    dl = np.concatenate([[0], random_matrix(rs, dt, (5,))]).astype(dt)       # dl[0] and du[-1] unused
    du = np.concatenate([random_matrix(rs, dt, (5,)), [0]]).astype(dt)
    return [dl, (random_matrix(rs, dt, (6,)) + 4).astype(dt), du, random_matrix(rs, dt, (6, 2))]


CASES = {   # name: (function, inputs(rs, dtype)); the targets they lower to in the comments
    "lu": (jax.lax.linalg.lu, lambda rs, dt: [random_matrix(rs, dt, (2, 5, 4))]),                          # getrf
    "lu_singular": (jax.lax.linalg.lu, lambda rs, dt: [np.zeros((3, 3), dt)]),                     # info > 0
    "solve": (jnp.linalg.solve, lambda rs, dt: [random_matrix(rs, dt, (4, 4)), random_matrix(rs, dt, (4, 3))]),  # getrf, trsm
    "solve_triangular": (lambda a, b: jsl.solve_triangular(a, b, lower=True, trans=2, unit_diagonal=True),
                         lambda rs, dt: [random_matrix(rs, dt, (2, 4, 4)), random_matrix(rs, dt, (2, 4, 3))]),  # trsm
    "solve_triangular_right": (lambda a, b: jax.lax.linalg.triangular_solve(a, b, left_side=False, lower=False),
                               lambda rs, dt: [random_matrix(rs, dt, (3, 3)) + 3 * np.eye(3, dtype=dt),
                                               random_matrix(rs, dt, (5, 3))]),
    "qr": (jnp.linalg.qr, lambda rs, dt: [random_matrix(rs, dt, (6, 4))]),                                # geqrf, orgqr
    "qr_complete": (lambda a: jnp.linalg.qr(a, mode="complete"), lambda rs, dt: [random_matrix(rs, dt, (2, 4, 6))]),
    "qr_pivoting": (lambda a: jsl.qr(a, pivoting=True), lambda rs, dt: [random_matrix(rs, dt, (5, 4))]),  # geqp3
    "ormqr": (lambda a, t, c: jax.lax.linalg.ormqr(a, t, c, left=True, transpose=True),           # ormqr/unmqr
              lambda rs, dt: [random_matrix(rs, dt, (5, 3)), random_matrix(rs, dt, (3,)), random_matrix(rs, dt, (5, 2))]),
    "cholesky": (jnp.linalg.cholesky, lambda rs, dt: [spd_matrix(rs, dt, 5, (2,))]),                    # potrf
    "cholesky_not_pd": (jnp.linalg.cholesky, lambda rs, dt: [-np.eye(3, dtype=dt)]),              # info > 0
    "svd": (jnp.linalg.svd, lambda rs, dt: [random_matrix(rs, dt, (3, 5, 4))]),                           # gesdd A
    "svd_economic": (lambda a: jnp.linalg.svd(a, full_matrices=False), lambda rs, dt: [random_matrix(rs, dt, (4, 6))]),
    "svd_values": (lambda a: jnp.linalg.svd(a, compute_uv=False), lambda rs, dt: [random_matrix(rs, dt, (4, 6))]),
    "svd_qr": (lambda a: jax.lax.linalg.svd(a, algorithm=jax.lax.linalg.SvdAlgorithm.QR),        # gesvd
               lambda rs, dt: [random_matrix(rs, dt, (5, 3))]),
    "eigh": (jnp.linalg.eigh, lambda rs, dt: [spd_matrix(rs, dt, 5)]),                                  # syevd/heevd
    "eigvalsh": (jnp.linalg.eigvalsh, lambda rs, dt: [spd_matrix(rs, dt, 4, (2,))]),
    "eig": (jnp.linalg.eig, lambda rs, dt: [random_matrix(rs, dt, (5, 5))]),                              # geev
    "eig_nonfinite": (jnp.linalg.eig, lambda rs, dt: [np.full((2, 2), np.inf, dt)]),              # info -4
    "schur": (jsl.schur, lambda rs, dt: [random_matrix(rs, dt, (5, 5))]),                                 # gees
    "hessenberg": (lambda a: jsl.hessenberg(a, calc_q=True), lambda rs, dt: [random_matrix(rs, dt, (5, 5))]),  # gehrd
    "tridiagonal": (jax.lax.linalg.tridiagonal, lambda rs, dt: [spd_matrix(rs, dt, 5)]),                # sytrd/hetrd
    "tridiagonal_solve": (jax.lax.linalg.tridiagonal_solve, _tridiagonal),                        # gtsv
}


@pytest.mark.parametrize("dt", TYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", list(CASES))
def test_lapack_call_matches_xla_cpu_bit_for_bit(case, dt):
    fn, inputs = CASES[case]
    args = inputs(np.random.RandomState(len(case)), dt)
    jitted = jax.jit(fn)
    text = jitted.lower(*args).as_text(dialect="hlo")
    assert "lapack_" in text and "_ffi" in text
    want = jax.tree_util.tree_leaves(jitted(*args))
    got = hloexec.load(text).run(*args)
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)        # NaN where both report failure (info != 0)
