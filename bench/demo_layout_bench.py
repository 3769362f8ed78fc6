#!/usr/bin/env python3
"""Whole-job student tokens/s: the demo layout (1 teacher pipeline x 2 stages + 2 students under
mpirun) against the single-process run of the same config and global batch, measured back to back.

  python3 bench/demo_layout_bench.py --deepen build/deepen --demo runs/demo [--steps 40]

Needs the data and teacher that `deepen demo` leaves in its output folder (runs/demo by default).
Tokens/s is the global batch per optimizer step over the step's wall time, the median over steps
after the first 5 (warm-up); the same number for both launches. Prints the ratio distributed / single.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


def tokens_per_s(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return statistics.median(r["tokens_per_s"] for r in rows[5:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepen", default="build/deepen")
    ap.add_argument("--demo", default="runs/demo")
    ap.add_argument("--config", default="configs/demo/base.toml")
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    demo = os.path.abspath(a.demo)
    sets = [f'data.train="{demo}/data/train"', f'data.valid="{demo}/data/valid"',
            f'teacher.checkpoint="{demo}/teacher/final/hf"', "curriculum.stages=[3]", 'curriculum.mode="joint"',
            f"curriculum.stage_steps=[{a.steps}]", "eval.every=100000", "eval.diagnostics_every=0",
            "checkpoint.every=0"]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, prefix, threads in (("single process", [], 1), ("1x2+2 under mpirun", ["mpirun", "-np", "4"], 1)):
            out = os.path.join(tmp, name.split()[0])
            cmd = prefix + [a.deepen, "train", a.config, "--fresh", "--quiet", "--set", f'run.out_dir="{out}"',
                            "--set", f"run.threads={threads}"]
            for s in sets:
                cmd += ["--set", s]
            subprocess.run(cmd, check=True, env=dict(os.environ, **MPI_ENV), stdout=subprocess.DEVNULL)
            results[name] = tokens_per_s(out)
            print(f"{name:>20}: {results[name]:8.0f} student tokens/s (threads per rank: {threads})")
    ratio = results["1x2+2 under mpirun"] / results["single process"]
    print(f"ratio distributed / single process: {ratio:.2f}x (2 cores shared by 4 ranks)")


if __name__ == "__main__":
    main()
