#!/usr/bin/env bash
# bench_wan_allreduce: desloc's UCX ring all-reduce against torch.distributed gloo and Open MPI
# MPI_Allreduce on the shaped test bed (scripts/netbed.sh), side by side on the same namespaces,
# one process per site. Reports busbw against the ring's bottleneck rate. docs/benchmarks.md.
# shellcheck disable=SC2317  # the trap handlers and run_<impl> are invoked indirectly
set -Eeuo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
netbed=$root/scripts/netbed.sh
prog=$(basename "$0")

readonly kMiB=1048576
readonly kSubnet=10.77.0            # netbed's default /24; exists only inside the bed
readonly kGoodputSeconds=2          # per iperf3 flow

usage() {
  cat <<EOF
usage: $prog [--build DIR] [--quick] [--scenarios NAME,...] [--impls desloc,gloo,mpi]
       [--repeats N] [--warmup N] [--rndv-thresh inf|auto|BYTES] [--mpi-alg ring|default|N]
       [--bytes-100m BYTES] [--bytes-1g BYTES] [--results DIR] [--no-goodput] [--python PATH]
       [--desloc-args "--chunk-bytes B --inflight K"] [--rtt T] [--tcp-buffer BYTES]
       [--idle-ms MS] [--no-slow-start-after-idle] [--congestion CC]

Runs as root (network namespaces). For every scenario it brings a bed up, measures the TCP
goodput of the ring's links (iperf3, all flows at once), runs desloc, gloo and Open MPI ranks
(one per site namespace), tears the bed down and prints a table; a summary follows.

  --build DIR        CMake build directory holding bench/bench_wan_allreduce (default: build)
  --quick            2s-100m, het3 and 4s-1g with 3 repeats and half the bytes (about 1 min)
  --scenarios        subset of: $(scenario_names)
  --repeats N        timed all-reduces per implementation (default 5; --quick 3)
  --warmup N         untimed ones after the validation run (default 1)
  --rndv-thresh      desloc's UCX_RNDV_THRESH (default inf, measured best: docs/benchmarks.md)
  --mpi-alg          ring (default: coll_tuned_allreduce_algorithm 4), default (Open MPI's own
                     decision rules), or an algorithm number
  --bytes-100m/-1g   message size for scenarios whose bottleneck is below / at 1 Gbit
                     (default 16 MiB / 128 MiB: each timed run lasts 1.1-2.1 s at the link rate)
  --results DIR      keep records and logs there (default: a temporary directory, removed)
  --no-goodput       skip the iperf3 measurement
  --desloc-args      extra options for each desloc rank (bench_wan_allreduce rank --help)
  --rtt T            a round trip T (e.g. 40ms) on every link of every scenario (netbed.sh --rtt,
                     held by DIR/src/desloc-netdelay); default none
  --tcp-buffer BYTES largest TCP send/receive buffer in every site (netbed.sh --tcp-buffer);
                     default: Linux's (send 4 MiB here)
  --idle-ms MS       desloc's ranks leave the links idle MS before every all-reduce, as DES-LOC's
                     syncs do (desloc only: use with --impls desloc)
  --no-slow-start-after-idle
                     net.ipv4.tcp_slow_start_after_idle=0 in every site (netbed.sh)
  --congestion CC    TCP congestion control in every site (netbed.sh --congestion; default:
                     the host's, bbr here; bbr's ProbeRTT costs 2-5% here, docs/transport.md)
Exit status: 0 all targets met, 3 some target missed, 1 a failure (desloc failed or bad usage).
EOF
}

die() { echo "$prog: error: $*" >&2; exit 1; }
say() { echo "$prog: $*" >&2; }

# name|sites|netbed rate arguments|link label|bottleneck Mbit/s (min rate on the ring)|class
# class picks the message size: "100m" (bottleneck below 1 Gbit) or "1g".
# het3: the ring A>B>C>A crosses every link of the triangle, so its bottleneck is C>A, 100 Mbit.
all_scenarios=(
  "2s-100m|A,B|--default-rate 100mbit|100 Mbit|100|100m"
  "3s-100m|A,B,C|--default-rate 100mbit|100 Mbit|100|100m"
  "4s-100m|A,B,C,D|--default-rate 100mbit|100 Mbit|100|100m"
  "2s-1g|A,B|--default-rate 1gbit|1 Gbit|1000|1g"
  "3s-1g|A,B,C|--default-rate 1gbit|1 Gbit|1000|1g"
  "4s-1g|A,B,C,D|--default-rate 1gbit|1 Gbit|1000|1g"
  "het3|A,B,C|--rate A-B=1gbit,B-C=300mbit,A-C=100mbit|AB 1G, BC 300M, CA 100M|100|100m"
)
scenario_names() { local s; for s in "${all_scenarios[@]}"; do printf '%s ' "${s%%|*}"; done; }

build=build
quick=0
only=
impls=desloc,gloo,mpi
repeats=
warmup=1
rndv=inf
mpi_alg=ring
bytes_100m=$((16 * kMiB))
bytes_1g=$((128 * kMiB))
bytes_given=0
results=
goodput=1
python=/usr/bin/python3
desloc_args=()
rtt=
tcp_buffer=
idle_ms=0
ssai=1
congestion=''
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=${2:?}; shift 2 ;;
    --quick) quick=1; shift ;;
    --scenarios) only=${2:?}; shift 2 ;;
    --impls) impls=${2:?}; shift 2 ;;
    --repeats) repeats=${2:?}; shift 2 ;;
    --warmup) warmup=${2:?}; shift 2 ;;
    --rndv-thresh) rndv=${2:?}; shift 2 ;;
    --mpi-alg) mpi_alg=${2:?}; shift 2 ;;
    --bytes-100m) bytes_100m=${2:?}; bytes_given=1; shift 2 ;;
    --bytes-1g) bytes_1g=${2:?}; bytes_given=1; shift 2 ;;
    --results) results=${2:?}; shift 2 ;;
    --no-goodput) goodput=0; shift ;;
    --python) python=${2:?}; shift 2 ;;
    --desloc-args) read -r -a desloc_args <<<"${2:?}"; shift 2 ;;
    --rtt) rtt=${2:?}; shift 2 ;;
    --tcp-buffer) tcp_buffer=${2:?}; shift 2 ;;
    --idle-ms) idle_ms=${2:?}; shift 2 ;;
    --no-slow-start-after-idle) ssai=0; shift ;;
    --congestion) congestion=${2:-}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
if [[ $quick -eq 1 ]]; then
  only=${only:-2s-100m,het3,4s-1g}
  repeats=${repeats:-3}
  if [[ $bytes_given -eq 0 ]]; then bytes_100m=$((8 * kMiB)); bytes_1g=$((64 * kMiB)); fi
fi
repeats=${repeats:-5}
[[ $repeats =~ ^[1-9][0-9]*$ && $warmup =~ ^[0-9]+$ ]] || die "--repeats >= 1 and --warmup >= 0"
[[ $idle_ms =~ ^[0-9]+$ ]] || die "--idle-ms takes whole milliseconds, not '$idle_ms'"
[[ $bytes_100m =~ ^[0-9]+$ && $bytes_1g =~ ^[0-9]+$ && $((bytes_100m % 4)) -eq 0 &&
   $((bytes_1g % 4)) -eq 0 && $bytes_100m -gt 0 && $bytes_1g -gt 0 ]] ||
  die "--bytes-100m/--bytes-1g must be positive multiples of 4"
case $mpi_alg in
  ring) mpi_alg_mca=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4) ;;
  default) mpi_alg_mca=() ;;
  [0-9]) mpi_alg_mca=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm "$mpi_alg") ;;
  *) die "--mpi-alg must be ring, default or an algorithm number" ;;
esac

declare -A want_impl=()
IFS=, read -r -a impl_list <<<"$impls"
for i in "${impl_list[@]}"; do
  [[ $i == desloc || $i == gloo || $i == mpi ]] || die "--impls takes desloc, gloo and mpi, got '$i'"
  want_impl[$i]=1
done

scenarios=()
if [[ -n $only ]]; then
  IFS=, read -r -a names <<<"$only"
  for n in "${names[@]}"; do
    found=
    for s in "${all_scenarios[@]}"; do [[ ${s%%|*} == "$n" ]] && found=$s; done
    [[ -n $found ]] || die "unknown scenario '$n' (known: $(scenario_names))"
    scenarios+=("$found")
  done
else
  scenarios=("${all_scenarios[@]}")
fi

# ---- prerequisites (checked before anything is made) ----------------------------------------
[[ $(id -u) -eq 0 ]] || die "must run as root: the test bed needs network namespaces and tc"
bin=$build/bench/bench_wan_allreduce
[[ -x $bin ]] || die "$bin not found; build it: cmake --build $build --target bench_wan_allreduce"
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
if [[ -n $rtt ]]; then
  [[ -x $build/src/desloc-netdelay ]] || die "--rtt needs $build/src/desloc-netdelay; build it: cmake --build $build --target desloc-netdelay"
  NETBED_NETDELAY=$(cd "$build/src" && pwd)/desloc-netdelay
  export NETBED_NETDELAY
fi
mpi_bin=
if [[ -n ${want_impl[mpi]:-} ]]; then
  command -v mpirun >/dev/null 2>&1 || die "mpirun not found: scripts/install_deps.sh installs openmpi-bin"
  if [[ -x $build/bench/mpi_allreduce ]]; then
    mpi_bin=$(cd "$build/bench" && pwd)/mpi_allreduce
  fi
fi
if [[ -n ${want_impl[gloo]:-} ]]; then
  "$python" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null ||
    die "$python has no torch.distributed with gloo (Debian: python3-torch)"
fi
if [[ $goodput -eq 1 ]] && ! command -v iperf3 >/dev/null 2>&1; then
  say "iperf3 not found; skipping the goodput measurement (scripts/install_deps.sh installs it)"
  goodput=0
fi

# ---- state and cleanup ----------------------------------------------------------------------
bed="w$$"
bed_is_up=0
keep_results=1
if [[ -z $results ]]; then results=$(mktemp -d /tmp/bench_wan_allreduce.XXXXXX); keep_results=0; fi
mkdir -p "$results"
results=$(cd "$results" && pwd)
children=()
declare -A child_log=()  # pid -> its log, for the failure message

kill_children() {
  local p
  for p in "${children[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${children[@]}"; do wait "$p" 2>/dev/null || true; done
  children=()
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  kill_children
  if [[ $bed_is_up -eq 1 ]]; then "$netbed" down --name "$bed" >/dev/null 2>&1 || say "warning: could not tear down bed $bed; run: $netbed down --name $bed"; fi
  if [[ $keep_results -eq 0 ]]; then rm -rf "$results"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Beds of earlier runs of this bench whose process is gone (killed with KILL) are removed.
for b in $(ip netns list | awk '{ print $1 }' | sed -nE 's/^nb-(w[0-9]+)-bridge$/\1/p'); do
  if ! kill -0 "${b#w}" 2>/dev/null; then
    say "removing stale bed $b"
    "$netbed" down --name "$b" >/dev/null || true
  fi
done

if [[ -n ${want_impl[mpi]:-} && -z $mpi_bin ]]; then
  command -v mpicxx >/dev/null 2>&1 || die "mpicxx not found: scripts/install_deps.sh installs libopenmpi-dev"
  mpi_bin=$results/mpi_allreduce
  say "building the MPI peer with mpicxx ($build has no bench/mpi_allreduce)"
  mpicxx -O2 -std=c++20 -Wall -Wextra -Werror -o "$mpi_bin" "$here/mpi_allreduce.cpp"
fi

# ---- one scenario ---------------------------------------------------------------------------
# Starts "$@" in the background as a watched child; its pid joins children[].
spawn() {
  local log=$1; shift
  "$@" >"$log" 2>&1 &
  children+=("$!")
  child_log[$!]=$log
}

# Waits for every child. On the first failure the others are stopped (they would only wait
# for a dead peer until their deadline). Returns the first failure's exit code, 0 if none.
# $1 names what is waited for; failure detail goes to $2 (the .error file).
wait_children() {
  local what=$1 errfile=$2 rc=0 p q st
  local -a pending=("${children[@]}") left
  while [[ ${#pending[@]} -gt 0 ]]; do
    left=()
    for q in "${pending[@]}"; do
      if kill -0 "$q" 2>/dev/null; then left+=("$q"); continue; fi
      st=0
      wait "$q" || st=$?
      if [[ $st -ne 0 && $rc -eq 0 ]]; then
        rc=$st
        local log=${child_log[$q]:-} last=
        if [[ -n $log ]]; then last=$(grep -v '^\s*$' "$log" 2>/dev/null | tail -n 1 | cut -c1-160 || true); fi
        echo "$what: $(basename "${log:-?}") exited with code $st$([[ $st -eq 124 ]] && echo ' (timed out)')${last:+: $last}" >"$errfile"
        for p in "${pending[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
      fi
    done
    pending=("${left[@]}")
    if [[ ${#pending[@]} -gt 0 ]]; then sleep 0.2; fi
  done
  children=()
  child_log=()
  return "$rc"
}

# Prints the address of site $1 (the bed is up).
site_addr() { "$netbed" env --name "$bed" --site "$1" | sed -n 's/^DESLOC_SITE_ADDR=//p'; }

# Slowest receiver-side goodput (Mbit/s) of n concurrent iperf3 flows site r -> site r+1.
measure_goodput() {
  local dir=$1; shift
  local -a sites=("$@")
  local n=${#sites[@]} r dst port i
  for ((r = 0; r < n; r++)); do
    dst=${sites[$(((r + 1) % n))]}; port=$((5301 + r))
    spawn "$dir/iperf-server-$r.log" timeout 20 "$netbed" exec --name "$bed" --site "$dst" -- \
      iperf3 -s -1 --forceflush -B "$(site_addr "$dst")" -p "$port"
  done
  for ((r = 0; r < n; r++)); do
    for i in $(seq 50); do grep -q listening "$dir/iperf-server-$r.log" 2>/dev/null && break; sleep 0.1; : "$i"; done
  done
  for ((r = 0; r < n; r++)); do
    dst=${sites[$(((r + 1) % n))]}; port=$((5301 + r))
    spawn "$dir/iperf-client-$r.json" timeout 20 "$netbed" exec --name "$bed" --site "${sites[$r]}" -- \
      iperf3 -c "$(site_addr "$dst")" -p "$port" -t "$kGoodputSeconds" --connect-timeout 3000 --json
  done
  if ! wait_children "iperf3" "$dir/iperf.error"; then
    say "goodput measurement failed: $(cat "$dir"/iperf-*.log 2>/dev/null | tail -n 3)"
    return 0
  fi
  "$python" - "$dir" "$n" <<'EOF'
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
bps = [json.load(open(f"{d}/iperf-client-{r}.json"))["end"]["sum_received"]["bits_per_second"]
       for r in range(n)]
print(f"{min(bps) / 1e6:.1f}")
EOF
}

run_desloc() {
  local dir=$1 n=$2 bytes=$3 deadline=$4 limit=$5; shift 5
  local -a sites=("$@")
  local r
  mkdir -p "$dir/desloc.exchange"
  for ((r = 0; r < n; r++)); do
    spawn "$dir/desloc.rank-$r.log" timeout -k 5 "$limit" \
      "$netbed" exec --name "$bed" --site "${sites[$r]}" -- \
      "$bin" rank --rank "$r" --size "$n" --exchange-dir "$dir/desloc.exchange" \
      --out "$dir/desloc.rank-$r.json" --bytes "$bytes" --warmup "$warmup" --repeats "$repeats" \
      --rndv-thresh "$rndv" --deadline-s "$deadline" --idle-ms "$idle_ms" "${desloc_args[@]}"
  done
  wait_children "desloc" "$dir/desloc.error"
}

run_gloo() {
  local dir=$1 n=$2 bytes=$3 deadline=$4 limit=$5; shift 5
  local -a sites=("$@")
  local r
  for ((r = 0; r < n; r++)); do
    spawn "$dir/gloo.rank-$r.log" timeout -k 5 "$limit" \
      "$netbed" exec --name "$bed" --site "${sites[$r]}" -- \
      "$python" "$here/wan_allreduce_gloo.py" --rank "$r" --size "$n" \
      --init-method "file://$dir/gloo.store" --bytes "$bytes" --warmup "$warmup" \
      --repeats "$repeats" --timeout-s "$deadline" --out "$dir/gloo.rank-$r.json"
  done
  wait_children "gloo" "$dir/gloo.error"
}

# mpirun runs inside the first site; its rsh agent (wan_allreduce_rsh.sh) starts one orted per
# site inside that site's namespace, so every "host" of the hostfile is a site.
run_mpi() {
  local dir=$1 n=$2 bytes=$3 deadline=$4 limit=$5; shift 5
  local -a sites=("$@")
  local s
  for s in "${sites[@]}"; do echo "$s slots=1"; done >"$dir/mpi.hosts"
  export WAN_ALLREDUCE_NETBED=$netbed WAN_ALLREDUCE_BED=$bed
  spawn "$dir/mpi.log" timeout -k 5 "$limit" \
    "$netbed" exec --name "$bed" --site "${sites[0]}" -- \
    mpirun --allow-run-as-root --oversubscribe -np "$n" --hostfile "$dir/mpi.hosts" \
    --map-by node --bind-to none \
    --mca plm_rsh_agent "$here/wan_allreduce_rsh.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$kSubnet.0/24" \
    --mca pml ob1 --mca btl tcp,self --mca btl_tcp_links 2 --mca btl_tcp_if_include "$kSubnet.0/24" \
    "${mpi_alg_mca[@]}" \
    "$mpi_bin" --bytes "$bytes" --out-dir "$dir" --warmup "$warmup" --repeats "$repeats"
  wait_children "mpi" "$dir/mpi.error"
}

run_scenario() {
  local idx=$1 spec=$2
  local name sites_csv rate_args link bottleneck class
  IFS='|' read -r name sites_csv rate_args link bottleneck class <<<"$spec"
  local -a sites rargs
  IFS=, read -r -a sites <<<"$sites_csv"
  read -r -a rargs <<<"$rate_args"
  local n=${#sites[@]} bytes=$bytes_100m
  [[ $class == 1g ]] && bytes=$bytes_1g
  local dir
  dir=$results/$(printf '%02d' "$idx")-$name
  mkdir -p "$dir"
  # Every collective must finish within 8x its ideal time at the TCP ceiling (>= 60 s); a whole
  # process within 60 s plus 4x the ideal time of all its all-reduces (startup, validation).
  local ideal_s deadline limit
  ideal_s=$(awk -v b="$bytes" -v n="$n" -v r="$bottleneck" \
    'BEGIN { printf "%.3f", b * 8 * 2 * (n - 1) / n / (r * 1e6 * 0.956) }')
  deadline=$(awk -v t="$ideal_s" 'BEGIN { t *= 8; printf "%d", (t < 60 ? 60 : t) }')
  limit=$(awk -v t="$ideal_s" -v k="$((1 + warmup + repeats))" -v d="$deadline" \
    -v idle="$idle_ms" 'BEGIN { printf "%d", d + 60 + 4 * k * t + k * idle / 1000 }')

  if [[ -n $rtt ]]; then
    local pairs='' i j
    for ((i = 0; i < n; i++)); do
      for ((j = i + 1; j < n; j++)); do pairs+="${pairs:+,}${sites[i]}-${sites[j]}=$rtt"; done
    done
    rargs+=(--rtt "$pairs")
    link+=", round trip $rtt"
  fi
  if [[ -n $tcp_buffer ]]; then
    rargs+=(--tcp-buffer "$tcp_buffer")
    link+=", TCP buffers $((tcp_buffer / kMiB)) MiB"
  fi
  if [[ $ssai -eq 0 ]]; then
    rargs+=(--no-slow-start-after-idle)
    link+=", no slow start after idle"
  fi
  if [[ -n $congestion ]]; then
    rargs+=(--congestion "$congestion")
    link+=", $congestion"
  fi
  [[ $idle_ms -eq 0 ]] || link+=", idle ${idle_ms} ms before each all-reduce"
  say "scenario $name: bringing up $n sites ($link)"
  "$netbed" up --name "$bed" --sites "$sites_csv" "${rargs[@]}" >"$dir/netbed.log"
  bed_is_up=1
  local ceiling=
  if [[ $goodput -eq 1 ]]; then ceiling=$(measure_goodput "$dir" "${sites[@]}"); fi
  {
    echo "name=$name"
    echo "n=$n"
    echo "sites=$sites_csv"
    if [[ $rate_args == --default-rate* ]]; then echo "rates=every link ${rate_args#--default-rate }"; else echo "rates=${rate_args#--rate }"; fi
    echo "link=$link"
    echo "rtt=${rtt:-0}"
    echo "bottleneck_mbit=$bottleneck"
    echo "bytes=$bytes"
    echo "ceiling_mbit=$ceiling"
  } >"$dir/scenario.txt"
  # The order rotates from one scenario to the next, so that a slow drift in background load
  # does not always fall on the same implementation.
  local -a order=(desloc gloo mpi)
  order=("${order[@]:$((idx % 3))}" "${order[@]:0:$((idx % 3))}")
  local impl
  for impl in "${order[@]}"; do
    if [[ -z ${want_impl[$impl]:-} ]]; then
      echo "not run" >"$dir/$impl.error"
      continue
    fi
    say "scenario $name: $impl, $n ranks, $((bytes / kMiB)) MiB, 1 + $warmup + $repeats all-reduces"
    if ! "run_$impl" "$dir" "$n" "$bytes" "$deadline" "$limit" "${sites[@]}"; then
      say "scenario $name: $impl failed: $(cat "$dir/$impl.error"); last log lines:"
      tail -n 5 "$dir/$impl"*.log >&2 || true
    fi
  done
  "$netbed" down --name "$bed" >/dev/null
  bed_is_up=0
  "$bin" report --scenario "$dir"
}

echo "bench_wan_allreduce: $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  ${#scenarios[@]} scenario(s); $repeats timed all-reduces after 1 validation + $warmup warmup;" \
  "$((bytes_100m / kMiB)) MiB below 1 Gbit, $((bytes_1g / kMiB)) MiB at 1 Gbit; desloc UCX_RNDV_THRESH=$rndv;" \
  "MPI allreduce algorithm: $mpi_alg; results in $results"
idx=0
for spec in "${scenarios[@]}"; do
  idx=$((idx + 1))
  run_scenario "$idx" "$spec"
done
rc=0
"$bin" summary --results "$results" || rc=$?
exit "$rc"
