"""Run one case through every tier of hloexec and compare their answers.

A case is an HLO module (text) and its inputs. hloexec can compute it in several ways, and every way must
give the numpy tier's answer -- bit for bit where the ops are exact:

    numpy     op by op with numpy (`use_numba=False`): the reference the op tests check against XLA:CPU
    fused     every fusion (and every group hloexec fuses itself) compiled before its first call, however
              small (`compile="eager"`), while loops interpreted; a module without fusions or groups has its
              entry computation wrapped into one fusion
    loop      every while loop compiled whole before its first step (`compile="eager"`): the loop generator
              of kernels/program.py; a module without loops has its entry computation compiled by it as
              one program
    switched  compiled when due (`compile="eager", compile_after=1`), but every while loop switches from
              interpreted to compiled after one step
    default   `hloexec.load` with its defaults, run twice (a module's first run interprets while its kernels
              compile in the background, the second runs once they are in: fusions big enough, loops),
              the two runs kept as two tiers
    shadow    the module's f64 shadow (exec/shadow.py) run as `hloexec run --shadow` runs it
              (tools/numerics.shadow_run), op by op with numpy (compiled f64 code is the other tiers'
              business), each output rounded back to its type the way the shadow narrows a value (hloexec's
              convert from f64 / c128)

The shadow computes in f64 what the program computes in its own types, so it agrees with the numpy tier by
its own rule (`shadow_case`, `shadow_op_case`), each step justified by how the two runs round:

- integer and pred outputs: bit for bit (`differences` compares every non-float output exactly). The shadow's
  integers differ only where computed from floats that differ, which a single op cannot produce: its operands
  are the same values, widened exactly;
- instructions the shadow pins (`exec.shadow.pin_reason`: bitcasts of floats, rng, stochastic and quantizing
  converts, converts from fp8/fp6/fp4 to integers, reduce-precision keeping its type's exponent width) run at
  the program's own types on the same values: bit for bit;
- a case whose float values are all f64 / c128 already: its shadow is the program itself, bit for bit;
- one op that is exact (data movement, compare, select, clamp, min/max, negate, abs, floor/ceil/round, sign,
  remainder, converts, reduce-precision, sort) or correctly rounded (add, subtract, multiply, divide, sqrt of
  real floats): bit for bit, for f32 and for f16/bf16 alike. The f64 result rounded once to T equals T's
  correctly rounded result because f64 has at least 2p+2 bits for every such T (p = 24, 11, 8: double
  rounding is innocuous, Figueroa 1995); the same theorem makes hloexec's f16/bf16 ops, computed in f32 and
  rounded once, correctly rounded; hloexec's f64 -> f16/bf16 convert goes through f32, innocuous likewise;
- one approximated op (INEXACT_OPS: exp, log, tanh, power, ... in numpy at T vs in f64 rounded to T) and
  complex arithmetic (several real roundings per element in T): within OP_ULPS of T;
- several roundings in T, or sums in an order of the tier's choosing (SUM_OPS, ops that run a computation
  over many elements, linear algebra, whole modules): within SUM_EPS epsilons of T of the output's largest
  magnitude, the bound the tiers' own sums are held to (a sum's rounding error is relative to its terms).

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
import os
import time
import re
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

import hloexec
import hloexec.exec.context as context
import hloexec.exec.tiering as tiering
from hloexec.errors import TierUnsupported
from hloexec.exec.shadow import pin_reason, shadow_type
from hloexec.exec.tiering import TieredKernel, TieredLoop
from hloexec.ir.opcodes import MOVEMENT
from hloexec.ir.printer import instruction_to_text
from hloexec.kernels.fusion import compile_fusion
from hloexec.kernels.program import compile_program
from hloexec.ops.elementwise import convert_kernel
from hloexec.tools.numerics import shadow_run


class NotInTier(Exception):
    """The tier cannot run this case as such (its generator refuses an op or a type)."""


@dataclass
class Case:
    name: str
    text: str
    inputs: list
    ulps: float = 0              # 0: bit-exact across tiers; else max ULPs of a float output from the numpy tier
    exact_outputs: tuple = ()    # with ulps: outputs that are exact all the same (integers are always exact)
    sums: tuple = ()             # float outputs summed in an order each tier chooses: within SUM_EPS of their scale
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


def called_module(text: str) -> str:
    """The module with its entry computation called by a new entry."""
    body, module = _entry_as_computation(text, "tier.called")
    params = module.entry.parameters
    head = ", ".join(f"p{p.parameter_number}: {p.shape.to_text(layout=False)}" for p in params)
    lines = [f"  %p{p.parameter_number} = {p.shape.to_text(layout=False)} parameter({p.parameter_number})"
             for p in params]
    root = module.entry.root.shape.to_text(layout=False)
    lines.append(f"  ROOT %call = {root} call({', '.join(f'%p{p.parameter_number}' for p in params)}), "
                 "to_apply=%tier.called")
    return f"{body}\nENTRY %tier.entry ({head}) -> {root} {{\n" + "\n".join(lines) + "\n}\n"


# -- the tiers ----------------------------------------------------------------------------------------------
def flat(value) -> list:
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in flat(v)]
    return [np.asarray(value)]


def tier_kernels(exe) -> tuple[list, list]:
    """(fusion tiers, loop tiers) of every plan of a loaded module."""
    steps = [s for plan in exe.plans for s in plan.steps]
    return ([s.kernel for s in steps if isinstance(s.kernel, TieredKernel)],
            [s.kernel for s in steps if isinstance(s.kernel, TieredLoop)])


@contextlib.contextmanager
def patched(owner, **values):
    """`owner`'s attributes (hloexec.exec.tiering's thresholds...) set to `values` meanwhile."""
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
    with patched(tiering, MIN_COMPILED_BYTES=0), patched(context.ExecContext, compiled_loop=_interpreted_loop):
        exe = hloexec.load(case.text, compile="eager")
        if not tier_kernels(exe)[0] and not _has(case.text, "fusion"):
            exe = hloexec.load(fused_module(case.text), compile="eager")
    if not tier_kernels(exe)[0]:
        raise NotInTier("no fusion compiles (the fusion generator refuses its ops or types)")
    return flat(exe.run(*case.inputs))


def loop_tier(case: Case) -> list:
    """The module's while loops compiled from their first step; a module without: its entry computation
    compiled as one program (a call of it: the loop generator without a loop, which Numba compiles ~10x
    faster than the same code inside a loop carrying its operands)."""
    if not _has(case.text, "while"):
        try:
            kernel = compile_program(hloexec.parse(called_module(case.text))[0].entry.root)
        except TierUnsupported as e:
            raise NotInTier(f"the program generator declines it: {e.reason}") from None
        return flat(kernel.compile()(*case.inputs))
    exe = hloexec.load(case.text, compile="eager")
    loops = [k for k in tier_kernels(exe)[1] if k.compile_work == 0]
    if not loops:
        raise NotInTier("no loop compiles (the program generator refuses its ops or types)")
    outputs = flat(exe.run(*case.inputs))
    assert all(k.compiled is not None for k in loops), f"{case.name}: a generated loop did not compile"
    return outputs


def switched_tier(case: Case) -> list:
    """The compile-when-due settings, but every while loop switches from interpreted to compiled after its first
    step."""
    with patched(tiering, LOOP_COMPILE_WORK=1, LOOP_WORK_PER_LINE=0):
        exe = hloexec.load(case.text, compile="eager", compile_after=1)
    if not tier_kernels(exe)[1]:
        raise NotInTier("no while loop compiles")
    return flat(exe.run(*case.inputs))


def default_runs(case: Case) -> tuple[list, list]:
    """The first and second run of one `hloexec.load(text)` with the defaults (made once per case), the second
    once the background compiler is done (every kernel due in)."""
    if "default runs" not in case.notes:
        exe = hloexec.load(case.text)
        first = [a.copy() for a in flat(exe.run(*case.inputs))]   # the second run may reuse the first's buffers
        exe.wait_compiled()
        case.notes["default runs"] = first, flat(exe.run(*case.inputs))
    return case.notes["default runs"]


def shadow_tier(case: Case) -> list:
    """The module's f64 shadow as `hloexec run --shadow` runs it, its outputs rounded back to their types."""
    exe = hloexec.load(case.text, use_numba=False)
    run = shadow_run(exe, case.inputs)
    leaves = [leaf.element_type for _, leaf in exe.module.entry.root.shape.leaves()]
    with np.errstate(all="ignore"):
        return [convert_kernel(shadow_type(t), t, None)(x) if shadow_type(t) is not t else x
                for x, t in zip(run.shadow, leaves)]


TIERS = {
    "numpy": numpy_tier,
    "fused": fused_tier,
    "loop": loop_tier,
    "default": lambda case: default_runs(case)[0],
    "default-warm": lambda case: default_runs(case)[1],
    "switched": switched_tier,
    "shadow": shadow_tier,
}


SECONDS: dict = {}      # tier -> time spent in it, this process


def run_tiers(case: Case, tiers=None) -> dict:
    """tier name -> flat outputs, or the NotInTier raised (the reason it does not apply)."""
    results = {}
    for name in tiers or TIERS:
        start = time.perf_counter()
        try:
            results[name] = TIERS[name](case)
        except NotInTier as e:
            results[name] = e
        SECONDS[name] = SECONDS.get(name, 0.0) + time.perf_counter() - start
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


def _flushed(x: np.ndarray) -> np.ndarray:
    """x with f32 / f64 denormals as zeros of their sign."""
    if x.dtype not in (np.float32, np.float64):
        return x
    return np.where(np.abs(x) < np.finfo(x.dtype).tiny, np.copysign(np.zeros_like(x), x), x)


SUM_EPS = 64     # a sum in another order: off by at most this many epsilons of its output's largest magnitude


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
        if k in case.sums and _is_float(w.dtype):
            scale = np.abs(w.astype(np.complex128 if w.dtype.kind == "c" else np.float64)).max(initial=0.0)
            eps = float(ml_dtypes.finfo(w.real.dtype if w.dtype.kind == "c" else w.dtype).eps)
            gc, wc = g.astype(np.complex128), w.astype(np.complex128)
            with np.errstate(invalid="ignore"):
                bad = ~((gc == wc) | (np.abs(gc - wc) <= SUM_EPS * eps * scale) | (np.isnan(gc) & np.isnan(wc)))
        elif not _is_float(w.dtype) or w.dtype.itemsize < 1:
            bad = g.view(np.uint8) != w.view(np.uint8) if w.dtype.kind == "V" else g != w
        elif case.ulps == 0 or k in case.exact_outputs:
            same_bits = g.view(np.dtype(f"u{w.dtype.itemsize}")) == w.view(np.dtype(f"u{w.dtype.itemsize}")) \
                if w.dtype.kind != "c" else (g.view(np.uint8) == w.view(np.uint8)).reshape(w.shape + (-1,)).all(-1)
            both_nan = np.isnan(g.astype(np.complex128 if w.dtype.kind == "c" else np.float64)) & \
                np.isnan(w.astype(np.complex128 if w.dtype.kind == "c" else np.float64))
            bad = ~same_bits & ~both_nan
        else:       # (a denormal result of an approximation may be 0 in another: XLA:CPU flushes them anyway)
            bad = _ulps(_flushed(g), _flushed(w)) > case.ulps
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
        why = differences(shadow_case(case) if name == "shadow" else case, want, got)
        if why:
            problems.append(f"{name}: {why}")
    assert not problems, f"{case.name}: tiers disagree with the numpy tier\n  " + "\n  ".join(problems)
    return results


# -- the op tests' cases -------------------------------------------------------------------------------------
# Float ops computed with approximations that differ between numpy and the generated kernels (libm, the kernels'
# own exp / log / tanh): their tiers agree within OP_ULPS, the others bit for bit.
INEXACT_OPS = {"exponential", "exponential-minus-one", "log", "log-plus-one", "logistic", "sine", "cosine", "tan",
               "tanh", "erf", "cbrt", "rsqrt", "power", "atan2"}
SUM_OPS = {"dot", "convolution", "reduce", "reduce-window", "fft"}      # float sums in a tier's own order
OP_ULPS = 4
# Op cases per generated module (one compile serves them all): a fused kernel's compile time grows with its size
# about linearly, a program's faster.
FUSED_BATCH, PROGRAM_BATCH = 24, 8
SHADOW_BATCH = 64       # the shadow tier compiles nothing


# The shadow tier's rule for one op (see the module docstring): the ops exact or correctly rounded in every real
# float type; every op neither there, in _MOVES_VALUES nor in INEXACT_OPS is held to the sums' bound.
SHADOW_EXACT_OPS = {"add", "subtract", "multiply", "divide", "sqrt", "negate", "abs", "maximum", "minimum", "clamp",
                    "select", "compare", "floor", "ceil", "round-nearest-afz", "round-nearest-even", "sign",
                    "remainder", "convert", "reduce-precision", "is-finite", "sort", "copy", "real", "imag",
                    "complex"}
_MOVES_VALUES = MOVEMENT | {"gather", "dynamic-update-slice", "tuple", "get-tuple-element", "iota"}
# Complex multiply, divide, abs, sqrt round several times per element (each real part is a sum of products).
_COMPLEX_ROUNDING_OPS = {"multiply", "divide", "abs", "sqrt"}


def shadow_case(case: Case) -> Case:
    """How a whole module's shadow outputs are compared: integers exact, floats within SUM_EPS of their scale
    (a module rounds many times in its own types), f64 modules exact (their shadow is the module)."""
    module = hloexec.parse(case.text)[0]
    if not _narrow_floats(module):
        return Case(case.name, case.text, case.inputs)
    return Case(case.name, case.text, case.inputs, sums=tuple(range(len(list(module.entry.root.shape.leaves())))))


def _narrow_floats(module) -> bool:
    """Whether any value of `module` has a float or complex type narrower than f64 / c128."""
    return any(shadow_type(leaf.element_type) is not leaf.element_type
               for inst in module.instructions() for _, leaf in inst.shape.leaves())


def shadow_op_case(inst, count: int) -> dict:
    """The comparison of one op case's shadow (`count` flat outputs) with its numpy tier: Case fields."""
    types = [leaf.element_type for s in (inst.shape, *(o.shape for o in inst.operands)) for _, leaf in s.leaves()]
    if all(shadow_type(t) is t for t in types if t is not None) or pin_reason(inst) is not None:
        return {}
    complex_values = any(t is not None and t.kind == "complex" for t in types)
    if inst.opcode in INEXACT_OPS or (complex_values and inst.opcode in _COMPLEX_ROUNDING_OPS):
        return {"ulps": OP_ULPS}
    if inst.opcode in SHADOW_EXACT_OPS or inst.opcode in _MOVES_VALUES:
        return {}
    return {"sums": tuple(range(count))}


def _printable(inst) -> bool:
    """Whether the case can be written as HLO text: operands are parameters, called computations are real
    (not a Python function standing in for one), and there is no literal to print."""
    if inst.opcode in ("constant", "parameter") or any(o.opcode != "parameter" for o in inst.operands):
        return False
    return not any(getattr(c, "python_fn", None) for c in inst.called_computations)


def op_cases_module(cases) -> tuple[str, list]:
    """(module text, inputs) computing every case (instruction, operand values) of `cases`: the entry takes all
    their operands and returns a tuple of their results."""
    params, lines, called, inputs, results = [], [], [], [], []
    for k, (inst, values) in enumerate(cases):
        args = []
        for o, v in zip(inst.operands, values):
            n = len(params)
            params.append(f"p{n}: {o.shape.to_text(layout=False)}")
            lines.append(f"  %p{n} = {o.shape.to_text(layout=False)} parameter({n})")
            args.append(f"%p{n}")
            inputs.append(v)
        attrs = [f"{key}={value}" for key, value in inst.attrs.items() if key not in inst.called]
        for key, comp in inst.called.items():
            comps = comp if isinstance(comp, list) else [comp]
            names = []
            for c in comps:
                names.append(f"%case{k}.{c.name}")
                text = computation_text(c, names[-1])
                if text not in called:
                    called.append(text)
            attrs.append(f"{key}={names[0] if not isinstance(comp, list) else '{' + ', '.join(names) + '}'}")
        shape = inst.shape.to_text(layout=False)
        lines.append(f"  %r{k} = {shape} {inst.opcode}({', '.join(args)}){''.join(', ' + a for a in attrs)}")
        results.append((f"%r{k}", shape))
    root = f"({', '.join(s for _, s in results)})"
    lines.append(f"  ROOT %out = {root} tuple({', '.join(r for r, _ in results)})")
    text = ("HloModule op_cases\n\n" + "\n".join(called) + f"\nENTRY %main ({', '.join(params)}) -> {root} {{\n"
            + "\n".join(lines) + "\n}\n")
    return text, inputs


def computation_text(comp, name: str) -> str:
    body = [instruction_to_text(i) for i in comp.instructions]
    sig = f"({', '.join(f'{p.name}: {p.shape.to_text(layout=False)}' for p in comp.parameters)}) -> " \
          f"{comp.root.shape.to_text(layout=False)}"
    return f"{name} {sig} {{\n" + "\n".join("  " + b for b in body) + "\n}\n"


# Compiling costs ~0.2-5 s a module: by default, SAMPLED_CASES cases of each op test module (taken evenly across
# it) go through each compiled tier; HLOEXEC_TIERS=all sends every case (test_tiers.py's
# test_every_op_case_in_every_tier does, in the slow job).
SAMPLED_CASES = 24


def _batches(cases, by_dims: bool, size: int, limit: int | None):
    """`cases` (`limit` of them, evenly spaced, if given) in batches of at most `size`; `by_dims`: each batch of
    one result shape's dims (a fusion's outputs share theirs)."""
    if limit is not None and len(cases) > limit:
        cases = [cases[int(k * len(cases) / limit)] for k in range(limit)]
    groups: dict = {}
    for case in cases:
        inst = case[1]
        groups.setdefault(("tuple" if inst.shape.is_tuple else inst.shape.dims) if by_dims else None, []).append(case)
    return [cs[k:k + size] for cs in groups.values() for k in range(0, len(cs), size)]


def sweep_op_cases(recorded) -> list[str]:
    """Run the op tests' recorded cases (op_helpers.RECORDED) through every tier, several to a module (one compile
    serves them all); returns what disagrees with the numpy tier, naming the test and the instruction."""
    limit = None if os.environ.get("HLOEXEC_TIERS") == "all" else SAMPLED_CASES
    cases = [c for c in recorded if _printable(c[1])]
    problems = []
    for tiers, by_dims, size, takes in ((["fused"], True, FUSED_BATCH, _fusion_takes),
                                        ([t for t in TIERS if t not in ("numpy", "fused", "shadow")], False,
                                         PROGRAM_BATCH, _program_takes),
                                        (["shadow"], False, SHADOW_BATCH, lambda inst: True)):
        # a case its generator refuses runs op by op in that tier: batched, it would take the others with it
        for batch in _batches([c for c in cases if takes(c[1])], by_dims, size, limit):
            problems += _sweep_batch(batch, tiers)
    return problems


def _declined(generate) -> bool:
    try:
        generate()
    except TierUnsupported:
        return True
    return False


def _fusion_takes(inst) -> bool:
    text, _ = op_cases_module([(inst, [None] * len(inst.operands))])
    return not _declined(lambda: compile_fusion(hloexec.parse(fused_module(text))[0]["tier.fused"], eager=False))


def _program_takes(inst) -> bool:
    text, _ = op_cases_module([(inst, [None] * len(inst.operands))])
    return not _declined(lambda: compile_program(hloexec.parse(called_module(text))[0].entry.root))


def _sweep_batch(batch, tiers) -> list[str]:
    text, inputs = op_cases_module([(inst, values) for _, inst, values in batch])
    inexact = {k for k, (_, inst, _) in enumerate(batch) if inst.opcode in INEXACT_OPS}
    results = run_tiers(Case("op cases", text, inputs), ["numpy", *tiers])
    want, problems = results.pop("numpy"), []
    counts = [len(list(inst.shape.leaves())) for _, inst, _ in batch]      # outputs of each case, flattened
    for name, got in results.items():
        if isinstance(got, NotInTier):
            continue
        for k, (test, inst, _) in enumerate(batch):
            leaves = slice(sum(counts[:k]), sum(counts[:k + 1]))
            if name == "shadow":
                one = Case("op case", text, inputs, **shadow_op_case(inst, counts[k]))
            else:
                one = Case("op case", text, inputs, ulps=OP_ULPS if k in inexact else 0,
                           sums=tuple(range(counts[k])) if inst.opcode in SUM_OPS else ())
            why = differences(one, want[leaves], got[leaves])
            if why:
                operands = ", ".join(o.shape.to_text(layout=False) for o in inst.operands)
                problems.append(f"{test}: {name} tier: {inst.opcode} {inst.shape.to_text(layout=False)}({operands}): "
                                f"{why.replace('out0 ', '')}")
    return problems
