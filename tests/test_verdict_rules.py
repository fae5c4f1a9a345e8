"""Bound rules for ops that had none (their elements were unbounded: not judged, so any value passed): fft,
cub's radix sort (keys and the payload sorted with them), XLA's TopK by its interval ends, async all-to-all.
Each: a correct result made independently (XLA:CPU's, numpy's) is consistent, one element changed by 1% or set to
3.4e38 is caught, and no element is left unbounded."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hloexec
import hloexec.spmd as spmd
from hloexec.tools.numerics import Runner, judge_run

FFTS = {
    "rfft": ("f32[8,64]", "c64[8,33]", "RFFT", "{64}"),
    "ifft2": ("c64[4,16,8]", "c64[4,16,8]", "IFFT", "{16,8}"),
}


def _verdicts(verdict, index=0) -> dict:
    """candidate name -> (consistent, bound violations, unbounded elements) for output `index`."""
    return {c.name: (c.consistent, c.bound_violations, c.unbounded) for c in verdict.outputs[index].candidates}


@pytest.mark.parametrize("case", sorted(FFTS))
def test_an_fft_is_bounded_and_a_changed_element_is_caught(case):
    """An fft of a computed operand (tanh of a product: rounded in the program's type) has a bound (a linear map's
    propagation plus the transform's own rounding): XLA:CPU's result (rfft) or numpy's in single precision
    (ifft2) is consistent, a 1% change of one element and a 3.4e38 are caught (unbounded before: both passed)."""
    operand, result, kind, lengths = FFTS[case]
    text = f"""HloModule fft
ENTRY e {{ x = {operand} parameter(0)  y = {operand} parameter(1)  m = {operand} multiply(x, y)
          s = {operand} tanh(m)
          ROOT t = {result} fft(s), fft_type={kind}, fft_length={lengths} }}"""
    r = np.random.default_rng(5)
    shape = tuple(int(n) for n in operand[operand.index("[") + 1 : -1].split(","))
    dtype = np.complex64 if operand.startswith("c") else np.float32
    x, y = (
        r.standard_normal(shape).astype(dtype) + (1j * r.standard_normal(shape) if dtype == np.complex64 else 0)
        for _ in range(2)
    )
    x, y = x.astype(dtype), y.astype(dtype)
    if case == "rfft":
        from hloexec.tools.xla_cpu import run_on_xla_cpu

        [correct] = run_on_xla_cpu(text, [x, y])
    else:  # (numpy's fft in complex64 on the complex64 tanh of the complex64 product)
        correct = np.fft.ifftn(np.tanh(x * y), axes=(-2, -1)).astype(np.complex64)
    big = np.unravel_index(np.argmax(np.abs(correct)), correct.shape)
    bumped, huge = correct.copy(), correct.copy()
    bumped[big] *= 1.01
    huge[1, 2] = 3.4e38
    verdict, _ = judge_run(hloexec.load(text), [x, y], {"correct": [correct], "bumped": [bumped], "huge": [huge]})
    got = _verdicts(verdict)
    assert got["correct"] == (True, 0, 0) and got["hloexec"] == (True, 0, 0), got
    assert got["bumped"] == (False, 1, 0) and not got["huge"][0] and got["huge"][2] == 0, got


RADIX_SORT = """HloModule cub
ENTRY e {{ x = f32[4,64] parameter(0)  y = f32[4,64] parameter(1)
          m = bf16[4,64] multiply(x, y)
          k = f32[4,64] convert(m)
          v = f32[4,64] exponential(y)
          ROOT s = (f32[4,64], f32[4,64], u8[128]) custom-call(k, v), custom_call_target="__cub$DeviceRadixSort",
                   backend_config={{"descending":{descending}}} }}"""


@pytest.mark.parametrize("descending", [False, True])
def test_a_radix_sort_bounds_its_keys_and_the_payload_sorted_with_them(descending):
    """cub's radix sort of bf16-rounded keys with an f32 payload: the keys bounded by their interval ends, the
    payload by its own bound where its key's rank is decided and by its cluster's spread where keys may swap.
    numpy's sort of the same keys is consistent, and so is a device's that orders the bf16 ties by the exact
    products (the payload permuted otherwise within the ties); a payload element 1% off where its key is far from
    the others, a key 1% off, and a 3.4e38 are caught (the shadow's observer failed on the call before)."""
    r = np.random.default_rng(3)
    x = r.standard_normal((4, 64)).astype(np.float32)
    x[:, :16] = 0.75  # (ties: 16 keys a row near 0.75, which bf16 rounding may order either way)
    y = (1 + 1e-3 * r.standard_normal((4, 64))).astype(np.float32)
    exe = hloexec.load(RADIX_SORT.format(descending="true" if descending else "false"))
    keys = (x.astype(np.float64) * y).astype(ml_dtypes.bfloat16).astype(np.float32)
    payload = np.exp(y)

    def sorted_by(key):
        order = np.argsort(-key if descending else key, axis=1, kind="stable")
        return [np.take_along_axis(keys, order, 1), np.take_along_axis(payload, order, 1), np.zeros(128, np.uint8)]

    correct, reordered = sorted_by(keys), sorted_by(x.astype(np.float64) * y)
    assert not np.array_equal(correct[1], reordered[1])  # (the premise: the ties' payloads land elsewhere)
    tied = correct[0][0] == 0.75  # (bf16 ties)
    gaps = np.abs(np.diff(correct[0][0]))
    alone = np.r_[True, gaps > 0.05] & np.r_[gaps > 0.05, True]  # (keys farther from their neighbours than 2 bounds)
    far = int(np.flatnonzero(alone)[5])
    bumped_payload, bumped_key, huge = ([a.copy() for a in correct] for _ in range(3))
    bumped_payload[1][0, far] *= 1.01
    bumped_key[0][0, far] *= 1.01
    huge[1][2, 3] = 3.4e38
    candidates = {
        "correct": correct,
        "reordered": reordered,
        "payload": bumped_payload,
        "key": bumped_key,
        "huge": huge,
    }
    verdict, run = judge_run(exe, [x, y], candidates)
    keys_verdict, payload_verdict = _verdicts(verdict, 0), _verdicts(verdict, 1)
    for name in ("hloexec", "correct", "reordered"):
        assert keys_verdict[name] == payload_verdict[name] == (True, 0, 0), (name, keys_verdict, payload_verdict)
    assert keys_verdict["key"] == (False, 1, 0) and payload_verdict["payload"] == (False, 1, 0)
    assert payload_verdict["huge"] == (False, 1, 0)
    # the payload's bound: its own (below 1e-6 of it) where the key is alone, the ties' spread where they are not
    bound = run.bounds[exe.options.device.name].bounds[1][0]
    assert np.all(bound[alone] < 1e-6 * payload.max()) and np.all(bound[tied] > 1e-4)


A2A = """HloModule a2a, num_partitions=4
ENTRY e {
  x = f16[16,16] parameter(0), sharding={devices=[1,4]0,1,2,3}
  sq = f16[16,16] multiply(x, x)
  s = ((f16[16,16]), f16[16,16]) all-to-all-start(sq), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}
  d = f16[16,16] all-to-all-done(s)
  ROOT t = f16[16,16] tanh(d), sharding={devices=[4,1]0,1,2,3}
}
"""


def test_an_async_all_to_all_moves_its_bounds():
    """all-to-all-start/-done (an async all-to-all, as XLA-GPU dumps print it) moves its operands' bounds as the
    all-to-all does: numpy's result (f16 square, moved, f16 tanh) is consistent, one element 1% off is caught
    (the start was unbounded: the tanh's elements were not judged)."""
    exe = hloexec.load(A2A)
    inputs = spmd.random_global_inputs(exe.module, 0)
    runner = Runner({"partitions": 4, "replicas": 1, "report": lambda message: None})
    x = inputs[0]
    square = (x.astype(np.float32) ** 2).astype(np.float16)
    # device j's result: row block i (4 rows) is device i's square's rows 4j..4j+4 (its columns 16i..16i+16)
    moved = np.concatenate(
        [np.concatenate([square[4 * j : 4 * j + 4, 16 * i : 16 * i + 16] for i in range(4)]) for j in range(4)]
    )
    correct = np.tanh(moved.astype(np.float32)).astype(np.float16)
    bumped = correct.copy()
    bumped[np.unravel_index(np.argmax(np.abs(correct)), correct.shape)] *= np.float16(1.01)
    per_device = spmd.split_inputs(exe.module, inputs, 4)
    verdict, run = judge_run(exe, per_device, {"correct": [correct], "bumped": [bumped]}, runner)
    got = _verdicts(verdict)
    assert run.bounds[exe.options.device.name].unbounded == {}
    assert got["correct"] == (True, 0, 0) and got["bumped"] == (False, 1, 0), got


_PAIRS = "frontend_attributes={_xla_send_recv_source_target_pairs={{0,1},{1,0}}}"
SEND_RECV = f"""HloModule m, num_partitions=2
ENTRY e {{
  x = f16[8,64] parameter(0)  y = f16[8,64] parameter(1)  m = f16[8,64] multiply(x, y)  t = token[] after-all()
  s = (f16[8,64], u32[], token[]) send(m, t), channel_id=1, {_PAIRS}
  sd = token[] send-done(s), channel_id=1, {_PAIRS}
  r = (f16[8,64], u32[], token[]) recv(sd), channel_id=1, {_PAIRS}
  rd = (f16[8,64], token[]) recv-done(r), channel_id=1, {_PAIRS}
  d = f16[8,64] get-tuple-element(rd), index=0
  ROOT o = f16[8,64] add(d, x) }}"""


def test_send_and_recv_move_their_bounds():
    """A send and the recv-done of its channel (two devices swapping an f16 product) move the data's bound and
    samples as the data: numpy's result (the other device's f16 product plus its own x, each op rounded to f16) is
    consistent, its largest element 1% off is caught, and so is the other device's result (the recv and recv-done
    were unbounded: the received product's elements were not judged, nor the sums made from them)."""
    exe = hloexec.load(SEND_RECV)
    r = np.random.default_rng(0)
    per_device = [[r.standard_normal((8, 64)).astype(np.float16) for _ in range(2)] for _ in range(2)]
    (x0, y0), (x1, y1) = per_device
    correct = x1 * y1 + x0  # device 0's
    bumped = correct.copy()
    bumped[np.unravel_index(np.argmax(np.abs(correct)), correct.shape)] *= np.float16(1.01)
    runner = Runner({"partitions": 2, "replicas": 1, "report": lambda message: None})
    candidates = {"correct": [correct], "bumped": [bumped], "other": [x0 * y0 + x1]}
    verdict, run = judge_run(exe, per_device, candidates, runner)
    got = _verdicts(verdict)
    assert run.bounds[exe.options.device.name].unbounded == {}
    assert got["correct"] == (True, 0, 0) and got["hloexec"] == (True, 0, 0), got
    assert got["bumped"] == (False, 1, 0) and not got["other"][0], got


ASYNC_CALL = """HloModule a
square { a = f16[8,64] parameter(0)  ROOT m = f16[8,64] multiply(a, a) }
ENTRY e { x = f16[8,64] parameter(0)
          s = ((f16[8,64]), f16[8,64]) async-start(x), calls=square
          d = f16[8,64] async-done(s)
          ROOT o = f16[8,64] add(d, x) }"""


def test_an_async_call_keeps_its_operands_and_its_computations_bounds():
    """async-start / async-done of a called computation (`calls=`): the value holds its operands and what the
    computation made (observed inside it), so it has no rule of its own. numpy's result (f16 x*x + x, each op
    rounded) is consistent and its largest element 1% off is caught (the start was unbounded, and so was its
    operand x: a parameter given an infinite bound, nothing made from it judged)."""
    x = np.random.default_rng(6).standard_normal((8, 64)).astype(np.float16)
    correct = x * x + x
    bumped = correct.copy()
    bumped[np.unravel_index(np.argmax(np.abs(correct)), correct.shape)] *= np.float16(1.01)
    exe = hloexec.load(ASYNC_CALL)
    verdict, run = judge_run(exe, [x], {"correct": [correct], "bumped": [bumped]})
    got = _verdicts(verdict)
    assert run.bounds[exe.options.device.name].unbounded == {}
    assert got["correct"] == (True, 0, 0) and got["bumped"] == (False, 1, 0), got


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_custom_call_computing_its_own_way_is_unbounded_and_named(dtype):
    """A custom-call the shadow pins (it computes at its own types: here Neuron's gelu) has no rule: its elements
    are not judged and its target is named (`unbounded`), as the docs say. It was given its operand's bound, as if
    it were the identity (one whose operands have other shapes, a cuDNN convolution's: none, as if exact), and was
    never counted as unbounded; a bf16 one's as if exact)."""
    text = f"""HloModule g
ENTRY e {{ x = {dtype}[8,64] parameter(0)  y = {dtype}[8,64] parameter(1)  m = {dtype}[8,64] multiply(x, y)
          ROOT g = {dtype}[8,64] custom-call(m), custom_call_target="AwsNeuronGelu" }}"""
    r = np.random.default_rng(1)
    numpy_type = np.float32 if dtype == "f32" else ml_dtypes.bfloat16
    x, y = (r.standard_normal((8, 64)).astype(numpy_type) for _ in range(2))
    exe = hloexec.load(text)
    verdict, run = judge_run(exe, [x, y], {})
    assert run.bounds[exe.options.device.name].unbounded == {"g": "custom-call AwsNeuronGelu"}
    assert np.all(np.isinf(run.bounds[exe.options.device.name].bounds[0]))
    assert _verdicts(verdict)["hloexec"] == (True, 0, 512)


GEMM = r"""HloModule g
ENTRY e {{ x = f16[64,32] parameter(0)  y = f16[32,48] parameter(1)  m = f16[64,32] multiply(x, x)
          ROOT g = f16[64,48] custom-call(m, y), custom_call_target="__cublas$gemm", backend_config="{{\"alpha_real\":1,\"alpha_imag\":0,\"beta\":0,\"dot_dimension_numbers\":{{\"lhs_contracting_dimensions\":[\"1\"],\"rhs_contracting_dimensions\":[\"0\"],\"lhs_batch_dimensions\":[],\"rhs_batch_dimensions\":[]}},\"epilogue\":\"{epilogue}\"}}" }}"""


def test_a_cublas_gemm_that_is_a_dot_is_bounded_as_one():
    """A cuBLAS gemm custom-call with alpha 1, beta 0 and no epilogue (what TF's GPU clusters are full of) is that
    dot: numpy's f16 product accumulated in f32 is consistent, its largest element 1% off is caught (unbounded
    before: passed)."""
    r = np.random.default_rng(1)
    x, y = r.standard_normal((64, 32)).astype(np.float16), r.standard_normal((32, 48)).astype(np.float16)
    square = (x.astype(np.float32) ** 2).astype(np.float16)
    correct = (square.astype(np.float32) @ y.astype(np.float32)).astype(np.float16)
    bumped = correct.copy()
    bumped[np.unravel_index(np.argmax(np.abs(correct)), correct.shape)] *= np.float16(1.01)
    exe = hloexec.load(GEMM.format(epilogue="DEFAULT"))
    verdict, run = judge_run(exe, [x, y], {"correct": [correct], "bumped": [bumped]})
    got = _verdicts(verdict)
    assert run.bounds[exe.options.device.name].unbounded == {}
    assert got["correct"] == (True, 0, 0) and got["bumped"] == (False, 1, 0), got


GEMM_CALL = r"""HloModule g
ENTRY e {{ x = {t}[64,32] parameter(0)  y = {t}[32,48] parameter(1)  c = {t}[64,48] parameter(2)
          bias = {t}[48] parameter(3)  m = {t}[64,32] multiply(x, x)  cc = {t}[64,48] multiply(c, c)
          ROOT g = {result} custom-call(m, y{operands}), custom_call_target="{target}", backend_config="{{\"gemm_backend_config\":{{\"alpha_real\":{alpha},\"alpha_imag\":0,\"beta\":{beta},\"dot_dimension_numbers\":{{\"lhs_contracting_dimensions\":[\"1\"],\"rhs_contracting_dimensions\":[\"0\"],\"lhs_batch_dimensions\":[],\"rhs_batch_dimensions\":[]}},\"epilogue\":\"{epilogue}\"}}}}" }}"""
# variant -> (target, alpha, beta, epilogue, type, result): alpha 0.01 (the xmap seed's, f16 and f32) and 0.5 (a
# power of two: no rounding of its own), beta 1 (C accumulated), a bias with RELU, GELU with its pre-activation aux
# output, SILU, a plain product with a workspace (a tuple: not the dot gemm_as_dot takes)
GEMM_VARIANTS = {
    "alpha": ("__cublas$gemm", 0.01, 0, "DEFAULT", "f16", "f16[64,48]"),
    "alpha_f32": ("__cublas$gemm", 0.01, 0, "DEFAULT", "f32", "f32[64,48]"),
    "beta": ("__cublas$gemm", 1, 1, "DEFAULT", "f16", "f16[64,48]"),
    "bias_relu": ("__cublas$lt$matmul", 1, 0, "BIAS_RELU", "f16", "f16[64,48]"),
    "gelu_aux": ("__cublas$lt$matmul", 0.5, 0, "BIAS_GELU_AUX", "f16", "(f16[64,48], f16[64,48], s8[0])"),
    "bias_silu": ("__cublas$lt$matmul", 1, 0, "BIAS_SILU", "f16", "f16[64,48]"),
    "workspace": ("__cublas$lt$matmul", 1, 0, "DEFAULT", "f16", "(f16[64,48], s8[0])"),
}


def _cublas_gemm(m, y, alpha, beta, c, bias, epilogue):
    """cuBLASLt's documented arithmetic, emulated: f16 (or f32) operands, f32 accumulation, the epilogue in f32
    (D = act(alpha * A.B + beta * C + bias), GELU its tanh approximation), one final rounding to the operands'
    type; returns (D, the pre-activation value)."""
    f32 = np.float32
    r = (m.astype(f32) @ y.astype(f32)) * f32(alpha)
    if beta:
        r = r + f32(beta) * c.astype(f32)
    if epilogue.startswith("BIAS"):
        r = r + bias.astype(f32)
    pre = r
    if "RELU" in epilogue:
        r = np.maximum(r, f32(0))
    elif "GELU" in epilogue:
        r = f32(0.5) * r * (f32(1) + np.tanh(f32(np.sqrt(2 / np.pi)) * (r + f32(0.044715) * r * r * r)))
    elif "SILU" in epilogue:
        r = r / (f32(1) + np.exp(-r))
    return r.astype(m.dtype), pre.astype(m.dtype)


@pytest.mark.parametrize("variant", sorted(GEMM_VARIANTS))
def test_a_cublas_gemm_with_alpha_beta_or_an_epilogue_is_bounded(variant):
    """A cuBLAS gemm with alpha != 1, beta != 0 (C accumulated) or an epilogue (bias, RELU, GELU with its aux
    output): the dot's bound, then the scaling, the C and bias adds and the activation in f32, one final rounding.
    cuBLASLt's arithmetic emulated in numpy is consistent, and so is hloexec's run; the largest element 1% off is
    caught (unbounded on main: not judged, passed)."""
    target, alpha, beta, epilogue, t, result = GEMM_VARIANTS[variant]
    aux = epilogue.endswith("AUX")
    operands = (", cc" if beta else "") + (", bias" if epilogue.startswith("BIAS") else "")
    text = GEMM_CALL.format(
        result=result, operands=operands, target=target, alpha=alpha, beta=beta, epilogue=epilogue, t=t
    )
    dtype = np.dtype(t.replace("f", "float"))
    r = np.random.default_rng(2)
    x, y, c = (r.standard_normal(s).astype(dtype) for s in ((64, 32), (32, 48), (64, 48)))
    bias = r.standard_normal(48).astype(dtype)
    square = lambda v: (v.astype(np.float64) ** 2).astype(dtype)  # noqa: E731 (the program's multiply, rounded once)
    correct, pre = _cublas_gemm(square(x), y, alpha, beta, square(c), bias, epilogue)
    bumped = correct.copy()
    bumped[np.unravel_index(np.argmax(np.abs(correct)), correct.shape)] *= dtype.type(1.01)
    rest = [pre] if aux else []
    outputs = lambda d: [d, *rest, np.zeros(0, np.int8)] if "(" in result else [d]  # noqa: E731
    exe = hloexec.load(text)
    verdict, run = judge_run(exe, [x, y, c, bias], {"correct": outputs(correct), "bumped": outputs(bumped)})
    assert run.bounds[exe.options.device.name].unbounded == {}
    got = _verdicts(verdict)
    assert got["correct"] == (True, 0, 0) and got["hloexec"] == (True, 0, 0), got
    assert got["bumped"] == (False, 1, 0), got
    if aux:
        assert _verdicts(verdict, 1)["correct"] == (True, 0, 0)


F8_MATMUL = r"""HloModule g
ENTRY e {{ x = f32[64,512] parameter(0)  w = f32[48,512] parameter(1)  xs = f32[] parameter(2)  ws = f32[] parameter(3)
          ds = f32[] parameter(4)  bias = bf16[48] parameter(5)  one = f32[] constant(1)
          xb = f32[64,512] broadcast(xs), dimensions={{}}  wb = f32[48,512] broadcast(ws), dimensions={{}}
          xd = f32[64,512] divide(x, xb)  wd = f32[48,512] divide(w, wb)
          a = f8e4m3fn[64,512] convert(xd)  b = f8e4m3fn[48,512] convert(wd)
          ROOT g = {result} custom-call(a, b, xs, ws{operands}), custom_call_target="__cublas$lt$matmul$f8", backend_config={{"gemm_backend_config":{{"alpha_real":1,"alpha_imag":0,"beta":0,"dot_dimension_numbers":{{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}},"precision_config":{{"operand_precision":["DEFAULT","DEFAULT"],"algorithm":"ALG_UNSET"}},"epilogue":"{epilogue}","damax_output":{damax}}}}} }}"""
# variant -> (result, operands after b_scale, epilogue, device): f32 accumulation (reference) and Hopper's fast
# accumulation (h100: DEFAULT precision), a bf16 result with a bias and RELU, an fp8 result with d_scale and amax
# (the form GemmRewriter makes), the same in the older form (c_scale, d_scale after b_scale)
F8_VARIANTS = {
    "f32": ("(f32[64,48], s8[0])", "", "DEFAULT", "reference"),
    "f32_fast_accumulation": ("(f32[64,48], s8[0])", "", "DEFAULT", "h100"),
    "bf16_bias_relu": ("(bf16[64,48], s8[0])", ", bias", "BIAS_RELU", "h100"),
    "f8_d_scale_amax": ("(f8e4m3fn[64,48], f32[], s8[0])", ", ds", "DEFAULT", "h100"),
    "f8_e5m2_older_form": ("(f8e5m2[64,48], f32[], s8[0])", ", one, ds", "DEFAULT", "reference"),
}


def _truncated(x, bits):
    """f32 values cut to `bits` significand bits (the implicit one counted), towards zero."""
    return (np.asarray(x, np.float32).view(np.uint32) & np.uint32(~((1 << (24 - bits)) - 1) & 0xFFFFFFFF)).view(
        np.float32
    )


def _cublaslt_f8(a, b, scales, bias, epilogue, fast, out_type):
    """cuBLASLt's fp8 matmul as its documentation states it (cublasLtMatmul: D = scale_d * epilogue(scale_a *
    scale_b * A.B + bias), amax_D = max |D| before scale_d, fp8 outputs saturated), emulated: the fp8 values exact
    in f32, accumulated in f32, or under Hopper's fast accumulation as the DeepSeek-V3 report (3.3.2) describes it
    (32 products at a time, the running sum kept to 14 significand bits, truncated); returns (D, amax)."""
    f32 = np.float32
    a, b = a.astype(f32), b.astype(f32)
    if fast:
        acc = np.zeros((a.shape[0], b.shape[0]), f32)
        for k in range(0, a.shape[1], 32):
            acc = _truncated(acc + a[:, k : k + 32] @ b[:, k : k + 32].T, 14)
    else:
        acc = a @ b.T
    r = acc * (f32(scales[0]) * f32(scales[1]))
    if epilogue.startswith("BIAS"):
        r = r + bias.astype(f32)
    if "RELU" in epilogue:
        r = np.maximum(r, f32(0))
    amax = np.max(np.abs(r))
    if len(scales) > 2:
        r = r * f32(scales[2])
    if np.dtype(out_type).itemsize == 1:
        limit = f32(ml_dtypes.finfo(out_type).max)
        r = np.clip(r, -limit, limit)
    return r.astype(out_type), f32(amax)


@pytest.mark.parametrize("variant", sorted(F8_VARIANTS))
def test_a_cublaslt_fp8_matmul_is_bounded(variant):
    """cuBLASLt's fp8 matmul (`__cublas$lt$matmul$f8`: f32 operands scaled and quantized to e4m3 in the program,
    their scales as operands): the product of the fp8 values (exact) accumulated in f32 or, on an H100 at DEFAULT
    precision, with fast accumulation (its truncations bounded, tools/bound_dots.fast_accumulation_allowance),
    scaled by a_scale * b_scale, the epilogue, d_scale, the saturation and the final rounding. The documented
    arithmetic emulated in numpy is consistent, and so is hloexec's run; the largest element 1% off is caught
    where 1% exceeds the bound (f32 and bf16 results), an fp8 result's (an ulp of 6-12%) two values up; amax 1%
    off is caught. d_scale 8 saturates ~1% of the e4m3 result's elements at 448 (the shadow's exact value too). On main it was pinned: an f32 result unbounded, others judged as if exact (its own run only)."""
    result, operands, epilogue, device = F8_VARIANTS[variant]
    text = F8_MATMUL.format(
        result=result, operands=operands, epilogue=epilogue, damax="true" if "f32[]" in result else "false"
    )
    r = np.random.default_rng(4)
    x, w = r.standard_normal((64, 512)).astype(np.float32), r.standard_normal((48, 512)).astype(np.float32)
    xs, ws = np.float32(np.abs(x).max() / 448), np.float32(np.abs(w).max() / 448)
    ds, bias = np.float32(8), r.standard_normal(48).astype(ml_dtypes.bfloat16)  # (~1% of e4m3's saturate)
    a = (x / xs).astype(ml_dtypes.float8_e4m3fn)  # (the program's divide and convert: f32, to nearest)
    b = (w / ws).astype(ml_dtypes.float8_e4m3fn)
    out_type = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f8e4m3fn": ml_dtypes.float8_e4m3fn}.get(
        result[1 : result.index("[")], ml_dtypes.float8_e5m2
    )
    scales = (xs, ws, ds) if "ds" in operands else (xs, ws)
    correct, amax = _cublaslt_f8(a, b, scales, bias, epilogue, device == "h100", out_type)
    magnitude = np.abs(correct.astype(np.float32))
    big = np.unravel_index(np.argmax(np.where(magnitude < 200, magnitude, 0)), correct.shape)  # (not saturated)
    bumped = correct.copy()
    if np.dtype(out_type).itemsize == 1:  # (two fp8 values up: 1% is within an ulp)
        bumped.view(np.uint8)[big] += 2
    else:
        bumped[big] = (correct[big].astype(np.float32) * 1.01).astype(out_type)
    has_amax = "f32[]" in result
    outputs = lambda d, m: [d, m, np.zeros(0, np.int8)] if has_amax else [d, np.zeros(0, np.int8)]  # noqa: E731
    candidates = {"correct": outputs(correct, amax), "bumped": outputs(bumped, amax)}
    if has_amax:
        candidates["amax_bumped"] = outputs(correct, np.float32(amax * 1.01))
    exe = hloexec.load(text, device=device)
    verdict, run = judge_run(exe, [x, w, xs, ws, ds, bias], candidates)
    assert run.bounds[exe.options.device.name].unbounded == {}
    got = _verdicts(verdict)
    assert got["correct"] == (True, 0, 0) and got["hloexec"] == (True, 0, 0), got
    assert got["bumped"] == (False, 1, 0), got
    if has_amax:
        assert _verdicts(verdict, 1)["correct"] == (True, 0, 0) and _verdicts(verdict, 1)["hloexec"] == (True, 0, 0)
        assert _verdicts(verdict, 1)["amax_bumped"] == (False, 1, 0), _verdicts(verdict, 1)


@pytest.mark.parametrize(
    "device,algorithm", [("h100", ""), ("reference", ", algorithm=dot_any_f8_any_f8_f32_fast_accum")]
)
def test_an_fp8_dot_with_fast_accumulation_is_bounded(device, algorithm):
    """A plain fp8 dot at DEFAULT precision becomes a cuBLASLt fp8 GEMM on an H100, with fast accumulation (the
    h100 profile), and so does one whose algorithm asks for it on any device: its bound allows the running sum's
    truncations (tools/bound_dots.fast_accumulation_allowance), and its shadow is the exact dot. The emulated device
    result is consistent, and so is hloexec's run; the largest element 1% off is caught. On main the dot's bound
    took f32 accumulation (hloexec's run and the emulation flagged, errors ~200x their bounds), and the explicit
    algorithm's shadow truncated its own sums too."""
    text = f"""HloModule d
ENTRY e {{ a = f8e4m3fn[64,512] parameter(0)  b = f8e4m3fn[48,512] parameter(1)
          ROOT d = f32[64,48] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}{algorithm} }}"""
    r = np.random.default_rng(6)
    a, b = ((r.standard_normal((n, 512)) * 64).astype(ml_dtypes.float8_e4m3fn) for n in (64, 48))
    correct, _ = _cublaslt_f8(a, b, (1, 1), None, "DEFAULT", True, np.float32)
    bumped = correct.copy()
    bumped[np.unravel_index(np.argmax(np.abs(correct)), correct.shape)] *= np.float32(1.01)
    exe = hloexec.load(text, device=device)
    verdict, run = judge_run(exe, [a, b], {"correct": [correct], "bumped": [bumped]})
    got = _verdicts(verdict)
    assert not np.array_equal(correct, _cublaslt_f8(a, b, (1, 1), None, "DEFAULT", False, np.float32)[0])
    # (fp8 products' sums of 512 terms span < 53 bits: exact in f64 in any order)
    np.testing.assert_array_equal(run.shadow[0], a.astype(np.float64) @ b.astype(np.float64).T)
    assert got["correct"] == (True, 0, 0) and got["hloexec"] == (True, 0, 0), got
    assert got["bumped"] == (False, 1, 0), got


CUDNN_CONV = r"""HloModule conv
ENTRY e {{ x = f16[2,6,6,4] parameter(0)  w = f16[3,3,4,8] parameter(1)  dy = f16[2,6,6,8] parameter(2)
          bias = f16[8] parameter(3)  side = f16[2,6,6,8] parameter(4)
          xx = f16[2,6,6,4] multiply(x, x)  ww = f16[3,3,4,8] multiply(w, w)  dd = f16[2,6,6,8] multiply(dy, dy)
          call = ({result}, u8[0]) custom-call({operands}), window={{size=3x3 pad=1_1x1_1}}, dim_labels=b01f_01io->b01f,
                 custom_call_target="{target}", backend_config="{{\"cudnn_conv_backend_config\":{{\"conv_result_scale\":{scale},\"side_input_scale\":0.5,\"activation_mode\":\"{mode}\"}}}}"
          ROOT r = {result} get-tuple-element(call), index=0 }}"""
# case -> (target, result, operands, activation mode)
CUDNN_CALLS = {
    "forward": ("__cudnn$convForward", "f16[2,6,6,8]", "xx, ww", "kNone"),
    "bias_relu": ("__cudnn$convBiasActivationForward", "f16[2,6,6,8]", "xx, ww, bias, side", "kRelu"),
    "bias_gelu": ("__cudnn$convBiasActivationForward", "f16[2,6,6,8]", "xx, ww, bias, side", "kGeluExact"),
    "bias_elu": ("__cudnn$convBiasActivationForward", "f16[2,6,6,8]", "xx, ww, bias, side", "kElu"),
    "backward_input": ("__cudnn$convBackwardInput", "f16[2,6,6,4]", "dd, ww", "kNone"),
    "backward_filter": ("__cudnn$convBackwardFilter", "f16[3,3,4,8]", "xx, dd", "kNone"),
}


@pytest.mark.parametrize("case", sorted(CUDNN_CALLS))
def test_a_cudnn_convolution_is_computed_by_the_shadow_and_bounded(case):
    """cuDNN convolutions (f16 NHWC, a 3x3 window, padding 1) were pinned in the shadow (computed at their own
    types: no exact value, unbounded); now the shadow computes them in f64 and the convolution's rule bounds them
    (the bias-activation call: conv_result_scale x conv + side_input_scale x side + bias, then relu, erf's gelu or
    elu). cuDNN's
    arithmetic emulated (f16 values, f32 accumulation: jax's f32 convolution and its vjp on XLA:CPU, the epilogue in
    f32, one rounding to f16) is consistent, and so is hloexec's run; the largest element 1% off is caught."""
    import jax
    from jax import lax

    target, result, operands, mode = CUDNN_CALLS[case]
    scale = 0.25 if target == "__cudnn$convForward" else 1
    text = CUDNN_CONV.format(result=result, operands=operands, target=target, scale=scale, mode=mode)
    r = np.random.default_rng(4)
    x, w, dy, side = (
        r.standard_normal(s).astype(np.float16) for s in ((2, 6, 6, 4), (3, 3, 4, 8), (2, 6, 6, 8), (2, 6, 6, 8))
    )
    bias = r.standard_normal(8).astype(np.float16)
    f32 = np.float32
    xx, ww, dd = ((v.astype(f32) ** 2).astype(np.float16).astype(f32) for v in (x, w, dy))

    def conv(a, b):
        return lax.conv_general_dilated(a, b, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC"))

    if target == "__cudnn$convBackwardInput":
        want = jax.vjp(lambda a: conv(a, ww), xx)[1](dd)[0]
    elif target == "__cudnn$convBackwardFilter":
        want = jax.vjp(lambda b: conv(xx, b), ww)[1](dd)[0]
    else:
        want = np.asarray(conv(xx, ww)) * f32(scale)
        if target == "__cudnn$convBiasActivationForward":
            activate = {"kRelu": jax.nn.relu, "kElu": jax.nn.elu, "kGeluExact": lambda v: jax.nn.gelu(v, False)}[mode]
            want = activate(want + f32(0.5) * side.astype(f32) + bias.astype(f32))
    correct = np.asarray(want, f32).astype(np.float16)
    bumped = correct.copy()
    bumped[np.unravel_index(np.argmax(np.abs(correct)), correct.shape)] *= np.float16(1.01)
    exe = hloexec.load(text)
    verdict, run = judge_run(exe, [x, w, dy, bias, side], {"correct": [correct], "bumped": [bumped]})
    assert run.bounds[exe.options.device.name].unbounded == {}
    got = _verdicts(verdict)
    assert got["correct"] == (True, 0, 0) and got["hloexec"] == (True, 0, 0), got
    assert got["bumped"] == (False, 1, 0), got


ARGMAX = """HloModule argmax
pick {
  a = f32[] parameter(0)  i = s32[] parameter(1)  b = f32[] parameter(2)  j = s32[] parameter(3)
  gt = pred[] compare(a, b), direction=GT
  nan = pred[] compare(a, a), direction=NE
  first = pred[] or(gt, nan)
  eq = pred[] compare(a, b), direction=EQ
  lt = pred[] compare(i, j), direction=LT
  tie = pred[] and(eq, lt)
  keep = pred[] or(first, tie)
  v = f32[] select(first, a, b)
  k = s32[] select(keep, i, j)
  ROOT t = (f32[], s32[]) tuple(v, k)
}
ENTRY e {
  x = f32[16,64] parameter(0)  y = f32[16,64] parameter(1)
  m = f32[16,64] multiply(x, y)
  s = f32[16,64] tanh(m)
  idx = s32[16,64] iota(), iota_dimension=1
  ninf = f32[] constant(-inf)
  zero = s32[] constant(0)
  ROOT r = (f32[16], s32[16]) reduce(s, idx, ninf, zero), dimensions={1}, to_apply=pick
}"""


def test_an_argmax_reduce_bounds_its_value_as_a_max():
    """A variadic reduce whose reducer keeps one of its two values by comparing them (jax's argmax, its reducer
    as jax writes it) bounds its value result as the row's max (the reduce at its operand's interval ends); the
    index is an integer. numpy's max of the f32 tanh is consistent, one value 1% off is caught (unbounded before:
    passed)."""
    r = np.random.default_rng(2)
    x, y = (r.standard_normal((16, 64)).astype(np.float32) for _ in range(2))
    s = np.tanh(x * y)
    correct = [s.max(axis=1), s.argmax(axis=1).astype(np.int32)]
    bumped = [correct[0].copy(), correct[1]]
    bumped[0][3] *= np.float32(1.01)
    exe = hloexec.load(ARGMAX)
    verdict, run = judge_run(exe, [x, y], {"correct": correct, "bumped": bumped})
    got = _verdicts(verdict)
    assert run.bounds[exe.options.device.name].unbounded == {}
    assert got["correct"] == (True, 0, 0) and got["bumped"] == (False, 1, 0), got


# jax's lax.sort comparator (NaN and -0 canonicalized, a TOTALORDER LT), a top-k's value-then-index (descending) and
# XLA's TopK decomposition's (its tie a TOTALORDER EQ, its order a plain GT)
_SORT_PARAMETERS = """
  a = f32[] parameter(0)  b = f32[] parameter(1)  i = s32[] parameter(2)  j = s32[] parameter(3)
  p = f32[] parameter(4)  q = f32[] parameter(5)"""
_VALUE_THEN_INDEX = """
  eq = pred[] compare(a, b), direction=EQ, type=TOTALORDER
  lt = pred[] compare(i, j), direction=LT
  gt = pred[] compare(a, b), direction=GT{type}
  ROOT r = pred[] select(eq, lt, gt)"""
SORT_COMPARATORS = {
    name: "less {" + _SORT_PARAMETERS + body + "\n}"
    for name, body in {
        "ascending": """
  nan = f32[] constant(nan)  zero = f32[] constant(0)
  na = pred[] compare(a, a), direction=NE  za = pred[] compare(a, zero), direction=EQ
  ca0 = f32[] select(za, zero, a)  ca = f32[] select(na, nan, ca0)
  nb = pred[] compare(b, b), direction=NE  zb = pred[] compare(b, zero), direction=EQ
  cb0 = f32[] select(zb, zero, b)  cb = f32[] select(nb, nan, cb0)
  ROOT lt = pred[] compare(ca, cb), direction=LT, type=TOTALORDER""",
        "descending": _VALUE_THEN_INDEX.format(type=", type=TOTALORDER"),
        "topk": _VALUE_THEN_INDEX.format(type=""),
        "floor": """
  fa = f32[] floor(a)  fb = f32[] floor(b)
  ROOT lt = pred[] compare(fa, fb), direction=LT""",
    }.items()
}
HLO_SORT = """HloModule sort
{comparator}
ENTRY e {{ x = f32[4,64] parameter(0)  y = f32[4,64] parameter(1)  z = f32[4,64] parameter(2)
          m = bf16[4,64] multiply(x, y)
          k = f32[4,64] convert(m)
          v = f32[4,64] exponential(z)
          i = s32[4,64] iota(), iota_dimension=1
          ROOT s = (f32[4,64], s32[4,64], f32[4,64]) sort(k, i, v), dimensions={{1}}, is_stable=true, to_apply=less }}"""


@pytest.mark.parametrize("order", ["ascending", "descending", "topk"])
def test_an_hlo_sort_bounds_its_keys_and_the_payload_sorted_with_them(order):
    """An HLO sort (jax's comparators) of bf16-rounded keys with their index and an f32 payload: the keys bounded by
    their interval ends, the payload by its own bound where its key's rank is decided and by its cluster's spread
    where keys may swap. numpy's stable sort of the device's keys is consistent, and so is a device's that orders
    the bf16 ties by the exact products; a payload element 1% off where its key is far from the others and a key 1%
    off are caught. Before, every element was allowed the operands' largest bound: hloexec's own result and numpy's
    were flagged (~60 payload elements: the shadow orders the ties by the exact products, their payloads ~1 apart,
    the largest bound ~0.01) and the key 1% off passed."""
    descending = order != "ascending"
    r = np.random.default_rng(3)
    x = r.standard_normal((4, 64)).astype(np.float32)
    x[:, :16] = 0.75  # (ties: 16 keys a row near 0.75, which bf16 rounding may order either way)
    y = (1 + 1e-3 * r.standard_normal((4, 64))).astype(np.float32)
    z = (r.standard_normal((4, 64)) - np.where(np.arange(64) < 16, 0, 7)).astype(np.float32)  # (small but the ties)
    exe = hloexec.load(HLO_SORT.format(comparator=SORT_COMPARATORS[order]))
    keys = (x.astype(np.float64) * y).astype(ml_dtypes.bfloat16).astype(np.float32)
    payload = np.exp(z)
    index = np.broadcast_to(np.arange(64, dtype=np.int32), (4, 64))

    def sorted_by(key):
        permutation = np.argsort(-key if descending else key, axis=1, kind="stable")
        return [np.take_along_axis(a, permutation, 1) for a in (keys, index, payload)]

    correct, reordered = sorted_by(keys), sorted_by(x.astype(np.float64) * y)
    assert not np.array_equal(correct[2], reordered[2])  # (the premise: the ties' payloads land elsewhere)
    gaps = np.abs(np.diff(correct[0][0]))
    alone = np.r_[True, gaps > 0.05] & np.r_[gaps > 0.05, True]  # (keys farther from their neighbours than 2 bounds)
    far = int(np.flatnonzero(alone)[5])
    bumped_payload, bumped_key = ([a.copy() for a in correct] for _ in range(2))
    bumped_payload[2][0, far] *= 1.01
    bumped_key[0][0, far] *= 1.01
    candidates = {"correct": correct, "reordered": reordered, "payload": bumped_payload, "key": bumped_key}
    verdict, run = judge_run(exe, [x, y, z], candidates)
    keys_verdict, payload_verdict = _verdicts(verdict, 0), _verdicts(verdict, 2)
    assert run.bounds[exe.options.device.name].unbounded == {}
    for name in ("hloexec", "correct", "reordered"):
        assert keys_verdict[name] == payload_verdict[name] == (True, 0, 0), (name, keys_verdict, payload_verdict)
    assert keys_verdict["key"] == (False, 1, 0) and payload_verdict["payload"] == (False, 1, 0)
    # the payload's bound: its own (below 1e-6 of it) where the key is alone, the ties' spread where they are not
    bound = run.bounds[exe.options.device.name].bounds[2][0]
    tied = correct[0][0] == 0.75
    assert np.all(bound[alone] < 1e-6 * np.abs(correct[2][0][alone])) and np.all(bound[tied] > 0.1)


def test_an_hlo_sort_its_rule_does_not_know_is_unbounded_and_named():
    """A comparator whose key is not ordered strictly by the values (floor: values within an integer tie, kept in
    their given order, so a key's rank is not its value's) has no rule: the sort is named unbounded (before, its
    elements were allowed the operands' largest bound)."""
    r = np.random.default_rng(4)
    x, y, z = (r.standard_normal((4, 64)).astype(np.float32) for _ in range(3))
    exe = hloexec.load(HLO_SORT.format(comparator=SORT_COMPARATORS["floor"]))
    verdict, run = judge_run(exe, [x, y, z], {})
    assert set(run.bounds[exe.options.device.name].unbounded.values()) == {"sort"}
    assert _verdicts(verdict, 2)["hloexec"][2] == 4 * 64


MAP = """HloModule map
f { a = f16[] parameter(0)  b = f16[] parameter(1)  m = f16[] multiply(a, b)  t = f16[] tanh(m)
    one = f16[] constant(1)  ROOT s = f16[] add(t, one) }
ENTRY e { x = f16[16,64] parameter(0)  y = f16[16,64] parameter(1)
          ROOT r = f16[16,64] map(x, y), dimensions={0,1}, to_apply=f }"""
MAPPED_OPS = """HloModule plain
ENTRY e { x = f16[16,64] parameter(0)  y = f16[16,64] parameter(1)  m = f16[16,64] multiply(x, y)
          t = f16[16,64] tanh(m)  one = f16[] constant(1)  o = f16[16,64] broadcast(one), dimensions={}
          ROOT s = f16[16,64] add(t, o) }"""


def test_a_map_is_bounded_as_the_elementwise_ops_of_its_computation():
    """A map of an f16 computation (multiply, tanh, add a constant) gets the bounds the same ops over the arrays get
    (equal, element for element: its steps are observed on whole arrays, as a fusion's); numpy's f16 emulation (each
    op rounded to f16, tanh in f32) is consistent, its largest element 1% off is caught (unbounded before: passed)."""
    r = np.random.default_rng(1)
    x, y = (r.standard_normal((16, 64)).astype(np.float16) for _ in range(2))
    f16, f32 = np.float16, np.float32
    correct = (np.tanh((x.astype(f32) * y).astype(f16).astype(f32)).astype(f16).astype(f32) + 1).astype(f16)
    bumped = correct.copy()
    bumped[np.unravel_index(np.argmax(np.abs(correct)), correct.shape)] *= f16(1.01)
    exe, plain = hloexec.load(MAP), hloexec.load(MAPPED_OPS)
    verdict, run = judge_run(exe, [x, y], {"correct": [correct], "bumped": [bumped]})
    _, plain_run = judge_run(plain, [x, y], {})
    got = _verdicts(verdict)
    bounds = run.bounds[exe.options.device.name]
    assert bounds.unbounded == {} and got["correct"] == (True, 0, 0) and got["bumped"] == (False, 1, 0), got
    np.testing.assert_array_equal(bounds.bounds[0], plain_run.bounds[plain.options.device.name].bounds[0])


CHOLESKY = """HloModule chol
ENTRY e {{ x = f32[3,16,16] parameter(0)  d = f32[3,16,16] parameter(1)
  g = f32[3,16,16] dot(x, x), lhs_batch_dims={{0}}, rhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, rhs_contracting_dims={{2}}
  a = f32[3,16,16] add(g, d)
  ROOT l = f32[3,16,16] cholesky(a), lower={lower} }}"""


@pytest.mark.parametrize("lower", [True, False])
def test_a_cholesky_is_bounded_by_its_backward_error(lower):
    """A cholesky of an f32 Gram matrix (condition ~2,000) gets the bound of its backward error (Higham Thm 10.3)
    and its operand's, through the factorization's first-order perturbation: LAPACK's f32 factor of numpy's f32
    Gram matrix is within it (element for element, no factor) and consistent; its largest element 1% off is
    caught (unbounded before: passed)."""
    r = np.random.default_rng(0)
    x = (r.standard_normal((3, 16, 16)) / 4).astype(np.float32)
    d = np.broadcast_to(1e-3 * np.eye(16), (3, 16, 16)).astype(np.float32)
    a = np.einsum("bik,bjk->bij", x, x) + d  # (f32)
    correct = np.linalg.cholesky(a)
    exact = np.linalg.cholesky(np.einsum("bik,bjk->bij", x.astype(np.float64), x.astype(np.float64)) + d)
    if not lower:  # (the upper factor of a symmetric matrix: the lower one's transpose)
        correct, exact = (np.swapaxes(m, -1, -2).copy() for m in (correct, exact))
    bumped = correct.copy()
    bumped[np.unravel_index(np.argmax(np.abs(correct)), correct.shape)] *= np.float32(1.01)
    exe = hloexec.load(CHOLESKY.format(lower=str(lower).lower()))
    verdict, run = judge_run(exe, [x, d], {"correct": [correct], "bumped": [bumped]})
    got = _verdicts(verdict)
    bounds = run.bounds[exe.options.device.name]
    assert bounds.unbounded == {} and got["correct"] == (True, 0, 0) and got["bumped"] == (False, 1, 0), got
    assert np.all(np.abs(correct - exact) <= bounds.bounds[0])
    assert np.linalg.cond(a[0].astype(np.float64)) > 1000  # (the premise: not the identity's factor)


def _keyed_rows() -> tuple:
    """Inputs of a program that sorts or takes the argmax of bf16 keys `x * y` and picks `exp(z)` by them: rows 0-3
    have ties and near-ties at their top (six keys within bf16 rounding of 3) and all rows 24 near 0.75 (which
    bf16 rounding may order either way); rows 4-7 a top key alone (5)."""
    r = np.random.default_rng(5)
    x = r.standard_normal((8, 128)).astype(np.float32)
    x[:, :24] = 0.75
    x[:4, 24:30] = 3.0
    x[4:, 30] = 5.0
    y = (1 + 1e-3 * r.standard_normal((8, 128))).astype(np.float32)
    z = r.standard_normal((8, 128)).astype(np.float32)
    return x, y, z


def _picked_by(keys, v, how: str) -> list:
    """numpy's result of what `how` picks from `v` by `keys` (jax's argsort: stable ascending; argmax: the first
    of the largest)."""
    if how == "argsort":
        return [np.take_along_axis(v, np.argsort(keys, axis=1, kind="stable"), 1)]
    top = np.argmax(keys, axis=1)
    if how == "argmax":
        return [np.take_along_axis(v, top[:, None], 1)]
    return [v[0, top[0]], v[5, top[5]]]  # (v[argmax]: a dynamic-slice, of a tied row and of a decided one)


@pytest.mark.parametrize("how", ["argsort", "argmax", "argmax_index"])
def test_a_gather_by_indices_rounding_decides_is_bounded_by_the_values_they_may_pick(how):
    """jax's `take_along_axis(v, argsort(bf16 keys))`, `take_along_axis(v, argmax(keys)[:, None])` (gathers) and
    `v[argmax(keys)]` (a dynamic-slice), keys with ties and near-ties: the indices of keys within rounding of
    each other are marked with the values they may take, through the integer ops jax makes the gather's indices
    with (compare, add, select, reshape, and a reduce of the range checks), and the gathered element's bound
    reaches the farthest of the values they pick. XLA:CPU's result and numpy's (a stable argsort, an argmax of
    the device-rounded keys) are consistent; an element 1% off whose index is decided is caught. On main the
    gather moved `v`'s bounds only: every result was flagged (the shadow orders the ties by the exact keys)."""
    import jax
    import jax.numpy as jnp
    from hloexec.jax import lower
    from hloexec.tools.numerics import xla_cpu_arithmetic

    def program(x, y, z):
        keys, v = (x * y).astype(jnp.bfloat16), jnp.exp(z)
        if how == "argsort":
            return jnp.take_along_axis(v, jnp.argsort(keys, axis=1), axis=1)
        if how == "argmax":
            return jnp.take_along_axis(v, jnp.argmax(keys, axis=1)[:, None], axis=1)
        return v[0][jnp.argmax(keys[0])], v[5][jnp.argmax(keys[5])]

    x, y, z = _keyed_rows()
    keys, v = (x * y).astype(ml_dtypes.bfloat16).astype(np.float32), np.exp(z)
    correct = _picked_by(keys, v, how)
    exact = _picked_by(x.astype(np.float64) * y, v, how)
    assert not np.array_equal(correct[0], exact[0])  # (the premise: the exact keys pick others)
    low = lower(program, x, y, z)
    xla = [np.asarray(o) for o in jax.tree_util.tree_leaves(jax.jit(program)(x, y, z))]
    bumped = [np.array(o, copy=True) for o in correct]
    if how == "argsort":  # (an element whose key is farther from its neighbours than their bounds)
        row = np.sort(keys[0])
        gaps = np.diff(row)
        alone = np.flatnonzero(np.r_[True, gaps > 0.05] & np.r_[gaps > 0.05, True])
        bumped[0][0, alone[5]] *= np.float32(1.01)
        index, element = 0, (0, alone[5])
    else:  # (row 5's top key is alone)
        index, element = (0, (5, 0)) if how == "argmax" else (1, ())
        bumped[index][element] *= np.float32(1.01)
    exe = hloexec.load(low.text)
    verdict, run = judge_run(
        exe, [x, y, z], {"XLA:CPU": xla, "numpy": correct, "bumped": bumped}, known={"XLA:CPU": xla_cpu_arithmetic()}
    )
    got = {name: _verdicts(verdict, k) for k, name in [(0, "tied"), (index, "bumped")]}
    assert all(b.unbounded == {} for b in run.bounds.values())
    for name in ("hloexec", "XLA:CPU", "numpy"):
        assert got["tied"][name] == got["bumped"][name] == (True, 0, 0), (name, got)
    assert got["bumped"]["bumped"] == (False, 1, 0), got
    bound = run.bounds[exe.options.device.name].bounds[index]
    assert np.isfinite(bound).all() and bound[element] < 1e-3 * abs(float(correct[index][element]))


@pytest.mark.parametrize("how", ["sort", "argsort"])
def test_xla_cpus_optimized_sort_is_bounded_as_jaxs_own(how):
    """XLA:CPU's optimized module (`compile().as_text()`) of jax's `lax.sort((bf16 keys, exp(z)))` and
    `take_along_axis(exp(z), argsort(bf16 keys))`, keys with ties and near-ties: its comparators compare the keys'
    total order by hand (a bitcast to s16, an xor of the negative ones), read as the keys' TOTALORDER, so the sort
    rule and the indices rounding decides apply. XLA:CPU's result and numpy's (a stable sort of the device-rounded
    keys) are consistent, an element 1% off whose key is alone is caught. On main: every sorted element unbounded
    (the sort named), the 1% change passed."""
    import jax
    import jax.numpy as jnp
    from hloexec.tools.numerics import xla_cpu_arithmetic

    def program(x, y, z):
        keys, v = (x * y).astype(jnp.bfloat16), jnp.exp(z)
        if how == "sort":
            return jax.lax.sort((keys, v), dimension=1, num_keys=1)[1]
        return jnp.take_along_axis(v, jnp.argsort(keys, axis=1), axis=1)

    x, y, z = _keyed_rows()
    keys, v = (x * y).astype(ml_dtypes.bfloat16).astype(np.float32), np.exp(z)
    correct = _picked_by(keys, v, "argsort")
    assert not np.array_equal(correct[0], _picked_by(x.astype(np.float64) * y, v, "argsort")[0])  # (ties swap)
    text = jax.jit(program).lower(x, y, z).compile().as_text()
    assert " bitcast(" in text and " xor(" in text  # (the premise: the total order by hand)
    xla = [np.asarray(jax.jit(program)(x, y, z))]
    row = np.sort(keys[0])
    gaps = np.diff(row)
    alone = np.flatnonzero(np.r_[True, gaps > 0.05] & np.r_[gaps > 0.05, True])[5]  # (farther than 2 bounds)
    bumped = [correct[0].copy()]
    bumped[0][0, alone] *= np.float32(1.01)
    exe = hloexec.load(text)
    verdict, run = judge_run(
        exe, [x, y, z], {"XLA:CPU": xla, "numpy": correct, "bumped": bumped}, known={"XLA:CPU": xla_cpu_arithmetic()}
    )
    got = _verdicts(verdict)
    assert all(b.unbounded == {} for b in run.bounds.values())
    assert got["hloexec"] == got["XLA:CPU"] == got["numpy"] == (True, 0, 0) and got["bumped"] == (False, 1, 0), got


def _near_tied_rows(rows: int, seed: int) -> tuple:
    """Keys, payload of `rows` rows of 128: bf16 keys 8 ulps apart in [1, 256) but for 4 pairs a row, g -+ d (d 0.7 to
    0.98 of half an ulp, either order): bf16 ties whose exact values are within rounding of each other, which the
    sort of the perturbed keys rarely swaps; the payload exp(z)."""
    r = np.random.default_rng(seed)
    grid = (np.float32(1).astype(ml_dtypes.bfloat16).view(np.uint16) + np.arange(1024, dtype=np.uint16)).view(
        ml_dtypes.bfloat16
    )
    grid = grid.astype(np.float64)  # (bf16's 1,024 values in [1, 256))
    x = np.empty((rows, 128), np.float32)
    for i in range(rows):
        slots = r.permutation(128)
        x[i] = grid[slots * 8 + 4]
        for j in range(4):
            g, ulp = grid[slots[2 * j] * 8], grid[slots[2 * j] * 8 + 1] - grid[slots[2 * j] * 8]
            d = r.uniform(0.7, 0.98) * ulp / 2
            x[i, 2 * j : 2 * j + 2] = (g + d, g - d) if r.random() < 0.5 else (g - d, g + d)
    return x, r.standard_normal((rows, 128)).astype(np.float32)


def test_a_sorts_payloads_samples_swap_within_their_keys_clusters():
    """jax's `lax.sort` of bf16 keys with near-ties and an f32 payload, then a LayerNorm and a softmax of the sorted
    payload along the sorted axis: the payload's bound reaches its cluster's farthest payload, and its samples swap
    within the cluster (the first the farthest), so the calibration after it does not cut the bounds to samples that
    see no swap. XLA:CPU's result and numpy's (a stable sort of the device's keys, f32 ops) are consistent; on main
    all three were flagged (26 of the LayerNorm's elements: swapped payloads past bounds cut to unswapped samples)."""
    import jax
    import jax.numpy as jnp
    from hloexec.jax import lower
    from hloexec.tools.numerics import xla_cpu_arithmetic

    def program(x, z):
        _, p = jax.lax.sort((x.astype(jnp.bfloat16), jnp.exp(z)), dimension=1, num_keys=1)
        c = p - jnp.mean(p, axis=1, keepdims=True)
        return c * jax.lax.rsqrt(jnp.mean(c * c, axis=1, keepdims=True) + 1e-5), jax.nn.softmax(p, axis=1)

    x, z = _near_tied_rows(64, 3)
    f32 = np.float32
    p = np.take_along_axis(np.exp(z), np.argsort(x.astype(ml_dtypes.bfloat16), axis=1, kind="stable"), 1)
    c = p - (p.sum(1, keepdims=True, dtype=f32) / f32(128)).astype(f32)
    v = ((c * c).sum(1, keepdims=True, dtype=f32) / f32(128)).astype(f32)
    e = np.exp(p - p.max(1, keepdims=True))
    numpy = [c * (f32(1) / np.sqrt(v + f32(1e-5))), e / e.sum(1, keepdims=True, dtype=f32)]
    exact = np.take_along_axis(np.exp(z.astype(np.float64)), np.argsort(x, axis=1, kind="stable"), 1)
    assert np.abs(p - exact).max() > 0.1  # (the premise: the device's order swaps payloads)
    xla = [np.asarray(o) for o in jax.jit(program)(x, z)]
    exe = hloexec.load(lower(program, x, z).text)
    verdict, run = judge_run(exe, [x, z], {"XLA:CPU": xla, "numpy": numpy}, known={"XLA:CPU": xla_cpu_arithmetic()})
    for k in (0, 1):
        got = _verdicts(verdict, k)
        assert all(got[name][:2] == (True, 0) for name in ("hloexec", "XLA:CPU", "numpy")), (k, got)


ARGSORT_THEN = """HloModule argsort_then
less {{ a = bf16[] parameter(0)  b = bf16[] parameter(1)  i = s32[] parameter(2)  j = s32[] parameter(3)
        ROOT lt = pred[] compare(a, b), direction=LT }}
assign {{ p = f32[] parameter(0)  ROOT q = f32[] parameter(1) }}
ENTRY e {{ x = f32[4,64] parameter(0)  y = f32[4,64] parameter(1)  v = f32[4,64] parameter(2)
  m = f32[4,64] multiply(x, y)  k = bf16[4,64] convert(m)  i = s32[4,64] iota(), iota_dimension=1
  s = (bf16[4,64], s32[4,64]) sort(k, i), dimensions={{1}}, is_stable=true, to_apply=less
  idx = s32[4,64] get-tuple-element(s), index=1
  {rest} }}"""
_TAKE = (
    "offset_dims={}, collapsed_slice_dims={1}, start_index_map={1}, operand_batching_dims={0}, "
    "start_indices_batching_dims={0}, index_vector_dim=2, slice_sizes={1,1}"
)
# jax's take_along_axis: a negative index wrapped (compare, add, select), reshaped, gathered; then doubled
TAKE_ALONG = f"""zero = s32[] constant(0)  zeros = s32[4,64] broadcast(zero), dimensions={{}}
  neg = pred[4,64] compare(idx, zeros), direction=LT  n = s32[] constant(64)  ns = s32[4,64] broadcast(n), dimensions={{}}
  wrapped = s32[4,64] add(idx, ns)  fixed = s32[4,64] select(neg, wrapped, idx)  at = s32[4,64,1] reshape(fixed)
  e = f32[4,64] exponential(v)  g = f32[4,64] gather(e, at), {_TAKE}
  two = f32[] constant(2)  twos = f32[4,64] broadcast(two), dimensions={{}}
  ROOT h = f32[4,64] multiply(g, twos)"""


def test_a_gather_by_indices_every_one_of_which_rounding_decides_is_not_calibrated_away():
    """Every key of a row within rounding of the others (bf16 ties): every gathered element may be any of its
    row's, and its samples swap too (the farthest alternative among them). Before they did (the moved samples,
    which see no swap), the calibration of the doubling after the gather cut its bounds to them: numpy's result
    (a stable argsort of the device's keys) was 1e5x past them."""
    r = np.random.default_rng(7)
    x = np.full((4, 64), 0.75, np.float32)
    y = (1 + 1e-3 * r.standard_normal((4, 64))).astype(np.float32)
    v = r.standard_normal((4, 64)).astype(np.float32)
    keys = (x * y).astype(ml_dtypes.bfloat16).astype(np.float32)
    correct = 2 * np.take_along_axis(np.exp(v), np.argsort(keys, axis=1, kind="stable"), 1)
    exe = hloexec.load(ARGSORT_THEN.format(rest=TAKE_ALONG))
    verdict, run = judge_run(exe, [x, y, v], {"numpy": [correct]})
    assert run.bounds[exe.options.device.name].unbounded == {}
    assert _verdicts(verdict)["numpy"] == _verdicts(verdict)["hloexec"] == (True, 0, 0), _verdicts(verdict)


RADIX_ARGSORT = """HloModule cub_argsort
ENTRY e {
  x = f32[4,64] parameter(0)  y = f32[4,64] parameter(1)  v = f32[4,64] parameter(2)
  m = bf16[4,64] multiply(x, y)  k = f32[4,64] convert(m)  idx0 = s32[4,64] iota(), iota_dimension=1
  s = (f32[4,64], s32[4,64], u8[128]) custom-call(k, idx0), custom_call_target="__cub$DeviceRadixSort",
    backend_config={"descending":false}
  idx = s32[4,64] get-tuple-element(s), index=1
  %s }""" % TAKE_ALONG.replace("{{", "{").replace("}}", "}")


def test_a_gather_by_a_radix_sorts_indices_is_bounded_by_the_values_they_may_pick():
    """XLA-GPU's argsort (cub's radix sort of bf16-rounded keys with their indices) and a gather by the indices:
    marked as an HLO sort's are (its keys' clusters); numpy's stable argsort of the device's keys, gathered, is
    consistent (on main: flagged, the gather moved the payload's bounds only)."""
    x, y, _ = _keyed_rows()
    x, y = x[:4, :64], y[:4, :64]
    v = np.random.default_rng(8).standard_normal((4, 64)).astype(np.float32)
    keys = (x * y).astype(ml_dtypes.bfloat16).astype(np.float32)
    correct = 2 * np.take_along_axis(np.exp(v), np.argsort(keys, axis=1, kind="stable"), 1)
    exe = hloexec.load(RADIX_ARGSORT)
    verdict, run = judge_run(exe, [x, y, v], {"numpy": [correct]})
    assert run.bounds[exe.options.device.name].unbounded == {}
    assert _verdicts(verdict)["numpy"] == _verdicts(verdict)["hloexec"] == (True, 0, 0), _verdicts(verdict)


TOP_K_TAKE = """HloModule topk_take
cmp { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT gt = pred[] compare(a, b), direction=GT }
ENTRY e {
  x = f32[4,64] parameter(0)  y = f32[4,64] parameter(1)  v = f32[4,64] parameter(2)
  m = bf16[4,64] multiply(x, y)  k = f32[4,64] convert(m)
  t = (f32[4,8], s32[4,8]) custom-call(k), custom_call_target="TopK", to_apply=cmp
  idx = s32[4,8] get-tuple-element(t), index=1  at = s32[4,8,1] reshape(idx)
  ROOT g = f32[4,8] gather(v, at), offset_dims={}, collapsed_slice_dims={1}, start_index_map={1},
    operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=2, slice_sizes={1,1} }"""


def test_a_gather_by_a_top_ks_indices_is_bounded_by_the_values_they_may_pick():
    """XLA's TopK custom-call of bf16-rounded keys (rows 0-3 hold six keys within rounding of 3 at their top) and a
    gather by its indices: the j-th index may be any position whose key's interval reaches the j-th value's
    (positions outside the top 8 too). numpy's top 8 of the device's keys (a stable argsort, descending), gathered,
    is consistent; a gathered element 1% off whose index is decided is caught (on main: the ties flagged)."""
    x, y, _ = _keyed_rows()
    x, y = x[:4, :64], y[:4, :64]
    x[3, 40] = 9.0  # (row 3's top key alone)
    v = np.random.default_rng(9).standard_normal((4, 64)).astype(np.float32)
    keys = (x * y).astype(ml_dtypes.bfloat16).astype(np.float32)
    correct = np.take_along_axis(v, np.argsort(-keys, axis=1, kind="stable")[:, :8], 1)
    bumped = correct.copy()
    bumped[3, 0] *= np.float32(1.01)
    exe = hloexec.load(TOP_K_TAKE)
    verdict, run = judge_run(exe, [x, y, v], {"numpy": [correct], "bumped": [bumped]})
    got = _verdicts(verdict)
    assert run.bounds[exe.options.device.name].unbounded == {}
    assert got["numpy"] == got["hloexec"] == (True, 0, 0) and got["bumped"] == (False, 1, 0), got


NOT_FOLLOWED = {
    # two choices at once: the smaller of an index and the one its row holds reversed
    "select": f"""r = s32[4,64] reverse(idx), dimensions={{1}}  lt = pred[4,64] compare(idx, r), direction=LT
  least = s32[4,64] select(lt, idx, r)  at = s32[4,64,1] reshape(least)
  ROOT g = f32[4,64] gather(v, at), {_TAKE}""",
    "convert": "ROOT f = f32[4,64] convert(idx)",
    "scatter": """at = s32[4,64,1] reshape(idx)  zero = f32[] constant(0)  zeros = f32[4,64] broadcast(zero), dimensions={}
  ROOT sc = f32[4,64] scatter(zeros, at, v), update_window_dims={}, inserted_window_dims={1},
    scatter_dims_to_operand_dims={1}, input_batching_dims={0}, scatter_indices_batching_dims={0}, index_vector_dim=2,
    to_apply=assign""",
}


@pytest.mark.parametrize("variant", sorted(NOT_FOLLOWED))
def test_what_an_integer_rounding_decides_makes_unfollowed_is_unbounded_and_named(variant):
    """An argsort's indices (bf16 keys, ties) through what the marks do not follow -- a select of two indices of
    different elements (two choices at once), a convert to float, a scatter by them -- leave the float result's
    affected elements unbounded and the instruction named (on main: bounded as if the indices were exact, 0)."""
    x, y, _ = _keyed_rows()
    x, y = x[:4, :64], y[:4, :64]
    v = np.random.default_rng(6).standard_normal((4, 64)).astype(np.float32)
    exe = hloexec.load(ARGSORT_THEN.format(rest=NOT_FOLLOWED[variant]))
    _, run = judge_run(exe, [x, y, v], {})
    bounds = run.bounds[exe.options.device.name]
    name = exe.module.entry.root.name
    assert set(bounds.unbounded) == {name} and "not followed" in bounds.unbounded[name]
    infinite = np.isinf(bounds.bounds[0])
    assert infinite.any() and (variant != "convert" or not infinite.all())  # (a convert: the varying ones only)


VARIADIC_SUMS = """HloModule v
sums {{ a = {t}[] parameter(0)  b = {t}[] parameter(1)  c = {t}[] parameter(2)  d = {t}[] parameter(3)
       s = {t}[] {first}(a, c)  q = {t}[] add(d, b)  ROOT r = ({t}[], {t}[]) tuple(s, q) }}
ENTRY e {{ x = {t}[16,{n}] parameter(0)  y = {t}[16,{n}] parameter(1)  m = {t}[16,{n}] multiply(x, y)
          sq = {t}[16,{n}] multiply(m, m)  z = {t}[] constant(0)  i = {t}[] constant({init})
          ROOT r = ({t}[16], {t}[16]) reduce(m, sq, i, z), dimensions={{1}}, to_apply=sums }}"""


@pytest.mark.parametrize(
    "dtype,first,n", [("f16", "add", 8), ("f32", "add", 256), ("f16", "maximum", 8), ("f16", "multiply", 8)]
)
def test_a_variadic_reduce_of_separate_reducers_is_bounded_as_its_reduces(dtype, first, n):
    """A variadic reduce whose reducer makes each result from that result's two values alone -- (sum, sum of
    squares), (max, sum), (product, sum) -- is bounded as one reduce per result, its sums and products rounding
    every step in their type (as XLA:CPU's loop and hloexec run a variadic reducer). XLA:CPU's result (jaxlib) is
    consistent; its largest element of either result 1% off is caught, in that result only (unbounded before: not
    judged, both passed; a product reduce had no rule)."""
    from hloexec.tools.xla_cpu import run_on_xla_cpu

    text = VARIADIC_SUMS.format(t=dtype, first=first, n=n, init=int(first == "multiply"))
    numpy_type = np.float16 if dtype == "f16" else np.float32
    r = np.random.default_rng(4)
    x, y = (r.standard_normal((16, n)).astype(numpy_type) for _ in range(2))
    correct = run_on_xla_cpu(text, [x, y])
    candidates = {"xla": list(correct)}
    for k in (0, 1):
        bumped = [c.copy() for c in correct]
        big = np.argmax(np.abs(bumped[k]))
        bumped[k][big] *= numpy_type(1.01)
        candidates[f"bumped{k}"] = bumped
    exe = hloexec.load(text)
    verdict, run = judge_run(exe, [x, y], candidates)
    assert run.bounds[exe.options.device.name].unbounded == {}
    for k in (0, 1):
        got = _verdicts(verdict, k)
        assert got["xla"] == (True, 0, 0) and got["hloexec"] == (True, 0, 0), got
        assert got[f"bumped{k}"] == (False, 1, 0) and got[f"bumped{1 - k}"] == (True, 0, 0), got


def test_a_reduce_whose_reducer_calls_a_computation_is_unbounded_and_named():
    """A compensated (Kahan) sum as a variadic reduce whose reducer calls a computation for a step: the folds
    (tools/bound_reducers.py) observe elementwise steps only, so it has no rule: its results are not judged and
    the reduce is named (the same sum written out is bounded: tests/test_verdict_reducers.py)."""
    text = """HloModule k
sub { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT d = f32[] subtract(a, b) }
kahan { s = f32[] parameter(0)  c = f32[] parameter(1)  x = f32[] parameter(2)  unused = f32[] parameter(3)
        y = f32[] call(x, c), to_apply=sub  t = f32[] add(s, y)  ts = f32[] subtract(t, s)  nc = f32[] subtract(ts, y)
        ROOT r = (f32[], f32[]) tuple(t, nc) }
ENTRY e { x = f32[4,64] parameter(0)  y = f32[4,64] parameter(1)  m = f32[4,64] multiply(x, y)
          z = f32[] constant(0)
          ROOT r = (f32[4], f32[4]) reduce(m, m, z, z), dimensions={1}, to_apply=kahan }"""
    r = np.random.default_rng(5)
    x, y = (r.standard_normal((4, 64)).astype(np.float32) for _ in range(2))
    exe = hloexec.load(text)
    verdict, run = judge_run(exe, [x, y], {})
    assert run.bounds[exe.options.device.name].unbounded == {"r": "reduce"}
    assert _verdicts(verdict, 0)["hloexec"] == (True, 0, 4)


def test_a_product_whose_partial_products_underflow_is_bounded_by_their_spacing():
    """An f16 product reduce whose partial products pass below f16's subnormals (four factors near 0.01) before
    four near 60 bring it back: XLA:CPU rounds every step in f16, its partials become 0, and so does its result
    (the exact one ~0.15). Under the xla-cpu profile (its per-step rule) XLA:CPU's result and hloexec's are
    consistent: a step below the normals may err by half their spacing, times what the later factors make of it
    (drawn in the samples: the calibration keeps it)."""
    from hloexec.tools.xla_cpu import run_on_xla_cpu

    text = """HloModule p
mul { a = f16[] parameter(0)  b = f16[] parameter(1)  ROOT m = f16[] multiply(a, b) }
ENTRY e { x = f16[64,8] parameter(0)  y = f16[64,8] parameter(1)  m = f16[64,8] multiply(x, y)
          one = f16[] constant(1)
          ROOT r = f16[64] reduce(m, one), dimensions={1}, to_apply=mul }"""
    r = np.random.default_rng(1)
    x = np.concatenate([np.full((64, 4), 0.01), np.full((64, 4), 60.0)], 1) * (1 + 0.3 * r.standard_normal((64, 8)))
    x, y = x.astype(np.float16), (1 + 0.01 * r.standard_normal((64, 8))).astype(np.float16)
    [correct] = run_on_xla_cpu(text, [x, y])
    assert not correct.any()  # (the partials' underflow, as the test means it)
    exe = hloexec.load(text, device="xla-cpu")
    verdict, run = judge_run(exe, [x, y], {"xla": [correct]})
    assert run.bounds[exe.options.device.name].unbounded == {}
    assert _verdicts(verdict)["xla"] == (True, 0, 0) and _verdicts(verdict)["hloexec"] == (True, 0, 0)


CUMPROD = """HloModule cp
mul {{ a = {t}[] parameter(0)  b = {t}[] parameter(1)  ROOT m = {t}[] multiply(a, b) }}
ENTRY e {{ x = {t}[16,64] parameter(0)  y = {t}[16,64] parameter(1)  m = {t}[16,64] multiply(x, y)
          one = {t}[] constant(1)
          ROOT c = {t}[16,64] reduce-window(m, one), window={{size=1x64 pad=0_0x63_0}}, to_apply=mul }}"""
_NUMPY_TYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32}


def _cumprod(m, accumulator, out_type) -> np.ndarray:
    """numpy's product along the rows in index order (jnp.cumprod's reduce-window: each window folded from the
    init value 1), every step rounded to `accumulator`, the running products rounded to `out_type`."""
    running = np.ones(m.shape[0], accumulator)
    out = np.empty(m.shape, out_type)
    for k in range(m.shape[1]):
        running = (running.astype(np.float64) * m[:, k].astype(np.float64)).astype(accumulator)
        out[:, k] = running.astype(out_type)
    return out


@pytest.mark.parametrize("dtype", sorted(_NUMPY_TYPES))
def test_a_product_reduce_window_is_bounded_as_a_product(dtype):
    """A product reduce-window (jnp.cumprod's: each window's terms multiplied in order) is bounded as a product
    reduce: each term's bound times the others' product, a rounding a step. numpy's emulations (every step
    rounded to the type: xla-cpu's `per-step` order; 16-bit products accumulated in f32: the reference's rule)
    and XLA:CPU's result are consistent under their profiles, and an element 4x its bound off is caught (on main
    every element was unbounded: not judged, any value passed)."""
    from hloexec.tools.shadow_runs import xla_cpu_arithmetic
    from hloexec.tools.xla_cpu import run_on_xla_cpu

    text, t = CUMPROD.format(t=dtype), _NUMPY_TYPES[dtype]
    r = np.random.default_rng(7)
    x, y = ((1 + 0.05 * r.standard_normal((16, 64))).astype(t) for _ in range(2))
    m = x * y  # (ml_dtypes' and numpy's multiply: one rounding to the type)
    [xla] = run_on_xla_cpu(text, [x, y])
    per_step, wide = _cumprod(m, t, t), _cumprod(m, np.float32, t)
    exe = hloexec.load(text)
    candidates = {"xla": [xla], "per-step": [per_step], "accumulate": [wide]}
    known = {"xla": xla_cpu_arithmetic(), "per-step": "xla-cpu"}
    verdict, run = judge_run(exe, [x, y], candidates, known=known)
    assert run.bounds[verdict.device].unbounded == {}
    bound = run.bounds[verdict.device].bounds[0]
    u = float(ml_dtypes.finfo(t).eps) / 2  # (the terms' roundings added: at most ~64 half-ulps of the value)
    assert np.all(np.isfinite(bound)) and np.max(bound / np.abs(run.shadow[0])) < 96 * u, np.max(bound)
    got = _verdicts(verdict)
    assert all(got[n] == (True, 0, 0) for n in ("hloexec", *candidates)), got
    for at in ((3, 63), (11, 20)):
        far = np.asarray(run.shadow[0]).copy()
        far[at] += 4 * bound[at]
        far = far.astype(t)
        assert abs(float(far[at]) - run.shadow[0][at]) > 3 * bound[at]  # (the change survives the type's rounding)
        verdict, _ = judge_run(exe, [x, y], {"far": [far]})
        assert _verdicts(verdict)["far"][:2] == (False, 1), (at, _verdicts(verdict))


RAGGED = """HloModule r, num_partitions=4
ENTRY e {
  x = f16[8,16] parameter(0)  y = f16[8,16] parameter(1)  m = f16[8,16] multiply(x, y)
  io = s32[4] parameter(2)  ss = s32[4] parameter(3)  oo = s32[4] parameter(4)  rs = s32[4] parameter(5)
  z = f16[] constant(0)  out = f16[8,16] broadcast(z), dimensions={}
  r = f16[8,16] ragged-all-to-all(m, out, io, ss, oo, rs), channel_id=1, replica_groups={{0,1,2,3}}
  t = f16[8,16] tanh(r)
  ROOT o = (f16[8,16], f16[8,16]) tuple(r, t), sharding={{devices=[4,1]0,1,2,3}, {devices=[4,1]0,1,2,3}}
}"""


def _ragged_rows(sent, offsets, sizes, targets) -> list:
    """ragged-all-to-all by its definition: sender i's rows [offsets[i][j], + sizes[i][j]) of `sent[i]` land at
    receiver j's rows [targets[i][j], + sizes[i][j]) (the sender's offsets and sizes), the rest 0."""
    out = [np.zeros_like(s) for s in sent]
    for i, rows in enumerate(sent):
        for j in range(len(sent)):
            n = sizes[i][j]
            out[j][targets[i][j] : targets[i][j] + n] = rows[offsets[i][j] : offsets[i][j] + n]
    return out


def test_a_ragged_all_to_all_moves_its_bounds():
    """ragged-all-to-all (MoE dispatch: each participant sends row ranges of its own sizes to each other one) moves
    its operand's bounds, marks and samples as its rows: the result's bounds are each device's product's bounds
    (from a one-device run of that product) moved by the op's definition, 0 where no row lands; numpy's result
    (f16 products moved, f16 tanh) is consistent and its largest element 1% off is caught (XLA:CPU does not run
    the op; on main the ragged-all-to-all was unbounded: nothing after it judged)."""
    exe = hloexec.load(RAGGED)
    r = np.random.default_rng(3)
    sizes = [[(i + j) % 3 for j in range(4)] for i in range(4)]
    offsets = [[2 * j for j in range(4)] for _ in range(4)]
    targets = [[2 * i for _ in range(4)] for i in range(4)]
    xy = [[r.standard_normal((8, 16)).astype(np.float16) for _ in range(2)] for _ in range(4)]
    per_device = [
        [x, y, *(np.asarray(v[i], np.int32) for v in (offsets, sizes, targets, sizes))] for i, (x, y) in enumerate(xy)
    ]
    moved = np.concatenate(_ragged_rows([x * y for x, y in xy], offsets, sizes, targets))
    correct = [moved, np.tanh(moved.astype(np.float32)).astype(np.float16)]
    bumped = [correct[0], correct[1].copy()]
    bumped[1][np.unravel_index(np.argmax(np.abs(correct[1])), moved.shape)] *= np.float16(1.01)
    runner = Runner({"partitions": 4, "replicas": 1, "report": lambda message: None})
    verdict, run = judge_run(exe, per_device, {"correct": correct, "bumped": bumped}, runner)
    bounds = run.bounds[exe.options.device.name]
    assert bounds.unbounded == {}
    product = hloexec.load("HloModule p\nENTRY e { x = f16[8,16] parameter(0)  y = f16[8,16] parameter(1)\n"
                           "  ROOT m = f16[8,16] multiply(x, y) }")  # fmt: skip
    own = [judge_run(product, [x, y])[1].bounds[product.options.device.name].bounds[0] for x, y in xy]
    expected = np.concatenate(_ragged_rows(own, offsets, sizes, targets))
    assert np.count_nonzero(expected) > 100 and np.count_nonzero(expected == 0) > 100
    np.testing.assert_array_equal(bounds.bounds[0], expected)
    assert _verdicts(verdict, 0)["correct"] == (True, 0, 0) and _verdicts(verdict, 1)["correct"] == (True, 0, 0)
    assert _verdicts(verdict, 1)["bumped"] == (False, 1, 0), _verdicts(verdict, 1)


COMPLEX_PRODUCTS = """HloModule cp
mul {{ a = {t}[] parameter(0)  b = {t}[] parameter(1)  ROOT m = {t}[] multiply(a, b) }}
ENTRY e {{ x = {t}[16,64] parameter(0)  y = {t}[16,64] parameter(1)  m = {t}[16,64] multiply(x, y)
          one = {t}[] constant((1,0))
          c = {t}[16,64] reduce-window(m, one), window={{size=1x64 pad=0_0x63_0}}, to_apply=mul
          p = {t}[16] reduce(m, one), dimensions={{1}}, to_apply=mul
          ROOT o = ({t}[16,64], {t}[16]) tuple(c, p) }}"""


@pytest.mark.parametrize("dtype", ["c64", "c128"])
def test_a_complex_product_is_bounded_on_its_moduli(dtype):
    """A complex product reduce and reduce-window (jnp.prod, jnp.cumprod of complex values) are bounded on the
    moduli: each term's bound times the others' moduli, a step's rounding sqrt(5) u of the partial product (XLA's
    complex multiply). numpy's products in the type (every step rounded, index order) and XLA:CPU's are consistent,
    an element 4x its bound off is caught in either output (on main both were unbounded)."""
    from hloexec.tools.xla_cpu import run_on_xla_cpu

    text, t = COMPLEX_PRODUCTS.format(t=dtype), {"c64": np.complex64, "c128": np.complex128}[dtype]
    r = np.random.default_rng(8)
    x, y = (np.exp(0.05 * r.standard_normal((16, 64)) + 1j * r.uniform(-3, 3, (16, 64))).astype(t) for _ in range(2))
    m = x * y
    steps = np.empty_like(m)
    running = np.ones(16, t)
    for k in range(64):
        running = running * m[:, k]
        steps[:, k] = running
    xla = run_on_xla_cpu(text, [x, y])
    exe = hloexec.load(text)
    verdict, run = judge_run(exe, [x, y], {"xla": list(xla), "numpy": [steps, steps[:, -1].copy()]})
    assert run.bounds[verdict.device].unbounded == {}
    for k, at in ((0, (5, 40)), (1, (9,))):
        got = _verdicts(verdict, k)
        assert all(got[n] == (True, 0, 0) for n in ("hloexec", "xla", "numpy")), (k, got)
        bound = run.bounds[verdict.device].bounds[k]
        assert np.all(np.isfinite(bound)) and np.max(bound / np.abs(run.shadow[k])) < 1e-3, np.max(bound)
        far = [np.asarray(s).astype(t) for s in run.shadow]
        far[k][at] += t(4 * bound[at])
        verdict_far, _ = judge_run(exe, [x, y], {"far": far})
        assert _verdicts(verdict_far, k)["far"][:2] == (False, 1), (k, _verdicts(verdict_far, k))


def test_a_partial_product_past_the_range_is_marked():
    """f16 products rounded every step (xla-cpu's order): 300 * 300 passes f16's range though the exact product
    with the later 0.001 is 90: XLA:CPU's is +inf, in the reduce and in the reduce-window (jnp.cumprod) after it.
    The bounds mark +inf possible there (an order the arithmetic allows passes the range), so XLA:CPU's result is
    consistent; on main the reduce-window was unbounded and the reduce's mark missing."""
    from hloexec.tools.shadow_runs import xla_cpu_arithmetic
    from hloexec.tools.xla_cpu import run_on_xla_cpu

    text = """HloModule p
mul { a = f16[] parameter(0)  b = f16[] parameter(1)  ROOT m = f16[] multiply(a, b) }
ENTRY e { x = f16[4,8] parameter(0)  one = f16[] constant(1)
          c = f16[4,8] reduce-window(x, one), window={size=1x8 pad=0_0x7_0}, to_apply=mul
          p = f16[4] reduce(x, one), dimensions={1}, to_apply=mul
          ROOT o = (f16[4,8], f16[4]) tuple(c, p) }"""
    x = np.ones((4, 8), np.float16)
    x[0, :3] = [300, 300, 0.001]
    xla = run_on_xla_cpu(text, [x])
    assert np.isinf(xla[0][0, 2:]).all() and np.isinf(xla[1][0])  # (the case as the test means it)
    exe = hloexec.load(text, device="xla-cpu")
    verdict, run = judge_run(exe, [x], {"xla": list(xla)}, known={"xla": xla_cpu_arithmetic()})
    bounds = run.bounds[verdict.device]
    assert bounds.nonfinite[1][0] & 1 and not bounds.nonfinite[1][1:].any()  # (the reduce's: none on main)
    assert bounds.unbounded == {}
    assert (bounds.nonfinite[0][0, 1:] & 1).all() and not bounds.nonfinite[0][1:].any()
    assert _verdicts(verdict, 0)["xla"] == (True, 0, 0) and _verdicts(verdict, 1)["xla"] == (True, 0, 0)


def test_a_product_reduce_windows_terms_in_chunks_give_its_bounds(monkeypatch):
    """A product reduce-window's terms gathered a few outputs at a time (a cumprod's windows overlap: n^2 terms)
    give the bounds and marks of one gathering, bit for bit."""
    import hloexec.tools.bound_sums as bound_sums

    text = CUMPROD.format(t="f16")
    r = np.random.default_rng(2)
    x, y = ((1 + 0.3 * r.standard_normal((16, 64))).astype(np.float16) for _ in range(2))
    x[3, :3] = [300, 300, 0.001]  # (a partial product past f16's range: marked)
    exe = hloexec.load(text, device="xla-cpu")
    whole = judge_run(exe, [x, y])[1].bounds["xla-cpu"]
    monkeypatch.setattr(bound_sums, "PRODUCT_CHUNK", 64 * 5)  # (5 outputs a chunk: the last one short)
    chunked = judge_run(exe, [x, y])[1].bounds["xla-cpu"]
    np.testing.assert_array_equal(whole.bounds[0], chunked.bounds[0])
    np.testing.assert_array_equal(whole.nonfinite[0], chunked.nonfinite[0])
    assert whole.nonfinite[0][3, -1] and not whole.nonfinite[0][4:].any()


@pytest.mark.parametrize("op", ["cumsum", "cumprod", "cummax"])
def test_xla_cpus_bf16_reduce_windows_are_bounded_as_their_op_rounded_every_step(op):
    """XLA:CPU's optimized module of a bf16 jnp.cumsum / cumprod / lax.cummax computes in f32 with a reducer
    `convert(convert(op(a, b)) to bf16)` back to f32 (its float normalization: every step rounded to bf16), over a
    two-level scan (windows of 16, then the blocks). Bounded as that op rounding every step to bf16: XLA:CPU's
    result and numpy's emulation of the op (a running value rounded to bf16 each step, index order) are
    consistent, an element 4x its bound off is caught (on main the reducer had no rule: every element unbounded)."""
    import jax.numpy as jnp
    from jax import lax

    import hloexec.jax as hj
    from hloexec.tools.shadow_runs import xla_cpu_arithmetic

    fn = {"cumsum": jnp.cumsum, "cumprod": jnp.cumprod, "cummax": lax.cummax}[op]
    ufunc = {"cumsum": np.add, "cumprod": np.multiply, "cummax": np.maximum}[op]
    r = np.random.default_rng(9)
    x = 1 + 0.05 * r.standard_normal((8, 64)) if op == "cumprod" else r.standard_normal((8, 64))
    x = x.astype(ml_dtypes.bfloat16)
    lowered = hj.lower(lambda v: fn(v, axis=1), x, stage="opt")
    xla = np.asarray(lowered.compiled(x))
    running, emulated = x[:, 0].astype(np.float32), np.empty_like(x)
    emulated[:, 0] = x[:, 0]
    for k in range(1, 64):
        running = ufunc(running, x[:, k].astype(np.float32)).astype(ml_dtypes.bfloat16).astype(np.float32)
        emulated[:, k] = running.astype(ml_dtypes.bfloat16)
    exe = hloexec.load(lowered.text)
    verdict, run = judge_run(exe, [x], {"xla": [xla], "numpy": [emulated]}, known={"xla": xla_cpu_arithmetic()})
    assert run.bounds[verdict.device].unbounded == {}
    got = _verdicts(verdict)
    assert all(got[n] == (True, 0, 0) for n in ("hloexec", "xla", "numpy")), got
    bound = run.bounds[verdict.device].bounds[0]
    at = (5, 50)
    far = np.asarray(run.shadow[0]).copy()
    far[at] += 4 * bound[at] if bound[at] > 0 else 0.02 * abs(far[at])  # (a max's exact element: 2% off)
    verdict, _ = judge_run(exe, [x], {"far": [far.astype(ml_dtypes.bfloat16)]})
    assert _verdicts(verdict)["far"][:2] == (False, 1), _verdicts(verdict)


REDUCTIONS_OVER_NOTHING = """HloModule nothing
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  p = f32[0,3] parameter(0)
  q = f32[3,0] parameter(1)
  r = f32[0,2] parameter(2)
  x = f32[3] parameter(3)
  z = f32[] constant(1.5)
  s = f32[3] reduce(p, z), dimensions={0}, to_apply=add
  d = f32[3,2] dot(q, r), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  m = f32[3] multiply(s, x)
  ROOT t = (f32[3], f32[3,2]) tuple(m, d)
}
"""


def test_reductions_over_no_terms_are_their_init_and_zeros_exactly():
    """A reduce over a zero-size dimension is its init value and a dot over an empty contraction zeros, with no
    rounding of their own: bounded as moves (main failed inside the bounds: numpy's min of an empty array); the
    product after them bounded by its own rounding, so a 4-ulp change of it is caught."""
    x = np.array([0.1, 0.7, 3.0], np.float32)
    inputs = [np.zeros((0, 3), np.float32), np.zeros((3, 0), np.float32), np.zeros((0, 2), np.float32), x]
    right = [np.float32(1.5) * x, np.zeros((3, 2), np.float32)]
    exe = hloexec.load(REDUCTIONS_OVER_NOTHING)
    verdict, run = judge_run(exe, inputs, {"numpy": right})
    assert verdict.consistent("numpy"), verdict.to_dict()
    bounds = run.bounds[verdict.device].bounds
    assert bounds[1] is None or not np.any(bounds[1])  # (zeros made of nothing: exact)
    off = [right[0].copy(), right[1]]
    off[0][1] = np.float32(off[0][1] + 4 * np.spacing(off[0][1]))
    verdict, _ = judge_run(exe, inputs, {"off": off})
    assert not verdict.consistent("off")
