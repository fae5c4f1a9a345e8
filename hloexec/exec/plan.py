"""Execution plans: a computation lowered once into a flat list of steps -- its schedule and liveness.

A `Plan` holds, per instruction in schedule order, the kernel its op prepared, the slots of its
operands, its own slot, and the slots whose last use it is (freed right after it runs, so a buffer
lives exactly as long as the schedule needs it), and which values do not depend on the parameters (computed
by the first run only). The same liveness gives the peak memory estimate that `hloexec run` prints before
running (exec/memory.py). Running a plan is exec/runner.py's job.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ExecutionError, UnsupportedError
from ..ir.dataflow import has_side_effect, is_pure, live_instructions
from ..ir.module import Computation, Instruction
from ..ops.registry import lookup
from .fuse import find_groups
from .inline import inline_calls
from .memory import PlanMemory


def schedule(comp: Computation) -> list[Instruction]:
    """Instructions in an order where operands (and control predecessors) come first.

    Text order when it is already valid (XLA prints topologically); else a DFS from every
    instruction in text order, so dead instructions are scheduled too (`Plan` leaves out those without side effects).
    """
    position = {id(inst): i for i, inst in enumerate(comp.instructions)}
    if all(
        position.get(id(o), -1) < position[id(inst)] for inst in comp.instructions for o in inst.operands
    ) and not any("control-predecessors" in inst.attrs for inst in comp.instructions):
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
    fused: bool = False  # runs a fused group's kernel (exec/fuse.py), not its instruction's op
    extra_outputs: tuple[int, ...] = ()  # a multi-output group's other outputs: the kernel returns
    # (their values..., inst's value)


class Plan:
    """A prepared computation: its steps in schedule order, their slots, what each frees (exec/runner.py runs it).

    Dead instructions -- those neither the root nor a side-effecting instruction depends on -- are left
    out, as XLA's dead-code elimination removes them (HloDCE keeps HasSideEffect instructions): a dead
    custom-call to an unknown target does not stop the module, and dead work costs nothing.
    """

    def __init__(self, comp: Computation, ctx, fuse: bool = False):
        self.computation = comp
        if fuse:  # calls inlined first, so that fusion sees through them (exec/inline.py)
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
            self.steps.append(
                Step(
                    inst,
                    kernel,
                    tuple(slot[id(o)] for o in inputs_of[id(inst)]),
                    slot[id(inst)],
                    tuple(frees_at.get(step_index, ())),
                    group is not None,
                    extra,
                )
            )
        # Values that do not depend on the parameters are computed by the first run and reused after it,
        # except big broadcasts and iotas, and broadcasts of one value: one pass over their output recomputes
        # them, while keeping them would hold that memory as long as the plan (XLA's constant folding skips them
        # for the same reason; a train step's fusion plans kept 259 KB of broadcast scalars, half its peak).
        invariant = set()
        for inst in order:
            if (
                is_pure(inst)
                and inst.shape.nbytes <= MAX_FOLDED_BYTES
                and "control-predecessors" not in inst.attrs
                and all(id(o) in invariant for o in inputs_of[id(inst)])
            ):
                invariant.add(id(inst))
        runs_warm = {id(inst) for inst in order if id(inst) not in invariant}
        read_warm = {id(comp.root)}
        for inst in reversed(order):
            if id(inst) in read_warm and _expands(inst, inputs_of[id(inst)]):
                runs_warm.add(id(inst))
            if id(inst) in runs_warm:
                read_warm.update(id(o) for o in inputs_of[id(inst)])
        self.invariant_slots = {slot[i] for i in invariant - runs_warm}  # computed by the first run only
        # slot -> value, kept: filled by the first (checked) run, read by the fast path
        self.folded = {slot[i]: None for i in (invariant - runs_warm) & read_warm}
        # Parameters that nothing uses are dropped at once.
        used = set(last_use)
        self.unused_parameters = [s for s in self.parameter_slots if s not in used and s != self.root_slot]
        self.memory = PlanMemory(self)  # its buffers' lives, peak, recycled outputs (exec/memory.py)


MAX_FOLDED_BYTES = 16 << 20  # a folded value lives as long as its plan
_EXPANSIONS = frozenset({"broadcast", "iota"})
MAX_KEPT_EXPANSION_BYTES = 64 << 10


def _expands(inst, operands) -> bool:
    """Whether warm runs make `inst` again rather than keep it: a big broadcast or iota, or a broadcast of one
    value to more (what it holds is one number)."""
    if inst.opcode not in _EXPANSIONS:
        return False
    if inst.shape.nbytes > MAX_KEPT_EXPANSION_BYTES:
        return True
    return inst.opcode == "broadcast" and len(operands) == 1 and operands[0].shape.size == 1 < inst.shape.size
