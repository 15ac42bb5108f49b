#!/usr/bin/env bash
# netbed_profile: `desloc profile` on a 3-site heterogeneous bed (A-B 1 Gbit, B-C 300 Mbit,
# A-C 100 Mbit): a real coordinator in site A and one `desloc worker --profile` per site
# namespace. Every measured directed bandwidth must be within 5% of 0.956 x its configured
# rate (1 Gbit: at least 0.90, as in netbed_rates: two cores carry both TCP ends and the
# shaper), and `desloc plan` must accept the written topology.
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
start_watchdog 150

"$netbed" up --name "$bed" --sites A,B,C --rate A-B=1gbit,B-C=300mbit,A-C=100mbit >/dev/null
addr=$("$netbed" env --name "$bed" --site A | sed -n 's/^DESLOC_SITE_ADDR=//p')
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

"$netbed" exec --name "$bed" --site A -- "$desloc" coordinator --config "$tmp/job.toml" \
  --listen "$addr:29533" >"$tmp/coordinator.log" 2>&1 &
sleep 0.5
pids=()
for s in A B C; do
  "$netbed" exec --name "$bed" --site "$s" -- "$desloc" worker --config "$tmp/job.toml" \
    --site "$s" --rank 0 --coordinator "$addr:29533" --profile "$tmp/topology.toml" \
    >"$tmp/$s.log" 2>&1 &
  pids+=("$!")
done
for p in "${pids[@]}"; do
  wait "$p" || { tail -n 20 "$tmp"/*.log >&2; fail "a profiling rank failed"; }
done
[[ -f $tmp/topology.toml ]] || fail "no topology.toml written"
grep -E " -> " "$tmp/A.log" || true

# Every directed link against its configured rate.
python3 - "$tmp/topology.toml" "$kCeiling" "$kTolerance" "$gbit_min_ratio" <<'EOF' ||
import sys, tomllib
topo = tomllib.load(open(sys.argv[1], "rb"))
ceiling, tol, gbit_min = map(float, sys.argv[2:5])
rates = {frozenset("AB"): 1000, frozenset("BC"): 300, frozenset("AC"): 100}
bad = []
for link in topo["link"]:
    rate = rates[frozenset(link["from"] + link["to"])]
    ratio = link["bandwidth_mbit"] / (ceiling * rate)
    lo = gbit_min if rate >= 1000 else 1 - tol
    ok = lo <= ratio <= 1 + tol
    print(f"{link['from']} -> {link['to']}: {link['bandwidth_mbit']:.1f} Mbit/s = {ratio:.3f} x "
          f"0.956 x {rate} Mbit/s ({'ok' if ok else 'OUT OF BOUNDS'})")
    if not ok:
        bad.append(f"{link['from']}->{link['to']}")
if len(topo["site"]) != 3 or any(s["step_ms"] <= 0 for s in topo["site"]):
    bad.append("sites")
sys.exit(1 if bad else 0)
EOF
  fail "measured bandwidths outside the bounds"

"$desloc" plan --topology "$tmp/topology.toml" --config "$tmp/job.toml" --target-overhead 0.5 \
  >"$tmp/plan.txt" || { cat "$tmp/plan.txt" >&2; fail "plan refused the profiled topology"; }
grep -q "schedule: ring" "$tmp/plan.txt" || fail "plan printed no schedule"
note "profile within bounds; plan accepted it"
