"""hloexec.kernels.cache in isolation: generated sources are written once per key to the cache dir, imported
once per process, compiled once across processes (Numba's disk cache), and forgotten by clear_cache.
(A whole fusion reloaded by a fresh process: tests/test_kernels_fusion.py::test_disk_cache_in_a_fresh_process.)"""
import sys

import numpy as np
import pytest

from hloexec.kernels import cache


SIGNATURE = (("array", "int64", 1, True),)    # (these sources return a value: always through Numba)


def _source(scale: int) -> str:
    return (f"# test kernel (helpers {cache.helpers_hash()})\n"
            "from numba import njit\n\n\n"
            "@njit(cache=True, nogil=True)\n"
            f"def kernel(x):\n    return x * {scale}\n")


@pytest.fixture(name="fresh_dir")
def _fresh_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HLOEXEC_CACHE_DIR", str(tmp_path))
    yield tmp_path
    cache.clear_cache(disk=False)       # this test's keys point into tmp_path


def test_keys_and_cache_dir(fresh_dir, monkeypatch):
    a, b = _source(3), _source(5)
    assert cache.source_key(a) != cache.source_key(b) and len(cache.source_key(a)) == 24
    assert cache.source_key(a) == cache.source_key(_source(3))
    assert cache.source_key(a, "p").startswith("p") and len(cache.source_key(a, "p")) == 24
    assert cache.cache_dir() == fresh_dir
    monkeypatch.delenv("HLOEXEC_CACHE_DIR")
    assert cache.cache_dir().parts[-3:] == (".cache", "hloexec", "kernels")


def test_kernel_loaded_twice_is_written_and_imported_once(fresh_dir):
    source = _source(7)
    key = cache.source_key(source, "t")
    fn = cache.load_kernel(source, key, SIGNATURE)
    path = fresh_dir / f"hx_{key}.py"
    assert path.read_text() == source and str(fresh_dir) in sys.path
    mtime, module = path.stat().st_mtime_ns, sys.modules[f"hx_{key}"]
    assert cache.load_kernel(source, key, SIGNATURE) is fn
    assert path.stat().st_mtime_ns == mtime and sys.modules[f"hx_{key}"] is module
    assert fn(np.arange(3)).tolist() == [0, 7, 14]
    assert sum(fn.stats.cache_misses.values()) == 1      # compiled, then saved to the disk cache

    # forgotten in-process only: the module is imported again, its machine code comes from the disk cache
    cache.clear_cache(disk=False)
    assert f"hx_{key}" not in sys.modules and path.exists()
    again = cache.load_kernel(source, key, SIGNATURE)
    assert again is not fn
    assert again(np.arange(3)).tolist() == [0, 7, 14]
    assert sum(again.stats.cache_hits.values()) == 1 and sum(again.stats.cache_misses.values()) == 0

    # forgotten on disk too: written and compiled anew
    cache.clear_cache(disk=True)
    assert not path.exists() and not (fresh_dir / "__pycache__").exists()
    fresh = cache.load_kernel(source, key, SIGNATURE)
    assert fresh(np.arange(3)).tolist() == [0, 7, 14]
    assert path.exists() and sum(fresh.stats.cache_misses.values()) == 1


def test_stale_source_under_a_key_is_rewritten(fresh_dir):
    """A file holding other text under the key (an interrupted writer of an older version) is replaced."""
    source = _source(11)
    key = cache.source_key(source, "t")
    (fresh_dir / f"hx_{key}.py").write_text(_source(13))
    fn = cache.load_kernel(source, key, SIGNATURE)
    assert fn(np.arange(2)).tolist() == [0, 11]
    assert (fresh_dir / f"hx_{key}.py").read_text() == source
    assert not list(fresh_dir.glob(".hx_*.tmp"))
