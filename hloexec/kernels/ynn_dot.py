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

Which kernel (`kernel_tile_k`): the cost model's choice as observed on this machine -- `tile_k = 4` for outputs of
at most 16 columns; from 64 rows on, by the columns n mod 64: 0 or more than 48 -> `tile_k = 1`, 32 -> `tile_k = 2`
(two lanes, k mod 2, lane 0 + lane 1, an odd last product added after), any other -> `tile_k = 4` (measured on n =
17-2000); fewer rows: `tile_k = 1`. The K blocking of the tile_k = 2 kernels beyond 512 and wide outputs of fewer
than 64 rows were not pinned down.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .scalar import fma_f32

BLOCK_K = 512  # contracting elements per block of the tile_k = 1 kernels
NARROW_N = 16  # outputs this narrow take the tile_k = 4 kernels
WIDE_M = 64  # from this many rows on, the columns mod 64 pick the kernel (kernel_tile_k)
WIDE_TILE_N = 64  # columns of the tile_k = 1 kernels' tile: a last partial tile of more than 48 columns keeps them


@njit(inline="always")
def _fold(acc, a, b, i, k):
    """acc[j] = fma(a[i, k], b[k, j], acc[j]) for every column j: lanes of independent chains, which LLVM
    vectorizes."""
    x = a[i, k]
    for j in range(acc.size):
        acc[j] = fma_f32(x, b[k, j], acc[j])


@njit(inline="always")
def _block(a, b, i, start, stop, tile_k, out):
    """out[:] = the products start..stop-1 of row i of `a` and the columns of `b`, summed as one block by a
    `tile_k` (1, 2 or 4) kernel."""
    N = out.size
    if tile_k == 1:
        out[:] = 0
        for k in range(start, stop):
            _fold(out, a, b, i, k)
        return
    main = stop - (stop - start) % tile_k
    lanes = np.zeros((tile_k, N), np.float32)
    for k in range(start, main, tile_k):
        for lane in range(tile_k):
            _fold(lanes[lane], a, b, i, k + lane)
    left = stop - main
    for j in range(N):
        if tile_k == 2:
            total = np.float32(lanes[0, j] + lanes[1, j])
        else:
            total = np.float32(np.float32(lanes[0, j] + lanes[1, j]) + np.float32(lanes[2, j] + lanes[3, j]))
        if left == 0:
            out[j] = total
            continue
        if left >= 2:  # two lanes of one product each, then one more by FMA from zero
            r = np.float32(np.float32(a[i, main] * b[main, j]) + np.float32(a[i, main + 1] * b[main + 1, j]))
            if left == 3:
                r = np.float32(r + np.float32(a[i, stop - 1] * b[stop - 1, j]))
        else:
            r = np.float32(a[i, main] * b[main, j])
        out[j] = r if main == start else np.float32(total + r)


@njit(parallel=True, cache=True)
def _matmul(a, b, out, tile_k, block):
    M, K = a.shape
    N = b.shape[1]
    for i in prange(M):
        part = np.empty(N, np.float32)
        for start in range(0, K, block):
            _block(a, b, i, start, min(K, start + block), tile_k, part)
            if start == 0:
                out[i, :] = part
            else:
                for j in range(N):
                    out[i, j] = np.float32(part[j] + out[i, j])
        if K == 0:
            out[i, :] = 0


def ynn_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[B, M, K] @ [B, K, N] of float32 arrays in YNNPACK's order (module docstring)."""
    B, M, K = a.shape
    N = b.shape[2]
    out = np.empty((B, M, N), np.float32)
    for batch in range(B):
        tile_k = kernel_tile_k(M, N)
        _matmul(
            np.ascontiguousarray(a[batch]),
            np.ascontiguousarray(b[batch]),
            out[batch],
            tile_k,
            BLOCK_K if tile_k == 1 else max(K, 1),
        )
    return out


def kernel_tile_k(m: int, n: int) -> int:
    """The tile_k of the kernel YNNPACK's cost model picks for an [m, K] x [K, n] f32 dot, as observed: 4 for
    n <= 16; from m = 64 rows on, by n mod 64: 1 for 0 or more than 48, 2 for 32, else 4; fewer rows: 1."""
    if n <= NARROW_N:
        return 4
    if m >= WIDE_M:
        rest = n % WIDE_TILE_N
        return 1 if rest == 0 or rest > WIDE_TILE_N - NARROW_N else 2 if rest == WIDE_TILE_N // 2 else 4
    return 1


def fma_chain_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[M, K] @ [K, N] of float32 arrays, each element one FMA chain over K in order from zero (XLA:CPU's
    convolutions, ops/contraction.py conv_core)."""
    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    _matmul(np.ascontiguousarray(a), np.ascontiguousarray(b), out, 1, max(a.shape[1], 1))
    return out
