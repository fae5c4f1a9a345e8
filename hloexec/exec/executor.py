"""Running a module: the context ops prepare against, and `Executable`, what `hloexec.load` returns."""
from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from functools import cached_property, partial

import numpy as np

from ..errors import ElidedConstantWarning, ExecutionError, MemoryLimitError, elided_constants_note
from ..ir.module import Computation, Module
from ..ir.shape import Shape
from ..kernels.elementwise import check_reductions
from .inputs import from_npz_void
from .plan import Plan
from .tier_report import TierReport
from .tiering import NOT_COMPILED, CompilePolicy, TieredKernel, TieredLoop, compiled_or, loop_step_work


@dataclass
class Device:
    """The participant a run plays: its ids, and how its collectives reach the others."""
    replica_id: int = 0
    partition_id: int = 0
    num_replicas: int = 1
    num_partitions: int = 1
    communicator: object = None       # see hloexec.exec.communicators

    @property
    def global_id(self) -> int:
        """XLA's flattened id: replica_id * num_partitions + partition_id."""
        return self.replica_id * self.num_partitions + self.partition_id


class ExecContext:
    """What ops see while they are prepared (hloexec.ops.registry.Context)."""

    def __init__(self, module: Module, device: Device, *, excess_precision: bool = False, use_numba: bool = True,
                 compile_after: int = 1, compile_kernels: bool = True, reductions: str = "accumulate"):
        self.module = module
        self.default_device = device
        self.excess_precision = excess_precision
        self.reductions = check_reductions(reductions)
        self.use_numba = use_numba
        # False: kernels that would compile while the plan is prepared compile at their first call instead (the
        # plan and its memory model are the same; reports that never run the module do not wait for Numba)
        self.compile_kernels = compile_kernels
        self._plans: dict[tuple[int, bool], Plan] = {}
        self.policy = CompilePolicy(compile_after)    # which fusions and loops compile, and when
        self._participant = threading.local()
        self.tier_report = TierReport()     # which fusions and loops compiled, why the others run op by op

    @property
    def compile_after(self) -> int:
        return self.policy.compile_after

    @property
    def device(self) -> Device:
        """The device of the calling thread: SPMD participants share one prepared plan (hloexec.exec.spmd)."""
        return getattr(self._participant, "device", None) or self.default_device

    def participant(self) -> int:
        """The calling thread's device id: tiers count their calls per participant."""
        return self.device.global_id

    def play(self, device: Device) -> None:
        """Make the calling thread run as `device` (ops read ctx.device at run time)."""
        self._participant.device = device

    def observer(self, comp: Computation | None = None):
        """The calling thread's `observer(inst, value, operands)` while it runs an observed run (that looks inside
        `comp`, a fused, called, loop or branch computation; the entry always), else None."""
        observer = getattr(self._participant, "observer", None)
        inside = getattr(self._participant, "inside", None)
        if observer is None or comp is None or inside is None or comp is self.module.entry or inside(comp):
            return observer
        return None

    @cached_property
    def applied_computations(self) -> frozenset[str]:
        """Names of the computations applied per element (reducers, comparators, scatter/select/map
        computations), with those they call: an observed run does not observe their scalar steps."""
        return applied_computations(self.module)

    def observe(self, callback, inside=None) -> tuple:
        """Make the calling thread's runs call `callback(inst, value, operands)` after every instruction (None:
        stop) of the entry and of the computations `inside(computation)` accepts (None: all). Returns what it
        replaces, (callback, inside)."""
        participant = self._participant
        previous = (getattr(participant, "observer", None), getattr(participant, "inside", None))
        participant.observer, participant.inside = callback, inside
        return previous

    def computation(self, comp: Computation, fuse: bool = True) -> Plan:
        """The prepared plan of `comp`; `fuse`: group its unfused producer/consumer chains (exec/fuse.py)."""
        key = (id(comp), fuse and self.use_numba)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = Plan(comp, self, fuse=key[1])
        return plan

    @property
    def plans(self) -> list[Plan]:
        return list(self._plans.values())

    def fused_kernel(self, comp: Computation):
        """A kernel running the fused computation `comp` as one compiled loop nest, or None to run it op by op:
        `self.policy` (exec/tiering.py) says whether it is worth compiling and when; a TieredKernel switches."""
        if not self.use_numba:
            return None
        policy = self.policy
        reason = policy.declines(comp)
        if reason is not None:
            self.tier_report.record("fusion", comp.name, reason)
            return None
        from ..kernels.fusion import compile_fusion
        kernel = self.tier_report.generate("fusion", comp.name, lambda: compile_fusion(
            comp, excess_precision=self.excess_precision, reductions=self.reductions, eager=False))
        if kernel is None:
            return None
        failed = partial(self.tier_report.record, "fusion", comp.name, NOT_COMPILED)
        if policy.compiles_at_once(kernel.key, comp):
            compiled = compiled_or(kernel, None, failed) if self.compile_kernels else None
            if compiled is None and self.compile_kernels:
                return None
            # op by op only in observed runs: its plan is made then
            return TieredKernel(lambda *operands: self.computation(comp, fuse=False)(*operands), kernel, 0,
                                self.participant, partial(self.observer, comp), failed, compiled)
        tier = TieredKernel(self.computation(comp, fuse=False), kernel, policy.compile_after, self.participant,
                            partial(self.observer, comp), failed)
        policy.planned_kernel(kernel.key, tier)
        return tier

    def compiled_loop(self, inst):
        """The while loop `inst` as a TieredLoop, or None where it cannot compile (it runs interpreted).

        The loops nested in a loop that compiles are compiled with it, never on their own: they run
        interpreted until it switches."""
        cond = self.computation(inst.called["condition"])
        body = self.computation(inst.called["body"])      # prepares the nested loops first
        if not self.use_numba:
            return None
        from ..kernels.program import compile_program
        kernel = self.tier_report.generate("loop", inst.name, lambda: compile_program(
            inst, excess_precision=self.excess_precision, reductions=self.reductions))
        if kernel is None:
            return None
        loop = TieredLoop(cond, body, kernel, loop_step_work(inst), self.policy.loop_compile_threshold(kernel),
                          self.participant, partial(self.observer, inst.called["body"]),
                          partial(self.tier_report.record, "loop", inst.name, NOT_COMPILED))
        self.policy.planned_loop(inst, loop)
        return loop


@dataclass(frozen=True)
class Parameter:
    number: int
    name: str
    shape: Shape

    @property
    def dtype(self):
        return None if self.shape.is_tuple else self.shape.dtype

    def __str__(self):
        return f"{self.number}: %{self.name} {self.shape.to_text(layout=False)}"


class Executable:
    """A module prepared for running on the CPU: `run(*arrays)` returns numpy arrays."""

    def __init__(self, module: Module, *, excess_precision: bool = False, use_numba: bool = True,
                 compile_after: int = 1, device: Device | None = None, max_memory: int | None = None,
                 compile_kernels: bool = True, reductions: str = "accumulate"):
        from .communicators import MirrorCommunicator
        self.module = module
        elided = module.elided_constants()
        if elided:
            warnings.warn(elided_constants_note(module, elided), ElidedConstantWarning, stacklevel=3)
        if device is None:
            device = Device(num_replicas=module.replica_count, num_partitions=module.num_partitions)
            device.communicator = MirrorCommunicator(device)
        self.device = device
        self.context = ExecContext(module, device, excess_precision=excess_precision, use_numba=use_numba,
                                   compile_after=compile_after, compile_kernels=compile_kernels,
                                   reductions=reductions)
        self.plan = self.context.computation(module.entry)
        self.plan.memory.recycle_outputs()            # a run reuses the outputs of the last one that the caller dropped
        self._parameters = self.parameters     # built once: run() checks every input against it
        from .manual import has_manual_regions
        self.manual_regions = has_manual_regions(module)    # pre-partition: every device must run (exec/manual.py)
        self.max_memory = max_memory           # bytes a run may use; None: MemAvailable at each run
        self._peak_bytes: int | None = None

    @property
    def parameters(self) -> list[Parameter]:
        return [Parameter(p.parameter_number, p.name, p.shape) for p in self.module.entry.parameters]

    @property
    def result_shape(self) -> Shape:
        return self.module.entry.root.shape

    def run(self, *args, progress=None, profile=None, observe=None, observe_operands: bool = False,
            observe_inside=None):
        """Run the entry computation; tuple results come back as (nested) tuples of arrays.

        `progress(done, total)` is called after each entry-computation instruction (None: no cost);
        `profile`, a dict, gets instruction -> seconds for the entry computation, its calls inlined (loops and
        fused groups inclusive). `observe(inst, value)` is called after every instruction that runs, in the
        order they run: those of called, fused and loop computations too (each time they run; fusions and loops
        run op by op while observed, so every value is seen). A group hloexec fused itself (`use_numba=True`
        on an unfused module) is seen as its root; so is a reducer or comparator applied per element (the reduce,
        sort, scatter... applying it is seen). Values are the plan's own: keep only what you need.
        `observe_operands`: call `observe(inst, value, operands)`, with the operand values the instruction
        ran on (a fused group's: its inputs). Parameters are not observed (they are the caller's values).
        `observe_inside(computation) -> bool` limits observing to the fused, called, loop and branch computations
        it accepts: the others run as in an unobserved run (a fusion or a loop compiled) and are seen as their
        caller's one value."""
        if self.manual_regions and self.context.device is self.device:   # every device must run; this thread plays none
            if progress is not None or profile is not None or observe is not None:
                raise ExecutionError(f"{self.module.name} has manual regions, which run as one participant per "
                                     "device: progress, profile and observe follow one participant only")
            from .manual import run_with_manual_regions
            return run_with_manual_regions(self, args)
        params = self._parameters
        if len(args) != len(params):
            raise ExecutionError(f"{self.module.name} takes {len(params)} inputs, got {len(args)}:\n  "
                                 + "\n  ".join(map(str, params)))
        self.check_memory()
        inputs = [_coerce(arg, p) for arg, p in zip(args, params)]
        previous = None if observe is None else self.context.observe(
            observe if observe_operands else lambda inst, value, operands: observe(inst, value), observe_inside)
        try:
            with np.errstate(all="ignore"):     # IEEE overflow / invalid are values in HLO, not warnings
                return self.plan(*inputs, progress=progress, profile=profile)
        finally:
            if previous is not None:
                self.context.observe(*previous)

    __call__ = run

    def random_inputs(self, seed: int = 0) -> list:
        from .inputs import random_inputs
        return random_inputs(self.module, seed)

    def peak_bytes(self) -> int:
        """Peak live bytes of the entry computation (inputs included), from the schedule, and the values the
        plans of called computations keep after their first run (see Plan.folded)."""
        if self._peak_bytes is None:
            kept = sum(plan.memory.folded_bytes() for plan in self.context.plans if plan is not self.plan)
            self._peak_bytes = self.plan.memory.peak_bytes() + kept
        return self._peak_bytes

    def check_memory(self, max_memory: int | None = None, available: int | None = None) -> int | None:
        """Refuse a run whose peak cannot fit, before it starts, rather than be OOM-killed halfway: MemoryLimitError
        if peak_bytes() exceeds `max_memory` (None: the Executable's), else `available` (None: MemAvailable now).
        Returns the limit it checked against (None: none is known)."""
        if max_memory is None:
            max_memory = self.max_memory
        limit = max_memory if max_memory is not None else available if available is not None else available_memory()
        if limit is not None and self.peak_bytes() > limit:
            raise MemoryLimitError(self.module.name, self.peak_bytes(), limit, given=max_memory is not None)
        return limit

    def run_spmd(self, per_device_inputs, partitions: int | None = None, replicas: int | None = None, **options):
        """Run every participant of an SPMD module, collectives between them; see hloexec.exec.spmd.run_spmd."""
        from .spmd import run_spmd
        return run_spmd(self, per_device_inputs, partitions=partitions, replicas=replicas, **options)


# (opcode, called-computation key) of the calls whose computation runs once per call, not per element
_WHOLE_CALLS = frozenset({("call", "to_apply"), ("fusion", "calls"), ("while", "condition"), ("while", "body"),
                          ("conditional", "branch_computations"), ("conditional", "true_computation"),
                          ("conditional", "false_computation"), ("async-start", "calls"),
                          ("async-start", "called_computations"), ("custom-call", "called_computations")})


def applied_computations(module: Module) -> frozenset[str]:
    """Names of the computations some instruction applies per element (reduce, sort, scatter, map, all-reduce...),
    and of the computations they call."""
    applied: set[str] = set()

    def add(comp: Computation) -> None:
        if comp.name not in applied:
            applied.add(comp.name)
            for inst in comp.instructions:
                for c in inst.called_computations:
                    add(c)
    for comp in module.computations:
        for inst in comp.instructions:
            for key, called in inst.called.items():
                if (inst.opcode, key) not in _WHOLE_CALLS:
                    for c in (called if isinstance(called, list) else [called]):
                        add(c)
    return frozenset(applied)


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes; None where there is no /proc (not Linux)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _coerce(value, param: Parameter):
    """Check one input against its parameter; make it a C-contiguous array of the exact dtype."""
    shape = param.shape
    if shape.is_tuple:
        if not isinstance(value, (tuple, list)) or len(value) != len(shape.tuple_shapes):
            raise ExecutionError(f"input {param.number} (%{param.name}) must be a {len(shape.tuple_shapes)}-tuple "
                                 f"for {shape.to_text(layout=False)}")
        return tuple(_coerce(v, Parameter(param.number, f"{param.name}{{{i}}}", s))
                     for i, (v, s) in enumerate(zip(value, shape.tuple_shapes)))
    if shape.element_type.numpy is None:
        return value
    if not isinstance(value, np.ndarray):
        if isinstance(value, (bool, int, float, complex, np.generic)):
            value = np.asarray(value, dtype=shape.dtype)
        else:
            value = np.asarray(value)
    value = from_npz_void(value, shape.dtype)
    if value.dtype != shape.dtype:
        raise ExecutionError(f"input {param.number} (%{param.name}) has dtype {value.dtype}, expected "
                             f"{shape.dtype} for {shape.to_text(layout=False)}")
    if value.shape != shape.dims:
        raise ExecutionError(f"input {param.number} (%{param.name}) has shape {list(value.shape)}, expected "
                             f"{list(shape.dims)} for {shape.to_text(layout=False)}")
    return value if value.flags.c_contiguous else value.copy(order="C")
