#!/usr/bin/env bash
# The main job in one command: install dependencies, build, fetch and tokenize the Brown
# corpus, then train configs/quickstart.toml as a multi-site job (2 sites x 2 ranks, four
# processes over loopback) and report validation loss against the corpus's
# unigram entropy. The demo starts afresh each time: --force lets it replace the results of an
# earlier quickstart in runs/quickstart. Extra arguments go to `desloc launch` (e.g. --out-dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
./scripts/build.sh
if [[ ! -f data/brown/dataset.toml ]]; then
  ./build/src/desloc prepare --source brown --out data/brown
fi
exec ./build/src/desloc launch --config configs/quickstart.toml --force "$@"
