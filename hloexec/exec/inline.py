"""Call inlining before a plan is built, as XLA's CallInliner does before it fuses.

jax wraps its helpers (relu, where, take, remainder, clip, ...) in `call`s, and a call is a wall the
fusion pass (exec/fuse.py) cannot see through: `add` then `call(relu)` then `dot` ran as two passes over
memory, each op by op. Inlined, the add and the relu are one fused loop.

The inlined computation is made of copies: the module's own instructions (and their `users`) are never
touched, so the module still prints, and other plans still see, what was parsed. A copy keeps its name,
attributes and source line, and names the computation it came from in error messages.
"""

from __future__ import annotations

from ..ir.module import Computation, Instruction
from ..ir.shape_inference import check_call

MAX_INLINED = 50_000  # instructions an inlined computation may grow to


def inline_calls(comp: Computation, keep_call) -> Computation:
    """`comp` with its `call`s replaced by the called instructions (recursively), or `comp` itself when
    there is nothing to inline. `keep_call(inst)`: a call not to inline (one with side effects)."""

    def inlinable(inst) -> bool:
        called = inst.called.get("to_apply")  # malformed calls: refused where they are prepared
        return (
            inst.opcode == "call"
            and called is not None
            and check_call(inst, called) is None
            and not keep_call(inst)
            and _ordered(called)
        )

    if not any(inlinable(i) for i in comp.instructions) or not _ordered(comp) or _size(comp, inlinable) > MAX_INLINED:
        return comp
    copies: list[tuple[Instruction, Computation]] = []

    def expand(c: Computation, args: list[Instruction] | None) -> Instruction:
        value: dict[int, Instruction] = {}
        for inst in c.instructions:
            if inst.opcode == "parameter" and args is not None:
                value[id(inst)] = args[inst.parameter_number]
                continue
            operands = [value[id(o)] for o in inst.operands]
            if inlinable(inst):
                value[id(inst)] = expand(inst.called_computation("to_apply"), operands)
            else:
                copy = inst.with_operands(operands)
                copies.append((copy, c))
                value[id(inst)] = copy
        return value[id(c.root)]

    root = expand(comp, None)
    inlined = Computation(
        comp.name,
        [copy for copy, _ in copies],
        root,
        is_entry=comp.is_entry,
        signature=comp.signature,
        attrs=comp.attrs,
        line=comp.line,
    )
    inlined.module = comp.module
    for copy, origin in copies:
        copy.computation = origin  # error messages name the computation the text is in
    return inlined


def _ordered(comp: Computation) -> bool:
    """Operands before users in text order, and no control edges (names would collide once inlined)."""
    seen: set[int] = set()
    for inst in comp.instructions:
        if "control-predecessors" in inst.attrs or any(id(o) not in seen for o in inst.operands):
            return False
        seen.add(id(inst))
    return True


def _size(comp: Computation, inlinable) -> int:
    return sum(_size(i.called_computation("to_apply"), inlinable) if inlinable(i) else 1 for i in comp.instructions)
