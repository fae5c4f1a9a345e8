"""hloexec.kernels.blas: products equal to numpy's within rounding, and bit-identical whatever the
thread count (the pool size, OPENBLAS_NUM_THREADS, the cores), also when several threads multiply at
once.

Most tests shrink the split's thresholds (`small_blocks`) so that small arrays are cut into many blocks;
`test_thread_counts_never_change_the_bits` runs the real thresholds in fresh processes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from hloexec.kernels import blas

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]

SHAPES = {               # (B, M, K, N), cut by `small_blocks` as the comment says
    "rows": (1, 300, 70, 40),           # M >= N: row ranges
    "columns": (1, 20, 90, 260),        # M < N: column ranges
    "batch": (12, 30, 20, 40),          # batch >= blocks wanted: whole batch items
    "batch_rows": (3, 200, 30, 20),     # batch < blocks wanted: row ranges of every item
    "n1": (1, 700, 50, 1),              # matrix @ vector (GEMV)
    "m1": (1, 1, 50, 700),              # vector @ matrix
    "k_huge": (1, 4, 30000, 3),         # one block: K is never cut
}


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(blas, "_BLOCK_WORK", 1 << 10)
    monkeypatch.setattr(blas, "_MIN_SIDE", 16)


def _random(shape, dtype, rng):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _assert_close_to_numpy(got, a, b):
    """Within reassociation of the K products: |got - ref| <= 2 K eps (|a| @ |b|)."""
    want = np.matmul(a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    eps = np.finfo(got.dtype).eps
    bound = 2 * a.shape[-1] * eps * np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    assert np.all(np.abs(got.astype(np.complex128) - want) <= bound)


def _blocks_cover_once(B, M, N, K):
    covered = np.zeros((B, M, N), np.uint8)
    for bs, rs, cs in blas._blocks(B, M, N, K) or [(slice(None),) * 3]:
        covered[bs, rs, cs] += 1
    return bool(np.all(covered == 1))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", SHAPES)
def test_blocks_match_numpy_and_any_pool_size(small_blocks, name, dtype):
    B, M, K, N = SHAPES[name]
    rng = np.random.default_rng(0)
    a, b = _random((B, M, K), dtype, rng), _random((B, K, N), dtype, rng)
    assert _blocks_cover_once(B, M, N, K)
    assert (blas._blocks(B, M, N, K) is None) == (name == "k_huge")
    one = blas.matmul(a, b, threads=1)
    _assert_close_to_numpy(one, a, b)
    for threads in (2, 4):
        assert blas.matmul(a, b, threads=threads).tobytes() == one.tobytes()


@pytest.mark.parametrize("name", ["rows", "columns", "batch", "batch_rows", "k_huge"])
def test_low_precision_operands_and_product_are_converted_inside_the_blocks(small_blocks, name):
    """bf16 operands widened and an f16 product narrowed by the callables given, a block at a time: the
    operand the blocks cut is never widened whole; the bits are those of widening everything first."""
    import ml_dtypes
    B, M, K, N = SHAPES[name]
    rng = np.random.default_rng(3)
    a = rng.standard_normal((B, M, K)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((B, K, N)).astype(ml_dtypes.bfloat16)
    widened = []

    def widen(x):
        widened.append(x.shape)
        return x.astype(np.float32)

    want = blas.matmul(a.astype(np.float32), b.astype(np.float32), threads=1).astype(np.float16)
    for threads in (1, 2):
        widened.clear()
        got = blas.matmul(a, b, threads=threads, widen=widen, narrow=lambda r: r.astype(np.float16),
                          dtype=np.float16)
        assert got.dtype == np.float16 and got.tobytes() == want.tobytes()
        blocks = blas._blocks(B, M, N, K)
        if blocks is None:
            assert sorted(widened) == sorted([a.shape, b.shape])
            continue
        rows_cut, cols_cut = blocks[0][1] != slice(None), blocks[0][2] != slice(None)
        assert (a.shape in widened) == cols_cut and (b.shape in widened) == rows_cut
        assert len(widened) == 2 * len(blocks) + rows_cut + cols_cut


@pytest.mark.parametrize("shape", [(1, 2048, 2048, 2048), (1, 512, 4096, 1024), (64, 128, 64, 128),
                                   (3, 1000, 500, 700), (1, 100, 4096, 5000), (1, 1 << 16, 1024, 1)])
def test_real_thresholds_cover_the_output_once(shape):
    B, M, K, N = shape
    blocks = blas._blocks(B, M, N, K)
    assert blocks is not None and 2 <= len(blocks) < blas._MAX_BLOCKS + B
    assert _blocks_cover_once(B, M, N, K)


def test_small_products_are_one_call():
    assert blas._blocks(1, 128, 256, 256) is None       # 2^23 multiply-adds: under two blocks' worth
    assert blas._blocks(1, 10, 10, 10**6) is None        # nothing to cut but K
    assert len(blas._blocks(1, 256, 256, 256)) == 2      # halves may be 128 rows


@pytest.mark.parametrize("dtype", [np.float32, np.complex64, np.int32, np.int64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(0, 3, 4, 5), (2, 0, 4, 5), (2, 3, 0, 5), (2, 3, 4, 0), (4, 50, 60, 70)])
def test_empty_dims_and_integers_equal_numpy(small_blocks, shape, dtype):
    B, M, K, N = shape
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((B, M, K)) * 100).astype(dtype)
    b = (rng.standard_normal((B, K, N)) * 100).astype(dtype)
    got, want = blas.matmul(a, b, threads=2), np.matmul(a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    if np.dtype(dtype).kind == "i" or 0 in shape:
        assert np.array_equal(got, want)
    else:
        _assert_close_to_numpy(got, a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_tensordot_of_a_convolution_window_view(small_blocks, dtype):
    """The convolution's call: a strided window view (N, C, out..., win...) against (O, C, win...)."""
    rng = np.random.default_rng(2)
    x = _random((2, 3, 20, 18), dtype, rng)
    kernel = _random((5, 3, 3, 2), dtype, rng)
    st = x.strides
    view = np.lib.stride_tricks.as_strided(x, shape=(2, 3, 18, 17, 3, 2), strides=st + st[2:], writeable=False)
    axes = ([1, 4, 5], [1, 2, 3])
    one = blas.tensordot(view, kernel, axes, threads=1)
    want = np.tensordot(view, kernel, axes=axes)
    assert one.shape == want.shape == (2, 18, 17, 5) and one.dtype == want.dtype
    np.testing.assert_allclose(one, want, rtol=1e-4 if np.dtype(dtype).itemsize <= 8 else 1e-12, atol=1e-4)
    assert blas.tensordot(view, kernel, axes, threads=3).tobytes() == one.tobytes()
    empty = blas.tensordot(view[:0], kernel, axes)
    assert empty.shape == (0, 18, 17, 5)


def test_pool_threads_follow_the_callers_errstate(small_blocks):
    """Blocks computed by pool threads honour np.errstate of the caller, as the caller's own do."""
    a = np.full((1, 256, 64), 1e30, np.float32)
    b = np.full((1, 64, 256), 1e30, np.float32)
    assert len(blas._blocks(1, 256, 256, 64)) > 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(over="ignore"):
            assert np.isinf(blas.matmul(a, b, threads=4)).all()
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        blas.matmul(a, b, threads=4)


def test_concurrent_callers_keep_one_blas_thread_and_restore_it():
    """SPMD participants multiply from several threads at once: every block still runs on one BLAS
    thread (counted hold), and the BLAS gets its own setting back after the last one."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1, 512, 1024), np.float32)
    b = rng.standard_normal((1, 1024, 384), np.float32)
    before = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    want = blas.matmul(a, b, threads=1).tobytes()
    results = []

    def caller():
        for _ in range(6):
            results.append(blas.matmul(a, b, threads=2).tobytes())
    callers = [threading.Thread(target=caller) for _ in range(3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert len(results) == 18 and all(r == want for r in results)
    assert [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"] == before


# Products whose bits depend on OpenBLAS's thread count when it is free to use its threads (measured
# with OpenBLAS 0.3.31: GEMM, a batched GEMM, complex x @ x.T (SYRK), an f64 vector dot, a complex
# GEMV) and a convolution-shaped tensordot; digested in a fresh process per thread configuration, first
# from the main thread, then from another thread once the main thread is threadpoolctl's
# "controlling thread" for OpenBLAS (which makes other threads' plain set_num_threads no-ops).
CHILD = """
import hashlib, json, os, sys, threading
if os.environ.get("TEST_BLAS_ONE_CORE"):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
import numpy as np
from threadpoolctl import ThreadpoolController
from hloexec.kernels import blas

def products():
    rng = np.random.default_rng(5)
    def rand(shape, dtype):
        x = rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if np.dtype(dtype).kind == "c" else 0)
        return x.astype(dtype)
    out = {}
    for name, (B, M, K, N), dtype in [("gemm", (1, 512, 1024, 384), np.float32),
                                      ("batched", (4, 256, 512, 256), np.float32),
                                      ("f64", (1, 600, 700, 500), np.float64), ("dot", (1, 1, 20000, 1), np.float64),
                                      ("gemv", (1, 1, 500, 300), np.complex64),
                                      # at blas._ONE_THREAD_ANYWAY: multiplied with the BLAS's own thread setting
                                      ("small_gemm", (3, 16, 32, 16), np.float32),
                                      ("small_gemv", (1, 64, 128, 1), np.float64),
                                      ("small_cgemv", (1, 64, 128, 1), np.complex64),
                                      ("small_dot", (1, 1, 8192, 1), np.float64)]:
        out[name] = blas.matmul(rand((B, M, K), dtype), rand((B, K, N), dtype))
    x = rand((1, 64, 64), np.complex64)
    out["syrk"] = blas.matmul(x, x.transpose(0, 2, 1))
    image, kernel = rand((4, 16, 40, 40), np.float32), rand((32, 16, 3, 3), np.float32)
    st = image.strides
    view = np.lib.stride_tricks.as_strided(image, (4, 16, 38, 38, 3, 3), st + st[2:], writeable=False)
    out["conv"] = blas.tensordot(view, kernel, ([1, 4, 5], [1, 2, 3]))
    return {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in out.items()}

lib = ThreadpoolController().select(user_api="blas").lib_controllers[0]
before = lib.num_threads
main = products()
lib.set_num_threads(before)         # the main thread becomes threadpoolctl's controlling thread
other = {}
t = threading.Thread(target=lambda: other.update(products()))
t.start(); t.join()
print(json.dumps({"blas_threads": before, "main": main, "other": other, "after": lib.num_threads}))
"""


def _child(**env) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")} | env
    done = subprocess.run([sys.executable, "-P", "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_thread_counts_never_change_the_bits():
    runs = [_child(OPENBLAS_NUM_THREADS="1"), _child(), _child(TEST_BLAS_ONE_CORE="1")]
    assert runs[0]["blas_threads"] == 1 and runs[2]["blas_threads"] == 1
    for run in runs:
        assert run["after"] == run["blas_threads"]
        assert run["main"] == run["other"] == runs[0]["main"]


class _NoSwitch:
    def __enter__(self):
        raise AssertionError("the BLAS thread setting was switched")

    def __exit__(self, *exc_info):
        return False


@pytest.mark.parametrize("shape", [(1, 1, 16, 16), (4, 16, 32, 16), (1, 1, 8192, 1)])
def test_small_products_leave_the_blas_thread_setting_alone(monkeypatch, shape):
    """A product OpenBLAS runs on one thread anyway skips the switch (most of a small dot's time); the same
    product of one buffer and its transpose (numpy calls SYRK, which splits at any size) still switches."""
    B, M, K, N = shape
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((B, M, K)).astype(np.float32), rng.standard_normal((B, K, N)).astype(np.float32)
    monkeypatch.setattr(blas, "_one_blas_thread", _NoSwitch())
    assert blas.matmul(a, b).tobytes() == np.matmul(a, b).tobytes()
    x = rng.standard_normal((1, 8, 16)).astype(np.float32)
    with pytest.raises(AssertionError, match="switched"):
        blas.matmul(x, x.transpose(0, 2, 1))
    big = rng.standard_normal((1, 32, 32)).astype(np.float32)
    with pytest.raises(AssertionError, match="switched"):
        blas.matmul(big, big.copy())


def _other_threads_cpu_ticks() -> int:
    me = threading.get_native_id()
    ticks = 0
    for task in os.listdir("/proc/self/task"):
        if int(task) != me:
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime + stime
    return ticks


def _threads_busy_during(a, b, calls: int = 20000) -> int:
    """CPU ticks the process' other threads (OpenBLAS's) spent while this thread multiplied a @ b `calls` times
    with numpy at the BLAS's own thread setting."""
    time.sleep(0.3)  # threads still spinning after earlier work go to sleep
    before = _other_threads_cpu_ticks()
    for _ in range(calls):
        np.matmul(a, b)
    return _other_threads_cpu_ticks() - before


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="per-thread CPU times from /proc (Linux)")
def test_products_skipping_the_switch_run_on_the_calling_thread():
    """What `_ONE_THREAD_ANYWAY` relies on, observed: with the BLAS free to use its threads, real products of that
    many multiply-adds leave its other threads idle, while a complex GEMV of the same size keeps them busy (the
    control: without it, nothing here shows whether the BLAS threads at all)."""
    rng = np.random.default_rng(4)
    control = _random((96, 96), np.complex64, rng), _random((96, 1), np.complex64, rng)
    np.matmul(np.ones((300, 300), np.float32), np.ones((300, 300), np.float32))  # the BLAS's threads started
    if _threads_busy_during(*control) < 10:
        pytest.skip("the BLAS ran a complex GEMV on one thread here: its threading cannot be observed")
    n = blas._ONE_THREAD_ANYWAY
    for dtype in (np.float32, np.float64):
        for M, K, N in [(64, 128, 1), (1, 128, 64), (16, 32, 16), (1, n, 1), (n // 64, 8, 8)]:
            a, b = _random((M, K), dtype, rng), _random((K, N), dtype, rng)
            assert _threads_busy_during(a, b) <= 5, (dtype, M, K, N)


def _views(rng, B, R, C):
    """The same [B, R, C] f32 values as a contiguous array, a transposed (column-major) view, matrices
    interleaved along the rows (the batch stride smaller than a matrix), and a row-padded view."""
    x = rng.standard_normal((B, R, C)).astype(np.float32)
    column_major = np.ascontiguousarray(x.transpose(0, 2, 1)).transpose(0, 2, 1)
    interleaved = np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)
    padded = np.zeros((B, R, C + 3), np.float32)[:, :, :C]
    padded[...] = x
    return {"contiguous": x, "column_major": column_major, "interleaved": interleaved, "padded": padded}


@pytest.mark.skipif(not blas.mkl.AVAILABLE, reason="the optional `mkl` package is not installed")
@pytest.mark.parametrize("shape", [(3, 17, 9, 11), (1, 1, 40, 30), (2, 30, 40, 1), (1, 25, 1, 7), (4, 8, 0, 5)])
def test_mkl_reads_every_operand_layout_and_writes_column_blocks(shape):
    B, M, K, N = shape
    rng = np.random.default_rng(1)
    lhs, rhs = _views(rng, B, M, K), _views(rng, B, K, N)
    want = np.matmul(lhs["contiguous"].astype(np.float64), rhs["contiguous"].astype(np.float64))
    bound = 2 * K * np.finfo(np.float32).eps * np.matmul(np.abs(lhs["contiguous"]).astype(np.float64),
                                                         np.abs(rhs["contiguous"]).astype(np.float64))
    results = []
    for a in lhs.values():
        for b in rhs.values():
            out = np.full((B, M, N + 2), np.nan, np.float32)
            block = out[:, :, 1:N + 1]          # a column block of a wider output, as blas.matmul's splits write
            assert blas.mkl.can_write(block)
            blas.mkl.matmul_into(a, b, block)
            assert np.all(np.abs(block - want) <= bound)
            assert np.isnan(out[:, :, 0]).all() and np.isnan(out[:, :, -1]).all()   # nothing written beside it
            results.append(block.tobytes())
    assert not blas.mkl.can_write(np.zeros((B, N, M), np.float32).transpose(0, 2, 1)) or min(M, N) <= 1


def _mkl_available_in_child(code: str, **env) -> str:
    code += "\nfrom hloexec.kernels import mkl; print(mkl.AVAILABLE)"
    done = subprocess.run([sys.executable, "-P", "-c", code], env=dict(os.environ, **env), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_hloexec_blas_openblas_keeps_numpys_blas():
    assert _mkl_available_in_child("", HLOEXEC_BLAS="openblas") == "False"


@pytest.mark.skipif(not blas.mkl.AVAILABLE, reason="the optional `mkl` package is not installed")
def test_mkl_loaded_by_someone_else_is_left_alone():
    """numpy built with MKL loads it first: its threading layer is not ours to set, and numpy's matmul is MKL's."""
    preload = f"import ctypes; ctypes.CDLL({blas.mkl._library_path()!r})"
    assert _mkl_available_in_child(preload) == "False"
    assert _mkl_available_in_child("") == "True"


@pytest.mark.skipif(not blas.mkl.AVAILABLE, reason="the optional `mkl` package is not installed")
@pytest.mark.parametrize("name", SHAPES)
def test_mkl_blocks_match_numpy_and_any_pool_size(small_blocks, monkeypatch, name):
    """Where floating-point errors are ignored (dot_general's case), f32 blocks are MKL's: the same bits on any
    number of threads."""
    monkeypatch.setattr(blas, "_MKL_MIN_WORK", 1)
    B, M, K, N = SHAPES[name]
    rng = np.random.default_rng(0)
    a, b = _random((B, M, K), np.float32, rng), _random((B, K, N), np.float32, rng)
    calls = []
    into = blas.mkl.matmul_into
    monkeypatch.setattr(blas.mkl, "matmul_into", lambda *args: calls.append(1) or into(*args))
    with np.errstate(all="ignore"):
        one = blas.matmul(a, b, threads=1)
        _assert_close_to_numpy(one, a, b)
        for threads in (2, 4):
            assert blas.matmul(a, b, threads=threads).tobytes() == one.tobytes()
    assert len(calls) == 3 * len(blas._blocks(B, M, N, K) or [None])


@pytest.mark.skipif(not blas.mkl.AVAILABLE, reason="the optional `mkl` package is not installed")
def test_mkl_rejecting_a_parameter_raises(monkeypatch):
    """MKL computes nothing for a call it rejects: that must be an error, never a silent garbage output."""
    a, b = np.ones((1, 4, 3), np.float32), np.ones((1, 3, 5), np.float32)
    out = np.full((1, 4, 5), np.nan, np.float32)
    monkeypatch.setattr(blas.mkl, "_batch_stride", lambda x, extent: 0)    # below ld x rows: MKL's parameter 17
    with pytest.raises(RuntimeError, match="rejected parameter 17"):
        blas.mkl.matmul_into(a, b, out)
    assert not blas.mkl._rejected


@pytest.mark.skipif(not blas.mkl.AVAILABLE, reason="the optional `mkl` package is not installed")
@pytest.mark.parametrize("name", ["rows", "columns", "batch", "batch_rows", "k_huge"])
def test_mkl_reads_f16_operands_without_widening_with_the_bits_of_sgemm(small_blocks, monkeypatch, name):
    """f16 operands widened to f32 for the product: MKL reads them as they are (gemm_f16f16f32), with the bits of
    its sgemm of the widened operands, on any number of threads; `widen` only sees an empty probe."""
    monkeypatch.setattr(blas, "_MKL_MIN_WORK", 1)
    B, M, K, N = SHAPES[name]
    rng = np.random.default_rng(2)
    a, b = _random((B, M, K), np.float16, rng), _random((B, K, N), np.float16, rng)
    widened = []

    def widen(x):
        widened.append(x.size)
        return x.astype(np.float32)
    with np.errstate(all="ignore"):
        want = blas.matmul(a.astype(np.float32), b.astype(np.float32), threads=1)
        for threads in (1, 2, 4):
            got = blas.matmul(a, b, threads=threads, widen=widen, dtype=np.float32)
            assert got.dtype == np.float32 and got.tobytes() == want.tobytes()
    assert set(widened) == {0}


def test_the_hold_reads_and_sets_each_blas_thread_count_as_threadpoolctl_does():
    """The getters and setters a hold calls (raw C calls keeping the GIL for OpenBLAS) read the count threadpoolctl
    reports and set the one it then reads; inside the hold every BLAS is at one thread, after it at its own."""
    from threadpoolctl import ThreadpoolController

    found = ThreadpoolController().select(user_api="blas").lib_controllers
    controls = [blas._controls(lib) for lib in found]
    before = [lib.num_threads for lib in found]
    assert [get() for get, _ in controls] == before
    for (get, set_), lib, n in zip(controls, found, before):
        set_(1)
        assert lib.num_threads == get() == 1
        set_(n)
        assert lib.num_threads == get() == n
    with blas.one_thread():
        assert [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"] == [1] * len(found)
    assert [lib.num_threads for lib in found] == before
