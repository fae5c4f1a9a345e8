"""The ops' context: what `prepare(inst, ctx)` functions see (hloexec.ops.registry.Context) -- the runners of the
computations an instruction calls, the compiled tiers (asked of exec/tiering.py's policy), the device a thread
runs as, and the observer of an observed run."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cached_property, partial

from ..errors import OptionError
from ..ir.module import Computation, Module
from ..options import Options
from .tier_report import TierReport
from .tiering import (
    COMPILE_MODES,
    NEVER_COMPILED,
    NOT_COMPILED,
    BackgroundCompiler,
    CompilePolicy,
    TieredKernel,
    TieredLoop,
    fusion_work,
    loop_step_work,
)


@dataclass
class Device:
    """The participant a run plays: its ids, and how its collectives reach the others."""

    replica_id: int = 0
    partition_id: int = 0
    num_replicas: int = 1
    num_partitions: int = 1
    communicator: object = None  # see hloexec.exec.communicators

    @property
    def global_id(self) -> int:
        """XLA's flattened id: replica_id * num_partitions + partition_id."""
        return self.replica_id * self.num_partitions + self.partition_id


class ExecContext:
    """What ops see while they are prepared (hloexec.ops.registry.Context), and what the runners and tiers built
    for them ask at run time (the calling thread's device and observer)."""

    def __init__(
        self,
        module: Module,
        device: Device,
        plans,
        options: Options | None = None,
        *,
        use_numba: bool = True,
        compile_after: int = 1,
        compile: str = "background",
        fuse_chains: bool = True,
    ):
        self.module = module
        self.plans = plans  # the module's PlanCache (exec/executor.py): one plan per computation
        self.default_device = device
        self.options = options or Options()  # how the module computes: read where a rule is used
        self.use_numba = use_numba
        self.fuse_chains = fuse_chains  # group unfused producer/consumer chains into kernels (exec/fuse.py)
        if compile not in COMPILE_MODES:
            raise OptionError("compile", compile, COMPILE_MODES)
        self.compile = compile  # who waits for the compiler (exec/tiering.py)
        # which fusions and loops compile, and when
        self.policy = CompilePolicy(compile_after, BackgroundCompiler() if compile == "background" else None)
        self._participant = threading.local()
        self.tier_report = TierReport()  # which fusions and loops compiled, why the others run op by op

    @property
    def compile_after(self) -> int:
        return self.policy.compile_after

    @property
    def device(self) -> Device:
        """The device of the calling thread: SPMD participants share one prepared plan (hloexec.spmd)."""
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

    def computation(self, comp: Computation, fuse: bool = True):
        """The Runner of `comp`'s plan (exec/runner.py), prepared once; `fuse`: group its unfused producer/consumer
        chains (exec/fuse.py)."""
        return self.plans.runner(comp, fuse and self.use_numba and self.fuse_chains, self)

    def fused_kernel(self, comp: Computation):
        """A kernel running the fused computation `comp` as one compiled loop nest, or None to run it op by op:
        `self.policy` (exec/tiering.py) says whether it is worth compiling and when; a TieredKernel switches."""
        if not self.use_numba:
            return None
        if self.compile == "never":
            self.tier_report.record("fusion", comp.name, NEVER_COMPILED)
            return None
        policy = self.policy
        reason = policy.declines(comp)
        if reason is not None:
            self.tier_report.record("fusion", comp.name, reason)
            return None
        from ..kernels.fusion import compile_fusion

        kernel = self.tier_report.generate("fusion", comp.name, lambda: compile_fusion(comp, self.options, eager=False))
        if kernel is None:
            return None
        failed = partial(self.tier_report.record, "fusion", comp.name, NOT_COMPILED)
        tiered = partial(
            TieredKernel,
            kernel=kernel,
            participant=self.participant,
            observer=partial(self.observer, comp),
            failed=failed,
            background=policy.background,
            name=comp.name,
            work=fusion_work(comp),
        )
        if policy.compiles_at_once(kernel.key, comp):
            # compiled before its first call: in the entry, with the others once the module is prepared
            # (Executable, tiering.compile_due; in the background: all of them); op by op only in observed runs,
            # until a background compile is done, or if it does not compile: its plan is made then
            return tiered(lambda *operands: self.computation(comp, fuse=False)(*operands), after=0)
        tier = tiered(self.computation(comp, fuse=False), after=policy.compile_after)
        policy.planned_kernel(kernel.key, tier)
        return tier

    def compiled_loop(self, inst):
        """The while loop `inst` as a TieredLoop, or None where it cannot compile (it runs interpreted).

        The loops nested in a loop that compiles are compiled with it, never on their own: they run
        interpreted until it switches."""
        cond = self.computation(inst.called["condition"])
        body = self.computation(inst.called["body"])  # prepares the nested loops first
        if not self.use_numba:
            return None
        if self.compile == "never":
            self.tier_report.record("loop", inst.name, NEVER_COMPILED)
            return None
        from ..kernels.program import compile_program

        kernel = self.tier_report.generate("loop", inst.name, lambda: compile_program(inst, self.options))
        if kernel is None:
            return None
        loop = TieredLoop(
            cond,
            body,
            kernel,
            loop_step_work(inst),
            self.policy.loop_compile_threshold(kernel),
            self.participant,
            partial(self.observer, inst.called["body"]),
            partial(self.tier_report.record, "loop", inst.name, NOT_COMPILED),
            self.policy.background,
            inst.name,
        )
        self.policy.planned_loop(inst, loop)
        return loop


# (opcode, called-computation key) of the calls whose computation runs once per call, not per element
_WHOLE_CALLS = frozenset(
    {
        ("call", "to_apply"),
        ("fusion", "calls"),
        ("while", "condition"),
        ("while", "body"),
        ("conditional", "branch_computations"),
        ("conditional", "true_computation"),
        ("conditional", "false_computation"),
        ("async-start", "calls"),
        ("async-start", "called_computations"),
        ("custom-call", "called_computations"),
    }
)


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
                    for c in called if isinstance(called, list) else [called]:
                        add(c)
    return frozenset(applied)
