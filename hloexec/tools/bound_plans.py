"""What the error bounds (tools/bounds.py) decide once per instruction of a shadow, whatever the participant and
the device profile: the original program's instruction behind a shadow's, whether its float types are 32 bits or
narrower (its bounds kept in float32), its kernel prepared in the shadow's context, a convolution's dot. An SPMD
run's observers (one per participant and profile, each on its participant's thread) share one `InstructionPlans`:
each decision is made once, not once per participant (a TPU program's tiled bitcast took 0.5 s to prepare, eight
times)."""

from __future__ import annotations

import threading

from ..ir.module import Computation, Instruction
from ..ir.opcodes import separate_reducer_opcodes
from ..ops.registry import lookup
from .bound_convolution import as_dot, gemm_as_dot
from .bound_epilogues import library_epilogue


def _narrow(shape) -> bool:
    """Whether every float leaf of `shape` (a program's) is 32 bits or narrower (its bounds fit a float32)."""
    if shape.is_tuple:
        return all(map(_narrow, shape.tuple_shapes))
    etype = shape.element_type
    return etype is None or etype.kind != "float" or etype.bits <= 32


def _part(inst, k: int, opcode: str) -> Instruction:
    """Variadic reduce `inst`'s k-th result as a reduce of its own: its k-th input and init value, reduced by
    `opcode` (its reducer's k-th result's op, separate_reducer_opcodes), at the same place in the program."""
    n = len(inst.operands) // 2
    params = inst.called["to_apply"].parameters
    scalars = [Instruction(f"p{j}", "parameter", params[k + j * n].shape, [], args=str(j)) for j in (0, 1)]
    root = Instruction(opcode, opcode, params[k].shape, scalars)
    part = Instruction(
        inst.name, "reduce", inst.shape.tuple_shapes[k], [inst.operands[k], inst.operands[n + k]], inst.attrs
    )
    part.called = {"to_apply": Computation(f"{inst.name}.{k}", [*scalars, root], root)}
    part.computation = inst.computation
    return part


class KernelCache:
    """Instructions' kernels prepared once in `context`, by identity (each kept with its instruction, so an id
    is not reused while cached); safe to share between threads (one prepares, the others wait for it)."""

    def __init__(self, context):
        self.context = context
        self.prepared: dict[int, tuple] = {}
        self.lock = threading.Lock()

    def __call__(self, inst):
        k = self.prepared.get(id(inst))
        if k is None:
            with self.lock:
                k = self.prepared.get(id(inst))
                if k is None:
                    k = self.prepared[id(inst)] = (inst, lookup(inst).prepare(inst, self.context))
        return k[1]


class InstructionPlans:
    """Per instruction of `shadow`'s module (see the module docstring): `original(inst)`, `narrow(inst)`,
    `kernel(inst)`, `as_dot(inst)`."""

    def __init__(self, shadow, context):
        self.context = context  # (its `device`: the calling participant's)
        self.originals = {(c.name, i.name): i for c in shadow.original.computations for i in c.instructions}
        # the computations fusions call (XLA's algebraic simplifier leaves them as they are: bound_rewrites.py)
        self.fused = {id(i.called.get("calls")) for i in self.originals.values() if i.opcode == "fusion"}
        self.kernel = KernelCache(context)
        self.decided: dict[int, tuple] = {}  # id(inst) -> (inst, original, narrow, dot or None)
        self.epilogues: dict[int, tuple] = {}  # id(inst) -> (inst, bound_epilogues.Epilogue or None)
        self.separated: dict[int, tuple] = {}  # id(inst) -> (inst, its parts or None: `parts`)
        self.part_ids: set[int] = set()  # the parts' (their sums round every step: `is_part`)

    def plan(self, inst) -> tuple:
        """(inst, `original(inst)`, `narrow(inst)`, `as_dot(inst)`) in one lookup (the observer's every call)."""
        plan = self.decided.get(id(inst))
        if plan is None:
            comp = inst.computation.name if inst.computation is not None else ""
            orig = self.originals.get((comp, inst.name))
            dot = (
                as_dot(inst)
                if inst.opcode == "convolution"
                else gemm_as_dot(inst)
                if inst.opcode == "custom-call"
                else None
            )
            # (threads deciding at once: the first one's is kept)
            plan = self.decided.setdefault(id(inst), (inst, orig, orig is not None and _narrow(orig.shape), dot))
        return plan

    def original(self, inst):
        """The original program's instruction `inst` (the shadow's) stands for; None for the shadow's own helpers."""
        return self.plan(inst)[1]

    def narrow(self, inst) -> bool:
        """Whether `inst`'s original's float types are all 32 bits or narrower."""
        return self.plan(inst)[2]

    def as_dot(self, inst):
        """The dot a convolution `inst` is (tools/bound_convolution.as_dot), None where it is not one."""
        return self.plan(inst)[3]

    def parts(self, inst) -> list | None:
        """A variadic reduce of separate reducers (ir/opcodes.separate_reducer_opcodes), not one the selecting rule
        bounds (every float result a max or min: tools/bound_sorts.selecting_reduce), as its results' reduces
        (`_part`: each planned with the original's part), None otherwise. Cheap for any other instruction."""
        if inst.opcode != "reduce" or len(inst.operands) < 4:
            return None
        made = self.separated.get(id(inst))
        if made is None:
            made = self.separated.setdefault(id(inst), (inst, self._separate(inst)))
        return made[1]

    def _separate(self, inst) -> list | None:
        orig = self.original(inst)
        ops = separate_reducer_opcodes(inst.called["to_apply"], len(inst.operands) // 2)
        if orig is None or ops is None:
            return None
        floats = [op for op, (_, leaf) in zip(ops, orig.shape.leaves()) if leaf.element_type.kind == "float"]
        if all(op in ("maximum", "minimum") for op in floats):
            return None
        parts = []
        for k, op in enumerate(ops):
            part, orig_part = _part(inst, k, op), _part(orig, k, op)
            self.decided[id(part)] = (part, orig_part, _narrow(orig_part.shape), None)
            self.part_ids.add(id(part))
            parts.append(part)
        return parts

    def is_part(self, inst) -> bool:
        """Whether `inst` is a variadic reduce's part (`parts`): its sums round every step in its type, in the
        HLO's order, whatever the device's reductions rule (hloexec's and XLA:CPU's loops run its reducer as it
        is, one rounding a step; XLA's tree rewriter leaves variadic reduces as they are)."""
        return id(inst) in self.part_ids

    def epilogue(self, inst):
        """A library custom-call's contraction and epilogue (tools/bound_epilogues.library_epilogue), None where the
        rules have none."""
        made = self.epilogues.get(id(inst))
        if made is None:  # (threads deciding at once: the first one's is kept)
            made = self.epilogues.setdefault(id(inst), (inst, library_epilogue(inst, self.context)))
        return made[1]
