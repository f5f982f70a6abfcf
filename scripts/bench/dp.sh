#!/bin/bash
# Data parallelism on one machine: step time of 1 process against 2 ranks under mpirun (plain
# and ZeRO-1), the share of step time in collectives, and the all-reduce bandwidth through
# lab's seam against Open MPI's own MPI_Allreduce on the same buffer. Rounds are interleaved.
#
#   cargo build --release -p lab@0.1.0 --features mpi && cargo build --release -p lab-dist --features mpi --bins
#   scripts/bench/dp.sh [ROUNDS]
#   PRECISION=bf16 scripts/bench/dp.sh [ROUNDS]    # ZeRO-1 then shards the fp32 masters too
#
# Same global batch in every variant: tiny-cpu with grad_accum 2 (2 × 8 × 128 = 2,048 tokens
# per step); the single process uses both cores (RAYON_NUM_THREADS=2), each rank one.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-2}
LAB=${LAB:-./target/release/lab}
PRECISION=${PRECISION:-fp32}
CHECK=${CHECK:-./target/release/lab-dist-check}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

sed -e 's/^grad_accum = 1 .*/grad_accum = 2/' -e 's/^total_steps = 300/total_steps = 60/' \
    -e 's/^eval_every = 100/eval_every = 1000/' -e 's/^ckpt_every = 100/ckpt_every = 1000/' \
    configs/tiny-cpu.toml > "$WORK/plain.toml"
(cat "$WORK/plain.toml"; printf '[parallel]\nzero = 1\n') > "$WORK/zero.toml"

# Median ms/step and comm share over the rows after the first (warm-up) of a run's metrics.
summary() {
  python3 - "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")][1:]
ms = statistics.median(2048 / r["tokens_per_s"] * 1e3 for r in rows)
share = [r["comm_share"] for r in rows if "comm_share" in r]
print(f"{ms:8.1f} ms/step  {2048 / ms * 1e3:7.0f} tok/s" + (f"  comm {100 * statistics.median(share):4.1f}%" if share else ""))
PY
}

for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round"
  rm -rf "$WORK"/r-*
  RAYON_NUM_THREADS=2 "$LAB" train --config "$WORK/plain.toml" --ckpt-dir "$WORK/r-one" --log-every 5 --precision "$PRECISION" >/dev/null
  printf '  1 process, 2 threads   '; summary "$WORK/r-one"
  RAYON_NUM_THREADS=1 mpirun -np 2 "$LAB" train --config "$WORK/plain.toml" --ckpt-dir "$WORK/r-dp" --log-every 5 --precision "$PRECISION" >/dev/null
  printf '  2 ranks × 1 thread     '; summary "$WORK/r-dp"
  RAYON_NUM_THREADS=1 mpirun -np 2 "$LAB" train --config "$WORK/zero.toml" --ckpt-dir "$WORK/r-z1" --log-every 5 --precision "$PRECISION" >/dev/null
  printf '  2 ranks, ZeRO-1        '; summary "$WORK/r-z1"
  grep -ho '"all_gather_bytes":[0-9]*\|"weight_bytes_per_rank":\[[0-9,]*\]' "$WORK/r-z1/events.jsonl" | sed 's/^/    /' 
  for mb in 4 52; do
    mpirun -np 2 "$CHECK" bench "$mb" | sed 's/^/  /'
  done
done
