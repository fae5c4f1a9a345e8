"""Running a pre-partition module whose manual regions (hloexec.ops.manual) need every participant.

`Executable.run` hands such a module here when the calling thread plays no participant: all devices run as
SPMD participants (hloexec.spmd.run), each on the same global inputs, so each computes the global program,
its own tiles inside the regions, and the same global outputs; device 0's are returned.
"""

from __future__ import annotations

from .run import device_counts, run_spmd

PRE_PARTITION_HINT = (
    "it is the pre-partition form, whose manual regions (shard_map) `hloexec run FILE` / "
    "Executable.run execute per device inside the global program; for the per-device "
    "program use the SPMD-partitioned module (jax: jitted.lower(...).compile().as_text())"
)


def run_with_manual_regions(exe, args):
    """The module's outputs, every device running the global program on `args` (see the module docstring)."""
    partitions, replicas, _ = device_counts(exe.module)
    outputs = run_spmd(exe, [list(args)] * (partitions * replicas), report=lambda message: None)
    return outputs[0]
