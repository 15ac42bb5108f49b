#!/usr/bin/env bash
# netbed_replan: re-planning while training (sync.replan, issue 15 item 5) on a shaped bed of
# 2 sites, one rank each (2 workers on these 2 cores: steadier compute than 3), a real
# `desloc coordinator` + `desloc worker` job:
#   1. every link at kRateKbit; the sites measure their parameter averages;
#   2. B's egress is throttled 10x (netbed.sh rate): within kMaxSyncs averages of the first slow
#      one every site switches, at the same step, to a Kx at least 4x longer (the average
#      measured 5x-20x slower), predicted within the overhead target, and the mean step time
#      over the new plan's first cycle (Kv steps) is near its prediction (kStepTolerance);
#   3. B's rate is restored: the average measures near the first reference (within 1/2-4x) and
#      the sites switch back to a Kx a quarter of the slow one's or less;
#   4. the in-process run (`desloc train`) replaying the recorded switches (sync.switches) gives
#      every step's loss of both sites and the final validation loss, to the last printed digit.
# usage: netbed_replan_test.sh path/to/netbed.sh path/to/desloc path/to/brown
# (root; skips with 77, fails under CI=true; NETBED_KEEP=1 keeps the logs and prints where)
set -euo pipefail
export LC_ALL=C
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/netbed/common.sh
source "$here/common.sh"

netbed=${1:?usage: $0 netbed.sh desloc brown_dir}
desloc=${2:?usage: $0 netbed.sh desloc brown_dir}
brown=${3:?usage: $0 netbed.sh desloc brown_dir}

readonly kSteps=4000
readonly kKx=16
readonly kRateKbit=20000      # a parameter average of the tiny model takes about 0.04 s
readonly kSlowKbit=2000       # 10x slower
readonly kThrottleStep=240    # 15 averages in: the reference is long measured
readonly kMaxSyncs=3          # the new plan within this many averages of the throttle
# Measured step time against the new plan's prediction. The issue's target is 10%, and six
# runs measured 0.906-1.068; the test only guards against a plan that is plainly wrong, since
# this shared 2-core machine moves a step's time by several percent from run to run
# (performance is measured in the runs the docs report, not timed in tests).
readonly kStepTolerance=0.25
readonly kJobLimitS=240
readonly kPoll=0.05

require_job_prerequisites "$desloc" "$brown"
sweep_stale_beds "$netbed" q
bed="q$$"
tmp=$(mktemp -d)
pids=()
cleanup() {
  local rc=$? p
  stop_watchdog
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  "$netbed" down --name "$bed" >/dev/null 2>&1 || true
  if [[ ${NETBED_KEEP:-0} == 1 ]]; then echo "-- logs kept in $tmp" >&2; else rm -rf "$tmp"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
start_watchdog $((kJobLimitS + 120))

metrics=$tmp/out/metrics.jsonl  # the leader's (A/0)
# Field $2 of the records of type $1 in the leader's metrics, one line each.
fields() {
  [[ -f $metrics ]] || return 0
  { grep -F "\"type\":\"$1\"" "$metrics" || true; } | sed -nE "s/.*\"$2\":(\"[^\"]*\"|[^,}]*).*/\1/p"
}
leader_step() { fields train step | tail -n 1; }
logs() {
  local f
  for f in "$tmp"/*.log; do
    echo "==== $(basename "$f") (last lines)" >&2
    grep -vE '^step [0-9]+/' "$f" | tail -n 8 >&2
  done
}
die() { logs; fail "$*"; }
# Waits until the leader logged step $1, or the job limit.
reach() {
  while [[ $(leader_step) -lt $1 ]] 2>/dev/null || [[ -z $(leader_step) ]]; do
    has_exited "${pids[1]}" && die "the leader exited before step $1"
    past "$job_until" && die "the leader did not reach step $1 within ${kJobLimitS}s"
    sleep "$kPoll"
  done
}
# Waits until the leader's metrics hold $1 replan records.
replans() {
  while [[ $(fields replan step | wc -l) -lt $1 ]]; do
    has_exited "${pids[1]}" && die "the leader exited with $(fields replan step | wc -l) re-plan(s), expected $1"
    past "$job_until" && die "no re-plan number $1 within ${kJobLimitS}s of the launch"
    sleep "$kPoll"
  done
}

"$netbed" up --name "$bed" --sites A,B --default-rate "${kRateKbit}kbit" >/dev/null
addr=$("$netbed" env --name "$bed" --site A | sed -n 's/^DESLOC_SITE_ADDR=//p')
[[ -n $addr ]] || fail "could not read site A's address"

job_toml() {  # $1: extra [sync] lines
  cat <<TOML
[model]
vocab = 256
context = 32
layers = 2
heads = 2
d_model = 32
[optim]
clip = "norm"
clip_value = 1.0
[schedule]
lr = 0.01
warmup = 2
[data]
dir = "$brown"
batch = 32
seed = 7
[train]
steps = $kSteps
eval_every = 0
eval_batches = 4
checkpoint_every = 0
out_dir = "$tmp/out"
seed = 3
threads = 1
[sync]
method = "desloc"
kx = $kKx
$1
[job]
sites = ["A", "B"]
token = "netbed-replan"
rendezvous_timeout_s = 30
heartbeat_ms = 200
[transport]
net_devices = ""  # each namespace's UCX_NET_DEVICES, set by netbed exec
deadline_s = 30
TOML
}
job_toml $'replan = true\nreplan_drift = 3\nreplan_syncs = 2' >"$tmp/job.toml"

"$netbed" exec --name "$bed" --site A -- "$desloc" coordinator --config "$tmp/job.toml" \
  --listen "$addr:29561" >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do grep -q "listening on" "$tmp/coordinator.log" && break; sleep "$kPoll"; done
for s in A B; do
  "$netbed" exec --name "$bed" --site "$s" -- "$desloc" worker --config "$tmp/job.toml" \
    --site "$s" --rank 0 --coordinator "$addr:29561" --out-dir "$tmp/out" --no-progress \
    >"$tmp/$s.log" 2>&1 &
  pids+=($!)
done
job_until=$(after "$kJobLimitS")

# 1-2. Throttle B 10x; the first re-plan.
reach "$kThrottleStep"
[[ $(fields replan step | wc -l) -eq 0 ]] ||
  die "a re-plan before the throttle: $(fields replan reason | head -n 1)"
"$netbed" rate --name "$bed" --rate "B>A=${kSlowKbit}kbit" 2>/dev/null
throttled_at=$(leader_step)
note "B's egress at ${kSlowKbit} kbit/s (10x slower) from step $throttled_at"
replans 1
b1=$(fields replan step | head -n 1)
kx1=$(fields replan kx | head -n 1)
kv1=$(fields replan kv | head -n 1)
note "re-plan 1 after step $b1: kx $kKx -> $kx1, $(fields replan reason | head -n 1)"
# The new Kx follows from the measured average and the measured compute, and kKx is the
# config's, not a plan at this machine's compute speed, so the checks are on what the re-plan
# measured: the average 5x-20x slower than its reference (the link 10x slower; a CI run measured
# 14.7x and chose kx 350 with 5.2 ms of compute a step), a Kx at least 4x longer, and the
# predicted overhead at the new Kx within the target.
slowdown=$(awk -v s="$(fields replan state_s | head -n 1)" -v r="$(fields replan reference_s | head -n 1)" \
  'BEGIN { printf "%.2f", s / r }')
overhead1=$(fields replan overhead | head -n 1)
target1=$(fields replan target | head -n 1)
awk -v x="$slowdown" 'BEGIN { exit !(x >= 5 && x <= 20) }' ||
  die "a 10x slower link measured ${slowdown}x its reference, not within 5x-20x"
[[ $kx1 -ge $((4 * kKx)) ]] || die "a ${slowdown}x slower average made kx $kx1, not 4x $kKx or more"
awk -v o="$overhead1" -v t="$target1" 'BEGIN { exit !(o <= t * 1.001) }' ||
  die "kx $kx1 is predicted at $overhead1 of compute, beyond the target $target1"
# The averages from the first slow one to the one that decided, both counted. "Slow": its step
# took per state 6x the median before the throttle, twice the job's replan_drift, so that an
# average the throttle caught halfway, which the ranks may not have judged off, does not start
# the count early (the leader's metrics lag its steps a little, so the throttle's own step is no
# exact start either).
syncs=$(python3 - "$metrics" "$throttled_at" "$b1" <<'PY'
import json, statistics, sys
path, throttled, decided = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
avgs = [r for r in map(json.loads, open(path)) if r.get("type") == "train" and r["synced"]]
per_state = lambda r: r["step_ms"] / len(r["synced"])
before = [per_state(r) for r in avgs if r["step"] < throttled - 32]
ref = statistics.median(before)
slow = [r["step"] for r in avgs if r["step"] > throttled - 32 and per_state(r) > 6 * ref]
print(sum(1 for r in avgs if slow and slow[0] <= r["step"] <= decided) if slow else -1)
PY
)
note "re-plan 1 came at average $syncs from the first slow one, counting both (at most $kMaxSyncs)"
[[ $syncs -ge 1 && $syncs -le $kMaxSyncs ]] ||
  die "the re-plan came at average $syncs from the first slow one, not within $kMaxSyncs"

# One whole cycle of the new plan (Kv steps: x, u and v each averaged in their ratio), then its
# mean step time against the prediction.
reach $((b1 + kv1))
predicted=$(fields replan predicted_step_s | head -n 1)
measured=$({ grep -F '"type":"train"' "$metrics" || true; } |
  awk -v lo="$b1" -v hi=$((b1 + kv1)) '{
      step = $0; sub(/.*"step":/, "", step); sub(/,.*/, "", step)
      ms = $0; sub(/.*"step_ms":/, "", ms); sub(/[,}].*/, "", ms)
      if (step + 0 > lo && step + 0 <= hi) { sum += ms; n++ } }
    END { if (n) printf "%.5f", sum / n / 1000 }')
ratio=$(awk -v m="$measured" -v p="$predicted" 'BEGIN { printf "%.3f", m / p }')
note "steps $((b1 + 1))-$((b1 + kv1)) at kx $kx1: mean step $measured s against the" \
  "predicted $predicted s (ratio $ratio)"
awk -v r="$ratio" -v t="$kStepTolerance" 'BEGIN { exit !(r >= 1 - t && r <= 1 + t) }' ||
  die "the step time $measured s is not within $kStepTolerance of the predicted $predicted s"

# 3. Restore B; the plan comes back.
"$netbed" rate --name "$bed" --rate "B>A=${kRateKbit}kbit" 2>/dev/null
restored_at=$(leader_step)
note "B's egress back at ${kRateKbit} kbit/s from step $restored_at"
replans 2
b2=$(fields replan step | sed -n 2p)
kx2=$(fields replan kx | sed -n 2p)
note "re-plan 2 after step $b2: kx $kx1 -> $kx2, $(fields replan reason | sed -n 2p)"
# Back near the first plan: the averages of the long period each start after seconds of idle,
# when TCP restarts from slow start (the bed keeps Linux's tcp_slow_start_after_idle = 1), so
# the restored link measures slower than at the start (a full suite run: 0.060 s per state
# against 0.039 s, kx 28).
# As above the check is on the measurement: the restored average within 1/2-4x of the first
# plan's reference, and a Kx a quarter of the slow one's or less.
back=$(awk -v s="$(fields replan state_s | sed -n 2p)" -v r="$(fields replan reference_s | head -n 1)" \
  'BEGIN { printf "%.2f", s / r }')
awk -v x="$back" 'BEGIN { exit !(x >= 0.5 && x <= 4) }' ||
  die "the restored link measured ${back}x the first reference, not within 1/2-4x"
[[ $((kx2 * 4)) -le $kx1 ]] || die "the restored link made kx $kx2, not 1/4 of $kx1 or less"
for i in 1 2; do
  p=${pids[$i]}
  while ! has_exited "$p"; do
    past "$job_until" && die "the job did not finish within ${kJobLimitS}s"
    sleep "$kPoll"
  done
  status=0
  wait "$p" || status=$?
  [[ $status -eq 0 ]] || die "worker $i exited with $status"
done
# Every site switched at the same steps (each rank's log names its re-plans).
for s in A B; do
  got=$(grep -oE "re-planned after step [0-9]+: kx [0-9]+ -> [0-9]+" "$tmp/$s.log" | tr '\n' ' ')
  [[ $got == "re-planned after step $b1: kx $kKx -> $kx1 re-planned after step $b2: kx $kx1 -> $kx2 "* ]] ||
    die "site $s re-planned differently: $got"
done
val=$(fields eval val_loss | tail -n 1)

# 4. The in-process replay of the switches.
switches=$(paste -d' ' <(fields replan step) <(fields replan kx) <(fields replan ku) <(fields replan kv) |
  awk '{ printf "%s{ after = %s, kx = %s, ku = %s, kv = %s }", (NR > 1 ? ", " : ""), $1, $2, $3, $4 }')
job_toml "switches = [$switches]" | sed "s|out_dir = .*|out_dir = \"$tmp/replay\"|" >"$tmp/replay.toml"
"$desloc" train --no-progress --config "$tmp/replay.toml" >"$tmp/replay.log" 2>&1 ||
  die "the in-process replay failed: $(tail -n 3 "$tmp/replay.log")"
replayed=$(grep -F '"type":"eval"' "$tmp/replay/metrics.jsonl" | tail -n 1 | sed -nE 's/.*"val_loss":([^,}]*).*/\1/p')
note "final val_loss: networked $val, in-process replay of the switches $replayed"
[[ -n $val && $val == "$replayed" ]] || die "the replay's val_loss $replayed differs from the job's $val"
# Every step's loss of each site, as printed (9 digits): the leader's (A) and B's own metrics.
differ=$(python3 - "$metrics" "$tmp/out/ranks/B-0/metrics.jsonl" "$tmp/replay/metrics.jsonl" <<'PY'
import json, sys
def losses(path):
    return [json.loads(l)["loss_by_site"] for l in open(path) if '"type":"train"' in l]
a, b, ref = losses(sys.argv[1]), losses(sys.argv[2]), losses(sys.argv[3])
bad = [i + 1 for i, r in enumerate(ref) if i >= len(a) or i >= len(b) or a[i] != [r[0]] or b[i] != [r[1]]]
print(f"{len(bad)} of {len(ref)} steps differ" + (f", the first at step {bad[0]}" if bad else ""))
PY
)
note "site losses against the replay: $differ"
[[ $differ == "0 of $kSteps steps differ" ]] || die "the networked run and its replay differ: $differ"
note "PASS: throttle at step $throttled_at (average ${slowdown}x slower) -> kx $kx1 after step" \
  "$b1 (average $syncs from the first slow one); step $measured s vs predicted $predicted s;" \
  "restored at $restored_at -> kx $kx2 after step $b2 (average ${back}x the first reference)"
