"""`hloexec memory`: peak live bytes and what is live there, from the plan `run` checks memory with.

The numbers are the plan's own (hloexec.exec.memory: `PlanMemory.live_bytes`, `PlanMemory.buffer_lives`), not
a second model: the peak printed here is the one `hloexec run` compares with the available memory. The plan is
prepared without compiling a kernel, and nothing runs. An SPMD program is one program for every device,
so each device has the same schedule and the same peak; `--spmd` adds what all participants need when
`run --spmd` runs them in one process (hloexec.spmd.memory_estimate).

Where XLA dumped its buffer assignment beside the module (`X.txt` with `X-buffer-assignment.txt`,
`X-memory-usage-report.txt`, `X-live-range.txt`), its numbers are read and shown beside hloexec's: they
come from XLA's own schedule, buffer sharing and fusion choices, so they differ.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import spmd as spmd_exec
from ..exec.memory import scratch_bytes
from ..exec.plan import Plan
from ..exec.runner import Runner
from ..options import MOST_DESCRIBED
from .opname import fit, layer, op_name, where
from .stats import human_bytes

COLLECTIVE_OPCODES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "collective-broadcast",
    "ragged-all-to-all",
)


@dataclass
class LiveValue:
    """One entry of what is live at a step: a buffer (or a group of them), why, and where it comes from."""

    name: str  # %instruction (a tuple element: %fusion{1})
    kind: str  # parameter | temporary | output | folded | recycled output | unread | scratch | kept
    bytes: int
    shape: str
    why: str
    producer: dict | None  # opname.where() of what made it
    last_user: dict | None  # ... of the last step reading it (None: nothing reads it after this step)
    made: int  # step index (-1: before the first step)
    last: int | None  # the last step holding it (None: past the end)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class MemoryReport:
    file: str
    module: str
    devices: int
    spmd: dict | None  # partitions, replicas, note, and the all-participants estimate
    peak_bytes: int  # per device (every device runs the same program)
    peak_step: int  # index into `series` (0: before the first step; k + 1: while step k runs)
    peak_at: dict | None  # opname.where() of the step running at the peak
    series: list[int]  # live bytes before the first step, then while each step runs
    scratch: list[int]  # of which what the running step holds beyond its result
    live_at_peak: list[LiveValue]
    values_peak_bytes: int  # the peak of the program's values alone (scratch excluded)
    values_peak_step: int
    values_peak_at: dict | None
    live_at_values_peak: list[LiveValue]
    collective_values: list[LiveValue]  # every buffer a collective made: where it lives, from where to where
    steps: list  # the plan's step instructions (for the timeline)
    lives: list  # PlanMemory.buffer_lives()
    xla: dict | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def overhead_bytes(self) -> int:
        """hloexec's own part of the peak: the values the plans of called computations keep ("kept")."""
        return sum(v.bytes for v in self.live_at_peak if v.kind == "kept")

    def to_dict(self) -> dict:
        return {
            "file": self.file,
            "module": self.module,
            "devices": self.devices,
            "spmd": self.spmd,
            "peak_bytes": [self.peak_bytes] * self.devices,
            "overhead_bytes": self.overhead_bytes,
            "program_peak_bytes": self.peak_bytes - self.overhead_bytes,
            "peak_step": self.peak_step,
            "peak_at": self.peak_at,
            "live_at_peak": [v.to_dict() for v in self.live_at_peak],
            "values_peak_bytes": self.values_peak_bytes,
            "values_peak_step": self.values_peak_step,
            "values_peak_at": self.values_peak_at,
            "live_at_values_peak": [v.to_dict() for v in self.live_at_values_peak],
            "collective_values": [v.to_dict() for v in self.collective_values],
            "timeline": self.series,
            "xla": self.xla,
            "seconds": self.seconds,
            "notes": self.notes,
        }


def memory_report(
    exe, file: str = "", spmd: bool = False, partitions: int | None = None, replicas: int | None = None
) -> MemoryReport:
    """The report for a prepared Executable (`hloexec.load(..., compile_kernels=False)` is enough)."""
    start = time.perf_counter()
    plan: Plan = exe.plan
    module = exe.module
    kept = exe.peak_bytes() - plan.memory.peak_bytes()  # values the plans of called computations keep
    series = [b + kept for b in plan.memory.live_bytes()]
    values = plan.memory.live_bytes(scratch=False)
    scratch = [a - kept - b for a, b in zip(series, values)]  # series holds `kept`, values do not
    lives = plan.memory.buffer_lives()
    peak_step = max(range(len(series)), key=series.__getitem__)
    values_step = max(range(len(values)), key=values.__getitem__)
    live = _live_at(plan, lives, peak_step - 1, kept)
    if sum(v.bytes for v in live) != exe.peak_bytes():  # the listing is the model: it must add up
        raise AssertionError(f"live values add up to {sum(v.bytes for v in live)}, the peak is {exe.peak_bytes()}")
    collective_values = [
        _value(plan, life, life.made)
        for life in lives
        if life.producer.opcode.removesuffix("-start").removesuffix("-done") in COLLECTIVE_OPCODES
    ]
    devices, spmd_info, notes = 1, None, []
    if spmd or partitions is not None or replicas is not None:
        P, R, note = spmd_exec.device_counts(module, partitions, replicas, MOST_DESCRIBED)
        devices = P * R
        spmd_info = {
            "partitions": P,
            "replicas": R,
            "note": note,
            "all_participants": spmd_exec.memory_estimate(exe, devices),
        }
        if note:
            notes.append(note)
    steps = plan.steps
    report = MemoryReport(
        file,
        module.name,
        devices,
        spmd_info,
        series[peak_step],
        peak_step,
        where(steps[peak_step - 1].inst) if peak_step else None,
        series,
        scratch,
        live,
        values[values_step] + kept,
        values_step,
        where(steps[values_step - 1].inst) if values_step else None,
        [v for v in _live_at(plan, lives, values_step - 1, kept) if v.kind != "scratch"],
        collective_values,
        [s.inst for s in steps],
        lives,
        xla_numbers(file) if file else None,
        notes=notes,
    )
    report.seconds = time.perf_counter() - start
    return report


def _live_at(plan: Plan, lives, k: int, kept: int) -> list[LiveValue]:
    """What is live while step k runs (k = -1: before the first step), largest first."""
    live = [_value(plan, life, k) for life in lives if life.live_at(k) and life.bytes]
    if k >= 0 and scratch_bytes(plan.steps[k]):
        step = plan.steps[k]
        live.append(
            LiveValue(
                f"%{step.inst.name} (scratch)",
                "scratch",
                scratch_bytes(step),
                "",
                _scratch_why(step),
                where(step.inst),
                None,
                k,
                k,
            )
        )
    if kept:
        live.append(
            LiveValue(
                "(called computations)",
                "kept",
                kept,
                "",
                "parameter-independent values the plans of called computations keep after their first run",
                None,
                None,
                -1,
                None,
            )
        )
    return sorted(live, key=lambda v: -v.bytes)


def _value(plan: Plan, life, k: int) -> LiveValue:
    """A buffer's entry at step k: its name and shape, and why it is live there."""
    inst = life.producer
    slot, path = life.buffer
    shape = inst.shape
    for i in path:
        shape = shape.tuple_shapes[i]
    name = f"%{inst.name}" + "".join(f"{{{i}}}" for i in path)
    later = [j for j in life.readers if j > k]
    last_reader = life.readers[-1] if life.readers else None
    why = {
        "parameter": "a parameter: the caller holds it for the whole run",
        "output": "an output of the module (the caller gets it)",
        "folded": "a parameter-independent value the plan computes once and keeps",
        "recycled output": "an output buffer of the last run, kept for this run's kernel to write again",
        "unread": "nothing reads it; its value is kept to the end of the run",
    }.get(life.kind)
    if why is None:  # a temporary
        if k == life.made:
            why = "being made by this step"
        elif later:
            nxt = plan.steps[later[0]].inst
            why = f"waiting for %{nxt.name} (step {later[0]})" + (
                f", last read by %{plan.steps[last_reader].inst.name} (step {last_reader})"
                if last_reader is not None and last_reader != later[0]
                else ""
            )
        else:
            why = "read by this step for the last time"
    elif later:
        why += f"; next read by %{plan.steps[later[0]].inst.name} (step {later[0]})"
    return LiveValue(
        name,
        life.kind,
        life.bytes,
        shape.to_text(layout=False),
        why,
        where(inst),
        where(plan.steps[last_reader].inst) if last_reader is not None else None,
        life.made,
        life.last,
    )


def _scratch_why(step) -> str:
    kernel = getattr(step.kernel, "interpret", step.kernel)
    if isinstance(kernel, Runner):
        return "what the step holds while it runs: the values of its op-by-op first run (a fusion's first call)"
    return "what the step holds while it runs: f32 copies of its f16/bf16 operands and result (numpy computes in f32)"


# -- XLA's own numbers ------------------------------------------------------------------------------
def xla_files(path: str) -> dict[str, Path]:
    """XLA's buffer-assignment, memory-usage-report and live-range dumps of the module in `path`, where present
    (`--xla_dump_to` names them `<module file without .txt>-buffer-assignment.txt`, ...)."""
    p = Path(path)
    stem = p.name[:-4] if p.name.endswith(".txt") else p.stem
    found = {}
    for kind in ("buffer-assignment", "memory-usage-report", "live-range"):
        candidate = p.with_name(f"{stem}-{kind}.txt")
        if candidate.is_file():
            found[kind] = candidate
    return found


_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+)(.*):\s*$")
_TOTAL = re.compile(r"^Total bytes(?: used)?: (\d+)", re.M)
_CUMULATIVE = re.compile(r"\(cumulative: (\d+) bytes\)")


def xla_numbers(path: str) -> dict | None:
    """What XLA's dumps beside `path` say: allocation bytes by kind (buffer assignment), total bytes (memory
    usage report), peak live bytes and the instruction sequence position it is at (live range). None when
    there are none."""
    files = xla_files(path)
    if not files:
        return None
    out: dict = {"files": {k: str(v) for k, v in files.items()}}
    if "buffer-assignment" in files:
        by_kind: dict[str, int] = {}
        for line in files["buffer-assignment"].read_text(errors="replace").splitlines():
            m = _ALLOCATION.match(line)
            if m:
                attrs = m.group(3)
                kind = (
                    "parameter"
                    if "parameter" in attrs
                    else "constant"
                    if "constant" in attrs
                    else "output"
                    if ("live-out" in attrs or "output shape" in attrs)
                    else "thread-local"
                    if "thread-local" in attrs
                    else "temporary"
                )
                by_kind[kind] = by_kind.get(kind, 0) + int(m.group(2))
        out["allocations"] = by_kind
        out["allocated_bytes"] = sum(by_kind.values())
    if "memory-usage-report" in files:
        m = _TOTAL.search(files["memory-usage-report"].read_text(errors="replace"))
        if m:
            out["total_bytes"] = int(m.group(1))
    if "live-range" in files:
        text = files["live-range"].read_text(errors="replace")
        m = re.search(r"Live ranges at (\d+) \(peak\):\n((?:\s+.*\n?)*)", text)
        if m:
            cumulative = [int(c) for c in _CUMULATIVE.findall(m.group(2))]
            out["peak_live_bytes"] = max(cumulative, default=0)
            out["peak_position"] = int(m.group(1))
    return out


# -- text ---------------------------------------------------------------------------------------------
def format_report(r: MemoryReport, top: int = 15) -> str:
    lines = [f"module {r.module}" + (f" ({r.file})" if r.file else "")]
    if r.spmd is not None:
        lines.append(
            f"{r.devices} devices ({r.spmd['partitions']} partitions x {r.spmd['replicas']} replicas): one SPMD "
            f"program, the same schedule and peak on every device"
        )
    at = r.peak_at
    where_text = (
        f"while step {r.peak_step - 1} of {len(r.steps)} runs: %{at['name']} ({at['opcode']}, HLO line {at['line']})"
        if at
        else "before the first step"
    )
    lines.append(f"peak {human_bytes(r.peak_bytes)} ({r.peak_bytes} bytes) per device, {where_text}")
    if r.overhead_bytes:
        lines.append(
            f"  = the program's buffers {human_bytes(r.peak_bytes - r.overhead_bytes)} + hloexec's own "
            f"{human_bytes(r.overhead_bytes)} ((called computations): values their plans keep after the "
            "first run)"
        )
    if at and at["op_name"]:
        lines.append(f"  op_name {at['op_name']}" + (f"  [{at['phase']}]" if at["phase"] else ""))
    if at and at["source"]:
        lines.append(f"  source {at['source']}")
    lines.append(
        "  the estimate `hloexec run` checks against available memory (live buffers in hloexec's schedule, "
        "inputs included)"
    )
    if r.spmd is not None:
        e = r.spmd["all_participants"]
        lines.append(
            f"  all {e['participants']} participants in one process (run --spmd): {human_bytes(e['total'])} "
            f"= inputs {human_bytes(e['inputs'])} + working memory {human_bytes(e['work'])}"
        )
    lines += ["", f"live at the peak, largest first ({len(r.live_at_peak)} values):"]
    lines += _listing(r.live_at_peak, top)
    if r.values_peak_step != r.peak_step:
        at = r.values_peak_at
        lines += [
            "",
            f"without scratch (what hloexec's kernels hold while they run), the program's own values peak at "
            f"{human_bytes(r.values_peak_bytes)}, "
            + (
                f"while step {r.values_peak_step - 1} runs: %{at['name']} ({at['opcode']}, HLO line {at['line']})"
                + (f" [{at['phase']}]" if at["phase"] else "")
                if at
                else "before the first step"
            ),
        ]
        lines += _listing(r.live_at_values_peak, top)
    if r.collective_values:
        lines += [
            "",
            "values made by collectives (all-gathered, all-reduced, ...): where they live",
            f"  {'bytes':>10}  {'value':<24} {'steps':<10} {'live at':<13} from -> to",
        ]
        for v in sorted(r.collective_values, key=lambda v: -v.bytes)[:top]:
            live = ", ".join(
                label
                for label, step in (("peak", r.peak_step), ("values", r.values_peak_step))
                if v.made <= step - 1 and (v.last is None or step - 1 <= v.last)
            )
            steps = f"{v.made}-{'end' if v.last is None else v.last}"
            lines.append(
                f"  {human_bytes(v.bytes):>10}  {fit(v.name, 24):<24} {steps:<10} {live:<13} "
                f"{_place(v.producer)} -> {_place(v.last_user) if v.last_user else 'the end (output)'}"
            )
    if r.xla is not None:
        lines += ["", "XLA's numbers (its own schedule, buffer sharing and fusions: they differ from hloexec's):"]
        x = r.xla
        if "peak_live_bytes" in x:
            lines.append(
                f"  peak live bytes {human_bytes(x['peak_live_bytes'])} at position {x['peak_position']} of its "
                f"sequence (live-range)   hloexec: {human_bytes(r.peak_bytes)}"
            )
        if "total_bytes" in x:
            lines.append(f"  total allocated {human_bytes(x['total_bytes'])} (memory-usage-report)")
        if "allocations" in x:
            lines.append("  allocations: " + ", ".join(f"{k} {human_bytes(v)}" for k, v in x["allocations"].items()))
    lines += [f"({r.seconds * 1e3:.0f} ms; nothing was run)"]
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


def _listing(values: list[LiveValue], top: int) -> list[str]:
    lines = [f"  {'bytes':>10}  {'value':<28} {'shape':<22} {'made by -> last read by':<34} why"]
    for v in values[:top]:
        lines.append(
            f"  {human_bytes(v.bytes):>10}  {fit(v.name, 28):<28} {fit(v.shape, 22):<22} "
            f"{fit(_span(v), 34):<34} {v.why}"
        )
    if len(values) > top:
        rest = values[top:]
        lines.append(f"  {human_bytes(sum(v.bytes for v in rest)):>10}  ... {len(rest)} more (--json has them all)")
    return lines


def _span(v: LiveValue) -> str:
    if v.producer is None:
        return ""
    made = v.producer["name"] if v.kind != "parameter" else "(parameter)"
    last = v.last_user["name"] if v.last_user else ("end" if v.last is None else "-")
    return f"{made} -> {last}"


def _place(w: dict | None) -> str:
    if w is None:  # nothing made it
        return "-"
    text = f"%{w['name']}"
    if w["layer"] is not None:
        text += f" layer {w['layer']}"
    if w["phase"]:
        text += f" ({w['phase']})"
    return text


# -- the picture --------------------------------------------------------------------------------------
def plot_timeline(r: MemoryReport, path: str, contributors: int = 8) -> None:
    """Live bytes over the schedule as stacked bands: the largest values live at the peak (one band each),
    the parameters, scratch, and everything else; the peak marked. PNG or SVG by the file's suffix."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(r.series)
    x = np.arange(n)
    scale = 1 << 20
    total = np.asarray(r.series, dtype=np.float64)
    bands = _timeline_bands(r, total, contributors)

    fig, ax = plt.subplots(figsize=(11, 5.2), dpi=110)
    # tab10 and Pastel2 are ListedColormaps (with .colors): get_cmap is typed as returning their base class
    tab10 = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]
    palette = iter(tab10[:7] + tab10[8:])  # no gray: kept for these
    layers = iter(plt.get_cmap("Pastel2").colors * 6)  # type: ignore[attr-defined]
    special = {"parameters": "#8c8c8c", "scratch": "#d0d0d0", "other values": "#e8e3c6", "hloexec's own": "#5b5b7a"}
    colors = [
        next((c for key, c in special.items() if label.startswith(key)), None)
        or next(layers if label.startswith("layer ") else palette)
        for label, _ in bands
    ]
    ax.stackplot(
        x, *[y / scale for _, y in bands], labels=[label for label, _ in bands], step="post", colors=colors, alpha=0.95
    )
    ax.plot(x, total / scale, color="black", linewidth=0.8, drawstyle="steps-post", label="total live")
    # a step's value is drawn from x = step to step + 1 (steps-post): mark the middle
    left = r.peak_step > n / 2
    ax.axvline(r.peak_step + 0.5, color="red", linestyle="--", linewidth=1)
    at = f"%{r.peak_at['name']}" if r.peak_at else "start"
    ax.annotate(
        f"peak {human_bytes(r.peak_bytes)}\nwhile {at} runs",
        xy=(r.peak_step + 0.5, r.peak_bytes / scale),
        xytext=(0.02 if left else 0.6, 0.95),
        textcoords="axes fraction",
        fontsize=9,
        color="red",
        arrowprops=dict(arrowstyle="->", color="red", linewidth=0.8),
        va="top",
    )
    if r.values_peak_step != r.peak_step:
        at = f"%{r.values_peak_at['name']}" if r.values_peak_at else "start"
        ax.axvline(r.values_peak_step + 0.5, color="dimgray", linestyle=":", linewidth=1.2)
        ax.annotate(
            f"values alone (no scratch) peak {human_bytes(r.values_peak_bytes)}\nwhile {at} runs",
            xy=(r.values_peak_step + 0.5, r.values_peak_bytes / scale),
            xytext=(0.02 if left else 0.6, 0.80),
            textcoords="axes fraction",
            fontsize=9,
            color="dimgray",
            va="top",
            arrowprops=dict(arrowstyle="->", color="dimgray", linewidth=0.8),
        )
    devices = f"each of the {r.devices} devices (one SPMD program)" if r.devices > 1 else "one device"
    ax.set_title(f"{r.module}\nlive bytes over hloexec's schedule, {devices}", fontsize=10)
    ax.set_xlabel("step of the schedule (entry computation)")
    ax.set_ylabel("live MiB")
    ax.set_xlim(0, max(n - 1, 1))
    ax.set_ylim(0, r.peak_bytes / scale * 1.18 if r.peak_bytes else 1)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _timeline_bands(r: MemoryReport, total: np.ndarray, contributors: int) -> list[tuple[str, np.ndarray]]:
    """The plot's stacked bands, bottom up, each within what is left under the total."""
    n = len(total)
    bands: list[tuple[str, np.ndarray]] = []
    params = sum(v.bytes for v in r.live_at_peak if v.kind == "parameter")
    if r.overhead_bytes:  # held from the start to the end (the plans keep them)
        bands.append(("hloexec's own: (called computations)", np.full(n, float(r.overhead_bytes))))
    if params:
        bands.append((f"parameters ({sum(v.kind == 'parameter' for v in r.live_at_peak)})", np.full(n, float(params))))
    by_name = {f"%{life.producer.name}" + "".join(f"{{{i}}}" for i in life.buffer[1]): life for life in r.lives}
    top: list[LiveValue] = []
    for v in sorted(r.live_at_peak + r.live_at_values_peak, key=lambda v: -v.bytes):
        if (
            v.name in by_name
            and v.kind != "parameter"
            and v.bytes >= r.peak_bytes / 100
            and all(t.name != v.name for t in top)
        ):
            top.append(v)
    top = top[:contributors]
    for v in top:
        life = by_name[v.name]
        y = np.zeros(n)
        lo = life.made + 1 if life.made >= 0 else 0
        hi = n if life.last is None else life.last + 2
        y[lo:hi] = life.bytes
        phase = f", {v.producer['phase']}" if v.producer and v.producer["phase"] else ""
        bands.append((f"{v.name} {v.shape}{phase}", y))
    if any(r.scratch):
        bands.append(("scratch: what the running step holds", np.asarray(r.scratch, dtype=np.float64)))
    # the other values, by the layer their producer's op_name names (activations pile up layer by layer)
    chosen = {v.name for v in top}
    by_layer: dict[int, np.ndarray] = {}
    for name, life in by_name.items():
        index = layer(op_name(life.producer))
        if name in chosen or life.kind == "parameter" or index is None:
            continue
        y = by_layer.setdefault(index, np.zeros(n + 1))
        y[life.made + 1 if life.made >= 0 else 0] += life.bytes
        y[n if life.last is None else min(life.last + 2, n)] -= life.bytes
    if 1 < len(by_layer) <= 48:
        for index in sorted(by_layer):
            bands.append((f"layer {index}: other values", np.cumsum(by_layer[index])[:n]))
    # each band within what is left under the total, in order: nothing is drawn above the total
    below = np.zeros(n)
    for k, (label, y) in enumerate(bands):
        y = np.clip(y, 0, total - below)
        bands[k] = (label, y)
        below += y
    bands.append(("other values", total - below))
    return [(label, y) for label, y in bands if y.any()]  # a legend entry for every colour drawn
