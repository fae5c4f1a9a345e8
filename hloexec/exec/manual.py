"""Running a pre-partition module whose manual regions (hloexec.ops.manual) need every participant.

`Executable.run` hands such a module here when the calling thread plays no participant: all devices run as
SPMD participants (hloexec.exec.spmd), each on the same global inputs, so each computes the global program,
its own tiles inside the regions, and the same global outputs; device 0's are returned.
"""
from __future__ import annotations

from ..ir.module import Module
from ..ops.custom_call import target_of
from ..ops.manual import ENTERS

PRE_PARTITION_HINT = ("it is the pre-partition form, whose manual regions (shard_map) `hloexec run FILE` / "
                      "Executable.run execute per device inside the global program; for the per-device "
                      "program use the SPMD-partitioned module (jax: jitted.lower(...).compile().as_text())")


def has_manual_regions(module: Module) -> bool:
    """Whether the module enters a manual region (SPMDFullToShardShape, xla.sdy.GlobalToLocalShape)."""
    if "custom-call" not in module.opcode_counts():
        return False
    return any(i.opcode == "custom-call" and target_of(i) in ENTERS for i in module.instructions())


def run_with_manual_regions(exe, args, **options):
    """The module's outputs, every device running the global program on `args` (see the module docstring)."""
    from .spmd import run_spmd
    outputs = run_spmd(exe, [list(args)] * _participants(exe.module), report=lambda message: None, **options)
    return outputs[0]


def _participants(module: Module) -> int:
    from .spmd import device_counts
    partitions, replicas, _ = device_counts(module)
    return partitions * replicas
