"""`hloexec stats`: sizes, ops, dtypes, bytes, FLOPs and collectives of HLO files (tools/stats.py)."""

from __future__ import annotations

import sys

from ...errors import HloParseError, UnsupportedError
from ..common import EXIT_ERROR, EXIT_OK, JSON_VERSION, UsageError, add_subparser, error_message, print_json
from ..stats import file_stats, format_file


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "stats",
        "Describe HLO files: sizes, ops, dtypes, bytes, FLOPs, collectives.",
        "  hloexec stats dump.hlo\n  hloexec stats a.hlo b.hlo --json | jq '.files[].modules[].flops'",
        [parents.common, parents.modules],
        "FLOPs: dots, convolutions and cuBLAS gemms, 2 per multiply-add; called computations count\n"
        "once per call site; while bodies count once (the trip count is not in the text).",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(handler=run)


def run(args) -> int:
    files, errors = [], []
    for path in args.files:
        try:
            stats = file_stats(path)
            if args.module is not None:  # --module NAME: that module of each file
                stats.modules = _named(stats, args.module)
        except (HloParseError, UnsupportedError, OSError, UsageError) as e:  # the others are still counted
            errors.append({"path": path, "error": error_message(e, path)})
            print(f"error: {error_message(e, path)}", file=sys.stderr)
            continue
        files.append(stats)
        if not args.json:
            print(("\n" if len(files) > 1 else "") + format_file(files[-1]))
    if args.json:
        print_json(
            {"command": "stats", "version": JSON_VERSION, "files": [f.to_dict() for f in files], "errors": errors}
        )
    return EXIT_ERROR if errors else EXIT_OK


def _named(stats, name: str) -> list:
    """The stats of the module `name` in a file's; UsageError naming those it holds."""
    named = [m for m in stats.modules if m.name == name]
    if not named:
        found = ", ".join(f"{m.name} (line {m.first_line})" for m in stats.modules)
        raise UsageError(f"{stats.path}: no module named {name!r}; found: {found}")
    return named
