"""Reference files for reading and writing Hugging Face GPT-2 weights (tests/parallel/test_gpt2_hf.c).

Builds a random tiny GPT2LMHeadModel with transformers itself (nothing is downloaded), saves it
with save_pretrained (config.json and model.safetensors, the layout every GPT-2 on the Hugging
Face hub has), and writes reference.txt: a fixed batch of tokens and targets, the mean
cross-entropy of the model's logits against the targets and the first logits, as computed by
transformers in float64.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers safetensors
    /tmp/venv/bin/python tools/make_hf_gpt2_ref.py tests/data/hf_gpt2_tiny

With --variants DIR it writes DIR/variants.txt: the loss on the reference batch with the same
weights under configs that set layer_norm_epsilon, activation_function, scale_attn_weights and
scale_attn_by_inverse_layer_idx otherwise (what meshwit must honour, not ignore).

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


# Config fields that change what GPT-2 computes, each set otherwise on the reference weights:
# (name, {field: value}) as gpt2_hf_read_config must honour them.
VARIANTS = [
    ("eps", {"layer_norm_epsilon": 0.001}),
    ("gelu", {"activation_function": "gelu"}),
    ("unscaled", {"scale_attn_weights": False}),
    ("layer_scaled", {"scale_attn_by_inverse_layer_idx": True}),
    ("all", {"layer_norm_epsilon": 0.001, "activation_function": "gelu",
             "scale_attn_weights": False, "scale_attn_by_inverse_layer_idx": True}),
]


def variants(folder):
    """variants.safetensors: the reference weights with every matrix scaled by 20 (so that
    attention scores and GELU inputs reach the range where these fields matter); variants.txt:
    the loss transformers computes on the reference batch with them, as given and under each of
    VARIANTS."""
    base = GPT2LMHeadModel.from_pretrained(folder)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if p.dim() == 2:
                p.mul_(20.0)
    from safetensors.torch import save_file
    state = {k: v.contiguous() for k, v in base.state_dict().items() if k != "lm_head.weight"}
    path = os.path.join(folder, "variants.safetensors")
    save_file(state, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)
    tokens, targets = batch(base.config.vocab_size)
    with open(os.path.join(folder, "variants.txt"), "w") as f:
        model = GPT2LMHeadModel(GPT2Config.from_pretrained(folder))
        model.load_state_dict(base.state_dict())
        loss, _ = loss_and_logits(model, tokens, targets)
        f.write(f"plain {loss:.12g} {{}}\n")
        print(f"plain: loss {loss:.9f}")
        for name, fields in VARIANTS:
            cfg = GPT2Config.from_pretrained(folder)
            for k, v in fields.items():
                setattr(cfg, k, v)
            model = GPT2LMHeadModel(cfg)
            model.load_state_dict(base.state_dict())
            loss, _ = loss_and_logits(model, tokens, targets)
            f.write(f"{name} {loss:.12g} {json.dumps(fields, separators=(',', ':'))}\n")
            print(f"{name}: loss {loss:.9f}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--variants":
        variants(sys.argv[2])
        return
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
