#!/usr/bin/env bash
# lab against PyTorch on one GPU host, same model, same token windows, same GPU; one table.
#
#   scripts/gpu/bench.sh [--lab PATH] [--config FILE] [--steps N] [--warmup N] [--device cuda|cpu]
#                        [--no-compile] [--no-split]
#
# Runs, one after another (never side by side: they would share the GPU), most decisive first:
#   1. lab bench --backend cuda (bf16) on the config, writing its token stream;
#   2. scripts/reference/torch_train_ref.py on the same stream: eager, then torch.compile
#      (--no-compile leaves torch.compile out: its compilation takes a minute or more);
#   3. lab bench again, its time split by op class (--split; --no-split leaves it out);
#   4. lab bench --matmul and PyTorch's matmul (cuBLAS) on the model's projection shapes.
# Prints tokens/s, MFU (against the detected GPU's dense bf16 peak, FLOPs counted as lab
# counts them: LM head and attention included), peak GPU memory (nvidia-smi, sampled every
# 200 ms, the same way for both) and the loss at the last step, then the matmul lines.
# Needs: a prebuilt lab (--features cuda), python3 with torch (and tomli on Python < 3.11).
# `--device cpu` runs the same plumbing on a CPU (a smoke test; no memory column).
#
# Results go to $BENCH_OUT (default: a new temporary folder), and each JSON is also printed as
# it is written, so a later failure or a timeout still leaves the earlier figures in the log.
# A failed run is reported and the others go on; the table shows what ran.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
lab="$repo/target/release/lab"
config="$repo/configs/x1-50m-a100.toml"
steps=45
warmup=5
device=cuda
with_compile=1
with_split=1
py="${PYTHON:-python3}"
# PyTorch (and the table, which imports the reference) with the library path it was called
# with (session.sh's PYTORCH_LD_LIBRARY_PATH), not CUDA's lib folder first: its wheels bring
# their own CUDA libraries.
torch_ld="${PYTORCH_LD_LIBRARY_PATH-${LD_LIBRARY_PATH-}}"
while [ $# -gt 0 ]; do
  case "$1" in
    --lab) lab="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --no-compile) with_compile=0; shift ;;
    --no-split) with_split=0; shift ;;
    *) echo "bench.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -x "$lab" ] || { echo "bench.sh: no lab binary at $lab; pass --lab PATH" >&2; exit 2; }
out="${BENCH_OUT:-$(mktemp -d)}"
mkdir -p "$out"
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
# `measure NAME.json CMD...`: CMD's stdout into $out/NAME.json, echoed; a failure is reported,
# its file removed, and bench.sh goes on.
failed=0
measure() {
  local file="$out/$1" rc=0; shift
  "$@" > "$file" || rc=$?
  if [ "$rc" = 0 ]; then
    echo "bench.sh: $(basename "$file"): $(tr -d '\n' < "$file")"
  else
    echo "bench.sh: FAILED $(basename "$file") (exit $rc): $*" >&2
    rm -f "$file"
    failed=1
  fi
}
measure lab.json with_memory lab "$lab" bench --backend "$backend" --precision bf16 \
  "${common[@]}" --json --tokens-out "$out/tokens.u32"
ref=(env LD_LIBRARY_PATH="$torch_ld" "$py" "$repo/scripts/reference/torch_train_ref.py"
     "${common[@]}" --device "$device" --precision bf16 --json)
if [ -s "$out/tokens.u32" ]; then
  measure eager.json with_memory eager "${ref[@]}" --tokens "$out/tokens.u32"
  if [ "$with_compile" = 1 ]; then
    measure compile.json with_memory compile "${ref[@]}" --tokens "$out/tokens.u32" --compile
  fi
fi
# After PyTorch: a call cut short keeps the comparison.
if [ "$with_split" = 1 ]; then
  # The split on its own run, outside the memory sampling (its probes' inputs are not a step's).
  measure lab_split.json "$lab" bench --backend "$backend" --precision bf16 "${common[@]}" \
    --json --split
fi
measure lab_matmul.json "$lab" bench --backend "$backend" --precision bf16 --matmul \
  --config "$config" --steps 20 --json
if [ -s "$out/lab_matmul.json" ]; then
  measure torch_matmul.json "${ref[@]}" --matmul-shapes "$out/lab_matmul.json" --steps 20
fi

REPO="$repo" LD_LIBRARY_PATH="$torch_ld" "$py" - "$out" "$config" <<'EOF'
import json, os, sys
sys.path.insert(0, os.path.join(os.environ.get("REPO", "."), "scripts", "reference"))
out, config = sys.argv[1], sys.argv[2]
import torch_train_ref as ref
with open(config, "rb") as f:
    fpt = ref.flops_per_token(ref.model_config(ref.tomllib.load(f)))
def load(n):
    try:
        return json.load(open(os.path.join(out, n)))
    except (OSError, ValueError):
        return None
names = {"lab": "lab", "eager": "torch eager", "compile": "torch.compile"}
loaded = {key: load(key + ".json") for key in names}
runs = [(names[key], key, r) for key, r in loaded.items() if r]
if not runs:
    sys.exit("bench.sh: no run left figures; see the log above")
first = runs[0][2]
device = next((r["device"] for _, _, r in runs if "device" in r), first.get("backend", "?"))
# Every row over lab's peak: the one its hardware table gives the detected GPU (H100 PCIe is
# 756 TF there, not SXM's 989), so lab's MFU and PyTorch's divide by the same number.
lab = loaded["lab"] or {}
peak = lab.get("peak_flops")
torch_peaks = {round(r["tokens_per_s"] * fpt / r["mfu"] / 1e12) for _, key, r in runs
               if key != "lab" and r.get("mfu")}
def mem(name):
    # "-" where the sampler wrote nothing usable (no samples, "[N/A]" on MIG).
    try:
        return f"{int(open(os.path.join(out, name + '.mem')).read()) / 1024:.1f} GiB"
    except (OSError, ValueError):
        return "-"
basis = f"MFU against {peak / 1e12:.1f} TFLOP/s (lab's peak for this device)" if peak else "no peak known: no MFU"
print(f"\n{device}, bf16, {first['tokens_per_step']} tokens/step, {first['steps']} timed steps, {basis}")
if peak and torch_peaks and torch_peaks != {round(peak / 1e12)}:
    print(f"WARNING: PyTorch's table gives this GPU {sorted(torch_peaks)} TFLOP/s, lab {peak / 1e12:.1f}: "
          f"check which peak is the card's before quoting MFU")
print(f"| run | tokens/s | MFU | peak GPU memory | loss at last step | lab / this |")
print(f"|---|---|---|---|---|---|")
lab_tps = lab.get("tokens_per_s")
for name, key, r in runs:
    mfu = f"{r['tokens_per_s'] * fpt / peak * 100:.1f} %" if peak else "-"
    ratio = f"{lab_tps / r['tokens_per_s']:.2f}x" if lab_tps else "-"
    print(f"| {name} | {r['tokens_per_s']:.0f} | {mfu} | {mem(key)} | {r['last_loss']:.4f} | {ratio} |")
if "phased_ms_per_step" in lab:
    print(f"\nlab's step: {lab['ms_per_step']:.1f} ms whole (as training runs it, the rows above), "
          f"{lab['phased_ms_per_step']:.1f} ms with a sync ending each phase: the difference is "
          f"host time the GPU hides in a whole step")
busy = lab.get("gpu_util_pct")
if busy is not None:
    print(f"\nlab's GPU was busy {busy:.0f} % (NVML's last sample period at each timed step's end): "
          f"near 100 % its kernels bound the step; under it the GPU waited on the host")
split = (load("lab_split.json") or {}).get("split")
if split:
    print(f"\nlab's step with a sync ending each phase ({split['step_ms']:.1f} ms) by op class, "
          f"each alone, forward + backward:")
    rows = [(c["class"], c["ms_per_step"], c.get("tflops")) for c in split["classes"]]
    rows += [("optimizer", split["optimizer_ms"], None), ("other", split["other_ms"], None)]
    for name, ms, tflops in rows:
        rate = f", {tflops:.1f} TFLOP/s" if tflops else ""
        print(f"  {name:<13} {ms:9.1f} ms {ms / split['step_ms'] * 100:5.1f} %{rate}")
print()
# lab's products run on cuBLASLt when LAB_MATMUL says so, else on cubecl's matmul.
ours = "lab's cuBLASLt" if os.environ.get("LAB_MATMUL") == "cublaslt" else "cubecl"
for a, b in zip(load("lab_matmul.json") or [], load("torch_matmul.json") or []):
    print(f"matmul {a['name']:<12} [{a['m']}x{a['k']}]@[{a['k']}x{a['n']}]: {ours} {a['tflops']:.1f} "
          f"TFLOP/s, PyTorch (cuBLAS) {b['tflops']:.1f} TFLOP/s, ratio {a['tflops'] / b['tflops']:.2f}")
EOF
exit "$failed"
