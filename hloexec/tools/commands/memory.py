"""`hloexec memory`: peak memory and what is live there (tools/memory.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..common import (
    EXIT_OK,
    JSON_VERSION,
    add_subparser,
    described_device_count,
    load_for_report,
    output_file,
    positive_int,
    print_json,
    require,
)

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "memory",
        "Peak memory and what is live there, from the plan `run` checks memory with.",
        "  hloexec memory step.hlo\n"
        "  hloexec memory tpu_8dev.hlo --spmd --plot timeline.png\n"
        "  hloexec memory dump/module_0001.jit_f.cpu_after_optimizations.txt --json | jq '.peak_bytes'",
        [parents.common, parents.stages],
        "Nothing runs: the plan is prepared (no kernel compiled) and its liveness read. The peak is the\n"
        "estimate `hloexec run` checks against the available memory: live buffers in hloexec's schedule,\n"
        "inputs included, plus what the running step holds (scratch: f32 copies of f16 operands, a\n"
        "fusion's op-by-op first run); the peak of the program's values alone is shown too. Each live\n"
        "value: its producer, its last reader, its size and why it is live (a parameter, an output,\n"
        "waiting for a later reader: which). An SPMD program is the same on every device; --spmd adds\n"
        "what `run --spmd` needs for all participants in one process. XLA's numbers are shown beside\n"
        "when its dumps (X-buffer-assignment.txt, X-memory-usage-report.txt, X-live-range.txt) sit next\n"
        "to the module file X.txt. --plot needs matplotlib (pip install 'hloexec[reports]').",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument("--module", metavar="NAME", help="the module to use when the file holds several")
    p.add_argument("--spmd", action="store_true", help="all participants: counts from the header or inferred")
    p.add_argument(
        "--partitions", type=described_device_count, metavar="N", help="partitions per replica (implies --spmd)"
    )
    p.add_argument("--replicas", type=described_device_count, metavar="R", help="replicas (implies --spmd)")
    p.add_argument(
        "--plot",
        type=plot_file,
        metavar="FILE",
        help="write the timeline of live bytes (PNG, SVG or PDF by the suffix)",
    )
    p.add_argument("--top", type=positive_int, default=15, metavar="N", help="values listed per table (default 15)")
    p.set_defaults(handler=run)


def plot_file(text: str) -> str:
    """--plot's file: matplotlib picks the format by the suffix (and adds .png to a name without one)."""
    if Path(text).suffix.lower() not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(f"{text}: expected a file name ending in {', '.join(PLOT_SUFFIXES)}")
    return output_file(text)


def run(args) -> int:
    from ..memory import format_report, memory_report, plot_timeline  # the executor: not at startup

    exe = load_for_report(args)
    r = memory_report(exe, args.file, args.spmd, args.partitions, args.replicas)
    if args.plot:
        require("matplotlib", "reports", "--plot")
        plot_timeline(r, args.plot)
    if args.json:
        print_json({"command": "memory", "version": JSON_VERSION, **r.to_dict(), "plot": args.plot})
    else:
        print(format_report(r, args.top))
        if args.plot:
            print(f"timeline written to {args.plot}")
    return EXIT_OK
