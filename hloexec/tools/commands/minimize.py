"""`hloexec minimize`: shrink a module while a check keeps saying it is interesting (tools/minimize.py)."""

from __future__ import annotations

import sys

from ..arrays import flatten
from ..common import (
    EXIT_OK,
    JSON_VERSION,
    UsageError,
    add_max_memory_argument,
    add_subparser,
    count,
    load_module,
    module_inputs,
    output_file,
    positive_float,
    print_json,
)
from ..devices import add_device_argument, device_option
from ..minimize import Check, minimize
from ..xla_cpu import open_output, save_arrays


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "minimize",
        "Shrink a module while a check keeps saying it is interesting.",
        "  hloexec minimize model.hlo --check nan -o small.hlo\n"
        "  hloexec minimize model.hlo --check xla -o small.hlo --seed 3\n"
        "  hloexec minimize model.hlo --check shadow -o small.hlo\n"
        "  hloexec minimize model.hlo --check 'my_check.sh {} {inputs}' -o small.hlo",
        [parents.common, parents.inputs],
        "CHECK: nan (an output holds a NaN made from finite inputs), xla (hloexec and XLA:CPU disagree),\n"
        "shadow (XLA:CPU's or hloexec's outputs not consistent with the exact answer), or a shell\n"
        "command: {} is the candidate's path, {inputs} its inputs (npz); exit 0 = interesting.",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument("--check", required=True, metavar="CHECK")
    p.add_argument("-o", "--out", required=True, type=output_file, metavar="OUT.hlo")
    p.add_argument("--inputs-out", type=output_file, metavar="OUT.npz", help="the result's inputs (default: OUT.npz)")
    p.add_argument("--retries", type=count, default=1, metavar="N", help="retries of a failing check (flakiness; 1)")
    p.add_argument("--timeout", type=positive_float, default=600.0, metavar="S", help="seconds per command check (600)")
    add_device_argument(p)
    add_max_memory_argument(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    """`hloexec minimize FILE --check CHECK -o OUT.hlo`."""
    module, _ = load_module(args)
    drawn = {}

    def draw() -> list:  # once the module is prepared: an invalid or too big module draws nothing
        inputs, drawn["info"] = module_inputs(module, args)
        return inputs

    say = (lambda message: print(message, file=sys.stderr, flush=True)) if args.json else print
    device = device_option(args.device, module)
    check = Check(args.check, args.timeout, device)
    try:
        result = minimize(module, draw, check, args.retries, say, device, args.max_memory)
    except ValueError as e:
        raise UsageError(str(e)) from None
    inputs_out = args.inputs_out or (args.out[:-4] if args.out.endswith(".hlo") else args.out) + ".npz"
    with open_output(args.out) as f:
        f.write(result.text)
    save_arrays(inputs_out, {f"arg{i}": v for i, v in enumerate(flatten(tuple(result.inputs)))})
    if args.json:
        print_json(
            {
                "command": "minimize",
                "version": JSON_VERSION,
                "file": args.file,
                "module": module.name,
                "check": args.check,
                "inputs": drawn["info"],
                "out": args.out,
                "inputs_out": inputs_out,
                **result.to_dict(),
            }
        )
    else:
        print(
            f"{result.original_instructions} -> {result.instructions} instructions in {result.checks} checks"
            + (f" ({result.flaky} flaky)" if result.flaky else "")
            + f"; the check holds on the result "
            f"{result.final_holds} times"
        )
        print(f"written: {args.out} (inputs: {inputs_out})")
    return EXIT_OK
