#!/usr/bin/env python3
"""Writes tests/data/optimizer_ref.txt: a few training steps of a small model by PyTorch's
AdamW, clip_grad_norm_ and a warm-up/cosine LambdaLR, in float64, for
tests/parallel/test_optimizer.c.

The model (the test traces the same one with meshwit ops):
    act  = gelu_tanh(x @ W1 + b1) * gain          x [Batch, In], W1 [In, Hidden]
    pred = act @ W2 + b2                          W2 [Hidden, Out]
    loss = mean((pred - y)^2)                     over Batch and Out
Weight decay applies to W1 and W2 only (meshwit decays parameters of rank >= 2); b1, gain and b2
are in a group with weight_decay 0. Every step feeds a new batch, so the gradients change from
step to step and the clipping is active in some steps and not in others (checked below).

Weights and data are drawn from a seeded generator and rounded to float32 (the values the C test
feeds); everything after that runs in float64.

The schedule, meshwit's mw_trainer_lr divided by the peak lr:
    t < warmup:          (t + 1) / warmup
    t >= decay:          min_ratio
    otherwise:           min_ratio + (1 - min_ratio) * 0.5 * (1 + cos(pi * (t - warmup) / (decay - warmup)))

clip_grad_norm_ scales by max_norm / (norm + 1e-6) where meshwit scales by max_norm / norm; the
relative difference, 1e-6 / norm, is below the test's tolerance (and Adam's step hardly depends
on a common scale of the gradients).

File layout: whitespace-separated records "name count value..." in this order:
    steps 1, batch 1, in 1, hidden 1, out 1,
    hyper 9 (lr beta1 beta2 eps weight_decay grad_clip warmup decay min_ratio),
    W1, b1, gain, W2, b2 (the starting values, row-major in the axis order above),
    then for every step: x, y, loss_norm_lr 3 (the loss before the update, the gradient norm
    before clipping, the lr of the step), W1, b1, gain, W2, b2 (after the update);
    and the word "end".

Usage: python3 tools/optimizer_reference.py [output path]   (needs torch; the tests do not)
"""
import math
import sys

import torch

STEPS, BATCH, IN, HIDDEN, OUT = 12, 6, 4, 5, 3
LR, BETA1, BETA2, EPS, WD, CLIP = 0.05, 0.9, 0.95, 1e-8, 0.1, 1.0
WARMUP, DECAY, MIN_RATIO = 3, 10, 0.1
SEED = 20261130


def f32(t):
    """Rounds to float32 and back: the value the C test holds."""
    return t.to(torch.float32).to(torch.float64)


def schedule(t):
    if t < WARMUP:
        return (t + 1) / WARMUP
    if t >= DECAY:
        return MIN_RATIO
    r = (t - WARMUP) / (DECAY - WARMUP)
    return MIN_RATIO + (1 - MIN_RATIO) * 0.5 * (1 + math.cos(math.pi * r))


def record(out, name, values):
    values = [float(v) for v in torch.as_tensor(values).reshape(-1).tolist()]
    out.append("%s %d %s" % (name, len(values), " ".join(repr(v) for v in values)))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/optimizer_ref.txt"
    gen = torch.Generator().manual_seed(SEED)
    rnd = lambda *shape, std=1.0: f32(torch.randn(*shape, generator=gen, dtype=torch.float64) * std)
    params = {
        "W1": rnd(IN, HIDDEN, std=0.8),
        "b1": rnd(HIDDEN, std=0.3),
        "gain": f32(1 + rnd(HIDDEN, std=0.2)),
        "W2": rnd(HIDDEN, OUT, std=0.8),
        "b2": rnd(OUT, std=0.3),
    }
    names = ["W1", "b1", "gain", "W2", "b2"]
    for p in params.values():
        p.requires_grad_(True)
    true_w = rnd(IN, OUT)
    opt = torch.optim.AdamW(
        [
            {"params": [params["W1"], params["W2"]], "weight_decay": WD},
            {"params": [params["b1"], params["gain"], params["b2"]], "weight_decay": 0.0},
        ],
        lr=LR, betas=(BETA1, BETA2), eps=EPS)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)

    out = []
    for name, v in (("steps", STEPS), ("batch", BATCH), ("in", IN), ("hidden", HIDDEN),
                    ("out", OUT)):
        record(out, name, [v])
    record(out, "hyper", [LR, BETA1, BETA2, EPS, WD, CLIP, WARMUP, DECAY, MIN_RATIO])
    for n in names:
        record(out, n, params[n].detach())

    clipped = 0
    for t in range(STEPS):
        x = rnd(BATCH, IN)
        y = f32(x @ true_w + rnd(BATCH, OUT, std=0.5))
        act = torch.nn.functional.gelu(x @ params["W1"] + params["b1"], approximate="tanh")
        pred = (act * params["gain"]) @ params["W2"] + params["b2"]
        loss = ((pred - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        lr = opt.param_groups[0]["lr"]
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), CLIP).item()
        clipped += norm > CLIP
        opt.step()
        sched.step()
        # Adam divides by sqrt(v_hat): where it is tiny, the float32 run's rounding of the
        # gradient (~1e-7 absolute) would be amplified beyond the test's tolerance.
        rms = min((opt.state[p]["exp_avg_sq"] / (1 - BETA2 ** (t + 1))).sqrt().min().item()
                  for p in params.values())
        assert rms > 1e-3, "sqrt(v_hat) of an element is %g at step %d" % (rms, t)
        record(out, "x", x)
        record(out, "y", y)
        record(out, "loss_norm_lr", [loss.item(), norm, lr])
        for n in names:
            record(out, n, params[n].detach())
        print("step %2d  loss %.6f  norm %.4f  lr %.5f" % (t, loss.item(), norm, lr))
    assert 0 < clipped < STEPS, "the clipping must be active in some steps only (%d)" % clipped
    out.append("end")
    with open(path, "w") as f:
        f.write("# Made by tools/optimizer_reference.py (torch %s, float64); see it for the "
                "layout.\n" % torch.__version__)
        f.write("\n".join(out) + "\n")
    print("wrote %s (%d steps, clipped in %d)" % (path, STEPS, clipped))


if __name__ == "__main__":
    main()
