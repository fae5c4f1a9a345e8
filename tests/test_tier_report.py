"""Explicit fallbacks: a fusion or loop runs op by op only for a named reason, counted per module and shown by
`hloexec run --profile`; a generator bug is a CompileWarning (an error in this suite: pyproject's filterwarnings),
never a silent op-by-op run."""
from __future__ import annotations

import json

import numpy as np
import pytest

import hloexec
from conftest import EXAMPLES
from hloexec.errors import CompileWarning
from hloexec.exec import tiering
from hloexec.kernels import fusion
from hloexec.tools.cli import main
from xla_compare import flatten

GATHER_SCATTER = EXAMPLES / "gather_scatter.opt.hlo"


def test_declines_are_counted_by_reason(monkeypatch):
    monkeypatch.setattr(tiering, "MIN_COMPILED_BYTES", 0)      # offer every fusion to the generator
    report = hloexec.load(GATHER_SCATTER).context.tier_report.to_dict()
    assert report["fusion"] == {"compiled": 3, "op_by_op": 1, "reasons": {
        "opcode scatter": ["wrapped_scatter_computation"]}}


def test_small_fusions_are_counted_as_such():
    report = hloexec.load(GATHER_SCATTER).context.tier_report.to_dict()
    (reason,) = report["fusion"]["reasons"]
    assert report["fusion"]["compiled"] == 0 and reason.startswith("touches < 64 KiB")


def test_run_profile_shows_the_tiers(monkeypatch, capsys):
    monkeypatch.setattr(tiering, "MIN_COMPILED_BYTES", 0)
    assert main(["run", str(GATHER_SCATTER), "--profile", "3", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["tiers"]["fusion"]["reasons"]["opcode scatter"] == ["wrapped_scatter_computation"]
    assert main(["run", str(GATHER_SCATTER), "--profile", "3"]) == 0
    out = capsys.readouterr().out
    assert "fusions: 3 with a generated kernel (compiled once run enough), 1 op by op" in out
    assert "1 x opcode scatter: %wrapped_scatter_computation" in out


def test_a_generator_bug_warns_and_runs_op_by_op(monkeypatch):
    monkeypatch.setattr(tiering, "MIN_COMPILED_BYTES", 0)

    def broken(self):
        raise KeyError("a bug")
    monkeypatch.setattr(fusion.FusionGenerator, "generate", broken)
    with pytest.warns(CompileWarning, match=r"fusion generator failed on %\S+ \(KeyError: 'a bug', at "):
        exe = hloexec.load(GATHER_SCATTER)
    assert exe.context.tier_report.to_dict()["fusion"]["reasons"] == {"generator error KeyError": [
        "fused_computation", "fused_computation.1", "fused_computation.2", "wrapped_scatter_computation"]}
    inputs = exe.random_inputs(0)
    want = hloexec.load(GATHER_SCATTER, use_numba=False).run(*inputs)
    for g, w in zip(flatten(exe.run(*inputs)), flatten(want)):
        np.testing.assert_array_equal(g, w)


def test_compiled_schedule_failing_where_the_checked_run_passes_warns():
    exe = hloexec.load(GATHER_SCATTER)
    inputs = exe.random_inputs(0)
    want = flatten(exe.run(*inputs))            # the checked first run; the fast path exists from here on

    def failing(args):
        raise IndexError("a bug in the generated schedule")
    exe.runner._run_fast = failing
    with pytest.warns(CompileWarning, match="compiled schedule of %.* failed .*IndexError"):
        got = flatten(exe.run(*inputs))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert exe.runner._run_fast is False          # later runs stay checked
    exe.run(*inputs)


def test_generated_code_that_does_not_compile_is_counted(monkeypatch):
    from hloexec.kernels.fusion import FusedKernel
    monkeypatch.setattr(tiering, "MIN_COMPILED_BYTES", 0)

    def broken(self):
        raise RuntimeError("Numba says no")
    monkeypatch.setattr(FusedKernel, "compile", broken)
    for options in ({"compile": "eager"}, {"compile": "eager", "compile_after": 1}):    # compiled while prepared; at the second call
        with pytest.warns(CompileWarning, match="did not compile"):
            exe = hloexec.load(GATHER_SCATTER, **options)
            inputs = exe.random_inputs(0)
            exe.run(*inputs)
            exe.run(*inputs)
        reasons = exe.context.tier_report.to_dict()["fusion"]["reasons"]
        assert reasons["generated code did not compile (CompileWarning)"] == [
            "fused_computation", "fused_computation.1", "fused_computation.2"], options
