"""XLA's binary dumps: HloSnapshot (`--xla_dump_hlo_snapshots`: a module with the real arguments and result of
one execution) and HloProto / HloModuleProto (`--xla_dump_hlo_as_proto`, `*.hlo.pb`).

A small hand-written protobuf reader: the wire format (varints, fixed32/64, length-delimited fields), and the
field numbers hloexec reads, from XLA's xla/service/hlo.proto and xla/xla_data.proto:

    HloSnapshot     hlo=1 (HloProto), arguments=2 (repeated LiteralProto), result=3, execution_platform=4
    HloProto        hlo_module=1 (HloModuleProto)
    HloModuleProto  name=1, entry_computation_name=2
    LiteralProto    shape=1, preds=2, u8s=3, s32s=4, s64s=5, u32s=6, u64s=7, f32s=8, f64s=9, tuple_literals=10,
                    f16s=11, c64s=12, bf16s=13, s8s=15, u16s=16, s16s=17, c128s=18, f8e5m2s=19, f8e4m3fns=20,
                    f8e4m3b11fnuzs=23, f8e5m2fnuzs=24, f8e4m3fnuzs=25, f8e4m3s=28, f8e3m4s=29
    ShapeProto      element_type=2, dimensions=3, tuple_shapes=4 (layout=5 is not needed: literals are dense
                    row-major in their logical order)

The arrays come out as numpy arrays of the HLO element types (ml_dtypes for bf16 and fp8). The module itself
(hundreds of instruction fields) is turned into HLO text by XLA's own printer through jaxlib when it is
installed (`module_text`); without jaxlib, a text dump beside the proto serves (see hloexec.tools.dumpdir).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.dtypes import element_type
from .xla_cpu import _jax


class ProtoError(ValueError):
    """A file that is not the protobuf message it should be."""


def fields(data: bytes | memoryview) -> list[tuple[int, int, int | memoryview]]:
    """The (field number, wire type, value) of one message, in order: varints as ints, fixed64/fixed32 as
    their 8/4 bytes, length-delimited fields as memoryviews."""
    data = memoryview(data)
    out: list[tuple[int, int, int | memoryview]] = []
    i, n = 0, len(data)
    while i < n:
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        value: int | memoryview
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 1:
            value, i = data[i : i + 8], i + 8
        elif wire == 2:
            length, i = _varint(data, i)
            value, i = data[i : i + length], i + length
        elif wire == 5:
            value, i = data[i : i + 4], i + 4
        else:
            raise ProtoError(f"unsupported wire type {wire} (field {number}) at byte {i}")
        if i > n:
            raise ProtoError(f"field {number} runs past the end of the message")
        out.append((number, wire, value))
    return out


def _varint(data: memoryview, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= len(data):
            raise ProtoError("a varint runs past the end of the message")
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, i
        shift += 7


# PrimitiveType enum numbers (xla_data.proto) -> HLO element type names
PRIMITIVE_TYPES = {
    1: "pred",
    2: "s8",
    3: "s16",
    4: "s32",
    5: "s64",
    6: "u8",
    7: "u16",
    8: "u32",
    9: "u64",
    10: "f16",
    11: "f32",
    12: "f64",
    13: "tuple",
    14: "opaque",
    15: "c64",
    16: "bf16",
    17: "token",
    18: "c128",
    19: "f8e5m2",
    20: "f8e4m3fn",
    21: "s4",
    22: "u4",
    23: "f8e4m3b11fnuz",
    24: "f8e5m2fnuz",
    25: "f8e4m3fnuz",
    28: "f8e4m3",
    29: "f8e3m4",
}
# LiteralProto field holding the values of each element type; packed repeated scalars or raw little-endian bytes
_LITERAL_FIELDS = {
    "pred": 2,
    "u8": 3,
    "s32": 4,
    "s64": 5,
    "u32": 6,
    "u64": 7,
    "f32": 8,
    "f64": 9,
    "f16": 11,
    "c64": 12,
    "bf16": 13,
    "s8": 15,
    "u16": 16,
    "s16": 17,
    "c128": 18,
    "f8e5m2": 19,
    "f8e4m3fn": 20,
    "f8e4m3b11fnuz": 23,
    "f8e5m2fnuz": 24,
    "f8e4m3fnuz": 25,
    "f8e4m3": 28,
    "f8e3m4": 29,
}
_VARINT_TYPES = {"pred", "s32", "s64", "u32", "u64"}  # packed varints; the others little-endian bytes


@dataclass
class Shape:
    element_type: str
    dims: tuple[int, ...] = ()
    tuple_shapes: tuple[Shape, ...] = ()


def _message(value: int | memoryview) -> memoryview:
    """The bytes of a length-delimited field (a nested message, a string)."""
    if isinstance(value, int):
        raise ProtoError(f"a varint ({value}) where a message or string belongs")
    return value


def read_shape(data) -> Shape:
    etype, dims, tuples = "invalid", [], []
    for number, _, value in fields(data):
        if number == 2:
            etype = PRIMITIVE_TYPES.get(value, f"type {value}") if isinstance(value, int) else "invalid"
        elif number == 3:
            dims += [value] if isinstance(value, int) else _varints(value)
        elif number == 4:
            tuples.append(read_shape(_message(value)))
    return Shape(etype, tuple(dims), tuple(tuples))


def _varints(value) -> list[int]:
    out, i = [], 0
    while i < len(value):
        v, i = _varint(value, i)
        out.append(v)
    return out


def read_literal(data):
    """A LiteralProto as a numpy array (a tuple literal as a tuple of them)."""
    parts = fields(data)
    shape = next((read_shape(v) for n, _, v in parts if n == 1), None)
    if shape is None:
        raise ProtoError("a literal without a shape")
    if shape.element_type == "tuple":
        return tuple(read_literal(v) for n, _, v in parts if n == 10)
    name = shape.element_type
    if name not in _LITERAL_FIELDS:
        raise ProtoError(f"literals of element type {name} are not supported")
    dtype = element_type(name).numpy
    chunks = [(w, v) for n, w, v in parts if n == _LITERAL_FIELDS[name]]
    if name in _VARINT_TYPES:
        values = np.array([x for w, v in chunks for x in (_varints(v) if w == 2 else [v])], np.uint64)
        # negative s32/s64 are written as 64-bit two's complement
        array = values.view(np.int64).astype(dtype) if name[0] == "s" else values.astype(dtype)
    else:
        raw = b"".join(bytes(v) for _, v in chunks)
        # little-endian on the wire; complex values are (real, imaginary) pairs of the float type
        array = np.frombuffer(raw, {"c64": np.complex64, "c128": np.complex128}.get(name, dtype))
    count = int(np.prod(shape.dims, dtype=np.int64))
    if array.size != count:
        raise ProtoError(f"a literal of shape {name}{list(shape.dims)} holds {array.size} values")
    return array.reshape(shape.dims).copy()


@dataclass
class Snapshot:
    """An HloSnapshot: the module (serialized HloModuleProto), its arguments, its result, where it ran."""

    module_name: str
    module_proto: bytes
    arguments: list
    result: object  # an array, or a tuple of them
    platform: str


def read_snapshot(path) -> Snapshot:
    with open(path, "rb") as f:
        data = f.read()
    module, arguments, result, platform = None, [], None, ""
    try:
        for number, _, value in fields(data):
            if number == 1:
                module = next((bytes(v) for n, _, v in fields(_message(value)) if n == 1), None)
            elif number == 2:
                arguments.append(read_literal(value))
            elif number == 3:
                result = read_literal(value)
            elif number == 4:
                platform = bytes(value).decode("utf-8", "replace")
    except (ProtoError, IndexError, ValueError) as e:
        raise ProtoError(f"{path}: not an HloSnapshot ({e})") from None
    if module is None:
        raise ProtoError(f"{path}: not an HloSnapshot (no module)")
    return Snapshot(module_name(module), module, arguments, result, platform)


def read_module_proto(path) -> bytes:
    """The serialized HloModuleProto of a `.hlo.pb` dump (an HloProto) or of a bare HloModuleProto file."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        parts = fields(data)
        inner = next((bytes(v) for n, w, v in parts if n == 1 and w == 2), None)
        # an HloProto wraps the module in field 1; a bare HloModuleProto has its name (a string) there
        if inner is not None and any(n == 3 and w == 2 for n, w, _ in fields(inner)):
            return inner
        return data
    except (ProtoError, IndexError) as e:
        raise ProtoError(f"{path}: not an HloProto ({e})") from None


def module_name(module_proto: bytes) -> str:
    for number, _, value in fields(module_proto):
        if number == 1:
            return bytes(value).decode("utf-8", "replace")
    return ""


def module_text(module_proto: bytes) -> str:
    """HLO text of a serialized HloModuleProto, by XLA's printer (needs jaxlib), large constants included."""
    try:
        _, xc = _jax()
        hlo = xc.hlo
    except ImportError:
        raise ProtoError(
            "reading a module from a protobuf dump needs jax/jaxlib (pip install jax), or a text dump "
            "of it (--xla_dump_hlo_as_text) beside the proto"
        ) from None
    try:
        module = hlo.HloModule.from_serialized_hlo_module_proto(module_proto)
    except Exception as e:  # XLA's errors have no common base
        raise ProtoError(f"XLA could not read the module proto: {e}") from None
    options = hlo.HloPrintOptions()
    options.print_large_constants = True
    return module.to_string(options)
