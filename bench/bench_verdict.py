"""Detection power of `compare --reference shadow`'s verdict (issue 28): single-element changes injected into
correct results, caught or not, by the per-element bounds (tools/bounds.py) and by the old rule (the baseline's
error + 3 x its rms + 4 ulps); false alarms on the unchanged results.

    python bench/bench_verdict.py                       # every program below
    python bench/bench_verdict.py adam_f16 rmsnorm_bwd_f16
    python bench/bench_verdict.py --cost                # bounds' time and memory on the GPT d256 step
    python bench/bench_verdict.py --cost gpt tpu xmap   # ... and on the SPMD seeds that fit (COST_SEEDS)
    python bench/bench_verdict.py --slack train_step    # per instruction: RMS bound / RMS error (any program)
    python bench/bench_verdict.py --blocks gpt_step_d256_bf16   # how uneven the calibrated blocks' looseness is
    python bench/bench_verdict.py --census gpt_step_d256_bf16 5 # elements cut below 4 sigma, over observer seeds

Per program (jax-made, its pre-optimization HLO) two correct candidates, each judged by the arithmetic that made
it, as `compare --against xla --reference shadow` does: hloexec's run under the reference profile (16-bit sums
accumulate in f32) and XLA:CPU's under xla_cpu_arithmetic() (its f16/bf16 reductions round every step).
Injections, per float output: the element of largest magnitude and 3 random elements of moderate size (|x| in
[0.1, 0.5] x the output's scale) changed by 1% and 0.1% of their value and by 2x and 4x their own bound (added to
the candidate's error); "caught": the verdict on that output (every rule) says not consistent. Rounding-decided
elements are not injected. Per missed 1% change, its output and the longest sum on that output's path (issue
28's 1% goal exempts inputs reduced over thousands of terms). hloexec's run under each of PROFILES too, judged by
that profile's bounds: its false alarms (new / old rule).
Prints a markdown table (bench/README.md) and the run's load; `--json` the rows.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PCTS = (0.01, 0.001)
PROFILES = ("tpu", "a100", "h100")  # hloexec's run under each, judged by its own bounds: false alarms
MULTIPLES = (2.0, 4.0)
MODERATE = 3


def _norm_grad(kind: str, dtype: str):
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    dt = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}[dtype]

    def norm(x, g, b):
        x32 = x.astype(jnp.float32)
        if kind == "rms":
            y = x32 * jax.lax.rsqrt(jnp.mean(x32 ** 2, -1, keepdims=True) + 1e-6)
        else:
            mu = x32.mean(-1, keepdims=True)
            y = (x32 - mu) * jax.lax.rsqrt(((x32 - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
        return y.astype(x.dtype) * g + b

    def loss(x, g, b, dy):
        return jnp.sum((norm(x, g, b) * dy).astype(jnp.float32))
    r = np.random.default_rng(0)
    x = r.standard_normal((8, 128, 256)).astype(dt)
    g = (1 + 0.1 * r.standard_normal(256)).astype(dt)
    b = (0.1 * r.standard_normal(256)).astype(dt)
    dy = r.standard_normal((8, 128, 256)).astype(dt)
    return jax.grad(loss, argnums=(0, 1, 2)), (x, g, b, dy)


def _softmax_xent(dtype: str):
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    dt = {"bf16": ml_dtypes.bfloat16, "f32": np.float32}[dtype]

    def loss(logits, labels):
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], -1))
    r = np.random.default_rng(1)
    return jax.value_and_grad(loss), (r.standard_normal((256, 1024)).astype(dt),
                                      r.integers(0, 1024, 256).astype(np.int32))


def _attention(dtype: str):
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    dt = {"bf16": ml_dtypes.bfloat16, "f32": np.float32}[dtype]

    def attend(q, k, v, dout):
        s = jnp.einsum("htd,hsd->hts", q, k) / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype))
        s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, jnp.asarray(-1e4, s.dtype))
        p = jax.nn.softmax(s.astype(jnp.float32), -1).astype(q.dtype)
        return jnp.sum((jnp.einsum("hts,hsd->htd", p, v) * dout).astype(jnp.float32))
    r = np.random.default_rng(2)
    args = tuple(r.standard_normal((4, 128, 64)).astype(dt) for _ in range(4))
    return jax.grad(attend, argnums=(0, 1, 2)), args


def _from_tests(name: str):
    import numerics_programs
    return getattr(numerics_programs, name)()


def _gpt_step(later: bool = False):
    """The GPT d256 bf16 train step of bench/workloads.py: its first step (zero moments), or (`later`) its second,
    from the state jax's first step made."""
    import jax
    import jax.numpy as jnp
    import workloads
    fn, args = workloads._gpt_step(jnp.bfloat16)
    if later:
        _, params, m, v = jax.jit(fn)(*args)
        args = (params, m, v, *args[3:5], np.int32(2))
    return fn, args


PROGRAMS = {
    "adam_f16": lambda: _from_tests("adam_f16"),
    "layernorm_bwd_f16": lambda: _norm_grad("layer", "f16"),
    "layernorm_bwd_bf16": lambda: _norm_grad("layer", "bf16"),
    "layernorm_bwd_f32": lambda: _norm_grad("layer", "f32"),
    "rmsnorm_bwd_f16": lambda: _norm_grad("rms", "f16"),
    "rmsnorm_bwd_bf16": lambda: _norm_grad("rms", "bf16"),
    "rmsnorm_bwd_f32": lambda: _norm_grad("rms", "f32"),
    "softmax_xent_f32": lambda: _softmax_xent("f32"),
    "softmax_xent_bf16": lambda: _softmax_xent("bf16"),
    "attention_bwd_bf16": lambda: _attention("bf16"),
    "attention_bwd_f32": lambda: _attention("f32"),
    "gpt_step_d256_bf16": _gpt_step,
    "gpt_step_d256_bf16_second": lambda: _gpt_step(later=True),
}


def _positions(shadow: np.ndarray, decided: np.ndarray, rng) -> list[int]:
    magnitude = np.where(np.isfinite(shadow) & ~decided, np.abs(shadow), -1.0).ravel()
    scale = magnitude.max()
    moderate = np.flatnonzero((magnitude >= 0.1 * scale) & (magnitude <= 0.5 * scale))
    picked = rng.choice(moderate, min(MODERATE, moderate.size), replace=False) if moderate.size else []
    return [int(np.argmax(magnitude))] + [int(k) for k in picked]


def _away_to(element: np.ndarray, exact: float, error: float) -> None:
    """Step the one-element array `element` away from `exact` on its type's grid until its error is at least
    `error` (a change rounded to the nearest value of a bf16 output could land short of k x the bound)."""
    while abs(float(element[0]) - exact) < error:
        element[:] = np.nextafter(element, np.full_like(element, np.inf if element[0] >= exact else -np.inf))


def _bound_ulps(run, device: str, values: list) -> float:
    """The median bound of the 16-bit outputs, in ulps of their type at the element, over the elements injected
    into (judged, finite, at least a tenth of the output's scale): a change is caught beyond bound_factor x
    that. NaN without a 16-bit output."""
    from hloexec.tools.compare import ulp_at
    b, ratios = run.bounds[device], []
    for i, (s, c) in enumerate(zip(run.shadow, values)):
        exact, dtype = np.asarray(s), np.asarray(c).dtype
        if b.bounds[i] is None or exact.size == 0 or dtype.kind not in "fV" or dtype.itemsize != 2:
            continue
        magnitude = np.abs(exact.astype(np.float64))
        kept = np.isfinite(magnitude) & ~b.decided[i] & (magnitude >= 0.1 * magnitude[np.isfinite(magnitude)].max())
        kept &= np.isfinite(b.bounds[i])
        ratios.append(b.bounds[i][kept] / ulp_at(magnitude[kept], dtype))
    return float(np.median(np.concatenate(ratios))) if ratios else float("nan")


def _caught(judge, shadow, baseline, candidate, bounds) -> bool:
    return not judge([shadow], [baseline], {"c": [candidate]}, bounds=bounds).consistent("c")


def _injections(judge, OutputBounds, run, baseline, candidate: list, device: str, rng) -> dict:
    """name -> [caught by the bounds, caught by the old rule] lists over outputs and positions."""
    tally: dict[str, list] = {}
    b = run.bounds[device]
    for i, (s, c) in enumerate(zip(run.shadow, candidate)):
        c = np.asarray(c)
        if b.bounds[i] is None or c.size == 0 or c.dtype.kind not in "fV":
            continue
        one = OutputBounds(device, [b.bounds[i]], [b.decided[i]], {}, [])
        exact = np.asarray(s, np.float64)
        for k in _positions(exact, b.decided[i], rng):
            where = "largest" if k == int(np.argmax(np.where(np.isfinite(exact), np.abs(exact), -1))) else "moderate"
            value = float(c.reshape(-1)[k])
            away = np.sign(value - exact.reshape(-1)[k]) or 1.0
            changes = {f"{p:.1%} {where}": value * (1 + p * away * np.sign(value or 1.0)) for p in PCTS}
            changes |= {f"{m:g}x bound {where}": value + away * m * float(b.bounds[i].reshape(-1)[k])
                        for m in MULTIPLES}
            for name, new in changes.items():
                bumped = np.array(c, copy=True)
                bumped.reshape(-1)[k] = new
                if "bound" in name:     # stored in a 16-bit type, k x the bound must not round to less
                    _away_to(bumped.reshape(-1)[k:k + 1], exact.reshape(-1)[k], abs(new - exact.reshape(-1)[k]))
                if float(bumped.reshape(-1)[k]) == value:
                    continue            # the change is below the type's resolution there
                tally.setdefault(name, [[], [], []])
                caught = _caught(judge, s, baseline[i], bumped, one)
                tally[name][0].append(caught)
                tally[name][1].append(_caught(judge, s, baseline[i], bumped, None))
                if not caught:
                    tally[name][2].append(i)
    return tally


def _longest_sums(module) -> list:
    """Per output of the entry's root tuple, the most terms one sum on its path adds (reduce: the reduced dims'
    sizes multiplied; dot: the contracting dims'; what a called computation holds counted whole): issue 28's 1%
    goal exempts elements whose inputs are reduced over thousands of terms."""
    longest: dict[int, int] = {}

    def own(inst) -> int:
        if inst.opcode == "reduce":
            return math.prod(inst.operands[0].shape.dims[d] for d in inst.attr("dimensions", ()))
        if inst.opcode == "dot":
            return math.prod(inst.operands[0].shape.dims[d] for d in inst.attr("lhs_contracting_dims", ()))
        return 0

    def walk(inst) -> int:
        if id(inst) not in longest:
            longest[id(inst)] = 0  # (a cycle cannot occur; a shared operand is walked once)
            inner = [walk(i) for key, c in inst.called.items() if key != "to_apply"
                     for comp in (c if isinstance(c, list) else [c]) for i in comp.instructions]
            longest[id(inst)] = max([own(inst), *inner, *(walk(o) for o in inst.operands)])
        return longest[id(inst)]
    root = module.entry.root
    return [walk(o) for o in root.operands] if root.opcode == "tuple" else [walk(root)]


def measure(name: str) -> list[dict]:
    import jax
    import hloexec
    from hloexec.jax import lower
    from hloexec.tools.numerics import OutputBounds, baseline_executable, flatten, judge_run, xla_cpu_arithmetic
    from hloexec.tools.verdict import judge
    fn, args = PROGRAMS[name]()
    low = lower(fn, *args)
    xla = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.jit(fn)(*args))]
    rng = np.random.default_rng(0)
    exe = hloexec.load(low.text)
    inputs = [np.asarray(x) for x in low.inputs]
    profiles = {f"hloexec ({p})": flatten(hloexec.load(low.text, device=p).run(*inputs)) for p in PROFILES}
    start = time.perf_counter()
    verdict, run = judge_run(exe, inputs, {"XLA:CPU": xla, **profiles},
                             known={"XLA:CPU": xla_cpu_arithmetic(), **{n: p for n, p in zip(profiles, PROFILES)}})
    seconds = time.perf_counter() - start
    longest = _longest_sums(exe.module)
    baseline = flatten(baseline_executable(exe).run(*inputs))
    rows = []
    for candidate, values in (("hloexec", run.outputs), ("XLA:CPU", xla)):
        device = next(c.device for o in verdict.outputs for c in o.candidates if c.name == candidate and c.device)
        old = judge(run.shadow, baseline, {candidate: values})
        decided = sum(c.rounding_decided for o in verdict.outputs for c in o.candidates if c.name == candidate)
        row = {"program": name, "candidate": candidate, "device": device, "seconds": round(seconds, 2),
               "false alarm": not verdict.consistent(candidate), "old false alarm": not old.consistent(candidate),
               "rounding-decided": decided, "bound ulps": round(_bound_ulps(run, device, values), 2)}
        if candidate == "hloexec":  # the device profiles' runs of hloexec: false alarms (new / old)
            row["profiles"] = {p: (not verdict.consistent(n), not judge(run.shadow, baseline, {n: profiles[n]})
                                   .consistent(n)) for n, p in zip(profiles, PROFILES)}
        for change, (new, before, missed) in _injections(judge, OutputBounds, run, baseline, values, device,
                                                         rng).items():
            row[change] = (sum(new), sum(before), len(new))
            if change.startswith(f"{PCTS[0]:.1%}"):
                for i in missed:
                    row.setdefault("1% missed", {}).setdefault(i, [longest[i], 0])[1] += 1
        rows.append(row)
    return rows


def _missed(missed: dict) -> str:
    """The missed 1% changes (output -> [longest sum on its path, count]) grouped by that sum's length."""
    by_terms: dict[int, list] = {}
    for i, (terms, n) in sorted(missed.items(), key=lambda item: int(item[0])):
        by_terms.setdefault(terms, []).append((int(i), n))
    cells = []
    for terms, outs in sorted(by_terms.items()):
        where = ", ".join(str(i) for i, _ in outs) if len(outs) <= 4 else f"{len(outs)} outputs"
        cells.append(f"{sum(n for _, n in outs)} in {where} ({terms:,})")
    return "; ".join(cells)


def table(rows: list[dict]) -> str:
    changes = [f"{p:.1%} {w}" for w in ("largest", "moderate") for p in PCTS] + \
        [f"{m:g}x bound {w}" for w in ("largest", "moderate") for m in MULTIPLES]
    lines = ["| program | candidate | false alarm (new / old) | 16-bit outputs' median bound (ulps) | "
             + " | ".join(changes) + " |",
             "|---|---|---|---|" + "---|" * len(changes)]
    lines[0] += " 1% missed: count in outputs (longest sum on their path) | tpu / a100 / h100 false alarm (new / old) |"
    lines[1] += "---|---|"
    for r in rows:
        cells = []
        for c in changes:
            new, old, n = r.get(c, (0, 0, 0))
            cells.append(f"{new}/{n} ({old})" if n else "-")
        alarm = f"{'yes' if r['false alarm'] else 'no'} / {'yes' if r['old false alarm'] else 'no'}"
        ulps = "-" if np.isnan(r["bound ulps"]) else f"{r['bound ulps']:.3g}"
        missed = _missed(r.get("1% missed", {}))
        profiles = " / ".join(f"{'yes' if a else 'no'}/{'yes' if b else 'no'}" for a, b in r.get("profiles", {}).values())
        lines.append(f"| {r['program']} | {r['candidate']} ({r['device']}) | {alarm} | {ulps} | "
                     + " | ".join(cells)
                     + f" | {missed or '-'} | {profiles or '-'} |")
    return "\n".join(lines)


# SPMD seeds (../shared/seeds) whose shadow with its bounds fits here: `--cost tpu xmap` (file, participants)
COST_SEEDS = {"tpu": ("tpu_seqparallel_remat_8dev.hlo", 8), "xmap": ("xmap_train_step_4dev.hlo", 4)}


def _cost_subject(name: str):
    """(executable, inputs, runner, shadow, runs timed): the GPT d256 bf16 step's pre-optimization module (a
    bench/workloads.py workload, best of 3) or an SPMD seed of COST_SEEDS (every participant, seeded random
    inputs, the f64 shadow together, one timed run: minutes each)."""
    import hloexec
    import workloads as wl
    from hloexec import spmd
    from hloexec.exec.shadow import shadow_module
    from hloexec.tools.shadow_runs import Runner
    if name in COST_SEEDS:
        file, participants = COST_SEEDS[name]
        if not (wl.SEEDS / file).exists():
            raise SystemExit(f"{wl.SEEDS / file}: absent (the seeds are in ../shared/seeds, or set HLOEXEC_SHARED)")
        exe = hloexec.load((wl.SEEDS / file).read_text())
        inputs = spmd.random_inputs(exe.module, participants, seed=0)
        runner = Runner({"partitions": participants, "replicas": 1, "report": lambda m: None})
        return exe, inputs, runner, shadow_module(exe.module), 1
    from hloexec.tools.arrays import nested
    from hloexec.tools.xla_cpu import load_arrays
    [w] = [w for w in wl.workloads() if w.name == name]
    [path], [inputs_path] = w.files()
    exe = hloexec.load(Path(path).read_text())
    inputs = nested(list(load_arrays(str(inputs_path)).values()), [p.shape for p in exe.parameters])
    return exe, inputs, Runner(), shadow_module(exe.module), 3


def _timed(run) -> tuple[float, float]:
    """(wall, the process's CPU) seconds of one run."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def cost(workload: str = "gpt_step_d256_bf16_pre") -> dict:
    """Seconds (best of 3 after a first run, an SPMD seed's one run after a first: wall, and the process's CPU
    time of the same runs, which a loaded machine's other processes change less) and peak traced memory of the shadow run alone
    and with the bounds (tools.numerics.shadow_run, `devices`), on a bench/workloads.py workload or an SPMD seed
    of COST_SEEDS; the ratios."""
    import tracemalloc
    from hloexec.tools.numerics import shadow_run
    exe, inputs, runner, shadow, repeat = _cost_subject(workload)
    row: dict = {"workload": workload}
    for what, devices in (("shadow run", None), ("with bounds", [exe.options.device])):
        def run(devices=devices):
            return shadow_run(exe, inputs, runner, shadow=shadow, devices=devices)
        run()  # (plans prepared, kernels loaded)
        times = [_timed(run) for _ in range(repeat)]
        row[what], row[f"{what} CPU s"] = (min(t[k] for t in times) for k in (0, 1))
        tracemalloc.start()
        run()
        row[f"{what} peak MB"] = round(tracemalloc.get_traced_memory()[1] / 2 ** 20, 1)
        tracemalloc.stop()
    for what in ("", " CPU s", " peak MB"):
        row[f"ratio{what}"] = round(row[f"with bounds{what}"] / row[f"shadow run{what}"], 2)
    return row


def slack(name: str) -> list[tuple]:
    """Per float value of hloexec's run (op by op, the program's precision, reference profile): (computation,
    instruction, opcode, RMS error against the shadow, RMS bound): how loose the bounds are where (4 sigmas of a
    well-calibrated bound: ~4). `train_step`: tests/train_step.py's fourth step."""
    import hloexec
    from hloexec.exec.shadow import shadow_module
    from hloexec.jax import lower
    from hloexec.tools.bounds import ErrorBounds, _leaves
    from hloexec.tools.numerics import Runner, executable_like
    if name == "train_step":
        from train_step import train_step
        step, state, batch = train_step(warmup=3)
        fn, args = step, (state, batch)
    else:
        fn, args = PROGRAMS[name]()
    low = lower(fn, *args)
    exe = hloexec.load(low.text)
    inputs = [np.asarray(x) for x in low.inputs]
    program: dict = {}

    def where(inst):
        return inst.computation.name if inst.computation is not None else "", inst.name

    def record(_device, inst, value, _operands=None):
        program[where(inst)] = [np.asarray(v, np.float64) if np.asarray(v).dtype.kind in "fV" else None
                                for v in _leaves(value)]
    Runner().run(executable_like(exe, exe.module, use_numba=False), inputs, record)
    shadow = shadow_module(exe.module)
    shadow_exe = executable_like(exe, shadow.module, use_numba=False)
    bounds = ErrorBounds(shadow, shadow_exe.context, exe.options.device)
    rows = []

    def observe(_device, inst, value, operands):
        bounds(inst, value, operands)
        for mine, exact in zip(program.get(where(inst), []), _leaves(value)):
            if mine is None or mine.shape != np.shape(exact) or np.asarray(exact).dtype.kind != "f":
                continue
            bound, error = bounds.of(exact), np.abs(mine - exact)
            judged = np.isfinite(bound) & np.isfinite(error)
            if judged.any():
                rows.append((*where(inst), inst.opcode, float(np.sqrt(np.mean(error[judged] ** 2))),
                             float(np.sqrt(np.mean(bound[judged] ** 2)))))
    Runner().run(shadow_exe, shadow.inputs(inputs), observe, observe_operands=True)
    return rows


def blocks(name: str) -> dict:
    """Over the calibration blocks the samples cut (tools/bound_samples.calibrate; hloexec's shadow run, the
    reference profile's bounds): how uneven a block's looseness is, its largest y over its RMS of y (y: an
    element's samples' RMS over its bound; equally loose elements give ~2 with 4 samples, one element carrying the
    block sqrt(256) = 16). The block's RMS could stand for its largest (a sharper calibration) only where this
    is small (docs/verdicts.md "Fewer samples")."""
    import hloexec
    from hloexec.jax import lower
    from hloexec.kernels.bound_rules import block_ratios
    from hloexec.tools import bound_samples as bs
    from hloexec.tools.bounds import ErrorBounds
    from hloexec.tools.numerics import shadow_run
    uneven: list = []

    def calibrate(bound, deviations, ceiling=None, stats=None):
        if bound is not None and stats is None:
            stats = block_ratios(np.reshape(deviations, (len(deviations), -1)), np.reshape(bound, -1),
                                 bs.CALIBRATION_BLOCK)
        if bound is not None and not stats[4] and stats[3] >= bs.MEASURED_FROM:
            largest, total, counted = stats[:3]
            spread = bs.SIGMAS / np.sqrt(len(deviations))
            cut = (counted >= bs.MEASURED_FROM) & (largest > 0) & (bs.SAMPLE_MARGIN * spread * np.sqrt(largest) < 1)
            uneven.extend(np.sqrt(largest[cut] * counted[cut] / total[cut]))
        return bs.calibrate(bound, deviations, ceiling, stats)
    fn, args = PROGRAMS[name]()
    low = lower(fn, *args)
    exe = hloexec.load(low.text)
    ErrorBounds._calibrate = staticmethod(calibrate)
    try:
        shadow_run(exe, [np.asarray(x) for x in low.inputs], devices=[exe.options.device])
    finally:
        ErrorBounds._calibrate = staticmethod(bs.calibrate)
    ratio = np.asarray(uneven)
    return {"program": name, "samples": bs.SAMPLES, "blocks cut": int(ratio.size),
            "largest / RMS quantiles 50 90 99 100%": [round(float(q), 2) for q in np.quantile(ratio, [.5, .9, .99, 1])]
            if ratio.size else [], "above 5": int(np.count_nonzero(ratio > 5))}


def census(name: str, seeds: int = 5) -> dict:
    """Over observer seeds 0..seeds-1 (hloexec's shadow run, the reference profile's bounds): per element of every
    block the calibration cut (tools/bound_samples.calibrate), its calibrated bound against 4 sigma-hat, sigma-hat its
    samples' RMS over the other seeds' draws (4 (seeds - 1) of them): how many are cut below 4 sigma-hat, in how many
    blocks, whether each is its block's tightest (bound / 4 sigma-hat the least: L) and in how many "lone" blocks
    (their tightest L below a quarter of their tenth tightest: docs/verdicts.md "Sampled calibration"); the worst as
    (calibrated / 4 sigma-hat, instruction, seed, the block's least L, its tenth least). Only what the verdict judges:
    rounding-decided elements (a divide whose divisor's interval holds 0, what is made from it) are counted apart
    ("below, rounding-decided"): their samples may jump (a sign the rounding decides) and they are not judged."""
    import hloexec
    import hloexec.tools.shadow_runs as shadow_runs
    from hloexec.jax import lower
    from hloexec.tools import bound_samples as bs
    from hloexec.tools.bounds import ErrorBounds
    from hloexec.tools.numerics import shadow_run
    calls: list = []  # per seed, per calibrate call: [(bound, calibrated) where it cut (else None), sums of squares,
    # the instruction observed, its value's rounding-decided marks (None: none read)]
    observe = ErrorBounds.__call__

    def calibrate(bound, deviations, ceiling=None, stats=None, in_place=False):
        before = None if bound is None else np.array(bound, np.float32).reshape(-1)
        out = bs.calibrate(bound, deviations, ceiling, stats, in_place)
        if before is not None and before.size >= bs.MEASURED_FROM:
            d = np.reshape(np.asarray(deviations, np.float32), (len(deviations), -1)).astype(np.float64)
            after = np.array(out, np.float32).reshape(-1)
            squares = np.sum(d * d, axis=0, dtype=np.float32)
            calls[-1].append([(before, after) if np.any(after < before) else None, squares, "", None])
        return out

    def observed(self, inst, value, operands):  # the calls an instruction made get its name and its value's marks
        first = len(calls[-1])
        observe(self, inst, value, operands)
        for call in calls[-1][first:]:
            call[2] = call[2] or inst.name
            if call[3] is None and isinstance(value, np.ndarray) and value.size == call[1].size:
                call[3] = np.asarray(self.decided_of(value)).reshape(-1)
    fn, args = PROGRAMS[name]()
    low = lower(fn, *args)
    exe = hloexec.load(low.text)
    made = shadow_runs.ErrorBounds
    ErrorBounds._calibrate, ErrorBounds.__call__ = staticmethod(calibrate), observed
    try:
        for seed in range(seeds):
            calls.append([])
            shadow_runs.ErrorBounds = lambda *a, chosen=seed, **k: made(*a, **{**k, "seed": chosen})
            shadow_run(exe, [np.asarray(x) for x in low.inputs], devices=[exe.options.device])
    finally:
        ErrorBounds._calibrate, shadow_runs.ErrorBounds = staticmethod(bs.calibrate), made
        ErrorBounds.__call__ = observe
    block, worst = bs.CALIBRATION_BLOCK, []
    tally = dict.fromkeys(("blocks cut", "below", "blocks below", "tightest below", "lone blocks", "lone below",
                           "below, rounding-decided"), 0)
    for k in range(len(calls[0])):
        squares = np.stack([c[k][1] for c in calls]).astype(np.float64)
        for s in range(seeds):
            if calls[s][k][0] is None:
                continue
            (before, after), _, inst, decided = calls[s][k]
            n = before.size // block * block
            sigma = np.sqrt((squares.sum(axis=0) - squares[s]) / (bs.SAMPLES * (seeds - 1)))[:n]
            ok = (before[:n] > 0) & np.isfinite(before[:n]) & (sigma > 0) & np.isfinite(sigma)
            if decided is not None:  # (not judged: counted apart)
                under = (after[:n] < before[:n]) & (after[:n] < 4 * sigma)
                tally["below, rounding-decided"] += int(np.count_nonzero(ok & decided[:n] & under))
                ok &= ~decided[:n]
            cut = (np.where(ok, after[:n], 0) < np.where(ok, before[:n], 0)).reshape(-1, block).any(axis=1)
            safe = np.where(ok, 4 * sigma, 1)
            left = np.where(ok, after[:n] / safe, np.inf).reshape(-1, block)[cut]
            unsorted = np.where(ok, before[:n] / safe, np.inf).reshape(-1, block)[cut]  # L: bound / 4 sigma-hat
            loose = np.sort(unsorted, axis=1)
            lone = loose[:, 0] * 4 < loose[:, 9]
            below = left < 1
            tally["blocks cut"] += int(cut.sum())
            tally["below"] += int(below.sum())
            tally["blocks below"] += int(below.any(axis=1).sum())
            tally["tightest below"] += int(below[np.arange(len(left)), np.argmin(unsorted, axis=1)].sum())
            tally["lone blocks"] += int(lone.sum())
            tally["lone below"] += int((lone & below.any(axis=1)).sum())
            if below.any():
                j = np.unravel_index(np.argmin(left), left.shape)
                worst.append((round(float(left[j]), 3), inst, s, round(float(loose[j[0], 0]), 3),
                              round(float(loose[j[0], 9]), 3)))
    return {"program": name, "seeds": seeds, **tally, "worst": sorted(worst)[:6]}


def main(argv: list[str]) -> None:
    if "--census" in argv:  # python bench/bench_verdict.py --census NAME [SEEDS]
        rest = argv[argv.index("--census") + 1:]
        print(json.dumps(census(rest[0], *map(int, rest[1:2])), indent=1))
        return
    if "--blocks" in argv:
        print(json.dumps([blocks(a) for a in argv if not a.startswith("--")], indent=1))
        return
    if "--slack" in argv:
        for comp, inst, opcode, error, bound in slack(argv[argv.index("--slack") + 1]):
            ratio = bound / error if error else float("inf")
            print(f"{comp[:24]:24} {inst[:32]:32} {opcode[:12]:12} rms error {error:9.3g} rms bound {bound:9.3g} "
                  f"bound/error {ratio:8.3g}")
        return
    if "--cost" in argv:
        rows = [cost({"gpt": "gpt_step_d256_bf16_pre"}.get(a, a)) for a in argv if not a.startswith("--")]
        print(json.dumps(rows if len(rows) > 1 else rows[0] if rows else cost(), indent=1, default=str))
        print(f"load: {os.getloadavg()}", file=sys.stderr)
        return
    names = [a for a in argv if not a.startswith("--")] or list(PROGRAMS)
    rows = []
    for name in names:
        rows += measure(name)
        print(f"{name}: done", file=sys.stderr)
    print(json.dumps(rows, indent=1) if "--json" in argv else table(rows))
    print(f"load: {os.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
