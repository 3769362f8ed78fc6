#!/usr/bin/env python3
"""Faults across hosts, on the three-node cluster of network namespaces (nodes_cluster.py).

  python3 tests/slurm/multinode_faults.py --deepen build/deepen --work build/tests/e2e CASE

The job is multinode_jobs.py's "roles" job (slurm/run.sbatch -N 2 x 2 tasks under srun: the teacher
pipeline's two stages on n1, the two students on n2, 30 steps, a checkpoint every 5), its reference the
same run on one host (bit for bit). Each case prints the time from the fault to the last rank's exit
(the ranks' processes watched in every node's namespace), and where the job is requeued, the resumed
run is checked equal to the uninterrupted one. Exit 77 (skip) where Slurm, root or namespaces are
missing. Cases:
  node-lost        n2 powered off mid-step (its link cut, then every process of it killed, slurmd and
                   munged included): the ranks on n1 leave with exit code 6 naming a rank on n2; the
                   script names n2 as unable to run a job step and requeues without it; the rerun on
                   n1 + n3 resumes and ends equal to the uninterrupted run
  link-cut         n2's link cut mid-step (its processes alive): every rank leaves within the
                   watchdog's bound with exit code 6; the link back, the requeued job resumes exactly
  link-cut-checkpoint  the same, cut while the students write a checkpoint: no half checkpoint
  slow-link        n2's link capped (tc tbf; this kernel has no netem for a delay): the job runs
                   slower, no abort, equal to the reference; the step-time breakdown says where the
                   time went, against the same job on the full link
  stale-binary     n2 runs another build of deepen (a copy whose build id differs, bind-mounted over
                   the binary in n2's mount namespace): refused at start with exit code 2 naming both
                   builds, their ranks and hosts; no rank did any work
  unreachable-coordinator  n2 cannot resolve n1 (its /etc/hosts without n1), then resolves it to an
                   address nobody has: each a named error on n2's ranks within the connect timeout
  control          the control plane across hosts: /metrics on n1 reachable from n2 only with
                   control.metrics_bind = "0.0.0.0"; from n3 (outside the job), garbage, a forged
                   Auth and 70 held connections are refused and counted on /metrics while the job goes
                   on, and the job still equals the reference bit for bit
"""
import argparse
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from distributed_train import records  # noqa: E402
from multinode_jobs import ROLES, STEPS, TERMINAL, Jobs  # noqa: E402
from slurm_jobs import Jobs as SlurmJobs  # noqa: E402
from nodes_cluster import NodesCluster, address, skip_if_unavailable  # noqa: E402

WATCHDOG_S = 10.0  # multinode_jobs.COMMON's control.watchdog_s
# Every rank has left by then after a fault: the watchdog's silence limit, then at most watchdog_s / 2
# for the rank's hard exit (launch/job_control.cpp), plus a heartbeat's worth of slack.
EXIT_BOUND_S = WATCHDOG_S + WATCHDOG_S / 2 + 2
CONNECT_S = 4.0  # unreachable-coordinator's control.watchdog_s, and so its connect timeout


class Faults(Jobs):
    wait_steps = staticmethod(SlurmJobs.wait_for_steps)

    @staticmethod
    def wait_gone(pids, timeout):
        """Seconds until every pid has exited (None if some are still there after `timeout`)."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            if not any(os.path.exists(f"/proc/{p}") and _state(p) != "Z" for p in pids):
                return time.time() - t0
            time.sleep(0.02)
        return None

    def requeued_and_done(self, c, job, log, timeout=600):
        """Waits for the job's requeue and its rerun's end (released at once once pending)."""
        deadline = time.time() + 180
        while c.job(job).get("Restarts", "0") == "0":
            assert time.time() < deadline, f"job {job} not requeued within 180 s\n{open(log).read()[-3000:]}\n{c.logs()}"
            assert c.job(job).get("JobState") not in TERMINAL, \
                f"job {job} ended instead of requeueing:\n{open(log).read()[-3000:]}"
            time.sleep(0.2)
        c.wait_state(job, {"PENDING", "RUNNING"} | TERMINAL, timeout=120, poll=0.2)
        c.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=False)
        info = c.wait_state(job, TERMINAL, timeout=timeout)
        text = open(log).read()
        assert info["JobState"] == "COMPLETED", f"job {job}: {info['JobState']} {info['ExitCode']}\n{text[-4000:]}"
        return info, text

    def fault_job(self, name, fault, restore=None, when=12):
        """Submits the roles job, waits `when` steps, runs fault(c, job, run_dir) -> (ranks' pids), times
        the last rank's exit, restores, waits for the requeued job, compares it; returns (c-free) facts."""
        refs = self.by_hand("roles", ROLES, 4)
        with NodesCluster() as c:
            job, run_dir, log = self.submit(c, name, ROLES, "srun")
            where, pids = self.transport_ranks(c, run_dir)
            self.wait_steps(c, job, run_dir, when)
            t_fault = time.time()
            what = fault(c, job, run_dir)
            took = self.wait_gone(list(pids.values()), 120)
            assert took is not None, f"{name}: ranks still alive 120 s after the fault"
            steps_then = len(records(run_dir, "metrics.jsonl"))
            print(f"{name} (job {job}): {what}; the last of the 4 ranks exited {took:.1f} s after the fault "
                  f"(bound {EXIT_BOUND_S:.0f} s: watchdog {WATCHDOG_S:.0f} s + hard exit {WATCHDOG_S / 2:.0f} s + 2), "
                  f"{steps_then} step records then")
            assert took <= EXIT_BOUND_S, f"{name}: the last rank left {took:.1f} s after the fault"
            self.check_checkpoints_whole(run_dir, name)
            if restore:
                restore(c)
            info, text = self.requeued_and_done(c, job, log)
            aborts = [l for l in text.splitlines() if "ABORT" in l]
            print(f"{name}: first abort message: {aborts[0].strip() if aborts else '(none)'}")
            for l in text.splitlines():
                if "deepen slurm:" in l and ("cannot run a job step" in l or "requeueing" in l or "every node" in l):
                    print(f"{name}: {l.strip()}")
            print(f"{name}: requeued (Restarts={info.get('Restarts')}), rerun on {info.get('NodeList')}: "
                  f"{info['JobState']} {info['ExitCode']}")
            assert json.load(open(os.path.join(run_dir, "run.json")))["resumed"] is True, f"{name}: the rerun did not resume"
            self.compare(run_dir, refs, f"{name}: the requeued job")
            return text, info

    def transport_ranks(self, c, run_dir):
        deadline = time.time() + 120
        while time.time() < deadline:
            where, pids = self.ranks_on_nodes(c, c.nodes, run_dir)
            if len(where) == 4:
                return where, pids
            time.sleep(0.1)
        raise AssertionError(f"the job's 4 ranks did not appear: {where}")

    @staticmethod
    def check_checkpoints_whole(run_dir, what):
        folder = os.path.join(run_dir, "checkpoints")
        whole = []
        for d in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if ".tmp" in d:
                continue
            assert os.path.exists(os.path.join(folder, d, "MANIFEST.json")), f"{what}: {d} is a half checkpoint"
            whole.append(d)
        print(f"{what}: checkpoints after the fault: {', '.join(whole)} (each with its MANIFEST.json); "
              f"temporary: {[d for d in os.listdir(folder) if '.tmp' in d] if os.path.isdir(folder) else []}")

    # ---- cases ----
    def node_lost(self):
        def power_off(c, job, run_dir):
            c.link("n2", up=False)  # a powered-off node sends nothing more, not even a FIN
            killed = c.kill_node("n2")
            return f"n2 powered off ({len(killed)} processes killed, slurmd and munged among them)"
        text, info = self.fault_job("node-lost", power_off)
        assert "n2" not in info.get("NodeList", ""), f"the rerun ran on the lost node: {info.get('NodeList')}"
        assert re.search(r"ABORT: rank [23] on n2 \(student", text), "no abort names a student rank on n2"
        # Who requeued: slurmctld, once it found n2 not responding (SlurmdTimeout) while srun waited for
        # n2's tasks (NODE_FAIL; on a real cluster's 300 s timeout too), or the script, when srun returned
        # first (exit code 6, n2 named as unable to run a job step).
        by_slurm = "DUE TO NODE FAILURE" in text
        assert by_slurm or "node(s) n2 of this job cannot run a job step" in text, "neither Slurm nor the script named n2"
        print("node-lost: requeued by " + ("slurmctld (NODE_FAIL: n2 not responding)" if by_slurm else
                                           "the script (exit code 6, n2 unable to run a job step)"))

    def link_cut(self, during_checkpoint=False):
        name = "link-cut-checkpoint" if during_checkpoint else "link-cut"

        def cut(c, job, run_dir):
            if during_checkpoint:  # the moment a checkpoint's temporary folder appears
                folder = os.path.join(run_dir, "checkpoints")
                deadline = time.time() + 120
                writing = []
                while time.time() < deadline:
                    writing = [d for d in os.listdir(folder) if ".tmp" in d] if os.path.isdir(folder) else []
                    if writing:
                        break
                    time.sleep(0.0005)
                else:
                    raise AssertionError("no checkpoint was being written within 120 s")
                c.link("n2", up=False)
                return f"n2's link cut while {writing[0]} was being written"
            c.link("n2", up=False)
            return "n2's link cut mid-step"
        text, info = self.fault_job(name, cut, restore=lambda c: c.link("n2", up=True), when=2 if during_checkpoint else 12)
        assert re.search(r"ABORT: rank \d on n\d .*(no heartbeat|silent for)", text), "no abort for the silence"

    def slow_link(self):
        refs = self.by_hand("roles", ROLES, 4)
        with NodesCluster() as c:
            times = {}
            for name, cap in (("full-link", None), ("slow-link", "8mbit")):
                if cap:
                    for dev_node, dev in (("n2", "eth0"), ("switch", "n2")):
                        c.on(dev_node, ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", cap, "burst", "32kbit",
                                        "latency", "400ms"])
                t0 = time.time()
                job, run_dir, log = self.submit(c, name, ROLES, "srun")
                info = c.wait_state(job, TERMINAL, timeout=600)
                times[name] = time.time() - t0
                text = open(log).read()
                assert info["JobState"] == "COMPLETED", f"{name}: {info['JobState']}\n{text[-3000:]}"
                assert "ABORT" not in text, f"{name}: a false abort:\n{text[-3000:]}"
                self.compare(run_dir, refs, f"{name} (job {job}, {times[name]:.1f} s)")
                steps = [r for r in _step_times(run_dir)]
                self.breakdown(name, steps)
            print(f"slow link: the job took {times['slow-link']:.1f} s with n2 capped at 8 Mbit/s, "
                  f"{times['full-link']:.1f} s on the full link; no abort")

    @staticmethod
    def breakdown(name, steps):
        by_role = {}
        for r in steps:
            if r["step"] < 3:
                continue  # start-up
            role = by_role.setdefault(r["role"], {"n": 0, "time": 0.0, "parts": {}})
            role["n"] += 1
            role["time"] += r["time_s"]
            for k, v in r.get("parts", {}).items():
                role["parts"][k] = role["parts"].get(k, 0.0) + v
        for role, t in sorted(by_role.items()):
            parts = sorted(t["parts"].items(), key=lambda kv: -kv[1])[:4]
            print(f"{name}: {role} step {1e3 * t['time'] / t['n']:.1f} ms on average; " +
                  ", ".join(f"{k} {1e3 * v / t['n']:.1f} ms" for k, v in parts))

    def stale_binary(self):
        out = os.path.join(self.work, "multinode-stale-binary")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        stale = os.path.join(out, "deepen")
        shutil.copy2(self.deepen, stale)
        ours = _build_id(self.deepen)
        other = _patch_build_id(stale, ours)
        with NodesCluster() as c:
            # Another build on n2's path: the same path, another file, in n2's mount namespace only.
            c.on("n2", ["mount", "--bind", stale, self.deepen])
            t0 = time.time()
            job, run_dir, log = self.submit(c, "stale-binary", ROLES, "srun")
            info = c.wait_state(job, TERMINAL, timeout=120)
            took = time.time() - t0
            text = open(log).read()
            c.on("n2", ["umount", self.deepen])
        assert info["JobState"] == "FAILED" and info["ExitCode"].startswith("2:"), \
            f"stale binary: {info['JobState']} {info['ExitCode']}\n{text[-3000:]}"
        line = next((l for l in text.splitlines() if "different builds of deepen" in l), "")
        assert line, f"no rank named the builds:\n{text[-3000:]}"
        for want in (f"build {ours[:12]} on rank 0 (n1), rank 1 (n1)", f"build {other[:12]} on rank 2 (n2), rank 3 (n2)"):
            assert want in line, f"{want!r} not in {line!r}"
        assert not os.path.exists(os.path.join(run_dir, "metrics.jsonl")), "a rank did work"
        assert not os.path.exists(os.path.join(run_dir, "checkpoints")), "a rank did work"
        print(f"stale binary (job {job}): {info['JobState']} exit {info['ExitCode']} {took:.1f} s after submission; "
              f"{line.strip()}; no step, no checkpoint")

    def unreachable_coordinator(self):
        with NodesCluster() as c:
            for how, hosts in (("unresolvable", "127.0.0.1 localhost\n" + "".join(f"{address(n)} {n}\n" for n in ("n2", "n3"))),
                               ("unreachable", f"127.0.0.1 localhost\n192.0.2.99 n1\n{address('n2')} n2\n{address('n3')} n3\n")):
                hosts_file = os.path.join(self.work, f"multinode-hosts-{how}")
                with open(hosts_file, "w") as f:
                    f.write(hosts)
                c.on("n2", ["mount", "--bind", hosts_file, "/etc/hosts"])
                t0 = time.time()
                # A connect timeout (control.watchdog_s) of 4 s: the test waits for it twice per job.
                job, run_dir, log = self.submit(c, f"coordinator-{how}", ROLES, "srun",
                                                sets_extra=[f"control.watchdog_s={CONNECT_S}"])
                info = c.wait_state(job, TERMINAL, timeout=180)
                took = time.time() - t0
                c.on("n2", ["umount", "/etc/hosts"])
                text = open(log).read()
                assert info["JobState"] == "FAILED", f"{how}: {info['JobState']}\n{text[-3000:]}"
                named = [l for l in text.splitlines() if "coordinator at n1:" in l and "on n2" in l]
                assert named, f"{how}: no rank on n2 named the coordinator it could not reach:\n{text[-4000:]}"
                want = "cannot resolve n1" if how == "unresolvable" else "192.0.2.99"
                assert want in named[0], f"{how}: {named[0]}"
                assert f"within control connect timeout {CONNECT_S:.1f} s" in named[0], named[0]
                print(f"coordinator {how} from n2 (job {job}): {info['JobState']} exit {info['ExitCode']} "
                      f"{took:.1f} s after submission (connect timeout = watchdog {CONNECT_S:.0f} s): {named[0].strip()}")

    def control(self):
        # 130 steps (about 50 ms each here): the job must outlast the probes and the attack.
        long = ROLES + ["curriculum.stage_steps=[10, 10, 110]"]
        refs = self.by_hand("roles-130", long, 4)
        with NodesCluster() as c:
            for bind in ("127.0.0.1", "0.0.0.0"):
                name = f"control-metrics-{bind}"
                job, run_dir, log = self.submit(c, name, long, "srun",
                                                sets_extra=["control.metrics_port=9464", f'control.metrics_bind="{bind}"'])
                self.wait_steps(c, job, run_dir, 5)
                why = []
                local = _http(c, "n1", "127.0.0.1", 9464, why)
                remote = _http(c, "n2", address("n1"), 9464, why)
                print(f"{name}: the clients said: {why}")
                print(f"{name}: /metrics from n1 itself: {local.splitlines()[0] if local else 'no answer'}; "
                      f"from n2: {remote.splitlines()[0] if remote else 'refused'}")
                assert local.startswith("HTTP/1.") and " 200 " in local.splitlines()[0]
                if bind == "127.0.0.1":
                    assert not remote, "/metrics reached from another node though bound to loopback"
                else:
                    assert " 200 " in remote.splitlines()[0], "/metrics not reachable from n2 with metrics_bind 0.0.0.0"
                    port = int(re.search(r"coordinator listening on n1:(\d+)", open(log).read()).group(1))
                    attack = _attack(c, "n3", address("n1"), port)
                    print(f"{name}: from n3 (outside the job) on the coordinator n1:{port}: {attack}")
                    why = []
                    body = _http(c, "n3", address("n1"), 9464, why)
                    assert body, f"{name}: no /metrics answer from n1 to n3: {why}"
                    with open(os.path.join(self.work, "multinode-control-metrics.txt"), "w") as f:
                        f.write(body)
                    counters = dict(re.findall(r'deepen_control_connections_total\{outcome="(\w+)"\} (\d+)', body))
                    print(f"{name}: coordinator counters on /metrics: {counters}")
                    assert int(counters.get("rejected_auth", 0)) >= 1 and int(counters.get("protocol_errors", 0)) >= 1
                info = c.wait_state(job, TERMINAL, timeout=600)
                assert info["JobState"] == "COMPLETED", f"{name}: {info['JobState']}\n{open(log).read()[-3000:]}"
                # Against one process only the 30-step jobs (within 1e-5): over 130 steps the rounding
                # difference of the students' sum grows (2e-4 by step 22, measured).
                self.compare(run_dir, refs, name, steps=130, one_process=False)

    def submit(self, c, name, sets, launcher, sets_extra=(), **kw):
        return super().submit(c, name, list(sets) + list(sets_extra), launcher, **kw)


def _state(pid):
    try:
        return open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0]
    except OSError:
        return "gone"


def _step_times(run_dir):
    folder = os.path.join(run_dir, "step_time")
    for name in sorted(os.listdir(folder)):
        for r in records(folder, name):
            yield r


def _build_id(path):
    out = subprocess.run(["readelf", "-n", path], capture_output=True, text=True, check=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", out).group(1)


def _patch_build_id(path, build_id):
    """Another build id in the copy's note (as another build of the same code would have)."""
    data = bytearray(open(path, "rb").read())
    raw = bytes.fromhex(build_id)
    at = data.find(b"GNU\0" + raw)
    assert at >= 0, "the build id note was not found"
    other = bytes((b ^ 0x5A) for b in raw)
    data[at + 4:at + 4 + len(raw)] = other
    open(path, "wb").write(data)
    return other.hex()


_HTTP = """import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.0\\r\\n\\r\\n")
    out = b""
    while True:
        b = s.recv(65536)
        if not b: break
        out += b
    sys.stdout.write(out.decode(errors="replace"))
except OSError as e:
    sys.stderr.write("http: %s" % e)
"""


def _http(c, node, host, port, why=None):
    """The whole answer to GET /metrics from `node`, "" when none came (the reason in `why`, a list)."""
    p = c.on(node, [sys.executable, "-c", _HTTP, host, str(port)], check=False)
    if why is not None:
        why.append(p.stderr.strip())
    return p.stdout


# From another node: garbage, a 4 GiB length prefix, a well-formed Auth with a forged MAC (the wire
# format of dist/control/wire.h: u32 length, type byte 1 = Auth, rank, world, pid, three strings,
# nonce, MAC), and 70 connections held open; says what the coordinator did with each.
_ATTACK = r"""import os, socket, struct, sys, time
host, port = sys.argv[1], int(sys.argv[2])
def closed(s, t=6):
    s.settimeout(t)
    try:
        while s.recv(4096): pass
        return True
    except OSError:
        return False
res = []
s = socket.create_connection((host, port)); s.sendall(os.urandom(300)); res.append(closed(s))
s = socket.create_connection((host, port)); s.sendall(b"\xff\xff\xff\xff"); res.append(closed(s))
s = socket.create_connection((host, port)); s.settimeout(5)
hdr = s.recv(4); body = s.recv(struct.unpack(">I", hdr)[0])
strs = b"".join(struct.pack(">H", len(x)) + x for x in (b"evil", b"student 9", b""))
auth = bytes([1]) + struct.pack(">iiq", 2, 4, 4242) + strs + os.urandom(32) + os.urandom(32)
s.sendall(struct.pack(">I", len(auth)) + auth); res.append(closed(s))
held = [socket.create_connection((host, port)) for _ in range(70)]
time.sleep(1)
for h in held: h.close()
print("garbage closed: %s, 4 GiB prefix closed: %s, forged Auth closed: %s, 70 held connections made" % tuple(res))
"""


def _attack(c, node, host, port):
    p = c.on(node, [sys.executable, "-c", _ATTACK, host, str(port)], check=False, timeout=60)
    return (p.stdout + p.stderr).strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepen", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("case")
    a = ap.parse_args()
    skip_if_unavailable()
    f = Faults(a.deepen, a.work)
    {"node-lost": f.node_lost, "link-cut": f.link_cut, "link-cut-checkpoint": lambda: f.link_cut(True),
     "slow-link": f.slow_link, "stale-binary": f.stale_binary, "unreachable-coordinator": f.unreachable_coordinator,
     "control": f.control}[a.case]()


if __name__ == "__main__":
    main()
