"""Sums whose roundings repeat (tools/bound_shared.repeated_rounding): a per-step sum of one value over many terms
adds the same residue at every step of a binade, or stagnates once each term is under half the partial sum's ulp.
The rules draw each step's rounding as its own; hloexec's own correct per-step result of such a sum was NOT
CONSISTENT (f16 x 4,096 copies of 0.1: 256, not 409.5, 5.2x its bound). Those results are consistent, and results
off by more than the repeated roundings make still are caught."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import hloexec
from hloexec.tools.cli import main
from hloexec.tools.numerics import flatten, judge_run
from hloexec.tools.xla_cpu import save_arrays

TYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}


def _identical_sum(dtype: str, n: int):
    text = f"""HloModule identical_sum
add {{ a = {dtype}[] parameter(0)  b = {dtype}[] parameter(1)  ROOT s = {dtype}[] add(a, b) }}
ENTRY e {{ x = {dtype}[] parameter(0)  b = {dtype}[{n}] broadcast(x), dimensions={{}}  z = {dtype}[] constant(0)
          ROOT r = {dtype}[] reduce(b, z), dimensions={{0}}, to_apply=add }}"""
    return hloexec.load(text, reductions="per-step"), np.array(0.1, TYPES[dtype])


def _sequential(x, n: int, dtype):
    """n copies of x summed in index order, every step rounded to `dtype` (numpy, written from the rule: one step
    at a time, the exact sum of two values of the type rounded to it)."""
    acc = np.zeros((), dtype)
    for _ in range(n):
        acc = np.asarray(float(acc) + float(x)).astype(dtype)
    return acc


@pytest.mark.parametrize(
    "dtype,n,far",
    [
        ("f16", 4096, [2.0, 0.0]),  # stagnates at 256 (exact 409.5): 2x the exact value and 0 are far off
        ("bf16", 1024, [3.0, -1.0]),  # stagnates at 32 (exact 102.4): 2x is within 1.75 x its floor, 70.4
        ("f32", 4096, [1.01, 0.99]),  # random-like residues: no floor to speak of, 1% of the scale caught
    ],
)
def test_a_sum_of_one_repeated_value_is_consistent_and_a_far_value_caught(dtype, n, far):
    exe, x = _identical_sum(dtype, n)
    mine = flatten(exe.run(x))
    emulated = _sequential(x, n, TYPES[dtype])
    assert float(mine[0]) == float(emulated)  # (hloexec's per-step sum is the rule's)
    exact = n * float(x)
    changed = {f"x{f}": [np.asarray(exact * f).astype(TYPES[dtype])] for f in far}
    verdict, _ = judge_run(exe, [x], {"hloexec": mine, **changed})
    assert verdict.consistent("hloexec"), verdict.to_dict()
    for name in changed:
        assert not verdict.consistent(name), (name, verdict.to_dict())


def test_a_million_f32_copies_summed_per_step_are_consistent_and_a_one_percent_change_caught():
    """f32 x 1,048,576 copies of 0.1 in index order: 1% off the exact sum (equal residues within each binade),
    70x its bound before; hloexec's result moved a further 1% of the scale away is caught."""
    n = 1 << 20
    exe, x = _identical_sum("f32", n)
    mine = flatten(exe.run(x))
    emulated = np.cumsum(np.full(n, x, np.float32), dtype=np.float32)[-1]  # (numpy's cumsum: every step rounded)
    assert float(mine[0]) == float(emulated)
    exact = n * float(x)
    error = float(mine[0]) - exact
    assert abs(error) > 0.005 * exact  # the premise: far beyond independent roundings
    away = np.float32(float(mine[0]) + np.sign(error) * 0.01 * exact)
    verdict, _ = judge_run(exe, [x], {"hloexec": mine, "moved": [np.asarray(away)]})
    assert verdict.consistent("hloexec"), verdict.to_dict()
    assert not verdict.consistent("moved"), verdict.to_dict()


ALL_REDUCE = """HloModule all_reduce, num_partitions=4096
add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
ENTRY e { x = f32[4] parameter(0)
          ROOT r = f32[4] all-reduce(x), replica_groups={}, to_apply=add, channel_id=1 }"""


def test_an_all_reduce_of_one_value_over_4096_participants_is_consistent_and_a_change_caught(tmp_path, capsys):
    """An add all-reduce's partial sums round every step in its type, in group order: 4,096 participants' f32 0.1
    summed so are 409.6 off by 0.0158 (equal residues; 4.4x its bound before). That result (numpy: group order,
    every step rounded) is consistent; moved three times that error further away, or by 1% of the scale, caught."""
    x = np.full(4, 0.1, np.float32)
    folded = np.cumsum(np.full((4096, 4), x, np.float32), axis=0, dtype=np.float32)[-1]
    exact = 4096 * x.astype(np.float64)
    error = folded.astype(np.float64) - exact
    assert np.all(np.abs(error) > 1e-2)  # the premise: far past 4,096 independent roundings' (sigma ~5e-4)
    path, given = tmp_path / "all_reduce.hlo", tmp_path / "in.npz"
    path.write_text(ALL_REDUCE)
    save_arrays(str(given), {"arg0": x})
    candidates = {
        "folded": folded,
        "moved": (folded + 3 * error).astype(np.float32),
        "percent": (folded + 0.01 * np.sign(error) * exact).astype(np.float32),
    }
    argv = ["compare", str(path), "--spmd", "--inputs", str(given), "--reference", "shadow", "--json"]
    for name, value in candidates.items():
        save_arrays(str(tmp_path / f"{name}.npz"), {"out0": value})
        argv += ["--actual", str(tmp_path / f"{name}.npz")]
    main(argv)
    document = json.loads(capsys.readouterr().out)
    judged = {c["name"]: c["consistent"] for c in document["outputs"][0]["candidates"]}
    assert judged == {"hloexec": True, "folded.npz": True, "moved.npz": False, "percent.npz": False}, judged


def test_a_stagnating_sum_of_computed_terms_is_consistent_in_index_and_reversed_order():
    """The terms made by the program (an f16 multiply: each rounded, its own error in the bound) and only nearly
    equal (two neighbouring f16 values): the per-step sum still stagnates, in index order and reversed (numpy,
    written from the rule: each product rounded to f16, each step's exact sum rounded to f16); both consistent,
    2x the exact sum caught."""
    text = """HloModule computed_terms
add { a = f16[] parameter(0)  b = f16[] parameter(1)  ROOT s = f16[] add(a, b) }
ENTRY e { x = f16[4096] parameter(0)  c = f16[] parameter(1)  cc = f16[4096] broadcast(c), dimensions={}
          y = f16[4096] multiply(x, cc)  z = f16[] constant(0)
          ROOT r = f16[] reduce(y, z), dimensions={0}, to_apply=add }"""
    exe = hloexec.load(text, reductions="per-step")
    tenth = np.float16(0.1)
    x = np.where(np.random.default_rng(5).random(4096) < 0.5, tenth, np.nextafter(tenth, np.float16(1)))
    c = np.array(0.9, np.float16)
    products = (x.astype(np.float64) * float(c)).astype(np.float16)

    def per_step(terms):
        acc = np.float16(0)
        for t in terms:
            acc = np.float16(float(acc) + float(t))
        return np.asarray(acc)

    exact = float(np.sum(x.astype(np.float64) * float(c)))
    candidates = {
        "index": [per_step(products)],
        "reversed": [per_step(products[::-1])],
        "far": [np.asarray(np.float16(2 * exact))],
    }
    assert abs(float(candidates["index"][0]) - exact) > 0.2 * exact  # the premise: it stagnates
    verdict, _ = judge_run(exe, [x, c], candidates)
    assert verdict.consistent("index") and verdict.consistent("reversed"), verdict.to_dict()
    assert not verdict.consistent("far"), verdict.to_dict()


@pytest.mark.parametrize("dtype", list(TYPES))
def test_the_floor_is_the_per_step_sums_error_in_row_major_order(dtype):
    """repeated_rounding (a compiled pass for these types) against a Python loop: each exact term rounded to the
    type once, the reduced dims walked in row-major order from init, each step's exact sum rounded to the type."""
    from hloexec.tools.bound_shared import repeated_rounding

    t = TYPES[dtype]
    a = np.random.default_rng(3).standard_normal((6, 3, 50)) * 40
    exact = a.sum((0, 2)) + 0.3
    want = []
    for j in range(3):
        acc = np.asarray(0.3).astype(t)
        for i in range(6):
            for k in range(50):
                acc = np.asarray(float(acc) + float(np.asarray(a[i, j, k]).astype(t))).astype(t)
        want.append(float(acc) - exact[j])
    got = repeated_rounding(a, (0, 2), np.float64(0.3), t, exact)
    assert np.array_equal(got, np.array(want)), (got, want)
    assert np.any(got != 0)


# -- orders the rules only estimate -------------------------------------------------------------------------------


def _chains(terms: np.ndarray, lanes: int) -> np.float32:
    """f32 terms summed in `lanes` chains (chain j: the terms j, j + lanes, ... in order) and the chains added
    pairwise, neighbours first, every step an f32 add (numpy's float32 arithmetic): a loop (1), a warp's lanes and
    shuffles (32), a block's threads and its tree (1024) -- orders a device's "any order" f32 accumulation allows."""
    acc = np.zeros(lanes, np.float32)
    for k in range(0, len(terms), lanes):
        acc[: len(terms[k : k + lanes])] += terms[k : k + lanes]
    while len(acc) > 1:
        acc = acc[0::2] + acc[1::2]
    return acc[0]


@pytest.mark.parametrize("dtype,n", [("f32", 1 << 20), ("bf16", 1 << 20), ("f16", 1 << 19)])
def test_long_sums_of_one_value_in_a_devices_orders_are_consistent_and_a_further_percent_caught(dtype, n):
    """The reference, tpu, a100 and h100 profiles accumulate f32 sums (and 16-bit ones, in f32) in an order they
    do not say. A column sum of n copies of 0.1 in row-major order (hloexec's own run: numpy adds the rows one by
    one) is 1% off in f32 (0.4% in f16, 1% in bf16), 70x, 10.5x and 3.8x its bound on main: NOT CONSISTENT; in 32
    chains 1.83x (f32). Now every order is consistent under each profile, and the row-major result moved a further
    1% of the scale away is caught."""
    text = f"""HloModule column_sum
add {{ a = {dtype}[] parameter(0)  b = {dtype}[] parameter(1)  ROOT s = {dtype}[] add(a, b) }}
ENTRY e {{ x = {dtype}[] parameter(0)  b = {dtype}[{n},2] broadcast(x), dimensions={{}}  z = {dtype}[] constant(0)
          ROOT r = {dtype}[2] reduce(b, z), dimensions={{0}}, to_apply=add }}"""
    exe = hloexec.load(text)
    x = np.array(0.1, TYPES[dtype])
    terms = np.full(n, x, np.float32)  # (16-bit values accumulate in f32: each exact there)
    exact = n * float(x)
    sums = {f"chains{lanes}": _chains(terms, lanes) for lanes in (1, 32, 1024)}
    assert abs(float(sums["chains1"]) - exact) > 0.003 * exact  # the premise: row-major repeats its roundings
    candidates = {name: [np.full(2, s, np.float32).astype(TYPES[dtype])] for name, s in sums.items()}
    further = float(sums["chains1"]) + np.sign(float(sums["chains1"]) - exact) * 0.01 * exact
    candidates["further"] = [np.full(2, further).astype(TYPES[dtype])]
    verdict, _ = judge_run(exe, [x], candidates, devices=["reference", "tpu", "a100", "h100"])
    for device, judged in verdict.by_device.items():
        for name in ["hloexec", *sums]:
            assert judged.consistent(name), (device, name, judged.to_dict())
        assert not judged.consistent("further"), (device, judged.to_dict())


def _xla_cpu_tree(x: np.ndarray, dtype, width: int = 32) -> np.ndarray:
    """XLA:CPU's long 16-bit row sums as its TreeReductionRewriter writes them (xla/hlo/transforms/simplifiers/
    tree_reduction_rewriter.cc): while the row is longer than `width`, a reduce-window of `width` (padded "same":
    the smaller half low) and the reduce of the windows' sums rewritten again; every window and the last reduce
    summed in order from 0, each step's exact sum rounded to the type (numpy, float64 then the type)."""

    def fold(rows):
        acc = np.zeros(rows.shape[:-1], dtype)
        for k in range(rows.shape[-1]):
            acc = (acc.astype(np.float64) + rows[..., k].astype(np.float64)).astype(dtype)
        return acc

    while x.shape[-1] > width:
        windows = -(-x.shape[-1] // width)
        pad = windows * width - x.shape[-1]
        x = fold(np.pad(x, [(0, 0), (pad // 2, pad - pad // 2)]).reshape(len(x), windows, width))
    return fold(x)


def test_xla_cpus_long_f16_sums_of_repeated_values_are_within_their_bounds_in_its_tree_order():
    """XLA:CPU's f16 sums of 1,024 copies of one value (1 + k 2^-10) in its compiler's tree of windows are that
    order emulated, bit for bit (and 65,536 terms, windows of windows); the windows' equal sums repeat their
    roundings: on main 1.21-1.70x their bounds (within the factor, past the bound). Now within their bounds (the
    floor: tools/bound_shared.tree_order_rounding, that order's own error), and a 1% change of a row caught."""
    import jax

    from hloexec.jax import lower
    from hloexec.tools.numerics import xla_cpu_arithmetic

    def f(x):
        return jax.lax.reduce(x, np.float16(0), jax.lax.add, (1,))

    long = np.abs(np.random.default_rng(2).standard_normal((2, 65536)) * 0.01).astype(np.float16)
    assert np.array_equal(np.asarray(jax.jit(f)(long)), _xla_cpu_tree(long, np.float16))
    values = np.array([1 + k * 2**-10 for k in (6, 7, 8, 9, 10)], np.float16)
    x = np.repeat(values[:, None], 1024, 1)
    xla = np.asarray(jax.jit(f)(x))
    assert np.array_equal(xla, _xla_cpu_tree(x, np.float16))
    exact = 1024 * values.astype(np.float64)
    bumped = xla.copy()
    bumped[2] = np.float16(float(xla[2]) + np.sign(float(xla[2]) - exact[2]) * 0.01 * exact[2])
    device = xla_cpu_arithmetic()
    exe = hloexec.load(lower(f, x).text)
    verdict, run = judge_run(
        exe, [x], {"XLA:CPU": [xla], "bumped": [bumped]}, known={"XLA:CPU": device, "bumped": device}
    )
    bound = run.bounds[device.name].bounds[0]
    assert np.all(np.abs(xla.astype(np.float64) - exact) <= bound), (xla.astype(np.float64) - exact, bound)
    assert verdict.consistent("XLA:CPU") and not verdict.consistent("bumped"), verdict.to_dict()
    from hloexec.tools.bound_shared import tree_order_rounding  # (the floor: that order's own error)

    floor = tree_order_rounding(x.astype(np.float64), (1,), np.float64(0), np.float16, exact, 32)
    assert np.array_equal(floor, xla.astype(np.float64) - exact)


@pytest.mark.parametrize("dtype", list(TYPES))
def test_the_representative_orders_are_chains_added_pairwise(dtype):
    """chained_sums' orders against a Python loop: `lanes` chains from 0 (the first from init), each exact term
    rounded to the type once and each step's exact sum rounded to it, the chains added pairwise, neighbours
    first, each sum rounded."""
    from hloexec.kernels.bound_generic import chained_sums
    from hloexec.tools.bound_shared import PER_STEP_ROUNDINGS

    t = TYPES[dtype]
    terms = (np.random.default_rng(4).standard_normal((3, 300)) * 40).astype(t)
    lanes = (1, 16, 256)
    got = np.empty((3, len(lanes)))
    chained_sums(
        terms.astype(np.float32),
        np.full(3, 0.5, np.float32),
        PER_STEP_ROUNDINGS[np.dtype(t).name],
        np.array(lanes, np.int64),
        got,
    )
    for r in range(3):
        for m, count in enumerate(lanes):
            chains = [np.asarray(0.5 if j == 0 else 0.0).astype(t) for j in range(count)]
            for k, term in enumerate(terms[r]):
                chains[k % count] = np.asarray(float(chains[k % count]) + float(term)).astype(t)
            while len(chains) > 1:
                chains = [np.asarray(float(a) + float(b)).astype(t) for a, b in zip(chains[0::2], chains[1::2])]
            assert got[r, m] == float(chains[0]), (r, count)


def test_xla_cpus_ynnpack_f32_row_sums_take_no_floor_and_a_percent_is_caught():
    """XLA:CPU's own optimized module: an f32 row sum of 2^20 copies of 0.1 in a `__ynn_fusion` (YNNPACK's lanes,
    tiles added compensated) is exact; its order is known and repeats nothing, so its bound keeps the rule's
    (row-major order's floor would be 1% of the sum) and a 1% change is caught."""
    import jax
    import jax.numpy as jnp

    from hloexec.tools.numerics import xla_cpu_arithmetic

    x = np.full((2, 1 << 20), 0.1, np.float32)
    f = jax.jit(lambda x: jnp.sum(x, 1))
    xla = np.asarray(f(x))
    exact = (1 << 20) * float(x[0, 0])
    assert np.all(np.abs(xla - exact) < 1e-6 * exact)  # the premise: YNNPACK's order repeats nothing here
    device = xla_cpu_arithmetic()
    exe = hloexec.load(f.lower(x).compile().as_text(), device="xla-cpu")
    moved = (xla + 0.01 * exact).astype(np.float32)
    verdict, run = judge_run(exe, [x], {"XLA:CPU": [xla], "moved": [moved]}, known={"XLA:CPU": device, "moved": device})
    assert np.all(run.bounds[device.name].bounds[0] < 1e-3 * exact)
    assert verdict.consistent("XLA:CPU") and not verdict.consistent("moved"), verdict.to_dict()


# -- dots, reduce-windows and add scatters ------------------------------------------------------------------------

ACCUMULATING = ["reference", "tpu", "a100", "h100"]  # the profiles whose sums' order is not said


def _loop(terms: np.ndarray, step, result) -> np.ndarray:
    """`terms` (values of `step`'s type) summed from 0 in index order, every step an add in `step` (numpy's cumsum
    in that type: one rounded add at a time; a 16-bit add computed in f32 and rounded once more is that type's
    rounded add: 24 >= 2 x 11 + 2 bits), the sum then rounded to `result` once."""
    return np.asarray(np.cumsum(np.asarray(terms, step), dtype=step)[-1]).astype(result)


def _judged(exe, inputs, emulated, exact, devices, dtype):
    """The emulated result and that result's error planted 4x (exact + 4 (emulated - exact), in the type), judged
    under each of `devices`: {device: (consistent, the planted one consistent)}."""
    planted = (exact + 4 * (np.asarray(emulated, np.float64) - exact)).astype(dtype)
    verdict, _ = judge_run(exe, inputs, {"emulated": [emulated], "planted": [planted]}, devices=devices)
    judged = verdict.by_device or {devices[0]: verdict}  # (one device: the verdict returned)
    return {d: (j.consistent("emulated"), j.consistent("planted"), j.to_dict()) for d, j in judged.items()}


@pytest.mark.parametrize("dtype,k", [("f32", 4096), ("f32", 1 << 20), ("f16", 1 << 19)])
def test_a_dot_of_one_repeated_product_in_each_profiles_order_is_consistent_and_4x_caught(dtype, k):
    """A dot whose products are all one value (a [2, K] matrix of 0.1s times a [K, 3] matrix of 2s, of 1s in
    f16: a mean's weights, a broadcast; at HIGHEST, f32 dots in f32 on every profile) in a loop's order: each step
    adds one product to a partial sum in one binade, the same rounding every step (f32 K = 4,096: 4.4x the bound
    on main; 2^20: 1% off; f16 operands accumulate in f32 on every XLA backend: 2^19 products 0.4% off). Consistent under every profile (a loop is one of the orders
    `accumulate` allows, and XLA:CPU's dots sum in blocks of K: its order is not modelled), the error planted 4x
    caught."""
    text = f"""HloModule d
ENTRY e {{ a = {dtype}[2,{k}] parameter(0)  b = {dtype}[{k},3] parameter(1)
  ROOT d = {dtype}[2,3] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}},
    operand_precision={{highest,highest}} }}"""
    t = TYPES[dtype]
    a, b = np.full((2, k), 0.1, t), np.full((k, 3), 2 if dtype == "f32" else 1, t)  # (f16's sum below 65,504)
    products = np.full(k, float(a[0, 0]) * float(b[0, 0]), np.float64).astype(np.float32)  # (exact in f32)
    emulated = np.full((2, 3), _loop(products, np.float32, t))
    exact = k * float(a[0, 0]) * float(b[0, 0])
    assert abs(float(emulated[0, 0]) - exact) > 3e-6 * exact  # the premise: past 4 sigma of independent roundings
    judged = _judged(hloexec.load(text), [a, b], emulated, exact, [*ACCUMULATING, "xla-cpu"], t)
    for device, (consistent, planted, document) in judged.items():
        assert consistent and not planted, (device, document)


@pytest.mark.parametrize("dtype,n", [("f32", 1 << 20), ("f16", 1 << 19), ("f16", 4096)])
def test_a_reduce_window_of_one_repeated_value_in_each_profiles_order_is_consistent_and_4x_caught(dtype, n):
    """Windows of n copies of 0.1 (a [2, 2n] broadcast, windows 1 x n, stride n): summed in each profile's order --
    `accumulate`'s (16-bit values in f32) a loop, XLA:CPU's (its loop emitter: every step rounded to the type) --
    their repeated roundings went past the bounds on main (f32 2^20: 1% off; f16 2^19 in f32: 0.4%; f16 4,096
    per step: stagnates at 256, not 409.5). Consistent under each, the error planted 4x caught (where the order's
    error is past 0.3%: 4x a single rounding is not a repeat's)."""
    text = f"""HloModule rw
add {{ a = {dtype}[] parameter(0)  b = {dtype}[] parameter(1)  ROOT s = {dtype}[] add(a, b) }}
ENTRY e {{ x = {dtype}[] parameter(0)  b = {dtype}[2,{2 * n}] broadcast(x), dimensions={{}}  z = {dtype}[] constant(0)
  ROOT r = {dtype}[2,2] reduce-window(b, z), window={{size=1x{n} stride=1x{n}}}, to_apply=add }}"""
    t = TYPES[dtype]
    x = np.array(0.1, t)
    exact = n * float(x)
    orders = {"accumulate": (ACCUMULATING, np.float32), "xla-cpu": (["xla-cpu"], t)}
    for devices, step in orders.values():
        emulated = np.full((2, 2), _loop(np.full(n, x), step, t))
        if abs(float(emulated[0, 0]) - exact) < 3e-3 * exact:  # (4,096 f16 terms in f32: rounded once, not judged)
            continue
        for device, (consistent, planted, document) in _judged(hloexec.load(text), [x], emulated, exact, devices,
                                                                t).items():  # fmt: skip
            assert consistent and not planted, (device, document)


@pytest.mark.parametrize("dtype,n", [("f32", 1 << 20), ("f16", 4096)])
def test_an_add_scatter_of_one_repeated_value_in_index_order_is_consistent_and_4x_caught(dtype, n):
    """n updates of 0.1 to each of two elements (indices alternating) from a target of 1: every combiner step
    rounds to the scatter's type (the HLO's meaning, every profile), in index order (XLA:CPU's loop; one of the
    orders a GPU's atomics may take). f32 2^20: 1% off, f16 4,096: stagnates. Consistent under each profile, the
    error planted 4x caught."""
    text = f"""HloModule s
add {{ a = {dtype}[] parameter(0)  b = {dtype}[] parameter(1)  ROOT s = {dtype}[] add(a, b) }}
ENTRY e {{ t = {dtype}[3] parameter(0)  i = s32[{2 * n},1] parameter(1)  u = {dtype}[{2 * n}] parameter(2)
  ROOT r = {dtype}[3] scatter(t, i, u), update_window_dims={{}}, inserted_window_dims={{0}},
    scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=add }}"""
    t = TYPES[dtype]
    target, updates = np.ones(3, t), np.full(2 * n, 0.1, t)
    indices = (np.arange(2 * n, dtype=np.int32) % 2)[:, None]
    summed = _loop(np.concatenate([[1.0], np.full(n, float(updates[0]))]).astype(t), t, t)
    emulated = np.array([summed, summed, 1], t)
    exact = np.array([1 + n * float(updates[0])] * 2 + [1.0])
    assert abs(float(summed) - exact[0]) > 3e-3 * exact[0]  # the premise: its roundings repeat
    judged = _judged(hloexec.load(text), [target, indices, updates], emulated, exact, [*ACCUMULATING, "xla-cpu"], t)
    for device, (consistent, planted, document) in judged.items():
        assert consistent and not planted, (device, document)


@pytest.mark.parametrize("side", ["lhs", "rhs"])
def test_a_dot_of_a_constant_row_and_a_mask_in_a_loops_order_is_consistent_and_4x_caught(side):
    """One side constant along the contraction (0.1: a mean's weights), the other a 0/1 mask (a one-hot's
    counts): the products are 0.1 or 0 (an exact step), 2^18 of them summed in a loop's order repeat the same
    rounding (0.1-0.23% off, ~100 sigmas of independent roundings; past its bound on main). The floor sums the constant times each
    mask line (bound_shared._one_constant); the loop's result is consistent under every profile, the error planted
    4x caught, on either side of the dot."""
    k = 1 << 18
    mask = (np.random.default_rng(7).random((k, 3)) < [0.5, 0.7, 0.9]).astype(np.float32)
    weights = np.full((2, k), 0.1, np.float32)
    if side == "lhs":
        shapes, inputs, dims = (
            ("f32[2,{k}]", "f32[{k},3]"),
            [weights, mask],
            "lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        )
    else:
        shapes, inputs, dims = (
            ("f32[3,{k}]", "f32[{k},2]"),
            [mask.T.copy(), weights.T.copy()],
            "lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        )
    a_shape, b_shape = (s.format(k=k) for s in shapes)
    out = "f32[2,3]" if side == "lhs" else "f32[3,2]"
    text = f"""HloModule d
ENTRY e {{ a = {a_shape} parameter(0)  b = {b_shape} parameter(1)
  ROOT d = {out} dot(a, b), {dims}, operand_precision={{highest,highest}} }}"""
    sums = np.array([_loop(mask[:, j] * np.float32(0.1), np.float32, np.float32) for j in range(3)])
    exact = mask.astype(np.float64).sum(0) * float(np.float32(0.1))
    assert np.all(np.abs(sums - exact) > 5e-4 * exact)  # the premise: its roundings repeat
    emulated = np.stack([sums, sums]) if side == "lhs" else np.stack([sums, sums]).T.copy()
    exact = np.stack([exact, exact]) if side == "lhs" else np.stack([exact, exact]).T
    judged = _judged(hloexec.load(text), inputs, emulated, exact, [*ACCUMULATING, "xla-cpu"], np.float32)
    for device, (consistent, planted, document) in judged.items():
        assert consistent and not planted, (device, document)


def test_xla_cpus_dot_of_one_repeated_product_is_consistent_under_its_profile():
    """XLA:CPU's own f32 dot of 4,096 products 0.2 (jaxlib's, run here) is the loop's sum, 819.2316 for 819.2
    (3.9e-5 off: past its bound on main); judged by its arithmetic (xla_cpu_arithmetic), consistent."""
    from hloexec.tools.numerics import xla_cpu_arithmetic
    from hloexec.tools.xla_cpu import run_on_xla_cpu

    text = """HloModule d
ENTRY e { a = f32[2,4096] parameter(0)  b = f32[4096,3] parameter(1)
  ROOT d = f32[2,3] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0} }"""
    a, b = np.full((2, 4096), 0.1, np.float32), np.full((4096, 3), 2, np.float32)
    xla = run_on_xla_cpu(text, [a, b])
    assert abs(float(xla[0][0, 0]) - 4096 * 0.2 * float(np.float32(0.1)) / 0.1) > 0.03  # the premise: it repeats
    verdict, _ = judge_run(hloexec.load(text), [a, b], {"XLA:CPU": xla}, known={"XLA:CPU": xla_cpu_arithmetic()})
    assert verdict.consistent("XLA:CPU"), verdict.to_dict()


def test_a_batched_dots_floor_covers_each_loops_error_where_a_line_is_constant_and_nothing_elsewhere():
    """bound_shared.dot_rounding on a batched dot (batch dim first on the lhs, last on the rhs: the layouts
    along_contraction reads) whose lines are constant in some places (0.1, 0.3, 0.2 rows; a column of 2s), 0/1 masks
    or random in others, against numpy's f32 loop per element (each product rounded to f32, then added one at a
    time): where a line is constant and the loop's error exceeds the rule's accumulation term the floor is at
    least it (the largest of the representative orders', row-major among them); where no line is, 0."""
    from hloexec.tools.bound_shared import dot_rounding

    k = 1 << 16
    text = f"""HloModule d
ENTRY e {{ a = f32[2,3,{k}] parameter(0)  b = f32[{k},4,2] parameter(1)
  ROOT d = f32[2,3,4] dot(a, b), lhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, rhs_batch_dims={{2}},
    rhs_contracting_dims={{0}} }}"""
    inst = hloexec.load(text).module.entry.root
    rng = np.random.default_rng(11)
    a = rng.standard_normal((2, 3, k)).astype(np.float32)
    a[0, 0], a[0, 2], a[1, 0], a[1, 1] = 0.1, 0.3, 0.1, 0.2
    b = rng.standard_normal((k, 4, 2)).astype(np.float32)
    b[:, 0, :] = rng.random((k, 2)) < 0.6  # masks
    b[:, 1, 0] = 2  # a constant column (batch 0)
    exact = np.einsum("bmk,knb->bmn", a.astype(np.float64), b.astype(np.float64))
    coefficient = (4 * 2.0**-24) ** 2 / 3 * k
    floor = dot_rounding(inst, a, b, (np.float32, np.float32), np.float32, exact, coefficient, 1 << 24)
    constant_lhs = {(0, 0), (0, 2), (1, 0), (1, 1)}
    checked = 0
    for i, m, n in np.ndindex(exact.shape):
        terms = (a[i, m].astype(np.float64) * b[:, n, i]).astype(np.float32)
        error = float(np.cumsum(terms, dtype=np.float32)[-1]) - exact[i, m, n]
        allowed = np.sqrt(coefficient * (np.sum(terms.astype(np.float64) ** 2) + exact[i, m, n] ** 2))
        if (i, m) not in constant_lhs and (i, n) != (0, 1):
            assert floor is None or floor[i, m, n] == 0, (i, m, n)
        elif abs(error) > allowed:
            assert floor is not None and abs(floor[i, m, n]) >= abs(error), (i, m, n, error, floor[i, m, n])
            checked += 1
    assert checked >= 4  # the premise: repeats past the rule's term on several elements
