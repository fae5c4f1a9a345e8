"""Fusion of unfused computations (pre-optimization HLO) into compiled loop nests.

XLA fuses elementwise chains before it runs them; a pre-optimization module has none, so op by op every
instruction is a numpy call that writes a full-size temporary. This pass groups producers into their
consumers -- XLA's producer/consumer instruction fusion, kept simple -- and each group becomes one
synthetic fused computation that `hloexec.kernels.fusion` compiles into one loop nest.

Rules:
* fusible: elementwise ops, data movement the loop generator rewrites into index arithmetic, iota,
  constants, reduce over the minor dim or, from STREAMED_BYTES on, over the major dims of a wide enough row
  (the generator's column loop: a bias gradient) and reduce-window (reductions only as a group's root: a
  reduce feeding a broadcast would be recomputed). A reduce-window's producers join it only when its windows
  do not overlap (else they would be recomputed per window).
* a producer joins its consumers' group only when all its (live) users are in that one group, so a group
  needs no value of a non-member that depends on a member (groups stay convex) and nothing is computed twice;
  or when its other users come after the group's root in the schedule and it has the root's dims: then it
  is one more output of the group (multi-output fusion: Adam's new m and v, read by the parameter update
  and returned, are written by the same kernel as the update, which reads m, v and the gradient once);
* then a group absorbs an earlier group whose output it reads when no other reader of that group's outputs
  comes before its root (_merge_into_consumers: Adam's moment updates, read by the parameter update and by
  the selects of a finiteness check, and those selects become one kernel);
* cheap producers (constants, iota, broadcasts of those or of scalars, converts and other cheap unary
  ops) are copied into every group that uses them instead of materialising a large value; so is a value of
  cheap elementwise ops and data movement (from STREAMED_BYTES on) read by several groups when redoing it
  reads no more bytes than its stored value (XLA's producer duplication: LayerNorm backward's `x - mean`
  and `dy * gamma`, each read by two to four groups, are redone from the f16 inputs instead of written and
  re-read in f32), and whatever only such copies read;
* sibling reductions (reduces of the same dimensions over arrays of the same dims from STREAMED_BYTES on,
  neither reading the other) that read a common input of their operand's size become one kernel with both
  outputs: the rows (columns) are read from memory once (LayerNorm backward's sums over dy, its gamma and
  beta gradients);
* a group is kept only when it pays: at least two ops that do work op by op (an expanding broadcast
  counts, and so do the elementwise producers it redoes), or one f16/bf16 arithmetic op (op by op it
  converts through f32), or a reduce-window (op by op numpy reduces a strided window view), and enough
  bytes (see ExecContext.fused_kernel, which may still decline it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import opcodes
from ..ir.module import Computation, Instruction
from ..ir.shape import tuple_shape
from ..kernels import elementwise as ew
from ..kernels.fusion import column_reduction_applies
from ..ops.registry import check_form

# Members that do no work op by op worth saving (a broadcast does: numpy materialises it in full).
_NO_COMPUTE = frozenset({"parameter", "constant", "reshape", "bitcast", "copy"})
MAX_GROUP = 128  # instructions per group: bounds compile time and the generator's recursion depth
MAX_OUTPUTS = 8  # outputs per group
_REDUCTIONS = ("reduce", "reduce-window")
MAX_RECOMPUTED = 24  # instructions (and sources) of a value redone in every group that reads it
# Values from this size on are streamed from memory by every pass over them: redoing one in each group that
# reads it, a column reduction's kernel and one pass for sibling reductions save that traffic. Smaller ones
# (the GPT d256 step's [512,256] activations) stay in cache, where another pass costs little and another
# kernel its compile (+21% on that step's compiling run without this bound).
STREAMED_BYTES = 8 << 20


@dataclass
class FusedGroup:
    """Instructions that run as one compiled kernel; `outputs` are the members whose values leave it."""

    root: Instruction  # the last member; the kernel runs where it is scheduled
    members: list[Instruction]  # schedule order, root last; copied cheap producers included
    inputs: list[Instruction]  # values from outside, in the fused computation's parameter order
    computation: Computation
    outputs: list[Instruction]  # [root], or the extra outputs in schedule order then the root
    kernel: object = None


def _fusible(inst: Instruction) -> bool:
    op = inst.opcode
    if (
        inst.shape.is_tuple
        or op not in ew.ELEMENTWISE_OPS
        and op not in opcodes.MOVEMENT
        and op not in ("reduce", "reduce-window", "iota", "constant")
    ):
        return False
    if "control-predecessors" in inst.attrs or not ew.supported_type(inst.shape.element_type.name):
        return False
    check_form(inst, op)  # malformed: refused here, before a kernel is made for its shapes
    if op == "reduce" and not all(0 <= d < inst.operands[0].shape.rank for d in inst.attr("dimensions", ())):
        return False
    if (
        op == "reduce"
        and inst.operands[0].shape.rank - 1 not in inst.attr("dimensions", ())
        and not (column_reduction_applies(inst) and inst.operands[0].shape.nbytes >= STREAMED_BYTES)
    ):
        # keeps the minor dim, not in the generator's column loop: the loop nest would read each column
        # with a row-sized stride (measured 7x slower than numpy, which adds whole rows)
        return False
    return all(not o.shape.is_tuple and ew.supported_type(o.shape.element_type.name) for o in inst.operands)


# Unary ops worth redoing in every group that reads them rather than storing their value: Adam's
# convert(f16 grad -> f32) feeds the m and the v update; stored, it is a 4-byte write and two 4-byte reads
# an element, where each group redoing it reads 2 bytes.
_CHEAP_UNARY = frozenset({"convert", "bitcast-convert", "negate", "abs", "not"})


def _cheap(inst: Instruction) -> bool:
    """Recomputed in every group that uses it rather than stored: no loads, one load per row at most, or
    a cheap unary op on one load."""
    op = inst.opcode
    if op in _CHEAP_UNARY:
        return True
    if op == "constant":
        return inst.shape.rank == 0
    if op == "iota":
        return True
    if op == "broadcast":
        src = inst.operands[0]
        return src.shape.rank == 0 or (src.opcode in ("constant", "iota") and _cheap(src))
    return False


# Ops redone in every group that reads a value made of them, when that reads fewer bytes than the value
# (no division or libm call: each group would pay for it again).
_RECOMPUTABLE = _CHEAP_UNARY | {
    "add",
    "subtract",
    "multiply",
    "maximum",
    "minimum",
    "compare",
    "select",
    "and",
    "or",
    "xor",
    "broadcast",
    "reshape",
    "bitcast",
    "copy",
    "constant",
    "iota",
}


def _recompute_pays(inst: Instruction) -> bool:
    """Whether `inst`, redone from the sources of its expression through recomputable ops (at most
    MAX_RECOMPUTED of them), reads no more bytes than its stored value: sources smaller than it (broadcast:
    row statistics, a gamma) are read once per row or stay in cache, the others are read in full. A value
    computed from one array of its type (or narrower) and row statistics does; `m * b1 + convert(g16)` (Adam's
    new moment, 6 bytes read per 4-byte element) does not: its readers share it (_merge_into_consumers)."""
    seen: set[int] = set()
    read = 0
    stack = [inst]
    while stack:
        i = stack.pop()
        if id(i) in seen:
            continue
        seen.add(id(i))
        if i.opcode in _RECOMPUTABLE and _fusible(i):
            stack += i.operands
        elif i.shape.size >= inst.shape.size:
            read += i.shape.nbytes
        if len(seen) > MAX_RECOMPUTED:
            return False
    return read <= inst.shape.nbytes


def _copied_in(inst: Instruction, users: list[Instruction], root: Instruction, copied: set[int]) -> bool:
    """Left out of the groups and copied into each one that reads it: a producer all of whose users may join
    groups, and which is cheap (a cheap unary op only when it has several users: with one, it simply joins
    that one's group), or worth redoing in each of several groups (_recompute_pays), or read only by copies."""
    if inst is root or not all(_fusible(u) for u in users):
        return False
    if users and all(id(u) in copied for u in users):
        return _cheap(inst) or inst.opcode in _RECOMPUTABLE and _recompute_pays(inst)
    if _cheap(inst):
        return len(users) > 1 if inst.opcode in _CHEAP_UNARY else True
    return (
        inst.opcode in _RECOMPUTABLE
        and len(users) > 1
        and inst.shape.nbytes >= STREAMED_BYTES
        and _recompute_pays(inst)
    )


def find_groups(order: list[Instruction], root: Instruction, kernel_for) -> list[FusedGroup]:
    """Fusion groups over `order` (a computation's live instructions, scheduled), consumers first.

    `kernel_for(computation)` returns the compiled kernel for a group's fused computation, or None when it
    does not pay or cannot be compiled -- the group's instructions then run op by op.
    """
    live = {id(i) for i in order}
    position = {id(i): k for k, i in enumerate(order)}
    users = {id(i): [u for u in i.users if id(u) in live] for i in order}
    group_of: dict[int, int] = {}
    members: list[list[Instruction]] = []
    extra: list[list[Instruction]] = []  # per group: members read outside it besides the root
    copied: set[int] = set()  # redone in every group that reads them
    for inst in reversed(order):
        if not _fusible(inst):
            continue
        if _copied_in(inst, users[id(inst)], root, copied):
            copied.add(id(inst))
            continue
        gids = {group_of.get(id(u)) for u in users[id(inst)]}
        joinable = inst is not root and inst.opcode not in _REDUCTIONS
        inside = gids - {None}
        gid = next(iter(inside)) if len(inside) == 1 else None
        if gid is not None and not _reads_once(members[gid][0]):
            gid = None
        if joinable and gid is not None and len(members[gid]) < MAX_GROUP:
            if None in gids:  # read outside too: one more output, if every such read comes later
                head = members[gid][0]
                later = all(position[id(u)] > position[id(head)] for u in users[id(inst)] if id(u) not in group_of)
                if (
                    not later
                    or inst.shape.dims != head.shape.dims
                    or head.opcode in _REDUCTIONS
                    or len(extra[gid]) + 1 >= MAX_OUTPUTS
                ):
                    gid = None
                else:
                    extra[gid].append(inst)
        else:
            gid = None
        if gid is None:
            gid = len(members)
            members.append([])
            extra.append([])
        group_of[id(inst)] = gid
        members[gid].append(inst)

    merged = _merge_into_consumers(members, group_of, position, users, copied)
    groups = []
    for insts in merged:  # each runs at its first member's step
        insts = sorted(insts[1:], key=lambda i: position[id(i)]) + insts[:1]
        gid = group_of[id(insts[-1])]
        outs = [i for i in insts[:-1] if any(group_of.get(id(u)) != gid for u in users[id(i)])]
        group = _make_group(insts, outs, copied)
        if group is not None:
            group.kernel = kernel_for(group.computation)
            if group.kernel is not None:
                groups.append(group)
    return groups


def _reads_once(root: Instruction) -> bool:
    """Whether a group rooted at `root` reads each element of its producers at most once: not a reduce-window
    whose windows overlap."""
    if root.opcode != "reduce-window":
        return True
    return all(w.size == 1 or (w.window_dilation == 1 and w.size <= w.stride) for w in root.attr("window") or ())


def _group_reads(insts: list[Instruction], copied: set[int]) -> list[Instruction]:
    """The values a group of `insts` reads from outside (as _make_group makes them parameters: through the
    producers it copies in)."""
    inside = {id(i) for i in insts}
    seen: set[int] = set()
    reads = []

    def visit(inst):
        if id(inst) in inside or id(inst) in seen:
            return
        seen.add(id(inst))
        if id(inst) in copied:
            for o in inst.operands:
                visit(o)
        else:
            reads.append(inst)

    for i in insts:
        for o in i.operands:
            visit(o)
    return reads


def _merge_into_consumers(
    members: list[list[Instruction]],
    group_of: dict[int, int],
    position: dict[int, int],
    users: dict[int, list[Instruction]],
    copied: set[int],
) -> list[list[Instruction]]:
    """Multi-output fusion across groups: a group absorbs an earlier group whose value it reads, so that one
    kernel, run at the later root, writes both groups' outputs and the value read is not re-read (when it
    has no other reader, not even stored). Pre-optimization Adam with a finiteness check reads each new
    moment in the parameter update and in a `select` keeping it or the old one: without this, the moment
    updates, the parameter update and the selects are five passes (the selects op by op), with it one.
    A group rooted at a reduce of a streamed operand (STREAMED_BYTES) absorbs instead an earlier sibling
    (_siblings) that reads a value of its operand's size it reads too: one loop over the rows (columns)
    computes both, each row read from memory once.

    Group B (in schedule order of roots) absorbs group A when every reader of A's outputs outside A and B is
    scheduled after B's root (A's outputs are now written at B's step; a reader's own position is the
    earliest its step can be, whether its group compiles or not), or, for a sibling A, when everything B
    reads is scheduled before A's root (B's outputs are then written at A's step: LayerNorm backward's sum
    over dy runs with the earlier sum over dy * (x - mean), whose value later row statistics read); the only
    reductions are B's root and sibling roots in A (one loop nest: outputs of the root's dims), and the
    bounds hold. Returns the groups' members, each group's step (where its kernel runs) first."""
    order = sorted(range(len(members)), key=lambda g: position[id(members[g][0])])
    absorbed: set[int] = set()
    for b in order:
        first = members[b][0]
        if first.opcode == "reduce-window" or (
            first.opcode == "reduce" and first.operands[0].shape.nbytes < STREAMED_BYTES
        ):
            continue
        merged = True
        while merged:
            merged = False
            root = members[b][0]
            reads = _group_reads(members[b], copied)
            if root.opcode == "reduce":
                size = root.operands[0].shape.size
                shared = {id(x) for x in reads if x.shape.size >= size}
                candidates = {
                    a
                    for a in order[: order.index(b)]
                    if a not in absorbed
                    and _siblings(members[a][0], root)
                    and not any(group_of.get(id(x)) == a for x in reads)
                    and any(id(x) in shared for x in _group_reads(members[a], copied))
                }
            else:
                candidates = {group_of[id(x)] for x in reads if id(x) in group_of}
            for a in sorted(candidates, key=lambda g: position[id(members[g][0])]):
                step = _absorbs(members[b], members[a], group_of, position, users, copied)
                if step is not None:
                    for i in members[a]:
                        group_of[id(i)] = b
                    members[b] = members[b] + members[a] if step is root else members[a] + members[b]
                    absorbed.add(a)
                    merged = True
                    break
    return [m for g, m in enumerate(members) if g not in absorbed]


def _siblings(r: Instruction, s: Instruction) -> bool:
    """Reduces one loop nest computes together: the same reduced dimensions of operands of the same dims."""
    return (
        r.opcode == s.opcode == "reduce"
        and r.operands[0].shape.dims == s.operands[0].shape.dims
        and sorted(r.attr("dimensions", ())) == sorted(s.attr("dimensions", ()))
    )


def _absorbs(
    b: list[Instruction],
    a: list[Instruction],
    group_of: dict[int, int],
    position: dict[int, int],
    users: dict[int, list[Instruction]],
    copied: set[int],
) -> Instruction | None:
    """The step at which group `b` taking in group `a` runs, or None if it may not (see
    _merge_into_consumers): `b`'s (its first member), or for a sibling `a` whose outputs are read before it,
    `a`'s when everything `b` reads comes before that."""
    if len(a) + len(b) > MAX_GROUP:
        return None
    if any(i.opcode in _REDUCTIONS and not (i is a[0] and _siblings(i, b[0])) for i in a):
        return None
    both = {id(i) for i in a} | {id(i) for i in b}
    outputs = 0
    read_early = False  # an output of `a` read outside before b's step
    for i in a + b:
        outside = [u for u in users[id(i)] if id(u) not in both]
        if i is b[0] or outside:
            if i.shape.dims != b[0].shape.dims:
                return None
            outputs += 1
        if group_of[id(i)] != group_of[id(b[0])] and any(position[id(u)] < position[id(b[0])] for u in outside):
            read_early = True
    if outputs > MAX_OUTPUTS:
        return None
    if not read_early:
        return b[0]
    before = position[id(a[0])]
    if _siblings(a[0], b[0]) and all(position[id(x)] < before for x in _group_reads(b, copied)):
        return a[0]
    return None


def _make_group(insts: list[Instruction], extra: list[Instruction], copied: set[int]) -> FusedGroup | None:
    """The group's fused computation (copies of its instructions and of the producers it redoes, external
    values as parameters); with `extra` outputs, its root is the tuple (extra..., root)."""
    inside = {id(i) for i in insts}
    copies: dict[int, Instruction] = {}
    params: list[Instruction] = []
    inputs: list[Instruction] = []

    def value_of(inst: Instruction) -> Instruction:
        copy = copies.get(id(inst))
        if copy is not None:
            return copy
        if id(inst) in inside or id(inst) in copied:
            copy = inst.with_operands([value_of(o) for o in inst.operands])
        else:
            copy = Instruction(f"param.{len(params)}", "parameter", inst.shape, [], {}, str(len(params)))
            params.append(copy)
            inputs.append(inst)
        copies[id(inst)] = copy
        return copy

    body = [value_of(i) for i in insts]
    # the elementwise producers it redoes count: op by op each is a pass of its own (a convert before a reduce)
    computes = [i for i in insts if i.opcode not in _NO_COMPUTE] + [
        c for k, c in copies.items() if k in copied and c.opcode in ew.ELEMENTWISE_OPS
    ]
    # one f16/bf16 arithmetic op pays too: op by op, numpy computes it in f32 copies (data movement does not)
    half = any(
        i.shape.element_type.is_half_float and (i.opcode in ew.ELEMENTWISE_OPS or i.opcode in _REDUCTIONS)
        for i in computes
    )
    if len(computes) < 2 and not half and insts[-1].opcode != "reduce-window":
        return None
    outputs = extra + [insts[-1]]
    instructions = list(copies.values())  # copies are made operands first: their order is a schedule
    result = body[-1]
    if extra:
        outs = [copies[id(o)] for o in outputs]
        result = Instruction(f"outputs.{insts[-1].name}", "tuple", tuple_shape([o.shape for o in outs]), outs, {}, "")
        for o in outs:
            o.users.append(result)
        instructions.append(result)
    result.is_root = True
    return FusedGroup(insts[-1], insts, inputs, Computation(f"fused.{insts[-1].name}", instructions, result), outputs)
