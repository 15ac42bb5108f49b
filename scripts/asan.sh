#!/usr/bin/env bash
# The unit tests under AddressSanitizer and UndefinedBehaviorSanitizer (the `asan` preset: GCC,
# RelWithDebInfo, into build-asan/), with leak detection; any report fails the run. Builds only
# the unit test programs and what they need (the library and the CLI). Run by test.sh under
# CI=true; by hand:
#   ./scripts/asan.sh            every unit test
#   ./scripts/asan.sh -R Topology  ctest's arguments pass through
# The integration tests run under ASan by hand: ctest --test-dir build-asan -LE "gpu|netbed"
# after a whole `cmake --build build-asan` (about 15 min to build on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${DESLOC_BUILD_JOBS:-$(nproc)}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

start=$SECONDS
cmake --preset asan >/dev/null
targets=()
for f in tests/unit/*_test.cpp; do targets+=("$(basename "$f" .cpp)"); done
cmake --build build-asan --target "${targets[@]}" -j "$jobs"
echo "asan: build took $((SECONDS - start)) s"
start=$SECONDS
ctest --test-dir build-asan -L unit --output-on-failure -j "${DESLOC_TEST_JOBS:-2}" --timeout 900 "$@"
echo "asan: unit tests took $((SECONDS - start)) s"
