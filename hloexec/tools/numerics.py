"""Numerical validation: the program's run beside its shadow (its exact answer), and where they part.

`shadow_run(exe, inputs)` runs a module at its own precision and its shadow (hloexec/exec/shadow.py) on the
same inputs and returns both outputs, with the instructions whose integer/pred values differ between the
two runs (`Divergence`: a compare, a float->int convert, a sort over float keys... computed from floats
that differ). `judge_run` adds the baseline run and judges candidates (tools/verdict.py).
`attribute` (the `numerics` command) says which instructions lose the accuracy.

Everything here runs single-participant or SPMD (`Runner`), and streams: values are looked at while the
plans hold them (Executable.run's `observe`), never kept beyond what the report needs.
"""
from __future__ import annotations

import contextlib
import hashlib
import threading
import weakref
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from ..exec.executor import Executable, available_memory
from ..exec.shadow import Shadow, has_discrete, has_float, shadow_module, widen
from ..exec.spmd import memory_estimate
from ..ir.module import Instruction
from ..ops.registry import lookup
from ..options import Options, device_profile
from .arrays import array_summary, flatten
from .bounds import ErrorBounds
from .compare import dtype_name
from .nonfinite import NonfiniteTracker, StopRun, format_report as format_nonfinite
from .shadow_runs import Runner, executable_like
from .verdict import RULE, error_stats, judge

# Bytes of discrete values (relu masks, argmax indices...) kept from the program's run to count how many
# elements the shadow's differ in; beyond it a digest says only whether they differ.
DISCRETE_BUDGET = 256 << 20


@dataclass
class Divergence:
    """A discrete instruction (integer/pred values computed from floats) whose values differ between the program's
    run and the shadow's: everything downstream of it compares two different paths."""
    name: str
    opcode: str
    computation: str
    op_name: str
    source: str
    runs: int = 0                   # times it ran (devices x loop iterations), compared
    differing_runs: int = 0
    elements: int = 0               # elements differing, over the runs whose values were kept
    size: int = 0                   # elements per run
    uncounted_runs: int = 0         # runs known to differ (by digest) whose elements were not kept
    first: str = ""                 # "device d, run k" of the first difference

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
            d = self.found[(comp, inst.name)] = Divergence(inst.name, inst.opcode, comp,
                                                           inst.metadata.get("op_name", ""), inst.source_location,
                                                           size=sum(v.size for v in leaves))
        d.runs += 1
        if mine is None:
            return          # the program's run never got here (control flow parted earlier)
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


def shadow_run(exe: Executable, inputs, runner: Runner | None = None, *, shadow: Shadow | None = None,
               devices=None) -> ShadowRun:
    """Run `exe`'s module and its shadow on `inputs` (per device when `runner` is SPMD).

    Where the shadow has discrete instructions, both runs are observed (op by op, numpy) and their values
    compared (`divergences`); otherwise both run with `exe`'s options, the shadow in f64 in every tier.
    `devices` (profiles; one participant only): the shadow's run is observed and every element of every output
    gets an error bound under each (tools/bounds.py), in `ShadowRun.bounds`."""
    runner = runner or Runner()
    shadow = shadow or shadow_module(exe.module)
    shadow_inputs = runner.shadow_inputs(shadow, inputs)
    if devices and runner.spmd is None:
        shadow_exe = executable_like(exe, shadow.module, use_numba=False)
        observers = [ErrorBounds(shadow, shadow_exe.context, d) for d in devices]
    else:
        shadow_exe, observers = None, []
    if not shadow.discrete and not observers:
        outputs = runner.run(exe, inputs)
        return ShadowRun(outputs, runner.run(executable_like(exe, shadow.module), shadow_inputs), shadow)
    watch = _Discrete(shadow.discrete)
    if shadow.discrete:
        outputs = runner.run(executable_like(exe, exe.module, use_numba=False), inputs, watch.record)
        watch.counts.clear()            # the shadow's k-th run of an instruction meets the program's k-th
    else:
        outputs = runner.run(exe, inputs)

    def observe(device, inst, value, operands=None):
        if shadow.discrete:
            watch.check(device, inst, value)
        for o in observers:
            o(inst, value, operands)
    shadow_exe = shadow_exe or executable_like(exe, shadow.module, use_numba=False)
    shadow_outputs = runner.run(shadow_exe, shadow_inputs, observe, observe_operands=bool(observers))
    run = ShadowRun(outputs, shadow_outputs, shadow, watch.divergences())
    for o in observers:
        floats = [isinstance(s, (np.ndarray, np.generic)) and s.dtype.kind in "fc" for s in shadow_outputs]
        run.bounds[o.device.name] = OutputBounds(
            o.device.name, [o.of(s) if f else None for s, f in zip(shadow_outputs, floats)],
            [o.decided_of(s) if f else None for s, f in zip(shadow_outputs, floats)], dict(o.unbounded),
            sorted(o.algorithms))
    return run


def baseline_executable(exe: Executable) -> Executable:
    """The program at its own precision in the most pessimistic plausible order: every f16/bf16 reduction
    step rounds to its type, in index order (`reductions="per-step"`)."""
    return executable_like(exe, exe.module, reductions="per-step")


def xla_cpu_arithmetic():
    """The device profile of XLA:CPU's arithmetic (its f16/bf16 sums round every step)."""
    return device_profile("xla-cpu")


def judge_run(exe: Executable, inputs, candidates: dict[str, list] | None = None, runner: Runner | None = None,
              rule=None, devices=None, known: dict | None = None):
    """(Verdict, ShadowRun): `exe`'s module run at its precision ("hloexec") and `candidates` (name -> flattened
    outputs: a device's, XLA:CPU's, another dump's) judged against the shadow, every element against its own
    error bound under the device's arithmetic (tools/bounds.py; `devices`: profiles or their names, None: `exe`'s;
    several: one verdict each, `Verdict.by_device`, the first returned), with the baseline run
    (baseline_executable) as the measure of the outputs' RMS error (tools/verdict.py). `known`: candidate name ->
    the profile of the arithmetic known to have made it (XLA:CPU's: xla_cpu_arithmetic()), judged by that one.
    SPMD runs have no per-element bounds: their elements are judged by the baseline's errors."""
    runner = runner or Runner()
    # no device given: `exe`'s profile with its reductions rule (`--reductions per-step`: f16 sums rounding every
    # step, as XLA:CPU's do)
    profiles = [Options.make(d).device for d in devices] if devices else \
        [exe.options.device if exe.options.reductions == exe.options.device.reductions else
         replace(exe.options.device, name=f"{exe.options.device.name} ({exe.options.reductions} reductions)",
                 reductions=exe.options.reductions)]
    known = {n: Options.make(d).device for n, d in (known or {}).items() if n in (candidates or {})}
    reference = Options.make("reference").device
    # the reference's bounds too when devices were asked for: how much of an error their rules explain
    wanted = profiles + ([reference] if devices and all(p.name != reference.name for p in profiles) else [])
    wanted += [d for d in {d.name: d for d in known.values()}.values() if d.name not in {p.name for p in wanted}]
    run = shadow_run(exe, inputs, runner, devices=wanted)
    baseline = runner.run(baseline_executable(exe), inputs)
    everyone = {"hloexec": run.outputs, **(candidates or {})}
    own = {n: run.bounds.get(d.name) for n, d in known.items()}
    verdicts = {p.name: judge(run.shadow, baseline, everyone, rule or RULE, run.bounds.get(p.name),
                              run.bounds.get(reference.name) if devices and p.name != reference.name else None,
                              own)
                for p in profiles}
    verdict = verdicts[profiles[0].name]
    if len(verdicts) > 1:
        verdict.by_device = verdicts
    return verdict, run


def shadow_report(run: ShadowRun) -> dict:
    """JSON data of a shadow run: per output the shadow's summary and the run's error against it, the
    divergences, the pinned instructions."""
    return {"outputs": [dict(array_summary(i, s), dtype=dtype_name(o.dtype), error=asdict(error_stats(o, s)))
                        for i, (o, s) in enumerate(zip(run.outputs, run.shadow))],
            "discrete": len(run.shadow_info.discrete), "divergences": [asdict(d) for d in run.divergences],
            "pinned": run.shadow_info.pinned}


def format_shadow_report(report: dict) -> str:
    lines = [f"{'out':>4}  {'shape':<16} {'dtype':<5} {'shadow min':>11} {'max':>11} {'mean':>11} {'NaN':>5} "
             f"{'Inf':>5}   run's error: {'max abs':>9} {'max rel':>9} {'rms rel':>9} {'ulp@scale':>9}"]
    for s in report["outputs"]:
        e = s["error"]
        shape = "[" + ",".join(map(str, s["shape"])) + "]"
        error = f"{e['mismatches']} elements differ" if e["mismatches"] else \
            f"{e['max_abs']:9.3g} {e['max_rel']:9.3g} {e['rms_rel']:9.3g} {e['max_ulps']:9.3g}" + \
            (f"  ({e['nonfinite']} non-finite)" if e["nonfinite"] else "")
        lines.append(f"{s['index']:>4}  {shape:<16} {s['dtype']:<5} {_fmt(s['min']):>11} {_fmt(s['max']):>11} "
                     f"{_fmt(s['mean']):>11} {s['nan']:>5} {s['inf']:>5}                {error}")
    n = report["discrete"]
    if n:
        parted = report["divergences"]
        lines.append(f"integer/pred values computed from floats: {n} instruction{'s' if n != 1 else ''}, "
                     + (f"{len(parted)} differ between the run and the shadow (what follows them compares two "
                        "different paths):" if parted else "all equal in the run and the shadow"))
        lines += [f"  {Divergence(**d).describe()}" for d in parted]
    if report["pinned"]:
        lines.append("computed at the program's own precision in the shadow:")
        lines += [f"  %{name}: {why}" for name, why in report["pinned"].items()]
    return "\n".join(lines)


def _fmt(x) -> str:
    if x is None:
        return "-"
    return x if isinstance(x, str) else f"{x:.5g}"


# -- attribution: which instruction lost the accuracy ------------------------------------------------------------
# Ops that only move, select or compare values, and widening converts: given their typed operands they are exact,
# so their "local error" would only re-measure the rounding of their operands (charged to the producers).
EXACT_OPCODES = frozenset({
    "parameter", "constant", "iota", "tuple", "get-tuple-element", "bitcast", "reshape", "copy", "transpose",
    "broadcast", "slice", "concatenate", "pad", "reverse", "dynamic-slice", "dynamic-update-slice", "gather",
    "select", "maximum", "minimum", "abs", "negate", "clamp", "sign", "compare", "is-finite", "opt-barrier",
    "optimization-barrier", "copy-start", "copy-done", "domain", "add-dependency", "after-all", "real", "imag",
    "get-dimension-size", "set-dimension-size", "sort", "topk", "bitcast-convert", "partition-id", "replica-id"})
# Ops evaluated elsewhere (their called computations' instructions are observed one by one) or not alone.
NOT_EVALUATED = frozenset({
    "fusion", "call", "while", "conditional", "async-start", "async-update", "async-done", "all-reduce",
    "all-reduce-start", "all-reduce-done", "all-gather", "all-gather-start", "all-gather-done", "reduce-scatter",
    "all-to-all", "collective-permute", "collective-permute-start", "collective-permute-done",
    "collective-broadcast", "send", "send-done", "recv", "recv-done", "infeed", "outfeed", "map", "scan"})


def evaluates_local_error(inst) -> bool:
    """Whether `numerics` evaluates `inst` alone: it makes floats and can round (see EXACT_OPCODES)."""
    if inst.opcode in EXACT_OPCODES or inst.opcode in NOT_EVALUATED or not has_float(inst.shape):
        return False
    if inst.opcode == "convert":
        src, dst = inst.operands[0].shape.element_type, inst.shape.element_type
        return not (src.kind == dst.kind == "float" and dst.bits >= src.bits) and dst.kind in ("float", "complex")
    return True


@dataclass
class InstructionErrors:
    """What one instruction did to the accuracy, over every time it ran (loop iterations, devices). Errors are
    relative to the instruction's scale (max |shadow value|); ulps are of its type at that scale."""
    name: str
    opcode: str
    computation: str
    shape: str
    op_name: str
    source: str
    runs: int = 0
    local_error: float = 0.0        # max over runs: evaluated on exact operands rounded to its types, vs exact
    local_rms: float = 0.0
    local_ulps: float = 0.0
    total_error: float | None = None        # the run's value against the shadow's (None: no shadow run)
    inherited_error: float | None = None    # the largest error its float operands arrived with
    worst_run: str = ""
    first_seen: int = 0             # the order in which instructions first ran (ties of the ranking)
    contribution: float | None = None   # how far rounding its value moves the outputs (see _contributions)

    def add(self, local, total, inherited, where: str) -> None:
        self.runs += 1
        if local is not None and local.max_rel >= self.local_error:
            self.local_error, self.local_ulps, self.worst_run = local.max_rel, local.max_ulps, where
        if local is not None:
            self.local_rms = max(self.local_rms, local.rms_rel)
        if total is not None:
            self.total_error = max(self.total_error or 0.0, total)
        if inherited is not None:
            self.inherited_error = max(self.inherited_error or 0.0, inherited)


def _max_rel(values, shadow) -> float:
    """The largest error relative to scale over the float leaves of a value (infinite where it holds a NaN or
    infinity the exact value does not)."""
    e = _local_stats(values, shadow)
    return 0.0 if e is None else e.max_rel


def _local_stats(got, exact):
    """verdict.Errors of the float leaves of `got` against `exact` (the leaf with the largest error); a value
    non-finite where the exact one is finite has an infinite error (max_rel, max_ulps)."""
    best = None
    for v, s in zip(flatten(got), flatten(exact)):
        if isinstance(v, (np.ndarray, np.generic)) and (v.dtype.kind in "fc" or "float" in v.dtype.name):
            e = error_stats(np.asarray(v), np.asarray(s))
            if e.nonfinite:
                e.max_rel = e.max_ulps = float("inf")
            if best is None or e.max_rel > best.max_rel:
                best = e
    return best


def _narrow_to(value, shape):
    """A shadow value rounded to the program's `shape` (leafwise)."""
    if shape.is_tuple:
        return tuple(_narrow_to(v, s) for v, s in zip(value, shape.tuple_shapes))
    if shape.element_type.numpy is None or value.dtype == shape.dtype:
        return value
    return value.astype(shape.dtype)


class _Totals:
    """_max_rel of (program value, shadow value) pairs, computed once per pair of arrays: a value's error is
    measured when it is made and found again when it arrives as an operand (held by weak reference only)."""

    def __init__(self):
        self.known: dict[tuple[int, int], tuple] = {}
        self.lock = threading.Lock()

    def of(self, low, high) -> float:
        if not (isinstance(low, np.ndarray) and isinstance(high, np.ndarray)):
            return _max_rel(low, high)
        key = (id(low), id(high))
        with self.lock:
            hit = self.known.get(key)
        if hit is not None and hit[0]() is low and hit[1]() is high:
            return hit[2]
        error = _max_rel(low, high)
        forget = lambda _, key=key: self.known.pop(key, None)  # noqa: E731
        with self.lock:
            self.known[key] = (weakref.ref(low, forget), weakref.ref(high, forget), error)
        return error


class _Attribution:
    """Per-instruction error statistics, streamed: one record per instruction, updated each time it runs."""

    def __init__(self, local_context, shadow: Shadow):
        self.context = local_context            # where the instructions evaluated alone are prepared
        self.shadow = shadow
        self.kernels: dict[int, object] = {}
        self.records: dict[tuple[str, str], InstructionErrors] = {}
        self.lock = threading.Lock()
        self.errors: list[str] = []

    def kernel(self, inst):
        k = self.kernels.get(id(inst))
        if k is None:
            k = self.kernels[id(inst)] = (inst, lookup(inst).prepare(inst, self.context))
        return k[1]

    def record(self, device, run_index, inst, local, total, inherited) -> None:
        key = (inst.computation.name if inst.computation is not None else "", inst.name)
        with self.lock:
            r = self.records.get(key)
            if r is None:
                r = self.records[key] = InstructionErrors(inst.name, inst.opcode, key[0], inst.shape.to_text(layout=False),
                                                          inst.metadata.get("op_name", ""), inst.source_location,
                                                          first_seen=len(self.records))
            r.add(local, total, inherited, f"device {device}, run {run_index}" if device else f"run {run_index}")

    def evaluate(self, inst, operands, exact, narrow_operands: bool):
        """verdict.Errors of `inst` evaluated alone on `operands` (rounded to its operand types when
        `narrow_operands`: the shadow's), against `exact`; None where it is not evaluated."""
        if not evaluates_local_error(inst) or inst.name in self.shadow.pinned:
            return None
        if narrow_operands:
            operands = [_narrow_to(v, o.shape) for v, o in zip(operands, inst.operands)]
        try:
            with np.errstate(all="ignore"):
                got = self.kernel(inst)(*operands)
        except Exception as e:  # noqa: BLE001 - an op that cannot run alone is reported, not fatal
            self.errors.append(f"%{inst.name} ({inst.opcode}): not evaluated alone: {type(e).__name__}: {e}")
            return None
        return _local_stats(got, exact)

    def evaluate_exact(self, twin, operands):
        """The shadow instruction `twin` evaluated alone on (widened) `operands`, or None if it cannot run alone."""
        try:
            with np.errstate(all="ignore"):
                return self.kernel(twin)(*operands)
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            self.errors.append(f"%{twin.name} ({twin.opcode}): not evaluated alone: {type(e).__name__}: {e}")
            return None


class _Pairing:
    """Pairs the program's run with its shadow's, instruction by instruction and device by device: the program's
    observer posts each (instruction, value, operands) and waits until the shadow's observer has taken it, so both
    runs hold only what their plans hold, plus one value. Runs whose instruction sequences part (a loop that
    stops at another iteration) are no longer paired from there on (`parted`)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.posted: dict[int, tuple] = {}
        self.parted: dict[int, str] = {}
        self.program_done = False
        self.failed = False

    def post(self, device, item, idle) -> None:
        """`idle`: the participant's context for waiting (an SPMD participant gives its compute slot up)."""
        with idle(), self.cond:
            if device in self.parted:
                return
            self.posted[device] = item
            self.cond.notify_all()
            while device in self.posted and device not in self.parted and not self.failed:
                self.cond.wait()
            if self.failed:
                raise StopRun("the shadow's run failed")

    def take(self, device, inst, idle):
        """The program's item for the shadow's `inst`, or None when the runs no longer pair."""
        with idle(), self.cond:
            while device not in self.posted and not self.program_done and device not in self.parted \
                    and not self.failed:
                self.cond.wait()
            if self.failed:
                raise StopRun("the program's run failed")
            item = self.posted.pop(device, None)
            self.cond.notify_all()
            if device in self.parted:
                return None
            if item is None or (item[0].name, _comp(item[0])) != (inst.name, _comp(inst)):
                there = f"%{item[0].name} in %{_comp(item[0])}" if item is not None else "its end"
                self.parted[device] = (f"device {device}: the shadow ran %{inst.name} in %{_comp(inst)} where the "
                                       f"program ran {there}")
                self.cond.notify_all()
                return None
            return item

    def finish(self, failed: bool) -> None:
        with self.cond:
            self.program_done = True
            self.failed = self.failed or failed
            self.cond.notify_all()


def _comp(inst) -> str:
    return inst.computation.name if inst.computation is not None else ""


@dataclass
class NumericsReport:
    """What `numerics` found: per instruction, its errors (sorted by local error); per output, the run's error
    against the shadow and the instructions on its path with the largest local errors."""
    mode: str                                   # "paired": with the shadow's values; "local": at the run's own
    instructions: list[InstructionErrors]
    outputs: list[dict]
    divergences: list[Divergence] = field(default_factory=list)
    parted: list[str] = field(default_factory=list)
    not_evaluated: list[str] = field(default_factory=list)
    nonfinite: object = None                    # nonfinite.NonfiniteReport


def attribute(exe: Executable, inputs, runner: Runner | None = None, *, mode: str = "auto",
              reductions: str | None = "per-step", say=None) -> NumericsReport:
    """Which instructions lose the accuracy (`hloexec numerics`), with the NaN/Inf origins of the run.

    "paired": the program (at its precision, `reductions`) and its shadow run side by side, instruction by
    instruction; an instruction's local error is its op evaluated alone on the shadow's operand values rounded
    to its operand types, against the shadow's value; its total error is the run's value against the shadow's,
    its inherited error the largest its operands arrived with. Memory: both runs' live values at once.
    "local": only the program runs; the local error is at its own operands (its op against the same op in f64
    on them): one run's memory plus one instruction's, for modules whose shadow does not fit.
    "auto": paired when both runs fit in the memory available, else local (`say(message)` tells why).
    `reductions`: the program's f16/bf16 reductions (None: `exe`'s), per-step by default: the HLO's meaning,
    every reducer step rounding."""
    runner = runner or Runner()
    shadow = shadow_module(exe.module)
    options = {"use_numba": False} if reductions is None else {"use_numba": False, "reductions": reductions}
    program = executable_like(exe, exe.module, **options)
    shadow_exe = executable_like(exe, shadow.module, use_numba=False)
    if mode == "auto":
        needed = _memory(program, inputs, runner) + _memory(shadow_exe, inputs, runner, widened=True)
        limit = exe.max_memory if runner.spmd is None else runner.spmd.get("memory_limit")
        limit = limit if limit is not None else available_memory()
        mode = "paired" if limit is None or needed <= limit else "local"
        if mode == "local" and say is not None:
            say(f"the run and its shadow side by side need {needed / 2**30:.2f} GiB, {limit / 2**30:.2f} GiB "
                "available: local errors only, at the run's own operands (no shadow run)")
    if mode == "paired" and runner.spmd is not None:     # checked together above: neither run alone refuses
        runner = Runner({**runner.spmd, "check_memory": False})
    tracker = NonfiniteTracker(exe.module)
    watch = _Discrete(shadow.discrete)
    helpers = _helper_names(shadow)
    counts: dict[tuple, int] = {}

    def run_index(device, inst) -> int:
        k = (device, _comp(inst), inst.name)
        counts[k] = counts.get(k, 0) + 1
        return counts[k]

    if mode == "local":
        attribution = _Attribution(shadow_exe.context, shadow)
        by_name = {(c.name, i.name): i for c in shadow.module.computations for i in c.instructions}

        def observe(device, inst, value, operands):
            tracker.observe(device, inst, value, operands)
            if not evaluates_local_error(inst) or inst.name in shadow.pinned:
                return
            twin = by_name.get((_comp(inst), inst.name))
            if twin is None:
                return
            wide = [widen(v, o.shape) for v, o in zip(operands, inst.operands)]
            exact = attribution.evaluate_exact(twin, wide)
            local = _local_stats(value, exact) if exact is not None else None
            attribution.record(device, run_index(device, inst), inst, local, None, None)
        outputs = runner.run(program, inputs, observe, observe_operands=True)
        shadow_outputs, pairing = None, None
    else:
        attribution = _Attribution(program.context, shadow)
        pairing = _Pairing()
        totals = _Totals()

        def idle(executable):
            communicator = executable.context.device.communicator
            return getattr(communicator, "idle", _no_wait)

        def on_program(device, inst, value, operands):
            tracker.observe(device, inst, value, operands)
            pairing.post(device, (inst, value, operands), idle(program))

        def on_shadow(device, inst, value, operands):
            if (_comp(inst), inst.name) in helpers:
                return
            item = pairing.take(device, inst, idle(shadow_exe))
            if item is None:
                return
            low_inst, low_value, low_operands = item
            k = run_index(device, low_inst)
            if low_inst.name in watch.names:
                watch.compare(device, low_inst, k, low_value, value)
            total = totals.of(low_value, value)
            # a pinned instruction's shadow twin widens its `.own` copy: its operands are not the program's
            inherited = None if low_inst.name in shadow.pinned else \
                max((totals.of(lo, s) for lo, s in zip(low_operands, operands)), default=0.0)
            local = attribution.evaluate(low_inst, operands, value, narrow_operands=True)
            attribution.record(device, k, low_inst, local, total, inherited)

        result: dict = {}

        def program_thread():
            try:
                result["outputs"] = runner.run(program, inputs, on_program, observe_operands=True)
            except BaseException as e:  # noqa: BLE001 - re-raised below, in the caller's thread
                result["error"] = e
            finally:
                pairing.finish("error" in result)

        thread = threading.Thread(target=program_thread, name="hloexec-numerics-program")
        thread.start()
        try:
            shadow_outputs = runner.run(shadow_exe, runner.shadow_inputs(shadow, inputs), on_shadow,
                                        observe_operands=True)
        except BaseException:
            pairing.finish(failed=True)     # the program's run stops at its next instruction
            thread.join()
            if "error" in result and not _stopped(result["error"]):
                raise result["error"] from None
            raise
        thread.join()
        if "error" in result:
            raise result["error"]
        outputs = result["outputs"]
    records = sorted(attribution.records.values(), key=lambda r: (-r.local_error, r.first_seen))
    if shadow_outputs is not None and runner.spmd is None:
        records = _contributions(exe, inputs, records, shadow_outputs)
    report = NumericsReport(mode, records, _output_table(exe.module, outputs, shadow_outputs, records),
                            watch.divergences(), list(pairing.parted.values()) if pairing else [],
                            attribution.errors, tracker.report(outputs))
    return report


CONTRIBUTION_CANDIDATES = 16     # instructions (largest local errors first) whose contribution is measured


def _contributions(exe: Executable, inputs, records: list, shadow_outputs: list) -> list:
    """`records` ranked by contribution to the outputs' error: for the entry instructions with the largest local
    errors, the shadow run again with that one value rounded to its type, and the largest change of an output
    relative to the output's scale. A local error is relative to the instruction's own scale: a value whose
    exact answer is ~0 (a sum that cancels) has a huge one and may contribute nothing; a bf16 rounding a small
    one that makes the outputs' error. Measured ones first (largest contribution first), then the rest."""
    entry = exe.module.entry
    measured = []
    for r in records:
        if len(measured) == CONTRIBUTION_CANDIDATES:
            break
        inst = entry.by_name.get(r.name) if r.computation == entry.name else None
        if inst is None or inst.opcode == "parameter" or inst.shape.is_tuple or not r.local_error \
                or not inst.shape.element_type.is_float:
            continue
        shadow = shadow_module(exe.module)
        if r.name in shadow.pinned:
            continue
        comp = shadow.module.entry
        exact = comp.by_name[r.name]
        rounded = Instruction(f"{r.name}.rounded", "convert", inst.shape, [exact])
        again = Instruction(f"{r.name}.rounded.wide", "convert", exact.shape, [rounded])
        for user in exact.users:
            user.operands = [again if o is exact else o for o in user.operands]
        again.users, exact.users, rounded.users = exact.users, [rounded], [again]
        for made in (rounded, again):
            made.computation = comp
        at = comp.instructions.index(exact) + 1
        comp.instructions = comp.instructions[:at] + [rounded, again] + comp.instructions[at:]
        if comp.root is exact:
            exact.is_root, again.is_root, comp.root = False, True, again
        outputs = Runner().run(executable_like(exe, shadow.module, use_numba=False), shadow.inputs(inputs))
        r.contribution = max((_max_rel(o, s) for o, s in zip(outputs, shadow_outputs)), default=0.0)
        measured.append(r)
    rest = [r for r in records if r.contribution is None]
    return sorted(measured, key=lambda r: (-r.contribution, r.first_seen)) + rest


def _memory(exe: Executable, inputs, runner: Runner, widened: bool = False) -> int:
    """Bytes a run needs at its peak (SPMD: all participants, the distinct inputs once); `widened`: `exe` is a
    shadow that will take `inputs` widened (counted as such, not made)."""
    if runner.spmd is None:
        return exe.peak_bytes()
    estimate = memory_estimate(exe, inputs)
    if not widened:
        return estimate["total"]
    distinct = {id(a): a for device in inputs for a in flatten(tuple(device)) if isinstance(a, np.ndarray)}
    return estimate["work"] + sum(a.size * (16 if a.dtype.kind == "c" else 8) if a.dtype.kind in "fc" or
                                  "float" in a.dtype.name else a.nbytes for a in distinct.values())


def _stopped(error: BaseException) -> bool:
    """Whether `error` is a StopRun (or an SPMD participant's failure caused by one)."""
    return isinstance(error, StopRun) or isinstance(error.__cause__, StopRun)


def _no_wait():
    return contextlib.nullcontext()


def _helper_names(shadow: Shadow) -> set:
    """(computation, name) of the instructions the shadow transform added (no twin in the program)."""
    original = {(c.name, i.name) for c in shadow.original.computations for i in c.instructions}
    return {(c.name, i.name) for c in shadow.module.computations for i in c.instructions} - original


def _output_table(module, outputs, shadow_outputs, records, per_output: int = 3) -> list[dict]:
    """Per output: the run's error against the shadow (when there is one) and the instructions on its path (its
    static ancestors, through called computations) with the largest local errors."""
    ancestors = _OutputAncestors(module)
    table = []
    for i, value in enumerate(outputs):
        on_path = ancestors.of(i)
        top = [r for r in records if (r.computation, r.name) in on_path and r.local_error > 0][:per_output]
        row = {"index": i, "shape": list(np.shape(value)), "dtype": dtype_name(np.asarray(value).dtype),
               "error": asdict(error_stats(value, shadow_outputs[i])) if shadow_outputs is not None else None,
               "instructions": [{"name": r.name, "opcode": r.opcode, "local_error": r.local_error,
                                 "contribution": r.contribution} for r in top]}
        table.append(row)
    return table


class _OutputAncestors:
    """The instructions each entry output depends on: operands, transitively, and every instruction of the
    computations those call."""

    def __init__(self, module):
        self.module = module
        root = module.entry.root
        self.roots = list(root.operands) if root.opcode == "tuple" and root.shape.is_tuple else [root]
        self.leaf_owner = [k for k, r in enumerate(self.roots) for _ in r.shape.leaves()]
        self.inside: dict[str, set] = {}

    def _computation(self, comp) -> set:
        found = self.inside.get(comp.name)
        if found is None:
            found = self.inside[comp.name] = set()
            for inst in comp.instructions:
                found.add((comp.name, inst.name))
                for c in inst.called_computations:
                    found |= self._computation(c)
        return found

    def of(self, index: int) -> set:
        if index >= len(self.leaf_owner):
            return set()
        seen, stack, out = set(), [self.roots[self.leaf_owner[index]]], set()
        while stack:
            inst = stack.pop()
            if id(inst) in seen:
                continue
            seen.add(id(inst))
            out.add((_comp(inst), inst.name))
            for c in inst.called_computations:
                out |= self._computation(c)
            stack += inst.operands
        return out


def numerics_dict(report: NumericsReport, top: int) -> dict:
    return {"mode": report.mode, "top": [asdict(r) for r in report.instructions[:top] if r.runs],
            "instructions_evaluated": sum(1 for r in report.instructions if r.local_error or r.total_error),
            "outputs": report.outputs, "divergences": [asdict(d) for d in report.divergences],
            "parted": report.parted, "not_evaluated": report.not_evaluated,
            "nonfinite": asdict(report.nonfinite) if report.nonfinite is not None else None}


def format_numerics(report: NumericsReport, top: int) -> str:
    paired = report.mode == "paired"
    lines = ["outputs: " + ("the run's error against the shadow, relative to the output's scale, and " if paired else "")
             + "the instructions on its path that contribute most to the outputs' error (c=: how far rounding its "
             "value moves the outputs, relative to their scale), then by local error"]
    lines.append(f"{'out':>4}  {'shape':<16} {'dtype':<5} " + (f"{'max rel':>9} {'rms rel':>9} {'ulp@scale':>9}  "
                                                                if paired else "") + "on its path")
    for o in report.outputs:
        shape = "[" + ",".join(map(str, o["shape"])) + "]"
        e = o["error"]
        errors = ""
        if paired:
            errors = (f"{e['mismatches']:>9} differ{'':>14}  " if e["mismatches"] else
                      f"{e['max_rel']:9.3g} {e['rms_rel']:9.3g} {e['max_ulps']:9.3g}  ")
            if e["nonfinite"]:
                errors += f"({e['nonfinite']} non-finite where the shadow is finite) "
        path = ", ".join(f"%{i['name']} ({i['opcode']}) " + (f"c={i['contribution']:.3g}" if i["contribution"] is not None
                                                            else f"{i['local_error']:.3g}")
                         for i in o["instructions"]) or "-"
        lines.append(f"{o['index']:>4}  {shape:<16} {o['dtype']:<5} {errors}{path}")
    shown = [r for r in report.instructions[:top] if r.runs]
    lines.append(f"top {len(shown)} instructions: by contribution (how far rounding its value to its type moves the "
                 f"outputs from the exact answer, relative to their scale; the {CONTRIBUTION_CANDIDATES} largest local "
                 "errors of the entry measured), then by local error: the error an instruction adds given exact operands "
                 + ("(its op on the shadow's operand values rounded to its operand types, against the shadow's value)"
                    if paired else "(at the run's own operands: its op against the same op in f64)")
                 + ", relative to its scale (max |exact value|)"
                 + ("; total: its value against the shadow's; inherited: the largest error its operands arrived with"
                    if paired else ""))
    lines.append(f"{'contrib':>9} {'local':>9} {'ulp@scale':>9} " + (f"{'total':>9} {'inherited':>9} " if paired else "")
                 + f"{'runs':>5}  instruction")
    for r in shown:
        nums = ("        -" if r.contribution is None else f"{r.contribution:9.3g}") + \
            f" {r.local_error:9.3g} {r.local_ulps:9.3g} "
        if paired:
            nums += f"{r.total_error or 0:9.3g} {r.inherited_error or 0:9.3g} "
        site = "  ".join(x for x in (r.op_name, r.source) if x)
        where = "" if r.computation == "" else f" in %{r.computation}"
        lines.append(f"{nums}{r.runs:>5}  %{r.name} = {r.shape} {r.opcode}{where}" + (f"  {site}" if site else ""))
    if report.divergences:
        lines.append("integer/pred values computed from floats that differ between the run and the shadow (what "
                     "follows them compares two different paths):")
        lines += [f"  {d.describe()}" for d in report.divergences]
    lines += [f"not paired from here on: {p}" for p in report.parted]
    if report.not_evaluated:
        lines.append(f"not evaluated alone ({len(report.not_evaluated)}): " + "; ".join(report.not_evaluated[:5]))
    if report.nonfinite is not None:
        lines.append("NaN and Inf: " + format_nonfinite(report.nonfinite).replace("\n", "\n  "))
    return "\n".join(lines)
