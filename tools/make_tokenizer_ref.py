#!/usr/bin/env python3
"""Writes tests/data/tokenizer/: byte-level BPE tokenizers trained by Hugging Face `tokenizers`
and the ids `tokenizers` itself gives a test corpus, for tests/core/test_tokenizer.c.

    python3 -m venv /tmp/peer-venv && /tmp/peer-venv/bin/pip install tokenizers
    /tmp/peer-venv/bin/python tools/make_tokenizer_ref.py tests/data/tokenizer

What it writes (the tests never need Python):

  tokenizer.json      ByteLevelBPETokenizer trained to a vocabulary of 3000 (special token
                      <|endoftext|>) on text that is not the corpus: a few modules of Python's
                      standard library and the strings of the C library's locale files (month,
                      day, country and language names in every script), Tokenizer.save
  gpt2/vocab.json,    the same model saved as GPT-2's original pair (save_model)
  gpt2/merges.txt
  corpus.txt          one case per line: the text (escaped: \\\\ \\n \\r \\t, \\xNN for other
                      control bytes; everything else raw UTF-8), a tab, then the ids
                      Tokenizer.from_file("tokenizer.json").encode(text).ids. The corpus:
                      English prose, C and Python code, runs of white space, emoji, Korean,
                      Chinese, Japanese, Arabic, Hebrew, Devanagari, Thai, Cyrillic, Greek,
                      combining marks, digits of other scripts, letters new in Unicode 15 and 16,
                      unassigned and private-use code points, <|endoftext|> in and around text,
                      long words, and 150 seeded random lines from a pool of such characters.
                      The ids of ByteLevelBPETokenizer("gpt2/vocab.json", "gpt2/merges.txt")
                      with <|endoftext|> added as a special token (as transformers'
                      GPT2TokenizerFast does) are checked here to be the same.
  variants/*.json     small tokenizers (vocabulary 500, trained on the same text; 1400 for subword) with the
                      settings GPT-2's does not use: prefix_space (add_prefix_space, added
                      tokens with lstrip, rstrip, normalized and one inside another), no_regex
                      (use_regex false), legacy_merges (merges as "a b" strings),
                      ignore_merges (with words of the corpus added to the vocabulary, which
                      BPE would split), fallback (three byte characters taken out of the
                      vocabulary and their merges with them; byte_fallback with "<0xC4>" and
                      "<0x81>", unk_token "<unk>", fuse_unk) and subword (trained with
                      continuing_subword_prefix "##" and end_of_word_suffix "</w>")
  variants.txt        per variant, per corpus line (every third line, to stay small): the
                      variant, the line's number in corpus.txt (from 1), a tab, the ids
"""
import glob
import json
import os
import random
import re
import sys

import tokenizers
from tokenizers import ByteLevelBPETokenizer, Tokenizer, decoders, models, pre_tokenizers, trainers

SEED = 20240914


def training_text():
    """Text the tokenizers are trained on: not the corpus."""
    parts = []
    lib = sorted(glob.glob("/usr/lib/python3*/"))[0]
    for name in ("textwrap.py", "string.py", "shlex.py", "fnmatch.py", "json/decoder.py",
                 "json/encoder.py", "csv.py", "heapq.py", "bisect.py", "colorsys.py"):
        path = os.path.join(lib, name)
        if os.path.exists(path):
            parts.append(open(path, encoding="utf-8").read())
    strings = []
    for path in sorted(glob.glob("/usr/share/i18n/locales/*_*")):
        text = open(path, encoding="latin-1").read()
        for s in re.findall(r'"([^"\n]*)"', text):
            s = re.sub(r"<U([0-9A-Fa-f]{4,8})>", lambda m: chr(int(m.group(1), 16)), s)
            if any(ord(c) > 0x7F for c in s) and not any(0xD800 <= ord(c) <= 0xDFFF for c in s):
                strings.append(s.replace(";", " "))
    parts.append("\n".join(strings))
    return parts


def escape(s):
    out = []
    for ch in s:
        o = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif o < 0x20 or o == 0x7F:
            out.append("\\x%02x" % o)
        else:
            out.append(ch)
    return "".join(out)


def corpus():
    lines = [
        # English prose, contractions of every kind and case
        "The quick brown fox jumps over the lazy dog.",
        "It's a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife.",
        "I don't think they're coming; we'll see, won't we? She'd said you've MET them.",
        "DON'T SHOUT. I'M HERE. You'Re 'Right' and 'sure' -- 'll 've 're 'm 'd 's 't",
        "''s ''t x's y'S 'S 'LL rock'n'roll o'clock ma'am",
        "Numbers: 3.14159, 1,000,000, 2024-09-14, 0x1F, 1e-9, #42, $19.99, 50%!",
        "Mr. Smith (aged 42) wrote: \"Hello, world!\" -- and left...",
        # code
        "int main(int argc, char **argv) {\n    return argc > 1 ? atoi(argv[1]) : 0;\n}",
        "def f(x, *args, **kwargs):\n\treturn [y ** 2 for y in range(x) if y % 3 == 0]",
        "    if (p->pos + 6 > p->n || hex4(p->s + p->pos + 2, &cp)) {",
        "#include <stdio.h>\r\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\r\n",
        "x=1;y=2;z=x+y//3;print(f\"{x!r:>10}\")  # comment   ",
        "SELECT name, COUNT(*) FROM users WHERE id IN (1, 2, 3) GROUP BY name;",
        "<div class=\"main\"><p>Text &amp; more</p></div>",
        "__init__ __name__ self._private_value snake_case_name CamelCaseName kebab-case-name",
        # white space
        "a  b   c    d",
        "trailing spaces   ",
        "   leading spaces",
        "\t\ttabs\tand\t\tmore",
        "line one\nline two\n\nline four\n\n\n",
        "  \n  \n\t\n",
        " ",
        "  ",
        "\n",
        "\r\n\r\n",
        "a \u00a0b\u00a0\u00a0c \u3000d\u3000\u3000e",
        "x\u2028y\u2029z\u0085w\u000bv\u000cu",
        "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u1680end",
        "not white: \u200b\u200c\u200d\u2060\ufeff\u180e.",
        "a \u0001 b \u001f c \u007f d \u0080 e \u009f",
        "space before punctuation ! ? . , and digits 1 22 333",
        "  !!  ??  ..  ,,  ",
        # emoji
        "Great job! 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ 1️⃣ 🏳️‍🌈",
        "😀😃😄😁😆😅🤣😂🙂🙃",
        "emoji😀inside😀words",
        # scripts
        "안녕하세요, 세계! 한국어 텍스트입니다.",
        "你好，世界。这是中文文本，包含标点符号！",
        "こんにちは世界、カタカナとひらがなと漢字。",
        "مرحبا بالعالم! هذا نص عربي.",
        "שלום עולם, זהו טקסט בעברית.",
        "नमस्ते दुनिया! यह हिंदी पाठ है।",
        "สวัสดีชาวโลก นี่คือข้อความภาษาไทย",
        "Привет, мир! Это русский текст.",
        "Γειά σου Κόσμε! Αυτό είναι ελληνικό κείμενο.",
        "Ελληνικά, Русский, 日本語, 한국어, العربية, हिन्दी mixed in one line",
        "ᚠᛇᚻ᛫ᛒᛦᚦ ᠮᠣᠩᠭᠣᠯ ሰላም ኢትዮጵያ ᏣᎳᎩ",
        # combining marks
        "cafe\u0301 vs caf\u00e9, n\u0303 vs \u00f1, A\u030a vs \u00c5",
        "Z\u0334\u0321\u0327a\u0337l\u0338g\u0335o\u0336 t\u0337e\u0338x\u0335t",
        "\u0301\u0302 leading combining marks",
        # digits of other scripts and other numbers
        "Arabic-Indic ٠١٢٣٤٥٦٧٨٩, Devanagari ०१२३४५६७८९, Thai ๐๑๒๓",
        "fullwidth ０１２３４５６７８９ and letters ＡＢＣ",
        "Roman Ⅰ Ⅱ Ⅻ ⅽ, fractions ½ ¼ ¾, super² sub₂, circled ①②③",
        "math 𝟎𝟏𝟐 𝐀𝐁𝐂 𝔸𝔹ℂ, ideographic 〇〡〢",
        "12abc34 abc12def 1.2.3 x1y2z3",
        # Unicode 15 and 16
        "Kawi \U00011f04\U00011f05\U00011f06 and digits \U00011f50\U00011f51",
        "Kaktovik \U0001d2c0\U0001d2c1 Cyrillic modifier \U0001e030\U0001e031",
        "CJK extension I \U0002ebf0\U0002ebf1, Todhri \U000105c0\U000105c1",
        "Garay \U00010d50\U00010d51, Kirat Rai digits \U00016d70\U00016d71, outlined \U0001ccf0",
        "Unicode 17 is not letters yet: \U00010940\U00010941 \U000323b0",
        # unassigned, private use, noncharacters
        "\ue000\ue001 \U000f0000 \U0010fffd \ufffe \uffff \u0378 \U0010ffff",
        # the special token
        "Hello<|endoftext|>World",
        "<|endoftext|><|endoftext|>",
        " <|endoftext|> ",
        "<|endoftext|",
        "<|endoftext|>>",
        "text\n<|endoftext|>\nmore text",
        # added tokens of the prefix_space variant (plain text to the others)
        "Fill the [MASK] here, and  [MASK]x [MASK]  [MASK][MASK]",
        "a<tab>   b<tab>\n\tc <tab>",
        "<b>x<b>y<b> <b>xx <b<b>x",
        "singing ring king   ing   thing ING",
        "<tab>\t\tx <tab> \t\t y\t\t\tz",
        "<b>>x <b>> <b>>> <b>",
        # control bytes the fallback variant lacks
        "a\x01b\x05\x05c\n\nd\x01\x01\n",
        "x\x05\x01\x05y \x01\x05\x01",
        # long words
        "a" * 300,
        "x" + "ab" * 200 + "y",
        "supercalifragilisticexpialidocious" * 5,
        "_" * 100 + "=" * 100,
        "1234567890" * 20,
        "long  " * 40,
    ]
    rng = random.Random(SEED)
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 3 +
            list(" " * 30) + list("\t\n\r\u000b\u000c\u00a0\u3000\u2028\u0085") +
            list("'''.,;:!?-_()[]{}<>\"#$%&*+/=@\\^`|~") + list("stremlvd" * 3) +
            list("안녕세계한국어你好世界中文こんにカタ漢مرحبשלוםनमस्तेสวัสดีПриветΓειά") +
            list("\u0301\u0308\u0327\u093f\u0e31") + list("٣४５Ⅻ½²") +
            ["👍", "🏽", "\u200d", "👨", "❤", "\ufe0f", "<|endoftext|>", "\U00011f04",
             "\U00016d70", "\ue000"])
    for _ in range(150):
        n = rng.randint(1, 80)
        lines.append("".join(rng.choice(pool) for _ in range(n)))
    return lines


def train(parts, vocab_size, **kw):
    tok = ByteLevelBPETokenizer(**kw)
    tok.train_from_iterator(parts, vocab_size=vocab_size, min_frequency=2,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    return tok


def ids(tok, text):
    return tok.encode(text).ids


def variant(base_json, edit):
    j = json.loads(base_json)
    edit(j)
    s = json.dumps(j, ensure_ascii=False, separators=(",", ":"))
    return s, Tokenizer.from_str(s)


def edit_prefix_space(j):
    j["pre_tokenizer"]["add_prefix_space"] = True
    n = len(j["model"]["vocab"])
    j["added_tokens"] += [
        {"id": n, "content": "[MASK]", "single_word": False, "lstrip": True, "rstrip": False,
         "normalized": False, "special": True},
        {"id": n + 1, "content": "<tab>", "single_word": False, "lstrip": False, "rstrip": True,
         "normalized": True, "special": False},
        {"id": n + 2, "content": "<b>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False},
        {"id": n + 3, "content": "<b>x", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False},
        {"id": n + 4, "content": "ing", "single_word": False, "lstrip": True, "rstrip": True,
         "normalized": True, "special": False},
        {"id": n + 5, "content": "\t\t", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False},
        {"id": n + 6, "content": "<b>>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False},
    ]


def edit_no_regex(j):
    j["pre_tokenizer"]["use_regex"] = False


def edit_legacy(j):
    j["model"]["merges"] = [a + " " + b for a, b in j["model"]["merges"]]


def edit_ignore_merges(j):
    """Words of the corpus that BPE splits become tokens of their own, reachable only through
    ignore_merges."""
    j["model"]["ignore_merges"] = True
    tok = Tokenizer.from_str(json.dumps(j))
    vocab = j["model"]["vocab"]
    top = max(vocab.values())
    for line in corpus()[:80]:
        for piece, _ in tok.pre_tokenizer.pre_tokenize_str(line):
            if piece not in vocab and len(tok.model.tokenize(piece)) > 1:
                top += 1
                vocab[piece] = top


def edit_fallback(j):
    m = j["model"]
    gone = {"ā", "ą", "Ċ"}  # bytes 0x01, 0x05 (controls) and 0x0A (newline)
    m["vocab"] = {t: i for t, i in m["vocab"].items() if not (set(t) & gone)}
    m["merges"] = [[a, b] for a, b in m["merges"] if not (set(a + b) & gone)]
    top = max(m["vocab"].values())
    for k, t in enumerate(["<0xC4>", "<0x81>", "<unk>"]):
        m["vocab"][t] = top + 1 + k
    m["byte_fallback"] = True
    m["unk_token"] = "<unk>"
    m["fuse_unk"] = True


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/tokenizer"
    os.makedirs(os.path.join(out, "gpt2"), exist_ok=True)
    os.makedirs(os.path.join(out, "variants"), exist_ok=True)
    parts = training_text()
    lines = corpus()
    assert not any(line in "\n".join(parts) for line in lines[:60] if len(line) > 20)

    main_tok = train(parts, 3000)
    main_tok.save(os.path.join(out, "tokenizer.json"), pretty=True)
    main_tok.save_model(os.path.join(out, "gpt2"))
    ref = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    pair = ByteLevelBPETokenizer(os.path.join(out, "gpt2", "vocab.json"),
                                 os.path.join(out, "gpt2", "merges.txt"))
    pair.add_special_tokens(["<|endoftext|>"])
    with open(os.path.join(out, "corpus.txt"), "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            a = ids(ref, line)
            assert a == pair.encode(line).ids, line
            assert ref.decode(a, skip_special_tokens=False) == line, line
            f.write(escape(line) + "\t" + " ".join(map(str, a)) + "\n")

    small = train(parts, 500)
    small_json = small._tokenizer.to_str()
    sub = Tokenizer(models.BPE(continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    sub.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    sub.decoder = decoders.ByteLevel()
    sub.train_from_iterator(parts, trainers.BpeTrainer(
        vocab_size=1400, min_frequency=2, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), continuing_subword_prefix="##",
        end_of_word_suffix="</w>", show_progress=False))
    variants = [
        ("prefix_space", variant(small_json, edit_prefix_space)),
        ("no_regex", variant(small_json, edit_no_regex)),
        ("legacy_merges", variant(small_json, edit_legacy)),
        ("ignore_merges", variant(small_json, edit_ignore_merges)),
        ("fallback", variant(small_json, edit_fallback)),
        ("subword", variant(sub.to_str(), lambda j: None)),
    ]
    with open(os.path.join(out, "variants.txt"), "w", encoding="utf-8", newline="\n") as f:
        for name, (text, tok) in variants:
            with open(os.path.join(out, "variants", name + ".json"), "w", encoding="utf-8") as g:
                g.write(tok.to_str())  # as tokenizers saves it: the ids it assigned
            for i, line in enumerate(lines):
                if i % 3 == 0 or any(t in line for t in ("<b>", "[MASK]", "<tab>", "ing", "\x01", "\t\t")):
                    f.write("%s %d\t%s\n" % (name, i + 1, " ".join(map(str, ids(tok, line)))))
    print("tokenizers %s: %d corpus lines, %d variants written to %s" %
          (tokenizers.__version__, len(lines), len(variants), out))


if __name__ == "__main__":
    main()
