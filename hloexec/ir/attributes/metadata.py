"""The free-form attributes: op metadata, frontend attributes and backend config (JSON, or MLIR-style
dictionaries), decoded to dicts."""

from __future__ import annotations

import json
import re

from .syntax import _Bad, _string, _text_or_bytes, unescape


_STR_BODY = r'[^"\\]*(?:\\.[^"\\]*)*'
_META_ITEM_RE = r'([A-Za-z_][A-Za-z0-9_]*)=(?:"(' + _STR_BODY + r')"|(-?\d+)|\{([^{}]*)\})'
_META_FIND = re.compile(_META_ITEM_RE, re.S)
_META_FULL = re.compile(
    r"\s*\{(?:[\s,]*" + _META_ITEM_RE.replace("(", "(?:").replace("(?:?:", "(?:") + r")*[\s,]*\}\s*$", re.S
)


def decode_metadata(raw: str) -> dict:
    """`{op_type="dot" op_name="..." source_file="f.py" source_line=12}` -> dict (ints for lines/ids)."""
    if _META_FULL.match(raw) is None:
        raise _Bad("expects '{' key=value ... '}' with string, integer or {int list} values")
    out: dict = {}
    for m in _META_FIND.finditer(raw):
        key, sval, ival, lval = m.groups()
        if key in out:
            raise _Bad(f"attribute {key} already exists")
        if ival is not None:
            out[key] = int(ival)
        elif lval is not None:
            out[key] = tuple(int(x) for x in lval.split(",") if x.strip())
        elif "\\" in sval:
            v = unescape(sval)
            out[key] = v if isinstance(v, str) else v.decode("utf-8", "replace")
        else:
            out[key] = sval
    return out


def _braced_end(s: str, i: int) -> int:
    """Index after the '}' matching the '{' at s[i] (XLA's LexJsonDict: strings skipped)."""
    depth, n = 0, len(s)
    while i < n:
        c = s[i]
        if c == '"':
            m = re.compile(r'"(?:[^"\\]|\\.)*"', re.S).match(s, i)
            if m is None:
                raise _Bad("unterminated string")
            i = m.end()
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise _Bad("unbalanced '{'")


_FA_KEY = re.compile(r"[\s,]*([A-Za-z_][A-Za-z0-9_.\-]*)\s*=\s*")
_FA_STR = re.compile(r'"((?:[^"\\]|\\.)*)"', re.S)
_FA_BARE = re.compile(r"[^,\s}]+")


def decode_frontend_attributes(raw: str) -> dict:
    """`{_xla_x="1", k={json}}` -> dict[str, str] (values unescaped; JSON dicts kept as text)."""
    s = raw.strip()
    if not (s.startswith("{") and s.endswith("}")):
        raise _Bad("expected '{' to start frontend attributes")
    out: dict = {}
    pos, end = 1, len(s) - 1
    while s[pos:end].strip(" \t\n,"):
        m = _FA_KEY.match(s, pos, end)
        if m is None:
            raise _Bad(f"expects attribute name at {s[pos : pos + 30]!r}")
        key, pos = m.group(1), m.end()
        if s.startswith('"', pos):
            m = _FA_STR.match(s, pos, end)
            if m is None:
                raise _Bad("unterminated string")
            v = unescape(m.group(1))
            out[key] = v if isinstance(v, str) else v.decode("utf-8", "replace")
            pos = m.end()
        elif s.startswith("{", pos):
            e = _braced_end(s, pos)
            out[key] = s[pos:e]
            pos = e
        else:  # lenient: a bare word
            m = _FA_BARE.match(s, pos, end)
            if m is None:
                raise _Bad(f"expects a string value for {key}")
            out[key] = m.group()
            pos = m.end()
    return out


_UNQUOTED_KEY = re.compile(r"([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)\s*:")


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return json.loads(_UNQUOTED_KEY.sub(r'\1"\2":', text))
    except ValueError:
        return None


def decode_backend_config(raw: str):
    """A quoted string is unescaped, then parsed as JSON if it looks like JSON (unquoted keys tolerated),
    else returned as text (or bytes when binary); a braced `{...}` is parsed as JSON, else as the MLIR
    dictionary typed-FFI custom-calls carry (`{mode = 65 : ui8, eps = 1.0e-05 : f32}`), else kept raw."""
    s = raw.strip()
    if s.startswith('"'):
        text = _string(s)
        if isinstance(text, str):
            t = text.strip()
            if t[:1] in ("{", "["):
                v = _json_or_none(t)
                if v is not None:
                    return v
        return text
    if s.startswith("{"):
        if _braced_end(s, 0) != len(s):
            raise _Bad("unexpected text after the JSON dict")
        v = _json_or_none(s)
        if v is None:
            v = _mlir_dict_or_none(s)
        return raw if v is None else v
    raise _Bad("expects a string or a JSON dict")


# MLIR attribute dictionaries (the typed-FFI form of backend_config): name = value [: type], ...
_MLIR_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>[-+]?(?:0x[0-9A-Fa-f]+|\d+\.?\d*(?:[eE][-+]?\d+)?))'
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_.$]*)|(?P<punct>[{}\[\]=,:<>]))",
    re.S,
)
_MLIR_HEX_ESCAPE = re.compile(r"\\([0-9A-Fa-f]{2}|.)", re.S)


def _mlir_string(body: str):
    """An MLIR string literal's body: `\\XX` hex escapes (and `\\\\`, `\\"`, `\\n`, `\\t`); bytes when not UTF-8."""
    if "\\" not in body:
        return body
    simple = {"n": b"\n", "t": b"\t"}
    out, last = bytearray(), 0
    for m in _MLIR_HEX_ESCAPE.finditer(body):
        out += body[last : m.start()].encode("utf-8")
        esc = m.group(1)
        out += bytes([int(esc, 16)]) if len(esc) == 2 else simple.get(esc, esc.encode("utf-8"))
        last = m.end()
    out += body[last:].encode("utf-8")
    return _text_or_bytes(out)


def _mlir_dict_or_none(text: str):
    """`{a = 1 : i64, b = true, c = "x", d = 2.5e-01 : f32, e}` -> dict (unit attributes are True; values
    of other kinds, `array<...>` or `dense<...>`, kept as their text); None when the text is not one."""
    tokens = [(kind, m.group(kind)) for m in _MLIR_TOKEN.finditer(text) if (kind := m.lastgroup) is not None]
    if "".join(v for _, v in tokens) != re.sub(r"\s+", "", text):
        return None
    pos = 0

    def value():
        nonlocal pos
        kind, tok = tokens[pos]
        if tok == "{":
            return dictionary()
        if tok == "[":
            pos += 1
            items = []
            while tokens[pos][1] != "]":
                items.append(value())
                if tokens[pos][1] == ",":
                    pos += 1
            pos += 1
            return items
        pos += 1
        if kind == "str":
            v = _mlir_string(tok[1:-1])
        elif kind == "num":
            v = int(tok, 0) if re.fullmatch(r"[-+]?(0x[0-9A-Fa-f]+|\d+)", tok) else float(tok)
        elif tok in ("true", "false"):
            v = tok == "true"
        else:  # array<i64: 1, 2>, dense<...>, #dialect<...>: as text
            start = pos - 1
            depth = 0
            while pos < len(tokens) and (depth or tokens[pos][1] not in (",", "}", "]", ":")):
                depth += {"<": 1, ">": -1}.get(tokens[pos][1], 0)
                pos += 1
            return " ".join(t for _, t in tokens[start:pos])
        if pos < len(tokens) and tokens[pos][1] == ":":  # the type: i64, ui8, f32 ...
            pos += 2
        return v

    def dictionary():
        nonlocal pos
        pos += 1  # "{"
        out = {}
        while tokens[pos][1] != "}":
            kind, key = tokens[pos]
            if kind not in ("word", "str"):
                raise _Bad(f"expects an attribute name, got {key!r}")
            key = key[1:-1] if kind == "str" else key
            pos += 1
            if tokens[pos][1] == "=":
                pos += 1
                out[key] = value()
            else:
                out[key] = True
            if tokens[pos][1] == ",":
                pos += 1
            elif tokens[pos][1] != "}":
                raise _Bad("expects ',' or '}' after an attribute")
        pos += 1
        return out

    try:
        result = dictionary()
    except (IndexError, ValueError, _Bad):
        return None
    return result if pos == len(tokens) else None
