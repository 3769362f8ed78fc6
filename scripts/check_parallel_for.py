#!/usr/bin/env python3
"""Checks that every TU calling at::parallel_for was built with OpenMP, so its loops really split.

LibTorch's at::parallel_for is an inline template: compiled without -fopenmp (no _OPENMP), it runs
the whole range on the calling thread, silently. Such a TU is built with -fopenmp
(deepen_parallel_sources in CMakeLists.txt), and its object then calls into libgomp (GOMP_parallel).
This finds each C++ source of the project that calls at::parallel_for and checks its object file.

  scripts/check_parallel_for.py --root SRC OBJECT...     exit 0, or 1 naming each serial TU
"""
import argparse
import pathlib
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True)
    ap.add_argument("objects", nargs="+")
    a = ap.parse_args()
    root = pathlib.Path(a.root)
    callers = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.cpp")
                     if not p.relative_to(root).parts[0].startswith(("build", "tests", "."))
                     and "at::parallel_for" in p.read_text(errors="replace"))
    objects = {}
    for o in a.objects:
        for src in callers:
            # deepen_torch's objects carry the source's path (CMakeFiles/deepen_torch.dir/train/x.cpp.o);
            # a target of a subfolder's its name only, under that folder (bench/CMakeFiles/t.dir/x.cpp.o).
            folder, name = src.rsplit("/", 1) if "/" in src else ("", src)
            if o.endswith("/" + src + ".o") or (o.endswith("/" + name + ".o") and f"/{folder}/" in o):
                objects[src] = o
    bad = []
    for src in callers:
        if src not in objects:
            continue  # not part of the targets given (another target's TU)
        undefined = subprocess.run(["nm", "-u", objects[src]], check=True, capture_output=True, text=True).stdout
        if "GOMP_parallel" not in undefined:
            bad.append(src)
            print(f"{src}: calls at::parallel_for but was built without OpenMP ({objects[src]} has no GOMP_parallel): "
                  "its loops run on one thread; add it to deepen_parallel_sources")
    if not objects:
        print("no object of a TU that calls at::parallel_for was given")
        return 1
    if not bad:
        print(f"{len(objects)} TUs call at::parallel_for, each built with OpenMP: {', '.join(sorted(objects))}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
