"""`hloexec run`: run a module on the CPU and summarise its outputs; with --shadow its error against the exact
answer, with --find-nonfinite where NaN and Inf come from, with --spmd every participant (run_spmd.py)."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict

from ...exec.tiering import format_compile_report
from ..arrays import array_summary
from ..common import (
    EXIT_MISMATCH,
    EXIT_OK,
    JSON_VERSION,
    SUMMARY_HEADER,
    UsageError,
    add_subparser,
    check_memory,
    execute,
    inputs_text,
    load_module,
    module_inputs,
    output_file,
    positive_int,
    prepare,
    print_constrained,
    print_json,
    summary_row,
)
from ..participants import is_spmd, numerics_runner
from ..xla_cpu import save_arrays
from .run_spmd import run_spmd


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "run",
        "Run a module on the CPU and summarise its outputs.",
        "  hloexec run model.hlo                       # random inputs, seed 0\n"
        "  hloexec run model.hlo --inputs in.npz --out out.npz\n"
        "  hloexec run dump.hlo --module jit_f --seed 3 --fail-on-nan --json\n"
        "  hloexec run step.hlo --profile 10           # the 10 slowest instructions\n"
        "  hloexec run step.hlo --repeat 3 --profile    # ... of the third (warm) run\n"
        "  hloexec run gpt_16dev.hlo --spmd --out out.npz    # all 16 participants\n"
        "  hloexec run gpt_16dev.hlo --spmd --ray            # ... as Ray actors, a local Ray instance\n"
        "  hloexec run big.hlo --ray auto --participants-per-worker 8   # ... on the cluster of `ray start`\n"
        "  hloexec run neuron.hlo --custom-call-identity AwsNeuronTransferWithStaticRing\n"
        "  hloexec run rms.hlo --plugin examples/custom_call_plugin.py   # targets from a Python file\n"
        "  hloexec run step.hlo --shadow                 # its error against the exact answer\n"
        "  hloexec run step.hlo --find-nonfinite --stop-at-first",
        [parents.common, parents.execution],
        "Prints the memory needed (peak live buffers) first and refuses to run above the\n"
        "available memory (MemAvailable) or --max-memory; then per output its shape, dtype,\n"
        "min/max/mean (NaN ignored) and NaN/Inf counts, and the parse/prepare/execute times.\n\n"
        "SPMD (--spmd, --partitions N, --replicas R): all N x R participants run as threads with\n"
        "their collectives between them. Inputs: --inputs with dev{d}/arg{i} keys (per device) or\n"
        "arg{i} keys (global arrays, split by the parameters' shardings), or --seed (random global\n"
        "arrays split the same way). Prints the memory for all participants before the run, one\n"
        "line per output (its device range when the devices agree; otherwise min/max over all),\n"
        "and whether outputs meant to be replicated agree (exit 1 when not). --out writes the\n"
        "global outputs assembled by the output shardings (out{i}) and per-device ones\n"
        "(dev{d}/out{i}).\n\n"
        "--ray [ADDRESS]: the participants run in Ray actors (a group per actor, threads inside), on a\n"
        "new local Ray instance or the cluster at ADDRESS; the outputs stay on the workers (digests\n"
        "and summaries are made there; --out gathers them); the end of the report says the bytes\n"
        "moved between the workers. Needs pip install 'hloexec[ray]' on every node.",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--out", type=output_file, metavar="NPZ", help="write the outputs as out0..outM (tuple results flattened)"
    )
    p.add_argument("--fail-on-nan", action="store_true", help="exit 1 when an output holds a NaN")
    p.add_argument(
        "--profile",
        type=positive_int,
        nargs="?",
        const=20,
        default=0,
        metavar="N",
        help="time every instruction of the entry computation (calls inlined); print the N slowest "
        "(default 20), then how many fused computations and while loops have a compiled kernel "
        "and why the others run op by op",
    )
    p.add_argument(
        "--repeat",
        type=positive_int,
        default=1,
        metavar="R",
        help="run R times (outputs and --profile from the last: kernels compile in the background "
        "from a fusion's second call, later runs use those ready; --compile eager --repeat 2 "
        "shows the warm module)",
    )
    p.add_argument(
        "--find-nonfinite",
        action="store_true",
        help="one observed run (op by op): the instructions that first make NaN or Inf from operands "
        "without them, with operand ranges, op_name, source line and the path to the outputs "
        "(intentional infinities, e.g. a -inf mask, only when they turn into NaN); exit 1 if any",
    )
    p.add_argument(
        "--stop-at-first", action="store_true", help="with --find-nonfinite: end the run at the first origin"
    )
    p.add_argument(
        "--shadow",
        action="store_true",
        help="also run the module's shadow (every float type in f64: its exact answer); print the run's "
        "error per output, and where integer/pred values computed from floats differ; --out writes "
        "the shadow's outputs",
    )
    p.set_defaults(handler=run)


def run(args) -> int:
    text_out = None if args.json else sys.stdout
    module, parse_s = load_module(args)
    exe, prepare_s = prepare(module, args)
    if args.shadow and args.find_nonfinite:
        raise UsageError("--shadow and --find-nonfinite are two runs: give one (hloexec numerics does both)")
    if args.shadow:
        return _run_shadow(exe, args, text_out)
    if args.find_nonfinite:
        return _run_nonfinite(exe, args, text_out)
    if is_spmd(args):
        if args.repeat != 1:
            raise UsageError("--repeat runs one participant; it does not combine with --spmd")
        return run_spmd(exe, args, text_out, {"parse": parse_s, "prepare": prepare_s})
    memory = check_memory(exe, args, text_out)
    if exe.manual_regions:
        from ...spmd import device_counts  # the executor: not at startup

        partitions, replicas, _ = device_counts(exe.module)
        print(
            f"{module.name} is a pre-partition module with manual regions: each of its {partitions * replicas} "
            "devices runs the global program and its own tiles inside the regions",
            file=text_out or sys.stderr,
        )
    inputs, inputs_info = module_inputs(exe.module, args)
    profile: dict | None = {} if args.profile else None
    runs = []
    for k in range(args.repeat):  # later runs use the kernels compiled by then (docs/compile.md)
        outputs, seconds_k = execute(exe, inputs, profile if k == args.repeat - 1 else None)
        runs.append(seconds_k)
    execute_s = runs[0]
    summaries = [array_summary(i, a) for i, a in enumerate(outputs)]
    nan_found = any(s["nan"] for s in summaries)
    if args.out is not None:
        save_arrays(args.out, {f"out{i}": a for i, a in enumerate(outputs)})
    seconds = {"parse": parse_s, "prepare": prepare_s, "execute": execute_s}
    if args.repeat > 1:
        seconds["runs"] = runs
    slowest = profile_rows(exe, profile, args.profile) if profile is not None else None
    tiers = exe.context.tier_report if args.profile else None
    compiled = exe.compile_report() if args.profile else None
    if args.json:
        print_json(
            {
                "command": "run",
                "version": JSON_VERSION,
                "file": args.file,
                "module": module.name,
                "inputs": inputs_info,
                "memory": memory,
                "seconds": seconds,
                "outputs": summaries,
                "nan_found": nan_found,
                "out": args.out,
                "profile": slowest,
                "elided_constants": [c.name for c in module.elided_constants()],
                "tiers": tiers.to_dict() if tiers is not None else None,
                "compile": compiled,
            }
        )
    else:
        print(
            f"module {module.name}: {len(outputs)} output{'s' if len(outputs) != 1 else ''}, inputs "
            + inputs_text(args)
        )
        print_constrained(inputs_info)
        print(f"{'out':>4}  {SUMMARY_HEADER}")
        for s in summaries:
            print(f"{s['index']:>4}  {summary_row(s)}")
        last = f", {runs[-1] * 1e3:.1f} ms (run {len(runs)})" if len(runs) > 1 else ""
        print(
            f"time: parse {parse_s * 1e3:.1f} ms, prepare {prepare_s * 1e3:.1f} ms, "
            f"execute {execute_s * 1e3:.1f} ms (first run){last}"
        )
        if slowest:
            print(
                f"slowest {len(slowest)} instructions of the entry computation in run {len(runs)} (calls inlined; "
                "loops and fused groups inclusive):"
            )
            for row in slowest:
                print(
                    f"  {row['ms']:10.2f} ms {row['share']:6.1%}  %{row['name']} = {row['shape']} {row['opcode']}"
                    + (f" (fused: {row['fused']} instructions)" if row["fused"] else "")
                    + f"  line {row['line']}"
                )
        if tiers is not None and compiled is not None:
            print("compiled tiers (fused computations and while loops; op by op: how many, why):")
            for line in tiers.format():
                print("  " + line)
            for line in format_compile_report(compiled):
                print("  " + line)
        if args.out is not None:
            print(f"outputs written to {args.out}")
    if nan_found and args.fail_on_nan:
        print("error: NaN in the outputs (--fail-on-nan)", file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_OK


def profile_rows(exe, profile: dict, top: int) -> list[dict]:
    """The `top` slowest instructions of a profiled run of the entry computation (its calls inlined), slowest
    first."""
    total = sum(profile.values()) or 1.0
    fused = {id(g.root): len(g.members) for g in exe.plan.fused_groups}
    rows = sorted(profile.items(), key=lambda item: -item[1])[:top]
    return [
        {
            "name": inst.name,
            "opcode": inst.opcode,
            "shape": inst.shape.to_text(layout=False),
            "line": inst.line,
            "ms": seconds * 1e3,
            "share": seconds / total,
            "fused": fused.get(id(inst), 0),
        }
        for inst, seconds in rows
    ]


def _run_shadow(exe, args, text_out) -> int:
    """`hloexec run --shadow`: the module and its shadow (every float type in f64), the run's error per output."""
    from ..numerics import format_shadow_report, shadow_report, shadow_run  # the executor: not at startup

    if not is_spmd(args):
        check_memory(exe, args, text_out)
    runner, inputs, inputs_info = numerics_runner(exe, args, text_out)
    start = time.perf_counter()
    paired = shadow_run(exe, inputs, runner)
    seconds = time.perf_counter() - start
    report = shadow_report(paired)
    if args.out is not None:
        save_arrays(args.out, {f"out{i}": a for i, a in enumerate(paired.shadow)})
    if args.json:
        print_json(
            {
                "command": "run",
                "version": JSON_VERSION,
                "file": args.file,
                "module": exe.module.name,
                "inputs": inputs_info,
                "shadow": report,
                "seconds": {"execute": seconds},
                "out": args.out,
            }
        )
        return EXIT_OK
    print(
        f"module {exe.module.name}: {len(paired.outputs)} output{'s' if len(paired.outputs) != 1 else ''}, inputs "
        + inputs_text(args)
        + "; the shadow runs every float type in "
        "f64 (the program's exact answer); errors relative to each output's scale (max |shadow|)"
    )
    print_constrained(inputs_info)
    print(format_shadow_report(report))
    print(f"time: {seconds:.2f} s (the run and its shadow)")
    if args.out is not None:
        print(f"shadow outputs (f64) written to {args.out}")
    return EXIT_OK


def _run_nonfinite(exe, args, text_out) -> int:
    """`hloexec run --find-nonfinite`: the instructions that first make NaN or Inf (exit 1 when there are some)."""
    from ..nonfinite import find_nonfinite, format_report  # the executor: not at startup

    if not is_spmd(args):
        check_memory(exe, args, text_out)
    runner, inputs, inputs_info = numerics_runner(exe, args, text_out)
    report = find_nonfinite(exe, inputs, runner, stop_at_first=args.stop_at_first)
    if args.json:
        print_json(
            {
                "command": "run",
                "version": JSON_VERSION,
                "file": args.file,
                "module": exe.module.name,
                "inputs": inputs_info,
                **asdict(report),
            }
        )
    else:
        print(
            f"module {exe.module.name}, inputs " + inputs_text(args) + ": where NaN and Inf come from (execution order)"
        )
        print_constrained(inputs_info)
        print(format_report(report))
    return EXIT_MISMATCH if report.origins else EXIT_OK
