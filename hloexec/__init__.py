"""hloexec: a fast HLO text parser and CPU evaluator.

import hloexec
modules = hloexec.parse("dump.hlo")          # every module found in a file or text
exe = hloexec.load("dump.hlo")               # the (single or named) module, ready to run
outputs = exe.run(*exe.random_inputs(seed=0))
exe = hloexec.load("dump.hlo", device="tpu", compile="eager")   # as a TPU computes it; runs wait for kernels
"""

from .errors import ExecutionError, HloParseError, UnsupportedError
from .ir.module import Computation, Instruction, Module, pick_module
from .parser import parse

__version__ = "0.1.0"
__all__ = [
    "parse",
    "load",
    "Module",
    "Computation",
    "Instruction",
    "HloParseError",
    "UnsupportedError",
    "ExecutionError",
    "Executable",
]


def load(source, module: str | None = None, **options):
    """Parse `source` (a path or HLO text) and prepare one module to run.

    `module` picks a module by name when the source holds several. Options: `options` (an
    hloexec.options.Options: every numerics rule and limit in one value) or `device` (a device profile's name, file
    or hloexec.options.DeviceProfile: whose arithmetic to reproduce, default "reference"), `excess_precision`,
    `use_numba` (False runs the numpy reference kernels only), `compile` ("background", the default: fused
    kernels and loops compile in worker processes while runs go on op by op, each run using the kernels ready;
    "eager": a run waits for the kernels due, the first for all of them; "never": op by op always;
    `Executable.wait_compiled()` waits for them), `compile_after` (fused kernels run op by op for this many calls
    before they are due to compile; default 1 in the background: a one-shot run compiles nothing; 0 eager),
    `max_memory` (bytes a run may use), `compile_kernels` (False: nothing compiles while the module is
    prepared, kernels are due at their first call; the plan and its memory estimate are the same),
    `reductions` ("accumulate", the default: f16/bf16 sums and products accumulate in f32 and round once;
    "per-step": every step rounds to the type, in row-major order, as XLA:CPU's loops compute them; "xla-cpu":
    XLA:CPU's own orders, YNNPACK's included, the xla-cpu device's default; see docs/semantics.md).
    """
    from . import ops  # noqa: F401  (fills the op registry)
    import hloexec.spmd  # noqa: F401  (fills exec's spmd_layer: Executable.run_spmd; see hloexec/spmd/__init__.py)
    from .exec.executor import Executable

    return Executable(pick_module(parse(source), module), **options)


def __getattr__(name):
    if name == "Executable":
        import hloexec.spmd  # noqa: F401  (fills exec's spmd_layer: Executable.run_spmd)
        from .exec.executor import Executable

        return Executable
    raise AttributeError(name)
