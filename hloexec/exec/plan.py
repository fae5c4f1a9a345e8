"""Execution plans: a computation lowered once into a flat list of steps, then only iterated.

A `Plan` holds, per instruction in schedule order, the kernel its op prepared, the slots of its
operands, its own slot, and the slots whose last use it is (freed right after it runs, so a buffer
lives exactly as long as the schedule needs it). The same liveness gives the peak memory estimate
that `hloexec run` prints before running.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from ..errors import CompileWarning, ExecutionError, UnsupportedError, describe_site
from ..ir import opcodes
from ..ir.module import Computation, Instruction
from ..kernels import elementwise as ew
from ..ops.registry import async_shorthand, lookup
from .fuse import find_groups
from .inline import inline_calls


def _no_observer():
    return None


def schedule(comp: Computation) -> list[Instruction]:
    """Instructions in an order where operands (and control predecessors) come first.

    Text order when it is already valid (XLA prints topologically); else a DFS from every
    instruction in text order, so dead instructions are scheduled too (`Plan` leaves out those without side effects).
    """
    position = {id(inst): i for i, inst in enumerate(comp.instructions)}
    if all(position.get(id(o), -1) < position[id(inst)] for inst in comp.instructions for o in inst.operands) \
            and not any("control-predecessors" in inst.attrs for inst in comp.instructions):
        return list(comp.instructions)
    by_name = comp.by_name
    order, state = [], {}
    for start in comp.instructions:
        stack = [(start, False)]
        while stack:
            inst, expanded = stack.pop()
            key = id(inst)
            if expanded:
                state[key] = 2
                order.append(inst)
                continue
            if state.get(key) == 2:
                continue
            if state.get(key) == 1:
                raise ExecutionError(f"cycle through %{inst.name} in computation %{comp.name}")
            state[key] = 1
            stack.append((inst, True))
            preds = list(inst.operands)
            preds += [by_name[n] for n in inst.attr("control-predecessors", ()) if n in by_name]
            for p in reversed(preds):
                if state.get(id(p)) != 2:
                    stack.append((p, False))
    return order


@dataclass(slots=True)
class Step:
    inst: Instruction
    kernel: object
    inputs: tuple[int, ...]
    output: int
    frees: tuple[int, ...]
    fused: bool = False         # runs a fused group's kernel (exec/fuse.py), not its instruction's op
    extra_outputs: tuple[int, ...] = ()     # a multi-output group's other outputs: the kernel returns
                                            # (their values..., inst's value)


def has_side_effect(inst: Instruction) -> bool:
    """XLA's HloInstruction::HasSideEffect: the opcode is effectful, a custom-call says it is, a collective
    has a channel_id or constrain_layout (XLA exempts SPMD-partitioned modules; hloexec keeps them all),
    or a called computation holds such an instruction."""
    shorthand = async_shorthand(inst.opcode)        # all-to-all-start: an async all-to-all, with its attributes
    opcode = shorthand[1] if shorthand else inst.opcode
    if opcode in opcodes.SIDE_EFFECTING:
        return True
    if opcode == "custom-call" and inst.attr("custom_call_has_side_effect", False):
        return True
    if opcode in opcodes.CHANNEL_COLLECTIVES and (inst.has_attr("channel_id") or inst.attr("constrain_layout", False)):
        return True
    return any(has_side_effect(i) for c in inst.called_computations for i in c.instructions)


def live_instructions(comp: Computation, inputs_of=None) -> set[int]:
    """ids of the instructions the root or a side effect depends on (through operands -- or what
    `inputs_of(inst)` says an instruction reads -- and control-predecessors), with the side-effecting
    instructions and the parameters themselves."""
    by_name = comp.by_name
    stack = [comp.root, *comp.parameters, *(i for i in comp.instructions if has_side_effect(i))]
    live: set[int] = set()
    while stack:
        inst = stack.pop()
        if id(inst) in live:
            continue
        live.add(id(inst))
        stack += inst.operands if inputs_of is None else inputs_of(inst)
        stack += [by_name[n] for n in inst.attr("control-predecessors", ()) if n in by_name]
    return live


class Plan:
    """A prepared computation: call it with parameter values, get the root's value.

    Dead instructions -- those neither the root nor a side-effecting instruction depends on -- are left
    out, as XLA's dead-code elimination removes them (HloDCE keeps HasSideEffect instructions): a dead
    custom-call to an unknown target does not stop the module, and dead work costs nothing.
    """

    def __init__(self, comp: Computation, ctx, fuse: bool = False):
        self.computation = comp
        # the calling thread's observe callback, if its run looks inside this computation
        self._observer = partial(ctx.observer, comp) if hasattr(ctx, "observer") else _no_observer
        # a reducer or comparator runs per element: observers see the instruction applying it, not each scalar
        self._unobserved = lambda: comp.name in getattr(ctx, "applied_computations", ())
        if fuse:        # calls inlined first, so that fusion sees through them (exec/inline.py)
            comp = inline_calls(comp, keep_call=has_side_effect)
        live = live_instructions(comp)
        order = [inst for inst in schedule(comp) if id(inst) in live]
        # Unfused producer/consumer chains become compiled kernels; their inner values are never stored.
        groups = {id(g.root): g for g in find_groups(order, comp.root, ctx.fused_kernel)} if fuse else {}
        inputs_of = {id(inst): inst.operands for inst in order}
        # a multi-output group's other outputs are written by its step: they "read" its root
        produced_by = {id(o): g.root for g in groups.values() for o in g.outputs[:-1]}
        if groups:
            inputs_of.update((root, g.inputs) for root, g in groups.items())
            inputs_of.update((o, [root]) for o, root in produced_by.items())
            live = live_instructions(comp, lambda inst: inputs_of[id(inst)])
            order = [inst for inst in order if id(inst) in live]
        self.fused_groups = list(groups.values())
        slot = {id(inst): i for i, inst in enumerate(order)}
        self.n_slots = len(order)
        self.parameter_slots = [slot[id(p)] for p in comp.parameters]
        self.root_slot = slot[id(comp.root)]
        last_use: dict[int, int] = {}
        for step_index, inst in enumerate(order):
            if id(inst) not in produced_by:
                for o in inputs_of[id(inst)]:
                    last_use[slot[id(o)]] = step_index
        frees_at: dict[int, list[int]] = {}
        for s, step_index in last_use.items():
            if s != self.root_slot:
                frees_at.setdefault(step_index, []).append(s)
        self.order = order
        self.steps: list[Step] = []
        for step_index, inst in enumerate(order):
            if inst.opcode == "parameter" or id(inst) in produced_by:
                continue
            group = groups.get(id(inst))
            try:
                kernel = group.kernel if group is not None else lookup(inst).prepare(inst, ctx)
            except UnsupportedError as e:
                if e.instruction is None:
                    raise UnsupportedError(e.what, inst) from None
                raise
            extra = tuple(slot[id(o)] for o in group.outputs[:-1]) if group is not None else ()
            self.steps.append(Step(inst, kernel, tuple(slot[id(o)] for o in inputs_of[id(inst)]), slot[id(inst)],
                                   tuple(frees_at.get(step_index, ())), group is not None, extra))
        # Values that do not depend on the parameters are computed by the first run and reused after it,
        # except big broadcasts and iotas: one pass over their output recomputes them, while keeping them would
        # hold that memory as long as the plan (XLA's constant folding skips them for the same reason).
        invariant = set()
        for inst in order:
            if (inst.opcode in opcodes.PURE and inst.shape.nbytes <= MAX_FOLDED_BYTES
                    and "control-predecessors" not in inst.attrs
                    and all(id(o) in invariant for o in inputs_of[id(inst)])):
                invariant.add(id(inst))
        runs_warm = {id(inst) for inst in order if id(inst) not in invariant}
        read_warm = {id(comp.root)}
        for inst in reversed(order):
            if id(inst) in read_warm and inst.opcode in _EXPANSIONS and inst.shape.nbytes > MAX_KEPT_EXPANSION_BYTES:
                runs_warm.add(id(inst))
            if id(inst) in runs_warm:
                read_warm.update(id(o) for o in inputs_of[id(inst)])
        self.invariant_slots = {slot[i] for i in invariant - runs_warm}     # computed by the first run only
        self.folded = {slot[i]: None for i in (invariant - runs_warm) & read_warm}  # slot -> value, kept
        # Parameters that nothing uses are dropped at once.
        used = set(last_use)
        self.unused_parameters = [s for s in self.parameter_slots if s not in used and s != self.root_slot]
        self._run_fast = None       # the schedule as one generated function, after a checked first run (False: the
                                    # generated one failed where the checked one did not; runs stay checked)
        self._peaks: dict[tuple[bool, bool], int] = {}
        self._buffer_table: _Buffers | None = None
        self._recycled: dict[int, int] = {}        # step index -> output bytes kept from the last run

    def __call__(self, *args, progress=None, profile=None):
        """`progress(done, total)`, if given, is called after each step; `profile`, a dict, gets each step's
        instruction -> seconds added (a fused group counts under its root). Either makes the run a checked one,
        as does an observer (ExecContext.observe), called `observer(inst, value, operand values)` after each step."""
        observe = self._observer()
        if observe is not None and self._unobserved():
            observe = None
        fast_error = None
        if self._run_fast and progress is None and profile is None and observe is None:
            try:
                return self._run_fast(args)
            except (UnsupportedError, ExecutionError):
                raise
            except Exception as e:  # values are immutable: rerun checked, which names the failing instruction
                fast_error = e
        slots = [None] * self.n_slots
        for s, value in zip(self.parameter_slots, args):
            slots[s] = value
        for s in self.unused_parameters:
            slots[s] = None
        self._run_checked(slots, progress, profile, observe)
        if fast_error is not None:      # the checked run passed where the fast one failed: a bug in the latter
            self._run_fast = False      # (never again: this plan runs checked)
            warnings.warn(f"the compiled schedule of %{self.computation.name} failed ({type(fast_error).__name__}: "
                          f"{fast_error}) where the checked run did not: a bug; this plan runs checked from now on",
                          CompileWarning, stacklevel=2)
        if self._run_fast is None:
            self._run_fast = compile_schedule(self)
        return slots[self.root_slot]

    def _run_checked(self, slots, progress=None, profile=None, observe=None):
        """First run: every result is checked against its instruction's shape (no silent wrong result)."""
        total = len(self.steps)
        for done, step in enumerate(self.steps, 1):
            operands = [slots[i] for i in step.inputs]
            try:
                if profile is None:
                    value = step.kernel(*operands)
                else:
                    start = time.perf_counter()
                    value = step.kernel(*operands)
                    profile[step.inst] = profile.get(step.inst, 0.0) + time.perf_counter() - start
            except (UnsupportedError, ExecutionError):
                raise
            except Exception as e:  # a kernel failing is a bug or bad input: say where
                raise ExecutionError(f"{type(e).__name__}: {e}{describe_site(step.inst)}") from e
            if step.extra_outputs:
                *extras, value = value
                for s, v in zip(step.extra_outputs, extras):
                    check_value(self.order[s], v)
                    if s in self.folded:
                        self.folded[s] = v
                    slots[s] = v
                    if observe is not None:
                        observe(self.order[s], v, operands)
            check_value(step.inst, value)
            if observe is not None:
                observe(step.inst, value, operands)
            if step.output in self.folded:
                self.folded[step.output] = value
            slots[step.output] = value
            for f in step.frees:
                slots[f] = None
            if progress is not None:
                progress(done, total)

    def peak_bytes(self, parameter_bytes: bool = True, scratch: bool = True) -> int:
        """Peak of live buffer bytes over the schedule, with what each step holds while it runs (`scratch`, see
        scratch_bytes). A buffer lives until the last value sharing it is freed (a view keeps its operand's
        buffer); parameters stay live (their caller holds them), folded values too (the plan keeps them)."""
        key = (parameter_bytes, scratch)
        if key not in self._peaks:
            self._peaks[key] = max(self.live_bytes(parameter_bytes, scratch), default=0)
        return self._peaks[key]

    def live_bytes(self, parameter_bytes: bool = True, scratch: bool = True, recycled=None) -> list[int]:
        """Live bytes before the first step, then while each step runs (series[k + 1]: while steps[k] runs).
        `recycled` (default: the plan's) maps step index -> bytes of outputs kept from the last run: live from
        the start instead of from the step."""
        b = self._buffers()
        recycled = self._recycled if recycled is None else recycled
        live = b.held + (sum(p.shape.nbytes for p in self.computation.parameters) if parameter_bytes else 0)
        live += sum(recycled.values())
        series = [live]
        for k, step in enumerate(self.steps):
            live += b.made[k] - recycled.get(k, 0)
            series.append(live + (scratch_bytes(step) if scratch else 0))
            live -= b.ends[k]
        return series

    def buffer_lives(self) -> list["BufferLife"]:
        """The parameters (the caller holds them to the end), then every buffer the steps make, in the order they
        are made: its bytes, the steps that make and last hold it, the steps that read it (through views too),
        and what keeps it past its last reader (an output, a folded value, an output recycled from the last
        run). The same model as `live_bytes`: at step k a buffer is live when made <= k <= last (None: to the
        end)."""
        b = self._buffers()
        readers: dict[tuple, list[int]] = {}
        for k, step in enumerate(self.steps):
            for i in step.inputs:
                for key in _leaves(b.storage.get(i, ())):
                    readers.setdefault(key, []).append(k)
        lives = [BufferLife((s, ()), self.order[s].shape.nbytes, -1, None, self.order[s],
                            tuple(readers.get((s, ()), ())), "parameter") for s in self.parameter_slots]
        for key, k in b.made_at.items():
            if k < 0:
                kind, made = "folded", -1
            elif k in self._recycled:
                kind, made = "recycled output", -1
            else:
                kind, made = ("output" if key in b.root else "temporary"), k
            last = b.last_holder[key]
            if kind == "temporary" and last == float("inf"):
                kind = "unread"         # no step reads it (a side effect's value): its slot is kept to the end
            producer = self.order[key[0]]
            lives.append(BufferLife(key, b.sizes[key], made, None if last == float("inf") else int(last),
                                    producer, tuple(readers.get(key, ())), kind))
        return lives

    def folded_bytes(self) -> int:
        """Bytes of the parameter-independent values this plan keeps after its first run."""
        return self._buffers().held

    def _buffers(self) -> "_Buffers":
        """Bytes of the buffers each step makes, bytes of those no value holds after it, and the bytes of the
        folded values (held from the start). A value's storage is a set of buffers (a tuple of such, for tuples):
        views share their operand's, tuple and get-tuple-element pick theirs out of their operands'."""
        if self._buffer_table is not None:
            return self._buffer_table
        sizes: dict[tuple, int] = {}

        def fresh(slot, shape, path=()):
            if shape.is_tuple:
                return tuple(fresh(slot, s, path + (i,)) for i, s in enumerate(shape.tuple_shapes))
            sizes[(slot, path)] = shape.nbytes
            return frozenset([(slot, path)])

        # the caller's buffers: tracked (what reads them, through views) but not counted here (live_bytes adds them)
        storage = {s: frozenset([(s, ())]) for s in self.parameter_slots}
        made_at: dict[tuple, int] = {}
        freed_at = {f: k for k, step in enumerate(self.steps) for f in step.frees}
        for k, step in enumerate(self.steps):
            inst = step.inst
            if step.fused or not _returns_view(inst):
                for s in (*step.extra_outputs, step.output):
                    storage[s] = fresh(s, self.order[s].shape)
                    made_at.update((b, -1 if s in self.folded else k) for b in _leaves(storage[s]))
            elif inst.opcode == "tuple":
                storage[step.output] = tuple(storage[i] for i in step.inputs)
            elif inst.opcode == "get-tuple-element":
                whole = storage[step.inputs[0]]
                storage[step.output] = whole[inst.attr("index")] if isinstance(whole, tuple) else whole
            else:
                storage[step.output] = storage[step.inputs[0]] if step.inputs else frozenset()
        last_holder: dict[tuple, float] = {}
        for s, value in storage.items():
            until = float("inf") if s in self.folded or s not in freed_at else freed_at[s]
            for b in _leaves(value):
                last_holder[b] = max(last_holder.get(b, -1), until)
        made, ends = [0] * len(self.steps), [0] * len(self.steps)
        held = 0
        for b, k in made_at.items():
            if k < 0:
                held += sizes[b]
                continue
            made[k] += sizes[b]
            if last_holder[b] != float("inf"):
                ends[int(last_holder[b])] += sizes[b]
        self._buffer_table = _Buffers(made, ends, held, sizes, made_at, _leaves(storage.get(self.root_slot, ())),
                                      storage, last_holder)
        return self._buffer_table

    def recycle_outputs(self) -> int:
        """Let the compiled kernels that write the root's values reuse their previous run's output buffers once
        nothing else holds them (the caller dropped the results): writing fresh pages costs a third of a
        memory-bound kernel's time (Adam). Only where holding those buffers from the start of a run does not
        raise the plan's peak. Returns how many kernels recycle."""
        from ..kernels.fusion import FusedKernel
        b = self._buffers()
        made_by: dict[int, list] = {}
        for key, k in b.made_at.items():
            made_by.setdefault(k, []).append(key)
        candidates = {}
        for k, step in enumerate(self.steps):
            kernel = getattr(step.kernel, "kernel", step.kernel)      # a TieredKernel's compiled tier
            mine = made_by.get(k, [])
            if step.fused and isinstance(kernel, FusedKernel) and mine and all(key in b.root for key in mine):
                candidates[k] = (kernel, sum(b.sizes[key] for key in mine))
        peak = self.peak_bytes()
        recycled = {k: size for k, (_, size) in candidates.items()}
        if not candidates or max(self.live_bytes(recycled=recycled)) > peak * RECYCLE_PEAK_SLACK:
            return 0
        for kernel, _ in candidates.values():
            kernel.recycle = True
        self._recycled, self._peaks = recycled, {}
        return len(candidates)


# Recycling may raise the plan's peak this much (small values made before the recycled outputs' steps).
RECYCLE_PEAK_SLACK = 1.05


class _Buffers(NamedTuple):
    made: list[int]             # bytes of the buffers each step makes
    ends: list[int]             # bytes of the buffers no value holds after each step
    held: int                   # bytes of the folded values (held from the start)
    sizes: dict                 # buffer -> bytes
    made_at: dict               # buffer -> step index (-1: folded)
    root: set                   # the buffers of the root's value
    storage: dict               # slot -> its value's buffers (a tuple of such for tuples)
    last_holder: dict           # buffer -> the last step at which a value holds it (inf: past the end)


class BufferLife(NamedTuple):
    """One buffer of a plan (see Plan.buffer_lives)."""
    buffer: tuple               # (slot, tuple index path)
    bytes: int
    made: int                   # the step that makes it; -1: live from the start (folded, recycled output)
    last: int | None            # the last step at which a value holds it; None: past the end
    producer: Instruction       # what makes it: a fused group's root, a multi-output fusion's output
    readers: tuple              # the steps that read a value holding it, in order
    kind: str                   # parameter | temporary | output | folded | recycled output | unread

    def live_at(self, k: int) -> bool:
        return self.made <= k and (self.last is None or k <= self.last)


def _leaves(storage) -> set:
    if isinstance(storage, tuple):
        return set().union(*map(_leaves, storage))
    return storage


def _returns_view(inst: Instruction) -> bool:
    """Whether the op's kernel returns (part of) an operand's buffer rather than a new one (ops/movement.py)."""
    if inst.opcode == "bitcast":        # a layout-changing bitcast makes a new array
        src, dst = inst.operands[0].shape, inst.shape
        return src.is_tuple or all(s.has_default_layout and not (s.layout is not None and s.layout.tiles)
                                   for s in (src, dst))
    return inst.opcode in opcodes.VIEW


MAX_FOLDED_BYTES = 16 << 20     # a folded value lives as long as its plan
_EXPANSIONS = frozenset({"broadcast", "iota"})
MAX_KEPT_EXPANSION_BYTES = 64 << 10


# Ops whose numpy kernels compute f16/bf16 values in f32 copies of their operands and result.
_LIFTED_TO_F32 = ew.UNARY_OPS | ew.BINARY_OPS | {"compare", "select", "clamp", "convert", "reduce", "dot",
                                               "convolution", "reduce-window"}


def scratch_bytes(step: Step) -> int:
    """Bytes a step holds while it runs beyond its result: the values of a computation it runs op by op
    (a call; a fusion's first, op-by-op run), or the f32 copies numpy computes f16/bf16 in."""
    kernel = getattr(step.kernel, "interpret", step.kernel)     # a TieredKernel's first run
    inst = step.inst
    if isinstance(kernel, Plan):
        return max(kernel.peak_bytes(parameter_bytes=False) - inst.shape.nbytes, 0)
    if inst.opcode in _LIFTED_TO_F32 and not step.fused:
        halves = [s for s in (inst.shape, *(o.shape for o in inst.operands))
                  if not s.is_tuple and s.element_type.is_half_float]
        return 4 * sum(s.size for s in halves)
    return 0


def compile_schedule(plan: Plan):
    """The checked plan as one generated Python function `run(args) -> root value`.

    Slots become local variables and frees become `del`s, so a warm run does no per-step list building,
    indexing or attribute lookups: only the kernel calls (about 0.1 us of overhead per step instead of ~1 us).
    Steps computing parameter-independent values are left out: the first run's values are bound instead
    (XLA folds such constants at compile time; in a while body they would be recomputed every step).
    """
    names = {}
    lines = ["def run(args):"]
    if plan.parameter_slots:
        lines.append(f"    {', '.join(f's{s}' for s in plan.parameter_slots)}, = args")
    if plan.unused_parameters:
        lines.append(f"    del {', '.join(f's{s}' for s in plan.unused_parameters)}")
    for s, value in plan.folded.items():      # parameter-independent values: computed once, by the first run
        names[f"f{s}"] = value
        lines.append(f"    s{s} = f{s}")
    for k, step in enumerate(plan.steps):
        if step.output in plan.invariant_slots:
            continue
        names[f"k{k}"] = step.kernel
        targets = "".join(f"s{s}, " for s in step.extra_outputs) + f"s{step.output}"
        lines.append(f"    {targets} = k{k}({', '.join(f's{i}' for i in step.inputs)})")
        if step.frees:
            lines.append(f"    del {', '.join(f's{f}' for f in step.frees)}")
    lines.append(f"    return s{plan.root_slot}")
    code = compile("\n".join(lines), f"<schedule of %{plan.computation.name}>", "exec")
    exec(code, names)
    return names["run"]


def check_value(inst: Instruction, value) -> None:
    shape = inst.shape
    if shape.is_tuple:
        if not isinstance(value, tuple) or len(value) != len(shape.tuple_shapes):
            raise ExecutionError(f"kernel returned {type(value).__name__}, expected a {len(shape.tuple_shapes)}-tuple"
                                 f"{describe_site(inst)}")
        return
    if shape.element_type.numpy is None:     # token / opaque
        return
    dims = getattr(value, "shape", None)
    if dims != shape.dims or value.dtype != shape.dtype:
        raise ExecutionError(f"kernel returned {getattr(value, 'dtype', type(value).__name__)}{list(dims or ())}, "
                             f"expected {shape.to_text(layout=False)}{describe_site(inst)}")
