#!/usr/bin/env python3
"""One rank of the torch.distributed gloo peer in bench_wan_allreduce.

Started by bench/bench_wan_allreduce.sh inside its site's network namespace (`netbed.sh exec`
sets GLOO_SOCKET_IFNAME to the site's veth). It validates an all-reduce of the same integer
pattern as the desloc and MPI ranks (bench_wan_allreduce_common.hpp), warms up, times
--repeats all-reduces (each after a barrier) and writes one JSON record to --out.
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

kPeriod = 509  # bench_wan_allreduce_common.hpp: x[i] = (i + 31 r) mod 509
kRankStride = 31


def pattern(n: int, rank: int) -> torch.Tensor:
    idx = torch.arange(n, dtype=torch.int64)
    return ((idx + kRankStride * rank) % kPeriod).to(torch.float32)


def expected(n: int, size: int) -> torch.Tensor:
    table = torch.zeros(kPeriod, dtype=torch.float64)
    j = torch.arange(kPeriod, dtype=torch.int64)
    for r in range(size):
        table += ((j + kRankStride * r) % kPeriod).to(torch.float64)
    return table.to(torch.float32)[torch.arange(n, dtype=torch.int64) % kPeriod]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--init-method", required=True, help="e.g. file:///tmp/x/store or tcp://ip:port")
    p.add_argument("--bytes", type=int, required=True, help="float32 payload, a multiple of 4")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--timeout-s", type=float, default=120.0, help="deadline of every collective")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.bytes <= 0 or a.bytes % 4:
        print("--bytes must be a positive multiple of 4", file=sys.stderr)
        return 2
    if not os.environ.get("GLOO_SOCKET_IFNAME"):
        print("GLOO_SOCKET_IFNAME is unset: run inside `netbed.sh exec`", file=sys.stderr)
        return 2
    # Reduction runs on gloo's own thread; one intra-op thread matches the other ranks.
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=a.init_method, rank=a.rank,
                            world_size=a.size, timeout=datetime.timedelta(seconds=a.timeout_s))
    n = a.bytes // 4
    base = pattern(n, a.rank)
    want = expected(n, a.size)
    x = torch.empty(n, dtype=torch.float32)

    def checked(timed: bool) -> float:
        x.copy_(base)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        ms = 1e3 * (time.perf_counter() - t0)
        if not torch.equal(x, want):
            bad = int((x != want).nonzero()[0])
            raise RuntimeError(f"gloo rank {a.rank}: all-reduce result wrong at element {bad}: "
                               f"got {float(x[bad])}, expected {float(want[bad])}")
        return ms if timed else 0.0

    checked(False)  # validation; also connects every pair
    for _ in range(a.warmup):
        checked(False)
    samples = [checked(True) for _ in range(a.repeats)]
    dist.barrier()
    dist.destroy_process_group()
    record = {"impl": "gloo", "rank": a.rank, "size": a.size, "bytes": n * 4, "warmup": a.warmup,
              "validated": 1 + a.warmup + a.repeats,
              "samples_ms": [round(s, 3) for s in samples],
              "torch": torch.__version__, "ifname": os.environ["GLOO_SOCKET_IFNAME"]}
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(record, separators=(",", ":")) + "\n")
    os.replace(tmp, a.out)  # atomic: the driver never reads half a record
    s = sorted(samples)
    print(f"gloo rank {a.rank}/{a.size}: {1 + a.warmup + a.repeats} all-reduces validated; "
          f"median {s[len(s) // 2]:.1f} ms", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
