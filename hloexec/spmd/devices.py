"""How many participants a partitioned module has, and how they are named: global device ids are XLA's flattened
ids, replica * num_partitions + partition."""

from __future__ import annotations

import re

from ..errors import ExecutionError
from ..ir.attributes import Sharding
from ..ir.module import Module
from ..ir.shardy import module_meshes
from ..ops.collectives import SEND_RECV_PAIRS, group_mode
from ..ops.registry import async_shorthand
from ..options import MOST_PARTICIPANTS


# The collectives whose replica groups (or pairs) name participants.
GROUPED = (
    "all-reduce",
    "all-reduce-start",
    "all-gather",
    "all-gather-start",
    "reduce-scatter",
    "all-to-all",
    "ragged-all-to-all",
    "collective-broadcast",
    "collective-permute",
    "collective-permute-start",
    "send",
    "recv",
)


def device_counts(
    module: Module, partitions: int | None = None, replicas: int | None = None, limit: int = MOST_PARTICIPANTS
):
    """(partitions, replicas, note): given, else from the header (where one given or one in the header
    leaves the other at the header's value or XLA's default, 1), else inferred from the largest ids in
    replica groups, source_target_pairs and shardings (note then says so; None otherwise). Given or header
    counts past `limit` are refused (a report that runs nothing passes options.MOST_DESCRIBED)."""
    header_p, header_r = module.attrs.get("num_partitions"), module.attrs.get("replica_count")
    if any(v is not None for v in (partitions, replicas, header_p, header_r)):
        origins = [
            "given" if g is not None else "the header's" if h is not None else "default"
            for g, h in ((partitions, header_p), (replicas, header_r))
        ]
        partitions = partitions if partitions is not None else int(header_p if header_p is not None else 1)
        replicas = replicas if replicas is not None else int(header_r if header_r is not None else 1)
        if partitions * replicas > limit:
            ran = "hloexec runs (each one a participant of this process or of its Ray workers)"
            raise ExecutionError(
                f"{module.name}: {partitions} partitions ({origins[0]}) x {replicas} replicas ({origins[1]}) = "
                f"{partitions * replicas} participants, more than the {limit} "
                f"{ran if limit == MOST_PARTICIPANTS else 'a report describes'}; set partitions=/replicas= "
                "(--partitions/--replicas) to run fewer"
            )
        return partitions, replicas, None
    most = {"partition": 0, "replica": 0, "device": 0}
    for inst in module.instructions():
        shorthand = async_shorthand(inst.opcode)  # all-to-all-start: an async all-to-all
        if (shorthand[1] if shorthand else inst.opcode) in GROUPED:
            mode = group_mode(inst)
            kind = {"flattened": "device", "cross_partition": "partition"}.get(mode, "replica")
            ids = [i for g in (inst.attr("replica_groups").groups if "replica_groups" in inst.attrs else ()) for i in g]
            ids += [i for pair in inst.attr("source_target_pairs", ()) for i in pair]
            pairs = (inst.attr("frontend_attributes") or {}).get(SEND_RECV_PAIRS)
            if pairs is not None:
                ids += [int(i) for i in re.findall(r"\d+", pairs)]
            most[kind] = max([most[kind], *(i + 1 for i in ids)])
        if "sharding" in inst.attrs:
            most["partition"] = max(most["partition"], *(d + 1 for d in _sharding_devices(inst.attr("sharding"))))
    for mesh in module_meshes(module).values():  # Shardy's meshes (pre-partition modules)
        most["partition"] = max(most["partition"], max(mesh.devices, default=0) + 1)
    inferred_r = max(most["replica"], 1)
    inferred_p = max(most["partition"], -(-most["device"] // inferred_r), 1)
    if inferred_p * inferred_r > MOST_PARTICIPANTS:  # a stray id (replica_groups={{99999999999,0}}) is not a machine
        raise ExecutionError(
            f"{module.name}: no num_partitions/replica_count in the header, and its device ids reach "
            f"{inferred_p} partitions x {inferred_r} replicas: more than {MOST_PARTICIPANTS} participants are not "
            "inferred; set partitions=/replicas= (--partitions/--replicas) to run that many"
        )
    note = (
        f"{module.name}: no num_partitions/replica_count in the header; running {inferred_p} partitions x "
        f"{inferred_r} replicas, from the largest device ids in its replica groups, source_target_pairs "
        f"and shardings (set partitions=/replicas= to override)"
    )
    return inferred_p, inferred_r, note


def device_ranges(devices) -> str:
    """[0,1,2,3,8] -> '0-3,8'."""
    runs: list[list[int]] = []
    for d in sorted(devices):
        if runs and d == runs[-1][-1] + 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _sharding_devices(sharding: Sharding):
    if sharding.kind == "tuple":
        return [d for e in sharding.elements for d in _sharding_devices(e)] or [0]
    if sharding.kind == "maximal":
        return [sharding.device]
    return list(sharding.devices) or [0]
