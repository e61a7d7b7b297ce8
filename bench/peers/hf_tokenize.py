#!/usr/bin/env python3
"""The Hugging Face peer of meshwit-bench's tokenize case: `tokenizers` encoding one text with one
tokenizer, single-threaded (TOKENIZERS_PARALLELISM=false), timed call by call.

Run by hand or by `meshwit-bench tokenize` (never by the build or the tests), with a Python that
has tokenizers:

    python3 -m venv /tmp/peer-venv && /tmp/peer-venv/bin/pip install tokenizers
    /tmp/peer-venv/bin/python bench/peers/hf_tokenize.py --tokenizer tests/data/tokenizer \\
        --text /tmp/text.txt --repeats 3

The tokenizer is loaded as mw_tokenizer_load reads it: a tokenizer.json, or a folder with one,
or a folder of GPT-2's vocab.json + merges.txt (ByteLevelBPETokenizer with <|endoftext|> added as
a special token). The text is encoded whole, in one encode() call, as the bench encodes it (the
ids compared come from that call), and also cut into pieces of about 4 KB at line ends and
encoded by one encode_batch() call, which is faster in tokenizers (the better of the two is what
the bench compares with). Both without the special tokens a post-processor adds
(add_special_tokens=False, as mw_tokenizer_encode: Llama 3's <|begin_of_text|> is not added).

Prints one JSON object on its last line: {"peer": "tokenizers 0.23.3", "mb_per_s": median of
the whole-text calls, "batch_mb_per_s": median of the encode_batch calls,
"ids": count, "crc32": CRC-32 of the ids as little-endian uint32, "utf8": whether the text was
UTF-8 (if not, it was decoded with replacement characters and the ids are not comparable)}.
"""
import argparse
import array
import json
import os
import statistics
import sys
import time
import zlib


def crc32(ids):
    a = array.array("I", ids)
    assert a.itemsize == 4
    if sys.byteorder != "little":
        a.byteswap()
    return zlib.crc32(a.tobytes())


def chunked(text, size=4096):
    """Pieces of about `size` characters, cut after a newline."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def load(tokenizers, path):
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "tokenizer.json")):
        tok = tokenizers.ByteLevelBPETokenizer(os.path.join(path, "vocab.json"),
                                               os.path.join(path, "merges.txt"))
        if tok.token_to_id("<|endoftext|>") is not None:
            tok.add_special_tokens(["<|endoftext|>"])
        return tok
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    return tokenizers.Tokenizer.from_file(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import tokenizers

    tok = load(tokenizers, args.tokenizer)
    raw = open(args.text, "rb").read()
    try:
        text, utf8 = raw.decode("utf-8"), True
    except UnicodeDecodeError:
        text, utf8 = raw.decode("utf-8", errors="replace"), False
    rates, batch, ids = [], [], []
    chunks = list(chunked(text))
    for _ in range(max(1, args.repeats)):
        t = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=False).ids
        rates.append(len(raw) / (time.perf_counter() - t) / 1e6)
        t = time.perf_counter()
        tok.encode_batch(chunks, add_special_tokens=False)
        batch.append(len(raw) / (time.perf_counter() - t) / 1e6)
    print(json.dumps({"peer": "tokenizers " + tokenizers.__version__,
                      "mb_per_s": statistics.median(rates),
                      "batch_mb_per_s": statistics.median(batch), "ids": len(ids),
                      "crc32": crc32(ids), "utf8": utf8}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
