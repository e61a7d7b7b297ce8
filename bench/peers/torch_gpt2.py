#!/usr/bin/env python3
"""The PyTorch peer of meshwit-bench's llmc case (and, with --llama, of its llama case): the same GPT-2 (pre-LayerNorm, tanh GELU, learned
positions, head tied to the token embedding; llm.c's initialisation), the same batch of random
tokens, AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices only) with clipping at 1.0,
timed step by step on the CPU.

Run by hand or by `meshwit-bench llmc` (never by the build or the tests), with a Python that has
PyTorch, e.g. in a virtual environment:

    python3 -m venv /tmp/peer-venv && /tmp/peer-venv/bin/pip install torch
    /tmp/peer-venv/bin/python bench/peers/torch_gpt2.py --threads 1
    /tmp/peer-venv/bin/python bench/peers/torch_gpt2.py --ddp 2      # DDP, gloo, 2 processes
    /tmp/peer-venv/bin/python bench/peers/torch_gpt2.py --bf16 --compile   # autocast bf16

Prints one JSON object on its last line: {"peer": ..., "ms_per_step": median, "tokens_per_s": ...}.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time


def build(args, torch):
    nn = torch.nn
    F = torch.nn.functional
    C, L, H, T, V = args.channels, args.layers, args.heads, args.seq, args.vocab

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(C)
            self.qkv = nn.Linear(C, 3 * C)
            self.proj = nn.Linear(C, C)
            self.ln2 = nn.LayerNorm(C)
            self.fc = nn.Linear(C, 4 * C)
            self.fcproj = nn.Linear(4 * C, C)

        def forward(self, x):
            B, T_, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T_, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T_, C))
            return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.lnf = nn.LayerNorm(C)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * L) if "proj.weight" in name else 0.02
                    nn.init.normal_(p, std=0.01 if name == "wpe.weight" else std)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.blocks:
                x = b(x)
            logits = self.lnf(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    return GPT()


def build_llama(args, torch):
    """The llama case's model: RMSNorm, rotary (rotate-half), grouped-query attention through
    scaled_dot_product_attention with the key/value heads repeated, SwiGLU, an untied head, no
    biases; written out as transformers' LlamaForCausalLM computes it."""
    nn = torch.nn
    F = torch.nn.functional
    C, L, H, K, T, V, Fh = (args.channels, args.layers, args.heads, args.kv_heads, args.seq,
                            args.vocab, args.hidden)
    D = C // H
    inv = 1.0 / (args.theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rot(x):
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(C))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = RMSNorm(), RMSNorm()
            self.q = nn.Linear(C, H * D, bias=False)
            self.k = nn.Linear(C, K * D, bias=False)
            self.v = nn.Linear(C, K * D, bias=False)
            self.o = nn.Linear(H * D, C, bias=False)
            self.gate = nn.Linear(C, Fh, bias=False)
            self.up = nn.Linear(C, Fh, bias=False)
            self.down = nn.Linear(Fh, C, bias=False)

        def forward(self, x):
            B, T_, _ = x.shape
            h = self.n1(x)
            q = rot(self.q(h).view(B, T_, H, D).transpose(1, 2))
            k = rot(self.k(h).view(B, T_, K, D).transpose(1, 2))
            v = self.v(h).view(B, T_, K, D).transpose(1, 2)
            k, v = k.repeat_interleave(H // K, 1), v.repeat_interleave(H // K, 1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(y.transpose(1, 2).reshape(B, T_, H * D))
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(V, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.norm = RMSNorm()
            self.head = nn.Linear(C, V, bias=False)
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith(("o.weight", "down.weight")) else 0.02
                    nn.init.normal_(p, std=std)

        def forward(self, idx, targets):
            x = self.embed(idx)
            for b in self.blocks:
                x = b(x)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    return Llama()


def run(args, rank=0, world=1):
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    model = build_llama(args, torch) if args.llama else build(args, torch)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    step_model = torch.compile(model) if args.compile else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(2 + rank)
    rows = args.batch // world + (rank < args.batch % world)
    times = []
    for step in range(args.warmup + args.steps):
        idx = torch.randint(0, args.vocab, (rows, args.seq), generator=g)
        tgt = torch.randint(0, args.vocab, (rows, args.seq), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def ddp_worker(rank, world, args, port, out):
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ms = run(args, rank, world)
    dist.barrier()
    if rank == 0:
        out.put(ms)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (per process)")
    ap.add_argument("--ddp", type=int, default=0, help="DDP (gloo) over this many processes")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--channels", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--bf16", action="store_true",
                    help="mixed precision: torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--llama", action="store_true",
                    help="the llama case's model (RMSNorm, rotary, GQA, SwiGLU) instead of GPT-2")
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=688, help="the SwiGLU MLP's width")
    ap.add_argument("--theta", type=float, default=10000.0)
    args = ap.parse_args()
    import torch

    if args.ddp > 1:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        mp.spawn(ddp_worker, args=(args.ddp, args, args.port, out), nprocs=args.ddp, join=True)
        ms, peer = out.get(), f"pytorch-ddp-gloo-x{args.ddp}"
    else:
        ms, peer = run(args), f"pytorch-{args.threads}-thread"
    tokens = args.batch * args.seq
    if args.llama:
        peer += "-llama"
    if args.bf16:
        peer += "-bf16"
    if args.compile:
        peer += "-compile"
    print(json.dumps({"peer": peer, "torch": torch.__version__, "threads": args.threads,
                      "processes": max(args.ddp, 1), "ms_per_step": round(ms, 2),
                      "tokens_per_s": round(tokens / (ms * 1e-3), 1)}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
