#!/usr/bin/env python3
"""Reads bench_unequal_sites.sh's metrics and prints its table.

For each run (alone: site A by itself; equal; planned; ideal: DDP on free links): the sites'
batches and weights, median ms per step (p10..p90),
each site's mean wait per average (the control exchange's figures, wait_ms_by_site: the
slowest site's compute since the last average less the site's own), the validation loss at
sixths of the budget (the last evaluation at or before that training time) and at the end,
and the training time each run needs to reach the equal run's final validation loss. The sites
step apart between averages, so a step's training time is the latest site's: the most, over the
ranks, of the sum of its step times up to that step (evaluation excluded).
"""
import argparse
import json
import statistics
import tomllib
from pathlib import Path

SITES = ["A", "B", "C"]


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def load(results, run):
    cfg = tomllib.loads((Path(results) / f"{run}.toml").read_text())
    lines = [json.loads(l) for l in open(Path(results) / run / "metrics.jsonl")]
    train = [l for l in lines if l["type"] == "train"]
    evals = {l["step"]: l["val_loss"] for l in lines if l["type"] == "eval"}
    clock = {}  # step -> the latest rank's training time
    for f in [Path(results) / run / "metrics.jsonl", *(Path(results) / run / "ranks").glob("*/metrics.jsonl")]:
        total = 0.0
        for line in open(f):
            l = json.loads(line)
            if l["type"] == "train":
                total += l["step_ms"] / 1e3
                clock[l["step"]] = max(clock.get(l["step"], 0.0), total)
    curve = [(clock[l["step"]], evals[l["step"]]) for l in train if l["step"] in evals]
    waits = [l["wait_ms_by_site"] for l in train if l.get("wait_ms_by_site")]
    return {
        "batches": [s["batch"] for s in cfg["job"]["site"]],
        "weights": cfg["sync"]["weights"],
        "steps": len(train),
        # The job's step: the latest rank's clock from step to step (step 1 includes connecting).
        "ms": [1e3 * (clock[t] - clock[t - 1]) for t in sorted(clock) if t - 1 in clock],
        "curve": curve,
        "waits": [statistics.mean(w[i] for w in waits) if waits else float("nan")
                  for i in range(len(SITES))],
        "averages": len(waits),
    }


def at_time(curve, t):
    before = [loss for clock, loss in curve if clock <= t]
    return before[-1] if before else float("nan")


def time_to(curve, target):
    for clock, loss in curve:
        if loss <= target:
            return clock
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", required=True)
    ap.add_argument("--budget", type=float)
    ap.add_argument("--median-ms", metavar="RUN", help="print RUN's median ms per step and stop")
    a = ap.parse_args()
    if a.median_ms:
        print(f"{statistics.median(load(a.results, a.median_ms)['ms']):.1f}")
        return
    if a.budget is None:
        ap.error("--budget is required")
    runs = {r: load(a.results, r) for r in ("alone", "equal", "planned", "ideal")}
    # Runs overrun the budget by what the simulator's step missed: compare at the budget.
    target = at_time(runs["equal"]["curve"], a.budget)
    sixths = [a.budget * k / 6 for k in range(1, 7)]
    print(f"| run | batches A/B/C | weights | steps | ms/step (p10..p90) | wait per average, ms "
          f"(A/B/C) | " + " | ".join(f"val @{t:.0f} s" for t in sixths) +
          f" | time to {target:.4f} |")
    print("|---|---|---|---|---|---|" + "---|" * len(sixths) + "---|")
    for name, r in runs.items():
        ms = r["ms"]
        reach = time_to(r["curve"], target)
        print(f"| {name} | {'/'.join(map(str, r['batches']))} | {r['weights']} | {r['steps']} | "
              f"{statistics.median(ms):.0f} ({quantile(ms, 0.1):.0f}..{quantile(ms, 0.9):.0f}) | "
              f"{'/'.join(f'{w:.0f}' for w in r['waits'])} over {r['averages']} | " +
              " | ".join(f"{at_time(r['curve'], t):.4f}" for t in sixths) +
              f" | {'-' if reach is None else f'{reach:.0f} s'} |")
    e, p = runs["equal"], runs["planned"]
    reach = time_to(p["curve"], target)
    ratio = "never" if reach is None else f"{reach / a.budget:.2f}x"
    speedup = statistics.median(e["ms"]) / statistics.median(p["ms"])
    print(f"\nsequences per step: equal {sum(e['batches'])}, planned {sum(p['batches'])}; the "
          f"planned run's median step is {speedup:.2f}x shorter; it reaches the equal run's loss "
          f"at {a.budget:.0f} s in {ratio} of that time")
    # The share of the ideal gain at the budget's end: (alone - run) / (alone - ideal).
    end = {n: at_time(r["curve"], a.budget) for n, r in runs.items()}
    lo, hi = end["alone"], end["ideal"]
    if lo > hi:
        shares = ", ".join(f"{n} {100 * (lo - end[n]) / (lo - hi):.0f}%" for n in ("equal", "planned"))
        print(f"share of the ideal gain at {a.budget:.0f} s (A alone 0%, ideal DDP 100%): {shares}")
    else:
        print(f"no gain to share at {a.budget:.0f} s: A alone is at {lo:.4f}, the ideal DDP of all "
              f"three sites at {hi:.4f}; the slow sites' compute buys A nothing at this budget, "
              f"even on free links")
    for n, r in runs.items():
        print(f"{n}: {r['curve'][-1][0]:.0f} s of training in all (its steps were planned from "
              f"the simulator's step time), final validation loss {r['curve'][-1][1]:.4f}")

if __name__ == "__main__":
    main()
