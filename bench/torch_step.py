#!/usr/bin/python3
"""PyTorch peer of bench_cpu_step: the same GPT model in torch, loaded by name from the weights
desloc exported, timed on the same batch at the same thread count.

Input (--dir): manifest.json {"config": {...}, "B", "T", "tensors": [{"name", "shape", "offset"}]},
params.bin (float32, flat, ParamLayout order), inputs.bin and targets.bin (int32, (B, T)).

Threads: torch.set_num_threads(--threads) sets torch's OpenMP pool; Debian's torch calls the
OpenBLAS pthread library for GEMMs, whose own pool --blas-threads sets (default: --threads).
Both pools busy-wait, so torch can oversubscribe the cores; the bench tries both settings.

Modes (every record is one JSON line on stdout):
  default   validate, then time --warmup + --repeats steps; prints {"event": "result", ...}.
  --serve   validate (writes grads.bin, prints {"event": "ready", "loss": ...}), then answers
            "time N" with {"event": "times", "ms": [...]} and "blas N" (set the OpenBLAS pool)
            until "quit" or EOF, so the C++ bench can interleave its own steps with torch's and
            both share the machine's noise.

Run it with Debian's /usr/bin/python3 (python3-torch 1.13, CPU).
"""
import argparse
import ctypes
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


class Gpt(torch.nn.Module):
    """GPT-2 style decoder, parameter names as in desloc's ParamLayout."""

    def __init__(self, cfg):
        super().__init__()
        V, T, L, C = cfg["vocab"], cfg["context"], cfg["layers"], cfg["d_model"]
        self.nh = cfg["heads"]
        self.wte = torch.nn.Parameter(torch.empty(V, C))
        self.wpe = torch.nn.Parameter(torch.empty(T, C))
        self.h = torch.nn.ModuleList()
        for _ in range(L):
            blk = torch.nn.Module()
            blk.ln1 = torch.nn.LayerNorm(C, eps=1e-5)
            blk.attn = torch.nn.Module()
            blk.attn.qkv = torch.nn.Linear(C, 3 * C)
            blk.attn.proj = torch.nn.Linear(C, C)
            blk.ln2 = torch.nn.LayerNorm(C, eps=1e-5)
            blk.mlp = torch.nn.Module()
            blk.mlp.fc = torch.nn.Linear(C, 4 * C)
            blk.mlp.proj = torch.nn.Linear(4 * C, C)
            self.h.append(blk)
        self.lnf = torch.nn.LayerNorm(C, eps=1e-5)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).tril(), persistent=False)

    def attn(self, blk, x):
        B, T, C = x.shape
        hd = C // self.nh
        q, k, v = blk.attn.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.nh, hd).transpose(1, 2)  # (B, NH, T, hd)
        k = k.view(B, T, self.nh, hd).transpose(1, 2)
        v = v.view(B, T, self.nh, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (B, NH, T, T)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return blk.attn.proj(y)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte[idx] + self.wpe[:T]
        for blk in self.h:
            x = x + self.attn(blk, blk.ln1(x))
            x = x + blk.mlp.proj(F.gelu(blk.mlp.fc(blk.ln2(x)), approximate="tanh"))
        logits = F.linear(self.lnf(x), self.wte)  # tied LM head
        return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))


def load(d):
    with open(os.path.join(d, "manifest.json")) as f:
        man = json.load(f)
    flat = np.fromfile(os.path.join(d, "params.bin"), dtype=np.float32)
    model = Gpt(man["config"])
    named = dict(model.named_parameters())
    seen = set()
    with torch.no_grad():
        for t in man["tensors"]:
            name, shape, off = t["name"], t["shape"], t["offset"]
            n = int(np.prod(shape))
            if name not in named:
                sys.exit(f"torch_step: exported tensor {name} has no counterpart in the torch model")
            p = named[name]
            if list(p.shape) != list(shape):
                sys.exit(f"torch_step: {name}: exported shape {shape}, torch shape {list(p.shape)}")
            p.copy_(torch.from_numpy(flat[off:off + n].reshape(shape)))
            seen.add(name)
    missing = set(named) - seen
    if missing:
        sys.exit(f"torch_step: torch parameters not in the export: {sorted(missing)}")
    B, T = man["B"], man["T"]
    idx = torch.from_numpy(np.fromfile(os.path.join(d, "inputs.bin"), dtype=np.int32)
                           .astype(np.int64).reshape(B, T))
    tgt = torch.from_numpy(np.fromfile(os.path.join(d, "targets.bin"), dtype=np.int32)
                           .astype(np.int64).reshape(B, T))
    return man, model, idx, tgt


def step(model, idx, tgt):
    # One training step's compute: fresh grads, forward, backward. set_to_none is torch's own
    # fastest way to clear gradients (no memset).
    model.zero_grad(set_to_none=True)
    loss = model(idx, tgt)
    loss.backward()
    return loss


def timed(model, idx, tgt, n):
    ms = []
    for _ in range(n):
        t0 = time.perf_counter()
        step(model, idx, tgt)
        ms.append(1e3 * (time.perf_counter() - t0))
    return ms


def set_blas_threads(n):
    """Sets the pool of the OpenBLAS torch calls (Debian: libblas.so.3 is OpenBLAS)."""
    lib = ctypes.CDLL("libblas.so.3")
    if not hasattr(lib, "openblas_set_num_threads"):
        sys.exit("torch_step: libblas.so.3 is not OpenBLAS; cannot set its thread count")
    lib.openblas_set_num_threads(int(n))
    return int(lib.openblas_get_num_threads())


def emit(rec):
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--blas-threads", type=int, default=0, help="OpenBLAS pool (0: --threads)")
    ap.add_argument("--serve", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    blas = set_blas_threads(args.blas_threads or args.threads)
    man, model, idx, tgt = load(args.dir)

    # Validation pass: loss and every gradient, in the ParamLayout order of the export.
    loss = step(model, idx, tgt).item()
    named = dict(model.named_parameters())
    grads = np.concatenate([named[t["name"]].grad.detach().numpy().reshape(-1)
                            for t in sorted(man["tensors"], key=lambda t: t["offset"])])
    grads.astype(np.float32).tofile(os.path.join(args.dir, "grads.bin"))
    info = {"loss": loss, "torch_version": torch.__version__,
            "threads": torch.get_num_threads(), "blas_threads": blas}

    if not args.serve:
        timed(model, idx, tgt, args.warmup)
        emit({"event": "result", **info, "ms": timed(model, idx, tgt, args.repeats)})
        return

    emit({"event": "ready", **info})
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "quit":
            break
        if cmd[0] == "time" and len(cmd) == 2:
            emit({"event": "times", "ms": timed(model, idx, tgt, int(cmd[1]))})
        elif cmd[0] == "blas" and len(cmd) == 2:
            emit({"event": "blas", "blas_threads": set_blas_threads(cmd[1])})
        else:
            emit({"event": "error", "message": f"unknown command: {line.strip()}"})


if __name__ == "__main__":
    main()
