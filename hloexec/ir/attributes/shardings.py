"""Device groups and shardings: replica groups (lists or iota form), source-target pairs, shardings
(`{devices=[2,1]0,1}`, iota tile assignments, tuples) and the mesh-axes (named) form of Shardy shardings."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .syntax import _Bad, _Tokens
from .values import ReplicaGroups, Sharding


def _iota(dims, reshape, perm) -> list[int]:
    """Device ids of an iota tile assignment: reshape(arange(N), reshape).transpose(perm).reshape(dims)."""
    import numpy as np

    n = math.prod(reshape)
    if math.prod(dims) != n:
        raise _Bad(f"iota tile assignment {list(dims)} has {math.prod(dims)} elements, the iota {n}")
    if sorted(perm) != list(range(len(reshape))):
        raise _Bad(f"bad iota transpose permutation {list(perm)}")
    return np.arange(n, dtype=np.int64).reshape(reshape).transpose(perm).reshape(-1).tolist()


def _tile_assignment(t: _Tokens, allow_devices: bool):
    """ParseTileAssignment: `[d0,d1]` then `<=[r0,r1]T(p0,p1)` or an explicit device list."""
    dims = t.int_list("[", "]")
    if not dims:
        raise _Bad("expected a tile assignment shape")
    if t.eat("leq"):
        reshape = t.int_list("[", "]")
        if not reshape:
            raise _Bad("expected non-empty iota_reshape_dims")
        if len(reshape) == 1:
            perm: tuple[int, ...] = (0,)
        else:
            if not (t.peek() == "ident" and t.toks[t.i][1] == "T"):
                raise _Bad("expected 'T(' to start sharding devices iota_transpose_perm")
            t.next()
            perm = t.int_list("(", ")")
            if any(p >= len(reshape) or p < 0 for p in perm):
                raise _Bad("out of range iota transpose value")
        if len(perm) != len(reshape):
            raise _Bad("iota_transpose_perm should have the same rank as iota_reshape_dims")
        return dims, _iota(dims, reshape, perm), True
    if not allow_devices:
        raise _Bad("expected an iota tile assignment")
    devices = [t.int()]
    while t.eat(","):
        devices.append(t.int())
    return dims, devices, False


def decode_replica_groups(raw: str) -> ReplicaGroups:
    """`{{0,1},{2,3}}`, `{}`, or the iota form `[4,2]<=[2,4]T(1,0)` (IotaReplicaGroupList), expanded."""
    s = raw.strip()
    if s.startswith("mesh["):
        return _mesh_axes_replica_groups(s, raw)
    if s.startswith("{"):
        if re.fullmatch(r"\{\s*\}", s):
            return ReplicaGroups((), raw)
        t = _Tokens(s)
        t.expect("{")
        groups = []
        while True:
            groups.append(t.int_list())
            if t.eat("}"):
                break
            t.expect(",")
        t.done()
        return ReplicaGroups(tuple(groups), raw)
    t = _Tokens(s)
    dims, devices, _ = _tile_assignment(t, allow_devices=False)
    t.done()
    if len(dims) != 2:
        raise _Bad("expected an iota replica group list [num_groups,group_size]<=[...]")
    g = dims[1]
    return ReplicaGroups(tuple(tuple(devices[i * g : (i + 1) * g]) for i in range(dims[0])), raw)


def _mesh_axes_replica_groups(s: str, raw: str) -> ReplicaGroups:
    """`mesh['a'=2,'b'=4][, device_ids=([4,2]T(1,0))] {'a'}` (what XLA:CPU prints for jax meshes): the
    devices laid out on the mesh (iota, or the given iota transpose); a group is the devices that differ
    only along the named axes, in their order; groups in row-major order of the other axes."""
    import numpy as np

    m = re.fullmatch(r"mesh\[([^\]]*)\](?:,\s*device_ids=\(\[([\d,\s]*)\](?:T\(([\d,\s]*)\))?\))?\s*\{([^}]*)\}", s)
    if m is None:
        raise _Bad("mesh-axes replica groups beyond mesh[...] [device_ids=(iota)] {axes} are not supported")
    axes = [(name, int(size)) for name, size in re.findall(r"'([^']+)'=(\d+)", m[1])]
    names = [name for name, _ in axes]
    dims = [size for _, size in axes]
    grouped = re.findall(r"'([^']+)'", m[4])
    if not re.fullmatch(r"\s*(?:'[^']+'\s*,?\s*)*", m[4]) or any(g not in names for g in grouped):
        raise _Bad(f"mesh-axes replica groups name axes {m[4]!r} outside mesh {names} (sub-axes unsupported)")
    n = math.prod(dims)
    ids = np.arange(n)
    if m[2] is not None:
        reshape = [int(v) for v in m[2].split(",")]
        perm = [int(v) for v in m[3].split(",")] if m[3] else list(range(len(reshape)))
        if math.prod(reshape) != n or sorted(perm) != list(range(len(reshape))):
            raise _Bad(f"device_ids iota {m[2]} does not cover the mesh's {n} devices")
        ids = ids.reshape(reshape).transpose(perm).reshape(-1)
    others = [k for k, name in enumerate(names) if name not in grouped]
    order = others + [names.index(g) for g in grouped]
    size = math.prod(dims[names.index(g)] for g in grouped)
    table = ids.reshape(dims).transpose(order).reshape(-1, size)
    return ReplicaGroups(tuple(tuple(int(d) for d in row) for row in table), raw)


def decode_pairs(raw: str) -> tuple[tuple[int, int], ...]:
    """source_target_pairs `{{0,1},{1,2}}`."""
    t = _Tokens(raw)
    t.expect("{")
    out = []
    if not t.eat("}"):
        while True:
            pair = t.int_list()
            if len(pair) != 2:
                raise _Bad("expects pairs {source,target}")
            out.append(pair)
            if t.eat("}"):
                break
            t.expect(",")
    t.done()
    return tuple(out)


_SHARDING_KINDS = ("replicated", "maximal", "manual", "unknown", "unreduced")


def _single_sharding(t: _Tokens, text: str) -> Sharding:
    t.expect("{")
    if t.peek() == "ident" and t.toks[t.i][1] in ("mesh", "maximal_mesh"):
        s = _named_single_sharding(t, text)
        t.expect("}")
        return s
    flags = set()
    devices: list[int] = []
    dims: tuple = ()
    last_tile_dims: list = []
    while not t.eat("}"):
        kind, val = t.next()
        if kind == "ident" and t.peek() != "=":
            if val in _SHARDING_KINDS or val == "last_tile_dim_replicate":
                flags.add(val)
            elif val in ("shard_as", "shard_like"):
                t.int()
            else:
                raise _Bad(f"unexpected token {val!r} in sharding")
        elif kind == "ident":
            t.expect("=")
            if val == "device":
                devices = [t.int()]
            elif val == "devices":
                dims, devices, _ = _tile_assignment(t, allow_devices=True)
            elif val == "metadata":
                t.skip_balanced()
            elif val == "last_tile_dims":
                t.expect("{")
                if not t.eat("}"):
                    while True:
                        name = t.expect("ident")
                        if name not in ("maximal", "replicated", "manual", "unreduced"):
                            raise _Bad(f"bad sharding type {name!r} in last_tile_dims")
                        last_tile_dims.append(name)
                        if t.eat("}"):
                            break
                        t.expect(",")
            else:
                raise _Bad("unknown attribute in sharding: expected device=, devices= metadata= or last_tile_dims=")
        else:
            raise _Bad(f"unexpected token {val!r} in sharding")
    for kind in ("replicated", "maximal", "manual", "unknown", "unreduced"):
        if kind in flags:
            if kind == "maximal":
                if len(devices) != 1 or dims:
                    raise _Bad("maximal shardings should have exactly one device assigned")
                return Sharding("maximal", device=devices[0], text=text)
            if devices:
                raise _Bad(f"{kind} shardings should not have any devices assigned")
            return Sharding(kind, text=text)
    if not dims:
        raise _Bad("non-maximal shardings must have a tile assignment list including dimensions")
    if math.prod(dims) != len(devices):
        raise _Bad(f"tile assignment {list(dims)} needs {math.prod(dims)} devices, sees {len(devices)}")
    if len(devices) <= 1 and "<=" not in text:
        raise _Bad("non-maximal shardings must have more than one device assigned")
    return Sharding(
        "tiled", tuple(dims), tuple(devices), "last_tile_dim_replicate" in flags, tuple(last_tile_dims), text=text
    )


# -- named (mesh-axes) shardings: XLA 0.10's HLO form of Shardy shardings ---------------------------------
@dataclass(frozen=True, slots=True)
class AxisRef:
    """A mesh axis (by index), or the sub-axis of it that `pre` sub-axis size precedes, of size `size`."""

    axis: int
    pre: int | None = None
    size: int | None = None


def named_sharding(sizes, device_ids, dims, replicated=(), unreduced=(), manual=(), text="") -> Sharding:
    """The tile assignment of a sharding over a mesh (XLA's NamedSharding, Shardy's TensorShardingAttr).

    `sizes`: the mesh axes' sizes; `device_ids`: the devices over the mesh in row-major order (None: iota);
    `dims`: per tensor dimension the AxisRefs sharding it, major to minor. The axes no dimension uses are
    replicated, except those listed as `unreduced` or `manual`: the tile assignment is the mesh transposed to
    (dimension axes..., replicated, unreduced, manual) and reshaped to one dim per tensor dimension plus one per
    kind that has devices."""
    import numpy as np

    refs = [r for d in dims for r in d] + list(replicated) + list(unreduced) + list(manual)
    cuts = [{1, n} for n in sizes]  # sub-axes split an axis at these sizes (major side first)
    for r in refs:
        if not 0 <= r.axis < len(sizes):
            raise _Bad(f"axis index {r.axis} is out of range for a mesh of {len(sizes)} axes")
        if r.pre is not None:
            if r.pre < 1 or r.size < 1 or sizes[r.axis] % (r.pre * r.size):
                raise _Bad(f"sub-axis ({r.pre}){r.size} does not divide axis of size {sizes[r.axis]}")
            cuts[r.axis].update((r.pre, r.pre * r.size))
    factors: list[int] = []  # factor sizes over all axes
    first: list[int] = []  # each axis' first factor index
    for n, cut in zip(sizes, cuts):
        c = sorted(cut)
        if any(b % a for a, b in zip(c, c[1:])):
            raise _Bad(f"sub-axes of an axis of size {n} overlap")
        first.append(len(factors))
        factors += [b // a for a, b in zip(c, c[1:])]

    def spanned(r):
        c = sorted(cuts[r.axis])
        lo, hi = (0, len(c) - 1) if r.pre is None else (c.index(r.pre), c.index(r.pre * r.size))
        return list(range(first[r.axis] + lo, first[r.axis] + hi))

    data = [[f for r in d for f in spanned(r)] for d in dims]
    used = [f for d in data for f in d]
    kinds = {
        f: kind for kind, group in (("unreduced", unreduced), ("manual", manual)) for r in group for f in spanned(r)
    }
    if len(set(used)) != len(used) or set(used) & set(kinds):
        raise _Bad("a mesh axis shards two dimensions (or is also unreduced/manual)")
    rest = [f for f in range(len(factors)) if f not in used]
    groups = [
        (kind, [f for f in rest if kinds.get(f, "replicated") == kind])
        for kind in ("replicated", "unreduced", "manual")
    ]
    n = math.prod(sizes)
    ids = np.arange(n) if device_ids is None else np.asarray(device_ids)
    if ids.size != n:
        raise _Bad(f"{ids.size} device ids for a mesh of {n} devices")
    order = used + [f for _, g in groups for f in g]
    devices = ids.reshape([f for f in factors] or [1]).transpose(order or [0]).reshape(-1) if factors else ids
    counts = [math.prod(factors[f] for f in d) for d in data]
    subgroups = [(kind, math.prod(factors[f] for f in g)) for kind, g in groups]
    subgroups = [(kind, m) for kind, m in subgroups if m > 1]
    if all(c == 1 for c in counts) and len(subgroups) <= 1:
        return Sharding(subgroups[0][0] if subgroups else "replicated", text=text)
    if [kind for kind, _ in subgroups] == ["replicated"]:
        return Sharding("tiled", tuple(counts) + (subgroups[0][1],), tuple(int(d) for d in devices), True, text=text)
    return Sharding(
        "tiled",
        tuple(counts) + tuple(m for _, m in subgroups),
        tuple(int(d) for d in devices),
        False,
        tuple(kind for kind, _ in subgroups),
        text=text,
    )


def _mesh(t: _Tokens):
    """ParseMesh: `mesh[name=size, ...][, device_ids=(iota or list)]` -> (names, sizes, device ids or None)."""
    t.expect("[")
    names: list[str] = []
    sizes: list[int] = []
    while not t.eat("]"):
        if names:
            t.expect(",")
        kind, name = t.next()
        if kind not in ("quoted", "ident"):
            raise _Bad(f"expects a mesh axis name, sees {name!r}")
        t.expect("=")
        names.append(name.strip("'"))
        sizes.append(t.int())
    ids = None
    if t.peek() == "," and t.toks[t.i + 1][1] == "device_ids":
        t.next(), t.next()
        t.expect("=")
        t.expect("(")
        if t.peek() == "[":
            reshape = t.int_list("[", "]")
            perm = t.int_list("(", ")") if t.peek() == "ident" and t.next()[1] == "T" else (0,)
            ids = _iota(sizes, reshape, perm)
            t.expect(")")
        else:
            ids = [t.int()]
            while t.eat(","):
                ids.append(t.int())
            t.expect(")")
    return names, sizes, ids


def _axis_ref(t: _Tokens, names) -> AxisRef:
    kind, name = t.next()
    if kind == "int":
        axis = int(name)
    elif kind in ("quoted", "ident") and name.strip("'") in names:
        axis = names.index(name.strip("'"))
    else:
        raise _Bad(f"axis {name!r} is not a valid axis name or index in mesh {names}")
    if t.eat(":"):
        t.expect("(")
        pre = t.int()
        t.expect(")")
        return AxisRef(axis, pre, t.int())
    return AxisRef(axis)


def _axis_refs(t: _Tokens, names, open_dims: bool = False) -> list:
    """`{a, b:(2)4, ?}` (a `?` -- an open dimension -- only where `open_dims`)."""
    t.expect("{")
    refs: list = []
    while not t.eat("}"):
        if refs or (open_dims and t.toks[t.i - 1][0] == "?"):
            t.expect(",")
        if open_dims and t.eat("?"):
            continue
        refs.append(_axis_ref(t, names))
    return refs


def _named_single_sharding(t: _Tokens, text: str) -> Sharding:
    """XLA 0.10's ParseSingleSharding for a NamedSharding, after its '{': `mesh[...], [dims...], replicated={..},
    unreduced={..}, manual={..}, metadata=...`, `mesh[...], replicated|unreduced|manual`, `maximal_mesh[device_id=N]`."""
    kind = t.next()[1]
    if kind == "maximal_mesh":
        t.expect("[")
        if t.next()[1] != "device_id":
            raise _Bad("expected device_id= attribute in maximal_mesh")
        t.expect("=")
        device = t.int()
        t.expect("]")
        _skip_named_metadata(t)
        return Sharding("maximal", device=device, text=text)
    names, sizes, ids = _mesh(t)
    t.eat(",")
    if t.peek() == "ident" and t.toks[t.i][1] in ("replicated", "unreduced", "manual"):
        whole = t.next()[1]
        _skip_named_metadata(t)
        return (
            Sharding(whole, text=text)
            if math.prod(sizes) > 1 or whole != "replicated"
            else Sharding("replicated", text=text)
        )
    t.expect("[")
    dims: list[list] = []
    while not t.eat("]"):
        if dims:
            t.expect(",")
        dims.append(_axis_refs(t, names, open_dims=True))
    groups: dict[str, list] = {"replicated": [], "unreduced": [], "manual": []}
    while not t.eat("}"):
        t.expect(",")
        key = t.expect("ident")
        t.expect("=")
        if key == "metadata":
            t.skip_balanced()
        elif key in groups:
            groups[key] = _axis_refs(t, names)
        else:
            raise _Bad("unknown attribute in named sharding: expected replicated, unreduced, manual or metadata")
    t.i -= 1  # the caller eats the closing '}'
    return named_sharding(sizes, ids, dims, groups["replicated"], groups["unreduced"], groups["manual"], text)


def _skip_named_metadata(t: _Tokens) -> None:
    if t.eat(","):
        if t.expect("ident") != "metadata":
            raise _Bad("expected metadata= after the sharding")
        t.expect("=")
        t.skip_balanced()


def decode_sharding(raw: str) -> Sharding:
    """Every HloSharding form; tuple shardings as kind='tuple' with `elements`; metadata ignored."""
    t = _Tokens(raw)
    if t.peek() != "{":
        raise _Bad("expected '{' to start sharding attribute")
    if t.peek(1) in ("{", "}"):
        t.expect("{")
        elements = []
        if not t.eat("}"):
            while True:
                elements.append(_single_sharding(t, ""))
                if t.eat("}"):
                    break
                t.expect(",")
        t.done()
        return Sharding("tuple", elements=tuple(elements), text=raw)
    s = _single_sharding(t, raw)
    t.done()
    return s
