#!/usr/bin/env bash
# The tests under AddressSanitizer and UndefinedBehaviorSanitizer (the `asan` preset: GCC,
# RelWithDebInfo, into build-asan/), with leak detection; any report fails the run.
#   ./scripts/asan.sh              the unit tests (builds only their programs, the library and
#                                  the CLI)
#   ./scripts/asan.sh --all        also the integration tests (a whole build): everything but
#                                  the gpu, netbed and parity labels; the fault suite runs one
#                                  test at a time, since its heartbeat and deadline timings
#                                  assume the ranks are not starved of the 2 cores
#   ./scripts/asan.sh -R Topology  ctest's arguments pass through (to every ctest it runs)
# test.sh runs it with --all under CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."

all=0
if [[ "${1:-}" == "--all" ]]; then
  all=1
  shift
fi
jobs="${DESLOC_BUILD_JOBS:-$(nproc)}"
test_jobs="${DESLOC_TEST_JOBS:-2}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
# UCX's own allocations that a deliberately kept, broken UCX group holds at exit (tests/lsan.supp
# says why); child processes (`desloc launch` ranks) inherit it.
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$(pwd)/tests/lsan.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

start=$SECONDS
cmake --preset asan >/dev/null
if ((all)); then
  cmake --build build-asan -j "$jobs"
else
  targets=()
  for f in tests/unit/*_test.cpp; do targets+=("$(basename "$f" .cpp)"); done
  cmake --build build-asan --target "${targets[@]}" -j "$jobs"
fi
echo "asan: build took $((SECONDS - start)) s"
start=$SECONDS
ctest --test-dir build-asan -L unit --output-on-failure -j "$test_jobs" --timeout 900 "$@"
echo "asan: unit tests took $((SECONDS - start)) s"
if ((all)); then
  start=$SECONDS
  ctest --test-dir build-asan -LE "unit|gpu|netbed|parity" -E "FaultSuite" --output-on-failure \
    -j "$test_jobs" --timeout 900 "$@"
  echo "asan: integration tests but the fault suite took $((SECONDS - start)) s"
  start=$SECONDS
  ctest --test-dir build-asan -R "FaultSuite" --output-on-failure -j 1 --timeout 900 "$@"
  echo "asan: the fault suite took $((SECONDS - start)) s"
fi
