"""`hloexec graph`: the neighbourhood of an instruction as DOT, SVG or HTML (tools/graph.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..common import (
    EXIT_OK,
    JSON_VERSION,
    UsageError,
    add_subparser,
    count,
    load_module,
    output_file,
    positive_int,
    print_json,
)
from ..graph import neighbourhood, to_dot, to_html, to_svg
from ..xla_cpu import open_output


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "graph",
        "Draw the neighbourhood of an instruction: DOT, SVG or self-contained HTML.",
        "  hloexec graph gpt_16dev.hlo --around all-reduce.4 --depth 2 -o ar4.html\n"
        "  hloexec graph step.hlo --around fusion.12 -o f12.svg\n"
        "  hloexec graph small.hlo -o small.dot                 # a small entry computation whole",
        [parents.common, parents.stages],
        "Nodes: name and opcode (a fusion: its kind and fused ops), shape, op_name; collectives, custom-calls,\n"
        "fusions and parameters coloured; the centre drawn thick; '+N not shown' where the neighbourhood\n"
        "was cut. Without --around: the computation when it has at most --max-nodes instructions, else\n"
        "its root's neighbourhood. SVG from Graphviz's dot where installed, else hloexec's own layout;\n"
        "the HTML page inlines everything (click a node for its details).",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument("--module", metavar="NAME", help="the module to use when the file holds several")
    p.add_argument("--around", metavar="INSTRUCTION", help="the instruction at the centre (its name, %% optional)")
    p.add_argument("--depth", type=count, default=2, metavar="K", help="operand/user steps from the centre (default 2)")
    p.add_argument(
        "--computation",
        metavar="NAME",
        help="draw in this computation (default: the entry, or the one holding --around)",
    )
    p.add_argument(
        "--max-nodes", type=positive_int, default=120, metavar="N", help="at most N instructions (default 120)"
    )
    p.add_argument(
        "-o", "--output", required=True, type=output_file, metavar="OUT", help="OUT.html, OUT.svg or OUT.dot"
    )
    p.set_defaults(handler=run)


def run(args) -> int:
    suffix = Path(args.output).suffix.lower()
    if suffix not in (".html", ".svg", ".dot"):
        raise UsageError(f"-o {args.output}: the suffix says the format: .html, .svg or .dot")
    module, _ = load_module(args)
    g = neighbourhood(
        module, args.around.lstrip("%") if args.around else None, args.depth, args.computation, args.max_nodes
    )
    renderer = "graphviz" if suffix != ".dot" and shutil.which("dot") else "hloexec"
    text = {".dot": to_dot, ".svg": to_svg, ".html": to_html}[suffix](g)
    with open_output(args.output) as f:
        f.write(text)
    doc = {
        "command": "graph",
        "version": JSON_VERSION,
        "file": args.file,
        "module": module.name,
        "computation": g.computation.name,
        "center": g.center.name if g.center else None,
        "nodes": len(g.nodes),
        "edges": len(g.edges),
        "output": args.output,
        "renderer": renderer if suffix != ".dot" else None,
        "stopped_at": g.stopped_at,
    }
    if args.json:
        print_json(doc)
    else:
        print(
            f"{args.output}: {len(g.nodes)} of {len(g.computation.instructions)} instructions of %{g.computation.name}"
            + (f" around %{g.center.name} (depth {args.depth})" if g.center else "")
            + (f", drawn by {renderer}" if suffix != ".dot" else "")
        )
        for edge in g.stopped_at:
            print(f"  stopped at the edge of %{g.computation.name}: {edge}")
    return EXIT_OK
