"""Values by a sharding: a global value split into per-device tiles, and tiles assembled back.

Used by SPMD runs (hloexec.spmd: inputs split, outputs assembled by the parameters' and ROOT's
shardings) and by the manual regions of pre-partition modules (hloexec.ops.manual).
"""

from __future__ import annotations

import numpy as np

from ..errors import ExecutionError
from ..ir.attributes import Sharding
from ..ir.shape import Shape


def tile_layout(sharding: Sharding, rank: int):
    """(data tile counts, device-id array shaped by the full tile assignment)."""
    tile_dims = sharding.tile_dims
    extra = len(tile_dims) - rank
    if extra < 0 or extra != (len(sharding.last_tile_dims) or int(sharding.last_tile_dim_replicate)):
        raise ExecutionError(f"sharding {sharding.text} does not fit a rank-{rank} array")
    return tile_dims[:rank], np.asarray(sharding.devices).reshape(tile_dims)


def device_tile(value, sharding: Sharding | None, shape: Shape, device: int):
    """Device `device`'s piece of a global value (as split_global gives it), for one device alone."""
    if sharding is None or sharding.kind != "tiled":
        return value
    counts, devices = tile_layout(sharding, shape.rank)
    where = np.argwhere(devices == device)
    if not len(where):
        raise ExecutionError(f"sharding {sharding.text} gives device {device} no tile")
    tile = tuple(where[0][: shape.rank])
    value = np.asarray(value)
    piece = value[tuple(slice(i * b, (i + 1) * b) for i, b in zip(tile, shape.dims))]
    if piece.shape != shape.dims:  # past an uneven global dim: zero padding, as split_global's
        piece = np.pad(piece, [(0, b - p) for p, b in zip(piece.shape, shape.dims)])
    return np.ascontiguousarray(piece)


def split_global(value, sharding: Sharding | None, shape: Shape, num_devices: int, devices=None) -> list:
    """Per-device pieces of a global value: `shape` is the per-device (partitioned) parameter shape.

    Replicated, maximal and absent shardings give every device the same read-only object (no copy);
    tiled ones give device d its tile, zero-padded where the global dims do not divide evenly
    (XLA's shards all have the per-device shape, the last ones padded); the devices of a replicated
    subgroup share one read-only copy of their tile. `devices` (a set of ids): only their pieces are
    made, the others are None (a Ray worker splits for the participants it holds).
    """
    if shape.is_tuple:
        elements = (
            sharding.elements
            if sharding is not None and sharding.kind == "tuple"
            else [sharding] * len(shape.tuple_shapes)
        )
        per_element = [
            split_global(v, s, sub, num_devices, devices) for v, s, sub in zip(value, elements, shape.tuple_shapes)
        ]
        return [
            None if devices is not None and d not in devices else tuple(pieces[d] for pieces in per_element)
            for d in range(num_devices)
        ]
    if sharding is None or sharding.kind != "tiled":
        value = np.asarray(value)
        shared = (value if value.flags.c_contiguous else value.copy(order="C")).view()
        shared.flags.writeable = False  # one buffer for every device: a write would reach them all
        return [shared if devices is None or d in devices else None for d in range(num_devices)]
    counts, tile_devices = tile_layout(sharding, shape.rank)
    value = np.asarray(value)
    block = shape.dims
    padded = tuple(c * b for c, b in zip(counts, block))
    if any(g > p for g, p in zip(value.shape, padded)):
        raise ExecutionError(f"global shape {list(value.shape)} does not fit {list(counts)} tiles of {list(block)}")
    if value.shape != padded:
        value = np.pad(value, [(0, p - g) for g, p in zip(value.shape, padded)])
    pieces: list = [None] * num_devices
    tiles: dict[tuple, np.ndarray] = {}  # devices holding the same tile (replicated subgroups) share it
    for index in np.ndindex(tile_devices.shape):
        d = int(tile_devices[index])
        if d >= num_devices:
            raise ExecutionError(f"sharding {sharding.text} names device {d} of {num_devices}")
        if devices is not None and d not in devices:
            continue
        tile = index[: shape.rank]
        if tile not in tiles:
            piece = np.ascontiguousarray(value[tuple(slice(i * b, (i + 1) * b) for i, b in zip(tile, block))])
            if piece.base is not None:
                piece = piece.copy()  # not a view of the caller's array, which it may change
            piece.flags.writeable = False
            tiles[tile] = piece
        pieces[d] = tiles[tile]
    if any(p is None for d, p in enumerate(pieces) if devices is None or d in devices):
        raise ExecutionError(f"sharding {sharding.text} leaves devices without a tile")
    return pieces


def assemble_global(per_device: list, sharding: Sharding | None, global_shape=None):
    """The global value from per-device ones: tiles put in place (padding cropped to `global_shape`,
    whose default is the tiles' full extent); replicated and absent: device 0's; maximal: its device's."""
    if sharding is not None and sharding.kind == "tuple":
        shapes = global_shape if global_shape is not None else [None] * len(sharding.elements)
        return tuple(
            assemble_global([v[i] for v in per_device], s, g) for i, (s, g) in enumerate(zip(sharding.elements, shapes))
        )
    if sharding is None or sharding.kind != "tiled":
        return per_device[(sharding.device or 0) if sharding is not None and sharding.kind == "maximal" else 0]
    first = per_device[0]
    counts, devices = tile_layout(sharding, first.ndim)
    if devices.size and devices.max() >= len(per_device):
        raise ExecutionError(
            f"sharding {sharding.text} names device {int(devices.max())}; there are {len(per_device)} values"
        )
    block = first.shape
    out = np.empty(tuple(c * b for c, b in zip(counts, block)), first.dtype)
    for index in np.ndindex(devices.shape):
        window = tuple(slice(i * b, (i + 1) * b) for i, b in zip(index, block))
        out[window] = per_device[int(devices[index])]
    if global_shape is not None:
        out = out[tuple(slice(0, g) for g in global_shape)]
    return out


def global_shape(shape: Shape, sharding: Sharding | None) -> tuple[int, ...]:
    """The dims a per-device array shape covers globally (tile counts x block)."""
    if sharding is None or sharding.kind != "tiled":
        return shape.dims
    counts, _ = tile_layout(sharding, shape.rank)
    return tuple(c * b for c, b in zip(counts, shape.dims))
