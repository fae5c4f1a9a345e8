"""Helpers the op modules share: attribute decoding, array normalization, reducer recognition."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

from ..errors import UnsupportedError
from ..ir import opcodes
from ..kernels.index_maps import NUMPY, dilated_element
from ..kernels.numpy_form import as_signed, as_unsigned, float_total_order_key  # noqa: F401 (the ops' helpers)

# The byte type holding the value of each sub-byte integer type (ml_dtypes stores one element a byte).
SUB_BYTE_CONTAINER = {
    np.dtype(ml_dtypes.int2): np.dtype(np.int8),
    np.dtype(ml_dtypes.int4): np.dtype(np.int8),
    np.dtype(ml_dtypes.uint2): np.dtype(np.uint8),
    np.dtype(ml_dtypes.uint4): np.dtype(np.uint8),
}


def contig(x, dtype=None):
    """A C-contiguous array (0-d stays 0-d, unlike np.ascontiguousarray)."""
    x = np.asarray(x, dtype=dtype)
    return x if x.flags.c_contiguous else x.copy(order="C")


def ints(value) -> tuple[int, ...]:
    """A decoded int-list attribute as a tuple, () when absent."""
    return () if value is None else tuple(value)


def int_attr(inst, key, default):
    """An integer attribute, `default` when absent."""
    return inst.attr(key, default)


def str_attr(inst, key, default=None):
    """A word attribute (quotes already removed by the decoder), `default` when absent."""
    return inst.attr(key, default)


def invalid(inst, what: str) -> UnsupportedError:
    """The error for an instruction XLA's shape rules reject (its verifier would): hloexec cannot say what it
    means either."""
    return UnsupportedError(f"{inst.opcode}: {what}, which XLA's shape rules reject", inst)


def required(inst, key: str):
    """An attribute XLA's parser requires of this opcode: a missing one is a parse error at the instruction."""
    value = inst.attr(key)
    if value is None:
        raise inst.parse_error(f"{inst.opcode} needs the attribute {key}=")
    return value


def called(inst, *keys):
    """The computation `inst` calls under the first of `keys` it has."""
    for k in keys:
        c = inst.called.get(k)
        if c:  # an empty list (`called_computations={}`) is none
            return c[0] if isinstance(c, list) else c
    raise UnsupportedError(f"{inst.opcode} without a {'/'.join(keys)} computation", inst)


def binary_kind(comp, nparams: int = 2) -> str | None:
    """'add'/'maximum'/... if `comp`'s root is that op applied to its two parameters; 'replace' if the
    root is parameter 1 (scatter's overwrite); None otherwise."""
    params = comp.parameters
    if len(params) != nparams or nparams != 2:
        return None
    return "replace" if comp.root is params[1] else opcodes.reducer_opcode(comp)


def is_low_float(dtype) -> bool:
    """f16, bf16 and the fp8 types: the floats XLA computes in f32 and rounds back."""
    dtype = np.dtype(dtype)
    return (
        (dtype.kind == "f" and dtype.itemsize < 4)
        or (dtype.kind == "V")
        or (dtype.type.__module__.startswith("ml_dtypes") and dtype.kind not in "iub")
    )


def ufunc_for(kind: str, dtype):
    dtype = np.dtype(dtype)
    if kind == "add":
        return np.logical_or if dtype == np.bool_ else np.add
    if kind == "multiply":
        return np.logical_and if dtype == np.bool_ else np.multiply
    if kind == "maximum":
        return np.maximum
    if kind == "minimum":
        return np.minimum
    if kind == "and":
        return np.logical_and if dtype == np.bool_ else np.bitwise_and
    if kind == "or":
        return np.logical_or if dtype == np.bool_ else np.bitwise_or
    if kind == "xor":
        return np.logical_xor if dtype == np.bool_ else np.bitwise_xor
    raise KeyError(kind)


# The value of a token (after-all, add-dependency's second operand): an empty array is cheap and inert.
TOKEN = np.zeros((0,), dtype=np.bool_)


def zeros_of(shape):
    """Zeros of `shape` (tuples nested, tokens as TOKEN): async contexts, data that no participant sends."""
    if shape.is_tuple:
        return tuple(zeros_of(s) for s in shape.tuple_shapes)
    if shape.element_type.numpy is None:
        return TOKEN
    return np.zeros(shape.dims, shape.dtype)


def scalar(a):
    """A 0-d array view of a one-element value (what computations called per element take)."""
    return np.asarray(a).reshape(())


def as_tuple(v):
    """A computation's result as a tuple of values (a non-tuple result is one value)."""
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def total_order_key(x: np.ndarray) -> np.ndarray:
    """An integer key whose order is XLA's total order (floats: -NaN < -inf < ... < -0 < +0 < ... < NaN)."""
    dt = x.dtype
    if dt == np.bool_:
        return x.astype(np.int8)
    if dt.kind in "iu":
        return x
    if dt in SUB_BYTE_CONTAINER:
        return x.astype(SUB_BYTE_CONTAINER[dt])
    if dt.kind == "c":
        raise TypeError("complex sort key")
    return float_total_order_key(x)


@functools.lru_cache(maxsize=4096)
def dilated_layout(n: int, low: int, high: int, base: int) -> tuple[int, slice, slice]:
    """(padded size, the padded positions holding elements, the elements they hold) along one dim of n elements
    padded by low / high (negative: cropped) and base-dilated by `base`: index_maps.dilated_element on every
    padded position. It is affine in the position, so both are arithmetic progressions: slices (no gather)."""
    size = max(((n - 1) * base + 1 if n else 0) + low + high, 0)
    element, holds = dilated_element(NUMPY, n, low, base, np.arange(size, dtype=np.int64), size - 1)
    mask = np.ones(size, bool)
    for c in holds:
        mask &= c
    at = np.flatnonzero(mask)
    if not len(at):
        return size, slice(0, 0), slice(0, 0)
    step = int(at[1] - at[0]) if len(at) > 1 else 1
    return size, slice(int(at[0]), int(at[-1]) + 1, step), slice(int(element[at[0]]), int(element[at[-1]]) + 1)
