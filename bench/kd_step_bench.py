#!/usr/bin/env python3
"""Baseline for bench/kd_step_bench: one distillation step written plainly in PyTorch + transformers.

The teacher forward under no_grad, the student forward, log_softmax KL + CE on the full [N, V]
logits, backward, gradient clipping, AdamW: what a user would write first. PyTorch eager (no
torch.compile), transformers' default attention (sdpa), fp32. Launched by the C++ bench with the
teacher's folder and the student it exported, so both sides run the very same weights on the very
same token ids.

  python3 bench/kd_step_bench.py --teacher DIR --student DIR --batch 4 --seq 256 --alpha 0.7 --tau 1 \
      --threads 2 [--serve | --profile PATH]

Prints {"ready": true, "first": {loss, kl, ce}} after the warm-up (--serve), then runs one step per
"step" line read from stdin and answers each with {"ms", "cpu_ms", "parts_ms"} (wall and process
CPU time; parts: teacher, forward_loss, backward, optimizer), until "quit". With --profile PATH it
writes a chrome trace of one step after the warm-up and stops.
"""
import argparse
import json
import sys
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
    p.add_argument("--teacher", required=True)
    p.add_argument("--student", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--alpha", type=float, default=0.7)
    p.add_argument("--tau", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--serve", action="store_true")
    p.add_argument("--profile", help="write a chrome trace of one step (torch.profiler) here and stop")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    teacher = Qwen3ForCausalLM.from_pretrained(a.teacher, dtype=torch.float32).eval()
    student = Qwen3ForCausalLM.from_pretrained(a.student, dtype=torch.float32).train()
    vocab = student.config.vocab_size
    ids = bench_ids(a.batch, a.seq, vocab)
    # Next-token labels; each sequence's last position takes its first token, so every position counts
    # (the C++ side uses the same labels).
    labels = torch.roll(ids, -1, dims=1).reshape(-1)
    # deepen's AdamW decays matrices only; the same here.
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    alpha, tau = a.alpha, a.tau

    def step(parts=None):
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.no_grad():
            t_logits = teacher(input_ids=ids, use_cache=False).logits.reshape(-1, vocab)
        t1, c1 = time.perf_counter(), time.process_time()
        s_logits = student(input_ids=ids, use_cache=False).logits.reshape(-1, vocab)
        log_s = F.log_softmax(s_logits / tau, dim=-1)
        log_t = F.log_softmax(t_logits / tau, dim=-1)
        kl = F.kl_div(log_s, log_t, log_target=True, reduction="batchmean")
        ce = F.cross_entropy(s_logits, labels)
        loss = alpha * tau * tau * kl + (1 - alpha) * ce
        t2, c2 = time.perf_counter(), time.process_time()
        loss.backward()
        t3, c3 = time.perf_counter(), time.process_time()
        torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t4, c4 = time.perf_counter(), time.process_time()
        if parts is not None:
            parts.update({"teacher": (t1 - t0) * 1e3, "forward_loss": (t2 - t1) * 1e3,
                          "backward": (t3 - t2) * 1e3, "optimizer": (t4 - t3) * 1e3,
                          "cpu": [(c1 - c0) * 1e3, (c2 - c1) * 1e3, (c3 - c2) * 1e3, (c4 - c3) * 1e3]})
        return {"loss": loss.item(), "kl": kl.item(), "ce": ce.item()}

    first = step()
    for _ in range(a.warmup - 1):
        step()
    if a.profile:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        prof.export_chrome_trace(a.profile)
        print(json.dumps({"first": first}), flush=True)
        return
    print(json.dumps({"ready": True, "first": first}), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        parts = {}
        t0, c0 = time.perf_counter(), time.process_time()
        step(parts)
        print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3, "cpu_ms": (time.process_time() - c0) * 1e3,
                          "parts_ms": parts}), flush=True)


if __name__ == "__main__":
    main()
