"""`hloexec extract FILE INSTRUCTION`: the sub-computation that computes one instruction, as a module of its own,
with the values that feed it captured from a full run of the original module.

`submodule(roots, cut)` is the building block (`minimize` and the zoom of `diff` use it too): the instructions
of one computation that `roots` depend on, stopping at the instructions in `cut` and at the computation's
parameters, which become the new module's parameters. Constants and iotas stay instructions (they are free).
The text is printed by hloexec.ir.printer, so it parses with XLA's parser where the original does; the module
keeps the computations it calls (fused computations, reducers) and the header's replica and partition counts.

`capture(exe, instructions, inputs)` runs the original module once and keeps the values of the given
instructions (the first time each runs; a run stops as soon as it has them all): the parameters of a
submodule take exactly the values they had in the original run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ExecutionError
from ..ir.module import Computation, Instruction, Module
from ..ir.shape import tuple_shape
from .match import ValueGraph, instruction_key

# Header attributes an extract keeps: the others describe the whole original entry (its layout, schedule).
_KEPT_HEADER = ("replica_count", "num_partitions")
_FREE_OPCODES = frozenset({"constant", "iota"})


@dataclass
class Submodule:
    """A standalone module computing `roots` of the original from `parameters` (original instructions, in
    parameter order: the values they had in the original run are the new module's inputs)."""

    text: str
    name: str
    roots: list[Instruction]
    parameters: list[Instruction]
    instructions: list[Instruction]  # the original instructions it computes (parameters excluded)

    @property
    def instruction_count(self) -> int:
        return len(self.parameters) + len(self.instructions) + (len(self.roots) > 1)


def submodule(roots: list[Instruction], cut=frozenset(), name: str | None = None) -> Submodule:
    """The instructions of the computation holding `roots` that the roots depend on, stopping at the
    instructions whose id is in `cut` and at the computation's parameters, which become parameters (in the
    order the computation first uses them). Several roots become a tuple root."""
    comp = roots[0].parent
    if any(r.computation is not comp for r in roots):
        raise ValueError("the roots of a submodule must be instructions of one computation")
    included: set[int] = set()
    boundary: dict[int, Instruction] = {}
    stack = list(roots)
    while stack:
        inst = stack.pop()
        if id(inst) in included or id(inst) in boundary:
            continue
        if inst.opcode == "parameter" or (id(inst) in cut and inst.opcode not in _FREE_OPCODES):
            boundary[id(inst)] = inst
            continue
        included.add(id(inst))
        stack += inst.operands
    order = [i for i in comp.instructions if id(i) in included or id(i) in boundary]
    parameters = [i for i in order if id(i) in boundary]
    copies: dict[int, Instruction] = {}
    for number, inst in enumerate(parameters):
        copies[id(inst)] = Instruction(inst.name, "parameter", inst.shape, [], {}, str(number))
    body = [i for i in order if id(i) in included]
    for inst in body:
        copy = inst.with_operands([copies[id(o)] for o in inst.operands])
        copy.attrs = {k: v for k, v in inst.attrs.items() if k != "control-predecessors"}
        copies[id(inst)] = copy
    instructions = [copies[id(i)] for i in order]
    if len(roots) == 1:
        root = copies[id(roots[0])]
    else:
        outs = [copies[id(r)] for r in roots]
        names = {i.name for i in instructions}
        tuple_name = next(f"outputs.{k}" for k in range(len(names) + 1) if f"outputs.{k}" not in names)
        root = Instruction(tuple_name, "tuple", tuple_shape([o.shape for o in outs]), outs, {}, "")
        for o in outs:
            o.users.append(root)
        instructions.append(root)
    root.is_root = True
    module = comp.module
    if name is None:
        name = f"{module.name}.{roots[0].name}" if module is not None else roots[0].name
    entry = Computation(f"{roots[0].name}.extract", instructions, root, is_entry=True, signature="")
    header = {k: v for k, v in (module.attrs if module is not None else {}).items() if k in _KEPT_HEADER}
    text = Module(name, [entry], entry, attrs=header).to_text()
    return Submodule(_resolve_stack_frames(text, module), name, roots, parameters, body)


def _resolve_stack_frames(text: str, module: Module | None) -> str:
    """`stack_frame_id=N` in metadata as `source_file=... source_line=...`: the extract has no StackFrames table."""

    def resolve(m) -> str:
        frame = module.stack_frame(int(m.group(1))) if module is not None else None
        return f'source_file="{frame[0]}" source_line={frame[1]}' if frame else ""

    return re.sub(r"stack_frame_id=(\d+)", resolve, text)


def cone_cut(root: Instruction, depth: int | None) -> set[int]:
    """Where to cut a submodule of `root` that holds the instructions up to `depth` operand steps above it
    (ids of the instructions one step further). None: no cut (back to the parameters)."""
    if depth is None:
        return set()
    inside, level = {id(root)}, [root]
    for _ in range(depth):
        if not level:  # the parameters reached: a deeper --depth keeps nothing more
            break
        step = [o for i in level for o in i.operands if id(o) not in inside]
        level = list({id(o): o for o in step}.values())  # each once, in first-met order
        inside.update(id(o) for o in level)
    return {id(o) for i in level for o in i.operands if id(o) not in inside}


def boundary(module: Module, inst: Instruction) -> str | None:
    """Where a walk inside a called computation (a fusion's, a call's) stops at its edge at `inst`: a parameter
    is an operand of the instruction calling the computation, the root is that instruction's value. None
    where `inst` is not on such an edge (or its computation is the entry)."""
    comp = inst.computation
    if comp is None or comp is module.entry or (inst.opcode != "parameter" and inst is not comp.root):
        return None
    callers = [c for c in module.instructions() if any(x is comp for x in c.called_computations)]
    if not callers:
        return None
    caller = callers[0]
    more = f" (and {len(callers) - 1} other callers)" if len(callers) > 1 else ""
    if inst.opcode == "parameter":
        k = inst.parameter_number
        operand = f" = %{caller.operands[k].name}" if k < len(caller.operands) else ""
        return f"%{inst.name} is operand {k}{operand} of %{caller.name} in %{caller.computation.name}{more}"
    return f"%{inst.name} is the value of %{caller.name} in %{caller.computation.name}{more}"


def find_instruction(module: Module, name: str) -> Instruction:
    """The instruction named `name` (a leading % is ignored; 'computation/name' where names repeat)."""
    comp_name, _, inst_name = name.lstrip("%").rpartition("/")
    found = [
        i
        for c in module.computations
        if not comp_name or c.name == comp_name.lstrip("%")
        for i in c.instructions
        if i.name == inst_name.lstrip("%")
    ]
    if not found:
        raise KeyError(f"{module.name} has no instruction named {name!r}")
    if len(found) > 1:
        where = ", ".join(f"{i.parent.name}/{i.name}" for i in found)
        raise KeyError(f"{module.name} has {len(found)} instructions named {name!r}: {where}; write COMPUTATION/NAME")
    return found[0]


class _Captured(Exception):
    """Raised from an observer once it holds every value it was asked for: the rest of the run is not needed."""


def capture(exe, instructions: list[Instruction], inputs: list, graph: ValueGraph | None = None) -> list:
    """The values `instructions` of `exe.module` take in a run with `inputs` (the first time each runs).

    An instruction inside a fused or called computation is observed where its value is held outermost (a
    fused parameter is its fusion's operand); only the computations holding the wanted values are run op by
    op, and the run stops once it has them all."""
    graph = graph or ValueGraph(exe.module)
    entry_params = {id(p): p.parameter_number for p in exe.module.entry.parameters}
    wanted: dict[tuple, list[int]] = {}
    found: dict[int, object] = {}
    for k, inst in enumerate(instructions):
        node = graph.node_of.get(id(inst))
        tap = node.tap if node is not None else inst
        if id(tap) in entry_params:
            found[k] = inputs[entry_params[id(tap)]]
        else:
            wanted.setdefault(instruction_key(tap), []).append(k)
    if wanted:
        inside = {key[0] for key in wanted}
        opened = _enclosing(exe.module, inside)

        def observe(inst, value):
            for k in wanted.pop(instruction_key(inst), ()):
                found[k] = value
            if not wanted:
                raise _Captured

        try:
            exe.run(*inputs, observe=observe, observe_inside=lambda comp: comp.name in opened)
        except Exception as e:  # the stop arrives wrapped when it leaves a nested computation
            cause: BaseException | None = e
            while cause is not None and not isinstance(cause, _Captured):
                cause = cause.__cause__
            if cause is None:
                raise
    if wanted:
        names = ", ".join(sorted({key[1] for key in wanted}))
        raise ExecutionError(f"{exe.module.name}: {names} did not run (dead code, or a branch not taken)")
    return [found[k] for k in range(len(instructions))]


def _enclosing(module: Module, names: set[str]) -> set[str]:
    """`names` and the computations that run them, up to the entry."""
    callers: dict[str, str] = {}
    for comp in module.computations:
        for inst in comp.instructions:
            for c in inst.called_computations:
                callers.setdefault(c.name, comp.name)
    out = set()
    for name in names:
        at: str | None = name
        while at is not None and at not in out:
            out.add(at)
            at = callers.get(at)
    return out
