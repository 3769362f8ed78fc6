#!/usr/bin/env python3
"""The paper's micro-batch on CPU, end to end: a random teacher at V = 151,936 distilled into a small
student through one growth event, in one process, and as 1 teacher + 1 student ranks under mpirun
over the full channel and over the hidden channel; both must agree with the one process, and each
process's peak RSS must be within 20% of what `deepen plan` says for the same config.

  bench/paper_shape_rehearsal.py                   # DEEPEN=build/deepen, work in /tmp/deepen-paper-shape
  bench/paper_shape_rehearsal.py --deepen build/deepen --work DIR --threads 2 --only full

Shapes (docs/performance.md, "Paper shapes on CPU"): documents of ~24,000 byte tokens cut to their first
8,192 (data.packing = "documents", max_len = 8192), micro_batch = 2 -> 16,384 tokens and 2.49e9
logits per micro-batch, whose bf16 message is 4.98 GB (past 2^31 elements and bytes). The teacher is
random (2 layers x 256, 4/2 heads of 64, bf16; scripts/random_qwen3.py); the student has 2 layers of
hidden 512 at V = 151,936 (byte tokenizer, student.vocab_size widened), grown 1 -> 2 blocks over two
one-step stages, an eval of one batch at each stage end. parallel.max_in_flight = 1: what fits twice
(teacher and student process) in 24 GB; the plan's figures use the same setting.

Agreement: one student (S = 1) computes the same arithmetic in the same order in both layouts, and
the teacher's logits are made by the same chunked head (TeacherStage::head_into) whether they go to
a channel or stay in the process, or are made by the student from the teacher's hidden states with
the teacher's head, one loss chunk at a time; with the loss's rows per chunk the same in every run
(ROW_CHUNK), the losses, evals and diagnostics must be equal bit for bit (tolerance 0, as
tests/e2e/distributed_train.py holds its S = 1 layouts). Every run uses the same run.threads, so a
BLAS that splits sums by thread count cannot tell the layouts apart either.

Time (the goal is 15 minutes on 2 cores): three runs of the same arithmetic, each ~4.5 minutes of
its two steps, two evals and two sets of diagnostics at V = 151,936 (~30 TFLOP). The 1 + 1 runs are
started with `mpirun --bind-to none`: bound, each rank gets one core and its two threads take turns.

Watchdog: control.watchdog_s = 20, far below a step here (over a minute): a rank whose trainer
thread computes is alive (dist/control/activity.h), so a lone process computing its first step, a
student waiting on a teacher that computes, and a teacher in the final barrier while its student
evaluates and exports must all go on; a run the watchdog aborted fails the rehearsal.

Step time against the GEMM bound: each step of the one-process run (its record's data + teacher_wait
+ compute + grad_sync + optimizer: the step itself, not the growth, evals or records around it) is
printed against the step's GEMM bound at its depth, measured here by build/bench/step_bound
(bench/step_bound.h: at::mm at the step's shapes, the teacher's GEMMs in bf16 as teacher.dtype = "bf16"
runs them on CPU (model/teacher_stage.cpp computes in the dtype it loads), the student's in fp32, AdamW's
28 bytes per parameter over a measured bandwidth), measured once at depth 2 after the one-process run
(the depth-1 step's bound drops a block's GEMMs and AdamW bytes), as "step / bound = Y.YYx". On a CPU
without native bf16 (AVX2 only) at::mm in bf16 runs near 8 GFLOP/s against ~150 in fp32, so there the
teacher's head dominates the bound (minutes at these shapes).
--bound-only measures and prints the bound (and the one-process run's steps against it if the work
folder holds one) without running anything else.

Memory: goal within 20% of the plan (or 0.15 GiB for figures under a GiB, see ROUNDING_GIB). A
process's peak is its VmHWM, polled every 0.2 s while it runs. Measured = peak - the
baseline of a process whose model is a few KB (LibTorch, MPI, the shards: bench/memory_check's
method). Predicted, from `deepen plan CONFIG` (plan/memory_model.h): the student rank's "student at
full depth" peak; the teacher rank's "teacher, largest of P=1 stage(s)" total; one process holds both,
minus the teacher's outgoing buffers (its logits are the student's targets, counted there).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
GIB = 1024.0 ** 3
# `deepen plan` prints GiB to one decimal, each of a stage's three terms (weights, forward, buffers)
# within 0.05 of its value, and the baseline differs between processes by about 0.1 GiB (0.31 and
# 0.41 GiB in two runs here): below ~1 GiB a figure is only known to this, whatever 20% of it is.
ROUNDING_GIB = 0.15
VOCAB = 151936
# The loss's rows per chunk, the same in every run: the hidden channel's own choice at these shapes
# (fp32 logits, a teacher chunk made from hidden states, its bf16 GEMM's output: 10 bytes an
# element, 512 MiB / (151,936 x 10 B) = 353 rows, evened out to 349 over 47 chunks). With full bf16
# logits the budget would give 441; the chunking orders the head gradient's sum, so one row chunk
# for all runs makes the one-process run the bit-for-bit reference for both channels.
ROW_CHUNK = 349


def sh(cmd, log, env=None, timeout=3600):
    """Runs cmd (output to log); returns {pid: peak VmHWM bytes} of every deepen process it started
    and the wall seconds. Raises with the log's tail on a non-zero exit."""
    peaks, done = {}, threading.Event()
    with open(log, "w") as out:
        start = time.time()
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))

        def poll():
            while not done.is_set():
                for pid, hwm in deepen_peaks(p.pid).items():
                    peaks[pid] = max(peaks.get(pid, (0, ""))[0], hwm[0]), hwm[1]
                done.wait(0.2)
        t = threading.Thread(target=poll, daemon=True)
        t.start()
        try:
            rc = p.wait(timeout=timeout)
        finally:
            done.set()
            t.join()
        wall = time.time() - start
    if rc != 0:
        with open(log) as f:
            tail = f.read()[-4000:]
        raise SystemExit(f"FAILED ({rc}): {' '.join(cmd)}\n{tail}")
    return peaks, wall


def deepen_peaks(root):
    """{pid: (VmHWM bytes, rank)} of root and its descendants whose executable is deepen."""
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                todo += [int(c) for c in f.read().split()]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if not cmd[0].endswith(b"deepen"):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            rank = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"OMPI_COMM_WORLD_RANK=")), "")
            with open(f"/proc/{pid}/status") as f:
                hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
            out[pid] = (hwm, rank)
        except (OSError, StopIteration, ValueError):
            continue
    return out


def records(run_dir, name):
    path = os.path.join(run_dir, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def compare(a, b, what):
    """Equal bit for bit: every train step's losses and token counts, every eval, every diagnostic."""
    ma, mb = records(a, "metrics.jsonl"), records(b, "metrics.jsonl")
    assert len(ma) == len(mb) == 2, f"{what}: {len(ma)} and {len(mb)} train records, 2 expected"
    assert [m["depth"] for m in ma] == [1, 2], f"{what}: depths {[m['depth'] for m in ma]}, growth 1 -> 2 expected"
    n = 0
    for x, y in zip(ma, mb):
        for key in ("loss", "kl", "ce", "tokens", "grad_norm"):
            if key in x or key in y:
                assert x.get(key) == y.get(key), f"{what}: step {x['step']} {key} {x.get(key)} vs {y.get(key)}"
                n += 1
    ea, eb = records(a, "eval.jsonl"), records(b, "eval.jsonl")
    assert len(ea) == len(eb) >= 2, f"{what}: {len(ea)} and {len(eb)} evals"
    for x, y in zip(ea, eb):
        for key in ("val_ce", "val_kl"):
            assert x[key] == y[key], f"{what}: eval after step {x['step']} {key} {x[key]} vs {y[key]}"
            n += 1
    da, db = records(a, "diagnostics.jsonl"), records(b, "diagnostics.jsonl")
    assert json.dumps(da, sort_keys=True) == json.dumps(db, sort_keys=True), f"{what}: diagnostics differ"
    print(f"  {what}: equal bit for bit: {n} values over 2 steps (depth 1 -> 2) and {len(ea)} evals, "
          f"{len(da)} diagnostic records; losses {[x['loss'] for x in ma]}, val_kl {[x['val_kl'] for x in ea]}")


def plan_figures(deepen, base, sets, log):
    """(student peak GiB, teacher stage {weights, forward, buffers, total} GiB) from `deepen plan`."""
    cmd = [deepen, "plan", base, "--layout", "1,1,1"]
    for s in sets:
        cmd += ["--set", s]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    with open(log, "w") as f:
        f.write(text)
    student = re.search(r"student at full depth.*?(?:peak )?([\d.]+) -> (?:fits|does NOT fit)", text, re.S)
    teacher = re.search(r"teacher, largest of P=1 stage\(s\).*?: weights ([\d.]+) \+ forward ([\d.]+) \+ \d+ outgoing "
                        r"micro-batches ([\d.]+) = ([\d.]+)", text)
    if not student or not teacher:
        raise SystemExit(f"could not read the memory section of `deepen plan` (see {log})")
    w, fwd, buf, tot = (float(v) for v in teacher.groups())
    return float(student.group(1)), {"weights": w, "forward": fwd, "buffers": buf, "total": tot}


def step_bound(step_bound_bin, threads, student_layers, log):
    """The step_bound CLI's JSON for this rehearsal's step with `student_layers` blocks (the shapes of
    base.toml below and of the teacher made with scripts/random_qwen3.py)."""
    cmd = [step_bound_bin, "--teacher-layers", "2", "--teacher-hidden", "256", "--teacher-heads", "4",
           "--teacher-kv-heads", "2", "--teacher-head-dim", "64", "--teacher-intermediate", "768",
           "--teacher-dtype", "bf16", "--student-layers", str(student_layers), "--student-hidden", "512",
           "--student-heads", "8", "--student-kv-heads", "4", "--student-head-dim", "64",
           "--student-intermediate", "1024", "--tied", "--vocab", str(VOCAB), "--batch", "2", "--seq", "8192",
           "--threads", str(threads), "--reps", "2"]
    with open(log, "w") as err:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    if out.returncode != 0:
        raise SystemExit(f"FAILED: {' '.join(cmd)} (see {log})")
    return json.loads(out.stdout)


def report_bound(step_bound_bin, threads, run_dir, logs):
    """Each train step of the one-process run against the GEMM bound at its depth."""
    if not os.path.exists(step_bound_bin):
        print(f"  no step bound: {step_bound_bin} is not built (cmake --build build --target step_bound)")
        return
    # The step's own parts (run_folder/step_time.h): what follows a step's record (growth, eval,
    # diagnostics, checkpoint, records) lands in the next record and is not the step's work.
    step_parts = ("data", "teacher_wait", "compute", "grad_sync", "optimizer")
    steps = records(run_dir, "metrics.jsonl") if run_dir else []
    # Measured once, at the full depth (2 blocks): the head GEMMs dominate and take minutes at these
    # shapes. A shallower step's bound drops the blocks it does not run: their GEMMs (each block's are
    # timed alike, count = depth) and their parameters' AdamW bytes at the measured bandwidth.
    log = os.path.join(logs, "step-bound.log")
    full = step_bound(step_bound_bin, threads, 2, log)
    block_s = sum(g["seconds"] / g["count"] for g in full["gemms"] if g["part"].startswith("student layers"))
    # A block's parameters: its projections' weights (each forward GEMM's k x n), its two RMSNorms
    # (hidden 512) and its q/k norms (head_dim 64).
    block_params = sum(g["k"] * g["n"] for g in full["gemms"] if g["name"].startswith("student layer")
                       and g["name"].endswith("forward")) + 2 * 512 + 2 * 64
    def bound_at(depth):
        return full["bound_s"] - (2 - depth) * (block_s + 28 * block_params / (full["stream_gb_per_s"] * 1e9))
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in full["parts_s"].items())
    print(f"  GEMM bound at depth 2 ({threads} threads, load {full['load_average']}; {log}): {full['bound_s']:.1f} s = GEMMs "
          f"{full['gemm_s']:.1f} s ({full['gemm_flops'] / 1e12:.2f} TFLOP) + AdamW {full['adamw_s']:.2f} s "
          f"({full['adamw_bytes'] / 1e9:.2f} GB at {full['stream_gb_per_s']:.1f} GB/s); {parts}; not in it: attention "
          f"{full['attention_flops'] / 1e12:.2f} TFLOP; at depth 1: {bound_at(1):.1f} s")
    for m in steps:
        t = m["time"]
        step_s = sum(t.get(k, 0.0) for k in step_parts)
        bound = bound_at(m["depth"])
        print(f"  one process, step {m['step']} (depth {m['depth']}): {step_s:.1f} s ("
              + ", ".join(f"{k} {t.get(k, 0.0):.1f}" for k in step_parts)
              + f"; the record's {m['time_s']:.1f} s with what ran between steps) = {100 * bound / step_s:.0f}% of "
              f"the bound; step / bound = {step_s / bound:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deepen", default=os.environ.get("DEEPEN", "build/deepen"))
    ap.add_argument("--work", default="/tmp/deepen-paper-shape")
    ap.add_argument("--threads", type=int, default=2, help="run.threads of every run (equal, see above)")
    ap.add_argument("--only", choices=["full", "hidden"], help="the one process and one channel's 1 + 1 run")
    ap.add_argument("--step-bound", help="the step_bound binary (default: bench/step_bound beside --deepen)")
    ap.add_argument("--bound-only", action="store_true", help="measure the step's GEMM bound (and set the work "
                    "folder's one-process run against it, if it holds one); run nothing else")
    a = ap.parse_args()
    deepen = os.path.abspath(a.deepen)
    work = os.path.abspath(a.work)
    step_bound_bin = os.path.abspath(a.step_bound or os.path.join(os.path.dirname(deepen), "bench", "step_bound"))
    if a.bound_only:
        logs = os.path.join(work, "logs")
        os.makedirs(logs, exist_ok=True)
        single = os.path.join(work, "full-single")
        report_bound(step_bound_bin, a.threads, single if records(single, "metrics.jsonl") else None, logs)
        return
    here = os.path.dirname(os.path.abspath(__file__))
    os.makedirs(os.path.join(work, "text"), exist_ok=True)
    t0 = time.time()

    # Documents longer than max_len: 12 of ~24,000 bytes (byte tokens), structured text so losses move.
    import random
    words = "the growth of a student follows teacher norm block layer residual stream attention head".split()
    rng = random.Random(1)
    for part in range(12):
        with open(os.path.join(work, "text", f"part{part}.txt"), "w") as f:
            f.write("".join(rng.choice(words) + (".\n" if rng.random() < 0.15 else " ") for _ in range(3400)))
    base = os.path.join(work, "base.toml")
    with open(base, "w") as f:
        f.write(f"""[run]
seed = 1
device = "cpu"
threads = {a.threads}
[data]
tokenizer = "bytes"
sources = ["{work}/text"]
train = "{work}/data/train"
valid = "{work}/data/valid"
packing = "documents"
max_len = 8192
valid_fraction = 0.1
[teacher]
checkpoint = "{work}/teacher"
dtype = "bf16"
cpu_kernels = "fused"
[student]
layers = 2
hidden = 512
heads = 8
kv_heads = 4
head_dim = 64
intermediate = 1024
vocab_size = {VOCAB}
cpu_kernels = "fused"
[curriculum]
mode = "grow"
stage_steps = [1, 1]
[distill]
channel_dtype = "bf16"
row_chunk = {ROW_CHUNK}
[optim]
lr = 1e-4
warmup_steps = 1
[parallel]
micro_batch = 2
max_in_flight = 1
[eval]
every = 100000
batches = 1
diagnostics_every = 0
diagnostic_batch = 1
[checkpoint]
every = 0
keep = 1
[control]
watchdog_s = 20
""")
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    print(f"paper-shape rehearsal in {work} ({os.cpu_count()} cores, run.threads = {a.threads})")
    sh([deepen, "prep", base, "--no-progress", "--overwrite"], os.path.join(logs, "prep.log"))
    if not os.path.exists(os.path.join(work, "teacher", "model.safetensors")):
        sh([sys.executable, os.path.join(here, "..", "scripts", "random_qwen3.py"), os.path.join(work, "teacher"),
            "--layers", "2", "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--head-dim", "64",
            "--intermediate", "768", "--vocab", str(VOCAB)], os.path.join(logs, "teacher.log"))

    # The baseline: the same binary and shards, a model of a few KB (bench/memory_check's method).
    tiny = ["student.layers=1", "student.hidden=8", "student.heads=1", "student.kv_heads=1", "student.head_dim=8",
            "student.intermediate=8", "student.vocab_size=259", "data.max_len=8", "parallel.micro_batch=1",
            "curriculum.mode=\"joint\"", "curriculum.stage_steps=[2]", "eval.batches=1", "run.threads=1"]
    cmd = [deepen, "pretrain", base, "--fresh", "--quiet", "--set", f'run.out_dir="{work}/baseline"']
    for s in tiny:
        cmd += ["--set", s]
    peaks, _ = sh(cmd, os.path.join(logs, "baseline.log"))
    baseline = max(v[0] for v in peaks.values())
    print(f"  baseline process (a few KB of model): peak RSS {baseline / GIB:.2f} GiB")

    failures = []
    plans = {}
    for channel in ("full", "hidden"):
        plans[channel] = plan_figures(deepen, base, [f'distill.logits="{channel}"'], os.path.join(logs, f"plan-{channel}.log"))
        student_gib, teacher = plans[channel]
        print(f"## plan, distill.logits = \"{channel}\": student {student_gib:.1f} GiB; teacher stage {teacher['total']:.1f} GiB "
              f"(weights {teacher['weights']:.1f} + forward {teacher['forward']:.1f} + 1 outgoing micro-batch "
              f"{teacher['buffers']:.1f})")

    def train(channel, ranks):
        """One run; returns its folder after checking each process's peak RSS against the plan."""
        layout = "single" if ranks == 1 else "1+1"
        out = os.path.join(work, f"{channel}-{layout.replace('+', 'x')}")
        cmd = [deepen, "train", base, "--fresh", "--quiet", "--set", f'run.out_dir="{out}"',
               "--set", f'distill.logits="{channel}"']
        if ranks > 1:
            # Unbound: mpirun would pin each of the 2 ranks to one core (its default for 2 or fewer),
            # and each rank's run.threads would take turns on it (deepen warns; a 1.7x slower student).
            cmd = ["mpirun", "-np", str(ranks), "--bind-to", "none"] + cmd
        peaks, wall = sh(cmd, os.path.join(logs, f"{channel}-{layout}.log"), env=MPI_ENV if ranks > 1 else None)
        by_rank = sorted(peaks.values(), key=lambda v: v[1])
        student_gib, teacher = plans[channel]
        if ranks == 1:
            predicted = {"one process": student_gib + teacher["total"] - teacher["buffers"]}
            measured = {"one process": by_rank[0][0]}
        else:
            predicted = {"teacher rank": teacher["total"], "student rank": student_gib}
            measured = {"teacher rank": next(v[0] for v in by_rank if v[1] == "0"),
                        "student rank": next(v[0] for v in by_rank if v[1] == "1")}
        for who, gib_pred in predicted.items():
            got = (measured[who] - baseline) / GIB
            ratio = got / gib_pred
            ok = abs(got - gib_pred) <= max(0.2 * gib_pred, ROUNDING_GIB)
            print(f"  {channel} {layout:6s} {who:13s}: {wall:6.0f} s; peak RSS {measured[who] / GIB:5.2f} GiB, minus "
                  f"baseline {got:5.2f} GiB vs plan {gib_pred:5.2f} GiB: {ratio:.2f}x {'ok' if ok else 'OUTSIDE'}")
            if not ok:
                failures.append(f"{channel} {layout} {who}: measured {got:.2f} GiB vs plan {gib_pred:.2f} GiB")
        return out

    # One process (the teacher's head makes full logits in it), then each channel's 1 + 1 ranks.
    single = train("full", 1)
    report_bound(step_bound_bin, a.threads, single, logs)
    for channel in ([a.only] if a.only else ["full", "hidden"]):
        pair = train(channel, 2)
        compare(single, pair, f"one process vs 1 teacher + 1 student over the {channel} channel")
        last = records(pair, "metrics.jsonl")[-1]
        if "channel_bytes" in last:
            print(f"  {channel} 1+1: channel bytes at the last step {last['channel_bytes']:,}")
    print(f"rehearsal: {'ok' if not failures else 'FAILED'} in {time.time() - t0:.0f} s")
    for f in failures:
        print("  " + f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
