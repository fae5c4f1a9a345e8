"""stochastic-convert, dynamic-reshape and scan (hloexec/ops/misc.py) against XLA:CPU on small modules."""
import ml_dtypes
import numpy as np
import pytest

import hloexec

pytestmark = pytest.mark.xla


def _both(text: str, inputs: list) -> tuple[list, list]:
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    got = hloexec.load(text, use_numba=False).run(*inputs)
    got = list(got) if isinstance(got, tuple) else [got]
    return [np.asarray(g) for g in got], run_on_xla_cpu(text, inputs)


_SPECIAL = [0.0, -0.0, 0.5, -0.5, 1.25, -1.75, 2.5, 126.9, 127.0, 127.5, -128.0, -128.5, 300.0, -300.0,
            np.inf, -np.inf, np.nan, 1e-30, -1e-30, 3.999]


@pytest.mark.parametrize("src, random, dst", [("f32", "u32", "s8"), ("f32", "u32", "s32"), ("f16", "u16", "s16"),
                                              ("bf16", "u16", "s8"), ("f64", "u64", "s64"), ("f32", "u32", "s4")])
def test_stochastic_convert_matches_xla(src, random, dst):
    n = 64
    text = f"""HloModule m
ENTRY e {{
  x = {src}[{n}] parameter(0)
  r = {random}[{n}] parameter(1)
  ROOT c = {dst}[{n}] stochastic-convert(x, r)
}}"""
    rs = np.random.RandomState(0)
    src_dtype = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "f64": np.float64}[src]
    values = np.concatenate([_SPECIAL, rs.normal(scale=100.0, size=n - len(_SPECIAL))])
    x = values.astype(src_dtype)
    random_dtype = np.dtype(random.replace("u", "uint"))
    bits = rs.randint(0, 2 ** 16, size=(n, random_dtype.itemsize // 2)).astype(np.uint16)
    r = bits.view(random_dtype).reshape(n)
    (got,), (want,) = _both(text, [x, r])
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


_DYNAMIC_RESHAPE = """HloModule m
ENTRY e {
  x = f32[6] parameter(0)
  a = s32[] parameter(1)
  b = s32[] parameter(2)
  ROOT r = f32[<=2,<=3] dynamic-reshape(x, a, b)
}"""


@pytest.mark.parametrize("sizes", [(2, 3), (2, 2), (1, 3)])
def test_dynamic_reshape_matches_xla(sizes):
    x = np.arange(1, 7, dtype=np.float32)
    (got,), (want,) = _both(_DYNAMIC_RESHAPE, [x, *(np.int32(s) for s in sizes)])
    assert got.shape == want.shape == (2, 3)
    count = sizes[0] * sizes[1]
    # XLA:CPU packs the dynamic array into the front of the bound-shaped buffer; hloexec keeps it in
    # the [:size] corner with zeros past it.
    np.testing.assert_array_equal(got[:sizes[0], :sizes[1]], want.reshape(-1)[:count].reshape(sizes))
    padding = np.ones(got.shape, bool)
    padding[:sizes[0], :sizes[1]] = False
    assert not got[padding].any()


_SCAN = """HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

body {
  x = f32[3] parameter(0)
  y = s32[3] parameter(1)
  c = f32[] parameter(2)
  k = s32[3] parameter(3)
  cb = f32[3] broadcast(c), dimensions={}
  t = f32[3] multiply(x, cb)
  yk = s32[3] add(y, k)
  zero = f32[] constant(0)
  s = f32[] reduce(x, zero), dimensions={0}, to_apply=add
  nc = f32[] subtract(s, c)
  ROOT r = (f32[3], s32[3], f32[], s32[3]) tuple(t, yk, nc, yk)
}

ENTRY e {
  x = f32[3,4] parameter(0)
  y = s32[3,4] parameter(1)
  c = f32[] parameter(2)
  k = s32[3] parameter(3)
  ROOT scan = (f32[3,4], s32[3,4], f32[], s32[3]) scan(x, y, c, k), dimensions={1}, num_carries=2, to_apply=body"""


@pytest.mark.parametrize("attrs", ["", ", is_reverse=true", ", is_associative=false"])
def test_scan_matches_xla(attrs):
    rs = np.random.RandomState(1)
    inputs = [rs.normal(size=(3, 4)).astype(np.float32), rs.randint(-5, 5, size=(3, 4)).astype(np.int32),
              np.float32(0.5), rs.randint(-5, 5, size=3).astype(np.int32)]
    got, want = _both(_SCAN + attrs + "\n}", inputs)
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
