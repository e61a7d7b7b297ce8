#!/usr/bin/env python3
"""Writes tests/data/tokenizer/single_word/: small byte-level BPE tokenizers with added tokens
that have "single_word": true, and the ids Hugging Face `tokenizers` gives a corpus made to
put every kind of character next to them, for tests/core/test_tokenizer_single_word.c.

    python3 -m venv /tmp/peer-venv && /tmp/peer-venv/bin/pip install tokenizers
    /tmp/peer-venv/bin/python tools/make_single_word_ref.py tests/data/tokenizer/single_word

What it writes (the tests never need Python):

  plain.json   the 500-token model of tools/make_tokenizer_ref.py's variants (trained the same
               way on the same text), no normalizer, and added tokens single_word or not,
               special or not, normalized or not, with and without lstrip and rstrip, starting
               and ending with word characters or not, in Latin, CJK, digits, '_' and emoji,
               and tokens that overlap (a single_word token dropped where a shorter or an
               inner token would match; a token of the first pass next to one of the second)
  nfc.json     the same model with the NFC normalizer and single_word tokens whose content is
               not in NFC, normalized and not, next to combining marks
  ids.txt      one case per line: the tokenizer's name, a tab, the text (escaped as corpus.txt
               is: \\\\ \\n \\r \\t, \\xNN for other control bytes, the rest raw UTF-8), a tab,
               Tokenizer.from_file(name + ".json").encode(text).ids. Every hand-written line
               with both tokenizers, then 200 seeded random lines of tokens and neighbours for
               each.
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_ref import escape, train, training_text  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

SEED = 20250611


def token(content, single_word=True, lstrip=False, rstrip=False, normalized=True,
          special=False):
    return {"content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


PLAIN = [
    token("<mask>", normalized=False, special=True),
    token("[SEP]", lstrip=True, rstrip=True, normalized=False, special=True),
    token("hello"),
    token("world", lstrip=True, normalized=False),
    token("end!", rstrip=True),
    token("@user", normalized=False),
    token("--"),
    token("café"),
    token("中文"),
    token("42", normalized=False),
    token("_id"),
    token("👍"),
    token("<mask>s", single_word=False, normalized=False),
    # "abc" dropped beside a letter: "bc" inside it is not tried (same pass), "ab" is (the next)
    token("abc", normalized=False),
    token("bc", single_word=False, normalized=False),
    token("ab", single_word=False),
    # a normalized piece starts after a token of the first pass: "cd" stands alone in "bccd"
    token("cd"),
    token("x", lstrip=True, rstrip=True, normalized=False),
]

NFC = [
    token("café"),
    token("e\u0301te\u0301"),  # matched as "été"
    token("n\u0303o", normalized=False),  # matched as written, in the raw text
    token("<m>", lstrip=True, rstrip=True),
    token("<s>", normalized=False, special=True),
    token("Å"),
]

NEIGHBOURS = (
    list("aZé") + list("09_") + [" ", "  ", "\t", "\n", "\r\n"] + list(".,!?-@<>[]()'\"") +
    ["\u0301", "\u0308", "\u093f", "\u200d", "\u200c", "\u203f", "\u2160", "\u24b6", "\u00b2",
     "\u00bd", "\u0663", "\uff10", "\u00aa", "\u02b0", "\u00a0", "\u3000", "\u2003", "\u00ad",
     "\u4e2d", "\u30ab", "\ud55c", "\u0628", "\u0915", "\u0e01", "\u05d0", "\u0416", "\u03a9",
     "\U0001f44d", "\U0001f3fd", "\U0001f600", "\ufe0f", "\U0001d7ce", "\U00010d50",
     "\U00010940", "\ue000", "\u0378", "\U0001ccf0", "\U00011f04"])


def hand_lines():
    lines = [
        # start and end of the text, white space, punctuation
        "<mask>", " <mask> ", "<mask>.", ".<mask>", "(<mask>)", "a<mask>", "<mask>a",
        "<mask> My name <mask> A<mask> <mask>ony <mask>",
        "<mask>, <mask>- \u25cc\u0330<mask>",
        "<mask>s <mask>ss x<mask>s <mask>s.",
        "Hi [SEP] there\t[SEP]\t[SEP]\u2000 a[SEP] [SEP]b  [SEP]  ",
        "[SEP][SEP] [SEP]x[SEP] \n[SEP]\n",
        # each kind of neighbour, both sides
        "hello hello, hello_ _hello hello1 1hello héllo hello\u0301 hello\u00b2 hello\u00bd",
        "hello\u200d hello\u200c hello\u203f \u2160hello \u24b6hello hello\u0663 \uff10hello",
        "\u00aahello hello\u02b0 \u00a0hello\u00a0 \u3000hello\u3000 \u00adhello\u00ad",
        "\u4e2dhello hello\u30ab \ud55chello hello\u0628 \u0915\u093fhello hello\u0e01",
        "\U0001f44dhello hello\U0001f600 hello\ufe0f \U0001d7cehello hello\U00010d50",
        "\U00010940hello hello\ue000 \u0378hello hello\U0001ccf0 \U00011f04hello",
        # lstrip and rstrip with single_word
        "say  world, a world, aworld, world!, \tworld\t, worlds",
        "the end!  next end!x end!! xend! end!\n\nend",
        "@user hi @user1 a@user @user_ (@user) email@user.com",
        "-- a--b --x x-- --- ---- \u2014--\u2014 \u00e9--\u00e9",
        "caf\u00e9 cafe\u0301 caf\u00e9s \u00e0caf\u00e9 caf\u00e9\u0301 caf\u00e9!",
        "\u4e2d\u6587 \u4e2d\u6587\u5b57 \u5b57\u4e2d\u6587 \u4e2d\u6587, \u4e2d\u6587\u3002 "
        "a\u4e2d\u6587 \u4e2d\u6587\U0001f44d",
        "42 420 142 4242 42.5 $42 42% \u0663\u066242 42\u0663 42nd _42 42_",
        "_id _id_ a_id _idx x _id. __id id _id\u0301",
        "\U0001f44d \U0001f44d\U0001f44d a\U0001f44db \U0001f44d\U0001f3fd \u200d\U0001f44d"
        " \U0001f44d\u200d 1\U0001f44d1",
        # overlaps: the dropped token's text goes on to the next pass
        "abc abcd xabc abc_ ab abd bc bcd abcabc",
        "abcd bccd cdcd bc cd ab cd abcd cd",
        "x a x b\u00a0x\u00a0y x\tx\nx xx x_x",
        # ids in the NFC tokenizer's tokens
        "\u00e9t\u00e9 e\u0301te\u0301 \u00e9t\u00e9s l'\u00e9t\u00e9 \u00e9t\u00e9\u0301",
        "n\u0303o \u00f1o n\u0303os an\u0303o n\u0303o\u0301",
        "<m> a<m>b <m>\u0301 e\u0301<m> x\u0301<m> \u00e9 <m> \u00e9",
        "<s>a <s> <s>\u0301 \u00c5 A\u030a \u212b a\u00c5 \u00c5\u0301",
        "", " ", "\n",
    ]
    return lines


def random_lines(rng, tokens, n):
    pool = [t["content"] for t in tokens] * 3 + NEIGHBOURS
    out = []
    for _ in range(n):
        out.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 24))))
    return out


def build(base_json, added, normalizer):
    j = json.loads(base_json)
    j["normalizer"] = normalizer
    n = len(j["model"]["vocab"])
    for t in added:
        if t["content"] in j["model"]["vocab"]:
            t = dict(t, id=j["model"]["vocab"][t["content"]])
        else:
            t = dict(t, id=n)
            n += 1
        j["added_tokens"].append(t)
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/tokenizer/single_word"
    os.makedirs(out, exist_ok=True)
    base = train(training_text(), 500)._tokenizer.to_str()
    rng = random.Random(SEED)
    toks = [("plain", PLAIN, build(base, PLAIN, None)),
            ("nfc", NFC, build(base, NFC, {"type": "NFC"}))]
    count = 0
    with open(os.path.join(out, "ids.txt"), "w", encoding="utf-8", newline="\n") as f:
        for name, added, tok in toks:
            with open(os.path.join(out, name + ".json"), "w", encoding="utf-8") as g:
                g.write(tok.to_str())
            for line in hand_lines() + random_lines(rng, added, 200):
                ids = tok.encode(line).ids
                f.write("%s\t%s\t%s\n" % (name, escape(line), " ".join(map(str, ids))))
                count += 1
    print("tokenizers %s: %d cases written to %s" % (tokenizers.__version__, count, out))


if __name__ == "__main__":
    main()
