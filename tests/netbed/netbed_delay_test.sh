#!/usr/bin/env bash
# netbed_delay: the test bed's round trips, jitter, loss and throughput under delay
# (scripts/netbed.sh --rtt/--jitter/--loss, held by desloc-netdelay). A 3-site bed:
#   A-B  100 Mbit, round trip 40 ms (20 ms each way)
#   A>C  10 ms one way only (A-C round trip 10 ms), C>A loses 10% of its packets
#   B-C  round trip 20 ms with 2 ms of jitter each way
# Round trips are ping's user-to-user times (ping -U: its default kernel receive timestamp is
# taken before the INPUT hook where the delay is held, so it would miss the second half).
# usage: netbed_delay_test.sh path/to/netbed.sh   (NETBED_NETDELAY names the delay program;
#        root; skips with 77, fails under CI=true)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/netbed/common.sh
source "$here/common.sh"

netbed=${1:?usage: $0 path/to/netbed.sh}
readonly kRttTolerance=0.05  # |measured - configured| <= max(5%, 1 ms), as the profile's target,
readonly kRttSlackMs=1       # plus 3 standard errors of the mean (3 mdev / sqrt(pings)): a
                             # jittered pair's mean of 20 pings has a standard error near 0.6 ms
readonly kCeiling=0.956      # TCP payload / wire rate at MTU 1500
readonly kMinRatio=0.90      # 100 Mbit at 40 ms, 8 s including slow start: measured 0.97

require_bed_prerequisites
command -v ping >/dev/null 2>&1 || skip_or_fail "ping not found (Debian package iputils-ping)"
command -v iperf3 >/dev/null 2>&1 || skip_or_fail "iperf3 not found"
command -v iptables >/dev/null 2>&1 || skip_or_fail "iptables not found (Debian package iptables)"
[[ -x ${NETBED_NETDELAY:-} ]] || skip_or_fail "NETBED_NETDELAY does not name the built desloc-netdelay: '${NETBED_NETDELAY:-}'"
sweep_stale_beds "$netbed" d
bed="d$$"

tmp=$(mktemp -d)
cleanup() {
  local rc=$?
  stop_watchdog
  "$netbed" down --name "$bed" >/dev/null 2>&1 || true
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
start_watchdog 100

declare -A addr=([A]=10.77.0.1 [B]=10.77.0.2 [C]=10.77.0.3)

# A failure after the delay lines started removes them too: no namespace, no process.
if NETBED_FAIL_AT=after-delays "$netbed" up --name "$bed" --sites A,B --rtt A-B=40ms >"$tmp/out" 2>&1; then
  fail "up with NETBED_FAIL_AT=after-delays succeeded"
fi
assert_nothing_left "$bed" "after a failure at after-delays"
[[ ! -e /run/netbed-$bed ]] || fail "the delay logs /run/netbed-$bed remain after a failed up"

"$netbed" up --name "$bed" --sites A,B,C --rate A-B=100mbit \
  --rtt 'A-B=40ms,A>C=10ms,B-C=20ms' --jitter B-C=2ms --loss 'C>A=10%'
"$netbed" status --name "$bed" >"$tmp/status"
cat "$tmp/status"
grep -Eq '^B +A=20ms/0/0%' "$tmp/status" || fail "status does not show A's 20 ms into B"
grep -Eq '^A +.*C=0ms/0/10%' "$tmp/status" || fail "status does not show C's 10% loss into A"

# ping -U from $1 to $2: prints "avg mdev loss%".
ping_stats() {
  local out
  out=$("$netbed" exec --name "$bed" --site "$1" -- ping -U -q -n -c "${3:-20}" -i "${4:-0.05}" -W 2 "${addr[$2]}" || true)
  awk -F'[/ ]+' '/packet loss/ { for (i = 1; i <= NF; i++) if ($i ~ /%$/) loss = $i }
                 /rtt|round-trip/ { avg = $8; mdev = $10 }
                 END { sub(/%/, "", loss); print (avg == "" ? "none" : avg), (mdev == "" ? "none" : mdev), loss }' <<<"$out"
}

failures=0
check_rtt() {  # src dst want_ms [pings]
  local avg mdev loss verdict=ok n=${4:-20}
  read -r avg mdev loss < <(ping_stats "$1" "$2" "$n")
  [[ $avg != none ]] || fail "no round trip measured $1 -> $2"
  if ! awk -v m="$avg" -v w="$3" -v t="$kRttTolerance" -v s="$kRttSlackMs" -v sd="$mdev" -v n="$n" \
    'BEGIN { d = m - w; if (d < 0) d = -d; tol = w * t; if (tol < s) tol = s
             tol += 3 * sd / sqrt(n); exit !(d <= tol) }'; then
    verdict="OUT OF TOLERANCE"; failures=$((failures + 1))
  fi
  printf '%-6s %10s %12s %10s  %s\n' "$1<>$2" "$3" "$avg" "$mdev" "$verdict"
}

printf '%-6s %10s %12s %10s  %s\n' PAIR "WANT ms" "MEASURED ms" "MDEV ms" RESULT
check_rtt A B 40
check_rtt B A 40
check_rtt A C 10
check_rtt C B 20 100  # jittered: more pings for a tighter mean

# Jitter: two independent one-way delays of sigma 2 ms give a round-trip spread near 2.8 ms.
read -r avg mdev loss < <(ping_stats B C 60 0.03)
awk -v m="$mdev" 'BEGIN { exit !(m >= 1.0 && m <= 5.0) }' ||
  fail "B<>C round-trip mdev $mdev ms with 2 ms of jitter each way; want 1..5 ms"
note "jitter: B<>C mdev $mdev ms (2 ms sigma each way)"

# Loss: C>A drops 10% of what C sends to A (C's requests to A here; A's pings to C would lose
# 10% of their replies). Between A and B nothing may be lost.
read -r avg mdev loss < <(ping_stats C A 400 0.005)
awk -v l="$loss" 'BEGIN { exit !(l >= 5 && l <= 16) }' || fail "C -> A lost $loss% of 400 pings; want 5..16% (10% configured)"
note "loss: C -> A lost $loss% of 400 pings (10% configured)"
read -r avg mdev loss < <(ping_stats A B 200 0.005)
awk -v l="$loss" 'BEGIN { exit !(l <= 1) }' || fail "A -> B lost $loss% of 200 pings; no loss was configured there"

# Throughput under delay: 100 Mbit at 40 ms round trip, TCP over 8 s.
timeout 20 "$netbed" exec --name "$bed" --site B -- iperf3 -s -1 --forceflush -B "${addr[B]}" -p 5401 >"$tmp/server" 2>&1 &
server=$!
for _ in $(seq 50); do grep -q "listening" "$tmp/server" && break; sleep 0.1; done
timeout 20 "$netbed" exec --name "$bed" --site A -- \
  iperf3 -c "${addr[B]}" -p 5401 -t 8 --connect-timeout 3000 --json >"$tmp/client" ||
  fail "iperf3 A -> B failed: $(cat "$tmp/client" "$tmp/server")"
wait "$server" || true
bps=$(python3 -c 'import json, sys; print(int(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]))' "$tmp/client")
ratio=$(awk -v b="$bps" -v c="$kCeiling" 'BEGIN { printf "%.3f", b / (100e6 * c) }')
note "throughput: A -> B $(awk -v b="$bps" 'BEGIN { printf "%.1f", b / 1e6 }') Mbit/s at 100 Mbit and 40 ms, $ratio of 0.956 x rate"
awk -v r="$ratio" -v m="$kMinRatio" 'BEGIN { exit !(r >= m && r <= 1.05) }' ||
  fail "A -> B goodput $ratio of 0.956 x rate; want $kMinRatio..1.05"

[[ $failures -eq 0 ]] || fail "$failures round trip(s) outside tolerance"

# down stops every delay line (each reports what it did) and leaves nothing.
mapfile -t pids < <(for s in A B C; do ip netns pids "nb-$bed-s-$s"; done)
"$netbed" down --name "$bed" 2>"$tmp/down"
cat "$tmp/down"
grep -q "delays into B from A: delay 20.000 ms" "$tmp/down" || fail "down did not report B's delay line"
for pid in "${pids[@]}"; do
  ! kill -0 "$pid" 2>/dev/null || fail "process $pid of bed $bed is still running after down"
done
assert_nothing_left "$bed" "after down"
[[ ! -e /run/netbed-$bed ]] || fail "the delay logs /run/netbed-$bed remain after down"
echo "PASS"
