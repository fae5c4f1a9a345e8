"""hloexec's pytest plugin, as a user's test suite sees it (pytester runs each suite): the `hlo_reference` fixture,
the tolerance options, the `hloexec` marker, pytest-xdist."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "test_with_hloexec.py"
pytestmark = pytest.mark.xla


@pytest.fixture(autouse=True)
def imported_once():
    """pytester's in-process runs drop the modules they imported when they end: jaxlib cannot be imported twice
    in one process (it aborts), so what the suites use is imported here first."""
    pytest.importorskip("jax")
    import jax.numpy  # noqa: F401
    import hloexec.jax  # noqa: F401
    import hloexec.tools.compare  # noqa: F401
    import hloexec.tools.xla_cpu  # noqa: F401

TANH_MODULE = '''"""HloModule tanh
ENTRY e {
  x = f32[1000] parameter(0)
  ROOT t = f32[1000] tanh(x)
}"""'''

SUITE = f'''
import jax
import jax.numpy as jnp
import numpy as np
import pytest

X = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
TANH = {TANH_MODULE}


def layer(x, w):
    return jnp.tanh(x @ w), jnp.sum(x)


def test_function_matches(hlo_reference):
    w = np.ones((1000, 3), np.float32) / 1000
    out = hlo_reference(layer, X[None, :], w)
    assert isinstance(out, tuple) and out[0].shape == (1, 3)


def test_module_matches_xla(hlo_reference):
    assert hlo_reference(TANH, X).shape == (1000,)


def test_module_against_wrong_expected(hlo_reference):
    hlo_reference(TANH, X, expected=np.tanh(X) * 1.01)


@pytest.mark.hloexec
def test_marked_jits_are_checked():
    step = jax.jit(lambda x: (x * 2, jnp.tanh(x)))
    assert type(step).__name__ == "_Checked"
    step(X)


@pytest.mark.hloexec(atol=0, rtol=0)
def test_marked_at_zero_tolerance():
    jax.jit(jnp.tanh)(X)        # XLA:CPU's tanh polynomial and numpy's differ in the last bits
'''


def test_the_bundled_example_suite_passes(pytester):
    """examples/test_with_hloexec.py, which the README shows, as a user runs it."""
    pytester.copy_example(str(EXAMPLE))
    result = pytester.runpytest("-p", "no:cacheprovider", EXAMPLE.name)
    result.assert_outcomes(passed=5)


def test_fixture_and_marker_report_like_compare(pytester):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    # the wrong expected: compare's table, the worst elements, the module named
    assert "hloexec's outputs of tanh differ from the reference" in out
    assert "output 0: worst elements" in out and "FAIL: 1 of 1 outputs differ" in out
    # the marker at zero tolerance: the jitted function named, its table
    assert "hloexec differs from jax on tanh" in out


def test_tolerance_options_replace_the_defaults(pytester):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("-p", "no:cacheprovider", "--hloexec-atol", "0.1", "--hloexec-rtol", "0.1",
                                "-k", "wrong_expected or function_matches")
    result.assert_outcomes(passed=2)


def test_works_under_xdist(pytester):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "-k", "not zero_tolerance")
    result.assert_outcomes(passed=3, failed=1)


def _dumped(to, fn, *args):
    import hloexec.jax
    return hloexec.jax.dump(fn, *args, to=to)


def test_dump_directory_becomes_test_items(pytester, tmp_path):
    """--hloexec-dumps: each dumped module an item (before vs after optimizations, dumped inputs); an optimized
    program edited to compute something else fails with compare's table; xdist runs them too."""
    import jax.numpy as jnp
    good, bad = tmp_path / "good", tmp_path / "bad"
    x = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    _dumped(good, lambda x: jnp.tanh(x @ x.T).sum(axis=0), x)
    _dumped(good, lambda x: (jnp.exp(x) * 2, jnp.max(x)), x)
    paths = _dumped(bad, lambda x: jnp.exp(x) * 3, x)
    text = paths["after"].read_text()
    assert "constant(3)" in text
    paths["after"].write_text(text.replace("constant(3)", "constant(3.01)"))

    result = pytester.runpytest("-p", "no:cacheprovider", "--hloexec-dumps", str(good), "-v")
    result.assert_outcomes(passed=2)
    assert "::module_" in result.stdout.str()
    result = pytester.runpytest("-p", "no:cacheprovider", "--hloexec-dumps", str(good), "--hloexec-dumps", str(bad))
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    assert "cpu_after_optimizations.txt vs" in out and "FAIL: 1 of 1 outputs differ" in out
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hloexec-dumps", str(good))
    result.assert_outcomes(passed=2)


def test_a_dumped_module_without_an_hlo_stage_fails_naming_its_files(pytester, tmp_path):
    """module_0009..txt (no stage hloexec reads): its item failed with an IndexError inside the plugin (found by
    the hostile-input audit); now with the DumpError `hloexec run DIR --module 9` gives."""
    (tmp_path / "module_0009..txt").write_text("x")
    result = pytester.runpytest("-p", "no:cacheprovider", "--hloexec-dumps", str(tmp_path))
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "has no HLO dump (only: module_0009..txt)" in out and "IndexError" not in out, out


def test_dump_option_names_a_directory_without_dumps(pytester, tmp_path):
    result = pytester.runpytest("-p", "no:cacheprovider", "--hloexec-dumps", str(tmp_path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "no module dumps" in result.stderr.str() + result.stdout.str()


SHARDED_DUMPS = '''
import sys
sys.path.insert(0, {tests!r})
import hloexec.jax
from test_spmd import programs
for name in ("data_parallel", "model_parallel"):
    fn, args, _ = programs()[name]
    hloexec.jax.dump(fn, *args, to=sys.argv[1])
'''


def test_partitioned_dumps_run_every_participant(pytester, tmp_path):
    """Dumps of programs sharded over 8 host devices: the optimized (partitioned) module runs 8 participants, its
    outputs assembled by sharding and compared with the program before optimizations run as one."""
    from conftest import write_with_host_devices
    script = tmp_path / "dump_sharded.py"
    script.write_text(SHARDED_DUMPS.format(tests=str(Path(__file__).parent)))
    dumps = write_with_host_devices(str(script), tmp_path / "sharded")
    assert "num_partitions=8" in next(dumps.glob("*data_parallel*after_optimizations.txt")).read_text()
    result = pytester.runpytest("-p", "no:cacheprovider", "--hloexec-dumps", str(dumps))
    result.assert_outcomes(passed=2)


SHADOW_SUITE = f'''
import jax
import jax.numpy as jnp
import numpy as np
import pytest

TANH = {TANH_MODULE}
X = np.random.default_rng(0).standard_normal(1000).astype(np.float32)


def layernorm_loss(x, g, b):
    m = jnp.mean(x, axis=-1, keepdims=True)
    v = jnp.mean((x - m) ** 2, axis=-1, keepdims=True)
    return jnp.sum(((x - m) / jnp.sqrt(v + 1e-5) * g + b) ** 2)


rng = np.random.default_rng(0)
ARGS = (rng.standard_normal((2, 32, 256)).astype(np.float16), (1 + 0.1 * rng.standard_normal(256)).astype(np.float16),
        (0.1 * rng.standard_normal(256)).astype(np.float16))


def test_f16_gradient(hlo_reference):
    hlo_reference(jax.grad(layernorm_loss, argnums=(0, 1, 2)), *ARGS)


def test_f16_gradient_per_call(hlo_reference):
    hlo_reference(jax.grad(layernorm_loss, argnums=(0, 1, 2)), *ARGS, reference="shadow")


def test_module_three_percent_off(hlo_reference):
    hlo_reference(TANH, X, expected=np.tanh(X) * 1.03, reference="shadow")
'''


def test_shadow_reference_passes_a_correct_f16_result_and_fails_a_wrong_one(pytester):
    """XLA:CPU's f16 layernorm gradient differs from hloexec's beyond compare's f16 tolerance; judged against the
    exact answer (--hloexec-reference shadow, or reference="shadow" per call) both are as close as f16 allows.
    A module's expected outputs 3% off are not, whatever the session's reference."""
    pytester.makepyfile(test_suite=SHADOW_SUITE)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "test_f16_gradient FAILED" in out or "FAILED test_suite.py::test_f16_gradient " in out
    assert "expected" in out and "NOT consistent" in out
    result = pytester.runpytest("-p", "no:cacheprovider", "--hloexec-reference", "shadow")
    result.assert_outcomes(passed=2, failed=1)
    assert "FAILED test_suite.py::test_module_three_percent_off" in result.stdout.str()
    result = pytester.runpytest("-p", "no:cacheprovider", "--hloexec-reference", "shadow", "--hloexec-atol", "1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_dump_items_run_again_by_the_node_id_pytest_prints(pytester, tmp_path):
    """A dump item's node id (DIR/<its first stage's file>::module_NNNN), given back to pytest, runs that
    module alone; the directory given by a path relative to where pytest runs, as a user types it."""
    import re

    import jax.numpy as jnp
    dumps = pytester.path / "dumps"
    x = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    _dumped(dumps, lambda x: jnp.tanh(x).sum(axis=0), x)
    _dumped(dumps, lambda x: jnp.exp(x) * 2, x)
    result = pytester.runpytest("-p", "no:cacheprovider", "--hloexec-dumps", "dumps", "-v")
    result.assert_outcomes(passed=2)
    ids = re.findall(r"^(\S+::module_\S+) PASSED", result.stdout.str(), re.MULTILINE)
    assert len(ids) == 2 and all(i.startswith("dumps/module_") for i in ids), result.stdout.str()
    result = pytester.runpytest("-p", "no:cacheprovider", "--hloexec-dumps", "dumps", ids[1], "-v")
    result.assert_outcomes(passed=1)
    assert ids[1] in result.stdout.str() and ids[0] not in result.stdout.str()
