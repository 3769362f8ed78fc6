#!/usr/bin/env python3
"""Faults in a real 4-rank job (1 pipeline x 2 stages + 2 students under mpirun), on loopback.

  python3 tests/e2e/faults.py --deepen build/deepen --work build/tests/e2e CASE

Uses the fixture of distributed_train.py (`setup`). Cases:
  reference      the uninterrupted run the others are compared with
  kill-student   SIGKILL one student mid-run: every other rank exits non-zero within 30 s, naming the
                 dead rank, its host and last step; rerunning resumes from the last good checkpoint
                 and the whole loss curve equals an uninterrupted run
  kill-teacher   the same with a teacher stage
  sigusr1        SIGUSR1 to one rank: coordinated stop, checkpoint, exit 3; resume == uninterrupted
  corrupt        newest checkpoint truncated: the rerun says so, falls back to the previous one,
                 and still ends on the uninterrupted curve
  metrics        /metrics scraped during a run is Prometheus text (read by prometheus_client's parser)
                 whose step increases, with step time by part from every role
  nan            NaN teacher targets on student 1 at step 25 (DEEPEN_FAULT_NAN): every rank stops with
                 exit 4 and the guard's message (step, student, quantity, last good checkpoint), the
                 job's exit code file says 4, no checkpoint or record past step 24, every tensor
                 finite; resumed with --set guard.lr_scale=0.5 it finishes from step_00000019
  all-corrupt    every checkpoint truncated: the rerun is refused on every rank (exit 2) naming the
                 folder, the checkpoints and the records, and the folder is left as it was
  stale-tmp      kill -9 a student, leaving the temporary folder a kill mid-checkpoint leaves
                 (step_N.tmp-<its pid>): the resume removes it and ends on the uninterrupted curve
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distributed_train import MPI_ENV, Cases, rank_pid, records, run  # noqa: E402

LAYOUT = ["parallel.teacher_stages=2", "parallel.students=2", "curriculum.stage_steps=[40, 40, 40]",
          "checkpoint.every=10", "control.heartbeat_s=0.1", "control.watchdog_s=10"]


class Faults(Cases):
    running = []

    def command(self, out, sets=(), fresh=True):
        cmd = ["mpirun", "-np", "4", self.deepen, "train", self.base, "--quiet", "--set", f'run.out_dir="{out}"']
        if fresh:
            cmd.append("--fresh")
        for s in list(LAYOUT) + list(sets):
            cmd += ["--set", s]
        return cmd

    def uninterrupted(self):
        ref = os.path.join(self.work, "faults-reference")
        if not os.path.exists(os.path.join(ref, "final")):
            run(self.command(ref), env=MPI_ENV)
        return ref

    def start(self, out, sets=()):
        shutil.rmtree(out, ignore_errors=True)  # records of an earlier attempt would fool wait_for_steps
        proc = subprocess.Popen(self.command(out, sets), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=dict(os.environ, **MPI_ENV), start_new_session=True)
        self.running.append(proc)
        return proc

    def __del__(self):
        for proc in getattr(self, "running", []):  # a failed case leaves no job behind
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    @staticmethod
    def wait_for_steps(out, n, proc, timeout=300):
        deadline = time.time() + timeout
        path = os.path.join(out, "metrics.jsonl")
        while time.time() < deadline:
            assert proc.poll() is None, f"job ended early: {proc.stderr.read()[-3000:]}"
            if os.path.exists(path) and sum(1 for _ in open(path)) >= n:
                return
            time.sleep(0.05)
        raise SystemExit(f"no {n} steps within {timeout} s")

    def resume_and_compare(self, out, expect_in_stderr=()):
        p = run(self.command(out, fresh=False), env=MPI_ENV)
        for text in expect_in_stderr:
            assert text in p.stderr, f"expected {text!r} in the rerun's stderr:\n{p.stderr[-3000:]}"
        a, b = records(self.uninterrupted(), "metrics.jsonl"), records(out, "metrics.jsonl")
        assert [r["step"] for r in b] == list(range(120)), "the resumed run's records must read as one run"
        worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
        assert worst <= 1e-6, f"resumed loss curve differs from the uninterrupted one (worst rel {worst:.2e})"
        print(f"{out}: resumed and finished; 120 steps equal the uninterrupted run (worst rel {worst:.1e})")

    def kill(self, rank, what):
        self.uninterrupted()
        out = os.path.join(self.work, f"faults-kill-{what}")
        proc = self.start(out)
        self.wait_for_steps(out, 35, proc)
        os.kill(rank_pid(out, "OMPI_COMM_WORLD_RANK", rank), signal.SIGKILL)
        killed = time.time()
        _, err = proc.communicate(timeout=60)
        took = time.time() - killed
        assert proc.returncode != 0, "the job must fail when a rank dies"
        assert took <= 30, f"the job took {took:.1f} s to end after the kill"
        aborts = [l for l in err.splitlines() if "ABORT" in l]
        # The dead rank's last heartbeat may predate its first step on a fast machine.
        named = re.compile(rf"rank {rank} on \S+ \(.*\), (last step \d+|before its first step)")
        assert sum(1 for l in aborts if named.search(l)) >= 3, "every other rank names the dead one:\n" + err[-3000:]
        print(f"kill -9 rank {rank} ({what}): job ended {took:.1f} s later; {aborts[0].strip()}")
        self.resume_and_compare(out)

    def sigusr1(self):
        self.uninterrupted()
        out = os.path.join(self.work, "faults-sigusr1")
        proc = self.start(out)
        self.wait_for_steps(out, 25, proc)
        os.kill(rank_pid(out, "OMPI_COMM_WORLD_RANK", 1), signal.SIGUSR1)  # a teacher stage: any rank may be signalled
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 3, f"a coordinated stop exits 3 (requeue), got {proc.returncode}: {err[-3000:]}"
        agreed = [l for l in err.splitlines() if "coordinated stop agreed" in l]
        assert agreed, err[-3000:]
        stop = int(re.search(r"once (\d+) steps", agreed[0]).group(1))
        assert len(records(out, "metrics.jsonl")) == stop
        assert os.path.isdir(os.path.join(out, "checkpoints", f"step_{stop - 1:08d}")), "checkpoint at the stop step"
        print(f"SIGUSR1: {agreed[0].strip()}; checkpoint step_{stop - 1:08d}, exit 3")
        self.resume_and_compare(out)

    def corrupt(self):
        self.uninterrupted()
        out = os.path.join(self.work, "faults-corrupt")
        p = run(self.command(out, sets=["checkpoint.keep=3"]) + ["--stop-after", "60"], env=MPI_ENV, check=False)
        assert p.returncode == 3, p.stderr[-2000:]
        newest = os.path.join(out, "checkpoints", "step_00000059", "student.safetensors")
        with open(newest, "r+b") as f:
            f.truncate(os.path.getsize(newest) // 2)
        self.resume_and_compare(out, expect_in_stderr=("step_00000059 is corrupt", "falling back"))

    def metrics(self):
        # The Prometheus project's own parser (requirements.txt): it raises on text Prometheus cannot read.
        from prometheus_client.parser import text_string_to_metric_families
        out = os.path.join(self.work, "faults-metrics")
        port = 20000 + os.getpid() % 20000
        proc = self.start(out, sets=[f"control.metrics_port={port}", "curriculum.stage_steps=[1000, 1000, 1000]"])
        try:
            self.wait_for_steps(out, 5, proc)
            steps = []
            for _ in range(2):
                deadline = time.time() + 60
                while True:  # until student 0's heartbeat carries a step past the previous scrape
                    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
                    try:
                        families = {f.name: f for f in text_string_to_metric_families(text)}
                    except ValueError as e:
                        raise AssertionError(f"not Prometheus text ({e}):\n{text[:3000]}")

                    def values(family, role):
                        return [s.value for s in (families[family].samples if family in families else [])
                                if s.labels.get("role") == role]
                    step = values("deepen_step", "student 0")
                    loss = families["deepen_train_loss"].samples if "deepen_train_loss" in families else []
                    # Where the step time went, from every role (run_folder/step_time.h). Each rank's
                    # parts arrive with its next heartbeat after a step, so a rank whose first
                    # heartbeat with a step is still on its way (a loaded machine) is waited for.
                    missing = [(role, part) for role, part in (("student 0", "compute"), ("student 0", "teacher_wait"),
                                                               ("teacher p0 s0", "compute"), ("teacher p0 s1", "send_wait"))
                               if not values(f"deepen_step_{part}_seconds", role)]
                    if step and loss and step[0] > (steps[-1] if steps else 0) and not missing:
                        steps.append(step[0])
                        break
                    assert time.time() < deadline, \
                        f"student 0's step did not advance past {steps}, or no step time from {missing}:\n{text[:3000]}"
                    time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
        print(f"/metrics: student 0 step {steps[0]:.0f} -> {steps[1]:.0f}, valid Prometheus text, step time by part on every role")


    def nan(self):
        out = os.path.join(self.work, "faults-nan")
        exit_file = os.path.join(self.work, "faults-nan-exit-code")
        if os.path.exists(exit_file):
            os.remove(exit_file)
        p = run(self.command(out), env=dict(MPI_ENV, DEEPEN_FAULT_NAN="1:25", DEEPEN_EXIT_CODE_FILE=exit_file),
                check=False)
        err = p.stderr
        assert p.returncode != 0, "a diverged run must fail"
        head = "guard: step 25: the loss is nan on student 1 (world rank 3)"
        lines = [l for l in err.splitlines() if head in l]
        assert len(lines) >= 4, f"every rank's log names the step, student and quantity:\n{err[-4000:]}"
        last_good = os.path.join(out, "checkpoints", "step_00000019")
        assert f"Last good checkpoint: {last_good} (after step 19)" in err, err[-4000:]
        with open(exit_file) as f:
            assert f.read().strip() == "4", "the job's exit code (what slurm/lib.sh returns) is the guard's"
        assert [r["step"] for r in records(out, "metrics.jsonl")] == list(range(25))
        assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["step_00000009", "step_00000019"]
        assert not os.path.exists(os.path.join(out, "final"))
        assert records(out, "guard.jsonl")[0]["event"] == "stopped"
        print(f"NaN at step 25 on student 1: {lines[0].strip()[:200]}")
        p = run(self.command(out, sets=["guard.lr_scale=0.5"], fresh=False), env=MPI_ENV)
        b = records(out, "metrics.jsonl")
        assert [r["step"] for r in b] == list(range(120)), "the resumed run's records must read as one run"
        ref = records(self.uninterrupted(), "metrics.jsonl")
        assert all(abs(x["lr"] - 0.5 * y["lr"]) <= 1e-12 * y["lr"] for x, y in zip(b[20:], ref[20:])), "lr halved"
        assert all(isinstance(r["loss"], float) for r in b), "every loss finite"
        print(f"{out}: resumed from step_00000019 with guard.lr_scale = 0.5 and finished")

    def all_corrupt(self):
        out = os.path.join(self.work, "faults-all-corrupt")
        p = run(self.command(out) + ["--stop-after", "30"], env=MPI_ENV, check=False)
        assert p.returncode == 3, p.stderr[-2000:]
        ckpts = os.path.join(out, "checkpoints")
        for name in os.listdir(ckpts):
            path = os.path.join(ckpts, name, "student.safetensors")
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
        before = open(os.path.join(out, "metrics.jsonl")).read()
        p = run(self.command(out, fresh=False), env=MPI_ENV, check=False)
        assert p.returncode == 2, f"refused as bad input, got {p.returncode}: {p.stderr[-3000:]}"
        want = f"{out}: cannot resume: none of its 3 checkpoints is valid"
        # Counted in the text, not by line: ranks write stderr at once and their lines can interleave.
        assert p.stderr.count(want) >= 4, f"every rank says why:\n{p.stderr[-4000:]}"
        assert "metrics.jsonl (30 records)" in p.stderr and "--fresh" in p.stderr, p.stderr[-3000:]
        assert open(os.path.join(out, "metrics.jsonl")).read() == before, "the records are left as they were"
        assert len(os.listdir(ckpts)) == 3
        print(f"all checkpoints corrupt: exit 2, {want}")

    def stale_tmp(self):
        self.uninterrupted()
        out = os.path.join(self.work, "faults-stale-tmp")
        proc = self.start(out)
        self.wait_for_steps(out, 25, proc)
        pid = rank_pid(out, "OMPI_COMM_WORLD_RANK", 2)  # student 0, the checkpoint writer
        os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        # What a kill in the middle of a checkpoint leaves: the writer's temporary folder, half written.
        stale = os.path.join(out, "checkpoints", f"step_00000029.tmp-{pid}")
        os.makedirs(stale, exist_ok=True)
        with open(os.path.join(stale, "student.safetensors"), "wb") as f:
            f.write(b"\0" * 4096)
        self.resume_and_compare(out, expect_in_stderr=(f"removed {stale}",))
        left = [n for n in os.listdir(os.path.join(out, "checkpoints")) if ".tmp-" in n]
        assert not left, f"temporary folders left: {left}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepen", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("case")
    a = ap.parse_args()
    f = Faults(a.deepen, a.work)
    {"reference": f.uninterrupted, "kill-student": lambda: f.kill(3, "student"), "kill-teacher": lambda: f.kill(1, "teacher"),
     "sigusr1": f.sigusr1, "corrupt": f.corrupt, "metrics": f.metrics, "nan": f.nan, "all-corrupt": f.all_corrupt,
     "stale-tmp": f.stale_tmp}[a.case]()


if __name__ == "__main__":
    main()
