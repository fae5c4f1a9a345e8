"""Whole-array f16 / bf16 <-> f32 / f64 conversions of the op-by-op path: kernels.half.to_f32 / from_f32 (Numba)
and the size-dispatching ops.elementwise.low_to_f32 / f32_to_low (numpy below NUMBA_*_MIN_SIZE elements).

Both are bit-identical to numpy / ml_dtypes astype except for NaNs, where they follow XLA:CPU (checked against
it by test_convert_matches_xla_cpu): f16 signaling NaNs come out quiet with their payload (vcvtph2ps / vcvtps2ph; numpy keeps them
signaling), and an f64 NaN converted to f16 becomes sign | the canonical quiet NaN. f64 -> f16 / bf16 goes
through f32 (two roundings), as XLA:CPU converts.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import hloexec
from xla_compare import as_if_xla_rounded_f64_to_f16_twice
from hloexec.kernels import half
from hloexec.ops.elementwise import (NUMBA_FROM_F32_MIN_SIZE, NUMBA_LOAD_MIN_SIZE, NUMBA_TO_F32_MIN_SIZE, f32_to_low,
                                     low_to_f32)

F16, BF16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
F8E5M2, F8E4M3FN = np.dtype(ml_dtypes.float8_e5m2), np.dtype(ml_dtypes.float8_e4m3fn)
UINT = {F16: np.uint16, BF16: np.uint16, F32: np.uint32, F64: np.uint64, np.dtype(bool): np.uint8,
        np.dtype(np.int32): np.uint32, F8E5M2: np.uint8, F8E4M3FN: np.uint8}
QUIET_BIT = {F32: 1 << 22, F64: 1 << 51}
ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def bits(x):
    x = np.asarray(x)
    return x.view(UINT[x.dtype])


def quieted(x: np.ndarray) -> np.ndarray:
    """x with the quiet bit set in every NaN (what an IEEE operation does to a signaling NaN)."""
    u = bits(x).copy()
    u[np.isnan(x)] |= QUIET_BIT[x.dtype]
    return u.view(x.dtype)


def want_f32(x: np.ndarray) -> np.ndarray:
    r = x.astype(F32)
    return quieted(r) if x.dtype == F16 else r


def want_narrow(x: np.ndarray, dtype) -> np.ndarray:
    with np.errstate(all="ignore"):
        if x.dtype == F64:
            r = x.astype(F32).astype(dtype)
            if dtype == F16:
                r.view(np.uint16)[np.isnan(x)] = np.where(np.signbit(x[np.isnan(x)]), 0xFE00, 0x7E00)
            return r
        return (quieted(x) if dtype == F16 else x).astype(dtype)


def ties(grid: np.ndarray, wide) -> np.ndarray:
    """Midpoints between neighbours of the finite values `grid` in the `wide` type, and the values one ulp
    of `wide` on either side of them."""
    g = np.unique(grid.astype(F64))
    mid = ((g[:-1] + g[1:]) / 2).astype(wide)
    return np.concatenate([mid, np.nextafter(mid, wide.type(np.inf)), np.nextafter(mid, wide.type(-np.inf))])


def nan_patterns(dtype, rng, n) -> np.ndarray:
    """NaNs of both signs, quiet and signaling, random payloads and payloads only in the low bits (which a
    narrowing truncates away)."""
    width = dtype.itemsize * 8
    mant = (1 << {F32: 23, F64: 52}[dtype]) - 1
    exp = ((1 << (width - 1)) - 1) & ~mant
    payload = rng.integers(1, mant, n, dtype=np.uint64)
    low = np.arange(1, 64, dtype=np.uint64)
    p = np.concatenate([payload, low, low | np.uint64(QUIET_BIT[dtype]), np.uint64([mant, QUIET_BIT[dtype]])])
    u = np.concatenate([p | np.uint64(exp), p | np.uint64(exp | (1 << (width - 1)))])
    return u.astype(UINT[dtype]).view(dtype)


@pytest.fixture(scope="module")
def wide_values():
    """{f32, f64: values covering random bit patterns, rounding ties, overflow, denormal results, NaNs}."""
    rng = np.random.default_rng(7)
    with np.errstate(invalid="ignore"):
        narrow = np.concatenate([ALL16.view(F16).astype(F64), ALL16.view(BF16).astype(F64)])
    narrow = narrow[np.isfinite(narrow)]
    out = {}
    for wide in (F32, F64):
        edges = np.array([65504, 65519.996, 65520, 65536, 3.3895e38, 3.4e38, 6.1e-5, 5.96e-8, 2.98e-8, 1e-45,
                          0, -0.0, np.inf, -np.inf, 1 + 2 ** -11 + 2 ** -40, 1 + 2 ** -8 + 2 ** -30], F64)
        random_bits = rng.integers(0, np.iinfo(UINT[wide]).max, 1 << 18, dtype=UINT[wide], endpoint=True)
        with np.errstate(over="ignore"):
            values = [random_bits.view(wide), ties(narrow, wide), narrow.astype(wide), nan_patterns(wide, rng, 2000),
                      edges.astype(wide), -edges.astype(wide)]
        if wide == F64:       # halfway between neighbouring f32 values: rounding to f32 first is a tie too
            f32 = np.abs(random_bits[:4096].astype(np.uint32).view(F32))
            f32 = f32[np.isfinite(f32)]
            values.append((f32.astype(F64) + np.nextafter(f32, np.float32(np.inf)).astype(F64)) / 2)
        out[wide] = np.concatenate(values)
    return out


def in_pieces(fn, x, size):
    """fn applied to consecutive pieces of x of `size` elements."""
    return np.concatenate([np.atleast_1d(fn(x[i:i + size])) for i in range(0, x.size, size)])


def sizes(threshold: int):
    return [37, threshold - 1, threshold, 1 << 16]


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_to_f32_all_bit_patterns(dtype):
    x = ALL16.view(dtype)
    want = bits(want_f32(x))
    assert np.array_equal(bits(half.to_f32(x)), want)
    for size in [1] + sizes(NUMBA_TO_F32_MIN_SIZE[dtype]):
        got = in_pieces(low_to_f32, x, size)
        assert got.dtype == F32 and np.array_equal(bits(got), want), size
    # numpy's astype differs only on f16 signaling NaNs
    f16_snan = ((ALL16 & 0x7E00) == 0x7C00) & ((ALL16 & 0x1FF) != 0) & (dtype == F16)
    assert np.array_equal(bits(low_to_f32(x)) != bits(x.astype(F32)), f16_snan)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("wide", [F32, F64], ids=["f32", "f64"])
def test_from_wide_values(wide_values, wide, dtype):
    x = wide_values[wide]
    want = bits(want_narrow(x, dtype))
    assert np.array_equal(bits(half.from_f32(x, dtype)), want)
    quiet_x = quieted(x)        # what f32_to_low may assume without signaling_nans
    for size in sizes(NUMBA_FROM_F32_MIN_SIZE[dtype]):
        with np.errstate(all="ignore"):
            got = in_pieces(lambda piece: f32_to_low(piece, dtype, signaling_nans=True), x, size)
            got_from_quiet = in_pieces(lambda piece: f32_to_low(piece, dtype), quiet_x, size)
        assert got.dtype == dtype and np.array_equal(bits(got), want), size
        assert np.array_equal(bits(got_from_quiet), want), size
    finite = np.isfinite(x)
    with np.errstate(all="ignore"):
        assert np.array_equal(bits(f32_to_low(x[finite], dtype)), bits(x[finite].astype(F32).astype(dtype)))


def test_f64_to_f16_rounds_twice_through_f32():
    # 1 + 2^-11 + 2^-40: once to f16 it is 1 + 2^-10; to f32 first it is the tie 1 + 2^-11, then 1.0 (even)
    x = np.array([1 + 2 ** -11 + 2 ** -40] * 5000)
    assert float(f32_to_low(x[:1], F16)[0]) == 1.0
    assert np.all(half.from_f32(x, F16) == 1.0)
    assert float(x[0].astype(F16)) == 1 + 2 ** -10


def layouts(x: np.ndarray):
    """Views of x (a 3-d array) in other memory orders, a 0-d and an empty one."""
    return {"transposed": x.transpose(2, 0, 1), "fortran": np.asfortranarray(x), "strided": x[:, ::2, ::-1],
            "broadcast": np.broadcast_to(x[:1], x.shape), "zero-d": x[0, 0, 0, ...], "empty": x[:, :0]}


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_layouts_and_0d(dtype):
    rng = np.random.default_rng(3)
    for n in (4, 64):                     # below and above every threshold
        narrow = rng.integers(0, 1 << 16, (n, n, 17), dtype=np.uint16).view(dtype)
        wide = rng.standard_normal((n, n, 17)).astype(F32) * 1e3
        for name, x in layouts(narrow).items():
            for got in (half.to_f32(x), low_to_f32(x)):
                want = want_f32(x)
                assert got.shape == x.shape and got.dtype == F32 and np.array_equal(bits(got), bits(want)), name
        for name, x in layouts(wide).items():
            for got in (half.from_f32(x, dtype), f32_to_low(x, dtype, signaling_nans=True)):
                want = want_narrow(x, dtype)
                assert got.shape == x.shape and got.dtype == dtype and np.array_equal(bits(got), bits(want)), name
        # a dense array in another axis order converts in place of memory, keeping its order (as astype)
        t = narrow.transpose(1, 2, 0)
        assert half.to_f32(t).strides == t.astype(F32).strides
    assert f32_to_low(np.float32(1.5), dtype) == 1.5 and f32_to_low(np.float32(1.5), dtype).dtype == dtype


CONVERT = "HloModule m\nENTRY e {{ p = {src}[{n}] parameter(0)\n  ROOT c = {dst}[{n}] convert(p) }}"
PAIRS = [("f16", "f32"), ("bf16", "f32"), ("f16", "f64"), ("f16", "bf16"), ("bf16", "f16"),
         ("f32", "f16"), ("f32", "bf16"), ("f64", "f16"), ("f64", "bf16"),
         ("f16", "f8e5m2"), ("bf16", "f8e5m2"), ("f16", "f8e4m3fn"), ("bf16", "f8e4m3fn")]
NUMPY = {"f16": F16, "bf16": BF16, "f32": F32, "f64": F64}


def xla_flushed_f32(x: np.ndarray) -> np.ndarray:
    """Where XLA:CPU's denormal flushing changes a convert from f64 (the f32 step is flushed): not compared."""
    with np.errstate(all="ignore"):
        r = np.abs(x.astype(F32))
    return (r > 0) & (r < np.finfo(F32).tiny)


@pytest.mark.xla
@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{s}-{d}" for s, d in PAIRS])
def test_convert_matches_xla_cpu(wide_values, src, dst):
    """The convert op, on arrays above and below the Numba thresholds, against XLA:CPU bit for bit: this is what
    fixes the NaN rules above."""
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    x = ALL16.view(NUMPY[src]) if src in ("f16", "bf16") else wide_values[NUMPY[src]]
    want = run_on_xla_cpu(CONVERT.format(src=src, dst=dst, n=x.size), [x])[0]
    if (src, dst) == ("f64", "f16"):
        want = as_if_xla_rounded_f64_to_f16_twice(x, want)
    small = 512
    big_exe = hloexec.load(CONVERT.format(src=src, dst=dst, n=x.size), use_numba=False)
    small_exe = hloexec.load(CONVERT.format(src=src, dst=dst, n=small), use_numba=False)
    tail = x.size % small
    got_small = in_pieces(lambda piece: small_exe.run(piece), x[:x.size - tail], small)
    compared = ~xla_flushed_f32(x) if src == "f64" else np.ones(x.size, bool)
    for got in (big_exe.run(x), got_small):
        n = got.size
        assert got.dtype == want.dtype
        assert np.array_equal(bits(got)[compared[:n]], bits(want[:n])[compared[:n]])


def test_numba_is_loaded_only_for_large_arrays():
    """Without fused kernels, the Numba converters (and Numba itself, ~0.5 s) are loaded only for f16 arrays large
    enough to repay it."""
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import hloexec
        for t, n in zip(sys.argv[1::2], map(int, sys.argv[2::2])):
            text = f"HloModule m\\nENTRY e {{ p = {t}[{n}] parameter(0)\\n  ROOT a = {t}[{n}] add(p, p) }}"
            exe = hloexec.load(text, use_numba=False)
            exe.run(*exe.random_inputs(0))
            print("numba" in sys.modules)
    """)
    counts = ["f16", str(NUMBA_TO_F32_MIN_SIZE[F16]), "bf16", str(NUMBA_LOAD_MIN_SIZE[F16]),
              "f16", str(NUMBA_LOAD_MIN_SIZE[F16])]
    out = subprocess.run([sys.executable, "-P", "-c", script, *counts], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "False", "True"]


def test_a_conversion_while_another_thread_loads_the_converters_does_not_use_them_half_made():
    """A thread converting while another one loads the Numba converters (a paired run's program and shadow threads)
    never takes the module half made (its entry is in sys.modules before its names are): numpy's casts meanwhile."""
    script = textwrap.dedent("""
        import sys, threading
        import numpy as np
        from hloexec.ops.elementwise import low_to_f32
        big, small = np.ones(int(sys.argv[1]), np.float16), np.ones(int(sys.argv[2]), np.float16)
        loading = threading.Thread(target=low_to_f32, args=(big,))
        loading.start()
        converted = 0
        while loading.is_alive():          # through the whole load: the module's entry is there early
            converted += int(low_to_f32(small).sum() == small.size)
        loading.join()
        print("hloexec.kernels.half" in sys.modules, converted > 0)
    """)
    out = subprocess.run([sys.executable, "-P", "-c", script, str(NUMBA_LOAD_MIN_SIZE[F16]),
                          str(NUMBA_TO_F32_MIN_SIZE[F16])], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["True", "True"], out.stderr


UNARY = ["floor", "ceil", "round-nearest-afz", "round-nearest-even", "sqrt", "rsqrt", "cbrt", "exponential",
         "exponential-minus-one", "log", "log-plus-one", "logistic", "sine", "cosine", "tan", "tanh", "erf", "abs",
         "negate", "sign"]
BINARY = ["add", "subtract", "multiply", "divide", "remainder", "power", "maximum", "minimum", "atan2"]
ROWS, COLS = 64, 8


def op_programs(t: str, rows: int) -> dict:
    """{name: HLO text} of the ops computing in f32 for the low float type t, on [rows, COLS] operands p, q."""
    shape = f"{t}[{rows},{COLS}]"
    bodies = {op: f"ROOT r = {shape} {op}(p)" for op in UNARY}
    bodies.update({op: f"ROOT r = {shape} {op}(p, q)" for op in BINARY})
    bodies["compare"] = f"ROOT r = pred[{rows},{COLS}] compare(p, q), direction=LT"
    bodies["clamp"] = f"s = {t}[] constant(0.5)\n  ROOT r = {shape} clamp(q, p, s)"
    for dst in ["f32", "f64", "s32", "bf16" if t == "f16" else "f16"]:
        bodies[f"convert-{dst}"] = f"ROOT r = {dst}[{rows},{COLS}] convert(p)"
    bodies["reduce"] = f"z = {t}[] constant(0)\n  ROOT r = {t}[{rows}] reduce(p, z), dimensions={{1}}, to_apply=add"
    bodies["reduce-window"] = (f"z = {t}[] constant(0)\n  ROOT r = {t}[{rows},{COLS - 1}] reduce-window(p, z), "
                               "window={size=1x2}, to_apply=add")
    bodies["dot"] = (f"w = {t}[{COLS},{COLS}] slice(q), slice={{[0:{COLS}], [0:{COLS}]}}\n  ROOT r = {shape} "
                     "dot(p, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}")
    add = f"add {{ a = {t}[] parameter(0)\n  b = {t}[] parameter(1)\n  ROOT s = {t}[] add(a, b) }}"
    params = f"p = {shape} parameter(0)\n  q = {shape} parameter(1)"
    return {name: f"HloModule m\n{add}\nENTRY e {{\n  {params}\n  {body}\n}}" for name, body in bodies.items()}


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_ops_give_the_same_bits_on_small_and_large_arrays(dtype):
    """Every op that computes f16 / bf16 in f32, run on arrays below and above the Numba thresholds, gives the
    same bits, NaN payloads included (inputs full of signaling and quiet NaNs)."""
    rng = np.random.default_rng(11)
    t = "f16" if dtype == F16 else "bf16"
    exp_bits = 0x7C00 if dtype == F16 else 0x7F80
    quiet_bit = 0x0200 if dtype == F16 else 0x0040

    def operand():
        u = rng.integers(0, 1 << 16, (ROWS, COLS), dtype=np.uint16)      # every kind of value, NaNs included
        nan = rng.random((ROWS, COLS)) < 0.3
        payload = rng.integers(1, quiet_bit, (ROWS, COLS), dtype=np.uint16)
        u[nan] = (u[nan] & 0x8000) | exp_bits | payload[nan] | (rng.random(nan.sum()) < 0.5) * quiet_bit
        return u.view(dtype)
    small = [operand(), operand()]
    # kernels.half is loaded (imported above), so arrays from the NUMBA_*_MIN_SIZE thresholds go through it
    copies = -(-max(NUMBA_TO_F32_MIN_SIZE[dtype], NUMBA_FROM_F32_MIN_SIZE[dtype]) // (ROWS * COLS))
    large = [np.tile(x, (copies, 1)) for x in small]
    differ = []
    large_programs = op_programs(t, ROWS * copies)
    for name, text in op_programs(t, ROWS).items():
        with np.errstate(all="ignore"):
            got_small = hloexec.load(text, use_numba=False).run(*small)
            got_large = hloexec.load(large_programs[name], use_numba=False).run(*large)[:ROWS]
        if name == "dot":       # BLAS kernels for other shapes may give a NaN of the other sign
            got_small, got_large = (np.where(np.isnan(r), dtype.type(np.nan), r) for r in (got_small, got_large))
        if not np.array_equal(bits(got_large), bits(got_small)):
            differ.append(name)
    assert differ == []


def test_f16_to_f32_simd_all_bit_patterns():
    """The fpext form the generator uses in loops LLVM vectorizes gives f16_to_f32's bits on every pattern
    (NaNs quieted with their payload), vectorized and element by element."""
    from numba import njit
    from hloexec.kernels.scalar import f16_to_f32, f16_to_f32_simd

    @njit
    def convert_all(x, out, simd):
        for i in range(x.size):
            out[i] = f16_to_f32_simd(x[i]) if simd else f16_to_f32(x[i])

    want, got, one = np.empty(ALL16.size, F32), np.empty(ALL16.size, F32), np.empty(1, F32)
    convert_all(ALL16, want, False)
    convert_all(ALL16, got, True)
    assert np.array_equal(bits(got), bits(want))
    assert np.array_equal(bits(want), bits(want_f32(ALL16.view(F16))))
    for k in (0x7C01, 0xFE01, 0x0001, 0x8400):        # a signaling NaN, a negative quiet one, subnormal, normal
        convert_all(ALL16[k:k + 1], one, True)
        assert bits(one)[0] == bits(want)[k]
