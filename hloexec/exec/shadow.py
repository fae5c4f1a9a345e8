"""The shadow of a module: the same program with every floating-point type widened to f64 (complex to c128).

Run on the same inputs, the shadow gives the program's exact answer up to f64 rounding, which is what
hloexec's numerical validation measures every result against (tools/verdict.py, tools/numerics.py).
It is an IR-to-IR transform, so it runs in every tier a module runs in (compiled fusions and loops, SPMD,
the cuBLAS custom-calls) without any op knowing about it:

- every f16/bf16/f32/fp8 element type becomes f64, c64 becomes c128; integer and pred types stay (with
  `half_in_f32`, for a shadow that does not fit in f64: types of at most 16 bits become f32, HALF_BITS);
- a float->float `convert` becomes the identity (f64 -> f64): the program's storage roundings are what the
  shadow removes. Except converts to 8-bit-or-narrower floats (fp8, fp6, fp4): those quantize on purpose
  (fp8 scaling recipes), so the shadow keeps them (`reduce-precision` is kept too: it is an f64 op, as long
  as it narrows the exponent of its type; else it is pinned, below);
- constants keep the value the program has (the f16 constant, exactly, in f64), not their decimal text;
- instructions whose meaning depends on the bits of their type are *pinned*: they run at the program's
  own types on the shadow's values rounded to them, and their float results are widened: bitcast-convert
  to or from a float type (jax's random-float bit trick; not a float's total order by hand compared with another,
  `select(b < 0, b xor MAX, b)` of its bits b, as XLA:CPU's optimized sort comparators have it: the shadow takes
  its own floats' bits, so its sort orders the exact values, not their roundings), rng, rng-bit-generator, stochastic-convert,
  quantizing converts, converts from 8-bit-or-narrower floats to integers (XLA saturates at the integer
  bounds rounded to the source type: f4e2m1fn 6.0 -> s4 is 7, as 7 rounds to 6 in f4e2m1fn), a
  reduce-precision keeping its type's exponent width (it then keeps that type's subnormals, rounding them
  on their bit pattern, where the f64 op would flush them), and custom-calls other than those that compute
  in their output type (cuBLAS gemm, cuDNN convolutions, TopK) or move values only (the identity markers). `Shadow.pinned`
  lists them with the reason.

Integer and pred values are the same as in the program's run except where they are computed from floats:
compares, float->int converts, is-finite, sorts and variadic reduces over float keys, bitcasts of floats.
Those instructions are `Shadow.discrete`: where their values differ between the runs (a relu mask at an
element near 0, a loss-scale overflow check), everything downstream compares two different paths, and the
report says so (`discrete_divergence`) instead of diverging silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import ml_dtypes
import numpy as np

from ..ir.dtypes import ELEMENT_TYPES, ElementType
from ..ir.module import Computation, Instruction, Module
from ..ir.shape import Shape
from ..ops.custom_call.cublas import F8_MATMUL, PROGRAM_RESULT_TYPE
from ..ops.custom_call.registry import result_leaves

F64, F32, C128 = ELEMENT_TYPES["f64"], ELEMENT_TYPES["f32"], ELEMENT_TYPES["c128"]
# `half_in_f32`: float types of at most this many bits are f32 in the shadow (f32 and f64 stay f64). f32 has 13
# more significand bits than f16 (16 more than bf16): its roundings are 2^-13 of an f16 rounding, beyond what any
# verdict on f16 values can see, and the shadow's 16-bit values take half the memory of f64 ones.
HALF_BITS = 16

# Custom-call targets whose kernels compute in their output type (f64 in the shadow: a radix sort of the exact
# keys is the exact sort); markers that move values only (identity markers, --custom-call-identity ones, SliceToDynamic, manual-region edges) are found by their
# registered kernel (_moves_values_only).
COMPUTING_CUSTOM_CALLS = frozenset(
    {
        "__cublas$gemm",
        "__cublas$lt$matmul",
        "__cublas$lt$matmul$f8",
        "__cudnn$convForward",
        "__cudnn$convBackwardInput",
        "__cudnn$convBackwardFilter",
        "__cudnn$convBiasActivationForward",
        "TopK",
        "__gpu$TopK",
        "__cub$DeviceRadixSort",
        "__cub$DeviceRadixSortUnassignedScratchSize",
    }
)
# Ops whose values depend on the bits or the random stream of their own types.
_PINNED_OPCODES = {
    "rng": "draws random numbers of its own type",
    "rng-bit-generator": "random bits",
    "rng-get-and-update-state": "random state",
    "stochastic-convert": "random rounding",
}
# the name of a pinned instruction's copy at the program's types (the shadow's value widens it)
PINNED_SUFFIX = ".own"
# Quantizing converts: to float types this narrow the program means to lose precision.
QUANTIZING_BITS = 8


def shadow_type(etype: ElementType, half_in_f32: bool = False) -> ElementType:
    """f64 for every float type (`half_in_f32`: f32 for those of at most HALF_BITS bits), c128 for complex ones,
    the type itself otherwise."""
    if etype.kind == "float":
        return F32 if half_in_f32 and etype.bits <= HALF_BITS else F64
    if etype.kind == "complex":
        return C128
    return etype


def shadow_shape(shape: Shape, half_in_f32: bool = False) -> Shape:
    """`shape` with its float element types widened (tuples leaf by leaf; dims and layouts kept)."""
    if shape.is_tuple:
        return replace(shape, tuple_shapes=tuple(shadow_shape(s, half_in_f32) for s in shape.tuple_shapes))
    wide = shadow_type(shape.element_type, half_in_f32)
    if wide is shape.element_type:
        return shape
    return replace(shape, element_type=wide)


def has_float(shape: Shape) -> bool:
    if shape.is_tuple:
        return any(map(has_float, shape.tuple_shapes))
    return shape.element_type.kind in ("float", "complex")


def has_discrete(shape: Shape) -> bool:
    """Whether the value has integer or pred leaves."""
    if shape.is_tuple:
        return any(map(has_discrete, shape.tuple_shapes))
    return shape.element_type.kind in ("pred", "sint", "uint")


def widen(value, shape: Shape, half_in_f32: bool = False):
    """A value of `shape` (arrays, tuples of them) as the shadow holds it: floats in f64 / c128."""
    if shape.is_tuple:
        return tuple(widen(v, s, half_in_f32) for v, s in zip(value, shape.tuple_shapes))
    wide = shadow_shape(shape, half_in_f32)
    if wide is shape:
        return value
    return np.asarray(value).astype(wide.dtype)


@dataclass
class Shadow:
    """A module's shadow. `module`: the widened module (instructions keep their names: the shadow value of
    %x is the value of %x in `module`). `pinned`: name -> why it runs at the program's own precision.
    `discrete`: names of the instructions that compute integer/pred values from floats (see module doc)."""

    original: Module
    module: Module
    pinned: dict[str, str] = field(default_factory=dict)
    discrete: list[str] = field(default_factory=list)
    half_in_f32: bool = False  # 16-bit float types are f32 in the shadow (HALF_BITS)

    def inputs(self, inputs, widened: dict | None = None) -> list:
        """The program's entry arguments as the shadow takes them (floats widened exactly). `widened`, a dict
        shared between calls, widens an array that several calls pass (SPMD devices' shared inputs) once."""
        widened = {} if widened is None else widened

        def one(v, shape):
            if shape.is_tuple:
                return tuple(one(x, s) for x, s in zip(v, shape.tuple_shapes))
            if id(v) not in widened:
                widened[id(v)] = (v, widen(v, shape, self.half_in_f32))  # v kept: its id stays its own
            return widened[id(v)][1]

        return [one(v, p.shape) for v, p in zip(inputs, self.original.entry.parameters)]


def shadow_module(module: Module, half_in_f32: bool = False) -> Shadow:
    """The shadow of `module` (see the module docstring; `half_in_f32`: its 16-bit float types in f32, see
    HALF_BITS). The module itself is not touched."""
    return _Transform(module, half_in_f32).run()


def pin_reason(inst: Instruction) -> str | None:
    """Why `inst` runs at its own precision in the shadow, or None when it is widened like the rest."""
    opcode = inst.opcode
    if opcode in _PINNED_OPCODES:
        return _PINNED_OPCODES[opcode] if has_float(inst.shape) or opcode == "stochastic-convert" else None
    if opcode in ("bitcast-convert", "bitcast"):
        src, dst = inst.operands[0].shape, inst.shape
        if opcode == "bitcast" and (src.is_tuple or src.element_type is dst.element_type):
            return None
        if has_float(src) or has_float(dst):
            return "reinterprets the bits of a float type"
        return None
    if opcode == "convert":
        src_type, dst_type = inst.operands[0].shape.element_type, inst.shape.element_type
        assert src_type is not None and dst_type is not None  # convert takes and makes arrays
        if src_type.kind == "float" and dst_type.kind == "float" and dst_type.bits <= QUANTIZING_BITS < src_type.bits:
            return f"quantizes to {dst_type.name}"
        if src_type.kind == "float" and src_type.bits <= QUANTIZING_BITS and dst_type.kind in ("sint", "uint"):
            return f"saturates at {dst_type.name}'s bounds rounded to {src_type.name}"
        return None
    if opcode == "reduce-precision":
        etype = inst.shape.element_type
        if etype is not F64 and inst.attr("exponent_bits") >= ml_dtypes.finfo(etype.numpy).nexp:
            return f"keeps {etype.name}'s exponent range and subnormals"
        return None
    if opcode == "custom-call":
        target = inst.attr("custom_call_target", "")
        if (
            target not in COMPUTING_CUSTOM_CALLS
            and not _moves_values_only(target)
            and (has_float(inst.shape) or any(has_float(o.shape) for o in inst.operands))
        ):
            return f"custom-call {target} computes in its own types"
    return None


def _moves_values_only(target: str) -> bool:
    """Whether custom-call `target` is registered as a marker whose values are (tiles of) its operands'."""
    from ..ops import manual
    from ..ops.custom_call import markers
    from ..ops.custom_call.registry import CUSTOM_CALLS

    return CUSTOM_CALLS.get(target) in (markers.identity, markers.slice_to_dynamic, manual.enter, manual.leave)


# Ops that can compute integer/pred values from float ones (data movement only carries them).
_DISCRETE_FROM_FLOAT = frozenset(
    {
        "compare",
        "convert",
        "bitcast-convert",
        "bitcast",
        "is-finite",
        "sort",
        "reduce",
        "reduce-window",
        "topk",
        "custom-call",
        "stochastic-convert",
        "map",
        "scan",
    }
)


def _float_to_discrete(inst: Instruction) -> bool:
    """Whether `inst` makes integer/pred values out of float operands (where the two runs can part)."""
    return (
        inst.opcode in _DISCRETE_FROM_FLOAT
        and has_discrete(inst.shape)
        and any(has_float(o.shape) for o in inst.operands)
        and not (inst.opcode == "bitcast" and inst.operands[0].shape.is_tuple)
    )


class _Transform:
    def __init__(self, module: Module, half_in_f32: bool = False):
        self.module = module
        self.done: dict[int, Computation] = {}
        self.shadow = Shadow(module, module, half_in_f32=half_in_f32)
        self.wide = lambda shape: shadow_shape(shape, half_in_f32)

    def run(self) -> Shadow:
        entry = self.computation(self.module.entry)
        comps = [self.done[id(c)] for c in self.module.computations if id(c) in self.done]
        attrs = {k: v for k, v in self.module.attrs.items() if k != "entry_computation_layout"}
        self.shadow.module = Module(
            self.module.name,
            comps,
            entry,
            attrs=attrs,
            has_header=self.module.has_header,
            line=self.module.line,
            path=self.module.path,
            stack_frames=self.module._stack_frames,
        )
        return self.shadow

    def computation(self, comp: Computation) -> Computation:
        done = self.done.get(id(comp))
        if done is not None:
            return done
        names = {i.name for i in comp.instructions}
        made: list[Instruction] = []
        value: dict[int, Instruction] = {}

        def add(
            name: str,
            opcode: str,
            shape: Shape,
            operands: list,
            like: Instruction | None = None,
            attrs: dict | None = None,
            exact_name: bool = False,
        ) -> Instruction:
            """A new instruction (`like`'s attributes, called computations and source site, if given)."""
            if like is not None:
                inst = Instruction(
                    name, opcode, shape, operands, like._attrs, like._args, like.line, like.column, like._attr_rows
                )
                inst.called = self._called(like)
            else:
                inst = Instruction(name, opcode, shape, operands, attrs or {})
            if not exact_name:
                inst.name = _fresh(name, names)
            made.append(inst)
            return inst

        orders, parts = _total_orders(comp)
        for inst in comp.instructions:
            if id(inst) in parts:
                continue
            if id(inst) in orders:
                value[id(inst)] = self._total_order(inst, value[id(orders[id(inst)])], add)
                continue
            operands = [value[id(o)] for o in inst.operands]
            if _float_to_discrete(inst):
                self.shadow.discrete.append(inst.name)
            reason = pin_reason(inst)
            if reason is not None:
                self.shadow.pinned[inst.name] = reason
                narrow = [_narrow(w, o.shape, add, self.wide) for o, w in zip(inst.operands, operands)]
                own = add(f"{inst.name}{PINNED_SUFFIX}", inst.opcode, inst.shape, narrow, like=inst)
                value[id(inst)] = _widen(own, inst.shape, inst.name, add, self.wide)
                continue
            copy = add(inst.name, inst.opcode, self.wide(inst.shape), operands, like=inst, exact_name=True)
            if inst.opcode == "custom-call" and inst.attr("custom_call_target") == F8_MATMUL:
                # (its result saturates to the program's fp8 type's range: f64 has another)
                copy.attrs = {**inst.attrs, PROGRAM_RESULT_TYPE: result_leaves(inst)[0].element_type.name}
            if inst.opcode == "constant" and has_float(inst.shape):
                copy._decoded = {"__literal__": widen(inst.literal, inst.shape, self.shadow.half_in_f32)}
            value[id(inst)] = copy
        for inst in made:
            for o in inst.operands:
                o.users.append(inst)
        root = value[id(comp.root)]
        root.is_root = True
        shadow = Computation(
            comp.name, made, root, is_entry=comp.is_entry, signature="", attrs=comp.attrs, line=comp.line
        )
        self.done[id(comp)] = shadow
        return shadow

    def _total_order(self, inst: Instruction, wide: Instruction, add) -> Instruction:
        """The total order by hand `inst` (`total_order_of`) of the shadow's float `wide`: the same instructions on
        the bits of its own width (the exact values' order, not their roundings' to the program's type, as a pinned
        bitcast's would be)."""
        negative, flipped, bits = inst.operands
        etype = ELEMENT_TYPES[f"s{wide.shape.element_type.bits}"]
        shape = replace(inst.shape, element_type=etype)
        own_bits = add(bits.name, bits.opcode, shape, [wide], like=bits)

        def operand(o, constant: int) -> Instruction:  # the bits, or the constant at the new width
            if o is bits:
                return own_bits
            made = add(o.name, "constant", shape, [], like=o)
            made._decoded = {"__literal__": np.asarray(constant, etype.numpy)}
            return made

        is_negative = add(
            negative.name, "compare", negative.shape, [operand(o, 0) for o in negative.operands], like=negative
        )
        largest = int(np.iinfo(etype.numpy).max)
        flip = add(flipped.name, "xor", shape, [operand(o, largest) for o in flipped.operands], like=flipped)
        return add(inst.name, "select", shape, [is_negative, flip, own_bits], like=inst, exact_name=True)

    def _called(self, inst: Instruction) -> dict:
        return {
            key: [self.computation(c) for c in called] if isinstance(called, list) else self.computation(called)
            for key, called in inst.called.items()
        }


def _total_orders(comp: Computation) -> tuple[dict[int, Instruction], set[int]]:
    """The total orders by hand (`ops.indexing.total_order_of`) in `comp` that only compares of two of them use (a
    sort's comparator): the shadow computes them at its own floats' width. Their selects (id -> the float) and the
    ids of their other instructions no other instruction uses (replaced)."""
    from ..ops.indexing import total_order_of

    orders = {id(i): x for i in comp.instructions if (x := total_order_of(i)) is not None}
    kept = False
    while not kept:  # (an order compared with one that is not rewritten keeps the program's width)
        kept = True
        for inst in comp.instructions:
            if id(inst) in orders and not all(
                u.opcode == "compare" and all(id(o) in orders for o in u.operands) for u in inst.users
            ):
                del orders[id(inst)]
                kept = False
    parts = {
        id(p): p
        for i in comp.instructions
        if id(i) in orders
        for p in (i.operands[0], i.operands[1], i.operands[2])
        if p.opcode != "constant"
    }
    kept = False
    while not kept:  # (a part another instruction uses stays)
        kept = True
        for k, p in list(parts.items()):
            if not all(id(u) in parts or id(u) in orders for u in p.users):
                del parts[k]
                kept = False
    return orders, set(parts)


def _narrow(wide: Instruction, shape: Shape, add, widened=shadow_shape) -> Instruction:
    """The shadow value `wide` rounded to the program's `shape` (converts leaf by leaf; `widened(shape)`: the
    shadow's shape of a program's)."""
    if wide.shape == shape:
        return wide
    if shape.is_tuple:
        leaves = [
            _narrow(
                add(f"{wide.name}.{i}", "get-tuple-element", widened(s), [wide], attrs={"index": str(i)}),
                s,
                add,
                widened,
            )
            for i, s in enumerate(shape.tuple_shapes)
        ]
        return add(f"{wide.name}.narrow", "tuple", shape, leaves)
    return add(f"{wide.name}.narrow", "convert", shape, [wide])


def _widen(own: Instruction, shape: Shape, name: str, add, widened=shadow_shape, exact: bool = True) -> Instruction:
    """`own`, a value of the program's `shape`, as the shadow holds it, named `name` (`exact`: that name, the
    original instruction's; else a fresh one)."""
    if not has_float(shape):
        if exact:
            own.name = name
        return own
    if shape.is_tuple:
        leaves = [
            _widen(
                add(f"{own.name}.{i}", "get-tuple-element", s, [own], attrs={"index": str(i)}),
                s,
                f"{name}.{i}.wide",
                add,
                widened,
                exact=False,
            )
            for i, s in enumerate(shape.tuple_shapes)
        ]
        return add(name, "tuple", widened(shape), leaves, exact_name=exact)
    return add(name, "convert", widened(shape), [own], exact_name=exact)


def _fresh(name: str, names: set) -> str:
    """`name`, or `name` with a number appended when the computation already has it."""
    candidate, k = name, 0
    while candidate in names:
        k += 1
        candidate = f"{name}.{k}"
    names.add(candidate)
    return candidate
