"""The op registry: one entry per HLO opcode, holding its semantics and kernel (its shape rule is in
hloexec/ir/shape_inference.py, checked here before an op is prepared).

An op is a function `prepare(inst, ctx) -> kernel`, registered with `@op("opcode", ...)`. `prepare` runs
once per instruction when a module is prepared: it decodes attributes, checks what it supports (raising
UnsupportedError naming the instruction) and returns `kernel(*operand_values) -> value`, which the
executor calls on every run. Values are C-contiguous numpy arrays in logical (row-major) order with
the instruction's exact dtype (bf16/fp8 via ml_dtypes, pred as bool), or tuples of values.

`ctx` gives an op what lies outside it (see `Context`): callables for the computations it calls, the compiled
tiers it may run instead, how it computes (its options: the device profile, reductions...), the module, the
participant it runs as.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol
from collections.abc import Callable

from ..errors import UnsupportedError
from ..ir import opcodes
from ..ir.shape_inference import check_call, check_shape
from ..options import Options


class Context(Protocol):
    """Everything an op may ask of its context, and nothing more (tests/test_layers.py checks both ways against
    the `ctx.` uses in hloexec/ops/). An op may also key per-module state on it (a weakref.WeakKeyDictionary)."""

    options: Options  # how the module computes: the device profile, reductions, excess precision
    module: object  # the module being prepared (hloexec.ir.module.Module)
    use_numba: bool  # whether ops may run Numba-compiled helpers (False: the numpy kernels only)

    def computation(self, comp, fuse: bool = True) -> Callable:
        """A callable running `comp`: f(*parameter_values) -> value of its root (`fuse`: may compile
        its unfused elementwise chains)."""

    @property
    def device(self):
        """The participant this run is: .replica_id, .partition_id, .communicator (collectives)."""

    def fused_kernel(self, comp) -> Callable | None:
        """A compiled kernel running fused computation `comp`, or None: run it op by op (ops/control.py)."""

    def compiled_loop(self, inst) -> Callable | None:
        """The while loop `inst` as a callable that compiles once it has run long enough, or None: interpret it."""


@dataclass(frozen=True, slots=True)
class OpDef:
    opcode: str
    prepare: Callable  # (inst, ctx) -> kernel(*values) -> value
    dtypes: str  # element types it runs on, for the op coverage table
    kernel: str  # what does the work: numba | numpy | blas | python
    notes: str  # semantics worth knowing (XLA section, deviations)


OPS: dict[str, OpDef] = {}

ALL = "pred, s2-s64, u2-u64, f16, bf16, f32, f64, f8, f6, f4"
FLOATS = "f16, bf16, f32, f64, f8, f6, f4"


def op(*opcodes: str, dtypes: str = ALL, kernel: str = "numpy", notes: str = ""):
    """Register `prepare` for each opcode (aliases share one implementation)."""

    def register(prepare):
        for opcode in opcodes:
            if opcode in OPS:
                raise ValueError(f"opcode {opcode!r} registered twice")
            OPS[opcode] = OpDef(opcode, prepare, dtypes, kernel, notes)
        return prepare

    return register


# XLA's parser reads `X-start` / `X-update` / `X-done`, where that is no opcode of its own but X is, as
# async-start / async-update / async-done wrapping an X (hlo_parser.cc ParseOpcode): `all-to-all-start`.
_ASYNC_SUFFIXES = (("-start", "async-start"), ("-update", "async-update"), ("-done", "async-done"))


def async_shorthand(opcode: str) -> tuple[str, str] | None:
    """(async-start | async-update | async-done, the wrapped opcode) when `opcode` is such a shorthand, else None."""
    if opcode in OPS:
        return None
    for suffix, generic in _ASYNC_SUFFIXES:
        if opcode.endswith(suffix) and opcode[: -len(suffix)] in OPS:
            return generic, opcode[: -len(suffix)]
    return None


# Opcodes whose result may be a tuple; every other op makes an array (XLA's shape inference). A bitcast keeps
# its operand's shape, tuples too: the GPT seed's partitioned module bitcasts its loop state tuple.
TUPLE_RESULTS = (
    frozenset(
        {
            "tuple",
            "bitcast",
            "get-tuple-element",
            "constant",
            "while",
            "conditional",
            "call",
            "fusion",
            "custom-call",
            "copy",
            "async-start",
            "async-update",
            "async-done",
            "copy-start",
            "send",
            "recv",
            "recv-done",
            "infeed",
            "batch-norm-training",
            "batch-norm-grad",
            "rng-bit-generator",
            "reduce",
            "reduce-window",
            "scatter",
            "sort",
            "topk",
            "opt-barrier",
            "optimization-barrier",
            "domain",
            "scan",
            "add-dependency",
        }
    )
    | opcodes.COLLECTIVES
)
# Opcodes whose operands are arrays (XLA's shape inference refuses tuples and tokens there): elementwise math,
# movement, contractions, reductions, indexing. Their prepares may take every operand's dtype for granted.
ARRAY_OPERANDS = (opcodes.ELEMENTWISE - {"copy"}) | frozenset(
    (
        "reshape",
        "transpose",
        "broadcast",
        "reverse",
        "slice",
        "fft",
        "cholesky",
        "topk",
        "pad",
        "gather",
        "triangular-solve",
        "stochastic-convert",
        "convolution",
        "dot",
        "scaled-dot",
        "ragged-dot",
        "dynamic-slice",
        "dynamic-update-slice",
        "concatenate",
        "sort",
        "map",
        "reduce",
        "reduce-window",
        "scatter",
        "select-and-scatter",
        "batch-norm-training",
        "batch-norm-inference",
        "batch-norm-grad",
    )
)
# ... and whose result is one array too (the rest of ARRAY_OPERANDS may make tuples: variadic reduce, sort, ...)
ARRAY_RESULT = ARRAY_OPERANDS - TUPLE_RESULTS
# The computations XLA's parser requires (one of the alternatives, each a tuple of attribute keys).
CALLS: dict[str, tuple[tuple[str, ...], ...]] = {
    **{
        o: (("to_apply",),)
        for o in (
            "call",
            "map",
            "reduce",
            "reduce-window",
            "scatter",
            "all-reduce",
            "all-reduce-start",
            "reduce-scatter",
            "scan",
        )
    },
    "sort": (("to_apply",), ("comparator",)),
    "fusion": (("calls",),),
    "async-start": (("calls",),),
    "while": (("condition", "body"),),
    "conditional": (("branch_computations",), ("true_computation", "false_computation")),
    "select-and-scatter": (("select", "scatter"),),
}


def operand_count_ok(opcode: str, n: int) -> bool:
    """Whether XLA's parser takes `opcode` with `n` operands (opcodes.OPERAND_COUNTS)."""
    least, most, step = opcodes.OPERAND_COUNTS.get(opcode, (0, None, 1))
    return least <= n and (most is None or n <= most) and (n - least) % step == 0


def check_form(inst, opcode: str) -> None:
    """The operand count and called computations XLA's parser requires of `opcode` (HloParseError), an array
    result where XLA's shape rules give one, and a written shape that is what the operands give
    (ir/shape_inference.py, as XLA's verifier; UnsupportedError): what every op's prepare may take for granted."""
    n = len(inst.operands)
    if not operand_count_ok(opcode, n):
        least, most, step = opcodes.OPERAND_COUNTS.get(opcode, (0, None, 1))
        wanted = str(least) if most == least else f"{least} or more" if most is None else f"{least} to {most}"
        if step == 2:
            wanted += f" ({'even' if least % 2 == 0 else 'odd'})"
        raise inst.parse_error(f"{opcode} expects {wanted} operands, has {n}")
    alternatives = CALLS.get(opcode if opcode != "async-start" or inst.opcode == "async-start" else "")
    if alternatives and not any(all(k in inst.called for k in keys) for keys in alternatives):
        raise inst.parse_error(
            f"{opcode} needs the computation attribute "
            + " or ".join("/".join(f"{k}=" for k in keys) for keys in alternatives)
        )
    if opcode in ARRAY_OPERANDS:
        for o in inst.operands:
            if not o.shape.is_array:
                raise UnsupportedError(f"{opcode} takes arrays; operand %{o.name} is {o.shape.to_text(False)}", inst)
    if opcode in ARRAY_RESULT and not inst.shape.is_tuple and not inst.shape.is_array:
        raise UnsupportedError(f"{opcode} makes an array, not {inst.shape.to_text(False)}", inst)
    if inst.shape.is_tuple and opcode not in TUPLE_RESULTS:
        raise UnsupportedError(
            f"{opcode} with the tuple result {inst.shape.to_text(False)}: XLA's shape rules give it an array", inst
        )
    why = check_shape(opcode, [o.shape for o in inst.operands], inst.attr, inst.shape)
    if why is not None:
        raise UnsupportedError(f"shape {inst.shape.to_text(False)} is not what the operands give: {why}", inst)
    if opcode in ("fusion", "call") and inst.opcode == opcode:  # the result is the called computation's
        called = inst.called_computation("calls" if opcode == "fusion" else "to_apply")
        why = check_call(inst, called)
        if why is not None:
            raise UnsupportedError(
                f"{opcode} {inst.shape.to_text(False)} does not fit computation %{called.name}: {why}", inst
            )


def lookup(inst) -> OpDef:
    """The op of `inst`, its operand count and result form checked (check_form)."""
    opdef = OPS.get(inst.opcode)
    if opdef is None:
        shorthand = async_shorthand(inst.opcode)
        if shorthand is None:
            raise UnsupportedError(f"unsupported opcode {inst.opcode!r}", inst)
        opdef = OPS[shorthand[0]]  # the wrapped op's form is checked when the async-start prepares it
    check_form(inst, opdef.opcode)
    return opdef
