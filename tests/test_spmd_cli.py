"""`hloexec run --spmd / --partitions N` and `hloexec compare SHARDED PRE --spmd` (hloexec.tools.cli).

The jax programs are tests/test_spmd.py's (8 host devices, XLA:CPU's per-device inputs and outputs,
the pre-partition HLO with explicit output shardings); the small modules below are hand-written.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from hloexec.tools.cli import main
from hloexec.tools.xla_cpu import load_arrays, save_arrays

from test_spmd import jax_programs  # noqa: F401  (the module-scoped fixture: writes the programs once)

# 4 partitions: x tiled over them; out0 the all-reduced sum (replicated), out1 x * (partition id + 1) tiled,
# out2 claims to be replicated but holds x's tile, which differs across partitions
SPMD_MODULE = """HloModule tiled_sum, num_partitions=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  x = f32[2,3] parameter(0), sharding={devices=[4,1]<=[4]}
  total = f32[2,3] all-reduce(x), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  pid = u32[] partition-id()
  one = u32[] constant(1)
  k = u32[] add(pid, one)
  kf = f32[] convert(k)
  kb = f32[2,3] broadcast(kf), dimensions={}
  scaled = f32[2,3] multiply(x, kb)
  ROOT out = (f32[2,3], f32[2,3], f32[2,3]) tuple(total, scaled, x),
    sharding={{replicated}, {devices=[4,1]<=[4]}, {replicated}}
}
"""


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def tiled_sum(tmp_path):
    path = tmp_path / "tiled_sum.hlo"
    path.write_text(SPMD_MODULE)
    x = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    x[1, 2] = np.inf          # summaries of outputs the devices disagree on take infinities too
    save_arrays(tmp_path / "global.npz", {"arg0": x})
    return path, x


def test_run_splits_global_inputs_assembles_outputs_and_reports_disagreement(tmp_path, capsys, tiled_sum):
    path, x = tiled_sum
    out = tmp_path / "out.npz"
    code, text, _ = run_cli(capsys, "run", path, "--spmd", "--inputs", tmp_path / "global.npz", "--out", out)
    assert code == 1, text          # out2 is declared replicated and is not
    assert "4 participants" in text and "4 partitions x 1 replicas" in text
    assert "device 1 differs from device 0" in text
    saved = load_arrays(out)
    tiles = np.split(x, 4)
    np.testing.assert_allclose(saved["out0"], sum(tiles), rtol=1e-6)
    np.testing.assert_array_equal(saved["out1"], np.concatenate([t * (d + 1) for d, t in enumerate(tiles)]))
    for d, tile in enumerate(tiles):
        np.testing.assert_array_equal(saved[f"dev{d}/out2"], tile)
        np.testing.assert_array_equal(saved[f"dev{d}/out1"], tile * (d + 1))
    # one line per output: out0 agrees on every device, out1 differs (min/max over all devices)
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()[:1].isdigit()}
    assert " 0-3 " in lines["0"] and "(4 values)" in lines["1"]


def test_run_json_per_device_inputs_and_the_memory_limit(tmp_path, capsys, tiled_sum):
    path, x = tiled_sum
    per_device = {f"dev{d}/arg0": tile for d, tile in enumerate(np.split(x, 4))}
    save_arrays(tmp_path / "per_device.npz", per_device)
    code, text, _ = run_cli(capsys, "run", path, "--partitions", "4", "--inputs", tmp_path / "per_device.npz",
                            "--json")
    doc = json.loads(text)
    assert code == 1 and doc["spmd"]["devices"] == 4 and doc["spmd"]["inputs"]["split"] == "per device"
    assert doc["spmd"]["memory"]["participants"] == 4
    assert doc["replicated"]["outputs_checked"] == 2 and len(doc["replicated"]["problems"]) == 3
    assert [o["devices_agree"] for o in doc["outputs"]] == [True, False, False]
    assert doc["outputs"][0]["per_device"][0]["devices"] == [0, 1, 2, 3]
    code, _, err = run_cli(capsys, "run", path, "--spmd", "--max-memory", "100")
    assert code == 2 and "on 4 participants needs" in err and "max_memory allows 0.00 GiB" in err


def test_run_infers_device_counts_and_says_so(tmp_path, capsys):
    path = tmp_path / "no_header.hlo"
    path.write_text(SPMD_MODULE.replace(", num_partitions=4", ""))
    code, text, _ = run_cli(capsys, "run", path, "--spmd", "--seed", "3")
    assert "no num_partitions/replica_count in the header; running 4 partitions x 1 replicas" in text
    assert code == 1 and "replicated outputs: 3 disagreements" in text and "device 3 differs from device 0" in text


@pytest.mark.xla
def test_run_per_device_matches_xla_cpu(jax_programs, tmp_path, capsys):  # noqa: F811
    saved = np.load(jax_programs / "mesh_sequence_parallel.npz")
    save_arrays(tmp_path / "in.npz", {k: saved[k] for k in saved.files if k.startswith("dev") and "/arg" in k})
    out = tmp_path / "out.npz"
    code, text, err = run_cli(capsys, "run", jax_programs / "mesh_sequence_parallel.hlo", "--spmd",
                              "--inputs", tmp_path / "in.npz", "--out", out)
    assert code == 0, text + err
    got = load_arrays(out)
    for d in range(8):
        for i in range(4):
            expected = saved[f"dev{d}/out{i}"]
            atol = max(1e-4, 1e-5 * float(np.abs(expected).max()))      # f32 sums in another order
            np.testing.assert_allclose(got[f"dev{d}/out{i}"], expected, rtol=2e-4, atol=atol)


@pytest.mark.xla
@pytest.mark.parametrize("name, flag", [("sequence_parallel", "--spmd"), ("mesh_sequence_parallel", "--partitions=8"),
                                        ("model_parallel", "--spmd")])
def test_compare_sharded_against_pre_partition_module(jax_programs, tmp_path, capsys, name, flag):  # noqa: F811
    saved = np.load(jax_programs / f"{name}.npz")
    n_args = sum(1 for k in saved.files if k.startswith("global/arg"))
    save_arrays(tmp_path / "global.npz", {f"arg{i}": saved[f"global/arg{i}"] for i in range(n_args)})
    sharded, pre = jax_programs / f"{name}.hlo", jax_programs / f"{name}.pre.hlo"
    # the sharded outputs, assembled by the pre-partition ROOT's shardings, against the unpartitioned run;
    # f32 gradients summed in another order (partial sums all-reduced): elements that cancel down to ~1
    # beside ones of ~1e5 carry absolute errors of ~1e-2
    for inputs in (["--seed", "1"], ["--inputs", tmp_path / "global.npz"]):
        code, text, err = run_cli(capsys, "compare", sharded, pre, flag, *inputs, "--atol", "0.05", "--rtol", "1e-3",
                                  "--json")
        doc = json.loads(text)
        assert code == 0, err + text
        assert doc["passed"] and len(doc["outputs"]) == sum(1 for k in saved.files if k.startswith("global/out"))


def test_compare_refuses_outputs_it_cannot_assemble(tmp_path, capsys):
    # neither module gives output 1 a sharding: its per-device [2,3] pieces have no place in the global [8,3]
    sharded = tmp_path / "sharded.hlo"
    sharded.write_text(SPMD_MODULE.replace(",\n    sharding={{replicated}, {devices=[4,1]<=[4]}, {replicated}}", ""))
    reference = tmp_path / "unsharded.hlo"
    reference.write_text("HloModule unsharded\n\nENTRY e {\n  x = f32[8,3] parameter(0)\n"
                         "  s = f32[2,3] slice(x), slice={[0:2], [0:3]}\n"
                         "  ROOT out = (f32[2,3], f32[8,3], f32[2,3]) tuple(s, x, s)\n}\n")
    code, _, err = run_cli(capsys, "compare", sharded, reference, "--spmd")
    assert code == 2 and "output 1 has no sharding" in err and "cannot assemble" in err


def test_compare_expected_of_other_global_shapes_is_a_bad_input(tmp_path, capsys, tiled_sum):
    """--expected holds global arrays: one of a device's shape ([2,3] for the global [8,3]) is an input error
    (exit 2) naming it, not a mismatch."""
    path, x = tiled_sum
    total = x.reshape(4, 2, 3).sum(axis=0)
    scaled = x * np.repeat(np.arange(1, 5, dtype=np.float32), 2)[:, None]
    args = ["compare", path, "--spmd", "--inputs", tmp_path / "global.npz", "--expected", tmp_path / "e.npz"]
    save_arrays(tmp_path / "e.npz", {"out0": total, "out1": scaled[:2], "out2": x[:2]})
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and "e.npz: array out1 has shape [2, 3], expected [8, 3]" in err, err
    save_arrays(tmp_path / "e.npz", {"out0": total, "out1": scaled, "out2": x[:2]})
    code, out, err = run_cli(capsys, *args)
    assert code in (0, 1) and "has shape" not in err, err
