#!/usr/bin/env python3
"""A real one-node Slurm cluster for the tests: munged + slurmctld + slurmd in a fresh temporary folder.

    with Cluster() as c:          # starts the daemons, waits for the node to be idle (time-limited)
        job = c.sbatch(["--wrap", "hostname"], env=...)
        c.wait_state(job, {"COMPLETED"}, timeout=30)
    # leaving the block stops every daemon by its PID (also on failure) and removes the folder

    python3 tests/slurm/cluster.py -- COMMAND...   # COMMAND with SLURM_CONF set, then waits for the
                                                   # queue to empty and stops the cluster

Why each piece is as it is (the measured facts: tests/slurm/README.md):
- Everything (state, spool, logs, PID files, munge socket and key) lives in one fresh folder, and the
  ports are picked free, so old jobs never come back and two clusters can run side by side.
- munged runs as the `munge` user with its own key and socket; slurm.conf points at that socket.
- CPUs=8 on a 2-core machine (config_overrides): a 4-rank job must be able to start. As many
  "GPUs" (a gres whose device files are empty files), so the scripts' --gpus-per-node requests are granted.
- proctrack/pgid: linuxproc leaves a batch script's background children running after the job.
- short scheduler intervals and cred_expire: a requeued job starts again in seconds, not ~150 s.
Skips (exit 77, ctest's SKIP_RETURN_CODE) with the reason when the Slurm or munge packages are
missing or the tests are not run as root.
"""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time

SKIP = 77  # ctest SKIP_RETURN_CODE for every Slurm test
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "sinfo", "scancel", "srun")


def missing_reason():
    """Why no cluster can run here, or None."""
    gone = [d for d in DAEMONS if not shutil.which(d) and not os.path.exists(f"/usr/sbin/{d}")]
    if gone:
        return ("Slurm packages missing (" + ", ".join(gone) + "): apt-get install --no-install-recommends "
                "slurmctld slurmd slurm-client munge (scripts/setup.sh does)")
    if os.geteuid() != 0:
        return "the Slurm daemons need root (slurmd runs jobs as their user)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no 'munge' user (the munge package creates it)"
    return None


def skip_if_unavailable(missing=None):
    """Exits 77 (ctest's skip) with the reason when `missing` (default: missing_reason) finds one."""
    reason = (missing or missing_reason)()
    if reason:
        print(f"SKIP: {reason}")
        raise SystemExit(SKIP)


# The slurm.conf keys every test cluster shares (tests/slurm/README.md says why each is there).
SLURM_CONF_COMMON = """SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobRequeue=1
ReturnToService=2
SchedulerParameters=sched_interval=5,bf_interval=5
SlurmdParameters=config_overrides
KillWait=5
InactiveLimit=0
MinJobAge=300
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sbin(name):
    return shutil.which(name) or f"/usr/sbin/{name}"


class Cluster:
    def __init__(self, cpus=8, node=None):
        # NodeName = the host name, as on a real cluster: Open MPI's mpirun then sees the allocation
        # as this host (a different NodeName makes it launch an orted "remotely" on itself).
        self.cpus, self.node = cpus, node or socket.gethostname().split(".")[0]
        self._make_folder(tempfile.mkdtemp(prefix="deepen-slurm-"))
        self.client = []  # prefix of every Slurm client command (nodes_cluster.py: enter the first node)

    def _make_folder(self, folder):
        """The cluster's folder, its slurm.conf's path, the clients' environment."""
        self.dir = folder
        os.chmod(self.dir, 0o755)  # munged (user munge) must reach its subfolder
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        for k in list(self.env):  # a test run inside a Slurm job must not leak the outer job's ids
            if k.startswith("SLURM_") and k != "SLURM_CONF":
                del self.env[k]
        self.pids = {}

    # ---- lifecycle ----
    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        if exc[0] is not None:
            self.dump_logs()
        self.stop()
        return False

    def start(self, timeout=30):
        self._start_munge()
        host = socket.gethostname().split(".")[0]
        d = self.dir
        for sub in ("state", "spool", "log"):
            os.makedirs(os.path.join(d, sub))
        with open(self.conf, "w") as f:
            f.write(f"""# one-node test cluster (tests/slurm/cluster.py)
ClusterName=deepentest
SlurmctldHost={host}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire=10
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
{SLURM_CONF_COMMON}GresTypes=gpu
NodeName={self.node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=4000 Gres=gpu:{self.cpus} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")
        # slurmd drops a GPU without a device file; plain files do (nothing opens them).
        for i in range(self.cpus):
            open(os.path.join(d, f"gpu{i}"), "w").close()
        with open(os.path.join(d, "gres.conf"), "w") as f:
            f.write(f"NodeName={self.node} Name=gpu File={d}/gpu[0-{self.cpus - 1}]\n")
        self.ctld_started = time.time()  # slurmctld's periodic checks (time limits, --signal) count from here
        subprocess.run([sbin("slurmctld"), "-f", self.conf], env=self.env, check=True, timeout=30)
        self.pids["slurmctld"] = self._read_pid("slurmctld.pid", timeout)
        subprocess.run([sbin("slurmd"), "-N", self.node, "-f", self.conf], env=self.env, check=True, timeout=30)
        self.pids["slurmd"] = self._read_pid("slurmd.pid", timeout)
        self._start_guard()
        deadline = time.time() + timeout
        state = ""
        while time.time() < deadline:
            p = subprocess.run(self.client + ["sinfo", "-h", "-n", self.node, "-o", "%T"], env=self.env,
                               capture_output=True, text=True, timeout=10)
            state = p.stdout.strip()
            if state == "idle":
                return
            time.sleep(0.2)
        raise RuntimeError(f"node {self.node} not idle within {timeout} s (state {state!r})\n" + self.logs())

    def _start_munge(self):
        m = os.path.join(self.dir, "munge")
        os.makedirs(m)
        mu = pwd.getpwnam("munge")
        key = os.path.join(m, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(128))
        os.chmod(key, 0o400)
        for p in (m, key):
            os.chown(p, mu.pw_uid, mu.pw_gid)
        os.chmod(m, 0o755)
        self.munge_socket = os.path.join(m, "munge.socket")
        subprocess.run(["runuser", "-u", "munge", "--", sbin("munged"), f"--socket={self.munge_socket}",
                        f"--key-file={key}", f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log",
                        f"--seed-file={m}/munged.seed"], check=True, timeout=30)
        self.pids["munged"] = self._read_pid("munge/munged.pid", 10)

    def _read_pid(self, name, timeout):
        path = os.path.join(self.dir, name)
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                text = open(path).read().strip()
                if text:
                    return int(text)
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{path}: no PID file within {timeout} s\n" + self.logs())

    def _start_guard(self):
        # ctest kills a test that runs past its TIMEOUT with SIGKILL: no `finally` runs then. This
        # detached shell outlives us, notices, and does what stop() would (cancel, stop by PID).
        pids = " ".join(str(self.pids[n]) for n in ("slurmd", "slurmctld", "munged"))
        script = (f'while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; '
                  f'scancel --full --user=root; sleep 5; kill {pids}; sleep 5; kill -9 {pids}; rm -rf "$0"')
        self.guard = subprocess.Popen(["bash", "-c", script, self.dir], env=self.env, start_new_session=True,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self):
        """Cancels what is left and waits for it, stops the daemons by PID (SIGTERM, then SIGKILL after
        10 s), removes the folder."""
        if "slurmctld" in self.pids:
            # Job steps run under slurmstepd, which outlives slurmd: end the jobs before the daemons.
            subprocess.run(self.client + ["scancel", "--full", "--user=root"], env=self.env, capture_output=True,
                           timeout=10)
            deadline = time.time() + 30
            while time.time() < deadline:
                p = subprocess.run(self.client + ["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True,
                                   text=True, timeout=10)
                if p.returncode != 0 or not p.stdout.strip():
                    break
                time.sleep(0.2)
        guard = getattr(self, "guard", None)
        if guard is not None:
            guard.kill()
            guard.wait()
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.pop(name, None)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.time() + 10
            while time.time() < deadline and _alive(pid):
                time.sleep(0.05)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- jobs ----
    def sbatch(self, args, env=None, cwd=None):
        """Submits; returns the job id."""
        p = subprocess.run(self.client + ["sbatch", "--parsable"] + list(args), env=dict(self.env, **(env or {})), cwd=cwd,
                           capture_output=True, text=True, timeout=30)
        if p.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} failed ({p.returncode}): {p.stderr}")
        return p.stdout.strip().split(";")[0]

    def job(self, job_id):
        """scontrol show job as a dict (empty when Slurm no longer knows the job)."""
        p = subprocess.run(self.client + ["scontrol", "-o", "show", "job", str(job_id)], env=self.env,
                           capture_output=True, text=True, timeout=10)
        out = {}
        for word in p.stdout.split():
            if "=" in word:
                k, v = word.split("=", 1)
                out.setdefault(k, v)
        return out

    def jobs(self, job_id):
        """Every record of a job (array tasks each have one), as dicts."""
        p = subprocess.run(self.client + ["scontrol", "-o", "show", "job", str(job_id)], env=self.env,
                           capture_output=True, text=True, timeout=10)
        recs = []
        for line in p.stdout.splitlines():
            rec = {}
            for word in line.split():
                if "=" in word:
                    k, v = word.split("=", 1)
                    rec.setdefault(k, v)
            if rec:
                recs.append(rec)
        return recs

    def wait_state(self, job_id, states, timeout, poll=0.2):
        """Waits until the job's state is one of `states`; returns the job's dict. Fails with the logs on timeout."""
        deadline = time.time() + timeout
        info = {}
        while time.time() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(poll)
        raise AssertionError(f"job {job_id} not in {sorted(states)} within {timeout} s: "
                             f"{info.get('JobState')} ({info.get('Reason')})\n" + self.logs())

    def run(self, cmd, timeout=30, check=True):
        p = subprocess.run(self.client + list(cmd), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr}")
        return p

    def logs(self):
        text = ""
        for name in ("log/slurmctld.log", "log/slurmd.log"):
            try:
                text += f"--- {name} (tail)\n" + "".join(open(os.path.join(self.dir, name)).readlines()[-25:])
            except OSError:
                pass
        return text

    def dump_logs(self):
        print(self.logs())


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of ours counts as gone (the daemons are not our children: they daemonize)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def main(argv):
    """python3 tests/slurm/cluster.py [--timeout S] [-- COMMAND ...]

    Starts a cluster, runs COMMAND with SLURM_CONF pointing at it (default: a 4-task srun check),
    waits until no job is left in the queue (at most --timeout seconds), and stops the cluster."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the queue to empty")
    ap.add_argument("command", nargs="*")
    a = ap.parse_args(argv)
    skip_if_unavailable()
    t0 = time.time()
    with Cluster() as c:
        print(f"cluster: up in {time.time() - t0:.1f} s (SLURM_CONF={c.conf})", flush=True)
        cmd = a.command or ["sbatch", "-n4", "--wait", "--output=/dev/null", "--wrap", "srun true"]
        rc = subprocess.run(cmd, env=c.env).returncode
        deadline = time.time() + a.timeout
        while time.time() < deadline:
            if not c.run(["squeue", "-h", "-o", "%i"], check=False).stdout.strip():
                break
            time.sleep(1)
        else:
            print(f"cluster: jobs still queued after {a.timeout:.0f} s; cancelling them", flush=True)
            rc = rc or 1
    print(f"cluster: stopped; {time.time() - t0:.1f} s in all, command exit code {rc}")
    return rc


if __name__ == "__main__":
    import sys
    raise SystemExit(main(sys.argv[1:]))
