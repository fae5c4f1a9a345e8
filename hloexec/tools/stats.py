"""What `hloexec stats` reports about an HLO file: per module its size, ops, types, bytes, FLOPs,
collectives, custom-call targets, fusion kinds and what it was compiled for, plus how fast the file parsed.

FLOPs count dots, convolutions and cuBLAS gemm custom-calls (2 multiply-adds' worth per
accumulated product: 2·batch·M·N·K for a dot; 2·output elements·input features per group·window
elements for a convolution, padding taps included). Computations are walked from the entry through
every call site (fusions, calls, async wrappers, reducers, conditional branches, while loops), so a
computation called from two places counts twice. A while body counts once: the trip count is not in
the text. Collectives are counted the same way; their bytes are what one participant sends in
(the operands; the gathered result for all-gather).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from collections import Counter
from dataclasses import asdict, dataclass, field

from ..errors import UnsupportedError
from ..ir.compiled_for import compiled_for
from ..ir.module import Computation, Instruction, Module
from ..parser import parse

COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "ragged-all-to-all",
    "collective-permute",
    "collective-broadcast",
)
GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul")
# Ops whose called computation is the same one their -start op already called.
_NOT_A_CALL_SITE = ("async-update", "async-done")


@dataclass
class Collective:
    kind: str
    count: int = 0
    bytes: int = 0
    groups: Counter = field(default_factory=Counter)  # replica-group summary -> count


@dataclass
class ModuleStats:
    name: str
    first_line: int
    last_line: int
    computations: int
    instructions: int
    ops: dict
    element_types: dict
    entry_parameters: int
    parameter_bytes: int
    entry_outputs: int
    output_bytes: int
    flops: int
    flops_by_kind: dict  # dot | convolution | gemm -> FLOPs
    contractions: dict  # dot | convolution | gemm -> instructions counted (with call multiplicity)
    while_loops: int  # while instructions reached: their bodies are counted once
    collectives: list
    custom_call_targets: dict
    fusion_kinds: dict
    elided_constants: int  # constant({...}): values the dump left out (XLA dumps without large constants)
    compiled_for: dict  # platform (gpu | tpu | cpu | unknown) and the evidence: hloexec.ir.compiled_for

    @property
    def source_lines(self) -> int:
        return self.last_line - self.first_line + 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d["source_lines"] = self.source_lines
        d["collectives"] = [
            dict(kind=c.kind, count=c.count, bytes=c.bytes, replica_groups=dict(c.groups)) for c in self.collectives
        ]
        return d


@dataclass
class FileStats:
    path: str
    bytes: int
    parse_seconds: float
    modules: list[ModuleStats]

    @property
    def mb_per_second(self) -> float:
        return self.bytes / 1e6 / self.parse_seconds if self.parse_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "bytes": self.bytes,
            "parse_seconds": self.parse_seconds,
            "mb_per_second": self.mb_per_second,
            "modules": [m.to_dict() for m in self.modules],
        }


def file_stats(path: str) -> FileStats:
    """Parse `path` (timed) and describe every module in it. Raises HloParseError for bad text."""
    start = time.perf_counter()
    modules = parse(Path(path))  # a Path: a missing file is an OSError, not HLO text
    seconds = time.perf_counter() - start
    return FileStats(str(path), os.path.getsize(path), seconds, [module_stats(m) for m in modules])


def module_lines(module: Module) -> tuple[int, int]:
    """(first, last) source line of a module: its header to the closing brace of its last computation."""
    last = max((inst.line for inst in module.instructions()), default=module.line)
    return module.line, last + 1


def module_stats(module: Module) -> ModuleStats:
    first, last = module_lines(module)
    ops = module.opcode_counts()  # counts from the parser's tables
    types: Counter[str] = Counter()
    for shape, n in module.shape_counts().items():
        types[shape.element_type.name] += n  # "tuple" for tuples
    targets: Counter[str] = Counter()
    fusion_kinds: Counter[str] = Counter()
    elided = 0
    for inst in module.instructions():
        if inst.opcode == "custom-call":
            targets[_target(inst)] += 1
        elif inst.opcode == "fusion":
            fusion_kinds[str(inst.attr("kind", "?"))] += 1
        elif inst.literal_elided:
            elided += 1
    walk = Walk()
    totals = walk.totals(module.entry)
    entry = module.entry
    root_shape = entry.root.shape
    return ModuleStats(
        name=module.name,
        first_line=first,
        last_line=last,
        computations=len(module.computations),
        instructions=module.instruction_count,
        ops=_by_count(ops),
        element_types=_by_count(types),
        entry_parameters=len(entry.parameters),
        parameter_bytes=sum(p.shape.nbytes for p in entry.parameters),
        entry_outputs=sum(1 for _ in root_shape.leaves()),
        output_bytes=root_shape.nbytes,
        flops=sum(totals.flops.values()),
        flops_by_kind=dict(totals.flops),
        contractions=dict(totals.contractions),
        while_loops=totals.while_loops,
        collectives=[totals.collectives[k] for k in sorted(totals.collectives, key=COLLECTIVES.index)],
        custom_call_targets=_by_count(targets),
        fusion_kinds=_by_count(fusion_kinds),
        elided_constants=elided,
        compiled_for=compiled_for(module).to_dict(),
    )


def _by_count(counter: Counter) -> dict:
    return dict(sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def _target(inst: Instruction) -> str:
    return str(inst.attr("custom_call_target", "")).strip('"')


@dataclass
class _Totals:
    flops: Counter = field(default_factory=Counter)
    contractions: Counter = field(default_factory=Counter)
    while_loops: int = 0
    collectives: dict = field(default_factory=dict)

    def add(self, other: _Totals) -> None:
        self.flops.update(other.flops)
        self.contractions.update(other.contractions)
        self.while_loops += other.while_loops
        for kind, c in other.collectives.items():
            mine = self.collectives.setdefault(kind, Collective(kind))
            mine.count += c.count
            mine.bytes += c.bytes
            mine.groups.update(c.groups)


class Walk:
    """Totals of a computation and everything it calls, memoized per computation."""

    def __init__(self):
        self._done: dict[int, _Totals] = {}

    def totals(self, comp: Computation) -> _Totals:
        key = id(comp)
        if key in self._done:
            return self._done[key]
        self._done[key] = _Totals()  # a cycle (invalid HLO) counts as nothing, not forever
        t = _Totals()
        for inst in comp.instructions:
            _count(inst, t)
            if inst.opcode not in _NOT_A_CALL_SITE:
                for called in inst.called_computations:
                    t.add(self.totals(called))
        self._done[key] = t
        return t


def instruction_flops(inst: Instruction, walk: Walk | None = None) -> int:
    """FLOPs of one instruction as `stats` counts them (dots, convolutions, gemms), those of the computations
    it calls included (a fusion's dots; a while body once). Pass one `walk` for many instructions of a module."""
    t = _Totals()
    _count(inst, t)
    if inst.opcode not in _NOT_A_CALL_SITE:
        walk = walk or Walk()
        for called in inst.called_computations:
            t.add(walk.totals(called))
    return sum(t.flops.values())


def _count(inst: Instruction, t: _Totals) -> None:
    op = inst.opcode
    if op == "dot":
        t.flops["dot"] += dot_flops(inst)
        t.contractions["dot"] += 1
    elif op == "convolution":
        t.flops["convolution"] += convolution_flops(inst)
        t.contractions["convolution"] += 1
    elif op == "custom-call" and _target(inst) in GEMM_TARGETS:
        t.flops["gemm"] += gemm_flops(inst)
        t.contractions["gemm"] += 1
    elif op == "while":
        t.while_loops += 1
    else:
        kind = op[: -len("-start")] if op.endswith("-start") else op
        if kind in COLLECTIVES:
            c = t.collectives.setdefault(kind, Collective(kind))
            c.count += 1
            c.bytes += collective_bytes(inst, kind)
            c.groups[_groups_summary(inst)] += 1


def dot_flops(inst: Instruction) -> int:
    lhs = inst.operands[0].shape
    contracting = inst.attr("lhs_contracting_dims", ())
    return 2 * inst.shape.size * _product(_extents(inst, lhs, contracting, "lhs_contracting_dims"))


def convolution_flops(inst: Instruction) -> int:
    labels = inst.attr("dim_labels")
    kernel = inst.operands[1].shape
    if labels is None or isinstance(labels, str):
        return 0
    per_output = _product(_extents(inst, kernel, (labels.kernel_input_feature, *labels.kernel_spatial), "dim_labels"))
    return 2 * inst.shape.size * per_output


def gemm_flops(inst: Instruction) -> int:
    config = inst.attr("backend_config")
    if not isinstance(config, dict):
        return 0
    config = config.get("gemm_backend_config", config)
    contracting = (config.get("dot_dimension_numbers") or {}).get("lhs_contracting_dimensions") or ()
    lhs = inst.operands[0].shape
    result = next(leaf for _, leaf in inst.shape.leaves())
    return 2 * result.size * _product(_extents(inst, lhs, [int(d) for d in contracting], "lhs_contracting_dimensions"))


def _extents(inst: Instruction, shape, dims, attribute: str) -> list[int]:
    """The extents of `shape` at `dims`; dims an attribute names outside the operand are its error (the text is not
    verified before it is counted)."""
    if any(not 0 <= d < len(shape.dims) for d in dims):
        raise UnsupportedError(
            f"{inst.opcode}: {attribute} {list(dims)} of an operand of rank {len(shape.dims)}, which XLA's shape rules reject",
            inst,
        )
    return [shape.dims[d] for d in dims]


def _product(values) -> int:
    n = 1
    for v in values:
        n *= v
    return n


def collective_bytes(inst: Instruction, kind: str | None) -> int:
    if kind != "all-gather":
        return sum(o.shape.nbytes for o in inst.operands)
    shape = inst.shape
    if inst.opcode == "all-gather-start" and shape.is_tuple:  # (operands, gathered results)
        shape = shape.tuple_shapes[-1]
    return shape.nbytes


def _groups_summary(inst: Instruction) -> str:
    """'2x8 {0-7},...' (groups x size, the first group), '{}' (everyone), 'pairs 16' for permutes."""
    if "source_target_pairs" in inst.attrs:
        try:
            return f"pairs {len(inst.attr('source_target_pairs'))}"
        except ValueError:
            return inst.attrs["source_target_pairs"]
    if "replica_groups" not in inst.attrs:
        return "{}"
    try:
        groups = inst.attr("replica_groups").groups
    except ValueError:  # a form hloexec does not decode: show it as written
        return inst.attrs["replica_groups"]
    if not groups:
        return "{}"
    sizes = sorted({len(g) for g in groups})
    size = str(sizes[0]) if len(sizes) == 1 else "/".join(map(str, sizes))
    return f"{len(groups)}x{size} {_ranges(groups[0])}" + (",..." if len(groups) > 1 else "")


def _ranges(group) -> str:
    """{0-7} for a run of consecutive ids, else the ids."""
    ids = list(group)
    if len(ids) > 2 and ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{{{ids[0]}-{ids[-1]}}}"
    return "{" + ",".join(map(str, ids)) + "}"


# -- text -------------------------------------------------------------------------------------
def format_file(fs: FileStats) -> str:
    lines = [
        f"{fs.path}: {len(fs.modules)} module{'s' if len(fs.modules) != 1 else ''}, {human_bytes(fs.bytes)}, "
        f"parsed in {fs.parse_seconds * 1e3:.1f} ms ({fs.mb_per_second:.1f} MB/s)"
    ]
    if len(fs.modules) > 1:
        lines += [f"  {m.name} (lines {m.first_line}-{m.last_line})" for m in fs.modules]
    for m in fs.modules:
        lines += ["", *format_module(m)]
    return "\n".join(lines)


def format_module(m: ModuleStats) -> list[str]:
    rows = [
        ("lines", f"{m.first_line}-{m.last_line} ({m.source_lines})"),
        ("computations", str(m.computations)),
        ("instructions", str(m.instructions)),
        ("entry parameters", f"{m.entry_parameters}, {human_bytes(m.parameter_bytes)}"),
        ("entry outputs", f"{m.entry_outputs}, {human_bytes(m.output_bytes)}"),
        ("FLOPs", _flops_text(m)),
        ("compiled for", m.compiled_for["platform"]),
    ]
    if m.elided_constants:
        rows.append(
            ("elided constants", f"{m.elided_constants} (constant({{...}}): values not in the dump; runs read zeros)")
        )
    for c in m.collectives:
        groups = "; ".join(f"{g}: {n}" for g, n in c.groups.most_common())
        rows.append((f"{c.kind}", f"{c.count} ({human_bytes(c.bytes)}); groups {groups}"))
    out = [f"module {m.name}"]
    out += [f"  {label:<18}{value}" for label, value in rows]
    out += [f"    {line}" for line in m.compiled_for["evidence"]]
    for label, counts in (
        ("custom-calls", m.custom_call_targets),
        ("fusion kinds", m.fusion_kinds),
        ("element types", m.element_types),
        ("ops", m.ops),
    ):
        if counts:
            out.append(f"  {label}")
            out += ["    " + line for line in columns(counts)]
    return out


def _flops_text(m: ModuleStats) -> str:
    if not m.flops:
        return "0"
    parts = ", ".join(
        f"{kind} {human_count(m.flops_by_kind[kind])} in {m.contractions[kind]}"
        for kind in ("dot", "convolution", "gemm")
        if kind in m.flops_by_kind
    )
    text = f"{human_count(m.flops)} ({parts})"
    if m.while_loops:
        text += f"; {m.while_loops} while loop{'s' if m.while_loops > 1 else ''}, bodies counted once"
    return text


def columns(counts: dict, width: int = 100) -> list[str]:
    """`name count` cells in aligned columns, filled column by column, most frequent first."""
    cells = [(str(k), str(v)) for k, v in counts.items()]
    name_w = max(len(k) for k, _ in cells)
    num_w = max(len(v) for _, v in cells)
    cell_w = name_w + num_w + 4
    ncols = max(1, min(len(cells), width // cell_w))
    nrows = -(-len(cells) // ncols)
    lines = []
    for r in range(nrows):
        row = [cells[c * nrows + r] for c in range(ncols) if c * nrows + r < len(cells)]
        lines.append("".join(f"{k:<{name_w}} {v:>{num_w}}   " for k, v in row).rstrip())
    return lines


def human_bytes(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def human_count(n: int) -> str:
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(n)
