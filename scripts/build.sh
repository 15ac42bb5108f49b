#!/usr/bin/env bash
# Configures and builds desloc (release preset) into ./build. Used by quickstart.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${DESLOC_BUILD_JOBS:-$(nproc)}"
cmake --preset release >/dev/null
cmake --build build -j "$jobs"
