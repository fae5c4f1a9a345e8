"""What an instruction's `op_name` metadata says about where it comes from: the framework's path (jax:
`jit(train_step)/jit(main)/transpose(jvp(Model))/layers/3/mlp/dot_general`), the pass (forward, backward)
and the layer. Shared by the reports (memory, collectives, exports) so that they name places alike."""

from __future__ import annotations

import re

from ..ir.module import Instruction

# `.../layers/3/...`, `.../layer/3/...`, `transformer/layer_3/...`, `h.3`, `blocks_3`, `encoder.layer.3`
_LAYER = re.compile(r"(?:^|[/.])(?:layers?|blocks?|h)[/._](\d+)(?:[/._]|$)")
# pytorch's autograd names its backward nodes `...Backward0`; jax's backward is the transpose of a jvp
# (a function's own name, `jit(forward)`, says nothing)
_BACKWARD = re.compile(r"transpose\(|[a-z]Backward\d*\b")
_FORWARD = re.compile(r"jvp\(")


def op_name(inst: Instruction) -> str:
    return str(inst.metadata.get("op_name", "") or "")


def phase(name: str) -> str:
    """'backward' (jax: inside `transpose(`; pytorch: a `...Backward` node), 'forward' (jax: inside `jvp(`),
    '' when the op_name says neither (an optimizer update, or a module without autodiff)."""
    if _BACKWARD.search(name):
        return "backward"
    if _FORWARD.search(name):
        return "forward"
    return ""


def layer(name: str) -> int | None:
    """The layer index in an op_name path (`layers/3`, `layer_3`, `h.3`, `blocks/3`), else None."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def where(inst: Instruction) -> dict:
    """The instruction's name, opcode, HLO line, op_name, pass and source location, for reports."""
    name = op_name(inst)
    return {
        "name": inst.name,
        "opcode": inst.opcode,
        "line": inst.line,
        "op_name": name,
        "phase": phase(name),
        "layer": layer(name),
        "source": inst.source_location,
    }


def short(name: str, width: int = 60) -> str:
    """An op_name cut to its last `width` characters (the specific end of the path), '…' in front."""
    return name if len(name) <= width else "…" + name[-(width - 1) :]


def fit(text: str, width: int) -> str:
    """`text` cut to `width` characters, '…' at the end."""
    return text if len(text) <= width else text[: width - 1] + "…"
