#!/usr/bin/env bash
# netbed_link_fault: link faults on a shaped 3-site bed (one rank per site, coordinator in site A)
# against a real `desloc coordinator` + `desloc worker` job with job.on_site_failure = "continue":
#   blip      site C's link down for less than both deadlines, then up: the job rides through
#   cut       site C's link down for good: C is dropped, A and B finish, C exits non-zero
#   throttle  site C's egress cut to 1% of its rate mid-run: rides through or C is dropped; with a
#             round trip and the tuned timeouts C must be dropped by the straggler rule (its
#             heartbeats still arrive, so only the ranks' TCP backlogs can name it)
#   ingress   (only when named in NETBED_SCENARIOS; needs a round trip) A -> C and B -> C at
#             1%: C must be dropped as the straggler (by its inbound link, or its outbound:
#             the ACKs of C's own sends cross the throttled direction too)
#   slow      (only when named in NETBED_SCENARIOS; needs a round trip, else C's heartbeats
#             queue behind its data and it falls silent) C's egress at 1% under a deadline
#             no average reaches: the coordinator names C from the heartbeats, C's rate comes
#             back, and the job finishes in epoch 1
# Each survivor's final validation loss must be within kLossTolerance of the fault-free
# in-process run (`desloc train`); one row per scenario goes to <build>/fault_report.md, in the
# format of tests/integration/fault_test.cpp. Scenarios run in subshells: a failed one ends
# alone, the others still run and report; a rank that dies of a signal is no designed error.
# usage: netbed_link_fault_test.sh path/to/netbed.sh path/to/desloc path/to/brown [RTT [defaults]]
# RTT (e.g. 150ms) puts that round trip on every link (netbed.sh --rtt, held by desloc-netdelay
# next to the desloc binary). "defaults" leaves the job's heartbeat, deadline and recovery
# timeouts at desloc's defaults (`desloc config --defaults`), the ones a user who tunes nothing
# gets; the scenario limits grow with them.
# (root; skips with 77, fails under CI=true; NETBED_KEEP=1 keeps the logs and prints where)
set -euo pipefail
export LC_ALL=C  # printf %f with a decimal point
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/netbed/common.sh
source "$here/common.sh"

netbed=${1:?usage: $0 netbed.sh desloc brown_dir}
desloc=${2:?usage: $0 netbed.sh desloc brown_dir}
brown=${3:?usage: $0 netbed.sh desloc brown_dir}
rtt=${4:-}
timeouts=${5:-tuned}
[[ $timeouts == tuned || $timeouts == defaults ]] || fail "the 5th argument is 'defaults' or nothing"

# Losing one of three sites a third of the way in moves the final loss by a few hundredths of a
# nat (fault_test.cpp explains the bound); a broken recovery costs far more or fails outright.
readonly kLossTolerance=0.08  # as in tests/integration/fault_test.cpp
readonly kSteps=1500          # about 13 s fault-free on this bed (2 cores)
readonly kFaultStep=500       # the leader's step at which the fault is injected
readonly kRateKbit=5000       # every link; a parameter average takes about 0.11 s at this rate
if [[ $timeouts == tuned ]]; then
  readonly kHeartbeatMs=200
  readonly kHeartbeatTimeoutMs=3000
  readonly kDeadlineS=5       # transport.deadline_s: about 45 x a fault-free average
  readonly kRecoveryTimeoutS=10
  readonly kJobLimitS=90      # a scenario's whole job, launch to the last exit
  readonly kCutOffLimitS=60   # fault until the cut-off rank has exited
else                          # desloc's defaults, as `desloc config --defaults` prints them
  readonly kHeartbeatMs=500
  readonly kHeartbeatTimeoutMs=5000
  readonly kDeadlineS=60
  readonly kRecoveryTimeoutS=30
  readonly kJobLimitS=180
  readonly kCutOffLimitS=120
fi
readonly kBlipS=1.0           # below both the heartbeat timeout and the collective deadline
readonly kSlowDeadlineS=120   # slow: no average at 1% comes near it
readonly kSlowWarnS=20        # slow: the warning within this of the throttle
readonly kPoll=0.05

require_job_prerequisites "$desloc" "$brown"
sweep_stale_beds "$netbed" f
bed="f$$"
tmp=$(mktemp -d)
report=$(cd "$(dirname "$desloc")/.." && pwd)/fault_report.md
# Every process a scenario started, one pid a line (scenarios run in subshells).
pids_file=$tmp/pids
kill_started() {
  local p
  if [[ -f $pids_file ]]; then
    while read -r p; do kill -KILL "$p" 2>/dev/null || true; done <"$pids_file"
  fi
}
cleanup() {
  local rc=$?
  stop_watchdog
  if [[ -n ${scenario_pid:-} ]]; then kill -KILL "$scenario_pid" 2>/dev/null || true; fi
  kill_started
  "$netbed" down --name "$bed" >/dev/null 2>&1 || true
  if [[ ${NETBED_KEEP:-0} == 1 ]]; then echo "-- logs kept in $tmp" >&2; else rm -rf "$tmp"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
start_watchdog $((kJobLimitS * 3 + 60))

t_start=$(now)
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

bed_label=", 3 sites x 1 rank${rtt:+, round trip $rtt}$([[ $timeouts == tuned ]] || echo ", default timeouts")"
delays=()
if [[ -n $rtt ]]; then
  NETBED_NETDELAY=$(dirname "$desloc")/desloc-netdelay
  [[ -x $NETBED_NETDELAY ]] || fail "a round trip needs $NETBED_NETDELAY"
  export NETBED_NETDELAY
  delays=(--rtt "A-B=$rtt,A-C=$rtt,B-C=$rtt")
fi
"$netbed" up --name "$bed" --sites A,B,C --default-rate "${kRateKbit}kbit" "${delays[@]}" >/dev/null
addr=$("$netbed" env --name "$bed" --site A | sed -n 's/^DESLOC_SITE_ADDR=//p')
c_env=$("$netbed" env --name "$bed" --site C)
c_ns=$(sed -n 's/^NETBED_NETNS=//p' <<<"$c_env")
c_dev=$(sed -n 's/^UCX_NET_DEVICES=//p' <<<"$c_env")
[[ -n $addr && -n $c_ns && -n $c_dev ]] || fail "could not read the bed's addresses and devices"

cat >"$tmp/job.toml" <<EOF
# netbed_link_fault: the tiny model, DES-LOC, 3 sites x 1 rank on ${kRateKbit} kbit/s links
# (round trip ${rtt:-none}; $timeouts timeouts).
[model]
vocab = 256
context = 32
layers = 2
heads = 2
d_model = 32
[optim]
name = "adamw"
clip = "norm"
clip_value = 1.0
[schedule]
kind = "cosine"
lr = 0.01
warmup = 2
[data]
dir = "$brown"
batch = 4
seed = 7
[train]
steps = $kSteps
eval_every = 500
eval_batches = 2
checkpoint_every = 0
out_dir = "$tmp/out"
seed = 3
threads = 1
[sync]
method = "desloc"
kx = 32
[job]
sites = ["A", "B", "C"]
ranks_per_site = 1
token = "netbed-link-fault"
rendezvous_timeout_s = 30
heartbeat_ms = $kHeartbeatMs
heartbeat_timeout_ms = $kHeartbeatTimeoutMs
on_site_failure = "continue"
recovery_timeout_s = $kRecoveryTimeoutS
[transport]
net_devices = ""  # each namespace's UCX_NET_DEVICES, set by netbed exec
deadline_s = $kDeadlineS
EOF

# ---- helpers --------------------------------------------------------------------------------
# The last value of numeric field $3 in the records of type $2 of metrics file $1 (empty if none).
last_field() {
  [[ -f $1 ]] || return 0
  { grep -F "\"type\":\"$2\"" "$1" || true; } | tail -n 1 |
    sed -nE "s/.*\"$3\":(-?[0-9.eE+-]+).*/\1/p"
}

# Waits up to $2 s for process $1 (a child) to exit; sets `status` to its exit code, or kills it
# and sets status=killed.
wait_exit() {
  local pid=$1 until
  until=$(after "$2")
  while ! has_exited "$pid"; do
    if past "$until"; then
      kill -KILL "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      status=killed
      return 0
    fi
    sleep "$kPoll"
  done
  status=0
  wait "$pid" 2>/dev/null || status=$?
}

# Prints the time at which file $1 first contains extended regex $2, polling for up to $3 s;
# prints nothing if it never does.
wait_for_line() {
  local until
  until=$(after "$3")
  while ! grep -qE "$2" "$1" 2>/dev/null; do
    past "$until" && return 0
    sleep "$kPoll"
  done
  now
}

# Ends the current scenario (a subshell) as failed, with the tails of its logs.
fail_scn() {
  local f
  for f in "$tmp/$scn"/*.log; do
    [[ -f $f ]] || continue
    echo "==== $scn/$(basename "$f") (last lines, progress and backtrace frames left out)" >&2
    grep -vE '^step [0-9]+/|^ *[0-9]+ +/' "$f" | tail -n 12 >&2
  done
  echo "$*" >"$tmp/$scn/failure"
  fail "$scn: $*"
}

# A failed check that does not end the scenario; the test fails at the end.
problem() {
  local line
  line="$scn: $(echo "$*" | tr '\n' ' ')"
  echo "$line" >>"$tmp/problems"
  echo "PROBLEM: $line" >&2
}

# Starts the coordinator (in site A) and one worker per site for scenario $scn on port $1.
declare -A worker=()
launch() {  # $1: port, $2: config (default $tmp/job.toml)
  local port=$1 config=${2:-$tmp/job.toml} s
  mkdir -p "$tmp/$scn"
  "$netbed" exec --name "$bed" --site A -- "$desloc" coordinator --config "$config" \
    --listen "$addr:$port" >"$tmp/$scn/coordinator.log" 2>&1 &
  coordinator=$!
  echo "$coordinator" >>"$pids_file"
  [[ -n $(wait_for_line "$tmp/$scn/coordinator.log" "listening on" 10) ]] ||
    fail_scn "the coordinator did not start listening on $addr:$port"
  for s in A B C; do
    "$netbed" exec --name "$bed" --site "$s" -- "$desloc" worker --config "$config" \
      --site "$s" --rank 0 --coordinator "$addr:$port" --out-dir "$tmp/$scn/out" --no-progress \
      >"$tmp/$scn/$s.log" 2>&1 &
    worker[$s]=$!
    echo "$!" >>"$pids_file"
  done
  job_until=$(after "$kJobLimitS")
}

# Seconds left of the scenario's job limit (at least 1).
job_left() {
  awk -v u="$job_until" -v n="$(now)" 'BEGIN { d = u - n; printf "%d", d < 1 ? 1 : d }'
}

# Blocks until the leader (A/0) has logged step $1.
reach() {
  local at
  while :; do
    at=$(last_field "$tmp/$scn/out/metrics.jsonl" train step)
    [[ ${at:-0} -ge $1 ]] && return 0
    has_exited "${worker[A]}" && fail_scn "the leader exited before step $1"
    past "$job_until" && fail_scn "the leader did not reach step $1 within ${kJobLimitS}s"
    sleep "$kPoll"
  done
}

leader_step() { last_field "$tmp/$scn/out/metrics.jsonl" train step; }

# The leader finished every step within kLossTolerance of the reference; sets loss_delta and
# bytes_resent.
check_finished() {
  local step val
  step=$(leader_step)
  [[ ${step:-0} -eq $kSteps ]] || fail_scn "the leader logged step ${step:-none}, not $kSteps"
  val=$(last_field "$tmp/$scn/out/metrics.jsonl" eval val_loss)
  [[ -n $val ]] || fail_scn "no eval record in the leader's metrics"
  loss_delta=$(awk -v v="$val" -v r="$ref_loss" 'BEGIN { printf "%+.4f", v - r }')
  awk -v d="$loss_delta" -v t="$kLossTolerance" 'BEGIN { exit !(d <= t && -d <= t) }' ||
    fail_scn "final val_loss $val is $loss_delta nats from the fault-free $ref_loss" \
      "(tolerance $kLossTolerance)"
  bytes_resent=$(last_field "$tmp/$scn/out/metrics.jsonl" recovery bytes_resent)
  bytes_resent=${bytes_resent:-0}
}

# The coordinator leaves once every rank has left; it must not outlive the job by much.
finish_coordinator() {
  wait_exit "$coordinator" 15
  [[ $status != killed ]] || fail_scn "the coordinator did not exit after the job (killed)"
}

# After a fault ($1 names it) that must change nothing: every rank exits 0 in epoch 1, the
# coordinator too, and the leader finished (check_finished).
expect_rode_through() {
  local s
  for s in A B C; do
    wait_exit "${worker[$s]}" "$(job_left)"
    [[ $status == 0 ]] || fail_scn "rank $s/0 exited with $status after $1"
  done
  finish_coordinator
  ! grep -q "closing membership epoch" "$tmp/$scn/coordinator.log" ||
    fail_scn "$1 changed the membership:" "$(grep 'membership epoch' "$tmp/$scn/coordinator.log")"
  check_finished
}

# scenario detect recover delta bytes outcome ("-" for a time that does not apply)
row() {
  printf '| %s | %s | %s | %s | %.0f | %s |\n' "$@" >>"$tmp/rows"
  echo "fault report: $(tail -n 1 "$tmp/rows")"
}

# After a fault at $1: the coordinator closes epoch 1 and opens epoch 2 with exactly A and B.
# Sets detect_s and recover_s.
expect_c_dropped() {
  local fault_at=$1 closed opened log=$tmp/$scn/coordinator.log
  closed=$(wait_for_line "$log" "closing membership epoch 1:" \
    $((kDeadlineS + kHeartbeatTimeoutMs / 1000 + 10)))
  [[ -n $closed ]] || fail_scn "the coordinator never closed epoch 1"
  opened=$(wait_for_line "$log" "opening membership epoch 2 |recovery of epoch 1 failed" \
    $((kRecoveryTimeoutS + 15)))
  [[ -n $opened ]] || fail_scn "the coordinator neither opened epoch 2 nor ended the job"
  grep -q "opening membership epoch 2 with 2 site(s) \[A, B\]" "$log" ||
    fail_scn "epoch 2 is not [A, B]: $(grep -E 'membership epoch 2|recovery of epoch' "$log");" \
      "survivors: $(grep -HE 'Assertion|error:' "$tmp/$scn/A.log" "$tmp/$scn/B.log" |
        sed "s|^$tmp/$scn/||" | head -n 2 | tr '\n' ' ')"
  detect_s=$(elapsed "$fault_at" "$closed")
  recover_s=$(elapsed "$fault_at" "$opened")
  note "$scn: $(grep -oE 'closing membership epoch 1: [^;]*' "$log")"
}

# After C was dropped (fault at $1): A and B finish with 0 after rolling back, and C leaves
# with an error within kCutOffLimitS of the fault. Sets c_outcome.
expect_survivors_finish() {
  local fault_at=$1 s left c_status c_exit_s sig
  for s in A B; do
    wait_exit "${worker[$s]}" "$(job_left)"
    [[ $status == 0 ]] || fail_scn "survivor $s/0 exited with $status after C was dropped"
    grep -q "rolled back to step" "$tmp/$scn/$s.log" || fail_scn "survivor $s/0 did not roll back"
  done
  left=$(awk -v f="$fault_at" -v n="$(now)" -v lim="$kCutOffLimitS" \
    'BEGIN { d = lim - (n - f); printf "%d", d < 1 ? 1 : d }')
  wait_exit "${worker[C]}" "$left"
  c_status=$status
  c_exit_s=$(elapsed "$fault_at" "$(now)")
  [[ $c_status != killed ]] ||
    fail_scn "the cut-off rank C/0 was still running ${kCutOffLimitS}s after the fault (killed)"
  [[ $c_status != 0 ]] || fail_scn "the cut-off rank C/0 exited 0 although C was dropped"
  if [[ $c_status -ge 128 ]]; then
    # A crash is no designed error; the other checks of this scenario still run.
    sig=SIG$(kill -l $((c_status - 128)))
    c_outcome="C/0 died of $sig after ${c_exit_s} s"
    problem "the cut-off rank C/0 died of $sig ${c_exit_s}s after the fault instead of leaving" \
      "with an error: $(grep -vE '^step [0-9]+/|^ *[0-9]+ +/|^=+' "$tmp/$scn/C.log" | tail -n 3)"
  else
    c_outcome="C/0 exited $c_status after ${c_exit_s} s"
    note "$scn: C/0 exited $c_status ${c_exit_s}s after the fault:" \
      "$(grep -E 'error' "$tmp/$scn/C.log" | tail -n 1)"
  fi
}

# ---- scenarios (each runs in a subshell; a failure ends only that scenario) ------------------

# blip: C's link down for less than both the heartbeat timeout and the collective deadline.
scenario_blip() {
  local fault_at
  launch 29541
  reach $kFaultStep
  ip -n "$c_ns" link set "$c_dev" down
  fault_at=$(now)
  sleep "$kBlipS"
  ip -n "$c_ns" link set "$c_dev" up
  note "$scn: C's link was down for ${kBlipS}s from step $(leader_step)"
  expect_rode_through "a ${kBlipS}s link blip"
  row "netbed: site link down ${kBlipS} s (under heartbeat timeout and deadline)$bed_label" \
    - - "$loss_delta" "$bytes_resent" "rode through, every rank finished"
  note "$scn: rode through ($(elapsed "$fault_at" "$(now)") s from the fault to the end)"
}

# cut: C's link down for good.
scenario_cut() {
  local fault_at
  launch 29542
  reach $kFaultStep
  ip -n "$c_ns" link set "$c_dev" down
  fault_at=$(now)
  note "$scn: C's link down for good at step $(leader_step)"
  expect_c_dropped "$fault_at"
  expect_survivors_finish "$fault_at"
  finish_coordinator
  check_finished
  row "netbed: site link down for good$bed_label" "$detect_s" "$recover_s" \
    "$loss_delta" "$bytes_resent" "dropped C, finished on 2 sites; $c_outcome"
}

# C's egress (every htb class) at $1 kbit/s.
set_c_rate() {
  local cls
  for cls in $(tc -n "$c_ns" class show dev "$c_dev" | awk '$1 == "class" && $2 == "htb" { print $3 }'); do
    # quantum: at least one MTU (the default, rate / r2q, is below it at 1% of the rate)
    tc -n "$c_ns" class change dev "$c_dev" parent 1: classid "$cls" htb \
      rate "${1}kbit" ceil "${1}kbit" quantum 1514
  done
}

# slow: C's egress at 1% under a deadline far beyond its averages (kSlowDeadlineS), so nothing
# fails: the coordinator must still name C from the heartbeats' TCP backlogs, within
# kSlowWarnS; then C's rate comes back, the all-clear follows and every rank finishes in epoch 1.
scenario_slow() {
  local fault_at warned named cleared
  sed "s/^deadline_s = .*/deadline_s = $kSlowDeadlineS/" "$tmp/job.toml" >"$tmp/slow.toml"
  launch 29544 "$tmp/slow.toml"
  reach $kFaultStep
  set_c_rate "$slow_kbit"
  fault_at=$(now)
  note "$scn: C's egress at ${slow_kbit} kbit/s (1%) from step $(leader_step)," \
    "deadline ${kSlowDeadlineS}s"
  warned=$(wait_for_line "$tmp/$scn/coordinator.log" "site C's outbound link is slow" "$kSlowWarnS")
  [[ -n $warned ]] || fail_scn "no slow-link warning within ${kSlowWarnS}s of the throttle"
  named=$(grep -oE "site C's outbound link is slow: .* Nothing failed" \
    "$tmp/$scn/coordinator.log" | head -n 1)
  note "$scn: named after $(elapsed "$fault_at" "$warned") s: ${named% Nothing failed}"
  set_c_rate "$kRateKbit"
  cleared=$(wait_for_line "$tmp/$scn/coordinator.log" "site C's TCP backlog is back in line" \
    "$kSlowDeadlineS")
  [[ -n $cleared ]] || fail_scn "no all-clear after C's rate came back"
  expect_rode_through "a slow link within the deadline"
  row "netbed: site egress at 1% (${slow_kbit} kbit/s) within a ${kSlowDeadlineS} s deadline, then restored$bed_label" \
    "$(elapsed "$fault_at" "$warned")" - "$loss_delta" "$bytes_resent" \
    "named C live (heartbeats' TCP backlog), rode through, every rank finished"
}

# throttle: C's whole egress at 1% of its rate; either outcome is allowed, but it must be one.
scenario_throttle() {
  local fault_at s outcome d=- r=-
  launch 29543
  reach $kFaultStep
  set_c_rate "$slow_kbit"
  fault_at=$(now)
  note "$scn: C's egress at ${slow_kbit} kbit/s (1%) from step $(leader_step)"
  while ! grep -q "closing membership epoch" "$tmp/$scn/coordinator.log"; do
    if has_exited "${worker[A]}" && has_exited "${worker[B]}" && has_exited "${worker[C]}"; then
      break
    fi
    past "$job_until" &&
      fail_scn "neither finished nor changed the membership within ${kJobLimitS}s of the launch"
    sleep "$kPoll"
  done
  if grep -q "closing membership epoch" "$tmp/$scn/coordinator.log"; then
    expect_c_dropped "$fault_at"
    local why
    # Either end: at 1% C's egress also starves the ACKs of what A and B send C, so their
    # backlogs toward C grow too, and which evidence is the longest depends on timing (the
    # full suite once dropped C by its inbound link here).
    why=$(grep -oE "(site C's [^:]*|the TCP data other sites sent to site C [^:]*): its (outbound|inbound) link is the straggler" \
      "$tmp/$scn/coordinator.log" || true)
    [[ -n $why || -z $rtt || $timeouts == defaults ]] ||
      fail_scn "C was dropped, but not as the straggler: $(grep -oE 'dropping site C|site C [^;]*' \
        "$tmp/$scn/coordinator.log" | head -n 1)"
    [[ -z $why ]] || note "$scn: ${why%%: its *}"
    expect_survivors_finish "$fault_at"
    outcome="dropped C${why:+ (the straggler)}, finished on 2 sites; $c_outcome"
    d=$detect_s r=$recover_s
  else
    for s in A B C; do
      wait_exit "${worker[$s]}" 1
      [[ $status == 0 ]] || fail_scn "rank $s/0 exited with $status without a membership change"
    done
    outcome="rode through at 1%, every rank finished"
  fi
  finish_coordinator
  check_finished
  note "$scn: $outcome"
  row "netbed: site egress throttled to 1% (${slow_kbit} kbit/s)$bed_label" "$d" "$r" \
    "$loss_delta" "$bytes_resent" "$outcome"
}

# ingress: what A and B send to C at 1% past the deadline (only when named in NETBED_SCENARIOS;
# needs a round trip, so that the sites' addresses differ and the timeouts are tuned). C's own
# sockets drain; A's and B's back up toward C: the straggler rule must drop C by its inbound
# link, not A or B, and A and B finish.
scenario_ingress() {
  local fault_at why
  [[ -n $rtt && $timeouts == tuned ]] || fail_scn "ingress needs a round trip and tuned timeouts"
  launch 29545
  reach $kFaultStep
  "$netbed" rate --name "$bed" --rate "A>C=${slow_kbit}kbit,B>C=${slow_kbit}kbit" >/dev/null
  fault_at=$(now)
  note "$scn: A -> C and B -> C at ${slow_kbit} kbit/s (1%) from step $(leader_step)"
  expect_c_dropped "$fault_at"
  # Either end, as with `throttle`: A's and B's slow data toward C also starves the ACKs of
  # what C sends them.
  why=$(grep -oE "(the TCP data other sites sent to site C [^:]*|site C's [^:]*): its (inbound|outbound) link is the straggler" \
    "$tmp/$scn/coordinator.log" || true)
  [[ -n $why ]] ||
    fail_scn "C was dropped, but not as the straggler: $(grep -oE \
      'dropping site C|closing membership epoch 1: [^;]*;[^;]*' "$tmp/$scn/coordinator.log" |
      head -n 2)"
  note "$scn: $why"
  expect_survivors_finish "$fault_at"
  "$netbed" rate --name "$bed" --rate "A>C=${kRateKbit}kbit,B>C=${kRateKbit}kbit" >/dev/null
  finish_coordinator
  check_finished
  row "netbed: site ingress throttled to 1% (${slow_kbit} kbit/s)$bed_label" "$detect_s" \
    "$recover_s" "$loss_delta" "$bytes_resent" \
    "dropped C (the straggler, by its inbound link), finished on 2 sites; $c_outcome"
}

# ---- the fault-free reference ---------------------------------------------------------------
"$desloc" train --no-progress --config "$tmp/job.toml" --out-dir "$tmp/reference" \
  >"$tmp/reference.log" 2>&1 || { tail -n 20 "$tmp/reference.log" >&2; fail "the reference run failed"; }
ref_loss=$(last_field "$tmp/reference/metrics.jsonl" eval val_loss)
[[ -n $ref_loss ]] || fail "the reference run wrote no eval record"
note "fault-free reference (in-process): val_loss $ref_loss after $kSteps steps"

slow_kbit=$((kRateKbit / 100))
failed=()
for scn in ${NETBED_SCENARIOS:-blip cut throttle}; do  # throttle last: it leaves C's shaping changed
  rc=0
  ( "scenario_$scn" ) &
  scenario_pid=$!
  wait "$scenario_pid" || rc=$?
  scenario_pid=
  kill_started
  ip -n "$c_ns" link set "$c_dev" up  # a failed cut leaves it down
  if [[ $rc -ne 0 ]]; then
    failed+=("$scn")
    row "netbed: $scn" - - - 0 "FAILED: $(cat "$tmp/$scn/failure" 2>/dev/null || echo "exit $rc")"
  fi
done

# ---- report ---------------------------------------------------------------------------------
# Only the rows of scenarios that ran to their end go to the report.
[[ -f $report ]] || printf '%s\n%s\n' \
  "| scenario | detection (s) | recovery (s) | loss delta (nats) | bytes re-sent | outcome |" \
  "|---|---|---|---|---|---|" >"$report"
grep -v "| FAILED: " "$tmp/rows" >>"$report" || true
echo
echo "| scenario | detection (s) | recovery (s) | loss delta (nats) | bytes re-sent | outcome |"
echo "|---|---|---|---|---|---|"
cat "$tmp/rows"
note "rows appended to $report; total $(elapsed "$t_start" "$(now)") s"
[[ ${#failed[@]} -eq 0 ]] || fail "scenario(s) failed: ${failed[*]}"
if [[ -s $tmp/problems ]]; then
  sed 's/^/FAIL: /' "$tmp/problems" >&2
  exit 1
fi
