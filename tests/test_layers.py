"""The layer rule of docs/architecture.md's Layers section (and ARCHITECTURE.md): a module of hloexec imports only its own layer
and the layers listed above it there, and errors.py, which every layer shares; the facade (hloexec/__init__.py)
sits beside the top layer. Read from the source (imports inside
functions included), so a lazy import cannot hide a cycle."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hloexec"


def layer_order() -> list[str]:
    """The layers of docs/architecture.md's Layers section, top (lowest) first: `hloexec/<layer>/` lines."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^    hloexec/(\w+)/", section, re.MULTILINE)


def imported_layers(path: Path) -> set[str]:
    """The first component under hloexec of every hloexec module `path` imports ("" for the facade itself)."""
    parts = path.relative_to(PACKAGE).parts
    package = ["hloexec", *parts[:-1]]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            if module[:1] != ["hloexec"]:
                continue
            if len(module) > 1:
                found.add(module[1])
            else:               # from .. import x: x is a module (or a name of the facade)
                found |= {a.name if (PACKAGE / a.name).exists() or (PACKAGE / f"{a.name}.py").exists() else ""
                          for a in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                module = alias.name.split(".")
                if module[0] == "hloexec":
                    found.add(module[1] if len(module) > 1 else "")
    return found


def test_readme_lists_every_layer():
    layers = layer_order()
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert sorted(layers) == packages, f"docs/architecture.md's Layers section lists {layers}; the packages are {packages}"


def test_each_layer_imports_only_itself_and_the_layers_below():
    layers = layer_order()
    rank = {name: k for k, name in enumerate(layers)}
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) == 1:         # the facade, __main__ and errors.py
            if parts[0] == "errors.py":
                assert imported_layers(path) <= {"errors"}, "errors.py imports nothing of hloexec"
            continue
        own = parts[0]
        for target in imported_layers(path):
            if target == "errors" or (target in rank and rank[target] <= rank[own]):
                continue
            if target == "" and own == layers[-1]:
                continue        # the facade sits beside the top layer (tools/cli.py reads __version__)
            wrong.append(f"{'/'.join(parts)} ({own}) imports {target or 'the hloexec facade'}")
    assert not wrong, "imports against the layer order " + " < ".join(layers) + ":\n  " + "\n  ".join(wrong)


def test_opcode_groups_are_registered_opcodes_and_cover_the_generators():
    """ir/opcodes.py names HLO opcodes the registry knows; what the Numba generators implement is a subset."""
    import hloexec.ops  # noqa: F401  (fills the registry)
    from hloexec.ir import opcodes
    from hloexec.kernels import elements
    from hloexec.kernels import elementwise as ew
    from hloexec.ops.registry import OPS
    groups = {name: value for name, value in vars(opcodes).items() if isinstance(value, frozenset)}
    unknown = {name: sorted(g - set(OPS) - {"parameter"}) for name, g in groups.items() if g - set(OPS) - {"parameter"}}
    assert not unknown
    assert not set(opcodes.OPERAND_COUNTS) - set(OPS)
    assert ew.ELEMENTWISE_OPS <= opcodes.ELEMENTWISE and opcodes.MOVEMENT <= set(elements.ELEMENTS) <= set(OPS)


def _context_members() -> set[str]:
    """The members ops/registry.py's `Context` protocol declares (its annotated attributes, methods, properties)."""
    tree = ast.parse((PACKAGE / "ops" / "registry.py").read_text())
    (body,) = [node.body for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Context"]
    return ({n.target.id for n in body if isinstance(n, ast.AnnAssign)}
            | {n.name for n in body if isinstance(n, ast.FunctionDef)})


def test_the_context_protocol_is_what_ops_use_and_exec_context_provides_it():
    """An op reaches outside itself only through its `ctx` (exec/context.py's ExecContext at run time): every
    `ctx.<name>` (or getattr(ctx, "<name>")) in hloexec/ops/ is a member of ops/registry.py's `Context`, every
    member is used by some op, and ExecContext has them all. Ops and custom-call targets name that parameter
    `ctx`, which is what lets the scan find every use."""
    import inspect

    import hloexec
    from hloexec.ops.custom_call.registry import CUSTOM_CALLS, PREFIXED_CALLS
    from hloexec.ops.registry import OPS
    prepares = [d.prepare for d in OPS.values()] + list(CUSTOM_CALLS.values()) + [p for _, p in PREFIXED_CALLS.values()]
    misnamed = {p.__qualname__ for p in prepares if list(inspect.signature(p).parameters)[1:2] != ["ctx"]}
    assert not misnamed, f"prepare functions whose context parameter is not named ctx: {sorted(misnamed)}"
    used: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / "ops").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ctx":
                name = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                  and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "ctx"):
                name = node.args[1].value if isinstance(node.args[1], ast.Constant) else "<computed>"
            else:
                continue
            used.setdefault(name, set()).add(str(path.relative_to(PACKAGE)))
    declared = _context_members()
    undeclared = {name: sorted(where) for name, where in used.items() if name not in declared}
    assert not undeclared, f"ops use ctx members ops/registry.py's Context does not declare: {undeclared}"
    assert declared <= set(used), f"Context declares members no op uses: {sorted(declared - set(used))}"
    ctx = hloexec.load("HloModule m\nENTRY e { ROOT p = f32[] parameter(0) }").context
    assert not [name for name in declared if not hasattr(ctx, name)], "ExecContext lacks Context members"
