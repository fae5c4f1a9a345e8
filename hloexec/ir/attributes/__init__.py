"""Decoded forms of HLO attributes, and the decoders from their raw text.

`decode_attribute(key, raw, inst)` is what `Instruction.attr(key)` calls on first use. Each key maps to
one decoder (the table at the end of this module); a key with no decoder returns its raw text unchanged (unknown
attributes are kept, never rejected). The grammar of each value follows xla/hlo/parser/hlo_parser.cc. The decoded
value types are in values.py, the lexical layer (integers, strings, the tokenizer) in syntax.py; the decoders by
kind: windows.py (slices, paddings, windows, dim labels), shardings.py (replica groups, pairs, shardings),
metadata.py (metadata, frontend attributes, backend config), and here the aliases, lists and the module's
layout.
"""

from __future__ import annotations

from ..shape import parse_shape
from .metadata import decode_backend_config, decode_frontend_attributes, decode_metadata
from .shardings import AxisRef, decode_pairs, decode_replica_groups, decode_sharding, named_sharding
from .syntax import AttributeSyntaxError, _Bad, _bool, _IDENT, _int, _int_list, _Tokens, _word, unescape
from .values import (
    ConvDims,
    DotDims,
    GatherDims,
    InputOutputAlias,
    OutputOperandAlias,
    PadDim,
    ReplicaGroups,
    ScatterDims,
    Sharding,
    SliceDim,
    WindowDim,
)
from .windows import decode_dim_labels, decode_padding, decode_slice, decode_window

__all__ = [
    "decode_attribute",
    "DECODERS",
    "AttributeSyntaxError",
    "unescape",
    "ConvDims",
    "DotDims",
    "GatherDims",
    "InputOutputAlias",
    "OutputOperandAlias",
    "PadDim",
    "ReplicaGroups",
    "ScatterDims",
    "Sharding",
    "SliceDim",
    "WindowDim",
    "AxisRef",
    "named_sharding",
    "decode_sharding",
    "decode_pairs",
    "decode_replica_groups",
    "decode_slice",
    "decode_padding",
    "decode_window",
    "decode_dim_labels",
    "decode_metadata",
    "decode_frontend_attributes",
    "decode_backend_config",
    "dot_dims",
    "gather_dims",
    "scatter_dims",
    "INT_LIST_KEYS",
    "INT_KEYS",
    "BOOL_KEYS",
    "WORD_KEYS",
]


# -- the decoders ------------------------------------------------------------------
def decode_attribute(key: str, raw: str, inst):
    """Decode one attribute's raw text; unknown keys come back as raw text."""
    decoder = DECODERS.get(key)
    return raw if decoder is None else decoder(raw)


DECODERS: dict = {}  # key -> function(raw text) -> decoded value; filled below


def _shape_index(t: _Tokens) -> tuple[int, ...]:
    return t.int_list()


def _alias_entries(raw: str, with_kind: bool):
    """`{ {0}: (1, {1}[, may-alias]), ... }` -> (output index, number, index, kind) per entry."""
    t = _Tokens(raw)
    t.expect("{")
    out = []
    while not t.eat("}"):
        output = _shape_index(t)
        t.expect(":")
        t.expect("(")
        number = t.int()
        t.expect(",")
        index = _shape_index(t)
        kind = "may-alias"
        if with_kind and t.eat(","):
            kind = t.expect("ident")
            if kind not in ("may-alias", "must-alias"):
                raise _Bad("unexpected aliasing kind; expected may-alias or must-alias")
        t.expect(")")
        out.append((output, number, index, kind))
        if not t.eat(","):
            t.expect("}")
            break
    t.done()
    return out


def decode_output_to_operand_aliasing(raw: str) -> tuple[OutputOperandAlias, ...]:
    """`{{0}: (1, {1}), {}: (2, {})}`."""
    return tuple(OutputOperandAlias(o, n, i) for o, n, i, _ in _alias_entries(raw, with_kind=False))


def decode_input_output_alias(raw: str) -> tuple[InputOutputAlias, ...]:
    """Module header `{ {0}: (0, {}, may-alias), {1}: (1, {}) }`."""
    return tuple(InputOutputAlias(o, n, i, k) for o, n, i, k in _alias_entries(raw, with_kind=True))


def decode_buffer_donor(raw: str) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Module header `{ (0, {}), (1, {}) }` -> ((param, shape_index), ...)."""
    t = _Tokens(raw)
    t.expect("{")
    out = []
    while not t.eat("}"):
        t.expect("(")
        param = t.int()
        t.expect(",")
        index = _shape_index(t)
        t.expect(")")
        out.append((param, index))
        if not t.eat(","):
            t.expect("}")
            break
    t.done()
    return tuple(out)


def decode_instruction_names(raw: str) -> tuple[str, ...]:
    """control-predecessors `{%a, %b}` -> ('a', 'b')."""
    t = _Tokens(raw)
    t.expect("{")
    out = []
    while True:
        kind, val = t.next()
        if kind not in ("name", "ident"):
            raise _Bad("expects an instruction name")
        out.append(val.lstrip("%"))
        if t.eat("}"):
            break
        t.expect(",")
    t.done()
    return tuple(out)


def decode_word_list(raw: str) -> tuple[str, ...]:
    """operand_precision `{default, highest}`."""
    s = raw.strip()
    if not (s.startswith("{") and s.endswith("}")):
        raise _Bad("expects '{' ... '}'")
    items = [x.strip() for x in s[1:-1].split(",")]
    if items == [""]:
        return ()
    for x in items:
        if not _IDENT.match(x):
            raise _Bad(f"expects a precision name, sees {x!r}")
    return tuple(items)


def decode_bool_list(raw: str) -> tuple[bool, ...] | bool:
    """parameter_replication / allow_spmd_* `{true,false}` or a single bool."""
    s = raw.strip()
    if s in ("true", "false"):
        return s == "true"
    if not (s.startswith("{") and s.endswith("}")):
        raise _Bad("expects a list of booleans or true/false")
    items = [x.strip() for x in s[1:-1].split(",")]
    if items == [""]:
        return ()
    return tuple(_bool(x) for x in items)


def decode_computation_layout(raw: str):
    """entry_computation_layout `{(f32[8]{0}, s32[])->f32[8]{0}}` -> ((param shapes), result shape)."""
    s = raw.strip()
    if not (s.startswith("{") and s.endswith("}")):
        raise _Bad("expects '{' at the start of the computation layout")
    body = s[1:-1].strip()
    if not body.startswith("("):
        raise _Bad("expects ( before parameter shape list")
    depth = 0
    for i, c in enumerate(body):
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
            if depth == 0:
                break
    else:
        raise _Bad("unbalanced '(' in parameter shape list")
    params, rest = body[: i + 1], body[i + 1 :].strip()
    if not rest.startswith("->"):
        raise _Bad("expects -> before result shape")
    return parse_shape(params).tuple_shapes, parse_shape(rest[2:].strip())


# -- op-level helpers --------------------------------------------------------------
def dot_dims(inst) -> DotDims:
    """Dot dimension numbers from lhs/rhs_batch_dims and lhs/rhs_contracting_dims."""
    return DotDims(
        inst.attr("lhs_batch_dims", ()),
        inst.attr("rhs_batch_dims", ()),
        inst.attr("lhs_contracting_dims", ()),
        inst.attr("rhs_contracting_dims", ()),
    )


def _required(inst, key):
    """A decoded attribute XLA's parser requires (as its `required=true` AttrConfig): missing is a parse error."""
    v = inst.attr(key)
    if v is None:
        raise inst.parse_error(f"attribute {key} is expected but not seen")
    return v


def gather_dims(inst) -> GatherDims:
    return GatherDims(
        _required(inst, "offset_dims"),
        _required(inst, "collapsed_slice_dims"),
        _required(inst, "start_index_map"),
        _required(inst, "index_vector_dim"),
        _required(inst, "slice_sizes"),
        inst.attr("operand_batching_dims", ()),
        inst.attr("start_indices_batching_dims", ()),
        inst.attr("indices_are_sorted", False),
    )


def scatter_dims(inst) -> ScatterDims:
    return ScatterDims(
        _required(inst, "update_window_dims"),
        _required(inst, "inserted_window_dims"),
        _required(inst, "scatter_dims_to_operand_dims"),
        _required(inst, "index_vector_dim"),
        inst.attr("input_batching_dims", ()),
        inst.attr("scatter_indices_batching_dims", ()),
        inst.attr("indices_are_sorted", False),
        inst.attr("unique_indices", False),
    )


# -- the table ------------------------------------------------------------------------
INT_LIST_KEYS = (
    "dimensions",
    "dynamic_slice_sizes",
    "slice_sizes",
    "lhs_batch_dims",
    "rhs_batch_dims",
    "lhs_contracting_dims",
    "rhs_contracting_dims",
    "offset_dims",
    "collapsed_slice_dims",
    "start_index_map",
    "operand_batching_dims",
    "start_indices_batching_dims",
    "update_window_dims",
    "inserted_window_dims",
    "scatter_dims_to_operand_dims",
    "input_batching_dims",
    "scatter_indices_batching_dims",
    "fft_length",
    "lhs_ragged_dims",
    "rhs_group_dims",
    "lhs_ragged_dimensions",
    "rhs_group_dimensions",
)
INT_KEYS = (
    "index",
    "delta",
    "index_vector_dim",
    "iota_dimension",
    "channel_id",
    "feature_group_count",
    "batch_group_count",
    "exponent_bits",
    "mantissa_bits",
    "split_dimension",
    "all_gather_dimension",
    "k",
    "num_partitions",
    "replica_count",
    "split_count",
    "concat_dimension",
    "feature_index",
    "cross_program_prefetch_index",
)
BOOL_KEYS = (
    "is_stable",
    "indices_are_sorted",
    "unique_indices",
    "use_global_device_ids",
    "constrain_layout",
    "custom_call_has_side_effect",
    "is_host_transfer",
    "largest",
    "is_scheduled",
    "alias_passthrough_params",
    "is_cross_program_prefetch",
    "is_composite",
    "left_side",
    "lower",
    "unit_diagonal",
)
WORD_KEYS = (
    "direction",
    "type",
    "kind",
    "distribution",
    "algorithm",
    "fft_type",
    "custom_call_target",
    "padding_type",
    "api_version",
    "custom_call_schedule",
    "execution_thread",
    "mode",
    "async_execution_thread",
    "infeed_config",
    "outfeed_config",
    "conv_kind",
    "transpose_a",
)


def _float(raw: str) -> float:
    v = float(raw.strip())  # XLA's ParseDouble; kFloat attrs must fit in a float
    if abs(v) > 3.4028234663852886e38 and v == v and abs(v) != float("inf"):
        raise _Bad("value out of range for float")
    return v


# Results are immutable except these dicts, so every other key caches decoded values by raw text.
_UNCACHED = {"metadata", "frontend_attributes", "backend_config"}


def _register(key: str, fn) -> None:
    cache: dict | None = None if key in _UNCACHED else {}

    def decode(raw: str, _fn=fn, _key=key, _cache=cache):
        if _cache is not None:
            v = _cache.get(raw)
            if v is not None:
                return v
        try:
            v = _fn(raw)
        except AttributeSyntaxError:
            raise
        except (ValueError, IndexError, KeyError, RecursionError) as e:  # RecursionError: JSON nested too deeply
            raise AttributeSyntaxError(_key, raw, str(e)) from None
        if _cache is not None and len(_cache) < 100_000:
            _cache[raw] = v
        return v

    decode.__name__ = f"decode_{key.replace('-', '_')}"
    decode.__doc__ = fn.__doc__
    DECODERS[key] = decode


for _k in INT_LIST_KEYS:
    _register(_k, _int_list)
for _k in INT_KEYS:
    _register(_k, _int)
for _k in BOOL_KEYS:
    _register(_k, _bool)
for _k in WORD_KEYS:
    _register(_k, _word)
_register("epsilon", _float)
for _k, _f in (
    ("slice", decode_slice),
    ("padding", decode_padding),
    ("window", decode_window),
    ("dim_labels", decode_dim_labels),
    ("replica_groups", decode_replica_groups),
    ("source_target_pairs", decode_pairs),
    ("sharding", decode_sharding),
    ("metadata", decode_metadata),
    ("frontend_attributes", decode_frontend_attributes),
    ("backend_config", decode_backend_config),
    ("output_to_operand_aliasing", decode_output_to_operand_aliasing),
    ("control-predecessors", decode_instruction_names),
    ("operand_precision", decode_word_list),
    ("input_output_alias", decode_input_output_alias),
    ("buffer_donor", decode_buffer_donor),
    ("entry_computation_layout", decode_computation_layout),
    ("parameter_replication", decode_bool_list),
    ("allow_spmd_sharding_propagation_to_parameters", decode_bool_list),
    ("allow_spmd_sharding_propagation_to_output", decode_bool_list),
):
    _register(_k, _f)
del _k, _f
