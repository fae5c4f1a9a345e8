"""Dots under the device profiles (--device) against numpy emulations written from the sources of each rule
(XLA's dot_algorithm_rewriter.cc and algorithm_util.cc, jax's lax.Precision docstring, Triton's BF16DotTC /
F32DotTC passes), not from hloexec's code: bf16 rounding through ml_dtypes, truncation and tf32 rounding through
frexp / ldexp of the significand (no bit masks), sums in f64.

Where the order of the f32 sums is pinned (one contracting element: every partial product is exact) hloexec must
match bit for bit; elsewhere within the f32 accumulation's own error bound, and far closer to the emulation than
the plain f32 dot is."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import hloexec
from hloexec.errors import UnsupportedError
from hloexec.options import device_profile

F32 = np.float32


# -- emulations from the sources ----------------------------------------------------------------------------
def significand(x, bits: int, mode: str):
    """x (finite) with `bits` significand bits (the implicit one counted): "nearest" ties to even, "truncate"
    towards zero; through frexp, not bit masks."""
    m, e = np.frexp(np.asarray(x, np.float64))
    scaled = np.ldexp(m, bits)
    kept = np.rint(scaled) if mode == "nearest" else np.trunc(scaled)
    return np.ldexp(kept, e - bits).astype(F32)


def bf16(x):
    return np.asarray(x, F32).astype(ml_dtypes.bfloat16).astype(F32)


def tf32(x):
    return significand(x, 11, "nearest")


def split_bf16(x, parts: int):
    """dot_algorithm_rewriter.cc Split2xToBF16 / Split3xToBF16: high parts truncated to bf16, the rest rounded."""
    out, rest = [], np.asarray(x, F32)
    for _ in range(parts - 1):
        high = significand(rest, 8, "truncate")
        out.append(high)
        rest = (rest - high).astype(F32)
    return out + [bf16(rest)]


def split_tf32(x):
    """Triton's F32DotTC: high = tf32(x), low = tf32(x - high)."""
    high = tf32(x)
    return [high, tf32((np.asarray(x, F32) - high).astype(F32))]


# (lhs part, rhs part) summed in this order, NaN -> 0, then high x high added
ORDERS = {"dot_bf16_bf16_f32_x3": [(1, 0), (0, 1)],
          "dot_bf16_bf16_f32_x6": [(1, 1), (0, 2), (2, 0), (0, 1), (1, 0)],
          "dot_bf16_bf16_f32_x9": [(2, 2), (1, 2), (2, 1), (1, 1), (2, 0), (0, 2), (1, 0), (0, 1)],
          "dot_tf32_tf32_f32_x3": [(1, 0), (0, 1)]}


def parts_of(alg, x):
    if alg == "dot_tf32_tf32_f32_x3":
        return split_tf32(x)
    return split_bf16(x, 2 if alg.endswith("x3") else 3)


def exact_dot(a, b):
    """A dot summed in f64 (the products of rounded operands are exact), rounded to f32 once."""
    return (np.asarray(a, np.float64) @ np.asarray(b, np.float64)).astype(F32)


def emulate(alg, a, b):
    """The dot of f32 a [M, K], b [K, N] under `alg`: every partial dot exact, the recipe's own f32 sums."""
    if alg in ORDERS:
        pa, pb = parts_of(alg, a), parts_of(alg, b)
        small = None
        for i, j in ORDERS[alg]:
            term = exact_dot(pa[i], pb[j])
            small = term if small is None else (small + term).astype(F32)
        small = np.where(np.isnan(small), F32(0), small)
        return (small + exact_dot(pa[0], pb[0])).astype(F32)
    one_pass = {"dot_bf16_bf16_f32": bf16, "dot_tf32_tf32_f32": tf32, "dot_f32_f32_f32": lambda v: v,
                "dot_f16_f16_f32": lambda v: np.asarray(v, F32).astype(np.float16).astype(F32)}
    r = one_pass[alg]
    return exact_dot(r(a), r(b))


def accumulation_bound(alg, a, b):
    """What f32 accumulation may add over the K products of each partial dot: K * 2^-24 * sum |a_k b_k| per
    pass, the passes' own sums counted too."""
    passes = 1 + len(ORDERS.get(alg, ()))
    k = a.shape[-1]
    return passes * (k + passes) * 2.0 ** -24 * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))


def dot_hlo(m, k, n, extra="", ty="f32"):
    return (f"HloModule d\nENTRY e {{\n  a = {ty}[{m},{k}] parameter(0)\n  b = {ty}[{k},{n}] parameter(1)\n"
            f"  ROOT d = {ty}[{m},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}{extra}\n}}\n")


def operands(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(F32), rng.standard_normal((k, n)).astype(F32)


# -- which algorithm each profile computes f32 dots with -------------------------------------------------------
# (device, operand_precision) -> the algorithm the profile's sources give, "" the plain f32 dot
PRECISION_RULES = [("tpu", "default", "dot_bf16_bf16_f32"), ("tpu", "high", "dot_bf16_bf16_f32_x3"),
                   ("tpu", "highest", "dot_bf16_bf16_f32_x6"), ("a100", "default", "dot_tf32_tf32_f32"),
                   ("a100", "high", "dot_tf32_tf32_f32"), ("a100", "highest", ""), ("h100", "default", "dot_tf32_tf32_f32"),
                   ("reference", "default", ""), ("reference", "high", ""), ("xla-cpu", "default", "")]


@pytest.mark.parametrize("device,precision,alg", PRECISION_RULES)
def test_operand_precision_selects_the_devices_algorithm(device, precision, alg):
    a, b = operands(16, 256, 8)
    plain = hloexec.load(dot_hlo(16, 256, 8)).run(a, b)
    got = hloexec.load(dot_hlo(16, 256, 8, f", operand_precision={{{precision},{precision}}}"), device=device).run(a, b)
    if not alg:
        np.testing.assert_array_equal(got, plain)          # the same BLAS call: the same bits
        return
    want = emulate(alg, a, b)
    off = np.abs(got.astype(np.float64) - want)
    assert np.all(off <= accumulation_bound(alg, a, b)), f"{device} {precision}: {off.max():.3g} from {alg}"
    if alg != "dot_bf16_bf16_f32_x6":                      # X6 is f32-equivalent: not apart from the f32 dot
        assert off.max() * 20 < np.abs(plain.astype(np.float64) - want).max()


ALGORITHMS = ["dot_bf16_bf16_f32", "dot_bf16_bf16_f32_x3", "dot_bf16_bf16_f32_x6", "dot_bf16_bf16_f32_x9",
              "dot_tf32_tf32_f32", "dot_tf32_tf32_f32_x3", "dot_f16_f16_f32", "dot_f32_f32_f32"]


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_algorithms_bit_exact_where_the_order_is_pinned(alg):
    """One contracting element: every partial product is exact, so only the recipe's own sums round."""
    rng = np.random.default_rng(1)
    spread = 6 if "f16" in alg else 20           # f16 operands: inside f16's range
    a = (rng.standard_normal((64, 1)) * np.exp2(rng.integers(-spread, spread, (64, 1)))).astype(F32)
    b = (rng.standard_normal((1, 48)) * np.exp2(rng.integers(-spread, spread, (1, 48)))).astype(F32)
    got = hloexec.load(dot_hlo(64, 1, 48, f", algorithm={alg}")).run(a, b)
    np.testing.assert_array_equal(got, emulate(alg, a, b))


@pytest.mark.parametrize("alg", ["dot_bf16_bf16_f32_x3", "dot_bf16_bf16_f32_x6", "dot_tf32_tf32_f32_x3"])
def test_multi_pass_infinities_stay_infinite(alg):
    """b/115844437 in dot_algorithm_rewriter.cc: inf x a zero low part is NaN; the recipe drops it."""
    a = np.array([[1.0], [np.inf], [3.0]], F32)
    b = np.array([[1.0, np.inf, -2.5]], F32)
    got = hloexec.load(dot_hlo(3, 1, 3, f", algorithm={alg}")).run(a, b)
    np.testing.assert_array_equal(got, a * b)


@pytest.mark.parametrize("alg", ["dot_bf16_bf16_f32_x3", "dot_bf16_bf16_f32_x9", "dot_tf32_tf32_f32_x3",
                                 "dot_tf32_tf32_f32", "dot_f16_f16_f32"])
def test_algorithms_within_the_accumulation_error(alg):
    a, b = operands(24, 300, 10, seed=2)
    got = hloexec.load(dot_hlo(24, 300, 10, f", algorithm={alg}")).run(a, b)
    want = emulate(alg, a, b)
    assert np.all(np.abs(got.astype(np.float64) - want) <= accumulation_bound(alg, a, b))


def test_f16_accumulation_rounds_every_step_in_index_order():
    a, b = operands(6, 200, 5, seed=3)
    got = hloexec.load(dot_hlo(6, 200, 5, ", algorithm=dot_f16_f16_f16")).run(a, b)
    a16, b16 = a.astype(np.float16).astype(np.float64), b.astype(np.float16).astype(np.float64)
    acc = np.zeros((6, 5), np.float16)
    for k in range(200):        # each exact product added to the f16 running sum, rounded once
        acc = (acc.astype(np.float64) + np.outer(a16[:, k], b16[k])).astype(np.float16)
    np.testing.assert_array_equal(got, acc.astype(F32))
    assert not np.array_equal(got, a16.astype(F32) @ b16.astype(F32))


def test_an_algorithm_the_device_does_not_run_names_both():
    a, b = operands(4, 8, 3)
    with pytest.raises(UnsupportedError, match=r"dot_tf32_tf32_f32.*'tpu' does not run it"):
        hloexec.load(dot_hlo(4, 8, 3, ", algorithm=dot_tf32_tf32_f32"), device="tpu").run(a, b)
    # XLA:CPU ignores algorithm=: the plain dot
    plain = hloexec.load(dot_hlo(4, 8, 3)).run(a, b)
    np.testing.assert_array_equal(
        hloexec.load(dot_hlo(4, 8, 3, ", algorithm=dot_bf16_bf16_f32"), device="xla-cpu").run(a, b), plain)


def test_tpu_matrix_vector_products_stay_f32():
    a, b = operands(16, 128, 1)
    plain = hloexec.load(dot_hlo(16, 128, 1)).run(a, b)
    np.testing.assert_array_equal(hloexec.load(dot_hlo(16, 128, 1), device="tpu").run(a, b), plain)


def test_a_profile_file_changes_a_rule(tmp_path):
    """tf32_rounding = "truncate" in a copy of a100: operands truncated (towards zero) instead of rounded."""
    f = tmp_path / "a100-truncating.toml"
    f.write_text(device_profile("a100").to_toml().replace('tf32_rounding = "nearest"',
                                                                          'tf32_rounding = "truncate"'))
    a, b = operands(8, 1, 8, seed=4)
    got = hloexec.load(dot_hlo(8, 1, 8), device=str(f)).run(a, b)
    np.testing.assert_array_equal(got, exact_dot(significand(a, 11, "truncate"), significand(b, 11, "truncate")))
    assert not np.array_equal(got, exact_dot(tf32(a), tf32(b)))


def test_convolution_under_tpu_default_is_one_bf16_pass():
    rng = np.random.default_rng(5)
    x, k = rng.standard_normal((1, 1, 64)).astype(F32), rng.standard_normal((1, 1, 9)).astype(F32)
    text = ("HloModule c\nENTRY e {\n  x = f32[1,1,64] parameter(0)\n  k = f32[1,1,9] parameter(1)\n"
            "  ROOT c = f32[1,1,56] convolution(x, k), window={size=9}, dim_labels=bf0_oi0->bf0\n}\n")
    got = hloexec.load(text, device="tpu").run(x, k)[0, 0]
    want = np.correlate(bf16(x[0, 0]).astype(np.float64), bf16(k[0, 0]).astype(np.float64), "valid")
    bound = 10 * 2.0 ** -24 * np.correlate(np.abs(x[0, 0]).astype(np.float64), np.abs(k[0, 0]), "valid")
    assert np.all(np.abs(got - want) <= bound)
    plain = hloexec.load(text).run(x, k)[0, 0]
    assert np.abs(plain - want).max() > 20 * np.abs(got - want).max()


LOOP = """HloModule l
cond { p = (s32[], f32[8,8]) parameter(0)  i = s32[] get-tuple-element(p), index=0  n = s32[] constant(4)
  ROOT c = pred[] compare(i, n), direction=LT }
body { p = (s32[], f32[8,8]) parameter(0)  i = s32[] get-tuple-element(p), index=0  x = f32[8,8] get-tuple-element(p), index=1
  one = s32[] constant(1)  j = s32[] add(i, one)
  d = f32[8,8] dot(x, x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (s32[], f32[8,8]) tuple(j, d) }
ENTRY e { x = f32[8,8] parameter(0)  z = s32[] constant(0)  t = (s32[], f32[8,8]) tuple(z, x)
  w = (s32[], f32[8,8]) while(t), condition=cond, body=body  ROOT r = f32[8,8] get-tuple-element(w), index=1 }
"""


def test_compiled_loops_compute_the_devices_dot():
    x = (np.random.default_rng(6).standard_normal((8, 8)) * 0.4).astype(F32)
    want = x
    for _ in range(4):
        want = emulate("dot_bf16_bf16_f32", want, want)
    exe = hloexec.load(LOOP, device="tpu", compile="eager", compile_after=1)
    runs = [exe.run(x) for _ in range(3)]                  # op by op first, compiled from the second call
    for r in runs:
        np.testing.assert_array_equal(r, runs[0])
    assert np.abs(runs[0] - want).max() <= 1e-5 * np.abs(want).max()
    assert np.abs(hloexec.load(LOOP).run(x) - want).max() > 1e-4 * np.abs(want).max()


# -- cuBLAS custom-calls ---------------------------------------------------------------------------------------
def gemm_hlo(target, a_type, b_type, out, extra_operands="", precision="DEFAULT", algorithm="ALG_UNSET"):
    cfg = {"gemm_backend_config": {"alpha_real": 1, "alpha_imag": 0, "beta": 0, "epilogue": "DEFAULT",
                                   "dot_dimension_numbers": {"lhs_contracting_dimensions": ["1"],
                                                             "rhs_contracting_dimensions": ["1"],
                                                             "lhs_batch_dimensions": [], "rhs_batch_dimensions": []},
                                   "precision_config": {"operand_precision": [precision, precision],
                                                        "algorithm": algorithm}}}
    params = "".join(f"  s{i} = f32[] parameter({2 + i})\n" for i in range(extra_operands.count(",")))
    return (f"HloModule g\nENTRY e {{\n  a = {a_type} parameter(0)\n  b = {b_type} parameter(1)\n{params}"
            f"  ROOT c = ({out}, s8[1024]) custom-call(a, b{extra_operands}), custom_call_target=\"{target}\", "
            f"backend_config={json.dumps(cfg)}\n}}\n")


@pytest.mark.parametrize("precision,algorithm,alg", [("DEFAULT", "ALG_UNSET", "dot_tf32_tf32_f32"),
                                                     ("HIGHEST", "ALG_UNSET", "dot_f32_f32_f32"),
                                                     ("DEFAULT", "ALG_DOT_BF16_BF16_F32_X3", "dot_bf16_bf16_f32_x3")])
def test_cublas_gemm_precision_config_under_a100(precision, algorithm, alg):
    a, bt = operands(16, 256, 8, seed=7)
    b = np.ascontiguousarray(bt.T)                          # [N, K]: the rhs contracts its dim 1
    text = gemm_hlo("__cublas$lt$matmul", "f32[16,256]", "f32[8,256]", "f32[16,8]", precision=precision,
                    algorithm=algorithm)
    got, _ = hloexec.load(text, device="a100").run(a, b)
    want = emulate(alg, a, bt)
    assert np.all(np.abs(got.astype(np.float64) - want) <= accumulation_bound(alg, a, bt))
    if algorithm == "ALG_UNSET":                            # reference: operand_precision changes nothing
        plain, _ = hloexec.load(text).run(a, b)
        np.testing.assert_array_equal(plain, hloexec.load(dot_hlo(16, 256, 8)).run(a, bt))
        assert alg == "dot_f32_f32_f32" or np.abs(plain - want).max() > 20 * np.abs(got - want).max()


def test_fp8_gemm_fast_accumulation_on_h100():
    """Fast accumulation (h100 profile): sums of 32 products, the running sum truncated to 14 significand bits
    after each (DeepSeek-V3 report 3.3.2); the a100 / reference profiles promote: the exact f32 sum."""
    rng = np.random.default_rng(8)
    # exact in e4m3; every block's sum exact in f32 (multiples of 2^-9), the totals (~72) need ~15 bits
    a = rng.integers(8, 17, (8, 256)).astype(ml_dtypes.float8_e4m3fn)
    b = (rng.integers(8, 17, (8, 256)) / 512).astype(ml_dtypes.float8_e4m3fn)
    text = gemm_hlo("__cublas$lt$matmul$f8", "f8e4m3fn[8,256]", "f8e4m3fn[8,256]", "f32[8,8]", ", s0, s1")
    ones = [np.float32(1), np.float32(1)]
    a64, b64 = a.astype(np.float64), b.astype(np.float64).T
    acc = np.zeros((8, 8))
    for k in range(0, 256, 32):
        acc = significand(acc + a64[:, k:k + 32] @ b64[k:k + 32], 14, "truncate").astype(np.float64)
    got, _ = hloexec.load(text, device="h100").run(a, b, *ones)
    np.testing.assert_array_equal(got, acc.astype(F32))
    promoted, _ = hloexec.load(text, device="a100").run(a, b, *ones)
    np.testing.assert_array_equal(promoted, (a64 @ b64).astype(F32))
    assert not np.array_equal(got, promoted)


# -- programs made by jax ----------------------------------------------------------------------------------------
JAX_CASES = [("DEFAULT precision", None), ("HIGHEST", "HIGHEST"), ("BF16_BF16_F32", "BF16_BF16_F32"),
             ("BF16_BF16_F32_X3", "BF16_BF16_F32_X3"), ("BF16_BF16_F32_X6", "BF16_BF16_F32_X6"),
             ("F32_F32_F32", "F32_F32_F32")]


@pytest.mark.parametrize("device", ["reference", "xla-cpu", "tpu", "a100", "h100"])
@pytest.mark.parametrize("name,precision", JAX_CASES)
def test_jax_programs_run_under_each_profile(device, name, precision):
    jax = pytest.importorskip("jax")
    from jax import lax
    import hloexec.jax as hj
    a, b = operands(8, 192, 6, seed=9)
    p = None if precision is None else (getattr(lax.Precision, precision, None)
                                        or getattr(lax.DotAlgorithmPreset, precision))
    got = hj.run(lambda x, y: lax.dot(x, y, precision=p), a, b, device=device)
    explicit = precision is not None and precision != "HIGHEST"
    rules = {"reference": {}, "xla-cpu": {},
             "tpu": {None: "dot_bf16_bf16_f32", "HIGHEST": "dot_bf16_bf16_f32_x6"},
             "a100": {None: "dot_tf32_tf32_f32"}, "h100": {None: "dot_tf32_tf32_f32"}}
    alg = ("dot_" + precision.lower() if explicit and device != "xla-cpu" else rules[device].get(precision)) \
        or "dot_f32_f32_f32"
    want = emulate(alg, a, b)
    assert np.all(np.abs(np.asarray(got, np.float64) - want) <= accumulation_bound(alg, a, b)), (device, alg)
    assert np.asarray(jax.jit(lambda x, y: x @ y)(a, b)).shape == got.shape


def test_jax_f32_mlp_under_tpu_is_its_bf16_dots():
    """The issue's MLP: gelu(x @ w1) @ w2 at DEFAULT precision, each dot one bf16 pass on a TPU."""
    jax = pytest.importorskip("jax")
    import hloexec.jax as hj
    rng = np.random.default_rng(10)
    x, w1, w2 = (rng.standard_normal(s).astype(F32) for s in ((32, 64), (64, 128), (128, 16)))
    got = hj.run(lambda x, w1, w2: jax.nn.gelu(x @ w1) @ w2, x, w1, w2, device="tpu")
    h = np.asarray(jax.nn.gelu(emulate("dot_bf16_bf16_f32", x, w1)))
    want = emulate("dot_bf16_bf16_f32", h, w2)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 1e-4 * scale
    assert np.abs(hj.run(lambda x, w1, w2: jax.nn.gelu(x @ w1) @ w2, x, w1, w2) - want).max() > 1e-3 * scale


# -- the command line ---------------------------------------------------------------------------------------------
def test_devices_command_lists_the_profiles_with_sources(capsys, tmp_path):
    from hloexec.tools.cli import main
    assert main(["devices", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    names = [p["name"] for p in listing["profiles"]]
    assert {"reference", "xla-cpu", "tpu", "a100", "h100"} <= set(names)
    tpu = next(p for p in listing["profiles"] if p["name"] == "tpu")
    assert "lax.Precision" in tpu["rules"]["precision"]["source"]
    assert main(["devices", "--show", "h100"]) == 0
    f = tmp_path / "mine.toml"
    f.write_text(capsys.readouterr().out)
    assert [r[:2] for r in device_profile(str(f)).rules()] == [r[:2] for r in device_profile("h100").rules()]
    hlo = tmp_path / "d.hlo"
    hlo.write_text(dot_hlo(4, 64, 3))
    out = tmp_path / "o.npz"
    assert main(["run", str(hlo), "--device", str(f), "--out", str(out)]) == 0
    assert main(["run", str(hlo), "--device", "no-such-device"]) == 2
    assert "not a built-in profile" in capsys.readouterr().err


def test_block_scaled_dot_call_is_the_dequantized_dot():
    """block_scaling_rewriter.cc: inputs and scales in the result type, scales repeated over blocks of the last
    dim, a dot contracting the last dims; MXFP8 values times power-of-two scales are exact in every profile."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((4, 64)).astype(ml_dtypes.float8_e4m3fn)
    b = rng.standard_normal((3, 64)).astype(ml_dtypes.float8_e4m3fn)
    sa = np.exp2(rng.integers(-3, 4, (4, 2))).astype(ml_dtypes.float8_e8m0fnu)
    sb = np.exp2(rng.integers(-3, 4, (3, 2))).astype(ml_dtypes.float8_e8m0fnu)
    text = ("HloModule b\nENTRY e {\n  a = f8e4m3fn[4,64] parameter(0)\n  b = f8e4m3fn[3,64] parameter(1)\n"
            "  sa = f8e8m0fnu[4,2] parameter(2)\n  sb = f8e8m0fnu[3,2] parameter(3)\n"
            "  ROOT d = f32[4,3] custom-call(a, b, sa, sb), custom_call_target=\"__op$block_scaled_dot\"\n}\n")
    x = a.astype(np.float64) * np.repeat(sa.astype(np.float64), 32, axis=1)
    y = b.astype(np.float64) * np.repeat(sb.astype(np.float64), 32, axis=1)
    want = x @ y.T
    for device in ("reference", "tpu", "a100"):
        got = hloexec.load(text, device=device).run(a, b, sa, sb)
        assert np.all(np.abs(got - want) <= 64 * 2.0 ** -24 * (np.abs(x) @ np.abs(y).T)), device


TRITON_GEMM = """HloModule t
gemm {{ a = f32[8,{k}] parameter(0)  b = f32[{k},6] parameter(1)
  ROOT d = f32[8,6] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, operand_precision={{highest,highest}} }}
ENTRY e {{ a = f32[8,{k}] parameter(0)  b = f32[{k},6] parameter(1)
  ROOT f = f32[8,6] fusion(a, b), kind=kCustom, calls=gemm, backend_config={{"fusion_backend_config":{{"kind":"__triton_gemm","triton_gemm_config":{{"block_m":"16","block_n":"16","block_k":"32","split_k":"{split}","num_stages":"1","num_warps":"4","num_ctas":"1"}}}}}} }}
"""


def test_split_k_sums_the_slices_apart_on_gpu_profiles():
    """triton_gemm_config split_k = 4 on an unsplit dot: four slice dots, added in f32 in slice order."""
    a, b = operands(8, 4, 6, seed=12)
    got = hloexec.load(TRITON_GEMM.format(k=4, split=4), device="a100").run(a, b)
    terms = [np.outer(a[:, k], b[k]) for k in range(4)]         # one product per slice: exact
    want = ((terms[0] + terms[1]).astype(F32) + terms[2]).astype(F32) + terms[3]
    np.testing.assert_array_equal(got, want.astype(F32))
    a, b = operands(8, 1000, 6, seed=13)
    text = TRITON_GEMM.format(k=1000, split=3)
    got = hloexec.load(text, device="a100").run(a, b)
    slices = [exact_dot(a[:, k:k + 334], b[k:k + 334]) for k in range(0, 1000, 334)]
    want = ((slices[0] + slices[1]).astype(F32) + slices[2]).astype(F32)
    assert np.all(np.abs(got.astype(np.float64) - want) <= accumulation_bound("dot_f32_f32_f32", a, b))
    plain = hloexec.load(text).run(a, b)                      # reference: the text's one dot
    np.testing.assert_array_equal(plain, hloexec.load(dot_hlo(8, 1000, 6)).run(a, b))


def test_ragged_dot_groups_under_tpu_default():
    """ragged-dot (non-contracting ragged dim): each group's rows times its rhs slice, one bf16 pass on a TPU."""
    rng = np.random.default_rng(14)
    a, w = rng.standard_normal((10, 64)).astype(F32), rng.standard_normal((3, 64, 5)).astype(F32)
    sizes = np.array([4, 0, 6], np.int32)
    text = ("HloModule r\nENTRY e {\n  a = f32[10,64] parameter(0)\n  w = f32[3,64,5] parameter(1)\n"
            "  g = s32[3] parameter(2)\n  ROOT d = f32[10,5] ragged-dot(a, w, g), lhs_contracting_dims={1}, "
            "rhs_contracting_dims={1}, lhs_ragged_dims={0}, rhs_group_dims={0}\n}\n")
    got = hloexec.load(text, device="tpu").run(a, w, sizes)
    want = np.concatenate([emulate("dot_bf16_bf16_f32", a[:4], w[0]), emulate("dot_bf16_bf16_f32", a[4:], w[2])])
    assert np.all(np.abs(got - want) <= accumulation_bound("dot_bf16_bf16_f32", a, w[0]) + 1e-6)
    assert np.abs(hloexec.load(text).run(a, w, sizes) - want).max() > 20 * np.abs(got - want).max()


def test_jax_check_and_the_plugins_reference_take_a_device():
    pytest.importorskip("jax")
    import hloexec.jax as hj
    from hloexec.pytest_plugin import HloReference
    a, b = operands(8, 256, 4, seed=15)
    fn = lambda x, y: x @ y                                     # noqa: E731
    hj.check(fn, a, b, device="xla-cpu")
    with pytest.raises(AssertionError, match="differ"):         # a TPU's bf16 pass is not XLA:CPU's f32 dot
        hj.check(fn, a, b, device="tpu")
    HloReference(device="tpu").run_module(dot_hlo(8, 256, 4), a, b, expected=[emulate("dot_bf16_bf16_f32", a, b)],
                                          rtol=1e-5, atol=1e-5)
    with pytest.raises(AssertionError):
        HloReference().run_module(dot_hlo(8, 256, 4), a, b, expected=[emulate("dot_bf16_bf16_f32", a, b)],
                                  rtol=1e-5, atol=1e-5)


def test_jax_f16_preset_accumulates_in_f16_where_the_device_runs_it():
    jax = pytest.importorskip("jax")
    from jax import lax
    import hloexec.jax as hj
    a, b = operands(4, 96, 3, seed=16)
    fn = lambda x, y: lax.dot(x, y, precision=lax.DotAlgorithmPreset.F16_F16_F16)   # noqa: E731
    got = hj.run(fn, a, b, device="a100")
    a16, b16 = a.astype(np.float16).astype(np.float64), b.astype(np.float16).astype(np.float64)
    acc = np.zeros((4, 3), np.float16)
    for k in range(96):
        acc = (acc.astype(np.float64) + np.outer(a16[:, k], b16[k])).astype(np.float16)
    np.testing.assert_array_equal(np.asarray(got, np.float16), acc)
    with pytest.raises(UnsupportedError, match=r"dot_f16_f16_f16.*'tpu' does not run it"):
        hj.run(fn, a, b, device="tpu")
    assert jax.numpy.asarray(hj.run(fn, a, b, device="xla-cpu")).dtype == got.dtype


def test_diff_and_numerics_take_the_device(tmp_path, capsys):
    """Under --device tpu a DEFAULT dot (one bf16 pass) and a HIGHEST one (six) part ways; under the reference
    profile both are the f32 dot. numerics' local error of the dot is the bf16 pass's."""
    from hloexec.tools.cli import main
    a, b = tmp_path / "a.hlo", tmp_path / "b.hlo"
    a.write_text(dot_hlo(16, 256, 8))
    b.write_text(dot_hlo(16, 256, 8, ", operand_precision={highest,highest}"))
    assert main(["diff", str(a), str(b)]) == 0
    assert main(["diff", str(a), str(b), "--device", "tpu"]) == 1
    capsys.readouterr()
    errors = {}
    for device in ("reference", "tpu"):
        assert main(["numerics", str(a), "--device", device, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        errors[device] = report["top"][0]["local_error"]
    assert errors["tpu"] > 1e-4 > 1e-6 > errors["reference"]


@pytest.mark.slow            # XLA:CPU in a child process per check: ~17 s
def test_minimize_checks_under_the_device(tmp_path, capsys):
    """`--check xla` holds when hloexec computes a TPU's bf16 pass (it disagrees with XLA:CPU's f32 dot) and not
    under the reference profile."""
    from hloexec.tools.cli import main
    f = tmp_path / "m.hlo"
    f.write_text(dot_hlo(16, 256, 8))
    out = tmp_path / "small.hlo"
    assert main(["minimize", str(f), "--check", "xla", "-o", str(out)]) == 2
    assert "does not hold" in capsys.readouterr().err
    assert main(["minimize", str(f), "--check", "xla", "-o", str(out), "--device", "tpu"]) == 0
    assert "dot(" in out.read_text()


def test_fp8_dot_op_at_default_precision_fast_accumulates_on_h100():
    """A plain fp8 dot at DEFAULT precision becomes a cuBLASLt fp8 GEMM on an H100: fast accumulation there too;
    an explicit non-fast fp8 algorithm keeps f32 promotion."""
    rng = np.random.default_rng(17)
    a = rng.integers(8, 17, (8, 256)).astype(ml_dtypes.float8_e4m3fn)
    b = (rng.integers(8, 17, (256, 8)) / 512).astype(ml_dtypes.float8_e4m3fn)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    acc = np.zeros((8, 8))
    for k in range(0, 256, 32):
        acc = significand(acc + a64[:, k:k + 32] @ b64[k:k + 32], 14, "truncate").astype(np.float64)
    text = ("HloModule f\nENTRY e {\n  a = f8e4m3fn[8,256] parameter(0)\n  b = f8e4m3fn[256,8] parameter(1)\n"
            "  ROOT d = f32[8,8] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}%s\n}\n")
    np.testing.assert_array_equal(hloexec.load(text % "", device="h100").run(a, b), acc.astype(F32))
    promoted = (a64 @ b64).astype(F32)
    np.testing.assert_array_equal(hloexec.load(text % ", algorithm=dot_any_f8_any_f8_f32", device="h100").run(a, b),
                                  promoted)
    np.testing.assert_array_equal(hloexec.load(text % "", device="a100").run(a, b), promoted)
