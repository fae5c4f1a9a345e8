"""xla_builder.* calls (XLA's builder-library functions kept as calls) and Transformer Engine's softmax.

XLA's own tests (../shared/corpus/xla/xla__hlo__builder__tests__*.hlo) give each call without a body and, in
their FileCheck lines, the body XLA's expansion pass builds for it. Both rules are checked against that body
run on XLA:CPU: the call without a body (hloexec's implementation of the name) and the call carrying the
body (hloexec runs it)."""
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import hloexec
from hloexec.errors import UnsupportedError
from hloexec.tools.xla_cpu import run_on_xla_cpu

from conftest import shared_path

pytestmark = pytest.mark.xla
jax.config.update("jax_enable_x64", True)

_NAME = re.compile(r"%\[\[\$?([\w.]+)(?::\[\^ \]\+)?\]\]")


def sections(path):
    """(FileCheck lines, module text) per `// -----` section of a FileCheck test file."""
    for part in path.read_text().split("// -----"):
        lines = part.splitlines()
        checks = [ln for ln in lines if ln.startswith("// CHECK")]
        module = "\n".join(ln for ln in lines if not ln.startswith("//")).strip()
        if module:
            yield checks, module


def _tuple_elements(shape: str) -> list[str]:
    """The top-level element shapes of a tuple shape's text."""
    inner, depth, parts, cur = shape.strip()[1:-1], 0, [], ""
    for ch in inner:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [re.sub(r"/\*index=\d+\*/", "", p).strip() for p in parts + [cur]]


def expansion(checks):
    """The computations the FileCheck lines spell out: {name: text}, names as in the lines; `%x#k` (a tuple
    element, as newer XLA prints it) becomes a get-tuple-element."""
    comps, current, shapes = {}, None, {}
    for line in checks:
        body = re.sub(r"^// CHECK(?:-NEXT|-LABEL)?:\s*", "", line)
        if body.startswith("HloModule"):
            continue
        if body.startswith("ENTRY"):
            current = None
            continue
        header = re.fullmatch(r"%\[\[\$([\w.]+):\[\^ \]\+\]\]", body)
        if header:
            current = header.group(1)
            comps[current] = []
            continue
        if current is None:
            continue
        text = _NAME.sub(lambda m: "%" + m.group(1), body)
        m = re.match(r"(?:ROOT )?%([\w.]+) = (\(.*?\)|\S+) ", text)
        if m:
            shapes[m.group(1)] = m.group(2)
        for name, k in sorted(set(re.findall(r"%([\w.]+)#(\d+)", text))):
            if f"{name}.{k}" not in shapes:
                shapes[f"{name}.{k}"] = element = _tuple_elements(shapes[name])[int(k)]
                comps[current].append(f"  %{name}.{k} = {element} get-tuple-element(%{name}), index={k}")
        comps[current].append("  " + re.sub(r"%([\w.]+)#(\d+)", r"%\1.\2", text))
    return {name: f"%{name} {{\n" + "\n".join(lines) + "\n}\n" for name, lines in comps.items()}


def _builder(comps):
    body = next(n for n in comps if n.startswith("xla_builder"))
    return body, "".join(text for n, text in comps.items() if n != body)


def with_body(module, comps):
    """The module with its custom-call carrying the builder's body (XLA's expanded form)."""
    body, helpers = _builder(comps)
    head, rest = module.split("\n", 1)
    called = re.sub(r'(custom_call_target="xla_builder[^"]*")', rf"\1, called_computations={{%{body}}}", rest)
    return f"{head}\n\n{helpers}{comps[body]}\n{called}"


def called_module(module, comps):
    """The module with the builder's body called in place of the custom-call (what XLA:CPU runs)."""
    body, helpers = _builder(comps)
    head, rest = module.split("\n", 1)
    rest = re.sub(r'custom-call\((.*?)\), custom_call_target="xla_builder[^"]*"(, backend_config="[^"]*")?',
                  rf"call(\1), to_apply=%{body}", rest)
    return f"{head}\n\n{helpers}{comps[body]}\n{rest}"


DOMAINS = {   # valid inputs per parameter, by function
    "Polygamma": [lambda rs, n: rs.randint(0, 4, n), lambda rs, n: rs.uniform(0.3, 6, n)],
    "IgammaGradA": [lambda rs, n: rs.uniform(0.3, 5, n), lambda rs, n: rs.uniform(0.1, 8, n)],
    "RandomGammaGrad": [lambda rs, n: rs.uniform(0.3, 5, n), lambda rs, n: rs.uniform(0.1, 8, n)],
    "RegularizedIncompleteBeta": [lambda rs, n: rs.uniform(0.3, 5, n), lambda rs, n: rs.uniform(0.3, 5, n),
                                  lambda rs, n: rs.uniform(0.02, 0.98, n)],
    "Acosh": [lambda rs, n: rs.uniform(1, 6, n)],
    "Acos": [lambda rs, n: rs.uniform(-1, 1, n)],
    "Asin": [lambda rs, n: rs.uniform(-1, 1, n)],
}
EXACT = {"NextAfter", "ScramblePhiloxKey", "GetMatrixDiagonalViaGather"}
FILES = ["math_acos", "math_acosh", "math_asin", "math_asinh", "math_atan", "math_cosh", "math_next_after",
         "math_polygamma", "math_igamma_grad_a", "math_random_gamma_grad", "math_regularized_incomplete_beta",
         "matrix_einsum", "prng_scramble_philox_key"]


def _inputs(exe, fn, rs):
    out = []
    for i, p in enumerate(exe.parameters):
        dt, dims = p.shape.dtype, tuple(p.shape.dims)
        gens = DOMAINS.get(fn)
        if np.dtype(dt).kind == "u":
            v = rs.randint(0, 2 ** 62, size=dims, dtype=np.uint64).astype(dt)
        elif gens is not None and i < len(gens) and np.dtype(dt).kind != "c":
            v = np.asarray(gens[i](rs, int(np.prod(dims)))).reshape(dims).astype(dt)
        elif np.dtype(dt).kind == "c":
            v = (rs.standard_normal(dims) + 1j * rs.standard_normal(dims)).astype(dt)
        else:
            v = np.asarray(rs.standard_normal(dims), np.float32).astype(dt)
        out.append(np.asarray(v))
    return out


def _close(got, want, fn, dt):
    if fn == "Acosh" and np.dtype(dt).kind == "c":      # XLA's formula may give -acosh: compare cosh of both
        got, want = np.cosh(got.astype(np.complex128)), np.cosh(want.astype(np.complex128))
    if fn in EXACT or np.dtype(dt).kind in "ui":
        np.testing.assert_array_equal(np.atleast_1d(got).view(np.uint8), np.atleast_1d(want).view(np.uint8))
        return
    real = np.finfo(np.dtype(dt).char.lower()) if np.dtype(dt).kind == "c" else ml_dtypes.finfo(dt)
    tol = 1e-4 if fn in DOMAINS and fn not in ("Acos", "Asin", "Acosh") else 64 * float(real.eps)
    np.testing.assert_allclose(got.astype(np.complex128), want.astype(np.complex128), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", FILES)
def test_builder_call_with_and_without_its_body_matches_xla_running_the_body(name):
    path = shared_path("corpus", "xla", f"xla__hlo__builder__tests__{name}.hlo")
    fn = None
    for checks, module in sections(path):
        comps = expansion(checks)
        if not comps:
            continue
        fn = re.search(r'custom_call_target="xla_builder\.\w+\.(\w+)"', module).group(1)
        bodyless = hloexec.load(module)
        if "fnuz" in module:             # XLA's own parser rejects this section's layout; hloexec runs it
            continue
        reference = called_module(module, comps)
        embodied = hloexec.load(with_body(module, comps))
        rs = np.random.RandomState(0)
        for _ in range(8 if bodyless.parameters and not bodyless.parameters[0].shape.dims else 1):
            args = _inputs(bodyless, fn, rs)
            want = np.asarray(run_on_xla_cpu(reference, args)[0])
            dt = want.dtype
            _close(np.asarray(bodyless.run(*args)), want, fn, dt)
            _close(np.asarray(embodied.run(*args)), want, fn, dt)
    assert fn is not None


def test_next_after_bits_in_every_float_type():
    """Against numpy's nextafter (f16/f32/f64) and, for the 8-bit types, stepping through the value table."""
    from hloexec.ops.custom_call.composite import next_after
    for dt in (np.float16, np.float32, np.float64):
        x = np.array([0.0, -0.0, 1.0, -1.0, 3.5, np.inf, -np.inf, np.nan, 1e-30, 5.0], dt)
        y = np.array([1.0, -1.0, 2.0, -2.0, -1.0, 0.0, np.inf, 1.0, -1.0, 5.0], dt)
        np.testing.assert_array_equal(next_after(x, y), np.nextafter(x, y))
    for dt in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2fnuz, ml_dtypes.bfloat16):
        finite = np.array(sorted({float(v) for v in np.arange(256, dtype=np.uint8 if np.dtype(dt).itemsize == 1
                                  else np.uint16).view(dt).astype(np.float32) if np.isfinite(v)}), np.float32)
        finite = finite[np.abs(finite) < 1e30].astype(dt)
        up = next_after(finite[:-1], np.full(finite.size - 1, finite[-1], dt))
        np.testing.assert_array_equal(up.astype(np.float32), finite[1:].astype(np.float32))


def test_tridiagonal_solver_is_thomas_on_xla_layouts():
    """Both forms against a dense solve: (diagonals [3, M], rhs [M, K]) and (lower, main, upper [1, M],
    rhs [K, M]); the corpus module runs too."""
    rs = np.random.RandomState(0)
    m, k = 6, 3
    sub, main, sup = rs.randn(m), rs.randn(m) + 5, rs.randn(m)
    dense = np.diag(main) + np.diag(sup[:-1], 1) + np.diag(sub[1:], -1)
    rhs = rs.randn(m, k)
    text2 = ("HloModule t\nENTRY e {\n  d = f64[3,6] parameter(0)\n  r = f64[6,3] parameter(1)\n"
             "  ROOT x = f64[6,3] custom-call(d, r), custom_call_target=\"xla_builder.tridiagonal.TridiagonalSolver\"\n}\n")
    got = hloexec.load(text2).run(np.stack([sup, main, sub]), rhs)
    np.testing.assert_allclose(got, np.linalg.solve(dense, rhs), rtol=1e-12)
    text4 = ("HloModule t\nENTRY e {\n  l = f64[1,6] parameter(0)\n  d = f64[1,6] parameter(1)\n"
             "  u = f64[1,6] parameter(2)\n  r = f64[3,6] parameter(3)\n  ROOT x = f64[3,6] custom-call(l, d, u, r), "
             "custom_call_target=\"xla_builder.tridiagonal.TridiagonalSolver\"\n}\n")
    got = hloexec.load(text4).run(sub[None], main[None], sup[None], rhs.T.copy())
    np.testing.assert_allclose(got, np.linalg.solve(dense, rhs).T, rtol=1e-12)
    path = shared_path("corpus", "xla", "xla__hlo__builder__tests__tridiagonal_tridiagonal_solve.hlo")
    for _, module in sections(path):
        exe = hloexec.load(module)
        exe.run(*exe.random_inputs(0))


def test_diagonal_via_gather_and_a_body_of_the_wrong_shape():
    text = ("HloModule t\nENTRY e {\n  x = f32[2,3,4] parameter(0)\n  ROOT d = f32[2,3] custom-call(x), "
            "custom_call_target=\"xla_builder.matrix.GetMatrixDiagonalViaGather\"\n}\n")
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(hloexec.load(text).run(x), np.diagonal(x, axis1=1, axis2=2))
    path = shared_path("corpus", "xla", "xla__hlo__builder__tests__matrix_get_matrix_diagonal_via_gather.hlo")
    (checks, module), = sections(path)
    with pytest.raises(UnsupportedError, match=r"returns f32\[2\], the call says f32\[2,2\]"):
        hloexec.load(module)            # XLA's test writes the call's shape wrong
    with pytest.raises(UnsupportedError, match=r"body returns f32\[2\], the call f32\[2,2\]"):
        hloexec.load(with_body(module, expansion(checks)))


def _te_module(target, shapes, out, scale):
    params = "\n".join(f"  p{i} = {s} parameter({i})" for i, s in enumerate(shapes))
    args = ", ".join(f"p{i}" for i in range(len(shapes)))
    return (f"HloModule te\nENTRY e {{\n{params}\n  ROOT c = {out} custom-call({args}), custom_call_target=\"{target}\", "
            f"api_version=API_VERSION_TYPED_FFI, backend_config={{scale_factor = {scale:e} : f64}}\n}}\n")


def test_transformer_engine_scaled_softmax_forward_and_backward_against_jax():
    rs = np.random.RandomState(0)
    x = rs.randn(2, 3, 4, 8).astype(ml_dtypes.bfloat16)
    shape = "bf16[2,3,4,8]"
    y = hloexec.load(_te_module("te_scaled_softmax_forward_ffi", [shape], shape, 0.2)).run(x)
    want = jax.nn.softmax(jnp.asarray(x, jnp.float32) * 0.2, axis=-1).astype(jnp.bfloat16)
    np.testing.assert_array_equal(y.astype(np.float32), np.asarray(want, np.float32))
    corpus = shared_path("corpus", "xla", "xla__tools__multihost_hlo_runner__data__transformer_engine_softmax.hlo")
    exe = hloexec.load(corpus)
    (arg,) = exe.random_inputs(0)
    got = exe.run(arg)
    np.testing.assert_allclose(got.astype(np.float32), np.asarray(jax.nn.softmax(
        jnp.asarray(arg, jnp.float32) * 0.2, axis=-1)), atol=1e-2)
    dy = rs.randn(2, 3, 4, 8).astype(np.float32)
    y32 = np.asarray(jax.nn.softmax(jnp.asarray(x, jnp.float32) * 0.2, axis=-1))
    grad = hloexec.load(_te_module("te_scaled_softmax_backward_ffi", ["f32[2,3,4,8]"] * 2, "f32[2,3,4,8]", 0.2)
                        ).run(dy, y32)
    _, vjp = jax.vjp(lambda v: jax.nn.softmax(v * 0.2, axis=-1), jnp.asarray(x, jnp.float32))
    np.testing.assert_allclose(grad, np.asarray(vjp(dy)[0]), rtol=1e-5, atol=1e-6)
    causal = hloexec.load(_te_module("te_scaled_upper_triang_masked_softmax_forward_ffi", ["f32[2,4,4]"],
                                     "f32[2,4,4]", 0.5)).run(dy[0, :2, :, :4].copy())
    mask = np.tril(np.ones((4, 4), bool))
    want = jax.nn.softmax(jnp.where(mask, dy[0, :2, :, :4] * 0.5, -jnp.inf), axis=-1)
    np.testing.assert_allclose(causal, np.asarray(want), rtol=1e-6, atol=1e-7)
