"""When a computation leaves op-by-op running for generated code: the thresholds and work estimates
(`CompilePolicy`, one per prepared module) and the tiers that switch (`TieredKernel`, `TieredLoop`).

The switch happens at a fixed call count or amount of work of each participant (SPMD devices share the plan,
and run it from their own threads), never on a timer, so the k-th run of a module gives the same bits in every
process (the two tiers may differ in the last bits: reduction order, libm vs numpy)."""
from __future__ import annotations

import threading
import warnings

from ..errors import CompileWarning
from ..ir.module import Computation
from ..kernels.cache import compile_elsewhere

# Fusions that write (or reduce) less than this run op by op (see CompilePolicy.declines).
MIN_COMPILED_BYTES = 64 * 1024
# Fusions whose op-by-op run would cost more than compiling them (~0.3 s, ~0.6 s with Numba's first load)
# are compiled before their first call whatever `compile_after` says. Work = elements read and written x
# ops, or the elements all ops write if more (intermediates bigger than the ends), x2 on f16/bf16 (op
# by op, those go through f32 and back); numpy runs ~1 element-op per ns. Measured:
# XLA's layer_norm_1x4096x768_bf16 benchmark (~2^27.5) ran cold in 0.97 s compiled, ~0.1 s op by op.
EAGER_COMPILE_WORK = 1 << 30
# A while loop compiles (kernels/program.py) once its interpreted steps have run this many instructions
# in all (~20-60 ms of dispatch), or LOOP_WORK_PER_LINE per generated line if that is more (Numba takes
# ~7 ms a line: a big body must have shown it runs long) -- mid-loop if need be: the compiled loop
# takes the state as it stands.
LOOP_COMPILE_WORK = 1 << 16
LOOP_WORK_PER_LINE = 250

NOT_COMPILED = "generated code did not compile (CompileWarning)"


class CompilePolicy:
    """Which fusions and while loops compile, and when: the thresholds (read from this module's constants when
    the module is prepared), the work estimates, and the tiers planned so far -- which it switches through
    their own methods when a later one changes their lot (equal fusions weighed together, a loop compiled
    with the loop around it)."""

    def __init__(self, compile_after: int):
        self.compile_after = compile_after      # calls of a fused kernel op by op before it compiles (0: at once)
        self.min_compiled_bytes = MIN_COMPILED_BYTES
        self.eager_compile_work = EAGER_COMPILE_WORK
        self.loop_compile_work = LOOP_COMPILE_WORK
        self.loop_work_per_line = LOOP_WORK_PER_LINE
        # kernel source hash -> op-by-op work of the fusions sharing it, and their tiers (one compile serves all)
        self._kernel_work: dict[str, int] = {}
        self._kernel_tiers: dict[str, list[TieredKernel]] = {}
        # while instruction name -> its tiers (by name: plans inline calls, so one loop may have copies)
        self._loops: dict[str, list[TieredLoop]] = {}

    def declines(self, comp: Computation) -> str | None:
        """Why the fused computation `comp` is not worth compiling, or None. Compiling costs ~0.1-0.3 s per
        distinct fusion on a cold cache, while running a small fusion op by op costs microseconds: only fusions
        whose output or reduced operand has `min_compiled_bytes` pay."""
        # what it touches: its output, and what its reductions read (a dynamic-slice of a big operand reads little)
        touched = [comp.root.shape] + [i.operands[0].shape for i in comp.instructions
                                       if i.opcode in ("reduce", "reduce-window") and i.operands]
        if max(s.nbytes for s in touched) < self.min_compiled_bytes:
            return f"touches < {self.min_compiled_bytes >> 10} KiB: op by op costs less than compiling"
        return None

    def compiles_at_once(self, key: str, comp: Computation) -> bool:
        """Whether the fusion `comp`, whose kernel is `key`, compiles before its first call: always with
        compile_after=0, else when the op-by-op work of the fusions sharing its kernel reaches
        `eager_compile_work` -- then those planned before it compile at their first call too."""
        work = self._kernel_work[key] = self._kernel_work.get(key, 0) + fusion_work(comp)
        if self.compile_after != 0 and work < self.eager_compile_work:
            return False
        for tier in self._kernel_tiers.pop(key, ()):
            tier.compile_now()
        return True

    def planned_kernel(self, key: str, tier: TieredKernel) -> None:
        """Note a fusion's tier that waits for `compile_after` calls: a later equal fusion may hurry it."""
        self._kernel_tiers.setdefault(key, []).append(tier)

    def loop_compile_threshold(self, kernel) -> int:
        """Instructions a while loop's interpreted steps run before its compiled `kernel` takes over."""
        if self.compile_after == 0:
            return 0
        return max(self.loop_compile_work, self.loop_work_per_line * kernel.lines)

    def planned_loop(self, inst, loop: TieredLoop) -> None:
        """Note the while loop `inst`'s tier; the loops nested in it compile with it, never on their own."""
        for nested in _nested_whiles(inst):
            for inner in self._loops.pop(nested.name, ()):
                inner.give_up()
        self._loops.setdefault(inst.name, []).append(loop)


def fusion_work(comp: Computation) -> int:
    """The op-by-op work of one call of the fused computation `comp` (see EAGER_COMPILE_WORK)."""
    ends = [p.shape for p in (comp.root, *comp.parameters)]
    ops = [i for i in comp.instructions if i.opcode not in ("parameter", "constant")]
    half = any(not i.shape.is_tuple and i.shape.element_type.is_half_float for i in ops)
    # op by op, every op writes its whole value: a dynamic-slice of a big broadcast computes it all
    written = sum(i.shape.leaf_elements() for i in ops)
    return max(sum(s.leaf_elements() for s in ends) * len(ops), written) * (2 if half else 1)


def loop_step_work(inst) -> int:
    """Instructions one interpreted step of the while loop `inst` runs (condition and body)."""
    return _dispatches(inst.called["condition"]) + _dispatches(inst.called["body"])


class TieredKernel:
    """A fused computation run op by op for its first `after` calls, then as its compiled kernel.

    Most runs are one-shot (validate a dump, a test's reference run): there, ~0.1-0.3 s of Numba compile
    per kernel costs more than running the fusion op by op. A module run again compiles what it runs: at
    the first call past `after`, or before (compile_due). Calls are counted per participant.
    """
    __slots__ = ("interpret", "kernel", "compiled", "after", "calls", "participant", "observer", "failed", "lock")

    def __init__(self, interpret, kernel, after: int, participant, observer, failed=None):
        self.interpret, self.kernel, self.after, self.participant = interpret, kernel, after, participant
        self.observer, self.failed = observer, failed
        self.compiled, self.calls, self.lock = None, {}, threading.Lock()

    def compile_now(self) -> None:
        """Compile at the next call, however few calls ran op by op."""
        self.after = 0

    def compile(self) -> None:
        """Compile the kernel (once; if it does not compile, the fusion runs op by op from now on)."""
        if self.compiled is None:
            with self.lock:
                if self.compiled is None:
                    self.compiled = compiled_or(self.kernel, self.interpret, self.failed)

    def __call__(self, *operands):
        if self.observer() is not None:     # an observed run sees every value: op by op, not counted
            return self.interpret(*operands)
        who = self.participant()
        n = self.calls.get(who, 0)
        if n < self.after:
            self.calls[who] = n + 1
            return self.interpret(*operands)
        if self.compiled is None:           # the first compiled call compiles (or falls back to op by op)
            self.compile()
        return self.compiled(*operands)


class TieredLoop:
    """A while loop interpreted step by step until it has run `compile_work` instructions, then as one compiled
    function (the rest of that run and every later one). Counted per participant, never timed: the same run
    switches at the same step in every process. `compile_work` 0: compile at the first call (a loop nested in
    a compiled loop is never called, so never compiled on its own)."""
    __slots__ = ("cond", "body", "kernel", "compiled", "work", "step_work", "compile_work", "participant",
                 "observer", "failed", "lock")

    def __init__(self, cond, body, kernel, step_work: int, compile_work: int, participant, observer, failed=None):
        self.cond, self.body, self.kernel, self.step_work = cond, body, kernel, step_work
        self.compiled, self.work, self.participant, self.lock = None, {}, participant, threading.Lock()
        self.observer, self.failed = observer, failed
        self.compile_work = compile_work

    def give_up(self) -> None:
        """Never compile on its own (the loop around it compiles it): interpreted whenever it runs."""
        self.kernel, self.compile_work = None, float("inf")

    def _compiled(self):
        """The compiled loop (compiling it on first use), or None if it does not compile."""
        if self.kernel is not None:
            with self.lock:
                if self.kernel is not None:
                    self.compiled = compiled_or(self.kernel, None, self.failed)
                    self.kernel = None
                    if self.compiled is None:
                        self.compile_work = float("inf")
        return self.compiled

    def __call__(self, state):
        if self.observer() is not None:     # an observed run sees every step's values: interpreted, not counted
            while bool(self.cond(state)):
                state = self.body(state)
            return state
        who = self.participant()
        work = self.work.get(who, 0)
        if work >= self.compile_work:
            compiled = self._compiled()
            if compiled is not None:
                return compiled(state)
        cond, body = self.cond, self.body
        while bool(cond(state)):
            state = body(state)
            work += self.step_work
            if work >= self.compile_work:
                self.work[who] = work
                compiled = self._compiled()
                if compiled is not None:
                    return compiled(state)
        self.work[who] = work
        return state


def compile_due(tiers: list[TieredKernel], who) -> list[TieredKernel]:
    """Compile now those of `tiers` that compile at participant `who`'s next call, and return those not compiled
    yet. All are handed to worker processes first (cache.compile_elsewhere), so that they compile side by side;
    each is then compiled here in order -- or, once a worker has compiled it, loaded from the disk cache."""
    due = [t for t in tiers if t.compiled is None and t.calls.get(who, 0) >= t.after]
    if due:
        compile_elsewhere(t.kernel.compile_task for t in due)
        for tier in due:
            tier.compile()
    return [t for t in tiers if t.compiled is None]


def compiled_or(kernel, fallback, failed=None):
    """`kernel` compiled, or `fallback` (op by op) with a CompileWarning -- and `failed()` called, to count it --
    if the generated code does not compile: a generator bug must cost speed, not the run."""
    try:
        return kernel.compile()
    except Exception as e:  # Numba's errors have no common base worth naming
        warnings.warn(f"generated kernel {kernel.key} did not compile, it runs op by op: {type(e).__name__}: "
                      f"{str(e)[:500]}\n{kernel.source}", CompileWarning, stacklevel=2)
        if failed is not None:
            failed()
        return fallback


def _nested_whiles(inst) -> list:
    """The while instructions inside the computations `inst` calls, at any depth."""
    found = []
    for c in inst.called.values():
        for comp in (c if isinstance(c, list) else [c]):
            for i in comp.instructions:
                found += ([i] if i.opcode == "while" else []) + _nested_whiles(i)
    return found


def _dispatches(comp: Computation) -> int:
    """Instructions a run of `comp` interprets, those of the computations it calls included (a loop
    inside counted once)."""
    return sum(1 + sum(_dispatches(c) for key, c in inst.called.items() if key in ("to_apply", "calls", "body"))
               for inst in comp.instructions if inst.opcode != "parameter")
