"""How hloexec/tools/ is put together (no import cycles anywhere: tests/test_repo.py): nothing imports the CLI's
entry module, `hloexec --help` does not load the executor (every command's parser is built at startup), every
command module is wired."""
import subprocess
import sys
from pathlib import Path

import hloexec
from test_repo import import_graph

PACKAGE = Path(hloexec.__file__).parent
TOOLS = PACKAGE / "tools"


def test_nothing_imports_the_cli_entry_module():
    importers = [name for name, targets in import_graph().items() if "tools.cli" in targets and name != "__main__"]
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
