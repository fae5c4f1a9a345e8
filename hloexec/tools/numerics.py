"""Which instructions lose the accuracy (`attribute`, the `numerics` command): the program's run paired with its
shadow's (tools/shadow_runs.py) instruction by instruction, each instruction's local error (its op alone on the
shadow's operands), total and inherited error, and its contribution to the outputs' error.

Everything here runs single-participant or SPMD (`Runner`), and streams: values are looked at while the
plans hold them (Executable.run's `observe`), never kept beyond what the report needs.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from ..exec.executor import Executable, available_memory
from ..exec.shadow import Shadow, has_float, shadow_module, widen
from ..ir import opcodes
from ..ir.module import Instruction
from .bound_plans import KernelCache
from .bounds import ErrorBounds, _float, _leaves
from .compare import dtype_name
from .nonfinite import NonfiniteReport, NonfiniteTracker, StopRun
from .verdict import RULE, allowed_error, element_errors, error_stats

# the shadow runs' names, imported from here before they had a module of their own
from .shadow_runs import (
    run_memory,
    DISCRETE_BUDGET,
    Divergence,
    OutputBounds,
    Runner,
    ShadowRun,
    _Discrete,
    baseline_executable,
    executable_like,
    flatten,
    format_shadow_report,
    judge_run,
    shadow_report,
    shadow_run,
    xla_cpu_arithmetic,
)

__all__ = [
    "attribute",
    "NumericsReport",
    "InstructionErrors",
    "evaluates_local_error",
    "DISCRETE_BUDGET",
    "Divergence",
    "OutputBounds",
    "Runner",
    "ShadowRun",
    "baseline_executable",
    "executable_like",
    "flatten",
    "format_shadow_report",
    "judge_run",
    "shadow_report",
    "shadow_run",
    "xla_cpu_arithmetic",
]


# -- attribution: which instruction lost the accuracy ------------------------------------------------------------
# Ops that only move, select or compare values, and widening converts: given their typed operands they are exact,
# so their "local error" would only re-measure the rounding of their operands (charged to the producers).
EXACT_OPCODES = (
    frozenset(
        {
            "parameter",
            "constant",
            "iota",
            "tuple",
            "get-tuple-element",
            "dynamic-update-slice",
            "gather",
            "select",
            "maximum",
            "minimum",
            "abs",
            "negate",
            "clamp",
            "sign",
            "compare",
            "is-finite",
            "after-all",
            "real",
            "imag",
            "get-dimension-size",
            "set-dimension-size",
            "sort",
            "topk",
            "bitcast-convert",
            "partition-id",
            "replica-id",
        }
    )
    | opcodes.MOVEMENT
    | opcodes.PASS_THROUGH
)
# Ops evaluated elsewhere (their called computations' instructions are observed one by one) or not alone.
NOT_EVALUATED = (
    frozenset(
        {
            "fusion",
            "call",
            "while",
            "conditional",
            "async-start",
            "async-update",
            "async-done",
            "send",
            "send-done",
            "recv",
            "recv-done",
            "infeed",
            "outfeed",
            "map",
            "scan",
        }
    )
    | opcodes.COLLECTIVES
)


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
    local_error: float = 0.0  # max over runs: evaluated on exact operands rounded to its types, vs exact
    local_rms: float = 0.0
    local_ulps: float = 0.0
    total_error: float | None = None  # the run's value against the shadow's (None: no shadow run)
    inherited_error: float | None = None  # the largest error its float operands arrived with
    worst_run: str = ""
    first_seen: int = 0  # the order in which instructions first ran (ties of the ranking)
    contribution: float | None = None  # how far rounding its value moves the outputs (see _contributions)
    # paired: the largest error / what its error bound allows (verdict.allowed_error; above 1: beyond its bound)
    bound_ratio: float | None = None

    def add(self, local, total, inherited, where: str, bound_ratio: float | None = None) -> None:
        self.runs += 1
        if bound_ratio is not None:
            self.bound_ratio = max(self.bound_ratio or 0.0, bound_ratio)
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


def _bound_ratio(bounds, program_value, shadow_value) -> float | None:
    """The largest error of a program value's float leaves over what their error bounds allow (tools/bounds.py
    under the program's arithmetic, the verdict's allowed_error): above 1, beyond the bound; rounding-decided
    elements not judged. None: no float leaf."""
    worst = None
    for low, high in zip(_leaves(program_value), _leaves(shadow_value)):
        if not _float(high) or not isinstance(low, (np.ndarray, np.generic)) or np.shape(low) != np.shape(high):
            continue
        exact = np.asarray(high)
        with np.errstate(all="ignore"):  # (the verdict's errors: an infinity the exact value rounds to is none)
            error, _ = element_errors(np.asarray(low), exact)
            ratio = error / allowed_error(bounds.of(high), np.abs(exact), np.asarray(low).dtype, RULE)
        judged = np.isfinite(exact) & ~bounds.decided_of(high) & ~np.isnan(ratio)
        if judged.any():
            worst = max(worst or 0.0, float(np.max(ratio[judged])))
    return worst


class _Attribution:
    """Per-instruction error statistics, streamed: one record per instruction, updated each time it runs."""

    def __init__(self, local_context, shadow: Shadow):
        self.kernel = KernelCache(local_context)  # where the instructions evaluated alone are prepared
        self.shadow = shadow
        self.records: dict[tuple[str, str], InstructionErrors] = {}
        self.lock = threading.Lock()
        self.errors: list[str] = []

    def record(self, device, run_index, inst, local, total, inherited, bound_ratio=None) -> None:
        key = (inst.computation.name if inst.computation is not None else "", inst.name)
        with self.lock:
            r = self.records.get(key)
            if r is None:
                r = self.records[key] = InstructionErrors(
                    inst.name,
                    inst.opcode,
                    key[0],
                    inst.shape.to_text(layout=False),
                    inst.metadata.get("op_name", ""),
                    inst.source_location,
                    first_seen=len(self.records),
                )
            r.add(
                local,
                total,
                inherited,
                f"device {device}, run {run_index}" if device else f"run {run_index}",
                bound_ratio,
            )

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
            while device not in self.posted and not self.program_done and device not in self.parted and not self.failed:
                self.cond.wait()
            if self.failed:
                raise StopRun("the program's run failed")
            item = self.posted.pop(device, None)
            self.cond.notify_all()
            if device in self.parted:
                return None
            if item is None or (item[0].name, _comp(item[0])) != (inst.name, _comp(inst)):
                there = f"%{item[0].name} in %{_comp(item[0])}" if item is not None else "its end"
                self.parted[device] = (
                    f"device {device}: the shadow ran %{inst.name} in %{_comp(inst)} where the program ran {there}"
                )
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

    mode: str  # "paired": with the shadow's values; "local": at the run's own
    instructions: list[InstructionErrors]
    outputs: list[dict]
    divergences: list[Divergence] = field(default_factory=list)
    parted: list[str] = field(default_factory=list)
    not_evaluated: list[str] = field(default_factory=list)
    nonfinite: NonfiniteReport | None = None
    local_errors_of: str = ""  # SPMD, local mode: the one participant whose local errors were measured


def attribute(
    exe: Executable,
    inputs,
    runner: Runner | None = None,
    *,
    mode: str = "auto",
    reductions: str | None = "per-step",
    say=None,
) -> NumericsReport:
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
        needed = run_memory(program, inputs, runner)["total"] + run_memory(shadow_exe, inputs, runner, shadow)["total"]
        limit = exe.max_memory if exe.max_memory is not None else available_memory()
        mode = "paired" if limit is None or needed <= limit else "local"
        if mode == "local" and say is not None and limit is not None:  # local: there is a limit
            say(
                f"the run and its shadow side by side need {needed / 2**30:.2f} GiB, {limit / 2**30:.2f} GiB "
                "available: local errors only, at the run's own operands (no shadow run)"
            )
    if mode == "paired" and runner.spmd is not None:  # checked together above: neither run alone refuses
        runner = Runner({**runner.spmd, "check_memory": False})
    if mode == "local" and runner.spmd is not None:  # one participant observed; the others as a plain run
        program = executable_like(
            exe, exe.module, **{**options, "use_numba": exe.context.use_numba, "fuse_chains": False}
        )
        runner = Runner({**runner.spmd, "observed": (LOCAL_PARTICIPANT,)})
    seen = _Seen(exe.module, shadow)
    if mode == "local":
        attribution = _Attribution(shadow_exe.context, shadow)
        outputs = _local_run(program, shadow, inputs, runner, attribution, seen)
        shadow_outputs, pairing = None, None
    else:
        attribution = _Attribution(program.context, shadow)
        pairing = _Pairing()
        # every value's error bound under the program's arithmetic: an instruction beyond it is named (one
        # participant: an SPMD run's bounds need an observer per participant, whose collectives exchange them)
        bounds = (
            ErrorBounds(
                shadow, shadow_exe.context, replace(program.options.device, reductions=program.options.reductions)
            )
            if runner.spmd is None
            else None
        )
        outputs, shadow_outputs = _paired_runs(
            program, shadow_exe, shadow, inputs, runner, attribution, pairing, seen, bounds
        )
    records = sorted(attribution.records.values(), key=lambda r: (-r.local_error, r.first_seen))
    if shadow_outputs is not None and runner.spmd is None:
        records = _contributions(exe, inputs, records, shadow_outputs)
    return NumericsReport(
        mode,
        records,
        _output_table(exe.module, outputs, shadow_outputs, records),
        seen.watch.divergences(),
        list(pairing.parted.values()) if pairing else [],
        attribution.errors,
        seen.tracker.report(outputs),
        f"participant {LOCAL_PARTICIPANT} of {runner.spmd['partitions'] * runner.spmd['replicas']}"
        if mode == "local" and runner.spmd is not None
        else "",
    )


class _Seen:
    """What `attribute` follows in the program's run besides the errors: the NaN/Inf origins (`tracker`), the
    discrete values that part from the shadow's (`watch`), and how many times each instruction ran so far."""

    def __init__(self, module, shadow: Shadow):
        self.tracker = NonfiniteTracker(module)
        self.watch = _Discrete(shadow.discrete)
        self.counts: dict[tuple, int] = {}

    def run_index(self, device, inst) -> int:
        """The how-manyth run of `inst` on `device` this is (1 the first)."""
        k = (device, _comp(inst), inst.name)
        self.counts[k] = self.counts.get(k, 0) + 1
        return self.counts[k]


LOCAL_PARTICIPANT = 0  # the participant of an SPMD run whose local errors are measured (local mode)


def _local_run(
    program: Executable, shadow: Shadow, inputs, runner: Runner, attribution: _Attribution, seen: _Seen
) -> list:
    """The program's run alone, each instruction's local error at its own operands; its outputs. SPMD: the runner
    observes participant LOCAL_PARTICIPANT alone (every participant runs the same instructions on its shard: one
    runs op by op with the f64 evaluations, the others unobserved), its local errors and NaN/Inf origins."""
    by_name = {(c.name, i.name): i for c in shadow.module.computations for i in c.instructions}

    def observe(device, inst, value, operands):
        seen.tracker.observe(device, inst, value, operands)
        if not evaluates_local_error(inst) or inst.name in shadow.pinned:
            return
        twin = by_name.get((_comp(inst), inst.name))
        if twin is None:
            return
        wide = [widen(v, o.shape) for v, o in zip(operands, inst.operands)]
        exact = attribution.evaluate_exact(twin, wide)
        local = _local_stats(value, exact) if exact is not None else None
        attribution.record(device, seen.run_index(device, inst), inst, local, None, None)

    return runner.run(program, inputs, observe, observe_operands=True)


def _paired_runs(
    program: Executable,
    shadow_exe: Executable,
    shadow: Shadow,
    inputs,
    runner: Runner,
    attribution: _Attribution,
    pairing: _Pairing,
    seen: _Seen,
    bounds: ErrorBounds | None,
) -> tuple[list, list]:
    """The program's run (a thread of its own) and its shadow's side by side, each program value paired with the
    shadow's and its errors recorded, with how far past its error bound (`bounds`, fed by the shadow's values; None:
    not measured) it is; (the program's outputs, the shadow's)."""
    helpers = _helper_names(shadow)
    totals = _Totals()

    def idle(executable):
        communicator = executable.context.device.communicator
        return getattr(communicator, "idle", _no_wait)

    def on_program(device, inst, value, operands):
        seen.tracker.observe(device, inst, value, operands)
        pairing.post(device, (inst, value, operands), idle(program))

    def on_shadow(device, inst, value, operands):
        if bounds is not None:
            bounds(inst, value, operands)
        if (_comp(inst), inst.name) in helpers:
            return
        item = pairing.take(device, inst, idle(shadow_exe))
        if item is None:
            return
        low_inst, low_value, low_operands = item
        k = seen.run_index(device, low_inst)
        if low_inst.name in seen.watch.names:
            seen.watch.compare(device, low_inst, k, low_value, value)
        total = totals.of(low_value, value)
        # a pinned instruction's shadow twin widens its `.own` copy: its operands are not the program's
        inherited = (
            None
            if low_inst.name in shadow.pinned
            else max((totals.of(lo, s) for lo, s in zip(low_operands, operands)), default=0.0)
        )
        local = attribution.evaluate(low_inst, operands, value, narrow_operands=True)
        attribution.record(
            device,
            k,
            low_inst,
            local,
            total,
            inherited,
            _bound_ratio(bounds, low_value, value) if bounds is not None else None,
        )

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
        shadow_outputs = runner.run(shadow_exe, runner.shadow_inputs(shadow, inputs), on_shadow, observe_operands=True)
    except BaseException:
        pairing.finish(failed=True)  # the program's run stops at its next instruction
        thread.join()
        if "error" in result and not _stopped(result["error"]):
            raise result["error"] from None
        raise
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["outputs"], shadow_outputs


CONTRIBUTION_CANDIDATES = 16  # instructions (largest local errors first) whose contribution is measured


def _contributions(exe: Executable, inputs, records: list, shadow_outputs: list) -> list:
    """`records` ranked by contribution to the outputs' error: for the entry instructions with the largest local
    errors, the shadow run again with that one value rounded to its type, and the largest change of an output
    relative to the output's scale. A local error is relative to the instruction's own scale: a value whose
    exact answer is ~0 (a sum that cancels) has a huge one and may contribute nothing; a bf16 rounding a small
    one that makes the outputs' error. Measured ones first (largest contribution first), then the rest."""
    entry = exe.module.entry
    measured: list = []  # of records
    for r in records:
        if len(measured) == CONTRIBUTION_CANDIDATES:
            break
        inst = entry.by_name.get(r.name) if r.computation == entry.name else None
        if (
            inst is None
            or inst.opcode == "parameter"
            or inst.shape.is_tuple
            or not r.local_error
            or not inst.shape.element_type.is_float
        ):
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


def _stopped(error: BaseException) -> bool:
    """Whether `error` is a StopRun (or an SPMD participant's failure caused by one)."""
    return isinstance(error, StopRun) or isinstance(error.__cause__, StopRun)


def _no_wait():
    import contextlib

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
        row = {
            "index": i,
            "shape": list(np.shape(value)),
            "dtype": dtype_name(np.asarray(value).dtype),
            "error": asdict(error_stats(value, shadow_outputs[i])) if shadow_outputs is not None else None,
            "instructions": [
                {"name": r.name, "opcode": r.opcode, "local_error": r.local_error, "contribution": r.contribution}
                for r in top
            ],
        }
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
