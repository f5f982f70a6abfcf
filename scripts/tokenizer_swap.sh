#!/usr/bin/env bash
# Tokenizer swap for continued pretraining, end to end with the `lab` binary, small enough for
# a 2-core CPU (issue 14, part 4):
#
#   1. train a 32K byte-level BPE on MedQuAD: the new, medical tokenizer;
#   2. prepare MedQuAD twice, GPT-2 tokens and med32k tokens (the same documents go to val.bin);
#   3. train the "old" model, configs/tiny-cpu.toml with the GPT-2 vocabulary, on MedQuAD and
#      export it as a Hugging Face folder (`lab export --hf`);
#   4. continue it with the med32k tokenizer (`lab train --init-from-hf`: rows of tokens both
#      vocabularies share copied, new tokens composed from the mean of their GPT-2 sub-tokens),
#      and train the same config from random init: same seed, steps, schedule and data order;
#   5. `lab compare`: both loss curves as a PNG and a CSV, and a table of the numbers.
#
# Usage: scripts/tokenizer_swap.sh [OUT]          (default OUT: runs/tokenizer-swap)
# Environment: LAB (the binary, default target/release/lab), OLD_STEPS (150), NEW_STEPS (120),
# EVAL_EVERY (20), FREEZE_STEPS (0; K > 0 adds a third run, the swap with
# --freeze-non-embedding-steps K).
set -euo pipefail
cd "$(dirname "$0")/.."

LAB=${LAB:-target/release/lab}
OUT=${1:-runs/tokenizer-swap}
OLD_STEPS=${OLD_STEPS:-150}
NEW_STEPS=${NEW_STEPS:-120}
EVAL_EVERY=${EVAL_EVERY:-20}
FREEZE_STEPS=${FREEZE_STEPS:-0}
MEDQUAD=crates/corpus/corpora/medquad.jsonl.zst

if [[ ! -x $LAB ]]; then
    echo "error: $LAB is not built; run: cargo build --release -p lab@0.1.0" >&2
    exit 1
fi
say() { printf '\n== %s\n' "$*"; }
mkdir -p "$OUT"
# The runs are made again every time (lab train refuses to start over a run folder).
rm -rf "$OUT"/{old,old-hf,swap,scratch,swap-frozen}

say "1. tokenizer: a 32K BPE trained on MedQuAD"
"$LAB" tokenizer train --input "$MEDQUAD" --vocab-size 32000 --output "$OUT/med32k.json" --quiet

say "2. data: MedQuAD as GPT-2 tokens and as med32k tokens"
for tok in gpt2 med32k; do
    spec=$tok
    [[ $tok == med32k ]] && spec=$OUT/med32k.json
    "$LAB" data prepare --input "$MEDQUAD" --tokenizer "$spec" --val-fraction 0.02 \
        --output-dir "$OUT/data-$tok" --quiet | tail -1
done

say "3. the old model: tiny-cpu, GPT-2 vocabulary, $OLD_STEPS steps on MedQuAD; exported for Hugging Face"
sed -e 's/^name = .*/name = "swap-old-gpt2"/' configs/tiny-cpu.toml >"$OUT/old.toml"
sed -e 's/^name = .*/name = "swap-new-med32k"/' \
    -e 's/^vocab_size = 50257.*/vocab_size = 32000        # the med32k tokenizer/' \
    configs/tiny-cpu.toml >"$OUT/new.toml"
"$LAB" train --config "$OUT/old.toml" --data-dir "$OUT/data-gpt2" --ckpt-dir "$OUT/old" \
    --total-steps "$OLD_STEPS" --ckpt-every "$OLD_STEPS" --log-every 50 --eval-every 100
"$LAB" export --run "$OUT/old" --hf "$OUT/old-hf"

new_run() { # name, extra flags…
    local name=$1
    shift
    say "4. $name: med32k, $NEW_STEPS steps $*"
    "$LAB" train --config "$OUT/new.toml" --data-dir "$OUT/data-med32k" --ckpt-dir "$OUT/$name" \
        --total-steps "$NEW_STEPS" --ckpt-every "$NEW_STEPS" --eval-every "$EVAL_EVERY" \
        --log-every 5 "$@"
}
new_run swap --init-from-hf "$OUT/old-hf"
new_run scratch
runs=(--run "swap=$OUT/swap" --run "scratch=$OUT/scratch")
if ((FREEZE_STEPS > 0)); then
    new_run swap-frozen --init-from-hf "$OUT/old-hf" --freeze-non-embedding-steps "$FREEZE_STEPS"
    runs+=(--run "swap-frozen=$OUT/swap-frozen")
fi

say "5. the curves"
echo "rows of the swap (events.jsonl):"
grep '"init_from_hf"' "$OUT/swap/events.jsonl"
step0=$("$LAB" eval --run "$OUT/swap" --checkpoint 0 --json |
    sed -n 's/^ *"loss": \([0-9.]*\),*$/\1/p' | tail -1)
echo "val.bin loss of the swapped model before any step: $step0 nats/token (random init: ln 32000 = 10.37)"
"$LAB" compare "${runs[@]}" --output "$OUT/curves.png" --csv "$OUT/curves.csv"
echo "csv: $OUT/curves.csv"
