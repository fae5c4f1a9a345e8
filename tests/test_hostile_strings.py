"""Nothing from a dump becomes code: instruction and computation names, metadata, custom-call targets, backend
configs and frontend attributes holding quotes, newlines, HTML and Python reach the code generators (fused
kernels, compiled loops, the schedule) not at all or as escaped literals, and every command's outputs (DOT,
HTML, HLO text, JSON) carry them escaped. A payload that ran would create a file: it must never appear."""
from __future__ import annotations

import json

import numpy as np
import pytest

import hloexec
from hloexec.exec import schedule_codegen
from hloexec.kernels import cache
from hloexec.tools.cli import main

SENTINEL = "HOSTILE_PAYLOAD_RAN"


def payload(tmp_path) -> str:
    """Python that, run anywhere, creates a file; wrapped in quote and newline breakouts for the common
    quoting styles, and HTML/DOT breakouts for the drawings. As the body of an HLO string literal."""
    code = f"__import__('pathlib').Path({str(tmp_path / SENTINEL)!r}).touch()"
    raw = f"\"); {code} #\n'); {code} #\n\"\"\"\n{code}\n</script><script>{code}</script>\"];{code}"
    return raw.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def module(p: str) -> str:
    """A module that fuses, loops and reduces (every generator has something to compile), with the payload in
    every string an instruction carries; Python keywords and generated-code-like words as names."""
    meta = f'metadata={{op_type="{p}" op_name="{p}" source_file="{p}" source_line=7}}'
    attrs = f'{meta}, frontend_attributes={{_xla_x="{p}", k="{p}"}}'
    return f"""HloModule hostile

%fused.lambda (param_0: f32[16], param_1: f32[16]) -> f32[16] {{
  %param_0 = f32[16] parameter(0)
  %param_1 = f32[16] parameter(1)
  %None = f32[16] multiply(%param_0, %param_1), {meta}
  ROOT %s0 = f32[16] add(%None, %param_0), {meta}
}}

%add.import (x: f32[], y: f32[]) -> f32[] {{
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %kernel = f32[] add(%x, %y), {meta}
}}

%cond.def (c: (s32[], f32[16])) -> pred[] {{
  %c = (s32[], f32[16]) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(3)
  ROOT %return = pred[] compare(%i, %n), direction=LT, {meta}
}}

%body.class (b: (s32[], f32[16])) -> (s32[], f32[16]) {{
  %b = (s32[], f32[16]) parameter(0)
  %i = s32[] get-tuple-element(%b), index=0
  %v = f32[16] get-tuple-element(%b), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one), {meta}
  %w = f32[16] multiply(%v, %v), {attrs}
  ROOT %t = (s32[], f32[16]) tuple(%next, %w)
}}

ENTRY %main.exec (arg: f32[16]) -> (f32[16], f32[]) {{
  %arg = f32[16] parameter(0), {attrs}
  %np = f32[16] fusion(%arg, %arg), kind=kLoop, calls=%fused.lambda, {attrs}, backend_config="{p}"
  %zero = s32[] constant(0)
  %init = (s32[], f32[16]) tuple(%zero, %np)
  %loop = (s32[], f32[16]) while(%init), condition=%cond.def, body=%body.class, {attrs}
  %v = f32[16] get-tuple-element(%loop), index=1
  %z = f32[] constant(0)
  %sum = f32[] reduce(%v, %z), dimensions={{0}}, to_apply=%add.import, {attrs}
  ROOT %out = (f32[16], f32[]) tuple(%v, %sum)
}}
"""


def custom_call_module(p: str) -> str:
    return (f'HloModule cc\n\nENTRY %e {{\n  %p = f32[4] parameter(0)\n'
            f'  ROOT %c = f32[4] custom-call(%p), custom_call_target="{p}", backend_config="{p}", '
            f'metadata={{op_name="{p}"}}\n}}\n')


@pytest.fixture
def generated(monkeypatch):
    """Every source the generators produce in this test: fused kernels, compiled loops, schedules."""
    sources = []

    def recording(load):
        def load_kernel(source, key, signature):
            sources.append(source)
            return load(source, key, signature)
        return load_kernel
    monkeypatch.setattr(cache, "load_kernel", recording(cache.load_kernel))   # every generated kernel loads here

    def compile_recorded(source, filename, mode):
        sources.append(source)
        sources.append(filename)
        return compile(source, filename, mode)
    monkeypatch.setattr(schedule_codegen, "compile", compile_recorded, raising=False)
    return sources


def test_strings_reach_no_generator_and_no_payload_runs(tmp_path, generated):
    p = payload(tmp_path)
    text = module(p)
    exe = hloexec.load(text, compile_after=0)             # every fusion and loop compiled before the first run
    x = np.arange(16, dtype=np.float32) / 16
    for _ in range(2):                                    # the warm run takes the generated schedule
        v, total = exe.run(x)
    want = (x * x + x) ** 8                               # the fusion, then three squarings
    np.testing.assert_allclose(v, want, rtol=1e-6)
    np.testing.assert_allclose(total, want.sum(), rtol=1e-5)
    assert generated, "no generator ran: the test checks nothing"
    assert not any("pathlib" in s or SENTINEL in s or "script" in s for s in generated)
    assert not (tmp_path / SENTINEL).exists()
    inst = hloexec.parse(text)[0].entry["np"]             # the strings themselves were read, unescaped
    assert "</script>" in inst.metadata["op_name"] and "\n" in inst.metadata["op_name"]


COMMANDS = [
    ["stats", "{f}", "--json"],
    ["run", "{f}", "--json", "--out", "{d}/out.npz"],
    ["run", "{f}", "--shadow", "--json"],
    ["compare", "{f}", "{f}", "--json"],
    ["numerics", "{f}", "--json"],
    ["memory", "{f}", "--json"],
    ["collectives", "{f}", "--json"],
    ["export", "{f}", "--astra-sim", "{d}/astra.txt", "--json"],
    ["graph", "{f}", "-o", "{d}/g.dot"],
    ["graph", "{f}", "-o", "{d}/g.html", "--around", "np"],
    ["graph", "{f}", "-o", "{d}/g.svg", "--around", "sum"],
    ["diff", "{f}", "{f}", "--json"],
    ["extract", "{f}", "sum", "-o", "{d}/x.hlo", "--json"],
    ["minimize", "{f}", "--check", "nan", "-o", "{d}/m.hlo", "--json"],
]


@pytest.mark.parametrize("which", ["program", "custom-call"])
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:1] + [x for x in a[2:] if x.startswith("-")][:2]))
def test_every_command_carries_hostile_strings_as_data(tmp_path, capsys, generated, which, argv):
    p = payload(tmp_path)
    path = tmp_path / "m.hlo"
    path.write_text(module(p) if which == "program" else custom_call_module(p))
    code = main([a.format(f=path, d=tmp_path) for a in argv])
    out, err = capsys.readouterr()
    assert "internal error" not in err and "Traceback" not in err, err
    if which == "program":
        assert code in (0, 1) or (argv[0] == "minimize" and err.startswith("error: the check does not hold")), err
    assert not (tmp_path / SENTINEL).exists()
    assert not any("pathlib" in s for s in generated)
    if argv[-1].endswith("--json") or "--json" in argv:
        if out.strip():
            json.loads(out)                           # strings escaped as JSON
    for name in ("g.html", "g.svg"):
        if (tmp_path / name).exists():
            page = (tmp_path / name).read_text()
            # the page's own script, closed once: a payload's </script> would close it early
            assert page.lower().count("</script") == (1 if name == "g.html" else 0)
            assert "<script>__import__" not in page.split("<script>", 1)[0]
    if (tmp_path / "g.dot").exists():
        dot = (tmp_path / "g.dot").read_text()
        assert all(line.count('"') % 2 == 0 or '\\"' in line for line in dot.splitlines())
    if (tmp_path / "x.hlo").exists():                 # the extracted module keeps the strings, as literals
        extracted = hloexec.parse((tmp_path / "x.hlo").read_text())[0]
        assert any("</script>" in i.metadata.get("op_name", "") for c in extracted.computations
                   for i in c.instructions)
