"""What the evaluator does with awkward inputs: bad arity/shape/dtype, odd array layouts, NaN/Inf,
out-of-range indices, integer overflow and division by zero (against XLA:CPU), and modules too big
for the machine's memory."""
from __future__ import annotations

import numpy as np
import pytest

import hloexec
from hloexec.errors import ExecutionError

TWO_INPUTS = """HloModule two
ENTRY main {
  x = f32[2,3] parameter(0)
  n = s32[] parameter(1)
  c = f32[] convert(n)
  b = f32[2,3] broadcast(c), dimensions={}
  ROOT r = f32[2,3] add(x, b)
}
"""


@pytest.fixture(scope="module")
def two_inputs():
    return hloexec.load(TWO_INPUTS)


X = np.arange(6, dtype=np.float32).reshape(2, 3)


def test_wrong_number_of_inputs_names_the_parameters(two_inputs):
    with pytest.raises(ExecutionError, match=r"takes 2 inputs, got 1(.|\n)*%x(.|\n)*%n"):
        two_inputs.run(X)
    with pytest.raises(ExecutionError, match="takes 2 inputs, got 3"):
        two_inputs.run(X, np.int32(1), X)


@pytest.mark.parametrize("bad,message", [
    (lambda: (X.T, np.int32(1)), r"input 0 \(%x\) has shape \[3, 2\], expected \[2, 3\]"),
    (lambda: (X[None], np.int32(1)), r"input 0 \(%x\) has shape \[1, 2, 3\]"),
    (lambda: (X.astype(np.float64), np.int32(1)), r"input 0 \(%x\) has dtype float64, expected float32"),
    (lambda: (X, np.array(1, np.int64)), r"input 1 \(%n\) has dtype int64, expected int32"),
    (lambda: (X, np.ones(1, np.int32)), r"input 1 \(%n\) has shape \[1\], expected \[\]"),
])
def test_wrong_shape_or_dtype_names_the_parameter(two_inputs, bad, message):
    with pytest.raises(ExecutionError, match=message):
        two_inputs.run(*bad())


@pytest.mark.parametrize("layout", ["transposed", "strided", "fortran", "read-only", "unaligned"])
def test_non_contiguous_and_read_only_inputs(two_inputs, layout):
    if layout == "transposed":
        x = np.ascontiguousarray(X.T).T
    elif layout == "strided":
        x = np.repeat(X, 2, axis=1)[:, ::2]
    elif layout == "fortran":
        x = np.asfortranarray(X)
    elif layout == "read-only":
        x = X.copy()
        x.flags.writeable = False
    else:   # float32 data at an odd byte offset
        raw = np.zeros(X.nbytes + 1, np.uint8)
        x = raw[1:].view(np.float32).reshape(2, 3)
        x[...] = X
    assert not (x.flags.c_contiguous and x.flags.writeable and x.flags.aligned) or layout == "fortran"
    np.testing.assert_array_equal(two_inputs.run(x, np.int32(2)), X + 2)
    if layout == "read-only":
        assert not x.flags.writeable


# -- against XLA:CPU --------------------------------------------------------------------------------------

def assert_same_as_xla(text: str, *inputs):
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    ours = hloexec.load(text).run(*inputs)
    ours = list(ours) if isinstance(ours, tuple) else [ours]
    theirs = run_on_xla_cpu(text, list(inputs))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)   # NaN matches NaN, -0.0 matches 0.0 ...
        if a.dtype.kind in "iub":
            assert a.tobytes() == b.tobytes()


NAN_INF = """HloModule naninf
max_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
ENTRY main {
  x = f32[6] parameter(0)
  y = f32[6] parameter(1)
  add = f32[6] add(x, y)
  mul = f32[6] multiply(x, y)
  div = f32[6] divide(x, y)
  max = f32[6] maximum(x, y)
  min = f32[6] minimum(x, y)
  cmp = pred[6] compare(x, y), direction=LT
  sqrt = f32[6] sqrt(x)
  neg_inf = f32[] constant(-inf)
  rmax = f32[] reduce(x, neg_inf), dimensions={0}, to_apply=max_f32
  cvt = s32[6] convert(x)
  ROOT t = (f32[6], f32[6], f32[6], f32[6], f32[6], pred[6], f32[6], f32[], s32[6]) tuple(add, mul, div, max, min, cmp, sqrt, rmax, cvt)
}
"""


@pytest.mark.xla
def test_nan_and_inf_propagate_as_in_xla():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], np.float32)
    y = np.array([1.0, -np.inf, np.inf, 0.0, np.nan, np.inf], np.float32)
    assert_same_as_xla(NAN_INF, x, y)


OUT_OF_RANGE = """HloModule oob
ENTRY main {
  x = f32[5,4] parameter(0)
  i = s32[] parameter(1)
  j = s32[] parameter(2)
  ds = f32[2,3] dynamic-slice(x, i, j), dynamic_slice_sizes={2,3}
  u = f32[2,3] constant({{-1,-2,-3},{-4,-5,-6}})
  dus = f32[5,4] dynamic-update-slice(x, u, i, j)
  idx = s32[3,2] parameter(3)
  g = f32[3,2,2] gather(x, idx), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={2,2}
  ROOT t = (f32[2,3], f32[5,4], f32[3,2,2]) tuple(ds, dus, g)
}
"""


@pytest.mark.xla
@pytest.mark.parametrize("i,j", [(-7, 2), (4, 9), (2**31 - 1, -2**31), (1, 1)])
def test_out_of_range_indices_clamp_as_in_xla(i, j):
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    idx = np.array([[i, j], [-1, 100], [3, 2]], np.int32)
    assert_same_as_xla(OUT_OF_RANGE, x, np.int32(i), np.int32(j), idx)


INTEGER_OPS = """HloModule ints
ENTRY main {
  a = {t}[12] parameter(0)
  b = {t}[12] parameter(1)
  add = {t}[12] add(a, b)
  sub = {t}[12] subtract(a, b)
  mul = {t}[12] multiply(a, b)
  div = {t}[12] divide(a, b)
  rem = {t}[12] remainder(a, b)
  neg = {t}[12] negate(a)
  ROOT t = ({t}[12], {t}[12], {t}[12], {t}[12], {t}[12], {t}[12]) tuple(add, sub, mul, div, rem, neg)
}
"""


@pytest.mark.xla
@pytest.mark.parametrize("dtype", ["s8", "s16", "s32", "s64", "u8", "u32", "u64"])
def test_integer_overflow_and_division_by_zero_as_in_xla(dtype):
    np_type = np.dtype({"s": "int", "u": "uint"}[dtype[0]] + dtype[1:])
    info = np.iinfo(np_type)
    a = np.array([info.max, info.min, info.max, info.min, 7, 0, info.min, 5, info.max, 1, info.min, 3], np_type)
    minus_one = np_type.type(-1) if info.min < 0 else np_type.type(info.max)
    b = np.array([1, -1 if info.min < 0 else 1, info.max, 0, 0, 0, minus_one, 2, 0, info.min or 1, info.min or 2,
                  minus_one], np_type)
    assert_same_as_xla(INTEGER_OPS.replace("{t}", dtype), a, b)


# -- memory --------------------------------------------------------------------------------------------------

HUGE = """HloModule huge
ENTRY main {
  s = f32[] parameter(0)
  b = f32[1000000,1000000] broadcast(s), dimensions={}
  ROOT r = f32[] reduce(b, s), dimensions={0,1}, to_apply=add
}
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
"""


def test_module_bigger_than_memory_is_refused_before_running():
    executable = hloexec.load(HUGE)
    assert executable.peak_bytes() >= 4 * 10**12
    with pytest.raises(ExecutionError, match=r"needs 3725\.\d\d GiB at its peak.*MemAvailable"):
        executable.run(np.float32(1))


def test_max_memory_option(two_inputs):
    limited = hloexec.load(TWO_INPUTS, max_memory=two_inputs.peak_bytes() - 1)
    with pytest.raises(ExecutionError, match="max_memory allows") as refused:
        limited.run(X, np.int32(1))
    assert (refused.value.peak, refused.value.limit, refused.value.given) == (limited.peak_bytes(),
                                                                               limited.peak_bytes() - 1, True)
    assert limited.check_memory(max_memory=limited.peak_bytes()) == limited.peak_bytes()
    enough = hloexec.load(TWO_INPUTS, max_memory=two_inputs.peak_bytes())
    np.testing.assert_array_equal(enough.run(X, np.int32(1)), X + 1)


def test_overflow_and_nan_are_values_not_warnings():
    """f16 overflow in a cast and inf - inf in a reduce are what the program computes: no RuntimeWarning."""
    import warnings
    text = """HloModule m
add { a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b) }
ENTRY e { x = f32[4] parameter(0)
  h = f16[4] convert(x)
  z = f32[] constant(0)
  s = f32[] reduce(x, z), dimensions={0}, to_apply=add
  ROOT t = (f16[4], f32[]) tuple(h, s) }"""
    x = np.array([1e6, -np.inf, np.inf, 1.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h, s = hloexec.load(text, use_numba=False).run(x)
    assert np.isinf(h[0]) and np.isnan(s)


def test_arrays_plain_np_savez_wrote_as_void_are_taken_by_type(tmp_path, capsys):
    """np.savez stores ml_dtypes arrays (bf16, fp8) as raw void (|V2, |V1): --inputs, --expected and
    Executable.run take them as the parameter's or output's type."""
    import ml_dtypes
    from hloexec.tools.cli import main
    text = ("HloModule m\nENTRY e {\n x = bf16[3] parameter(0)\n y = f8e4m3fn[3] parameter(1)\n"
            " c = bf16[3] convert(y)\n ROOT s = bf16[3] add(x, c)\n}\n")
    (tmp_path / "m.hlo").write_text(text)
    x = np.array([1, 2, 3], ml_dtypes.bfloat16)
    y = np.array([0.5, 1, 2], ml_dtypes.float8_e4m3fn)
    np.savez(tmp_path / "in.npz", arg0=x, arg1=y)
    np.savez(tmp_path / "out.npz", out0=np.array([1.5, 3, 5], ml_dtypes.bfloat16))
    np.savez(tmp_path / "wrong.npz", out0=np.array([1.5, 3, 6], ml_dtypes.bfloat16))
    loaded = np.load(tmp_path / "in.npz")
    assert loaded["arg0"].dtype == np.dtype("V2") and loaded["arg1"].dtype == np.dtype("V1")
    np.testing.assert_array_equal(hloexec.load(text).run(loaded["arg0"], loaded["arg1"]).astype(np.float32),
                                  [1.5, 3, 5])
    base = ["compare", str(tmp_path / "m.hlo"), "--inputs", str(tmp_path / "in.npz")]
    assert main(base + ["--expected", str(tmp_path / "out.npz")]) == 0
    assert main(base + ["--expected", str(tmp_path / "wrong.npz")]) == 1
    assert main(["run", str(tmp_path / "m.hlo"), "--inputs", str(tmp_path / "in.npz")]) == 0
    with pytest.raises(ExecutionError, match="has dtype \\|V4, expected bfloat16"):
        hloexec.load(text).run(np.zeros(3, "V4"), y)       # a void of another size is still refused
