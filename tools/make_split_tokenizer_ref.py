#!/usr/bin/env python3
"""Writes the Llama 3 and Qwen2 style tokenizers of tests/data/tokenizer/ and the ids Hugging Face
`tokenizers` gives a test corpus with them, for tests/core/test_tokenizer_split.c.

    python3 -m venv /tmp/peer-venv && /tmp/peer-venv/bin/pip install tokenizers
    /tmp/peer-venv/bin/python tools/make_split_tokenizer_ref.py tests/data/tokenizer

The real files are too big to keep here (128256 and 151646 tokens), so small ones are trained by
`tokenizers` on the text tools/make_tokenizer_ref.py trains on, and everything around the model
is set exactly as meta-llama/Meta-Llama-3-8B's and Qwen/Qwen2-0.5B's tokenizer.json have it (the
pre-tokenizer, normalizer, post-processor and decoder as transformers' converters write them:
TikTokenConverter and Llama 3's conversion script, Qwen2Converter), with the special tokens of
those models after the vocabulary. What it writes (the tests never need Python):

  llama3.json       a byte-level BPE of 2000 trained tokens with ignore_merges, and words of the
                    corpus added to the vocabulary that only ignore_merges reaches (as the
                    tiktoken vocabulary Llama 3's was converted from has them); pre-tokenizer
                    Sequence [Split by Llama 3's regex, Isolated; ByteLevel without its regex];
                    post-processor Sequence [ByteLevel; TemplateProcessing "<|begin_of_text|>
                    $A"]; added tokens <|begin_of_text|>, <|end_of_text|>, reserved ones (one
                    the prefix of others), <|start_header_id|>, <|end_header_id|>, <|eot_id|>
  qwen2.json        a byte-level BPE of 2000 tokens; normalizer NFC; pre-tokenizer Sequence
                    [Split by Qwen2's regex; ByteLevel without its regex]; post-processor
                    ByteLevel; added tokens <|endoftext|>, <|im_start|>, <|im_end|> (special) and
                    Qwen2.5's <tool_call>, </tool_call> (not special)
  variants/split_*.json   small ones (vocabulary 500) for the other ways of putting Split and
                    ByteLevel together: split_gpt2 (Split by GPT-2's own regex, then ByteLevel
                    without it), split_prefix (Split by Llama 3's regex, then ByteLevel with
                    add_prefix_space and its own regex on each piece)
  split_corpus.txt  one text per line, escaped as corpus.txt is: Latin, Cyrillic, Greek, CJK,
                    Arabic, Devanagari, emoji, digit runs of every length from 1 to 14 and in
                    other scripts, runs of spaces, tabs, CR and LF, contractions in any case
                    (and with U+017F, which (?i) folds to s), punctuation runs, the special
                    tokens inside text, decomposed and composed accents (NFC), and 120 seeded
                    random lines of such pieces
  every_code_point.txt  for tokenizer.json, llama3.json and qwen2.json: the words the
                    pre-tokenizer (after the normalizer) cuts the probes of every code point into
                    (text around each: see probe), summed up as a count and a CRC-32, and for
                    qwen2 the NFC of the probes likewise (see every_code_point)
  split_ids.txt     per tokenizer and line: "name line plain<TAB>ids" (encode(text,
                    add_special_tokens=False)) for every line (every fourth for the variants),
                    and "name line special<TAB>ids" (add_special_tokens=True) for every eighth
                    of llama3's and qwen2's; "qwen2 line nfc<TAB>text" for each line NFC changes,
                    the text it becomes (escaped). decode(ids) is checked here to be the text
                    (for qwen2 the NFC of the text; not for split_prefix, which adds spaces)
"""
import json
import os
import random
import struct
import sys
import zlib

import tokenizers
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tokenizer_ref  # noqa: E402  (the training text and the escaping of corpus.txt)

SEED = 20250301
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
                  "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|reserved_special_token_4|>", "<|eot_id|>", "<|reserved_special_token_10|>",
                  "<|reserved_special_token_11|>"]
QWEN2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_PLAIN = ["<tool_call>", "</tool_call>"]


def corpus():
    lines = make_tokenizer_ref.corpus()[:80]  # hand-written: prose, code, scripts, emoji, ...
    lines += [
        # contractions in every case, and U+017F
        "It'S HE'LL THEY'RE WE'VE I'M SHE'D DON'T it's he'll they're we've i'm she'd don't",
        "'S 'T 'RE 'VE 'M 'LL 'D 'Re 'rE 'Ve 'vE 'Ll 'lL 'x 'sa 'Sa 'tt 'rex 'llama 'dD",
        "'\u017f '\u017fa x'\u017f \u017fun 'r\u0117 'K '\u212a 'ST '\u00df",
        "''s '''t ' s ' re '\n's 1's 2'LL \u00e9'S \u0416'\u0416",
        # digit runs of every length, and digits of other scripts
        " ".join("1234567890123456"[:k] for k in range(1, 15)),
        "x1 x12 x123 x1234 x12345 1,000,000 3.14159265 2024-12-31T23:59:59Z 0x7fffffff",
        "\u0661\u0662\u0663\u0664\u0665 \u0967\u0968\u0969\u096a \uff11\uff12\uff13\uff14 "
        "\u2460\u2461\u2462\u2463 \u00bd\u00bc \u2167\u2168 \U0001d7ce\U0001d7cf\U0001d7d0\U0001d7d1",
        "abc123def4567ghi 12ab 123ab 1234ab a1b22c333d4444",
        # white space: runs of spaces, tabs, CR and LF
        "a\r\nb\r\n\r\nc\n\n\nd\r\re",
        "  \r\n  x\t\t\r\n\t y  \n  \n  z   ",
        "\t\t\t\tindented\n\t\t\t\n\t\t\t\tmore",
        "end with spaces   \r\n   ",
        "\n\n\n",
        "   \t  \u3000 \u00a0\n\u2028 \u0085x",
        "word \n\nword\r\n \r\n word",
        "!!!\r\n???\n\n...\r\n--- \n",
        # punctuation runs
        "Wait... what?!?! (really) [yes] {no} <maybe> -- ok;; ::= => -> <=> ...!",
        "\"quoted\" 'single' `back` \u201ccurly\u201d \u2018curly\u2019 \u00abguillemets\u00bb",
        " !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ ",
        "a.b,c;d:e!f?g (h) [i] {j} --k ++l ==m",
        # scripts
        "Latin: \u00c0 la claire fontaine, \u00e7a va? Stra\u00dfe \u00f8re \u0141\u00f3d\u017a",
        "\u041a\u0438\u0440\u0438\u043b\u043b\u0438\u0446\u0430: \u0421\u044a\u0435\u0448\u044c "
        "\u0436\u0435 \u0435\u0449\u0451 \u044d\u0442\u0438\u0445 \u043c\u044f\u0433\u043a\u0438\u0445.",
        "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac: \u03be\u03b5\u03c3\u03ba\u03b5\u03c0\u03ac"
        "\u03b6\u03c9 \u03c4\u1f74\u03bd \u03c8\u03c5\u03c7\u03bf\u03c6\u03b8\u03cc\u03c1\u03b1",
        "\u4e2d\u6587\uff1a\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8\u3002\u65e5\u672c\u8a9e\uff1a"
        "\u3072\u3089\u304c\u306a\u3068\u30ab\u30bf\u30ab\u30ca\u3002\ud55c\uad6d\uc5b4\ub3c4.",
        "\u0627\u0644\u0639\u0631\u0628\u064a\u0629: \u0645\u0631\u062d\u0628\u0627 \u0628\u0643\u0645"
        " \u0661\u0662\u0663 \u0647\u0646\u0627\u061f",
        "\u0939\u093f\u0928\u094d\u0926\u0940: \u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941"
        "\u0928\u093f\u092f\u093e\u0964 \u0967\u0968\u0969",
        "emoji: \U0001f600\U0001f64f \U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f1fa\U0001f1f8"
        " \u2764\ufe0f\U0001f525 x\U0001f44dy",
        # the special tokens inside text, and near misses
        "<|begin_of_text|>Hello<|end_of_text|>",
        "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "x<|reserved_special_token_1|>y<|reserved_special_token_10|>z<|reserved_special_token_11|>",
        "<|reserved_special_token_1|0|> <|begin_of_text|  <|eot_id|>> <<|eot_id|>",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
        "<|endoftext|><|endoftext|> <|im_end|><|im_start|>",
        "<tool_call>{\"name\": \"f\"}</tool_call> <tool_call></tool_call>x",
        # decomposed and composed accents (NFC composes the first of each pair)
        "cafe\u0301 caf\u00e9 A\u030a \u00c5 n\u0303 \u00f1 e\u0301\u0301 \u1e9b\u0323",
        "\uac00\u11a8 \u1100\u1161\u11a8 \u0041\u0327\u0301 \u212b \u2126 \u00c5\u0300",
        "\u0915\u093c \u0958 \u09c7\u09be \u0b47\u0b3e \u3099\u304b\u3099 \u1026\u102e",
    ]
    rng = random.Random(SEED)
    pool = (list("abcdefghijXYZ") * 3 + list("0123456789") * 3 + list("  ") * 6 +
            list("\t\n\r") * 2 + ["\r\n", "  \n", "'s", "'S", "'LL", "'re", "'\u017f", "'"] +
            list(".,;:!?-_()[]{}<>\"#$%&*+/=@\\^`|~") +
            list("\u0416\u0438\u0437\u043d\u044c\u03b1\u03b2\u03b3\u4e2d\u6587\u65e5\u672c"
                 "\u0645\u0631\u062d\u0928\u092e\u0938\u094d\u0e2a\u0e27") +
            list("\u0661\u0662\u0967\uff11\u00bd\u2167\u00b2") +
            ["\u0301", "\u0308", "\u00e9", "e\u0301", "\U0001f44d", "\u200d", "\u00a0",
             "\u3000", "\u2028"] + LLAMA3_SPECIAL[:2] + ["<|eot_id|>", "<|im_start|>",
                                                         "<tool_call>", "<|endoftext|>"])
    for _ in range(120):
        lines.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 60))))
    return lines


def trained(pattern, normalizer, vocab_size, parts):
    tok = Tokenizer(models.BPE())
    if normalizer:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(parts, trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return json.loads(tok.to_str())


def llama3(parts, lines):
    j = trained(LLAMA3, None, 2000, parts)
    j["model"]["ignore_merges"] = True
    # Words of the corpus that BPE would split become tokens of their own.
    probe = Tokenizer.from_str(json.dumps(j))
    vocab = j["model"]["vocab"]
    top = max(vocab.values())
    for line in lines[:80:3]:
        for piece, _ in probe.pre_tokenizer.pre_tokenize_str(line):
            if piece not in vocab and len(probe.model.tokenize(piece)) > 1 and top < 2060:
                top += 1
                vocab[piece] = top
    j["pre_tokenizer"]["pretokenizers"][1] = {"type": "ByteLevel", "add_prefix_space": False,
                                              "trim_offsets": True, "use_regex": False}
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True}
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t in LLAMA3_SPECIAL])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
            special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def qwen2(parts):
    j = trained(QWEN2, normalizers.NFC(), 2000, parts)
    j["normalizer"] = {"type": "NFC"}
    m = j["model"]
    m["continuing_subword_prefix"] = ""
    m["end_of_word_suffix"] = ""
    m.pop("ignore_merges", None)  # Qwen2's file predates the field
    j["pre_tokenizer"]["pretokenizers"][1] = {"type": "ByteLevel", "add_prefix_space": False,
                                              "trim_offsets": False, "use_regex": False}
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False,
                           "trim_offsets": False, "use_regex": False}
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False}
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t in QWEN2_SPECIAL])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in QWEN2_PLAIN])
    return tok


def variant(parts, split_pattern, prefix, regex):
    j = trained(LLAMA3, None, 500, parts)
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": split_pattern}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True,
         "use_regex": regex}]}
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_special_tokens([AddedToken("<|endoftext|>", normalized=False, special=True)])
    return tok


def probe(cp):
    """The text around code point cp that every_code_point.txt sums up; the C test writes the same
    (tests/core/test_tokenizer_split.c, probe_text)."""
    c = chr(cp)
    return ("a" + c + "1" + c + "1'" + c + "a'l" + c + " " + c + "!\n" + c + "\u0301 " + c +
            "\u1100" + c + "\t")


def every_code_point(out, toks):
    """every_code_point.txt: per tokenizer, the words (normalizer and pre-tokenizer: added tokens
    have no part in the probes) of the probes of every code point but the surrogates, in chunks
    of 4096 code points each cut on its own: their count and the CRC-32 of their lengths in bytes
    as little-endian uint32; with a normalizer, also the bytes of the normalized text: their
    count and CRC-32."""
    cps = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    with open(os.path.join(out, "every_code_point.txt"), "w", newline="\n") as f:
        f.write("# name words crc32-of-word-lengths [normalized-bytes crc32-of-them]\n")
        for name, tok in toks:
            words = crc = nbytes = ncrc = 0
            for start in range(0, len(cps), 4096):
                text = "".join(probe(cp) for cp in cps[start:start + 4096])
                if tok.normalizer:
                    text = tok.normalizer.normalize_str(text)
                    b = text.encode("utf-8", "surrogatepass")
                    nbytes += len(b)
                    ncrc = zlib.crc32(b, ncrc)
                lens = [len(p) for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
                words += len(lens)
                crc = zlib.crc32(struct.pack("<%dI" % len(lens), *lens), crc)
            f.write("%s %d %d" % (name, words, crc))
            f.write(" %d %d\n" % (nbytes, ncrc) if tok.normalizer else "\n")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/tokenizer"
    os.makedirs(os.path.join(out, "variants"), exist_ok=True)
    parts = make_tokenizer_ref.training_text()
    lines = corpus()
    toks = [("llama3", llama3(parts, lines), "llama3.json"),
            ("qwen2", qwen2(parts), "qwen2.json"),
            ("split_gpt2", variant(parts, GPT2, False, False), "variants/split_gpt2.json"),
            ("split_prefix", variant(parts, LLAMA3, True, True), "variants/split_prefix.json")]
    with open(os.path.join(out, "split_corpus.txt"), "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(make_tokenizer_ref.escape(line) + "\n")
    nfc = normalizers.NFC()
    with open(os.path.join(out, "split_ids.txt"), "w", encoding="utf-8", newline="\n") as f:
        for name, tok, path in toks:
            text = tok.to_str()  # as tokenizers saves it: the ids it assigned
            with open(os.path.join(out, path), "w", encoding="utf-8") as g:
                g.write(text)
            tok = Tokenizer.from_str(text)
            every = 1 if not name.startswith("split_") else 4
            for i, line in enumerate(lines):
                if i % every:
                    continue
                plain = tok.encode(line, add_special_tokens=False).ids
                special = tok.encode(line).ids
                if name == "llama3":
                    assert special == [tok.token_to_id("<|begin_of_text|>")] + plain, line
                else:
                    assert special == plain, line
                normal = nfc.normalize_str(line) if name == "qwen2" else line
                if name != "split_prefix":
                    assert tok.decode(plain, skip_special_tokens=False) == normal, (name, line)
                if normal != line:
                    f.write("%s %d nfc\t%s\n" % (name, i + 1, make_tokenizer_ref.escape(normal)))
                f.write("%s %d plain\t%s\n" % (name, i + 1, " ".join(map(str, plain))))
                if i % 8 == 0 and not name.startswith("split_"):
                    f.write("%s %d special\t%s\n" % (name, i + 1, " ".join(map(str, special))))
            print("%s: %d bytes" % (path, len(text.encode())))
    every_code_point(out, [("tokenizer", Tokenizer.from_file(os.path.join(out, "tokenizer.json"))),
                           ("llama3", Tokenizer.from_file(os.path.join(out, "llama3.json"))),
                           ("qwen2", Tokenizer.from_file(os.path.join(out, "qwen2.json")))])
    print("tokenizers %s: %d corpus lines written to %s" % (tokenizers.__version__, len(lines),
                                                           out))


if __name__ == "__main__":
    main()
