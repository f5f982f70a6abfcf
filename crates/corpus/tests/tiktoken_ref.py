"""Reference GPT-2 encodings from OpenAI's tiktoken, offline: the ranks come from a local
r50k_base.tiktoken file. Reads {"ranks": path, "texts": [...]} on stdin, writes token lists."""
import json
import sys

import tiktoken
from tiktoken.load import load_tiktoken_bpe

req = json.load(sys.stdin)
enc = tiktoken.Encoding(
    name="gpt2",
    pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    mergeable_ranks=load_tiktoken_bpe(req["ranks"]),
    special_tokens={"<|endoftext|>": 50256},
)
json.dump([enc.encode_ordinary(t) for t in req["texts"]], sys.stdout)
