"""hloexec.kernels.direct: generated kernels compiled straight to LLVM IR give Numba's bits (each fusion here is
compiled both ways and the outputs compared bit for bit on inputs with NaN, infinities, signed zeros and
subnormals); object files are keyed so that two different kernels never share one; arguments that do not
match the signature raise TypeError; what the translator does not handle goes to Numba."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hloexec
from hloexec.kernels import cache, direct, direct_kernels, fusion
from test_kernels_fusion import adam, adam_args, bits_equal

pytestmark = pytest.mark.skipif(direct.object_layout() is None, reason="this Python's object layout is not probed")


@pytest.fixture(name="fresh_dir")
def _fresh_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOEXEC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("HLOEXEC_DIRECT_KERNELS", raising=False)
    cache.clear_cache(disk=False)
    yield tmp_path
    cache.clear_cache(disk=False)       # this test's keys point into tmp_path


def _special(shape, dtype, seed):
    """Random values with NaN, +-inf, +-0 and subnormals among them (at random places; more zeros)."""
    r = np.random.default_rng(seed)
    x = (r.standard_normal(shape) * 4).astype(dtype)
    flat = x.reshape(-1)
    tiny = np.finfo(dtype).tiny
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, tiny / 4, -tiny / 8, 1.0, 0.0, -0.0], dtype)
    at = r.choice(flat.size, size=min(flat.size, 4 * len(specials)), replace=False)
    flat[at] = np.resize(specials, len(at))
    return x


FUSIONS = {
    # elementwise f32: divide, sqrt, negate, compare/select, and/or, a bool output
    "elementwise": """
f { a = f32[300,40] parameter(0)
  b = f32[300,40] parameter(1)
  d = f32[300,40] divide(a, b)
  s = f32[300,40] sqrt(b)
  n = f32[300,40] negate(d)
  g = pred[300,40] compare(a, b), direction=GT
  e = pred[300,40] compare(a, a), direction=NE
  o = pred[300,40] or(g, e)
  m = f32[300,40] select(o, n, s)
  ROOT t = (f32[300,40], pred[300,40]) tuple(m, o) }""",
    # a transposing fusion (tiled loops), split into thread blocks
    "transpose": """
f { a = f32[64,96,70] parameter(0)
  t = f32[70,64,96] transpose(a), dimensions={2,0,1}
  c = f32[] constant(0.1)
  b = f32[70,64,96] broadcast(c), dimensions={}
  ROOT m = f32[70,64,96] multiply(t, b) }""",
    # index rewrites: slice, reverse, pad (a guarded load), concatenate, reshape (// and %), iota
    "movement": """
f { a = f32[40,30] parameter(0)
  s = f32[20,30] slice(a), slice={[1:40:2], [0:30]}
  r = f32[20,30] reverse(s), dimensions={1}
  z = f32[] constant(-1)
  p = f32[24,33] pad(r, z), padding=2_2x1_2
  c = f32[48,33] concatenate(p, p), dimensions={0}
  h = f32[1584] reshape(c)
  i = s32[1584] iota(), iota_dimension=0
  v = f32[1584] convert(i)
  ROOT m = f32[1584] add(h, v) }""",
    # f16 in, f32 out (vectorized f16 loads), a scalar parameter
    "f16_in": """
f { a = f16[256,512] parameter(0)
  k = f32[] parameter(1)
  c = f32[256,512] convert(a)
  b = f32[256,512] broadcast(k), dimensions={}
  ROOT m = f32[256,512] multiply(c, b) }""",
    # row reductions by maximum / minimum (kernels/scalar.py's fmax_nan / fmin_nan, inlined), NaN included
    "row_max_min": """
max { x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT m = f32[] maximum(x, y) }
min { x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT m = f32[] minimum(x, y) }
f { a = f32[256,300] parameter(0)
  b = f32[256,300] parameter(1)
  z = f32[] constant(-inf)
  r = f32[256] reduce(a, z), dimensions={1}, to_apply=max
  c = f32[256,300] minimum(a, b)
  w = f32[] constant(inf)
  s = f32[256] reduce(c, w), dimensions={1}, to_apply=min
  ROOT t = (f32[256], f32[256]) tuple(r, s) }""",
    # transcendentals (kernels/scalar.py's exp_wide, tanh_wide, log_wide, ... inlined from their source)
    "transcendental": """
f { a = f32[64,300] parameter(0)
  e = f32[64,300] exponential(a)
  t = f32[64,300] tanh(a)
  l = f32[64,300] log(a)
  p = f32[64,300] log-plus-one(a)
  m = f32[64,300] exponential-minus-one(a)
  g = f32[64,300] logistic(a)
  s1 = f32[64,300] add(e, t)
  s2 = f32[64,300] add(l, p)
  s3 = f32[64,300] add(m, g)
  ROOT r = (f32[64,300], f32[64,300], f32[64,300]) tuple(s1, s2, s3) }""",
    # a column reduction whose accumulator row is too long for the stack (from the heap)
    "wide_column_sum": """
add { x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y) }
f { a = f32[8,40000] parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[40000] reduce(a, z), dimensions={0}, to_apply=add }""",
    # a column reduction (a bias gradient) and f64
    "column_sum": """
add { x = f64[] parameter(0)
  y = f64[] parameter(1)
  ROOT s = f64[] add(x, y) }
f { a = f64[512,64] parameter(0)
  z = f64[] constant(0)
  ROOT r = f64[64] reduce(a, z), dimensions={0}, to_apply=add }""",
    # s32 arithmetic (Numba computes it in int64, converted back: wraps) and an index from it (a gather's)
    "int32": """
f { a = s32[300,40] parameter(0)
  b = s32[300,40] parameter(1)
  s = s32[300,40] add(a, b)
  d = s32[300,40] subtract(a, b)
  m = s32[300,40] multiply(s, d)
  z = s32[] constant(0)
  zb = s32[300,40] broadcast(z), dimensions={}
  lt = pred[300,40] compare(m, zb), direction=LT
  ROOT r = s32[300,40] select(lt, s, m) }""",
    # a gather of rows by s32 indices, negative ones from the end (an embedding lookup): clamped (min, max)
    "int32_gather": """
f { t = f32[512,256] parameter(0)
  i = s32[64,128] parameter(1)
  z = s32[] constant(0)
  zb = s32[64,128] broadcast(z), dimensions={}
  lt = pred[64,128] compare(i, zb), direction=LT
  n = s32[] constant(512)
  nb = s32[64,128] broadcast(n), dimensions={}
  w = s32[64,128] add(i, nb)
  s = s32[64,128] select(lt, w, i)
  r = s32[64,128,1] reshape(s)
  ROOT g = f32[64,128,256] gather(t, r), offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2, slice_sizes={1,256} }""",
}


def _fusion(text: str):
    module = hloexec.parse(f"HloModule m\n{text}\nENTRY e {{ ROOT x = f32[] constant(0) }}")[0]
    (comp,) = [c for c in module.computations if c.name == "f"]
    return comp


def _inputs(comp, seed):
    out = []
    for k, p in enumerate(comp.parameters):
        dt = p.shape.dtype
        if np.issubdtype(dt, np.integer):  # the whole range (sums and products wrap), every other one small (indices)
            info, r = np.iinfo(dt), np.random.default_rng(seed + k)
            x = r.integers(info.min, info.max, p.shape.dims, dt, endpoint=True)
            x.reshape(-1)[::2] = r.integers(-600, 600, x.size // 2 + x.size % 2, dt)
            out.append(x)
            continue
        out.append(_special(p.shape.dims, dt, seed + k) if p.shape.dims else np.asarray(dt.type(1.5)))
    return out


@pytest.mark.parametrize("name", sorted(FUSIONS))
def test_direct_kernels_give_numbas_bits(name, fresh_dir, monkeypatch):
    comp = _fusion(FUSIONS[name])
    inputs = _inputs(comp, seed=3)
    compiled = fusion.compile_fusion(comp)
    assert isinstance(compiled.fn, type(len)), "expected the direct compiler to translate this fusion"
    got = compiled(*inputs)
    monkeypatch.setenv("HLOEXEC_DIRECT_KERNELS", "0")
    through_numba = fusion.compile_fusion(comp)
    assert hasattr(through_numba.fn, "py_func")
    want = through_numba(*inputs)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    assert all(_same_bits_but_nans(g, w) for g, w in zip(got, want))


def _same_bits_but_nans(got, want) -> bool:
    """Bit-identical, but where both are NaN: where two NaNs of different signs meet (NaN + NaN), which one
    comes out depends on the operand order LLVM picks (IEEE leaves it open), and that is not the same in two
    compiles of different IR."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype.kind != "f":
        return bits_equal(got, want)
    both = np.isnan(got) & np.isnan(want)
    return np.array_equal(np.isnan(got), np.isnan(want)) and bits_equal(got[~both], want[~both])


def test_adam_direct_bits_and_parallel_blocks(fresh_dir, monkeypatch):
    for n, parallel in ((1000, False), (300_000, True)):
        k = fusion.compile_fusion(adam(n), parallel=parallel)
        assert isinstance(k.fn, type(len)) and bool(k.blocks) == parallel
        got = k(*adam_args(n))
        monkeypatch.setenv("HLOEXEC_DIRECT_KERNELS", "0")
        want = fusion.compile_fusion(adam(n), parallel=parallel)(*adam_args(n))
        monkeypatch.delenv("HLOEXEC_DIRECT_KERNELS")
        assert all(bits_equal(g, w) for g, w in zip(got, want))


COPY = ("def kernel(o0, p0):\n    for i0 in range(2):\n        for i1 in range(3):\n"
        "            o0[np.uint64(i0), np.uint64(i1)] = p0[np.uint64(i0), np.uint64(i1)]\n")


def _sig(dtype, readonly=True, ndim=2):
    return (("array", dtype, ndim, False), ("array", dtype, ndim, readonly))


def test_object_files_are_keyed_by_signature(fresh_dir):
    """One source, compiled for two dtypes: two object files, each right for its dtype (a name that ignored
    the dtype would load the float32 code for float64 arrays: TypeError or wrong bits)."""
    key = cache.source_key(COPY)
    names = {direct_kernels.object_name(key, sig) for sig in (_sig("float32"), _sig("float64"), _sig("float32", False),
                                                       _sig("float32", ndim=3))}
    assert len(names) == 4 and direct_kernels.object_name(key, _sig("float32")) == direct_kernels.object_name(key, _sig("float32"))
    assert direct_kernels.object_name(cache.source_key(COPY + "\n"), _sig("float32")) not in names
    for dtype in ("float32", "float64"):
        fn = cache.load_kernel(COPY, key, _sig(dtype))
        x = np.arange(6, dtype=dtype).reshape(2, 3) + np.array(0.1, dtype)
        out = np.zeros((2, 3), dtype)
        fn(out, x)
        assert bits_equal(out, x)
    assert len(list(fresh_dir.glob("hx_*.o"))) == 2
    cache.clear_cache(disk=False)       # from the disk now: still one object file per signature
    for dtype in ("float64", "float32"):
        out, x = np.zeros((2, 3), dtype), np.full((2, 3), 1 / 3, dtype)
        cache.load_kernel(COPY, key, _sig(dtype))(out, x)
        assert bits_equal(out, x)


def test_shapes_are_read_at_run_time(fresh_dir):
    """Structurally equal fusions share one kernel whatever their operands' shapes (a slice reads a part of a
    wider operand): a kernel reads the dims of each call's arrays."""
    fn = cache.load_kernel(COPY, cache.source_key(COPY), _sig("float32"))
    wide = np.arange(10, dtype=np.float32).reshape(2, 5)
    out = np.zeros((2, 3), np.float32)
    fn(out, wide)
    assert bits_equal(out, wide[:, :3])


def test_mismatched_arguments_raise_type_error(fresh_dir):
    fn = cache.load_kernel(COPY, cache.source_key(COPY), _sig("float32"))
    out, x = np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)
    frozen = out.copy()
    frozen.flags.writeable = False
    for args in [(out,), (out, x, x), (out, x.astype(np.float64)), (out, x.reshape(6)), (out, np.ones((3, 2), np.float32).T),
                 (frozen, x), (out, x.tolist()), (out, x.astype(">f4"))]:
        with pytest.raises(TypeError, match="do not match its signature"):
            fn(*args)
    fn(out, frozen)     # a read-only operand is fine
    assert bits_equal(out, frozen)


def test_untranslatable_sources_compile_through_numba(fresh_dir):
    comp = _fusion("""
f { a = f32[256,512] parameter(0)
  ROOT t = f32[256,512] cosine(a) }""")
    k = fusion.compile_fusion(comp)
    with pytest.raises(direct.Untranslatable, match="call of"):
        direct.translate(k.source, k.signature, "t")
    assert hasattr(k.fn, "py_func")     # a Numba dispatcher
    x = _special((256, 512), np.float32, 1)
    assert k(x).shape == (256, 512)
    for bad in ("def kernel(o0):\n    return o0\n", "def kernel(o0):\n    o0[0] = np.float32(1.0) + 1.0\n",
                "def kernel(o0):\n    o0[0] = 7 // np.int32(2)\n", "def kernel(o0):\n    for i in range(0, 9, -1):\n        pass\n"):
        with pytest.raises(direct.Untranslatable):
            direct.translate(bad, (("array", "float32", 1, False),), "t")


def test_an_untranslatable_source_is_marked_in_the_cache_and_not_parsed_again(fresh_dir, monkeypatch):
    """The verdict is kept beside the object files (a compile worker's reaches the process: its background thread
    then parses nothing, where CPython 3.11's ast.parse races another thread's); cleared with the cache."""
    comp = _fusion("""
f { a = f32[64,32] parameter(0)
  ROOT t = f32[64,32] cosine(a) }""")
    k = fusion.compile_fusion(comp)
    k(np.ones((64, 32), np.float32))  # (compiled: through Numba, the direct compiler's verdict marked)
    [marker] = fresh_dir.glob("*.untranslatable")
    parsed = []
    translate = direct_kernels.translate
    monkeypatch.setattr(direct_kernels, "translate", lambda *a: parsed.append(1) or translate(*a))
    for remembered in (True, False):
        direct_kernels._TRANSLATIONS.clear()  # (as a fresh process: only the cache dir remembers)
        if not remembered:
            marker.unlink()
        with pytest.raises(direct.Untranslatable, match="call of"):
            direct_kernels.compile_kernel(k.source, k.key, k.signature, fresh_dir)
        assert parsed == ([] if remembered else [1]) and marker.exists()
    cache.clear_cache()
    assert not any(fresh_dir.glob("*.untranslatable"))


def test_an_interrupted_object_write_leaves_no_part_file(fresh_dir, monkeypatch):
    def interrupted(src, dst):
        raise KeyboardInterrupt
    monkeypatch.setattr(direct_kernels.os, "replace", interrupted)
    source = "# never compiled before in this process\n" + COPY
    with pytest.raises(KeyboardInterrupt):
        cache.load_kernel(source, cache.source_key(source), _sig("float32"))
    assert list(fresh_dir.iterdir()) == []


def test_object_file_reused_by_a_fresh_process(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from hloexec.kernels import direct_kernels, fusion
        from test_kernels_fusion import adam, adam_args
        compiled = []
        object_code = direct_kernels.object_code
        direct_kernels.object_code = lambda ir: compiled.append(1) or object_code(ir)
        k = fusion.compile_fusion(adam(777))
        out = k(*adam_args(777))
        print(len(compiled), type(k.fn).__name__, out[0].view("u4").sum())
    """)
    env = dict(os.environ, HLOEXEC_CACHE_DIR=str(tmp_path))
    env.pop("HLOEXEC_DIRECT_KERNELS", None)
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-P", "-c", script], env=env, capture_output=True, text=True, timeout=300,
                           cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(r.stdout.split())
    assert runs[0][:2] == ["1", "builtin_function_or_method"] and runs[1][0] == "0", runs   # compiled once
    assert runs[0][2] == runs[1][2]
    assert len(list(tmp_path.glob("hx_*.o"))) == 1
