"""Per-element verdicts of SPMD runs: every participant's shadow carries error bounds, collectives included (an
add all-reduce is a sum of one term per participant, rounding at every step in its type), and a planted change in
one participant's output is caught and named with its device."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import hloexec
import hloexec.spmd as spmd
from hloexec.tools.xla_cpu import save_arrays
from hloexec.tools.cli import main
from hloexec.exec.shadow import shadow_module
from hloexec.tools.numerics import Runner, judge_run, shadow_run
from hloexec.tools.shadow_runs import executable_like, fitting_shadow, run_memory
from hloexec.tools.verdict import RULE
from hloexec.errors import MemoryLimitError
from hloexec.options import Options

# 4 partitions: a dot whose contraction is split (each device's f16 partial product, accumulated in f32 and rounded
# to f16), summed by an f16 all-reduce (every device the whole sum) and by a reduce-scatter (each device a quarter
# of the rows), an f16 square all-gathered, and a tanh after the all-reduce.
SHARDED = """HloModule spmd_f16, num_partitions=4

add16 {
  a = f16[] parameter(0)
  b = f16[] parameter(1)
  ROOT s = f16[] add(a, b)
}

ENTRY e {
  x = f16[64,32] parameter(0), sharding={devices=[1,4]0,1,2,3}
  w = f16[32,48] parameter(1), sharding={devices=[4,1]0,1,2,3}
  d = f16[64,48] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  r = f16[64,48] all-reduce(d), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add16
  rs = f16[16,48] reduce-scatter(d), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, dimensions={0}, to_apply=add16
  sq = f16[64,32] multiply(x, x)
  g = f16[64,128] all-gather(sq), channel_id=3, replica_groups={{0,1,2,3}}, use_global_device_ids=true, dimensions={1}
  t = f16[64,48] tanh(r)
  ROOT out = (f16[64,48], f16[16,48], f16[64,128], f16[64,48]) tuple(r, rs, g, t), sharding={{replicated}, {devices=[4,1]0,1,2,3}, {replicated}, {replicated}}
}
"""
DEVICES = 4


@pytest.fixture(scope="module")
def judged():
    """(executable, global inputs, per-device inputs, runner, verdict, shadow run) of SHARDED, seed 0."""
    exe = hloexec.load(SHARDED)
    inputs = spmd.random_global_inputs(exe.module, 0)
    per_device = spmd.split_inputs(exe.module, inputs, DEVICES)
    runner = Runner({"partitions": DEVICES, "replicas": 1, "report": lambda message: None})
    verdict, run = judge_run(exe, per_device, {}, runner)
    return exe, inputs, per_device, runner, verdict, run


def test_every_element_of_every_participant_has_a_bound(judged):
    """Collectives are no longer unbounded: each output element has a finite bound (0 where nothing rounds: an f16 square that fits), and hloexec's own
    run is within it."""
    *_, verdict, run = judged
    [bounds] = run.bounds.values()
    assert bounds.unbounded == {}
    for out, exact, bound in zip(run.outputs, run.shadow, bounds.bounds):
        assert bound.shape == exact.shape and np.all(np.isfinite(bound)) and np.all(bound >= 0) and np.any(bound > 0)
        assert np.all(np.abs(out.astype(np.float64) - exact) <= RULE.bound_factor * bound)
    assert verdict.consistent() and all(c.bound_violations == 0 for o in verdict.outputs for c in o.candidates)


def _f16_partials(x, w):
    """Each device's partial product as the program makes it: f16 operands, f32 accumulation, rounded to f16."""
    k = x.shape[1] // DEVICES
    return [
        (x[:, i * k : (i + 1) * k].astype(np.float32) @ w[i * k : (i + 1) * k].astype(np.float32)).astype(np.float16)
        for i in range(DEVICES)
    ]


def test_the_all_reduce_bound_holds_the_orders_a_device_may_sum_in(judged):
    """An independent emulation: the f16 sum of the 4 partial products in every rotation of the group (a ring
    starts each element's sum at another participant) and as a tree, every step rounding to f16. Each order's
    error against the exact product stays within the all-reduce's bound (x the verdict's factor); the bound is not
    vacuous either: the largest error of those orders is a sizeable part of it somewhere."""
    _, (x, w), *_, run = judged
    exact = x.astype(np.float64) @ w.astype(np.float64)
    [bounds] = run.bounds.values()
    bound = bounds.bounds[0]
    partials = _f16_partials(x, w)
    orders = [partials[i:] + partials[:i] for i in range(DEVICES)]
    sums = []
    for order in orders:
        acc = order[0]
        for p in order[1:]:
            acc = (acc + p).astype(np.float16)
        sums.append(acc)
    sums.append(((partials[0] + partials[1]).astype(np.float16) + (partials[2] + partials[3]).astype(np.float16)))
    worst = np.max([np.abs(s.astype(np.float64) - exact) / bound for s in sums], axis=0)
    assert worst.max() <= RULE.bound_factor
    assert worst.max() > 0.2


@pytest.mark.parametrize("output, rows", [(1, slice(32, 48)), (0, slice(None))])
def test_a_planted_change_in_one_participant_is_caught_and_named_with_its_device(judged, output, rows):
    """1% of the largest element of device 2's rows of the reduce-scatter's result (rows 32..47), or of the
    replicated all-reduce's: not consistent, the worst element is the planted one, named with the devices that
    hold it; the unchanged outputs pass."""
    exe, _, per_device, runner, _, run = judged
    planted = [o.copy() for o in run.outputs]
    start = rows.start or 0
    row, col = np.unravel_index(np.argmax(np.abs(planted[output][rows])), planted[output][rows].shape)
    index = (int(row) + start, int(col))
    planted[output][index] = np.float16(planted[output][index] * 1.01)
    verdict, _ = judge_run(exe, per_device, {"unchanged": list(run.outputs), "planted": planted}, runner)
    assert verdict.consistent("unchanged") and not verdict.consistent("planted")
    [candidate] = [c for c in verdict.outputs[output].candidates if c.name == "planted"]
    assert candidate.bound_violations == 1
    worst = candidate.worst[0]
    assert worst.index == index and worst.ratio > RULE.bound_factor
    assert worst.devices == ([2] if output == 1 else list(range(DEVICES)))


def test_compare_spmd_against_the_shadow_names_the_device(tmp_path, capsys, judged):
    """From the command line: global inputs split by sharding, global outputs as --actual; the JSON's worst
    element has its devices, the text names it."""
    _, inputs, _, _, _, run = judged
    path, given, actual = tmp_path / "sharded.hlo", tmp_path / "in.npz", tmp_path / "planted.npz"
    path.write_text(SHARDED)
    save_arrays(str(given), {f"arg{i}": v for i, v in enumerate(inputs)})
    planted = [o.copy() for o in run.outputs]
    row, col = np.unravel_index(np.argmax(np.abs(planted[1][16:32])), (16, 48))  # device 1's rows
    index = [int(row) + 16, int(col)]
    planted[1][tuple(index)] = np.float16(planted[1][tuple(index)] * 1.01)
    save_arrays(str(actual), {f"out{i}": v for i, v in enumerate(planted)})
    argv = ["compare", str(path), "--spmd", "--inputs", str(given), "--reference", "shadow", "--actual", str(actual)]
    assert main([*argv, "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    [candidate] = [c for c in document["outputs"][1]["candidates"] if c["name"] == "planted.npz"]
    assert candidate["worst"][0]["index"] == index and candidate["worst"][0]["devices"] == [1]
    assert document["outputs"][1]["worst"]["index"] == index
    assert main(argv) == 1
    text = capsys.readouterr().out
    assert f"[{index[0]},{index[1]}]" in text and "device 1" in text and "NOT CONSISTENT" in text


def test_bounds_of_a_one_participant_run_are_unchanged_by_the_spmd_path():
    """The single-participant path still gives bounds (device 0's observers), same as before for a plain module."""
    exe = hloexec.load("HloModule m\nENTRY e {\n  a = f16[8] parameter(0)\n  ROOT t = f16[8] tanh(a)\n}\n")
    [a] = exe.random_inputs(1)
    run = shadow_run(exe, [a], devices=[Options.make("reference").device])
    [bounds] = run.bounds.values()
    assert np.all(np.abs(run.outputs[0].astype(np.float64) - run.shadow[0]) <= bounds.bounds[0])


def test_a_shadow_with_16_bit_floats_in_f32_judges_as_the_f64_one(judged):
    """half_in_f32: the f16 values are f32 in the shadow (13 more bits): the exact answers agree with the f64
    shadow's to a hundredth of an f16 ulp at the output's scale, the bounds to 10% but near powers of 2."""
    exe, _, per_device, runner, _, run = judged
    half = shadow_module(exe.module, half_in_f32=True)
    assert {p.shape.element_type.name for p in half.module.entry.parameters} == {"f32"}
    narrow = shadow_run(exe, per_device, runner, shadow=half, devices=[Options.make("reference").device])
    [bounds] = narrow.bounds.values()
    [wide] = run.bounds.values()
    for out, exact, exact64, bound, bound64 in zip(run.outputs, narrow.shadow, run.shadow, bounds.bounds, wide.bounds):
        assert exact.dtype == np.float32
        ulp = float(np.spacing(np.float16(np.max(np.abs(exact64)))))  # an f16 ulp at the output's scale
        assert np.max(np.abs(exact - exact64)) <= ulp / 100  # (f32 sums and its tanh: a few f32 ulps)
        close = np.isclose(bound, bound64, rtol=0.1, atol=float(np.max(bound64)) * 1e-3)
        # (a value within an f32 rounding of a power of 2 may count the f16 ulp above it: 2x at most)
        assert np.mean(close) > 0.7 and np.all((bound <= 2.01 * bound64) & (bound64 <= 2.01 * bound))


def test_a_shadow_that_does_not_fit_in_f64_takes_16_bit_floats_in_f32(judged, capsys):
    """With max_memory between the f32-for-16-bit shadow's estimate and the f64 one's, the run says so and the
    shadow it makes is the narrower one; the verdict is still made (and consistent)."""
    exe, _, per_device, runner, _, _ = judged
    needs = {}
    for half in (False, True):
        shadow = shadow_module(exe.module, half_in_f32=half)
        needs[half] = run_memory(executable_like(exe, shadow.module, use_numba=False), per_device, runner, shadow)[
            "total"
        ]
    assert needs[True] < needs[False]
    said = []
    limited = hloexec.load(SHARDED, max_memory=(needs[True] + needs[False]) // 2)
    spoken = Runner({"partitions": DEVICES, "replicas": 1, "report": said.append, "check_memory": False})
    assert fitting_shadow(limited, per_device, spoken)[0].half_in_f32
    assert any("16-bit floats in f32" in s for s in said)
    assert not fitting_shadow(exe, per_device, runner)[0].half_in_f32


def test_a_shadow_that_fits_in_neither_width_is_refused_before_anything_runs(judged):
    """Below both estimates: a MemoryLimitError naming the narrower shadow, before the program's run (the GPT
    seed's report used to run all 16 participants first, then find its shadow refused)."""
    exe, _, per_device, _, _, _ = judged
    ran = []
    limited = hloexec.load(SHARDED, max_memory=4096)
    runner = Runner({"partitions": DEVICES, "replicas": 1, "report": ran.append})
    with pytest.raises(MemoryLimitError, match="16-bit floats in f32"):
        shadow_run(limited, per_device, runner)
    assert not any(message.startswith("the program:") for message in ran)


def test_the_report_of_an_spmd_verdict_names_the_device(tmp_path, capsys, judged):
    """`hloexec report --spmd --actual`: the page's worst element is the planted one, with its device."""
    _, inputs, _, _, _, run = judged
    path, given, actual = tmp_path / "sharded.hlo", tmp_path / "in.npz", tmp_path / "planted.npz"
    path.write_text(SHARDED)
    save_arrays(str(given), {f"arg{i}": v for i, v in enumerate(inputs)})
    planted = [o.copy() for o in run.outputs]
    row, col = np.unravel_index(np.argmax(np.abs(planted[1][48:])), (16, 48))  # device 3's rows
    planted[1][48 + row, col] = np.float16(planted[1][48 + row, col] * 1.01)
    save_arrays(str(actual), {f"out{i}": v for i, v in enumerate(planted)})
    page = tmp_path / "r.html"
    argv = ["report", str(path), "--spmd", "--inputs", str(given), "--actual", str(actual), "-o", str(page)]
    assert main(argv) == 1
    capsys.readouterr()
    [worst] = re.findall(r"<p class='worst' id='worst-element'>(.*?)</p>", page.read_text())
    assert f"output 1 [{48 + row}, {col}]" in worst and worst.endswith("devices 3")


CONVOLUTION = """HloModule conv
ENTRY e {
  x = f16[4,64,16] parameter(0)
  k = f16[5,16,32] parameter(1)
  ROOT c = f16[4,64,32] convolution(x, k), window={size=5 pad=2_2}, dim_labels=b0f_0io->b0f
}
"""


def test_a_convolution_has_a_bound_that_holds_and_catches_a_1_percent_change():
    """A convolution is a dot whose terms it counts itself (80 terms an element here, fewer at the padded
    edges): hloexec's f16 result within its bounds, 1% of its largest element beyond them."""
    exe = hloexec.load(CONVOLUTION)
    inputs = exe.random_inputs(2)
    run = shadow_run(exe, inputs, devices=[Options.make("reference").device])
    [bounds] = run.bounds.values()
    assert bounds.unbounded == {}
    out, exact, bound = run.outputs[0], run.shadow[0], bounds.bounds[0]
    assert np.all(np.abs(out.astype(np.float64) - exact) <= RULE.bound_factor * bound)
    planted = out.copy()
    k = np.unravel_index(np.argmax(np.abs(out)), out.shape)
    planted[k] = np.float16(planted[k] * 1.01)
    verdict, _ = judge_run(exe, inputs, {"planted": [planted]})
    assert not verdict.consistent("planted") and verdict.outputs[0].candidates[1].worst[0].index == k


@pytest.mark.slow
def test_the_tpu_seed_is_judged_element_by_element(shared_path):
    """The 8-participant TPU seed (all-gathers with iota groups, a convolution that is a dot, bf16): every element
    has a bound; hloexec's run is within them; 4x its bound at the largest element of the global output is caught
    and named with the devices that hold it (3 min on 2 cores at load ~8). (1% of it is not: its bound is ~1% of
    it, 4 sigmas of a sum of 1,024 bf16-rounded products, since the convolution is bounded as the dot it is; the
    convolution's own rule left them 2.3x lower, below 4 sigmas.)"""
    exe = hloexec.load(str(shared_path("seeds", "tpu_seqparallel_remat_8dev.hlo")))
    per_device = spmd.random_inputs(exe.module, 8, 0)
    runner = Runner({"partitions": 8, "replicas": 1, "report": lambda message: None})
    verdict, run = judge_run(exe, per_device, {}, runner)
    [bounds] = run.bounds.values()
    assert bounds.unbounded == {} and verdict.consistent()
    planted = [o.copy() for o in run.outputs]
    k = np.unravel_index(np.argmax(np.abs(planted[0])), planted[0].shape)
    planted[0][k] += np.sign(planted[0][k]) * 4 * bounds.bounds[0][k]
    verdict, _ = judge_run(exe, per_device, {"planted": planted}, runner)
    worst = verdict.outputs[0].candidates[1].worst[0]
    assert not verdict.consistent("planted") and worst.index == k
    assert worst.devices == spmd.holders(exe.module, 8, 0, k)


def test_a_mixed_precision_op_of_a_tpu_dump_runs_in_the_narrower_shadow():
    """bf16 = multiply(f32, f32) (the TPU seed's %multiply.8) is f32 = multiply(f64, f64) in the shadow with 16-bit
    floats in f32: its result rounded once to f32 (it returned f64 values, refused by the run's type check)."""
    text = """HloModule m
ENTRY e {
  a = f32[3] parameter(0)
  b = f32[3] parameter(1)
  s = f32[] parameter(2)
  m = bf16[3] multiply(a, b)
  ms = bf16[] multiply(s, s)
  ROOT t = (bf16[3], bf16[]) tuple(m, ms)
}"""
    exe = hloexec.load(text, use_numba=False)
    args = [np.array([1.1, -2.3, 3.7], np.float32), np.array([0.7, 1.9, -4.1], np.float32), np.array(1.3, np.float32)]
    half = shadow_module(exe.module, half_in_f32=True)
    m, ms = executable_like(exe, half.module, use_numba=False).run(*half.inputs(args))
    assert m.dtype == ms.dtype == np.float32
    assert np.array_equal(m, (args[0].astype(np.float64) * args[1]).astype(np.float32))
    assert ms == np.float32(np.float64(args[2]) ** 2)


MAX_REDUCED = """HloModule spmd_max, num_partitions=4

max32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}

ENTRY e {
  x = bf16[32,64] parameter(0), sharding={devices=[4,1]0,1,2,3}
  y = bf16[32,64] parameter(1), sharding={devices=[4,1]0,1,2,3}
  p = bf16[32,64] multiply(x, y)
  w = f32[32,64] convert(p)
  ROOT r = f32[32,64] all-reduce(w), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=max32
}
"""


def test_a_max_all_reduces_samples_are_the_max_of_the_perturbed_operands(monkeypatch):
    """A max all-reduce is not linear: each sample's deviation is the max over the participants of their operands
    moved by that sample's deviations, less the value (the max of the deviations alone, as an add all-reduce's
    samples are made, would be another element's error)."""
    from hloexec.tools import bounds as bounds_module

    seen: dict = {}
    call = bounds_module.ErrorBounds.__call__

    def recording(self, inst, value, operands):
        call(self, inst, value, operands)
        if inst.opcode == "all-reduce":
            o = operands[0]
            seen[id(self)] = (np.asarray(o, np.float64), self._samples_or_none(o), value, self._samples_or_none(value))

    monkeypatch.setattr(bounds_module.ErrorBounds, "__call__", recording)
    exe = hloexec.load(MAX_REDUCED)
    inputs = spmd.random_global_inputs(exe.module, 3)
    per_device = spmd.split_inputs(exe.module, inputs, DEVICES)
    runner = Runner({"partitions": DEVICES, "replicas": 1, "report": lambda message: None})
    judge_run(exe, per_device, {}, runner)
    assert len(seen) == DEVICES
    operands = np.stack([v[0] for v in seen.values()])  # (participants, 32, 64)
    deviations = np.stack([v[1] for v in seen.values()])  # (participants, samples, 32, 64)
    assert np.any(deviations != 0)
    want = np.max(operands[:, None] + deviations.astype(np.float64), axis=0) - np.max(operands, axis=0)
    linear = np.max(deviations, axis=0)  # (the linear path's: wrong)
    for _, _, value, samples in seen.values():
        assert np.array_equal(value, np.max(operands, axis=0))
        np.testing.assert_allclose(samples, want, rtol=2.0**-8, atol=0)
        assert not np.allclose(samples, linear, rtol=2.0**-8, atol=0)
