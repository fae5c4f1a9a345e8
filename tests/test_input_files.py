"""Array files a user hands hloexec (--inputs, --expected, --actual, a dump's inputs): ml_dtypes arrays as plain
np.savez writes them (raw void |V2, |V1) work through every path, and every way a file can be wrong is a clear
error (exit 2) naming the file, the array and what was expected -- never an internal error."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import hloexec
from hloexec.errors import ArrayFileError
from hloexec.tools.arrays import read_values
from hloexec.tools.cli import main

# bf16 + f8e4m3fn: the training types np.savez stores as void. The result is exact in bf16 for these inputs, so
# numpy + ml_dtypes computes the expected values independently.
MIXED = """HloModule mixed

ENTRY e {
  p0 = bf16[4] parameter(0)
  p1 = f8e4m3fn[4] parameter(1)
  c = bf16[4] convert(p1)
  ROOT r = bf16[4] add(p0, c)
}
"""
A = np.array([1.5, -2, 0.25, 96], ml_dtypes.bfloat16)
B = np.array([0.5, 3, -0.125, 16], ml_dtypes.float8_e4m3fn)
SUM = (A.astype(np.float32) + B.astype(np.float32)).astype(ml_dtypes.bfloat16)


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def files(tmp_path):
    """The module, its inputs and expected outputs saved with plain np.savez (bf16/fp8 as void)."""
    (tmp_path / "m.hlo").write_text(MIXED)
    np.savez(tmp_path / "in.npz", arg0=A, arg1=B)
    np.savez(tmp_path / "out.npz", out0=SUM)
    with np.load(tmp_path / "in.npz") as z:
        assert z["arg0"].dtype == np.dtype("V2") and z["arg1"].dtype == np.dtype("V1")    # the case at issue
    return tmp_path


def test_plain_savez_bf16_fp8_run_and_written_outputs_read_back_with_ml_dtypes(capsys, files):
    code, _, err = cli(capsys, "run", files / "m.hlo", "--inputs", files / "in.npz", "--out", files / "r.npz")
    assert code == 0, err
    with np.load(files / "r.npz") as z:          # the documented convention: uint bits + __dtypes__
        names = json.loads(str(z["__dtypes__"]))
        got = z["out0"].view(getattr(ml_dtypes, names["out0"]))
    assert got.dtype == ml_dtypes.bfloat16 and got.tolist() == SUM.tolist()


@pytest.mark.parametrize("argv", [
    ["compare", "{m}", "--inputs", "{d}/in.npz", "--expected", "{d}/out.npz"],
    ["compare", "{m}", "--inputs", "{d}/in.npz", "--reference", "shadow"],
    ["compare", "{m}", "--inputs", "{d}/in.npz", "--reference", "shadow", "--actual", "{d}/out.npz"],
    ["run", "{m}", "--inputs", "{d}/in.npz", "--shadow"],
    ["run", "{m}", "--inputs", "{d}/in.npz", "--find-nonfinite"],
    ["numerics", "{m}", "--inputs", "{d}/in.npz"],
], ids=["expected", "shadow", "actual", "run-shadow", "find-nonfinite", "numerics"])
def test_plain_savez_bf16_fp8_through_every_command(capsys, files, argv):
    argv = [a.format(m=files / "m.hlo", d=files) for a in argv]
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    assert "error" not in err


def test_plain_savez_bf16_fp8_against_xla_in_its_child_process(capsys, files):
    pytest.importorskip("jax")
    code, out, err = cli(capsys, "compare", files / "m.hlo", "--inputs", files / "in.npz", "--against", "xla",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["passed"]


def test_plain_savez_outputs_as_shadow_candidates_are_judged_not_passed_through(capsys, files):
    """A candidate off by a lot (void bytes of a wrong answer) is judged inconsistent: the void was read as bf16."""
    np.savez(files / "wrong.npz", out0=(SUM.astype(np.float32) * 4).astype(ml_dtypes.bfloat16))
    code, out, err = cli(capsys, "compare", files / "m.hlo", "--inputs", files / "in.npz", "--reference", "shadow",
                         "--actual", files / "wrong.npz", "--json")
    assert code == 1, err


def test_read_values_nests_tuple_parameters_and_restores_void(tmp_path):
    module = hloexec.parse("HloModule t\nENTRY e {\n  p = (bf16[2], f32[]) parameter(0)\n"
                           "  ROOT g = bf16[2] get-tuple-element(p), index=0\n}\n")[0]
    np.savez(tmp_path / "t.npz", arg0=A[:2], arg1=np.float32(3))
    [value] = read_values(tmp_path / "t.npz", "arg", [p.shape for p in module.entry.parameters],
                          what="entry arguments")
    assert value[0].dtype == ml_dtypes.bfloat16 and value[0].tolist() == A[:2].tolist() and value[1] == 3


def test_an_npy_file_is_the_one_argument_of_a_one_parameter_module(capsys, tmp_path):
    (tmp_path / "one.hlo").write_text("HloModule one\nENTRY e {\n  p = bf16[4] parameter(0)\n"
                                      "  ROOT n = bf16[4] negate(p)\n}\n")
    np.save(tmp_path / "a.npy", A)                        # np.save also writes ml_dtypes as void
    code, out, err = cli(capsys, "run", tmp_path / "one.hlo", "--inputs", tmp_path / "a.npy", "--json")
    assert code == 0, err
    assert json.loads(out)["outputs"][0]["min"] == -float(A.astype(np.float32).max())


def _bad_inputs(d):
    """name -> (write the file, words the message must hold besides the file's name)."""
    def savez(**arrays):
        return lambda p: np.savez(p, **arrays)

    def raw(data):
        return lambda p: p.write_bytes(data)

    def truncated(p):
        np.savez(p, arg0=A, arg1=B)
        p.write_bytes(p.read_bytes()[:150])
    return {
        "object array": (savez(arg0=np.array([1, "x"], dtype=object), arg1=B), ["arg0", "object array"]),
        "missing array": (savez(arg0=A), ["arg1 missing", "f8e4m3fn[4]"]),
        "extra array": (savez(arg0=A, arg1=B, arg2=A), ["arg2", "one too many", "bf16[4]"]),
        "foreign key": (savez(arg0=A, arg1=B, weights=A), ["'weights'", "arg0..argN"]),
        "wrong shape": (savez(arg0=np.zeros(5, ml_dtypes.bfloat16), arg1=B), ["arg0", "shape [5]", "bf16[4]"]),
        "wrong dtype": (savez(arg0=np.zeros(4, np.float32), arg1=B), ["arg0", "float32", "bf16[4]"]),
        "void of another size": (savez(arg0=np.zeros(4, "V4"), arg1=B), ["arg0", "|V4", "bf16[4]"]),
        "truncated": (truncated, ["not an .npz"]),
        "not a zip": (raw(b"hello, not an array file"), ["not an .npz"]),
        "empty": (raw(b""), ["not an .npz"]),
        "bad __dtypes__": (savez(arg0=A, arg1=B, __dtypes__=np.array("{not json")), ["__dtypes__"]),
        "unknown dtype name": (savez(arg0=np.zeros(4, np.uint16), arg1=B,
                                     __dtypes__=np.array('{"arg0": "bfloat99"}')), ["arg0", "bfloat99"]),
    }


BAD_INPUT_COMMANDS = {
    "run": ["run", "{m}", "--inputs", "{f}"],
    "run --shadow": ["run", "{m}", "--inputs", "{f}", "--shadow"],
    "compare --against xla": ["compare", "{m}", "--inputs", "{f}", "--against", "xla"],
    "compare --reference shadow": ["compare", "{m}", "--inputs", "{f}", "--reference", "shadow"],
    "numerics": ["numerics", "{m}", "--inputs", "{f}"],
    "run --spmd": ["run", "{m}", "--inputs", "{f}", "--spmd"],
}


@pytest.mark.parametrize("kind", list(_bad_inputs(None)))
@pytest.mark.parametrize("command", list(BAD_INPUT_COMMANDS))
def test_a_bad_inputs_file_is_an_error_naming_file_and_array_exit_2(capsys, tmp_path, kind, command):
    write, words = _bad_inputs(tmp_path)[kind]
    (tmp_path / "m.hlo").write_text(MIXED)
    bad = tmp_path / "bad.npz"
    write(bad)
    argv = [a.format(m=tmp_path / "m.hlo", f=bad) for a in BAD_INPUT_COMMANDS[command]]
    code, out, err = cli(capsys, *argv)
    assert code == 2
    assert err.startswith("error: ") and "internal error" not in err, err
    if command == "run --spmd" and kind == "wrong shape":
        # global arrays: the shape a sharded parameter covers is checked where it is split, per device
        assert "input 0 (%p0) has shape [5], expected [4]" in err, err
        return
    assert str(bad) in err and all(w in err for w in words), err


@pytest.mark.parametrize("flag", ["--expected", "--actual"])
def test_a_bad_outputs_file_is_an_error_naming_it(capsys, files, flag):
    np.savez(files / "bad.npz", out0=np.array([object()], dtype=object))
    argv = ["compare", files / "m.hlo", flag, files / "bad.npz"] + (["--reference", "shadow"] if flag == "--actual"
                                                                    else [])
    code, _, err = cli(capsys, *argv)
    assert code == 2 and err.startswith("error: ") and "bad.npz" in err and "object array" in err, err


@pytest.mark.parametrize("flag", ["--expected", "--actual"])
@pytest.mark.parametrize("kind", ["shape", "dtype"])
def test_an_outputs_file_of_the_wrong_shape_or_dtype_is_a_bad_input_naming_the_output(capsys, files, flag, kind):
    """--expected and --actual alike: exit 2, not a mismatch (--expected exited 1, a FAIL)."""
    wrong = SUM[:3] if kind == "shape" else SUM.astype(np.float32)
    np.savez(files / "wrong.npz", out0=wrong)
    judged = ["--reference", "shadow"] if flag == "--actual" else []
    code, _, err = cli(capsys, "compare", files / "m.hlo", "--inputs", files / "in.npz", flag, files / "wrong.npz",
                       *judged)
    says = "has shape [3], expected bf16[4]" if kind == "shape" else "has dtype float32, expected bf16[4]"
    assert code == 2 and f"wrong.npz: array out0 {says}" in err, err


def test_a_missing_inputs_file_is_said_as_such(capsys, files):
    code, _, err = cli(capsys, "run", files / "m.hlo", "--inputs", files / "nowhere.npz")
    assert code == 2 and err.startswith("error: ") and "nowhere.npz" in err and "No such file" in err, err


def test_library_readers_raise_array_file_error(tmp_path):
    (tmp_path / "x.npz").write_bytes(b"PK\x03\x04 truncated")
    module = hloexec.parse(MIXED)[0]
    with pytest.raises(ArrayFileError, match="x.npz"):
        read_values(tmp_path / "x.npz", "arg", [p.shape for p in module.entry.parameters], what="entry arguments")


def test_the_jax_bridge_dump_of_a_bf16_program_reads_back_through_every_path(capsys, tmp_path):
    """hloexec.jax.dump writes bf16 inputs and outputs in the documented convention; a user re-saving them with
    plain np.savez (void) gets the same comparison."""
    jax = pytest.importorskip("jax")
    import hloexec.jax
    x = np.linspace(-2, 2, 8).astype(ml_dtypes.bfloat16)
    paths = hloexec.jax.dump(lambda a: jax.numpy.tanh(a) * 2, x, to=tmp_path / "dump")
    with np.load(paths["outputs"]) as z:                          # numpy + ml_dtypes, as docs/robustness.md says
        out = z["out0"].view(getattr(ml_dtypes, json.loads(str(z["__dtypes__"]))["out0"]))
    assert out.dtype == ml_dtypes.bfloat16 and out.shape == x.shape
    np.savez(tmp_path / "plain_in.npz", arg0=x)
    np.savez(tmp_path / "plain_out.npz", out0=out)
    for inputs, expected in ((paths["inputs"], paths["outputs"]), (tmp_path / "plain_in.npz", tmp_path / "plain_out.npz")):
        code, _, err = cli(capsys, "compare", paths["before"], "--inputs", inputs, "--expected", expected)
        assert code == 0, err


def test_plain_savez_float8_e5m2_is_read(capsys, tmp_path):
    """np.save writes ml_dtypes' float8_e5m2 with the descr '<f1' (the other 1-byte types as raw |V1), which
    np.load cannot read back: the file was 'cannot be read' (found by the hostile-input audit)."""
    x = np.array([1.5, -0.25, 57344, 2**-16], ml_dtypes.float8_e5m2)
    (tmp_path / "m.hlo").write_text("HloModule e5m2\n\nENTRY e {\n  p = f8e5m2[4] parameter(0)\n"
                                    "  ROOT c = f32[4] convert(p)\n}\n")
    np.savez(tmp_path / "in.npz", arg0=x)
    with pytest.raises(ValueError, match="<f1"):                 # the case at issue: numpy's own reader
        np.load(tmp_path / "in.npz")["arg0"]
    np.savez(tmp_path / "out.npz", out0=x.astype(np.float32))
    code, _, err = cli(capsys, "compare", tmp_path / "m.hlo", "--inputs", tmp_path / "in.npz",
                       "--expected", tmp_path / "out.npz", "--atol", "0", "--rtol", "0")
    assert code == 0, err


def test_a_pickle_given_as_an_array_file_is_said_to_be_one(capsys, files):
    """numpy's own message advised loading it with allow_pickle=True: a pickle is refused as such."""
    import pickle

    (files / "p.npz").write_bytes(pickle.dumps({"arg0": A}))
    code, _, err = cli(capsys, "run", files / "m.hlo", "--inputs", files / "p.npz")
    assert code == 2 and "p.npz: a pickle, not an .npz or .npy array file" in err and "allow_pickle" not in err, err


@pytest.mark.parametrize("flag", ["--inputs", "--expected", "--actual"])
def test_bits_saved_as_unsigned_integers_get_a_hint_how_to_pass_them(capsys, files, flag):
    """bf16 bits saved as uint16 (what people save when numpy cannot save bf16), fp8 bits as uint8: refused (integers
    may as well be the values meant) with the way to pass them; the file made as it says then runs and reads right."""
    key = "arg0" if flag == "--inputs" else "out0"
    others = {"arg1": B} if flag == "--inputs" else {}
    bits = (A if flag == "--inputs" else SUM).view(np.uint16)
    np.savez(files / "bits.npz", **{key: bits}, **others)
    np.savez(files / "viewed.npz", **{key: bits.view(ml_dtypes.bfloat16)}, **others)     # the hint followed
    rest = {"--inputs": ["--expected", files / "out.npz"], "--expected": ["--inputs", files / "in.npz"],
            "--actual": ["--inputs", files / "in.npz", "--reference", "shadow"]}[flag]
    code, _, err = cli(capsys, "compare", files / "m.hlo", flag, files / "bits.npz", *rest)
    assert code == 2 and f"array {key} has dtype uint16, expected bf16[4]" in err, err
    assert "if it holds bf16 bits, save arr.view(ml_dtypes.bfloat16) instead" in err, err
    code, _, err = cli(capsys, "compare", files / "m.hlo", flag, files / "viewed.npz", *rest)
    assert code == 0, err


@pytest.mark.parametrize("arrays, says", [
    ({"arg0": A, "arg1": B.view(np.uint8)}, "if it holds f8e4m3fn bits, save arr.view(ml_dtypes.float8_e4m3fn)"),
    ({"arg0": A.view(np.int16), "arg1": B}, None),               # a signed integer: not bits
    ({"arg0": A.astype(np.uint32), "arg1": B}, None)])           # another size: not bits
def test_the_bits_hint_is_for_unsigned_integers_of_the_size(capsys, files, arrays, says):
    np.savez(files / "ints.npz", **arrays)
    code, _, err = cli(capsys, "run", files / "m.hlo", "--inputs", files / "ints.npz")
    assert code == 2 and "has dtype" in err and (says in err if says else "view(" not in err), err
