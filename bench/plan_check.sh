#!/usr/bin/env bash
# Checks `deepen plan`'s cost model against measured CPU runs: one single-process calibration run
# (teacher forward + student step per token, 1 thread), then the same run on several layouts under
# mpirun; prints predicted vs measured tokens/s per layout and depth, and the error (goal <= 20%).
# Needs a quiet machine: other load shows up as model error.
#   bench/plan_check.sh                       # DEEPEN=build/deepen WORK=/tmp/deepen-plan-check STEPS=40
set -euo pipefail
cd "$(dirname "$0")/.."
DEEPEN=${DEEPEN:-build/deepen}
WORK=${WORK:-/tmp/deepen-plan-check}
STEPS=${STEPS:-40}
LAYOUTS=${LAYOUTS:-"1,1,1 1,2,1 1,1,2 1,2,2 2,1,2"}
export OMPI_MCA_rmaps_base_oversubscribe=1
if [[ $(id -u) == 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# Data and the demo teacher: the reduced demo's (reused when already there).
"$DEEPEN" demo --small --out "$WORK/demo" > "$WORK.demo.log" 2>&1 || { cat "$WORK.demo.log"; exit 1; }
common=(--set "data.train=\"$WORK/demo/data/train\"" --set "data.valid=\"$WORK/demo/data/valid\""
        --set "teacher.checkpoint=\"$WORK/demo/teacher/final/hf\"" --set run.threads=1
        --set curriculum.mode=joint --set 'curriculum.stages=[3]' --set "curriculum.stage_steps=[$STEPS]"
        --set eval.every=100000 --set eval.batches=1 --set eval.diagnostics_every=0 --set checkpoint.every=0)

echo "calibration: one process, 1 thread, $STEPS steps"
"$DEEPEN" train configs/demo/base.toml "${common[@]}" --set "run.out_dir=\"$WORK/cal\"" \
  --set parallel.teacher_stages=1 --set parallel.students=1 --fresh --quiet > "$WORK.cal.log" 2>&1
runs=()
for layout in $LAYOUTS; do
  IFS=, read -r T P S <<< "$layout"
  n=$((T * P + S))
  dir="$WORK/layout-${T}x${P}+${S}"
  echo "layout ${T}x${P}+${S}: mpirun -np $n, $STEPS steps"
  mpirun -np "$n" "$DEEPEN" train configs/demo/base.toml "${common[@]}" --set "run.out_dir=\"$dir\"" \
    --set "parallel.teacher_pipelines=$T" --set "parallel.teacher_stages=$P" --set "parallel.students=$S" \
    --fresh --quiet > "$dir.log" 2>&1 || { tail -20 "$dir.log"; exit 1; }
  runs+=("$dir")
done
"$DEEPEN" plan configs/demo/base.toml "${common[@]}" --calibrate "$WORK/cal" --cores "$(nproc)" --threads 1 \
  --check "$WORK/cal" "${runs[@]}"
