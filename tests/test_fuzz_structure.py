"""The structure-aware fuzzer's short run (tests/structured_modules.py; the long campaign's numbers are in
docs/robustness.md): modules that parse but are wrong, for every registered opcode and custom-call target,
through load, graph, memory, export, run, shadow, find-nonfinite and numerics. Only hloexec's errors may come out, and one
found after parsing names the instruction. Plus a regression case for each finding of the campaign."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import structured_modules as S

SHORT = settings(max_examples=600, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))


def _check(text: str) -> None:
    stage, key, finding = S.outcome(text)
    if finding is not None:
        raise AssertionError(f"{key}: {type(finding).__name__}: {finding}\n{text}") from finding


@SHORT
@given(st.data())
def test_modules_that_parse_but_are_wrong_give_hloexec_errors(data):
    text, _ = S.draw_module(S.Draw(data=data))
    _check(text)


@pytest.mark.parametrize("kind", ["op", "call"])
def test_every_subject_with_random_forms(kind):
    """Every registered opcode and target, a few drawn forms each (the hypothesis run above picks subjects at
    random; this makes sure none is skipped)."""
    import random
    rng = random.Random(11)
    for subject in [s for s in S.subjects() if s[0] == kind]:
        for _ in range(3):
            _check(S.draw_module(S.Draw(rng), subject)[0])


# The campaign's findings, reduced: each raised an internal exception before its fix.
FOUND = {
    "reduce-window without operands (tiering)": "ROOT %r = s64[3,2] reduce-window(), to_apply=%add",
    "reduce without operands (fusion grouping)": "ROOT %r = s32[3] reduce()",
    "call without to_apply (inlining)": "%p0 = f64[1] parameter(0)\n  ROOT %r = u2[] call(%p0)",
    "imag of a tuple": "%p0 = (pred[3], f32[2]) parameter(0)\n  ROOT %r = pred[3] imag(%p0)",
    "multiply making a token": "%p0 = c64[8,3] parameter(0)\n  %p1 = u2[] parameter(1)\n"
                               "  ROOT %r = token[] multiply(%p0, %p1)",
    "dynamic-update-slice of a lower-rank update (index bounds)":
        "%p0 = u8[1,5] parameter(0)\n  %p1 = pred[] parameter(1)\n  %p2 = f64[2,4,8] parameter(2)\n"
        "  %p3 = u8[] parameter(3)\n  ROOT %r = u8[1,5] dynamic-update-slice(%p0, %p1, %p2, %p3)",
    "an empty parameter numpy cannot index": "%p0 = u2[4611686018427387904,0] parameter(0)\n"
                                             "  ROOT %r = u2[4611686018427387904,0] opt-barrier(%p0)",
    "recv-done of an empty tuple (parser)": "%p0 = () parameter(0)\n  ROOT %r = u8[2] recv-done(%p0)",
    "cuBLAS gemm returning ()": '%p0 = () parameter(0)\n  %p1 = () parameter(1)\n'
                                '  ROOT %r = () custom-call(%p0, %p1), custom_call_target="__cublas$gemm"',
    "cuBLAS triangular solve returning ()": '%p0 = f32[2,2] parameter(0)\n  %p1 = f32[2,2] parameter(1)\n'
                                            '  ROOT %r = () custom-call(%p0, %p1), '
                                            'custom_call_target="__cublas$triangularSolve"',
    "cuDNN conv returning ()": '%p0 = f32[1,1,2,2] parameter(0)\n  %p1 = f32[1,1,1,1] parameter(1)\n'
                               '  ROOT %r = () custom-call(%p0, %p1), custom_call_target="__cudnn$convBackwardFilter", '
                               "dim_labels=bf01_oi01->bf01",
    "cuDNN conv whose dim_labels do not fit the filter": '%p0 = u8[8,2,3] parameter(0)\n  %p1 = token[] parameter(1)\n'
                                                         '  ROOT %r = f8e5m2[2,8,3] custom-call(%p0, %p1), '
                                                         'custom_call_target="__cudnn$convForward", '
                                                         "dim_labels=b012f_012io->b012f",
    "cuDNN conv+bias of rank-1 operands": '%p0 = f16[] parameter(0)\n  %p1 = u2[2,4] parameter(1)\n'
                                          '  %p2 = u2[3] parameter(2)\n  %p3 = bf16[1,0,2] parameter(3)\n'
                                          '  ROOT %r = (f16[4]) custom-call(%p0, %p1, %p2, %p3), '
                                          'custom_call_target="__cudnn$convBiasActivationForward", dim_labels=bf_io->bf',
    "rng-bit-generator returning ()": "%p0 = f64[] parameter(0)\n  ROOT %r = () rng-bit-generator(%p0)",
    "reduce over a dimension past the rank (fusion grouping)":
        "%p0 = f32[2,1,3] parameter(0)\n  %p1 = f32[] parameter(1)\n"
        "  ROOT %r = f32[3] reduce(%p0, %p1), dimensions={7}, to_apply=%add",
    "call with more operands than its computation's parameters (inlining)":
        "%p0 = f32[2] parameter(0)\n  %p1 = f32[2] parameter(1)\n  ROOT %r = f32[2] call(%p0, %p1), to_apply=%fn",
    "GetRngSeed with a result no array can be": "ROOT %r = u64[4611686018427387904,8] custom-call(), "
                                                'custom_call_target="GetRngSeed"',
    "cuDNN attention returning a nested tuple": '%p0 = f32[1,2,3,4] parameter(0)\n  %p1 = f32[1,2,3,4] parameter(1)\n'
                                                '  %p2 = f32[1,2,3,4] parameter(2)\n'
                                                '  ROOT %r = ((f32[1,2,3,4], pred[4]), u8[2]) custom-call(%p0, %p1, '
                                                '%p2), custom_call_target="__cudnn$fmhaSoftmax"',
    # the hour-long campaign of 2026-11-29 (fuzz/findings/structured_2026-11-29.json)
    'cuBLAS gemm returning ()': '%p0 = s64[] parameter(0)\n  %p1 = pred[3] parameter(1)\n  %p2 = pred[3] parameter(2)\n  %p3 = pred[3] parameter(3)\n  ROOT %r = () custom-call(%p0, %p1, %p2, %p3), custom_call_target="__cublas$gemm", all_gather_dimension=2, dimensions={0,0}',
    'cuDNN norm of a tuple operand': '%p0 = (f32[4], pred[]) parameter(0)\n  %p1 = u8[0,1,4] parameter(1)\n  %p2 = f4e2m1fn[3,2] parameter(2)\n  ROOT %r = (f32[4], pred[]) custom-call(%p0, %p1, %p2), custom_call_target="__cudnn$norm", comparator=%fn, scatter_indices_batching_dims={1,2}, metadata={op_name="jit(f)/x" source_file="a.py" source_line=3}, api_version=API_VERSION_ORIGINAL',
    'TopK returning a scalar': '%p0 = f32[1,2]{1,0} parameter(0)\n  ROOT %r = (s64[], f16[1]) custom-call(%p0), custom_call_target="TopK", comparator=%cond',
    "log whose result is not its operand's shape (checked before fusing)": '%p0 = bf16[8] parameter(0)\n  ROOT %r = f16[1,1000000000000,2] log(%p0), lhs_ragged_dims={7,2}, is_host_transfer=true, concat_dimension=1, conv_kind=kCustom',
    'bitcast-convert to dims no width change makes': '%p0 = f64[2,5,4] parameter(0)\n  ROOT %r = f16[4,5,8] bitcast-convert(%p0), num_partitions=2147483648, channel_id=3, is_stable=true',
    'cuDNN norm of tokens': '%p0 = token[] parameter(0)\n  %p1 = token[] parameter(1)\n  %p2 = token[] parameter(2)\n  ROOT %r = (f32[1], u8[]) custom-call(%p0, %p1, %p2), custom_call_target="__cudnn$norm", branch_computations={%fn}, api_version=API_VERSION_ORIGINAL',
    'SPMDShardToFullShape naming more devices than the run has': '%p0 = f4e2m1fn[0] parameter(0)\n  ROOT %r = f4e2m1fn[0] custom-call(%p0), custom_call_target="SPMDShardToFullShape", sharding={devices=[3]0,1,2}, lhs_ragged_dims={7}, algorithm=NE, api_version=API_VERSION_TYPED_FFI',
    'convolution of operands of different ranks': '%p0 = f4e2m1fn[3] parameter(0)\n  %p1 = f16[5,2] parameter(1)\n  ROOT %r = f32[0,5] convolution(%p0, %p1), delta=2147483648, largest=false, dim_labels=bf_io->bf, source_target_pairs={{1,0},{1,1}}',
    'pad whose padding does not make the result shape': '%p0 = f4e2m1fn[4,4] parameter(0)\n  %p1 = f32[5]{0} parameter(1)\n  ROOT %r = f4e2m1fn[4,4] pad(%p0, %p1), padding=3_4611686018427387904x2147483648_-1, lower=true',
    'stochastic-convert of mismatched shapes': '%p0 = f4e2m1fn[1,8] parameter(0)\n  %p1 = u2[] parameter(1)\n  %r = s4[3] stochastic-convert(%p0, %p1)\n  ROOT %t = (s4[3], f4e2m1fn[1,8]) tuple(%r, %p0)',
    'PartialReduce with an empty called_computations': '%p0 = u8[2]{-1} parameter(0)\n  %p1 = bf16[2] parameter(1)\n  ROOT %r = u8[2]{-1} custom-call(%p0, %p1), custom_call_target="PartialReduce", called_computations={}, lhs_contracting_dims={}, operand_batching_dims={-1,2}, async_execution_thread=GE, api_version=API_VERSION_TYPED_FFI',
    # the 25-minute campaign after those fixes
    "bitcast of zero elements to another rank (numerics pairs a pinned op's operands)":
        "%p0 = f64[2,0] parameter(0)\n  ROOT %r = f8e5m2[5,5,0] bitcast(%p0)",
    "cuSOLVER SVD with a nested-tuple result": '%p0 = f64[2,3,5] parameter(0)\n  ROOT %r = ((f32[1], s32[4,4,0]), '
                                               'u2[5,1,4]) custom-call(%p0), custom_call_target="cusolver_gesdd_ffi"',
}


@pytest.mark.parametrize("name", list(FOUND))
def test_campaign_findings_stay_fixed(name):
    _check(f"HloModule fuzz\n\n{S.COMPUTATIONS}\nENTRY %e {{\n  {FOUND[name]}\n}}\n")


def test_a_malformed_instruction_over_a_huge_array_is_refused_fast():
    """The campaign's one slow case: convert(f16[1,10^12], u8[]) was fused before its form was checked and its
    kernel split the 10^12 elements into 30 million thread blocks (two minutes of load); now the form is checked
    before fusing, and blocks are capped."""
    import time

    import hloexec
    from hloexec.errors import HloParseError
    text = ("HloModule slow\n\nENTRY %e {\n  %p0 = f16[1,1000000000000] parameter(0)\n  %p1 = u8[] parameter(1)\n"
            "  ROOT %r = f16[1,1000000000000] convert(%p0, %p1)\n}\n")
    start = time.monotonic()
    with pytest.raises(HloParseError, match="convert expects 1 operands"):
        hloexec.load(text)
    assert time.monotonic() - start < 20


def test_an_empty_batch_of_a_huge_permutation_allocates_within_max_memory():
    """The short run's 16 GB peak: lu_pivots_to_permutation of an empty batch with n = 2^31 built an n-long row
    (8 GB) for no output element; every allocation of a run stays under the executable's max_memory."""
    import tracemalloc

    text = (f"HloModule fuzz\n\n{S.COMPUTATIONS}\nENTRY %e {{\n  %p0 = s32[0,8,2147483648] parameter(0)\n"
            "  ROOT %r = s32[0,8,2147483648] custom-call(%p0), custom_call_target=\"hip_lu_pivots_to_permutation\"\n}\n")
    tracemalloc.start()
    try:
        _check(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < S.MAX_MEMORY


@pytest.mark.parametrize("layouts", ["{1,0} -> {0,1,2}", "{5,0} -> {1,0}", "{0} -> {0}", "{1,1} -> {0}"])
def test_a_bitcast_across_a_layout_that_orders_no_dimensions_is_refused_naming_it(layouts):
    """The last campaign's open finding: a bitcast reads its shapes' physical order from their layouts; one that is
    no order of the dimensions (XLA's verifier refuses it) was an IndexError or a silent row-major guess."""
    import hloexec
    src, dst = layouts.split(" -> ")
    dst_dims = "3,2" if dst != "{0}" else "6"
    text = f"HloModule m\nENTRY e {{ p = f32[2,3]{src} parameter(0) ROOT b = f32[{dst_dims}]{dst} bitcast(p) }}"
    with pytest.raises(hloexec.UnsupportedError,
                       match=r"(?s)is not an order of its .* dimensions.*in %b = bitcast"):
        hloexec.load(text)


def test_a_shard_to_full_shape_of_a_sharding_of_another_rank_names_the_instruction():
    """The other open finding: the error named the sharding only."""
    import hloexec
    text = """HloModule m, num_partitions=2
ENTRY e { p = f32[4,8] parameter(0), sharding={devices=[2,1]0,1}
  c = f32[2,8] custom-call(p), custom_call_target="SPMDFullToShardShape", sharding={manual}
  ROOT d = f32[4,8] custom-call(c), custom_call_target="SPMDShardToFullShape", sharding={devices=[2]0,1} }"""
    with pytest.raises(hloexec.UnsupportedError, match=r"(?s)does not fit a rank-2 array.*in %d = custom-call"):
        hloexec.load(text)


@pytest.mark.parametrize("text", [
    "%p0 = f64[2,3] parameter(0)\n  ROOT %r = f8e5m2[2,3,8] bitcast-convert(%p0)",
    "%p0 = f64[2,3] parameter(0)\n  ROOT %r = f32[12] bitcast(%p0)"])
def test_numerics_attributes_through_a_shape_changing_bitcast(text):
    """The shadow runs a float bitcast at its own precision (pinned): its twin widens a `.own` copy, whose operands
    are not the program's; numerics paired them and failed on their shapes (found by the campaign on an empty array,
    true of every such bitcast)."""
    import numpy as np

    import hloexec
    from hloexec.tools import numerics
    exe = hloexec.load(f"HloModule m\nENTRY %e {{\n  {text}\n}}\n")
    report = numerics.attribute(exe, [np.linspace(1, 2, 6).reshape(2, 3)])
    assert report is not None
