"""The op registry: one entry per HLO opcode, holding its semantics, shape rule and kernel.

An op is a function `prepare(inst, ctx) -> kernel`, registered with `@op("opcode", ...)`. `prepare` runs
once per instruction when a module is prepared: it decodes attributes, checks what it supports (raising
UnsupportedError naming the instruction) and returns `kernel(*operand_values) -> value`, which the
executor calls on every run. Values are C-contiguous numpy arrays in logical (row-major) order with
the instruction's exact dtype (bf16/fp8 via ml_dtypes, pred as bool), or tuples of values.

`ctx` gives an op what lies outside it (see `Context`): callables for the computations it calls, the
precision mode, the device it runs as.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from ..errors import UnsupportedError


class Context(Protocol):
    excess_precision: bool      # skip f16/bf16 rounding between ops inside a fusion
    reductions: str             # "accumulate" | "per-step": how add/multiply reductions round (kernels/elementwise.py)

    def computation(self, comp, fuse: bool = True) -> Callable:
        """A callable running `comp`: f(*parameter_values) -> value of its root (`fuse`: may compile
        its unfused elementwise chains)."""

    @property
    def device(self):
        """The participant this run is: .replica_id, .partition_id, .communicator (collectives)."""


@dataclass(frozen=True, slots=True)
class OpDef:
    opcode: str
    prepare: Callable            # (inst, ctx) -> kernel(*values) -> value
    dtypes: str                  # element types it runs on, for the README's coverage table
    kernel: str                  # what does the work: numba | numpy | blas | python
    notes: str                   # semantics worth knowing (XLA section, deviations)
    shape_rule: Callable | None  # (inst) -> Shape, for instructions written without a shape


OPS: dict[str, OpDef] = {}

ALL = "pred, s8-s64, u8-u64, f16, bf16, f32, f64, f8"
FLOATS = "f16, bf16, f32, f64, f8"


def op(*opcodes: str, dtypes: str = ALL, kernel: str = "numpy", notes: str = "", shape_rule=None):
    """Register `prepare` for each opcode (aliases share one implementation)."""
    def register(prepare):
        for opcode in opcodes:
            if opcode in OPS:
                raise ValueError(f"opcode {opcode!r} registered twice")
            OPS[opcode] = OpDef(opcode, prepare, dtypes, kernel, notes, shape_rule)
        return prepare
    return register


def lookup(inst) -> OpDef:
    try:
        return OPS[inst.opcode]
    except KeyError:
        raise UnsupportedError(f"unsupported opcode {inst.opcode!r}", inst) from None
