/* hlo_bytes.h: byte-span helpers the scanner (hlo_scan.c) and the linking pass (hlo_link.c) share:
 * word loads, a hash and an equality test of byte runs that never read outside the run. Internal to
 * the library (static inline; not part of its interface). */
#ifndef HLO_BYTES_H
#define HLO_BYTES_H
#include <stdint.h>
#include <string.h>

/* The small lexing helpers run once or more per token: inlined, they cost no call, spill or reload. */
#if defined(_MSC_VER) && !defined(__clang__)
#define HLO_INLINE static __forceinline
#else
#define HLO_INLINE static inline __attribute__((always_inline))
#endif

HLO_INLINE uint64_t load8(const uint8_t *p) {
  uint64_t w;
  memcpy(&w, p, 8);
  return w;
}

HLO_INLINE uint32_t load4(const uint8_t *p) {
  uint32_t w;
  memcpy(&w, p, 4);
  return w;
}

/* Eight bytes a step (names are mostly 5-12 bytes), the last step overlapping the one before, so
 * no byte loop and no read outside the name; the value only has to agree within a scan. */
HLO_INLINE uint32_t hash_bytes(const uint8_t *p, uint64_t n) {
  const uint64_t k = 0x9e3779b97f4a7c15ull;
  uint64_t h = n * k, w = 0, i = 0;
  if (n >= 8) {
    for (; n - i > 8; i += 8) {
      h = (h ^ load8(p + i)) * k;
      h ^= h >> 29;
    }
    w = load8(p + n - 8);
  } else if (n >= 4) {
    w = ((uint64_t)load4(p) << 32) | load4(p + n - 4);
  } else {
    for (; i < n; i++) w = (w << 8) | p[i];
  }
  h = (h ^ w) * k; /* a name's last bytes (its number) sit in w's high bits: mix them down */
  h ^= h >> 32;
  h *= k;
  h ^= h >> 29;
  return (uint32_t)h;
}

/* a[0:n] == b[0:n], in the steps of hash_bytes */
HLO_INLINE int same_bytes(const uint8_t *a, const uint8_t *b, uint64_t n) {
  if (n >= 8) {
    for (uint64_t i = 0; n - i > 8; i += 8)
      if (load8(a + i) != load8(b + i)) return 0;
    return load8(a + n - 8) == load8(b + n - 8);
  }
  if (n >= 4) return load4(a) == load4(b) && load4(a + n - 4) == load4(b + n - 4);
  for (uint64_t i = 0; i < n; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}

#endif
