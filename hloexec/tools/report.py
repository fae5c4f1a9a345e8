"""`hloexec report`: one self-contained HTML page (and with --json the same data as one JSON document) that
gathers what an investigation otherwise reads from five commands: the module (`stats`), the verdict of every
candidate against the exact answer (`compare --reference shadow`), where accuracy is lost (`numerics`, with the
dataflow around the worst instruction drawn by `graph`), NaN/Inf origins, memory over the schedule (`memory`)
and collective traffic (`collectives`). Each part comes from the function its command uses (commands/report.py
collects them); this module renders. The page fetches nothing: CSS, script and pictures are inline (it opens from a mail
attachment).
"""

from __future__ import annotations

import html
import math

import numpy as np

from .compare import is_float, output_scale, plain_scalar
from .graph import neighbourhood, own_svg
from .stats import ModuleStats, format_module, human_bytes

TOP = 30  # instructions listed in the attribution, live values at the peak
SHOWN = 8  # table rows shown before a "more" fold
CHART_POINTS = 800  # the memory chart's resolution (schedules have 10k+ steps)
OPEN_OUTPUTS = 8  # outputs whose verdict starts unfolded (failing ones always do)
SMALL_COMPUTATION = 6  # instructions: a worst instruction in a smaller called computation is drawn at its call


def largest_errors(outputs: list, shadow: list) -> list[dict]:
    """Per float output, the element of hloexec's run farthest from the shadow (the exact answer), relative to
    the output's scale (max |shadow|): where to look even when every candidate passes."""
    rows = []
    for i, (o, s) in enumerate(zip(outputs, shadow)):
        o, s = np.asarray(o), np.asarray(s)
        if not is_float(o.dtype) or o.size == 0 or o.shape != s.shape:
            continue
        with np.errstate(all="ignore"):
            e = np.abs(o.astype(np.float64) - s)
        e = np.where(np.isfinite(e), e, -1.0)  # non-finite elements are the NaN/Inf section's
        k = int(np.argmax(e))
        scale = output_scale(s) or 1.0
        rows.append(
            {
                "output": i,
                "index": [int(x) for x in np.unravel_index(k, o.shape)],
                "value": plain_scalar(o.ravel()[k]),
                "exact": plain_scalar(s.ravel()[k]),
                "error": max(float(e.ravel()[k]), 0.0) / scale,
            }
        )
    return sorted(rows, key=lambda r: -r["error"])


def worst_graph(module, instructions) -> tuple[dict | None, str | None]:
    """The dataflow around the instruction that loses the most accuracy, each node filled by the largest local
    error measured in it or in the computations it calls (white: none; red: the largest in the picture), as data
    and SVG (tools/graph.py draws it). A worst instruction alone in a tiny called computation (a wrapped reduce)
    is drawn at its call site, where its inputs come from."""
    worst = next((r for r in instructions if r.runs and r.local_error > 0), None)
    if worst is None:
        return None, None
    comps = {c.name: c for c in module.computations}
    center, comp = worst.name, comps.get(worst.computation, module.entry)
    callers = {c.name: i for k in module.computations for i in k.instructions for c in i.called_computations}
    while len(comp.instructions) < SMALL_COMPUTATION and comp.name in callers:
        site = callers[comp.name]
        center, comp = site.name, site.computation
    g = neighbourhood(module, center, depth=2, computation=comp.name, max_nodes=40)
    ulps: dict[tuple, float] = {}
    for r in instructions:
        if r.runs:
            ulps[(r.computation, r.name)] = max(ulps.get((r.computation, r.name), 0.0), r.local_ulps)
    inside: dict[str, float] = {}

    def within(c) -> float:  # the largest local error in a computation and those it calls
        if c.name not in inside:
            inside[c.name] = 0.0
            inside[c.name] = max(
                [ulps.get((c.name, i.name), 0.0) for i in c.instructions]
                + [within(k) for i in c.instructions for k in i.called_computations]
            )
        return inside[c.name]

    errors = {
        id(n): max([ulps.get((comp.name, n.name), 0.0)] + [within(k) for k in n.called_computations]) for n in g.nodes
    }
    top = max((v for v in errors.values() if math.isfinite(v)), default=0.0)
    # an infinite local error (a value that overflowed where the exact one is finite) is drawn as the largest
    fills = {
        k: _heat(math.log1p(v) / math.log1p(top) if math.isfinite(v) and top > 0 else 1.0)
        for k, v in errors.items()
        if v > 0
    }
    data = {
        "worst": worst.name,
        "worst_computation": worst.computation,
        "center": center,
        "computation": comp.name,
        "colour": "local error in ulps, log scale",
        "nodes": [{"name": n.name, "opcode": n.opcode, "local_ulps": errors[id(n)]} for n in g.nodes],
    }
    return data, own_svg(g, fills)


def _heat(t: float) -> str:
    """White (0) to red (1)."""
    t = min(max(t, 0.0), 1.0)
    return f"#ff{round(255 * (1 - 0.8 * t)):02x}{round(255 * (1 - 0.85 * t)):02x}"


# -- the page ---------------------------------------------------------------------------------------------
_CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 0 auto; max-width: 1200px; padding: 12px 20px; color: #222; }
h1 { font-size: 22px; margin: 8px 0; } h2 { display: inline; font-size: 18px; } h3 { font-size: 15px; margin: 10px 0 4px; }
details.section { border-top: 1px solid #ccc; padding: 8px 0; } details.section > summary { cursor: pointer; }
table { border-collapse: collapse; font-size: 12px; margin: 4px 0; }
td, th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.pass { color: #17702a; font-weight: bold; } .fail { color: #b00020; font-weight: bold; }
pre { background: #f6f6f6; padding: 8px; overflow: auto; font-size: 12px; }
.bar { display: inline-block; background: #6a9fd4; height: 10px; }
.meta { color: #555; font-size: 13px; } .worst { background: #fff3cd; padding: 6px 10px; border-left: 4px solid #e0a800; }
#search { font-size: 14px; padding: 4px; width: 320px; } .graph { overflow: auto; border: 1px solid #eee; }
code { background: #f3f3f3; padding: 1px 3px; }
.row { display: flex; gap: 16px; align-items: flex-start; } .row > pre { flex: 1; margin-top: 0; }
"""

_SCRIPT = """
document.getElementById("search").addEventListener("input", function (e) {
  var needle = e.target.value.trim().toLowerCase().replace(/^%/, "");
  document.querySelectorAll("tr[data-name]").forEach(function (row) {
    var shown = !needle || row.getAttribute("data-name").toLowerCase().indexOf(needle) >= 0;
    row.style.display = shown ? "" : "none";
    for (var d = row.closest("details"); shown && needle && d; d = d.parentElement.closest("details")) {
      d.open = true;                       // a match in a folded table unfolds it
    }
  });
});
if (location.hash.indexOf("#search=") === 0) {   // a link to the page filtered: report.html#search=fusion.12
  var box = document.getElementById("search");
  box.value = decodeURIComponent(location.hash.slice(8));
  box.dispatchEvent(new Event("input"));
}
document.body.setAttribute("data-sections", document.querySelectorAll("details.section").length);
"""


def to_html(data: dict, svg: str | None) -> str:
    e = html.escape
    verdict = data["verdict"]
    ok = verdict.get("consistent")
    state = {True: ("pass", "consistent"), False: ("fail", "not consistent"), None: ("meta", "none")}[ok]
    head = (
        f"<h1>hloexec report: {e(data['module'])}</h1><p class='meta'>{e(data['file'])} &middot; device "
        f"{e(str(data['device']))} &middot; inputs {e(_inputs_text(data['inputs']))} &middot; verdict "
        f"<span class='{state[0]}'>{state[1]}</span></p>"
        f"<p><input id='search' type='search' placeholder='filter instructions by name'></p>"
    )
    sections = [
        _module_section(data),
        _verdict_section(data),
        _attribution_section(data, svg),
        _nonfinite_section(data),
        _memory_section(data),
        _collectives_section(data),
        _rerun_section(data),
    ]
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>hloexec report: {e(data['module'])}</title><style>{_CSS}</style></head><body>"
        + head
        + "".join(s for s in sections if s)
        + f"<script>{_SCRIPT}</script></body></html>\n"
    )


def _section(key: str, title: str, body: str) -> str:
    return f"<details class='section' id='{key}' open><summary><h2>{html.escape(title)}</h2></summary>{body}</details>"


def _inputs_text(info: dict | None) -> str:
    if not info:
        return "-"
    return f"seed {info['seed']}" if info.get("from") == "seed" else str(info.get("path", info.get("from")))


def _module_section(data: dict) -> str:
    s = data["stats"]
    text = "\n".join(
        format_module(
            ModuleStats(
                **{
                    k: v
                    for k, v in s.items()
                    if k in ModuleStats.__dataclass_fields__ and k not in ("collectives", "ops")
                },
                ops={},
                collectives=[],
            )
        )
    )
    ops = sorted(s["ops"].items(), key=lambda kv: -kv[1])
    most = max((n for _, n in ops), default=1)
    rows = "".join(
        f"<tr><td>{html.escape(op)}</td><td class='num'>{n}</td><td><span class='bar' "
        f"style='width:{max(1, round(300 * n / most))}px'></span></td></tr>"
        for op, n in ops
    )
    colls = "".join(
        f"<tr><td>{html.escape(c['kind'])}</td><td class='num'>{c['count']}</td><td class='num'>"
        f"{_bytes(c['bytes'])}</td><td>{html.escape('; '.join(c['replica_groups']))}</td></tr>"
        for c in s["collectives"]
    )
    body = (
        f"<div class='row'><pre>{html.escape(text)}</pre><div><h3>op histogram ({len(ops)} opcodes)</h3>"
        f"<details{' open' if len(ops) <= 25 else ''}><summary>{s['instructions']} instructions</summary>"
        f"<table><tr><th>opcode</th><th>count</th><th></th></tr>{rows}</table></details></div></div>"
    )
    if colls:
        body += (
            "<h3>collectives</h3><table><tr><th>kind</th><th>count</th><th>bytes</th><th>replica groups</th>"
            f"</tr>{colls}</table>"
        )
    return _section("module", "module", body)


def _verdict_section(data: dict) -> str:
    v = data["verdict"]
    outputs = v.get("outputs", [])
    parts = [
        "<p>Each candidate's error against the shadow (the program with every float type in f64: the exact "
        "answer), what the program's arithmetic allows (measured by the baseline) and the verdict.</p>"
        "<p>candidates: "
        + ", ".join(
            f"{html.escape(n)} <span class='{'pass' if c else 'fail'}'>{'consistent' if c else 'not consistent'}</span>"
            for n, c in v.get("candidates", {}).items()
        )
        + "</p>"
    ]
    if v.get("problem"):
        parts.append(f"<p class='fail' id='no-verdict'>{html.escape(str(v['problem']))}</p>")
    if v.get("where_it_fits"):
        parts.append(
            f"<p>The shadow (the exact answer) needs {_bytes(v['shadow_needs_bytes'])}, "
            f"{_bytes(v['memory_allowed_bytes'])} allowed ({html.escape(v['memory_allowed_from'])}): the other "
            "sections are complete, the attribution gives local errors (each instruction against itself in f64 at "
            f"the run's own operands). For the verdict, {html.escape(v['where_it_fits'])}</p>"
        )
    worst = _worst_element(data)
    if worst:
        parts.append(f"<p class='worst' id='worst-element'>{worst}</p>")
    for k, o in enumerate(outputs):
        failing = any(not c.get("consistent", True) for c in o.get("candidates", []))
        title = f"output {o.get('index', k)}: {o.get('dtype', '')}{list(o.get('shape', []))} " + (
            "<span class='fail'>not consistent</span>"
            if failing or o.get("problem")
            else "<span class='pass'>consistent</span>"
        )
        parts.append(
            f"<details class='output'{' open' if failing or k < OPEN_OUTPUTS else ''}><summary>{title}"
            f"</summary>{_output_verdict(o)}</details>"
        )
    return _section("verdict", "verdict", "".join(parts))


def _output_verdict(o: dict) -> str:
    """One output's verdict as one table: the baseline (the measure of what the arithmetic gives) and each
    candidate a row, their error keys as columns; the output's other scalar keys on a line above; anything else
    the verdict holds rendered below (generic: the verdict's keys grow as its rule does)."""
    scalars = {k: v for k, v in o.items() if k not in ("index", "shape", "dtype") and not isinstance(v, (dict, list))}
    rows = [{"candidate": "baseline (the program at its precision)", **_flat(o.get("baseline") or {})}]
    rows += [
        {"candidate": c.get("name"), **_flat({k: v for k, v in c.items() if k != "name"})}
        for c in o.get("candidates", [])
    ]
    rest = {
        k: v
        for k, v in o.items()
        if k not in scalars and k not in ("index", "shape", "dtype", "baseline", "candidates")
    }
    line = " &middot; ".join(f"{html.escape(k)} {_cell(v)}" for k, v in scalars.items() if v not in (None, ""))
    return f"<p class='meta'>{line}</p>" + render(rows) + (render(rest) if rest else "")


def _flat(d: dict) -> dict:
    """Dict-valued keys opened one level (errors.max_rel -> max_rel): one column per number."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and all(not isinstance(x, (dict, list)) for x in v.values()):
            out.update(v)
        else:
            out[k] = v
    return out


def _worst_element(data: dict) -> str:
    """The verdict's worst failing element (largest error over allowed), else the run's largest error."""
    worst = None
    for o in data["verdict"].get("outputs", []):
        for c in o.get("candidates", []):
            for el in c.get("worst") or []:
                ratio = _ratio(el)
                if worst is None or ratio > worst[0]:
                    worst = (ratio, o.get("index"), c.get("name"), el)
    if worst is not None:
        _, index, name, el = worst
        return (
            f"worst element: output {index} {html.escape(str(el.get('index')))}, candidate "
            f"{html.escape(str(name))}: "
            + ", ".join(
                f"{html.escape(k)} {_cell(v)}" for k, v in el.items() if k != "index" and (k, v) != ("devices", None)
            )
        )
    rows = data.get("largest_errors") or []
    if not rows:
        return ""
    r = rows[0]
    return (
        f"every element within what the arithmetic allows; hloexec's largest error: output {r['output']} "
        f"{r['index']}, value {_cell(r['value'])}, exact {_cell(r['exact'])}, error {_cell(r['error'])} of the "
        f"output's scale"
    )


def _ratio(element: dict) -> float:
    error, allowed = element.get("error"), element.get("allowed")
    if error is None:
        return 0.0
    try:
        return float(error) / float(allowed) if allowed else float("inf")
    except (TypeError, ValueError):
        return 0.0


def _attribution_section(data: dict, svg: str | None) -> str:
    n = data["numerics"]
    rows = n.get("top", [])
    columns = ("contribution", "local_error", "local_ulps", "total_error", "inherited_error", "runs")
    cells = [
        f"<tr data-name='{html.escape(r['name'])}'>"
        + "".join(f"<td class='num'>{_cell(r.get(c))}</td>" for c in columns)
        + f"<td>%{html.escape(r['name'])} = {html.escape(r['shape'])} {html.escape(r['opcode'])}"
        + (f" in %{html.escape(r['computation'])}" if r.get("computation") else "")
        + f"</td><td>{html.escape(r.get('op_name', ''))}</td><td>{_source(r.get('source', ''))}</td></tr>"
        for r in rows
    ]
    header = (
        "<tr>"
        + "".join(f"<th>{c.replace('_', ' ')}</th>" for c in columns)
        + "<th>instruction</th><th>op_name</th><th>source</th></tr>"
    )
    parts = [
        f"<p>mode {html.escape(n['mode'])}"
        + (f" (local errors of {html.escape(n['local_errors_of'])})" if n.get("local_errors_of") else "")
        + ": instructions by contribution (how far rounding its value moves the "
        "outputs), then by local error (the error it adds given exact operands), relative to its scale; "
        f"the top {len(rows)} of {n['instructions_evaluated']} evaluated.</p>" + _folded(header, cells)
    ]
    g = data.get("graph")
    if g is not None and svg is not None:
        inside = (
            ""
            if g["center"] == g["worst"]
            else f" (it calls %{html.escape(g['worst_computation'])}, where %{html.escape(g['worst'])} loses the most)"
        )
        parts.insert(
            0,
            f"<h3>dataflow around %{html.escape(g['center'])} in %{html.escape(g['computation'])}{inside}; "
            f"fill: the largest {html.escape(g['colour'])} in each node (fused computations included), "
            f"white: none measured</h3><div class='graph'>{svg}</div>",
        )
    if n.get("outputs"):
        parts.append("<h3>per output: the instructions on its path that lose the most</h3>" + render(n["outputs"]))
    if n.get("divergences"):
        parts.append(
            "<h3>integer/pred values computed from floats that differ from the shadow's</h3>" + render(n["divergences"])
        )
    return _section("attribution", "attribution", "".join(parts))


def _folded(header: str, rows: list[str]) -> str:
    """A table of its first SHOWN rows, the others folded below it (the search box filters both)."""
    table = f"<table>{header}{''.join(rows[:SHOWN])}</table>"
    if len(rows) > SHOWN:
        table += (
            f"<details><summary>{len(rows) - SHOWN} more</summary><table>{header}{''.join(rows[SHOWN:])}"
            "</table></details>"
        )
    return table


def _nonfinite_section(data: dict) -> str:
    nf = data["numerics"].get("nonfinite")
    if not nf or not (nf.get("origins") or nf.get("intentional")):
        return ""
    body = "<p>The instructions that first make NaN or Inf from operands without them (execution order).</p>"
    body += render(nf["origins"])
    if nf.get("intentional"):
        body += "<h3>intentional infinities that turned into NaN</h3>" + render(nf["intentional"])
    return _section("nonfinite", "NaN and Inf origins", body)


def _memory_section(data: dict) -> str:
    m = data["memory"]
    at = m.get("peak_at") or {}
    live = m["live_at_peak"][:TOP]
    rows = [
        f"<tr data-name='{html.escape(v['name'].lstrip('%'))}'><td>{html.escape(v['name'])}</td>"
        f"<td>{html.escape(v['kind'])}</td><td class='num'>{_bytes(v['bytes'])}</td>"
        f"<td>{html.escape(v['shape'])}</td><td>{html.escape(v['why'])}</td></tr>"
        for v in live
    ]
    overhead = f" (of which hloexec's own {_bytes(m['overhead_bytes'])})" if m.get("overhead_bytes") else ""
    body = (
        f"<p>peak {_bytes(m['peak_bytes'][0])} per device{overhead} while %{html.escape(str(at.get('name')))} "
        f"runs (step {m['peak_step']} of {len(m['timeline']) - 1}"
        + (f", {html.escape(at['op_name'])}" if at.get("op_name") else "")
        + ").</p>"
        + memory_chart(m["timeline"], m["peak_step"])
        + f"<h3>live at the peak: the {len(live)} largest of {len(m['live_at_peak'])}</h3>"
        + _folded("<tr><th>value</th><th>kind</th><th>bytes</th><th>shape</th><th>why live</th></tr>", rows)
    )
    return _section("memory", "memory over the schedule", body)


def memory_chart(series: list[int], peak_step: int, width: int = 1000, height: int = 220) -> str:
    """Live bytes over the schedule as an inline SVG (each pixel column the maximum of its steps)."""
    n = len(series)
    buckets = min(n, CHART_POINTS)
    tops = [max(series[b * n // buckets : max((b + 1) * n // buckets, b * n // buckets + 1)]) for b in range(buckets)]
    high = max(tops) or 1
    left, bottom = 70, height - 24
    step = (width - left - 10) / buckets  # each bucket a flat stretch: live bytes change between steps
    ys = [bottom - (bottom - 10) * t / high for t in tops]
    line = " ".join(f"{left + b * step:.1f},{y:.1f} {left + (b + 1) * step:.1f},{y:.1f}" for b, y in enumerate(ys))
    px = left + (peak_step * buckets // n + 0.5) * step
    anchor = "end" if px > width / 2 else "start"
    ticks = "".join(
        f"<text x='{left - 6}' y='{bottom - (bottom - 10) * f + 4:.1f}' text-anchor='end'>"
        f"{_bytes(high * f)}</text><line x1='{left}' x2='{width - 10}' y1='{bottom - (bottom - 10) * f:.1f}' "
        f"y2='{bottom - (bottom - 10) * f:.1f}' stroke='#eee'/>"
        for f in (0, 0.5, 1)
    )
    return (
        f"<svg class='memory-chart' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' font-size='11' font-family='Helvetica, Arial, sans-serif'>{ticks}"
        f"<polyline points='{left},{bottom} {line} {width - 10},{bottom}' fill='#cfe0f3' stroke='#2c6fb7'/>"
        f"<line x1='{px:.1f}' x2='{px:.1f}' y1='10' y2='{bottom}' stroke='#b00020' stroke-dasharray='4 3'/>"
        f"<text x='{px + (-4 if anchor == 'end' else 4):.1f}' y='20' fill='#b00020' text-anchor='{anchor}'>peak</text>"
        f"<text x='{left}' y='{height - 6}'>step 0</text><text x='{width - 10}' y='{height - 6}' text-anchor='end'>"
        f"step {n - 1}</text></svg>"
    )


def _collectives_section(data: dict) -> str:
    c = data.get("collectives")
    if c is None:
        return ""
    by_kind = "".join(
        f"<tr><td>{html.escape(k)}</td><td class='num'>{t['count']}</td><td class='num'>"
        f"{_bytes(t['bytes'])}</td><td class='num'>{_bytes(t['sent_bytes'])}</td><td class='num'>"
        f"{t['seconds'] * 1e3:.3g}</td><td class='num'>{t['exposed_seconds'] * 1e3:.3g}</td></tr>"
        for k, t in c["by_kind"].items()
    )
    listed = sorted(c["collectives"], key=lambda x: -x["bytes"])[:TOP]
    rows = [
        f"<tr data-name='{html.escape(x['name'])}'><td>%{html.escape(x['name'])}</td>"
        f"<td>{html.escape(x['kind'])}</td><td class='num'>{x['group_size']}</td><td class='num'>"
        f"{_bytes(x['bytes'])}</td><td class='num'>{x['seconds'] * 1e3:.3g}</td>"
        f"<td>{html.escape(x.get('op_name') or '')}</td></tr>"
        for x in listed
    ]
    body = (
        f"<p>{c['devices']} devices ({c['partitions']} partitions x {c['replicas']} replicas); "
        f"{len(c['collectives'])} collectives, {_bytes(c['total_bytes'])} per device; link "
        f"{html.escape(c['link']['name'])}. Model: {html.escape(c['model'])}.</p>"
        "<table><tr><th>kind</th><th>count</th><th>bytes</th><th>sent per device</th><th>ms</th><th>exposed ms"
        f"</th></tr>{by_kind}</table><h3>the {len(listed)} largest</h3>"
        + _folded(
            "<tr><th>instruction</th><th>kind</th><th>group</th><th>bytes</th><th>ms</th><th>op_name</th></tr>", rows
        )
    )
    return _section("collectives", "collective traffic", body)


def _rerun_section(data: dict) -> str:
    return _section(
        "rerun",
        "how to rerun",
        f"<pre>{html.escape(data['command_line'])}</pre><p>hloexec {html.escape(data['hloexec_version'])}</p>"
        + _timings(data.get("seconds") or {}),
    )


def _timings(seconds: dict) -> str:
    """What each section took to make (the reader rerunning it knows what to expect)."""
    if not seconds:
        return ""
    parts = ", ".join(f"{html.escape(k)} {v:.1f} s" for k, v in seconds.items())
    return f"<p class='meta'>made in {sum(seconds.values()):.0f} s: {parts}</p>"


# -- generic rendering (the verdict's keys change as the verdict work lands: render whatever is there) -----
def render(value) -> str:
    if isinstance(value, dict):
        return (
            "<table>"
            + "".join(
                f"<tr><th>{html.escape(str(k))}</th><td>{render(v)}</td></tr>"
                for k, v in value.items()
                if v not in (None, [], {}, "")
            )
            + "</table>"
        )
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        keys = list(dict.fromkeys(k for v in value for k in v))
        keys = [k for k in keys if any(v.get(k) not in (None, [], {}, "") for v in value)]
        return (
            "<table><tr>"
            + "".join(f"<th>{html.escape(str(k))}</th>" for k in keys)
            + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{render(v.get(k))}</td>" for k in keys) + "</tr>" for v in value)
            + "</table>"
        )
    return _cell(value)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return f"<span class='{'pass' if value else 'fail'}'>{'yes' if value else 'no'}</span>"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return (
            html.escape(", ".join(map(str, value)))
            if all(not isinstance(v, (dict, list)) for v in value)
            else render(value)
        )
    if isinstance(value, str) and value in ("consistent", "pass", "ok"):
        return f"<span class='pass'>{html.escape(value)}</span>"
    if isinstance(value, str) and value in ("inconsistent", "not consistent", "fail"):
        return f"<span class='fail'>{html.escape(value)}</span>"
    return html.escape(str(value))


def _source(path: str) -> str:
    """A source location's file and line with its last folder (the whole path in the tooltip): a column that fits."""
    parts = path.rsplit("/", 2)
    if len(parts) < 3:
        return html.escape(path)
    return f"<span title='{html.escape(path)}'>…/{html.escape(parts[1])}/{html.escape(parts[2])}</span>"


def _bytes(n) -> str:
    return human_bytes(int(n))
