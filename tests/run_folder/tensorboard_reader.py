#!/usr/bin/env python3
"""Reads a run folder's TensorBoard event files with TensorBoard's own reader and prints the scalars.

  python3 tests/run_folder/tensorboard_reader.py RUN_DIR [--keep-orphans]

Prints one JSON object: {"scalars": {tag: [[step, value], ...]}, "files": N}, steps in the order
TensorBoard keeps them. The reader is `EventAccumulator` of the PyPI `tensorboard` package (pinned in
requirements.txt), the class behind `tensorboard --logdir`'s scalar dashboard: it reads a folder's
event files in name order and, by default, drops the events a SessionLog START says were redone.
--keep-orphans turns that off (purge_orphaned_data=False), to see every event as written.

Exit code 77 (and a line saying how to get it) when `tensorboard` is not installed, so a C++ test
can skip naming the reason; 1 when the folder holds no event file.
"""
import argparse
import glob
import json
import os
import sys


def read_scalars(run_dir, keep_orphans=False):
    """{tag: [(step, value), ...]} as TensorBoard shows them for run_dir."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={event_accumulator.SCALARS: 0},
                                             purge_orphaned_data=not keep_orphans)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def event_files(run_dir):
    return sorted(glob.glob(os.path.join(run_dir, "*tfevents*")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--keep-orphans", action="store_true")
    a = ap.parse_args()
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        print("tensorboard_reader: the PyPI package `tensorboard` is not installed "
              "(pip install -r requirements.txt, or scripts/setup.sh)")
        sys.exit(77)
    files = event_files(a.run_dir)
    if not files:
        sys.exit(f"tensorboard_reader: no event file in {a.run_dir}")
    scalars = read_scalars(a.run_dir, a.keep_orphans)
    print(json.dumps({"files": len(files), "scalars": {t: [[s, v] for s, v in xs] for t, xs in scalars.items()}}))


if __name__ == "__main__":
    main()
