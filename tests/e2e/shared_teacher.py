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
             rank and its run; once every process of the killed job is gone, rerunning the group
             resumes every run from its own checkpoint and every loss curve equals the uninterrupted
             group's
  exit-rule  a 15-step run beside a 120-step one, SIGUSR1 once the short one has its final/: ranks
             leave with 0 and 3, and the job's exit code file says 3 (requeue); the rerun trains the
             long run alone to the end (== uninterrupted), the short one is not trained again
  stop-apart runs resumed at steps 50 and 90 (checkpoint.every 50 and 10), SIGUSR1 at once: each
             stops within max_in_flight + 2 steps of the signal (a near its own resume point, not at
             the other's), exit 3; the rerun ends both equal to the uninterrupted group
  diverge    three runs of different lengths, a NaN in one (DEEPEN_FAULT_NAN=0:12:grow): that run
             leaves the job with its guard record (exit 4 for the job, no abort), the others finish
             equal to each run alone; a rerun does not train the diverged run again (the same LR would
             repeat it); with guard.lr_scale=0.5 in its entry it resumes and finishes
  kernels    cpu_kernels = "auto": a group of two runs stopped, then the second run resumed in a
             group of its own (its student's world rank moves from 3 to 2): it takes the kernel
             choices its student recorded (cpu_kernels/student0.json, nothing timed anew) and its
             curve equals the uninterrupted group's bit for bit
"""
import argparse
import json
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
MAX_IN_FLIGHT = 4  # parallel.max_in_flight's default (config/config.h): how far the teacher serves ahead
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
    def wait_gone(path, timeout=30):
        """Waits until no process of a job on `path` is left (mpirun may return before its ranks end)."""
        deadline = time.time() + timeout
        while True:
            alive = []
            for pid in os.listdir("/proc"):
                try:
                    if pid.isdigit() and path.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                        alive.append(pid)
                except OSError:
                    pass
            if not alive:
                return
            assert time.time() < deadline, f"processes {alive} of the job on {path} still run {timeout} s later"
            time.sleep(0.1)

    @staticmethod
    def kill_job(path):
        """kill -9 of mpirun and every rank of the job on `path` (Open MPI puts its ranks in process
        groups of their own: a signal to mpirun's group does not reach them)."""
        for pid in os.listdir("/proc"):
            try:
                if pid.isdigit() and path.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                    os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass

    def start_group(self, path, ranks, fresh=True, env=None):
        return subprocess.Popen(self.group_command(path, ranks, fresh), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env=dict(os.environ, **MPI_ENV, **(env or {})),
                                start_new_session=True)

    @staticmethod
    def wait_for(what, ready, proc, timeout=300):
        deadline = time.time() + timeout
        while not ready():
            if proc.poll() is not None or time.time() > deadline:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                raise AssertionError(f"the job ended before {what}: " + proc.stderr.read()[-3000:])
            time.sleep(0.05)

    def run_group(self, path, ranks, fresh=True, extra=(), want=0, env=None):
        """Runs a group under mpirun and returns its process; the job's exit code (its rank 0's record:
        mpirun's own status is the first non-zero code of a rank, whichever run it was) must be `want`."""
        exit_file = os.path.join(os.path.dirname(path), "exit_code")
        if os.path.exists(exit_file):
            os.remove(exit_file)
        p = run(self.group_command(path, ranks, fresh) + list(extra),
                env=dict(MPI_ENV, DEEPEN_EXIT_CODE_FILE=exit_file, **(env or {})), check=False)
        code = self.job_code(path)
        assert code == want, f"{path}: the job's exit code {code}, not {want}:\n{p.stderr[-3000:]}"
        return p

    @staticmethod
    def job_code(path):
        """The job's exit code as its rank 0 wrote it (DEEPEN_EXIT_CODE_FILE beside the group file)."""
        exit_file = os.path.join(os.path.dirname(path), "exit_code")
        return int(open(exit_file).read()) if os.path.exists(exit_file) else None

    @staticmethod
    def lines(run_dir, name="metrics.jsonl"):
        path = os.path.join(run_dir, name)
        return sum(1 for _ in open(path)) if os.path.exists(path) else 0

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
        self.run_group(path, group_ranks)
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
        # The teacher's memory: its last stage holds up to max_in_flight payloads per run once the
        # streams part (plan/cost_model.h, shared_runs), more than one run's max_in_flight.
        cfg = open(os.path.join(root, "joint", "config.toml")).read()
        setting = lambda key: int(re.search(rf"^{key} = (\d+)", cfg, re.M).group(1))
        vocab = json.load(open(os.path.join(self.work, "teacher", "final", "hf", "config.json")))["vocab_size"]
        largest = setting("micro_batch") * setting("max_len") * vocab * 4  # fp32 logits of a full micro-batch
        held = max(r.get("held_bytes", 0) for r in records(os.path.join(root, "job"), os.path.join("step_time", "rank1.jsonl")))
        m = setting("max_in_flight")
        assert 0 < held <= len(runs) * m * largest, (held, m, largest)
        print(f"the teacher's last stage held up to {held:,} bytes of payloads ({held / (m * largest):.2f} x one run's "
              f"max_in_flight = {m} of the largest), within the plan's {len(runs)} runs x {m} ({len(runs) * m * largest:,})")

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
        exit_file = os.path.join(root, "exit_code")
        if os.path.exists(exit_file):
            os.remove(exit_file)
        proc = self.start_group(path, 4, env={"DEEPEN_EXIT_CODE_FILE": exit_file})
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
            self.run_group(whole, 4)
        return os.path.dirname(whole)

    def resume_and_compare(self, path):
        self.run_group(path, 4, fresh=False)
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
        code = self.job_code(path)
        assert code == 3, f"a coordinated stop of a group exits 3 (requeue), got {code}: {err[-3000:]}"
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
        assert proc.returncode != 0 or self.job_code(path) not in (None, 0), "the job must fail when a rank dies"
        assert took <= 10 + 5, f"the job ended {took:.1f} s after the kill, past control.watchdog_s = 10"
        named = re.compile(r"rank 3 on \S+ \(.*post-grow.*\)")
        aborts = [l for l in err.splitlines() if "ABORT" in l and named.search(l)]
        assert len(aborts) >= 2, "the other ranks name the dead rank and its run:\n" + err[-3000:]
        print(f"kill -9 of run 1's student: the job ended {took:.1f} s later;", aborts[0].strip())
        # mpirun returns once it has given up on the job, not once every rank has ended: a rank still
        # saving a checkpoint would write into the folders the rerun resumes from. What a requeue
        # gets from Slurm (the old job's processes ended), the test waits for.
        self.wait_gone(path)
        self.resume_and_compare(path)

    def exit_rule(self):
        whole = self.uninterrupted_long_group()
        short_sets = ["curriculum.stage_steps=[5, 5, 5]", "checkpoint.every=5", "control.heartbeat_s=0.1",
                      "control.watchdog_s=10", 'student.norm="pre"']
        long_name, long_sets = self.long_runs()[1]
        path = self.group_file("group-exit-rule", [("short", short_sets), (long_name, long_sets)])
        root = os.path.dirname(path)
        exit_file = os.path.join(root, "exit_code")
        if os.path.exists(exit_file):
            os.remove(exit_file)
        proc = self.start_group(path, 4, env={"DEEPEN_EXIT_CODE_FILE": exit_file})
        try:
            self.wait_for("the short run's final/ and step 35 of the long one",
                          lambda: os.path.isdir(os.path.join(root, "short", "final")) and
                          self.lines(os.path.join(root, long_name)) >= 35, proc)
            os.kill(rank_pid(path, "OMPI_COMM_WORLD_RANK", 1), signal.SIGUSR1)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert os.path.exists(exit_file), "no job exit code was written (ranks left with 0 and 3):\n" + err[-3000:]
        code = int(open(exit_file).read())
        assert code == 3, f"the short run finished, the long one stopped: the job must requeue (3), got {code}"
        assert "the job's exit code is 3" in err, err[-3000:]
        print(f"ranks left with 0 (the finished short run) and 3: job exit code {code} (mpirun said {proc.returncode})")
        self.wait_gone(path)
        out = self.run_group(path, 4, fresh=False)
        assert "[short] finished earlier; not trained again" in out.stderr, out.stderr[-3000:]
        steps, worst = self.same(os.path.join(whole, long_name), os.path.join(root, long_name),
                                 f"{long_name}: requeued beside a finished run vs uninterrupted", tol=1e-6)
        assert steps == 120, steps
        print(f"rerun: the short run not trained again; {long_name} ends equal to the uninterrupted group ({steps} "
              f"steps, worst rel {worst:.1e})")

    def stop_apart(self):
        whole = self.uninterrupted_long_group()
        (a, a_sets), (b, b_sets) = self.long_runs()
        path = self.group_file("group-stop-apart", [(a, a_sets + ["checkpoint.every=50"]), (b, b_sets)])
        root = os.path.dirname(path)
        for name in (a, b):  # no records of an earlier attempt to take for this one's
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        proc = self.start_group(path, 4)
        try:
            self.wait_for("step 95", lambda: self.lines(os.path.join(root, b)) >= 95, proc)
        finally:
            self.kill_job(path)
            proc.communicate()
        self.wait_gone(path)
        # a resumes after step 49, b after step 89: the teacher serves a alone until b's students' step.
        exit_file = os.path.join(root, "exit_code")
        restarted = time.time()
        proc = self.start_group(path, 4, fresh=False, env={"DEEPEN_EXIT_CODE_FILE": exit_file})
        a_metrics = os.path.join(root, a, "metrics.jsonl")
        try:
            # The resume cuts a's records back to step 49 (a new file), then appends its step 50.
            self.wait_for("a's first resumed step", lambda: os.path.getmtime(a_metrics) > restarted and
                          51 <= self.lines(os.path.join(root, a)) <= 60, proc)
            signalled = self.lines(os.path.join(root, a))
            os.kill(rank_pid(path, "OMPI_COMM_WORLD_RANK", 1), signal.SIGUSR1)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert self.job_code(path) == 3, f"exit {self.job_code(path)}: {err[-3000:]}"
        got_a, got_b = self.lines(os.path.join(root, a)), self.lines(os.path.join(root, b))
        agreed = [l.strip() for l in err.splitlines() if "coordinated stop agreed" in l]
        # How late the stop may land: a may log one more step before the signal arrives; the teacher
        # serves up to max_in_flight steps ahead of it; the stop is agreed at the boundary after that.
        latest = signalled + 1 + MAX_IN_FLIGHT + 1
        assert got_a <= latest, (f"{a} was at step {signalled} when signalled and trained on to {got_a} (at most "
                                 f"{latest}; the other run's resume point is 90): {agreed}")
        assert 90 <= got_b <= 92, f"{b} resumed at 90 stopped at {got_b}: {agreed}"
        print(f"resumed at 50 and 90, SIGUSR1: {a} signalled at step {signalled} stopped after {got_a} steps, {b} after {got_b}; {agreed}")
        self.wait_gone(path)
        self.run_group(path, 4, fresh=False)
        for name in (a, b):
            steps, worst = self.same(os.path.join(whole, name), os.path.join(root, name),
                                     f"{name}: stopped apart, resumed vs uninterrupted", tol=1e-6)
            assert steps == 120, steps
        print("both runs resumed and ended equal to the uninterrupted group")

    def diverge(self):
        docs = ["eval.every=5", "checkpoint.every=5", "control.heartbeat_s=0.1", "control.watchdog_s=10"]
        runs = [("joint", docs + ['curriculum.mode="joint"', "curriculum.stages=[3]", "curriculum.stage_steps=[9]"]),
                ("grow", docs + ["curriculum.stage_steps=[6, 6, 6]"]),
                ("post", docs + ['student.norm="post"', "curriculum.stage_steps=[8, 8, 8]"])]
        path = self.group_file("group-diverge", runs)
        root = os.path.dirname(path)
        exit_file = os.path.join(root, "exit_code")
        env = {"DEEPEN_FAULT_NAN": "0:12:grow", "DEEPEN_EXIT_CODE_FILE": exit_file}
        p = run(self.group_command(path, 5), env=dict(MPI_ENV, **env), check=False)
        assert "ABORT" not in p.stderr, "one run's divergence must not end the others:\n" + p.stderr[-4000:]
        assert int(open(exit_file).read()) == 4, f"the job's code: a run diverged (4)\n{p.stderr[-3000:]}"
        guard = records(os.path.join(root, "grow"), "guard.jsonl")
        assert [(g["step"], g["event"]) for g in guard] == [(12, "stopped")], guard
        assert len(records(os.path.join(root, "grow"), "metrics.jsonl")) == 12
        assert not os.path.exists(os.path.join(root, "grow", "final"))
        hint = f"add \"guard.lr_scale=0.5\" to run grow's set list in {path}"
        assert hint in p.stderr, "the advice names the run's entry in the group file:\n" + p.stderr[-3000:]
        assert "[grow] left the job at step" in p.stderr, p.stderr[-3000:]
        for name, sets in (runs[0], runs[2]):
            alone = os.path.join(self.work, "group-diverge-alone", name)
            self.train(alone, TEACHER + list(sets), ranks=3)
            steps, _ = self.same(alone, os.path.join(root, name), f"{name}: beside a diverged run vs alone")
            print(f"{name}: {steps} steps beside the diverged run, bit-identical to the run alone")
        print("grow: NaN at step 12 -> guard.jsonl 'stopped', the run left the job; job exit code 4, no abort")
        # The rerun (a requeue, a rerun of the study) does not train it again with the same LR ...
        again = run(self.group_command(path, 5, fresh=False), env=dict(MPI_ENV, DEEPEN_EXIT_CODE_FILE=exit_file),
                    check=False)
        assert "run grow diverged at step 12" in again.stderr and "not rerun with the same LR" in again.stderr, \
            again.stderr[-3000:]
        assert int(open(exit_file).read()) == 4 and len(records(os.path.join(root, "grow"), "metrics.jsonl")) == 12
        assert again.stderr.count("finished earlier; not trained again") == 2, again.stderr[-3000:]
        # ... and a lower LR in its own entry retries it, from its last good checkpoint.
        lr_before = [g["lr"] for g in records(os.path.join(root, "grow"), "metrics.jsonl")][10:12]
        retry = [(n, s + (["guard.lr_scale=0.5"] if n == "grow" else [])) for n, s in runs]
        path = self.group_file("group-diverge", retry)
        run(self.group_command(path, 5, fresh=False), env=dict(MPI_ENV, DEEPEN_EXIT_CODE_FILE=exit_file))
        assert int(open(exit_file).read()) == 0
        grow = records(os.path.join(root, "grow"), "metrics.jsonl")
        assert len(grow) == 18 and [g["lr"] for g in grow[10:12]] == [0.5 * x for x in lr_before], \
            ([g["lr"] for g in grow], lr_before)
        events = [g["event"] for g in records(os.path.join(root, "grow"), "guard.jsonl")]
        assert events == ["stopped", "lr_scale_changed"], events
        print("rerun: the diverged run is not trained again; with guard.lr_scale=0.5 in its entry it resumes from "
              "step_00000009 and finishes (guard.jsonl records the LR change)")

    def kernels(self):
        sets = ["curriculum.stage_steps=[8, 8, 8]", "checkpoint.every=4", 'student.cpu_kernels="auto"']
        runs = [("pre", sets + ['student.norm="pre"']), ("post", sets + ['student.norm="post"'])]
        path = self.group_file("group-kernels", runs)
        post = os.path.join(os.path.dirname(path), "post")
        self.run_group(path, 4, extra=["--stop-after", "10"], want=3)
        assert sorted(os.listdir(os.path.join(post, "cpu_kernels"))) == ["student0.json"], os.listdir(post)
        before = open(os.path.join(post, "cpu_kernels", "student0.json")).read()
        # Two continuations of post from its checkpoint: in a group of its own (its student is world
        # rank 2) and in the group of two (world rank 3, as before). Both must take the choices its
        # student recorded: timing anew could choose other kernels, whose rounding differs.
        saved = post + ".stopped"
        shutil.rmtree(saved, ignore_errors=True)
        shutil.copytree(post, saved)
        self.run_group(self.group_file("group-kernels", runs[1:]), 3, fresh=False)
        alone = records(post, "metrics.jsonl")
        assert open(os.path.join(post, "cpu_kernels", "student0.json")).read() == before, "choices changed (alone)"
        assert sorted(os.listdir(os.path.join(post, "cpu_kernels"))) == ["student0.json"], "timed anew (alone)"
        shutil.rmtree(post)
        shutil.copytree(saved, post)
        self.run_group(self.group_file("group-kernels", runs), 4, fresh=False)
        assert open(os.path.join(post, "cpu_kernels", "student0.json")).read() == before, "choices changed (group)"
        together = records(post, "metrics.jsonl")
        assert len(alone) == len(together) == 24, (len(alone), len(together))
        for x, y in zip(alone, together):
            assert (x["loss"], x["kl"], x["ce"]) == (y["loss"], y["kl"], y["ce"]), (x["step"], x["loss"], y["loss"])
        print("post: resumed as world rank 2 (alone) and 3 (in its group): both took its recorded kernel choices; "
              "24 steps bit-identical")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepen", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("case", choices=["group", "diverging", "study", "stop", "kill", "exit-rule", "stop-apart", "diverge",
                                     "kernels"])
    a = ap.parse_args()
    getattr(SharedTeacher(a.deepen, a.work), a.case.replace("-", "_"))()


if __name__ == "__main__":
    main()
