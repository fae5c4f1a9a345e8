"""The custom-call registry: target name -> prepare function, filled by the family modules of this package,
by plugins (`hloexec run --plugin FILE`) and by installed packages through the entry-point group
`hloexec.custom_calls`.

A target's prepare has an op's contract: `prepare(inst, ctx) -> kernel(*operand_values) -> value` (see
hloexec/ops/registry.py); its docstring is the target's row in the custom-call table (docs/custom-calls.md).
"""

from __future__ import annotations

import re

from ...errors import UnsupportedError

CUSTOM_CALLS: dict = {}
# target prefix -> (applies(inst), prepare) for a family of targets named by prefix, tried when no exact
# target matches (composite.py: xla_builder.* calls carrying their body)
PREFIXED_CALLS: dict = {}
# target -> what kind of compiled kernel it is: targets whose meaning is a binary hloexec cannot run (opaque.py)
OPAQUE_KERNELS: dict[str, str] = {}

# Installed packages provide targets under this entry-point group: each entry point names a module (importing
# it registers its targets) or a callable taking no arguments (calling it registers them).
ENTRY_POINT_GROUP = "hloexec.custom_calls"
_entry_points_loaded = False

PLUG_IN_HINT = (
    "supply an implementation: `hloexec run|compare --plugin my_calls.py` (a Python file calling "
    "hloexec.ops.custom_call.register_custom_call), an installed package with an entry point in the "
    f"group {ENTRY_POINT_GROUP!r}, or `--custom-call-identity NAME` for a target that passes its "
    "operand through unchanged"
)


# target -> (operand counts it takes, "array" / "tuple" result or None): checked before its prepare runs, so a
# malformed call (an operand missing, a tuple where an array belongs) is a clear error, not an IndexError
CALL_FORMS: dict[str, tuple[range | None, str | None]] = {}


def register_custom_call(
    target: str, prepare, *, replace: bool = False, operands: int | range | None = None, returns: str | None = None
):
    """Register `prepare(inst, ctx) -> kernel(*operands)` for custom-call target `target`; `operands` (a count
    or a range of counts, of array operands) and `returns` ("array" or "tuple"), where given, are checked
    before `prepare` sees an instruction."""
    if target in CUSTOM_CALLS and not replace:
        raise ValueError(f"custom-call target {target!r} registered twice")
    CUSTOM_CALLS[target] = prepare
    counts = range(operands, operands + 1) if isinstance(operands, int) else operands
    if counts is not None or returns is not None:
        CALL_FORMS[target] = (counts, returns)
    return prepare


def custom_call(*targets: str, operands: int | range | None = None, returns: str | None = None):
    """Decorator form of register_custom_call (one prepare for several target names)."""

    def deco(prepare):
        for t in targets:
            register_custom_call(t, prepare, operands=operands, returns=returns)
        return prepare

    return deco


def check_call_form(inst, target: str) -> None:
    """Refuse a call to `target` whose operands or result are not of the form the target was registered with."""
    form = CALL_FORMS.get(target)
    if form is None:
        return
    counts, returns = form
    ops = inst.operands
    if counts is not None and (len(ops) not in counts or any(not o.shape.is_array for o in ops)):
        n = (
            f"{counts.start}"
            if len(counts) == 1
            else f"{counts.start} or more"
            if counts.stop > 1 << 20
            else f"{counts.start} to {counts.stop - 1}"
        )
        given = ", ".join(o.shape.to_text(layout=False) for o in ops)
        raise UnsupportedError(f"custom-call {target!r} takes {n} array operand(s), the call has ({given})", inst)
    empty_tuple = inst.shape.is_tuple and not inst.shape.tuple_shapes
    if returns is not None and ((returns == "tuple") != inst.shape.is_tuple or empty_tuple):
        raise UnsupportedError(
            f"custom-call {target!r} returns {'a tuple' if returns == 'tuple' else 'an array'}, "
            f"the call says {inst.shape.to_text(layout=False)}",
            inst,
        )


def result_leaves(inst) -> list:
    """The arrays of a computing call's result, its own result first (then statistics, scratch, workspace...):
    UnsupportedError for anything but an array or a flat tuple of arrays (a malformed `()`, token or nested
    tuple)."""
    shape = inst.shape
    leaves = list(shape.tuple_shapes) if shape.is_tuple else [shape]
    if not leaves or not all(s.is_array for s in leaves):
        raise UnsupportedError(
            f"custom-call {target_of(inst)!r} computes a result: an array or a flat tuple of "
            f"arrays; the call says {shape.to_text(layout=False)}",
            inst,
        )
    return leaves


def target_of(inst) -> str:
    t = inst.attr("custom_call_target")
    return "" if t is None else str(t).strip().strip('"')


def load_entry_points() -> list[str]:
    """Load the `hloexec.custom_calls` entry points of installed packages (once); their names."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return []
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    names = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if callable(obj):
                obj()
        except Exception as e:  # noqa: BLE001 - a broken plugin must say which one it is
            raise UnsupportedError(
                f"custom-call plugin {ep.name!r} ({ep.value}) of group {ENTRY_POINT_GROUP!r} "
                f"failed to load: {type(e).__name__}: {e}"
            ) from e
        names.append(ep.name)
    return names


def lookup(inst):
    """The prepare function for `inst`'s target (loading the installed plugins once on a miss)."""
    target = target_of(inst)
    prepare = CUSTOM_CALLS.get(target)
    if prepare is None and load_entry_points():
        prepare = CUSTOM_CALLS.get(target)
    if prepare is None:
        for prefix, (applies, family) in PREFIXED_CALLS.items():
            if target.startswith(prefix) and applies(inst):
                return family
    if prepare is None and target in OPAQUE_KERNELS:
        raise UnsupportedError(
            f"custom-call target {target!r} is an opaque compiled kernel ({OPAQUE_KERNELS[target]}): "
            f"hloexec cannot run its code; to run this module, {PLUG_IN_HINT} (a plugin sees the "
            "instruction, its backend_config included, and supplies the kernel's numpy meaning)",
            inst,
        )
    if prepare is None:
        raise UnsupportedError(
            f"unsupported custom-call target {target!r}: hloexec has no implementation of it; {PLUG_IN_HINT}", inst
        )
    check_call_form(inst, target)
    return prepare


# -- backend_config ------------------------------------------------------------------------------
def backend_config(inst, nested: str | None = None) -> dict:
    """The decoded backend_config dict ({} when absent); `nested`: the GpuBackendConfig sub-message of that
    name when present, else the whole dict (XLA wrote the sub-message at the top level before GpuBackendConfig
    existed). A config that is not a dict (opaque bytes or text) is an UnsupportedError."""
    cfg = inst.attr("backend_config")
    if cfg is None or cfg == "":
        return {}
    if not isinstance(cfg, dict):
        raise UnsupportedError(
            f"custom-call {target_of(inst)!r} with a backend_config that is not a JSON or attribute dictionary", inst
        )
    if nested is not None and isinstance(cfg.get(nested), dict):
        return cfg[nested]
    return cfg


def _camel(name: str) -> str:
    return re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), name)


def field(cfg: dict, name: str, default=None):
    """A proto field of a JSON-printed message by its proto name (`conv_result_scale`) or its JSON name
    (`convResultScale`): protobuf's JSON printer writes the latter, XLA's HLO printer the former."""
    if name in cfg:
        return cfg[name]
    return cfg.get(_camel(name), default)


def enum_field(cfg: dict, name: str, names: tuple[str, ...], inst, default: int = 0) -> str:
    """A proto enum field, printed as its name or its number (a JSON string or int), as the name."""
    v = field(cfg, name, default)
    if isinstance(v, str) and v.lstrip("-").isdigit():
        v = int(v)
    if isinstance(v, int):
        if 0 <= v < len(names):
            return names[v]
    elif v in names:
        return v
    raise UnsupportedError(f"custom-call {target_of(inst)!r}: {name}={v!r} is not one of {', '.join(names)}", inst)
