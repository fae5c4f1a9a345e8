"""`hloexec collectives`: every collective of a module, its groups as device ids, its bytes, the traffic of its
algorithm and an estimated time on a named link; totals per kind and per group; the critical ones.

Groups are resolved as the SPMD runs resolve them (hloexec.ops.collectives.participants, XLA's
GetParticipatingDevicesGroups) for every device of `device_counts`. Nothing runs. The models and the link
figures are in hloexec.tools.costmodel. Collectives in called computations (while bodies, calls, branches)
are listed once per call site, as `hloexec stats` counts them; a while body's trip count is not in the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..exec.context import Device
from ..exec.plan import schedule
from ..options import MOST_DESCRIBED
from ..spmd import device_counts
from ..ir.module import Computation, Instruction, Module
from ..ops.collectives import group_mode, groups_of
from . import costmodel
from .opname import short, where
from .stats import Walk, _ranges, human_bytes


@dataclass
class Collective:
    inst: Instruction
    kind: str
    groups: list[list[int]]  # device ids; for a permute, the (source, target) pairs
    bytes: int  # per participating device: the buffer (the gathered result for all-gather)
    sent: list[float]  # per device, by the algorithm model
    received: list[float]
    steps: int
    seconds: float  # the model's time on the link
    context: str  # the computation it is in ("" for the entry)
    overlap_seconds: float | None = None  # compute scheduled between an async start and its done
    done: Instruction | None = None

    @property
    def exposed_seconds(self) -> float:
        return max(self.seconds - (self.overlap_seconds or 0.0), 0.0)

    @property
    def group_size(self) -> int:
        return 2 if self.kind == "collective-permute" else max((len(g) for g in self.groups), default=1)

    def to_dict(self) -> dict:
        return {
            **where(self.inst),
            "kind": self.kind,
            "groups": self.groups,
            "group_size": self.group_size,
            "bytes": self.bytes,
            "sent_bytes": self.sent,
            "received_bytes": self.received,
            "steps": self.steps,
            "seconds": self.seconds,
            "async": self.done is not None,
            "done": self.done.name if self.done else None,
            "overlap_seconds": self.overlap_seconds,
            "exposed_seconds": self.exposed_seconds,
            "context": self.context,
        }


@dataclass
class CollectivesReport:
    file: str
    module: str
    partitions: int
    replicas: int
    note: str | None
    link: costmodel.Link
    chip: costmodel.Chip
    collectives: list[Collective] = field(default_factory=list)

    @property
    def devices(self) -> int:
        return self.partitions * self.replicas

    def totals(self, key) -> dict:
        out: dict = {}
        for c in self.collectives:
            t = out.setdefault(
                key(c), {"count": 0, "bytes": 0, "sent_bytes": 0.0, "seconds": 0.0, "exposed_seconds": 0.0}
            )
            t["count"] += 1
            t["bytes"] += c.bytes
            t["sent_bytes"] += max(c.sent, default=0.0)
            t["seconds"] += c.seconds
            t["exposed_seconds"] += c.exposed_seconds
        return out

    def critical(self, top: int = 5) -> list[Collective]:
        """The collectives whose time is not hidden behind compute (all of a synchronous one), longest first."""
        return sorted(self.collectives, key=lambda c: -c.exposed_seconds)[:top]

    def to_dict(self) -> dict:
        return {
            "file": self.file,
            "module": self.module,
            "partitions": self.partitions,
            "replicas": self.replicas,
            "devices": self.devices,
            "note": self.note,
            "link": self.link.to_dict(),
            "chip": self.chip.to_dict(),
            "model": MODEL,
            "collectives": [c.to_dict() for c in self.collectives],
            "total_bytes": sum(c.bytes for c in self.collectives),
            "total_seconds": sum(c.seconds for c in self.collectives),
            "exposed_seconds": sum(c.exposed_seconds for c in self.collectives),
            "by_kind": self.totals(lambda c: c.kind),
            "by_group": self.totals(lambda c: groups_text(c)),
            "critical": [c.inst.name for c in self.critical()],
        }


MODEL = (
    "ring algorithms (all-reduce 2(n-1) steps sending 2(n-1)/n of the buffer per device; all-gather, "
    "reduce-scatter, all-to-all n-1 steps and (n-1)/n; broadcast n-1 steps and the buffer once; permute one "
    "send); time = base latency + steps x link latency + bytes sent / link bandwidth (NCCL's model)"
)


def collectives_report(
    module: Module,
    file: str = "",
    partitions: int | None = None,
    replicas: int | None = None,
    link: str = costmodel.DEFAULT_LINK,
    chip: str = costmodel.DEFAULT_CHIP,
    bandwidth: float | None = None,
    latency: float | None = None,
) -> CollectivesReport:
    P, R, note = device_counts(module, partitions, replicas, MOST_DESCRIBED)
    chosen = costmodel.LINKS[link]
    if bandwidth is not None or latency is not None:
        chosen = costmodel.Link(
            chosen.name + " (overridden)",
            bandwidth or chosen.bandwidth,
            chosen.latency if latency is None else latency,
            chosen.source + "; overridden on the command line",
        )
    report = CollectivesReport(file, module.name, P, R, note, chosen, costmodel.CHIPS[chip])
    devices = [Device(d // P, d % P, R, P) for d in range(P * R)]
    walk = Walk()
    _walk(module.entry, "", report, devices, walk, set())
    return report


def _walk(comp: Computation, context: str, report: CollectivesReport, devices, walk: Walk, seen: set) -> None:
    order = schedule(comp)
    position = {id(inst): i for i, inst in enumerate(order)}
    for inst in order:
        target = _wrapped(inst)
        kind = costmodel.collective_kind(target)
        if kind is not None:
            c = _collective(target, kind, report, devices, context)
            c.inst = inst if inst is not target else target
            done = next((u for u in inst.users if u.opcode.endswith("-done")), None)
            if inst.opcode.endswith("-start") and done is not None:
                c.done = done
                between = order[position[id(inst)] + 1 : position.get(id(done), position[id(inst)])]
                c.overlap_seconds = sum(costmodel.compute_cost(i, report.chip, walk)[2] for i in between)
            report.collectives.append(c)
        elif inst.opcode not in ("fusion", "async-update", "async-done") and id(inst) not in seen:
            for called in inst.called_computations:
                if any(costmodel.collective_kind(i) or i.called_computations for i in called.instructions):
                    _walk(called, f"{inst.opcode} %{inst.name}", report, devices, walk, seen | {id(inst)})


def _wrapped(inst: Instruction) -> Instruction:
    """The collective an async-start wraps (its called computation's root), else the instruction itself."""
    if inst.opcode == "async-start" and "calls" in inst.called:
        return inst.called_computation("calls").root
    return inst


def _collective(inst: Instruction, kind: str, report: CollectivesReport, devices, context: str) -> Collective:
    size = costmodel.buffer_bytes(inst)
    n_dev = len(devices)
    sent, received = [0.0] * n_dev, [0.0] * n_dev
    if kind == "collective-permute":
        pairs = []
        cross_partition = group_mode(inst) == "cross_partition"
        for s, t in inst.attr("source_target_pairs", ()):
            for d in devices:
                if cross_partition and d.partition_id == 0:
                    pairs.append([d.replica_id * report.partitions + s, d.replica_id * report.partitions + t])
                elif not cross_partition and d.replica_id == 0:
                    pairs.append([s * report.partitions + d.partition_id, t * report.partitions + d.partition_id])
        for s, t in pairs:
            if s != t and s < n_dev and t < n_dev:
                sent[s] += size
                received[t] += size
        steps, _ = costmodel.ring_model(kind, size, 2)
        seconds = costmodel.collective_time(kind, size, 2, report.link) if any(sent) else 0.0
        return Collective(inst, kind, pairs, size, sent, received, steps if any(sent) else 0, seconds, context)
    groups = groups_of(inst, devices)
    biggest = max((len(g) for g in groups), default=1)
    for group in groups:
        n = len(group)
        steps, per_device = costmodel.ring_model(kind, size, n)
        for rank, d in enumerate(group):
            if d >= n_dev:
                continue
            if kind == "collective-broadcast":  # pipelined ring from the first: the last only receives
                sent[d] = float(size) if rank < n - 1 else 0.0
                received[d] = float(size) if rank > 0 else 0.0
            else:
                sent[d] = received[d] = per_device
    steps, _ = costmodel.ring_model(kind, size, biggest)
    return Collective(
        inst,
        kind,
        groups,
        size,
        sent,
        received,
        steps,
        costmodel.collective_time(kind, size, biggest, report.link),
        context,
    )


def groups_text(c: Collective) -> str:
    """'2 groups of 8: {0-7},{8-15}' -- every group when few, else the first two and a count."""
    if c.kind == "collective-permute":
        return (
            f"{len(c.groups)} pairs: "
            + ",".join(f"{s}->{t}" for s, t in c.groups[:4])
            + (",..." if len(c.groups) > 4 else "")
        )
    sizes = sorted({len(g) for g in c.groups})
    head = f"{len(c.groups)} group{'s' if len(c.groups) != 1 else ''} of {'/'.join(map(str, sizes))}: "
    shown = c.groups if len(c.groups) <= 4 else c.groups[:2]
    return head + ",".join(_ranges(g) for g in shown) + (",..." if len(c.groups) > len(shown) else "")


# -- text ---------------------------------------------------------------------------------------------
def _time(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def format_report(r: CollectivesReport, top: int = 40) -> str:
    lines = [
        f"module {r.module}" + (f" ({r.file})" if r.file else "") + f": {len(r.collectives)} collectives, "
        f"{r.devices} devices ({r.partitions} partitions x {r.replicas} replicas)"
    ]
    if r.note:
        lines.append(f"  {r.note}")
    lines += [
        f"link: {r.link.name}: {r.link.bandwidth / 1e9:g} GB/s each way per device, {r.link.latency * 1e6:g} us "
        f"per step, {costmodel.BASE_LATENCY * 1e6:g} us per collective ({r.link.source})",
        f"model: {MODEL}",
        "",
    ]
    if not r.collectives:
        return "\n".join(lines + ["no collectives"])
    lines.append(
        f"  {'#':>3} {'kind':<21}{'bytes':>10} {'sent/dev':>10} {'time':>10} {'exposed':>10}  groups; "
        f"instruction, op_name"
    )
    for i, c in enumerate(r.collectives[:top]):
        name = f"%{c.inst.name}" + (f" .. %{c.done.name}" if c.done else "")
        w = where(c.inst)
        label = (f" layer {w['layer']}" if w["layer"] is not None else "") + (f" {w['phase']}" if w["phase"] else "")
        lines.append(
            f"  {i:>3} {c.kind:<21}{human_bytes(c.bytes):>10} {human_bytes(int(max(c.sent, default=0))):>10} "
            f"{_time(c.seconds):>10} {_time(c.exposed_seconds):>10}  {groups_text(c)}; {name}{label}"
            + (f" [in {c.context}]" if c.context else "")
        )
    if len(r.collectives) > top:
        lines.append(f"  ... {len(r.collectives) - top} more (--top N, or --json)")
    total = r.to_dict()
    lines += ["", "totals per kind (one step of the module):"]
    for kind, t in total["by_kind"].items():
        lines.append(
            f"  {kind:<21}{t['count']:>5} x  {human_bytes(t['bytes']):>10}  sent/dev "
            f"{human_bytes(int(t['sent_bytes'])):>10}  {_time(t['seconds']):>10}  exposed "
            f"{_time(t['exposed_seconds'])}"
        )
    lines += ["totals per group:"]
    for group, t in total["by_group"].items():
        lines.append(f"  {t['count']:>5} x  {human_bytes(t['bytes']):>10}  {_time(t['seconds']):>10}  {group}")
    lines.append(
        f"all: {human_bytes(total['total_bytes'])} per device in {len(r.collectives)} collectives, "
        f"{_time(total['total_seconds'])} on the link, {_time(total['exposed_seconds'])} not hidden behind "
        f"compute (async pairs overlap the compute scheduled between start and done; {r.chip.name} "
        f"roofline)"
    )
    lines += ["", "critical collectives (longest time not hidden behind compute):"]
    for c in r.critical():
        w = where(c.inst)
        lines.append(
            f"  %{c.inst.name} {c.kind} {human_bytes(c.bytes)} {_time(c.exposed_seconds)}"
            + (
                f" (of {_time(c.seconds)}, overlapping {_time(c.overlap_seconds or 0.0)} of compute)"
                if c.done is not None
                else " (synchronous)"
            )
            + f"  HLO line {c.inst.line}"
            + (f"  {short(w['op_name'], 70)}" if w["op_name"] else "")
        )
    return "\n".join(lines)
