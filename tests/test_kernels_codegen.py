"""hloexec.kernels.codegen: index expressions render as the source the generators write and fold, when they hold
no name, to the value that source has (Python's integer semantics, which Numba's int64 indices share here)."""
import itertools

import numpy as np
import pytest

from hloexec.errors import TierUnsupported
from hloexec.kernels.codegen import Ix, index_src, is_name, need, row_major_strides


def test_render_and_names():
    e = Ix("+", Ix("*", "i1", 12, paren=False), "x3")
    assert str(e) == "(i1 * 12 + x3)" and e.names() == ["i1", "x3"] and e.folded() is None
    assert str(Ix("-", Ix("+", "i0", Ix("*", "j1", 2, paren=False), paren=False), 3)) == "(i0 + j1 * 2 - 3)"
    assert str(Ix("==", Ix("%", "t", 2, paren=False), 0, paren=False)) == "t % 2 == 0"
    assert Ix("+", "7", "-2").folded() == 5          # literal components as source text
    assert index_src(Ix("+", Ix("*", "0", 4, paren=False), "3")) == "3" and index_src("i2") == "i2"
    assert str(Ix("+", "np.int64(v3)", 1)) == "(np.int64(v3) + 1)"     # other source text is opaque
    assert is_name("lo") and is_name("_k") and not is_name("-2") and not is_name("0") and not is_name(3)


@pytest.mark.parametrize("op", ["+", "-", "*", "//", "%", ">=", "<", "=="])
def test_folding_agrees_with_the_source(op):
    """Every literal expression folds to what its own text evaluates to, negative operands included
    (floor division and modulo round toward -inf, as in the generated code)."""
    values = [-7, -3, -1, 0, 1, 2, 5, 16]
    for a, b, c in itertools.product(values, values, [1, 3, -4]):
        if op in ("//", "%") and b == 0:
            continue
        for e in (Ix(op, a, b), Ix(op, Ix("*", a, c, paren=False), b), Ix(op, Ix("-", a, c), b, paren=False)):
            assert e.folded() == eval(str(e)), str(e)       # noqa: S307  (the oracle: Python reads the source)


def test_need_and_strides():
    need(True, "fine")
    with pytest.raises(TierUnsupported, match="reason"):
        need(False, "reason")
    dims = (3, 1, 4, 5)
    assert row_major_strides(dims) == [s // 8 for s in np.empty(dims, np.float64).strides]
    assert row_major_strides(()) == []
