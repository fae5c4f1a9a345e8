"""Running a plan: the checked path first (each step's value checked against its instruction's shape; progress,
profile and observers), then the fast path (the schedule as one generated function, exec/schedule_codegen.py),
back on the checked path when the fast one raises. Either frees each value after its last use (the plan's
liveness)."""

from __future__ import annotations

import time
import warnings
from functools import partial

from ..errors import CompileWarning, ExecutionError, HloParseError, UnsupportedError, describe_site
from ..ir.module import Instruction
from .plan import Plan
from .schedule_codegen import compile_schedule


class Runner:
    """Runs one Plan: call it with parameter values, get the root's value. What ops get for the computations
    they call (`ctx.computation(...)`)."""

    def __init__(self, plan: Plan, ctx):
        self.plan = plan
        comp = plan.computation
        # the calling thread's observe callback, if its run looks inside this computation (ExecContext.observer)
        self._observer = partial(ctx.observer, comp)
        # a reducer or comparator runs per element: observers see the instruction applying it, not each scalar
        self._unobserved = lambda: comp.name in ctx.applied_computations
        self._run_fast = None  # the schedule as one generated function, after a checked first run (False: the
        # generated one failed where the checked one did not; runs stay checked)

    def __call__(self, *args, progress=None, profile=None):
        """`progress(done, total)`, if given, is called after each step; `profile`, a dict, gets each step's
        instruction -> seconds added (a fused group counts under its root). Either makes the run a checked one,
        as does an observer (ExecContext.observe), called `observer(inst, value, operand values)` after each step."""
        observe = self._observer()
        if observe is not None and self._unobserved():
            observe = None
        fast_error = None
        if self._run_fast and progress is None and profile is None and observe is None:
            try:
                return self._run_fast(args)
            except (UnsupportedError, ExecutionError, HloParseError):  # they name the instruction
                raise
            except Exception as e:  # values are immutable: rerun checked, which names the failing instruction
                fast_error = e
        plan = self.plan
        slots = [None] * plan.n_slots
        for s, value in zip(plan.parameter_slots, args):
            slots[s] = value
        for s in plan.unused_parameters:
            slots[s] = None
        self._run_checked(slots, progress, profile, observe)
        if fast_error is not None:  # the checked run passed where the fast one failed: a bug in the latter
            self._run_fast = False  # (never again: this plan runs checked)
            warnings.warn(
                f"the compiled schedule of %{plan.computation.name} failed ({type(fast_error).__name__}: "
                f"{fast_error}) where the checked run did not: a bug; this plan runs checked from now on",
                CompileWarning,
                stacklevel=2,
            )
        if self._run_fast is None:
            self._run_fast = compile_schedule(plan)
        return slots[plan.root_slot]

    def _run_checked(self, slots, progress=None, profile=None, observe=None):
        """Every result is checked against its instruction's shape (no silent wrong result); the first run's
        parameter-independent values are kept in `plan.folded` for the fast path."""
        plan = self.plan
        total = len(plan.steps)
        for done, step in enumerate(plan.steps, 1):
            operands = [slots[i] for i in step.inputs]
            try:
                if profile is None:
                    value = step.kernel(*operands)
                else:
                    start = time.perf_counter()
                    value = step.kernel(*operands)
                    profile[step.inst] = profile.get(step.inst, 0.0) + time.perf_counter() - start
            except (UnsupportedError, ExecutionError, HloParseError):  # they name the instruction
                raise
            except Exception as e:  # a kernel failing is a bug or bad input: say where
                raise ExecutionError(f"{type(e).__name__}: {e}{describe_site(step.inst)}") from e
            if step.extra_outputs:
                *extras, value = value
                for s, v in zip(step.extra_outputs, extras):
                    check_value(plan.order[s], v)
                    if s in plan.folded:
                        plan.folded[s] = v
                    slots[s] = v
                    if observe is not None:
                        observe(plan.order[s], v, operands)
            check_value(step.inst, value)
            if observe is not None:
                observe(step.inst, value, operands)
            if step.output in plan.folded:
                plan.folded[step.output] = value
            slots[step.output] = value
            for f in step.frees:
                slots[f] = None
            if progress is not None:
                progress(done, total)


def check_value(inst: Instruction, value) -> None:
    shape = inst.shape
    if shape.is_tuple:
        if not isinstance(value, tuple) or len(value) != len(shape.tuple_shapes):
            raise ExecutionError(
                f"kernel returned {type(value).__name__}, expected a {len(shape.tuple_shapes)}-tuple"
                f"{describe_site(inst)}"
            )
        return
    if shape.element_type.numpy is None:  # token / opaque
        return
    dims = getattr(value, "shape", None)
    if dims != shape.dims or value.dtype != shape.dtype:
        raise ExecutionError(
            f"kernel returned {getattr(value, 'dtype', type(value).__name__)}{list(dims or ())}, "
            f"expected {shape.to_text(layout=False)}{describe_site(inst)}"
        )
