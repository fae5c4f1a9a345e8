"""Build single HLO instructions by hand and run them through hloexec's op kernels and XLA:CPU.

Needs neither the parser nor the attribute decoders: `make_inst` stores the decoded attribute values
directly in the instruction's attribute cache, and the raw text XLA needs is rendered from them.

    inst = make_inst("compare", "pred[4]", ["f32[4]", "f32[4]"], direction="LT", type="TOTALORDER")
    ours = run(inst, a, b)                 # prepare(inst, ctx) -> kernel(a, b)
    ref = run_xla(inst, a, b)              # the same instruction as an HLO module on XLA:CPU

Operands given as shape text (or Shape) become parameter instructions p0, p1, ...; real Instruction
objects are used as they are. Attribute values are the decoded forms (tuple[int], int, str, bool,
tuple[SliceDim], tuple[PadDim], tuple[WindowDim], ConvDims, dict for JSON); pass `raw={"key": "text"}` to override the
rendered text. Called computations go in `called={"to_apply": comp}`: `scalar_computation` builds one
hloexec recognizes (add, maximum, compare, ...), `python_computation` one it must run, which
`FakeContext.computation` hands to the op as the given Python function.
"""
from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np

from hloexec.ir.attributes import ConvDims, PadDim, SliceDim, WindowDim
from hloexec.ir.dtypes import element_type_of
from hloexec.ir.module import Computation, Instruction
from hloexec.ir.shape import Shape, parse_shape
from hloexec.ops.registry import OPS
from hloexec.options import Options


class FakeContext:
    """The part of an ExecContext that op `prepare` functions use."""
    reductions = "accumulate"
    device = None
    options = Options()

    def computation(self, comp):
        fn = getattr(comp, "python_fn", None)
        if fn is None:
            raise NotImplementedError(f"computation {comp.name} has no Python function (see python_computation)")
        return fn


def shape(s) -> Shape:
    return s if isinstance(s, Shape) else parse_shape(s)


def type_name(dtype) -> str:
    """The HLO element type name of a numpy dtype ('f32', 'bf16', 'pred', ...)."""
    return element_type_of(dtype).name


def shape_text(dtype, dims) -> str:
    return f"{type_name(dtype)}[{','.join(map(str, dims))}]"


def _scalar_params(types) -> list[Instruction]:
    return [Instruction(f"x{i}", "parameter", shape(f"{t}[]"), [], {}, args=str(i)) for i, t in enumerate(types)]


def scalar_computation(opcode: str, element_type: str, *, extra_params=(), **attrs) -> Computation:
    """`(x0, x1, *extra_params) -> opcode(x0, x1)` on scalars: a reducer/comparator hloexec recognizes."""
    params = _scalar_params([element_type, element_type, *extra_params])
    root_type = "pred" if opcode == "compare" else element_type
    root = Instruction("root", opcode, shape(f"{root_type}[]"), params[:2], {k: format_attr(v) for k, v in attrs.items()})
    root._decoded = dict(attrs)
    return Computation("c", [*params, root], root)


def python_computation(types, fn, out: str = "f32") -> Computation:
    """A computation hloexec cannot recognize (its root is a call); FakeContext runs it as `fn`."""
    params = _scalar_params(types)
    root = Instruction("root", "call", shape(f"{out}[]"), params, {})
    comp = Computation("c", [*params, root], root)
    comp.python_fn = fn
    return comp


def _dim_labels(cd: ConvDims) -> str:
    def labels(first, a, second, b, spatial):
        out = ["?"] * (2 + len(spatial))
        out[first], out[second] = a, b
        for i, d in enumerate(spatial):
            out[d] = str(i)
        return "".join(out)
    return (labels(cd.input_batch, "b", cd.input_feature, "f", cd.input_spatial) + "_"
            + labels(cd.kernel_input_feature, "i", cd.kernel_output_feature, "o", cd.kernel_spatial) + "->"
            + labels(cd.output_batch, "b", cd.output_feature, "f", cd.output_spatial))


def _window(win) -> str:
    def field(key, values):
        return f"{key}={'x'.join(str(int(v)) for v in values)}"
    if not win:
        return "{}"
    return "{" + " ".join([field("size", [w.size for w in win]), field("stride", [w.stride for w in win]),
                           "pad=" + "x".join(f"{w.pad_low}_{w.pad_high}" for w in win),
                           field("lhs_dilate", [w.base_dilation for w in win]),
                           field("rhs_dilate", [w.window_dilation for w in win]),
                           field("rhs_reversal", [w.reversal for w in win])]) + "}"


def format_attr(value) -> str:
    """HLO text of a decoded attribute value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer, str)):
        return str(value)
    if isinstance(value, ConvDims):
        return _dim_labels(value)
    if isinstance(value, dict):   # backend_config: JSON in a quoted string
        return json.dumps(json.dumps(value))
    if isinstance(value, (tuple, list)):
        if value and isinstance(value[0], WindowDim):
            return _window(value)
        if value and isinstance(value[0], SliceDim):
            return "{" + ", ".join(f"[{d.start}:{d.limit}:{d.stride}]" for d in value) + "}"
        if value and isinstance(value[0], PadDim):
            return "x".join(f"{d.low}_{d.high}" + (f"_{d.interior}" if d.interior else "") for d in value)
        return "{" + ",".join(str(int(v)) for v in value) + "}"
    raise TypeError(f"cannot render attribute value {value!r}")


def make_inst(opcode: str, result_shape, operands=(), *, raw: dict | None = None, literal=None,
              called: dict | None = None, name: str = "r", **attrs) -> Instruction:
    """An Instruction `name = result_shape opcode(operands), attrs...` with decoded attributes preset."""
    ops = []
    for i, o in enumerate(operands):
        if isinstance(o, Instruction):
            ops.append(o)
        else:
            ops.append(Instruction(f"p{i}", "parameter", shape(o), [], {}, args=str(i)))
    raw_attrs = {k: format_attr(v) for k, v in attrs.items()}
    raw_attrs.update(raw or {})
    inst = Instruction(name, opcode, shape(result_shape), ops, raw_attrs)
    inst._decoded = dict(attrs)
    inst.called = dict(called or {})
    if literal is not None:
        inst._decoded["__literal__"] = literal
    params = [o for o in ops if o.opcode == "parameter"]
    Computation("test", [*params, inst], inst, is_entry=True)
    inst.is_root = True
    return inst


def prepare(inst: Instruction, ctx=None):
    """The kernel hloexec's registered op builds for `inst`."""
    return OPS[inst.opcode].prepare(inst, ctx or FakeContext())


# While a list, `run` appends each case it runs with the default context -- (test id, instruction, copies of the
# operand values) -- for conftest.py to run through every tier of hloexec at the end of each test module
# (tests/tiers.py, sweep_op_cases).
RECORDED: list | None = None


def run(inst: Instruction, *values, ctx=None):
    out = prepare(inst, ctx)(*values)
    if RECORDED is not None and ctx is None and not any(isinstance(v, tuple) for v in values):
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
        RECORDED.append((test, inst, [np.array(v) for v in values]))
    return out


def hlo_text(inst: Instruction) -> str:
    """A module whose entry computation takes the operands as parameters and returns `inst`."""
    lines = []
    for i, o in enumerate(inst.operands):
        lines.append(f"  p{i} = {o.shape.to_text(layout=False)} parameter({i})")
    attrs = "".join(f", {k}={v}" for k, v in inst.attrs.items())
    args = ", ".join(f"p{i}" for i in range(len(inst.operands)))
    lines.append(f"  ROOT r = {inst.shape.to_text(layout=False)} {inst.opcode}({args}){attrs}")
    return "HloModule m\n\nENTRY e {\n" + "\n".join(lines) + "\n}\n"


def run_xla(inst: Instruction, *values):
    """Run `inst` on XLA:CPU (via hloexec.tools.xla_cpu); a tuple result comes back as a list."""
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    outs = run_on_xla_cpu(hlo_text(inst), [np.array(v, order="C") for v in values])
    return outs if inst.shape.is_tuple else outs[0]


def flush_denormals(x: np.ndarray) -> np.ndarray:
    """x with f32/f64/bf16 denormals replaced by zeros of the same sign (XLA:CPU's FTZ/DAZ).

    bf16 is included because XLA:CPU computes it in f32, where its denormals are f32 denormals;
    f16 denormals are normal f32 numbers and survive."""
    x = np.asarray(x)
    if x.dtype == ml_dtypes.bfloat16:
        return flush_denormals(x.astype(np.float32)).astype(x.dtype)
    if x.dtype not in (np.float32, np.float64) and x.dtype not in (np.complex64, np.complex128):
        return x
    if x.dtype.kind == "c":
        out = np.empty(x.shape, x.dtype)
        out.real, out.imag = flush_denormals(x.real), flush_denormals(x.imag)
        return out
    tiny = np.finfo(x.dtype).tiny
    return np.where(np.abs(x) < tiny, np.copysign(np.zeros_like(x), x), x)


def bits(x: np.ndarray) -> np.ndarray:
    """The bit patterns of x as unsigned integers (bool stays bool)."""
    x = np.asarray(x)
    if x.dtype == np.bool_:
        return x
    return x.view(f"u{x.dtype.itemsize}")


def random_matrix(rs, dtype, shape):
    """Standard normal values of `dtype` (complex: independent real and imaginary parts)."""
    x = rs.randn(*shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rs.randn(*shape)
    return x.astype(dtype)


def spd_matrix(rs, dtype, n, batch=()):
    """A well-conditioned Hermitian positive definite matrix (a a^H + n I)."""
    a = random_matrix(rs, dtype, (*batch, n, n))
    return (a @ np.swapaxes(a.conj(), -1, -2) + n * np.eye(n)).astype(dtype)
