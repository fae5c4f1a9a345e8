"""What the `hloexec` commands share: exit codes, the JSON document, the argument groups several commands take,
loading a module with errors that name the file, entry arguments (--inputs / --seed), the memory check, a run
with its progress bar, output summaries and error messages.

The executor, the op registry and numerics are imported where a command runs: `hloexec --help` builds every
command's parser and should not pay for them (about a second).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..errors import (
    ArrayFileError,
    ElidedConstantWarning,
    ExecutionError,
    HloParseError,
    LIBRARY_MEMORY_ADVICE,
    MemoryLimitError,
    OptionError,
    UnsupportedError,
    elided_constants_note,
)
from ..exec.domains import input_domains
from ..exec.inputs import random_inputs
from ..exec.tiering import COMPILE_MODES
from ..ir.module import pick_module
from ..options import MOST_DESCRIBED, MOST_PARTICIPANTS, REDUCTIONS
from ..parser import parse
from .arrays import flatten, read_values
from .compare import jsonable
from .devices import add_device_argument, device_list, device_option
from .dumpdir import DumpError
from .hloproto import ProtoError
from .plugins import PluginError
from .stats import human_bytes, module_lines
from .xla_cpu import XlaCpuError, run_on_xla_cpu_isolated

EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 2
JSON_VERSION = 1

EXIT_CODES = """exit codes:
  0  success
  1  compare: an output differs (--reference shadow: a candidate is not consistent with the
     program's precision; report: the same); run --fail-on-nan: an output holds a NaN;
     run --find-nonfinite and numerics: an instruction makes NaN/Inf; run --spmd: outputs meant
     to be replicated differ across devices; diff: values that differ; bisect: a stage that
     changes the outputs
  2  parse error, usage error, unsupported op, execution error, bad input file, module too big
     for memory, internal error
  130 interrupted (Ctrl-C), 143 terminated (SIGTERM)"""


class UsageError(Exception):
    """A command line that cannot be carried out (bad flag combination, missing module, no memory)."""


# -- arguments --------------------------------------------------------------------------------
def add_subparser(subparsers, name: str, summary: str, examples: str, parents, extra: str = ""):
    """A command's parser: its summary, then examples, `extra` and the exit codes under --help."""
    epilog = "examples:\n" + examples + ("\n\n" + extra if extra else "") + "\n\n" + EXIT_CODES
    return subparsers.add_parser(
        name,
        help=summary,
        description=summary,
        epilog=epilog,
        parents=parents,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _at_least(text: str, minimum: int, what: str) -> int:
    value = int(text)
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {what} >= {minimum}, got {text}")
    return value


def positive_int(text: str) -> int:
    return _at_least(text, 1, "a count")


def _device_count(text: str, most: int, what: str) -> int:
    value = positive_int(text)
    if value > most:
        raise argparse.ArgumentTypeError(f"expected a count from 1 to {most} ({what}), got {text}")
    return value


def device_count(text: str) -> int:
    """--partitions, --replicas of a command that runs the participants: refused past the most hloexec runs at once
    (--partitions 100000000 ran for hours, saying nothing)."""
    return _device_count(text, MOST_PARTICIPANTS, "the most participants hloexec runs")


def described_device_count(text: str) -> int:
    """--partitions, --replicas of a report that runs nothing (collectives, memory, export)."""
    return _device_count(text, MOST_DESCRIBED, "the most devices a report describes")


def count(text: str) -> int:
    """A count that may be 0 (--depth, --limit, --retries)."""
    return _at_least(text, 0, "a count")


def non_negative_float(text: str) -> float:
    """A bound or latency: >= 0, infinity allowed; NaN refused (every comparison with it is false: a NaN
    tolerance would pass any value)."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """A bandwidth or timeout: finite and > 0."""
    value = float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def output_file(text: str) -> str:
    """A file a command writes (-o, --out, --inputs-out, --plot), checked before any work: a long run must not end
    on a path it cannot write."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; expected a file name")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no directory {path.parent} to write it in")
    return text


def seed(text: str) -> int:
    return _at_least(text, 0, "a seed")


def parse_size(text: str) -> int:
    """'8G', '512M', '1.5e9', '4096' -> bytes (K, M, G, T are powers of 1024)."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]?)i?B?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8G, 512M, 1e9)")
    size = float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")
    if not math.isfinite(size):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (too large)")
    return int(size)


@dataclass(frozen=True)
class Parents:
    """The argument groups commands take as argparse parents, each including the one before it (but `common`):
    common (--debug, --json); stages (--stage of a dump directory); modules (+ --module); inputs (+ --inputs |
    --seed); execution (+ how the module runs: --device, --reductions, --compile, --max-memory, custom-call
    targets, SPMD)."""

    common: argparse.ArgumentParser
    stages: argparse.ArgumentParser
    modules: argparse.ArgumentParser
    inputs: argparse.ArgumentParser
    execution: argparse.ArgumentParser


def parent_parsers() -> Parents:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: `hloexec --debug run ...` must not be reset by the subcommand's default.
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="print Python tracebacks (also HLOEXEC_DEBUG=1)"
    )
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    stages = argparse.ArgumentParser(add_help=False)  # FILE may be a dump directory (tools/dumpdir.py)
    stages.add_argument(
        "--stage",
        metavar="STAGE",
        help="of a dump directory: before, after, a pass name or step number, snapshot (default: after)",
    )
    modules = argparse.ArgumentParser(add_help=False, parents=[stages])
    modules.add_argument(
        "--module",
        metavar="NAME",
        help="the module to use when the file (or dump directory: name or number) holds several",
    )
    inputs = argparse.ArgumentParser(add_help=False, parents=[modules])
    source = inputs.add_mutually_exclusive_group()
    source.add_argument("--inputs", metavar="NPZ", help="entry arguments: keys arg0..argN (as save_arrays writes)")
    source.add_argument("--seed", type=seed, default=0, help="random entry arguments from this seed (default 0)")
    execution = argparse.ArgumentParser(add_help=False, parents=[inputs])
    execution.add_argument("--no-numba", action="store_true", help="numpy kernels only (no fusion compilation)")
    add_device_argument(execution)
    execution.add_argument(
        "--excess-precision",
        action="store_true",
        help="skip f16/bf16 rounding between ops inside fusions, as XLA:CPU may",
    )
    # default None: accumulate for run and compare, per-step for numerics (parents share their actions, so
    # one subcommand's set_defaults would change every subcommand's default)
    execution.add_argument(
        "--reductions",
        choices=REDUCTIONS,
        default=None,
        help="how add/multiply reduce and reduce-window round: accumulate (default: f16/bf16 in "
        "f32, rounded once) or per-step (every step rounded to the type, in row-major "
        "order, as XLA:CPU's optimized modules compute them; numerics' default)",
    )
    execution.add_argument(
        "--compile",
        choices=COMPILE_MODES,
        default="background",
        help="background (default): kernels compile while runs go on op by op, each run uses "
        "those ready; eager: a run waits for the kernels due, the first for all; never: "
        "op by op",
    )
    add_max_memory_argument(execution)
    _add_calls_and_spmd(execution)
    return Parents(common, stages, modules, inputs, execution)


def add_max_memory_argument(p: argparse.ArgumentParser) -> None:
    """--max-memory SIZE: the limit a run's peak (and random inputs) are checked against before anything runs."""
    p.add_argument(
        "--max-memory",
        metavar="SIZE",
        type=parse_size,
        help="refuse to run above this peak (e.g. 8G); default: MemAvailable",
    )


def _add_calls_and_spmd(execution: argparse.ArgumentParser) -> None:
    """The execution options' groups: custom-call targets hloexec does not know, and SPMD."""
    calls = execution.add_argument_group(
        "custom-call targets hloexec does not know (see examples/custom_call_plugin.py)"
    )
    calls.add_argument(
        "--plugin",
        metavar="FILE",
        action="append",
        default=[],
        help="a Python file registering custom-call targets with "
        "hloexec.ops.custom_call.register_custom_call (repeatable); installed packages register "
        "theirs through the entry-point group 'hloexec.custom_calls'",
    )
    calls.add_argument(
        "--custom-call-identity",
        metavar="NAME",
        action="append",
        default=[],
        help="treat custom-call target NAME as the identity: its value is its operand (transfer and "
        "marker calls; repeatable)",
    )
    spmd_options = execution.add_argument_group("SPMD (every participant of a partitioned module)")
    spmd_options.add_argument(
        "--spmd",
        action="store_true",
        help="run all participants: counts from the module header, or inferred from its "
        "replica groups and shardings (a message says so)",
    )
    spmd_options.add_argument(
        "--partitions", type=device_count, metavar="N", help="partitions per replica (implies --spmd)"
    )
    spmd_options.add_argument("--replicas", type=device_count, metavar="R", help="replicas (implies --spmd)")
    spmd_options.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run the participants as Ray actors (implies --spmd; pip install 'hloexec[ray]'): "
        "a new local Ray instance, or ADDRESS (auto, ray://HOST:PORT, HOST:PORT) joins a "
        "cluster; put it after FILE",
    )
    spmd_options.add_argument(
        "--participants-per-worker",
        type=positive_int,
        metavar="N",
        help="with --ray: participants per Ray actor (default: spread evenly over the nodes, "
        "fewer where a worker would not fit a node's memory)",
    )


def require(package: str, extra: str, what: str) -> None:
    """UsageError naming the extra to install when an optional package is missing."""
    if importlib.util.find_spec(package) is None:
        raise UsageError(f"{what} needs {package}: pip install 'hloexec[{extra}]'")


# -- loading ----------------------------------------------------------------------------------
def parse_module_file(path: str):
    """(modules, seconds) for an HLO file."""
    start = time.perf_counter()
    modules = parse(Path(path))  # a Path: a missing file is an OSError, not HLO text
    return modules, time.perf_counter() - start


def select_module(modules, name: str | None, path: str):
    """hloexec.ir.module.pick_module, its refusal said for the command line (--module, the modules' lines)."""
    try:
        return pick_module(modules, name)
    except ValueError:
        found = "\n".join(f"  {m.name} (line {m.line})" for m in modules)
        if name is None:
            raise UsageError(f"{path} holds {len(modules)} modules; pick one with --module NAME:\n{found}") from None
        raise UsageError(f"{path}: no module named {name!r}; found:\n{found}") from None


def load_module(args):
    """The module of args.file (--module NAME) and the seconds its file took to parse."""
    modules, seconds = parse_module_file(args.file)
    return select_module(modules, args.module, args.file), seconds


def prepare(module, args):
    """The module loaded as the execution options say, and the seconds it took; a module with elided constants
    is said on stderr."""
    from .. import ops  # noqa: F401  (fills the op registry)
    import hloexec.spmd  # noqa: F401  (fills exec's spmd_layer: manual regions run every participant)
    from ..exec.executor import Executable

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ElidedConstantWarning)  # said below, without a Python source line
        # rules not given on the command line are the device profile's (hloexec.options)
        device = args.device
        if device and getattr(args, "reference", None) == "shadow":  # a list: judged by each, run as the first
            device = device.split(",")[0]
        exe = Executable(
            module,
            device=device_option(device, module),
            use_numba=not args.no_numba,
            excess_precision=args.excess_precision or None,
            reductions=args.reductions,
            max_memory=getattr(args, "max_memory", None),
            compile=args.compile,
        )
    seconds = time.perf_counter() - start
    _say_elided_constants(module)
    return exe, seconds


def load_for_report(args):
    """The Executable of args.file (--module NAME) prepared without compiling a kernel: what reports read; a module
    with elided constants is said on stderr."""
    from .. import ops  # noqa: F401  (fills the op registry)
    from ..exec.executor import Executable

    module = load_module(args)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ElidedConstantWarning)  # said below, without a Python source line
        exe = Executable(module, compile_kernels=False)
    _say_elided_constants(module)
    return exe


def _say_elided_constants(module) -> None:
    elided = module.elided_constants()
    if elided:
        print(f"warning: {elided_constants_note(module, elided)}", file=sys.stderr)


def check_memory(exe, args, out) -> dict:
    """Executable.check_memory against --max-memory, else MemAvailable; the peak said on `out` first."""
    from ..exec.executor import available_memory

    peak = exe.peak_bytes()
    available = available_memory()
    if out is not None:
        where = f", {human_bytes(available)} available" if available is not None else ""
        print(
            f"{exe.module.name}: memory needed {human_bytes(peak)} (peak of live buffers{where})", file=out, flush=True
        )
    try:
        limit = exe.check_memory(args.max_memory, available)
    except MemoryLimitError as e:
        source = "--max-memory" if args.max_memory is not None else "MemAvailable in /proc/meminfo"
        raise UsageError(
            f"{exe.module.name} needs {human_bytes(e.peak)} at its peak, more than the "
            f"{human_bytes(e.limit)} allowed ({source}); --max-memory SIZE overrides"
        ) from None
    return {"peak_bytes": peak, "available_bytes": available, "limit_bytes": limit}


# -- inputs -----------------------------------------------------------------------------------
def module_inputs(module, args) -> tuple[list, dict]:
    """(entry arguments of `module`, description) from --inputs or --seed."""
    if args.inputs is None:
        domains = input_domains(module)
        constrained = [
            {"parameter": k, "name": module.entry.parameters[k].name, **d.to_json()} for k, d in sorted(domains.items())
        ]
        return (
            random_inputs(module, args.seed, domains, getattr(args, "max_memory", None)),
            {"from": "seed", "seed": args.seed, "constrained": constrained},
        )
    shapes = [p.shape for p in module.entry.parameters]
    return read_values(args.inputs, "arg", shapes, what="entry arguments"), {"from": "npz", "path": args.inputs}


def inputs_text(args) -> str:
    """The inputs of a run as a report's first line says them."""
    return f"seed {args.seed}" if args.inputs is None else args.inputs


def print_constrained(inputs_info: dict) -> None:
    """The random inputs drawn in a domain their uses imply, one line each (`run --seed N` says why)."""
    for c in inputs_info.get("constrained", ()):
        bound = f" in [0, {c['bound']}]" if c["domain"] == "index" else ""
        print(f"  input {c['parameter']} %{c['name']}: drawn {c['domain']}{bound} ({c['reason']})")


def result_leaves(exe) -> list:
    """The module's outputs as shapes (the leaves of its result, in out0..outM order)."""
    return [leaf for _, leaf in exe.result_shape.leaves()]


# -- running ----------------------------------------------------------------------------------
class ProgressBar:
    """`[#####.....] 120/480 instructions  3.2 s` on a terminal's stderr: from 0.5 s on, 10 redraws a second."""

    def __init__(self, stream, what: str):
        self.stream, self.what = stream, what
        self.start = self.last = time.perf_counter()
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - self.start < 0.5 or now - self.last < 0.1:
            return
        self.last, self.shown = now, True
        filled = 30 * done // max(total, 1)
        self.stream.write(
            f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} {self.what}  {now - self.start:.1f} s"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()


class CompileNotice:
    """While it is entered, says on a terminal's stderr when Numba starts compiling kernels in this process (the
    error bounds' and the runtime's: their first run after an install or an edit, ~1 min of a cold `numerics` or
    `compare --reference shadow` that a warm run does in seconds), and at the end how long they took: a user sees
    what the command waits for, and that it is paid once (Numba caches them)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.depth, self.count, self.seconds, self.started = 0, 0, 0.0, 0.0

    def on_start(self, event) -> None:
        if self.depth == 0:
            if self.count == 0:
                self.stream.write("\r\033[Kcompiling kernels (Numba: the first run only, they are cached)...\n")
                self.stream.flush()
            self.started = time.perf_counter()
        self.depth += 1

    def on_end(self, event) -> None:
        self.depth -= 1
        if self.depth == 0:  # (kernels called by the one compiled compile inside its compile)
            self.count += 1
            self.seconds += time.perf_counter() - self.started

    def __enter__(self):
        from numba.core import event

        notice = self

        class Listener(event.Listener):  # (numba imported here: `hloexec --help` does not pay for it)
            def on_start(self, e):
                notice.on_start(e)

            def on_end(self, e):
                notice.on_end(e)

        self.listener = Listener()
        if self.stream.isatty():
            event.register("numba:compile", self.listener)
        return self

    def __exit__(self, *exc) -> None:
        from numba.core import event

        if self.stream.isatty():
            event.unregister("numba:compile", self.listener)
        if self.count:
            self.stream.write(f"\r\033[Kkernels compiled: {self.count} in {self.seconds:.1f} s\n")
            self.stream.flush()


def execute(exe, inputs, profile=None) -> tuple[list, float]:
    """(flattened outputs, seconds) of one run, with a progress bar when stderr is a terminal;
    `profile` (a dict) gets instruction of the entry computation (calls inlined) -> seconds."""
    bar = ProgressBar(sys.stderr, "instructions") if sys.stderr.isatty() else None
    start = time.perf_counter()
    try:
        result = exe.run(*inputs, progress=bar, profile=profile)
    finally:
        if bar is not None:
            bar.close()
    return flatten(result), time.perf_counter() - start


def run_on_xla(module, path: str, inputs) -> list:
    """The module's own lines of the file, run on XLA:CPU in a child process."""
    first, last = module_lines(module)
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        text = "".join(line for n, line in enumerate(f, 1) if first <= n <= last)
    return run_on_xla_cpu_isolated(text, [leaf for x in inputs for leaf in flatten(x)], timeout=3600)


def actual_candidates(exe, paths, spmd: bool = False) -> dict[str, list]:
    """Candidates from --actual files (keys out0..outM), by file name (by path where two share one): a device's outputs, judged against the
    program's, so read as of its types (`spmd`: global outputs, whose shapes are not the module's per-device
    ones: the verdict checks them against the assembled run's)."""
    leaves = result_leaves(exe)
    names = [Path(p).name for p in paths]  # two files of one name (run1/out.npz, run2/out.npz): their paths
    names = [str(p) if names.count(n) > 1 else n for p, n in zip(paths, names)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # the second replaced the first, silently
        raise UsageError(f"--actual {twice[0]} given twice")
    return {n: read_values(p, "out", leaves, what="outputs", check_shapes=not spmd) for n, p in zip(names, paths)}


def judge_candidates(exe, module, args, inputs, candidates: dict, runner):
    """judge_run of `compare --reference shadow` and `report`: --device's profiles (A,B: judged by each), XLA:CPU's
    arithmetic known for its candidate."""
    from .numerics import judge_run, xla_cpu_arithmetic

    devices = device_list(args.device, module, say=lambda message: None) if args.device else None  # said once
    return judge_run(exe, inputs, candidates, runner, devices=devices, known={"XLA:CPU": xla_cpu_arithmetic()})


# -- output -----------------------------------------------------------------------------------
def print_json(document: dict) -> None:
    """One JSON document on stdout (NaN and infinities as strings)."""
    json.dump(jsonable(document), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")


SUMMARY_HEADER = f"{'shape':<20} {'dtype':<6} {'min':>12} {'max':>12} {'mean':>12} {'NaN':>8} {'Inf':>8}"


def summary_row(s: dict) -> str:
    """An output's array_summary as a row under SUMMARY_HEADER."""
    shape = s["shape"] if isinstance(s["shape"], str) else "[" + ",".join(map(str, s["shape"])) + "]"  # "varies"
    return (
        f"{shape:<20} {s['dtype']:<6} {_number(s['min']):>12} {_number(s['max']):>12} {_number(s['mean']):>12} "
        f"{s['nan']:>8} {s['inf']:>8}"
    )


def _number(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return f"{x:.6g}"


# -- errors -----------------------------------------------------------------------------------
# errors whose message says all a user needs (no traceback, 'error:' prefix)
KNOWN_ERRORS = (
    HloParseError,
    UnsupportedError,
    ExecutionError,
    OptionError,
    UsageError,
    OSError,
    XlaCpuError,
    PluginError,
    DumpError,
    ProtoError,
)


def error_message(e: BaseException, path: str | None = None) -> str:
    """The error's own message; for errors found after parsing, the file they are in first."""
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    if type(e).__name__ == "XlaCpuError":
        return f"XLA:CPU ({getattr(e, 'stage', '?')}): {getattr(e, 'message', e)}"  # not imported: jax at startup
    message = str(e)
    if isinstance(e, MemoryLimitError) and e.advice == LIBRARY_MEMORY_ADVICE:  # said as the command line's option
        message = message.replace(LIBRARY_MEMORY_ADVICE, "--max-memory SIZE overrides")
    if isinstance(e, (UnsupportedError, ExecutionError)) and not isinstance(e, ArrayFileError) and path is not None:
        return f"{path}: {message}"
    if isinstance(e, KNOWN_ERRORS):
        return message
    return f"{type(e).__name__}: {e}"
