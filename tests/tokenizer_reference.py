#!/usr/bin/env python3
"""Reference token ids for the Qwen3 tokenizer test: Hugging Face `tokenizers` on a >= 10 MB corpus.

The corpus is built here (one source of truth) from Debian packages installed by scripts/setup.sh
(python3.11-doc's reST sources, fortunes, common-licenses) plus generated edge cases: CJK, emoji,
whitespace runs, numbers, mixed-case contractions, special tokens, NFC cases, a sweep over every
Unicode code point, random mixtures, and invalid UTF-8. Documents are raw bytes; the reference ids
are those of `Tokenizer.encode(doc.decode("utf-8", "replace"))`, which is what deepen documents for
invalid UTF-8.

Output (little-endian):  b"DPTKREF1", u32 docs, then per document
  u32 name_len, name, u64 text_len, text, u32 n_ids, i32 ids[n_ids], u64 decoded_len, decoded
where decoded = Tokenizer.decode(ids, skip_special_tokens=False) in UTF-8.
"""
import argparse
import glob
import os
import random
import struct
import sys

from tokenizers import Tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|fim_prefix|>",
            "<tool_call>", "<|vision_pad|>"]


def debian_docs():
    """(name, bytes) of every text file the packages provide, in sorted path order."""
    docs = []
    roots = [
        ("python3.11-doc", sorted(glob.glob("/usr/share/doc/python3.11/html/_sources/**/*.txt", recursive=True))),
        ("fortunes", sorted(p for p in glob.glob("/usr/share/games/fortunes/*")
                            if not p.endswith(".dat") and not os.path.islink(p) and os.path.isfile(p))),
        ("common-licenses", sorted(p for p in glob.glob("/usr/share/common-licenses/*")
                                   if not os.path.islink(p) and os.path.isfile(p))),
    ]
    for package, paths in roots:
        if not paths:
            sys.exit(f"tokenizer_reference: no files from Debian package {package}; run scripts/setup.sh")
        for p in paths:
            with open(p, "rb") as f:
                docs.append((p, f.read()))
    return docs


def edge_cases():
    cases = {
        "empty": "",
        "one space": " ",
        "spaces at end": "word   ",
        "whitespace runs": "a  b   c    d\t\te \t f\n\ng \n \n h\r\n\r\ni  \n  j\u00a0\u00a0k\u3000\u3000l\u2028m\u2029n"
                           "\x0b\x0co\x85p\x1c\x1dq  \t\n\r  \n",
        "long space run": "x" + " " * 5000 + "y" + "\t" * 300 + "\n" * 200 + "z" + " \n" * 100,
        "long punctuation run": "=" * 3000 + "\n" + "-" * 999 + "!?" * 500 + "." * 257,
        "numbers": "0 1 12 123 1234 12345678901234567890 3.14159 -2.5e-10 1,000,000 $99.99 50% 0x1F "
                   "١٢٣ ٤٥ ０１２３ ²³ ½ ¼ Ⅻ ⅷ 〇 一二三 ① ⑽ 𝟘𝟙",
        "contractions": "I'm you're we've they'll he'd it's don't I'M YOU'RE WE'VE THEY'LL HE'D IT'S "
                        "DON'T 'S 'T 'RE 'VE 'M 'LL 'D 'Re 'rE 'Ll 'lL 'Ve 'vE 'sure 'tis 'x 'ſ 'ſx "
                        "'K ''s '''ll '' ' 's'd'm ’s rock'n'roll O'Neil l'homme",
        "specials": "<|endoftext|>hello<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>"
                    "<|endoftext|><|endoftext|> <|endoftext|> x<|endoftext|>y <|endoftext| <|im_start "
                    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|><|vision_pad|><tool_call></tool_call>"
                    "<|im_end|>'s<|im_end|>123<|im_end|>   <|im_end|>\n\n",
        "nfc": "e\u0301 a\u0308 A\u030a \u212b \u2126 \uf900 \u0344 \u0958 a\u0323\u0307 a\u0307\u0323 "
               "\u1100\u1161\u11a8 \uac00\u11a8 \u0915\u093c \u30ab\u3099 \u304b\u3099 \u0b47\u0b3e "
               "\u1e9b\u0323 Cafe\u0301 \u00c5ngstr\u00f6m \u0041\u030a\u0301 \u0301start \u05d0\u05b7\u05bc",
        "cjk": "日本語のテキストです。東京都は日本の首都です。中文文本：北京是中国的首都，上海是最大的城市。"
               "한국어 텍스트: 서울은 한국의 수도입니다. 繁體中文「測試」、『引號』…… ｶﾀｶﾅ ＡＢＣ",
        "emoji": "😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇩🇪🇯🇵 1️⃣ #️⃣ ❤️ ☺︎ 🏳️‍🌈 🧑🏿‍🚀 ok👌ok 🙂🙂🙂 ",
        "scripts": "Ελληνικά κείμενο. Русский текст, ещё. עברית טקסט. العربية نص. हिन्दी पाठ। ไทย ข้อความ "
                   "ქართული Հայերեն ᚠᚢᚦ 𐌰𐌱 ꦗꦮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ﷺ ﬁﬂ ǅ",
        "code": "def f(x):\n\treturn x**2  # square\n\nif __name__ == '__main__':\n    print(f(3))\r\n"
                "int main(){return 0;}\n    \n  }\n\t\t}\n// end\n/* c */ a->b && c || !d; x+=1; y<<=2;",
        "controls": "a\x00b\x01c\x07d\x1be\x7ff\u200bg\u200dh\ufeffi\u00adj\ue000k\U000f0000l\uffffm",
    }
    docs = [(f"edge: {k}", v.encode("utf-8")) for k, v in cases.items()]
    invalid = {
        "truncated 3-byte": b"abc\xe2\x82",
        "bad continuation": b"\xf0\x80 x \xf0\x9f\x98 y \xe2\x28\xa1 z",
        "surrogate": b"\xed\xa0\x80\xed\xbf\xbf ok",
        "overlong": b"\xc0\xaf \xe0\x80\xaf \xc1\xbf",
        "lone bytes": bytes(range(0x80, 0x100)) + b" text \xff\xfe",
        "beyond U+10FFFF": b"\xf4\x90\x80\x80 \xf5\x80\x80\x80 \xf8\x88\x80\x80\x80",
        "latin-1 text": "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00bfqu\u00e9?".encode("latin-1"),
        "invalid next to special": b"\xe2<|endoftext|>\xe2\x82<|im_end|>\x80",
    }
    docs += [(f"invalid utf-8: {k}", v) for k, v in invalid.items()]
    return docs


def codepoint_sweep():
    """Every code point of planes 0-3 and 14 (planes 4-13 are unassigned, 15-16 private use) in the
    context "a" c c "1'": letters join the "a", digits stand alone, punctuation runs swallow both,
    whitespace splits, NFC changes show: one document per 4096 code points."""
    docs = []
    step = 4096
    for start in list(range(0, 0x40000, step)) + list(range(0xE0000, 0xE1000, step)):
        parts = []
        for cp in range(start, start + step):
            if 0xD800 <= cp <= 0xDFFF:
                continue
            c = chr(cp)
            parts.append(f"a{c}{c}1'\n")
        docs.append((f"sweep U+{start:04X}", "".join(parts).encode("utf-8")))
    return docs


def random_mix(seed, count, length):
    rng = random.Random(seed)
    alphabet = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 3 +
                list("     \t\n\n\r'\"'.,;:!?-_()[]{}<>|/\\@#$%^&*+=~`") * 2 +
                ["'s", "'T", "'re", "'LL", "\u0301", "\u0308", "\u00e9", "\u00c5", "\u212b", "\u00a0", "\u3000",
                 "\u2028", "\u0085", "日", "本", "語", "。", "、", "한", "글", "😀", "👍🏽", "‍", "️", "½", "²",
                 "١", "ſ", "\uf900", "\u1100", "\u1161", "\u11a8"] + SPECIALS + ["<|", "|>", "<|endoftext"])
    docs = []
    for k in range(count):
        n = rng.randint(1, length)
        docs.append((f"random {seed}/{k}", "".join(rng.choice(alphabet) for _ in range(n)).encode("utf-8")))
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True, help="path to tokenizer.json")
    ap.add_argument("--out", required=True, help="output file")
    args = ap.parse_args()

    tok = Tokenizer.from_file(args.tokenizer)
    docs = debian_docs() + edge_cases() + codepoint_sweep() + random_mix(7, 3000, 400)
    texts = [d.decode("utf-8", "replace") for _, d in docs]
    encodings = tok.encode_batch(texts, add_special_tokens=True)
    ids = [e.ids for e in encodings]
    decoded = tok.decode_batch(ids, skip_special_tokens=False)
    total = sum(len(d) for _, d in docs)
    with open(args.out + ".tmp", "wb") as f:
        f.write(b"DPTKREF1")
        f.write(struct.pack("<I", len(docs)))
        for (name, data), doc_ids, dec in zip(docs, ids, decoded):
            nb = name.encode("utf-8")
            db = dec.encode("utf-8")
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<Q", len(data)) + data)
            f.write(struct.pack("<I", len(doc_ids)) + struct.pack(f"<{len(doc_ids)}i", *doc_ids))
            f.write(struct.pack("<Q", len(db)) + db)
    os.replace(args.out + ".tmp", args.out)
    print(f"tokenizer_reference: {len(docs)} documents, {total / 1e6:.1f} MB, "
          f"{sum(len(i) for i in ids)} tokens -> {args.out}")


if __name__ == "__main__":
    main()
