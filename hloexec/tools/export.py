"""`hloexec export`: a module as the input of a network simulator.

- `--chakra DIR`: Chakra execution traces, ASTRA-sim 2.0's input: `DIR/<module>.<device>.et` for every
  device (the entry computation in schedule order: compute nodes with `num_ops`, `tensor_size` and a
  roofline duration, collective nodes with their type, size and communicator group, collective-permute as
  send/recv pairs; data dependencies from the operands, control dependencies keeping the schedule's order
  on the compute stream) and `DIR/<module>.comm_group.json`, the communicator groups the nodes name.
- `--astra-sim OUT.txt`: an ASTRA-sim 1.0 text workload like the seed
  `astra_sim_workload_transformer_1024gpu.txt` (the SimAI/aicb layout): a header, the row count, then per row
  name, -1, forward compute time, type and bytes, input-gradient compute, type and bytes, weight-gradient
  compute, type and bytes, update time. Rows are the layers found in `op_name` paths.

Compute times come from the roofline of hloexec.tools.costmodel (FLOPs as `hloexec stats` counts them, bytes
read and written, a named chip); collective groups, sizes and kinds from `hloexec collectives`. What the
formats cannot say is listed with the assumptions the command prints first.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..exec.plan import schedule
from ..ir.module import Instruction, Module
from . import chakra, costmodel
from .collectives import Collective, CollectivesReport, collectives_report
from .opname import layer, op_name, phase
from .stats import Walk


@dataclass
class Event:
    """One entry instruction in schedule order, as the simulators see it."""

    inst: Instruction
    flops: int = 0
    bytes: int = 0
    seconds: float = 0.0
    collective: Collective | None = None

    @property
    def free(self) -> bool:
        return self.collective is None and self.bytes == 0 and self.flops == 0


@dataclass
class Program:
    module: Module
    report: CollectivesReport
    events: list[Event]
    assumptions: list[str] = field(default_factory=list)

    @property
    def devices(self) -> int:
        return self.report.devices


def program(
    module: Module,
    partitions=None,
    replicas=None,
    chip: str = costmodel.DEFAULT_CHIP,
    link: str = costmodel.DEFAULT_LINK,
) -> Program:
    report = collectives_report(module, "", partitions, replicas, link, chip)
    by_inst = {id(c.inst): c for c in report.collectives if not c.context}
    walk = Walk()
    events = []
    for inst in schedule(module.entry):
        c = by_inst.get(id(inst))
        if c is not None:
            events.append(Event(inst, 0, c.bytes, c.seconds, c))
        else:
            flops, moved, seconds = costmodel.compute_cost(inst, report.chip, walk)
            events.append(Event(inst, flops, moved, seconds))
    p = Program(module, report, events)
    used = report.chip
    p.assumptions += [
        f"devices: {report.devices} ({report.partitions} partitions x {report.replicas} replicas)"
        + (f"; {report.note}" if report.note else ""),
        f"compute: roofline on {used.name}: max(FLOPs / {used.flops / 1e12:g} TFLOP/s, bytes / "
        f"{used.bandwidth / 1e9:g} GB/s) per instruction of the entry computation ({used.source}); FLOPs as "
        f"`hloexec stats` counts them (dots, convolutions, gemms, those inside fusions too), bytes = operands + "
        f"result; every dtype at the 16-bit peak",
        f"collectives: sizes as `hloexec collectives` gives them (the buffer per device; the gathered result for "
        f"all-gather); link {report.link.name} for the times printed here",
    ]
    nested = [c for c in report.collectives if c.context]
    if nested:
        p.assumptions.append(
            f"{len(nested)} collectives inside called computations (while bodies, calls) are not "
            f"exported: their call site is one compute node (a while body counted once)"
        )
    return p


# -- Chakra ---------------------------------------------------------------------------------------------
def prefix_of(module: Module) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", module.name)


def write_chakra(p: Program, out_dir: str) -> dict:
    """One .et per device and the communicator-group JSON; returns what was written."""
    Metadata, Node, _ = chakra.schema()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prefix = prefix_of(p.module)
    group_ids: dict[tuple, int] = {}
    for e in p.events:
        if e.collective is not None and e.collective.kind != "collective-permute":
            for g in e.collective.groups:
                group_ids.setdefault(tuple(g), len(group_ids) + 1)  # "0" is ASTRA-sim's "all devices"
    (out / f"{prefix}.comm_group.json").write_text(
        json.dumps({str(i): list(g) for g, i in group_ids.items()}, indent=1) + "\n"
    )
    metadata = Metadata(
        version=chakra.SCHEMA_VERSION,
        attr=[chakra.attr("producer", "hloexec export --chakra"), chakra.attr("module", p.module.name)]
        + [chakra.attr(f"assumption_{i}", a) for i, a in enumerate(p.assumptions)],
    )
    files: list[str] = []
    counts: dict[int, int] = {}  # chakra node type -> count
    for d in range(p.devices):
        nodes = _device_nodes(p, d, group_ids, Node, chakra)
        path = out / f"{prefix}.{d}.et"
        chakra.write_stream(path, metadata, nodes)
        files.append(str(path))
        for n in nodes:
            counts[n.type] = counts.get(n.type, 0) + 1
    names = {
        chakra.COMP_NODE: "compute",
        chakra.COMM_COLL_NODE: "collective",
        chakra.COMM_SEND_NODE: "send",
        chakra.COMM_RECV_NODE: "recv",
    }
    return {
        "files": files,
        "comm_group": str(out / f"{prefix}.comm_group.json"),
        "groups": len(group_ids),
        "nodes": {names[t]: n for t, n in sorted(counts.items())},
        "astra_sim": f"--workload-configuration={out / prefix} "
        f"--comm-group-configuration={out / (prefix + '.comm_group.json')}",
    }


def _device_nodes(p: Program, device: int, group_ids: dict, Node, chakra) -> list:
    nodes: list = []  # chakra's Node messages
    made: dict[int, list[int]] = {}  # instruction -> the node ids its value depends on
    stream: int | None = None  # the last node on the compute stream (compute, synchronous collective)
    for e in p.events:
        inst = e.inst
        deps = sorted({n for o in inst.operands for n in made.get(id(o), ())})
        c = e.collective
        if e.free or (c is not None and not _takes_part(c, device)):
            made[id(inst)] = deps  # no node: its readers depend on what it depends on
            continue
        new = []
        if c is None:
            node = Node(id=len(nodes), name=inst.name, type=chakra.COMP_NODE, duration_micros=round(e.seconds * 1e6))
            node.attr.extend(
                [
                    chakra.attr("is_cpu_op", False),
                    chakra.attr("num_ops", max(e.flops, inst.shape.leaf_elements())),
                    chakra.attr("tensor_size", e.bytes),
                ]
            )
            new.append(node)
        elif c.kind == "collective-permute":
            tag = p.events.index(e)
            for s, t in c.groups:
                if s == t or device not in (s, t):
                    continue
                send = s == device
                node = Node(
                    id=len(nodes) + len(new),
                    name=f"{inst.name}:{'send' if send else 'recv'}",
                    type=chakra.COMM_SEND_NODE if send else chakra.COMM_RECV_NODE,
                )
                node.attr.extend(
                    [
                        chakra.attr("is_cpu_op", False),
                        chakra.attr("comm_src", s),
                        chakra.attr("comm_dst", t),
                        chakra.attr("comm_size", c.bytes),
                        chakra.attr("comm_tag", tag),
                    ]
                )
                new.append(node)
        else:
            group = next(g for g in c.groups if device in g)
            node = Node(id=len(nodes), name=inst.name, type=chakra.COMM_COLL_NODE)
            node.attr.extend(
                [
                    chakra.attr("is_cpu_op", False),
                    chakra.attr("comm_type", chakra.COMM_TYPES[c.kind]),
                    chakra.attr("comm_size", c.bytes),
                    chakra.attr("pg_name", str(group_ids[tuple(group)])),
                ]
            )
            new.append(node)
        for node in new:
            node.data_deps.extend(deps)
            if stream is not None and stream not in deps:
                node.ctrl_deps.append(stream)
        nodes += new
        if new:
            made[id(inst)] = [n.id for n in new if n.type != chakra.COMM_SEND_NODE] or [n.id for n in new]
            if c is None or c.done is None:  # an async start leaves the stream free until its done
                stream = new[-1].id
        else:
            made[id(inst)] = deps
    return nodes


def _takes_part(c: Collective, device: int) -> bool:
    if c.kind == "collective-permute":
        return any(device in (s, t) and s != t for s, t in c.groups)
    return any(device in g for g in c.groups) and c.kind in (
        "all-reduce",
        "all-gather",
        "reduce-scatter",
        "all-to-all",
        "collective-broadcast",
    )


# -- ASTRA-sim 1.0 text ---------------------------------------------------------------------------------
ASTRA_TYPES = {
    "all-reduce": "ALLREDUCE",
    "all-gather": "ALLGATHER",
    "reduce-scatter": "REDUCESCATTER",
    "all-to-all": "ALLTOALL",
}
_COLUMNS = ("fwd", "ig", "wg")


@dataclass
class Row:
    name: str
    compute: dict = field(default_factory=lambda: {c: 0.0 for c in _COLUMNS})  # seconds
    comms: dict = field(default_factory=lambda: {c: {} for c in _COLUMNS})  # column -> type -> bytes
    update: float = 0.0
    flops: int = 0


def model_parallel_size(p: Program) -> int:
    """The model-parallel group size: the size of the groups of contiguous device ids (`{0-7},{8-15}`) that
    carry the most bytes; 1 when no collective has such groups. ASTRA-sim puts the model-parallel dimension
    on the lowest NPU ids, data parallelism across them."""
    by_size: dict[int, int] = {}
    for e in p.events:
        c = e.collective
        if c is not None and c.kind != "collective-permute" and _contiguous(c.groups):
            size = len(c.groups[0])
            by_size[size] = by_size.get(size, 0) + c.bytes
    return max(by_size, key=lambda size: by_size[size]) if by_size else 1


def _contiguous(groups) -> bool:
    return (
        bool(groups)
        and len({len(g) for g in groups}) == 1
        and len(groups[0]) > 1
        and all(sorted(g) == list(range(min(g), min(g) + len(g))) for g in groups)
    )


def astra_sim_rows(p: Program) -> tuple[list[Row], int, list[str]]:
    """(rows, model-parallel size, notes). A row per layer (op_name `layers/3`, `layer_3`, ...), in the order
    the forward pass reaches them, with `pre_layers` / `post_layers` for what runs before / after them (in
    the backward pass: after / before them) and `optimizer` for what neither pass names."""
    mp = model_parallel_size(p)
    params = {tuple(q.shape.dims) for q in p.module.entry.parameters if not q.shape.is_tuple}
    placed = [(e, op_name(e.inst)) for e in p.events if not e.free]
    # an op_name that names no pass: the pass of the instruction before it; after the backward pass, the optimizer;
    # a module without autodiff is all forward
    last_backward = max((i for i, (_, name) in enumerate(placed) if phase(name) == "backward"), default=-1)
    phases, current = [], "forward"
    for i, (_, name) in enumerate(placed):
        current = phase(name) or current
        phases.append(phase(name) or ("" if 0 <= last_backward < i else current))
    layer_positions = [i for i, (e, name) in enumerate(placed) if layer(name) is not None]
    first_layer = {ph: next((i for i in layer_positions if phases[i] == ph), None) for ph in ("forward", "backward")}
    rows: dict[str, Row] = {}
    notes: dict[str, int] = {}

    def row(name: str) -> Row:
        return rows.setdefault(name, Row(name))

    for i, (e, name) in enumerate(placed):
        ph, index = phases[i], layer(name)
        if index is not None:
            key = f"layer_{index}"
        elif not ph:
            key = "optimizer"
        elif not layer_positions:
            key = "module"  # no layer in any op_name: one row
        else:
            first = first_layer[ph]
            before = first is not None and i < first
            # forward: embedding before the layers, head after; backward runs the other way round
            key = (
                ("pre_layers" if before else "post_layers")
                if ph == "forward"
                else ("post_layers" if before else "pre_layers")
            )
        r = row(key)
        c = e.collective
        if c is None:
            r.flops += e.flops
            if key == "optimizer":
                r.update += e.seconds
            elif ph == "backward" and _weight_gradient(e.inst, params):
                r.compute["wg"] += e.seconds
            else:
                r.compute["ig" if ph == "backward" else "fwd"] += e.seconds
            continue
        kind = ASTRA_TYPES.get(c.kind)
        if kind is None:
            notes[c.kind] = notes.get(c.kind, 0) + 1
            continue
        data_parallel = not (_contiguous(c.groups) and len(c.groups[0]) == mp)
        column = "wg" if data_parallel and ph != "forward" else ("ig" if ph == "backward" else "fwd")
        r.comms[column][kind] = r.comms[column].get(kind, 0) + c.bytes
    order: list[str] = [k for k in ("module", "pre_layers") if k in rows]
    order += sorted((k for k in rows if k.startswith("layer_")), key=lambda k: int(k.split("_")[1]))
    order += [k for k in ("post_layers", "optimizer") if k in rows]
    texts = [
        f"{n} {kind} collective{'s' if n > 1 else ''} left out (the format has no such type)"
        for kind, n in notes.items()
    ]
    return [rows[k] for k in order], mp, texts


def _weight_gradient(inst: Instruction, params: set) -> bool:
    """A backward contraction whose result has a parameter's shape: the gradient of a weight."""
    return bool(
        inst.shape.dims in params
        and not inst.shape.is_tuple
        and (
            inst.opcode in ("dot", "convolution", "custom-call")
            or (
                inst.opcode == "fusion"
                and any(i.opcode in ("dot", "convolution") for i in inst.called_computation("calls").instructions)
            )
        )
    )


def astra_sim_text(p: Program) -> tuple[str, dict]:
    """The workload text and a summary (rows, totals per column and comm type, the model-parallel size)."""
    rows, mp, notes = astra_sim_rows(p)
    lines = []
    for r in rows:
        extra = []  # a column with several comm types: the others go to rows of their own
        cells = []
        for column in _COLUMNS:
            comms = list(r.comms[column].items()) or [("NONE", 0)]
            cells.append((round(r.compute[column] * 1e9), *comms[0]))
            extra += [(column, kind, size) for kind, size in comms[1:]]
        lines.append(_row_line(r.name, cells, round(r.update * 1e9)))
        for k, (column, kind, size) in enumerate(extra, 1):
            cells = [(0, kind, size) if c == column else (0, "NONE", 0) for c in _COLUMNS]
            lines.append(_row_line(f"{r.name}.{k}", cells, 0))
    header = (
        f"HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: {mp} ep: 1 pp: 1 ga: 1 "
        f"all_gpus: {p.devices} checkpoints: 0 checkpoint_initiates: 0"
    )
    text = "\n".join([header, str(len(lines)), *lines]) + "\n"
    by_type: dict[str, int] = {}
    for r in rows:
        for column in _COLUMNS:
            for kind, size in r.comms[column].items():
                by_type[kind] = by_type.get(kind, 0) + size
    summary = {
        "rows": len(lines),
        "layers": sum(r.name.startswith("layer_") for r in rows),
        "model_parallel_NPU_group": mp,
        "all_gpus": p.devices,
        "compute_ns": {c: round(sum(r.compute[c] for r in rows) * 1e9) for c in _COLUMNS},
        "update_ns": round(sum(r.update for r in rows) * 1e9),
        "flops": sum(r.flops for r in rows),
        "comm_bytes": by_type,
        "left_out": notes,
    }
    return text, summary


def _row_line(name: str, cells, update: int) -> str:
    return "\t".join([name, "-1", *(f"{t}\t{kind}\t{size}" for t, kind, size in cells), str(update)])


ASTRA_ASSUMPTIONS = [
    "times in nanoseconds (ASTRA-sim's ticks); a row per layer in op_name order; pre_layers / post_layers hold "
    "what runs before / after the layers in the forward pass (embedding, head and loss) and their backward; "
    "optimizer holds what neither pass names (its compute is the row's update time)",
    "forward = op_name inside jvp( (jax) and not transpose(; backward = inside transpose( or a pytorch "
    "...Backward node; an op_name naming neither takes the pass of the instruction before it (the optimizer's "
    "after the last backward instruction; all forward in a module without autodiff); weight-gradient compute = backward contractions whose result has a parameter's shape, "
    "the rest of the backward is input-gradient compute",
    "collectives on groups of contiguous device ids of the model-parallel size go to the forward / "
    "input-gradient columns (ASTRA-sim's model-parallel dimensions); the others to weight-gradient outside the "
    "forward pass (data-parallel dimensions); several collectives of one type in a cell are added; other types "
    "in the same cell get rows of their own (name.1, name.2: no compute)",
]
