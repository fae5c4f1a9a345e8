"""The op-coverage table, generated from the op registry (`hloexec.ops.registry.OPS`) and the
custom-call targets (`hloexec.ops.custom_call.CUSTOM_CALLS`).

    python -m hloexec.tools.optable                    # print the markdown table
    python -m hloexec.tools.optable --write docs/custom-calls.md  # replace the table between the markers
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BEGIN = "<!-- op-table:begin -->"
END = "<!-- op-table:end -->"


def op_rows() -> list[dict]:
    """One row per opcode: opcode, dtypes, kernel, notes (sorted by opcode)."""
    from ..ops import OPS  # the op registry: not at startup

    return [
        {"opcode": d.opcode, "dtypes": d.dtypes, "kernel": d.kernel, "notes": d.notes}
        for d in sorted(OPS.values(), key=lambda d: d.opcode)
    ]


def custom_call_rows(builtin_only: bool = False) -> list[dict]:
    """One row per custom-call implementation: the targets it serves, its family (the module of
    hloexec.ops.custom_call it is in, or the plugin's module) and its docstring."""
    from ..ops.custom_call import CUSTOM_CALLS

    by_prepare: dict = {}
    for target, prepare in CUSTOM_CALLS.items():
        if builtin_only and not prepare.__module__.startswith("hloexec."):
            continue
        by_prepare.setdefault(prepare, []).append(target)
    rows = [
        {
            "targets": targets,
            "family": prepare.__module__.rsplit(".", 1)[-1],
            "notes": " ".join((prepare.__doc__ or "").split()),
        }
        for prepare, targets in by_prepare.items()
    ]
    return sorted(rows, key=lambda r: (r["family"], r["targets"][0].lower()))


def opaque_rows() -> list[dict]:
    """The compiled-kernel targets hloexec names but cannot run."""
    from ..ops.custom_call import OPAQUE_KERNELS

    return [{"target": t, "kind": kind} for t, kind in sorted(OPAQUE_KERNELS.items())]


def markdown_table() -> str:
    def cell(text: str) -> str:
        return " ".join(str(text).split()).replace("|", "\\|")

    lines = ["| opcode | dtypes | kernel | notes |", "|---|---|---|---|"]
    lines += [f"| `{r['opcode']}` | {cell(r['dtypes'])} | {r['kernel']} | {cell(r['notes'])} |" for r in op_rows()]
    lines += [
        "",
        "custom-call targets, by family (`hloexec/ops/custom_call/<family>.py`; see Custom-calls for "
        "`--plugin`, `--custom-call-identity` and `register_custom_call`):",
        "",
        "| target | family | numerics |",
        "|---|---|---|",
    ]
    lines += [
        f"| {', '.join(f'`{t}`' for t in r['targets'])} | {r['family']} | {cell(r['notes'])} |"
        for r in custom_call_rows(builtin_only=True)
    ]
    lines += [
        "",
        "Opaque compiled kernels (a run stops at them with an error saying so; a plugin can supply "
        "their meaning): " + "; ".join(f"`{r['target']}` ({cell(r['kind'])})" for r in opaque_rows()) + ".",
    ]
    return "\n".join(lines) + "\n"


def replace_table(text: str, table: str) -> str:
    """`text` with everything between the markers replaced by `table`; ValueError without the markers."""
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"markers {BEGIN} ... {END} not found")
    return text[: begin + len(BEGIN)] + "\n" + table + text[end:]


def readme_table(text: str) -> str | None:
    """The table between the markers as written, or None without markers."""
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin:
        return None
    return text[begin + len(BEGIN) : end].lstrip("\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hloexec.tools.optable",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--write", metavar="FILE", help="replace the table between the op-table markers in FILE")
    args = parser.parse_args(argv)
    table = markdown_table()
    if args.write is None:
        sys.stdout.write(table)
        return 0
    path = Path(args.write)
    try:
        path.write_text(replace_table(path.read_text(encoding="utf-8"), table), encoding="utf-8")
    except (OSError, ValueError) as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
