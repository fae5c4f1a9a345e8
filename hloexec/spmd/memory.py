"""What the participants of an SPMD run need: the memory estimate, checked against the run's limit before it
starts."""

from __future__ import annotations

import math

import numpy as np

from ..errors import ExecutionError, MemoryLimitError
from ..exec.context import Device
from ..ir.attributes import Sharding
from ..ir.module import Module
from ..ir.shape import Shape
from ..kernels.threads import CORES
from ..ops.collectives import groups_of, participants
from ..ops.tiles import tile_layout
from .devices import GROUPED
from .shardings import parameter_shardings


def memory_estimate(
    exe, per_device_inputs, concurrency: int | None = None, groups: list | None = None, counts: tuple = ()
) -> dict:
    """Bytes N participants need at peak: N x (per-device peak of stored values - inputs), what the steps
    hold while they run (scratch) for the `concurrency` participants that compute at a time (default: the
    cores), and the distinct inputs.

    `per_device_inputs`: the input lists (their distinct arrays are counted), or a participant count N
    (inputs counted as `split_inputs` would share them: see sharded_input_bytes).

    Scratch (f32 copies of f16 operands, a fusion's op-by-op first run) lives only while a kernel runs;
    counting it for all N participants at once refused the 16-device GPT seed (32 GB estimated, 11.6 GB
    measured), counting it for the running ones matches the measurement.

    `groups` (participants taking turns, Mailboxes; `counts`: the module's (partitions, replicas)): the
    largest group's participants at their peak, the others at most what is alive at a collective reaching
    across groups (`parked_bytes`).

    Plus the exchanges' own bookkeeping (`exchange_bytes`): it grows as N x the largest collective group."""
    if isinstance(per_device_inputs, int):
        n, input_bytes = per_device_inputs, sharded_input_bytes(exe.module, per_device_inputs)
    else:
        n = len(per_device_inputs)
        arrays = [list(leaves(inputs)) for inputs in per_device_inputs]
        distinct = {id(a): a.nbytes for device in arrays for a in device if isinstance(a, np.ndarray)}
        input_bytes = sum(distinct.values())
    per_device_inputs_bytes = sum(p.shape.nbytes for p in exe.module.entry.parameters)
    per_device_peak = exe.peak_bytes()
    stored_peak = exe.plan.memory.peak_bytes(scratch=False)
    running = min(n, concurrency or CORES)
    together = max(map(len, groups)) if groups and len(groups) > 1 else n
    parked = parked_bytes(exe, groups, *counts) if groups and together < n else 0
    exchanges = exchange_bytes(exe.module, n, counts)
    work = (
        together * max(stored_peak - per_device_inputs_bytes, 0)
        + (n - together) * max(parked - per_device_inputs_bytes, 0)
        + min(running, together) * (per_device_peak - stored_peak)
        + exchanges
    )
    return {
        "participants": n,
        "per_device_peak": per_device_peak,
        "inputs": input_bytes,
        "inputs_unshared": n * per_device_inputs_bytes,
        "exchanges": exchanges,
        "work": work,
        "total": work + input_bytes,
    }


# A payload waiting in the mailboxes (communicators.Mailboxes: its key, the instruction's name, the array or the
# all-reduce's piece it holds): 300-370 bytes measured (tracemalloc, 100-400 participants in one all-reduce
# group; 4000 of them: 5.4 GB resident), counted as 400.
MAILBOX_ENTRY_BYTES = 400


# The collectives in which every participant sends to every member of its group.
ALL_TO_GROUP = ("all-reduce", "all-reduce-start", "all-gather", "all-gather-start", "reduce-scatter", "all-to-all")


def exchange_bytes(module: Module, n: int, counts: tuple = ()) -> int:
    """The mailboxes' bookkeeping at a collective: each of the `n` participants posts one payload per member of
    its group, so n x the largest group's size entries (an all-reduce of 100000 participants in one group: 10^10,
    3.4 TB, whatever its arrays' sizes). `counts`: (partitions, replicas), default the module's."""
    if n <= 1:
        return 0
    P, R = counts or (module.num_partitions, module.replica_count)
    device = Device(num_replicas=R, num_partitions=P)  # device 0: every group of a collective is as large
    largest = 0
    for c in module.computations:
        for inst in c.instructions:
            if inst.opcode in ALL_TO_GROUP:
                try:
                    largest = max(largest, len(participants(inst, device)))
                except ExecutionError:  # groups that do not cover this device: said when it runs
                    continue
    return n * largest * MAILBOX_ENTRY_BYTES


def parked_bytes(exe, groups: list, P: int, R: int) -> int:
    """Most one participant holds (its inputs included) while it waits for its group's turn: at its start, or at
    a collective whose groups reach across `groups`; its peak when such a collective is inside a called
    computation (a loop's: not followed here)."""
    group_of = {d: k for k, g in enumerate(groups) for d in g}
    devices = all_devices(P, R)
    plan = exe.plan
    series = plan.memory.live_bytes(scratch=False)
    at = [series[0]]
    for k, step in enumerate(plan.steps):
        if crosses(step.inst, group_of, devices):
            at.append(series[k + 1])
    inside = any(
        crosses(inst, group_of, devices)
        for comp in exe.module.computations
        if comp is not exe.module.entry
        for inst in comp.instructions
    )
    return plan.memory.peak_bytes(scratch=False) if inside else max(at)


def crosses(inst, group_of: dict, devices: list[Device]) -> bool:
    """Whether collective `inst` exchanges between participants (`devices`) of different run groups (`group_of`:
    device id -> group)."""
    if inst.opcode not in GROUPED:
        return False
    return any(len({group_of[d] for d in participants(inst, device)}) > 1 for device in devices)


def largest_crossing(module: Module, groups: list[list[int]], P: int, R: int) -> int:
    """Elements of the largest float array a collective reaching across `groups` (run_groups') makes: where a
    participant waiting for its turn waits (0: none crosses)."""
    group_of = {d: k for k, g in enumerate(groups) for d in g}
    devices = all_devices(P, R)
    return max(
        (
            i.shape.size
            for c in module.computations
            for i in c.instructions
            if not i.shape.is_tuple and i.shape.element_type.kind == "float" and crosses(i, group_of, devices)
        ),
        default=0,
    )


def run_groups(exe, P: int, R: int) -> list[list[int]] | None:
    """Groups of participants that may take turns: among the groups of the module's collectives, the partition of
    the P x R participants into the smallest groups that the fewest collectives reach across (a model-parallel
    axis's groups, when the data-parallel all-reduces are few); None when every collective spans everyone."""
    candidates: dict[tuple, list[list[int]]] = {}
    n, devices = P * R, all_devices(P, R)
    collectives = [i for c in exe.module.computations for i in c.instructions if i.opcode in GROUPED]
    for inst in collectives:
        groups = {tuple(g) for g in groups_of(inst, devices)}
        if 1 < len(groups) and sum(map(len, groups)) == n:
            candidates.setdefault(tuple(sorted(groups)), [list(g) for g in sorted(groups)])
    if not candidates:
        return None

    def cost(groups):
        group_of = {d: k for k, g in enumerate(groups) for d in g}
        return (sum(crosses(i, group_of, devices) for i in collectives), max(map(len, groups)))

    return min(candidates.values(), key=cost)


def all_devices(P: int, R: int) -> list[Device]:
    """The P x R participants' Devices (their ids), in global id order."""
    return [Device(replica_id=d // P, partition_id=d % P, num_replicas=R, num_partitions=P) for d in range(P * R)]


def sharded_input_bytes(module: Module, num_devices: int, devices=None) -> int:
    """Bytes of the distinct input buffers `split_inputs` makes for `num_devices` participants (or for the
    participants `devices` of them: a Ray worker's): one per replicated (or unsharded, or maximal)
    parameter, one per distinct tile of a tiled one (devices of a replicated subgroup share theirs)."""
    wanted = None if devices is None else set(devices)

    def distinct(shape: Shape, sharding: Sharding | None) -> int:
        if shape.is_tuple:
            elements = (
                sharding.elements
                if sharding is not None and sharding.kind == "tuple"
                else [sharding] * len(shape.tuple_shapes)
            )
            return sum(distinct(sub, s) for sub, s in zip(shape.tuple_shapes, elements))
        if sharding is None or sharding.kind != "tiled":
            return shape.nbytes
        counts, tile_devices = tile_layout(sharding, shape.rank)
        if wanted is None:
            return min(math.prod(counts), num_devices) * shape.nbytes
        return (
            len({index[: shape.rank] for index in np.ndindex(tile_devices.shape) if int(tile_devices[index]) in wanted})
            * shape.nbytes
        )

    return sum(distinct(p.shape, s) for p, s in zip(module.entry.parameters, parameter_shardings(module)))


def leaves(value):
    """The arrays of a value (lists and tuples, nested), depth first."""
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from leaves(v)
    else:
        yield value


def gb(n: float) -> str:
    return f"{n / 2**30:.2f} GB" if n >= 2**30 else f"{n / 2**20:.1f} MB"


def check_fits(module_name: str, memory: dict, max_memory: int | None, available: int | None) -> None:
    """MemoryLimitError when `memory` (a memory_estimate) exceeds `max_memory` (the total: inputs and working
    memory; Options.max_memory), or else `available` (the working memory beyond the inputs, which are loaded
    already: MemAvailable of the machine the participants run on; None: not checked)."""
    subject = f"{module_name} on {memory['participants']} participants"
    estimated = "estimated"
    if memory.get("exchanges", 0) > memory["work"] / 2:  # the participants' count itself is what does not fit
        estimated += f"; {gb(memory['exchanges'])} of it the payloads their collectives post, one per member of a group"
    if max_memory is not None and memory["total"] > max_memory:
        raise MemoryLimitError(
            subject, memory["total"], max_memory, given=True, counted=f"in all (inputs and working memory, {estimated})"
        )
    if max_memory is None and available is not None and memory["work"] > available:
        raise MemoryLimitError(
            subject,
            memory["work"],
            available,
            given=False,
            counted=f"of working memory beyond its inputs ({estimated})",
            advice="run fewer participants per machine (docs/spmd.md)",
        )
