"""HLO element types: name -> numpy dtype, bit width, kind.

Sub-byte and fp8 types come from ml_dtypes; `token` and `opaque` have no array form.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True, slots=True)
class ElementType:
    name: str  # as HLO writes it: f32, bf16, pred, ...
    bits: int  # storage bits of one element as XLA counts them (s4 = 4)
    kind: str  # 'pred' | 'sint' | 'uint' | 'float' | 'complex' | 'token' | 'opaque' | 'tuple'
    numpy: np.dtype | None

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("sint", "uint")

    @property
    def is_half_float(self) -> bool:
        """f16 or bf16: the 16-bit floats numpy ops compute in f32 and Numba kernels hold as uint16 bits."""
        return self.name in ("f16", "bf16")

    @property
    def itemsize(self) -> int:
        """Bytes one element takes in a numpy array (sub-byte types take a whole byte)."""
        return 0 if self.numpy is None else self.numpy.itemsize


def _t(name, bits, kind, dtype):
    return ElementType(name, bits, kind, None if dtype is None else np.dtype(dtype))


ELEMENT_TYPES: dict[str, ElementType] = {
    t.name: t
    for t in (
        _t("pred", 8, "pred", np.bool_),
        _t("s2", 2, "sint", ml_dtypes.int2),
        _t("s4", 4, "sint", ml_dtypes.int4),
        _t("s8", 8, "sint", np.int8),
        _t("s16", 16, "sint", np.int16),
        _t("s32", 32, "sint", np.int32),
        _t("s64", 64, "sint", np.int64),
        _t("u2", 2, "uint", ml_dtypes.uint2),
        _t("u4", 4, "uint", ml_dtypes.uint4),
        _t("u8", 8, "uint", np.uint8),
        _t("u16", 16, "uint", np.uint16),
        _t("u32", 32, "uint", np.uint32),
        _t("u64", 64, "uint", np.uint64),
        _t("f16", 16, "float", np.float16),
        _t("bf16", 16, "float", ml_dtypes.bfloat16),
        _t("f32", 32, "float", np.float32),
        _t("f64", 64, "float", np.float64),
        _t("f8e4m3fn", 8, "float", ml_dtypes.float8_e4m3fn),
        _t("f8e5m2", 8, "float", ml_dtypes.float8_e5m2),
        _t("f8e4m3", 8, "float", ml_dtypes.float8_e4m3),
        _t("f8e3m4", 8, "float", ml_dtypes.float8_e3m4),
        _t("f8e4m3fnuz", 8, "float", ml_dtypes.float8_e4m3fnuz),
        _t("f8e5m2fnuz", 8, "float", ml_dtypes.float8_e5m2fnuz),
        _t("f8e4m3b11fnuz", 8, "float", ml_dtypes.float8_e4m3b11fnuz),
        _t("f8e8m0fnu", 8, "float", ml_dtypes.float8_e8m0fnu),
        _t("f4e2m1fn", 4, "float", ml_dtypes.float4_e2m1fn),
        _t("f6e2m3fn", 6, "float", ml_dtypes.float6_e2m3fn),
        _t("f6e3m2fn", 6, "float", ml_dtypes.float6_e3m2fn),
        _t("c64", 64, "complex", np.complex64),
        _t("c128", 128, "complex", np.complex128),
        _t("token", 0, "token", None),
        _t("opaque", 0, "opaque", None),
    )
}

# A tuple shape's element type (XLA's PrimitiveType TUPLE). Not in ELEMENT_TYPES: no array is written `tuple[...]`.
TUPLE = ElementType("tuple", 0, "tuple", None)

_BY_NUMPY = {t.numpy: t for t in ELEMENT_TYPES.values() if t.numpy is not None}


def element_type(name: str) -> ElementType:
    try:
        return ELEMENT_TYPES[name]
    except KeyError:
        raise KeyError(f"unknown HLO element type {name!r}") from None


def element_type_of(dtype) -> ElementType:
    """The HLO element type of a numpy dtype (bool -> pred, bfloat16 -> bf16, ...)."""
    try:
        return _BY_NUMPY[np.dtype(dtype)]
    except KeyError:
        raise KeyError(f"numpy dtype {np.dtype(dtype)} has no HLO element type") from None
