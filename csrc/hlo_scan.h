/* hlo_scan: one pass over HLO text into flat, index-linked tables.
 *
 * The scanner never allocates per token and never recurses on input depth;
 * every read is bounds-checked against `len`, so any byte string (binary
 * garbage, truncation, 10k-deep brackets, a 1 GB line) yields either tables
 * or one error (code + byte offset + static message). Python turns that into
 * HloParseError with file:line:col.
 *
 * Spans are byte offsets into the caller's buffer: the caller keeps the
 * buffer (usually an mmap) alive while it uses the tables.
 *
 * Grammar covered here (the structural level of xla/hlo/parser/hlo_parser.cc):
 *   file        := junk* (module | computation)* junk*
 *   module      := 'HloModule' name (',' attr)* preamble? computation*
 *   preamble    := stack-frame tables (FileNames, FunctionNames, FileLocations,
 *                  StackFrames) -- recorded as one span, decoded in Python
 *   computation := ['ENTRY'] name [signature] (',' attr)* '{' instruction* '}'
 *   instruction := ['ROOT'] name '=' [shape] opcode '(' operands ')' (',' attr)*
 *   operand     := [shape] name | shape opcode '(' operands ')'   (nested,
 *                  hoisted into its own anonymous instruction row)
 *   attr        := key '=' value; value is a maximal run without top-level
 *                  whitespace or ',' where (), [], {} and "strings" nest.
 * Comments `/ * ... * /` and `// ...` are skipped everywhere.
 */
#ifndef HLO_SCAN_H
#define HLO_SCAN_H
#include <stddef.h>
#include <stdint.h>

typedef struct { uint64_t off; uint64_t len; } hlo_span;

enum {
  HLO_INSTR_ROOT = 1,       /* written with ROOT */
  HLO_INSTR_ANONYMOUS = 2,  /* hoisted nested operand: name.len == 0 */
  HLO_INSTR_NO_SHAPE = 4,   /* shape omitted (`ROOT t = tuple(a, b)`) */
};

typedef struct {
  hlo_span name;            /* without the leading '%' */
  hlo_span shape;           /* shape text; len 0 when omitted */
  hlo_span opcode;
  hlo_span args;            /* text between the parentheses (constant literal, parameter number, operands) */
  uint32_t operand_begin;   /* rows in the operand table */
  uint32_t operand_count;
  uint32_t attr_begin;      /* rows in the attribute table */
  uint32_t attr_count;
  uint32_t line;            /* 1-based line of the instruction's first token */
  uint32_t column;          /* 1-based byte column */
  uint32_t flags;           /* HLO_INSTR_* */
  int32_t computation;      /* row in the computation table */
} hlo_instr;

typedef struct {
  hlo_span name;            /* operand name without '%'; len 0 for a nested instruction */
  hlo_span shape;           /* shape written before the name; len 0 if none */
  int32_t target;           /* resolved instruction row in the same computation, -1 if the name is unknown */
  int32_t pad_;
} hlo_operand;

typedef struct { hlo_span key; hlo_span value; } hlo_attr;

enum { HLO_COMP_ENTRY = 1 };

typedef struct {
  hlo_span name;
  hlo_span signature;       /* '(' params ')' '->' shape, len 0 if absent */
  uint32_t instr_begin;
  uint32_t instr_count;
  uint32_t attr_begin;      /* attributes between signature and '{' (execution_thread=...) */
  uint32_t attr_count;
  uint32_t line;
  uint32_t flags;           /* HLO_COMP_* */
  int32_t root;             /* instruction row of ROOT, else the last instruction */
  int32_t module;           /* row in the module table */
} hlo_comp;

enum { HLO_MODULE_HEADER = 1 };  /* had an 'HloModule' line; else bare computations */

typedef struct {
  hlo_span name;            /* len 0 without a header */
  hlo_span text;            /* whole module text, header to the last '}' */
  hlo_span preamble;        /* stack-frame tables, len 0 if none */
  uint32_t attr_begin;      /* header attributes */
  uint32_t attr_count;
  uint32_t comp_begin;
  uint32_t comp_count;
  uint32_t line;
  uint32_t flags;           /* HLO_MODULE_* */
  int32_t entry;            /* computation row marked ENTRY, else the last one */
  int32_t pad_;
} hlo_module;

typedef struct {
  hlo_module *modules;  uint64_t n_modules;
  hlo_comp *comps;      uint64_t n_comps;
  hlo_instr *instrs;    uint64_t n_instrs;
  hlo_operand *operands; uint64_t n_operands;
  hlo_attr *attrs;      uint64_t n_attrs;
  int32_t error;        /* 0 = ok, else an HLO_ERR_* code */
  uint64_t error_offset;
  const char *error_message;  /* static string: what was expected */
} hlo_tables;

enum {
  HLO_OK = 0,
  HLO_ERR_SYNTAX = 1,
  HLO_ERR_UNTERMINATED = 2,  /* string, comment or bracket runs to end of input */
  HLO_ERR_TOO_DEEP = 3,      /* nesting beyond HLO_MAX_DEPTH */
  HLO_ERR_NO_MEMORY = 4,
  HLO_ERR_DUPLICATE = 5,     /* duplicate instruction name in a computation */
  HLO_ERR_TOO_LARGE = 6,     /* a table would exceed 2^31 rows */
};

#define HLO_MAX_DEPTH 100000  /* bracket nesting in shapes, literals, attribute values */

/* Scan buf[0:len]. Never returns NULL except on allocation failure of the
 * result itself. `allow_junk` = 1 skips lines that cannot start a module or
 * computation (logs, CHECK lines); 0 makes them a syntax error. */
hlo_tables *hlo_scan(const char *buf, uint64_t len, int allow_junk);
void hlo_tables_free(hlo_tables *t);

/* ---- Linking (csrc/hlo_link.c): what parsing checks and resolves row by row, over scanned tables ----
 *
 * Opcode and written-shape texts are interned (equal bytes, equal id; ids in order of first use), operand
 * targets and parameter numbers are checked, and the attributes that name computations (keys given by the
 * caller) are resolved to computation rows of the owner's module. The caller keeps every error's wording:
 * the pass only says where the first problem of each kind is. */
enum {
  HLO_CALL_BRACED = 1,      /* the value starts with '{' (a list of names) */
  HLO_CALL_INLINE = 2,      /* '{' and '=': a computation written inline, not resolved here */
  HLO_CALL_UNKNOWN = 4,     /* `unknown` names no computation of the module, or is empty where one name was
                               expected and none is written (no targets either way) */
};

typedef struct {
  uint32_t owner;           /* instruction row */
  uint32_t attr;            /* attribute row */
  uint32_t key;             /* index of the key in hlo_link's `call_keys` */
  uint32_t flags;           /* HLO_CALL_* */
  uint32_t target_begin;    /* rows of call_targets: the computation rows named, in written order */
  uint32_t target_count;
  hlo_span unknown;         /* HLO_CALL_UNKNOWN: the first name not found (after '%'), else len 0 */
} hlo_call;

typedef struct {
  uint64_t n_opcodes;       /* distinct opcode texts: opcode_first[0 .. n_opcodes) */
  uint64_t n_shapes;        /* distinct written shape texts: shape_first[0 .. n_shapes) */
  int64_t bad_operand;      /* first operand row naming no earlier instruction of its computation, -1 if none */
  int64_t bad_operand_owner;  /* its instruction row */
  int64_t bad_parameter;    /* first parameter whose number is not a non-negative 64-bit integer, -1 if none */
  hlo_call *calls;          uint64_t n_calls;     /* in attribute row order */
  int32_t *call_targets;    uint64_t n_call_targets;
  int32_t error;            /* 0 or HLO_ERR_NO_MEMORY / HLO_ERR_TOO_LARGE */
} hlo_links;

/* Link the tables `t` of buf[0:len] (as hlo_scan made them). The caller provides n_instrs entries for each of:
 * opcode_ids (the id of every instruction's opcode text), opcode_first (the first instruction row of each id),
 * shape_ids (the id of the written shape text; -1 when omitted or the opcode is recv-done, whose shape comes
 * from its operand) and shape_first. NULL only when the result itself cannot be allocated. */
hlo_links *hlo_link(const char *buf, uint64_t len, const hlo_tables *t, const char *const *call_keys,
                    uint32_t n_call_keys, int32_t *opcode_ids, int32_t *opcode_first, int32_t *shape_ids,
                    int32_t *shape_first);
void hlo_links_free(hlo_links *l);

/* sizeof the structs as compiled, so bindings (cffi ABI mode) can check
 * their layout at import. Unknown `which` returns 0. */
enum {
  HLO_STRUCT_SPAN = 0,
  HLO_STRUCT_INSTR = 1,
  HLO_STRUCT_OPERAND = 2,
  HLO_STRUCT_ATTR = 3,
  HLO_STRUCT_COMP = 4,
  HLO_STRUCT_MODULE = 5,
  HLO_STRUCT_TABLES = 6,
  HLO_STRUCT_CALL = 7,
  HLO_STRUCT_LINKS = 8,
};
uint64_t hlo_struct_size(int which);

#endif
