"""f32 convolutions in XLA:CPU's summation orders (jaxlib 0.10.2, x86-64), measured on this machine against
XLA:CPU (docs/device-numerics-xla-cpu.md). XLA:CPU runs a convolution in its runtime (Eigen's tensor contraction
of the input's patches with the kernel); each output element sums the products of one patch (window positions
in row-major order, input features innermost) with the kernel:

* more than one output feature: one FMA chain per element, from zero, in that order (`fma_chain_matmul`);
* one output feature (a matrix-vector product): `matvec`. The patch is cut into blocks of K (Eigen's
  "shard by inner dim": block size max(96, ceil(K / 2) rounded up to 8) -- 12 packets of 8 or half of K on this
  2-core machine), whose sums are added in order. Within a block: its first 16q products fold into 8 lanes by FMA
  (product k into lane k mod 8); a next full 8 and a next full 4 products are each their own vector, from zero;
  each vector is reduced by adding neighbours first (8 lanes: (0+1) + (4+5), (2+3) + (6+7), then the two; 4
  lanes: (0+1) + (2+3)), and the reductions are added in order; a last 2 or 3 products are rounded, a pair summed
  first, then added (a block of exactly 2 products is one FMA chain). Identical on every element of
  1-D windows of 1 to 512 elements and of the 2-D, padded, dilated convolutions of tests/test_ynn_dot.py; with
  fewer than 3 output elements XLA:CPU takes yet another path (not reproduced: the FMA chain).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .scalar import fma_f32
from .ynn_dot import fma_chain_matmul

LANES = 8  # f32 lanes of the matrix-vector product's vectors
BLOCK_MIN = 96  # Eigen's least inner-dim shard: 12 packets of 8
SHARDS = 2  # inner-dim shards Eigen's cost model picks on this 2-core machine
MIN_ROWS = 3  # fewer output elements than this take another path


@njit(inline="always")
def _reduce8(v):
    """8 lanes, neighbours first: ((0+1) + (4+5)) + ((2+3) + (6+7))."""
    a0 = np.float32(v[0] + v[1])
    a1 = np.float32(v[2] + v[3])
    a2 = np.float32(v[4] + v[5])
    a3 = np.float32(v[6] + v[7])
    return np.float32(np.float32(a0 + a2) + np.float32(a1 + a3))


@njit(inline="always")
def _block_sum(x, w, start, stop):
    """One inner-dim block of one row's products, summed in the order of the module docstring."""
    if stop - start == 2:
        return fma_f32(x[start + 1], w[start + 1], np.float32(x[start] * w[start]))
    total = np.float32(0)
    started = False
    j = start
    main = start + (stop - start) // 16 * 16
    if main > start:
        acc = np.zeros(LANES, np.float32)
        for k in range(start, main):
            acc[(k - start) % LANES] = fma_f32(x[k], w[k], acc[(k - start) % LANES])
        total = _reduce8(acc)
        started = True
        j = main
    for width in (8, 4):
        if j + width <= stop:
            lanes = np.zeros(LANES, np.float32)
            for k in range(width):
                lanes[k] = np.float32(x[j + k] * w[j + k])
            if width == 8:
                part = _reduce8(lanes)
            else:
                part = np.float32(np.float32(lanes[0] + lanes[1]) + np.float32(lanes[2] + lanes[3]))
            total = np.float32(total + part) if started else part
            started = True
            j += width
    if stop - j >= 2:
        pair = np.float32(np.float32(x[j] * w[j]) + np.float32(x[j + 1] * w[j + 1]))
        total = np.float32(total + pair) if started else pair
        started = True
        j += 2
    if j < stop:
        last = np.float32(x[j] * w[j])
        total = np.float32(total + last) if started else last
    return total


@njit(parallel=True, cache=True)
def _matvec(a, w, block, out):
    M, K = a.shape
    for i in prange(M):
        x = a[i]
        total = np.float32(0)
        for start in range(0, K, block):
            part = _block_sum(x, w, start, min(K, start + block))
            total = part if start == 0 else np.float32(total + part)
        out[i] = total


def inner_block(k: int) -> int:
    """Eigen's inner-dim shard size for a contraction of `k` (TensorContractionThreadPool's blockSize)."""
    target = -(-(-(-k // SHARDS)) // LANES) * LANES
    return max(min(k, max(BLOCK_MIN, target)), 1)


def matvec(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[M, K] @ [K] of float32 arrays in XLA:CPU's matrix-vector order (module docstring)."""
    if a.shape[0] < MIN_ROWS:
        return fma_chain_matmul(a, w[:, None])[:, 0]
    out = np.empty(a.shape[0], np.float32)
    _matvec(np.ascontiguousarray(a), np.ascontiguousarray(w), inner_block(a.shape[1]), out)
    return out


def conv_matmul(rows: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """[M, K] patches @ [K, O] kernel of float32 arrays, as XLA:CPU sums a convolution's products."""
    if kernel.shape[1] == 1:
        return matvec(rows, kernel[:, 0])[:, None]
    return fma_chain_matmul(rows, kernel)
