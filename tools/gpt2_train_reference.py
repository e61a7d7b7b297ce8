#!/usr/bin/env python3
"""Trains GPT-2 in PyTorch exactly as `build/gpt2 --sequential` trains it, from an llm.c model
file, in float32 or under CPU autocast (torch.autocast("cpu", dtype=torch.bfloat16)), and prints
the loss of every step: the reference meshwit's bf16 precision is held to (the committed
tests/data/gpt2_autocast_ref.txt, read by tests/parallel/test_bf16.c, and the 150-step comparison
in the README).

The same model as llm.c and examples/common/gpt2_model.c (pre-LayerNorm, eps 1e-5, GELU tanh,
learned positions, the head tied to wte, the cross-entropy over the first V of the Vp logits);
the same data (the gpt2 example's built-in arithmetic corpus, or any byte-level file), split as
the example splits it (the last 10% held out) and read in the same order (batch k covers the
training tokens [p, p + B*T + 1) with p = (k mod count) * B*T); the same AdamW (PyTorch's,
weight decay on the parameters of rank >= 2 only) with a constant learning rate, and clipping at
--grad-clip (0: none).

Usage, with a Python that has PyTorch (never needed by the build or the tests):
  build/gpt2 --layers 4 --heads 4 --channels 256 --context 256 --steps 0 --save init.bin
  python3 tools/gpt2_train_reference.py --model init.bin --batch 8 --seq 256 --steps 150 \\
      --lr 3e-4 --precision bf16
Prints one line per step ("step k: loss X") and, last, the mean loss of steps --mean-from to the
end. --write FILE writes the reference file of the test instead (both precisions).
"""
import argparse
import math
import struct
import sys

import torch

MODEL_MAGIC, MODEL_VERSION = 20240326, 3
CORPUS_SEED, CORPUS_BYTES = 20240901, 3 << 19
M64 = (1 << 64) - 1


class Rng:
    """The gpt2 example's generator (examples/common/gpt2_data.c): splitmix64."""

    def __init__(self, seed):
        self.state = seed

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def below(self, n):
        limit = M64 - M64 % n
        while True:
            x = self.next()
            if x < limit:
                return x % n


def arithmetic_corpus(seed=CORPUS_SEED, size=CORPUS_BYTES):
    """gpt2_corpus_generate: lines "a+b=c" / "a-b=c" until at least `size` bytes."""
    r, out = Rng(seed), bytearray()
    lo, span = (0, 10, 100), (10, 90, 900)

    def operand():
        d = r.below(3)
        return lo[d] + r.below(span[d])

    while len(out) < size:
        a, b = operand(), operand()
        plus = r.below(2)
        if not plus and a < b:
            a, b = b, a
        out += b"%d%c%d=%d\n" % (a, ord("+") if plus else ord("-"), b, a + b if plus else a - b)
    return list(out)


def read_model(path):
    with open(path, "rb") as f:
        head = struct.unpack("<256i", f.read(1024))
        if head[0] != MODEL_MAGIC or head[1] != MODEL_VERSION:
            sys.exit(f"{path}: not an llm.c fp32 model file")
        maxT, V, L, NH, C, Vp = head[2:8]
        data = f.read()
    flat = torch.frombuffer(bytearray(data), dtype=torch.float32)
    shapes = [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
              ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)),
              ("attprojb", (L, C)), ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)),
              ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
              ("lnfw", (C,)), ("lnfb", (C,))]
    params, at = {}, 0
    for name, shape in shapes:
        n = math.prod(shape)
        params[name] = flat[at:at + n].clone().view(shape)
        at += n
    if at != flat.numel():
        sys.exit(f"{path}: {flat.numel()} floats, the header implies {at}")
    return dict(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp), params


def build(cfg, p):
    nn, F = torch.nn, torch.nn.functional
    C, L, NH, V = cfg["C"], cfg["L"], cfg["NH"], cfg["V"]

    def param(t):
        return nn.Parameter(t.clone())

    class Block(nn.Module):
        def __init__(self, l):
            super().__init__()
            self.ln1w, self.ln1b = param(p["ln1w"][l]), param(p["ln1b"][l])
            self.qkvw, self.qkvb = param(p["qkvw"][l]), param(p["qkvb"][l])
            self.attprojw, self.attprojb = param(p["attprojw"][l]), param(p["attprojb"][l])
            self.ln2w, self.ln2b = param(p["ln2w"][l]), param(p["ln2b"][l])
            self.fcw, self.fcb = param(p["fcw"][l]), param(p["fcb"][l])
            self.fcprojw, self.fcprojb = param(p["fcprojw"][l]), param(p["fcprojb"][l])

        def forward(self, x):
            B, T, _ = x.shape
            h = F.layer_norm(x, (C,), self.ln1w, self.ln1b, 1e-5)
            q, k, v = F.linear(h, self.qkvw, self.qkvb).split(C, dim=2)
            q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(y.transpose(1, 2).reshape(B, T, C), self.attprojw, self.attprojb)
            h = F.layer_norm(x, (C,), self.ln2w, self.ln2b, 1e-5)
            h = F.gelu(F.linear(h, self.fcw, self.fcb), approximate="tanh")
            return x + F.linear(h, self.fcprojw, self.fcprojb)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = param(p["wte"]), param(p["wpe"])
            self.blocks = nn.ModuleList(Block(l) for l in range(L))
            self.lnfw, self.lnfb = param(p["lnfw"]), param(p["lnfb"])

        def forward(self, idx, targets):
            x = self.wte[idx] + self.wpe[: idx.shape[1]]
            for b in self.blocks:
                x = b(x)
            x = F.layer_norm(x, (C,), self.lnfw, self.lnfb, 1e-5)
            logits = (x @ self.wte.t())[..., :V]
            return F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1))

    return GPT()


def train(cfg, params, tokens, a, bf16):
    torch.manual_seed(0)
    model = build(cfg, params)
    decay = [q for q in model.parameters() if q.dim() >= 2]
    other = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps)
    train_n = len(tokens) - int(len(tokens) * 0.1)
    data = torch.tensor(tokens[:train_n], dtype=torch.long)
    bt = a.batch * a.seq
    count = (train_n - 1) // bt
    losses = []
    for k in range(a.steps):
        at = (k % count) * bt
        idx = data[at:at + bt].view(a.batch, a.seq)
        tgt = data[at + 1:at + bt + 1].view(a.batch, a.seq)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(idx, tgt)
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="llm.c model file (fp32, version 3)")
    ap.add_argument("--data", help="a byte-level text file (default: the arithmetic corpus)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--grad-clip", type=float, default=0.0)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--mean-from", type=int, default=101, help="first step of the mean (1-based)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write", help="write the test's reference file (both precisions)")
    ap.add_argument("--model-source", help="how the model file was made, for --write's header")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg, params = read_model(a.model)
    if a.data:
        with open(a.data, "rb") as f:
            tokens = list(f.read())
    else:
        tokens = arithmetic_corpus()
    if a.write:
        runs = {p: train(cfg, params, tokens, a, p == "bf16") for p in ("fp32", "bf16")}
        with open(a.write, "w") as f:
            f.write("# PyTorch %s: GPT-2 (L%d NH%d C%d maxT%d V%d Vp%d) from the weights of %s "
                    "on the gpt2 example's arithmetic corpus: the loss of each step in float32 "
                    "and under autocast bf16 (tools/gpt2_train_reference.py --write)\n" %
                    (torch.__version__, cfg["L"], cfg["NH"], cfg["C"], cfg["maxT"], cfg["V"],
                     cfg["Vp"], a.model_source or a.model))
            f.write("batch %d seq %d steps %d lr %.9g beta1 %.9g beta2 %.9g eps %.9g "
                    "weight_decay %.9g grad_clip %.9g\n" % (a.batch, a.seq, a.steps, a.lr,
                                                           a.beta1, a.beta2, a.eps,
                                                           a.weight_decay, a.grad_clip))
            for k in range(a.steps):
                f.write("%d %.9g %.9g\n" % (k + 1, runs["fp32"][k], runs["bf16"][k]))
        return
    losses = train(cfg, params, tokens, a, a.precision == "bf16")
    for k, l in enumerate(losses):
        print("step %d: loss %.4f" % (k + 1, l))
    tail = losses[a.mean_from - 1:]
    if tail:
        print("mean loss of steps %d-%d: %.4f (%s)" % (a.mean_from, len(losses),
                                                       sum(tail) / len(tail), a.precision))


if __name__ == "__main__":
    main()
