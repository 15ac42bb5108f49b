#!/usr/bin/env bash
# bench_overlap_steal: does a site's communication steal its compute? (issue 13, item 4)
# Sites on the shaped test bed (by default two, each worker pinned to its own core:
# bench_e2e_netbed.sh --pin) train the same job compute-only (method none) and with delayed or
# streaming DES-LOC averages in flight on the communication thread, back to back (alternating
# which goes first), --repeats times. Each pair's ratios (the leader's median step time, every
# rank's mean step time, and CPU seconds per step of the ranks' processes) are printed, then
# their median and spread: the machine is shared and noisy, so only the paired ratios mean
# anything. Target: overlapped / compute-only <= 1.03. Two readings that need no pairing
# follow: the communication threads' share of the CPU inside each averaged run (metrics
# comm_cpu_ms over cpu_ms), and what holding the compute-only sites to one another at every
# batch (kx / fragments steps) would cost with no bytes. Runs as root. docs/benchmarks.md.
set -Eeuo pipefail

here=$(cd "$(dirname "$0")" && pwd)
prog=$(basename "$0")
repeats=3
steps=300
rate=100mbit
kx=16
delay=2
fragments=4
sites=A,B
pin=1
rtt=''
results=''
extra=()

usage() {
  cat <<USAGE
usage: $prog [--repeats N] [--steps N] [--sites A,B] [--no-pin] [--rate 100mbit] [--rtt T]
       [--kx K] [--delay TAU[,TAU_U,TAU_V]] [--fragments P] [--results DIR]
       [-- bench_e2e_netbed.sh options]
Defaults: $repeats pairs of $steps steps, sites $sites (each pinned to its own core; --no-pin
lets the kernel place them, as when more sites than cores share the machine) on $rate links
with no added round trip, streaming DES-LOC with Kx = $kx, tau = $delay, $fragments fragments.
Exit status 0: the median ratio (every rank's mean step) is within 1.03; 3: it is not.
USAGE
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --repeats) repeats=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --kx) kx=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --fragments) fragments=$2; shift 2 ;;
    --sites) sites=$2; shift 2 ;;
    --no-pin) pin=0; shift ;;
    --rtt) rtt=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; echo "$prog: error: unknown argument '$1'" >&2; exit 1 ;;
  esac
done
keep=1
if [[ -z $results ]]; then results=$(mktemp -d); keep=0; fi
mkdir -p "$results"
cleanup() { if [[ $keep -eq 0 ]]; then rm -rf "$results"; fi; }
trap cleanup EXIT
# No evaluation during the runs: with averages, each one averages x across the sites and the
# others wait at their next fold while the first site runs its forward passes, which would
# read as steal (compute-only runs evaluate without waiting for anyone).
bed_args=(--sites "$sites" --evals 0)
[[ $pin -eq 0 ]] || bed_args+=(--pin)
[[ -z $rtt ]] || bed_args+=(--rtt "$rtt")
for ((r = 1; r <= repeats; r++)); do
  echo "$prog: pair $r of $repeats" >&2
  # Alternate which run goes first, so a machine that slows down (or speeds up) over a pair
  # does not favour one side.
  order=none,desloc-delayed
  [[ $((r % 2)) -eq 1 ]] || order=desloc-delayed,none
  "$here/bench_e2e_netbed.sh" "${bed_args[@]}" --rate "$rate" --steps "$steps" --kx "$kx" \
    --delay "$delay" --fragments "$fragments" --methods "$order" \
    --results "$results/pair$r" "${extra[@]}" >"$results/pair$r.txt" 2>&1 ||
    [[ $? -eq 3 ]] || { tail -n 20 "$results/pair$r.txt" >&2; exit 1; }
done
python3 "$here/steal_report.py" --results "$results" --repeats "$repeats" \
  --window $((kx / fragments > 0 ? kx / fragments : 1)) \
  --label "DES-LOC with delayed averages (Kx $kx, tau $delay, $fragments fragment(s)), sites $sites on $rate${rtt:+, round trip $rtt}, $([[ $pin -eq 1 ]] && echo "each pinned to one core" || echo "not pinned")"
