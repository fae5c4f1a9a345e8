"""The repo's promises to a newcomer: the README's commands are the ones CI runs."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line.strip() for line in lines[:12] if line.startswith("    ")]


def test_readme_starts_with_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    assert "pip install" in commands[0] and "hloexec " in commands[0]
    assert "pip install" in commands[1] and "pytest" in commands[1]


def test_ci_runs_exactly_the_readme_test_command():
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert readme_commands()[1] in ci_lines


def test_bundled_examples_are_there():
    for name in ("gpt_step", "adam", "layernorm_bwd", "mlp"):
        for suffix in (".pre.hlo", ".opt.hlo", ".inputs.npz", ".expected.npz"):
            assert (ROOT / "examples" / f"{name}{suffix}").is_file()


def test_hloexec_imports_and_parses_from_the_checkout_root():
    """From the repository's root the source tree shadows the installed package, and the sources hold no built
    scanner library: the installed one is found all the same (CI installs with `pip install .`)."""
    import subprocess
    import sys
    script = "import hloexec; print(hloexec.parse('HloModule m\\nENTRY e { ROOT c = f32[] constant(1) }')[0].name)"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "m", done.stderr


def tracked_files() -> list[Path]:
    import subprocess
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        import pytest
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listed.stdout.splitlines()]


def test_no_generated_or_machine_specific_files_are_tracked():
    """Generated kernels (the kernel cache) stay out of the repository, and no document names a path of the machine
    it was written on (a checkout or home directory): a reader's machine has other ones."""
    files = tracked_files()
    assert not [f for f in files if ".kcache" in f.parts or f.name.startswith("hx_")]
    machine = ("/work/", "/root/", "/home/")
    named = [f"{f.relative_to(ROOT)}: {m}" for f in files if f.suffix in (".md", ".toml", ".cfg", ".yml")
             for m in machine if f.is_file() and m in f.read_text(errors="replace")]
    assert not named, named


def test_the_package_passes_its_linter():
    """ruff with the rules pyproject.toml selects (pyflakes: unused imports and variables, undefined names...), and
    ruff's formatter: the package is formatted."""
    import shutil
    import subprocess
    import sys
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        import pytest
        pytest.skip("ruff not installed (it comes with the test extra)")
    done = subprocess.run([ruff, "check", "--no-cache", "hloexec"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    # the formatter's check: one layout for the package, so a diff shows what changed and not how it was typed
    done = subprocess.run([ruff, "format", "--check", "--no-cache", "hloexec"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, "run `ruff format hloexec`:\n" + done.stdout + done.stderr


# -- import cycles ----------------------------------------------------------------------------------------------
PACKAGE = ROOT / "hloexec"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.joinpath(*name.split(".")) if name else PACKAGE
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """The hloexec modules `path` imports (names relative to hloexec, "" for its facade), imports inside functions
    included, those under `if TYPE_CHECKING:` (annotations, never run) left out."""
    import ast
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for c in child.orelse:
                    walk(c)
                continue
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = [p for p in package.split(".") if p][:len(package.split(".")) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                elif (child.module or "").split(".")[0] == "hloexec":
                    target = child.module.partition(".")[2]
                else:
                    continue
                for alias in child.names:        # from package import module: that module
                    sub = f"{target}.{alias.name}".lstrip(".")
                    found.add(sub if _is_module(sub) else target)
            elif isinstance(child, ast.Import):
                found.update(a.name.partition(".")[2] for a in child.names if a.name.split(".")[0] == "hloexec")
            walk(child)
    walk(ast.parse(path.read_text()))
    return found - {name}


def import_graph() -> dict[str, set[str]]:
    """hloexec module -> the hloexec modules it imports."""
    return {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def import_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(component)
    return cycles


def test_import_cycles_finds_a_cycle_through_a_lazy_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [{"a", "b", "c"}]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    """No module of hloexec imports, directly or not, a module that imports it back: imports inside functions
    count (a lazy import hides a cycle, it does not remove it; only optional dependencies, jax, ray, matplotlib,
    scipy, are imported inside functions for a reason of their own, and they import nothing of hloexec)."""
    cycles = [sorted(c) for c in import_cycles(import_graph())]
    assert not cycles, f"import cycles: {cycles}"


# -- the line budget ----------------------------------------------------------------------------------------------
MODULE_LINES, FUNCTION_LINES = 800, 100


def over_budget() -> dict[str, int]:
    """Modules of hloexec over MODULE_LINES lines and functions over FUNCTION_LINES ("path:name": lines)."""
    import ast
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            found[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    found[f"{name}:{node.name}"] = lines
    return found


def test_modules_and_functions_keep_to_the_line_budget():
    """No module over 800 lines, no function over 100: a reader finds a part by its module and reads a function
    whole."""
    found = over_budget()
    assert not found, f"over the line budget ({MODULE_LINES} a module, {FUNCTION_LINES} a function): {found}"


# -- types ----------------------------------------------------------------------------------------------------------
# mypy's errors known, per module (issue 30; counted by test_the_package_passes_its_type_checker)
MYPY_KNOWN = {
    "jax.py": 12, "spmd/shardings.py": 2, "tools/bisect.py": 12, "tools/bounds.py": 2, "tools/collectives.py": 2,
    "tools/commands/export.py": 1, "tools/commands/extract.py": 4, "tools/commands/numerics.py": 1,
    "tools/commands/run.py": 2, "tools/common.py": 2, "tools/costmodel.py": 1, "tools/diff.py": 17,
    "tools/diff_format.py": 2, "tools/dumpdir.py": 17, "tools/export.py": 12, "tools/extract.py": 6,
    "tools/graph.py": 3, "tools/hloproto.py": 11, "tools/match.py": 7, "tools/memory.py": 4, "tools/minimize.py": 6,
    "tools/nonfinite.py": 5, "tools/numerics.py": 2, "tools/numerics_format.py": 2, "tools/plugins.py": 3,
    "tools/report.py": 1, "tools/shadow_runs.py": 5, "tools/stats.py": 3, "tools/verdict.py": 2,
    "tools/xla_cpu.py": 1,
}


def mypy_errors() -> dict[str, int]:
    """mypy's errors over hloexec/ (pyproject.toml's configuration), per module."""
    import shutil
    import subprocess
    import sys
    mypy = shutil.which("mypy") or shutil.which("mypy", path=str(Path(sys.executable).parent))
    if mypy is None:
        import pytest
        pytest.skip("mypy not installed (it comes with the test extra)")
    done = subprocess.run([mypy, "--no-error-summary", "--cache-dir", str(ROOT / ".mypy_cache")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    found: dict[str, int] = {}
    for line in done.stdout.splitlines():
        if ": error:" in line:
            module = line.split(":", 1)[0].removeprefix("hloexec/")
            found[module] = found.get(module, 0) + 1
    assert done.returncode in (0, 1) and (found or done.returncode == 0), done.stdout + done.stderr
    return found


def test_the_package_passes_its_type_checker():
    """mypy over hloexec/, clean but for the errors known (MYPY_KNOWN, a count per module that may only go down:
    most are Shape's optional element_type and tuple_shapes, which an array-or-tuple check does not narrow)."""
    found = mypy_errors()
    more = {m: f"{n} (known {MYPY_KNOWN.get(m, 0)})" for m, n in found.items() if n > MYPY_KNOWN.get(m, 0)}
    assert not more, f"mypy errors beyond the known ones (run `mypy` in the checkout): {more}"
    fewer = {m: f"{found.get(m, 0)} (known {n})" for m, n in MYPY_KNOWN.items() if found.get(m, 0) < n}
    assert not fewer, f"fewer mypy errors than known: lower MYPY_KNOWN to {fewer}"
