"""`hloexec extract`: a standalone module computing one instruction, its inputs captured from a full run
(tools/extract.py)."""

from __future__ import annotations

import sys

from ...parser import parse
from ..arrays import flatten
from ..common import (
    EXIT_OK,
    JSON_VERSION,
    UsageError,
    add_subparser,
    count,
    inputs_text,
    load_module,
    module_inputs,
    output_file,
    print_json,
)
from ..diff import judge
from ..extract import boundary, capture, cone_cut, find_instruction, submodule
from ..xla_cpu import open_output, save_arrays


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "extract",
        "A standalone module computing one instruction, with the values that feed it captured from a full run.",
        "  hloexec extract model.hlo fusion.42 -o f42.hlo --inputs-out f42.npz\n"
        "  hloexec extract model.hlo multiply.7 --depth 3 -o m7.hlo --inputs-out m7.npz --seed 1\n"
        "  hloexec run f42.hlo --inputs f42.npz",
        [parents.common, parents.inputs],
        "INSTRUCTION may be inside a fused computation (COMPUTATION/NAME where names repeat).",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument("instruction", metavar="INSTRUCTION")
    depth = p.add_mutually_exclusive_group()
    depth.add_argument(
        "--depth",
        type=count,
        default=0,
        metavar="K",
        help="keep K levels of operands above it (default 0: its operands are the parameters)",
    )
    depth.add_argument("--until-parameters", action="store_true", help="keep everything back to the parameters")
    p.add_argument("-o", "--out", type=output_file, metavar="OUT.hlo", help="write the module here (default: stdout)")
    p.add_argument(
        "--inputs-out", type=output_file, metavar="OUT.npz", help="write the parameters' values here (one full run)"
    )
    p.set_defaults(handler=run)


def run(args) -> int:
    """`hloexec extract FILE INSTRUCTION`."""
    from ... import ops  # noqa: F401  (fills the op registry; the executor: not at startup)
    from ...exec.executor import Executable

    module, _ = load_module(args)
    try:
        inst = find_instruction(module, args.instruction)
    except KeyError as e:
        raise UsageError(e.args[0]) from None
    if inst.opcode == "parameter":
        raise UsageError(f"%{inst.name} is a parameter: nothing computes it")
    sub = submodule([inst], cone_cut(inst, None if args.until_parameters else args.depth))
    if args.out:
        with open_output(args.out) as f:
            f.write(sub.text)
    elif not args.json:
        sys.stdout.write(sub.text)
    replay = None
    inputs_info = None
    if args.inputs_out:
        exe = Executable(module)
        inputs, inputs_info = module_inputs(module, args)
        values = capture(exe, sub.parameters + [inst], inputs)
        save_arrays(args.inputs_out, {f"arg{i}": v for i, v in enumerate(flatten(tuple(values[:-1])))})
        got = Executable(parse(sub.text)[0]).run(*values[:-1])
        verdicts = [judge(want, value) for want, value in zip(flatten(values[-1]), flatten(got))]  # tuples: each leaf
        replay = {
            "identical": all(v.identical for v in verdicts),
            "agree": all(v.agree for v in verdicts),
            "max_abs_error": max((v.max_abs_error for v in verdicts), default=0.0),
            "max_rel_error": max((v.max_rel_error for v in verdicts), default=0.0),
        }
    entry_params = {id(p) for p in module.entry.parameters}
    params = [
        {
            "number": k,
            "name": p.name,
            "shape": p.shape.to_text(layout=False),
            "from": "entry parameter" if id(p) in entry_params else f"{p.opcode} in {p.parent.name}",
            "stopped_at": boundary(module, p),
        }
        for k, p in enumerate(sub.parameters)
    ]
    if args.json:
        print_json(
            {
                "command": "extract",
                "version": JSON_VERSION,
                "file": args.file,
                "module": module.name,
                "instruction": inst.name,
                "computation": inst.parent.name,
                "out": args.out,
                "inputs_out": args.inputs_out,
                "inputs": inputs_info,
                "instructions": sub.instruction_count,
                "parameters": params,
                "replay": replay,
                "text": None if args.out else sub.text,
            }
        )
        return EXIT_OK
    where = sys.stdout if args.out else sys.stderr
    print(
        f"%{inst.name} ({inst.opcode}, {inst.parent.name}): {sub.instruction_count} instructions, "
        f"{len(params)} parameter{'s' if len(params) != 1 else ''}" + (f", written to {args.out}" if args.out else ""),
        file=where,
    )
    for p in params:
        print(f"  parameter {p['number']}: %{p['name']} {p['shape']} ({p['from']})", file=where)
        if p["stopped_at"]:
            print(f"    stopped at the edge of %{inst.parent.name}: {p['stopped_at']}", file=where)
    if args.inputs_out:
        print(f"their values in the run of {module.name} (inputs {inputs_text(args)}): {args.inputs_out}", file=where)
    if replay is not None:
        print(
            "replay: the extract gives "
            + (
                "the same bits"
                if replay["identical"]
                else f"values within tolerance (max abs {replay['max_abs_error']:.3g})"
                if replay["agree"]
                else f"DIFFERENT values (max abs {replay['max_abs_error']:.3g})"
            )
            + " as in the full run",
            file=where,
        )
    return EXIT_OK
