"""A module prepared and run: `Executable`, what `hloexec.load` returns -- its plans (one per computation, in a
`PlanCache`), inputs and memory checked before a run, the entry's runner called."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..errors import ElidedConstantWarning, ExecutionError, MemoryLimitError, elided_constants_note
from ..ir.compiled_for import auto_device
from ..ir.module import Computation, Module
from ..ir.shape import Shape
from ..kernels.heap import keep_freed_memory
from ..options import Options, available_memory
from ..ops.manual import has_manual_regions
from .communicators import MirrorCommunicator
from .context import Device, ExecContext
from .inputs import from_npz_void, random_inputs
from .plan import Plan
from .runner import Runner
from .tiering import CompileEvent, TieredKernel, compile_due


class SpmdLayer(Protocol):
    """What exec/ asks of the SPMD layer above it (hloexec.spmd): running every participant of a module, as
    `run_spmd(exe, per_device_inputs, partitions=, replicas=, **options)` and `run_with_manual_regions(exe, args)`."""

    run_spmd: Callable[..., Any]
    run_with_manual_regions: Callable[..., Any]


# Set by hloexec.spmd when it is imported (hloexec.load and the tools making an Executable import it, as they import
# hloexec.ops to fill the op registry): exec/ runs one participant and never imports the layer above it.
spmd_layer: SpmdLayer | None = None


def use_spmd_layer(layer: SpmdLayer) -> None:
    """What hloexec.spmd calls when imported (a function imported from this module, not an attribute set on it: the
    import finds this module in sys.modules, where a package attribute may still name an older copy)."""
    global spmd_layer
    spmd_layer = layer


def _spmd() -> SpmdLayer:
    if spmd_layer is None:
        raise ExecutionError(
            "running every participant of a module needs the SPMD layer: import hloexec.spmd (hloexec.load does)"
        )
    return spmd_layer


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

    def __init__(
        self,
        module: Module,
        *,
        options: Options | None = None,
        device=None,
        use_numba: bool = True,
        compile: str = "background",
        compile_after: int | None = None,
        participant: Device | None = None,
        compile_kernels: bool = True,
        fuse_chains: bool = True,
        **rules,
    ):
        """`options` (hloexec.options.Options) or `device` (a profile, its name or file) and any of Options'
        rules by keyword (`reductions`, `excess_precision`, `max_memory`) override the options' or the device's
        own. `participant`: the SPMD participant this executable plays (default: device 0 of the module's).
        `compile`: "background" (no run waits for the compiler: fusions run op by op and loops interpreted until
        their kernels, compiled meanwhile, are there), "eager" (a call that is due compiles, and waits: with
        compile_after=0 the first run waits for every kernel) or "never" (op by op always); see
        exec/tiering.py. `compile_after`: calls of a fusion op by op before it is due to compile (default: 1 in
        the background, so that a one-shot run compiles nothing, 0 eager). `fuse_chains=False`: the unfused
        chains stay op by op (exec/fuse.py groups none), so an observed run sees each of their instructions."""
        keep_freed_memory()  # warm runs reuse the last run's freed pages (kernels/heap.py)
        self.module = module
        for computation in module.computations:
            computation.check_parameter_numbers()
        elided = module.elided_constants()
        if elided:
            warnings.warn(elided_constants_note(module, elided), ElidedConstantWarning, stacklevel=3)
        if participant is None:
            participant = Device(num_replicas=module.replica_count, num_partitions=module.num_partitions)
            participant.communicator = MirrorCommunicator(participant)
        self.participant = participant
        if device == "auto":  # the profile of what the dump was compiled for (ir/compiled_for.py)
            device = auto_device(module)[0]
        self.options = Options.of(options, device, **rules)
        self.plans = PlanCache()
        if compile_after is None:
            compile_after = 0 if compile == "eager" else 1
        self.context = ExecContext(
            module,
            participant,
            self.plans,
            self.options,
            use_numba=use_numba,
            compile_after=compile_after,
            compile=compile,
            fuse_chains=fuse_chains,
        )
        self.runner = self.context.computation(module.entry)
        self.plan = self.runner.plan
        # the entry's fused tiers not compiled yet: those due compile together (side by side) before a run, not
        # one by one at their calls; those in loops and branches compile at their first compiled call (a loop
        # compiled whole never calls them)
        self._uncompiled = [s.kernel for s in self.plan.steps if isinstance(s.kernel, TieredKernel)]
        # False: kernels that would compile now compile before the first run instead (the plan and its memory
        # model are the same; reports that never run the module do not wait for Numba)
        if compile_kernels:
            self._compile_due()
        self.plan.memory.recycle_outputs()  # a run reuses the outputs of the last one that the caller dropped
        self._parameters = self.parameters  # built once: run() checks every input against it
        self.manual_regions = has_manual_regions(module)  # pre-partition: every device must run (spmd/manual.py)
        self._peak_bytes: int | None = None

    @property
    def max_memory(self) -> int | None:
        """Bytes a run may use; None: MemAvailable at each run."""
        return self.options.max_memory

    @property
    def parameters(self) -> list[Parameter]:
        return [Parameter(p.parameter_number, p.name, p.shape) for p in self.module.entry.parameters]

    @property
    def result_shape(self) -> Shape:
        return self.module.entry.root.shape

    def run(
        self, *args, progress=None, profile=None, observe=None, observe_operands: bool = False, observe_inside=None
    ):
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
        if (
            self.manual_regions and self.context.device is self.participant
        ):  # every device must run; this thread plays none
            if progress is not None or profile is not None or observe is not None:
                raise ExecutionError(
                    f"{self.module.name} has manual regions, which run as one participant per "
                    "device: progress, profile and observe follow one participant only"
                )
            return _spmd().run_with_manual_regions(self, args)
        params = self._parameters
        if len(args) != len(params):
            raise ExecutionError(
                f"{self.module.name} takes {len(params)} inputs, got {len(args)}:\n  " + "\n  ".join(map(str, params))
            )
        self.check_memory()
        inputs = [_coerce(arg, p) for arg, p in zip(args, params)]
        previous = (
            None
            if observe is None
            else self.context.observe(
                observe if observe_operands else lambda inst, value, operands: observe(inst, value), observe_inside
            )
        )
        if observe is None:  # (an observed run runs every fusion op by op)
            self._compile_due()
        try:
            with np.errstate(all="ignore"):  # IEEE overflow / invalid are values in HLO, not warnings
                return self.runner(*inputs, progress=progress, profile=profile)
        finally:
            if previous is not None:
                self.context.observe(*previous)

    __call__ = run

    def _compile_due(self, everything: bool = False) -> None:
        """Compile the kernels due before a run (`everything`: in the background, all of the entry's fusions and
        the loops, due or not): the entry's fusions, and in the background the loops too (handed over, not
        waited for; the fusions in loops and branches are handed over when due at a call), else waited for (the
        loops compile at their first call past their threshold)."""
        who = self.context.participant()
        policy = self.context.policy
        if policy.background is not None:
            self._uncompiled = [t for t in self._uncompiled if t.compiled is None]
            policy.background.request(
                [t for t in self._uncompiled if everything or t.due(who)]
                + policy.loops_due(None if everything else who)
            )
            policy.background.say_failures()
        elif self._uncompiled:
            self._uncompiled = compile_due(self._uncompiled, who)

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Compile now, in the background, the entry's fusions and the loops that may compile (due or not), and
        wait until they and every kernel asked for so far are compiled -- or found not to compile:
        CompileWarning -- and swapped in, so that the next run is warm; False if `timeout` seconds passed first
        (the compile goes on). In the "eager" mode, compiles the entry's fusions due now; in the "never" mode,
        nothing to wait for."""
        self._compile_due(everything=True)
        background = self.context.policy.background
        if background is None:
            return True
        done = background.wait(timeout)
        background.say_failures()
        return done

    @property
    def compile_events(self) -> list[CompileEvent]:
        """What the background compiler made ready so far, and when (empty unless compile="background")."""
        background = self.context.policy.background
        return [] if background is None else list(background.events)

    def compile_report(self) -> dict:
        """{"mode": the compile mode, and in the background "pending" (kernels not ready yet) and "events" (what
        was made ready when, seconds since the module was prepared)}: `hloexec run --profile`."""
        background = self.context.policy.background
        return {"mode": self.context.compile, **(background.report() if background is not None else {})}

    def random_inputs(self, seed: int = 0) -> list:
        return random_inputs(self.module, seed, max_memory=self.max_memory)

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
        """Run every participant of an SPMD module, collectives between them; see hloexec.spmd.run_spmd."""
        return _spmd().run_spmd(self, per_device_inputs, partitions=partitions, replicas=replicas, **options)


def _coerce(value, param: Parameter):
    """Check one input against its parameter; make it a C-contiguous array of the exact dtype."""
    shape = param.shape
    if shape.is_tuple:
        if not isinstance(value, (tuple, list)) or len(value) != len(shape.tuple_shapes):
            raise ExecutionError(
                f"input {param.number} (%{param.name}) must be a {len(shape.tuple_shapes)}-tuple "
                f"for {shape.to_text(layout=False)}"
            )
        return tuple(
            _coerce(v, Parameter(param.number, f"{param.name}{{{i}}}", s))
            for i, (v, s) in enumerate(zip(value, shape.tuple_shapes))
        )
    if shape.element_type.numpy is None:
        return value
    if not isinstance(value, np.ndarray):
        if isinstance(value, (bool, int, float, complex, np.generic)):
            value = np.asarray(value, dtype=shape.dtype)
        else:
            value = np.asarray(value)
    value = from_npz_void(value, shape.dtype)
    if value.dtype != shape.dtype:
        raise ExecutionError(
            f"input {param.number} (%{param.name}) has dtype {value.dtype}, expected "
            f"{shape.dtype} for {shape.to_text(layout=False)}"
        )
    if value.shape != shape.dims:
        raise ExecutionError(
            f"input {param.number} (%{param.name}) has shape {list(value.shape)}, expected "
            f"{list(shape.dims)} for {shape.to_text(layout=False)}"
        )
    return value if value.flags.c_contiguous else value.copy(order="C")
