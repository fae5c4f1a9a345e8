/* Fuzz target for the C scanner csrc/hlo_scan.c and the linking pass over its
 * tables csrc/hlo_link.c: any byte string must give either consistent tables
 * (every span inside the input, every row index in range) and links (ids,
 * first rows and computation rows in range) or one error with an offset
 * inside the input; never a crash, an over-read, UB or a leak.
 *
 * libFuzzer (coverage-guided):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Icsrc fuzz/fuzz_scan.c csrc/hlo_scan.c csrc/hlo_link.c -o /tmp/fuzz_scan
 *   /tmp/fuzz_scan -max_total_time=600 -timeout=10 -rss_limit_mb=2048 /tmp/corpus fuzz/corpus
 * Standalone sweep (any C compiler, used by .ci/sanitize.sh): every file whole,
 * truncated at up to 20000 points, suffixes, and N random 4-byte mutations:
 *   cc -g -O1 -fsanitize=address,undefined -DHLO_FUZZ_STANDALONE -Icsrc fuzz/fuzz_scan.c csrc/hlo_scan.c csrc/hlo_link.c -o /tmp/scan_sweep
 *   /tmp/scan_sweep [-n MUTATIONS] [-t TRUNCATION_POINTS] FILE...
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hlo_scan.h"

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "invariant failed: %s (line %d)\n", #cond, __LINE__); \
      abort();                                                        \
    }                                                                 \
  } while (0)

static void check_span(hlo_span sp, uint64_t n) { CHECK(sp.off <= n && sp.len <= n - sp.off); }

static void check_range(uint64_t begin, uint64_t count, uint64_t n) { CHECK(begin <= n && count <= n - begin); }

static void check_tables(const hlo_tables *t, uint64_t n) {
  if (t->error) {
    CHECK(t->error_offset <= n);
    CHECK(t->error_message != NULL);
    return;
  }
  CHECK(t->error_offset == 0);
  for (uint64_t i = 0; i < t->n_modules; i++) {
    const hlo_module *m = &t->modules[i];
    check_span(m->name, n);
    check_span(m->text, n);
    check_span(m->preamble, n);
    check_range(m->attr_begin, m->attr_count, t->n_attrs);
    check_range(m->comp_begin, m->comp_count, t->n_comps);
    CHECK(m->entry == -1 || (m->entry >= (int64_t)m->comp_begin && m->entry < (int64_t)(m->comp_begin + m->comp_count)));
  }
  for (uint64_t i = 0; i < t->n_comps; i++) {
    const hlo_comp *c = &t->comps[i];
    check_span(c->name, n);
    check_span(c->signature, n);
    check_range(c->instr_begin, c->instr_count, t->n_instrs);
    check_range(c->attr_begin, c->attr_count, t->n_attrs);
    CHECK(c->root == -1 || (c->root >= (int64_t)c->instr_begin && c->root < (int64_t)(c->instr_begin + c->instr_count)));
    CHECK(c->module >= 0 && (uint64_t)c->module < t->n_modules);
  }
  for (uint64_t i = 0; i < t->n_instrs; i++) {
    const hlo_instr *ins = &t->instrs[i];
    check_span(ins->name, n);
    check_span(ins->shape, n);
    check_span(ins->opcode, n);
    check_span(ins->args, n);
    check_range(ins->operand_begin, ins->operand_count, t->n_operands);
    check_range(ins->attr_begin, ins->attr_count, t->n_attrs);
    CHECK(ins->line >= 1 && ins->column >= 1);
    CHECK(ins->computation >= 0 && (uint64_t)ins->computation < t->n_comps);
  }
  for (uint64_t i = 0; i < t->n_operands; i++) {
    check_span(t->operands[i].name, n);
    check_span(t->operands[i].shape, n);
    CHECK(t->operands[i].target >= -1 && t->operands[i].target < (int64_t)t->n_instrs);
  }
  for (uint64_t i = 0; i < t->n_attrs; i++) {
    check_span(t->attrs[i].key, n);
    check_span(t->attrs[i].value, n);
  }
}

static const char *const call_keys[] = {"calls", "to_apply", "body", "branch_computations"};

static void check_links(const hlo_tables *t, const char *buf, uint64_t n) {
  uint64_t rows = t->n_instrs ? t->n_instrs : 1;
  int32_t *ids = malloc(4 * rows * sizeof *ids);
  CHECK(ids != NULL);
  int32_t *opcode_ids = ids, *opcode_first = ids + rows, *shape_ids = ids + 2 * rows, *shape_first = ids + 3 * rows;
  hlo_links *l = hlo_link(buf, n, t, call_keys, 4, opcode_ids, opcode_first, shape_ids, shape_first);
  CHECK(l != NULL);
  if (!l->error) {
    CHECK(l->n_opcodes <= t->n_instrs && l->n_shapes <= t->n_instrs);
    for (uint64_t i = 0; i < t->n_instrs; i++) {
      CHECK(opcode_ids[i] >= 0 && (uint64_t)opcode_ids[i] < l->n_opcodes);
      CHECK(shape_ids[i] >= -1 && shape_ids[i] < (int64_t)l->n_shapes);
      CHECK(opcode_first[opcode_ids[i]] <= (int64_t)i);
    }
    CHECK(l->bad_operand >= -1 && l->bad_operand < (int64_t)t->n_operands);
    CHECK(l->bad_operand_owner >= -1 && l->bad_operand_owner < (int64_t)t->n_instrs);
    CHECK(l->bad_parameter >= -1 && l->bad_parameter < (int64_t)t->n_instrs);
    for (uint64_t c = 0; c < l->n_calls; c++) {
      const hlo_call *call = &l->calls[c];
      CHECK(call->owner < t->n_instrs && call->attr < t->n_attrs && call->key < 4);
      CHECK(c == 0 || call->owner >= l->calls[c - 1].owner);
      check_range(call->target_begin, call->target_count, l->n_call_targets);
      check_span(call->unknown, n);
      for (uint32_t k = 0; k < call->target_count; k++) {
        int32_t comp = l->call_targets[call->target_begin + k];
        CHECK(comp >= 0 && (uint64_t)comp < t->n_comps);
        CHECK(t->comps[comp].module == t->comps[t->instrs[call->owner].computation].module);
      }
    }
  }
  hlo_links_free(l);
  free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (int allow_junk = 0; allow_junk <= 1; allow_junk++) {
    hlo_tables *t = hlo_scan((const char *)data, size, allow_junk);
    CHECK(t != NULL);
    check_tables(t, size);
    if (!t->error) check_links(t, (const char *)data, size);
    hlo_tables_free(t);
  }
  return 0;
}

#ifdef HLO_FUZZ_STANDALONE
/* Each input is a fresh malloc'd copy of exactly its size, so ASan sees any over-read. */
static void run_copy(const char *src, size_t n) {
  char *c = malloc(n ? n : 1);
  CHECK(c != NULL);
  memcpy(c, src, n);
  LLVMFuzzerTestOneInput((const uint8_t *)c, n);
  free(c);
}

int main(int argc, char **argv) {
  int mutations = 2000, a = 1;
  long cuts = 20000;
  for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
    if (!strcmp(argv[a], "-n")) mutations = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "-t")) cuts = atol(argv[a + 1]);
    else break;
  }
  int first_file = a;
  unsigned seed = 1;
  static const char alphabet[] = "(){}[]<>\"\\/*%=,.:- \n\tabcfs0123\0\xff";
  unsigned long long executions = 0;
  for (; a < argc; a++) {
    FILE *f = fopen(argv[a], "rb");
    if (!f) {
      perror(argv[a]);
      return 2;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(n + 1);
    if (fread(buf, 1, n, f) != (size_t)n) return 2;
    fclose(f);
    long step = cuts > 0 && n > cuts ? n / cuts : 1;
    for (long i = 0; i <= n; i += step) {
      run_copy(buf, i);
      run_copy(buf + i, n - i);
      executions += 2;
    }
    for (int m = 0; m < mutations && n > 0; m++) {
      char *c = malloc(n);
      memcpy(c, buf, n);
      for (int k = 0; k < 4; k++) {
        seed = seed * 1103515245u + 12345u;
        c[(seed >> 8) % n] = alphabet[(seed >> 3) % (sizeof alphabet - 1)];
      }
      LLVMFuzzerTestOneInput((const uint8_t *)c, n);
      free(c);
      executions++;
    }
    free(buf);
  }
  printf("scan_sweep: %d files, %llu inputs (each scanned strict and with junk skipping), no findings\n",
         argc - first_file, executions);
  return 0;
}
#endif
