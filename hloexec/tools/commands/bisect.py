"""`hloexec bisect`: the first compiler pass after which a program's outputs change (tools/bisect.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from ...parser import parse
from ..bisect import bisect, format_report
from ..common import (
    EXIT_ERROR,
    EXIT_MISMATCH,
    EXIT_OK,
    JSON_VERSION,
    UsageError,
    add_subparser,
    module_inputs,
    print_json,
)
from ..dumpdir import find_module, scan
from .diff import tolerance_options


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "bisect",
        "The first compiler pass after which a program's outputs change (per-pass dumps: --xla_dump_hlo_pass_re=.*).",
        "  hloexec bisect DIR --module jit_train_step\n  hloexec bisect DIR --module 6 --json\n"
        "  hloexec bisect DIR --module jit_train_step --reference shadow",
        [parents.common, parents.inputs],
        "Exit 1 when a stage changes the outputs, 0 when none does.",
    )
    p.add_argument("directory", metavar="DIR")
    tolerance_options(p)
    p.add_argument(
        "--reference",
        choices=["shadow"],
        default=None,
        help="shadow: a stage is bad when its outputs are not consistent with the program's exact "
        "answer (as compare --reference shadow judges), not when they merely differ",
    )
    p.add_argument("--no-diff", action="store_true", help="skip the diff of the last good and first bad stage")
    p.add_argument("-v", "--verbose", action="store_true", help="report each stage as it runs (stderr)")
    p.set_defaults(handler=run)


def run(args) -> int:
    """`hloexec bisect DIR --module NAME`."""
    if args.reference == "shadow" and (args.atol is not None or args.rtol is not None):
        raise UsageError("--reference shadow judges by the program's precision, not by --atol/--rtol")
    module = find_module(scan(args.directory), args.module, args.directory)
    inputs, inputs_info = None, {"from": "seed", "seed": args.seed}
    if args.inputs is not None:
        first = module.stages()[0] if module.stages() else None
        if first is not None:
            inputs, inputs_info = module_inputs(parse(first.text())[0], args)
    say = (lambda message: print(message, file=sys.stderr, flush=True)) if args.verbose else None
    report = bisect(
        module,
        inputs,
        args.seed,
        args.atol,
        args.rtol,
        with_diff=not args.no_diff,
        report=say,
        reductions=args.reductions,
        reference=args.reference or "first-stage",
    )
    if args.json:
        print_json(
            {
                "command": "bisect",
                "version": JSON_VERSION,
                "directory": str(Path(args.directory)),
                "inputs": inputs_info,
                **report.to_dict(),
            }
        )
    else:
        print(format_report(report))
    if report.reference is None or report.compared() < 2:  # nothing compared: no verdict to give
        return EXIT_ERROR
    return EXIT_MISMATCH if report.first_bad is not None else EXIT_OK
