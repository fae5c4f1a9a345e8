"""The decoded values of HLO attributes: plain frozen dataclasses (slices, windows, dimension numbers, shardings,
aliases, replica groups)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SliceDim:
    start: int
    limit: int
    stride: int = 1


@dataclass(frozen=True, slots=True)
class PadDim:
    low: int
    high: int
    interior: int = 0


@dataclass(frozen=True, slots=True)
class WindowDim:
    size: int
    stride: int = 1
    pad_low: int = 0
    pad_high: int = 0
    base_dilation: int = 1  # lhs_dilate
    window_dilation: int = 1  # rhs_dilate
    reversal: bool = False  # rhs_reversal


@dataclass(frozen=True, slots=True)
class ConvDims:
    """dim_labels such as b01f_01io->b01f, as dimension numbers."""

    input_batch: int
    input_feature: int
    input_spatial: tuple[int, ...]
    kernel_input_feature: int
    kernel_output_feature: int
    kernel_spatial: tuple[int, ...]
    output_batch: int
    output_feature: int
    output_spatial: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DotDims:
    lhs_batch: tuple[int, ...] = ()
    rhs_batch: tuple[int, ...] = ()
    lhs_contracting: tuple[int, ...] = ()
    rhs_contracting: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GatherDims:
    offset_dims: tuple[int, ...]
    collapsed_slice_dims: tuple[int, ...]
    start_index_map: tuple[int, ...]
    index_vector_dim: int
    slice_sizes: tuple[int, ...]
    operand_batching_dims: tuple[int, ...] = ()
    start_indices_batching_dims: tuple[int, ...] = ()
    indices_are_sorted: bool = False


@dataclass(frozen=True, slots=True)
class ScatterDims:
    update_window_dims: tuple[int, ...]
    inserted_window_dims: tuple[int, ...]
    scatter_dims_to_operand_dims: tuple[int, ...]
    index_vector_dim: int
    input_batching_dims: tuple[int, ...] = ()
    scatter_indices_batching_dims: tuple[int, ...] = ()
    indices_are_sorted: bool = False
    unique_indices: bool = False


@dataclass(frozen=True, slots=True)
class Sharding:
    """An HloSharding. kind: replicated | maximal | tiled | manual | unknown | tuple.

    For `tiled`: `tile_dims` is the tile assignment shape (including a trailing replication dim when
    `last_tile_dim_replicate`, or the dims named by `last_tile_dims`), `devices` the device ids in
    row-major order over `tile_dims` (iota forms expanded).
    """

    kind: str
    tile_dims: tuple[int, ...] = ()
    devices: tuple[int, ...] = ()
    last_tile_dim_replicate: bool = False
    last_tile_dims: tuple[str, ...] = ()  # subgroup types: manual, replicated, ...
    device: int | None = None  # for maximal
    elements: tuple[Sharding, ...] = ()  # for tuple
    text: str = ""


@dataclass(frozen=True, slots=True)
class OutputOperandAlias:
    output_index: tuple[int, ...]
    operand: int
    operand_index: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class InputOutputAlias:
    output_index: tuple[int, ...]
    parameter: int
    parameter_index: tuple[int, ...]
    kind: str = "may-alias"


@dataclass(frozen=True, slots=True)
class ReplicaGroups:
    """Replica groups; the iota form `[4,2]<=[2,4]T(1,0)` is expanded into `groups`."""

    groups: tuple[tuple[int, ...], ...] = field(default=())
    text: str = ""
