"""The GPU solver custom-calls of jax and XLA (`cusolver_*_ffi` / `hipsolver_*_ffi`, `__cusolver$cholesky`,
`cu_lu_pivots_to_permutation`): the same meaning as the CPU LAPACK calls (lapack.py), computed with the same
LAPACK routines. cuSOLVER's own results differ from these in rounding (and, for ties in pivoting, in the pivots).
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...kernels import lapack
from .lapack import (
    REAL,
    TYPES,
    _batch,
    _fortran,
    _operands,
    _out,
    _results,
    _returns,
    _typed,
    lapack_geqrf,
    lapack_getrf,
    lapack_orgqr,
    lapack_ormqr,
    potrf,
    syevd,
    sytrd,
)
from .registry import backend_config, custom_call, target_of


def _gpu(*names):
    """Register a GPU solver call under its CUDA and ROCm names (`cusolver_x` / `hipsolver_x`, ...)."""

    def deco(prepare):
        for name in names:
            for vendor in ("cu", "hip"):
                custom_call(name.format(vendor=vendor))(prepare)
        return prepare

    return deco


def _flag(cfg, key, inst, default=None) -> bool:
    v = cfg.get(key, default)
    if v is None:
        raise UnsupportedError(f"{target_of(inst)} without its {key!r} attribute", inst)
    return bool(v)


_gpu("{vendor}solver_getrf_ffi", "{vendor}blas_getrf_batched_ffi")(lapack_getrf)
_gpu("{vendor}solver_geqrf_ffi", "{vendor}blas_geqrf_batched_ffi")(lapack_geqrf)
_gpu("{vendor}solver_orgqr_ffi")(lapack_orgqr)
_gpu("{vendor}solver_ormqr_ffi")(lapack_ormqr)


@_gpu("{vendor}solver_potrf_ffi")
def gpu_potrf(inst, ctx):
    """jax's GPU Cholesky (cuSOLVER potrf), attribute lower: as lapack potrf on that triangle; (factor, info)."""
    return potrf(inst, "L" if _flag(backend_config(inst), "lower", inst) else "U")


@custom_call("__cusolver$cholesky", "__hipsolver$cholesky")
def xla_gpu_cholesky(inst, ctx):
    """XLA-GPU's Cholesky (GpusolverRewriter): backend_config CholeskyOptions (lower); a -> (the factor in that
    triangle, the other triangle as it was, as cuSOLVER's potrf; the workspace (zeros); s32 info per matrix,
    > 0 where the matrix is not positive definite: XLA then selects NaN)."""
    return potrf(inst, "L" if backend_config(inst).get("lower", False) else "U")


@_gpu("{vendor}solver_syevd_ffi")
def gpu_syevd(inst, ctx):
    """jax's GPU symmetric/Hermitian eigendecomposition (cuSOLVER syevd or syevj, attribute algorithm;
    lower): eigenvectors, ascending eigenvalues and info, computed with LAPACK's syevd/heevd (cuSOLVER's
    differ in rounding and in the eigenvectors' signs)."""
    return syevd(inst, "L" if _flag(backend_config(inst), "lower", inst) else "U", "V")


@_gpu("{vendor}solver_sytrd_ffi")
def gpu_sytrd(inst, ctx):
    """jax's GPU tridiagonal reduction (cuSOLVER sytrd, attribute lower): as lapack sytrd/hetrd."""
    return sytrd(inst, "L" if _flag(backend_config(inst), "lower", inst) else "U")


@_gpu("{vendor}solver_gesvd_ffi", "{vendor}solver_gesdd_ffi", "{vendor}solver_gesvdj_ffi", "{vendor}solver_gesvdp_ffi")
def gpu_svd(inst, ctx):
    """jax's GPU SVDs (cuSOLVER gesvd, gesvdj (Jacobi), gesvdp (polar); hipSOLVER gesdd), attributes
    full_matrices, compute_uv (and transposed for gesvd): a -> (a, singular values descending, U, V^H, info);
    gesvdj/gesvdp return V itself (jax transposes it), and gesvd with transposed=true (m < n) returns V^H in
    the third result and U in the fourth; without compute_uv those results are zeros. Computed with LAPACK's
    gesvd: cuSOLVER's algorithms differ in rounding and in the singular vectors' signs (phases)."""
    cfg = backend_config(inst)
    full = _flag(cfg, "full_matrices", inst, True)
    vectors = _flag(cfg, "compute_uv", inst, True)
    returns_v = target_of(inst).endswith(("gesvdj_ffi", "gesvdp_ffi"))
    swapped = bool(cfg.get("transposed", False))
    batch, ((m, n),) = _operands(inst, 2)
    t, dtype = _typed(inst)
    fn = lapack.routine(f"{t}gesvd")
    complex_ = t in "cz"
    results = _results(inst)
    k = min(m, n)
    if vectors:
        u_core, vt_core = (m, m if full else k), (n, n if full else k) if returns_v else (n if full else k, n)
        pair = (vt_core, u_core) if swapped else (u_core, vt_core)
    else:  # zeros of whatever matrix shapes the call gives them
        pair = tuple(dims[len(batch) :] for dims, _ in results[2:4]) if len(results) == 5 else ((m, m), (n, n))
    _returns(inst, batch, ((m, n), dtype), ((k,), TYPES[REAL[t]]), *((core, dtype) for core in pair), ((), np.int32))

    def kernel(a):
        aa, _ = _batch(a, 2)
        m, n = aa.shape[1:]
        k = min(m, n)
        job = ("A" if full else "S") if vectors else "N"
        ldvt = n if full else k
        extra = [np.zeros(max(5 * k, 1), TYPES[REAL[t]])] if complex_ else []
        query = np.zeros(1, dtype)
        fn(
            job,
            job,
            m,
            n,
            None,
            max(m, 1),
            None,
            None,
            max(m, 1),
            None,
            max(ldvt, 1),
            query,
            -1,
            *([None] * len(extra)),
            np.zeros(1, np.int32),
        )
        work = np.zeros(lapack.workspace(query), dtype)
        outs = ([], [], [], [], [])
        for i in range(aa.shape[0]):
            x, s = _fortran(aa[i]), np.zeros(k, TYPES[REAL[t]])
            u = np.zeros((m, m if full else k), dtype, order="F")
            vt = np.zeros((max(ldvt, 1), n), dtype, order="F")
            info = np.zeros(1, np.int32)
            fn(job, job, m, n, x, max(m, 1), s, u, max(m, 1), vt, max(ldvt, 1), work, work.size, *extra, info)
            second = vt[:ldvt].conj().T if returns_v else vt[:ldvt]
            pair = (second, u) if swapped else (u, second)
            for lst, v in zip(outs, (x, s, *pair, info[0])):
                lst.append(v)
        if not vectors:
            outs = (outs[0], outs[1], [], [], outs[4])
        return tuple(_out(v, sh, dt) for v, (sh, dt) in zip(outs, results))

    return kernel


@_gpu("{vendor}_lu_pivots_to_permutation")
def lu_pivots_to_permutation(inst, ctx):
    """jax's GPU lu_pivots_to_permutation: 0-based row swaps [..., k] -> the permutation [..., n] they make
    of 0..n-1 applied in order (swap i and pivots[i]; a pivot outside 0..n-1 is skipped)."""
    batch, _ = _operands(inst, 1)
    if inst.shape.is_tuple or inst.shape.rank != len(batch) + 1:
        raise UnsupportedError(
            f"{target_of(inst)} returns s32[..., n] (jaxlib's ABI), the call says {inst.shape.to_text(layout=False)}",
            inst,
        )
    ((shape, dtype),) = _results(inst)
    n = shape[-1]
    _returns(inst, batch, ((n,), np.int32))

    def kernel(pivots):
        pp, _ = _batch(pivots, 1)
        out = np.empty((pp.shape[0], n), np.int32)
        if out.size:  # an empty batch of a huge n: no n-long row to build (it may be past max_memory)
            out[:] = np.arange(n, dtype=np.int32)
        for b in range(pp.shape[0]):
            perm = out[b]
            for i, j in enumerate(pp[b]):
                if 0 <= j < n:
                    perm[i], perm[j] = perm[j], perm[i]
        return _out(list(out), shape, dtype)

    return kernel
