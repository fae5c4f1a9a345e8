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
`ProgramKernel` does the flattening. Like fusions, structurally equal regions give the same source and
share one compiled function in-process and on disk.
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
from ..ir.fma import contract_fma
from . import elementwise as ew
from .cache import array_arg, compile_signature, load_kernel, source_key
from .codegen import Block, Ix, constant_storage, index_src, kernel_module, need, row_major_strides, scalar_literal
from .dot_algorithms import plain_dot
from .index_maps import (Gather, Scatter, SourceIndex, clamped_start, dilated_element, dot_free_dims,
                         reduce_dims, window_position, window_span)

# Numba compiles ~6-8 ms a generated line, and worse than linearly beyond (2,400 lines: 52 s): a larger
# region runs interpreted.
MAX_LINES = 1200

_IDENTITY_OPS = {"copy", "opt-barrier", "optimization-barrier"}
# A literal or a cast of a name or literal (`np.float32(-np.inf)`, `np.int64(v3)`): cheap to repeat.
_SIMPLE = re.compile(r"^np\.\w+\(-?[\w.]+\)$")


@dataclass(slots=True)
class Scalar:
    expr: str               # a local name or a literal, in the compute type
    et: str


@dataclass(slots=True)
class Array:
    name: str               # a flat 1-D array of the storage type
    dims: tuple
    et: str
    buf: int                # identity of the buffer (shared by reshapes and copies of it)


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


class _Generator:
    def __init__(self, options: Options):
        self.options = options
        self.body = Block()                 # the function body: lines, _Allocs and blocks
        self.current = self.body            # the block lines go to (at its end)
        self.line_count = 0
        self.n = 0
        self.consts: list[np.ndarray] = []
        self.const_names: dict[int, Array] = {}
        self.mutable: set[int] = set()      # buffers this code may write in place
        self.hoisted: dict[int, object] = {}   # instruction id -> value computed before the enclosing loop
        # buffers allocated on every step of the loop they are in (a loop's next state, a branch's result):
        # never moved out of any loop
        self.pinned: set[int] = set()
        self.aliases: dict[int, frozenset[int]] = {}   # a branch result's buffer -> the buffers it may be

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
        self.current = block.parent
        self.current.close(block)

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
        live = _live(comp)
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
                return buf in self.mutable and all(last_use.get(j, -1) <= k for j, x in vals.items()
                                                   if buf in self.reach(x))

            def writable(v, operands=operands):
                """`v` itself if step k may overwrite it (free after it, and no other operand of the step reads
                it: `scatter(x, i, x)` reads the updates while it writes), else a copy of it."""
                readers = sum(v.buf in self.reach(leaf) for arg in operands for leaf in _leaves(arg))
                return v if free_after(v.buf) and readers == 1 else self.copy_of(v)
            if inst.opcode in ("call", "fusion"):        # the callee may write what the caller is done with
                donated = {b for v in operands for b in _bufs(v) if free_after(b)}
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
        live = _live(comp)
        for inst in comp.instructions:
            if id(inst) not in live:
                continue
            invariant_operands = not any(id(o) in variant for o in inst.operands)
            if inst.opcode in ("call", "fusion"):
                called = self.callee(inst)
                if invariant_operands and _pure(called):
                    self.hoisted[id(inst)] = self.inline(called, [self.invariant_operand(o) for o in inst.operands])
                else:
                    self.hoist_invariants(called)
                    variant.add(id(inst))
            elif inst.opcode not in opcodes.PURE or not invariant_operands:
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
        if op in ("call", "fusion"):        # (hoisted: nothing to donate)
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
        if op in ew.ELEMENTWISE_OPS:
            return self.elementwise(inst, operands, dims, et)
        if op in ("reshape", "bitcast"):
            return self.reshape(inst, operands[0], dims, et)
        if op == "dynamic-update-slice":
            return self.dynamic_update_slice(inst, operands, writable)
        emit = _ARRAY_OPS.get(op)
        need(emit is not None, f"opcode {op}")
        out = self.new_array(dims, et)
        emit(self, inst, operands, out)
        return out if dims else self.scalar_of(out)

    def constant(self, inst, dims, et):
        if not dims:
            return Scalar(ew.literal_src(et, scalar_literal(inst)), et)
        v = self.const_names.get(id(inst))
        if v is None:
            self.consts.append(constant_storage(inst).reshape(-1))
            self.n += 1
            v = self.const_names[id(inst)] = Array(f"c{len(self.consts) - 1}", dims, et, self.n)
        return v

    def elementwise(self, inst, operands, dims, et):
        if not dims:
            expr = ew.instruction_src(inst, [self.scalar_of(v).expr for v in operands], self.options.excess_precision)
            need(expr is not None, f"{inst.opcode} on {et}")
            return self.local(expr, et)
        out = self.new_array(dims, et)
        i = self.fresh("i")
        with self.block(f"for {i} in range({math.prod(dims)}):"):
            vals = [self.local(self.at(v, i), v.et).expr if isinstance(v, Array) else v.expr for v in operands]
            expr = ew.instruction_src(inst, vals, self.options.excess_precision)
            need(expr is not None, f"{inst.opcode} on {et}")
            self.line(f"{out.name}[{i}] = {ew.store_src(et, expr)}")
        return out

    def reshape(self, inst, src, dims, et):
        if inst.opcode == "bitcast":
            need(src.et == et, "bitcast changing type")
            for s in (inst.shape, inst.operands[0].shape):
                need(s.layout is None or (list(s.minor_to_major) == list(range(s.rank))[::-1]
                                           and not s.layout.tiles), "bitcast with a layout")
        if not dims:
            return self.scalar_of(src)
        if isinstance(src, Scalar):
            out = self.new_array(dims, et)
            self.line(f"{out.name}[0] = {self.stored(src)}")
            return out
        return Array(src.name, dims, et, src.buf)

    def clamped_starts(self, starts, dims, sizes) -> list[str]:
        out = []
        for s, d, n in zip(starts, dims, sizes):
            s = self.scalar_of(s)
            out.append(self.local(str(clamped_start(SourceIndex(), s.expr, s.et == "u64", d, n)), "s64").expr)
        return out

    def dynamic_update_slice(self, inst, operands, writable):
        x, upd, starts = operands[0], operands[1], operands[2:]
        dims, et = _leaf_type(inst.shape)
        if not dims:
            return self.scalar_of(upd)
        udims = _leaf_type(inst.operands[1].shape)[0]
        st = self.clamped_starts(starts, dims, udims)
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
        for leaf in _leaves(init):            # the carried state: locals, arrays copied once
            if isinstance(leaf, Array):
                state.append(self.copy_of(leaf))
            else:
                name = self.fresh("s")
                self.line(f"{name} = {leaf.expr}")
                state.append(Scalar(name, leaf.et))
        shape = _rebuild(init, iter(state))
        outer_hoisted = dict(self.hoisted)      # hoisted values are defined from here on only
        self.hoist_invariants(cond)
        self.hoist_invariants(body)
        loop_bufs = {s.buf for s in state if isinstance(s, Array)}
        with self.block("while True:") as loop:
            pred = self.scalar_of(self.inline(cond, [shape]))
            with self.block(f"if not {pred.expr}:"):
                self.line("break")
            self.mutable |= loop_bufs     # the body owns the carried buffers
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
        may_be = set().union(*map(self.reach, operands[1:]))    # a branch may return its argument
        for k, comp in enumerate(branches):
            if k == len(branches) - 1:      # an index out of range selects the last branch
                header = "else:" if k else "if True:"
            elif selector.et == "pred":     # branches are (true, false)
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
                out.append(Array(name, dims, et, self.n))     # not owned: a branch may return an argument
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
        simple = n == 1 and _simple_reducer(reducer)
        outs = [self.new_array(d, et) for d, et in out_leaves] if out_dims else None
        with self.loops([src_dims[d] for d in kept]) as kidx:
            accs = [self.fresh("r") for _ in range(n)]
            for a, v in zip(accs, inits):
                self.line(f"{a} = {v.expr}")
            with self.loops([src_dims[d] for d in rdims]) as ridx:
                lin = _linear(src_dims, _placed(len(src_dims), (kept, kidx), (rdims, ridx)))
                vals = [self.local(self.at(s, lin), s.et) for s in srcs]
                if simple:      # in row-major order of the reduced dims, as ops/reduction.py folds
                    et = out_leaves[0][1]
                    step = ew.reducer_step_src(self.options.reductions, simple, et, accs[0], vals[0].expr)
                    self.line(f"{accs[0]} = {step}")
                else:
                    args = [Scalar(a, et) for a, (_, et) in zip(accs, out_leaves)] + vals
                    result = _leaves(self.inline(reducer, args))
                    self.line(f"{', '.join(accs)} = {', '.join(self.scalar_of(v).expr for v in result)}")
            if simple:
                total = ew.reduction_result_src(self.options.reductions, simple, out_leaves[0][1], accs[0], self.options.excess_precision)
                if total != accs[0]:        # f16/bf16 sums accumulated in f32: rounded once, as op by op
                    self.line(f"{accs[0]} = {total}")
            if outs:
                lin = _linear(out_dims, kidx)
                for o, a in zip(outs, accs):
                    self.line(f"{o.name}[{lin}] = {ew.store_src(o.et, a)}")
        result = outs or [Scalar(a, et) for a, (_, et) in zip(accs, out_leaves)]
        return Tup(result) if inst.shape.is_tuple else result[0]

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
        simple = n == 1 and _simple_reducer(reducer)
        outs = [self.new_array(d, et) for d, et in out_leaves]
        ar = SourceIndex()
        with self.loops(out_dims) as oidx:
            accs = [self.fresh("r") for _ in range(n)]
            for a, v in zip(accs, inits):
                self.line(f"{a} = {v.expr}")
            with self.loops([w.size for w in window]) as kidx:
                conds, src = [], []
                literal = [0 if i == "0" else i for i in oidx], [0 if k == "0" else k for k in kidx]  # (to fold)
                for out, k, size, out_n, w in zip(*literal, src_dims, out_dims, window):
                    element, holds = dilated_element(ar, size, w.pad_low, w.base_dilation,
                                                     window_position(ar, w, out, k), window_span(w, out_n))
                    conds += holds
                    src.append(element)
                if False not in conds:      # (else every window element along a dim is padding: folds nothing)
                    guard = self.open(f"if {' and '.join(map(index_src, conds))}:") if conds else None
                    lin = _linear(src_dims, src)
                    vals = [self.local(self.at(s, lin), s.et) for s in srcs]
                    if simple:
                        step = ew.reducer_step_src(self.options.reductions, simple, out_leaves[0][1], accs[0], vals[0].expr)
                        self.line(f"{accs[0]} = {step}")
                    else:
                        args = [Scalar(a, et) for a, (_, et) in zip(accs, out_leaves)] + vals
                        result = _leaves(self.inline(reducer, args))
                        self.line(f"{', '.join(accs)} = {', '.join(self.scalar_of(v).expr for v in result)}")
                    if guard is not None:
                        self.close(guard)
            if simple:
                total = ew.reduction_result_src(self.options.reductions, simple, out_leaves[0][1], accs[0], self.options.excess_precision)
                if total != accs[0]:
                    self.line(f"{accs[0]} = {total}")
            lin = _linear(out_dims, oidx)
            for o, a in zip(outs, accs):
                self.line(f"{o.name}[{lin}] = {ew.store_src(o.et, a)}")
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
            bi, fi, gi = oidx[:len(lb)], oidx[len(lb):len(lb) + len(lf)], oidx[len(lb) + len(lf):]
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

    def gather(self, inst, operands, out):
        x, indices = operands
        geometry = Gather.of(inst)
        need(len(geometry.offset_src) == len(geometry.offset_dims), "gather offset dims")
        ar = self.index_arith()
        with self.loops([out.dims[d] for d in geometry.batch_dims]) as bidx:
            starts = geometry.starts(ar, self.index_loader(indices, geometry.vectors), bidx)
            with self.loops([out.dims[d] for d in geometry.offset_dims]) as widx:
                src = geometry.source_index(ar, starts, widx)
                oidx = _placed(len(out.dims), (geometry.batch_dims, bidx), (geometry.offset_dims, widx))
                value = f"{x.name}[{_linear(geometry.operand_dims, src)}]" if isinstance(x, Array) else self.stored(x)
                self.line(f"{out.name}[{_linear(out.dims, oidx)}] = {value}")

    def scatter(self, inst, operands, writable):
        n = (len(operands) - 1) // 2
        geometry = Scatter.of(inst)
        xdims = geometry.operand_dims
        need(xdims, "rank-0 scatter")
        indices, updates = operands[n], operands[n + 1:]
        udims = _leaf_type(inst.operands[n + 1].shape)[0]
        need(len(geometry.window_src) == len(geometry.window_dims), "scatter window dims")
        outs = [writable(x) if isinstance(x, Array) else None for x in operands[:n]]
        need(all(outs), "scalar scatter operand")
        ets = [o.et for o in outs]
        comp = inst.called["to_apply"]
        ar = self.index_arith()
        with self.loops(udims) as uidx:      # row-major over the updates, as op by op
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


# -- index-mapping ops: each fills `out` from its operands --------------------------------------------------
def _copy_mapped(g, out, src, src_index_of):
    """out[index] = src[src_index_of(index)] over all of out (a scalar src broadcasts)."""
    fill = g.stored(src) if isinstance(src, Scalar) else None
    with g.loops(out.dims) as idx:
        value = fill if fill is not None else f"{src.name}[{_linear(_dims_of(src), src_index_of(idx))}]"
        g.line(f"{out.name}[{_linear(out.dims, idx)}] = {value}")


def _dims_of(v):
    return v.dims if isinstance(v, Array) else ()


def _broadcast(g, inst, operands, out):
    dims = inst.attr("dimensions", ())
    _copy_mapped(g, out, operands[0], lambda idx: [idx[d] for d in dims])


def _transpose(g, inst, operands, out):
    perm = inst.attr("dimensions")

    _copy_mapped(g, out, operands[0], lambda idx: _placed(len(perm), (perm, idx)))


def _slice(g, inst, operands, out):
    spec = [(s.start, s.stride) for s in inst.attr("slice")]
    _copy_mapped(g, out, operands[0],
                 lambda idx: [Ix("+", Ix("*", c, st, paren=False), lo) for c, (lo, st) in zip(idx, spec)])


def _reverse(g, inst, operands, out):
    rev = set(inst.attr("dimensions", ()))
    dims = _dims_of(operands[0])
    _copy_mapped(g, out, operands[0],
                 lambda idx: [Ix("-", dims[d] - 1, c) if d in rev else c for d, c in enumerate(idx)])


def _dynamic_slice(g, inst, operands, out):
    x = operands[0]
    st = g.clamped_starts(operands[1:], _dims_of(x), out.dims)
    _copy_mapped(g, out, x, lambda idx: [Ix("+", c, s) for c, s in zip(idx, st)])


def _iota(g, inst, operands, out):
    dim = inst.attr("iota_dimension")
    with g.loops(out.dims) as idx:
        expr = ew.iota_src(out.et, f"np.int64({idx[dim]})")
        need(expr is not None, "iota type")
        g.line(f"{out.name}[{_linear(out.dims, idx)}] = {ew.store_src(out.et, expr)}")


def _pad(g, inst, operands, out):
    x, pv = operands
    fill = g.stored(g.scalar_of(pv))
    xdims = _dims_of(x)
    need(xdims, "rank-0 pad")
    ar = SourceIndex()
    with g.loops(out.dims) as idx:
        conds, src = [], []
        for c, n, out_n, p in zip(idx, xdims, out.dims, inst.attr("padding")):
            element, holds = dilated_element(ar, n, p.low, p.interior + 1, c, out_n - 1)
            conds += holds
            src.append(element)
        dst = f"{out.name}[{_linear(out.dims, idx)}]"
        value = g.stored(x) if isinstance(x, Scalar) else f"{x.name}[{_linear(xdims, src)}]"
        if not conds or False in conds:        # (conditions over literals only: folded)
            g.line(f"{dst} = {fill if conds else value}")
        else:
            with g.block(f"if {' and '.join(map(index_src, conds))}:"):
                g.line(f"{dst} = {value}")
            with g.block("else:"):
                g.line(f"{dst} = {fill}")


def _concatenate(g, inst, operands, out):
    dim = inst.attr("dimensions")[0]
    off = 0
    for x in operands:
        xdims = _dims_of(x)
        with g.loops(xdims) as idx:
            dst = list(idx)
            dst[dim] = Ix("+", idx[dim], off)
            g.line(f"{out.name}[{_linear(out.dims, dst)}] = {x.name}[{_linear(xdims, idx)}]")
        off += xdims[dim]


_ARRAY_OPS = {"broadcast": _broadcast, "transpose": _transpose, "slice": _slice, "reverse": _reverse,
              "dynamic-slice": _dynamic_slice, "iota": _iota, "pad": _pad, "concatenate": _concatenate,
              "dot": _Generator.dot, "gather": _Generator.gather}


def _simple_reducer(comp):
    """The opcode of a reducer `op(p0, p1)` in ew.REDUCERS, else None."""
    r, params = comp.root, comp.parameters
    if len(params) == 2 and r.opcode in ew.REDUCERS and len(r.operands) == 2 \
            and {id(o) for o in r.operands} == {id(p) for p in params}:
        return r.opcode
    return None


def _placed(rank: int, *parts) -> list:
    """An index of `rank` components from (dims, components) pairs: each puts its components at its dims
    (dot: batch, free and contracting dims of each operand; reduce: kept and reduced dims; ...)."""
    index = [None] * rank
    for dims, comps in parts:
        for d, c in zip(dims, comps):
            index[d] = c
    return index


def _live(comp) -> set[int]:
    """ids of the instructions the root depends on (everything here is side-effect free)."""
    live, stack = set(), [comp.root]
    while stack:
        inst = stack.pop()
        if id(inst) not in live:
            live.add(id(inst))
            stack += inst.operands
    return live


def _pure(comp) -> bool:
    """Whether `comp` computes from its parameters alone (opcodes.PURE, calls of such computations)."""
    return all(i.opcode in opcodes.PURE or i.opcode == "parameter"
               or (i.opcode in ("call", "fusion") and _pure(i.called["to_apply" if i.opcode == "call" else "calls"]))
               for i in comp.instructions)


def _rebuild(like, leaves):
    return Tup([_rebuild(x, leaves) for x in like.items]) if isinstance(like, Tup) else next(leaves)


def _rebuild_shape(shape, leaves):
    return Tup([_rebuild_shape(s, leaves) for s in shape.tuple_shapes]) if shape.is_tuple else next(leaves)


# -- the compiled function --------------------------------------------------------------------------------
class ProgramKernel:
    """A compiled region: `kernel(*operands)` -> the value (arrays, tuples nested as the result shape)."""

    def __init__(self, source: str, key: str, operand_shapes, result_shape, consts):
        self._fn = None
        self.source = source
        self.key = key
        self._operands = operand_shapes
        self._params = [leaf for s in operand_shapes for leaf in _shape_leaves(s)]
        self._result = result_shape
        self._consts = consts
        self.lines = source.count("\n")

    @property
    def fn(self):
        if self._fn is None:
            self._fn = load_kernel(self.source, self.key, self.signature)
        return self._fn

    @property
    def signature(self) -> tuple:
        """Operands and constants are never written: read-only, one specialisation (cache.compile_signature)."""
        return tuple([array_arg(ew.STORAGE[et], 1, True) for _, et in self._params]
                     + [array_arg(c.dtype, 1, True) for c in self._consts])

    @property
    def compile_task(self) -> tuple:
        """What a worker process compiles it from (cache.compile_elsewhere): (key, source, signature)."""
        return self.key, self.source, self.signature

    def compile(self):
        compile_signature(self.fn, self.signature, self.lines)
        return self

    def __call__(self, *operands):
        flat = [x for v, s in zip(operands, self._operands) for x in _flatten(v, s)]
        args = []
        for a, (dims, et) in zip(flat, self._params):
            a = np.asarray(a)
            a = a if a.flags.c_contiguous else a.copy()     # (np.ascontiguousarray makes 0-d arrays 1-d)
            if et in ("f16", "bf16"):
                a = a.view(np.uint16)
            if a.dtype != ew.STORAGE[et] or a.shape != dims:
                raise TypeError(f"program operand: expected {et}{list(dims)}, got {a.dtype}{list(a.shape)}")
            args.append(a.reshape(-1))
        results = iter(self.fn(*args, *self._consts))
        return _unflatten(self._result, results)


def _flatten(value, shape):
    if shape.is_tuple:
        return [x for v, s in zip(value, shape.tuple_shapes) for x in _flatten(v, s)]
    return [value]


def _unflatten(shape, results):
    if shape.is_tuple:
        return tuple(_unflatten(s, results) for s in shape.tuple_shapes)
    a = next(results).reshape(shape.dims)
    return a.view(shape.dtype) if shape.element_type.is_half_float else a


def _generate(inst, options: Options):
    gen = _Generator(options)
    args = []
    for k, (dims, et) in enumerate(leaf for o in inst.operands for leaf in _shape_leaves(o.shape)):
        gen.n += 1
        arr = Array(f"t{k}", dims, et, gen.n)     # the caller's: never written
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
    except RecursionError:      # computations nested deeper than Python's recursion limit
        raise TierUnsupported("computations nested deeper than Python's recursion limit") from None
    key = source_key(source, "p")
    return ProgramKernel(source, key, [o.shape for o in inst.operands], inst.shape, gen.consts)
