/* hlo_link.c: the per-row work of parsing over the scanner's tables. See hlo_scan.h ("Linking").
 *
 * One pass over the instructions interns opcode and shape texts, a second checks operands and
 * parameter numbers, a third resolves the attributes that name computations. Hash tables are open
 * addressing over byte spans of the caller's buffer; nothing else is allocated per row. Like the
 * scanner, every read stays inside the tables' spans, which hlo_scan keeps inside the buffer.
 */
#include "hlo_scan.h"
#include "hlo_bytes.h"

#include <stdlib.h>
#include <string.h>

#define PREFETCH_ROWS 8  /* instructions ahead whose text is asked for */
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)(p))
#endif

static int same_text(const char *buf, hlo_span a, hlo_span b) {
  return a.len == b.len && same_bytes((const uint8_t *)buf + a.off, (const uint8_t *)buf + b.off, a.len);
}

static uint32_t text_hash(const char *buf, hlo_span a) { return hash_bytes((const uint8_t *)buf + a.off, a.len); }

static int is_text(const char *buf, hlo_span a, const char *s) {
  size_t n = strlen(s);
  return a.len == n && memcmp(buf + a.off, s, n) == 0;
}

/* ---- interning: distinct texts get ids 0, 1, ... in order of first use ---- */
typedef struct {
  const char *buf;
  uint32_t *slots;   /* id + 1; 0 = empty */
  uint64_t cap;      /* slots, a power of two, at least twice the ids */
  hlo_span *texts;   /* per id */
  uint32_t *hashes;  /* per id */
  uint64_t n, id_cap;
} interner;

static int interner_init(interner *in, const char *buf) {
  memset(in, 0, sizeof *in);
  in->buf = buf;
  in->cap = 256;
  in->id_cap = 64;
  in->slots = calloc(in->cap, sizeof *in->slots);
  in->texts = malloc(in->id_cap * sizeof *in->texts);
  in->hashes = malloc(in->id_cap * sizeof *in->hashes);
  return in->slots && in->texts && in->hashes ? 0 : HLO_ERR_NO_MEMORY;
}

static void interner_free(interner *in) {
  free(in->slots);
  free(in->texts);
  free(in->hashes);
}

static void place(uint32_t *slots, uint64_t cap, uint32_t h, uint32_t value) {
  uint64_t i = h & (cap - 1);
  while (slots[i]) i = (i + 1) & (cap - 1);
  slots[i] = value;
}

/* The id of `text` (a new one recorded with `row` in first[] if unseen), or -1 when out of memory. */
static int64_t intern(interner *in, hlo_span text, int32_t row, int32_t *first) {
  uint32_t h = text_hash(in->buf, text);
  uint64_t i = h & (in->cap - 1);
  for (uint32_t s; (s = in->slots[i]) != 0; i = (i + 1) & (in->cap - 1)) {
    if (in->hashes[s - 1] == h && same_text(in->buf, in->texts[s - 1], text)) return s - 1;
  }
  if (in->n == in->id_cap) {
    uint64_t nc = in->id_cap * 2;
    hlo_span *texts = realloc(in->texts, nc * sizeof *texts);
    if (!texts) return -1;
    in->texts = texts;
    uint32_t *hashes = realloc(in->hashes, nc * sizeof *hashes);
    if (!hashes) return -1;
    in->hashes = hashes;
    in->id_cap = nc;
  }
  uint64_t id = in->n++;
  in->texts[id] = text;
  in->hashes[id] = h;
  first[id] = row;
  in->slots[i] = (uint32_t)id + 1;
  if (2 * in->n > in->cap) {  /* rehash into twice the slots */
    uint64_t nc = in->cap * 2;
    uint32_t *slots = calloc(nc, sizeof *slots);
    if (!slots) return -1;
    for (uint64_t k = 0; k < in->n; k++) place(slots, nc, in->hashes[k], (uint32_t)k + 1);
    free(in->slots);
    in->slots = slots;
    in->cap = nc;
  }
  return (int64_t)id;
}

/* ---- checks ---- */
/* Whitespace as Python's str.strip() sees it in ASCII text (it also strips \x1c-\x1f). */
static int is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

/* A parameter number: optional whitespace around 1-19 ASCII digits below 2^63. */
static int is_parameter_number(const char *p, uint64_t n) {
  while (n && is_space((unsigned char)p[0])) p++, n--;
  while (n && is_space((unsigned char)p[n - 1])) n--;
  if (n == 0 || n > 19) return 0;
  uint64_t v = 0;
  for (uint64_t k = 0; k < n; k++) {
    if (p[k] < '0' || p[k] > '9') return 0;
    v = v * 10 + (uint64_t)(p[k] - '0');
  }
  return v < (1ull << 63);
}

/* ---- computation names, per module: (module, name) -> computation row; a later one wins ---- */
typedef struct {
  const char *buf;
  const hlo_comp *comps;
  int32_t *slots;  /* row + 1; 0 = empty */
  uint64_t cap;
} comp_map;

static uint32_t comp_hash(const char *buf, hlo_span name, int32_t module) {
  return text_hash(buf, name) ^ ((uint32_t)module * 0x9E3779B9u);
}

static int comp_map_init(comp_map *m, const char *buf, const hlo_tables *t) {
  m->buf = buf;
  m->comps = t->comps;
  m->cap = 16;
  while (m->cap < 2 * t->n_comps) m->cap *= 2;
  m->slots = calloc(m->cap, sizeof *m->slots);
  if (!m->slots) return HLO_ERR_NO_MEMORY;
  for (uint64_t r = 0; r < t->n_comps; r++) {
    const hlo_comp *c = &t->comps[r];
    uint64_t i = comp_hash(buf, c->name, c->module) & (m->cap - 1);
    for (int32_t s; (s = m->slots[i]) != 0; i = (i + 1) & (m->cap - 1)) {
      const hlo_comp *o = &t->comps[s - 1];
      if (o->module == c->module && same_text(buf, o->name, c->name)) break;
    }
    m->slots[i] = (int32_t)r + 1;
  }
  return 0;
}

static int32_t comp_lookup(const comp_map *m, hlo_span name, int32_t module) {
  uint64_t i = comp_hash(m->buf, name, module) & (m->cap - 1);
  for (int32_t s; (s = m->slots[i]) != 0; i = (i + 1) & (m->cap - 1)) {
    const hlo_comp *o = &m->comps[s - 1];
    if (o->module == module && same_text(m->buf, o->name, name)) return s - 1;
  }
  return -1;
}

/* ---- called computations ---- */
typedef struct {
  hlo_links *l;
  uint64_t call_cap, target_cap;
} call_out;

static int push_target(call_out *o, int32_t row) {
  hlo_links *l = o->l;
  if (l->n_call_targets == o->target_cap) {
    uint64_t nc = o->target_cap ? 2 * o->target_cap : 256;
    if (nc > INT32_MAX) return HLO_ERR_TOO_LARGE;
    int32_t *q = realloc(l->call_targets, nc * sizeof *q);
    if (!q) return HLO_ERR_NO_MEMORY;
    l->call_targets = q;
    o->target_cap = nc;
  }
  l->call_targets[l->n_call_targets++] = row;
  return 0;
}

/* Resolve one name (a leading run of '%' dropped); on failure record it as the call's unknown name. */
static int resolve(call_out *o, const comp_map *m, hlo_call *call, const char *buf, uint64_t a, uint64_t b,
                   int32_t module) {
  while (a < b && buf[a] == '%') a++;
  hlo_span name = {a, b - a};
  int32_t row = comp_lookup(m, name, module);
  if (row < 0) {
    call->flags |= HLO_CALL_UNKNOWN;
    call->unknown = name;
    return 0;
  }
  return push_target(o, row);
}

/* The names of an attribute value: `name`, `%name`, or `{%a, %b}` (any mix of braces at the ends, commas between). */
static int resolve_value(call_out *o, const comp_map *m, hlo_call *call, const char *buf, hlo_span value,
                         int32_t module) {
  const char *v = buf + value.off;
  uint64_t n = value.len;
  if (n && v[0] == '{') {
    call->flags |= HLO_CALL_BRACED;
    if (memchr(v, '=', n)) {
      call->flags |= HLO_CALL_INLINE;
      return 0;
    }
  }
  if (!memchr(v, ',', n) && !memchr(v, '{', n) && !memchr(v, '}', n))
    return resolve(o, m, call, buf, value.off, value.off + n, module);
  uint64_t a = value.off, e = value.off + n;
  while (a < e && (buf[a] == '{' || buf[a] == '}')) a++;
  while (e > a && (buf[e - 1] == '{' || buf[e - 1] == '}')) e--;
  while (a <= e && !(call->flags & HLO_CALL_UNKNOWN)) {
    const char *comma = memchr(buf + a, ',', e - a);
    uint64_t b = comma ? (uint64_t)(comma - buf) : e, lo = a, hi = b;
    while (lo < hi && is_space((unsigned char)buf[lo])) lo++;
    while (hi > lo && is_space((unsigned char)buf[hi - 1])) hi--;
    if (lo < hi) {
      int err = resolve(o, m, call, buf, lo, hi, module);
      if (err) return err;
    }
    a = b + 1;
  }
  if (!(call->flags & (HLO_CALL_UNKNOWN | HLO_CALL_BRACED)) && o->l->n_call_targets == call->target_begin) {
    call->flags |= HLO_CALL_UNKNOWN;  /* one computation expected, none named: report the empty name */
    call->unknown = (hlo_span){value.off, 0};
  }
  return 0;
}

static int link_calls(hlo_links *l, const char *buf, const hlo_tables *t, const char *const *keys, uint32_t n_keys) {
  comp_map m;
  int err = comp_map_init(&m, buf, t);
  call_out o = {l, 0, 0};
  uint64_t lengths = 0; /* bit k: some key has k bytes (most attributes are rejected by their length) */
  size_t *key_len = malloc((n_keys ? n_keys : 1) * sizeof *key_len);
  if (!key_len) err = HLO_ERR_NO_MEMORY;
  for (uint32_t k = 0; k < n_keys && !err; k++) {
    key_len[k] = strlen(keys[k]);
    lengths |= key_len[k] < 64 ? 1ull << key_len[k] : 0;
  }
  for (uint64_t i = 0; i < t->n_instrs && !err; i++) {
    const hlo_instr *ins = &t->instrs[i];
    int32_t module = t->comps[ins->computation].module;
    for (uint64_t r = ins->attr_begin; r < (uint64_t)ins->attr_begin + ins->attr_count && !err; r++) {
      const hlo_attr *at = &t->attrs[r];
      if (at->key.len < 64 && !(lengths >> at->key.len & 1)) continue;
      uint32_t k = 0;
      while (k < n_keys && !(at->key.len == key_len[k] && memcmp(buf + at->key.off, keys[k], key_len[k]) == 0)) k++;
      if (k == n_keys) continue;
      if (l->n_calls == o.call_cap) {
        uint64_t nc = o.call_cap ? 2 * o.call_cap : 64;
        hlo_call *q = realloc(l->calls, nc * sizeof *q);
        if (!q) {
          err = HLO_ERR_NO_MEMORY;
          break;
        }
        l->calls = q;
        o.call_cap = nc;
      }
      hlo_call *call = &l->calls[l->n_calls++];
      memset(call, 0, sizeof *call);
      call->owner = (uint32_t)i;
      call->attr = (uint32_t)r;
      call->key = k;
      call->target_begin = (uint32_t)l->n_call_targets;
      err = resolve_value(&o, &m, call, buf, at->value, module);
      if (call->flags & HLO_CALL_UNKNOWN) l->n_call_targets = call->target_begin;  /* an error: no targets */
      call->target_count = (uint32_t)(l->n_call_targets - call->target_begin);
    }
  }
  free(m.slots);
  free(key_len);
  return err;
}

hlo_links *hlo_link(const char *buf, uint64_t len, const hlo_tables *t, const char *const *call_keys,
                    uint32_t n_call_keys, int32_t *opcode_ids, int32_t *opcode_first, int32_t *shape_ids,
                    int32_t *shape_first) {
  (void)len;  /* the spans were checked against it by the scanner */
  hlo_links *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  l->bad_operand = l->bad_operand_owner = l->bad_parameter = -1;
  interner opcodes, shapes;
  int err = interner_init(&opcodes, buf) | interner_init(&shapes, buf);
  int64_t parameter = -1, recv_done = -1;
  uint64_t operand = 0;  /* operand rows follow the instructions' order */
  for (uint64_t i = 0; i < t->n_instrs && !err; i++) {
    const hlo_instr *ins = &t->instrs[i];
    /* The texts are read once, far apart in a large buffer: without asking for them ahead, each
     * instruction waits for memory (3x the time of the rest of this loop on a 3 MB dump). */
    if (i + PREFETCH_ROWS < t->n_instrs) PREFETCH(buf + t->instrs[i + PREFETCH_ROWS].opcode.off);
    uint64_t known = opcodes.n;
    int64_t op = intern(&opcodes, ins->opcode, (int32_t)i, opcode_first);
    if (op < 0) {
      err = HLO_ERR_NO_MEMORY;
      break;
    }
    if (opcodes.n > known) {  /* a new opcode text */
      if (is_text(buf, ins->opcode, "parameter")) parameter = op;
      if (is_text(buf, ins->opcode, "recv-done")) recv_done = op;
    }
    opcode_ids[i] = (int32_t)op;
    shape_ids[i] = -1;
    if (!(ins->flags & HLO_INSTR_NO_SHAPE) && op != recv_done) {
      int64_t id = intern(&shapes, ins->shape, (int32_t)i, shape_first);
      if (id < 0) err = HLO_ERR_NO_MEMORY;
      shape_ids[i] = (int32_t)id;
    }
    if (op == parameter && l->bad_parameter < 0 && !is_parameter_number(buf + ins->args.off, ins->args.len))
      l->bad_parameter = (int64_t)i;
    for (uint32_t k = 0; k < ins->operand_count && operand < t->n_operands; k++, operand++) {
      int32_t target = t->operands[operand].target;
      if (l->bad_operand < 0 && (target < 0 || (uint64_t)target >= i)) {
        l->bad_operand = (int64_t)operand;
        l->bad_operand_owner = (int64_t)i;
      }
    }
  }
  l->n_opcodes = opcodes.n;
  l->n_shapes = shapes.n;
  interner_free(&opcodes);
  interner_free(&shapes);
  if (!err) err = link_calls(l, buf, t, call_keys, n_call_keys);
  l->error = err;
  return l;
}

void hlo_links_free(hlo_links *l) {
  if (!l) return;
  free(l->calls);
  free(l->call_targets);
  free(l);
}
