"""When a computation leaves op-by-op running for generated code: the thresholds and work estimates
(`CompilePolicy`, one per prepared module), the tiers that switch (`TieredKernel`, `TieredLoop`) and the
thread compiling them in the background (`BackgroundCompiler`).

A module's compile mode (COMPILE_MODES) says who waits for the compiler:

* "background" (the default): no run waits. A tier due to compile (by the thresholds below) is handed to the
  BackgroundCompiler, and runs op by op (a loop interpreted) until its kernel is there; a run uses every kernel
  ready when it reaches it (a loop switches mid-loop). Which runs see which kernels depends on timing: where the
  two tiers differ in the last bits (reduction order, libm vs numpy), so may two runs.
* "eager": the switch happens at a fixed call count or amount of work of each participant (SPMD devices share
  the plan, and run it from their own threads), never on a timer, and the call that is due waits for the
  compile: the k-th run of a module gives the same bits in every process. With compile_after=0, the first run
  waits for every kernel (for benchmarks).
* "never": op by op and interpreted loops always, the computations grouped as for the compiled tiers."""

from __future__ import annotations

import sys
import threading
import time
import warnings
from collections import defaultdict, deque
from dataclasses import dataclass

from ..errors import CompileWarning
from ..ir.module import Computation
from ..kernels.cache import cache_dir, compile_elsewhere, pinned_cache_dir
from ..kernels.workers import await_compiled

COMPILE_MODES = ("background", "eager", "never")

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
NEVER_COMPILED = "compile='never'"
# an eager compile taking longer than this shows a progress bar (on a terminal)
PROGRESS_AFTER_SECONDS = 1.0


class CompilePolicy:
    """Which fusions and while loops compile, and when: the thresholds (read from this module's constants when
    the module is prepared), the work estimates, and the tiers planned so far -- which it switches through
    their own methods when a later one changes their lot (equal fusions weighed together, a loop compiled
    with the loop around it)."""

    def __init__(self, compile_after: int, background: BackgroundCompiler | None = None):
        self.compile_after = compile_after  # calls of a fused kernel op by op before it compiles (0: at once)
        self.background = background  # None: a due call compiles (waits), see the module's doc
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
        touched = [comp.root.shape] + [
            i.operands[0].shape for i in comp.instructions if i.opcode in ("reduce", "reduce-window") and i.operands
        ]
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

    def loops_due(self, who) -> list[TieredLoop]:
        """The loops' tiers that compile at participant `who`'s next call (None: all that may compile), not
        compiled yet."""
        return [
            loop
            for loops in self._loops.values()
            for loop in loops
            if loop.due(who) or who is None and loop.kernel is not None
        ]

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
    the first call past `after`, or before (compile_due). Calls are counted per participant. With a
    `background` compiler, the call past `after` hands it over and runs op by op until the kernel is there.
    """

    __slots__ = (
        "interpret",
        "kernel",
        "compiled",
        "after",
        "calls",
        "participant",
        "observer",
        "failed",
        "lock",
        "background",
        "queued",
        "name",
        "work",
    )

    def __init__(
        self,
        interpret,
        kernel,
        after: int,
        participant,
        observer,
        failed=None,
        background=None,
        name: str = "",
        work: int = 0,
    ):
        self.interpret, self.kernel, self.after, self.participant = interpret, kernel, after, participant
        self.observer, self.failed, self.background = observer, failed, background
        self.name, self.work = name, work  # (for the background compiler: what to say, what first)
        self.calls: dict = {}  # participant -> calls so far
        self.compiled, self.lock, self.queued = None, threading.Lock(), False

    def compile_now(self) -> None:
        """Compile at the next call, however few calls ran op by op."""
        self.after = 0

    def compile(self, report=None) -> bool:
        """Compile the kernel (once; if it does not compile, the fusion runs op by op from now on, and
        `report(message)` says why, default a CompileWarning). True if it compiled."""
        if self.compiled is None:
            with self.lock:
                if self.compiled is None:
                    self.compiled = compiled_or(self.kernel, self.interpret, self.failed, report)
        return self.compiled is not self.interpret

    def due(self, who) -> bool:
        """Whether participant `who`'s next call would run the compiled kernel (compile_due)."""
        return self.compiled is None and self.calls.get(who, 0) >= self.after

    def __call__(self, *operands):
        if self.observer() is not None:  # an observed run sees every value: op by op, not counted
            return self.interpret(*operands)
        if self.background is not None:  # whatever is ready: no call waits for the compiler
            compiled = self.compiled
            if compiled is not None:
                return compiled(*operands)
            who = self.participant()
            n = self.calls.get(who, 0)
            if n < self.after:
                self.calls[who] = n + 1
            elif not self.queued:
                self.background.request([self])
            return self.interpret(*operands)
        who = self.participant()
        n = self.calls.get(who, 0)
        if n < self.after:
            self.calls[who] = n + 1
            return self.interpret(*operands)
        if self.compiled is None:  # the first compiled call compiles (or falls back to op by op)
            self.compile()
        return self.compiled(*operands)


class TieredLoop:
    """A while loop interpreted step by step until it has run `compile_work` instructions, then as one compiled
    function (the rest of that run and every later one). Counted per participant, never timed: the same run
    switches at the same step in every process. `compile_work` 0: compile at the first call (a loop nested in
    a compiled loop is never called, so never compiled on its own). With a `background` compiler, the step that
    reaches `compile_work` hands it over, and the loop goes on interpreted until its compiled function is there
    (then at the next step, mid-loop)."""

    __slots__ = (
        "cond",
        "body",
        "kernel",
        "compiled",
        "work",
        "step_work",
        "compile_work",
        "participant",
        "observer",
        "failed",
        "lock",
        "background",
        "queued",
        "name",
    )

    def __init__(
        self,
        cond,
        body,
        kernel,
        step_work: int,
        compile_work: float,
        participant,
        observer,
        failed=None,
        background=None,
        name: str = "",
    ):
        self.cond, self.body, self.kernel, self.step_work = cond, body, kernel, step_work
        self.work: dict = {}  # participant -> work done so far
        self.compiled, self.participant, self.lock = None, participant, threading.Lock()
        self.observer, self.failed, self.background, self.name = observer, failed, background, name
        self.compile_work, self.queued = compile_work, False

    def give_up(self) -> None:
        """Never compile on its own (the loop around it compiles it): interpreted whenever it runs."""
        self.kernel, self.compile_work = None, float("inf")

    def due(self, who) -> bool:
        """Whether participant `who`'s next call would run the compiled loop, not compiled yet."""
        return self.kernel is not None and self.work.get(who, 0) >= self.compile_work

    def compile(self, report=None) -> bool:
        """Compile the loop (once; if it does not compile, it stays interpreted, and `report(message)` says why,
        default a CompileWarning). True if it compiled."""
        if self.kernel is not None:
            with self.lock:
                if self.kernel is not None:
                    compiled = compiled_or(self.kernel, None, self.failed, report)
                    if compiled is None:
                        self.compile_work = float("inf")
                    self.compiled, self.kernel = compiled, None
        return self.compiled is not None

    def _compiled(self):
        """The compiled loop, or None: not there yet (background: asked for) or it does not compile."""
        if self.background is None:
            self.compile()
        elif self.compiled is None and not self.queued and self.kernel is not None:
            self.background.request([self])
        return self.compiled

    def __call__(self, state):
        if self.observer() is not None:  # an observed run sees every step's values: interpreted, not counted
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
                compiled = self.compiled if self.queued else self._compiled()
                if compiled is not None:
                    return compiled(state)
        self.work[who] = work
        return state


@dataclass(frozen=True)
class CompileEvent:
    """A kernel the background compiler made ready: its tier ("fusion", "loop"), computation or instruction
    name, when it was asked for and ready (seconds since the compiler started) and whether it compiled."""

    tier: str
    name: str
    requested: float
    ready: float
    compiled: bool


class BackgroundCompiler:
    """Compiles the tiers handed to it while the module's runs go on (the "background" compile mode): their
    kernels go to worker processes (kernels/workers.py, most work first), and a thread of this process loads each
    from the disk cache once compiled and swaps it into its tier -- or compiles it itself if no worker can.
    `events` says what compiled when (`hloexec run --profile`). A kernel that does not compile is said as a
    CompileWarning on the thread of the next `say_failures` (a run, wait_compiled), not on the compiling one."""

    def __init__(self):
        self.cond = threading.Condition()
        self.queue: deque = deque()  # (tier, requested at, cache dir): not taken by the thread yet
        self.pending = 0  # requested, not ready yet
        self.thread: threading.Thread | None = None
        self.started = time.perf_counter()
        self.events: list[CompileEvent] = []
        self.failures: list[str] = []

    def request(self, tiers) -> None:
        """Compile `tiers` (those not asked for already), the most work per compile first (_compile_queued)."""
        with self.cond:
            tiers = [t for t in tiers if not t.queued]
            for t in tiers:
                t.queued = True
        if not tiers:
            return
        now, directory = time.perf_counter() - self.started, cache_dir()
        with self.cond:
            self.queue.extend((t, now, directory) for t in tiers)
            self.pending += len(tiers)
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._compile_queued, name="hloexec-background-compile", daemon=True
                )
                self.thread.start()

    def _compile_queued(self) -> None:
        """Take what is queued: every kernel goes to the worker processes (the direct compiler's too: compiled here,
        its Python translation would hold the GIL the runs need -- measured, op-by-op runs 4-5x slower), then this
        thread swaps each in as its worker is done; repeat. Both in one order: the most op-by-op work per line
        to compile first, tiers sharing a kernel (structurally equal fusions: one compile) weighed together and
        swapped in together."""
        while True:
            with self.cond:
                if not self.queue:
                    self.thread = None
                    return
                batch = list(self.queue)
                self.queue.clear()
            shared: dict = defaultdict(float)  # kernel key -> the priority of the tiers sharing it
            for tier, *_ in batch:
                shared[_kernel_key(tier)] += _priority(tier)
            batch.sort(key=lambda item: -shared[_kernel_key(item[0])])
            for directory in {d for *_, d in batch}:
                with pinned_cache_dir(directory):  # workers take the last submitted first: the most work first
                    compile_elsewhere(
                        [
                            t.kernel.compile_task
                            for t, _, d in reversed(batch)
                            if d == directory and t.kernel is not None
                        ],
                        background=True,
                    )
            for item in batch:
                self._compile(*item)

    def _compile(self, tier, requested: float, directory) -> None:
        kernel = tier.kernel
        try:
            if kernel is not None:
                await_compiled(kernel.key)
            with pinned_cache_dir(directory):
                compiled = tier.compile(self.failures.append)
        except Exception as e:  # noqa: BLE001 - a bug here must cost that tier's speed, not hang wait()
            self.failures.append(
                f"the background compile of %{tier.name} failed ({type(e).__name__}: {e}): a bug; it runs op by op"
            )
            compiled = False
        with self.cond:
            self.events.append(
                CompileEvent(
                    "fusion" if isinstance(tier, TieredKernel) else "loop",
                    tier.name,
                    requested,
                    time.perf_counter() - self.started,
                    compiled,
                )
            )
            self.pending -= 1
            self.cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every tier asked for is ready (compiled, or op by op for good); False if `timeout`
        seconds passed first."""
        with self.cond:
            return self.cond.wait_for(lambda: self.pending == 0, timeout)

    def report(self) -> dict:
        """{"pending": kernels asked for and not ready, "events": [{tier, name, requested, ready, compiled}]}."""
        with self.cond:
            return {"pending": self.pending, "events": [vars(e) for e in self.events]}

    def say_failures(self) -> None:
        """Warn (CompileWarning) of the kernels found not to compile since the last call."""
        with self.cond:
            failures, self.failures = self.failures, []
        for message in failures:
            warnings.warn(message, CompileWarning, stacklevel=3)


def format_compile_report(report: dict, shown: int = 10) -> list[str]:
    """Lines for a terminal of Executable.compile_report(): what compiled when (the first and last `shown` // 2
    kernels when there are more)."""
    if report["mode"] != "background":
        return [
            f"compile={report['mode']!r}: "
            + (
                "every kernel due compiled before the call that needed it"
                if report["mode"] == "eager"
                else "nothing compiles"
            )
        ]
    events = report["events"]
    failed = sum(not e["compiled"] for e in events)
    lines = [
        f"compiled in the background: {len(events)} kernels ready"
        + (f" ({failed} did not compile: op by op)" if failed else "")
        + f", {report['pending']} still compiling"
        + ("" if events or report["pending"] else " (a fusion is handed over at its second call)")
    ]
    picked = events if len(events) <= shown else events[: shown // 2] + [None] + events[-(shown // 2) :]
    for e in picked:
        lines.append(
            "  ..."
            if e is None
            else f"  ready at {e['ready']:8.2f} s  {e['tier']} %{e['name']}  (asked for at {e['requested']:.2f} s"
            + ("" if e["compiled"] else ", did not compile")
            + ")"
        )
    return lines


def _work(tier) -> int:
    return tier.work if isinstance(tier, TieredKernel) else tier.step_work


def _priority(tier) -> float:
    """What compiling `tier` early is worth: its op-by-op work per line of its kernel (compile time goes by the
    lines: kernels/direct.py's ~2.7 ms a line)."""
    return _work(tier) / max(tier.kernel.lines if tier.kernel is not None else 1, 1)


def _kernel_key(tier):
    return tier.kernel.key if tier.kernel is not None else id(tier)


def compile_due(tiers: list[TieredKernel], who) -> list[TieredKernel]:
    """Compile now those of `tiers` that compile at participant `who`'s next call, and return those not compiled
    yet. All are handed to worker processes first (cache.compile_elsewhere), so that they compile side by side;
    each is then compiled here in order -- or, once a worker has compiled it, loaded from the disk cache. A
    compile taking over PROGRESS_AFTER_SECONDS shows a progress bar on a terminal (stderr)."""
    due = [t for t in tiers if t.due(who)]
    if due:
        compile_elsewhere(t.kernel.compile_task for t in due)
        bar = _ProgressBar(len(due))
        for done, tier in enumerate(due, 1):
            tier.compile()
            bar(done)
        bar.close()
    return [t for t in tiers if t.compiled is None]


class _ProgressBar:
    """`kernels compiled: [#####     ] 12/40` on stderr, if it is a terminal and the compile takes a while."""

    def __init__(self, total: int):
        self.total, self.start, self.shown = total, time.perf_counter(), False
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int) -> None:
        if not self.tty or time.perf_counter() - self.start < PROGRESS_AFTER_SECONDS:
            return
        filled = 30 * done // self.total
        sys.stderr.write(f"\rkernels compiled: [{'#' * filled}{' ' * (30 - filled)}] {done}/{self.total}")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


def compiled_or(kernel, fallback, failed=None, report=None):
    """`kernel` compiled, or `fallback` (op by op) if the generated code does not compile -- said by
    `report(message)` (default: a CompileWarning) and `failed()` called, to count it: a generator bug must cost
    speed, not the run."""
    try:
        return kernel.compile()
    except Exception as e:  # Numba's errors have no common base worth naming
        message = (
            f"generated kernel {kernel.key} did not compile, it runs op by op: {type(e).__name__}: "
            f"{str(e)[:500]}\n{kernel.source}"
        )
        if report is None:
            warnings.warn(message, CompileWarning, stacklevel=3)
        else:
            report(message)
        if failed is not None:
            failed()
        return fallback


def _nested_whiles(inst) -> list:
    """The while instructions inside the computations `inst` calls, at any depth."""
    found = []
    for c in inst.called.values():
        for comp in c if isinstance(c, list) else [c]:
            for i in comp.instructions:
                found += ([i] if i.opcode == "while" else []) + _nested_whiles(i)
    return found


def _dispatches(comp: Computation) -> int:
    """Instructions a run of `comp` interprets, those of the computations it calls included (a loop
    inside counted once)."""
    return sum(
        1
        + sum(_dispatches(inst.called_computation(key)) for key in ("to_apply", "calls", "body") if key in inst.called)
        for inst in comp.instructions
        if inst.opcode != "parameter"
    )
