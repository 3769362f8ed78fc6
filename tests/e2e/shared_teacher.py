#!/usr/bin/env python3
"""End-to-end checks of `deepen group`: runs sharing one teacher pass, each against the same run alone.

  python3 tests/e2e/shared_teacher.py --deepen build/deepen --work build/tests/e2e CASE

Uses the fixture of distributed_train.py (`setup`). Cases:
  group      pre/post-norm x grow, a freeze control and a joint run (1 pipeline x 2 stages + 4 runs x
             1 student, world 6) == each run alone on 1 x 2 + 1 (world 3), bit for bit: losses,
             evals, diagnostics; the teacher's forward passes per step are the most any one run
             alone needs (its micro-batches are computed once for all four)
  diverging  a grow run replaying a small shard and a longer joint run reading past it (documents):
             their streams part at the shard's end, the teacher computes each distinct micro-batch
             once per step and goes on alone for the joint run's last steps; both == alone
  study      `deepen study` with share_teacher: the two grow runs train as one group job (== alone),
             the matched run (its budget is post-grow's tokens) waits and runs after it; --dry-run
             names the groups and why the matched run did not join; a rerun runs nothing
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
                ("post-joint", ['student.norm="post"', 'curriculum.mode="joint"', "curriculum.stage_steps=[9]"])]
        root, alone = self.against_alone("group-4", runs, 6)
        shared = self.passes(os.path.join(root, "job"), 1)
        solo = [self.passes(d, 1) for d in alone.values()]
        for step, n in shared.items():
            # The runs read the same micro-batches and evaluate the same batches: at every step the
            # teacher computes what the most demanding run alone would, once for all four.
            assert n == max(s.get(step, 0) for s in solo), (step, n, [s.get(step) for s in solo])
        total, alone_total = sum(shared.values()), sum(sum(s.values()) for s in solo)
        print(f"teacher passes: {total} shared vs {alone_total} for the four runs alone ({total / alone_total:.2f})")

    def diverging(self):
        docs = ['data.packing="documents"', "data.max_len=32", "eval.batches=2", "data.replay_shard_tokens=150"]
        runs = [("grow", docs), ("joint-long", docs + ['curriculum.mode="joint"', "curriculum.stage_steps=[12]"])]
        root, alone = self.against_alone("group-diverging", runs, 4)
        shared = self.passes(os.path.join(root, "job"), 1)
        grow, joint = self.passes(alone["grow"], 1), self.passes(alone["joint-long"], 1)
        assert sorted(shared) == list(range(12)), sorted(shared)
        parted = 0
        for step, n in shared.items():
            g, j = grow.get(step, 0), joint.get(step, 0)
            assert max(g, j) <= n <= g + j, (step, n, g, j)
            parted += n > max(g, j)
            if step >= 9:
                assert n == j, "past the grow run's end the teacher works for the joint run alone"
        assert parted > 0, "the replay shard wraps within 9 steps: the streams must part"
        total, alone_total = sum(shared.values()), sum(grow.values()) + sum(joint.values())
        print(f"streams parted at {parted} of 12 steps; teacher passes {total} shared vs {alone_total} alone")

    def study(self):
        root = os.path.join(self.work, "study-shared")
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        path = os.path.join(root, "study.toml")
        with open(path, "w") as f:
            f.write(f"[study]\nname = \"shared\"\nbase = {toml_string(self.base)}\nout_dir = {toml_string(root)}\n"
                    f"seeds = [1]\nlauncher = \"mpirun\"\nshare_teacher = true\n"
                    f"set = [{', '.join(toml_string(s) for s in TEACHER)}]\n"
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
            self.train(alone, TEACHER + sets, ranks=3)
            steps, _ = self.same(alone, os.path.join(root, name, "seed1"), f"study {name}: group vs alone")
            print(f"study {name}: {steps} steps in the group job, bit-identical to the run alone")
        assert len(records(os.path.join(root, "post-joint-matched", "seed1"), "metrics.jsonl")) > 0
        again = run([self.deepen, "study", path, "--quiet"], env=MPI_ENV).stdout
        assert again.count("finished earlier, not rerun") == 3 and "0 jobs run now" in again, again
        print("study: one group job of 2 runs, the matched run after it alone; a rerun runs nothing")

    def kill(self):
        sets = ["curriculum.stage_steps=[40, 40, 40]", "checkpoint.every=10", "control.heartbeat_s=0.1",
                "control.watchdog_s=10"]
        runs = [("pre-grow", sets + ['student.norm="pre"']), ("post-grow", sets + ['student.norm="post"'])]
        whole = self.group_file("group-whole", runs)
        run(self.group_command(whole, 4), env=MPI_ENV)
        path = self.group_file("group-killed", runs)
        root = os.path.dirname(path)
        for run_name, _ in runs:
            shutil.rmtree(os.path.join(root, run_name), ignore_errors=True)
        proc = subprocess.Popen(self.group_command(path, 4), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=dict(os.environ, **MPI_ENV), start_new_session=True)
        try:
            metrics = os.path.join(root, "post-grow", "metrics.jsonl")
            deadline = time.time() + 300
            while not (os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 35):
                assert proc.poll() is None and time.time() < deadline, "the job ended before step 35"
                time.sleep(0.05)
            os.kill(rank_pid(path, "OMPI_COMM_WORLD_RANK", 3), signal.SIGKILL)  # run 1's student
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode != 0, "the job must fail when a rank dies"
        named = re.compile(r"rank 3 on \S+ \(.*post-grow.*\)")
        aborts = [l for l in err.splitlines() if "ABORT" in l and named.search(l)]
        assert len(aborts) >= 2, "the other ranks name the dead rank and its run:\n" + err[-3000:]
        print("kill -9 of run 1's student:", aborts[0].strip())
        run(self.group_command(path, 4, fresh=False), env=MPI_ENV)
        for run_name, _ in runs:
            steps, worst = self.same(os.path.join(os.path.dirname(whole), run_name), os.path.join(root, run_name),
                                     f"{run_name}: resumed vs uninterrupted group", tol=1e-6)
            assert steps == 120, steps
            print(f"{run_name}: resumed from its checkpoint, 120 steps equal the uninterrupted group (worst rel {worst:.1e})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepen", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("case", choices=["group", "diverging", "study", "kill"])
    a = ap.parse_args()
    getattr(SharedTeacher(a.deepen, a.work), a.case)()


if __name__ == "__main__":
    main()
