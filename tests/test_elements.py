"""The element layer (hloexec/kernels/elements.py) and the movement index formulas it reads
(hloexec/kernels/index_maps.py): the formulas evaluated on index arrays against numpy's own movement functions,
and one computation holding every movement op run by both compiled tiers (the fusion generator's loop nest, the
loop generator's materialised values) against the op-by-op tier, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

import hloexec
from hloexec.kernels.fusion import compile_fusion
from hloexec.kernels.index_maps import (NUMPY, bitcast_source, broadcast_source, concatenate_parts, offset_source,
                                        reshape_source, reverse_source, slice_source, transpose_source)
from hloexec.kernels.program import compile_program


def _index(dims):
    """The output index of every element of an array of `dims`: one int64 array per dim."""
    return list(np.indices(dims, dtype=np.int64)) if dims else []


def _read(x, src):
    return x[tuple(src)] if src else x


@pytest.mark.parametrize("seed", range(12))
def test_movement_formulas_read_the_elements_numpy_moves(seed):
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(1, 5))
    dims = tuple(int(n) for n in rng.integers(1, 6, rank))
    x = rng.standard_normal(dims)

    perm = tuple(int(p) for p in rng.permutation(rank))
    want = np.transpose(x, perm)
    assert np.array_equal(_read(x, transpose_source(perm, _index(want.shape))), want)

    flipped = tuple(d for d in range(rank) if rng.random() < 0.5)
    want = np.flip(x, flipped)
    assert np.array_equal(_read(x, reverse_source(NUMPY, dims, set(flipped), _index(dims))), want)

    spec = []
    for n in dims:
        start = int(rng.integers(0, n))
        spec.append((start, int(rng.integers(start + 1, n + 1)), int(rng.integers(1, 4))))
    want = x[tuple(slice(a, b, s) for a, b, s in spec)]
    assert np.array_equal(_read(x, slice_source(NUMPY, [(a, s) for a, _, s in spec], _index(want.shape))), want)

    starts = [int(rng.integers(0, n)) for n in dims]
    sizes = [int(rng.integers(1, n - s + 1)) for n, s in zip(dims, starts)]
    want = x[tuple(slice(s, s + k) for s, k in zip(starts, sizes))]
    assert np.array_equal(_read(x, offset_source(NUMPY, starts, _index(sizes))), want)

    out_rank = rank + int(rng.integers(0, 3))        # broadcast: the operand's dims at `kept`, in order
    kept = sorted(int(d) for d in rng.choice(out_rank, rank, replace=False))
    new = [d for d in range(out_rank) if d not in kept]
    out = [0] * out_rank
    for d, n in zip(kept, dims):
        out[d] = n
    for d in new:
        out[d] = int(rng.integers(1, 4))
    want = np.broadcast_to(np.expand_dims(x, tuple(new)), out)
    assert np.array_equal(_read(x, broadcast_source(kept, _index(out))), want)


@pytest.mark.parametrize("dims,out", [((6, 4), (24,)), ((2, 3, 4), (4, 6)), ((4, 6), (2, 2, 3, 2)),
                                      ((1, 12, 1), (3, 1, 4)), ((5,), (1, 5, 1)), ((2, 1, 6), (3, 4)),
                                      ((30,), (2, 3, 5)), ((2, 3, 5), (5, 3, 2))])
def test_reshape_formula_reads_numpys_row_major_order(dims, out):
    x = np.arange(np.prod(dims)).reshape(dims)
    assert np.array_equal(_read(x, reshape_source(NUMPY, dims, out, _index(out))), x.reshape(out))


class _Shape:
    """A shape with a layout, as bitcast_source reads it."""

    def __init__(self, dims, minor_to_major):
        self.dims, self.minor_to_major = dims, minor_to_major


@pytest.mark.parametrize("seed", range(6))
def test_bitcast_formula_keeps_the_physical_order(seed):
    rng = np.random.default_rng(seed)
    dims = tuple(int(n) for n in rng.integers(1, 5, 3))
    src_m2m, dst_m2m = tuple(int(d) for d in rng.permutation(3)), tuple(int(d) for d in rng.permutation(3))
    x = rng.standard_normal(dims)
    physical = np.transpose(x, list(reversed(src_m2m))).reshape(-1)       # the buffer, major dim first
    dst_major = list(reversed(dst_m2m))
    dst_dims = [0] * 3
    for k, d in enumerate(dst_major):       # the destination's physical dims are the source's, in order
        dst_dims[d] = [dims[s] for s in reversed(src_m2m)][k]
    want = np.transpose(physical.reshape([dst_dims[d] for d in dst_major]), np.argsort(dst_major))
    got = _read(x, bitcast_source(NUMPY, _Shape(dims, src_m2m), _Shape(tuple(dst_dims), dst_m2m),
                                  _index(dst_dims)))
    assert np.array_equal(got, want)


def test_concatenate_parts_pick_each_element_from_one_operand():
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((3, n)) for n in (2, 5, 1, 4)]
    want = np.concatenate(parts, axis=1)
    index = _index(want.shape)
    hits = np.zeros(want.shape, int)
    for k, conds, src in concatenate_parts(NUMPY, [p.shape[1] for p in parts], 1, index):
        mask = np.logical_and.reduce([np.broadcast_to(c, want.shape) for c in conds]) if conds else True
        mask = np.broadcast_to(mask, want.shape)
        hits += mask
        safe = [np.where(mask, s, 0) for s in src]
        assert np.array_equal(parts[k][tuple(safe)][mask], want[mask])
    assert (hits == 1).all()


# Every movement op (and iota) on f16 values, whose stored bits the loop generator copies: transposed,
# reversed, strided, concatenated (three operands), reshaped across dims, dynamically sliced (starts clamped),
# padded (negative low, interior, high), broadcast, bitcast between layouts.
MOVES = """HloModule moves

fused {
  x = f16[6,8] parameter(0)
  y = f16[4,6] parameter(1)
  s = s32[] parameter(2)
  t = f16[8,6] transpose(x), dimensions={1,0}
  r = f16[8,6] reverse(t), dimensions={0,1}
  sl = f16[4,6] slice(r), slice={[1:8:2], [0:6]}
  c = f16[12,6] concatenate(sl, y, sl), dimensions={0}
  rs = f16[6,2,6] reshape(c)
  ds = f16[3,2,4] dynamic-slice(rs, s, s, s), dynamic_slice_sizes={3,2,4}
  pv = f16[] constant(-2.5)
  pd = f16[5,4,11] pad(ds, pv), padding=1_1x1_1x-1_2_2
  y1 = f16[4,1] slice(y), slice={[0:4], [2:3]}
  y2 = f16[4] reshape(y1)
  bc = f16[5,4,11] broadcast(y2), dimensions={1}
  io = s32[5,4,11] iota(), iota_dimension=2
  ioc = f16[5,4,11] convert(io)
  sum = f16[5,4,11] add(bc, ioc)
  m = f16[5,4,11] multiply(pd, sum)
  ROOT out = f16[11,4,5]{0,1,2} bitcast(m)
}

ENTRY e {
  x = f16[6,8] parameter(0)
  y = f16[4,6] parameter(1)
  s = s32[] parameter(2)
  ROOT f = f16[11,4,5]{0,1,2} fusion(x, y, s), kind=kLoop, calls=fused
}
"""


@pytest.mark.parametrize("start", [-3, 0, 2, 100])
def test_both_compiled_tiers_move_every_element_as_the_op_by_op_tier(start):
    module = hloexec.parse(MOVES)[0]
    fusion = module.entry.root
    rng = np.random.default_rng(start + 7)
    x = rng.standard_normal((6, 8)).astype(np.float16)
    y = rng.standard_normal((4, 6)).astype(np.float16)
    x.reshape(-1)[:3] = [np.inf, -0.0, -np.inf]
    s = np.int32(start)
    want = hloexec.load(MOVES, use_numba=False).run(x, y, s)
    by_nest = compile_fusion(fusion.called["calls"], parallel=False)(x, y, s)
    by_loops = compile_program(fusion).compile()(x, y, s)
    for got in (by_nest, by_loops):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


GATHER_ROWS = """HloModule rows

fused {
  t = f32[10,64] parameter(0)
  i = s32[8,1] parameter(1)
  ROOT g = f32[8,64] gather(t, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0},
    index_vector_dim=1, slice_sizes={1,64}
}

ENTRY e {
  t = f32[10,64] parameter(0)
  i = s32[8,1] parameter(1)
  ROOT f = f32[8,64] fusion(t, i), kind=kLoop, calls=fused
}
"""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def test_a_gathers_start_is_loaded_once_per_row_in_both_compiled_tiers():
    """Gather's element (one function for both tiers) names its clamped start; each generator places it in the
    loop of the batch position it depends on, outside the loop along the row -- and the rows are those numpy
    picks (starts clamped)."""
    fusion = hloexec.parse(GATHER_ROWS)[0].entry.root
    table = np.arange(640, dtype=np.float32).reshape(10, 64)
    rows = np.array([[3], [0], [9], [-4], [12], [5], [5], [1]], np.int32)
    want = table[np.clip(rows[:, 0], 0, 9)]
    nest = compile_fusion(fusion.called["calls"], parallel=False)
    loops = compile_program(fusion)
    for kernel in (nest, loops.compile()):
        assert np.array_equal(kernel(table, rows), want)
        lines = kernel.source.splitlines()
        (start,) = [line for line in lines if "min(max(" in line]
        (store,) = [line for line in lines if line.lstrip().startswith(("o0[", "a")) and "] = " in line]
        assert _indent(start) < _indent(store), kernel.source
