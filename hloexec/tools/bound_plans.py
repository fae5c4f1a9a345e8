"""What the error bounds (tools/bounds.py) decide once per instruction of a shadow, whatever the participant and
the device profile: the original program's instruction behind a shadow's, whether its float types are 32 bits or
narrower (its bounds kept in float32), its kernel prepared in the shadow's context, a convolution's dot. An SPMD
run's observers (one per participant and profile, each on its participant's thread) share one `InstructionPlans`:
each decision is made once, not once per participant (a TPU program's tiled bitcast took 0.5 s to prepare, eight
times)."""

from __future__ import annotations

import threading

from ..ops.registry import lookup
from .bound_convolution import as_dot, gemm_as_dot
from .bound_epilogues import library_epilogue


def _narrow(shape) -> bool:
    """Whether every float leaf of `shape` (a program's) is 32 bits or narrower (its bounds fit a float32)."""
    if shape.is_tuple:
        return all(map(_narrow, shape.tuple_shapes))
    etype = shape.element_type
    return etype is None or etype.kind != "float" or etype.bits <= 32


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
        self.kernel = KernelCache(context)
        self.decided: dict[int, tuple] = {}  # id(inst) -> (inst, original, narrow, dot or None)
        self.epilogues: dict[int, tuple] = {}  # id(inst) -> (inst, bound_epilogues.Epilogue or None)

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

    def epilogue(self, inst):
        """A library custom-call's contraction and epilogue (tools/bound_epilogues.library_epilogue), None where the
        rules have none."""
        made = self.epilogues.get(id(inst))
        if made is None:  # (threads deciding at once: the first one's is kept)
            made = self.epilogues.setdefault(id(inst), (inst, library_epilogue(inst, self.context)))
        return made[1]
