#!/bin/bash
# A data prepare spread over N plain processes on one machine: the parts at once, then the
# dedup and finalize stages. The result equals `lab data prepare FLAGS --output-dir OUT`.
#
#   scripts/prepare_parallel.sh N OUT [FLAGS...]
#   scripts/prepare_parallel.sh 2 /tmp/medquad --input crates/corpus/corpora/medquad.jsonl.zst \
#       --type-field source --all-filters --val-fraction 0.01
set -euo pipefail
LAB=${LAB:-./target/release/lab}
N=${1:?usage: $0 N OUT [FLAGS...]}
OUT=${2:?usage: $0 N OUT [FLAGS...]}
shift 2
WORKERS=${WORKERS:-1}

pids=()
# One failing part stops the others: no stage runs on an incomplete set.
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
for ((i = 0; i < N; i++)); do
  "$LAB" data prepare "$@" --output-dir "$OUT" --workers "$WORKERS" --quiet --part "$i" --of "$N" &
  pids+=($!)
done
# `wait -n`: the first part to fail ends the script now, not after the parts started before it.
for _ in "${pids[@]}"; do wait -n; done
trap - EXIT
"$LAB" data prepare "$@" --output-dir "$OUT" --quiet --stage dedup --of "$N"
"$LAB" data prepare "$@" --output-dir "$OUT" --quiet --stage finalize --of "$N"
