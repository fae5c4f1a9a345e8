"""`hloexec ops`: what hloexec executes, opcodes, dtypes, kernels, custom-call targets (tools/optable.py)."""

from __future__ import annotations

import sys

from ..common import EXIT_OK, JSON_VERSION, add_subparser, print_json
from ..optable import custom_call_rows, markdown_table, op_rows


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "ops",
        "List what hloexec executes: opcodes, dtypes, kernels, custom-calls.",
        "  hloexec ops\n  hloexec ops --markdown > ops.md\n  hloexec ops --json",
        [parents.common],
    )
    p.add_argument("--markdown", action="store_true", help="the markdown table of docs/custom-calls.md, with notes")
    p.set_defaults(handler=run)


def run(args) -> int:
    if args.json:
        print_json({"command": "ops", "version": JSON_VERSION, "ops": op_rows(), "custom_calls": custom_call_rows()})
    elif args.markdown:
        sys.stdout.write(markdown_table())
    else:
        rows = op_rows()
        width = max(len(r["opcode"]) for r in rows)
        kernel_width = max(len(r["kernel"]) for r in rows)
        print(f"{'opcode':<{width}}  {'kernel':<{kernel_width}}  dtypes")
        for r in rows:
            print(f"{r['opcode']:<{width}}  {r['kernel']:<{kernel_width}}  {r['dtypes']}")
        print("\ncustom-call targets: " + ", ".join(t for r in custom_call_rows() for t in r["targets"]))
        print("(notes: hloexec ops --markdown)")
    return EXIT_OK
