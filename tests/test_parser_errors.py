"""Bad input: every failure is one HloParseError naming path:line:col, showing the line and a caret."""
from __future__ import annotations

import pytest

import hloexec
from hloexec.errors import HloParseError

SMALL = b"""HloModule m, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %c = f32[] constant(0)
  %r = f32[] reduce(f32[4]{0} %p, f32[] %c), dimensions={0}, to_apply=%add
  ROOT %b = f32[4]{0} broadcast(f32[] %r), dimensions={}, metadata={op_name="x" source_line=3}
}
"""


def parse_error(source, **kw) -> HloParseError:
    with pytest.raises(HloParseError) as info:
        hloexec.parse(source, **kw)
    e = info.value
    assert e.line >= 1 and e.column >= 1
    text = str(e)
    assert text.splitlines()[-1].strip() == "^"       # the caret line under the shown line
    return e


def at(text: bytes, needle: bytes) -> tuple[int, int]:
    """1-based (line, column) of the first occurrence of needle."""
    off = text.index(needle)
    return text.count(b"\n", 0, off) + 1, off - (text.rfind(b"\n", 0, off) + 1) + 1


def test_small_module_parses():
    (m,) = hloexec.parse(SMALL)
    assert m.entry.root.called == {} and m.entry["r"].called["to_apply"].name == "add"


def test_truncation_at_every_byte_is_a_parse_error_or_a_module():
    for n in range(len(SMALL)):
        try:
            hloexec.parse(SMALL[:n])
        except HloParseError:
            pass


def test_unknown_operand_points_at_it():
    text = SMALL.replace(b"add(f32[] %a, f32[] %b)", b"add(f32[] %a, f32[] %nope)")
    e = parse_error(text)
    assert (e.line, e.column) == at(text, b"nope") and "nope" in e.message


def test_unknown_called_computation_points_at_it():
    text = SMALL.replace(b"to_apply=%add", b"to_apply=%missing")
    e = parse_error(text, path="x.hlo")
    assert (e.line, e.column) == at(text, b"%missing") and "missing" in e.message and "x.hlo:" in str(e)


def test_bad_shape():
    text = SMALL.replace(b"%c = f32[] constant", b"%c = f32[x] constant")
    e = parse_error(text)
    assert e.line == at(text, b"f32[x]")[0]


def test_bad_attribute_value_raises_at_the_value_on_access():
    text = SMALL.replace(b"dimensions={0}", b"dimensions={0,zz}")
    (m,) = hloexec.parse(text)
    with pytest.raises(HloParseError) as info:
        m.entry["r"].attr("dimensions")
    assert (info.value.line, info.value.column) == at(text, b"{0,zz}")


@pytest.mark.parametrize("data", [b"\x00" * 100, bytes(range(256)) * 40, b"HloModule m\n\xff\xfe\x00ENTRY {",
                                  b"ENTRY %e { %p = f32[] parameter(0) \x00 }", b"\xc3\x28\xa0\xa1 garbage"],
                         ids=["nul", "binary", "bad-utf8-header", "nul-inside", "invalid-utf8"])
def test_garbage(data):
    parse_error(data)


def test_unbalanced_braces():
    parse_error(SMALL.replace(b"dimensions={0}", b"dimensions={{0}"))
    parse_error(SMALL[:-3])


@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_deep_nesting(depth):
    shape = b"(" * depth + b"f32[]" + b")" * depth
    parse_error(b"ENTRY %e {\n  ROOT %p = " + shape + b" parameter(0), x=" + b"{" * depth + b"}" * depth + b"\n")
    parse_error(b"ENTRY %e {\n  ROOT %p = f32[] parameter(0), x=" + b"{" * depth + b"\n}\n")


def test_huge_number():
    e = parse_error(b"ENTRY %e {\n  ROOT %p = f32[" + b"9" * 5000 + b"] parameter(0)\n}\n")
    assert e.line == 2


def test_empty_and_blank():
    assert parse_error(b"").line == 1
    parse_error(b"   \n\n// just a comment\n")


def test_100mb_single_line(tmp_path):
    path = tmp_path / "long.hlo"
    with open(path, "wb") as f:
        f.write(b"HloModule m ")
        f.write(b"/" * (100 << 20))
    e = parse_error(path)
    assert e.line == 1 and str(path) in str(e) and len(str(e)) < 2000


def test_a_missing_file_is_named_not_parsed_as_text():
    for missing in ("/no/such/dump.hlo", "module.txt", "out/after_optimizations.pbtxt"):
        with pytest.raises(FileNotFoundError, match="no such file"):
            hloexec.parse(missing)
    with pytest.raises(hloexec.HloParseError, match="no HLO module"):
        hloexec.parse("just some words")


# Attribute-list mistakes: the error points at the offending token, where XLA's parser points (its positions
# were read off jaxlib 0.10.2's errors; test_attribute_list_mistakes_where_xla_says checks them on XLA itself).
_DOT = b"  %d = f32[4,4] dot(%p, %q), lhs_contracting_dims={1}, rhs_contracting_dims={0}"
_ATTRS = b"HloModule m\nENTRY e {\n  %p = f32[4,4] parameter(0)\n  %q = f32[4,4] parameter(1)\n" + _DOT + \
    b"\n  ROOT %r = f32[4,4] add(%d, %p)\n}\n"
ATTRIBUTE_MISTAKES = [  # (what, the changed dot line (or None: change the ROOT), where the error is, message)
    ("dangling comma", _DOT + b",", (6, 3), "expected attribute name after ','"),
    ("dangling comma and spaces", _DOT + b",   ", (6, 3), "expected attribute name after ','"),
    ("dangling comma on the ROOT", None, (7, 1), "expected attribute name after ','"),
    ("two commas", _DOT.replace(b", rhs", b",, rhs"), (5, 55), "expected attribute name after ','"),
    ("a comma before the first", _DOT.replace(b"), lhs", b"),, lhs"), (5, 29), "expected attribute name after ','"),
    ("no '='", _DOT.replace(b"rhs_contracting_dims=", b"rhs_contracting_dims "), (5, 56),
     "expected '=' after this attribute name"),
    ("no ',' between two", _DOT.replace(b", rhs", b" rhs"), (5, 55), "a ',' missing before it?"),
]


def _mistake(line) -> bytes:
    text = _ATTRS if line is None else _ATTRS.replace(_DOT, line)
    return text.replace(b"add(%d, %p)", b"add(%d, %p),") if line is None else text


@pytest.mark.parametrize("what, line, where, message", ATTRIBUTE_MISTAKES, ids=[m[0] for m in ATTRIBUTE_MISTAKES])
def test_attribute_list_mistakes_point_at_the_token(what, line, where, message):
    e = parse_error(_mistake(line))
    assert (e.line, e.column) == where and message in e.message


@pytest.mark.xla
@pytest.mark.parametrize("what, line, where, message", ATTRIBUTE_MISTAKES, ids=[m[0] for m in ATTRIBUTE_MISTAKES])
def test_attribute_list_mistakes_where_xla_says(what, line, where, message):
    import re
    from hloexec.tools.xla_cpu import XlaCpuError, parse_with_xla
    with pytest.raises(XlaCpuError) as info:
        parse_with_xla(_mistake(line).decode())
    assert re.search(rf"\b{where[0]}:{where[1]}: error", info.value.message), info.value.message


def test_the_documentation_snippet_with_dangling_commas(shared_path):
    """scaling-book's trimmed snippet (../shared/corpus/external): XLA says 4:3, at the next instruction."""
    e = parse_error(shared_path("corpus", "external", "files", "scalingbook_doc_entry_only_trailing_commas.hlo"))
    assert (e.line, e.column) == (4, 3) and "after ','" in e.message
