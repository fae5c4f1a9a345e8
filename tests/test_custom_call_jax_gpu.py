"""jax's GPU custom-calls (cuSOLVER, lu_pivots_to_permutation, threefry): jax lowers a function for CUDA
(no GPU needed to lower), hloexec runs that HLO and the result is compared with the same function on
XLA:CPU. The solver calls run the LAPACK routine of the CPU path, so most agree bit for bit; the SVDs (cuSOLVER
Jacobi vs LAPACK) agree in the singular values and in U diag(s) V^H."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hloexec
from op_helpers import random_matrix, spd_matrix

pytestmark = pytest.mark.xla
jax.config.update("jax_enable_x64", True)




def _cuda_hlo(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text(dialect="hlo")


def _targets(text):
    return {line.split('custom_call_target="')[1].split('"')[0] for line in text.splitlines()
            if 'custom_call_target="' in line}


EXACT = {   # function, inputs, the GPU targets its CUDA lowering holds
    "lu": (jax.lax.linalg.lu, lambda rs, dt: [random_matrix(rs, dt, (2, 5, 4))],
           {"cusolver_getrf_ffi", "cu_lu_pivots_to_permutation"}),
    "qr": (jnp.linalg.qr, lambda rs, dt: [random_matrix(rs, dt, (2, 5, 4))], {"cusolver_geqrf_ffi", "cusolver_orgqr_ffi"}),
    "cholesky": (jnp.linalg.cholesky, lambda rs, dt: [spd_matrix(rs, dt, 4, (2,))], {"cusolver_potrf_ffi"}),
    "eigh": (jnp.linalg.eigh, lambda rs, dt: [spd_matrix(rs, dt, 5)], {"cusolver_syevd_ffi"}),
    "tridiagonal": (jax.lax.linalg.tridiagonal, lambda rs, dt: [spd_matrix(rs, dt, 5)], {"cusolver_sytrd_ffi"}),
    "svd_qr_wide": (lambda a: jax.lax.linalg.svd(a, algorithm=jax.lax.linalg.SvdAlgorithm.QR),
                    lambda rs, dt: [random_matrix(rs, dt, (3, 5))], {"cusolver_gesvd_ffi"}),      # transposed=true
}


@pytest.mark.parametrize("dt", [np.float32, np.complex128], ids=["f32", "c128"])
@pytest.mark.parametrize("case", list(EXACT))
def test_gpu_solver_call_matches_the_cpu_path_bit_for_bit(case, dt):
    fn, inputs, targets = EXACT[case]
    args = inputs(np.random.RandomState(3), dt)
    text = _cuda_hlo(fn, *args)
    assert targets <= _targets(text)
    want = jax.tree_util.tree_leaves(jax.jit(fn)(*args))
    got = hloexec.load(text).run(*args)
    for g, w in zip(got if isinstance(got, tuple) else [got], want):
        np.testing.assert_array_equal(g, np.asarray(w))


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("dt", [np.float32, np.complex128], ids=["f32", "c128"])
def test_gpu_jacobi_svd_is_an_svd(dt, full):
    rs = np.random.RandomState(1)
    a = random_matrix(rs, dt, (3, 6, 4))
    text = _cuda_hlo(lambda x: jnp.linalg.svd(x, full_matrices=full), a)
    assert "cusolver_gesvdj_ffi" in _targets(text)
    u, s, vh = hloexec.load(text).run(a)
    want_s = np.asarray(jnp.linalg.svd(a, compute_uv=False))
    eps = np.finfo(np.dtype(dt).char.lower() if dt == np.complex128 else dt).eps * 20
    np.testing.assert_allclose(s, want_s, rtol=eps, atol=eps)
    k = s.shape[-1]
    rebuilt = (u[..., :k] * s[..., None, :]) @ vh[..., :k, :]
    np.testing.assert_allclose(rebuilt, a, rtol=10 * eps, atol=10 * eps)
    assert u.shape == (3, 6, 6 if full else 4) and vh.shape == (3, 4, 4)


def test_gpu_threefry_kernel_gives_jax_random_bits():
    fn = lambda seed: jax.random.bits(jax.random.key(seed), (3, 5))     # noqa: E731
    jax.config.update("jax_threefry_gpu_kernel_lowering", True)
    try:
        text = _cuda_hlo(fn, 7)
    finally:
        jax.config.update("jax_threefry_gpu_kernel_lowering", False)
    assert "cu_threefry2x32_ffi" in _targets(text)
    np.testing.assert_array_equal(hloexec.load(text).run(np.array(7, np.int64 if "s64[]" in text else np.int32)),
                                  np.asarray(jax.jit(fn)(7)))
