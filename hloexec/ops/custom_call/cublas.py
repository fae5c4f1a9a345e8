"""cuBLAS calls of XLA-GPU: gemm (legacy and cublasLt), the fp8 cublasLt matmul, triangular solve.

backend_config is a GpuBackendConfig whose gemm_backend_config (GemmBackendConfig, backend_configs.proto)
holds the dot's dimension numbers, alpha/beta, the epilogue and the dot's precision_config (operand_precision,
algorithm: computed as the run's device profile says, as for the dot op); older dumps print that message at the
top level. Operand order follows XLA's thunk emitter: a, b, [c when beta != 0], then for fp8 a_scale, b_scale,
[vector bias], [d_scale when the output is fp8].
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ...errors import UnsupportedError
from ...ir.dtypes import ELEMENT_TYPES
from ..common import contig, is_low_float
from ...kernels.dot_algorithms import device_algorithm, fp8_fast_accumulation
from ..contraction import algorithm_dot, compute_dtype, dot_general, finish, triangular_solve
from .registry import backend_config, custom_call, enum_field, field, result_leaves, target_of

_F32 = np.dtype(np.float32)
EPILOGUES = (
    "DEFAULT",
    "BIAS",
    "RELU",
    "BIAS_RELU",
    "GELU",
    "GELU_AUX",
    "BIAS_GELU",
    "BIAS_GELU_AUX",
    "SILU",
    "BIAS_SILU",
)


def gelu_tanh(x):
    """GELU's tanh approximation, as cuBLASLt's GELU epilogue computes it."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def _dims(v):
    return tuple(int(t) for t in (v or ()))


class Gemm:
    """A GemmBackendConfig decoded: dimension numbers, alpha, beta, epilogue, and the algorithm the run's device
    computes the product with (precision_config: "" for the plain product)."""

    def __init__(self, inst, ctx):
        g = backend_config(inst, "gemm_backend_config")
        dd = field(g, "dot_dimension_numbers", {}) or {}
        self.lc, self.rc = (
            _dims(field(dd, "lhs_contracting_dimensions")),
            _dims(field(dd, "rhs_contracting_dimensions")),
        )
        self.lb, self.rb = _dims(field(dd, "lhs_batch_dimensions")), _dims(field(dd, "rhs_batch_dimensions"))
        self.alpha = complex(float(field(g, "alpha_real", 1)), float(field(g, "alpha_imag", 0)))
        self.beta = float(field(g, "beta", 0))
        self.epilogue = enum_field(g, "epilogue", EPILOGUES, inst)
        self.damax = bool(field(g, "damax_output", False))
        self.has_bias = self.epilogue.startswith("BIAS")
        pc = field(g, "precision_config", {}) or {}
        self.precisions = tuple(str(p).lower() for p in field(pc, "operand_precision", ()) or ())
        self.device = ctx.options.device
        if len(inst.operands) < 2 or any(o.shape.is_tuple for o in inst.operands[:2]):
            raise UnsupportedError(
                f"cuBLAS gemm expects two array operands a, b first, got {len(inst.operands)} operands", inst
            )
        lhs, rhs = inst.operands[0].shape, inst.operands[1].shape
        for s, dims in ((lhs, self.lb + self.lc), (rhs, self.rb + self.rc)):
            if any(not 0 <= d < s.rank for d in dims):
                raise UnsupportedError(
                    f"cuBLAS gemm dot_dimension_numbers {list(dims)} out of range for operand {s.to_text(False)}", inst
                )
        free = [
            math.prod(s.dims[d] for d in range(s.rank) if d not in batch + contracting)
            for s, batch, contracting in ((lhs, self.lb, self.lc), (rhs, self.rb, self.rc))
        ]
        self.algorithm_text = field(pc, "algorithm", "")
        self.algorithm = device_algorithm(
            self.device,
            self.algorithm_text,
            self.precisions,
            lhs.element_type.name,
            rhs.element_type.name,
            result_leaves(inst)[0].element_type.name,
            1 in free,
            inst,
        )
        self.inst = inst

    def product(self, a, b, cdt, fast_accumulation=False):
        """alpha * dot(a, b) in the compute type `cdt`."""
        if self.algorithm or fast_accumulation:
            r = algorithm_dot(
                self.algorithm, a, b, self.lb, self.rb, self.lc, self.rc, cdt, self.device, self.inst, fast_accumulation
            )
        else:
            r = dot_general(a, b, self.lb, self.rb, self.lc, self.rc, cdt)
        if self.alpha.imag != 0:
            return r * self.alpha
        if self.alpha.real != 1:
            return (r * np.asarray(self.alpha.real, cdt)).astype(cdt)
        return r

    def finish_epilogue(self, r, c, bias, cdt):
        """(activation(r + beta * c + bias), the pre-activation value)."""
        if c is not None:
            r = r + np.asarray(self.beta, cdt) * c.astype(cdt)
        if bias is not None:
            r = r + bias.astype(cdt)  # broadcast along the last (column) dims
        activate = self.activation()
        return (r if activate is None else activate(r)), r

    def activation(self):
        """The epilogue's activation (None: DEFAULT and BIAS), as cuBLASLt computes it."""
        if "RELU" in self.epilogue:
            return lambda r: np.maximum(r, 0)
        if "GELU" in self.epilogue:
            return gelu_tanh
        if "SILU" in self.epilogue:
            return lambda r: r / (1 + np.exp(-r))
        return None


def _work_dtype(out_dtype):
    """The accumulation type: f32 for low floats and f32, f64 for f64, complex and integers as themselves."""
    cdt = compute_dtype(out_dtype)
    if cdt.kind in "iuc":
        return cdt
    return np.dtype(np.float64) if np.dtype(out_dtype) == np.float64 else _F32


@custom_call("__cublas$gemm", "__cublas$lt$matmul")
def cublas_gemm(inst, ctx):
    """result = epilogue(alpha * dot(a, b) + beta * c + bias): backend_config dot_dimension_numbers, alpha
    (real/imag), beta (beta != 0: operand 2 is c), epilogues DEFAULT, RELU, GELU (tanh approximation, as
    cuBLASLt), SILU, their BIAS_ forms (bias: the next operand, along the result's last dims) and
    (BIAS_)GELU_AUX (the pre-activation value as the 2nd result); f16/bf16 computed in f32, rounded once; the
    backend_config's precision_config (operand_precision, algorithm) computed as the run's device computes a dot
    (--device). A tuple result's remaining leaves (the s8 workspace) are zeros."""
    g = Gemm(inst, ctx)
    leaves = result_leaves(inst)
    out_dtype = leaves[0].dtype
    cdt = _work_dtype(out_dtype)
    c_index = 2 if g.beta != 0 else None
    bias_index = (3 if g.beta != 0 else 2) if g.has_bias else None
    need = 2 + (g.beta != 0) + g.has_bias
    if len(inst.operands) < need:
        raise UnsupportedError(f"cuBLAS gemm expects {need} operands, got {len(inst.operands)}", inst)

    def kernel(*xs):
        r = g.product(xs[0], xs[1], cdt)
        r, pre = g.finish_epilogue(
            r, None if c_index is None else xs[c_index], None if bias_index is None else xs[bias_index], cdt
        )
        out = contig(np.asarray(r).astype(out_dtype))
        if not inst.shape.is_tuple:
            return out
        res = [out]
        for j, s in enumerate(leaves[1:], start=1):
            if j == 1 and g.epilogue.endswith("AUX"):
                res.append(contig(np.asarray(pre).astype(s.dtype).reshape(s.dims)))
            else:
                res.append(np.zeros(s.dims, s.dtype))
        return tuple(res)

    return kernel


# The shadow's copy of an fp8 matmul (exec/shadow.py) computes in f64: this attribute names its program's result
# type, whose finite range the result saturates to.
PROGRAM_RESULT_TYPE = "program_result_type"
F8_MATMUL = "__cublas$lt$matmul$f8"


class F8Operands:
    """Where an fp8 matmul's operands are (XLA's thunk emitter): a, b, [c when beta != 0], a_scale, b_scale (f32
    scalars), [bias with a BIAS epilogue], [d_scale, last, when the output is fp8]; dumps before d_scale moved last
    carried c_scale and d_scale after b_scale, then the bias: both are read. `limit`: the fp8 result's largest
    finite value, which the result saturates to (the clamp GemmRewriter's F8ConvertD folded in: it fuses only
    `clamp(lowest, x, max)` of the fp8 type), None for other results."""

    def __init__(self, inst, g: Gemm):
        program = inst.attr(PROGRAM_RESULT_TYPE)
        out_dtype = np.dtype(ELEMENT_TYPES[program].numpy if program else result_leaves(inst)[0].dtype)
        fp8_out = is_low_float(out_dtype) and out_dtype.itemsize == 1
        n = len(inst.operands)
        self.scales = (3, 4) if g.beta != 0 else (2, 3)
        new_form = self.scales[0] + 2 + g.has_bias + fp8_out
        old_form = self.scales[0] + 4 + g.has_bias
        if n == new_form:
            self.bias = self.scales[0] + 2 if g.has_bias else None
            self.d_scale = n - 1 if fp8_out else None
        elif n == old_form:
            self.d_scale, self.bias = self.scales[0] + 3, (self.scales[0] + 4 if g.has_bias else None)
        else:
            raise UnsupportedError(
                f"{target_of(inst)} with {n} operands (beta={g.beta}, epilogue={g.epilogue}, "
                f"{out_dtype} output): expected {new_form}",
                inst,
            )
        self.limit = float(ml_dtypes.finfo(out_dtype).max) if fp8_out else None


@custom_call(F8_MATMUL)
def cublas_lt_matmul_f8(inst, ctx):
    """cuBLASLt's scaled fp8 matmul: D = d_scale * epilogue(alpha * a_scale * b_scale * dot(a, b) + beta * c
    + bias), accumulated in f32 from the exact fp8 values (F8Operands: where each operand is); an fp8 output
    saturates to its finite range, other outputs round once. With damax_output the 2nd result is max|D| before
    d_scale (f32: cuBLASLt's amax of D before its scale, what GemmRewriter's F8AddDAmax fuses). Remaining leaves
    (workspace): zeros. Fast accumulation (partial sums kept in fewer bits, kernels/dot_algorithms.py) with the
    algorithm dot_any_f8_any_f8_f32_fast_accum, or at DEFAULT precision on a device whose fp8 GEMMs use it (h100).
    An f64 result (the shadow's) computes every step in f64, exactly from the fp8 values."""
    g = Gemm(inst, ctx)
    leaves = result_leaves(inst)
    out_dtype = np.dtype(leaves[0].dtype)
    cdt = _work_dtype(out_dtype)
    fast = cdt == _F32 and fp8_fast_accumulation(
        g.device, g.algorithm_text, g.precisions, *(o.shape.element_type.name for o in inst.operands[:2])
    )
    where = F8Operands(inst, g)
    a_scale, b_scale = where.scales

    def kernel(*xs):
        scale = cdt.type(xs[a_scale]) * cdt.type(xs[b_scale])
        r = g.product(xs[0], xs[1], cdt, fast) * scale
        r, _ = g.finish_epilogue(
            r.astype(cdt), xs[2] if g.beta != 0 else None, None if where.bias is None else xs[where.bias], cdt
        )
        amax = np.max(np.abs(r), initial=0)
        if where.d_scale is not None:
            r = r * cdt.type(xs[where.d_scale])
        if where.limit is not None:
            r = np.clip(r, -where.limit, where.limit)
        out = finish(r.astype(cdt), out_dtype)
        res = [out]
        for j, s in enumerate(leaves[1:], start=1):
            res.append(np.asarray(amax, s.dtype) if (j == 1 and g.damax) else np.zeros(s.dims, s.dtype))
        return tuple(res) if inst.shape.is_tuple else out

    return kernel


@custom_call("__cublas$triangularSolve")
def cublas_triangular_solve(inst, ctx):
    """XLA-GPU's triangular-solve (TriangularSolveRewriter): operands (a, b), backend_config the
    TriangularSolveOptions (left_side, lower, unit_diagonal, transpose_a); result (x, s8 temp) with x as the
    triangular-solve op defines it (only a's named triangle read). The temp buffer is zeros."""
    cfg = backend_config(inst)
    if not inst.shape.is_tuple or len(inst.operands) != 2:
        raise UnsupportedError(f"{target_of(inst)} takes (a, b) and returns (x, temp)", inst)
    x_shape, *rest = result_leaves(inst)
    transpose = enum_field(cfg, "transpose_a", TRANSPOSE_KINDS, inst, default=1)
    if transpose == "TRANSPOSE_INVALID":
        raise UnsupportedError(f"{target_of(inst)} with transpose_a={transpose}", inst)
    solve = triangular_solve(
        bool(field(cfg, "left_side", False)),
        bool(field(cfg, "lower", False)),
        bool(field(cfg, "unit_diagonal", False)),
        transpose,
        x_shape.dtype,
    )

    def kernel(a, b):
        return (solve(a, b), *(np.zeros(s.dims, s.dtype) for s in rest))

    return kernel


# TriangularSolveOptions.Transpose (xla_data.proto)
TRANSPOSE_KINDS = ("TRANSPOSE_INVALID", "NO_TRANSPOSE", "TRANSPOSE", "ADJOINT")
