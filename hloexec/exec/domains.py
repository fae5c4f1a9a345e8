"""The values an entry parameter can take in real life, as its uses in the module imply: a dataflow analysis for
random inputs (inputs.py) that a real program would see.

- **index**: an integer parameter used as an index (dynamic-slice / dynamic-update-slice starts, gather /
  scatter indices, ragged all-to-all offsets), possibly through converts, reshapes, broadcasts, fusions and
  calls: drawn inside the bound that use shows.
- **positive**: a float parameter whose value reaches sqrt, rsqrt, log, log-plus-one or a divisor through ops
  that keep a positive value positive (convert, reshape, broadcast, slice, add, multiply, divide, maximum,
  reduce, select, ... and across fusion and call boundaries): Adam's second moment v reaches sqrt through
  `0.999 * v + 0.001 * g * g`. Drawn positive, so the program does not take the square root of a negative
  number no real run feeds it. A path through anything else (subtract, negate, dot) puts no constraint.
- **boolean**: a non-pred parameter converted to pred (a mask): drawn 0 or 1.

Each domain says why (`reason`), so that `run --seed N` can report which parameters it constrained.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.module import Instruction, Module

DEPTH = 64  # how far a value is followed; past it, no constraint


@dataclass(frozen=True)
class Domain:
    kind: str  # "index", "positive", "boolean"
    reason: str  # "index of dynamic-slice %ds.3", "reaches sqrt %sqrt.7 through multiply, add"
    bound: int | None = None  # index: the largest valid value

    def to_json(self) -> dict:
        return {"domain": self.kind, "reason": self.reason, **({"bound": self.bound} if self.kind == "index" else {})}


def input_domains(module: Module) -> dict[int, Domain]:
    """Entry parameter number -> its Domain, for the parameters whose uses constrain them."""
    domains: dict[int, Domain] = {}
    for param in module.entry.parameters:
        if param.shape.is_tuple:
            continue
        etype = param.shape.element_type
        if etype.is_integer:
            found = _bound_of(param, 0)
            if found is not None:
                bound, user = found
                domains[param.parameter_number] = Domain("index", f"index of {user.opcode} %{user.name}", max(bound, 0))
        if etype.kind != "pred" and param.parameter_number not in domains:
            mask = _converted_to_pred(param, 0)
            if mask is not None:
                domains[param.parameter_number] = Domain("boolean", f"converted to pred by %{mask.name}")
    walk = _PositiveWalk(module, domains)
    for inst in module.instructions():
        for k in _NEEDS_POSITIVE.get(inst.opcode, ()):
            if k < len(inst.operands) and inst.operands[k].shape.element_type.is_float:
                walk.require(inst.operands[k], inst, [], set())
    return domains


# Ops that carry an integer value through unchanged (for following an index back to its parameter).
_PASS_THROUGH = {
    "convert",
    "reshape",
    "bitcast",
    "broadcast",
    "copy",
    "slice",
    "transpose",
    "concatenate",
    "dynamic-slice",
    "clamp",
    "get-tuple-element",
    "tuple",
    "opt-barrier",
    "optimization-barrier",
}


def _bound_of(inst: Instruction, depth: int) -> tuple[int, Instruction] | None:
    """(largest valid value, the instruction that indexes with it), the tightest over `inst`'s uses."""
    if depth > DEPTH:
        return None
    found = []
    for user in inst.users:
        for k in [k for k, o in enumerate(user.operands) if o is inst]:
            try:
                found.append(_use_bound(user, k, depth))
            except (IndexError, TypeError):  # a malformed use bounds nothing: it is refused where prepared
                pass
    bounded = [f for f in found if f is not None]
    return min(bounded, key=lambda f: f[0]) if bounded else None


def _use_bound(user: Instruction, k: int, depth: int) -> tuple[int, Instruction] | None:
    """What operand `k` of `user` may hold at most, or None where that use does not bound it."""
    op = user.opcode
    if op == "dynamic-slice" and k >= 1:
        return user.operands[0].shape.dims[k - 1] - user.attr("dynamic_slice_sizes")[k - 1], user
    if op == "dynamic-update-slice" and k >= 2:
        return user.operands[0].shape.dims[k - 2] - user.operands[1].shape.dims[k - 2], user
    if op == "gather" and k == 1:
        dims = user.operands[0].shape.dims
        return min((dims[d] - s for d, s in zip(range(len(dims)), user.attr("slice_sizes"))), default=0), user
    if op in ("ragged-all-to-all", "ragged-all-to-all-start") and k >= 2:
        # offsets and sizes at most half the rows: every offset + size stays in range
        return min(user.operands[0].shape.dims[0], user.operands[1].shape.dims[0]) // 2, user
    if op == "scatter" and k == (len(user.operands) - 1) // 2:
        mapped = user.attr("scatter_dims_to_operand_dims")
        return min((user.operands[0].shape.dims[d] - 1 for d in mapped), default=0), user
    called = _called(user)
    if called is not None:
        return _bound_of(called.parameters[k], depth + 1) if k < len(called.parameters) else None
    if op in _PASS_THROUGH:
        return _bound_of(user, depth + 1)
    return None


def _converted_to_pred(inst: Instruction, depth: int) -> Instruction | None:
    """The convert to pred that `inst` reaches through pass-through ops and calls, if any."""
    if depth > DEPTH:
        return None
    for user in inst.users:
        if user.opcode == "convert" and user.shape.element_type.kind == "pred":
            return user
        called = _called(user)
        if called is not None:
            inner = [
                called.parameters[k] for k, o in enumerate(user.operands) if o is inst and k < len(called.parameters)
            ]
            found = next((m for m in (_converted_to_pred(p, depth + 1) for p in inner) if m is not None), None)
        elif user.opcode in _PASS_THROUGH and user.opcode != "convert":
            found = _converted_to_pred(user, depth + 1)
        else:
            found = None
        if found is not None:
            return found
    return None


# Where a value must be positive: opcode -> operand positions.
_NEEDS_POSITIVE = {"sqrt": (0,), "rsqrt": (0,), "log": (0,), "log-plus-one": (0,), "divide": (1,)}
# Ops whose result is positive when these operands are (which of them: None = every operand).
_KEEPS_POSITIVE = {
    "convert": None,
    "reshape": None,
    "bitcast": None,
    "broadcast": None,
    "copy": None,
    "slice": None,
    "transpose": None,
    "concatenate": None,
    "add": None,
    "multiply": None,
    "divide": None,
    "maximum": None,
    "minimum": None,
    "dynamic-slice": (0,),
    "pad": (0,),
    "select": (1, 2),
    "clamp": (1,),
    "reduce": "half",
    "reduce-window": "half",
    "opt-barrier": None,
    "optimization-barrier": None,
}


class _PositiveWalk:
    """Backwards from a value that must be positive to the entry parameters it comes from, through ops that
    keep a positive value positive and across fusion / call boundaries."""

    def __init__(self, module: Module, domains: dict[int, Domain]):
        self.entry, self.domains = module.entry, domains
        self.callers: dict[int, list[Instruction]] = {}  # id(computation) -> the fusions / calls calling it
        for inst in module.instructions():
            called = _called(inst)
            if called is not None:
                self.callers.setdefault(id(called), []).append(inst)

    def require(self, inst: Instruction, sink: Instruction, path: list[str], seen: set) -> None:
        """`inst`'s value reaches `sink` through `path` (opcodes) where it must be positive."""
        if id(inst) in seen or len(path) > DEPTH:
            return
        seen.add(id(inst))
        op = inst.opcode
        if op == "parameter":
            if inst.computation is self.entry:
                number = inst.parameter_number
                if inst.shape.element_type.is_float and number not in self.domains:
                    through = f" through {', '.join(dict.fromkeys(reversed(path)))}" if path else ""
                    self.domains[number] = Domain("positive", f"reaches {sink.opcode} %{sink.name}{through}")
                return
            for caller in self.callers.get(id(inst.computation), ()):
                if inst.parameter_number < len(caller.operands):
                    self.require(caller.operands[inst.parameter_number], sink, path, seen)
            return
        if _called(inst) is not None:
            self.require(_called(inst).root, sink, path, seen)
            return
        if op == "get-tuple-element":
            producer = inst.operands[0]
            producer = _called(producer).root if _called(producer) is not None else producer
            if producer.opcode == "tuple":  # a tuple, or a multi-output fusion's
                self.require(producer.operands[inst.attr("index")], sink, path, seen)
            return
        which = _KEEPS_POSITIVE.get(op, ())
        if which == ():
            return  # no constraint through this op (or its value is non-negative whatever its operands)
        if op == "multiply" and _is_square(inst):
            return  # non-negative whatever its factors' signs
        if op == "maximum" and any(_is_positive_constant(o) for o in inst.operands):
            return
        operands = list(enumerate(inst.operands))
        if which == "half":
            operands = operands[: len(operands) // 2]
        elif which is not None:
            operands = [(k, o) for k, o in operands if k in which]
        for _, operand in operands:
            self.require(operand, sink, path + [op], seen)


def _called(inst: Instruction):
    """The computation a fusion or call runs on its operands (its parameters are them), else None."""
    if inst.opcode in ("fusion", "call"):
        return inst.called.get("calls") or inst.called.get("to_apply")
    return None


def _is_square(inst: Instruction) -> bool:
    """Whether a product is a square times positive constants: every other factor occurs an even number of
    times (g * g, (0.001 * g) * g; factors seen through converts, reshapes and copies)."""
    counts: dict[int, int] = {}
    stack = [inst]
    while stack:
        x = stack.pop()
        if x.opcode == "multiply":
            stack += x.operands
        elif not _is_positive_constant(x):
            while x.opcode in ("convert", "reshape", "bitcast", "copy") and x.operands:
                x = x.operands[0]
            counts[id(x)] = counts.get(id(x), 0) + 1
    return all(n % 2 == 0 for n in counts.values())


def _is_positive_constant(inst: Instruction) -> bool:
    while inst.opcode in ("broadcast", "convert", "reshape", "copy"):
        inst = inst.operands[0]
    return inst.opcode == "constant" and inst.shape.element_type.is_float and bool((inst.literal > 0).all())
