"""hloexec's pytest plugin (registered through the `pytest11` entry point, so installing hloexec enables it).

- The fixture `hlo_reference`: `hlo_reference(fn, *args)` runs a jax function on XLA:CPU and with hloexec and
  asserts their outputs agree (failure: the per-output table and the worst elements); `hlo_reference(module,
  *inputs, expected=...)` runs HLO text, a path or a parsed Module with hloexec and compares with `expected`
  (default: XLA:CPU's outputs of the same text). Both return hloexec's outputs.
- `--hloexec-atol` / `--hloexec-rtol` replace the dtype-aware default tolerances of `hloexec compare`.
- `--hloexec-dumps DIR` (repeatable): every module of an XLA dump directory (`--xla_dump_to=DIR`, or one written
  by `hloexec.jax.dump`) becomes a test item, `DIR::module_NNNN.<name>`: its program before optimizations and
  after them run with hloexec on the same inputs (the dumped `inputs.npz` where there is one, else random ones
  from seed 0) and their outputs must agree (the tolerances above). A module dumped at one stage only is run.
  Partitioned (SPMD) optimized modules run every participant; their outputs are assembled by sharding.
- `@pytest.mark.hloexec` (optionally `(stage="opt", atol=..., rtol=...)`): every function the test jits with
  `jax.jit` while it runs is also run with hloexec on each concrete call, and compared with what jax returned.
  Functions jitted before the test started (a module-level `@jax.jit`) are not seen: call
  `hloexec.jax.check` for those.

Nothing here imports jax or compiles anything until a test asks for it: the plugin costs nothing to projects
that do not use it.
"""
from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("hloexec", "hloexec: HLO reference execution")
    group.addoption("--hloexec-atol", type=float, default=None,
                    help="absolute tolerance of hloexec comparisons (default: by output dtype, as hloexec compare)")
    group.addoption("--hloexec-rtol", type=float, default=None,
                    help="relative tolerance of hloexec comparisons (default: by output dtype, as hloexec compare)")
    group.addoption("--hloexec-dumps", action="append", default=[], metavar="DIR",
                    help="collect every module of an XLA dump directory as a test: run before and after "
                         "optimizations on the same inputs and compare (repeatable)")


def pytest_configure(config):
    config.addinivalue_line("markers", "hloexec(stage='pre', atol=None, rtol=None): also run the functions the test "
                                       "jits through hloexec, comparing with jax's outputs")


class HloReference:
    """What the `hlo_reference` fixture gives a test (see the module docstring)."""

    def __init__(self, atol: float | None = None, rtol: float | None = None):
        self.atol, self.rtol = atol, rtol

    def __call__(self, program, *args, expected=None, stage: str = "pre", atol: float | None = None,
                 rtol: float | None = None, **jit_kwargs):
        """`atol` / `rtol` replace the session's (--hloexec-atol / --hloexec-rtol) for this call."""
        __tracebackhide__ = True
        atol = self.atol if atol is None else atol
        rtol = self.rtol if rtol is None else rtol
        if callable(program) and not isinstance(program, str):
            from . import jax as hloexec_jax
            return hloexec_jax.check(program, *args, stage=stage, atol=atol, rtol=rtol, **jit_kwargs)
        return self.run_module(program, *args, expected=expected, atol=atol, rtol=rtol)

    def run_module(self, program, *inputs, expected=None, atol: float | None = None, rtol: float | None = None):
        """Run HLO text / a path / a Module with hloexec; compare with `expected` (a sequence of arrays, or one
        array), by default XLA:CPU's outputs of the same module."""
        __tracebackhide__ = True
        from pathlib import Path

        import hloexec
        from .exec.executor import Executable
        from .ir.printer import module_to_text
        from .tools.compare import compare_outputs, format_report
        if isinstance(program, hloexec.Module):
            exe, text = Executable(program), None
        else:
            exe = hloexec.load(program)
            text = Path(program).read_text() if isinstance(program, Path) or "\n" not in program else program
        outputs = exe.run(*inputs)
        flat = list(outputs) if isinstance(outputs, tuple) else [outputs]
        if expected is None:
            from .tools.xla_cpu import run_on_xla_cpu
            expected = run_on_xla_cpu(text or module_to_text(exe.module), list(inputs))
        elif not isinstance(expected, (list, tuple)):
            expected = [expected]
        report = compare_outputs(flat, list(expected), atol, rtol)
        if not report.passed:
            raise AssertionError(f"hloexec's outputs of {exe.module.name} differ from the reference:\n"
                                 f"{format_report(report)}")
        return outputs


@pytest.fixture
def hlo_reference(request) -> HloReference:
    """Run a jax function or an HLO module with hloexec and assert its outputs match the reference."""
    config = request.config
    return HloReference(config.getoption("hloexec_atol"), config.getoption("hloexec_rtol"))


@pytest.fixture(autouse=True)
def _hloexec_marker(request, monkeypatch):
    """Under @pytest.mark.hloexec, `jax.jit` makes functions whose concrete calls are checked with hloexec."""
    marker = request.node.get_closest_marker("hloexec")
    if marker is None:
        yield
        return
    import jax
    config = request.config
    options = {"stage": "pre", "atol": config.getoption("hloexec_atol"), "rtol": config.getoption("hloexec_rtol"),
               **marker.kwargs}
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
        ours = hloexec_jax.run(self._jitted, *args, stage=self._options["stage"])
        theirs = [jax.numpy.asarray(o) for o in jax.tree_util.tree_leaves(out)]
        report = compare_outputs(jax.tree_util.tree_leaves(ours), [jax.device_get(t) for t in theirs],
                                 self._options["atol"], self._options["rtol"])
        if not report.passed:
            raise AssertionError(f"hloexec differs from jax on {getattr(self._jitted, '__name__', 'a jitted function')}:"
                                 f"\n{format_report(report)}")
        return out

    def __getattr__(self, name):
        return getattr(self._jitted, name)


@pytest.hookimpl(tryfirst=True)         # before -k / -m deselect and xdist compare the collection
def pytest_collection_modifyitems(session, config, items):
    for directory in config.getoption("hloexec_dumps"):
        items.extend(DumpDirectory.from_parent(session, name=directory, nodeid=directory,
                                               path=Path(directory).resolve()).collect())


class DumpDirectory(pytest.Collector):
    """One --hloexec-dumps directory: a DumpItem per dumped module."""

    def collect(self):
        from .tools.dumpdir import DumpError, scan
        try:
            modules = scan(self.path)
        except DumpError as e:
            raise pytest.UsageError(f"--hloexec-dumps {self.path}: {e}") from None
        if not modules:
            raise pytest.UsageError(f"--hloexec-dumps {self.path}: no module dumps (module_NNNN.<name>.*.txt) there")
        return [DumpItem.from_parent(self, name=f"module_{m.number:04d}.{m.name}", module=m) for m in modules]


class DumpItem(pytest.Item):
    """A dumped module: before vs after optimizations, run with hloexec on the same inputs."""

    def __init__(self, *, module, **kwargs):
        super().__init__(**kwargs)
        self.module = module

    def runtest(self):
        from .tools.compare import compare_outputs, format_report
        stages = [s for s in (self.module.before, *self.module.after[:1]) if s is not None] or self.module.stages()[-1:]
        runs = [_load_stage(stage) for stage in stages]
        inputs = _dumped_inputs(self.module, runs[0][0]) or runs[0][0].random_inputs(seed=0)
        outputs = [_global_outputs(exe, inputs, pre_partition=runs[0][0].module) for exe, _ in runs]
        if len(outputs) == 2:
            report = compare_outputs(outputs[1], outputs[0], self.config.getoption("hloexec_atol"),
                                     self.config.getoption("hloexec_rtol"))
            if not report.passed:
                raise DumpMismatch(f"{runs[1][1]} vs {runs[0][1]}:\n{format_report(report)}")

    def repr_failure(self, excinfo):
        from .errors import ExecutionError, HloParseError, UnsupportedError
        if isinstance(excinfo.value, (DumpMismatch, HloParseError, UnsupportedError, ExecutionError)):
            return f"{self.name}: {excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, self.name


class DumpMismatch(AssertionError):
    """The optimized program's outputs differ from the program's before optimizations."""


def _load_stage(stage):
    import hloexec
    return hloexec.load(stage.text()), stage.path.name


def _dumped_inputs(module, exe) -> list | None:
    """The inputs hloexec.jax.dump saved beside the module (arg0..), as the parameters' types; None if none."""
    from .tools.arrays import read_values
    saved = [p for p in module.other if p.name.endswith(".inputs.npz")]
    if not saved:
        return None
    return read_values(saved[0], "arg", [p.shape for p in exe.parameters], what="entry arguments")


def _global_outputs(exe, inputs: list, pre_partition) -> list:
    """Flat global outputs: a partitioned module runs every participant on the inputs split by its parameters'
    shardings, its outputs assembled by the output shardings (`pre_partition` annotates where it has none)."""
    from .exec import spmd
    from .tools.cli import flatten
    module = exe.module
    partitions, replicas, _ = spmd.device_counts(module)
    n = partitions * replicas
    if n == 1 or module is pre_partition:
        return flatten(exe.run(*inputs))
    per_device = exe.run_spmd(spmd.split_inputs(module, inputs, n), report=lambda message: None)
    shapes = [leaf.dims for _, leaf in pre_partition.entry.root.shape.leaves()]
    return flatten(spmd.assemble_outputs(module, per_device, shapes, pre_partition))
