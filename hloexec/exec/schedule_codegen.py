"""The fast path of a plan: its schedule written as one generated Python function (exec/runner.py runs it)."""

from __future__ import annotations

from .plan import Plan


def compile_schedule(plan: Plan):
    """The checked plan as one generated Python function `run(args) -> root value`.

    Slots become local variables and frees become `del`s, so a warm run does no per-step list building,
    indexing or attribute lookups: only the kernel calls (about 0.1 us of overhead per step instead of ~1 us).
    Steps computing parameter-independent values are left out: the first run's values are bound instead
    (XLA folds such constants at compile time; in a while body they would be recomputed every step).
    """
    names: dict[str, object] = {}  # the generated function's globals
    lines = ["def run(args):"]
    if plan.parameter_slots:
        lines.append(f"    {', '.join(f's{s}' for s in plan.parameter_slots)}, = args")
    if plan.unused_parameters:
        lines.append(f"    del {', '.join(f's{s}' for s in plan.unused_parameters)}")
    for s, value in plan.folded.items():  # parameter-independent values: computed once, by the first run
        names[f"f{s}"] = value
        lines.append(f"    s{s} = f{s}")
    for k, step in enumerate(plan.steps):
        if step.output in plan.invariant_slots:
            continue
        names[f"k{k}"] = step.kernel
        targets = "".join(f"s{s}, " for s in step.extra_outputs) + f"s{step.output}"
        lines.append(f"    {targets} = k{k}({', '.join(f's{i}' for i in step.inputs)})")
        if step.frees:
            lines.append(f"    del {', '.join(f's{f}' for f in step.frees)}")
    lines.append(f"    return s{plan.root_slot}")
    code = compile("\n".join(lines), f"<schedule of %{plan.computation.name}>", "exec")
    exec(code, names)
    return names["run"]
