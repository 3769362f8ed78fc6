#!/usr/bin/env python3
"""`deepen train` with run.tensorboard = true: TensorBoard shows what metrics.jsonl and eval.jsonl hold.

  python3 tests/e2e/tensorboard_run.py --deepen build/deepen --work build/tests/e2e

Uses the end-to-end fixture (tests/e2e/distributed_train.py setup: byte shards and a tiny teacher).
The run is the demo's layout, 1 teacher pipeline x 2 stages + 2 students under mpirun, 9 steps through
two growth events. It is stopped after step 5 and its newest checkpoint removed, so the resumed run
starts again from the checkpoint after step 3 and trains steps 4 and 5 a second time. Then, read by
TensorBoard's own readers (the classic EventAccumulator and the one `tensorboard --logdir` serves
from, tests/run_folder/tensorboard_reader.py):
  - train/loss, train/kl, train/ce, train/lr, ... have one point per step, equal to metrics.jsonl
    (as 32-bit floats: TensorBoard's simple_value);
  - eval/val_ce and eval/val_kl equal eval.jsonl at its steps;
  - without the purge the resumed file's SessionLog START asks for, the redone steps would show
    twice (checked too).
Exit 77 (ctest: skipped) when the `tensorboard` package is not installed.
"""
import argparse
import glob
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "run_folder"))

from distributed_train import MPI_ENV, Cases, records, run  # noqa: E402
import tensorboard_reader  # noqa: E402

LAYOUT = ["parallel.teacher_pipelines=1", "parallel.teacher_stages=2", "parallel.students=2"]


def f32(x):
    """x as TensorBoard stores a simple_value."""
    return struct.unpack("f", struct.pack("f", x))[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepen", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        print("tensorboard_run: the PyPI package `tensorboard` is not installed (pip install -r requirements.txt)")
        sys.exit(77)

    c = Cases(a.deepen, a.work)
    out = os.path.join(c.work, "tensorboard")
    sets = LAYOUT + ["run.tensorboard=true", "checkpoint.every=2", "checkpoint.keep=3"]
    p = c.train(out, sets, ranks=4, check=False, extra=["--stop-after", "6"])
    assert p.returncode == 3, f"the stopped run should exit 3, got {p.returncode}: {p.stderr[-2000:]}"
    checkpoints = sorted(glob.glob(os.path.join(out, "checkpoints", "step_*")))
    assert [os.path.basename(x) for x in checkpoints][-2:] == ["step_00000003", "step_00000005"], checkpoints
    shutil.rmtree(checkpoints[-1])  # lost: the resume falls back to the checkpoint after step 3
    cmd = ["mpirun", "-np", "4", a.deepen, "train", c.base, "--quiet", "--set", f'run.out_dir="{out}"']
    for s in sets:
        cmd += ["--set", s]
    run(cmd, env=MPI_ENV)

    files = tensorboard_reader.event_files(out)
    assert len(files) == 2, files  # one per start
    metrics, evals = records(out, "metrics.jsonl"), records(out, "eval.jsonl")
    assert [m["step"] for m in metrics] == list(range(9)), [m["step"] for m in metrics]
    for reader in (tensorboard_reader.read_scalars, tensorboard_reader.read_served_scalars):
        view = reader(out)
        for field in ("loss", "kl", "ce", "lr", "grad_norm", "tokens", "active_layer_tokens", "tokens_per_s",
                      "depth"):
            want = [(m["step"], f32(m[field])) for m in metrics]
            got = view[f"train/{field}"]
            assert got == want, f"{reader.__name__}: train/{field}: TensorBoard {got} vs metrics.jsonl {want}"
        assert "train/time/compute" in view, sorted(view)
        for field in ("val_ce", "val_kl"):
            want = [(e["step"], f32(e[field])) for e in evals]
            got = view[f"eval/{field}"]
            assert got == want, f"{reader.__name__}: eval/{field}: TensorBoard {got} vs eval.jsonl {want}"
        raw = reader(out, keep_orphans=True)
        steps = [s for s, _ in raw["train/loss"]]
        assert steps == list(range(6)) + list(range(4, 9)), steps  # 4 and 5 written twice, shown once
    print(f"tensorboard: {len(files)} event files, {len(view)} tags; train/loss at steps 0-8 and "
          f"eval/val_ce at steps {[e['step'] for e in evals]} equal metrics.jsonl and eval.jsonl; "
          f"steps 4, 5 redone after the resume shown once")


if __name__ == "__main__":
    main()
