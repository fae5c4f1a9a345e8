"""Shared pytest fixtures and markers for hloexec.

* ``SHARED``: the ``shared/`` folder beside the checkout (repo_root/../shared),
  overridable with the env var HLOEXEC_SHARED.
* ``shared_path(*parts)`` (plain helper and fixture): a path inside SHARED, or
  ``pytest.skip`` when SHARED (or the file) is absent.
* ``kernel_cache_dir`` (autouse, session): HLOEXEC_CACHE_DIR points at a fresh directory shared by the
  xdist workers of one run, so compiled fused kernels start cold but each is compiled once per run.
* ``op_cases_in_every_tier`` (autouse, module): the op tests' cases run through every tier of hloexec.
* ``ray_cluster`` (session): a simulated Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head
  without CPUs and RAY_NODES nodes of 1 CPU and 12 GB each), joined by this process; skips without Ray
  (``pip install .[ray]``). One per test session: Ray takes seconds to start.
* ``numba_registries`` (autouse, session): Numba's CPU target loads its further typing and lowering registries
  (numba.np.polynomial...) before any test. Tests that run pytest in-process (``pytester.runpytest``) restore
  ``sys.modules`` after it, dropping the modules Numba imported lazily during that run while its registries keep
  what they registered: the next kernel load imports them again and fails ("duplicate registration for
  PolynomialType"), and every kernel load after it in that process.
* markers: ``xla`` (needs jax/jaxlib, the XLA:CPU reference; auto-skipped when
  jax is not importable) and ``slow``.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = REPO_ROOT / "examples"
SHARED = Path(os.environ.get("HLOEXEC_SHARED") or (REPO_ROOT.parent / "shared")).resolve()

_SHARED_MISSING = "../shared not found (it sits beside the checkout in CI; set HLOEXEC_SHARED)"
_JAX_MISSING = "jax not installed: pip install .[test]"


@pytest.fixture(autouse=True, scope="session")
def numba_registries():
    from numba.core.registry import cpu_target

    cpu_target.target_context.refresh()


def headless_browser() -> str | None:
    """A headless Chromium to load the reports' pages in (apt-get install chromium-headless-shell), or None."""
    import shutil
    return next((shutil.which(b) for b in ("chromium-headless-shell", "chromium", "chromium-browser",
                                           "google-chrome") if shutil.which(b)), None)


def shared_path(*parts: str) -> Path:
    """Path inside the shared folder; skips the calling test when it is absent."""
    if not SHARED.is_dir():
        pytest.skip(_SHARED_MISSING)
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not found in shared folder {SHARED}")
    return p


@pytest.fixture(name="shared_path")
def _shared_path_fixture():
    """Fixture form: ``def test_x(shared_path): p = shared_path("seeds", "a.hlo")``."""
    return shared_path


@pytest.fixture(autouse=True, scope="session")
def kernel_cache_dir(tmp_path_factory):
    # basetemp's parent is common to all xdist workers of a run
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    path = root / "hloexec-kernels"
    path.mkdir(exist_ok=True)
    old = os.environ.get("HLOEXEC_CACHE_DIR")
    os.environ["HLOEXEC_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("HLOEXEC_CACHE_DIR", None)
    else:
        os.environ["HLOEXEC_CACHE_DIR"] = old


@pytest.fixture(autouse=True, scope="module")
def op_cases_in_every_tier():
    """The cases an op test module runs through op_helpers.run (the numpy tier, checked against XLA:CPU by the
    tests themselves) go through every other tier of hloexec at the end of the module (tests/tiers.py)."""
    import op_helpers
    op_helpers.RECORDED = recorded = []
    yield
    op_helpers.RECORDED = None
    if recorded:
        from tiers import sweep_op_cases
        problems = sweep_op_cases(recorded)

        assert not problems, f"{len(problems)} op cases differ between tiers:\n" + "\n".join(problems[:20])


def write_with_host_devices(script: str, out: Path, devices: int = 8) -> Path:
    """Run `python script OUT` in a child whose XLA:CPU has `devices` host devices (XLA_FLAGS must be set before
    jax starts, and this process may already run jax with one): how the multi-device tests write their jax
    programs, inputs and outputs. Returns `out`."""
    import subprocess
    import sys
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, script, str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def jax_available() -> bool:
    return importlib.util.find_spec("jax") is not None and importlib.util.find_spec("jaxlib") is not None


def pytest_configure(config):
    config.addinivalue_line("markers", "xla: needs jax/jaxlib (XLA:CPU reference); skipped without jax")
    config.addinivalue_line("markers", "slow: slow test (deselect with -m 'not slow')")


def pytest_collection_modifyitems(config, items):
    if jax_available():
        return
    skip = pytest.mark.skip(reason=_JAX_MISSING)
    for item in items:
        if "xla" in item.keywords:
            item.add_marker(skip)


RAY_NODES = 4


@pytest.fixture(scope="session")
def ray_cluster():
    # set before Ray is imported: no usage reports, the cluster on the loopback interface only, and no worker
    # killed by Ray's memory monitor when the (shared) machine is nearly full: a test fails by its own errors
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    ray = pytest.importorskip("ray", reason="Ray not installed: pip install .[ray]")
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                            "object_store_memory": 256 << 20})
    for _ in range(RAY_NODES):
        # 'memory' is what Ray schedules by (not a limit): enough for a worker of 8 GPT-seed participants
        cluster.add_node(num_cpus=1, memory=12 << 30, object_store_memory=512 << 20, wait=False)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()
