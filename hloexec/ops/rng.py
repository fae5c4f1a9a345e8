"""Random numbers: rng-bit-generator (bit-exact with XLA:CPU), rng, rng-get-and-update-state.

* rng-bit-generator: XLA's algorithms from xla/hlo/builder/lib/prng.cc as expanded by
  RngBitGeneratorExpander: state[0] is the key; ThreeFry-2x32 (20 rounds) counts from state[1] over the
  shape (32-bit types: split into two halves on the first even dim and concatenated; 64-bit: x0 | x1<<32;
  <32-bit: the low bits of the 32-bit result); Philox-4x32 (10 rounds) uses a 128-bit counter
  (state[1], state[2]) for a u64[3] state, (state[1], state[0]) for u64[2]. rng_default is what
  XLA:CPU picks (Philox, measured). Output bits of float type are the unsigned bits bitcast.
* rng (rng_uniform / rng_normal): XLA:CPU expands these with a per-module seed; hloexec draws values of
  the right distribution from numpy (uniform in [a, b), normal(mu, sigma)); the bits differ from XLA.
* rng-get-and-update-state: returns the current u64[2] state and advances state[0] by `delta`
  (one state per instruction, starting at [0, 0]); XLA keeps a process-global state, so values differ.
(custom-call GetRngSeed, a fixed seed 0, is in custom_call/composite.py.)
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from .common import contig, int_attr, invalid, str_attr
from .registry import op

_U32 = np.uint32
_U64 = np.uint64
DEFAULT_ALGORITHM = "rng_philox"  # XLA:CPU's RngBitGeneratorExpander default (checked in tests)


def _rotl(v, d):
    return (v << _U32(d)) | (v >> _U32(32 - d))


def threefry2x32(x0, x1, k0, k1):
    """ThreeFry-2x32, 20 rounds, exactly as prng.cc (uint32 arrays, wrap-around)."""
    with np.errstate(over="ignore"):
        k0 = _U32(k0)
        k1 = _U32(k1)
        k2 = _U32(0x1BD11BDA) ^ k0 ^ k1
        ks = (k0, k1, k2)
        rot = (13, 15, 26, 6, 17, 29, 16, 24)
        x0 = (x0 + k0).astype(_U32)
        x1 = (x1 + k1).astype(_U32)
        for i in range(5):
            rs = rot[:4] if i % 2 == 0 else rot[4:]
            for r in rs:
                x0 = x0 + x1
                x1 = _rotl(x1, r)
                x1 = x0 ^ x1
            x0 = x0 + ks[(i + 1) % 3]
            x1 = x1 + ks[(i + 2) % 3] + _U32(i + 1)
    return x0, x1


def _split_shape(dims):
    """SplitShapeIntoHalves: (half_dims, split_dim) ; scalar -> ([1], 0)."""
    if not dims:
        return (1,), 0
    split = -1
    for i, d in enumerate(dims):
        if d % 2 == 0:
            split = i
            break
    if split == -1:
        split = int(np.argmax(dims))
    half = list(dims)
    half[split] = -(-dims[split] // 2)
    half.insert(split + 1, 1)
    return tuple(half), split


def _threefry_inputs(state1, dims):
    n = int(np.prod(dims, dtype=np.int64))
    with np.errstate(over="ignore"):
        u = (_U64(state1) + np.arange(n, dtype=_U64)).reshape(dims)
        new_state = _U64(state1) + _U64(n)
    return (u & _U64(0xFFFFFFFF)).astype(_U32), (u >> _U64(32)).astype(_U32), new_state


def threefry_bits(key, state1, dims, bits):
    k0, k1 = _U32(int(key) & 0xFFFFFFFF), _U32(int(key) >> 32)
    if bits == 64:
        x0, x1, ns = _threefry_inputs(state1, dims)
        y0, y1 = threefry2x32(x0, x1, k0, k1)
        return y0.astype(_U64) | (y1.astype(_U64) << _U64(32)), ns
    half, split = _split_shape(dims)
    x0, x1, ns = _threefry_inputs(state1, half)
    y0, y1 = threefry2x32(x0, x1, k0, k1)
    if not dims:
        out = y0.reshape(())
    else:
        cat = np.concatenate([y0, y1], axis=split + 1)
        rd = list(dims)
        rd[split] = half[split] * 2
        out = cat.reshape(rd)
        if rd[split] != dims[split]:
            out = out[tuple(slice(0, d) for d in dims)]
    if bits < 32:
        out = out.astype(np.dtype(f"u{bits // 8}"))
    return contig(out), ns


_PA, _PB = _U32(0x9E3779B9), _U32(0xBB67AE85)
_MA, _MB = _U64(0xD2511F53), _U64(0xCD9E8D57)


def philox4x32(c0, c1, c2, c3, k0, k1):
    with np.errstate(over="ignore"):
        k0, k1 = _U32(k0), _U32(k1)
        for _ in range(10):
            p0 = c0.astype(_U64) * _MA
            p1 = c2.astype(_U64) * _MB
            hi0, lo0 = (p0 >> _U64(32)).astype(_U32), (p0 & _U64(0xFFFFFFFF)).astype(_U32)
            hi1, lo1 = (p1 >> _U64(32)).astype(_U32), (p1 & _U64(0xFFFFFFFF)).astype(_U32)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
            k0 = _U32(k0 + _PA)
            k1 = _U32(k1 + _PB)
    return c0, c1, c2, c3


def _philox_blocks(key, lo, hi, nblocks):
    """Philox outputs for counters (lo, hi) + [0, nblocks), and the advanced 128-bit counter."""
    with np.errstate(over="ignore"):
        iota = np.arange(nblocks, dtype=_U64)
        new_lo = _U64(lo) + iota
        new_hi = np.where(new_lo < _U64(lo), _U64(hi) + _U64(1), _U64(hi)).astype(_U64)
        c0 = (new_lo & _U64(0xFFFFFFFF)).astype(_U32)
        c1 = (new_lo >> _U64(32)).astype(_U32)
        c2 = (new_hi & _U64(0xFFFFFFFF)).astype(_U32)
        c3 = (new_hi >> _U64(32)).astype(_U32)
        k0, k1 = int(key) & 0xFFFFFFFF, int(key) >> 32
        out = philox4x32(c0, c1, c2, c3, k0, k1)
        s_lo = _U64(lo) + _U64(nblocks)
        s_hi = _U64(hi) + _U64(1) if s_lo < _U64(lo) else _U64(hi)
    return out, (s_lo, s_hi)


def philox_bits(key, lo, hi, dims, bits):
    n = int(np.prod(dims, dtype=np.int64))
    if bits == 64:
        nb = -(-2 * n // 4)
        (b0, b1, b2, b3), st = _philox_blocks(key, lo, hi, nb)
        w0 = b0.astype(_U64) | (b1.astype(_U64) << _U64(32))
        w1 = b2.astype(_U64) | (b3.astype(_U64) << _U64(32))
        out = np.stack([w0, w1], axis=1).reshape(-1)[:n]
    else:
        nb = -(-n // 4)
        b, st = _philox_blocks(key, lo, hi, nb)
        out = np.stack(b, axis=1).reshape(-1)[:n]
        if bits < 32:
            out = out.astype(np.dtype(f"u{bits // 8}"))
    return contig(out.reshape(dims)), st


def rng_bit_generator(algorithm: str, state: np.ndarray, dims, out_dtype):
    out_dtype = np.dtype(out_dtype)
    bits = out_dtype.itemsize * 8
    state = np.asarray(state, _U64)
    key = state[0]
    alg = algorithm.lower()
    if alg in ("rng_default", "default"):
        alg = DEFAULT_ALGORITHM
    if alg in ("rng_three_fry", "three_fry"):
        out, ns = threefry_bits(key, state[1], tuple(dims), bits)
        new_state = state.copy()
        new_state[1] = ns
    elif alg in ("rng_philox", "philox"):
        if state.shape[0] >= 3:
            lo, hi = state[1], state[2]
        else:
            lo, hi = state[1], state[0]
        out, (s_lo, s_hi) = philox_bits(key, lo, hi, tuple(dims), bits)
        new_state = state.copy()
        new_state[1] = s_lo
        if state.shape[0] >= 3:
            new_state[2] = s_hi
    else:
        raise ValueError(f"unknown rng algorithm {algorithm!r}")
    if out.dtype != out_dtype:
        out = out.view(out_dtype) if out.dtype.itemsize == out_dtype.itemsize else out.astype(out_dtype)
    return new_state, contig(out)


@op(
    "rng-bit-generator",
    dtypes="u8-u64, s8-s64, f16, bf16, f32, f64",
    kernel="numpy",
    notes="ThreeFry / Philox exactly as XLA's RngBitGeneratorExpander (bit-exact with XLA:CPU); "
    "rng_default = Philox (XLA:CPU's choice).",
)
def prepare_rng_bit_generator(inst, ctx):
    alg = str_attr(inst, "algorithm", "rng_default")
    if (
        not inst.shape.is_tuple
        or len(inst.shape.tuple_shapes) != 2
        or not all(s.is_array for s in inst.shape.tuple_shapes)
    ):
        raise UnsupportedError("rng-bit-generator must return (state, bits)", inst)
    sshape, dshape = inst.shape.tuple_shapes
    dims, dt = tuple(dshape.dims), dshape.dtype
    if dt.itemsize * 8 not in (8, 16, 32, 64):
        raise UnsupportedError(f"rng-bit-generator of {dshape.element_type.name}", inst)
    state = inst.operands[0].shape if len(inst.operands) == 1 else None
    if state is None or not state.is_array or state.dtype != _U64 or state.rank != 1 or state.dims[0] < 2:
        # Refused when it runs, not here: XLA:CPU runs a module whose generator is dead (its compile drops it).
        written = state.to_text(layout=False) if state is not None else f"{len(inst.operands)} operands"
        refusal = UnsupportedError(
            f"rng-bit-generator of a state {written}: XLA's algorithms take u64[n >= 2] (XLA:CPU does not compile "
            "another)",
            inst,
        )

        def refuse(*operands):
            raise refusal

        return refuse

    def kernel(state):
        return rng_bit_generator(alg, state, dims, dt)

    return kernel


@op(
    "rng",
    dtypes="f16, bf16, f32, f64, s32, s64, u32, u64",
    kernel="numpy",
    notes="rng_uniform in [a, b) / rng_normal(mu, sigma) from numpy's PCG64 (seeded per instruction); "
    "bits differ from XLA:CPU's expansion.",
)
def prepare_rng(inst, ctx):
    dist = (str_attr(inst, "distribution") or "rng_uniform").lower()
    dims, dt = tuple(inst.shape.dims), inst.shape.dtype
    if any(o.shape.is_tuple or o.shape.rank for o in inst.operands[:2]):
        raise invalid(inst, f"bounds {[o.shape.to_text(False) for o in inst.operands[:2]]} that are not scalars")
    gen = np.random.default_rng(abs(hash(inst.name)) % (2**32))

    def kernel(a, b, *_shape):  # a third operand, the result's dims (from StableHLO), adds nothing
        a, b = np.asarray(a), np.asarray(b)
        if dist.endswith("uniform"):
            if dt.kind in "iu":
                lo, hi = int(a), int(b)
                r = gen.integers(lo, max(hi, lo + 1), size=dims, dtype=np.int64) if hi > lo else np.full(dims, lo)
            elif dt == np.bool_:
                r = gen.integers(0, 2, size=dims).astype(bool)
            else:
                fa, fb = float(a), float(b)
                r = fa + (fb - fa) * gen.random(size=dims)
                r = np.where(r >= fb, fa, r) if fb > fa else r
        elif dist.endswith("normal"):
            r = float(a) + float(b) * gen.standard_normal(size=dims)
        else:
            raise UnsupportedError(f"rng distribution {dist}", inst)
        return contig(np.asarray(r).astype(dt))

    return kernel


@op(
    "rng-get-and-update-state",
    dtypes="u64",
    kernel="numpy",
    notes="Per-instruction u64[2] state starting at [0, 0], advanced by `delta` on each call "
    "(XLA keeps a process-global state; values differ).",
)
def prepare_rng_get_and_update_state(inst, ctx):
    delta = int_attr(inst, "delta", 0)
    state = [0]

    def kernel():
        cur = np.array([state[0] & (2**64 - 1), 0], _U64)
        state[0] += delta
        return cur

    return kernel
