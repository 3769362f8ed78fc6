#!/usr/bin/env python3
"""The teacher cache at demo scale: full-logit KD with the live teacher against runs from a teacher
cache with K = 8, 32, 64 draws per token (RS-KD) and against the cache's top-64, three seeds each.

  python3 bench/cache_demo_bench.py --deepen build/deepen --work /tmp/cache-demo [--seeds 1 2 3]

1. The demo's corpus and 400-step teacher (configs/demo/teacher.toml), unless --work has them.
2. Three caches of every train token and the eval set (`deepen cache`, one process, the teacher on
   the CPU): K = 8, K = 32, K = 64 with its top-64; the time of each and its bytes per token.
3. The demo's pre-grow run (configs/demo/base.toml: 3 blocks grown 1 -> 2 -> 3 over 3 x 50 steps,
   α 0.7, τ 1; pre-norm so that its export loads in transformers) for each seed, one process each
   (the two students of [parallel] as gradient accumulation), with the live teacher in that process
   (full logits) and from each cache (no teacher): the training wall time of each run.
4. Every final student scored exactly with transformers against the teacher (an independent
   reference, not deepen's code) on the eval set the runs evaluate (eval.batches × micro_batch
   windows of data.valid): validation CE on the labels and the exact KL(p_T || p_S) at τ = 1 over the
   whole vocabulary; beside it deepen's own last val_ce and val_kl (the cache runs' val_kl is the
   RS estimate from the cache's validation draws).
Prints one row per run and the mean ± sample std over seeds per variant, as Markdown.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(cmd):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-5000:])
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return time.time() - t0, p


def load_shards(folder):
    """The token stream of a shard folder (data/token_shards.h: 64-byte header, then the tokens)."""
    out = []
    for name in sorted(f for f in os.listdir(folder) if f.endswith(".bin")):
        with open(os.path.join(folder, name), "rb") as f:
            head = f.read(64)
            width = int.from_bytes(head[12:16], "little")
            count = int.from_bytes(head[24:32], "little")
            out.append(np.frombuffer(f.read(width * count), dtype=np.uint16 if width == 2 else np.uint32))
    return np.concatenate(out).astype(np.int64)


@torch.no_grad()
def exact_scores(teacher, student_dir, windows):
    student = AutoModelForCausalLM.from_pretrained(student_dir, torch_dtype=torch.float32).eval()
    ce = kl = n = 0.0
    for i in range(0, len(windows), 8):
        w = torch.tensor(np.stack(windows[i:i + 8]))
        x, y = w[:, :-1], w[:, 1:]
        ls = torch.log_softmax(student(x).logits.double(), -1)
        lt = torch.log_softmax(teacher(x).logits.double(), -1)
        ce += -ls.gather(-1, y.unsqueeze(-1)).sum().item()
        kl += (lt.exp() * (lt - ls)).sum().item()
        n += y.numel()
    return ce / n, kl / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepen", default=os.path.join(ROOT, "build", "deepen"))
    ap.add_argument("--work", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sources", nargs="+", default=None,
                    help="the runs' corpus (default: the demo's, configs/demo/teacher.toml); the teacher always "
                         "learns from the demo's whole corpus")
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    teacher_cfg = os.path.join(ROOT, "configs", "demo", "teacher.toml")
    base = os.path.join(ROOT, "configs", "demo", "base.toml")
    paths = [f'data.train="{work}/data/train"', f'data.valid="{work}/data/valid"']
    sets = lambda xs: sum((["--set", x] for x in xs), [])  # noqa: E731
    threads = f"run.threads={a.threads}"

    # 1. Corpus and teacher (the teacher from the demo's whole corpus; the runs on --sources, when given).
    if not os.path.exists(f"{work}/data/train"):
        run([a.deepen, "prep", teacher_cfg] + sets(paths))
    hf = f"{work}/teacher/final/hf"
    if not os.path.exists(hf):
        t, _ = run([a.deepen, "pretrain", teacher_cfg, "--quiet"] + sets(paths + [f'run.out_dir="{work}/teacher"', threads]))
        print(f"teacher: {t:.0f} s")
    if a.sources:
        paths = [f'data.train="{work}/runs-data/train"', f'data.valid="{work}/runs-data/valid"']
        if not os.path.exists(f"{work}/runs-data/train"):
            srcs = "[" + ", ".join(f'"{x}"' for x in a.sources) + "]"
            run([a.deepen, "prep", teacher_cfg] + sets(paths + [f"data.sources={srcs}", "data.valid_fraction=0.05"]))
    common = paths + [f'teacher.checkpoint="{hf}"', threads, 'student.norm="pre"']

    # 2. The caches.
    caches = {"K=8": ["cache.samples=8"], "K=32": ["cache.samples=32"], "K=64": ["cache.samples=64", "cache.topk=64"]}
    made = {}
    for name, keys in caches.items():
        out = f"{work}/cache-{name.replace('=', '')}"
        t, p = run([a.deepen, "cache", base, "--out", out, "--set", "parallel.micro_batch=64"] + sets(common + keys))
        m = json.load(open(f"{out}/manifest.json"))
        tokens = m["data"]["train_records"] + m["data"]["valid_records"]
        made[name] = (out, keys, t, m["bytes"] / tokens, tokens)
        print(f"cache {name}: {tokens} tokens, {m['bytes'] / tokens:.1f} bytes/token, {t:.0f} s"
              f"{' (already made)' if 'complete already' in p.stderr else ''}")

    # 3. The runs.
    variants = {"full-logit KD (live teacher)": []}
    for name in ("K=8", "K=32", "K=64"):
        out, keys, _, _, _ = made[name]
        variants[f"cache {name} (RS-KD)"] = ['distill.source="cache"', f'cache.dir="{out}"'] + keys
    out64, keys64, _, _, _ = made["K=64"]
    variants["cache top-64"] = ['distill.source="cache"', f'cache.dir="{out64}"', 'cache.targets="topk"'] + keys64
    results = {}
    for seed in a.seeds:
        for v, keys in variants.items():
            tag = v.split(" (")[0].replace(" ", "-").replace("=", "")
            out = f"{work}/runs/{tag}/seed{seed}"
            t, _ = run([a.deepen, "train", base, "--fresh", "--quiet"] +
                       sets(common + keys + [f"run.seed={seed}", f'run.out_dir="{out}"', 'run.name="pre-grow"']))
            evals = [json.loads(l) for l in open(f"{out}/eval.jsonl") if l.strip()]
            results.setdefault(v, []).append({"seed": seed, "dir": out, "time": t, "val_ce": evals[-1]["val_ce"],
                                              "val_kl": evals[-1]["val_kl"]})
            print(f"{v} seed {seed}: {t:.0f} s, deepen val_ce {evals[-1]['val_ce']:.4f} val_kl {evals[-1]['val_kl']:.4f}",
                  flush=True)

    # 4. Exact scores with transformers.
    torch.set_num_threads(a.threads)
    teacher = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
    seq_len, n_windows = 128, 8 * 8  # configs/demo/base.toml: data.seq_len, eval.batches × micro_batch
    stream = load_shards(f"{work}/{'runs-data' if a.sources else 'data'}/valid")
    windows = [stream[i * seq_len:i * seq_len + seq_len + 1] for i in range(n_windows)]
    for v, rows in results.items():
        for r in rows:
            r["exact_ce"], r["exact_kl"] = exact_scores(teacher, f"{r['dir']}/final/hf", windows)

    def stat(xs):
        return f"{statistics.mean(xs):.4f} ± {statistics.stdev(xs):.4f}" if len(xs) > 1 else f"{xs[0]:.4f}"

    print("\n| targets | bytes/token | val CE (exact) | val KL (exact) | deepen val_ce | deepen val_kl | train time (s) |")
    print("|---|---|---|---|---|---|---|")
    for v, rows in results.items():
        name = v.split(" (")[0].replace("cache ", "")
        bpt = "—" if "full" in v else (f"{made['K=64'][3] - 512:.1f} + 512 (top-64)" if "top" in v
                                       else f"{made[name][3]:.1f}")
        print(f"| {v} | {bpt} | {stat([r['exact_ce'] for r in rows])} | {stat([r['exact_kl'] for r in rows])} | "
              f"{stat([r['val_ce'] for r in rows])} | {stat([r['val_kl'] for r in rows])} | "
              f"{stat([r['time'] for r in rows])} |")
    print("\nper run:")
    for v, rows in results.items():
        for r in rows:
            print(f"  {v} seed {r['seed']}: exact CE {r['exact_ce']:.5f} KL {r['exact_kl']:.5f}; deepen val_ce "
                  f"{r['val_ce']:.5f} val_kl {r['val_kl']:.5f}; {r['time']:.1f} s")
    print("\ncaches: " + "; ".join(f"{k}: {v[4]} tokens, {v[3]:.1f} bytes/token, made in {v[2]:.0f} s"
                                    for k, v in made.items()))
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
