#!/usr/bin/env python3
"""End-to-end checks of `deepen group`: runs sharing one teacher pass, each against the same run alone.

  python3 tests/e2e/shared_teacher.py --deepen build/deepen --work build/tests/e2e CASE

Uses the fixture of distributed_train.py (`setup`). Cases:
  group      pre/post-norm x grow/freeze (1 pipeline x 2 stages + 4 runs x 1 student, world 6) == each
             run alone on 1 x 2 + 1 (world 3), bit for bit: losses, evals, diagnostics, final weights;
             the teacher's forward passes (step_time/ of the job folder) are a quarter of the four
             runs' alone
  diverging  joint (6 steps), grow (9, replaying a small shard) and joint-long (12, reading past it),
             documents: the streams part at the shard's end, the teacher computes each distinct
             micro-batch once per step and goes on alone for joint-long's last steps; all == alone
  study      `deepen study` with share_teacher: the two grow runs train as one group job (== alone),
             the matched run (its budget is post-grow's tokens) waits and runs after it; --dry-run
             names the groups and why the matched run did not join; a rerun runs nothing
  stop       SIGUSR1 to the teacher's last stage: every run stops at one agreed step with a checkpoint,
             the job exits 3 (requeue); the rerun resumes every run == the uninterrupted group
  kill       SIGKILL the second run's student mid-job: every rank exits non-zero naming the dead
             rank and its run; rerunning the group resumes every run from its own checkpoint and
             every loss curve equals the uninterrupted group's
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distributed_train import MPI_ENV, Cases, rank_pid, records, run  # noqa: E402

TEACHER = ["parallel.teacher_stages=2"]
ORDER = ["data.order_seed=5"]  # the study case: its data order apart from its seed


def toml_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


class SharedTeacher(Cases):
    def group_file(self, name, runs):
        """runs: [(run name, [sets])] -> the group file's path; run r's folder is <work>/<name>/<run name>."""
        root = os.path.join(self.work, name)
        path = os.path.join(root, "group.toml")
        os.makedirs(root, exist_ok=True)
        with open(path, "w") as f:
            f.write(f"[group]\nname = {toml_string(name)}\nout_dir = {toml_string(os.path.join(root, 'job'))}\n")
            for run_name, sets in runs:
                out = os.path.join(root, run_name)
                sets = TEACHER + [f"run.name={toml_string(run_name)}", f"run.out_dir={toml_string(out)}"] + list(sets)
                f.write(f"\n[[run]]\nconfig = {toml_string(self.base)}\nset = [{', '.join(toml_string(s) for s in sets)}]\n")
        return path

    def group_command(self, path, ranks, fresh=True):
        cmd = ["mpirun", "-np", str(ranks), self.deepen, "group", path, "--quiet"]
        return cmd + (["--fresh"] if fresh else [])

    @staticmethod
    def passes(run_dir, rank):
        """The teacher's forward passes per step: {step: passes} from its last stage's step_time."""
        return {r["step"]: r["passes"] for r in records(run_dir, os.path.join("step_time", f"rank{rank}.jsonl"))}

    @staticmethod
    def same(a, b, what, tol=0.0):
        """metrics, eval and diagnostics of two run folders: equal (tol 0) or within tol, relatively."""
        worst = 0.0
        for name, keys in (("metrics.jsonl", ("loss", "kl", "ce")), ("eval.jsonl", ("val_ce", "val_kl"))):
            ra, rb = records(a, name), records(b, name)
            assert [r["step"] for r in ra] == [r["step"] for r in rb], f"{what}: {name} steps differ"
            for x, y in zip(ra, rb):
                for k in keys:
                    rel = abs(x[k] - y[k]) / abs(x[k]) if x[k] else abs(y[k])
                    worst = max(worst, rel)
                    assert rel <= tol, f"{what}: {name} step {x['step']} {k}: {x[k]} vs {y[k]}"
        if tol == 0.0:
            da, db = records(a, "diagnostics.jsonl"), records(b, "diagnostics.jsonl")
            assert da == db, f"{what}: diagnostics differ"
        return len(records(a, "metrics.jsonl")), worst

    def against_alone(self, name, runs, group_ranks):
        """Train the group, then every run alone on 1 x 2 + 1; returns (group folder, {run: alone folder})."""
        path = self.group_file(name, runs)
        root = os.path.dirname(path)
        run(self.group_command(path, group_ranks), env=MPI_ENV)
        alone = {}
        for run_name, sets in runs:
            out = os.path.join(self.work, f"{name}-alone", run_name)
            self.train(out, TEACHER + list(sets), ranks=3)
            steps, _ = self.same(out, os.path.join(root, run_name), f"{run_name}: group vs alone")
            print(f"{run_name}: {steps} steps, bit-identical to the run alone")
            alone[run_name] = out
        return root, alone

    def group(self):
        runs = [("pre-grow", ['student.norm="pre"']), ("post-grow", ['student.norm="post"']),
                ("pre-freeze", ['student.norm="pre"', "curriculum.freeze_prefix=true"]),
                ("post-freeze", ['student.norm="post"', "curriculum.freeze_prefix=true"])]
        root, alone = self.against_alone("group-4", runs, 6)
        for run_name, alone_dir in alone.items():
            a, b = (open(os.path.join(d, "final", "student.safetensors"), "rb").read()
                    for d in (alone_dir, os.path.join(root, run_name)))
            assert a == b, f"{run_name}: the final weights differ from the run alone"
        shared = self.passes(os.path.join(root, "job"), 1)
        solo = [self.passes(d, 1) for d in alone.values()]
        for step, n in shared.items():
            # The runs read the same micro-batches and evaluate the same batches: at every step the
            # teacher computes what one run alone does, once for all four.
            assert all(n == s[step] for s in solo), (step, n, [s.get(step) for s in solo])
        total, alone_total = sum(shared.values()), sum(sum(s.values()) for s in solo)
        assert 4 * total == alone_total, (total, alone_total)
        print(f"final weights equal byte for byte; teacher forward passes: {total} shared vs {alone_total} "
              f"for the four runs alone (1/4)")

    def diverging(self):
        docs = ['data.packing="documents"', "data.max_len=32", "eval.batches=2", "data.replay_shard_tokens=150"]
        joint = ['curriculum.mode="joint"', "curriculum.stages=[3]"]
        runs = [("joint", docs + joint + ["curriculum.stage_steps=[6]"]), ("grow", docs),
                ("joint-long", docs + joint + ["curriculum.stage_steps=[12]"])]
        root, alone = self.against_alone("group-diverging", runs, 5)
        shared = self.passes(os.path.join(root, "job"), 1)
        solo = {name: self.passes(alone[name], 1) for name, _ in runs}
        assert sorted(shared) == list(range(12)), sorted(shared)
        parted = 0
        for step, n in shared.items():
            each = [s.get(step, 0) for s in solo.values()]
            assert max(each) <= n <= sum(each), (step, n, each)
            parted += n > max(each)
            if step >= 9:
                assert n == solo["joint-long"][step], "past the others' ends the teacher works for joint-long alone"
        assert parted > 0, "the replay shard wraps within 9 steps: the streams must part"
        total, alone_total = sum(shared.values()), sum(sum(s.values()) for s in solo.values())
        print(f"lengths 6, 9, 12; streams parted at {parted} of 12 steps; teacher passes {total} shared vs "
              f"{alone_total} alone")

    def study(self):
        root = os.path.join(self.work, "study-shared")
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        path = os.path.join(root, "study.toml")
        with open(path, "w") as f:
            f.write(f"[study]\nname = \"shared\"\nbase = {toml_string(self.base)}\nout_dir = {toml_string(root)}\n"
                    f"seeds = [1]\nlauncher = \"mpirun\"\nshare_teacher = true\n"
                    f"set = [{', '.join(toml_string(s) for s in TEACHER + ORDER)}]\n"
                    '[[run]]\nname = "pre-grow"\nset = ["student.norm=pre"]\n'
                    '[[run]]\nname = "post-grow"\nset = ["student.norm=post"]\n'
                    '[[run]]\nname = "post-joint-matched"\nset = ["student.norm=post", "curriculum.mode=joint", '
                    '"curriculum.stages=[3]", "curriculum.stage_steps=[]", "curriculum.budget=active_layer_tokens:post-grow"]\n')
        plan = run([self.deepen, "study", path, "--dry-run"]).stdout
        assert "g0: 2 runs, mpirun -np 4 deepen group" in plan, plan
        assert "not joined: post-joint-matched/seed1: waits for post-grow/seed1, a member" in plan, plan
        assert "g1: 1 run, alone" in plan, plan
        out = run([self.deepen, "study", path, "--quiet"], env=MPI_ENV).stdout
        assert "group shared-g0 (2 runs, one teacher pass): finished" in out, out[-3000:]
        for name, sets in (("pre-grow", ['student.norm="pre"']), ("post-grow", ['student.norm="post"'])):
            alone = os.path.join(self.work, "study-shared-alone", name)
            self.train(alone, TEACHER + ORDER + sets, ranks=3)
            steps, _ = self.same(alone, os.path.join(root, name, "seed1"), f"study {name}: group vs alone")
            print(f"study {name}: {steps} steps in the group job, bit-identical to the run alone")
        assert len(records(os.path.join(root, "post-joint-matched", "seed1"), "metrics.jsonl")) > 0
        again = run([self.deepen, "study", path, "--quiet"], env=MPI_ENV).stdout
        assert again.count("finished earlier, not rerun") == 3 and "0 jobs run now" in again, again
        run([self.deepen, "report", root, "--out", os.path.join(root, "report")])
        with open(os.path.join(root, "report", "report.md")) as f:
            md = f.read()
        assert "Data order: seed 1 reads order 5." in md, md[:3000]
        saved = re.search(r"groups/g0/job: (\d+) teacher forward passes for (\d+) micro-batches delivered: 50% of the "
                          r"teacher's work saved", md)
        assert saved, md[:4000]
        print("study: one group job of 2 runs, the matched run after it alone; a rerun runs nothing; "
              "the report names the data order")

    def start_long_group(self, name):
        """The two-run group of 120 steps, started in the background; returns (group file, process)."""
        path = self.group_file(name, self.long_runs())
        root = os.path.dirname(path)
        for run_name, _ in self.long_runs():
            shutil.rmtree(os.path.join(root, run_name), ignore_errors=True)
        proc = subprocess.Popen(self.group_command(path, 4), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=dict(os.environ, **MPI_ENV), start_new_session=True)
        metrics = os.path.join(root, "post-grow", "metrics.jsonl")
        deadline = time.time() + 300
        while not (os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 35):
            if proc.poll() is not None or time.time() > deadline:
                os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
                raise AssertionError("the job ended before step 35: " + proc.stderr.read()[-3000:])
            time.sleep(0.05)
        return path, proc

    @staticmethod
    def long_runs():
        sets = ["curriculum.stage_steps=[40, 40, 40]", "checkpoint.every=10", "control.heartbeat_s=0.1",
                "control.watchdog_s=10"]
        return [("pre-grow", sets + ['student.norm="pre"']), ("post-grow", sets + ['student.norm="post"'])]

    def uninterrupted_long_group(self):
        whole = self.group_file("group-whole", self.long_runs())
        if not all(os.path.exists(os.path.join(os.path.dirname(whole), r, "final")) for r, _ in self.long_runs()):
            run(self.group_command(whole, 4), env=MPI_ENV)
        return os.path.dirname(whole)

    def resume_and_compare(self, path):
        run(self.group_command(path, 4, fresh=False), env=MPI_ENV)
        whole = self.uninterrupted_long_group()
        for run_name, _ in self.long_runs():
            steps, worst = self.same(os.path.join(whole, run_name), os.path.join(os.path.dirname(path), run_name),
                                     f"{run_name}: resumed vs uninterrupted group", tol=1e-6)
            assert steps == 120, steps
            print(f"{run_name}: resumed from its checkpoint, 120 steps equal the uninterrupted group (worst rel {worst:.1e})")

    def stop(self):
        self.uninterrupted_long_group()
        path, proc = self.start_long_group("group-stopped")
        try:
            os.kill(rank_pid(path, "OMPI_COMM_WORLD_RANK", 1), signal.SIGUSR1)  # the teacher's last stage
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 3, f"a coordinated stop of a group exits 3 (requeue), got {proc.returncode}: {err[-3000:]}"
        agreed = [l for l in err.splitlines() if "coordinated stop agreed" in l]
        assert agreed, err[-3000:]
        stop = int(re.search(r"once (\d+) steps", agreed[0]).group(1))
        root = os.path.dirname(path)
        for run_name, _ in self.long_runs():
            assert len(records(os.path.join(root, run_name), "metrics.jsonl")) == stop, run_name
            assert os.path.isdir(os.path.join(root, run_name, "checkpoints", f"step_{stop - 1:08d}")), run_name
        print(f"SIGUSR1 to the teacher: {agreed[0].strip()}; every run checkpointed step_{stop - 1:08d}, exit 3")
        self.resume_and_compare(path)

    def kill(self):
        self.uninterrupted_long_group()
        path, proc = self.start_long_group("group-killed")
        try:
            os.kill(rank_pid(path, "OMPI_COMM_WORLD_RANK", 3), signal.SIGKILL)  # run 1's student
            killed = time.time()
            _, err = proc.communicate(timeout=60)
            took = time.time() - killed
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode != 0, "the job must fail when a rank dies"
        assert took <= 10 + 5, f"the job ended {took:.1f} s after the kill, past control.watchdog_s = 10"
        named = re.compile(r"rank 3 on \S+ \(.*post-grow.*\)")
        aborts = [l for l in err.splitlines() if "ABORT" in l and named.search(l)]
        assert len(aborts) >= 2, "the other ranks name the dead rank and its run:\n" + err[-3000:]
        print(f"kill -9 of run 1's student: the job ended {took:.1f} s later;", aborts[0].strip())
        self.resume_and_compare(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepen", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("case", choices=["group", "diverging", "study", "stop", "kill"])
    a = ap.parse_args()
    getattr(SharedTeacher(a.deepen, a.work), a.case)()


if __name__ == "__main__":
    main()
