"""jax's LAPACK custom-calls on the CPU (`lapack_<t><routine>_ffi`, jaxlib/cpu/lapack_kernels.cc); the GPU solver
calls of jax and XLA (gpu_solver.py) compute the same routines.

The CPU calls run the LAPACK routine they name, from the library jaxlib itself uses (scipy's), with jaxlib's
arguments and workspace sizes (kernels/lapack.py), so their results are XLA:CPU's bit for bit. Their ABI
(typed FFI): the matrices are the operand's last two dims (a column-major buffer, as the layout constraint
says: the logical matrix is what LAPACK sees), leading dims are batch; one-letter options (uplo, mode, side,
...) are ui8 attributes holding the character; results are a tuple in jaxlib's order, `info` an s32 per
matrix. Outputs LAPACK leaves unspecified (a destroyed input, eigenvectors not asked for) hold what it left
or zeros.
"""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import element_type_of
from ...kernels import lapack
from ..common import contig
from .registry import backend_config, custom_call, result_leaves, target_of

TYPES = {
    "s": np.dtype(np.float32),
    "d": np.dtype(np.float64),
    "c": np.dtype(np.complex64),
    "z": np.dtype(np.complex128),
}
REAL = {"s": "s", "d": "d", "c": "s", "z": "d"}


def _letter(dtype) -> str:
    for t, dt in TYPES.items():
        if np.dtype(dtype) == dt:
            return t
    raise KeyError(dtype)


def _char(cfg: dict, key: str, inst, default=None) -> str:
    """A one-letter option: a ui8 attribute holding the character (jaxlib's enums are chars)."""
    v = cfg.get(key, default)
    if v is None:
        raise UnsupportedError(f"{target_of(inst)} without its {key!r} attribute", inst)
    return chr(v) if isinstance(v, int) else str(v)


def _results(inst):
    return [(tuple(s.dims), s.dtype) for s in result_leaves(inst)]


# The routines write into buffers sized from the operands' dims, so a call whose shapes break jaxlib's ABI
# (a non-square matrix to potrf, a jpvt shorter than the columns, a missing operand) must be refused before
# LAPACK runs: it would write out of bounds, not raise.
def _operands(inst, *core_ranks: int) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """(shared batch dims, each operand's core dims) of a call taking arrays with these many trailing core
    dims each, checked: the operand count, arrays, ranks, one batch shape."""
    ops = inst.operands
    if len(ops) != len(core_ranks) or any(not o.shape.is_array for o in ops):
        raise UnsupportedError(
            f"{target_of(inst)} takes {len(core_ranks)} array operand(s) (jaxlib's ABI), the "
            f"call has {_shapes_text(o.shape for o in ops)}",
            inst,
        )
    batch, cores = None, []
    for o, core in zip(ops, core_ranks):
        dims = tuple(o.shape.dims)
        if len(dims) < core:
            raise UnsupportedError(
                f"{target_of(inst)}: operand {o.shape.to_text(layout=False)} has fewer than "
                f"its {core} core dims (jaxlib's ABI)",
                inst,
            )
        if batch is not None and dims[: len(dims) - core] != batch:
            raise UnsupportedError(
                f"{target_of(inst)}: operands {_shapes_text(o.shape for o in ops)} do not "
                f"share batch dims before {core_ranks} core dims (jaxlib's ABI)",
                inst,
            )
        batch = dims[: len(dims) - core]
        cores.append(dims[len(dims) - core :])
    return batch if batch is not None else (), cores


def _square(inst, dims: tuple[int, ...]) -> int:
    if dims[0] != dims[1]:
        raise UnsupportedError(f"{target_of(inst)} of a {dims[0]}x{dims[1]} matrix: it takes square ones", inst)
    return dims[0]


def _returns(inst, batch: tuple[int, ...], *results) -> None:
    """Check the call's result shapes against jaxlib's ABI: `results` are (core dims, dtype) per result."""
    want = [(tuple(batch) + tuple(core), np.dtype(dtype)) for core, dtype in results]
    if _results(inst) != want:
        text = ", ".join(f"{element_type_of(dt).name}[{','.join(map(str, dims))}]" for dims, dt in want)
        raise UnsupportedError(
            f"{target_of(inst)} of {_shapes_text(o.shape for o in inst.operands)} returns "
            f"({text}) by jaxlib's ABI, the call says {inst.shape.to_text(layout=False)}",
            inst,
        )


def _shapes_text(shapes) -> str:
    return "(" + ", ".join(s.to_text(layout=False) for s in shapes) + ")"


def _batch(x: np.ndarray, core: int):
    """The operand as (batch of matrices / vectors, batch shape): `core` trailing dims per item."""
    batch_shape = x.shape[: x.ndim - core]
    return x.reshape((-1,) + x.shape[x.ndim - core :]), batch_shape


def _fortran(m: np.ndarray) -> np.ndarray:
    """A column-major copy of one matrix: the buffer LAPACK works in place on (its logical view is the matrix)."""
    return np.array(m, order="F", copy=True)


def _out(items, shape, dtype):
    """A list of per-matrix results as one C-contiguous array of the result shape."""
    if not items:
        return np.zeros(shape, dtype)
    return contig(np.stack(items).astype(dtype, copy=False).reshape(shape))


def _typed(inst, routine_letter_from_operand: int = 0):
    """(type letter, dtype) of a LAPACK call from its operand's element type, checked against the target."""
    dtype = inst.operands[routine_letter_from_operand].shape.dtype
    try:
        return _letter(dtype), np.dtype(dtype)
    except KeyError:
        raise UnsupportedError(f"{target_of(inst)} on {dtype}", inst) from None


def _register(routine: str, letters="sdcz", names=None):
    """Register `lapack_<t><routine>_ffi` for each type letter (names: per-letter routine names when they differ,
    e.g. orgqr/ungqr)."""

    def deco(prepare):
        for t in letters:
            name = (names or {}).get(t, routine)
            custom_call(f"lapack_{t}{name}_ffi")(prepare)
        return prepare

    return deco


# -- triangular solve, LU, QR ------------------------------------------------------------------------
@_register("trsm")
def lapack_trsm(inst, ctx):
    """BLAS ?trsm: operands (a, b), attributes side, uplo, trans_x, diag (characters); result b_out = x solving
    op(a) x = b (side L) or x op(a) = b (side R), op = a, a^T or a^H (trans_x N/T/C), only a's `uplo` triangle
    read, a unit diagonal with diag U."""
    cfg = backend_config(inst)
    side, uplo = _char(cfg, "side", inst), _char(cfg, "uplo", inst)
    trans, diag = _char(cfg, "trans_x", inst), _char(cfg, "diag", inst)
    batch, (a_dims, b_dims) = _operands(inst, 2, 2)
    t, dtype = _typed(inst, 1)
    if _square(inst, a_dims) != b_dims[0 if side == "L" else 1]:
        raise UnsupportedError(f"{target_of(inst)}: a is {a_dims}, b {b_dims} with side {side}", inst)
    _returns(inst, batch, (b_dims, dtype))
    fn = lapack.routine(f"{t}trsm")
    ((shape, out_dtype),) = _results(inst)

    def kernel(a, b):
        aa, _ = _batch(a, 2)
        bb, _ = _batch(b, 2)
        m, n = bb.shape[1:]
        lda = m if side == "L" else n
        outs = []
        for i in range(bb.shape[0]):
            y = _fortran(bb[i])
            fn(
                side,
                uplo,
                trans,
                diag,
                m,
                n,
                np.ones(1, dtype),
                _fortran(aa[i if aa.shape[0] > 1 else 0]),
                max(lda, 1),
                y,
                max(m, 1),
            )
            outs.append(y)
        return _out(outs, shape, out_dtype)

    return kernel


@_register("getrf")
def lapack_getrf(inst, ctx):
    """?getrf, LU with partial pivoting: a -> (LU packed in one matrix, s32 pivots (1-based, min(m, n) per
    matrix), s32 info: > 0 when U has an exact zero pivot)."""
    batch, ((m, n),) = _operands(inst, 2)
    t, dtype = _typed(inst)
    _returns(inst, batch, ((m, n), dtype), ((min(m, n),), np.int32), ((), np.int32))
    fn = lapack.routine(f"{t}getrf")
    (lu_shape, lu_t), (piv_shape, piv_t), (info_shape, info_t) = _results(inst)

    def kernel(a):
        aa, _ = _batch(a, 2)
        m, n = aa.shape[1:]
        lus, pivs, infos = [], [], []
        for i in range(aa.shape[0]):
            x, ipiv, info = _fortran(aa[i]), np.zeros(min(m, n), np.int32), np.zeros(1, np.int32)
            fn(m, n, x, max(m, 1), ipiv, info)
            lus.append(x), pivs.append(ipiv), infos.append(info[0])
        return _out(lus, lu_shape, lu_t), _out(pivs, piv_shape, piv_t), _out(infos, info_shape, info_t)

    return kernel


@_register("geqrf")
def lapack_geqrf(inst, ctx):
    """?geqrf, Householder QR: a -> (R above the diagonal and the reflectors below it, tau (min(m, n)))."""
    batch, ((m, n),) = _operands(inst, 2)
    t, dtype = _typed(inst)
    _returns(inst, batch, ((m, n), dtype), ((min(m, n),), dtype))
    fn = lapack.routine(f"{t}geqrf")
    (qr_shape, qr_t), (tau_shape, tau_t) = _results(inst)

    def kernel(a):
        aa, _ = _batch(a, 2)
        m, n = aa.shape[1:]
        query = np.zeros(1, dtype)
        fn(m, n, None, max(m, 1), None, query, -1, np.zeros(1, np.int32))
        work = np.zeros(lapack.workspace(query), dtype)
        qrs, taus = [], []
        for i in range(aa.shape[0]):
            x, tau = _fortran(aa[i]), np.zeros(min(m, n), dtype)
            fn(m, n, x, max(m, 1), tau, work, work.size, np.zeros(1, np.int32))
            qrs.append(x), taus.append(tau)
        return _out(qrs, qr_shape, qr_t), _out(taus, tau_shape, tau_t)

    return kernel


@_register("geqp3")
def lapack_geqp3(inst, ctx):
    """?geqp3, QR with column pivoting: (a, jpvt s32 (columns fixed first where non-zero, 1-based)) -> (R and
    reflectors, the column permutation (1-based), tau)."""
    batch, ((m, n), jpvt) = _operands(inst, 2, 1)
    t, dtype = _typed(inst)
    if jpvt != (n,) or inst.operands[1].shape.dtype != np.int32:
        raise UnsupportedError(f"{target_of(inst)}: jpvt must be s32[..., {n}] for a {m}x{n} matrix", inst)
    _returns(inst, batch, ((m, n), dtype), ((n,), np.int32), ((min(m, n),), dtype))
    fn = lapack.routine(f"{t}geqp3")
    complex_ = dtype.kind == "c"
    (qr_shape, qr_t), (p_shape, p_t), (tau_shape, tau_t) = _results(inst)

    def kernel(a, jpvt):
        aa, _ = _batch(a, 2)
        jj, _ = _batch(jpvt, 1)
        m, n = aa.shape[1:]
        rwork = [np.zeros(max(2 * n, 1), TYPES[REAL[t]])] if complex_ else []
        query = np.zeros(1, dtype)
        fn(m, n, None, max(m, 1), None, None, query, -1, *rwork, np.zeros(1, np.int32))
        work = np.zeros(lapack.workspace(query), dtype)
        qrs, perms, taus = [], [], []
        for i in range(aa.shape[0]):
            x, p, tau = _fortran(aa[i]), jj[i].astype(np.int32), np.zeros(min(m, n), dtype)
            fn(m, n, x, max(m, 1), p, tau, work, work.size, *rwork, np.zeros(1, np.int32))
            qrs.append(x), perms.append(p), taus.append(tau)
        return _out(qrs, qr_shape, qr_t), _out(perms, p_shape, p_t), _out(taus, tau_shape, tau_t)

    return kernel


@_register("orgqr", names={"c": "ungqr", "z": "ungqr"})
def lapack_orgqr(inst, ctx):
    """?orgqr / ?ungqr (jax's householder_product): (reflectors a [m, n], tau [k]) -> Q [m, n], the first n
    columns of the product of the k reflectors."""
    batch, ((m, n), (k,)) = _operands(inst, 2, 1)
    t, dtype = _typed(inst)
    if not m >= n >= k:
        raise UnsupportedError(
            f"{target_of(inst)} of a {m}x{n} matrix and {k} reflectors: LAPACK needs rows >= columns >= reflectors",
            inst,
        )
    _returns(inst, batch, ((m, n), dtype))
    fn = lapack.routine(f"{t}{'ungqr' if t in 'cz' else 'orgqr'}")
    ((q_shape, q_t),) = _results(inst)

    def kernel(a, tau):
        aa, _ = _batch(a, 2)
        tt, _ = _batch(tau, 1)
        m, n = aa.shape[1:]
        k = tt.shape[1]
        query = np.zeros(1, dtype)
        fn(m, n, k, None, max(m, 1), None, query, -1, np.zeros(1, np.int32))
        work = np.zeros(lapack.workspace(query), dtype)
        qs = []
        for i in range(aa.shape[0]):
            x = _fortran(aa[i])
            fn(m, n, k, x, max(m, 1), np.ascontiguousarray(tt[i]), work, work.size, np.zeros(1, np.int32))
            qs.append(x)
        return _out(qs, q_shape, q_t)

    return kernel


@_register("ormqr", names={"c": "unmqr", "z": "unmqr"})
def lapack_ormqr(inst, ctx):
    """?ormqr / ?unmqr: (reflectors a, tau, c), attributes left and transpose (booleans) -> Q c, Q^T c (Q^H),
    c Q or c Q^T (Q^H), Q the product of the reflectors."""
    batch, ((nq, ka), (k,), (m, n)) = _operands(inst, 2, 1, 2)
    t, dtype = _typed(inst, 2)
    fn = lapack.routine(f"{t}{'unmqr' if t in 'cz' else 'ormqr'}")
    cfg = backend_config(inst)
    side = "L" if cfg.get("left", True) else "R"
    if nq != (m if side == "L" else n) or not ka >= k or k > nq:
        raise UnsupportedError(
            f"{target_of(inst)}: reflectors {nq}x{ka}, {k} of them, do not apply to a {m}x{n} "
            f"matrix from the {'left' if side == 'L' else 'right'}",
            inst,
        )
    _returns(inst, batch, ((m, n), dtype))
    trans = ("C" if t in "cz" else "T") if cfg.get("transpose", False) else "N"
    ((c_shape, c_t),) = _results(inst)

    def kernel(a, tau, c):
        aa, _ = _batch(a, 2)
        tt, _ = _batch(tau, 1)
        cc, _ = _batch(c, 2)
        m, n = cc.shape[1:]
        k = tt.shape[1]
        lda = max(aa.shape[1] if side == "L" else n, 1)
        query = np.zeros(1, dtype)
        fn(side, trans, m, n, k, None, lda, None, None, max(m, 1), query, -1, np.zeros(1, np.int32))
        work = np.zeros(lapack.workspace(query), dtype)
        outs = []
        for i in range(cc.shape[0]):
            y = _fortran(cc[i])
            fn(
                side,
                trans,
                m,
                n,
                k,
                _fortran(aa[i]),
                lda,
                np.ascontiguousarray(tt[i]),
                y,
                max(m, 1),
                work,
                work.size,
                np.zeros(1, np.int32),
            )
            outs.append(y)
        return _out(outs, c_shape, c_t)

    return kernel


@_register("potrf")
def lapack_potrf(inst, ctx):
    """?potrf, Cholesky: a -> (the factor in the `uplo` triangle, the other triangle as it was; s32 info: > 0
    when a is not positive definite, the factor then partial)."""
    uplo = _char(backend_config(inst), "uplo", inst)
    return potrf(inst, uplo)


def potrf(inst, uplo: str):
    batch, (a_dims,) = _operands(inst, 2)
    n = _square(inst, a_dims)
    t, dtype = _typed(inst)
    fn = lapack.routine(f"{t}potrf")
    results = _results(inst)
    workspace = [(dims[len(batch) :], dt) for dims, dt in results[1:-1]]  # __cusolver$cholesky's, any shape
    _returns(inst, batch, ((n, n), dtype), *workspace, ((), np.int32))
    (l_shape, l_t), (info_shape, info_t) = results[0], results[-1]

    def kernel(a):
        aa, _ = _batch(a, 2)
        n = aa.shape[-1]
        ls, infos = [], []
        for i in range(aa.shape[0]):
            x, info = _fortran(aa[i]), np.zeros(1, np.int32)
            fn(uplo, n, x, max(n, 1), info)
            ls.append(x), infos.append(info[0])
        out = [_out(ls, l_shape, l_t)]
        out += [np.zeros(s, dt) for s, dt in results[1:-1]]  # __cusolver$cholesky's workspace
        return (*out, _out(infos, info_shape, info_t)) if len(results) > 1 else out[0]

    return kernel


# -- SVD, eigenvalues, Schur, Hessenberg, tridiagonal -----------------------------------------------------
@_register("gesdd")
def lapack_gesdd(inst, ctx):
    """?gesdd, SVD by divide and conquer: a -> (a as LAPACK leaves it, singular values (descending), U, V^H,
    s32 info); mode A (full U, V^H), S (min(m, n) columns of U, rows of V^H) or N (none)."""
    return _svd(inst, "gesdd")


@_register("gesvd")
def lapack_gesvd(inst, ctx):
    """?gesvd, SVD by QR iteration (jax's SvdAlgorithm.QR): as gesdd, with LAPACK's gesvd."""
    return _svd(inst, "gesvd")


def _svd(inst, routine):
    mode = _char(backend_config(inst), "mode", inst)
    if mode not in "ASN":
        raise UnsupportedError(f"{target_of(inst)} with mode {mode!r}", inst)
    batch, ((m, n),) = _operands(inst, 2)
    t, dtype = _typed(inst)
    k = min(m, n)
    res = _results(inst)
    if mode == "N" and len(res) == 5:  # U and V^H are not computed: any matrix shape the call gives them
        u_core, vt_core = (dims[len(batch) :] for dims, _ in res[2:4])
    else:
        u_core, vt_core = {"A": ((m, m), (n, n)), "S": ((m, k), (k, n))}.get(mode, ((m, m), (n, n)))
    _returns(inst, batch, ((m, n), dtype), ((k,), TYPES[REAL[t]]), (u_core, dtype), (vt_core, dtype), ((), np.int32))
    fn = lapack.routine(f"{t}{routine}")
    complex_ = t in "cz"
    (a_shape, a_t), (s_shape, s_t), (u_shape, u_t), (vt_shape, vt_t), (info_shape, info_t) = _results(inst)
    u_dims, vt_dims = u_shape[-2:], vt_shape[-2:]

    def kernel(a):
        aa, _ = _batch(a, 2)
        m, n = aa.shape[1:]
        k = min(m, n)
        ldu, ldvt = max(m, 1), max(vt_dims[0], 1)
        query_ldvt = max(n if mode == "A" else k, 1)
        if routine == "gesdd":
            rwork = max(5 * k * k + 5 * k, 2 * max(m, n) * k + 2 * k * k + k) if mode != "N" else 7 * k
            extra = ([np.zeros(max(rwork, 1), TYPES[REAL[t]])] if complex_ else []) + [
                np.zeros(max(8 * k, 1), np.int32)
            ]
            head = (mode,)
        else:
            extra = [np.zeros(max(5 * k, 1), TYPES[REAL[t]])] if complex_ else []
            head = (mode, mode)
        query = np.zeros(1, dtype)
        fn(
            *head,
            m,
            n,
            None,
            max(m, 1),
            None,
            None,
            ldu,
            None,
            query_ldvt,
            query,
            -1,
            *([None] * len(extra)),
            np.zeros(1, np.int32),
        )
        work = np.zeros(lapack.workspace(query), dtype)
        outs = ([], [], [], [], [])
        for i in range(aa.shape[0]):
            x, s = _fortran(aa[i]), np.zeros(k, TYPES[REAL[t]])
            u = np.zeros(u_dims if 0 not in u_dims else (1, 1), dtype, order="F")
            vt = np.zeros(vt_dims if 0 not in vt_dims else (1, 1), dtype, order="F")
            info = np.zeros(1, np.int32)
            fn(*head, m, n, x, max(m, 1), s, u, ldu, vt, ldvt, work, work.size, *extra, info)
            for lst, v in zip(outs, (x, s, u[: u_dims[0], : u_dims[1]], vt[: vt_dims[0], : vt_dims[1]], info[0])):
                lst.append(v)
        return tuple(_out(v, sh, dt) for v, (sh, dt) in zip(outs, _results(inst)))

    return kernel


@_register("syevd", letters="sd")
@_register("heevd", letters="cz")
def lapack_syevd(inst, ctx):
    """?syevd / ?heevd, symmetric (Hermitian) eigendecomposition by divide and conquer: a (its `uplo`
    triangle read) -> (eigenvectors as columns with mode V, else a as LAPACK leaves it; eigenvalues
    ascending; s32 info), with jaxlib's fixed workspace sizes."""
    cfg = backend_config(inst)
    return syevd(inst, _char(cfg, "uplo", inst), _char(cfg, "mode", inst))


def syevd(inst, uplo: str, mode: str):
    batch, (a_dims,) = _operands(inst, 2)
    n = _square(inst, a_dims)
    t, dtype = _typed(inst)
    _returns(inst, batch, ((n, n), dtype), ((n,), TYPES[REAL[t]]), ((), np.int32))
    complex_ = t in "cz"
    fn = lapack.routine(f"{t}{'heevd' if complex_ else 'syevd'}")
    (v_shape, v_t), (w_shape, w_t), (info_shape, info_t) = _results(inst)

    def kernel(a):
        aa, _ = _batch(a, 2)
        n = aa.shape[-1]
        vectors = mode == "V"
        if complex_:
            lwork = 2 * n + n * n if vectors else n + 1
            lrwork = 1 + 5 * n + 2 * n * n if vectors else max(n, 1)
        else:
            lwork = 1 + 6 * n + 2 * n * n if vectors else 2 * n + 1
        liwork = 3 + 5 * n if vectors else 1
        work, iwork = np.zeros(lwork, dtype), np.zeros(liwork, np.int32)
        rwork = [np.zeros(lrwork, TYPES[REAL[t]]), lrwork] if complex_ else []
        vs, ws, infos = [], [], []
        for i in range(aa.shape[0]):
            x, w, info = _fortran(aa[i]), np.zeros(n, TYPES[REAL[t]]), np.zeros(1, np.int32)
            fn(mode, uplo, n, x, max(n, 1), w, work, lwork, *rwork, iwork, liwork, info)
            vs.append(x), ws.append(w), infos.append(info[0])
        return _out(vs, v_shape, v_t), _out(ws, w_shape, w_t), _out(infos, info_shape, info_t)

    return kernel


def unpack_eigenvectors(wi: np.ndarray, packed: np.ndarray) -> np.ndarray:
    """LAPACK's real packing of complex eigenvectors (a conjugate pair's real and imaginary parts in two
    consecutive columns) as complex columns, as jaxlib's UnpackEigenvectors does."""
    n = packed.shape[0]
    out = packed.astype(np.result_type(packed.dtype, np.complex64))
    j = 0
    while j < n:
        if wi[j] == 0 or np.isnan(wi[j]) or j + 1 >= n:
            j += 1
            continue
        re, im = packed[:, j], packed[:, j + 1]
        out[:, j], out[:, j + 1] = re + 1j * im, re - 1j * im
        j += 2
    return out


@_register("geev")
def lapack_geev(inst, ctx):
    """?geev, general eigendecomposition: a -> real types (eigenvalues' real parts, imaginary parts, left and
    right eigenvectors as complex columns, s32 info), complex types (eigenvalues, left, right, info);
    compute_left / compute_right N or V. A matrix with a non-finite element is not decomposed: info = -4
    (jaxlib's check), the other results zeros."""
    cfg = backend_config(inst)
    jobvl, jobvr = _char(cfg, "compute_left", inst), _char(cfg, "compute_right", inst)
    batch, (a_dims,) = _operands(inst, 2)
    n = _square(inst, a_dims)
    t, dtype = _typed(inst)
    complex_ = t in "cz"
    vectors_t = dtype if complex_ else np.result_type(dtype, np.complex64)
    values = [((n,), dtype)] * (1 if complex_ else 2)
    _returns(inst, batch, *values, ((n, n), vectors_t), ((n, n), vectors_t), ((), np.int32))
    fn = lapack.routine(f"{t}geev")
    results = _results(inst)

    def kernel(a):
        aa, _ = _batch(a, 2)
        n = aa.shape[-1]
        query = np.zeros(1, dtype)
        rwork = [np.zeros(max(2 * n, 1), TYPES[REAL[t]])] if complex_ else []
        if complex_:
            fn(
                jobvl,
                jobvr,
                n,
                None,
                max(n, 1),
                None,
                None,
                max(n, 1),
                None,
                max(n, 1),
                query,
                -1,
                *rwork,
                np.zeros(1, np.int32),
            )
        else:
            fn(
                jobvl,
                jobvr,
                n,
                None,
                max(n, 1),
                None,
                None,
                None,
                max(n, 1),
                None,
                max(n, 1),
                query,
                -1,
                np.zeros(1, np.int32),
            )
        work = np.zeros(lapack.workspace(query), dtype)
        outs = [[] for _ in results]
        for i in range(aa.shape[0]):
            x = _fortran(aa[i])
            info = np.zeros(1, np.int32)
            vl, vr = np.zeros((n, n), dtype, order="F"), np.zeros((n, n), dtype, order="F")
            if not np.all(np.isfinite(x)):
                info[0] = -4
                values = [np.zeros(n, dtype)] * (1 if complex_ else 2)
            elif complex_:
                w = np.zeros(n, dtype)
                fn(jobvl, jobvr, n, x, max(n, 1), w, vl, max(n, 1), vr, max(n, 1), work, work.size, *rwork, info)
                values = [w]
            else:
                wr, wi = np.zeros(n, dtype), np.zeros(n, dtype)
                fn(jobvl, jobvr, n, x, max(n, 1), wr, wi, vl, max(n, 1), vr, max(n, 1), work, work.size, info)
                values = [wr, wi]
                if info[0] == 0:
                    vl, vr = unpack_eigenvectors(wi, vl), unpack_eigenvectors(wi, vr)
            for lst, v in zip(outs, [*values, vl, vr, info[0]]):
                lst.append(v)
        return tuple(_out(v, sh, dt) for v, (sh, dt) in zip(outs, results))

    return kernel


@_register("gees")
def lapack_gees(inst, ctx):
    """?gees, Schur decomposition: a -> (T, Schur vectors (mode V), eigenvalues (real: real and imaginary
    parts), s32 number of selected eigenvalues (0: no sorting), s32 info); sort must be N (jaxlib's)."""
    cfg = backend_config(inst)
    mode, sort = _char(cfg, "mode", inst), _char(cfg, "sort", inst)
    if sort != "N":
        raise UnsupportedError(f"{target_of(inst)} with sort={sort!r} (jaxlib implements only N)", inst)
    batch, (a_dims,) = _operands(inst, 2)
    n = _square(inst, a_dims)
    t, dtype = _typed(inst)
    complex_ = t in "cz"
    values = [((n,), dtype)] * (1 if complex_ else 2)
    _returns(inst, batch, ((n, n), dtype), ((n, n), dtype), *values, ((), np.int32), ((), np.int32))
    fn = lapack.routine(f"{t}gees")
    results = _results(inst)

    def kernel(a):
        aa, _ = _batch(a, 2)
        n = aa.shape[-1]
        rwork = [np.zeros(max(n, 1), TYPES[REAL[t]])] if complex_ else []
        nvalues = 1 if complex_ else 2
        query = np.zeros(1, dtype)
        fn(
            mode,
            sort,
            None,
            n,
            None,
            max(n, 1),
            None,
            *([None] * nvalues),
            None,
            max(n, 1),
            query,
            -1,
            *([None] * len(rwork)),
            None,
            np.zeros(1, np.int32),
        )
        work = np.zeros(lapack.workspace(query), dtype)
        outs = [[] for _ in results]
        for i in range(aa.shape[0]):
            x, vs = _fortran(aa[i]), np.zeros((n, n), dtype, order="F")
            values = [np.zeros(n, dtype) for _ in range(nvalues)]
            sdim, info = np.zeros(1, np.int32), np.zeros(1, np.int32)
            fn(mode, sort, None, n, x, max(n, 1), sdim, *values, vs, max(n, 1), work, work.size, *rwork, None, info)
            for lst, v in zip(outs, [x, vs, *values, sdim[0], info[0]]):
                lst.append(v)
        return tuple(_out(v, sh, dt) for v, (sh, dt) in zip(outs, results))

    return kernel


@_register("gehrd")
def lapack_gehrd(inst, ctx):
    """?gehrd, Hessenberg reduction between rows/columns low..high (1-based attributes): a -> (H above the
    first subdiagonal and the reflectors below it, tau (n - 1), s32 info)."""
    cfg = backend_config(inst)
    low, high = int(cfg.get("low", 1)), cfg.get("high")
    batch, (a_dims,) = _operands(inst, 2)
    n = _square(inst, a_dims)
    t, dtype = _typed(inst)
    if not 1 <= low <= max(n, 1) or not (high is None or min(low, n) <= int(high) <= n):
        raise UnsupportedError(f"{target_of(inst)}: low={low}, high={high} outside 1..{n}", inst)
    _returns(inst, batch, ((n, n), dtype), ((max(n - 1, 0),), dtype), ((), np.int32))
    fn = lapack.routine(f"{t}gehrd")
    (h_shape, h_t), (tau_shape, tau_t), (info_shape, info_t) = _results(inst)

    def kernel(a):
        aa, _ = _batch(a, 2)
        m, n = aa.shape[1:]
        ihi = n if high is None else int(high)
        query = np.zeros(1, dtype)
        fn(n, low, ihi, None, max(m, 1), None, query, -1, np.zeros(1, np.int32))
        work = np.zeros(lapack.workspace(query), dtype)
        hs, taus, infos = [], [], []
        for i in range(aa.shape[0]):
            x, tau, info = _fortran(aa[i]), np.zeros(max(n - 1, 1), dtype), np.zeros(1, np.int32)
            fn(n, low, ihi, x, max(m, 1), tau, work, work.size, info)
            hs.append(x), taus.append(tau[: max(n - 1, 0)]), infos.append(info[0])
        return _out(hs, h_shape, h_t), _out(taus, tau_shape, tau_t), _out(infos, info_shape, info_t)

    return kernel


@_register("sytrd", letters="sd")
@_register("hetrd", letters="cz")
def lapack_sytrd(inst, ctx):
    """?sytrd / ?hetrd, tridiagonal reduction of a symmetric (Hermitian) matrix's `uplo` triangle: a -> (the
    reduced matrix with the reflectors, diagonal, off-diagonal (real), tau, s32 info)."""
    uplo = _char(backend_config(inst), "uplo", inst)
    return sytrd(inst, uplo)


def sytrd(inst, uplo: str):
    batch, (a_dims,) = _operands(inst, 2)
    n = _square(inst, a_dims)
    t, dtype = _typed(inst)
    real = TYPES[REAL[t]]
    _returns(
        inst, batch, ((n, n), dtype), ((n,), real), ((max(n - 1, 0),), real), ((max(n - 1, 0),), dtype), ((), np.int32)
    )
    fn = lapack.routine(f"{t}{'hetrd' if t in 'cz' else 'sytrd'}")
    results = _results(inst)

    def kernel(a):
        aa, _ = _batch(a, 2)
        m, n = aa.shape[1:]
        query = np.zeros(1, dtype)
        fn("L", n, None, max(m, 1), None, None, None, query, -1, np.zeros(1, np.int32))
        work = np.zeros(lapack.workspace(query), dtype)
        outs = [[] for _ in results]
        for i in range(aa.shape[0]):
            x, d, e = _fortran(aa[i]), np.zeros(max(n, 1), real), np.zeros(max(n - 1, 1), real)
            tau, info = np.zeros(max(n - 1, 1), dtype), np.zeros(1, np.int32)
            fn(uplo, n, x, max(m, 1), d, e, tau, work, work.size, info)
            for lst, v in zip(outs, [x, d[:n], e[: n - 1], tau[: n - 1], info[0]]):
                lst.append(v)
        return tuple(_out(v, sh, dt) for v, (sh, dt) in zip(outs, results))

    return kernel


@_register("gtsv")
def lapack_gtsv(inst, ctx):
    """?gtsv, tridiagonal solve with partial pivoting: (dl, d, du, b) -> (the factorization's dl, d, du, the
    solution x, s32 info); dl[0] and du[n-1] are not read (jax's layout: all three of length n)."""
    batch, (dl, d, du, (n, nrhs)) = _operands(inst, 1, 1, 1, 2)
    if not dl == d == du == (n,):
        raise UnsupportedError(f"{target_of(inst)}: the three diagonals must have the {n} rows of b", inst)
    t, dtype = _typed(inst)
    _returns(inst, batch, ((n,), dtype), ((n,), dtype), ((n,), dtype), ((n, nrhs), dtype), ((), np.int32))
    fn = lapack.routine(f"{t}gtsv")
    results = _results(inst)

    def kernel(dl, d, du, b):
        bb, _ = _batch(b, 2)
        dls, ds, dus = (_batch(v, 1)[0] for v in (dl, d, du))
        n, nrhs = bb.shape[1:]
        outs = [[] for _ in results]
        for i in range(bb.shape[0]):
            l, dd, u, x = dls[i].copy(), ds[i].copy(), dus[i].copy(), _fortran(bb[i])
            info = np.zeros(1, np.int32)
            fn(n, nrhs, l[1:], dd, u, x, max(n, 1), info)
            for lst, v in zip(outs, [l, dd, u, x, info[0]]):
                lst.append(v)
        return tuple(_out(v, sh, dt) for v, (sh, dt) in zip(outs, results))

    return kernel
