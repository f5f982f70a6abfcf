"""nanoGPT-style data preparation, for comparison with `lab data prepare`.

As nanoGPT's data/openwebtext/prepare.py and data/fineweb/fineweb.py do it: read documents,
encode each with tiktoken's GPT-2 `encode_ordinary` in a multiprocessing pool, append the
end-of-text token, write uint16 train.bin / val.bin. Runs offline: the GPT-2 ranks come from
a local r50k_base.tiktoken file (pass --ranks; tiktoken-rs ships one, see BENCHMARKS.md).

    python3 scripts/bench/prepare_tiktoken.py --input medquad.jsonl --ranks r50k_base.tiktoken \
        --workers 2 --out /tmp/py-prep
"""
import argparse
import json
import multiprocessing as mp
import os
import time

from array import array
import tiktoken
from tiktoken.load import load_tiktoken_bpe

PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
enc = None


def init(ranks):
    global enc
    enc = tiktoken.Encoding(
        name="gpt2", pat_str=PAT, mergeable_ranks=load_tiktoken_bpe(ranks),
        special_tokens={"<|endoftext|>": 50256},
    )


def process(text):
    ids = enc.encode_ordinary(text)
    ids.append(enc.eot_token)
    return array("H", ids).tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True, help="JSONL with a text field")
    ap.add_argument("--ranks", required=True)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--text-field", default="text")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    start = time.time()
    with open(a.input, encoding="utf-8") as f:
        texts = [json.loads(line)[a.text_field] for line in f if line.strip()]
    raw = sum(len(t.encode("utf-8")) for t in texts)
    # nanoGPT's openwebtext split: a seeded 0.05% document sample for val; here every 1000th.
    with mp.Pool(a.workers, initializer=init, initargs=(a.ranks,)) as pool:
        arrays = pool.map(process, texts, chunksize=16)
    train = b"".join(x for i, x in enumerate(arrays) if i % 1000 != 0)
    val = b"".join(x for i, x in enumerate(arrays) if i % 1000 == 0)
    with open(os.path.join(a.out, "train.bin"), "wb") as f:
        f.write(train)
    with open(os.path.join(a.out, "val.bin"), "wb") as f:
        f.write(val)
    secs = time.time() - start
    print(json.dumps({"workers": a.workers, "mb": raw / 1e6, "seconds": secs, "mb_per_s": raw / 1e6 / secs,
                      "tokens": (len(train) + len(val)) // 2}))


if __name__ == "__main__":
    main()
