"""Malformed HLO text: every input gives a correct parse or HloParseError, nothing else.

Structured mutations of one small module (truncation at every byte, token deletion and duplication,
unbalanced brackets, huge numbers, 100k-deep nesting, invalid UTF-8, NUL bytes). Everything runs
in-process: a crash in the C scanner kills pytest, which is the failure we want to see. The
coverage-guided fuzzers live in fuzz/ (see docs/robustness.md).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hloexec
from hloexec.errors import HloParseError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
from fuzz_parse import parse_and_decode  # noqa: E402

SMALL = b"""HloModule small, entry_computation_layout={(f32[4]{0}, s32[])->(f32[], f32[2])}

/* a comment */
add_f32 {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

ENTRY main {
  p = f32[4]{0} parameter(0)
  i = s32[] parameter(1)
  c = f32[4] constant({1.5, -2, inf, nan})
  m = f32[4] multiply(p, f32[4] negate(c)), metadata={op_name="jit(f)/mul" source_file="a.py" source_line=3}
  z = f32[] constant(0)
  r = f32[] reduce(m, z), dimensions={0}, to_apply=add_f32
  d = f32[2] dynamic-slice(m, i), dynamic_slice_sizes={2}
  ROOT t = (f32[], f32[2]) tuple(r, d) // the result
}
"""

# names and numbers, strings, comments, then any single byte
TOKEN = re.compile(rb'[%\w.\-]+|"(?:[^"\\]|\\.)*"|/\*.*?\*/|//[^\n]*|\s+|.', re.S)
TOKENS = TOKEN.findall(SMALL)
assert b"".join(TOKENS) == SMALL

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def check(data: bytes):
    """Parse and decode `data`; the modules if it parsed (after checking they are well formed), else None."""
    modules = parse_and_decode(data)
    for module in modules or ():
        assert module.entry in module.computations
        for comp in module.computations:
            position = {id(inst): k for k, inst in enumerate(comp.instructions)}
            assert comp.root.computation is comp
            for k, inst in enumerate(comp.instructions):
                for operand in inst.operands:   # same computation, defined before its user: an acyclic graph
                    assert position[id(operand)] < k
        # a correct parse prints as text that parses back to the same module
        text = module.to_text()
        assert hloexec.parse(text)[0].to_text() == text
    return modules


def test_small_module_parses():
    (module,) = check(SMALL)
    assert [c.name for c in module.computations] == ["add_f32", "main"]
    assert module.entry["t"].is_root


def test_truncation_at_every_byte():
    parsed = sum(check(SMALL[:cut]) is not None for cut in range(len(SMALL) + 1))
    assert 0 < parsed < len(SMALL) // 4   # only cuts at a computation's end give a module


def test_file_stopping_mid_instruction_reports_the_line():
    lines = SMALL.split(b"\n")
    start = 0
    for number, line in enumerate(lines, 1):
        if b" = " in line and number > 11:          # an instruction of the entry computation
            for cut in range(start + line.index(b"="), start + len(line)):
                with pytest.raises(HloParseError) as info:
                    hloexec.parse(SMALL[:cut])
                assert info.value.line == number, (cut, str(info.value))
        start += len(line) + 1


@FAST
@given(st.lists(st.integers(0, len(TOKENS) - 1), min_size=1, max_size=4, unique=True))
def test_deleted_tokens(indices):
    check(b"".join(t for k, t in enumerate(TOKENS) if k not in indices))


@FAST
@given(st.lists(st.integers(0, len(TOKENS) - 1), min_size=1, max_size=4))
def test_duplicated_tokens(indices):
    check(b"".join(t * (1 + indices.count(k)) for k, t in enumerate(TOKENS)))


@FAST
@given(st.integers(0, len(SMALL)), st.sampled_from(list(b"()[]{}\"")), st.booleans())
def test_unbalanced_brackets(position, bracket, replace):
    check(SMALL[:position] + bytes([bracket]) + SMALL[position + replace:])


NUMBERS = [k for k, t in enumerate(TOKENS) if re.fullmatch(rb"-?\d+(\.\d+)?", t)]
HUGE = [b"99999999999999999999999999999", b"-9223372036854775809", b"18446744073709551616", b"9223372036854775807",
        b"1e400", b"-1e-400", b"0x7fffffff", b"4294967296", b"-0", b"1" * 5000]


@FAST
@given(st.integers(0, len(NUMBERS) - 1), st.sampled_from(HUGE))
def test_huge_numbers(which, number):
    k = NUMBERS[which]
    check(b"".join(TOKENS[:k]) + number + b"".join(TOKENS[k + 1:]))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(st.integers(0, len(SMALL)),
       st.sampled_from([(b"(", b")"), (b"[", b"]"), (b"{", b"}"), (b"{1,", b"}"), (b"(f32[], ", b")"),
                        (b"negate(", b")")]),
       st.sampled_from([99_999, 100_000, 100_001]))
def test_deep_nesting(position, brackets, depth):
    opener, closer = brackets
    check(SMALL[:position] + opener * depth + closer * depth + SMALL[position:])


@pytest.mark.parametrize("depth", [500, 5000, 100_000])
@pytest.mark.parametrize("make", [
    lambda d: b"ENTRY e {\n  ROOT p = " + b"(" * d + b"f32[]" + b")" * d + b" parameter(0)\n}\n",
    lambda d: b"ENTRY e {\n  ROOT c = f32[1] constant(" + b"{" * d + b"1" + b"}" * d + b")\n}\n",
    lambda d: b"ENTRY e {\n  ROOT c = f32[] constant(1), backend_config=" + b'{"a":' * d + b"1" + b"}" * d + b"\n}\n",
    lambda d: b"ENTRY e {\n  ROOT c = f32[] constant(1), sharding=" + b"{" * d + b"}" * d + b"\n}\n",
    lambda d: b"ENTRY e {\n  p = f32[] parameter(0)\n  ROOT c = f32[] " + b"negate(" * d + b"p" + b")" * d + b"\n}\n",
], ids=["tuple-shape", "literal", "json", "sharding", "nested-operands"])
def test_deep_nesting_everywhere(make, depth):
    check(make(depth))


@FAST
@given(st.integers(0, len(SMALL)), st.binary(min_size=1, max_size=8).filter(lambda b: not _utf8(b)))
def test_invalid_utf8(position, garbage):
    check(SMALL[:position] + garbage + SMALL[position:])


@FAST
@given(st.integers(0, len(SMALL) - 1), st.booleans())
def test_nul_bytes(position, replace):
    check(SMALL[:position] + b"\0" + SMALL[position + replace:])


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize("text", [
    b"", b"\0", b"\xff\xfe", b"HloModule", b"HloModule m", b"ENTRY", b"ENTRY e {", b"ENTRY e {}", b"}", b"{" * 10,
    b"ENTRY e {\n ROOT p = f32[] parameter(0)\n}\n" * 2,           # duplicate computation names
    b"ENTRY e {\n p = f32[] parameter(0)\n ROOT p = f32[] negate(p)\n}\n",
    b"ENTRY e {\n ROOT p = f32[] add(p, p)\n}\n",                   # uses itself
    b"ENTRY e {\n ROOT p = f32[-1] parameter(0)\n}\n",
    b"ENTRY e {\n ROOT p = f32[] parameter(-1)\n}\n",
    b"ENTRY e {\n ROOT p = f32[] parameter(x)\n}\n",
    b"ENTRY e {\n ROOT p = f32[99999999999999999999] parameter(0)\n}\n",
    b"ENTRY e {\n ROOT c = s32[] constant(99999999999999999999)\n}\n",
    b"ENTRY e {\n ROOT c = f32[100000000000] constant({...})\n}\n",
    b"ENTRY e {\n p = f32[] parameter(0)\n ROOT c = f32[] call(p), to_apply=nowhere\n}\n",
])
def test_edge_cases(text):
    check(text)
