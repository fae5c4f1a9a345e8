"""Run one case through every tier of hloexec and compare their answers.

A case is an HLO module (text) and its inputs. hloexec can compute it in several ways, and every way must
give the numpy tier's answer -- bit for bit where the ops are exact:

    numpy     op by op with numpy (`use_numba=False`): the reference the op tests check against XLA:CPU
    fused     every fusion (and every group hloexec fuses itself) compiled before its first call, however
              small (`compile_after=0`), while loops interpreted; a module without fusions or groups has its
              entry computation wrapped into one fusion
    loop      every while loop compiled whole before its first step (`compile_after=0`): the loop generator
              of kernels/program.py; a module without loops runs inside one (one trip)
    switched  defaults, but every while loop switches from interpreted to compiled after one step
    default   `hloexec.load` with its defaults, run twice (a module's first run interprets, the second
              runs what compiled: fusions big enough, loops long enough), the two runs kept as two tiers

Adding a tier is one entry in TIERS: a function (case) -> outputs (flat list of arrays) that raises
NotInTier when the tier cannot take the case (a generator refusing an op or a type is not a failure:
the case then runs op by op in that tier, which the numpy tier already covers).

    for tier, outputs in run_tiers(case):      # {"numpy": [...], "fused": [...], ...}
    assert_tiers_agree(case)                   # runs them and compares each with the numpy tier

`op_module` builds a case from instructions made with op_helpers.make_inst (the op tests' cases: see
`sweep_op_cases`, which conftest.py runs at the end of every op test module).
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field

import numpy as np

import hloexec
import hloexec.exec.executor as executor
from hloexec.exec.executor import TieredKernel, TieredLoop
from hloexec.ir.printer import instruction_to_text


class NotInTier(Exception):
    """The tier cannot run this case as such (its generator refuses an op or a type)."""


@dataclass
class Case:
    name: str
    text: str
    inputs: list
    ulps: float = 0              # 0: bit-exact across tiers; else max ULPs of a float output from the numpy tier
    exact_outputs: tuple = ()    # with ulps: outputs that are exact all the same (integers are always exact)
    check: object = None         # else: check(got, want, what) raising AssertionError, for each output
    notes: dict = field(default_factory=dict)


# -- module transformations -------------------------------------------------------------------------------
_ENTRY = re.compile(r"^ENTRY %?([\w.\-]+) ", re.M)


def _entry_as_computation(text: str, name: str) -> tuple[str, "hloexec.Module"]:
    """The module's text with its entry computation renamed `name` and no longer the entry."""
    from hloexec.ir.printer import module_to_text
    module = hloexec.parse(text)[0]
    printed = module_to_text(module)
    return _ENTRY.sub(f"%{name} ", printed, count=1), module


def _zeros(shape) -> tuple[list[str], str]:
    """Instructions making a zero value of `shape` (nested tuples too), and the name of the last."""
    lines = []

    def make(s):
        if s.is_tuple:
            parts = [make(t) for t in s.tuple_shapes]
            name = f"%zero.{len(lines)}"
            lines.append(f"  {name} = {s.to_text(layout=False)} tuple({', '.join(parts)})")
            return name
        et = s.element_type.name
        name = f"%zero.{len(lines)}"
        scalar = f"{name}.s"
        lines.append(f"  {scalar} = {et}[] constant({'false' if et == 'pred' else 0})")
        lines.append(f"  {name} = {s.to_text(layout=False)} broadcast({scalar}), dimensions={{}}")
        return name
    last = make(shape)
    return lines, last


def fused_module(text: str) -> str:
    """The module with its entry computation as one fusion called by a new entry."""
    body, module = _entry_as_computation(text, "tier.fused")
    entry = module.entry
    params = entry.parameters
    head = ", ".join(f"p{p.parameter_number}: {p.shape.to_text(layout=False)}" for p in params)
    lines = [f"  %p{p.parameter_number} = {p.shape.to_text(layout=False)} parameter({p.parameter_number})"
             for p in params]
    args = ", ".join(f"%p{p.parameter_number}" for p in params)
    root = entry.root.shape.to_text(layout=False)
    lines.append(f"  ROOT %fusion = {root} fusion({args}), kind=kLoop, calls=%tier.fused")
    return f"{body}\nENTRY %tier.entry ({head}) -> {root} {{\n" + "\n".join(lines) + "\n}\n"


def looped_module(text: str) -> str:
    """The module with its entry computation called once by the body of a while loop (one trip), the loop
    carrying a counter, the entry's parameters and its result."""
    body, module = _entry_as_computation(text, "tier.step")
    entry = module.entry
    params = entry.parameters
    ps = [p.shape.to_text(layout=False) for p in params]
    result = entry.root.shape.to_text(layout=False)
    state = f"(s32[], {', '.join(ps + [result])})"
    n = len(params)
    gtes = [f"  %g{k} = {s} get-tuple-element(%s), index={k + 1}" for k, s in enumerate(ps)]
    args = ", ".join(f"%g{k}" for k in range(n))
    loop_body = "\n".join([
        f"%tier.body (s: {state}) -> {state} {{",
        f"  %s = {state} parameter(0)",
        "  %i = s32[] get-tuple-element(%s), index=0",
        "  %one = s32[] constant(1)",
        "  %i1 = s32[] add(%i, %one)",
        *gtes,
        f"  %r = {result} call({args}), to_apply=%tier.step",
        f"  ROOT %t = {state} tuple(%i1, {', '.join([f'%g{k}' for k in range(n)] + ['%r'])})",
        "}",
        "",
        f"%tier.cond (s: {state}) -> pred[] {{",
        f"  %s = {state} parameter(0)",
        "  %i = s32[] get-tuple-element(%s), index=0",
        "  %one = s32[] constant(1)",
        "  ROOT %lt = pred[] compare(%i, %one), direction=LT",
        "}",
    ])
    zero_lines, zero = _zeros(entry.root.shape)
    head = ", ".join(f"p{k}: {s}" for k, s in enumerate(ps))
    entry_lines = [f"  %p{k} = {s} parameter({k})" for k, s in enumerate(ps)] + zero_lines + [
        "  %i0 = s32[] constant(0)",
        f"  %init = {state} tuple(%i0, {', '.join([f'%p{k}' for k in range(n)] + [zero])})",
        f"  %loop = {state} while(%init), condition=%tier.cond, body=%tier.body",
        f"  ROOT %out = {result} get-tuple-element(%loop), index={n + 1}",
    ]
    return (f"{body}\n{loop_body}\n\nENTRY %tier.entry ({head}) -> {result} {{\n" + "\n".join(entry_lines)
            + "\n}\n")


# -- the tiers ----------------------------------------------------------------------------------------------
def flat(value) -> list:
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in flat(v)]
    return [np.asarray(value)]


def tier_kernels(exe) -> tuple[list, list]:
    """(fusion tiers, loop tiers) of every plan of a loaded module."""
    steps = [s for plan in exe.context.plans for s in plan.steps]
    return ([s.kernel for s in steps if isinstance(s.kernel, TieredKernel)],
            [s.kernel for s in steps if isinstance(s.kernel, TieredLoop)])


@contextlib.contextmanager
def patched(owner, **values):
    """`owner`'s attributes (hloexec.exec.executor's tiering thresholds...) set to `values` meanwhile."""
    saved = {k: getattr(owner, k) for k in values}
    for k, v in values.items():
        setattr(owner, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(owner, k, v)


def _interpreted_loop(ctx, inst):
    return None


def _has(text: str, opcode: str) -> bool:
    return re.search(rf"\s{re.escape(opcode)}\(", text) is not None


def numpy_tier(case: Case) -> list:
    return flat(hloexec.load(case.text, use_numba=False).run(*case.inputs))


def fused_tier(case: Case) -> list:
    """Every fusion (and group hloexec fuses) compiled, while loops interpreted; a module with neither
    fusions nor groups: its entry computation as one fusion."""
    with patched(executor, MIN_COMPILED_BYTES=0), patched(executor.ExecContext, compiled_loop=_interpreted_loop):
        exe = hloexec.load(case.text, compile_after=0)
        if not tier_kernels(exe)[0] and not _has(case.text, "fusion"):
            exe = hloexec.load(fused_module(case.text), compile_after=0)
    if not tier_kernels(exe)[0]:
        raise NotInTier("no fusion compiles (the fusion generator refuses its ops or types)")
    return flat(exe.run(*case.inputs))


def loop_tier(case: Case) -> list:
    """The module's while loops compiled from their first step; a module without: its entry computation in
    a loop."""
    exe = hloexec.load(case.text if _has(case.text, "while") else looped_module(case.text), compile_after=0)
    loops = [k for k in tier_kernels(exe)[1] if k.compile_work == 0]
    if not loops:
        raise NotInTier("no loop compiles (the program generator refuses its ops or types)")
    outputs = flat(exe.run(*case.inputs))
    assert all(k.compiled is not None for k in loops), f"{case.name}: a generated loop did not compile"
    return outputs


def switched_tier(case: Case) -> list:
    """Defaults, but every while loop switches from interpreted to compiled after its first step."""
    with patched(executor, LOOP_COMPILE_WORK=1, LOOP_WORK_PER_LINE=0):
        exe = hloexec.load(case.text)
    if not tier_kernels(exe)[1]:
        raise NotInTier("no while loop compiles")
    return flat(exe.run(*case.inputs))


def default_runs(case: Case) -> tuple[list, list]:
    """The first and second run of one `hloexec.load(text)` with the defaults (made once per case)."""
    if "default runs" not in case.notes:
        exe = hloexec.load(case.text)
        first = [a.copy() for a in flat(exe.run(*case.inputs))]   # the second run may reuse the first's buffers
        case.notes["default runs"] = first, flat(exe.run(*case.inputs))
    return case.notes["default runs"]


TIERS = {
    "numpy": numpy_tier,
    "fused": fused_tier,
    "loop": loop_tier,
    "default": lambda case: default_runs(case)[0],
    "default-warm": lambda case: default_runs(case)[1],
    "switched": switched_tier,
}


def run_tiers(case: Case, tiers=None) -> dict:
    """tier name -> flat outputs, or the NotInTier raised (the reason it does not apply)."""
    results = {}
    for name in tiers or TIERS:
        try:
            results[name] = TIERS[name](case)
        except NotInTier as e:
            results[name] = e
    return results


# -- comparing -----------------------------------------------------------------------------------------------
def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Representable values between same-typed floats (0 where both NaN); any float type, complex by parts."""
    if a.dtype.kind == "c":
        return np.maximum(_ulps(a.real, b.real), _ulps(a.imag, b.imag))
    bits = np.dtype(f"i{a.dtype.itemsize}")
    ka, kb = a.view(bits).astype(np.int64), b.view(bits).astype(np.int64)
    top = np.int64(np.iinfo(bits).min)
    ka, kb = np.where(ka < 0, top - ka, ka), np.where(kb < 0, top - kb, kb)
    d = np.abs(ka.astype(np.float64) - kb.astype(np.float64))
    both_nan = np.isnan(a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)) & \
        np.isnan(b.astype(np.float64))
    return np.where(both_nan, 0.0, d)


def _is_float(dtype) -> bool:
    return dtype.kind in "fc" or (dtype.kind == "V" and "float" in dtype.name)


def differences(case: Case, want: list, got: list) -> str | None:
    """Why `got` is not the numpy tier's `want` for this case (None if it is)."""
    if len(got) != len(want):
        return f"{len(got)} outputs, want {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"out{k}: {g.dtype}{list(g.shape)}, want {w.dtype}{list(w.shape)}"
        if case.check is not None:
            try:
                case.check(g, w, f"out{k}")
            except AssertionError as e:
                return str(e)
            continue
        if not _is_float(w.dtype) or w.dtype.itemsize < 1:
            bad = g.view(np.uint8) != w.view(np.uint8) if w.dtype.kind == "V" else g != w
        elif case.ulps == 0 or k in case.exact_outputs:
            same_bits = g.view(np.dtype(f"u{w.dtype.itemsize}")) == w.view(np.dtype(f"u{w.dtype.itemsize}")) \
                if w.dtype.kind != "c" else (g.view(np.uint8) == w.view(np.uint8)).reshape(w.shape + (-1,)).all(-1)
            both_nan = np.isnan(g.astype(np.complex128 if w.dtype.kind == "c" else np.float64)) & \
                np.isnan(w.astype(np.complex128 if w.dtype.kind == "c" else np.float64))
            bad = ~same_bits & ~both_nan
        else:
            bad = _ulps(g, w) > case.ulps
        if np.any(bad):
            i = np.flatnonzero(np.asarray(bad).reshape(-1))
            return (f"out{k} {w.dtype}{list(w.shape)}: {i.size} of {w.size} elements differ; first at flat "
                    f"{i[:4].tolist()}: got {g.reshape(-1)[i[:4]]!r}, want {w.reshape(-1)[i[:4]]!r}")
    return None


def assert_tiers_agree(case: Case, tiers=None) -> dict:
    """Run `case` through `tiers` (all by default) and assert each agrees with the numpy tier.
    Returns the results (NotInTier where a tier did not apply)."""
    results = run_tiers(case, ["numpy", *[t for t in (tiers or TIERS) if t != "numpy"]])
    want = results["numpy"]
    problems = []
    for name, got in results.items():
        if name == "numpy" or isinstance(got, NotInTier):
            continue
        why = differences(case, want, got)
        if why:
            problems.append(f"{name}: {why}")
    assert not problems, f"{case.name}: tiers disagree with the numpy tier\n  " + "\n  ".join(problems)
    return results
