#!/usr/bin/env python3
"""Checks that the fused CPU kernels' loop bodies were compiled inside their SIMD clones.

A DEEPEN_CLONES function (model/vector_exp.h) is built once per vector width; the templates and
helpers its loops call (`*_impl<...>`, vexp) are built at that width only when inlined into it. One
left out of line is compiled for base x86-64 (SSE2) and runs the kernel several times slower with
every test still passing, so this reads the binary's symbol table: no such body may exist on its own.

  scripts/check_kernel_clones.py BINARY        exit 0, or 1 naming each out-of-line body
"""
import re
import subprocess
import sys

BODY = re.compile(r"deepen::(distill_rows|adamw_rows|kernels)::.*(_impl<|\bvexp(_softmax)?\()")


def out_of_line_bodies(binary):
    names = subprocess.run(["nm", "-C", binary], check=True, capture_output=True, text=True).stdout.splitlines()
    return [n for n in names if BODY.search(n)]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    found = out_of_line_bodies(sys.argv[1])
    for n in found:
        print(f"{sys.argv[1]}: out of line, so built for base x86-64 instead of its clone's width: {n}")
    if found:
        print("mark it DEEPEN_CLONE_BODY (model/vector_exp.h)")
        return 1
    print(f"{sys.argv[1]}: every kernel loop body is inside its clones")
    return 0


if __name__ == "__main__":
    sys.exit(main())
