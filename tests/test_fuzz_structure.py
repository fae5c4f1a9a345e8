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
