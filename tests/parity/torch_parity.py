#!/usr/bin/env python3
"""PyTorch parity of the desloc CPU GPT: rebuilds the model in torch from the weights that
parity_export writes, then compares logits, loss, every parameter gradient and the losses of
the first optimizer steps (AdamW via torch.optim.AdamW, ADOPT written out by hand).

Exit codes: 0 parity holds, 1 parity fails (or torch is missing while CI=true), 77 skipped.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

SKIP = 77
GRAD_TOL = 1e-4   # relative error max|a-b| / max|b| per tensor (the fp32 bound)
STEP_TOL = 1e-4   # relative error of each optimizer-step loss


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--export", required=True, help="path of the parity_export program")
    ap.add_argument("--work-dir", help="where parity_export writes (default: a temp directory)")
    args = ap.parse_args()

    try:
        import numpy as np
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        msg = f"torch_parity: cannot import torch/numpy with {sys.executable}: {e}"
        if os.environ.get("CI") == "true":
            print(msg + "\nCI=true, so this is a failure: install python3-torch (apt).")
            return 1
        print(msg + "\nskipping (set CI=true to make this a failure).")
        return SKIP

    with tempfile.TemporaryDirectory(prefix="desloc_parity_") as tmp:
        out = args.work_dir or tmp
        os.makedirs(out, exist_ok=True)
        run = subprocess.run([args.export, out], capture_output=True, text=True)
        if run.returncode != 0:
            print(f"torch_parity: {args.export} failed with exit code {run.returncode}:\n"
                  f"{run.stdout}{run.stderr}")
            return 1
        return compare(out, np, torch, F)


def compare(out, np, torch, F):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with open(os.path.join(out, "manifest.json")) as f:
        man = json.load(f)
    cfg = man["config"]
    V, C, L, NH = cfg["vocab"], cfg["d_model"], cfg["layers"], cfg["heads"]
    B, T = man["B"], man["T"]
    hd = C // NH

    def load(name, dtype):
        return np.fromfile(os.path.join(out, name), dtype=dtype)

    flat = load("params.bin", "<f4")
    grads = load("grads.bin", "<f4")
    logits_c = torch.from_numpy(load("logits.bin", "<f4").reshape(B, T, V).copy())
    idx = torch.from_numpy(load("inputs.bin", "<i4").astype(np.int64).reshape(B, T))
    tgt = torch.from_numpy(load("targets.bin", "<i4").astype(np.int64).reshape(B, T))
    tensors = man["tensors"]
    total = sum(t["numel"] for t in tensors)
    if flat.size != total or grads.size != total:
        print(f"torch_parity: params.bin has {flat.size} floats, grads.bin {grads.size}, "
              f"manifest says {total}")
        return 1

    def fresh_params():
        return {t["name"]: torch.tensor(flat[t["offset"]:t["offset"] + t["numel"]]
                                        .reshape(t["shape"]), requires_grad=True)
                for t in tensors}

    mask = torch.ones(T, T, dtype=torch.bool).tril()

    def forward(P):
        x = P["wte"][idx] + P["wpe"][:T]                                  # (B, T, C)
        for l in range(L):
            p = f"h.{l}."
            h = F.layer_norm(x, (C,), P[p + "ln1.weight"], P[p + "ln1.bias"], 1e-5)
            qkv = F.linear(h, P[p + "attn.qkv.weight"], P[p + "attn.qkv.bias"])  # (B, T, 3C)
            q, k, v = (a.view(B, T, NH, hd).transpose(1, 2) for a in qkv.split(C, dim=2))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))     # (B, NH, T, T)
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, P[p + "attn.proj.weight"], P[p + "attn.proj.bias"])
            h = F.layer_norm(x, (C,), P[p + "ln2.weight"], P[p + "ln2.bias"], 1e-5)
            h = F.gelu(F.linear(h, P[p + "mlp.fc.weight"], P[p + "mlp.fc.bias"]),
                       approximate="tanh")
            x = x + F.linear(h, P[p + "mlp.proj.weight"], P[p + "mlp.proj.bias"])
        x = F.layer_norm(x, (C,), P["lnf.weight"], P["lnf.bias"], 1e-5)
        logits = x @ P["wte"].t()                                         # (B, T, V)
        return logits, F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))

    def rel_err(a, b):
        a = torch.as_tensor(a, dtype=torch.float64)
        b = torch.as_tensor(b, dtype=torch.float64)
        return ((a - b).abs().max() / max(b.abs().max().item(), 1e-30)).item()

    failures = []
    P = fresh_params()
    logits_t, loss_t = forward(P)
    loss_t.backward()

    print(f"config V={V} T={T} L={L} NH={NH} C={C} B={B}; tolerance {GRAD_TOL:g} "
          "(max|desloc - torch| / max|torch| per tensor)")
    print(f"{'tensor':<24}{'shape':>14}{'max|torch|':>14}{'rel err':>12}")
    rows = [("logits", tuple(logits_c.shape), logits_t.detach(), logits_c)]
    rows += [("loss", (), loss_t.detach(), torch.tensor(man["loss"]))]
    for t in tensors:
        g = torch.from_numpy(grads[t["offset"]:t["offset"] + t["numel"]].reshape(t["shape"]))
        rows.append(("grad " + t["name"], tuple(t["shape"]), P[t["name"]].grad, g))
    worst = 0.0
    for name, shape, ref, got in rows:
        e = rel_err(got, ref)
        worst = max(worst, e)
        flag = "" if e <= GRAD_TOL else "  FAIL"
        print(f"{name:<24}{str(shape):>14}{ref.abs().max().item():>14.4e}{e:>12.3e}{flag}")
        if e > GRAD_TOL:
            failures.append(f"{name}: relative error {e:.3e} > {GRAD_TOL:g}")
    print(f"worst relative error over logits, loss and gradients: {worst:.3e}")

    o = man["optim"]
    decay = [t["name"] for t in tensors if t["decay"]]
    no_decay = [t["name"] for t in tensors if not t["decay"]]

    def train(step_fn_factory):
        P = fresh_params()
        step = step_fn_factory(P)
        losses = []
        for _ in range(o["steps"]):
            for p in P.values():
                p.grad = None
            _, loss = forward(P)
            loss.backward()
            losses.append(loss.item())
            step()
        return losses

    def adamw(P):
        opt = torch.optim.AdamW(
            [{"params": [P[n] for n in decay], "weight_decay": o["weight_decay"]},
             {"params": [P[n] for n in no_decay], "weight_decay": 0.0}],
            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
        return opt.step

    def adopt(P):
        # Taniguchi et al. 2024, in the form of desloc/optim/optimizer.hpp: step 0 only sets
        # v = g^2; afterwards u = b1 u + (1-b1) clip(g / max(sqrt(v), eps), t^0.25),
        # x = x (1 - lr wd) - lr u, then v = b2 v + (1-b2) g^2.
        b1, b2, eps, lr = o["beta1"], o["beta2"], o["eps"], o["lr"]
        state = {"t": 0, "u": {n: torch.zeros_like(p) for n, p in P.items()},
                 "v": {n: torch.zeros_like(p) for n, p in P.items()}}

        @torch.no_grad()
        def step():
            t = state["t"]
            for n, p in P.items():
                g, u, v = p.grad, state["u"][n], state["v"][n]
                if t == 0:
                    v.copy_(g * g)
                    continue
                clip = t ** 0.25
                ng = (g / torch.clamp(v.sqrt(), min=eps)).clamp(-clip, clip)
                u.mul_(b1).add_(ng, alpha=1 - b1)
                wd = o["weight_decay"] if n in decay else 0.0
                p.mul_(1 - lr * wd).add_(u, alpha=-lr)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
            state["t"] = t + 1
        return step

    for name, factory in (("adamw", adamw), ("adopt", adopt)):
        ref = train(factory)
        got = man["step_losses"][name]
        print(f"\n{name}: first {len(ref)} step losses (tolerance {STEP_TOL:g} relative)")
        print(f"{'step':>4}{'desloc':>14}{'torch':>14}{'rel err':>12}")
        for s, (a, b) in enumerate(zip(got, ref)):
            e = abs(a - b) / abs(b)
            flag = "" if e <= STEP_TOL else "  FAIL"
            print(f"{s:>4}{a:>14.7f}{b:>14.7f}{e:>12.3e}{flag}")
            if e > STEP_TOL:
                failures.append(f"{name} step {s} loss: relative error {e:.3e} > {STEP_TOL:g}")
        if len(got) != len(ref):
            failures.append(f"{name}: {len(got)} step losses exported, expected {len(ref)}")
        if not ref[-1] < ref[0]:
            failures.append(f"{name}: torch loss did not fall over {len(ref)} steps")

    if failures:
        print("\nPARITY FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nparity OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
