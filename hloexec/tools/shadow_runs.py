"""How numerics.py and nonfinite.py run a module they observe: as one participant or as all the participants of
an SPMD module, outputs flattened (Runner); an Executable made with another's options (executable_like)."""
from __future__ import annotations

import warnings

from ..errors import ElidedConstantWarning
from ..exec import spmd
from ..exec.executor import Executable
from ..exec.shadow import Shadow
from .arrays import flatten


def executable_like(exe: Executable, module, **options) -> Executable:
    """An Executable of `module` with `exe`'s options (`options` override them). Elided constants were said when
    `exe` was made: not again for each module derived from its own."""
    ctx = exe.context
    settings = dict(options=exe.options, use_numba=ctx.use_numba, compile_after=ctx.compile_after,
                    compile=ctx.compile)
    settings.update(options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ElidedConstantWarning)
        return Executable(module, **settings)


class Runner:
    """Runs a module as one participant (`spmd` None) or as all participants of an SPMD module (`spmd`: the
    keyword arguments of run_spmd: partitions, replicas, report, memory_limit). Inputs are one argument list,
    or one per device; outputs come back flattened (SPMD: global arrays assembled by the output shardings)."""

    def __init__(self, spmd: dict | None = None):
        self.spmd = spmd

    def run(self, exe: Executable, inputs, observe=None, observe_operands: bool = False) -> list:
        if self.spmd is None:
            seen = None if observe is None else (lambda *a: observe(0, *a))
            return flatten(exe.run(*inputs, observe=seen, observe_operands=observe_operands))
        outputs = exe.run_spmd(inputs, observe=observe, observe_operands=observe_operands, **self.spmd)
        return flatten(spmd.assemble_outputs(exe.module, outputs))

    def shadow_inputs(self, shadow: Shadow, inputs) -> list:
        if self.spmd is None:
            return shadow.inputs(inputs)
        widened: dict = {}
        return [shadow.inputs(device_inputs, widened) for device_inputs in inputs]
