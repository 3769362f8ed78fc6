#!/usr/bin/env python3
"""End-to-end checks of `deepen train` under mpirun against the single-process run.

Each case is one ctest test (see tests/CMakeLists.txt); `setup` builds the shared fixture (byte-level
shards of Debian's license texts and a tiny teacher trained by `deepen pretrain`) that the others use.

  python3 tests/e2e/distributed_train.py --deepen build/deepen --work build/tests/e2e CASE

Cases:
  setup            prep + pretrain the fixture teacher
  layout-1x2+2     1 pipeline x 2 stages + 2 students == single process (loss, eval), through growth
  layout-2x1+4     2 pipelines x 1 stage + 4 students == single process
  layout-1x3+1     3-stage pipeline, one student: bit-identical to the single process
  pipelines-2x1+4  parallel.rank_order = "pipelines" (each pipeline's stages, then its students):
  pipelines-2x2+2  == single process; every rank's step_time/ role is the one that order gives it;
                   bit-identical to the same layout in the roles order
  topk             top-k channel == single-process top-k; channel bytes/token = k*(4+4) + header
  hidden-1x1+1     hidden-state channel (students hold the teacher's head) == single-process hidden,
  hidden-1x2+2     on three layouts; channel bytes/token = 4*hidden + header (fp32 on the wire)
  hidden-2x1+2
  resume           a distributed run stopped after 5 steps (exit 3) and rerun == uninterrupted
  paper            the paper's protocol (student.init = teacher, phase_policy = reset, post-norm with
                   its entry norm): 1 pipeline x 2 stages + 2 students == single process
  desync           a student given the wrong batch: non-zero exit naming the step and ranks
  global-batch     parallel.global_batch = 8 on S = 1 (one process), S = 2 (1x1+2), S = 4 (2x1+4): the
                   derived grad_accum is 4, 2, 1 and the runs follow the same curve, through growth;
                   every rank's step_time/ records cover its wall time within 5%
  resume-layout    a run on 2x1+4 stopped after 5 steps, resumed on 1x2+2 (same global batch) ==
                   continuing on 2x1+4
  resume-rank-order  a 2x1+4 run in the pipelines order stopped after 5 steps, resumed in the roles
                   order (rank_order is a layout setting) == continuing in the pipelines order
  sweep            `deepen study` of one joint run on 6 layouts (1 to 7 ranks), then `deepen report`:
                   the scaling table (a row per layout, each with the model's prediction and its
                   error), scaling.csv and the figure
  sharded-2        parallel.sharding = "grad_op" (gradients reduce-scattered, AdamW moments sharded,
  sharded-3        parameters all-gathered) on S = 2, 3, 4 students, stopped after step 5 and resumed,
  sharded-4        == the replicated run on the same layout, through two growth events (moments kept and
                   re-sharded on S = 3, phase resets on S = 2, 4), clipping on; the checkpoint holds one
                   optimizer shard per student. sharded-4 also resumes its S = 4 checkpoint on S = 2.
  sharded-full-2   the same with parallel.sharding = "full" (and student.recompute = "layer"): each
  sharded-full-3   block's parameters sharded between uses, gathered for its forward and its
  sharded-full-4   recomputed backward; every micro-batch's gradients reduce-scattered.
  shard-write-fails  a sharded run whose student 1 cannot write its optimizer shard at a checkpoint:
                   every rank stops with an error (student 1's names the file), no checkpoint folder
                   for that step and no staging folder are left, the previous checkpoint is intact,
                   and the run resumes from it to the end
  overlap          parallel.overlap_grad_reduce = false vs true (buckets launched from inside the last
                   micro-batch's backward; every micro-batch's under "full"), replicated, grad_op and
                   full on S = 3: bit-identical
  gpu-asked        a 2-rank job asking for CUDA and NCCL where they cannot be had fails at start
                   with exit 2 naming the key, nothing trained: no silent CPU or MPI run
  lock             a second `deepen train` on a run folder that a running job writes is refused (exit
                   2, naming the holder's host and pid) and the first goes on; after kill -9 of the
                   holder the next start takes its lock over and resumes
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}

# The run every case trains (its layout, budget and options changed with --set), shared with the
# trainer tests: CPU, MPI and the fp32 CPU kernels pinned there, as these runs are compared bit for
# bit (on a one-GPU machine "auto" would put several ranks on the same GPU).
TINY_RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "tiny_run.toml")


def tiny_run_toml(work):
    """tests/fixtures/tiny_run.toml on the fixture's data and teacher; run.out_dir is always --set."""
    with open(TINY_RUN) as f:
        return f.read().format(name="run", out_dir=f"{work}/run", device="cpu", train=f"{work}/data/train",
                               valid=f"{work}/data/valid", teacher=f"{work}/teacher/final/hf", keep=3)


TEACHER = """
[run]
threads = 1
device = "cpu"
out_dir = "{work}/teacher"
[data]
tokenizer = "bytes"
train = "{work}/data/train"
valid = "{work}/data/valid"
seq_len = 32
[student]
layers = 3
hidden = 48
heads = 4
kv_heads = 2
head_dim = 12
intermediate = 96
[curriculum]
mode = "joint"
stage_steps = [20]
[optim]
lr = 3e-3
warmup_steps = 2
[parallel]
micro_batch = 8
[eval]
every = 10
batches = 2
diagnostics_every = 0
[checkpoint]
every = 0
"""


def run(cmd, env=None, check=True):
    full_env = dict(os.environ, **(env or {}))
    p = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=600)
    if check and p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-5000:])
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(cmd)}")
    return p


def records(run_dir, name):
    with open(os.path.join(run_dir, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def rank_pid(run_dir, rank_variable, rank):
    """The pid of the deepen rank whose command line names run_dir and whose environment has
    rank_variable=rank (mpirun: OMPI_COMM_WORLD_RANK; srun: SLURM_PROCID)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"deepen") and any(run_dir.encode() in c for c in cmd) and \
                f"{rank_variable}={rank}".encode() in env:
            return int(pid)
    raise AssertionError(f"no process for rank {rank} of {run_dir}")


class Cases:
    def __init__(self, deepen, work):
        self.deepen, self.work = deepen, os.path.abspath(work)
        self.base = os.path.join(self.work, "base.toml")

    def train(self, out, sets=(), ranks=1, env=None, check=True, extra=(), base=None):
        cmd = [self.deepen, "train", base or self.base, "--fresh", "--quiet", "--set", f'run.out_dir="{out}"']
        for s in sets:
            cmd += ["--set", s]
        cmd += list(extra)
        if ranks > 1:
            cmd = ["mpirun", "-np", str(ranks)] + cmd
        return run(cmd, env=dict(MPI_ENV, **(env or {})), check=check)

    def compare(self, a, b, tol, what, spread_stats=True):
        ma, mb = records(a, "metrics.jsonl"), records(b, "metrics.jsonl")
        assert len(ma) == len(mb) == 9, (len(ma), len(mb))
        worst = 0.0
        for x, y in zip(ma, mb):
            assert x["depth"] == y["depth"], (x, y)
            # Token counts are integers (with documents: the real targets, padding left out): exact.
            assert (x["tokens"], x["active_layer_tokens"]) == (y["tokens"], y["active_layer_tokens"]), (x, y)
            for key in ("loss", "kl", "ce"):
                rel = abs(x[key] - y[key]) / abs(x[key])
                worst = max(worst, rel)
                assert rel <= tol, f"{what}: step {x['step']} {key} {x[key]} vs {y[key]} (rel {rel:.2e} > {tol})"
        ea, eb = records(a, "eval.jsonl"), records(b, "eval.jsonl")
        assert [e["step"] for e in ea] == [e["step"] for e in eb]
        for x, y in zip(ea, eb):
            for key in ("val_ce", "val_kl"):
                rel = abs(x[key] - y[key]) / abs(x[key])
                worst = max(worst, rel)
                assert rel <= tol, f"{what}: eval after step {x['step']} {key} {x[key]} vs {y[key]}"
        # Diagnostics (student 0's model on the fixed batch): the same points and the same values.
        da, db = records(a, "diagnostics.jsonl"), records(b, "diagnostics.jsonl")
        assert [(d["step"], d["event"]) for d in da] == [(d["step"], d["event"]) for d in db], (da, db)
        assert [d["event"] for d in da].count("final") == 1, [d["event"] for d in da]
        values = 0
        for x, y in zip(da, db):
            pairs = []
            for bx, by in zip(x["block_rms"], y["block_rms"]):
                for part in ("document_boundary", "regular"):
                    assert bx[part]["count"] == by[part]["count"], (x["step"], part)
                    stats = ("mean", "std", "kurtosis") if spread_stats else ("mean",)
                    pairs += [(f"block_rms {part} {k}", bx[part][k], by[part][k]) for k in stats]
            if "block_removal" in x:
                rx, ry = x["block_removal"], y["block_removal"]
                pairs.append(("full_ce", rx["full_ce"], ry["full_ce"]))
                for bx, by in zip(rx["blocks"], ry["blocks"]):
                    pairs += [(f"block {bx['block']} {k}", bx[k], by[k]) for k in ("ce_without", "angle")]
            for name, u, v in pairs:
                if u is None or v is None:  # a statistic without data (one token: no kurtosis)
                    assert u is None and v is None, f"{what}: diagnostics after step {x['step']} {name} {u} vs {v}"
                    continue
                rel = abs(u - v) / abs(u) if u else abs(v)
                worst = max(worst, rel)
                values += 1
                assert rel <= tol, f"{what}: diagnostics after step {x['step']} {name} {u} vs {v} (rel {rel:.2e} > {tol})"
        print(f"{what}: 9 steps (depth 1 -> 3), {len(ea)} evals, {len(da)} diagnostic points ({values} values), "
              f"worst relative difference {worst:.2e} (tolerance {tol})")

    def setup(self):
        shutil.rmtree(self.work, ignore_errors=True)  # a rerun starts from a clean fixture
        os.makedirs(self.work, exist_ok=True)
        with open(os.path.join(self.work, "prep.toml"), "w") as f:
            f.write(f'[data]\ntokenizer = "bytes"\nsources = ["/usr/share/common-licenses"]\n'
                    f'train = "{self.work}/data/train"\nvalid = "{self.work}/data/valid"\nvalid_fraction = 0.2\n')
        run([self.deepen, "prep", os.path.join(self.work, "prep.toml")])
        with open(os.path.join(self.work, "teacher.toml"), "w") as f:
            f.write(TEACHER.format(work=self.work))
        run([self.deepen, "pretrain", os.path.join(self.work, "teacher.toml"), "--fresh", "--quiet"])
        with open(self.base, "w") as f:
            f.write(tiny_run_toml(self.work))
        print("fixture ready:", self.work)

    def layout(self, pipelines, stages, students):
        tag = f"{pipelines}x{stages}+{students}"
        layout = [f"parallel.teacher_pipelines={pipelines}", f"parallel.teacher_stages={stages}",
                  f"parallel.students={students}"]
        single = os.path.join(self.work, f"single-{tag}")
        dist = os.path.join(self.work, f"dist-{tag}")
        self.train(single, layout)
        self.train(dist, layout, ranks=pipelines * stages + students)
        tol = 0.0 if students == 1 else 1e-5
        self.compare(single, dist, tol, f"layout {tag}")

    def pipelines(self, pipelines, stages, students):
        # The pipelines order moves ranks, not work: the same groups with the same keys, so the same
        # sums in the same order as the roles order (layout cases: 1e-5 against the single process).
        tag = f"{pipelines}x{stages}+{students}"
        sets = [f"parallel.teacher_pipelines={pipelines}", f"parallel.teacher_stages={stages}",
                f"parallel.students={students}", 'parallel.rank_order="pipelines"']
        single = os.path.join(self.work, f"single-pipelines-{tag}")
        dist = os.path.join(self.work, f"dist-pipelines-{tag}")
        self.train(single, sets)
        world = pipelines * stages + students
        self.train(dist, sets, ranks=world)
        self.compare(single, dist, 0.0 if students == 1 else 1e-5, f"rank order pipelines {tag}")
        # The run really used that order: rank r's role (from its own step_time records) is
        # pipeline by pipeline, stages then students, not teachers first.
        group = stages + students // pipelines
        want = ["teacher" if r % group < stages else "student" for r in range(world)]
        got = [records(os.path.join(dist, "step_time"), f"rank{r}.jsonl")[0]["role"] for r in range(world)]
        assert got == want, (got, want)
        roles_order = ["teacher"] * (pipelines * stages) + ["student"] * students
        assert got != roles_order, "the pipelines order must differ from the roles order here"
        print(f"rank order pipelines {tag}: roles by rank {got}")
        # Same groups, same keys, same arithmetic: the roles order's run is bit-identical.
        roles = os.path.join(self.work, f"dist-roles-{tag}")
        self.train(roles, sets[:-1], ranks=world)
        self.compare(roles, dist, 0.0, f"rank order pipelines {tag} vs roles {tag}")

    def topk(self):
        sets = ['distill.logits="topk"', "distill.topk=8", "parallel.teacher_stages=2", "parallel.students=2"]
        single = os.path.join(self.work, "single-topk")
        dist = os.path.join(self.work, "dist-topk")
        self.train(single, sets)
        self.train(dist, sets, ranks=4)
        self.compare(single, dist, 1e-5, "top-k channel")
        # Per train micro-batch: header 64 B + rows * k * (4 B value + 4 B index); evals go as full
        # fp32 logits. Student 0's channel counts only its own micro-batches.
        m = records(dist, "metrics.jsonl")
        rows, k, micro_per_step = 2 * 32, 8, 2
        per_train_batch = 64 + rows * k * 8
        first_step_bytes = m[0]["channel_bytes"]
        assert first_step_bytes == micro_per_step * per_train_batch, (first_step_bytes, per_train_batch)
        print(f"top-k k=8: {per_train_batch / rows:.1f} bytes/token on the channel "
              f"(k*(4+4) = 64 + 64-byte header per {rows}-token micro-batch); full fp32 would be {320 * 4} bytes/token")

    def hidden(self, pipelines, stages, students):
        # The teacher's last stage sends its final normalised hidden states, the students make the
        # logits with their copy of its head, chunk by chunk inside the loss; the single process
        # does the same with a headless local teacher, so one student is bit-identical (tolerance
        # 0) and two or more students differ only by the gradient average's order (1e-5, as the
        # layout cases). Prefetch is on in the distributed run: the results must not change.
        tag = f"{pipelines}x{stages}+{students}"
        sets = ['distill.logits="hidden"', f"parallel.teacher_pipelines={pipelines}",
                f"parallel.teacher_stages={stages}", f"parallel.students={students}"]
        single = os.path.join(self.work, f"single-hidden-{tag}")
        dist = os.path.join(self.work, f"dist-hidden-{tag}")
        self.train(single, sets)
        self.train(dist, sets, ranks=pipelines * stages + students)
        self.compare(single, dist, 0.0 if students == 1 else 1e-5, f"hidden-state channel {tag}")
        # Per train micro-batch: header 64 B + rows * hidden * 4 B (fp32 wire; the teacher is 48 wide).
        m = records(dist, "metrics.jsonl")
        rows, hidden, micro_per_step = 2 * 32, 48, 2
        per_train_batch = 64 + rows * hidden * 4
        assert m[0]["channel_bytes"] == micro_per_step * per_train_batch, (m[0]["channel_bytes"], per_train_batch)
        print(f"hidden channel {tag}: {per_train_batch / rows:.1f} bytes/token "
              f"(4*hidden = {4 * hidden} + 64-byte header per {rows}-token micro-batch)")

    def resume(self):
        sets = ["parallel.teacher_stages=2", "parallel.students=2"]
        whole = os.path.join(self.work, "dist-whole")
        split = os.path.join(self.work, "dist-split")
        self.train(whole, sets, ranks=4)
        p = self.train(split, sets, ranks=4, check=False, extra=["--stop-after", "5"])
        assert p.returncode == 3, f"stopped run should exit 3 (requeue), got {p.returncode}: {p.stderr[-2000:]}"
        assert len(records(split, "metrics.jsonl")) == 5
        cmd = ["mpirun", "-np", "4", self.deepen, "train", self.base, "--quiet", "--set", f'run.out_dir="{split}"'] + \
              sum([["--set", s] for s in sets], [])
        run(cmd, env=MPI_ENV)
        self.compare(whole, split, 1e-6, "distributed resume after a stop at step 5")

    def paper(self):
        # The teacher is 48 wide: init = "teacher" needs the student at the teacher's width.
        # The rest of the protocol (docs/protocol.md) at this scale: unpacked documents, a fixed shard
        # the grow phases replay, a fixed validation set, 0.7 KL + 0.3 CE, wd 0, clip 0.5. This
        # corpus's documents are all longer than max_len, so no row is padded here; padding is tested
        # in one process (tests/train/document_batch_test.cpp, tests/launch/documents_train_test.cpp).
        sets = ["student.init=teacher", "student.tie_embeddings=false", "student.hidden=48", "student.head_dim=12",
                "student.norm=post", "curriculum.phase_policy=reset",
                "data.packing=documents", "data.max_len=40", "data.replay_shard_tokens=200", "data.valid_documents=4",
                "distill.alpha=0.7", "optim.weight_decay=0", "optim.grad_clip=0.5",
                "parallel.teacher_pipelines=1", "parallel.teacher_stages=2", "parallel.students=2"]
        single = os.path.join(self.work, "single-paper")
        dist = os.path.join(self.work, "dist-paper")
        self.train(single, sets)
        self.train(dist, sets, ranks=4)
        # Two students average their gradients in another order than one process accumulating
        # both: the layout cases' 1e-5 bound applies.
        # Post-norm with an entry norm makes every token's RMS at a block boundary nearly the same
        # (std ~2e-4 of the mean at step 2): the std and kurtosis of so tight a distribution carry
        # cancellation error of order tol·mean/std, far above tol. Losses, evals, the RMS means and
        # block removal are compared at 1e-5; the spread statistics are not.
        self.compare(single, dist, 1e-5, "paper protocol (init=teacher, reset, documents, alpha 0.7)", spread_stats=False)

    def global_base(self):
        """base.toml without grad_accum: it follows from parallel.global_batch and the students."""
        path = os.path.join(self.work, "base-global.toml")
        with open(self.base) as f:
            text = f.read()
        assert "grad_accum = 2\n" in text
        with open(path, "w") as f:
            f.write(text.replace("grad_accum = 2\n", "global_batch = 8\n"))
        return path

    def saved_grad_accum(self, run_dir):
        with open(os.path.join(run_dir, "config.toml")) as f:
            for line in f:
                if line.startswith("grad_accum = "):
                    return int(line.split("=")[1])
        raise AssertionError(f"{run_dir}/config.toml has no grad_accum")

    def check_step_times(self, run_dir, ranks):
        """Every rank wrote a time breakdown for each of the 9 steps, and its timed parts cover the
        rank's wall time: summed over the run, within 5% of the steps' total (the parts are timed
        spans, not a remainder; what no span covers is loop bookkeeping). Per step the worst is
        printed, not asserted: a step of ~2 ms on 2 shared cores can lose a whole time slice to the
        scheduler in an untimed gap."""
        by_rank = {}
        for name in os.listdir(os.path.join(run_dir, "step_time")):
            by_rank[int(name[4:-6])] = records(os.path.join(run_dir, "step_time"), name)
        assert sorted(by_rank) == list(range(ranks)), (run_dir, sorted(by_rank))
        worst_step, worst_rank = 1.0, 1.0
        for rank, recs in by_rank.items():
            assert [r["step"] for r in recs] == list(range(9)), (rank, [r["step"] for r in recs])
            total = sum(r["time_s"] for r in recs)
            parts = sum(sum(r["parts"].values()) for r in recs)
            assert 0.95 * total <= parts <= total * (1 + 1e-9), f"rank {rank}: parts {parts:.4f} s of {total:.4f} s"
            worst_rank = min(worst_rank, parts / total)
            worst_step = min([worst_step] + [sum(r["parts"].values()) / r["time_s"] for r in recs if r["time_s"] > 0])
        roles = sorted({r["role"] for recs in by_rank.values() for r in recs})
        print(f"{run_dir}: {ranks} ranks ({', '.join(roles)}): timed parts cover >= {100 * worst_rank:.1f}% of each "
              f"rank's time (worst single step {100 * worst_step:.1f}%)")

    def global_batch(self):
        base = self.global_base()
        one = os.path.join(self.work, "global-s1")
        self.train(one, ["parallel.students=1"], base=base)
        assert self.saved_grad_accum(one) == 4
        self.check_step_times(one, 1)
        # The single process is the reference: each layout sums the same 8 sequences' gradients in
        # another order (accumulation vs all-reduce), so the layout cases' 1e-5 bound applies.
        for pipelines, students, accum in ((1, 2, 2), (2, 4, 1)):
            out = os.path.join(self.work, f"global-s{students}")
            self.train(out, [f"parallel.teacher_pipelines={pipelines}", f"parallel.students={students}"],
                       ranks=pipelines + students, base=base)
            assert self.saved_grad_accum(out) == accum, (out, self.saved_grad_accum(out))
            self.check_step_times(out, pipelines + students)
            self.compare(one, out, 1e-5, f"global batch 8: S=1 (accum 4) vs S={students} (accum {accum})")

    def resume_layout(self):
        base = self.global_base()
        four = ["parallel.teacher_pipelines=2", "parallel.students=4"]
        two = ["parallel.teacher_stages=2", "parallel.students=2"]
        whole = os.path.join(self.work, "layout-whole")
        moved = os.path.join(self.work, "layout-moved")
        self.train(whole, four, ranks=6, base=base)
        p = self.train(moved, four, ranks=6, check=False, extra=["--stop-after", "5"], base=base)
        assert p.returncode == 3, f"stopped run should exit 3 (requeue), got {p.returncode}: {p.stderr[-2000:]}"
        cmd = ["mpirun", "-np", "4", self.deepen, "train", base, "--quiet", "--set", f'run.out_dir="{moved}"'] + \
              sum([["--set", s] for s in two], [])
        run(cmd, env=MPI_ENV)
        with open(os.path.join(moved, "run.json")) as f:
            assert json.load(f)["students"] == 2
        assert self.saved_grad_accum(moved) == 2
        # Steps 0-4 ran on 4 students, 5-8 on 2: sums in another order after the move (1e-5, as above).
        self.compare(whole, moved, 1e-5, "resume of a 2x1+4 run on 1x2+2 after step 5")

    def resume_rank_order(self):
        layout = ["parallel.teacher_pipelines=2", "parallel.students=4"]
        pipes = layout + ['parallel.rank_order="pipelines"']
        whole = os.path.join(self.work, "order-whole")
        moved = os.path.join(self.work, "order-moved")
        self.train(whole, pipes, ranks=6)
        p = self.train(moved, pipes, ranks=6, check=False, extra=["--stop-after", "5"])
        assert p.returncode == 3, f"stopped run should exit 3 (requeue), got {p.returncode}: {p.stderr[-2000:]}"
        cmd = ["mpirun", "-np", "6", self.deepen, "train", self.base, "--quiet", "--set", f'run.out_dir="{moved}"'] + \
              sum([["--set", s] for s in layout], [])
        run(cmd, env=MPI_ENV)
        with open(os.path.join(moved, "config.toml")) as f:
            assert 'rank_order = "roles"' in f.read(), "the resumed run records the order it ran in"
        # The resume tolerance of the `resume` case (a stop and restart, same sums otherwise).
        self.compare(whole, moved, 1e-6, "resume of a pipelines-order 2x1+4 run in the roles order after step 5")

    def sweep(self):
        base = self.global_base()
        layouts = [(1, 1, 1), (1, 1, 2), (1, 2, 2), (2, 1, 2), (1, 1, 4), (1, 3, 4)]
        out = os.path.join(self.work, "sweep")
        shutil.rmtree(out, ignore_errors=True)
        study = os.path.join(self.work, "sweep.toml")
        with open(study, "w") as f:
            f.write(f'[study]\nname = "sweep"\nbase = "{base}"\nout_dir = "{out}"\nseeds = [1]\nlauncher = "auto"\n'
                    'set = ["curriculum.mode=joint", "curriculum.stages=[3]", "curriculum.stage_steps=[8]", '
                    '"eval.every=1000", "eval.batches=1", "eval.diagnostics_every=0", "checkpoint.every=0"]\n')
            for t, p, n in layouts:
                f.write(f'\n[[run]]\nname = "sweep-t{t}p{p}s{n}"\nset = ["parallel.teacher_pipelines={t}", '
                        f'"parallel.teacher_stages={p}", "parallel.students={n}"]\n')
        run([self.deepen, "study", study, "--quiet"], env=MPI_ENV)
        report = os.path.join(out, "report")
        run([self.deepen, "report", out, "--out", report])
        with open(os.path.join(report, "report.md")) as f:
            md = f.read()
        assert "## Scaling: sweep" in md, md[-3000:]
        table = md[md.index("## Scaling: sweep"):]
        expected = ["one process"] + [f"{t}x{p}+{n}" for t, p, n in layouts[1:]]
        with open(os.path.join(report, "scaling.csv")) as f:
            rows = [line.rstrip("\n").split(",") for line in f][1:]
        assert sorted(r[1] for r in rows) == sorted(expected), rows
        for r in rows:
            assert float(r[6]) > 0 and r[9] and r[10], f"layout {r[1]}: no measurement or no prediction: {r}"
            assert f"| {r[1]} |" in table, r[1]
        assert "Where a student rank's step goes" in table and "Where a teacher rank's step goes" in table, table
        assert os.path.exists(os.path.join(report, "scaling_sweep.png")), os.listdir(report)
        print(table[:table.index("Where a student")])
        for r in rows:
            print(f"  {r[1]:>12}: {r[5]} devices, measured {float(r[6]):9.0f} tok/s, predicted {float(r[9]):9.0f}, "
                  f"error {100 * float(r[10]):+.1f}%")

    def sharded(self, students, mode="grad_op"):
        # Global batch 12 in micro-batches of 1: accum 6, 4, 3 on 2, 3, 4 students. Tiny buckets
        # (1 KiB = 256 floats), so the student's parameters spread over many buckets and most are
        # split between students. Clipping exercises the global norm. Sums over students in another order than the all-reduce: 1e-5, as the
        # layout cases.
        # S = 3 keeps the moments across growth: the sharded optimizer
        # re-shards them onto the new layout (phase_policy = keep); S = 2 and 4 reset them at each phase.
        base = self.global_base()
        policy = "keep" if students == 3 else "reset"
        sets = ["parallel.global_batch=12", "parallel.micro_batch=1", f"parallel.students={students}",
                f"curriculum.phase_policy={policy}", "optim.grad_clip=0.5", "parallel.bucket_cap_mb=0.0009765625"]
        ranks = 1 + students
        replicated = os.path.join(self.work, f"replicated-s{students}-{mode}")
        sharded = os.path.join(self.work, f"sharded-s{students}-{mode}")
        self.train(replicated, sets, ranks=ranks, base=base)
        # "full" gathers each block for its forward and again for its recomputed backward.
        shard_sets = sets + [f'parallel.sharding="{mode}"'] + (['student.recompute="layer"'] if mode == "full" else [])
        p = self.train(sharded, shard_sets, ranks=ranks, check=False, extra=["--stop-after", "5"], base=base)
        assert p.returncode == 3, f"stopped run should exit 3 (requeue), got {p.returncode}: {p.stderr[-2000:]}"
        step5 = os.path.join(sharded, "checkpoints", "step_00000004")
        files = sorted(os.listdir(step5))
        want = [f"optimizer.shard-{r:05d}-of-{students:05d}.safetensors" for r in range(students)]
        assert [f for f in files if f.startswith("optimizer")] == want, files
        assert not [f for f in os.listdir(os.path.join(sharded, "checkpoints")) if f.startswith(".shards")]
        cmd = ["mpirun", "-np", str(ranks), self.deepen, "train", base, "--quiet", "--set", f'run.out_dir="{sharded}"'] + \
              sum([["--set", s] for s in shard_sets], [])
        run(cmd, env=MPI_ENV)
        self.compare(replicated, sharded, 1e-5,
                     f"sharded ({mode}) S={students}, stopped after step 5 and resumed, vs replicated S={students}")
        if students == 4:
            # The S = 4 checkpoint resumed on 2 students: each assembles the whole state from the 4
            # shards and takes its half.
            moved = os.path.join(self.work, f"sharded-s4-to-s2-{mode}")
            p = self.train(moved, shard_sets, ranks=ranks, check=False, extra=["--stop-after", "5"], base=base)
            assert p.returncode == 3, p.stderr[-2000:]
            two = [s.replace("parallel.students=4", "parallel.students=2") for s in shard_sets]
            cmd = ["mpirun", "-np", "3", self.deepen, "train", base, "--quiet", "--set", f'run.out_dir="{moved}"'] + \
                  sum([["--set", s] for s in two], [])
            run(cmd, env=MPI_ENV)
            with open(os.path.join(moved, "run.json")) as f:
                assert json.load(f)["students"] == 2
            self.compare(replicated, moved, 1e-5, f"sharded ({mode}) S=4 stopped after step 5, resumed sharded on S=2")

    def shard_write_fails(self):
        base = self.global_base()
        sets = ["parallel.students=2", 'parallel.sharding="grad_op"']
        out = os.path.join(self.work, "shard-write-fails")
        shutil.rmtree(out, ignore_errors=True)
        # The checkpoint after step 3 (the second, checkpoint.every = 2): a folder where student 1's
        # shard file must go makes its (atomic, rename-into-place) write fail, and only its write.
        # A fresh run clears its folder's checkpoints, so the blocker goes in after a first stop.
        cmd = [self.deepen, "train", base, "--quiet", "--set", f'run.out_dir="{out}"'] + sum([["--set", s] for s in sets], [])
        p = run(["mpirun", "-np", "3"] + cmd + ["--stop-after", "2"], env=MPI_ENV, check=False)
        assert p.returncode == 3, p.stderr[-2000:]
        blocker = os.path.join(out, "checkpoints", ".shards-step_00000003", "optimizer.shard-00001-of-00002.safetensors")
        os.makedirs(blocker)
        p = run(["mpirun", "-np", "3"] + cmd, env=MPI_ENV, check=False)
        assert p.returncode != 0, "a checkpoint missing a shard must stop the run"
        assert "student 1: optimizer shard in" in p.stderr and "shard-00001-of-00002" in p.stderr, p.stderr[-3000:]
        ckpts = sorted(os.listdir(os.path.join(out, "checkpoints")))
        assert ckpts == ["step_00000001"], ckpts  # no step_00000003, no staging folder, no temp folder
        assert sorted(f for f in os.listdir(os.path.join(out, "checkpoints", "step_00000001")) if f.startswith("optimizer")) == \
            ["optimizer.shard-00000-of-00002.safetensors", "optimizer.shard-00001-of-00002.safetensors"]
        run(["mpirun", "-np", "3"] + cmd, env=MPI_ENV)  # resumes from step_00000001 (the blocker is gone)
        m = records(out, "metrics.jsonl")
        assert [r["step"] for r in m] == list(range(9)), [r["step"] for r in m]
        print("student 1's failed shard write:", [l for l in p.stderr.splitlines() if "optimizer shard in" in l][0][:200])
        print("left:", ckpts, "; resumed from step_00000001 to the end")

    def overlap(self):
        # Launching a bucket's collective inside the backward changes when it runs, not what it
        # sums: the same collectives on the same buckets, so the runs must be the same bits.
        base = self.global_base()
        sets = ["parallel.global_batch=12", "parallel.micro_batch=1", "parallel.students=3",
                "parallel.bucket_cap_mb=0.0009765625"]
        for sharding in ("none", "grad_op", "full"):
            runs = []
            recompute = ['student.recompute="layer"'] if sharding == "full" else []
            for overlap in ("true", "false"):
                out = os.path.join(self.work, f"overlap-{sharding}-{overlap}")
                self.train(out, sets + recompute + [f'parallel.sharding="{sharding}"', f"parallel.overlap_grad_reduce={overlap}"],
                           ranks=4, base=base)
                runs.append(out)
            self.compare(runs[0], runs[1], 0.0, f"sharding {sharding}: gradient buckets launched during vs after the backward")

    def desync(self):
        sets = ["parallel.teacher_stages=2", "parallel.students=2"]
        p = self.train(os.path.join(self.work, "dist-desync"), sets, ranks=4, check=False,
                       env={"DEEPEN_FAULT_WRONG_BATCH": "1:4"})
        assert p.returncode != 0, "a desync must fail the job"
        err = p.stderr
        assert "desync at step 4" in err and "student rank 3" in err and "teacher rank 1" in err, err[-3000:]
        print("desync detected:", [l for l in err.splitlines() if "desync" in l][0])

    def thread_binding(self):
        # mpirun binds each of 2 ranks to one core: with run.threads = 2 each rank's threads would
        # take turns on it, silently. Every such rank says so, with the fix; unbound ranks do not.
        if (os.cpu_count() or 1) < 2:
            print("one core: mpirun cannot bind 2 ranks to a core each; nothing to check")
            return
        sets = ["parallel.teacher_stages=1", "parallel.students=1", "run.threads=2"]
        for bind, warned in (("core", True), ("none", False)):
            out = os.path.join(self.work, f"dist-bind-{bind}")
            cmd = ["mpirun", "-np", "2", "--bind-to", bind, self.deepen, "train", self.base, "--fresh", "--quiet",
                   "--set", f'run.out_dir="{out}"', "--stop-after", "1"] + sum([["--set", s] for s in sets], [])
            p = run(cmd, env=MPI_ENV, check=False)
            assert p.returncode == 3, f"--bind-to {bind}: a run stopped after a step exits 3, got {p.returncode}: {p.stderr[-2000:]}"
            lines = [l for l in p.stderr.splitlines() if "run.threads = 2, but its CPU affinity allows 1 core" in l]
            if warned:
                ranks = re.findall(r"deepen: warning: (rank \d+): run.threads = 2, but its CPU affinity allows 1 core", p.stderr)
                assert sorted(ranks) == ["rank 0", "rank 1"], p.stderr[-3000:]
                assert len(lines) == 2, lines  # a line each
                assert all("--bind-to none" in l for l in lines), lines
                print("--bind-to core:", lines[0])
            else:
                assert not lines, lines
                print("--bind-to none: no warning")

    def lock(self):
        """One writer per run folder: a second `deepen train` on a folder a running job writes is refused
        (exit 2, naming the holder's host and pid) while the first finishes normally; a holder killed
        with -9 leaves its lock to the next start, which resumes."""
        import signal
        import time
        out = os.path.join(self.work, "lock")
        shutil.rmtree(out, ignore_errors=True)
        sets = ["curriculum.stage_steps=[200, 200, 200]", "checkpoint.every=20", "control.heartbeat_s=0.5",
                "control.watchdog_s=3"]
        cmd = [self.deepen, "train", self.base, "--fresh", "--quiet", "--set", f'run.out_dir="{out}"']
        for x in sets:
            cmd += ["--set", x]
        first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        metrics = os.path.join(out, "metrics.jsonl")
        deadline = time.time() + 120
        while not (os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3):
            assert first.poll() is None and time.time() < deadline, first.stderr.read()[-3000:]
            time.sleep(0.05)
        second = run([c for c in cmd if c != "--fresh"], check=False)
        assert second.returncode == 2, f"a second job on the folder: exit {second.returncode}\n{second.stderr[-3000:]}"
        holder = f"another job writes this run folder (host {os.uname().nodename}, pid {first.pid}"
        assert holder in second.stderr, second.stderr[-3000:]
        assert first.poll() is None, "the refused job must not disturb the running one"
        # kill -9 after a checkpoint: the next start takes the dead holder's lock and resumes.
        ckpts = os.path.join(out, "checkpoints")
        while not (os.path.isdir(ckpts) and any(n.startswith("step_") and "." not in n for n in os.listdir(ckpts))):
            assert first.poll() is None and time.time() < deadline + 120, first.stderr.read()[-3000:]
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait()
        third = run([c for c in cmd if c != "--fresh"] + ["--stop-after", "30"], check=False)
        assert third.returncode == 3, f"exit {third.returncode}\n{third.stderr[-3000:]}"
        assert "resumed" in open(os.path.join(out, "run.json")).read() and \
            json.load(open(os.path.join(out, "run.json")))["resumed"], third.stderr[-2000:]
        print(f"second job refused while pid {first.pid} wrote the folder: '{holder}...'; after kill -9 the next "
              f"start took the lock over and resumed")

    def gpu_asked(self):
        import torch  # the reference for what this process sees (the torch wheel deepen links)
        gpus = torch.cuda.device_count()
        cases = [(["run.device=cpu", "parallel.backend=nccl"], 'parallel.backend: "nccl" moves CUDA tensors')]
        if gpus == 0:
            cases.append((["run.device=cuda", "parallel.backend=nccl"], 'run.device: "cuda" but this process sees no CUDA device'))
        elif gpus == 1:  # two ranks, one GPU: NCCL forbids it, and the check says so
            cases.append((["run.device=cuda", "parallel.backend=nccl"], "use the same GPU"))
        for i, (sets, want) in enumerate(cases):
            out = os.path.join(self.work, f"dist-gpu-asked-{i}")
            p = self.train(out, sets, ranks=2, check=False)
            assert p.returncode == 2, (sets, p.returncode, p.stderr[-3000:])
            # Every rank fails the same check; mpirun may end the second before it prints.
            assert want in p.stderr, (sets, want, p.stderr[-3000:])
            assert not os.path.exists(os.path.join(out, "metrics.jsonl")), out
            print(" ".join(sets), "->", [l for l in p.stderr.splitlines() if want in l][0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepen", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("case")
    a = ap.parse_args()
    c = Cases(a.deepen, a.work)
    cases = {"setup": c.setup, "layout-1x2+2": lambda: c.layout(1, 2, 2), "layout-2x1+4": lambda: c.layout(2, 1, 4),
             "layout-1x3+1": lambda: c.layout(1, 3, 1), "topk": c.topk,
             "pipelines-2x1+4": lambda: c.pipelines(2, 1, 4), "pipelines-2x2+2": lambda: c.pipelines(2, 2, 2),
             "hidden-1x1+1": lambda: c.hidden(1, 1, 1), "hidden-1x2+2": lambda: c.hidden(1, 2, 2),
             "hidden-2x1+2": lambda: c.hidden(2, 1, 2), "resume": c.resume, "paper": c.paper, "desync": c.desync,
             "global-batch": c.global_batch, "resume-layout": c.resume_layout,
             "resume-rank-order": c.resume_rank_order, "sweep": c.sweep,
             "gpu-asked": c.gpu_asked, "sharded-2": lambda: c.sharded(2), "sharded-3": lambda: c.sharded(3),
             "sharded-4": lambda: c.sharded(4), "sharded-full-2": lambda: c.sharded(2, "full"),
             "sharded-full-3": lambda: c.sharded(3, "full"), "sharded-full-4": lambda: c.sharded(4, "full"), "overlap": c.overlap,
             "shard-write-fails": c.shard_write_fails, "thread-binding": c.thread_binding, "lock": c.lock}
    cases[a.case]()


if __name__ == "__main__":
    main()
