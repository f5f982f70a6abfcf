#!/bin/bash
# lab under torchrun: torchrun starts the ranks and sets RANK, WORLD_SIZE, LOCAL_RANK,
# MASTER_ADDR and MASTER_PORT, which `lab train` reads; `--max-restarts` is torchrun's own
# elastic restart (TORCHELASTIC_RESTART_COUNT goes into the run's `restarted` event).
# torchrun jobs talk through NCCL, so this needs a GPU build (`--features cuda`); on CPUs use
# mpirun with a `--features mpi` build instead:
#
#   mpirun -np 2 ./target/release/lab train --config C --ckpt-dir runs/dp --resume-from-latest
#
# One node, 8 GPUs:   scripts/torchrun/train.sh configs/x1-50m-a100.toml runs/x1-dp8
# Two nodes:          NNODES=2 NODE_RANK=0|1 MASTER_ADDR=node0 scripts/torchrun/train.sh …
set -euo pipefail
CONFIG=${1:?usage: train.sh CONFIG RUN_DIR}
RUN=${2:?usage: train.sh CONFIG RUN_DIR}
LAB=${LAB:-./target/release/lab}

exec torchrun --no-python \
  --nnodes "${NNODES:-1}" --node-rank "${NODE_RANK:-0}" --nproc-per-node "${NPROC:-8}" \
  --master-addr "${MASTER_ADDR:-127.0.0.1}" --master-port "${MASTER_PORT:-29500}" \
  --max-restarts "${MAX_RESTARTS:-3}" \
  "$LAB" train --backend cuda --config "$CONFIG" --ckpt-dir "$RUN" --resume-from-latest
