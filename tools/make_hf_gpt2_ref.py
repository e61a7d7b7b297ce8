"""Reference files for reading and writing Hugging Face GPT-2 weights (tests/parallel/test_gpt2_hf.c).

Builds a random tiny GPT2LMHeadModel with transformers itself (nothing is downloaded), saves it
with save_pretrained (config.json and model.safetensors, the layout every GPT-2 on the Hugging
Face hub has), and writes reference.txt: a fixed batch of tokens and targets, the mean
cross-entropy of the model's logits against the targets and the first logits, as computed by
transformers in float64.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers safetensors
    /tmp/venv/bin/python tools/make_hf_gpt2_ref.py tests/data/hf_gpt2_tiny

With --check DIR it instead loads DIR (a model meshwit wrote with gpt2 --save DIR/model.safetensors)
with GPT2LMHeadModel.from_pretrained and checks that its logits on the reference batch equal
those of the reference model: the other direction of the round trip.
"""
import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

B, T = 2, 8


def batch(vocab):
    g = torch.Generator().manual_seed(7)
    seq = torch.randint(0, vocab, (B * T + 1,), generator=g)
    tokens = torch.stack([seq[b * T : b * T + T] for b in range(B)])
    targets = torch.stack([seq[b * T + 1 : b * T + T + 1] for b in range(B)])
    return tokens, targets


def loss_and_logits(model, tokens, targets):
    model = model.double().eval()
    with torch.no_grad():
        logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return loss.item(), logits


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        ours = GPT2LMHeadModel.from_pretrained(sys.argv[2])
        ref = GPT2LMHeadModel.from_pretrained(os.path.join(os.path.dirname(__file__), "..", "tests", "data", "hf_gpt2_tiny"))
        tokens, targets = batch(ref.config.vocab_size)
        l1, g1 = loss_and_logits(ours, tokens, targets)
        l2, g2 = loss_and_logits(ref, tokens, targets)
        diff = (g1 - g2).abs().max().item()
        print(f"from_pretrained({sys.argv[2]}): loss {l1:.9f}, reference {l2:.9f}, max logit difference {diff:.3g}")
        sys.exit(0 if diff < 1e-5 else 1)
    out = sys.argv[1]
    torch.manual_seed(1234)
    config = GPT2Config(vocab_size=60, n_positions=16, n_embd=24, n_layer=2, n_head=3,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    # Non-trivial layer norms and biases (a fresh model has them at 1 and 0).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    extra = os.path.join(out, "generation_config.json")  # not part of the weights
    if os.path.exists(extra):
        os.remove(extra)
    tokens, targets = batch(config.vocab_size)
    loss, logits = loss_and_logits(model, tokens, targets)
    with open(os.path.join(out, "reference.txt"), "w") as f:
        f.write(f"B {B} T {T}\n")
        f.write("tokens " + " ".join(str(int(t)) for t in tokens.reshape(-1)) + "\n")
        f.write("targets " + " ".join(str(int(t)) for t in targets.reshape(-1)) + "\n")
        f.write(f"loss {loss:.12g}\n")
        first = logits[0, 0, :8]
        f.write("logits0 " + " ".join(f"{v:.9g}" for v in first.tolist()) + "\n")
    print(f"wrote {out}: loss {loss:.9f}")


if __name__ == "__main__":
    main()
