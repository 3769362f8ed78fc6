#!/usr/bin/env python3
"""The include rule: a folder includes only its own floor and the floors below (docs/architecture.md).

Reads the floors table from docs/architecture.md (the rows between the markers
<!-- floors-table --> and <!-- /floors-table -->: | floor | folders | ... |, the floor's number first
in its cell, the folders in backticks), then checks every #include "x/..." of every C++ file the
checkout holds. tests/<module>/ sits on <module>'s floor. Exit 0 when every include points at the
same floor or lower, 1 with one line per violation ("model/x.h:3: includes train/y.h: floor 1 (model)
may not include floor 3 (train)"), 2 when the table or a folder is unknown.

--self-test builds a small tree with one violation and checks that it is caught (so the check is
known to be able to fail), then that the tree passes once the violation is removed.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

SOURCE_SUFFIXES = (".cpp", ".h", ".cu", ".cuh", ".hpp", ".cc")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def read_floors(doc_path):
    """{folder: floor} from the marked table; folder names without trailing '/'."""
    with open(doc_path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"<!-- floors-table -->(.*?)<!-- /floors-table -->", text, re.S)
    if not m:
        sys.exit(f"{doc_path}: no <!-- floors-table --> ... <!-- /floors-table --> block")
    floors = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not re.match(r"^\d+", cells[0]):
            continue  # header, separator, prose
        floor = int(re.match(r"^(\d+)", cells[0]).group(1))
        for folder in re.findall(r"`([^`]+)`", cells[1]):
            floors[folder.rstrip("/")] = floor
    if not floors:
        sys.exit(f"{doc_path}: the floors table has no rows")
    return floors


def folder_of(path, floors):
    """The table's folder a file (or include target) belongs to: the longest matching prefix,
    then tests/<module>/ -> <module>."""
    parts = path.split("/")[:-1]
    if len(parts) >= 2 and parts[0] == "tests" and "tests/" + parts[1] not in floors and parts[1] in floors:
        return parts[1]
    for n in range(len(parts), 0, -1):
        key = "/".join(parts[:n])
        if key in floors:
            return key
    return None


def source_files(root):
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, check=True,
                             capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]
    return sorted(p for p in out if p.endswith(SOURCE_SUFFIXES) and not p.startswith("build"))


def check(root):
    floors = read_floors(os.path.join(root, "docs", "architecture.md"))
    violations, unknown = [], set()
    for rel in source_files(root):
        if not os.path.exists(os.path.join(root, rel)):
            continue
        here = folder_of(rel, floors)
        if here is None:
            unknown.add(rel.split("/")[0] if "/" in rel else rel)
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m or "/" not in m.group(1):
                    continue
                target = m.group(1)
                there = folder_of(target, floors)
                if there is None:
                    unknown.add(target.split("/")[0])
                    continue
                if floors[there] > floors[here]:
                    violations.append(f"{rel}:{number}: includes {target}: floor {floors[here]} ({here}) may not "
                                      f"include floor {floors[there]} ({there})")
    for v in violations:
        print(v)
    if unknown:
        print("folders missing from the floors table in docs/architecture.md: " + ", ".join(sorted(unknown)))
        return 2
    print(f"include floors: {len(violations)} violation(s) in {len(source_files(root))} files")
    return 1 if violations else 0


def self_test(root):
    tmp = tempfile.mkdtemp(prefix="check_floors_")
    try:
        os.makedirs(os.path.join(tmp, "docs"))
        shutil.copy(os.path.join(root, "docs", "architecture.md"), os.path.join(tmp, "docs"))
        for d in ("config", "model", "train"):
            os.makedirs(os.path.join(tmp, d))
        with open(os.path.join(tmp, "config", "config.h"), "w") as f:
            f.write("#pragma once\n")
        with open(os.path.join(tmp, "train", "loss.h"), "w") as f:
            f.write('#pragma once\n#include "config/config.h"\n')
        bad = os.path.join(tmp, "model", "block.h")
        with open(bad, "w") as f:
            f.write('#pragma once\n#include "config/config.h"\n#include "train/loss.h"\n')
        if check(tmp) != 1:
            print("self-test: a model/ header including train/ was NOT caught")
            return 1
        with open(bad, "w") as f:
            f.write('#pragma once\n#include "config/config.h"\n')
        if check(tmp) != 0:
            print("self-test: the tree without the violation did not pass")
            return 1
        print("self-test: the violation was caught, and the tree passes without it")
        return 0
    finally:
        shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    sys.exit(self_test(args.root) if args.self_test else check(args.root))


if __name__ == "__main__":
    main()
