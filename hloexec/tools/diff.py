"""`hloexec diff A B`: where two versions of one program part ways.

The values of A and B are paired (hloexec.tools.match), both modules run with the same inputs and taps on the
paired values, and every pair gets a verdict (`judge`). The report names the *first* divergences: pairs, in
A's order, whose values differ beyond tolerance while the pairs of their nearest paired inputs agree -- where
B's computation departs from A's -- with the instructions between those inputs and the pair.

Runs: both modules run at once, in two threads, and a value is held only until its partner arrives (a side
that gets too far ahead waits), so memory stays near two runs' own. Fusions that are paired with fusions
(a module against an edited copy, two passes after fusion) run compiled and are seen as one value each; when
such a pair is a first divergence, the two fused computations are extracted with the operand values each run
gave them and diffed op by op (`inside`). Everything else is observed op by op: fusions whose values pair with
unfused ones (before vs after optimization), loop bodies (each iteration pairs with the same iteration).

SPMD modules run as one participant (device 0), collectives as `hloexec run` runs them (every other
participant holding the same values): both versions see the same collective semantics.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import ExecutionError, HloParseError, UnsupportedError
from ..ir.module import Instruction
from ..ir.printer import instruction_to_text
from ..parser import parse
from .compare import compare_array, default_tolerance, dtype_name, is_float, jsonable
from .extract import cone_cut, submodule
from .match import Matching, Node, ValueGraph, _outputs, instruction_key, match, value_shape

# A side holding more than this in values whose partners have not arrived yet waits for the other side.
PENDING_BUDGET = 1 << 30
MAX_BETWEEN = 50  # instructions listed between a divergence and its inputs
MAX_WALK = 5000  # nodes visited looking for a pair's nearest paired inputs
MAX_ZOOM = 3  # first divergences of compiled fusions diffed op by op


@dataclass
class Verdict:
    """Whether two values of a pair agree, and by how much they differ."""

    agree: bool
    identical: bool
    total: int = 0
    mismatches: int = 0
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    atol: float = 0.0
    rtol: float = 0.0
    worst: list = field(default_factory=list)  # [{index, a, b, abs_error, rel_error}]
    problem: str = ""
    judged: bool = True  # False: computed from a differing value and not bit-identical; not compared further
    retyped: str = ""  # paired across a float type change: "bf16 -> f32" (A's type -> B's)

    def to_dict(self) -> dict:
        """The JSON form (diff's and bisect's)."""
        return {
            "identical": self.identical,
            "mismatches": self.mismatches,
            "total": self.total,
            "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error,
            "atol": self.atol,
            "rtol": self.rtol,
            "worst": self.worst,
            "problem": self.problem or None,
            "dtype_change": self.retyped or None,
        }


def judge(a, b, atol: float | None = None, rtol: float | None = None) -> Verdict:
    """The tolerance decision for one pair (A's value is the reference): bit-identical values agree; others
    by XLA's literal_comparison rules with the defaults of `hloexec compare` (hloexec.tools.compare).
    Values whose shapes differ only by 1s are compared reshaped. A value whose float type changed (a bf16 add
    that float-normalization computes in f32) is where the computation changed: it differs unless its values
    are equal, whatever the tolerance (the errors are measured in f64), and the verdict says so."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape and a.size == b.size:
        b = b.reshape(a.shape)
    if a.dtype == b.dtype and a.shape == b.shape and _bitwise_equal(a, b):
        return Verdict(True, True, total=a.size)
    retyped = a.dtype != b.dtype and is_float(a.dtype) and is_float(b.dtype) and a.shape == b.shape
    if retyped:  # measured in f64 with A's type's tolerances; agrees only where nothing changed
        default_atol, default_rtol = default_tolerance(a.dtype)
        out = compare_array(
            0,
            b.astype(np.float64),
            a.astype(np.float64),
            default_atol if atol is None else atol,
            default_rtol if rtol is None else rtol,
        )
    else:
        out = compare_array(0, b, a, atol, rtol)
    worst = [
        {"index": list(w.index), "a": w.expected, "b": w.actual, "abs_error": w.abs_error, "rel_error": w.rel_error}
        for w in out.worst
    ]
    agree = out.max_abs_error == 0 and not out.nan_mismatches if retyped else out.passed
    return Verdict(
        agree,
        False,
        out.total,
        out.mismatches,
        out.max_abs_error,
        out.max_rel_error,
        out.atol,
        out.rtol,
        worst,
        out.problem,
        retyped=f"{dtype_name(a.dtype)} -> {dtype_name(b.dtype)}" if retyped else "",
    )


def _bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.itemsize in (1, 2, 4, 8) and a.dtype.kind != "c":
        view = np.dtype(f"u{a.dtype.itemsize}")
        return bool(
            np.array_equal(
                a.view(view) if a.flags.c_contiguous else np.ascontiguousarray(a).view(view),
                b.view(view) if b.flags.c_contiguous else np.ascontiguousarray(b).view(view),
            )
        )
    return a.tobytes() == b.tobytes()


@dataclass
class Divergence:
    """A first divergence: the pair (a, b) differs at `occurrence` (the k-th time they run: loop iterations)
    while the pairs of its nearest paired inputs agree."""

    a: Node
    b: Node
    occurrence: int
    verdict: Verdict
    inputs: list[tuple[Node, Node]]
    inputs_identical: bool  # False: they agree within tolerance only
    between_a: list[Node]
    between_b: list[Node]
    a_inst: Instruction  # what is shown: the fusion when it ran compiled, else the value's own
    b_inst: Instruction
    how: str = ""  # how the pair was matched
    inside: DiffReport | None = None  # the two fused computations diffed op by op
    # judged by both sides' error bounds (diff_bounds.py; None: not judged): |a - b| over what they allow together
    bound_ratio: float | None = None
    beyond_bound: bool | None = None


@dataclass
class DiffReport:
    matching: Matching
    verdicts: dict  # (a node index, b node index) -> [Verdict per occurrence]
    first_divergence: list[Divergence]
    outputs: list[tuple[Node, Node, Verdict | None]]
    not_observed: int
    opened: tuple[int, int]  # computations observed op by op in A, in B
    # pairs whose values are not bit-identical while their inputs are: where B first computes something else,
    # even within tolerance (an edited constant scaling a small gradient)
    first_change: list[Divergence] = field(default_factory=list)

    @property
    def diverges(self) -> bool:
        return bool(self.first_divergence) or any(v is not None and not v.agree for _, _, v in self.outputs)

    @property
    def beyond_bounds(self) -> bool:
        """Judged by the error bounds (reference="shadow"): a first divergence is past them or not judged (every
        one within them: rounding changes, and what differs after them differs because of them)."""
        if not self.first_divergence:
            return self.diverges
        return any(d.beyond_bound is not False for d in self.first_divergence)

    def counts(self) -> dict:
        flat = [v for vs in self.verdicts.values() for v in vs]
        return {
            "pairs_compared": len(self.verdicts),
            "values_compared": len(flat),
            "identical": sum(v.identical for v in flat),
            "within_tolerance": sum(v.agree and not v.identical for v in flat),
            "differ": sum(v.judged and not v.agree for v in flat),
            "differ_downstream": sum(not v.judged for v in flat),
            "pairs_not_observed": self.not_observed,
        }

    def to_dict(self) -> dict:
        return jsonable(
            {
                "matching": self.matching.counts(),
                "compared": self.counts(),
                "opened_computations": {"a": self.opened[0], "b": self.opened[1]},
                "outputs": [
                    {
                        "index": i,
                        "a": x.inst.name,
                        "b": y.inst.name,
                        "agree": None if v is None else v.agree,
                        "error": _error(v),
                    }
                    for i, (x, y, v) in enumerate(self.outputs)
                ],
                "first_divergence": [_divergence_dict(d) for d in self.first_divergence],
                "first_change": [_divergence_dict(d) for d in self.first_change],
                "unmatched": {
                    side: [_node_ref(n) for n in self.matching.unmatched(side)[:MAX_BETWEEN]] for side in ("a", "b")
                },
            }
        )


def _node_ref(node: Node) -> dict:
    return {
        "name": node.inst.name,
        "computation": node.inst.parent.name,
        "opcode": node.inst.opcode,
        "shape": node.inst.shape.to_text(layout=False),
    }


def _name(node: Node) -> str:
    """How a value is named in a report: its outermost holder (a fusion rather than its fused root)."""
    return node.tap.name


def short_text(inst: Instruction) -> str:
    """`%name = shape opcode(%operand, ...), attributes`: what a report shows (metadata, backend config and
    operand shapes left out; the JSON has the full text)."""
    args = (
        inst.args
        if inst.opcode in ("constant", "parameter") or not inst.operands
        else ", ".join(f"%{o.name}" for o in inst.operands)
    )
    attrs = [
        f"{k}={v}" for k, v in inst.attrs.items() if k not in ("metadata", "backend_config", "frontend_attributes")
    ]
    return f"%{inst.name} = {inst.shape.to_text(layout=False)} {inst.opcode}({args})" + (
        ", " + ", ".join(attrs) if attrs else ""
    )


def _error(v: Verdict | None) -> dict | None:
    return None if v is None else v.to_dict()


def _divergence_dict(d: Divergence) -> dict:
    md = d.a.inst.metadata if isinstance(d.a.inst.metadata, dict) else {}
    mdb = d.b.inst.metadata if isinstance(d.b.inst.metadata, dict) else {}
    return {
        "a": d.a_inst.name,
        "b": d.b_inst.name,
        "a_computation": d.a_inst.parent.name,
        "b_computation": d.b_inst.parent.name,
        "a_opcode": d.a_inst.opcode,
        "b_opcode": d.b_inst.opcode,
        "a_text": instruction_to_text(d.a_inst),
        "b_text": instruction_to_text(d.b_inst),
        "a_line": d.a_inst.line,
        "b_line": d.b_inst.line,
        "matched_by": d.how,
        "op_name": md.get("op_name") or mdb.get("op_name"),
        "source": d.a.inst.source_location or d.b.inst.source_location or None,
        "occurrence": d.occurrence,
        "error": _error(d.verdict),
        "inputs_identical": d.inputs_identical,
        "bound_ratio": d.bound_ratio,
        "beyond_bound": d.beyond_bound,
        "inputs": [{"a": _name(x), "b": _name(y)} for x, y in d.inputs],
        "between": {"a": [_node_ref(n) for n in d.between_a], "b": [_node_ref(n) for n in d.between_b]},
        "inside": None
        if d.inside is None
        else {
            "first_divergence": [_divergence_dict(x) for x in d.inside.first_divergence],
            "first_change": [_divergence_dict(x) for x in d.inside.first_change],
            "compared": d.inside.counts(),
            "matching": d.inside.matching.counts(),
        },
    }


def diff(
    a,
    b,
    inputs_a: list | Callable[[], list],
    inputs_b: list | None = None,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    zoom: bool = True,
    pending_budget: int = PENDING_BUDGET,
    reductions: str = "accumulate",
    device=None,
    reference: str | None = None,
    max_memory: int | None = None,
) -> DiffReport:
    """Run modules `a` and `b` (Modules) on the same inputs (`inputs_b`: B's own, when they differ) with taps on
    their paired values and find the first divergences. `inputs_a` may be a function making the inputs: it is
    called once both modules are prepared and their peaks fit `max_memory` (None: MemAvailable), so a module
    refused draws nothing. `zoom`: fusions paired with fusions run compiled and
    are diffed op by op only where they change first (False: everything op by op). `reductions`: how both
    round their sums, `device`: the device profile both run under (Executable's options). `reference="shadow"`:
    each first divergence and change is also judged by both sides' error bounds (diff_bounds.py)."""
    from .. import ops  # noqa: F401  (fills the op registry; the executor: not at startup)
    from ..exec.executor import Executable

    if inputs_b is None:
        signatures = [[p.shape.to_text(layout=False) for p in m.entry.parameters] for m in (a, b)]
        if signatures[0] != signatures[1]:
            raise ValueError(
                f"A ({a.path or a.name}) and B ({b.path or b.name}) take different parameters, so not the same inputs: "
                f"({', '.join(signatures[0])}) and ({', '.join(signatures[1])})"
            )
    ga, gb = ValueGraph(a), ValueGraph(b)
    m = match(ga, gb)
    plan = _TapPlan(m, zoom)
    executables = []
    for side, module, closed in (("A", a, plan.closed[0]), ("B", b, plan.closed[1])):
        with side_errors(side, module.path or f"module {module.name}"):
            exe = Executable(
                module, use_numba=bool(closed), reductions=reductions, device=device, max_memory=max_memory
            )
            exe.check_memory()
            executables.append(exe)
    exe_a, exe_b = executables
    if callable(inputs_a):
        inputs_a = inputs_a()
    run = _Lockstep(m, plan, atol, rtol, pending_budget)
    run.run(exe_a, exe_b, inputs_a, inputs_b if inputs_b is not None else inputs_a)
    report = _report(m, plan, run)
    if zoom:
        zoomed = [d for d in report.first_change if (d.a.index, d.b.index) in run.operands]
        for d in zoomed[:MAX_ZOOM]:
            d.inside = _zoom(d, run.operands[(d.a.index, d.b.index)], atol, rtol, reductions, device)
    if reference == "shadow":
        from .diff_bounds import judge_by_bounds

        judge_by_bounds(report, (exe_a, exe_b), (inputs_a, inputs_b if inputs_b is not None else inputs_a))
    return report


@contextlib.contextmanager
def side_errors(side: str, source: str):
    """A bad input found in one of diff's modules names its side and file: 'B (after.hlo): ...', or 'B: ' before
    a message starting with the file already (the same exception, so callers catching its type still do)."""
    try:
        yield
    except (HloParseError, UnsupportedError, ExecutionError) as e:
        message = e.args[0] if e.args and isinstance(e.args[0], str) else None
        if message is not None and not message.startswith(("A (", "B (", "A: ", "B: ")):
            said = f"{side}: " if message.startswith(source) else f"{side} ({source}): "  # file:line: said once
            e.args = (said + message, *e.args[1:])
        raise


class _TapPlan:
    """Which values each side observes, and which fusions run closed (compiled, seen as one value)."""

    def __init__(self, m: Matching, zoom: bool):
        graphs = (m.a, m.b)
        deferred = set()
        if zoom:
            for b_index, a_index in m.partner.items():
                a_node, b_node = m.a.nodes[a_index], m.b.nodes[b_index]
                if _paired_containers(m, a_node, b_node):
                    deferred.add((a_index, b_index))
        tapped = [
            (a_index, b_index)
            for b_index, a_index in m.partner.items()
            if value_shape(m.b.nodes[b_index].shape) is not None
        ]
        opened: tuple[set, set] = (set(), set())
        for a_index, b_index in tapped:
            if (a_index, b_index) not in deferred:
                for side, node in enumerate((m.a.nodes[a_index], m.b.nodes[b_index])):
                    opened[side].update(_enclosing(graphs[side], node.tap.computation))
        # a deferred pair whose container opens anyway (on either side) is observed there, on both sides
        changed = True
        while changed:
            changed = False
            for x, y in deferred:
                nodes = (m.a.nodes[x], m.b.nodes[y])
                if any(n.tap.parent.name in opened[side] for side, n in enumerate(nodes)):
                    for side, n in enumerate(nodes):
                        if n.tap.parent.name not in opened[side]:
                            opened[side].update(_enclosing(graphs[side], n.tap.computation))
                            changed = True
        self.pairs = [(x, y) for x, y in tapped if (x, y) not in deferred or m.a.nodes[x].tap.parent.name in opened[0]]
        self.opened = opened
        self.taps: tuple[dict, dict] = ({}, {})
        for x, y in self.pairs:
            for side, index in ((0, x), (1, y)):
                node = graphs[side].nodes[index]
                for inst in node.members:
                    if graphs[side].depth[id(inst.computation)] == 0 or inst.parent.name in opened[side]:
                        self.taps[side][instruction_key(inst)] = index
        self.partners_of_a: dict[int, list[int]] = {}
        for x, y in self.pairs:
            self.partners_of_a.setdefault(x, []).append(y)
        # entry fusions not opened run compiled and are seen as one value; paired ones holding deferred pairs zoom
        self.closed = tuple(
            {
                i.name
                for i in graphs[s].module.entry.instructions
                if i.opcode == "fusion" and i.called_computation("calls").name not in opened[s]
            }
            for s in (0, 1)
        )
        containers = {
            (m.a.node_of[id(m.a.nodes[x].container)].index, m.b.node_of[id(m.b.nodes[y].container)].index)
            for x, y in deferred
        }
        self.zoomable = {
            (x, y)
            for x, y in containers & set(self.pairs)
            if m.a.nodes[x].tap.name in self.closed[0] and m.b.nodes[y].tap.name in self.closed[1]
        }
        self.m = m
        self.tapped = ({x for x, _ in self.pairs}, {y for _, y in self.pairs})
        self._inputs: dict[tuple[int, int], tuple] = {}

    def inputs(self, a_index: int, b_index: int) -> tuple[list[tuple[tuple[int, int], str]], list[Node], list[Node]]:
        """The pairs of the nearest observed values a pair is computed from (on either side), each with the
        run of it that counts (see _MODES), and the nodes between them and the pair in A and in B."""
        key = (a_index, b_index)
        if key not in self._inputs:
            m = self.m
            inputs_a, between_a = self._frontier(m.a.nodes[a_index], 0)
            inputs_b, between_b = self._frontier(m.b.nodes[b_index], 1)
            pairs = [((m.partner[n.index], n.index), mode) for n, mode in inputs_b if n.index in m.partner]
            via_b = {(p[0], mode) for p, mode in pairs}
            pairs += [
                ((n.index, y), mode)
                for n, mode in inputs_a
                if (n.index, mode) not in via_b
                for y in self.partners_of_a.get(n.index, ())
            ]
            self._inputs[key] = (pairs, between_a, between_b)
        return self._inputs[key]

    def _walk_operands(self, node: Node, side: int, mode: str) -> list[tuple[Node, str]]:
        """What a value is computed from: a fusion that runs compiled, from the fusion's operands; a loop's
        state, from the loop's initial value (its first run) and its body's result (the run before); a loop or
        a conditional, from what it was given and what its body or branches computed (any run)."""
        graph = self.m.a if side == 0 else self.m.b
        inst = node.inst
        nodes = lambda insts: [graph.node_of[id(i)] for i in insts if id(i) in graph.node_of]  # noqa: E731
        if node.tap.opcode == "fusion" and node.tap.name in self.closed[side]:
            return [(n, mode) for n in nodes(node.tap.operands)]
        if inst.opcode == "while":
            return [(n, mode) for n in nodes(inst.operands)] + [
                (n, "all") for n in nodes([inst.called_computation("body").root])
            ]
        if inst.opcode == "conditional":
            return [(n, mode) for n in nodes(inst.operands)] + [
                (n, "all") for n in nodes(c.root for c in inst.called_computations)
            ]
        caller = graph.caller.get(id(inst.computation)) if inst.opcode == "parameter" else None
        if caller is not None and caller.opcode == "while":
            return [(n, "init" if mode == "same" else mode) for n in nodes(caller.operands)] + [
                (n, "prev" if mode == "same" else mode) for n in nodes([caller.called_computation("body").root])
            ]
        if caller is not None and caller.opcode == "conditional":
            return [(n, "all") for n in nodes(caller.operands[1:])]
        return [(n, mode) for n in node.operands]

    def _frontier(self, node: Node, side: int) -> tuple[list[tuple[Node, str]], list[Node]]:
        inputs, between, seen = [], {}, {(node.index, "same")}
        stack = list(reversed(self._walk_operands(node, side, "same")))
        while stack and len(seen) < MAX_WALK:
            n, mode = stack.pop()
            if (n.index, mode) in seen:
                continue
            seen.add((n.index, mode))
            if n.index in self.tapped[side]:
                inputs.append((n, mode))
            else:
                between[n.index] = n
                stack += reversed(self._walk_operands(n, side, mode))
        return inputs, sorted(between.values(), key=lambda n: -n.order)  # nearest the pair first


# How an input's runs count for a pair's run k: "same" its run k (or every run, when it ran fewer times);
# "prev" run k - 1 (a loop's state from the body's last result; none for k = 0); "init" every run, for
# k = 0 only (a loop's initial value); "all" every run (what a loop or a branch computed).
_MODES = ("same", "prev", "init", "all")


def _input_holds(verdicts: list | None, mode: str, k: int, test) -> bool:
    """Whether `test(verdict)` holds for the runs of an input that count for run k of a pair."""
    if not verdicts or (mode == "prev" and k == 0) or (mode == "init" and k > 0):
        return True
    j = k - 1 if mode == "prev" else None if mode in ("init", "all") else k
    return test(verdicts[j]) if j is not None and j < len(verdicts) else all(map(test, verdicts))


def _paired_containers(m: Matching, x: Node, y: Node) -> bool:
    """Both values are inside entry fusions, and those fusions are paired."""
    cx, cy = x.container, y.container
    if cx is None or cy is None or cx.opcode != "fusion" or cy.opcode != "fusion":
        return False
    nx, ny = m.a.node_of.get(id(cx)), m.b.node_of.get(id(cy))
    return nx is not None and ny is not None and m.partner.get(ny.index) == nx.index


def _enclosing(graph: ValueGraph, comp) -> set[str]:
    """Names of `comp` and the computations that run it, the entry excluded."""
    out = set()
    while comp is not None and not comp.is_entry and comp.name not in out:
        out.add(comp.name)
        caller = graph.caller.get(id(comp))
        comp = caller.computation if caller is not None else None
    return out


@dataclass
class _Held:
    value: object
    operands: list | None
    waiting_for: int = 1  # partners not arrived yet (an A value may pair with several B values)
    nbytes: int = 0


class _Lockstep:
    """Runs A and B in two threads; pairs their observed values and judges each pair as soon as both arrived."""

    def __init__(self, m: Matching, plan: _TapPlan, atol, rtol, budget: int):
        self.m, self.plan, self.atol, self.rtol, self.budget = m, plan, atol, rtol, budget
        self.cond = threading.Condition()
        self.pending: tuple[dict, dict] = ({}, {})
        self.bytes = [0, 0]
        self.running, self.waiting = [True, True], [False, False]
        self.counts: tuple[dict, dict] = ({}, {})
        self.locked_key: tuple[dict, dict] = ({}, {})  # node -> the member key its observations come from
        self.sequence: dict[int, int] = {}  # A node -> when A first produced it
        self.verdicts: dict[tuple[int, int], list] = {}
        self.operands: dict[tuple[int, int], tuple] = {}  # zoomable pair -> (A operands, B operands)
        self.errors: list = [None, None]
        self.judging: dict[tuple[int, int], int] = {}  # pair -> verdicts of it being made

    def _settled(self, pair: tuple[int, int]) -> bool:
        """No verdict of `pair` is being made."""
        return pair not in self.judging

    def run(self, exe_a, exe_b, inputs_a, inputs_b) -> None:
        sides = [(exe_a, inputs_a), (exe_b, inputs_b)]
        threads = [
            threading.Thread(target=self._side, args=(s, *sides[s]), name=f"hloexec-diff-{'ab'[s]}") for s in (0, 1)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for side, exe, e in zip("AB", (exe_a, exe_b), self.errors):
            if e is not None:
                with side_errors(side, exe.module.path or f"module {exe.module.name}"):
                    raise e

    def _side(self, side: int, exe, inputs) -> None:
        opened = self.plan.opened[side]
        zoomable = {pair[side] for pair in self.plan.zoomable}
        taps, counts, locked = self.plan.taps[side], self.counts[side], self.locked_key[side]

        def observe(inst, value, operands=None):
            key = instruction_key(inst)
            node = taps.get(key)
            if node is None or locked.setdefault(node, key) != key:
                return
            k = counts[node] = counts.get(node, -1) + 1
            self._arrive(side, node, k, value, operands if node in zoomable else None)

        try:
            for p in exe.module.entry.parameters:  # parameters are values, not steps: seen before the run
                observe(p, inputs[p.parameter_number])
            exe.run(
                *inputs,
                observe=observe,
                observe_inside=lambda comp: comp.name in opened,
                observe_operands=bool(zoomable),
            )
        except BaseException as e:  # noqa: BLE001 - re-raised by run() in the caller's thread
            self.errors[side] = e
        finally:
            with self.cond:
                self.running[side] = False
                self.cond.notify_all()

    def _arrive(self, side: int, node: int, k: int, value, operands) -> None:
        ready = []  # (a node, b node, a value, b value, a operands, b operands)
        nbytes = _nbytes(value)
        with self.cond:
            if side == 0:
                self.sequence.setdefault(node, len(self.sequence))
                partners = self.plan.partners_of_a.get(node, ())
                waiting = 0
                for b in partners:
                    held = self.pending[1].pop((b, k), None)
                    if held is None:
                        waiting += 1
                        continue
                    self.bytes[1] -= held.nbytes
                    ready.append((node, b, value, held.value, operands, held.operands))
                if waiting:
                    self.pending[0][(node, k)] = _Held(value, operands, waiting, nbytes)
                    self.bytes[0] += nbytes
            else:
                a = self.m.partner[node]
                held = self.pending[0].get((a, k))
                if held is None:
                    self.pending[1][(node, k)] = _Held(value, operands, 1, nbytes)
                    self.bytes[1] += nbytes
                else:
                    held.waiting_for -= 1
                    if held.waiting_for == 0:
                        del self.pending[0][(a, k)]
                        self.bytes[0] -= held.nbytes
                    ready.append((a, node, held.value, value, held.operands, operands))
            self.cond.notify_all()
        for a, b, va, vb, oa, ob in ready:
            with self.cond:  # the verdicts of its inputs are in (or being made: they arrived first)
                inputs = self.plan.inputs(a, b)[0]
                while not all(self._settled(pair) for pair, _ in inputs):
                    self.cond.wait()
                runs = {
                    pair: [v for _, v in sorted(self.verdicts.get(pair, ()), key=lambda kv: kv[0])]
                    for pair, _ in inputs
                }
                inherited = not all(_input_holds(runs[pair], mode, k, _agree) for pair, mode in inputs)
                identical_inputs = all(_input_holds(runs[pair], mode, k, _identical) for pair, mode in inputs)
                self.judging[(a, b)] = self.judging.get((a, b), 0) + 1
            verdict = _inherited(va, vb) if inherited else judge(va, vb, self.atol, self.rtol)
            with self.cond:
                self.judging[(a, b)] -= 1
                if not self.judging[(a, b)]:
                    del self.judging[(a, b)]
                self.verdicts.setdefault((a, b), []).append((k, verdict))
                if (
                    not verdict.identical
                    and identical_inputs
                    and oa is not None
                    and ob is not None
                    and (a, b) not in self.operands
                ):
                    self.operands[(a, b)] = (oa, ob)  # a first change: its fusions are diffed op by op
                self.cond.notify_all()
        other = 1 - side
        with self.cond:
            while self.bytes[side] > self.budget and self.running[other] and not self.waiting[other]:
                self.waiting[side] = True
                self.cond.wait(timeout=1.0)
            self.waiting[side] = False


def _inherited(a, b) -> Verdict:
    """The verdict of a pair computed from a differing value: bit-identical or not, no tolerance check (it
    cannot be a first divergence, and comparing millions of elements downstream of one costs minutes)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape and a.size == b.size:
        b = b.reshape(a.shape)
    same = a.dtype == b.dtype and a.shape == b.shape and _bitwise_equal(a, b)
    return Verdict(same, same, total=a.size, judged=same)


def _nbytes(value) -> int:
    if isinstance(value, tuple):
        return sum(map(_nbytes, value))
    return getattr(value, "nbytes", 0)


def _report(m: Matching, plan: _TapPlan, run: _Lockstep) -> DiffReport:
    verdicts = {pair: [v for _, v in sorted(vs, key=lambda kv: kv[0])] for pair, vs in run.verdicts.items()}

    def holds(inputs, k: int, test) -> bool:
        return all(_input_holds(verdicts.get(pair), mode, k, test) for pair, mode in inputs)

    def divergence(a_index: int, b_index: int, k: int, inputs, between_a, between_b) -> Divergence:
        x, y = m.a.nodes[a_index], m.b.nodes[b_index]
        shown = [
            n.tap if n.tap.opcode == "fusion" and n.tap.name in plan.closed[side] else n.inst
            for side, n in enumerate((x, y))
        ]
        pairs = list(dict.fromkeys(pair for pair, _ in inputs))
        return Divergence(
            x,
            y,
            k,
            verdicts[(a_index, b_index)][k],
            [(m.a.nodes[p], m.b.nodes[q]) for p, q in pairs],
            holds(inputs, k, _identical),
            between_a[:MAX_BETWEEN],
            between_b[:MAX_BETWEEN],
            shown[0],
            shown[1],
            m.how.get(b_index, ""),
        )

    first, changes = [], []
    order = sorted(verdicts, key=lambda p: (run.sequence.get(p[0], 1 << 60), m.b.nodes[p[1]].order))
    for a_index, b_index in order:
        vs = verdicts[(a_index, b_index)]
        inputs, between_a, between_b = plan.inputs(a_index, b_index)
        k = next((k for k, v in enumerate(vs) if not v.agree and holds(inputs, k, _agree)), None)
        if k is not None:
            first.append(divergence(a_index, b_index, k, inputs, between_a, between_b))
        k = next((k for k, v in enumerate(vs) if not v.identical and holds(inputs, k, _identical)), None)
        if k is not None:
            changes.append(
                first[-1]
                if first and (first[-1].a.index, first[-1].b.index, first[-1].occurrence) == (a_index, b_index, k)
                else divergence(a_index, b_index, k, inputs, between_a, between_b)
            )
    outputs = []
    for x, y in zip(_outputs(m.a), _outputs(m.b)):
        judged = verdicts.get((x.index, y.index))
        outputs.append((x, y, None if not judged else next((v for v in judged if not v.agree), judged[-1])))
    not_observed = sum(1 for pair in plan.pairs if pair not in verdicts)
    return DiffReport(
        m, verdicts, first, outputs, not_observed, (len(plan.opened[0]), len(plan.opened[1])), first_change=changes
    )


def _agree(v: Verdict) -> bool:
    return v.agree


def _identical(v: Verdict) -> bool:
    return v.identical


def _zoom(d: Divergence, captured: tuple, atol, rtol, reductions: str, device) -> DiffReport | None:
    """The fused computations of a diverging pair of fusions, extracted and diffed op by op on the operand
    values each side's run gave them."""
    modules, inputs = [], []
    for node, operands in zip((d.a, d.b), captured):
        sub = submodule([node.tap], cone_cut(node.tap, 0))
        module = parse(sub.text)[0]
        source = node.tap.parent.module
        original = {i.name: i.line for i in source.instructions()} if source is not None else {}
        for inst in module.instructions():  # the report points at the original file's lines
            inst.line = original.get(inst.name, inst.line)
        modules.append(module)
        position = {id(o): k for k, o in reversed(list(enumerate(node.tap.operands)))}
        inputs.append([operands[position[id(p)]] for p in sub.parameters])
    return diff(
        modules[0],
        modules[1],
        inputs[0],
        inputs[1],
        atol=atol,
        rtol=rtol,
        zoom=False,
        reductions=reductions,
        device=device,
    )
