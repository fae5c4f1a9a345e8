"""`hloexec compare`: a module's outputs against a reference (a second HLO file, --expected arrays, XLA:CPU) by
XLA's tolerances (tools/compare.py), or with --reference shadow candidates judged against the program's exact
answer (tools/verdict.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..arrays import check_global_shapes, flatten, read_values
from ..common import (
    EXIT_MISMATCH,
    EXIT_OK,
    JSON_VERSION,
    UsageError,
    actual_candidates,
    add_subparser,
    check_memory,
    execute,
    inputs_text,
    judge_candidates,
    load_module,
    module_inputs,
    non_negative_float,
    parse_module_file,
    prepare,
    print_json,
    result_leaves,
    run_on_xla,
    select_module,
)
from ..compare import DEFAULT_TOLERANCES, compare_outputs, computed_elsewhere_hint, format_report, mark_elided
from ..participants import global_arguments, is_spmd, numerics_runner, spmd_outputs
from ..verdict import format_verdict


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "compare",
        "Run a module and compare its outputs with a reference.",
        "  hloexec compare model.hlo --inputs in.npz --expected out.npz\n"
        "  hloexec compare model.opt.hlo model.pre.hlo --seed 1     # same inputs to both\n"
        "  hloexec compare model.hlo --against xla --atol 1e-4 --rtol 1e-4\n"
        "  hloexec compare cpu_after_optimizations.txt --inputs in.npz --expected xla.npz \\\n"
        "      --reductions per-step                 # f16 sums rounded at every step, as XLA:CPU\n"
        "  hloexec compare sharded.hlo unsharded.hlo --spmd --seed 0   # global outputs\n"
        "  hloexec compare pre.hlo opt.hlo --against xla --actual gpu.npz --reference shadow",
        [parents.common, parents.execution],
        _tolerances_help() + "\n\n"
        "--reference shadow: FILE's shadow (the program with every float type in f64: its exact\n"
        "answer) is the reference; FILE run by hloexec, REFERENCE, --against xla and --actual files\n"
        "are candidates, judged against the baseline (FILE at its precision, f16/bf16 reductions\n"
        "rounding every step): rms error <= 2x the baseline's + 0.5 ulp, every element within 1.5x its\n"
        "own error bound under the device's arithmetic (--device NAME[,NAME...]; docs/verdicts.md).\n\n"
        "--spmd / --partitions N: FILE is a sharded module; the same global inputs (random ones of\n"
        "the reference module's shapes, or --inputs with arg{i} keys) are split by FILE's parameter\n"
        "shardings, all its participants run, and its outputs, assembled into global arrays by the\n"
        "output shardings, are compared with the reference's.",
    )
    p.add_argument("file", metavar="FILE", help="the module under test")
    p.add_argument("other", metavar="REFERENCE", nargs="?", help="a second HLO file whose outputs are expected")
    p.add_argument(
        "--expected",
        metavar="NPZ",
        help="expected outputs: keys out0..outM, of the outputs' shapes and dtypes (else exit 2, a bad input)",
    )
    p.add_argument("--against", choices=["xla"], help="run FILE on XLA:CPU (jaxlib, in a child process)")
    p.add_argument(
        "--reference",
        choices=["shadow"],
        help="judge candidates (FILE run by hloexec, REFERENCE, --against xla, --actual) by their distance "
        "from FILE's shadow (every float type in f64: the exact answer): consistent with the "
        "program's precision or not (exit 1 when one is not)",
    )
    p.add_argument(
        "--actual",
        metavar="NPZ",
        action="append",
        help="with --reference shadow: a candidate's outputs (keys out0..outM, e.g. a device's); repeatable",
    )
    p.add_argument("--atol", type=non_negative_float, help="absolute error bound for every output")
    p.add_argument("--rtol", type=non_negative_float, help="relative error bound for every output")
    p.set_defaults(handler=run)


def _tolerances_help() -> str:
    """The compare defaults, from hloexec.tools.compare.DEFAULT_TOLERANCES."""
    by_bounds: dict = {}
    for name, bounds in DEFAULT_TOLERANCES.items():
        by_bounds.setdefault(bounds, []).append(name)
    rows = [f"  {', '.join(names):<12}atol {atol:<7g} rtol {rtol:g}" for (atol, rtol), names in by_bounds.items()]
    return (
        "tolerances (XLA's literal_comparison: an element fails only when it exceeds BOTH bounds;\n"
        "NaN matches NaN; an infinity matches only the same infinity; shapes and dtypes must be equal):\n"
        + "\n".join(rows)
        + "\n"
        "  fp8/fp6/fp4 atol = rtol = the type's epsilon\n"
        "  ints, pred  exact\n"
        "--atol / --rtol replace the bounds for every output."
    )


def _compared_modules(args):
    """(module, its Executable, the REFERENCE file's module, its Executable) of `compare` (None, None: no file)."""
    module, _ = load_module(args)
    exe, _ = prepare(module, args)
    if args.other is None:
        return module, exe, None, None
    other_modules, _ = parse_module_file(args.other)
    other = select_module(other_modules, args.module if len(other_modules) > 1 else None, args.other)
    return module, exe, other, prepare(other, args)[0]


def run(args) -> int:
    if args.reference == "shadow":
        return run_shadow(args)
    if args.actual:
        raise UsageError(
            "--actual is a candidate for --reference shadow; to compare two sets of outputs for "
            "equality, give FILE and --expected"
        )
    references = [r for r in (args.other, args.expected, args.against) if r is not None]
    if len(references) != 1:
        raise UsageError("compare needs exactly one reference: a second HLO file, --expected out.npz or --against xla")
    text_out = None if args.json else sys.stdout
    module, exe, other, other_exe = _compared_modules(args)
    if other_exe is not None:
        check_memory(other_exe, args, text_out)
        reference = {"from": "hlo", "file": args.other, "module": other.name}
    if args.expected is not None:
        # a file of other shapes or dtypes is a bad input (exit 2), as an --actual file is; SPMD: the per-device
        # shapes are not the global outputs', checked once they are assembled
        expected = read_values(args.expected, "out", result_leaves(exe), what="outputs", check_shapes=not is_spmd(args))
        reference = {"from": "npz", "path": args.expected}
    if is_spmd(args):
        if args.against is not None:
            raise UsageError("compare --spmd takes a reference HLO file or --expected, not --against xla")
        inputs, inputs_info = global_arguments(exe, other_exe, args)
        actual = flatten(
            spmd_outputs(exe, args, text_out, inputs, other_exe.module if other_exe is not None else None)[2]()
        )
        if args.expected is not None:
            check_global_shapes(args.expected, "out", flatten(tuple(expected)), actual)
    else:
        check_memory(exe, args, text_out)
        inputs, inputs_info = module_inputs(exe.module, args)
        actual, _ = execute(exe, inputs)
    if other_exe is not None:
        expected, _ = execute(other_exe, inputs)
    elif args.against is not None:
        expected = run_on_xla(module, args.file, inputs)
        reference = {"from": "xla"}
    report = mark_elided(
        compare_outputs(actual, expected, atol=args.atol, rtol=args.rtol),
        module,
        *([other_exe.module] if other_exe is not None else []),
    )
    # (a result that passes, or is consistent below, asks nothing: tiny values pass by atol, cancellation's are
    # mostly rounding, each off by more than a tenth of its own value)
    hint = (
        computed_elsewhere_hint(Path(args.expected).name, expected, actual)
        if args.expected and not report.passed
        else ""
    )
    if args.json:
        print_json(
            {
                "command": "compare",
                "version": JSON_VERSION,
                "actual": {"file": args.file, "module": module.name},
                "expected": reference,
                "inputs": inputs_info,
                "atol": args.atol,
                "rtol": args.rtol,
                **report.to_dict(),
                "hint": hint or None,
            }
        )
    else:
        what = {
            "npz": lambda r: r["path"],
            "hlo": lambda r: f"{r['file']} (module {r['module']})",
            "xla": lambda r: "XLA:CPU (jaxlib)",
        }[reference["from"]](reference)
        spmd_text = " (SPMD: global outputs assembled by their shardings)" if is_spmd(args) else ""
        print(f"{args.file} (module {module.name}){spmd_text} vs {what}; inputs {inputs_text(args)}")
        print(format_report(report))
        if hint:
            print(f"hint: {hint}")
    return EXIT_OK if report.passed else EXIT_MISMATCH


def run_shadow(args) -> int:
    """`compare --reference shadow`: candidates judged by their distance from FILE's exact answer (verdict.py)."""
    from ..numerics import shadow_report  # the executor: not at startup

    if args.expected is not None:
        raise UsageError("with --reference shadow, outputs from elsewhere are candidates: give them with --actual")
    if args.atol is not None or args.rtol is not None:
        raise UsageError("--reference shadow judges by the program's precision, not by --atol/--rtol")
    text_out = None if args.json else sys.stdout
    module, exe, _, other_exe = _compared_modules(args)
    if is_spmd(args):
        if args.against is not None:
            raise UsageError("compare --spmd takes a reference HLO file or --actual, not --against xla")
        global_inputs, inputs_info = global_arguments(exe, other_exe, args)
        runner, inputs, _ = numerics_runner(exe, args, text_out, global_inputs)
    else:
        check_memory(exe, args, text_out)
        runner, inputs, inputs_info = numerics_runner(exe, args, text_out)
        global_inputs = inputs
    candidates = {}  # by file name (a dump's directory is the same for every file in it)
    if other_exe is not None:
        candidates[Path(args.other).name] = execute(other_exe, global_inputs)[0]
    if args.against is not None:
        candidates["XLA:CPU"] = run_on_xla(module, args.file, inputs)
    actual = actual_candidates(exe, args.actual or (), spmd=is_spmd(args))
    candidates.update(actual)
    verdict, paired = judge_candidates(exe, module, args, inputs, candidates, runner)
    hints = (computed_elsewhere_hint(n, actual[n], paired.shadow) for n in actual if not verdict.consistent(n))
    hint = "; ".join(filter(None, hints))
    if args.json:
        report = shadow_report(paired)
        print_json(
            {
                "command": "compare",
                "version": JSON_VERSION,
                "reference": "shadow",
                "file": args.file,
                "module": module.name,
                "inputs": inputs_info,
                **verdict.to_dict(),
                "divergences": report["divergences"],
                "pinned": report["pinned"],
                "hint": hint or None,
            }
        )
    else:
        print(
            f"{args.file} (module {module.name}): candidates against its shadow (every float type in f64: the "
            f"exact answer); inputs {inputs_text(args)}"
        )
        print(
            "baseline: hloexec at the program's precision, f16/bf16 reductions rounding every step in index "
            "order (the most pessimistic plausible order); errors relative to each output's scale"
        )
        print(format_verdict(verdict))
        if paired.divergences:
            print(
                "integer/pred values computed from floats that differ between the run and the shadow (what "
                "follows them compares two different paths):"
            )
            for d in paired.divergences:
                print(f"  {d.describe()}")
        if hint:
            print(f"hint: {hint}")
    return EXIT_OK if verdict.consistent() else EXIT_MISMATCH
