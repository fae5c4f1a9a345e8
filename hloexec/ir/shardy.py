"""Shardy shardings that HLO text carries as MLIR attributes in `xla.sdy.*` frontend attributes.

A pre-partition module jax 0.10 prints (`lowered.as_text(dialect="hlo")`) names its meshes in the module's
`frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=2, "y"=4]>}}` and may annotate instructions with
`xla.sdy.sharding="#sdy.sharding<@mesh, [{"x"}, {}]>"` (or `#sdy.sharding_per_value<[<@mesh, ...>, ...]>`),
the manual-region custom-calls with `xla.sdy.in_shardings` / `xla.sdy.out_shardings` and
`xla.sdy.manual_axes="#sdy<manual_axes{"x"}>"`. They decode to the same `Sharding` as XLA's own forms
(`hloexec.ir.attributes.named_sharding`), so SPMD input splitting and output assembly use them alike.
"""

from __future__ import annotations

import re

from .attributes import AxisRef, Sharding, named_sharding

_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<int>-?\d+)|(?P<word>[@#A-Za-z_][A-Za-z0-9_.$]*)'
    r"|(?P<p>[<>\[\]{}(),=:?]))"
)


class ShardyError(ValueError):
    """Shardy attribute text this decoder cannot read."""


class _Tokens:
    def __init__(self, text: str):
        self.toks, pos = [], 0
        while pos < len(text.rstrip()):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise ShardyError(f"unexpected text {text[pos : pos + 20]!r}")
            kind = m.lastgroup
            assert kind is not None  # every alternative of _TOKEN is a named group
            self.toks.append((m.group(kind) if kind == "p" else kind, m.group(kind)))
            pos = m.end()
        self.i = 0

    def peek(self) -> str:
        return self.toks[self.i][0] if self.i < len(self.toks) else "eof"

    def next(self):
        if self.i >= len(self.toks):
            raise ShardyError("unexpected end of text")
        self.i += 1
        return self.toks[self.i - 1]

    def expect(self, kind: str) -> str:
        got, text = self.next()
        if got != kind:
            raise ShardyError(f"expects {kind!r}, sees {text!r}")
        return text

    def eat(self, kind: str) -> bool:
        if self.peek() == kind:
            self.i += 1
            return True
        return False


class Mesh:
    """A Shardy mesh: axis names and sizes, and the device ids laid over it (None: 0..n-1)."""

    def __init__(self, names: list[str], sizes: list[int], device_ids: list[int] | None):
        self.names, self.sizes, self.device_ids = names, sizes, device_ids

    @property
    def devices(self) -> list[int]:
        n = 1
        for s in self.sizes:
            n *= s
        return self.device_ids if self.device_ids is not None else list(range(n))


def _string(t: _Tokens) -> str:
    return t.expect("str")[1:-1]


def _items(t: _Tokens, close: str, item) -> list:
    """`item(t)` repeated, comma-separated, up to and including the `close` token."""
    out: list = []
    while not t.eat(close):
        if out:
            t.expect(",")
        out.append(item(t))
    return out


def _mesh(t: _Tokens) -> Mesh:
    """`<["x"=2, "y"=4](, device_ids=[...])?>` after `#sdy.mesh` or an inline `mesh`."""
    t.expect("<")
    t.expect("[")
    axes = _items(t, "]", lambda t: (_string(t), t.expect("="), int(t.expect("int"))))
    ids = None
    if t.eat(","):
        if t.expect("word") != "device_ids":
            raise ShardyError("expects device_ids after the mesh axes")
        t.expect("=")
        t.expect("[")
        ids = _items(t, "]", lambda t: int(t.expect("int")))
    t.expect(">")
    return Mesh([name for name, _, _ in axes], [size for _, _, size in axes], ids)


def decode_meshes(raw: str) -> dict[str, Mesh]:
    """`{mesh = #sdy.mesh<["x"=2]>, other = #sdy.mesh<...>}` (the module's xla.sdy.meshes) -> name -> Mesh."""
    t = _Tokens(raw)
    t.expect("{")

    def named_mesh(t):
        name = t.expect("word")
        t.expect("=")
        if t.expect("word") != "#sdy.mesh":
            raise ShardyError("expects #sdy.mesh")
        return name, _mesh(t)

    return dict(_items(t, "}", named_mesh))


def _axis_refs(t: _Tokens, mesh: Mesh, open_allowed: bool) -> list[AxisRef]:
    """`{"x", "y":(2)4, ?}` (priorities like `p1` after the brace are skipped)."""
    t.expect("{")
    refs: list = []
    while not t.eat("}"):
        if refs or (t.i and t.toks[t.i - 1][0] == "?"):
            t.expect(",")
        if open_allowed and t.eat("?"):
            continue
        name = _string(t)
        if name not in mesh.names:
            raise ShardyError(f"axis {name!r} is not in the mesh {mesh.names}")
        axis = mesh.names.index(name)
        if t.eat(":"):
            t.expect("(")
            pre = int(t.expect("int"))
            t.expect(")")
            refs.append(AxisRef(axis, pre, int(t.expect("int"))))
        else:
            refs.append(AxisRef(axis))
    if t.peek() == "word" and re.fullmatch(r"p\d+", t.toks[t.i][1]):
        t.next()
    return refs


def _tensor_sharding(t: _Tokens, meshes: dict[str, Mesh], text: str, only: list[str] | None) -> Sharding:
    """`@mesh, [{"x"}, {}](, replicated={...})?(, unreduced={...})?` inside `<...>`; `only`: the axes kept
    in the dimension shardings (the others then replicate)."""
    kind, word = t.next()
    if kind == "word" and word.startswith("@"):
        mesh = meshes.get(word[1:])
        if mesh is None:
            raise ShardyError(f"mesh {word} is not among the module's xla.sdy.meshes ({sorted(meshes)})")
    elif word == "mesh":
        mesh = _mesh(t)
    else:
        raise ShardyError(f"expects @mesh_name or mesh<...>, sees {word!r}")
    t.expect(",")
    t.expect("[")
    dims = [
        refs if only is None else [r for r in refs if mesh.names[r.axis] in only]
        for refs in _items(t, "]", lambda t: _axis_refs(t, mesh, open_allowed=True))
    ]
    groups: dict[str, list] = {"replicated": [], "unreduced": []}
    while t.eat(","):
        key = t.expect("word")
        if key not in groups:
            raise ShardyError(f"unknown key {key!r} in a sharding")
        t.expect("=")
        groups[key] = _axis_refs(t, mesh, open_allowed=False)
    if not mesh.sizes and mesh.device_ids and len(mesh.device_ids) == 1:  # a maximal mesh
        return Sharding("maximal", device=mesh.device_ids[0], text=text)
    return named_sharding(mesh.sizes, mesh.device_ids, dims, groups["replicated"], groups["unreduced"], (), text)


def decode_sharding_attr(raw: str, meshes: dict[str, Mesh], only: list[str] | None = None) -> Sharding:
    """`#sdy.sharding<...>` -> Sharding; `#sdy.sharding_per_value<[<...>, ...]>` -> a tuple Sharding.
    `only`: keep just these axes in the dimension shardings (a manual region's local values are tiled by its
    manual axes; along the others they stay whole, partitioned automatically inside it)."""
    t = _Tokens(raw)
    head = t.expect("word")
    t.expect("<")
    if head == "#sdy.sharding":
        s = _tensor_sharding(t, meshes, raw, only)
    elif head == "#sdy.sharding_per_value":
        t.expect("[")

        def element(t):
            t.expect("<")
            sharding = _tensor_sharding(t, meshes, "", only)
            t.expect(">")
            return sharding

        s = Sharding("tuple", elements=tuple(_items(t, "]", element)), text=raw)
    else:
        raise ShardyError(f"expects #sdy.sharding or #sdy.sharding_per_value, sees {head!r}")
    t.expect(">")
    if t.peek() != "eof":
        raise ShardyError("unexpected text after the sharding")
    return s


def decode_manual_axes(raw: str) -> list[str]:
    """`#sdy<manual_axes{"x", "y"}>` -> ["x", "y"]."""
    t = _Tokens(raw)
    if t.expect("word") != "#sdy":
        raise ShardyError("expects #sdy<manual_axes{...}>")
    t.expect("<")
    if t.expect("word") != "manual_axes":
        raise ShardyError("expects manual_axes")
    t.expect("{")
    names = _items(t, "}", _string)
    t.expect(">")
    return names


def module_meshes(module) -> dict[str, Mesh]:
    """The meshes a module's `xla.sdy.meshes` frontend attribute names ({} when it has none)."""
    raw = (module.attr("frontend_attributes") or {}).get("xla.sdy.meshes")
    return {} if raw is None else decode_meshes(raw)


def sharding_of(inst) -> Sharding | None:
    """An instruction's sharding: its `sharding` attribute, else its xla.sdy.sharding frontend attribute
    (decoded with the module's meshes), else None."""
    if "sharding" in inst.attrs:
        return inst.attr("sharding")
    raw = (inst.attr("frontend_attributes") or {}).get("xla.sdy.sharding")
    if raw is None or inst.computation is None:
        return None
    try:
        return decode_sharding_attr(raw, module_meshes(inst.computation.module))
    except ShardyError as e:
        raise inst.attr_error("frontend_attributes", f"bad xla.sdy.sharding {raw!r}: {e}") from None
