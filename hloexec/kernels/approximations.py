"""XLA:CPU's own f32 approximations of the transcendentals (the `transcendentals = "xla-cpu"` rule of a device
profile): each a definition in the scalar-semantics table's vocabulary (kernels/semantics.py), so it has the
table's two forms -- `numpy_approximation` for the op-by-op tier and `approximation_src`, the Numba helper
kernels/scalar.py makes for the compiled ones.
"""

from __future__ import annotations

import numpy as np

from ..options.devices import machine_vector_width
from .numpy_form import numpy_form
from .semantics import (
    LIBM_F32,
    Expr,
    S,
    T,
    _fn,
    _render,
    abs_,
    arity,
    call,
    copysign,
    expression,
    floor,
    fma,
    isnan,
    to_float,
    to_int,
    where,
)


# -- XLA:CPU's own f32 approximations (the `transcendentals = "xla-cpu"` rule) -----------------------------------
# Read off the LLVM IR and machine code XLA:CPU (jaxlib 0.10.2, x86-64 with AVX-512) emits for f32 exp, log,
# log1p, expm1, tanh and erf (XLA_FLAGS=--xla_dump_to: *.ir-with-opt.ll, *.o): operation by operation in f32,
# each `fmul` whose one user is an `fadd` / `fsub` one FMA with it (LLVM's contraction: vfmadd / vfnmadd in the
# machine code), comparisons as the IR's (a NaN passes the clamps). Sources: xla/codegen/intrinsic (exp, log),
# xla/service/elemental_ir_emitter.cc (log1p, expm1: EmitLog1p, EmitExpm1), xla/service/llvm_ir/math_ops.cc
# (EmitFastTanh), EmitErfF32. f16 goes to libm (expf...) and bf16 is converted to f32 in the HLO already: only
# f32 has these.
def _f32(bits: int) -> float:
    """The f32 value of a bit pattern (how the IR spells its constants: f0x3FB8AA3B)."""
    return float(np.array(bits, np.uint32).view(np.float32))


def _bits(x: int) -> Expr:
    """A 32-bit pattern as a signed-integer constant."""
    return Expr("const", (x - (1 << 32) if x >= 1 << 31 else x,), "S")


def _horner(x: Expr, leading, *coefficients) -> Expr:
    """((leading * x + c0) * x + c1) ... with every step one FMA."""
    acc = leading
    for c in coefficients:
        acc = fma(x, acc if isinstance(acc, Expr) else x._other(acc), x._other(c))
    return acc


def _xla_exp_parts(x: Expr) -> tuple[Expr, Expr]:
    """(y, 2**n) with exp(x) = y * 2**n: x clamped to [-87.8, 88.8], n = floor(x log2(e) + 1/2) clamped to
    [-127, 127], r = x - n ln2 (ln2 in two parts), y = 1 + r + r**2 p(r)."""
    x = where(x < -87.8, -87.8, x)
    x = where(x > 88.8, 88.8, x)
    n = floor(fma(x, x._other(_f32(0x3FB8AA3B)), x._other(0.5)))
    n = where(n < -127, -127, n)
    n = where(n > 127, 127, n)
    r = fma(-n, n._other(_f32(0x3F318000)), x)
    r = fma(-n, n._other(_f32(0xB95E8083)), r)
    p = _horner(r, _f32(0x39506967), _f32(0x3AB743CE), _f32(0x3C088908), _f32(0x3D2AA9C1), _f32(0x3E2AAAAA), 0.5)
    y = fma(p, r * r, r) + 1
    return y, T((to_int(n) << Expr("const", (23,), "S")) + _bits(127 << 23))  # 2**-127 comes out as 0


def _xla_exp(t, x):
    y, scale = _xla_exp_parts(x)
    return y * scale


_TANH_LIMIT = _f32(0x40FFF644)


def _xla_tanh(t, x):
    """A rational approximation on [-7.99, 7.99]: x itself below 0.0004, +-1 from 20 on."""
    c = where(x < -_TANH_LIMIT, -_TANH_LIMIT, x)
    c = where(c > _TANH_LIMIT, _TANH_LIMIT, c)
    c2 = c * c
    p = _horner(
        c2,
        _f32(0xA59F25C0),
        _f32(0x2A61337E),
        _f32(0xAEBD37FF),
        _f32(0x335C0041),
        _f32(0x3779434A),
        _f32(0x3A270DED),
        _f32(0x3BA059DC),
    )
    q = _horner(c2, _f32(0x35A0D3D8), _f32(0x38F895D6), _f32(0x3B14AA05), _f32(0x3BA059DD))
    ax = abs_(x)
    r = where(ax < 0.0004, x, c * p / q)
    return where(ax >= 20, copysign(x._other(1), x), r)


def _xla_log_of(u: Expr) -> Expr:
    """log(u): u = 2**e m, m in [sqrt(1/2), sqrt(2)), f = m - 1, log(u) = f - f**2 / 2 + f**3 P(f) + e ln2
    (Cephes' logf); below the least normal u is taken as it (no subnormal), 0 gives -inf, inf inf, a negative u
    or NaN the NaN of all ones bits."""
    bits = S(where(u > _f32(0x00800000), u, _f32(0x00800000)))
    e = to_float((bits >> Expr("const", (23,), "S")) - Expr("const", (127,), "S")) + 1
    m = T((bits & _bits(0x807FFFFF)) | _bits(0x3F000000))
    low = m < _f32(0x3F3504F3)
    f = (m - 1) + where(low, m, 0)
    e = e - where(low, e._other(1), 0)
    f2 = f * f
    f3 = f2 * f
    a = _horner(f, _f32(0x3D9021BB), _f32(0xBDEBD1B8), _f32(0x3DEF251A))
    b = _horner(f, _f32(0xBDFE5D4F), _f32(0x3E11E9BF), _f32(0xBE2AAE50))
    c = _horner(f, _f32(0x3E4CCEAC), _f32(0xBE7FFFFC), _f32(0x3EAAAAAA))
    tail = fma(fma(fma(a, f3, b), f3, c), f3, e * _f32(0xB95E8083))
    r = fma(e, e._other(_f32(0x3F318000)), fma(f2._other(-0.5), f2, f) + tail)
    r = where(u > 0, r, T(_bits(0xFFFFFFFF)))
    r = where(u == 0, -np.inf, r)
    return where(u == np.inf, np.inf, r)


def _xla_log(t, x):
    return _xla_log_of(x)


def _xla_log1p(t, x):
    """log(1 + x), but x + x**3 P(x) / Q(x) - x**2 / 2 for |x| < 0.4142 (XLA's EmitLog1p)."""
    x0 = x * 0  # the IR's leading coefficient: 0 * x (NaN for inf)
    q = _horner(
        x,
        x0 + 1,
        _f32(0x417101AD),
        _f32(0x42A6185B),
        _f32(0x435DC32D),
        _f32(0x439A8CA3),
        _f32(0x43586D8A),
        _f32(0x42707982),
    )
    p = _horner(
        x,
        x0 + 4.527e-05,
        _f32(0x3EFF40C5),
        _f32(0x40D284FA),
        _f32(0x41EF4B9C),
        _f32(0x4273CC76),
        _f32(0x426473AD),
        _f32(0x41A05101),
    )
    x2 = x * x
    small = x + fma(x2._other(-0.5), x2, x * x2 * (p / q))
    return where(abs_(x) < _f32(0x3ED413CD), small, _xla_log_of(x + 1))


def _xla_expm1(t, x):
    """exp(x) - 1 for |x| > 1/2, else tanh(x / 2) (exp(x) + 1) (XLA's EmitExpm1); x itself at +-0."""
    y, scale = _xla_exp_parts(x)
    ex = y * scale
    h = x * 0.5
    r = where(abs_(x) > 0.5, ex - 1, _xla_tanh(None, h) * (ex + 1))
    return where(h == 0, x, r)


def _xla_erf(t, x):
    """x P(x**2) / Q(x**2), +-1 from |x| = 3.832 on."""
    x2 = x * x
    p = _horner(x2, _f32(0x39702D51), _f32(0x3B5F5DA2), _f32(0x3D50B6EB), _f32(0x3E3DA740), _f32(0x3F906EBA))
    q = _horner(
        x2,
        _f32(0xB3FD3906),
        _f32(0x37C588DF),
        _f32(0x3A856D28),
        _f32(0x3C6687D4),
        _f32(0x3DE34C21),
        _f32(0x3EFEB44A),
        1.0,
    )
    return where(abs_(x) >= _f32(0x407547CB), copysign(x._other(1), x), x * p / q)


# XLA:CPU's f32 rsqrt refines the estimate by two Newton steps on AVX-512 machines and by one on AVX2 ones (jaxlib
# 0.10.2's code read off both: Intel Xeon, AMD Zen 3; every bit of tests/test_xla_cpu_transcendentals.py's sweep)
RSQRT_NEWTON_STEPS = 2 if machine_vector_width() == 16 else 1


def _xla_rsqrt(t, x):
    """rsqrtss's estimate y, then RSQRT_NEWTON_STEPS Newton steps y + (y / -2) (x y y - 1); the estimate itself
    for 0, inf, a negative x and subnormals."""
    y0 = y = call("rsqrt_estimate", x)
    for _ in range(RSQRT_NEWTON_STEPS):
        y = fma(y * -0.5, fma(x * y, y, x._other(-1)), y)
    return where(((x >= _f32(0x00800000)) & (x < np.inf)) | isnan(x), y, y0)


def _xla_logistic(t, x):
    # 1 / (1 + exp(-x)): LLVM contracts exp's last multiply (by a power of 2: exact but for subnormals) with the add
    return 1 / (_xla_exp(t, -x) + 1)


# opcode -> its float definition under transcendentals = "xla-cpu" (f32 only)
XLA_CPU_APPROXIMATIONS = {
    "exponential": _xla_exp,
    "log": _xla_log,
    "log-plus-one": _xla_log1p,
    "exponential-minus-one": _xla_expm1,
    "tanh": _xla_tanh,
    "erf": _xla_erf,
    "logistic": _xla_logistic,
    "rsqrt": _xla_rsqrt,
    **{op: _fn(function) for op, function in LIBM_F32.items()},
}


def approximated(opcode: str, element_type_name: str, transcendentals: str) -> bool:
    """Whether `opcode` on `element_type_name` computes its device's own approximation under the
    `transcendentals` rule (hloexec.options.devices.TRANSCENDENTALS) rather than the table's definition."""
    return transcendentals == "xla-cpu" and element_type_name == "f32" and opcode in XLA_CPU_APPROXIMATIONS


def numpy_approximation(opcode: str):
    """The numpy function of XLA:CPU's f32 approximation of `opcode` on float32 arrays."""
    return numpy_form(opcode, "float", np.dtype(np.float32), 32, XLA_CPU_APPROXIMATIONS[opcode])


def approximation_src(opcode: str, function: str, *, compute: dict, literal) -> str:
    """Source of a Numba function `function(x0, ...)` computing XLA:CPU's f32 approximation of `opcode`, one statement
    per node (its expression shares subexpressions, which a one-expression snippet would repeat). Every `where`
    computes both of its values: the approximations' are safe on any input."""
    names: dict[int, str] = {}
    args = [f"x{i}" for i in range(arity(opcode))]
    lines = [f"def {function}({', '.join(args)}):"]

    def name_of(e: Expr) -> str:
        if id(e) not in names:
            if e.op in ("arg", "const"):
                names[id(e)] = _render(e, args, "float", "f32", 32, compute, literal)
            else:
                children = [a for a in e.args if isinstance(a, Expr)]
                refs = [name_of(a) for a in children]
                shallow = Expr(
                    e.op,
                    tuple(
                        Expr("arg", (refs.index(names[id(a)]),), a.tag) if isinstance(a, Expr) else a for a in e.args
                    ),
                    e.tag,
                )
                names[id(e)] = f"t{len(lines)}"
                lines.append(f"    t{len(lines)} = {_render(shallow, refs, 'float', 'f32', 32, compute, literal)}")
        return names[id(e)]

    lines.append(f"    return {name_of(expression(opcode, 'float', 32, XLA_CPU_APPROXIMATIONS[opcode]))}")
    return "\n".join(lines)
