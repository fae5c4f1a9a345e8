/* hlo_scan.c: one-pass structural scanner for HLO text. See hlo_scan.h.
 *
 * Layout of the work:
 *   top level   scan_file(): modules, `// -----` separators, junk lines
 *   module      parse_module_header() + parse_preamble()
 *   computation parse_comp_header() + parse_comp_body()
 *   instruction parse_instr() -> parse_instr_rest() (recursive only for
 *               nested operand instructions, bounded by HLO_MAX_NESTED)
 *   groups      scan_group(): (), [], {} and "strings" with an explicit
 *               bracket stack (no recursion on input depth)
 *
 * Every function returns 0 or an HLO_ERR_* code; the first error wins and is
 * kept in the scanner state with its byte offset and a static message.
 */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* madvise, posix_memalign under -std=c11 */
#endif
#include "hlo_scan.h"
#include "hlo_bytes.h"

#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* Runs of plain bytes (metadata strings, the text between brackets) are skipped 16 bytes at a time
 * with SSE2, which every x86-64 compiler targets by default: no run-time dispatch and no -march
 * flag (the wheel is built on the user's machine, but may be copied to another). AVX2 would halve
 * the steps of a 100-byte string but needs dispatch; SSE2 already brings these loops under one
 * instruction per byte. Elsewhere the byte loops below do the same work. Loads never pass `n`. */
#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define HLO_SSE2 1
#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
static unsigned first_bit(unsigned m) {
  unsigned long i;
  _BitScanForward(&i, m);
  return (unsigned)i;
}
#else
static unsigned first_bit(unsigned m) { return (unsigned)__builtin_ctz(m); }
#endif
#endif

#define HLO_MAX_NESTED 64 /* nested operand instructions: add(f32[] mul(a, b), c) */

/* character classes */
enum {
  C_WS = 1,     /* space, tab, CR, LF, VT, FF */
  C_NAME = 2,   /* [A-Za-z0-9_.-] */
  C_DIGIT = 4,  /* [0-9] */
  C_GRP = 8,    /* special inside a group: ()[]{}"/ and LF */
  C_VAL = 16,   /* special in a top-level attribute value: ws , ()[]{}"/ */
  C_STR = 32,   /* special inside a string: " \ LF */
  C_SKIP = 64,  /* may start whitespace or a comment: ws and '/' */
};

typedef struct {
  const uint8_t *b;
  uint64_t n;
  uint64_t p;
  hlo_tables *t;
  uint64_t cap_mod, cap_comp, cap_instr, cap_op, cap_attr;
  hlo_operand *scratch;
  uint64_t n_scratch, cap_scratch;
  /* per-computation name table: open addressing, generation-stamped */
  struct h_slot { uint32_t gen, hash, row; } *h; /* a probe reads one slot, not three arrays */
  uint64_t h_cap;
  uint64_t h_count;
  uint32_t gen;
  /* bracket stack for scan_group */
  uint8_t *bstack;
  /* Line counting: each newline is counted where the scan steps over it (note_newline), so every
   * newline before the furthest offset reached is counted, once (a rewind does not count it again). */
  uint64_t ln_start; /* the offset after the last newline counted (0: none) */
  uint32_t ln;       /* 1-based line at ln_start */
  int junk;
  int one_line; /* speculative header parse: never cross a newline */
  int err;
  uint64_t err_off;
  const char *err_msg;
  uint8_t cls[256];
} S;

static int fail(S *s, int code, uint64_t off, const char *msg) {
  if (!s->err) {
    s->err = code;
    s->err_off = off > s->n ? s->n : off;
    s->err_msg = msg;
  }
  return s->err;
}

static void init_classes(uint8_t *cls) {
  memset(cls, 0, 256);
  const char *ws = " \t\r\n\v\f";
  for (const char *c = ws; *c; c++) cls[(uint8_t)*c] |= C_WS | C_VAL;
  for (int c = 'a'; c <= 'z'; c++) cls[c] |= C_NAME;
  for (int c = 'A'; c <= 'Z'; c++) cls[c] |= C_NAME;
  for (int c = '0'; c <= '9'; c++) cls[c] |= C_NAME | C_DIGIT;
  cls['_'] |= C_NAME;
  cls['.'] |= C_NAME;
  cls['-'] |= C_NAME;
  const char *grp = "()[]{}\"/\n";
  for (const char *c = grp; *c; c++) cls[(uint8_t)*c] |= C_GRP;
  const char *val = ",()[]{}\"/";
  for (const char *c = val; *c; c++) cls[(uint8_t)*c] |= C_VAL;
  for (const char *c = ws; *c; c++) cls[(uint8_t)*c] |= C_SKIP;
  cls['/'] |= C_SKIP;
  cls['"'] |= C_STR;
  cls['\\'] |= C_STR;
  cls['\n'] |= C_STR;
}

/* ---------------------------------------------------------------- tables */

static int grow(S *s, void **arr, uint64_t *cap, uint64_t need, size_t elsz) {
  if (need <= *cap) return 0;
  if (need > 0x7fffffffu) return fail(s, HLO_ERR_TOO_LARGE, s->p, "table would exceed 2^31 rows");
  uint64_t nc = *cap ? *cap : 64;
  while (nc < need) nc *= 2;
  void *q = realloc(*arr, nc * elsz);
  if (!q) return fail(s, HLO_ERR_NO_MEMORY, s->p, "out of memory");
  *arr = q;
  *cap = nc;
  return 0;
}

/* Start a table at the rows the input will likely need: growing by doubling copies each table once
 * more and touches its pages twice, which cost a quarter of a scan (fresh pages are dear in a VM).
 * Untouched rows cost address space only. A failed reservation is not an error: grow() follows.
 * On Linux a table of 32 MB or more (glibc maps those fresh on every call, above its largest mmap
 * threshold) is 2 MB-aligned and asks for transparent huge pages: a fresh 4 KB page costs a fault
 * (~1 us in this VM), a 2 MB page one fault for 512 of them (a 108 MB dump: 206 -> 169 ms cold).
 * Smaller tables stay 4 KB-paged: the allocator recycles their pages warm, where huge pages would
 * be fresh and zeroed on each scan. Where THP is off the hint does nothing; where it is on, a
 * table holds at most 2 MB it does not use. */
static void reserve(void **arr, uint64_t *cap, uint64_t rows, size_t elsz) {
  if (rows > ((uint64_t)1 << 24)) rows = (uint64_t)1 << 24;
  if (rows <= *cap) return;
  void *q = NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uint64_t huge = (uint64_t)1 << 21;
  if (!*arr && rows * elsz >= ((uint64_t)32 << 20)) {
    uint64_t bytes = (rows * elsz + huge - 1) & ~(huge - 1);
    if (posix_memalign(&q, huge, bytes) == 0) {
      madvise(q, bytes, MADV_HUGEPAGE);
      rows = bytes / elsz;
    } else {
      q = NULL;
    }
  }
#endif
  if (!q) q = realloc(*arr, rows * elsz);
  if (!q) return;
  *arr = q;
  *cap = rows;
}

#define PUSH(s, arr, count, cap, T) \
  ((count) < (cap) || !grow((s), (void **)&(arr), &(cap), (count) + 1, sizeof(T)) ? &(arr)[(count)++] : (T *)NULL)

static hlo_attr *push_attr(S *s) {
  hlo_tables *t = s->t;
  return PUSH(s, t->attrs, t->n_attrs, s->cap_attr, hlo_attr);
}

/* ------------------------------------------------------------ line/column */

/* The scan steps over a newline at q: count it unless a rewind already passed it. The bytes are
 * read once anyway; a memchr a line ahead of the instructions was 6% of gemma3_4b's instructions. */
HLO_INLINE void note_newline(S *s, uint64_t q) {
  if (q >= s->ln_start) {
    s->ln++;
    s->ln_start = q + 1;
  }
}

/* Line and column of off, at or before the furthest offset the scan reached. */
static void line_col(const S *s, uint64_t off, uint32_t *line, uint32_t *col) {
  const uint8_t *b = s->b;
  if (off > s->n) off = s->n;
  uint32_t ln = s->ln;
  uint64_t st = s->ln_start;
  if (off < st) {
    /* newlines after off already counted (rare: a header's line, after a rewind) */
    for (uint64_t p = off; p < s->ln_start; p++)
      if (b[p] == '\n') ln--;
    st = off;
    while (st > 0 && b[st - 1] != '\n') st--;
  }
  *line = ln;
  uint64_t c = off - st + 1;
  *col = c > 0xffffffffu ? 0xffffffffu : (uint32_t)c;
}

/* ------------------------------------------------------------- lexing */

/* Skip whitespace and comments. In one_line mode stop at a newline. */
static int skip_ws_from(S *s) {
  const uint8_t *b = s->b;
  uint64_t p = s->p, n = s->n;
  for (;;) {
    if (s->one_line) {
      while (p < n && (s->cls[b[p]] & C_WS) && b[p] != '\n') p++;
    } else {
      for (; p < n && (s->cls[b[p]] & C_WS); p++)
        if (b[p] == '\n') note_newline(s, p);
    }
    if (p + 1 < n && b[p] == '/') {
      if (b[p + 1] == '*') {
        uint64_t q = p + 2;
        for (;;) {
          if (q + 1 >= n) {
            s->p = p;
            return fail(s, HLO_ERR_UNTERMINATED, p, "unterminated /* comment");
          }
          if (s->one_line && b[q] == '\n') {
            s->p = p;
            return fail(s, HLO_ERR_SYNTAX, p, "comment crosses a line in a header");
          }
          if (b[q] == '*' && b[q + 1] == '/') break;
          if (b[q] == '\n') note_newline(s, q);
          q++;
        }
        p = q + 2;
        continue;
      }
      if (b[p + 1] == '/') {
        const uint8_t *q = memchr(b + p, '\n', n - p);
        p = q ? (uint64_t)(q - b) : n;
        if (s->one_line) break;
        continue;
      }
    }
    break;
  }
  s->p = p;
  return 0;
}

/* Most tokens are followed by a name, punctuation, or one space or a line's end and indentation
 * before a name: answer those without the loop. */
HLO_INLINE int skip_ws(S *s) {
  uint64_t p = s->p;
  if (p < s->n && s->b[p] == ' ') {
    p++;
  } else if (p < s->n && s->b[p] == '\n' && !s->one_line) { /* a line's end, the next one's indentation */
    note_newline(s, p);
    p++;
    while (p < s->n && s->b[p] == ' ') p++;
  }
  if (p < s->n && !(s->cls[s->b[p]] & C_SKIP)) {
    s->p = p;
    return 0;
  }
  return skip_ws_from(s);
}

/* First offset >= p (p <= n) that is not a name byte [A-Za-z0-9_.-]; n if none. */
HLO_INLINE uint64_t name_end(const S *s, uint64_t p) {
  const uint8_t *b = s->b;
  uint64_t n = s->n;
#ifdef HLO_SSE2
  /* v in [lo, hi] <=> v + (128 - lo) < -128 + (hi - lo + 1), as signed bytes */
#define HLO_IN_RANGE(v, lo, hi) \
  _mm_cmplt_epi8(_mm_add_epi8((v), _mm_set1_epi8((char)(0x80 - (lo)))), _mm_set1_epi8((char)(-128 + (hi) - (lo) + 1)))
  const __m128i slash = _mm_set1_epi8('/'), underscore = _mm_set1_epi8('_'), bit5 = _mm_set1_epi8(0x20);
  while (p < n && n - p >= 16) {
    __m128i v = _mm_loadu_si128((const __m128i *)(b + p));
    __m128i digit = _mm_andnot_si128(_mm_cmpeq_epi8(v, slash), HLO_IN_RANGE(v, '-', '9')); /* - . 0-9 */
    __m128i letter = HLO_IN_RANGE(_mm_or_si128(v, bit5), 'a', 'z');
    __m128i name = _mm_or_si128(_mm_or_si128(digit, letter), _mm_cmpeq_epi8(v, underscore));
    unsigned m = (unsigned)_mm_movemask_epi8(name) ^ 0xffffu;
    if (m) return p + first_bit(m);
    p += 16;
  }
#undef HLO_IN_RANGE
#endif
  while (p < n && (s->cls[b[p]] & C_NAME)) p++;
  return p;
}

/* Name: [%]?[A-Za-z0-9_.-]*; returns span without '%'. *pct set if '%' seen. */
HLO_INLINE hlo_span read_name(S *s, int *pct) {
  const uint8_t *b = s->b;
  uint64_t p = s->p, n = s->n;
  int had = 0;
  if (p < n && b[p] == '%') {
    p++;
    had = 1;
  }
  uint64_t st = p;
  p = name_end(s, p);
  if (pct) *pct = had;
  hlo_span sp = {st, p - st};
  if (p == st) p = s->p; /* nothing read: do not consume a lone '%' */
  s->p = p;
  return sp;
}

HLO_INLINE int is_word(S *s, const char *w, size_t wl) {
  uint64_t p = s->p;
  if (s->n - p < wl || memcmp(s->b + p, w, wl) != 0) return 0;
  return p + wl == s->n || !(s->cls[s->b[p + wl]] & C_NAME);
}

/* First offset >= p (p <= n) holding '"', '\\' or a newline; n if none. */
HLO_INLINE uint64_t find_string_special(const S *s, uint64_t p) {
  const uint8_t *b = s->b;
  uint64_t n = s->n;
#ifdef HLO_SSE2
  const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), newline = _mm_set1_epi8('\n');
  while (p < n && n - p >= 16) {
    __m128i v = _mm_loadu_si128((const __m128i *)(b + p));
    __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                               _mm_cmpeq_epi8(v, newline));
    unsigned m = (unsigned)_mm_movemask_epi8(hit);
    if (m) return p + first_bit(m);
    p += 16;
  }
#endif
  while (p < n && !(s->cls[b[p]] & C_STR)) p++;
  return p;
}

#ifdef HLO_SSE2
/* Bit i set: q[i] is one of ()[]{}"/ or a newline (C_GRP). */
HLO_INLINE unsigned group_mask(const uint8_t *q) {
  /* '(' ')' differ in bit 0; '[' '{' and ']' '}' in bit 5 */
  const __m128i v = _mm_loadu_si128((const __m128i *)q);
  const __m128i v5 = _mm_or_si128(v, _mm_set1_epi8(0x20));
  __m128i hit = _mm_or_si128(
      _mm_or_si128(_mm_cmpeq_epi8(_mm_or_si128(v, _mm_set1_epi8(1)), _mm_set1_epi8(')')),
                   _mm_or_si128(_mm_cmpeq_epi8(v5, _mm_set1_epi8('{')), _mm_cmpeq_epi8(v5, _mm_set1_epi8('}')))),
      _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                   _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('/')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\n')))));
  return (unsigned)_mm_movemask_epi8(hit);
}
#endif

/* First offset >= p (p <= n) holding one of ()[]{}"/ or a newline (C_GRP); n if none. */
HLO_INLINE uint64_t find_group_special(const S *s, uint64_t p) {
  const uint8_t *b = s->b;
  uint64_t n = s->n;
#ifdef HLO_SSE2
  while (p < n && n - p >= 16) {
    unsigned m = group_mask(b + p);
    if (m) return p + first_bit(m);
    p += 16;
  }
#endif
  while (p < n && !(s->cls[b[p]] & C_GRP)) p++;
  return p;
}

/* At '"': skip the string including the closing quote. */
HLO_INLINE int skip_string(S *s, uint64_t *pp) {
  const uint8_t *b = s->b;
  uint64_t p = *pp + 1, n = s->n;
  for (;;) {
    p = find_string_special(s, p);
    if (p >= n) return fail(s, HLO_ERR_UNTERMINATED, *pp, "unterminated string");
    uint8_t c = b[p];
    if (c == '"') {
      *pp = p + 1;
      return 0;
    }
    if (c == '\\') {
      p += 2;
      if (p > n) return fail(s, HLO_ERR_UNTERMINATED, *pp, "unterminated string");
      if (b[p - 1] == '\n') note_newline(s, p - 1);
      continue;
    }
    /* newline */
    if (s->one_line) return fail(s, HLO_ERR_SYNTAX, p, "string crosses a line in a header");
    note_newline(s, p);
    p++;
  }
}

HLO_INLINE uint8_t closer_of(uint8_t c) { return c == '(' ? ')' : c == '[' ? ']' : '}'; }

/* At an opener ( [ {, the first special byte after it at `first`: skip to after its matching
 * closer. The special bytes of a 16-byte block are taken from one mask, bit by bit, while only
 * brackets and newlines move p (tuple shapes hold a bracket every few bytes); a string or a comment
 * moves p past the block's mask and a new one is loaded where it ends. */
static int scan_nested_group(S *s, uint64_t first) {
  const uint8_t *b = s->b;
  uint64_t p = first, n = s->n, start = s->p;
  uint64_t depth = 1;
  uint8_t *st = s->bstack;
  st[0] = closer_of(b[start]);
  unsigned m = 0;        /* specials of the block at `base` not yet taken */
  uint64_t base = 0, mask_end = 0; /* bytes in [p, mask_end) outside m are plain */
  for (;;) {
#ifdef HLO_SSE2
    while (!m && p < n && n - p >= 16) {
      m = group_mask(b + p);
      base = p;
      mask_end = p + 16;
      if (!m) p += 16;
    }
    if (m) {
      p = base + first_bit(m);
      m &= m - 1;
    } else
#endif
      p = find_group_special(s, p);
    if (p >= n) {
      s->p = p;
      return fail(s, HLO_ERR_UNTERMINATED, start, "unbalanced bracket: no matching closing bracket before end of input");
    }
    uint8_t c = b[p];
    switch (c) {
      case '(':
      case '[':
      case '{':
        if (depth >= HLO_MAX_DEPTH) return fail(s, HLO_ERR_TOO_DEEP, p, "brackets nested too deeply");
        st[depth++] = closer_of(c);
        p++;
        break;
      case ')':
      case ']':
      case '}':
        if (depth == 0 || st[depth - 1] != c) {
          s->p = p;
          return fail(s, HLO_ERR_SYNTAX, p, "mismatched closing bracket");
        }
        depth--;
        p++;
        if (depth == 0) {
          s->p = p;
          return 0;
        }
        break;
      case '"': {
        int rc = skip_string(s, &p);
        if (rc) return rc;
        m = 0;
        mask_end = 0;
        break;
      }
      case '/': {
        if (p + 1 < n && (b[p + 1] == '*' || b[p + 1] == '/')) {
          s->p = p;
          int rc = skip_ws(s);
          if (rc) return rc;
          if (s->p == p) p++; /* one_line stop */
          else p = s->p;
          m = 0;
          mask_end = 0;
        } else {
          p++;
        }
        break;
      }
      default: /* '\n' */
        if (s->one_line) return fail(s, HLO_ERR_SYNTAX, p, "bracket crosses a line in a header");
        note_newline(s, p);
        p++;
        break;
    }
#ifdef HLO_SSE2
    if (!m && p < mask_end) p = mask_end;
#endif
  }
}

/* Most groups are flat (dims, layouts, operand lists of shapes): the first special byte after the
 * opener is its closer, often the next byte (a scalar's `[]`). The others take the bracket stack. */
HLO_INLINE int scan_group(S *s) {
  uint8_t closer = closer_of(s->b[s->p]);
  if (s->p + 1 < s->n && s->b[s->p + 1] == closer) {
    s->p += 2;
    return 0;
  }
  uint64_t q = find_group_special(s, s->p + 1);
  if (q < s->n && s->b[q] == closer) {
    s->p = q + 1;
    return 0;
  }
  return scan_nested_group(s, q);
}

/* Attribute value: maximal run without top-level whitespace or ','; groups
 * and strings nest; an unmatched closer or a comment ends it. */
static int scan_value(S *s, hlo_span *out) {
  const uint8_t *b = s->b;
  uint64_t p = s->p, n = s->n, st = s->p;
  for (;;) {
    while (p < n && !(s->cls[b[p]] & C_VAL)) p++;
    if (p >= n) break;
    uint8_t c = b[p];
    if (c == '(' || c == '[' || c == '{') {
      s->p = p;
      int rc = scan_group(s);
      if (rc) return rc;
      p = s->p;
    } else if (c == '"') {
      int rc = skip_string(s, &p);
      if (rc) return rc;
    } else if (c == '/' && !(p + 1 < n && (b[p + 1] == '*' || b[p + 1] == '/'))) {
      p++;
    } else {
      break; /* ws , ) ] } or comment */
    }
  }
  s->p = p;
  out->off = st;
  out->len = p - st;
  if (p == st) return fail(s, HLO_ERR_SYNTAX, p, "expected attribute value");
  return 0;
}

/* (',' key '=' value)*  -- appends rows, returns begin/count */
/* Two attribute values of instructions contain a top-level space:
 *   replica_groups=mesh['a'=2,'b'=2] {'b'}   (a ']' value, spaces, a braced group)
 *   literal=s32[2]{0} {1, 2}                 (key `literal`: shape, spaces, value)
 * Extend the value over such a continuation on the same line. A mesh value may also carry its
 * device order before the group, after a top-level comma (transposed meshes):
 *   replica_groups=mesh['a'=2,'b'=4], device_ids=([2,4]T(1,0)) {'b'} */
static int value_continuation(S *s, hlo_span key, hlo_span *val) {
  const uint8_t *b = s->b;
  if (val->len == 0) return 0;
  uint8_t last = b[val->off + val->len - 1];
  int literal = key.len == 7 && memcmp(b + key.off, "literal", 7) == 0;
  static const char device_ids[] = "device_ids=";
  if (last == ']' && val->len > 5 && memcmp(b + val->off, "mesh[", 5) == 0 && s->p < s->n && b[s->p] == ',') {
    uint64_t d = s->p + 1;
    while (d < s->n && (b[d] == ' ' || b[d] == '\t')) d++;
    if (d + sizeof device_ids - 1 < s->n && memcmp(b + d, device_ids, sizeof device_ids - 1) == 0) {
      s->p = d + sizeof device_ids - 1;
      hlo_span ids;
      int rc = scan_value(s, &ids);
      if (rc) return rc;
      val->len = s->p - val->off;
      last = ']';      /* the braced group of mesh axes follows, as without device_ids */
    }
  }
  uint64_t q = s->p;
  while (q < s->n && (b[q] == ' ' || b[q] == '\t')) q++;
  if (q == s->p || q >= s->n) return 0;
  if (last == ']' && b[q] == '{') {
    s->p = q;
    int rc = scan_group(s);
    if (rc) return rc;
  } else if (literal && (last == ']' || last == '}') && !(s->cls[b[q]] & C_VAL)) {
    s->p = q;
    hlo_span v2;
    int rc = scan_value(s, &v2);
    if (rc) return rc;
  } else if (literal && (last == ']' || last == '}') && (b[q] == '{' || b[q] == '(')) {
    s->p = q;
    int rc = scan_group(s);
    if (rc) return rc;
  } else {
    return 0;
  }
  val->len = s->p - val->off;
  return 0;
}

static int parse_attrs(S *s, uint32_t *begin, uint32_t *count, int instr) {
  const uint8_t *b = s->b;
  *begin = (uint32_t)s->t->n_attrs;
  for (;;) {
    uint64_t save = s->p;
    int rc = skip_ws(s);
    if (rc) return rc;
    if (s->p >= s->n || b[s->p] != ',') {
      if (!instr) s->p = save; /* spans end at the last attribute; an instruction's next one skips less */
      break;
    }
    s->p++;
    if ((rc = skip_ws(s))) return rc;
    /* A ',' that ends the list by mistake (a dangling comma) is followed by the next instruction or the
     * closing brace: report at that token, as XLA's parser does ("expects attribute name"). */
    uint64_t key_at = s->p;
    int pct = 0;
    hlo_span key = read_name(s, &pct);
    if (key.len == 0 || pct) return fail(s, HLO_ERR_SYNTAX, key_at, "expected attribute name after ','");
    if ((rc = skip_ws(s))) return rc;
    if (s->p >= s->n || b[s->p] != '=') {
      int newline = 0;     /* the name is on a later line than the ',': the ',' dangles */
      for (uint64_t q = key_at; q > 0 && b[q - 1] != ','; q--) newline |= b[q - 1] == '\n';
      return fail(s, HLO_ERR_SYNTAX, key_at,
                  newline ? "expected attribute name after ','" : "expected '=' after this attribute name");
    }
    s->p++;
    if ((rc = skip_ws(s))) return rc;
    hlo_span val;
    if ((rc = scan_value(s, &val))) return rc;
    if (instr && (rc = value_continuation(s, key, &val))) return rc;
    hlo_attr *a = push_attr(s);
    if (!a) return s->err;
    a->key = key;
    a->value = val;
  }
  *count = (uint32_t)(s->t->n_attrs - *begin);
  return 0;
}

/* Buffer shape `b(f32[2,4])`: at a name token `b` followed by '('. */
static int is_buffer_shape(S *s, hlo_span tok, int pct) {
  return !pct && tok.len == 1 && s->b[tok.off] == 'b' && s->p < s->n && s->b[s->p] == '(';
}

/* After a shape's element type (from st), at '[': the dimensions and an optional layout. */
static int scan_dims(S *s, uint64_t st, hlo_span *out) {
  int rc;
  if ((rc = scan_group(s))) return rc;
  if (s->p < s->n && s->b[s->p] == '{')
    if ((rc = scan_group(s))) return rc;
  out->off = st;
  out->len = s->p - st;
  return 0;
}

/* shape := '(' ... ')' | 'b(' ... ')' | type '[' ... ']' ['{' ... '}'] */
static int scan_shape(S *s, hlo_span *out) {
  const uint8_t *b = s->b;
  uint64_t st = s->p;
  int rc;
  if (st + 1 < s->n && b[st] == 'b' && b[st + 1] == '(') {
    s->p++;
    if ((rc = scan_group(s))) return rc;
  } else if (st < s->n && b[st] == '(') {
    if ((rc = scan_group(s))) return rc;
  } else {
    hlo_span ty = read_name(s, NULL);
    if (ty.len == 0 || s->p >= s->n || b[s->p] != '[' || b[st] == '%')
      return fail(s, HLO_ERR_SYNTAX, st, "expected shape");
    return scan_dims(s, st, out);
  }
  out->off = st;
  out->len = s->p - st;
  return 0;
}

/* ------------------------------------------------------------ name table */

static void h_new_generation(S *s) {
  s->gen++;
  if (s->gen == 0xffffffffu) {
    for (uint64_t i = 0; i < s->h_cap; i++) s->h[i].gen = 0;
    s->gen = 1;
  }
  s->h_count = 0;
}

static int h_grow(S *s) {
  uint64_t nc = s->h_cap ? s->h_cap * 2 : 1024;
  struct h_slot *h = calloc(nc, sizeof *h);
  if (!h) return fail(s, HLO_ERR_NO_MEMORY, s->p, "out of memory");
  for (uint64_t i = 0; i < s->h_cap; i++) {
    if (s->h[i].gen != s->gen) continue;
    uint64_t j = s->h[i].hash & (nc - 1);
    while (h[j].gen == s->gen) j = (j + 1) & (nc - 1);
    h[j] = s->h[i];
  }
  free(s->h);
  s->h = h;
  s->h_cap = nc;
  return 0;
}

/* The slot holding `name` (hash h), else the empty slot where it would go; NULL before any insert. */
static struct h_slot *h_probe(S *s, hlo_span name, uint32_t h) {
  if (!s->h_cap) return NULL;
  uint64_t m = s->h_cap - 1, j = h & m;
  const hlo_instr *ins = s->t->instrs;
  for (; s->h[j].gen == s->gen; j = (j + 1) & m) {
    if (s->h[j].hash != h) continue;
    const hlo_instr *r = &ins[s->h[j].row];
    if (r->name.len == name.len && same_bytes(s->b + r->name.off, s->b + name.off, name.len)) break;
  }
  return &s->h[j];
}

static int64_t h_find(S *s, hlo_span name, uint32_t h) {
  struct h_slot *e = h_probe(s, name, h);
  return e && e->gen == s->gen ? (int64_t)e->row : -1;
}

static int h_insert(S *s, uint32_t row) {
  hlo_span name = s->t->instrs[row].name;
  uint32_t h = hash_bytes(s->b + name.off, name.len);
  if ((s->h_count + 1) * 2 > s->h_cap) {
    int rc = h_grow(s);
    if (rc) return rc;
  }
  struct h_slot *e = h_probe(s, name, h);
  if (e->gen == s->gen) return fail(s, HLO_ERR_DUPLICATE, name.off, "duplicate instruction name in computation");
  e->gen = s->gen;
  e->hash = h;
  e->row = row;
  s->h_count++;
  return 0;
}

/* ------------------------------------------------------------ instructions */

static int parse_instr_rest(S *s, int32_t comp, int depth, uint32_t flags, uint64_t start, hlo_span name,
                            int32_t *out_row);

/* One operand at s->p; pushes one row on the scratch stack. */
static int parse_operand(S *s, int32_t comp, int depth) {
  const uint8_t *b = s->b;
  int rc, pct = 0;
  uint64_t st = s->p;
  hlo_span shape = {st, 0};
  hlo_span tok;
  if (st < s->n && b[st] == '(') {
    if ((rc = scan_group(s))) return rc;
    shape.len = s->p - st;
    if ((rc = skip_ws(s))) return rc;
    tok = read_name(s, &pct);
  } else {
    tok = read_name(s, &pct);
    int dims = tok.len && !pct && s->p < s->n && b[s->p] == '[';
    if (dims || is_buffer_shape(s, tok, pct)) {
      if (!dims) s->p = st;
      if ((rc = dims ? scan_dims(s, st, &shape) : scan_shape(s, &shape))) return rc;
      if ((rc = skip_ws(s))) return rc;
      tok = read_name(s, &pct);
    }
  }
  if (tok.len == 0) return fail(s, HLO_ERR_SYNTAX, s->p, "expected operand name");
  uint64_t after = s->p;
  if ((rc = skip_ws(s))) return rc;
  hlo_operand op;
  if (!pct && s->p < s->n && b[s->p] == '(') {
    /* nested instruction: tok is its opcode */
    if (depth + 1 > HLO_MAX_NESTED) return fail(s, HLO_ERR_TOO_DEEP, tok.off, "nested operand instructions too deep");
    uint32_t fl = HLO_INSTR_ANONYMOUS | (shape.len ? 0 : HLO_INSTR_NO_SHAPE);
    hlo_span nm = {st, 0};
    s->p = st;
    int32_t row;
    if ((rc = parse_instr_rest(s, comp, depth + 1, fl, st, nm, &row))) return rc;
    op.name = nm;
    op.shape = shape;
    op.target = row;
  } else {
    s->p = after;
    op.name = tok;
    op.shape = shape;
    op.target = -1;
  }
  op.pad_ = 0;
  hlo_operand *o = PUSH(s, s->scratch, s->n_scratch, s->cap_scratch, hlo_operand);
  if (!o) return s->err;
  *o = op;
  return 0;
}

/* At the shape-or-opcode position of an instruction (after '=' for named
 * ones, at the operand start for nested ones). Appends the row. */
static int parse_instr_rest(S *s, int32_t comp, int depth, uint32_t flags, uint64_t start, hlo_span name,
                            int32_t *out_row) {
  const uint8_t *b = s->b;
  hlo_tables *t = s->t;
  int rc;
  uint32_t line, col;
  line_col(s, start, &line, &col);
  uint64_t st = s->p;
  hlo_span shape = {st, 0}, opcode;
  if (st < s->n && b[st] == '(') {
    if ((rc = scan_group(s))) return rc;
    shape.len = s->p - st;
    if ((rc = skip_ws(s))) return rc;
    opcode = read_name(s, NULL);
  } else {
    int pct;
    opcode = read_name(s, &pct);
    int dims = opcode.len && !pct && s->p < s->n && b[s->p] == '[';
    if (dims || is_buffer_shape(s, opcode, pct)) {
      if (!dims) s->p = st;
      if ((rc = dims ? scan_dims(s, st, &shape) : scan_shape(s, &shape))) return rc;
      if ((rc = skip_ws(s))) return rc;
      opcode = read_name(s, NULL);
    } else if (!(flags & HLO_INSTR_ANONYMOUS)) {
      flags |= HLO_INSTR_NO_SHAPE;
    }
  }
  if (opcode.len == 0) return fail(s, HLO_ERR_SYNTAX, s->p, shape.len ? "expected opcode after shape" : "expected shape or opcode");
  if ((rc = skip_ws(s))) return rc;
  if (s->p >= s->n || b[s->p] != '(') return fail(s, HLO_ERR_SYNTAX, s->p, "expected '(' after opcode");
  hlo_span args;
  uint64_t op_begin = t->n_operands, op_count = 0;
  int raw = (opcode.len == 8 && memcmp(b + opcode.off, "constant", 8) == 0) ||
            (opcode.len == 9 && memcmp(b + opcode.off, "parameter", 9) == 0);
  uint64_t open = s->p;
  if (raw) {
    if ((rc = scan_group(s))) return rc;
    args.off = open + 1;
    args.len = s->p - open - 2;
  } else {
    uint64_t sbase = s->n_scratch;
    s->p++;
    if ((rc = skip_ws(s))) return rc;
    if (s->p < s->n && b[s->p] == ')') {
      s->p++;
    } else {
      for (;;) {
        if ((rc = parse_operand(s, comp, depth))) return rc;
        if ((rc = skip_ws(s))) return rc;
        if (s->p >= s->n) return fail(s, HLO_ERR_UNTERMINATED, open, "operand list not closed before end of input");
        if (b[s->p] == ',') {
          s->p++;
          if ((rc = skip_ws(s))) return rc;
          continue;
        }
        if (b[s->p] == ')') {
          s->p++;
          break;
        }
        return fail(s, HLO_ERR_SYNTAX, s->p, "expected ',' or ')' after operand");
      }
    }
    args.off = open + 1;
    args.len = s->p - open - 2;
    op_count = s->n_scratch - sbase;
    op_begin = t->n_operands;
    if (op_count) {
      if (t->n_operands + op_count > s->cap_op &&
          (rc = grow(s, (void **)&t->operands, &s->cap_op, t->n_operands + op_count, sizeof(hlo_operand))))
        return rc;
      for (uint64_t i = 0; i < op_count; i++) t->operands[t->n_operands + i] = s->scratch[sbase + i];
      t->n_operands += op_count;
    }
    s->n_scratch = sbase;
  }
  uint32_t abeg = (uint32_t)t->n_attrs, acnt = 0;
  if (depth == 0)
    if ((rc = parse_attrs(s, &abeg, &acnt, 1))) return rc;
  hlo_instr *ins = PUSH(s, t->instrs, t->n_instrs, s->cap_instr, hlo_instr);
  if (!ins) return s->err;
  ins->name = name;
  ins->shape = shape;
  ins->opcode = opcode;
  ins->args = args;
  ins->operand_begin = (uint32_t)op_begin;
  ins->operand_count = (uint32_t)op_count;
  ins->attr_begin = abeg;
  ins->attr_count = acnt;
  ins->line = line;
  ins->column = col;
  ins->flags = flags;
  ins->computation = comp;
  int32_t row = (int32_t)(t->n_instrs - 1);
  if (name.len)
    if ((rc = h_insert(s, (uint32_t)row))) return rc;
  *out_row = row;
  return 0;
}

static int parse_instr(S *s, int32_t comp, int32_t *out_row) {
  const uint8_t *b = s->b;
  uint64_t start = s->p;
  uint32_t flags = 0;
  int rc;
  if (is_word(s, "ROOT", 4)) {
    flags |= HLO_INSTR_ROOT;
    s->p += 4;
    if ((rc = skip_ws(s))) return rc;
  }
  uint64_t name_at = s->p;
  int pct = 0;
  hlo_span name = read_name(s, &pct);
  if (name.len == 0) return fail(s, HLO_ERR_SYNTAX, s->p, "expected instruction name or '}'");
  /* XLA's lexer reads `name=` (no '%', no space) as an attribute name, never an instruction's: here it is an
   * attribute after one whose ',' is missing */
  if (!pct && s->p < s->n && b[s->p] == '=')
    return fail(s, HLO_ERR_SYNTAX, name_at, "expected instruction name, not an attribute (a ',' missing before it?)");
  if ((rc = skip_ws(s))) return rc;
  if (s->p >= s->n || b[s->p] != '=') return fail(s, HLO_ERR_SYNTAX, s->p, "expected '=' after instruction name");
  s->p++;
  if ((rc = skip_ws(s))) return rc;
  return parse_instr_rest(s, comp, 0, flags, start, name, out_row);
}

/* ------------------------------------------------------------ computations */

typedef struct {
  uint64_t start;
  hlo_span name, sig;
  uint32_t flags, abeg, acnt;
} comp_header;

/* Parses up to and including '{'. */
static int parse_comp_header(S *s, comp_header *h) {
  const uint8_t *b = s->b;
  int rc;
  h->start = s->p;
  h->flags = 0;
  if (is_word(s, "ENTRY", 5)) {
    h->flags |= HLO_COMP_ENTRY;
    s->p += 5;
    if ((rc = skip_ws(s))) return rc;
  }
  h->name = read_name(s, NULL);
  if (h->name.len == 0) return fail(s, HLO_ERR_SYNTAX, s->p, "expected computation name");
  if ((rc = skip_ws(s))) return rc;
  h->sig.off = s->p;
  h->sig.len = 0;
  if (s->p < s->n && b[s->p] == '(') {
    if ((rc = scan_group(s))) return rc;
    if ((rc = skip_ws(s))) return rc;
    if (s->p + 1 >= s->n || b[s->p] != '-' || b[s->p + 1] != '>')
      return fail(s, HLO_ERR_SYNTAX, s->p, "expected '->' after computation parameters");
    s->p += 2;
    if ((rc = skip_ws(s))) return rc;
    hlo_span rs;
    if ((rc = scan_shape(s, &rs))) return rc;
    h->sig.len = s->p - h->sig.off;
  }
  if ((rc = parse_attrs(s, &h->abeg, &h->acnt, 0))) return rc;
  if ((rc = skip_ws(s))) return rc;
  if (s->p >= s->n || b[s->p] != '{') return fail(s, HLO_ERR_SYNTAX, s->p, "expected '{' to open computation body");
  s->p++;
  return 0;
}

static int parse_comp_body(S *s, const comp_header *h, int32_t module) {
  hlo_tables *t = s->t;
  const uint8_t *b = s->b;
  int rc;
  hlo_comp *c = PUSH(s, t->comps, t->n_comps, s->cap_comp, hlo_comp);
  if (!c) return s->err;
  int32_t ci = (int32_t)(t->n_comps - 1);
  uint32_t line, col;
  line_col(s, h->start, &line, &col);
  memset(c, 0, sizeof *c);
  c->name = h->name;
  c->signature = h->sig;
  c->instr_begin = (uint32_t)t->n_instrs;
  c->attr_begin = h->abeg;
  c->attr_count = h->acnt;
  c->line = line;
  c->flags = h->flags;
  c->module = module;
  uint64_t op_begin = t->n_operands;
  h_new_generation(s);
  int32_t root = -1;
  for (;;) {
    if ((rc = skip_ws(s))) return rc;
    if (s->p >= s->n) return fail(s, HLO_ERR_UNTERMINATED, s->p, "expected '}' to close computation before end of input");
    if (b[s->p] == '}') {
      s->p++;
      break;
    }
    int32_t row;
    if ((rc = parse_instr(s, ci, &row))) return rc;
    if (root < 0 && (t->instrs[row].flags & HLO_INSTR_ROOT)) root = row;
  }
  /* attributes after the closing brace: `} , execution_thread="x"` */
  uint32_t tb, tc;
  if ((rc = parse_attrs(s, &tb, &tc, 0))) return rc;
  if (tc && h->acnt) { /* keep the computation's attribute rows contiguous */
    if ((rc = grow(s, (void **)&t->attrs, &s->cap_attr, t->n_attrs + h->acnt, sizeof(hlo_attr)))) return rc;
    memmove(t->attrs + tb + h->acnt, t->attrs + tb, tc * sizeof(hlo_attr));
    memcpy(t->attrs + tb, t->attrs + h->abeg, h->acnt * sizeof(hlo_attr));
    t->n_attrs += h->acnt;
    t->comps[ci].attr_begin = tb;
    t->comps[ci].attr_count = h->acnt + tc;
  } else if (tc) {
    t->comps[ci].attr_begin = tb;
    t->comps[ci].attr_count = tc;
  }
  c = &t->comps[ci];
  c->instr_count = (uint32_t)(t->n_instrs - c->instr_begin);
  if (root < 0 && c->instr_count) root = (int32_t)(t->n_instrs - 1);
  c->root = root;
  /* resolve operand names (any order within the computation) */
  for (uint64_t i = op_begin; i < t->n_operands; i++) {
    hlo_operand *o = &t->operands[i];
    if (o->target >= 0 || o->name.len == 0) continue;
    int64_t r = h_find(s, o->name, hash_bytes(b + o->name.off, o->name.len));
    o->target = (int32_t)r;
  }
  return 0;
}

/* ------------------------------------------------------------ modules */

typedef struct {
  int32_t idx; /* -1: no open module */
  uint64_t last_end;
} mod_state;

static int open_module(S *s, mod_state *m, uint64_t start, uint32_t flags, hlo_span name) {
  hlo_tables *t = s->t;
  hlo_module *md = PUSH(s, t->modules, t->n_modules, s->cap_mod, hlo_module);
  if (!md) return s->err;
  memset(md, 0, sizeof *md);
  uint32_t line, col;
  line_col(s, start, &line, &col);
  md->name = name;
  md->text.off = start;
  md->preamble.off = start;
  md->attr_begin = (uint32_t)t->n_attrs;
  md->comp_begin = (uint32_t)t->n_comps;
  md->line = line;
  md->flags = flags;
  md->entry = -1;
  m->idx = (int32_t)(t->n_modules - 1);
  m->last_end = start;
  return 0;
}

static void close_module(S *s, mod_state *m) {
  if (m->idx < 0) return;
  hlo_tables *t = s->t;
  hlo_module *md = &t->modules[m->idx];
  md->text.len = m->last_end - md->text.off;
  md->comp_count = (uint32_t)(t->n_comps - md->comp_begin);
  int32_t entry = -1;
  for (uint32_t i = md->comp_begin; i < md->comp_begin + md->comp_count; i++)
    if (t->comps[i].flags & HLO_COMP_ENTRY) {
      entry = (int32_t)i;
      break;
    }
  if (entry < 0 && md->comp_count) entry = (int32_t)(md->comp_begin + md->comp_count - 1);
  md->entry = entry;
  m->idx = -1;
}

static int is_preamble_word(S *s, size_t *wl) {
  static const char *const words[] = {"FileNames", "FunctionNames", "FileLocations", "StackFrames"};
  for (int i = 0; i < 4; i++) {
    size_t l = strlen(words[i]);
    if (is_word(s, words[i], l)) {
      *wl = l;
      return 1;
    }
  }
  return 0;
}

/* Stack-frame tables after the header; recorded as one span. */
static int parse_preamble(S *s, hlo_span *out) {
  const uint8_t *b = s->b;
  int rc;
  uint64_t pst = 0, pend = 0;
  int any = 0;
  for (;;) {
    uint64_t save = s->p;
    if ((rc = skip_ws(s))) return rc;
    size_t wl;
    if (!is_preamble_word(s, &wl)) {
      s->p = save;
      break;
    }
    if (!any) pst = s->p;
    any = 1;
    s->p += wl;
    pend = s->p;
    for (;;) {
      uint64_t rs = s->p;
      if ((rc = skip_ws(s))) return rc;
      if (s->p >= s->n || !(s->cls[b[s->p]] & C_DIGIT)) {
        s->p = rs;
        break;
      }
      while (s->p < s->n && (s->cls[b[s->p]] & C_DIGIT)) s->p++;
      while (s->p < s->n && (b[s->p] == ' ' || b[s->p] == '\t')) s->p++;
      hlo_span v;
      if ((rc = scan_value(s, &v))) return rc;
      pend = s->p;
    }
  }
  out->off = any ? pst : s->p;
  out->len = any ? pend - pst : 0;
  return 0;
}

static int parse_module_header(S *s, mod_state *m) {
  int rc;
  uint64_t start = s->p;
  s->p += 9; /* HloModule */
  if ((rc = skip_ws(s))) return rc;
  hlo_span name = read_name(s, NULL);
  if (name.len == 0) return fail(s, HLO_ERR_SYNTAX, s->p, "expected module name after 'HloModule'");
  if (s->p < s->n && s->b[s->p] == ':') s->p++; /* `HloModule name:` (old dumps) */
  uint32_t abeg, acnt;
  uint64_t attr_mark = s->t->n_attrs;
  if ((rc = parse_attrs(s, &abeg, &acnt, 0))) return rc;
  (void)attr_mark;
  uint64_t hdr_end = s->p;
  if ((rc = open_module(s, m, start, HLO_MODULE_HEADER, name))) return rc;
  hlo_module *md = &s->t->modules[m->idx];
  md->attr_begin = abeg;
  md->attr_count = acnt;
  m->last_end = hdr_end;
  return 0;
}

static int skip_line(S *s) {
  const uint8_t *q = memchr(s->b + s->p, '\n', s->n - s->p);
  if (q) note_newline(s, (uint64_t)(q - s->b));
  s->p = q ? (uint64_t)(q - s->b) + 1 : s->n;
  return 0;
}

/* Top-level whitespace/comment skip; returns 1 in *sep at a `// -----` line. */
static int skip_top(S *s, int *sep) {
  const uint8_t *b = s->b;
  uint64_t n = s->n;
  *sep = 0;
  for (;;) {
    for (; s->p < n && (s->cls[b[s->p]] & C_WS); s->p++)
      if (b[s->p] == '\n') note_newline(s, s->p);
    uint64_t p = s->p;
    if (p + 1 < n && b[p] == '/' && b[p + 1] == '/') {
      if ((p == 0 || b[p - 1] == '\n') && n - p >= 8 && memcmp(b + p, "// -----", 8) == 0) {
        uint64_t q = p + 8;
        if (q < n && b[q] == '\r') q++;
        if (q >= n || b[q] == '\n') {
          s->p = q;
          *sep = 1;
          return 0;
        }
      }
      skip_line(s);
      continue;
    }
    if (p + 1 < n && b[p] == '/' && b[p + 1] == '*') {
      int rc = skip_ws(s);
      if (rc) return rc;
      continue;
    }
    return 0;
  }
}

static int scan_file(S *s) {
  hlo_tables *t = s->t;
  mod_state m = {-1, 0};
  int rc, sep;
  for (;;) {
    if ((rc = skip_top(s, &sep))) return rc;
    if (sep) {
      close_module(s, &m);
      continue;
    }
    if (s->p >= s->n) break;
    uint64_t start = s->p;
    uint64_t n_attrs0 = t->n_attrs, n_mods0 = t->n_modules;
    s->one_line = s->junk;
    if (is_word(s, "HloModule", 9)) {
      close_module(s, &m);
      rc = parse_module_header(s, &m);
      s->one_line = 0;
      if (!rc) {
        hlo_span pre;
        if ((rc = parse_preamble(s, &pre))) return rc;
        t->modules[m.idx].preamble = pre;
        if (pre.len) m.last_end = pre.off + pre.len;
        continue;
      }
    } else {
      comp_header h;
      rc = parse_comp_header(s, &h);
      s->one_line = 0;
      if (!rc) {
        if (m.idx < 0)
          if ((rc = open_module(s, &m, h.start, 0, (hlo_span){h.start, 0}))) return rc;
        if ((rc = parse_comp_body(s, &h, m.idx))) return rc;
        m.last_end = s->p;
        continue;
      }
    }
    /* header failed */
    if (!s->junk || s->err == HLO_ERR_NO_MEMORY || s->err == HLO_ERR_TOO_LARGE) {
      if (!s->junk && s->err == HLO_ERR_SYNTAX && s->err_off == start)
        s->err_msg = "expected 'HloModule' or a computation";
      return s->err;
    }
    s->err = 0;
    s->err_msg = NULL;
    t->n_attrs = n_attrs0;
    t->n_modules = n_mods0;
    if (m.idx >= (int32_t)t->n_modules) m.idx = -1;
    close_module(s, &m);
    s->p = start;
    skip_line(s);
  }
  close_module(s, &m);
  return 0;
}

/* ------------------------------------------------------------ API */

hlo_tables *hlo_scan(const char *buf, uint64_t len, int allow_junk) {
  hlo_tables *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  S *s = calloc(1, sizeof *s);
  if (!s) {
    t->error = HLO_ERR_NO_MEMORY;
    t->error_message = "out of memory";
    return t;
  }
  s->b = (const uint8_t *)(buf ? buf : "");
  s->n = buf ? len : 0;
  s->t = t;
  s->junk = allow_junk != 0;
  s->ln = 1;
  init_classes(s->cls);
  /* The densest dumps of the corpus hold an instruction per 88 bytes, an operand per 65 (56 in one),
   * an attribute per 125 (70 and 103 in two). The instruction table, the largest, stays larger than
   * the other two together: glibc gives the top of its heap back to the system when more than twice
   * the largest block it has freed lies free there, and a scan's tables freed together would then
   * be fresh pages (a fault each) on every scan, not warm ones (llama31_8b: ~2100 faults a scan). */
  reserve((void **)&t->instrs, &s->cap_instr, s->n / 64, sizeof(hlo_instr));
  reserve((void **)&t->operands, &s->cap_op, s->n / 64, sizeof(hlo_operand));
  reserve((void **)&t->attrs, &s->cap_attr, s->n / 128, sizeof(hlo_attr));
  s->bstack = malloc(HLO_MAX_DEPTH);
  if (!s->bstack) {
    fail(s, HLO_ERR_NO_MEMORY, 0, "out of memory");
  } else {
    scan_file(s);
  }
  t->error = s->err;
  t->error_offset = s->err ? s->err_off : 0;
  t->error_message = s->err ? s->err_msg : NULL;
  free(s->bstack);
  free(s->scratch);
  free(s->h);
  free(s);
  return t;
}

void hlo_tables_free(hlo_tables *t) {
  if (!t) return;
  free(t->modules);
  free(t->comps);
  free(t->instrs);
  free(t->operands);
  free(t->attrs);
  free(t);
}

uint64_t hlo_struct_size(int which) {
  switch (which) {
    case HLO_STRUCT_SPAN: return sizeof(hlo_span);
    case HLO_STRUCT_INSTR: return sizeof(hlo_instr);
    case HLO_STRUCT_OPERAND: return sizeof(hlo_operand);
    case HLO_STRUCT_ATTR: return sizeof(hlo_attr);
    case HLO_STRUCT_COMP: return sizeof(hlo_comp);
    case HLO_STRUCT_MODULE: return sizeof(hlo_module);
    case HLO_STRUCT_TABLES: return sizeof(hlo_tables);
    case HLO_STRUCT_CALL: return sizeof(hlo_call);
    case HLO_STRUCT_LINKS: return sizeof(hlo_links);
    default: return 0;
  }
}
