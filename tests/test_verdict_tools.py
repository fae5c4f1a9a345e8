"""The localizing tools following the verdict (issue 33 item 4): `bisect --reference shadow` names the first pass
after which the program's result is no longer consistent with its exact answer, not merely different;
`minimize --check shadow` keeps what makes a result inconsistent; `minimize --check nan` keeps the first
non-finite origin (the overflow), not a NaN made of inputs already infinite."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import hloexec
from hloexec.tools.cli import flatten, main
from hloexec.tools.dumpdir import scan
from hloexec.tools.minimize import Check, minimize

from xla_dumps import PASSES, TEXT, make_dump

pytestmark = pytest.mark.xla


@pytest.fixture(scope="module")
def layernorm_dump(tmp_path_factory):
    """jax.grad of sum(layernorm(x)**2) in f16 with per-pass stages: passes (algsimp, tree_reduction_rewriter)
    change the result's rounding and nothing else."""
    path = tmp_path_factory.mktemp("layernorm_f16")
    make_dump(path, "layernorm_grad_f16", TEXT, PASSES)
    return path


def bisect_json(capsys, *argv) -> tuple[int, dict]:
    code = main(["bisect", *map(str, argv), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_a_pass_that_changes_rounding_is_named_by_tolerances_not_by_the_shadow(capsys, layernorm_dump):
    code, report = bisect_json(capsys, layernorm_dump, "--no-diff")
    assert code == 1 and report["pass"] is not None      # a pass whose rounding differs beyond f16 tolerances
    code, report = bisect_json(capsys, layernorm_dump, "--no-diff", "--reference", "shadow")
    assert code == 0 and report["reference"] == "shadow" and report["first_bad_stage"] is None
    assert all(c["status"] == "agrees" for c in report["checked"])


def test_a_planted_error_is_named_at_its_pass(capsys, layernorm_dump, tmp_path):
    """The mean's 1/256 made 5% larger in every stage from one pass on (a miscompile that pass introduced):
    bisect --reference shadow names that pass, and says each output it broke."""
    planted = tmp_path / "planted"
    shutil.copytree(layernorm_dump, planted)
    stages = scan(planted)[0].stages()
    k = len(stages) // 2
    for stage in stages[k:]:
        text = stage.path.read_text()
        assert "constant(0.00390625)" in text, stage.path.name
        stage.path.write_text(text.replace("constant(0.00390625)", "constant(0.0041)"))
    code, report = bisect_json(capsys, planted, "--no-diff", "--reference", "shadow")
    assert code == 1 and report["first_bad_stage"] == stages[k].path.name
    assert report["pass"] == stages[k].after_pass
    assert not report["shadow_verdict"]["candidates"][stages[k].path.name]
    main(["bisect", str(planted), "--no-diff", "--reference", "shadow"])
    text = capsys.readouterr().out
    assert "first stage whose outputs are not consistent with the exact answer: " + stages[k].path.name in text
    assert "NOT CONSISTENT" in text and "  output " in text


def test_shadow_reference_takes_no_tolerance(capsys, layernorm_dump):
    assert main(["bisect", str(layernorm_dump), "--reference", "shadow", "--atol", "1"]) == 2
    assert "not by --atol" in capsys.readouterr().err


def chain_module(n: int, special: list[str]) -> str:
    """`n` f32[64] elementwise instructions over two parameters; in the middle, the lines `special` (instruction
    bodies: `{x}` is the previous value, `{0}`, `{1}`.. the special lines' own values); every tenth value and
    the last are outputs."""
    rng = np.random.default_rng(1)
    lines = ["HloModule chain", "ENTRY main {", "  p0 = f32[64] parameter(0)", "  p1 = f32[64] parameter(1)",
             "  c = f32[] constant(0.5)", "  half = f32[64] broadcast(c), dimensions={}",
             "  k = f32[] constant(100)", "  hundred = f32[64] broadcast(k), dimensions={}"]
    names = ["p0", "p1"]
    for k in range(n):
        if k == n // 2:
            mine = [f"s{j}" for j in range(len(special))]
            for name, body in zip(mine, special):
                lines.append(f"  {name} = f32[64] " + body.format(*mine, x=names[-1]))
            names.append(mine[-1])
        op = rng.choice(["add", "multiply", "tanh", "maximum"])
        x, y = rng.choice(names[-8:]), rng.choice(names[-8:])
        line = f"tanh({x})" if op == "tanh" else f"multiply({x}, half)" if op == "multiply" else f"{op}({x}, {y})"
        lines.append(f"  v{k} = f32[64] {line}")
        names.append(f"v{k}")
    outs = names[2::10] + [names[-1]]
    lines += [f"  ROOT out = ({', '.join(['f32[64]'] * len(outs))}) tuple({', '.join(outs)})", "}"]
    return "\n".join(lines)


def test_minimize_nan_keeps_the_overflow_that_made_the_infinities():
    """exp(100 x) overflows to +Inf, then Inf - Inf is NaN: the NaN's first non-finite origin is the exponential.
    Cutting it would hand the subtract an input already Inf: not a NaN this program makes from finite values."""
    text = chain_module(40, ["multiply({x}, hundred)", "exponential({0})", "subtract({1}, {1})"])
    module = hloexec.parse(text)[0]
    inputs = [np.abs(x) + np.float32(1) for x in hloexec.Executable(module).random_inputs(0)]
    assert any(np.isnan(o).any() for o in hloexec.load(text).run(*inputs))
    result = minimize(module, inputs, Check("nan"))
    assert "exponential(" in result.text and "subtract(" in result.text, result.text
    assert not any(np.isinf(np.asarray(v)).any() for v in result.inputs)


def test_minimize_shadow_keeps_what_makes_a_result_inconsistent(monkeypatch):
    """`--check shadow`: XLA:CPU's outputs judged against the candidate's exact answer. Here a stand-in XLA
    computes sine where the program says exponential (one wrong instruction): minimize keeps that instruction."""
    from hloexec.tools import xla_cpu

    def wrong_xla(text, inputs, timeout=0):
        return flatten(hloexec.load(text.replace("exponential(", "sine(")).run(*inputs))
    monkeypatch.setattr(xla_cpu, "run_on_xla_cpu_isolated", wrong_xla)
    module = hloexec.parse(chain_module(40, ["exponential({x})"]))[0]
    inputs = hloexec.Executable(module).random_inputs(0)
    result = minimize(module, inputs, Check("shadow"))
    assert "exponential(" in result.text and result.instructions <= 4, result.text


def test_the_shadow_check_does_not_hold_where_xla_is_correct():
    text = chain_module(30, ["exponential({x})"])
    module = hloexec.parse(text)[0]
    assert not Check("shadow")(text, hloexec.Executable(module).random_inputs(0))


BF16 = """HloModule norm
ENTRY main {
  p0 = bf16[64] parameter(0)
  p1 = bf16[64] parameter(1)
  m = bf16[64] multiply(p0, p1)
  s = bf16[64] add(m, p0)
  ROOT r = f32[64] convert(s)
}
"""

# what float-normalization-bf16 makes of it: the same instructions computed in f32 between converts
NORMALIZED = """HloModule norm
ENTRY main {
  p0 = bf16[64] parameter(0)
  p1 = bf16[64] parameter(1)
  c0 = f32[64] convert(p0)
  c1 = f32[64] convert(p1)
  m = f32[64] multiply(c0, c1)
  s = f32[64] add(m, c0)
  sc = bf16[64] convert(s)
  ROOT r = f32[64] convert(sc)
}
"""


def test_diff_pairs_values_across_a_dtype_change_and_names_the_changed_instruction(capsys, tmp_path):
    a, b = tmp_path / "a.hlo", tmp_path / "b.hlo"
    a.write_text(BF16)
    b.write_text(NORMALIZED)
    assert main(["diff", str(a), str(b), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["matching"]["by"]["name"] == 2            # m and s, bf16 in A, f32 in B
    first = report["first_divergence"]
    assert [d["a"] for d in first] == ["m"] and first[0]["error"]["dtype_change"] == "bf16 -> f32"
    assert first[0]["error"]["max_abs_error"] > 0
    main(["diff", str(a), str(b)])
    assert "paired across a dtype change (bf16 -> f32): the values differ" in capsys.readouterr().out


FUSED = """HloModule fused
fused_computation {
  param_0 = f32[8] parameter(0)
  param_1 = f32[8] parameter(1)
  m = f32[8] multiply(param_0, param_1)
  ROOT e = f32[8] exponential(m)
}

ENTRY main {
  x = f32[8] parameter(0)
  y = f32[8] parameter(1)
  s = f32[8] sine(x)
  f = f32[8] fusion(s, y), kind=kLoop, calls=fused_computation
  ROOT r = f32[8] negate(f)
}
"""


def test_extract_and_graph_say_where_they_stopped_at_a_fusions_edge(capsys, tmp_path):
    path = tmp_path / "fused.hlo"
    path.write_text(FUSED)
    assert main(["extract", str(path), "e", "--depth", "5", "--json"]) == 0
    params = json.loads(capsys.readouterr().out)["parameters"]
    assert {p["name"]: p["stopped_at"] for p in params} == {
        "param_0": "%param_0 is operand 0 = %s of %f in %main", "param_1": "%param_1 is operand 1 = %y of %f in %main"}
    main(["extract", str(path), "e", "--depth", "5", "-o", str(tmp_path / "e.hlo")])
    assert "stopped at the edge of %fused_computation: %param_0 is operand 0 = %s of %f" in capsys.readouterr().out
    assert main(["graph", str(path), "--around", "m", "--depth", "3", "-o", str(tmp_path / "m.dot"), "--json"]) == 0
    stopped = json.loads(capsys.readouterr().out)["stopped_at"]
    assert sorted(stopped) == ["%e is the value of %f in %main", "%param_0 is operand 0 = %s of %f in %main",
                               "%param_1 is operand 1 = %y of %f in %main"]
    assert main(["graph", str(path), "--around", "s", "--depth", "3", "-o", str(tmp_path / "s.dot"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stopped_at"] == []      # the entry: no edge


CANCELS = """HloModule cancels
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

ENTRY main {
  p = f32[256] parameter(0)
  zero = f32[] constant(0)
  total = f32[] reduce(p, zero), dimensions={0}, to_apply=add
  n = f32[] constant(256)
  mean = f32[] divide(total, n)
  mean_b = f32[256] broadcast(mean), dimensions={}
  centred = f32[256] subtract(p, mean_b)
  z = f32[] reduce(centred, zero), dimensions={0}, to_apply=add
  z_b = f32[256] broadcast(z), dimensions={}
  b = bf16[256] convert(p)
  bw = f32[256] convert(b)
  ROOT out = f32[256] add(bw, z_b)
}
"""


def test_numerics_ranks_by_contribution_to_the_outputs_error_not_by_a_near_zero_values_ulps(capsys, tmp_path):
    """%z sums values whose exact sum is ~0: its f32 rounding is huge relative to its own scale but moves the
    output by ~1e-7 of its scale; %b, a bf16 rounding of every element, makes the output's error. The
    contribution of %b is checked against numpy: max |bf16(p) - p| / max |p| (the exact output is p + ~0)."""
    import ml_dtypes
    path = tmp_path / "cancels.hlo"
    path.write_text(CANCELS)
    assert main(["numerics", str(path), "--json", "--top", "20"]) == 0
    top = {r["name"]: r for r in json.loads(capsys.readouterr().out)["top"]}
    ranked = list(top)
    assert top["z"]["local_error"] > 1e-3 > top["z"]["contribution"]
    assert ranked.index("b") < ranked.index("z") and ranked[0] == "b"
    p = hloexec.Executable(hloexec.parse(CANCELS)[0]).random_inputs(0)[0].astype(np.float64)
    expected = np.abs(p.astype(ml_dtypes.bfloat16).astype(np.float64) - p).max() / np.abs(p).max()
    assert top["b"]["contribution"] == pytest.approx(expected, rel=1e-3)
