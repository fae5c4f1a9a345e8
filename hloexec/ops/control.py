"""Structure and control flow: fusion, call, while, conditional, map, async wrappers, markers."""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedError
from ..ir.fma import contract_fma
from ..ir.opcodes import converted_reducer
from .common import TOKEN, as_tuple, called, invalid, zeros_of
from .reduction import converted_step
from .registry import async_shorthand, lookup, op


@op(
    "fusion",
    kernel="numba",
    notes="one compiled loop nest when its ops allow (see kernels/fusion.py); "
    "otherwise the fused computation runs op by op",
)
def fusion(inst, ctx):
    comp = inst.called["calls"]
    if ctx.options.device.fma_contraction:
        comp = contract_fma(comp)
    compiled = ctx.fused_kernel(comp)
    return compiled if compiled is not None else ctx.computation(comp, fuse=False)


@op("call", kernel="python")
def call(inst, ctx):
    return ctx.computation(inst.called["to_apply"])


@op(
    "while",
    kernel="numba",
    notes="runs body while condition holds; the carried value is its single operand. "
    "Interpreted step by step at first; once it has run 2^16 instructions (250 per generated line if more) "
    "it compiles whole, condition, body and what they call, into one function (kernels/program.py), where "
    "its ops allow",
)
def while_(inst, ctx):
    compiled = ctx.compiled_loop(inst)
    if compiled is not None:
        return compiled
    cond, body = ctx.computation(inst.called["condition"]), ctx.computation(inst.called["body"])

    def run(state):
        while bool(cond(state)):
            state = body(state)
        return state

    return run


@op(
    "conditional",
    kernel="python",
    notes="pred selects true/false computation; s32 index selects a branch, out of range -> last branch",
)
def conditional(inst, ctx):
    if "branch_computations" in inst.called:
        branches = [ctx.computation(c) for c in inst.called["branch_computations"]]
    else:
        branches = [ctx.computation(inst.called["true_computation"]), ctx.computation(inst.called["false_computation"])]
    selector = inst.operands[0].shape
    if selector.is_tuple or selector.rank or selector.element_type.name not in ("pred", "s32"):
        raise invalid(inst, f"the selector {selector.to_text(False)} (a pred[] or s32[] is expected)")
    if len(inst.operands) != len(branches) + 1:
        raise invalid(inst, f"{len(branches)} branches and {len(inst.operands) - 1} branch operands")
    is_pred = selector.element_type.name == "pred"

    def run(selector, *branch_args):
        if is_pred:
            return branches[0 if bool(selector) else 1](branch_args[0])
        index = int(selector)
        if index < 0 or index >= len(branches):
            index = len(branches) - 1
        return branches[index](branch_args[index])

    return run


@op(
    "map",
    kernel="python",
    notes="applies the computation per element (slow: one Python call per element); a convert(convert(op)) of "
    "its two parameters (XLA:CPU's bf16 scans) to all elements at once",
)
def map_(inst, ctx):
    comp = inst.called["to_apply"]
    dtype = inst.shape.dtype
    converted = converted_reducer(comp) if len(inst.operands) == 2 else None
    if converted is not None:  # (the reducer's own kernels on whole arrays: the per-element path's bits)
        step = converted_step(converted, ctx)

        def converted_map(a, b):
            with np.errstate(all="ignore"):
                return np.asarray(step(a, b), dtype).reshape(inst.shape.dims)

        return converted_map
    fn = ctx.computation(comp)

    def run(*arrays):
        out = np.empty(inst.shape.dims, dtype)
        flat = [a.reshape(-1) for a in arrays]
        result = out.reshape(-1)
        for i in range(result.size):
            result[i] = as_tuple(fn(*[np.asarray(f[i]).reshape(()) for f in flat]))[0]  # maybe a 1-tuple
        return out

    return run


def _identity(x, *_):
    return x


def _tuple_of_operands(*xs):
    return tuple(xs)


@op(
    "opt-barrier",
    "optimization-barrier",
    kernel="python",
    notes="identity (XLA prints kOptimizationBarrier as opt-barrier)",
)
def optimization_barrier(inst, ctx):
    return _identity


@op("add-dependency", kernel="python", notes="identity on operand 0")
def add_dependency(inst, ctx):
    return _identity


@op("after-all", kernel="python", notes="produces a token")
def after_all(inst, ctx):
    return lambda *_: TOKEN


@op("domain", kernel="python", notes="identity")
def domain(inst, ctx):
    return _identity


# -- async wrappers: the value of an async-start is (operands, result, context...) ----------------------
@op(
    "async-start",
    kernel="python",
    notes="runs the wrapped computation at once; -update/-done pass it on. "
    "`X-start`/`X-update`/`X-done` of any op X that has no async opcode of its own (all-to-all-start, "
    "reduce-scatter-start, collective-broadcast-start, ragged-all-to-all-start, ...) are these, wrapping X "
    "(as XLA's parser reads them)",
)
def async_start(inst, ctx):
    shape = inst.shape
    if not shape.is_tuple or len(shape.tuple_shapes) < 2:
        raise UnsupportedError(
            f"{inst.opcode} of shape {shape.to_text(False)}: expected (operands, result, context...)", inst
        )
    if inst.opcode == "async-start":
        wrapped = ctx.computation(called(inst, "calls"))
    else:  # the shorthand: the wrapped op's attributes are this instruction's
        view = inst.wrapped_as(async_shorthand(inst.opcode)[1], shape.tuple_shapes[1])
        wrapped = lookup(view).prepare(view, ctx)
    contexts = shape.tuple_shapes[2:]

    def run(*xs):
        return (tuple(xs), wrapped(*xs), *(zeros_of(s) for s in contexts))

    return run


@op("async-update", kernel="python")
def async_update(inst, ctx):
    return _identity


@op("async-done", kernel="python")
def async_done(inst, ctx):
    return lambda state: state[1]


@op("copy-start", kernel="python", notes="(destination, source, context) as XLA defines it")
def copy_start(inst, ctx):
    return lambda x: (x, x, np.zeros((), np.uint32))


@op("copy-done", kernel="python")
def copy_done(inst, ctx):
    return lambda state: state[0]


# Read at run time: SPMD participants share one prepared plan, each thread playing its own device.
@op("partition-id", kernel="python", dtypes="u32")
def partition_id(inst, ctx):
    dtype = inst.shape.dtype
    return lambda: np.array(ctx.device.partition_id, dtype=dtype)


@op("replica-id", kernel="python", dtypes="u32")
def replica_id(inst, ctx):
    dtype = inst.shape.dtype
    return lambda: np.array(ctx.device.replica_id, dtype=dtype)


@op("infeed", "outfeed", kernel="python", notes="host/device transfer: not executable offline")
def unsupported_transfer(inst, ctx):
    raise UnsupportedError(f"{inst.opcode} talks to a host or peer that does not exist in an offline run", inst)
