#!/usr/bin/env python3
"""Regenerate the tiny Llama-family reference models and reference losses.

Run in a virtual environment with torch and transformers (not a dependency of the build):
    HF_HUB_OFFLINE=1 python tools/make_llama_refs.py OUTDIR   (then copy model.safetensors,
    config.json, config.legacy.json and ref.txt of llama-gqa, llama-tied, llama3-smooth, qwen2
    and mistral into tests/data/llama/)

Everything is deterministic: a fixed torch seed per model, explicit
re-initialisation of every parameter in sorted-name order, one CPU thread,
eager attention.
"""
import copy
import json
import math
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

torch.set_num_threads(1)
transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()
torch.use_deterministic_algorithms(True)

OUT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
V = 256
BATCH, SEQ = 4, 32
TOKEN_SEED = 1234

# ---------------------------------------------------------------- models
COMMON = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              hidden_act="silu", initializer_range=0.02, attention_dropout=0.0,
              bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=True)

MODELS = [
    # name, class, config class, seed, config kwargs, legacy (transformers 4.x style) rope keys
    ("llama-gqa", LlamaForCausalLM, LlamaConfig, 1, dict(
        intermediate_size=176, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
     dict(rope_theta=10000.0, rope_scaling=None)),
    ("llama-tied", LlamaForCausalLM, LlamaConfig, 2, dict(
        intermediate_size=176, num_key_value_heads=4, max_position_embeddings=128,
        rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
     dict(rope_theta=500000.0, rope_scaling=None)),
    ("llama3-scaled", LlamaForCausalLM, LlamaConfig, 3, dict(
        intermediate_size=176, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 32}),
     dict(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 32})),
    # Same as llama3-scaled but original_max_position_embeddings=64, so that one of the
    # 8 rotary frequencies (wavelength 32.4) falls in the smoothly interpolated band.
    ("llama3-smooth", LlamaForCausalLM, LlamaConfig, 6, dict(
        intermediate_size=176, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64}),
     dict(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 64})),
    ("qwen2", Qwen2ForCausalLM, Qwen2Config, 4, dict(
        intermediate_size=128, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        sliding_window=None, max_window_layers=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
     dict(rope_theta=1000000.0, rope_scaling=None)),
    ("mistral", MistralForCausalLM, MistralConfig, 5, dict(
        intermediate_size=160, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-6, tie_word_embeddings=False, sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
     dict(rope_theta=10000.0, rope_scaling=None)),
]

ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)


def init_params(model, seed):
    """Explicit init, independent of transformers' own _init_weights.

    Parameters are visited in sorted-name order (tied tensors once):
      *norm.weight            uniform [0.5, 1.5)
      *.bias                  randn * 0.1
      model.embed_tokens      randn * 0.25
      every other weight      randn / sqrt(in_features)   (nn.Linear: [out, in])
    """
    g = torch.Generator().manual_seed(seed)
    seen = set()
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(remove_duplicate=True)):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=g) * 0.25)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


def tokens():
    rs = np.random.RandomState(TOKEN_SEED)
    return rs.randint(0, V, size=(BATCH, SEQ + 1)).astype(np.int64)


def ce(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def fmt9(x):
    return "%.9g" % float(x)


def greedy_manual(model, prompt, n):
    ids = prompt.clone()
    with torch.no_grad():
        for _ in range(n):
            nxt = model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
    return ids


def legacy_config(cfg_json, legacy):
    d = dict(cfg_json)
    d.pop("rope_parameters", None)
    d.update(legacy)
    if d.get("rope_scaling") is None:
        d.pop("rope_scaling", None)
        d["rope_scaling"] = None
    return d


def tensor_table(path):
    rows = []
    with safe_open(path, "pt") as f:
        for k in sorted(f.keys()):
            s = f.get_slice(k)
            rows.append((k, s.get_dtype(), list(s.get_shape())))
    return rows


def build(name, cls, cfg_cls, seed, kw, legacy, ids):
    d = os.path.join(OUT, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    cfg = cfg_cls(**COMMON, **kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(cfg).float()
    init_params(model, seed)
    model.eval()
    model.generation_config.bos_token_id = None
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    model.save_pretrained(d, safe_serialization=True)
    for fn in os.listdir(d):
        os.chmod(os.path.join(d, fn), 0o644)

    # round trip: reload from disk (as saved, and with the legacy 4.x-style config)
    with open(os.path.join(d, "config.json")) as f:
        cfg_json = json.load(f)
    with open(os.path.join(d, "config.legacy.json"), "w") as f:
        json.dump(legacy_config(cfg_json, legacy), f, indent=2, sort_keys=True)
        f.write("\n")

    inp = torch.from_numpy(ids[:, :-1].copy())
    tgt = torch.from_numpy(ids[:, 1:].copy())

    with torch.no_grad():
        logits = model(inp, use_cache=False).logits
        loss = ce(logits, tgt)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits_bf = model(inp, use_cache=False).logits
        loss_bf = ce(logits_bf, tgt)

    for variant in ("config.json", "config.legacy.json"):
        with tempfile.TemporaryDirectory() as td:
            shutil.copy(os.path.join(d, "model.safetensors"), td)
            shutil.copy(os.path.join(d, variant), os.path.join(td, "config.json"))
            m2 = cls.from_pretrained(td, attn_implementation="eager", dtype=torch.float32).eval()
            with torch.no_grad():
                l2 = m2(inp, use_cache=False).logits
            assert torch.equal(l2, logits), (name, variant, (l2 - logits).abs().max())

    prompt = inp[:1, :8]
    with torch.no_grad():
        gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16,
                             min_new_tokens=16, do_sample=False)
    man = greedy_manual(model, prompt, 16)
    assert gen.shape == (1, 24) and torch.equal(gen, man), (name, gen, man)

    lines = ["model: %s" % name,
             "class: %s" % cls.__name__]
    lines += ["tokens: " + " ".join(str(int(t)) for t in row) for row in ids]
    lines.append("loss: " + fmt9(loss))
    lines.append("loss_bf16: " + fmt9(loss_bf))
    lines.append("logits0: " + " ".join("%.7g" % float(v) for v in logits[0, -1]))
    lines.append("greedy_prompt: " + " ".join(str(int(t)) for t in prompt[0]))
    lines.append("greedy: " + " ".join(str(int(t)) for t in gen[0]))

    result = dict(loss=float(loss), loss_bf16=float(loss_bf))
    if name == "llama-gqa":
        m = copy.deepcopy(model)
        m.train()
        opt = torch.optim.AdamW(m.parameters(), foreach=False, **ADAMW)
        opt.zero_grad()
        l0 = ce(m(inp, use_cache=False).logits, tgt)
        l0.backward()
        gn = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in m.parameters()))
        opt.step()
        m.eval()
        with torch.no_grad():
            l1 = ce(m(inp, use_cache=False).logits, tgt)
        assert l0.item() == loss.item()
        lines.append("grad_norm: " + fmt9(gn))
        lines.append("loss_after_step: " + fmt9(l1))
        result["loss_after_step"] = float(l1)

    with open(os.path.join(d, "ref.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    result["tensors"] = tensor_table(os.path.join(d, "model.safetensors"))
    result["config"] = cfg_json
    return result


def main():
    os.makedirs(OUT, exist_ok=True)
    ids = tokens()
    results = {}
    for spec in MODELS:
        results[spec[0]] = build(*spec, ids)
        r = results[spec[0]]
        print("%-14s loss %s  loss_bf16 %s%s" % (spec[0], fmt9(r["loss"]), fmt9(r["loss_bf16"]),
              ("  loss_after_step " + fmt9(r["loss_after_step"])) if "loss_after_step" in r else ""))
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write("python %s\n" % sys.version.split()[0])
        f.write("torch %s\n" % torch.__version__)
        f.write("transformers %s\n" % transformers.__version__)
        f.write("safetensors %s\n" % __import__("safetensors").__version__)
        f.write("numpy %s\n" % np.__version__)
    with open(os.path.join(OUT, "tensors.json"), "w") as f:
        json.dump({k: [dict(name=n, dtype=t, shape=s) for n, t, s in v["tensors"]]
                   for k, v in results.items()}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
