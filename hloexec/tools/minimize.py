"""`hloexec minimize FILE --check CHECK`: shrink a module while a check keeps saying it is interesting.

XLA's hlo_bisect idea, on hloexec's evaluator. A candidate is a sub-computation of the original entry (see
hloexec.tools.extract.submodule): some of its outputs, with instructions cut off and replaced by parameters
that take the values those instructions had in a run of the original module (captured once per value), so
what is left computes exactly what it computed inside the original. The steps, each reported:

1. outputs: keep one output (the first that stays interesting), else drop them one at a time;
2. the root moves up to an operand while the candidate stays interesting (what follows the interesting
   instruction goes);
3. a prefix cut: the largest point of the schedule before which every instruction becomes a parameter
   (binary search, confirmed);
4. one instruction at a time, nearest the root first: cut it (it becomes a parameter);
5. scalar parameters become constants.

A check is a built-in name or a shell command. Built-ins run in this process: `nan` (an output holds a NaN
that no input holds, nor an infinity the original's inputs did not hold: the candidate makes it from finite
values, so the overflow that made an infinity stays in), `xla` (hloexec's outputs and XLA:CPU's differ beyond
`hloexec compare`'s tolerances; needs jaxlib), `shadow` (XLA:CPU's outputs or hloexec's are not consistent
with the candidate's exact answer, as `compare --against xla --reference shadow` judges; needs jaxlib). A command gets the candidate's path for `{}` (appended when
there is no `{}`) and its inputs' npz (keys arg0..) for `{inputs}`; exit 0 means still interesting. A check
that fails is retried (`retries`): a candidate that then passes marks the check flaky (and counts as
interesting: it did reproduce), and the final module is checked again that many times.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field

import numpy as np

from .. import load
from ..errors import ExecutionError, HloParseError, UnsupportedError
from ..ir.module import Instruction, Module
from ..parser import parse
from . import xla_cpu  # xla_cpu.run_on_xla_cpu_isolated read when called: a test stands in for XLA
from .arrays import flatten
from .compare import compare_outputs, is_float
from .extract import Submodule, capture, submodule
from .match import ValueGraph
from .xla_cpu import XlaCpuError, save_arrays

BUILTIN_CHECKS = ("nan", "xla", "shadow")


@dataclass
class Candidate:
    roots: list[Instruction]
    cut: frozenset = frozenset()  # ids of instructions replaced by parameters
    constants: frozenset = frozenset()  # ids of cut instructions written as constants instead


@dataclass
class MinimizeResult:
    text: str
    inputs: list
    instructions: int
    original_instructions: int
    steps: list[dict] = field(default_factory=list)
    checks: int = 0
    flaky: int = 0
    final_holds: str = ""

    def to_dict(self) -> dict:
        return {
            "instructions": self.instructions,
            "original_instructions": self.original_instructions,
            "steps": self.steps,
            "checks": self.checks,
            "flaky_checks": self.flaky,
            "final_check": self.final_holds,
        }


class Check:
    """Whether a candidate (HLO text, its inputs) is still interesting."""

    def __init__(self, spec: str, timeout: float = 600.0, device=None):
        self.spec, self.timeout, self.device = spec, timeout, device  # device: the profile hloexec runs under
        self.scratch: str | None = None
        # nan: whether the first candidate checked (the original) had Inf
        self.original_inputs_infinite: bool | None = None
        self.outcome = ""  # how the last command check ended: said when the original module is not interesting

    def _paths(self) -> tuple[str, str]:
        scratch = self.scratch
        if scratch is None:
            scratch = self.scratch = tempfile.mkdtemp(prefix="hloexec-minimize-")
            atexit.register(shutil.rmtree, scratch, True)
        return os.path.join(scratch, "candidate.hlo"), os.path.join(scratch, "candidate.npz")

    def __call__(self, text: str, inputs: list) -> bool:
        if self.spec == "nan":
            if self.original_inputs_infinite is None:
                self.original_inputs_infinite = _nonfinite_in(inputs, np.isinf)
            return _makes_nan(text, inputs, allow_inf=self.original_inputs_infinite, device=self.device)
        if self.spec == "xla":
            return _disagrees_with_xla(text, inputs, self.device)
        if self.spec == "shadow":
            return _inconsistent_with_shadow(text, inputs, self.device)
        hlo, npz = self._paths()
        with open(hlo, "w", encoding="utf-8") as f:
            f.write(text)
        save_arrays(npz, {f"arg{i}": a for i, a in enumerate(flatten(tuple(inputs)))})
        command = self.spec.replace("{inputs}", shlex.quote(npz))
        command = command.replace("{}", shlex.quote(hlo)) if "{}" in command else f"{command} {shlex.quote(hlo)}"
        # its own process group: a timeout, Ctrl-C or SIGTERM ends the whole check, not just its shell. Those
        # signals wait while it starts: one landing after the fork but before `proc` is known would leave it running
        stops, proc = {signal.SIGINT, signal.SIGTERM}, None
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)
        try:
            proc = subprocess.Popen(
                command,
                shell=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, stops),
            )
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)  # a pending one is raised here
            code = proc.wait(timeout=self.timeout)
            self.outcome = f"the command exited {code}" + (": command not found" if code == 127 else "")
            return code == 0
        except subprocess.TimeoutExpired:
            self.outcome = f"the command did not end within its timeout, {self.timeout:g} s"
            return False
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
            if proc is not None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()


def _makes_nan(text: str, inputs: list, allow_inf: bool, device=None) -> bool:
    """An output holds a NaN made from inputs without NaN (and without infinities, unless `allow_inf`)."""
    if _nonfinite_in(inputs, np.isnan) or (not allow_inf and _nonfinite_in(inputs, np.isinf)):
        return False
    try:
        outputs = load(text, use_numba=False, device=device).run(*inputs)
    except (ExecutionError, UnsupportedError, HloParseError):
        return False
    return _nonfinite_in([outputs], np.isnan)


def _nonfinite_in(values, test) -> bool:
    """Whether `test` (np.isnan, np.isinf) holds for an element of a float or complex value in `values`."""
    for x in flatten(tuple(values)):
        a = np.asarray(x)
        if (a.dtype.kind == "c" and test(a).any()) or (is_float(a.dtype) and test(a.astype(np.float64)).any()):
            return True
    return False


def _disagrees_with_xla(text: str, inputs: list, device=None) -> bool:
    try:
        ours = flatten(load(text, device=device).run(*inputs))
        theirs = xla_cpu.run_on_xla_cpu_isolated(text, flatten(tuple(inputs)))
    except (ExecutionError, UnsupportedError, HloParseError, XlaCpuError):
        return False
    return not compare_outputs(ours, theirs).passed


def _inconsistent_with_shadow(text: str, inputs: list, device=None) -> bool:
    from .numerics import judge_run  # the executor: not at startup

    try:
        theirs = xla_cpu.run_on_xla_cpu_isolated(text, flatten(tuple(inputs)))
        verdict, _ = judge_run(load(text, device=device), inputs, {"XLA:CPU": theirs})
    except (ExecutionError, UnsupportedError, HloParseError, XlaCpuError):
        return False
    return not verdict.consistent()


class _Minimizer:
    def __init__(self, module: Module, inputs, check, retries: int, report, device=None, max_memory=None):
        from .. import ops  # noqa: F401  (fills the op registry; the executor: not at startup)
        from ..exec.executor import Executable

        self.module, self.check, self.retries, self.report = module, check, retries, report
        self.exe = Executable(module, device=device, max_memory=max_memory)
        self.exe.check_memory()
        self.inputs = inputs() if callable(inputs) else inputs
        self.graph = ValueGraph(module)
        self.values: dict[int, object] = {}
        self.by_id = {id(i): i for i in module.entry.instructions}
        self.checks = self.flaky = 0
        self.memo: dict[tuple, bool] = {}

    def build(self, c: Candidate) -> tuple[Submodule, list]:
        sub = submodule(c.roots, c.cut, name=f"{self.module.name}.min")
        missing = [p for p in sub.parameters if p.opcode != "parameter" and id(p) not in self.values]
        if missing:
            for p, v in zip(missing, capture(self.exe, missing, self.inputs, self.graph)):
                self.values[id(p)] = v
        entry_inputs = {p.parameter_number: v for p, v in zip(self.module.entry.parameters, self.inputs)}
        values = [
            entry_inputs[p.parameter_number] if p.opcode == "parameter" else self.values[id(p)] for p in sub.parameters
        ]
        if c.constants:
            sub, values = _with_constants(sub, values, c.constants)
        return sub, values

    def interesting(self, c: Candidate) -> bool:
        key = (tuple(id(r) for r in c.roots), c.cut, c.constants)
        if key in self.memo:
            return self.memo[key]
        sub, values = self.build(c)
        result = False
        for attempt in range(1 + self.retries):
            self.checks += 1
            if self.check(sub.text, values):
                if attempt:
                    self.flaky += 1
                result = True
                break
        self.memo[key] = result
        return result

    def size(self, c: Candidate) -> int:
        return self.build(c)[0].instruction_count


def minimize(
    module: Module, inputs, check, retries: int = 1, report=None, device=None, max_memory: int | None = None
) -> MinimizeResult:
    """Shrink `module` (its entry computation) while `check(text, inputs)` holds; see the module docstring.
    `device`: the device profile the module's values are computed under (None: reference). `inputs` may be a
    function making them: called once the module is prepared and its peak fits `max_memory` (None:
    MemAvailable), so a module refused draws nothing."""
    say = report or (lambda message: None)
    mz = _Minimizer(module, inputs, check, retries, say, device, max_memory)
    root = module.entry.root
    c = Candidate(list(root.operands) if root.opcode == "tuple" else [root])
    original = mz.size(c)
    result = MinimizeResult("", [], original, original)

    def step(name: str, new: Candidate | None) -> None:
        nonlocal c
        if new is None:
            return
        before, after = mz.size(c), mz.size(new)
        c = new
        result.steps.append({"step": name, "instructions_before": before, "instructions_after": after})
        say(f"{name}: {before} -> {after} instructions")

    if not mz.interesting(c):
        outcome = getattr(check, "outcome", "")  # a command check: its exit code or timeout
        raise ValueError(
            f"the check does not hold on {module.name} itself ({1 + retries} tries"
            + (f"; {outcome}" if outcome else "")
            + "): nothing to minimize"
        )
    say(f"{module.name}: {original} instructions; the check holds")
    step("outputs", _trim_outputs(mz, c))
    step("root moved up", _move_root(mz, c))
    step("prefix cut", _prefix_cut(mz, c))
    step("single cuts", _single_cuts(mz, c))
    step("scalar parameters as constants", _constants(mz, c))
    sub, values = mz.build(c)
    holds = sum(bool(check(sub.text, values)) for _ in range(1 + retries))
    result.text, result.inputs, result.instructions = sub.text, values, sub.instruction_count
    result.checks, result.flaky = mz.checks + 1 + retries, mz.flaky
    result.final_holds = f"{holds}/{1 + retries}"
    return result


def _trim_outputs(mz: _Minimizer, c: Candidate) -> Candidate | None:
    if len(c.roots) <= 1:
        return None
    for r in c.roots:
        new = Candidate([r], c.cut, c.constants)
        if mz.interesting(new):
            return new
    roots = list(c.roots)
    for r in list(roots):
        trial = [x for x in roots if x is not r]
        if trial and mz.interesting(Candidate(trial, c.cut, c.constants)):
            roots = trial
    return Candidate(roots, c.cut, c.constants) if len(roots) < len(c.roots) else None


def _movable(inst: Instruction) -> bool:
    return inst.opcode not in ("parameter", "constant", "iota") and not inst.shape.is_tuple


def _move_root(mz: _Minimizer, c: Candidate) -> Candidate | None:
    if len(c.roots) != 1:
        return None
    current, moved = c, False
    while True:
        root = current.roots[0]
        for o in root.operands:
            if _movable(o) and id(o) not in current.cut:
                new = Candidate([o], current.cut, current.constants)
                if mz.interesting(new):
                    current, moved = new, True
                    break
        else:
            return current if moved else None


def _schedule(c: Candidate) -> list[Instruction]:
    """The instructions a candidate computes (not its parameters), in the computation's order."""
    inside, stack = set(), list(c.roots)
    while stack:
        inst = stack.pop()
        if id(inst) in inside or inst.opcode == "parameter" or id(inst) in c.cut:
            continue
        inside.add(id(inst))
        stack += inst.operands
    return [i for i in c.roots[0].parent.instructions if id(i) in inside]


def _cut_before(c: Candidate, order: list[Instruction], t: int) -> Candidate:
    """Every instruction before position t of `order` that something from t on reads becomes a parameter."""
    early = {id(i) for i in order[:t]}
    cut = {id(o) for i in order[t:] for o in i.operands if id(o) in early}
    cut |= {id(r) for r in c.roots if id(r) in early}
    return Candidate(c.roots, c.cut | cut, c.constants)


def _prefix_cut(mz: _Minimizer, c: Candidate) -> Candidate | None:
    order = [i for i in _schedule(c) if _movable(i)]
    if len(order) < 2:
        return None
    good, bad = 0, len(order)  # cutting before `good` keeps it interesting
    while bad - good > 1:
        mid = (good + bad) // 2
        if mz.interesting(_cut_before(c, order, mid)):
            good = mid
        else:
            bad = mid
    return _cut_before(c, order, good) if good else None


def _single_cuts(mz: _Minimizer, c: Candidate) -> Candidate | None:
    current = c
    for inst in reversed(_schedule(c)):
        if not _movable(inst) or any(inst is r for r in current.roots) or id(inst) in current.cut:
            continue
        if id(inst) not in {id(i) for i in _schedule(current)}:
            continue  # gone with an earlier cut
        new = Candidate(current.roots, current.cut | {id(inst)}, current.constants)
        if mz.size(new) < mz.size(current) and mz.interesting(new):
            current = new
    return current if current is not c else None


def _constants(mz: _Minimizer, c: Candidate) -> Candidate | None:
    sub, _ = mz.build(c)
    scalars = [
        p
        for p in sub.parameters
        if p.opcode != "parameter" and p.shape.is_array and p.shape.rank == 0 and id(p) not in c.constants
    ]
    current = c
    for p in scalars:
        new = Candidate(current.roots, current.cut, current.constants | {id(p)})
        if mz.interesting(new):
            current = new
    return current if current is not c else None


def _with_constants(sub: Submodule, values: list, constants: frozenset) -> tuple[Submodule, list]:
    """The submodule with the parameters of `constants` (ids of original instructions) as constants of their
    captured values, and the remaining inputs."""
    module = parse(sub.text)[0]
    entry = module.entry
    by_name = {p.name: (p, v) for p, v in zip(sub.parameters, values)}
    kept, number = [], 0
    for inst in entry.parameters:
        original, value = by_name[inst.name]
        if id(original) in constants:
            inst.opcode, inst.args = "constant", _literal_text(value)
        else:
            inst.args = str(number)
            number += 1
            kept.append(value)
    rebuilt = submodule([entry.root], frozenset(), name=sub.name)
    originals = [by_name[p.name][0] for p in rebuilt.parameters]
    return Submodule(rebuilt.text, sub.name, sub.roots, originals, sub.instructions), kept


def _literal_text(value) -> str:
    x = np.asarray(value).reshape(())
    if x.dtype == np.bool_:
        return "true" if x else "false"
    if x.dtype.kind in "iu":
        return str(int(x))
    f = float(x)
    if f != f:
        return "nan"
    if f in (float("inf"), float("-inf")):
        return "inf" if f > 0 else "-inf"
    return repr(f)
