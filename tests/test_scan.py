"""Tests of the C scanner (csrc/hlo_scan.c) through hloexec.parser.scan.

The malformed-input sweeps run in-process on purpose: a crash in the C code
kills pytest, which is the failure we want to see.
"""
from __future__ import annotations

import os
import random
import re
from pathlib import Path

import numpy as np
import pytest

from hloexec.parser import scan as S
from hloexec.parser.scan import ScanError, scan

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("HLOEXEC_SHARED") or (REPO_ROOT.parent / "shared")).resolve()
SEEDS = SHARED / "seeds"
CORPUS = SHARED / "corpus" / "xla"
_NO_SHARED = f"shared folder {SHARED} not found (set HLOEXEC_SHARED)"


def _files(folder: Path, pattern: str) -> list:
    if not folder.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=_NO_SHARED), id="no-shared")]
    return [pytest.param(p, id=p.name) for p in sorted(folder.glob(pattern))]


def _xla_status() -> dict[str, str]:
    st = CORPUS / "STATUS.tsv"
    if not st.is_file():
        return {}
    rows = [line.split("\t") for line in st.read_text().splitlines()]
    head = rows[0]
    i_file, i_ok = head.index("file"), head.index("xla_parses")
    return {r[i_file]: r[i_ok] for r in rows[1:] if len(r) > i_ok}


def txt(buf: bytes, off, length) -> str:
    return S.span_str(buf, off, length)


def names(buf: bytes, t: S.ScanTables) -> list[str]:
    return [txt(buf, r["name_off"], r["name_len"]) for r in t.instrs]


def operand_names(buf, t, row) -> list[str]:
    r = t.instrs[row]
    ops = t.operands[r["operand_begin"]:r["operand_begin"] + r["operand_count"]]
    return [txt(buf, o["name_off"], o["name_len"]) for o in ops]


def check_links(t: S.ScanTables) -> None:
    """Cross-table invariants every successful scan must satisfy."""
    ni, no, na, nc = len(t.instrs), len(t.operands), len(t.attrs), len(t.comps)
    for m in t.modules:
        assert m["comp_begin"] + m["comp_count"] <= nc
        assert m["attr_begin"] + m["attr_count"] <= na
        if m["comp_count"]:
            assert m["comp_begin"] <= m["entry"] < m["comp_begin"] + m["comp_count"]
    for ci, c in enumerate(t.comps):
        assert c["instr_begin"] + c["instr_count"] <= ni
        assert c["attr_begin"] + c["attr_count"] <= na
        if c["instr_count"]:
            assert c["instr_begin"] <= c["root"] < c["instr_begin"] + c["instr_count"]
        assert np.all(t.instrs["computation"][c["instr_begin"]:c["instr_begin"] + c["instr_count"]] == ci)
    assert np.all(t.instrs["operand_begin"].astype(np.int64) + t.instrs["operand_count"] <= no)
    assert np.all(t.instrs["attr_begin"].astype(np.int64) + t.instrs["attr_count"] <= na)
    assert np.all(t.operands["target"] < ni)
    # an operand's target is in the same computation as its user
    for i, r in enumerate(t.instrs):
        for o in t.operands[r["operand_begin"]:r["operand_begin"] + r["operand_count"]]:
            if o["target"] >= 0:
                assert t.instrs[o["target"]]["computation"] == r["computation"]
                if o["name_len"] == 0:
                    assert o["target"] < i  # hoisted before its user


# ----------------------------------------------------------------- real files

INSTR_RE = re.compile(rb"^\s*(ROOT\s+)?%?[A-Za-z0-9_.\-]+\s*=\s*\S", re.M)


@pytest.mark.parametrize("path", _files(SEEDS, "*.hlo"))
def test_seed_files_scan(path):
    buf = path.read_bytes()
    t = scan(buf)
    check_links(t)
    assert len(t.modules) >= 1 and len(t.comps) >= 1
    # one instruction per line in these dumps (no nested operands)
    assert len(t.instrs) == len(INSTR_RE.findall(buf))
    # every operand resolves
    assert np.all(t.operands["target"] >= 0)
    for m in t.modules:
        assert m["flags"] & S.MODULE_HEADER


def test_gpt_seed_counts():
    p = SEEDS / "gpt_train_step_shard_parallel_16dev.hlo"
    if not p.is_file():
        pytest.skip(_NO_SHARED)
    buf = p.read_bytes()
    t = scan(buf)
    assert len(t.modules) == 1
    assert len(t.instrs) == 9679
    m = t.modules[0]
    assert txt(buf, m["name_off"], m["name_len"]) == "train_step_shard_parallel.6"
    e = t.comps[m["entry"]]
    assert e["flags"] & S.COMP_ENTRY
    keys = {txt(buf, a["key_off"], a["key_len"]) for a in t.attrs[m["attr_begin"]:m["attr_begin"] + m["attr_count"]]}
    assert "input_output_alias" in keys


def test_xmap_log_with_junk():
    p = SEEDS / "xmap_train_step_log.txt"
    if not p.is_file():
        pytest.skip(_NO_SHARED)
    buf = p.read_bytes()
    with pytest.raises(ScanError):
        scan(buf)
    t = scan(buf, allow_junk=True)
    check_links(t)
    ref = scan((SEEDS / "xmap_train_step_4dev.hlo").read_bytes())
    assert len(t.modules) == 1
    assert len(t.instrs) == len(ref.instrs) == 48
    m = t.modules[0]
    text = buf[m["text_off"]:m["text_off"] + m["text_len"]]
    assert text.startswith(b"HloModule xmap_train_step") and text.endswith(b"}")


@pytest.mark.parametrize("path", _files(CORPUS, "*.hlo"))
def test_corpus_file(path):
    status = _xla_status().get(path.name)
    buf = path.read_bytes()
    try:
        t = scan(buf)
    except ScanError as e:
        if status == "yes":
            raise AssertionError(f"XLA parses {path.name} but the scanner fails: {e}") from e
        pytest.skip(f"XLA does not parse it either ({status}): {e}")
    check_links(t)
    if status == "yes":
        assert len(t.modules) >= 1 and len(t.instrs) >= 1


# ----------------------------------------------------------------- forms

LONG = b"""HloModule m, entry_computation_layout={(f32[8]{0}, f32[8]{0})->f32[8]{0}}

ENTRY %main.3 (a: f32[8], b: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %b = f32[8]{0} parameter(1)
  ROOT %add.1 = f32[8]{0} add(f32[8]{0} %a, f32[8]{0} %b), metadata={op_name="x" source_line=3}
}
"""


@pytest.mark.parametrize("text", [
    LONG,
    LONG.replace(b"%", b"").replace(b"f32[8]{0} a,", b"a,").replace(b"f32[8]{0} b)", b"b)"),  # short
    LONG.replace(b"f32[8]{0} %a,", b"%a,").replace(b"f32[8]{0} %b)", b"%b)"),  # mixed
], ids=["long", "short", "mixed"])
def test_forms(text):
    t = scan(text)
    check_links(t)
    assert names(text, t) == ["a", "b", "add.1"]
    assert [txt(text, r["opcode_off"], r["opcode_len"]) for r in t.instrs] == ["parameter", "parameter", "add"]
    assert [txt(text, r["args_off"], r["args_len"]) for r in t.instrs][:2] == ["0", "1"]
    root = t.instrs[2]
    assert root["flags"] & S.INSTR_ROOT
    assert t.comps[0]["root"] == 2
    assert txt(text, root["shape_off"], root["shape_len"]) == "f32[8]{0}"
    assert operand_names(text, t, 2) == ["a", "b"]
    assert list(t.operands["target"]) == [0, 1]
    assert (root["line"], root["column"]) == (6, 3)
    a = t.attrs[root["attr_begin"]]
    assert txt(text, a["key_off"], a["key_len"]) == "metadata"
    assert txt(text, a["value_off"], a["value_len"]) == '{op_name="x" source_line=3}'
    c = t.comps[0]
    assert txt(text, c["name_off"], c["name_len"]) == "main.3"
    assert txt(text, c["signature_off"], c["signature_len"]) == "(a: f32[8], b: f32[8]) -> f32[8]"
    assert t.modules[0]["entry"] == 0


# newlines in every place the scanner steps over one: comments, strings (raw and escaped), brackets,
# operand lists, a nested operand whose opcode is on the line after its shape (read past, then rewound)
LINES_TEXT = b"""/* a comment
   over two lines */ HloModule m, entry_computation_layout={(f32[])
->f32[]}

%c (p: f32[]) -> f32[] {
  %p = f32[] parameter(0), metadata={op_name="a\\
b" source_file="x
y"}
  /* comment
  */ %q = f32[] add(%p,
     f32[] negate(
       %p)), sharding={devices=[1]
0}
  // line comment
  ROOT %r = (f32[],
    f32[]) tuple(%p, %q)
}

ENTRY %e (a: f32[]) -> f32[] {
  ROOT %x = f32[] call(f32[] add(f32[]
 negate(%a), %a)), to_apply=%c
}
"""


def _line_col(buf: bytes, off: int) -> tuple[int, int]:
    return buf.count(b"\n", 0, off) + 1, off - (buf.rfind(b"\n", 0, off) + 1) + 1


def _instr_start(buf: bytes, r) -> int:
    if r["flags"] & S.INSTR_ANONYMOUS:
        return int(r["shape_off"] if r["shape_len"] else r["opcode_off"])
    off = int(r["name_off"]) - (buf[int(r["name_off"]) - 1:int(r["name_off"])] == b"%")
    return buf.rfind(b"ROOT", 0, off) if r["flags"] & S.INSTR_ROOT else off


@pytest.mark.parametrize("junk", [False, True])
@pytest.mark.parametrize("prefix", [b"", b"junk (\nline\n"])
def test_lines_and_columns_across_newlines(junk, prefix):
    if prefix and not junk:
        pytest.skip("junk lines need allow_junk")
    buf = prefix + LINES_TEXT
    t = scan(buf, allow_junk=junk)
    assert [txt(buf, r["opcode_off"], r["opcode_len"]) for r in t.instrs] == [
        "parameter", "negate", "add", "tuple", "negate", "add", "call"]
    for r in t.instrs:
        assert (int(r["line"]), int(r["column"])) == _line_col(buf, _instr_start(buf, r))
    for c in t.comps:
        entry = buf.rfind(b"ENTRY", 0, int(c["name_off"]))
        start = entry if c["flags"] & S.COMP_ENTRY else int(c["name_off"])
        assert int(c["line"]) == _line_col(buf, start)[0]
    # in junk mode the header, whose layout crosses a line, is a junk line: the module starts at %c
    start = buf.index(b"%c (") if junk else buf.index(b"HloModule")
    assert [int(m["text_off"]) for m in t.modules] == [start]
    assert int(t.modules[0]["line"]) == _line_col(buf, start)[0]


def test_nested_operands_and_no_shape_root():
    text = b"""e {
  a = f32[] parameter(0)
  c = f32[] constant(2)
  x = f32[] add(f32[] multiply(a, f32[] negate(c)), c)
  ROOT t = tuple(a, x)
}"""
    t = scan(text)
    check_links(t)
    nm = names(text, t)
    assert nm == ["a", "c", "", "", "x", "t"]
    ops = [txt(text, r["opcode_off"], r["opcode_len"]) for r in t.instrs]
    assert ops == ["parameter", "constant", "negate", "multiply", "add", "tuple"]
    neg, mul, add, tup = t.instrs[2], t.instrs[3], t.instrs[4], t.instrs[5]
    assert neg["flags"] & S.INSTR_ANONYMOUS and mul["flags"] & S.INSTR_ANONYMOUS
    assert not (mul["flags"] & S.INSTR_NO_SHAPE)
    assert tup["flags"] & S.INSTR_NO_SHAPE and tup["flags"] & S.INSTR_ROOT and tup["shape_len"] == 0
    tgt = lambda row: [int(o["target"]) for o in t.operands[t.instrs[row]["operand_begin"]:][:t.instrs[row]["operand_count"]]]
    assert tgt(2) == [1] and tgt(3) == [0, 2] and tgt(4) == [3, 1] and tgt(5) == [0, 4]
    assert t.comps[0]["root"] == 5
    assert txt(text, add["args_off"], add["args_len"]) == "f32[] multiply(a, f32[] negate(c)), c"


def test_nesting_limit():
    depth = 200
    expr = b"a"
    for _ in range(depth):
        expr = b"f32[] negate(" + expr + b")"
    text = b"e {\n a = f32[] parameter(0)\n ROOT r = " + expr + b"\n}"
    with pytest.raises(ScanError) as ei:
        scan(text)
    assert ei.value.code == S.ERR_TOO_DEEP
    ok = b"e {\n a = f32[] parameter(0)\n ROOT r = f32[] negate(f32[] negate(a))\n}"
    assert len(scan(ok).instrs) == 3


def test_shapes_names_attrs():
    text = b"""HloModule m, is_scheduled=true, num_partitions=8

%fused.1 (p: (f32[], (s32[2]{0}, pred[])), q: f32[8,<=16]) -> (f32[], token[]) {
  %p = (f32[], (s32[2]{0}, pred[])) parameter(0)
  %gte.1-x_2 = f32[] get-tuple-element((f32[], (s32[2]{0}, pred[])) %p), index=0
  %tok = token[] after-all()
  %q = f32[8,<=16]{1,0:T(8,128)(2,1)S(6)} parameter(1), sharding={devices=[2,1,8]<=[16] last_tile_dim_replicate}
  %ar = f32[8,<=16]{1,0} all-reduce-start(%q), replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%add, backend_config="{\\"a\\":1, \\"b\\":\\"x\\"}"
  %cv = f32[1,2,2,1] convolution(%q, %q), window={size=3x3 pad=0_0x1_1}, dim_labels=b01f_01io->b01f
  %k = s32[2,2]{1,0} constant({ {1,2},{3,4} })
  %tc = (s32[], f32[]) constant((1, 2))
  %io = s32[4] iota(), iota_dimension=0
  %r = f32[] reduce(%q, %gte.1-x_2), dimensions={0,1}, to_apply={
    x = f32[] parameter(0)
    y = f32[] parameter(1)
    ROOT z = f32[] add(x, y)
  }
  ROOT %t = (f32[], token[]) tuple(f32[] %gte.1-x_2, /*index=1*/token[] %tok) // comment
}
"""
    t = scan(text)
    check_links(t)
    m = t.modules[0]
    assert m["attr_count"] == 2 and m["entry"] == 0  # no ENTRY: the last computation
    by = {txt(text, r["name_off"], r["name_len"]): r for r in t.instrs}
    p = by["p"]
    assert txt(text, p["shape_off"], p["shape_len"]) == "(f32[], (s32[2]{0}, pred[]))"
    q = by["q"]
    assert txt(text, q["shape_off"], q["shape_len"]) == "f32[8,<=16]{1,0:T(8,128)(2,1)S(6)}"
    assert txt(text, by["gte.1-x_2"]["opcode_off"], by["gte.1-x_2"]["opcode_len"]) == "get-tuple-element"
    assert txt(text, by["k"]["args_off"], by["k"]["args_len"]) == "{ {1,2},{3,4} }"
    assert txt(text, by["tc"]["args_off"], by["tc"]["args_len"]) == "(1, 2)"
    assert by["k"]["operand_count"] == 0 and by["io"]["operand_count"] == 0

    def attrs(r):
        return {txt(text, a["key_off"], a["key_len"]): txt(text, a["value_off"], a["value_len"])
                for a in t.attrs[r["attr_begin"]:r["attr_begin"] + r["attr_count"]]}

    assert attrs(q) == {"sharding": "{devices=[2,1,8]<=[16] last_tile_dim_replicate}"}
    assert attrs(by["ar"]) == {"replica_groups": "[4,2]<=[2,4]T(1,0)", "to_apply": "%add",
                               "backend_config": '"{\\"a\\":1, \\"b\\":\\"x\\"}"'}
    assert attrs(by["cv"]) == {"window": "{size=3x3 pad=0_0x1_1}", "dim_labels": "b01f_01io->b01f"}
    assert attrs(by["r"])["to_apply"].startswith("{\n    x = f32[]")
    assert operand_names(text, t, int(np.flatnonzero(t.instrs["flags"] & S.INSTR_ROOT)[0])) == ["gte.1-x_2", "tok"]
    assert np.all(t.operands["target"] >= 0)


def test_multi_module_and_separator():
    one = b"HloModule a\nENTRY e {\n  ROOT x = f32[] constant(1)\n}\n"
    bare = b"f {\n  ROOT y = f32[] constant(2)\n}\nENTRY g {\n  ROOT z = f32[] constant(3)\n}\n"
    text = one + b"\n// -----\n\n" + bare + b"// -----\n" + bare + one
    t = scan(text)
    check_links(t)
    assert len(t.modules) == 4
    assert [int(m["flags"]) for m in t.modules] == [1, 0, 0, 1]
    assert [int(m["comp_count"]) for m in t.modules] == [1, 2, 2, 1]
    assert [int(m["entry"]) for m in t.modules] == [0, 2, 4, 5]
    m1 = t.modules[1]
    assert text[m1["text_off"]:m1["text_off"] + m1["text_len"]] == bare.rstrip(b"\n")
    assert t.modules[1]["name_len"] == 0
    # comment lines that merely contain dashes are comments
    t2 = scan(b"// ------ x\n" + bare + b"  // -----\n" + bare)
    assert len(t2.modules) == 1 and len(t2.comps) == 4


def test_junk_lines():
    mod = b"HloModule a\nENTRY e {\n  ROOT x = f32[] constant(1)\n}\n"
    text = b"I0101 12:00 starting\nfoo bar: baz (\n" + mod + b"Best cost: 12.5\n" + b"f {\n  ROOT y = f32[] constant(2)\n}\n"
    with pytest.raises(ScanError) as ei:
        scan(text)
    assert ei.value.offset == 6 and ei.value.code == S.ERR_SYNTAX  # "I0101 12:00": no "{" after a name
    t = scan(text, allow_junk=True)
    check_links(t)
    assert len(t.modules) == 2  # the junk line after the first module ends it
    assert [int(m["comp_count"]) for m in t.modules] == [1, 1]


def test_preamble():
    text = b"""HloModule m, entry_computation_layout={()->f32[]}

FileNames
1 "a.py"
2 "<embedded module \\'x\\'>"

FunctionNames
1 "f"

FileLocations
1 {file_name_id=1 function_name_id=1 line=3 end_line=3 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}

ENTRY e {
  ROOT x = f32[] constant(1), metadata={stack_frame_id=1}
}
"""
    t = scan(text)
    m = t.modules[0]
    pre = text[m["preamble_off"]:m["preamble_off"] + m["preamble_len"]]
    assert pre.startswith(b"FileNames\n") and pre.endswith(b"parent_frame_id=1}")
    assert len(t.comps) == 1


def test_comp_attrs_and_unknown_operand():
    text = b"""%c (p: f32[]) -> f32[], execution_thread="t" {
  p = f32[] parameter(0)
  ROOT r = f32[] add(p, nope)
}, execution_thread="u"
"""
    t = scan(text)
    c = t.comps[0]
    assert c["attr_count"] == 2
    assert list(t.operands["target"]) == [0, -1]


def test_errors_point_at_byte():
    cases = [
        (b"e {\n  a f32[] parameter(0)\n}", S.ERR_SYNTAX, "expected '=' after instruction name", 8),
        (b"e {\n  a = f32[] add(a b)\n}", S.ERR_SYNTAX, "expected ',' or ')'", 22),
        (b"e {\n  a = f32[] parameter(0)\n  a = f32[] parameter(1)\n}", S.ERR_DUPLICATE, "duplicate", 31),
        (b'e {\n  a = f32[] constant(0), m="abc\n}', S.ERR_UNTERMINATED, "string", 31),
        (b"e {\n  a = f32[] parameter(0)\n", S.ERR_UNTERMINATED, "'}'", 29),
        (b"e {\n  a = f32[2}{0} parameter(0)\n}", S.ERR_SYNTAX, "mismatched", 15),
        (b"e {\n  a = f32[] parameter(0) /* x\n}", S.ERR_UNTERMINATED, "comment", 29),
    ]
    for text, code, msg, off in cases:
        with pytest.raises(ScanError) as ei:
            scan(text)
        e = ei.value
        assert (e.code, e.offset) == (code, off), (text, e)
        assert msg in e.message


def test_buffer_types():
    import mmap
    import tempfile

    with tempfile.TemporaryFile() as f:
        f.write(LONG)
        f.flush()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            t = scan(mm)
            assert len(t.instrs) == 3
    assert len(scan(bytearray(LONG)).instrs) == 3
    assert len(scan(memoryview(LONG)).instrs) == 3
    t = scan(b"")
    assert len(t.modules) == 0 and t.instrs.dtype == S.DTYPES["instrs"]
    with pytest.raises(TypeError):
        scan(LONG.decode())


# ----------------------------------------------------------------- malformed input

def _scan_any(buf: bytes, junk: bool = False):
    try:
        t = scan(buf, allow_junk=junk)
    except ScanError as e:
        assert 0 <= e.offset <= len(buf) and e.message
        assert e.code in (1, 2, 3, 5), e
        return None
    check_links(t)
    for tab in (t.instrs, t.operands, t.attrs):
        for f in tab.dtype.names:
            if f.endswith("_off"):
                ln = tab[f[:-4] + "_len"]
                assert np.all(tab[f] + ln <= len(buf))
    return t


SMALL = (LONG + b"\n// -----\n" + b"""f {
  a = (f32[], s32[2]{0}) parameter(0), sharding={replicated}
  b = f32[] get-tuple-element(a), index=0
  ROOT c = f32[] add(f32[] multiply(b, b), b), backend_config="{\\"k\\":[1,2]}", to_apply={ x = f32[] parameter(0) }
}
""")


@pytest.mark.parametrize("junk", [False, True])
def test_truncate_at_every_byte(junk):
    for i in range(len(SMALL) + 1):
        _scan_any(SMALL[:i], junk)
        _scan_any(SMALL[i:], junk)


def test_random_bytes_and_mutations():
    rng = random.Random(1234)
    alphabet = b'(){}[]<>"\\/*%=,.:- \n\tabcfs0123ROOTENTRY\x00\xff'
    for _ in range(3000):
        n = rng.randrange(0, 200)
        _scan_any(bytes(rng.randrange(256) for _ in range(n)), rng.random() < 0.5)
        _scan_any(bytes(rng.choice(alphabet) for _ in range(n)), rng.random() < 0.5)
    for _ in range(3000):
        b = bytearray(SMALL)
        for _ in range(rng.randrange(1, 6)):
            op = rng.randrange(3)
            i = rng.randrange(len(b))
            if op == 0:
                b[i] = rng.choice(alphabet)
            elif op == 1:
                del b[i]
            else:
                b.insert(i, rng.choice(alphabet))
        _scan_any(bytes(b), rng.random() < 0.5)


def test_nul_and_invalid_utf8():
    _scan_any(b"\x00" * 1000)
    _scan_any(LONG.replace(b"%b = ", b"%b\x00 = "))
    _scan_any(LONG.replace(b"op_name=\"x\"", b"op_name=\"\xff\xfe\x00\""))
    t = _scan_any(LONG.replace(b'"x"', b'"\xc3\x28\x00"'))
    assert t is not None


@pytest.mark.parametrize("opener,closer", [(b"(", b")"), (b"[", b"]"), (b"{", b"}")])
def test_deep_nesting(opener, closer):
    n = 100_000
    deep = opener * n + closer * n
    _scan_any(b"e {\n  a = f32[] constant(" + deep + b")\n}")
    _scan_any(b"e {\n  a = f32[] constant(0), x=" + deep + b"\n}")
    _scan_any(b"e {\n  a = f32[] constant(0), x=" + opener * (n + 10) + b"\n}")
    _scan_any(opener * (3 * n), True)
    _scan_any(closer * (3 * n), True)


def test_unbalanced():
    for text in [b"e {\n a = f32[] constant({1,2)\n}", b"e {\n a = f32[] constant(1))\n}", b"e }", b"}}}{{{",
                 b"HloModule m, a={", b"HloModule m\n e {\n", b"e (a: f32[] -> f32[] {\n}"]:
        assert _scan_any(text) is None


def test_huge_numbers_and_long_lines():
    big = b"9" * 100_000
    _scan_any(b"e {\n  a = f32[" + big + b"] parameter(" + big + b")\n}")
    long_line = b"e { a = f32[] constant(0), x={" + b"1," * 2_000_000 + b"1} ROOT b = f32[] add(a, a) }"
    t = _scan_any(long_line)
    assert t is not None and len(t.instrs) == 2
    assert int(t.instrs[1]["line"]) == 1 and int(t.instrs[1]["column"]) > 4_000_000


def test_the_pre_parsed_cffi_modules_match_their_headers(tmp_path):
    """hloexec/parser/_scan_ffi.py and hloexec/kernels/_spin_ffi.py are generated from csrc/'s headers (python
    hloexec/parser/scan_cdef.py); a header edited without regenerating would bind the old declarations."""
    from hloexec.parser import scan_cdef
    for binding in scan_cdef.BINDINGS:
        fresh = tmp_path / binding.path.name
        scan_cdef.generate(binding, fresh, csrc=Path(__file__).resolve().parents[1] / "csrc")  # the repo's
        assert fresh.read_text() == binding.path.read_text(), binding.header                    # the installed