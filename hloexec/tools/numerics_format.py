"""How a `hloexec numerics` report reads: the instructions beyond their bounds, the JSON document and the text
(numerics.py computes it)."""

from __future__ import annotations

from dataclasses import asdict

from .nonfinite import format_report as format_nonfinite
from .numerics import CONTRIBUTION_CANDIDATES, NumericsReport


def beyond_bound(report: NumericsReport) -> list:
    """The instructions whose error exceeds what their error bound allows, the furthest first."""
    return sorted(
        (r for r in report.instructions if r.bound_ratio is not None and r.bound_ratio > 1),
        key=lambda r: -r.bound_ratio,
    )


def numerics_dict(report: NumericsReport, top: int) -> dict:
    return {
        "mode": report.mode,
        "local_errors_of": report.local_errors_of or None,
        "top": [asdict(r) for r in report.instructions[:top] if r.runs],
        "instructions_evaluated": sum(1 for r in report.instructions if r.local_error or r.total_error),
        "outputs": report.outputs,
        "divergences": [asdict(d) for d in report.divergences],
        "beyond_bound": [r.name for r in beyond_bound(report)],
        "parted": report.parted,
        "not_evaluated": report.not_evaluated,
        "nonfinite": asdict(report.nonfinite) if report.nonfinite is not None else None,
    }


def format_numerics(report: NumericsReport, top: int) -> str:
    paired = report.mode == "paired"
    lines = [
        "outputs: "
        + ("the run's error against the shadow, relative to the output's scale, and " if paired else "")
        + "the instructions on its path that contribute most to the outputs' error (c=: how far rounding its "
        "value moves the outputs, relative to their scale), then by local error"
    ]
    if report.local_errors_of:
        lines.insert(0, f"local errors of {report.local_errors_of} (the others run the same instructions unobserved)")
    lines.append(
        f"{'out':>4}  {'shape':<16} {'dtype':<5} "
        + (f"{'max rel':>9} {'rms rel':>9} {'ulp@scale':>9}  " if paired else "")
        + "on its path"
    )
    for o in report.outputs:
        shape = "[" + ",".join(map(str, o["shape"])) + "]"
        e = o["error"]
        errors = ""
        if paired:
            errors = (
                f"{e['mismatches']:>9} differ{'':>14}  "
                if e["mismatches"]
                else f"{e['max_rel']:9.3g} {e['rms_rel']:9.3g} {e['max_ulps']:9.3g}  "
            )
            if e["nonfinite"]:
                errors += f"({e['nonfinite']} non-finite where the shadow is finite) "
        path = (
            ", ".join(
                f"%{i['name']} ({i['opcode']}) "
                + (f"c={i['contribution']:.3g}" if i["contribution"] is not None else f"{i['local_error']:.3g}")
                for i in o["instructions"]
            )
            or "-"
        )
        lines.append(f"{o['index']:>4}  {shape:<16} {o['dtype']:<5} {errors}{path}")
    shown = [r for r in report.instructions[:top] if r.runs]
    lines.append(
        f"top {len(shown)} instructions: by contribution (how far rounding its value to its type moves the "
        f"outputs from the exact answer, relative to their scale; the {CONTRIBUTION_CANDIDATES} largest local "
        "errors of the entry measured), then by local error: the error an instruction adds given exact operands "
        + (
            "(its op on the shadow's operand values rounded to its operand types, against the shadow's value)"
            if paired
            else "(at the run's own operands: its op against the same op in f64)"
        )
        + ", relative to its scale (max |exact value|)"
        + (
            "; total: its value against the shadow's; inherited: the largest error its operands arrived with"
            if paired
            else ""
        )
    )
    lines.append(
        f"{'contrib':>9} {'local':>9} {'ulp@scale':>9} "
        + (f"{'total':>9} {'inherited':>9} " if paired else "")
        + f"{'runs':>5}  instruction"
    )
    for r in shown:
        nums = (
            "        -" if r.contribution is None else f"{r.contribution:9.3g}"
        ) + f" {r.local_error:9.3g} {r.local_ulps:9.3g} "
        if paired:
            nums += f"{r.total_error or 0:9.3g} {r.inherited_error or 0:9.3g} "
        site = "  ".join(x for x in (r.op_name, r.source) if x)
        where = "" if r.computation == "" else f" in %{r.computation}"
        lines.append(f"{nums}{r.runs:>5}  %{r.name} = {r.shape} {r.opcode}{where}" + (f"  {site}" if site else ""))
    beyond = beyond_bound(report)
    if beyond:
        lines.append(
            f"beyond their error bounds ({len(beyond)}: error / what the arithmetic allows, "
            "docs/verdicts.md): " + ", ".join(f"%{r.name} ({r.opcode}) {r.bound_ratio:.3g}" for r in beyond[:top])
        )
    elif paired:
        lines.append("every instruction within its error bound")
    if report.divergences:
        lines.append(
            "integer/pred values computed from floats that differ between the run and the shadow (what "
            "follows them compares two different paths):"
        )
        lines += [f"  {d.describe()}" for d in report.divergences]
    lines += [f"not paired from here on: {p}" for p in report.parted]
    if report.not_evaluated:
        lines.append(f"not evaluated alone ({len(report.not_evaluated)}): " + "; ".join(report.not_evaluated[:5]))
    if report.nonfinite is not None:
        lines.append("NaN and Inf: " + format_nonfinite(report.nonfinite).replace("\n", "\n  "))
    return "\n".join(lines)
