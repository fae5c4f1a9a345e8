"""What a computation's data flow says about its instructions, once for every layer: which have a side effect,
which are live (the root or a side effect depends on them), which compute from their operands alone (pure).
The plans (exec/plan.py: dead-code elimination, constant folding) and the loop generator (kernels/program.py:
what a loop step emits, what it hoists) ask here."""

from __future__ import annotations

from . import opcodes

_ASYNC_SUFFIXES = ("-start", "-update", "-done")


def has_side_effect(inst) -> bool:
    """XLA's HloInstruction::HasSideEffect: the opcode (or the op an async `<op>-start` / `-update` / `-done`
    wraps) is effectful, a custom-call says it is, a collective has a channel_id or constrain_layout (XLA exempts
    SPMD-partitioned modules; hloexec keeps them all), or a called computation holds such an instruction."""
    opcode = inst.opcode
    if opcode not in opcodes.SIDE_EFFECTING:
        opcode = next((opcode[: -len(s)] for s in _ASYNC_SUFFIXES if opcode.endswith(s)), opcode)
    if opcode in opcodes.SIDE_EFFECTING:
        return True
    if opcode == "custom-call" and inst.attr("custom_call_has_side_effect", False):
        return True
    if opcode in opcodes.CHANNEL_COLLECTIVES and (inst.has_attr("channel_id") or inst.attr("constrain_layout", False)):
        return True
    return any(has_side_effect(i) for c in inst.called_computations for i in c.instructions)


def live_instructions(comp, inputs_of=None) -> set[int]:
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


def is_pure(inst) -> bool:
    """Whether `inst`'s value depends on its operands alone (opcodes.PURE, or a call / fusion of a computation
    that computes from its parameters alone): operands that do not change give the same value on every run."""
    if inst.opcode in ("call", "fusion"):
        return computes_from_parameters(inst.called["to_apply" if inst.opcode == "call" else "calls"])
    return inst.opcode in opcodes.PURE


def computes_from_parameters(comp) -> bool:
    """Whether computation `comp` computes from its parameters alone (every instruction pure)."""
    return all(i.opcode == "parameter" or is_pure(i) for i in comp.instructions)
