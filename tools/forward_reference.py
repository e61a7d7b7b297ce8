#!/usr/bin/env python3
"""Writes tests/data/forward_ref.txt: inputs and outputs of every meshwit op, computed in float64
by NumPy, for tests/core/test_forward_ref.c.

Each case is one op (or one op on a reshaped operand) applied to float32-rounded random inputs;
the output is written in meshwit's layout for that op's result: row-major in the result's axis
order (binary ops: the larger operand's order, a's when both have the same axes; mw_dot: shared
axes, then a's other axes, then b's; mw_contract: the order asked for; reductions: the kept axes
in the input's order). The formulas are written from their definitions, independently of the C
kernels: GELU in its tanh form and exactly (x Phi(x) through math.erfc), layer norm with the biased variance and eps inside the square
root, softmax(scale * x), the causal mask "key j <= query i + (keys - queries)", cross-entropy as
log-sum-exp over the first `valid` classes minus the target's logit.

File layout: whitespace-separated records "name count value...": for each case in order, a
record "case:<name> 0", one record per input (named as in the test, f32 values or integer ids),
then "out" with the result; the word "end" closes the file.

Usage: python3 tools/forward_reference.py [output path]   (needs numpy; the tests do not)
"""
import math
import sys

import numpy as np

SEED = 20261130
rng = np.random.default_rng(SEED)


def f32(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def uniform(*shape, lo=-1.0, hi=1.0):
    return f32(rng.uniform(lo, hi, size=shape))


def away_from_zero(*shape):
    """Values with 0.5 <= |v| <= 2, for divisors."""
    return f32(rng.uniform(0.5, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape))


def gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def causal_softmax(x, scale):
    q, k = x.shape[-2], x.shape[-1]
    i = np.arange(q)[:, None]
    j = np.arange(k)[None, :]
    z = np.where(j <= i + (k - q), scale * x, -np.inf)
    return softmax(z)


def cases():
    """(name, [(input name, values)], output) in the test's order."""
    a = uniform(3, 4)
    b = uniform(4, 3)
    yield "add_any_order", [("a", a), ("b", b)], a + b.T  # b's axes are [F, B]
    a, b = uniform(3, 4), uniform(4)
    yield "sub_broadcast", [("a", a), ("b", b)], a - b[None, :]
    a, b = uniform(4), uniform(3, 4)
    yield "mul_broadcast_left", [("a", a), ("b", b)], a[None, :] * b
    a, b = uniform(3, 4), away_from_zero(3)
    yield "div_broadcast", [("a", a), ("b", b)], a / b[:, None]
    a, b = uniform(2, 3, 4), away_from_zero(2, 4)  # b [H, F] into a [H, B, F]
    yield "div_broadcast_middle", [("a", a), ("b", b)], a / b[:, None, :]
    a = uniform(3, 4)
    yield "scale", [("a", a)], np.float64(np.float32(-2.5)) * a
    x, w = uniform(3, 4), uniform(4, 2)
    yield "dot", [("x", x), ("w", w)], x @ w
    a, b = uniform(2, 3, 4), uniform(2, 5, 4)  # [H, T, D] . [H, S, D] over D -> [H, T, S]
    yield "dot_batched", [("a", a), ("b", b)], np.einsum("htd,hsd->hts", a, b)
    a, b = uniform(3, 4, 2), uniform(4, 2, 5)  # [B, F, G], [F, G, O] -> "O,B", F and G summed
    yield "contract", [("a", a), ("b", b)], np.einsum("bfg,fgo->ob", a, b)
    x = uniform(3, 4, 2)  # [B, F, G]
    yield "sum_axis", [("x", x)], x.sum(axis=1)
    yield "sum_two_axes", [("x", x)], x.sum(axis=(0, 2))
    yield "sum_all", [("x", x)], np.array([x.sum()])
    yield "mean_axis", [("x", x)], x.mean(axis=0)
    yield "mean_all", [("x", x)], np.array([x.mean()])
    x = uniform(3, 6)
    yield "slice", [("x", x)], x[:, 2:5]
    yield "select", [("x", x)], x[1, :]
    x = uniform(2, 6)  # [B, F=6] split into P=2, Q=3, then summed over P
    yield "split_sum", [("x", x)], x.reshape(2, 2, 3).sum(axis=1)
    x = uniform(2, 2, 3)  # [B, P, Q] merged into F=6, then row 4 of F selected
    yield "merge_select", [("x", x)], x.reshape(2, 6)[:, 4]
    x = f32(np.linspace(-4, 4, 17))
    yield "gelu", [("x", x)], gelu(x)
    yield "gelu_erf", [("x", x)], np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x])
    x, w, b = uniform(3, 8, lo=-2, hi=2), f32(1 + 0.3 * uniform(8)), uniform(8)
    mu = x.mean(axis=1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    yield "layernorm", [("x", x), ("w", w), ("b", b)], (x - mu) / np.sqrt(var + 1e-5) * w + b
    x = uniform(3, 5, lo=-3, hi=3)
    yield "softmax", [("x", x)], softmax(np.float64(np.float32(0.7)) * x)
    x = uniform(2, 3, 5, lo=-3, hi=3)  # [H, Q=3, K=5]: query i sees keys j <= i + 2
    yield "causal_softmax", [("x", x)], causal_softmax(x, np.float64(np.float32(0.5)))
    x = uniform(4, 4, lo=-3, hi=3)
    yield "causal_softmax_square", [("x", x)], causal_softmax(x, 1.0)
    table = uniform(5, 3)
    ids = np.array([[4, 0, 4], [2, 2, 1]])
    yield "embedding", [("table", table), ("ids", ids)], table[ids]
    logits = uniform(4, 6, lo=-3, hi=3)
    targets = np.array([0, 4, 2, 4])
    valid = logits[:, :5]
    m = valid.max(axis=1)
    lse = m + np.log(np.exp(valid - m[:, None]).sum(axis=1))
    yield "cross_entropy", [("logits", logits), ("targets", targets)], \
        lse - valid[np.arange(4), targets]


def record(out, name, values):
    values = np.asarray(values).reshape(-1)
    if values.dtype.kind in "iu":
        text = " ".join(str(int(v)) for v in values)
    else:
        text = " ".join(repr(float(v)) for v in values)
    out.append("%s %d %s" % (name, values.size, text))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/forward_ref.txt"
    out = []
    n = 0
    for name, inputs, result in cases():
        out.append("case:%s 0" % name)
        for iname, values in inputs:
            record(out, iname, values)
        record(out, "out", result)
        n += 1
    out.append("end")
    with open(path, "w") as f:
        f.write("# Made by tools/forward_reference.py (numpy %s, float64); see it for the "
                "layout.\n" % np.__version__)
        f.write("\n".join(out) + "\n")
    print("wrote %s (%d cases)" % (path, n))


if __name__ == "__main__":
    main()
