"""A family of generated HLO while-loop programs for the tier tests (tests/test_tiers.py).

`loop_program(seed)` writes a module whose entry runs a while loop carrying a counter and several arrays,
each step computing every carried array from the old ones at once (parallel assignment: `a' = a + b,
b' = a - b`), through the ways a compiled loop could alias a buffer it reads and writes in one step:

* carried values swapped, carried twice, or passed through unchanged;
* dynamic-update-slice and scatter that may write their operand in place -- scatter's updates and indices
  may be that very operand (`scatter(x, i, x)`);
* conditionals whose branch returns its argument (the result is then the same buffer as the operand),
  next to an in-place update of that operand;
* calls (a callee may write what the caller is done with);
* nested while loops, up to three deep, whose carried values are the outer loop's;
* values that do not depend on the carried state (hoisted out of the loop).

Element types are s32 (wrapping arithmetic) and f32 (IEEE add/subtract/multiply by small values, max): every
op is exact, so every tier must give the same bits.
"""
from __future__ import annotations

import numpy as np

N = 5                    # elements of every carried array


class _Comp:
    """One computation being written: its lines and a name counter shared by the module."""

    def __init__(self, module: "_Module", name: str, params: list[tuple[str, str]], result: str):
        self.module, self.name, self.result = module, name, result
        self.lines = [f"  %{p} = {t} parameter({k})" for k, (p, t) in enumerate(params)]
        self.signature = f"({', '.join(f'{p}: {t}' for p, t in params)}) -> {result}"

    def add(self, shape: str, expr: str) -> str:
        name = self.module.fresh()
        self.lines.append(f"  %{name} = {shape} {expr}")
        return name

    def text(self, root: str) -> str:
        """The computation returning `root` (the last line, else a copy of it)."""
        lines = list(self.lines)
        if lines[-1].startswith(f"  %{root} ="):
            lines[-1] = "  ROOT" + lines[-1][1:]
        else:
            lines.append(f"  ROOT %{self.module.fresh()} = {self.result} copy(%{root})")
        return f"%{self.name} {self.signature} {{\n" + "\n".join(lines) + "\n}\n"


class _Module:
    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.n = 0
        self.computations: list[str] = []
        self.helpers_written: set[str] = set()

    def fresh(self, prefix: str = "v") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def helper(self, name: str, text: str) -> str:
        if name not in self.helpers_written:
            self.helpers_written.add(name)
            self.computations.append(text)
        return name


def _scalar_helpers(m: _Module, et: str) -> tuple[str, str]:
    add = m.helper(f"add_{et}", f"%add_{et} (a: {et}[], b: {et}[]) -> {et}[] {{\n  %a = {et}[] parameter(0)\n"
                                f"  %b = {et}[] parameter(1)\n  ROOT %r = {et}[] add(%a, %b)\n}}\n")
    set_ = m.helper(f"set_{et}", f"%set_{et} (a: {et}[], b: {et}[]) -> {et}[] {{\n  %a = {et}[] parameter(0)\n"
                                 f"  ROOT %b = {et}[] parameter(1)\n}}\n")
    return add, set_


def _branches(m: _Module, et: str) -> tuple[str, str]:
    t = f"{et}[{N}]"
    ident = m.helper(f"ident_{et}", f"%ident_{et} (a: {t}) -> {t} {{\n  ROOT %a = {t} parameter(0)\n}}\n")
    neg = m.helper(f"neg_{et}", f"%neg_{et} (a: {t}) -> {t} {{\n  %a = {t} parameter(0)\n"
                               f"  ROOT %n = {t} negate(%a)\n}}\n")
    return ident, neg


MAX_DEPTH = 2            # of an expression
MAX_NESTING = 2          # loops inside the outer loop


def _expr(m: _Module, c: _Comp, values: dict, et: str, counter: str, depth: int, nest: int = 0) -> str:
    """A value of type et[N] computed from `values` (name -> element type) in computation `c`, itself
    `nest` loops deep."""
    t = f"{et}[{N}]"
    same = [v for v, e in values.items() if e == et]
    other = [v for v, e in values.items() if e != et]
    choices = ["leaf", "leaf", "binary", "binary", "unary", "convert", "dus", "scatter", "select", "conditional",
               "call", "invariant"] + (["loop"] if nest < MAX_NESTING else [])
    choice = m.pick(choices) if depth < MAX_DEPTH else "leaf"
    if choice == "leaf" or (choice == "convert" and not other):
        return m.pick(same) if same else c.add(t, f"convert(%{m.pick(other)})")
    if choice == "convert":
        return c.add(t, f"convert(%{m.pick(other)})")
    if choice == "unary":
        x = _expr(m, c, values, et, counter, depth + 1, nest)
        op = m.pick(["negate", "reverse", "copy"])
        return c.add(t, f"{op}(%{x})" + (", dimensions={0}" if op == "reverse" else ""))
    if choice == "binary":
        a = _expr(m, c, values, et, counter, depth + 1, nest)
        b = _expr(m, c, values, et, counter, depth + 1, nest)
        op = m.pick(["add", "subtract", "multiply", "maximum"] + (["xor"] if et == "s32" else []))
        if op == "multiply" and et == "f32":      # keep magnitudes bounded: multiply by 0.5 or -1
            k = c.add("f32[]", f"constant({m.pick(['0.5', '-1'])})")
            b = c.add(t, f"broadcast(%{k}), dimensions={{}}")
        return c.add(t, f"{op}(%{a}, %{b})")
    if choice == "dus":                            # writes its operand in place when that is free
        x = _expr(m, c, values, et, counter, depth + 1, nest)
        src = _expr(m, c, values, et, counter, depth + 1, nest)
        k = int(m.rng.integers(1, N))
        piece = c.add(f"{et}[{k}]", f"slice(%{src}), slice={{[0:{k}]}}")
        start = c.add("s32[]", f"remainder(%{counter}, %{c.add('s32[]', 'constant(3)')})")
        return c.add(t, f"dynamic-update-slice(%{x}, %{piece}, %{start})")
    if choice == "scatter":                        # updates (and indices) may be the operand itself
        x = _expr(m, c, values, et, counter, depth + 1, nest)
        upd = x if m.chance(0.5) else _expr(m, c, values, et, counter, depth + 1, nest)
        perm = m.rng.permutation(N)
        idx = c.add(f"s32[{N},1]", "constant({" + ", ".join(f"{{{int(p)}}}" for p in perm) + "})")
        add, set_ = _scalar_helpers(m, et)
        return c.add(t, f"scatter(%{x}, %{idx}, %{upd}), update_window_dims={{}}, inserted_window_dims={{0}}, "
                        f"scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=%{m.pick([add, set_])}")
    if choice == "select":
        a = _expr(m, c, values, et, counter, depth + 1, nest)
        b = _expr(m, c, values, et, counter, depth + 1, nest)
        p = c.add(f"pred[{N}]", f"compare(%{a}, %{b}), direction=LT")
        return c.add(t, f"select(%{p}, %{b}, %{a})")
    if choice == "conditional":                    # an identity branch: the result is the operand's buffer
        x = _expr(m, c, values, et, counter, depth + 1, nest)
        ident, neg = _branches(m, et)
        two = c.add("s32[]", "constant(2)")
        parity = c.add("s32[]", f"remainder(%{counter}, %{two})")
        zero = c.add("s32[]", "constant(0)")
        p = c.add("pred[]", f"compare(%{parity}, %{zero}), direction=EQ")
        result = c.add(t, f"conditional(%{p}, %{x}, %{x}), true_computation=%{ident}, false_computation=%{neg}")
        if m.chance(0.7):                          # and an in-place update of the operand beside it
            one = c.add(f"{et}[1]", f"constant({{{'7' if et == 's32' else '7.5'}}})")
            upd = c.add(t, f"dynamic-update-slice(%{x}, %{one}, %{zero})")
            return c.add(t, f"add(%{result}, %{upd})")
        return result
    if choice == "call":
        args = sorted(values)
        callee = _Comp(m, m.fresh("callee"), [(a, f"{values[a]}[{N}]") for a in args] + [("ctr", "s32[]")], t)
        root = _expr(m, callee, dict(values), et, "ctr", depth + 1, nest)
        m.computations.append(callee.text(root))
        return c.add(t, f"call({', '.join(f'%{a}' for a in args)}, %{counter}), to_apply=%{callee.name}")
    if choice == "invariant":                      # no dependence on the carried state: hoisted
        k = c.add("s32[]", f"constant({int(m.rng.integers(1, 9))})")
        i = c.add(f"s32[{N}]", "iota(), iota_dimension=0")
        b = c.add(f"s32[{N}]", f"broadcast(%{k}), dimensions={{}}")
        inv = c.add(f"s32[{N}]", f"multiply(%{i}, %{b})")
        inv = inv if et == "s32" else c.add(t, f"convert(%{inv})")
        if m.chance(0.5):                          # alone: an in-place update around it must copy it
            return inv
        return c.add(t, f"add(%{_expr(m, c, values, et, counter, depth + 1, nest)}, %{inv})")
    # a nested loop over some of the values, returning one of its carried values
    inits = {m.fresh("w"): m.pick(["s32", "f32"]) for _ in range(int(m.rng.integers(0, 2)))}
    init_vals = [_expr(m, c, values, e, counter, depth + 1, nest) for e in inits.values()]
    inits[m.fresh("w")] = et
    init_vals.append(_expr(m, c, values, et, counter, depth + 1, nest))
    state = _loop(m, inits, trips=int(m.rng.integers(1, 4)), nest=nest + 1)
    zero = c.add("s32[]", "constant(0)")
    init = c.add(state, f"tuple(%{zero}, {', '.join(f'%{v}' for v in init_vals)})")
    w = c.add(state, f"while(%{init}), condition=%{m.loop_cond}, body=%{m.loop_body}")
    picks = [k for k, e in enumerate(inits.values(), 1) if e == et]
    return c.add(t, f"get-tuple-element(%{w}), index={m.pick(picks)}")


def _loop(m: _Module, carried: dict, trips: int, nest: int) -> str:
    """Write the condition and body of a loop over (s32 counter, carried...); returns the state shape and
    leaves their names in m.loop_cond / m.loop_body."""
    names = list(carried)
    state = f"(s32[], {', '.join(f'{carried[v]}[{N}]' for v in names)})"
    body = _Comp(m, m.fresh("body"), [("s", state)], state)
    i = body.add("s32[]", "get-tuple-element(%s), index=0")
    values = {}
    for k, v in enumerate(names, 1):
        body.lines.append(f"  %{v} = {carried[v]}[{N}] get-tuple-element(%s), index={k}")
        values[v] = carried[v]
    new = []
    for v in names:                                # every new value from the old ones (parallel update)
        r = m.rng.random()
        if r < 0.15:
            new.append(m.pick([w for w in names if carried[w] == carried[v]]))    # passed through, swapped, twice
        else:
            new.append(_expr(m, body, values, carried[v], i, 1 if nest else 0, nest))
    one = body.add("s32[]", "constant(1)")
    i1 = body.add("s32[]", f"add(%{i}, %{one})")
    root = body.add(state, f"tuple(%{i1}, {', '.join(f'%{v}' for v in new)})")
    m.computations.append(body.text(root))
    cond = _Comp(m, m.fresh("cond"), [("s", state)], "pred[]")
    j = cond.add("s32[]", "get-tuple-element(%s), index=0")
    n = cond.add("s32[]", f"constant({trips})")
    lt = cond.add("pred[]", f"compare(%{j}, %{n}), direction=LT")
    m.computations.append(cond.text(lt))
    m.loop_cond, m.loop_body = cond.name, body.name
    return state


def loop_program(seed: int, trips: int | None = None) -> tuple[str, list]:
    """(module text, inputs) of generated loop program `seed`; `trips`: the outer loop's trip count."""
    m = _Module(np.random.default_rng(seed))
    carried = {m.fresh("x"): m.pick(["s32", "f32"]) for _ in range(int(m.rng.integers(2, 4)))}
    state = _loop(m, carried, trips=trips or int(m.rng.integers(2, 6)), nest=0)
    params = list(carried)
    entry = [f"  %{p} = {carried[p]}[{N}] parameter({k})" for k, p in enumerate(params)]
    entry += ["  %zero = s32[] constant(0)",
              f"  %init = {state} tuple(%zero, {', '.join(f'%{p}' for p in params)})",
              f"  ROOT %loop = {state} while(%init), condition=%{m.loop_cond}, body=%{m.loop_body}"]
    head = ", ".join(f"{p}: {carried[p]}[{N}]" for p in params)
    text = (f"HloModule loop_program_{seed}\n\n" + "\n".join(m.computations)
            + f"\nENTRY %main ({head}) -> {state} {{\n" + "\n".join(entry) + "\n}\n")
    rng = np.random.default_rng(seed + 1)
    inputs = [rng.integers(-9, 10, N).astype(np.int32 if carried[p] == "s32" else np.float32) for p in params]
    return text, inputs
