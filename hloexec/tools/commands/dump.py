"""`hloexec dump`: the programs of an XLA dump directory and their stages (tools/dumpdir.py)."""

from __future__ import annotations

from ..common import JSON_VERSION, add_subparser, print_json
from ..dumpdir import module_summary, scan
from ..stats import human_bytes


def add_parser(subparsers, parents) -> None:
    p = add_subparser(
        subparsers,
        "dump",
        "List the programs of an XLA dump directory (--xla_dump_to) and their stages.",
        "  hloexec dump /tmp/xla_dump\n  hloexec dump /tmp/xla_dump --json | jq '.modules[].name'",
        [parents.common],
        "Any command takes such a directory as FILE with --module NAME_OR_NUMBER and --stage\n"
        "before|after|PASS|STEP|snapshot (default after); a snapshot (.pb) gives its real inputs too.",
    )
    p.add_argument("directory", metavar="DIR")
    p.set_defaults(handler=run)


def run(args) -> int:
    """`hloexec dump DIR`: the programs of a dump directory and their stages."""
    modules = [module_summary(m) for m in scan(args.directory)]
    if args.json:
        print_json({"command": "dump", "version": JSON_VERSION, "directory": args.directory, "modules": modules})
        return 0

    def cell(info) -> str:
        if info is None:
            return "-"
        count = "?" if info["instructions"] is None else str(info["instructions"])
        return f"{info.get('backend', '')} {count} ({human_bytes(info['bytes'])})".strip()

    print(f"{args.directory}: {len(modules)} program{'s' if len(modules) != 1 else ''}")
    print(f"{'number':>6}  {'name':<32} {'before: instructions':<22} {'after':<24} {'passes':>6} {'snapshots':>9}")
    for m in modules:
        after = ", ".join(cell(a) for a in m["after"]) or "-"
        print(
            f"{m['number']:>6}  {m['name']:<32} {cell(m['before']):<22} {after:<24} {m['pass_count']:>6} "
            f"{len(m['snapshots']):>9}"
        )
        for problem in m["problems"]:
            print(f"{'':>8}{problem['file']}: {problem['error']}")
        for missing in m["missing"]:
            print(f"{'':>8}missing: {missing}")
    print("run one stage: hloexec run DIR --module NAME_OR_NUMBER [--stage before|after|PASS|snapshot]")
    return 0
