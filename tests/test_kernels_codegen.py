"""hloexec.kernels.codegen: blocks place statements where the generators rely on it (before a block being built,
in the deepest block defining what they use) and render as indented source; index expressions render as the
source the generators write and fold, when they hold no name, to the value that source has (Python's integer
semantics, which Numba's int64 indices share here)."""
import itertools

import numpy as np
import pytest

from hloexec.errors import TierUnsupported
from hloexec.kernels.codegen import Block, Ix, index_src, innermost, is_name, need, row_major_strides


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


def test_statements_go_to_the_deepest_block_defining_what_they_use():
    """The fusion generator's placement: a statement lands in the innermost block among those defining its
    names -- before a loop still being built -- so it runs once per iteration of that block only."""
    root = Block()
    root.insert("base = 100")
    rows = root.open("for i in range(3):", trips=3)
    cols = rows.open("for j in range(4):", trips=4)
    defined_in = {"base": root, "i": rows, "j": cols}

    def place(line, names):
        innermost(root, names, defined_in).insert(line)
    place("out.append((row, j))", ["row", "j"])
    place("row = base + i * 10", ["base", "i"])         # while cols is open: before it
    place("log.append(base)", ["base"])                 # before the rows loop
    place("log.append(-1)", [])
    rows.close(cols)
    rows.insert("log.append(i)")                        # after the closed loop
    assert innermost(root, ["x", "i", "j"], defined_in) is cols and innermost(cols, ["i"], defined_in) is cols
    assert cols.total_trips() == 12 and rows.total_trips() == 3

    source = "\n".join(root.render())
    assert source == "\n".join([
        "base = 100",
        "log.append(base)",
        "log.append(-1)",
        "for i in range(3):",
        "    row = base + i * 10",
        "    for j in range(4):",
        "        out.append((row, j))",
        "    log.append(i)"])
    env = {"out": [], "log": []}
    exec(source, env)                                   # noqa: S102  (the rendered block is runnable)
    assert env["out"] == [(100 + 10 * i, j) for i in range(3) for j in range(4)]
    assert env["log"] == [100, -1, 0, 1, 2]


def test_render_indents_and_fills_empty_blocks():
    root = Block()
    assert root.render(1) == ["    pass"]                # an empty function body
    guard = root.open("if x > 0:", is_guard=True)
    root.close(guard)
    loop = root.open("for i in range(2):")
    loop.insert("y = i")
    root.close(loop)
    assert root.render(1) == ["    if x > 0:", "        pass", "    for i in range(2):", "        y = i"]


def test_take_and_insert_before_move_lines_out_of_a_block():
    """The loop generator's allocation hoisting: lines taken from a loop and its inner blocks, in source order,
    go just before it; what is added afterwards still goes at the end."""
    root = Block()
    root.insert("n = 0")
    loop = root.open("while n < 3:")
    loop.insert("a = [0]")
    inner = loop.open("if n:")
    inner.insert("b = [1]")
    inner.insert("c = a + b")
    loop.close(inner)
    loop.insert("n += 1")
    root.close(loop)
    for line in loop.take(str, lambda line: line.endswith("]")):
        root.insert_before(loop, line)
    root.insert("done = True")
    assert root.render() == ["n = 0", "a = [0]", "b = [1]", "while n < 3:", "    if n:", "        c = a + b",
                             "    n += 1", "done = True"]
