"""The program's run beside its shadow (its exact answer): `shadow_run(exe, inputs)` runs a module at its own
precision and its shadow (hloexec/exec/shadow.py) on the same inputs and returns both outputs, with the
instructions whose integer/pred values differ between the two runs (`Divergence`: a compare, a float->int convert,
a sort over float keys... computed from floats that differ). `judge_run` adds the baseline run and judges
candidates (tools/verdict.py).

Everything here runs single-participant or SPMD (`Runner`), and streams: values are looked at while the
plans hold them (Executable.run's `observe`), never kept beyond what the report needs.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import warnings
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from .. import spmd
from ..errors import ElidedConstantWarning
from ..exec.executor import Executable
from ..exec.shadow import Shadow, has_discrete, shadow_module
from ..ir import opcodes
from ..options import Options, available_memory, device_profile
from ..spmd.memory import gb
from .arrays import array_summary, flatten
from .bound_plans import InstructionPlans
from .bound_samples import SAMPLES
from .bound_store import SAMPLE_STORAGE, VIEW_MOVES
from .bounds import ErrorBounds, _float
from .compare import dtype_name
from .verdict import RULE, error_stats, judge

# Bytes of discrete values (relu masks, argmax indices...) kept from the program's run to count how many
# elements the shadow's differ in; beyond it a digest says only whether they differ.
DISCRETE_BUDGET = 256 << 20


def executable_like(exe: Executable, module, **options) -> Executable:
    """An Executable of `module` with `exe`'s options (`options` override them). Elided constants were said when
    `exe` was made: not again for each module derived from its own."""
    ctx = exe.context
    settings: dict = dict(
        options=exe.options,
        use_numba=ctx.use_numba,
        compile_after=ctx.compile_after,
        compile=ctx.compile,
        fuse_chains=ctx.fuse_chains,
    )
    settings.update(options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ElidedConstantWarning)
        return Executable(module, **settings)


class Runner:
    """Runs a module as one participant (`spmd` None) or as all participants of an SPMD module (`spmd`: the
    keyword arguments of run_spmd: partitions, replicas, report). Inputs are one argument list,
    or one per device; outputs come back flattened (SPMD: global arrays assembled by the output shardings)."""

    def __init__(self, spmd: dict | None = None):
        self.spmd = spmd

    def run(self, exe: Executable, inputs, observe=None, observe_operands: bool = False) -> list:
        return self.assemble(exe, self.run_devices(exe, inputs, observe, observe_operands))

    def run_devices(self, exe: Executable, inputs, observe=None, observe_operands: bool = False) -> list:
        """Each participant's outputs as its run returns them, by device id (one participant: device 0)."""
        if self.spmd is None:
            seen = None if observe is None else (lambda *a: observe(0, *a))
            return [exe.run(*inputs, observe=seen, observe_operands=observe_operands)]
        return exe.run_spmd(inputs, observe=observe, observe_operands=observe_operands, **self.spmd)

    def assemble(self, exe: Executable, per_device: list) -> list:
        """The flattened outputs (SPMD: global arrays, by the output shardings) of run_devices' outputs."""
        if self.spmd is None:
            return flatten(per_device[0])
        return flatten(spmd.assemble_outputs(exe.module, per_device))

    def holders(self, exe: Executable, output: int, index) -> list[int]:
        """The devices whose output `output` (flattened) holds the global element `index`."""
        if self.spmd is None:
            return [0]
        return spmd.holders(exe.module, self.spmd["partitions"] * self.spmd["replicas"], output, index)

    def say(self, message: str) -> None:
        """What the run says before it starts (SPMD: the report of run_spmd's keyword arguments; else stderr)."""
        (self.spmd or {}).get("report", lambda m: print(m, file=sys.stderr, flush=True))(message)

    def labelled(self, label: str) -> Runner:
        """This runner, its SPMD run's messages (the memory estimate) starting with `label`."""
        if self.spmd is None:
            return self
        say = self.say
        return Runner({**self.spmd, "report": lambda message: say(f"{label}: {message}")})

    def running_inputs(self, exe: Executable, inputs) -> list:
        """The input lists of the participants that run (SPMD: device 0's alone when they compute the same and
        this runner mirrors them, run_spmd's mirror_identical; one participant: `[inputs]`)."""
        if self.spmd is None:
            return [inputs]
        P, R = self.spmd["partitions"], self.spmd["replicas"]
        if self.spmd.get("mirror_identical") and spmd.why_not_identical(exe, inputs, P, R) is None:
            return inputs[:1]
        return inputs

    def shadow_inputs(self, shadow: Shadow, inputs) -> list:
        if self.spmd is None:
            return shadow.inputs(inputs)
        widened: dict = {}
        return [shadow.inputs(device_inputs, widened) for device_inputs in inputs]


@dataclass
class Divergence:
    """A discrete instruction (integer/pred values computed from floats) whose values differ between the program's
    run and the shadow's: everything downstream of it compares two different paths."""

    name: str
    opcode: str
    computation: str
    op_name: str
    source: str
    runs: int = 0  # times it ran (devices x loop iterations), compared
    differing_runs: int = 0
    elements: int = 0  # elements differing, over the runs whose values were kept
    size: int = 0  # elements per run
    uncounted_runs: int = 0  # runs known to differ (by digest) whose elements were not kept
    first: str = ""  # "device d, run k" of the first difference

    def describe(self) -> str:
        counted = f"{self.elements} of {self.size} elements" + (" per run" if self.runs > 1 else "")
        where = f" ({self.differing_runs} of {self.runs} runs, first: {self.first})" if self.runs > 1 else ""
        extra = f" (+{self.uncounted_runs} runs not counted)" if self.uncounted_runs else ""
        site = f"  {self.op_name}" if self.op_name else ""
        site += f"  {self.source}" if self.source else ""
        return f"%{self.name} ({self.opcode} in %{self.computation}): {counted} differ{where}{extra}{site}"


class _Discrete:
    """Watches the shadow's `discrete` instructions: `record` in the program's run, then `check` in the shadow's."""

    def __init__(self, names, budget: int = DISCRETE_BUDGET):
        self.names = set(names)
        self.budget = budget
        self.kept: dict[tuple, object] = {}
        self.counts: dict[tuple, int] = {}
        self.found: dict[tuple[str, str], Divergence] = {}
        self.lock = threading.Lock()

    def _key(self, device, inst):
        site = (device, inst.computation.name if inst.computation is not None else "", inst.name)
        with self.lock:
            k = self.counts.get(site, 0)
            self.counts[site] = k + 1
        return site + (k,)

    @staticmethod
    def _leaves(inst, value):
        leaves = flatten(value) if isinstance(value, tuple) else [value]
        return [np.asarray(v) for v in leaves if isinstance(v, np.ndarray) and v.dtype.kind in "biu"]

    def record(self, device, inst, value, operands=None):
        if inst.name not in self.names or not has_discrete(inst.shape):
            return
        key = self._key(device, inst)
        leaves = self._leaves(inst, value)
        size = sum(v.nbytes for v in leaves)
        with self.lock:
            if size <= self.budget:
                self.budget -= size
                self.kept[key] = [v.copy() for v in leaves]
            else:
                self.kept[key] = _digest(leaves)

    def check(self, device, inst, value, operands=None):
        if inst.name not in self.names or not has_discrete(inst.shape):
            return
        key = self._key(device, inst)
        with self.lock:
            self._tally(device, inst, key[3], self.kept.pop(key, None), self._leaves(inst, value))

    def compare(self, device, inst, run: int, program_value, shadow_value) -> None:
        """Both runs' values at once (a paired run): tally whether they differ."""
        if inst.name in self.names and has_discrete(inst.shape):
            with self.lock:
                self._tally(device, inst, run, self._leaves(inst, program_value), self._leaves(inst, shadow_value))

    def _tally(self, device, inst, run, mine, leaves) -> None:
        """`mine`: the program's leaves (or their digest; None: the program never ran this)."""
        comp = inst.computation.name if inst.computation is not None else ""
        d = self.found.get((comp, inst.name))
        if d is None:
            d = self.found[(comp, inst.name)] = Divergence(
                inst.name,
                inst.opcode,
                comp,
                inst.metadata.get("op_name", ""),
                inst.source_location,
                size=sum(v.size for v in leaves),
            )
        d.runs += 1
        if mine is None:
            return  # the program's run never got here (control flow parted earlier)
        if isinstance(mine, bytes):
            differs = mine != _digest(leaves)
            d.uncounted_runs += differs
        else:
            n = sum(int(np.count_nonzero(a != b)) for a, b in zip(mine, leaves))
            differs = n > 0
            d.elements += n
        if differs:
            d.differing_runs += 1
            if not d.first:
                d.first = f"device {device}, run {run}"

    def divergences(self) -> list[Divergence]:
        return [d for d in self.found.values() if d.differing_runs]


def _digest(leaves) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for v in leaves:
        h.update(np.ascontiguousarray(v).tobytes())
    return h.digest()


@dataclass
class ShadowRun:
    """The program's outputs at its precision and its shadow's (both flattened; SPMD: global), the instructions
    pinned to the program's precision in the shadow, and the discrete values that parted. `bounds`: device name ->
    OutputBounds, when error bounds were computed alongside (tools/bounds.py)."""

    outputs: list
    shadow: list
    shadow_info: Shadow
    divergences: list[Divergence] = field(default_factory=list)
    bounds: dict = field(default_factory=dict)


@dataclass
class OutputBounds:
    """Per output (flattened), the error bound of every element under one device's arithmetic (None for integer and
    pred outputs) and its rounding-decided elements; the instructions without a bound; the dot algorithms used."""

    device: str
    bounds: list
    decided: list
    unbounded: dict
    algorithms: list
    # per output, where an order or a rounding the arithmetic allows may make it +inf, -inf or NaN (uint8 bits,
    # tools/bound_overflow.py; None: none kept)
    nonfinite: list | None = None


def shadow_run(
    exe: Executable, inputs, runner: Runner | None = None, *, shadow: Shadow | None = None, devices=None
) -> ShadowRun:
    """Run `exe`'s module and its shadow on `inputs` (per device when `runner` is SPMD).

    Where the shadow has discrete instructions, both runs are observed (op by op, numpy) and their values
    compared (`divergences`); otherwise both run with `exe`'s options, the shadow in f64 in every tier.
    `devices` (profiles): the shadow's run is observed and every element of every output gets an error bound under
    each (tools/bounds.py), in `ShadowRun.bounds`; SPMD: each participant's by its own observers (their collectives
    exchange the bounds), assembled as the outputs are."""
    runner = runner or Runner()
    if shadow is None:
        shadow, runner = fitting_shadow(exe, inputs, runner, len(devices or ()))
    shadow_inputs = runner.shadow_inputs(shadow, inputs)
    program_runner = runner.labelled("the program")
    runner = runner.labelled(
        "its shadow (16-bit floats in f32, the rest in f64)" if shadow.half_in_f32 else "its shadow (f64)"
    )
    observers: dict[int, list[ErrorBounds]] = {}  # device id -> one per profile
    if devices:
        shadow_exe = executable_like(exe, shadow.module, use_numba=False)
        count = 1 if runner.spmd is None else runner.spmd["partitions"] * runner.spmd["replicas"]
        plans = InstructionPlans(shadow, shadow_exe.context)  # (every observer's per-instruction decisions)
        observers = {
            d: [ErrorBounds(shadow, shadow_exe.context, p, seed=d, plans=plans) for p in devices] for d in range(count)
        }
    else:
        shadow_exe = None
    if not shadow.discrete and not observers:
        outputs = program_runner.run(exe, inputs)
        return ShadowRun(outputs, runner.run(executable_like(exe, shadow.module), shadow_inputs), shadow)
    watch = _Discrete(shadow.discrete)
    if shadow.discrete:
        outputs = program_runner.run(executable_like(exe, exe.module, use_numba=False), inputs, watch.record)
        watch.counts.clear()  # the shadow's k-th run of an instruction meets the program's k-th
    else:
        outputs = program_runner.run(exe, inputs)

    ran: set[int] = set()  # participants observed (the others mirrored device 0: run_spmd's mirror_identical)

    def observe(device, inst, value, operands=None):
        ran.add(device)
        if shadow.discrete:
            watch.check(device, inst, value)
        for o in observers.get(device, ()):
            o(inst, value, operands)

    shadow_exe = shadow_exe or executable_like(exe, shadow.module, use_numba=False)
    per_device = runner.run_devices(shadow_exe, shadow_inputs, observe, observe_operands=bool(observers))
    run = ShadowRun(outputs, runner.assemble(shadow_exe, per_device), shadow, watch.divergences())
    for k, profile in enumerate(devices if observers else ()):
        mine = [observers[d if d in ran else 0][k] for d in range(len(per_device))]

        def assembled(of):  # per global output: `of` each participant's float output, assembled (None: not float)
            leaves = runner.assemble(shadow_exe, [_per_leaf(out, of(o)) for out, o in zip(per_device, mine)])
            return [b if _float(s) else None for s, b in zip(run.shadow, leaves)]

        run.bounds[profile.name] = OutputBounds(
            profile.name,
            assembled(lambda o: o.of),
            assembled(lambda o: o.decided_of),
            {name: why for o in mine for name, why in o.unbounded.items()},
            sorted({a for o in mine for a in o.algorithms}),
            assembled(lambda o: o.nonfinite_of),
        )
    return run


def _per_leaf(value, of):
    """`value` (an output: arrays, tuples of them) with each float array replaced by `of(array)` (its bound)."""
    if isinstance(value, (tuple, list)):
        return tuple(_per_leaf(v, of) for v in value)
    return of(value) if _float(value) else value


def run_memory(
    exe: Executable, inputs, runner: Runner, shadow: Shadow | None = None, observers: int = 0, groups=None
) -> dict:
    """What a run needs at its peak (SPMD: the participants that run, the distinct inputs once), a
    memory_estimate's dict (`total`, `work`, `participants`, `bounds`); `shadow`: `exe` is that shadow's, which
    will take `inputs` widened (counted as such, not made), with `observers` error bounds' observers beside it
    (bounds_memory); `groups`: the participants taking turns (run_spmd's groups)."""
    if runner.spmd is None:
        work = exe.peak_bytes()
        estimate = {"participants": 1, "work": work, "total": work}
    else:
        inputs = runner.running_inputs(exe, inputs)
        counts = (runner.spmd["partitions"], runner.spmd["replicas"])
        estimate = spmd.memory_estimate(exe, inputs, None, groups if len(inputs) > 1 else None, counts)
    if shadow is not None and runner.spmd is not None:
        distinct = {id(a): a for device in inputs for a in flatten(tuple(device)) if isinstance(a, np.ndarray)}
        estimate["total"] = estimate["work"] + sum(
            a.size * (16 if a.dtype.kind == "c" else 4 if shadow.half_in_f32 and a.dtype.itemsize <= 2 else 8)
            if a.dtype.kind in "fc" or "float" in a.dtype.name
            else a.nbytes
            for a in distinct.values()
        )
    bounds = 0
    if shadow is not None:
        turns = None  # (participants running at once, elements of the largest value the others wait at)
        if groups and runner.spmd is not None:
            P, R = runner.spmd["partitions"], runner.spmd["replicas"]
            turns = (max(map(len, groups)), spmd.largest_crossing(exe.module, groups, P, R))
        per_observer = bounds_memory(estimate["work"], shadow, estimate["participants"], runner.spmd is not None, turns)
        bounds = observers * per_observer
    return {**estimate, "bounds": bounds, "work": estimate["work"] + bounds, "total": estimate["total"] + bounds}


# Float32 arrays of an instruction's size that an error bounds' observer holds while it observes that instruction
# (its operands' samples decoded from SAMPLE_STORAGE, its own samples made, the rule's terms and products) beside
# what its store keeps. Measured with tracemalloc (a run's peak with the bounds less its peak without, less the
# store and the outputs' bounds, per participant, over the largest value's elements): 11 on an f32
# module of 8 participants (tests/test_spmd_turns.py's), 7 on the 8-device TPU seed, where all eight hold them
# at once in a collective (each participant's bounds exchange their own payloads: bounds, squares, counts).
RULE_ARRAYS = 16


def bounds_memory(
    work: int, shadow: Shadow, participants: int = 1, assembled: bool = False, turns: tuple | None = None
) -> int:
    """Bytes one error bounds' observer per participant (tools/bounds.py) may need beside a shadow run of `work`
    bytes of values: what its store keeps per live float element (store_bytes_per_element), every value counted
    as of the shadow's narrowest float type; per participant its rules' arrays (RULE_ARRAYS float32 arrays of the
    size of the largest value computed from floats, _largest_computed; in turns, `turns` = (running,
    waiting_at): `running` participants' so, the others' of the size they wait at) and its outputs' bounds as
    the run returns them (OutputBounds: float64 copies of float32 bounds, the marks; `assembled`: again as global
    arrays)."""
    floats = [t for t in _element_types(shadow.module) if t.kind == "float"]
    narrowest = min((t.itemsize for t in floats), default=8)
    largest = _largest_computed(shadow.module)
    leaves = [leaf for _, leaf in shadow.original.entry.root.shape.leaves() if leaf.element_type.kind == "float"]
    outputs = sum(leaf.size * (1 + (8 if leaf.element_type.itemsize <= 4 else 0)) for leaf in leaves)
    running, waiting_at = (participants, 0) if turns is None else (min(turns[0], participants), turns[1])
    # (a waiting participant: its rules' arrays where it waits)
    rules = 4 * RULE_ARRAYS * (running * largest + (participants - running) * waiting_at)
    return work // narrowest * store_bytes_per_element(shadow) + rules + participants * outputs * (1 + assembled)


def store_bytes_per_element(shadow: Shadow) -> int:
    """Bytes the bounds' store (tools/bound_store.py) keeps per float element: its bound (float32 where the
    program's float types are 32 bits or fewer, else float64), SAMPLES deviations in SAMPLE_STORAGE, a
    rounding-decided mark. Moved values (views) and parameters (exact) keep none: an upper bound."""
    wide = any(t.kind == "float" and t.itemsize > 4 for t in _element_types(shadow.original))
    return (8 if wide else 4) + SAMPLES * SAMPLE_STORAGE.itemsize + 1


def _largest_computed(module) -> int:
    """Elements of the largest float value an instruction computes from float operands (what the bounds' rules
    and samples work on; a value made from integers alone, a one-hot, is exact, and a view moves its operand's)."""
    return max(
        (
            i.shape.size
            for c in module.computations
            for i in c.instructions
            if not i.shape.is_tuple
            and i.shape.element_type.kind == "float"
            and i.opcode not in opcodes.VIEW | VIEW_MOVES
            and any(o.shape.element_type.kind == "float" for o in i.operands if not o.shape.is_tuple)
        ),
        default=1,
    )


def _element_types(module) -> set:
    return {leaf.element_type for c in module.computations for i in c.instructions for _, leaf in i.shape.leaves()}


def fitting_shadow(exe: Executable, inputs, runner: Runner, observers: int = 0) -> tuple[Shadow, Runner]:
    """`exe`'s shadow in f64, or with its 16-bit float types in f32 (exec/shadow.py HALF_BITS: 13 more bits than
    f16, 16 more than bf16), with `observers` error bounds' observers beside it, and the runner to run it with:
    the first that fits in the memory available (the options' max_memory, else MemAvailable) of the f64 one
    with all participants together, then in turns by groups (SPMD: Mailboxes' groups, memory.run_groups), then
    the narrower one together, then in groups. What it chose and needs is said first (SPMD: through the runner's
    report; the narrower one also on stderr). SPMD: a MemoryLimitError, before anything runs, when none fits
    (as run_spmd's check would refuse it after the program's run)."""
    shadow = shadow_module(exe.module)
    limit = exe.max_memory if exe.max_memory is not None else available_memory()
    # (no shadow needs more than 8x its program, an 8-bit float in f64, nor its bounds more than they need beside
    # that many bytes of values: small modules skip the estimate)
    program = run_memory(exe, inputs, runner)
    most = 8 * program["total"]
    if limit is None or most + observers * bounds_memory(most, shadow, program["participants"], True) <= limit:
        return shadow, runner
    P, R = (runner.spmd["partitions"], runner.spmd["replicas"]) if runner.spmd is not None else (1, 1)
    turns = spmd.run_groups(exe, P, R) if runner.spmd is not None and runner.spmd.get("groups") == "auto" else None
    tried: list[tuple[Shadow, list | None, dict]] = []  # in the order preferred
    for candidate in (shadow, shadow_module(exe.module, half_in_f32=True)):
        candidate_exe = executable_like(exe, candidate.module, use_numba=False)
        for groups in [None] + ([turns] if turns else []):
            tried.append((candidate, groups, run_memory(candidate_exe, inputs, runner, candidate, observers, groups)))
    fitting = [t for t in tried if t[2]["total"] <= limit]
    chosen, groups, needs = fitting[0] if fitting else min(tried, key=lambda t: t[2]["total"])
    if len(tried) > 2:
        runner.say(
            "the shadow with its error bounds needs: "
            + "; ".join(f"{_shadow_kind(c, g)} {gb(n['total'])}" for c, g, n in tried)
            + f"; {gb(limit)} available"
        )
    if chosen.half_in_f32:
        runner.say(
            f"the shadow in f64 needs {gb(tried[0][2]['total'])}, {gb(limit)} available: its 16-bit floats in f32 "
            "(an f32 rounding is 2^-13 of an f16 one)"
        )
    if runner.spmd is None:
        return chosen, runner
    runner.say(
        f"the shadow ({_shadow_kind(chosen, groups)}) with its error bounds: {gb(needs['total'])} on "
        f"{needs['participants']} participant(s), of which the bounds' {gb(needs['bounds'])} ({observers} "
        f"observer(s)); {gb(limit)} available"
    )
    if runner.spmd.get("check_memory", True):
        subject = f"the shadow of {exe.module.name} ({_shadow_kind(chosen, groups)}, with its error bounds)"
        spmd.check_fits(subject, needs, exe.max_memory, available_memory())
    return chosen, Runner({**runner.spmd, "groups": groups})


def _shadow_kind(shadow: Shadow, groups) -> str:
    kind = "16-bit floats in f32" if shadow.half_in_f32 else "f64"
    return kind + (f" in turns by {len(groups)} groups" if groups else "")


def baseline_executable(exe: Executable) -> Executable:
    """The program at its own precision in the most pessimistic plausible order: every f16/bf16 reduction
    step rounds to its type, in index order (`reductions="per-step"`)."""
    return executable_like(exe, exe.module, reductions="per-step")


XLA_CPU_TREE_WINDOW = 32  # xla/service/cpu/cpu_compiler.cc: TreeReductionRewriter, its default window


def xla_cpu_arithmetic():
    """The device profile of XLA:CPU's results of a module it compiled: the built-in xla-cpu's arithmetic (its
    f16/bf16 sums round every step) in the order its compiler gives long sums (a reduce-window of 32 and a reduce
    of the windows' sums), which the error bounds follow."""
    xla_cpu = device_profile("xla-cpu")
    return replace(
        xla_cpu,
        name="xla-cpu (compiled)",
        tree_reduction_window=XLA_CPU_TREE_WINDOW,
        sources={
            **xla_cpu.sources,
            "tree_reduction_window": "xla/service/cpu/cpu_compiler.cc runs "
            "TreeReductionRewriter (xla/hlo/transforms/simplifiers/tree_reduction_rewriter.cc) on every compile",
        },
    )


def run_profile(exe: Executable):
    """The device profile `exe` runs under, with its reductions rule (`--reductions per-step`: f16 sums rounding
    every step, as XLA:CPU's do): what its results' bounds follow when no device is named."""
    if exe.options.reductions == exe.options.device.reductions:
        return exe.options.device
    return replace(
        exe.options.device,
        name=f"{exe.options.device.name} ({exe.options.reductions} reductions)",
        reductions=exe.options.reductions,
    )


def judge_run(
    exe: Executable,
    inputs,
    candidates: dict[str, list] | None = None,
    runner: Runner | None = None,
    rule=None,
    devices=None,
    known: dict | None = None,
):
    """(Verdict, ShadowRun): `exe`'s module run at its precision ("hloexec") and `candidates` (name -> flattened
    outputs: a device's, XLA:CPU's, another dump's) judged against the shadow, every element against its own
    error bound under the device's arithmetic (tools/bounds.py; `devices`: profiles or their names, None: `exe`'s;
    several: one verdict each, `Verdict.by_device`, the first returned), with the baseline run
    (baseline_executable) as the measure of the outputs' RMS error (tools/verdict.py). `known`: candidate name ->
    the profile of the arithmetic known to have made it (XLA:CPU's: xla_cpu_arithmetic()), judged by that one.
    SPMD: global outputs, each worst element named with the devices that hold it (`Element.devices`)."""
    runner = runner or Runner()
    profiles = [Options.make(d).device for d in devices] if devices else [run_profile(exe)]
    known = {n: Options.make(d).device for n, d in (known or {}).items() if n in (candidates or {})}
    reference = Options.make("reference").device
    # the reference's bounds too when devices were asked for: how much of an error their rules explain
    wanted = profiles + ([reference] if devices and all(p.name != reference.name for p in profiles) else [])
    wanted += [d for d in {d.name: d for d in known.values()}.values() if d.name not in {p.name for p in wanted}]
    run = shadow_run(exe, inputs, runner, devices=wanted)
    baseline = runner.labelled("the baseline").run(baseline_executable(exe), inputs)
    everyone = {"hloexec": run.outputs, **(candidates or {})}
    own = {n: run.bounds.get(d.name) for n, d in known.items()}
    verdicts = {
        p.name: judge(
            run.shadow,
            baseline,
            everyone,
            rule or RULE,
            run.bounds.get(p.name),
            run.bounds.get(reference.name) if devices and p.name != reference.name else None,
            own,
        )
        for p in profiles
    }
    if runner.spmd is not None:
        for o in (o for v in verdicts.values() for o in v.outputs):
            for element in (w for c in o.candidates for w in c.worst):
                element.devices = runner.holders(exe, o.index, element.index)
    verdict = verdicts[profiles[0].name]
    if len(verdicts) > 1:
        verdict.by_device = verdicts
    return verdict, run


def shadow_report(run: ShadowRun) -> dict:
    """JSON data of a shadow run: per output the shadow's summary and the run's error against it, the
    divergences, the pinned instructions."""
    return {
        "outputs": [
            dict(array_summary(i, s), dtype=dtype_name(o.dtype), error=asdict(error_stats(o, s)))
            for i, (o, s) in enumerate(zip(run.outputs, run.shadow))
        ],
        "discrete": len(run.shadow_info.discrete),
        "divergences": [asdict(d) for d in run.divergences],
        "pinned": run.shadow_info.pinned,
    }


def format_shadow_report(report: dict) -> str:
    lines = [
        f"{'out':>4}  {'shape':<16} {'dtype':<5} {'shadow min':>11} {'max':>11} {'mean':>11} {'NaN':>5} "
        f"{'Inf':>5}   run's error: {'max abs':>9} {'max rel':>9} {'rms rel':>9} {'ulp@scale':>9}"
    ]
    for s in report["outputs"]:
        e = s["error"]
        shape = "[" + ",".join(map(str, s["shape"])) + "]"
        error = (
            f"{e['mismatches']} elements differ"
            if e["mismatches"]
            else f"{e['max_abs']:9.3g} {e['max_rel']:9.3g} {e['rms_rel']:9.3g} {e['max_ulps']:9.3g}"
            + (f"  ({e['nonfinite']} non-finite)" if e["nonfinite"] else "")
        )
        lines.append(
            f"{s['index']:>4}  {shape:<16} {s['dtype']:<5} {_fmt(s['min']):>11} {_fmt(s['max']):>11} "
            f"{_fmt(s['mean']):>11} {s['nan']:>5} {s['inf']:>5}                {error}"
        )
    n = report["discrete"]
    if n:
        parted = report["divergences"]
        lines.append(
            f"integer/pred values computed from floats: {n} instruction{'s' if n != 1 else ''}, "
            + (
                f"{len(parted)} differ between the run and the shadow (what follows them compares two different paths):"
                if parted
                else "all equal in the run and the shadow"
            )
        )
        lines += [f"  {Divergence(**d).describe()}" for d in parted]
    if report["pinned"]:
        lines.append("computed at the program's own precision in the shadow:")
        lines += [f"  %{name}: {why}" for name, why in report["pinned"].items()]
    return "\n".join(lines)


def _fmt(x) -> str:
    if x is None:
        return "-"
    return x if isinstance(x, str) else f"{x:.5g}"
