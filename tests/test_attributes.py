"""hloexec.ir.attributes: each decoder on values copied from real dumps, following hlo_parser.cc."""
import glob
import os
import re

import numpy as np
import pytest

import hloexec
from hloexec.errors import HloParseError
from hloexec.ir.attributes import (DECODERS, AttributeSyntaxError, ConvDims, InputOutputAlias, OutputOperandAlias,
                                   PadDim, SliceDim, WindowDim, decode_attribute, unescape)

SHARED = "/work/shared"


def d(key, raw):
    return decode_attribute(key, raw, None)


def iota(dims, reshape, perm):
    """XLA's definition: reshape(arange(N), reshape_dims).transpose(perm).reshape(dims)."""
    return np.arange(int(np.prod(reshape))).reshape(reshape).transpose(perm).reshape(dims)


def test_int_lists_ints_bools_words():
    assert d("dimensions", "{}") == ()
    assert d("dimensions", "{0,2, 1}") == (0, 2, 1)
    assert d("slice_sizes", "{1,1,4096}") == (1, 1, 4096)
    assert d("index", "3") == 3 and d("channel_id", "17") == 17
    assert d("is_stable", "true") is True and d("use_global_device_ids", "false") is False
    assert d("direction", "GT") == "GT" and d("type", "TOTALORDER") == "TOTALORDER"
    assert d("kind", "kLoop") == "kLoop"
    assert d("custom_call_target", '"__cublas$gemm"') == "__cublas$gemm"
    assert d("execution_thread", '"host"') == "host"
    assert d("epsilon", "0.001") == 0.001
    for key, raw in [("dimensions", "{0,}"), ("dimensions", "0"), ("index", "x"), ("is_stable", "1"),
                     ("direction", "G T")]:
        with pytest.raises(AttributeSyntaxError):
            d(key, raw)
    assert issubclass(AttributeSyntaxError, ValueError)


def test_slice_padding_window_dim_labels():
    assert d("slice", "{[0:1], [1:25], [0:8:2]}") == (SliceDim(0, 1), SliceDim(1, 25), SliceDim(0, 8, 2))
    assert d("padding", "0_0x0_0x0_0x127_0") == (PadDim(0, 0),) * 3 + (PadDim(127, 0),)
    assert d("padding", "0_0_0x1_1_2x-1_-2") == (PadDim(0, 0, 0), PadDim(1, 1, 2), PadDim(-1, -2, 0))
    w = d("window", "{size=3x3 stride=2x2 pad=0_0x1_1 lhs_dilate=1x1 rhs_dilate=1x2 rhs_reversal=0x1}")
    assert w == (WindowDim(3, 2, 0, 0, 1, 1, False), WindowDim(3, 2, 1, 1, 1, 2, True))
    assert d("window", "{size=14x14}") == (WindowDim(14), WindowDim(14))
    assert d("window", "{size=2 pad=-1_-1}") == (WindowDim(2, 1, -1, -1),)
    assert d("dim_labels", "b01f_01io->b01f") == ConvDims(0, 3, (1, 2), 2, 3, (0, 1), 0, 3, (1, 2))
    assert d("dim_labels", "bf_oi->bf") == ConvDims(0, 1, (), 1, 0, (), 0, 1, ())
    assert d("dim_labels", "fb01_io01->01bf") == ConvDims(1, 0, (2, 3), 0, 1, (2, 3), 2, 3, (0, 1))
    assert d("dim_labels", "0bf_0io->0bf") == ConvDims(1, 2, (0,), 1, 2, (0,), 1, 2, (0,))
    assert d("dim_labels", "b012f_012io->b012f").input_spatial == (1, 2, 3)
    for key, raw in [("window", "{size=3x3 stride=2}"), ("window", "{foo=1}"), ("dim_labels", "bb_oi->bf"),
                     ("dim_labels", "b0f_oi->bf"), ("padding", "1_2_-1"), ("slice", "{[0]}")]:
        with pytest.raises(AttributeSyntaxError):
            d(key, raw)


def test_replica_groups():
    assert d("replica_groups", "{{0,1},{2,3}}").groups == ((0, 1), (2, 3))
    assert d("replica_groups", "{}").groups == ()
    assert d("replica_groups", "[2,4]<=[8]").groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    for text, dims, reshape, perm in [("[4,2]<=[2,4]T(1,0)", (4, 2), (2, 4), (1, 0)),
                                      ("[8,2]<=[2,8]T(1,0)", (8, 2), (2, 8), (1, 0)),
                                      ("[2,4]<=[2,2,2]T(2,0,1)", (2, 4), (2, 2, 2), (2, 0, 1))]:
        assert d("replica_groups", text).groups == tuple(map(tuple, iota(dims, reshape, perm).tolist()))
    assert d("replica_groups", "[4,2]<=[2,4]T(1,0)").groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert d("source_target_pairs", "{{0,1},{1,2},{2,3},{3,0}}") == ((0, 1), (1, 2), (2, 3), (3, 0))
    assert d("source_target_pairs", "{}") == ()
    for raw in ["[4,2]<=[2,4]", "[4,2]<=[9]", "{{0,1},", "[8]<=[8]"]:
        with pytest.raises(AttributeSyntaxError):
            d("replica_groups", raw)


def test_sharding():
    assert d("sharding", "{replicated}").kind == "replicated"
    m = d("sharding", "{maximal device=3}")
    assert m.kind == "maximal" and m.device == 3
    assert d("sharding", "{manual}").kind == "manual" and d("sharding", "{unknown}").kind == "unknown"
    s = d("sharding", "{devices=[2,1,2]0,1,2,3}")
    assert s.kind == "tiled" and s.tile_dims == (2, 1, 2) and s.devices == (0, 1, 2, 3)
    s = d("sharding", "{devices=[16,1,1]<=[16]}")
    assert s.devices == tuple(range(16))
    s = d("sharding", "{devices=[2,4]<=[4,2]T(1,0)}")
    assert s.devices == tuple(iota((2, 4), (4, 2), (1, 0)).reshape(-1).tolist())
    s = d("sharding", "{devices=[2,1,4]<=[2,2,2]T(0,2,1) last_tile_dim_replicate}")
    assert s.last_tile_dim_replicate and s.devices == tuple(iota((2, 1, 4), (2, 2, 2), (0, 2, 1)).reshape(-1))
    s = d("sharding", "{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}")
    assert s.last_tile_dims == ("manual", "replicated")
    t = d("sharding", "{{replicated}, {devices=[2]0,1}, {maximal device=0}}")
    assert t.kind == "tuple" and [e.kind for e in t.elements] == ["replicated", "tiled", "maximal"]
    s = d("sharding", '{devices=[2]0,1 metadata={op_name="a" source_line=3}}')
    assert s.devices == (0, 1)
    assert d("sharding", "{}").kind == "tuple"
    for raw in ["{maximal}", "{devices=[2]0,1,2}", "{replicated device=1}", "{devices=[2,2]<=[4] bogus}",
                "{devices=[4]<=[2,2]}"]:
        with pytest.raises(AttributeSyntaxError):
            d("sharding", raw)


def test_metadata_frontend_backend():
    m = d("metadata", r'{op_type="dot_general" op_name="jit(f)/a \"q\"\nb" source_file="/x.py" source_line=12 '
                      r'stack_frame_id=3 profile_type={1}}')
    assert m == {"op_type": "dot_general", "op_name": 'jit(f)/a "q"\nb', "source_file": "/x.py",
                 "source_line": 12, "stack_frame_id": 3, "profile_type": (1,)}
    assert d("metadata", "{}") == {}
    with pytest.raises(AttributeSyntaxError):
        d("metadata", '{op_type="a" source_line=x}')
    fa = d("frontend_attributes", '{_xla_buffer_placement="device", k={"a":{"b":"}"}}, _xla_x="1"}')
    assert fa == {"_xla_buffer_placement": "device", "k": '{"a":{"b":"}"}}', "_xla_x": "1"}
    bc = d("backend_config", r'"{\"alpha_real\":1,\"beta\":0,\"dot_dimension_numbers\":{\"lhs_contracting_dimensions\":[\"1\"]}}"')
    assert bc["alpha_real"] == 1 and bc["dot_dimension_numbers"]["lhs_contracting_dimensions"] == ["1"]
    assert d("backend_config", '"SUM;0$1$"') == "SUM;0$1$"
    assert d("backend_config", '{flag_configs:[], scoped_memory_configs:[]}') == {"flag_configs": [],
                                                                                 "scoped_memory_configs": []}
    assert d("backend_config", r'"\001\377\x41"') == b"\x01\xffA"
    assert unescape(r"a\tb\x41\101\u00e9") == "a\tbAAé"
    with pytest.raises(AttributeSyntaxError):
        d("backend_config", r'"\q"')


def test_aliasing_and_module_header():
    assert d("output_to_operand_aliasing", "{{}: (2, {})}") == (OutputOperandAlias((), 2, ()),)
    assert d("output_to_operand_aliasing", "{{0}: (1, {1}), {1}: (0, {})}") == (
        OutputOperandAlias((0,), 1, (1,)), OutputOperandAlias((1,), 0, ()))
    assert d("input_output_alias", "{ {0}: (0, {}, may-alias), {1}: (1, {}), {2}: (3, {0}, must-alias) }") == (
        InputOutputAlias((0,), 0, ()), InputOutputAlias((1,), 1, ()), InputOutputAlias((2,), 3, (0,), "must-alias"))
    assert d("buffer_donor", "{ (0, {}), (1, {2}) }") == ((0, ()), (1, (2,)))
    assert d("control-predecessors", "{%a, %b.1}") == ("a", "b.1")
    assert d("operand_precision", "{default, highest}") == ("default", "highest")
    assert d("num_partitions", "8") == 8 and d("is_scheduled", "true") is True
    params, result = d("entry_computation_layout", "{(f32[8]{0}, s32[])->(f32[8]{0}, s32[])}")
    assert [p.to_text() for p in params] == ["f32[8]{0}", "s32[]"] and result.is_tuple
    params, result = d("entry_computation_layout", "{()->f32[]}")
    assert params == () and result.to_text() == "f32[]"
    with pytest.raises(AttributeSyntaxError):
        d("input_output_alias", "{ {0}: (0, {}, sometimes) }")


def test_unknown_keys_stay_raw():
    assert d("statistics", "{visualizing_index=1}") == "{visualizing_index=1}"
    assert d("to_apply", "%add") == "%add"


class _Inst:
    def __init__(self, **attrs):
        self.attrs, self.name = attrs, "x"

    def attr(self, key, default=None):
        raw = self.attrs.get(key)
        return default if raw is None else decode_attribute(key, raw, self)


def test_op_helpers():
    from hloexec.ir.attributes import dot_dims, gather_dims, scatter_dims
    dd = dot_dims(_Inst(lhs_batch_dims="{0}", rhs_batch_dims="{0}", lhs_contracting_dims="{2}",
                        rhs_contracting_dims="{1}"))
    assert (dd.lhs_batch, dd.rhs_contracting) == ((0,), (1,))
    g = gather_dims(_Inst(offset_dims="{1}", collapsed_slice_dims="{0}", start_index_map="{0}",
                          index_vector_dim="1", slice_sizes="{1,4096}", indices_are_sorted="true"))
    assert g.slice_sizes == (1, 4096) and g.indices_are_sorted and g.operand_batching_dims == ()
    s = scatter_dims(_Inst(update_window_dims="{1}", inserted_window_dims="{0}",
                           scatter_dims_to_operand_dims="{0}", index_vector_dim="1"))
    assert s.index_vector_dim == 1 and not s.unique_indices


GATHER_MODULE = """HloModule m
ENTRY e {
  x = f32[5,4] parameter(0)
  i = s32[3] parameter(1)
  ROOT g = f32[3,4] gather(x, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,4}
}
"""


@pytest.mark.parametrize("key", ["index_vector_dim", "offset_dims", "slice_sizes"])
def test_gather_dims_missing_required_attribute_is_a_parse_error(key):
    from hloexec.ir.attributes import gather_dims
    (m,) = hloexec.parse(re.sub(", " + key + r"=(\{[^}]*\}|\w+)", "", GATHER_MODULE))
    with pytest.raises(HloParseError, match=f"attribute {key} is expected but not seen") as info:
        gather_dims(m.entry.root)
    assert info.value.line == 5


# -- every value in the real dumps ------------------------------------------------------
_INSTR = re.compile(r"\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*")
_ATTR_KEY = re.compile(r"[ ,\t]*([A-Za-z_][A-Za-z0-9_.\-]*)=")


# the next character that opens or closes a group; the end of a string (escapes skipped), its opening quote read
_GROUP_CHAR = re.compile(r'["()\[\]{}]')
_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.DOTALL)
_SHAPE_STOP = re.compile(r"[ (\[{]")
_VALUE_STOP = re.compile(r'[ ,\t\n(\[{"]')


def _skip_group(s, i):
    """Index after the bracket group / string starting at s[i]; values nest (), [], {} and strings. Jumps between
    group characters by regex (a loop over every character took 1.5x the time of the whole test below)."""
    depth, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == '"':
            m = _STRING_REST.match(s, i + 1)
            i = m.end() if m else n
            if depth == 0:
                return i
        elif c in "([{":
            depth += 1
            i += 1
        elif c in ")]}":
            depth -= 1
            i += 1
            if depth == 0:
                return i
        elif depth == 0:
            return i + 1
        else:
            m = _GROUP_CHAR.search(s, i)
            i = m.start() if m else n
    return i


def _values(line):
    """(key, raw) of each attribute of an instruction line, read after its operand list."""
    m = _INSTR.match(line)
    if m is None:
        return []
    i, n = m.end(), len(line)
    while i < n and line[i] != " ":            # the shape
        if line[i] in "([{":
            i = _skip_group(line, i)
        else:
            stop = _SHAPE_STOP.search(line, i)
            i = stop.start() if stop else n
    j = line.find("(", i)
    if j < 0:
        return []
    i = _skip_group(line, j)                    # the operands
    out = []
    while True:
        k = _ATTR_KEY.match(line, i)
        if k is None:
            return out
        i = start = k.end()
        while i < n and line[i] not in " ,\t\n":
            if line[i] in '([{"':
                i = _skip_group(line, i)
            else:
                stop = _VALUE_STOP.search(line, i)
                i = stop.start() if stop else n
        out.append((k.group(1), line[start:i]))


def test_real_dump_values_decode():
    files = glob.glob(f"{SHARED}/seeds/*.hlo") + glob.glob(f"{SHARED}/corpus/xla/*.hlo")
    if not files:
        pytest.skip(f"{SHARED} (seed and corpus dumps) is not present on this machine")
    keys = {"replica_groups", "sharding", "window", "dim_labels", "padding", "slice", "source_target_pairs",
            "output_to_operand_aliasing", "metadata", "backend_config", "dimensions", "slice_sizes"}
    seen = {k: 0 for k in keys}
    for f in files:
        with open(f, errors="replace") as fh:
            for line in fh:
                if " = " not in line:
                    continue
                for key, raw in _values(line):
                    # single-line values only (multi-line JSON configs are the scanner's business)
                    if key in keys and raw.count("{") == raw.count("}") and not raw.startswith("mesh["):
                        v = d(key, raw)
                        seen[key] += 1
                        if key == "replica_groups" and "<=" in raw:
                            m = re.fullmatch(r"\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", raw)
                            dims = (int(m[1]), int(m[2]))
                            reshape = tuple(map(int, m[3].split(",")))
                            perm = tuple(map(int, m[4].split(","))) if m[4] else (0,)
                            assert v.groups == tuple(map(tuple, iota(dims, reshape, perm).tolist()))
    assert seen["replica_groups"] > 0 and seen["sharding"] > 0
