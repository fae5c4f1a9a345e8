"""Sweep the verdict tools over real programs: every run must end in a result or a clear error.

Runs `compare --reference shadow`, `numerics`, `diff A A --reference shadow` (and `compare --device tpu/a100`
on every Nth file, `diff` on before/after pairs) over HLO files with a time limit per run, and writes one TSV
row per run classified as ok / refused / unsupported / timeout / INTERNAL:

    python bench/sweep_tools.py --out /tmp/sweep.tsv                 # the shared corpora and seeds
    python bench/sweep_tools.py --out /tmp/s.tsv FILE... --commands compare,numerics
    python bench/sweep_tools.py --summary /tmp/sweep.tsv             # counts per class and the INTERNALs

Runs go one at a time through a long-lived worker process (imports and compiled kernels are loaded once): a run
past the time limit, or one that kills the worker (a segfault), costs a fresh worker. An INTERNAL is an error of
no type hloexec names (the CLI's "internal error"), a kernel's Python exception wrapped in an ExecutionError, a
warning that says "a bug" (a compiled schedule or kernel that failed and fell back), or a dead worker; rerun it
alone with `hloexec --debug ...` to see it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

SHARED = Path(os.environ.get("HLOEXEC_SHARED", "/work/shared"))
PAIRS = [
    ("corpus/external/files/tpu_jax_jit_f_before_opt.hlo", "corpus/external/files/tpu_jax_jit_f_after_opt_tiled.hlo")
]
FIELDS = ["file", "command", "class", "exit", "seconds", "error_type", "message"]
# A kernel's own Python exception, wrapped by the runner with the instruction it failed in: a bug, not bad input.
_WRAPPED = re.compile(
    r"\b(IndexError|KeyError|TypeError|ValueError|AttributeError|ZeroDivisionError|AssertionError|"
    r"NotImplementedError|OverflowError|RecursionError|StopIteration|LoweringError|TypingError|"
    r"NumbaError)\b"
)
_BUG = re.compile(r"a bug|did not compile|not evaluated alone|internal error|kernel returned")


def default_files() -> list[Path]:
    xla = sorted((SHARED / "corpus/xla").glob("*.hlo"))
    external = sorted((SHARED / "corpus/external/files").glob("*.hlo"))
    seeds = sorted((SHARED / "seeds").glob("*.hlo"))
    return sorted(xla + external + seeds, key=lambda p: p.stat().st_size)


def modules_of(path: Path) -> list[str | None]:
    """The names to pass as --module: [None] for a file of one module (or one that does not parse: the run says
    why), else each distinct module name."""
    import hloexec

    try:
        names = [m.name for m in hloexec.parse(path.read_text(encoding="utf-8", errors="surrogateescape"))]
    except Exception:  # noqa: BLE001 - the sweep's own runs report it
        return [None]
    return [None] if len(names) < 2 else list(dict.fromkeys(names))


def jobs(files: list[Path], commands: set[str], device_every: int, limit: str):
    memory = ["--max-memory", limit]
    for i, f in enumerate(files):
        s = str(f)
        for module in modules_of(f):
            key, pick = (s, []) if module is None else (f"{s}::{module}", ["--module", module])
            shadow = ["--reference", "shadow", "--seed", "0", *pick, *memory]
            if "compare" in commands:
                yield key, "compare", ["compare", s, *shadow]
                if device_every and i % device_every == 0:
                    for device in ("tpu", "a100"):
                        yield key, f"compare-{device}", ["compare", s, *shadow, "--device", device]
            if "numerics" in commands:
                yield key, "numerics", ["numerics", s, "--seed", "0", *pick, *memory]
            if "diff" in commands:
                yield key, "diff-self", ["diff", s, s, *shadow]
    if "diff" in commands:
        for a, b in PAIRS:
            if (SHARED / a).exists() and (SHARED / b).exists():
                yield (
                    f"{a} {b}",
                    "diff-pair",
                    ["diff", str(SHARED / a), str(SHARED / b), "--reference", "shadow", *memory],
                )


def classify(rc: int | None, error_type: str | None, output: str) -> str:
    if rc is None:
        return "INTERNAL"  # the worker died: a crash
    if rc == 124:
        return "timeout"
    first_error = next((ln for ln in output.splitlines() if ln.startswith(("error:", "internal error:"))), "")
    if "internal error" in first_error or (error_type and error_type not in _KNOWN):
        return "INTERNAL"
    if error_type == "ExecutionError" and _WRAPPED.search(first_error):
        return "INTERNAL"
    if _BUG.search(output):
        return "INTERNAL"
    if rc in (0, 1):
        return "ok"
    return "unsupported" if error_type == "UnsupportedError" else "refused"


_KNOWN = {
    "HloParseError",
    "UnsupportedError",
    "ExecutionError",
    "MemoryLimitError",
    "ArrayFileError",
    "OptionError",
    "UsageError",
    "XlaCpuError",
}


def worker() -> None:
    """Reads one JSON argv per line, runs the CLI in this process, answers one JSON line per run."""
    from hloexec.tools import cli

    seen: list[str] = []
    original = cli.error_message

    def recording(e, path=None):
        seen.append(type(e).__name__)
        return original(e, path)

    cli.error_message = recording
    answer = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # anything written to fd 1 directly does not break the protocol
    for line in sys.stdin:
        argv = json.loads(line)
        seen.clear()
        buffer = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            try:
                rc = cli.main(argv)
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 2
            except BaseException as e:  # noqa: BLE001 - escaped the CLI itself: record it
                seen.append(type(e).__name__)
                buffer.write(f"internal error: escaped main: {type(e).__name__}: {e}\n")
                rc = 2
        answer.write(
            json.dumps(
                {
                    "rc": rc,
                    "type": seen[-1] if seen else None,
                    "output": buffer.getvalue(),
                    "seconds": time.perf_counter() - start,
                }
            )
            + "\n"
        )
        answer.flush()


class Worker:
    def __init__(self):
        env = dict(os.environ, HLOEXEC_DEBUG="1", PYTHONWARNINGS="default")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )

    def run(self, argv: list[str], seconds: float) -> dict | None:
        """The answer, {"rc": 124} past the time limit (the worker is killed), or None if the worker died."""
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], seconds)
        if not ready:
            self.stop()
            return {"rc": 124, "type": None, "output": "", "seconds": seconds}
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            return None
        return json.loads(line)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS")) / 1024

    def stop(self):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def message_of(output: str) -> str:
    lines = output.splitlines()
    error = next((ln for ln in lines if ln.startswith(("error:", "internal error:"))), "")
    if not error:
        error = next((ln for ln in lines if _BUG.search(ln)), "")
    trace = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
    where = f" [at {trace[-1]}]" if trace and not error.startswith("error:") else ""
    return (error + where).replace("\t", " ")[:600]


def sweep(files, commands, out, seconds, device_every, limit, restart_mb):
    done = set()
    if out.exists():
        with open(out) as f:
            done = {tuple(ln.split("\t")[:2]) for ln in f.read().splitlines()[1:]}
    new = not out.exists()
    w = Worker()
    with open(out, "a") as f:
        if new:
            f.write("\t".join(FIELDS) + "\n")
        for name, command, argv in jobs(files, commands, device_every, limit):
            if (name, command) in done:
                continue
            result = w.run(argv, seconds)
            if result is None:
                row = [name, command, "INTERNAL", "crash", "", "", f"the worker died: {w.proc.returncode}"]
                w = Worker()
            else:
                cls = classify(result["rc"], result["type"], result["output"])
                row = [
                    name,
                    command,
                    cls,
                    str(result["rc"]),
                    f"{result['seconds']:.1f}",
                    result["type"] or "",
                    message_of(result["output"]),
                ]
                if result["rc"] == 124:
                    w = Worker()
                elif w.rss_mb() > restart_mb:
                    w.stop()
                    w = Worker()
            f.write("\t".join(row) + "\n")
            f.flush()
            print("\t".join(row[:5]), row[6][:150], flush=True)
    w.stop()


def summary(path: Path) -> None:
    with open(path) as f:
        rows = [dict(zip(FIELDS, ln.split("\t"))) for ln in f.read().splitlines()[1:]]
    files = {r["file"].split("::")[0] for r in rows if r["command"] != "diff-pair"}
    modules = {r["file"] for r in rows if r["command"] != "diff-pair"}
    print(f"{len(files)} files, {len(modules)} modules, {len(rows)} runs")
    counts = Counter((r["command"], r["class"]) for r in rows)
    classes = ["ok", "refused", "unsupported", "timeout", "INTERNAL"]
    print("| command | " + " | ".join(classes) + " | total |")
    print("|---" * (len(classes) + 2) + "|")
    for command in sorted({r["command"] for r in rows}):
        n = [counts[command, c] for c in classes]
        print(f"| {command} | " + " | ".join(map(str, n)) + f" | {sum(n)} |")
    for r in rows:
        if r["class"] == "INTERNAL":
            print(f"INTERNAL\t{Path(r['file']).name}\t{r['command']}\t{r['message'][:300]}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path, help="HLO files (default: the shared corpora and seeds)")
    p.add_argument("--out", type=Path, help="the TSV (appended to: runs already in it are skipped)")
    p.add_argument("--commands", default="compare,numerics,diff")
    p.add_argument("--seconds", type=float, default=60.0, help="time limit per run")
    p.add_argument("--device-every", type=int, default=10, help="compare --device tpu/a100 on every Nth file")
    p.add_argument("--max-memory", default="3G")
    p.add_argument("--restart-mb", type=float, default=2500, help="a fresh worker above this resident size")
    p.add_argument("--summary", type=Path, help="print the counts and INTERNALs of a TSV")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker()
    if args.summary:
        return summary(args.summary)
    files = args.files or default_files()
    sweep(
        files,
        set(args.commands.split(",")),
        args.out,
        args.seconds,
        args.device_every,
        args.max_memory,
        args.restart_mb,
    )


if __name__ == "__main__":
    main()
