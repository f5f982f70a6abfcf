#!/usr/bin/env python3
"""PyTorch eager reference for `lab bench`: the tiny config's model and training step.

Same model as lab-model (Llama-style: token embedding, pre-norm RMSNorm, causal GQA attention
with RoPE, SwiGLU feed-forward, final RMSNorm, untied LM head, no biases, init normal(0, 0.02))
and the same step (cross-entropy over batch x seq tokens, backward, global-norm clip 1.0,
AdamW beta 0.9/0.95, eps 1e-8, decoupled weight decay 0.1 on matrices), timed the same way:
forward (through the loss value), backward, optimizer; warm-up steps untimed.

Idiomatic PyTorch, not a handicapped one: scaled_dot_product_attention (causal, GQA),
nn.RMSNorm, F.cross_entropy, torch.optim.AdamW defaults. Token ids are seeded random
(speed does not depend on their values).

    python scripts/bench/torch_tiny.py --threads 2
    # PyTorch for CPU: /work/shared/tools/torch-cpu/setup.sh /tmp/torch-cpu/venv
"""

import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# configs/tiny-cpu.toml
CFG = dict(vocab=50257, d_model=128, n_layer=4, n_head=4, n_kv_head=2, d_ff=384,
           seq_len=128, batch=8, rope_base=10000.0, init_std=0.02, norm_eps=1e-5,
           lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, grad_clip=1.0)


def rope_tables(t, hd, base):
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(t, dtype=torch.float32), inv)  # [T, hd/2]
    ang = torch.cat([ang, ang], dim=-1)  # "rotate half" layout, as Hugging Face Llama
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):  # x: [B, H, T, hd]
    # The tables in x's dtype, as Hugging Face Llama does: under bf16 autocast, fp32 tables
    # would turn q and k to fp32 and add casts.
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


# SDPA shares K/V heads itself from PyTorch 2.5 (enable_gqa); before, they are repeated.
SDPA_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


def attention(q, k, v):
    """Causal SDPA with K/V heads shared by groups of query heads."""
    if SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class _RMSNorm(nn.Module):
    """nn.RMSNorm for PyTorch < 2.4 (weight initialised to ones, statistics in fp32)."""

    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight


RMSNorm = getattr(nn, "RMSNorm", _RMSNorm)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h, kv = c["d_model"], c["n_head"], c["n_kv_head"]
        self.h, self.kv, self.hd = h, kv, d // h
        self.wq = nn.Linear(d, h * self.hd, bias=False)
        self.wk = nn.Linear(d, kv * self.hd, bias=False)
        self.wv = nn.Linear(d, kv * self.hd, bias=False)
        self.wo = nn.Linear(h * self.hd, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = attention(q, k, v)
        return self.wo(y.transpose(1, 2).reshape(b, t, self.h * self.hd))


class FeedForward(nn.Module):  # SwiGLU
    def __init__(self, c):
        super().__init__()
        d, f = c["d_model"], c["d_ff"]
        self.gate = nn.Linear(d, f, bias=False)
        self.up = nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attn_norm = RMSNorm(c["d_model"], eps=c["norm_eps"])
        self.attn = Attention(c)
        self.ffn_norm = RMSNorm(c["d_model"], eps=c["norm_eps"])
        self.ffn = FeedForward(c)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed = nn.Embedding(c["vocab"], c["d_model"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.norm = RMSNorm(c["d_model"], eps=c["norm_eps"])
        self.lm_head = nn.Linear(c["d_model"], c["vocab"], bias=False)  # untied
        cos, sin = rope_tables(c["seq_len"], c["d_model"] // c["n_head"], c["rope_base"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=c["init_std"])

    def loss(self, tokens, targets):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        logits = self.lm_head(self.norm(x))  # [B, T, V]
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(42)
    c = CFG
    model = Llama(c)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": c["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=c["lr"], betas=c["betas"], eps=c["eps"])
    b, t = c["batch"], c["seq_len"]
    data = torch.randint(0, c["vocab"], (args.warmup + args.steps, b, t + 1))

    fwd = bwd = opt = 0.0
    for i in range(args.warmup + args.steps):
        x, y = data[i, :, :-1], data[i, :, 1:]
        t0 = time.perf_counter()
        loss = model.loss(x, y)
        loss.item()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c["grad_clip"])  # global L2 norm
        optim.step()
        optim.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if i >= args.warmup:
            fwd, bwd, opt = fwd + t1 - t0, bwd + t2 - t1, opt + t3 - t2
        assert math.isfinite(loss.item())

    n = args.steps
    ms = (fwd + bwd + opt) / n * 1e3
    tokens = b * t
    report = dict(framework=f"torch {torch.__version__}", threads=torch.get_num_threads(),
                  tokens_per_step=tokens, steps=n, tokens_per_s=tokens / (ms / 1e3),
                  ms_per_step=ms, forward_ms=fwd / n * 1e3, backward_ms=bwd / n * 1e3,
                  optimizer_ms=opt / n * 1e3)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"tiny-cpu on torch {torch.__version__} eager ({report['threads']} threads): "
              f"{report['tokens_per_s']:.0f} tokens/s, {ms:.1f} ms/step "
              f"({tokens} tokens/step, {n} steps)")
        print(f"  forward {report['forward_ms']:.1f} ms | backward {report['backward_ms']:.1f} ms"
              f" | optimizer {report['optimizer_ms']:.1f} ms")


if __name__ == "__main__":
    main()
