"""`hloexec diff`: where two versions of a program part ways (tools/diff.py)."""

from __future__ import annotations

import sys
import time

from ...options import REDUCTIONS
from ..common import (
    EXIT_MISMATCH,
    EXIT_OK,
    JSON_VERSION,
    UsageError,
    add_max_memory_argument,
    add_subparser,
    count,
    inputs_text,
    module_inputs,
    non_negative_float,
    parse_module_file,
    print_json,
    select_module,
)
from ..devices import add_device_argument, device_option
from ..diff import diff, side_errors
from ..diff_format import format_report


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "diff",
        "Where two versions of a program part ways: the first values that differ while their inputs agree.",
        "  hloexec diff before.hlo after.hlo --seed 0\n"
        "  hloexec diff DIR --module jit_f --stage before --stage-b after\n"
        "  hloexec diff model.hlo edited.hlo --json | jq '.first_divergence[0]'",
        [parents.common, parents.inputs],
        "Instructions are paired by name, then op_name metadata + opcode + shape, then structure (fusions\n"
        "opened up); both modules run on the same inputs with taps on the pairs. Exit 1 when values differ.",
    )
    p.add_argument("a", metavar="A")
    p.add_argument("b", metavar="B", nargs="?", help="default: A again (a dump directory with --stage-b)")
    p.add_argument("--stage-b", metavar="STAGE", help="B's stage when B is a dump directory (default: --stage)")
    tolerance_options(p)
    add_device_argument(p)
    add_max_memory_argument(p)
    p.add_argument(
        "--reference",
        choices=["shadow"],
        default=None,
        help="shadow: also judge each first divergence by both sides' error bounds (their distance from the "
        "exact answer as compare --reference shadow allows it): beyond them, or a rounding change within them "
        "(exit 1 only when one is beyond)",
    )
    p.add_argument("--limit", type=count, default=10, metavar="N", help="first divergences printed (10)")
    p.add_argument(
        "--no-zoom",
        action="store_true",
        help="observe every value op by op from the start (no compiled fusions diffed later)",
    )
    p.set_defaults(handler=run)


def run(args) -> int:
    """`hloexec diff A B`."""
    if args.b is None:
        raise UsageError("diff needs two modules: A B, or a dump directory with --stage and --stage-b")
    modules = []
    for side, path in (("A", args.a), ("B", args.b)):
        with side_errors(side, path):
            parsed, _ = parse_module_file(path)
            modules.append(select_module(parsed, args.module, path))
    drawn = {}

    def draw() -> list:  # once both modules are prepared: an invalid or too big module draws nothing
        with side_errors("A", args.a):  # the inputs are made for A's parameters (B's are the same)
            inputs, drawn["info"] = module_inputs(modules[0], args)
        return inputs

    start = time.perf_counter()
    try:
        report = diff(
            modules[0],
            modules[1],
            draw,
            atol=args.atol,
            rtol=args.rtol,
            zoom=not args.no_zoom,
            reductions=args.reductions,
            device=device_option(args.device, modules[0]),
            reference=args.reference,
            max_memory=args.max_memory,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    seconds = time.perf_counter() - start
    described = [{"file": path, "module": m.name} for path, m in zip((args.a, args.b), modules)]
    if args.json:
        print_json(
            {
                "command": "diff",
                "version": JSON_VERSION,
                "a": described[0],
                "b": described[1],
                "inputs": drawn["info"],
                "seconds": seconds,
                **report.to_dict(),
            }
        )
    else:
        print(
            f"A {args.a} ({modules[0].name})\nB {args.b} ({modules[1].name})\nsame inputs to both: {inputs_text(args)}"
        )
        print(format_report(report, limit=args.limit))
        print(f"time: {seconds:.1f} s", file=sys.stderr)
    failed = report.beyond_bounds if args.reference == "shadow" else report.diverges
    return EXIT_MISMATCH if failed else EXIT_OK


def tolerance_options(p) -> None:
    """--atol / --rtol: the bounds of every verdict (default: `hloexec compare`'s by type); --reductions."""
    p.add_argument(
        "--atol", type=non_negative_float, help="absolute error bound for every value (default: compare's by type)"
    )
    p.add_argument(
        "--rtol", type=non_negative_float, help="relative error bound for every value (default: compare's by type)"
    )
    p.add_argument(
        "--reductions",
        choices=REDUCTIONS,
        default="accumulate",
        help="how both round f16/bf16 sums (as `hloexec run`: accumulate, or per-step as XLA:CPU)",
    )
