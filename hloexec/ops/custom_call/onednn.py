"""XLA:CPU's own oneDNN rewrites."""

from __future__ import annotations

import numpy as np

from ...errors import UnsupportedError
from ..contraction import finish, to_compute
from .registry import backend_config, custom_call

_F32 = np.dtype(np.float32)


@custom_call("__onednn$layernorm", operands=3, returns="array")
def onednn_layernorm(inst, ctx):
    """oneDNN forward-inference layer norm over the last dim: (x - mean) / sqrt(var + eps) * scale + shift,
    biased variance, computed in f32 (onednn_layer_norm.cc). eps is the config's epsilon_typecast (the f32
    bits as an int) where given, else 1e-5 (the runtime's constant before that field existed)."""
    cfg = backend_config(inst).get("onednn_layer_norm_config", {})
    rescale = cfg.get("rescale", "SCALE_AND_SHIFT")
    if rescale != "SCALE_AND_SHIFT" or len(inst.operands) != 3:
        raise UnsupportedError(f"__onednn$layernorm with rescale={rescale} and {len(inst.operands)} operands", inst)
    bits = cfg.get("epsilon_typecast")
    eps = np.float32(1e-5) if bits is None else np.array(int(bits), np.int32).view(np.float32)[()]
    out_dtype = inst.shape.dtype

    def kernel(x, scale, shift):
        x32, scale32, shift32 = (to_compute(v, _F32) for v in (x, scale, shift))  # f16/bf16 via low_to_f32
        mean = x32.mean(axis=-1, keepdims=True, dtype=np.float32)
        var = np.square(x32 - mean).mean(axis=-1, keepdims=True, dtype=np.float32)
        return finish((x32 - mean) / np.sqrt(var + eps) * scale32 + shift32, out_dtype)  # ... and f32_to_low

    return kernel
