#!/usr/bin/env python3
"""Baseline for bench/student_step_bench: the same student as transformers' Qwen3ForCausalLM,
forward + CE loss + backward, PyTorch eager (no torch.compile), transformers' default attention
(sdpa), fp32, on the threads given. Launched by the C++ bench with the HF folder it exported, so
both sides run the very same weights on the very same token ids.

  python3 bench/student_step_bench.py --model DIR --batch 8 --seq 256 --steps 10 --warmup 2 --threads 2

With --profile PATH it writes a chrome trace of one step after the warm-up and stops.
Prints one JSON line: {"tokens_per_s": ..., "step_ms": [...], "first_loss": ...}.
With --serve it instead prints {"ready": true, "first_loss": ...} after the warm-up, then runs one
step per "step" line read from stdin and answers each with {"ms": ..., "cpu_ms": ...} (wall and
process CPU time), until "quit": the C++ bench alternates its own steps with these, so both sides
see the same machine load.
"""
import sys
import argparse
import json
import time

import torch
import torch.nn.functional as F
from transformers import Qwen3ForCausalLM


def bench_ids(batch, seq, vocab):
    # Same formula as the C++ side: ids[b, t] = (b * 131 + t * 17 + (b * t) % 7) % vocab.
    b = torch.arange(batch).unsqueeze(1)
    t = torch.arange(seq).unsqueeze(0)
    return (b * 131 + t * 17 + (b * t) % 7) % vocab


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--serve", action="store_true")
    p.add_argument("--profile", help="write a chrome trace of one step (torch.profiler) here and stop, "
                   "to compare op by op with the C++ bench's --profile")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model = Qwen3ForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    model.train()  # dropout is 0 in Qwen3; train mode as in training
    vocab = model.config.vocab_size
    ids = bench_ids(a.batch, a.seq, vocab)
    targets = ids[:, 1:].reshape(-1)

    def step():
        logits = model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), targets)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss.item()

    first_loss = step()
    for _ in range(a.warmup - 1):
        step()
    if a.profile:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        prof.export_chrome_trace(a.profile)
        print(json.dumps({"first_loss": first_loss}), flush=True)
        return
    if a.serve:
        print(json.dumps({"ready": True, "first_loss": first_loss}), flush=True)
        for line in sys.stdin:
            if line.strip() != "step":
                break
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3, "cpu_ms": (time.process_time() - c0) * 1e3}),
                  flush=True)
        return
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    median = times[len(times) // 2]
    print(json.dumps({"tokens_per_s": a.batch * a.seq / median, "step_ms": [t * 1e3 for t in times],
                      "first_loss": first_loss}))


if __name__ == "__main__":
    main()
