"""Malformed custom-calls: every built-in target, called with operand lists and results it does not take
(missing or extra operands, tuples, scalars, non-square or mismatched matrices, wrong result tuples), gives a
result or a clear hloexec error, never an internal exception (IndexError, AttributeError...) and never a
crash. The LAPACK calls write into buffers sized from the operands' dims, so a shape breaking jaxlib's ABI
would corrupt memory instead of raising: the sweep runs in a child process with glibc's heap checks on
(MALLOC_CHECK_=3), where such a write aborts the child.

    python tests/test_custom_call_malformed.py [--every-config] [TARGET ...]   # the sweep alone; prints the failures

By default each operand list and result meets one of the configs (a third of the calls, CI's size); `-m slow` and
--every-config make every call.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import warnings

import pytest

OPERANDS = [(), ("f32[]",), ("(f32[4], s32[])",), ("f32[4,8]",), ("f32[8,8]",), ("f32[2,8,8]", "s32[8]"),
            ("f32[8,8]", "f32[3]"), ("f32[8,8]", "f32[8]", "f32[4,8]"), ("f32[8]",) * 3 + ("f32[8,2]",),
            ("f16[2,4,8,16]",) * 3, ("f32[8]", "s32[2]", "pred[4]", "f32[]", "f32[4,8]", "s32[8]")]
RESULTS = ["f32[4,8]", "f32[]", "(f32[4,8], s32[4])", "(f32[8,8], s32[8], s32[])",
           "(f32[4,8], f32[4], f32[4,4], f32[8,8], s32[])"]
# every one-letter option LAPACK calls read, set two ways (else most calls stop at the missing attribute)
CONFIGS = ["", ", backend_config={mode = 65 : ui8, uplo = 76 : ui8, side = 76 : ui8, trans_x = 78 : ui8, "
               "diag = 78 : ui8, compute_left = 86 : ui8, compute_right = 86 : ui8, sort = 78 : ui8, lower = true}",
           ", backend_config={mode = 83 : ui8, uplo = 85 : ui8, side = 82 : ui8, trans_x = 84 : ui8, "
               "diag = 85 : ui8, compute_left = 78 : ui8, compute_right = 78 : ui8, sort = 78 : ui8, "
               "lower = false, compute_uv = false, transposed = true, low = 2 : i64, high = 3 : i64}"]


def module_text(target: str, operands, result: str, config: str) -> str:
    params = "".join(f"  p{i} = {s} parameter({i})\n" for i, s in enumerate(operands))
    args = ", ".join(f"p{i}" for i in range(len(operands)))
    return (f"HloModule m\nENTRY e {{\n{params}  ROOT c = {result} custom-call({args}), "
            f'custom_call_target="{target}"{config}\n}}\n')


def calls(every_config: bool):
    """(operands, result, config) of the sweep: every config with every operand list and result, or (CI's size)
    one config each, in turn, so that each config still meets every result and every operand list."""
    pairs = list(itertools.product(OPERANDS, RESULTS))
    if every_config:
        return [(o, r, c) for o, r in pairs for c in CONFIGS]
    return [(o, r, CONFIGS[k % len(CONFIGS)]) for k, (o, r) in enumerate(pairs)]


def sweep(targets, every_config: bool = True) -> list[dict]:
    """The calls of `targets` that raised something other than an hloexec error: target, exception, text."""
    import hloexec
    from hloexec import errors
    from hloexec.exec.inputs import random_inputs
    clear = (errors.HloParseError, errors.UnsupportedError, errors.ExecutionError)
    failures = []
    warnings.simplefilter("ignore")
    for target in targets:
        for operands, result, config in calls(every_config):
            text = module_text(target, operands, result, config)
            try:
                executable = hloexec.load(text)
                executable.run(*random_inputs(executable.module))
            except clear:
                pass
            except Exception as e:  # noqa: BLE001 - any other exception is the bug this test looks for
                failures.append({"target": target, "error": f"{type(e).__name__}: {e}", "text": text})
    return failures


def distinct_targets(targets) -> list[str]:
    """The targets minus those sharing another's prepare and differing only in the type they take or the
    vendor they name (lapack_d/c/z*_ffi as lapack_s*_ffi, hip* as cu*): the sweep's operands are f32."""
    return sorted(t for t in targets if not t.startswith(("lapack_d", "lapack_c", "lapack_z", "hip", "__hip")))


def test_the_ci_sized_sweep_pairs_every_config_with_every_operand_list_and_result():
    few, every = calls(every_config=False), calls(every_config=True)
    assert len(every) == len(OPERANDS) * len(RESULTS) * len(CONFIGS) == 3 * len(few)
    assert {(o, c) for o, _, c in few} == set(itertools.product(OPERANDS, CONFIGS))
    assert {(r, c) for _, r, c in few} == set(itertools.product(RESULTS, CONFIGS))


@pytest.mark.parametrize("every_config", [pytest.param(True, marks=pytest.mark.slow), False])
def test_every_target_refuses_malformed_calls_clearly(every_config):
    from hloexec.ops.custom_call import CUSTOM_CALLS
    env = dict(os.environ, MALLOC_CHECK_="3", MALLOC_PERTURB_="165")
    flag = ["--every-config"] if every_config else []
    child = subprocess.run([sys.executable, __file__, *flag, *distinct_targets(CUSTOM_CALLS)], env=env,
                           capture_output=True, text=True, timeout=1200)
    assert child.returncode == 0, f"the sweep's process died ({child.returncode}): {child.stderr[-2000:]}"
    failures = json.loads(child.stdout.splitlines()[-1])
    by_target = {f["target"]: f for f in failures}
    assert not failures, f"{len(failures)} malformed calls raised internal errors, e.g.\n" + "\n".join(
        f"{t}: {f['error']}\n{f['text']}" for t, f in list(by_target.items())[:5])


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(sweep([a for a in args if a != "--every-config"], every_config="--every-config" in args)))
