/* spin_wait: a thread waiting a few microseconds for another without leaving its core.
 *
 * hloexec's thread pool (hloexec/kernels/threads.py) hands blocks of one product or fused loop to a helper
 * thread and waits for the last one. A thread that sleeps in the kernel takes 50-100 us to run again once
 * woken on a virtual machine (the idle virtual CPU halts), 120 times per GPT d256 train step. Called
 * through cffi, which releases the GIL, so Python threads spin here without blocking each other. */
#define _POSIX_C_SOURCE 199309L   /* clock_gettime under -std=c11 */
#include <stdint.h>
#include <time.h>

#include "spin_wait.h"
#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

#if defined(__GNUC__) || defined(__clang__)
#define load_acquire(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#else
#define load_acquire(p) (*(p))    /* a volatile read: x86's loads are acquire loads */
#endif

static int64_t now_ns(void) {
  struct timespec t;
#ifdef CLOCK_MONOTONIC
  clock_gettime(CLOCK_MONOTONIC, &t);
#else
  timespec_get(&t, TIME_UTC);
#endif
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void spin_for(int64_t ns) {
  int64_t deadline = now_ns() + ns;
  while (now_ns() < deadline) cpu_relax();
}

/* Spin while *word == value, for at most max_ns nanoseconds; returns the word's last value read (== value:
 * timed out). Once the word changed, spin grace_ns more before returning: the thread that changed it holds
 * the GIL for a few more microseconds, and a thread returning to Python now would sleep waiting for it. */
int64_t hlo_spin_while_equal(const volatile int64_t *word, int64_t value, int64_t max_ns, int64_t grace_ns) {
  int64_t seen = load_acquire(word);
  if (seen != value) return seen;
  int64_t deadline = now_ns() + max_ns;
  for (unsigned i = 1;; i++) {
    cpu_relax();
    seen = load_acquire(word);
    if (seen != value) {
      spin_for(grace_ns);
      return seen;
    }
    if ((i & 63) == 0 && now_ns() >= deadline) return seen;
  }
}
