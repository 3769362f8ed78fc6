#!/usr/bin/env python3
"""End-to-end checks of the teacher cache: `deepen cache`, then `deepen train` with
distill.source = "cache" (no teacher ranks), on the e2e fixture's teacher (tests/e2e/distributed_train.py
setup) and a corpus of its own, prepped into several shards so that the cache has several files.

  python3 tests/e2e/teacher_cache.py --deepen build/deepen --work build/tests/e2e CASE

Cases (each one ctest test):
  setup       the corpus in shards of 8,192 tokens and the reference cache (K = 16, top-4), made in one go
  train       a cache made in one go; the tiny run trained from it in one process and as 2 students
              under mpirun (world = 2: no teacher rank), replicated and sharded (grad_op), agree (loss,
              KL, CE, val CE, val KL, diagnostics) through growth; run.json names the cache; the report notes which runs trained from it;
              the divergence guard stops a NaN from the cache as it does a NaN from a live teacher
  kill        `deepen cache` killed (SIGKILL) after its first file, then run again: byte for byte the
              cache made in one go (every file, plan.json, manifest.json); a Slurm-style split into 3
              parts (--part i/3) gives the same bytes too
  resume      a run from the cache stopped after 5 steps (exit 3) and resumed: the metrics, eval and
              diagnostics records equal the uninterrupted run's bit for bit
  refusals    exit 2, a message naming the reason, and no run folder, for a run from a cache made by
              another teacher, another tokenizer's shards, other data, another seq_len, another τ,
              another packing, another max_len, another K; with a cache file missing or corrupt (named
              with its hash); asking for more train or validation sequences than the cache holds; and `deepen cache` into a
              folder of another config's cache
  study       a study with study.teacher = "cache": the cache job, then two runs from it (one process
              each); `deepen study --slurm` lists the cache's parts and makes every run wait for them
"""
import argparse
import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import distributed_train as dt  # noqa: E402  (the fixture, run(), records(), compare())

MPI_ENV = dt.MPI_ENV


def corpus(folder, n=40, seed=5):
    """n deterministic text documents of ~1 kB (common words in a seeded order): enough for a
    validation split at valid_fraction 0.3 and few enough tokens for a quick cache."""
    words = ("the of and to in is that for it as with was on be by this are or from at which an not have "
             "teacher student cache layer norm block grows token shard sample draw count").split()
    os.makedirs(folder, exist_ok=True)
    x = seed
    for d in range(n):
        out = []
        for _ in range(180):
            x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            out.append(words[(x >> 33) % len(words)])
        with open(os.path.join(folder, f"doc{d:03d}.txt"), "w") as f:
            f.write(" ".join(out) + ".\n")


class Cases(dt.Cases):
    def __init__(self, deepen, work):
        super().__init__(deepen, work)
        self.root = os.path.join(self.work, "cache-e2e")
        self.data = os.path.join(self.root, "data")
        self.base_cache = os.path.join(self.root, "base.toml")

    def prepare(self):
        """The corpus in shards of 8,192 tokens (several cache files), and base.toml: the tiny run on it."""
        os.makedirs(self.root, exist_ok=True)
        if not os.path.exists(os.path.join(self.data, "train")):
            corpus(os.path.join(self.root, "text"))
            with open(os.path.join(self.root, "prep.toml"), "w") as f:
                f.write(f'[data]\ntokenizer = "bytes"\nsources = ["{self.root}/text"]\ntrain = "{self.data}/train"\n'
                        f'valid = "{self.data}/valid"\nvalid_fraction = 0.3\nshard_tokens = 8192\n')
            dt.run([self.deepen, "prep", os.path.join(self.root, "prep.toml")])
        with open(dt.TINY_RUN) as f:
            text = f.read().format(name="run", out_dir=f"{self.root}/run", device="cpu", train=f"{self.data}/train",
                                   valid=f"{self.data}/valid", teacher=f"{self.work}/teacher/final/hf", keep=3)
        with open(self.base_cache, "w") as f:
            f.write(text + '\n[cache]\nsamples = 16\ntopk = 4\nseed = 3\n')

    def make_cache(self, out, sets=(), check=True, extra=()):
        cmd = [self.deepen, "cache", self.base_cache, "--out", out, "--set", "parallel.micro_batch=16"]
        for s in sets:
            cmd += ["--set", s]
        return dt.run(cmd + list(extra), check=check)

    def cache_sets(self, cache):
        return ['distill.source="cache"', f'cache.dir="{cache}"', "distill.alpha=0.7"]

    def reference_cache(self):
        cache = os.path.join(self.root, "cache")
        if not os.path.exists(os.path.join(cache, "manifest.json")):
            self.make_cache(cache)
        return cache

    # ---- cases -------------------------------------------------------------------------------------

    def setup_case(self):
        shutil.rmtree(self.root, ignore_errors=True)
        self.prepare()
        t0 = time.time()
        p = self.make_cache(os.path.join(self.root, "cache"))
        m = json.load(open(os.path.join(self.root, "cache", "manifest.json")))
        tokens = m["data"]["train_records"] + m["data"]["valid_records"]
        print(f"setup: cache of {tokens} tokens in {len(m['files'])} files, {m['bytes']} bytes "
              f"({m['bytes'] / tokens:.1f} bytes/token with the top-4), {time.time() - t0:.1f} s")
        print(p.stderr.strip().splitlines()[-1])

    def train_case(self):
        self.prepare()
        cache = self.reference_cache()
        manifest = json.load(open(os.path.join(cache, "manifest.json")))
        assert len([f for f in manifest["files"] if f["split"] == 0]) >= 3, manifest["files"]
        single = os.path.join(self.root, "single")
        dist = os.path.join(self.root, "dist-2")
        t0 = time.time()
        self.train(single, self.cache_sets(cache) + ["parallel.students=2"], base=self.base_cache)
        t1 = time.time()
        self.train(dist, self.cache_sets(cache) + ["parallel.students=2"], ranks=2, base=self.base_cache)
        t2 = time.time()
        self.compare(single, dist, 1e-5, "cache, 2 students under mpirun vs one process")
        sharded = os.path.join(self.root, "dist-2-sharded")
        self.train(sharded, self.cache_sets(cache) + ["parallel.students=2", 'parallel.sharding="grad_op"'], ranks=2,
                   base=self.base_cache)
        self.compare(single, sharded, 1e-5, "cache, 2 students sharded (grad_op) under mpirun vs one process")
        meta = json.load(open(os.path.join(dist, "run.json")))
        assert meta["teacher"] == "cache:sampled:16", meta["teacher"]
        # Two ranks, both students: each wrote its own step-time record, none a teacher's.
        roles = set()
        for name in os.listdir(os.path.join(dist, "step_time")):
            roles |= {json.loads(l)["role"] for l in open(os.path.join(dist, "step_time", name)) if l.strip()}
        assert roles == {"student"}, roles
        rep = os.path.join(self.root, "report")
        dt.run([self.deepen, "report", single, "--out", rep])
        text = open(os.path.join(rep, "report.md")).read()
        assert "trained from the teacher cache" in text and "K = 16" in text, text[-2000:]
        # The guard: a NaN in the cache's targets (the entropy, here) stops the run as a live teacher's does.
        nan = os.path.join(self.root, "nan")
        p = self.train(nan, self.cache_sets(cache), base=self.base_cache, env={"DEEPEN_FAULT_NAN": "0:3"}, check=False)
        assert p.returncode == 4, (p.returncode, p.stderr[-2000:])
        assert "not finite" in p.stderr or "non-finite" in p.stderr or "nan" in p.stderr.lower(), p.stderr[-2000:]
        print(f"train: single process {t1 - t0:.1f} s, 2 students under mpirun {t2 - t1:.1f} s; report notes the cache; "
              f"guard exit 4 on a NaN target")

    def kill_case(self):
        self.prepare()
        whole = self.reference_cache()
        killed = os.path.join(self.root, "cache-killed")
        shutil.rmtree(killed, ignore_errors=True)
        cmd = [self.deepen, "cache", self.base_cache, "--out", killed, "--set", "parallel.micro_batch=16"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # SIGKILL once the first file is in place (the next one is being written).
        deadline = time.time() + 120
        while time.time() < deadline:
            done = os.listdir(os.path.join(killed, "train")) if os.path.isdir(os.path.join(killed, "train")) else []
            if any(f.endswith(".cache") for f in done):
                break
            if proc.poll() is not None:
                raise AssertionError("deepen cache finished before it could be killed: " + proc.stderr.read()[-2000:])
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        left = sorted(os.listdir(os.path.join(killed, "train")))
        assert not os.path.exists(os.path.join(killed, "manifest.json")), "a killed cache has no manifest"
        total = len(json.load(open(os.path.join(whole, "manifest.json")))["files"])
        assert len([f for f in left if f.endswith(".cache")]) < total, left
        p = self.make_cache(killed)
        assert "writing it again" not in p.stderr, p.stderr  # the committed files are kept, not rewritten
        parts = os.path.join(self.root, "cache-parts")
        shutil.rmtree(parts, ignore_errors=True)
        for i in range(3):
            self.make_cache(parts, extra=["--part", f"{i}/3"])
        for other in (killed, parts):
            names = sorted(os.path.relpath(os.path.join(d, f), whole) for d, _, fs in os.walk(whole) for f in fs)
            got = sorted(os.path.relpath(os.path.join(d, f), other) for d, _, fs in os.walk(other) for f in fs)
            assert names == got, (names, got)
            for n in names:
                assert filecmp.cmp(os.path.join(whole, n), os.path.join(other, n), shallow=False), f"{other}: {n} differs"
        print(f"kill: killed with {len([f for f in left if f.endswith('.cache')])} train file(s) done; resumed and "
              f"3 parts == one go, {len(names)} files byte for byte")

    def resume_case(self):
        self.prepare()
        cache = self.reference_cache()
        whole = os.path.join(self.root, "resume-whole")
        stopped = os.path.join(self.root, "resume-stopped")
        self.train(whole, self.cache_sets(cache), base=self.base_cache)
        p = self.train(stopped, self.cache_sets(cache), base=self.base_cache, extra=["--stop-after", "5"], check=False)
        assert p.returncode == 3, (p.returncode, p.stderr[-2000:])
        dt.run([self.deepen, "train", self.base_cache, "--quiet", "--set", f'run.out_dir="{stopped}"'] +
               sum((["--set", s] for s in self.cache_sets(cache)), []))
        self.compare(whole, stopped, 0.0, "cache run resumed after 5 steps vs uninterrupted")

    def refused(self, what, sets, expect, base=None, cache=None):
        out = os.path.join(self.root, "refused")
        shutil.rmtree(out, ignore_errors=True)
        p = self.train(out, self.cache_sets(cache or self.reference_cache()) + list(sets), base=base or self.base_cache,
                       check=False)
        assert p.returncode == 2, f"{what}: exit {p.returncode}: {p.stderr[-2000:]}"
        for e in expect:
            assert e in p.stderr, f"{what}: {e!r} not in: {p.stderr[-2000:]}"
        assert not os.path.exists(os.path.join(out, "metrics.jsonl")) and not os.path.exists(
            os.path.join(out, "config.toml")), f"{what}: the refused run wrote into its folder"
        print(f"refused ({what}): {[l for l in p.stderr.splitlines() if 'error' in l][:1]}")

    def refusals_case(self):
        self.prepare()
        cache = self.reference_cache()
        # Another teacher: the fixture's teacher with one weight changed.
        other = os.path.join(self.root, "teacher-other")
        shutil.rmtree(other, ignore_errors=True)
        shutil.copytree(f"{self.work}/teacher/final/hf", other)
        st = os.path.join(other, "model.safetensors")
        with open(st, "r+b") as f:
            f.seek(os.path.getsize(st) // 2)
            b = f.read(1)
            f.seek(os.path.getsize(st) // 2)
            f.write(bytes([b[0] ^ 0x01]))
        self.refused("another teacher", [f'teacher.checkpoint="{other}"'], ["teacher fingerprint"])
        # Other data: the same corpus cut into other shards; another tokenizer's shards.
        other_data = os.path.join(self.root, "data-other")
        if not os.path.exists(os.path.join(other_data, "train")):
            with open(os.path.join(self.root, "prep-other.toml"), "w") as f:
                f.write(f'[data]\ntokenizer = "bytes"\nsources = ["{self.root}/text"]\ntrain = "{other_data}/train"\n'
                        f'valid = "{other_data}/valid"\nvalid_fraction = 0.3\nshard_tokens = 4096\n')
            dt.run([self.deepen, "prep", os.path.join(self.root, "prep-other.toml")])
        self.refused("other data", [f'data.train="{other_data}/train"'], ["train shards (data.train)"])
        qwen = os.path.join(dt.TINY_RUN.rsplit("/", 1)[0], "qwen3", "tokenizer.json")
        self.refused("another tokenizer", [f'data.tokenizer="qwen3:{qwen}"'], ["tokenizer"])
        self.refused("another seq_len", ["data.seq_len=16"], ["seq_len (data.seq_len): 16 vs 32"])
        self.refused("another temperature", ["distill.temperature=2.0"], ["temperature (distill.temperature)"])
        # Another packing: whole documents against this cache of windows; another max_len against a cache
        # of documents (the first 4 of each split, at max_len 64).
        self.refused("another packing", ['data.packing="documents"', "data.max_len=64"],
                     ["packing (data.packing): documents vs windows"])
        docs = os.path.join(self.root, "cache-documents")
        if not os.path.exists(os.path.join(docs, "manifest.json")):
            self.make_cache(docs, ['data.packing="documents"', "data.max_len=64", "cache.train_sequences=4",
                                   "cache.valid_sequences=4"])
        self.refused("another max_len", ['data.packing="documents"', "data.max_len=48"],
                     ["max_len (data.max_len): 48 vs 64"], cache=docs)
        self.refused("another K", ["cache.samples=8"], ["samples (cache.samples): 8 vs 16"])
        # Files: one missing, one corrupt (each in a copy of the cache), named with the manifest's hash.
        manifest = json.load(open(os.path.join(cache, "manifest.json")))
        victim = manifest["files"][1]
        for damage in ("missing", "corrupt"):
            broken = os.path.join(self.root, f"cache-{damage}")
            shutil.rmtree(broken, ignore_errors=True)
            shutil.copytree(cache, broken)
            path = os.path.join(broken, victim["path"])
            if damage == "missing":
                os.remove(path)
            else:
                with open(path, "r+b") as f:
                    f.seek(100)
                    b = f.read(1)
                    f.seek(100)
                    f.write(bytes([b[0] ^ 0x40]))
            self.refused(f"a {damage} file", [], [victim["path"], victim["hash"]], cache=broken)
        # More sequences than the cache holds: a cache of the first 50 train sequences.
        small = os.path.join(self.root, "cache-small")
        if not os.path.exists(os.path.join(small, "manifest.json")):
            self.make_cache(small, ["cache.train_sequences=50"])
        self.refused("more than the cache holds", [], ["the cache holds the first 50 sequences"], cache=small)
        # An eval past the validation sequences: the cache holds the eval set of micro_batch 16 (4 x 16 = 64).
        self.refused("an eval past the cache", ["eval.batches=40"], ["an eval reads the first 80 validation sequences",
                                                                     "the cache holds 64"])
        # `deepen cache` into a folder holding another config's cache.
        p = self.make_cache(cache, ["cache.samples=8"], check=False)
        assert p.returncode == 2 and "samples (cache.samples): 8 vs 16" in p.stderr, (p.returncode, p.stderr[-2000:])
        print("refusals: each exit 2 before any work")

    def study_case(self):
        self.prepare()
        study = os.path.join(self.root, "study.toml")
        out = os.path.join(self.root, "study")
        shutil.rmtree(out, ignore_errors=True)
        with open(study, "w") as f:
            f.write(f'[study]\nname = "cache-study"\nbase = "{self.base_cache}"\nout_dir = "{out}"\nseeds = [1]\n'
                    f'launcher = "direct"\nteacher = "cache"\nset = ["parallel.micro_batch=2"]\ncache_parts = 2\n\n'
                    f'[[run]]\nname = "pre-grow"\nset = ["student.norm=pre"]\n\n'
                    f'[[run]]\nname = "post-grow"\nset = ["student.norm=post"]\n')
        t0 = time.time()
        p = dt.run([self.deepen, "study", study, "--quiet"])
        assert "teacher cache" in p.stdout, p.stdout
        for run in ("pre-grow", "post-grow"):
            meta = json.load(open(os.path.join(out, run, "seed1", "run.json")))
            assert meta["teacher"] == "cache:sampled:16", meta
        assert os.path.exists(os.path.join(out, "cache", "manifest.json"))
        slurm = os.path.join(self.root, "study-slurm")
        dt.run([self.deepen, "study", study, "--slurm", slurm])
        lines = [l for l in open(os.path.join(slurm, "study.list")) if l.strip() and not l.startswith("#")]
        assert [l.split()[0] for l in lines[2:]] == ["cache", "cache"], lines
        assert "--part 0/2" in lines[2] and "--part 1/2" in lines[3], lines
        sub = open(os.path.join(slurm, "submit.sh")).read()
        assert "--dependency=afterok:$cache" in sub and "--array=2-3" in sub, sub
        print(f"study: the cache job, then 2 runs from it in {time.time() - t0:.1f} s; --slurm: 2 cache parts first")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepen", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("case", choices=["setup", "train", "kill", "resume", "refusals", "study"])
    a = ap.parse_args()
    c = Cases(os.path.abspath(a.deepen), a.work)
    getattr(c, a.case + "_case")()


if __name__ == "__main__":
    main()
