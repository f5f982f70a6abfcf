#!/usr/bin/env bash
# lab against PyTorch on one GPU host, same model, same token windows, same GPU; one table.
#
#   scripts/gpu/bench.sh [--lab PATH] [--config FILE] [--steps N] [--warmup N] [--device cuda|cpu]
#                        [--no-compile]
#
# Runs, one after another (never side by side: they would share the GPU):
#   1. lab bench --backend cuda (bf16) on the config, writing its token stream; then again
#      with its time split by op class (--split);
#   2. scripts/reference/torch_train_ref.py on the same stream: eager, then torch.compile
#      (--no-compile leaves torch.compile out: its compilation takes a minute or more);
#   3. lab bench --matmul and PyTorch's matmul (cuBLAS) on the model's projection shapes.
# Prints tokens/s, MFU (against the detected GPU's dense bf16 peak, FLOPs counted as lab
# counts them: LM head and attention included), peak GPU memory (nvidia-smi, sampled every
# 200 ms, the same way for both) and the loss at the last step, then the matmul lines.
# Needs: a prebuilt lab (--features cuda), python3 with torch (and tomli on Python < 3.11).
# `--device cpu` runs the same plumbing on a CPU (a smoke test; no memory column).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
lab="$repo/target/release/lab"
config="$repo/configs/x1-50m-a100.toml"
steps=45
warmup=5
device=cuda
with_compile=1
py="${PYTHON:-python3}"
while [ $# -gt 0 ]; do
  case "$1" in
    --lab) lab="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --no-compile) with_compile=0; shift ;;
    *) echo "bench.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -x "$lab" ] || { echo "bench.sh: no lab binary at $lab; pass --lab PATH" >&2; exit 2; }
out="$(mktemp -d)"
echo "bench.sh: results in $out"

# Runs "$@" while sampling the GPU's used memory; the peak (MiB) goes to $out/$name.mem.
with_memory() {
  local name="$1"; shift
  if [ "$device" != cuda ]; then "$@"; return; fi
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "${GPU_INDEX:-0}" -lms 200 \
    > "$out/$name.samples" 2>/dev/null &
  # A failing command must stop the sampler too: left running, it holds the caller's pipe open.
  local sampler=$! rc=0
  "$@" || rc=$?
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  sort -n "$out/$name.samples" | tail -1 > "$out/$name.mem"
  return "$rc"
}

if [ "$device" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader -i "${GPU_INDEX:-0}"
  backend=cuda
else
  backend=cpu
fi
common=(--config "$config" --steps "$steps" --warmup "$warmup")
with_memory lab "$lab" bench --backend "$backend" --precision bf16 "${common[@]}" --json \
  --tokens-out "$out/tokens.u32" > "$out/lab.json"
# The split on its own run, outside the memory sampling (its probes' inputs are not a step's).
"$lab" bench --backend "$backend" --precision bf16 "${common[@]}" --json --split \
  > "$out/lab_split.json"
ref=("$py" "$repo/scripts/reference/torch_train_ref.py" "${common[@]}" --device "$device"
     --precision bf16 --json)
with_memory eager "${ref[@]}" --tokens "$out/tokens.u32" > "$out/eager.json"
if [ "$with_compile" = 1 ]; then
  with_memory compile "${ref[@]}" --tokens "$out/tokens.u32" --compile > "$out/compile.json"
fi
"$lab" bench --backend "$backend" --precision bf16 --matmul --config "$config" --steps 20 --json \
  > "$out/lab_matmul.json"
"${ref[@]}" --matmul-shapes "$out/lab_matmul.json" --steps 20 > "$out/torch_matmul.json"

REPO="$repo" "$py" - "$out" "$config" <<'EOF'
import json, os, sys
sys.path.insert(0, os.path.join(os.environ.get("REPO", "."), "scripts", "reference"))
out, config = sys.argv[1], sys.argv[2]
import torch_train_ref as ref
with open(config, "rb") as f:
    fpt = ref.flops_per_token(ref.model_config(ref.tomllib.load(f)))
load = lambda n: json.load(open(os.path.join(out, n)))
runs = [("lab", load("lab.json")), ("torch eager", load("eager.json"))]
if os.path.exists(os.path.join(out, "compile.json")):
    runs.append(("torch.compile", load("compile.json")))
device = runs[1][1]["device"]
# Every row over lab's peak: the one its hardware table gives the detected GPU (H100 PCIe is
# 756 TF there, not SXM's 989), so lab's MFU and PyTorch's divide by the same number.
peak = runs[0][1].get("peak_flops")
def mem(name):
    # "-" where the sampler wrote nothing usable (no samples, "[N/A]" on MIG).
    try:
        return f"{int(open(os.path.join(out, name + '.mem')).read()) / 1024:.1f} GiB"
    except (OSError, ValueError):
        return "-"
print(f"\n{device}, bf16, {runs[0][1]['tokens_per_step']} tokens/step, {runs[0][1]['steps']} timed steps")
print(f"| run | tokens/s | MFU | peak GPU memory | loss at last step | lab / this |")
print(f"|---|---|---|---|---|---|")
lab_tps = runs[0][1]["tokens_per_s"]
for (name, r), key in zip(runs, ["lab", "eager", "compile"]):
    mfu = f"{r['tokens_per_s'] * fpt / peak * 100:.1f} %" if peak else "-"
    print(f"| {name} | {r['tokens_per_s']:.0f} | {mfu} | {mem(key)} | {r['last_loss']:.4f} | "
          f"{lab_tps / r['tokens_per_s']:.2f}x |")
lab = runs[0][1]
if "phased_ms_per_step" in lab:
    print(f"\nlab's step: {lab['ms_per_step']:.1f} ms whole (as training runs it, the rows above), "
          f"{lab['phased_ms_per_step']:.1f} ms with a sync ending each phase: the difference is "
          f"host time the GPU hides in a whole step")
busy = lab.get("gpu_util_pct")
if busy is not None:
    print(f"\nlab's GPU was busy {busy:.0f} % (NVML's last sample period at each timed step's end): "
          f"near 100 % its kernels bound the step; under it the GPU waited on the host")
split = load("lab_split.json").get("split")
if split:
    print(f"\nlab's step with a sync ending each phase ({split['step_ms']:.1f} ms) by op class, "
          f"each alone, forward + backward:")
    rows = [(c["class"], c["ms_per_step"], c.get("tflops")) for c in split["classes"]]
    rows += [("optimizer", split["optimizer_ms"], None), ("other", split["other_ms"], None)]
    for name, ms, tflops in rows:
        rate = f", {tflops:.1f} TFLOP/s" if tflops else ""
        print(f"  {name:<13} {ms:9.1f} ms {ms / split['step_ms'] * 100:5.1f} %{rate}")
print()
for a, b in zip(load("lab_matmul.json"), load("torch_matmul.json")):
    print(f"matmul {a['name']:<12} [{a['m']}x{a['k']}]@[{a['k']}x{a['n']}]: cubecl {a['tflops']:.1f} "
          f"TFLOP/s, PyTorch (cuBLAS) {b['tflops']:.1f} TFLOP/s, ratio {a['tflops'] / b['tflops']:.2f}")
EOF
