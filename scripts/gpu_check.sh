#!/usr/bin/env bash
# One-command GPU check for a machine with an NVIDIA GPU (Hopper, sm_90): builds desloc with
# the CUDA backend into build-gpu, runs the `gpu`-labelled tests, then bench_gpu_step.
# Needs no network: dependencies are assumed installed (install_deps.sh is tried, not required).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DESLOC_GPU_BUILD_DIR:-$root/build-gpu}"
arch="${CUDA_ARCH:-90}"
jobs="$(nproc)"
log_dir="$build/gpu_check_logs"
start=$(date +%s)

die() {
  echo "gpu_check: FAIL: $*" >&2
  exit 1
}
step() { echo "== gpu_check: $* ($(($(date +%s) - start)) s)"; }

step "checking for a GPU"
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found; this script needs an NVIDIA GPU and driver"
gpus="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"
[[ -n "$gpus" ]] || die "nvidia-smi shows no GPU"
echo "$gpus"

if [[ -x "$root/scripts/install_deps.sh" ]] && command -v apt-get >/dev/null 2>&1; then
  step "install_deps.sh (optional; failures tolerated)"
  timeout 300 "$root/scripts/install_deps.sh" >/dev/null 2>&1 ||
    echo "gpu_check: install_deps.sh failed or timed out; continuing with what is installed"
fi

export PATH="/usr/local/cuda/bin:$PATH"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)

step "configuring $build (Release, CUDA arch $arch)"
mkdir -p "$log_dir"
# The CUDA20 options teach CMake < 3.26 (Debian 12 has 3.25) nvcc's C++20 flag; newer
# CMake sets them itself and ignores these.
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DDESLOC_CUDA=ON -DDESLOC_TESTS=ON -DDESLOC_BENCH=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
  -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 >"$log_dir/configure.log" 2>&1 ||
  { tail -40 "$log_dir/configure.log"; die "cmake configure failed (log: $log_dir/configure.log)"; }
grep -q "desloc: CUDA backend ON" "$log_dir/configure.log" ||
  { grep -i cuda "$log_dir/configure.log" | tail -20; die "CUDA backend not enabled: nvcc, cuBLAS or NCCL not found"; }

targets=(bench_gpu_step)
for t in "$root"/tests/gpu/*_test.cpp; do targets+=("$(basename "$t" .cpp)"); done
step "building ${targets[*]} with -j$jobs"
cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$log_dir/build.log" 2>&1 ||
  { grep -E "error|Error" "$log_dir/build.log" | head -40; die "build failed (log: $log_dir/build.log)"; }

step "ctest -L gpu"
ctest --test-dir "$build" -L gpu --output-on-failure --timeout 600 2>&1 | tee "$log_dir/ctest.log"
ctest_rc=${PIPESTATUS[0]}
skipped="$(grep -c "(Skipped)" "$log_dir/ctest.log" || true)"
summary_tests="$(grep -E "tests passed|tests failed" "$log_dir/ctest.log" | tail -1)"

step "bench_gpu_step"
"$build/bench/bench_gpu_step" 2>&1 | tee "$log_dir/bench.log"
bench_rc=${PIPESTATUS[0]}

echo
echo "== gpu_check summary ($(($(date +%s) - start)) s)"
echo "GPU:    $gpus"
echo "tests:  ${summary_tests:-no ctest summary} (rc $ctest_rc, $skipped skipped)"
echo "bench:  rc $bench_rc (table above; log $log_dir/bench.log)"
status=0
((ctest_rc == 0)) || { echo "gpu_check: FAIL: gpu tests failed"; status=1; }
((skipped == 0)) || { echo "gpu_check: FAIL: $skipped gpu tests skipped although a GPU is present"; status=1; }
((bench_rc == 0)) || { echo "gpu_check: FAIL: bench_gpu_step failed"; status=1; }
grep -q "no CUDA device: skipping" "$log_dir/bench.log" &&
  { echo "gpu_check: FAIL: bench saw no CUDA device"; status=1; }
((status == 0)) && echo "gpu_check: PASS"
exit $status
