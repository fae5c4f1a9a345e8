"""`--device NAME|FILE` (whose arithmetic a run reproduces) and `hloexec devices` (the profiles, their rules and
the sources of each rule). The profiles themselves are hloexec/options/devices.py and its profiles/ files."""
from __future__ import annotations

import sys

from ..errors import ExecutionError
from ..ir.compiled_for import auto_device
from ..options import device_profile

DEVICE_HELP = ("whose arithmetic to reproduce: a device profile (reference: the default, the HLO as its semantics "
               "say; xla-cpu, tpu, a100, h100: `hloexec devices` lists their rules), a .toml/.json profile file "
               "(`hloexec devices --show NAME` prints one to copy and edit), or auto: the profile of what the dump "
               "was compiled for (`hloexec stats` shows the evidence); compare --reference shadow takes a list "
               "A,B,...: judged by each device's arithmetic, the run computed as the first")


def add_device_argument(parser) -> None:
    parser.add_argument("--device", metavar="NAME|FILE", default=None, help=DEVICE_HELP)


def device_option(text: str | None, module, say=None):
    """The device profile `--device` names (None: the reference profile), the one place a value of --device is
    read; `module` is the module it is for: `--device auto` picks the profile from what the dump was compiled for
    (ir/compiled_for.py) and says which and why through `say` (default: stderr)."""
    if text and "," in text:
        raise ExecutionError(f"--device {text}: one device profile expected (a list is for compare --reference "
                             "shadow, which judges by each)")
    if text == "auto":
        text, reason = auto_device(module)
        (say or (lambda m: print(m, file=sys.stderr)))(f"--device auto: {text} ({reason})")
    return device_profile(text or "reference")


def device_list(text: str, module, say=None) -> list:
    """The profiles of `--device A,B,...` (compare --reference shadow judges by each), each read by device_option."""
    return [device_option(name, module, say) for name in text.split(",") if name]
