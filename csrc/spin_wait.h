/* spin_wait: a thread waiting a few microseconds for another without leaving its core (see spin_wait.c).
 * Built as a library of its own (libhlo_spin); hloexec/kernels/threads.py loads it with cffi, whose declarations
 * (hloexec/kernels/_spin_ffi.py) are generated from this header by hloexec/parser/scan_cdef.py. */
#ifndef HLO_SPIN_WAIT_H
#define HLO_SPIN_WAIT_H

#include <stdint.h>

int64_t hlo_spin_while_equal(const volatile int64_t *word, int64_t value, int64_t max_ns, int64_t grace_ns);

#endif
