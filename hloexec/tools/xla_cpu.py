"""Run HLO text on XLA:CPU through jaxlib -- the reference hloexec is tested against.

jax/jaxlib is an optional extra (``pip install .[test]``).  Nothing here imports
jax at module import time: importing this module is cheap and safe without jax
(the npz helpers ``save_arrays`` / ``load_arrays`` work with numpy + ml_dtypes
only, so a clone without jax can still read ``examples/*.npz``).

Route (jaxlib 0.10.2)::

    xla_client.hlo.hlo_module_from_text(text)            # XLA's HLO parser (no verifier)
      .as_serialized_hlo_module_proto()
    xla_client._xla.mlir.hlo_to_stablehlo(proto)         # HLO -> StableHLO bytecode
    cpu_client.compile_and_load(stablehlo, DeviceList((cpu,)), CompileOptions())
    executable.execute_sharded([jax.device_put(x, cpu) ...])
      .disassemble_into_single_device_arrays()           # tuple results come back flat

Notes
-----
* Importing jax through this module turns on ``jax_enable_x64`` (process wide) so
  f64/s64/u64 inputs are not silently downcast.
* The HLO goes through StableHLO, so it is re-optimized by XLA:CPU's full
  pipeline; layouts in ``entry_computation_layout`` are dropped (inputs and
  outputs are always dense row-major numpy arrays).
* XLA can abort the whole process on some inputs (post-optimization text,
  fusion without backend config, layout CHECKs).  Use
  ``run_on_xla_cpu_isolated`` for untrusted/odd text: it runs in a child
  process and turns any death into ``XlaCpuError``.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import IO, Any
from collections.abc import Sequence

import numpy as np

__all__ = [
    "XlaCpuError",
    "xla_cpu_available",
    "parse_with_xla",
    "xla_instruction_shapes",
    "run_on_xla_cpu",
    "run_on_xla_cpu_timed",
    "run_on_xla_cpu_isolated",
    "save_arrays",
    "load_arrays",
]


class XlaCpuError(RuntimeError):
    """XLA refused the module (parse/convert/compile/run error) or the child died.

    ``message`` is XLA's own error text (or a description of the child's death
    including the signal and the tail of its stderr); ``stage`` is one of
    "parse", "convert", "compile", "execute", "inputs", "child", "timeout", "import" (no jax).
    """

    def __init__(self, message: str, stage: str = "", returncode: int | None = None):
        super().__init__(message)
        self.message = message
        self.stage = stage
        self.returncode = returncode


# --------------------------------------------------------------------------
# lazy jax


_JAX = None


NO_JAX = (
    "XLA:CPU is run through jax and jaxlib, which are not installed: pip install 'hloexec[jax]' (or 'hloexec[test]')"
)


def _jax():
    """Import jax lazily, with x64 enabled, CPU only.  Returns (jax, xla_client)."""
    global _JAX
    if _JAX is None:
        os.environ.setdefault("JAX_ENABLE_X64", "1")
        if importlib.util.find_spec("jax") is None:
            raise XlaCpuError(NO_JAX, stage="import")
        import jax  # noqa: PLC0415
        from jax._src.lib import xla_client  # noqa: PLC0415

        jax.config.update("jax_enable_x64", True)
        _JAX = (jax, xla_client)
    return _JAX


def xla_cpu_available() -> bool:
    """True if jax/jaxlib import and expose the HLO-text -> CPU route."""
    try:
        jax, xc = _jax()
        xc.hlo.hlo_module_from_text  # noqa: B018
        xc._xla.mlir.hlo_to_stablehlo  # noqa: B018
        jax.devices("cpu")
        return True
    except Exception:  # ImportError, AttributeError, RuntimeError (no CPU backend)
        return False


def _err_text(e: BaseException) -> str:
    s = str(e)
    return s if s else type(e).__name__


# --------------------------------------------------------------------------
# parsing (XLA's parser, for comparing parse results)


def _parse_module(text: str):
    _, xc = _jax()
    try:
        return xc.hlo.hlo_module_from_text(text)
    except Exception as e:
        raise XlaCpuError(_err_text(e), stage="parse") from e


def _shape_str(shape) -> str:
    """Shape -> HLO text without layout, e.g. 'f32[2,3]', '(f32[], s32[4])'."""
    if shape.is_tuple():
        return "(" + ", ".join(_shape_str(s) for s in shape.tuple_shapes()) + ")"
    if shape.is_token():
        return "token[]"
    s = str(shape)  # e.g. 'f32[2,3]{1,0}'
    return _strip_layout(s)


def _strip_layout(s: str) -> str:
    """Drop '{...}' layouts from a shape string: 'f32[2,3]{1,0}' -> 'f32[2,3]'."""
    out = []
    depth = 0
    for ch in s:
        if ch == "{":
            depth += 1
            continue
        if ch == "}":
            depth -= 1
            continue
        if depth == 0:
            out.append(ch)
    return "".join(out)


_ENTRY_RE = re.compile(r"^ENTRY\s+%?([^\s(]+)", re.M)


def parse_with_xla(text: str) -> dict[str, Any]:
    """Parse HLO text with XLA's own parser and summarize it.

    Note: ``hlo_module_from_text`` parses but does not run the HLO verifier (a
    shape-inconsistent module parses fine and only fails at compile time).

    Returns a dict::

        {
          "module_name": str,
          "entry": str,                          # entry computation name
          "computations": {name: n_instructions} # in XLA's order
          "opcodes": {name: [opcode, ...]},      # e.g. 'add', 'get-tuple-element'
          "total_instructions": int,
          "parameter_shapes": [str, ...],        # entry params, no layouts
          "result_shape": str,                   # no layout; tuples as '(a, b)'
          "parameter_shapes_with_layout": [...], "result_shape_with_layout": str,
        }
    """
    _, xc = _jax()
    mod = _parse_module(text)
    comps: OrderedDict[str, int] = OrderedDict()
    opcodes: dict[str, list[str]] = {}
    for comp in mod.computations():
        instrs = comp.instructions()
        comps[comp.name] = len(instrs)
        opcodes[comp.name] = [_opcode_name(i.opcode) for i in instrs]
    printed = mod.to_string()
    m = _ENTRY_RE.search(printed)
    entry = m.group(1) if m else ""
    comp_obj = xc.XlaComputation(mod.as_serialized_hlo_module_proto())
    ps = comp_obj.program_shape()
    params = list(ps.parameter_shapes())
    res = ps.result_shape()
    return {
        "module_name": mod.name,
        "entry": entry,
        "computations": dict(comps),
        "opcodes": opcodes,
        "total_instructions": sum(comps.values()),
        "parameter_shapes": [_shape_str(p) for p in params],
        "result_shape": _shape_str(res),
        "parameter_shapes_with_layout": [str(p) for p in params],
        "result_shape_with_layout": str(res),
    }


def _opcode_name(op) -> str:
    """HloOpcode.kGetTupleElement -> 'get-tuple-element' (HLO text spelling)."""
    name = getattr(op, "name", str(op).split(".")[-1])
    if name.startswith("k"):
        name = name[1:]
    special = {
        "GetTupleElement": "get-tuple-element",
        "DynamicSlice": "dynamic-slice",
        "DynamicUpdateSlice": "dynamic-update-slice",
        "ReduceWindow": "reduce-window",
        "SelectAndScatter": "select-and-scatter",
    }
    if name in special:
        return special[name]
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", name).lower()


_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%?([^\s=]+)\s*=\s*(.*)$")


def _split_shape(rest: str) -> str:
    """Leading shape of '<shape> opcode(...)...'; tuples matched by parens."""
    rest = rest.lstrip()
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    return rest[: i + 1]
        return rest
    # array shape: up to the first space outside {} (layouts have no spaces,
    # but be careful anyway)
    depth = 0
    for i, ch in enumerate(rest):
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == " " and depth == 0:
            return rest[:i]
    return rest


def xla_instruction_shapes(text: str, with_layout: bool = False) -> dict[str, str]:
    """{instruction name -> shape string} over all computations, via XLA's parser.

    Names are as XLA prints them (without '%').  Shapes have layouts stripped
    unless ``with_layout``.  XLA may rename instructions only when names clash;
    for well-formed input the names are the ones in the text.
    """
    mod = _parse_module(text)
    out: dict[str, str] = {}
    for comp in mod.computations():
        for ins in comp.instructions():
            line = ins.to_string().split("\n", 1)[0]
            m = _INSTR_RE.match(line)
            if not m:
                continue
            shp = _split_shape(m.group(2))
            out[ins.name] = shp if with_layout else _strip_layout(shp)
    return out


# --------------------------------------------------------------------------
# compile + run in process


_CACHE: OrderedDict[str, tuple[Any, Any, dict[str, float]]] = OrderedDict()
_CACHE_MAX = 16


def _compile(text: str, use_cache: bool = True):
    """-> (loaded_executable, program_shape, {"parse_s","convert_s","compile_s"})."""
    key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    if use_cache and key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    jax, xc = _jax()
    t0 = time.perf_counter()
    mod = _parse_module(text)
    proto = mod.as_serialized_hlo_module_proto()
    pshape = xc.XlaComputation(proto).program_shape()
    t1 = time.perf_counter()
    try:
        stablehlo = xc._xla.mlir.hlo_to_stablehlo(proto)
    except Exception as e:
        raise XlaCpuError(_err_text(e), stage="convert") from e
    t2 = time.perf_counter()
    dev = jax.devices("cpu")[0]
    try:
        exe = dev.client.compile_and_load(stablehlo, xc.DeviceList((dev,)), xc.CompileOptions())
    except Exception as e:
        raise XlaCpuError(_err_text(e), stage="compile") from e
    t3 = time.perf_counter()
    res = (exe, pshape, {"parse_s": t1 - t0, "convert_s": t2 - t1, "compile_s": t3 - t2})
    if use_cache:
        _CACHE[key] = res
        while len(_CACHE) > _CACHE_MAX:
            _CACHE.popitem(last=False)
    return res


def _leaf_shapes(shape) -> list:
    if shape.is_tuple():
        out = []
        for s in shape.tuple_shapes():
            out.extend(_leaf_shapes(s))
        return out
    return [shape]


def _check_inputs(pshape, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    params = []
    for p in pshape.parameter_shapes():
        params.extend(_leaf_shapes(p))  # tuple params: pass their leaves in order
    arrs = [np.asarray(x) for x in inputs]
    if len(arrs) != len(params):
        raise XlaCpuError(f"entry takes {len(params)} (leaf) parameters, got {len(arrs)} inputs", stage="inputs")
    for i, (a, p) in enumerate(zip(arrs, params)):
        if p.is_token():
            raise XlaCpuError(f"parameter {i} is a token: not supported", stage="inputs")
        want_dt = np.dtype(p.numpy_dtype())
        want_shape = tuple(p.dimensions())
        if a.dtype != want_dt or a.shape != want_shape:
            raise XlaCpuError(
                f"input {i}: got {a.dtype}{list(a.shape)}, parameter is {_shape_str(p)} ({want_dt}{list(want_shape)})",
                stage="inputs",
            )
    return [np.asarray(a, order="C") for a in arrs]  # (ascontiguousarray makes 0-d 1-d)


def _execute(exe, arrs: list[np.ndarray]) -> list[np.ndarray]:
    jax, _ = _jax()
    dev = jax.devices("cpu")[0]
    try:
        bufs = [jax.device_put(a, dev) for a in arrs]
        res = exe.execute_sharded(bufs)
        outs = res.disassemble_into_single_device_arrays()
        # outs: one list per (flattened) output, one array per device
        return [np.array(o[0]) for o in outs]
    except Exception as e:
        raise XlaCpuError(_err_text(e), stage="execute") from e


def run_on_xla_cpu(text: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Compile HLO text with XLA:CPU (in this process) and run it once.

    ``inputs`` are numpy arrays in entry-parameter order (dtype and shape must
    match exactly; bf16/fp8 as ml_dtypes arrays, pred as bool).  Returns the
    outputs as numpy arrays; a tuple root is flattened (depth-first) into a list.
    Compiled executables are cached by text hash (last 16).
    """
    exe, pshape, _ = _compile(text)
    return _execute(exe, _check_inputs(pshape, inputs))


def run_on_xla_cpu_timed(
    text: str, inputs: Sequence[np.ndarray], warm_runs: int = 5
) -> tuple[list[np.ndarray], dict[str, float]]:
    """Like ``run_on_xla_cpu`` but never cached, returning (outputs, timings).

    timings (seconds): parse_s (XLA text parse), convert_s (HLO->StableHLO),
    compile_s (XLA:CPU compile), first_run_s and warm_run_s (median of
    ``warm_runs``), warm_run_min_s.  Runs include host->device put and the
    copy back to numpy (what a numpy-in/numpy-out evaluator also pays).
    """
    exe, pshape, t = _compile(text, use_cache=False)
    arrs = _check_inputs(pshape, inputs)
    t0 = time.perf_counter()
    outs = _execute(exe, arrs)
    t1 = time.perf_counter()
    warm = []
    for _ in range(max(1, warm_runs)):
        a = time.perf_counter()
        _execute(exe, arrs)
        warm.append(time.perf_counter() - a)
    timings = dict(t)
    timings["first_run_s"] = t1 - t0
    timings["warm_run_s"] = float(np.median(warm))
    timings["warm_run_min_s"] = float(min(warm))
    return outs, timings


# --------------------------------------------------------------------------
# npz that keeps bf16 / fp8 / int4 (ml_dtypes) dtypes


_DTYPES_KEY = "__dtypes__"


def _is_plain_numpy(dt: np.dtype) -> bool:
    # dtypes np.load reconstructs exactly: builtin numeric/bool kinds
    return dt.kind in "biufc" and dt.type.__module__ == "numpy"


def _dtype_from_name(name: str) -> np.dtype:
    try:
        import ml_dtypes  # noqa: PLC0415

        if hasattr(ml_dtypes, name):
            return np.dtype(getattr(ml_dtypes, name))
    except ImportError:
        pass
    return np.dtype(name)


def save_arrays(path: str | os.PathLike, arrays: dict[str, np.ndarray], compress: bool = False) -> None:
    """np.savez that survives ml_dtypes (bf16, fp8, int4...).

    Plain numpy dtypes are stored as is.  Other dtypes are stored as the raw
    bytes viewed as uint<itemsize*8> with the same shape, and the real dtype
    names go into the extra key ``__dtypes__`` (a JSON string {key: name}).
    ``compress`` uses np.savez_compressed (np.load reads both). The file is `path` as given (np.savez would
    add ``.npz`` to a name without it, and write where no one said).
    """
    store: dict[str, Any] = {}  # arrays (Any: numpy's stub checks np.savez's **kwds against its allow_pickle)
    names: dict[str, str] = {}
    for k, a in arrays.items():
        a = np.asarray(a, order="C")
        if _is_plain_numpy(a.dtype):
            store[k] = a
        elif a.dtype.type is np.void:  # no type to name: the reader could not restore it
            raise ValueError(f"array {k!r} is raw void ({a.dtype.str}): view it as its ml_dtypes type first")
        else:
            store[k] = a.view(np.dtype(f"u{a.dtype.itemsize}"))
            names[k] = a.dtype.name
    if names:
        store[_DTYPES_KEY] = np.array(json.dumps(names))
    with open_output(path, "wb") as f:
        (np.savez_compressed if compress else np.savez)(f, **store)


@contextmanager
def open_output(path: str | os.PathLike, mode: str = "w"):
    """open(path, mode) for a file a command writes (text in UTF-8), a failing write (a full disk: no file named)
    raised as an OSError naming `path`."""
    try:
        with open(path, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
    except OSError as e:
        if e.filename is None:
            raise OSError(e.errno, e.strerror, os.fspath(path)) from e
        raise


def load_arrays(path: str | IO[bytes]) -> OrderedDict[str, np.ndarray]:
    """Inverse of ``save_arrays``: {key: array} in stored order (no ``__dtypes__``). A file numpy cannot read
    raises what np.load raises; an array that cannot be read, ValueError naming it (hloexec.tools.arrays says
    both to the user)."""
    out: OrderedDict[str, np.ndarray] = OrderedDict()
    with np.load(path, allow_pickle=False) as z:
        names = _stored_dtype_names(z)
        for k in z.files:
            if k == _DTYPES_KEY:
                continue
            try:
                a = _read_member(z, k)
                name = names.get(k)
                out[k] = a if name is None else a.view(_dtype_from_name(name))
            except Exception as e:  # noqa: BLE001 - a truncated member, an object array, a bad type name
                raise ValueError(f"array {k!r} cannot be read ({type(e).__name__}: {e})") from e
    return out


def _read_member(z, key: str) -> np.ndarray:
    """z[key]; but an array np.save wrote from ml_dtypes' float8_e5m2 (the one ml_dtypes type it describes as
    '<f1', a descr numpy does not read back; the others are raw void) is read as its bytes in that type."""
    try:
        return z[key]
    except ValueError as e:
        if "'<f1'" not in str(e) and "'|f1'" not in str(e):
            raise
    with z.zip.open(f"{key}.npy") as f:
        version = np.lib.format.read_magic(f)
        size = int.from_bytes(f.read(2 if version == (1, 0) else 4), "little")
        header = ast.literal_eval(f.read(size).decode("latin1"))
        raw = np.frombuffer(f.read(), np.uint8)
    shape = tuple(header["shape"])
    return raw.reshape(shape, order="F" if header["fortran_order"] else "C").view(_dtype_from_name("float8_e5m2"))


def _stored_dtype_names(z) -> dict[str, str]:
    """``__dtypes__`` of an open npz: {key: ml_dtypes type name}."""
    if _DTYPES_KEY not in z.files:
        return {}
    try:
        names = json.loads(str(z[_DTYPES_KEY]))
    except Exception as e:  # noqa: BLE001 - a truncated member, not JSON
        raise ValueError(f"{_DTYPES_KEY} cannot be read ({type(e).__name__}: {e})") from e
    if not isinstance(names, dict):
        raise ValueError(f"{_DTYPES_KEY} is not a JSON object")
    return {str(k): str(v) for k, v in names.items()}


def _arg_key_order(keys) -> list[str]:
    def idx(k):
        m = re.fullmatch(r"(?:arg|out)(\d+)", k)
        return int(m.group(1)) if m else 1 << 30

    return sorted(keys, key=lambda k: (idx(k), k))


# --------------------------------------------------------------------------
# isolated run (child process)


def run_on_xla_cpu_isolated(text: str, inputs: Sequence[np.ndarray], timeout: float = 120) -> list[np.ndarray]:
    """``run_on_xla_cpu`` in a fresh child process.

    XLA aborts the process (LOG(FATAL)/CHECK) on some inputs; here that
    becomes ``XlaCpuError`` with the signal and the tail of XLA's stderr.
    Ordinary XLA errors become ``XlaCpuError`` carrying XLA's message and stage.
    Costs a Python+jax start-up (~1-2 s).
    """
    if importlib.util.find_spec("jax") is None:  # said here, not as the child's traceback
        raise XlaCpuError(NO_JAX, stage="import")
    with tempfile.TemporaryDirectory(prefix="hloexec_xla_") as d:
        hlo_path = os.path.join(d, "module.hlo")
        with open(hlo_path, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(text)
        save_arrays(os.path.join(d, "inputs.npz"), {f"arg{i}": a for i, a in enumerate(inputs)})
        env = dict(os.environ)
        env["JAX_ENABLE_X64"] = "1"
        env.setdefault("JAX_PLATFORMS", "cpu")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        cmd = [sys.executable, "-P", os.path.abspath(__file__), "--child", d]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired as e:
            raise XlaCpuError(f"XLA:CPU child timed out after {timeout} s", stage="timeout") from e
        err_path = os.path.join(d, "error.json")
        if os.path.exists(err_path):
            with open(err_path, encoding="utf-8") as f:
                info = json.load(f)
            raise XlaCpuError(info["message"], stage=info.get("stage", ""), returncode=p.returncode)
        out_path = os.path.join(d, "outputs.npz")
        if p.returncode != 0 or not os.path.exists(out_path):
            rc = p.returncode
            if rc < 0:
                try:
                    sig = signal.Signals(-rc).name
                except ValueError:
                    sig = f"signal {-rc}"
                what = f"XLA:CPU child killed by {sig}"
            else:
                what = f"XLA:CPU child exited with status {rc}"
            raise XlaCpuError(f"{what}\n{_stderr_summary(p.stderr or '')}".rstrip(), stage="child", returncode=rc)
        outs = load_arrays(out_path)
        return [outs[k] for k in _arg_key_order(outs.keys())]


_LOG_LINE = re.compile(r"^[FE]\d{4} |Check failed|RET_CHECK|LOG\(FATAL\)")


def _stderr_summary(err: str, tail: int = 12) -> str:
    """XLA's fatal/error log lines first (the stack trace is noise), then the tail."""
    lines = err.strip().splitlines()
    key = [ln for ln in lines if _LOG_LINE.search(ln)]
    rest = [ln for ln in lines[-tail:] if ln not in key]
    return "\n".join(key[:20] + (["..."] if key and rest else []) + rest)


def _child_main(d: str) -> int:
    with open(os.path.join(d, "module.hlo"), encoding="utf-8", errors="surrogatepass") as f:
        text = f.read()
    ins = load_arrays(os.path.join(d, "inputs.npz"))
    inputs = [ins[k] for k in _arg_key_order(ins.keys())]
    try:
        outs = run_on_xla_cpu(text, inputs)
    except XlaCpuError as e:
        with open(os.path.join(d, "error.json"), "w", encoding="utf-8") as f:
            json.dump({"message": e.message, "stage": e.stage}, f)
        return 3
    save_arrays(os.path.join(d, "outputs.npz"), {f"out{i}": a for i, a in enumerate(outs)})
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child_main(sys.argv[2]))
    print("usage: xla_cpu.py --child DIR  (internal; use run_on_xla_cpu_isolated)", file=sys.stderr)
    sys.exit(2)
