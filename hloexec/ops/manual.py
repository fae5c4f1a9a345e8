"""Manual regions of pre-partition modules: the custom-calls that enter and leave them.

A pre-partition module (jax's `lowered.as_text(dialect="hlo")`, pytorch/xla's SPMD IR) is the global program;
a `shard_map` in it is a manually partitioned region: its values are per-device tiles, and the collectives in
it are explicit. GSPMD writes the region between `SPMDFullToShardShape` (global value -> this device's tile, by
the operand's sharding) and `SPMDShardToFullShape` (tiles -> global value, by its own sharding); Shardy between
`xla.sdy.GlobalToLocalShape` and `xla.sdy.LocalToGlobalShape`, tiled by their `xla.sdy.in_shardings` /
`xla.sdy.out_shardings` frontend attributes along their `xla.sdy.manual_axes`.

hloexec runs such a module with every device as a participant (hloexec.spmd.manual): each computes the global
program on the global inputs, enters a region with its own tile, runs the region (collectives between the
participants) and leaves it by exchanging tiles with all participants and assembling the global value. Devices
that share a tile (axes the region is not manual along) compute the same region values.
"""

from __future__ import annotations

import numpy as np

from ..errors import ExecutionError, UnsupportedError
from ..ir.attributes import Sharding
from ..ir.module import Module
from ..ir.shardy import ShardyError, decode_manual_axes, decode_sharding_attr, module_meshes, sharding_of
from .custom_call import register_custom_call, target_of
from .tiles import assemble_global, device_tile, tile_layout

ENTERS = ("SPMDFullToShardShape", "xla.sdy.GlobalToLocalShape")


def has_manual_regions(module: Module) -> bool:
    """Whether the module enters a manual region (SPMDFullToShardShape, xla.sdy.GlobalToLocalShape)."""
    if "custom-call" not in module.opcode_counts():
        return False
    return any(i.opcode == "custom-call" and target_of(i) in ENTERS for i in module.instructions())


def _leaves(shape):
    return list(shape.tuple_shapes) if shape.is_tuple else [shape]


def _region_shardings(inst, key: str | None, n: int) -> list:
    """One sharding per operand (entering) or result (leaving): GSPMD's from the operand (entering) or the
    instruction itself (leaving); Shardy's from frontend attribute `key`, kept to the manual axes."""
    if key is None:
        # as parsed: a plan may have inlined the computation, the caller's values (without the parameters'
        # shardings) in place of its parameters
        written = inst.computation.by_name.get(inst.name, inst)
        s = sharding_of(written.operands[0] if target_of(inst) in ENTERS else written)
        shardings = [s if s is not None else Sharding("replicated", text="no sharding")]
    else:
        attrs = inst.attr("frontend_attributes") or {}
        if key not in attrs or "xla.sdy.manual_axes" not in attrs:
            raise UnsupportedError(
                f"{target_of(inst)} without the frontend attributes {key} and xla.sdy.manual_axes", inst
            )
        try:
            s = decode_sharding_attr(
                attrs[key],
                module_meshes(inst.computation.module),
                only=decode_manual_axes(attrs["xla.sdy.manual_axes"]),
            )
        except ShardyError as e:
            raise inst.attr_error("frontend_attributes", f"bad {key}: {e}") from None
        shardings = list(s.elements) if s.kind == "tuple" else [s]
    if len(shardings) != n:
        raise UnsupportedError(f"{target_of(inst)} with {n} values and {len(shardings)} shardings", inst)
    return shardings


def _check_tiles(inst, sharding, local, full) -> None:
    """The region's local shape must be the tile shape of the global one (else hloexec splits the wrong way)."""
    if sharding.kind == "tiled":
        try:
            counts, _ = tile_layout(sharding, full.rank)
        except ExecutionError as e:  # a sharding of another rank: said with the instruction
            raise UnsupportedError(f"{target_of(inst)}: {e}", inst) from None
        tile = tuple(-(-d // c) for d, c in zip(full.dims, counts))
    else:
        tile = full.dims
    if tile != local.dims:
        raise UnsupportedError(
            f"{target_of(inst)}: {full.to_text(False)} in tiles of {sharding.text or sharding.kind}"
            f" is {list(tile)} per device, the region's value is {local.to_text(False)}",
            inst,
        )


def _untiled(shardings) -> bool:
    """No value is tiled (one device, replicated): entering and leaving the region change nothing."""
    return all(s.kind != "tiled" for s in shardings)


def _identity(*xs):
    return xs[0] if len(xs) == 1 else xs


def enter(inst, ctx):
    """Enters a manual region (shard_map) of a pre-partition module: each device takes its tile of the global
    value(s), by the operand's sharding (GSPMD) or by xla.sdy.in_shardings along xla.sdy.manual_axes (Shardy);
    every device runs as a participant (docs/spmd.md, "Pre-partition modules")."""
    fulls = [o.shape for o in inst.operands]
    locals_ = _leaves(inst.shape)
    key = "xla.sdy.in_shardings" if target_of(inst).startswith("xla.sdy.") else None
    shardings = _region_shardings(inst, key, len(fulls))
    if len(locals_) != len(fulls):
        raise UnsupportedError(f"{target_of(inst)} with {len(fulls)} operands and {len(locals_)} results", inst)
    for s, local, full in zip(shardings, locals_, fulls):
        _check_tiles(inst, s, local, full)
    if _untiled(shardings):
        return _identity

    def run(*xs):
        d = ctx.device.global_id
        tiles = tuple(device_tile(x, s, local, d) for x, s, local in zip(xs, shardings, locals_))
        return tiles if inst.shape.is_tuple else tiles[0]

    return run


def leave(inst, ctx):
    """Leaves a manual region: the devices exchange their tiles and each assembles the global value(s), by the
    instruction's sharding (GSPMD) or by xla.sdy.out_shardings along xla.sdy.manual_axes (Shardy)."""
    fulls = _leaves(inst.shape)
    key = "xla.sdy.out_shardings" if target_of(inst).startswith("xla.sdy.") else None
    shardings = _region_shardings(inst, key, len(fulls))
    if len(inst.operands) != len(fulls):
        raise UnsupportedError(f"{target_of(inst)} with {len(inst.operands)} operands and {len(fulls)} results", inst)
    for s, o, full in zip(shardings, inst.operands, fulls):
        _check_tiles(inst, s, o.shape, full)
    if _untiled(shardings):
        return _identity

    def run(*xs):
        device = ctx.device
        everyone = list(range(device.num_replicas * device.num_partitions))
        got = device.communicator.exchange(inst, {d: xs for d in everyone}, everyone)
        try:
            values = tuple(
                np.ascontiguousarray(assemble_global([g[i] for g in got], s, full.dims))
                for i, (s, full) in enumerate(zip(shardings, fulls))
            )
        except ExecutionError as e:  # a sharding naming more devices than the run has
            raise ExecutionError(f"%{inst.name} = custom-call {target_of(inst)!r}: {e}") from None
        return values if inst.shape.is_tuple else values[0]

    return run


# GSPMD's markers take one value, Shardy's one or more
register_custom_call("SPMDFullToShardShape", enter, operands=1, returns="array")
register_custom_call("SPMDShardToFullShape", leave, operands=1, returns="array")
register_custom_call("xla.sdy.GlobalToLocalShape", enter, operands=range(1, 1 << 31))
register_custom_call("xla.sdy.LocalToGlobalShape", leave, operands=range(1, 1 << 31))
