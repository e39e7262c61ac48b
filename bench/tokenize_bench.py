"""Encoding throughput, side by side: strata-tokenize, the PyPI `tokenizers`
library and tiktoken, on the same corpus, the same lines and the same thread
counts, each measurement a fresh process, the systems interleaved and repeated
(docs/data.md has a run's table).

  python bench/tokenize_bench.py --tokenize build/bin/strata-tokenize [--repeats 3] [--threads 1,2]

Each system encodes every line of the corpus (4 MB of transformers' own Python
files by default, or --corpus mixed: tokenizer_oracle.py's mix of scripts)
without special tokens added, special tokens in the text matched; the time is
the encoding alone (strata-tokenize --report-time; the Python libraries timed
around encode_batch). tiktoken runs where the tokenizer is a tiktoken-style
byte-level BPE whose merge ranks are its ids (GPT-2, Llama 3, Qwen): its ids are
checked equal to the tokenizers library's on the first lines before it is timed.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
sys.path.insert(0, os.path.join(ROOT, "tests", "recipes", "data"))
import tokenizer_oracle  # noqa: E402

LIB_SCRIPT = r"""
import json, sys, time
system, path, corpus, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lines = open(corpus, encoding="utf-8", newline="").read().split("\n")[:-1]
if system == "tokenizers":
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path)
    start = time.perf_counter()
    n = sum(len(e.ids) for e in tok.encode_batch(lines, add_special_tokens=False))
else:
    import tiktoken
    from tokenizers import Tokenizer
    hf = json.load(open(path, encoding="utf-8"))
    if "ByteLevel" not in json.dumps(hf["pre_tokenizer"]):
        print("seconds=nan tokens=0"); sys.exit(0)  # a SentencePiece-style BPE: no tiktoken form
    tok = Tokenizer.from_file(path)
    # GPT-2's byte <-> character map (its bytes_to_unicode).
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, extra = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + extra); extra += 1
    to_byte = {chr(c): b for b, c in zip(bs, cs)}
    special = {t["content"]: t["id"] for t in hf["added_tokens"]}
    ranks = {bytes(to_byte[ch] for ch in token): i for token, i in hf["model"]["vocab"].items() if token not in special}
    pre = hf["pre_tokenizer"]
    pattern = (pre["pretokenizers"][0]["pattern"]["Regex"] if pre["type"] == "Sequence" else
               r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
    enc = tiktoken.Encoding("bench", pat_str=pattern, mergeable_ranks=ranks, special_tokens=special)
    check = lines[:2000]
    same = [e.ids for e in tok.encode_batch(check, add_special_tokens=False)] == enc.encode_batch(check, allowed_special="all")
    if not same:
        print("seconds=nan tokens=0"); sys.exit(0)
    start = time.perf_counter()
    n = sum(len(ids) for ids in enc.encode_batch(lines, num_threads=threads, allowed_special="all"))
print(f"seconds={time.perf_counter() - start} tokens={n}")
"""


def measure(system, tokenizer, corpus, threads, tool):
    path = os.path.join(FIXTURES, tokenizer, "tokenizer.json")
    if system == "strata":
        run = subprocess.run([tool, "--tokenizer", path, "--threads", str(threads), "--report-time", corpus],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
        return float(run.stderr.split(" in ")[1].split(" s")[0])
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    run = subprocess.run([sys.executable, "-c", LIB_SCRIPT, system, path, corpus, str(threads)],
                         env=env, capture_output=True, text=True, check=True)
    return float(run.stdout.split("seconds=")[1].split()[0])


def source_corpus(out, size):
    """transformers' own Python files (code, English docstrings and comments),
    sorted by path, up to `size` bytes: text whose words repeat as real text's do."""
    import transformers

    root = os.path.dirname(transformers.__file__)
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".py"))
    written = 0
    with open(out, "w", encoding="utf-8", newline="") as f:
        for path in files:
            if written >= size:
                break
            text = open(path, encoding="utf-8", errors="replace").read()
            f.write(text)
            written += len(text.encode("utf-8"))


def cell(values, size):
    rates = [size / s / 1e6 for s in values if s == s]
    if not rates:
        return "–"
    return f"{statistics.median(rates):.2f} ({min(rates):.2f}–{max(rates):.2f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenize", required=True)
    ap.add_argument("--tokenizers", default="gpt2,llama3,qwen3,mistral")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", type=int, default=4_000_000)
    ap.add_argument("--corpus", default="source", choices=["source", "mixed"],
                    help="source: transformers' Python files; mixed: the parity test's mix of scripts (repetitive)")
    args = ap.parse_args()
    names, threads = args.tokenizers.split(","), [int(t) for t in args.threads.split(",")]
    systems = ["strata", "tokenizers", "tiktoken"]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        if args.corpus == "mixed":
            tokenizer_oracle.corpus(corpus, args.size, 7)
        else:
            source_corpus(corpus, args.size)
        size = os.path.getsize(corpus)
        times = {}
        for r in range(args.repeats):
            for name in names:
                for t in threads:
                    order = systems[r % 3:] + systems[:r % 3]  # who goes first rotates
                    for system in order:
                        times.setdefault((name, t, system), []).append(measure(system, name, corpus, t, args.tokenize))
                        print(f"repeat {r + 1}: {name} x{t} {system} {times[(name, t, system)][-1]:.3f} s",
                              file=sys.stderr)
    print(f"\nEncoding {size / 1e6:.1f} MB ({args.corpus}) line by line, MB/s, median (min–max) of {args.repeats} interleaved repeats\n")
    print("| tokenizer | threads | strata | tokenizers | tiktoken | strata ÷ tokenizers |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        for t in threads:
            s, h = times[(name, t, "strata")], times[(name, t, "tokenizers")]
            ratio = statistics.median(h) / statistics.median(s)
            print(f"| {name} | {t} | {cell(s, size)} | {cell(h, size)} | {cell(times[(name, t, 'tiktoken')], size)} "
                  f"| {ratio:.2f}× |")


if __name__ == "__main__":
    main()
