"""`hloexec stats`: sizes, ops, dtypes, bytes, FLOPs and collectives of HLO files (tools/stats.py)."""

from __future__ import annotations

import sys

from ...errors import HloParseError, UnsupportedError
from ..common import EXIT_ERROR, EXIT_OK, JSON_VERSION, add_subparser, error_message, print_json
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
            files.append(file_stats(path))
        except (HloParseError, UnsupportedError, OSError) as e:  # the others are still counted
            errors.append({"path": path, "error": error_message(e, path)})
            print(f"error: {error_message(e, path)}", file=sys.stderr)
            continue
        if not args.json:
            print(("\n" if len(files) > 1 else "") + format_file(files[-1]))
    if args.json:
        print_json(
            {"command": "stats", "version": JSON_VERSION, "files": [f.to_dict() for f in files], "errors": errors}
        )
    return EXIT_ERROR if errors else EXIT_OK
