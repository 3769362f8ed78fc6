#!/usr/bin/env python3
"""A real three-node Slurm cluster on one machine: each node a network + UTS + mount namespace.

    with NodesCluster() as c:               # n1, n2, n3 up, slurmd idle on each (time-limited)
        job = c.sbatch(["-N2", "--wrap", "srun hostname"], env=...)   # sbatch runs on n1
        c.wait_state(job, {"COMPLETED"}, timeout=30)
        c.on("n2", ["ip", "-s", "link"])   # any command on a node
    # leaving the block kills every process of every node by PID and removes links and folders

    python3 tests/slurm/nodes_cluster.py [-- COMMAND ...]    # COMMAND on n1 with SLURM_CONF set
    python3 tests/slurm/nodes_cluster.py --clean-stale       # what a killed run left: removed

What a node is (tests/slurm/README.md has the design and the measured facts it rests on):
- a holder process started by `unshare --net --uts --mount`, whose namespaces are the node: its own
  host name (n1..n3), loopback, and one interface eth0 with 192.0.2.1<i>/24 (TEST-NET-1, RFC 5737: a
  documentation range; no default route, so nothing leaves the machine), its own /tmp and /dev/shm
  (private mounts: Open MPI's and PMIx's session files and shared-memory segments are per node, as on
  a real cluster), /etc/hosts naming every node (a bind mount in the node's mount namespace only), and
  its own munged on the same key (its socket at one path, bind-mounted per node);
- a veth pair from eth0 to a bridge in a fourth namespace, the switch, which has no address: the
  machine's own network namespace holds no interface of the cluster, and nothing of the cluster listens
  there;
- slurmctld on n1 (its address in SlurmctldHost), a slurmd on every node (NodeAddr = its address;
  spool, PID and log paths by Slurm's %n); the Slurm clients of the tests run on n1 (self.client).
Everything the cluster made goes away with its processes: namespaces end with their last process,
veth pairs with their namespace. stop() kills every process of every node (found by its network
namespace) and the holders, then removes the folder; a detached guard does the same if the test is
killed (ctest's TIMEOUT is a SIGKILL), and the next start removes what any dead owner left.
Skips (exit 77) with the reason where the Slurm packages, root, or namespaces are missing.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cluster import SLURM_CONF_COMMON, Cluster, _alive, missing_reason as slurm_missing_reason, sbin  # noqa: E402
from cluster import skip_if_unavailable as slurm_skip_if_unavailable  # noqa: E402

NODES = ("n1", "n2", "n3")
SUBNET = "192.0.2"  # TEST-NET-1: documentation addresses, never routed
MARK = "deepen-test-node"  # argv[0] of every holder: "deepen-test-node NAME owner=PID dir=DIR"
BASE = "/var/tmp"  # not /tmp: every node mounts its own /tmp over it
CPUS = 4  # per node: a node hosts up to 4 ranks (a 2-core machine: they share)


def address(node):
    return f"{SUBNET}.{10 + NODES.index(node) + 1}"


def missing_reason():
    """Why no multi-node cluster can run here, or None."""
    reason = slurm_missing_reason()
    if reason:
        return reason
    for tool in ("unshare", "nsenter", "ip"):
        if not shutil.which(tool):
            return f"no {tool} (util-linux / iproute2)"
    # The namespaces and a veth pair, made and dropped in a throwaway namespace.
    p = subprocess.run(["unshare", "--net", "--uts", "--mount", "sh", "-c",
                        "ip link add t0 type veth peer name t1 && ip link add b0 type bridge"],
                       capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        return "network/UTS/mount namespaces or veth links cannot be made here: " + (p.stderr.strip() or "unshare failed")
    return None


def skip_if_unavailable():
    slurm_skip_if_unavailable(missing_reason)


def _holders():
    """(pid, kind, name, owner, dir) of every holder process of any cluster on this machine."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv0 = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        m = re.fullmatch(rf"({MARK}|deepen-test-switch) (\S+) owner=(\d+) dir=(\S+)", argv0)
        if m:
            out.append((int(pid), m.group(1), m.group(2), int(m.group(3)), m.group(4)))
    return out


def _netns(pid):
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _kill_namespace(holder):
    """SIGKILL every process in the holder's network namespace, the holder last; waits for them."""
    ns = _netns(holder)
    if ns is None:
        return
    for _ in range(50):
        members = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != holder and _netns(p) == ns]
        if not members:
            break
        for p in members:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    try:
        os.kill(holder, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.time() + 10
    while time.time() < deadline and _alive(holder):
        time.sleep(0.05)


def clean_stale(owner=None, quiet=False):
    """Removes the clusters whose owner process is gone (or, with `owner`, that owner's): every process
    of their nodes, their namespaces and links (they go with the processes), their folders."""
    removed = set()
    for pid, kind, name, own, folder in _holders():
        if (owner is not None and own != owner) or (owner is None and _alive(own)):
            continue
        _kill_namespace(pid)
        removed.add(folder)
    for folder in removed:
        _remove_folder(folder)
    if removed and not quiet:
        print(f"nodes cluster: removed {len(removed)} stale cluster(s): {', '.join(sorted(removed))}", flush=True)
    return removed


def _remove_folder(folder):
    if os.path.basename(folder).startswith("deepen-nodes-"):  # never anything else
        shutil.rmtree(folder, ignore_errors=True)


class NodesCluster(Cluster):
    def __init__(self, nodes=NODES, cpus=CPUS):
        self.nodes = list(nodes)
        self.cpus = cpus
        self.node = self.nodes[0]
        self._make_folder(tempfile.mkdtemp(prefix="deepen-nodes-", dir=BASE))
        self.holders = {}  # node (or "switch") -> holder pid
        self.client = []
        self.tag = f"d{os.getpid() % 100000}"  # veth names while in this namespace: unique per cluster

    # ---- lifecycle ----
    def start(self, timeout=60):
        clean_stale()
        d = self.dir
        with open(os.path.join(d, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n" + "".join(f"{address(n)} {n}\n" for n in self.nodes))
        os.makedirs(os.path.join(d, "munge"))
        self._start_guard()
        self.holders["switch"] = self._hold("switch", ["--net"], "ip link add br0 type bridge && ip link set br0 up")
        for i, n in enumerate(self.nodes):
            nd = os.path.join(d, n)
            for sub in ("tmp", "munge", "spool"):
                os.makedirs(os.path.join(nd, sub))
            os.chmod(os.path.join(nd, "tmp"), 0o1777)
            os.chmod(nd, 0o755)
            setup = (f"hostname {n} && mount --bind {d}/hosts /etc/hosts && mount --bind {nd}/tmp /tmp && "
                     f"mount -t tmpfs -o mode=1777 tmpfs /dev/shm && mount --bind {nd}/munge {d}/munge && "
                     "ip link set lo up")
            self.holders[n] = self._hold(n, ["--net", "--uts", "--mount"], setup)
            a, b = f"{self.tag}{i}a", f"{self.tag}{i}b"
            _sh(f"ip link add {a} type veth peer name {b} && ip link set {a} netns {self.holders[n]} && "
                f"ip link set {b} netns {self.holders['switch']}")
            self.on(n, ["sh", "-c", f"ip link set {a} name eth0 && ip addr add {address(n)}/24 dev eth0 && "
                                      "ip link set eth0 up"])
            self.on("switch", ["sh", "-c", f"ip link set {b} name {n} && ip link set {n} master br0 && "
                                             f"ip link set {n} up"])
        self.client = self.enter(self.nodes[0])
        self._start_munge_on_nodes()
        self._write_conf()
        self.ctld_started = time.time()
        self.on(self.nodes[0], [sbin("slurmctld"), "-f", self.conf], env=self.env)
        self.pids["slurmctld"] = self._read_pid("slurmctld.pid", timeout)
        for n in self.nodes:
            self.on(n, [sbin("slurmd"), "-N", n, "-f", self.conf], env=self.env)
            self.pids[f"slurmd {n}"] = self._read_pid(f"{n}/slurmd.pid", timeout)
        deadline = time.time() + timeout
        states = {}
        while time.time() < deadline:
            p = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
            states = dict(line.split() for line in p.stdout.splitlines() if len(line.split()) == 2)
            if all(states.get(n) == "idle" for n in self.nodes):
                return
            time.sleep(0.2)
        raise RuntimeError(f"nodes not idle within {timeout} s ({states})\n" + self.logs())

    def _hold(self, name, namespaces, setup):
        """Starts the process that holds a node's namespaces; returns its pid once it holds them."""
        kind = MARK if name != "switch" else "deepen-test-switch"
        script = f'set -e; {setup}; exec -a "{kind} {name} owner={os.getpid()} dir={self.dir}" sleep infinity'
        p = subprocess.Popen(["unshare"] + namespaces + ["bash", "-c", script], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 20
        while time.time() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"node {name}: setting up its namespaces failed: {p.stderr.read().decode()}")
            if any(pid == p.pid for pid, *_ in _holders()):
                return p.pid
            time.sleep(0.02)
        raise RuntimeError(f"node {name}: its namespaces were not ready within 20 s")

    def enter(self, node):
        """The command prefix that runs a command on `node` (in its namespaces)."""
        spaces = ["-n"] if node == "switch" else ["-n", "-u", "-m"]
        return ["nsenter", "-t", str(self.holders[node])] + spaces + ["--"]

    def on(self, node, cmd, env=None, timeout=60, check=True):
        """Runs `cmd` on `node` and returns the finished process (output captured)."""
        p = subprocess.run(self.enter(node) + list(cmd), env=env or self.env, capture_output=True, text=True,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise RuntimeError(f"on {node}: {' '.join(cmd)} failed ({p.returncode}): {p.stderr}{p.stdout}")
        return p

    def popen(self, node, cmd, env=None, **kw):
        """Starts `cmd` on `node` in its own session; returns the Popen."""
        return subprocess.Popen(self.enter(node) + list(cmd), env=env or self.env, start_new_session=True, **kw)

    def _start_munge_on_nodes(self):
        # One key for the cluster, as on a real one; a munged per node, each at the same socket path
        # ({dir}/munge, a per-node bind mount), so slurm.conf names one socket.
        import pwd
        mu = pwd.getpwnam("munge")
        key = os.path.join(self.dir, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(128))
        os.chmod(key, 0o400)
        os.chown(key, mu.pw_uid, mu.pw_gid)
        m = os.path.join(self.dir, "munge")
        self.munge_socket = os.path.join(m, "munge.socket")
        for n in self.nodes:
            os.chown(os.path.join(self.dir, n, "munge"), mu.pw_uid, mu.pw_gid)
            self.on(n, ["runuser", "-u", "munge", "--", sbin("munged"), f"--socket={self.munge_socket}",
                          f"--key-file={key}", f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log",
                          f"--seed-file={m}/munged.seed"])
            self.pids[f"munged {n}"] = self._read_pid(f"{n}/munge/munged.pid", 10)

    def _write_conf(self):
        d, first = self.dir, self.nodes[0]
        nodes = "".join(f"NodeName={n} NodeHostname={n} NodeAddr={address(n)} CPUs={self.cpus} RealMemory=4000 "
                        f"Gres=gpu:{self.cpus} State=UNKNOWN\n" for n in self.nodes)
        with open(self.conf, "w") as f:
            f.write(f"""# three-node test cluster (tests/slurm/nodes_cluster.py): one network namespace per node
ClusterName=deepennodes
SlurmctldHost={first}({address(first)})
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire=10
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/%n/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/%n/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/%n/slurmd.log
{SLURM_CONF_COMMON}SlurmdTimeout=10
GresTypes=gpu
{nodes}PartitionName=debug Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")
        os.makedirs(os.path.join(d, "state"))
        for i in range(self.cpus):
            open(os.path.join(d, f"gpu{i}"), "w").close()
        with open(os.path.join(d, "gres.conf"), "w") as f:
            f.write(f"NodeName={','.join(self.nodes)} Name=gpu File={d}/gpu[0-{self.cpus - 1}]\n")

    def _start_guard(self):
        # ctest's TIMEOUT kills with SIGKILL: no `finally` runs. This detached process outlives us and
        # removes the cluster by the same code as the next start would.
        script = (f'while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; '
                  f'exec python3 {os.path.abspath(__file__)} --clean-stale --quiet')
        self.guard = subprocess.Popen(["bash", "-c", script], start_new_session=True, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self):
        """Cancels the jobs (while the nodes still run), then kills every process of every node and
        the holders, which ends the namespaces and their links, and removes the folder."""
        if "slurmctld" in self.pids:
            try:
                self.run(["scancel", "--full", "--user=root"], check=False, timeout=10)
                deadline = time.time() + 20
                while time.time() < deadline:
                    p = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=10)
                    if p.returncode != 0 or not p.stdout.strip():
                        break
                    time.sleep(0.2)
            except (subprocess.SubprocessError, OSError):
                pass
        guard = getattr(self, "guard", None)
        if guard is not None:
            guard.kill()
            guard.wait()
        for name, pid in list(self.holders.items()):
            if name != "switch":
                _kill_namespace(pid)
        if "switch" in self.holders:
            _kill_namespace(self.holders["switch"])
        self.holders.clear()
        self.pids.clear()
        _remove_folder(self.dir)

    # ---- faults ----
    def kill_node(self, node):
        """Every process of the node, its slurmd included, killed at once (SIGKILL); the namespace and
        its link stay, as a powered-off node's cable does. Returns the pids killed."""
        ns = _netns(self.holders[node])
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != self.holders[node] and _netns(p) == ns]
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def link(self, node, up):
        """Cuts (or restores) the node's cable: its eth0 down (up)."""
        self.on(node, ["ip", "link", "set", "eth0", "up" if up else "down"])

    def logs(self):
        text = ""
        for name in ["slurmctld.log"] + [f"{n}/slurmd.log" for n in self.nodes]:
            try:
                text += f"--- {name} (tail)\n" + "".join(open(os.path.join(self.dir, name)).readlines()[-20:])
            except OSError:
                pass
        return text


def _sh(command):
    p = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"{command} failed ({p.returncode}): {p.stderr}")


def main(argv):
    """python3 tests/slurm/nodes_cluster.py [--timeout S] [--clean-stale [--quiet]] [-- COMMAND ...]

    Starts the three-node cluster, runs COMMAND on n1 with SLURM_CONF set (default: a 3-node srun of
    hostname), waits until no job is left (at most --timeout s), and stops the cluster."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--clean-stale", action="store_true", help="remove clusters whose owner is gone, and exit")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("command", nargs="*")
    a = ap.parse_args(argv)
    if a.clean_stale:
        clean_stale(quiet=a.quiet)
        return 0
    skip_if_unavailable()
    t0 = time.time()
    with NodesCluster() as c:
        print(f"nodes cluster: {', '.join(c.nodes)} up in {time.time() - t0:.1f} s (SLURM_CONF={c.conf})", flush=True)
        cmd = a.command or ["srun", "-N3", "-n3", "hostname"]
        rc = subprocess.run(c.client + cmd, env=c.env).returncode
        deadline = time.time() + a.timeout
        while time.time() < deadline:
            if not c.run(["squeue", "-h", "-o", "%i"], check=False).stdout.strip():
                break
            time.sleep(1)
    print(f"nodes cluster: stopped; {time.time() - t0:.1f} s in all, command exit code {rc}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
