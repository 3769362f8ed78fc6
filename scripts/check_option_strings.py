#!/usr/bin/env python3
"""The option rule: no code outside config/ compares an option's text (config/options.h).

Every enumerated option is parsed once into its enum; a comparison such as `cfg.x == "full"` outside
config/ is a second parser that a typo silently turns into a wrong path. This reads the spellings
from config/options.h (each `OptionSpelling<...> { ... names{"a", "b"} }`) and flags, in every C++
file outside config/ (tests included), a comparison of anything with one of those words as a string
literal: `== "full"`, `"full" !=`, and the same with std::string("..."). Comments and other string
literals (messages, TOML text in tests) are not comparisons and pass.

Exit 0 when nothing is found, 1 with one line per comparison ("train/x.cpp:12: compares an option's
text \"full\"; use the enum from config/options.h"), 2 when config/options.h has no spellings.

--self-test writes a small tree with one such comparison and checks it is caught, then that the
tree passes once the comparison goes (so the check is known to be able to fail).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

SOURCE_SUFFIXES = (".cpp", ".h", ".cu", ".cuh", ".hpp", ".cc")
SPELLINGS = re.compile(r"OptionSpelling<[^>]+>\s*\{[^}]*?names\{([^}]*)\}", re.S)


def spellings(root):
    with open(os.path.join(root, "config", "options.h"), encoding="utf-8") as f:
        text = f.read()
    words = set()
    for group in SPELLINGS.findall(text):
        words.update(re.findall(r'"([^"]+)"', group))
    return words


def source_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = [os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs]
    return sorted(p for p in out if p.endswith(SOURCE_SUFFIXES) and not p.startswith(("config/", "build")))


def code_of(line):
    """The line without its // comment (a // inside a string literal is kept)."""
    in_string = False
    for i, c in enumerate(line):
        if c == '"' and (i == 0 or line[i - 1] != "\\"):
            in_string = not in_string
        elif not in_string and line.startswith("//", i):
            return line[:i]
    return line


def violations(root):
    words = spellings(root)
    if not words:
        sys.exit(2)
    alternatives = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    literal = r'(?:std::string\()?"(' + alternatives + r')"\)?'
    compare = re.compile(r"[=!]=\s*" + literal + r"|" + literal + r"\s*[=!]=")
    found = []
    for path in source_files(root):
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                for m in compare.finditer(code_of(line)):
                    word = m.group(1) or m.group(2)
                    found.append(f"{path}:{n}: compares an option's text \"{word}\"; use the enum from config/options.h")
    return found


def self_test():
    tmp = tempfile.mkdtemp()
    try:
        os.makedirs(os.path.join(tmp, "config"))
        os.makedirs(os.path.join(tmp, "train"))
        with open(os.path.join(tmp, "config", "options.h"), "w") as f:
            f.write('template <> struct OptionSpelling<Sharding> { static constexpr std::array names{"none", "full"}; };\n')
        bad = os.path.join(tmp, "train", "x.cpp")
        with open(bad, "w") as f:
            f.write('// sharding == "full" in a comment is fine\nconst char* m = "x == \\"full\\"";\nif (s == "full") f();\n')
        found = violations(tmp)
        if len(found) != 1 or "train/x.cpp:3" not in found[0]:
            print("self-test: the comparison on line 3 was not caught exactly once:", found)
            return 1
        with open(bad, "w") as f:
            f.write("if (s == Sharding::kFull) f();\n")
        if violations(tmp):
            print("self-test: a clean tree was flagged")
            return 1
        print("self-test: a comparison with an option's text is caught; the clean tree passes")
        return 0
    finally:
        shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    found = violations(os.path.abspath(args.root))
    for line in found:
        print(line)
    if not found:
        print("no option text compared outside config/")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
