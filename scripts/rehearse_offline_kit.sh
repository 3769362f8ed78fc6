#!/usr/bin/env bash
# Rehearses the offline kit: builds `deepen` and the GPU test binary (deepen_torch_tests) from the kit
# alone, in a Debian bookworm chroot that holds only what the lent GPU machine has (a compiler, and
# Python with pip-installed torch + nvidia wheels, pyarrow, mpi4py, safetensors, cmake and ninja; CUDA
# bind-mounted from the host) and none of the Debian dev packages. The build runs through
# `scripts/device_check.sh --kit /kit --build-only`, without a network (unshare --net).
#
#   scripts/rehearse_offline_kit.sh              # as root; log in $OUT/rehearsal.log
#   scripts/rehearse_offline_kit.sh --dry-run    # prints what it would do
#   CHROOT=build-chroot/root KIT=offline-kit OUT=build-chroot/out JOBS=2 TORCH=torch==2.11.0
#   WHEELS=DIR                                   # install the chroot's wheels from DIR, not from PyPI
#   CUDA=/usr/local/cuda                         # bind-mounted at the chroot's /usr/local/cuda
#
# Making the chroot (debootstrap, minbase + g++, python3, python3-venv) and its Python environment
# (/opt/torch/.venv, as on the GPU machine) needs root and the registries; both are kept between runs.
# The script mounts /proc, /sys (read-only) and a tmpfs on /dev/shm inside the chroot and unmounts them
# on exit; after a run killed with SIGKILL, `mount | grep CHROOT` before deleting the chroot.
# Each run copies the checkout (tracked and untracked-unignored files) and the kit in afresh and
# builds from scratch. A Debian package from the build's list found inside the chroot stops it.
set -euo pipefail
CALLER_DIR=$PWD
cd "$(dirname "$0")/.."
ROOT=$PWD

DRY=0
case ${1:-} in
  --dry-run | -n) DRY=1 ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
  "") ;;
  *) echo "rehearse_offline_kit.sh: unknown argument $1 (use --dry-run or --help)" >&2; exit 2 ;;
esac

# Paths given are the caller's; the defaults are in the checkout (git-ignored).
path() { (cd "$CALLER_DIR" && realpath -m "$1"); }
CHROOT=$(path "${CHROOT:-$ROOT/build-chroot/root}")
KIT=$(path "${KIT:-$ROOT/offline-kit}")
OUT=$(path "${OUT:-$ROOT/build-chroot/out}")
JOBS=${JOBS:-2}
TORCH=${TORCH:-torch==2.11.0}
WHEELS=${WHEELS:+$(path "$WHEELS")}
CUDA=$(path "${CUDA:-/usr/local/cuda}")
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PY_PACKAGES=("$TORCH" pyarrow mpi4py safetensors numpy cmake ninja)
# Debian packages the build takes from the kit: none of them may be in the chroot.
KIT_ONLY='libboost|libopenmpi|openmpi-bin|libtomlplusplus|libcli11|nlohmann-json|libutf8proc|libgtest|googletest|libssl-dev|pkg-config|pkgconf'

if ((DRY)); then
  echo "would make (if absent): debootstrap --variant=minbase --include=g++,python3,python3-venv,ca-certificates bookworm $CHROOT $MIRROR"
  echo "would make (if absent): $CHROOT/opt/torch/.venv with ${PY_PACKAGES[*]}${WHEELS:+ (from $WHEELS)}"
  echo "would check: no Debian package matching '$KIT_ONLY' in the chroot"
  echo "would copy: the checkout -> $CHROOT/src, $KIT -> $CHROOT/kit; bind $CUDA -> $CHROOT/usr/local/cuda"
  echo "would run (unshare --net chroot): cd /src && OUT=/out BUILD=build-gpu JOBS=$JOBS scripts/device_check.sh --kit /kit --build-only"
  echo "would write: $OUT/rehearsal.log"
  exit 0
fi

[[ $(id -u) == 0 ]] || { echo "rehearse_offline_kit.sh: needs root (debootstrap, chroot, mounts)" >&2; exit 1; }
[[ -f $KIT/env.sh ]] || { echo "rehearse_offline_kit.sh: no kit at $KIT (scripts/offline_kit.sh)" >&2; exit 1; }
[[ -x $CUDA/bin/nvcc ]] || { echo "rehearse_offline_kit.sh: no CUDA toolkit at $CUDA" >&2; exit 1; }
mkdir -p "$OUT"
LOG=$OUT/rehearsal.log
exec > >(tee "$LOG") 2>&1
START=$(date +%s)
echo "# offline kit rehearsal $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD) ($(git status --porcelain | wc -l) uncommitted paths)"
echo "kit: $KIT: $(tail -1 "$KIT/MANIFEST.txt" | sed 's/^# //')"

# ---- The chroot and its Python ------------------------------------------------------------------
if [[ ! -x $CHROOT/usr/bin/g++ ]]; then
  command -v debootstrap > /dev/null || apt-get install -y -qq debootstrap > /dev/null
  debootstrap --variant=minbase --include=g++,python3,python3-venv,ca-certificates bookworm "$CHROOT" "$MIRROR"
fi
MOUNTS=()
bind() {  # bind SRC DEST [ro]: DEST inside the chroot, unmounted on exit
  mkdir -p "$CHROOT$2"
  mount --bind "$1" "$CHROOT$2"
  [[ ${3:-} == ro ]] && mount -o remount,bind,ro "$CHROOT$2"
  MOUNTS=("$CHROOT$2" "${MOUNTS[@]}")
}
cleanup() { local m; for m in "${MOUNTS[@]}"; do umount "$m" || umount -l "$m"; done; }
trap cleanup EXIT
# The chroot's own /dev (debootstrap's nodes) with a tmpfs for shared memory; the host's /dev is not
# bound, so that removing the chroot can never reach it.
bind /proc /proc
bind /sys /sys ro
mount -t tmpfs tmpfs "$CHROOT/dev/shm"
MOUNTS=("$CHROOT/dev/shm" "${MOUNTS[@]}")
in_chroot() { chroot "$CHROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:/usr/bin:/bin "$@"; }
if ! in_chroot python3 -c "import torch, pyarrow, mpi4py, safetensors; assert torch.__version__.startswith('${TORCH#torch==}')" 2> /dev/null; then
  in_chroot /usr/bin/python3 -m venv /opt/torch/.venv
  if [[ -n $WHEELS ]]; then
    bind "$WHEELS" /wheels ro
    in_chroot pip install -q --no-index --find-links /wheels "${PY_PACKAGES[@]}"
  else
    cp /etc/resolv.conf "$CHROOT/etc/resolv.conf"
    # The host's CA bundle, for pip behind a TLS-intercepting proxy (pip's own bundle lacks its CA).
    cp /etc/ssl/certs/ca-certificates.crt "$CHROOT/etc/ssl/certs/ca-certificates.crt"
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$CHROOT/etc/pip.conf"
    in_chroot pip install -q "${PY_PACKAGES[@]}"
  fi
fi
echo "chroot: $(sed -n 's/^PRETTY_NAME="\(.*\)"/\1/p' "$CHROOT/etc/os-release"), $(in_chroot g++ --version | head -1)," \
  "$(in_chroot cmake --version | head -1), ninja $(in_chroot ninja --version)"
echo "chroot python: $(in_chroot python3 -c 'import sys, torch, pyarrow, mpi4py; print(sys.version.split()[0], "torch", torch.__version__, "pyarrow", pyarrow.__version__, "mpi4py", mpi4py.__version__)')"
found=$(in_chroot dpkg-query -W -f "\${Package}\n" | grep -E "^($KIT_ONLY)" || true)
if [[ -n $found ]]; then
  echo "FAILED: the chroot has Debian packages the kit must bring: $found"
  exit 1
fi
echo "chroot: no Debian package matching '$KIT_ONLY'; no /usr/include/boost: $([[ -e $CHROOT/usr/include/boost ]] && echo NO || echo yes)," \
  "no mpirun: $(in_chroot sh -c 'command -v mpirun' > /dev/null && echo NO || echo yes)"

# ---- The checkout and the kit, afresh ------------------------------------------------------------
rm -rf "$CHROOT/src" "$CHROOT/kit" "$CHROOT/out"
mkdir -p "$CHROOT/src" "$CHROOT/out"
git ls-files -co --exclude-standard -z | tar -C "$ROOT" --null -T - -cf - | tar -C "$CHROOT/src" -xf -
cp -a "$KIT" "$CHROOT/kit"
bind "$CUDA" /usr/local/cuda ro

# ---- The build, with no network ------------------------------------------------------------------
echo "## scripts/device_check.sh --kit /kit --build-only (unshare --net chroot $CHROOT)"
rc=0
unshare --net chroot "$CHROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
  PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:/usr/bin:/bin \
  OUT=/out BUILD=build-gpu JOBS="$JOBS" BUDGET_S=36000 BUILD_S=36000 \
  bash -c 'cd /src && scripts/device_check.sh --kit /kit --build-only' || rc=$?
cp "$CHROOT"/out/*.log "$OUT/" 2> /dev/null || true
if ((rc != 0)); then
  echo "FAILED: device_check.sh exit $rc (logs: $OUT/configure.log, $OUT/build.log)"
  exit 1
fi
grep -E "^-- deepen:" "$CHROOT/out/configure.log" | sed 's/^-- //'

# ---- What was built ------------------------------------------------------------------------------
B=/src/build-gpu
for bin in $B/deepen $B/tests/deepen_torch_tests; do
  rpath=$(readelf -d "$CHROOT$bin" | sed -n 's/.*(\(RPATH\|RUNPATH\)).*\[\(.*\)\]/\1 \2/p')
  echo "built: $bin, $(stat -c %s "$CHROOT$bin") bytes; ${rpath%% *} with the kit's $(tr ':' '\n' <<< "${rpath#* }" | grep '^/kit/' | paste -sd' ')"
  [[ $rpath == "RPATH "* ]] || { echo "FAILED: $bin has no DT_RPATH (a RUNPATH would not reach the torch wheel's own dependencies)"; exit 1; }
  unresolved=$(in_chroot ldd "$bin" | grep 'not found' || true)
  [[ -z $unresolved ]] || { echo "FAILED: $bin: unresolved libraries: $unresolved"; exit 1; }
done
echo "deepen's MPI: $(in_chroot ldd $B/deepen | grep -E 'libmpi|libtomlplusplus|libutf8proc' | awk '{print $1, $3}' | tr '\n' ' ')"
in_chroot $B/deepen --help | head -3
echo "GPU tests listed: $(in_chroot $B/tests/deepen_torch_tests --gtest_list_tests --gtest_filter='Gpu*:CommunicatorNccl*:CommunicatorSingle*:LogitChannelStaging*' | grep -c '^  ')"

# ---- The kit at run time (no GPU; the network namespace is the host's) ----------------------------
# deepen's MPI backend on a world of one, through the kit's Open MPI.
echo "## deepen_torch_tests --gtest_filter='CommunicatorSingle.*' (MPI singleton through the kit)"
in_chroot $B/tests/deepen_torch_tests --gtest_filter='CommunicatorSingle.*' | grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) '
# The kit's compiler wrapper and mpirun, relocated: two ranks sum their ranks.
cat > "$CHROOT/tmp/mpi_sum.cpp" << 'EOF2'
#include <mpi.h>
#include <cstdio>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("mpirun: %d ranks, sum of ranks %d\n", size, sum);
  MPI_Finalize();
}
EOF2
in_chroot bash -c '. /kit/env.sh && mpicxx /tmp/mpi_sum.cpp -o /tmp/mpi_sum &&
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 /tmp/mpi_sum'
echo "rehearsal: ok in $(( $(date +%s) - START )) s: deepen and deepen_torch_tests built from the kit alone"
