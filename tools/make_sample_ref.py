#!/usr/bin/env python3
"""Reference values for tests/parallel/test_sample.c: what Hugging Face transformers' own logits
warpers keep and the probabilities they leave, and the first numbers of SplitMix64 streams.

Each case runs TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper (min_tokens_to_keep
1) in the order generate applies them (each only where generate would add it: temperature != 1,
top_k != 0, top_p < 1), then a softmax, all in float32 as generate computes them. The cases keep
top_p away from the cumulative sums (by 1e-4 at least) and keep ties away from the nucleus' edge,
where torch.sort's order of equal values (unspecified) would decide.

Layout (the records of tests/reference_text.h: "name count value..."):
    cases 1 N
    then N times:
      config 3 temperature top_k top_p
      logits V v_0 ... v_{V-1}      (float32, exactly as printed; -inf as -inf)
      kept K id...                  (the ids left with a finite score, rising)
      probs K p...                  (their probabilities, same order)
    streams 1 M
    then M times:
      stream 5 seed u_0 u_1 u_2 u_3 (the top 53 bits of SplitMix64's first four outputs from
                                     state seed, as doubles in [0, 1))
    end

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers
    /tmp/venv/bin/python tools/make_sample_ref.py tests/data/sample_ref.txt
"""
import math
import sys

import numpy as np
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


def warped(logits, temperature, top_k, top_p):
    ws = LogitsProcessorList()
    if temperature != 1.0:
        ws.append(TemperatureLogitsWarper(temperature))
    if top_k != 0:
        ws.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        ws.append(TopPLogitsWarper(top_p))
    scores = ws(torch.zeros(1, 1, dtype=torch.long), torch.tensor([logits], dtype=torch.float32))
    return torch.softmax(scores, dim=-1)[0], torch.isfinite(scores[0])


def check_margins(logits, temperature, top_k, top_p):
    """The nucleus edge must not fall within rounding of top_p, nor between equal values."""
    x = np.asarray(logits, dtype=np.float64)
    order = sorted(range(len(x)), key=lambda i: (-x[i], i))
    if 0 < top_k < len(x):
        cut = x[order[top_k - 1]]
        order = [i for i in order if x[i] >= cut]
    if top_p >= 1.0:
        return
    w = np.array([math.exp((x[i] - x[order[0]]) / temperature) for i in order])
    cum = np.cumsum(w / w.sum())
    kept = int(np.searchsorted(cum, top_p, side="left")) + 1  # first prefix reaching top_p
    assert min(abs(cum - top_p)) > 1e-4, f"top_p {top_p} within 1e-4 of a cumulative sum"
    if kept < len(order):
        assert x[order[kept - 1]] != x[order[kept]], "a tie at the nucleus' edge"


def cases():
    rng = np.random.default_rng(20240611)
    small = [1.5, -0.25, 3.0, 0.75, 2.25, -1.0, 0.0, 1.0, 2.75, -2.5]
    ties = [1.0, 3.0, 2.0, 2.0, 0.5, 2.0, -1.0, 2.5, 0.0, 1.5]
    masked = [0.5, -math.inf, 2.0, 1.25, -math.inf, 0.0, 1.75, -0.5, 2.5, 1.0]
    twelve = [0.1 * i * i - 0.7 * i for i in range(12)]
    r64 = (rng.standard_normal(64) * 2.0).astype(np.float32).tolist()
    r1000 = (rng.standard_normal(1000) * 3.0).astype(np.float32).tolist()
    r1000b = (rng.standard_normal(1000) * 1.5).astype(np.float32).tolist()
    return [
        (small, 1.0, 0, 1.0),  # plain softmax
        (small, 0.7, 0, 1.0),  # temperature
        (ties, 1.0, 3, 1.0),  # top-k: the ties with the third largest stay
        (ties, 0.8, 2, 1.0),
        (small, 1.0, 0, 0.8),  # top-p
        (small, 1.3, 5, 0.7),  # top-k then top-p
        (twelve, 0.6, 0, 0.9),
        (masked, 1.0, 0, 0.9),  # -inf rules tokens out
        (masked, 1.0, 4, 1.0),
        (small, 1.0, 0, 0.01),  # the likeliest alone
        (small, 1.0, 20, 1.0),  # k beyond the vocabulary
        (r64, 2.5, 0, 0.5),
        (r1000, 0.9, 50, 0.9),
        (r1000b, 1.0, 0, 0.95),
    ]


def stream(seed, n):
    mask = (1 << 64) - 1
    state, out = seed, []
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        out.append((z >> 11) * 2.0**-53)
    return out


def main(path):
    lines = [
        f"# Made by tools/make_sample_ref.py (torch {torch.__version__}, "
        f"transformers {__import__('transformers').__version__}); see it for the layout."
    ]
    cs = cases()
    lines.append(f"cases 1 {len(cs)}")
    for logits, temperature, top_k, top_p in cs:
        logits = [float(np.float32(v)) for v in logits]
        check_margins(logits, temperature, top_k, top_p)
        probs, finite = warped(logits, temperature, top_k, top_p)
        kept = [i for i in range(len(logits)) if finite[i]]
        lines.append(f"config 3 {temperature!r} {top_k} {top_p!r}")
        lines.append(f"logits {len(logits)} " + " ".join(f"{v:.9g}" for v in logits))
        lines.append(f"kept {len(kept)} " + " ".join(str(i) for i in kept))
        lines.append(f"probs {len(kept)} " + " ".join(f"{float(probs[i]):.9g}" for i in kept))
    seeds = [0, 1, 42, 123456789]
    lines.append(f"streams 1 {len(seeds)}")
    for seed in seeds:
        lines.append(f"stream 5 {seed} " + " ".join(f"{u!r}" for u in stream(seed, 4)))
    lines.append("end")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
