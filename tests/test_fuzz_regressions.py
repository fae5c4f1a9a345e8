"""Inputs the fuzzers (fuzz/) and the malformed-input tests found crashing the parser, kept fixed.

Files under tests/data/fuzz_crashers/ are raw fuzzer findings (also swept by .ci/sanitize.sh);
the cases below say what each one must give: the HloParseError XLA's parser would give too.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from hloexec.errors import HloParseError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
from fuzz_parse import parse_and_decode  # noqa: E402

CRASHERS = Path(__file__).resolve().parent / "data" / "fuzz_crashers"


@pytest.mark.parametrize("path", sorted(CRASHERS.iterdir()), ids=lambda p: p.name)
def test_crasher_files(path):
    parse_and_decode(path.read_bytes())


def _entry(*lines: str) -> bytes:
    return ("ENTRY e {\n" + "\n".join(f"  {line}" for line in lines) + "\n}\n").encode()


CASES = {
    # atheris: IndexError in the builder (an operand row not built yet)
    "operand-is-itself": (_entry("p0 = f32[3] parameter(0)", "ROOT p1 = f32[3] add(p0, p1)"),
                          "used before it is defined"),
    "operand-defined-later": (_entry("p0 = f32[3] parameter(0)", "ROOT a = f32[3] add(b, p0)",
                                     "b = f32[3] negate(p0)"), "used before it is defined"),
    # hypothesis: RecursionError in the shape parser and printer
    "tuple-shape-2000-deep": (_entry("ROOT p = " + "(" * 2000 + "f32[]" + ")" * 2000 + " parameter(0)"),
                              "nested deeper than"),
    # RecursionError from json in backend_config
    "json-5000-deep": (_entry('ROOT c = f32[] constant(1), backend_config=' + '{"a":' * 5000 + "1" + "}" * 5000),
                       "backend_config"),
    # hypothesis: ValueError (int() of > 4300 digits) for a parameter number
    "parameter-5000-digits": (_entry("ROOT p = f32[] parameter(" + "1" * 5000 + ")"), "parameter number"),
    # ValueError later, at load: XLA rejects these at parse
    "parameter-not-a-number": (_entry("ROOT p = f32[] parameter(x)"), "parameter number"),
    "parameter-negative": (_entry("ROOT p = f32[] parameter(-1)"), "parameter number"),
    # parsed silently, XLA rejects dimensions outside int64
    "dimension-too-big": (_entry("ROOT p = f32[99999999999999999999999] parameter(0)"), "out of range"),
    "dimension-negative": (_entry("ROOT p = f32[-5] parameter(0)"), "out of range"),
    # the hostile-input audit: an IndexError in every SPMD run (no participant); XLA takes a count
    "num-partitions-zero": (b"HloModule m, num_partitions=0\n\nENTRY e {\n  ROOT p = f32[2] parameter(0)\n}\n",
                            "num_partitions=0: expected a count >= 1"),
    "replica-count-negative": (b"HloModule m, replica_count=-2\n\nENTRY e {\n  ROOT p = f32[2] parameter(0)\n}\n",
                               "replica_count=-2: expected a count >= 1"),
    # AttributeSyntaxError / LiteralSyntaxError escaped from lazy decoding instead of HloParseError
    "bad-attribute": (_entry("p = f32[4] parameter(0)", "ROOT r = f32[4] reverse(p), dimensions={x}"),
                      "dimensions"),
    "bad-literal": (_entry("ROOT c = s32[] constant(99999999999999999999)"), "does not fit"),
}


@pytest.mark.parametrize("text,message", CASES.values(), ids=CASES.keys())
def test_regression(text, message):
    with pytest.raises(HloParseError) as info:
        parse_and_decode(text, strict=True)
    error = info.value
    assert message in str(error)
    assert error.line >= 1 and error.column >= 1


# The hostile-input audit of every command: modules that parse but break a command's own reading of them (each
# was an internal error); the command must exit 2 with `error:` naming the file and what is wrong.
DOT_DIM_OUT_OF_RANGE = _entry(
    "a = f32[2,3] parameter(0)", "b = f32[3,4] parameter(1)",
    "ROOT d = f32[2,4] dot(a, b), lhs_contracting_dims={5}, rhs_contracting_dims={0}").decode()
# metadata decoded lazily, first by numerics in a called computation: its HloParseError came wrapped by the runner
# as "ExecutionError: HloParseError: ..."
BAD_METADATA_IN_A_CALL = (
    "HloModule m\n\nf {\n  a = f32[4] parameter(0)\n"
    '  ROOT n = f32[4] negate(a), metadata={op_name="x" stack_frame_id=1e9}\n}\n\n'
    "ENTRY e {\n  p = f32[4] parameter(0)\n  ROOT r = f32[4] call(p), to_apply=f\n}\n"
)
# an array all-to-all whose split dimension does not divide by its group's size: numpy's "array split does not
# result in an equal division" (a ValueError) came out of the participant
ALL_TO_ALL_UNEVEN = (
    "HloModule a2a, num_partitions=3\n\nENTRY e {\n  p = f32[4,2] parameter(0)\n"
    "  ROOT a = f32[4,2] all-to-all(p), channel_id=1, replica_groups={{0,1,2}}, dimensions={0}\n}\n"
)
# the corpus's u4_all_gather_1x8 (no header, no replica groups): a result gathered from 8 participants run as one
# came out as the runner's "kernel returned u4[4,2], expected u4[4,16]", not saying the group is too small
ALL_GATHER_OF_EIGHT = _entry("p = u4[4,2] parameter(0)", "ROOT g = u4[4,16] all-gather(p), dimensions={1}").decode()
# the corpus's hlo_extractor_test: rng-bit-generator of an f32 state (XLA:CPU cannot compile it; it runs the file
# because its simplifier drops the generator): the kernel returned a u64 state ("kernel returned uint64[4], expected
# f32[4]" in checked runs: numerics, compare --reference shadow); a u64[1] state was an IndexError
RNG_OF_F32_STATE = _entry(
    "s = f32[4] parameter(0)", "ROOT r = (f32[4], u32[8]) rng-bit-generator(s), algorithm=rng_default").decode()
RNG_OF_ONE_WORD = _entry(
    "s = u64[1] parameter(0)", "ROOT r = (u64[1], u32[8]) rng-bit-generator(s), algorithm=rng_three_fry").decode()
# entry parameters numbered 4294967296 and 1: `diff` looked its inputs up by number (IndexError); `run` took
# them in sorted order. XLA numbers a computation's parameters 0..N-1, once each.
PARAMETER_NUMBER_GAP = _entry(
    "a = f32[] parameter(4294967296)", "b = f32[] parameter(1)", "ROOT r = f32[] multiply(a, b)").decode()
COMMAND_CASES = {
    "stats: dot contracting dim past the rank": (["stats", "{f}"], DOT_DIM_OUT_OF_RANGE, "lhs_contracting_dims [5]"),
    "numerics: bad metadata in a called computation": (
        ["numerics", "{f}"], BAD_METADATA_IN_A_CALL, ":5:39: in %n: bad value for attribute metadata"),
    "diff: parameter numbers with a gap": (
        ["diff", "{f}", "{f}"], PARAMETER_NUMBER_GAP, ":2:3: in %a: parameter number 4294967296: computation %e has 2"),
    "run: parameter numbers with a gap": (
        ["run", "{f}"], PARAMETER_NUMBER_GAP, ":2:3: in %a: parameter number 4294967296: computation %e has 2"),
    "run --spmd: all-to-all of a dimension its group does not divide": (
        ["run", "{f}", "--spmd"], ALL_TO_ALL_UNEVEN, "%a: dimension 0 of [[4, 2]] does not split into 3 blocks"),
    "compare --reference shadow: all-gather of a group larger than the run's": (
        ["compare", "{f}", "--reference", "shadow"], ALL_GATHER_OF_EIGHT,
        "gathers from a group of 8 participants, this run's group has 1"),
    "numerics: rng-bit-generator of an f32 state": (
        ["numerics", "{f}"], RNG_OF_F32_STATE, "rng-bit-generator of a state f32[4]: XLA's algorithms take u64"),
    "compare --reference shadow: rng-bit-generator of one state word": (
        ["compare", "{f}", "--reference", "shadow"], RNG_OF_ONE_WORD, "rng-bit-generator of a state u64[1]"),
}


@pytest.mark.parametrize("case", list(COMMAND_CASES))
def test_command_regression(capsys, tmp_path, case):
    from hloexec.tools.cli import main

    argv, text, message = COMMAND_CASES[case]
    path = tmp_path / "m.hlo"
    path.write_text(text)
    code = main([a.format(f=path, d=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and "internal error" not in err and "Traceback" not in err, err
    said = f"error: A: {path}" if argv[0] == "diff" else f"error: {path}"  # diff: the side too
    assert said in err and message in err and "Error:" not in err, err


ADD = """add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] add(a, b)
}
"""
# Instructions XLA's verifier rejects that reached a kernel and failed there with numpy's IndexError / ValueError
# (wrapped as "ExecutionError: IndexError: ..."): now refused as the instruction is prepared, saying what is wrong.
INVALID_INSTRUCTIONS = {
    "reduce-repeated-dimension": (
        _entry("p = f32[4,3] parameter(0)", "z = f32[] constant(0)",
               "ROOT r = f32[3] reduce(p, z), dimensions={0,0}, to_apply=add"), "dimension [0, 0] repeats"),
    "reverse-repeated-dimension": (
        _entry("p = f32[4,3] parameter(0)", "ROOT r = f32[4,3] reverse(p), dimensions={0,0}"), "repeats a dimension"),
    "gather-start-index-map-out-of-range": (
        _entry("p = f32[4,3] parameter(0)", "i = s32[2,1] parameter(1)",
               "ROOT g = f32[2,3] gather(p, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={99}, "
               "index_vector_dim=1, slice_sizes={1,3}"), "start_index_map dimension 99 is out of range"),
    "scatter-dims-to-operand-dims-out-of-range": (
        _entry("x = f32[4,3] parameter(0)", "i = s32[2,1] parameter(1)", "u = f32[2,3] parameter(2)",
               "ROOT s = f32[4,3] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0}, "
               "scatter_dims_to_operand_dims={7}, index_vector_dim=1, to_apply=add"),
        "scatter_dims_to_operand_dims dimension 7 is out of range"),
    "concatenate-operands-of-different-ranks": (
        _entry("a = pred[1] parameter(0)", "b = pred[] parameter(1)", "ROOT c = pred[2] concatenate(a, b), dimensions={0}"),
        "operands pred[1] and pred[] differ outside dimension 0"),
    "multiply-of-pred-and-f32": (
        _entry("a = pred[] parameter(0)", "b = f32[] parameter(1)", "ROOT r = f32[] multiply(a, b)"),
        "different element types: pred[] and f32[]"),
    "add-operands-of-different-dimensions": (
        _entry("a = f32[10] parameter(0)", "b = f32[0] parameter(1)", "ROOT r = f32[10] add(a, b)"),
        "different dimensions: f32[10] and f32[0]"),
}


@pytest.mark.parametrize("text,message", INVALID_INSTRUCTIONS.values(), ids=INVALID_INSTRUCTIONS.keys())
def test_invalid_instruction_refused_before_its_kernel(text, message):
    import hloexec
    from hloexec.errors import UnsupportedError

    module = ADD + text.decode()
    with pytest.raises(UnsupportedError, match="not what the operands give") as info:
        exe = hloexec.load(module, compile="never")
        exe.run(*exe.random_inputs(seed=0))
    assert message in str(info.value) and "HLO line" in str(info.value)


# Library arguments of the wrong type: each failed inside (numpy's or os.path's TypeError, AttributeError 'but',
# bytes(5) parsed as five NUL bytes); now a TypeError naming the argument.
SMALL = "HloModule small\n\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT r = f32[4] negate(p)\n}\n"
WRONG_TYPES = {
    "device=5": ({"device": 5}, "device=5: expected a DeviceProfile"),
    "device=[tpu]": ({"device": ["tpu"]}, "device=['tpu']: expected a DeviceProfile"),
    "max_memory='8G'": ({"max_memory": "8G"}, "max_memory='8G': expected a number of bytes"),
    "options=5": ({"options": 5}, "options=5: expected an hloexec.options.Options"),
}


@pytest.mark.parametrize("kwargs,message", WRONG_TYPES.values(), ids=WRONG_TYPES.keys())
def test_load_names_an_argument_of_the_wrong_type(kwargs, message):
    import hloexec

    with pytest.raises(TypeError, match=re.escape(message)):
        hloexec.load(SMALL, **kwargs)


@pytest.mark.parametrize("source", [None, 5])
def test_parse_names_a_source_that_is_not_text(source):
    import hloexec

    with pytest.raises(TypeError, match=f"HLO text .* not {type(source).__name__}"):
        hloexec.parse(source)


def test_random_inputs_name_a_negative_seed():
    import hloexec
    from hloexec.errors import ExecutionError

    with pytest.raises(ExecutionError, match="seed must be an integer >= 0, got -1"):
        hloexec.load(SMALL).random_inputs(seed=-1)


STRAY_DEVICE_ID = "HloModule stray\n\n" + ADD + _entry(
    "p = f32[4] parameter(0)", "ROOT ar = f32[4] all-reduce(p), replica_groups={{99999999999,0}}, to_apply=add").decode()


def test_a_stray_device_id_is_not_inferred_as_a_machine(capsys, tmp_path):
    """A headerless module whose replica groups name device 99999999999: `run --spmd`, `collectives`, `export`
    and `memory --spmd` set out to make 1e11 participants (hung); the counts are not inferred past 65536."""
    import hloexec
    from hloexec import spmd
    from hloexec.errors import ExecutionError
    from hloexec.tools.cli import main

    with pytest.raises(ExecutionError, match="100000000000 replicas: more than 65536 participants are not inferred"):
        spmd.device_counts(hloexec.parse(STRAY_DEVICE_ID)[0])
    assert spmd.device_counts(hloexec.parse(STRAY_DEVICE_ID)[0], 1, 2)[:2] == (1, 2)   # counts given: as given
    path = tmp_path / "m.hlo"
    path.write_text(STRAY_DEVICE_ID)
    assert main(["collectives", str(path)]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "--partitions/--replicas" in err and "internal error" not in err, err



@pytest.mark.parametrize("bad", ["A", "B"])
@pytest.mark.parametrize("edit, message", [
    ("f32[4] frobnicate(p)", "unsupported opcode 'frobnicate'"),
    ("f32[5] negate(p)", "shape f32[5] is not what the operands give"),
    ("f32[4] add(p)", "add expects 2 operands, has 1"),
], ids=["unsupported", "shape", "parse"])
def test_diff_names_the_side_and_file_of_a_bad_module(capsys, tmp_path, bad, edit, message):
    """diff A B: an error about one module says which (A or B) and its file (unsupported op and shape: neither)."""
    from hloexec.tools.cli import main

    good, wrong = tmp_path / "good.hlo", tmp_path / "wrong.hlo"
    good.write_text(SMALL)
    wrong.write_text(SMALL.replace("f32[4] negate(p)", edit))
    a, b = (wrong, good) if bad == "A" else (good, wrong)
    code = main(["diff", str(a), str(b)])
    err = capsys.readouterr().err
    said = f"error: {bad}: {wrong}:5:3: " if edit == "f32[4] add(p)" else f"error: {bad} ({wrong}): "  # parse: file:line
    assert code == 2 and err.startswith(said) and message in err, err


NEGATE_CALLED = "HloModule m\n\nf {\n  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a)\n}\n\n"


@pytest.mark.parametrize("root, message", [
    ("ROOT r = f32[5] fusion(p), kind=kLoop, calls=f", "fusion f32[5] does not fit computation %f: its root is f32[4]"),
    ("ROOT r = bf16[4] fusion(p), kind=kLoop, calls=f", "fusion bf16[4] does not fit computation %f: its root is f32[4]"),
    ("ROOT r = (f32[4]) fusion(p), kind=kLoop, calls=f", "fusion (f32[4]) does not fit computation %f: its root is"),
    ("ROOT r = f32[4] fusion(p, p), kind=kLoop, calls=f", "2 operands for a computation of 1 parameters"),
    ("ROOT r = f32[4] fusion(i), kind=kLoop, calls=f", "operand 0 is s32[4], parameter 0 f32[4]"),
    ("ROOT r = f32[4] call(i), to_apply=f", "call f32[4] does not fit computation %f: operand 0 is s32[4]"),
    ("ROOT r = s32[4] call(p), to_apply=f", "call s32[4] does not fit computation %f: its root is f32[4]"),
], ids=["fusion-dims", "fusion-type", "fusion-tuple", "fusion-operands", "fusion-operand-type", "call-operand-type",
        "call-result"])
def test_a_fusion_or_call_that_does_not_fit_its_computation_is_refused_as_the_module_is_prepared(root, message):
    """Its declared type against the called computation's root, its operands against the parameters: refused
    by hloexec.load (was a run-time 'kernel returned float32[4], expected f32[5]'; a call's or fusion's operand of
    another type than its parameter ran silently, one operand too many was a TypeError inside)."""
    import hloexec
    from hloexec.errors import UnsupportedError

    text = NEGATE_CALLED + _entry("p = f32[4] parameter(0)", "i = s32[4] parameter(1)", root).decode()
    with pytest.raises(UnsupportedError) as info:
        hloexec.load(text, compile="never")
    assert message in str(info.value) and "in %r = " in str(info.value) and "HLO line 11" in str(info.value)
    ok = root.replace("f32[5]", "f32[4]").replace("bf16[4]", "f32[4]").replace("(f32[4])", "f32[4]")
    ok = ok.replace("(p, p)", "(p)").replace("(i)", "(p)").replace("s32[4] call", "f32[4] call")
    exe = hloexec.load(NEGATE_CALLED + _entry("p = f32[4] parameter(0)", "i = s32[4] parameter(1)", ok).decode())
    x = np.arange(4, dtype=np.float32)
    assert exe.run(x, np.zeros(4, np.int32)).tolist() == (-x).tolist()      # the fitting form runs


def test_an_error_found_after_parsing_shows_its_line_under_the_message():
    """An instruction's error raised as the module is prepared (its operand count) showed an empty line over
    its caret: it shows the instruction's line, as the parser's own errors do."""
    import hloexec

    text = SMALL.replace("negate(p)", "add(p)")
    with pytest.raises(HloParseError) as info:
        hloexec.load(text)
    assert info.value.line == 5 and info.value.line_text == "  ROOT r = f32[4] add(p)", info.value.line_text
    assert str(info.value).endswith("\n    ROOT r = f32[4] add(p)\n    ^")


def test_diff_of_modules_taking_different_parameters_names_both_files(capsys, tmp_path):
    from hloexec.tools.cli import main

    a, b = tmp_path / "a.hlo", tmp_path / "b.hlo"
    a.write_text(SMALL)
    b.write_text(SMALL.replace("f32[4]", "f32[5]"))
    code = main(["diff", str(a), str(b)])
    err = capsys.readouterr().err
    assert code == 2 and f"A ({a}) and B ({b}) take different parameters" in err, err
