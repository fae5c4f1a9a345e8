"""What the error bounds (tools/bounds.py) keep per live value of the shadow's run, and how they read it back:
a bound, the rounding-decided marks, the samples' deviations (SAMPLES x the value's shape). A value is known by
identity while it lives; its entry goes with it.

The store is the bounds' memory beside the shadow's values (the shadow holds 8 bytes per element), so it is kept
narrow, encoded by `_put` and decoded by the accessors (the rules read float32 or float64 as before):
- a bound of a value of a 32-bit or narrower type in float32, 4 bytes; an f64 value's in float64 (kept in 16
  bits rounded up, bfloat16's 2^-7 steps compounded along the program: one 1% change of an f16 LayerNorm
  gradient's largest element, caught in float32, was missed);
- a complex value's samples in complex64 (float32 parts, `sample_dtype`; complex programs are small), a real
  value's deviations in SAMPLE_STORAGE, bfloat16 (rounded to nearest: 2^-9 of a deviation), 4 x 2 bytes
  against float32's 4 x 4 (what it costs the verdict: SAMPLE_STORAGE), encoded and decoded by compiled kernels
  (kernels/half.py, bit for bit ml_dtypes' casts); the hot elementwise ops (tools/bound_elementwise.py) read and
  write these bits themselves, no float32 copy (the last encoded samples' float32 reading was kept for the next
  reader: with those ops reading bits it skipped 56 of 327 decodes on the GPT step, 17 MB, and was dropped);
and nothing twice: a moving op numpy can express as a view (broadcast, reshape, transpose, slice, copy) keeps
views of its operand's arrays, an exact widening convert (bf16 -> f32) shares its operand's bound, samples and
marks, a pinned instruction's helper shares its operand's entry, a value moved from exact
operands keeps an entry with no bound (not a full-size array of zeros). Stored arrays are read only: the rules
that read them whole (Numba kernels) ravel them or get decoded (contiguous) copies."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import ml_dtypes
import numpy as np

from ..kernels.bound_rules import SPLIT_FROM
from ..kernels.half import from_f32, to_f32
from ..kernels.threads import CORES, ranges, run_blocks

# what the samples' float32 deviations are kept in (float32 keeps every bench_verdict catch of main; bfloat16
# halves the samples' memory and, on the GPT step with the same draws, caught 0-3 fewer 1% / 0.1% changes of 84
# and 199 per row: its 2^-9 steps add to deviations that cancel further on)
SAMPLE_STORAGE = np.dtype(ml_dtypes.bfloat16)
# Elementwise ops with no rounding of their own (1-Lipschitz or exact)
EXACT_ELEMENTWISE = frozenset(
    {"maximum", "minimum", "abs", "negate", "clamp", "sign", "floor", "ceil", "round-nearest-afz", "round-nearest-even"}
)
# moving ops whose bounds, marks and samples are views of their operand's (`moved_view`)
VIEW_MOVES = frozenset({"broadcast", "reshape", "transpose", "slice", "copy"})
_HEAD = 4096  # elements `has_error` reads before the whole: most bounds are nonzero in their first ones


def has_error(bound) -> bool:
    """Whether `bound` (an array, None for none) has a nonzero element: np.any's answer (NaN counts), read from a
    broadcast's source (each repeated element once) and from a first few elements before the whole (np.any reads
    every element even where the first is nonzero: 1.2 ms on 4M float32, on one core)."""
    if bound is None:
        return False
    bound = np.asarray(bound)
    if bound.flags.c_contiguous:
        flat = bound.reshape(-1)
        return bool(flat[:_HEAD].any()) or (flat.size > _HEAD and bool(flat[_HEAD:].any()))
    if not bound.size:
        return False
    return bool(bound[tuple(0 if step == 0 else slice(None) for step in bound.strides)].any())


def float_leaf(leaf) -> bool:
    """Whether `leaf` (of a value: an array, a scalar, a token...) is a float or complex array or scalar."""
    return isinstance(leaf, (np.ndarray, np.generic)) and leaf.dtype.kind in "fc"


def sample_dtype(leaf) -> np.dtype:
    """What the samples' deviations of a float or complex value are made in: float32 (kept in SAMPLE_STORAGE), a
    complex value's complex64 (kept as it is: float32 parts; complex programs are small)."""
    return np.dtype(np.complex64 if np.iscomplexobj(leaf) else np.float32)


def leaves(value) -> list:
    """The arrays (or scalars, tokens) of `value`, a leaf or nested tuples of them, in order."""
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in leaves(v)]
    return [value]


def widens_exactly(source, target) -> bool:
    """Whether every value of float type `source` is one of float type `target` (a convert between them is exact:
    bf16 or f16 -> f32, f32 -> f64)."""
    if source is None or target is None or source.kind != "float" or target.kind != "float":
        return False
    if source.numpy is None or target.numpy is None:
        return False
    s, t = ml_dtypes.finfo(source.numpy), ml_dtypes.finfo(target.numpy)
    return bool(t.nmant >= s.nmant and t.maxexp >= s.maxexp and t.smallest_subnormal <= s.smallest_subnormal)


def contiguous(array: np.ndarray) -> np.ndarray:
    """`array`'s elements in a new C-ordered array, copied in spans of its first dimension on the cores (numpy's copy
    releases the GIL): a broadcast operand's bound and samples are materialized for a compiled pass at every use
    (~170 MB per GPT d256 step), and shared_rounding's index map, which one core did while the other waited."""
    out = np.empty(array.shape, array.dtype)
    if array.size < SPLIT_FROM or array.shape[0] < 2:
        np.copyto(out, array)
        return out
    spans = ranges(array.shape[0], min(array.shape[0], 4 * CORES))
    run_blocks(len(spans), lambda i: np.copyto(out[spans[i]], array[spans[i]]), linger=False)
    return out


def moved_view(inst, array, shape: tuple, lead: tuple = ()):
    """`array` (an operand's bound or marks, or with `lead` leading dims its samples; anything that broadcasts to
    the operand's `shape`) as `inst` (one of VIEW_MOVES) moves the operand's elements: a view where numpy has one
    (a reshape of a strided view may copy)."""
    if array.shape != (*lead, *shape):
        array = np.broadcast_to(array, (*lead, *shape))
    n = len(lead)
    out = tuple(inst.shape.dims)
    if inst.opcode == "copy":
        return array
    if inst.opcode == "reshape":
        return np.reshape(array, (*lead, *out))
    if inst.opcode == "transpose":
        return np.transpose(array, (*range(n), *(n + int(d) for d in inst.attr("dimensions"))))
    if inst.opcode == "slice":
        return array[(slice(None),) * n + tuple(slice(d.start, d.limit, d.stride) for d in inst.attr("slice"))]
    dims = [int(d) for d in inst.attr("dimensions")]  # broadcast: operand dim i is output dim dims[i]
    ordered = np.transpose(array, (*range(n), *(n + i for i in sorted(range(len(dims)), key=dims.__getitem__))))
    spread = np.expand_dims(ordered, tuple(n + d for d in range(len(out)) if d not in dims))
    return np.broadcast_to(spread, (*lead, *out))


class BoundStore:
    """The store of ErrorBounds: id(value) -> (weakref, bound, decided, samples; each None or an array)."""

    current: threading.local  # .narrow: the observed instruction's float types are 32 bits or fewer

    def __init__(self) -> None:
        self.store: dict[int, tuple] = {}
        # id(value) -> (weakref, its may-be-non-finite marks: tools/bound_overflow.py), apart from `store`: the rules'
        # `_put`s replace entries, the marks are set after them; empty in ordinary programs
        self.overflows: dict[int, tuple] = {}
        # id(value) -> (weakref, an upper bound of max |x| + e over its elements: bound_overflow's reach)
        self.reaches: dict[int, tuple] = {}
        self.lock = threading.Lock()

    def _encoded(self, samples: np.ndarray) -> np.ndarray:
        """float32 samples in SAMPLE_STORAGE."""
        return from_f32(samples, SAMPLE_STORAGE)

    def _put(self, leaf, bound, decided=None, samples=None) -> None:
        store = self.store
        if decided is not None and not decided.any():
            decided = None
        if samples is not None and samples.dtype == np.float32:
            samples = self._encoded(samples)
        if bound is not None and getattr(self.current, "narrow", False):
            # kept in float32 (half the memory; a bound needs a few digits): the values of 32-bit and narrower
            # types have bounds in its range; read back as float64 (`of`), the rules compute as before
            bound = np.asarray(bound, np.float32)
        self._keep(store, leaf, (bound, decided, samples))

    def _keep(self, table: dict, leaf, items: tuple | None) -> None:
        """`table`[id(leaf)] = (a reference to `leaf` while it lives, *items); None: the entry goes."""
        key = id(leaf)
        if items is None:
            with self.lock:
                table.pop(key, None)
            return
        # an array is known while it lives; a numpy scalar (a kernel's 0-d result) cannot be referred to weakly:
        # it is kept (a few bytes)
        ref: Callable[[], object]  # the value while it lives
        if isinstance(leaf, np.ndarray):
            ref = weakref.ref(leaf, lambda _r: table.pop(key, None))
        else:
            ref = lambda: leaf  # noqa: E731
        with self.lock:
            table[key] = (ref, *items)

    def _mark(self, leaf, marks) -> None:
        """Keep `marks` (uint8, bound_overflow's bits; None or all zero: none) as `leaf`'s may-be-non-finite marks."""
        self._keep(self.overflows, leaf, None if marks is None or not marks.any() else (marks,))

    def _keep_reach(self, leaf, reach) -> None:
        """Keep `reach` (None: forget) as an upper bound of max |leaf| + its bound (bound_overflow.py)."""
        self._keep(self.reaches, leaf, None if reach is None else (float(reach),))

    def reach_of(self, leaf) -> float | None:
        """`leaf`'s kept reach (`_keep_reach`), None where none is."""
        entry = self.reaches.get(id(leaf))
        return None if entry is None or entry[0]() is not leaf else entry[1]

    def marks_of(self, leaf):
        """`leaf`'s may-be-non-finite marks (uint8, broadcast to its shape), None where it has none."""
        entry = self.overflows.get(id(leaf))
        if entry is None or entry[0]() is not leaf:
            return None
        return np.broadcast_to(entry[1], np.shape(leaf))

    def nonfinite_of(self, leaf) -> np.ndarray:
        """`leaf`'s may-be-non-finite marks as an output's: zeros where it has none."""
        marks = self.marks_of(leaf)
        return np.zeros(np.shape(leaf), np.uint8) if marks is None else np.array(marks)

    def _entry(self, leaf):
        entry = self.store.get(id(leaf))
        return entry if entry is not None and entry[0]() is leaf else None

    def of(self, leaf) -> np.ndarray:
        """The bound of a float value of the shadow's run (zeros: exact, an input or a constant)."""
        entry = self._entry(leaf)
        if entry is None or entry[1] is None:
            return np.zeros(np.shape(leaf))
        return np.broadcast_to(np.asarray(entry[1], np.float64), np.shape(leaf))

    def decided_of(self, leaf) -> np.ndarray:
        entry = self._entry(leaf)
        if entry is None or entry[2] is None:
            return np.zeros(np.shape(leaf), bool)
        return np.broadcast_to(entry[2], np.shape(leaf))

    def _bound_or_none(self, leaf):
        entry = self._entry(leaf)
        return None if entry is None or entry[1] is None else np.asarray(entry[1], np.float64)

    def _stored_bound(self, leaf):
        """The bound as it is kept (float32 for values of 32 bits or fewer), None where there is none."""
        entry = self._entry(leaf)
        return None if entry is None else entry[1]

    def _decided_or_none(self, leaf):
        entry = self._entry(leaf)
        return None if entry is None else entry[2]

    def _samples_or_none(self, leaf):
        """The samples' deviations (float32; a pred value's perturbed decisions), None where there are none."""
        return self._read_samples(self._stored_samples(leaf))

    def _samples_per_sample(self, leaf):
        """The samples' deviations as `_samples_or_none` gives them, but where they would be decoded, a reader
        decoding one sample at a time (`reader[k]`: float32): one sample's memory, not SAMPLES' (an SPMD run's
        participants all hold theirs at once in a collective)."""
        return self._read_per_sample(self._stored_samples(leaf))

    def _stored_samples(self, leaf):
        """The samples as they are kept (SAMPLE_STORAGE for a float value's; a view where the value was moved),
        None where there are none."""
        entry = self._entry(leaf)
        return None if entry is None else entry[3]

    @staticmethod
    def _read_samples(samples):
        """Kept samples (`_stored_samples`) read as float32, None for None."""
        if samples is None:
            return None
        return to_f32(samples) if samples.dtype == SAMPLE_STORAGE else samples

    @staticmethod
    def _read_per_sample(samples):
        """Kept samples read as `_samples_per_sample` gives them (a reader of one decoded sample at a time)."""
        return _Decoding(samples) if samples is not None and samples.dtype == SAMPLE_STORAGE else samples

    def _share(self, value, operand) -> None:
        """`value` keeps `operand`'s entry (the same arrays): its elements are the operand's, unchanged (an entry
        even where they are exact: a value made by a rule is known, as a loop's or a tuple's leaves must be)."""
        entry = self._entry(operand)
        if entry is None:
            self._put(value, None)
            return
        self._put(value, *entry[1:])

    def _view_move(self, inst, value, operand) -> None:
        """`value`, `operand` moved by `inst` (one of VIEW_MOVES), keeps views of the operand's arrays."""
        entry = self._entry(operand) or (None, None, None, None)
        bound, decided, samples = (
            None if a is None else moved_view(inst, a, np.shape(operand), np.shape(a)[:1] if k == 2 else ())
            for k, a in enumerate(entry[1:])
        )
        self._put(value, bound, decided, samples)


class _Decoding:
    """Stored samples read one sample at a time: `[k]` decodes sample k to float32 (`BoundStore._samples_per_sample`)."""

    def __init__(self, stored: np.ndarray):
        self.stored = stored

    def __getitem__(self, k: int) -> np.ndarray:
        return to_f32(self.stored[k])
