"""The one place array files a user hands hloexec are read: `--inputs`, `--expected`, `--actual`, a dump's
saved inputs. Each is checked against what the module takes (or gives), and every way a file can be wrong --
not a zip, truncated, an object array, a key missing or extra, a shape or dtype that does not fit -- is an
ArrayFileError naming the file, the array and what was expected.

Files: an npz with keys prefix0..prefixN (arg0.. for entry arguments, out0.. for outputs; a tuple parameter
takes as many keys as it has leaves), or an npy holding the one array of a one-array module. ml_dtypes arrays
(bf16, fp8, f4, int4, ...) come as hloexec writes them (save_arrays: their bytes as uint<bits> plus the key
`__dtypes__` naming the types), or as plain np.savez writes them (raw void |V2, |V1: taken as the type the
module says; from_npz_void).

A result's arrays: `flatten` (out0..outM of a tuple result), `nested` (its inverse), `array_summary` (what `run`
prints of each).
"""

from __future__ import annotations

import io
import os
import re
import stat

import numpy as np

from ..errors import ArrayFileError, not_a_regular_file
from ..exec.inputs import from_npz_void
from .compare import dtype_name, jsonable
from .xla_cpu import load_arrays


def read_arrays(path, prefix: str) -> dict[str, np.ndarray]:
    """Every array of the npz at `path` by key (an npy: its one array as prefix0), ml_dtypes types restored."""
    path = str(path)
    source: str | io.BytesIO = path
    with open(path, "rb") as f:  # a missing or unreadable file: OSError, said as such
        mode = os.fstat(f.fileno()).st_mode
        if stat.S_ISFIFO(mode):  # a pipe (`--inputs <(...)`): read once, numpy seeks
            source = io.BytesIO(f.read())
        elif not stat.S_ISREG(mode):  # /dev/zero: numpy read zeros as "a pickle"
            raise not_a_regular_file(path, mode, "arrays are read from an .npz or .npy file or a pipe")
        magic = f.read(6) if isinstance(source, str) else source.getvalue()[:6]
    try:
        if magic == b"\x93NUMPY":
            return {f"{prefix}0": np.load(source, allow_pickle=False)}
        return dict(load_arrays(source))
    except Exception as e:  # noqa: BLE001 - np.load says a bad file in many exception types
        raise ArrayFileError(f"{path}: {_reason(e)}") from None


def _reason(e: Exception) -> str:
    text = str(e)
    if "Object arrays" in text:
        return (
            text.split(" (")[0] + ": " if text.startswith("array ") else ""
        ) + "an object array; hloexec reads numeric arrays only, never pickles"
    if isinstance(e, ValueError) and text.startswith(("array ", "__dtypes__")):
        return text
    if "pickled" in text:  # numpy's advice (allow_pickle=True) is not one to follow on a file one was handed
        return "a pickle, not an .npz or .npy array file; hloexec reads numeric arrays only, never pickles"
    return f"not an .npz or .npy array file numpy can read ({type(e).__name__}: {e})"


def read_values(
    path, prefix: str, shapes: list, *, what: str, check_shapes: bool = True, check_dtypes: bool = True
) -> list:
    """The values the file at `path` holds for `shapes` (HLO Shapes, tuples nested): one array per shape, or the
    leaves of tuple shapes in order. Raw void arrays become the leaf's type; ArrayFileError for a key missing or
    extra, and for a shape or dtype other than the leaf's where checked. `what` names the values in messages
    ("entry arguments", "outputs")."""
    return values_of(
        read_arrays(path, prefix), path, prefix, shapes, what=what, check_shapes=check_shapes, check_dtypes=check_dtypes
    )


def values_of(
    arrays: dict, path, prefix: str, shapes: list, *, what: str, check_shapes: bool = True, check_dtypes: bool = True
) -> list:
    """read_values of arrays already read from `path` (keys prefix0..: an SPMD file's dev{d}/arg{i})."""
    by_number = {}
    for key, value in arrays.items():
        m = re.fullmatch(re.escape(prefix) + r"(0|[1-9]\d*)", key)  # arg00 is no second arg0
        if m is None:
            raise ArrayFileError(
                f"{path}: unexpected array {key!r} (expected {prefix}0..{prefix}N, one per "
                f"array of the module's {what})"
            )
        by_number[int(m.group(1))] = value
    leaves = [leaf for shape in shapes for _, leaf in shape.leaves()]
    for n in range(max(len(by_number), len(leaves))):
        if n not in by_number:
            raise ArrayFileError(
                f"{path}: array {prefix}{n} missing: the module's {what} are {_listing(leaves, prefix)}"
            )
        if n >= len(leaves):
            raise ArrayFileError(
                f"{path}: array {prefix}{n} is one too many: the module's {what} are {_listing(leaves, prefix)}"
            )
    return nested(
        [
            _checked(path, f"{prefix}{n}", by_number[n], leaf, check_shapes, check_dtypes)
            for n, leaf in enumerate(leaves)
        ],
        shapes,
    )


def check_global_shapes(path, prefix: str, values: list, outputs: list) -> None:
    """An SPMD run's file of global arrays (`values`, leaves in order) against the assembled `outputs`: an
    ArrayFileError for the first shape that differs."""
    for n, (value, output) in enumerate(zip(values, outputs)):
        if np.shape(value) != np.shape(output):
            raise ArrayFileError(
                f"{path}: array {prefix}{n} has shape {list(np.shape(value))}, expected {list(np.shape(output))} "
                "(the global output, assembled by its sharding)"
            )


def nested(leaves: list, shapes: list) -> list:
    """Values for `shapes` from their array leaves in depth-first order (tuple shapes become tuples)."""
    it = iter(leaves)

    def build(shape):
        return tuple(build(s) for s in shape.tuple_shapes) if shape.is_tuple else next(it)

    return [build(s) for s in shapes]


def flatten(value) -> list:
    """A (nested) tuple result as its leaves, depth first (the order of out0..outM): `nested`'s inverse."""
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in flatten(v)]
    return [value]


def array_summary(index: int, a) -> dict:
    """index, shape, dtype, min/max/mean (NaN ignored; complex: of |x|), NaN and Inf counts."""
    a = np.asarray(a)
    summary = {
        "index": index,
        "shape": list(a.shape),
        "dtype": dtype_name(a.dtype),
        "min": None,
        "max": None,
        "mean": None,
        "nan": 0,
        "inf": 0,
    }
    if a.dtype.kind in "biu" or a.size == 0:
        values = a.astype(np.int64 if a.dtype.kind == "b" else a.dtype)
    elif a.dtype.kind == "c":
        values = np.abs(a)
    else:
        values = a.astype(np.float64)
    if a.size == 0:
        return summary
    if values.dtype.kind == "f":
        nan = np.isnan(values)
        summary["nan"] = int(np.count_nonzero(nan))
        summary["inf"] = int(np.count_nonzero(np.isinf(values)))
        values = values[~nan]
        if values.size == 0:
            return summary
        with np.errstate(all="ignore"):
            summary.update(min=float(values.min()), max=float(values.max()), mean=float(values.mean()))
    else:
        summary.update(min=int(values.min()), max=int(values.max()), mean=float(values.mean(dtype=np.float64)))
    return jsonable(summary)


def _checked(path, key: str, value: np.ndarray, leaf, check_shapes: bool, check_dtypes: bool) -> np.ndarray:
    expected = leaf.to_text(layout=False)
    if leaf.element_type.numpy is None:  # token: nothing to read
        return value
    value = from_npz_void(value, leaf.dtype)
    if value.dtype.kind == "V" and value.dtype.type is np.void:
        raise ArrayFileError(
            f"{path}: array {key} holds raw {value.dtype.itemsize}-byte records (|V"
            f"{value.dtype.itemsize}), expected {expected} ({leaf.dtype.itemsize}-byte elements)"
        )
    if check_dtypes and value.dtype != leaf.dtype:
        raise ArrayFileError(
            f"{path}: array {key} has dtype {value.dtype}, expected {expected} (numpy {leaf.dtype})"
            + _as_bits_hint(value.dtype, leaf.dtype)
        )
    if check_shapes and tuple(value.shape) != tuple(leaf.dims):
        raise ArrayFileError(f"{path}: array {key} has shape {list(value.shape)}, expected {expected}")
    return value


def _as_bits_hint(found: np.dtype, wanted: np.dtype) -> str:
    """How to pass a float's bits saved as the unsigned integer of its size (bf16 as uint16, fp8 as uint8: what
    people save when numpy cannot): not taken as bits, since integers may as well be the values meant."""
    if found.kind != "u" or found.itemsize != wanted.itemsize or wanted.kind == "u":
        return ""
    module = "ml_dtypes" if wanted.type.__module__.startswith("ml_dtypes") else "np"
    name = dtype_name(wanted)
    return (
        f"; if it holds {name} bits, save arr.view({module}.{wanted.name}) instead: np.savez keeps the bytes and "
        f"hloexec reads them as {name}"
    )


def _listing(leaves: list, prefix: str) -> str:
    shown = [f"{prefix}{n} {leaf.to_text(layout=False)}" for n, leaf in enumerate(leaves[:8])]
    more = f", ... ({len(leaves)} in all)" if len(leaves) > 8 else ""
    return (", ".join(shown) + more) if leaves else "none"
