"""Every module of the XLA corpus that XLA:CPU runs must run on hloexec and match XLA:CPU.

Modules: the files of ``shared/corpus/xla`` that STATUS.tsv marks ``xla_cpu_runs`` ``yes`` or
``partial``, split into modules on lines that are exactly ``// -----`` (as STATUS.tsv's maker did).
Each module runs on ``random_inputs(module, 0)`` (what ``Executable.random_inputs(0)`` gives: normal
floats, integers in [0, 4) except index parameters, which stay in bounds, fair-coin preds) on hloexec
and on XLA:CPU, in one long-lived child process per test process (`_XlaChild`: XLA aborts on some
modules and once segfaulted after many compiles in one process). Where XLA refuses a module of a
``partial`` file, and for every module of the files XLA does not run (already-fused GPU modules, GPU
custom-calls), hloexec must run it or raise an UnsupportedError naming what it lacks (the test is
then skipped with that text: ``pytest -rs`` lists what hloexec lacks); a module XLA calls invalid
(shape mismatch) may instead fail with an ExecutionError naming the instruction.

Comparison (``assert_matches_xla``): result dtypes and shapes always; values unless `_values_note`
gives a reason they are not comparable (rng, several participants run as one, dynamic dimensions,
elided constants, unstable sorts of tying keys, and the modules in `_VALUES_UNDEFINED`). Ints and
pred exactly; floats after flushing f32/f64 denormals on both sides (XLA:CPU runs with FTZ/DAZ),
NaN == NaN, infinities exactly, finite values within ``|hloexec - xla| <= rtol * (|xla| + scale)``,
``scale`` the largest finite |xla| of that output (a sum may cancel to near zero; its error stays
relative to what was summed). rtol is 8 ULP of the type for modules of elementwise ops only and a
stated bound (`_REDUCING_RTOL`) for modules that reduce, contract, loop or call.

The dumps from the field (``shared/corpus/external``: TF-era GPU clusters, pytorch/xla on Neuron and TPU, jax
GPU/TPU dumps, ...) and the seeds' small modules have no XLA:CPU reference: each must run -- as one participant,
and with all participants when it is partitioned -- or say what it lacks with an UnsupportedError naming the
instruction (a file XLA's parser refuses may fail to parse). Nowhere, in either corpus, may a failure be an
internal error (IndexError, KeyError, TypeError, AttributeError) of hloexec's, however it is wrapped.

Budget (CI: 2 cores, ``pytest -n 2``): XLA:CPU's compile dominates. hloexec runs with
``use_numba=False`` except for modules with two or more fusions (``use_numba=True``: Numba compiles
each fused kernel, ~0.3 s cold). Modules that take more than ~5 s on either side are marked ``slow``, and so
are the copies of a module another file holds too (the first runs by default); pyproject's addopts leave them
out of the default run (``-m slow`` runs them).
"""
from __future__ import annotations

import csv
import json
import os
import re
import select
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import hloexec
from hloexec.errors import UnsupportedError
from hloexec.exec.executor import available_memory
from hloexec.exec.inputs import random_inputs
from conftest import SHARED

CORPUS = SHARED / "corpus" / "xla"
SEED = 0
_INPUT_BUDGET = 1 << 30  # bytes of random inputs a refused module may take (gemma2 needs 10 GB)

# Modules whose values cannot be compared, keyed "file[index]" (or "file" for all its modules), beside
# the kinds `_values_note` recognizes (rng, several participants, dynamic dims, elided constants).
# They still run on hloexec; shapes and dtypes are checked against XLA's.
_VALUES_UNDEFINED = {
    "xla__hlo__translate__hlo_to_mhlo__tests__import_emit_stablehlo.hlo[82]":
        "variadic scatter whose second result is upd0 + upd1 (it forgets the current value): with repeated "
        "indices (inputs in [0, 4)) the result depends on the update order, which XLA leaves "
        "implementation-defined",
    "xla__backends__cpu__benchmarks__hlo__resnet50_keras_jax_f32.hlo":
        "XLA:CPU is inconsistent with itself: random normal batch-norm variances make rsqrt NaN; "
        "the optimized module drops the NaN in a fused max, and the same module with every "
        "intermediate as an output keeps it (and then agrees with hloexec everywhere)",
}

# Modules XLA:CPU runs only because its simplifier drops what it could not compile, which hloexec (running every
# instruction a live one reads, through tuples) refuses naming it: file -> what the refusal must say.
_REFUSED_WHERE_XLA_DROPS_IT = {
    # rng-bit-generator of an f32[4] state read only through a tuple element it does not pick (XLA:CPU: "Binary op
    # shift-right-logical with different element types" when it is live)
    "xla__tools__tests__hlo_extractor_test.hlo": "rng-bit-generator of a state f32[4]",
}

# Modules ("file" or "file[index]") that take more than ~5 s on XLA:CPU or hloexec.
_SLOW = {
    "xla__backends__cpu__benchmarks__hlo__gemma3_1b_flax_call.hlo",
    "xla__codegen__emitters__tests__loop__large_loop_slow_compile_time.hlo",
    "xla__service__gpu__tests__reduce_row_vectorized.hlo",
    "xla__tools__benchmarks__hlo__hlo_torax_iterhybrid_predictor_corrector_f64.hlo",
    "xla__hlo__translate__hlo_to_mhlo__tests__import_emit_stablehlo.hlo[133]",  # threefry through `map`, per element
    "xla__hlo__translate__hlo_to_mhlo__tests__layouts_and_names.hlo[0]",  # f16 conv, 128x224x224x4 input
    "xla__tools__hlo_opt__tests__gpu_hlo.hlo",  # 120 MB input
    "xla__tools__multihost_hlo_runner__data__fp8_gemm_loop.hlo",  # a dot per loop iteration
    "xla__tools__multihost_hlo_runner__data__sharded_computation.hlo",  # 52 s
    "xla__tools__data__benchmarking__mobilenet_v2.hlo",  # 51 s alone at load average 4 (2 cores)
    # 37-128 s each in `pytest -n 2` at load average 12-16 (2 cores; 2026-11-30); frag_0100.module_0019 (22 s) and
    # frag_0428.module_0002 (2 s), from the same jax issue, run by default
    "xla__backends__cpu__benchmarks__hlo__jax.issue.33666.linx.frag_0100.module_0005.hlo",
    "xla__backends__cpu__benchmarks__hlo__jax.issue.33666.linx.frag_0100.module_0009.hlo",
    "xla__backends__cpu__benchmarks__hlo__jax.issue.33666.linx.frag_0428.module_0004.hlo",
    "xla__backends__cpu__benchmarks__hlo__jax.issue.33666.linx.frag_0428.module_0009.hlo",
    "xla__backends__cpu__benchmarks__hlo__jax.issue.33666.linx.slow_0100.module_0007.hlo",
    "xla__backends__cpu__benchmarks__hlo__jax.issue.33666.linx.slow_0100.module_0013.hlo",
    "xla__backends__cpu__benchmarks__hlo__jax.issue.33666.linx.slow_0428.module_0003.hlo",
    "xla__backends__cpu__benchmarks__hlo__jax.issue.33666.linx.slow_0428.module_0006.hlo",
    "xla__backends__cpu__benchmarks__hlo__in_place_dynamic_update_slice_fusion.hlo",  # 62 s there
    "xla__backends__cpu__benchmarks__hlo__diffrax.b380012920.hlo",  # 52 s there
    "xla__hlo__translate__hlo_to_mhlo__tests__layouts_and_names.hlo[1]",  # f16[524,524,524] (288 MB) returned
    "xla__service__gpu__tests__prefetch.hlo",  # a cuBLAS gemm of an f16[1024,100000] input (XLA:CPU refuses): 60 s
}

# Opcodes after which results are only close, not a few ULP apart.
_REDUCING = {"reduce", "reduce-window", "select-and-scatter", "dot", "convolution", "fft", "while", "scatter",
             "custom-call", "all-reduce", "reduce-scatter", "cholesky", "triangular-solve", "map",
             "reduce-precision", "call", "fusion", "sort", "conditional"}
_ELEMENTWISE_ULPS = 8
_REDUCING_RTOL = {np.dtype(np.float64): 1e-9, np.dtype(np.float32): 2e-4, np.dtype(np.float16): 2e-2}
_LOW_FLOAT_RTOL = 8e-2  # bf16 and fp8 results of reducing modules


def _split_modules(text: str) -> list[str]:
    return "\n".join(line if line != "// -----" else "\0" for line in text.split("\n")).split("\0")


@lru_cache(maxsize=None)
def _status_rows() -> dict[str, dict]:
    with open(CORPUS / "STATUS.tsv", encoding="utf-8", newline="") as f:
        return {row["file"]: row for row in csv.DictReader(f, delimiter="\t")}


def _status() -> dict[str, str]:
    return {name: row["xla_cpu_runs"] for name, row in _status_rows().items()}


def _status_notes() -> dict[str, str]:
    return {name: row["note"] or "" for name, row in _status_rows().items()}


def _cases(runs: bool):
    """(id, file, index) of the modules of files XLA runs (`runs`) or refuses outright (not `runs`)."""
    if not CORPUS.is_dir():
        return [pytest.param(None, None, None, marks=pytest.mark.skip(reason="shared corpus absent"))]
    cases, in_ci = [], set()
    for name, status in sorted(_status().items()):
        xla_runs = status == "yes" or status.startswith("partial")
        if xla_runs != runs or status == "n/a":
            continue
        modules = _split_modules((CORPUS / name).read_text(encoding="utf-8", errors="surrogateescape"))
        for index, text in enumerate(modules):
            if "HloModule" not in text:
                continue
            # a module another file copies (XLA's tests share modules: four hlo_opt tests run the same 120 MB
            # one) runs once in the default run, its copies under -m slow
            lines = _module_lines(text)
            slow = name in _SLOW or f"{name}[{index}]" in _SLOW or lines in in_ci
            if not slow:
                in_ci.add(lines)
            marks = [pytest.mark.slow] if slow else []
            cases.append(pytest.param(f"{name}[{index}]", name, index, marks=marks, id=f"{name}[{index}]"))
    return cases


def _module_lines(text: str) -> tuple[str, ...]:
    """A module's lines without comment lines, blank lines and indentation: what two copies of it share."""
    lines = (line.strip() for line in text.split("\n"))
    return tuple(line for line in lines if line and not line.startswith("//"))


@lru_cache(maxsize=8)
def _module_text(name: str, index: int) -> str:
    return _split_modules((CORPUS / name).read_text(encoding="utf-8", errors="surrogateescape"))[index]


def _flatten(value) -> list:
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _flatten(v)]
    return [value]


def _leaf_shapes(shape):
    return shape.leaves() if shape.is_tuple else [((), shape)]


def _opcodes(module) -> set[str]:
    return {inst.opcode for comp in module.computations for inst in comp.instructions}


def _flush_denormals(x: np.ndarray) -> np.ndarray:
    if x.dtype in (np.float32, np.float64):
        x = np.where(np.abs(x) < np.finfo(x.dtype).tiny, np.zeros((), x.dtype), x)
    return x


def _rtol(dtype: np.dtype, reducing: bool) -> float:
    if not reducing:
        return _ELEMENTWISE_ULPS * float(ml_dtypes.finfo(dtype).eps)
    return _REDUCING_RTOL.get(dtype, _LOW_FLOAT_RTOL)


def assert_matches_xla(got: list, expected: list, *, reducing: bool, values: bool = True):
    assert len(got) == len(expected), f"{len(got)} outputs, XLA gives {len(expected)}"
    problems = []
    for k, (g, e) in enumerate(zip(got, expected)):
        g, e = np.asarray(g), np.asarray(e)
        if g.dtype != e.dtype or g.shape != e.shape:
            problems.append(f"output {k}: {g.dtype}{list(g.shape)}, XLA gives {e.dtype}{list(e.shape)}")
            continue
        if not values:
            continue
        if g.dtype.kind in "biu":
            wrong = g != e
            if wrong.any():
                i = int(np.argmax(wrong.ravel()))
                problems.append(f"output {k} {g.dtype}{list(g.shape)}: {int(wrong.sum())} differ, first at flat "
                                f"{i}: {g.ravel()[i]} vs XLA {e.ravel()[i]}")
            continue
        parts = [(g.real, e.real), (g.imag, e.imag)] if g.dtype.kind == "c" else [(g, e)]
        for gp, ep in parts:
            rtol = _rtol(gp.dtype, reducing)
            g64 = _flush_denormals(gp).astype(np.float64)
            e64 = _flush_denormals(ep).astype(np.float64)
            nan_g, nan_e = np.isnan(g64), np.isnan(e64)
            finite = np.isfinite(g64) & np.isfinite(e64)
            scale = float(np.max(np.abs(e64[np.isfinite(e64)]), initial=0.0))
            wrong = (nan_g != nan_e) | (~finite & ~nan_g & ~nan_e & (g64 != e64))
            with np.errstate(invalid="ignore", over="ignore"):
                wrong |= finite & (np.abs(g64 - e64) > rtol * (np.abs(e64) + scale))
            if wrong.any():
                i = int(np.argmax(wrong.ravel()))
                problems.append(f"output {k} {g.dtype}{list(g.shape)}: {int(wrong.sum())} differ beyond rtol {rtol:.3g} "
                                f"(scale {scale:.3g}), first at flat {i}: {gp.ravel()[i]!r} vs XLA {ep.ravel()[i]!r}")
    assert not problems, "\n".join(problems)


_ELIDED_CONSTANT = re.compile(r"constant\(\{\.\.\.\}\)")


_GROUPS_OF_SEVERAL = re.compile(r"replica_groups=(\{\{\d+,|\[|mesh)|source_target_pairs=\{\{\d+,\d+\}")
_DYNAMIC_DIM = re.compile(r"\[[^\]]*<=")


def _values_note(name: str, index: int, text: str, module) -> str | None:
    """Why this module's values cannot be compared with XLA's, or None."""
    opcodes = _opcodes(module)
    if "rng" in opcodes:
        return "rng without a fixed algorithm: XLA's generator is implementation-defined"
    if "GetRngSeed" in text:
        return "custom-call GetRngSeed: XLA:CPU's seed is implementation-defined (hloexec's is 0)"
    if "rng-get-and-update-state" in opcodes:
        return "rng-get-and-update-state reads XLA's process-global RNG state (depends on what ran before)"
    if module.replica_count > 1 or module.num_partitions > 1 or _GROUPS_OF_SEVERAL.search(text):
        return ("XLA:CPU runs it as the only participant (one replica, one partition); hloexec plays one of "
                "several identical participants (mirror communicator)")
    if _DYNAMIC_DIM.search(text):
        return ("bounded dynamic dimensions: XLA:CPU hands back the dynamic array packed into the bound-shaped "
                "buffer; hloexec keeps the static array (past the dynamic size both are padding)")
    unstable = [i for c in module.computations for i in c.instructions
                if i.opcode == "sort" and not i.attr("is_stable", False)
                and i.operands[0].shape.dtype not in (np.float32, np.float64)]
    if unstable:
        return (f"sort without is_stable of {unstable[0].operands[0].shape.dtype} keys: random keys tie, and the "
                "order of equal keys is unspecified")
    if _ELIDED_CONSTANT.search(text):
        return "an elided constant {...}: its values are not in the text (XLA and hloexec fill their own)"
    return _VALUES_UNDEFINED.get(f"{name}[{index}]") or _VALUES_UNDEFINED.get(name)


class _XlaChild:
    """One long-lived child process running XLA:CPU for this test process: it pays jax's start-up
    once, and a module that crashes XLA (seen in-process: a segfault in compile after many modules)
    costs one restart instead of the test session."""

    _SERVE = ("import sys\nfrom hloexec.tools import xla_cpu\n"
              "for line in sys.stdin:\n"
              "    rc = xla_cpu._child_main(line.strip())\n"
              "    print(rc, flush=True)\n")

    TIMEOUT = 240

    def __init__(self):
        self.proc = None

    def run(self, text: str, inputs: list) -> list:
        from hloexec.tools import xla_cpu
        try:
            return self._run_once(text, inputs)
        except xla_cpu.XlaCpuError as e:       # a hung child: once more in a fresh one
            if e.stage != "timeout":
                raise
            return self._run_once(text, inputs)

    def _run_once(self, text: str, inputs: list) -> list:
        from hloexec.tools import xla_cpu
        with tempfile.TemporaryDirectory(prefix="hloexec_corpus_") as d:
            Path(d, "module.hlo").write_text(text, encoding="utf-8", errors="surrogateescape")
            xla_cpu.save_arrays(str(Path(d, "inputs.npz")), {f"arg{i}": a for i, a in enumerate(inputs)})
            if self.proc is None or self.proc.poll() is not None:
                env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
                self.proc = subprocess.Popen([sys.executable, "-P", "-c", self._SERVE], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                             cwd=str(Path(__file__).resolve().parent.parent))
            self.proc.stdin.write(d + "\n")
            self.proc.stdin.flush()
            # jaxlib's child has been seen to hang for good (a spin lock inside re2 while converting a module):
            # a module gets TIMEOUT seconds, then the child is replaced and the module is XLA's failure
            if not select.select([self.proc.stdout], [], [], self.TIMEOUT)[0]:
                self.proc.kill()
                self.proc.wait()
                raise xla_cpu.XlaCpuError(f"XLA:CPU child gave no answer in {self.TIMEOUT} s", stage="timeout")
            if not self.proc.stdout.readline():
                rc = self.proc.wait()
                raise xla_cpu.XlaCpuError(f"XLA:CPU child died (status {rc})", stage="child", returncode=rc)
            error = Path(d, "error.json")
            if error.exists():
                info = json.loads(error.read_text(encoding="utf-8"))
                raise xla_cpu.XlaCpuError(info["message"], stage=info.get("stage", ""))
            outputs = xla_cpu.load_arrays(str(Path(d, "outputs.npz")))
            return [outputs[f"out{i}"] for i in range(len(outputs))]


_XLA = _XlaChild()


@pytest.mark.xla
@pytest.mark.parametrize("case_id, name, index", _cases(runs=True))
def test_module_matches_xla_cpu(case_id, name, index):
    from hloexec.tools.xla_cpu import XlaCpuError
    text = _module_text(name, index)
    module = hloexec.parse(text)[0]
    if any(d < 0 for p in module.entry.parameters for _, s in _leaf_shapes(p.shape) for d in s.dims):
        pytest.skip("a parameter with an unbounded dynamic dimension (?): hloexec runs static shapes only")
    inputs = random_inputs(module, SEED)  # what Executable.random_inputs gives, before hloexec prepares
    try:
        expected = _XLA.run(text, _flatten(inputs))
    except XlaCpuError as e:
        if _status()[name] == "yes":
            raise
        _check_runs_or_unsupported(text, inputs, f"XLA refuses it ({e.stage}): {e.message[:200]}",
                                   invalid=bool(_XLA_SAYS_INVALID.search(e.message)))
        return
    exe = hloexec.load(text, use_numba=_uses_numba(text), compile="eager")
    if name in _REFUSED_WHERE_XLA_DROPS_IT:
        with pytest.raises(UnsupportedError, match=re.escape(_REFUSED_WHERE_XLA_DROPS_IT[name])) as refused:
            exe.run(*inputs)
        assert "\n  in %" in str(refused.value)
        return
    got = _flatten(exe.run(*inputs))
    note = _values_note(name, index, text, module)
    assert_matches_xla(got, expected, reducing=bool(_opcodes(module) & _REDUCING), values=note is None)


# XLA's words for a module that breaks its own shape rules: hloexec must then fail too, naming where.
_XLA_SAYS_INVALID = re.compile(r"mismatch|incompatible|not compatible|verifier|Expected instruction to have shape")


def _uses_numba(text: str) -> bool:
    """Compile what Numba would (fusions, whole while loops, kernels/program.py) where the module has
    loops or several fusions; op by op elsewhere, where compiling would cost more than the run."""
    return text.count(" fusion(") >= 2 or " while(" in text


def _check_runs_or_unsupported(text: str, inputs, context: str, invalid: bool = False):
    """hloexec runs the module, or raises UnsupportedError (skip, naming what it lacks), or -- for a
    module XLA calls invalid -- an ExecutionError naming the instruction."""
    try:
        exe = hloexec.load(text, use_numba=_uses_numba(text), compile="eager")
        available = available_memory()
        if available is not None and exe.peak_bytes() > available:
            pytest.skip(f"needs {exe.peak_bytes() / 2**30:.2f} GiB at its peak, {available / 2**30:.2f} GiB "
                        "available now (other processes hold the rest)")
        exe.run(*inputs)
    except UnsupportedError as e:
        pytest.skip(f"unsupported: {e.what} ({context})")
    except hloexec.ExecutionError as e:
        _not_internal(e)
        if not invalid or "\n  in %" not in str(e):
            raise
        # XLA calls the module invalid and hloexec refuses it too, naming the instruction: that passes.


@pytest.mark.parametrize("case_id, name, index", _cases(runs=False))
def test_refused_module_runs(case_id, name, index):
    """Modules XLA:CPU does not run (fused GPU modules, GPU custom-calls): hloexec runs them or says
    what it lacks with an UnsupportedError."""
    text = _module_text(name, index)
    try:
        module = hloexec.parse(text)[0]
    except hloexec.HloParseError as e:
        pytest.skip(f"not HLO that hloexec parses (XLA's parser: {_status()[name]}): {str(e)[:200]}")
    input_bytes = sum(s.size * s.element_type.bits // 8 for p in module.entry.parameters
                      for _, s in _leaf_shapes(p.shape) if s.element_type.numpy is not None)
    if input_bytes > _INPUT_BUDGET:
        pytest.skip(f"inputs of {input_bytes / 2**30:.1f} GiB: beyond this test's budget (STATUS skipped > 3 GiB)")
    note = _status_notes()[name]
    _check_runs_or_unsupported(text, random_inputs(module, SEED), f"XLA refuses the file: {note[:200]}",
                               invalid=bool(_XLA_SAYS_INVALID.search(note)))


@pytest.mark.parametrize("runs", [True, False])
def test_the_default_run_runs_each_module_once(runs):
    """Copies of a module (in other files) stay out of the default run: CI's time goes to distinct modules."""
    if not CORPUS.is_dir():
        pytest.skip("shared corpus absent")
    texts = [_module_text(name, index) for _, name, index in
             (p.values for p in _cases(runs) if not any(m.name == "slow" for m in p.marks))]
    assert len({_module_lines(t) for t in texts}) == len(texts) > 100


def test_split_matches_status():
    """The module split agrees with STATUS.tsv's module counts (so the case list is the one XLA saw)."""
    if not CORPUS.is_dir():
        pytest.skip("shared corpus absent")
    with open(CORPUS / "STATUS.tsv", encoding="utf-8", newline="") as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t") if r["xla_cpu_runs"] not in ("n/a", "no")]
    mismatched = []
    for row in rows:
        modules = _split_modules((CORPUS / row["file"]).read_text(encoding="utf-8", errors="surrogateescape"))
        if len(modules) != int(row["modules"]):
            mismatched.append((row["file"], len(modules), row["modules"]))
    assert not mismatched



# -- dumps from the field and the seeds ------------------------------------------------------------------
EXTERNAL = SHARED / "corpus" / "external"
SEEDS = SHARED / "seeds"
_INTERNAL = (IndexError, KeyError, TypeError, AttributeError, NameError, AssertionError, RecursionError)
# Longer than ~5 s here: parsed and prepared (every op's form checked) in the default run, run under -m slow.
_FIELD_SLOW = {"jaxdecomp_jaxfft_fft_f32_8dev_gpu_opt.hlo",      # 1 GB arrays: 65 s for one participant
               "tf2_gpu_bert_fp16_train_cluster.hlo",             # 24 s
               "tf1_gpu_maskrcnn_infer_cluster_convbias.hlo",     # 270 s in `pytest -n 2` at load average 15
               "xmap_train_step_4dev.hlo", "xmap_train_step_log.txt", "tpu_seqparallel_remat_8dev.hlo"}  # and
# their SPMD runs (the seeds run in tests/test_seeds_run.py and test_spmd_seeds.py too)
_FIELD_SLOW_SPMD = {"jaxdecomp_jaxfft_ifft_f64_16dev_gpu_opt.hlo", "torchxla_neuron_llama2_tp4_pp2.hlo"}
_SMALL_SEED = 100_000       # bytes: the GPT and Llama seeds run in their own (slow) tests


def _not_internal(e: BaseException) -> None:
    """Fail when `e`, or what it was raised from, is an internal error of hloexec's."""
    seen = e
    while seen is not None:
        assert not isinstance(seen, _INTERNAL), f"internal error {type(seen).__name__}: {seen} (from {e!r})"
        seen = seen.__cause__


def _field_cases():
    """(path, what): "run" (one participant, and all of them when partitioned), or for the files above, "prepare"
    (parse and prepare only) by default and "run" / "spmd" (all participants) under -m slow."""
    if not EXTERNAL.is_dir():
        return [pytest.param(None, None, marks=pytest.mark.skip(reason="shared corpus absent"))]
    files = sorted((EXTERNAL / "files").glob("*.hlo")) + sorted(
        p for p in SEEDS.iterdir() if p.stat().st_size < _SMALL_SEED and p.suffix in (".hlo", ".txt")
        and "HloModule" in p.read_text(errors="replace"))
    cases = []
    for p in files:
        if p.name in _FIELD_SLOW:
            cases += [pytest.param(p, "prepare", id=p.name),
                      pytest.param(p, "run", id=f"{p.name}-run", marks=pytest.mark.slow)]
        elif p.name in _FIELD_SLOW_SPMD:
            cases += [pytest.param(p, "one participant", id=p.name),
                      pytest.param(p, "spmd", id=f"{p.name}-spmd", marks=pytest.mark.slow)]
        else:
            cases.append(pytest.param(p, "run", id=p.name))
    return cases


@lru_cache(maxsize=None)
def _external_status() -> dict[str, dict]:
    with open(EXTERNAL / "STATUS.tsv", encoding="utf-8", newline="") as f:
        return {row["file"]: row for row in csv.DictReader(f, delimiter="\t")}


@pytest.mark.parametrize("path, what", _field_cases())
def test_field_dump_runs_or_says_what_it_lacks(path, what):
    """`hloexec run FILE --seed 0`, and with all participants where FILE is partitioned: success, or an
    UnsupportedError naming the instruction, or (where XLA's parser refuses the file too) an HloParseError."""
    from hloexec import spmd
    try:
        exe = hloexec.load(path)
        if what == "prepare":
            return
        if what != "spmd":
            exe.run(*exe.random_inputs(0))
        partitions, replicas, _ = spmd.device_counts(exe.module)
        if partitions * replicas > 1 and not exe.manual_regions and what in ("run", "spmd"):
            exe.run_spmd(spmd.random_inputs(exe.module, partitions * replicas, 0), report=lambda message: None)
    except UnsupportedError as e:
        _not_internal(e)
        assert e.instruction is not None, f"UnsupportedError naming no instruction: {e}"
        pytest.skip(f"unsupported: {e.what}")
    except hloexec.HloParseError as e:
        assert _external_status().get(path.name, {}).get("xla_parses", "").startswith("no"), str(e)
        pytest.skip(f"XLA's parser refuses it too: {e.message}")
    except hloexec.ExecutionError as e:
        _not_internal(e)
        if "participants need about" not in str(e):             # the machine cannot hold an SPMD run
            raise
        pytest.skip(str(e).splitlines()[0])
