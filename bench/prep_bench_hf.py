#!/usr/bin/env python3
"""Baseline for bench/prep_bench: Hugging Face `tokenizers` encode_batch on the same documents.

Reads the file list prep_bench wrote, decodes each file as UTF-8 (errors="replace", what deepen
does with invalid bytes), and times Tokenizer.encode_batch over all of them, best of --repeat runs,
with RAYON_NUM_THREADS set by the caller to the same thread count. Prints one JSON line.
"""
import argparse
import json
import time

from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--files", required=True, help="file with one path per line")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tok = Tokenizer.from_file(args.tokenizer)
    paths = [p for p in open(args.files, encoding="utf-8").read().split("\n") if p]
    raw = [open(p, "rb").read() for p in paths]
    docs = [b.decode("utf-8", "replace") for b in raw]
    best = cpu_best = float("inf")
    tokens = 0
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()  # process_time counts every thread
        enc = tok.encode_batch(docs, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
        cpu_best = min(cpu_best, time.process_time() - c0)
        tokens = sum(len(e.ids) for e in enc)
    print(json.dumps({"seconds": best, "cpu_seconds": cpu_best, "tokens": tokens,
                      "bytes": sum(len(b) for b in raw), "docs": len(docs)}))


if __name__ == "__main__":
    main()
