"""How hloexec/tools/ is put together: no import cycles among its modules (imports inside functions counted:
they hide cycles rather than remove them), nothing imports the CLI's entry module, `hloexec --help` does not
load the executor (every command's parser is built at startup), every command module is wired."""
import ast
import subprocess
import sys
from pathlib import Path

import hloexec

PACKAGE = Path(hloexec.__file__).parent
TOOLS = PACKAGE / "tools"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(source: str, name: str, is_package: bool, modules: set) -> set:
    """The modules (of `modules`) that module `name`'s source imports anywhere: at module level or inside
    functions."""
    package = name if is_package else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = ".".join(base[:len(base) - node.level + 1]) if node.level else ""
            target = ".".join(p for p in (base, node.module) if p)
            found.update(f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    resolved = set()
    for target in found:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def _graph() -> dict:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _imports(path.read_text(encoding="utf-8"), name, path.name == "__init__.py", set(paths))
            for name, path in paths.items()}


def _cycles(graph: dict, within: str) -> list:
    """Strongly connected components of more than one module, among the modules named `within...`."""
    nodes = [n for n in graph if n.startswith(within)]
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if not w.startswith(within):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))
    for v in nodes:
        if v not in index:
            visit(v)
    return components


def test_tools_modules_import_without_cycles():
    graph = _graph()
    cycles = _cycles(graph, "hloexec.tools")
    described = ["; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c) for c in cycles]
    assert not cycles, "import cycles in hloexec/tools (imports inside functions counted):\n" + "\n".join(described)


def test_cycle_finder_sees_function_level_imports():
    modules = {"hloexec.tools.a", "hloexec.tools.b", "hloexec.tools.cli", "hloexec.exec"}
    source = "from ..exec import spmd\n\ndef f():\n    from .cli import main\n    from . import b\n"
    found = _imports(source, "hloexec.tools.a", False, modules)
    assert found == {"hloexec.exec", "hloexec.tools.cli", "hloexec.tools.b"}
    graph = {"hloexec.tools.a": {"hloexec.tools.b"}, "hloexec.tools.b": {"hloexec.tools.a"}, "hloexec.tools.c": set()}
    assert _cycles(graph, "hloexec.tools") == [["hloexec.tools.a", "hloexec.tools.b"]]


def test_nothing_imports_the_cli_entry_module():
    importers = [name for name, targets in _graph().items()
                 if "hloexec.tools.cli" in targets and name != "hloexec.__main__"]
    assert not importers, f"these import hloexec.tools.cli (shared helpers live in tools/common.py): {importers}"


def test_help_does_not_load_the_executor():
    code = ("import sys\nfrom hloexec.tools.cli import build_parser\nbuild_parser()\n"
            "print(' '.join(m for m in ('hloexec.exec.executor', 'hloexec.ops', 'hloexec.exec.plan', 'numba') "
            "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert not loaded, f"building the parser imports {loaded}: keep them inside the commands' run functions"


def test_every_command_module_is_listed_once():
    """A module of tools/commands/ with an add_parser is a command: cli.COMMANDS lists it (else it is dead code)."""
    import importlib

    from hloexec.tools import cli
    defined = []
    for path in sorted((TOOLS / "commands").glob("*.py")):
        module = importlib.import_module(f"hloexec.tools.commands.{path.stem}")
        if hasattr(module, "add_parser"):
            assert callable(module.run), f"{path.stem}: add_parser without run"
            defined.append(module)
    assert sorted(m.__name__ for m in cli.COMMANDS) == sorted(m.__name__ for m in defined)
    assert len(set(cli.COMMANDS)) == len(cli.COMMANDS)


if __name__ == "__main__":      # python tests/test_tools_imports.py [PREFIX]: the cycles among PREFIX's modules
    prefix = sys.argv[1] if len(sys.argv) > 1 else "hloexec.tools"
    graph = _graph()
    for component in _cycles(graph, prefix):
        print(f"cycle of {len(component)} modules:")
        for a in component:
            print(f"  {a} -> " + ", ".join(sorted(b for b in graph[a] if b in component)))
    print(f"{len(_cycles(graph, prefix))} cycles among {prefix} (imports inside functions counted)")
