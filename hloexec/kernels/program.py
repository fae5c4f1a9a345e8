"""Compile a whole control-flow region -- a while loop with its condition and body, the calls, fusions,
conditionals and nested loops inside -- into ONE Numba function.

Interpreted, a loop pays the Python dispatch of every instruction on every step (~0.3-10 us each): a
scalar loop of 20 ops over 1M steps costs seconds where XLA:CPU takes milliseconds. Here the step is
straight-line code. Where `kernels/fusion.py` fuses one output's expression DAG into a loop nest, this
generator materializes every value, one loop nest per instruction, which is what small-array control flow
needs (dynamic-update-slice into the carried state, scatter, gather, dot, reduce with any reducer).

How values live in the generated function
-----------------------------------------
* a rank-0 value is a local scalar in its compute type (kernels/elementwise.py), or a literal;
* an array is a flat 1-D numpy array of its storage type (f16/bf16 as uint16 bits), row-major: reshape and
  copy are free (the same buffer under other dims), and every index is a linear one;
* a tuple exists only while generating: get-tuple-element and tuple resolve to their elements.
Values are immutable in HLO, so buffers are shared freely; an op that writes in place (dynamic-update-slice,
scatter) does so only on a buffer this code owns (created here, or the loop's carried copy) whose every
holder is dead after it and that no other operand of the op reads (`scatter(x, i, x)` reads its updates
while it writes), else on a copy. A conditional's result may be any of its branches' arguments: it counts
as holding their buffers. The carried state is copied once on entry to a loop; each step assigns all the
carried values at once (`a, b = a1, b1`). A buffer a step allocates is allocated once, before the loop,
unless it becomes the next state of this loop or of a loop inside it: then it is new on every step of
that loop and of every loop around it (moved out of an outer loop, the inner loop's first step would
write its old state while still reading it).

Loop-invariant instructions of a body or condition (no dependence on the carried state: XLA's
`reduce(iota * iota)` benchmark) are computed once before the loop.

The function takes the operands' leaves as flat arrays and returns the result's leaves as flat arrays;
`ProgramKernel` (kernels/program_kernel.py) does the flattening. Like fusions, structurally equal regions give
the same source and share one compiled function in-process and on disk.

What each element of an instruction is comes from the element layer (kernels/elements.py: elementwise,
movement and gather; `_ElementsOf` is this generator's Emitter); what is this generator's own: buffers and
their ownership, loops, branches, reductions with any reducer, dot, scatter, dynamic-update-slice in place.
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..errors import TierUnsupported
from ..ir import opcodes
from ..options import Options
from ..ir.attributes import dot_dims
from ..ir.dataflow import computes_from_parameters, is_pure, live_instructions
from ..ir.fma import contract_fma
from . import elements
from . import elementwise as ew
from .cache import source_key
from .codegen import (
    Block,
    Ix,
    constant_storage,
    index_src,
    innermost,
    kernel_module,
    names_in,
    need,
    row_major_strides,
    scalar_literal,
)
from .dot_algorithms import plain_dot
from .index_maps import Scatter, SourceIndex, dilated_element, dot_free_dims, reduce_dims, window_position, window_span
from .program_kernel import ProgramKernel

# Numba compiles ~6-8 ms a generated line, and worse than linearly beyond (2,400 lines: 52 s): a larger
# region runs interpreted.
MAX_LINES = 1200

_IDENTITY_OPS = {"copy", "opt-barrier", "optimization-barrier"}
# A literal or a cast of a name or literal (`np.float32(-np.inf)`, `np.int64(v3)`): cheap to repeat.
_SIMPLE = re.compile(r"^np\.\w+\(-?[\w.]+\)$")


@dataclass(slots=True)
class Scalar:
    expr: str  # a local name or a literal, in the compute type
    et: str


@dataclass(slots=True)
class Array:
    name: str  # a flat 1-D array of the storage type
    dims: tuple
    et: str
    buf: int  # identity of the buffer (shared by reshapes and copies of it)


@dataclass(slots=True)
class Tup:
    items: list


def _leaves(v) -> list:
    return [x for item in v.items for x in _leaves(item)] if isinstance(v, Tup) else [v]


def _bufs(v) -> set[int]:
    return {x.buf for x in _leaves(v) if isinstance(x, Array)}


def _linear(dims, index) -> str:
    """Row-major linear index of `index` (index expressions) into an array of `dims`, as source."""
    lin = None
    for c, s, n in zip(index, row_major_strides(dims), dims):
        if n != 1:
            term = Ix("*", c, s, paren=False) if s != 1 else c
            lin = term if lin is None else Ix("+", lin, term, paren=False)
    return "0" if lin is None else index_src(lin)


def _storage_src(et: str) -> str:
    return f"np.{ew.STORAGE[et].name}"


def _leaf_type(shape) -> tuple:
    need(not shape.is_tuple, "tuple leaf")
    et = shape.element_type.name
    need(ew.supported_type(et), f"type {et}")
    need(not any(shape.dynamic), "dynamic shape")
    return tuple(shape.dims), et


def _shape_leaves(shape) -> list:
    return [_leaf_type(s) for _, s in shape.leaves()]


@dataclass(slots=True)
class _Alloc:
    """An `np.empty` line: a loop moves it before itself when the buffer does not outlive a step."""

    name: str
    size: int
    et: str
    buf: int

    def __str__(self) -> str:
        return f"{self.name} = np.empty({self.size}, {_storage_src(self.et)})"


class LoopGenerator:
    """A control-flow region as one function that materialises every value: buffers (who owns one, when it may
    be written in place, which allocations leave a loop), loops and branches, invariants hoisted; an
    instruction's elements from the element layer (`elemental`), reductions, dot and scatter its own."""

    def __init__(self, options: Options):
        self.options = options
        self.body = Block()  # the function body: lines, _Allocs and blocks
        self.current = self.body  # the block lines go to (at its end)
        self.line_count = 0
        self.n = 0
        self.consts: list[np.ndarray] = []
        self.const_names: dict[int, Array] = {}
        self.mutable: set[int] = set()  # buffers this code may write in place
        self.hoisted: dict[int, object] = {}  # instruction id -> value computed before the enclosing loop
        # buffers allocated on every step of the loop they are in (a loop's next state, a branch's result):
        # never moved out of any loop
        self.pinned: set[int] = set()
        self.aliases: dict[int, frozenset[int]] = {}  # a branch result's buffer -> the buffers it may be
        self.loop_blocks: dict[str, Block] = {}  # a loop variable -> its loop's block

    # -- emitting ---------------------------------------------------------------------------------------
    def fresh(self, prefix="v") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def line(self, text):
        """Add a line (or an _Alloc) to the current block."""
        need(self.line_count < MAX_LINES, "program too large")
        self.line_count += 1
        self.current.insert(text)

    def open(self, header: str) -> Block:
        """A child block of the current block (counting its header line), made the current one."""
        need(self.line_count < MAX_LINES, "program too large")
        self.line_count += 1
        self.current = self.current.open(header)
        return self.current

    def close(self, block: Block):
        """Back to the block around `block`; lines go after it."""
        parent = block.parent
        assert parent is not None, "the function body is never closed"
        self.current = parent
        parent.close(block)

    @contextmanager
    def block(self, header: str):
        block = self.open(header)
        yield block
        self.close(block)

    @contextmanager
    def loops(self, dims):
        """Nested loops over `dims`; yields the index expressions (size-1 dims: the literal 0)."""
        index, opened = [], []
        for n in dims:
            if n == 1:
                index.append("0")
                continue
            var = self.fresh("i")
            opened.append(self.open(f"for {var} in range({n}):"))
            self.loop_blocks[var] = self.current
            index.append(var)
        yield index
        for block in reversed(opened):
            self.close(block)

    def local(self, expr: str, et: str) -> Scalar:
        """A scalar value, named unless it is a literal or a name already (snippets repeat their operands)."""
        if expr.isidentifier() or _SIMPLE.match(expr):
            return Scalar(expr, et)
        name = self.fresh()
        self.line(f"{name} = {expr}")
        return Scalar(name, et)

    def new_array(self, dims, et) -> Array:
        name = self.fresh("a")
        self.n += 1
        self.line(_Alloc(name, math.prod(dims) if dims else 1, et, self.n))
        self.mutable.add(self.n)
        return Array(name, tuple(dims), et, self.n)

    def copy_of(self, a: Array) -> Array:
        out = self.new_array(a.dims, a.et)
        self.line(f"{out.name}[:] = {a.name}")
        return out

    def scalar_of(self, v) -> Scalar:
        """A rank-0 value as a scalar (a one-element array is loaded)."""
        if isinstance(v, Scalar):
            return v
        need(isinstance(v, Array) and math.prod(v.dims) == 1, "scalar expected")
        return self.local(ew.load_src(v.et, f"{v.name}[0]"), v.et)

    def at(self, v, lin: str) -> str:
        """The compute-type value of `v` at linear index `lin` (a scalar broadcasts)."""
        if isinstance(v, Scalar):
            return v.expr
        return ew.load_src(v.et, f"{v.name}[{lin}]")

    def stored(self, v: Scalar) -> str:
        """A scalar as its storage value, computed once (for fills)."""
        s = ew.store_src(v.et, v.expr)
        if s == v.expr:
            return s
        name = self.fresh()
        self.line(f"{name} = {s}")
        return name

    def reach(self, v) -> set[int]:
        """The buffers value `v` may share memory with: its own, and those a conditional's result may be."""
        out = set()
        for b in _bufs(v):
            out.add(b)
            out |= self.aliases.get(b, frozenset())
        return out

    # -- computations -----------------------------------------------------------------------------------
    def computation(self, comp, args: list):
        """Emit `comp` on argument values; returns the root's value."""
        order = list(comp.instructions)
        position = {id(inst): k for k, inst in enumerate(order)}
        need(all(position[id(o)] < position[id(i)] for i in order for o in i.operands), "order")
        live = live_instructions(comp)
        last_use = {id(comp.root): len(order)}
        for k, inst in enumerate(order):
            for o in inst.operands:
                last_use[id(o)] = max(last_use.get(id(o), -1), k)
        vals = {id(i): self.hoisted[id(i)] for i in order if id(i) in self.hoisted}
        for p in comp.parameters:
            vals[id(p)] = args[p.parameter_number]
        for k, inst in enumerate(order):
            if id(inst) not in live or id(inst) in vals:
                continue
            operands = [vals[id(o)] for o in inst.operands]

            def free_after(buf, k=k) -> bool:
                """Whether step k may overwrite `buf`: this code owns it and no value holding it is used later."""
                return buf in self.mutable and all(
                    last_use.get(j, -1) <= k for j, x in vals.items() if buf in self.reach(x)
                )

            def writable(v, operands=operands):
                """`v` itself if step k may overwrite it (free after it, and no other operand of the step reads
                it: `scatter(x, i, x)` reads the updates while it writes), else a copy of it."""
                readers = sum(v.buf in self.reach(leaf) for arg in operands for leaf in _leaves(arg))
                return v if free_after(v.buf) and readers == 1 else self.copy_of(v)

            if inst.opcode in ("call", "fusion"):  # the callee may write what the caller is done with
                donated = frozenset(b for v in operands for b in _bufs(v) if free_after(b))
                vals[id(inst)] = self.inline(self.callee(inst), operands, donated)
                continue
            vals[id(inst)] = self.instruction(inst, operands, writable)
        return vals[id(comp.root)]

    def callee(self, inst):
        """The computation call / fusion `inst` runs: a fusion's with the device's FMA contraction
        (hloexec/ir/fma.py); TierUnsupported for one whose sums YNNPACK orders."""
        if inst.opcode == "call":
            return inst.called["to_apply"]
        comp = inst.called["calls"]
        if ew.sums_in_ynn_order(comp, self.options.reductions):
            raise TierUnsupported(ew.YNN_DECLINED)
        return contract_fma(comp) if self.options.device.fma_contraction else comp

    def inline(self, comp, args: list, donated: frozenset = frozenset()):
        """A called computation: it may not write its arguments in place (the caller may hold them), but
        for the `donated` buffers."""
        held = (set().union(*map(_bufs, args)) & self.mutable if args else set()) - donated
        self.mutable -= held
        try:
            return self.computation(comp, args)
        finally:
            self.mutable |= held

    def hoist_invariants(self, comp):
        """Emit here, before a loop, the instructions of loop computation `comp` -- and of the computations
        it calls -- that do not depend on their computation's parameters, into `self.hoisted`. Their
        buffers are never written in place: the loop reads them on every step."""
        before = set(self.mutable)
        variant = {id(p) for p in comp.parameters}
        live = live_instructions(comp)
        for inst in comp.instructions:
            if id(inst) not in live:
                continue
            invariant_operands = not any(id(o) in variant for o in inst.operands)
            if inst.opcode in ("call", "fusion"):
                called = self.callee(inst)
                if invariant_operands and computes_from_parameters(called):
                    self.hoisted[id(inst)] = self.inline(called, [self.invariant_operand(o) for o in inst.operands])
                else:
                    self.hoist_invariants(called)
                    variant.add(id(inst))
            elif not is_pure(inst) or not invariant_operands:
                variant.add(id(inst))
            elif not (inst.opcode == "constant" and inst.shape.rank == 0):
                operands = [self.invariant_operand(o) for o in inst.operands]
                self.hoisted[id(inst)] = self.instruction(inst, operands, self.copy_of)
        self.mutable = before

    def invariant_operand(self, inst):
        """A hoisted value, or a scalar constant (not hoisted: it is a literal)."""
        if id(inst) in self.hoisted:
            return self.hoisted[id(inst)]
        dims, et = _leaf_type(inst.shape)
        return self.constant(inst, dims, et)

    # -- instructions -----------------------------------------------------------------------------------
    def instruction(self, inst, operands, writable):
        op = inst.opcode
        if op == "tuple":
            return Tup(list(operands))
        if op == "get-tuple-element":
            return operands[0].items[inst.attr("index")]
        if op in _IDENTITY_OPS:
            return operands[0]
        if op in ("call", "fusion"):  # (hoisted: nothing to donate)
            return self.inline(self.callee(inst), operands)
        if op == "while":
            return self.while_loop(inst, operands[0])
        if op == "conditional":
            return self.conditional(inst, operands)
        if op == "reduce":
            return self.reduce(inst, operands)
        if op == "reduce-window":
            return self.reduce_window(inst, operands)
        if op == "scatter":
            return self.scatter(inst, operands, writable)
        need(op != "parameter", "parameter")
        dims, et = _leaf_type(inst.shape)
        if op == "constant":
            return self.constant(inst, dims, et)
        if op in ("reshape", "bitcast"):
            return self.reshape(inst, operands[0], dims, et)
        if op == "dynamic-update-slice":
            return self.dynamic_update_slice(inst, operands, writable)
        if op == "dot":
            out = self.new_array(dims, et)
            self.dot(inst, operands, out)
            return out if dims else self.scalar_of(out)
        need(op in elements.ELEMENTS or op in ew.ELEMENTWISE_OPS, f"opcode {op}")
        return self.elemental(inst, operands, dims, et)

    def constant(self, inst, dims, et):
        if not dims:
            return Scalar(ew.literal_src(et, scalar_literal(inst)), et)
        v = self.const_names.get(id(inst))
        if v is None:
            self.consts.append(constant_storage(inst).reshape(-1))
            self.n += 1
            v = self.const_names[id(inst)] = Array(f"c{len(self.consts) - 1}", dims, et, self.n)
        return v

    def elemental(self, inst, operands, dims, et):
        """`inst`'s elements from the element layer (kernels/elements.py), in one loop nest over its output
        (elementwise ops: one flat loop, their array operands have its dims); a rank-0 one as a local.
        Movement ops copy their operands' stored bits."""
        if not dims and inst.opcode in ew.ELEMENTWISE_OPS:
            return self.local(elements.value(_ElementsOf(self, operands, False), inst, ()), et)
        stored = inst.opcode not in ew.ELEMENTWISE_OPS and inst.opcode != "iota"
        flat = inst.opcode in ew.ELEMENTWISE_OPS
        emitter = _ElementsOf(self, operands, stored, flat)
        out = self.new_array(dims, et)
        with self.loops([math.prod(dims)] if flat else dims) as index:
            emitter.defined.update((v, self.loop_blocks[v]) for v in index if v in self.loop_blocks)
            lin = index[0] if flat else _linear(dims, index)
            value = elements.value(emitter, inst, index)
            self.line(f"{out.name}[{lin}] = {value if stored else ew.store_src(et, value)}")
        return out if dims else self.scalar_of(out)

    def reshape(self, inst, src, dims, et):
        """A reshape, or a bitcast between row-major layouts: the same buffer under other dims. A bitcast between
        other layouts moves the elements (the element layer's)."""
        if inst.opcode == "bitcast":
            need(src.et == et, "bitcast changing type")
            shapes = (inst.shape, inst.operands[0].shape)
            need(not any(s.layout is not None and s.layout.tiles for s in shapes), "tiled layout")
            if not all(s.has_default_layout for s in shapes):
                return self.elemental(inst, [src], dims, et)
        if not dims:
            return self.scalar_of(src)
        if isinstance(src, Scalar):
            out = self.new_array(dims, et)
            self.line(f"{out.name}[0] = {self.stored(src)}")
            return out
        return Array(src.name, dims, et, src.buf)

    def dynamic_update_slice(self, inst, operands, writable):
        x, upd = operands[0], operands[1]
        dims, et = _leaf_type(inst.shape)
        if not dims:
            return self.scalar_of(upd)
        udims = _leaf_type(inst.operands[1].shape)[0]
        st = elements.clamped_starts(_ElementsOf(self, operands, True), inst, 2, udims)
        out = writable(x)
        value = f"{upd.name}[{{}}]" if isinstance(upd, Array) else self.stored(upd)
        with self.loops(udims) as idx:
            dst = _linear(dims, [Ix("+", c, s) for c, s in zip(idx, st)])
            self.line(f"{out.name}[{dst}] = {value.format(_linear(udims, idx))}")
        return out

    # -- loops and branches -----------------------------------------------------------------------------
    def while_loop(self, inst, init):
        cond, body = inst.called["condition"], inst.called["body"]
        state = []
        for leaf in _leaves(init):  # the carried state: locals, arrays copied once
            if isinstance(leaf, Array):
                state.append(self.copy_of(leaf))
            else:
                name = self.fresh("s")
                self.line(f"{name} = {leaf.expr}")
                state.append(Scalar(name, leaf.et))
        shape = _rebuild(init, iter(state))
        outer_hoisted = dict(self.hoisted)  # hoisted values are defined from here on only
        self.hoist_invariants(cond)
        self.hoist_invariants(body)
        loop_bufs = {s.buf for s in state if isinstance(s, Array)}
        with self.block("while True:") as loop:
            pred = self.scalar_of(self.inline(cond, [shape]))
            with self.block(f"if not {pred.expr}:"):
                self.line("break")
            self.mutable |= loop_bufs  # the body owns the carried buffers
            new = _leaves(self.computation(body, [shape]))
            self.mutable -= loop_bufs
            targets, values, seen = [], [], set()
            for s, v in zip(state, new):
                if isinstance(s, Array):
                    # the next step writes the carried buffers in place: each must be its own, and owned
                    if v.buf in seen or not (v.buf in self.mutable or v.buf in loop_bufs):
                        v = self.copy_of(v)
                    seen.add(v.buf)
                    targets.append(s.name)
                    values.append(v.name)
                else:
                    targets.append(s.expr)
                    values.append(self.scalar_of(v).expr)
            if targets:
                self.line(f"{', '.join(targets)} = {', '.join(values)}")
        # Buffers that do not become the next step's state are allocated once, before the loop. Those that do
        # must be new on every step of this loop -- hence of every loop around it: moved out of an outer loop,
        # the first step of this one would write its old state's buffer while it still reads it.
        self.pinned |= seen
        pinned = self.pinned
        for alloc in loop.take(_Alloc, lambda a: a.buf not in pinned):
            self.current.insert_before(loop, alloc)
        self.mutable |= loop_bufs
        self.hoisted = outer_hoisted
        return shape

    def conditional(self, inst, operands):
        selector = self.scalar_of(operands[0])
        if "branch_computations" in inst.called:
            branches = list(inst.called["branch_computations"])
        else:
            branches = [inst.called["true_computation"], inst.called["false_computation"]]
        leaves = _shape_leaves(inst.shape)
        names = [self.fresh("b") for _ in leaves]
        held = None
        may_be = set().union(*map(self.reach, operands[1:]))  # a branch may return its argument
        for k, comp in enumerate(branches):
            if k == len(branches) - 1:  # an index out of range selects the last branch
                header = "else:" if k else "if True:"
            elif selector.et == "pred":  # branches are (true, false)
                header = f"if {selector.expr}:"
            else:
                header = f"{'if' if k == 0 else 'elif'} {selector.expr} == {k}:"
            with self.block(header):
                result = _leaves(self.inline(comp, [operands[k + 1]]))
                for name, v in zip(names, result):
                    if isinstance(v, Array):
                        self.line(f"{name} = {v.name}")
                    else:
                        self.line(f"{name} = {self.scalar_of(v).expr}")
            held = result
            self.pinned |= set().union(*map(_bufs, result))
            may_be |= set().union(*map(self.reach, result))
        out = []
        for name, (dims, et), v in zip(names, leaves, held):
            if isinstance(v, Array):
                self.n += 1
                out.append(Array(name, dims, et, self.n))  # not owned: a branch may return an argument
                self.aliases[self.n] = frozenset(may_be)
            else:
                out.append(Scalar(name, et))
        return _rebuild_shape(inst.shape, iter(out))

    # -- reductions and contractions --------------------------------------------------------------------
    def reduce(self, inst, operands):
        n = len(operands) // 2
        srcs, inits = operands[:n], [self.scalar_of(v) for v in operands[n:]]
        src_dims = _leaf_type(inst.operands[0].shape)[0]
        kept, rdims = reduce_dims(len(src_dims), inst.attr("dimensions", ()))
        out_leaves = _shape_leaves(inst.shape)
        out_dims = out_leaves[0][0]
        reducer = inst.called["to_apply"]
        simple = n == 1 and opcodes.reducer_opcode(reducer)
        outs = [self.new_array(d, et) for d, et in out_leaves] if out_dims else None
        with self.loops([src_dims[d] for d in kept]) as kidx:
            accs = self.accumulators(inits)
            with self.loops([src_dims[d] for d in rdims]) as ridx:  # row-major, as ops/reduction.py folds
                lin = _linear(src_dims, _placed(len(src_dims), (kept, kidx), (rdims, ridx)))
                self.fold_step(reducer, simple, accs, out_leaves, [self.local(self.at(s, lin), s.et) for s in srcs])
            self.fold_result(simple, accs, out_leaves, outs, _linear(out_dims, kidx))
        result = outs or [Scalar(a, et) for a, (_, et) in zip(accs, out_leaves)]
        return Tup(result) if inst.shape.is_tuple else result[0]

    def accumulators(self, inits: list) -> list[str]:
        accs = [self.fresh("r") for _ in inits]
        for a, v in zip(accs, inits):
            self.line(f"{a} = {v.expr}")
        return accs

    def fold_step(self, reducer, simple, accs: list, out_leaves, vals: list):
        """accs = reducer(accs, vals): a `simple` reducer (op(p0, p1), opcodes.reducer_opcode) as one step
        rounded as the reductions rule says, any other computation inlined."""
        if simple:
            step = ew.reducer_step_src(self.options.reductions, simple, out_leaves[0][1], accs[0], vals[0].expr)
            self.line(f"{accs[0]} = {step}")
        else:
            args = [Scalar(a, et) for a, (_, et) in zip(accs, out_leaves)] + vals
            result = _leaves(self.inline(reducer, args))
            self.line(f"{', '.join(accs)} = {', '.join(self.scalar_of(v).expr for v in result)}")

    def fold_result(self, simple, accs: list, out_leaves, outs, lin: str):
        """The accumulators' values (f16/bf16 sums accumulated in f32 rounded once, as op by op), stored at `lin`
        of the `outs` (None: rank-0 results stay scalars)."""
        if simple:
            total = ew.reduction_result_src(
                self.options.reductions, simple, out_leaves[0][1], accs[0], self.options.excess_precision
            )
            if total != accs[0]:
                self.line(f"{accs[0]} = {total}")
        for o, a in zip(outs or (), accs):
            self.line(f"{o.name}[{lin}] = {ew.store_src(o.et, a)}")

    def reduce_window(self, inst, operands):
        """Each output element folds its window of the operand, row-major: window element k along a dim reads
        the operand where `window_position` lands in the padded, base-dilated operand, if `dilated_element`
        finds an element there (padding and holes are skipped; kernels/index_maps.py), as the fusion
        generator and ops/reduction.py walk it."""
        n = len(operands) // 2
        srcs, inits = operands[:n], [self.scalar_of(v) for v in operands[n:]]
        src_dims = _leaf_type(inst.operands[0].shape)[0]
        out_leaves = _shape_leaves(inst.shape)
        out_dims = out_leaves[0][0]
        window = inst.attr("window") or ()
        need(src_dims and len(window) == len(src_dims), "window rank")
        need(not any(w.reversal for w in window), "window reversal")
        reducer = inst.called["to_apply"]
        simple = n == 1 and opcodes.reducer_opcode(reducer)
        outs = [self.new_array(d, et) for d, et in out_leaves]
        ar = SourceIndex()
        with self.loops(out_dims) as oidx:
            accs = self.accumulators(inits)
            with self.loops([w.size for w in window]) as kidx:
                conds, src = [], []
                literal = [0 if i == "0" else i for i in oidx], [0 if k == "0" else k for k in kidx]  # (to fold)
                for out, k, size, out_n, w in zip(*literal, src_dims, out_dims, window):
                    element, holds = dilated_element(
                        ar, size, w.pad_low, w.base_dilation, window_position(ar, w, out, k), window_span(w, out_n)
                    )
                    conds += holds
                    src.append(element)
                if False not in conds:  # (else every window element along a dim is padding: folds nothing)
                    guard = self.open(f"if {' and '.join(map(index_src, conds))}:") if conds else None
                    lin = _linear(src_dims, src)
                    self.fold_step(reducer, simple, accs, out_leaves, [self.local(self.at(s, lin), s.et) for s in srcs])
                    if guard is not None:
                        self.close(guard)
            self.fold_result(simple, accs, out_leaves, outs, _linear(out_dims, oidx))
        return Tup(outs) if inst.shape.is_tuple else outs[0]

    def dot(self, inst, operands, out):
        # a dot the device computes otherwise than its types say runs op by op (ops/contraction.py)
        need(plain_dot(inst, self.options.device), "dot algorithm")
        a, b = operands
        (adims, aet), (bdims, bet) = (_leaf_type(o.shape) for o in inst.operands)
        d = dot_dims(inst)
        lb, rb, lc, rc = map(list, (d.lhs_batch, d.rhs_batch, d.lhs_contracting, d.rhs_contracting))
        lf, rf = dot_free_dims(d, len(adims), len(bdims))
        et = out.et
        acc_et = ew.dot_accumulator(et)
        T = ew.ctype(acc_et)
        with self.loops([adims[k] for k in lb] + [adims[k] for k in lf] + [bdims[k] for k in rf]) as oidx:
            bi, fi, gi = oidx[: len(lb)], oidx[len(lb) : len(lb) + len(lf)], oidx[len(lb) + len(lf) :]
            acc = self.fresh("r")
            self.line(f"{acc} = {T}(0)")
            with self.loops([adims[k] for k in lc]) as cidx:
                ai = _placed(len(adims), (lb, bi), (lf, fi), (lc, cidx))
                bj = _placed(len(bdims), (rb, bi), (rf, gi), (rc, cidx))
                x = ew.convert_src(aet, acc_et, self.at(a, _linear(adims, ai)), True)
                y = ew.convert_src(bet, acc_et, self.at(b, _linear(bdims, bj)), True)
                need(x is not None and y is not None, "dot types")
                self.line(f"{acc} = {T}({acc} + {T}({x}) * {T}({y}))")
            res = ew.convert_src(acc_et, et, acc, self.options.excess_precision)
            self.line(f"{out.name}[{_linear(out.dims, oidx)}] = {ew.store_src(et, res)}")

    # -- indexing ---------------------------------------------------------------------------------------
    def index_arith(self) -> SourceIndex:
        """The index maps' source interpreter, naming what a formula binds as an int64 local."""
        return SourceIndex(lambda e: self.local(index_src(e) if isinstance(e, Ix) else str(e), "s64").expr)

    def index_loader(self, indices, vectors):
        """`load(position)` for the index maps' formulas: the start-indices value at a position of
        `vectors.dims`, as source."""
        if isinstance(indices, Scalar):
            return lambda position: indices.expr
        return lambda position: self.at(indices, _linear(vectors.dims, position))

    def scatter(self, inst, operands, writable):
        n = (len(operands) - 1) // 2
        geometry = Scatter.of(inst)
        xdims = geometry.operand_dims
        need(xdims, "rank-0 scatter")
        indices, updates = operands[n], operands[n + 1 :]
        udims = _leaf_type(inst.operands[n + 1].shape)[0]
        need(len(geometry.window_src) == len(geometry.window_dims), "scatter window dims")
        outs = [writable(x) if isinstance(x, Array) else None for x in operands[:n]]
        need(all(outs), "scalar scatter operand")
        ets = [o.et for o in outs]
        comp = inst.called["to_apply"]
        ar = self.index_arith()
        with self.loops(udims) as uidx:  # row-major over the updates, as op by op
            starts = geometry.starts(ar, self.index_loader(indices, geometry.vectors), uidx)
            inside = " and ".join(map(str, geometry.window_fits(ar, starts)))
            with self.block(f"if {inside or 'True'}:"):
                lin = self.local(_linear(xdims, geometry.operand_index(ar, starts, uidx)), "s64").expr
                olds = [self.local(self.at(o, lin), o.et) for o in outs]
                news = [self.local(self.at(u, _linear(udims, uidx)), u.et) for u in updates]
                result = _leaves(self.inline(comp, olds + news))
                for o, v, et in zip(outs, result, ets):
                    self.line(f"{o.name}[{lin}] = {ew.store_src(et, self.scalar_of(v).expr)}")
        return Tup(outs) if inst.shape.is_tuple else outs[0]


class _ElementsOf:
    """The loop generator as the element layer's Emitter for one instruction's loop nest: operands loaded from
    their buffers at the linear index (`stored`: their stored bits, copied by a movement op; else their compute
    values, named); a named value goes in the outermost of its loops that defines what it uses (a scalar
    operand before the nest, a gather's starts once per batch position)."""

    def __init__(self, g: LoopGenerator, operands: list, stored: bool, flat: bool = False):
        self.g, self.options, self.operands, self.stored, self.flat = g, g.options, operands, stored, flat
        self.ar = SourceIndex(lambda e: self.named(index_src(e) if isinstance(e, Ix) else str(e), names_in(e)))
        self.before = g.current  # the block around the nest: its lines go before the nest
        self.defined: dict[str, Block] = {}  # names of the nest (loop variables, values) -> their block

    def operand(self, inst, k, index) -> str:
        v = self.operands[k]
        if isinstance(v, Scalar):  # (broadcast: named before the nest)
            return self.named(ew.store_src(v.et, v.expr), names_in(v.expr)) if self.stored else v.expr
        lin = index[0] if self.flat else _linear(v.dims, index)
        if self.stored:
            return f"{v.name}[{lin}]"
        name = self.g.local(self.g.at(v, lin), v.et).expr
        self.defined[name] = self.g.current
        return name

    def index_at(self, inst, k, position) -> str:
        v = self.operands[k]
        if isinstance(v, Scalar):
            return v.expr
        lin = _linear(v.dims, position)
        return self.named(self.g.at(v, lin), names_in(lin))

    def named(self, expr: str, deps) -> str:
        target = innermost(self.before, [d for d in deps if isinstance(d, str)], self.defined)
        inside, self.g.current = self.g.current, target
        try:
            name = self.g.local(expr, "").expr
        finally:
            self.g.current = inside
        self.defined.setdefault(name, target)
        return name

    def guarded(self, inst, index, cases, default) -> str:
        """res = default; if <conds of a case>: res = <its value>."""
        res = self.g.fresh()
        self.g.line(
            f"{res} = {default() if default is not None else _storage_src(inst.shape.element_type.name) + '(0)'}"
        )
        for conds, case in cases:
            with self.g.block(f"if {' and '.join(map(index_src, conds))}:"):
                self.g.line(f"{res} = {case()}")
        return res


def _placed(rank: int, *parts) -> list:
    """An index of `rank` components from (dims, components) pairs: each puts its components at its dims
    (dot: batch, free and contracting dims of each operand; reduce: kept and reduced dims; ...)."""
    index = [None] * rank
    for dims, comps in parts:
        for d, c in zip(dims, comps):
            index[d] = c
    return index


def _rebuild(like, leaves):
    return Tup([_rebuild(x, leaves) for x in like.items]) if isinstance(like, Tup) else next(leaves)


def _rebuild_shape(shape, leaves):
    return Tup([_rebuild_shape(s, leaves) for s in shape.tuple_shapes]) if shape.is_tuple else next(leaves)


def _generate(inst, options: Options):
    gen = LoopGenerator(options)
    args = []
    for k, (dims, et) in enumerate(leaf for o in inst.operands for leaf in _shape_leaves(o.shape)):
        gen.n += 1
        arr = Array(f"t{k}", dims, et, gen.n)  # the caller's: never written
        args.append(gen.scalar_of(arr) if not dims else arr)
    leaves = iter(args)
    operands = [_rebuild_shape(o.shape, leaves) for o in inst.operands]
    result = gen.instruction(inst, operands, gen.copy_of)
    outs = []
    for v, (dims, et) in zip(_leaves(result), _shape_leaves(inst.shape)):
        if isinstance(v, Scalar) or not dims:
            v = gen.scalar_of(v)
            name = gen.fresh("a")
            gen.line(f"{name} = np.empty(1, {_storage_src(et)})")
            gen.line(f"{name}[0] = {ew.store_src(et, v.expr)}")
            outs.append(name)
        else:
            outs.append(v.name)
    gen.line(f"return ({', '.join(outs)},)")
    params = [f"t{k}" for k in range(len(args))] + [f"c{k}" for k in range(len(gen.consts))]
    return kernel_module("program", params, gen.body.render(1)), gen


def compile_program(inst, options: Options = Options()):
    """A ProgramKernel computing instruction `inst` (a while loop, conditional, call, ...) from its
    operands as one Numba function under `options` (the numerics rules, hloexec.options); raises
    TierUnsupported(reason) where this generator declines anything in it. Compiles on `.compile()`."""
    try:
        source, gen = _generate(inst, options)
    except RecursionError:  # computations nested deeper than Python's recursion limit
        raise TierUnsupported("computations nested deeper than Python's recursion limit") from None
    key = source_key(source, "p")
    params = [leaf for o in inst.operands for leaf in _shape_leaves(o.shape)]
    return ProgramKernel(source, key, [o.shape for o in inst.operands], params, inst.shape, gen.consts)
