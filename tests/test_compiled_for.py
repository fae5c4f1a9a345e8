"""What a dump was compiled for (hloexec.ir.compiled_for) and the profile `--device auto` picks from it: on small
modules written with one backend's marks each, on the real dumps of ../shared (their SOURCES say where each was
compiled) and the repo's XLA:CPU examples, and through `hloexec stats`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import hloexec

from hloexec.ir.compiled_for import auto_device, compiled_for
from hloexec.parser import parse
from hloexec.tools.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def module(body: str, header: str = "HloModule m, is_scheduled=true"):
    return parse(f"{header}\n\n{body}")[0]


def gemm(target: str, types=("f32", "f32", "f32"), config: str = "{}") -> str:
    a, b, out = types
    return (f"ENTRY e {{\n  a = {a}[4,8]{{1,0}} parameter(0)\n  b = {b}[8,2]{{1,0}} parameter(1)\n"
            f"  ROOT g = {out}[4,2]{{1,0}} custom-call(a, b), custom_call_target=\"{target}\", "
            f"backend_config={config}\n}}\n")


FUSED = """fused (p: f32[16,32]) -> f32[16] {
  p = f32[16,32]{1,0} parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[16]{0} reduce(p, z), dimensions={1}, to_apply=add
}

add (x: f32[], y: f32[]) -> f32[] {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

ENTRY e {
  a = f32[16,32]{1,0} parameter(0)
  ROOT f = f32[16]{0} fusion(a), kind=KIND, calls=fused
}
"""


@pytest.mark.parametrize("text, platform, device", [
    (gemm("__cublas$gemm"), "gpu", "a100"),
    (gemm("__cublas$lt$matmul$f8", ("f8e4m3fn", "f8e4m3fn", "bf16")), "gpu", "h100"),
    (gemm("__cublas$lt$matmul", config='{"operation_queue_id":"0","device_type":"sm_90"}'), "gpu", "h100"),
    (gemm("__cudnn$convForward"), "gpu", "a100"),
    (gemm("tpu_custom_call"), "tpu", "tpu"),
    (gemm("__onednn$matmul"), "cpu", "xla-cpu"),
    ("ENTRY e {\n  ROOT a = f32[8,128]{1,0:T(8,128)} parameter(0)\n}\n", "tpu", "tpu"),
    ("ENTRY e {\n  ROOT a = f32[8]{0:S(1)} parameter(0)\n}\n", "tpu", "tpu"),
    (FUSED.replace("kind=KIND", 'kind=kCustom, backend_config={"fusion_config":{"kind":"__ynn_fusion"}}'),
     "cpu", "xla-cpu"),
    (FUSED.replace("kind=KIND", 'kind=kCustom, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}'),
     "gpu", "a100"),
    (FUSED.replace("kind=KIND", "kind=kInput"), "gpu", "a100"),          # weak: XLA:GPU's reduction fusion
    (FUSED.replace("kind=KIND", "kind=kLoop"), "cpu", "xla-cpu"),        # weak: XLA:CPU's loop reduction
    (FUSED.replace("kind=KIND", "kind=kCustom"), "unknown", "reference"),
    (gemm("my_kernel"), "unknown", "reference"),
    ("ENTRY e {\n  ROOT a = f32[8]{0} parameter(0)\n}\n", "unknown", "reference"),
])
def test_each_backends_marks_name_its_platform_and_profile(text, platform, device):
    m = module(text)
    found = compiled_for(m)
    assert found.platform == platform and found.evidence
    name, reason = auto_device(m)
    assert name == device and platform in reason


def test_strong_evidence_outranks_a_weak_habit_and_conflicts_say_unknown():
    # a kInput fusion (weak gpu) beside a tiled layout (strong tpu): tpu
    text = FUSED.replace("kind=KIND", "kind=kInput").replace("a = f32[16,32]{1,0} parameter(0)\n  ROOT",
                                                             "a = f32[16,32]{1,0:T(8,128)} parameter(0)\n  ROOT")
    assert compiled_for(module(text)).platform == "tpu"
    both = module(gemm("__cublas$gemm").replace("parameter(0)", "parameter(0), backend_config={\"window_config\":{}}"))
    found = compiled_for(both)
    assert found.platform == "unknown" and any("conflicting" in e for e in found.evidence)


def test_the_repos_xla_cpu_dumps_say_cpu_and_their_jax_sources_say_unknown():
    for name in ("mlp", "scan_loop", "gpt_step", "layernorm_bwd", "conv", "sort_topk"):
        assert compiled_for(parse(EXAMPLES / f"{name}.opt.hlo")[0]).platform == "cpu", name
        assert compiled_for(parse(EXAMPLES / f"{name}.pre.hlo")[0]).platform == "unknown", name


def test_the_shared_dumps_say_where_their_sources_say_they_were_compiled(shared_path):
    external = shared_path("corpus", "external", "files")
    want = {
        "tf2_gpu_bert_fp16_train_cluster.hlo": "gpu", "tf1_gpu_maskrcnn_train_cluster_615kb.hlo": "gpu",
        "jaxdecomp_jaxfft_fft_f32_8dev_gpu_opt.hlo": "gpu", "tf1_gpu_cluster_kinput_reduce.hlo": "gpu",
        "tpu_v6e_cond_switch_4part_after_opt.hlo": "tpu", "tpu_jax_jit_f_after_opt_tiled.hlo": "tpu",
        "torchxla_tpu_scan_flash_attention_irtohlo.hlo": "tpu", "jax_cpu_lineax_cg_c128_opt.hlo": "cpu",
        "torchxla_neuron_bert_baseline_3mb.hlo": "unknown", "tpu_jax_jit_f_before_opt.hlo": "unknown",
    }
    for name, platform in want.items():
        assert compiled_for(parse(external / name)[0]).platform == platform, name
    seeds = shared_path("seeds")
    assert compiled_for(parse(seeds / "gpt_train_step_shard_parallel_16dev.hlo")[0]).platform == "gpu"
    assert auto_device(parse(seeds / "tpu_seqparallel_remat_8dev.hlo")[0])[0] == "tpu"


def test_stats_shows_compiled_for_in_text_and_json(capsys):
    path = str(EXAMPLES / "mlp.opt.hlo")
    assert main(["stats", path, "--json"]) == 0
    (m,) = json.loads(capsys.readouterr().out)["files"][0]["modules"]
    assert m["compiled_for"]["platform"] == "cpu"
    assert any("__ynn_fusion" in e for e in m["compiled_for"]["evidence"])
    assert main(["stats", path]) == 0
    out = capsys.readouterr().out
    assert "compiled for      cpu" in out and "__ynn_fusion" in out


def test_device_auto_takes_the_profile_of_what_the_dump_was_compiled_for(capsys, tmp_path):
    """`--device auto` (and load(device="auto")) run an XLA:CPU dump under xla-cpu and say so; a module with no
    evidence under reference."""
    path = str(EXAMPLES / "mlp.opt.hlo")
    assert hloexec.load(path, device="auto").options.device.name == "xla-cpu"
    plain = tmp_path / "plain.hlo"
    plain.write_text("HloModule p\nENTRY e {\n  ROOT a = f32[8]{0} parameter(0)\n}\n")
    assert hloexec.load(str(plain), device="auto").options.device.name == "reference"
    assert main(["run", path, "--seed", "0", "--device", "auto"]) == 0
    assert "--device auto: xla-cpu (compiled for cpu" in capsys.readouterr().err
