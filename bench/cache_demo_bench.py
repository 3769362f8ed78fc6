#!/usr/bin/env python3
"""The teacher cache at demo scale: full-logit KD with the live teacher against runs from a teacher
cache with K = 8, 32, 64 draws per token (RS-KD) and against the cache's top-64, three seeds each.

  python3 bench/cache_demo_bench.py --deepen build/deepen --work /tmp/cache-demo [--seeds 1 2 3] \
      [--sources DIR ...] [--report docs/demo/teacher-cache.md] [--reuse-runs]

The figures in docs/demo/teacher-cache.md come from --sources set to the tutorial, reference and faq
folders of /usr/share/doc/python3.11/html/_sources (0.87 M byte tokens: caches a CPU makes in
minutes; the whole demo corpus is 11 M). The 15 runs and the scoring took 21 minutes on 2 cores at
load ~23 with the caches made; the caches took 9, 10 and 29 minutes (K = 8, 32, 64 with its
top-64; 2 threads, another loaded machine).

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
Prints one row per run and the mean ± sample std over seeds per variant, as Markdown (and with
--report writes it, with the command and machine, to that file). DIR/results.json keeps every run's
figures: --reuse-runs keeps the finished runs and runs the rest.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def cpu_of_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(cmd, cpu=None):
    """Runs cmd; returns its wall seconds and the process. With cpu (a list), appends the CPU seconds
    (user + system) it used: on a shared machine a steadier measure of its work than the wall time."""
    t0, c0 = time.time(), cpu_of_children()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-5000:])
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    if cpu is not None:
        cpu.append(cpu_of_children() - c0)
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
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads per run (the demo's 1: 2 cost more CPU than they save at these shapes)")
    ap.add_argument("--reuse-runs", action="store_true",
                    help="keep the runs that DIR/results.json records as finished (their times too) and run the rest: "
                         "finishes an interrupted bench, or rescores and rewrites the report")
    ap.add_argument("--report", default=None,
                    help="also write the table, with the command and machine, to this Markdown file "
                         "(docs/demo/teacher-cache.md)")
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
    done = {}
    if a.reuse_runs and os.path.exists(f"{work}/results.json"):
        for v, rows in json.load(open(f"{work}/results.json"))["runs"].items():
            for r in rows:
                if os.path.exists(f"{r['dir']}/final/hf"):
                    done[(v, r["seed"])] = r
    for seed in a.seeds:
        for v, keys in variants.items():
            tag = v.split(" (")[0].replace(" ", "-").replace("=", "")
            out = f"{work}/runs/{tag}/seed{seed}"
            if (v, seed) in done:
                results.setdefault(v, []).append(done[(v, seed)])
                print(f"{v} seed {seed}: kept from results.json ({done[(v, seed)]['time']:.0f} s)")
                continue
            load0, cpu = os.getloadavg()[0], []
            t, _ = run([a.deepen, "train", base, "--fresh", "--quiet"] +
                       sets(common + keys + [f"run.seed={seed}", f'run.out_dir="{out}"', 'run.name="pre-grow"']), cpu)
            load = (load0 + os.getloadavg()[0]) / 2
            evals = [json.loads(l) for l in open(f"{out}/eval.jsonl") if l.strip()]
            results.setdefault(v, []).append({"seed": seed, "dir": out, "time": t, "cpu": cpu[0], "load": load,
                                              "val_ce": evals[-1]["val_ce"], "val_kl": evals[-1]["val_kl"]})
            print(f"{v} seed {seed}: {t:.0f} s, {cpu[0]:.0f} CPU s (load {load:.1f}), deepen val_ce "
                  f"{evals[-1]['val_ce']:.4f} val_kl {evals[-1]['val_kl']:.4f}", flush=True)
            with open(f"{work}/results.json", "w") as f:
                json.dump({"caches": made, "runs": results}, f, indent=1)

    # 4. Exact scores with transformers.
    torch.set_num_threads(a.threads)
    teacher = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
    seq_len, n_windows = 128, 8 * 8  # configs/demo/base.toml: data.seq_len, eval.batches × micro_batch
    stream = load_shards(f"{work}/{'runs-data' if a.sources else 'data'}/valid")
    windows = [stream[i * seq_len:i * seq_len + seq_len + 1] for i in range(n_windows)]
    for v, rows in results.items():
        for r in rows:
            r["exact_ce"], r["exact_kl"] = exact_scores(teacher, f"{r['dir']}/final/hf", windows)
    with open(f"{work}/results.json", "w") as f:
        json.dump({"caches": made, "runs": results}, f, indent=1)

    def stat(xs, digits=4):
        if len(xs) > 1:
            return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"
        return f"{xs[0]:.{digits}f}"

    full = results["full-logit KD (live teacher)"]
    have_cpu = all("cpu" in r for rows in results.values() for r in rows)
    lines = ["| targets | bytes/token | val CE (exact) | Δ CE vs full, per seed | val KL (exact) | deepen val_ce | "
             "deepen val_kl | train wall (s) | train CPU (s) | CPU / full's |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for v, rows in results.items():
        name = v.split(" (")[0].replace("cache ", "")
        # The K = 64 cache also holds the top-64 (8 bytes an entry): each row states its own targets' bytes.
        both = made["K=64"][3]
        bpt = "— (live teacher)" if "full" in v else (
            f"{8 * 64} (the file: {both:.1f}, with the K = 64 draws)" if "top" in v else
            f"{both - 8 * 64:.1f} (the file: {both:.1f}, with the top-64)" if name == "K=64" else f"{made[name][3]:.1f}")
        delta = "—" if "full" in v else stat([r["exact_ce"] - f["exact_ce"] for r, f in zip(rows, full)])
        cpu = stat([r["cpu"] for r in rows], 0) if have_cpu else "—"
        ratio = "—" if "full" in v or not have_cpu else stat([r["cpu"] / f["cpu"] for r, f in zip(rows, full)], 2)
        lines.append(f"| {v} | {bpt} | {stat([r['exact_ce'] for r in rows])} | {delta} | "
                     f"{stat([r['exact_kl'] for r in rows])} | {stat([r['val_ce'] for r in rows])} | "
                     f"{stat([r['val_kl'] for r in rows])} | {stat([r['time'] for r in rows], 0)} | {cpu} | {ratio} |")
    per_run = []
    for v, rows in results.items():
        for r in rows:
            per_run.append(f"- {v}, seed {r['seed']}: exact CE {r['exact_ce']:.5f}, KL {r['exact_kl']:.5f}; deepen "
                           f"val_ce {r['val_ce']:.5f}, val_kl {r['val_kl']:.5f}; {r['time']:.1f} s"
                           + (f", {r['cpu']:.1f} CPU s" if "cpu" in r else "") + f" at load {r['load']:.1f}")
    caches = "; ".join(f"{k}: {v[4]:,} tokens, {v[3]:.1f} bytes/token" for k, v in made.items()) + " (with the top-64)"
    print("\n" + "\n".join(lines) + "\n\nper run:\n" + "\n".join(per_run) + "\n\ncaches: " + caches)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if a.report:
        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
        cmd = "python3 bench/cache_demo_bench.py --deepen build/deepen --work DIR"
        if a.sources:
            cmd += " --sources " + " ".join(a.sources)
        if a.seeds != [1, 2, 3]:
            cmd += " --seeds " + " ".join(map(str, a.seeds))
        cmd += " --report docs/demo/teacher-cache.md"
        text = (
            "# The teacher cache at demo scale\n\n"
            "Written by `bench/cache_demo_bench.py` ([cache.md](../cache.md), "
            "[performance.md](../performance.md#the-teacher-cache)). The demo's pre-grow run "
            "(`configs/demo/base.toml`: 3 blocks of 3 layers grown over 3 × 50 steps, α 0.7, τ 1, 307,200 training "
            "tokens) on the demo teacher, one process per run, trained with the live teacher's full logits and from "
            "teacher caches (no teacher in the process): K = 8, 32, 64 draws per token (RS-KD) and the top-64 "
            f"(`cache.targets = \"topk\"`, renormalised). Seeds {', '.join(map(str, a.seeds))}; mean ± sample std over "
            "seeds. *val CE / val KL (exact)*: each final student scored by transformers against the teacher over "
            "the whole vocabulary at τ = 1 on the runs' eval set (an independent reference); *deepen val_ce / "
            "val_kl*: the run's own last eval record (from a cache, val_kl is the RS estimate from the validation "
            "draws). *Δ CE vs full*: the exact val CE minus the full-logit run's of the same seed. Train wall / CPU: "
            "the whole `deepen train` process's wall time and CPU seconds (user + system; the full-logit run "
            "includes its teacher's forward passes); the runs of a seed ran back to back, so compare times only "
            "within this table, and on a shared machine the CPU seconds rather than the wall.\n\n"
            f"```sh\n{cmd}\n```\n\n"
            f"Machine: {cpu}, {os.cpu_count()} cores, shared (load average per run below). Caches: {caches}.\n\n"
            + "\n".join(lines) + "\n\nPer run:\n\n" + "\n".join(per_run) + "\n")
        with open(a.report, "w") as f:
            f.write(text)
        print(f"wrote {a.report}")


if __name__ == "__main__":
    main()
