#!/usr/bin/env python3
"""Paired ratios of bench_overlap_steal.sh: DES-LOC with averages in flight against
compute-only, and the communication threads' share of the CPU inside each averaged run."""
import argparse
import json
import statistics
import sys
from pathlib import Path


def ranks_mean(pair, method):
    """The mean step_ms (steps 2..N) over every rank's steps: the leader's metrics and the
    other ranks' (bench_e2e_netbed.sh keeps them under METHOD/ranks/)."""
    files = rank_files(pair, method)
    means = []
    for f in files:
        ms = [l["step_ms"] for l in map(json.loads, open(f))
              if l["type"] == "train" and l["step"] > 1]
        if ms:
            means.append(statistics.mean(ms))
    return statistics.mean(means)


def rank_files(pair, method):
    return [pair / method / "metrics.jsonl"] + sorted((pair / method / "ranks").glob(
        "*/metrics.jsonl"))


def comm_share(pair, method):
    """The communication threads' CPU over the process's CPU of the training steps (steps
    2..N, every rank's metrics: comm_cpu_ms is cumulative, cpu_ms per step), measured inside
    the run: what the averages in flight take from the compute, with no second run to pair."""
    comm = cpu = 0.0
    for f in rank_files(pair, method):
        train = [l for l in map(json.loads, open(f)) if l["type"] == "train"]
        if len(train) < 2 or "comm_cpu_ms" not in train[-1]:
            return float("nan")
        comm += train[-1]["comm_cpu_ms"] - train[0]["comm_cpu_ms"]
        cpu += sum(l["cpu_ms"] for l in train[1:])
    return comm / cpu if cpu > 0 else float("nan")


def step_series(f):
    return [l["step_ms"] for l in map(json.loads, open(f))
            if l["type"] == "train" and l["step"] > 1]


def coupled(pair, window):
    """What holding the compute-only sites to one another every `window` steps would cost the
    job with no bytes at all: each window at the pace of its slowest site (the sum over windows
    of the slowest site's time in it) against the slowest site's total (job_ms). A job that
    averages waits for the slowest site of every window; on a machine whose step times wander
    from window to window, that alone is above 1."""
    series = [step_series(f) for f in rank_files(pair, "none")]
    n = min(len(s) for s in series)
    held = sum(max(sum(s[i:i + window]) for s in series) for i in range(0, n, window))
    return held / max(sum(s[:n]) for s in series)


def run(pair, method):
    lines = [json.loads(l) for l in open(pair / method / "metrics.jsonl")]
    ms = [l["step_ms"] for l in lines if l["type"] == "train"][1:]  # step 1: connecting
    cpu = []
    for f in sorted(pair.glob(f"{method}-*.cpu")):
        wall, user, sys_s = (float(x) for x in f.read_text().split()[:3])
        cpu.append(user + sys_s)
    steps = len(ms) + 1
    return statistics.median(ms), ranks_mean(pair, method), sum(cpu) / len(cpu) / steps * 1e3


def job_ms(pair, method):
    """The job's training time: the slowest site's steps (2..N) summed. A job is done when its
    last site is; compute-only sites never wait for one another, so every rank's mean credits
    that run with its fast sites' speed, which no job that averages can have."""
    return max(sum(step_series(f)) for f in rank_files(pair, method))


def spread(xs):
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}..{max(xs):.3f}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--repeats", type=int, required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--window", type=int, default=0,
                    help="steps between the averaged runs' batches (kx / fragments): also print "
                         "what holding the compute-only sites to one another that often costs")
    a = ap.parse_args()
    print(f"bench_overlap_steal: {a.label}, against compute-only. Per pair: the leader's median "
          f"ms/step, every rank's mean ms/step (steps 2..N), CPU ms per step (user + sys), the "
          f"job's training time (its slowest site's steps) and the communication threads' CPU "
          f"over the steps' CPU")
    print(f"{'pair':<5} {'none med':>8} {'dl med':>8} {'ratio':>6} {'none mean':>9} "
          f"{'dl mean':>8} {'ratio':>6} {'none cpu':>8} {'dl cpu':>8} {'ratio':>6} {'job':>6} "
          f"{'comm/cpu':>8}")
    med_r, mean_r, cpu_r, job_r, comm_r = [], [], [], [], []
    for r in range(1, a.repeats + 1):
        pair = Path(a.results) / f"pair{r}"
        n_med, n_mean, n_cpu = run(pair, "none")
        d_med, d_mean, d_cpu = run(pair, "desloc-delayed")
        med_r.append(d_med / n_med)
        mean_r.append(d_mean / n_mean)
        cpu_r.append(d_cpu / n_cpu)
        job_r.append(job_ms(pair, "desloc-delayed") / job_ms(pair, "none"))
        comm_r.append(comm_share(pair, "desloc-delayed"))
        print(f"{r:<5} {n_med:>8.1f} {d_med:>8.1f} {med_r[-1]:>6.3f} {n_mean:>9.1f} "
              f"{d_mean:>8.1f} {mean_r[-1]:>6.3f} {n_cpu:>8.1f} {d_cpu:>8.1f} {cpu_r[-1]:>6.3f} "
              f"{job_r[-1]:>6.3f} {comm_r[-1]:>8.4f}")
    print(f"median over pairs [min..max]: leader's median step {spread(med_r)}, every rank's "
          f"mean step {spread(mean_r)}, CPU per step {spread(cpu_r)}")
    print(f"the job's training time (its slowest site's steps): {spread(job_r)} (target <= 1.03)")
    print(f"the communication threads' CPU / the training steps' CPU, inside each averaged run: "
          f"{spread(comm_r)}")
    if a.window > 0:
        held = [coupled(Path(a.results) / f"pair{r}", a.window) for r in range(1, a.repeats + 1)]
        print(f"the compute-only job, its sites held to one another every {a.window} steps (no "
              f"bytes), against its training time: {spread(held)}")
    return 0 if statistics.median(job_r) <= 1.03 else 3


if __name__ == "__main__":
    sys.exit(main())
