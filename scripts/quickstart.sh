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
./build/src/desloc launch --config configs/quickstart.toml --force "$@"

# What was trained, in use: a short sample from the mean of the two sites' final parameters
# (given the run directory, sample reads site west's checkpoint there and east's under
# ranks/east-0).
out=runs/quickstart
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --out-dir) out=${args[i + 1]:-$out} ;;
    --out-dir=*) out=${args[i]#--out-dir=} ;;
  esac
done
echo
echo "A sample from the trained model (desloc sample --checkpoint $out --prompt 'The jury said'):"
./build/src/desloc sample --checkpoint "$out" --prompt "The jury said" --tokens 200 \
  --temperature 0.8 --top-k 40 --seed 1
