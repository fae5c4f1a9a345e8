"""Collectives: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute/-broadcast.

Each is written as one `exchange` between the participants of a group (see
hloexec.exec.communicators): every participant addresses payloads to global device ids
(replica * num_partitions + partition) and receives one payload per source. Group membership
follows XLA's GetCollectiveOpGroupMode / GetParticipatingDevicesGroups
(xla/service/collective_ops_utils.cc): no channel_id -> cross-replica; channel_id and no
use_global_device_ids attribute in the op's kind (all-to-all, collective-permute,
collective-broadcast) -> cross-partition; use_global_device_ids=false -> cross-replica-and-partition
(groups of replica ids, every partition of each); true -> flattened ids.

Async forms: all-reduce-start has all-reduce's shape; all-gather-start and collective-permute-start
return (operands, results[, u32 contexts]) and their -done takes element 1. Participants and group
positions are read from ctx.device at run time (SPMD participants share one prepared plan).
"""

from __future__ import annotations

import weakref
from collections import deque

import numpy as np

from ..errors import ExecutionError, UnsupportedError
from ..ir.attributes import decode_pairs
from .common import TOKEN, as_tuple, binary_kind, contig, required, scalar, ufunc_for, zeros_of
from .registry import op


# Collectives without a use_global_device_ids field: with a channel_id they are cross-partition.
_CHANNEL_MEANS_PARTITIONS = (
    "all-to-all",
    "ragged-all-to-all",
    "collective-permute",
    "collective-broadcast",
    "send",
    "recv",
)


def group_mode(inst) -> str:
    if "channel_id" not in inst.attrs:
        if inst.attr("use_global_device_ids", False):
            raise UnsupportedError("use_global_device_ids=true needs a channel_id (XLA rejects the combination)", inst)
        return "cross_replica"
    if inst.opcode.startswith(_CHANNEL_MEANS_PARTITIONS):
        return "cross_partition"
    return "flattened" if inst.attr("use_global_device_ids", False) else "cross_replica_and_partition"


def participants(inst, device) -> list[int]:
    """Global device ids of the group this device belongs to, in group order (its rank is its position)."""
    groups = [list(g) for g in inst.attr("replica_groups").groups] if "replica_groups" in inst.attrs else []
    mode = group_mode(inst)
    P, R = device.num_partitions, device.num_replicas
    me_r, me_p = device.replica_id, device.partition_id
    if mode == "flattened":
        if not groups:
            raise UnsupportedError("replica groups cannot be empty with use_global_device_ids=true", inst)
        return _find(inst, groups, device.global_id)
    if mode == "cross_partition":
        return [me_r * P + p for p in _find(inst, groups or [list(range(P))], me_p)]
    replicas = _find(inst, groups or [list(range(R))], me_r)
    if mode == "cross_replica":
        return [r * P + me_p for r in replicas]
    return [r * P + p for r in replicas for p in range(P)]  # cross-replica-and-partition


def groups_of(inst, devices) -> list[list[int]]:
    """The groups of collective `inst` among `devices` (Devices), sorted; each asked of its first member only
    (asking every device made one group of N participants cost N^2). A device in no group takes no part."""
    groups: list[list[int]] = []
    seen: set[int] = set()
    for device in devices:
        if device.global_id in seen:
            continue
        try:
            group = participants(inst, device)
        except ExecutionError:
            continue
        groups.append(group)
        seen.update(group)
    return sorted(groups)


def _find(inst, groups, member) -> list[int]:
    found = [g for g in groups if member in g]
    if len(found) != 1:
        raise ExecutionError(
            f"id {member} appears in {len(found)} replica groups of %{inst.name} "
            f"({inst.attrs.get('replica_groups')}); XLA needs exactly one"
        )
    return found[0]


def elementwise_fold(inst, ctx):
    """values -> ((v0 op v1) op v2) ... elementwise, in group order, for the scalar computation `to_apply`:
    a ufunc accumulating in place when it is one, else the computation called per element."""
    comp = inst.called["to_apply"]
    kind = binary_kind(comp)
    if kind not in (None, "replace"):

        def fold(values):
            uf = ufunc_for(kind, values[0].dtype)
            acc = np.array(values[0], order="C")  # a copy: payloads are other participants' buffers
            for v in values[1:]:
                uf(acc, v, out=acc)
            return acc

        return fold
    scalar_reducer = ctx.computation(comp)

    def per_element(values):
        out = np.empty_like(values[0], order="C")
        for i in np.ndindex(out.shape):
            acc = scalar(values[0][i])
            for v in values[1:]:
                acc = as_tuple(scalar_reducer(acc, scalar(v[i])))[0]  # a reducer may return a 1-tuple
            out[i] = acc
        return out

    return per_element


def _start_form(inst, xs, outs):
    """A collective's value: its results, or for a -start with a tuple (operands, results, contexts...)."""
    shape = inst.shape
    operands = inst.operands[0].shape if len(xs) == 1 else None
    is_start_tuple = (
        inst.opcode.endswith("-start")
        and shape.is_tuple
        and len(shape.tuple_shapes) >= 2
        and (
            shape.tuple_shapes[0].same_dims_and_type(operands)
            if operands is not None
            else shape.tuple_shapes[0].is_tuple
        )
    )
    if not is_start_tuple:
        return outs if shape.is_tuple else outs[0]
    pack = (lambda vs: vs[0]) if len(xs) == 1 else tuple
    contexts = tuple(zeros_of(s) for s in inst.shape.tuple_shapes[2:])
    return (pack(xs), pack(outs)) + contexts


@op("all-reduce", "all-reduce-start", kernel="python", notes="reducer folded over the group in group order")
def all_reduce(inst, ctx):
    fold = elementwise_fold(inst, ctx)

    def run(*xs):
        device = ctx.device
        group = participants(inst, device)
        communicator = device.communicator
        got = communicator.exchange(inst, {d: xs for d in group}, group)
        if len(group) == 1 or not getattr(communicator, "distinct_participants", False):
            outs = tuple(fold([g[i] for g in got]) for i in range(len(xs)))
            return _start_form(inst, xs, outs)  # all-reduce-start may be written (operand, result)
        # Every participant would fold the same values: each folds 1/n of the elements instead (the same
        # order per element), and a second exchange gathers the folded pieces.
        n, rank = len(group), group.index(device.global_id)
        pieces = []
        for i, x in enumerate(xs):
            bounds = np.linspace(0, x.size, n + 1).astype(np.int64)
            pieces.append(fold([g[i].reshape(-1)[bounds[rank] : bounds[rank + 1]] for g in got]))
        folded = communicator.exchange(inst, {d: tuple(pieces) for d in group}, group)
        outs = tuple(np.concatenate([f[i] for f in folded]).reshape(x.shape) for i, x in enumerate(xs))
        return _start_form(inst, xs, outs)

    return run


def _dimension(inst) -> int:
    """The one dimension of `dimensions={d}` (all-gather, reduce-scatter), which XLA's parser requires."""
    dims = inst.attr("dimensions")
    if not dims or len(dims) != 1 or dims[0] < 0:
        raise inst.parse_error(
            f"{inst.opcode} needs dimensions={{d}} (one non-negative dimension), has "
            f"{inst.attrs.get('dimensions', 'none')}"
        )
    return dims[0]


@op(
    "all-gather",
    "all-gather-start",
    kernel="python",
    notes="operands concatenated along `dimensions` in "
    "group order; an operand with no such dimension (pytorch/xla's scalar ordering token, which XLA's verifier "
    "rejects) passes through",
)
def all_gather(inst, ctx):
    dim = _dimension(inst)
    gathered = [o.shape.rank > dim for o in inst.operands]
    needs = _gathered_group_sizes(inst, dim, gathered)

    def run(*xs):
        group = participants(inst, ctx.device)
        if needs and needs != {len(group)}:
            raise ExecutionError(
                f"%{inst.name}: its shape {inst.shape.to_text(layout=False)} gathers from a group of "
                f"{' or '.join(map(str, sorted(needs)))} participants, this run's group has {len(group)}: run every "
                f"participant (--spmd, with --replicas / --partitions if the module's header does not say them)"
            )
        sends = tuple(x for x, g in zip(xs, gathered) if g)
        got = iter(zip(*ctx.device.communicator.exchange(inst, {d: sends for d in group}, group)))
        outs = tuple(np.concatenate(next(got), axis=dim) if g else x for x, g in zip(xs, gathered))
        return _start_form(inst, xs, outs)

    return run


def _gathered_group_sizes(inst, dim: int, gathered: list[bool]) -> set[int]:
    """The group sizes the written result implies: each gathered result's dimension `dim` over its operand's
    (XLA's shape rule makes them equal to the group's size); empty where the shapes do not line up."""
    shape = inst.shape
    if inst.opcode == "all-gather-start" and shape.is_tuple and len(shape.tuple_shapes) >= 2:
        shape = shape.tuple_shapes[1]
    results = list(shape.tuple_shapes) if shape.is_tuple else [shape]
    if len(results) != len(inst.operands):
        return set()
    return {
        r.dims[dim] // o.shape.dims[dim]
        for o, r, g in zip(inst.operands, results, gathered)
        if g and not r.is_tuple and r.rank > dim and o.shape.dims[dim] and r.dims[dim] % o.shape.dims[dim] == 0
    }


def _check_split(inst, xs, dim: int, n: int) -> None:
    """ExecutionError when dimension `dim` of the arrays `xs` does not split into the group's `n` blocks (XLA's
    shape rules would reject the instruction for its replica groups)."""
    if any(x.shape[dim] % n for x in xs):
        raise ExecutionError(
            f"%{inst.name}: dimension {dim} of {[list(x.shape) for x in xs]} does not split "
            f"into {n} blocks (the group's size)"
        )


@op(
    "reduce-scatter",
    kernel="python",
    notes="participant k gets block k of the reduced operand; an operand "
    "with no scatter dimension (the scalar ordering token pytorch/xla adds beside the data, which XLA's verifier "
    "rejects) is reduced whole",
)
def reduce_scatter(inst, ctx):
    dim = _dimension(inst)
    fold = elementwise_fold(inst, ctx)
    scattered = [o.shape.rank > dim for o in inst.operands]

    def run(*xs):
        group = participants(inst, ctx.device)
        n = len(group)
        _check_split(inst, [x for split, x in zip(scattered, xs) if split], dim, n)
        blocks = [np.split(x, n, axis=dim) if split else [x] * n for split, x in zip(scattered, xs)]
        sends = {d: tuple(b[k] for b in blocks) for k, d in enumerate(group)}
        got = ctx.device.communicator.exchange(inst, sends, group)
        outs = tuple(fold([g[i] for g in got]) for i in range(len(xs)))
        return outs if inst.shape.is_tuple else outs[0]

    return run


@op(
    "all-to-all",
    kernel="python",
    notes="array form splits and concatenates along `dimensions`; tuple form "
    "sends operand j to participant j and returns what participant i sent as element i",
)
def all_to_all(inst, ctx):
    dims = inst.attr("dimensions", ())

    def run(*xs):
        group = participants(inst, ctx.device)
        n = len(group)
        if dims:
            d = dims[0]
            _check_split(inst, xs[:1], d, n)
            sends = {dest: block for dest, block in zip(group, np.split(xs[0], n, axis=d))}
            return np.concatenate(ctx.device.communicator.exchange(inst, sends, group), axis=d)
        if len(xs) != n:
            raise ExecutionError(f"tuple all-to-all %{inst.name} has {len(xs)} operands for a group of {n}")
        sends = {dest: xs[k] for k, dest in enumerate(group)}
        return tuple(contig(g) for g in ctx.device.communicator.exchange(inst, sends, group))

    return run


def pair_peers(inst, pairs, device) -> tuple[list[int], list[int]]:
    """(global ids this device sends to, global ids it receives from) by source-target `pairs`, which name
    partitions (cross-partition) or replicas (cross-replica) of this device's other id."""
    me = device.global_id
    if group_mode(inst) == "cross_partition":
        to_global = lambda p: device.replica_id * device.num_partitions + p  # noqa: E731
    else:
        to_global = lambda r: r * device.num_partitions + device.partition_id  # noqa: E731
    return (
        [to_global(t) for s, t in pairs if to_global(s) == me],
        [to_global(s) for s, t in pairs if to_global(t) == me],
    )


@op(
    "ragged-all-to-all",
    kernel="python",
    notes="(input, output, input_offsets, send_sizes, output_offsets, "
    "recv_sizes), offsets/sizes rank 1 of length group size x k: update j*k+i sends input rows [input_offsets, "
    "+send_sizes) to participant j, which writes them at its rows [output_offsets, +send_sizes) (the sender's "
    "offsets and sizes: recv_sizes, which should agree, is not read, as in XLA-GPU's memcpy ragged-all-to-all); "
    "the rest of the result is `output`; rows out of range are an error",
)
def ragged_all_to_all(inst, ctx):
    if len(inst.operands) != 6:
        raise UnsupportedError(f"ragged-all-to-all with {len(inst.operands)} operands (6 expected)", inst)
    if any(o.shape.is_tuple or o.shape.rank != 1 for o in inst.operands[2:]):
        raise UnsupportedError("ragged-all-to-all offsets/sizes that are not rank 1", inst)

    def run(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes):
        group = participants(inst, ctx.device)
        n, total = len(group), input_offsets.shape[0]
        if total % n:
            raise ExecutionError(f"%{inst.name}: {total} offsets for a group of {n} participants")
        k = total // n
        sends = {}
        for j, dest in enumerate(group):
            updates = []
            for u in range(j * k, (j + 1) * k):
                start, size, at = int(input_offsets[u]), int(send_sizes[u]), int(output_offsets[u])
                if size < 0 or start < 0 or start + size > operand.shape[0] or at < 0 or at + size > output.shape[0]:
                    raise ExecutionError(
                        f"%{inst.name} update {u}: rows [{start}, {start + size}) of the input "
                        f"({operand.shape[0]} rows) to rows [{at}, {at + size}) of the output "
                        f"({output.shape[0]} rows) are out of range"
                    )
                updates.append((at, operand[start : start + size]))
            sends[dest] = updates
        result = np.array(output, order="C")
        for updates in ctx.device.communicator.exchange(inst, sends, group):
            for at, rows in updates:
                result[at : at + len(rows)] = rows
        return result

    return run


@op(
    "collective-permute",
    "collective-permute-start",
    kernel="python",
    notes="a device that is no target receives zeros; several operands (combined form) permute together",
)
def collective_permute(inst, ctx):
    if "slice_sizes" in inst.attrs:
        raise UnsupportedError("in-place collective-permute (with slice_sizes) is not simulated", inst)
    pairs = required(inst, "source_target_pairs")

    def run(*xs):
        device = ctx.device
        targets, sources = pair_peers(inst, pairs, device)
        got = device.communicator.exchange(inst, {t: xs for t in targets}, sources)
        outs = got[0] if got else tuple(np.zeros_like(x) for x in xs)
        if inst.opcode == "collective-permute":
            return tuple(outs) if inst.shape.is_tuple else outs[0]
        return _start_form(inst, xs, tuple(outs))

    return run


@op("collective-broadcast", kernel="python", notes="every participant gets its group's first participant's value")
def collective_broadcast(inst, ctx):
    def run(*xs):
        group = participants(inst, ctx.device)
        sends = {d: xs for d in group} if ctx.device.global_id == group[0] else {}
        outs = ctx.device.communicator.exchange(inst, sends, [group[0]])[0]
        return tuple(outs) if inst.shape.is_tuple else outs[0]

    return run


@op(
    "all-reduce-done",
    "all-gather-done",
    "collective-permute-done",
    kernel="python",
    notes="element 1 of a (operands, results, ...) start; identity otherwise",
)
def collective_done(inst, ctx):
    start = inst.operands[0].shape
    if start.is_tuple and not start.same_dims_and_type(inst.shape):
        return lambda state: state[1]
    return lambda x: x


# -- send / recv between participants -------------------------------------------------------------------
# A device-to-device send and the recv of the same channel_id move data along source-target pairs that XLA
# keeps in a frontend attribute (jax's psend/precv; XLA's CollectivePermuteDecomposer). Every participant
# runs the same program, so each send is one exchange -- post to its targets, take from its source -- and
# the recv-done of that channel hands over what came in.
SEND_RECV_PAIRS = "_xla_send_recv_source_target_pairs"
_CHANNELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> {channel_id: {opcodes}}
_RECEIVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # ctx -> {(channel, device): deque}


def _send_recv_pairs(inst):
    if inst.attr("is_host_transfer", False):
        raise UnsupportedError(
            f"{inst.opcode} with is_host_transfer=true talks to the host, which an offline run does not have", inst
        )
    raw = (inst.attr("frontend_attributes") or {}).get(SEND_RECV_PAIRS)
    if raw is None:
        raise UnsupportedError(
            f"{inst.opcode} without the frontend attribute {SEND_RECV_PAIRS}: the module does "
            "not say which device is its peer",
            inst,
        )
    try:
        return decode_pairs(raw)
    except ValueError as e:
        raise inst.attr_error("frontend_attributes", f"bad {SEND_RECV_PAIRS} {raw!r}: {e}") from None


def _channel_opcodes(inst, ctx) -> set:
    """The opcodes of the instructions sharing `inst`'s channel_id in the module."""
    module = ctx.module
    channels = _CHANNELS.get(module)
    if channels is None:
        channels = _CHANNELS[module] = {}
        for i in module.instructions():
            if "channel_id" in i.attrs:
                channels.setdefault(i.attr("channel_id"), set()).add(i.opcode)
    return channels.get(inst.attr("channel_id"), set())


@op(
    "send",
    kernel="python",
    notes="device to device by the _xla_send_recv_source_target_pairs frontend "
    "attribute (ids as collective-permute's): the exchange happens at the send, the recv-done of the same "
    "channel_id returns what arrived (zeros on a device no pair targets); is_host_transfer: unsupported",
)
def send(inst, ctx):
    pairs, channel = _send_recv_pairs(inst), inst.attr("channel_id")
    received = _RECEIVED.setdefault(ctx, {})
    has_recv = "recv" in _channel_opcodes(inst, ctx)
    context = (
        zeros_of(inst.shape.tuple_shapes[1]) if inst.shape.is_tuple and len(inst.shape.tuple_shapes) == 3 else None
    )
    if context is None:
        raise UnsupportedError(f"send of shape {inst.shape.to_text(False)}: expected (data, u32[], token[])", inst)

    def run(x, token):
        device = ctx.device
        if has_recv:
            targets, sources = pair_peers(inst, pairs, device)
            got = device.communicator.exchange(inst, {t: x for t in targets}, sources)
            if got:
                received.setdefault((channel, device.global_id), deque()).append(got[0])
        return (x, context, TOKEN)

    return run


@op("send-done", kernel="python")
def send_done(inst, ctx):
    return lambda state: TOKEN


@op("recv", kernel="python", notes="its data arrives at the recv-done (see send)")
def recv(inst, ctx):
    _send_recv_pairs(inst)
    if "send" not in _channel_opcodes(inst, ctx):
        raise UnsupportedError(
            f"recv (channel_id={inst.attr('channel_id')}) has no send of that channel in this "
            "module: its sender is another program (an MPMD pipeline stage), which hloexec does "
            "not run beside it",
            inst,
        )
    placeholder = zeros_of(inst.shape)
    return lambda token: placeholder


@op("recv-done", kernel="python")
def recv_done(inst, ctx):
    start = inst.operands[0] if inst.operands else None
    if start is None or start.opcode != "recv":
        raise UnsupportedError("recv-done whose operand is not a recv", inst)
    pairs, channel = _send_recv_pairs(start), start.attr("channel_id")
    received = _RECEIVED.setdefault(ctx, {})
    data_shape = inst.shape.tuple_shapes[0] if inst.shape.is_tuple else None
    if data_shape is None:
        raise UnsupportedError(f"recv-done of shape {inst.shape.to_text(False)}: expected (data, token[])", inst)

    def run(state):
        device = ctx.device
        _, sources = pair_peers(start, pairs, device)
        if not sources:
            return (zeros_of(data_shape), TOKEN)
        queue = received.get((channel, device.global_id))
        if not queue:
            raise ExecutionError(
                f"%{inst.name} (channel_id={channel}) on device {device.global_id} runs before "
                "the send of its channel: hloexec exchanges a send/recv pair at the send"
            )
        return (queue.popleft(), TOKEN)

    return run
