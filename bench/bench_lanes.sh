#!/usr/bin/env bash
# bench_lanes: capacity-weighted lanes (issue 15, item 3). On a 3-site bed whose two ring
# directions differ (the ring A -> B -> C -> A crosses C > A at 100 Mbit; its reverse is at
# least 300 Mbit everywhere), the trainer's own two-lane average (sync::CollectiveAverager via
# `bench_wan_allreduce rank --lane-share`) at the even split against the share `desloc plan`
# chooses for the same links, back to back in alternating order, --pairs times. Every average is
# validated against its closed form before any is timed. Prints each split's median time with
# its spread, the paired ratios, and both against the alpha-beta prediction at the links'
# TCP ceiling (0.956 x the configured rate). Runs as root. docs/benchmarks.md.
set -Eeuo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
netbed=$root/scripts/netbed.sh
prog=$(basename "$0")
build=$root/build
pairs=3
bytes=$((16 << 20))
repeats=3
results=''
override=''

usage() {
  cat <<USAGE
usage: $prog [--build DIR] [--pairs N] [--bytes B] [--repeats N] [--share S] [--results DIR]
Defaults: $pairs pairs (even, weighted) of $repeats timed averages of $((bytes >> 20)) MiB each.
--share S weighs the lanes with S (on the ring A -> B -> C) instead of the plan's share.
Exit status 0: every average validated and the weighted split was faster in the median pair.
USAGE
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --share) override=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 1 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "$prog: needs root (network namespaces)" >&2; exit 1; }
bench_bin=$build/bench/bench_wan_allreduce
desloc=$build/src/desloc
[[ -x $bench_bin && -x $desloc ]] || { echo "$prog: build $bench_bin and $desloc first" >&2; exit 1; }

if [[ -z $results ]]; then
  results=$(mktemp -d)
  keep=0
else
  mkdir -p "$results"
  keep=1
fi
bed="ln$(($$ % 100000))"
cleanup() {
  "$netbed" down --name "$bed" >/dev/null 2>&1 || true
  [[ $keep -eq 1 ]] || rm -rf "$results"
}
trap cleanup EXIT

# Directed rates, Mbit/s: the ring's direction and its reverse differ.
declare -A rate=([A>B]=1000 [B>A]=1000 [B>C]=300 [C>B]=300 [A>C]=300 [C>A]=100)
rate_args=''
for k in "${!rate[@]}"; do rate_args+="${rate_args:+,}$k=${rate[$k]}mbit"; done
"$netbed" up --name "$bed" --sites A,B,C --rate "$rate_args" >/dev/null

# The plan's share, from the same links at their TCP ceiling.
{
  echo "[meta]"; echo 'source = "bench_lanes: configured rates x 0.956"'
  for s in A B C; do printf '[[site]]\nname = "%s"\nstep_ms = 100\n' "$s"; done
  for k in "${!rate[@]}"; do
    printf '[[link]]\nfrom = "%s"\nto = "%s"\nbandwidth_mbit = %s\nlatency_ms = 0.05\n' \
      "${k%>*}" "${k#*>}" "$(python3 -c "print(${rate[$k]} * 0.956)")"
  done
} >"$results/topology.toml"
cat >"$results/job.toml" <<EOF
[model]
vocab = 256
context = 64
layers = 2
heads = 4
d_model = 128
[train]
steps = 100000
[sync]
method = "desloc"
[job]
sites = ["A", "B", "C"]
EOF
"$desloc" plan --topology "$results/topology.toml" --config "$results/job.toml" \
  --target-overhead 0.5 >"$results/plan.txt"
share=$(sed -n 's/^lane_share = \([0-9.]*\).*/\1/p' "$results/plan.txt")
order=$(sed -n 's/^sites = \[\(.*\)\].*/\1/p' "$results/plan.txt" | tr -d ' "')
[[ -n $share ]] || { cat "$results/plan.txt" >&2; echo "$prog: the plan kept the even split" >&2; exit 1; }
# The ranks run the ring A -> B -> C; a plan of the reversed ring weighs the other lane.
case $order in
  A,B,C) ;;
  A,C,B) share=$(python3 -c "print(round(1 - $share, 2))") ;;
  *) echo "$prog: unexpected ring order $order" >&2; exit 1 ;;
esac
echo "$prog: plan: $(grep -m1 'schedule:' "$results/plan.txt" | sed 's/^ *//'); lane_share $share on A -> B -> C"
if [[ -n $override ]]; then
  share=$override
  echo "$prog: weighing with --share $share instead"
fi

# One run of 3 ranks at `share`; records in $results/<tag>/rank-<r>.json.
run() {
  local tag=$1 s=$2 r pids=()
  local dir=$results/$tag
  rm -rf "$dir"; mkdir -p "$dir"
  for r in 0 1 2; do
    local site
    site=$(printf '%s' ABC | cut -c$((r + 1)))
    timeout 300 "$netbed" exec --name "$bed" --site "$site" -- "$bench_bin" rank --rank "$r" \
      --size 3 --exchange-dir "$dir/addr" --out "$dir/rank-$r.json" --bytes "$bytes" \
      --repeats "$repeats" --warmup 1 --lane-share "$s" >"$dir/rank-$r.log" 2>&1 &
    pids+=("$!")
  done
  for r in 0 1 2; do
    wait "${pids[$r]}" || { tail -n 5 "$dir"/rank-*.log >&2; echo "$prog: $tag failed" >&2; exit 1; }
  done
}

for ((p = 1; p <= pairs; ++p)); do
  if ((p % 2)); then run "even-$p" 0.5; run "weighted-$p" "$share"
  else run "weighted-$p" "$share"; run "even-$p" 0.5; fi
  echo "$prog: pair $p done"
done

python3 - "$results" "$pairs" "$share" "$bytes" <<'EOF'
import json, statistics, sys
results, pairs, share, nbytes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
rate = {"AB": 1000, "BA": 1000, "BC": 300, "CB": 300, "AC": 300, "CA": 100}
def ring_s(order, b):  # alpha-beta, no latency: 2(n-1) steps of b/n over the slowest ring link
    n = len(order)
    worst = max(b / n / (rate[order[i] + order[(i + 1) % n]] * 0.956 * 1e6 / 8) for i in range(n))
    return 2 * (n - 1) * worst
def predicted(s):
    first = -(-nbytes * s // 1)
    return 1e3 * max(ring_s("ABC", first), ring_s("ACB", nbytes - first))
def run_ms(tag):  # per timed average, the slowest rank's time; the run's median
    recs = [json.load(open(f"{results}/{tag}/rank-{r}.json")) for r in range(3)]
    per = [max(r["samples_ms"][i] for r in recs) for i in range(len(recs[0]["samples_ms"]))]
    return statistics.median(per)
even = [run_ms(f"even-{p}") for p in range(1, pairs + 1)]
weighted = [run_ms(f"weighted-{p}") for p in range(1, pairs + 1)]
ratios = [w / e for w, e in zip(weighted, even)]
def line(name, xs, s):
    m = statistics.median(xs)
    print(f"{name:<22} median {m:8.1f} ms  (min {min(xs):.1f}, max {max(xs):.1f})  "
          f"prediction {predicted(s):7.1f} ms  measured / predicted {m / predicted(s):.3f}")
print(f"\n{nbytes / 2**20:.0f} MiB average, 3 sites, ring A>B 1000, B>C 300, C>A 100 Mbit; "
      f"reverse A>C 300, C>B 300, B>A 1000 Mbit")
line("even split (0.5)", even, 0.5)
line(f"weighted ({share:.2f})", weighted, share)
print(f"weighted / even, paired: median {statistics.median(ratios):.3f} "
      f"(min {min(ratios):.3f}, max {max(ratios):.3f}); predicted {predicted(share) / predicted(0.5):.3f}")
sys.exit(0 if statistics.median(ratios) < 1 else 3)
EOF
