#!/usr/bin/env python3
"""Checks a `lab export --hf DIR` folder with Hugging Face transformers, offline.

1. AutoTokenizer loads the folder and encodes lab's parity prompt to the ids lab used.
2. LlamaForCausalLM (fp32) gives the logits lab recorded in lab_parity.json: every prompt
   position at ~256 vocabulary ids, max abs difference <= 1e-4; and the same argmax everywhere.
3. Greedy decoding of 20 tokens gives exactly lab's tokens.

    python scripts/reference/hf_parity.py DIR
    # transformers on a CPU machine:
    # /work/shared/tools/torch-cpu/setup.sh /tmp/torch-cpu/venv transformers safetensors
"""

import json
import sys
import warnings

warnings.filterwarnings("ignore", message="CUDA initialization")  # CPU run of a CUDA build

import torch  # noqa: E402
from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: E402

TOLERANCE = 1e-4


def main(folder):
    torch.set_num_threads(2)
    ref = json.load(open(f"{folder}/lab_parity.json"))
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok(ref["prompt"])["input_ids"]
    assert ids == ref["prompt_ids"], f"tokenizer: {ids[:12]}… vs lab {ref['prompt_ids'][:12]}…"

    model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]  # [T, V]
    cols = torch.tensor(ref["vocab_ids"])
    lab = torch.tensor(ref["logits"], dtype=torch.float32)
    diff = (logits[:, cols] - lab).abs().max().item()
    argmax = logits.argmax(-1).tolist()
    print(f"logits: {len(ids)} positions x {len(cols)} vocabulary ids, max abs diff {diff:.3e}")
    assert diff <= TOLERANCE, f"logits differ by {diff} > {TOLERANCE}"
    assert argmax == ref["argmax"], "argmax differs at some prompt position"

    seq = list(ids)
    with torch.no_grad():
        for _ in range(len(ref["greedy_ids"])):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    greedy = seq[len(ids):]
    print(f"greedy {len(greedy)} tokens: {'identical' if greedy == ref['greedy_ids'] else 'DIFFERENT'}")
    print(f"  lab: {tok.decode(ref['greedy_ids'])!r}")
    assert greedy == ref["greedy_ids"], f"greedy: transformers {greedy} vs lab {ref['greedy_ids']}"
    print("OK: transformers", __import__("transformers").__version__, "agrees with lab")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
