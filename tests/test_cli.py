"""The `hloexec` command line (hloexec.tools.cli), the comparison rules (hloexec.tools.compare), the
stats (hloexec.tools.stats) and the docs' op table (hloexec.tools.optable)."""
from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import hloexec
from hloexec.tools import optable
from hloexec.tools.cli import ProgressBar, main
from hloexec.tools.common import CompileNotice
from hloexec.tools.compare import compare_outputs, default_tolerance
from hloexec.tools.xla_cpu import load_arrays, save_arrays

from conftest import EXAMPLES, REPO_ROOT, shared_path

BAD_OPERAND = "HloModule m\n\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT r = f32[2] add(p, q)\n}\n"
UNSUPPORTED = "HloModule m\n\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT r = f32[2] frobnicate(p)\n}\n"
NAN = "HloModule m\n\nENTRY e {\n  p = f32[3] parameter(0)\n  z = f32[3] subtract(p, p)\n" \
      "  ROOT r = f32[3] divide(z, z)\n}\n"


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# -- help, entry points -------------------------------------------------------------------------
def test_every_command_has_help_with_examples_and_exit_codes(capsys):
    for argv in ([], ["stats"], ["run"], ["compare"], ["numerics"], ["ops"]):
        code, out, _ = run_cli(capsys, *argv, "--help")
        assert code == 0
        assert "examples:" in out and "exit codes:" in out and "hloexec" in out
    assert "atol" in run_cli(capsys, "compare", "--help")[1]


def test_python_dash_m_prints_json_and_parse_errors_without_traceback(tmp_path):
    ops = subprocess.run([sys.executable, "-P", "-m", "hloexec", "ops", "--json"], capture_output=True, text=True,
                         cwd=tmp_path)
    assert ops.returncode == 0, ops.stderr
    assert {r["opcode"] for r in json.loads(ops.stdout)["ops"]} >= {"add", "dot", "fusion", "while"}
    bad = write(tmp_path, "bad.hlo", BAD_OPERAND)
    p = subprocess.run([sys.executable, "-P", "-m", "hloexec", "run", str(bad)], capture_output=True, text=True)
    assert p.returncode == 2
    line = BAD_OPERAND.splitlines().index("  ROOT r = f32[2] add(p, q)") + 1
    column = BAD_OPERAND.splitlines()[line - 1].index("q") + 1
    assert f"bad.hlo:{line}:{column}" in p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_usage_errors_exit_2(capsys, tmp_path):
    assert run_cli(capsys, "frobnicate")[0] == 2
    assert run_cli(capsys)[0] == 2
    code, _, err = run_cli(capsys, "run", tmp_path / "missing.hlo")
    assert code == 2 and "missing.hlo" in err and "No such file" in err
    code, _, err = run_cli(capsys, "compare", EXAMPLES / "mlp.pre.hlo")
    assert code == 2 and "exactly one reference" in err


# -- stats --------------------------------------------------------------------------------------
STATS_FIELDS = {"name", "first_line", "last_line", "source_lines", "computations", "instructions", "ops",
                "element_types", "entry_parameters", "parameter_bytes", "entry_outputs", "output_bytes", "flops",
                "flops_by_kind", "contractions", "while_loops", "collectives", "custom_call_targets",
                "fusion_kinds", "elided_constants", "compiled_for"}


def test_stats_json_on_the_examples_agrees_with_the_parsed_modules(capsys):
    files = sorted(EXAMPLES.glob("*.hlo"))
    code, out, _ = run_cli(capsys, "stats", *files, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["command"] == "stats" and doc["errors"] == []
    assert [f["path"] for f in doc["files"]] == [str(f) for f in files]
    for entry, path in zip(doc["files"], files):
        assert entry["bytes"] == path.stat().st_size and entry["parse_seconds"] > 0
        (m,) = entry["modules"]
        assert set(m) == STATS_FIELDS
        module = hloexec.parse(path)[0]
        assert m["instructions"] == module.instruction_count == sum(m["ops"].values()) \
            == sum(m["element_types"].values())
        assert m["computations"] == len(module.computations)
        assert m["parameter_bytes"] == sum(p.shape.nbytes for p in module.entry.parameters)
        assert m["ops"].get("fusion", 0) == sum(m["fusion_kinds"].values())
    flops = {e["path"]: e["modules"][0]["flops_by_kind"] for e in doc["files"]}
    assert flops[str(EXAMPLES / "conv.pre.hlo")]["convolution"] > 0
    assert flops[str(EXAMPLES / "mlp.opt.hlo")]["dot"] == flops[str(EXAMPLES / "mlp.pre.hlo")]["dot"] > 0


def test_stats_text_names_every_module_of_a_file_with_its_lines(capsys, tmp_path):
    path = write(tmp_path, "two.hlo", NAN + "\n" + NAN.replace("HloModule m", "HloModule m2"))
    code, out, _ = run_cli(capsys, "stats", path)
    assert code == 0
    second = NAN.count("\n") + 2
    assert "m (lines 1-" in out and f"m2 (lines {second}-" in out
    assert out.count("module m") == 2 and "divide" in out


@pytest.mark.xla
def test_stats_counts_agree_with_xla(capsys):
    from hloexec.tools.xla_cpu import parse_with_xla
    path = EXAMPLES / "gpt_step.pre.hlo"
    xla = parse_with_xla(path.read_text())
    (m,) = json.loads(run_cli(capsys, "stats", path, "--json")[1])["files"][0]["modules"]
    assert m["instructions"] == xla["total_instructions"]
    assert m["computations"] == len(xla["computations"])


def test_stats_flops_count_fusion_dots_and_while_bodies_once(capsys, tmp_path):
    m, k, n = 4, 6, 5
    text = f"""HloModule flops

fused {{
  a = f32[{m},{k}] parameter(0)
  b = f32[{k},{n}] parameter(1)
  ROOT d = f32[{m},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}

cond {{
  s = (s32[], f32[{m},{k}]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  ten = s32[] constant(10)
  ROOT lt = pred[] compare(i, ten), direction=LT
}}

body {{
  s = (s32[], f32[{m},{k}]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[{m},{k}] get-tuple-element(s), index=1
  sq = f32[{m},{m}] dot(x, x), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}
  y = f32[{m},{k}] dot(sq, x), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (s32[], f32[{m},{k}]) tuple(j, y)
}}

ENTRY e {{
  a = f32[{m},{k}] parameter(0)
  b = f32[{k},{n}] parameter(1)
  f = f32[{m},{n}] fusion(a, b), kind=kOutput, calls=fused
  zero = s32[] constant(0)
  init = (s32[], f32[{m},{k}]) tuple(zero, a)
  w = (s32[], f32[{m},{k}]) while(init), condition=cond, body=body
  ROOT r = f32[{m},{n}] fusion(a, b), kind=kOutput, calls=fused
}}
"""
    code, out, _ = run_cli(capsys, "stats", write(tmp_path, "flops.hlo", text), "--json")
    assert code == 0
    (s,) = json.loads(out)["files"][0]["modules"]
    fused = 2 * m * n * k            # 2·M·N·K, the fused computation called from two sites
    loop_body = 2 * m * m * k + 2 * m * k * m
    assert s["flops_by_kind"] == {"dot": 2 * fused + loop_body} and s["contractions"] == {"dot": 4}
    assert s["while_loops"] == 1 and s["fusion_kinds"] == {"kOutput": 2}
    assert "while loop, bodies counted once" in run_cli(capsys, "stats", tmp_path / "flops.hlo")[1]


def test_stats_on_the_seed_dumps_counts_collectives_and_gemms(capsys):
    path = shared_path("seeds", "gpt_train_step_shard_parallel_16dev.hlo")
    text = path.read_text()
    code, out, _ = run_cli(capsys, "stats", path, shared_path("seeds", "xmap_train_step_log.txt"),
                           shared_path("seeds", "tpu_seqparallel_remat_8dev.hlo"), "--json")
    assert code == 0
    gpt, log, tpu = (f["modules"][0] for f in json.loads(out)["files"])
    (all_reduce,) = gpt["collectives"]
    assert all_reduce["count"] == len(re.findall(r"\ball-reduce\(", text))
    assert sum(all_reduce["replica_groups"].values()) == all_reduce["count"] and all_reduce["bytes"] > 0
    gemms = text.count('custom_call_target="__cublas$gemm"')
    assert gpt["custom_call_targets"]["__cublas$gemm"] == gpt["contractions"]["gemm"] == gemms
    assert gpt["flops"] == gpt["flops_by_kind"]["gemm"] > 0
    assert log["first_line"] > 1 and log["custom_call_targets"]["__cublas$gemm"] == 5
    assert {c["kind"] for c in tpu["collectives"]} == {"all-reduce", "all-gather"}


# -- run ----------------------------------------------------------------------------------------
def test_run_with_seed_writes_the_outputs_and_summarises_them(capsys, tmp_path):
    path = EXAMPLES / "adam.pre.hlo"
    out_path = tmp_path / "out.npz"
    code, out, _ = run_cli(capsys, "run", path, "--seed", 3, "--out", out_path, "--json")
    assert code == 0
    doc = json.loads(out)
    exe = hloexec.load(path)
    reference = exe.run(*exe.random_inputs(3))
    reference = list(reference) if isinstance(reference, tuple) else [reference]
    written = list(load_arrays(str(out_path)).values())
    assert len(written) == len(reference) == len(doc["outputs"])
    for got, want, summary in zip(written, reference, doc["outputs"]):
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
        assert summary["shape"] == list(want.shape) and summary["nan"] == np.count_nonzero(np.isnan(want))
        assert summary["min"] == pytest.approx(float(np.nanmin(want)))
        assert summary["max"] == pytest.approx(float(np.nanmax(want)))
    assert doc["inputs"]["from"] == "seed" and doc["inputs"]["seed"] == 3 and doc["memory"]["peak_bytes"] == exe.peak_bytes()
    # Adam's second moments reach sqrt (the gradients only squared): drawn positive, and said so
    assert [(c["name"], c["domain"]) for c in doc["inputs"]["constrained"]] == [("vw.1", "positive"), ("vb.1", "positive")]
    assert set(doc["seconds"]) == {"parse", "prepare", "execute"}
    code, text, _ = run_cli(capsys, "run", path, "--inputs", EXAMPLES / "adam.inputs.npz", "--no-numba")
    assert code == 0 and "memory needed" in text and "execute" in text


def test_run_profile_lists_the_slowest_entry_instructions(capsys):
    path = EXAMPLES / "gpt_step.pre.hlo"
    code, out, _ = run_cli(capsys, "run", path, "--profile", 5, "--json")
    rows = json.loads(out)["profile"]
    entry = {i.name: i for c in hloexec.parse(path)[0].computations for i in c}    # calls are inlined
    assert code == 0 and len(rows) == 5
    assert [r["ms"] for r in rows] == sorted((r["ms"] for r in rows), reverse=True)
    for row in rows:
        inst = entry[row["name"]]
        assert row["opcode"] == inst.opcode and row["line"] == inst.line and 0 < row["share"] <= 1
    code, text, _ = run_cli(capsys, "run", path, "--profile")
    assert code == 0 and "slowest 20 instructions of the entry computation" in text and text.count(" ms ") >= 20


def test_run_fail_on_nan_and_memory_limit(capsys, tmp_path):
    path = write(tmp_path, "nan.hlo", NAN)
    code, out, _ = run_cli(capsys, "run", path, "--json")
    assert code == 0 and json.loads(out)["outputs"][0]["nan"] == 3
    assert run_cli(capsys, "run", path, "--fail-on-nan")[0] == 1
    code, out, err = run_cli(capsys, "run", path, "--max-memory", "8")
    assert code == 2 and "--max-memory" in err and out.count("\n") <= 1


def test_max_memory_above_what_is_available_lets_the_run_go(capsys, tmp_path, monkeypatch):
    """--max-memory is the run's limit, checked by the CLI and by the library's own check at run time (which
    otherwise takes MemAvailable): a limit above what the machine says is available is the user's to give."""
    from hloexec.exec import executor
    monkeypatch.setattr(executor, "available_memory", lambda: 1)
    path = write(tmp_path, "nan.hlo", NAN)
    assert run_cli(capsys, "run", path)[0] == 2
    code, out, err = run_cli(capsys, "run", path, "--max-memory", "1G", "--json")
    assert code == 0, err


def test_module_choice_said_by_the_library_and_the_cli(capsys, tmp_path):
    """hloexec.load and the CLI pick a module by one rule (ir.module.pick_module), each saying a refusal its way."""
    two = NAN + "\n" + NAN.replace("HloModule m", "HloModule other")
    path = write(tmp_path, "two.hlo", two)
    with pytest.raises(ValueError, match="holds 2 modules"):
        hloexec.load(two)
    assert hloexec.load(two, module="other").module.name == "other"
    code, out, err = run_cli(capsys, "run", path)
    assert code == 2 and "pick one with --module NAME" in err and "other (line" in err
    code, out, err = run_cli(capsys, "run", path, "--module", "third")
    assert code == 2 and "no module named 'third'" in err
    assert run_cli(capsys, "run", path, "--module", "other")[0] == 0


def test_unsupported_op_exits_2_naming_the_instruction(capsys, tmp_path, monkeypatch):
    path = write(tmp_path, "unsupported.hlo", UNSUPPORTED)
    code, out, err = run_cli(capsys, "run", path)
    assert code == 2 and out == ""
    assert "frobnicate" in err and "%r" in err and "unsupported.hlo" in err and "Traceback" not in err
    monkeypatch.setenv("HLOEXEC_DEBUG", "1")
    assert "Traceback" in run_cli(capsys, "run", path)[2]


def test_progress_bar_draws_after_half_a_second_and_clears():
    stream = io.StringIO()
    bar = ProgressBar(stream, "instructions")
    bar(1, 10)
    assert stream.getvalue() == ""
    bar.start -= 1.0
    bar.last -= 1.0
    bar(5, 10)
    assert "5/10 instructions" in stream.getvalue()
    bar.close()
    assert stream.getvalue().endswith("\r\033[K")


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_compile_notice_says_when_kernels_compile_and_how_long_on_a_terminal_only():
    """A cold first run spends a minute or two in Numba compiles (a `numerics` of the bf16 LayerNorm example: ~95%
    of it): on a terminal the user is told so as the first one starts, and the count and time at the end; a
    compile nested in another's (a kernel calling another) is not counted apart; a run compiling nothing, or not
    on a terminal, prints nothing."""
    from numba import njit

    def twice(x):
        return 2 * x

    inner = njit(twice)
    outer = njit(lambda x: inner(x) + 1)
    stream = _Terminal()
    with CompileNotice(stream):
        assert outer(1.5) == 4.0
    text = stream.getvalue()
    assert "compiling kernels" in text and "first run only" in text
    assert re.search(r"kernels compiled: 1 in \d+\.\d s", text), text
    stream = _Terminal()
    with CompileNotice(stream):
        assert outer(2.5) == 6.0  # (compiled: nothing to say)
    assert stream.getvalue() == ""
    stream = io.StringIO()
    with CompileNotice(stream):
        assert njit(twice)(1.0) == 2.0
    assert stream.getvalue() == ""


# -- compare ------------------------------------------------------------------------------------
def test_compare_against_expected_passes_and_a_perturbed_element_fails(capsys, tmp_path):
    path, inputs = EXAMPLES / "layernorm_bwd.pre.hlo", EXAMPLES / "layernorm_bwd.inputs.npz"
    expected = load_arrays(str(EXAMPLES / "layernorm_bwd.expected.npz"))
    code, out, _ = run_cli(capsys, "compare", path, "--inputs", inputs, "--expected",
                           EXAMPLES / "layernorm_bwd.expected.npz")
    assert code == 0 and "PASS" in out
    first = next(iter(expected))
    perturbed = dict(expected)
    perturbed[first] = expected[first].copy()
    where = tuple(d // 2 for d in perturbed[first].shape)
    perturbed[first][where] += 1.0
    save_arrays(str(tmp_path / "perturbed.npz"), perturbed)
    code, out, _ = run_cli(capsys, "compare", path, "--inputs", inputs, "--expected", tmp_path / "perturbed.npz",
                           "--json")
    assert code == 1
    doc = json.loads(out)
    assert not doc["passed"] and doc["outputs"][0]["mismatches"] == 1
    assert doc["outputs"][0]["worst"][0]["index"] == list(where)
    assert all(o["passed"] for o in doc["outputs"][1:])
    # a bound large enough for the perturbation passes
    assert run_cli(capsys, "compare", path, "--inputs", inputs, "--expected", tmp_path / "perturbed.npz",
                   "--atol", "2")[0] == 0


def test_compare_two_hlo_files_on_the_same_inputs(capsys):
    code, out, _ = run_cli(capsys, "compare", EXAMPLES / "mlp.opt.hlo", EXAMPLES / "mlp.pre.hlo", "--seed", 1)
    assert code == 0 and "PASS" in out
    code, _, err = run_cli(capsys, "compare", EXAMPLES / "mlp.pre.hlo", EXAMPLES / "adam.pre.hlo")
    assert code == 2 and "error:" in err


@pytest.mark.xla
def test_compare_against_xla(capsys):
    code, out, _ = run_cli(capsys, "compare", EXAMPLES / "sort_topk.pre.hlo", "--against", "xla", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and doc["expected"] == {"from": "xla"} and len(doc["outputs"]) == 4


ELIDED = """HloModule m
%f (a: f32[4]) -> f32[4] {
  a = f32[4] parameter(0)
  k = f32[4] constant({...})
  ROOT m = f32[4] multiply(a, k)
}
ENTRY e (p: f32[4]) -> (f32[4], f32[4], f32[4]) {
  p = f32[4] parameter(0)
  c = f32[4] constant({...})
  a = f32[4] add(p, c)
  f = f32[4] fusion(p), kind=kLoop, calls=%f
  ROOT t = (f32[4], f32[4], f32[4]) tuple(a, p, f)
}
"""


def test_elided_constants_are_counted_and_said_by_load_run_and_compare(capsys, tmp_path):
    """A dump without --xla_dump_large_constants writes large constants as {...}: the values are lost."""
    elided = write(tmp_path, "elided.hlo", ELIDED)
    full = write(tmp_path, "full.hlo", ELIDED.replace("{...}", "{1, 2, 3, 4}"))
    with pytest.warns(hloexec.errors.ElidedConstantWarning, match=r"2 constants \(%k, %c\) written as \{...\}"):
        hloexec.load(ELIDED)
    code, out, _ = run_cli(capsys, "stats", elided, "--json")
    assert code == 0 and json.loads(out)["files"][0]["modules"][0]["elided_constants"] == 2
    assert "elided constants  2" in run_cli(capsys, "stats", elided)[1]
    code, out, err = run_cli(capsys, "run", elided, "--json")
    assert code == 0 and sorted(json.loads(out)["elided_constants"]) == ["c", "k"] and "written as {...}" in err
    code, out, err = run_cli(capsys, "compare", elided, full)
    assert code == 1 and "written as {...}" in err
    assert "FAIL (depends on 1 elided constant)" in out and "differences may come from those values" in out
    code, out, _ = run_cli(capsys, "compare", elided, full, "--json")
    outputs = json.loads(out)["outputs"]
    assert [o["elided_constants"] for o in outputs] == [["c"], [], ["k"]]
    assert [o["passed"] for o in outputs] == [False, True, False]
    assert run_cli(capsys, "compare", full, full)[0] == 0


def test_compare_outputs_follows_xla_literal_comparison():
    e = np.array([1.0, 100.0, np.nan, np.inf, 0.0, 2.0], np.float32)
    # exceeds only the absolute bound (1e-3 off 100 is 1e-5 relative), only the relative bound
    # (1e-6 off 0 is infinitely relative), NaN against NaN, the same infinity: all pass.
    a = np.array([1.0, 100.001, np.nan, np.inf, 1e-6, 2.0], np.float32)
    report = compare_outputs([a], [e], atol=1e-4, rtol=1e-4)
    assert report.passed and report.outputs[0].mismatches == 0
    for bad_index, bad_value in ((2, 1.0), (3, -np.inf), (0, np.nan), (5, 2.1)):
        b = a.copy()
        b[bad_index] = bad_value
        out = compare_outputs([b], [e], atol=1e-4, rtol=1e-4).outputs[0]
        assert out.mismatches == 1 and out.worst[0].index == (bad_index,)
    nan_out = compare_outputs([np.where(np.arange(6) == 0, np.nan, a).astype(np.float32)], [e]).outputs[0]
    assert nan_out.nan_mismatches == 1
    ints = compare_outputs([np.array([1, 2, 3], np.int32)], [np.array([1, 2, 4], np.int32)], atol=10, rtol=10)
    assert ints.outputs[0].mismatches == 1 and default_tolerance(np.int32) == (0.0, 0.0)


def test_compare_outputs_64_bit_integer_distances_are_exact():
    # differences that overflow int64 and magnitudes past float64's 53 bits
    for dtype in (np.int64, np.uint64):
        info = np.iinfo(dtype)
        e = np.array([info.min, info.max, 5, info.max - 1], dtype)
        a = np.array([info.max, info.min, 5, info.max], dtype)
        out = compare_outputs([a], [e]).outputs[0]
        assert out.mismatches == 3 and out.max_ulp == 2**64 - 1 and out.max_abs_error == float(2**64 - 1)
        assert {w.index: (w.actual, w.expected) for w in out.worst}[(3,)] == (info.max, info.max - 1)
    small = compare_outputs([np.array([-128, 127], np.int8)], [np.array([127, -128], np.int8)]).outputs[0]
    assert small.max_ulp == 255 and small.max_rel_error == 255 / 127


def test_compare_outputs_reports_ulps_shapes_dtypes_and_counts():
    x = np.linspace(-2, 2, 9, dtype=np.float32)
    up = np.nextafter(x, np.float32(np.inf))
    out = compare_outputs([up], [x]).outputs[0]
    assert out.passed and out.max_ulp == 1
    b = x.astype(ml_dtypes.bfloat16)
    b_up = (b.view(np.uint16) + np.where(b > 0, 2, 0).astype(np.uint16)).view(ml_dtypes.bfloat16)
    assert compare_outputs([b_up], [b]).outputs[0].max_ulp == 2
    assert compare_outputs([x[:3]], [x]).outputs[0].problem.startswith("shape")
    assert compare_outputs([x.astype(np.float64)], [x]).outputs[0].problem.startswith("dtype")
    report = compare_outputs([x, x], [x])
    assert not report.passed and "2 outputs" in report.problem
    json.dumps(compare_outputs([np.array([np.inf], np.float32)], [np.array([1.0], np.float32)]).to_dict(),
               allow_nan=False)


# -- ops and the docs' table --------------------------------------------------------------------
def test_ops_lists_the_registry(capsys):
    from hloexec.ops import OPS
    from hloexec.ops.custom_call import CUSTOM_CALLS
    doc = json.loads(run_cli(capsys, "ops", "--json")[1])
    assert [r["opcode"] for r in doc["ops"]] == sorted(OPS)
    assert sorted(t for r in doc["custom_calls"] for t in r["targets"]) == sorted(CUSTOM_CALLS)
    markdown = run_cli(capsys, "ops", "--markdown")[1]
    assert markdown == optable.markdown_table() and all(f"| `{op}` |" in markdown for op in OPS)


def test_docs_op_table_is_the_generated_one():
    page = REPO_ROOT / "docs" / "custom-calls.md"
    written = optable.readme_table(page.read_text(encoding="utf-8")) if page.exists() else None
    if written is None:
        pytest.skip("docs/custom-calls.md has no op-table markers")
    assert written == optable.markdown_table(), \
        "docs/custom-calls.md's op table is stale: run python -m hloexec.tools.optable --write docs/custom-calls.md"


def test_run_repeat_profiles_the_last_run(capsys):
    """--repeat R runs R times; the outputs and --profile come from the last run, in which the fused kernels
    are compiled (they run op by op on their first call only)."""
    path = EXAMPLES / "gpt_step.pre.hlo"
    code, out, _ = run_cli(capsys, "run", path, "--repeat", 3, "--profile", 5, "--json")
    doc = json.loads(out)
    assert code == 0 and len(doc["seconds"]["runs"]) == 3 and doc["seconds"]["runs"][0] == doc["seconds"]["execute"]
    assert len(doc["profile"]) == 5 and sum(r["ms"] for r in doc["profile"]) < 1e3 * doc["seconds"]["runs"][2]
    code, once, _ = run_cli(capsys, "run", path, "--json")
    for a, b in zip(json.loads(once)["outputs"], doc["outputs"], strict=True):      # the tiers may differ in last bits
        assert a["shape"] == b["shape"] and a["nan"] == b["nan"] and a["mean"] == pytest.approx(b["mean"], rel=1e-4)
    code, _, err = run_cli(capsys, "run", path, "--repeat", 2, "--spmd")
    assert code == 2 and "--repeat" in err
    code, _, err = run_cli(capsys, "run", path, "--repeat", 0)
    assert code == 2 and "count >= 1" in err


def test_reductions_option_of_run_and_compare(capsys, tmp_path):
    """--reductions per-step rounds an f16 sum at every step: 2048 + 1 + 1 + ... stays 2048 (each add is a tie
    that rounds to even), accumulate gives 2048 + 64; compare tells the two apart."""
    path = write(tmp_path, "sum.hlo", "HloModule s\nadd { a = f16[] parameter(0)\n b = f16[] parameter(1)\n"
                 " ROOT c = f16[] add(a, b) }\nENTRY e { x = f16[65] parameter(0)\n z = f16[] constant(0)\n"
                 " ROOT r = f16[] reduce(x, z), dimensions={0}, to_apply=add }\n")
    save_arrays(str(tmp_path / "in.npz"), {"arg0": np.concatenate([[2048], np.ones(64)]).astype(np.float16)})
    for mode, total in (("per-step", 2048), ("accumulate", 2048 + 64)):
        code, _, _ = run_cli(capsys, "run", path, "--inputs", tmp_path / "in.npz", "--reductions", mode,
                             "--out", tmp_path / f"{mode}.npz")
        assert code == 0 and load_arrays(str(tmp_path / f"{mode}.npz"))["out0"] == total
    code, out, _ = run_cli(capsys, "compare", path, "--inputs", tmp_path / "in.npz", "--expected",
                           tmp_path / "per-step.npz", "--reductions", "per-step", "--json")
    assert code == 0 and json.loads(out)["passed"]
    assert run_cli(capsys, "compare", path, "--inputs", tmp_path / "in.npz", "--expected",
                   tmp_path / "per-step.npz")[0] == 1
    assert run_cli(capsys, "run", path, "--reductions", "pairwise")[0] == 2
