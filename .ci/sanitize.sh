#!/usr/bin/env bash
# The C scanner under AddressSanitizer + UndefinedBehaviorSanitizer; exits non-zero on any report.
#  1. CMake build with -DHLOEXEC_SANITIZE=ON; the scanner and robustness tests load it through
#     HLOEXEC_SCAN_LIBRARY with the ASan runtime preloaded into Python (leak checks off: CPython's own).
#  2. fuzz/fuzz_scan.c as a standalone driver (any C compiler), leak checks on: every seed and XLA
#     corpus file whole, truncated and mutated, and the fuzz corpus more thoroughly.
#  3. A 60 s libFuzzer run of the same target when clang is installed (skipped with a message if not).
# Needs cmake and gcc; ../shared (or HLOEXEC_SHARED) for the seeds and corpus (skipped if absent).
# PYTHON selects the interpreter (default: python3 on PATH). Runtime ~2-3 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
SHARED=${HLOEXEC_SHARED:-$ROOT/../shared}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
echo "== sanitize: CMake build with HLOEXEC_SANITIZE=ON"
cmake -S . -B "$WORK/build" -DHLOEXEC_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$WORK/cmake.log"
cmake --build "$WORK/build" -j 2 >> "$WORK/cmake.log"
LIB=$(find "$WORK/build" -name 'libhlo_scan.so' | head -1)

echo "== sanitize: scanner and malformed-input tests against $LIB"
HLOEXEC_SCAN_LIBRARY="$LIB" LD_PRELOAD="$(gcc -print-file-name=libasan.so)" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
  "$PYTHON" -m pytest -q -p no:cacheprovider \
  tests/test_scan.py tests/test_robustness.py tests/test_fuzz_regressions.py

echo "== sanitize: standalone sweep (ASan + UBSan + LeakSanitizer)"
gcc -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer \
  -DHLO_FUZZ_STANDALONE -Icsrc fuzz/fuzz_scan.c csrc/hlo_scan.c csrc/hlo_link.c -o "$WORK/scan_sweep"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
"$WORK/scan_sweep" -n 200 -t 200 fuzz/corpus/* tests/data/fuzz_crashers/*
if [ -d "$SHARED/seeds" ] && [ -d "$SHARED/corpus/xla" ]; then
  "$WORK/scan_sweep" -n 8 -t 8 "$SHARED"/seeds/* "$SHARED"/corpus/xla/*.hlo
else
  echo "   skipped the seed/corpus sweep: $SHARED/seeds or $SHARED/corpus/xla not found"
fi

if command -v clang > /dev/null; then
  echo "== sanitize: libFuzzer ${FUZZ_SECONDS}s on the scanner"
  clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Icsrc \
    fuzz/fuzz_scan.c csrc/hlo_scan.c csrc/hlo_link.c -o "$WORK/fuzz_scan"
  mkdir -p "$WORK/corpus"
  (cd "$WORK" && ./fuzz_scan -dict="$ROOT/fuzz/hlo.dict" -max_total_time="$FUZZ_SECONDS" -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 corpus "$ROOT/fuzz/corpus" > fuzz.log 2>&1 \
    || { tail -60 fuzz.log; exit 1; })
  grep -E "^(Done|stat::number_of_executed_units)" "$WORK/fuzz.log"
  # a finding makes libFuzzer exit non-zero and leave a crash-/timeout-/leak-/oom- file
  if ls "$WORK"/crash-* "$WORK"/timeout-* "$WORK"/leak-* "$WORK"/oom-* > /dev/null 2>&1; then
    echo "libFuzzer found an input: see above" >&2
    exit 1
  fi
else
  echo "== sanitize: SKIPPED the libFuzzer run: clang not found (apt-get install -y clang)"
fi
echo "== sanitize: clean"
