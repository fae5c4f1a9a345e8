"""The domains random inputs are drawn from (hloexec/exec/domains.py): a parameter reaching sqrt, rsqrt, log or a
divisor through ops that keep a positive value positive is drawn positive (across fusions and calls); one used
as an index is drawn in bounds; one converted to pred is a 0/1 mask; a path through anything else constrains
nothing. Judged against XLA:CPU: on the inputs drawn, the program makes no NaN."""
from __future__ import annotations

import numpy as np
import pytest

import hloexec
from hloexec.exec.domains import input_domains
from hloexec.exec.inputs import random_inputs

DOMAINS = """HloModule domains

fused_divide {
  a = f32[16] parameter(0)
  d = f32[16] parameter(1)
  ROOT q = f32[16] divide(a, d)
}

take_log {
  p = f32[16] parameter(0)
  ROOT l = f32[16] log(p)
}

ENTRY main {
  v = f32[16] parameter(0)
  g = f32[16] parameter(1)
  x = f32[16] parameter(2)
  d = f32[16] parameter(3)
  l = f32[16] parameter(4)
  i = s32[] parameter(5)
  m = s32[16] parameter(6)
  c = f32[16] parameter(7)
  decay = f32[] constant(0.999)
  decay_b = f32[16] broadcast(decay), dimensions={}
  kept = f32[16] multiply(decay_b, v)
  gg = f32[16] multiply(g, g)
  v2 = f32[16] add(kept, gg)
  s = f32[16] sqrt(v2)
  centred = f32[16] subtract(x, g)
  r = f32[16] rsqrt(centred)
  dd = f32[16] convert(d)
  q = f32[16] fusion(s, dd), kind=kLoop, calls=fused_divide
  lg = f32[16] call(l), to_apply=take_log
  eps = f32[] constant(1e-6)
  eps_b = f32[16] broadcast(eps), dimensions={}
  floored = f32[16] maximum(c, eps_b)
  sc = f32[16] sqrt(floored)
  slice = f32[4] dynamic-slice(v, i), dynamic_slice_sizes={4}
  mask = pred[16] convert(m)
  zero = f32[16] broadcast(eps), dimensions={}
  masked = f32[16] select(mask, q, zero)
  ROOT out = (f32[16], f32[16], f32[16], f32[16], f32[4], f32[16]) tuple(r, masked, lg, sc, slice, s)
}
"""


@pytest.fixture(scope="module")
def module():
    return hloexec.parse(DOMAINS)[0]


def test_each_parameter_gets_the_domain_its_uses_imply(module):
    domains = {module.entry.parameters[k].name: d for k, d in input_domains(module).items()}
    assert {n: d.kind for n, d in domains.items()} == {
        "v": "positive", "d": "positive", "l": "positive", "i": "index", "m": "boolean"}
    # g reaches sqrt only squared, x only through a subtract, c only through a maximum with a positive constant
    assert domains["v"].reason == "reaches sqrt %s through multiply, add"
    assert domains["d"].reason == "reaches divide %q through convert"     # inside the fusion
    assert domains["l"].reason == "reaches log %l"                        # inside the called computation
    assert domains["i"].bound == 12 and "dynamic-slice %slice" in domains["i"].reason
    assert "%mask" in domains["m"].reason


def test_random_inputs_are_drawn_in_their_domains_and_the_rest_as_before(module):
    names = [p.name for p in module.entry.parameters]
    values = dict(zip(names, random_inputs(module, seed=3)))
    for name in ("v", "d", "l"):
        assert (values[name] > 0).all(), name
    for name in ("g", "x", "c"):
        assert (values[name] < 0).any(), name           # standard normal: 16 draws, some negative
    assert set(np.unique(values["m"])) <= {0, 1} and len(np.unique(values["m"])) == 2
    assert 0 <= int(values["i"]) <= 12


def test_on_inputs_drawn_in_their_domains_xla_makes_no_nan_where_it_did_before(module):
    """Differential: XLA:CPU runs the program on the inputs; the sqrt of v and the log of l are real numbers."""
    pytest.importorskip("jax")
    from hloexec.tools.xla_cpu import run_on_xla_cpu
    names = [p.name for p in module.entry.parameters]
    for seed in range(3):
        inputs = random_inputs(module, seed=seed)
        outputs = run_on_xla_cpu(DOMAINS, inputs)
        assert np.isfinite(outputs[2]).all() and np.isfinite(outputs[5]).all()
        unconstrained = random_inputs(module, seed=seed, domains={})
        assert (unconstrained[names.index("v")] < 0).any()     # what the old draw fed it


def test_a_scaled_square_constrains_nothing():
    """Adam's `(0.001 * g) * g` (jax writes g**2 so after a convert): non-negative whatever g's sign."""
    module = hloexec.parse("""HloModule square
ENTRY main {
  g = f16[8] parameter(0)
  v = f32[8] parameter(1)
  g32 = f32[8] convert(g)
  c = f32[] constant(0.001)
  cb = f32[8] broadcast(c), dimensions={}
  scaled = f32[8] multiply(g32, cb)
  sq = f32[8] multiply(scaled, g32)
  cube = f32[8] multiply(sq, g32)
  s = f32[8] add(v, sq)
  root_s = f32[8] sqrt(s)
  root_cube = f32[8] sqrt(cube)
  ROOT r = (f32[8], f32[8]) tuple(root_s, root_cube)
}
""")[0]
    domains = input_domains(module)
    # v through the add; g only through the cube (an odd power keeps its sign), not through the square
    assert sorted(domains) == [0, 1] and domains[0].reason == "reaches sqrt %root_cube through convert, multiply"
    assert domains[1].reason == "reaches sqrt %root_s through add"
