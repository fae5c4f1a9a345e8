"""The `hloexec` command (also `python -m hloexec`): stats, run, compare, ops.

Every command prints a readable report on stdout, or with `--json` one JSON document (NaN and
infinities as the strings "nan", "inf", "-inf"); diagnostics and errors go to stderr. Errors print
their message only (it names file:line:col or the instruction); `--debug` or HLOEXEC_DEBUG=1 adds
the Python traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

from ..errors import ArrayFileError, ExecutionError, HloParseError, UnsupportedError
from ..exec.tiering import COMPILE_MODES, format_compile_report
from ..options import REDUCTIONS

EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 2
JSON_VERSION = 1

EXIT_CODES = """exit codes:
  0  success
  1  compare: an output differs (--reference shadow: a candidate is not consistent with the
     program's precision); run --fail-on-nan: an output holds a NaN; run --find-nonfinite and
     numerics: an instruction makes NaN/Inf; run --spmd: outputs meant to be replicated differ
     across devices
  2  parse error, usage error, unsupported op, execution error, bad input file, module too big
     for memory, internal error
  130 interrupted (Ctrl-C), 143 terminated (SIGTERM)"""


def _tolerances_help() -> str:
    """The compare defaults, from hloexec.tools.compare.DEFAULT_TOLERANCES."""
    from .compare import DEFAULT_TOLERANCES
    by_bounds: dict = {}
    for name, bounds in DEFAULT_TOLERANCES.items():
        by_bounds.setdefault(bounds, []).append(name)
    rows = [f"  {', '.join(names):<12}atol {atol:<7g} rtol {rtol:g}" for (atol, rtol), names in by_bounds.items()]
    return ("tolerances (XLA's literal_comparison: an element fails only when it exceeds BOTH bounds;\n"
            "NaN matches NaN; an infinity matches only the same infinity; shapes and dtypes must be equal):\n"
            + "\n".join(rows) + "\n"
            "  fp8/fp6/fp4 atol = rtol = the type's epsilon\n"
            "  ints, pred  exact\n"
            "--atol / --rtol replace the bounds for every output.")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a count >= 1, got {text}")
    return value


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that a run stops as Ctrl-C stops it: `finally` blocks and atexit
    handlers remove temporary files, stop compile workers and kill child processes (the default action would
    end the process with none of that)."""


def _terminate(signum, frame):
    raise Terminated()


class UsageError(Exception):
    """A command line that cannot be carried out (bad flag combination, missing module, no memory)."""


# -- helpers ----------------------------------------------------------------------------------
def _parse_module_file(path: str):
    """(modules, seconds) for an HLO file."""
    from ..parser import parse
    start = time.perf_counter()
    modules = parse(Path(path))       # a Path: a missing file is an OSError, not HLO text
    return modules, time.perf_counter() - start


def select_module(modules, name: str | None, path: str):
    """hloexec.ir.module.pick_module, its refusal said for the command line (--module, the modules' lines)."""
    from ..ir.module import pick_module
    try:
        return pick_module(modules, name)
    except ValueError:
        found = "\n".join(f"  {m.name} (line {m.line})" for m in modules)
        if name is None:
            raise UsageError(f"{path} holds {len(modules)} modules; pick one with --module NAME:\n{found}") from None
        raise UsageError(f"{path}: no module named {name!r}; found:\n{found}") from None


def _prepare(module, args):
    """The module loaded, and the seconds it took; a module with elided constants is said on stderr."""
    from .. import ops  # noqa: F401  (fills the op registry)
    import hloexec.spmd  # noqa: F401  (fills exec's spmd_layer: manual regions run every participant)
    from ..errors import ElidedConstantWarning, elided_constants_note
    from ..exec.executor import Executable
    from .devices import device_option
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ElidedConstantWarning)      # said below, without a Python source line
        # rules not given on the command line are the device profile's (hloexec.options)
        device = args.device
        if device and getattr(args, "reference", None) == "shadow":     # a list: judged by each, run as the first
            device = device.split(",")[0]
        exe = Executable(module, device=device_option(device, module), use_numba=not args.no_numba,
                         excess_precision=args.excess_precision or None, reductions=args.reductions,
                         max_memory=getattr(args, "max_memory", None), compile=args.compile)
    seconds = time.perf_counter() - start
    elided = module.elided_constants()
    if elided:
        print(f"warning: {elided_constants_note(module, elided)}", file=sys.stderr)
    return exe, seconds


def load_for_report(args):
    """The Executable of args.file (--module NAME) prepared without compiling a kernel: what reports read."""
    from .. import ops  # noqa: F401  (fills the op registry)
    from ..exec.executor import Executable
    modules, _ = _parse_module_file(args.file)
    return Executable(select_module(modules, args.module, args.file), compile_kernels=False)


def require(package: str, extra: str, what: str) -> None:
    """UsageError naming the extra to install when an optional package is missing."""
    import importlib.util
    if importlib.util.find_spec(package) is None:
        raise UsageError(f"{what} needs {package}: pip install 'hloexec[{extra}]'")


def parse_size(text: str) -> int:
    """'8G', '512M', '1.5e9', '4096' -> bytes (K, M, G, T are powers of 1024)."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]?)i?B?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8G, 512M, 1e9)")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


def check_memory(exe, args, out) -> dict:
    """Executable.check_memory against --max-memory, else MemAvailable; the peak said on `out` first."""
    from ..errors import MemoryLimitError
    from ..exec.executor import available_memory
    from .stats import human_bytes
    peak = exe.peak_bytes()
    available = available_memory()
    if out is not None:
        where = f", {human_bytes(available)} available" if available is not None else ""
        print(f"{exe.module.name}: memory needed {human_bytes(peak)} (peak of live buffers{where})",
              file=out, flush=True)
    try:
        limit = exe.check_memory(args.max_memory, available)
    except MemoryLimitError as e:
        source = "--max-memory" if args.max_memory is not None else "MemAvailable in /proc/meminfo"
        raise UsageError(f"{exe.module.name} needs {human_bytes(e.peak)} at its peak, more than the "
                         f"{human_bytes(e.limit)} allowed ({source}); --max-memory SIZE overrides") from None
    return {"peak_bytes": peak, "available_bytes": available, "limit_bytes": limit}


def _inputs(exe, args) -> tuple[list, dict]:
    """(entry arguments, description) from --inputs or --seed."""
    return _module_inputs(exe.module, args)


def _module_inputs(module, args) -> tuple[list, dict]:
    """(entry arguments of `module`, description) from --inputs or --seed."""
    if args.inputs is None:
        from ..exec.domains import input_domains
        from ..exec.inputs import random_inputs
        domains = input_domains(module)
        constrained = [{"parameter": k, "name": module.entry.parameters[k].name, **d.to_json()}
                       for k, d in sorted(domains.items())]
        return (random_inputs(module, args.seed, domains, getattr(args, "max_memory", None)),
                {"from": "seed", "seed": args.seed, "constrained": constrained})
    from .arrays import read_values
    shapes = [p.shape for p in module.entry.parameters]
    return read_values(args.inputs, "arg", shapes, what="entry arguments"), {"from": "npz", "path": args.inputs}


def print_constrained(inputs_info: dict) -> None:
    """The random inputs drawn in a domain their uses imply, one line each (`run --seed N` says why)."""
    for c in inputs_info.get("constrained", ()):
        bound = f" in [0, {c['bound']}]" if c["domain"] == "index" else ""
        print(f"  input {c['parameter']} %{c['name']}: drawn {c['domain']}{bound} ({c['reason']})")


def _result_leaves(exe) -> list:
    """The module's outputs as shapes (the leaves of its result, in out0..outM order)."""
    return [leaf for _, leaf in exe.result_shape.leaves()]


def flatten(value) -> list:
    """A (nested) tuple result as its leaves, depth first (the order of out0..outM)."""
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in flatten(v)]
    return [value]


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
        self.stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} {self.what}  "
                          f"{now - self.start:.1f} s")
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
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


def profile_rows(exe, profile: dict, top: int) -> list[dict]:
    """The `top` slowest instructions of a profiled run of the entry computation (its calls inlined), slowest
    first."""
    total = sum(profile.values()) or 1.0
    fused = {id(g.root): len(g.members) for g in exe.plan.fused_groups}
    rows = sorted(profile.items(), key=lambda item: -item[1])[:top]
    return [{"name": inst.name, "opcode": inst.opcode, "shape": inst.shape.to_text(layout=False), "line": inst.line,
             "ms": seconds * 1e3, "share": seconds / total, "fused": fused.get(id(inst), 0)}
            for inst, seconds in rows]


def array_summary(index: int, a) -> dict:
    """index, shape, dtype, min/max/mean (NaN ignored; complex: of |x|), NaN and Inf counts."""
    from .compare import dtype_name, jsonable
    a = np.asarray(a)
    summary = {"index": index, "shape": list(a.shape), "dtype": dtype_name(a.dtype),
               "min": None, "max": None, "mean": None, "nan": 0, "inf": 0}
    if a.dtype.kind in "biu" or a.size == 0:
        values = a.astype(np.int64 if a.dtype.kind == "b" else a.dtype)
    elif a.dtype.kind == "c":
        values = np.abs(a)
    else:
        values = a.astype(np.float64)
    if a.size == 0:
        return summary
    if values.dtype.kind == "f":
        nan = np.isnan(values)
        summary["nan"] = int(np.count_nonzero(nan))
        summary["inf"] = int(np.count_nonzero(np.isinf(values)))
        values = values[~nan]
        if values.size == 0:
            return summary
        with np.errstate(all="ignore"):
            summary.update(min=float(values.min()), max=float(values.max()), mean=float(values.mean()))
    else:
        summary.update(min=int(values.min()), max=int(values.max()), mean=float(values.mean(dtype=np.float64)))
    return jsonable(summary)


def _print_json(document: dict) -> None:
    from .compare import jsonable
    json.dump(jsonable(document), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return f"{x:.6g}"


# -- commands ---------------------------------------------------------------------------------
def cmd_stats(args) -> int:
    from .stats import file_stats, format_file
    files, errors = [], []
    for path in args.files:
        try:
            files.append(file_stats(path))
        except (HloParseError, OSError) as e:
            errors.append({"path": path, "error": _message(e)})
            print(f"error: {_message(e)}", file=sys.stderr)
            continue
        if not args.json:
            print(("\n" if len(files) > 1 else "") + format_file(files[-1]))
    if args.json:
        _print_json({"command": "stats", "version": JSON_VERSION, "files": [f.to_dict() for f in files],
                     "errors": errors})
    return EXIT_ERROR if errors else EXIT_OK


def cmd_run(args) -> int:
    text_out = None if args.json else sys.stdout
    modules, parse_s = _parse_module_file(args.file)
    module = select_module(modules, args.module, args.file)
    exe, prepare_s = _prepare(module, args)
    if args.shadow and args.find_nonfinite:
        raise UsageError("--shadow and --find-nonfinite are two runs: give one (hloexec numerics does both)")
    if args.shadow:
        return cmd_run_shadow(exe, args, text_out)
    if args.find_nonfinite:
        return cmd_run_nonfinite(exe, args, text_out)
    if _is_spmd(args):
        if args.repeat != 1:
            raise UsageError("--repeat runs one participant; it does not combine with --spmd")
        return cmd_run_spmd(exe, args, text_out, {"parse": parse_s, "prepare": prepare_s})
    memory = check_memory(exe, args, text_out)
    if exe.manual_regions:
        from ..spmd import device_counts
        partitions, replicas, _ = device_counts(exe.module)
        print(f"{module.name} is a pre-partition module with manual regions: each of its {partitions * replicas} "
              "devices runs the global program and its own tiles inside the regions", file=text_out or sys.stderr)
    inputs, inputs_info = _inputs(exe, args)
    profile = {} if args.profile else None
    runs = []
    for k in range(args.repeat):        # later runs use the kernels compiled by then (docs/compile.md)
        outputs, seconds_k = execute(exe, inputs, profile if k == args.repeat - 1 else None)
        runs.append(seconds_k)
    execute_s = runs[0]
    summaries = [array_summary(i, a) for i, a in enumerate(outputs)]
    nan_found = any(s["nan"] for s in summaries)
    if args.out is not None:
        from .xla_cpu import save_arrays
        save_arrays(args.out, {f"out{i}": a for i, a in enumerate(outputs)})
    seconds = {"parse": parse_s, "prepare": prepare_s, "execute": execute_s}
    if args.repeat > 1:
        seconds["runs"] = runs
    slowest = profile_rows(exe, profile, args.profile) if args.profile else None
    tiers = exe.context.tier_report if args.profile else None
    compiled = exe.compile_report() if args.profile else None
    if args.json:
        _print_json({"command": "run", "version": JSON_VERSION, "file": args.file, "module": module.name,
                     "inputs": inputs_info, "memory": memory, "seconds": seconds, "outputs": summaries,
                     "nan_found": nan_found, "out": args.out, "profile": slowest,
                     "elided_constants": [c.name for c in module.elided_constants()],
                     "tiers": tiers.to_dict() if tiers is not None else None, "compile": compiled})
    else:
        print(f"module {module.name}: {len(outputs)} output{'s' if len(outputs) != 1 else ''}, inputs "
              + (f"seed {args.seed}" if args.inputs is None else args.inputs))
        print_constrained(inputs_info)
        print(f"{'out':>4}  {'shape':<20} {'dtype':<6} {'min':>12} {'max':>12} {'mean':>12} {'NaN':>8} {'Inf':>8}")
        for s in summaries:
            shape = "[" + ",".join(map(str, s["shape"])) + "]"
            print(f"{s['index']:>4}  {shape:<20} {s['dtype']:<6} {_fmt(s['min']):>12} {_fmt(s['max']):>12} "
                  f"{_fmt(s['mean']):>12} {s['nan']:>8} {s['inf']:>8}")
        last = f", {runs[-1] * 1e3:.1f} ms (run {len(runs)})" if len(runs) > 1 else ""
        print(f"time: parse {parse_s * 1e3:.1f} ms, prepare {prepare_s * 1e3:.1f} ms, "
              f"execute {execute_s * 1e3:.1f} ms (first run){last}")
        if slowest:
            print(f"slowest {len(slowest)} instructions of the entry computation in run {len(runs)} (calls inlined; "
                  "loops and fused groups inclusive):")
            for row in slowest:
                print(f"  {row['ms']:10.2f} ms {row['share']:6.1%}  %{row['name']} = {row['shape']} {row['opcode']}"
                      + (f" (fused: {row['fused']} instructions)" if row["fused"] else "")
                      + f"  line {row['line']}")
        if tiers is not None:
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


def _runner(exe, args, text_out, global_inputs=None):
    """(Runner, inputs, inputs description) for the numerics commands: one participant with --inputs/--seed, or
    with --spmd all of them, inputs per device (from --inputs/--seed, or `global_inputs` split by sharding)."""
    from .numerics import Runner
    if not _is_spmd(args):
        if global_inputs is not None:
            return Runner(), global_inputs, None
        inputs, info = _inputs(exe, args)
        return Runner(), inputs, info
    if args.ray is not None:
        raise UsageError("--shadow, --find-nonfinite and numerics observe every participant from this process: "
                         "run them as threads (--spmd), not with --ray")
    partitions, replicas, note, say, inputs, info = _spmd_setup(exe, args, text_out, global_inputs)
    return Runner({"partitions": partitions, "replicas": replicas, "report": say}), inputs, info


def cmd_run_shadow(exe, args, text_out) -> int:
    """`hloexec run --shadow`: the module and its shadow (every float type in f64), the run's error per output."""
    from .numerics import format_shadow_report, shadow_report, shadow_run
    if not _is_spmd(args):
        check_memory(exe, args, text_out)
    runner, inputs, inputs_info = _runner(exe, args, text_out)
    start = time.perf_counter()
    run = shadow_run(exe, inputs, runner)
    seconds = time.perf_counter() - start
    report = shadow_report(run)
    if args.out is not None:
        from .xla_cpu import save_arrays
        save_arrays(args.out, {f"out{i}": a for i, a in enumerate(run.shadow)})
    if args.json:
        _print_json({"command": "run", "version": JSON_VERSION, "file": args.file, "module": exe.module.name,
                     "inputs": inputs_info, "shadow": report, "seconds": {"execute": seconds}, "out": args.out})
        return EXIT_OK
    print(f"module {exe.module.name}: {len(run.outputs)} output{'s' if len(run.outputs) != 1 else ''}, inputs "
          + (f"seed {args.seed}" if args.inputs is None else args.inputs) + "; the shadow runs every float type in "
          "f64 (the program's exact answer); errors relative to each output's scale (max |shadow|)")
    print_constrained(inputs_info)
    print(format_shadow_report(report))
    print(f"time: {seconds:.2f} s (the run and its shadow)")
    if args.out is not None:
        print(f"shadow outputs (f64) written to {args.out}")
    return EXIT_OK


def cmd_run_nonfinite(exe, args, text_out) -> int:
    """`hloexec run --find-nonfinite`: the instructions that first make NaN or Inf (exit 1 when there are some)."""
    from dataclasses import asdict
    from .nonfinite import find_nonfinite, format_report
    if not _is_spmd(args):
        check_memory(exe, args, text_out)
    runner, inputs, inputs_info = _runner(exe, args, text_out)
    report = find_nonfinite(exe, inputs, runner, stop_at_first=args.stop_at_first)
    if args.json:
        _print_json({"command": "run", "version": JSON_VERSION, "file": args.file, "module": exe.module.name,
                     "inputs": inputs_info, **asdict(report)})
    else:
        print(f"module {exe.module.name}, inputs " + (f"seed {args.seed}" if args.inputs is None else args.inputs)
              + ": where NaN and Inf come from (execution order)")
        print_constrained(inputs_info)
        print(format_report(report))
    return EXIT_MISMATCH if report.origins else EXIT_OK


def _compared_modules(args):
    """(module, its Executable, the REFERENCE file's module, its Executable) of `compare` (None, None: no file)."""
    modules, _ = _parse_module_file(args.file)
    module = select_module(modules, args.module, args.file)
    exe, _ = _prepare(module, args)
    if args.other is None:
        return module, exe, None, None
    other_modules, _ = _parse_module_file(args.other)
    other = select_module(other_modules, args.module if len(other_modules) > 1 else None, args.other)
    return module, exe, other, _prepare(other, args)[0]


def cmd_compare(args) -> int:
    from .compare import compare_outputs, format_report, mark_elided
    if args.reference == "shadow":
        return cmd_compare_shadow(args)
    if args.actual:
        raise UsageError("--actual is a candidate for --reference shadow; to compare two sets of outputs for "
                         "equality, give FILE and --expected")
    references = [r for r in (args.other, args.expected, args.against) if r is not None]
    if len(references) != 1:
        raise UsageError("compare needs exactly one reference: a second HLO file, --expected out.npz "
                         "or --against xla")
    text_out = None if args.json else sys.stdout
    module, exe, other, other_exe = _compared_modules(args)
    if other_exe is not None:
        check_memory(other_exe, args, text_out)
        reference = {"from": "hlo", "file": args.other, "module": other.name}
    if args.expected is not None:
        from .arrays import read_values      # shapes and dtypes that differ are the comparison's to report
        expected = read_values(args.expected, "out", _result_leaves(exe), what="outputs", check_shapes=False,
                               check_dtypes=False)
        reference = {"from": "npz", "path": args.expected}
    if _is_spmd(args):
        if args.against is not None:
            raise UsageError("compare --spmd takes a reference HLO file or --expected, not --against xla")
        inputs, inputs_info = _global_inputs(exe, other_exe, args)
        actual = flatten(_spmd_outputs(exe, args, text_out, inputs,
                                       other_exe.module if other_exe is not None else None)[2]())
    else:
        check_memory(exe, args, text_out)
        inputs, inputs_info = _inputs(exe, args)
        actual, _ = execute(exe, inputs)
    if other_exe is not None:
        expected, _ = execute(other_exe, inputs)
    elif args.against is not None:
        expected = _run_on_xla(module, args.file, inputs)
        reference = {"from": "xla"}
    report = mark_elided(compare_outputs(actual, expected, atol=args.atol, rtol=args.rtol), module,
                         *([other_exe.module] if other_exe is not None else []))
    if args.json:
        _print_json({"command": "compare", "version": JSON_VERSION,
                     "actual": {"file": args.file, "module": module.name}, "expected": reference,
                     "inputs": inputs_info, "atol": args.atol, "rtol": args.rtol, **report.to_dict()})
    else:
        what = {"npz": lambda r: r["path"], "hlo": lambda r: f"{r['file']} (module {r['module']})",
                "xla": lambda r: "XLA:CPU (jaxlib)"}[reference["from"]](reference)
        inputs_text = f"seed {args.seed}" if args.inputs is None else args.inputs
        spmd_text = " (SPMD: global outputs assembled by their shardings)" if _is_spmd(args) else ""
        print(f"{args.file} (module {module.name}){spmd_text} vs {what}; inputs {inputs_text}")
        print(format_report(report))
    return EXIT_OK if report.passed else EXIT_MISMATCH


def cmd_compare_shadow(args) -> int:
    """`compare --reference shadow`: candidates judged by their distance from FILE's exact answer (verdict.py)."""
    from .verdict import format_verdict
    if args.expected is not None:
        raise UsageError("with --reference shadow, outputs from elsewhere are candidates: give them with --actual")
    if args.atol is not None or args.rtol is not None:
        raise UsageError("--reference shadow judges by the program's precision, not by --atol/--rtol")
    text_out = None if args.json else sys.stdout
    module, exe, _, other_exe = _compared_modules(args)
    if _is_spmd(args):
        if args.against is not None:
            raise UsageError("compare --spmd takes a reference HLO file or --actual, not --against xla")
        global_inputs, inputs_info = _global_inputs(exe, other_exe, args)
        runner, inputs, _ = _runner(exe, args, text_out, global_inputs)
    else:
        check_memory(exe, args, text_out)
        runner, inputs, inputs_info = _runner(exe, args, text_out)
        global_inputs = inputs
    candidates = {}      # by file name (a dump's directory is the same for every file in it)
    if other_exe is not None:
        candidates[Path(args.other).name] = execute(other_exe, global_inputs)[0]
    if args.against is not None:
        candidates["XLA:CPU"] = _run_on_xla(module, args.file, inputs)
    candidates.update(actual_candidates(exe, args.actual or ()))
    verdict, run = judge_candidates(exe, module, args, inputs, candidates, runner)
    if args.json:
        from .numerics import shadow_report
        report = shadow_report(run)
        _print_json({"command": "compare", "version": JSON_VERSION, "reference": "shadow",
                     "file": args.file, "module": module.name, "inputs": inputs_info, **verdict.to_dict(),
                     "divergences": report["divergences"], "pinned": report["pinned"]})
    else:
        inputs_text = f"seed {args.seed}" if args.inputs is None else args.inputs
        print(f"{args.file} (module {module.name}): candidates against its shadow (every float type in f64: the "
              f"exact answer); inputs {inputs_text}")
        print("baseline: hloexec at the program's precision, f16/bf16 reductions rounding every step in index "
              "order (the most pessimistic plausible order); errors relative to each output's scale")
        print(format_verdict(verdict))
        if run.divergences:
            print("integer/pred values computed from floats that differ between the run and the shadow (what "
                  "follows them compares two different paths):")
            for d in run.divergences:
                print(f"  {d.describe()}")
    return EXIT_OK if verdict.consistent() else EXIT_MISMATCH


def actual_candidates(exe, paths) -> dict[str, list]:
    """Candidates from --actual files (keys out0..outM), by file name: a device's outputs, judged against the
    program's, so read as of its types."""
    from .arrays import read_values
    return {Path(path).name: read_values(path, "out", _result_leaves(exe), what="outputs") for path in paths}


def judge_candidates(exe, module, args, inputs, candidates: dict, runner):
    """judge_run of `compare --reference shadow` and `report`: --device's profiles (A,B: judged by each), XLA:CPU's
    arithmetic known for its candidate."""
    from .devices import device_list
    from .numerics import judge_run, xla_cpu_arithmetic
    devices = device_list(args.device, module, say=lambda message: None) if args.device else None   # said once
    return judge_run(exe, inputs, candidates, runner, devices=devices, known={"XLA:CPU": xla_cpu_arithmetic()})


def _run_on_xla(module, path: str, inputs) -> list:
    """The module's own lines of the file, run on XLA:CPU in a child process."""
    from .stats import module_lines
    from .xla_cpu import run_on_xla_cpu_isolated
    first, last = module_lines(module)
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        text = "".join(line for n, line in enumerate(f, 1) if first <= n <= last)
    return run_on_xla_cpu_isolated(text, [leaf for x in inputs for leaf in flatten(x)], timeout=3600)


# -- SPMD: every participant of a partitioned module (hloexec.spmd) --------------------------
def _is_spmd(args) -> bool:
    if args.participants_per_worker is not None and args.ray is None:
        raise UsageError("--participants-per-worker places participants in Ray actors: it needs --ray")
    return args.spmd or args.partitions is not None or args.replicas is not None or args.ray is not None


def _global_inputs(exe, reference_exe, args) -> tuple[list, dict]:
    """Global entry arguments for a sharded module: --inputs with keys arg0..argN, or random ones of the
    reference (unsharded) module's shapes, else of the shapes the sharded parameters cover."""
    from .. import spmd
    if args.inputs is not None:
        from .arrays import read_values      # global arrays: their shapes are the sharded parameters' wholes
        return read_values(args.inputs, "arg", [p.shape for p in exe.parameters], what="entry arguments",
                           check_shapes=False), {"from": "npz", "path": args.inputs}
    values = reference_exe.random_inputs(args.seed) if reference_exe is not None \
        else spmd.random_global_inputs(exe.module, args.seed)
    return values, {"from": "seed", "seed": args.seed}


def _per_device_inputs(exe, args, num_devices: int) -> tuple[list, dict]:
    """Per-device entry arguments: an npz with dev{d}/arg{i} keys, or global arg{i} ones split by the
    parameters' shardings, or random global values (--seed) split the same way (with --ray: split by the
    workers, GlobalInputs)."""
    from .. import spmd
    if args.inputs is None:
        if args.ray is not None:
            return spmd.GlobalInputs(seed=args.seed), {"from": "seed", "seed": args.seed}
        return spmd.random_inputs(exe.module, num_devices, args.seed), {"from": "seed", "seed": args.seed}
    from .arrays import read_arrays, values_of
    arrays = read_arrays(args.inputs, "arg")
    shapes = [p.shape for p in exe.parameters]
    if not any(key.startswith("dev") for key in arrays):
        inputs = values_of(arrays, args.inputs, "arg", shapes, what="entry arguments", check_shapes=False)
        split = spmd.GlobalInputs(inputs) if args.ray is not None \
            else spmd.split_inputs(exe.module, inputs, num_devices)
        return split, {"from": "npz", "path": args.inputs, "split": "global arrays by sharding"}
    by_device: dict[int, dict] = {}
    for key, value in arrays.items():
        m = re.fullmatch(r"dev(\d+)/.*", key)
        if m is None:
            raise UsageError(f"{args.inputs}: unexpected key {key!r} (expected dev{{d}}/arg{{i}}, or arg{{i}} only)")
        by_device.setdefault(int(m.group(1)), {})[key] = value
    if sorted(by_device) != list(range(num_devices)):
        raise UsageError(f"{args.inputs}: inputs for devices {sorted(by_device)}; the run has devices "
                         f"0..{num_devices - 1}")
    inputs = [values_of(by_device[d], args.inputs, f"dev{d}/arg", shapes, what=f"entry arguments (dev{d})")
              for d in range(num_devices)]
    return inputs, {"from": "npz", "path": args.inputs, "split": "per device"}


def _spmd_setup(exe, args, text_out, global_inputs=None):
    """(partitions, replicas, the counts' note, say(message), per-device inputs, their description) of an SPMD
    run: counts from the flags or the module (the note, when inferred, is said at once: with --json on stderr);
    inputs from `global_inputs` split by sharding (where the participants run, with --ray), else from
    --inputs/--seed (_per_device_inputs)."""
    from .. import spmd
    from ..spmd import PRE_PARTITION_HINT
    def say(message: str) -> None:        # with --json, on stderr
        print(message, file=text_out or sys.stderr, flush=True)
    if exe.manual_regions:
        raise UsageError(f"--spmd runs a per-device (SPMD-partitioned) module, and {exe.module.name} is not one: "
                         + PRE_PARTITION_HINT)
    partitions, replicas, note = spmd.device_counts(exe.module, args.partitions, args.replicas)
    if note:
        say(note)
    n = partitions * replicas
    if args.ray is not None and (args.plugin or args.custom_call_identity):
        raise UsageError("--plugin and --custom-call-identity register targets in this process, not in the Ray "
                         "workers: to run them with --ray, install them as a package with an `hloexec.custom_calls` "
                         "entry point (every worker loads those)")
    if global_inputs is not None:
        per_device = spmd.GlobalInputs(global_inputs) if args.ray is not None \
            else spmd.split_inputs(exe.module, global_inputs, n)
        return partitions, replicas, note, say, per_device, None
    return (partitions, replicas, note, say, *_per_device_inputs(exe, args, n))


def _spmd_outputs(exe, args, text_out, global_inputs=None, reference=None):
    """(counts, per-device outputs, assemble) of an SPMD run, what it says printed first; inputs from
    `global_inputs` split by sharding, else from --inputs/--seed (_spmd_setup). `assemble()` gives the
    global outputs, assembled by the output shardings (the ones the `reference` module, the program before
    partitioning, annotates where the module has none), cropped to the reference's output shapes. With
    --ray the per-device outputs stay on the workers (a RayOutputs) until asked for."""
    from .. import spmd
    partitions, replicas, note, say, per_device, inputs_info = _spmd_setup(exe, args, text_out, global_inputs)
    n = partitions * replicas
    ray = args.ray is not None
    runner = {"runner": "ray", "ray_address": None if args.ray == "local" else args.ray,
              "participants_per_worker": args.participants_per_worker} if ray else {}
    start = time.perf_counter()
    outputs = exe.run_spmd(per_device, partitions=partitions, replicas=replicas, report=say, **runner)
    counts = {"partitions": partitions, "replicas": replicas, "devices": n, "note": note,
              "inputs": inputs_info, "runner": "ray" if ray else "threads",
              "memory": outputs.report["memory"] if ray else spmd.memory_estimate(exe, per_device),
              "execute_seconds": time.perf_counter() - start}
    if ray:
        counts["ray"] = outputs.report
    global_shapes = [leaf.dims for _, leaf in reference.entry.root.shape.leaves()] if reference is not None else None
    if global_shapes is not None:
        for i, (sharding, got) in enumerate(zip(spmd.output_shardings(exe.module, reference), flatten(outputs[0]))):
            if sharding is None and tuple(got.shape) != tuple(global_shapes[i]):
                raise UsageError(f"output {i} has no sharding in {exe.module.name} nor in the reference's ROOT, and "
                                 f"its per-device shape {list(got.shape)} is not the reference's "
                                 f"{list(global_shapes[i])}: cannot assemble it (give the reference's ROOT a "
                                 f"sharding, e.g. jax's out_shardings in the pre-optimization HLO)")
    return counts, outputs, lambda: spmd.assemble_outputs(exe.module, outputs, global_shapes, reference)


def output_groups(index: int, per_device: list) -> list[dict]:
    """An output's per-device summaries, devices with equal values grouped: [{devices, summary}, ...]."""
    groups: list[dict] = []
    for d, value in enumerate(per_device):
        for g in groups:
            same = g["value"].shape == value.shape and \
                np.array_equal(g["value"], value, equal_nan=value.dtype.kind in "fc")
            if same:
                g["devices"].append(d)
                break
        else:
            groups.append({"devices": [d], "value": value})
    return [{"devices": g["devices"], "summary": array_summary(index, g["value"])} for g in groups]


def remote_output_groups(outputs) -> list[list[dict]]:
    """output_groups for outputs left on Ray workers (a RayOutputs): devices grouped by their digests (the
    same bytes), each group's summary made by a worker that holds it; no array moves."""
    digests = [flatten(d) for d in outputs.digests()]
    groups: list[list[list[int]]] = []
    for i in range(len(digests[0])):
        by_digest: dict = {}
        for d, leaves in enumerate(digests):
            by_digest.setdefault(leaves[i], []).append(d)
        groups.append(list(by_digest.values()))
    requests: dict[int, list[int]] = {}
    for i, output in enumerate(groups):
        for devices in output:
            requests.setdefault(devices[0], []).append(i)
    summaries = outputs.apply(array_summary, requests)
    return [[{"devices": devices, "summary": summaries[devices[0]][i]} for devices in output]
            for i, output in enumerate(groups)]


def cmd_run_spmd(exe, args, text_out, seconds: dict) -> int:
    """`hloexec run --spmd / --partitions N / --replicas R`: every participant, collectives between them."""
    from .. import spmd
    counts, outputs, assemble = _spmd_outputs(exe, args, text_out)
    seconds["execute"] = counts.pop("execute_seconds")
    if isinstance(outputs, list):
        per_device = [flatten(out) for out in outputs]
        groups = [output_groups(i, [leaves[i] for leaves in per_device]) for i in range(len(per_device[0]))]
    else:
        groups = remote_output_groups(outputs)
    problems = spmd.check_replicated(exe.module, outputs)
    checked = sum(1 for s, output in zip(spmd.output_shardings(exe.module), groups)
                  if spmd.agreeing_groups(s, counts["devices"], len(output[0]["summary"]["shape"])))
    nan_found = any(g["summary"]["nan"] for output in groups for g in output)
    if args.out is not None:          # with --ray: gathers every device's outputs here
        from .xla_cpu import save_arrays
        arrays = {f"out{i}": a for i, a in enumerate(flatten(assemble()))}
        arrays.update({f"dev{d}/out{i}": a for d, out in enumerate(outputs) for i, a in enumerate(flatten(out))})
        save_arrays(args.out, arrays)
    replicated = {"outputs_checked": checked, "agree": not problems, "problems": problems}
    if args.json:
        _print_json({"command": "run", "version": JSON_VERSION, "file": args.file, "module": exe.module.name,
                     "spmd": counts, "seconds": seconds, "replicated": replicated, "nan_found": nan_found,
                     "outputs": [{"index": i, "devices_agree": len(g) == 1, "per_device": g}
                                 for i, g in enumerate(groups)],
                     "out": args.out})
    else:
        n = counts["devices"]
        print(f"module {exe.module.name}: {counts['partitions']} partitions x {counts['replicas']} replicas, "
              f"{len(groups)} output{'s' if len(groups) != 1 else ''} per device, inputs "
              + (f"seed {args.seed}" if args.inputs is None else args.inputs))
        print(f"{'out':>4}  {'devices':<16} {'shape':<20} {'dtype':<6} {'min':>12} {'max':>12} {'mean':>12} "
              f"{'NaN':>8} {'Inf':>8}")
        for i, output in enumerate(groups):
            if len(output) > 1:       # devices differ: one line, min/max over all of them
                s = _across_devices(i, output)
                devices = f"{spmd.device_ranges(list(range(n)))} ({len(output)} values)"
            else:
                s, devices = output[0]["summary"], spmd.device_ranges(output[0]["devices"])
            shape = "[" + ",".join(map(str, s["shape"])) + "]"
            print(f"{i:>4}  {devices:<16} {shape:<20} {s['dtype']:<6} {_fmt(s['min']):>12} {_fmt(s['max']):>12} "
                  f"{_fmt(s['mean']):>12} {s['nan']:>8} {s['inf']:>8}")
        if problems:
            print(f"replicated outputs: {len(problems)} disagreement{'s' if len(problems) != 1 else ''}")
            for line in problems:
                print(f"  {line}")
        else:
            print(f"replicated outputs: {checked} output{'s' if checked != 1 else ''} meant to agree across devices "
                  f"(by their shardings) agree exactly")
        print(f"time: parse {seconds['parse'] * 1e3:.1f} ms, prepare {seconds['prepare'] * 1e3:.1f} ms, "
              f"execute {seconds['execute']:.2f} s ({n} participants)")
        if "ray" in counts:
            from .stats import human_bytes
            moved, workers = counts["ray"]["bytes_moved"], counts["ray"]["workers"]
            print(f"ray: {len(workers)} workers on {len({w['node'] for w in workers})} node(s); moved between "
                  f"workers {human_bytes(moved['object_store'])} through the object store, "
                  f"{human_bytes(moved['actor_calls'])} in actor calls ({human_bytes(moved['between_nodes'])} between "
                  f"nodes); inputs put {human_bytes(moved['inputs'])}, outputs fetched "
                  f"{human_bytes(moved['outputs_fetched'])}; peak RSS per worker "
                  + ", ".join(human_bytes(w["peak_rss_bytes"]) for w in workers))
        if args.out is not None:
            print(f"outputs written to {args.out} (out{{i}} global, dev{{d}}/out{{i}} per device)")
    if problems:
        print(f"error: {len(problems)} replicated output(s) disagree across devices", file=sys.stderr)
        return EXIT_MISMATCH
    if nan_found and args.fail_on_nan:
        print("error: NaN in the outputs (--fail-on-nan)", file=sys.stderr)
        return EXIT_MISMATCH
    return EXIT_OK


def _across_devices(index: int, output: list[dict]) -> dict:
    """One summary line for an output whose devices hold different values: extremes over all devices,
    the mean of their means (every device's array has the same size)."""
    summaries = [g["summary"] for g in output for _ in g["devices"]]
    present = [s for s in summaries if s["min"] is not None]
    first = summaries[0]
    same_shape = all(s["shape"] == first["shape"] for s in summaries)
    # float(): array_summary gives infinities as the strings "inf"/"-inf" (JSON has none)
    return {"index": index, "shape": first["shape"] if same_shape else "varies",
            "dtype": first["dtype"], "min": min((float(s["min"]) for s in present), default=None),
            "max": max((float(s["max"]) for s in present), default=None),
            "mean": sum(float(s["mean"]) for s in present) / len(present) if present else None,
            "nan": sum(s["nan"] for s in summaries), "inf": sum(s["inf"] for s in summaries)}


def cmd_numerics(args) -> int:
    """`hloexec numerics`: which instructions lose the accuracy, and where NaN/Inf come from."""
    from .numerics import attribute, format_numerics, numerics_dict
    text_out = None if args.json else sys.stdout
    modules, _ = _parse_module_file(args.file)
    module = select_module(modules, args.module, args.file)
    exe, _ = _prepare(module, args)
    runner, inputs, inputs_info = _runner(exe, args, text_out)
    say = lambda message: print(message, file=text_out or sys.stderr, flush=True)  # noqa: E731
    start = time.perf_counter()
    reductions = args.reductions or "per-step"         # the HLO's meaning: every reducer step rounds
    report = attribute(exe, inputs, runner, mode="local" if args.local else "auto", reductions=reductions, say=say)
    seconds = time.perf_counter() - start
    if args.json:
        _print_json({"command": "numerics", "version": JSON_VERSION, "file": args.file, "module": module.name,
                     "inputs": inputs_info, "seconds": seconds, **numerics_dict(report, args.top)})
    else:
        print(f"module {module.name}, inputs " + (f"seed {args.seed}" if args.inputs is None else args.inputs)
              + (": the run paired with its shadow (every float type in f64)" if report.mode == "paired" else
                 ": local errors at the run's own operands (no shadow run)")
              + ("; f16/bf16 reductions round every step (the most pessimistic plausible order)"
                 if reductions == "per-step" else "; f16/bf16 reductions accumulate in f32"))
        print(format_numerics(report, args.top))
        print(f"time: {seconds:.2f} s")
    return EXIT_MISMATCH if report.nonfinite is not None and report.nonfinite.origins else EXIT_OK


def cmd_ops(args) -> int:
    from .optable import custom_call_rows, markdown_table, op_rows
    if args.json:
        _print_json({"command": "ops", "version": JSON_VERSION, "ops": op_rows(),
                     "custom_calls": custom_call_rows()})
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


# -- the parser -------------------------------------------------------------------------------
def _subparser(subparsers, name: str, summary: str, examples: str, parents, extra: str = ""):
    epilog = "examples:\n" + examples + ("\n\n" + extra if extra else "") + "\n\n" + EXIT_CODES
    return subparsers.add_parser(name, help=summary, description=summary, epilog=epilog, parents=parents,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hloexec", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Parse, inspect, run and compare XLA HLO text on the CPU.",
        epilog="examples:\n"
               "  hloexec stats dump.hlo\n"
               "  hloexec run model.hlo --seed 0 --out out.npz\n"
               "  hloexec compare model.hlo --inputs in.npz --expected out.npz\n"
               "  hloexec ops --markdown\n\n"
               "run 'hloexec COMMAND --help' for a command's options and examples.\n\n" + EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"hloexec {_version()}")
    parser.add_argument("--debug", action="store_true", help="print Python tracebacks (also HLOEXEC_DEBUG=1)")
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: `hloexec --debug run ...` must not be reset by the subcommand's default.
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="print Python tracebacks (also HLOEXEC_DEBUG=1)")
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    stages = argparse.ArgumentParser(add_help=False)        # FILE may be a dump directory (tools/dumpdir.py)
    stages.add_argument("--stage", metavar="STAGE", help="of a dump directory: before, after, a pass name or "
                                                         "step number, snapshot (default: after)")
    modules = argparse.ArgumentParser(add_help=False, parents=[stages])
    modules.add_argument("--module", metavar="NAME", help="the module to use when the file (or dump directory: "
                                                          "name or number) holds several")
    inputs = argparse.ArgumentParser(add_help=False, parents=[modules])
    source = inputs.add_mutually_exclusive_group()
    source.add_argument("--inputs", metavar="NPZ", help="entry arguments: keys arg0..argN (as save_arrays writes)")
    source.add_argument("--seed", type=int, default=0, help="random entry arguments from this seed (default 0)")
    execution = argparse.ArgumentParser(add_help=False, parents=[inputs])
    execution.add_argument("--no-numba", action="store_true", help="numpy kernels only (no fusion compilation)")
    from .devices import add_device_argument
    add_device_argument(execution)
    execution.add_argument("--excess-precision", action="store_true",
                           help="skip f16/bf16 rounding between ops inside fusions, as XLA:CPU may")
    # default None: accumulate for run and compare, per-step for numerics (parents share their actions, so
    # one subcommand's set_defaults would change every subcommand's default)
    execution.add_argument("--reductions", choices=REDUCTIONS, default=None,
                           help="how add/multiply reduce and reduce-window round: accumulate (default: f16/bf16 in "
                                "f32, rounded once) or per-step (every step rounded to the type, in row-major "
                                "order, as XLA:CPU's optimized modules compute them; numerics' default)")
    execution.add_argument("--compile", choices=COMPILE_MODES, default="background",
                           help="background (default): kernels compile while runs go on op by op, each run uses "
                                "those ready; eager: a run waits for the kernels due, the first for all; never: "
                                "op by op")
    execution.add_argument("--max-memory", metavar="SIZE", type=parse_size,
                           help="refuse to run above this peak (e.g. 8G); default: MemAvailable")
    calls = execution.add_argument_group("custom-call targets hloexec does not know (see examples/custom_call_plugin.py)")
    calls.add_argument("--plugin", metavar="FILE", action="append", default=[],
                       help="a Python file registering custom-call targets with "
                            "hloexec.ops.custom_call.register_custom_call (repeatable); installed packages register "
                            "theirs through the entry-point group 'hloexec.custom_calls'")
    calls.add_argument("--custom-call-identity", metavar="NAME", action="append", default=[],
                       help="treat custom-call target NAME as the identity: its value is its operand (transfer and "
                            "marker calls; repeatable)")
    spmd_options = execution.add_argument_group("SPMD (every participant of a partitioned module)")
    spmd_options.add_argument("--spmd", action="store_true",
                              help="run all participants: counts from the module header, or inferred from its "
                                   "replica groups and shardings (a message says so)")
    spmd_options.add_argument("--partitions", type=int, metavar="N", help="partitions per replica (implies --spmd)")
    spmd_options.add_argument("--replicas", type=int, metavar="R", help="replicas (implies --spmd)")
    spmd_options.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                              help="run the participants as Ray actors (implies --spmd; pip install 'hloexec[ray]'): "
                                   "a new local Ray instance, or ADDRESS (auto, ray://HOST:PORT, HOST:PORT) joins a "
                                   "cluster; put it after FILE")
    spmd_options.add_argument("--participants-per-worker", type=_positive_int, metavar="N",
                              help="with --ray: participants per Ray actor (default: spread evenly over the nodes, "
                                   "fewer where a worker would not fit a node's memory)")

    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = _subparser(subparsers, "stats", "Describe HLO files: sizes, ops, dtypes, bytes, FLOPs, collectives.",
                   "  hloexec stats dump.hlo\n"
                   "  hloexec stats a.hlo b.hlo --json | jq '.files[].modules[].flops'",
                   [common, modules],
                   "FLOPs: dots, convolutions and cuBLAS gemms, 2 per multiply-add; called computations count\n"
                   "once per call site; while bodies count once (the trip count is not in the text).")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(handler=cmd_stats)

    p = _subparser(subparsers, "run", "Run a module on the CPU and summarise its outputs.",
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
                   [common, execution],
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
                   "moved between the workers. Needs pip install 'hloexec[ray]' on every node.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--out", metavar="NPZ", help="write the outputs as out0..outM (tuple results flattened)")
    p.add_argument("--fail-on-nan", action="store_true", help="exit 1 when an output holds a NaN")
    p.add_argument("--profile", type=int, nargs="?", const=20, default=0, metavar="N",
                   help="time every instruction of the entry computation (calls inlined); print the N slowest "
                        "(default 20), then how many fused computations and while loops have a compiled kernel "
                        "and why the others run op by op")
    p.add_argument("--repeat", type=_positive_int, default=1, metavar="R",
                   help="run R times (outputs and --profile from the last: kernels compile in the background "
                        "from a fusion's second call, later runs use those ready; --compile eager --repeat 2 "
                        "shows the warm module)")
    p.add_argument("--find-nonfinite", action="store_true",
                   help="one observed run (op by op): the instructions that first make NaN or Inf from operands "
                        "without them, with operand ranges, op_name, source line and the path to the outputs "
                        "(intentional infinities, e.g. a -inf mask, only when they turn into NaN); exit 1 if any")
    p.add_argument("--stop-at-first", action="store_true",
                   help="with --find-nonfinite: end the run at the first origin")
    p.add_argument("--shadow", action="store_true",
                   help="also run the module's shadow (every float type in f64: its exact answer); print the run's "
                        "error per output, and where integer/pred values computed from floats differ; --out writes "
                        "the shadow's outputs")
    p.set_defaults(handler=cmd_run)

    p = _subparser(subparsers, "compare", "Run a module and compare its outputs with a reference.",
                   "  hloexec compare model.hlo --inputs in.npz --expected out.npz\n"
                   "  hloexec compare model.opt.hlo model.pre.hlo --seed 1     # same inputs to both\n"
                   "  hloexec compare model.hlo --against xla --atol 1e-4 --rtol 1e-4\n"
                   "  hloexec compare cpu_after_optimizations.txt --inputs in.npz --expected xla.npz \\\n"
                   "      --reductions per-step                 # f16 sums rounded at every step, as XLA:CPU\n"
                   "  hloexec compare sharded.hlo unsharded.hlo --spmd --seed 0   # global outputs\n"
                   "  hloexec compare pre.hlo opt.hlo --against xla --actual gpu.npz --reference shadow",
                   [common, execution], _tolerances_help() + "\n\n"
                   "--reference shadow: FILE's shadow (the program with every float type in f64: its exact\n"
                   "answer) is the reference; FILE run by hloexec, REFERENCE, --against xla and --actual files\n"
                   "are candidates, judged against the baseline (FILE at its precision, f16/bf16 reductions\n"
                   "rounding every step): rms error <= 2x the baseline's + 0.5 ulp, every element within 1.5x its\n"
                   "own error bound under the device's arithmetic (--device NAME[,NAME...]; docs/verdicts.md).\n\n"
                   "--spmd / --partitions N: FILE is a sharded module; the same global inputs (random ones of\n"
                   "the reference module's shapes, or --inputs with arg{i} keys) are split by FILE's parameter\n"
                   "shardings, all its participants run, and its outputs, assembled into global arrays by the\n"
                   "output shardings, are compared with the reference's.")
    p.add_argument("file", metavar="FILE", help="the module under test")
    p.add_argument("other", metavar="REFERENCE", nargs="?", help="a second HLO file whose outputs are expected")
    p.add_argument("--expected", metavar="NPZ", help="expected outputs: keys out0..outM")
    p.add_argument("--against", choices=["xla"], help="run FILE on XLA:CPU (jaxlib, in a child process)")
    p.add_argument("--reference", choices=["shadow"],
                   help="judge candidates (FILE run by hloexec, REFERENCE, --against xla, --actual) by their distance "
                        "from FILE's shadow (every float type in f64: the exact answer): consistent with the "
                        "program's precision or not (exit 1 when one is not)")
    p.add_argument("--actual", metavar="NPZ", action="append",
                   help="with --reference shadow: a candidate's outputs (keys out0..outM, e.g. a device's); repeatable")
    p.add_argument("--atol", type=float, help="absolute error bound for every output")
    p.add_argument("--rtol", type=float, help="relative error bound for every output")
    p.set_defaults(handler=cmd_compare)

    p = _subparser(subparsers, "numerics", "Which instructions lose the accuracy, and where NaN and Inf come from.",
                   "  hloexec numerics dump.before_optimizations.txt --inputs in.npz\n"
                   "  hloexec numerics step.hlo --seed 1 --top 10 --json | jq '.top[0]'\n"
                   "  hloexec numerics gpt_16dev.hlo --spmd --local     # no shadow run: one run's memory",
                   [common, execution],
                   "One instrumented run of the module (op by op, fused computations opened up, loops per\n"
                   "iteration) paired with its shadow (every float type in f64: its exact answer). Per\n"
                   "instruction: its local error (its op alone on the shadow's operand values rounded to its\n"
                   "own operand types, against the shadow's value), its total error (its value against the\n"
                   "shadow's) and the error its operands arrived with, relative to its scale; per output, its\n"
                   "error and the instructions on its path with the largest local errors; the integer/pred\n"
                   "values computed from floats that differ between the two runs; the NaN/Inf origins.\n"
                   "When both runs do not fit in memory (or with --local): local errors at the run's own\n"
                   "operands, from the run alone.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--top", type=_positive_int, default=20, metavar="N", help="instructions to list (default 20)")
    p.add_argument("--local", action="store_true",
                   help="no shadow run: local errors at the run's own operands (one run's memory)")
    p.set_defaults(handler=cmd_numerics)

    p = _subparser(subparsers, "ops", "List what hloexec executes: opcodes, dtypes, kernels, custom-calls.",
                   "  hloexec ops\n  hloexec ops --markdown > ops.md\n  hloexec ops --json", [common])
    p.add_argument("--markdown", action="store_true", help="the README's markdown table, with notes")
    p.set_defaults(handler=cmd_ops)

    from . import collectives, export, graph, memory       # reports: each command's parser and logic in its own module
    for report in (memory, collectives, export, graph):     # each has its own --module
        report.add_command(subparsers, _subparser, [common, stages])
    from . import report
    report.add_command(subparsers, _subparser, [common, execution])
    from . import devices
    devices.add_command(subparsers, _subparser, [common])
    from . import bisect, diff, dumpdir, extract, minimize  # finding where numbers go wrong (README)
    dumpdir.add_command(subparsers, _subparser, [common])
    for tool in (diff, bisect, extract, minimize):
        tool.add_command(subparsers, _subparser, [common, inputs])
    return parser


def _version() -> str:
    from .. import __version__
    return __version__


def _known_errors() -> tuple:
    """Errors whose message says all a user needs (no traceback, 'error:' prefix)."""
    from .dumpdir import DumpError
    from .hloproto import ProtoError
    from .plugins import PluginError
    from .xla_cpu import XlaCpuError
    return (HloParseError, UnsupportedError, ExecutionError, UsageError, OSError, XlaCpuError, PluginError, DumpError,
            ProtoError)


def _message(e: BaseException, path: str | None = None) -> str:
    """The error's own message; for errors found after parsing, the file they are in first."""
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    if type(e).__name__ == "XlaCpuError":
        return f"XLA:CPU ({e.stage}): {e.message}"
    if isinstance(e, (UnsupportedError, ExecutionError)) and not isinstance(e, ArrayFileError) and path is not None:
        return f"{path}: {e}"
    if isinstance(e, _known_errors()):
        return str(e)
    return f"{type(e).__name__}: {e}"


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:           # --help, --version, usage errors (argparse printed them)
        return e.code if isinstance(e.code, int) else EXIT_ERROR
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    debug = args.debug or os.environ.get("HLOEXEC_DEBUG", "") not in ("", "0")
    previous = signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        if getattr(args, "plugin", None) or getattr(args, "custom_call_identity", None):
            from .plugins import apply
            apply(args.plugin, args.custom_call_identity)
        from .dumpdir import prepare_arguments        # FILE as a dump directory, snapshot or proto
        args.command_line = sys.argv[1:] if argv is None else list(argv)      # `report` shows how to rerun it
        for note in prepare_arguments(args, args.command_line):
            print(note, file=sys.stderr)
        return args.handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("terminated", file=sys.stderr)
        return 143
    except BrokenPipeError:           # `hloexec ops | head`
        sys.stderr.close()
        return EXIT_OK
    except Exception as e:  # noqa: BLE001 - every failure becomes a message and exit code 2
        if debug:
            traceback.print_exc()
        if isinstance(e, _known_errors()):
            print(f"error: {_message(e, getattr(args, 'file', None))}", file=sys.stderr)
        else:
            print(f"internal error: {_message(e)}", file=sys.stderr)
            if not debug:
                print("(run with --debug or HLOEXEC_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
