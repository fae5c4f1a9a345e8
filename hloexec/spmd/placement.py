"""Which participants of a Ray run share a worker (`place`): the devices of the module's heaviest collective groups
(by the bytes their operands carry: the tensor-parallel all-reduces before the data-parallel ones) are kept in one
worker where they fit, then the groups are packed into workers of `participants_per_worker`."""

from __future__ import annotations

from ..errors import ExecutionError, UnsupportedError
from ..exec.context import Device
from ..ops.collectives import group_mode, participants
from .devices import GROUPED


def collective_groups(module, P: int, R: int) -> dict[frozenset, int]:
    """The device groups of the module's collectives (a frozenset of groups per distinct grouping) -> the
    bytes their operands carry, over all instructions with that grouping (each counted once: loop trip
    counts are not in the text). A collective-permute's groups are its (source, target) pairs."""
    devices = [Device(replica_id=d // P, partition_id=d % P, num_replicas=R, num_partitions=P) for d in range(P * R)]
    weights: dict[frozenset, int] = {}
    for inst in module.instructions():
        if inst.opcode not in GROUPED:
            continue
        if inst.opcode.startswith("collective-permute"):
            pairs = inst.attr("source_target_pairs", ())
            if group_mode(inst) == "cross_partition":
                groups: set[tuple[int, ...]] = {(r * P + s, r * P + t) for r in range(R) for s, t in pairs}
            else:
                groups = {(s * P + p, t * P + p) for p in range(P) for s, t in pairs}
        else:
            groups = set()
            for device in devices:
                try:
                    groups.add(tuple(participants(inst, device)))
                except (ExecutionError, UnsupportedError):  # the run says so; placement need not
                    pass
        grouping = frozenset(g for g in groups if all(d < P * R for d in g))
        if grouping:
            weights[grouping] = weights.get(grouping, 0) + sum(o.shape.nbytes for o in inst.operands)
    return weights


def place(module, P: int, R: int, per_worker: int) -> list[list[int]]:
    """Devices grouped into workers of at most `per_worker`: the groups of the heaviest collectives first
    are merged into one worker where the merge fits (a group larger than a worker, in pieces of
    `per_worker` in group order), then the merged sets are packed into workers (largest first)."""
    n = P * R
    parent = list(range(n))
    size = [1] * n

    def root(d: int) -> int:
        while parent[d] != d:
            parent[d] = parent[parent[d]]
            d = parent[d]
        return d

    def merge(devices) -> None:
        roots = {root(d) for d in devices}
        if len(roots) > 1 and sum(size[r] for r in roots) <= per_worker:
            first, *rest = sorted(roots)
            for r in rest:
                parent[r] = first
                size[first] += size[r]

    heaviest = sorted(collective_groups(module, P, R).items(), key=lambda item: (-item[1], sorted(item[0])))
    for groups, _ in heaviest:
        for group in sorted(groups):
            merge(group)
            for start in range(0, len(group), per_worker):  # a group larger than a worker: in pieces
                merge(group[start : start + per_worker])
    merged: dict[int, list[int]] = {}
    for d in range(n):
        merged.setdefault(root(d), []).append(d)
    workers: list[list[int]] = []
    for members in sorted(merged.values(), key=lambda m: (-len(m), m[0])):
        for worker in workers:
            if len(worker) + len(members) <= per_worker:
                worker += members
                break
        else:
            workers.append(list(members))
    return sorted(sorted(w) for w in workers)
