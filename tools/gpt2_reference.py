#!/usr/bin/env python3
"""Writes tests/data/gpt2_ref.bin: the loss and every parameter gradient of a tiny GPT-2,
computed in float64 by PyTorch autograd, for tests/parallel/test_gpt2.c.

The model is GPT-2 exactly as llm.c's train_gpt2.c and examples/common/gpt2_model.c define it:
pre-LayerNorm blocks (eps 1e-5), learned position embeddings, causal multi-head self-attention
with scale 1/sqrt(head_dim) and llm.c's qkv layout (q, k, v, each heads x head_dim), GELU in its
tanh form, the output head tied to the token embedding, and the mean cross-entropy over the
first V of the Vp logits (the padded classes take no part in the softmax).

The weights are drawn from a seeded generator, rounded to float32 (the values the C test
writes), and the forward and backward passes run in float64 on those rounded values, so the
reference is the exact gradient of the float32 weights up to float64 rounding.

The same loss is also computed through PyTorch's built-in layer norm, GELU (tanh) and causal
scaled-dot-product attention, and must agree to 1e-12.

Usage: python3 tools/gpt2_reference.py [output path]   (needs torch; the tests do not)
The committed file was made with torch 2.15.0 (CPU, float64); another version may draw other
random weights from the same seed, which gives another valid reference file.

File layout (little-endian):
  header   16 x int32: magic 20240611, version 1, maxT, V, L, NH, C, Vp, B, T, then 6 zeros
  tokens   (B*T + 1) x int32: the token stream; row b of the batch is tokens[b*T : b*T+T] and its
           targets are tokens[b*T+1 : b*T+T+1] (llm.c's dataloader: targets shifted by one)
  params   float32, llm.c's model-file order: wte (Vp x C), wpe (maxT x C), ln1w (L x C),
           ln1b (L x C), qkvw (L x 3C x C), qkvb (L x 3C), attprojw (L x C x C), attprojb (L x C),
           ln2w (L x C), ln2b (L x C), fcw (L x 4C x C), fcb (L x 4C), fcprojw (L x C x 4C),
           fcprojb (L x C), lnfw (C), lnfb (C); a linear layer's weight is out x in, row-major
  loss     1 x float64: mean cross-entropy over the B*T positions
  grads    float32, d loss / d param for every parameter, same order and shapes as params
"""
import math
import struct
import sys

import torch

MAGIC, VERSION = 20240611, 1
CONFIG = dict(maxT=16, V=60, L=2, NH=3, C=24, Vp=64)
B, T = 2, 8
SEED = 20240611


def shapes(maxT, V, L, NH, C, Vp):
    """The parameters in llm.c's order, with their (stacked) shapes."""
    return [
        ("wte", (Vp, C)), ("wpe", (maxT, C)),
        ("ln1w", (L, C)), ("ln1b", (L, C)),
        ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)),
        ("attprojw", (L, C, C)), ("attprojb", (L, C)),
        ("ln2w", (L, C)), ("ln2b", (L, C)),
        ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
        ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
        ("lnfw", (C,)), ("lnfb", (C,)),
    ]


def make_weights(gen, maxT, V, L, NH, C, Vp):
    """Weights large enough that attention is far from uniform and every gradient is well away
    from zero (GPT-2's 0.02 initialisation would make most of them tiny). Normal, with standard
    deviation 1/sqrt(in) for linear weights, 0.5 for the embeddings, 0.1 for biases, and 0.2
    around 1 for layer-norm gains. The padded rows of wte get random values too, so a padded
    class that leaked into the softmax would show."""
    def normal(shape, std):
        return torch.randn(shape, generator=gen, dtype=torch.float64) * std

    w = {}
    for name, shape in shapes(maxT, V, L, NH, C, Vp):
        if name in ("wte", "wpe"):
            t = normal(shape, 0.5)
        elif name.endswith("w") and len(shape) == 3:  # linear weights, out x in
            t = normal(shape, 1.0 / math.sqrt(shape[-1]))
        elif name in ("ln1w", "ln2w", "lnfw"):
            t = 1.0 + normal(shape, 0.2)
        else:  # biases of linear layers and layer norms
            t = normal(shape, 0.1)
        w[name] = t.to(torch.float32).to(torch.float64)  # the float32 values the test writes
    return w


def layernorm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased variance, as llm.c
    return (x - mean) / torch.sqrt(var + eps) * w + b


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(w, tokens, targets, maxT, V, L, NH, C, Vp, builtins=False):
    """The mean loss, written out op by op; with builtins, through PyTorch's own layer norm,
    GELU and causal attention instead (a check of the hand-written ops)."""
    F = torch.nn.functional
    if builtins:
        ln = lambda x, w, b: F.layer_norm(x, (C,), w, b, eps=1e-5)
        act = lambda x: F.gelu(x, approximate="tanh")
    else:
        ln, act = layernorm, gelu
    Bn, Tn = tokens.shape
    hs = C // NH
    x = w["wte"][tokens] + w["wpe"][:Tn]  # [B, T, C]
    mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    for l in range(L):
        h = ln(x, w["ln1w"][l], w["ln1b"][l])
        qkv = h @ w["qkvw"][l].T + w["qkvb"][l]  # [B, T, 3C] = (q, k, v) x heads x head_dim
        q, k, v = qkv.split(C, dim=-1)
        q = q.view(Bn, Tn, NH, hs).transpose(1, 2)  # [B, NH, T, hs]
        k = k.view(Bn, Tn, NH, hs).transpose(1, 2)
        v = v.view(Bn, Tn, NH, hs).transpose(1, 2)
        if builtins:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = att @ v
        y = y.transpose(1, 2).reshape(Bn, Tn, C)
        x = x + y @ w["attprojw"][l].T + w["attprojb"][l]
        h = ln(x, w["ln2w"][l], w["ln2b"][l])
        h = act(h @ w["fcw"][l].T + w["fcb"][l])
        x = x + h @ w["fcprojw"][l].T + w["fcprojb"][l]
    x = ln(x, w["lnfw"], w["lnfb"])
    logits = x @ w["wte"].T  # [B, T, Vp]: the head is the token embedding
    return F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))


def pack_f32(t):
    """Little-endian float32 bytes of t, row-major (rounded to nearest, without numpy)."""
    values = t.to(torch.float32).flatten().tolist()
    return struct.pack("<%df" % len(values), *values)


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/gpt2_ref.bin"
    cfg = CONFIG
    gen = torch.Generator().manual_seed(SEED)
    w = make_weights(gen, **cfg)
    stream = torch.randint(0, cfg["V"], (B * T + 1,), generator=gen, dtype=torch.int64)
    tokens = stream[:-1].view(B, T)
    targets = stream[1:].view(B, T)

    for t in w.values():
        t.requires_grad_(True)
    loss = forward(w, tokens, targets, **cfg)
    loss.backward()
    with torch.no_grad():
        other = forward(w, tokens, targets, builtins=True, **cfg).item()
    assert abs(other - loss.item()) < 1e-12, (other, loss.item())

    order = shapes(**cfg)
    with open(out_path, "wb") as f:
        header = [MAGIC, VERSION, cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"],
                  B, T]
        f.write(struct.pack("<16i", *(header + [0] * (16 - len(header)))))
        f.write(struct.pack("<%di" % stream.numel(), *stream.tolist()))
        for name, _ in order:
            f.write(pack_f32(w[name].detach()))
        f.write(struct.pack("<d", loss.item()))
        for name, _ in order:
            f.write(pack_f32(w[name].grad))
    nparams = sum(t.numel() for t in w.values())
    print("%s: %d parameters, loss %.12f" % (out_path, nparams, loss.item()))


if __name__ == "__main__":
    main()
