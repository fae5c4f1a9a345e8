"""Which instruction of one version of a program computes the value of which instruction of another.

Two versions of one program (before and after optimization, two passes, a CPU and a GPU dump, a module and an
edited copy) compute mostly the same values in different places: XLA fuses instructions into fused
computations (copying a producer into several fusions), renames them, rewrites some, adds new ones.

A `ValueGraph` sees through the places: a value is one node however many instructions hold it -- a fused
computation's parameter is the fusion's operand, a fusion (or a call) is the root of the computation it runs,
a get-tuple-element of a tuple is that tuple's operand. Each node has the instruction that computes it
(`inst`: what matching compares) and the outermost instruction holding it (`tap`: where a run observes it).

`match(a, b)` pairs the nodes of two graphs, in the issue's order: entry parameters by number and outputs by
position; then by name where names survive (same name, opcode and shape, or a shape whose float type
changed: float-normalization computes a bf16 add in f32 under the same name); then by `op_name` metadata +
source line + opcode + shape (float type likewise); then by structure (same opcode, shape and attributes over matched operands), repeated
until nothing changes. Several nodes of B may pair with one node of A (the copies XLA makes when it duplicates a
producer into several fusions); each node of B pairs with at most one node of A.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..ir.module import Computation, Instruction, Module

# Computations whose instructions compute values of the program, once per run of their caller (reducers,
# comparators and scatter combiners compute scalars the kernels never expose).
_VALUE_CALLEES = {
    "fusion": ("calls",),
    "call": ("to_apply",),
    "while": ("condition", "body"),
    "conditional": ("branch_computations", "true_computation", "false_computation"),
    "async-start": ("calls",),
}
# Attributes that do not change what an instruction computes.
_IGNORED_ATTRS = frozenset(
    {
        "metadata",
        "sharding",
        "backend_config",
        "frontend_attributes",
        "control-predecessors",
        "statistics",
        "origin",
        "schedule_name",
        "operand_precision",
        "result_accuracy",
    }
)


def instruction_key(inst: Instruction) -> tuple[str, str]:
    """(computation name, instruction name): how an observed instruction is recognised (plans run copies of
    the module's instructions, which keep both names)."""
    return (inst.computation.name if inst.computation is not None else "", inst.name)


def value_shape(shape) -> tuple | None:
    """(element type, dims without the 1s) of an array shape, None for tuples and tokens: two values compare
    when these are equal (a reshape that only adds or drops 1s does not change the values)."""
    if shape.is_tuple or shape.element_type.numpy is None:
        return None
    return shape.element_type.name, tuple(d for d in shape.dims if d != 1)


def float_retyped(a, b) -> bool:
    """Whether two array shapes are one value's with its float type changed (bf16 -> f32): same dims but 1s."""
    va, vb = value_shape(a), value_shape(b)
    return (
        va is not None
        and vb is not None
        and va != vb
        and va[1] == vb[1]
        and a.element_type.is_float
        and b.element_type.is_float
    )


@dataclass(eq=False)
class Node:
    """One value of a module."""

    index: int
    inst: Instruction  # the instruction that computes it
    tap: Instruction  # the outermost instruction holding it: where a run observes it
    members: list[Instruction]  # every instruction holding it
    depth: int  # of tap's computation below the entry (0: the entry)
    container: Instruction | None  # the entry instruction that runs the computation tap is in (None: depth 0)
    operands: list[Node] = field(default_factory=list)
    order: int = 0  # position in a topological order of the graph

    @property
    def shape(self):
        return self.inst.shape

    def __repr__(self):
        return f"<node %{self.inst.name} ({self.inst.opcode})>"


class ValueGraph:
    """The values of `module`: nodes over the entry computation and the fused, called, loop and branch
    computations it runs (see the module docstring)."""

    def __init__(self, module: Module):
        self.module = module
        comps = _value_computations(module)
        self.depth = {id(c): d for c, (d, _) in comps.items()}
        self.caller = {id(c): caller for c, (_, caller) in comps.items()}
        insts = [i for c in comps for i in c.instructions]
        index = {id(i): k for k, i in enumerate(insts)}
        parent = list(range(len(insts)))

        def find(k: int) -> int:
            while parent[k] != k:
                parent[k] = parent[parent[k]]
                k = parent[k]
            return k

        def union(x: Instruction, y: Instruction) -> None:
            kx, ky = index.get(id(x)), index.get(id(y))
            if kx is not None and ky is not None:
                parent[find(kx)] = find(ky)

        callers: dict[int, int] = {}
        for inst in insts:
            for c in inst.called_computations:
                callers[id(c)] = callers.get(id(c), 0) + 1
        for inst in insts:
            key = {"fusion": "calls", "call": "to_apply"}.get(inst.opcode)
            comp = inst.called.get(key) if key else None
            if isinstance(comp, Computation) and callers[id(comp)] == 1:
                union(inst, comp.root)
                for p in comp.parameters:
                    if p.parameter_number < len(inst.operands):
                        union(p, inst.operands[p.parameter_number])
        changed = True  # get-tuple-element of a tuple is that tuple's operand (through aliases too)
        while changed:
            changed = False
            defining = self._defining(insts, find)
            for inst in insts:
                if inst.opcode == "get-tuple-element" and inst.operands:
                    source = defining[find(index[id(inst.operands[0])])]
                    i = inst.attr("index")
                    if (
                        source.opcode == "tuple"
                        and i < len(source.operands)
                        and find(index[id(inst)]) != find(index[id(source.operands[i])])
                    ):
                        union(inst, source.operands[i])
                        changed = True
        defining = self._defining(insts, find)
        groups: dict[int, list[Instruction]] = {}
        for inst in insts:
            groups.setdefault(find(index[id(inst)]), []).append(inst)
        self.nodes: list[Node] = []
        self.node_of: dict[int, Node] = {}  # id(instruction) -> node
        for root, members in groups.items():
            tap = min(members, key=lambda m: (self.depth[id(m.computation)], index[id(m)]))
            node = Node(
                len(self.nodes), defining[root], tap, members, self.depth[id(tap.computation)], self._container(tap)
            )
            self.nodes.append(node)
            for m in members:
                self.node_of[id(m)] = node
        for node in self.nodes:
            node.operands = [self.node_of[id(o)] for o in node.inst.operands if id(o) in self.node_of]
        for k, node in enumerate(self._topological()):
            node.order = k
        self.by_key = {instruction_key(m): node for node in self.nodes for m in node.members}

    def _defining(self, insts, find) -> dict[int, Instruction]:
        """Per alias class, the instruction that computes the value: not a fused or called computation's
        parameter, a fusion, a call or a get-tuple-element resolved through a tuple; else the outermost."""
        best: dict[int, tuple] = {}
        for k, inst in enumerate(insts):
            alias = inst.opcode in ("fusion", "call", "get-tuple-element") or (
                inst.opcode == "parameter"
                and not inst.computation.is_entry
                and (caller := self.caller.get(id(inst.computation))) is not None
                and caller.opcode in ("fusion", "call")
            )
            rank = (alias, self.depth[id(inst.computation)], k)
            root = find(k)
            if root not in best or rank < best[root][0]:
                best[root] = (rank, inst)
        return {root: inst for root, (_, inst) in best.items()}

    def _container(self, inst: Instruction) -> Instruction | None:
        comp = inst.computation
        container = None
        while comp is not None and not comp.is_entry:
            container = self.caller.get(id(comp))
            comp = container.computation if container is not None else None
        return container

    def _topological(self) -> list[Node]:
        order: list[Node] = []
        state: dict[int, int] = {}  # node index -> 1 once visited
        for start in sorted(self.nodes, key=lambda n: (n.depth, n.index)):
            stack = [(start, False)]
            while stack:
                node, done = stack.pop()
                if done:
                    order.append(node)
                    continue
                if state.get(node.index):
                    continue
                state[node.index] = 1
                stack.append((node, True))
                stack += [(o, False) for o in reversed(node.operands) if not state.get(o.index)]
        return order

    def node(self, name: str) -> Node:
        """The node of the instruction named `name` (module-wide; 'computation/name' when several share it)."""
        comp_name, _, inst_name = name.lstrip("%").rpartition("/")
        found = [
            n
            for n in self.nodes
            for m in n.members
            if m.name == inst_name and (not comp_name or m.parent.name == comp_name)
        ]
        if not found:
            raise KeyError(f"no instruction named {name!r} in {self.module.name}")
        return found[0]


def _value_computations(module: Module) -> dict[Computation, tuple[int, Instruction | None]]:
    """Computation -> (depth below the entry, the instruction that first runs it), in discovery order."""
    found: dict[Computation, tuple[int, Instruction | None]] = {module.entry: (0, None)}
    queue = [module.entry]
    while queue:
        comp = queue.pop(0)
        depth = found[comp][0]
        for inst in comp.instructions:
            for key in _VALUE_CALLEES.get(inst.opcode, ()):
                called = inst.called.get(key)
                for c in called if isinstance(called, list) else [called] if called is not None else []:
                    if c not in found:
                        found[c] = (depth + 1, inst)
                        queue.append(c)
    return found


@dataclass
class Matching:
    """Pairs of nodes of `a` and `b`: `partner[b node index] = a node index`."""

    a: ValueGraph
    b: ValueGraph
    partner: dict[int, int] = field(default_factory=dict)
    how: dict[int, str] = field(default_factory=dict)  # b node index -> anchor | name | metadata | structure

    def partners(self, a_node: Node) -> list[Node]:
        return [self.b.nodes[b] for b in self._partners_of_a.get(a_node.index, ())]

    @property
    def _partners_of_a(self) -> dict[int, list[int]]:
        cache = self.__dict__.get("_cache")
        if cache is None or cache[0] != len(self.partner):
            by_a: dict[int, list[int]] = {}
            for b, a in sorted(self.partner.items()):
                by_a.setdefault(a, []).append(b)
            cache = self.__dict__["_cache"] = (len(self.partner), by_a)
        return cache[1]

    def pairs(self) -> list[tuple[Node, Node]]:
        """(a node, b node) for every pair, in the order of the first module (then of the second)."""
        return sorted(
            ((self.a.nodes[a], self.b.nodes[b]) for b, a in self.partner.items()),
            key=lambda p: (p[0].order, p[1].order),
        )

    def is_matched(self, node: Node, side: str) -> bool:
        return node.index in (self.partner if side == "b" else self._partners_of_a)

    def unmatched(self, side: str) -> list[Node]:
        """Nodes of one side without a partner, computing ones only (no tuples, parameters, constants)."""
        graph = self.b if side == "b" else self.a
        return [n for n in sorted(graph.nodes, key=lambda n: n.order) if not self.is_matched(n, side) and _computes(n)]

    def counts(self) -> dict:
        return {
            "pairs": len(self.partner),
            "a_nodes": sum(map(_computes, self.a.nodes)),
            "b_nodes": sum(map(_computes, self.b.nodes)),
            "a_unmatched": len(self.unmatched("a")),
            "b_unmatched": len(self.unmatched("b")),
            "by": {
                how: sum(1 for h in self.how.values() if h == how)
                for how in ("anchor", "name", "metadata", "structure")
            },
        }


def _computes(node: Node) -> bool:
    return (
        node.inst.opcode not in ("tuple", "parameter", "constant", "get-tuple-element", "after-all")
        and value_shape(node.shape) is not None
    )


def match(a: Module | ValueGraph, b: Module | ValueGraph) -> Matching:
    """Pair the values of `a` and `b` (see the module docstring)."""
    ga = a if isinstance(a, ValueGraph) else ValueGraph(a)
    gb = b if isinstance(b, ValueGraph) else ValueGraph(b)
    m = Matching(ga, gb)

    def pair(a_node: Node, b_node: Node, how: str) -> bool:
        same = value_shape(a_node.shape) == value_shape(b_node.shape) or (
            how in ("name", "metadata") and float_retyped(a_node.shape, b_node.shape)
        )
        if b_node.index in m.partner or not same or (a_node.shape.is_tuple != b_node.shape.is_tuple):
            return False
        m.partner[b_node.index] = a_node.index
        m.how[b_node.index] = how
        return True

    # anchors: entry parameters by number, outputs by position, loop parameters of matched loops
    a_params = {p.parameter_number: ga.node_of[id(p)] for p in ga.module.entry.parameters}
    for p in gb.module.entry.parameters:
        if p.parameter_number in a_params:
            pair(a_params[p.parameter_number], gb.node_of[id(p)], "anchor")
    for x, y in zip(_outputs(ga), _outputs(gb)):
        pair(x, y, "anchor")

    # by name: an instruction of the same name, opcode and shape
    a_named: dict[tuple, list[Node]] = {}
    for node in ga.nodes:
        for inst in node.members:
            if inst.opcode != "parameter":
                a_named.setdefault((inst.name, inst.opcode), []).append(node)
    for node in gb.nodes:
        for inst in node.members:
            found = {id(n): n for n in a_named.get((inst.name, inst.opcode), ())}
            if len(found) == 1 and pair(next(iter(found.values())), node, "name"):
                break

    changed = True
    while changed:
        changed = _match_loop_parameters(m, pair)
        changed |= _match_by_metadata(m, pair)
        changed |= _match_by_structure(m, pair)
    for b_index in [b for b, how in m.how.items() if how in ("name", "metadata")]:
        if not _consistent(m, m.a.nodes[m.partner[b_index]], m.b.nodes[b_index]):
            del m.partner[b_index], m.how[b_index]
    return m


def _consistent(m: Matching, a_node: Node, b_node: Node) -> bool:
    """Whether the values `b_node` is computed from (its nearest matched ancestors) pair with values `a_node`
    is computed from: a name or an op_name says where an instruction came from, not that it still computes
    the same thing (a rewrite may keep both)."""
    wanted = {m.partner[n.index] for n in _nearest(b_node, lambda n: n.index in m.partner)}
    queue, seen = deque(a_node.operands), set[int]()  # nearest first: they are usually the operands
    while queue and wanted and len(seen) < _MAX_WALK:
        n = queue.popleft()
        if n.index in seen:
            continue
        seen.add(n.index)
        wanted.discard(n.index)
        queue += n.operands
    return not wanted or len(seen) >= _MAX_WALK


def _nearest(node: Node, matched) -> list[Node]:
    """The nodes `node` is computed from that are `matched`, nearest first, walking through the others."""
    found: list[Node] = []
    stack, seen = list(node.operands), set[int]()
    while stack and len(seen) < _MAX_WALK:
        n = stack.pop()
        if n.index in seen:
            continue
        seen.add(n.index)
        if matched(n):
            found.append(n)
        else:
            stack += n.operands
    return found


_MAX_WALK = 10000  # nodes a consistency check visits (beyond: assumed consistent)


def _outputs(graph: ValueGraph) -> list[Node]:
    """The entry's output values, tuples flattened."""

    def leaves(node: Node) -> list[Node]:
        if node.inst.opcode == "tuple":
            return [leaf for o in node.operands for leaf in leaves(o)]
        return [node]

    return leaves(graph.node_of[id(graph.module.entry.root)])


def _match_loop_parameters(m: Matching, pair) -> bool:
    """The parameters of the condition and body of matched while loops, and of the branches of matched
    conditionals, with equal numbers (they are their loop's or branch's state, not aliases)."""
    changed = False
    for b_index, a_index in list(m.partner.items()):
        a_inst, b_inst = m.a.nodes[a_index].inst, m.b.nodes[b_index].inst
        if a_inst.opcode != b_inst.opcode or a_inst.opcode not in ("while", "conditional"):
            continue
        for x, y in zip(a_inst.called_computations, b_inst.called_computations):
            for p, q in zip(x.parameters, y.parameters):
                changed |= pair(m.a.node_of[id(p)], m.b.node_of[id(q)], "anchor")
    return changed


def _match_by_metadata(m: Matching, pair) -> bool:
    """Unmatched nodes with the same op_name, source line, opcode and shape, where A has one such node and it
    is computed from the partners of the values the node is computed from (see _consistent). Where A has
    several (one line of a model makes many instructions), structure decides."""
    index: dict[tuple, list[Node]] = {}
    for node in m.a.nodes:
        key = _metadata_key(node)
        if key is not None:
            index.setdefault(key, []).append(node)
    proposed: dict[int, list[Node]] = {}
    for node in sorted(m.b.nodes, key=lambda n: n.order):
        how = m.how.get(node.index)
        if how not in (None, "metadata"):
            continue
        key = _metadata_key(node)
        candidates = index.get(key, []) if key is not None else []
        if len(candidates) == 1 and (how == "metadata" or _consistent(m, candidates[0], node)):
            proposed.setdefault(candidates[0].index, []).append(node)
    changed = False
    for a_index, nodes in proposed.items():
        # several B nodes for one A node: copies of it compute from the same values; keep the largest such
        # group (a rewrite that kept the op_name computes from others), none when two are as large
        groups: dict[tuple, list[Node]] = {}
        for node in nodes:
            groups.setdefault(
                tuple(
                    sorted(
                        map(
                            repr,
                            (m.partner.get(o.index, ("?", o.inst.opcode, value_shape(o.shape))) for o in node.operands),
                        )
                    )
                ),
                [],
            ).append(node)
        sizes = sorted((len(g) for g in groups.values()), reverse=True)
        keep = max(groups.values(), key=len) if len(sizes) == 1 or sizes[0] > sizes[1] else []
        for node in nodes:
            if node in keep:
                changed |= pair(m.a.nodes[a_index], node, "metadata")
            elif m.how.get(node.index) == "metadata":  # proposed alone before its rivals were known
                del m.partner[node.index], m.how[node.index]
    return changed


def _metadata_key(node: Node) -> tuple | None:
    md = node.inst.metadata
    op_name = md.get("op_name") if isinstance(md, dict) else None
    if not op_name or node.inst.opcode == "parameter":
        return None
    shape = value_shape(node.shape)
    return op_name, node.inst.source_location, node.inst.opcode, shape and shape[1]  # dims: retyped pairs too


def _match_by_structure(m: Matching, pair) -> bool:
    """Unmatched nodes computing the same thing (opcode, shape, attributes, literal) from matched operands."""
    index: dict[tuple, Node] = {}
    for node in sorted(m.a.nodes, key=lambda n: n.order):
        if node.inst.opcode != "parameter":
            index.setdefault(_structure_key(node, [o.index for o in node.operands]), node)
    changed = False
    for node in sorted(m.b.nodes, key=lambda n: n.order):
        if (
            node.index in m.partner
            or node.inst.opcode == "parameter"
            or any(o.index not in m.partner for o in node.operands)
        ):
            continue
        found = index.get(_structure_key(node, [m.partner[o.index] for o in node.operands]))
        if found is not None:
            changed |= pair(found, node, "structure")
    return changed


def _structure_key(node: Node, operands: list[int]) -> tuple:
    inst = node.inst
    attrs = tuple(
        sorted(
            (k, _computation_fingerprint(inst.called[k]) if k in inst.called else v)
            for k, v in inst.attrs.items()
            if k not in _IGNORED_ATTRS
        )
    )
    literal = inst.args if inst.opcode in ("constant", "iota") else ""
    return inst.opcode, inst.shape.to_text(layout=False), attrs, literal, tuple(operands)


def _computation_fingerprint(called) -> tuple:
    """What a called computation (a reducer, comparator, ...) does: its instructions' opcodes and shapes."""
    comps = called if isinstance(called, list) else [called]
    return tuple(tuple((i.opcode, i.shape.to_text(layout=False)) for i in c.instructions) for c in comps)
