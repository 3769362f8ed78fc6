#!/usr/bin/env bash
# Device check for a lent GPU (written for one H200): build deepen for Hopper in a fresh build dir,
# run the CUDA tests, then time short single-process runs on run.device = "cuda" and report tokens/s
# and model FLOP utilization; optionally a 2-rank run on the same GPU over MPI (host staging).
# Results go under $OUT (summary.txt first). Meant to finish in a few minutes on 16 cores.
#
#   OUT=/tmp/out scripts/device_check.sh            # from the repository root
#   BUILD=build-gpu  JOBS=16  STEPS=40  SKIP_MPI=1   # optional overrides
#   SKIP_BUILD=1 BUILD=build-x DEVICE=cpu SMALL=1     # rehearsal on a CPU machine (plumbing only)
#
# Model FLOP utilization (MFU), PaLM-style, attention-score FLOPs left out:
#   pretrain (CE only):  MFU = 6 * N_student * tokens_per_s / 989e12
#   train (distill):     MFU = (6 * N_student + 2 * N_teacher) * tokens_per_s / 989e12
# N = parameters of the model's safetensors file (a tied embedding counted once: it is the head's
# matmul), tokens_per_s = median of metrics.jsonl "tokens_per_s" after the first 5 steps, and
# 989e12 FLOP/s = an H200's dense bf16 tensor-core peak (SXM; sparsity not counted).
set -uo pipefail

OUT=${OUT:-$PWD/device-check-out}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
STEPS=${STEPS:-40}
DEVICE=${DEVICE:-cuda}
# Shapes: the study's 9 x 1024 student distilled from a 12 x 1024 teacher, 16 x 1024 tokens a step.
HIDDEN=1024 HEADS=16 KV=8 HD=64 INTER=3072 SEQ=1024 MB=16 TL=12 SL=9 WORDS=2000000
if [[ -n "${SMALL:-}" ]]; then HIDDEN=64 HEADS=4 KV=2 HD=16 INTER=128 SEQ=64 MB=2 TL=2 SL=2 WORDS=50000 STEPS=8; fi
WORK=$(mktemp -d /tmp/deepen-device-check.XXXXXX)
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
fail() { say "FAILED: $*"; exit 1; }

say "# deepen device check $(date -u +%FT%TZ) on $(hostname)"
say "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?') ($(git status --porcelain 2>/dev/null | wc -l) uncommitted paths)"
{
  nvidia-smi || echo "nvidia-smi: not available"
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'devices', torch.cuda.device_count())"
  for tool in cmake ninja g++ mpirun; do printf '%s: %s\n' "$tool" "$(command -v $tool || echo missing)"; done
} > "$OUT/env.txt" 2>&1
grep -E "torch |NVIDIA H|missing" "$OUT/env.txt" | tee -a "$SUMMARY"

# 1. Build (fresh dir, Hopper only).
say "## build ($BUILD, -DTORCH_CUDA_ARCH_LIST=9.0, -j$JOBS)"
start=$(date +%s)
[[ -n "${SKIP_BUILD:-}" ]] || timeout 900 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTORCH_CUDA_ARCH_LIST=9.0 > "$OUT/cmake.log" 2>&1 ||
  fail "configure (see cmake.log): $(tail -3 "$OUT/cmake.log" | tr '\n' ' ')"
grep -s "NCCL backend" "$OUT/cmake.log" | sed 's/^-- //' | tee -a "$SUMMARY"
[[ -n "${SKIP_BUILD:-}" ]] || timeout 1200 cmake --build "$BUILD" --target deepen deepen_torch_tests deepen_base_tests -j"$JOBS" > "$OUT/build.log" 2>&1 ||
  fail "build (see build.log): $(grep -m3 -E 'error|Error' "$OUT/build.log" | tr '\n' ' ')"
say "built in $(( $(date +%s) - start )) s"
DEEPEN=$PWD/$BUILD/deepen

# 2. CUDA tests (one process each suite). A skipped GPU test here means CUDA was not seen: a failure.
say "## tests"
"$BUILD/tests/deepen_base_tests" --gtest_filter='RunDevice*:WorldBackend*:RankCudaDevice*' > "$OUT/base_tests.log" 2>&1
say "device decisions (base): exit $? ($(grep -c '^\[       OK' "$OUT/base_tests.log") ok)"
timeout 600 "$BUILD/tests/deepen_torch_tests" \
  --gtest_filter='Gpu*:CommunicatorNccl*:LogitChannelStaging*' \
  --gtest_output=xml:"$OUT/gpu_tests.xml" > "$OUT/gpu_tests.log" 2>&1
rc=$?
grep -E '^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z].*\([0-9]+ ms\)$' "$OUT/gpu_tests.log" > "$OUT/gpu_tests.results"
say "GPU tests: exit $rc, $(grep -c '^\[ *OK' "$OUT/gpu_tests.results") ok, $(grep -c FAILED "$OUT/gpu_tests.results") failed, $(grep -c SKIPPED "$OUT/gpu_tests.results") skipped (on a GPU machine: 0 skipped expected)"
tee -a "$SUMMARY" < "$OUT/gpu_tests.results"
# The trainer and distributed suites, unchanged, still pass on a machine that has a GPU (CPU runs).
timeout 600 "$BUILD/tests/deepen_torch_tests" --gtest_filter='Trainer.*' > "$OUT/trainer_tests.log" 2>&1
say "Trainer.* (CPU configs on a GPU machine: run.device = auto now picks cuda): exit $?"

# 3. Data: synthetic text (structured, so losses fall), byte tokenizer, `deepen prep`.
say "## runs (single process, run.device = $DEVICE, bf16 student and teacher)"
python3 - "$WORK/text" "$WORDS" <<'EOF'
import os, random, sys
out, n = sys.argv[1], int(sys.argv[2]); os.makedirs(out, exist_ok=True)
words = "the growth of a student follows teacher norm block layer residual stream attention head".split()
rng = random.Random(1)
for f in range(4):
    with open(f"{out}/part{f}.txt", "w") as fh:
        fh.write("".join(rng.choice(words) + (".\n" if rng.random() < 0.15 else " ") for _ in range(n)))
EOF
cat > "$WORK/base.toml" <<EOF
[run]
seed = 1
threads = 8
device = "$DEVICE"
[data]
tokenizer = "bytes"
sources = ["$WORK/text"]
train = "$WORK/data/train"
valid = "$WORK/data/valid"
seq_len = $SEQ
valid_fraction = 0.02
[curriculum]
mode = "joint"
stage_steps = [$STEPS]
[optim]
lr = 1e-3
warmup_steps = 5
[parallel]
micro_batch = $MB
[eval]
every = 100000
batches = 2
diagnostics_every = 0
[checkpoint]
every = 0
keep = 1
EOF
timeout 300 "$DEEPEN" prep "$WORK/base.toml" --no-progress > "$OUT/prep.log" 2>&1 || fail "prep (see prep.log)"

SHAPE=(--set student.hidden=$HIDDEN --set student.heads=$HEADS --set student.kv_heads=$KV
  --set student.head_dim=$HD --set student.intermediate=$INTER --set student.precision=bf16-pure)
# Teacher-sized model pretrained briefly: the pretrain timing, and the teacher below.
TEACHER_SETS=(--set run.name=teacher --set "run.out_dir=\"$WORK/teacher\"" --set student.layers=$TL "${SHAPE[@]}")
timeout 600 "$DEEPEN" pretrain "$WORK/base.toml" "${TEACHER_SETS[@]}" > "$OUT/pretrain.log" 2>&1 ||
  fail "pretrain (see pretrain.log): $(tail -3 "$OUT/pretrain.log" | tr '\n' ' ')"
grep "computing on" "$OUT/pretrain.log" | tee -a "$SUMMARY"
cp "$WORK/teacher/metrics.jsonl" "$OUT/pretrain_metrics.jsonl"

# The study's student shape distilled from it.
STUDENT_SETS=(--set run.name=student --set "run.out_dir=\"$WORK/student\"" --set student.layers=$SL "${SHAPE[@]}"
  --set "teacher.checkpoint=\"$WORK/teacher/final/hf\"" --set teacher.dtype=bf16)
timeout 600 "$DEEPEN" train "$WORK/base.toml" "${STUDENT_SETS[@]}" > "$OUT/train.log" 2>&1 ||
  fail "train (see train.log): $(tail -3 "$OUT/train.log" | tr '\n' ' ')"
cp "$WORK/student/metrics.jsonl" "$OUT/train_metrics.jsonl"

# 4. Optional: the same distillation as 1 teacher + 1 student rank on this one GPU over MPI (NCCL
# forbids two ranks per GPU; MPI stages through host memory). Its first steps must track the
# single-process run (same global batch and schedule; GPU rounding, so not bit for bit).
if [[ -z "${SKIP_MPI:-}" ]] && command -v mpirun > /dev/null; then
  timeout 300 mpirun --allow-run-as-root --oversubscribe -np 2 "$DEEPEN" train "$WORK/base.toml" "${STUDENT_SETS[@]}" \
    --set run.name=student-mpi --set "run.out_dir=\"$WORK/student-mpi\"" --set parallel.backend=mpi \
    --set run.threads=4 --stop-after 10 > "$OUT/train_mpi.log" 2>&1
  rc=$?
  say "2-rank run (1x1+1, backend mpi, host staging): exit $rc (3 = stopped after 10 steps as asked)"
  [[ -f "$WORK/student-mpi/metrics.jsonl" ]] && cp "$WORK/student-mpi/metrics.jsonl" "$OUT/train_mpi_metrics.jsonl"
fi

# 5. Numbers.
python3 - "$WORK" "$OUT" "$TL x $HIDDEN" "$SL x $HIDDEN" <<'EOF' | tee -a "$SUMMARY"
import json, statistics, struct, sys
work, out, tshape, sshape = sys.argv[1:5]
PEAK = 989e12  # H200 dense bf16

def params(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    total = 0
    for name, info in header.items():
        if name == "__metadata__": continue
        count = 1
        for d in info["shape"]: count *= d
        total += count
    return total

def rate(metrics):
    rows = [json.loads(l) for l in open(metrics)]
    steady = [r["tokens_per_s"] for r in rows[5:]] or [r["tokens_per_s"] for r in rows]
    return statistics.median(steady), rows

n_t = params(f"{work}/teacher/final/student.safetensors")
n_s = params(f"{work}/student/final/student.safetensors")
tps_p, _ = rate(f"{work}/teacher/metrics.jsonl")
tps_t, rows = rate(f"{work}/student/metrics.jsonl")
print(f"pretrain {tshape} bf16: N = {n_t/1e6:.1f} M, {tps_p:,.0f} tokens/s, "
      f"MFU = 6*N*tok/s / 989e12 = {6*n_t*tps_p/PEAK:.1%}")
print(f"train {sshape} student (N_s = {n_s/1e6:.1f} M) from the {tshape} teacher (N_t = {n_t/1e6:.1f} M), bf16: "
      f"{tps_t:,.0f} tokens/s, MFU = (6*N_s + 2*N_t)*tok/s / 989e12 = {(6*n_s+2*n_t)*tps_t/PEAK:.1%} "
      f"(student alone 6*N_s: {6*n_s*tps_t/PEAK:.1%})")
print(f"train loss step 0 -> last: {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}")
try:
    mpi = [json.loads(l) for l in open(f"{out}/train_mpi_metrics.jsonl")]
    worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(rows, mpi))
    tps_m = statistics.median([r["tokens_per_s"] for r in mpi[3:]] or [mpi[-1]["tokens_per_s"]])
    print(f"2-rank MPI-staged run: {len(mpi)} steps, {tps_m:,.0f} tokens/s, "
          f"worst relative loss difference vs single process over those steps: {worst:.2e}")
except FileNotFoundError:
    print("2-rank MPI-staged run: not run")
EOF
say "work folder: $WORK (not cleaned: checkpoints and logs for a closer look)"
