"""`diff --reference shadow` (tools/diff_bounds.py): a divergence judged by both sides' error bounds. A pass
that reorders a sum changes its rounding, within what both orders' bounds allow; a changed constant is past
them."""
from __future__ import annotations

import json

import numpy as np

import hloexec
from hloexec.tools.cli import main
from hloexec.tools.diff import diff

ADD = "add {\n  p = f16[] parameter(0)\n  q = f16[] parameter(1)\n  ROOT s = f16[] add(p, q)\n}\n"
INDEX_ORDER = "HloModule sums\n" + ADD + """ENTRY e {
  x = f16[4096] parameter(0)
  z = f16[] constant(0)
  ROOT r = f16[] reduce(x, z), dimensions={0}, to_apply=add
}
"""
# the same sum as XLA:CPU's TreeReductionRewriter makes it: windows of 32, then their sums
TREE_ORDER = "HloModule sums\n" + ADD + """ENTRY e {
  x = f16[4096] parameter(0)
  z = f16[] constant(0)
  w = f16[128] reduce-window(x, z), window={size=32 stride=32}, to_apply=add
  ROOT r = f16[] reduce(w, z), dimensions={0}, to_apply=add
}
"""
SCALED = """HloModule scale
ENTRY e {
  x = f32[1024] parameter(0)
  c = f32[] constant(2)
  b = f32[1024] broadcast(c), dimensions={}
  m = f32[1024] multiply(x, b)
  ROOT t = f32[1024] tanh(m)
}
"""


def test_a_reordered_sum_differs_within_both_bounds_a_changed_constant_beyond():
    x = np.random.default_rng(1).standard_normal(4096).astype(np.float16)
    reordered = diff(hloexec.parse(INDEX_ORDER)[0], hloexec.parse(TREE_ORDER)[0], [x], reductions="per-step",
                     reference="shadow")
    (first,) = reordered.first_divergence
    assert first.a_inst.name == first.b_inst.name == "r" and not first.verdict.agree   # f16 roundings differ
    assert first.beyond_bound is False and 0 < first.bound_ratio < 1
    y = np.random.default_rng(2).standard_normal(1024).astype(np.float32)
    edited = diff(hloexec.parse(SCALED)[0], hloexec.parse(SCALED.replace("constant(2)", "constant(2.0001)"))[0],
                  [y], reference="shadow")
    (first,) = edited.first_divergence
    assert first.a_inst.name == "c" and first.beyond_bound is True and first.bound_ratio > 10
    plain = diff(hloexec.parse(INDEX_ORDER)[0], hloexec.parse(TREE_ORDER)[0], [x], reductions="per-step")
    assert plain.first_divergence[0].beyond_bound is None                # not asked: not judged


def test_diff_cli_reference_shadow_says_which_divergence_is_beyond_the_bounds(tmp_path, capsys):
    """Exit 1 for the changed constant; 0 for the reordered sum, whose only divergence is a rounding change."""
    a, b = tmp_path / "a.hlo", tmp_path / "b.hlo"
    a.write_text(SCALED)
    b.write_text(SCALED.replace("constant(2)", "constant(2.0001)"))
    assert main(["diff", str(a), str(b), "--seed", "0", "--reference", "shadow", "--json"]) == 1
    first = json.loads(capsys.readouterr().out)["first_divergence"][0]
    assert first["a"] == "c" and first["beyond_bound"] is True and first["bound_ratio"] > 10
    a.write_text(INDEX_ORDER)
    b.write_text(TREE_ORDER)
    assert main(["diff", str(a), str(b), "--seed", "0", "--reductions", "per-step", "--reference", "shadow"]) == 0
    out = capsys.readouterr().out
    assert "within both sides' error bounds" in out and "a rounding change" in out
