#!/usr/bin/env python3
"""Baseline for bench/kd_step_bench: one distillation step written plainly in PyTorch + transformers.

The teacher forward under no_grad, the student forward, log_softmax KL + CE on the full [N, V]
logits, backward, gradient clipping, AdamW: what a user would write first. transformers' default
attention (sdpa), fp32. PyTorch eager, or with --compile torch.compile (inductor, C++ on CPU) of the
teacher's forward, of the student's forward + loss (its backward compiled with it) and of the clip +
AdamW step, each part falling back to eager only if it fails to compile (named in the ready line).
The malloc (glibc default, its hugetlb tunable, tcmalloc, jemalloc) is the environment's: the C++
bench starts one child per variant. Launched by the C++ bench with the teacher's folder and the
student it exported, so both sides run the very same weights on the very same token ids.

  python3 bench/kd_step_bench.py --teacher DIR --student DIR --batch 4 --seq 256 --alpha 0.7 --tau 1 \
      --threads 2 [--compile] [--serve | --profile PATH]

Prints {"ready": true, "first": {loss, kl, ce}, "compile": {...}, "peak_rss": bytes} after the warm-up
(--serve), or {"error": "..."} and exit 1 if it cannot get there; then runs one step per "step" line
read from stdin and answers each with {"ms", "cpu_ms", "parts_ms", "graphs", "peak_rss"} (wall and
process CPU time; parts: teacher, forward_loss, backward, optimizer; graphs: torch.compile's graphs so
far, so a recompilation inside the timed steps shows), until "quit". With --profile PATH it writes a
chrome trace of one step after the warm-up and stops.
"""
import argparse
import json
import resource
import sys
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


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Part:
    """One part of the step, torch.compile'd when asked. If compiling it fails, a part that may fall back
    runs eager from then on and the failure is kept (reported in the ready line), so a variant never
    hides a fallback; the student's forward + loss may not (without it the variant is not compiled)."""

    def __init__(self, name, fn, compile, notes, fallback=True):
        self.name, self.eager, self.notes, self.fallback = name, fn, notes, fallback
        self.fn = torch.compile(fn) if compile else fn

    def __call__(self, *args):
        try:
            return self.fn(*args)
        except Exception as e:  # noqa: BLE001 -- any compile failure: report it, run eager
            if self.fn is self.eager or not self.fallback:
                raise
            self.notes[self.name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:400]} -> eager"
            self.fn = self.eager
            return self.eager(*args)


def compiled_graphs():
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


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
    p.add_argument("--compile", action="store_true", help="torch.compile the teacher forward, the student "
                   "forward + loss and the clip + AdamW step (compiled during the warm-up)")
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

    def teacher_logits(ids):
        with torch.no_grad():
            return teacher(input_ids=ids, use_cache=False).logits.reshape(-1, vocab)

    def forward_loss(ids, labels, t_logits):
        s_logits = student(input_ids=ids, use_cache=False).logits.reshape(-1, vocab)
        log_s = F.log_softmax(s_logits / tau, dim=-1)
        log_t = F.log_softmax(t_logits / tau, dim=-1)
        kl = F.kl_div(log_s, log_t, log_target=True, reduction="batchmean")
        ce = F.cross_entropy(s_logits, labels)
        return alpha * tau * tau * kl + (1 - alpha) * ce, kl, ce

    def clip_and_step():
        torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        opt.step()

    notes = {}
    run_teacher = Part("teacher forward", teacher_logits, a.compile, notes)
    run_forward_loss = Part("student forward + loss", forward_loss, a.compile, notes, fallback=False)
    run_optimizer = Part("clip + AdamW", clip_and_step, a.compile, notes)

    def step(parts=None):
        t0, c0 = time.perf_counter(), time.process_time()
        t_logits = run_teacher(ids)
        t1, c1 = time.perf_counter(), time.process_time()
        loss, kl, ce = run_forward_loss(ids, labels, t_logits)
        t2, c2 = time.perf_counter(), time.process_time()
        loss.backward()
        t3, c3 = time.perf_counter(), time.process_time()
        run_optimizer()
        opt.zero_grad(set_to_none=True)
        t4, c4 = time.perf_counter(), time.process_time()
        if parts is not None:
            parts.update({"teacher": (t1 - t0) * 1e3, "forward_loss": (t2 - t1) * 1e3,
                          "backward": (t3 - t2) * 1e3, "optimizer": (t4 - t3) * 1e3,
                          "cpu": [(c1 - c0) * 1e3, (c2 - c1) * 1e3, (c3 - c2) * 1e3, (c4 - c3) * 1e3]})
        return {"loss": loss.item(), "kl": kl.item(), "ce": ce.item()}

    t0 = time.perf_counter()
    first = step()
    # Compiled: the first step compiles, the second recompiles AdamW once its state exists; the third
    # runs what the timed steps run. So a compiled variant warms up at least three steps.
    for _ in range(max(a.warmup, 3 if a.compile else 1) - 1):
        step()
    warmup_s = time.perf_counter() - t0
    compile_info = {"asked": a.compile}
    if a.compile:
        graphs, breaks = compiled_graphs()
        compile_info.update({"graphs": graphs, "graph_breaks": breaks, "fallbacks": notes, "warmup_s": warmup_s})
    if a.profile:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        prof.export_chrome_trace(a.profile)
        print(json.dumps({"first": first, "compile": compile_info}), flush=True)
        return
    print(json.dumps({"ready": True, "first": first, "compile": compile_info, "peak_rss": peak_rss()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        parts = {}
        t0, c0 = time.perf_counter(), time.process_time()
        step(parts)
        print(json.dumps({"ms": (time.perf_counter() - t0) * 1e3, "cpu_ms": (time.process_time() - c0) * 1e3,
                          "parts_ms": parts, "graphs": compiled_graphs()[0] if a.compile else 0,
                          "peak_rss": peak_rss()}), flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 -- the C++ bench prints why this variant did not run
        print(json.dumps({"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}), flush=True)
        sys.exit(1)
