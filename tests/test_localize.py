"""Finding where numbers go wrong (issue 16): dump directories as inputs (hloexec.tools.dumpdir), XLA's binary
dumps (hloproto), the instruction-level diff (match, diff), pass bisection (bisect), extract and minimize.

The dumps are made by jax in child processes (tests/xla_dumps.py), once per session.
"""
from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

import hloexec
from hloexec.tools import hloproto
from hloexec.tools.bisect import bisect
from hloexec.tools.cli import main
from hloexec.tools.diff import diff
from hloexec.tools.dumpdir import program_texts, resolve, scan
from hloexec.tools.extract import capture, cone_cut, find_instruction, submodule
from hloexec.tools.match import match
from hloexec.tools.minimize import Check, minimize
from hloexec.tools.xla_cpu import load_arrays

from conftest import shared_path
from xla_dumps import PASSES, PROTO, SNAPSHOTS, TEXT, make_dump


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def dump_fixture(program: str, *flags: str):
    """A session fixture: the dump directory of tests/xla_dumps.py's `program`, made once."""
    @pytest.fixture(scope="session")
    def fixture(tmp_path_factory):
        pytest.importorskip("jax")
        path = tmp_path_factory.mktemp(program)
        make_dump(path, program, *flags)
        return path
    return fixture


layernorm_dump = dump_fixture("layernorm_grad_f16", TEXT, PASSES)
row_sum_dump = dump_fixture("row_sum_grad_f16", TEXT, PASSES)
snapshot_dump = dump_fixture("mlp_f32", TEXT, SNAPSHOTS)
gpt_dump = dump_fixture("gpt_step_bf16", TEXT)
arange_dump = dump_fixture("arange_f32", TEXT, PROTO)


def module_at(directory, stage, name="jit_loss"):
    return hloexec.parse(resolve(directory, name, stage)[1].path)[0]


# -- dump directories ------------------------------------------------------------------------------
@pytest.mark.xla
def test_dump_lists_the_programs_and_their_stages(layernorm_dump, capsys):
    code, out, _ = run_cli(capsys, "dump", layernorm_dump, "--json")
    assert code == 0
    modules = {m["name"]: m for m in json.loads(out)["modules"]}
    loss = modules["jit_loss"]
    assert loss["before"]["instructions"] > 100 and loss["after"][0]["backend"] == "cpu"
    assert loss["after"][0]["instructions"] > loss["before"]["instructions"]      # fused computations added
    steps = [p["step"] for p in loss["passes"]]
    assert steps == sorted(steps) and len(steps) > 40
    assert "tree_reduction_rewriter" in {p["after"] for p in loss["passes"]}
    code, out, _ = run_cli(capsys, "dump", layernorm_dump)
    assert code == 0 and re.search(r"jit_loss\s+\d+ \(", out)
    (program,) = program_texts(layernorm_dump)          # what the pytest plugin's --hloexec-dumps reads
    assert program.name == "jit_loss" and program.after_path.name.endswith(".cpu_after_optimizations.txt")
    before, after = hloexec.parse(program.before)[0], hloexec.parse(program.after)[0]
    assert before.instruction_count == loss["before"]["instructions"]
    assert after.instruction_count == loss["after"][0]["instructions"]


@pytest.mark.xla
def test_a_dump_directory_is_a_file_argument_of_every_command(layernorm_dump, capsys):
    code, out, err = run_cli(capsys, "run", layernorm_dump, "--module", "jit_loss", "--stage", "before", "--json")
    assert code == 0, err
    assert "before optimizations" in err and len(json.loads(out)["outputs"]) == 3
    code, out, err = run_cli(capsys, "stats", layernorm_dump, "--module", "jit_loss", "--stage",
                             "tree_reduction_rewriter", "--json")
    assert code == 0, err
    assert json.loads(out)["files"][0]["path"].endswith("after_tree_reduction_rewriter.before_zero_sized_hlo_"
                                                        "elimination.txt")
    code, out, err = run_cli(capsys, "memory", layernorm_dump, "--module", "0", "--stage", "before", "--json")
    assert code == 0 and "before optimizations" in err, err             # the reports too
    code, _, err = run_cli(capsys, "run", layernorm_dump, "--module", "jit_nope")     # say which there are
    assert code == 2 and "jit_loss" in err
    code, _, err = run_cli(capsys, "run", layernorm_dump, "--module", "jit_loss", "--stage", "no_such_pass")
    assert code == 2 and "algsimp" in err


@pytest.mark.xla
def test_a_stage_whose_text_elides_a_constant_is_read_from_its_proto(arange_dump, tmp_path, capsys):
    ones = tmp_path / "ones.npz"
    from hloexec.tools.xla_cpu import save_arrays
    save_arrays(str(ones), {"arg0": np.ones(64, np.float32)})
    out = tmp_path / "out.npz"
    code, _, err = run_cli(capsys, "run", arange_dump, "--stage", "before", "--inputs", ones, "--out", out)
    assert code == 0, err
    assert load_arrays(str(out))["out0"].tolist() == [1.0 + k for k in range(64)]
    (program,) = program_texts(arange_dump)
    assert "{...}" in program.before_path.read_text() and "{...}" not in program.before    # the proto's values
    text_only = tmp_path / "text_only"
    text_only.mkdir()
    for f in arange_dump.glob("*.txt"):
        (text_only / f.name).write_text(f.read_text())
    code, _, err = run_cli(capsys, "run", text_only, "--stage", "before", "--inputs", ones, "--out", out)
    assert code == 0 and "elided" in err
    assert load_arrays(str(out))["out0"].tolist() == [1.0] * 64        # the {...} read as zeros


def test_literals_of_the_hand_written_protobuf_reader():
    """LiteralProto fields by XLA's numbers: packed varints (negative s32 as 64-bit two's complement), packed
    floats, f16/bf16 bytes, preds, tuples."""
    def varint(n):
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not out[-1] & 0x80:
                return bytes(out)

    def field(number, payload):
        return varint(number << 3 | 2) + varint(len(payload)) + payload

    def shape(type_number, dims):
        return field(1, varint(2 << 3) + varint(type_number) + field(3, b"".join(varint(d) for d in dims)))
    s32 = shape(4, [3]) + field(4, b"".join(varint(v & (2 ** 64 - 1)) for v in (-5, 0, 7)))
    assert hloproto.read_literal(s32).tolist() == [-5, 0, 7]
    f32 = shape(11, [2, 2]) + field(8, np.array([1.5, -2, 3, 4], "<f4").tobytes())
    assert hloproto.read_literal(f32).tolist() == [[1.5, -2], [3, 4]]
    import ml_dtypes
    bf16 = np.array([1, -0.5, 3], ml_dtypes.bfloat16)
    got = hloproto.read_literal(shape(16, [3]) + field(13, bf16.tobytes()))
    assert got.dtype == ml_dtypes.bfloat16 and got.tolist() == bf16.tolist()
    pred = shape(1, [2]) + field(2, varint(1) + varint(0))
    assert hloproto.read_literal(pred).tolist() == [True, False]
    tuple_literal = field(1, varint(2 << 3) + varint(13)) + field(10, s32) + field(10, f32)
    a, b = hloproto.read_literal(tuple_literal)
    assert a.tolist() == [-5, 0, 7] and b.shape == (2, 2)
    with pytest.raises(hloproto.ProtoError, match="holds 2 values"):
        hloproto.read_literal(shape(11, [3]) + field(8, np.zeros(2, "<f4").tobytes()))


@pytest.mark.xla
def test_a_snapshot_gives_the_real_inputs_and_the_device_result(snapshot_dump, capsys):
    """XLA:CPU's snapshot of an f32 program: its arguments are the ones the script ran with; `compare
    SNAPSHOT` runs its module on them against the result XLA:CPU returned."""
    (program,) = [m for m in scan(snapshot_dump) if m.snapshots]
    snap = hloproto.read_snapshot(program.snapshots[0])
    given = load_arrays(str(snapshot_dump / "inputs.npz"))
    assert all(np.array_equal(a, given[f"arg{i}"]) for i, a in enumerate(snap.arguments))
    code, out, err = run_cli(capsys, "compare", program.snapshots[0], "--json")
    assert code == 0, err
    assert "the snapshot's 3 arguments" in err and json.loads(out)["passed"]
    code, out, err = run_cli(capsys, "compare", snapshot_dump, "--module", program.name, "--stage", "snapshot")
    assert code == 0, err


# -- diff ----------------------------------------------------------------------------------------
@pytest.mark.xla
def test_diff_of_two_passes_points_at_the_reduction_the_tree_rewrite_split(row_sum_dump):
    a, b = module_at(row_sum_dump, "7"), module_at(row_sum_dump, "tree_reduction_rewriter")
    report = diff(a, b, hloexec.Executable(a).random_inputs(0), atol=1e-4, rtol=1e-4)   # f16 roundings differ
    (first,) = report.first_divergence
    assert first.a_inst.opcode == first.b_inst.opcode == "reduce" and first.a_inst.name == first.b_inst.name
    assert [n.inst.opcode for n in first.between_b] == ["reduce-window"] and not first.between_a
    assert first.inputs_identical and not first.verdict.agree
    assert report.outputs and not report.outputs[0][2].agree


@pytest.mark.xla
def test_diff_before_and_after_optimization_of_the_layernorm_gradient(layernorm_dump, capsys):
    """Fusions opened up: A's unfused reductions pair with B's reductions inside fusions; among the first
    divergences are the f16 reductions XLA:CPU split into reduce-window + reduce (with XLA's abs/rel
    tolerance, algsimp's rewrites of the elementwise chain also show)."""
    code, out, err = run_cli(capsys, "diff", layernorm_dump, "--module", "jit_loss", "--stage", "before",
                             "--stage-b", "after", "--json")
    assert code == 1, err
    report = json.loads(out)
    assert report["matching"]["by"]["metadata"] > 10 and report["matching"]["by"]["structure"] > 0
    firsts = report["first_divergence"]
    split = [d for d in firsts if d["a_opcode"] == "reduce" and any(n["opcode"] == "reduce-window"
                                                                      for n in d["between"]["b"])]
    assert split, [d["a"] for d in firsts]
    for d in firsts:
        assert set(d) >= {"a", "b", "a_text", "b_text", "op_name", "source", "error", "inputs", "between"}
        assert not d["error"]["problem"] and d["error"]["mismatches"] > 0


@pytest.mark.xla
def test_diff_of_a_bf16_gpt_train_step_before_and_after_optimization(gpt_dump):
    before, after = module_at(gpt_dump, "before", "jit_step"), module_at(gpt_dump, "after", "jit_step")
    inputs = hloexec.Executable(before).random_inputs(0)
    report = diff(before, after, inputs)
    assert len(report.outputs) == len(before.entry.root.operands)
    assert report.counts()["values_compared"] > 100
    for d in report.first_divergence:          # each: differs, while the pairs of its inputs agree
        assert not d.verdict.agree
        for x, y in d.inputs:
            assert all(v.agree for v in report.verdicts.get((x.index, y.index), ()))
    same = diff(before, hloexec.parse(before.to_text())[0], inputs)
    assert not same.diverges and same.counts()["differ"] == 0


EDITED_CONSTANT = re.compile(r"(%constant[.\w]* = f32\[\] constant\()0\.00390625(\))")


@pytest.mark.xla
def test_diff_points_at_the_fusion_whose_constant_was_edited(layernorm_dump, capsys, tmp_path):
    """A module against a copy with one constant changed in one fused computation: fusions run compiled,
    the edited one is the first divergence (its inputs identical), and inside it the constant."""
    path = resolve(layernorm_dump, "jit_loss", "after")[1].path
    text = path.read_text()
    m = EDITED_CONSTANT.search(text)
    edited = tmp_path / "edited.hlo"
    edited.write_text(text[:m.start()] + m.group(1) + "0.005" + m.group(2) + text[m.end():])
    name = re.search(r"%(\S+) = ", m.group(0)).group(1)
    module = hloexec.parse(path)[0]
    fused = find_instruction(module, name).computation
    (fusion,) = [i for i in module.entry.instructions if i.called.get("calls") is fused]
    code, out, err = run_cli(capsys, "diff", path, edited, "--json")
    assert code == 1, err
    first = json.loads(out)["first_divergence"][0]
    assert first["a"] == first["b"] == fusion.name and first["inputs_identical"]
    inside = first["inside"]["first_divergence"]
    assert inside[0]["a"] == name and inside[0]["a_opcode"] == "constant"


def test_diff_follows_a_loop_state_across_iterations():
    """A constant edited in a while body: the first change is that constant at the first iteration; the
    values of later iterations and after the loop come from it (a loop's state is its initial value at the
    first run and the body's result of the run before), so none of them is reported."""
    from test_exec_plan import FUSED_LOOP
    a = hloexec.parse(FUSED_LOOP)[0]
    b = hloexec.parse(FUSED_LOOP.replace("h = f32[] constant(0.5)", "h = f32[] constant(0.6)"))[0]
    report = diff(a, b, [np.random.default_rng(0).standard_normal(65536).astype(np.float32)])
    assert [(d.a_inst.name, d.occurrence) for d in report.first_divergence] == [("h", 0)]
    assert [(d.a_inst.name, d.occurrence) for d in report.first_change] == [("h", 0)]
    assert len(report.verdicts[next(p for p in report.verdicts if report.matching.a.nodes[p[0]].inst.name
                                     == "x1")]) == 3         # the body's values pair run by run
    assert report.diverges


def test_matching_by_name_metadata_and_structure():
    a = hloexec.parse("""HloModule a
ENTRY e {
  p = f32[4] parameter(0)
  c = f32[] constant(2)
  b = f32[4] broadcast(c), dimensions={}
  m = f32[4] multiply(p, b), metadata={op_name="jit(f)/mul"}
  n = f32[4] negate(m)
  ROOT r = f32[4] add(n, p)
}""")[0]
    b = hloexec.parse("""HloModule b
f { x = f32[4] parameter(0)
  two = f32[] constant(2)
  bb = f32[4] broadcast(two), dimensions={}
  renamed = f32[4] multiply(x, bb), metadata={op_name="jit(f)/mul"}
  ROOT neg = f32[4] negate(renamed) }
ENTRY e {
  p = f32[4] parameter(0)
  fu = f32[4] fusion(p), kind=kLoop, calls=f
  ROOT r = f32[4] add(fu, p)
}""")[0]
    m = match(a, b)
    pairs = {(x.inst.name, y.inst.name): m.how[y.index] for x, y in m.pairs()}
    assert pairs[("p", "p")] == "anchor" and pairs[("r", "r")] == "anchor"
    assert pairs[("m", "renamed")] == "metadata"
    assert pairs[("n", "neg")] == "structure" and pairs[("c", "two")] == "structure"


# -- bisect ----------------------------------------------------------------------------------------
@pytest.mark.xla
def test_bisect_names_tree_reduction_rewriter(row_sum_dump, capsys):
    code, out, err = run_cli(capsys, "bisect", row_sum_dump, "--module", "jit_loss", "--json", "--atol", "1e-4",
                             "--rtol", "1e-4")
    assert code == 1, err
    report = json.loads(out)
    assert ".after_tree_reduction_rewriter." in report["first_bad_stage"]
    assert report["pass"] == "tree_reduction_rewriter"
    stages = [s.path.name for s in scan(row_sum_dump)[0].stages()]
    assert stages.index(report["last_good_stage"]) == stages.index(report["first_bad_stage"]) - 1
    assert report["outputs"][0]["changed"] and report["outputs"][0]["mismatches"] > 0
    assert report["diff"]["first_divergence"][0]["a_opcode"] == "reduce"
    assert len(report["checked"]) < len(stages) / 2       # a binary search, not every stage


STAGE = """HloModule m, entry_computation_layout={{(f32[8]{{0}})->f32[8]{{0}}}}

ENTRY %main (p: f32[8]) -> f32[8] {{
  %p = f32[8]{{0}} parameter(0)
  %c = f32[] constant({constant})
  %b = f32[8]{{0}} broadcast(%c), dimensions={{}}
  %x = f32[8]{{0}} multiply(%p, %b)
  ROOT %r = f32[8]{{0}} {root}
}}
"""


def test_bisect_finds_the_stage_with_a_wrong_constant_and_skips_what_cannot_run(tmp_path):
    names = [f"module_0001.m.{k:04d}.pipe.after_pass{k}.before_pass{k + 1}.txt" for k in range(12)]
    for k, name in enumerate(names):
        constant = "3" if k >= 7 else "2"
        root = "custom-call(%x), custom_call_target=\"mystery\"" if k == 5 else "add(%x, %p)"
        (tmp_path / name).write_text(STAGE.format(constant=constant, root=root))
    (tmp_path / "module_0001.m.before_optimizations.txt").write_text(STAGE.format(constant="2", root="add(%x, %p)"))
    report = bisect(scan(tmp_path)[0])
    assert report.stages[report.first_bad].path.name == names[7]
    assert report.stages[report.last_good].path.name == names[6]
    skipped = {report.stages[i].path.name for i, r in report.runs.items() if r.error}
    assert skipped == {names[5]}          # the search stepped over it
    first = report.diff.first_divergence[0]
    assert first.a_inst.name == first.b_inst.name == "c" and first.a_inst.opcode == "constant"


# -- extract ---------------------------------------------------------------------------------------
@pytest.mark.xla
def test_extract_replays_the_instruction_and_parses_with_xla(layernorm_dump, tmp_path, capsys):
    from hloexec.tools.xla_cpu import parse_with_xla
    path = resolve(layernorm_dump, "jit_loss", "after")[1].path
    module = hloexec.parse(path)[0]
    fusion = next(i for i in module.entry.instructions if i.opcode == "fusion" and len(i.operands) > 3)
    inner = fusion.called["calls"].root.operands[0]
    for name, depth in ((fusion.name, ["--depth", "1"]), (inner.name, []), (fusion.name, ["--until-parameters"])):
        out, npz = tmp_path / f"{name}.hlo", tmp_path / f"{name}.npz"
        code, stdout, err = run_cli(capsys, "extract", path, name, *depth, "-o", out, "--inputs-out", npz, "--seed", 3)
        assert code == 0, err
        assert "replay: the extract gives the same bits" in stdout
        parse_with_xla(out.read_text())
        code, _, err = run_cli(capsys, "run", out, "--inputs", npz)
        assert code == 0, err
    exe = hloexec.Executable(module)
    inputs = exe.random_inputs(3)
    sub = submodule([inner], cone_cut(inner, 0))
    values = capture(exe, sub.parameters + [inner], inputs)
    assert np.array_equal(hloexec.load(sub.text).run(*values[:-1]).view(np.uint16), values[-1].view(np.uint16))
    code, _, err = run_cli(capsys, "extract", path, "no_such_instruction")
    assert code == 2 and "no instruction named" in err


# -- minimize --------------------------------------------------------------------------------------
def planted_module(n: int = 1000, bad_at: int = 600, seed: int = 0) -> str:
    """`n` bounded elementwise instructions over four parameters; instruction `bad_at` is a log of a value
    made negative: the NaN it makes reaches some of the five outputs (the last at least)."""
    rng = np.random.default_rng(seed)
    lines = ["HloModule planted", "ENTRY main {"]
    names = []
    for i in range(4):
        lines.append(f"  p{i} = f32[64] parameter({i})")
        names.append(f"p{i}")
    lines += ["  half = f32[] constant(0.5)", "  halves = f32[64] broadcast(half), dimensions={}"]
    for k in range(n):
        if k == bad_at - 2:
            line = f"abs({names[-1]})"
        elif k == bad_at - 1:
            line = f"negate({names[-1]})"
        elif k == bad_at:
            line = f"log({names[-1]})"
        elif k == bad_at + 1:
            line = f"tanh({names[-1]})"
        else:
            op = rng.choice(["add", "subtract", "multiply", "tanh", "sine", "maximum", "minimum"])
            x, y = rng.choice(names[-20:]), rng.choice(names[-20:])
            line = f"{op}({x})" if op in ("tanh", "sine") else f"multiply({x}, halves)" if op == "multiply" \
                else f"{op}({x}, {y})"
        lines.append(f"  v{k} = f32[64] {line}")
        names.append(f"v{k}")
    outs = [names[-1], names[-5], names[n * 3 // 10], names[-n // 20], f"v{bad_at + 1}"]
    lines += [f"  ROOT out = ({', '.join(['f32[64]'] * 5)}) tuple({', '.join(outs)})", "}"]
    return "\n".join(lines)


def test_minimize_shrinks_a_planted_nan_to_the_instruction_that_makes_it(tmp_path, capsys):
    path = tmp_path / "planted.hlo"
    path.write_text(planted_module())
    out = tmp_path / "small.hlo"
    code, stdout, err = run_cli(capsys, "minimize", path, "--check", "nan", "-o", out, "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["original_instructions"] > 500 and report["instructions"] <= 10
    assert report["final_check"] == "2/2" and [s["step"] for s in report["steps"]][0] == "outputs"
    small = hloexec.parse(out)[0]
    assert "log" in {i.opcode for i in small.entry.instructions}
    values = [load_arrays(report["inputs_out"])[f"arg{i}"] for i in range(len(small.entry.parameters))]
    assert not any(np.isnan(v).any() for v in values)
    assert np.isnan(hloexec.load(out.read_text()).run(*values)).any()


def test_minimize_with_a_command_check_and_a_flaky_one(tmp_path):
    """A shell command decides (exit 0 = interesting); a check that fails once and then passes is retried and
    counted as flaky."""
    module = hloexec.parse(planted_module(n=60, bad_at=40))[0]
    inputs = hloexec.Executable(module).random_inputs(0)
    script = tmp_path / "has_log.py"
    script.write_text("import sys\nsys.exit(0 if ' log(' in open(sys.argv[1]).read() else 1)\n")
    result = minimize(module, inputs, Check(f"{sys.executable} {script} {{}}"))
    assert result.instructions <= 3 and " log(" in result.text
    calls = {"n": 0}
    nan = Check("nan")

    def flaky(text, values):
        calls["n"] += 1
        return nan(text, values) and calls["n"] % 3 != 2
    result = minimize(module, inputs, flaky, retries=2)
    assert result.flaky > 0 and result.instructions <= 10


def sums_module(n: int = 24) -> str:
    """`n` exact f32 elementwise instructions over two parameters, one of them converted to f16 and summed: XLA:CPU
    accumulates that sum in f16, hloexec in f32 (docs/semantics.md, Reductions), so the two disagree there only."""
    rng = np.random.default_rng(0)
    lines = ["HloModule sums", "add { x = f16[] parameter(0)\n  y = f16[] parameter(1)\n  ROOT s = f16[] add(x, y) }",
             "ENTRY main {", "  p0 = f32[4096] parameter(0)", "  p1 = f32[4096] parameter(1)"]
    names = ["p0", "p1"]
    for k in range(n):
        x, y = rng.choice(names[-6:], 2)
        lines.append(f"  v{k} = f32[4096] {rng.choice(['add', 'subtract', 'maximum', 'minimum'])}({x}, {y})")
        names.append(f"v{k}")
    lines += [f"  c = f16[4096] convert(v{n // 2})", "  zero = f16[] constant(0)",
              "  r = f16[] reduce(c, zero), dimensions={0}, to_apply=add", f"  ROOT t = (f32[4096], f16[]) tuple(v{n - 1}, r)",
              "}"]
    return "\n".join(lines)


@pytest.mark.xla
def test_minimize_with_the_xla_check_keeps_the_f16_sum():
    """The built-in check 'hloexec and XLA:CPU disagree' (each candidate run on XLA:CPU in a child process)
    shrinks the module to the f16 reduce they sum differently."""
    module = hloexec.parse(sums_module())[0]
    result = minimize(module, hloexec.Executable(module).random_inputs(0), Check("xla"))
    small = hloexec.parse(result.text)[0]
    assert small.entry.root.opcode == "reduce" and result.instructions <= 4
    assert result.final_holds == "2/2"


# -- the seeds ---------------------------------------------------------------------------------------
@pytest.mark.xla
def test_diff_and_extract_on_the_tpu_seed(tmp_path, capsys):
    """The TPU seed (8 partitions, run as one participant) against a copy whose epsilon in one fused computation
    is edited: the first divergence is that fusion (its input identical), inside it the constant, at its line in
    the seed. Extract of a multi-output fusion (a tuple) replays to the same bits and parses with XLA's parser."""
    from hloexec.tools.xla_cpu import parse_with_xla
    path = shared_path("seeds", "tpu_seqparallel_remat_8dev.hlo")
    text = path.read_text()
    old = "%constant.54 = f32[]{:T(256)} constant(1e-08)"
    line = text[:text.index(old)].count("\n") + 1
    edited = tmp_path / "edited.hlo"
    edited.write_text(text.replace(old, "%constant.54 = f32[]{:T(256)} constant(0.001)"))
    code, out, err = run_cli(capsys, "diff", path, edited, "--json")
    assert code == 1, err
    (first,) = json.loads(out)["first_divergence"]
    assert first["a"] == first["b"] == "fusion.15" and first["inputs_identical"]
    (inside,) = first["inside"]["first_divergence"]
    assert inside["a"] == "constant.54" and inside["a_line"] == inside["b_line"] == line
    out, npz = tmp_path / "f5.hlo", tmp_path / "f5.npz"
    code, stdout, err = run_cli(capsys, "extract", path, "fusion.5", "--depth", "1", "-o", out, "--inputs-out", npz,
                                "--json")
    assert code == 0, err
    report = json.loads(stdout)
    assert report["replay"]["identical"] and len(report["parameters"]) == 3
    assert hloexec.parse(out)[0].entry.root.shape.is_tuple
    parse_with_xla(out.read_text())


# -- the GPU seed -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_diff_of_the_gpu_seed_and_a_copy_with_one_fusion_edited(tmp_path):
    """The 16-device GPT train step (one participant) against a copy whose GELU constant in one fusion is
    changed: the first change is that fusion, inside it the constant. ~1 minute on 2 idle cores, 4 GB:
    HLOEXEC_RUN_SLOW=1 flock /tmp/hloexec-heavy.lock pytest -m slow tests/test_localize.py -k seed"""
    path = shared_path("seeds", "gpt_train_step_shard_parallel_16dev.hlo")
    text = path.read_text()
    old = "%constant_768 = f16[] constant(1.1279)"
    assert old in text
    edited = tmp_path / "edited.hlo"
    edited.write_text(text.replace(old, "%constant_768 = f16[] constant(1.2)"))
    a, b = hloexec.parse(path)[0], hloexec.parse(edited)[0]
    from hloexec.exec.inputs import random_inputs
    report = diff(a, b, random_inputs(a, 0))
    first = report.first_change[0]          # the gradients it scales are small: within f16's bounds there
    assert first.a_inst.name == first.b_inst.name == "fusion.495" and first.inputs_identical
    assert first.inside.first_change[0].a_inst.name == "constant_768"
    assert report.diverges          # and the outputs downstream differ
