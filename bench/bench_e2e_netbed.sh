#!/usr/bin/env bash
# bench_e2e_netbed: end-to-end multi-site training on the shaped test bed. S sites (one network
# namespace each, one rank per site) joined by shaped links train the same job four ways: with
# communication switched off (method none: the compute-only reference), DDP (gradients averaged
# every step), Local Adam and DES-LOC. Each run is a real `desloc coordinator` plus one
# `desloc worker` per site namespace, talking UCX tcp over the shaped veths.
# Reports ms per step, time to a target validation loss (step time only: evaluation excluded),
# wide-area bytes, and whether communication steals compute (step time, and each rank's CPU
# seconds per step from /usr/bin/time, against the compute-only run). docs/benchmarks.md.
#
# With --budget every method trains for the same wall-clock budget instead of the same steps:
# `desloc simulate` on the bed's topology predicts each method's step time and so its step
# count. With --plan the bed is first measured with `desloc profile`, and `desloc plan` chooses
# DES-LOC's periods (and Local Adam's, at DES-LOC's bytes per step) from that measurement: the
# workflow a user follows. --starved is the headline scenario: a bandwidth-starved bed where
# DDP is about 20x slower than compute, compared at equal wall-clock time.
set -Eeuo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
netbed=$root/scripts/netbed.sh
prog=$(basename "$0")

build=$root/build
sites=A,B,C
rate=100mbit
links=''
steps=600
kx=96
target=2.5
methods=none,ddp,local_adam,desloc
results=''
rtt=''
tcp_buffer=''
no_ssai=0
budget=''
plan=0
overhead=0.05
delay=1
fragments=1
max_delay=0
phases=''
codec=''
pin=0
transport_lines=''
rtts=''
regions=''
region_kx=8
bed=e2e$$
bed=${bed:0:8}

usage() {
  cat <<EOF
usage: $prog [--build DIR] [--sites A,B,C] [--rate 100mbit] [--links A-B=1gbit,...] [--steps N] [--kx K]
       [--target NATS] [--methods none,ddp,local_adam,desloc] [--results DIR] [--quick]
       [--rtt T] [--tcp-buffer BYTES] [--no-slow-start-after-idle] [--budget SECONDS] [--plan] [--target-overhead F]
       [--delay TAU[,TAU_U,TAU_V]] [--phases U,V] [--fragments P] [--max-delay N] [--codec NAME] [--pin] [--starved]
       [--rtts A-B=2ms,...] [--regions A+B,C+D] [--region-kx K] [--regional]
       [--transport 'KEY = VALUE'] [--evals N]

Runs as root (network namespaces). Defaults: 3 sites on 100 Mbit links, 300 steps of the
quickstart model (B = 8 per site, one rank per site), Kx = $kx, target validation loss
$target nats. Method none is the compute-only reference (no communication at all).
  --links    per-pair rates (netbed.sh --rate syntax); --rate is then the bottleneck the
             report prices the wire time at
  --quick    60 steps, target 3.0 nats (about 2 minutes)
  --rtt      a round trip T (e.g. 40ms) on every pair of sites (netbed.sh --rtt, held by
             DIR/src/desloc-netdelay)
  --tcp-buffer  largest TCP buffers of every site (netbed.sh --tcp-buffer)
  --no-slow-start-after-idle  net.ipv4.tcp_slow_start_after_idle = 0 in every site, as
             desloc profile advises where round trips are long (the bed keeps Linux's 1)
  --results  keep configs, logs and metrics there (default: a temporary directory, removed)
  --methods  any of none, ddp, local_adam, desloc, favg, favg_reset; a suffix -outerLR (or
             -outerLRmMU) adds the outer Nesterov step at that learning rate (and momentum),
             e.g. desloc-delayed-outer0.5m0.8; -fp32 (before it) leaves --codec out of that
             method, e.g. desloc-regions-fp32; NAME-overlap runs NAME
             with sync.overlap = "step" (e.g. desloc-overlap), NAME-delayed with
             sync.overlap = "delayed" (desloc-delayed: with --plan, Kx and tau from
             \`desloc plan --delayed\`; else --kx and --delay)
  --delay    tau of NAME-delayed methods without --plan (default $delay); TAU,TAU_U,TAU_V
             sets u's and v's too (sync.delay_u, delay_v)
  --phases   U,V: sync.phase_u and phase_v of the DES-LOC methods without --plan
  --fragments  sync.fragments of NAME-delayed and NAME-overlap methods without --plan
             (default $fragments): streaming DES-LOC with desloc-delayed
  --max-delay  with --plan: \`desloc plan --delayed --max-delay N\` for NAME-delayed methods
             (the largest delay the plan may use; default $max_delay = any)
  --codec    sync.codec_x, codec_u and codec_v of the DES-LOC methods (bf16, int8, int4,
             int2; with error feedback), also in the config \`desloc plan\` prices;
             CODEC/VCODEC gives v its own (e.g. int2/sqrt-int2)
  --rtts     per-pair round trips (netbed.sh --rtt syntax) instead of one --rtt for all
  --regions  regions for the desloc-regions method: sites joined by '+', regions by ','
             (job.regions); desloc-regions is desloc (the plan's Kx with --plan, rounded up to
             a multiple of --region-kx) plus averages inside each region every --region-kx
             steps (default $region_kx)
  --regional the hierarchical headline: 4 sites as 2 regions of 2, 1 Gbit and 2 ms round
             trips inside a region, 20 Mbit and 40 ms between them; --budget 180 --plan
             --methods none,desloc,desloc-regions,desloc-regions-overlap --region-kx 8
             (about 15 minutes)
  --transport a line added to every run's [transport] section (e.g. 'wan_spin_iterations = 64'),
             for an A/B of one transport setting
  --evals    validation evaluations during each run (default 6, 24 with --budget or --plan;
             0 = at the end only). Each one averages x across the sites and the ranks
             share its batches; the sites pause together for it, so a steal measurement
             wants 0. The report interpolates the loss between evaluations
  --pin      pin site i's worker to CPU i mod nproc (taskset), so that a site's compute and
             its communication thread share one core, as they would on a dedicated host
  --budget   train every method for about SECONDS of step time (evaluation excluded) instead
             of --steps: each method's steps = SECONDS / its step time as \`desloc simulate\`
             predicts it on the topology (the profiled one with --plan, else the bed's rates)
  --plan     profile the bed (\`desloc profile\`), then take DES-LOC's Kx, Ku, Kv, phases, ring
             and lanes from \`desloc plan\` (--target-overhead, default $overhead); Local Adam
             gets K = 2 Kx, which sends the bytes per step DES-LOC's plan does
  --starved  the headline scenario: --rate 5mbit --rtt 40ms --budget 240 --plan --target 3.0
             --methods none,ddp,local_adam,desloc,desloc-delayed (3 sites; DDP about 20x the
             compute-only step; about 25 minutes)
  --quick    with --budget: a budget of 40 s
Exit status: 0 all targets met, 3 a target missed, 1 a failure.
EOF
}

die() { echo "$prog: error: $*" >&2; exit 1; }
say() { echo "$prog: $*" >&2; }

quick=0
evals=''
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --sites) sites=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --links) links=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --evals) evals=$2; shift 2 ;;
    --kx) kx=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --methods) methods=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --quick) steps=60; target=3.0; quick=1; shift ;;
    --rtt) rtt=$2; shift 2 ;;
    --tcp-buffer) tcp_buffer=$2; shift 2 ;;
    --no-slow-start-after-idle) no_ssai=1; shift ;;
    --budget) budget=$2; shift 2 ;;
    --plan) plan=1; shift ;;
    --target-overhead) overhead=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --fragments) fragments=$2; shift 2 ;;
    --phases) phases=$2; shift 2 ;;
    --max-delay) max_delay=$2; shift 2 ;;
    --codec) codec=$2; shift 2 ;;
    --transport) transport_lines+=$'\n'"$2"; shift 2 ;;
    --pin) pin=1; shift ;;
    --rtts) rtts=$2; shift 2 ;;
    --regions) regions=$2; shift 2 ;;
    --region-kx) region_kx=$2; shift 2 ;;
    --regional) sites=A,B,C,D; rate=20mbit; links=A-B=1gbit,C-D=1gbit
      rtts=A-B=2ms,C-D=2ms,A-C=40ms,A-D=40ms,B-C=40ms,B-D=40ms; regions=A+B,C+D
      budget=180; plan=1; target=3.0; methods=none,desloc,desloc-regions,desloc-regions-overlap
      shift ;;
    --starved) rate=5mbit; rtt=40ms; budget=240; plan=1; target=3.0
      methods=none,ddp,local_adam,desloc,desloc-delayed; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
[[ -z $evals || $evals =~ ^[0-9]+$ ]] || die "--evals must be a whole number, not '$evals'"
[[ -z $budget || $budget =~ ^[0-9]+$ ]] || die "--budget takes whole seconds, not '$budget'"
[[ $quick -eq 0 || -z $budget ]] || budget=40
[[ $(id -u) -eq 0 ]] || die "needs root for network namespaces"
desloc=$build/src/desloc
[[ -x $desloc ]] || die "no $desloc; build first (scripts/build.sh)"
data=$root/data/brown
[[ -f $data/dataset.toml ]] || data=$build/testdata/brown
[[ -f $data/dataset.toml ]] || die "no prepared corpus in data/brown or $build/testdata/brown"

keep=1
if [[ -z $results ]]; then results=$(mktemp -d); keep=0; fi
mkdir -p "$results"
cleanup() {
  "$netbed" down --name "$bed" >/dev/null 2>&1 || true
  if [[ $keep -eq 0 ]]; then rm -rf "$results"; fi
}
trap cleanup EXIT

IFS=, read -r -a site_list <<<"$sites"
shaping=(--default-rate "$rate")
[[ -z $links ]] || shaping+=(--rate "$links")
[[ -z $rtt || -z $rtts ]] || die "--rtt and --rtts exclude each other"
if [[ -n $rtt$rtts ]]; then
  [[ -x $build/src/desloc-netdelay ]] || die "--rtt needs $build/src/desloc-netdelay (cmake --build $build)"
  NETBED_NETDELAY=$(cd "$build/src" && pwd)/desloc-netdelay
  export NETBED_NETDELAY
  pairs=$rtts
  if [[ -n $rtt ]]; then
    for ((i = 0; i < ${#site_list[@]}; i++)); do
      for ((j = i + 1; j < ${#site_list[@]}; j++)); do pairs+="${pairs:+,}${site_list[i]}-${site_list[j]}=$rtt"; done
    done
  fi
  shaping+=(--rtt "$pairs")
fi
regions_toml=''
if [[ -n $regions ]]; then
  IFS=, read -r -a region_list <<<"$regions"
  for g in "${region_list[@]}"; do
    regions_toml+="${regions_toml:+, }[\"${g//+/\", \"}\"]"
  done
  regions_toml="regions = [$regions_toml]"
fi
[[ -z $tcp_buffer ]] || shaping+=(--tcp-buffer "$tcp_buffer")
[[ $no_ssai -eq 0 ]] || shaping+=(--no-slow-start-after-idle)
"$netbed" up --name "$bed" --sites "$sites" "${shaping[@]}" >"$results/netbed.txt"
coord_addr=$("$netbed" env --name "$bed" --site "${site_list[0]}" | sed -n 's/^DESLOC_SITE_ADDR=//p')
quoted=$(printf '"%s", ' "${site_list[@]}")
quoted=${quoted%, }

# NAME[-regions][-overlap|-delayed][-fp32][-outerLR[mMU]]: the method, and the sync keys its
# suffixes add (-fp32: no --codec for this method).
outer_part() { if [[ $1 == *-outer* ]]; then echo "${1##*-outer}"; fi; }
without_outer() {
  local m=${1%-outer*}
  echo "${m%-fp32}"
}
base_method() {
  local m
  m=$(without_outer "$1")
  m=${m%-overlap}
  m=${m%-delayed}
  echo "${m%-regions}"
}


write_config() {  # $1 = method (NAME, NAME-overlap, NAME-delayed, ...-outerLR), $2 = file, $3 = steps
  local period='' lanes_line='' name overlap='' job_regions='' tau tau_u tau_v phase_lines=''
  local mode outer outer_lines=''
  [[ -z $phases ]] || phase_lines=$'\n'"phase_u = ${phases%,*}"$'\n'"phase_v = ${phases#*,}"
  name=$(base_method "$1")
  mode=$(without_outer "$1")
  outer=$(outer_part "$1")
  if [[ -n $outer ]]; then  # -outer0.5 or -outer0.5m0.8: the outer Nesterov step
    outer_lines=$'outer = "nesterov"\n'"outer_lr = ${outer%m*}"
    [[ $outer != *m* ]] || outer_lines+=$'\n'"outer_momentum = ${outer#*m}"
  fi
  case $mode in
    *-overlap) overlap='overlap = "step"' ;;
    *-delayed) IFS=, read -r tau tau_u tau_v <<<"$delay"
      overlap=$'overlap = "delayed"\n'"delay = $tau"
      [[ -z $tau_u ]] || overlap+=$'\n'"delay_u = $tau_u"
      [[ -z $tau_v ]] || overlap+=$'\n'"delay_v = $tau_v" ;;
  esac
  [[ $mode != *-overlap && $mode != *-delayed ]] || overlap+=$'\n'"fragments = $fragments"
  case $mode in
    desloc-delayed) period=${delayed_sync:-"kx = $kx$phase_lines"}
      [[ -z $delayed_sync ]] || overlap=$delayed_overlap ;;
    desloc-regions*)
      [[ -n $regions_toml ]] || die "desloc-regions needs --regions"
      # The flat plan's Kx rounded up to a multiple of --region-kx (Ku = 3 Kx and Kv = 6 Kx,
      # the plan's ratios), phases 0: every job-wide average falls on a region step. Streaming
      # (-delayed) takes the streaming plan's Kx, tau and fragments instead.
      local k=${plan_kx:-$kx}
      if [[ $mode == *-delayed && -n $delayed_sync ]]; then
        k=$(sed -n 's/^kx *= *\([0-9]*\).*/\1/p' <<<"$delayed_sync")
        overlap=$delayed_overlap
      fi
      k=$(((k + region_kx - 1) / region_kx * region_kx))
      period="kx = $k"$'\n'"region_kx = $region_kx"
      job_regions=$regions_toml ;;
    desloc*) period=${desloc_sync:-"kx = $kx$phase_lines"} ;;
    local_adam*|favg*) period="kx = ${la_kx:-$kx}" ;;
  esac
  [[ -z $lanes ]] || lanes_line="lanes = $lanes"
  if [[ -n $codec && $name == desloc && $1 != *-fp32* ]]; then
    local xu=${codec%%/*} v=${codec#*/}
    overlap+=$'\n'"codec_x = \"$xu\""$'\n'"codec_u = \"$xu\""$'\n'"codec_v = \"$v\""
    overlap+=$'\n'"error_feedback = true"
  fi
  cat >"$2" <<EOF
# bench_e2e_netbed: the quickstart model, $1, ${#site_list[@]} sites on $rate links.
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
batch = 8
seed = 1234
[train]
steps = $3
eval_every = $((evals == 0 ? 0 : $3 / evals > 0 ? $3 / evals : 1))
eval_batches = 8
checkpoint_every = 0
log_every = 50
out_dir = "$results/$1"
seed = 42
threads = 1
[sync]
method = "$name"
$period
$overlap
$outer_lines
[job]
sites = [$quoted]
$job_regions
ranks_per_site = 1
token = "bench-e2e"
rendezvous_timeout_s = 60
[transport]
tls = "tcp"
net_devices = ""  # each namespace's UCX_NET_DEVICES, set by netbed exec
rndv_thresh = "inf"
deadline_s = 120
$lanes_line$transport_lines
EOF
}

# Runs a real coordinator in the first site and one worker per site: $1 = name (logs), $2 =
# config, the rest = extra worker arguments.
run_job() {
  local name=$1 cfg=$2 s p coord failed=0 pids=() quiet=() cpu=0 pinning=()
  shift 2
  "$netbed" exec --name "$bed" --site "${site_list[0]}" -- \
    "$desloc" coordinator --config "$cfg" --listen "$coord_addr:29517" \
    >"$results/$name-coordinator.log" 2>&1 &
  coord=$!
  sleep 0.5
  for s in "${site_list[@]}"; do
    quiet=(--quiet)
    [[ $s == "${site_list[0]}" ]] && quiet=()
    [[ $pin -eq 0 ]] || pinning=(taskset -c $((cpu++ % $(nproc))))
    "$netbed" exec --name "$bed" --site "$s" -- "${pinning[@]}" \
      /usr/bin/time -o "$results/$name-$s.cpu" -f "%e %U %S" \
      "$desloc" worker --config "$cfg" --site "$s" --rank 0 --coordinator "$coord_addr:29517" \
      --no-progress "${quiet[@]}" "$@" >"$results/$name-$s.log" 2>&1 &
    pids+=("$!")
  done
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  wait "$coord" || true
  if [[ $failed -ne 0 ]]; then
    tail -n 5 "$results/$name"-*.log >&2
    die "$name: a rank failed (logs above)"
  fi
}

desloc_sync='' la_kx='' lanes='' delayed_sync='' delayed_overlap=''
declare -A method_steps=()
if [[ -n $budget || $plan -eq 1 ]]; then
  evals=${evals:-24}  # a finer curve against time
  write_config desloc "$results/profile.toml" 1000
  sed -i "s|^out_dir = .*|out_dir = \"$results/profile\"|" "$results/profile.toml"
  say "profile: measuring the bed's links and compute step with desloc profile"
  run_job profile "$results/profile.toml" --profile "$results/topology.toml"
  grep -E " -> |warn" "$results/profile-${site_list[0]}.log" >&2 || true
fi
evals=${evals:-6}
if [[ $plan -eq 1 ]]; then
  "$desloc" plan --topology "$results/topology.toml" --config "$results/profile.toml" \
    --target-overhead "$overhead" --out "$results/plan.toml" >"$results/plan.txt" ||
    { cat "$results/plan.txt" >&2; die "desloc plan refused the profiled bed"; }
  desloc_sync=$(sed -n '/^\[sync\]/,/^\[/{/^\(kx\|ku\|kv\|phase_[xuv]\) *=/p}' "$results/plan.toml")
  kx=$(sed -n 's/^kx *= *\([0-9]*\).*/\1/p' "$results/plan.toml")
  plan_kx=$kx
  la_kx=$((2 * kx))
  lanes=$(sed -n 's/^lanes *= *\([0-9]*\).*/\1/p' "$results/plan.toml")
  ring=$(sed -n 's/^sites *= *\[\([^]]*\)\].*/\1/p' "$results/plan.toml")
  [[ -z $ring ]] || quoted=$ring
  say "plan: DES-LOC $(echo "$desloc_sync" | tr '\n' ' ')(target overhead $overhead); Local Adam K = $la_kx"
  if [[ ,$methods, == *-delayed,* || ,$methods, == *-delayed-outer* ]]; then
    "$desloc" plan --delayed --max-delay "$max_delay" --topology "$results/topology.toml" \
      --config "$results/profile.toml" --target-overhead "$overhead" --out "$results/plan-delayed.toml" >"$results/plan-delayed.txt" ||
      { cat "$results/plan-delayed.txt" >&2; die "desloc plan --delayed refused the profiled bed"; }
    delayed_sync=$(sed -n '/^\[sync\]/,/^\[/{/^\(kx\|ku\|kv\|phase_[xuv]\) *=/p}' "$results/plan-delayed.toml")
    delayed_overlap=$(sed -n '/^\[sync\]/,/^\[/{/^\(overlap\|delay\|fragments\|fragments_[uv]\) *=/p}' "$results/plan-delayed.toml")
    say "plan --delayed: DES-LOC $(echo "$delayed_sync $delayed_overlap" | tr '\n' ' ')"
  fi
fi
for method in ${methods//,/ }; do
  method_steps[$method]=$steps
  [[ -n $budget ]] || continue
  # The method's step time as `desloc simulate` predicts it on the profiled topology.
  write_config "$method" "$results/$method.toml" 1000
  ms=$("$desloc" simulate --topology "$results/topology.toml" --config "$results/$method.toml" \
    --methods "$(base_method "$method")" | awk -v m="$(base_method "$method")" '$1 == m { print $2 }')
  [[ -n $ms ]] || die "desloc simulate predicted no step time for $method"
  method_steps[$method]=$(awk -v b="$budget" -v ms="$ms" 'BEGIN { n = int(b * 1000 / ms); print (n < 1 ? 1 : n) }')
  say "$method: predicted $ms ms per step: ${method_steps[$method]} steps in a budget of $budget s"
done

for method in ${methods//,/ }; do
  cfg=$results/$method.toml
  write_config "$method" "$cfg" "${method_steps[$method]}"
  say "$method: ${#site_list[@]} sites on $rate${rtt:+ (round trip $rtt)}, ${method_steps[$method]} steps"
  run_job "$method" "$cfg"
done

runs=()
for method in ${methods//,/ }; do runs+=("$results/$method/metrics.jsonl"); done
"$desloc" report --out "$results/report.html" \
  --title "bench_e2e_netbed: ${#site_list[@]} sites on $rate${rtt:+, round trip $rtt}" "${runs[@]}" >/dev/null
say "report: $results/report.html (validation loss against step, training time and bytes)"
report_args=()
[[ -z $budget ]] || report_args+=(--budget "$budget")
python3 "$here/e2e_report.py" --results "$results" --methods "$methods" --rate "$rate" \
  --sites "${#site_list[@]}" --target "$target" "${report_args[@]}"
