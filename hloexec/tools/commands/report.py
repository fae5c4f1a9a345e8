"""`hloexec report`: one self-contained HTML page of a module's verdict, attribution, NaN/Inf and memory
(tools/report.py renders it)."""

from __future__ import annotations

import shlex
import sys
import time

from ... import __version__
from ...errors import ExecutionError, MemoryLimitError
from ..common import (
    EXIT_MISMATCH,
    EXIT_OK,
    JSON_VERSION,
    UsageError,
    actual_candidates,
    add_subparser,
    check_memory,
    judge_candidates,
    load_module,
    output_file,
    positive_int,
    prepare,
    print_json,
    run_on_xla,
)
from ..compare import jsonable
from ..participants import is_spmd, numerics_runner
from ..report import TOP, largest_errors, to_html, worst_graph
from ..stats import human_bytes, module_stats
from ..xla_cpu import open_output


def collect(args) -> tuple[dict, str | None]:
    """(the report's data, the SVG of the dataflow around the worst instruction or None): every part from the
    library function its own command uses."""
    from ..collectives import collectives_report  # the executor: not at startup
    from ..memory import memory_report
    from ..numerics import attribute
    from ..numerics_format import numerics_dict

    say = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731  (stdout: --json)
    command_line = "hloexec " + shlex.join(getattr(args, "command_line", None) or sys.argv[1:])
    seconds: dict[str, float] = {}

    def timed(section: str, compute):
        """`compute()`, its time kept under `section` and said (what each section costs: docs/reports.md)."""
        start = time.perf_counter()
        result = compute()
        seconds[section] = time.perf_counter() - start
        say(f"{section}: {seconds[section]:.1f} s")
        return result

    module, _ = timed("parse", lambda: load_module(args))
    exe, _ = timed("prepare", lambda: prepare(module, args))
    spmd = is_spmd(args)
    if spmd and args.against is not None:
        raise UsageError("report --spmd takes candidates with --actual, not --against xla")
    if not spmd:
        check_memory(exe, args, None)
    runner, inputs, inputs_info = timed("inputs", lambda: numerics_runner(exe, args, None))
    candidates = actual_candidates(exe, args.actual or (), spmd=spmd)
    if args.against is not None:
        candidates["XLA:CPU"] = timed("XLA:CPU", lambda: run_on_xla(module, args.file, inputs))
    say(f"{module.name}: the verdict (the run, its baseline and its shadow)")
    verdict, largest = timed(
        "verdict", lambda: _verdict(exe, module, args, inputs, candidates, runner, say, command_line)
    )
    say(f"{module.name}: the attribution (the run paired with its shadow, instruction by instruction)")
    numerics = timed(
        "attribution", lambda: attribute(exe, inputs, runner, reductions=args.reductions or "per-step", say=say)
    )
    stats = timed("module", lambda: module_stats(module))
    memory = timed(
        "memory",
        lambda: memory_report(exe, args.file, spmd=spmd, partitions=args.partitions, replicas=args.replicas),
    )
    collectives = (
        timed("collectives", lambda: collectives_report(module, args.file, args.partitions, args.replicas))
        if spmd or stats.collectives
        else None
    )
    graph, svg = timed("graph", lambda: worst_graph(module, numerics.instructions))
    data = {
        "command": "report",
        "version": JSON_VERSION,
        "hloexec_version": __version__,
        "command_line": command_line,
        "file": args.file,
        "module": module.name,
        "device": args.device or "reference",
        "inputs": inputs_info,
        "stats": stats.to_dict(),
        "verdict": verdict,
        "largest_errors": largest,
        "numerics": numerics_dict(numerics, args.top),
        "graph": graph,
        "memory": memory.to_dict(),
        "collectives": collectives.to_dict() if collectives is not None else None,
        "seconds": seconds,
    }
    return data, svg


def _verdict(exe, module, args, inputs, candidates, runner, say, command_line: str) -> tuple[dict, list]:
    """(the verdict's data, the run's largest errors); when the shadow is refused for memory, no verdict, with
    the estimate against the memory allowed and what to run where it fits."""
    try:
        verdict, paired = judge_candidates(exe, module, args, inputs, candidates, runner)
        return verdict.to_dict(), largest_errors(paired.outputs, paired.shadow)
    except MemoryLimitError as e:
        say(f"no verdict: {e}")
        where = (
            f"--max-memory {human_bytes(e.peak)} or more"
            if e.given
            else f"on a machine with {human_bytes(e.peak)} or more available"
        )
        return {
            "consistent": None,
            "problem": f"no verdict: {e}",
            "shadow_needs_bytes": e.peak,
            "memory_allowed_bytes": e.limit,
            "memory_allowed_from": "--max-memory" if e.given else "MemAvailable",
            "where_it_fits": f"{where}, the same command: {command_line}",
            "candidates": {},
            "outputs": [],
        }, []
    except ExecutionError as e:  # a failure of the module itself comes back from the attribution's run below
        say(f"no verdict: {e}")
        return {"consistent": None, "problem": f"no verdict: {e}", "candidates": {}, "outputs": []}, []


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "report",
        "One self-contained HTML page: module, verdict, attribution, NaN/Inf, memory.",
        "  hloexec report examples/layernorm_bwd.opt.hlo --inputs examples/layernorm_bwd.inputs.npz "
        "-o ln.html\n"
        "  hloexec report step.hlo --seed 1 --actual gpu.npz --against xla -o step.html\n"
        "  hloexec report gpt_16dev.hlo --spmd -o gpt.html --json > gpt.json",
        [parents.common, parents.execution],
        "One page to look at and share, built from what `stats`, `compare --reference shadow`, `numerics`,\n"
        "`memory`, `collectives` and `graph` compute: the module (compiled for, size, op histogram,\n"
        "FLOPs, collectives); per output each candidate's error against the exact answer, what the\n"
        "arithmetic allows and the verdict, the worst elements; the instructions where accuracy is lost\n"
        "(op_name, source line) and the dataflow around the worst one coloured by local error; NaN/Inf\n"
        "origins; memory over the schedule; collective traffic; the command line and hloexec's version.\n"
        "Nothing is fetched from the network (CSS, script, pictures inline); PAGE#search=NAME opens it\n"
        "filtered to the instructions whose name holds NAME. --json prints the same data\n"
        "as one JSON document on stdout. Exit 1 when a candidate is not consistent.",
    )
    p.add_argument("file", metavar="FILE|DIR")
    p.add_argument(
        "--actual",
        metavar="NPZ",
        action="append",
        help="a candidate's outputs (keys out0..outM, e.g. a device's); repeatable",
    )
    p.add_argument("--against", choices=["xla"], help="also judge XLA:CPU's outputs (jaxlib, in a child process)")
    p.add_argument("--top", type=positive_int, default=TOP, metavar="N", help=f"instructions listed (default {TOP})")
    p.add_argument("-o", "--output", required=True, type=output_file, metavar="OUT.html", help="the page to write")
    p.set_defaults(handler=run, reference="shadow")  # judged as compare --reference shadow: --device A,B


def run(args) -> int:
    data, svg = collect(args)
    data = jsonable(data)
    with open_output(args.output) as f:
        f.write(to_html(data, svg))
    if args.json:
        print_json(data)
    else:
        v = data["verdict"]
        print(
            f"{args.output}: {data['module']}, verdict "
            + (
                ", ".join(f"{n} {'consistent' if c else 'not consistent'}" for n, c in v["candidates"].items())
                or "none"
            )
        )
    return EXIT_MISMATCH if data["verdict"]["consistent"] is False else EXIT_OK
