"""SPMD runs: N participants as threads, collectives between them (hloexec.spmd).

The differential tests compile jax programs for 8 host devices in a subprocess (XLA_FLAGS must be set
before jax starts, and this process may already run jax with one device), save the SPMD-partitioned
post-optimization HLO with XLA:CPU's per-device inputs and outputs, and run that HLO here.
This file is also that subprocess: `python tests/test_spmd.py OUTDIR` writes the programs.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import write_with_host_devices

PROGRAMS = ("collectives", "data_parallel", "model_parallel", "sequence_parallel", "mesh_sequence_parallel")


# -- the jax side (runs in the subprocess) --------------------------------------------------------------
def programs() -> dict:
    """name -> (jitted function, its arguments: global arrays sharded over the 8 host devices, its mesh)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    assert jax.device_count() == 8, jax.devices()
    auto = jax.sharding.AxisType.Auto
    line = jax.make_mesh((8,), ("x",), axis_types=(auto,))
    grid = jax.make_mesh((2, 4), ("data", "model"), axis_types=(auto, auto))
    # the devices of a 2x4 mesh in transposed order: XLA:CPU prints its groups as
    # `mesh[...], device_ids=([2,4]T(1,0)) {...}`
    transposed = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2).T, ("batch", "seq"), axis_types=(auto, auto))
    rng = np.random.default_rng(0)

    def collectives(x, y):
        return (jax.lax.psum(x, "x"), jax.lax.all_gather(x, "x", axis=1, tiled=True),
                jax.lax.psum_scatter(y, "x", scatter_dimension=0, tiled=True),
                jax.lax.all_to_all(y, "x", 0, 0, tiled=True),
                jax.lax.ppermute(x, "x", [(i, (i + 3) % 8) for i in range(6)]), jax.lax.pmax(x, "x"))

    def data_parallel(w, x):
        return jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)

    def model_parallel(x, w1, w2):
        return jax.nn.relu(x @ w1) @ w2

    def sequence_parallel(act, up, down, scale):
        # the TPU seed's program: a rematerialized MLP block, activations split along the sequence
        block = jax.checkpoint(lambda a, u, d, s: a + jax.nn.gelu((a * s) @ u) @ d)
        return jax.grad(lambda *args: jnp.sum(block(*args) ** 2), argnums=(0, 1, 2, 3))(act, up, down, scale)

    specs = {
        "collectives": (jax.shard_map(collectives, mesh=line, in_specs=(P("x"), P("x")), out_specs=(P("x"),) * 6),
                        line, [((16, 4), P("x")), ((128, 4), P("x"))]),
        "data_parallel": (data_parallel, line, [((32, 16), P()), ((64, 32), P("x"))]),
        "model_parallel": (model_parallel, grid, [((8, 32), P("data")), ((32, 64), P(None, "model")),
                                                  ((64, 16), P("model"))]),
        "sequence_parallel": (sequence_parallel, line, [((2, 64, 32), P(None, "x")), ((32, 64), P(None, "x")),
                                                        ((64, 32), P("x")), ((32,), P())]),
        "mesh_sequence_parallel": (sequence_parallel, transposed, [((2, 64, 32), P("batch", "seq")),
                                                                   ((32, 64), P(None, "seq")),
                                                                   ((64, 32), P("seq")), ((32,), P())]),
    }
    made = {}
    for name, (fn, mesh, args) in specs.items():
        arrays = [jax.device_put(rng.standard_normal(shape, dtype=np.float32), NamedSharding(mesh, spec))
                  for shape, spec in args]
        # explicit output shardings: the pre-partition HLO then annotates its ROOT with them (XLA:CPU's
        # optimized text drops the ROOT's sharding), which `hloexec compare SHARDED PRE --spmd` assembles by
        outputs = {"model_parallel": P("data"), "sequence_parallel": tuple(spec for _, spec in args),
                   "mesh_sequence_parallel": tuple(spec for _, spec in args)}.get(name)
        jitted = jax.jit(fn) if outputs is None else \
            jax.jit(fn, out_shardings=jax.tree.map(lambda spec: NamedSharding(mesh, spec), outputs))
        made[name] = (jitted, arrays, mesh)
    return made


def _write_programs(out: Path) -> None:
    import jax
    out.mkdir(parents=True, exist_ok=True)
    for name, (jitted, arrays, mesh) in programs().items():
        order = {d.id: k for k, d in enumerate(mesh.devices.flat)}      # device -> partition id
        lowered = jitted.lower(*arrays)
        (out / f"{name}.hlo").write_text(lowered.compile().as_text())
        (out / f"{name}.pre.hlo").write_text(lowered.as_text(dialect="hlo"))
        results = jax.tree.leaves(jitted(*arrays))
        saved = {}
        for kind, values in (("arg", arrays), ("out", results)):
            for i, value in enumerate(values):
                for shard in value.addressable_shards:
                    saved[f"dev{order[shard.device.id]}/{kind}{i}"] = np.asarray(shard.data)
        for i, value in enumerate(arrays):
            saved[f"global/arg{i}"] = np.asarray(value)
        for i, value in enumerate(results):
            saved[f"global/out{i}"] = np.asarray(value)
        np.savez(out / f"{name}.npz", **saved)


@pytest.fixture(scope="module")
def jax_programs(tmp_path_factory):
    pytest.importorskip("jax")
    return write_with_host_devices(__file__, tmp_path_factory.mktemp("spmd_jax"))


def _load(path: Path, name: str):
    import hloexec
    exe = hloexec.load(path / f"{name}.hlo")
    saved = np.load(path / f"{name}.npz")
    return exe, saved


# -- differential against XLA:CPU with 8 devices --------------------------------------------------------
@pytest.mark.xla
@pytest.mark.parametrize("name", PROGRAMS)
def test_matches_xla_cpu_per_device(jax_programs, name):
    exe, saved = _load(jax_programs, name)
    n = 8
    assert exe.module.num_partitions * exe.module.replica_count == n
    inputs = [[saved[f"dev{d}/arg{i}"] for i in range(len(exe.parameters))] for d in range(n)]
    outputs = exe.run_spmd(inputs, report=lambda message: None)
    for d, out in enumerate(outputs):
        leaves = out if isinstance(out, tuple) else (out,)
        for i, got in enumerate(leaves):
            expected = saved[f"dev{d}/out{i}"]
            # f32 sums in another order: errors scale with the summands, so with the output's magnitude
            # (gradients of a sum of squares cancel down to elements far smaller than their neighbours)
            atol = max(1e-4, 1e-5 * float(np.abs(expected).max(initial=0)))
            np.testing.assert_allclose(got, expected, rtol=2e-4, atol=atol, err_msg=f"{name}: device {d}, output {i}")


@pytest.mark.xla
def test_transposed_mesh_groups_are_exercised(jax_programs):
    # the scanner and decoder paths of `mesh[...], device_ids=(...) {...}` (run per device above)
    import hloexec
    text = (jax_programs / "mesh_sequence_parallel.hlo").read_text()
    assert "device_ids=(" in text
    groups = [i.attr("replica_groups") for i in hloexec.parse(text)[0].instructions() if "replica_groups" in i.attrs]
    assert any("device_ids=" in g.text for g in groups)


@pytest.mark.xla
@pytest.mark.parametrize("name", ["data_parallel", "model_parallel"])
def test_global_inputs_split_and_outputs_assembled_by_sharding(jax_programs, name):
    from hloexec import spmd
    exe, saved = _load(jax_programs, name)
    global_inputs = [saved[f"global/arg{i}"] for i in range(len(exe.parameters))]
    per_device = spmd.split_inputs(exe.module, global_inputs, 8)
    for d in range(8):
        for i, piece in enumerate(per_device[d]):
            np.testing.assert_array_equal(piece, saved[f"dev{d}/arg{i}"])
    outputs = exe.run_spmd(per_device, report=lambda message: None)
    assert spmd.check_replicated(exe.module, outputs, atol=0) == []
    shardings = spmd.output_shardings(exe.module)
    if all(s is not None for s in shardings):
        assembled = spmd.assemble_outputs(exe.module, outputs)
        leaves = assembled if isinstance(assembled, tuple) else (assembled,)
        for i, value in enumerate(leaves):
            np.testing.assert_allclose(value, saved[f"global/out{i}"], rtol=2e-5, atol=2e-5)


# -- semantics and errors on small modules --------------------------------------------------------------
_ADD = "add { a = f32[] parameter(0)\n b = f32[] parameter(1)\n ROOT s = f32[] add(a, b) }\n"


def _module(header: str, body: str):
    import hloexec
    return hloexec.load(f"HloModule m{', ' + header if header else ''}\n{_ADD}ENTRY e {{\n{body}\n}}\n")


@pytest.mark.parametrize("attrs, groups", [
    ("", {0: [0, 2], 2: [0, 2], 1: [1, 3], 3: [1, 3]}),                       # cross-replica
    ("channel_id=1", {d: [0, 1, 2, 3] for d in range(4)}),                    # cross-replica-and-partition
    ("channel_id=1, use_global_device_ids=true", {0: [0, 3], 3: [0, 3], 1: [1, 2], 2: [1, 2]}),  # flattened
])
def test_all_reduce_group_modes(attrs, groups):
    # 2 replicas x 2 partitions; device d = replica * 2 + partition holds d + 1
    groups_text = "{{0,3},{1,2}}" if "use_global_device_ids" in attrs else "{{0,1}}"
    exe = _module("replica_count=2, num_partitions=2",
                  f"p = f32[3] parameter(0)\n ROOT r = f32[3] all-reduce(p), replica_groups={groups_text}, "
                  f"to_apply=add{', ' + attrs if attrs else ''}")
    outputs = exe.run_spmd([[np.full(3, d + 1, np.float32)] for d in range(4)], report=lambda message: None)
    for d, out in enumerate(outputs):
        np.testing.assert_array_equal(out, np.full(3, sum(g + 1 for g in groups[d]), np.float32))


@pytest.mark.parametrize("reducer, combine", [
    ("ROOT s = f32[] add(a, b)", lambda acc, v: acc + v),
    # not a ufunc: called per element; not commutative, so the fold order (group order) shows
    ("two = f32[] constant(2)\n m = f32[] multiply(b, two)\n ROOT s = f32[] add(a, m)", lambda acc, v: acc + 2 * v),
])
def test_all_reduce_folds_in_group_order_with_the_work_split(reducer, combine):
    import hloexec
    exe = hloexec.load("HloModule m, num_partitions=3\nr { a = f32[] parameter(0)\n b = f32[] parameter(1)\n "
                       + reducer + " }\nENTRY e {\n p = f32[7] parameter(0)\n ROOT r = f32[7] all-reduce(p), "
                       "channel_id=1, replica_groups={{2,0,1}}, use_global_device_ids=true, to_apply=r\n}\n")
    values = [np.random.default_rng(d).standard_normal(7).astype(np.float32) for d in range(3)]
    outputs = exe.run_spmd([[v] for v in values], report=lambda message: None)
    expected = values[2]
    for d in (0, 1):
        expected = combine(expected, values[d])
    for out in outputs:
        np.testing.assert_array_equal(out, expected)


def test_collective_permute_start_done_and_partition_id():
    exe = _module("num_partitions=4", "p = f32[2] parameter(0)\n"
                  " s = (f32[2], f32[2]) collective-permute-start(p), channel_id=1, source_target_pairs={{0,1},{1,2},{2,0}}\n"
                  " d = f32[2] collective-permute-done(s)\n i = u32[] partition-id()\n"
                  " ROOT t = (f32[2], u32[]) tuple(d, i)")
    outputs = exe.run_spmd([[np.full(2, d + 1, np.float32)] for d in range(4)], report=lambda message: None)
    received = {1: 1, 2: 2, 0: 3, 3: 0}          # device 3 is no target: zeros
    for d, (value, pid) in enumerate(outputs):
        np.testing.assert_array_equal(value, np.full(2, received[d], np.float32))
        assert int(pid) == d


def test_collective_only_some_devices_reach_is_an_error():
    import hloexec
    exe = hloexec.load("HloModule m, num_partitions=2\n" + _ADD + """
t { x = f32[4] parameter(0)
 ROOT r = f32[4] all-reduce(x), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add }
f { x = f32[4] parameter(0)
 ROOT n = f32[4] negate(x) }
ENTRY e { p = f32[4] parameter(0)
 i = u32[] partition-id()
 z = u32[] constant(0)
 c = pred[] compare(i, z), direction=EQ
 ROOT r = f32[4] conditional(c, p, p), true_computation=t, false_computation=f }
""")
    with pytest.raises(hloexec.ExecutionError, match="device 1 finished"):
        exe.run_spmd([[np.ones(4, np.float32)]] * 2, report=lambda message: None)


def test_split_assemble_round_trip_with_replicated_subgroups():
    from hloexec.ir.attributes import decode_sharding
    from hloexec.ir.shape import parse_shape
    from hloexec.spmd import agreeing_groups, assemble_global, split_global
    sharding = decode_sharding("{devices=[2,2,2]<=[2,2,2]T(2,1,0) last_tile_dim_replicate}")
    value = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)     # 6 rows over 2 tiles of 3, 8 cols of 4
    pieces = split_global(value, sharding, parse_shape("f32[3,4]"), 8)
    np.testing.assert_array_equal(assemble_global(pieces, sharding, value.shape), value)
    for group in agreeing_groups(sharding, 8, 2):
        assert len(group) == 2 and all(pieces[d] is pieces[group[0]] for d in group)     # one shared tile
    shared = split_global(value, decode_sharding("{replicated}"), parse_shape("f32[6,8]"), 8)
    assert all(p is shared[0] for p in shared) and not shared[0].flags.writeable


def test_device_counts_inferred_from_groups():
    from hloexec.spmd import device_counts
    exe = _module("", "p = f32[3] parameter(0)\n ROOT r = f32[3] all-reduce(p), channel_id=1, "
                  "replica_groups={{0,8},{1,9}}, use_global_device_ids=true, to_apply=add")
    partitions, replicas, note = device_counts(exe.module)
    assert (partitions, replicas) == (10, 1) and "largest device ids" in note


if __name__ == "__main__":
    _write_programs(Path(sys.argv[1]))


def test_memory_estimate_counts_scratch_for_the_participants_that_can_run_at_once():
    """f16 ops hold f32 copies while they run: counted for min(N, cores) participants, not all N."""
    import hloexec
    from hloexec.spmd import memory_estimate
    from hloexec.kernels.threads import CORES
    text = """HloModule m, num_partitions=8
ENTRY e { x = f16[262144] parameter(0)
  y = f16[262144] parameter(1)
  a = f16[262144] add(x, y)
  ROOT m = f16[262144] multiply(a, x) }"""
    exe = hloexec.load(text, use_numba=False)
    inputs = [exe.random_inputs(d) for d in range(8)]
    est = memory_estimate(exe, inputs)
    per_inputs = 2 * 262144 * 2
    stored = exe.plan.memory.peak_bytes(scratch=False) - per_inputs
    scratch = exe.peak_bytes() - exe.plan.memory.peak_bytes(scratch=False)
    assert scratch > 0 and stored > 0
    assert est["work"] == 8 * stored + min(8, CORES) * scratch < 8 * (exe.peak_bytes() - per_inputs)
    assert est["total"] == est["work"] + 8 * per_inputs



def test_the_memory_limit_is_the_options_max_memory():
    """The participants' total estimate against the options' max_memory (hloexec.load's, as for one participant):
    MemoryLimitError before any participant starts; run_spmd's memory_limit= is a deprecated name of it."""
    import hloexec
    from hloexec.errors import MemoryLimitError
    from hloexec.spmd import memory_estimate
    text = "HloModule m, num_partitions=4\nENTRY e { p = f32[1024] parameter(0)\n ROOT n = f32[1024] negate(p) }"
    inputs = [[np.full(1024, d, np.float32)] for d in range(4)]
    total = memory_estimate(hloexec.load(text), inputs)["total"]
    quiet = {"report": lambda message: None}
    with pytest.raises(MemoryLimitError, match="m on 4 participants needs .* in all .* but max_memory allows"):
        hloexec.load(text, max_memory=total - 1).run_spmd(inputs, **quiet)
    outputs = hloexec.load(text, max_memory=total).run_spmd(inputs, **quiet)
    assert [float(out[0]) for out in outputs] == [-0.0, -1.0, -2.0, -3.0]
    with pytest.raises(MemoryLimitError), pytest.warns(DeprecationWarning, match="max_memory"):
        hloexec.load(text).run_spmd(inputs, memory_limit=total - 1, **quiet)

_TIERED = """HloModule m, num_partitions=4
fused {
  p = f32[32768] parameter(0)
  e = f32[32768] exponential(p)
  ROOT r = f32[32768] multiply(e, p)
}
cond {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  one = s32[] constant(1)
  j = s32[] add(i, one)
  x = f32[4] get-tuple-element(s), index=1
  y = f32[4] exponential(x)
  ROOT t = (s32[], f32[4]) tuple(j, y)
}
ENTRY e {
  p = f32[32768] parameter(0)
  f = f32[32768] fusion(p), kind=kLoop, calls=fused
  z = s32[] constant(0)
  q = f32[4] slice(p), slice={[0:4]}
  s = (s32[], f32[4]) tuple(z, q)
  w = (s32[], f32[4]) while(s), condition=cond, body=body
  l = f32[4] get-tuple-element(w), index=1
  ROOT t = (f32[32768], f32[4]) tuple(f, l)
}
"""


def test_tiers_count_per_participant():
    """SPMD participants share one plan: each still runs a fusion op by op on its own first call, so the
    k-th run of every device gives the same bits whichever thread got there first."""
    import hloexec
    from hloexec.exec.tiering import TieredKernel, TieredLoop
    exe = hloexec.load(_TIERED, compile="eager", compile_after=1)
    x = np.linspace(-3, 3, 32768, dtype=np.float32)
    reference = hloexec.load(_TIERED, use_numba=False).run(x)
    fusion, loop = (next(s.kernel for s in exe.plan.steps if s.inst.opcode == op) for op in ("fusion", "while"))
    assert isinstance(fusion, TieredKernel) and isinstance(loop, TieredLoop)
    first = exe.run_spmd([[x]] * 4, report=lambda message: None)
    assert fusion.calls == {0: 1, 1: 1, 2: 1, 3: 1} and set(loop.work) == {0, 1, 2, 3}
    for out in first:                       # every device's first run is the op-by-op one
        for got, want in zip(out, reference):
            assert got.tobytes() == want.tobytes()
    second = exe.run_spmd([[x]] * 4, report=lambda message: None)
    assert fusion.compiled is not None
    for out in second[1:]:
        for got, want in zip(out, second[0]):
            assert got.tobytes() == want.tobytes()


def test_only_the_observed_participants_are_observed():
    """run_spmd(observed=...): those participants are observed, inside their fusions too (op by op); the others
    run unobserved, the fusion compiled (the same bits among them, within an ulp of the op-by-op ones)."""
    import hloexec
    exe = hloexec.load(_TIERED, compile="eager", compile_after=1)
    x = np.linspace(-3, 3, 32768, dtype=np.float32)
    first = exe.run_spmd([[x]] * 4, report=lambda message: None)       # each participant's first run: op by op
    seen = []
    outputs = exe.run_spmd([[x]] * 4, report=lambda message: None, observed=(2,),
                           observe=lambda device, inst, value: seen.append((device, inst.name)))
    assert {d for d, _ in seen} == {2} and {"e", "r", "f", "y"} <= {name for _, name in seen}
    for d in (0, 1, 3):
        for got, want in zip(outputs[d], outputs[0]):
            assert got.tobytes() == want.tobytes()
    for got, want in zip(outputs[2], first[2]):                        # observed: op by op again
        assert got.tobytes() == want.tobytes()
    np.testing.assert_allclose(outputs[0][0], outputs[2][0], rtol=1e-6)


ALL_IN_ONE_GROUP = """HloModule ar, num_partitions=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  p = f32[4] parameter(0)
  ROOT r = f32[4] all-reduce(p), channel_id=1, to_apply=add
}
"""


def test_the_estimate_counts_the_payloads_a_collective_posts_per_member_of_its_group():
    """Every participant posts a payload per member of its group: N x G mailbox entries whatever the arrays'
    sizes (4000 participants of f32[4] took 5.4 GB). The estimate counts them (it said 0.1 MB), measured here with
    tracemalloc on 200 participants."""
    import tracemalloc

    import hloexec
    from hloexec.spmd import memory_estimate
    exe = hloexec.load(ALL_IN_ONE_GROUP, compile="never")
    n = 200
    inputs = [[np.full(4, d, np.float32)] for d in range(n)]
    estimate = memory_estimate(exe, inputs, counts=(n, 1))
    assert estimate["exchanges"] >= n * n * 300
    tracemalloc.start()
    try:
        outputs = exe.run_spmd(inputs, n, 1, report=lambda message: None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outputs[7].tolist() == [sum(range(n))] * 4
    assert peak <= estimate["work"] <= 2 * peak, (peak, estimate)


def test_60000_participants_in_one_group_are_refused_at_once_naming_the_payloads(tmp_path, capsys):
    """--partitions 100000 on a tiny module with one all-reduce: 10^10 payloads (3 TB) were not counted; the run
    set out to post them. Refused before any participant starts, saying what does not fit (60,000: within the most
    participants a run takes, 3.6 10^9 payloads)."""
    import time

    from hloexec.tools.cli import main
    path = tmp_path / "ar.hlo"
    path.write_text(ALL_IN_ONE_GROUP)
    start = time.monotonic()
    code = main(["run", str(path), "--partitions", "60000", "--max-memory", "16G"])
    err = capsys.readouterr().err
    assert code == 2 and "ar on 60000 participants needs" in err and "the payloads their collectives post" in err, err
    assert time.monotonic() - start < 60


def test_participants_without_collectives_reuse_a_few_threads():
    """A participant starts once a compute slot is free, on a thread whose participant finished: 3000 of a module
    without collectives run on about as many threads as slots (a thread each, ~0.3 ms to start on two cores:
    --partitions 100000 took 37 s, now ~8 s)."""
    import threading

    import hloexec
    from hloexec.kernels.threads import CORES
    text = "HloModule m, num_partitions=2\nENTRY e { p = f32[4] parameter(0)\n ROOT n = f32[4] negate(p) }"
    exe = hloexec.load(text, compile="never")
    n = 3000
    inputs = [[np.full(4, d, np.float32)] for d in range(n)]
    names: dict[int, str] = {}

    def observe(d, inst, value):
        names[d] = threading.current_thread().name

    outputs = exe.run_spmd(inputs, n, 1, report=lambda message: None, observe=observe)
    assert [float(out[0]) for out in outputs] == [-float(d) for d in range(n)]
    assert len(names) == n and len(set(names.values())) <= CORES + 2, len(set(names.values()))


def test_the_collectives_report_of_one_group_of_100000_is_quick(tmp_path, capsys):
    """`collectives` and `export` asked every device for its group (each a list of N): N^2, over 120 s for a
    header's num_partitions=100000; each group is asked of its first member now."""
    import time

    from hloexec.tools.cli import main
    path = tmp_path / "ar.hlo"
    path.write_text(ALL_IN_ONE_GROUP.replace("num_partitions=2", "num_partitions=100000"))
    start = time.monotonic()
    assert main(["collectives", str(path)]) == 0
    assert "1 group of 100000: {0-99999}" in capsys.readouterr().out
    assert time.monotonic() - start < 30
