#!/usr/bin/env python3
"""Reads bench_e2e_netbed.sh's metrics and prints the end-to-end table.

For each method: median ms per step (p10..p90 spread), time to the target validation loss
counting step time only, final validation loss, wide-area bytes per rank, and ratios to the
compute-only run (method none). For DES-LOC, whether communication steals compute: its steps
without a sync against compute-only steps (target within 5%), and its sync steps' extra time
against the wire time the bytes need at the link's TCP payload rate.

With --budget (every method trained for the same wall-clock budget), also the comparison at
equal training time: each method's validation loss at sixths of the budget (its last
evaluation at or before that time), and the training time each needs to reach DDP's final
validation loss. Training time is the sum of step times, step 1 included, evaluation excluded,
as `desloc report` draws it.
"""
import argparse
import json
import statistics
import sys
import tomllib
from pathlib import Path


def rate_bits(text):
    units = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for u in sorted(units, key=len, reverse=True):
        if text.endswith(u):
            return float(text[: -len(u)]) * units[u]
    raise ValueError(f"bad rate {text!r}")


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def rank_files(results, method):
    """The leader's metrics.jsonl, then the other ranks'."""
    files = [Path(results) / method / "metrics.jsonl"]
    return files + sorted((Path(results) / method / "ranks").glob("*/metrics.jsonl"))


def rank_steps(results, method):
    """step -> [step_ms of every rank], from the leader's and the other ranks' metrics."""
    by_step = {}
    for f in rank_files(results, method):
        for line in open(f):
            l = json.loads(line)
            if l["type"] == "train":
                by_step.setdefault(l["step"], []).append(l["step_ms"])
    return by_step


def load(results, method, target):
    lines = [json.loads(l) for l in open(Path(results) / method / "metrics.jsonl")]
    train = [l for l in lines if l["type"] == "train"]
    evals = {l["step"]: l for l in lines if l["type"] == "eval"}
    ms = [l["step_ms"] for l in train[1:]]  # step 1 includes connecting and warming up
    curve, clock = [], 0.0  # (training time incl. step 1, val loss) at every evaluation
    for l in train:
        clock += l["step_ms"] / 1e3
        e = evals.get(l["step"])
        if e and e["val_loss"] is not None:
            curve.append((clock, e["val_loss"]))
    to_target = next((c for c, v in curve if v <= target), None)
    sync_bytes, prev = [], 0
    for l in train:
        if l["synced"] and l["step"] > 1:
            sync_bytes.append(l["bytes_sent"] - prev)
        prev = l["bytes_sent"]
    last_eval = evals[max(evals)] if evals else None
    # CPU seconds (user + sys) of each rank's whole process, from /usr/bin/time: what the
    # communication itself costs, whatever else the shared machine runs meanwhile.
    cpu = []
    for f in sorted(Path(results).glob(f"{method}-*.cpu")):
        fields = f.read_text().split()
        if len(fields) >= 3:
            cpu.append(float(fields[1]) + float(fields[2]))
    return dict(
        cpu_per_step=sum(cpu) / len(cpu) / len(train) if cpu and train else None,
        curve=curve, steps=len(train), mean=sum(ms) / max(1, len(ms)),
        median=statistics.median(ms), p10=quantile(ms, 0.1), p90=quantile(ms, 0.9),
        to_target=to_target, total=sum(l["step_ms"] for l in train[1:]) / 1e3,
        val=last_eval["val_loss"] if last_eval else float("nan"),
        bpb=(last_eval.get("val_bpb") or float("nan")) if last_eval else float("nan"),
        # Every wide-area byte: the job-wide averages' and (hierarchical) the regions'.
        bytes=train[-1]["bytes_sent"] + train[-1].get("region_bytes_sent", 0),
        synced=[l["step_ms"] for l in train[1:] if l["synced"]],
        sync_steps={l["step"] for l in train[1:] if l["synced"]},
        quiet=[l["step_ms"] for l in train[1:] if not l["synced"]],
        sync_bytes=sync_bytes)


def rank_means(results, method):
    """Every rank's mean step_ms and mean sync_ms (steps 2..N), leader first."""
    out = []
    for f in rank_files(results, method):
        train = [json.loads(l) for l in open(f)]
        train = [l for l in train if l["type"] == "train" and l["step"] > 1]
        if train:
            out.append((sum(l["step_ms"] for l in train) / len(train),
                        sum(l.get("sync_ms", 0.0) for l in train) / len(train)))
    return out


def wire_use(results, method):
    """Every rank's (share of its training time its batches were on the wire, mean wire ms per
    batch), from wire_ms (cumulative) and the steps that started a batch; leader first. Empty
    for runs without overlapped averages (or from before wire_ms)."""
    out = []
    for f in rank_files(results, method):
        train = [json.loads(l) for l in open(f)]
        train = [l for l in train if l["type"] == "train"]
        batches = sum(1 for l in train if l["synced"])
        if not train or not batches or not train[-1].get("wire_ms"):
            continue
        wire = train[-1]["wire_ms"]
        out.append((wire / sum(l["step_ms"] for l in train), wire / batches))
    return out


def batch_spans(results, method):
    """Every rank's batches, each as (wire ms, control ms): the growth of wire_ms and control_ms
    (cumulative, added as a batch's thread ends) between two train records, leader first. Empty
    for runs without delayed averages (or from before control_ms)."""
    out = []
    for f in rank_files(results, method):
        train = [json.loads(l) for l in open(f)]
        train = [l for l in train if l["type"] == "train" and "control_ms" in l]
        spans, wire, control = [], 0.0, 0.0
        for l in train:
            if l["wire_ms"] > wire:
                spans.append((l["wire_ms"] - wire, l["control_ms"] - control))
                wire, control = l["wire_ms"], l["control_ms"]
        if spans:
            out.append(spans)
    return out


def desloc_analysis(a, name, d, base, payload_rate):
    """Whether DES-LOC (blocking or overlapped) keeps to compute speed; prints why."""
    ok = True
    ratio = d["mean"] / base["mean"]
    print(f"\n{name}: mean step time / compute-only: {ratio:.3f} (target <= 1.03)")
    ok &= ratio <= 1.03
    # The sites share the machine's cores: without communication each runs at its own pace,
    # while a job whose sites average runs at a common one. So also every rank's mean against
    # every rank's compute-only mean.
    mine, theirs = rank_means(a.results, name), rank_means(a.results, "none")
    if len(mine) == len(theirs) > 1:
        m = statistics.mean(x for x, _ in mine)
        b = statistics.mean(x for x, _ in theirs)
        print(f"{name}: every rank's mean step / every rank's compute-only: {m / b:.3f} "
              f"({m:.1f} against {b:.1f} ms; compute-only ranks "
              f"{', '.join(f'{x:.1f}' for x, _ in theirs)} ms)")
    if mine and any(y > 0 for _, y in mine):
        print(f"{name}: time in the sync engine (sync_ms: waits for averages, snapshots, "
              f"blocking averages) per step: {', '.join(f'{y:.1f}' for _, y in mine)} ms by rank")
    wire = wire_use(a.results, name)
    if wire:
        print(f"{name}: batches on the wire (wire_ms): {', '.join(f'{b:.1%}' for b, _ in wire)} "
              f"of the training time by rank, {', '.join(f'{m:.0f}' for _, m in wire)} ms per "
              f"batch (start to last average)")
    for r, spans in enumerate(batch_spans(a.results, name)):
        w = [s for s, _ in spans]
        c = [s for _, s in spans]
        t = [s - k for s, k in spans]
        print(f"{name}: rank {r}'s {len(spans)} batches, median / p90 ms: on the wire "
              f"{quantile(w, 0.5):.0f} / {quantile(w, 0.9):.0f}, of which the control exchange "
              f"(a round trip and the wait for the slowest site) {quantile(c, 0.5):.0f} / "
              f"{quantile(c, 0.9):.0f}, the averages' transfer {quantile(t, 0.5):.0f} / "
              f"{quantile(t, 0.9):.0f}")
    if d["cpu_per_step"] and base["cpu_per_step"]:
        cpu = d["cpu_per_step"] / base["cpu_per_step"]
        print(f"{name}: CPU seconds per step (user + sys of each rank's process, from start to "
              f"exit) / compute-only's: {cpu:.3f} ({d['cpu_per_step'] * 1e3:.1f} against "
              f"{base['cpu_per_step'] * 1e3:.1f} ms; the communication's own work)")
    if d["quiet"]:
        steal = statistics.median(d["quiet"]) / base["median"]
        print(f"{name}: steps without a sync / compute-only steps: {steal:.3f} "
              f"(progress must not steal compute; target <= 1.05)")
        ok &= steal <= 1.05
    # Delayed averages leave the wire steps after their sync step: nothing to price there; a
    # hierarchical run's sync steps are mostly the regions', on other links.
    if (d["synced"] and d["sync_bytes"] and statistics.median(d["sync_bytes"]) > 0
            and "-delayed" not in name and "-regions" not in name):
        # A sync starts when the last site arrives; the others wait for it first. The last
        # site to arrive (the smallest step time at that sync) sees the sync alone.
        per_rank = rank_steps(a.results, name)
        plain = statistics.median(d["quiet"] or [base["median"]])
        synced_steps = [s for s, t in per_rank.items() if s > 1 and len(t) == a.sites
                        and max(t) - min(t) >= 0 and s in d["sync_steps"]]
        last = statistics.median(min(per_rank[s]) for s in synced_steps) - plain
        first = statistics.median(max(per_rank[s]) for s in synced_steps) - plain
        sent = statistics.median(d["sync_bytes"])
        # With two lanes (3+ sites) the bytes leave on two directions of the links at once.
        cfg = tomllib.load(open(Path(a.results) / f"{name}.toml", "rb"))
        lanes = cfg.get("transport", {}).get("lanes", 2) if a.sites >= 3 else 1
        wire = sent / (payload_rate * lanes) * 1e3
        print(f"{name}: sync steps: the last site to arrive spends +{last:.1f} ms in the sync "
              f"(the first waits +{first:.1f} ms for the others); the wire alone needs "
              f"{wire:.1f} ms for the median {sent / 1e6:.2f} MB at 0.956 x {a.rate}"
              f"{' on both directions (2 lanes)' if lanes == 2 else ''}: "
              f"{last / wire - 1:+.1%} beyond the wire")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--methods", required=True)
    ap.add_argument("--rate", required=True)
    ap.add_argument("--sites", type=int, required=True)
    ap.add_argument("--target", type=float, required=True)
    ap.add_argument("--budget", type=float, default=0.0,
                    help="seconds of training time every method was given (0: equal steps)")
    a = ap.parse_args()
    payload_rate = rate_bits(a.rate) * 0.956 / 8  # TCP payload bytes/s at MTU 1500
    rows = {m: load(a.results, m, a.target) for m in a.methods.split(",")}
    base = rows.get("none")

    print(f"\nEnd to end: {a.sites} sites on {a.rate} links, one rank per site. ms/step: median "
          f"over steps 2..N [p10..p90]; time to val <= {a.target} nats counts step time only.")
    print(f"{'method':<15} {'ms/step':>24} {'vs none':>8} {'to target':>11} {'vs none':>8} "
          f"{'steps s':>8} {'final val':>9} {'bits/byte':>9} {'WAN MB/rank':>12}")
    for m, r in rows.items():
        vs = f"{r['median'] / base['median']:.2f}x" if base else "-"
        tt = f"{r['to_target']:.1f} s" if r["to_target"] is not None else "not reached"
        tvs = (f"{r['to_target'] / base['to_target']:.2f}x"
               if base and base["to_target"] and r["to_target"] else "-")
        print(f"{m:<15} {r['median']:>9.1f} [{r['p10']:>6.1f}..{r['p90']:>6.1f}] {vs:>8} "
              f"{tt:>11} {tvs:>8} {r['total']:>8.1f} {r['val']:>9.4f} {r['bpb']:>9.4f} "
              f"{r['bytes'] / 1e6:>12.1f}")

    ok = True
    for name in [m for m in rows if m.startswith("desloc")] if base else []:
        ok &= desloc_analysis(a, name, rows[name], base, payload_rate)
    if "ddp" in rows and base:
        print(f"DDP is communication-bound: {rows['ddp']['median'] / base['median']:.2f}x the "
              f"compute-only step time")
    if a.budget > 0:
        equal_time(rows, a.budget)
    return 0 if ok else 3


def loss_at(curve, t):
    """The validation loss at training time t, interpolated linearly between the evaluations
    on either side (None: before the first; after the last, the last). Taking the last
    evaluation before t instead credits each run with its evaluation's age, up to a whole
    evaluation interval, which on a steep stretch of the curve is more than the methods
    differ by."""
    before = [(c, v) for c, v in curve if c <= t]
    if not before:
        return None
    after = [(c, v) for c, v in curve if c > t]
    if not after:
        return before[-1][1]
    (c0, v0), (c1, v1) = before[-1], after[0]
    return v0 + (v1 - v0) * (t - c0) / (c1 - c0)


def equal_time(rows, budget):
    marks = [budget * k / 6 for k in range(1, 7)]
    print(f"\nValidation loss at equal training time (budget {budget:.0f} s; interpolated between "
          f"the evaluations on either side of each time; '-' = not yet evaluated):")
    print(f"{'method':<15} {'steps':>6} {'trained s':>9} " + " ".join(f"{t:>7.0f}s" for t in marks))
    for m, r in rows.items():
        cells = [loss_at(r["curve"], t) for t in marks]  # a run that ended before t: its last
        print(f"{m:<15} {r['steps']:>6} {r['curve'][-1][0] if r['curve'] else 0:>9.1f} " +
              " ".join(f"{c:>8.4f}" if c is not None else f"{'-':>8}" for c in cells))
    flat, regional = rows.get("desloc"), rows.get("desloc-regions")
    if flat and regional and flat["curve"] and regional["curve"]:
        goal, flat_time = flat["curve"][-1][1], flat["curve"][-1][0]
        hit = next((c for c, v in regional["curve"] if v <= goal), None)
        at = loss_at(regional["curve"], flat_time * 1.02)
        print(f"\nHierarchical against flat DES-LOC: at the flat run's end ({flat_time:.1f} s) "
              f"val {flat['curve'][-1][1]:.4f} flat, "
              + (f"{at:.4f} hierarchical" if at is not None else "hierarchical not evaluated yet"))
        print(f"  training time to the flat run's final validation loss {goal:.4f}: "
              + (f"{hit:.1f} s, {hit / flat_time:.3f}x the flat run's" if hit is not None
                 else "not reached"))
    ddp = rows.get("ddp")
    if not ddp or not ddp["curve"]:
        return
    goal, ddp_time = ddp["curve"][-1][1], ddp["curve"][-1][0]
    print(f"\nTraining time to DDP's final validation loss {goal:.4f} (DDP took {ddp_time:.1f} s):")
    for m, r in rows.items():
        hit = next((c for c, v in r["curve"] if v <= goal), None)
        print(f"  {m:<15} " + (f"{hit:>8.1f} s  {hit / ddp_time:.3f}x DDP's time" if hit is not None
                               else "not reached"))


if __name__ == "__main__":
    sys.exit(main())
