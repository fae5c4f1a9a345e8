"""Supplying custom-call targets: `--plugin FILE`, `--custom-call-identity NAME`, the `hloexec.custom_calls`
entry points, the errors for unknown targets and opaque kernels, and the example plugin on the dump it is for."""
from __future__ import annotations

import importlib.metadata
import json
import sys

import numpy as np
import pytest

import hloexec
import hloexec.ops.custom_call as CC
from hloexec.errors import UnsupportedError
from hloexec.tools.cli import main

from conftest import EXAMPLES, shared_path

DOUBLE = """HloModule m

ENTRY e {
  p = f32[3] parameter(0)
  ROOT c = f32[3] custom-call(p), custom_call_target="double_it"
}
"""


@pytest.fixture(autouse=True)
def restore_registry():
    """Each test's registrations are undone, so the registry other tests see is the built-in one."""
    saved = dict(CC.CUSTOM_CALLS)
    yield
    CC.CUSTOM_CALLS.clear()
    CC.CUSTOM_CALLS.update(saved)


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_unknown_target_says_how_to_plug_one_in():
    with pytest.raises(UnsupportedError) as e:
        hloexec.load(DOUBLE)
    msg = str(e.value)
    assert "'double_it'" in msg and "--plugin" in msg and "hloexec.custom_calls" in msg
    assert "--custom-call-identity" in msg and "HLO line 5" in msg


def test_plugin_file_registers_targets_for_run_and_compare(tmp_path, capsys):
    plugin = tmp_path / "my_calls.py"
    plugin.write_text("from hloexec.ops.custom_call import register_custom_call\n"
                      "register_custom_call('double_it', lambda inst, ctx: (lambda x: x * 2))\n")
    module = tmp_path / "m.hlo"
    module.write_text(DOUBLE)
    out_npz = tmp_path / "out.npz"
    code, out, err = run_cli(capsys, "run", module, "--plugin", plugin, "--seed", "1", "--out", out_npz, "--json")
    assert code == 0, err
    x = hloexec.load(DOUBLE.replace("double_it", "Sharding")).random_inputs(1)[0]
    np.testing.assert_array_equal(np.load(out_npz)["out0"], 2 * x)
    reference = tmp_path / "ref.hlo"
    reference.write_text(DOUBLE.replace('custom-call(p), custom_call_target="double_it"', "add(p, p)"))
    code, out, err = run_cli(capsys, "compare", module, reference, "--plugin", plugin, "--json")
    assert code == 0 and json.loads(out)["passed"], err


def test_broken_or_missing_plugin_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad_calls.py"
    bad.write_text("x = 1\nraise RuntimeError('no GPU here')\n")
    module = tmp_path / "m.hlo"
    module.write_text(DOUBLE)
    code, _, err = run_cli(capsys, "run", module, "--plugin", bad)
    assert code == 2 and "bad_calls.py failed at line 2: RuntimeError: no GPU here" in err
    assert "internal error" not in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "run", module, "--plugin", tmp_path / "nowhere.py")
    assert code == 2 and "nowhere.py: no such file" in err


def test_custom_call_identity_passes_the_operand_through(tmp_path, capsys):
    module = tmp_path / "m.hlo"
    module.write_text(DOUBLE.replace("double_it", "MyTransfer"))
    out_npz = tmp_path / "out.npz"
    assert run_cli(capsys, "run", module, "--custom-call-identity", "MyTransfer", "--out", out_npz)[0] == 0
    x = hloexec.load(DOUBLE.replace("double_it", "Sharding")).random_inputs(0)[0]
    np.testing.assert_array_equal(np.load(out_npz)["out0"], x)
    changes_shape = DOUBLE.replace("ROOT c = f32[3]", "ROOT c = f32[1]").replace("double_it", "MyTransfer")
    CC.register_identity("MyTransfer")
    with pytest.raises(UnsupportedError, match="changes the shape"):
        hloexec.load(changes_shape)


def test_entry_point_plugins_load_on_the_first_unknown_target(tmp_path, monkeypatch):
    (tmp_path / "ep_calls.py").write_text(
        "from hloexec.ops.custom_call import register_custom_call\n"
        "def register():\n"
        "    register_custom_call('double_it', lambda inst, ctx: (lambda x: x + x))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint(name="doubling", value="ep_calls:register", group=CC.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [ep] if group == CC.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(CC.registry, "_entry_points_loaded", False)
    exe = hloexec.load(DOUBLE)
    np.testing.assert_array_equal(exe.run(np.arange(3, dtype=np.float32)), [0, 2, 4])
    sys.modules.pop("ep_calls", None)


def test_opaque_kernels_say_they_are_opaque():
    text = DOUBLE.replace("double_it", "tpu_custom_call")
    with pytest.raises(UnsupportedError, match="opaque compiled kernel.*Mosaic TPU.*--plugin"):
        hloexec.load(text)
    CC.register_custom_call("tpu_custom_call", lambda inst, ctx: (lambda x: -x))     # a plugin replaces the error
    np.testing.assert_array_equal(hloexec.load(text).run(np.ones(3, np.float32)), [-1, -1, -1])


def test_example_plugin_runs_the_jax_docs_rms_norm_dump():
    """examples/custom_call_plugin.py on the JAX tutorial's dump: out and invvar against a float64 RMS norm."""
    path = shared_path("corpus", "external", "files", "jaxdocs_custom_op_rms_norm_shardmap_gpu.hlo")
    from hloexec.tools.plugins import load_plugin_file
    load_plugin_file(str(EXAMPLES / "custom_call_plugin.py"))
    exe = hloexec.load(path)
    x, w = exe.random_inputs(0)
    out = exe.run(x, w)
    rows = x.astype(np.float64).reshape(4, -1)
    invvar = 1 / np.sqrt(np.mean(rows ** 2, axis=1) + 1e-5)
    want = (w.astype(np.float64).reshape(1, -1) * rows * invvar[:, None]).reshape(x.shape)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=2e-3, atol=2e-3)


NEURON_SMALL = ["torchxla_neuron_fsdp_spmd_partition_id_param.hlo", "torchxla_neuron_gpt2_tp8_fullyunrolled.hlo",
                "torchxla_neuron_linear_adam.hlo", "torchxla_neuron_llama_seq_shard.hlo",
                "torchxla_neuron_megatron_spmd_small.hlo"]
NEURON_BIG = ["torchxla_neuron_bert_baseline_3mb.hlo", "torchxla_neuron_gptneox_tp2_scribable.hlo"]


@pytest.mark.parametrize("name", NEURON_SMALL + [pytest.param(n, marks=pytest.mark.slow) for n in NEURON_BIG])
def test_neuron_dumps_run_with_the_transfer_as_identity(name, capsys):
    path = shared_path("corpus", "external", "files", name)
    code, _, err = run_cli(capsys, "run", path, "--seed", "0")
    assert code == 2 and "AwsNeuronTransferWithStaticRing" in err
    code, out, err = run_cli(capsys, "run", path, "--seed", "0", "--json",
                             "--custom-call-identity", "AwsNeuronTransferWithStaticRing")
    assert code == 0, err
    assert json.loads(out)["outputs"]
