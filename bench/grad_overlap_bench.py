#!/usr/bin/env python3
"""Gradient reduction overlapped with the backward (parallel.overlap_grad_reduce) vs after it.

  python3 bench/grad_overlap_bench.py --deepen build/deepen --config build/tests/e2e/base-global.toml \
      [--students 2] [--sharding none|grad_op] [--repeats 2]

Runs `deepen train` under mpirun (1 teacher + S students, a 6-layer hidden-256 student, 12 steps,
1 MiB buckets) with overlap on and off, alternating, and prints per run the student ranks' median
step time (steps 2+) and where it went (compute, grad_sync, optimizer) from step_time/rank<R>.jsonl,
then the on/off ratio of the medians. With overlap the buckets launched inside the backward count
as compute; grad_sync is what is left to wait for after it. The config is the e2e fixture's
(ctest -R e2e.setup makes it).
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def run(deepen, config, out, students, sharding, overlap):
    sets = [f'run.out_dir="{out}"', f"parallel.students={students}", "student.hidden=256", "student.head_dim=32",
            "student.intermediate=768", "student.layers=6", 'curriculum.mode="joint"', "curriculum.stages=[6]",
            "curriculum.stage_steps=[12]", "eval.every=1000", "eval.diagnostics_every=0", "checkpoint.every=0",
            f'parallel.sharding="{sharding}"', f"parallel.overlap_grad_reduce={overlap}", "parallel.bucket_cap_mb=1"]
    cmd = ["mpirun", "-np", str(1 + students), deepen, "train", config, "--fresh", "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ, **MPI_ENV))
    rows = []
    for name in sorted(os.listdir(os.path.join(out, "step_time"))):
        with open(os.path.join(out, "step_time", name)) as f:
            recs = [json.loads(l) for l in f if l.strip()]
        if recs[0]["role"] != "student":
            continue
        recs = recs[2:]
        part = lambda k: 1e3 * statistics.median(r["parts"].get(k, 0.0) for r in recs)
        rows.append((1e3 * statistics.median(r["time_s"] for r in recs), part("compute"), part("grad_sync"),
                     part("optimizer")))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepen", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--students", type=int, default=2)
    ap.add_argument("--sharding", default="none")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    steps = {"true": [], "false": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            for overlap in ("true", "false"):
                rows = run(a.deepen, a.config, os.path.join(tmp, f"{overlap}-{rep}"), a.students, a.sharding, overlap)
                for step, compute, sync, opt in rows:
                    steps[overlap].append(step)
                    print(f"overlap {overlap:5}: step {step:7.1f} ms  compute {compute:7.1f}  grad_sync {sync:6.1f}  "
                          f"optimizer {opt:6.1f}")
    on, off = statistics.median(steps["true"]), statistics.median(steps["false"])
    print(f"median step: overlap {on:.1f} ms, after the backward {off:.1f} ms: ratio {on / off:.3f} "
          f"(sharding {a.sharding}, {a.students} students, load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
