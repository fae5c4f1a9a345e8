"""A tiny builder of HLO IR computations, for kernel tests and benchmarks written before (or without)
the text parser: `b = Builder(); x = b.param(0, "f32[8]"); ...; comp = b.build(root)`.

Attributes are given as raw HLO text (`dimensions="{0}"`), exactly as the parser would store them.
"""

from __future__ import annotations

from ..ir.module import Computation, Instruction
from ..ir.shape import parse_shape


class Builder:
    def __init__(self, name: str = "fused_computation"):
        self.name = name
        self.instructions: list[Instruction] = []
        self._n = 0

    def _add(self, opcode, shape, operands=(), args="", called=None, **attrs) -> Instruction:
        self._n += 1
        shape = parse_shape(shape) if isinstance(shape, str) else shape
        inst = Instruction(
            f"{opcode}.{self._n}",
            opcode,
            shape,
            list(operands),
            {k.replace("__", "-"): str(v) for k, v in attrs.items()},
            args,
        )
        for o in operands:
            o.users.append(inst)
        if called:
            inst.called.update(called)
        self.instructions.append(inst)
        return inst

    def param(self, number: int, shape) -> Instruction:
        return self._add("parameter", shape, args=str(number))

    def const(self, shape, literal: str) -> Instruction:
        return self._add("constant", shape, args=literal)

    def op(self, opcode: str, shape, *operands, called=None, **attrs) -> Instruction:
        return self._add(opcode, shape, operands, called=called, **attrs)

    def reduce(self, shape, operand, init, dims, reducer: str = "add") -> Instruction:
        et = init.shape.element_type.name
        sub = Builder(f"{reducer}_{et}")
        a, b = sub.param(0, f"{et}[]"), sub.param(1, f"{et}[]")
        comp = sub.build(sub.op(reducer, f"{et}[]", a, b))
        return self._add(
            "reduce",
            shape,
            [operand, init],
            called={"to_apply": comp},
            dimensions="{" + ",".join(map(str, dims)) + "}",
            to_apply="%" + comp.name,
        )

    def build(self, root: Instruction) -> Computation:
        root.is_root = True
        return Computation(self.name, list(self.instructions), root)
