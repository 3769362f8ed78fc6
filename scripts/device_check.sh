#!/usr/bin/env bash
# Device check for one lent H200, 9 minutes from a cold build: preflight, build, GPU tests, real-shape runs.
#
#   OUT=/tmp/out scripts/device_check.sh             # from the repository root; results under $OUT
#   scripts/device_check.sh --kit offline-kit        # a machine without the Debian packages: the offline
#                                                    # kit (scripts/offline_kit.sh) first (also KIT=DIR)
#   scripts/device_check.sh --kit DIR --build-only   # steps 0-2 only (kit, preflight, build): no GPU needed;
#                                                    # the driver and GPU items are named, not required
#   scripts/device_check.sh --dry-run                # prints the preflight and every command, runs none;
#                                                    # with DEEPEN_BIN (a built deepen) it also checks each
#                                                    # run's config (`deepen ... --dry-run`), GPU or not
#   BUILD=build-gpu JOBS=16 BUDGET_S=540 BUILD_S=330 STEPS=8 TEACHER_LAYERS=4   # optional overrides
#   REHEARSE=1 BUILD=build OUT=/tmp/r scripts/device_check.sh   # CPU rehearsal of steps 4-5 at tiny
#                                                    # shapes with an existing build (no GPU needed)
#
# Steps, in order of what matters most if time runs short (each under `timeout`, each capped by what
# is left of BUDGET_S; a step that would start with under 20 s left is skipped, and says so):
#  0. with --kit DIR: sources DIR/env.sh, which puts the kit on the search paths (PATH,
#     CMAKE_PREFIX_PATH, pkg-config, Open MPI's prefix; DEEPEN_KIT for CMake's RPATH);
#  1. preflight: names every missing dependency (nvidia-smi, nvcc/CUDA, NCCL header and library,
#     the python torch wheel with CUDA, safetensors, cmake, ninja, g++, mpirun, mpicxx, pkg-config,
#     the headers of Boost, TOML++, CLI11, nlohmann-json, utf8proc and GoogleTest) and stops on any;
#  2. build only `deepen` and the GPU test binary (deepen_torch_tests), -j$JOBS, Hopper only
#     (BUILD_S seconds at most);
#  3. the GPU tests (Gpu*, the NCCL communicator, the logit channel's host staging): a skip on a GPU
#     machine is a failure to see the GPU;
#  4. real shapes, one 8,192-token sequence per step (micro_batch 1), V = 151,936, bf16:
#     a. pretrain: one paper-width student block (3 layers, hidden 4096, 32/8 heads, head_dim 128,
#        intermediate 12288), student.recompute = "layer";
#     b. a random teacher at Qwen3-8B width with TEACHER_LAYERS layers (HF format, bf16);
#     c. train: the block distilled from it over the full-logit channel;
#     d. train over the hidden-state channel (distill.logits = "hidden"), skipped with a message
#        where this build's config does not know it;
#     each printing tokens/s, MFU and peak GPU memory (summary.txt).
#
# MFU = model FLOPs per second / 989e12 (an H200 SXM's dense bf16 peak). Model FLOPs per token,
# computed from the shapes (not from the run): a layer's matmuls have
#   P_layer = hidden*(heads + 2*kv_heads)*head_dim + heads*head_dim*hidden + 3*hidden*intermediate
# weights; the head has hidden*V (the input embedding is a lookup: no FLOPs). A trained model costs
# 6 FLOPs per weight per token (forward 2, backward 4), the teacher's forward 2; recomputation is
# not counted (it is overhead, not model work). "+attn" adds causal attention scores: per layer and
# token 2*seq*heads*head_dim forward (QK^T and AV over seq/2 keys on average), times 3 for training.
# Peak GPU memory: the highest memory.used nvidia-smi saw during the run (sampled every 200 ms; the
# whole GPU: CUDA context, LibTorch's caching allocator reserve).
set -uo pipefail

DRY=0
BUILD_ONLY=0
KIT=${KIT:-}
while (($#)); do
  case $1 in
    --dry-run | -n) DRY=1 ;;
    --build-only) BUILD_ONLY=1 ;;
    --kit) [[ -n ${2:-} ]] || { echo "device_check.sh: --kit needs a folder" >&2; exit 2; }; KIT=$2; shift ;;
    --kit=*) KIT=${1#--kit=} ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "device_check.sh: unknown argument $1 (use --dry-run, --kit DIR, --build-only or --help)" >&2; exit 2 ;;
  esac
  shift
done

OUT=${OUT:-$PWD/device-check-out}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-16}
BUDGET_S=${BUDGET_S:-540}
BUILD_S=${BUILD_S:-330}
STEPS=${STEPS:-8}
TEACHER_LAYERS=${TEACHER_LAYERS:-4}
# Qwen3-8B's layer shape (docs/protocol.md, "Student": the student is 3 blocks of 3 layers at the teacher's width).
HIDDEN=4096 HEADS=32 KV=8 HD=128 INTER=12288 VOCAB=151936 SEQ=8192 BLOCK_LAYERS=3 DEVICE=cuda
REHEARSE=${REHEARSE:-0}
if ((REHEARSE)); then HIDDEN=64 HEADS=4 KV=2 HD=16 INTER=128 VOCAB=512 SEQ=256 DEVICE=cpu; fi
START=$(date +%s)
DEEPEN=$PWD/$BUILD/deepen
SUMMARY=$OUT/summary.txt
if ((DRY)); then
  WORK=$(mktemp -d /tmp/deepen-device-check-dry.XXXXXX)  # the generated config only
  trap 'rm -rf "$WORK"' EXIT
else
  WORK=${WORK:-/tmp/deepen-device-check}
  mkdir -p "$OUT" "$WORK"
  : > "$SUMMARY"
fi

say() {
  if ((DRY)); then echo "$*"; else echo "$*" | tee -a "$SUMMARY"; fi
}
left_s() { echo $((BUDGET_S - ($(date +%s) - START))); }

# step NAME LIMIT_S COMMAND...: runs COMMAND under `timeout` (LIMIT_S, or what is left of the
# budget if less), output in $OUT/NAME.log; says how it ended. Returns the command's code (124:
# timed out; 125: skipped for lack of time). --dry-run prints the command instead.
step() {
  local name=$1 limit=$2; shift 2
  if ((DRY)); then
    printf 'would run [%s, timeout %s s]:' "$name" "$limit"
    printf ' %q' "$@"
    printf '\n'
    # A deepen command's config (the generated base.toml and the --set overrides) checked now, so a
    # renamed key fails here and not on the lent GPU.
    if [[ $1 == "$DEEPEN" && -x ${DEEPEN_BIN:-} ]]; then
      if "$DEEPEN_BIN" "${@:2}" --dry-run > "$WORK/$name.check" 2>&1; then
        echo "  config check ($2 --dry-run): ok"
      else
        echo "  config check ($2 --dry-run): FAILED: $(grep -m1 -i error "$WORK/$name.check")"
        DRY_FAILED=1
      fi
    fi
    return 0
  fi
  local left
  left=$(left_s)
  if ((left < 20)); then
    say "$name: skipped, ${BUDGET_S} s budget spent"
    return 125
  fi
  ((limit > left)) && limit=$left
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  if ((rc == 124 || rc == 137)); then
    say "$name: TIMED OUT after ${limit} s (see $name.log)"
  elif ((rc != 0)); then
    say "$name: FAILED, exit $rc in $((SECONDS - t0)) s: $(tail -3 "$OUT/$name.log" | tr '\n' ' ')"
  else
    say "$name: ok in $((SECONDS - t0)) s"
  fi
  return "$rc"
}

# Samples the GPU's memory.used (MiB) into FILE until stopped: gpu_memory_start FILE; gpu_memory_stop.
DRY_FAILED=0
GPU_MEM_PID=""
gpu_memory_start() {
  ((DRY || REHEARSE)) && return 0
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$1" 2>/dev/null &
  GPU_MEM_PID=$!
}
gpu_memory_stop() {
  [[ -n $GPU_MEM_PID ]] && kill "$GPU_MEM_PID" 2>/dev/null && wait "$GPU_MEM_PID" 2>/dev/null
  GPU_MEM_PID=""
}
((DRY)) || trap gpu_memory_stop EXIT

say "# deepen device check $(date -u +%FT%TZ) on $(hostname), budget ${BUDGET_S} s$( ((DRY)) && echo ', DRY RUN')$( ((BUILD_ONLY)) && echo ', build only')"
say "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?') ($(git status --porcelain 2>/dev/null | wc -l) uncommitted paths)"

# ---- 0. Offline kit -----------------------------------------------------------------------------
if [[ -n $KIT ]]; then
  if [[ -f $KIT/env.sh ]]; then
    # shellcheck source=/dev/null  # made by scripts/offline_kit.sh
    . "$KIT/env.sh"
    say "kit: $DEEPEN_KIT ($(tail -1 "$KIT/MANIFEST.txt" 2>/dev/null | sed 's/^# //'))"
  else
    say "kit: $KIT has no env.sh (make one with scripts/offline_kit.sh)"
    ((DRY)) || { say "FAILED: kit"; exit 1; }
  fi
fi

# ---- 1. Preflight -------------------------------------------------------------------------------
missing=()
missing_gpu=()
need() {  # need WHAT TEST...: records WHAT as missing when the test command fails
  local what=$1; shift
  if "$@" > /dev/null 2>&1; then say "preflight: $what: ok"; else missing+=("$what"); say "preflight: $what: MISSING"; fi
}
need_gpu() {  # need_gpu WHAT TEST...: as need, for what only the GPU steps need (not --build-only)
  local what=$1; shift
  if "$@" > /dev/null 2>&1; then say "preflight: $what: ok"; else missing_gpu+=("$what"); say "preflight: $what: MISSING"; fi
}
# header H: H is under include/ (or Debian's include/<triplet>/) of a CMAKE_PREFIX_PATH entry (the
# kit's) or of /usr/local or /usr.
header() {
  local prefix
  for prefix in ${CMAKE_PREFIX_PATH:+${CMAKE_PREFIX_PATH//:/ }} /usr/local /usr; do
    [[ -f $prefix/include/$1 ]] && return 0
    compgen -G "$prefix/include/*-linux-gnu/$1" > /dev/null && return 0
  done
  return 1
}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
SITE=$(python3 -c 'import site, sys; print(next(p for p in sys.path if p.endswith("site-packages")))' 2>/dev/null)
need_gpu "nvidia-smi (NVIDIA driver)" command -v nvidia-smi
need_gpu "a visible GPU (nvidia-smi -L)" nvidia-smi -L
need "nvcc (CUDA toolkit at $CUDA_HOME or on PATH)" bash -c "command -v nvcc || test -x '$CUDA_HOME/bin/nvcc'"
need "nccl.h (torch wheel's nvidia/nccl/include or $CUDA_HOME/include)" \
  bash -c "test -f '$SITE/nvidia/nccl/include/nccl.h' || test -f '$CUDA_HOME/include/nccl.h'"
need "libnccl.so.2 (torch wheel's nvidia/nccl/lib)" test -f "$SITE/nvidia/nccl/lib/libnccl.so.2"
need "python3 torch wheel with CUDA" python3 -c 'import torch, sys; sys.exit(torch.version.cuda is None)'
need "python3 safetensors (the random teacher)" python3 -c 'import safetensors'
for tool in cmake ninja g++ mpirun mpicxx pkg-config timeout; do need "$tool" command -v "$tool"; done
need "Boost headers (boost/asio.hpp)" header boost/asio.hpp
need "TOML++ (toml++/toml.h)" header toml++/toml.h
need "CLI11 (CLI/CLI.hpp)" header CLI/CLI.hpp
need "nlohmann-json (nlohmann/json.hpp)" header nlohmann/json.hpp
need "utf8proc (utf8proc.h)" header utf8proc.h
need "GoogleTest (gtest/gtest.h)" header gtest/gtest.h
need "OpenSSL (openssl/evp.h and its openssl/opensslconf.h)" bash -c "$(declare -f header); header openssl/evp.h && header openssl/opensslconf.h"
need "prometheus-cpp (prometheus/text_serializer.h)" header prometheus/text_serializer.h
if ((!DRY)); then
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" 2>&1 | tee -a "$SUMMARY"
fi
((BUILD_ONLY)) || missing+=(${missing_gpu[@]+"${missing_gpu[@]}"})
if ((${#missing[@]})); then
  say "preflight: missing: $(IFS=';'; echo "${missing[*]}")"
  if ((!DRY && !REHEARSE)); then say "FAILED: preflight"; exit 1; fi
fi
((BUILD_ONLY && ${#missing_gpu[@]})) && say "preflight: not needed to build (--build-only): $(IFS=';'; echo "${missing_gpu[*]}")"

# ---- 2. Build -----------------------------------------------------------------------------------
say "## build: deepen and deepen_torch_tests in $BUILD, -j$JOBS, Hopper (9.0) only"
if ((REHEARSE)); then
  say "rehearsal: no build, no GPU tests; tiny shapes on the CPU with $DEEPEN"
else
  step configure 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTORCH_CUDA_ARCH_LIST=9.0 ||
    { say "FAILED: configure"; exit 1; }
  ((DRY)) || grep -h "deepen: NCCL backend" "$OUT/configure.log" | sed 's/^-- //' | tee -a "$SUMMARY"
  step build "$BUILD_S" cmake --build "$BUILD" --target deepen deepen_torch_tests -j"$JOBS" || { say "FAILED: build"; exit 1; }
  if ((BUILD_ONLY)); then
    if ((DRY)); then say "build only: would stop here (no GPU tests, no runs)"; exit 0; fi
    say "build only: $BUILD/deepen and $BUILD/tests/deepen_torch_tests built; no GPU tests, no runs"
    say "total $(( $(date +%s) - START )) s"
    exit 0
  fi

  # ---- 3. GPU tests -------------------------------------------------------------------------------
  say "## GPU tests"
  step gpu_tests 120 "$BUILD/tests/deepen_torch_tests" \
    --gtest_filter='Gpu*:CommunicatorNccl*:CommunicatorSingle*:LogitChannelStaging*' --gtest_output="xml:$OUT/gpu_tests.xml"
  if ((!DRY)) && [[ -f $OUT/gpu_tests.log ]]; then
    grep -E '^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z]' "$OUT/gpu_tests.log" > "$OUT/gpu_tests.results"
    say "GPU tests: $(grep -c '^\[ *OK' "$OUT/gpu_tests.results") ok, $(grep -c FAILED "$OUT/gpu_tests.results") failed," \
      "$(grep -c SKIPPED "$OUT/gpu_tests.results") skipped (0 skipped expected on a GPU machine)"
    grep -E 'FAILED|SKIPPED' "$OUT/gpu_tests.results" | tee -a "$SUMMARY"
  fi
fi

# ---- 4. Real-shape runs -------------------------------------------------------------------------
say "## runs: hidden $HIDDEN, $HEADS/$KV heads x $HD, intermediate $INTER, V = $VOCAB, one $SEQ-token sequence a step, bf16"
((DRY)) || mkdir -p "$WORK/text"
# Synthetic text (structured, so losses fall) in 8 documents of ~200,000 bytes, each cut to its first
# 8,192 tokens (data.packing = "documents", the paper's protocol); the byte tokenizer, with the
# vocabulary widened to V by student.vocab_size: the output layer's cost is the real one.
step text 30 python3 -c '
import random, sys
words = "the growth of a student follows teacher norm block layer residual stream attention head".split()
rng = random.Random(1)
for part in range(8):  # several documents, so that the validation split holds some and not all
    with open(f"{sys.argv[1]}/part{part}.txt", "w") as f:
        f.write("".join(rng.choice(words) + (".\n" if rng.random() < 0.15 else " ") for _ in range(int(sys.argv[2]))))
' "$WORK/text" $((STEPS * SEQ / 20 + 30000))
cat > "$WORK/base.toml" << EOF
[run]
seed = 1
threads = 8
device = "$DEVICE"
[data]
tokenizer = "bytes"
sources = ["$WORK/text"]
train = "$WORK/data/train"
valid = "$WORK/data/valid"
packing = "documents"
max_len = $SEQ
valid_fraction = 0.05
[student]
layers = $BLOCK_LAYERS
hidden = $HIDDEN
heads = $HEADS
kv_heads = $KV
head_dim = $HD
intermediate = $INTER
vocab_size = $VOCAB
precision = "bf16-mixed"
recompute = "layer"
[curriculum]
mode = "joint"
stage_steps = [$STEPS]
[optim]
lr = 1e-4
warmup_steps = 2
[parallel]
micro_batch = 1
[eval]
every = 100000
batches = 1
diagnostics_every = 0
diagnostic_batch = 1
[checkpoint]
every = 0
keep = 1
EOF
step prep 60 "$DEEPEN" prep "$WORK/base.toml" --no-progress

# a. One paper-width block, pretrained (CE only).
gpu_memory_start "$OUT/pretrain_block.mem"
step pretrain_block 120 "$DEEPEN" pretrain "$WORK/base.toml" --set run.name=block --set "run.out_dir=\"$WORK/block\""
gpu_memory_stop

# b. A random Qwen3-8B-width teacher with TEACHER_LAYERS layers, in HF format (what deepen loads).
step make_teacher 90 python3 scripts/random_qwen3.py "$WORK/teacher" --layers "$TEACHER_LAYERS" --hidden "$HIDDEN" \
  --heads "$HEADS" --kv-heads "$KV" --head-dim "$HD" --intermediate "$INTER" --vocab "$VOCAB"

# c, d. The block distilled from it, full logits (bf16 on the wire) and hidden states.
TRAIN=("$DEEPEN" train "$WORK/base.toml" --set "teacher.checkpoint=\"$WORK/teacher\"" --set teacher.dtype=bf16
  --set distill.channel_dtype=bf16)
gpu_memory_start "$OUT/train_full.mem"
step train_full 150 "${TRAIN[@]}" --set run.name=full --set "run.out_dir=\"$WORK/full\"" --set distill.logits=full
gpu_memory_stop
# Whether this build knows the hidden-state channel: its config check says (the built binary, or
# DEEPEN_BIN in a dry run; a dry run without one assumes it does).
PROBE=("${TRAIN[@]}")
((DRY)) && PROBE[0]=${DEEPEN_BIN:-}
if [[ -z ${PROBE[0]} ]] || "${PROBE[@]}" --set distill.logits=hidden --dry-run > "$WORK/hidden_probe.log" 2>&1; then
  gpu_memory_start "$OUT/train_hidden.mem"
  step train_hidden 150 "${TRAIN[@]}" --set run.name=hidden --set "run.out_dir=\"$WORK/hidden\"" --set distill.logits=hidden
  gpu_memory_stop
else
  say "train_hidden: skipped: this build's config does not take distill.logits = \"hidden\": $(grep -m1 -i error "$WORK/hidden_probe.log")"
fi

# ---- 5. Numbers ---------------------------------------------------------------------------------
if ((DRY)); then
  say "would print: tokens/s, MFU and peak GPU memory of pretrain_block, train_full, train_hidden"
  ((DRY_FAILED)) && { say "dry run: a config check FAILED"; exit 1; }
  exit 0
fi
python3 - "$WORK" "$OUT" "$HIDDEN" "$HEADS" "$KV" "$HD" "$INTER" "$VOCAB" "$SEQ" "$BLOCK_LAYERS" "$TEACHER_LAYERS" << 'EOF' | tee -a "$SUMMARY"
import json, os, statistics, sys
work, out = sys.argv[1:3]
h, heads, kv, hd, inter, vocab, seq, s_layers, t_layers = map(int, sys.argv[3:12])
PEAK = 989e12  # H200 SXM dense bf16
p_layer = h * (heads + 2 * kv) * hd + heads * hd * h + 3 * h * inter
n_s = s_layers * p_layer + h * vocab  # matmul weights of the student (embedding lookup excluded)
n_t = t_layers * p_layer + h * vocab
attn_layer = 2 * seq * heads * hd     # causal attention score FLOPs per token, one forward layer

def report(name, run, train_flops, attn_flops):
    path = f"{work}/{run}/metrics.jsonl"
    if not os.path.exists(f"{out}/{name}.log"):
        print(f"{name}: not run")
        return
    if not os.path.exists(path):
        print(f"{name}: no metrics (see {name}.log)")
        return
    rows = [json.loads(l) for l in open(path)]
    steady = [r["tokens_per_s"] for r in rows[2:]] or [r["tokens_per_s"] for r in rows]
    tps = statistics.median(steady)
    try:
        peak = max(int(l) for l in open(f"{out}/{name}.mem") if l.strip().isdigit())
        mem = f"{peak / 1024:.1f} GiB"
    except (OSError, ValueError):
        mem = "?"
    print(f"{name}: {len(rows)} steps, median {tps:,.0f} tokens/s after the first 2, "
          f"MFU {train_flops * tps / PEAK:.1%} (+attn {(train_flops + attn_flops) * tps / PEAK:.1%}), "
          f"peak GPU memory {mem}, loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}")

print(f"model FLOPs/token: student block 6 x {n_s:.4g}, teacher forward 2 x {n_t:.4g} (matmul weights)")
report("pretrain_block", "block", 6 * n_s, 3 * s_layers * attn_layer)
report("train_full", "full", 6 * n_s + 2 * n_t, 3 * s_layers * attn_layer + t_layers * attn_layer)
report("train_hidden", "hidden", 6 * n_s + 2 * n_t, 3 * s_layers * attn_layer + t_layers * attn_layer)
EOF
say "total $(( $(date +%s) - START )) s; work folder $WORK (not cleaned)"
