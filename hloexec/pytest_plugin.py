"""hloexec's pytest plugin (registered through the `pytest11` entry point, so installing hloexec enables it).

- The fixture `hlo_reference`: `hlo_reference(fn, *args)` runs a jax function on XLA:CPU and with hloexec and
  asserts their outputs agree (failure: the per-output table and the worst elements); `hlo_reference(module,
  *inputs, expected=...)` runs HLO text, a path or a parsed Module with hloexec and compares with `expected`
  (default: XLA:CPU's outputs of the same text). Both return hloexec's outputs.
- `--hloexec-atol` / `--hloexec-rtol` replace the dtype-aware default tolerances of `hloexec compare`.
- `--hloexec-reference shadow` (or `hlo_reference(..., reference="shadow")`, `@pytest.mark.hloexec(reference=
  "shadow")`): judge as `hloexec compare --reference shadow` does, every result against the program's exact
  answer with its own precision as the measure, instead of by tolerances: a correct bf16 result passes.
- `--hloexec-dumps DIR` (repeatable): every module of an XLA dump directory (`--xla_dump_to=DIR`, or one written
  by `hloexec.jax.dump`) becomes a test item, `DIR/<its first stage's file>::module_NNNN`: its program before optimizations and
  after them run with hloexec on the same inputs (the real ones the dump holds: an inputs.npz beside the
  module or a snapshot's arguments; else random ones from seed 0, drawn in the domains the program's uses
  imply) and their outputs must agree (the tolerances above; under the shadow reference, the optimized
  program's outputs and XLA's dumped ones, where there are some, are judged against the exact answer of the
  program before optimizations). A module dumped at one stage only is run. Partitioned (SPMD) optimized
  modules run every participant; their outputs are assembled by sharding. The node ids pytest prints run
  one module again: `pytest --hloexec-dumps DIR DIR/module_0004.jit_step.before_optimizations.txt::module_0004`.
- `@pytest.mark.hloexec` (optionally `(stage="opt", atol=..., rtol=...)`): every function the test jits with
  `jax.jit` while it runs is also run with hloexec on each concrete call, and compared with what jax returned.
  Functions jitted before the test started (a module-level `@jax.jit`) are not seen: call
  `hloexec.jax.check` for those.

Nothing here imports jax or compiles anything until a test asks for it: the plugin costs nothing to projects
that do not use it.
"""

from __future__ import annotations

from pathlib import Path

from .errors import OptionError

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("hloexec", "hloexec: HLO reference execution")
    group.addoption(
        "--hloexec-atol",
        type=float,
        default=None,
        help="absolute tolerance of hloexec comparisons (default: by output dtype, as hloexec compare)",
    )
    group.addoption(
        "--hloexec-rtol",
        type=float,
        default=None,
        help="relative tolerance of hloexec comparisons (default: by output dtype, as hloexec compare)",
    )
    group.addoption(
        "--hloexec-reference",
        choices=REFERENCES,
        default="xla",
        help="xla (default): compare with tolerances; shadow: judge every result against the "
        "program's exact answer by its own precision (hloexec compare --reference shadow)",
    )
    group.addoption(
        "--hloexec-dumps",
        action="append",
        default=[],
        metavar="DIR",
        help="collect every module of an XLA dump directory as a test: run before and after "
        "optimizations on the same inputs and compare (repeatable)",
    )
    group.addoption(
        "--hloexec-device",
        default=None,
        metavar="NAME|FILE",
        help="the device profile hloexec computes under (as hloexec run --device; default reference)",
    )


REFERENCES = ("xla", "shadow")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "hloexec(stage='pre', atol=None, rtol=None, reference='xla', device=None): also "
        "run the functions the test jits through hloexec, comparing with jax's outputs",
    )
    if config.getoption("hloexec_reference") == "shadow" and (
        config.getoption("hloexec_atol") is not None or config.getoption("hloexec_rtol") is not None
    ):
        raise pytest.UsageError(
            "--hloexec-reference shadow judges by the program's precision, not by --hloexec-atol / --hloexec-rtol"
        )
    # Each dump directory is collected as an argument (DumpDirectory), unless an argument already names it or
    # one of its files: `DIR/<file>::module_NNNN` (the node id pytest printed) runs that module alone.
    here = config.invocation_params.dir
    named = [(here / arg.split("::")[0]).resolve() for arg in config.args]
    for directory in config.getoption("hloexec_dumps"):
        path = (here / directory).resolve()
        _scan(path)
        if not any(p == path or path in p.parents for p in named):
            config.args.append(directory)


def _dump_directories(config) -> set:
    here = config.invocation_params.dir
    return {(here / d).resolve() for d in config.getoption("hloexec_dumps")}


class HloReference:
    """What the `hlo_reference` fixture gives a test (see the module docstring)."""

    def __init__(self, atol: float | None = None, rtol: float | None = None, reference: str = "xla", device=None):
        self.atol, self.rtol, self.reference, self.device = atol, rtol, reference, device

    def __call__(
        self,
        program,
        *args,
        expected=None,
        stage: str = "pre",
        atol: float | None = None,
        rtol: float | None = None,
        reference: str | None = None,
        device=None,
        **jit_kwargs,
    ):
        """`atol` / `rtol` / `reference` / `device` replace the session's (--hloexec-atol / --hloexec-rtol /
        --hloexec-reference / --hloexec-device) for this call."""
        __tracebackhide__ = True
        reference = reference or self.reference
        if reference not in REFERENCES:
            raise OptionError("reference", reference, REFERENCES)
        if reference == "xla":
            atol = self.atol if atol is None else atol
            rtol = self.rtol if rtol is None else rtol
        device = self.device if device is None else device
        if callable(program) and not isinstance(program, str):
            from . import jax as hloexec_jax

            return hloexec_jax.check(
                program, *args, reference=reference, stage=stage, atol=atol, rtol=rtol, device=device, **jit_kwargs
            )
        return self.run_module(
            program, *args, expected=expected, atol=atol, rtol=rtol, reference=reference, device=device
        )

    def run_module(
        self,
        program,
        *inputs,
        expected=None,
        atol: float | None = None,
        rtol: float | None = None,
        reference: str = "xla",
        device=None,
    ):
        """Run HLO text / a path / a Module with hloexec (under the device profile `device`, default the
        session's); compare with `expected` (a sequence of arrays, or one array), by default XLA:CPU's outputs of
        the same module. `reference="shadow"`: hloexec's outputs and `expected` are judged against the module's
        exact answer instead."""
        __tracebackhide__ = True

        import hloexec
        import hloexec.spmd  # noqa: F401  (fills exec's spmd_layer: manual regions run every participant)
        from .exec.executor import Executable
        from .ir.printer import module_to_text
        from .tools.compare import compare_outputs, format_report

        device = self.device if device is None else device
        if isinstance(program, hloexec.Module):
            exe, text = Executable(program, device=device), None
        else:
            exe = hloexec.load(program, device=device)
            text = Path(program).read_text() if isinstance(program, Path) or "\n" not in program else program
        if reference == "shadow" and (atol is not None or rtol is not None):
            raise ValueError("reference='shadow' judges by the program's precision, not by atol/rtol")
        if expected is None:
            from .tools.xla_cpu import run_on_xla_cpu

            expected = run_on_xla_cpu(text or module_to_text(exe.module), list(inputs))
        elif not isinstance(expected, (list, tuple)):
            expected = [expected]
        if reference == "shadow":
            from .tools.numerics import judge_run
            from .tools.verdict import format_verdict

            verdict, run = judge_run(exe, list(inputs), {"expected": list(expected)})
            if not verdict.consistent():
                raise AssertionError(
                    f"{exe.module.name}: not every result is as close to the exact answer as the "
                    f"program's precision allows:\n{format_verdict(verdict)}"
                )
            return tuple(run.outputs) if exe.module.entry.root.shape.is_tuple else run.outputs[0]
        outputs = exe.run(*inputs)
        flat = list(outputs) if isinstance(outputs, tuple) else [outputs]
        report = compare_outputs(flat, list(expected), atol, rtol)
        if not report.passed:
            raise AssertionError(
                f"hloexec's outputs of {exe.module.name} differ from the reference:\n{format_report(report)}"
            )
        return outputs


@pytest.fixture
def hlo_reference(request) -> HloReference:
    """Run a jax function or an HLO module with hloexec and assert its outputs match the reference."""
    config = request.config
    return HloReference(
        config.getoption("hloexec_atol"),
        config.getoption("hloexec_rtol"),
        config.getoption("hloexec_reference"),
        config.getoption("hloexec_device"),
    )


@pytest.fixture(autouse=True)
def _hloexec_marker(request, monkeypatch):
    """Under @pytest.mark.hloexec, `jax.jit` makes functions whose concrete calls are checked with hloexec."""
    marker = request.node.get_closest_marker("hloexec")
    if marker is None:
        yield
        return
    import jax

    config = request.config
    options = {
        "stage": "pre",
        "atol": config.getoption("hloexec_atol"),
        "rtol": config.getoption("hloexec_rtol"),
        "reference": config.getoption("hloexec_reference"),
        "device": config.getoption("hloexec_device"),
        **marker.kwargs,
    }
    original = jax.jit

    def jit(fun, *args, **kwargs):
        return _Checked(original(fun, *args, **kwargs), options)

    monkeypatch.setattr(jax, "jit", jit)
    yield


class _Checked:
    """A jitted function whose concrete calls also run with hloexec and compare (traced calls pass through)."""

    def __init__(self, jitted, options: dict):
        self._jitted, self._options = jitted, options

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        import jax

        out = self._jitted(*args, **kwargs)
        if kwargs or any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(args)):
            return out
        from . import jax as hloexec_jax
        from .tools.compare import compare_outputs, format_report

        if self._options["reference"] == "shadow":
            hloexec_jax.check(
                self._jitted, *args, reference="shadow", stage=self._options["stage"], device=self._options["device"]
            )
            return out
        ours = hloexec_jax.run(self._jitted, *args, stage=self._options["stage"], device=self._options["device"])
        theirs = [jax.numpy.asarray(o) for o in jax.tree_util.tree_leaves(out)]
        report = compare_outputs(
            jax.tree_util.tree_leaves(ours),
            [jax.device_get(t) for t in theirs],
            self._options["atol"],
            self._options["rtol"],
        )
        if not report.passed:
            raise AssertionError(
                f"hloexec differs from jax on {getattr(self._jitted, '__name__', 'a jitted function')}:"
                f"\n{format_report(report)}"
            )
        return out

    def __getattr__(self, name):
        return getattr(self._jitted, name)


def pytest_collect_directory(path, parent):
    """A --hloexec-dumps directory is collected by DumpDirectory (so that its items' node ids name it)."""
    if path.resolve() in _dump_directories(parent.config):
        return DumpDirectory.from_parent(parent, path=path)
    return None


class DumpDirectory(pytest.Directory):
    """One --hloexec-dumps directory: a DumpItem per dumped module."""

    def collect(self):
        return [
            DumpFile.from_parent(self, path=(m.stages() or [None])[0].path if m.stages() else self.path, module=m)
            for m in _scan(self.path)
        ]


def _scan(directory) -> list:
    """The modules dumped in `directory`; pytest.UsageError when it is not a dump directory."""
    from .tools.dumpdir import DumpError, scan

    try:
        modules = scan(directory)
    except DumpError as e:
        raise pytest.UsageError(f"--hloexec-dumps {directory}: {e}") from None
    if not modules:
        raise pytest.UsageError(f"--hloexec-dumps {directory}: no module dumps (module_NNNN.<name>.*.txt) there")
    return modules


class DumpFile(pytest.File):
    """A dumped module, under the file of its first stage: its item's node id is `DIR/<that file>::module_NNNN`,
    which pytest takes back as an argument (a directory argument cannot carry a `::` part)."""

    def __init__(self, *, module, **kwargs):
        super().__init__(**kwargs)
        self.module = module

    def collect(self):
        m = self.module
        return [DumpItem.from_parent(self, name=f"module_{m.number:04d}", module=m)]  # pytest splits names at "."


class DumpItem(pytest.Item):
    """A dumped module: before vs after optimizations, run with hloexec on the same inputs."""

    def __init__(self, *, module, **kwargs):
        super().__init__(**kwargs)
        self.module = module

    def runtest(self):
        from .tools.compare import compare_outputs, format_report

        # before vs after; else the one stage there is (DumpError naming the files when none is HLO)
        stages = [s for s in (self.module.before, *self.module.after[:1]) if s is not None] or [self.module.stage(None)]
        runs = [_load_stage(stage) for stage in stages]
        dumped = _dumped_inputs(self.module, runs[0][0])
        inputs = dumped or runs[0][0].random_inputs(seed=0)
        outputs = [_global_outputs(exe, inputs, pre_partition=runs[0][0].module) for exe, _ in runs[1:]]
        if self.config.getoption("hloexec_reference") == "shadow":
            xla = _dumped_outputs(self.module, runs[0][0]) if dumped else None
            self._judge_against_shadow(runs, inputs, outputs, xla=xla)
            return
        outputs.insert(0, _global_outputs(runs[0][0], inputs, pre_partition=runs[0][0].module))
        if len(outputs) == 2:
            report = compare_outputs(
                outputs[1], outputs[0], self.config.getoption("hloexec_atol"), self.config.getoption("hloexec_rtol")
            )
            if not report.passed:
                raise DumpMismatch(f"{runs[1][1]} vs {runs[0][1]}:\n{format_report(report)}")

    def _judge_against_shadow(self, runs, inputs, outputs, xla):
        """The optimized program's outputs (and XLA's, `xla`) against the exact answer of the first stage."""
        from .tools.numerics import judge_run
        from .tools.verdict import format_verdict

        candidates = {name: out for (_, name), out in zip(runs[1:], outputs)}
        if xla is not None:
            candidates["XLA (outputs.npz)"] = xla
        verdict, _ = judge_run(runs[0][0], inputs, candidates)
        if not verdict.consistent():
            raise DumpMismatch(f"against the shadow of {runs[0][1]}:\n{format_verdict(verdict)}")

    def repr_failure(self, excinfo):
        from .errors import ExecutionError, HloParseError, UnsupportedError

        if isinstance(excinfo.value, (DumpMismatch, HloParseError, UnsupportedError, ExecutionError)):
            return f"module_{self.module.number:04d}.{self.module.name}: {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, self.name


class DumpMismatch(AssertionError):
    """The optimized program's outputs differ from the program's before optimizations."""


def _load_stage(stage):
    import hloexec

    return hloexec.load(stage.text()), stage.path.name


def _dumped_inputs(module, exe) -> list | None:
    """The real inputs the dump holds for the module (an inputs.npz beside it, else a snapshot's arguments:
    dumpdir.dumped_inputs), as the parameters' types; None if none."""
    from .tools.arrays import read_values
    from .tools.dumpdir import dumped_inputs

    found = dumped_inputs(module)
    if found is None:
        return None
    return read_values(found[0], "arg", [p.shape for p in exe.parameters], what="entry arguments")


def _dumped_outputs(module, exe) -> list | None:
    """The outputs hloexec.jax.dump saved beside the module (XLA:CPU's, out0..), flat, as the leaves of `exe`'s
    result; None if none."""
    from .tools.arrays import read_values

    saved = [p for p in module.other if p.name == f"module_{module.number:04d}.{module.name}.outputs.npz"]
    leaves = [leaf for _, leaf in exe.result_shape.leaves()]
    return read_values(saved[0], "out", leaves, what="outputs") if saved else None


def _global_outputs(exe, inputs: list, pre_partition) -> list:
    """Flat global outputs: a partitioned module runs every participant on the inputs split by its parameters'
    shardings, its outputs assembled by the output shardings (`pre_partition` annotates where it has none)."""
    from . import spmd
    from .tools.arrays import flatten

    module = exe.module
    partitions, replicas, _ = spmd.device_counts(module)
    n = partitions * replicas
    if n == 1 or module is pre_partition:
        return flatten(exe.run(*inputs))
    per_device = exe.run_spmd(spmd.split_inputs(module, inputs, n), report=lambda message: None)
    shapes = [leaf.dims for _, leaf in pre_partition.entry.root.shape.leaves()]
    return flatten(spmd.assemble_outputs(module, per_device, shapes, pre_partition))
