#!/usr/bin/env python3
"""`deepen prep` on FineWeb-Edu-shaped parquet vs Hugging Face `tokenizers` reading the same parquet
through pyarrow, in one run: MB/s, tokens/s, CPU seconds, peak RSS and the ratio.

  python3 bench/prep_parquet_bench.py --deepen build/deepen [--mb 220] [--threads 2] [--work DIR]

Data (made once in --work, reused while the parameters match): python3.11-doc's reST sources
(/usr/share/doc/python3.11/html/_sources, 11 MB of English prose and code) cut into documents at
paragraph boundaries (1-8 KB each, FineWeb-Edu's range), shuffled, and repeated with new cuts and
a new order until the parquet files reach --mb MB; FineWeb-Edu's schema (text, id, dump, url, date,
file_path, language, language_score, token_count, score, int_score), snappy, --rows-per-group rows
per row group, --file-mb MB per file.

deepen: `deepen prep` on the folder (Qwen3 BPE, --threads workers, progress off), as a user runs it:
listing, parquet reading, tokenizing, the split and the shard writing all count.
Baseline: `tokenizers` Tokenizer.from_file(tokenizer.json).encode_batch over pyarrow's
ParquetFile.iter_batches(columns=["text"]) of the same files, RAYON_NUM_THREADS=--threads, tokens
summed (plus one EOS per document, as deepen counts it). Both run as child processes, one after
the other, each timed alone (wall and CPU seconds from wait4, peak RSS as VmHWM). Token counts must agree.

With --tokenizer bytes and --no-baseline it measures prep's memory on a large file alone (the
byte tokenizer costs nearly nothing, so reading dominates), e.g. a 2 GB file of 100k-row groups:
  python3 bench/prep_parquet_bench.py --deepen build/deepen --tokenizer bytes --no-baseline \\
      --mb 2200 --file-mb 2200 --rows-per-group 100000 --work /tmp/pq-big
"""
import argparse
import glob
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import uuid

DOC_SOURCE = "/usr/share/doc/python3.11/html/_sources"
DEFAULT_TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "qwen3",
                                 "tokenizer.json")


def paragraphs():
    files = sorted(glob.glob(os.path.join(DOC_SOURCE, "**", "*.txt"), recursive=True))
    if not files:
        sys.exit("prep_parquet_bench: no text under %s (apt-get install python3.11-doc)" % DOC_SOURCE)
    out = []
    for f in files:
        text = open(f, encoding="utf-8", errors="replace").read()
        out.extend(p for p in re.split(r"\n\s*\n", text) if p.strip())
    return out


def documents(paras, rng):
    """One pass over the paragraphs in a shuffled order, cut into documents of 1-8 KB."""
    order = list(range(len(paras)))
    rng.shuffle(order)
    doc, size, target = [], 0, rng.randint(1000, 8000)
    for i in order:
        doc.append(paras[i])
        size += len(paras[i]) + 2
        if size >= target:
            yield "\n\n".join(doc)
            doc, size, target = [], 0, rng.randint(1000, 8000)
    if doc:
        yield "\n\n".join(doc)


def generate(work, mb, file_mb, rows_per_group, seed):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = os.path.join(work, "parquet")
    stamp = os.path.join(work, "parquet.json")
    params = {"mb": mb, "file_mb": file_mb, "rows_per_group": rows_per_group, "seed": seed, "version": 1}
    if os.path.exists(stamp) and json.load(open(stamp)) == params:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    schema = pa.schema([
        ("text", pa.string()), ("id", pa.string()), ("dump", pa.string()), ("url", pa.string()),
        ("date", pa.string()), ("file_path", pa.string()), ("language", pa.string()),
        ("language_score", pa.float64()), ("token_count", pa.int64()), ("score", pa.float64()),
        ("int_score", pa.int64()),
    ])
    rng = random.Random(seed)
    paras = paragraphs()
    t0 = time.time()
    total, n_file, n_doc = 0, 0, 0
    docs = iter(())
    while total < mb * 1e6:
        path = os.path.join(folder, "000_%05d.parquet" % n_file)
        with pq.ParquetWriter(path, schema, compression="snappy") as w:
            while os.path.getsize(path) < file_mb * 1e6 and total + os.path.getsize(path) < mb * 1e6:
                rows = []
                while len(rows) < rows_per_group:
                    text = next(docs, None)
                    if text is None:
                        docs = documents(paras, rng)
                        continue
                    score = rng.uniform(2.5, 5.0)
                    dump = "CC-MAIN-2024-%02d" % rng.randint(10, 51)
                    rows.append((text, "<urn:uuid:%s>" % uuid.UUID(int=rng.getrandbits(128), version=4), dump,
                                 "https://example.org/%d.html" % n_doc, "2024-05-01T00:00:00Z",
                                 "s3://commoncrawl/crawl-data/%s/warc/%d.warc.gz" % (dump, n_doc), "en",
                                 rng.uniform(0.65, 1.0), len(text.split()), score, int(round(score))))
                    n_doc += 1
                w.write_table(pa.Table.from_arrays([pa.array(list(c)) for c in zip(*rows)], schema=schema))
        total += os.path.getsize(path)
        n_file += 1
    json.dump(params, open(stamp, "w"))
    print("data: %d files, %.1f MB of parquet, %d documents, made in %.0f s (%s)"
          % (n_file, total / 1e6, n_doc, time.time() - t0, folder), flush=True)
    return folder


def vm_hwm_mb(pid):
    """The process's peak RSS so far (VmHWM: of its own address space since exec), 0 if gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0


def timed_child(cmd, env=None):
    """Runs cmd alone: (stdout, wall s, CPU s from wait4, peak RSS MB). The peak is VmHWM polled every
    0.1 s until exit (a high-water mark, so only growth in the last 0.1 s could be missed): wait4's
    ru_maxrss would count the memory of this Python process, which the child holds until its exec."""
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        hwm = 0
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)  # not p.wait(): wait4 also gives the rusage
            if pid:
                break
            hwm = max(hwm, vm_hwm_mb(p.pid))
            time.sleep(0.1)
        wall = time.perf_counter() - t0
        p.returncode = rc = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read().decode()
        if rc != 0:
            sys.exit("prep_parquet_bench: %s failed (%d):\n%s%s" % (" ".join(cmd), rc, text, err.read().decode()))
    return text, wall, ru.ru_utime + ru.ru_stime, hwm


def hf_worker(args):
    """The baseline, as a child: pyarrow reads the text column, tokenizers encodes it."""
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(args.tokenizer)
    files = sorted(glob.glob(os.path.join(args.hf_worker, "*.parquet")))
    t0 = time.perf_counter()
    tokens = docs = text_bytes = 0
    for f in files:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=1024, columns=["text"]):
            texts = [t for t in batch.column(0).to_pylist() if t]
            for enc in tok.encode_batch(texts, add_special_tokens=False):
                tokens += len(enc.ids)
            docs += len(texts)
            text_bytes += sum(len(t.encode("utf-8")) for t in texts)
    print(json.dumps({"seconds": time.perf_counter() - t0, "tokens": tokens + docs, "docs": docs,
                      "text_bytes": text_bytes}))


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deepen", default="build/deepen")
    ap.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help="Qwen3 tokenizer.json, or 'bytes'")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mb", type=float, default=220, help="parquet megabytes to make (>= 200 for the README)")
    ap.add_argument("--file-mb", type=float, default=60, help="megabytes per parquet file")
    ap.add_argument("--rows-per-group", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default="/tmp/deepen-prep-parquet-bench")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--hf-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_worker:
        return hf_worker(args)

    os.makedirs(args.work, exist_ok=True)
    folder = generate(args.work, args.mb, args.file_mb, args.rows_per_group, args.seed)
    files = sorted(glob.glob(os.path.join(folder, "*.parquet")))
    parquet_mb = sum(os.path.getsize(f) for f in files) / 1e6
    load0 = os.getloadavg()

    tok_spec = "bytes" if args.tokenizer == "bytes" else "qwen3:" + os.path.abspath(args.tokenizer)
    out = os.path.join(args.work, "out")
    config = os.path.join(args.work, "prep.toml")
    with open(config, "w") as f:
        f.write('[data]\ntokenizer = "%s"\nsources = ["%s"]\nparquet_text_column = "text"\nid_field = "id"\n'
                'train = "%s/train"\nvalid = "%s/valid"\nvalid_fraction = 0.001\n' % (tok_spec, folder, out, out))
    shutil.rmtree(out, ignore_errors=True)
    # What the binary holds before prep does anything: LibTorch's and the CUDA libraries' pages.
    _, _, _, base_rss = timed_child([args.deepen, "prep", config, "--dry-run"])
    line, d_wall, d_cpu, d_rss = timed_child(
        [args.deepen, "prep", config, "--threads", str(args.threads), "--no-progress"])
    line = line.strip()
    d_tokens = int(re.search(r"([\d,]+) tokens", line).group(1).replace(",", ""))
    d_bytes = float(re.search(r"([\d.]+) MB in", line).group(1)) * 1e6
    shutil.rmtree(out, ignore_errors=True)
    print("deepen: " + line, flush=True)
    print("deepen prep: %.1f s wall, %.1f CPU s, peak RSS %.0f MB (%.0f MB with --dry-run: the loaded libraries); "
          "%.2f MB/s of parquet, %.2f MB/s of text, %.3f M tokens/s"
          % (d_wall, d_cpu, d_rss, base_rss, parquet_mb / d_wall, d_bytes / 1e6 / d_wall, d_tokens / d_wall / 1e6),
          flush=True)

    if not args.no_baseline and args.tokenizer != "bytes":
        env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="true")
        res, h_wall, h_cpu, h_rss = timed_child(
            [sys.executable, os.path.abspath(__file__), "--hf-worker", folder, "--tokenizer", args.tokenizer], env)
        hf = json.loads(res)
        print("HF tokenizers + pyarrow: %.1f s wall, %.1f CPU s, peak RSS %.0f MB; %.2f MB/s of parquet, "
              "%.2f MB/s of text, %.3f M tokens/s" % (h_wall, h_cpu, h_rss, parquet_mb / h_wall,
                                                     hf["text_bytes"] / 1e6 / h_wall, hf["tokens"] / h_wall / 1e6))
        agree = "equal" if hf["tokens"] == d_tokens else "DIFFER: deepen %d vs HF %d" % (d_tokens, hf["tokens"])
        print("token counts (EOS per document included): %s" % agree)
        print("ratio deepen/HF: %.2fx wall tokens/s, %.2fx tokens per CPU second"
              % ((d_tokens / d_wall) / (hf["tokens"] / h_wall), (d_tokens / d_cpu) / (hf["tokens"] / h_cpu)))
    load1 = os.getloadavg()
    print("machine: %s, %d cores, load average %.1f before, %.1f after; %d threads each; %.1f MB of parquet "
          "in %d files" % (cpu_name(), os.cpu_count(), load0[0], load1[0], args.threads, parquet_mb, len(files)))


if __name__ == "__main__":
    main()
