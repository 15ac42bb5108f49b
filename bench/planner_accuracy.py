#!/usr/bin/env python3
"""The planner's ring all-reduce time against bench_wan_allreduce's measured desloc times
(docs/benchmarks.md), per test-bed scenario. Links at 0.956 x the configured rate (what
desloc profile measures), 0.01 ms latency; one lane, as that bench runs one ring. Prints a
Markdown table. usage: bench/planner_accuracy.py [path/to/desloc]"""
import subprocess, itertools, sys, tempfile, os
desloc = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "src", "desloc")
tmp = tempfile.mkdtemp()
scen = [("2s-100m","AB",{},100,16,1479),("3s-100m","ABC",{},100,16,1867),("4s-100m","ABCD",{},100,16,2102),
        ("2s-1g","AB",{},1000,128,1127),("3s-1g","ABC",{},1000,128,1502),("4s-1g","ABCD",{},1000,128,1693),
        ("het3","ABC",{"AB":1000,"BC":300,"AC":100},None,16,1865)]
print("| scenario | bytes | predicted ms | measured ms (bench_wan_allreduce) | error |")
print("| --- | --- | --- | --- | --- |")
for name, sites, rates, rate, mib, meas in scen:
    t='[meta]\nsource = "test bed: 0.956 x configured rate"\n'
    for s in sites: t+=f'[[site]]\nname = "{s}"\nstep_ms = 1\n'
    for a,b in itertools.permutations(sites,2):
        r = rate or rates["".join(sorted(a+b))]
        t+=f'[[link]]\nfrom = "{a}"\nto = "{b}"\nbandwidth_mbit = {0.956*r}\nlatency_ms = 0.01\n'
    open(f'{tmp}/pa_{name}.toml','w').write(t)
    cfg = "[sync]\nmethod = \"desloc\"\n[job]\nsites = [%s]\n" % ", ".join(f'"{s}"' for s in sites)
    cfg += "\n[transport]\nlanes = 1\n"  # bench_wan_allreduce runs one ring
    open(f'{tmp}/pa_{name}.job.toml','w').write(cfg)
    out=subprocess.run([desloc,"simulate","--topology",f"{tmp}/pa_{name}.toml","--config",f"{tmp}/pa_{name}.job.toml","--methods","ddp","--steps","1","--params",str(mib*2**20/4)],capture_output=True,text=True).stdout
    line=[l for l in out.splitlines() if l.startswith("ddp")][0].split()
    pred=float(line[4])*1e3
    print(f"| {name} | {mib} MiB | {pred:.0f} | {meas} | {100*(pred/meas-1):+.1f}% |")
