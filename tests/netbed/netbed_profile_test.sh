#!/usr/bin/env bash
# netbed_profile: `desloc profile` on a 3-site heterogeneous bed (A-B 1 Gbit, B-C 300 Mbit,
# A-C 100 Mbit): a real coordinator in site A and one `desloc worker --profile` per site
# namespace, with round trips of 40, 10 and 60 ms. Every measured directed bandwidth must be
# within -5% and +5% of 0.956 x its configured rate (1 Gbit: at least 0.90, as in netbed_rates: two cores
# carry both TCP ends and the shaper), every round trip within max(5%, 1 ms) of the configured
# one, and `desloc plan` must accept the written topology. Then a 1 Gbit, 40 ms pair with Linux's
# default TCP buffers: the profile must name that link as window-limited.
# usage: netbed_profile_test.sh path/to/netbed.sh path/to/desloc path/to/brown
# (root; skips with 77, fails under CI=true)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/netbed/common.sh
source "$here/common.sh"

netbed=${1:?usage: $0 netbed.sh desloc brown_dir}
desloc=${2:?usage: $0 netbed.sh desloc brown_dir}
brown=${3:?usage: $0 netbed.sh desloc brown_dir}
readonly kCeiling=0.956
readonly kTolerance=0.05
# Above the rate: the profile once stopped doubling its transfer at 1 MiB when a first transfer
# was slowed (slow start, a stalled core), and the shaper's burst then made a 100 Mbit, 60 ms
# link measure 1.07-1.11 x. It now sizes on the faster of two transfers (profile.cpp); what is
# left of the burst in a transfer of at least 0.5 s is under 2%.
readonly kUpperTolerance=0.05
gbit_min_ratio=${NETBED_GBIT_MIN_RATIO:-0.90}

require_bed_prerequisites
[[ -f $brown/dataset.toml ]] || skip_or_fail "no prepared corpus at $brown (ctest fixture prepare_brown)"
sweep_stale_beds "$netbed" p
bed="p$$"
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
start_watchdog 240

# Round trips differ per link; 32 MiB TCP buffers cover every link's bandwidth-delay product
# (1 Gbit x 40 ms = 5 MB would not fit Linux's default 4 MiB send buffer: tcp_window.hpp).
"$netbed" up --name "$bed" --sites A,B,C --rate A-B=1gbit,B-C=300mbit,A-C=100mbit \
  --rtt A-B=40ms,B-C=10ms,A-C=60ms --tcp-buffer 33554432 >/dev/null
cat >"$tmp/job.toml" <<EOF
[model]
vocab = 256
context = 32
layers = 1
heads = 2
d_model = 32
[data]
dir = "$brown"
batch = 4
[train]
threads = 1
out_dir = "$tmp/out"
[sync]
method = "desloc"
[job]
sites = ["A", "B", "C"]
token = "profile-test"
rendezvous_timeout_s = 30
[transport]
net_devices = ""
deadline_s = 60
EOF

# Profiles bed $bed's sites $@ with a real coordinator in the first site; topology.toml in $tmp.
run_profile() {
  local first=$1 s p port=$((29533 + RANDOM % 1000))
  local addr pids=()
  addr=$("$netbed" env --name "$bed" --site "$first" | sed -n 's/^DESLOC_SITE_ADDR=//p')
  rm -f "$tmp/topology.toml"
  "$netbed" exec --name "$bed" --site "$first" -- "$desloc" coordinator --config "$tmp/job.toml" \
    --listen "$addr:$port" >"$tmp/coordinator.log" 2>&1 &
  sleep 0.5
  for s in "$@"; do
    "$netbed" exec --name "$bed" --site "$s" -- "$desloc" worker --config "$tmp/job.toml" \
      --site "$s" --rank 0 --coordinator "$addr:$port" --profile "$tmp/topology.toml" \
      >"$tmp/$s.log" 2>&1 &
    pids+=("$!")
  done
  for p in "${pids[@]}"; do
    wait "$p" || { tail -n 20 "$tmp"/*.log >&2; fail "a profiling rank failed"; }
  done
  [[ -f $tmp/topology.toml ]] || fail "no topology.toml written"
}

run_profile A B C
grep -E " -> " "$tmp/A.log" || true

# Every directed link against its configured rate.
python3 - "$tmp/topology.toml" "$kCeiling" "$kTolerance" "$gbit_min_ratio" "$kUpperTolerance" <<'EOF' ||
import sys, tomllib
topo = tomllib.load(open(sys.argv[1], "rb"))
ceiling, tol, gbit_min, upper = map(float, sys.argv[2:6])
rates = {frozenset("AB"): 1000, frozenset("BC"): 300, frozenset("AC"): 100}
rtts = {frozenset("AB"): 40.0, frozenset("BC"): 10.0, frozenset("AC"): 60.0}
bad = []
for link in topo["link"]:
    pair = frozenset(link["from"] + link["to"])
    rate = rates[pair]
    ratio = link["bandwidth_mbit"] / (ceiling * rate)
    lo = gbit_min if rate >= 1000 else 1 - tol
    ok = lo <= ratio <= 1 + upper
    # The round trip within max(5%, 1 ms) of the configured one.
    rtt = 2 * link["latency_ms"]
    rtt_ok = abs(rtt - rtts[pair]) <= max(0.05 * rtts[pair], 1.0)
    print(f"{link['from']} -> {link['to']}: {link['bandwidth_mbit']:.1f} Mbit/s = {ratio:.3f} x "
          f"0.956 x {rate} Mbit/s ({'ok' if ok else 'OUT OF BOUNDS'}); round trip {rtt:.2f} ms "
          f"for {rtts[pair]:.0f} ms ({'ok' if rtt_ok else 'OUT OF BOUNDS'})")
    if not (ok and rtt_ok):
        bad.append(f"{link['from']}->{link['to']}")
# Every site's step time, and its noise (sd of ln step time: never exactly 0 on a real clock).
for s in topo["site"]:
    print(f"site {s['name']}: step {s['step_ms']:.3f} ms, noise {s.get('step_jitter', 'missing')}")
if len(topo["site"]) != 3 or any(s["step_ms"] <= 0 or not 0 < s.get("step_jitter", 0) < 2
                                 for s in topo["site"]):
    bad.append("sites")
sys.exit(1 if bad else 0)
EOF
  fail "measured bandwidths or sites outside the bounds"

# The plan of a long job: the tiny model's step (0.4 ms on an idle machine, a few ms under
# load) against 10-60 ms round trips needs Kx in the thousands for 50% overhead, beyond the
# default 600 steps (the plan refuses that, rightly; it failed this test on an idle machine).
sed 's/^\[train\]$/[train]\nsteps = 1000000/' "$tmp/job.toml" >"$tmp/plan_job.toml"
"$desloc" plan --topology "$tmp/topology.toml" --config "$tmp/plan_job.toml" --target-overhead 0.5 \
  >"$tmp/plan.txt" || { cat "$tmp/plan.txt" >&2; fail "plan refused the profiled topology"; }
grep -q "schedule: ring" "$tmp/plan.txt" || fail "plan printed no schedule"
note "profile within bounds; plan accepted it"
# Every site measured its steal: its streaming threads' CPU per MB they sent, which is never
# zero (16 MiB all-reduces through the kernel's TCP stack).
[[ $(grep -cE "^[ABC] +compute step [0-9.]+ ms, noise [0-9.]+ \(sd of ln step time\); steal [0-9.]+ ms per MB sent" "$tmp/A.log") -eq 3 ]] ||
  fail "the profile printed no steal for every site: $(grep -E "compute step" "$tmp/A.log")"
grep -E "^[ABC] +compute step" "$tmp/A.log" | grep -qE "steal 0\.00 ms" &&
  fail "a site's streaming threads measured no CPU: $(grep -E "compute step" "$tmp/A.log")"
note "profile measured the steal: $(grep -oE "^[ABC] +compute step.*per MB sent" "$tmp/A.log" | tr -s ' ' | paste -sd ';')"
# The bed keeps Linux's tcp_slow_start_after_idle = 1, and its links have 10-60 ms round trips.
grep -q "site A: net.ipv4.tcp_slow_start_after_idle = 1 with round trips up to" "$tmp/A.log" ||
  fail "the profile did not warn of slow start after idle: $(grep -i warn "$tmp/A.log")"
note "profile warned of slow start after idle"

# A long fat link with Linux's default buffers (send 4 MiB): 1 Gbit x 40 ms is 5 MB.
"$netbed" down --name "$bed" >/dev/null 2>&1
"$netbed" up --name "$bed" --sites A,B --default-rate 1gbit --rtt A-B=40ms >/dev/null
sed -i 's/^sites = .*/sites = ["A", "B"]/' "$tmp/job.toml"
run_profile A B
grep -E " -> |largest TCP" "$tmp/A.log" || true
grep -q "link A -> B: .*the window may be what limits this link" "$tmp/A.log" ||
  fail "the profile did not name the window-limited link A -> B: $(grep -i warn "$tmp/A.log")"
note "profile named the window-limited link: $(grep -o 'link A -> B: [^(]*' "$tmp/A.log" | head -1)"
