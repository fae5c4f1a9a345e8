"""The lexical layer of attribute values, as XLA's lexer reads them: integers, booleans, words, C-escaped
strings, and a small tokenizer for the bracketed grammars; the error an attribute value XLA would reject raises."""

from __future__ import annotations

import builtins
import re


class AttributeSyntaxError(ValueError):
    """An attribute value that XLA's parser would reject; the parser turns it into HloParseError."""

    def __init__(self, key: str, raw: str, message: str):
        self.key, self.raw, self.message = key, raw, message
        shown = raw if len(raw) <= 120 else raw[:117] + "..."
        super().__init__(f"bad value for attribute {key}={shown}: {message}")


class _Bad(ValueError):
    pass


_INT = re.compile(r"\s*(-?\d+)\s*$")
_INT_LIST = re.compile(r"\s*\{\s*(-?\d+(?:\s*,\s*-?\d+)*)?\s*\}\s*$")
_IDENT = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*$")
_STRING = re.compile(r'\s*"((?:[^"\\]|\\.)*)"\s*$', re.S)


def _int(raw: str) -> int:
    s = raw.strip()
    if not (s[1:] if s[:1] == "-" else s).isdigit():
        raise _Bad("expects an integer")
    v = int(s)
    return v if -(1 << 63) <= v < (1 << 63) else _check_int64(v)


def _check_int64(v: int) -> int:
    if v >= 1 << 63:
        if v >= 1 << 64:
            raise _Bad("integer does not fit in 64 bits")
        v -= 1 << 64  # the lexer bit_casts an unsigned token to int64
    elif v < -(1 << 63):
        raise _Bad("integer does not fit in 64 bits")
    return v


def _int_list(raw: str) -> tuple[int, ...]:
    m = _INT_LIST.match(raw)
    if m is None:
        raise _Bad("expects a braced list of integers such as {0,1}")
    body = m.group(1)
    return tuple(_check_int64(int(x)) for x in body.split(",")) if body else ()


def _bool(raw: str) -> bool:
    s = raw.strip()
    if s == "true":
        return True
    if s == "false":
        return False
    raise _Bad("expects true or false")


# -- strings (absl::CUnescape, as XLA's lexer) ---------------------------------------
_SIMPLE_ESCAPES = {"n": 10, "t": 9, "r": 13, "a": 7, "b": 8, "f": 12, "v": 11, "\\": 92, "'": 39, '"': 34, "?": 63}
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|[xX]([0-9a-fA-F]+)|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", re.S)


def unescape(body: str) -> str | bytes:
    """absl::CUnescape of the text between the quotes. Byte escapes (\\377, \\xff) that do not form UTF-8
    with the rest give `bytes` (binary backend configs); otherwise `str`."""
    if "\\" not in body:
        return body
    out = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(body):
        out += body[pos : m.start()].encode("utf-8")
        octal, hexa, u4, u8, other = m.groups()
        if octal is not None:
            v = int(octal, 8)
            if v > 0xFF:
                raise _Bad(f"value of \\{octal} exceeds 0xff")
            out.append(v)
        elif hexa is not None:
            v = int(hexa, 16)
            if v > 0xFF:
                raise _Bad(f"value of \\x{hexa} exceeds 0xff")
            out.append(v)
        elif u4 is not None or u8 is not None:
            cp = int(u4 or u8, 16)
            if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                raise _Bad(f"bad unicode escape {m.group()}")
            out += chr(cp).encode("utf-8")
        else:
            simple = _SIMPLE_ESCAPES.get(other)
            if simple is None:
                raise _Bad(f"unknown escape sequence \\{other}")
            out.append(simple)
        pos = m.end()
    if body.endswith("\\") and pos < len(body):
        raise _Bad("string cannot end with '\\'")
    out += body[pos:].encode("utf-8")
    return _text_or_bytes(out)


def _text_or_bytes(data: bytearray):
    """Unescaped string contents: text when they are UTF-8, else the bytes (binary backend configs)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return bytes(data)


def _string(raw: str):
    m = _STRING.match(raw)
    if m is None:
        raise _Bad('expects a quoted string "..."')
    return unescape(m.group(1))


def _word(raw: str) -> str:
    """An enum-like value: a bare identifier (GT, kLoop, rng_uniform) or a quoted string."""
    s = raw.strip()
    if s.startswith('"'):
        v = _string(s)
        return v if isinstance(v, str) else v.decode("latin-1")
    m = _IDENT.match(s)
    if m is None:
        raise _Bad("expects an identifier")
    return m.group(1)


# -- a small tokenizer (XLA's token kinds that attribute grammars use) ----------------
_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|/\*.*?\*/)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<arrow>->) | (?P<leq><=)
  | (?P<int>-?\d+)
  | (?P<name>%[A-Za-z_][A-Za-z0-9_.\-]*)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.\-]*)
  | (?P<quoted>'[^']*')
  | (?P<p>[{}\[\]():=,?])
""",
    re.X | re.S,
)


class _Tokens:
    __slots__ = ("toks", "i", "raw")

    def __init__(self, raw: str):
        toks = []
        pos, n = 0, len(raw)
        match = _TOKEN.match
        while pos < n:
            m = match(raw, pos)
            if m is None:
                raise _Bad(f"unexpected text {raw[pos : pos + 20]!r}")
            kind = m.lastgroup
            assert kind is not None  # every alternative of _TOKEN is a named group
            if kind != "ws":
                text = m.group()
                toks.append((text if kind == "p" else kind, text))
            pos = m.end()
        toks.append(("eof", ""))
        self.toks, self.i, self.raw = toks, 0, raw

    def peek(self, k: int = 0) -> str:
        return self.toks[min(self.i + k, len(self.toks) - 1)][0]

    def next(self):
        t = self.toks[self.i]
        if t[0] != "eof":
            self.i += 1
        return t

    def expect(self, kind: str) -> str:
        t = self.next()
        if t[0] != kind:
            raise _Bad(f"expects {kind!r}, sees {t[1] or 'end of text'!r}")
        return t[1]

    def eat(self, kind: str) -> bool:
        if self.toks[self.i][0] == kind:
            self.i += 1
            return True
        return False

    def int(self) -> int:
        return _check_int64(int(self.expect("int")))

    def int_list(self, open_="{", close="}", sep=",") -> tuple[builtins.int, ...]:  # (int: the method above)
        self.expect(open_)
        out = []
        if not self.eat(close):
            while True:
                out.append(self.int())
                if self.eat(close):
                    break
                self.expect(sep)
        return tuple(out)

    def done(self):
        if self.peek() != "eof":
            raise _Bad(f"unexpected text after the value: {self.toks[self.i][1]!r}")

    def skip_balanced(self):
        """Skip one value: a token or a balanced {...}/[...]/(...) group."""
        t = self.next()
        if t[0] not in ("{", "[", "("):
            return
        depth = 1
        while depth:
            k = self.next()[0]
            if k in ("{", "[", "("):
                depth += 1
            elif k in ("}", "]", ")"):
                depth -= 1
            elif k == "eof":
                raise _Bad("unbalanced brackets")
