"""What bench/planner_accuracy.py and bench/sim_validate.py share: the test bed as
`desloc simulate` sees it (every link at 0.956 x its configured rate, the TCP payload rate at
MTU 1500, which desloc profile measures), one simulate run, and the accuracy CSV."""
import itertools
import re
import subprocess

TCP_PAYLOAD = 0.956


def bed_topology(sites, rates, latency_ms, step_ms, source):
    """topology.toml text: `rates` maps frozenset({a, b}) to Mbit/s (both directions)."""
    t = f'[meta]\nsource = "{source}"\n'
    for s in sites:
        t += f'[[site]]\nname = "{s}"\nstep_ms = {step_ms:.6g}\n'
    for x, y in itertools.permutations(sites, 2):
        t += (f'[[link]]\nfrom = "{x}"\nto = "{y}"\n'
              f'bandwidth_mbit = {TCP_PAYLOAD * rates[frozenset((x, y))]:.6g}\n'
              f'latency_ms = {latency_ms:.6g}\n')
    return t


def simulate(desloc, topology, config, method, *args):
    """The whitespace-split row of `method` in `desloc simulate`'s table."""
    out = subprocess.run(
        [desloc, "simulate", "--topology", str(topology), "--config", str(config), "--methods",
         method, *args], capture_output=True, text=True, check=True).stdout
    return re.split(r"\s+", next(l for l in out.splitlines() if l.startswith(method + " ")))


def append_csv(path, rows):
    """Appends `kind,label,predicted_s,measured_s` rows (docs/accuracy.csv's format)."""
    if path:
        with open(path, "a") as f:
            f.write("".join(r + "\n" for r in rows))
