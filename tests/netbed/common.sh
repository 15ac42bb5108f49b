# Shared by the netbed tests (sourced): prerequisite checks with the ctest skip code, a
# watchdog, and the "nothing of this bed remains" assertion.
# shellcheck shell=bash

readonly kSkip=77  # SKIP_RETURN_CODE in tests/netbed/CMakeLists.txt

fail() { echo "FAIL: $*" >&2; exit 1; }
note() { echo "-- $*"; }

# Wall-clock helpers of the tests that run jobs on the bed: now (seconds since the epoch),
# after D (now + D), past U (0 once U has passed).
now() { date +%s.%N; }
after() { awk -v n="$(now)" -v d="$1" 'BEGIN { printf "%.3f", n + d }'; }
past() { awk -v n="$(now)" -v u="$1" 'BEGIN { exit !(n > u) }'; }

# 0 once process $1 (a child of this shell) has exited; its zombie counts as exited.
has_exited() {
  local state
  state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 0
  [[ -z $state || $state == Z ]]
}

# A missing prerequisite skips, except under CI=true where it must not go unnoticed.
skip_or_fail() {
  if [[ ${CI:-} == true ]]; then
    echo "FAIL: $* (CI=true: a skipped netbed test counts as a failure)" >&2
    exit 1
  fi
  echo "SKIP: $*" >&2
  exit "$kSkip"
}

require_bed_prerequisites() {
  [[ $(id -u) -eq 0 ]] || skip_or_fail "netbed needs root (network namespaces, tc); running as uid $(id -u)"
  command -v ip >/dev/null 2>&1 || skip_or_fail "iproute2 'ip' not found"
  command -v tc >/dev/null 2>&1 || skip_or_fail "iproute2 'tc' not found"
  ip netns list >/dev/null 2>&1 || skip_or_fail "'ip netns' is unavailable"
  local probe="nbprobe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    skip_or_fail "cannot create a network namespace (ip netns add failed)"
  fi
  ip netns del "$probe"
}

# A test that runs a desloc job on the bed: the bed's prerequisites, the desloc binary $1 and
# the corpus $2 the ctest fixture prepare_brown prepares.
require_job_prerequisites() {
  require_bed_prerequisites
  [[ -x $1 ]] || fail "no desloc binary at $1"
  [[ -f $2/dataset.toml ]] || skip_or_fail "no prepared corpus at $2 (ctest fixture prepare_brown)"
}

# Beds named <letter><pid> by an earlier run of these tests whose process is gone (for example
# killed by the ctest timeout) are removed, so they cannot break this run. Live ones are left.
sweep_stale_beds() {
  local netbed=$1 letter=$2 b pid
  for b in $(ip netns list | awk '{ print $1 }' | sed -nE "s/^nb-(${letter}[0-9]+)-bridge$/\1/p"); do
    pid=${b#"$letter"}
    if ! kill -0 "$pid" 2>/dev/null; then
      note "removing stale bed $b left by pid $pid"
      "$netbed" down --name "$b" >/dev/null || true
    fi
  done
}

# Fails unless no namespace and no device of bed $1 exists.
assert_nothing_left() {
  local bed=$1 what=$2 left
  left=$(ip netns list | awk '{ print $1 }' | grep -E "^nb-$bed-" || true)
  [[ -z $left ]] || fail "$what: namespaces remain: $(echo "$left" | tr '\n' ' ')"
  left=$(ip -o link show | awk -F': ' '{ print $2 }' | grep -E "^nb-$bed-" || true)
  [[ -z $left ]] || fail "$what: devices remain in the root namespace: $(echo "$left" | tr '\n' ' ')"
  note "$what: nothing of bed '$bed' remains"
}

# Sends TERM to this test after $1 seconds, so its EXIT trap still tears the bed down before
# ctest's TIMEOUT would kill it outright.
start_watchdog() {
  local secs=$1 self=$$
  (
    exec >/dev/null
    sleep "$secs" &
    local sleeper=$!
    trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
    wait "$sleeper"
    echo "FAIL: watchdog: test exceeded ${secs}s" >&2
    kill -TERM "$self"
  ) &
  watchdog_pid=$!
}

stop_watchdog() {
  if [[ -n ${watchdog_pid:-} ]]; then kill "$watchdog_pid" 2>/dev/null || true; fi
}
