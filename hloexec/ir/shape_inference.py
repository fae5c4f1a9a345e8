"""Shape inference: the result shape of an instruction from its opcode, its operands' shapes and its decoded
attributes, as XLA's ShapeInference (xla/service/shape_inference.cc) computes it.

One meaning, two users: the parser fills in the shape of an instruction written without one
(`parser/build.py`, as XLA's parser does with `maybe_infer_shape`), and the op registry checks a written
shape against it before an op is prepared (`ops/registry.py`, as XLA's ShapeVerifier does).

    infer_shape(opcode, operand_shapes, attr) -> Shape     # attr(key) -> decoded value or None
    check_shape(opcode, operand_shapes, attr, declared) -> str | None   # why `declared` is not the result

Opcodes in INFERABLE have a rule; `infer_shape` raises ShapeInferenceError (a ValueError) saying why it
cannot infer (a missing or out-of-range attribute, operands that do not fit together). A few more opcodes
cannot be inferred but can be checked (CHECKED_ONLY: broadcast, reshape, convert, iota). Ops calling a computation
whose result type decides theirs (call, map, while, conditional, fusion, custom-call) have no rule here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NoReturn

from .attributes import WindowDim
from .opcodes import ELEMENTWISE_BINARY, ELEMENTWISE_UNARY
from .shape import Shape, array_shape, tuple_shape


class ShapeInferenceError(ValueError):
    """Why a result shape cannot be inferred from the operands and attributes given."""


class DimensionsError(ShapeInferenceError):
    """An attribute naming a dimension the operand does not have, or one twice, or operands whose dimensions
    (or kinds of element type: pred and f32) must match and do not: no shape is right (XLA's verifier rejects
    the instruction), so check_shape says so rather than leaving it to the op."""


Attr = Callable[[str], object]  # key -> decoded attribute value, None when absent


def _fail(message: str) -> NoReturn:
    raise ShapeInferenceError(message)


def _text(shape: Shape) -> str:
    return shape.to_text(layout=False)


def _array(shape: Shape, what: str) -> Shape:
    if shape.is_tuple or shape.element_type.kind == "token":
        _fail(f"{what} must be an array, is {_text(shape)}")
    return shape


def _required(attr: Attr, key: str):
    value = attr(key)
    if value is None:
        _fail(f"attribute {key} is missing")
    return value


def _like(shape: Shape, dims=None, type_name: str | None = None) -> Shape:
    """An array shape of `shape`'s element type (or `type_name`) and its dims (or `dims`), no layout."""
    return array_shape(type_name or shape.element_type.name, shape.dims if dims is None else dims)


def _same_dims(shapes: Sequence[Shape], what: str) -> None:
    first = shapes[0]
    for s in shapes[1:]:
        if s.dims != first.dims:
            raise DimensionsError(f"{what} have different dimensions: {_text(first)} and {_text(s)}")


def _same_type(shapes: Sequence[Shape], what: str) -> None:
    first = shapes[0]
    for s in shapes[1:]:
        if s.element_type is not first.element_type:
            message = f"{what} have different element types: {_text(first)} and {_text(s)}"
            if s.element_type.kind == first.element_type.kind == "float":  # mixed precision: left to the op
                _fail(message)
            raise DimensionsError(message)


def _dims_in_range(dims, rank: int, what: str) -> None:
    for d in dims:
        if not 0 <= d < rank:
            raise DimensionsError(f"{what} {d} is out of range for rank {rank}")
    if len(set(dims)) != len(dims):
        raise DimensionsError(f"{what} {list(dims)} repeats a dimension")


_COMPONENT = {"c64": "f32", "c128": "f64"}
_COMPLEX = {"f32": "c64", "f64": "c128"}


# -- elementwise -------------------------------------------------------------------------------------------
def _unary(opcode, ops, attr):
    (x,) = ops
    _array(x, "the operand")
    kind, name = x.element_type.kind, x.element_type.name
    if opcode in ("abs", "real", "imag") and kind == "complex":
        return _like(x, type_name=_COMPONENT[name])
    if opcode == "is-finite":
        return _like(x, type_name="pred")
    return _like(x)


def _binary(opcode, ops, attr):
    for x in ops:
        _array(x, "an operand")
    _same_dims(ops, "the operands")
    _same_type(ops, "the operands")
    x = ops[0]
    if opcode == "compare":
        return _like(x, type_name="pred")
    if opcode == "complex":
        if x.element_type.name not in _COMPLEX:
            _fail(f"complex takes f32 or f64 parts, not {x.element_type.name}")
        return _like(x, type_name=_COMPLEX[x.element_type.name])
    return _like(x)


def _select(opcode, ops, attr):
    pred, on_true, on_false = ops
    if on_true.is_tuple or on_false.is_tuple:
        if not on_true.same_dims_and_type(on_false):
            _fail(f"the branches differ: {_text(on_true)} and {_text(on_false)}")
        return on_true
    if pred.element_type.name != "pred":
        _fail(f"the selector must be pred, is {_text(pred)}")
    _same_dims([on_true, on_false], "the branches")
    _same_type([on_true, on_false], "the branches")
    if pred.rank and pred.dims != on_true.dims:
        _fail(f"the selector {_text(pred)} is neither a scalar nor of the branches' dimensions {_text(on_true)}")
    return _like(on_true)


def _clamp(opcode, ops, attr):
    lo, x, hi = (_array(s, "an operand") for s in ops)
    _same_type(ops, "the operands")
    for bound in (lo, hi):
        if bound.rank and bound.dims != x.dims:
            _fail(f"the bound {_text(bound)} is neither a scalar nor of the operand's dimensions {_text(x)}")
    return _like(x)


# -- movement ----------------------------------------------------------------------------------------------
def _tuple(opcode, ops, attr):
    return tuple_shape(ops)


def _get_tuple_element(opcode, ops, attr):
    (t,) = ops
    index = _required(attr, "index")
    if not t.is_tuple:
        _fail(f"the operand {_text(t)} is not a tuple")
    if not 0 <= index < len(t.tuple_shapes):
        _fail(f"index {index} is out of range for a tuple of {len(t.tuple_shapes)} elements")
    return t.tuple_shapes[index]


def _same_as_first(opcode, ops, attr):
    return ops[0]


def _transpose(opcode, ops, attr):
    x = _array(ops[0], "the operand")
    perm = _required(attr, "dimensions")
    if sorted(perm) != list(range(x.rank)):
        _fail(f"dimensions {list(perm)} are not a permutation of the operand's {x.rank} dimensions")
    return _like(x, [x.dims[p] for p in perm])


def _reverse(opcode, ops, attr):
    x = _array(ops[0], "the operand")
    _dims_in_range(_required(attr, "dimensions"), x.rank, "dimension")
    return _like(x)


def _slice(opcode, ops, attr):
    x = _array(ops[0], "the operand")
    spec = _required(attr, "slice")
    if len(spec) != x.rank:
        _fail(f"slice has {len(spec)} ranges for the operand's {x.rank} dimensions")
    dims = []
    for d, (r, n) in enumerate(zip(spec, x.dims)):
        if r.stride <= 0 or not 0 <= r.start <= r.limit <= n:
            _fail(f"slice [{r.start}:{r.limit}:{r.stride}] of dimension {d} (size {n}) is out of bounds")
        dims.append(len(range(r.start, r.limit, r.stride)))
    return _like(x, dims)


def _dynamic_slice(opcode, ops, attr):
    x = _array(ops[0], "the operand")
    sizes = _required(attr, "dynamic_slice_sizes")
    if len(sizes) != x.rank or any(not 0 <= s <= n for s, n in zip(sizes, x.dims)):
        _fail(f"dynamic_slice_sizes {list(sizes)} do not fit the operand {_text(x)}")
    return _like(x, sizes)


def _dynamic_update_slice(opcode, ops, attr):
    x, update = _array(ops[0], "the operand"), _array(ops[1], "the update")
    if update.rank != x.rank or any(u > n for u, n in zip(update.dims, x.dims)):
        _fail(f"the update {_text(update)} does not fit in the operand {_text(x)}")
    _same_type([x, update], "the operand and the update")
    return _like(x)


def _pad(opcode, ops, attr):
    x, value = _array(ops[0], "the operand"), _array(ops[1], "the padding value")
    padding = _required(attr, "padding")
    if value.rank:
        _fail(f"the padding value {_text(value)} is not a scalar")
    if len(padding) != x.rank:
        _fail(f"padding has {len(padding)} entries for the operand's {x.rank} dimensions")
    dims = []
    for n, p in zip(x.dims, padding):
        if p.interior < 0:
            _fail(f"interior padding {p.interior} is negative")
        d = p.low + p.high + n + max(n - 1, 0) * p.interior
        if d < 0:
            _fail(f"padding {p.low}_{p.high}_{p.interior} of a dimension of size {n} leaves {d} elements")
        dims.append(d)
    return _like(x, dims)


def _concatenate(opcode, ops, attr):
    for s in ops:
        _array(s, "an operand")
    dims = _required(attr, "dimensions")
    if len(dims) != 1:
        _fail(f"dimensions {list(dims)}: concatenate takes one dimension")
    (axis,) = dims
    first = ops[0]
    _dims_in_range(dims, first.rank, "dimension")
    _same_type(ops, "the operands")
    for s in ops[1:]:
        if s.rank != first.rank or any(a != b for k, (a, b) in enumerate(zip(s.dims, first.dims)) if k != axis):
            raise DimensionsError(f"operands {_text(first)} and {_text(s)} differ outside dimension {axis}")
    out = list(first.dims)
    out[axis] = sum(s.dims[axis] for s in ops)
    return _like(first, out)


# -- reductions and windows --------------------------------------------------------------------------------
def _halves(ops, what: str):
    if not ops or len(ops) % 2:
        _fail(f"expects an even number of operands (inputs, then their init values), has {len(ops)}")
    n = len(ops) // 2
    inputs, inits = ops[:n], ops[n:]
    for s in inputs:
        _array(s, what)
    for s in inits:
        if _array(s, "an init value").rank:
            _fail(f"the init value {_text(s)} is not a scalar")
    _same_dims(inputs, "the inputs")
    return inputs, inits


def _results(dims, inits) -> Shape:
    shapes = [_like(init, dims) for init in inits]
    return shapes[0] if len(shapes) == 1 else tuple_shape(shapes)


def _reduce(opcode, ops, attr):
    inputs, inits = _halves(ops, "an input")
    reduced = _required(attr, "dimensions")
    x = inputs[0]
    _dims_in_range(reduced, x.rank, "dimension")
    return _results([n for d, n in enumerate(x.dims) if d not in reduced], inits)


def window_output_size(n: int, w: WindowDim) -> int:
    """The output size of one window dimension over an input dimension of size `n` (base dilation, padding,
    window dilation, stride: XLA's InferWindowOutputShape)."""
    padded = (n - 1) * w.base_dilation + 1 + w.pad_low + w.pad_high if n else w.pad_low + w.pad_high
    return window_count(padded, w.size, w.stride, w.window_dilation)


def window_count(padded: int, size: int, stride: int, window_dilation: int) -> int:
    """How many windows of `size` (dilated by `window_dilation`) fit at `stride` in a dimension of `padded`
    positions (padding and base dilation included)."""
    span = (size - 1) * window_dilation + 1
    return 0 if padded < span else (padded - span) // stride + 1


def _window(attr, rank: int):
    window = attr("window") or ()
    if len(window) != rank:
        _fail(f"the window has {len(window)} dimensions, the input {rank}")
    for w in window:
        if w.size <= 0 or w.stride <= 0 or w.base_dilation <= 0 or w.window_dilation <= 0:
            _fail(f"window dimension {w} has a size, stride or dilation below 1")
    return window


def _reduce_window(opcode, ops, attr):
    inputs, inits = _halves(ops, "an input")
    x = inputs[0]
    return _results([window_output_size(n, w) for n, w in zip(x.dims, _window(attr, x.rank))], inits)


def _select_and_scatter(opcode, ops, attr):
    return _like(_array(ops[0], "the operand"))


# -- contractions --------------------------------------------------------------------------------------------
def _dot(opcode, ops, attr):
    lhs, rhs = _array(ops[0], "lhs"), _array(ops[1], "rhs")
    lb, rb = attr("lhs_batch_dims") or (), attr("rhs_batch_dims") or ()
    lc, rc = attr("lhs_contracting_dims") or (), attr("rhs_contracting_dims") or ()
    _dims_in_range(lb + lc, lhs.rank, "lhs dimension")
    _dims_in_range(rb + rc, rhs.rank, "rhs dimension")
    for what, ld, rd in (("batch", lb, rb), ("contracting", lc, rc)):
        if len(ld) != len(rd) or any(lhs.dims[a] != rhs.dims[b] for a, b in zip(ld, rd)):
            _fail(f"{what} dimensions {list(ld)} of {_text(lhs)} and {list(rd)} of {_text(rhs)} differ")
    dims = [lhs.dims[d] for d in lb]
    dims += [n for d, n in enumerate(lhs.dims) if d not in lb and d not in lc]
    dims += [n for d, n in enumerate(rhs.dims) if d not in rb and d not in rc]
    return _like(lhs, dims)


def _convolution(opcode, ops, attr):
    lhs, rhs = _array(ops[0], "lhs"), _array(ops[1], "rhs")
    dn = _required(attr, "dim_labels")
    if len(dn.input_spatial) + 2 != lhs.rank or len(dn.kernel_spatial) + 2 != rhs.rank:
        _fail(f"dim_labels do not fit lhs {_text(lhs)} and rhs {_text(rhs)}")
    window = _window(attr, len(dn.input_spatial))
    batch_groups = attr("batch_group_count") or 1
    feature_groups = attr("feature_group_count") or 1
    if lhs.dims[dn.input_feature] != rhs.dims[dn.kernel_input_feature] * feature_groups:
        _fail(
            f"lhs feature dimension {lhs.dims[dn.input_feature]} is not the kernel's input features "
            f"{rhs.dims[dn.kernel_input_feature]} times feature_group_count {feature_groups}"
        )
    if lhs.dims[dn.input_batch] % batch_groups:
        _fail(f"lhs batch dimension {lhs.dims[dn.input_batch]} is not a multiple of batch_group_count {batch_groups}")
    dims = [0] * lhs.rank
    dims[dn.output_batch] = lhs.dims[dn.input_batch] // batch_groups
    dims[dn.output_feature] = rhs.dims[dn.kernel_output_feature]
    for out, inp, w in zip(dn.output_spatial, dn.input_spatial, window):
        dims[out] = window_output_size(lhs.dims[inp], w)
    return _like(lhs, dims)


# -- indexing ------------------------------------------------------------------------------------------------
def _gather(opcode, ops, attr):
    x, indices = _array(ops[0], "the operand"), _array(ops[1], "the start indices")
    offset_dims = _required(attr, "offset_dims")
    collapsed = _required(attr, "collapsed_slice_dims")
    index_vector_dim = _required(attr, "index_vector_dim")
    sizes = _required(attr, "slice_sizes")
    operand_batching = attr("operand_batching_dims") or ()
    if len(sizes) != x.rank or any(not 0 <= s <= n for s, n in zip(sizes, x.dims)):
        _fail(f"slice_sizes {list(sizes)} do not fit the operand {_text(x)}")
    _dims_in_range(collapsed + operand_batching, x.rank, "collapsed or batching dimension")
    _dims_in_range(attr("start_index_map") or (), x.rank, "start_index_map dimension")
    if not 0 <= index_vector_dim <= indices.rank:
        _fail(f"index_vector_dim {index_vector_dim} is out of range for indices {_text(indices)}")
    batch = [n for d, n in enumerate(indices.dims) if d != index_vector_dim]
    offsets = [s for d, s in enumerate(sizes) if d not in collapsed and d not in operand_batching]
    rank = len(batch) + len(offset_dims)
    if len(offsets) != len(offset_dims):
        _fail(f"offset_dims {list(offset_dims)} name {len(offset_dims)} dimensions, the slice keeps {len(offsets)}")
    _dims_in_range(offset_dims, rank, "offset dimension")
    offsets_at = dict(zip(sorted(offset_dims), offsets))
    batch_iter = iter(batch)
    return _like(x, [offsets_at[d] if d in offsets_at else next(batch_iter) for d in range(rank)])


def _scatter(opcode, ops, attr):
    if len(ops) < 3 or len(ops) % 2 == 0:
        _fail(f"expects an odd number of operands (inputs, indices, updates), has {len(ops)}")
    n = (len(ops) - 1) // 2
    inputs = [_array(s, "an input") for s in ops[:n]]
    _same_dims(inputs, "the inputs")
    _dims_in_range(attr("scatter_dims_to_operand_dims") or (), inputs[0].rank, "scatter_dims_to_operand_dims dimension")
    _dims_in_range(
        (attr("inserted_window_dims") or ()) + (attr("input_batching_dims") or ()),
        inputs[0].rank,
        "inserted window or batching dimension",
    )
    return inputs[0] if n == 1 else tuple_shape(inputs)


def _sort(opcode, ops, attr):
    for s in ops:
        _array(s, "an operand")
    _same_dims(ops, "the operands")
    return _like(ops[0]) if len(ops) == 1 else tuple_shape([_like(s) for s in ops])


def _topk(opcode, ops, attr):
    x = _array(ops[0], "the operand")
    k = _required(attr, "k")
    if not x.rank or not 0 <= k <= x.dims[-1]:
        _fail(f"k={k} does not fit the operand {_text(x)}")
    dims = (*x.dims[:-1], k)
    return tuple_shape([_like(x, dims), _like(x, dims, "s32")])


# -- linear algebra, fft, batch norm -------------------------------------------------------------------------
def _fft(opcode, ops, attr):
    x = _array(ops[0], "the operand")
    kind, length = _required(attr, "fft_type"), _required(attr, "fft_length")
    if not 1 <= len(length) <= min(3, x.rank):
        _fail(f"fft_length {list(length)} does not fit the operand {_text(x)}")
    name = x.element_type.name
    if kind in ("FFT", "IFFT"):
        if name not in _COMPONENT:
            _fail(f"{kind} takes a complex operand, not {name}")
        return _like(x)
    if kind == "RFFT":
        if name not in _COMPLEX:
            _fail(f"RFFT takes an f32 or f64 operand, not {name}")
        return _like(x, (*x.dims[:-1], length[-1] // 2 + 1), _COMPLEX[name])
    if kind == "IRFFT":
        if name not in _COMPONENT:
            _fail(f"IRFFT takes a complex operand, not {name}")
        return _like(x, (*x.dims[:-1], length[-1]), _COMPONENT[name])
    _fail(f"unknown fft_type {kind}")


def _triangular_solve(opcode, ops, attr):
    return _like(_array(ops[1], "b"))


def _batch_norm(opcode, ops, attr):
    x = _array(ops[0], "the operand")
    feature = _required(attr, "feature_index")
    if not 0 <= feature < x.rank:
        _fail(f"feature_index {feature} is out of range for the operand {_text(x)}")
    if opcode == "batch-norm-inference":
        return _like(x)
    per_feature = _like(x, (x.dims[feature],))
    return tuple_shape([_like(x), per_feature, per_feature])


def _scalar(type_name: str):
    return lambda opcode, ops, attr: array_shape(type_name)


RULES: dict[str, Callable] = {
    **{o: _unary for o in ELEMENTWISE_UNARY - {"convert", "bitcast-convert", "copy"}},
    **{o: _binary for o in ELEMENTWISE_BINARY},
    "copy": _same_as_first,
    "select": _select,
    "clamp": _clamp,
    "tuple": _tuple,
    "get-tuple-element": _get_tuple_element,
    "optimization-barrier": _same_as_first,
    "opt-barrier": _same_as_first,
    "domain": _same_as_first,
    "add-dependency": _same_as_first,
    "cholesky": _same_as_first,
    "transpose": _transpose,
    "reverse": _reverse,
    "slice": _slice,
    "dynamic-slice": _dynamic_slice,
    "dynamic-update-slice": _dynamic_update_slice,
    "pad": _pad,
    "concatenate": _concatenate,
    "reduce": _reduce,
    "reduce-window": _reduce_window,
    "select-and-scatter": _select_and_scatter,
    "dot": _dot,
    "convolution": _convolution,
    "gather": _gather,
    "scatter": _scatter,
    "sort": _sort,
    "topk": _topk,
    "fft": _fft,
    "triangular-solve": _triangular_solve,
    "batch-norm-training": _batch_norm,
    "batch-norm-inference": _batch_norm,
    "batch-norm-grad": _batch_norm,
    "after-all": _scalar("token"),
    "partition-id": _scalar("u32"),
    "replica-id": _scalar("u32"),
}
INFERABLE = frozenset(RULES)
# Ops whose written result type may differ from the operands' (preferred_element_type, lost in text): their
# shape is checked by dimensions only.
RESULT_TYPE_FREE = frozenset({"dot", "convolution"})


def infer_shape(opcode: str, operands: Sequence[Shape], attr: Attr) -> Shape:
    """The result shape of `opcode` on `operands` with attributes `attr` (ShapeInferenceError if it cannot be
    inferred: no rule for the opcode, a missing attribute, operands that do not fit)."""
    rule = RULES.get(opcode)
    if rule is None:
        _fail(f"{opcode} has no shape rule")
    return rule(opcode, list(operands), attr)


# -- checking a written shape ------------------------------------------------------------------------------
def _check_broadcast(ops, attr, declared) -> str | None:
    x = ops[0]
    dims = attr("dimensions") or ()
    if len(dims) != x.rank or any(not 0 <= d < declared.rank for d in dims):
        return f"dimensions {list(dims)} do not map the operand {_text(x)} into {declared.rank} dimensions"
    # a dimension of size 1 stretching (XLA's verifier wants equal sizes; hloexec runs it, as mhlo import tests write it)
    if any(x.dims[k] not in (1, declared.dims[d]) for k, d in enumerate(dims)):
        return f"operand {_text(x)} does not fit dimensions {list(dims)} of the result"
    return None if x.element_type is declared.element_type else f"the operand {_text(x)} is of another type"


def _check_reshape(ops, attr, declared) -> str | None:
    x = ops[0]
    if x.size != declared.size:
        return f"the operand {_text(x)} has {x.size} elements, the result {declared.size}"
    return None if x.element_type is declared.element_type else f"the operand {_text(x)} is of another type"


def _check_convert(ops, attr, declared) -> str | None:
    return None if ops[0].dims == declared.dims else f"the operand {_text(ops[0])} has other dimensions"


def _check_iota(ops, attr, declared) -> str | None:
    d = attr("iota_dimension")
    return None if d is not None and 0 <= d < max(declared.rank, 1) else f"iota_dimension {d} is out of range"


def _compatible_ignoring_fp_precision(a: Shape, b: Shape) -> bool:
    """Equal up to layouts and float precisions (XLA's ShapeUtil::CompatibleIgnoringFpPrecision)."""
    if a.is_tuple or b.is_tuple:
        return (
            a.is_tuple
            and b.is_tuple
            and len(a.tuple_shapes) == len(b.tuple_shapes)
            and all(map(_compatible_ignoring_fp_precision, a.tuple_shapes, b.tuple_shapes))
        )
    return a.dims == b.dims and (
        a.element_type is b.element_type or a.element_type.kind == b.element_type.kind == "float"
    )


def check_call(inst, called) -> str | None:
    """Why a fusion or call `inst`, whose result is that of the computation it calls (`called`; no rule of its
    own), does not fit it: its operands against the parameters, its shape against the root (element types and
    dimensions, not layouts: XLA's verifier's ShapeUtil::Compatible), or None."""
    operands, parameters = inst.operands, called.parameters
    if len(operands) != len(parameters):
        return f"{len(operands)} operands for a computation of {len(parameters)} parameters"
    for k, (operand, parameter) in enumerate(zip(operands, parameters)):
        if not operand.shape.same_dims_and_type(parameter.shape):
            return f"operand {k} is {_text(operand.shape)}, parameter {k} {_text(parameter.shape)}"
    if not inst.shape.same_dims_and_type(called.root.shape):
        return f"its root is {_text(called.root.shape)}"
    return None


CHECKED_ONLY: dict[str, Callable] = {
    "broadcast": _check_broadcast,
    "reshape": _check_reshape,
    "convert": _check_convert,
    "iota": _check_iota,
}


def check_shape(opcode: str, operands: Sequence[Shape], attr: Attr, declared: Shape) -> str | None:
    """Why `declared` is not the shape `opcode` gives on `operands` with `attr`, or None when it is (or when
    there is no rule to say: an opcode without one, or operands and attributes it cannot infer from, which the
    op itself rejects; but dimensions out of range or repeated are said). Layouts are not compared, nor float precisions (XLA's verifier with mixed precision
    allowed, as TPU dumps need it: bf16[] multiply(f32[], f32[])); dot and convolution results by dimensions only."""
    check = CHECKED_ONLY.get(opcode)
    if check is not None:
        if declared.is_tuple or any(o.is_tuple for o in operands):
            return None
        return check(list(operands), attr, declared)
    if opcode not in RULES:
        return None
    try:
        inferred = infer_shape(opcode, operands, attr)
    except DimensionsError as e:
        return str(e)
    except ShapeInferenceError:
        return None
    if opcode in RESULT_TYPE_FREE and not declared.is_tuple:
        same = inferred.dims == declared.dims
    else:
        same = _compatible_ignoring_fp_precision(inferred, declared)
    return None if same else f"{opcode} of {', '.join(map(_text, operands)) or 'no operands'} gives {_text(inferred)}"
