"""The structural ops' index meaning (kernels/index_maps.py) is read by both tiers: random gather, scatter and
reduce-window configurations -- batching dims, index vectors anywhere (or implied), out-of-bounds and u64 starts,
negative and positive padding, base and window dilation, strides -- must give the numpy tier's bits in the
compiled tier that takes them (gather and scatter: the loop generator; reduce-window: the fusion generator),
and the formulas' two interpreters must agree on every position."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

import hloexec
from hloexec.errors import UnsupportedError
from hloexec.ir.attributes import WindowDim
from hloexec.kernels.index_maps import NUMPY, SourceIndex, dilated_element, window_position, window_span
from tiers import Case, NotInTier, differences, run_tiers


def _shape(et, dims) -> str:
    return f"{et}[{','.join(map(str, dims))}]"


def _braces(xs) -> str:
    return "{" + ",".join(map(str, xs)) + "}"


def _indices(rng, batch: list[int], vector: int, ivd: int | None, bounds: list[int], et: str):
    """A start-indices array (dims, values): `batch` dims with the vector dim inserted at `ivd` (None: implied
    trailing, one component), component k ranging a little beyond [0, bounds[k]] (u64: some near 2**64)."""
    dims = list(batch) if ivd is None else batch[:ivd] + [vector] + batch[ivd:]
    axis = len(batch) if ivd is None else ivd
    lo = np.zeros(vector, np.int64) if et.startswith("u") else -np.full(vector, 3)
    hi = np.array(bounds, np.int64) + 3
    values = np.moveaxis(rng.integers(lo, hi + 1, size=[*batch, vector]), -1, axis).reshape(dims)
    values = values.astype({"s32": np.int32, "s64": np.int64, "u32": np.uint32, "u64": np.uint64}[et])
    if et == "u64" and values.size:
        values.reshape(-1)[rng.integers(values.size)] = np.uint64(2 ** 64 - 5)
    return dims, values


@dataclass
class _Indexing:
    """A random valid gather / scatter geometry (XLA's shape rules): the operand, its dims addressed by the
    index vectors (`index_map`), its batching dims, the dims no slice / window dim walks (`dropped`: gather's
    collapsed, scatter's inserted), the slice / window size per operand dim, the start indices (`idims`,
    `index_type`, `values`, `vector_dim`, `batching_dims` of the indices), and the result (gather) / updates
    (scatter) dims with the positions of the walking dims among them (`walk_dims`)."""
    odims: list
    index_map: list
    batching: list
    dropped: list
    sizes: list
    idims: list
    index_type: str
    values: np.ndarray
    vector_dim: int
    batching_dims: list
    dims: list
    walk_dims: list

    def index_attrs(self, map_name: str, operand_batching: str, indices_batching: str) -> str:
        attrs = f"{map_name}={_braces(self.index_map)}, index_vector_dim={self.vector_dim}"
        if self.batching:
            attrs += (f", {operand_batching}={_braces(self.batching)}, "
                      f"{indices_batching}={_braces(self.batching_dims)}")
        return attrs


def _random_indexing(rng) -> _Indexing:
    rank = int(rng.integers(1, 4))
    odims = [int(x) for x in rng.integers(1, 6, rank)]
    dims = list(range(rank))
    rng.shuffle(dims)
    n_batching = int(rng.integers(0, 2)) if rank > 1 else 0
    batching, rest = sorted(dims[:n_batching]), dims[n_batching:]
    index_map = [int(d) for d in rng.permutation(rest)[:int(rng.integers(1, len(rest) + 1))]]
    dropped = sorted(d for d in index_map if rng.random() < 0.5)
    walked = [d for d in range(rank) if d not in dropped and d not in batching]
    sizes = [int(rng.integers(1, odims[d] + 1)) if d in walked else 1 for d in range(rank)]
    batch = [int(x) for x in rng.integers(1, 4, int(rng.integers(n_batching, 3)))]
    idx_batching = sorted(rng.permutation(len(batch))[:n_batching].tolist())
    for od, bd in zip(batching, idx_batching):
        batch[bd] = odims[od]
    ivd = None if len(index_map) == 1 and rng.random() < 0.3 else int(rng.integers(0, len(batch) + 1))
    et = str(rng.choice(["s32", "s64", "u32", "u64"]))
    idims, values = _indices(rng, batch, len(index_map), ivd, [odims[d] - sizes[d] for d in index_map], et)
    out_rank = len(batch) + len(walked)
    walk_dims = sorted(rng.permutation(out_rank)[:len(walked)].tolist())
    out, b, walks = [], iter(batch), iter(sizes[d] for d in walked)
    for d in range(out_rank):
        out.append(next(walks) if d in walk_dims else next(b))
    return _Indexing(odims, index_map, batching, dropped, sizes, idims, et, values,
                     len(idims) if ivd is None else ivd,
                     [b if ivd is None or b < ivd else b + 1 for b in idx_batching],   # (the vector dim counted)
                     out, walk_dims)


def _random_gather(rng, k: int, first: int):
    """(instruction lines, operand values, root name) of a random gather (parameters numbered from `first`)."""
    g = _random_indexing(rng)
    attrs = (f"offset_dims={_braces(g.walk_dims)}, collapsed_slice_dims={_braces(g.dropped)}, "
             f"slice_sizes={_braces(g.sizes)}, "
             + g.index_attrs("start_index_map", "operand_batching_dims", "start_indices_batching_dims"))
    return ([f"  gx{k} = {_shape('f32', g.odims)} parameter({first})",
             f"  gi{k} = {_shape(g.index_type, g.idims)} parameter({first + 1})",
             f"  g{k} = {_shape('f32', g.dims)} gather(gx{k}, gi{k}), {attrs}"],
            [rng.standard_normal(g.odims).astype(np.float32), g.values], f"g{k}")


def _random_scatter(rng, k: int, first: int):
    """(lines, operand values, root name) of a random scatter adding or replacing (parameters from `first`)."""
    g = _random_indexing(rng)
    attrs = (f"update_window_dims={_braces(g.walk_dims)}, inserted_window_dims={_braces(g.dropped)}, "
             + g.index_attrs("scatter_dims_to_operand_dims", "input_batching_dims", "scatter_indices_batching_dims"))
    combiner = str(rng.choice(["add", "set"]))
    return ([f"  sx{k} = {_shape('s32', g.odims)} parameter({first})",
             f"  si{k} = {_shape(g.index_type, g.idims)} parameter({first + 1})",
             f"  su{k} = {_shape('s32', g.dims)} parameter({first + 2})",
             f"  s{k} = {_shape('s32', g.odims)} scatter(sx{k}, si{k}, su{k}), {attrs}, to_apply={combiner}"],
            [rng.integers(-50, 50, g.odims).astype(np.int32), g.values,
             rng.integers(-50, 50, g.dims).astype(np.int32)], f"s{k}")


_COMBINERS = """add {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT c = s32[] add(a, b)
}

set {
  a = s32[] parameter(0)
  ROOT b = s32[] parameter(1)
}
"""


def _bits(case: Case, tier: str):
    results = run_tiers(case, ["numpy", tier])
    got = results[tier]
    assert not isinstance(got, NotInTier), f"{case.name}: {got}"
    why = differences(case, results["numpy"], got)
    assert why is None, f"{case.name}: {tier} disagrees with the numpy tier: {why}\n{case.text}"


# seed 0 in CI (30-46 s a seed in `pytest -n 2` at load average 15 on 2 cores: a Numba compile of 16 ops' loops)
@pytest.mark.parametrize("seed", [0] + [pytest.param(s, marks=pytest.mark.slow) for s in (1, 2)])
def test_gather_and_scatter_index_maps_agree_across_tiers(seed):
    """Eight random gathers and eight random scatters in one module, compiled by the loop generator as one
    program (one Numba compile): every output bit for bit as the numpy tier."""
    rng = np.random.default_rng(seed)
    lines, inputs, roots = [], [], []
    for k in range(8):
        more, values, root = _random_gather(rng, k, len(inputs))
        lines += more
        inputs += values
        roots.append(root)
    for k in range(8):
        more, values, root = _random_scatter(rng, k, len(inputs))
        lines += more
        inputs += values
        roots.append(root)
    shapes = [line.split(" = ")[1].split(" ")[0] for line in lines if line.split(" = ")[0].strip() in roots]
    lines.append(f"  ROOT r = ({', '.join(shapes)}) tuple({', '.join(roots)})")
    text = f"HloModule index_maps_{seed}\n\n{_COMBINERS}\nENTRY e {{\n" + "\n".join(lines) + "\n}\n"
    _bits(Case(f"gather_scatter_{seed}", text, inputs), "loop")


@pytest.mark.parametrize("seed", range(4))
def test_gather_index_maps_agree_in_the_fusion_tier(seed):
    """A random gather compiled into the fusion generator's loop nest (its element from kernels/elements.py,
    its starts loaded once per batch position): bit for bit as the numpy tier."""
    rng = np.random.default_rng(200 + seed)
    lines, inputs, root = _random_gather(rng, 0, 0)
    lines[-1] = lines[-1].replace(f"  {root} = ", f"  ROOT {root} = ")
    text = f"HloModule gather_{seed}\n\nENTRY e {{\n" + "\n".join(lines) + "\n}\n"
    _bits(Case(f"gather_fused_{seed}", text, inputs), "fused")


def _random_window(rng, out_n: int) -> tuple[int, WindowDim]:
    """(operand size, window) along one dim with `out_n` windows: any padding (negative crops), base and window
    dilation, stride."""
    n = int(rng.integers(1, 7))
    size, stride = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    wdil, base = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    low = int(rng.integers(-2, 4))
    padded = (out_n - 1) * stride + (size - 1) * wdil + 1 + int(rng.integers(0, stride))
    high = padded - ((n - 1) * base + 1) - low
    return n, WindowDim(size, stride, low, high, base, wdil)


def _window_text(w: WindowDim) -> tuple[str, ...]:
    return (str(w.size), str(w.stride), f"{w.pad_low}_{w.pad_high}", str(w.base_dilation), str(w.window_dilation))


@pytest.mark.parametrize("seed", range(2))
def test_reduce_window_index_maps_agree_across_tiers(seed):
    """Ten random reduce-windows with one output shape, compiled as one fusion (one Numba compile): an integer
    sum from a nonzero init, so a window reading a wrong element, or padding / a hole as if it held one, shows."""
    rng = np.random.default_rng(100 + seed)
    out = [4, 3]
    lines, inputs, roots = [], [], []
    for k in range(10):
        dims, windows = zip(*[_random_window(rng, n) for n in out])
        size, stride, pad, base, wdil = ("x".join(parts) for parts in zip(*map(_window_text, windows)))
        lines += [f"  x{k} = {_shape('s32', dims)} parameter({k})",
                  f"  r{k} = s32[4,3] reduce-window(x{k}, init), window={{size={size} stride={stride} pad={pad} "
                  f"lhs_dilate={base} rhs_dilate={wdil}}}, to_apply=add"]
        inputs.append(rng.integers(-1000, 1000, dims).astype(np.int32))
        roots.append(f"r{k}")
    lines.append(f"  ROOT r = ({', '.join(['s32[4,3]'] * len(roots))}) tuple({', '.join(roots)})")
    text = (f"HloModule windows_{seed}\n\n{_COMBINERS}\nENTRY e {{\n  init = s32[] constant(7)\n"
            + "\n".join(lines) + "\n}\n")
    _bits(Case(f"reduce_window_{seed}", text, inputs), "fused")


def test_window_formulas_interpreters_agree():
    """window_position and dilated_element, evaluated as source on names (then by Python on every output and
    window index) and on numpy aranges, give the same operand index and the same holes, on many windows."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        out_n = int(rng.integers(1, 6))
        n, w = _random_window(rng, out_n)
        out, k = np.arange(out_n)[:, None], np.arange(w.size)[None, :]
        p_last = window_span(w, out_n)
        element, holds = dilated_element(NUMPY, n, w.pad_low, w.base_dilation, window_position(NUMPY, w, out, k),
                                         p_last)
        mask = np.ones((out_n, w.size), bool)
        for c in holds:
            mask &= c
        bound = {}          # the names the formulas bind, in order, and their source

        def name(e, bound=bound):
            bound[f"t{len(bound)}"] = str(e)
            return f"t{len(bound) - 1}"
        ar = SourceIndex(name)
        src, conds = dilated_element(ar, n, w.pad_low, w.base_dilation, window_position(ar, w, "o", "k"), p_last)
        for o, j in itertools.product(range(out_n), range(w.size)):
            env = {"o": o, "k": j}
            for name, expr in bound.items():
                env[name] = eval(expr, {}, env)
            holds_here = all(eval(str(c), {}, env) for c in conds)
            assert holds_here == mask[o, j], (w, n, o, j)
            if holds_here:
                assert eval(str(src), {}, env) == element[o, j] and 0 <= element[o, j] < n, (w, n, o, j)


@pytest.mark.parametrize("opcode,attrs", [
    ("gather", "offset_dims={1}, collapsed_slice_dims={1}, start_index_map={1}, index_vector_dim=1, "
               "slice_sizes={1,1,4}, operand_batching_dims={0}, start_indices_batching_dims={1}"),
    ("scatter", "update_window_dims={5}, inserted_window_dims={1}, scatter_dims_to_operand_dims={1}, "
                "index_vector_dim=1, input_batching_dims={0}, scatter_indices_batching_dims={0}"),
])
def test_index_dims_the_geometry_takes_for_granted_are_checked(opcode, attrs):
    """A batching dim that is the index vector dim, or a window dim past the updates' rank: the error names the
    instruction and XLA's rule (not an exception from inside the index maps)."""
    shapes = {"gather": "f32[8,4] gather(x, i)", "scatter": "f32[8,5,4] scatter(x, i, u)"}
    text = f"""HloModule bad
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}}

ENTRY e {{
  x = f32[8,5,4] parameter(0)
  i = s32[8,1] parameter(1)
  u = f32[8,4] parameter(2)
  ROOT r = {shapes[opcode]}, {attrs}{", to_apply=add" if opcode == "scatter" else ""}
}}
"""
    with pytest.raises(UnsupportedError, match=f"{opcode}: index_vector_dim=1, batching dims .* XLA's shape rules"):
        hloexec.load(text, use_numba=False).run(np.zeros((8, 5, 4), np.float32), np.zeros((8, 1), np.int32),
                                                np.zeros((8, 4), np.float32))


def test_one_window_scatter_agrees_across_tiers():
    """The numpy tier's one-index-vector scatter (jax's x.at[i, j].set(v): one window, numpy slicing) against
    the loop tier: starts inside, at the last fitting position, one past it, negative, and u64 near 2**64."""
    starts = [("s32", [2, 1]), ("u32", [3, 2]), ("s32", [4, 2]), ("s32", [-1, 0]), ("u64", [2 ** 64 - 5, 0])]
    lines, inputs, roots = [], [], []
    for k, (et, start) in enumerate(starts):
        lines += [f"  x{k} = f32[5,6] parameter({3 * k})", f"  i{k} = {et}[2] parameter({3 * k + 1})",
                  f"  u{k} = f32[2,4] parameter({3 * k + 2})",
                  f"  s{k} = f32[5,6] scatter(x{k}, i{k}, u{k}), update_window_dims={{0,1}}, inserted_window_dims={{}}, "
                  f"scatter_dims_to_operand_dims={{0,1}}, index_vector_dim=0, to_apply={('add', 'set')[k % 2]}"]
        inputs += [np.arange(30, dtype=np.float32).reshape(5, 6),
                   np.array(start, {"s32": np.int32, "u32": np.uint32, "u64": np.uint64}[et]),
                   np.full((2, 4), 100 + k, np.float32)]
        roots.append(f"s{k}")
    lines.append(f"  ROOT r = ({', '.join(['f32[5,6]'] * len(roots))}) tuple({', '.join(roots)})")
    combiners = _COMBINERS.replace("s32", "f32")
    text = f"HloModule one_window\n\n{combiners}\nENTRY e {{\n" + "\n".join(lines) + "\n}\n"
    _bits(Case("one_window", text, inputs), "loop")
