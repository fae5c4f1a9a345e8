"""hloexec from jax: run a jax function's HLO with hloexec, dump it as XLA would, check it against XLA:CPU.

    import hloexec.jax
    outs = hloexec.jax.run(fn, *args)                  # fn's outputs, in its pytree, as numpy / ml_dtypes arrays
    hloexec.jax.dump(fn, *args, to="dump/")            # what XLA_FLAGS=--xla_dump_to=dump/ writes, plus inputs
    hloexec.jax.check(fn, *args)                       # AssertionError (the compare report) on a mismatch
    hloexec.jax.check(fn, *args, reference="shadow")   # both as close to exact as the precision allows?

`fn` is lowered with `jax.jit(fn, **jit_kwargs)` (`keep_unused=True`, so that every argument is a parameter
of the module); an already jitted function is lowered as it is. `stage="pre"` runs the module jax hands to
XLA (`lowered.as_text(dialect="hlo")`), `stage="opt"` the one XLA:CPU made of it (`compiled.as_text()`).
Sharded arguments (host devices: `XLA_FLAGS=--xla_force_host_platform_device_count=N`) work in both: the
pre-optimization module is the global program; the optimized one is partitioned, and every participant
runs (`Executable.run_spmd`), inputs split and outputs assembled by their shardings.

Needs the `jax` extra; importing this module does not import jax until a function is called.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ExecutionError, OptionError

STAGES = ("pre", "opt")


@dataclass
class Lowered:
    """One jax function lowered for hloexec: its module text, its flat inputs, how to rebuild its outputs."""

    text: str
    inputs: list  # the arguments' leaves that are parameters of the module, as numpy arrays
    out_tree: Any  # jax's PyTreeDef of the outputs
    jax_lowered: Any  # jax.stages.Lowered
    compiled: Any = None  # jax.stages.Compiled, for stage="opt"

    def outputs(self, flat: list):
        import jax

        return jax.tree_util.tree_unflatten(self.out_tree, flat)


def lower(fn, *args, stage: str = "pre", **jit_kwargs) -> Lowered:
    """`fn` lowered by jax for `args`, at `stage` ("pre": before XLA's optimizations, "opt": XLA:CPU's
    optimized module)."""
    import jax

    if stage not in STAGES:
        raise OptionError("stage", stage, STAGES)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn, **{"keep_unused": True, **jit_kwargs})
    lowered = jitted.lower(*args)
    static = set(getattr(getattr(jitted, "_jit_info", None), "static_argnums", ()))
    leaves = jax.tree_util.tree_leaves(tuple(a for i, a in enumerate(args) if i not in static))
    kept = lowered._lowering.compile_args.get("kept_var_idx")  # what keep_unused=False left out
    if kept is not None and len(kept) != len(leaves):
        leaves = [leaf for i, leaf in enumerate(leaves) if i in kept]
    compiled = lowered.compile() if stage == "opt" else None
    text = compiled.as_text() if compiled is not None else lowered.as_text(dialect="hlo")
    if text is None:
        raise ExecutionError(f"jax printed no HLO module for {_name(fn)}")
    return Lowered(text, [np.asarray(leaf) for leaf in leaves], lowered.out_tree, lowered, compiled)


def run(fn, *args, stage: str = "pre", device=None, **jit_kwargs):
    """Run `fn`'s module with hloexec; returns its outputs in `fn`'s pytree structure (numpy / ml_dtypes).
    `device`: whose arithmetic to reproduce (a device profile's name, file or DeviceProfile; None: reference)."""
    return _run_lowered(lower(fn, *args, stage=stage, **jit_kwargs), device)


def check(
    fn,
    *args,
    reference: str = "xla",
    stage: str = "pre",
    atol: float | None = None,
    rtol: float | None = None,
    device=None,
    **jit_kwargs,
):
    """Run `fn` on XLA:CPU (jax) and with hloexec; raise AssertionError when they disagree. Returns hloexec's
    outputs in `fn`'s pytree.

    `reference="xla"`: the outputs compared by hloexec's dtype-aware rules (`hloexec compare`'s; `atol`/`rtol`
    override them); the message is compare's report. `reference="shadow"`: XLA:CPU's outputs and hloexec's are
    judged against the program's exact answer (its shadow, every float type in f64) with the program's own
    precision as the measure (`hloexec compare --reference shadow`'s verdict); the message is the verdict table.
    Two correct f16 programs differ by more than any fixed tolerance allows: this asks whether each is as close
    to exact as f16 permits: every element against its own error bound (docs/verdicts.md) under `device`'s
    arithmetic (a profile, its name or file; None: the reference). One participant: a sharded function's "pre"
    stage (its global program)."""
    import jax
    from .tools.compare import compare_outputs, format_report

    if reference not in ("xla", "shadow"):
        raise OptionError("reference", reference, ("xla", "shadow"))
    if reference == "shadow" and (atol is not None or rtol is not None):
        raise ValueError("reference='shadow' judges by the program's precision, not by atol/rtol")
    lowered = lower(fn, *args, stage=stage, **jit_kwargs)
    theirs = jax.tree_util.tree_map(np.asarray, (lowered.compiled or lowered.jax_lowered.compile())(*args))
    if reference == "shadow":
        return _judge_against_shadow(fn, lowered, jax.tree_util.tree_leaves(theirs), stage, device)
    ours = _run_lowered(lowered, device)
    report = compare_outputs(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs), atol, rtol)
    if not report.passed:
        raise AssertionError(f"hloexec and XLA:CPU differ on {_name(fn)} ({stage}):\n{format_report(report)}")
    return ours


def _judge_against_shadow(fn, lowered: Lowered, xla_outputs: list, stage: str, device=None):
    from .tools.numerics import judge_run, xla_cpu_arithmetic
    from .tools.verdict import format_verdict

    exe = _load(lowered.text, device)
    module = exe.module
    if module.num_partitions * module.replica_count > 1:
        raise ValueError(
            f"reference='shadow' runs one participant; {_name(fn)} at stage {stage!r} is partitioned "
            f"over {module.num_partitions * module.replica_count} devices: check stage='pre'"
        )
    inputs = [_as_parameter(x, p) for x, p in zip(lowered.inputs, exe.parameters)]
    verdict, run = judge_run(
        exe,
        inputs,
        {"XLA:CPU": xla_outputs},
        devices=None if device is None else [device],
        known={"XLA:CPU": xla_cpu_arithmetic()},
    )
    if not verdict.consistent():
        raise AssertionError(
            f"{_name(fn)} ({stage}): not every run is as close to the exact answer as the "
            f"program's precision allows:\n{format_verdict(verdict)}"
        )
    return lowered.outputs([np.asarray(x) for x in run.outputs])


def dump(fn, *args, to, passes: bool = False, **jit_kwargs) -> dict:
    """Write `fn`'s program to the directory `to` the way `XLA_FLAGS=--xla_dump_to=to --xla_dump_hlo_as_text`
    would (`module_NNNN.<name>.before_optimizations.txt`, `...cpu_after_optimizations.txt`, buffer assignment
    and memory usage reports; with `passes`, one file per pass as `--xla_dump_hlo_pass_re=.*`), plus the
    inputs (`module_NNNN.<name>.inputs.npz`, keys arg0..) and XLA:CPU's outputs (`...outputs.npz`, out0..).
    Returns the paths: {"before", "after", "inputs", "outputs", "passes"}."""
    import jax
    from .tools.xla_cpu import save_arrays

    to = Path(to)
    to.mkdir(parents=True, exist_ok=True)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn, **{"keep_unused": True, **jit_kwargs})
    lowered = lower(jitted, *args, stage="pre")
    before = set(to.glob("*.before_optimizations.txt"))
    options = {"xla_dump_to": str(to), "xla_dump_hlo_as_text": True}
    if passes:
        options["xla_dump_hlo_pass_re"] = ".*"
    compiled = lowered.jax_lowered.compile(compiler_options=options)
    made = sorted(set(to.glob("*.before_optimizations.txt")) - before, key=os.path.getmtime)
    if not made:
        raise ExecutionError(f"XLA wrote no module to {to} (was {_name(fn)} compiled with these options before?)")
    prefix = str(made[-1])[: -len("before_optimizations.txt")]
    outputs = jax.tree_util.tree_leaves(jax.tree_util.tree_map(np.asarray, compiled(*args)))
    inputs, outputs_path = Path(prefix + "inputs.npz"), Path(prefix + "outputs.npz")
    save_arrays(inputs, {f"arg{i}": a for i, a in enumerate(lowered.inputs)})
    save_arrays(outputs_path, {f"out{i}": a for i, a in enumerate(outputs)})
    return {
        "before": Path(prefix + "before_optimizations.txt"),
        "after": next(iter(sorted(Path(prefix).parent.glob(Path(prefix).name + "*_after_optimizations.txt"))), None),
        "inputs": inputs,
        "outputs": outputs_path,
        "passes": sorted(Path(prefix).parent.glob(Path(prefix).name + "[0-9][0-9][0-9][0-9].*.txt")),
    }


@functools.lru_cache(maxsize=16)
def _load(text: str, device=None):
    """One prepared module per text and device: a test calling a jitted function in a loop prepares it once."""
    import hloexec

    return hloexec.load(text, device=device)


def _run_lowered(lowered: Lowered, device=None):
    from . import spmd

    exe = _load(lowered.text, device)
    inputs = [_as_parameter(x, p) for x, p in zip(lowered.inputs, exe.parameters)]
    module = exe.module
    n = module.num_partitions * module.replica_count
    if n == 1:
        result = exe.run(*inputs)
        flat = list(result) if module.entry.root.shape.is_tuple else [result]
    else:  # XLA's partitioned module: every participant; outputs assembled by jax's output shardings
        per_device = exe.run_spmd(spmd.split_inputs(module, inputs, n), report=lambda message: None)
        per_output = (
            [list(out) for out in per_device] if module.entry.root.shape.is_tuple else [[out] for out in per_device]
        )
        flat = [
            spmd.assemble_global([out[i] for out in per_output], sharding, shape)
            for i, (sharding, shape) in enumerate(_output_shardings(lowered))
        ]
    return lowered.outputs([np.asarray(x) for x in flat])


def _output_shardings(lowered: Lowered) -> list:
    """(hloexec Sharding, global shape) of each output leaf, from what jax compiled."""
    import jax
    from .ir.attributes import decode_sharding

    avals = jax.tree_util.tree_leaves(lowered.jax_lowered.out_info)
    shardings = jax.tree_util.tree_leaves(lowered.compiled.output_shardings)
    return [
        (decode_sharding(str(s._to_xla_hlo_sharding(len(a.shape)))), tuple(a.shape)) for s, a in zip(shardings, avals)
    ]


def _as_parameter(x: np.ndarray, param):
    """A leaf as the parameter's dtype: jax makes Python scalars weakly typed (a 2.0 may be an f32 parameter)."""
    if param.dtype is not None and x.dtype != param.dtype and x.ndim == 0:
        return x.astype(param.dtype)
    return x


def _name(fn) -> str:
    return str(getattr(fn, "__name__", None) or getattr(getattr(fn, "__wrapped__", None), "__name__", repr(fn)))
