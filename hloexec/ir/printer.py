"""Print a Module as HLO text in XLA's long form (HloModule::ToString with print_operand_shape).

    HloModule name, key=value, ...

    %callee (p0: f32[8]) -> f32[8] {
      %p0 = f32[8]{0} parameter(0)
      ROOT %x = f32[8]{0} add(f32[8]{0} %p0, f32[8]{0} %p0), metadata={...}
    }

    ENTRY %main ... {
      ...
    }

Attribute values are the raw text as read (already XLA syntax), constants and parameters print
their raw argument text, and computations are ordered so that every called computation comes
before its first caller (XLA's post order), entry last. Nothing is dropped: every attribute that
was read is printed back, so a module that XLA's parser accepted prints to text that it accepts
again (attributes are not re-validated here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: module.py imports this module to print itself
    from .module import Computation, Instruction, Module

__all__ = ["module_to_text", "computation_to_text", "instruction_to_text"]


def instruction_to_text(inst: Instruction) -> str:
    if inst.opcode in ("constant", "parameter") or not inst.operands:
        args = inst.args
    else:
        args = ", ".join(f"{op.shape.to_text()} %{op.name}" for op in inst.operands)
    text = f"{'ROOT ' if inst.is_root else ''}%{inst.name} = {inst.shape.to_text()} {inst.opcode}({args})"
    if inst.attrs:
        text += ", " + ", ".join(
            f"{k}={_called_names(inst.called[k]) if k in inst.called else v}" for k, v in inst.attrs.items()
        )
    return text


def _called_names(called) -> str:
    """Called computations by name: a computation written inline (`to_apply={...}`) is printed on its own."""
    if isinstance(called, list):
        return "{" + ", ".join(f"%{c.name}" for c in called) + "}"
    return f"%{called.name}"


def _signature(comp: Computation) -> str:
    if comp.signature:
        return comp.signature
    params = ", ".join(f"{p.name}: {p.shape.to_text()}" for p in comp.parameters)
    return f"({params}) -> {comp.root.shape.to_text()}"


def computation_to_text(comp: Computation) -> str:
    lines = [f"{'ENTRY ' if comp.is_entry else ''}%{comp.name} {_signature(comp)} {{"]
    for inst in comp.instructions:
        lines.append("  " + instruction_to_text(inst))
    close = "}"
    if comp.attrs:
        close += ", " + ", ".join(f"{k}={v}" for k, v in comp.attrs.items())
    lines.append(close)
    return "\n".join(lines)


def _post_order(module: Module) -> list[Computation]:
    """Callees before callers; among independent computations the text order is kept; entry last."""
    done: set[int] = set()
    order: list[Computation] = []

    def visit(comp: Computation):
        stack = [(comp, iter(_callees(comp)))]
        done.add(id(comp))
        while stack:
            c, it = stack[-1]
            for callee in it:
                if id(callee) not in done:
                    done.add(id(callee))
                    stack.append((callee, iter(_callees(callee))))
                    break
            else:
                stack.pop()
                order.append(c)

    for comp in module.computations:
        if comp is not module.entry and id(comp) not in done:
            visit(comp)
    if id(module.entry) not in done:
        visit(module.entry)
    # the entry is printed last even if some other computation (oddly) calls it
    order.remove(module.entry)
    order.append(module.entry)
    return order


def _callees(comp: Computation) -> list[Computation]:
    out = []
    for inst in comp.instructions:
        out.extend(inst.called_computations)
    return out


def module_to_text(module: Module) -> str:
    header = f"HloModule {module.name}"
    if module.attrs:
        header += ", " + ", ".join(f"{k}={v}" for k, v in module.attrs.items())
    parts = [header, ""]
    for comp in _post_order(module):
        parts.append(computation_to_text(comp))
        parts.append("")
    return "\n".join(parts)
