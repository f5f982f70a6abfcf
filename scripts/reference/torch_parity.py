#!/usr/bin/env python3
"""Independent PyTorch reference for lab's model, loss, gradients and AdamW (cf. llm.c test_gpt2).

From an INIT safetensors file written by lab (lab's parameter names, matrices stored [d_in, d_out]
so that y = x @ W), this runs 10 training steps of a small Llama-style model on fixed, seeded token
batches and writes a compact JSON fixture that a Rust test checks lab against. It pins:

  * the forward pass: token embedding; per block x += attn(rmsnorm(x)), x += ffn(rmsnorm(x));
    final rmsnorm; untied LM head. RMSNorm x / sqrt(mean(x^2) + 1e-5) * g. Causal grouped-query
    attention (query head h reads key/value head h // (n_head / n_kv_head)), scores / sqrt(hd),
    RoPE (base 10000) in Hugging Face Llama's "rotate half" layout on q and k; SwiGLU
    down(silu(gate(x)) * up(x)). Checked by step0.logits_row0 / logits_mean / logits_std
    (population std, over all [B, T, V] logits of batch 0);
  * the loss: mean cross-entropy over all batch x seq positions (step0.loss, losses);
  * the gradients: per-parameter L2 norms at step 0 and the global pre-clip norm at every step;
  * the optimizer: clip_grad_norm_ to grad_clip (torch scales by grad_clip / (norm + 1e-6) when
    norm > grad_clip), then torch.optim.AdamW(betas 0.9/0.95, eps 1e-8) with decoupled weight
    decay on every parameter of rank >= 2 and none on the RMSNorm gains, per-step lr from a
    linear-warmup + cosine schedule (losses after step 0, final_param_norms).

fp32 on CPU, one thread. Floats are written as Python floats holding the exact fp32 values.

    python scripts/reference/torch_parity.py --init INIT.safetensors \\
        --out crates/train/tests/fixtures/parity.json
    python scripts/reference/torch_parity.py --random-init /tmp/init.safetensors  # test input
    python scripts/reference/torch_parity.py --self-check
    # PyTorch for CPU: /work/shared/tools/torch-cpu/setup.sh /tmp/torch-cpu/venv safetensors
"""

import argparse
import hashlib
import json
import math
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

warnings.filterwarnings("ignore", message="CUDA initialization")  # CPU-only run of a CUDA build

CFG = dict(vocab_size=128, d_model=64, n_layer=2, n_head=4, n_kv_head=2, head_dim=16, d_ff=96,
           seq_len=16, micro_batch=4, steps=10, rope_base=10000.0, norm_eps=1e-5,
           warmup_steps=3, peak_lr=1e-2, min_lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8,
           weight_decay=0.1, grad_clip=3.0, data_seed=1234)


def param_shapes(c):
    d, hd, v, f = c["d_model"], c["head_dim"], c["vocab_size"], c["d_ff"]
    shapes = {"embed": [v, d]}
    for i in range(c["n_layer"]):
        p = f"blocks.{i}."
        shapes.update({p + "attn_norm.weight": [d], p + "attn.wq.weight": [d, c["n_head"] * hd],
                       p + "attn.wk.weight": [d, c["n_kv_head"] * hd],
                       p + "attn.wv.weight": [d, c["n_kv_head"] * hd],
                       p + "attn.wo.weight": [c["n_head"] * hd, d], p + "ffn_norm.weight": [d],
                       p + "ffn.gate.weight": [d, f], p + "ffn.up.weight": [d, f],
                       p + "ffn.down.weight": [f, d]})
    shapes.update({"norm.weight": [d], "lm_head.weight": [d, v]})
    return shapes


def lr_at(s, c):
    peak, lo, w, n = c["peak_lr"], c["min_lr"], c["warmup_steps"], c["steps"]
    if s < w:
        return peak * (s + 1) / w
    return lo + 0.5 * (1 + math.cos(math.pi * (s - w) / (n - w))) * (peak - lo)


def make_batches(c):
    """Rows are a random pattern (length 4-6, from a 16-token alphabet) repeated from a random
    offset: learnable within a few steps, so the loss falls clearly."""
    rng = np.random.RandomState(c["data_seed"])
    alphabet = rng.choice(c["vocab_size"], size=16, replace=False)
    out = np.zeros((c["steps"], c["micro_batch"], c["seq_len"] + 1), dtype=np.int64)
    for s in range(c["steps"]):
        for b in range(c["micro_batch"]):
            pat = alphabet[rng.randint(0, 16, size=rng.randint(4, 7))]
            off = rng.randint(0, len(pat))
            out[s, b] = pat[(off + np.arange(c["seq_len"] + 1)) % len(pat)]
    return out


def rope_tables(t, hd, base):
    """[t, hd] cos/sin; angle = t * base^(-2j/hd), j = i mod hd/2 (computed in f64, as lab)."""
    j = (torch.arange(hd, dtype=torch.float64) % (hd // 2))
    ang = torch.arange(t, dtype=torch.float64)[:, None] * base ** (-2.0 * j / hd)
    return ang.cos().float(), ang.sin().float()


def apply_rope(x, cos, sin):  # x: [B, H, T, hd]
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-b, a], dim=-1) * sin


def rmsnorm(x, g, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def attention(q, k, v):
    """Causal GQA by grouping: q [B, H, T, hd], k/v [B, KV, T, hd]; head h = kv * group + g."""
    bsz, h, t, hd = q.shape
    kv = k.shape[1]
    q = q.view(bsz, kv, h // kv, t, hd)
    scores = torch.einsum("bkgtd,bksd->bkgts", q, k) / math.sqrt(hd)
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(-1)
    return torch.einsum("bkgts,bksd->bkgtd", probs, v).reshape(bsz, h, t, hd)


def forward(P, tokens, c):
    """Logits [B, T, V] from lab-named params P (matrices [d_in, d_out]: y = x @ W)."""
    bsz, t = tokens.shape
    h, kv, hd, eps = c["n_head"], c["n_kv_head"], c["head_dim"], c["norm_eps"]
    cos, sin = rope_tables(t, hd, c["rope_base"])
    heads = lambda y, n: y.view(bsz, t, n, hd).transpose(1, 2)  # noqa: E731
    x = P["embed"][tokens]
    for i in range(c["n_layer"]):
        p = lambda name: P[f"blocks.{i}.{name}.weight"]  # noqa: E731
        a = rmsnorm(x, p("attn_norm"), eps)
        q = apply_rope(heads(a @ p("attn.wq"), h), cos, sin)
        k = apply_rope(heads(a @ p("attn.wk"), kv), cos, sin)
        y = attention(q, k, heads(a @ p("attn.wv"), kv))
        x = x + y.transpose(1, 2).reshape(bsz, t, h * hd) @ p("attn.wo")
        f = rmsnorm(x, p("ffn_norm"), eps)
        x = x + (F.silu(f @ p("ffn.gate")) * (f @ p("ffn.up"))) @ p("ffn.down")
    return rmsnorm(x, P["norm.weight"], eps) @ P["lm_head.weight"]


def load_init(path, c):
    sd, want = load_file(path), param_shapes(c)
    got = {k: list(v.shape) for k, v in sd.items()}
    if got != want or any(v.dtype != torch.float32 for v in sd.values()):
        missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
        bad = sorted(k for k in want.keys() & got.keys() if want[k] != got[k])
        sys.exit(f"error: {path} does not match the fixture config (all fp32 required):\n"
                 f"  missing {missing}\n  unexpected {extra}\n"
                 f"  wrong shape {[(k, got[k], want[k]) for k in bad]}\n"
                 f"  dtypes {sorted({str(v.dtype) for v in sd.values()})}")
    return {k: torch.nn.Parameter(sd[k].contiguous()) for k in want}


def run(init_path, out_path, argv):
    c = CFG
    P = load_init(init_path, c)
    with open(init_path, "rb") as fh:
        sha = hashlib.sha256(fh.read()).hexdigest()
    batches = make_batches(c)
    lrs = [lr_at(s, c) for s in range(c["steps"])]
    optim = torch.optim.AdamW(
        [{"params": [p for p in P.values() if p.dim() >= 2], "weight_decay": c["weight_decay"]},
         {"params": [p for p in P.values() if p.dim() < 2], "weight_decay": 0.0}],
        lr=lrs[0], betas=(c["beta1"], c["beta2"]), eps=c["eps"], foreach=False)
    losses, norms, step0 = [], [], None
    for s in range(c["steps"]):
        data = torch.from_numpy(batches[s])
        logits = forward(P, data[:, :-1], c)
        loss = F.cross_entropy(logits.reshape(-1, c["vocab_size"]), data[:, 1:].reshape(-1))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        if s == 0:  # before clipping, which scales the grads in place
            lg = logits.detach()
            step0 = dict(logits_row0=lg[0].flatten().tolist(), logits_mean=lg.mean().item(),
                         logits_std=lg.std(correction=0).item(), loss=loss.item(),
                         grad_norms={k: p.grad.norm().item() for k, p in P.items()})
        gnorm = torch.nn.utils.clip_grad_norm_(list(P.values()), c["grad_clip"]).item()
        if s == 0:
            step0["global_grad_norm"] = gnorm
        for group in optim.param_groups:
            group["lr"] = lrs[s]
        optim.step()
        losses.append(loss.item())
        norms.append(gnorm)
    clipped = [s for s, n in enumerate(norms) if n > c["grad_clip"]]
    print("losses:", " ".join(f"{x:.4f}" for x in losses))
    print("grad norms:", " ".join(f"{x:.3f}" for x in norms), f"(clipped at steps {clipped})")
    assert losses[-1] < losses[0] - 1.0, "loss did not fall clearly"
    assert clipped, f"grad_clip {c['grad_clip']} never engages"
    fixture = dict(
        generated_by="python scripts/reference/torch_parity.py " + " ".join(argv),
        torch_version=torch.__version__, config=c, init_sha256=sha, lrs=lrs,
        tokens=batches.tolist(), step0=step0, losses=losses, grad_norms=norms,
        final_param_norms={k: p.detach().norm().item() for k, p in P.items()})
    with open(out_path, "w") as fh:
        json.dump(fixture, fh, separators=(",", ":"))
        fh.write("\n")
    print(f"wrote {out_path}")


def random_init(path, c):
    g = torch.Generator().manual_seed(0)
    sd = {k: torch.ones(s) if len(s) == 1 else torch.randn(s, generator=g) * 0.02
          for k, s in param_shapes(c).items()}
    save_file(sd, path)
    print(f"wrote {path} (random init, std 0.02, gains 1)")


def self_check(c):
    """Our grouped attention vs repeat_interleave + SDPA; our RoPE vs complex rotation."""
    g = torch.Generator().manual_seed(0)
    b, h, kv, t, hd = 2, c["n_head"], c["n_kv_head"], c["seq_len"], c["head_dim"]
    q, k, v = (torch.randn(b, n, t, hd, generator=g) for n in (h, kv, kv))
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(h // kv, 1),
                                         v.repeat_interleave(h // kv, 1), is_causal=True)
    err_attn = (attention(q, k, v) - ref).abs().max().item()
    cos, sin = rope_tables(t, hd, c["rope_base"])
    half = hd // 2
    freqs = c["rope_base"] ** (-2.0 * torch.arange(half, dtype=torch.float64) / hd)
    rot = torch.polar(torch.ones(t, half, dtype=torch.float64),
                      torch.arange(t, dtype=torch.float64)[:, None] * freqs)
    z = torch.complex(q[..., :half].double(), q[..., half:].double()) * rot  # pairs (j, j+hd/2)
    err_rope = (apply_rope(q, cos, sin) - torch.cat([z.real, z.imag], -1).float()).abs().max()
    print(f"self-check: attention max|diff| {err_attn:.2e}, rope max|diff| {err_rope.item():.2e}")
    assert err_attn < 1e-6 and err_rope.item() < 1e-6, "self-check failed"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--init", help="INIT safetensors written by lab")
    ap.add_argument("--out", help="fixture JSON to write")
    ap.add_argument("--random-init", metavar="PATH", help="write a random INIT to PATH (testing)")
    ap.add_argument("--self-check", action="store_true", help="check attention and RoPE")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if args.self_check:
        self_check(CFG)
    if args.random_init:
        random_init(args.random_init, CFG)
    if args.init or args.out:
        if not (args.init and args.out):
            ap.error("--init and --out go together")
        run(args.init, args.out, sys.argv[1:])
    elif not (args.self_check or args.random_init):
        ap.error("nothing to do: give --init/--out, --random-init or --self-check")


if __name__ == "__main__":
    main()
