#!/usr/bin/env python3
"""The paper's wall-clock table (DES-LOC, arXiv 2505.22549: 1B, 7B and 13B models on 100 Gb/s
links at Kx = 256) next to `desloc simulate`'s prediction.

The paper gives days, not its inputs (step count, compute step time, worker count), so this
derives them. The assumptions: S sites in a ring, fp32 states (4 bytes per parameter),
100 Gb/s links at the TCP payload ceiling 0.956, Ku = 3 Kx and Kv = 6 Kx. Under them, DDP pays
one all-reduce of the gradient per step, and DES-LOC pays (1/Kx + 1/Ku + 1/Kv) of one per step.
So the paper's DDP and DES-LOC days fix two unknowns per model: the steps N, and the compute
step t_c.

The simulator then runs all three methods from these inputs. DDP and DES-LOC reproduce the
paper by construction. Local Adam (x, u and v every Kx) is the independent check: it was not
used to derive anything.

usage: bench/paper_extrapolation.py [--desloc build/src/desloc] [--sites 4]
"""
import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DAY = 86400.0
PAPER = {  # model: (parameters, DDP days, Local Adam days, DES-LOC days)
    "1B": (1e9, 1.41, 0.64, 0.63),
    "7B": (7e9, 38.74, 24.18, 24.06),
    "13B": (13e9, 175.5, 83.34, 82.68),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = Path(__file__).resolve().parent
    ap.add_argument("--desloc", default=str(here.parent / "build" / "src" / "desloc"))
    ap.add_argument("--sites", type=int, default=4)
    ap.add_argument("--gbit", type=float, default=100.0)
    ap.add_argument("--kx", type=int, default=256)
    a = ap.parse_args()
    n = a.sites
    payload = a.gbit * 1e9 * 0.956 / 8
    per_step = 1 / a.kx + 1 / (3 * a.kx) + 1 / (6 * a.kx)
    names = [f"S{i}" for i in range(n)]
    tmp = Path(tempfile.mkdtemp())
    print(f"assumptions: {n} sites in a ring, fp32 states, {a.gbit:g} Gb/s links at 0.956 payload, "
          f"Kx = {a.kx}, Ku = 3 Kx, Kv = 6 Kx")
    print(f"{'model':<6} {'steps N':>9} {'t_c s':>7} {'T s':>7} | {'paper DDP':>10} {'LocalAdam':>10} "
          f"{'DES-LOC':>8} | {'sim DDP':>8} {'LocalAdam':>10} {'DES-LOC':>8} | Local Adam error")
    for model, (params, ddp, la, dl) in PAPER.items():
        T = 2 * (n - 1) / n * 4 * params / payload  # one ring all-reduce of a state
        NT = (ddp - dl) * DAY / (1 - per_step)      # N * T, from DDP - DES-LOC
        N = round(NT / T)
        tc = (dl * DAY - N * T * per_step) / N
        topo = "[meta]\nsource = \"derived from the paper's table\"\n"
        for s in names:
            topo += f"[[site]]\nname = \"{s}\"\nstep_ms = {tc * 1e3:.9g}\n"
        for x in names:
            for y in names:
                if x != y:
                    topo += (f"[[link]]\nfrom = \"{x}\"\nto = \"{y}\"\n"
                             f"bandwidth_mbit = {payload * 8 / 1e6:.9g}\nlatency_ms = 0.05\n")
        (tmp / "topo.toml").write_text(topo)
        quoted = ", ".join(f'"{s}"' for s in names)
        (tmp / "job.toml").write_text(
            f"[sync]\nmethod = \"desloc\"\nkx = {a.kx}\n[job]\nsites = [{quoted}]\n")
        out = subprocess.run(
            [a.desloc, "simulate", "--topology", str(tmp / "topo.toml"), "--config",
             str(tmp / "job.toml"), "--steps", str(N), "--params", str(params),
             "--methods", "ddp,local_adam,desloc"],
            capture_output=True, text=True, check=True).stdout
        days = {}
        for line in out.splitlines():
            m = re.match(r"^(ddp|local_adam|desloc)\s+\S+\s+(\S+) (days|h|s)", line)
            if m:
                v = float(m.group(2))
                days[m.group(1)] = v if m.group(3) == "days" else v / 24 if m.group(3) == "h" else v / DAY
        err = days["local_adam"] / la - 1
        print(f"{model:<6} {N:>9} {tc:>7.3f} {T:>7.3f} | {ddp:>10.2f} {la:>10.2f} {dl:>8.2f} | "
              f"{days['ddp']:>8.2f} {days['local_adam']:>10.2f} {days['desloc']:>8.2f} | {err:+.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
