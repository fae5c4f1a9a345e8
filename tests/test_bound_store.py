"""What the error bounds keep per live value (tools/bound_store.py): moves keep views of their operand's bound,
marks and samples (the same elements the op's own kernel makes), exact widening converts share them, values moved
from exact operands keep nothing."""
from __future__ import annotations

import numpy as np
import pytest

import hloexec
from hloexec.exec.shadow import shadow_module
from hloexec.ir.dtypes import element_type
from hloexec.options import device_profile
from hloexec.tools.bound_samples import CALIBRATION_BLOCK, calibrate
from hloexec.tools.bound_store import has_error, moved_view, widens_exactly
from hloexec.tools.bounds import ErrorBounds
from hloexec.tools.numerics import Runner, executable_like

MOVES = {
    "broadcast": ("f32[3,5]", "f32[5,2,3] broadcast(p), dimensions={2,0}"),
    "broadcast-sorted": ("f32[5]", "f32[4,5,2] broadcast(p), dimensions={1}"),
    "transpose": ("f32[3,4,5]", "f32[5,3,4] transpose(p), dimensions={2,0,1}"),
    "slice": ("f32[7,9]", "f32[3,4] slice(p), slice={[1:7:2], [0:8:2]}"),
    "reshape": ("f32[6,4]", "f32[2,3,4] reshape(p)"),
    "copy": ("f32[6,4]", "f32[6,4] copy(p)"),
}


def _module(operand: str, op: str) -> str:
    return f"HloModule m\nENTRY e {{\n  p = {operand} parameter(0)\n  ROOT r = {op}\n}}\n"


@pytest.mark.parametrize("name", sorted(MOVES))
def test_a_moved_view_holds_the_elements_the_ops_kernel_moves_there(name):
    operand, op = MOVES[name]
    exe = hloexec.load(_module(operand, op))
    inst = exe.module.entry.root
    shape = tuple(inst.operands[0].shape.dims)
    r = np.random.default_rng(0)
    samples = r.standard_normal((4, *shape)).astype(np.float32)
    moved = moved_view(inst, samples, shape, (4,))
    expected = np.stack([np.asarray(exe.run(s)) for s in samples])
    assert moved.shape == expected.shape and np.array_equal(moved, expected)
    if name != "reshape":  # (a reshape of a contiguous array is a view too, but numpy decides)
        assert np.shares_memory(moved, samples)
    # a bound kept smaller than its value (broadcasting to it) moves as its broadcast would
    row = r.standard_normal(shape[-1:]).astype(np.float32)
    assert np.array_equal(moved_view(inst, row, shape), np.asarray(exe.run(np.broadcast_to(row, shape).copy())))


def test_widens_exactly_only_where_every_value_of_the_source_type_is_one_of_the_target():
    pairs = {("bf16", "f32"): True, ("f16", "f32"): True, ("f32", "f64"): True, ("f16", "f64"): True,
             ("f32", "bf16"): False, ("bf16", "f16"): False, ("f16", "bf16"): False, ("f64", "f32"): False,
             ("s32", "f32"): False}
    for (source, target), exact in pairs.items():
        assert widens_exactly(element_type(source), element_type(target)) is exact, (source, target)


CHAIN = """HloModule m
ENTRY e {
  a = bf16[8,16] parameter(0)
  b = bf16[8,16] parameter(1)
  c = f32[16] parameter(2)
  m = bf16[8,16] multiply(a, b)
  w = f32[8,16] convert(m)
  t = f32[16,8] transpose(w), dimensions={1,0}
  s = f32[4,8] slice(t), slice={[0:16:4], [0:8]}
  q = f32[128] reshape(w)
  g = f32[8,16] broadcast(c), dimensions={1}
  x = f32[8,16] add(w, g)
  ROOT out = (f32[4,8], f32[128], f32[8,16]) tuple(s, q, x)
}
"""


def test_moves_keep_views_converts_share_and_exact_values_keep_nothing():
    """Observed run of CHAIN: each move's bound is its kernel on its operand's bound (as before views), held as a
    view of the operand's arrays; the exact widening convert holds the multiply's bound, marks and samples
    themselves (no error of its own: nothing to calibrate again); the broadcast of a parameter keeps no entry."""
    exe = hloexec.load(CHAIN)
    shadow = shadow_module(exe.module)
    shadow_exe = executable_like(exe, shadow.module, use_numba=False)
    bounds = ErrorBounds(shadow, shadow_exe.context, device_profile("reference"))
    seen: dict = {}

    def observe(_device, inst, value, operands):
        bounds(inst, value, operands)
        if inst.opcode in ("multiply", "convert", "transpose", "slice", "reshape", "broadcast"):
            seen[inst.opcode] = (value, operands, bounds._entry(value), inst)

    r = np.random.default_rng(2)
    inputs = [r.uniform(-2, 2, (8, 16)).astype("bfloat16") for _ in range(2)] + [r.uniform(-1, 1, 16).astype(np.float32)]
    Runner().run(shadow_exe, shadow.inputs(inputs), observe, observe_operands=True)
    mul = seen["multiply"][2]
    assert mul[1] is not None and mul[3] is not None and np.any(mul[1] > 0)
    convert = seen["convert"][2]
    assert convert[1] is mul[1] and convert[2] is mul[2] and convert[3] is mul[3]  # (the same arrays)
    for op in ("transpose", "slice", "reshape"):
        value, operands, entry, inst = seen[op]
        kernel = bounds._kernel(inst)
        assert np.array_equal(bounds.of(value), kernel(bounds.of(operands[0])))
        assert np.shares_memory(entry[1], mul[1]) and np.shares_memory(entry[3], mul[3])
    assert seen["broadcast"][2][1:] == (None, None, None)  # (known: exact)



@pytest.mark.parametrize("exact", ["t", "a"])
def test_a_tuple_holding_an_exact_value_keeps_its_other_leaves_samples(exact):
    """A transpose of a parameter is known (an entry with no bound), a parameter is not but is an input: a tuple of
    either and a computed value keeps the computed leaf's entry, not re-moved (which kept bounds only and dropped
    its samples: attention's bf16 bounds went 3x tighter, a false alarm)."""
    shape = "f32[16,8]" if exact == "t" else "f32[8,16]"
    text = f"""HloModule m
ENTRY e {{
  a = f32[8,16] parameter(0)
  b = f32[8,16] parameter(1)
  m = f32[8,16] multiply(a, b)
  t = f32[16,8] transpose(a), dimensions={{1,0}}
  ROOT out = (f32[8,16], {shape}) tuple(m, {exact})
}}
"""
    exe = hloexec.load(text)
    shadow = shadow_module(exe.module)
    shadow_exe = executable_like(exe, shadow.module, use_numba=False)
    bounds = ErrorBounds(shadow, shadow_exe.context, device_profile("reference"))
    kept = {}

    def observe(_device, inst, value, operands):
        bounds(inst, value, operands)
        if inst.opcode in ("multiply", "tuple"):
            leaf = value if inst.opcode == "multiply" else value[0]
            kept[inst.opcode] = bounds._entry(leaf)[3]

    r = np.random.default_rng(4)
    inputs = [r.uniform(1, 2, (8, 16)).astype(np.float32) for _ in range(2)]
    Runner().run(shadow_exe, shadow.inputs(inputs), observe, observe_operands=True)
    assert kept["multiply"] is not None and kept["tuple"] is kept["multiply"]


# -- the samples' bfloat16 codec -----------------------------------------------------------------------------------
BF16 = np.dtype("bfloat16")


def _special_float32(r) -> np.ndarray:
    """Random float32 of every magnitude plus the cases rounding decides: NaNs with payloads (quiet, signaling,
    negative), infinities, the largest finite value and what rounds past it, ties to even, subnormals, zeros."""
    with np.errstate(over="ignore"):
        wide = (r.standard_normal(40_000) * np.exp2(r.integers(-140, 128, 40_000))).astype(np.float32)
    bits = r.integers(0, 1 << 32, 40_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ties = (np.arange(0, 1 << 16, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # every bf16 value's midpoint
    edges = np.array([0x7F800001, 0x7FC00001, 0xFF800123, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x7F7F8000,
                      0x7F7F7FFF, 0x00000001, 0x80000001, 0x007FFFFF, 0x00008000, 0x00018000, 0, 0x80000000],
                     np.uint32).view(np.float32)
    return np.concatenate([wide, bits, ties, edges])


def _store_of_samples(samples):
    """A BoundStore holding `samples` for a value (the value returned too: the entry lives while it does)."""
    from hloexec.tools.bound_store import BoundStore

    store, value = BoundStore(), np.zeros(samples.shape[1:], np.float32)
    store._put(value, None, None, samples)
    return store, value


def test_the_samples_decode_is_ml_dtypes_bit_for_bit_over_every_bfloat16_pattern():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(BF16).reshape(4, -1)
    store, value = _store_of_samples(every)
    got = store._samples_or_none(value)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), every.astype(np.float32).view(np.uint32))
    # a strided view (a transpose) and a broadcast one decode as ml_dtypes does too
    for view in (every.reshape(4, 64, 256).transpose(0, 2, 1), np.broadcast_to(every[:, :1], (4, 300))):
        store, value = _store_of_samples(view)
        want = view.astype(np.float32).view(np.uint32)
        assert np.array_equal(store._samples_or_none(value).view(np.uint32), want)


def test_the_samples_encode_is_ml_dtypes_bit_for_bit():
    x = _special_float32(np.random.default_rng(5))
    x = x[: x.size // 4 * 4].reshape(4, -1)
    with np.errstate(invalid="ignore"):
        want_bits = x.astype(BF16).view(np.uint16)
    want_reading = want_bits.view(BF16).astype(np.float32).view(np.uint32)
    store, value = _store_of_samples(x.copy())
    stored = store._entry(value)[3]
    assert stored.dtype == BF16 and np.array_equal(stored.view(np.uint16), want_bits)
    assert np.array_equal(store._samples_or_none(value).view(np.uint32), want_reading)


@pytest.mark.parametrize("layout", ["transposed", "strided", "read-only"])
def test_samples_of_any_layout_encode_as_ml_dtypes(layout):
    """A dense array in another memory order, a strided one, a read-only one: encoded as ml_dtypes casts, the
    caller's array left as it was."""
    x = _special_float32(np.random.default_rng(6))[: 4 * 96 * 100].reshape(4, 96, 100)
    samples = {"transposed": x.transpose(0, 2, 1), "strided": x[:, ::2, 1:], "read-only": x.copy()}[layout]
    if layout == "read-only":
        samples.flags.writeable = False
    before = samples.copy()
    with np.errstate(invalid="ignore"):
        want = samples.astype(BF16)
    store, value = _store_of_samples(samples)
    assert np.array_equal(store._entry(value)[3].view(np.uint16), want.view(np.uint16))
    reading = store._samples_or_none(value)
    assert np.array_equal(reading.view(np.uint32), want.astype(np.float32).view(np.uint32))
    assert np.array_equal(samples.view(np.uint32), before.view(np.uint32))


class _MlDtypesCodec(ErrorBounds):
    """ErrorBounds with the samples encoded and decoded by numpy's casts through ml_dtypes (the form the compiled
    codec replaces)."""

    def _encoded(self, samples):
        return samples.astype(BF16)

    def _samples_or_none(self, leaf):
        entry = self._entry(leaf)
        if entry is None or entry[3] is None:
            return None
        return entry[3].astype(np.float32) if entry[3].dtype == BF16 else entry[3]


LAYER = """HloModule m
add { x = f32[] parameter(0)  y = f32[] parameter(1)  ROOT s = f32[] add(x, y) }
ENTRY e {
  a = bf16[16,64] parameter(0)
  w = bf16[64,32] parameter(1)
  d = bf16[16,32] dot(a, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  f = f32[16,32] convert(d)
  t = f32[32,16] transpose(f), dimensions={1,0}
  z = f32[] constant(0)
  s = f32[32] reduce(t, z), dimensions={1}, to_apply=add
  b = f32[32,16] broadcast(s), dimensions={0}
  c = f32[32,16] subtract(t, b)
  m = f32[32,16] multiply(c, c)
  q = f32[32,16] divide(m, t)
  ROOT out = (f32[32,16], f32[32,16]) tuple(q, c)
}
"""


def test_the_bounds_are_the_same_bit_for_bit_as_with_ml_dtypes_casts_every_time():
    exe = hloexec.load(LAYER)
    shadow = shadow_module(exe.module)
    shadow_exe = executable_like(exe, shadow.module, use_numba=False)
    r = np.random.default_rng(7)
    inputs = [r.standard_normal((16, 64)).astype("bfloat16"), r.standard_normal((64, 32)).astype("bfloat16")]
    runs = []
    for kind in (ErrorBounds, _MlDtypesCodec):
        bounds = kind(shadow, shadow_exe.context, device_profile("reference"))
        kept: list = []

        def observe(_device, inst, value, operands, bounds=bounds, kept=kept):
            bounds(inst, value, operands)
            for leaf in (value if isinstance(value, tuple) else (value,)):
                entry = bounds._entry(leaf)
                if entry is not None and entry[3] is not None:
                    kept.append((inst.name, bounds.of(leaf).copy(), entry[3].view(np.uint16).copy()))

        Runner().run(shadow_exe, shadow.inputs(inputs), observe, observe_operands=True)
        runs.append(kept)
    assert len(runs[0]) == len(runs[1]) > 8
    for (name, bound, bits), (name2, bound2, bits2) in zip(*runs):
        assert name == name2 and np.array_equal(bound, bound2) and np.array_equal(bits, bits2), name


@pytest.mark.parametrize("name", sorted(MOVES))
def test_samples_read_one_at_a_time_are_the_whole_readings_samples(name):
    """`_samples_per_sample` (a collective's and a move's samples, one sample decoded at a time) gives, sample by
    sample, the bits `_samples_or_none` decodes at once, for stored samples moved as views (strided, broadcast)."""
    import ml_dtypes

    from hloexec.tools.bound_store import BoundStore

    operand, op = MOVES[name]
    inst = hloexec.load(_module(operand, op)).module.entry.root
    shape = tuple(inst.operands[0].shape.dims)
    stored = np.random.default_rng(1).standard_normal((4, *shape)).astype(ml_dtypes.bfloat16)
    value = np.zeros(tuple(inst.shape.dims))
    store = BoundStore()
    store.store[id(value)] = (lambda: value, None, None, moved_view(inst, stored, shape, (4,)))
    whole, one_at_a_time = store._samples_or_none(value), store._samples_per_sample(value)
    assert whole.dtype == np.float32 and whole.shape == (4, *value.shape)
    for k in range(4):
        np.testing.assert_array_equal(one_at_a_time[k], whole[k])
        np.testing.assert_array_equal(whole[k], moved_view(inst, stored, shape, (4,))[k].astype(np.float32))


def _bounds_with_few_nonzeros():
    """Bounds whose nonzero elements (or NaN, infinities, subnormals) sit where a first-chunk or source-only reading
    could miss them: past the first elements, in a broadcast's source, in non-contiguous views."""
    last = np.zeros(9000)
    last[-1] = 5e-324  # (the least subnormal, last)
    nan_last = np.zeros(5000, np.float32)
    nan_last[-1] = np.nan
    inf_late = np.zeros((50, 300), np.float32)
    inf_late[49, 299] = np.inf
    strided = np.zeros((100, 100))
    strided[99, 3] = 1e-300
    yield from (last, nan_last, inf_late, inf_late.T, strided[:, ::3], strided[:, 1::3], strided[::-1])
    yield from (np.zeros(10000, np.float32), np.zeros((0, 5)), np.zeros(()), np.float64(0.0), np.float32(np.nan))
    for source in (np.zeros(7, np.float32), np.array([0, 0, 1e-45], np.float32), np.array([0.0, -0.0])):
        yield np.broadcast_to(source, (3000, source.size))
        yield np.broadcast_to(source[:, None], (source.size, 3000))
    r = np.random.default_rng(0)
    for _ in range(20):
        sparse = np.where(r.random((64, 96)) < 0.0005, r.standard_normal((64, 96)), 0.0)
        yield np.broadcast_to(sparse[:, None, :], (64, 5, 96))


def test_has_error_is_np_any():
    cases = list(_bounds_with_few_nonzeros())
    assert any(has_error(c) for c in cases) and not all(has_error(c) for c in cases)  # (both answers tested)
    for case in cases:
        assert has_error(case) is bool(np.any(case))
    assert has_error(None) is False


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_calibrating_in_place_gives_the_new_arrays_bits(dtype):
    """store_pass scales a pass's own bound in place: the same bits as calibrate's new array."""
    r = np.random.default_rng(1)
    n = CALIBRATION_BLOCK * 40 + 17
    bound = (np.abs(r.standard_normal(n)) * np.exp(r.uniform(-20, 5, n))).astype(dtype)
    bound[r.random(n) < 0.01] = 0
    loose = np.repeat(r.uniform(1e-4, 2.0, n // CALIBRATION_BLOCK + 1), CALIBRATION_BLOCK)[:n]  # (per block)
    deviations = (r.standard_normal((4, n)) * bound * loose).astype(np.float32)
    want = calibrate(bound.copy(), deviations)
    assert not np.array_equal(want, bound)  # (some block scaled)
    scaled = bound.copy()
    got = calibrate(scaled, deviations, in_place=True)
    assert got is scaled and got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_the_draws_keys_are_rng_integers_over_the_full_range():
    """ErrorBounds.draw_key reads the rng's raw 64-bit output: the keys and the rng's state rng.integers(0, 2**64,
    np.uint64) gives (the draws of every run as before)."""
    from types import SimpleNamespace

    for seed in (0, 1, 12345):
        ours = SimpleNamespace(rng=np.random.default_rng(seed), unused_key=None)
        numpy_s = np.random.default_rng(seed)
        keys = [ErrorBounds.draw_key(ours) for _ in range(200)]
        assert all(type(k) is np.uint64 for k in keys)
        assert keys == [numpy_s.integers(0, 2**64, dtype=np.uint64) for _ in range(200)]
        assert ours.rng.bit_generator.state == numpy_s.bit_generator.state


def test_a_key_given_back_is_the_next_one_drawn():
    """A compiled pass that drew a key for own errors its value turned out not to have gives it back
    (ErrorBounds.give_back_key): the keys drawn are those of an rng whose state was put back before that draw (the
    order `_sample` draws in, which draws no key there: the draws of every run as before)."""
    from types import SimpleNamespace

    pattern = np.random.default_rng(3).random(300) < 0.4  # which draws' keys are given back
    ours, numpy_s = SimpleNamespace(rng=np.random.default_rng(7), unused_key=None), np.random.default_rng(7)
    for unused in pattern:
        state = numpy_s.bit_generator.state
        key = ErrorBounds.draw_key(ours)
        assert type(key) is np.uint64 and key == numpy_s.integers(0, 2**64, dtype=np.uint64)
        if unused:
            ErrorBounds.give_back_key(ours, key)
            numpy_s.bit_generator.state = state
    assert pattern.sum() > 100


def test_operands_copied_for_a_pass_on_the_cores_hold_the_views_elements():
    """bound_elementwise._flat copies a broadcast or transposed operand in spans on the cores: the same elements,
    C-ordered, read-only, as one copy gives (small ones, and ones too short to split, copied at once)."""
    from hloexec.kernels.bound_rules import SPLIT_FROM
    from hloexec.tools.bound_elementwise import _flat

    r = np.random.default_rng(2)
    big = SPLIT_FROM * 3 // 2
    views = [
        np.broadcast_to(r.standard_normal((1, 300, 1)).astype(np.float32), (big // 300 + 1, 300, 7)),
        r.standard_normal((big // 500 + 3, 500)).T,
        np.broadcast_to(r.standard_normal(5).astype(np.float32).view(np.uint32).astype(np.uint16), (4, big // 5, 5)),
        np.broadcast_to(r.standard_normal((1, 64)), (big // 64, 64))[:, ::-1],
        np.broadcast_to(r.standard_normal(big), (1, big)),  # (one row: not split)
        r.standard_normal((7, 9))[:, ::2],
    ]
    for view in views:
        for rows in {1, len(view)}:
            flat = _flat(view, rows)
            assert flat.flags.c_contiguous and not flat.flags.writeable
            np.testing.assert_array_equal(flat, np.ascontiguousarray(view).reshape(-1 if rows == 1 else (rows, -1)))
