"""Numerical validation on hand-written modules (no jax): the shadow transform (hloexec/exec/shadow.py), the
discrete values that part between a run and its shadow, the verdict rule (hloexec/tools/verdict.py), NaN/Inf
origins (hloexec/tools/nonfinite.py), attribution (hloexec/tools/numerics.py) and their commands.
The programs generated with jax (LayerNorm gradient, Adam, a train step) are in test_numerics_programs.py."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import hloexec
from hloexec.exec.shadow import shadow_module
from hloexec.tools.cli import main
from hloexec.tools.compare import compare_outputs
from hloexec.tools.nonfinite import find_nonfinite
from hloexec.tools.numerics import Runner, attribute, judge_run, shadow_run
from hloexec.tools.verdict import judge
from hloexec.tools.xla_cpu import save_arrays

N = 65536       # big enough for the fusion to compile (64 KB of f64)

SHADOWED = f"""HloModule shadowed
fused {{ a = f16[{N}] parameter(0)
  b = f16[{N}] parameter(1)
  m = f16[{N}] multiply(a, b)
  ROOT s = f16[{N}] add(m, a) }}
ENTRY e {{
  x = f16[{N}] parameter(0)
  y = f32[{N}] parameter(1)
  c = f16[] constant(0.1)
  cb = f16[{N}] broadcast(c), dimensions={{}}
  yf = f16[{N}] convert(y)
  f = f16[{N}] fusion(x, yf), kind=kLoop, calls=fused
  g = f16[{N}] multiply(f, cb)
  bits = s16[{N}] bitcast-convert(g)
  q = f8e4m3fn[{N}] convert(y)
  qf = f32[{N}] convert(q)
  ROOT t = (f16[{N}], s16[{N}], f32[{N}]) tuple(g, bits, qf)
}}
"""


def shadowed_inputs():
    r = np.random.default_rng(0)
    return [r.standard_normal(N).astype(np.float16), r.standard_normal(N).astype(np.float32)]


@pytest.mark.parametrize("options", [{"use_numba": False}, {"compile": "eager"}], ids=["numpy", "compiled"])
def test_the_shadow_is_the_program_in_f64(options):
    """Every float type becomes f64: the f16 constant keeps its f16 value, the f32->f16 convert becomes the identity,
    the fused multiply-add runs in f64 in every tier; the bitcast and the fp8 quantization run at the program's
    types (pinned), and the bitcast's integer values are listed as computed from floats."""
    exe = hloexec.load(SHADOWED, **options)
    shadow = shadow_module(exe.module)
    assert shadow.pinned.keys() == {"bits", "q"} and "quantizes to f8e4m3fn" in shadow.pinned["q"]
    assert shadow.discrete == ["bits"]
    x, y = shadowed_inputs()
    g, bits, qf = hloexec.Executable(shadow.module, **options).run(*shadow.inputs([x, y]))
    c = float(np.float16(0.1))                       # the program's constant, not 0.1
    want = (x.astype(np.float64) * y.astype(np.float64) + x) * c
    assert g.dtype == np.float64 and np.array_equal(g, want)
    # narrowed as the program's convert does (f64 -> f16 through f32, as XLA)
    assert np.array_equal(bits, g.astype(np.float32).astype(np.float16).view(np.int16))
    assert np.array_equal(qf, y.astype(ml_dtypes.float8_e4m3fn).astype(np.float64))
    low = exe.run(x, y)[0].astype(np.float64)
    assert 0 < np.abs(low - want).max() <= 4 * np.abs(want).max() * 2.0 ** -11      # a few f16 roundings
    assert exe.module.entry.root.shape.to_text() == "(f16[65536], s16[65536], f32[65536])"    # untouched


DIVERGING = """HloModule diverging
ENTRY e {
  x = f16[4096] parameter(0)
  y = f16[4096] parameter(1)
  p = f16[4096] multiply(x, y)
  t = f16[] constant(0.3)
  tb = f16[4096] broadcast(t), dimensions={}
  gt = pred[4096] compare(p, tb), direction=GT
  zero = f16[] constant(0)
  zb = f16[4096] broadcast(zero), dimensions={}
  relu = f16[4096] select(gt, p, zb)
  ROOT r = (pred[4096], f16[4096]) tuple(gt, relu)
}
"""


def test_custom_calls_moving_values_are_widened_others_pinned(monkeypatch):
    """A custom-call registered as an identity marker (here as --custom-call-identity would) carries the shadow's
    f64 values; one whose kernel computes in its own types (oneDNN's layer norm) runs pinned at them."""
    from hloexec.ops.custom_call import CUSTOM_CALLS
    from hloexec.ops.custom_call.markers import identity
    monkeypatch.setitem(CUSTOM_CALLS, "hloexec_test_marker", identity)     # registered for this test only
    shadow = shadow_module(hloexec.parse("""HloModule m
ENTRY e { x = f16[8] parameter(0)
  m = f16[8] custom-call(x), custom_call_target="hloexec_test_marker"
  s = f16[8] custom-call(x), custom_call_target="Sharding"
  n = f16[8] custom-call(m), custom_call_target="__onednn$layernorm"
  ROOT t = (f16[8], f16[8]) tuple(s, n) }""")[0])
    assert list(shadow.pinned) == ["n"] and "__onednn$layernorm" in shadow.pinned["n"]
    assert {i.name: i.shape.to_text(False) for i in shadow.module.entry.instructions}["m"] == "f64[8]"



def test_ops_whose_meaning_is_their_types_bits_are_pinned():
    """Found by the shadow tier of the op tests (tests/tiers.py): XLA's float -> int convert saturates at the
    integer bound rounded to the source type (f4e2m1fn has 6 for s4's 7, so 6.0 -> 7: in f64, 6), and a
    reduce-precision keeping its type's exponent width keeps that type's subnormals (in f64 they are below the
    5-bit exponent's range: flushed). Both now run pinned at the program's own types, so the shadow agrees."""
    text = """HloModule m
ENTRY e { x = f4e2m1fn[2] parameter(0)
  h = f16[3] parameter(1)
  i = s4[2] convert(x)
  r = f16[3] reduce-precision(h), exponent_bits=5, mantissa_bits=10
  q = f16[3] reduce-precision(h), exponent_bits=4, mantissa_bits=3
  ROOT t = (s4[2], f16[3], f16[3]) tuple(i, r, q) }"""
    x = np.array([6, -6], ml_dtypes.float4_e2m1fn)
    h = np.array([6e-8, 6.1e-5, 1.5], np.float16)
    run = shadow_run(hloexec.load(text), [x, h])
    assert set(run.shadow_info.pinned) == {"i", "r"}            # q narrows the exponent: an f64 op
    assert run.shadow[0].tolist() == run.outputs[0].tolist() == [7, -8]
    assert np.array_equal(run.shadow[1], run.outputs[1].astype(np.float64)) and run.outputs[1][0] > 0
    assert np.array_equal(run.shadow[2], run.outputs[2].astype(np.float64))

def test_discrete_values_computed_from_floats_are_reported_where_they_part():
    """x*y rounded to f16 lands on the other side of the threshold than the exact product for some elements:
    the compare's values differ between the run and the shadow, and the report counts them."""
    r = np.random.default_rng(1)
    x = (0.3 / r.uniform(0.5, 1.0, 4096) * r.uniform(0.999, 1.001, 4096)).astype(np.float16)
    y = (0.3 / x.astype(np.float64) * r.uniform(0.999, 1.001, 4096)).astype(np.float16)
    exact = x.astype(np.float64) * y
    low = (x.astype(np.float32) * y).astype(np.float16)
    t = np.float16(0.3)
    parted = int(np.count_nonzero((low > t) != (exact > t)))
    assert parted > 0
    run = shadow_run(hloexec.load(DIVERGING), [x, y])
    [d] = run.divergences
    assert (d.name, d.opcode, d.elements, d.size, d.runs) == ("gt", "compare", parted, 4096, 1)
    assert np.array_equal(run.shadow[0], exact > t) and np.array_equal(run.outputs[0], low > t)
    report = attribute(hloexec.load(DIVERGING), [x, y], mode="paired")       # pairs see them too
    assert [(d.name, d.elements) for d in report.divergences] == [("gt", parted)]


def test_verdict_rule_on_constructed_errors():
    """The rule of tools/verdict.py on arrays: a candidate as close as the baseline is consistent; one element
    off by 1% among 4096 is not (named with the element); an error spread thin over every element fails the
    rms part; an overflow is consistent only where the baseline overflows too; integer outputs must equal the
    shadow's or the baseline's."""
    r = np.random.default_rng(2)
    shadow = r.standard_normal(4096) * 10
    baseline = shadow.astype(np.float16)
    other = (shadow * (1 + r.standard_normal(4096) * 2e-5)).astype(np.float16)      # another f32 order, rounded
    k = int(np.argmax(np.abs(shadow)))
    bumped = baseline.copy()
    bumped[k] = np.float16(float(bumped[k]) * 1.01)
    spread = (shadow * (1 + 2e-3)).astype(np.float16)
    overflow = baseline.copy()
    overflow[7] = np.inf
    ints_s, ints_b = np.arange(8), np.arange(8)
    ints_b[3] = 4
    verdict = judge([shadow, ints_s], [baseline, ints_b],
                    {"other": [other, ints_b], "bumped": [bumped, ints_s], "spread": [spread, ints_s],
                     "overflow": [overflow, ints_s], "ints": [baseline, ints_s + (np.arange(8) == 5)]})
    assert verdict.consistent("other") and not verdict.consistent()
    out0 = {c.name: c for c in verdict.outputs[0].candidates}
    assert not out0["bumped"].consistent and out0["bumped"].worst[0].index == (k,)
    assert not out0["spread"].consistent and "rms" in out0["spread"].reasons[0]
    assert not out0["overflow"].consistent and out0["overflow"].errors.nonfinite == 1
    assert out0["other"].errors.max_ulps < 2 and out0["bumped"].errors.max_ulps > 8
    out1 = {c.name: c for c in verdict.outputs[1].candidates}
    assert out1["other"].consistent and not out1["ints"].consistent and out1["ints"].errors.mismatches == 1
    json.dumps(verdict.to_dict(), allow_nan=False)
    overflowing_baseline = judge([shadow], [overflow], {"same": [overflow]})
    assert overflowing_baseline.consistent("same")


def test_compare_ulps_are_at_the_output_scale():
    """Two tiny values of opposite sign are not a billion ULPs apart: ULPs count at the output's scale."""
    expected = np.array([1e-9, 1.0, -2.0], np.float32)
    actual = np.array([-1e-9, 1.0, -2.0], np.float32)
    out = compare_outputs([actual], [expected]).outputs[0]
    assert out.passed and out.max_ulp == pytest.approx(2e-9 / np.spacing(np.float32(2.0)))


SOFTMAX = """HloModule softmax
max_f16 { a = f16[] parameter(0)
  b = f16[] parameter(1)
  ROOT m = f16[] maximum(a, b) }
add_f16 { a = f16[] parameter(0)
  b = f16[] parameter(1)
  ROOT s = f16[] add(a, b) }
ENTRY e {
  s = f16[4,8] parameter(0)
  m = pred[4,8] parameter(1)
  ninf = f16[] constant(-inf)
  nb = f16[4,8] broadcast(ninf), dimensions={}
  masked = f16[4,8] select(m, s, nb)
  mx = f16[4] reduce(masked, ninf), dimensions={1}, to_apply=max_f16
  mxb = f16[4,8] broadcast(mx), dimensions={0}
  shifted = f16[4,8] subtract(masked, mxb), metadata={op_name="jit(f)/sub" source_file="model.py" source_line=12}
  ex = f16[4,8] exponential(shifted)
  zero = f16[] constant(0)
  total = f16[4] reduce(ex, zero), dimensions={1}, to_apply=add_f16
  tb = f16[4,8] broadcast(total), dimensions={0}
  probs = f16[4,8] divide(ex, tb)
  sq = f16[4,8] multiply(s, s), metadata={op_name="jit(f)/square" source_file="model.py" source_line=20}
  ROOT r = (f16[4,8], f16[4,8]) tuple(probs, sq)
}
"""


def softmax_inputs(fully_masked_row: bool = True):
    s = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float16)
    s[1, 2] = 300.0                     # 300^2 overflows f16
    m = np.tril(np.ones((4, 8), bool))
    if fully_masked_row:
        m[3] = False                    # -inf - (-inf): the intentional mask turns into NaN
    return [s, m]


def test_nonfinite_origins_in_execution_order():
    """The subtract of a fully masked row (-inf - -inf) makes NaN from the intentional -inf constant; the square
    overflows. The -inf mask itself is no origin, only listed as the infinity that turned into NaN."""
    report = find_nonfinite(hloexec.load(SOFTMAX), softmax_inputs())
    assert [(o.name, o.kind) for o in report.origins] == [("shifted", "NaN from infinities"), ("sq", "overflow")]
    shifted, sq = report.origins
    assert shifted.infinities_from == ["%ninf"] and shifted.nan == 8 and shifted.first_index == [3, 0]
    assert shifted.op_name == "jit(f)/sub" and shifted.source == "model.py:12"
    assert shifted.outputs == [0] and shifted.path == ["%shifted", "%ex", "%probs", "output 0"]
    assert sq.inf == 1 and sq.first_index == [1, 2] and sq.outputs == [1]
    assert sq.operands[0].name == "s" and sq.operands[0].max == 300.0
    assert [(o.name, o.kind) for o in report.intentional] == [("ninf", "intentional")]
    assert report.outputs == [0, 1] and not report.stopped
    quiet = find_nonfinite(hloexec.load(SOFTMAX), softmax_inputs(fully_masked_row=False))
    assert [o.name for o in quiet.origins] == ["sq"] and quiet.intentional == [] and quiet.intentional_seen == 1
    first = find_nonfinite(hloexec.load(SOFTMAX), softmax_inputs(), stop_at_first=True)
    assert [o.name for o in first.origins] == ["shifted"] and first.stopped


def test_find_nonfinite_command(capsys, tmp_path):
    path = tmp_path / "softmax.hlo"
    path.write_text(SOFTMAX)
    inputs = tmp_path / "in.npz"
    save_arrays(str(inputs), {f"arg{i}": a for i, a in enumerate(softmax_inputs())})
    code = main(["run", str(path), "--inputs", str(inputs), "--find-nonfinite", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [(o["name"], o["opcode"]) for o in document["origins"]] == [("shifted", "subtract"), ("sq", "multiply")]
    code = main(["run", str(path), "--inputs", str(inputs), "--find-nonfinite", "--stop-at-first"])
    out = capsys.readouterr().out
    assert code == 1 and "%shifted" in out and "%sq" not in out and "--stop-at-first" in out
    # numerics finds the same origins, and says so in its exit code too
    code = main(["numerics", str(path), "--inputs", str(inputs), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1 and [o["name"] for o in document["nonfinite"]["origins"]] == ["shifted", "sq"]


SPMD_OVERFLOW = """HloModule spmd_overflow, num_partitions=2
add { a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b) }
ENTRY e {
  p = f16[4] parameter(0), sharding={devices=[2]0,1}
  sq = f16[4] multiply(p, p)
  w = f32[4] convert(sq)
  ROOT r = f32[4] all-reduce(w), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add
}
"""


def test_nonfinite_and_shadow_in_spmd_runs():
    """Only device 1's half overflows: the origin names it; the shadow of the SPMD module has no infinity."""
    from hloexec import spmd
    exe = hloexec.load(SPMD_OVERFLOW)
    global_p = np.array([1, 2, 3, 4, 5, 6, 7, 300], np.float16)
    inputs = spmd.split_inputs(exe.module, [global_p], 2)
    runner = Runner({"partitions": 2, "replicas": 1, "report": lambda message: None})
    report = find_nonfinite(exe, inputs, runner)
    [origin] = report.origins
    assert (origin.name, origin.device, origin.devices, origin.kind) == ("sq", 1, [1], "overflow")
    run = shadow_run(exe, inputs, runner)
    assert np.isinf(run.outputs[0][3]) and np.isfinite(run.shadow[0]).all()
    assert run.shadow[0][3] == 4.0 ** 2 + 300.0 ** 2


def test_spmd_commands(capsys, tmp_path):
    """The same from the command line: --spmd with global inputs split by sharding; the origin names its device;
    the overflow is what f16 gives (the baseline overflows too), so the run is consistent, its Inf counted."""
    path = tmp_path / "spmd.hlo"
    path.write_text(SPMD_OVERFLOW)
    inputs = tmp_path / "in.npz"
    save_arrays(str(inputs), {"arg0": np.array([1, 2, 3, 4, 5, 6, 7, 300], np.float16)})
    assert main(["run", str(path), "--spmd", "--inputs", str(inputs), "--find-nonfinite", "--json"]) == 1
    [origin] = json.loads(capsys.readouterr().out)["origins"]
    assert (origin["name"], origin["opcode"], origin["device"]) == ("sq", "multiply", 1)
    assert main(["compare", str(path), "--spmd", "--inputs", str(inputs), "--reference", "shadow", "--json"]) == 0
    [judged] = json.loads(capsys.readouterr().out)["outputs"][0]["candidates"]
    assert judged["consistent"] and judged["errors"]["nonfinite"] == 1


LOSSY = """HloModule lossy
ENTRY e {
  a = f32[1024] parameter(0)
  b = f32[1024] parameter(1)
  ah = f16[1024] convert(a), metadata={op_name="jit(f)/convert_element_type" source_file="f.py" source_line=3}
  bh = f16[1024] convert(b)
  d = f16[1024] subtract(ah, bh), metadata={op_name="jit(f)/sub" source_file="f.py" source_line=4}
  two = f16[] constant(2)
  tb = f16[1024] broadcast(two), dimensions={}
  ROOT r = f16[1024] multiply(d, tb)
}
"""


def test_attribution_names_the_lossy_instruction(capsys, tmp_path):
    """A cancelling f16 subtract after f32->f16 converts carries the local error: nothing of the difference is
    left; the converts and the multiply round once. `numerics --json` lists them in `top` with name, opcode,
    local_error."""
    text = LOSSY
    r = np.random.default_rng(4)
    a = r.uniform(1, 2, 1024).astype(np.float32)
    b = (a + r.uniform(-1e-3, 1e-3, 1024)).astype(np.float32)
    report = attribute(hloexec.load(text), [a, b])
    assert report.mode == "paired"
    errors = {x.name: x for x in report.instructions}
    d = errors["d"]
    assert d.local_error > 0.1 and d.total_error == pytest.approx(d.local_error)   # no digits left
    # ranked by contribution: the converts' roundings, which the cancellation amplifies, make the output's
    # error; rounding d's own (exact) value to f16 moves the output by at most half an f16 ulp of its scale
    assert {x.name for x in report.instructions[:2]} == {"ah", "bh"} and d.contribution <= 2.0 ** -11
    assert report.instructions[0].contribution > 0.1
    # the others round once: half an ulp (r's operand is d's exact value, rounded to f16 on the way in)
    assert all(0 < errors[n].local_ulps <= 0.5 for n in ("ah", "bh", "r")) and errors["r"].inherited_error > 0.1
    assert report.outputs[0]["instructions"][0]["name"] in ("ah", "bh")
    local = attribute(hloexec.load(text), [a, b], mode="local")
    assert local.mode == "local" and local.instructions[0].total_error is None
    # at the run's own (f16) operands the subtract is exact (Sterbenz): only the converts round
    assert {x.name: x.local_error for x in local.instructions}["d"] == 0
    assert {x.name for x in local.instructions[:2]} == {"ah", "bh"}
    path = tmp_path / "lossy.hlo"
    path.write_text(text)
    inputs = tmp_path / "in.npz"
    save_arrays(str(inputs), {"arg0": a, "arg1": b})
    assert main(["numerics", str(path), "--inputs", str(inputs), "--json", "--top", "3"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [t["name"] for t in document["top"]][0] in ("ah", "bh")
    assert all({"name", "opcode", "local_error"} <= t.keys() for t in document["top"])
    assert main(["numerics", str(path), "--inputs", str(inputs)]) == 0
    out = capsys.readouterr().out
    assert "%d = f16[1024] subtract" in out and "f.py:4" in out and "jit(f)/sub" in out


def test_numerics_names_the_instructions_beyond_their_error_bounds(capsys, tmp_path, monkeypatch):
    """numerics is judged by the verdict's per-element bounds: a correct run has every instruction within its
    bound (the cancelling subtract too: its error is what its operands' roundings allow); a program whose constant
    was miscompiled (2 -> 2.01, against the shadow of the module it should have been) has that constant and its
    broadcast named beyond their bounds, the rest not."""
    import hloexec.tools.numerics as numerics
    import hloexec.tools.numerics_format as numerics_format
    r = np.random.default_rng(4)
    a = r.uniform(1, 2, 1024).astype(np.float32)
    b = (a + r.uniform(-1e-3, 1e-3, 1024)).astype(np.float32)
    report = attribute(hloexec.load(LOSSY), [a, b])
    assert not numerics_format.beyond_bound(report)
    ratios = {x.name: x.bound_ratio for x in report.instructions}
    assert 0 < ratios["d"] <= 1 and 0 < ratios["r"] <= 1
    exe = hloexec.load(LOSSY)
    miscompiled = hloexec.load(LOSSY.replace("constant(2)", "constant(2.01)")).module
    made = numerics.executable_like
    monkeypatch.setattr(numerics, "executable_like",
                        lambda e, module, **o: made(e, miscompiled if module is exe.module else module, **o))
    report = attribute(exe, [a, b])
    assert [x.name for x in numerics_format.beyond_bound(report)][:1] == ["two"]
    # (r = d * 2.01: the cancelling d's own error allows more than 0.5% there)
    assert {x.name for x in numerics_format.beyond_bound(report)} == {"two", "tb"}
    path, inputs = tmp_path / "lossy.hlo", tmp_path / "in.npz"
    path.write_text(LOSSY)
    save_arrays(str(inputs), {"arg0": a, "arg1": b})
    assert main(["numerics", str(path), "--inputs", str(inputs)]) == 0
    assert "every instruction within its error bound" in capsys.readouterr().out
    assert main(["numerics", str(path), "--inputs", str(inputs), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["beyond_bound"] == []


def test_compare_against_the_shadow_command(capsys, tmp_path):
    """`compare --reference shadow`: hloexec's run and a device's outputs (`--actual`, keys out0..) judged against
    the shadow; exit 0 when every candidate is consistent, 1 when one is not, naming the output and element."""
    path = tmp_path / "lossy.hlo"
    path.write_text(SHADOWED)
    x, y = shadowed_inputs()
    inputs = tmp_path / "in.npz"
    save_arrays(str(inputs), {"arg0": x, "arg1": y})
    good = [np.asarray(v) for v in hloexec.load(SHADOWED).run(x, y)]
    save_arrays(str(tmp_path / "good.npz"), {f"out{i}": v for i, v in enumerate(good)})
    bad = [v.copy() for v in good]
    k = int(np.argmax(np.abs(bad[0].astype(np.float64))))
    bad[0][k] = np.float16(float(bad[0][k]) * 1.01)
    save_arrays(str(tmp_path / "bad.npz"), {f"out{i}": v for i, v in enumerate(bad)})
    argv = ["compare", str(path), "--inputs", str(inputs), "--reference", "shadow"]
    assert main(argv + ["--actual", str(tmp_path / "good.npz")]) == 0
    assert "CONSISTENT" in capsys.readouterr().out
    assert main(argv + ["--actual", str(tmp_path / "bad.npz"), "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["candidates"] == {"hloexec": True, "bad.npz": False}
    [bad_verdict] = [c for c in document["outputs"][0]["candidates"] if not c["consistent"]]
    assert bad_verdict["worst"][0]["index"] == [k]
    assert main(argv + ["--expected", str(tmp_path / "good.npz")]) == 2


def test_compare_actual_takes_bf16_outputs_plain_savez_wrote(capsys, tmp_path):
    """--actual reads a device's bf16 outputs saved with plain np.savez (raw void |V2) as bf16
    (exec/inputs.from_npz_void), not as a dtype mismatch."""
    path = tmp_path / "bf16.hlo"
    path.write_text("""HloModule bf16
ENTRY e {
  x = bf16[64] parameter(0)
  y = bf16[64] parameter(1)
  ROOT m = bf16[64] multiply(x, y)
}
""")
    r = np.random.default_rng(0)
    x, y = (r.standard_normal(64).astype(ml_dtypes.bfloat16) for _ in range(2))
    inputs = tmp_path / "in.npz"
    save_arrays(str(inputs), {"arg0": x, "arg1": y})
    np.savez(tmp_path / "device.npz", out0=np.asarray(hloexec.load(path.read_text()).run(x, y)))
    assert np.load(tmp_path / "device.npz")["out0"].dtype.kind == "V"
    argv = ["compare", str(path), "--inputs", str(inputs), "--reference", "shadow", "--json"]
    assert main(argv + ["--actual", str(tmp_path / "device.npz")]) == 0
    assert json.loads(capsys.readouterr().out)["candidates"] == {"hloexec": True, "device.npz": True}


@pytest.mark.slow
def test_llama_stage_nonfinite_origin(shared_path):
    """The Llama pipeline stage (3.3 GB of parameters) with N(0, 1) inputs: its updated weights hold NaN. The
    origin is optax's Adam taking the square root of the second moments, which random inputs make negative
    (sqrt of [-206, 190]), not an f16 overflow. Found without finishing the run (--stop-at-first). Slow (~1 min)
    and ~11 GB: `flock /tmp/hloexec-heavy.lock pytest -m slow tests/test_numerics.py -k llama`."""
    exe = hloexec.load(str(shared_path("seeds", "llama_train_step_pipeshard_mesh1.hlo")))
    report = find_nonfinite(exe, exe.random_inputs(0), stop_at_first=True)
    [origin] = report.origins
    assert report.stopped and (origin.opcode, origin.kind) == ("sqrt", "invalid") and origin.nan > 0
    assert origin.operands[0].min < 0 and origin.source.endswith("optax/_src/transform.py:348")


def test_a_run_failing_midway_ends_both_paired_runs():
    """numerics pairs two runs in two threads: when one fails, the other stops too and the error is raised."""
    from hloexec.errors import ExecutionError
    from hloexec.ops import custom_call

    def prepare(inst, ctx):
        def kernel(x):
            raise ValueError("this kernel fails")
        return kernel
    custom_call.register_custom_call("test$fails_at_run_time", prepare, replace=True)
    text = """HloModule failing
ENTRY e {
  x = f16[8] parameter(0)
  y = f16[8] multiply(x, x)
  z = f16[8] custom-call(y), custom_call_target="test$fails_at_run_time"
  ROOT r = f16[8] add(z, x)
}
"""
    with pytest.raises(ExecutionError, match="this kernel fails"):
        attribute(hloexec.load(text), [np.ones(8, np.float16)], mode="paired")


def test_a_nan_written_in_the_program_is_intentional():
    """A NaN fill value selected away is no origin; one that reaches an output is listed as intentional."""
    text = """HloModule nan_fill
ENTRY e {
  x = f32[4] parameter(0)
  m = pred[4] parameter(1)
  nan = f32[] constant(nan)
  nb = f32[4] broadcast(nan), dimensions={}
  filled = f32[4] select(m, x, nb)
  big = f32[4] multiply(x, x)
  ROOT r = (f32[4], f32[4]) tuple(filled, big)
}
"""
    x = np.array([1, 2, 3, 1e30], np.float32)
    away = find_nonfinite(hloexec.load(text), [x, np.ones(4, bool)])
    assert [o.name for o in away.origins] == ["big"] and away.intentional == [] and away.intentional_seen == 1
    kept = find_nonfinite(hloexec.load(text), [x, np.array([1, 1, 0, 1], bool)])
    assert [o.name for o in kept.origins] == ["big"] and [o.name for o in kept.intentional] == ["nan"]
    assert kept.intentional[0].outputs == [0]


def test_run_shadow_command(capsys, tmp_path):
    """`run --shadow`: per output the shadow's summary and the run's error; the compare that parts is named;
    --out writes the shadow's (f64) outputs."""
    from hloexec.tools.xla_cpu import load_arrays
    path = tmp_path / "diverging.hlo"
    path.write_text(DIVERGING)
    r = np.random.default_rng(1)
    x = (0.3 / r.uniform(0.5, 1.0, 4096) * r.uniform(0.999, 1.001, 4096)).astype(np.float16)
    y = (0.3 / x.astype(np.float64) * r.uniform(0.999, 1.001, 4096)).astype(np.float16)
    inputs = tmp_path / "in.npz"
    save_arrays(str(inputs), {"arg0": x, "arg1": y})
    out = tmp_path / "exact.npz"
    assert main(["run", str(path), "--inputs", str(inputs), "--shadow", "--json", "--out", str(out)]) == 0
    document = json.loads(capsys.readouterr().out)["shadow"]
    assert [d["name"] for d in document["divergences"]] == ["gt"] and document["discrete"] == 1
    assert document["outputs"][1]["dtype"] == "f16" and 0 < document["outputs"][1]["error"]["max_ulps"]
    assert document["outputs"][0]["error"]["mismatches"] == document["divergences"][0]["elements"]
    assert load_arrays(str(out))["out1"].dtype == np.float64
    assert main(["run", str(path), "--inputs", str(inputs), "--shadow"]) == 0
    assert "%gt (compare in %e)" in capsys.readouterr().out


def test_observed_commands_refuse_ray(capsys, tmp_path):
    """--shadow, --find-nonfinite and numerics observe every participant from this process: with --ray (actors in
    other processes) they are a usage error, said before anything runs."""
    path = tmp_path / "lossy.hlo"
    path.write_text(SHADOWED)
    for argv in (["run", str(path), "--shadow"], ["run", str(path), "--find-nonfinite"], ["numerics", str(path)]):
        assert main(argv + ["--ray"]) == 2
        assert "not with --ray" in capsys.readouterr().err


CHAIN = """HloModule chain, num_partitions=2

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  p = f32[1048576] parameter(0)
  n = f32[1048576] negate(p)
  x = f32[1048576] exponential(n)
  m = f32[1048576] multiply(x, p)
  t = f32[1048576] tanh(m)
  ROOT ar = f32[1048576] all-reduce(t), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add
}
"""


def test_spmd_local_errors_are_one_participants_and_see_every_instruction(tmp_path, capsys):
    """--spmd --local: participant 0 runs op by op and is evaluated (its chain of elementwise ops one by one, which
    a plain run groups into one kernel: exec/fuse.py), the other participant compiled; each instruction ran once.
    exp's local error: at least a correctly rounded f32 exp's (from numpy's f64 one), within a few ulps."""
    hlo = tmp_path / "chain.hlo"
    hlo.write_text(CHAIN)
    assert hloexec.load(str(hlo), compile_kernels=False).plan.fused_groups  # a plain run fuses the chain
    x = np.random.default_rng(5).uniform(-2, 2, 1 << 20).astype(np.float32)
    np.savez(tmp_path / "in.npz", arg0=x)
    code = main(["numerics", str(hlo), "--spmd", "--local", "--inputs", str(tmp_path / "in.npz"), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["local_errors_of"] == "participant 0 of 2"
    top = {r["name"]: r for r in data["top"]}
    assert {"x", "m", "t"} <= set(top) and all(r["runs"] == 1 for r in top.values())
    e = np.exp(-x.astype(np.float64))
    rounded = np.max(np.abs(e.astype(np.float32) - e)) / np.max(e)  # exp correctly rounded to f32: the least
    assert rounded <= top["x"]["local_error"] and top["x"]["local_ulps"] < 4  # an f32 exp within a few ulps
