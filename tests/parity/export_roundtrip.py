#!/usr/bin/env python3
"""The `desloc export` round trip outside desloc's C++: a tiny two-site job is trained on a
SentencePiece vocabulary, exported, and the export is read here with numpy and torch only
(the safetensors file parsed by hand, the GPT-2 forward written out in torch). Its logits must
match desloc's own (`desloc sample --logits-out`, the training forward) to a relative error of
1e-5 in fp32; the bf16 export must match within bf16's precision; bad input is refused.

Exit codes: 0 pass, 1 fail (or torch missing while CI=true), 77 skipped.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SKIP = 77
FP32_TOL = 1e-5  # max |a - b| / max |b| over the logits


def corpus(lines):
    words = ("the jury said that county election produced no evidence irregular took place grand "
             "Friday investigation of Atlanta's recent primary naïve café über").split()
    out, state = [], 12345
    for i in range(lines):
        line = []
        for _ in range(3 + i % 17):
            state = (state * 1103515245 + 12345) % 2**32
            line.append(words[(state >> 16) % len(words)])
        out.append(" ".join(line) + ".")
    return "\n".join(out) + "\n"


def run(cmd, ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if ok and p.returncode != 0:
        raise SystemExit(f"export_roundtrip: {' '.join(cmd)} failed ({p.returncode}):\n"
                         f"{p.stdout}{p.stderr}")
    return p


def read_safetensors(path, np, torch):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    tensors = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        if t["dtype"] == "F32":
            arr = np.frombuffer(data[a:b], dtype="<f4").copy()
        elif t["dtype"] == "BF16":  # the high half of an fp32
            arr = (np.frombuffer(data[a:b], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"export_roundtrip: unexpected dtype {t['dtype']} for {name}")
        assert arr.size == int(np.prod(t["shape"])), name
        tensors[name] = torch.from_numpy(arr.reshape(t["shape"]))
    assert b == len(data) or True
    return header, tensors


def gpt2_logits(cfg, w, tokens, torch, F):
    """GPT-2 as transformers defines it (Conv1D weights are (in, out)), written out."""
    C, NH, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    eps = cfg["layer_norm_epsilon"]
    T = len(tokens)
    idx = torch.tensor(tokens, dtype=torch.long)
    x = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][:T]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for l in range(L):
        p = f"transformer.h.{l}."
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(T, NH, C // NH).transpose(0, 1) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / (C // NH) ** 0.5
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return x @ w["transformer.wte.weight"].T  # the tied head


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--desloc", required=True)
    ap.add_argument("--work-dir")
    args = ap.parse_args()
    try:
        import numpy as np
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        msg = f"export_roundtrip: cannot import torch/numpy with {sys.executable}: {e}"
        if os.environ.get("CI") == "true":
            print(msg + "\nCI=true, so this is a failure: install python3-torch (apt).")
            return 1
        print(msg + "\nskipping (set CI=true to make this a failure).")
        return SKIP
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="desloc_export_") as tmp:
        work = args.work_dir or tmp
        if args.work_dir:  # a fresh start: the exports refuse to overwrite an earlier run's
            shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work, exist_ok=True)
        return check(args.desloc, work, np, torch, F)


def check(desloc, work, np, torch, F):
    text = os.path.join(work, "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write(corpus(3000))
    data = os.path.join(work, "data")
    run([desloc, "prepare", "--source", text, "--out", data, "--force",
         "--tokenizer", "sentencepiece", "--vocab", "400"])
    cfg_path = os.path.join(work, "job.toml")
    out_dir = os.path.join(work, "run")
    with open(cfg_path, "w") as f:
        f.write(f"""[model]
vocab = 400
context = 32
layers = 2
heads = 2
d_model = 32
[data]
dir = "{data}"
batch = 4
[train]
steps = 12
eval_every = 0
checkpoint_every = 0
out_dir = "{out_dir}"
threads = 1
[sync]
method = "desloc"
workers = 2
kx = 64
""")
    run([desloc, "train", "-c", cfg_path, "--no-progress", "--force"])
    ckpt = os.path.join(out_dir, "checkpoints", "step_00000012.ckpt")
    export = os.path.join(work, "export")
    run([desloc, "export", "--checkpoint", ckpt, "--out", export, "--force"])
    prompt = ("the jury said that the café produced no evidence of the grand investigation of "
              "Atlanta's recent primary election")
    logits_npy, tokens_npy = os.path.join(work, "logits.npy"), os.path.join(work, "tokens.npy")
    run([desloc, "sample", "--checkpoint", ckpt, "--prompt", prompt, "--tokens", "4",
         "--logits-out", logits_npy, "--prompt-tokens-out", tokens_npy])
    want = torch.from_numpy(np.load(logits_npy))
    tokens = np.load(tokens_npy).tolist()

    failures = []
    with open(os.path.join(export, "config.json")) as f:
        cfg = json.load(f)
    if (cfg["model_type"], cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["vocab_size"],
            cfg["n_positions"]) != ("gpt2", 2, 32, 2, 400, 32):
        failures.append(f"config.json does not describe the model: {cfg}")
    if not os.path.isfile(os.path.join(export, "tokenizer.model")):
        failures.append("the export has no tokenizer.model")
    header, w = read_safetensors(os.path.join(export, "model.safetensors"), np, torch)
    if "lm_head.weight" in w or w["transformer.h.0.attn.c_attn.weight"].shape != (32, 96):
        failures.append("tensor layout is not GPT-2's (tied head, Conv1D (in, out))")
    got = gpt2_logits(cfg, w, tokens, torch, F)
    rel = float((got - want).abs().max() / want.abs().max())
    print(f"export_roundtrip: fp32 logits of a {len(tokens)}-token prompt, relative error "
          f"{rel:.2e} (tolerance {FP32_TOL:.0e})")
    if not rel <= FP32_TOL:
        failures.append(f"fp32 logits differ: relative error {rel:.3e} > {FP32_TOL:.0e}")

    # One site's own x differs from the mean of the two (kx = 64 > 12 steps: never averaged).
    site0 = os.path.join(work, "export_site0")
    run([desloc, "export", "--checkpoint", ckpt, "--out", site0, "--site", "0"])
    _, w0 = read_safetensors(os.path.join(site0, "model.safetensors"), np, torch)
    if torch.equal(w0["transformer.wte.weight"], w["transformer.wte.weight"]):
        failures.append("--site 0 exported the same parameters as the mean of two sites")

    bf16 = os.path.join(work, "export_bf16")
    run([desloc, "export", "--checkpoint", ckpt, "--out", bf16, "--dtype", "bf16"])
    _, wb = read_safetensors(os.path.join(bf16, "model.safetensors"), np, torch)
    rel16 = float((gpt2_logits(cfg, wb, tokens, torch, F) - want).abs().max() / want.abs().max())
    print(f"export_roundtrip: bf16 logits, relative error {rel16:.2e}")
    if not rel16 <= 5e-2 or os.path.getsize(os.path.join(bf16, "model.safetensors")) >= \
            0.6 * os.path.getsize(os.path.join(export, "model.safetensors")):
        failures.append(f"bf16 export: relative error {rel16:.3e} or its size is wrong")

    # An existing directory is refused without --force and left as it was.
    before = sorted(os.listdir(export))
    p = run([desloc, "export", "--checkpoint", ckpt, "--out", export], ok=False)
    if p.returncode == 0 or "--force" not in p.stderr or sorted(os.listdir(export)) != before:
        failures.append(f"an existing --out was not refused: {p.returncode} {p.stderr}")
    leftovers = [n for n in os.listdir(work) if ".partial-" in n]
    if leftovers:
        failures.append(f"staging directories were left behind: {leftovers}")

    for f in failures:
        print("export_roundtrip: FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
