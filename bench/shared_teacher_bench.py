#!/usr/bin/env python3
"""Shared teacher: R runs in one `deepen group` job against the same R runs one after another.

Both sides train the same runs (pre/post-norm x grow/joint students) behind the same teacher on the
same data; the baseline is what a study does without study.share_teacher: each run a job of its own
(1 teacher stage + 1 student under mpirun). Prints wall time, the teacher's forward passes (from its
step_time records) and the ratios, and checks that every run's losses are equal on both sides.

  python3 bench/shared_teacher_bench.py --deepen build/deepen --work /tmp/shared-bench [--runs 4]

The fixture (byte-level shards of /usr/share/common-licenses, a teacher of --teacher-layers x
--teacher-hidden pretrained for a few steps) is built once in --work. On a CPU machine the ranks share
its cores, so the wall-time ratio measures the work saved: R teacher forwards per micro-batch become one.
The CPU kernels are pinned ("fused"): "auto" times them in each process, and two processes may choose
differently, which would make the loss comparison fail for a reason other than sharing.
"""
import argparse
import json
import os
import subprocess
import sys
import time

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}

TEACHER = """
[run]
threads = 1
device = "cpu"
out_dir = "{work}/teacher"
[data]
tokenizer = "bytes"
train = "{work}/data/train"
valid = "{work}/data/valid"
seq_len = {seq_len}
[student]
layers = {layers}
hidden = {hidden}
heads = 4
kv_heads = 2
head_dim = {head_dim}
intermediate = {intermediate}
[curriculum]
mode = "joint"
stage_steps = [4]
[parallel]
micro_batch = 4
[eval]
every = 100
batches = 1
diagnostics_every = 0
[checkpoint]
every = 0
"""

STUDENT = """
[run]
threads = 1
device = "cpu"
[data]
tokenizer = "bytes"
train = "{work}/data/train"
valid = "{work}/data/valid"
seq_len = {seq_len}
[teacher]
checkpoint = "{work}/teacher/final/hf"
cpu_kernels = "fused"
[student]
cpu_kernels = "fused"
layers = 3
hidden = 32
heads = 4
kv_heads = 2
head_dim = 8
intermediate = 64
[curriculum]
mode = "grow"
stage_steps = [{phase}, {phase}, {phase}]
[parallel]
micro_batch = 2
grad_accum = 2
[eval]
every = 1000
batches = 1
diagnostics_every = 0
[checkpoint]
every = 0
"""

RUNS = [("pre-grow", ['student.norm="pre"']), ("post-grow", ['student.norm="post"']),
        ("pre-joint", ['student.norm="pre"', 'curriculum.mode="joint"', "curriculum.stages=[3]", "curriculum.stage_steps=[{total}]"]),
        ("post-joint", ['student.norm="post"', 'curriculum.mode="joint"', "curriculum.stages=[3]", "curriculum.stage_steps=[{total}]"])]


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **MPI_ENV, **(env or {})))
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-2000:] + p.stderr[-4000:])
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(cmd)}")
    return p


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def passes(job_dir, rank):
    return sum(r["passes"] for r in records(os.path.join(job_dir, "step_time", f"rank{rank}.jsonl")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepen", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--runs", type=int, default=4, help="runs (up to 4: pre/post x grow/joint)")
    ap.add_argument("--phase", type=int, default=6, help="steps per growth phase (3 phases)")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--teacher-layers", type=int, default=4)
    ap.add_argument("--teacher-hidden", type=int, default=256)
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    shape = dict(work=work, seq_len=a.seq_len, layers=a.teacher_layers, hidden=a.teacher_hidden,
                 head_dim=a.teacher_hidden // 4, intermediate=3 * a.teacher_hidden)
    if not os.path.exists(os.path.join(work, "teacher", "final", "hf")):
        with open(os.path.join(work, "prep.toml"), "w") as f:
            f.write(f'[data]\ntokenizer = "bytes"\nsources = ["/usr/share/common-licenses"]\n'
                    f'train = "{work}/data/train"\nvalid = "{work}/data/valid"\nvalid_fraction = 0.2\n')
        run([a.deepen, "prep", os.path.join(work, "prep.toml"), "--overwrite"])
        with open(os.path.join(work, "teacher.toml"), "w") as f:
            f.write(TEACHER.format(**shape))
        run([a.deepen, "pretrain", os.path.join(work, "teacher.toml"), "--fresh", "--quiet"])
    base = os.path.join(work, "student.toml")
    with open(base, "w") as f:
        f.write(STUDENT.format(phase=a.phase, **shape))
    runs = [(name, [s.format(total=3 * a.phase) for s in sets]) for name, sets in RUNS[:a.runs]]

    t0 = time.perf_counter()
    alone_passes = 0
    for name, sets in runs:
        out = os.path.join(work, "alone", name)
        cmd = ["mpirun", "-np", "2", a.deepen, "train", base, "--fresh", "--quiet", "--set", f'run.out_dir="{out}"']
        for s in sets:
            cmd += ["--set", s]
        run(cmd)
        alone_passes += passes(out, 0)
    alone_s = time.perf_counter() - t0

    group = os.path.join(work, "group.toml")
    with open(group, "w") as f:
        f.write(f'[group]\nname = "bench"\nout_dir = "{work}/group/job"\n')
        for name, sets in runs:
            all_sets = [f'run.out_dir="{work}/group/{name}"'] + sets
            f.write("\n[[run]]\nconfig = " + json.dumps(base) + "\nset = [" + ", ".join(json.dumps(s) for s in all_sets) + "]\n")
    t0 = time.perf_counter()
    run(["mpirun", "-np", str(1 + len(runs)), a.deepen, "group", group, "--fresh", "--quiet"])
    group_s = time.perf_counter() - t0
    group_passes = passes(os.path.join(work, "group", "job"), 0)

    for name, _ in runs:
        x, y = records(os.path.join(work, "alone", name, "metrics.jsonl")), records(os.path.join(work, "group", name, "metrics.jsonl"))
        assert [r["loss"] for r in x] == [r["loss"] for r in y], f"{name}: the group's losses differ from the run alone"
    steps = len(records(os.path.join(work, "group", runs[0][0], "metrics.jsonl")))
    print(f"machine: {os.cpu_count()} CPUs; teacher {a.teacher_layers} x {a.teacher_hidden}, students 3 x 32, "
          f"seq_len {a.seq_len}, {len(runs)} runs of {steps} steps, losses equal on both sides")
    print(f"one after another: {alone_s:7.1f} s, {alone_passes} teacher forward passes")
    print(f"one group job:     {group_s:7.1f} s, {group_passes} teacher forward passes")
    print(f"ratio (one after another / group): wall {alone_s / group_s:.2f}x, teacher passes {alone_passes / group_passes:.2f}x")


if __name__ == "__main__":
    main()
