#!/usr/bin/env bash
# bench_tokenizer: the quickstart model (L4, C128, context 128) trained on the Brown corpus with
# the byte tokenizer and with SentencePiece vocabularies of several sizes, one site, the same
# steps, batch and schedule. Prints, side by side from one run: parameters, validation bytes
# per token, step time, text bytes trained per second, and the final validation loss in nats
# per token and in bits per byte (the figure that compares tokenizers), at equal steps and at
# equal training time (each run's bits per byte when it had trained as long as the byte run,
# interpolated between its evaluations). docs/benchmarks.md.
#
#   bench/bench_tokenizer.sh [--vocabs 512,1024,2048,4096,8192] [--steps 600] [--sp-model bpe]
#                            [--build DIR] [--results DIR]
set -Eeuo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
vocabs=512,1024,2048,4096,8192
steps=600
sp_model=bpe
results=''
while [[ $# -gt 0 ]]; do
  case $1 in
    --vocabs) vocabs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --sp-model) sp_model=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_tokenizer: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
desloc=$build/src/desloc
[[ -x $desloc ]] || { echo "bench_tokenizer: $desloc not built; run cmake --build $build" >&2; exit 1; }
[[ -n $results ]] || results=$(mktemp -d /tmp/desloc_tokenizer_bench.XXXXXX)
mkdir -p "$results"
echo "bench_tokenizer: results in $results"

prepare() {  # name, tokenizer args...
  local name=$1; shift
  local out=$results/data_$name
  [[ -f $out/dataset.toml ]] && return 0
  # Reuse the corpus tarball of the first preparation instead of fetching it again.
  if [[ -d $results/data_bytes/.cache ]]; then mkdir -p "$out"; cp -r "$results/data_bytes/.cache" "$out/"; fi
  "$desloc" prepare --source brown --out "$out" "$@" >"$results/prepare_$name.log" 2>&1 ||
    { echo "bench_tokenizer: prepare $name failed:" >&2; tail -5 "$results/prepare_$name.log" >&2; exit 1; }
}

train() {  # name vocab
  local name=$1 vocab=$2
  cat >"$results/$name.toml" <<TOML
[model]
vocab = $vocab
context = 128
layers = 4
heads = 4
d_model = 128
[optim]
name = "adamw"
beta2 = 0.95
weight_decay = 0.1
[schedule]
kind = "cosine"
lr = 3e-3
warmup = 30
min_lr_ratio = 0.1
[data]
dir = "$results/data_$name"
batch = 16
[train]
steps = $steps
eval_every = $((steps / 8))
eval_batches = 32
checkpoint_every = 0
out_dir = "$results/run_$name"
[sync]
method = "ddp"
workers = 1
TOML
  "$desloc" train -c "$results/$name.toml" --no-progress --force >"$results/train_$name.log" 2>&1 ||
    { echo "bench_tokenizer: training $name failed:" >&2; tail -5 "$results/train_$name.log" >&2; exit 1; }
}

names=(bytes)
prepare bytes --tokenizer bytes
for v in ${vocabs//,/ }; do
  prepare "sp$v" --tokenizer sentencepiece --vocab "$v" --sp-model "$sp_model"
  names+=("sp$v")
done
for name in "${names[@]}"; do
  vocab=256
  [[ $name == sp* ]] && vocab=${name#sp}
  echo "bench_tokenizer: training $name ($steps steps)"
  train "$name" "$vocab"
done

python3 - "$results" "${names[@]}" <<'PY'
import json, math, statistics, sys
results, names = sys.argv[1], sys.argv[2:]
def dataset(name):
    d = {}
    for line in open(f"{results}/data_{name}/dataset.toml"):
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            d[k.strip()] = v.strip().strip('"')
    return d
rows = []
for name in names:
    recs = [json.loads(l) for l in open(f"{results}/run_{name}/metrics.jsonl")]
    run = next(r for r in recs if r["type"] == "run")
    train = [r for r in recs if r["type"] == "train"]
    evals = [r for r in recs if r["type"] == "eval"]
    ms = [r["step_ms"] for r in train[len(train) // 10:]]  # the first tenth warms up
    d = dataset(name)
    bpt = int(d["val_text_bytes"]) / int(d["val_tokens"])
    tokens_per_step = run["batch"] * run["seq_len"]
    # Training seconds (evaluation excluded) at each evaluation.
    elapsed, t, i = [], 0.0, 0
    for e in evals:
        while i < len(train) and train[i]["step"] <= e["step"]:
            t += train[i]["step_ms"] / 1e3
            i += 1
        elapsed.append(t)
    q = statistics.quantiles(ms, n=10)
    rows.append((name, run["parameters"], bpt, statistics.median(ms),
                 (q[0], q[-1]), tokens_per_step * bpt / statistics.median(ms) * 1e3,
                 evals[-1]["val_loss"], evals[-1]["val_bpb"],
                 [(e["step"], e["val_bpb"]) for e in evals], list(zip(elapsed, [e["val_bpb"] for e in evals]))))

def at_time(curve, t):
    """bits per byte at training time t, linear between evaluations (None past the end)."""
    for (t0, b0), (t1, b1) in zip(curve, curve[1:]):
        if t0 <= t <= t1:
            return b0 + (b1 - b0) * (t - t0) / (t1 - t0)
    if curve and abs(curve[-1][0] - t) < 1e-9:
        return curve[-1][1]
    return None
base = rows[0]
t_bytes = base[9][-1][0]
print(f"\nequal steps ({names[0]} trained {t_bytes:.1f} s); equal time: bits/byte after {t_bytes:.1f} s "
      "of training")
print(f"{'tokenizer':>10} {'params':>9} {'bytes/tok':>9} {'step ms [p10..p90]':>20} {'text kB/s':>9} "
      f"{'val nats/tok':>12} {'val bits/byte':>13} {'vs bytes':>8} {'bits/byte equal time':>20}")
for r in rows:
    eq = at_time(r[9], t_bytes)
    eqs = f"{eq:.4f}" if eq is not None else "n/a"
    print(f"{r[0]:>10} {r[1]:>9} {r[2]:>9.3f} {r[3]:>6.1f} [{r[4][0]:>5.1f}..{r[4][1]:>5.1f}] {r[5]/1e3:>9.1f} "
          f"{r[6]:>12.4f} {r[7]:>13.4f} {r[7]/base[7]:>8.3f} {eqs:>20}")
print("\nbits per byte at each evaluation (step: bpb):")
for r in rows:
    print(f"{r[0]:>10}  " + "  ".join(f"{s}: {b:.4f}" for s, b in r[8]))
PY
