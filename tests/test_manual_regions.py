"""Pre-partition modules with manual regions (shard_map), and Shardy's sharding forms.

jax programs for 8 host devices are lowered in a subprocess (XLA_FLAGS must be set before jax starts) to their
pre-partition HLO, with Shardy (xla.sdy.GlobalToLocalShape ... LocalToGlobalShape, xla.sdy.* attributes) and
without (GSPMD's SPMDFullToShardShape ... SPMDShardToFullShape); hloexec runs each as the global program, every
device a participant inside the regions, and must give jax's (XLA:CPU's, 8 devices) global outputs.
This file is also that subprocess: `python tests/test_manual_regions.py OUTDIR`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import write_with_host_devices

PROGRAMS = ("full_psum", "partial_psum", "gather_permute", "send_recv")


# -- the jax side (runs in the subprocess) --------------------------------------------------------------
def _write_programs(out: Path) -> None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    assert jax.device_count() == 8, jax.devices()
    auto = jax.sharding.AxisType.Auto
    line = jax.make_mesh((8,), ("x",), axis_types=(auto,))
    grid = jax.make_mesh((2, 4), ("x", "y"), axis_types=(auto, auto))
    rng = np.random.default_rng(0)
    ring = [(i, (i + 1) % 8) for i in range(8)]
    chain = [(i, i + 1) for i in range(7)]

    def full_psum(a):
        f = jax.shard_map(lambda v: jax.lax.psum(v * 2, "x") + v, mesh=line, in_specs=P("x"), out_specs=P("x"))
        return jnp.sin(f(a + 1)) * 3

    def partial_psum(a, b):         # manual along x only: y stays automatic inside the region
        f = jax.shard_map(lambda u, v: (jax.lax.psum(u * 2, "x") + v, u), mesh=grid, in_specs=(P("x"), P("x")),
                          out_specs=(P("x"), P("x")), axis_names={"x"})
        r, s = f(a + 1, b)
        return jnp.sin(r), s

    def gather_permute(a):
        f = jax.shard_map(lambda v: (jax.lax.all_gather(v, "y", axis=1, tiled=True),
                                     jax.lax.ppermute(v, "x", [(0, 1), (1, 0)])),
                          mesh=grid, in_specs=P("x", "y"), out_specs=(P("x", None), P("x", "y")), check_vma=False)
        return f(jnp.cos(a))

    def send_recv(a):               # psend/precv lower for GPU only: the ppermute twin is the reference
        def body(v):
            token = jax.lax.psend(v * 2, "x", chain)
            return jax.lax.precv(token, jax.ShapeDtypeStruct(v.shape, v.dtype), "x", chain) + 1
        return jax.shard_map(body, mesh=line, in_specs=P("x"), out_specs=P("x"))(a)

    def send_recv_reference(a):
        return jax.shard_map(lambda v: jax.lax.ppermute(v * 2, "x", chain) + 1, mesh=line, in_specs=P("x"),
                             out_specs=P("x"))(a)

    arguments = {"full_psum": [(16, 4)], "partial_psum": [(8, 8), (8, 8)], "gather_permute": [(4, 8)],
                 "send_recv": [(16, 2)]}
    programs = {"full_psum": full_psum, "partial_psum": partial_psum, "gather_permute": gather_permute,
                "send_recv": send_recv}
    meta = {}
    for shardy in (True, False):
        jax.config.update("jax_use_shardy_partitioner", shardy)
        for name, fn in programs.items():
            args = [rng.standard_normal(shape, dtype=np.float32) for shape in arguments[name]]
            jitted = jax.jit(fn)
            if name == "send_recv":
                lowered = jitted.trace(*args).lower(lowering_platforms=("cuda",))
                results = jax.jit(send_recv_reference)(*args)
            else:
                lowered = jitted.lower(*args)
                results = jitted(*args)
            tag = f"{name}.{'sdy' if shardy else 'gspmd'}"
            (out / f"{tag}.hlo").write_text(lowered.as_text(dialect="hlo"))
            saved = {f"arg{i}": a for i, a in enumerate(args)}
            saved.update({f"out{i}": np.asarray(r) for i, r in enumerate(jax.tree.leaves(results))})
            np.savez(out / f"{tag}.npz", **saved)
    # Shardy's and XLA's forms of the same shardings, from jax's pre-partition HLO (both are printed there)
    jax.config.update("jax_use_shardy_partitioner", True)
    transposed = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2).T, ("a", "b"), axis_types=(auto,) * 2)
    for mesh_name, mesh in (("grid", grid), ("transposed", transposed)):
        for spec in (P("x", None), P(None, "y"), P(("y", "x")), P("y", "x")) if mesh_name == "grid" else \
                (P("a"), P("b", "a"), P(None, ("a", "b"))):
            sharded = jax.jit(lambda v: v * 2, in_shardings=jax.sharding.NamedSharding(mesh, spec))
            meta.setdefault("pairs", []).append(sharded.lower(jnp.zeros((8, 8))).as_text(dialect="hlo"))
    (out / "shardings.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def jax_programs(tmp_path_factory):
    pytest.importorskip("jax")
    return write_with_host_devices(__file__, tmp_path_factory.mktemp("manual_jax"))


@pytest.mark.xla
@pytest.mark.parametrize("form", ["sdy", "gspmd"])
@pytest.mark.parametrize("name", PROGRAMS)
def test_pre_partition_module_matches_jax(jax_programs, name, form):
    import hloexec
    text = (jax_programs / f"{name}.{form}.hlo").read_text()
    assert ("xla.sdy.GlobalToLocalShape" if form == "sdy" else "SPMDFullToShardShape") in text
    saved = np.load(jax_programs / f"{name}.{form}.npz")
    exe = hloexec.load(text)
    assert exe.manual_regions
    outputs = exe.run(*[saved[f"arg{i}"] for i in range(len(exe.parameters))])
    for i, got in enumerate(outputs if isinstance(outputs, tuple) else (outputs,)):
        np.testing.assert_allclose(got, saved[f"out{i}"], rtol=1e-5, atol=1e-5)


@pytest.mark.xla
def test_shardy_attributes_decode_as_xla_prints_them(jax_programs):
    """jax prints each parameter's sharding twice, XLA's `sharding=` and Shardy's xla.sdy.sharding: the Shardy
    form, and the same written as XLA 0.10's named sharding `{mesh['x'=2,'y'=4], [{'x'}, {}]}`, decode to it."""
    import re
    import hloexec
    from hloexec.ir.attributes import decode_sharding
    from hloexec.ir.shardy import module_meshes, sharding_of
    for text in json.loads((jax_programs / "shardings.json").read_text())["pairs"]:
        module = hloexec.parse(text)[0]
        param = module.entry.parameters[0]
        classic = param.attr("sharding")
        sdy = param.attr("frontend_attributes")["xla.sdy.sharding"]
        del param.attrs["sharding"]
        shardy = sharding_of(param)
        mesh = next(iter(module_meshes(module).values()))
        axes = ",".join(f"'{n}'={s}" for n, s in zip(mesh.names, mesh.sizes))
        ids = "" if mesh.device_ids is None else f", device_ids=({','.join(map(str, mesh.device_ids))})"
        dims = re.search(r"\[(.*)\]>$", sdy).group(1).replace('"', "'")
        named = decode_sharding(f"{{mesh[{axes}]{ids}, [{dims}]}}")
        for got in (shardy, named):
            assert (got.kind, got.tile_dims, got.devices, got.last_tile_dim_replicate) == \
                (classic.kind, classic.tile_dims, classic.devices, classic.last_tile_dim_replicate), (sdy, classic.text)


@pytest.mark.parametrize("text, kind, tile_dims, devices, subgroups", [
    ("{mesh['devices'=1], [{}, {}]}", "replicated", (), (), ()),            # the v6e dumps' forms
    ("{mesh[], replicated}", "replicated", (), (), ()),
    ("{maximal_mesh[device_id=3]}", "maximal", (), (), ()),
    ("{mesh['x'=2], manual}", "manual", (), (), ()),
    ("{mesh['x'=2,'y'=4], [{'y', 'x'}, {}]}", "tiled", (8, 1), (0, 4, 1, 5, 2, 6, 3, 7), ()),
    ("{mesh['x'=2,'y'=4], [{'x'}, {}], manual={'y'}}", "tiled", (2, 1, 4), tuple(range(8)), ("manual",)),
    ("{mesh['x'=2,'y'=4], device_ids=([2,4]T(1,0)), [{'y'}, {?}]}", "tiled", (4, 1, 2), (0, 2, 4, 6, 1, 3, 5, 7),
     ("replicated",)),
    ("{mesh['x'=8], [{'x':(1)2}, {'x':(2)4}], metadata={op_name=\"a\"}}", "tiled", (2, 4), tuple(range(8)), ()),
    ("{mesh['x'=4], [{'x':(2)2}]}", "tiled", (2, 2), (0, 2, 1, 3), ("replicated",)),
])
def test_named_sharding_forms(text, kind, tile_dims, devices, subgroups):
    from hloexec.ir.attributes import decode_sharding
    s = decode_sharding(text)
    replicate = subgroups == ("replicated",)
    assert (s.kind, s.tile_dims, s.devices, s.last_tile_dim_replicate, s.last_tile_dims) == \
        (kind, tile_dims, devices, replicate, () if replicate else subgroups)


@pytest.mark.parametrize("text, message", [
    ("{mesh['x'=2], [{'z'}]}", "not a valid axis"),
    ("{mesh['x'=2], [{'x'}, {'x'}]}", "shards two dimensions"),
    ("{mesh['x'=6], [{'x':(4)2}]}", "does not divide"),
    ("{mesh['x'=2], [{'x'}], sideways={'x'}}", "unknown attribute in named sharding"),
])
def test_bad_named_shardings_are_parse_errors(text, message):
    import hloexec
    module = hloexec.parse(f"HloModule m\nENTRY e {{\n ROOT p = f32[4,4] parameter(0), sharding={text}\n}}\n")[0]
    with pytest.raises(hloexec.HloParseError, match=message):
        module.entry.root.attr("sharding")


def test_spmd_run_of_a_pre_partition_module_says_what_it_is(tmp_path):
    from hloexec.tools.cli import main
    text = """HloModule m
ENTRY e {
  p = f32[4,2] parameter(0), sharding={devices=[2,1]<=[2]}
  l = f32[2,2] custom-call(p), custom_call_target="SPMDFullToShardShape", sharding={manual}
  n = f32[2,2] negate(l)
  ROOT g = f32[4,2] custom-call(n), custom_call_target="SPMDShardToFullShape", sharding={devices=[2,1]<=[2]}
}
"""
    path = tmp_path / "pre.hlo"
    path.write_text(text)
    assert main(["run", str(path), "--spmd"]) == 2
    import hloexec
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_array_equal(hloexec.load(text).run(x), -x)


if __name__ == "__main__":
    _write_programs(Path(sys.argv[1]))
