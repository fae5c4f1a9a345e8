"""The compiled function of a control-flow region (kernels/program.py generates it): its calling convention --
operands' leaves in as flat read-only arrays, the result's leaves out, rebuilt into the result's tuples."""

from __future__ import annotations

import numpy as np

from . import elementwise as ew
from .cache import GeneratedKernel, array_arg


class ProgramKernel(GeneratedKernel):
    """A compiled region: `kernel(*operands)` -> the value (arrays, tuples nested as the result shape)."""

    def __init__(self, source: str, key: str, operand_shapes, params: list, result_shape, consts):
        super().__init__(source, key)
        self._operands = operand_shapes
        self._params = params  # (dims, element type) of each operand's leaves, flattened
        self._result = result_shape
        self._consts = consts

    @property
    def signature(self) -> tuple:
        """Operands and constants are never written: read-only, one specialisation (cache.compile_signature)."""
        return tuple(
            [array_arg(ew.STORAGE[et], 1, True) for _, et in self._params]
            + [array_arg(c.dtype, 1, True) for c in self._consts]
        )

    def __call__(self, *operands):
        flat = [x for v, s in zip(operands, self._operands) for x in _flatten(v, s)]
        args = []
        for a, (dims, et) in zip(flat, self._params):
            a = np.asarray(a)
            a = a if a.flags.c_contiguous else a.copy()  # (np.ascontiguousarray makes 0-d arrays 1-d)
            if et in ("f16", "bf16"):
                a = a.view(np.uint16)
            if a.dtype != ew.STORAGE[et] or a.shape != dims:
                raise TypeError(f"program operand: expected {et}{list(dims)}, got {a.dtype}{list(a.shape)}")
            args.append(a.reshape(-1))
        results = iter(self.fn(*args, *self._consts))
        return _unflatten(self._result, results)


def _flatten(value, shape):
    if shape.is_tuple:
        return [x for v, s in zip(value, shape.tuple_shapes) for x in _flatten(v, s)]
    return [value]


def _unflatten(shape, results):
    if shape.is_tuple:
        return tuple(_unflatten(s, results) for s in shape.tuple_shapes)
    a = next(results).reshape(shape.dims)
    return a.view(shape.dtype) if shape.element_type.is_half_float else a
