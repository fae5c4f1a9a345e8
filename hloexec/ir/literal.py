"""HLO literal text <-> numpy, following XLA's parser (hlo_parser.cc ParseDenseLiteral,
SetValueInLiteralHelper) and printer (literal.cc, util.cc RoundTripFpToString).

Reading: every number is lexed as XLA's lexer does (an integer token as int64, with
2**63..2**64-1 wrapping to negative like the lexer's bit_cast; a decimal token as a double) and
then converted once to the element type:
  * f64 as is; f32 by a round-to-nearest-even cast; f16/bf16 through f32 like Eigen's
    `half(double)` / `bfloat16(double)` constructors do; fp8/fp6/fp4 directly from the double like
    ml_dtypes' `float8_*(double)` constructors (emulated: f64 -> f32 rounding to odd, then RNE).
  * a finite value that overflows to inf/nan is an error ("out of range"), as XLA's
    CheckParsedValueIsInRange; integers outside the type's range are errors too (for unsigned
    types the check is done on the value as uint64, so `-1` is accepted for u64, as in XLA).
  * `nan`, `-nan`, `nan(0x..)`: the sign and payload are set bit-exactly (NanWithSignAndPayload);
    a payload on a type without NaN payloads is an error, as in XLA.
  * c64/c128 `(re, im)`; XLA's imaginary part copies the real part's NaN sign/payload when the
    real part is NaN (a quirk of SetValueInLiteralHelper) - reproduced.
  * `{...}` (an elided literal, `kDots`) gives zeros; `literal_elided(text)` tells the caller.
  * a lone scalar for an array shape (`f32[3,3] constant(1)`) is the first element, the rest zero.
XLA no longer has a sparse literal syntax, so there is none here.

Speed: the dense path strips braces/commas and parses with `np.fromstring`: about 1-2 s for
10 M f32 elements. Texts up to 1 MB are checked token by token against the shape exactly as XLA
does; longer ones are checked by brace and element counts only. A long plain (numbers only) real
or integer array kept as a span of the parsed buffer is decoded chunk by chunk straight into the
result, so its peak memory is the result plus a chunk; anything else takes the exact path.
"""

from __future__ import annotations

import math
import re

import numpy as np

from .shape import Shape

__all__ = ["parse_literal", "literal_elided", "literal_to_text", "LiteralSyntaxError"]


class LiteralSyntaxError(ValueError):
    """Bad literal text; `offset` is the character offset in the text (or -1)."""

    def __init__(self, message: str, offset: int = -1):
        super().__init__(message)
        self.offset = offset


# Float element types with NaN payload bits (std::numeric_limits<T>::has_signaling_NaN in XLA).
_PAYLOAD_TYPES = {"f16", "bf16", "f32", "f64", "f8e5m2", "f8e4m3", "f8e3m4"}
_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_EXACT_CHECK_LIMIT = 1 << 20
_TRANS = str.maketrans("{},", "   ")
_TRANS_COMPLEX = str.maketrans("{},()", "     ")
_PAYLOAD_PARENS = re.compile(r"nan\(0x([0-9a-fA-F]+)\)")
_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r\n]+)
  | (?P<lb>\{) | (?P<rb>\}) | (?P<comma>,) | (?P<lp>\() | (?P<rp>\))
  | (?P<dots>\.\.\.)
  | (?P<num>-?(?:(?:\d+|\d+\.\d*|\d*\.\d+)[eE][+-]?\d+|\d+\.\d*|\d*\.\d+|\d+))
  | (?P<nan>-?nan(?:\(0x[0-9a-fA-F]+\))?)
  | (?P<inf>-?inf)
  | (?P<kw>true|false)
""",
    re.X,
)


def literal_elided(text: str) -> bool:
    """True if the literal text is XLA's elided form `{...}` (values not in the dump)."""
    return "..." in text


# -- reading -----------------------------------------------------------------------
def parse_literal(text, shape: Shape, inst=None):
    """The numpy value of literal `text` of `shape` (a tuple of arrays for a tuple shape).

    `text` is a str or a span of the parsed buffer (hloexec.ir.module.TextSpan, decoded here)."""
    if not isinstance(text, str):
        values = _parse_span_in_chunks(text, shape) if text.length > _EXACT_CHECK_LIMIT else None
        if values is not None:
            return values
        text = text.text()
    if "/*" in text:
        text = _COMMENT.sub(" ", text)
    if shape.is_tuple:
        if literal_elided(text):
            _flag_elided(inst)
            return tuple(_zeros(s) for s in shape.tuple_shapes)
        parts = _split_tuple(text, len(shape.tuple_shapes))
        return tuple(parse_literal(p, s) for p, s in zip(parts, shape.tuple_shapes))
    etype = shape.element_type
    if etype.numpy is None:  # token[] / opaque
        return None
    if literal_elided(text):
        if text.strip() != "{...}" or shape.rank == 0:
            raise LiteralSyntaxError("an elided literal is written '{...}' (for an array of rank >= 1)")
        _flag_elided(inst)
        return _zeros(shape)
    return _parse_dense(text, shape)


def _zeros(shape: Shape):
    if shape.is_tuple:
        return tuple(_zeros(s) for s in shape.tuple_shapes)
    if shape.element_type.numpy is None:
        return None
    return np.zeros(shape.dims, shape.dtype)


def _flag_elided(inst):
    if inst is not None:
        decoded = inst._decoded
        if decoded is None:
            decoded = inst._decoded = {}
        decoded["__literal_elided__"] = True


def _split_tuple(text: str, n: int) -> list[str]:
    t = text.strip()
    if not (t.startswith("(") and t.endswith(")")):
        raise LiteralSyntaxError("expects '(' ... ')' around a tuple literal")
    inner, parts, depth, start = t[1:-1], [], 0, 0
    for i, c in enumerate(inner):
        if c in "({":
            depth += 1
        elif c in ")}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    if inner.strip():
        parts.append(inner[start:])
    if len(parts) != n:
        raise LiteralSyntaxError(f"expects {n} tuple elements, sees {len(parts)}")
    return parts


def _check_structure(text: str, shape: Shape) -> None:
    """ParseDenseLiteral's nesting checks, token by token."""
    dims, rank = shape.dims, shape.rank
    is_complex = shape.element_type.kind == "complex"
    seen = [0] * rank
    level = 0
    pos = 0
    started = False
    n = len(text)
    in_paren = 0
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None:
            raise LiteralSyntaxError(f"unexpected text in literal: {text[pos : pos + 20]!r}", pos)
        kind = m.lastgroup
        pos = m.end()
        if kind == "ws" or kind == "comma":
            continue
        if started and level == 0 and in_paren == 0:
            raise LiteralSyntaxError("unexpected text after literal", m.start())
        started = True
        if kind == "lb":
            level += 1
            if level > rank:
                raise LiteralSyntaxError(f"expects nested array in rank {rank}, but sees larger", m.start())
            if level > 1:
                seen[level - 2] += 1
                if seen[level - 2] > dims[level - 2]:
                    raise LiteralSyntaxError(f"expects {dims[level - 2]} elements, but sees more", m.start())
        elif kind == "rb":
            if level == 0:
                raise LiteralSyntaxError("unexpected '}' token", m.start())
            level -= 1
            if seen[level] != dims[level]:
                raise LiteralSyntaxError(
                    f"expects {dims[level]} elements in dimension {level}, but sees {seen[level]}", m.start()
                )
            seen[level] = 0
        elif kind == "lp":
            if not is_complex:
                raise LiteralSyntaxError(
                    "unexpected '(' in literal. Parens are only valid for complex literals", m.start()
                )
            _elem(seen, level, rank, dims, m.start())
            in_paren = 1
            cnt = 0
            while True:
                m = _TOKEN.match(text, pos)
                if m is None:
                    raise LiteralSyntaxError("bad complex literal", pos)
                pos = m.end()
                k = m.lastgroup
                if k in ("ws", "comma"):
                    continue
                if k == "rp":
                    break
                if k not in ("num", "nan", "inf"):
                    raise LiteralSyntaxError("expects a number in a complex literal", m.start())
                cnt += 1
            if cnt != 2:
                raise LiteralSyntaxError("expects (real, imag) in a complex literal", pos)
            in_paren = 0
        elif kind in ("num", "nan", "inf", "kw"):
            if is_complex:
                raise LiteralSyntaxError("expects '(' for a complex value", m.start())
            _elem(seen, level, rank, dims, m.start())
        else:
            raise LiteralSyntaxError(f"unexpected token {m.group()!r} in a literal", m.start())
    if level != 0:
        raise LiteralSyntaxError("unbalanced '{' in literal", n)
    if not started:
        raise LiteralSyntaxError("empty literal", 0)


def _elem(seen, level, rank, dims, off):
    if rank > 0:
        if level != rank:
            raise LiteralSyntaxError(f"expects nested array in rank {rank}, but sees {level}", off)
        seen[rank - 1] += 1
        if seen[rank - 1] > dims[rank - 1]:
            raise LiteralSyntaxError(
                f"expects {dims[rank - 1]} elements on the minor-most dimension, but sees more", off
            )


def _parse_dense(text: str, shape: Shape):
    etype = shape.element_type
    size = shape.size
    rank = shape.rank
    if rank > 0 and size > 0 and etype.kind != "complex" and "{" not in text:
        return _parse_lone_scalar(text, shape)
    if len(text) <= _EXACT_CHECK_LIMIT:
        _check_structure(text, shape)
    else:
        want = sum(math.prod(shape.dims[:k]) for k in range(rank))
        if text.count("{") != want or text.count("}") != want:
            raise LiteralSyntaxError(f"literal of shape {shape.to_text()} needs {want} braces at each side")
    kind = etype.kind
    if kind == "complex":
        body = _PAYLOAD_PARENS.sub(r"nan[0x\1]", text).translate(_TRANS_COMPLEX)
    else:
        body = text.translate(_TRANS)
    if kind in ("sint", "uint", "pred"):
        values = _parse_ints(body, size, etype)
    elif kind == "float":
        values = _to_float_type(_parse_doubles(body, size), etype)
    elif kind == "complex":
        d = _parse_doubles(body, 2 * size)
        values = _to_complex(d, etype)
    else:
        raise LiteralSyntaxError(f"unsupported literal element type {etype.name}")
    return values.reshape(shape.dims)


_CHUNK_BYTES = 1 << 20
_SEPARATORS = bytes.maketrans(b"{},\t\r\n", b"      ")
_NOT_PLAIN_FLOAT = re.compile(rb"[^0-9eE.+\- inf]|nan|\.\.\.")
_NOT_PLAIN_INT = re.compile(rb"[^0-9 \-]|[0-9]{19}")


def _parse_span_in_chunks(span, shape: Shape) -> np.ndarray | None:
    """The value of a long array literal read from its buffer span ~1 MB at a time, each chunk's doubles
    (or int64s) converted by the exact path's rules into the preallocated result; None when the text is
    not plain numbers with the expected brace and element counts (the exact path then decodes it,
    reporting any error as it always does)."""
    etype, size, rank = shape.element_type, shape.size, shape.rank
    kind = etype.kind
    if shape.is_tuple or rank == 0 or size == 0 or kind not in ("float", "sint", "uint", "pred"):
        return None
    is_float = kind == "float"
    not_plain, parsed_dtype = (_NOT_PLAIN_FLOAT, np.float64) if is_float else (_NOT_PLAIN_INT, np.int64)
    out = np.empty(size, shape.dtype)
    filled = opened = closed = 0
    buf, pos, end = span.buf, span.offset, span.offset + span.length
    while pos < end:
        chunk = buf[pos : min(pos + _CHUNK_BYTES, end)]
        if pos + len(chunk) < end:  # cut after the last separator: no number is split
            cut = max(chunk.rfind(sep) for sep in (b",", b" ", b"{", b"}", b"\n", b"\t", b"\r")) + 1
            if cut == 0:
                return None
            chunk = chunk[:cut]
        pos += len(chunk)
        opened += chunk.count(b"{")
        closed += chunk.count(b"}")
        body = chunk.translate(_SEPARATORS)
        if not_plain.search(body) is not None:
            return None
        blank = np.frombuffer(body, np.uint8) == ord(" ")
        count = int(np.count_nonzero(blank[:-1] & ~blank[1:])) + (not blank[0])
        if count == 0:
            continue
        if filled + count > size:
            return None
        try:
            with np.errstate(all="ignore"):
                parsed = np.fromstring(body, dtype=parsed_dtype, sep=" ")
        except ValueError:  # a bad token
            return None
        if parsed.size != count:
            return None
        try:
            out[filled : filled + count] = (
                _to_float_type(parsed, etype) if is_float else _range_check_ints(parsed, etype)
            )
        except LiteralSyntaxError:
            return None
        filled += count
    braces = sum(math.prod(shape.dims[:k]) for k in range(rank))
    if filled != size or opened != braces or closed != braces:
        return None
    return out.reshape(shape.dims)


def _parse_lone_scalar(text: str, shape: Shape) -> np.ndarray:
    """XLA's parser reads a lone scalar for an array shape (`f32[3,3] constant(1)`) as the first
    element and leaves the others zero (checked against jaxlib's parser: `f32[3] constant(2.5)`
    prints `{2.5, 0, 0}`); a bad scalar is reported as the missing nesting, as XLA does."""
    try:
        first = _parse_dense(text, Shape(element_type=shape.element_type, dims=()))
    except LiteralSyntaxError:
        raise LiteralSyntaxError(f"expects nested array in rank {shape.rank}, but sees 0") from None
    values = np.zeros(shape.dims, shape.dtype)
    values.flat[0] = first
    return values


def _parse_ints(body: str, size: int, etype) -> np.ndarray:
    letters = re.search(r"[^\d\s-]", body) is not None
    big = re.search(r"\d{19}", body) is not None
    if not letters and not big:
        try:
            with np.errstate(all="ignore"):
                vals = np.fromstring(body, dtype=np.int64, sep=" ") if size else np.zeros(0, np.int64)
        except ValueError:  # a bad token such as `1-2`: the token loop below names it
            vals = None
        if vals is not None:
            if vals.size != size:
                raise LiteralSyntaxError(f"expects {size} integer values, sees {vals.size} (or a bad token)")
            return _range_check_ints(vals, etype)
    toks = body.split()
    if len(toks) != size:
        raise LiteralSyntaxError(f"expects {size} values, sees {len(toks)}")
    out = []
    for t in toks:
        if t == "true" or t == "false":
            if etype.kind != "pred":
                raise LiteralSyntaxError(f"expects integer for primitive type: {etype.name}, sees {t}")
            out.append(1 if t == "true" else 0)
            continue
        if not re.fullmatch(r"-?\d+", t):
            raise LiteralSyntaxError(f"expects integer for primitive type: {etype.name}, sees {t!r}")
        v = int(t)
        if v >= 1 << 64 or v < -(1 << 63):
            raise LiteralSyntaxError(f"integer {t} does not fit in 64 bits")
        if v >= 1 << 63:
            v -= 1 << 64  # the lexer bit_casts uint64 to int64
        out.append(v)
    return _range_check_ints(np.array(out, dtype=np.int64), etype)


def _range_check_ints(vals: np.ndarray, etype) -> np.ndarray:
    if etype.kind == "pred":
        return vals != 0
    dtype = etype.numpy
    if etype.kind == "uint":
        hi = (1 << etype.bits) - 1
        u = vals.view(np.uint64)
        if u.size and int(u.max()) > hi:
            bad = int(u[u > hi][0])
            raise LiteralSyntaxError(
                f"value {np.int64(np.uint64(bad))} is out of range for literal's primitive type "
                f"{etype.name} namely [0, {hi}]"
            )
        return u.astype(dtype) if etype.bits >= 8 else u.astype(np.uint8).astype(dtype)
    lo, hi = -(1 << (etype.bits - 1)), (1 << (etype.bits - 1)) - 1
    if vals.size and (int(vals.max()) > hi or int(vals.min()) < lo):
        bad = int(vals[(vals > hi) | (vals < lo)][0])
        raise LiteralSyntaxError(
            f"value {bad} is out of range for literal's primitive type {etype.name} namely [{lo}, {hi}]"
        )
    return vals.astype(dtype) if etype.bits >= 8 else vals.astype(np.int8).astype(dtype)


_NAN_TOKEN = re.compile(r"(-?)nan(?:[(\[]0x([0-9a-fA-F]+)[)\]])?$")
_QUIET_F64 = 1 << 51
_F64_PAYLOAD_MASK = (1 << 52) - 1


def _parse_doubles(body: str, count: int) -> np.ndarray:
    """Doubles of every token; NaN tokens become NaNs with XLA's double sign and payload."""
    if "nan" not in body and re.search(r"[^0-9eE.+\-\sinf]", body) is None:
        try:
            with np.errstate(all="ignore"):
                vals = np.fromstring(body, dtype=np.float64, sep=" ") if count else np.zeros(0)
        except ValueError:  # a bad token such as `3..4`: the token loop below names it
            vals = None
        if vals is not None:
            if vals.size != count:
                raise LiteralSyntaxError(f"expects {count} floating point values, sees {vals.size} (or a bad token)")
            return vals
    toks = body.split()
    if len(toks) != count:
        raise LiteralSyntaxError(f"expects {count} values, sees {len(toks)}")
    bits = np.empty(count, np.uint64)
    vals = bits.view(np.float64)
    for i, t in enumerate(toks):
        if "nan" in t:
            m = _NAN_TOKEN.match(t)
            if m is None:
                raise LiteralSyntaxError(f"bad NaN token {t!r}")
            payload = int(m.group(2), 16) if m.group(2) else _QUIET_F64
            if payload <= 0 or payload > _F64_PAYLOAD_MASK:
                raise LiteralSyntaxError(f"NaN payload out of range: {t}")
            bits[i] = (int(bool(m.group(1))) << 63) | (0x7FF << 52) | payload
        elif t in ("true", "false"):
            raise LiteralSyntaxError(f"expect floating point value, sees {t}")
        else:
            try:
                vals[i] = float(t)
            except ValueError:
                raise LiteralSyntaxError(f"bad number {t!r} in literal") from None
    return vals


def _float_info(etype):
    """(total bits, mantissa bits) of a float element type."""
    if etype.name in ("f16", "f32", "f64"):
        return etype.numpy.itemsize * 8, {"f16": 10, "f32": 23, "f64": 52}[etype.name]
    import ml_dtypes

    return etype.bits, int(ml_dtypes.finfo(etype.numpy).nmant)


def _f64_to_f32_round_to_odd(d: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        f = d.astype(np.float32)
        back = f.astype(np.float64)
        inexact = (back != d) & np.isfinite(d)
        if inexact.any():
            # truncate toward zero, then set the lowest bit (sticky): a later RNE cast is exact rounding
            over = inexact & (np.abs(back) > np.abs(d))
            f[over] = np.nextafter(f[over], np.float32(0))
            fb = f.view(np.uint32)
            fb[inexact] |= np.uint32(1)
    return f


def _to_float_type(d: np.ndarray, etype) -> np.ndarray:
    name = etype.name
    with np.errstate(all="ignore"):
        if name == "f64":
            out = d.copy()
        elif name == "f32":
            out = d.astype(np.float32)
        elif etype.is_half_float:
            out = d.astype(np.float32).astype(etype.numpy)
        else:
            out = _f64_to_f32_round_to_odd(d).astype(etype.numpy)
    finite_in = np.isfinite(d)
    if name != "f64":
        bad = finite_in & ~np.isfinite(out.astype(np.float64))
        if bad.any():
            v = d[bad][0]
            raise LiteralSyntaxError(f"value {float(v)!r} is out of range for literal's primitive type {name}")
    nan = np.isnan(d)
    if nan.any():
        _set_nans(out, d, nan, etype)
    return out


def _set_nans(out: np.ndarray, d: np.ndarray, nan: np.ndarray, etype) -> None:
    """handle_nan of SetValueInLiteralHelper: sign and payload carried from the parsed double."""
    dbits = d.view(np.uint64)[nan]
    payload = dbits & np.uint64(_F64_PAYLOAD_MASK)
    sign = dbits >> np.uint64(63)
    name = etype.name
    if name not in _PAYLOAD_TYPES:
        if (payload != np.uint64(_QUIET_F64)).any():
            raise LiteralSyntaxError(f"{name} does not support NaN payloads")
        return  # static_cast<T>(nan): what the cast above produced
    nbits, mant = _float_info(etype)
    quiet = np.uint64(1 << (mant - 1))
    mask = np.uint64((1 << mant) - 1)
    payload = np.where(payload == np.uint64(_QUIET_F64), quiet, payload)
    if (payload > mask).any():
        raise LiteralSyntaxError(f"NaN payload 0x{int(payload[payload > mask][0]):x} is out of range for {name}")
    exp = np.uint64(((1 << (nbits - 1 - mant)) - 1) << mant)
    rep = (sign << np.uint64(nbits - 1)) | exp | payload
    ut = _UINT_OF_SIZE[out.dtype.itemsize]
    out.view(ut)[nan] = rep.astype(ut)


def _to_complex(d: np.ndarray, etype) -> np.ndarray:
    re_, im = d[0::2], d[1::2]
    comp = "f32" if etype.name == "c64" else "f64"
    from .dtypes import element_type

    ct = element_type(comp)
    real = _to_float_type(re_, ct)
    # XLA handles the imaginary part's NaN with the *real* part's value (hlo_parser.cc quirk):
    # plain cast of the imaginary part, then NaN sign/payload of the real part if that is NaN.
    with np.errstate(all="ignore"):
        imag = im.astype(ct.numpy)
    bad = np.isfinite(im) & ~np.isfinite(imag)
    if bad.any():
        raise LiteralSyntaxError(f"imaginary part {im[bad][0]!r} is out of range for {etype.name}")
    rnan = np.isnan(re_)
    if rnan.any():
        tmp = imag.copy()
        _set_nans(tmp, re_, rnan, ct)
        imag = tmp
    out = np.empty(re_.shape, etype.numpy)
    out.real = real
    out.imag = imag
    return out


# -- printing ------------------------------------------------------------------------
def _max_digits10(etype) -> int:
    if etype.name == "f32":
        return 9
    if etype.name == "f64":
        return 17
    _, mant = _float_info(etype)
    return math.ceil((mant + 1) * math.log10(2) + 1)


def _nan_text(bits: int, etype) -> str:
    nbits, mant = _float_info(etype)
    sign = "-" if (bits >> (nbits - 1)) & 1 else ""
    text = sign + "nan"
    if etype.name in _PAYLOAD_TYPES:
        payload = bits & ((1 << mant) - 1)
        if payload != 1 << (mant - 1):
            text += f"(0x{payload:x})"
    return text


def _float_strings(arr: np.ndarray, etype) -> list[str]:
    flat = arr.reshape(-1)
    with np.errstate(all="ignore"):
        d = flat.astype(np.float64)
    name = etype.name
    back: np.ndarray  # the strings read back, in the array's type
    if name == "f32":
        strs = [f"{v:.6g}" for v in d.tolist()]
        with np.errstate(all="ignore"):
            back = np.array(strs, dtype=np.float64).astype(np.float32) if strs else np.zeros(0, np.float32)
        redo = np.nonzero((back != flat) & ~np.isnan(flat))[0]
        for i in redo.tolist():
            strs[i] = f"{d[i]:.9g}"
    elif name == "f64":
        strs = [f"{v:.15g}" for v in d.tolist()]
        back = np.array(strs, dtype=np.float64) if strs else np.zeros(0)
        redo = np.nonzero((back != flat) & ~np.isnan(flat))[0]
        for i in redo.tolist():
            strs[i] = f"{d[i]:.17g}"
    else:
        digits = _max_digits10(etype)
        strs = [f"{v:.{digits}g}" for v in d.tolist()]
    nan = np.nonzero(np.isnan(d))[0]
    if nan.size:
        ut = _UINT_OF_SIZE[flat.dtype.itemsize]
        bits = flat.view(ut)
        for i in nan.tolist():
            strs[i] = _nan_text(int(bits[i]), etype)
    return strs


def _element_strings(arr: np.ndarray, etype) -> list[str]:
    kind = etype.kind
    if kind == "pred":
        if arr.ndim == 0:
            return ["true" if bool(arr) else "false"]
        return ["1" if v else "0" for v in arr.reshape(-1).tolist()]
    if kind in ("sint", "uint"):
        return [str(v) for v in arr.reshape(-1).astype(np.int64 if kind == "sint" else np.uint64).tolist()]
    if kind == "float":
        return _float_strings(np.ascontiguousarray(arr), etype)
    if kind == "complex":
        from .dtypes import element_type

        ct = element_type("f32" if etype.name == "c64" else "f64")
        flat = np.ascontiguousarray(arr).reshape(-1)
        re_s = _float_strings(np.ascontiguousarray(flat.real), ct)
        im_s = _float_strings(np.ascontiguousarray(flat.imag), ct)
        return [f"({a}, {b})" for a, b in zip(re_s, im_s)]
    raise ValueError(f"cannot print a literal of type {etype.name}")


def literal_to_text(array, shape: Shape) -> str:
    """The literal as XLA prints it in a constant, one line: `{ { 1, 2 }, { 3, 4 } }`, `-inf`, `nan(0x1)`."""
    if shape.is_tuple:
        return "(" + ", ".join(literal_to_text(a, s) for a, s in zip(array, shape.tuple_shapes)) + ")"
    etype = shape.element_type
    arr = np.asarray(array)
    if arr.dtype != etype.numpy:
        arr = arr.astype(etype.numpy)
    arr = arr.reshape(shape.dims)
    strs = _element_strings(arr, etype)
    rank = shape.rank
    if rank == 0:
        return strs[0]
    if rank == 1:
        return "{" + ", ".join(strs) + "}"
    dims = shape.dims
    it = iter(strs)

    def rec(level: int) -> str:
        n = dims[level]
        if level == rank - 1:
            items = [next(it) for _ in range(n)]
            return "{" + ", ".join(items) + "}" if n <= 1 else "{ " + ", ".join(items) + " }"
        return "{ " + ", ".join(rec(level + 1) for _ in range(n)) + " }"

    if 0 in dims:
        return _empty_text(dims)
    return rec(0)


def _empty_text(dims) -> str:
    if dims[0] == 0 or len(dims) == 1:
        return "{}"
    inner = _empty_text(dims[1:])
    return "{ " + ", ".join([inner] * dims[0]) + " }"
