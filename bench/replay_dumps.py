#!/usr/bin/env python
"""Replay the HLO modules XLA:CPU dumped (e.g. while JAX's own test suite ran) through hloexec and XLA:CPU.

A developer tool, not a test: it needs dump directories made beforehand, and jax for the reference. Every
distinct module (texts equal but for names and metadata count once) runs on random inputs
(`Executable.random_inputs`) three ways: XLA:CPU on its text before optimizations (the reference), hloexec on
that text and on XLA's optimized text; outputs are compared by `hloexec compare`'s rules (XLA's
literal_comparison, f32 1e-5 relative and absolute...), hloexec's f32 / f64 denormals flushed where XLA:CPU's
arithmetic flushed them.
An SPMD-partitioned module (num_partitions or replica_count > 1) is compared on its text before optimizations
only: its optimized text is one device's program.

Making the dumps (jax's tests are not in its wheel: take them from the jax source of the installed version;
JAX_NUM_GENERATED_CASES bounds the parameterized cases):

    XLA_FLAGS="--xla_dump_to=/tmp/dumps/lax --xla_dump_hlo_as_text --xla_dump_large_constants=true" \\
      JAX_PLATFORMS=cpu JAX_NUM_GENERATED_CASES=3 python -m pytest -q jax/tests/lax_test.py

Replaying (each module in a worker process, so an XLA abort costs one module; --max bounds the count):

    python bench/replay_dumps.py /tmp/dumps/* --max 3000 --json replay.json

It prints the counts per verdict -- match, mismatch, unsupported (by opcode / custom-call target), hloexec
error, XLA error, crash, timeout -- and every mismatch with its worst output. Exit status 0.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import queue
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from xla_compare import bits_agreement, flush_denormals  # noqa: E402

_METADATA = re.compile(r",? metadata=\{[^{}]*\}")
_HEADER = re.compile(r"^HloModule \S+")
_NAME_DIGITS = re.compile(r"\.\d+\b")


def module_pairs(dirs, limit: int | None) -> list[tuple[str, str | None]]:
    """(before-optimizations file, after-optimizations file or None) of every distinct module in `dirs`."""
    seen, pairs = set(), []
    for d in dirs:
        for before in sorted(Path(d).glob("*.before_optimizations.txt")):
            text = before.read_text(errors="replace")
            key = hashlib.sha256(_NAME_DIGITS.sub("", _METADATA.sub("", _HEADER.sub("", text))).encode()).hexdigest()
            if key in seen:
                continue
            seen.add(key)
            afters = [before.with_name(before.name.replace("before_optimizations", kind))
                      for kind in ("cpu_after_optimizations", "after_optimizations")]
            after = next((a for a in afters if a.exists()), None)
            pairs.append((str(before), str(after) if after else None))
            if limit is not None and len(pairs) >= limit:
                return pairs
    return pairs


# -- the worker: one module at a time, one JSON line per module ----------------------------------------------
def _leaves(value) -> list:
    return [leaf for v in value for leaf in _leaves(v)] if isinstance(value, tuple) else [np.asarray(value)]


def _stage(name: str) -> None:
    """Tell the driver what runs now (a crash is then put on XLA:CPU or hloexec)."""
    print(json.dumps({"stage": name}), flush=True)


def replay(before: str, after: str | None, options: dict) -> dict:
    import warnings

    import hloexec
    from hloexec.errors import ElidedConstantWarning, UnsupportedError
    from hloexec.tools.compare import compare_outputs, elided_dependencies
    from hloexec.tools.xla_cpu import XlaCpuError, run_on_xla_cpu
    result = {"module": before}
    text = Path(before).read_text(errors="replace")
    _stage("hloexec")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exe = hloexec.load(text, **options)
        inputs = exe.random_inputs(seed=0)
    except UnsupportedError as e:
        return result | {"verdict": "unsupported", "why": e.what}
    except Exception as e:  # noqa: BLE001 - any other failure of hloexec is what the replay looks for
        return result | {"verdict": "hloexec error", "why": f"{type(e).__name__}: {str(e)[:300]}"}
    _stage("XLA:CPU")
    try:
        want = run_on_xla_cpu(text, [leaf for x in inputs for leaf in _leaves(x)])
    except XlaCpuError as e:
        return result | {"verdict": "xla error", "why": f"{e.stage}: {e.message[:200]}"}
    elided = [c.name for c in exe.module.elided_constants()]
    for kind, path in (("pre", before), ("opt", after)):
        if path is None:
            continue
        _stage("hloexec")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ElidedConstantWarning)
                runner = exe if kind == "pre" else hloexec.load(Path(path).read_text(errors="replace"), **options)
                if kind == "opt" and runner.module.num_partitions * runner.module.replica_count > 1:
                    # XLA's SPMD partitioner made the optimized text one device's program: its parameters and
                    # results are shards, not the whole arrays the text before optimizations takes
                    result["partitioned"] = True
                    continue
                got = _leaves(runner.run(*inputs))
                # flushed where XLA:CPU's arithmetic flushed its denormals (FTZ / DAZ: its result is zero)
                got = [flush_denormals(g, np.asarray(want[i]) == 0) if i < len(want) and np.shape(want[i]) == g.shape
                       else g for i, g in enumerate(got)]
        except UnsupportedError as e:
            return result | {"verdict": "unsupported", "why": e.what, "text": kind}
        except Exception as e:  # noqa: BLE001
            return result | {"verdict": "hloexec error", "why": f"{type(e).__name__}: {str(e)[:300]}", "text": kind}
        result.setdefault("bits", {})[kind] = _bits(got, want)
        report = compare_outputs(got, want)
        if not report.passed:
            bad = [o for o in report.outputs if not o.passed]
            depends = elided_dependencies(runner.module)
            worst = bad[0] if bad else None
            return result | {
                "verdict": "mismatch", "text": kind, "problem": report.problem,
                "outputs": [{"index": o.index, "dtype": o.dtype, "shape": list(o.shape), "mismatches": o.mismatches,
                             "max_abs_error": o.max_abs_error, "max_rel_error": o.max_rel_error,
                             "max_ulp": o.max_ulp, "problem": o.problem,
                             "elided_constants": depends[o.index] if o.index < len(depends) else []}
                            for o in bad],
                "worst": None if worst is None or not worst.worst else
                {"index": list(worst.worst[0].index), "got": worst.worst[0].actual, "want": worst.worst[0].expected},
                "elided_constants": elided}
    return result | {"verdict": "match"}


def _bits(got: list, want: list) -> list:
    """Per float output [fraction of elements bit-identical to XLA:CPU's, largest distance in ULPs of the output's
    scale] (tests/xla_compare.py bits_agreement): how far from XLA:CPU's own bits a device profile gets."""
    return [list(bits_agreement(g, w)) for g, w in zip(got, want)
            if np.asarray(w).dtype.name in ("float16", "bfloat16", "float32", "float64")]


def worker(options: dict) -> None:
    """Modules from stdin (before<TAB>after per line), one JSON verdict a line on stdout."""
    import jax.numpy as jnp
    jnp.linalg.solve(np.eye(2, dtype=np.float32), np.ones(2, np.float32))  # registers jax's CPU LAPACK calls
    for line in sys.stdin:
        before, _, after = line.rstrip("\n").partition("\t")
        verdict = replay(before, after or None, options)
        print(json.dumps(verdict, default=str), flush=True)


# -- the driver -------------------------------------------------------------------------------------------
def run_all(pairs, options: dict, timeout: float) -> list[dict]:
    """Every pair through worker processes; a worker that dies or hangs costs its current module only."""
    results, todo = [], list(pairs)
    while todo:
        proc = subprocess.Popen([sys.executable, __file__, "--worker", "--options", json.dumps(options)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                bufsize=1)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda out=proc.stdout: [lines.put(line) for line in out] + [lines.put("")],
                         daemon=True).start()
        while todo:
            before, after = todo[0]
            proc.stdin.write(f"{before}\t{after or ''}\n")
            proc.stdin.flush()
            stage, verdict, died = "hloexec", None, False
            while verdict is None:          # stage lines, then the verdict
                try:
                    line = lines.get(timeout=timeout)
                except queue.Empty:
                    break
                if not line:
                    died = True
                    break
                message = json.loads(line)
                if "verdict" in message:
                    verdict = message
                else:
                    stage = message["stage"]
            todo.pop(0)
            if verdict is None:
                proc.kill()
                status = proc.wait()
                results.append({"module": before, "verdict": "crash" if died else "timeout",
                                "why": f"{stage} " + (f"killed the worker (exit status {status})" if died
                                                      else f"gave no answer in {timeout:g} s")})
                break
            results.append(verdict)
            if len(results) % 100 == 0:
                print(f"  {len(results)} modules", file=sys.stderr, flush=True)
        proc.kill()
        proc.wait()
    return results


def summary(results: list[dict]) -> str:
    verdicts = Counter(r["verdict"] for r in results)
    lines = [f"{len(results)} distinct modules: " + ", ".join(f"{n} {v}" for v, n in verdicts.most_common())]
    partitioned = sum(1 for r in results if r.get("partitioned"))
    if partitioned:
        lines.append(f"{partitioned} SPMD-partitioned (num_partitions or replica_count > 1): only the text before "
                     f"optimizations compared, the optimized one is one device's program")
    compared = verdicts["match"] + verdicts["mismatch"]
    if compared:
        lines.append(f"match rate of the modules both ran: {verdicts['match'] / compared:.2%} "
                     f"({verdicts['match']} of {compared})")
    for verdict in ("unsupported", "hloexec error", "xla error", "crash", "timeout"):
        reasons = Counter(re.sub(r"\s+in %.*", "", r.get("why", "")).strip()[:120]
                          for r in results if r["verdict"] == verdict)
        if reasons:
            lines.append(f"{verdict}:")
            lines += [f"  {n:5d}  {why}" for why, n in reasons.most_common(25)]
    for kind in ("opt", "pre"):
        judged = [r for r in results if r.get("bits", {}).get(kind)]
        if judged:
            exact = [r for r in judged if all(same >= 0.99 and ulps <= 1 for same, ulps in r["bits"][kind])]
            identical = [r for r in judged if all(same == 1 for same, _ in r["bits"][kind])]
            lines.append(f"XLA:CPU's bits, {kind} text ({len(judged)} modules with float outputs): {len(identical)} "
                         f"bit-identical on every output, {len(exact)} >= 99% identical and <= 1 ULP of scale")
            for r in judged:
                if r not in exact:
                    worst = min(r["bits"][kind])
                    lines.append(f"  {Path(r['module']).name}: {worst[0]:.2%} identical, {worst[1]:.3g} ULPs of scale")
    mismatches = [r for r in results if r["verdict"] == "mismatch"]
    if mismatches:
        lines.append("mismatches:")
        for r in mismatches:
            out = r["outputs"][0] if r["outputs"] else {}
            lines.append(f"  {r['module']} ({r['text']}): out{out.get('index')} {out.get('dtype')}"
                         f"{out.get('shape')} {out.get('mismatches')} elements, max rel {out.get('max_rel_error')}, "
                         f"worst {r.get('worst')}" + (f"; elided constants {out['elided_constants']}"
                                                      if out.get("elided_constants") else "")
                         + (f" {r['problem']}" if r.get("problem") else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="*", help="XLA dump directories (--xla_dump_to with --xla_dump_hlo_as_text)")
    parser.add_argument("--max", type=int, default=None, help="replay at most this many distinct modules")
    parser.add_argument("--timeout", type=float, default=120, help="seconds one module may take (default 120)")
    parser.add_argument("--options", default="{}", help='hloexec.load options as JSON, e.g. \'{"compile": "eager"}\'')
    parser.add_argument("--json", help="write every module's verdict to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    options = json.loads(args.options)
    if args.worker:
        worker(options)
        return 0
    start = time.perf_counter()
    pairs = module_pairs(args.dirs, args.max)
    print(f"{len(pairs)} distinct modules in {len(args.dirs)} director{'y' if len(args.dirs) == 1 else 'ies'}",
          file=sys.stderr)
    results = run_all(pairs, options, args.timeout)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    print(summary(results))
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
