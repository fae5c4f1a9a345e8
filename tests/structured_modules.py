"""Structure-aware fuzzing after the parser: modules that parse but are wrong in the ways the evaluator's
preparation can see -- operand counts and types for every registered opcode and custom-call target, attributes
out of range or of the wrong rank, result shapes that disagree, layouts, shardings, channel ids, sub-byte types,
huge dimensions -- driven through load, graph, memory, export, run, shadow, find-nonfinite and numerics. Only the four
hloexec errors may come out (HloParseError, UnsupportedError, ExecutionError, MemoryLimitError), and an error
found after parsing names the instruction (its name or its HLO line).

The generator draws through a `Draw` (hypothesis's `data.draw`, or a seeded random.Random for long runs), so the
CI test (tests/test_fuzz_structure.py) shrinks what it finds and the campaign below runs without hypothesis'
overhead:

    python tests/structured_modules.py --seconds 3600 --seed 1 [--out findings.json]

prints executions, distinct outcomes and findings (exception type, where it was raised, the op) as JSON.
"""
from __future__ import annotations

import json
import os
import random
import re
import resource
import sys
import time
import traceback
import warnings

DTYPES = ["f32", "f32", "f16", "bf16", "f64", "s32", "s64", "u8", "pred", "s4", "u2", "f8e4m3fn", "f8e5m2",
          "f4e2m1fn", "c64", "token"]
DIMS = [0, 1, 1, 2, 2, 3, 4, 5, 8]
HUGE = [2**31, 10**12, 2**62]
WORDS = ["LT", "GT", "EQ", "NE", "GE", "LE", "TOTALORDER", "kLoop", "kInput", "kOutput", "kCustom", "FFT", "IFFT",
         "RFFT", "IRFFT", "rng_uniform", "rng_normal", "rng_default", "rng_philox", "SIGNED", "UNSIGNED", "FLOAT",
         "STATUS_RETURNING", "API_VERSION_TYPED_FFI", "bogus", "0"]
ATTRIBUTE_KEYS = None          # filled from hloexec.ir.attributes on first use


class Draw:
    """The generator's source of choices: `choice(seq)`, `integer(lo, hi)`, `boolean(p)`."""

    def __init__(self, rng: random.Random | None = None, data=None):
        self.rng, self.data = rng, data

    def choice(self, seq):
        seq = list(seq)
        if self.data is not None:
            from hypothesis import strategies as st
            return self.data.draw(st.sampled_from(seq))
        return self.rng.choice(seq)

    def integer(self, lo: int, hi: int) -> int:
        if self.data is not None:
            from hypothesis import strategies as st
            return self.data.draw(st.integers(lo, hi))
        return self.rng.randint(lo, hi)

    def boolean(self, p: float = 0.5) -> bool:
        return self.integer(0, 999) < p * 1000


def _keys():
    global ATTRIBUTE_KEYS
    if ATTRIBUTE_KEYS is None:
        from hloexec.ir import attributes as A
        ATTRIBUTE_KEYS = {"int_list": A.INT_LIST_KEYS, "int": A.INT_KEYS, "bool": A.BOOL_KEYS,
                          "word": tuple(k for k in A.WORD_KEYS if k != "custom_call_target"),
                          "other": ("slice", "padding", "window", "dim_labels", "replica_groups",
                                    "source_target_pairs", "sharding", "metadata", "frontend_attributes",
                                    "backend_config", "output_to_operand_aliasing", "operand_precision",
                                    "epsilon", "operand_layout_constraints", "to_apply", "calls", "condition",
                                    "body", "comparator", "called_computations", "branch_computations")}
    return ATTRIBUTE_KEYS


def subjects() -> list[tuple[str, str]]:
    """('op', opcode) for every registered opcode and ('call', target) for every registered custom-call target."""
    import hloexec.ops  # noqa: F401  (fills the registries)
    from hloexec.ops.custom_call import CUSTOM_CALLS
    from hloexec.ops.registry import OPS
    return [("op", o) for o in sorted(OPS) if o != "custom-call"] + [("call", t) for t in sorted(CUSTOM_CALLS)]


def draw_dims(d: Draw, rank: int | None = None) -> list[int]:
    rank = d.integer(0, 3) if rank is None else rank
    return [d.choice(HUGE) if d.boolean(0.02) else d.choice(DIMS) for _ in range(rank)]


def draw_shape(d: Draw, depth: int = 0) -> str:
    if depth < 2 and d.boolean(0.08):
        return "(" + ", ".join(draw_shape(d, depth + 1) for _ in range(d.integer(0, 3))) + ")"
    dtype = d.choice(DTYPES)
    if dtype == "token":
        return "token[]"
    dims = draw_dims(d)
    text = f"{dtype}[{','.join(map(str, dims))}]"
    if dims and d.boolean(0.15):             # a layout, sometimes not a permutation
        order = list(range(len(dims)))[::-1] if d.boolean(0.7) else [d.integer(-1, len(dims)) for _ in dims]
        text += "{" + ",".join(map(str, order)) + "}"
    return text


def _int_list(d: Draw, rank: int) -> str:
    n = d.integer(0, max(rank, 1) + 1)
    return "{" + ",".join(str(d.choice([0, 1, 2, rank - 1, rank, -1, 7, 2**40])) for _ in range(n)) + "}"


def draw_attribute(d: Draw, key: str, rank: int) -> str:
    keys = _keys()
    small = [0, 1, 2, rank - 1, rank, -1, 3, 2**31, 2**62]
    if key in keys["int_list"]:
        return f"{key}={_int_list(d, rank)}"
    if key in keys["int"]:
        return f"{key}={d.choice(small)}"
    if key in keys["bool"]:
        return f"{key}={d.choice(['true', 'false'])}"
    if key in keys["word"]:
        return f"{key}={d.choice(WORDS)}"
    if key in ("to_apply", "calls", "condition", "body", "comparator"):
        return f"{key}=%{d.choice(['add', 'cmp', 'fn', 'cond'])}"
    if key in ("called_computations", "branch_computations"):
        return f"{key}={{" + ", ".join(f"%{d.choice(['add', 'fn', 'cond'])}" for _ in range(d.integer(0, 3))) + "}"
    if key == "slice":
        return "slice={" + ", ".join(f"[{d.choice(small)}:{d.choice(small)}" + (f":{d.choice(small)}]" if d.boolean()
                                                                                else "]")
                                     for _ in range(d.integer(0, rank + 1))) + "}"
    if key == "padding":
        return "padding=" + "x".join(f"{d.choice(small)}_{d.choice(small)}" + (f"_{d.choice(small)}" if d.boolean()
                                                                                else "")
                                     for _ in range(max(d.integer(0, rank + 1), 1)))
    if key == "window":
        n = d.integer(0, rank + 1)
        parts = [f"size={'x'.join(str(d.choice([1, 2, 3, 0, 9])) for _ in range(n))}"] if n else []
        if n and d.boolean():
            parts.append(f"stride={'x'.join(str(d.choice([1, 2, 0])) for _ in range(n))}")
        if n and d.boolean():
            parts.append(f"pad={'x'.join(f'{d.choice([0, 1, -1])}_{d.choice([0, 1, 5])}' for _ in range(n))}")
        if n and d.boolean(0.3):
            parts.append(f"lhs_dilate={'x'.join(str(d.choice([1, 2, 0])) for _ in range(n))}")
        return "window={" + " ".join(parts) + "}"
    if key == "dim_labels":
        return "dim_labels=" + d.choice(["b01f_01io->b01f", "bf_io->bf", "b0f_0io->b0f", "f01b_i01o->01bf",
                                         "b012f_012io->b012f", "bf_oi->bf"])
    if key == "replica_groups":
        return "replica_groups=" + d.choice(["{}", "{{0}}", "{{0,1}}", "{{0,1},{2,3}}", "{{1,0}}", "{{0,0}}",
                                             "[2,2]<=[4]", "{{5}}"])
    if key == "source_target_pairs":
        return "source_target_pairs=" + d.choice(["{}", "{{0,1},{1,0}}", "{{0,0}}", "{{0,7}}", "{{1,0},{1,1}}"])
    if key == "sharding":
        return "sharding=" + d.choice(["{replicated}", "{maximal device=0}", "{devices=[2]0,1}",
                                       "{devices=[2,1]0,1}", "{devices=[4]<=[4]}", "{manual}",
                                       "{{replicated}, {devices=[2]0,1}}", "{devices=[3]0,1,2}"])
    if key == "metadata":
        return 'metadata={op_name="jit(f)/x" source_file="a.py" source_line=3}'
    if key == "frontend_attributes":
        return 'frontend_attributes={_xla_stream_annotation="1", b="x"}'
    if key == "backend_config":
        return d.choice(['backend_config="{}"', 'backend_config={}', "backend_config={k = 2 : i64, mode = 85 : ui8}",
                         'backend_config={"kind":"__triton_gemm","fusion_backend_config":{}}',
                         'backend_config="\\x01\\x02"'])
    if key == "output_to_operand_aliasing":
        return "output_to_operand_aliasing={{}: (0, {})}"
    if key == "operand_precision":
        return "operand_precision={highest, default}"
    if key == "epsilon":
        return f"epsilon={d.choice(['0.001', '-1', '0'])}"
    if key == "operand_layout_constraints":
        return "operand_layout_constraints={f32[2]{0}}"
    return f"{key}=1"


COMPUTATIONS = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%cmp (x: f32[], y: f32[]) -> pred[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %lt = pred[] compare(%x, %y), direction=LT
}

%fn (q: f32[2]) -> f32[2] {
  %q = f32[2] parameter(0)
  ROOT %n = f32[2] negate(%q)
}

%cond (w: f32[2]) -> pred[] {
  %w = f32[2] parameter(0)
  ROOT %f = pred[] constant(false)
}
"""


def draw_module(d: Draw, subject: tuple[str, str] | None = None) -> tuple[str, tuple[str, str]]:
    """(HLO text, its subject): one instruction of a registered opcode or custom-call target with drawn operands,
    result and attributes, its operands entry parameters; sometimes an instruction after it uses it."""
    subject = subject or d.choice(subjects())
    kind, name = subject
    n_operands = d.integer(0, 4)
    base = draw_shape(d)
    shapes = [base if d.boolean(0.5) else draw_shape(d) for _ in range(n_operands)]
    result = d.choice([base, draw_shape(d)] + shapes[:1])
    rank = max((s.count(",") + 1 if "[]" not in s else 0) for s in [base, *shapes]) if shapes or base else 0
    keys = _keys()
    pool = [k for group in keys.values() for k in group]
    attributes = [draw_attribute(d, d.choice(pool), rank) for _ in range(d.integer(0, 4))]
    if kind == "call":
        attributes.insert(0, f'custom_call_target="{name}"')
        if d.boolean(0.3):
            attributes.append(d.choice(["api_version=API_VERSION_TYPED_FFI", "api_version=API_VERSION_ORIGINAL"]))
    seen, unique = set(), []
    for a in attributes:               # a key twice is a parse error: keep the first
        key = a.split("=", 1)[0]
        if key not in seen:
            seen.add(key)
            unique.append(a)
    opcode = "custom-call" if kind == "call" else name
    params = "".join(f"  %p{i} = {s} parameter({i})\n" for i, s in enumerate(shapes))
    args = ", ".join(f"%p{i}" for i in range(len(shapes)))
    attrs = "".join(f", {a}" for a in unique)
    body = f"{params}  %r = {result} {opcode}({args}){attrs}\n"
    if d.boolean(0.2) and shapes:
        body += f"  ROOT %t = ({result}, {shapes[0]}) tuple(%r, %p0)\n"
    else:
        body = body.replace("  %r =", "  ROOT %r =")
    return f"HloModule fuzz\n\n{COMPUTATIONS}\nENTRY %e {{\n{body}}}\n", subject


# -- driving a module through every path -----------------------------------------------------------------------
SLOW_SECONDS = 20             # longer than this for a module of a few instructions: a finding (a hang in the making)
MAX_MEMORY = 1 << 30          # every path refuses a module past this (MemoryLimitError), before allocating


def exercise(text: str) -> str:
    """Drive `text` through every path; the name of the last stage reached ("parse", ..., "done"). Raises what
    escapes: an hloexec error (allowed) or anything else (a finding)."""
    import hloexec
    from hloexec.exec.inputs import random_inputs
    from hloexec.tools import export, graph, memory, nonfinite, numerics
    stage = "parse"
    [module] = hloexec.parse(text)
    stage = "load"
    exe = hloexec.load(text, max_memory=MAX_MEMORY)
    stage = "graph"
    graph.to_dot(graph.neighbourhood(module))
    stage = "memory"
    memory.memory_report(exe)
    stage = "export"
    export.program(module)
    stage = "run"
    exe.check_memory(MAX_MEMORY)
    inputs = random_inputs(module)
    exe.run(*inputs)
    stage = "shadow"
    numerics.shadow_run(exe, inputs)
    stage = "nonfinite"
    nonfinite.find_nonfinite(exe, inputs)
    stage = "numerics"
    numerics.attribute(exe, inputs)
    return "done"


def allowed():
    from hloexec.errors import ExecutionError, HloParseError, UnsupportedError
    return HloParseError, UnsupportedError, ExecutionError          # MemoryLimitError is an ExecutionError


def names_its_site(error: BaseException, text: str) -> bool:
    """Whether an error after parsing names the instruction (`%r`/`%p0`-style name, or its HLO line), or, refusing
    the whole module (its memory, manual regions...), the module."""
    from hloexec.errors import HloParseError, MemoryLimitError
    message = str(error)
    if isinstance(error, HloParseError):
        return re.search(r":\d+:\d+:", message) is not None
    if isinstance(error, MemoryLimitError) or message.startswith("fuzz "):    # about the whole module: names it
        return "fuzz" in message
    return re.search(r"%(r|t|p\d|e)\b|line \d+", message) is not None


def outcome(text: str) -> tuple[str, str, BaseException | None]:
    """(stage reached or the error's type, a key for distinct outcomes, the exception if it is a finding)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return exercise(text), "done", None
    except allowed() as e:
        if not names_its_site(e, text):
            return type(e).__name__, f"unnamed {type(e).__name__}: {_where(e)}", e
        return type(e).__name__, f"{type(e).__name__}: {_where(e)}", None
    except RecursionError as e:
        return "RecursionError", f"RecursionError: {_where(e)}", e
    except Exception as e:  # noqa: BLE001 - anything else escaping is what the fuzzer looks for
        return type(e).__name__, f"{type(e).__name__}: {_where(e)}", e


def _where(e: BaseException) -> str:
    """The innermost hloexec frame the exception passed through: file:function."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "hloexec" in f.filename]
    if not frames:
        return "?"
    f = frames[-1]
    return f"{os.path.basename(f.filename)}:{f.name}"


def campaign(seconds: float, seed: int, limit_bytes: int = 6 << 30) -> dict:
    """Random modules for `seconds`: executions, distinct outcomes, findings (first text of each)."""
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))   # an allocation the checks missed fails
    rng = random.Random(seed)
    all_subjects = subjects()
    executions, outcomes, findings = 0, {}, {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        text, subject = draw_module(Draw(rng), rng.choice(all_subjects))
        start = time.monotonic()
        stage, key, finding = outcome(text)
        if time.monotonic() - start > SLOW_SECONDS:      # a module that parses should be refused fast
            key, finding = f"slow ({key})", finding or TimeoutError(f"{time.monotonic() - start:.0f} s")
        executions += 1
        outcomes[key] = outcomes.get(key, 0) + 1
        if finding is not None and key not in findings:
            findings[key] = {"subject": list(subject), "error": f"{type(finding).__name__}: {finding}"[:500],
                             "text": text}
    return {"executions": executions, "subjects": len(all_subjects), "distinct_outcomes": len(outcomes),
            "outcomes": dict(sorted(outcomes.items(), key=lambda kv: -kv[1])), "findings": findings}


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = campaign(args.seconds, args.seed)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(json.dumps({k: v for k, v in result.items() if k != "outcomes"} | {"findings": len(result["findings"])}))
    sys.exit(0)
