"""Where NaN and Inf come from: `hloexec run --find-nonfinite` (and part of `hloexec numerics`).

One observed run (Executable.run's `observe`, every instruction inside fusions and loops too) checks each
float value as it is made. An *origin* is an instruction whose value holds a NaN none of its operands holds,
or an infinity none of its operands holds. Origins are listed in execution order (SPMD: by step, then device)
with their kind, operand ranges, op_name and source line, and the path to the outputs they reach:

- `overflow`, `division by zero`, `log of zero`: an infinity from finite operands;
- `invalid`: a NaN from finite operands (0/0, sqrt or log of a negative number);
- `NaN from infinities`: inf - inf, 0 * inf..., naming where those infinities came from;
- `intentional`: an infinity or a NaN written in the program (a -inf attention mask, a max-reduce init, a NaN
  fill value): not an origin by itself; an infinity is listed when it later turns into NaN, a NaN when it
  reaches an output.

Non-finite values are followed from value to value (a -inf constant through a broadcast and a select), so a
NaN made from infinities says which origin (or intentional constant, or input) they came from.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from ..errors import ExecutionError
from ..ir.module import Instruction, Module
from ..ir.opcodes import COLLECTIVES
from ..kernels.elementwise import ELEMENTWISE_OPS
from .shadow_runs import Runner, executable_like


class StopRun(BaseException):
    """Raised from an observer to end a run early (--stop-at-first); BaseException: no op handler turns it into
    an ExecutionError."""


@dataclass
class OperandRange:
    name: str
    min: float | None
    max: float | None
    nan: int
    inf: int


@dataclass
class Origin:
    name: str
    opcode: str
    kind: str
    computation: str
    shape: str
    device: int
    run: int  # the how-many-th time this instruction ran on that device (loop iterations)
    step: int  # the how-many-th instruction the device ran: execution order
    nan: int
    inf: int
    first_index: list[int]
    operands: list[OperandRange]
    op_name: str
    source: str
    inside: list[str] = field(default_factory=list)  # the fusions/calls/loops that run its computation
    infinities_from: list[str] = field(default_factory=list)  # for NaN from infinities: their origins
    outputs: list[int] = field(default_factory=list)  # outputs it reaches that hold non-finite values
    path: list[str] = field(default_factory=list)  # instructions from it to the first of those outputs
    runs: int = 1  # times it made non-finite values (loop iterations, devices)
    devices: list[int] = field(default_factory=list)


def _float_leaves(value) -> list:
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in _float_leaves(v)]
    if isinstance(value, (np.ndarray, np.generic)) and (value.dtype.kind in "fc" or "float" in value.dtype.name):
        return [np.asarray(value)]
    return []


def _counts(a: np.ndarray) -> tuple[int, int]:
    """(NaN count, infinity count) of a float array (complex: NaN in either part counts as NaN)."""
    finite = np.isfinite(a)
    if finite.all():
        return 0, 0
    nan = int(np.count_nonzero(np.isnan(a)))
    return nan, int(a.size - np.count_nonzero(finite)) - nan


# Instructions whose value is their called computation's: its instructions are the ones observed as origins.
_CONTAINERS = frozenset({"fusion", "call", "while", "conditional", "async-start", "async-update", "async-done"})


class NonfiniteTracker:
    """An observer (`observe(device, inst, value, operands)`) finding the origins of NaN and Inf.

    What it knows of each value (NaN and Inf counts, which origins its infinities came from) is kept per
    producing instruction and device (its latest run), and for values entering a computation as parameters,
    by the array's identity (the caller's operand is the same object)."""

    def __init__(self, module: Module, stop_at_first: bool = False):
        self.module = module
        self.stop_at_first = stop_at_first
        self.origins: dict[tuple[str, str], Origin] = {}
        self.intentional: dict[tuple[str, str], Origin] = {}
        self.steps: dict[int, int] = {}
        self.runs: dict[tuple, int] = {}
        self.facts: dict[tuple, list] = {}  # (device, computation, name) -> [(counts, provenance)] per float leaf
        self.by_identity: dict[int, tuple] = {}  # id(array) -> (weakref, counts, provenance)
        self.lock = threading.Lock()

    def _operand_facts(self, device, operand: Instruction, leaves: list) -> list:
        """[(counts, provenance)] of an operand's float leaves."""
        if operand.opcode != "parameter":
            known = self.facts.get((device, operand.computation.name if operand.computation else "", operand.name))
            if known is not None and len(known) == len(leaves):
                return known
        out = []
        for leaf in leaves:
            entry = self.by_identity.get(id(leaf))
            if entry is not None and entry[0]() is leaf:
                out.append(entry[1:])
            else:
                counts = _counts(leaf)
                out.append((counts, frozenset({("input", operand.name)}) if any(counts) else frozenset()))
        return out

    def _remember(self, device, inst, leaves, facts) -> None:
        self.facts[(device, inst.computation.name if inst.computation else "", inst.name)] = facts
        for leaf, (counts, provenance) in zip(leaves, facts):
            if not (counts[0] or counts[1]):
                continue
            key = id(leaf)

            def forget(_, key: int = key) -> None:
                self.by_identity.pop(key, None)

            try:
                ref = weakref.ref(leaf, forget)
            except TypeError:
                continue
            self.by_identity[key] = (ref, counts, provenance)

    def observe(self, device: int, inst: Instruction, value, operands) -> None:
        with self.lock:
            stop = self._observe(device, inst, value, operands)
        if stop:
            raise StopRun(f"first non-finite origin: %{inst.name}")

    def _observe(self, device, inst, value, operands) -> bool:
        step = self.steps[device] = self.steps.get(device, 0) + 1
        comp = inst.computation.name if inst.computation is not None else ""
        run = self.runs[(device, comp, inst.name)] = self.runs.get((device, comp, inst.name), 0) + 1
        leaves = _float_leaves(value)
        counts = [_counts(v) for v in leaves]
        if not any(n or i for n, i in counts):
            self._remember(device, inst, leaves, [(c, frozenset()) for c in counts])
            return False
        if inst.opcode in _CONTAINERS:  # its called computations' roots say where its values came from
            inner = frozenset().union(
                *(p for c in inst.called_computations for _, p in self.facts.get((device, c.name, c.root.name), ()))
            )
            self._remember(device, inst, leaves, [(c, inner if any(c) else frozenset()) for c in counts])
            return False
        ops = [
            (o, leaf, facts)
            for o, v in zip(inst.operands, operands)
            for leaf, facts in zip(_float_leaves(v), self._operand_facts(device, o, _float_leaves(v)))
        ]
        if inst.opcode in COLLECTIVES:  # its values come from every participant's operands
            ops += [
                (o, leaf, facts)
                for o, v in zip(inst.operands, operands)
                for d, *site in list(self.facts)
                if d != device and tuple(site) == (comp, o.name)
                for leaf, facts in zip(_float_leaves(v), self.facts[(d, comp, o.name)])
            ]
        new_inf, new_nan, invalid, carried, nan_sources, first = _new_nonfinite(inst, leaves, ops)
        kind = None
        if not inst.operands and (new_nan or new_inf):
            kind = "intentional"  # a constant written with NaN or an infinity
        elif new_nan:
            kind = "invalid" if invalid else "NaN from infinities"
        elif new_inf:
            kind = _inf_kind(inst)
        key = (comp, inst.name)
        if kind is not None:
            table = self.intentional if kind == "intentional" else self.origins
            origin = table.get(key)
            if origin is None:
                table[key] = self._origin(inst, kind, device, run, step, leaves, ops, nan_sources, first)
            else:
                origin.runs += 1
                if device not in origin.devices:
                    origin.devices.append(device)
        provenance = carried | (frozenset({key}) if new_inf or new_nan else frozenset())
        self._remember(device, inst, leaves, [(c, provenance if any(c) else frozenset()) for c in counts])
        return kind not in (None, "intentional") and self.stop_at_first

    def _origin(self, inst, kind, device, run, step, leaves, ops, nan_sources, index) -> Origin:
        if index is None:
            first = next(v for v in leaves if not np.isfinite(v).all())
            index = [int(i) for i in np.unravel_index(int(np.flatnonzero(~np.isfinite(first))[0]), first.shape)]
        operands = []
        for o, leaf, ((n, i), _) in ops:
            finite = leaf[np.isfinite(leaf)]
            finite = np.abs(finite) if finite.dtype.kind == "c" else finite
            operands.append(
                OperandRange(
                    o.name,
                    float(finite.min()) if finite.size else None,
                    float(finite.max()) if finite.size else None,
                    n,
                    i,
                )
            )
        nan = sum(_counts(v)[0] for v in leaves)
        inf = sum(_counts(v)[1] for v in leaves)
        origin = Origin(
            inst.name,
            inst.opcode,
            kind,
            inst.computation.name if inst.computation else "",
            inst.shape.to_text(layout=False),
            device,
            run,
            step,
            nan,
            inf,
            index,
            operands,
            inst.metadata.get("op_name", ""),
            inst.source_location,
            devices=[device],
        )
        origin.infinities_from = sorted(
            f"%{name}" if where != "input" else f"input %{name}" for where, name in nan_sources
        )
        return origin

    def report(self, outputs: list) -> NonfiniteReport:
        """The origins in execution order, with the outputs they reach (`outputs`: the run's flattened outputs),
        the intentional infinities that turned into NaN, and which outputs hold non-finite values."""
        bad_outputs = [i for i, o in enumerate(outputs) if any(sum(_counts(leaf)) for leaf in _float_leaves(o))]
        paths = _Paths(self.module)
        origins = sorted(self.origins.values(), key=lambda o: (o.step, o.device))
        used = {name for o in origins if o.kind == "NaN from infinities" for name in o.infinities_from}
        root = self.module.entry.root
        reaching = frozenset().union(
            *(
                p
                for (d, c, n), facts in self.facts.items()
                if (c, n) == (self.module.entry.name, root.name)
                for _, p in facts
            )
        )
        # an intentional infinity is listed when it turns into NaN; an intentional NaN when it reaches an output
        intentional = [
            o
            for o in self.intentional.values()
            if f"%{o.name}" in used or (o.nan and (o.computation, o.name) in reaching)
        ]
        for o in origins + intentional:
            o.inside = paths.callers(o.computation)
            o.outputs, o.path = paths.to_outputs(o.computation, o.name, set(bad_outputs))
        return NonfiniteReport(origins, intentional, bad_outputs, len(self.intentional))


@dataclass
class NonfiniteReport:
    origins: list[Origin]
    intentional: list[Origin]  # intentional infinities that turned into NaN, NaNs that reach outputs
    outputs: list[int]  # outputs holding NaN or Inf
    intentional_seen: int = 0  # instructions writing NaN or infinities (constants), reported or not
    stopped: bool = False  # --stop-at-first ended the run


def _new_nonfinite(inst: Instruction, leaves: list, ops: list):
    """(new infinities?, new NaNs?, some new NaN from finite operands?, provenance carried to the value,
    provenance of the infinities new NaNs came from, index of the first new element or None). Elementwise ops are judged element by element (an
    infinity made where the operands are finite is new even if they hold others elsewhere); other ops by
    whole values."""
    if (
        inst.opcode in ELEMENTWISE_OPS
        and len(leaves) == 1
        and all(leaf.shape in (leaves[0].shape, ()) for _, leaf, _ in ops)
    ):
        out = leaves[0]
        shape = out.shape
        op_nan = [np.broadcast_to(np.isnan(leaf), shape) for _, leaf, _ in ops]
        op_inf = [np.broadcast_to(np.isinf(leaf), shape) for _, leaf, _ in ops]
        any_nan = np.logical_or.reduce(op_nan) if ops else np.zeros(shape, bool)
        any_inf = np.logical_or.reduce(op_inf) if ops else np.zeros(shape, bool)
        out_nan, out_inf = np.isnan(out), np.isinf(out)
        made_nan = out_nan & ~any_nan
        made_inf = out_inf & ~any_inf & ~any_nan
        carried = frozenset().union(
            *(
                p
                for (_, _, (_, p)), inf, nan in zip(ops, op_inf, op_nan)
                if (inf & out_inf).any() or (nan & out_nan).any()
            )
        )
        nan_sources = frozenset().union(*(p for (_, _, (_, p)), inf in zip(ops, op_inf) if (inf & made_nan).any()))
        new = made_nan | made_inf
        first = [int(i) for i in np.unravel_index(int(np.argmax(new)), shape)] if new.any() else None
        return (
            bool(made_inf.any()),
            bool(made_nan.any()),
            bool((made_nan & ~any_inf).any()),
            carried,
            nan_sources,
            first,
        )
    nan = any(_counts(v)[0] for v in leaves)
    inf = any(_counts(v)[1] for v in leaves)
    nan_in = any(c[0] for _, _, (c, _) in ops)
    inf_in = any(c[1] for _, _, (c, _) in ops)
    new_nan = nan and not nan_in
    carried = frozenset().union(*(p for _, _, (c, p) in ops if any(c))) if nan or inf else frozenset()
    nan_sources = frozenset().union(*(p for _, _, ((_, i), p) in ops if i)) if new_nan else frozenset()
    return inf and not inf_in and not nan_in, new_nan, new_nan and not inf_in, carried, nan_sources, None


def _inf_kind(inst: Instruction) -> str:
    return {"divide": "division by zero", "log": "log of zero", "power": "overflow"}.get(inst.opcode, "overflow")


class _Paths:
    """Static paths through the module: from an instruction, through users, up through the fusions, calls and
    loops that run its computation, to the entry ROOT's outputs (flattened, depth first)."""

    def __init__(self, module: Module):
        self.module = module
        self.comps = {c.name: c for c in module.computations}
        self.callers_of: dict[str, list[Instruction]] = {}
        for comp in module.computations:
            for inst in comp.instructions:
                if inst.opcode in ("fusion", "call", "while", "conditional", "async-start"):
                    for c in inst.called_computations:
                        self.callers_of.setdefault(c.name, []).append(inst)
        root = module.entry.root
        self.output_of: dict[tuple[int, int], list[int]] = {}
        self._outputs(root, [], iter(range(1 << 62)))

    def _outputs(self, inst, where, counter) -> None:
        if inst.opcode == "tuple" and inst.shape.is_tuple and inst.computation is self.module.entry:
            for k, o in enumerate(inst.operands):
                if o.shape.is_tuple and o.opcode == "tuple":
                    self._outputs(o, where + [k], counter)
                else:
                    for _ in o.shape.leaves():
                        self.output_of.setdefault((id(inst), k), []).append(next(counter))
        else:
            for _ in inst.shape.leaves():
                self.output_of.setdefault((id(inst), -1), []).append(next(counter))

    def callers(self, comp_name: str) -> list[str]:
        return [f"%{i.name} ({i.opcode})" for i in self.callers_of.get(comp_name, [])]

    def to_outputs(self, comp_name: str, name: str, wanted: set) -> tuple[list[int], list[str]]:
        """(outputs reached among `wanted`, the shortest path to the first of them)."""
        comp = self.comps.get(comp_name)
        if comp is None or name not in comp.by_name:
            return [], []
        start = comp.by_name[name]
        parent: dict[int, Instruction | None] = {id(start): None}
        queue, reached = [start], []
        first_path: list[str] = []
        while queue:
            inst = queue.pop(0)
            nexts = list(inst.users)
            if inst.is_root:
                if inst.computation is self.module.entry:
                    outs = self.output_of.get((id(inst), -1), [])
                    hit = [o for o in outs if o in wanted]
                    if hit and not first_path:
                        first_path = self._path(inst, parent)
                    reached += hit
                nexts += self.callers_of.get(inst.parent.name, [])
            for user in nexts:
                if user is self.module.entry.root and user.opcode == "tuple":
                    for k, o in enumerate(user.operands):
                        if o is inst:
                            hit = [x for x in self.output_of.get((id(user), k), []) if x in wanted]
                            if hit and not first_path:
                                first_path = self._path(inst, parent) + [f"output {hit[0]}"]
                            reached += hit
                    continue
                if id(user) not in parent:
                    parent[id(user)] = inst
                    queue.append(user)
        return sorted(set(reached)), first_path

    @staticmethod
    def _path(inst, parent) -> list[str]:
        path = []
        while inst is not None:
            path.append(f"%{inst.name}")
            inst = parent[id(inst)]
        return path[::-1]


def find_nonfinite(exe, inputs, runner=None, stop_at_first: bool = False) -> NonfiniteReport:
    """One observed run of `exe` (op by op) on `inputs` (per device for an SPMD `runner`): the origins of its NaN
    and Inf values. With `stop_at_first` the run ends at the first origin (its outputs are then not known)."""
    runner = runner or Runner()
    tracker = NonfiniteTracker(exe.module, stop_at_first)
    observed = executable_like(exe, exe.module, use_numba=False)
    try:
        outputs = runner.run(observed, inputs, tracker.observe, observe_operands=True)
    except StopRun:
        outputs = None
    except ExecutionError as e:
        if not isinstance(e.__cause__, StopRun):
            raise
        outputs = None
    report = tracker.report(outputs or [])
    report.stopped = outputs is None
    return report


def format_report(report: NonfiniteReport) -> str:
    lines = []
    if not report.origins:
        lines.append(
            "no NaN or Inf made"
            + (
                f" (intentional infinities written in the program: {report.intentional_seen}, none turned into NaN)"
                if report.intentional_seen
                else ""
            )
        )
    for k, o in enumerate(report.origins + report.intentional, 1):
        label = (
            o.kind
            if o.kind != "intentional"
            else "NaN written in the program, reaching outputs"
            if o.nan
            else "intentional infinity that turns into NaN"
        )
        where = f" in %{o.computation}" + (f" (run by {', '.join(o.inside)})" if o.inside else "")
        device = f"device {o.device}, " if len(o.devices) > 1 or o.device else ""
        lines.append(f"{k}. %{o.name} = {o.shape} {o.opcode}{where}: {label}")
        lines.append(
            f"   {device}step {o.step}, run {o.run}: {o.nan} NaN, {o.inf} Inf, first at "
            f"[{','.join(map(str, o.first_index))}]"
            + (f"; made again {o.runs - 1} times" if o.runs > 1 else "")
            + (f" on devices {o.devices}" if len(o.devices) > 1 else "")
        )
        for r in o.operands:
            rng = f"[{r.min:.6g}, {r.max:.6g}]" if r.min is not None else "no finite values"
            extra = ", ".join(f"{n} {w}" for n, w in ((r.nan, "NaN"), (r.inf, "Inf")) if n)
            lines.append(f"   operand %{r.name}: {rng}" + (f" ({extra})" if extra else ""))
        if o.infinities_from:
            lines.append(f"   infinities from: {', '.join(o.infinities_from)}")
        if o.op_name or o.source:
            lines.append(f"   {o.op_name}" + (f"  {o.source}" if o.source else ""))
        if o.outputs:
            lines.append(f"   reaches outputs {o.outputs}: " + " -> ".join(o.path))
        elif not report.stopped:
            lines.append("   reaches no output with non-finite values")
    unused = report.intentional_seen - len(report.intentional)
    if unused and report.origins:
        lines.append(
            f"{unused} constant{'s' if unused != 1 else ''} with NaN or infinities (a -inf mask, a max-reduce "
            "init): intentional, not origins"
            + ("" if report.stopped else "; none turns into NaN or reaches an output as NaN")
        )
    if report.outputs:
        lines.append(f"outputs holding NaN or Inf: {report.outputs}")
    if report.stopped:
        lines.append("stopped at the first origin (--stop-at-first)")
    return "\n".join(lines)
