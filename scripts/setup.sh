#!/usr/bin/env bash
# Installs what deepen needs on a fresh Debian 12 machine (apt + pip) and builds build/deepen.
# Idempotent: a second run installs nothing and rebuilds only what changed.
# Usage: scripts/setup.sh [TARGET...]   (default: deepen, the one target `deepen demo` needs;
#   scripts/test.sh passes `all`: the test binaries and benchmarks, most of a fresh build's time)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libopenmpi-dev openmpi-bin            # MPI backend and mpirun
  libboost-dev libboost-system-dev      # Boost.Asio control plane, Boost.Beast /metrics server
  libssl-dev                            # OpenSSL libcrypto: control-plane HMAC, nonces, job secret
  prometheus-cpp-dev                    # prometheus-cpp: /metrics exposition text
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libutf8proc-dev libgtest-dev
  libopenblas0-openmp                   # fast fp32 BLAS on CPU
  gnuplot-nox                           # report plots (PNG, SVG)
  shellcheck                            # the scripts' lint test (DeviceCheckScript.*)
  libtcmalloc-minimal4 libjemalloc2     # the benches' plain-PyTorch baselines under other mallocs (bench/baseline_variants.h)
  fortunes python3.11-doc               # text the demo and the tokenizer tests read
)
# The Slurm clusters of tests/slurm/ (the tests start and stop the daemons themselves), one node and
# three nodes of network namespaces (iproute2: ip, tc, ss; util-linux: unshare, nsenter; binutils:
# readelf for the stale-binary test). Without recommends: no mail server, no cgroup or database tooling
# the tests do not use.
SLURM_PACKAGES=(slurmctld slurmd slurm-client munge iproute2 util-linux binutils)
apt_install() {  # apt_install [apt-get options] -- packages: installs the ones not installed yet
  local -a opts=() missing=()
  while [[ $1 != -- ]]; do opts+=("$1"); shift; done; shift
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  ((${#missing[@]})) || return 0
  echo "setup: apt-get install ${opts[*]} ${missing[*]}"
  local SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  ((APT_UPDATED)) || { $SUDO apt-get update -qq; APT_UPDATED=1; }
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${opts[@]}" "${missing[@]}" >/dev/null
}
APT_UPDATED=0
apt_install -- "${APT_PACKAGES[@]}"
apt_install --no-install-recommends -- "${SLURM_PACKAGES[@]}"

PY=${PYTHON:-python3}
if ! "$PY" - <<'PYEOF' 2>/dev/null
import importlib.metadata as m, sys
want = [l.split("#")[0].strip() for l in open("requirements.txt")]
want = [w for w in want if w]
ok = all(m.version(w.split("==")[0]) == w.split("==")[1] for w in want)
sys.exit(0 if ok else 1)
PYEOF
then
  echo "setup: pip install -r requirements.txt"
  "$PY" -m pip install -q -r requirements.txt
fi

# ccache keyed on paths relative to the checkout, so a second clone (CI) reuses the first one's objects.
export CCACHE_BASEDIR="$(pwd)" CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
TARGETS=("${@:-deepen}")
cmake --build build --target "${TARGETS[@]}" -j "$(nproc)"
echo "setup: built ${TARGETS[*]} in $(pwd)/build"
