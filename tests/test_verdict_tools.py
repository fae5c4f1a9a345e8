"""The localizing tools following the verdict (issue 33 item 4): `bisect --reference shadow` names the first pass
after which the program's result is no longer consistent with its exact answer, not merely different."""
from __future__ import annotations

import json
import shutil

import pytest

from hloexec.tools.cli import main
from hloexec.tools.dumpdir import scan

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
