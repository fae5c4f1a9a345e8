"""Deterministic, realistic random inputs for a module's entry parameters.

Floats: standard normal (rounded to the parameter's type). Integers: small values in [0, 4). pred: fair coin.
Where the module's uses of a parameter imply a domain (domains.py: an index drawn inside its bound, a value
reaching sqrt / log / a divisor drawn positive, a mask drawn 0 or 1), it is drawn there, so the program sees
what it would in real life.

`from_npz_void` is how every reader of saved arrays (run inputs, SPMD global inputs, compare's files) takes
the ml_dtypes arrays that plain np.savez stores as raw void.
"""

from __future__ import annotations

import numpy as np

from ..errors import ExecutionError, MemoryLimitError, UnsupportedError
from ..ir.module import Instruction, Module
from ..options import available_memory
from ..ir.shape import Shape
from .domains import Domain, input_domains


def random_inputs(
    module: Module, seed: int = 0, domains: dict[int, Domain] | None = None, max_memory: int | None = None
) -> list:
    """One random value per entry parameter (`domains`: input_domains(module), when the caller has them);
    MemoryLimitError, before allocating, when they alone cannot fit."""
    if not isinstance(seed, (int, np.integer)) or seed < 0:  # numpy's own error would not say which argument
        raise ExecutionError(f"random inputs of {module.name}: the seed must be an integer >= 0, got {seed!r}")
    check_inputs_fit(module.name, [p.shape for p in module.entry.parameters], max_memory)
    for p in module.entry.parameters:
        _check_representable(p)
    rng = np.random.default_rng(seed)
    domains = input_domains(module) if domains is None else domains
    return [random_value(p.shape, rng, domains.get(p.parameter_number)) for p in module.entry.parameters]


def _check_representable(param: Instruction) -> None:
    """UnsupportedError for a parameter no numpy array can be made for (f32[2^62,0]: empty, but numpy multiplies
    the other dimensions, by the 16 bytes of the widest values random_value draws, and refuses)."""
    for _, leaf in param.shape.leaves():
        extent = 16
        for d in leaf.dims:
            extent *= max(d, 1)
        if extent >= 1 << 63:
            raise UnsupportedError(
                f"parameter shape {leaf.to_text(layout=False)}: its dimensions multiply past what "
                "a numpy array can index (even with a zero dimension)",
                param,
            )


def check_inputs_fit(module_name: str, shapes: list[Shape], max_memory: int | None = None) -> None:
    """MemoryLimitError when arrays of `shapes` exceed `max_memory` (None: MemAvailable): a module whose inputs
    cannot be made is refused before numpy tries (its MemoryError, or the OOM killer, says nothing useful)."""
    need = sum(s.nbytes for s in shapes)
    limit = max_memory if max_memory is not None else available_memory()
    if limit is not None and need > limit:
        raise MemoryLimitError(module_name, need, limit, given=max_memory is not None)


def random_value(shape: Shape, rng: np.random.Generator, domain: Domain | None = None):
    if shape.is_tuple:
        return tuple(random_value(s, rng) for s in shape.tuple_shapes)
    etype = shape.element_type
    if etype.numpy is None:
        return np.zeros((0,), np.bool_)
    if etype.kind == "pred":
        return rng.integers(0, 2, size=shape.dims).astype(np.bool_)
    if domain is not None and domain.kind == "boolean":
        return rng.integers(0, 2, size=shape.dims).astype(etype.numpy)
    if etype.is_integer:
        high = 4 if domain is None or domain.bound is None else domain.bound + 1  # an index's largest valid value
        return rng.integers(0, max(high, 1), size=shape.dims).astype(etype.numpy)
    if etype.kind == "complex":
        return (rng.standard_normal(shape.dims) + 1j * rng.standard_normal(shape.dims)).astype(etype.numpy)
    normal = rng.standard_normal(shape.dims, dtype=np.float32)
    if domain is not None and domain.kind == "positive":
        return np.exp(0.5 * normal).astype(etype.numpy)  # log-normal: in [0.2, 5] but for 1 in 10^4
    return normal.astype(etype.numpy)


def from_npz_void(value, dtype):
    """`value` as `dtype` where np.savez wrote it as raw bytes: an ml_dtypes array (bf16, fp8, int4, ...) saved
    with plain np.savez comes back from np.load as void of its item size (|V2, |V1). Everything else, and void
    of another size, is returned unchanged (the caller's dtype check then says what is wrong)."""
    dtype = np.dtype(dtype)
    if (
        isinstance(value, np.ndarray)
        and value.dtype.type is np.void
        and value.dtype.names is None
        and value.dtype.itemsize == dtype.itemsize
        and dtype.type is not np.void
    ):
        return value.view(dtype)
    return value
