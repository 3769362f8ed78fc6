#!/usr/bin/env python3
"""deepen's sbatch scripts under a real one-node Slurm cluster (tests/slurm/cluster.py).

  python3 tests/slurm/slurm_jobs.py --deepen build/deepen --work build/tests/e2e CASE

Each case starts its own cluster (munged + slurmctld + slurmd in a fresh folder, free ports) and
stops it by PID at the end, also on failure. The jobs are the 4-rank run of tests/e2e/faults.py (1
teacher pipeline x 2 stages + 2 students, 120 steps through two growth events, fixture of
tests/e2e/distributed_train.py `setup`), compared with its `reference` run: the same run started by
hand under mpirun. Exit 77 (skip) where the Slurm packages are missing. Cases:
  launch-srun        slurm/run.sbatch via sbatch, ranks started by srun (PMIx): run folder == by hand
  launch-mpirun      the same with DEEPEN_LAUNCHER=mpirun inside the allocation
  node-failure       kill -9 of one rank inside the job: the job ends within the watchdog limit,
                     non-zero, and its output names the dead rank
  preempt            scancel --signal=USR1 --batch -> coordinated checkpoint -> the script requeues
                     the job -> it runs again (SLURM_RESTART_COUNT=1) and ends on the uninterrupted curve
  preempt-timelimit  the same, the signal sent by Slurm itself: --time=1 --signal=B:USR1@55, on a
                     1600-step run (its own run by hand is the reference and times the submission)
  study              `deepen study configs/demo/study_slurm.toml --slurm DIR` (study_small's four runs
                     and a matched run), then DIR/submit.sh: the array runs for real, the matched run
                     waits for post-grow (afterok); `deepen report` shows the five runs
  preempt-group      a shared-teacher group of two runs (6 tasks, run.sbatch group FILE) preempted with
                     scancel --signal=USR1 --batch, requeued: every run ends equal to the group by hand
  study-shared       the same study with --share-teacher --max-group-runs 2: the joint and the grow pairs each
                     run as one group job of 6 tasks (slurm/lib.sh: deepen_run_job group FILE), the
                     matched run after the grow group; all five runs complete
  group-requeue-srun a group of a 30-step and a 120-step run, preempted once the short run has its
  group-requeue-mpirun final/: its students leave with 0, the other run's with 3; the job's exit code
                     file says 3, the script requeues, the rerun ends the long run equal to it by hand
  group-faults       four runs of different lengths and checkpoint.every behind one teacher (6 tasks),
                     one with a NaN at step 70: preempted twice (the second time after the shortest run
                     finished); the diverged run leaves with its guard record, the others finish equal to
                     each run alone by hand; requeued exactly twice, then FAILED with exit code 4 (a run
                     diverged: no requeue)
"""
import json
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from cluster import Cluster, skip_if_unavailable  # noqa: E402
from distributed_train import MPI_ENV, rank_pid, records, run  # noqa: E402
from faults import LAYOUT, Faults  # noqa: E402

SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
WATCHDOG_S = float(next(s for s in LAYOUT if s.startswith("control.watchdog_s=")).split("=")[1])
STEPS = 120  # LAYOUT's curriculum.stage_steps=[40, 40, 40]
# preempt-timelimit: a run long enough to straddle one of slurmctld's 30-s checks with room on
# both sides, compared with its own run by hand (the 120-step run ends within 6 s on a quiet machine,
# before the check, and then nothing is preempted).
# Long enough that slurmctld's 30 s check falls inside the run: with the row-chunked loss 480 steps took
# 4.9 s here, and the job ended before Slurm's warning (the check comes >= 6.5 s after submission).
LONG = ["curriculum.stage_steps=[40, 40, 1520]"]
LONG_STEPS = 1600


class Jobs:
    def __init__(self, deepen, work):
        self.deepen, self.work = os.path.abspath(deepen), os.path.abspath(work)
        self.base = os.path.join(self.work, "base.toml")
        self.reference = os.path.join(self.work, "faults-reference")

    def submit(self, c, name, launcher="srun", sbatch_args=(), env=None, sets=()):
        """Submits slurm/run.sbatch for the 4-rank run into WORK/slurm-NAME; returns (job id, run dir, log)."""
        out = os.path.join(self.work, f"slurm-{name}")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        run_dir, log = os.path.join(out, "run"), os.path.join(out, "job.out")
        sets = sum((["--set", s] for s in list(LAYOUT) + list(sets)), [])
        job_env = dict(MPI_ENV, DEEPEN_BIN=self.deepen, DEEPEN_HOME=SOURCE, DEEPEN_LAUNCHER=launcher,
                       DEEPEN_RUN_DIR=run_dir, **(env or {}))
        # The script's own #SBATCH lines ask for 2 nodes x 8 tasks x 8 CPUs; the command line wins.
        job = c.sbatch(["--nodes=1", "--ntasks=4", "--ntasks-per-node=4", "--gpus-per-node=4", "--cpus-per-task=1",
                        f"--output={log}", "--time=10"] + list(sbatch_args) +
                       [os.path.join(SOURCE, "slurm", "run.sbatch"), self.base, "--quiet"] + sets,
                       env=job_env, cwd=out)
        return job, run_dir, log

    @staticmethod
    def wait_for_steps(c, job, run_dir, n, timeout=300):
        deadline = time.time() + timeout
        path = os.path.join(run_dir, "metrics.jsonl")
        while time.time() < deadline:
            if os.path.exists(path) and sum(1 for _ in open(path)) >= n:
                return
            state = c.job(job).get("JobState")
            assert state not in TERMINAL, f"job {job} ended ({state}) before step {n}"
            time.sleep(0.1)
        raise AssertionError(f"job {job}: no {n} steps within {timeout} s\n" + c.logs())

    def compare_with_reference(self, run_dir, what, reference=None, steps=STEPS):
        """The run's records against the same run started by hand (faults.py `reference`)."""
        reference = reference or self.reference
        ref, got = records(reference, "metrics.jsonl"), records(run_dir, "metrics.jsonl")
        assert [r["step"] for r in got] == list(range(steps)), f"{what}: steps {[r['step'] for r in got][:5]}..."
        # Same binary, same rank layout, same collectives on the same sizes: every reduction happens
        # in the same order whoever started the ranks, so the curve is bit-identical (tolerance 0).
        for a, b in zip(ref, got):
            for key in ("loss", "kl", "ce", "depth"):
                assert a[key] == b[key], f"{what}: step {a['step']} {key}: by hand {a[key]}, under Slurm {b[key]}"
        ea, eb = records(reference, "eval.jsonl"), records(run_dir, "eval.jsonl")
        assert [(e["step"], e["val_ce"], e["val_kl"]) for e in ea] == [(e["step"], e["val_ce"], e["val_kl"]) for e in eb], \
            f"{what}: eval records differ"
        assert os.path.isdir(os.path.join(run_dir, "final")), f"{what}: no final/ in {run_dir}"
        print(f"{what}: {steps} steps (depth 1 -> 3) and {len(eb)} evals bit-identical to the run started by hand")

    def launch(self, launcher):
        with Cluster() as c:
            t0 = time.time()
            job, run_dir, log = self.submit(c, f"launch-{launcher}", launcher)
            info = c.wait_state(job, TERMINAL, timeout=600)
            text = open(log).read()
            assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", \
                f"job {job}: {info['JobState']} {info['ExitCode']}\n{text[-4000:]}"
            want = "command: srun --mpi=pmix " if launcher == "srun" else "command: mpirun -np 4 "
            assert want in text, f"the job did not launch with {launcher}:\n{text[-3000:]}"
            print(f"job {job} ({launcher}): COMPLETED in {time.time() - t0:.1f} s")
            self.compare_with_reference(run_dir, f"run.sbatch under {launcher}")

    def node_failure(self):
        rank = 3  # student 1
        with Cluster() as c:
            job, run_dir, log = self.submit(c, "node-failure")
            self.wait_for_steps(c, job, run_dir, 35)
            os.kill(rank_pid(run_dir, "SLURM_PROCID", rank), signal.SIGKILL)
            killed = time.time()
            info = c.wait_state(job, TERMINAL, timeout=120, poll=0.1)
            took = time.time() - killed
            text = open(log).read()
            assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", \
                f"job {job}: {info['JobState']} {info['ExitCode']}: a dead rank must fail the job\n{text[-3000:]}"
            # The bound: the watchdog declares a silent rank dead after control.watchdog_s; every
            # rank then exits at the latest watchdog_s / 2 later (its hard exit,
            # launch/job_control.cpp); Slurm needs about a second to see the step and the batch
            # script end (jobs here start in 0.3 s, tests/slurm/README.md).
            bound = WATCHDOG_S + WATCHDOG_S / 2 + 2
            assert took <= bound, f"the job took {took:.1f} s to end after the kill (bound {bound} s)"
            named = re.compile(rf"rank {rank} on \S+ \(.*\), (last step \d+|before its first step)")
            aborts = [l for l in text.splitlines() if "ABORT" in l]
            assert any(named.search(l) for l in aborts), f"no abort message names rank {rank}:\n{text[-3000:]}"
            assert "not requeueing" in text and c.job(job).get("Restarts") == "0", "a failure must not requeue"
            print(f"kill -9 rank {rank} in job {job}: {info['JobState']} (exit {info['ExitCode']}) {took:.1f} s later "
                  f"(bound {bound} s); {next(l for l in aborts if named.search(l)).strip()}")

    def preempt(self, natural):
        reference, steps = self.reference, STEPS
        if natural:
            # The long run by hand first: its records are the reference, its duration D times the job.
            reference = os.path.join(self.work, "slurm-timelimit-reference")
            f = Faults(self.deepen, self.work)
            shutil.rmtree(reference, ignore_errors=True)
            t = time.time()
            run(f.command(reference, LONG), env=MPI_ENV)
            took, steps = time.time() - t, LONG_STEPS
        with Cluster() as c:
            t0 = time.time()
            if natural:
                # slurmctld sends --signal warnings from its periodic check, every 30 s counted from
                # its start (PERIODIC_TIMEOUT; measured here: a job started 3 s after slurmctld got
                # USR1 27 s in, for @50 and @55 alike). The warning is due 5 s into the 1-minute
                # limit (@55); the job is submitted so that the next check falls 40% into a run as
                # long as the one by hand (startup is done by then, ~60% of the steps remain), and
                # never before the warning is due. Measured, not assumed: a faster or a loaded
                # machine shifts the submission with D.
                into = max(0.4 * took, 6.5)
                checks = [c.ctld_started + 30 * k for k in range(1, 20)]
                check = next(x for x in checks if x - into - 0.5 > time.time())
                time.sleep(check - into - time.time())
                job, run_dir, log = self.submit(c, "preempt-timelimit", sbatch_args=["--time=1", "--signal=B:USR1@55"],
                                                sets=LONG)
                print(f"run by hand: {took:.1f} s; job submitted {into:.1f} s before slurmctld's check at "
                      f"{check - c.ctld_started:.0f} s")
            else:
                job, run_dir, log = self.submit(c, "preempt")
                self.wait_for_steps(c, job, run_dir, 25)
                c.run(["scancel", "--signal=USR1", "--batch", job])
            # The script requeues the job itself once the ranks stopped at a checkpoint (exit 3).
            deadline = time.time() + 120
            while c.job(job).get("Restarts", "0") == "0":
                assert time.time() < deadline, f"job {job} not requeued within 120 s\n{open(log).read()[-3000:]}"
                assert c.job(job).get("JobState") not in TERMINAL, f"job {job} ended instead of requeueing:\n" + \
                    open(log).read()[-3000:]
                time.sleep(0.1)
            stopped_at = len(records(run_dir, "metrics.jsonl"))
            requeued = time.time() - t0
            if natural:
                # The rerun gets a longer limit, else Slurm would warn it again 10 s in (a real limit
                # is long compared with its warning).
                c.run(["scontrol", "update", f"jobid={job}", "TimeLimit=10"])
            else:
                # A requeued job waits in PENDING (BeginTime) ~14 s here; release it once pending.
                c.wait_state(job, {"PENDING", "RUNNING"} | TERMINAL, timeout=60, poll=0.1)
                c.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=False)
            c.wait_state(job, {"RUNNING"} | TERMINAL, timeout=120)
            rerun = time.time() - t0
            info = c.wait_state(job, TERMINAL, timeout=600)
            text = open(log).read()
            assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", \
                f"job {job}: {info['JobState']} {info['ExitCode']}\n{text[-4000:]}"
            assert info.get("Restarts") == "1", f"job {job}: Restarts={info.get('Restarts')}"
            agreed = [l for l in text.splitlines() if "coordinated stop agreed" in l]
            assert agreed, f"no coordinated stop in the job's output:\n{text[-3000:]}"
            stop = int(re.search(r"once (\d+) steps", agreed[0]).group(1))
            assert stop == stopped_at, f"stop agreed at {stop} steps, run folder had {stopped_at} records"
            assert f"job {job} (restart 1)" in text, f"the rerun did not see SLURM_RESTART_COUNT=1:\n{text[-3000:]}"
            # The rerun resumed from the stop's checkpoint instead of starting afresh (run.json is
            # rewritten at every start; a fresh start prints the resolved config again).
            assert json.load(open(os.path.join(run_dir, "run.json")))["resumed"] is True, "the rerun did not resume"
            assert text.count("# resolved config") == 1, "the rerun started afresh"
            how = "--signal=B:USR1@55 with --time=1" if natural else "scancel --signal=USR1 --batch"
            print(f"job {job}: {how} -> {agreed[0].strip()} -> requeued -> rerun (SLURM_RESTART_COUNT=1) "
                  f"COMPLETED; requeued at {requeued:.1f} s, running again at {rerun:.1f} s, {time.time() - t0:.1f} s in all")
            self.compare_with_reference(run_dir, f"preempted at step {stop} ({how}) and requeued", reference, steps)

    def preempt_group(self):
        """A shared-teacher group (two runs of LAYOUT behind one 2-stage teacher, 6 tasks) submitted with
        slurm/run.sbatch group FILE, preempted with scancel --signal=USR1 --batch: every run checkpoints
        at one agreed step, the script requeues the job, the rerun resumes every run and ends equal to
        the same group run by hand without a stop."""
        out = os.path.join(self.work, "slurm-preempt-group")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        names = ("pre-grow", "post-grow")

        def group_file(tag):
            path = os.path.join(out, f"{tag}.toml")
            with open(path, "w") as f:
                f.write(f'[group]\nname = "{tag}"\nout_dir = "{out}/{tag}/job"\n')
                for n in names:
                    sets = list(LAYOUT) + [f'student.norm="{n.split("-")[0]}"', f'run.out_dir="{out}/{tag}/{n}"']
                    f.write(f'\n[[run]]\nconfig = "{self.base}"\nset = [' + ", ".join(json.dumps(x) for x in sets) + "]\n")
            return path

        run(["mpirun", "-np", "6", self.deepen, "group", group_file("by-hand"), "--fresh", "--quiet"], env=MPI_ENV)
        path, log = group_file("slurm"), os.path.join(out, "job.out")
        with Cluster() as c:
            t0 = time.time()
            job = c.sbatch(["--nodes=1", "--ntasks=6", "--ntasks-per-node=6", "--gpus-per-node=6", "--cpus-per-task=1",
                            f"--output={log}", "--time=10", os.path.join(SOURCE, "slurm", "run.sbatch"), "group", path,
                            "--quiet"], env=dict(MPI_ENV, DEEPEN_BIN=self.deepen, DEEPEN_HOME=SOURCE), cwd=out)
            self.wait_for_steps(c, job, os.path.join(out, "slurm", "post-grow"), 25)
            c.run(["scancel", "--signal=USR1", "--batch", job])
            deadline = time.time() + 120
            while c.job(job).get("Restarts", "0") == "0":
                assert time.time() < deadline, f"job {job} not requeued within 120 s\n{open(log).read()[-3000:]}"
                assert c.job(job).get("JobState") not in TERMINAL, f"job {job} ended instead of requeueing:\n" + \
                    open(log).read()[-3000:]
                time.sleep(0.1)
            c.wait_state(job, {"PENDING", "RUNNING"} | TERMINAL, timeout=60, poll=0.1)
            c.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=False)
            info = c.wait_state(job, TERMINAL, timeout=600)
            text = open(log).read()
            assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", \
                f"job {job}: {info['JobState']} {info['ExitCode']}\n{text[-4000:]}"
            assert info.get("Restarts") == "1", f"job {job}: Restarts={info.get('Restarts')}"
            agreed = [l for l in text.splitlines() if "coordinated stop agreed" in l]
            assert agreed, f"no coordinated stop in the job's output:\n{text[-3000:]}"
            assert "student 0 run 1" in text, "the rank map names each student's run"
            print(f"group job {job}: scancel --signal=USR1 --batch -> {agreed[0].strip()} -> requeued -> COMPLETED "
                  f"in {time.time() - t0:.1f} s")
        for n in names:
            self.compare_with_reference(os.path.join(out, "slurm", n), f"group run {n} preempted and requeued",
                                        os.path.join(out, "by-hand", n))

    # ---- groups: every run's fate its own ---------------------------------------------------------

    def group_runs_file(self, out, tag, runs):
        """A group file of runs [(name, sets)] behind one 2-stage teacher, each with 1 student; run folders
        under out/tag/."""
        path = os.path.join(out, f"{tag}.toml")
        with open(path, "w") as f:
            f.write(f'[group]\nname = "{tag}"\nout_dir = "{out}/{tag}/job"\n')
            for name, sets in runs:
                sets = [x for x in LAYOUT if not x.startswith(("parallel.students", "checkpoint.every"))] + \
                    ["parallel.students=1", f'run.name="{name}"', f'run.out_dir="{out}/{tag}/{name}"'] + list(sets)
                f.write(f'\n[[run]]\nconfig = "{self.base}"\nset = [' + ", ".join(json.dumps(x) for x in sets) + "]\n")
        return path

    def by_hand_alone(self, out, runs):
        """Each run alone by hand (1 x 2 teacher + 1 student, mpirun): the reference of the group's runs."""
        for name, sets in runs:
            path = self.group_runs_file(out, f"alone-{name}", [(name, sets)])
            run(["mpirun", "-np", "3", self.deepen, "group", path, "--fresh", "--quiet"], env=MPI_ENV)
        return {name: os.path.join(out, f"alone-{name}", name) for name, _ in runs}

    def submit_group(self, c, out, path, tasks, launcher, env=None):
        log = os.path.join(out, "job.out")
        job = c.sbatch([f"--nodes=1", f"--ntasks={tasks}", f"--ntasks-per-node={tasks}", f"--gpus-per-node={tasks}",
                        "--cpus-per-task=1", f"--output={log}", "--time=10", os.path.join(SOURCE, "slurm", "run.sbatch"),
                        "group", path, "--quiet"],
                       env=dict(MPI_ENV, DEEPEN_BIN=self.deepen, DEEPEN_HOME=SOURCE, DEEPEN_LAUNCHER=launcher,
                                **(env or {})), cwd=out)
        return job, log

    @staticmethod
    def wait_requeued(c, job, log, restarts):
        """Waits until the script requeued the job `restarts` times, then releases it at once."""
        deadline = time.time() + 180
        while int(c.job(job).get("Restarts", "0")) < restarts:
            assert time.time() < deadline, f"job {job} not requeued within 180 s\n{open(log).read()[-3000:]}"
            assert c.job(job).get("JobState") not in TERMINAL, f"job {job} ended instead of requeueing:\n" + \
                open(log).read()[-3000:]
            time.sleep(0.1)
        c.wait_state(job, {"PENDING", "RUNNING"} | TERMINAL, timeout=60, poll=0.1)
        c.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=False)
        c.wait_state(job, {"RUNNING"} | TERMINAL, timeout=120)

    @staticmethod
    def same_as(alone, got, what):
        """Every metrics and eval record equal, bit for bit (the group computes what the run alone does)."""
        ra, rg = records(alone, "metrics.jsonl"), records(got, "metrics.jsonl")
        assert [r["step"] for r in ra] == [r["step"] for r in rg], f"{what}: steps differ"
        for a, b in zip(ra, rg):
            for key in ("loss", "kl", "ce", "depth"):
                assert a[key] == b[key], f"{what}: step {a['step']} {key}: alone {a[key]}, in the group {b[key]}"
        assert records(alone, "eval.jsonl") == records(got, "eval.jsonl") or \
            [(e["step"], e["val_ce"]) for e in records(alone, "eval.jsonl")] == \
            [(e["step"], e["val_ce"]) for e in records(got, "eval.jsonl")], f"{what}: eval records differ"
        return len(rg)

    def group_requeue(self, launcher):
        out = os.path.join(self.work, f"slurm-group-requeue-{launcher}")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        runs = [("short", ["curriculum.stage_steps=[10, 10, 10]", "checkpoint.every=10"]),
                ("long", ['student.norm="post"', "checkpoint.every=10"])]
        alone = self.by_hand_alone(out, runs[1:])
        path = self.group_runs_file(out, "slurm", runs)
        with Cluster() as c:
            t0 = time.time()
            job, log = self.submit_group(c, out, path, 4, launcher)
            short_final = os.path.join(out, "slurm", "short", "final")
            deadline = time.time() + 300
            while not (os.path.isdir(short_final) and self.lines(os.path.join(out, "slurm", "long")) >= 40):
                assert c.job(job).get("JobState") not in TERMINAL, open(log).read()[-3000:]
                assert time.time() < deadline, f"no final/ of the short run in 300 s\n{open(log).read()[-3000:]}"
                time.sleep(0.1)
            c.run(["scancel", "--signal=USR1", "--batch", job])
            self.wait_requeued(c, job, log, 1)
            info = c.wait_state(job, TERMINAL, timeout=600)
            text = open(log).read()
            assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", \
                f"job {job}: {info['JobState']} {info['ExitCode']}\n{text[-4000:]}"
            assert info.get("Restarts") == "1", f"job {job}: Restarts={info.get('Restarts')}"
            assert "the job's exit code is 3 (its runs: short 0, long 3)" in text, text[-4000:]
            assert "stopped at a checkpoint; requeueing" in text, text[-4000:]
            assert "[short] finished earlier; not trained again" in text, text[-4000:]
            print(f"group job {job} ({launcher}): USR1 after the short run's final/: ranks left with 0 and 3, the job "
                  f"code 3, requeued once, COMPLETED in {time.time() - t0:.1f} s")
        n = self.same_as(alone["long"], os.path.join(out, "slurm", "long"), "long: requeued beside a finished run")
        print(f"long: {n} steps equal to the run alone by hand")

    @staticmethod
    def lines(run_dir, name="metrics.jsonl"):
        path = os.path.join(run_dir, name)
        return sum(1 for _ in open(path)) if os.path.exists(path) else 0

    def group_faults(self):
        out = os.path.join(self.work, "slurm-group-faults")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        runs = [("short", ["curriculum.stage_steps=[10, 10, 10]", "checkpoint.every=5"]),
                ("mid", ['student.norm="post"', "curriculum.stage_steps=[20, 20, 20]", "checkpoint.every=10"]),
                ("long", ["checkpoint.every=15"]),
                ("nan", ['student.norm="post"', "checkpoint.every=20"])]
        alone = self.by_hand_alone(out, runs[:3])
        path = self.group_runs_file(out, "slurm", runs)
        folder = {name: os.path.join(out, "slurm", name) for name, _ in runs}
        with Cluster() as c:
            t0 = time.time()
            job, log = self.submit_group(c, out, path, 6, "srun", env={"DEEPEN_FAULT_NAN": "0:70:nan"})
            # First preemption while every run trains; the second once the shortest has finished.
            for restarts, ready in ((1, lambda: self.lines(folder["mid"]) >= 15),
                                    (2, lambda: os.path.isdir(os.path.join(folder["short"], "final")) and
                                     self.lines(folder["long"]) >= 45)):
                deadline = time.time() + 300
                while not ready():
                    assert c.job(job).get("JobState") not in TERMINAL, open(log).read()[-3000:]
                    assert time.time() < deadline, f"preemption {restarts}: not ready in 300 s\n{open(log).read()[-3000:]}"
                    time.sleep(0.1)
                c.run(["scancel", "--signal=USR1", "--batch", job])
                self.wait_requeued(c, job, log, restarts)
                print(f"preemption {restarts} at {time.time() - t0:.1f} s: short {self.lines(folder['short'])}, mid "
                      f"{self.lines(folder['mid'])}, long {self.lines(folder['long'])}, nan {self.lines(folder['nan'])} steps")
            info = c.wait_state(job, TERMINAL, timeout=600)
            text = open(log).read()
            assert info["JobState"] == "FAILED" and info["ExitCode"] == "4:0", \
                f"a run diverged: the job ends with 4 and no requeue, got {info['JobState']} {info['ExitCode']}\n{text[-4000:]}"
            time.sleep(3)  # a requeue would show within Slurm's scheduling interval
            assert c.job(job).get("Restarts") == "2", f"requeued {c.job(job).get('Restarts')} times, not twice"
            assert "ABORT" not in text, "one run's divergence aborted the others:\n" + text[-4000:]
            assert "the divergence guard stopped a run" in text and "not requeueing" in text, text[-3000:]
            print(f"group job {job}: preempted twice, requeued twice, then {info['JobState']} {info['ExitCode']} "
                  f"(the NaN run diverged) in {time.time() - t0:.1f} s")
        guard = records(folder["nan"], "guard.jsonl")
        assert [(g["step"], g["event"]) for g in guard] == [(70, "stopped")], guard
        assert not os.path.exists(os.path.join(folder["nan"], "final"))
        # Its last good checkpoint: the newest before step 70 (every 20 steps, or a preemption's).
        kept = sorted(n for n in os.listdir(os.path.join(folder["nan"], "checkpoints")) if n.startswith("step_"))
        last_good = max(n for n in kept if int(n[5:]) < 70)
        assert "Last good checkpoint: " + os.path.join(folder["nan"], "checkpoints", last_good) in text, text[-3000:]
        for name in ("short", "mid", "long"):
            n = self.same_as(alone[name], folder[name], f"{name}: preempted twice beside a diverging run")
            assert os.path.isdir(os.path.join(folder[name], "final")), name
            print(f"{name}: {n} steps, equal to the run alone by hand")
        report = os.path.join(out, "report")
        run([self.deepen, "report", os.path.join(out, "slurm"), "--out", report, "--no-plots"])
        md = open(os.path.join(report, "report.md")).read()
        assert "nan diverged at step 70" in md, md[:3000]
        print(f"nan: guard.jsonl 'stopped' at step 70, last good checkpoint {last_good}; the report says it diverged")

    def study(self):
        out = os.path.join(self.work, "slurm-study")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        runs, scripts, report = (os.path.join(out, d) for d in ("runs", "slurm", "report"))
        # The demo's base config on the e2e fixture's data and teacher (no second teacher to train);
        # its student takes the teacher's layer shapes (student.init = "teacher").
        sets = [f'data.train="{self.work}/data/train"', f'data.valid="{self.work}/data/valid"',
                f'teacher.checkpoint="{self.work}/teacher/final/hf"', 'run.device="cpu"',
                "student.hidden=48", "student.head_dim=12", "student.intermediate=96"]
        cmd = [self.deepen, "study", os.path.join(SOURCE, "configs", "demo", "study_slurm.toml"), "--out", runs,
               "--slurm", scripts, "--gpus-per-node", "4", "--cpus-per-task", "1", "--time", "10"]
        p = subprocess.run(cmd + sum((["--set", x] for x in sets), []), capture_output=True, text=True, timeout=120,
                           cwd=out)
        assert p.returncode == 0, f"deepen study --slurm failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-3000:]}"
        with Cluster() as c:
            t0 = time.time()
            p = subprocess.run([os.path.join(scripts, "submit.sh")], capture_output=True, text=True, timeout=120,
                               env=dict(c.env, **MPI_ENV), cwd=out)
            assert p.returncode == 0, f"submit.sh failed ({p.returncode}):\n{p.stdout}{p.stderr}"
            print(p.stdout.strip())
            ids = sorted(set(re.findall(r"^(?:array (\d+):|.*: job (\d+)_)", p.stdout, re.M)))
            jobs = sorted({a or b for a, b in ids})
            assert len(jobs) == 2, f"expected one array of the four independent runs and one matched job:\n{p.stdout}"
            matched = re.search(r"post-joint-matched\S*: job (\d+_\d+) after (\d+_\d+)", p.stdout)
            assert matched, f"the matched run must wait for post-grow:\n{p.stdout}"
            deadline = time.time() + 600
            tasks = []
            while time.time() < deadline:
                tasks = [t for j in jobs for t in c.jobs(j)]
                if len(tasks) == 5 and all(t.get("JobState") in TERMINAL for t in tasks):
                    break
                bad = [t for t in tasks if t.get("JobState") in TERMINAL - {"COMPLETED"}]
                assert not bad, f"{bad[0].get('JobId')} {bad[0].get('JobState')}:\n" + _logs(scripts)
                time.sleep(0.5)
            else:
                raise AssertionError("the study's jobs did not finish within 600 s:\n" +
                                     "\n".join(f"{t.get('JobId')} {t.get('JobState')} {t.get('Reason')}" for t in tasks))
            by_id = {f"{t['ArrayJobId']}_{t['ArrayTaskId']}": t for t in tasks}
            for name, t in by_id.items():
                assert t["JobState"] == "COMPLETED" and t["ExitCode"] == "0:0", f"{name}: {t['JobState']} {t['ExitCode']}"
            waited, upstream = by_id[matched.group(1)], by_id[matched.group(2)]
            assert waited.get("Dependency", "(null)") == "(null)" or "afterok" in waited.get("Dependency", "")
            assert waited["StartTime"] >= upstream["EndTime"], \
                f"the matched run started {waited['StartTime']}, before post-grow ended {upstream['EndTime']}"
            print(f"study: 5 runs COMPLETED in {time.time() - t0:.1f} s; {matched.group(1)} started "
                  f"{waited['StartTime']} after {matched.group(2)} ended {upstream['EndTime']}")
        p = subprocess.run([self.deepen, "report", runs, "--out", report, "--no-plots"], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, f"deepen report failed ({p.returncode}): {p.stderr[-3000:]}"
        md = open(os.path.join(report, "report.md")).read()
        for role in ("pre-joint", "post-joint", "pre-grow", "post-grow", "post-joint-matched"):
            assert f"| {role} |" in md, f"report.md has no row for {role}:\n{md[:3000]}"
        grow = json.load(open(os.path.join(runs, "post-grow", "seed1", "active_layer_tokens.json")))
        joint = json.load(open(os.path.join(runs, "post-joint-matched", "seed1", "active_layer_tokens.json")))
        assert joint["complete"] and joint["active_layer_tokens"] == grow["active_layer_tokens"], \
            f"the matched run must spend post-grow's active-layer tokens: {joint} vs {grow}"
        print(f"deepen report: a row for each of the five runs; post-joint-matched spent post-grow's "
              f"{grow['active_layer_tokens']:,} active-layer tokens in {joint['steps']} steps (post-grow: {grow['steps']})")


    def study_shared(self):
        """The same study with --share-teacher --max-group-runs 2: the joint pair and the grow pair each
        train as one group job of 1 x 2 + 2 x 2 = 6 tasks, the matched run alone after the grow group."""
        out = os.path.join(self.work, "slurm-study-shared")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        runs, scripts = os.path.join(out, "runs"), os.path.join(out, "slurm")
        sets = [f'data.train="{self.work}/data/train"', f'data.valid="{self.work}/data/valid"',
                f'teacher.checkpoint="{self.work}/teacher/final/hf"', 'run.device="cpu"',
                "student.hidden=48", "student.head_dim=12", "student.intermediate=96"]
        cmd = [self.deepen, "study", os.path.join(SOURCE, "configs", "demo", "study_slurm.toml"), "--out", runs,
               "--slurm", scripts, "--share-teacher", "--max-group-runs", "2", "--gpus-per-node", "8",
               "--cpus-per-task", "1", "--time", "10"]
        p = subprocess.run(cmd + sum((["--set", x] for x in sets), []), capture_output=True, text=True, timeout=120,
                           cwd=out)
        assert p.returncode == 0, f"deepen study --slurm failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-3000:]}"
        listed = [l for l in open(os.path.join(scripts, "study.list")) if l.strip() and not l.startswith("#")]
        assert [l.split()[0] for l in listed[:2]] == ["group", "group"] and len(listed) == 3, listed
        with Cluster() as c:
            p = subprocess.run([os.path.join(scripts, "submit.sh")], capture_output=True, text=True, timeout=120,
                               env=dict(c.env, **MPI_ENV), cwd=out)
            assert p.returncode == 0, f"submit.sh failed ({p.returncode}):\n{p.stdout}{p.stderr}"
            print(p.stdout.strip())
            jobs = sorted(set(re.findall(r"^array (\d+):", p.stdout, re.M) + re.findall(r": job (\d+)_", p.stdout)))
            matched = re.search(r"post-joint-matched\S*: job (\d+_\d+) after (\d+_\d+)", p.stdout)
            assert len(jobs) == 2 and matched, f"one array of the two groups and the matched job after one:\n{p.stdout}"
            deadline = time.time() + 600
            tasks = []
            while time.time() < deadline:
                tasks = [t for j in jobs for t in c.jobs(j)]
                if len(tasks) == 3 and all(t.get("JobState") in TERMINAL for t in tasks):
                    break
                bad = [t for t in tasks if t.get("JobState") in TERMINAL - {"COMPLETED"}]
                assert not bad, f"{bad[0].get('JobId')} {bad[0].get('JobState')}:\n" + _logs(scripts)
                time.sleep(0.5)
            else:
                raise AssertionError("the study's jobs did not finish within 600 s:\n" + _logs(scripts))
            by_id = {f"{t['ArrayJobId']}_{t['ArrayTaskId']}": t for t in tasks}
            for name, t in by_id.items():
                assert t["JobState"] == "COMPLETED" and t["ExitCode"] == "0:0", f"{name}: {t['JobState']} {t['ExitCode']}"
                if t["ArrayTaskId"] in ("0", "1"):
                    assert t["NumTasks"] == "6", f"{name}: a group of two runs is one allocation of 6 tasks, got {t['NumTasks']}"
            waited, upstream = by_id[matched.group(1)], by_id[matched.group(2)]
            assert waited["StartTime"] >= upstream["EndTime"], (waited["StartTime"], upstream["EndTime"])
        for run_name in ("pre-joint", "post-joint", "pre-grow", "post-grow", "post-joint-matched"):
            done = json.load(open(os.path.join(runs, run_name, "seed1", "active_layer_tokens.json")))
            assert done["complete"], f"{run_name} did not finish: {done}"
        for g in ("g0", "g1"):
            passes = [json.loads(l)["passes"] for l in open(os.path.join(runs, "groups", g, "job", "step_time", "rank1.jsonl"))]
            assert passes, g
        print("study with a shared teacher on Slurm: 2 group jobs of 6 tasks and the matched run after the grow "
              "group, all 5 runs complete")


def _logs(folder):
    text = ""
    for name in sorted(os.listdir(os.path.join(folder, "logs"))):
        text += f"--- {name}\n" + open(os.path.join(folder, "logs", name)).read()[-2000:]
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepen", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("case")
    a = ap.parse_args()
    skip_if_unavailable()
    j = Jobs(a.deepen, a.work)
    {"launch-srun": lambda: j.launch("srun"), "launch-mpirun": lambda: j.launch("mpirun"),
     "node-failure": j.node_failure, "preempt": lambda: j.preempt(False),
     "preempt-timelimit": lambda: j.preempt(True), "study": j.study, "study-shared": j.study_shared,
     "preempt-group": j.preempt_group, "group-requeue-srun": lambda: j.group_requeue("srun"),
     "group-requeue-mpirun": lambda: j.group_requeue("mpirun"), "group-faults": j.group_faults}[a.case]()


if __name__ == "__main__":
    main()
