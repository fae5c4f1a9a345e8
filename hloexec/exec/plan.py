"""Execution plans: a computation lowered once into a flat list of steps, then only iterated.

A `Plan` holds, per instruction in schedule order, the kernel its op prepared, the slots of its
operands, its own slot, and the slots whose last use it is (freed right after it runs, so a buffer
lives exactly as long as the schedule needs it). The same liveness gives the peak memory estimate
that `hloexec run` prints before running (exec/memory.py).
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from functools import partial

from ..errors import CompileWarning, ExecutionError, UnsupportedError, describe_site
from ..ir import opcodes
from ..ir.module import Computation, Instruction
from ..ops.registry import async_shorthand, lookup
from .fuse import find_groups
from .inline import inline_calls
from .memory import PlanMemory


def _no_observer():
    return None


def schedule(comp: Computation) -> list[Instruction]:
    """Instructions in an order where operands (and control predecessors) come first.

    Text order when it is already valid (XLA prints topologically); else a DFS from every
    instruction in text order, so dead instructions are scheduled too (`Plan` leaves out those without side effects).
    """
    position = {id(inst): i for i, inst in enumerate(comp.instructions)}
    if all(position.get(id(o), -1) < position[id(inst)] for inst in comp.instructions for o in inst.operands) \
            and not any("control-predecessors" in inst.attrs for inst in comp.instructions):
        return list(comp.instructions)
    by_name = comp.by_name
    order, state = [], {}
    for start in comp.instructions:
        stack = [(start, False)]
        while stack:
            inst, expanded = stack.pop()
            key = id(inst)
            if expanded:
                state[key] = 2
                order.append(inst)
                continue
            if state.get(key) == 2:
                continue
            if state.get(key) == 1:
                raise ExecutionError(f"cycle through %{inst.name} in computation %{comp.name}")
            state[key] = 1
            stack.append((inst, True))
            preds = list(inst.operands)
            preds += [by_name[n] for n in inst.attr("control-predecessors", ()) if n in by_name]
            for p in reversed(preds):
                if state.get(id(p)) != 2:
                    stack.append((p, False))
    return order


@dataclass(slots=True)
class Step:
    inst: Instruction
    kernel: object
    inputs: tuple[int, ...]
    output: int
    frees: tuple[int, ...]
    fused: bool = False         # runs a fused group's kernel (exec/fuse.py), not its instruction's op
    extra_outputs: tuple[int, ...] = ()     # a multi-output group's other outputs: the kernel returns
                                            # (their values..., inst's value)


def has_side_effect(inst: Instruction) -> bool:
    """XLA's HloInstruction::HasSideEffect: the opcode is effectful, a custom-call says it is, a collective
    has a channel_id or constrain_layout (XLA exempts SPMD-partitioned modules; hloexec keeps them all),
    or a called computation holds such an instruction."""
    shorthand = async_shorthand(inst.opcode)        # all-to-all-start: an async all-to-all, with its attributes
    opcode = shorthand[1] if shorthand else inst.opcode
    if opcode in opcodes.SIDE_EFFECTING:
        return True
    if opcode == "custom-call" and inst.attr("custom_call_has_side_effect", False):
        return True
    if opcode in opcodes.CHANNEL_COLLECTIVES and (inst.has_attr("channel_id") or inst.attr("constrain_layout", False)):
        return True
    return any(has_side_effect(i) for c in inst.called_computations for i in c.instructions)


def live_instructions(comp: Computation, inputs_of=None) -> set[int]:
    """ids of the instructions the root or a side effect depends on (through operands -- or what
    `inputs_of(inst)` says an instruction reads -- and control-predecessors), with the side-effecting
    instructions and the parameters themselves."""
    by_name = comp.by_name
    stack = [comp.root, *comp.parameters, *(i for i in comp.instructions if has_side_effect(i))]
    live: set[int] = set()
    while stack:
        inst = stack.pop()
        if id(inst) in live:
            continue
        live.add(id(inst))
        stack += inst.operands if inputs_of is None else inputs_of(inst)
        stack += [by_name[n] for n in inst.attr("control-predecessors", ()) if n in by_name]
    return live


class Plan:
    """A prepared computation: call it with parameter values, get the root's value.

    Dead instructions -- those neither the root nor a side-effecting instruction depends on -- are left
    out, as XLA's dead-code elimination removes them (HloDCE keeps HasSideEffect instructions): a dead
    custom-call to an unknown target does not stop the module, and dead work costs nothing.
    """

    def __init__(self, comp: Computation, ctx, fuse: bool = False):
        self.computation = comp
        # the calling thread's observe callback, if its run looks inside this computation
        self._observer = partial(ctx.observer, comp) if hasattr(ctx, "observer") else _no_observer
        # a reducer or comparator runs per element: observers see the instruction applying it, not each scalar
        self._unobserved = lambda: comp.name in getattr(ctx, "applied_computations", ())
        if fuse:        # calls inlined first, so that fusion sees through them (exec/inline.py)
            comp = inline_calls(comp, keep_call=has_side_effect)
        live = live_instructions(comp)
        order = [inst for inst in schedule(comp) if id(inst) in live]
        # Unfused producer/consumer chains become compiled kernels; their inner values are never stored.
        groups = {id(g.root): g for g in find_groups(order, comp.root, ctx.fused_kernel)} if fuse else {}
        inputs_of = {id(inst): inst.operands for inst in order}
        # a multi-output group's other outputs are written by its step: they "read" its root
        produced_by = {id(o): g.root for g in groups.values() for o in g.outputs[:-1]}
        if groups:
            inputs_of.update((root, g.inputs) for root, g in groups.items())
            inputs_of.update((o, [root]) for o, root in produced_by.items())
            live = live_instructions(comp, lambda inst: inputs_of[id(inst)])
            order = [inst for inst in order if id(inst) in live]
        self.fused_groups = list(groups.values())
        slot = {id(inst): i for i, inst in enumerate(order)}
        self.n_slots = len(order)
        self.parameter_slots = [slot[id(p)] for p in comp.parameters]
        self.root_slot = slot[id(comp.root)]
        last_use: dict[int, int] = {}
        for step_index, inst in enumerate(order):
            if id(inst) not in produced_by:
                for o in inputs_of[id(inst)]:
                    last_use[slot[id(o)]] = step_index
        frees_at: dict[int, list[int]] = {}
        for s, step_index in last_use.items():
            if s != self.root_slot:
                frees_at.setdefault(step_index, []).append(s)
        self.order = order
        self.steps: list[Step] = []
        for step_index, inst in enumerate(order):
            if inst.opcode == "parameter" or id(inst) in produced_by:
                continue
            group = groups.get(id(inst))
            try:
                kernel = group.kernel if group is not None else lookup(inst).prepare(inst, ctx)
            except UnsupportedError as e:
                if e.instruction is None:
                    raise UnsupportedError(e.what, inst) from None
                raise
            extra = tuple(slot[id(o)] for o in group.outputs[:-1]) if group is not None else ()
            self.steps.append(Step(inst, kernel, tuple(slot[id(o)] for o in inputs_of[id(inst)]), slot[id(inst)],
                                   tuple(frees_at.get(step_index, ())), group is not None, extra))
        # Values that do not depend on the parameters are computed by the first run and reused after it,
        # except big broadcasts and iotas: one pass over their output recomputes them, while keeping them would
        # hold that memory as long as the plan (XLA's constant folding skips them for the same reason).
        invariant = set()
        for inst in order:
            if (inst.opcode in opcodes.PURE and inst.shape.nbytes <= MAX_FOLDED_BYTES
                    and "control-predecessors" not in inst.attrs
                    and all(id(o) in invariant for o in inputs_of[id(inst)])):
                invariant.add(id(inst))
        runs_warm = {id(inst) for inst in order if id(inst) not in invariant}
        read_warm = {id(comp.root)}
        for inst in reversed(order):
            if id(inst) in read_warm and inst.opcode in _EXPANSIONS and inst.shape.nbytes > MAX_KEPT_EXPANSION_BYTES:
                runs_warm.add(id(inst))
            if id(inst) in runs_warm:
                read_warm.update(id(o) for o in inputs_of[id(inst)])
        self.invariant_slots = {slot[i] for i in invariant - runs_warm}     # computed by the first run only
        self.folded = {slot[i]: None for i in (invariant - runs_warm) & read_warm}  # slot -> value, kept
        # Parameters that nothing uses are dropped at once.
        used = set(last_use)
        self.unused_parameters = [s for s in self.parameter_slots if s not in used and s != self.root_slot]
        self._run_fast = None       # the schedule as one generated function, after a checked first run (False: the
                                    # generated one failed where the checked one did not; runs stay checked)
        self.memory = PlanMemory(self)     # its buffers' lives, peak, recycled outputs (exec/memory.py)

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
            except (UnsupportedError, ExecutionError):
                raise
            except Exception as e:  # values are immutable: rerun checked, which names the failing instruction
                fast_error = e
        slots = [None] * self.n_slots
        for s, value in zip(self.parameter_slots, args):
            slots[s] = value
        for s in self.unused_parameters:
            slots[s] = None
        self._run_checked(slots, progress, profile, observe)
        if fast_error is not None:      # the checked run passed where the fast one failed: a bug in the latter
            self._run_fast = False      # (never again: this plan runs checked)
            warnings.warn(f"the compiled schedule of %{self.computation.name} failed ({type(fast_error).__name__}: "
                          f"{fast_error}) where the checked run did not: a bug; this plan runs checked from now on",
                          CompileWarning, stacklevel=2)
        if self._run_fast is None:
            self._run_fast = compile_schedule(self)
        return slots[self.root_slot]

    def _run_checked(self, slots, progress=None, profile=None, observe=None):
        """First run: every result is checked against its instruction's shape (no silent wrong result)."""
        total = len(self.steps)
        for done, step in enumerate(self.steps, 1):
            operands = [slots[i] for i in step.inputs]
            try:
                if profile is None:
                    value = step.kernel(*operands)
                else:
                    start = time.perf_counter()
                    value = step.kernel(*operands)
                    profile[step.inst] = profile.get(step.inst, 0.0) + time.perf_counter() - start
            except (UnsupportedError, ExecutionError):
                raise
            except Exception as e:  # a kernel failing is a bug or bad input: say where
                raise ExecutionError(f"{type(e).__name__}: {e}{describe_site(step.inst)}") from e
            if step.extra_outputs:
                *extras, value = value
                for s, v in zip(step.extra_outputs, extras):
                    check_value(self.order[s], v)
                    if s in self.folded:
                        self.folded[s] = v
                    slots[s] = v
                    if observe is not None:
                        observe(self.order[s], v, operands)
            check_value(step.inst, value)
            if observe is not None:
                observe(step.inst, value, operands)
            if step.output in self.folded:
                self.folded[step.output] = value
            slots[step.output] = value
            for f in step.frees:
                slots[f] = None
            if progress is not None:
                progress(done, total)

MAX_FOLDED_BYTES = 16 << 20     # a folded value lives as long as its plan
_EXPANSIONS = frozenset({"broadcast", "iota"})
MAX_KEPT_EXPANSION_BYTES = 64 << 10


def compile_schedule(plan: Plan):
    """The checked plan as one generated Python function `run(args) -> root value`.

    Slots become local variables and frees become `del`s, so a warm run does no per-step list building,
    indexing or attribute lookups: only the kernel calls (about 0.1 us of overhead per step instead of ~1 us).
    Steps computing parameter-independent values are left out: the first run's values are bound instead
    (XLA folds such constants at compile time; in a while body they would be recomputed every step).
    """
    names = {}
    lines = ["def run(args):"]
    if plan.parameter_slots:
        lines.append(f"    {', '.join(f's{s}' for s in plan.parameter_slots)}, = args")
    if plan.unused_parameters:
        lines.append(f"    del {', '.join(f's{s}' for s in plan.unused_parameters)}")
    for s, value in plan.folded.items():      # parameter-independent values: computed once, by the first run
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


def check_value(inst: Instruction, value) -> None:
    shape = inst.shape
    if shape.is_tuple:
        if not isinstance(value, tuple) or len(value) != len(shape.tuple_shapes):
            raise ExecutionError(f"kernel returned {type(value).__name__}, expected a {len(shape.tuple_shapes)}-tuple"
                                 f"{describe_site(inst)}")
        return
    if shape.element_type.numpy is None:     # token / opaque
        return
    dims = getattr(value, "shape", None)
    if dims != shape.dims or value.dtype != shape.dtype:
        raise ExecutionError(f"kernel returned {getattr(value, 'dtype', type(value).__name__)}{list(dims or ())}, "
                             f"expected {shape.to_text(layout=False)}{describe_site(inst)}")
