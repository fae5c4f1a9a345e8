"""Slices, paddings, windows and convolution dim labels: the geometry attributes of structural ops
(`slice={[0:4:2]}`, `padding=0_1_0x..`, `window={size=3 stride=2 ...}`, `dim_labels=b01f_01io->b01f`)."""

from __future__ import annotations

import re

from .syntax import _Bad
from .values import ConvDims, PadDim, SliceDim, WindowDim


_SLICE_DIM = re.compile(r"\s*\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+)\s*)?\]\s*(,|\})")


def decode_slice(raw: str) -> tuple[SliceDim, ...]:
    """`{[0:2], [1:8:2]}` -> SliceDims (stride 1 when not written)."""
    s = raw.strip()
    if not s.startswith("{"):
        raise _Bad("expects '{' to start ranges")
    if re.fullmatch(r"\{\s*\}", s):
        return ()
    out, pos = [], 1
    while True:
        m = _SLICE_DIM.match(s, pos)
        if m is None:
            raise _Bad("expects [start:limit] or [start:limit:stride]")
        a, b, c, end = m.groups()
        out.append(SliceDim(int(a), int(b), int(c) if c is not None else 1))
        pos = m.end()
        if end == "}":
            break
    if s[pos:].strip():
        raise _Bad("unexpected text after '}'")
    return tuple(out)


_PAD_DIM = re.compile(r"(-?\d+)_(-?\d+)(?:_(\d+))?$")


def decode_padding(raw: str) -> tuple[PadDim, ...]:
    """Pad config `0_0_0x1_1_0`: per dimension low_high[_interior]."""
    out = []
    for part in raw.strip().split("x"):
        m = _PAD_DIM.match(part)
        if m is None:
            raise _Bad("expects padding config pattern like 'low_high_interior' or 'low_high'")
        lo, hi, inner = m.groups()
        out.append(PadDim(int(lo), int(hi), int(inner) if inner is not None else 0))
    return tuple(out)


_DXD = re.compile(r"\d+(?:x\d+)*$")
_WINDOW_PAD = re.compile(r"-?\d+_-?\d+(?:x-?\d+_-?\d+)*$")


def decode_window(raw: str) -> tuple[WindowDim, ...]:
    """`{size=3x3 stride=2x2 pad=0_0x1_1 lhs_dilate=1x1 rhs_dilate=1x1 rhs_reversal=0x1}` (ParseWindow)."""
    s = raw.strip()
    if not (s.startswith("{") and s.endswith("}")):
        raise _Bad("expected '{' ... '}' around a window")
    fields: dict[str, list] = {}
    for item in s[1:-1].replace(",", " ").split():
        key, eq, value = item.partition("=")
        if not eq:
            raise _Bad(f"expects sub-attributes in window, sees {item!r}")
        if key in fields:
            raise _Bad(f"sub-attribute '{key}=' already exists")
        if key == "pad":
            if not _WINDOW_PAD.match(value):
                raise _Bad("expects window pad pattern, e.g., '0_0x3_3'")
            fields[key] = [tuple(int(v) for v in re.split(r"(?<=\d)_", d)) for d in value.split("x")]
        elif key in ("size", "stride", "lhs_dilate", "rhs_dilate", "rhs_reversal"):
            if not _DXD.match(value):
                raise _Bad(f"expects sub-attribute '{key}=ixj...'")
            fields[key] = [int(v) for v in value.split("x")]
        else:
            raise _Bad(f"unexpected attribute name: {key}")
    size = fields.get("size", [])
    for key, vals in fields.items():
        if len(vals) != len(size):
            raise _Bad(f"expects '{key}=' has the same size as 'size='")
    stride, pad = fields.get("stride"), fields.get("pad")
    lhs, rhs, rev = fields.get("lhs_dilate"), fields.get("rhs_dilate"), fields.get("rhs_reversal")
    return tuple(
        WindowDim(
            size[i],
            stride[i] if stride else 1,
            pad[i][0] if pad else 0,
            pad[i][1] if pad else 0,
            lhs[i] if lhs else 1,
            rhs[i] if rhs else 1,
            (rev[i] == 1) if rev else False,
        )
        for i in range(len(size))
    )


_DIM_LABELS = re.compile(r"([0-9bf?]{2,})_([0-9io?]{2,})->([0-9bf?]{2,})$")


def _labels(text: str, a: str, b: str, what: str):
    chars = [c for c in text if c != "?"]
    if len(set(chars)) != len(chars):
        raise _Bad(f"expects unique {what} dimension numbers, but sees {text}")
    nspatial = sum(1 for c in text if c not in (a, b, "?"))
    spatial = [-1] * nspatial
    first = second = -1
    for i, c in enumerate(text):
        if c == "?":
            continue
        if c == a:
            first = i
        elif c == b:
            second = i
        elif "0" <= c < chr(ord("0") + len(text)) and int(c) < nspatial:
            spatial[int(c)] = i
        else:
            raise _Bad(f"expects [0-{len(text) - 1}{a}{b}?] in {what} dimension numbers")
    return first, second, tuple(spatial)


def decode_dim_labels(raw: str) -> ConvDims:
    """`b01f_01io->b01f` -> ConvDims (ParseConvolutionDimensionNumbers)."""
    m = _DIM_LABELS.match(raw.strip())
    if m is None:
        raise _Bad("expects dim labels pattern, e.g., 'bf0_0io->0bf'")
    lhs, rhs, out = m.groups()
    ib, if_, isp = _labels(lhs, "b", "f", "lhs")
    ki, ko, ksp = _labels(rhs, "i", "o", "rhs")
    ob, of, osp = _labels(out, "b", "f", "output")
    if not (len(isp) == len(ksp) == len(osp)):
        raise _Bad("input, kernel, and output must have same number of spatial dimensions")
    return ConvDims(ib, if_, isp, ki, ko, ksp, ob, of, osp)
