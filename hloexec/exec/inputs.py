"""Deterministic, realistic random inputs for a module's entry parameters.

Floats: standard normal (rounded to the parameter's type). Integers: small values in [0, 4), except
where the parameter is used as an index (dynamic-slice / dynamic-update-slice starts, gather / scatter
indices, possibly through converts, reshapes, broadcasts, fusions and calls): there it is drawn inside
the bound that use shows, so the program indexes what it would in real life. pred: fair coin.

`from_npz_void` is how every reader of saved arrays (run inputs, SPMD global inputs, compare's files) takes
the ml_dtypes arrays that plain np.savez stores as raw void.
"""
from __future__ import annotations

import numpy as np

from ..ir.module import Instruction, Module
from ..ir.shape import Shape

# Ops that carry an integer value through unchanged (for following an index back to its parameter).
_PASS_THROUGH = {"convert", "reshape", "bitcast", "broadcast", "copy", "slice", "transpose", "concatenate",
                 "dynamic-slice", "clamp", "get-tuple-element", "tuple", "opt-barrier", "optimization-barrier"}


def index_bounds(module: Module) -> dict[int, int]:
    """Entry parameter number -> largest valid index value, for parameters used as indices."""
    bounds: dict[int, int] = {}
    for number, param in enumerate(module.entry.parameters):
        if param.shape.is_tuple or not param.shape.element_type.is_integer:
            continue
        bound = _bound_of(param, depth=0)
        if bound is not None:
            bounds[param.parameter_number] = max(bound, 0)
    return bounds


def _bound_of(inst: Instruction, depth: int) -> int | None:
    if depth > 16:
        return None
    found = []
    for user in inst.users:
        for k, o in enumerate(user.operands):
            if o is not inst:
                continue
            try:
                b = _use_bound(user, k, depth)
            except (IndexError, TypeError):     # a malformed use bounds nothing: it is refused where prepared
                b = None
            if b is not None:
                found.append(b)
    return min(found) if found else None


def _use_bound(user: Instruction, k: int, depth: int) -> int | None:
    """The largest index value operand `k` of `user` may hold, or None where that use does not bound it."""
    op = user.opcode
    if op == "dynamic-slice" and k >= 1:
        return user.operands[0].shape.dims[k - 1] - user.attr("dynamic_slice_sizes")[k - 1]
    if op == "dynamic-update-slice" and k >= 2:
        return user.operands[0].shape.dims[k - 2] - user.operands[1].shape.dims[k - 2]
    if op == "gather" and k == 1:
        dims = user.operands[0].shape.dims
        return min((dims[d] - s for d, s in zip(range(len(dims)), user.attr("slice_sizes"))), default=0)
    if op in ("ragged-all-to-all", "ragged-all-to-all-start") and k >= 2:
        # offsets and sizes at most half the rows: every offset + size stays in range
        return min(user.operands[0].shape.dims[0], user.operands[1].shape.dims[0]) // 2
    if op == "scatter" and k == (len(user.operands) - 1) // 2:
        mapped = user.attr("scatter_dims_to_operand_dims")
        return min((user.operands[0].shape.dims[d] - 1 for d in mapped), default=0)
    if op in ("fusion", "call"):
        called = user.called.get("calls") or user.called.get("to_apply")
        if called is not None and k < len(called.parameters):
            return _bound_of(called.parameters[k], depth + 1)
        return None
    if op in _PASS_THROUGH:
        return _bound_of(user, depth + 1)
    return None


def random_inputs(module: Module, seed: int = 0, max_memory: int | None = None) -> list:
    """Random entry arguments; MemoryLimitError, before allocating, when they alone cannot fit."""
    check_inputs_fit(module.name, [p.shape for p in module.entry.parameters], max_memory)
    for p in module.entry.parameters:
        _check_representable(p)
    rng = np.random.default_rng(seed)
    bounds = index_bounds(module)
    return [random_value(p.shape, rng, bounds.get(p.parameter_number)) for p in module.entry.parameters]


def _check_representable(param: Instruction) -> None:
    """UnsupportedError for a parameter no numpy array can be made for (f32[2^62,0]: empty, but numpy multiplies
    the other dimensions, by the 16 bytes of the widest values random_value draws, and refuses)."""
    from ..errors import UnsupportedError
    for _, leaf in param.shape.leaves():
        extent = 16
        for d in leaf.dims:
            extent *= max(d, 1)
        if extent >= 1 << 63:
            raise UnsupportedError(f"parameter shape {leaf.to_text(layout=False)}: its dimensions multiply past what "
                                   "a numpy array can index (even with a zero dimension)", param)


def check_inputs_fit(module_name: str, shapes: list[Shape], max_memory: int | None = None) -> None:
    """MemoryLimitError when arrays of `shapes` exceed `max_memory` (None: MemAvailable): a module whose inputs
    cannot be made is refused before numpy tries (its MemoryError, or the OOM killer, says nothing useful)."""
    from ..errors import MemoryLimitError
    from .executor import available_memory
    need = sum(s.nbytes for s in shapes)
    limit = max_memory if max_memory is not None else available_memory()
    if limit is not None and need > limit:
        raise MemoryLimitError(module_name, need, limit, given=max_memory is not None)


def random_value(shape: Shape, rng: np.random.Generator, index_bound: int | None = None):
    if shape.is_tuple:
        return tuple(random_value(s, rng) for s in shape.tuple_shapes)
    etype = shape.element_type
    if etype.numpy is None:
        return np.zeros((0,), np.bool_)
    if etype.kind == "pred":
        return rng.integers(0, 2, size=shape.dims).astype(np.bool_)
    if etype.is_integer:
        high = 4 if index_bound is None else index_bound + 1
        return rng.integers(0, max(high, 1), size=shape.dims).astype(etype.numpy)
    if etype.kind == "complex":
        return (rng.standard_normal(shape.dims) + 1j * rng.standard_normal(shape.dims)).astype(etype.numpy)
    return rng.standard_normal(shape.dims, dtype=np.float32).astype(etype.numpy)


def from_npz_void(value, dtype):
    """`value` as `dtype` where np.savez wrote it as raw bytes: an ml_dtypes array (bf16, fp8, int4, ...) saved
    with plain np.savez comes back from np.load as void of its item size (|V2, |V1). Everything else, and void
    of another size, is returned unchanged (the caller's dtype check then says what is wrong)."""
    dtype = np.dtype(dtype)
    if isinstance(value, np.ndarray) and value.dtype.type is np.void and value.dtype.names is None \
            and value.dtype.itemsize == dtype.itemsize and dtype.type is not np.void:
        return value.view(dtype)
    return value

