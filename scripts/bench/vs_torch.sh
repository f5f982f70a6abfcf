#!/usr/bin/env bash
# lab against PyTorch eager on the tiny-cpu step, interleaved so that the machine's noise falls
# on all three alike: per round, `lab bench`, PyTorch as installed, PyTorch with glibc's
# allocator tuned (freed memory kept instead of unmapped). Prints one line per run and the
# means with their ratios.
#
#   scripts/bench/vs_torch.sh [ROUNDS] [THREADS] [STEPS]      # defaults 6 2 7
#   PYTHON=/tmp/torch-cpu/venv/bin/python (default)          # /work/shared/tools/torch-cpu/setup.sh
set -euo pipefail
rounds=${1:-6} threads=${2:-2} steps=${3:-7}
[ "$rounds" -ge 1 ] || { echo "vs_torch.sh: ROUNDS must be at least 1" >&2; exit 2; }
python=${PYTHON:-/tmp/torch-cpu/venv/bin/python}
lab=${LAB:-./target/release/lab}
here=$(cd "$(dirname "$0")" && pwd)

# Tokens/s from a run's output; names the run that printed none.
tps() { grep -o '[0-9.]* tokens/s' | head -1 | cut -d' ' -f1 | grep . || { echo "vs_torch.sh: $1 printed no tokens/s" >&2; exit 1; }; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
declare -a L P T
for r in $(seq "$rounds"); do
  l=$("$lab" bench --threads "$threads" --steps "$steps" 2>&1 | tps "lab bench")
  p=$("$python" "$here/torch_tiny.py" --threads "$threads" --steps "$steps" 2>&1 | tps "torch_tiny.py")
  t=$(GLIBC_TUNABLES=glibc.malloc.mmap_max=0 "$python" "$here/torch_tiny.py" --threads "$threads" --steps "$steps" 2>&1 | tps "torch_tiny.py (tuned)")
  L+=("$l") P+=("$p") T+=("$t")
  echo "round $r: lab $l | torch $p | torch tuned $t  (lab/torch $(ratio "$l" "$p"), lab/tuned $(ratio "$l" "$t"))"
done
mean() { printf '%s\n' "$@" | awk '{s+=$1} END {printf "%.0f", s/NR}'; }
ml=$(mean "${L[@]}") mp=$(mean "${P[@]}") mt=$(mean "${T[@]}")
echo "threads $threads, $rounds rounds, means: lab $ml | torch $mp | torch tuned $mt tokens/s; lab/torch $(ratio "$ml" "$mp"), lab/tuned $(ratio "$ml" "$mt")"
