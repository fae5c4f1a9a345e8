"""Decoded forms of HLO attributes, and the decoders from their raw text.

`decode_attribute(key, raw, inst)` is what `Instruction.attr(key)` calls on first use. Each key maps to
one decoder below; a key with no decoder returns its raw text unchanged (unknown attributes are kept,
never rejected). The grammar of each value follows xla/hlo/parser/hlo_parser.cc.
"""
from __future__ import annotations

from dataclasses import dataclass, field


# -- decoded value types ---------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SliceDim:
    start: int
    limit: int
    stride: int = 1


@dataclass(frozen=True, slots=True)
class PadDim:
    low: int
    high: int
    interior: int = 0


@dataclass(frozen=True, slots=True)
class WindowDim:
    size: int
    stride: int = 1
    pad_low: int = 0
    pad_high: int = 0
    base_dilation: int = 1      # lhs_dilate
    window_dilation: int = 1    # rhs_dilate
    reversal: bool = False      # rhs_reversal


@dataclass(frozen=True, slots=True)
class ConvDims:
    """dim_labels such as b01f_01io->b01f, as dimension numbers."""
    input_batch: int
    input_feature: int
    input_spatial: tuple[int, ...]
    kernel_input_feature: int
    kernel_output_feature: int
    kernel_spatial: tuple[int, ...]
    output_batch: int
    output_feature: int
    output_spatial: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DotDims:
    lhs_batch: tuple[int, ...] = ()
    rhs_batch: tuple[int, ...] = ()
    lhs_contracting: tuple[int, ...] = ()
    rhs_contracting: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GatherDims:
    offset_dims: tuple[int, ...]
    collapsed_slice_dims: tuple[int, ...]
    start_index_map: tuple[int, ...]
    index_vector_dim: int
    slice_sizes: tuple[int, ...]
    operand_batching_dims: tuple[int, ...] = ()
    start_indices_batching_dims: tuple[int, ...] = ()
    indices_are_sorted: bool = False


@dataclass(frozen=True, slots=True)
class ScatterDims:
    update_window_dims: tuple[int, ...]
    inserted_window_dims: tuple[int, ...]
    scatter_dims_to_operand_dims: tuple[int, ...]
    index_vector_dim: int
    input_batching_dims: tuple[int, ...] = ()
    scatter_indices_batching_dims: tuple[int, ...] = ()
    indices_are_sorted: bool = False
    unique_indices: bool = False


@dataclass(frozen=True, slots=True)
class Sharding:
    """An HloSharding. kind: replicated | maximal | tiled | manual | unknown | tuple.

    For `tiled`: `tile_dims` is the tile assignment shape (including a trailing replication dim when
    `last_tile_dim_replicate`, or the dims named by `last_tile_dims`), `devices` the device ids in
    row-major order over `tile_dims` (iota forms expanded).
    """
    kind: str
    tile_dims: tuple[int, ...] = ()
    devices: tuple[int, ...] = ()
    last_tile_dim_replicate: bool = False
    last_tile_dims: tuple[str, ...] = ()          # subgroup types: manual, replicated, ...
    device: int | None = None                     # for maximal
    elements: tuple["Sharding", ...] = ()         # for tuple
    text: str = ""


@dataclass(frozen=True, slots=True)
class OutputOperandAlias:
    output_index: tuple[int, ...]
    operand: int
    operand_index: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class InputOutputAlias:
    output_index: tuple[int, ...]
    parameter: int
    parameter_index: tuple[int, ...]
    kind: str = "may-alias"


@dataclass(frozen=True, slots=True)
class ReplicaGroups:
    """Replica groups; the iota form `[4,2]<=[2,4]T(1,0)` is expanded into `groups`."""
    groups: tuple[tuple[int, ...], ...] = field(default=())
    text: str = ""


# -- the decoders ------------------------------------------------------------------
def decode_attribute(key: str, raw: str, inst):
    """Decode one attribute's raw text; unknown keys come back as raw text."""
    decoder = DECODERS.get(key)
    return raw if decoder is None else decoder(raw)


DECODERS: dict = {}   # key -> function(raw text) -> decoded value; filled below


# ================================================================================
# Errors and helpers
# ================================================================================
import json as _json
import math as _math
import re as _re


class AttributeSyntaxError(ValueError):
    """An attribute value that XLA's parser would reject; the parser turns it into HloParseError."""

    def __init__(self, key: str, raw: str, message: str):
        self.key, self.raw, self.message = key, raw, message
        shown = raw if len(raw) <= 120 else raw[:117] + "..."
        super().__init__(f"bad value for attribute {key}={shown}: {message}")


class _Bad(ValueError):
    pass


_INT = _re.compile(r"\s*(-?\d+)\s*$")
_INT_LIST = _re.compile(r"\s*\{\s*(-?\d+(?:\s*,\s*-?\d+)*)?\s*\}\s*$")
_IDENT = _re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*$")
_STRING = _re.compile(r'\s*"((?:[^"\\]|\\.)*)"\s*$', _re.S)


def _int(raw: str) -> int:
    s = raw.strip()
    if not (s[1:] if s[:1] == "-" else s).isdigit():
        raise _Bad("expects an integer")
    v = int(s)
    return v if -(1 << 63) <= v < (1 << 63) else _check_int64(v)


def _check_int64(v: int) -> int:
    if v >= 1 << 63:
        if v >= 1 << 64:
            raise _Bad("integer does not fit in 64 bits")
        v -= 1 << 64          # the lexer bit_casts an unsigned token to int64
    elif v < -(1 << 63):
        raise _Bad("integer does not fit in 64 bits")
    return v


def _int_list(raw: str) -> tuple[int, ...]:
    m = _INT_LIST.match(raw)
    if m is None:
        raise _Bad("expects a braced list of integers such as {0,1}")
    body = m.group(1)
    return tuple(_check_int64(int(x)) for x in body.split(",")) if body else ()


def _bool(raw: str) -> bool:
    s = raw.strip()
    if s == "true":
        return True
    if s == "false":
        return False
    raise _Bad("expects true or false")


# -- strings (absl::CUnescape, as XLA's lexer) ---------------------------------------
_SIMPLE_ESCAPES = {"n": 10, "t": 9, "r": 13, "a": 7, "b": 8, "f": 12, "v": 11, "\\": 92, "'": 39, '"': 34,
                   "?": 63}
_ESCAPE = _re.compile(r"\\(?:([0-7]{1,3})|[xX]([0-9a-fA-F]+)|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", _re.S)


def unescape(body: str) -> "str | bytes":
    """absl::CUnescape of the text between the quotes. Byte escapes (\\377, \\xff) that do not form UTF-8
    with the rest give `bytes` (binary backend configs); otherwise `str`."""
    if "\\" not in body:
        return body
    out = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(body):
        out += body[pos:m.start()].encode("utf-8")
        octal, hexa, u4, u8, other = m.groups()
        if octal is not None:
            v = int(octal, 8)
            if v > 0xFF:
                raise _Bad(f"value of \\{octal} exceeds 0xff")
            out.append(v)
        elif hexa is not None:
            v = int(hexa, 16)
            if v > 0xFF:
                raise _Bad(f"value of \\x{hexa} exceeds 0xff")
            out.append(v)
        elif u4 is not None or u8 is not None:
            cp = int(u4 or u8, 16)
            if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                raise _Bad(f"bad unicode escape {m.group()}")
            out += chr(cp).encode("utf-8")
        else:
            v = _SIMPLE_ESCAPES.get(other)
            if v is None:
                raise _Bad(f"unknown escape sequence \\{other}")
            out.append(v)
        pos = m.end()
    if body.endswith("\\") and pos < len(body):
        raise _Bad("string cannot end with '\\'")
    out += body[pos:].encode("utf-8")
    return _text_or_bytes(out)


def _text_or_bytes(data: bytearray):
    """Unescaped string contents: text when they are UTF-8, else the bytes (binary backend configs)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return bytes(data)


def _string(raw: str):
    m = _STRING.match(raw)
    if m is None:
        raise _Bad('expects a quoted string "..."')
    return unescape(m.group(1))


def _word(raw: str) -> str:
    """An enum-like value: a bare identifier (GT, kLoop, rng_uniform) or a quoted string."""
    s = raw.strip()
    if s.startswith('"'):
        v = _string(s)
        return v if isinstance(v, str) else v.decode("latin-1")
    m = _IDENT.match(s)
    if m is None:
        raise _Bad("expects an identifier")
    return m.group(1)


# -- a small tokenizer (XLA's token kinds that attribute grammars use) ----------------
_TOKEN = _re.compile(r"""
    (?P<ws>\s+|/\*.*?\*/)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<arrow>->) | (?P<leq><=)
  | (?P<int>-?\d+)
  | (?P<name>%[A-Za-z_][A-Za-z0-9_.\-]*)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.\-]*)
  | (?P<quoted>'[^']*')
  | (?P<p>[{}\[\]():=,?])
""", _re.X | _re.S)


class _Tokens:
    __slots__ = ("toks", "i", "raw")

    def __init__(self, raw: str):
        toks = []
        pos, n = 0, len(raw)
        match = _TOKEN.match
        while pos < n:
            m = match(raw, pos)
            if m is None:
                raise _Bad(f"unexpected text {raw[pos:pos + 20]!r}")
            kind = m.lastgroup
            if kind != "ws":
                text = m.group()
                toks.append((text if kind == "p" else kind, text))
            pos = m.end()
        toks.append(("eof", ""))
        self.toks, self.i, self.raw = toks, 0, raw

    def peek(self, k: int = 0) -> str:
        return self.toks[min(self.i + k, len(self.toks) - 1)][0]

    def next(self):
        t = self.toks[self.i]
        if t[0] != "eof":
            self.i += 1
        return t

    def expect(self, kind: str) -> str:
        t = self.next()
        if t[0] != kind:
            raise _Bad(f"expects {kind!r}, sees {t[1] or 'end of text'!r}")
        return t[1]

    def eat(self, kind: str) -> bool:
        if self.toks[self.i][0] == kind:
            self.i += 1
            return True
        return False

    def int(self) -> int:
        return _check_int64(int(self.expect("int")))

    def int_list(self, open_="{", close="}", sep=",") -> tuple[int, ...]:
        self.expect(open_)
        out = []
        if not self.eat(close):
            while True:
                out.append(self.int())
                if self.eat(close):
                    break
                self.expect(sep)
        return tuple(out)

    def done(self):
        if self.peek() != "eof":
            raise _Bad(f"unexpected text after the value: {self.toks[self.i][1]!r}")

    def skip_balanced(self):
        """Skip one value: a token or a balanced {...}/[...]/(...) group."""
        t = self.next()
        if t[0] not in ("{", "[", "("):
            return
        depth = 1
        while depth:
            k = self.next()[0]
            if k in ("{", "[", "("):
                depth += 1
            elif k in ("}", "]", ")"):
                depth -= 1
            elif k == "eof":
                raise _Bad("unbalanced brackets")


# ================================================================================
# The decoders
# ================================================================================
_SLICE_DIM = _re.compile(r"\s*\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+)\s*)?\]\s*(,|\})")


def decode_slice(raw: str) -> tuple[SliceDim, ...]:
    """`{[0:2], [1:8:2]}` -> SliceDims (stride 1 when not written)."""
    s = raw.strip()
    if not s.startswith("{"):
        raise _Bad("expects '{' to start ranges")
    if _re.fullmatch(r"\{\s*\}", s):
        return ()
    out, pos = [], 1
    while True:
        m = _SLICE_DIM.match(s, pos)
        if m is None:
            raise _Bad("expects [start:limit] or [start:limit:stride]")
        a, b, c, end = m.groups()
        out.append(SliceDim(int(a), int(b), int(c) if c is not None else 1))
        pos = m.end()
        if end == "}":
            break
    if s[pos:].strip():
        raise _Bad("unexpected text after '}'")
    return tuple(out)


_PAD_DIM = _re.compile(r"(-?\d+)_(-?\d+)(?:_(\d+))?$")


def decode_padding(raw: str) -> tuple[PadDim, ...]:
    """Pad config `0_0_0x1_1_0`: per dimension low_high[_interior]."""
    out = []
    for part in raw.strip().split("x"):
        m = _PAD_DIM.match(part)
        if m is None:
            raise _Bad("expects padding config pattern like 'low_high_interior' or 'low_high'")
        lo, hi, inner = m.groups()
        out.append(PadDim(int(lo), int(hi), int(inner) if inner is not None else 0))
    return tuple(out)


_DXD = _re.compile(r"\d+(?:x\d+)*$")
_WINDOW_PAD = _re.compile(r"-?\d+_-?\d+(?:x-?\d+_-?\d+)*$")


def decode_window(raw: str) -> tuple[WindowDim, ...]:
    """`{size=3x3 stride=2x2 pad=0_0x1_1 lhs_dilate=1x1 rhs_dilate=1x1 rhs_reversal=0x1}` (ParseWindow)."""
    s = raw.strip()
    if not (s.startswith("{") and s.endswith("}")):
        raise _Bad("expected '{' ... '}' around a window")
    fields: dict[str, list] = {}
    for item in s[1:-1].replace(",", " ").split():
        key, eq, value = item.partition("=")
        if not eq:
            raise _Bad(f"expects sub-attributes in window, sees {item!r}")
        if key in fields:
            raise _Bad(f"sub-attribute '{key}=' already exists")
        if key == "pad":
            if not _WINDOW_PAD.match(value):
                raise _Bad("expects window pad pattern, e.g., '0_0x3_3'")
            fields[key] = [tuple(int(v) for v in _re.split(r"(?<=\d)_", d)) for d in value.split("x")]
        elif key in ("size", "stride", "lhs_dilate", "rhs_dilate", "rhs_reversal"):
            if not _DXD.match(value):
                raise _Bad(f"expects sub-attribute '{key}=ixj...'")
            fields[key] = [int(v) for v in value.split("x")]
        else:
            raise _Bad(f"unexpected attribute name: {key}")
    size = fields.get("size", [])
    for key, vals in fields.items():
        if len(vals) != len(size):
            raise _Bad(f"expects '{key}=' has the same size as 'size='")
    stride, pad = fields.get("stride"), fields.get("pad")
    lhs, rhs, rev = fields.get("lhs_dilate"), fields.get("rhs_dilate"), fields.get("rhs_reversal")
    return tuple(WindowDim(size[i], stride[i] if stride else 1, pad[i][0] if pad else 0, pad[i][1] if pad else 0,
                           lhs[i] if lhs else 1, rhs[i] if rhs else 1, (rev[i] == 1) if rev else False)
                 for i in range(len(size)))


_DIM_LABELS = _re.compile(r"([0-9bf?]{2,})_([0-9io?]{2,})->([0-9bf?]{2,})$")


def _labels(text: str, a: str, b: str, what: str):
    chars = [c for c in text if c != "?"]
    if len(set(chars)) != len(chars):
        raise _Bad(f"expects unique {what} dimension numbers, but sees {text}")
    nspatial = sum(1 for c in text if c not in (a, b, "?"))
    spatial = [-1] * nspatial
    first = second = -1
    for i, c in enumerate(text):
        if c == "?":
            continue
        if c == a:
            first = i
        elif c == b:
            second = i
        elif "0" <= c < chr(ord("0") + len(text)) and int(c) < nspatial:
            spatial[int(c)] = i
        else:
            raise _Bad(f"expects [0-{len(text) - 1}{a}{b}?] in {what} dimension numbers")
    return first, second, tuple(spatial)


def decode_dim_labels(raw: str) -> ConvDims:
    """`b01f_01io->b01f` -> ConvDims (ParseConvolutionDimensionNumbers)."""
    m = _DIM_LABELS.match(raw.strip())
    if m is None:
        raise _Bad("expects dim labels pattern, e.g., 'bf0_0io->0bf'")
    lhs, rhs, out = m.groups()
    ib, if_, isp = _labels(lhs, "b", "f", "lhs")
    ki, ko, ksp = _labels(rhs, "i", "o", "rhs")
    ob, of, osp = _labels(out, "b", "f", "output")
    if not (len(isp) == len(ksp) == len(osp)):
        raise _Bad("input, kernel, and output must have same number of spatial dimensions")
    return ConvDims(ib, if_, isp, ki, ko, ksp, ob, of, osp)


def _iota(dims, reshape, perm) -> "list[int]":
    """Device ids of an iota tile assignment: reshape(arange(N), reshape).transpose(perm).reshape(dims)."""
    import numpy as np
    n = _math.prod(reshape)
    if _math.prod(dims) != n:
        raise _Bad(f"iota tile assignment {list(dims)} has {_math.prod(dims)} elements, the iota {n}")
    if sorted(perm) != list(range(len(reshape))):
        raise _Bad(f"bad iota transpose permutation {list(perm)}")
    return np.arange(n, dtype=np.int64).reshape(reshape).transpose(perm).reshape(-1).tolist()


def _tile_assignment(t: _Tokens, allow_devices: bool):
    """ParseTileAssignment: `[d0,d1]` then `<=[r0,r1]T(p0,p1)` or an explicit device list."""
    dims = t.int_list("[", "]")
    if not dims:
        raise _Bad("expected a tile assignment shape")
    if t.eat("leq"):
        reshape = t.int_list("[", "]")
        if not reshape:
            raise _Bad("expected non-empty iota_reshape_dims")
        if len(reshape) == 1:
            perm = (0,)
        else:
            if not (t.peek() == "ident" and t.toks[t.i][1] == "T"):
                raise _Bad("expected 'T(' to start sharding devices iota_transpose_perm")
            t.next()
            perm = t.int_list("(", ")")
            if any(p >= len(reshape) or p < 0 for p in perm):
                raise _Bad("out of range iota transpose value")
        if len(perm) != len(reshape):
            raise _Bad("iota_transpose_perm should have the same rank as iota_reshape_dims")
        return dims, _iota(dims, reshape, perm), True
    if not allow_devices:
        raise _Bad("expected an iota tile assignment")
    devices = [t.int()]
    while t.eat(","):
        devices.append(t.int())
    return dims, devices, False


def decode_replica_groups(raw: str) -> ReplicaGroups:
    """`{{0,1},{2,3}}`, `{}`, or the iota form `[4,2]<=[2,4]T(1,0)` (IotaReplicaGroupList), expanded."""
    s = raw.strip()
    if s.startswith("mesh["):
        return _mesh_axes_replica_groups(s, raw)
    if s.startswith("{"):
        if _re.fullmatch(r"\{\s*\}", s):
            return ReplicaGroups((), raw)
        t = _Tokens(s)
        t.expect("{")
        groups = []
        while True:
            groups.append(t.int_list())
            if t.eat("}"):
                break
            t.expect(",")
        t.done()
        return ReplicaGroups(tuple(groups), raw)
    t = _Tokens(s)
    dims, devices, _ = _tile_assignment(t, allow_devices=False)
    t.done()
    if len(dims) != 2:
        raise _Bad("expected an iota replica group list [num_groups,group_size]<=[...]")
    g = dims[1]
    return ReplicaGroups(tuple(tuple(devices[i * g:(i + 1) * g]) for i in range(dims[0])), raw)


def _mesh_axes_replica_groups(s: str, raw: str) -> ReplicaGroups:
    """`mesh['a'=2,'b'=4][, device_ids=([4,2]T(1,0))] {'a'}` (what XLA:CPU prints for jax meshes): the
    devices laid out on the mesh (iota, or the given iota transpose); a group is the devices that differ
    only along the named axes, in their order; groups in row-major order of the other axes."""
    import numpy as np
    m = _re.fullmatch(r"mesh\[([^\]]*)\](?:,\s*device_ids=\(\[([\d,\s]*)\](?:T\(([\d,\s]*)\))?\))?\s*\{([^}]*)\}", s)
    if m is None:
        raise _Bad("mesh-axes replica groups beyond mesh[...] [device_ids=(iota)] {axes} are not supported")
    axes = [(name, int(size)) for name, size in _re.findall(r"'([^']+)'=(\d+)", m[1])]
    names = [name for name, _ in axes]
    dims = [size for _, size in axes]
    grouped = _re.findall(r"'([^']+)'", m[4])
    if not _re.fullmatch(r"\s*(?:'[^']+'\s*,?\s*)*", m[4]) or any(g not in names for g in grouped):
        raise _Bad(f"mesh-axes replica groups name axes {m[4]!r} outside mesh {names} (sub-axes unsupported)")
    n = _math.prod(dims)
    ids = np.arange(n)
    if m[2] is not None:
        reshape = [int(v) for v in m[2].split(",")]
        perm = [int(v) for v in m[3].split(",")] if m[3] else list(range(len(reshape)))
        if _math.prod(reshape) != n or sorted(perm) != list(range(len(reshape))):
            raise _Bad(f"device_ids iota {m[2]} does not cover the mesh's {n} devices")
        ids = ids.reshape(reshape).transpose(perm).reshape(-1)
    others = [k for k, name in enumerate(names) if name not in grouped]
    order = others + [names.index(g) for g in grouped]
    size = _math.prod(dims[names.index(g)] for g in grouped)
    table = ids.reshape(dims).transpose(order).reshape(-1, size)
    return ReplicaGroups(tuple(tuple(int(d) for d in row) for row in table), raw)


def decode_pairs(raw: str) -> tuple[tuple[int, int], ...]:
    """source_target_pairs `{{0,1},{1,2}}`."""
    t = _Tokens(raw)
    t.expect("{")
    out = []
    if not t.eat("}"):
        while True:
            pair = t.int_list()
            if len(pair) != 2:
                raise _Bad("expects pairs {source,target}")
            out.append(pair)
            if t.eat("}"):
                break
            t.expect(",")
    t.done()
    return tuple(out)


_SHARDING_KINDS = ("replicated", "maximal", "manual", "unknown", "unreduced")


def _single_sharding(t: _Tokens, text: str) -> Sharding:
    t.expect("{")
    if t.peek() == "ident" and t.toks[t.i][1] in ("mesh", "maximal_mesh"):
        s = _named_single_sharding(t, text)
        t.expect("}")
        return s
    flags = set()
    devices = None
    dims: tuple = ()
    last_tile_dims: list = []
    while not t.eat("}"):
        kind, val = t.next()
        if kind == "ident" and t.peek() != "=":
            if val in _SHARDING_KINDS or val == "last_tile_dim_replicate":
                flags.add(val)
            elif val in ("shard_as", "shard_like"):
                t.int()
            else:
                raise _Bad(f"unexpected token {val!r} in sharding")
        elif kind == "ident":
            t.expect("=")
            if val == "device":
                devices = [t.int()]
            elif val == "devices":
                dims, devices, _ = _tile_assignment(t, allow_devices=True)
            elif val == "metadata":
                t.skip_balanced()
            elif val == "last_tile_dims":
                t.expect("{")
                if not t.eat("}"):
                    while True:
                        name = t.expect("ident")
                        if name not in ("maximal", "replicated", "manual", "unreduced"):
                            raise _Bad(f"bad sharding type {name!r} in last_tile_dims")
                        last_tile_dims.append(name)
                        if t.eat("}"):
                            break
                        t.expect(",")
            else:
                raise _Bad("unknown attribute in sharding: expected device=, devices= metadata= or last_tile_dims=")
        else:
            raise _Bad(f"unexpected token {val!r} in sharding")
    for kind in ("replicated", "maximal", "manual", "unknown", "unreduced"):
        if kind in flags:
            if kind == "maximal":
                if devices is None or len(devices) != 1 or dims:
                    raise _Bad("maximal shardings should have exactly one device assigned")
                return Sharding("maximal", device=devices[0], text=text)
            if devices:
                raise _Bad(f"{kind} shardings should not have any devices assigned")
            return Sharding(kind, text=text)
    if not dims:
        raise _Bad("non-maximal shardings must have a tile assignment list including dimensions")
    if _math.prod(dims) != len(devices):
        raise _Bad(f"tile assignment {list(dims)} needs {_math.prod(dims)} devices, sees {len(devices)}")
    if len(devices) <= 1 and "<=" not in text:
        raise _Bad("non-maximal shardings must have more than one device assigned")
    return Sharding("tiled", tuple(dims), tuple(devices), "last_tile_dim_replicate" in flags,
                    tuple(last_tile_dims), text=text)


# -- named (mesh-axes) shardings: XLA 0.10's HLO form of Shardy shardings ---------------------------------
@dataclass(frozen=True, slots=True)
class AxisRef:
    """A mesh axis (by index), or the sub-axis of it that `pre` sub-axis size precedes, of size `size`."""
    axis: int
    pre: int | None = None
    size: int | None = None


def named_sharding(sizes, device_ids, dims, replicated=(), unreduced=(), manual=(), text="") -> Sharding:
    """The tile assignment of a sharding over a mesh (XLA's NamedSharding, Shardy's TensorShardingAttr).

    `sizes`: the mesh axes' sizes; `device_ids`: the devices over the mesh in row-major order (None: iota);
    `dims`: per tensor dimension the AxisRefs sharding it, major to minor. The axes no dimension uses are
    replicated, except those listed as `unreduced` or `manual`: the tile assignment is the mesh transposed to
    (dimension axes..., replicated, unreduced, manual) and reshaped to one dim per tensor dimension plus one per
    kind that has devices."""
    import numpy as np
    refs = [r for d in dims for r in d] + list(replicated) + list(unreduced) + list(manual)
    cuts = [{1, n} for n in sizes]                  # sub-axes split an axis at these sizes (major side first)
    for r in refs:
        if not 0 <= r.axis < len(sizes):
            raise _Bad(f"axis index {r.axis} is out of range for a mesh of {len(sizes)} axes")
        if r.pre is not None:
            if r.pre < 1 or r.size < 1 or sizes[r.axis] % (r.pre * r.size):
                raise _Bad(f"sub-axis ({r.pre}){r.size} does not divide axis of size {sizes[r.axis]}")
            cuts[r.axis].update((r.pre, r.pre * r.size))
    factors, first = [], []                          # factor sizes over all axes; each axis' first factor index
    for n, c in zip(sizes, cuts):
        c = sorted(c)
        if any(b % a for a, b in zip(c, c[1:])):
            raise _Bad(f"sub-axes of an axis of size {n} overlap")
        first.append(len(factors))
        factors += [b // a for a, b in zip(c, c[1:])]
    def spanned(r):
        c = sorted(cuts[r.axis])
        lo, hi = (0, len(c) - 1) if r.pre is None else (c.index(r.pre), c.index(r.pre * r.size))
        return list(range(first[r.axis] + lo, first[r.axis] + hi))
    data = [[f for r in d for f in spanned(r)] for d in dims]
    used = [f for d in data for f in d]
    kinds = {f: kind for kind, group in (("unreduced", unreduced), ("manual", manual)) for r in group
             for f in spanned(r)}
    if len(set(used)) != len(used) or set(used) & set(kinds):
        raise _Bad("a mesh axis shards two dimensions (or is also unreduced/manual)")
    rest = [f for f in range(len(factors)) if f not in used]
    groups = [(kind, [f for f in rest if kinds.get(f, "replicated") == kind])
              for kind in ("replicated", "unreduced", "manual")]
    n = _math.prod(sizes)
    ids = np.arange(n) if device_ids is None else np.asarray(device_ids)
    if ids.size != n:
        raise _Bad(f"{ids.size} device ids for a mesh of {n} devices")
    order = used + [f for _, g in groups for f in g]
    devices = ids.reshape([f for f in factors] or [1]).transpose(order or [0]).reshape(-1) if factors else ids
    counts = [_math.prod(factors[f] for f in d) for d in data]
    subgroups = [(kind, _math.prod(factors[f] for f in g)) for kind, g in groups]
    subgroups = [(kind, m) for kind, m in subgroups if m > 1]
    if all(c == 1 for c in counts) and len(subgroups) <= 1:
        return Sharding(subgroups[0][0] if subgroups else "replicated", text=text)
    if [kind for kind, _ in subgroups] == ["replicated"]:
        return Sharding("tiled", tuple(counts) + (subgroups[0][1],), tuple(int(d) for d in devices), True, text=text)
    return Sharding("tiled", tuple(counts) + tuple(m for _, m in subgroups), tuple(int(d) for d in devices), False,
                    tuple(kind for kind, _ in subgroups), text=text)


def _mesh(t: _Tokens):
    """ParseMesh: `mesh[name=size, ...][, device_ids=(iota or list)]` -> (names, sizes, device ids or None)."""
    t.expect("[")
    names, sizes = [], []
    while not t.eat("]"):
        if names:
            t.expect(",")
        kind, name = t.next()
        if kind not in ("quoted", "ident"):
            raise _Bad(f"expects a mesh axis name, sees {name!r}")
        t.expect("=")
        names.append(name.strip("'"))
        sizes.append(t.int())
    ids = None
    if t.peek() == "," and t.toks[t.i + 1][1] == "device_ids":
        t.next(), t.next()
        t.expect("=")
        t.expect("(")
        if t.peek() == "[":
            reshape = t.int_list("[", "]")
            perm = t.int_list("(", ")") if t.peek() == "ident" and t.next()[1] == "T" else (0,)
            ids = _iota(sizes, reshape, perm)
            t.expect(")")
        else:
            ids = [t.int()]
            while t.eat(","):
                ids.append(t.int())
            t.expect(")")
    return names, sizes, ids


def _axis_ref(t: _Tokens, names) -> AxisRef:
    kind, name = t.next()
    if kind == "int":
        axis = int(name)
    elif kind in ("quoted", "ident") and name.strip("'") in names:
        axis = names.index(name.strip("'"))
    else:
        raise _Bad(f"axis {name!r} is not a valid axis name or index in mesh {names}")
    if t.eat(":"):
        t.expect("(")
        pre = t.int()
        t.expect(")")
        return AxisRef(axis, pre, t.int())
    return AxisRef(axis)


def _axis_refs(t: _Tokens, names, open_dims: bool = False) -> list:
    """`{a, b:(2)4, ?}` (a `?` -- an open dimension -- only where `open_dims`)."""
    t.expect("{")
    refs = []
    while not t.eat("}"):
        if refs or (open_dims and t.toks[t.i - 1][0] == "?"):
            t.expect(",")
        if open_dims and t.eat("?"):
            continue
        refs.append(_axis_ref(t, names))
    return refs


def _named_single_sharding(t: _Tokens, text: str) -> Sharding:
    """XLA 0.10's ParseSingleSharding for a NamedSharding, after its '{': `mesh[...], [dims...], replicated={..},
    unreduced={..}, manual={..}, metadata=...`, `mesh[...], replicated|unreduced|manual`, `maximal_mesh[device_id=N]`."""
    kind = t.next()[1]
    if kind == "maximal_mesh":
        t.expect("[")
        if t.next()[1] != "device_id":
            raise _Bad("expected device_id= attribute in maximal_mesh")
        t.expect("=")
        device = t.int()
        t.expect("]")
        _skip_named_metadata(t)
        return Sharding("maximal", device=device, text=text)
    names, sizes, ids = _mesh(t)
    t.eat(",")
    if t.peek() == "ident" and t.toks[t.i][1] in ("replicated", "unreduced", "manual"):
        whole = t.next()[1]
        _skip_named_metadata(t)
        return Sharding(whole, text=text) if _math.prod(sizes) > 1 or whole != "replicated" \
            else Sharding("replicated", text=text)
    t.expect("[")
    dims = []
    while not t.eat("]"):
        if dims:
            t.expect(",")
        dims.append(_axis_refs(t, names, open_dims=True))
    groups = {"replicated": [], "unreduced": [], "manual": []}
    while not t.eat("}"):
        t.expect(",")
        key = t.expect("ident")
        t.expect("=")
        if key == "metadata":
            t.skip_balanced()
        elif key in groups:
            groups[key] = _axis_refs(t, names)
        else:
            raise _Bad("unknown attribute in named sharding: expected replicated, unreduced, manual or metadata")
    t.i -= 1                                         # the caller eats the closing '}'
    return named_sharding(sizes, ids, dims, groups["replicated"], groups["unreduced"], groups["manual"], text)


def _skip_named_metadata(t: _Tokens) -> None:
    if t.eat(","):
        if t.expect("ident") != "metadata":
            raise _Bad("expected metadata= after the sharding")
        t.expect("=")
        t.skip_balanced()


def decode_sharding(raw: str) -> Sharding:
    """Every HloSharding form; tuple shardings as kind='tuple' with `elements`; metadata ignored."""
    t = _Tokens(raw)
    if t.peek() != "{":
        raise _Bad("expected '{' to start sharding attribute")
    if t.peek(1) in ("{", "}"):
        t.expect("{")
        elements = []
        if not t.eat("}"):
            while True:
                elements.append(_single_sharding(t, ""))
                if t.eat("}"):
                    break
                t.expect(",")
        t.done()
        return Sharding("tuple", elements=tuple(elements), text=raw)
    s = _single_sharding(t, raw)
    t.done()
    return s


_STR_BODY = r'[^"\\]*(?:\\.[^"\\]*)*'
_META_ITEM_RE = r'([A-Za-z_][A-Za-z0-9_]*)=(?:"(' + _STR_BODY + r')"|(-?\d+)|\{([^{}]*)\})'
_META_FIND = _re.compile(_META_ITEM_RE, _re.S)
_META_FULL = _re.compile(r'\s*\{(?:[\s,]*' + _META_ITEM_RE.replace("(", "(?:").replace("(?:?:", "(?:") + r')*[\s,]*\}\s*$', _re.S)


def decode_metadata(raw: str) -> dict:
    """`{op_type="dot" op_name="..." source_file="f.py" source_line=12}` -> dict (ints for lines/ids)."""
    if _META_FULL.match(raw) is None:
        raise _Bad("expects '{' key=value ... '}' with string, integer or {int list} values")
    out: dict = {}
    for m in _META_FIND.finditer(raw):
        key, sval, ival, lval = m.groups()
        if key in out:
            raise _Bad(f"attribute {key} already exists")
        if ival is not None:
            out[key] = int(ival)
        elif lval is not None:
            out[key] = tuple(int(x) for x in lval.split(",") if x.strip())
        elif "\\" in sval:
            v = unescape(sval)
            out[key] = v if isinstance(v, str) else v.decode("utf-8", "replace")
        else:
            out[key] = sval
    return out


def _braced_end(s: str, i: int) -> int:
    """Index after the '}' matching the '{' at s[i] (XLA's LexJsonDict: strings skipped)."""
    depth, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == '"':
            m = _re.compile(r'"(?:[^"\\]|\\.)*"', _re.S).match(s, i)
            if m is None:
                raise _Bad("unterminated string")
            i = m.end()
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise _Bad("unbalanced '{'")


_FA_KEY = _re.compile(r'[\s,]*([A-Za-z_][A-Za-z0-9_.\-]*)\s*=\s*')
_FA_STR = _re.compile(r'"((?:[^"\\]|\\.)*)"', _re.S)
_FA_BARE = _re.compile(r'[^,\s}]+')


def decode_frontend_attributes(raw: str) -> dict:
    """`{_xla_x="1", k={json}}` -> dict[str, str] (values unescaped; JSON dicts kept as text)."""
    s = raw.strip()
    if not (s.startswith("{") and s.endswith("}")):
        raise _Bad("expected '{' to start frontend attributes")
    out: dict = {}
    pos, end = 1, len(s) - 1
    while s[pos:end].strip(" \t\n,"):
        m = _FA_KEY.match(s, pos, end)
        if m is None:
            raise _Bad(f"expects attribute name at {s[pos:pos + 30]!r}")
        key, pos = m.group(1), m.end()
        if s.startswith('"', pos):
            m = _FA_STR.match(s, pos, end)
            if m is None:
                raise _Bad("unterminated string")
            v = unescape(m.group(1))
            out[key] = v if isinstance(v, str) else v.decode("utf-8", "replace")
            pos = m.end()
        elif s.startswith("{", pos):
            e = _braced_end(s, pos)
            out[key] = s[pos:e]
            pos = e
        else:                                   # lenient: a bare word
            m = _FA_BARE.match(s, pos, end)
            if m is None:
                raise _Bad(f"expects a string value for {key}")
            out[key] = m.group()
            pos = m.end()
    return out


_UNQUOTED_KEY = _re.compile(r'([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)\s*:')


def _json_or_none(text: str):
    try:
        return _json.loads(text)
    except ValueError:
        pass
    try:
        return _json.loads(_UNQUOTED_KEY.sub(r'\1"\2":', text))
    except ValueError:
        return None


def decode_backend_config(raw: str):
    """A quoted string is unescaped, then parsed as JSON if it looks like JSON (unquoted keys tolerated),
    else returned as text (or bytes when binary); a braced `{...}` is parsed as JSON, else as the MLIR
    dictionary typed-FFI custom-calls carry (`{mode = 65 : ui8, eps = 1.0e-05 : f32}`), else kept raw."""
    s = raw.strip()
    if s.startswith('"'):
        text = _string(s)
        if isinstance(text, str):
            t = text.strip()
            if t[:1] in ("{", "["):
                v = _json_or_none(t)
                if v is not None:
                    return v
        return text
    if s.startswith("{"):
        if _braced_end(s, 0) != len(s):
            raise _Bad("unexpected text after the JSON dict")
        v = _json_or_none(s)
        if v is None:
            v = _mlir_dict_or_none(s)
        return raw if v is None else v
    raise _Bad("expects a string or a JSON dict")


# MLIR attribute dictionaries (the typed-FFI form of backend_config): name = value [: type], ...
_MLIR_TOKEN = _re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>[-+]?(?:0x[0-9A-Fa-f]+|\d+\.?\d*(?:[eE][-+]?\d+)?))'
                          r'|(?P<word>[A-Za-z_][A-Za-z0-9_.$]*)|(?P<punct>[{}\[\]=,:<>]))', _re.S)
_MLIR_HEX_ESCAPE = _re.compile(r'\\([0-9A-Fa-f]{2}|.)', _re.S)


def _mlir_string(body: str):
    """An MLIR string literal's body: `\\XX` hex escapes (and `\\\\`, `\\"`, `\\n`, `\\t`); bytes when not UTF-8."""
    if "\\" not in body:
        return body
    simple = {"n": b"\n", "t": b"\t"}
    out, last = bytearray(), 0
    for m in _MLIR_HEX_ESCAPE.finditer(body):
        out += body[last:m.start()].encode("utf-8")
        esc = m.group(1)
        out += bytes([int(esc, 16)]) if len(esc) == 2 else simple.get(esc, esc.encode("utf-8"))
        last = m.end()
    out += body[last:].encode("utf-8")
    return _text_or_bytes(out)


def _mlir_dict_or_none(text: str):
    """`{a = 1 : i64, b = true, c = "x", d = 2.5e-01 : f32, e}` -> dict (unit attributes are True; values
    of other kinds, `array<...>` or `dense<...>`, kept as their text); None when the text is not one."""
    tokens = [(m.lastgroup, m.group(m.lastgroup)) for m in _MLIR_TOKEN.finditer(text)]
    if "".join(v for _, v in tokens) != _re.sub(r"\s+", "", text):
        return None
    pos = 0

    def value():
        nonlocal pos
        kind, tok = tokens[pos]
        if tok == "{":
            return dictionary()
        if tok == "[":
            pos += 1
            items = []
            while tokens[pos][1] != "]":
                items.append(value())
                if tokens[pos][1] == ",":
                    pos += 1
            pos += 1
            return items
        pos += 1
        if kind == "str":
            v = _mlir_string(tok[1:-1])
        elif kind == "num":
            v = int(tok, 0) if _re.fullmatch(r"[-+]?(0x[0-9A-Fa-f]+|\d+)", tok) else float(tok)
        elif tok in ("true", "false"):
            v = tok == "true"
        else:                                   # array<i64: 1, 2>, dense<...>, #dialect<...>: as text
            start = pos - 1
            depth = 0
            while pos < len(tokens) and (depth or tokens[pos][1] not in (",", "}", "]", ":")):
                depth += {"<": 1, ">": -1}.get(tokens[pos][1], 0)
                pos += 1
            return " ".join(t for _, t in tokens[start:pos])
        if pos < len(tokens) and tokens[pos][1] == ":":     # the type: i64, ui8, f32 ...
            pos += 2
        return v

    def dictionary():
        nonlocal pos
        pos += 1                                # "{"
        out = {}
        while tokens[pos][1] != "}":
            kind, key = tokens[pos]
            if kind not in ("word", "str"):
                raise _Bad(f"expects an attribute name, got {key!r}")
            key = key[1:-1] if kind == "str" else key
            pos += 1
            if tokens[pos][1] == "=":
                pos += 1
                out[key] = value()
            else:
                out[key] = True
            if tokens[pos][1] == ",":
                pos += 1
            elif tokens[pos][1] != "}":
                raise _Bad("expects ',' or '}' after an attribute")
        pos += 1
        return out

    try:
        result = dictionary()
    except (IndexError, ValueError, _Bad):
        return None
    return result if pos == len(tokens) else None


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


def decode_bool_list(raw: str) -> "tuple[bool, ...] | bool":
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
    from .shape import parse_shape
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
    params, rest = body[:i + 1], body[i + 1:].strip()
    if not rest.startswith("->"):
        raise _Bad("expects -> before result shape")
    return parse_shape(params).tuple_shapes, parse_shape(rest[2:].strip())


# -- op-level helpers --------------------------------------------------------------
def dot_dims(inst) -> DotDims:
    """Dot dimension numbers from lhs/rhs_batch_dims and lhs/rhs_contracting_dims."""
    return DotDims(inst.attr("lhs_batch_dims", ()), inst.attr("rhs_batch_dims", ()),
                   inst.attr("lhs_contracting_dims", ()), inst.attr("rhs_contracting_dims", ()))


def _required(inst, key):
    """A decoded attribute XLA's parser requires (as its `required=true` AttrConfig): missing is a parse error."""
    v = inst.attr(key)
    if v is None:
        raise inst.parse_error(f"attribute {key} is expected but not seen")
    return v


def gather_dims(inst) -> GatherDims:
    return GatherDims(_required(inst, "offset_dims"), _required(inst, "collapsed_slice_dims"),
                      _required(inst, "start_index_map"), _required(inst, "index_vector_dim"),
                      _required(inst, "slice_sizes"), inst.attr("operand_batching_dims", ()),
                      inst.attr("start_indices_batching_dims", ()), inst.attr("indices_are_sorted", False))


def scatter_dims(inst) -> ScatterDims:
    return ScatterDims(_required(inst, "update_window_dims"), _required(inst, "inserted_window_dims"),
                       _required(inst, "scatter_dims_to_operand_dims"), _required(inst, "index_vector_dim"),
                       inst.attr("input_batching_dims", ()), inst.attr("scatter_indices_batching_dims", ()),
                       inst.attr("indices_are_sorted", False), inst.attr("unique_indices", False))


# -- the table ------------------------------------------------------------------------
INT_LIST_KEYS = (
    "dimensions", "dynamic_slice_sizes", "slice_sizes", "lhs_batch_dims", "rhs_batch_dims",
    "lhs_contracting_dims", "rhs_contracting_dims", "offset_dims", "collapsed_slice_dims", "start_index_map",
    "operand_batching_dims", "start_indices_batching_dims", "update_window_dims", "inserted_window_dims",
    "scatter_dims_to_operand_dims", "input_batching_dims", "scatter_indices_batching_dims", "fft_length",
    "lhs_ragged_dims", "rhs_group_dims", "lhs_ragged_dimensions", "rhs_group_dimensions")
INT_KEYS = ("index", "delta", "index_vector_dim", "iota_dimension", "channel_id", "feature_group_count",
            "batch_group_count", "exponent_bits", "mantissa_bits", "split_dimension", "all_gather_dimension",
            "k", "num_partitions", "replica_count", "split_count", "concat_dimension", "feature_index",
            "cross_program_prefetch_index")
BOOL_KEYS = ("is_stable", "indices_are_sorted", "unique_indices", "use_global_device_ids", "constrain_layout",
             "custom_call_has_side_effect", "is_host_transfer", "largest", "is_scheduled",
             "alias_passthrough_params", "is_cross_program_prefetch", "is_composite", "left_side", "lower",
             "unit_diagonal")
WORD_KEYS = ("direction", "type", "kind", "distribution", "algorithm", "fft_type", "custom_call_target",
             "padding_type", "api_version", "custom_call_schedule", "execution_thread", "mode",
             "async_execution_thread", "infeed_config", "outfeed_config", "conv_kind", "transpose_a")


def _float(raw: str) -> float:
    v = float(raw.strip())          # XLA's ParseDouble; kFloat attrs must fit in a float
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
        except (ValueError, IndexError, KeyError, RecursionError) as e:   # RecursionError: JSON nested too deeply
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
for _k, _f in (("slice", decode_slice), ("padding", decode_padding), ("window", decode_window),
               ("dim_labels", decode_dim_labels), ("replica_groups", decode_replica_groups),
               ("source_target_pairs", decode_pairs), ("sharding", decode_sharding),
               ("metadata", decode_metadata), ("frontend_attributes", decode_frontend_attributes),
               ("backend_config", decode_backend_config),
               ("output_to_operand_aliasing", decode_output_to_operand_aliasing),
               ("control-predecessors", decode_instruction_names), ("operand_precision", decode_word_list),
               ("input_output_alias", decode_input_output_alias), ("buffer_donor", decode_buffer_donor),
               ("entry_computation_layout", decode_computation_layout),
               ("parameter_replication", decode_bool_list),
               ("allow_spmd_sharding_propagation_to_parameters", decode_bool_list),
               ("allow_spmd_sharding_propagation_to_output", decode_bool_list)):
    _register(_k, _f)
del _k, _f
