"""Exit codes as README documents them (0 success; 1 a finding; 2 parse error, usage error, unsupported op,
execution error), for every command and every kind of bad input: the bad input is said in one `error:` line on
stderr naming what is wrong, never as an internal error or a traceback."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from hloexec.tools.cli import main

GOOD = "HloModule good\n\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT r = f32[4] negate(p)\n}\n"
BAD_FILES = {
    "missing": None,
    "empty": "",
    "binary": b"\x00\xff\xfe PK\x03\x04 \x89PNG\r\n",
    "parse error": "HloModule m\n\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT r = f32[2] add(p, q)\n}\n",
    "truncated": GOOD[:GOOD.index("ROOT") + 12],
    "unsupported op": "HloModule m\n\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT r = f32[2] frobnicate(p)\n}\n",
    "wrong operand count": "HloModule m\n\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT r = f32[2] add(p)\n}\n",
    "too big": "HloModule big\n\nENTRY e {\n  p = f32[1000000000000] parameter(0)\n"
               "  ROOT r = f32[1000000000000] negate(p)\n}\n",
}
# what each kind must say (besides the file's name), by kind
SAYS = {"missing": "No such file", "empty": "no HLO module", "binary": ":1:", "parse error": ":5:",
        "truncated": ":5:", "unsupported op": "frobnicate", "wrong operand count": "%r",
        "too big": "big needs"}
# commands that prepare or run the module; the others only read it
RUNS = {"run", "compare", "numerics", "diff", "extract", "minimize"}
COMMANDS = {
    "stats": ["stats", "{f}"],
    "run": ["run", "{f}"],
    "compare": ["compare", "{f}", "{f}"],
    "numerics": ["numerics", "{f}"],
    "memory": ["memory", "{f}"],
    "collectives": ["collectives", "{f}"],
    "export": ["export", "{f}", "--astra-sim", "{d}/astra.txt"],
    "graph": ["graph", "{f}", "-o", "{d}/g.dot"],
    "diff": ["diff", "{f}", "{f}"],
    "extract": ["extract", "{f}", "r", "-o", "{d}/x.hlo", "--inputs-out", "{d}/x.npz"],
    "minimize": ["minimize", "{f}", "--check", "nan", "-o", "{d}/m.hlo"],
}


def expected_code(command: str, kind: str) -> int:
    """2 for what a command cannot do with the file; a report reads an unsupported or huge module fine."""
    if kind in ("unsupported op", "too big") and command not in RUNS:
        return 0 if command != "memory" or kind != "unsupported op" else 2
    if kind == "wrong operand count" and command == "stats":
        return 0                                    # stats counts what it reads; nothing is prepared
    return 2


def cli(capsys, argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("kind", list(BAD_FILES))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_on_every_kind_of_bad_file(capsys, tmp_path, command, kind):
    path = tmp_path / "m.hlo"
    content = BAD_FILES[kind]
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    argv = [a.format(f=path, d=tmp_path) for a in COMMANDS[command]]
    code, out, err = cli(capsys, argv)
    want = expected_code(command, kind)
    if want == 0 and code == 0:
        return
    if kind == "wrong operand count" and command in ("memory", "collectives", "export", "graph") and code == 0:
        return              # reports that read the graph without preparing its ops
    assert code == want == 2, (code, out, err)
    assert err.startswith("error: ") and "internal error" not in err and "Traceback" not in err, err
    assert SAYS[kind] in err, err
    assert "hloexec.load" not in err, err  # the command line's --max-memory, not the library's max_memory=
    # the file (diff: and its role, A or B), else (memory: by the module's name) what in it
    assert path.name in err or kind == "too big", err
    assert command != "diff" or kind == "missing" or f"A ({path}): " in err or f"A: {path}:" in err, err


def test_usage_errors_exit_2_for_every_command(capsys):
    for command in [*COMMANDS, "dump", "bisect", "ops"]:
        code, _, err = cli(capsys, [command, "--no-such-flag"])
        assert code == 2 and "error:" in err, (command, err)


@pytest.mark.parametrize("command", ["dump", "bisect"])
@pytest.mark.parametrize("kind", ["missing", "a file", "empty directory"])
def test_dump_directory_commands_on_what_is_not_a_dump(capsys, tmp_path, command, kind):
    target = tmp_path / "d"
    if kind == "a file":
        target.write_text(GOOD)
    elif kind == "empty directory":
        target.mkdir()
    code, out, err = cli(capsys, [command, target])
    if command == "dump" and kind == "empty directory":
        assert code == 0 and "0 programs" in out                  # an empty listing is an answer
        return
    assert code == 2 and err.startswith("error: ") and str(target) in err, (code, err)


FINDINGS = {       # command line -> what makes it a finding (exit 1)
    "compare --expected": ["compare", "{f}", "--inputs", "{d}/in.npz", "--expected", "{d}/wrong.npz"],
    "run --fail-on-nan": ["run", "{nan}", "--inputs", "{d}/in.npz", "--fail-on-nan"],
    "run --find-nonfinite": ["run", "{nan}", "--inputs", "{d}/in.npz", "--find-nonfinite"],
    "numerics": ["numerics", "{nan}", "--inputs", "{d}/in.npz"],
    "diff": ["diff", "{f}", "{other}", "--inputs", "{d}/in.npz"],
}


@pytest.mark.parametrize("name", list(FINDINGS))
def test_findings_exit_1(capsys, tmp_path, name):
    (tmp_path / "m.hlo").write_text(GOOD)
    (tmp_path / "nan.hlo").write_text(GOOD.replace("negate(p)", "log(p)"))
    (tmp_path / "other.hlo").write_text(GOOD.replace("negate(p)", "abs(p)"))
    np.savez(tmp_path / "in.npz", arg0=np.array([-1, 2, -3, 4], np.float32))
    np.savez(tmp_path / "wrong.npz", out0=np.array([1, 2, 3, 4], np.float32))
    argv = [a.format(f=tmp_path / "m.hlo", nan=tmp_path / "nan.hlo", other=tmp_path / "other.hlo", d=tmp_path)
            for a in FINDINGS[name]]
    code, out, err = cli(capsys, argv)
    assert code == 1, (out, err)
    np.savez(tmp_path / "right.npz", out0=np.array([1, -2, 3, -4], np.float32))
    fine = [a.replace("nan.hlo", "m.hlo").replace("wrong.npz", "right.npz").replace("other.hlo", "m.hlo")
            for a in argv]
    code, out, err = cli(capsys, fine)        # the same command without the finding
    assert code == 0, (name, out, err)


SHARDED_TOO_BIG = """HloModule big_spmd, num_partitions=2

ENTRY e {
  p = f32[500000000000] parameter(0), sharding={devices=[2]0,1}
  ROOT r = f32[500000000000] negate(p), sharding={devices=[2]0,1}
}
"""


@pytest.mark.parametrize("argv", [
    ["run", "--spmd"], ["run", "--spmd", "--shadow"], ["numerics", "--spmd"], ["compare", "{f}", "--spmd"],
    pytest.param(["run", "--ray", "local"], marks=pytest.mark.slow)], ids=" ".join)
def test_spmd_and_ray_runs_refuse_what_cannot_fit_before_allocating(capsys, tmp_path, argv):
    pytest.importorskip("ray") if "--ray" in argv else None
    path = tmp_path / "big.hlo"
    path.write_text(SHARDED_TOO_BIG)
    code, out, err = cli(capsys, [argv[0], path, *[a.format(f=path) for a in argv[1:]]])
    assert code == 2 and "\nerror: " in "\n" + err and "internal error" not in err, (out, err)   # (Ray logs first)
    assert "needs" in err and ("GiB" in err or "GB" in err), err


ODD_FLAGS = {      # found by a hostile-input audit: each was an internal error or another exit code
    "--seed -1": (["run", "{f}", "--seed", "-1"], "seed >= 0"),
    "--max-memory 1e400": (["run", "{f}", "--max-memory", "1e400"], "too large"),
    "--partitions 0": (["run", "{f}", "--partitions", "0"], "count >= 1"),
    "--replicas 0": (["compare", "{f}", "--reference", "shadow", "--replicas", "0"], "count >= 1"),
    "--plot .xyz": (["memory", "{f}", "--plot", "{d}/timeline.xyz"], "ending in .png"),
    "a plugin calling sys.exit": (["run", "{f}", "--plugin", "{d}/exits.py"], "SystemExit"),
    # the command-line audit of 2026-11-30: each was taken and gave a wrong answer (a NaN tolerance passed any
    # value, --bandwidth 0 was said as overridden and used the preset, 0 or -2 devices, --limit -1 dropped the
    # last divergence...), or ran into a path it could not write only once its work was done
    "compare --atol nan": (["compare", "{f}", "--expected", "{d}/x.npz", "--atol", "nan"], "number >= 0"),
    "compare --rtol -1": (["compare", "{f}", "--expected", "{d}/x.npz", "--rtol", "-1"], "number >= 0"),
    "diff --rtol nan": (["diff", "{f}", "{f}", "--rtol", "nan"], "number >= 0"),
    "bisect --atol -1": (["bisect", "{d}", "--atol", "-1"], "number >= 0"),
    "collectives --bandwidth 0": (["collectives", "{f}", "--bandwidth", "0"], "finite number > 0"),
    "collectives --latency -1": (["collectives", "{f}", "--latency", "-1"], "number >= 0"),
    "collectives --partitions 0": (["collectives", "{f}", "--partitions", "0"], "count >= 1"),
    "memory --partitions -2": (["memory", "{f}", "--partitions", "-2"], "count >= 1"),
    "export --replicas 0": (["export", "{f}", "--replicas", "0", "--astra-sim", "{d}/a.txt"], "count >= 1"),
    "memory --top 0": (["memory", "{f}", "--top", "0"], "count >= 1"),
    "report --top -1": (["report", "{f}", "--top", "-1", "-o", "{d}/r.html"], "count >= 1"),
    "graph --max-nodes 0": (["graph", "{f}", "--max-nodes", "0", "-o", "{d}/g.dot"], "count >= 1"),
    "graph --depth -1": (["graph", "{f}", "--depth", "-1", "-o", "{d}/g.dot"], "count >= 0"),
    "extract --depth -1": (["extract", "{f}", "r", "--depth", "-1"], "count >= 0"),
    "diff --limit -1": (["diff", "{f}", "{f}", "--limit", "-1"], "count >= 0"),
    "run --profile 0": (["run", "{f}", "--profile", "0"], "count >= 1"),
    "minimize --timeout 0": (["minimize", "{f}", "--check", "true", "--timeout", "0", "-o", "{d}/m.hlo"], "> 0"),
    "run --out in no directory": (["run", "{f}", "--out", "{d}/nowhere/o.npz"], "no directory"),
    "report -o a directory": (["report", "{f}", "-o", "{d}"], "is a directory"),
    "minimize -o in no directory": (["minimize", "{f}", "--check", "true", "-o", "{d}/nowhere/m.hlo"], "no directory"),
    "extract --inputs-out a directory": (["extract", "{f}", "r", "--inputs-out", "{d}"], "is a directory"),
    "graph -o in no directory": (["graph", "{f}", "-o", "{d}/nowhere/g.html"], "no directory"),
    "export --astra-sim a directory": (["export", "{f}", "--astra-sim", "{d}"], "is a directory"),
    "memory --plot in no directory": (["memory", "{f}", "--plot", "{d}/nowhere/t.png"], "no directory"),
}


@pytest.mark.parametrize("name", list(ODD_FLAGS))
def test_odd_flag_values_exit_2_with_a_message(capsys, tmp_path, name):
    (tmp_path / "m.hlo").write_text(GOOD)
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    argv, says = ODD_FLAGS[name]
    np.savez(tmp_path / "x.npz", out0=np.zeros(4, np.float32))
    code, out, err = cli(capsys, [a.format(f=tmp_path / "m.hlo", d=tmp_path) for a in argv])
    assert code == 2 and "error:" in err and "internal error" not in err and "Traceback" not in err, (code, err)
    assert says in err, err
    assert not (tmp_path / "nowhere").exists() and {p.name for p in tmp_path.iterdir()} <= {"m.hlo", "exits.py", "x.npz"}


HUGE_AND_INVALID = """HloModule huge_invalid

ENTRY e {
  p = f32[2147483648] parameter(0)
  ROOT r = f32[2147483648] frobnicate(p)
}
"""
PEAK_TOO_BIG = """HloModule peak_big

ENTRY e {
  p = f32[4] parameter(0)
  ROOT r = f32[4,1000000000] broadcast(p), dimensions={0}
}
"""


@pytest.mark.parametrize("command", ["diff", "minimize"])
@pytest.mark.parametrize("module, options, says", [
    (HUGE_AND_INVALID, [], "frobnicate"), (PEAK_TOO_BIG, ["--max-memory", "1G"], "peak_big needs")],
    ids=["invalid instruction", "peak past --max-memory"])
def test_diff_and_minimize_prepare_before_drawing_inputs(capsys, tmp_path, monkeypatch, command, module, options,
                                                         says):
    """An 8.6 GB parameter took minutes to draw before the module was refused: the modules are prepared and
    their peaks checked first, and a refused module draws nothing."""
    import hloexec.tools.common as common

    drawn = []
    monkeypatch.setattr(common, "random_inputs", lambda module, *a, **k: drawn.append(module.name) or 1 / 0)
    path = tmp_path / "m.hlo"
    path.write_text(module)
    argv = COMMANDS[command] + options
    code, out, err = cli(capsys, [a.format(f=path, d=tmp_path) for a in argv])
    assert code == 2 and err.startswith("error: ") and says in err and "hloexec.load" not in err, (out, err)
    assert drawn == []


def test_with_json_an_error_is_a_json_document_too(capsys, tmp_path):
    """`--json` promises one JSON document on stdout: an error (exit 2) is one as well, its message as stderr says
    it, so a script piping stdout into a JSON reader reads why."""
    path = tmp_path / "m.hlo"
    path.write_text(GOOD)
    np.savez(tmp_path / "f64.npz", arg0=np.zeros(4, np.float64))
    for argv, says in ((["run", tmp_path / "missing.hlo", "--json"], "No such file"),
                       (["numerics", path, "--inputs", tmp_path / "f64.npz", "--json"], "float64"),
                       (["extract", path, "p", "--json"], "parameter")):
        code, out, err = cli(capsys, argv)
        document = json.loads(out)
        assert code == 2 and document["command"] == argv[0] and says in document["error"], (out, err)
        assert f"error: {document['error']}" in err


def test_outputs_are_written_under_the_name_given(capsys, tmp_path):
    """np.savez adds .npz to a name without it: `--out o.bin` wrote o.bin.npz and said `written to o.bin`."""
    path = tmp_path / "m.hlo"
    path.write_text(GOOD)
    np.savez(tmp_path / "in.npz", arg0=np.array([1, -2, 3, -4], np.float32))
    code, out, err = cli(capsys, ["run", path, "--inputs", tmp_path / "in.npz", "--out", tmp_path / "o.bin"])
    assert code == 0 and f"written to {tmp_path / 'o.bin'}" in out, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz", "m.hlo", "o.bin"]
    with np.load(tmp_path / "o.bin") as z:
        np.testing.assert_array_equal(z["out0"], [-1, 2, -3, 4])


def test_extract_depth_past_the_parameters_ends_at_once():
    """`extract --depth 1000000000` walked a billion empty levels (minutes on a two-instruction module)."""
    import threading

    import hloexec
    from hloexec.tools.extract import cone_cut

    root = hloexec.parse(GOOD)[0].entry.root
    result = []
    walk = threading.Thread(target=lambda: result.append(cone_cut(root, 10**12)), daemon=True)
    walk.start()
    walk.join(timeout=10)
    assert result == [set()], "cone_cut still walking"


def test_help_says_every_finding_exit_1():
    """diff, bisect and report exit 1 on a finding; the exit codes under --help said compare's, run's, numerics'."""
    from hloexec.tools.common import EXIT_CODES

    finding = EXIT_CODES.split("\n  2 ")[0]
    assert all(f"{command}:" in finding for command in ("compare", "report", "diff", "bisect")), finding


def test_stats_module_describes_that_module_and_refuses_a_name_not_there(capsys, tmp_path):
    """`stats --module NAME` took the option and described every module; a name not in the file exited 0."""
    path = tmp_path / "two.hlo"
    path.write_text(GOOD + "\n" + GOOD.replace("HloModule good", "HloModule other"))
    code, out, err = cli(capsys, ["stats", path, "--module", "other", "--json"])
    assert code == 0 and [m["name"] for m in json.loads(out)["files"][0]["modules"]] == ["other"], err
    code, out, err = cli(capsys, ["stats", path, "--module", "nosuch"])
    assert code == 2 and "no module named 'nosuch'" in err and "good (line 1)" in err, (out, err)


def test_a_missing_dump_directory_is_said_missing(capsys, tmp_path):
    code, _, err = cli(capsys, ["dump", tmp_path / "nowhere"])
    assert code == 2 and "nowhere: No such file or directory" in err, err


@pytest.mark.parametrize("check, says", [("exit 3", "the command exited 3"),
                                         ("no_such_command_here", "exited 127: command not found")])
def test_minimize_says_how_a_command_check_failed_on_the_module_itself(capsys, tmp_path, check, says):
    """A command check's output goes nowhere: "the check does not hold" alone hid a typo in the command."""
    path = tmp_path / "m.hlo"
    path.write_text(GOOD)
    code, out, err = cli(capsys, ["minimize", path, "--check", check, "--retries", "0", "-o", tmp_path / "s.hlo"])
    assert code == 2 and "does not hold on good itself" in err and says in err, (out, err)


def test_memory_says_elided_constants_as_the_other_commands_do(capsys, tmp_path):
    """`memory` of a dump with `constant({...})` let Python print the warning with hloexec's source file and line
    (`.../commands/memory.py:66: ElidedConstantWarning: ...`); run, compare and report say `warning: ...`."""
    path = tmp_path / "m.hlo"
    path.write_text(GOOD.replace("ROOT r = f32[4] negate(p)", "c = f32[4] constant({...})\n  ROOT r = f32[4] add(p, c)"))
    code, out, err = cli(capsys, ["memory", path])
    assert code == 0 and err.startswith("warning: module good: 1 constant (%c) written as {...}"), err
    assert "ElidedConstantWarning" not in err and ".py:" not in err, err


USAGE_ERRORS = {   # argparse refuses each before the command starts
    "unknown option": (["run", "{f}", "--no-such-flag"], "run", "unrecognized arguments: --no-such-flag"),
    "bad choice": (["compare", "{f}", "--reductions", "junk"], "compare", "invalid choice: 'junk'"),
    "missing argument": (["numerics"], "numerics", "required: FILE"),
    "bad option value": (["diff", "{f}", "{f}", "--rtol", "nan"], "diff", "number >= 0"),
    "abbreviated --json": (["memory", "{f}", "--top", "0"], "memory", "count >= 1"),
    "unknown command": (["frobnicate", "{f}"], None, "invalid choice: 'frobnicate'"),
}


@pytest.mark.parametrize("name", list(USAGE_ERRORS))
def test_with_json_a_usage_error_is_a_json_document_too(capsys, tmp_path, name):
    """argparse exits before the command starts: `--json` printed nothing on stdout for a usage error."""
    (tmp_path / "m.hlo").write_text(GOOD)
    argv, command, says = USAGE_ERRORS[name]
    argv = [a.format(f=tmp_path / "m.hlo") for a in argv]
    code, out, plain_err = cli(capsys, argv)
    assert code == 2 and out == "" and says in plain_err, (out, plain_err)      # without --json: stderr only
    code, out, err = cli(capsys, [*argv, "--js" if name == "abbreviated --json" else "--json"])
    document = json.loads(out)
    assert code == 2 and document == {"command": command, "version": 1, "error": document["error"]}, out
    assert says in document["error"] and f"error: {document['error']}" in err, (document, err)
    assert err.replace(" --json", "").replace(" --js", "") == plain_err or "usage:" in err, err   # stderr as before


@pytest.mark.parametrize("value", [",", "", " ", "a100,", ",tpu", "a100,,tpu"])
@pytest.mark.parametrize("argv", [
    ["run", "{f}"], ["compare", "{f}", "--reference", "shadow"], ["numerics", "{f}"], ["diff", "{f}", "{f}"],
    ["minimize", "{f}", "--check", "nan", "-o", "{d}/s.hlo"], ["report", "{f}", "-o", "{d}/r.html"]],
    ids=lambda argv: argv[0] + (" shadow" if "shadow" in argv else ""))
def test_an_empty_device_name_is_a_usage_error(capsys, tmp_path, argv, value):
    """`compare --reference shadow --device ,` judged by the reference profile, and `a100,` by a100 alone: an empty
    name in --device's list is refused before anything runs, naming the option and what it takes."""
    (tmp_path / "m.hlo").write_text(GOOD)
    code, out, err = cli(capsys, [a.format(f=tmp_path / "m.hlo", d=tmp_path) for a in argv] + ["--device", value])
    assert code == 2 and "argument --device: expected a device profile name or file" in err, (code, out, err)
    assert f"got {value!r}" in err and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("argv", [
    ["run", "m.hlo", "--partitions", "100000000"], ["compare", "m.hlo", "--reference", "shadow", "--replicas", "65537"],
    ["numerics", "m.hlo", "--partitions", "100000000"], ["collectives", "m.hlo", "--partitions", "100000000"],
    ["memory", "m.hlo", "--replicas", "100000000"], ["export", "m.hlo", "--partitions", "100000000"],
    ["report", "m.hlo", "-o", "r.html", "--partitions", "100000000"]], ids=lambda argv: argv[0])
def test_a_device_count_past_the_most_participants_is_a_usage_error(capsys, argv):
    """`--partitions 100000000` ran for hours (1e8 input lists split, then participants) saying nothing: the
    flag is refused as it is parsed (nothing is read or run), naming the option and the limit: the most
    participants for a command that runs them, the most devices described for a report that runs nothing."""
    from hloexec.options import MOST_DESCRIBED, MOST_PARTICIPANTS
    from hloexec.tools.cli import build_parser

    most = MOST_DESCRIBED if argv[0] in ("collectives", "memory", "export") else MOST_PARTICIPANTS
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"expected a count from 1 to {most}" in err, err
    assert build_parser().parse_args([*argv[:-1], str(most)]) is not None   # the limit itself is taken


@pytest.mark.parametrize("header, given, says", [
    ("num_partitions=100000000", (None, None), "100000000 partitions (the header's) x 1 replicas (default)"),
    ("num_partitions=2", (None, 40000), "2 partitions (the header's) x 40000 replicas (given)"),
    ("", (1000, 1000), "1000 partitions (given) x 1000 replicas (given) = 1000000 participants")])
def test_device_counts_past_the_most_participants_are_refused(header, given, says):
    """A header or a product of counts past the limit (each count alone may be within it): refused before any
    participant is made, saying where each count comes from."""
    import hloexec
    from hloexec import spmd
    from hloexec.errors import ExecutionError

    module = hloexec.parse(GOOD.replace("HloModule good", f"HloModule good{', ' + header if header else ''}"))[0]
    with pytest.raises(ExecutionError, match=re.escape(says) + r".*more than the 65536 hloexec runs"):
        spmd.device_counts(module, *given)
    assert spmd.device_counts(module, 2, 4)[:2] == (2, 4)


def test_spmd_outputs_are_grouped_without_comparing_every_pair():
    """`run --partitions 4000` of a module whose participants' outputs all differ spent minutes comparing each
    device's output with every group's (4000^2 / 2 comparisons) after a one-second run; equal values (-0.0 and
    0.0, NaNs) still share a group."""
    import threading

    import ml_dtypes

    from hloexec.tools.commands.run_spmd import output_groups

    equal = [np.array([0.0, np.nan]), np.array([-0.0, np.nan]), np.array([-0.0, 0], ml_dtypes.bfloat16),
             np.array([0, 0], ml_dtypes.bfloat16), np.array([complex(np.nan, 1)]), np.array([complex(np.nan, 2)]),
             np.array([1, 2], np.int32), np.array([[1, 2]], np.int32)]
    assert [g["devices"] for g in output_groups(0, equal)] == [[0, 1], [2, 3], [4, 5], [6], [7]]
    distinct = [np.array([d], np.float32) for d in range(6000)]
    result = []
    grouping = threading.Thread(target=lambda: result.append(output_groups(0, distinct)), daemon=True)
    grouping.start()
    grouping.join(timeout=20)
    assert result and len(result[0]) == 6000, "still comparing"


XEXP = "HloModule xexp\n\nENTRY e {\n  p = f32[64] parameter(0)\n  x = f32[64] exponential(p)\n  ROOT r = f32[64] multiply(x, p)\n}\n"


@pytest.mark.parametrize("judged", [["--expected"], ["--reference", "shadow", "--actual"]], ids=" ".join)
def test_outputs_from_other_inputs_get_a_hint_the_verdict_unchanged(capsys, tmp_path, judged):
    """Outputs computed from other inputs were judged (FAIL, NOT CONSISTENT) with no word of why nearly every
    element was off: a hint line (and "hint" in the JSON) asks whether they were computed from these inputs."""
    path = tmp_path / "m.hlo"
    path.write_text(XEXP)
    x, other = (np.random.default_rng(seed).normal(size=64).astype(np.float32) for seed in (0, 1))
    np.savez(tmp_path / "in.npz", arg0=x)
    for name, values in (("right.npz", x), ("other.npz", other)):      # numpy's x * exp(x): within f32's roundings
        np.savez(tmp_path / name, out0=(values * np.exp(values)).astype(np.float32))
    one_off = (x * np.exp(x)).astype(np.float32)
    one_off[7] *= 1.5
    np.savez(tmp_path / "one_off.npz", out0=one_off)
    argv = ["compare", path, "--inputs", tmp_path / "in.npz", *judged]
    code, out, err = cli(capsys, [*argv, tmp_path / "other.npz"])
    assert code == 1 and "hint: other.npz: " in out and "were these outputs computed from these inputs" in out, out
    assert int(out.split("hint: other.npz: ")[1].split(" of 64")[0]) >= 58, out
    code, out, err = cli(capsys, [*argv, tmp_path / "other.npz", "--json"])
    assert code == 1 and json.loads(out)["hint"].startswith("other.npz: "), out
    for name, want in (("right.npz", 0), ("one_off.npz", 1)):          # a result, or one element wrong: no hint
        code, out, err = cli(capsys, [*argv, tmp_path / name, "--json"])
        assert code == want and json.loads(out)["hint"] is None, (name, out, err)


CANCELS = ("HloModule cancels\n\nENTRY e {\n  p = bf16[64] parameter(0)\n  c = bf16[] constant(1000)\n"
           "  b = bf16[64] broadcast(c), dimensions={}\n  s = bf16[64] add(p, b)\n  ROOT r = bf16[64] subtract(s, b)\n}\n")
TINY = "HloModule tiny\n\nENTRY e {\n  p = f32[64] parameter(0)\n  ROOT r = f32[64] negate(p)\n}\n"


def test_a_correct_result_gets_no_hint(capsys, tmp_path):
    """The hint asked "were these outputs computed from these inputs?" beside CONSISTENT and PASS: a bf16
    (x + 1000) - 1000 is all rounding (every element off from the exact x by more than 10%, as bf16 allows), and
    values of 1e-7 pass XLA's atol whatever they are."""
    import ml_dtypes

    bf16 = ml_dtypes.bfloat16
    x = np.random.default_rng(0).uniform(0.1, 1, 64).astype(bf16)
    rounded = (x.astype(np.float32) + np.float32(1000)).astype(bf16)          # bf16's rounding after each op
    np.savez(tmp_path / "in.npz", arg0=x)
    np.savez(tmp_path / "out.npz", out0=(rounded.astype(np.float32) - np.float32(1000)).astype(bf16))
    (tmp_path / "c.hlo").write_text(CANCELS)
    argv = ["compare", tmp_path / "c.hlo", "--inputs", tmp_path / "in.npz", "--reference", "shadow", "--actual"]
    code, out, err = cli(capsys, [*argv, tmp_path / "out.npz", "--json"])
    assert code == 0 and json.loads(out)["hint"] is None, (out, err)
    tiny = np.random.default_rng(1).uniform(1e-7, 1e-6, 64).astype(np.float32)
    np.savez(tmp_path / "tiny.npz", arg0=tiny)
    np.savez(tmp_path / "zeros.npz", out0=np.zeros(64, np.float32))             # within atol 1e-5 of -tiny
    (tmp_path / "t.hlo").write_text(TINY)
    code, out, err = cli(capsys, ["compare", tmp_path / "t.hlo", "--inputs", tmp_path / "tiny.npz", "--expected",
                                  tmp_path / "zeros.npz"])
    assert code == 0 and "PASS" in out and "hint" not in out, out


def test_an_array_key_with_leading_zeros_is_no_second_arg0(capsys, tmp_path):
    """`arg00` beside `arg0` was read as argument 0 as well (the last one read won, silently)."""
    (tmp_path / "m.hlo").write_text(GOOD)
    np.savez(tmp_path / "in.npz", arg0=np.ones(4, np.float32), arg00=np.zeros(4, np.float32))
    code, out, err = cli(capsys, ["run", tmp_path / "m.hlo", "--inputs", tmp_path / "in.npz"])
    assert code == 2 and "unexpected array 'arg00' (expected arg0..argN" in err, (out, err)


def test_stage_of_a_file_that_is_no_dump_directory_is_refused(capsys, tmp_path):
    """`run m.hlo --stage 3` ran m.hlo, the stage silently ignored."""
    (tmp_path / "m.hlo").write_text(GOOD)
    for argv in (["run", tmp_path / "m.hlo", "--stage", "3"], ["diff", tmp_path / "m.hlo", tmp_path / "m.hlo",
                                                               "--stage-b", "before"]):
        code, out, err = cli(capsys, argv)
        assert code == 2 and f"--stage picks a stage of a dump directory (--xla_dump_to=DIR); {tmp_path / 'm.hlo'} " \
            "is a file" in err, (out, err)


def test_a_pipe_as_the_module_and_as_the_inputs(capsys, tmp_path):
    """`hloexec run <(zcat m.hlo.gz) --inputs <(...)`: the parser maps regular files only, so a pipe was "empty
    input: no HLO module", and numpy re-reads an npz a pipe gives once."""
    import io
    import os
    import threading

    buffer = io.BytesIO()
    np.savez(buffer, arg0=np.array([1, -2, 3, -4], np.float32))
    pipes = {tmp_path / "m.pipe": GOOD.encode(), tmp_path / "in.pipe": buffer.getvalue()}
    for pipe, data in pipes.items():
        os.mkfifo(pipe)
        threading.Thread(target=lambda p=pipe, d=data: p.write_bytes(d), daemon=True).start()
    code, out, err = cli(capsys, ["run", tmp_path / "m.pipe", "--inputs", tmp_path / "in.pipe", "--json"])
    assert code == 0 and json.loads(out)["outputs"][0]["min"] == -3, (out, err)
    assert f"{tmp_path / 'm.pipe'}: a pipe, read into " in err, err


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("argv", [["stats", "{f}"], ["stats", "{f}", "--json"], ["run", "{f}", "--seed", "0", "--json"]],
                         ids=" ".join)
def test_stdout_on_a_full_disk_is_named(capsys, monkeypatch, tmp_path, argv):
    """`hloexec stats m.hlo > out.txt` on a full disk: Python's flush at exit failed (exit 0, or 120) or the error
    named no file; with --json the error's own JSON document failed to write: a traceback."""
    import sys

    (tmp_path / "m.hlo").write_text(GOOD)
    full = open("/dev/full", "w")
    monkeypatch.setattr(sys, "stdout", full)
    code, out, err = cli(capsys, [a.format(f=tmp_path / "m.hlo") for a in argv])
    try:
        full.close()
    except OSError:                                  # what it could not write is still buffered
        pass
    assert code == 2 and "error: stdout: No space left on device" in err and "Traceback" not in err, (code, err)


@pytest.mark.skipif(not __import__("os").path.exists("/dev/zero"), reason="no /dev/zero")
def test_a_device_as_the_module_or_the_inputs_is_said_to_be_no_file(capsys, tmp_path):
    """/dev/zero as FILE was "empty input: no HLO module" (a character device maps as 0 bytes), as --inputs "a
    pickle" (numpy read zeros): each is said to be no regular file, named."""
    import hloexec

    (tmp_path / "m.hlo").write_text(GOOD)
    says = "/dev/zero: not a regular file (a character device)"
    for argv in (["stats", "/dev/zero"], ["run", "/dev/zero"], ["run", tmp_path / "m.hlo", "--inputs", "/dev/zero"],
                 ["compare", tmp_path / "m.hlo", "--seed", "0", "--expected", "/dev/zero"]):
        code, out, err = cli(capsys, argv)
        assert code == 2 and f"error: {says}" in err and "empty input" not in err and "pickle" not in err, (argv, err)
    code, out, err = cli(capsys, ["run", "/dev/zero", "--json"])
    assert code == 2 and json.loads(out)["error"].startswith(says), out
    for path in ("/dev/zero", __import__("pathlib").Path("/dev/zero")):   # the library names it too
        with pytest.raises(OSError, match="not a regular file"):
            hloexec.load(path)


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("argv", [["run", "{f}", "--out", "/dev/full"], ["extract", "{f}", "r", "-o", "/dev/full"],
                                  ["extract", "{f}", "r", "--inputs-out", "/dev/full"]], ids=" ".join)
def test_a_write_that_fails_names_its_file(capsys, tmp_path, argv):
    """A full disk's ENOSPC names no file: `error: [Errno 28] No space left on device` did not say which output."""
    (tmp_path / "m.hlo").write_text(GOOD)
    code, out, err = cli(capsys, [a.format(f=tmp_path / "m.hlo") for a in argv])
    assert code == 2 and "error: /dev/full: No space left on device" in err, (out, err)


def test_actual_files_of_one_name_are_each_judged(capsys, tmp_path):
    """`--actual run1/out.npz --actual run2/out.npz`: candidates were keyed by file name, so the second replaced the
    first and one verdict was said for both; now named by path where names collide, the same file twice refused."""
    path = tmp_path / "m.hlo"
    path.write_text(XEXP)
    x = np.random.default_rng(0).normal(size=64).astype(np.float32)
    np.savez(tmp_path / "in.npz", arg0=x)
    for run, values in (("run1", x), ("run2", -x)):
        (tmp_path / run).mkdir()
        np.savez(tmp_path / run / "out.npz", out0=(values * np.exp(values)).astype(np.float32))
    argv = ["compare", path, "--inputs", tmp_path / "in.npz", "--reference", "shadow", "--json"]
    code, out, err = cli(capsys, [*argv, "--actual", tmp_path / "run1/out.npz", "--actual", tmp_path / "run2/out.npz"])
    assert code == 1 and json.loads(out)["candidates"] == {"hloexec": True, str(tmp_path / "run1/out.npz"): True,
                                                           str(tmp_path / "run2/out.npz"): False}, out
    code, out, err = cli(capsys, [*argv, "--actual", tmp_path / "run1/out.npz", "--actual", tmp_path / "run1/out.npz"])
    assert code == 2 and f"--actual {tmp_path / 'run1/out.npz'} given twice" in err, (out, err)
