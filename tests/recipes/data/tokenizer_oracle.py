"""The oracle of tokenizer_test.cpp: the PyPI `tokenizers` library, on the
same tokenizer.json files strata reads.

  tokenizer_oracle.py corpus OUT SIZE SEED   write a UTF-8 corpus of at least SIZE bytes
  tokenizer_oracle.py encode TOKENIZER CORPUS OUTDIR
      OUTDIR/lines.txt    the ids of each line (without its "\\n"), no special tokens added
      OUTDIR/whole.txt    the ids of the whole file as one text
      OUTDIR/decoded.txt  each line's ids decoded back
      prints "roundtrip=<lines whose decoded text is the line>/<lines>"
  tokenizer_oracle.py encode-tiktoken TOKENIZER_MODEL CORPUS OUTDIR
      the same through the PyPI tiktoken library, on a tiktoken BPE file (Llama 3's
      original tokenizer.model) with Llama 3's split pattern and special tokens, as
      Meta's llama3/tokenizer.py builds its tiktoken.Encoding
"""
import os
import random
import sys

# What the corpus mixes: English, code with tabs and runs of spaces, \r\n,
# digits, CJK, Arabic, Devanagari, emoji with modifiers and ZWJ sequences,
# combining marks (decomposed and precomposed), invalid-looking sequences
# (mojibake, U+FFFD, noncharacters, zero-width), Unicode spaces (NEL, NBSP,
# ideographic), and the special tokens of the families, written in the text.
FRAGMENTS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "It's a test; we'll see what they've done, I'm sure. DON'T SHOUT'S",
    "def f(x):\n\tif x  >  3:\n\t\treturn   x**2  # comment\n    else:\t\treturn None",
    "line with CRLF\r\nanother\r\n",
    "numbers 1234567 3.14159 0xFF 1,000,000 2024-12-07 ١٢٣ ४५६",
    "中文文本测试，你好世界。日本語のテキスト。한국어 텍스트",
    "مرحبا بالعالم، هذا نص عربي",
    "नमस्ते दुनिया, यह हिंदी पाठ है",
    "emoji 👍🏽 👨‍👩‍👧‍👦 🇺🇸 ❤️ 🙂",
    "combining e\u0301 a\u0308 n\u0303 \u00c5 A\u030a \u212b",
    "mojibake Ã© â€™ \ufffd \uffff zero\u200bwidth \ufeffbom",
    "tabs\tand  multiple   spaces    here",
    "   leading and trailing   ",
    "\n\n\nnewlines\n\n",
    "NEL\u0085here nbsp\u00a0x ideographic\u3000space",
    "<|endoftext|> <s> </s> <unk> [INST] hi [/INST] <|im_start|>user\nhi<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|> <|user|> <|end|> <|assistant|>",
    "URL https://example.com/path?q=1&r=2#frag email a.b@c.de",
    "ALL CAPS SHOUTING and MiXeD cAsE \u017f \u212a",
    "\u00dcn\u00efc\u00f6d\u00e9 \u00e4ccents stra\u00dfe \u0152uvre",
    "    indented code\n        more",
    "a" * 50,
    "\U0001F4A9" * 5,
    " ' 's 'S 'RE 'Ve",
    "\u0394\u03b5\u03bb\u03c4\u03b1 \u041f\u0440\u0438\u0432\u0435\u0442 \u05e9\u05dc\u05d5\u05dd \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
]


def corpus(out, size, seed):
    rng = random.Random(seed)
    written = 0
    with open(out, "w", encoding="utf-8", newline="") as f:
        while written < size:
            line = " ".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 4))) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))


def encode(tokenizer, path, outdir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    text = open(path, encoding="utf-8", newline="").read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    encoded = [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]
    decoded = tok.decode_batch(encoded, skip_special_tokens=False)
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "lines.txt"), "w", encoding="utf-8", newline="") as f:
        f.writelines(" ".join(map(str, ids)) + "\n" for ids in encoded)
    with open(os.path.join(outdir, "whole.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(" ".join(map(str, tok.encode(text, add_special_tokens=False).ids)) + "\n")
    with open(os.path.join(outdir, "decoded.txt"), "w", encoding="utf-8", newline="") as f:
        f.writelines(d + "\n" for d in decoded)
    same = sum(d == line for d, line in zip(decoded, lines))
    print(f"roundtrip={same}/{len(lines)}")


LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class TiktokenLlama3:
    """tiktoken's Encoding with the names tokenizers' Tokenizer has here."""

    def __init__(self, path):
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        ranks = load_tiktoken_bpe(path)
        names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                 "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                 "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                 "<|python_tag|>", "<|image|>"]
        names += [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(names))]
        self.enc = tiktoken.Encoding(name="llama3", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks,
                                     special_tokens={n: len(ranks) + i for i, n in enumerate(names)})

    def ids(self, text):
        # allowed_special="all": special tokens written in the text are matched, as tokenizers does.
        return self.enc.encode(text, allowed_special="all")

    def decode(self, ids):
        return self.enc.decode(ids)  # invalid UTF-8 as U+FFFD, as tokenizers' ByteLevel decoder


def encode_tiktoken(model, path, outdir):
    tok = TiktokenLlama3(model)
    text = open(path, encoding="utf-8", newline="").read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    encoded = [tok.ids(line) for line in lines]
    decoded = [tok.decode(ids) for ids in encoded]
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "lines.txt"), "w", encoding="utf-8", newline="") as f:
        f.writelines(" ".join(map(str, ids)) + "\n" for ids in encoded)
    with open(os.path.join(outdir, "whole.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(" ".join(map(str, tok.ids(text))) + "\n")
    with open(os.path.join(outdir, "decoded.txt"), "w", encoding="utf-8", newline="") as f:
        f.writelines(d + "\n" for d in decoded)
    same = sum(d == line for d, line in zip(decoded, lines))
    print(f"roundtrip={same}/{len(lines)}")


if __name__ == "__main__":
    if sys.argv[1] == "encode-tiktoken":
        encode_tiktoken(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "corpus":
        corpus(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        encode(sys.argv[2], sys.argv[3], sys.argv[4])
