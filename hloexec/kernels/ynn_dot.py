"""f32 dots in YNNPACK's order: how XLA:CPU (jaxlib 0.10.2, AVX-512) sums the products of a dot it hands to
YNNPACK (a `dot` inside a `__ynn_fusion`), measured on this machine against XLA:CPU (docs/device-numerics-xla-cpu.md).

Every output element is its own sum (the M / N tiling changes nothing); along K:

* the `tile_k = 1` kernels take the contracting elements in blocks of 512, each block summed from zero and added
  to the sum of the blocks before it (`block + sum`: YNNPACK's kernels add C_in after their K loop); the
  `tile_k = 4` ones take all of K as one block (measured up to 2048);
* a block is summed by the kernel YNNPACK's cost model picked for the dot's shape: a `tile_k = 1` kernel folds
  the products in order, one FMA each; the `tile_k = 4` family folds the first 4q products into four lanes
  (product k into lane k mod 4, one FMA each), adds them as (lane 0 + lane 1) + (lane 2 + lane 3)
  (ynnpack/kernels/dot/generator/x86_fp32_k4.py, finalize_c_tile), and a remainder of two into two lanes added
  likewise, of one by one FMA: block = lanes4 + (lanes2 + rest).

Which family: `tile_k = 4` for outputs of at most 16 columns, else `tile_k = 1` -- the cost model's choice on the
shapes measured (N <= 16: tile_k = 4 at every M and K tried; N >= 64: tile_k = 1); between them, and for a few small
M x K, it picks otherwise or mixes kernels across column blocks, which this does not follow.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .scalar import fma_f32

BLOCK_K = 512      # contracting elements per block of the tile_k = 1 kernels
NARROW_N = 16       # outputs this narrow take the tile_k = 4 kernels


@njit(inline="always")
def _block(a, bt, i, j, start, stop, tile_k4):
    """The products start..stop-1 of row i of `a` and row j of `bt` (b transposed) summed as one block."""
    if not tile_k4:
        acc = np.float32(0)
        for k in range(start, stop):
            acc = fma_f32(a[i, k], bt[j, k], acc)
        return acc
    main = stop - (stop - start) % 4
    c0 = c1 = c2 = c3 = np.float32(0)
    for k in range(start, main, 4):
        c0 = fma_f32(a[i, k], bt[j, k], c0)
        c1 = fma_f32(a[i, k + 1], bt[j, k + 1], c1)
        c2 = fma_f32(a[i, k + 2], bt[j, k + 2], c2)
        c3 = fma_f32(a[i, k + 3], bt[j, k + 3], c3)
    total = np.float32(np.float32(c0 + c1) + np.float32(c2 + c3))
    if main == stop:
        return total
    left = stop - main
    if left >= 2:                       # two lanes of one product each
        rest = np.float32(a[i, main] * bt[j, main] + np.float32(a[i, main + 1] * bt[j, main + 1]))
        if left == 3:
            rest = np.float32(rest + np.float32(a[i, stop - 1] * bt[j, stop - 1]))
    else:
        rest = np.float32(a[i, main] * bt[j, main])
    return rest if main == start else np.float32(total + rest)


@njit(parallel=True, cache=True)
def _matmul(a, bt, out, tile_k4, block):
    M, K = a.shape
    N = bt.shape[0]
    for i in prange(M):
        for j in range(N):
            total = np.float32(0)
            for start in range(0, K, block):
                part = _block(a, bt, i, j, start, min(K, start + block), tile_k4)
                total = part if start == 0 else np.float32(part + total)
            out[i, j] = total


def ynn_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[B, M, K] @ [B, K, N] of float32 arrays in YNNPACK's order (module docstring)."""
    B, M, K = a.shape
    N = b.shape[2]
    out = np.empty((B, M, N), np.float32)
    for batch in range(B):
        tile_k4 = N <= NARROW_N
        _matmul(np.ascontiguousarray(a[batch]), np.ascontiguousarray(b[batch].T), out[batch], tile_k4,
                max(K, 1) if tile_k4 else BLOCK_K)
    return out


def fma_chain_matmul(a: np.ndarray, bt: np.ndarray) -> np.ndarray:
    """[M, K] @ [N, K].T of float32 arrays, each element one FMA chain over K in order from zero (XLA:CPU's
    convolutions, ops/contraction.py conv_core)."""
    out = np.empty((a.shape[0], bt.shape[0]), np.float32)
    _matmul(np.ascontiguousarray(a), np.ascontiguousarray(bt), out, False, max(a.shape[1], 1))
    return out
