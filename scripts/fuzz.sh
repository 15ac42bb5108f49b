#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan + UBSan, into build-fuzz/), replays
# their seed corpus and regression inputs, then fuzzes each target for a bounded time on a
# scratch copy of its seeds. Fails if any target crashes, naming the target and the input.
#   ./scripts/fuzz.sh                 every target, DESLOC_FUZZ_SECONDS (default 20) s each
#   ./scripts/fuzz.sh wire shard      only these targets
# Crashing inputs are kept under build-fuzz/fuzz-artifacts/<target>/ (see docs/fuzzing.md).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${DESLOC_FUZZ_SECONDS:-20}"
jobs="${DESLOC_BUILD_JOBS:-$(nproc)}"
all_targets=(wire config topology checkpoint shard)
if (($# > 0)); then
  targets=("$@")
else
  targets=("${all_targets[@]}")
fi
for t in "${targets[@]}"; do
  if [[ ! -f tests/fuzz/fuzz_$t.cpp ]]; then
    echo "fuzz: unknown target '$t' (targets: ${all_targets[*]})" >&2
    exit 2
  fi
done

# Sanitizer reports with stacks; UBSan findings are fatal (the preset also builds with
# -fno-sanitize-recover=undefined).
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

start=$SECONDS
cmake --preset fuzz >/dev/null
cmake --build build-fuzz --target desloc_fuzz -j "$jobs"
echo "fuzz: build took $((SECONDS - start)) s"

work="$(mktemp -d "${TMPDIR:-/tmp}/desloc-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
artifacts="$PWD/build-fuzz/fuzz-artifacts"

failed=()
summary=()
for t in "${targets[@]}"; do
  bin="build-fuzz/tests/fuzz/fuzz_$t"
  inputs=("tests/fuzz/corpus/$t")
  [[ -d tests/fuzz/regressions/$t ]] && inputs+=("tests/fuzz/regressions/$t")
  mkdir -p "$artifacts/$t"

  # 1. Every seed and regression input once (-runs=0 fuzzes nothing). On a failure, find the
  #    input by running the files one at a time: libFuzzer does not name it when it loads a
  #    directory.
  if ! "$bin" -runs=0 -rss_limit_mb=2048 -timeout=10 "${inputs[@]}" >"$work/$t.replay.log" 2>&1; then
    culprit="(not reproduced one file at a time; see the log above)"
    while IFS= read -r -d '' f; do
      if ! "$bin" -rss_limit_mb=2048 -timeout=10 "$f" >/dev/null 2>&1; then
        culprit="$f"
        break
      fi
    done < <(find "${inputs[@]}" -type f -print0 | sort -z)
    tail -n 40 "$work/$t.replay.log"
    echo "fuzz: FAILED fuzz_$t on a checked-in input: $culprit" >&2
    echo "fuzz:   reproduce: $bin $culprit" >&2
    failed+=("fuzz_$t (replay: $culprit)")
    continue
  fi

  # 2. Fuzz on a scratch copy of the inputs, so the checked-in corpus never grows.
  corpus="$work/corpus-$t"
  mkdir -p "$corpus"
  find "${inputs[@]}" -type f -exec cp {} "$corpus/" \;
  # A dictionary of the format's keywords and edge values, where the target has one.
  dict=()
  [[ -f tests/fuzz/$t.dict ]] && dict=(-dict="tests/fuzz/$t.dict")
  t0=$SECONDS
  rc=0
  "$bin" "$corpus" "${dict[@]}" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$t/" >"$work/$t.log" 2>&1 || rc=$?
  elapsed=$((SECONDS - t0))
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -n 1)"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/$t.log" | tail -n 1)"
  size="$(find "$corpus" -type f | wc -l)"
  line="$(printf 'fuzz_%-11s %10s execs %7s exec/s %4d s  corpus %5d files' "$t" \
    "${execs:-?}" "${rate:-?}" "$elapsed" "$size")"
  echo "fuzz: $line"
  summary+=("$line")
  if ((rc != 0)); then
    crash="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$work/$t.log" | tail -n 1)"
    tail -n 60 "$work/$t.log"
    echo "fuzz: FAILED fuzz_$t (exit $rc); crashing input: ${crash:-(none written; see the log above)}" >&2
    echo "fuzz:   reproduce: $bin ${crash:-}" >&2
    echo "fuzz:   once fixed, keep it as tests/fuzz/regressions/$t/<name>" >&2
    failed+=("fuzz_$t (${crash:-exit $rc})")
  fi
done

echo "fuzz: ${#targets[@]} target(s), ${seconds} s each, $((SECONDS - start)) s in all"
for line in "${summary[@]}"; do echo "  $line"; done
if ((${#failed[@]} > 0)); then
  echo "fuzz: ${#failed[@]} target(s) failed:" >&2
  for f in "${failed[@]}"; do echo "  $f" >&2; done
  exit 1
fi
