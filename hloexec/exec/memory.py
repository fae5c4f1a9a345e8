"""A plan's memory model: the buffers its steps make, how long each lives (views share their operand's, tuples
their elements'), the peak of live bytes a run reaches (what `hloexec run` and `max_memory` check), and the
outputs a run may recycle from the last one."""

from __future__ import annotations

from typing import NamedTuple

from ..ir import opcodes
from ..ir.module import Instruction
from ..kernels import elementwise as ew
from ..ops.movement import transpose_is_view


class PlanMemory:
    """The memory model of one Plan (`plan.memory`), built on first use from its steps and kept."""

    def __init__(self, plan):
        self.plan = plan
        self._peaks: dict[tuple[bool, bool], int] = {}
        self._table: _Buffers | None = None
        self._recycled: dict[int, int] = {}  # step index -> output bytes kept from the last run

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
        plan = self.plan
        b = self._buffers()
        recycled = self._recycled if recycled is None else recycled
        live = b.held + (sum(p.shape.nbytes for p in plan.computation.parameters) if parameter_bytes else 0)
        live += sum(recycled.values())
        series = [live]
        for k, step in enumerate(plan.steps):
            live += b.made[k] - recycled.get(k, 0)
            series.append(live + (scratch_bytes(step) if scratch else 0))
            live -= b.ends[k]
        return series

    def buffer_lives(self) -> list[BufferLife]:
        """The parameters (the caller holds them to the end), then every buffer the steps make, in the order they
        are made: its bytes, the steps that make and last hold it, the steps that read it (through views too),
        and what keeps it past its last reader (an output, a folded value, an output recycled from the last
        run). The same model as `live_bytes`: at step k a buffer is live when made <= k <= last (None: to the
        end)."""
        plan = self.plan
        b = self._buffers()
        readers: dict[tuple, list[int]] = {}
        for k, step in enumerate(plan.steps):
            for i in step.inputs:
                for key in _leaves(b.storage.get(i, ())):
                    readers.setdefault(key, []).append(k)
        lives = [
            BufferLife(
                (s, ()),
                plan.order[s].shape.nbytes,
                -1,
                None,
                plan.order[s],
                tuple(readers.get((s, ()), ())),
                "parameter",
            )
            for s in plan.parameter_slots
        ]
        for key, k in b.made_at.items():
            if k < 0:
                kind, made = "folded", -1
            elif k in self._recycled:
                kind, made = "recycled output", -1
            else:
                kind, made = ("output" if key in b.root else "temporary"), k
            last = b.last_holder[key]
            if kind == "temporary" and last == float("inf"):
                kind = "unread"  # no step reads it (a side effect's value): its slot is kept to the end
            producer = plan.order[key[0]]
            lives.append(
                BufferLife(
                    key,
                    b.sizes[key],
                    made,
                    None if last == float("inf") else int(last),
                    producer,
                    tuple(readers.get(key, ())),
                    kind,
                )
            )
        return lives

    def folded_bytes(self) -> int:
        """Bytes of the parameter-independent values this plan keeps after its first run."""
        return self._buffers().held

    def _buffers(self) -> _Buffers:
        """Bytes of the buffers each step makes, bytes of those no value holds after it, and the bytes of the
        folded values (held from the start). A value's storage is a set of buffers (a tuple of such, for tuples):
        views share their operand's, tuple and get-tuple-element pick theirs out of their operands'."""
        if self._table is not None:
            return self._table
        plan = self.plan
        sizes: dict[tuple, int] = {}

        def fresh(slot, shape, path=()):
            if shape.is_tuple:
                return tuple(fresh(slot, s, path + (i,)) for i, s in enumerate(shape.tuple_shapes))
            sizes[(slot, path)] = shape.nbytes
            return frozenset([(slot, path)])

        # the caller's buffers: tracked (what reads them, through views) but not counted here (live_bytes adds them)
        storage: dict[int, frozenset | tuple] = {s: frozenset([(s, ())]) for s in plan.parameter_slots}
        made_at: dict[tuple, int] = {}
        freed_at = {f: k for k, step in enumerate(plan.steps) for f in step.frees}
        for k, step in enumerate(plan.steps):
            inst = step.inst
            if step.fused or not _returns_view(inst):
                for s in (*step.extra_outputs, step.output):
                    storage[s] = fresh(s, plan.order[s].shape)
                    made_at.update((b, -1 if s in plan.folded else k) for b in _leaves(storage[s]))
            elif inst.opcode == "tuple":
                storage[step.output] = tuple(storage[i] for i in step.inputs)
            elif inst.opcode == "get-tuple-element":
                whole = storage[step.inputs[0]]
                storage[step.output] = whole[inst.attr("index")] if isinstance(whole, tuple) else whole
            else:
                storage[step.output] = storage[step.inputs[0]] if step.inputs else frozenset()
        last_holder: dict[tuple, float] = {}
        for s, value in storage.items():
            until = float("inf") if s in plan.folded or s not in freed_at else freed_at[s]
            for b in _leaves(value):
                last_holder[b] = max(last_holder.get(b, -1), until)
        made, ends = [0] * len(plan.steps), [0] * len(plan.steps)
        held = 0
        for b, k in made_at.items():
            if k < 0:
                held += sizes[b]
                continue
            made[k] += sizes[b]
            if last_holder[b] != float("inf"):
                ends[int(last_holder[b])] += sizes[b]
        self._table = _Buffers(
            made, ends, held, sizes, made_at, _leaves(storage.get(plan.root_slot, ())), storage, last_holder
        )
        return self._table

    def recycle_outputs(self) -> int:
        """Let the compiled kernels that write the root's values reuse their previous run's output buffers once
        nothing else holds them (the caller dropped the results): writing fresh pages costs a third of a
        memory-bound kernel's time (Adam). Only where holding those buffers from the start of a run does not
        raise the plan's peak. Returns how many kernels recycle."""
        from ..kernels.fusion import FusedKernel

        plan = self.plan
        b = self._buffers()
        made_by: dict[int, list] = {}
        for key, k in b.made_at.items():
            made_by.setdefault(k, []).append(key)
        candidates = {}
        for k, step in enumerate(plan.steps):
            kernel = getattr(step.kernel, "kernel", step.kernel)  # a TieredKernel's compiled tier
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
    made: list[int]  # bytes of the buffers each step makes
    ends: list[int]  # bytes of the buffers no value holds after each step
    held: int  # bytes of the folded values (held from the start)
    sizes: dict  # buffer -> bytes
    made_at: dict  # buffer -> step index (-1: folded)
    root: set  # the buffers of the root's value
    storage: dict  # slot -> its value's buffers (a tuple of such for tuples)
    last_holder: dict  # buffer -> the last step at which a value holds it (inf: past the end)


class BufferLife(NamedTuple):
    """One buffer of a plan (see PlanMemory.buffer_lives)."""

    buffer: tuple  # (slot, tuple index path)
    bytes: int
    made: int  # the step that makes it; -1: live from the start (folded, recycled output)
    last: int | None  # the last step at which a value holds it; None: past the end
    producer: Instruction  # what makes it: a fused group's root, a multi-output fusion's output
    readers: tuple  # the steps that read a value holding it, in order
    kind: str  # parameter | temporary | output | folded | recycled output | unread

    def live_at(self, k: int) -> bool:
        return self.made <= k and (self.last is None or k <= self.last)


def _leaves(storage) -> set:
    if isinstance(storage, tuple):
        return set().union(*map(_leaves, storage))
    return storage


def _returns_view(inst: Instruction) -> bool:
    """Whether the op's kernel returns (part of) an operand's buffer rather than a new one (ops/movement.py)."""
    if inst.opcode == "bitcast":  # a layout-changing bitcast makes a new array
        src, dst = inst.operands[0].shape, inst.shape
        return src.is_tuple or all(
            s.has_default_layout and not (s.layout is not None and s.layout.tiles) for s in (src, dst)
        )
    return inst.opcode in opcodes.VIEW or transpose_is_view(inst)


# Ops whose numpy kernels compute f16/bf16 values in f32 copies of their operands and result.
_LIFTED_TO_F32 = (
    ew.UNARY_OPS
    | ew.BINARY_OPS
    | {"compare", "select", "clamp", "convert", "reduce", "dot", "convolution", "reduce-window"}
)


def scratch_bytes(step) -> int:
    """Bytes a step holds while it runs beyond its result: the values of a computation it runs op by op
    (a call; a fusion's first, op-by-op run), or the f32 copies numpy computes f16/bf16 in."""
    kernel = getattr(step.kernel, "interpret", step.kernel)  # a TieredKernel's first run
    inst = step.inst
    memory = getattr(getattr(kernel, "plan", None), "memory", None)
    if isinstance(memory, PlanMemory):  # a Runner: a Plan run op by op
        return max(memory.peak_bytes(parameter_bytes=False) - inst.shape.nbytes, 0)
    if inst.opcode in _LIFTED_TO_F32 and not step.fused:
        halves = [
            s
            for s in (inst.shape, *(o.shape for o in inst.operands))
            if not s.is_tuple and s.element_type.is_half_float
        ]
        return 4 * sum(s.size for s in halves)
    return 0
