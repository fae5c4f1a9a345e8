"""Chakra execution traces (the input of ASTRA-sim 2.0): the schema, and the length-prefixed stream of it.

The schema is ours, written with protobuf's descriptor API: the subset of Chakra's `et_def.proto`
(mlcommons/chakra, schema/protobuf/et_def.proto) that hloexec writes, with Chakra's field numbers and enum
values, so that Chakra's own reader (`mlc-chakra`: chakra.src.third_party.utils.protolib.decodeMessage with
chakra.schema.protobuf.et_def_pb2) reads the files. A file is a GlobalMetadata message, then Node messages,
each preceded by its length as a varint (protolib's encodeMessage). Needs `protobuf` (pip install
'hloexec[chakra]'); mlc-chakra itself pulls in a trace-analysis stack (~500 MB) and is not needed.
"""

from __future__ import annotations

from functools import lru_cache

# Chakra's enums (et_def.proto)
METADATA_NODE, COMP_NODE, COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = 1, 4, 5, 6, 7
ALL_REDUCE, ALL_GATHER, BROADCAST, ALL_TO_ALL, REDUCE_SCATTER = 0, 2, 5, 6, 7
COMM_TYPES = {
    "all-reduce": ALL_REDUCE,
    "all-gather": ALL_GATHER,
    "collective-broadcast": BROADCAST,
    "all-to-all": ALL_TO_ALL,
    "reduce-scatter": REDUCE_SCATTER,
}
SCHEMA_VERSION = "0.0.4"

# AttributeProto's value fields hloexec writes: (field name, number, protobuf type)
_VALUE_FIELDS = (
    ("double_val", 3, "TYPE_DOUBLE"),
    ("int64_val", 9, "TYPE_INT64"),
    ("uint64_val", 13, "TYPE_UINT64"),
    ("bool_val", 27, "TYPE_BOOL"),
    ("string_val", 29, "TYPE_STRING"),
)


@lru_cache(maxsize=1)
def schema():
    """(GlobalMetadata, Node, AttributeProto) message classes, in a descriptor pool of their own."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="hloexec_chakra_et.proto", package="hloexec.chakra", syntax="proto3")

    def message(name, fields, oneof=None):
        m = f.message_type.add(name=name)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for fname, number, ftype, *rest in fields:
            label = F.LABEL_REPEATED if "repeated" in rest else F.LABEL_OPTIONAL
            field = m.field.add(name=fname, number=number, type=getattr(F, ftype), label=label)
            if ftype in ("TYPE_MESSAGE", "TYPE_ENUM"):
                field.type_name = f".hloexec.chakra.{rest[0]}"
            if "oneof" in rest:
                field.oneof_index = 0

    enum = f.enum_type.add(name="NodeType")
    for name, number in (
        ("INVALID_NODE", 0),
        ("METADATA_NODE", 1),
        ("MEM_LOAD_NODE", 2),
        ("MEM_STORE_NODE", 3),
        ("COMP_NODE", 4),
        ("COMM_SEND_NODE", 5),
        ("COMM_RECV_NODE", 6),
        ("COMM_COLL_NODE", 7),
    ):
        enum.value.add(name=name, number=number)
    message(
        "AttributeProto",
        [("name", 1, "TYPE_STRING"), ("doc_string", 2, "TYPE_STRING")]
        + [(n, num, t, "oneof") for n, num, t in _VALUE_FIELDS],
        oneof="value",
    )
    message(
        "GlobalMetadata", [("version", 1, "TYPE_STRING"), ("attr", 2, "TYPE_MESSAGE", "AttributeProto", "repeated")]
    )
    message("IOInfo", [("values", 1, "TYPE_STRING"), ("shapes", 2, "TYPE_STRING"), ("types", 3, "TYPE_STRING")])
    message(
        "Node",
        [
            ("id", 1, "TYPE_UINT64"),
            ("name", 2, "TYPE_STRING"),
            ("type", 3, "TYPE_ENUM", "NodeType"),
            ("ctrl_deps", 4, "TYPE_UINT64", "repeated"),
            ("data_deps", 5, "TYPE_UINT64", "repeated"),
            ("start_time_micros", 6, "TYPE_UINT64"),
            ("duration_micros", 7, "TYPE_UINT64"),
            ("inputs", 8, "TYPE_MESSAGE", "IOInfo"),
            ("outputs", 9, "TYPE_MESSAGE", "IOInfo"),
            ("attr", 10, "TYPE_MESSAGE", "AttributeProto", "repeated"),
        ],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    get = lambda name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"hloexec.chakra.{name}"))  # noqa: E731
    return get("GlobalMetadata"), get("Node"), get("AttributeProto")


def attr(name: str, value):
    """An AttributeProto: bool -> bool_val, int -> int64_val (uint64_val for tensor_size, as Chakra writes it),
    float -> double_val, str -> string_val."""
    _, _, Attribute = schema()
    if isinstance(value, bool):
        return Attribute(name=name, bool_val=value)
    if isinstance(value, int):
        return (
            Attribute(name=name, uint64_val=value) if name == "tensor_size" else Attribute(name=name, int64_val=value)
        )
    if isinstance(value, float):
        return Attribute(name=name, double_val=value)
    return Attribute(name=name, string_val=str(value))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def write_stream(path, metadata, nodes) -> None:
    """Chakra's file format: each message preceded by its byte length as a varint."""
    with open(path, "wb") as f:
        for message in (metadata, *nodes):
            data = message.SerializeToString()
            f.write(_varint(len(data)))
            f.write(data)


def read_stream(path) -> tuple:
    """(GlobalMetadata, [Node]) of an .et file, with hloexec's schema."""
    Metadata, Node, _ = schema()
    data = open(path, "rb").read()
    messages, pos = [], 0
    while pos < len(data):
        n, shift = 0, 0
        while True:
            byte = data[pos]
            pos += 1
            n |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        messages.append(data[pos : pos + n])
        pos += n
    if not messages:
        raise ValueError(f"{path}: empty Chakra trace")
    return Metadata.FromString(messages[0]), [Node.FromString(m) for m in messages[1:]]


def attrs_of(node) -> dict:
    """A node's attributes as {name: value}."""
    return {a.name: getattr(a, a.WhichOneof("value")) if a.WhichOneof("value") else None for a in node.attr}
