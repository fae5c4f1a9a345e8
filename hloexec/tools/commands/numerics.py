"""`hloexec numerics`: which instructions lose the accuracy, and where NaN and Inf come from
(tools/numerics.py: the run paired with its shadow)."""

from __future__ import annotations

import sys
import time

from ..common import (
    EXIT_MISMATCH,
    EXIT_OK,
    JSON_VERSION,
    add_subparser,
    inputs_text,
    load_module,
    positive_int,
    prepare,
    print_json,
)
from ..participants import numerics_runner


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "numerics",
        "Which instructions lose the accuracy, and where NaN and Inf come from.",
        "  hloexec numerics dump.before_optimizations.txt --inputs in.npz\n"
        "  hloexec numerics step.hlo --seed 1 --top 10 --json | jq '.top[0]'\n"
        "  hloexec numerics gpt_16dev.hlo --spmd --local     # no shadow run: one run's memory",
        [parents.common, parents.execution],
        "One instrumented run of the module (op by op, fused computations opened up, loops per\n"
        "iteration) paired with its shadow (every float type in f64: its exact answer). Per\n"
        "instruction: its local error (its op alone on the shadow's operand values rounded to its\n"
        "own operand types, against the shadow's value), its total error (its value against the\n"
        "shadow's) and the error its operands arrived with, relative to its scale; per output, its\n"
        "error and the instructions on its path with the largest local errors; the integer/pred\n"
        "values computed from floats that differ between the two runs; the NaN/Inf origins.\n"
        "When both runs do not fit in memory (or with --local): local errors at the run's own\n"
        "operands, from the run alone.",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument("--top", type=positive_int, default=20, metavar="N", help="instructions to list (default 20)")
    p.add_argument(
        "--local", action="store_true", help="no shadow run: local errors at the run's own operands (one run's memory)"
    )
    p.set_defaults(handler=run)


def run(args) -> int:
    from ..numerics import attribute  # the executor: not at startup
    from ..numerics_format import format_numerics, numerics_dict

    text_out = None if args.json else sys.stdout
    module, _ = load_module(args)
    exe, _ = prepare(module, args)
    runner, inputs, inputs_info = numerics_runner(exe, args, text_out)
    say = lambda message: print(message, file=text_out or sys.stderr, flush=True)  # noqa: E731
    start = time.perf_counter()
    reductions = args.reductions or "per-step"  # the HLO's meaning: every reducer step rounds
    report = attribute(exe, inputs, runner, mode="local" if args.local else "auto", reductions=reductions, say=say)
    seconds = time.perf_counter() - start
    if args.json:
        print_json(
            {
                "command": "numerics",
                "version": JSON_VERSION,
                "file": args.file,
                "module": module.name,
                "inputs": inputs_info,
                "seconds": seconds,
                **numerics_dict(report, args.top),
            }
        )
    else:
        print(
            f"module {module.name}, inputs {inputs_text(args)}"
            + (
                ": the run paired with its shadow (every float type in f64)"
                if report.mode == "paired"
                else ": local errors at the run's own operands (no shadow run)"
            )
            + (
                "; f16/bf16 reductions round every step (the most pessimistic plausible order)"
                if reductions == "per-step"
                else "; f16/bf16 reductions accumulate in f32"
            )
        )
        print(format_numerics(report, args.top))
        print(f"time: {seconds:.2f} s")
    return EXIT_MISMATCH if report.nonfinite is not None and report.nonfinite.origins else EXIT_OK
