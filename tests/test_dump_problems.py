"""Dump directories with broken stage files: empty, truncated, unparseable and duplicate files are listed by
`hloexec dump` and counted by `hloexec bisect` as skipped with the reason, wherever they are in the pipeline
(a binary search that never visits them still says them), never silently dropped."""
from __future__ import annotations

import json

import pytest

from hloexec.tools.bisect import bisect
from hloexec.tools.cli import main
from hloexec.tools.dumpdir import scan

from test_localize import STAGE

GOOD = STAGE.format(constant="2", root="add(%x, %p)")
STEPS = 26
BROKEN = {3: ("", "empty file"), 11: (GOOD[:GOOD.index("%x =")], "truncated"),
          17: (GOOD.replace("multiply(", "multiply(%q, "), "unparseable"), 20: ("\n  \n", "empty file")}


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def stage_name(k: int, pipeline: str = "pipe") -> str:
    return f"module_0001.m.{k:04d}.{pipeline}.after_pass{k}.before_pass{k + 1}.txt"


@pytest.fixture
def broken_dump(tmp_path):
    """26 pass dumps (a constant changed from step 22 on), four of them broken, one step dumped twice."""
    (tmp_path / "module_0001.m.before_optimizations.txt").write_text(GOOD)
    for k in range(STEPS):
        text = BROKEN[k][0] if k in BROKEN else STAGE.format(constant="3" if k >= 22 else "2", root="add(%x, %p)")
        (tmp_path / stage_name(k)).write_text(text)
    (tmp_path / stage_name(9, "rerun")).write_text(GOOD)          # step 9 twice: two runs in one directory
    return tmp_path


def test_dump_lists_every_broken_and_duplicate_stage_file(broken_dump, capsys):
    code, out, err = cli(capsys, "dump", broken_dump, "--json")
    assert code == 0, err
    [module] = json.loads(out)["modules"]
    problems = {p["file"]: p["error"] for p in module["problems"]}
    expected = {stage_name(k): reason for k, (_, reason) in BROKEN.items()}
    assert {f: e.split(" ")[0] for f, e in problems.items() if f in expected} == \
        {f: r.split(" ")[0] for f, r in expected.items()}
    assert "end of input" in problems[stage_name(11)] and "%q" in problems[stage_name(17)]
    assert problems[stage_name(9, "rerun")].startswith(f"duplicate of {stage_name(9)}")
    assert len(problems) == len(BROKEN) + 1
    code, text, _ = cli(capsys, "dump", broken_dump)
    assert all(f"{f}: {e}" in text for f, e in problems.items())


def test_bisect_counts_every_broken_stage_as_skipped_with_its_reason(broken_dump, capsys):
    code, out, err = cli(capsys, "bisect", broken_dump, "--json", "--no-diff")
    assert code == 1, err
    report = json.loads(out)
    assert report["first_bad_stage"] == stage_name(22) and report["last_good_stage"] == stage_name(21)
    skipped = {s["stage"]: s["error"] for s in report["skipped"]}
    assert set(skipped) == {stage_name(k) for k in BROKEN} | {stage_name(9, "rerun")}
    assert all(skipped[stage_name(k)].startswith(reason) for k, (_, reason) in BROKEN.items())
    code, text, _ = cli(capsys, "bisect", broken_dump, "--no-diff")
    assert f"{len(BROKEN)} skipped, 1 duplicate files left out" in text


def test_bisect_of_a_dump_whose_stages_were_emptied_does_not_say_they_agree(tmp_path, capsys):
    (tmp_path / "module_0001.m.before_optimizations.txt").write_text(GOOD)
    for k in range(STEPS):
        (tmp_path / stage_name(k)).write_text(GOOD if k == STEPS - 1 else "")
    report = bisect(scan(tmp_path)[0], with_diff=False)
    assert sum(1 for r in report.runs.values() if r.error == "empty file") == STEPS - 1
    for k in range(STEPS - 1):
        (tmp_path / stage_name(k + 1 if k == STEPS - 2 else k)).write_text("")
    code, out, err = cli(capsys, "bisect", tmp_path, "--no-diff")
    assert code == 2, out
    assert f"1 run, {STEPS} skipped" in out and "nothing was compared" in out


def test_missing_pass_files_are_said_missing_not_listed_as_steps(tmp_path, capsys):
    """Steps 4-7 of 10 deleted (XLA numbers its pass dumps 0, 1, 2, ...): `dump` says them missing, --stage lists the
    steps that are there (it said "steps 0-9"), and bisect says the change may be in any of the missing steps
    between the last good and the first bad file (it named the pass of step 8 alone)."""
    (tmp_path / "module_0001.m.before_optimizations.txt").write_text(GOOD)
    for k in range(10):
        if not 4 <= k <= 7:
            (tmp_path / stage_name(k)).write_text(STAGE.format(constant="3" if k >= 6 else "2", root="add(%x, %p)"))
    code, out, err = cli(capsys, "dump", tmp_path, "--json")
    [module] = json.loads(out)["modules"]
    assert code == 0 and [m.split(" (")[0] for m in module["missing"]] == ["steps 4-7", "after optimizations"], out
    code, out, _ = cli(capsys, "dump", tmp_path)
    assert "missing: steps 4-7 (no file" in out and "missing: after optimizations" in out, out
    code, out, err = cli(capsys, "run", tmp_path, "--stage", "5")
    assert code == 2 and "no stage '5' (its file is not in the directory)" in err, err
    assert "steps 0-3, 8-9 or a pass" in err and "0-9" not in err and "missing: steps 4-7" in err, err
    code, out, err = cli(capsys, "bisect", tmp_path, "--json", "--no-diff")
    report = json.loads(out)
    assert code == 1 and report["first_bad_stage"] == stage_name(8) and report["last_good_stage"] == stage_name(3)
    assert report["unseen_steps"] == [4, 5, 6, 7] and report["missing"][0].startswith("steps 4-7"), out
    code, out, err = cli(capsys, "bisect", tmp_path, "--no-diff")
    assert "4 steps between them have no file (4, 5, 6, 7): the change may come from any of them" in out, out
    (tmp_path / stage_name(5)).write_text(GOOD)             # a gap after the change only: not between them
    (tmp_path / stage_name(6)).write_text(STAGE.format(constant="3", root="add(%x, %p)"))
    (tmp_path / stage_name(7)).write_text(STAGE.format(constant="3", root="add(%x, %p)"))
    code, out, err = cli(capsys, "bisect", tmp_path, "--json", "--no-diff")
    report = json.loads(out)
    assert report["first_bad_stage"] == stage_name(6) and report["unseen_steps"] == [], out
    assert report["missing"][0].startswith("step 4 (no file"), out
