"""hloexec.options: one value for the numerics rules and limits; device profiles read from files."""
from __future__ import annotations

import json

import numpy as np
import pytest

import hloexec
from hloexec.errors import ExecutionError, OptionError
from hloexec.options import Options, device_profile

SUM = """HloModule s
add { a = f16[] parameter(0)  b = f16[] parameter(1)  ROOT s = f16[] add(a, b) }
ENTRY e { x = f16[4096] parameter(0)  z = f16[] constant(0)  ROOT r = f16[] reduce(x, z), dimensions={0}, to_apply=add }
"""


def test_keywords_override_the_device_and_reach_the_run():
    exe = hloexec.load(SUM, reductions="per-step", use_numba=False)
    assert exe.options.reductions == "per-step" and exe.options.device.name == "reference"
    x = np.full(4096, 1, np.float16)
    # per-step: the f16 running sum sticks at 2048 (2048 + 1 rounds back); accumulate: exact 4096
    assert float(exe.run(x)) == 2048
    assert float(hloexec.load(SUM, use_numba=False).run(x)) == 4096
    same = hloexec.load(SUM, options=exe.options, use_numba=False)
    assert same.options == exe.options


def test_a_profile_file_takes_its_base_and_is_checked(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('base = "reference"\nreductions = "per-step"\n')
    p = device_profile(str(f))
    assert p.name == "mine" and p.reductions == "per-step" and p.honor_algorithm
    assert Options.make(str(f)).reductions == "per-step"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"reductions": "sideways"}))
    with pytest.raises(ExecutionError, match="bad.json: reductions = 'sideways'"):
        device_profile(str(bad))
    typo = tmp_path / "typo.toml"
    typo.write_text("honour_algorithm = true\n")
    with pytest.raises(ExecutionError, match="unknown rule.*honour_algorithm"):
        device_profile(str(typo))
    with pytest.raises(ExecutionError, match="not a built-in profile"):
        device_profile("no-such-device")


def test_a_profile_prints_as_a_file_it_reads_back(tmp_path):
    ref = device_profile("reference")
    f = tmp_path / "copy.toml"
    f.write_text(ref.to_toml())
    back = device_profile(str(f))
    assert [r[:2] for r in back.rules()] == [r[:2] for r in ref.rules()]


SMALL = "HloModule small\n\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT r = f32[4] negate(p)\n}\n"


@pytest.mark.parametrize("option, choices", [
    ("reductions", "'accumulate', 'per-step', 'xla-cpu'"),
    ("compile", "'background', 'eager', 'never'"),
    ("excess_precision", "False, True"),            # "junk" was taken as True
])
def test_a_load_option_of_a_value_it_does_not_take_is_an_option_error_listing_them(option, choices):
    with pytest.raises(OptionError) as info:
        hloexec.load(SMALL, **{option: "junk"})
    assert isinstance(info.value, ValueError)       # what callers caught before
    assert str(info.value) == f"{option}='junk': expected one of {choices}"
    assert (info.value.option, info.value.value) == (option, "junk")


@pytest.mark.parametrize("option, choices", [("runner", "'threads', 'ray'"), ("groups", "'auto'")])
def test_a_run_spmd_option_of_a_value_it_does_not_take_is_an_option_error(option, choices):
    exe = hloexec.load(SMALL)
    with pytest.raises(OptionError, match=f"{option}='junk': expected one of {choices}"):
        exe.run_spmd([exe.random_inputs(0)], 1, 1, **{option: "junk"})


def test_hloexec_jax_options_of_a_value_they_do_not_take_are_option_errors():
    jax = pytest.importorskip("jax")
    import hloexec.jax

    with pytest.raises(OptionError, match="stage='late': expected one of 'pre', 'opt'"):
        hloexec.jax.lower(jax.numpy.negative, np.ones(2, np.float32), stage="late")
    with pytest.raises(OptionError, match="reference='gpu': expected one of 'xla', 'shadow'"):
        hloexec.jax.check(jax.numpy.negative, np.ones(2, np.float32), reference="gpu")
