#!/usr/bin/env bash
# bench_unequal_sites: sites of unequal compute on the shaped test bed (issue 38). Three sites
# (one network namespace each, one rank per site) joined by shaped links train the quickstart
# model for the same wall-clock budget, between the two ends of the scale:
#   alone    the fast site A alone (method none, its own batch, the equal run's);
#   ideal    DDP over the three sites at the planned batches on free links (the bed again,
#            unshaped): one datacenter of the same compute;
# and the two ways DES-LOC runs them:
#   equal    every site at the same batch per rank, every average weighing the sites alike
#            (what desloc could do before [[job.site]]): the fast site waits at every average;
#   planned  each site's batch from `desloc plan` (balanced to the speeds `desloc profile`
#            measured on this bed, the job's sequences per step kept), every average weighing
#            the sites by their tokens (sync.weights = "tokens").
# (Equal batches with token weights is the equal run itself: sites of one batch weigh alike,
# bit for bit, docs/sync.md.)
# The compute differs by a CPU quota: sites B and C run in cgroups capped at --quota of a core,
# site A is uncapped (a single-threaded rank: at most a core). On this 2-core machine that is the
# honest way to give one site more compute: extra ranks would share the same two cores.
# Both runs take the sync settings of `desloc plan --auto` on the profiled bed (the mode, codecs
# and periods that cost the model least within the target overhead). Each run's step count is what `desloc
# simulate` predicts for the budget on the profiled bed. Reports each site's wait per average,
# validation loss at sixths of the budget, and the time to the equal run's final loss
# (unequal_report.py). docs/benchmarks.md.
set -Eeuo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
netbed=$root/scripts/netbed.sh
prog=$(basename "$0")

build=$root/build
rate=5mbit
rtt=40ms
budget=240
quota=0.25
batch=8
overhead=0.05
results=''
bed=une$$
bed=${bed:0:8}
sites=(A B C)

usage() {
  cat <<EOF
usage: $prog [--build DIR] [--rate 5mbit] [--rtt 40ms] [--budget SECONDS] [--quota CORES]
       [--batch N] [--target-overhead F] [--results DIR]
  --quota   the CPU share (of one core) sites B and C may use; A is uncapped
  --batch   every site's batch per rank in the equal run (and the profile's)
  --target-overhead  for desloc plan --auto (mode, codecs and periods): 0.05 by default
  Needs root (network namespaces, cgroups).
EOF
}
die() { echo "$prog: error: $*" >&2; exit 1; }
say() { echo "$prog: $*" >&2; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --rtt) rtt=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --quota) quota=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --target-overhead) overhead=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
[[ $budget =~ ^[0-9]+$ ]] || die "--budget takes whole seconds, not '$budget'"
[[ $batch =~ ^[1-9][0-9]*$ ]] || die "--batch takes a whole number, not '$batch'"
awk -v q="$quota" 'BEGIN { exit !(q > 0 && q <= 1) }' || die "--quota must be in (0, 1], not '$quota'"
[[ $(id -u) -eq 0 ]] || die "needs root for network namespaces and cgroups"
desloc=$build/src/desloc
[[ -x $desloc ]] || die "no $desloc; build first (scripts/build.sh)"
[[ -x $build/src/desloc-netdelay ]] || die "no $build/src/desloc-netdelay (cmake --build $build)"
cgroot=/sys/fs/cgroup/cpu
[[ -d $cgroot ]] || cgroot=/sys/fs/cgroup
data=$root/data/brown
[[ -f $data/dataset.toml ]] || data=$build/testdata/brown
[[ -f $data/dataset.toml ]] || die "no prepared corpus in data/brown or $build/testdata/brown"

keep=1
if [[ -z $results ]]; then results=$(mktemp -d); keep=0; fi
mkdir -p "$results"
cleanup() {
  "$netbed" down --name "$bed" >/dev/null 2>&1 || true
  for s in B C; do rmdir "$cgroot/desloc-$bed-$s" 2>/dev/null || true; done
  if [[ $keep -eq 0 ]]; then rm -rf "$results"; fi
}
trap cleanup EXIT

# The slow sites' CPU quota: cgroup v1's cpu.cfs_quota_us, or v2's cpu.max.
for s in B C; do
  g=$cgroot/desloc-$bed-$s
  mkdir -p "$g"
  us=$(awk -v q="$quota" 'BEGIN { printf "%d", q * 100000 }')
  if [[ -f $g/cpu.cfs_quota_us ]]; then
    echo 100000 >"$g/cpu.cfs_period_us"
    echo "$us" >"$g/cpu.cfs_quota_us"
  else
    echo "$us 100000" >"$g/cpu.max"
  fi
done

NETBED_NETDELAY=$(cd "$build/src" && pwd)/desloc-netdelay
export NETBED_NETDELAY
"$netbed" up --name "$bed" --sites A,B,C --default-rate "$rate" \
  --rtt "A-B=$rtt,A-C=$rtt,B-C=$rtt" >"$results/netbed.txt"
coord_addr=$("$netbed" env --name "$bed" --site A | sed -n 's/^DESLOC_SITE_ADDR=//p')

# $1 = name, $2 = file, $3 = steps, $4 = the sites' batches ("8 8 8", or "8" for A alone), $5 =
# sync.weights, $6 = the [sync] lines (the method first).
write_config() {
  local tables='' i=0 b
  for b in $4; do
    tables+=$'[[job.site]]\n'"name = \"${sites[i]}\""$'\nranks = 1\n'"batch = $b"$'\n'
    i=$((i + 1))
  done
  cat >"$2" <<EOF
# bench_unequal_sites: the quickstart model, $1, sites A, B and C on $rate links ($rtt).
[model]
vocab = 256
context = 128
layers = 4
heads = 4
d_model = 128
[optim]
name = "adamw"
beta1 = 0.9
beta2 = 0.95
weight_decay = 0.1
clip = "norm"
clip_value = 1.0
[schedule]
kind = "cosine"
lr = 3e-3
warmup = 30
min_lr_ratio = 0.1
[data]
dir = "$data"
seed = 1234
[train]
steps = $3
eval_every = $(($3 / 24 > 0 ? $3 / 24 : 1))
eval_batches = 8
checkpoint_every = 0
log_every = 50
out_dir = "$results/$1"
seed = 42
threads = 1
[sync]
weights = "$5"
$6
[job]
token = "bench-unequal"
rendezvous_timeout_s = 60
[transport]
tls = "tcp"
net_devices = ""
rndv_thresh = "inf"
deadline_s = 120
$tables
EOF
}

# A coordinator in site A and one worker per site of the config, B's and C's inside their CPU
# quota: $1 = name, $2 = config, the rest = extra worker arguments.
run_job() {
  local name=$1 cfg=$2 s coord failed=0 pids=() cg job_sites
  shift 2
  job_sites=$(awk '/^\[\[job.site\]\]/ { t = 1 } t && /^name/ { gsub(/"/, "", $3); print $3 }' "$cfg")
  "$netbed" exec --name "$bed" --site A -- \
    "$desloc" coordinator --config "$cfg" --listen "$coord_addr:29517" \
    >"$results/$name-coordinator.log" 2>&1 &
  coord=$!
  sleep 0.5
  for s in $job_sites; do
    cg=''
    [[ $s == A ]] || cg=$cgroot/desloc-$bed-$s/cgroup.procs
    # The subshell joins the quota's cgroup before it starts the rank (inside the namespace
    # `ip netns exec` mounts its own /sys, without the cgroups), and the rank inherits it.
    (
      [[ -z $cg ]] || echo "$BASHPID" >"$cg"
      exec "$netbed" exec --name "$bed" --site "$s" -- \
        "$desloc" worker --config "$cfg" --site "$s" --rank 0 --coordinator "$coord_addr:29517" \
        --no-progress "$@"
    ) >"$results/$name-$s.log" 2>&1 &
    pids+=("$!")
  done
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  wait "$coord" || true
  if [[ $failed -ne 0 ]]; then
    tail -n 5 "$results/$name"-*.log >&2
    die "$name: a rank failed (logs above)"
  fi
}

say "profile: the bed's links and each site's compute step (B and C at $quota of a core)"
write_config profile "$results/profile.toml" 1000 "$batch $batch $batch" equal \
  $'method = "desloc"\nkx = 16'
run_job profile "$results/profile.toml" --profile "$results/topology.toml"
"$desloc" plan --auto --topology "$results/topology.toml" --config "$results/profile.toml" \
  --target-overhead "$overhead" --out "$results/plan.toml" >"$results/plan.txt" ||
  { cat "$results/plan.txt" >&2; die "desloc plan refused the profiled bed"; }
grep -E "unequal speed|balanced|pace" "$results/plan.txt" >&2 || true
periods=$(sed -n '/^\[sync\]/,/^\[/{/^\(kx\|ku\|kv\|phase_[xuv]\|overlap\|delay\|fragments\|fragments_[uv]\|codec_[xuv]\|codec_block\|error_feedback\) *=/p}' "$results/plan.toml")
planned=$(awk '/^\[\[job.site\]\]/ { t = 1 } t && /^name/ { gsub(/"/, "", $3); n = $3 }
  t && /^batch/ { b[n] = $3 } END { print b["A"], b["B"], b["C"] }' "$results/plan.toml")
[[ $planned =~ ^[0-9]+\ [0-9]+\ [0-9]+$ ]] ||
  die "desloc plan gave no balanced batches (the sites' steps are within 10%?); see $results/plan.txt"
say "plan: $(echo "$periods" | tr '\n' ' '); batches A B C = $planned (equal run: $batch each)"

desloc_sync=$'method = "desloc"\n'"$periods"
declare -A batches=([alone]="$batch" [equal]="$batch $batch $batch" [planned]="$planned"
                    [ideal]="$planned")
declare -A weights=([alone]=equal [equal]=equal [planned]=tokens [ideal]=tokens)
declare -A method=([alone]=none [equal]=desloc [planned]=desloc [ideal]=ddp)
declare -A sync_lines=([alone]='method = "none"' [equal]=$desloc_sync [planned]=$desloc_sync
                       [ideal]='method = "ddp"')
for run in alone equal planned ideal; do
  if [[ $run == alone ]]; then  # A's own step, as profiled (simulate would walk every site)
    ms=$(awk '/^name = "A"/ { a = 1 } a && /^step_ms/ { print $3; exit }' "$results/topology.toml")
  elif [[ $run == ideal ]]; then  # the same bed, its links unshaped
    "$netbed" down --name "$bed" >/dev/null
    "$netbed" up --name "$bed" --sites A,B,C --default-rate 10gbit >>"$results/netbed.txt"
    # No topology of free links was measured: DDP's step there is the planned run's compute.
    ms=$(python3 "$here/unequal_report.py" --results "$results" --median-ms planned)
  else
    write_config "$run" "$results/$run.toml" 1000 "${batches[$run]}" "${weights[$run]}" \
      "${sync_lines[$run]}"
    ms=$("$desloc" simulate --topology "$results/topology.toml" --config "$results/$run.toml" \
      --methods "${method[$run]}" | awk -v m="${method[$run]}" '$1 == m { print $2 }')
  fi
  [[ -n $ms ]] || die "no step time predicted for $run"
  steps=$(awk -v b="$budget" -v ms="$ms" 'BEGIN { n = int(b * 1000 / ms); print (n < 1 ? 1 : n) }')
  say "$run: batches ${batches[$run]}, weights ${weights[$run]}, ${method[$run]}: $ms ms a step, $steps steps in $budget s"
  write_config "$run" "$results/$run.toml" "$steps" "${batches[$run]}" "${weights[$run]}" \
    "${sync_lines[$run]}"
  run_job "$run" "$results/$run.toml"
done
python3 "$here/unequal_report.py" --results "$results" --budget "$budget"
