"""`hloexec graph`: the neighbourhood of an instruction (or a small computation) as DOT, SVG or a
self-contained HTML page.

Whole-module graphs of real dumps are unreadable (10k instructions), so this draws neighbourhoods: the
instructions within `depth` operand/user steps of one instruction, at most `max_nodes` of them, with what
was cut shown as "+N more" stubs. A fusion is one node with a summary of its ops; collectives and
custom-calls are marked. Nodes carry shapes, dtypes and op_name. SVG comes from Graphviz's `dot` where it
is installed, else from a layered layout of our own; the HTML page inlines everything (no network).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from collections import Counter, deque
from dataclasses import dataclass, field

from ..ir.module import Computation, Instruction, Module
from .common import UsageError
from .costmodel import collective_kind
from .extract import boundary
from .opname import fit, op_name, short

NODE_W, NODE_H, GAP_X, GAP_Y = 230, 64, 30, 56


@dataclass
class Graph:
    computation: Computation
    nodes: list[Instruction]
    edges: list[tuple[Instruction, Instruction]]  # operand -> user
    center: Instruction | None
    hidden: dict = field(default_factory=dict)  # id(inst) -> (operands cut, users cut)
    stopped_at: list[str] = field(default_factory=list)  # where the walk met its computation's edge

    def kind(self, inst: Instruction) -> str:
        if collective_kind(inst) is not None or _is_collective_done(inst):
            return "collective"
        if inst.opcode == "custom-call":
            return "custom-call"
        if inst.opcode == "fusion":
            return "fusion"
        if inst.opcode == "parameter":
            return "parameter"
        return "op"


def _is_collective_done(inst: Instruction) -> bool:
    return inst.opcode.endswith("-done") and bool(inst.operands) and collective_kind(inst.operands[0]) is not None


def neighbourhood(
    module: Module, around: str | None = None, depth: int = 2, computation: str | None = None, max_nodes: int = 120
) -> Graph:
    """The instructions within `depth` steps of `around` (breadth first, operands and users), or the whole
    computation when it has at most `max_nodes` instructions (else its root's neighbourhood). Inside a fused
    (called) computation the walk stops at its parameters and root: `stopped_at` says what they are outside."""
    comp = _computation(module, around, computation)
    seen = {}
    if around is None and len(comp.instructions) <= max_nodes:
        nodes = list(comp.instructions)
        center = None
    else:
        center = comp.by_name[around] if around is not None else comp.root
        seen = {id(center): 0}
        order = [center]
        queue = deque([center])
        while queue and len(order) < max_nodes:
            inst = queue.popleft()
            if seen[id(inst)] >= depth:
                continue
            for nxt in (*inst.operands, *inst.users):
                if id(nxt) not in seen and len(order) < max_nodes:
                    seen[id(nxt)] = seen[id(inst)] + 1
                    order.append(nxt)
                    queue.append(nxt)
        position = {id(i): k for k, i in enumerate(comp.instructions)}
        nodes = sorted(order, key=lambda i: position.get(id(i), 0))
    inside = {id(n) for n in nodes}
    edges = [(o, n) for n in nodes for o in dict.fromkeys(n.operands) if id(o) in inside]
    hidden = {}
    for n in nodes:
        cut = (
            sum(id(o) not in inside for o in dict.fromkeys(n.operands)),
            sum(id(u) not in inside for u in dict.fromkeys(n.users)),
        )
        if any(cut):
            hidden[id(n)] = cut
    edges_met = [boundary(module, n) for n in nodes if seen.get(id(n), 0) < depth]
    return Graph(comp, nodes, edges, center, hidden, [e for e in edges_met if e])


def _computation(module: Module, around: str | None, name: str | None) -> Computation:
    if name is not None:
        comp = next((c for c in module.computations if c.name == name), None)
        if comp is None:
            raise UsageError(f"no computation %{name} in {module.name}")
        if around is not None and around not in comp.by_name:
            raise UsageError(f"no instruction %{around} in computation %{name}")
        return comp
    if around is None:
        return module.entry
    around = around.lstrip("%")
    for comp in [module.entry, *module.computations]:
        if around in comp.by_name:
            return comp
    raise UsageError(f"no instruction %{around} in {module.name}")


# -- labels ---------------------------------------------------------------------------------------------
def label_lines(inst: Instruction) -> list[str]:
    """Three short lines: name and opcode (a fusion: its kind), shape, and what it does or where from."""
    head = f"%{inst.name}"
    shape = inst.shape.to_text(layout=False)
    if inst.opcode == "fusion":
        third = fusion_summary(inst)
        head += f"  fusion {str(inst.attr('kind', '')).removeprefix('k')}"
    elif inst.opcode == "custom-call":
        third = str(inst.attr("custom_call_target", "")).strip('"')
        head += "  custom-call"
    else:
        head += f"  {inst.opcode}"
        third = op_name(inst).rsplit("/", 1)[-1].split("[", 1)[0]  # the op's own name; the path is in the tooltip
    return [head, shape, third]


def fusion_summary(inst: Instruction) -> str:
    """'3 multiply, 2 add, reduce' -- a fused computation's ops, most frequent first."""
    counts = Counter(
        i.opcode
        for i in inst.called_computation("calls").instructions
        if i.opcode not in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast")
    )
    return ", ".join(f"{n} {op}" if n > 1 else op for op, n in counts.most_common(4)) + (
        ", ..." if len(counts) > 4 else ""
    )


def tooltip(inst: Instruction) -> str:
    lines = [f"%{inst.name} = {inst.shape.to_text(layout=False)} {inst.opcode}", f"HLO line {inst.line}"]
    if op_name(inst):
        lines.append(f"op_name: {op_name(inst)}")
    if inst.source_location:
        lines.append(f"source: {inst.source_location}")
    if inst.opcode == "fusion":
        lines.append(f"fused: {fusion_summary(inst)}")
    for key in ("replica_groups", "source_target_pairs", "custom_call_target", "dimensions"):
        if key in inst.attrs:
            lines.append(f"{key}={short(inst.attrs[key], 160)}")
    return "\n".join(lines)


_STYLE = {
    "collective": ("#fde0dd", "#c51b8a"),
    "custom-call": ("#fff3bf", "#b08900"),
    "fusion": ("#e5f5e0", "#31a354"),
    "parameter": ("#eeeeee", "#777777"),
    "op": ("#ffffff", "#555555"),
}


# -- DOT ------------------------------------------------------------------------------------------------
def to_dot(g: Graph) -> str:
    ids = {id(n): f"n{k}" for k, n in enumerate(g.nodes)}
    out = [
        f'digraph "{g.computation.name}" {{',
        '  rankdir=TB; node [shape=box, style="rounded,filled", '
        'fontname="Helvetica", fontsize=10]; edge [color="#888888"];',
    ]
    for n in g.nodes:
        fill, line = _STYLE[g.kind(n)]
        text = "\\n".join(_dot_escape(t) for t in label_lines(n) if t)
        width = 3 if n is g.center else 1
        out.append(
            f'  {ids[id(n)]} [label="{text}", fillcolor="{fill}", color="{line}", penwidth={width}, '
            f'tooltip="{_dot_escape(tooltip(n))}"];'
        )
        cut_in, cut_out = g.hidden.get(id(n), (0, 0))
        if cut_in:
            out.append(
                f'  {ids[id(n)]}_in [label="+{cut_in} operand{"s" if cut_in > 1 else ""}", shape=plaintext, '
                f'style="", fontcolor="#888888"]; '
                f"{ids[id(n)]}_in -> {ids[id(n)]} [style=dashed];"
            )
        if cut_out:
            out.append(
                f'  {ids[id(n)]}_out [label="+{cut_out} user{"s" if cut_out > 1 else ""}", shape=plaintext, '
                f'style="", fontcolor="#888888"]; '
                f"{ids[id(n)]} -> {ids[id(n)]}_out [style=dashed];"
            )
    out += [f"  {ids[id(a)]} -> {ids[id(b)]};" for a, b in g.edges]
    out.append("}")
    return "\n".join(out) + "\n"


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# -- our own layout (no Graphviz) -------------------------------------------------------------------------
def layout(g: Graph) -> dict[int, tuple[float, float]]:
    """Node centers: a layer per longest operand path within the graph, nodes ordered in their layers by
    the mean position of their neighbours (a few sweeps down and up), as Sugiyama-style layouts do."""
    index = {id(n): k for k, n in enumerate(g.nodes)}
    preds: dict[int, list[int]] = {id(n): [] for n in g.nodes}
    succs: dict[int, list[int]] = {id(n): [] for n in g.nodes}
    for a, b in g.edges:
        preds[id(b)].append(id(a))
        succs[id(a)].append(id(b))
    level: dict[int, int] = {}
    for n in g.nodes:  # text order is topological within a computation
        level[id(n)] = 1 + max((level[p] for p in preds[id(n)] if p in level), default=-1)
    for n in reversed(g.nodes):  # a source (parameter, constant) sits just above its first reader
        if not preds[id(n)] and succs[id(n)]:
            level[id(n)] = min(level[s] for s in succs[id(n)]) - 1
    layers: dict[int, list[int]] = {}
    for n in g.nodes:
        layers.setdefault(level[id(n)], []).append(id(n))
    order = {k: v for k, v in layers.items()}
    pos = {i: float(k) for layer in order.values() for k, i in enumerate(layer)}
    for sweep in range(6):
        keys = sorted(order) if sweep % 2 == 0 else sorted(order, reverse=True)
        for k in keys:
            nbrs = preds if sweep % 2 == 0 else succs
            order[k].sort(key=lambda i: (sum(pos[j] for j in nbrs[i]) / len(nbrs[i]) if nbrs[i] else pos[i], index[i]))
            for p, i in enumerate(order[k]):
                pos[i] = float(p)
    widest = max(len(v) for v in order.values())
    centers = {}
    for k, layer_ids in order.items():
        offset = (widest - len(layer_ids)) * (NODE_W + GAP_X) / 2
        for p, i in enumerate(layer_ids):
            centers[i] = (offset + p * (NODE_W + GAP_X) + NODE_W / 2 + 20, k * (NODE_H + GAP_Y) + NODE_H / 2 + 30)
    return centers


def to_svg(g: Graph) -> str:
    """SVG from Graphviz's `dot` when it is installed, else from `layout`."""
    dot = shutil.which("dot")
    if dot is not None:
        done = subprocess.run([dot, "-Tsvg"], input=to_dot(g), capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            return done.stdout[done.stdout.find("<svg") :]
    return own_svg(g)


def own_svg(g: Graph, fills: dict | None = None) -> str:
    """SVG by `layout`; `fills` (id(instruction) -> colour) overrides the fill of its kind (report: local error)."""
    centers = layout(g)
    width = max(x for x, _ in centers.values()) + NODE_W / 2 + 20
    height = max(y for _, y in centers.values()) + NODE_H / 2 + 40
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="11">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#888"/></marker></defs>',
    ]
    for a, b in g.edges:
        (x1, y1), (x2, y2) = centers[id(a)], centers[id(b)]
        y1, y2 = y1 + NODE_H / 2, y2 - NODE_H / 2
        mid = (y1 + y2) / 2
        parts.append(
            f'<path class="edge" data-from="n{g.nodes.index(a)}" data-to="n{g.nodes.index(b)}" '
            f'd="M {x1:.1f} {y1:.1f} C {x1:.1f} {mid:.1f}, {x2:.1f} {mid:.1f}, {x2:.1f} {y2:.1f}" '
            f'fill="none" stroke="#999" marker-end="url(#arrow)"/>'
        )
    for k, n in enumerate(g.nodes):
        x, y = centers[id(n)]
        fill, line = _STYLE[g.kind(n)]
        fill = (fills or {}).get(id(n), fill)
        width_px = 3 if n is g.center else 1.2
        parts.append(
            f'<g class="node" id="n{k}" data-kind="{g.kind(n)}"><title>{html.escape(tooltip(n))}</title>'
            f'<rect x="{x - NODE_W / 2:.1f}" y="{y - NODE_H / 2:.1f}" width="{NODE_W}" height="{NODE_H}" '
            f'rx="8" fill="{fill}" stroke="{line}" stroke-width="{width_px}"/>'
        )
        for row, text in enumerate(t for t in label_lines(n) if t):
            weight = ' font-weight="bold"' if row == 0 else ""
            parts.append(
                f'<text x="{x:.1f}" y="{y - NODE_H / 2 + 17 + row * 16:.1f}" text-anchor="middle"{weight}>'
                f"{html.escape(fit(text, 34))}</text>"
            )
        cut_in, cut_out = g.hidden.get(id(n), (0, 0))
        if cut_in:
            parts.append(
                f'<text x="{x + NODE_W / 2 - 4:.1f}" y="{y - NODE_H / 2 - 4:.1f}" text-anchor="end" '
                f'fill="#888">+{cut_in} operand{"s" if cut_in > 1 else ""} not shown</text>'
            )
        if cut_out:
            parts.append(
                f'<text x="{x + NODE_W / 2 - 4:.1f}" y="{y + NODE_H / 2 + 12:.1f}" text-anchor="end" '
                f'fill="#888">+{cut_out} user{"s" if cut_out > 1 else ""} not shown</text>'
            )
        parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts)


# -- HTML -----------------------------------------------------------------------------------------------
_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: Helvetica, Arial, sans-serif; margin: 0; display: flex; height: 100vh; }}
#graph {{ flex: 1; overflow: auto; border-right: 1px solid #ddd; }}
#side {{ width: 360px; padding: 12px; overflow: auto; font-size: 13px; }}
#side pre {{ white-space: pre-wrap; word-break: break-all; background: #f6f6f6; padding: 8px; }}
.legend span {{ display: inline-block; padding: 2px 6px; margin: 2px; border-radius: 4px; border: 1px solid; }}
g.node {{ cursor: pointer; }}
g.node.selected rect, g.node.selected polygon, g.node.selected path {{ stroke: #0050d0; stroke-width: 3; }}
</style></head><body>
<div id="graph">{svg}</div>
<div id="side"><h3>{title}</h3><p>{summary}</p><div class="legend">{legend}</div>
<p>Click a node for its details.</p><pre id="details"></pre></div>
<script>
const details = {details};
const nodes = document.querySelectorAll("g.node");
document.body.setAttribute("data-nodes", nodes.length);   // what a headless check reads back
nodes.forEach(function (node) {{
  node.addEventListener("click", function () {{
    document.querySelectorAll("g.node.selected").forEach(function (n) {{ n.classList.remove("selected"); }});
    node.classList.add("selected");
    document.getElementById("details").textContent = details[node.id] || node.textContent;
  }});
}});
</script></body></html>
"""


def to_html(g: Graph, svg: str | None = None) -> str:
    svg = svg if svg is not None else to_svg(g)
    graphviz = 'class="graph"' in svg[:2000]  # dot's SVG: its node ids are node1.. : map by title
    details = {f"n{k}": tooltip(n) for k, n in enumerate(g.nodes)}
    if graphviz:  # Graphviz names its groups node1, node2 ... in the order of the DOT statements
        svg = _graphviz_ids(svg, g)
    legend = "".join(
        f'<span style="background:{fill};border-color:{line}">{kind}</span>' for kind, (fill, line) in _STYLE.items()
    )
    center = f", around %{g.center.name}" if g.center is not None else ""
    summary = (
        f"{len(g.nodes)} of the {len(g.computation.instructions)} instructions of computation "
        f"%{html.escape(g.computation.name)}{html.escape(center)}; edges go from operand to user."
    )
    return _PAGE.format(
        title=html.escape(f"hloexec graph: %{g.computation.name}{center}"),
        svg=svg,
        summary=summary,
        legend=legend,
        details=json.dumps(details).replace("</", "<\\/"),
    )


def _graphviz_ids(svg: str, g: Graph) -> str:
    """Give Graphviz's node groups our ids (n0, n1, ...), found by their <title> (the DOT node name)."""
    svg = re.sub(
        r'<g id="node\d+" class="node">\s*<title>(n\d+_(?:in|out))</title>',  # "+N users" stubs
        lambda m: f'<g class="stub"><title>{m.group(1)}</title>',
        svg,
    )
    return re.sub(
        r'<g id="node\d+" class="node">\s*<title>(n\d+)</title>',
        lambda m: f'<g id="{m.group(1)}" class="node"><title>{m.group(1)}</title>',
        svg,
    )
