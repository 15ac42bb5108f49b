#!/usr/bin/env python3
"""The planner's ring all-reduce time against desloc's measured one, per test-bed scenario of a
bench_wan_allreduce.sh run (its --results directory). The topology is what the bed configures:
every link at 0.956 x its rate (what desloc profile measures), a one-way latency of half the
scenario's round trip (0.01 ms without one); one lane, as that bench runs one ring. The measured
time of a repetition is its slowest rank's; the table holds the median over repetitions.
Prints a Markdown table and appends `kind,label,predicted_s,measured_s` rows to --csv.

usage: bench/planner_accuracy.py --results DIR [--desloc build/src/desloc] [--csv FILE]
"""
import argparse
import itertools
import json
import re
import statistics
import tempfile
from pathlib import Path

from bed_model import append_csv, bed_topology, simulate

UNITS = {"bit": 1e-6, "kbit": 1e-3, "mbit": 1.0, "gbit": 1e3}


def mbit(rate):
    m = re.fullmatch(r"([0-9.]+)(bit|kbit|mbit|gbit)", rate)
    if not m:
        raise ValueError(f"bad rate {rate!r}")
    return float(m.group(1)) * UNITS[m.group(2)]


def milliseconds(text):
    m = re.fullmatch(r"([0-9.]+)(us|ms|s)?", text)
    if not m:
        raise ValueError(f"bad round trip {text!r}")
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3, None: 1.0}[m.group(2)]


def scenario(d):
    kv = dict(l.split("=", 1) for l in (d / "scenario.txt").read_text().splitlines() if "=" in l)
    sites = kv["sites"].split(",")
    rates = {}
    if kv["rates"].startswith("every link "):
        every = mbit(kv["rates"][len("every link "):])
        rates = {frozenset(p): every for p in itertools.combinations(sites, 2)}
    else:
        for item in kv["rates"].split(","):
            pair, r = item.split("=")
            a, b = re.split(r"[->]", pair)
            rates[frozenset((a, b))] = mbit(r)
    return kv["name"], sites, rates, milliseconds(kv.get("rtt", "0") or "0"), int(kv["bytes"])


def measured_s(d):
    ranks = [json.loads(f.read_text()) for f in sorted(d.glob("desloc.rank-*.json"))]
    if not ranks:
        return None
    per_rep = [max(r["samples_ms"][i] for r in ranks) for i in range(len(ranks[0]["samples_ms"]))]
    return statistics.median(per_rep) / 1e3


def main():
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True, help="a bench_wan_allreduce.sh --results directory")
    ap.add_argument("--desloc", default=str(here.parent / "build" / "src" / "desloc"))
    ap.add_argument("--csv", default="")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows = []
    print("| scenario | round trip | bytes | predicted ms | measured ms | error |")
    print("| --- | --- | --- | --- | --- | --- |")
    for d in sorted(p for p in Path(a.results).iterdir() if (p / "scenario.txt").exists()):
        name, sites, rates, rtt, nbytes = scenario(d)
        meas = measured_s(d)
        if meas is None:
            continue
        (tmp / "topology.toml").write_text(bed_topology(
            sites, rates, max(rtt / 2, 0.01), 1, "test bed: 0.956 x configured rate"))
        cfg = "[sync]\nmethod = \"desloc\"\n[job]\nsites = [%s]\n" % ", ".join(f'"{s}"' for s in sites)
        cfg += "[transport]\nlanes = 1\n"  # bench_wan_allreduce runs one ring
        (tmp / "job.toml").write_text(cfg)
        pred = float(simulate(a.desloc, tmp / "topology.toml", tmp / "job.toml", "ddp", "--steps",
                              "1", "--params", str(nbytes / 4))[4])
        label = f"{name}{f' rtt {rtt:g} ms' if rtt else ''}"
        print(f"| {name} | {rtt:g} ms | {nbytes / 2**20:g} MiB | {pred * 1e3:.0f} | {meas * 1e3:.0f} "
              f"| {100 * (pred / meas - 1):+.1f}% |")
        rows.append(f"planner (all-reduce),{label},{pred:.4g},{meas:.4g}")
    append_csv(a.csv, rows)


if __name__ == "__main__":
    main()
