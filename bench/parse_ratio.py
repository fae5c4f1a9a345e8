"""Parse speed on every dump: `hloexec.parse(path)` against XLA's parser (jaxlib's `hlo_module_from_text` on
the text), per file the best of repeated runs of each (at least `--min-runs`, and at least `--min-seconds`
of runs), taken alternately in one process. Files XLA's parser rejects are listed as n/a.

    python bench/parse_ratio.py [--tsv out.tsv] [DIR_OR_FILE...]     (default: the shared seeds and corpus)

Prints one line per file (MB, ms and MB/s of each, XLA time / hloexec time), then the files under 10x and
the totals. Times are the calling thread's CPU time (both parsers run in it), so that other processes on a
shared machine count little; --wall for wall-clock times.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import hloexec
from hloexec.errors import HloParseError
from timing import best_of

SHARED = Path(os.environ.get("HLOEXEC_SHARED") or Path(__file__).resolve().parent.parent.parent / "shared")
GOAL = 10.0


def default_files() -> list[Path]:
    return (sorted((SHARED / "seeds").glob("*.hlo")) + sorted((SHARED / "corpus" / "xla").glob("*.hlo"))
            + sorted((SHARED / "corpus" / "external" / "files").glob("*.hlo")))


def best_time(run, min_runs: int, min_seconds: float, clock) -> float:
    """best_of with enough runs to fill `min_seconds` (a 1 KB dump parses in ~0.1 ms)."""
    start = time.perf_counter()
    run()
    return best_of(run, max(min_runs, int(min_seconds / (time.perf_counter() - start))), clock)


def compare(files: list[Path], min_runs: int = 3, min_seconds: float = 0.05, clock=time.thread_time,
            echo: bool = False) -> tuple[list[tuple[str, float, float, float]], list[tuple[str, str]]]:
    """(name, MB, hloexec seconds, XLA seconds) of each file both parsers read, and (name, reason) of the others;
    per file hloexec's runs, then XLA's (`echo`: a line per file as it is measured)."""
    from hloexec.tools import xla_cpu
    xla_parse = xla_cpu._jax()[1].hlo.hlo_module_from_text
    rows, skipped = [], []
    for path in files:
        text = path.read_text(errors="replace")
        try:
            xla_parse(text)
        except Exception as e:            # XLA's parser rejects it: nothing to compare with
            skipped.append((path.name, f"XLA: {str(e).splitlines()[0][:80]}"))
            continue
        try:
            hloexec.parse(path)
        except HloParseError as e:
            skipped.append((path.name, f"hloexec: {e.message[:80]}"))
            continue
        ours = best_time(lambda: hloexec.parse(path), min_runs, min_seconds, clock)
        theirs = best_time(lambda: xla_parse(text), min_runs, min_seconds, clock)
        mb = path.stat().st_size / 2**20
        rows.append((path.name, mb, ours, theirs))
        if echo:
            print(f"{path.name[:72]:72s} {mb:7.3f} MB  hloexec {ours * 1e3:8.3f} ms {mb / ours:6.0f} MB/s  "
                  f"XLA {theirs * 1e3:8.3f} ms {mb / theirs:5.1f} MB/s  x{theirs / ours:6.1f}", flush=True)
    return rows, skipped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path)
    ap.add_argument("--tsv", type=Path, help="also write the per-file table here")
    ap.add_argument("--min-runs", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=0.05, help="per file and parser")
    ap.add_argument("--wall", action="store_true", help="wall-clock times (default: the thread's CPU time)")
    args = ap.parse_args()
    clock = time.perf_counter if args.wall else time.thread_time
    files = [f for p in args.paths for f in (sorted(p.glob("*.hlo")) if p.is_dir() else [p])] or default_files()

    rows, skipped = compare(files, args.min_runs, args.min_seconds, clock, echo=True)
    if args.tsv:
        with open(args.tsv, "w") as f:
            f.write("file\tMB\thloexec_ms\txla_ms\tratio\n")
            for name, mb, ours, theirs in rows:
                f.write(f"{name}\t{mb:.4f}\t{ours * 1e3:.4f}\t{theirs * 1e3:.4f}\t{theirs / ours:.2f}\n")
    below = sorted((r for r in rows if r[3] / r[2] < GOAL), key=lambda r: r[3] / r[2])
    rejected_by_xla = sum(reason.startswith("XLA") for _, reason in skipped)
    print(f"\n{len(rows)} files compared; not compared: {rejected_by_xla} that XLA's parser rejects, "
          f"{len(skipped) - rejected_by_xla} that hloexec rejects")
    for name, reason in skipped:
        if not reason.startswith("XLA"):
            print(f"  {name}: {reason}")
    for name, mb, ours, theirs in below:
        print(f"under {GOAL:.0f}x: {name} ({mb * 1024:.1f} KB): x{theirs / ours:.1f}")
    if rows:
        ratios = [theirs / ours for _, _, ours, theirs in rows]
        mb_total = sum(r[1] for r in rows)
        print(f"ratio min {min(ratios):.1f}, median {statistics.median(ratios):.1f}, geometric mean "
              f"{statistics.geometric_mean(ratios):.1f}; all files: hloexec {mb_total / sum(r[2] for r in rows):.0f} "
              f"MB/s, XLA {mb_total / sum(r[3] for r in rows):.1f} MB/s")


if __name__ == "__main__":
    main()
