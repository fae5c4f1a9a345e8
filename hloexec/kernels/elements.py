"""Each opcode's value at an index, once, for both compiled tiers (XLA's ElementalIrEmitter::MakeElementGenerator:
one "value at this index" per opcode that every loop emitter uses).

`value(e, inst, index)` is the source of `inst`'s element at `index` (one index component per dim: literals,
names or `codegen.Ix` expressions), written against an `Emitter` `e` -- what a generator supplies: its operands'
values at an index, naming, and a choice between guarded values. The element functions say *what* an element is
(elementwise ops from the scalar-semantics table through kernels/elementwise.py, movement ops and gather from
the index formulas of kernels/index_maps.py); the generators say *where* the loops go and what is materialised:

* the fusion generator (kernels/fusion.py) asks for the root's value at its loop indices; an operand's value
  is its own element function at the rewritten index (no temporaries);
* the loop generator (kernels/program.py) materialises every instruction: one loop nest over its output,
  its operands loaded from their buffers.

Movement ops and gather pass an operand's value through unchanged: a generator may hand them its values in any
domain (the loop generator copies the stored bits, f16 as uint16; start indices come in their compute type,
`index_at`); every other op computes in the compute types.
"""

from __future__ import annotations

from typing import Protocol

from ..errors import TierUnsupported
from ..options import Options
from . import elementwise as ew
from .codegen import need
from .index_maps import (
    Gather,
    SourceIndex,
    bitcast_source,
    broadcast_source,
    clamped_start,
    concatenate_parts,
    dilated_element,
    offset_source,
    reshape_source,
    reverse_source,
    slice_source,
    transpose_source,
)


class Emitter(Protocol):
    """What a generator gives the element functions."""

    options: Options  # the numerics rules
    ar: SourceIndex  # the index arithmetic the formulas are evaluated with

    def operand(self, inst, k: int, index) -> str:
        """Operand k's value at `index` (index components: literals, names, Ix); a rank-0 operand's value
        at any index."""

    def index_at(self, inst, k: int, position) -> str:
        """Integer operand k (start indices) at `position` of its dims, in its compute type."""

    def named(self, expr: str, deps: list) -> str:
        """`expr` (a value depending on the names `deps`) as a name or literal computed once."""

    def guarded(self, inst, index, cases: list, default) -> str:
        """The value of the case (conditions, value thunk) whose conditions hold -- at most one does -- else
        `default()` (None: a zero, for cases that cover every index); every case has conditions."""


def value(e: Emitter, inst, index) -> str:
    """The source of `inst`'s element at `index`; TierUnsupported where the compiled tiers lack it."""
    element = ELEMENTS.get(inst.opcode) or (_elementwise if inst.opcode in ew.ELEMENTWISE_OPS else None)
    if element is None:
        raise TierUnsupported(f"opcode {inst.opcode}")
    return element(e, inst, index)


def _elementwise(e, inst, index):
    vals = [e.operand(inst, k, index) for k in range(len(inst.operands))]
    expr = ew.instruction_src(inst, vals, e.options.excess_precision, e.options.device.transcendentals)
    need(expr is not None, f"{inst.opcode} on {inst.shape.element_type.name}")
    return vals[0] if expr == vals[0] else e.named(expr, vals)


def _iota(e, inst, index):
    c = index[inst.attr("iota_dimension")]
    expr = ew.iota_src(inst.shape.element_type.name, str(c))
    need(expr is not None, "iota type")
    return e.named(expr, [c])


def _moved(source_index):
    """The element function of a movement op reading operand 0 at `source_index(e, inst, index)`."""
    return lambda e, inst, index: e.operand(inst, 0, source_index(e, inst, index))


def _bitcast(e, inst, index):
    src = inst.operands[0].shape
    need(src.element_type is inst.shape.element_type, "bitcast changing type")
    for s in (src, inst.shape):
        need(s.layout is None or (not s.layout.tiles and not s.layout.element_size_bits), "tiled layout")
    return e.operand(inst, 0, bitcast_source(e.ar, src, inst.shape, index))


def clamped_starts(e: Emitter, inst, first: int, sizes) -> list[str]:
    """The starts of a dynamic slice of `sizes` (dynamic-slice's, dynamic-update-slice's update's), rank-0
    operands first.., of `inst`'s operand 0, each moved so the slice fits (`clamped_start`), named once."""
    starts = inst.operands[first:]
    need(len(starts) == inst.operands[0].shape.rank and all(s.shape.rank == 0 for s in starts), "start indices")
    clamped = []
    for k, (s, n, size) in enumerate(zip(starts, inst.operands[0].shape.dims, sizes)):
        sv = e.index_at(inst, first + k, ())
        u64 = s.shape.element_type.name == "u64"
        clamped.append(e.named(str(clamped_start(SourceIndex(), sv, u64, n, size)), [sv]))
    return clamped


def _dynamic_slice(e, inst, index):
    starts = clamped_starts(e, inst, 1, inst.attr("dynamic_slice_sizes"))
    return e.operand(inst, 0, offset_source(e.ar, starts, index))


def _gather(e, inst, index):
    """The operand element of the slice the index vector at the output's batch position starts (`Gather`'s
    formulas: starts clamped so the slice fits)."""
    g = Gather.of(inst)
    need(len(g.offset_src) == len(g.offset_dims), "gather offset dims")
    rank = inst.operands[1].shape.rank  # (an implied trailing vector dim is not the array's)
    starts = g.starts(e.ar, lambda position: e.index_at(inst, 1, position[:rank]), [index[d] for d in g.batch_dims])
    return e.operand(inst, 0, g.source_index(e.ar, starts, [index[d] for d in g.offset_dims]))


def _choose(e, inst, index, cases, default):
    """The value of the case (conditions, value thunk) whose conditions hold, else `default()`: cases whose
    conditions fold are decided here, the others guarded by the generator."""
    cases = [(conds, case) for conds, case in cases if False not in conds]
    for conds, case in cases:
        if not conds:
            return case()
    return e.guarded(inst, index, cases, default) if cases else default()


def _pad(e, inst, index):
    """The operand element `dilated_element` finds at `index` (interior padding is a base dilation) where its
    conditions hold, else the padding value."""
    conds, comps = [], []
    for c, n, out_n, p in zip(index, inst.operands[0].shape.dims, inst.shape.dims, inst.attr("padding")):
        element, holds = dilated_element(e.ar, n, p.low, p.interior + 1, c, out_n - 1)
        conds += holds
        comps.append(element)
    return _choose(e, inst, index, [(conds, lambda: e.operand(inst, 0, comps))], lambda: e.operand(inst, 1, ()))


def _concatenate(e, inst, index):
    parts = concatenate_parts(
        e.ar, [o.shape.dims[inst.attr("dimensions")[0]] for o in inst.operands], inst.attr("dimensions")[0], index
    )
    return _choose(
        e, inst, index, [(conds, lambda k=k, src=src: e.operand(inst, k, src)) for k, conds, src in parts], None
    )


ELEMENTS = {
    "iota": _iota,
    "copy": _moved(lambda e, inst, index: index),
    "broadcast": _moved(lambda e, inst, index: broadcast_source(inst.attr("dimensions", ()), index)),
    "transpose": _moved(lambda e, inst, index: transpose_source(inst.attr("dimensions"), index)),
    "reshape": _moved(lambda e, inst, index: reshape_source(e.ar, inst.operands[0].shape.dims, inst.shape.dims, index)),
    "slice": _moved(
        lambda e, inst, index: slice_source(e.ar, [(s.start, s.stride) for s in inst.attr("slice")], index)
    ),
    "reverse": _moved(
        lambda e, inst, index: reverse_source(
            e.ar, inst.operands[0].shape.dims, set(inst.attr("dimensions", ())), index
        )
    ),
    "bitcast": _bitcast,
    "dynamic-slice": _dynamic_slice,
    "pad": _pad,
    "concatenate": _concatenate,
    "gather": _gather,
}
