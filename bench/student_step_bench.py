#!/usr/bin/env python3
"""Baseline for bench/student_step_bench: the same student as transformers' Qwen3ForCausalLM,
forward + CE loss + backward, PyTorch eager (or with --compile torch.compile of the forward + loss, its
backward compiled with it, during the warm-up), transformers' default attention (sdpa), fp32, on the
threads given; the malloc is the environment's (the C++ bench starts one child per variant). Launched
by the C++ bench with the HF folder it exported, so both sides run the very same weights on the very
same token ids.

  python3 bench/student_step_bench.py --model DIR --batch 8 --seq 256 --steps 10 --warmup 2 --threads 2 [--compile]

With --profile PATH it writes a chrome trace of one step after the warm-up and stops.
Prints one JSON line: {"tokens_per_s": ..., "step_ms": [...], "first_loss": ...}.
With --serve it instead prints {"ready": true, "first_loss": ...} after the warm-up, then runs one
step per "step" line read from stdin and answers each with {"ms": ..., "cpu_ms": ..., "peak_rss": ...}
(wall and process CPU time, peak resident bytes), until "quit": the C++ bench alternates its own steps
with these, so both sides see the same machine load. A failure before the ready line is answered
{"error": ...} (exit 1), so the bench can say why a variant did not run.
"""
import sys
import argparse
import json
import resource
import time
import traceback

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
    p.add_argument("--compile", action="store_true", help="torch.compile the forward + loss (compiled in the warm-up)")
    p.add_argument("--profile", help="write a chrome trace of one step (torch.profiler) here and stop, "
                   "to compare op by op with the C++ bench's --profile")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model = Qwen3ForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    model.train()  # dropout is 0 in Qwen3; train mode as in training
    vocab = model.config.vocab_size
    ids = bench_ids(a.batch, a.seq, vocab)
    targets = ids[:, 1:].reshape(-1)

    def forward_loss(ids, targets):
        logits = model(input_ids=ids, use_cache=False).logits
        return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), targets)

    run_forward_loss = torch.compile(forward_loss) if a.compile else forward_loss

    def step():
        loss = run_forward_loss(ids, targets)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss.item()

    first_loss = step()
    # Compiled: the first step compiles; one more makes sure the timed steps run what was compiled.
    for _ in range(max(a.warmup, 2 if a.compile else 1) - 1):
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
            print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3, "cpu_ms": (time.process_time() - c0) * 1e3,
                              "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}), flush=True)
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
    try:
        main()
    except Exception as e:  # noqa: BLE001 -- the C++ bench prints why this variant did not run
        print(json.dumps({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}), flush=True)
        sys.exit(1)
