"""The scalar-semantics table (hloexec/kernels/semantics.py) means one thing: for every opcode and type it defines,
its numpy form (the op-by-op tier) and its Numba source form (the generated kernels) agree bit for bit on edge
values -- within a few ULP where a definition calls a libm-approximated function (exp, sin, ...), whose two
implementations may differ in the last bits. NaN results agree bit for bit (sign and payload) except where
several operands are NaN: which one comes out is unspecified (IEEE 754)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hloexec.kernels import elementwise as ew
from hloexec.kernels import numpy_form, semantics

_FLOAT_EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -2.5, 2.5, 3.0, -7.0, 100.0, 1e30, -1e30, np.inf, -np.inf]
# the kernels' types tested, and their class (f16 / bf16 compute as f32: the table's forms are the same)
_TYPES = {
    "f32": "float",
    "f64": "float",
    "s8": "signed",
    "s32": "signed",
    "s64": "signed",
    "u8": "unsigned",
    "u32": "unsigned",
    "u64": "unsigned",
    "pred": "pred",
}
APPROX_ULP = 4


def _edges(name: str) -> np.ndarray:
    dtype = ew.STORAGE[name]
    if name == "pred":
        return np.array([False, True])
    if name in ew.FLOATS:
        info = np.finfo(dtype)
        extra = [info.smallest_subnormal, -info.smallest_subnormal, info.tiny, info.max, -info.max, np.nan]
        x = np.array(_FLOAT_EDGES + extra, dtype)
        return np.concatenate([x, -x[-1:]])  # and a negative NaN
    bits = ew.BITS[name]
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if name in ew.SIGNED else (0, (1 << bits) - 1)
    vals = {0, 1, -1, 2, -2, 3, 7, -7, lo, lo + 1, hi, hi - 1, bits - 1, bits, bits + 1, 2 * bits, 100}
    return np.array([v % (1 << bits) for v in sorted(vals)], np.uint64).astype(f"u{bits // 8}").view(dtype)


def _operands(name: str, n: int) -> list[np.ndarray]:
    """Every combination of `n` edge values, as `n` arrays."""
    e = _edges(name)
    return [np.ascontiguousarray(c) for c in np.array(list(itertools.product(e, repeat=n))).T.astype(e.dtype)]


def _cases(name: str):
    cls = _TYPES[name]
    return sorted(op for op, classes in semantics.DEFINITIONS.items() if cls in classes)


def _compiled(name: str, opcodes: list[str], n: int):
    """A Numba function out[k, i] = opcodes[k](x0[i], ..., x{n-1}[i]) built from the table's source form."""
    from numba import njit

    from hloexec.kernels import scalar

    xs = [f"x{j}" for j in range(n)]
    lines = [f"def f({', '.join(f'a{j}' for j in range(n))}, out):", "    for i in range(a0.shape[0]):"]
    lines += [f"        x{j} = a{j}[i]" for j in range(n)]
    for k, op in enumerate(opcodes):
        src = semantics.numba_src(
            op, _TYPES[name], name, *xs, compute=ew.COMPUTE, bits=ew.BITS[name], literal=ew.literal_src
        )
        lines.append(f"        out[{k}, i] = {src}")
    env = {h: getattr(scalar, h) for h in ew.HELPERS}
    exec(compile("\n".join(lines), f"<table {name}>", "exec"), env)
    return njit(error_model="numpy")(env["f"])


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(f"u{x.dtype.itemsize}") if x.dtype != np.bool_ else x


@pytest.mark.parametrize("name", list(_TYPES))
def test_numpy_and_numba_forms_agree(name):
    cls = _TYPES[name]
    dtype = ew.STORAGE[name]
    checked = 0
    for n in (1, 2, 3):
        opcodes = [op for op in _cases(name) if semantics.arity(op) == n]
        if not opcodes:
            continue
        xs = _operands(name, n)
        out_dtype = [
            np.bool_ if semantics.expression(op, cls, ew.BITS[name]).tag == "bool" else dtype for op in opcodes
        ]
        out = np.zeros((len(opcodes), xs[0].size), dtype)  # a compare's bool stored as 0 / 1
        _compiled(name, opcodes, n)(*xs, out)
        for k, op in enumerate(opcodes):
            with np.errstate(all="ignore"):  # a bare ufunc (exp): the ops wrap it (float_lifted)
                want = numpy_form.numpy_form(op, cls, np.dtype(dtype), ew.BITS[name])(*xs)
            assert want.dtype == out_dtype[k], (op, want.dtype)
            got = out[k].astype(want.dtype)
            expr = semantics.expression(op, cls, ew.BITS[name])
            if semantics.exact(expr) or want.dtype == np.bool_:
                bad = _bits(got) != _bits(want)
                if cls == "float" and want.dtype != np.bool_:
                    # which of several NaN operands comes out is unspecified (IEEE 754): NaN-ness only
                    several = sum(np.isnan(x).astype(int) for x in xs) > 1
                    bad &= ~(several & np.isnan(got) & np.isnan(want))
            else:
                same_nan = np.isnan(got) == np.isnan(want)
                ulps = np.abs(_bits(got).astype(np.int64) - _bits(want).astype(np.int64))
                bad = ~same_nan | (~np.isnan(want) & (ulps > APPROX_ULP) & (got != want))
            where = np.flatnonzero(bad)[:5]
            assert not where.size, (op, name, [(tuple(x[i] for x in xs), want[i], got[i]) for i in where])
            checked += 1
    assert checked == len(_cases(name))


@pytest.mark.parametrize("name", ["s8", "u32", "f32"])
def test_numpy_form_elementwise_on_one_value(name):
    """The numpy form of every definition gives on an array holding one value (every `where` all true or all
    false: only the branch taken is computed) and on a 0-d array what it gives at that element of an array."""
    cls, dtype = _TYPES[name], np.dtype(ew.STORAGE[name])
    for op in _cases(name):
        xs = _operands(name, semantics.arity(op))
        fn = numpy_form.numpy_form(op, cls, dtype, ew.BITS[name])
        with np.errstate(all="ignore"):  # a bare ufunc (add, exp): the ops wrap it (float_lifted)
            whole = fn(*xs)
            for i in range(0, xs[0].size, 7):
                same = fn(*(np.full(numpy_form.LAZY_WHERE_MIN_SIZE, x[i]) for x in xs))
                one = np.asarray(fn(*(np.array(x[i]) for x in xs)))
                assert same.shape == (numpy_form.LAZY_WHERE_MIN_SIZE,) and one.shape == ()
                assert (_bits(same) == _bits(whole[i : i + 1])).all(), (op, [x[i] for x in xs])
                assert _bits(one) == _bits(whole[i : i + 1])[0], (op, [x[i] for x in xs])


def test_numba_forms_of_pred_not_and_shift_amounts():
    """Spot checks of the renderer's tier-specific spelling: pred not is a logical not (~True is -2 in Python);
    an unsigned shift amount needs no cast."""
    kw = dict(compute=ew.COMPUTE, bits=8, literal=ew.literal_src)
    assert semantics.numba_src("not", "pred", "pred", "p", **kw) == "(not p)"
    assert "np.uint8(b)" not in semantics.numba_src("shift-left", "unsigned", "u8", "a", "b", **kw)


@pytest.mark.parametrize("name", ["f16", "s32", "pred"])
def test_select_forms_agree(name):
    """select is in the table for any type: its numpy form is numpy's where, its Numba form a ternary."""
    x = _edges("f32" if name == "f16" else name)
    a, b = (np.ascontiguousarray(v) for v in np.array(list(itertools.product(x, x))).T.astype(x.dtype))
    p = (np.arange(a.size) % 3) == 0
    if name == "f16":
        a, b = a.astype(np.float16), b.astype(np.float16)
    want = numpy_form.numpy_form("select", "any", a.dtype, ew.BITS[name])(p, a, b)
    src = ew.select_src(name, "p[i]", ew.load_src(name, "a[i]"), ew.load_src(name, "b[i]"))
    got = _kernel(
        f"out[i] = {ew.store_src(name, src)}",
        p,
        *(v.view(ew.STORAGE[name]) for v in (a, b)),
        out=np.zeros(a.size, ew.STORAGE[name]),
    )
    assert (_bits(want.view(ew.STORAGE[name])) == _bits(got)).all()


def _kernel(line: str, *arrays, out):
    """Runs `line` (over names p / a / b / x and i) at every index i of Numba-compiled loop; returns out."""
    from numba import njit

    from hloexec.kernels import scalar

    names = "pab" if len(arrays) == 3 else "x"
    env = {h: getattr(scalar, h) for h in ew.HELPERS}
    exec(f"def f({', '.join(names)}, out):\n    for i in range(out.shape[0]):\n        {line}\n", env)
    njit(error_model="numpy")(env["f"])(*arrays, out)
    return out


_CONVERT_TYPES = ("pred", "s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32", "f64")
# values where converts differ: saturation bounds, double rounding through f32, ties, integer wrap-around
_CONVERT_VALUES = [
    2.0**31,
    2.0**31 - 1,
    -(2.0**31),
    -(2.0**31) - 1,
    2.0**63,
    -(2.0**63),
    2.0**64,
    2.0**32,
    127.5,
    128.0,
    -128.5,
    255.5,
    256.0,
    32767.5,
    32768.0,
    65535.0,
    65536.0,
    65504.0,
    65520.0,
    1 + 2**-11 + 2**-40,
    1 + 2**-8 + 2**-40,
    2.0**24 + 1,
    0.75,
    -0.75,
    1e-40,
    -1e-45,
]


def _convert_inputs(name: str) -> np.ndarray:
    from hloexec.ir.dtypes import element_type

    dtype = element_type(name).numpy
    if name in ew.FLOATS:
        with np.errstate(all="ignore"):
            return np.concatenate([_edges("f64"), _CONVERT_VALUES]).astype(dtype)
    edges = _edges(name)
    if name == "pred":
        return edges
    with np.errstate(all="ignore"):
        wide = np.array([v for v in _CONVERT_VALUES if abs(v) < 2.0**64 and v == int(v)]).astype(np.int64)
    return np.concatenate([edges, wide.astype(edges.dtype)])


@pytest.mark.parametrize("src", _CONVERT_TYPES)
def test_convert_forms_agree(src):
    """Both interpreters of the conversion steps (the numpy tier's convert_kernel, the kernels' convert_src) give
    the same bits for every pair of the kernels' types; NaN results the same sign."""
    from hloexec.ir.dtypes import element_type
    from hloexec.ops.elementwise import convert_kernel

    x = _convert_inputs(src)
    for dst in _CONVERT_TYPES:
        want = convert_kernel(element_type(src), element_type(dst), None)(x)
        stored = ew.store_src(dst, ew.convert_src(src, dst, ew.load_src(src, "x[i]")))
        got = _kernel(f"out[i] = {stored}", x.view(ew.STORAGE[src]), out=np.zeros(x.size, ew.STORAGE[dst]))
        want_bits, got_bits = _bits(want.view(ew.STORAGE[dst])), _bits(got)
        bad = want_bits != got_bits
        if dst in ew.FLOATS:  # NaN payloads: the numpy tier's f64 -> f16 makes them canonical
            nan = np.isnan(want.astype(np.float64))
            bad &= ~(
                nan
                & np.isnan(_loaded(got, dst))
                & (np.signbit(want.astype(np.float64)) == np.signbit(_loaded(got, dst)))
            )
        where = np.flatnonzero(bad)[:5]
        assert not where.size, (src, dst, [(x[i], want[i], got[i]) for i in where])


def _loaded(stored: np.ndarray, name: str) -> np.ndarray:
    from hloexec.ir.dtypes import element_type

    return stored.view(element_type(name).numpy).astype(np.float64)
