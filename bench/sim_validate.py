#!/usr/bin/env python3
"""`desloc simulate` against a bench_e2e_netbed.sh run, method by method.

The topology is built from what the test bed configures: every directed link at 0.956 x its
rate, a one-way latency of half --rtt (0.05 ms without it: the bare bed's). The compute step
is measured in the same run: the mean of the method's steps without a sync, less their time in
the sync engine (`sync_ms`: a delayed average's fold may wait there; DDP syncs every step, so
it takes the compute-only run's). The shared VM's speed drifts by 10-15% between
runs, so a step time taken from another run would swamp the model's error. The simulator's
noise keeps the mean step (a factor exp(N(-jitter^2 / 2, jitter)), so the mean is passed as
it is (before stop 36 the noise had mean exp(jitter^2 / 2), and this divided by it). Each
method is simulated with the config the run used (kept in its results directory), for the
same timed steps. Prints a table and appends `kind,label,predicted_s,measured_s` rows to
--csv.

usage: bench/sim_validate.py --results DIR --rates A-B=100,B-C=100,A-C=100 [--label 3s-100m]
       [--jitter auto|SIGMA] [--csv docs/accuracy.csv] [--rtt MS]
"""
import argparse
import json
import math
from pathlib import Path

from bed_model import append_csv, bed_topology, simulate


def main():
    ap = argparse.ArgumentParser()
    here = Path(__file__).resolve().parent
    ap.add_argument("--results", required=True)
    ap.add_argument("--rates", required=True, help="A-B=Mbit,... (symmetric), every pair")
    ap.add_argument("--label", default="")
    ap.add_argument("--jitter", default="auto",
                    help="log-normal sigma of the compute step; auto = from the compute-only "
                         "run's p10..p90: ln(p90 / p10) / 2.563")
    ap.add_argument("--methods", default="none,ddp,local_adam,desloc")
    ap.add_argument("--desloc", default=str(here.parent / "build" / "src" / "desloc"))
    ap.add_argument("--csv", default="")
    ap.add_argument("--rtt", type=float, default=0.1,
                    help="the bed's round trip in ms on every link (bench_e2e_netbed.sh --rtt)")
    a = ap.parse_args()
    res = Path(a.results)
    rates = {}
    for item in a.rates.split(","):
        pair, mbit = item.split("=")
        x, y = pair.split("-")
        rates[frozenset((x, y))] = float(mbit)
    sites = sorted({s for p in rates for s in p})

    def train(method):
        lines = [json.loads(l) for l in open(res / method / "metrics.jsonl")]
        return [l for l in lines if l["type"] == "train"][1:]

    def compute(method):  # (mean step ms, jitter) from the steps without a sync
        # Less the step's time in the sync engine (sync_ms, 0 in older metrics): a delayed
        # average's fold lands on a step without a sync and may wait for the wire there.
        quiet = [l["step_ms"] - l.get("sync_ms", 0.0) for l in train(method) if not l["synced"]]
        ordered = sorted(quiet)
        p10, p90 = ordered[len(ordered) // 10], ordered[len(ordered) * 9 // 10]
        jitter = math.log(p90 / p10) / 2.563 if a.jitter == "auto" else float(a.jitter)
        return sum(quiet) / len(quiet), jitter

    print(f"{'method':<15} {'step ms':>8} {'jitter':>7} {'measured s':>11} {'predicted s':>12} {'error':>8}")
    rows = []
    for m in a.methods.split(","):
        step_ms, jitter = compute("none" if m == "ddp" else m)
        (res / "sim_topology.toml").write_text(
            bed_topology(sites, rates, a.rtt / 2, step_ms, "test bed rates x 0.956"))
        measured = sum(l["step_ms"] for l in train(m)) / 1e3
        # NAME-overlap and NAME-delayed: the method is NAME, its config says how it overlaps.
        base = m.removesuffix("-overlap").removesuffix("-delayed")
        predicted = float(simulate(a.desloc, res / "sim_topology.toml", res / f"{m}.toml", base,
                                   "--steps", str(len(train(m))), "--jitter", f"{jitter:.4f}")[2])
        print(f"{m:<15} {step_ms:>8.1f} {jitter:>7.3f} {measured:>11.1f} {predicted:>12.1f} "
              f"{100 * (predicted / measured - 1):>+7.1f}%")
        rows.append(f"simulate (job time),{a.label} {m},{predicted:.4g},{measured:.4g}")
    append_csv(a.csv, rows)


if __name__ == "__main__":
    main()
