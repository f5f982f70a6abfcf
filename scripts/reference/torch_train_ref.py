#!/usr/bin/env python3
"""PyTorch reference of a lab config's training step, for `scripts/gpu/bench.sh`.

The model is lab's (scripts/bench/torch_tiny.py: GQA, RoPE, SwiGLU, RMSNorm, untied head,
normal(0, init_std) init) at the config's dimensions; the step is `lab bench`'s: grad_accum
micro-batches of micro_batch x seq_len tokens, mean loss, backward, global-norm clip,
AdamW at a constant 1e-4. The batches are the same windows of the same token stream
(`lab bench --tokens-out FILE` writes it). Idiomatic fast PyTorch: bf16 autocast over fp32
weights, scaled_dot_product_attention (flash on CUDA), fused AdamW; `--compile` adds
torch.compile.

    lab bench --config configs/x1-50m-a100.toml --tokens-out /tmp/tokens.u32 --steps 1
    python scripts/reference/torch_train_ref.py --config configs/x1-50m-a100.toml \
        --tokens /tmp/tokens.u32 --device cuda --precision bf16 [--compile] --json
"""

import argparse
import json
import math
import os
import sys
import time

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11 (Ubuntu 22.04): tomli, else pip's own copy of it
    try:
        import tomli as tomllib
    except ModuleNotFoundError:  # a GPU host without internet: pip has bundled tomli since 21.2
        from pip._vendor import tomli as tomllib

try:
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
    from torch_tiny import Llama  # the model, shared with the CPU reference
except (ImportError, OSError):  # no or a broken PyTorch: bench.sh's table needs only the FLOP count
    torch = None

# Dense peak FLOP/s by device name (as lab's hardware table), bf16 and fp32. fp32 here is
# PyTorch's default, products in full fp32 (allow_tf32 off); lab's fp32 on CUDA multiplies
# as TF32 and measures its MFU against the TF32 peak, so compare fp32 runs by tokens/s.
PEAKS = [("H200", 989e12, 67e12), ("H100", 989e12, 67e12), ("A100", 312e12, 19.5e12)]


def model_config(cfg):
    m, t = cfg["model"], cfg["train"]
    head_dim = m.get("head_dim") or m["d_model"] // m["n_head"]
    if m.get("tie_embeddings") or head_dim != m["d_model"] // m["n_head"]:
        sys.exit("torch_train_ref.py: tied embeddings and a custom head_dim are not modelled")
    return dict(vocab=m["vocab_size"], d_model=m["d_model"], n_layer=m["n_layer"],
                n_head=m["n_head"], n_kv_head=m["n_kv_head"], d_ff=m["d_ff"],
                seq_len=m["seq_len"], rope_base=m.get("rope_base", 10000.0),
                init_std=m.get("init_std", 0.02), norm_eps=m.get("norm_eps", 1e-5),
                micro_batch=t["micro_batch"], grad_accum=t.get("grad_accum", 1),
                betas=(t.get("beta1", 0.9), t.get("beta2", 0.95)), eps=t.get("eps", 1e-8),
                weight_decay=t.get("weight_decay", 0.1), grad_clip=t.get("grad_clip", 1.0))


def flops_per_token(c):
    """lab's count (lab-config `train_flops_per_token`): 6 x matmul parameters, LM head
    included, plus 12 x n_layer x seq_len x d_attn for the attention scores and values."""
    hd = c["d_model"] // c["n_head"]
    d, h, kv, ff = c["d_model"], c["n_head"], c["n_kv_head"], c["d_ff"]
    attn = c["n_layer"] * (d * h * hd + 2 * d * kv * hd + h * hd * d)
    ffn = c["n_layer"] * 3 * d * ff
    head = d * c["vocab"]
    return 6 * (attn + ffn + head) + 12 * c["n_layer"] * c["seq_len"] * h * hd


def windows(tokens, c, step, device):
    """The micro-batches of `step`, as lab bench draws them (crates/train/src/bench.rs)."""
    rows, t, accum = c["micro_batch"], c["seq_len"], c["grad_accum"]
    out = []
    for m in range(accum):
        xs, ys = [], []
        for r in range(rows):
            k = (step * accum + m) * rows + r
            o = (k * t) % (len(tokens) - t - 1)
            xs.append(tokens[o:o + t])
            ys.append(tokens[o + 1:o + t + 1])
        out.append((torch.stack(xs).to(device), torch.stack(ys).to(device)))
    return out


def matmul_ref(shapes_file, dev, precision, iters):
    """PyTorch's matmul (cuBLAS on CUDA) on the shapes `lab bench --matmul --json` timed."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    out = []
    for s in json.load(open(shapes_file)):
        a = torch.randn(s["m"], s["k"], device=dev, dtype=dtype)
        b = torch.randn(s["k"], s["n"], device=dev, dtype=dtype)
        a @ b
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        sync(dev)
        sec = (time.perf_counter() - t0) / iters
        out.append(dict(name=s["name"], m=s["m"], k=s["k"], n=s["n"], ms=sec * 1e3,
                        tflops=2 * s["m"] * s["k"] * s["n"] / sec / 1e12))
    print(json.dumps(out, indent=2))


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def main():
    if torch is None:
        sys.exit("torch_train_ref.py: PyTorch is not installed for this python; pip install torch")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--tokens", help="lab bench --tokens-out FILE")
    ap.add_argument("--matmul-shapes", metavar="FILE",
                    help="time matmuls on `lab bench --matmul --json`'s shapes instead")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--steps", type=int, default=45, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with open(args.config, "rb") as f:
        c = model_config(tomllib.load(f))
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    if args.matmul_shapes:
        return matmul_ref(args.matmul_shapes, dev, args.precision, args.steps)
    if not args.tokens:
        sys.exit("torch_train_ref.py: --tokens FILE (from lab bench --tokens-out) is required")
    tokens = torch.frombuffer(bytearray(open(args.tokens, "rb").read()), dtype=torch.int32).long()
    torch.manual_seed(42)
    model = Llama(c).to(dev)
    step_fn = torch.compile(model.loss) if args.compile else model.loss
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    cuda = dev.type == "cuda"
    optim = torch.optim.AdamW(
        [{"params": decay, "weight_decay": c["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-4, betas=c["betas"], eps=c["eps"], fused=cuda)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")

    elapsed, loss_value = 0.0, float("nan")
    for i in range(args.warmup + args.steps):
        sync(dev)
        t0 = time.perf_counter()
        micro = windows(tokens, c, i, dev)
        total = 0.0
        for x, y in micro:
            with autocast:
                loss = step_fn(x, y) / len(micro)
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c["grad_clip"])
        optim.step()
        optim.zero_grad(set_to_none=True)
        loss_value = float(total)  # syncs
        if i >= args.warmup:
            elapsed += time.perf_counter() - t0
        assert math.isfinite(loss_value), f"loss {loss_value} at step {i + 1}"

    tokens_per_step = c["micro_batch"] * c["seq_len"] * c["grad_accum"]
    tokens_per_s = tokens_per_step * args.steps / elapsed
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    peak = next(((bf, fp) for key, bf, fp in PEAKS if key in name), None)
    mfu = None
    if peak:
        mfu = tokens_per_s * flops_per_token(c) / (peak[0] if args.precision == "bf16" else peak[1])
    report = dict(
        framework=f"torch {torch.__version__}" + (" compile" if args.compile else " eager"),
        device=name, precision=args.precision, tokens_per_step=tokens_per_step,
        steps=args.steps, tokens_per_s=tokens_per_s, ms_per_step=elapsed / args.steps * 1e3,
        mfu=mfu, peak_mem_gib=torch.cuda.max_memory_allocated(dev) / 2**30 if cuda else None,
        last_loss=loss_value, last_step=args.warmup + args.steps)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['framework']} on {name} ({args.precision}): {tokens_per_s:.0f} tokens/s, "
              f"{report['ms_per_step']:.1f} ms/step, loss at step {report['last_step']} "
              f"{loss_value:.4f}" + (f", MFU {mfu * 100:.1f}%" if mfu else ""))


if __name__ == "__main__":
    main()
