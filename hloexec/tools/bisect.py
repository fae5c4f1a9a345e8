"""`hloexec bisect DIR --module NAME`: the first compiler pass after which a program's outputs change.

The stages of a dump directory (before optimizations, every per-pass dump in pipeline order, after
optimizations) all compute the same function; a pass that changes the result beyond tolerance is where to
look. The stages run with the same inputs; the first runnable stage is the reference. A binary search over
the stages finds a stage whose outputs differ from the reference right after one whose outputs agree, and its
neighbours are checked too (the stage after it must still differ; otherwise the change comes and goes, which
the report says). Stages hloexec cannot run (a pass that introduces an unsupported custom-call, a layout it
cannot read) are reported and skipped, not fatal: the search steps to the nearest runnable stage.

With `reference="shadow"` (`--reference shadow`) a stage is bad when its outputs are no longer consistent with
the program's exact answer (the shadow of the reference stage, judged by tools/verdict.py as `compare
--reference shadow` judges), not merely different: a pass that legitimately changes rounding (float
normalization, a reduction's order) is not named; one that makes the result wrong is.

Then `hloexec.tools.diff` between the last good and the first bad stage names the instructions that pass
changed (first divergences).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ExecutionError, HloParseError, UnsupportedError
from ..ir.module import Module
from ..parser import parse
from .arrays import flatten
from .compare import jsonable
from .diff import DiffReport, Verdict, diff, judge
from .diff_format import format_report as format_diff
from .dumpdir import DumpModule, Stage, check_stage
from .hloproto import ProtoError
from .verdict import Verdict as ShadowVerdict


@dataclass
class StageRun:
    stage: Stage
    index: int
    outputs: list = field(default_factory=list)  # flat (none when it could not run)
    verdicts: list[Verdict] = field(default_factory=list)
    error: str = ""  # why it could not run (skipped)
    module: Module | None = None
    shadow_verdict: ShadowVerdict | None = None  # reference="shadow": the verdict on this stage's outputs

    @property
    def changed(self) -> bool:
        if self.shadow_verdict is not None:
            return not self.shadow_verdict.consistent(self.stage.path.name)
        return any(not v.agree for v in self.verdicts)


@dataclass
class BisectReport:
    module: DumpModule
    stages: list[Stage]
    runs: dict[int, StageRun]
    reference: int | None
    last_good: int | None = None
    first_bad: int | None = None
    after_first_bad: str = ""  # what the stage after the first bad one shows
    diff: DiffReport | None = None
    by: str = "first-stage"  # what a stage is judged against: "first-stage" or "shadow"

    def duplicates(self) -> list[dict]:
        """The stage files left out as a second copy of a stage (dumpdir.scan), as skipped entries."""
        return [{"stage": left.name, "error": f"duplicate of {kept.name}"} for left, kept in self.module.duplicates]

    def unseen_steps(self) -> list[int]:
        """Pass steps with no file between the last good and the first bad stage: the change may be any of them."""
        if self.first_bad is None or self.last_good is None:
            return []
        low, high = self.stages[self.last_good].step, self.stages[self.first_bad].step  # None: before, after
        return [k for k in self.module.missing_steps() if (low is None or low < k) and (high is None or k < high)]

    def compared(self) -> int:
        """How many stages ran and were compared with the reference (the reference included)."""
        return sum(1 for r in self.runs.values() if not r.error)

    def to_dict(self) -> dict:
        def name(i):
            return None if i is None else self.stages[i].path.name

        first = self.runs.get(self.first_bad) if self.first_bad is not None else None
        bad = self.stages[self.first_bad] if first is not None and self.first_bad is not None else None
        return jsonable(
            {
                "module": {"number": self.module.number, "name": self.module.name},
                "stages": len(self.stages),
                "reference": self.by,
                "reference_stage": name(self.reference),
                "first_bad_stage": name(self.first_bad),
                "last_good_stage": name(self.last_good),
                "pass": bad.after_pass if bad else None,
                "pipeline": bad.pipeline if bad else None,
                "after_first_bad": self.after_first_bad or None,
                "outputs": [] if first is None else [_verdict_dict(i, v) for i, v in enumerate(first.verdicts)],
                "shadow_verdict": None
                if first is None or first.shadow_verdict is None
                else first.shadow_verdict.to_dict(),
                "checked": [
                    {
                        "index": i,
                        "stage": self.stages[i].label,
                        "file": self.stages[i].path.name,
                        "status": "skipped" if r.error else ("changed" if r.changed else "agrees"),
                        "error": r.error or None,
                    }
                    for i, r in sorted(self.runs.items())
                ],
                "skipped": [
                    {"stage": self.stages[i].path.name, "error": r.error}
                    for i, r in sorted(self.runs.items())
                    if r.error
                ]
                + self.duplicates(),
                "missing": self.module.missing(),
                "unseen_steps": self.unseen_steps(),
                "diff": None if self.diff is None else self.diff.to_dict(),
            }
        )


def _verdict_dict(index: int, v: Verdict) -> dict:
    return {"index": index, "changed": not v.agree, **v.to_dict()}


def bisect(
    module: DumpModule,
    inputs=None,
    seed: int = 0,
    atol: float | None = None,
    rtol: float | None = None,
    with_diff: bool = True,
    report=None,
    reductions: str = "accumulate",
    reference: str = "first-stage",
) -> BisectReport:
    """Find the first stage of `module` whose outputs differ from the first runnable stage's (`reference=
    "shadow"`: are no longer consistent with its exact answer). `inputs`: the entry arguments (default: random
    ones from `seed`, of the reference's parameters); `report(message)` hears about each stage as it runs;
    `reductions`: how every stage rounds its sums."""
    from .. import ops  # noqa: F401  (fills the op registry; the executor: not at startup)
    from ..exec.executor import Executable
    from .numerics import judge_run  # the executor: not at startup

    stages = module.stages()
    runs: dict[int, StageRun] = {}
    for i, stage in enumerate(stages):  # a stage that cannot be read is skipped, and said, wherever it is
        problem = check_stage(stage)[1]
        if problem:
            runs[i] = StageRun(stage, i, error=problem)
    state = {"inputs": inputs, "reference": None, "exe": None}

    def run(i: int) -> StageRun:
        if i in runs:
            return runs[i]
        r = runs[i] = StageRun(stages[i], i)
        try:
            r.module = parse(stages[i].text())[0]
            exe = Executable(r.module, reductions=reductions)
            if state["inputs"] is None:
                state["inputs"] = exe.random_inputs(seed)
            r.outputs = flatten(exe.run(*state["inputs"]))
            state["exe"] = state["exe"] or exe
        except (HloParseError, UnsupportedError, ExecutionError, ProtoError, OSError) as e:
            r.error = str(e).splitlines()[0]
        if not r.error and reference == "shadow":
            r.shadow_verdict = judge_run(state["exe"], state["inputs"], {stages[i].path.name: r.outputs})[0]
        elif not r.error and state["reference"] is not None:
            wanted = runs[state["reference"]].outputs
            if len(wanted) != len(r.outputs):
                r.error = f"{len(r.outputs)} outputs, the reference has {len(wanted)}"
            else:
                r.verdicts = [judge(want, got, atol, rtol) for want, got in zip(wanted, r.outputs)]
        if report is not None:
            status = f"skipped: {r.error}" if r.error else "changed" if r.changed else "agrees"
            report(f"stage {i + 1}/{len(stages)} {stages[i].label}: {status}")
        return r

    result = BisectReport(module, stages, runs, None, by=reference)
    for i in range(len(stages)):  # the reference: the first stage that runs
        if not run(i).error:
            state["reference"] = result.reference = i
            runs[i].verdicts = [Verdict(True, True, total=getattr(x, "size", 0)) for x in runs[i].outputs]
            if runs[i].changed:  # shadow: the program as given is not consistent with its exact answer
                result.after_first_bad = (
                    f"the reference stage {stages[i].path.name} itself is not consistent "
                    "with its exact answer: every stage is judged by a verdict it fails"
                )
            break
    if result.reference is None:
        return result
    last = next((i for i in range(len(stages) - 1, result.reference, -1) if not run(i).error), None)
    if last is None or not runs[last].changed:
        result.last_good = last if last is not None else result.reference
        return result
    good, bad = result.reference, last
    while bad - good > 1:
        mid = _runnable_near(run, (good + bad) // 2, good, bad)
        if mid is None:
            break
        if runs[mid].changed:
            bad = mid
        else:
            good = mid
    result.last_good, result.first_bad = good, bad
    following = next((i for i in range(bad + 1, len(stages)) if not run(i).error), None)
    if following is not None and not runs[following].changed:
        result.after_first_bad = f"the outputs agree again at {stages[following].path.name}: the change comes and goes"
    if with_diff:
        result.diff = diff(
            runs[good].module, runs[bad].module, state["inputs"], atol=atol, rtol=rtol, reductions=reductions
        )
    return result


def _runnable_near(run, mid: int, low: int, high: int) -> int | None:
    """A stage strictly between low and high that runs, the nearest to mid first."""
    for offset in range(high - low):
        for i in (mid - offset, mid + offset):
            if low < i < high and not run(i).error:
                return i
    return None


def format_report(r: BisectReport) -> str:
    skipped = [x for x in r.runs.values() if x.error]
    lines = [
        f"module_{r.module.number:04d}.{r.module.name}: {len(r.stages)} stages, "
        f"{r.compared()} run, {len(skipped)} skipped"
        + (f", {len(r.module.duplicates)} duplicate files left out" if r.module.duplicates else "")
    ]
    for i, x in sorted(r.runs.items()):
        bad_word, good_word = ("NOT CONSISTENT", "consistent") if r.by == "shadow" else ("CHANGED", "agrees")
        status = (
            f"skipped ({x.error})"
            if x.error
            else ("reference" if i == r.reference and r.by != "shadow" else bad_word if x.changed else good_word)
        )
        lines.append(f"  {i:>4}  {r.stages[i].label:<70} {status}")
    for d in r.duplicates():
        lines.append(f"  {'':>4}  {d['stage']:<70} skipped ({d['error']})")
    lines += [f"  missing: {missing}" for missing in r.module.missing()]
    if r.reference is None:
        lines.append("no stage could run")
        return "\n".join(lines)
    if r.first_bad is None:
        lines.append(
            (
                f"every stage checked is consistent with the exact answer of {r.stages[r.reference].path.name}"
                if r.by == "shadow"
                else f"the outputs agree with {r.stages[r.reference].path.name} at every stage checked"
            )
            + (f" ({r.compared()} of {len(r.stages)}; {len(skipped)} could not be run: see above)" if skipped else "")
        )
        if r.compared() < 2:
            lines.append("no other stage could run: nothing was compared")
        if r.after_first_bad:
            lines.append(f"  note: {r.after_first_bad}")
        return "\n".join(lines)
    bad = r.stages[r.first_bad]
    good = r.stages[r.last_good].path.name if r.last_good is not None else "none"
    lines.append(
        f"first stage whose outputs are not consistent with the exact answer: {bad.path.name}"
        if r.by == "shadow"
        else f"first stage whose outputs differ: {bad.path.name}"
    )
    lines.append(f"  after pass {bad.after_pass!r} ({bad.pipeline}); last good: {good}")
    unseen = r.unseen_steps()
    if unseen:
        lines.append(
            f"  note: {len(unseen)} step{'s' if len(unseen) > 1 else ''} between them ha{'ve' if len(unseen) > 1 else 's'}"
            f" no file ({', '.join(map(str, unseen))}): the change may come from any of them"
        )
    verdict = r.runs[r.first_bad].shadow_verdict
    for output in verdict.outputs if verdict is not None else ():
        for c in output.candidates:
            if c.name == bad.path.name and not c.consistent:
                lines.append(f"  output {output.index}: " + "; ".join(c.reasons))
    for i, v in enumerate(r.runs[r.first_bad].verdicts):
        if not v.agree:
            lines.append(
                f"  output {i}: {v.problem or f'{v.mismatches}/{v.total} elements beyond atol {v.atol:g} rtol {v.rtol:g}, max abs {v.max_abs_error:.4g}, max rel {v.max_rel_error:.4g}'}"
            )
    if r.after_first_bad:
        lines.append(f"  note: {r.after_first_bad}")
    if r.diff is not None:
        lines.append("what the pass changed (diff of the last good and the first bad stage):")
        lines.append(format_diff(r.diff, indent="  "))
    return "\n".join(lines)
