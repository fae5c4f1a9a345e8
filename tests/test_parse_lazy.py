"""parse() checks the whole text but builds a computation's Instruction objects only when asked for."""
from __future__ import annotations

import gc
import random
from collections import Counter

import numpy as np
import pytest

import hloexec
from hloexec.errors import HloParseError
from hloexec.parser.scan import DTYPES, ScanTables, link, scan
from conftest import shared_path

TEXT = b"""HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] multiply(f32[] %a, f32[] %b))
}

%unused (x: f32[2]) -> (f32[2], f32[2]) {
  %x = f32[2]{0} parameter(0)
  %n = f32[2]{0} negate(%x)
  ROOT %t = tuple(%x, %n)
}

ENTRY %main (p: f32[4]) -> f32[] {
  %p = f32[4]{0} parameter(0)
  %c = f32[] constant(0)
  %r = f32[] reduce(%p, %c), dimensions={0}, to_apply=%add
  %i = f32[] reduce(%p, %c), dimensions={0}, to_apply={ %u = f32[] parameter(0)
    %v = f32[] parameter(1)
    ROOT %w = f32[] maximum(%u, subtract(f32[] %u, f32[] %v)) }
  ROOT %o = f32[] add(%r, add(f32[] %i, f32[] %c))
}
"""


def _described(module) -> list:
    """Everything a built module links, by name."""
    return [(c.name, c.root.name, [(i.name, i.opcode, i.shape.to_text(), [o.name for o in i.operands],
                                    [u.name for u in i.users], sorted((k, str(v)) for k, v in i.called.items()),
                                    i.is_root, i.line, i.column, i.args, i.attrs, i.computation is c)
                                   for i in c.instructions])
            for c in module.computations]


def test_counts_come_from_the_tables_and_match_the_built_instructions():
    (m,) = hloexec.parse(TEXT)
    assert not any(c.is_built for c in m.computations)
    opcodes, shapes, count = m.opcode_counts(), m.shape_counts(), m.instruction_count
    assert not any(c.is_built for c in m.computations)
    built = list(m.instructions())
    assert all(c.is_built for c in m.computations)
    assert count == len(built) == m.instruction_count
    assert opcodes == Counter(i.opcode for i in built)
    assert shapes == Counter(i.shape for i in built)
    m.entry.instructions.pop(0)          # counts follow the objects once they exist
    assert m.opcode_counts()["parameter"] == opcodes["parameter"] - 1


def test_computations_build_the_same_in_any_order():
    (in_order,) = hloexec.parse(TEXT)
    (reversed_order,) = hloexec.parse(TEXT)
    for comp in reversed(reversed_order.computations):
        comp.root
    assert _described(reversed_order) == _described(in_order)
    # nested instructions are numbered through the text (the inline computation is a text of its own)
    names = {i.name for i in in_order.instructions()}
    assert {"multiply.anon1", "add.anon2", "subtract.anon1"} <= names


def test_computations_are_made_on_first_use_as_the_same_objects():
    inline = TEXT[TEXT.index(b"to_apply={"):TEXT.index(b"}\n  ROOT %o") + 1]
    (m,) = hloexec.parse(TEXT.replace(inline, b"to_apply=%add"))     # (inline computations make the list)
    assert m.__dict__["_computations"] is None  # only the entry exists until the list is asked for
    reduce = m.entry["r"]                       # builds the entry: links to_apply=%add before the list exists
    add = reduce.called["to_apply"]
    assert add.name == "add" and add.module is m and not add.is_built
    opcodes, count = m.opcode_counts(), m.instruction_count      # counted from the tables, built entry included
    assert m.__dict__["_computations"] is None
    names = [c.name for c in m.computations]
    assert names[0] == "add" and names[-1] == "main" and "unused" in names
    built = list(m.instructions())
    assert count == len(built) and opcodes == Counter(i.opcode for i in built)
    assert m.computations[0] is add and m.computations[-1] is m.entry and m["add"] is add
    assert all(c.module is m for c in m.computations) and [c.is_entry for c in m.computations].count(True) == 1


def test_stack_frames_are_decoded_on_first_use():
    text = b"""HloModule m

FileNames
1 "model.py"

FunctionNames
1 "f"

FileLocations
1 {file_name_id=1 function_name_id=1 line=7 end_line=7 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}

ENTRY e {
  ROOT x = f32[] constant(1), metadata={stack_frame_id=1}
}
"""
    (m,) = hloexec.parse(text)
    assert callable(m.__dict__["_stack_frames"])
    assert m.entry.root.source_location == "model.py:7"
    assert m.stack_frame(1) == ("model.py", 7) and m.stack_frame(2) is None


def test_seed_counts_match_the_built_instructions():
    (m,) = hloexec.parse(shared_path("seeds", "gpt_train_step_shard_parallel_16dev.hlo"))
    opcodes, shapes = m.opcode_counts(), m.shape_counts()
    built = list(m.instructions())
    assert opcodes == Counter(i.opcode for i in built) and shapes == Counter(i.shape for i in built)


@pytest.mark.parametrize("bad, needle", [
    (b"%n = f32[2]{0} negate(%x)", b"f32[2]{0} negate(%nope)"),     # unknown operand
    (b"%n = f32[2]{0} negate(%x)", b"f32[2x]{0} negate(%x)"),         # bad shape
    (b"%x = f32[2]{0} parameter(0)", b"f32[2]{0} parameter(-1)"),     # bad parameter number
])
def test_problems_in_a_computation_never_built_fail_in_parse(bad, needle):
    text = TEXT.replace(bad, bad.split(b"=")[0] + b"= " + needle)
    with pytest.raises(HloParseError) as info:
        hloexec.parse(text)
    line = text[:text.index(needle)].count(b"\n") + 1
    assert info.value.line == line


def test_the_problem_met_first_in_the_text_is_reported():
    # a bad parameter number before a bad shape; in one instruction the operand before its shape
    text = TEXT.replace(b"%b = f32[] parameter(1)", b"%b = f32[] parameter(x)").replace(
        b"%n = f32[2]{0} negate(%x)", b"%n = f32[2x]{0} negate(%nope)")
    with pytest.raises(HloParseError) as info:
        hloexec.parse(text)
    assert info.value.line == 5 and "parameter number" in info.value.message
    text = TEXT.replace(b"%n = f32[2]{0} negate(%x)", b"%n = f32[2x]{0} negate(%nope)")
    with pytest.raises(HloParseError) as info:
        hloexec.parse(text)
    assert "nope" in info.value.message


def _groups(ids) -> set:
    rows: dict[int, list[int]] = {}
    for r, i in enumerate(ids.tolist()):
        rows.setdefault(i, []).append(r)
    return {tuple(v) for v in rows.values()}


def _span_tables(off: list[int], length: list[int]) -> ScanTables:
    """Scanner tables of one computation whose instructions have these opcode and shape spans (no operands)."""
    instrs = np.zeros(len(off), DTYPES["instrs"])
    instrs["opcode_off"], instrs["opcode_len"] = off, length
    instrs["shape_off"], instrs["shape_len"] = off[::-1], length[::-1]
    comps = np.zeros(1, DTYPES["comps"])
    comps["instr_count"] = len(off)
    return ScanTables(np.zeros(1, DTYPES["modules"]), comps, instrs, np.zeros(0, DTYPES["operands"]),
                      np.zeros(0, DTYPES["attrs"]))


def test_link_interns_exactly_equal_bytes():
    # spans of every length around the 8-byte words the hash reads, at the end of the buffer, with NULs
    rng = random.Random(0)
    buf = bytes(rng.choice(b"ab\x00") for _ in range(300)) + bytes(rng.choice(b"ab") for _ in range(3000))
    off = [rng.randrange(len(buf)) for _ in range(3000)] + [len(buf) - 3, len(buf) - 1, len(buf)]
    length = [min(rng.choice([0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 33, 40, 200, 1000]), len(buf) - o) for o in off]
    links = link(buf, _span_tables(off, length), ())
    for ids, first, spans in ((links.opcode_ids, links.opcode_first, list(zip(off, length))),
                              (links.shape_ids, links.shape_first, list(zip(off[::-1], length[::-1])))):
        by_text: dict[bytes, list[int]] = {}
        for r, (o, n) in enumerate(spans):
            by_text.setdefault(buf[o:o + n], []).append(r)
        assert _groups(ids) == {tuple(v) for v in by_text.values()}
        assert first.tolist() == [ids.tolist().index(i) for i in range(len(first))]     # ids in order of first use


def test_scan_tables_outlive_the_scan_result():
    buf = TEXT * 3
    tables = scan(buf)
    instrs, expected = tables.instrs, tables.instrs.copy()
    del tables
    gc.collect()
    junk = [bytearray(4096) for _ in range(1000)]     # reuse of freed memory would show below
    assert np.array_equal(instrs, expected) and len(junk) == 1000
