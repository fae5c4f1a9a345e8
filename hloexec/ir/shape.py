"""HLO shapes: arrays with an element type, dimensions, optional layout; tuples of shapes.

`parse_shape` reads the text XLA prints (`f32[8,<=16]{1,0:T(8,128)(2,1)S(6)}`, `(f32[], token[])`)
and interns the result, so the ~10k shape annotations of a dump cost one parse per distinct text.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from .dtypes import TUPLE, ElementType, element_type


@dataclass(frozen=True, slots=True)
class Layout:
    minor_to_major: tuple[int, ...]
    tiles: tuple[tuple[int, ...], ...] = ()  # T(8,128)(2,1); -1 stands for '*' (combined dims)
    element_size_bits: int = 0  # E(4)
    memory_space: int = 0  # S(6)
    text: str = ""  # everything after ':' as written, for printing

    def is_default_for(self, rank: int) -> bool:
        return self.minor_to_major == tuple(range(rank - 1, -1, -1))

    def to_text(self) -> str:
        dims = ",".join(map(str, self.minor_to_major))
        return "{" + dims + (":" + self.text if self.text else "") + "}"


@dataclass(frozen=True, eq=False)
class Shape:
    """An array shape (element_type + dims) or a tuple (element type TUPLE, its elements in tuple_shapes), as XLA's
    Shape: neither field is optional, so code that knows which kind it holds reads it without a check."""

    element_type: ElementType
    dims: tuple[int, ...] = ()
    dynamic: tuple[bool, ...] = ()  # True where written `<=N` (N is the bound)
    layout: Layout | None = None
    tuple_shapes: tuple[Shape, ...] = ()  # () for an array
    is_buffer: bool = False  # written b(f32[8]): a buffer holding that array

    # -- structure --------------------------------------------------------------
    @property
    def is_tuple(self) -> bool:
        return self.element_type.kind == "tuple"

    @property
    def is_array(self) -> bool:
        return self.element_type.numpy is not None

    @property
    def rank(self) -> int:
        return len(self.dims)

    @cached_property
    def size(self) -> int:
        """Number of elements (1 for a scalar; 0 for a tuple)."""
        return 0 if self.is_tuple else math.prod(self.dims)

    @property
    def dtype(self) -> np.dtype | None:
        return self.element_type.numpy

    @cached_property
    def nbytes(self) -> int:
        """Bytes of this shape as numpy arrays, summed over tuple leaves."""
        if self.is_tuple:
            return sum(s.nbytes for s in self.tuple_shapes)
        return self.size * self.element_type.itemsize

    def leaf_elements(self) -> int:
        """Number of elements summed over tuple leaves (`size` for an array)."""
        return sum(s.size for _, s in self.leaves())

    def leaves(self):
        """Array shapes in depth-first order with their ShapeIndex."""
        if not self.is_tuple:
            yield (), self
            return
        for i, s in enumerate(self.tuple_shapes):
            for index, leaf in s.leaves():
                yield (i, *index), leaf

    def at(self, index) -> Shape:
        shape = self
        for i in index:
            shape = shape.tuple_shapes[i]
        return shape

    @cached_property
    def minor_to_major(self) -> tuple[int, ...]:
        """The layout's dimension order, defaulting to row-major (XLA's {rank-1,...,0})."""
        if self.layout is not None and len(self.layout.minor_to_major) == self.rank:
            return self.layout.minor_to_major
        return tuple(range(self.rank - 1, -1, -1))

    @property
    def has_default_layout(self) -> bool:
        return self.minor_to_major == tuple(range(self.rank - 1, -1, -1))

    # -- comparison and printing ----------------------------------------------
    def same_dims_and_type(self, other: Shape) -> bool:
        """Equal ignoring layouts (XLA's ShapeUtil::Compatible)."""
        if self.is_tuple or other.is_tuple:
            return (
                self.is_tuple
                and other.is_tuple
                and len(self.tuple_shapes) == len(other.tuple_shapes)
                and all(a.same_dims_and_type(b) for a, b in zip(self.tuple_shapes, other.tuple_shapes))
            )
        return self.element_type is other.element_type and self.dims == other.dims

    def __eq__(self, other):
        return isinstance(other, Shape) and self.to_text() == other.to_text()

    def __hash__(self):
        return hash(self.to_text())

    def to_text(self, layout: bool = True) -> str:
        if self.is_buffer:
            return "b(" + replace(self, is_buffer=False).to_text(layout) + ")"
        if self.is_tuple:
            return "(" + ", ".join(s.to_text(layout) for s in self.tuple_shapes) + ")"
        dims = ",".join(("?" if d < 0 else f"<={d}") if dyn else str(d) for d, dyn in zip(self.dims, self.dynamic))
        text = f"{self.element_type.name}[{dims}]"
        if layout and self.layout is not None:
            text += self.layout.to_text()
        return text

    def __repr__(self):
        return f"Shape({self.to_text()})"


def array_shape(type_name: str, dims=(), layout: Layout | None = None) -> Shape:
    dims = tuple(int(d) for d in dims)
    return Shape(element_type(type_name), dims, (False,) * len(dims), layout)


def tuple_shape(shapes) -> Shape:
    return Shape(TUPLE, tuple_shapes=tuple(shapes))


# -- parsing -------------------------------------------------------------------
_ARRAY = re.compile(r"\s*([a-z][a-z0-9]*)\[([^\]]*)\](\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\})?")
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_TILE = re.compile(r"T((?:\([^)]*\))+)")
_INTS = re.compile(r"\(([^)]*)\)")
_CACHE: dict[str, Shape] = {}


class ShapeSyntaxError(ValueError):
    """Raised with the character offset in the shape text where it went wrong."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset


def parse_shape(text: str) -> Shape:
    """Parse one shape; raises ShapeSyntaxError. Results are interned by text."""
    shape = _CACHE.get(text)
    if shape is None:
        clean = _COMMENT.sub("", text) if "/" in text else text
        shape, end = _parse(clean, 0)
        if clean[end:].strip():
            raise ShapeSyntaxError(f"unexpected text after shape: {clean[end : end + 20]!r}", end)
        if len(_CACHE) < 1_000_000:
            _CACHE[text] = shape
    return shape


# Shapes are walked recursively (printing, leaves, sizes): deeper tuples would hit Python's recursion limit.
MAX_TUPLE_DEPTH = 100


def _parse(text: str, pos: int, depth: int = 0) -> tuple[Shape, int]:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    if depth > MAX_TUPLE_DEPTH:
        raise ShapeSyntaxError(f"tuple shape nested deeper than {MAX_TUPLE_DEPTH} levels", pos)
    if text.startswith("(", pos):
        shapes: list[Shape] = []
        pos += 1
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if text.startswith(")", pos):
                return tuple_shape(shapes), pos + 1
            if shapes:
                if not text.startswith(",", pos):
                    raise ShapeSyntaxError("expected ',' or ')' in tuple shape", pos)
                pos += 1
            shape, pos = _parse(text, pos, depth + 1)
            shapes.append(shape)
    if text.startswith("b(", pos):
        inner, pos = _parse(text, pos + 2, depth + 1)
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if not text.startswith(")", pos):
            raise ShapeSyntaxError("expected ')' closing a buffer shape b(...)", pos)
        return replace(inner, is_buffer=True), pos + 1
    m = _ARRAY.match(text, pos)
    if m is None:
        raise ShapeSyntaxError("expected a shape such as f32[8,16]{1,0} or (f32[], s32[])", pos)
    name, dims_text, layout_text = m.groups()
    try:
        etype = element_type(name)
    except KeyError:
        raise ShapeSyntaxError(f"unknown element type {name!r}", pos) from None
    dims, dynamic = [], []
    if dims_text.strip():
        for d in dims_text.split(","):
            d = d.strip()
            if d == "?":  # unbounded dynamic dimension
                dims.append(-1)
                dynamic.append(True)
                continue
            dyn = d.startswith("<=")
            try:
                size = int(d[2:] if dyn else d)
            except ValueError:
                raise ShapeSyntaxError(f"bad dimension {d!r}", pos) from None
            if not 0 <= size < 1 << 63:  # XLA reads dimensions as non-negative int64
                raise ShapeSyntaxError(f"dimension {d!r} out of range", pos)
            dims.append(size)
            dynamic.append(dyn)
    layout = _parse_layout(layout_text[1:-1], pos) if layout_text else None
    return Shape(etype, tuple(dims), tuple(dynamic), layout), m.end()


def _parse_layout(text: str, pos: int) -> Layout:
    dims_text, _, rest = text.partition(":")
    try:
        m2m = tuple(int(d) for d in dims_text.split(",") if d.strip())
    except ValueError:
        raise ShapeSyntaxError(f"bad layout {{{text}}}", pos) from None
    tiles: tuple = ()
    element_bits = memory_space = 0
    if rest:
        t = _TILE.search(rest)
        if t:
            tiles = tuple(
                tuple(-1 if x.strip() == "*" else int(x) for x in g.split(",") if x.strip())
                for g in _INTS.findall(t.group(1))
            )
        e = re.search(r"E\((\d+)\)", rest)
        s = re.search(r"S\((\d+)\)", rest)
        element_bits = int(e.group(1)) if e else 0
        memory_space = int(s.group(1)) if s else 0
    return Layout(m2m, tiles, element_bits, memory_space, rest)
