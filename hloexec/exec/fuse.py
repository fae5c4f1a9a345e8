"""Fusion of unfused computations (pre-optimization HLO) into compiled loop nests.

XLA fuses elementwise chains before it runs them; a pre-optimization module has none, so op by op every
instruction is a numpy call that writes a full-size temporary. This pass groups producers into their
consumers -- XLA's producer/consumer instruction fusion, kept simple -- and each group becomes one
synthetic fused computation that `hloexec.kernels.fusion` compiles into one loop nest.

Rules:
* fusible: elementwise ops, data movement the loop generator rewrites into index arithmetic, iota,
  constants, reduce over the minor dim and reduce-window (reductions only as a group's root: a reduce
  feeding a broadcast would be recomputed; a column reduction runs faster in numpy). A reduce-window's
  producers join it only when its windows do not overlap (else they would be recomputed per window).
* a producer joins its consumers' group only when all its (live) users are in that one group, so a group
  needs no value of a non-member that depends on a member (groups stay convex) and nothing is computed twice;
  or when its other users come after the group's root in the schedule and it has the root's dims: then it
  is one more output of the group (multi-output fusion: Adam's new m and v, read by the parameter update
  and returned, are written by the same kernel as the update, which reads m, v and the gradient once);
* then a group absorbs an earlier group whose output it reads when no other reader of that group's outputs
  comes before its root (_merge_into_consumers: Adam's moment updates, read by the parameter update and by
  the selects of a finiteness check, and those selects become one kernel);
* cheap producers (constants, iota, broadcasts of those or of scalars, converts and other cheap unary
  ops) are copied into every group that uses them instead of materialising a large value;
* a group is kept only when it pays: at least two ops that do work op by op (an expanding broadcast
  counts), or one f16/bf16 arithmetic op (op by op it converts through f32), or a reduce-window (op by op
  numpy reduces a strided window view), and enough bytes (see ExecContext.fused_kernel, which may still
  decline it).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import opcodes
from ..ir.module import Computation, Instruction
from ..ir.shape import tuple_shape
from ..kernels import elementwise as ew

# Members that do no work op by op worth saving (a broadcast does: numpy materialises it in full).
_NO_COMPUTE = frozenset({"parameter", "constant", "reshape", "bitcast", "copy"})
MAX_GROUP = 128      # instructions per group: bounds compile time and the generator's recursion depth
MAX_OUTPUTS = 8      # outputs per group
_REDUCTIONS = ("reduce", "reduce-window")


@dataclass
class FusedGroup:
    """Instructions that run as one compiled kernel; `outputs` are the members whose values leave it."""
    root: Instruction                   # the last member; the kernel runs where it is scheduled
    members: list[Instruction]          # schedule order, root last; copied cheap producers included
    inputs: list[Instruction]           # values from outside, in the fused computation's parameter order
    computation: Computation
    outputs: list[Instruction]          # [root], or the extra outputs in schedule order then the root
    kernel: object = None


def _fusible(inst: Instruction) -> bool:
    op = inst.opcode
    if inst.shape.is_tuple or op not in ew.ELEMENTWISE_OPS and op not in opcodes.MOVEMENT and op not in (
            "reduce", "reduce-window", "iota", "constant"):
        return False
    if "control-predecessors" in inst.attrs or not ew.supported_type(inst.shape.element_type.name):
        return False
    if op == "reduce" and inst.operands[0].shape.rank - 1 not in inst.attr("dimensions", ()):
        # keeps the minor dim: the loop nest would read each column with a row-sized stride (measured 7x
        # slower than numpy, which adds whole rows; the group of its operand still fuses)
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


def _copied_in(inst: Instruction, users: list[Instruction], root: Instruction) -> bool:
    """Left out of the groups and copied into each one that reads it: a cheap producer all of whose users
    may join groups (a cheap unary op only when it has several: with one, it simply joins that one's)."""
    if inst is root or not _cheap(inst) or not all(_fusible(u) for u in users):
        return False
    return len(users) > 1 if inst.opcode in _CHEAP_UNARY else True


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
    extra: list[list[Instruction]] = []         # per group: members read outside it besides the root
    for inst in reversed(order):
        if not _fusible(inst) or _copied_in(inst, users[id(inst)], root):
            continue
        gids = {group_of.get(id(u)) for u in users[id(inst)]}
        joinable = inst is not root and inst.opcode not in _REDUCTIONS
        inside = gids - {None}
        gid = next(iter(inside)) if len(inside) == 1 else None
        if gid is not None and not _reads_once(members[gid][0]):
            gid = None
        if joinable and gid is not None and len(members[gid]) < MAX_GROUP:
            if None in gids:        # read outside too: one more output, if every such read comes later
                head = members[gid][0]
                later = all(position[id(u)] > position[id(head)] for u in users[id(inst)] if id(u) not in group_of)
                if (not later or inst.shape.dims != head.shape.dims or head.opcode in _REDUCTIONS
                        or len(extra[gid]) + 1 >= MAX_OUTPUTS):
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

    merged = _merge_into_consumers(members, group_of, position, users)
    groups = []
    for insts in merged:
        insts = sorted(insts, key=lambda i: position[id(i)])
        gid = group_of[id(insts[-1])]
        outs = [i for i in insts[:-1] if any(group_of.get(id(u)) != gid for u in users[id(i)])]
        group = _make_group(insts, group_of, outs)
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


def _group_reads(insts: list[Instruction], gid: int, group_of: dict[int, int]) -> list[Instruction]:
    """The values group `gid` reads from outside (as _make_group makes them parameters: through the cheap
    producers it copies in)."""
    inside = {id(i) for i in insts}
    seen: set[int] = set()
    reads = []

    def visit(inst):
        if id(inst) in inside or id(inst) in seen:
            return
        seen.add(id(inst))
        if _cheap(inst) and group_of.get(id(inst)) in (None, gid):
            for o in inst.operands:
                visit(o)
        else:
            reads.append(inst)
    for i in insts:
        for o in i.operands:
            visit(o)
    return reads


def _merge_into_consumers(members: list[list[Instruction]], group_of: dict[int, int], position: dict[int, int],
                          users: dict[int, list[Instruction]]) -> list[list[Instruction]]:
    """Multi-output fusion across groups: a group absorbs an earlier group whose value it reads, so that one
    kernel, run at the later root, writes both groups' outputs and the value read is not re-read (when it
    has no other reader, not even stored). Pre-optimization Adam with a finiteness check reads each new
    moment in the parameter update and in a `select` keeping it or the old one: without this, the moment
    updates, the parameter update and the selects are five passes (the selects op by op), with it one.

    Group B (in schedule order of roots) absorbs group A that produces a value B reads when every reader of
    A's outputs outside A and B is scheduled after B's root (A's outputs are now written at B's step; a
    reader's own position is the earliest its step can be, whether its group compiles or not), no reduce or
    reduce-window is in A or is B's root (one loop nest: outputs of the root's dims), and the bounds hold.
    Returns the groups' members (each group's root first, as built)."""
    order = sorted(range(len(members)), key=lambda g: position[id(members[g][0])])
    absorbed: set[int] = set()
    for b in order:
        root = members[b][0]
        if root.opcode in _REDUCTIONS:
            continue
        merged = True
        while merged:
            merged = False
            producers = {group_of[id(x)] for x in _group_reads(members[b], b, group_of) if id(x) in group_of}
            for a in sorted(producers, key=lambda g: position[id(members[g][0])]):
                if _absorbs(members[b], members[a], group_of, position, users):
                    for i in members[a]:
                        group_of[id(i)] = b
                    members[b] += members[a]
                    absorbed.add(a)
                    merged = True
                    break
    return [m for g, m in enumerate(members) if g not in absorbed]


def _absorbs(b: list[Instruction], a: list[Instruction], group_of: dict[int, int], position: dict[int, int],
             users: dict[int, list[Instruction]]) -> bool:
    """Whether group `b` may take in group `a` (see _merge_into_consumers)."""
    if len(a) + len(b) > MAX_GROUP or any(i.opcode in _REDUCTIONS for i in a):
        return False
    both = {id(i) for i in a} | {id(i) for i in b}
    after = position[id(b[0])]
    outputs = 0
    for i in a + b:
        outside = [u for u in users[id(i)] if id(u) not in both]
        if i is b[0] or outside:
            if i.shape.dims != b[0].shape.dims:
                return False
            outputs += 1
        if group_of[id(i)] != group_of[id(b[0])] and any(position[id(u)] < after for u in outside):
            return False
    return outputs <= MAX_OUTPUTS


def _make_group(insts: list[Instruction], group_of: dict[int, int], extra: list[Instruction]) -> FusedGroup | None:
    """The group's fused computation (copies of its instructions, external values as parameters); with
    `extra` outputs, its root is the tuple (extra..., root)."""
    gid = group_of[id(insts[-1])]
    inside = {id(i) for i in insts}
    copies: dict[int, Instruction] = {}
    params: list[Instruction] = []
    inputs: list[Instruction] = []

    def value_of(inst: Instruction) -> Instruction:
        copy = copies.get(id(inst))
        if copy is not None:
            return copy
        if id(inst) in inside or (_cheap(inst) and group_of.get(id(inst)) in (None, gid)):
            copy = inst.with_operands([value_of(o) for o in inst.operands])    # cheap producers are copied in
        else:
            copy = Instruction(f"param.{len(params)}", "parameter", inst.shape, [], {}, str(len(params)))
            params.append(copy)
            inputs.append(inst)
        copies[id(inst)] = copy
        return copy

    body = [value_of(i) for i in insts]
    computes = [i for i in insts if i.opcode not in _NO_COMPUTE]
    # one f16/bf16 arithmetic op pays too: op by op, numpy computes it in f32 copies (data movement does not)
    half = any(i.shape.element_type.is_half_float and (i.opcode in ew.ELEMENTWISE_OPS or i.opcode in _REDUCTIONS)
               for i in computes)
    if len(computes) < 2 and not half and insts[-1].opcode != "reduce-window":
        return None
    outputs = extra + [insts[-1]]
    instructions = list(copies.values())      # copies are made operands first: their order is a schedule
    result = body[-1]
    if extra:
        outs = [copies[id(o)] for o in outputs]
        result = Instruction(f"outputs.{insts[-1].name}", "tuple", tuple_shape([o.shape for o in outs]), outs, {}, "")
        for o in outs:
            o.users.append(result)
        instructions.append(result)
    result.is_root = True
    return FusedGroup(insts[-1], insts, inputs, Computation(f"fused.{insts[-1].name}", instructions, result),
                      outputs)
