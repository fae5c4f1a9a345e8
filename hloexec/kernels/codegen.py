"""What both kernel generators (`kernels/fusion.py`: a fused computation as one loop nest; `kernels/program.py`:
a control-flow region as one function) share: declining, constants as a kernel sees them, row-major strides,
and the module text around a generated `kernel` function (loaded through `kernels/cache.py`)."""
from __future__ import annotations

import numpy as np

from ..errors import TierUnsupported
from . import elementwise as ew
from .cache import helpers_hash


def need(cond, why: str):
    """Decline the computation (TierUnsupported) unless `cond` holds."""
    if not cond:
        raise TierUnsupported(why)


def scalar_literal(inst):
    """A rank-0 constant's value as a Python number."""
    return np.asarray(inst.literal).reshape(()).item()


def constant_storage(inst) -> np.ndarray:
    """An array constant as a kernel sees it: C-contiguous, in its storage type (f16/bf16 as uint16)."""
    et = inst.shape.element_type
    arr = np.ascontiguousarray(np.asarray(inst.literal).reshape(inst.shape.dims))
    storage = ew.STORAGE[et.name]
    return arr.view(storage) if et.is_half_float else arr.astype(storage, copy=False)


def row_major_strides(dims) -> list[int]:
    """Element strides of a row-major array of `dims`."""
    strides, s = [], 1
    for d in reversed(dims):
        strides.append(s)
        s *= d
    return strides[::-1]


def kernel_module(kind: str, params: list[str], body: list[str]) -> str:
    """The source of a module defining `kernel(*params)` with `body` (lines indented one level), jitted with the
    disk cache on and the scalar helpers imported; its first line names the helpers' hash (see kernels/cache.py)."""
    head = [f"# hloexec {kind} kernel (generated; helpers {helpers_hash()})",
            "from numba import njit",
            "from hloexec.kernels.scalar import (" + ", ".join(ew.HELPERS) + ")",
            "",
            "",
            "@njit(cache=True, error_model='numpy', nogil=True)",
            f"def kernel({', '.join(params)}):"]
    return "\n".join(head + body) + "\n"
