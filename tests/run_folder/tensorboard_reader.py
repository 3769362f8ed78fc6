#!/usr/bin/env python3
"""Reads a run folder's TensorBoard event files with TensorBoard's own readers and prints the scalars.

  python3 tests/run_folder/tensorboard_reader.py RUN_DIR [--keep-orphans]

Prints one JSON object: {"files": N, "scalars": {tag: [[step, value], ...]}, "server": {...}}, steps
in the order TensorBoard keeps them. Two readers of the PyPI `tensorboard` package (pinned in
requirements.txt), each reading the folder's event files in name order:
  "scalars"  `event_accumulator.EventAccumulator`, the classic reader of simple_value scalars;
  "server"   `plugin_event_accumulator.EventAccumulator`, what `tensorboard --logdir` serves the
             scalar dashboard from with --load_fast=false (simple_value scalars become tensors).
They differ in one way that matters here: the server's reader takes a run's first SessionLog START
for the initial one and purges orphaned steps only from the second on, the classic one at every
START. By default both drop the events a later START says were redone; --keep-orphans turns that off
(purge_orphaned_data=False), to see every event as written.

Exit code 77 (and a line saying how to get it) when `tensorboard` is not installed, so a C++ test
can skip naming the reason; 1 when the folder holds no event file.
"""
import argparse
import glob
import json
import os
import sys


def read_scalars(run_dir, keep_orphans=False):
    """{tag: [(step, value), ...]} as the classic EventAccumulator reads run_dir."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={event_accumulator.SCALARS: 0},
                                             purge_orphaned_data=not keep_orphans)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def read_served_scalars(run_dir, keep_orphans=False):
    """{tag: [(step, value), ...]} as `tensorboard --logdir` (Python loader) serves run_dir's scalars."""
    from tensorboard.backend.event_processing import plugin_event_accumulator
    from tensorboard.util import tensor_util

    acc = plugin_event_accumulator.EventAccumulator(
        run_dir, size_guidance={plugin_event_accumulator.TENSORS: 0}, purge_orphaned_data=not keep_orphans)
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        if acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            continue
        out[tag] = [(e.step, tensor_util.make_ndarray(e.tensor_proto).item()) for e in acc.Tensors(tag)]
    return out


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

    def as_json(scalars):
        return {t: [[s, v] for s, v in xs] for t, xs in scalars.items()}

    print(json.dumps({"files": len(files), "scalars": as_json(read_scalars(a.run_dir, a.keep_orphans)),
                      "server": as_json(read_served_scalars(a.run_dir, a.keep_orphans))}))


if __name__ == "__main__":
    main()
