#!/usr/bin/env bash
# bench_dashboard_cpu: what the coordinator's status endpoint costs while the dashboard is open.
# Runs the quickstart job (configs/quickstart.toml, `desloc launch --http`) twice: once with the
# endpoint idle, once with headless Chromium holding the dashboard open (it polls /api/state
# once a second; the bench checks that it did). Both runs are scraped for /metrics once a second,
# as a Prometheus would. Samples the launch process's own CPU time (the coordinator, its status
# endpoint and launch's supervision; the ranks are other processes) every second and prints,
# side by side, its CPU use as a percentage of one core per 10 s window (median, min, max) and
# over the whole run, with the ratio of the two runs. docs/cluster.md.
#
#   bench/bench_dashboard_cpu.sh [--steps 600] [--build DIR] [--results DIR]
set -Eeuo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
steps=600
results=''
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_dashboard_cpu: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
desloc=$build/src/desloc
[[ -x $desloc ]] || { echo "bench_dashboard_cpu: $desloc not built" >&2; exit 1; }
command -v chromium >/dev/null || { echo "bench_dashboard_cpu: needs chromium" >&2; exit 1; }
[[ -f $root/data/brown/dataset.toml ]] ||
  { echo "bench_dashboard_cpu: prepare data/brown first (scripts/quickstart.sh does)" >&2; exit 1; }
[[ -n $results ]] || results=$(mktemp -d /tmp/desloc_dashboard_bench.XXXXXX)
mkdir -p "$results"
echo "bench_dashboard_cpu: results in $results"
hz=$(getconf CLK_TCK)
# Whatever ends the bench, no browser or job of it is left running.
children=()
stop_children() {
  local child
  for child in "${children[@]}"; do kill "$child" 2>/dev/null || true; done
}
trap stop_children EXIT

# run NAME BROWSER(0|1): one quickstart; writes NAME.samples ("seconds ticks" per line).
run() {
  local name=$1 browser=$2 port=''
  sed -e "s|^steps = .*|steps = $steps|" "$root/configs/quickstart.toml" >"$results/$name.toml"
  (cd "$root" && exec "$desloc" launch --config "$results/$name.toml" --out-dir "$results/$name" \
    --force --quiet --http 127.0.0.1:0) >"$results/$name.log" 2>&1 &
  local pid=$! chrome=''
  children+=("$pid")
  # The port the endpoint took, from launch's "... on http://127.0.0.1:PORT/" line.
  for _ in $(seq 1 300); do
    port=$(sed -n 's|.* on http://127\.0\.0\.1:\([0-9][0-9]*\)/.*|\1|p' "$results/$name.log")
    [[ -n $port ]] && break
    kill -0 "$pid" 2>/dev/null || { cat "$results/$name.log" >&2; exit 1; }
    sleep 0.1
  done
  [[ -n $port ]] || { echo "bench_dashboard_cpu: no status endpoint in $results/$name.log" >&2; exit 1; }
  # Validate before measuring: the endpoint answers and the job trains.
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$port/api/state" 2>/dev/null | grep -q '"step":[1-9]' && break
    kill -0 "$pid" 2>/dev/null || { cat "$results/$name.log" >&2; exit 1; }
    sleep 0.2
  done
  if ((browser)); then
    chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
      --user-data-dir="$results/chrome" --remote-debugging-port=0 \
      "http://127.0.0.1:$port/" >"$results/chrome.log" 2>&1 &
    chrome=$!
    children+=("$chrome")
    sleep 3
    curl -sf "http://127.0.0.1:$port/" | grep -q '<title>desloc job</title>' ||
      { echo "bench_dashboard_cpu: the dashboard did not load" >&2; exit 1; }
  fi
  : >"$results/$name.samples"
  local t0=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    local stat
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || break
    # utime + stime: fields 14 and 15, after the parenthesised command name.
    awk -v t="$(date +%s.%N)" '{sub(/^.*\) /, ""); print t, $12 + $13}' <<<"$stat" >>"$results/$name.samples"
    # A scrape a second in both runs, as a Prometheus would; it also counts the page's polls.
    curl -sf --max-time 2 "http://127.0.0.1:$port/metrics" 2>/dev/null |
      awk '/^desloc_http_requests_total\{path="\/api\/state"\}/ {print $2}' >"$results/$name.polls.tmp" &&
      [[ -s $results/$name.polls.tmp ]] && mv "$results/$name.polls.tmp" "$results/$name.polls"
    sleep 1
  done
  wait "$pid" || { cat "$results/$name.log" >&2; echo "bench_dashboard_cpu: $name failed" >&2; exit 1; }
  [[ -n $chrome ]] && { kill "$chrome" 2>/dev/null || true; wait "$chrome" 2>/dev/null || true; }
  local polls
  polls=$(cat "$results/$name.polls" 2>/dev/null || echo 0)
  echo "  $name: $((SECONDS - t0)) s sampled, /api/state requests served: $polls"
  # The open dashboard must really have polled (about one request a second).
  if ((browser)) && ((polls < (SECONDS - t0) / 2)); then
    echo "bench_dashboard_cpu: the dashboard polled only $polls times" >&2
    exit 1
  fi
}

echo "bench_dashboard_cpu: quickstart, $steps steps, scraped once a second, no page open"
run idle 0
echo "bench_dashboard_cpu: quickstart, $steps steps, dashboard open in headless Chromium"
run open 1

python3 - "$results" "$hz" <<'EOF'
import statistics, sys
results, hz = sys.argv[1], float(sys.argv[2])
def load(name):
    rows = [tuple(map(float, l.split())) for l in open(f"{results}/{name}.samples") if l.strip()]
    windows = []
    for i in range(10, len(rows), 10):
        (t0, c0), (t1, c1) = rows[i - 10], rows[i]
        windows.append(100.0 * (c1 - c0) / hz / (t1 - t0))
    if not windows:
        sys.exit(f"bench_dashboard_cpu: the {name} run sampled {len(rows)} s, too short for a "
                 "10 s window; give more --steps")
    whole = 100.0 * (rows[-1][1] - rows[0][1]) / hz / (rows[-1][0] - rows[0][0])
    return windows, whole
idle, idle_all = load("idle")
open_, open_all = load("open")
print()
print("launch process CPU (coordinator + status endpoint + launch), % of one core")
print(f"{'run':<22}{'median':>9}{'min':>9}{'max':>9}{'whole run':>11}{'windows':>9}")
for name, w, a in (("scraped, no page", idle, idle_all), ("scraped + page open", open_, open_all)):
    print(f"{name:<22}{statistics.median(w):>9.2f}{min(w):>9.2f}{max(w):>9.2f}{a:>11.2f}{len(w):>9}")
print(f"dashboard open / idle (whole run): {open_all / idle_all:.2f}x; "
      f"cost of the open dashboard: {open_all - idle_all:+.2f}% of a core")
EOF
