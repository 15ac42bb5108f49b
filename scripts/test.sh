#!/usr/bin/env bash
# The whole test suite in one command: install dependencies, build, run ctest.
# GPU tests (label gpu) skip without a device; everything else must pass. Under CI=true,
# tests that would skip for a missing prerequisite (torch, npm) fail instead.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
./scripts/build.sh
ctest --test-dir build --output-on-failure -j "${DESLOC_TEST_JOBS:-2}" --timeout 900 "$@"
# The fuzz targets (clang, ASan + UBSan): seeds and regressions replayed, then 20 s per target.
# Then the unit and integration tests under ASan + UBSan with leak detection (GCC, build-asan/).
if [[ "${CI:-}" == "true" || "${DESLOC_FUZZ:-0}" == "1" ]]; then
  ./scripts/fuzz.sh
  ./scripts/asan.sh --all
else
  echo "test: fuzzing and the ASan tests skipped; run ./scripts/fuzz.sh and" \
    "./scripts/asan.sh --all (or DESLOC_FUZZ=1 ./scripts/test.sh)"
fi
