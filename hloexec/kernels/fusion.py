"""Compile a fused HLO computation into ONE Numba-jitted loop nest.

`compile_fusion(comp)` generates Python source for a kernel that loops over the output and evaluates the
computation's expression DAG per output element -- index arithmetic, no temporaries -- and returns a
`FusedKernel`. Where the computation holds something this generator does not handle it raises
`TierUnsupported(reason)` (the caller then interprets the computation op by op and counts the reason);
any other exception is a bug in the generator.

How the source is built
-----------------------
Every instruction is evaluated *at an index* (a tuple of index expressions, one per dimension of its
shape), by the element layer (kernels/elements.py: data-movement ops rewrite the index, elementwise ops
combine their operands at the same index) with this generator as its Emitter; a reduce opens loops over its
reduced dimensions around an accumulator, a reduce-window over its window's. Values are memoised per
(instruction, index), so a DAG node used twice at the same index is computed once.

Each generated statement is placed in the outermost loop where all the names it uses are defined
(loop-invariant code motion by construction): scalar parameters, broadcast scalars and a row reduction
feeding a broadcast (softmax's max, LayerNorm's mean) are computed once per row, not once per element.
Loads under a pad / concatenate guard stay inside the guard.

Structurally equal fusions produce the same source (names are canonical: p<k> parameters, c<k> array
constants, o<k> outputs, i<k> loop indices, v<k> values), so they share one compiled kernel, in-process
and on disk (`kernels/cache.py`).
"""

from __future__ import annotations

import math
import sys
import threading
from contextlib import contextmanager

import numpy as np

from ..errors import TierUnsupported
from ..ir import opcodes
from ..options import Options
from . import elements
from . import elementwise as ew
from .cache import INT64_ARG, GeneratedKernel, array_arg, source_key
from .codegen import (
    Block,
    Ix,
    constant_storage,
    innermost,
    is_name,
    kernel_module,
    names_in,
    need,
    row_major_strides,
    scalar_literal,
)
from .index_maps import SourceIndex, dilated_element, reduce_dims, window_position, window_span
from .threads import ranges, run_blocks

PARALLEL_THRESHOLD = 100_000  # output elements x reduced elements from which the outer loop is split
BLOCK_WORK = 32_768  # output elements x reduced elements per block of the split at least
MAX_BLOCKS = 1 << 20  # blocks at most (past any array that fits in memory: 2^35 elements of work)
COLUMN_BLOCK = 2048  # output elements per block of a column reduction at least (the width of its rows)
MAX_STATEMENTS = 4000  # give up on pathological DAGs (index-map blow-up)
_NO_WORK = frozenset({"parameter", "constant"})
TILE = 16  # tile edge of the loops over a transposing fusion's last two dims
LANES = 16  # partial sums of a float row sum (one AVX-512 vector of f32)
CHUNK = 256  # elements of a row sum computed per loop into a stack buffer (1-2 KB)


def _transposes_minor_dim(comp) -> bool:
    """Whether some value's minor dim comes from a major dim of its operand (a transpose, or a bitcast
    between layouts): reading it along the output's rows strides through memory."""
    for inst in comp.instructions:
        if inst.opcode == "transpose" and inst.shape.rank and inst.attr("dimensions")[-1] != inst.shape.rank - 1:
            return True
        if inst.opcode == "bitcast" and not all(s.has_default_layout for s in (inst.shape, inst.operands[0].shape)):
            return True
    return False


def column_reduction_applies(reduce) -> bool:
    """Whether FusionGenerator.column_reduction can run `reduce` (an instruction): it reduces its operand's major
    dims and keeps >= 16 contiguous elements per row (a bias gradient)."""
    src, rdims = reduce.operands[0].shape.dims, reduce.attr("dimensions", ())
    reduced = [d for d in rdims if src[d] != 1]
    kept = [d for d in range(len(src)) if d not in rdims and src[d] != 1]
    return (
        len(reduce.operands) == 2
        and bool(reduced and kept)
        and max(reduced) < min(kept)
        and math.prod(src[d] for d in kept) >= 16
    )


def _column_reduces(comp, outs) -> list | None:
    """The reduces of `comp` if FusionGenerator.column_reduction can run it: all reduce one shape over the same
    dims, which column_reduction_applies to, read no other reduce, and the outputs are elementwise ops of the
    output's dims over them (convert(reduce(x)) included)."""
    reduces = [i for i in comp.instructions if i.opcode == "reduce"]
    if not reduces or not column_reduction_applies(reduces[0]):
        return None
    src, rdims = reduces[0].operands[0].shape.dims, sorted(reduces[0].attr("dimensions", ()))
    if any(
        len(r.operands) != 2 or r.operands[0].shape.dims != src or sorted(r.attr("dimensions", ())) != rdims
        for r in reduces
    ):
        return None
    dims = outs[0].shape.dims
    after = {id(r) for r in reduces}  # what depends on a reduce: elementwise, at the output's dims
    for inst in comp.instructions:
        if inst.opcode != "reduce" and any(id(o) in after for o in inst.operands):
            if inst.opcode == "tuple" and inst is comp.root:
                continue
            if inst.opcode not in ew.ELEMENTWISE_OPS or inst.shape.dims != dims:
                return None
            after.add(id(inst))
        elif inst.opcode == "reduce" and any(id(o) in after for o in inst.operands):
            return None
    return reduces if all(id(o) in after for o in outs) else None


def _subscript(index) -> str:
    """An array subscript from index components, each a name or expression cast to uint64: Numba then skips
    its negative-index wraparound, a select that LLVM cannot remove in a loop from an unknown `lo` (a thread
    block), and that turns every load into a gather and every store into a scatter (7x slower on 10M
    elements). Generated indices are never negative (loads under a pad or concatenate are guarded)."""
    return ", ".join(c if c.isdigit() else f"np.uint64({c})" for c in index) if index else "0"


class FusionGenerator:
    """A fused computation as one loop nest over its output: where the loops go (tiled, split for the thread
    pool, a column reduction's interchange), where each statement is placed (the outermost block defining what
    it uses), reductions' accumulators; each element's value comes from the element layer (kernels/elements.py),
    for which this is the Emitter: operands evaluated at the rewritten index, memoised per (instruction, index)."""

    def __init__(self, comp, options: Options, parallel, rows_inside_tiles: bool = False):
        self.comp = comp
        self.options = options
        self.parallel_request = parallel
        # in a tile, the inner loop runs down the output's columns (along a transposed operand's rows): inner_cost
        self.rows_inside_tiles = rows_inside_tiles
        self.tiled_reads: list[tuple[str, str | None]] | None = None  # a tiled kernel's loads (inner_cost)
        # arithmetic to vectorize once a tile's loads are contiguous (tile_row; not in a transpose or copy)
        self.computes = any(i.opcode not in opcodes.MOVEMENT | _NO_WORK for i in comp.instructions)
        self.n = 0
        self.scope_of: dict[str, Block] = {}  # name -> the block defining it
        self.memo: dict = {}
        self.index_memo: dict = {}
        self.consts: list[np.ndarray] = []
        self.const_names: dict[int, str] = {}
        self.statements = 0
        self.reduce_execs: dict[int, list[int]] = {}  # reduce -> [accumulator executions, its size]
        self.simd = False  # generating a loop LLVM vectorizes (see loads)
        self.ar = SourceIndex(self.iexpr)  # index formulas name what they reuse once (iexpr)

    # -- names and placement ---------------------------------------------------------------------------
    def fresh(self, prefix="v"):
        self.n += 1
        return f"{prefix}{self.n}"

    def visible(self, name: str) -> bool:
        s = self.scope_of.get(name)
        return s is not None and s in self.chain_set

    def place(self, deps, pin: bool = False) -> Block:
        """The deepest block (on the current chain) defining one of `deps` -- where a statement goes; `pin`:
        not outside the innermost guard (a load under a pad / concatenate guard stays under it)."""
        return innermost(self.guard if pin else self.chain[0], deps, self.scope_of)

    def emit(self, expr: str, deps, *, pin: bool = False, prefix: str = "v") -> str:
        """Assign `expr` to a new name in the outermost valid scope; `pin` keeps it inside guards."""
        self.statements += 1
        need(self.statements < MAX_STATEMENTS, "too many statements")
        target = self.place(deps, pin)
        name = self.fresh(prefix)
        target.insert(f"{name} = {expr}")
        self.scope_of[name] = target
        return name

    @property
    def guard(self) -> Block:
        for s in reversed(self.chain):
            if s.is_guard:
                return s
        return self.chain[0]

    def push(self, scope: Block):
        self.chain.append(scope)
        self.chain_set.add(scope)

    def pop_to(self, saved):
        for s in self.chain[len(saved) :]:
            self.chain_set.discard(s)
        self.chain = list(saved)
        self.chain_set = set(saved)

    def open_construct(self, target: Block, header: str, **kind) -> tuple[Block, list]:
        """A new child block of `target` (Block.open), the chain root..target,block made the current one:
        (the block, the chain to restore)."""
        scope = target.open(header, **kind)
        saved = list(self.chain)
        idx = self.chain.index(target)
        self.pop_to(self.chain[: idx + 1])
        self.push(scope)
        return scope, saved

    def close_construct(self, target: Block, scope: Block, saved):
        target.close(scope)
        self.pop_to(saved)

    # -- index expressions ----------------------------------------------------------------------------
    def iexpr(self, e) -> str:
        """Index expression `e` (an Ix, or source text such as a loaded start index `np.int64(v3)`) as an index
        component: its value if it holds no name, else a name assigned it (CSE'd, hoisted)."""
        value = e.folded() if isinstance(e, Ix) else None
        if value is not None:
            return str(value)
        src = str(e)
        name = self.index_memo.get(src)
        if name is not None and self.visible(name):
            return name
        name = self.emit(src, names_in(e), prefix="x")
        self.index_memo[src] = name
        return name

    # -- code generation -----------------------------------------------------------------------------
    def generate(self):
        comp = self.comp
        root = comp.root
        outs = list(root.operands) if root.opcode == "tuple" else [root]
        need(all(not o.shape.is_tuple for o in outs), "nested tuple")
        dims = outs[0].shape.dims
        need(all(o.shape.dims == dims for o in outs), "outputs of different dims")
        for inst in comp.instructions:
            self.check(inst)
        self.params = comp.parameters
        for p in self.params:
            need(not p.shape.is_tuple and ew.supported_type(p.shape.element_type.name), "parameter type")

        # loop nest over the output's non-trivial dims
        loop_dims = [d for d, n in enumerate(dims) if n != 1]
        out_size = math.prod(dims)
        reduce_extent = max(
            [self.reduced_size(i) for i in comp.instructions if i.opcode in ("reduce", "reduce-window")] or [1]
        )
        work = out_size * reduce_extent
        if self.parallel_request is None:
            parallel = work >= PARALLEL_THRESHOLD and loop_dims and dims[loop_dims[0]] >= 2
        else:
            parallel = bool(self.parallel_request) and bool(loop_dims)
        self.parallel = bool(parallel)

        self.root_scope = Block()
        self.chain, self.chain_set = [self.root_scope], {self.root_scope}
        column = _column_reduces(comp, outs)
        if column:
            self.column_reduction(column, outs, loop_dims)
        else:
            transposing = _transposes_minor_dim(comp)
            tiled = (
                transposing
                and len(loop_dims) >= 2
                and min(dims[d] for d in loop_dims[-2:]) >= TILE
                and reduce_extent == 1
            )
            inner, index = self.open_loops(self.root_scope, dims, loop_dims, "i", tiled=tiled)
            if tiled:
                self.inner, self.inner_var = inner, index[loop_dims[-2 if self.rows_inside_tiles else -1]]
                self.tiled_reads = []
            # an elementwise loop along contiguous rows is vectorized (LayerNorm backward's dx: 3 f16 loads)
            with self.loads(simd=reduce_extent == 1 and not transposing):
                values = [self.value(o, index) for o in outs]
            for k, (o, v) in enumerate(zip(outs, values)):
                inner.insert(f"o{k}[{_subscript(index)}] = {ew.store_src(o.shape.element_type.name, v)}")
        self.check_reduce_cost()

        args = (
            [f"o{k}" for k in range(len(outs))]
            + [f"p{p.parameter_number}" for p in self.params]
            + [f"c{k}" for k in range(len(self.consts))]
            + (["lo", "hi"] if self.parallel else [])
        )
        # blocks of the outer loop for the thread pool: from the shapes only, so never the thread count
        count = min(max(2, work // BLOCK_WORK), MAX_BLOCKS)
        if column:  # a block walks every reduced row: a narrow one reads a few bytes of each cache line
            count = min(count, max(2, out_size // COLUMN_BLOCK))
        self.blocks = ranges(dims[loop_dims[0]], min(dims[loop_dims[0]], count)) if self.parallel else []
        source = kernel_module("fused", args, self.root_scope.render(1))
        self.outs = outs
        return source

    def open_loops(self, parent: Block, dims, loop_dims, prefix: str, split: bool = True, tiled: bool = False):
        """A loop per dim of `loop_dims` (the first over lo..hi in a parallel kernel, if `split`), nested in
        `parent`, the innermost made current: (innermost scope, index with "0" for the dims not looped over).
        `tiled`: the last two loops go over TILE x TILE tiles (a transpose then reads and writes whole cache
        lines of both arrays instead of striding through one of them)."""
        comps = ["0"] * len(dims)
        tiles = loop_dims[-2:] if tiled else []
        first = loop_dims[0] if loop_dims else None

        def extent(d):
            return "lo, hi" if (self.parallel and split and d == first) else str(dims[d])

        headers = [
            (d, f"{prefix}{k}", f"for {prefix}{k} in range({extent(d)}):", dims[d])
            for k, d in enumerate(loop_dims)
            if d not in tiles
        ]
        for d in tiles:
            var = f"{prefix}{loop_dims.index(d)}"
            bounds = extent(d) if "," in extent(d) else f"0, {dims[d]}"
            headers.append((None, f"t{var}", f"for t{var} in range({bounds}, {TILE}):", -(-dims[d] // TILE)))
        for d in reversed(tiles) if self.rows_inside_tiles else tiles:
            var = f"{prefix}{loop_dims.index(d)}"
            end = "hi" if "," in extent(d) else str(dims[d])
            headers.append((d, var, f"for {var} in range(t{var}, min(t{var} + {TILE}, {end})):", TILE))
        for d, var, header, trips in headers:
            parent.insert_pos = len(parent.items)  # the loop goes last; what is placed in parent, before it
            scope = parent.open(header, trips=trips)
            self.push(scope)
            self.scope_of[var] = scope
            if d is not None:
                comps[d] = var
            parent = scope
        parent.insert_pos = len(parent.items)
        return parent, tuple(comps)

    def column_reduction(self, reduces, outs, loop_dims):
        """Reduces that keep the minor dims (a bias gradient: [rows, n] -> [n]), with the loops interchanged:
        the reduced dims outermost and an accumulator row, so the inner loop runs along contiguous memory
        instead of striding by a row per element. Each output element still accumulates its values in the
        same order, so the bits are those of the per-element loop (and of the op-by-op path). The outputs
        are then computed from the accumulated rows (convert, scale, ...) in a last pass."""
        root = self.root_scope
        dims = outs[0].shape.dims
        src = reduces[0].operands[0].shape.dims
        rdims = sorted(reduces[0].attr("dimensions", ()))
        kinds = [(self.reducer_op(r), r.shape.element_type.name) for r in reduces]
        red = self.options.reductions
        inits = [self.value(r.operands[1], ()) for r in reduces]
        strides = row_major_strides(dims)
        flat = _subscript(
            [" + ".join(f"i{k}" + (f" * {strides[d]}" if strides[d] != 1 else "") for k, d in enumerate(loop_dims))]
        )
        accs = [self.fresh("acc") for _ in reduces]
        for acc, (_, et) in zip(accs, kinds):
            root.items.append(f"{acc} = np.empty({math.prod(dims)}, {ew.COMPUTE[et]})")
        inner, _ = self.open_loops(root, dims, loop_dims, "i")
        for acc, init in zip(accs, inits):
            inner.insert(f"{acc}[{flat}] = {init}")
        self.pop_to([root])
        # the accumulating nest: reduced dims (j loops), then the kept dims (i loops)
        reduced = [d for d in rdims if src[d] != 1]
        outer, jcomps = self.open_loops(root, src, reduced, "j", split=False)
        inner, index = self.open_loops(outer, dims, loop_dims, "i")
        kept = iter(index)
        comps = tuple(jcomps[d] if d in rdims else next(kept) for d in range(len(src)))
        with self.loads(simd=not _transposes_minor_dim(self.comp)):  # the inner loop runs along rows
            values = [self.value(r.operands[0], comps) for r in reduces]
        for acc, (opcode, et), v in zip(accs, kinds, values):
            inner.insert(f"{acc}[{flat}] = {ew.reducer_step_src(red, opcode, et, f'{acc}[{flat}]', v)}")
        self.pop_to([root])
        inner, index = self.open_loops(root, dims, loop_dims, "i")
        for r, acc, (opcode, et) in zip(reduces, accs, kinds):
            total = ew.reduction_result_src(red, opcode, et, f"{acc}[{flat}]", self.options.excess_precision)
            self.memo[(id(r), index)] = self.emit(total, [c for c in index if is_name(c)])
        for k, o in enumerate(outs):
            inner.insert(f"o{k}[{_subscript(index)}] = {ew.store_src(o.shape.element_type.name, self.value(o, index))}")

    def reduced_size(self, inst):
        if inst.opcode == "reduce-window":
            return math.prod(w.size for w in inst.attr("window") or ())
        dims = inst.attr("dimensions", ())
        src = inst.operands[0].shape.dims
        return math.prod(src[d] for d in dims) if dims else 1

    def check(self, inst):
        op = inst.opcode
        if op == "tuple":
            need(inst is self.comp.root, "tuple not at root")
            return
        need(not inst.shape.is_tuple, f"tuple-shaped {op}")
        need(ew.supported_type(inst.shape.element_type.name), f"type {inst.shape.element_type.name}")
        need(not any(inst.shape.dynamic), "dynamic shape")
        for o in inst.operands:
            need(not o.shape.is_tuple and ew.supported_type(o.shape.element_type.name), "operand type")
        if (
            op in ("parameter", "constant", "reduce", "reduce-window")
            or op in elements.ELEMENTS
            or op in ew.ELEMENTWISE_OPS
        ):
            return
        raise TierUnsupported(f"opcode {op}")

    def inner_cost(self) -> int:
        """Memory accesses per element of a tiled kernel's inner loop: its loads, plus one per access striding by a
        row (a load whose minor index does not move with the loop; the stores, in rows_inside_tiles: transposed
        operands' loads then run contiguous, and loads of what depends on the other dim only leave the loop)."""
        inner = self.inner
        accesses = len(self.outs) if self.rows_inside_tiles else 0
        for name, minor in self.tiled_reads or ():
            if self.scope_of.get(name) is inner:
                accesses += 1
                if minor is not None and minor != self.inner_var and self.scope_of.get(minor) is not inner:
                    accesses += 1
        return accesses

    def tile_row(self, element: str, inst, index) -> str | None:
        """A tiled kernel's load striding by a row in the inner loop (down a transposed operand's column) as an
        element of a TILE-element stack buffer that a loop of its own fills just before: the inner loop then reads
        contiguous memory only and LLVM vectorizes it (Adam's update of a transposed gradient ran scalar). None
        where the load does not stride, its index uses a name made in the inner loop, a pad / concatenate guard
        holds it, or the kernel only moves values (a transpose: the buffer would be one more copy)."""
        if self.tiled_reads is None or not self.computes:
            return None
        inner, var = self.inner, self.inner_var
        wide = [c for c, n in zip(index, inst.shape.dims) if n != 1]
        if not wide or wide[-1] == var or var not in index or any(s.is_guard for s in self.chain):
            return None
        storage = ew.STORAGE[inst.shape.element_type.name]
        if storage.kind not in "fiu" or any(c != var and is_name(c) and self.scope_of.get(c) is inner for c in index):
            return None
        buf = self.emit(f"stack_array({TILE}, np.{storage.name})", [], prefix="tile")
        fill = Block(inner.parent, inner.header, trips=TILE)
        at = f"{buf}[np.uint64({var} - t{var})]"
        fill.insert(f"{at} = {element}")
        inner.parent.insert_before(inner, fill)
        return at

    def check_reduce_cost(self):
        for rid, (execs, size) in self.reduce_execs.items():
            need(execs <= 2 * size + 16, "reduce would be recomputed per broadcast element")

    # -- values ------------------------------------------------------------------------------------------
    def value(self, inst, index: tuple) -> str:
        key = (id(inst), index)
        name = self.memo.get(key)
        if name is not None and self.visible(name):
            return name
        name = self.compute(inst, index)
        self.memo[key] = name
        return name

    @contextmanager
    def loads(self, simd: bool):
        """Values generated inside load f16 as f16_to_f32_simd (`simd`: they go in a loop LLVM vectorizes) or
        f16_to_f32 (a loop that stays scalar: there the simd form's vpinsrw makes every element wait for the
        one before, kernels/half.py)."""
        saved, self.simd = self.simd, simd
        try:
            yield
        finally:
            self.simd = saved

    def simd_load(self) -> bool:
        """Whether a load goes in a vectorized loop: one opened under loads(simd=True), not under a pad /
        concatenate guard (a branch LLVM may leave scalar)."""
        return self.simd and not any(s.is_guard for s in self.chain)

    # -- the element layer's Emitter (kernels/elements.py) ---------------------------------------------
    def component(self, c) -> str:
        """An index component as source: a literal, a name, or an Ix named once (iexpr)."""
        return self.iexpr(c) if isinstance(c, Ix) else str(c)

    def operand(self, inst, k, index) -> str:
        o = inst.operands[k]
        if o.shape.rank == 0:  # (a scalar operand of clamp / select broadcasts)
            return self.value(o, ())
        return self.value(o, tuple(map(self.component, index)))

    def index_at(self, inst, k, position) -> str:
        return self.value(inst.operands[k], tuple(map(self.component, position)))

    def named(self, expr: str, deps) -> str:
        return self.emit(expr, deps)

    def guarded(self, inst, index, cases, default) -> str:
        """res = default; if <conds of a case>: res = <its value> -- loads under a guard stay inside it."""
        init = default() if default is not None else ew.literal_src(inst.shape.element_type.name, 0)
        # the guarded loads depend on every index component, not only on the conditions'
        deps = [c for c in index if is_name(c)] + [n for conds, _ in cases for c in conds for n in c.names()]
        target = self.place(deps + ([init] if is_name(init) else []), pin=True)
        res = self.fresh("v")
        target.insert(f"{res} = {init}")
        self.scope_of[res] = target
        for conds, case in cases:
            guard, saved = self.open_construct(target, f"if {' and '.join(map(str, conds))}:", is_guard=True)
            guard.insert(f"{res} = {case()}")
            self.close_construct(target, guard, saved)
        return res

    def compute(self, inst, index) -> str:
        op = inst.opcode
        et = inst.shape.element_type.name
        deps = [c for c in index if is_name(c)]
        if op == "parameter":
            element = f"p{inst.parameter_number}[{_subscript(index)}]"
            element = self.tile_row(element, inst, index) or element
            load = self.emit(ew.load_src(et, element, self.simd_load()), deps, pin=True)
            if self.tiled_reads is not None:  # (name, its minor index along a dim wider than 1)
                wide = [c for c, n in zip(index, inst.shape.dims) if n != 1]
                self.tiled_reads.append((load, wide[-1] if wide else None))
            return load
        if op == "constant":
            if inst.shape.rank == 0:
                return ew.literal_src(et, scalar_literal(inst))
            name = self.const_names.get(id(inst))
            if name is None:
                name = f"c{len(self.consts)}"
                self.consts.append(constant_storage(inst))
                self.const_names[id(inst)] = name
            return self.emit(ew.load_src(et, f"{name}[{_subscript(index)}]", self.simd_load()), deps, pin=True)
        if op == "reduce":
            return self.reduce(inst, index)
        if op == "reduce-window":
            return self.reduce_window(inst, index)
        return elements.value(self, inst, index)

    # -- reduce ----------------------------------------------------------------------------------------
    def reducer_op(self, inst):
        need(len(inst.operands) == 2, "variadic reduce")
        called = inst.called.get("to_apply")
        need(called is not None and not isinstance(called, list), "reducer")
        opcode = opcodes.reducer_opcode(called)
        need(opcode is not None, "reducer op")
        need(called.root.shape.element_type is inst.shape.element_type, "reducer type")
        return opcode

    def accumulator(self, inst, index) -> tuple[Block, str]:
        """A reduction's accumulator at `index`, set to its init value in the outermost scope it may live in."""
        init_v = self.value(inst.operands[1], ())
        target = self.place([c for c in index if is_name(c)], pin=True)
        acc = self.fresh("r")
        target.insert(f"{acc} = {init_v}")
        self.scope_of[acc] = target
        rec = self.reduce_execs.setdefault(id(inst), [0, inst.shape.size])
        rec[0] += target.total_trips()
        return target, acc

    def fold(self, inst, opcode, target: Block, acc: str, loops, position) -> str:
        """acc = reducer(acc, operand at position()) for every value of the `loops` ((var, trips), outermost
        first) nested in `target`, in row-major order: under reductions="per-step" each step rounds to the type,
        the order of the op-by-op path's fold (ops/reduction.py); under "accumulate", f16/bf16 sums and
        products accumulate in f32 and round once at the end. position() (called inside the loops) gives the
        operand's index and the conditions under which that position holds an element (a reduce-window's
        padding and base-dilation holes are skipped, as the op-by-op path and XLA's evaluator do), or
        (None, []) when no step holds one."""
        et = inst.shape.element_type.name
        saved, parent, first = None, target, None
        for var, n in loops:
            if first is None:
                scope, saved = self.open_construct(target, f"for {var} in range({n}):", trips=n)
                first = scope
            else:
                scope = parent.open(f"for {var} in range({n}):", trips=n)
                self.push(scope)
            self.scope_of[var] = scope
            parent = scope
        comps, conds = position()
        if conds:
            if first is None:
                guard, saved = self.open_construct(target, f"if {' and '.join(conds)}:", is_guard=True)
                first = guard
            else:
                guard = parent.open(f"if {' and '.join(conds)}:", is_guard=True)
                self.push(guard)
            parent = guard
        if comps is not None:
            with self.loads(simd=False):  # one accumulator, in order: a scalar loop
                val = self.value(inst.operands[0], tuple(comps))
            parent.insert(f"{acc} = {ew.reducer_step_src(self.options.reductions, opcode, et, acc, val)}")
        if first is not None:  # statements of target go after the loops now; restore the chain
            self.close_construct(target, first, saved)
        result = ew.reduction_result_src(self.options.reductions, opcode, et, acc, self.options.excess_precision)
        return acc if result == acc else self.emit(result, [acc])

    def reduce(self, inst, index):
        opcode = self.reducer_op(inst)
        src = inst.operands[0]
        et = inst.shape.element_type.name
        _, rdims = reduce_dims(src.shape.rank, inst.attr("dimensions", ()))
        target, acc = self.accumulator(inst, index)
        # operand index: kept dims take the output index in order, reduced dims the loop variables
        comps, it = [], iter(index)
        loops = []
        for d in range(src.shape.rank):
            if d in rdims:
                if src.shape.dims[d] == 1:
                    comps.append("0")
                else:
                    var = self.fresh("j")
                    loops.append((var, src.shape.dims[d]))
                    comps.append(var)
            else:
                comps.append(next(it))
        minor = [d for d in range(src.shape.rank) if src.shape.dims[d] != 1][-1:]
        if (
            loops
            and opcode == "add"
            and et in ew.FLOATS
            and len(loops) == 1
            and loops[0][1] % LANES == 0
            and loops[0][1] >= 4 * LANES
            and minor == [rdims[-1]]
            and not ew.in_order(self.options.reductions, opcode, inst.shape.element_type)
        ):
            return self.row_sum_in_lanes(inst, target, acc, comps, loops[0])
        return self.fold(inst, opcode, target, acc, loops, lambda: (comps, []))

    def reduce_window(self, inst, index):
        """Output element `index` folds the operand over its window, row-major: window element k along a dim
        reads the operand where `window_position` lands in the padded, base-dilated operand, if
        `dilated_element` finds an element there (padding and holes are skipped; kernels/index_maps.py)."""
        opcode = self.reducer_op(inst)
        src = inst.operands[0]
        window = inst.attr("window") or ()
        need(len(window) == src.shape.rank or not window, "window rank")
        need(not any(w.reversal for w in window), "window reversal")
        target, acc = self.accumulator(inst, index)
        loops, dims = [], []
        for d, n in enumerate(src.shape.dims):
            w = window[d] if window else None
            var = "0"
            if w is not None and w.size > 1:
                var = self.fresh("j")
                loops.append((var, w.size))
            dims.append((index[d], var, n, inst.shape.dims[d], w))
        ar = self.ar

        def position():
            comps, conds = [], []
            for out, var, n, out_n, w in dims:
                if w is None:
                    comps.append(out)
                    continue
                p = window_position(ar, w, out, var)
                element, holds = dilated_element(ar, n, w.pad_low, w.base_dilation, p, window_span(w, out_n))
                if False in holds:  # a size-1 window at a constant output index, on padding or a hole
                    return None, []
                conds += map(str, holds)
                comps.append(str(element))
            return comps, conds

        return self.fold(inst, opcode, target, acc, loops, position)

    def row_sum_in_lanes(self, inst, target: Block, acc: str, comps: list, loop) -> str:
        """A float sum along a row's contiguous dim in LANES partial sums (element j goes to lane j % LANES),
        added pairwise at the end: lanes added as vectors, where one accumulator is a chain of dependent adds
        (~1 element per 4 cycles). Any order is XLA's (its CPU sums are vectorized too); this one is fixed by
        the shape alone, so every run and thread count gives the same bits.

        The row goes in chunks: a loop computes a chunk's values into a stack buffer (a plain elementwise loop,
        which LLVM vectorizes, with f16 loads as vcvtph2ps), then `add_lanes` adds each LANES of them to the
        lanes (stack_array: registers). A loop over the LANES lanes themselves is fully unrolled when its body
        is small and then mostly left scalar (bf16 and f32 sums: 1.5-2.5 GB/s)."""
        et = inst.shape.element_type.name
        var, n = loop
        ct = ew.COMPUTE[et]
        chunk = math.gcd(n, CHUNK)
        lanes = self.emit(f"stack_array({LANES}, {ct})", [], prefix="lanes")
        values = self.emit(f"stack_array({chunk}, {ct})", [], prefix="chunk")
        target.insert(f"{lanes}[:] = {ct}(0)")
        outer, element, group = self.fresh("jc"), self.fresh("jj"), self.fresh("jl")
        block, saved = self.open_construct(target, f"for {outer} in range({n // chunk}):", trips=n // chunk)
        self.scope_of[outer] = block
        inner = block.open(f"for {element} in range({chunk}):", trips=chunk)
        self.push(inner)
        self.scope_of[element] = inner
        comps[comps.index(var)] = self.iexpr(Ix("+", Ix("*", outer, chunk, paren=False), element))
        with self.loads(simd=True):
            val = self.value(inst.operands[0], tuple(comps))
        inner.insert(f"{values}[{element}] = {val}")
        block.close(inner)
        adds = block.open(f"for {group} in range({chunk // LANES}):", trips=chunk // LANES)
        adds.insert(f"add_lanes({lanes}, {values}, {group} * {LANES}, {LANES})")
        block.close(adds)
        self.close_construct(target, block, saved)

        def pairwise(lo, hi):
            if hi - lo == 1:
                return f"{lanes}[{lo}]"
            mid = (lo + hi) // 2
            return ew.binary_src("add", et, pairwise(lo, mid), pairwise(mid, hi))

        target.insert(f"{acc} = {ew.binary_src('add', et, acc, pairwise(0, LANES))}")
        return self.emit(ew.round_src(et, acc, self.options.excess_precision), [acc])


# -- compiled kernels ------------------------------------------------------------------------------------
class FusedKernel(GeneratedKernel):
    """A compiled fusion: `kernel(*operands)` -> the root's value (an array, or a tuple for a tuple root)."""

    def __init__(self, source: str, key: str, outs, params, consts, blocks: list[slice], is_tuple: bool):
        super().__init__(source, key)
        self.blocks = [(b.start, b.stop) for b in blocks]  # outer-loop ranges run by the thread pool
        self.parallel = bool(blocks)
        self.is_tuple = is_tuple
        self._outs = [(o.shape.dims, o.shape.element_type.name) for o in outs]
        self._params = [(p.shape.dims, p.shape.element_type.name) for p in params]
        self._consts = consts
        self.recycle = False  # reuse the last call's outputs once no one else holds them (PlanMemory.recycle_outputs)
        self._spent: list | None = None
        self._spent_lock = threading.Lock()

    @property
    def signature(self) -> tuple:
        """Outputs writable, operands and constants read-only (compile_signature), all C-contiguous."""
        outs = [array_arg(ew.STORAGE[et], len(dims), False) for dims, et in self._outs]
        ins = [array_arg(ew.STORAGE[et], len(dims), True) for dims, et in self._params]
        ins += [array_arg(c.dtype, c.ndim, True) for c in self._consts]
        return tuple(outs + ins) + ((INT64_ARG, INT64_ARG) if self.blocks else ())

    def _arg(self, value, dims, et):
        a = np.asarray(value)
        storage = ew.STORAGE[et]
        if et in ("f16", "bf16"):
            a = a.view(np.uint16) if a.dtype.itemsize == 2 else a
        if a.dtype != storage:
            raise TypeError(f"fused kernel operand: expected {et}{list(dims)}, got {np.asarray(value).dtype}")
        a = np.ascontiguousarray(a)
        if a.ndim == 0:
            a = a.reshape(1)
        return a

    def __call__(self, *operands):
        if len(operands) != len(self._params):
            raise TypeError(f"fused kernel takes {len(self._params)} operands, got {len(operands)}")
        args = [self._arg(v, dims, et) for v, (dims, et) in zip(operands, self._params)]
        outs = self._recycled() if self.recycle else None
        if outs is None:
            outs = [np.empty(dims if dims else (1,), ew.STORAGE[et]) for dims, et in self._outs]
        if self.recycle:
            self._spent = outs
        fn = self.fn
        if self.blocks:
            blocks = self.blocks
            run_blocks(len(blocks), lambda i: fn(*outs, *args, *self._consts, *blocks[i]))
        else:
            fn(*outs, *args, *self._consts)
        results = []
        for o, (dims, et) in zip(outs, self._outs):
            if not dims:
                o = o.reshape(())
            if et in ("f16", "bf16"):
                o = o.view(np.float16 if et == "f16" else _bf16())
            results.append(o)
        return tuple(results) if self.is_tuple else results[0]

    def _recycled(self) -> list | None:
        """The last call's output buffers if nothing but this kernel references them any more (the caller
        dropped the results and every view of them), taken atomically: SPMD participants share kernels."""
        with self._spent_lock:
            spent, self._spent = self._spent, None
        if spent is None or any(sys.getrefcount(o) > _ONLY_THE_LIST for o in spent):
            return None
        return spent


_ONLY_THE_LIST = 3  # sys.getrefcount of an array referenced only by a list, inside a generator over it


def _bf16():
    import ml_dtypes

    return ml_dtypes.bfloat16


def generate_source(comp, options: Options = Options(), *, parallel=None):
    """(source, generator) for `comp` under `options` (the numerics rules, hloexec.options); raises
    TierUnsupported where the generator declines it."""
    if ew.sums_in_ynn_order(comp, options.reductions):
        raise TierUnsupported(ew.YNN_DECLINED)
    try:
        gen = FusionGenerator(comp, options, parallel)
        source = gen.generate()
        if gen.tiled_reads is not None:  # a transposing fusion: the loops in a tile either way, the cheaper one
            swapped = FusionGenerator(comp, options, parallel, rows_inside_tiles=True)
            swapped_source = swapped.generate()
            if swapped.inner_cost() < gen.inner_cost():
                return swapped_source, swapped
        return source, gen
    except RecursionError:  # value() recurses once per operand edge of a chain
        raise TierUnsupported("expression deeper than Python's recursion limit") from None


def compile_fusion(comp, options: Options = Options(), *, parallel=None, eager: bool = True):
    """A FusedKernel for fused computation `comp`; raises TierUnsupported(reason) if it holds anything this
    generator does not handle.

    `parallel`: None splits the outer loop over the thread pool (hloexec.kernels.threads) when output x
    reduced elements >= PARALLEL_THRESHOLD; True / False force.
    `eager`: compile (or load from the disk cache) now rather than on the first call (which also defers
    writing the source and importing Numba).
    `options`: the numerics rules (hloexec.options.Options: reductions, excess precision, the device profile).
    """
    source, gen = generate_source(comp, options, parallel=parallel)
    key = source_key(source)
    kernel = FusedKernel(source, key, gen.outs, gen.params, gen.consts, gen.blocks, comp.root.opcode == "tuple")
    if eager:
        kernel.compile()
    return kernel
