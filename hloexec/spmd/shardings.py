"""Per-device values from global ones and back, by the shardings of a partitioned module.

Inputs are per-device lists, or global arrays split by the entry parameters' `sharding`
(`split_global`); outputs go back to global arrays by the output shardings (`assemble_global`): the
ROOT's `sharding`, else, for an output aliased to a parameter (input_output_alias), that parameter's.
`check_replicated` says where outputs that should agree across devices do not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ExecutionError
from ..exec.domains import input_domains
from ..exec.inputs import check_inputs_fit, from_npz_void, random_value
from ..ir.attributes import Sharding
from ..ir.module import Module
from ..ir.shape import Shape, array_shape
from ..ir.shardy import sharding_of
from ..ops.tiles import assemble_global, global_shape, split_global, tile_layout


# -- splitting and assembling by sharding ---------------------------------------------------------------
def parameter_shardings(module: Module) -> list[Sharding | None]:
    return [sharding_of(p) for p in module.entry.parameters]


def _root_shardings(module: Module, n: int) -> list[Sharding | None]:
    root = module.entry.root
    s = sharding_of(root)
    if s is None:
        return [None] * n
    return list(s.elements) if s.kind == "tuple" and root.shape.is_tuple else [s] * n


def output_shardings(module: Module, pre_partition: Module | None = None) -> list[Sharding | None]:
    """One per output leaf of a tuple ROOT (or one for an array ROOT): the ROOT's sharding, else the
    sharding of the parameter an output is aliased to (a donated buffer keeps its sharding), else the
    ROOT sharding of `pre_partition`, the same program before SPMD partitioning (XLA:CPU's optimized
    text drops the ROOT's sharding; jax's pre-optimization HLO keeps explicit out_shardings), else None."""
    root = module.entry.root
    n = len(root.shape.tuple_shapes) if root.shape.is_tuple else 1
    shardings = _root_shardings(module, n)
    params = parameter_shardings(module)
    for alias in module.attr("input_output_alias", ()) or ():
        index = alias.output_index[0] if alias.output_index else 0
        if len(alias.output_index) <= 1 and not alias.parameter_index and shardings[index] is None:
            shardings[index] = params[alias.parameter]
    if pre_partition is not None:
        before = _root_shardings(pre_partition, n)
        shardings = [s if s is not None else b for s, b in zip(shardings, before)]
    return shardings


def holders(module: Module, num_devices: int, output: int, index) -> list[int]:
    """The devices whose output `output` (of the flattened outputs, as assemble_outputs gives them) holds the
    global element `index`: its tile's devices (a replicated subgroup: all of them), a maximal sharding's device,
    every device for a replicated or unsharded one."""
    root = module.entry.root.shape
    outputs = list(root.tuple_shapes or ()) if root.is_tuple else [root]
    pairs: list[tuple[Sharding | None, Shape]] = []  # (sharding, per-device shape) per flattened output
    for s, shape in zip(output_shardings(module), outputs):
        elements = s.elements if s is not None and s.kind == "tuple" else [s] * len(list(shape.leaves()))
        pairs += zip(elements, [leaf for _, leaf in shape.leaves()])
    sharding, shape = pairs[output]
    if sharding is None or sharding.kind == "replicated":
        return list(range(num_devices))
    if sharding.kind == "maximal" and sharding.device is not None:
        return [sharding.device]
    _, devices = tile_layout(sharding, shape.rank)
    tile = tuple(int(i) // b for i, b in zip(index, shape.dims))
    return sorted(int(d) for d in np.ravel(devices[tile]))


def split_inputs(module: Module, global_inputs, num_devices: int, devices=None) -> list[list]:
    """Per-device input lists from global inputs, split by the entry parameters' shardings: for every
    device, or for `devices` only (a list of ids: their input lists, in that order)."""
    params = module.entry.parameters
    if len(global_inputs) != len(params):
        raise ExecutionError(f"{module.name} takes {len(params)} inputs, got {len(global_inputs)}")
    wanted = None if devices is None else set(devices)
    pieces = [
        split_global(v if p.shape.is_tuple else from_npz_void(v, p.shape.dtype), s, p.shape, num_devices, wanted)
        for v, s, p in zip(global_inputs, parameter_shardings(module), params)
    ]
    return [[piece[d] for piece in pieces] for d in (range(num_devices) if devices is None else devices)]


@dataclass(frozen=True)
class GlobalInputs:
    """Global entry arguments for `run_spmd`, split by the parameters' shardings where the participants
    run (a Ray worker splits them for its own devices): `values`, or random ones from `seed`
    (random_global_inputs: what `random_inputs` splits)."""

    values: list | None = None
    seed: int | None = None

    def split(self, module: Module, num_devices: int, devices=None) -> list[list]:
        values = self.values if self.values is not None else random_global_inputs(module, self.seed or 0)
        return split_inputs(module, values, num_devices, devices)


def assemble_outputs(module: Module, per_device_outputs: list, global_shapes=None, pre_partition: Module | None = None):
    """Global outputs (a tuple for a tuple ROOT) from per-device ones, by `output_shardings`;
    `global_shapes` (one per output) crops the padding of unevenly tiled outputs."""
    shardings = output_shardings(module, pre_partition)
    if not module.entry.root.shape.is_tuple:
        return assemble_global(per_device_outputs, shardings[0], global_shapes[0] if global_shapes else None)
    shapes = global_shapes or [None] * len(shardings)
    return tuple(
        assemble_global([out[i] for out in per_device_outputs], s, g) for i, (s, g) in enumerate(zip(shardings, shapes))
    )


def random_global_inputs(module: Module, seed: int = 0) -> list:
    """A random global value per entry parameter: the per-device shape times its sharding's tile counts."""
    rng = np.random.default_rng(seed)
    domains = input_domains(module)
    params = module.entry.parameters
    shapes = [
        p.shape if p.shape.is_tuple else array_shape(p.shape.element_type.name, global_shape(p.shape, s))
        for p, s in zip(params, parameter_shardings(module))
    ]
    check_inputs_fit(module.name, shapes)
    return [random_value(full, rng, domains.get(p.parameter_number)) for p, full in zip(params, shapes)]


def random_inputs(module: Module, num_devices: int, seed: int = 0) -> list[list]:
    """Per-device random inputs that are consistent: a global value per parameter, split by its sharding
    (replicated parameters shared), so outputs meant to be replicated can be checked for agreement."""
    return split_inputs(module, random_global_inputs(module, seed), num_devices)


# -- checks ---------------------------------------------------------------------------------------------
def agreeing_groups(sharding: Sharding | None, num_devices: int, rank: int) -> list[list[int]]:
    """Sets of devices that must hold the same value of an output with this sharding."""
    if sharding is None:
        return []
    if sharding.kind == "replicated":
        return [list(range(num_devices))]
    if (
        sharding.kind != "tiled"
        or len(sharding.tile_dims) == rank
        or any(kind != "replicated" for kind in sharding.last_tile_dims)
    ):
        return []
    _, devices = tile_layout(sharding, rank)
    by_tile = devices.reshape(math.prod(sharding.tile_dims[:rank]), -1)
    return [sorted(int(d) for d in row) for row in by_tile if len(row) > 1]


def check_replicated(module: Module, per_device_outputs: list, *, atol: float = 0.0) -> list[str]:
    """Where outputs meant to be equal across devices (by their output shardings) are not: one line per
    output and group, naming the devices and the largest difference. Empty when all agree.
    Outputs left on Ray workers (hloexec.exec.ray_runner.RayOutputs) are compared by the digests the
    workers make of them; only values whose digests differ are fetched, to measure the difference."""
    n = len(per_device_outputs)
    is_tuple = module.entry.root.shape.is_tuple
    digests = per_device_outputs.digests() if hasattr(per_device_outputs, "digests") else None
    first = (digests or per_device_outputs)[0]
    problems = []
    for i, sharding in enumerate(output_shardings(module)):
        pick = (lambda out: out[i]) if is_tuple else (lambda out: out)  # noqa: E731
        if sharding is None or isinstance(pick(first), tuple) or not hasattr(pick(first), "shape"):
            continue
        for group in agreeing_groups(sharding, n, len(pick(first).shape)):
            for d in group[1:]:
                if digests is not None and pick(digests[d]) == pick(digests[group[0]]):
                    continue
                diff = _max_diff(pick(per_device_outputs[group[0]]), pick(per_device_outputs[d]))
                if diff > atol:
                    problems.append(
                        f"output {i} ({sharding.text or sharding.kind}): device {d} differs from "
                        f"device {group[0]} by up to {diff:g}"
                    )
    return problems


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.dtype == np.bool_ or a.dtype.kind in "iu":
        return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
    x, y = a.astype(np.float64), b.astype(np.float64)
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    with np.errstate(invalid="ignore"):  # inf vs NaN: the difference is NaN, reported as such
        return float(np.max(np.where(same, 0.0, np.abs(x - y)), initial=0.0))
