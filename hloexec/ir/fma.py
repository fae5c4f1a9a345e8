"""Fused multiply-add contraction, as LLVM does it inside one of XLA:CPU's fusions.

XLA:CPU compiles a fusion to one LLVM function and lets LLVM contract `a * b + c` into one FMA (measured, jaxlib
0.10.2: f16, bf16 and f32; `a*b - c`, `c - a*b` too; a multiply with several users is not contracted -- LLVM's
DAGCombiner on x86 contracts one-use products only --; values passed between fusions go through memory and are
not contracted). A sum of a product, `reduce(a * b)`, is contracted too: its reducer's add takes each exact
product (measured: 100% of f16 column sums of x*y), except in YNNPACK's fusions, which round the products.

`contract_fma(comp)` returns a copy of fused computation `comp` computing those products exactly, each sum
rounded once: in f32 for f16 / bf16 (their products are exact in f32; the sum is then rounded to f32 and to the
type -- twice, where XLA's FMA rounds once: the two differ only when the f32 sum lands on a tie of the type) and
in f64 for f32. Which operand contracts when both are multiplies: the first (LLVM's DAGCombiner tries the first
operand first).
"""

from __future__ import annotations

from dataclasses import replace

from .compiled_for import ynn_computations
from .dtypes import element_type
from .module import Computation, Instruction

_WIDER = {"f16": "f32", "bf16": "f32", "f32": "f64"}


def contract_fma(comp: Computation) -> Computation:
    """`comp` with its add / subtract of a multiply as one rounding (a copy; `comp` itself when there is none)."""
    cached = comp.__dict__.get("_fma_contracted")
    if cached is not None:
        return cached
    if not any(_product_operand(i) is not None or _product_sum(i) for i in comp.instructions):
        comp.__dict__["_fma_contracted"] = comp
        return comp
    copies: dict[int, Instruction] = {}
    out: list[Instruction] = []

    def new(name, opcode, shape, operands, attrs=None) -> Instruction:
        inst = Instruction(name, opcode, shape, operands, attrs or {}, "")
        for o in operands:
            o.users.append(inst)
        out.append(inst)
        return inst

    ynn = comp.module is not None and comp.name in ynn_computations(comp.module)  # YNNPACK rounds its products
    for inst in comp.instructions:
        k = _product_operand(inst)
        if (
            k is None and not ynn and _product_sum(inst)
        ):  # reduce(a * b): every step acc + a*b, exact product, one rounding
            wide_type = _WIDER[inst.shape.element_type.name]
            product = inst.operands[0]
            wide_of = lambda v: replace(v.shape, element_type=element_type(wide_type), layout=None)  # noqa: E731
            a, b = (
                new(f"{inst.name}.fma.{t}", "convert", wide_of(v), [copies[id(v)]])
                for t, v in zip("ab", product.operands)
            )
            exact = new(f"{inst.name}.fma.product", "multiply", wide_of(product), [a, b])
            init = new(f"{inst.name}.fma.init", "convert", wide_of(inst.operands[1]), [copies[id(inst.operands[1])]])
            folded = new(
                f"{inst.name}.fma.sum", "reduce", wide_of(inst), [exact, init], {"dimensions": inst.attrs["dimensions"]}
            )
            folded.called = {
                "to_apply": _rounded_add(inst.called_computation("to_apply"), wide_of(init), init.operands[0].shape)
            }
            copy = Instruction(inst.name, "convert", inst.shape, [folded], {}, "", inst.line, inst.column)
            folded.users.append(copy)
            out.append(copy)
        elif k is None:
            copy = inst.with_operands([copies[id(o)] for o in inst.operands])
            out.append(copy)
        else:  # convert(wide(a) * wide(b) +- wide(c)): the product exact, one rounding of the sum
            wide_type = _WIDER[inst.shape.element_type.name]
            wide = replace(inst.shape, element_type=element_type(wide_type), layout=None)
            product = inst.operands[k]

            def widened(v: Instruction, tag: str) -> Instruction:
                return new(
                    f"{inst.name}.fma.{tag}",
                    "convert",
                    replace(v.shape, element_type=wide.element_type, layout=None),
                    [copies[id(v)]],
                )

            a, b = widened(product.operands[0], "a"), widened(product.operands[1], "b")
            exact = new(f"{inst.name}.fma.product", "multiply", wide, [a, b])
            other = widened(inst.operands[1 - k], "c")
            operands = [exact, other] if k == 0 else [other, exact]
            total = new(f"{inst.name}.fma.sum", inst.opcode, wide, operands)
            copy = Instruction(inst.name, "convert", inst.shape, [total], {}, "", inst.line, inst.column)
            total.users.append(copy)
            out.append(copy)
        copy.is_root = inst.is_root
        copies[id(inst)] = copy
    contracted = Computation(
        comp.name, out, copies[id(comp.root)], signature=comp.signature, attrs=comp.attrs, line=comp.line
    )
    contracted.module = comp.module
    comp.__dict__["_fma_contracted"] = contracted
    return contracted


def _product_sum(inst: Instruction) -> bool:
    """Whether `inst` is a sum (reduce with an add reducer) of a multiply used by it alone, of the same type."""
    if inst.opcode != "reduce" or len(inst.operands) != 2 or inst.shape.is_tuple:
        return False
    name, product = inst.shape.element_type.name, inst.operands[0]
    reducer = inst.called.get("to_apply")
    return (
        name in _WIDER
        and product.opcode == "multiply"
        and product.shape.element_type.name == name
        and sum(1 for u in product.users if u.computation is inst.computation) == 1
        and reducer is not None
        and not isinstance(reducer, list)
        and reducer.root.opcode == "add"
        and {id(o) for o in reducer.root.operands} == {id(p) for p in reducer.parameters}
    )


def _rounded_add(reducer: Computation, wide, narrow) -> Computation:
    """The reducer of a contracted sum: acc + x in the wide type, rounded to the narrow one (kept wide)."""
    params = [Instruction(f"{reducer.name}.fma.p{i}", "parameter", wide, [], {}, str(i)) for i in range(2)]
    total = Instruction(f"{reducer.name}.fma.add", "add", wide, params, {}, "")
    rounded = Instruction(f"{reducer.name}.fma.round", "convert", narrow, [total], {}, "")
    back = Instruction(f"{reducer.name}.fma.widen", "convert", wide, [rounded], {}, "")
    for user, operands in ((total, params), (rounded, [total]), (back, [rounded])):
        for o in operands:
            o.users.append(user)
    back.is_root = True
    comp = Computation(
        f"{reducer.name}.fma",
        [*params, total, rounded, back],
        back,
        signature=f"(p0: {wide.element_type.name}[], p1: {wide.element_type.name}[]) -> {wide.element_type.name}[]",
    )
    comp.module = reducer.module
    return comp


def _product_operand(inst: Instruction) -> int | None:
    """Which operand (0, 1) of add / subtract `inst` is a multiply LLVM contracts with it (of the same type, used
    by `inst` alone), or None."""
    if inst.opcode not in ("add", "subtract") or inst.shape.is_tuple:
        return None
    name = inst.shape.element_type.name
    if name not in _WIDER:
        return None
    for k, operand in enumerate(inst.operands):
        if (
            operand.opcode == "multiply"
            and operand.shape.element_type.name == name
            and sum(1 for u in operand.users if u.computation is inst.computation) == 1
        ):
            return k
    return None
