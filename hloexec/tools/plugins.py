"""Custom-call targets from the command line: `--plugin FILE` runs a Python file that registers targets
(`hloexec.ops.custom_call.register_custom_call`), `--custom-call-identity NAME` makes NAME a marker whose
value is its operand. Installed packages provide targets through the entry-point group
`hloexec.custom_calls` (loaded by the registry itself, on the first unknown target). See
examples/custom_call_plugin.py.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import traceback
import zlib
from pathlib import Path


class PluginError(Exception):
    """A plugin file that is missing or fails while it registers its targets."""


def load_plugin_file(path: str) -> None:
    """Run the Python file `path` as a module (`hloexec_plugin_<stem>`), once per path."""
    file = Path(path)
    if not file.is_file():
        raise PluginError(f"plugin {path}: no such file")
    stem = re.sub(r"\W", "_", file.stem)
    name = f"hloexec_plugin_{stem}_{zlib.crc32(str(file.resolve()).encode()):08x}"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin {path}: Python cannot load a module from this file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a broken plugin (or one calling sys.exit) is reported
        del sys.modules[name]
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise PluginError(f"plugin {path} failed at line {where.lineno}: {type(e).__name__}: {e}") from e


def apply(plugins=(), identities=()) -> None:
    """Load the plugin files, then register the identity targets."""
    from ..ops.custom_call import register_identity  # the op registry: not at startup

    for path in plugins or ():
        load_plugin_file(path)
    for target in identities or ():
        register_identity(target)
