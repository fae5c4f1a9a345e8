"""How a `hloexec diff` report reads as text (diff.py computes it)."""

from __future__ import annotations

from .diff import DiffReport, Divergence, _name, short_text


def format_report(report: DiffReport, *, limit: int = 10, indent: str = "") -> str:
    """The text `hloexec diff` prints."""
    c, mc = report.counts(), report.matching.counts()
    lines = [
        f"matched {mc['pairs']} values (by anchor {mc['by']['anchor']}, name {mc['by']['name']}, "
        f"metadata {mc['by']['metadata']}, structure {mc['by']['structure']}); not matched: "
        f"{mc['a_unmatched']} of A's {mc['a_nodes']}, {mc['b_unmatched']} of B's {mc['b_nodes']}",
        f"compared {c['values_compared']} values of {c['pairs_compared']} pairs: {c['identical']} identical, "
        f"{c['within_tolerance']} within tolerance, {c['differ']} differ"
        + (
            f", {c['differ_downstream']} differ downstream of those (not compared further)"
            if c["differ_downstream"]
            else ""
        )
        + (f"; {c['pairs_not_observed']} pairs did not run" if c["pairs_not_observed"] else ""),
    ]
    if report.outputs:
        bad = [i for i, (_, _, v) in enumerate(report.outputs) if v is not None and not v.agree]
        lines.append(
            f"outputs: {len(report.outputs)}, "
            + (f"{len(bad)} differ ({', '.join(map(str, bad))})" if bad else "all agree")
        )
    first = report.first_divergence
    if not first:
        lines.append(
            "no divergence: every compared value agrees"
            if not c["differ"] + c["differ_downstream"]
            else "no first divergence found (every differing value has a differing input)"
        )
    else:
        lines.append(f"first divergence{'s' if len(first) > 1 else ''} ({len(first)}, in A's order):")
    for d in first[:limit]:
        lines += _format_divergence(d, limit)
    if len(first) > limit:
        lines.append(f"... {len(first) - limit} more (--json lists them all)")
    quiet = [d for d in report.first_change if d.verdict.agree]
    if quiet:
        lines.append(f"first changes within tolerance ({len(quiet)}: not bit-identical while their inputs are):")
        for d in quiet[:limit]:
            lines += _format_divergence(d, limit)
    for side in ("a", "b"):
        unmatched = report.matching.unmatched(side)
        if unmatched:
            lines.append(
                f"not matched in {side.upper()}: "
                + ", ".join(f"%{n.inst.name} ({n.inst.opcode})" for n in unmatched[:8])
                + (f" and {len(unmatched) - 8} more" if len(unmatched) > 8 else "")
            )
    return "\n".join(indent + line for line in lines)


def _clip(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _format_divergence(d: Divergence, limit: int) -> list[str]:
    v = d.verdict
    lines = [
        f"  A {_clip(short_text(d.a_inst))}  ({d.a_inst.parent.name}, line {d.a_inst.line})",
        f"  B {_clip(short_text(d.b_inst))}  ({d.b_inst.parent.name}, line {d.b_inst.line})"
        + (f"  [matched by {d.how}]" if d.how in ("metadata", "structure") else ""),
    ]
    md = d.a.inst.metadata if isinstance(d.a.inst.metadata, dict) else {}
    source = d.a.inst.source_location or d.b.inst.source_location
    if md.get("op_name") or source:
        lines.append(f"    op_name {md.get('op_name', '-')}" + (f"  at {source}" if source else ""))
    iteration = f" (run {d.occurrence + 1} of the instruction)" if d.occurrence else ""
    if v.retyped:
        lines.append(
            f"    paired across a dtype change ({v.retyped}): "
            + (
                "values equal"
                if v.agree
                else "the values differ: the type change is where the computation "
                f"changed; max abs {v.max_abs_error:.4g}, max rel {v.max_rel_error:.4g}"
            )
            + iteration
        )
    elif v.problem:
        lines.append(f"    error: {v.problem}{iteration}")
    elif v.agree:
        lines.append(
            f"    within tolerance (atol {v.atol:g} rtol {v.rtol:g}): max abs {v.max_abs_error:.4g}, "
            f"max rel {v.max_rel_error:.4g}{iteration}"
        )
    else:
        lines.append(
            f"    error: {v.mismatches}/{v.total} elements beyond atol {v.atol:g} rtol {v.rtol:g}; "
            f"max abs {v.max_abs_error:.4g}, max rel {v.max_rel_error:.4g}{iteration}"
        )
        for w in v.worst[:3]:
            lines.append(f"      [{','.join(map(str, w['index']))}] A {w['a']}  B {w['b']}")
    if d.beyond_bound is not None:
        lines.append(
            f"    beyond both sides' error bounds: {d.bound_ratio:.3g}x what their arithmetic allows together"
            if d.beyond_bound
            else f"    within both sides' error bounds ({d.bound_ratio:.3g}x what they allow together): "
            "a rounding change"
        )
    if d.inputs:
        names = ", ".join(
            f"%{_name(x)}" if _name(x) == _name(y) else f"%{_name(x)}~%{_name(y)}" for x, y in d.inputs[:8]
        )
        lines.append(
            f"    inputs ({'identical' if d.inputs_identical else 'agree within tolerance'}): {names}"
            + (" ..." if len(d.inputs) > 8 else "")
        )
    for side, between in (("A", d.between_a), ("B", d.between_b)):
        if between:
            lines.append(
                f"    between, in {side}: "
                + ", ".join(f"%{n.inst.name} ({n.inst.opcode})" for n in between[:6])
                + (f" and {len(between) - 6} more" if len(between) > 6 else "")
            )
    if d.inside is not None:
        lines.append("    inside the fusions (their computations run op by op on the operands each run gave them):")
        lines.append(format_report(d.inside, limit=limit, indent="      "))
    return lines
