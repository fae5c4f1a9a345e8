"""A convolution's error bound (tools/bounds.py). One that is a dot -- no spatial dimensions, one feature and one
batch group, its output (batch, output feature): a TPU program's matmul, `dim_labels=bf_oi->bf` -- is bounded and
sampled as that dot (tools/bound_dots.py: float32 products proven upper bounds, the device's dot algorithm; its
samples one float32 product each), not by the float64 convolutions of the general rule below. So is a cuBLAS
gemm custom-call that is a plain dot (alpha 1, no beta, no epilogue: `gemm_as_dot`)."""

from __future__ import annotations

import numpy as np

from ..ir.module import Instruction
from ..kernels.dot_algorithms import algorithm_name
from ..ops.custom_call.cublas import EPILOGUES
from ..ops.custom_call.registry import backend_config, enum_field, field, target_of
from .bound_complex import squared_magnitude
from .bound_dots import SIGNIFICAND, widest
from .bound_samples import SIGMAS

# attributes a dot reads as a convolution writes them (the raw text carried over)
_DOT_ATTRIBUTES = ("operand_precision", "algorithm")


def as_dot(inst) -> Instruction | None:
    """The dot the convolution `inst` computes (contracting the input feature with the kernel's input feature;
    its result the lhs's free dim, the batch, then the rhs's, the output feature: a dot's order), or None where it
    is not one (spatial dims, feature or batch groups, another output order)."""
    cd = inst.attr("dim_labels")
    if cd is None or cd.input_spatial or inst.attr("window") or len(inst.operands) != 2:
        return None
    groups = (inst.attrs.get("feature_group_count", "1"), inst.attrs.get("batch_group_count", "1"))
    if groups != ("1", "1") or (cd.output_batch, cd.output_feature) != (0, 1):
        return None
    attrs = {
        "lhs_contracting_dims": f"{{{cd.input_feature}}}",
        "rhs_contracting_dims": f"{{{cd.kernel_input_feature}}}",
        **{k: v for k, v in inst.attrs.items() if k in _DOT_ATTRIBUTES},
    }
    dot = Instruction(inst.name, "dot", inst.shape, inst.operands, attrs)
    dot.computation = inst.computation
    return dot


GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul")


def gemm_as_dot(inst) -> Instruction | None:
    """The dot a cuBLAS gemm custom-call `inst` computes where it is one (an array result of its two operands,
    alpha 1, beta 0, no epilogue; its dimension numbers and precision config the dot's), else None (the others:
    tools/bound_epilogues.py)."""
    if target_of(inst) not in GEMM_TARGETS or inst.shape.is_tuple or len(inst.operands) != 2:
        return None
    g = backend_config(inst, "gemm_backend_config")
    plain = tuple(float(field(g, k, d)) for k, d in (("alpha_real", 1), ("alpha_imag", 0), ("beta", 0))) == (1, 0, 0)
    if not plain or enum_field(g, "epilogue", EPILOGUES, inst) != "DEFAULT":
        return None
    return gemm_dot(inst, inst.shape)


def gemm_dot(inst, shape) -> Instruction:
    """The dot of a cuBLAS gemm custom-call `inst`'s two first operands (its dimension numbers and precision config
    from its backend config), of `shape`."""
    g = backend_config(inst, "gemm_backend_config")
    dims = field(g, "dot_dimension_numbers", {}) or {}
    attrs = {
        f"{side}_{kind}_dims": "{" + ",".join(str(int(d)) for d in field(dims, f"{side}_{kind}_dimensions") or ()) + "}"
        for side in ("lhs", "rhs")
        for kind in ("contracting", "batch")
    }
    precision = field(g, "precision_config", {}) or {}
    if field(precision, "operand_precision"):
        attrs["operand_precision"] = "{" + ",".join(str(p).lower() for p in field(precision, "operand_precision")) + "}"
    if algorithm_name(field(precision, "algorithm")):
        attrs["algorithm"] = algorithm_name(field(precision, "algorithm"))
    dot = Instruction(inst.name, "dot", shape, inst.operands[:2], attrs)
    dot.computation = inst.computation
    return dot


def convolution_bounds(bounds, inst, orig, x, operands, kernel=None, etype=None) -> tuple:
    """A convolution (not a dot: `as_dot`) as a dot whose terms the convolution itself counts: its kernel on the
    operands' squared values and bounds (errors independent across the terms), plus a part every term may share
    (at most the smallest bound of each operand), plus the accumulation (the wider of the result type and f32, as
    a dot without an algorithm) over the terms each output element sums (the kernel on ones), the final rounding.
    Stores the bound; returns its own error (SIGMAS sigmas) and its ceiling, as a dot's, for the samples: the
    operands' errors all adding up (a term rounded once is bounded by its largest error, 1.73 of its sigmas: a
    bf16 convolution's errors reached 2x the root-sum-square's bound where the samples could not raise it).
    `kernel`: the convolution (bilinear) where it is not `inst`'s own (a cuDNN call's product); `etype`: the type it
    rounds to where it is not `orig`'s (a library call's compute type, tools/bound_epilogues.py)."""
    a, b = operands
    product = kernel or bounds._kernel(inst)

    def real_kernel(*args):  # (a complex convolution's on real terms: complex values, their imaginary parts 0)
        return np.real(product(*args))

    etype = etype or orig.shape.element_type
    ea, eb = bounds.of(a), bounds.of(b)
    a2, b2 = squared_magnitude(a), squared_magnitude(b)  # (a complex one's: its parts' squares, |a|^2)
    variance = real_kernel(a2, np.square(eb)) + real_kernel(np.square(ea), b2)
    shared = np.abs(product(a, np.full(b.shape, np.min(eb, initial=0.0)))) + np.abs(
        product(np.full(a.shape, np.min(ea, initial=0.0)), b)
    )
    # (a complex one's parts sum 2K real products each, as a complex dot's: tools/bound_dots.py)
    count = real_kernel(np.ones(a.shape), np.ones(b.shape)) * (2 if np.iscomplexobj(x) else 1)
    u_acc = 2.0 ** -SIGNIFICAND.get(widest(etype.name, "f32"), 53)
    arithmetic = np.square(SIGMAS * u_acc / np.sqrt(3)) * count * (real_kernel(a2, b2) + squared_magnitude(x))
    bound, own = bounds._round(orig, x, np.square(np.sqrt(variance) + shared) + arithmetic, "dot", etype=etype)
    bounds._put(x, bound)
    local = np.sqrt(arithmetic + np.square(own))
    return local, lambda: real_kernel(np.abs(a), eb) + real_kernel(ea, np.abs(b) + eb) + local
