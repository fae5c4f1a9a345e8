"""The op vocabulary: named groups of HLO opcodes, as XLA classifies them (HloInstruction::IsElementwise,
HasSideEffectNoRecurse, ...). Every layer asks these groups rather than spelling its own set of strings.

What a tier *implements* is not here: the fusion and loop generators cover a subset of the elementwise ops
(kernels/elementwise.py: UNARY_OPS, BINARY_OPS, ELEMENTWISE_OPS), the op registry all of them.
"""

from __future__ import annotations

# Elementwise: each result element is a function of the operands' elements at the same index.
ELEMENTWISE_UNARY = frozenset(
    {
        "abs",
        "bitcast-convert",
        "cbrt",
        "ceil",
        "convert",
        "copy",
        "cosine",
        "count-leading-zeros",
        "erf",
        "exponential",
        "exponential-minus-one",
        "floor",
        "imag",
        "is-finite",
        "log",
        "log-plus-one",
        "logistic",
        "negate",
        "not",
        "popcnt",
        "real",
        "reduce-precision",
        "round-nearest-afz",
        "round-nearest-even",
        "rsqrt",
        "sign",
        "sine",
        "sqrt",
        "tan",
        "tanh",
    }
)
ELEMENTWISE_BINARY = frozenset(
    {
        "add",
        "and",
        "atan2",
        "compare",
        "complex",
        "divide",
        "maximum",
        "minimum",
        "mulhi",
        "multiply",
        "or",
        "power",
        "remainder",
        "shift-left",
        "shift-right-arithmetic",
        "shift-right-logical",
        "subtract",
        "xor",
    }
)
ELEMENTWISE_TERNARY = frozenset({"clamp", "select"})
ELEMENTWISE = ELEMENTWISE_UNARY | ELEMENTWISE_BINARY | ELEMENTWISE_TERNARY

# The operand counts XLA's parser accepts (hlo_parser.cc CreateInstruction: ParseOperands with an expected size;
# reduce and reduce-window pairs, scatter's odd count): (least, most or None, step). Opcodes not listed take any
# number (tuple, call, fusion, custom-call, async-start, after-all, scan, ...).
OPERAND_COUNTS: dict[str, tuple[int, int | None, int]] = {
    **{o: (1, 1, 1) for o in ELEMENTWISE_UNARY},
    **{o: (2, 2, 1) for o in ELEMENTWISE_BINARY},
    **{o: (3, 3, 1) for o in ELEMENTWISE_TERNARY},
    **{o: (0, 0, 1) for o in ("constant", "iota", "partition-id", "replica-id", "rng-get-and-update-state")},
    **{
        o: (1, 1, 1)
        for o in (
            "bitcast",
            "reshape",
            "transpose",
            "broadcast",
            "reverse",
            "slice",
            "get-dimension-size",
            "copy-start",
            "copy-done",
            "fft",
            "cholesky",
            "get-tuple-element",
            "topk",
            "opt-barrier",
            "optimization-barrier",
            "domain",
            "infeed",
            "recv",
            "send-done",
            "recv-done",
            "all-reduce-done",
            "all-gather-done",
            "collective-permute-done",
            "async-update",
            "async-done",
            "while",
            "rng-bit-generator",
        )
    },
    **{
        o: (2, 2, 1)
        for o in (
            "pad",
            "gather",
            "triangular-solve",
            "add-dependency",
            "send",
            "set-dimension-size",
            "stochastic-convert",
            "outfeed",
            "convolution",
        )
    },
    **{o: (3, 3, 1) for o in ("batch-norm-training", "select-and-scatter", "ragged-dot")},
    "scaled-dot": (4, 4, 1),
    "batch-norm-inference": (5, 5, 1),
    "batch-norm-grad": (5, 5, 1),
    "ragged-all-to-all": (6, 6, 1),
    "dot": (2, 4, 1),  # a sparse dot adds its metadata operands
    "rng": (2, 3, 1),  # StableHLO's rng may add the result's dims
    **{
        o: (1, None, 1)
        for o in (
            "dynamic-slice",
            "concatenate",
            "sort",
            "conditional",
            "map",
            "all-reduce",
            "all-reduce-start",
            "all-gather",
            "all-gather-start",
            "reduce-scatter",
            "all-to-all",
            "collective-broadcast",
            "collective-permute",
            "collective-permute-start",
            "dynamic-reshape",
        )
    },
    "dynamic-update-slice": (2, None, 1),
    "reduce": (2, None, 2),
    "reduce-window": (2, None, 2),
    "scatter": (3, None, 2),
}


def elementwise_arity(opcode: str) -> int:
    """The operand count of elementwise op `opcode`."""
    return OPERAND_COUNTS[opcode][0]


# Movement: each result element is one operand element (or a padding value); only the index changes.
MOVEMENT = frozenset(
    {"broadcast", "bitcast", "concatenate", "copy", "dynamic-slice", "pad", "reshape", "reverse", "slice", "transpose"}
)

# Transcendental: unary float functions computed by approximation (libm, numpy's SIMD, XLA's own polynomials):
# their results may differ in the last bits between implementations.
TRANSCENDENTAL_UNARY = frozenset(
    {
        "cbrt",
        "exponential",
        "exponential-minus-one",
        "log",
        "log-plus-one",
        "logistic",
        "sine",
        "cosine",
        "tan",
        "tanh",
        "erf",
    }
)

# Pure: the value depends on the operands alone (no device id, randomness, side effect or called computation
# that could hold one): parameter-independent operands give the same value on every run, so it may be computed
# once (exec/plan.py folds it; kernels/program.py hoists it out of a loop).
PURE = ELEMENTWISE | MOVEMENT | frozenset({"constant", "iota", "reduce", "dot", "gather", "tuple", "get-tuple-element"})

# Pass-through: the result is the operand (or operands) unchanged; the op only orders or marks the schedule.
PASS_THROUGH = frozenset({"opt-barrier", "optimization-barrier", "copy-start", "copy-done", "domain", "add-dependency"})

# View: hloexec's kernel returns (part of) an operand's buffer rather than a new one (ops/movement.py; a
# layout-changing bitcast is the exception, exec/memory.py:_returns_view).
VIEW = frozenset(
    {
        "tuple",
        "get-tuple-element",
        "bitcast",
        "reshape",
        "copy",
        "opt-barrier",
        "optimization-barrier",
        "add-dependency",
        "after-all",
        "parameter",
    }
)

# Side-effecting: HloInstruction::HasSideEffectNoRecurse's opcodes, plus rng and rng-get-and-update-state, which
# older XLA lists (the latter advances its state on every run, dead or not).
SIDE_EFFECTING = frozenset(
    {
        "send",
        "send-done",
        "recv",
        "recv-done",
        "infeed",
        "outfeed",
        "rng",
        "rng-get-and-update-state",
        "all-reduce-start",
        "all-reduce-done",
        "all-gather-start",
        "all-gather-done",
        "collective-broadcast",
        "collective-permute-start",
        "collective-permute-done",
    }
)
# The collectives exchanging values between participants, in their sync and async forms (send / recv and
# ragged-all-to-all apart).
COLLECTIVES = frozenset(
    {
        "all-reduce",
        "all-reduce-start",
        "all-reduce-done",
        "all-gather",
        "all-gather-start",
        "all-gather-done",
        "reduce-scatter",
        "all-to-all",
        "collective-permute",
        "collective-permute-start",
        "collective-permute-done",
        "collective-broadcast",
    }
)
# Collectives that have a side effect when they carry a channel_id or constrain_layout.
CHANNEL_COLLECTIVES = frozenset(
    {"all-reduce", "all-gather", "all-to-all", "ragged-all-to-all", "reduce-scatter", "collective-permute"}
)

# Reducers recognized by their root: a computation op(p0, p1) of one of these is that reduction.
REDUCER_OPS = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})


def reducer_opcode(comp) -> str | None:
    """The opcode of computation `comp` if it is op(p0, p1) or op(p1, p0) of an op in REDUCER_OPS -- then a
    reduction by it is that op's fold -- else None (a general reducer, applied as a computation)."""
    params, root = comp.parameters, comp.root
    if (
        len(params) == 2
        and root.opcode in REDUCER_OPS
        and len(root.operands) == 2
        and {id(o) for o in root.operands} == {id(p) for p in params}
    ):
        return root.opcode
    return None


def converted_reducer(comp) -> tuple | None:
    """(op, converts) where computation `comp` is convert(... convert(op(p0, p1))) of an op in REDUCER_OPS on floats,
    its converts (in the order they apply) between float types and back to the parameters' type: XLA:CPU's float
    normalization of a bf16 reduce-window (the op in f32, every step rounded to bf16 and back; the shadow's converts
    are f64's identity). A reduction by it folds op, each step's result converted in turn; else None."""
    params, root, converts = comp.parameters, comp.root, []
    while root.opcode == "convert":
        converts.append(root)
        root = root.operands[0]
    if (
        not converts
        or len(params) != 2
        or root.opcode not in REDUCER_OPS
        or len(root.operands) != 2
        or {id(o) for o in root.operands} != {id(p) for p in params}
        or any(i.shape.rank != 0 or i.shape.element_type.kind != "float" for i in (*params, root, *converts))
        or comp.root.shape.element_type != params[0].shape.element_type
    ):
        return None
    return root, converts[::-1]


def separate_reducer_opcodes(comp, n: int) -> list[str] | None:
    """The opcodes of a variadic reducer `comp` (of n inputs) whose k-th result is op_k(p_k, p_{n+k}) or
    op_k(p_{n+k}, p_k) of an op in REDUCER_OPS, for every k -- its results computed apart, a reduction by it n
    reductions, one by each op -- else None."""
    params, root = comp.parameters, comp.root
    if n < 2 or len(params) != 2 * n or root.opcode != "tuple" or len(root.operands) != n:
        return None
    ops = []
    for k, out in enumerate(root.operands):
        if out.opcode not in REDUCER_OPS or {id(o) for o in out.operands} != {id(params[k]), id(params[n + k])}:
            return None
        ops.append(out.opcode)
    return ops
