#!/usr/bin/env bash
# netbed_cleanup: whatever happens to 'up' (bad arguments, a failure half way, a second 'up' of
# the same bed, processes left inside), 'down' leaves no namespace or device behind.
# usage: netbed_cleanup_test.sh path/to/netbed.sh     (root; skips with 77, fails under CI=true)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/netbed/common.sh
source "$here/common.sh"

netbed=${1:?usage: $0 path/to/netbed.sh}
require_bed_prerequisites
sweep_stale_beds "$netbed" c
bed="c$$"

tmp=$(mktemp -d)
cleanup() {
  local rc=$?
  stop_watchdog
  "$netbed" down --name "$bed" >/dev/null || true
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
start_watchdog 50

# Runs `netbed.sh up` with the given arguments and expects it to fail, mentioning $1.
expect_up_fails() {
  local want=$1; shift
  if "$netbed" up --name "$bed" "$@" >"$tmp/out" 2>&1; then
    fail "up $* succeeded; expected a failure mentioning '$want'"
  fi
  grep -q -- "$want" "$tmp/out" || fail "up $* failed without mentioning '$want': $(cat "$tmp/out")"
  note "up $* failed as expected: $(grep -m1 -- "$want" "$tmp/out")"
}

# 1. Bad rate strings and names are refused before anything is made.
expect_up_fails "bad rate '100mbps'" --sites A,B,C --rate A-B=100mbps
expect_up_fails "unknown site 'D'" --sites A,B,C --rate A-D=100mbit
expect_up_fails "different rates per destination" --sites A,B,C --rate A-B=100mbit --shaper tbf
assert_nothing_left "$bed" "after refused arguments"

# 2. A failure half way through (after namespaces and veths, after shaping) removes it all.
for point in after-veth after-shaping; do
  NETBED_FAIL_AT=$point expect_up_fails "NETBED_FAIL_AT=$point" --sites A,B,C --rate A-B=100mbit
  assert_nothing_left "$bed" "after a failure at $point"
done

# 3. A real tc error (a rate tc rejects) in the middle of shaping also cleans up.
expect_up_fails "failed" --sites A,B --rate A-B=0bit
assert_nothing_left "$bed" "after tc rejected a rate"

# 4. A second 'up' of a live bed is refused and does not tear the live bed down.
"$netbed" up --name "$bed" --sites A,B --rate A-B=50mbit --shaper tbf >/dev/null
expect_up_fails "already exists" --sites A,B
"$netbed" status --name "$bed" >/dev/null || fail "a refused second up removed the live bed"

# 5. 'down' terminates processes still inside the bed, then removes it; a second 'down' is a
#    no-op that succeeds.
"$netbed" exec --name "$bed" --site A -- sleep 300 &
sleeper=$!
for _ in $(seq 50); do
  [[ -n $(ip netns pids "nb-$bed-s-A") ]] && break
  sleep 0.1
done
[[ -n $(ip netns pids "nb-$bed-s-A") ]] || fail "exec did not start a process in site A"
"$netbed" down --name "$bed"
wait "$sleeper" 2>/dev/null || true
kill -0 "$sleeper" 2>/dev/null && fail "process $sleeper inside the bed survived down"
assert_nothing_left "$bed" "after down with a process inside"
"$netbed" down --name "$bed" >"$tmp/out" || fail "second down failed: $(cat "$tmp/out")"
grep -q "nothing to remove" "$tmp/out" || fail "second down: $(cat "$tmp/out")"

# 6. Without root, every command that changes the system refuses with a clear message.
nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
if ! command -v setpriv >/dev/null 2>&1; then
  note "setpriv not found; non-root refusal not checked"
elif ! "${nobody[@]}" test -r "$netbed"; then
  note "uid 65534 cannot read $netbed (checkout not world-readable); non-root refusal not checked"
else
  for cmd in "up --name $bed --sites A,B" "down --name $bed" "status --name $bed" \
             "env --name $bed --site A" "exec --name $bed --site A -- true"; do
    # shellcheck disable=SC2086  # $cmd is split into arguments on purpose
    if "${nobody[@]}" bash "$netbed" $cmd >"$tmp/out" 2>&1; then
      fail "'$cmd' as uid 65534 succeeded"
    fi
    grep -q "must run as root" "$tmp/out" || fail "'$cmd' as non-root: unclear refusal: $(cat "$tmp/out")"
  done
  note "non-root refused: $(cat "$tmp/out")"
  assert_nothing_left "$bed" "after non-root commands"
fi
echo "PASS"
