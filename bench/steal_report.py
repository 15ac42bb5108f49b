#!/usr/bin/env python3
"""Paired ratios of bench_overlap_steal.sh: streaming DES-LOC against compute-only."""
import argparse
import json
import statistics
import sys
from pathlib import Path


def run(pair, method):
    lines = [json.loads(l) for l in open(pair / method / "metrics.jsonl")]
    ms = [l["step_ms"] for l in lines if l["type"] == "train"][1:]  # step 1: connecting
    cpu = []
    for f in sorted(pair.glob(f"{method}-*.cpu")):
        wall, user, sys_s = (float(x) for x in f.read_text().split()[:3])
        cpu.append(user + sys_s)
    steps = len(ms) + 1
    return statistics.median(ms), sum(cpu) / len(cpu) / steps * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--repeats", type=int, required=True)
    ap.add_argument("--label", required=True)
    a = ap.parse_args()
    print(f"bench_overlap_steal: {a.label} against compute-only, 2 sites pinned to one core "
          f"each; per pair: median ms/step (steps 2..N) and CPU ms per step (user + sys)")
    print(f"{'pair':<5} {'none ms':>8} {'stream ms':>9} {'ratio':>7} {'none cpu':>9} "
          f"{'stream cpu':>10} {'ratio':>7}")
    step_r, cpu_r = [], []
    for r in range(1, a.repeats + 1):
        pair = Path(a.results) / f"pair{r}"
        n_ms, n_cpu = run(pair, "none")
        s_ms, s_cpu = run(pair, "desloc-delayed")
        step_r.append(s_ms / n_ms)
        cpu_r.append(s_cpu / n_cpu)
        print(f"{r:<5} {n_ms:>8.1f} {s_ms:>9.1f} {step_r[-1]:>7.3f} {n_cpu:>9.1f} {s_cpu:>10.1f} "
              f"{cpu_r[-1]:>7.3f}")
    med = statistics.median(step_r)
    print(f"median step-time ratio {med:.3f} [{min(step_r):.3f}..{max(step_r):.3f}], "
          f"CPU-per-step ratio {statistics.median(cpu_r):.3f} "
          f"[{min(cpu_r):.3f}..{max(cpu_r):.3f}] (target <= 1.03)")
    return 0 if med <= 1.03 else 3


if __name__ == "__main__":
    sys.exit(main())
