"""Participants that compute the same: when every participant of an SPMD run gets the same inputs and nothing it
computes depends on its device id, one participant's run is every participant's (hloexec.exec.communicators'
MirrorCommunicator gives it what its peers, itself, would send). `why_not_identical` proves that or says why not.

A participant's run is a function of its inputs, of the values it computes from its partition and replica id, and
of what its collectives give it. So the participants compute the same when

- their inputs are the same arrays (or equal ones);
- the values made from the ids and constants alone (an id, a constant table indexed by it: Alpa's dumps index
  tables of offsets, elided to zeros) are equal on every device where they meet the rest of the computation
  (fusions and calls are looked into; the values are computed, per device, by the ops' own kernels);
- every collective gives every participant the same when they hold the same: all-reduce, all-gather and
  collective-broadcast over groups of one size (a reduce-scatter, an all-to-all or a permute gives each its own
  part); no manual region (its edges cut each device's tile) and no `rng` (a stream per participant).
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np

from ..exec.context import Device
from ..ir import opcodes
from ..ops.collectives import participants
from ..ops.manual import has_manual_regions
from ..ops.registry import lookup
from .memory import leaves

DEVICE_IDS = frozenset({"partition-id", "replica-id"})
# Collectives that give every member of a group the same result when the members hold the same operands.
ALIKE_COLLECTIVES = frozenset(
    {"all-reduce", "all-reduce-start", "all-gather", "all-gather-start", "collective-broadcast"}
)
PER_PARTICIPANT = frozenset({"send", "recv", "ragged-all-to-all", "rng"})
STATIC = frozenset({"constant", "iota"})  # values every participant has alike


def why_not_identical(exe, per_device_inputs: list, P: int, R: int) -> str | None:
    """None when the P x R participants of `exe` compute the same on `per_device_inputs` (see the module
    docstring), else why they may not."""
    module, n = exe.module, P * R
    if n < 2:
        return "one participant"
    if has_manual_regions(module):
        return "its manual regions give each device its own tile"
    first = list(leaves(per_device_inputs[0]))
    for d in range(1, n):
        other = list(leaves(per_device_inputs[d]))
        if len(other) != len(first) or not all(a is b or _equal(a, b) for a, b in zip(first, other)):
            return f"device {d}'s inputs differ from device 0's"
    devices = [Device(replica_id=d // P, partition_id=d % P, num_replicas=R, num_partitions=P) for d in range(n)]
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode in PER_PARTICIPANT or (
                inst.opcode in opcodes.COLLECTIVES
                and inst.opcode not in ALIKE_COLLECTIVES
                and not inst.opcode.endswith("-done")
            ):
                return f"%{inst.name} ({inst.opcode}) gives each participant its own"
            if inst.opcode in ALIKE_COLLECTIVES and len({len(participants(inst, dev)) for dev in devices}) > 1:
                return f"%{inst.name}'s groups are of different sizes"
    seen = [_IdValues(exe.context, dev).run(module.entry) for dev in devices]
    for d in range(1, n):
        for (where, mine), (_, theirs) in zip(seen[0], seen[d]):
            if mine != theirs:
                return f"{where} differs between device 0 and device {d}"
    return None


def _equal(a, b) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    return type(a) is type(b) and bool(np.all(a == b))


class _IdValues:
    """The values one device makes from its ids (and constants) alone, digested where they meet the rest of the
    computation: a list of (where, digest) in program order, the same order on every device."""

    def __init__(self, context, device: Device):
        self.context, self.device = context, device
        self.found: list[tuple[str, bytes]] = []

    def run(self, entry) -> list[tuple[str, bytes]]:
        def visit():
            self.context.play(self.device)  # the ids' kernels read the calling thread's device
            self._visit(entry, {})

        worker = threading.Thread(target=visit, name="hloexec-id-values")
        worker.start()
        worker.join()
        return self.found

    def _visit(self, comp, params: dict, constants: dict | None = None) -> None:
        """`params`: parameter number -> the value the caller passes, where it was made from the ids;
        `constants`: the same, where it is made from constants alone."""
        made: dict[int, object] = {}  # id-made values of this computation
        static: dict[int, object] = {}  # constants and what they make, computed when an id-made value needs them
        for p in comp.parameters:
            if constants and p.parameter_number in constants:
                static[id(p)] = constants[p.parameter_number]

        def value(o):
            if id(o) in made:
                return made[id(o)]
            if id(o) not in static:
                static[id(o)] = self._kernel(o)(*(value(x) for x in o.operands))
            return static[id(o)]

        def is_static(o) -> bool:
            return (
                o.opcode in STATIC
                or id(o) in static
                or (not o.called and o.opcode != "parameter" and o.operands and all(map(is_static, o.operands)))
            )

        for inst in comp.instructions:
            if inst.opcode in DEVICE_IDS:
                made[id(inst)] = self._kernel(inst)()
            elif inst.opcode == "parameter" and inst.parameter_number in params:
                made[id(inst)] = params[inst.parameter_number]
            elif (
                any(id(o) in made for o in inst.operands)
                and not inst.called
                and inst.opcode not in opcodes.COLLECTIVES
                and all(id(o) in made or is_static(o) for o in inst.operands)
            ):
                made[id(inst)] = self._kernel(inst)(*(value(o) for o in inst.operands))
            else:
                inside = inst.opcode in ("fusion", "call")  # the callee's parameters are these operands
                for o in inst.operands:
                    if id(o) in made and not inside:
                        self._note(f"%{o.name} (in %{comp.name}, used by %{inst.name})", made[id(o)])
                passed = {k: made[id(o)] for k, o in enumerate(inst.operands) if id(o) in made} if inside else {}
                alike = (
                    {k: value(o) for k, o in enumerate(inst.operands) if id(o) not in made and is_static(o)}
                    if passed
                    else None
                )
                for called in inst.called.values():
                    for callee in called if isinstance(called, list) else [called]:
                        self._visit(callee, passed, alike)
        if id(comp.root) in made:
            self._note(f"%{comp.root.name} (the root of %{comp.name})", made[id(comp.root)])

    def _kernel(self, inst):
        return lookup(inst).prepare(inst, self.context)

    def _note(self, where: str, value) -> None:
        h = hashlib.blake2b(digest_size=16)
        for leaf in leaves(value):
            a = np.ascontiguousarray(leaf)
            h.update(f"{a.dtype}{a.shape}".encode())
            h.update(a.tobytes())
        self.found.append((where, h.digest()))
