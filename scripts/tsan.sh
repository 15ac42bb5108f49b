#!/usr/bin/env bash
# The unit and integration tests under ThreadSanitizer (the `tsan` preset: clang, libomp, whose
# Archer tool tells TSan about OpenMP's barriers and tasks). Builds build-tsan, then runs every
# test outside the labels that need root, a GPU, torch or the fuzzers. A data race ends the
# process that saw it (halt_on_error), so its test fails and prints both stacks; child processes
# (`desloc launch` ranks and coordinators) inherit the settings. Suppressions: tests/tsan.supp.
# usage: scripts/tsan.sh [ctest arguments...]      (about 25 minutes on 2 cores, build included)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
archer=/usr/lib/llvm-16/lib/libarcher.so
[[ -f $archer ]] || { echo "tsan: $archer not found (Debian package libomp-16-dev)" >&2; exit 1; }
cmake --preset tsan >/dev/null
cmake --build build-tsan -j "${DESLOC_BUILD_JOBS:-2}"
# ignore_noninstrumented_modules: libomp's runtime is not instrumented, and its own internal
# accesses (its barrier flags) read as races; Archer reports the synchronisation it gives to
# desloc's code.
export TSAN_OPTIONS="suppressions=$root/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1 ignore_noninstrumented_modules=1 external_symbolizer_path=/usr/bin/llvm-symbolizer ${TSAN_OPTIONS:-}"
export OMP_TOOL_LIBRARIES=$archer
export ARCHER_OPTIONS="verbose=0"
ctest --test-dir build-tsan --output-on-failure -j "${DESLOC_TEST_JOBS:-2}" --timeout 1800 \
  -LE "netbed|gpu|parity|fuzz" "$@"
