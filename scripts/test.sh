#!/usr/bin/env bash
# Sets up and builds everything (scripts/setup.sh all: build/deepen, the test binaries and the
# benchmarks, which ctest runs too), then runs every test: GoogleTest units and multi-rank tests
# under mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh all
# mpirun refuses root without these; CI and containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 1200 "$@"
