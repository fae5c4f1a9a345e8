"""A module prepared and run: `Executable`, what `hloexec.load` returns -- its plans (one per computation, in a
`PlanCache`), inputs and memory checked before a run, the entry's runner called."""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..errors import ElidedConstantWarning, ExecutionError, MemoryLimitError, elided_constants_note
from ..ir.module import Computation, Module
from ..ir.shape import Shape
from ..kernels.heap import keep_freed_memory
from .context import Device, ExecContext
from .inputs import from_npz_void
from .plan import Plan
from .runner import Runner
from .tiering import TieredKernel, compile_due


class PlanCache:
    """The plans of one module's computations, each prepared once (per fuse flag), with their runners; iterating
    gives the plans."""

    def __init__(self):
        self._runners: dict[tuple[int, bool], Runner] = {}

    def runner(self, comp: Computation, fuse: bool, ctx: ExecContext) -> Runner:
        """The runner of `comp`'s plan, preparing it against `ctx` the first time (`fuse`: see Plan)."""
        key = (id(comp), fuse)
        runner = self._runners.get(key)
        if runner is None:
            runner = self._runners[key] = Runner(Plan(comp, ctx, fuse=fuse), ctx)
        return runner

    def __iter__(self) -> Iterator[Plan]:
        return (runner.plan for runner in list(self._runners.values()))


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
        keep_freed_memory()         # warm runs reuse the last run's freed pages (kernels/heap.py)
        self.module = module
        elided = module.elided_constants()
        if elided:
            warnings.warn(elided_constants_note(module, elided), ElidedConstantWarning, stacklevel=3)
        if device is None:
            device = Device(num_replicas=module.replica_count, num_partitions=module.num_partitions)
            device.communicator = MirrorCommunicator(device)
        self.device = device
        self.plans = PlanCache()
        self.context = ExecContext(module, device, self.plans, excess_precision=excess_precision,
                                   use_numba=use_numba, compile_after=compile_after, reductions=reductions)
        self.runner = self.context.computation(module.entry)
        self.plan = self.runner.plan
        # the entry's fused tiers not compiled yet: those due compile together (side by side) before a run, not
        # one by one at their calls; those in loops and branches compile at their first compiled call (a loop
        # compiled whole never calls them)
        self._uncompiled = [s.kernel for s in self.plan.steps if isinstance(s.kernel, TieredKernel)]
        # False: kernels that would compile now compile before the first run instead (the plan and its memory
        # model are the same; reports that never run the module do not wait for Numba)
        if compile_kernels:
            self._uncompiled = compile_due(self._uncompiled, self.context.participant())
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
        if self._uncompiled and observe is None:       # (an observed run runs every fusion op by op)
            self._uncompiled = compile_due(self._uncompiled, self.context.participant())
        try:
            with np.errstate(all="ignore"):     # IEEE overflow / invalid are values in HLO, not warnings
                return self.runner(*inputs, progress=progress, profile=profile)
        finally:
            if previous is not None:
                self.context.observe(*previous)

    __call__ = run

    def random_inputs(self, seed: int = 0) -> list:
        from .inputs import random_inputs
        return random_inputs(self.module, seed, self.max_memory)

    def peak_bytes(self) -> int:
        """Peak live bytes of the entry computation (inputs included), from the schedule, and the values the
        plans of called computations keep after their first run (see Plan.folded)."""
        if self._peak_bytes is None:
            kept = sum(plan.memory.folded_bytes() for plan in self.plans if plan is not self.plan)
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
