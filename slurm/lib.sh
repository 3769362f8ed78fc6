#!/usr/bin/env bash
# deepen Slurm helpers, sourced by run.sbatch and study_array.sbatch: node list expansion, the
# rank -> node -> role map, the per-job secret, the launch command, signal forwarding and requeue.
#
# Environment read (all optional unless noted):
#   DEEPEN_DRY_RUN=1        print the rank map and the command instead of running anything; works
#                           without Slurm given SLURM_JOB_NODELIST and SLURM_NTASKS
#   DEEPEN_BIN              the deepen executable (default: $DEEPEN_HOME/build/deepen)
#   DEEPEN_CMD              its subcommand (default: train)
#   DEEPEN_LAUNCHER         srun (default) | mpirun
#   DEEPEN_RUN_DIR          run folder (default: run.out_dir of the config, else runs/<config name>)
#   DEEPEN_COORDINATOR_PORT fixed coordinator port (default: none; rank 0 binds a free port and the
#                           trainer broadcasts it over MPI)
#   DEEPEN_MAX_RESTARTS     requeue at most this many times (default 50): a job that cannot make
#                           progress must not cycle forever
#   DEEPEN_TASKS_PER_NODE   tasks per node when Slurm does not say (dry runs)
#   DEEPEN_NODE_PROBE_S     after exit code 6 (a silent rank: a node lost or cut off), how long a
#                           one-task step on each node may take before that node counts as lost
#                           (default 20); lost nodes are named and left out of the requeued job
#   DEEPEN_GPU              1: the job computes on GPUs; 0: it does not; default: 1 when Slurm gave
#                           the job GPUs (SLURM_JOB_GPUS, SLURM_GPUS_ON_NODE, SLURM_GPUS_PER_NODE or
#                           SLURM_GPUS set) on a node with NVIDIA's driver tools (nvidia-smi; a test
#                           cluster's fake GPUs have none). A GPU job passes --set run.device=cuda and
#                           --set parallel.backend=nccl where the config leaves them at "auto", so a
#                           rank without a working GPU or NCCL fails at start instead of training on
#                           the CPU or staging through MPI a hundred times slower.
#   NCCL_DEBUG              NCCL's own diagnostics (default WARN: its warnings and errors only;
#                           INFO says which network interface and transport it chose)
# Environment exported to every rank:
#   DEEPEN_COORDINATOR      first node of the allocation (rank 0 runs there under block distribution),
#                           with ":port" when DEEPEN_COORDINATOR_PORT is set
#   DEEPEN_JOB_SECRET_FILE  $RUN_DIR/control/job_secret, 32 random bytes as hex, mode 0600, new per job
#   DEEPEN_RUN_DIR
# Exit codes (config/input_error.h; docs/cluster.md has the table of faults): 0 done; 3 stopped for
# requeue (the script requeues itself after SIGUSR1); 2 bad input; 4 the divergence guard stopped the
# run; 5 the guard rolled back (requeued: the run resumes with a lower LR); 6 a rank or the
# coordinator went silent: a node lost or cut off the network (requeued; nodes that cannot run a job
# step are named and left out of the rerun); anything else (1) is the job's failure code. With either
# launcher the code is the job's own, from RUN_DIR/control/exit_code, which rank 0 writes when the
# ranks leave (DEEPEN_EXIT_CODE_FILE): in a shared teacher's group the runs leave with codes of their
# own (one finished: 0, one stopped: 3), and the job's code follows the runs (dist/control/policy.h,
# job_exit_code: a failure wins, else 3, else 5, else 4, else 0).

deepen_log() { echo "deepen slurm: $*" >&2; }

# Expands a Slurm host list: "gpu[01-03,07],cpu5" -> gpu01 gpu02 gpu03 gpu07 cpu5 (one per line),
# "r[1-2]-n[1-2]" -> r1-n1 r1-n2 r2-n1 r2-n2. Uses scontrol when present, else does it here (dry
# runs and tests have no Slurm). Zero padding follows the lower bound, as Slurm's does.
deepen_expand_nodelist() {
  local list=$1
  if [[ ${DEEPEN_DRY_RUN:-0} != 1 ]] && command -v scontrol >/dev/null 2>&1; then
    scontrol show hostnames "$list"
    return
  fi
  local item depth=0 c i
  local -a items=()
  item=""
  for ((i = 0; i < ${#list}; i++)); do  # split at commas outside brackets
    c=${list:i:1}
    if [[ $c == "[" ]]; then ((depth++)); elif [[ $c == "]" ]]; then ((depth--)); fi
    if [[ $c == "," && $depth -eq 0 ]]; then items+=("$item"); item=""; else item+=$c; fi
  done
  [[ -n $item ]] && items+=("$item")
  for item in "${items[@]}"; do _deepen_expand_one "$item"; done
}

_deepen_expand_one() {
  local host=$1
  if [[ $host != *"["* ]]; then echo "$host"; return; fi
  local prefix=${host%%\[*} rest=${host#*\[}
  local ranges=${rest%%\]*} suffix=${rest#*\]}
  local range lo hi n width
  local IFS=,
  for range in $ranges; do
    lo=${range%-*}; hi=${range#*-}
    width=${#lo}
    for ((n = 10#$lo; n <= 10#$hi; n++)); do
      IFS=' ' _deepen_expand_one "$(printf "%s%0${width}d%s" "$prefix" "$n" "$suffix")"
    done
  done
}

# Tasks on each node, one count per line, from SLURM_TASKS_PER_NODE ("4(x3),2" -> 4 4 4 2), else
# SLURM_NTASKS_PER_NODE or DEEPEN_TASKS_PER_NODE repeated, else SLURM_NTASKS spread evenly.
deepen_tasks_per_node() {
  local nodes=$1 ntasks=$2 spec part count times i
  spec=${SLURM_TASKS_PER_NODE:-}
  if [[ -n $spec ]]; then
    local IFS=,
    for part in $spec; do
      count=${part%%(*}; times=1
      [[ $part == *"(x"* ]] && { times=${part#*(x}; times=${times%)}; }
      for ((i = 0; i < times; i++)); do echo "$count"; done
    done
    return
  fi
  count=${SLURM_NTASKS_PER_NODE:-${DEEPEN_TASKS_PER_NODE:-$((ntasks / nodes))}}
  for ((i = 0; i < nodes; i++)); do echo "$count"; done
}

# A key of a TOML section from the config, with --set section.key=value overrides applied (the
# last one wins, as in deepen). Handles the flat `key = value` lines deepen's configs use.
deepen_config_value() {
  local config=$1 section=$2 key=$3 default=$4; shift 4
  local value arg next=0
  value=$(awk -v sec="$section" -v key="$key" '
    /^[[:space:]]*\[/ { s = $0; sub(/#.*/, "", s); gsub(/[][[:space:]]/, "", s); insec = (s == sec); next }
    insec {
      line = $0; sub(/#.*/, "", line)
      if (match(line, "^[[:space:]]*" key "[[:space:]]*=")) {
        v = substr(line, RLENGTH + 1); gsub(/^[[:space:]]+|[[:space:]]+$/, "", v); gsub(/"/, "", v)
        print v; exit
      }
    }' "$config" 2>/dev/null)
  for arg in "$@"; do
    if ((next)); then next=0; [[ $arg == "$section.$key="* ]] && value=${arg#*=}; continue; fi
    [[ $arg == --set ]] && { next=1; continue; }
    [[ $arg == "--set=$section.$key="* ]] && value=${arg#--set=*=}
  done
  value=${value#\"}; value=${value%\"}
  echo "${value:-$default}"
}

# The role of a rank in parallel.rank_order's order (dist/rank_layout.h, the same examples):
#   roles:     teachers first, pipeline by pipeline, then students
#              (T=2 P=2 S=4: p0 s0, p0 s1, p1 s0, p1 s1, student 0, 1, 2, 3)
#   pipelines: pipeline by pipeline, its stages then the S/T students it feeds
#              (T=2 P=2 S=4: p0 s0, p0 s1, student 0, 1, p1 s0, p1 s1, student 2, 3)
# deepen_role_of RANK PIPELINES STAGES STUDENTS [ORDER]
# With R runs sharing the teacher (a 6th argument, `deepen group`), every run's students follow one
# another where one run's would sit, run 0's first (T=1 P=2 S=1 R=2: p0 s0, p0 s1, student 0 run 0,
# student 0 run 1).
deepen_role_of() {
  local rank=$1 pipelines=$2 stages=$3 students=$4 order=${5:-roles} runs=${6:-1}
  local per=$((pipelines > 0 ? students / pipelines : students)) s r  # 0 pipelines: a run from a teacher cache
  if [[ $order == pipelines ]]; then
    local group=$((stages + per * runs))
    local t=$((rank / group)) i=$((rank % group))
    if ((i < stages)); then
      echo "teacher p$t s$i"
      return
    fi
    r=$(((i - stages) / per)); s=$((t * per + (i - stages) % per))
  elif ((rank < pipelines * stages)); then
    echo "teacher p$((rank / stages)) s$((rank % stages))"
    return
  else
    r=$(((rank - pipelines * stages) / students)); s=$(((rank - pipelines * stages) % students))
  fi
  if ((runs > 1)); then echo "student $s run $r"; else echo "student $s"; fi
}

# True when the job computes on GPUs: DEEPEN_GPU if set, else whether Slurm allocated GPUs on a
# node with NVIDIA's driver installed. The binary's presence, not its success: a GPU node whose
# driver is broken still counts, so that its ranks fail at start rather than run on the CPU.
deepen_gpu_job() {
  case ${DEEPEN_GPU:-} in
    1) return 0 ;;
    0) return 1 ;;
  esac
  [[ -n ${SLURM_JOB_GPUS:-}${SLURM_GPUS_ON_NODE:-}${SLURM_GPUS_PER_NODE:-}${SLURM_GPUS:-} ]] &&
    command -v nvidia-smi > /dev/null 2>&1
}

# The --set arguments a GPU job adds (one per line): run.device = cuda and parallel.backend = nccl
# where the config and the command line leave them at "auto"; explicit choices are kept (a config
# may want MPI staging to share GPUs), but a CPU device on a GPU job is worth a warning.
deepen_gpu_settings() {
  local config=$1; shift
  local device backend
  device=$(deepen_config_value "$config" run device auto "$@")
  backend=$(deepen_config_value "$config" parallel backend auto "$@")
  [[ $device == auto ]] && printf '%s\n' --set run.device=cuda
  [[ $device == cpu ]] && deepen_log "warning: GPU job, but $config asks for run.device = \"cpu\""
  [[ $backend == auto ]] && printf '%s\n' --set parallel.backend=nccl
  return 0
}

# Writes 32 random bytes as hex to $1 with mode 0600 (umask in a subshell: never readable by others).
deepen_make_secret() {
  local file=$1
  mkdir -p "$(dirname "$file")"
  (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$file.tmp" && echo >> "$file.tmp" &&
    mv -f "$file.tmp" "$file")
}

# One part of a study's teacher cache, a line "cache CONFIG [--set ...] --out DIR --part I/N" of its
# list (`deepen study --slurm` with study.teacher = "cache"): `deepen cache` in this one task, on its
# GPU when it has one (run.device = "auto"); the part that completes the set writes the manifest.
deepen_run_cache() {
  local bin=${DEEPEN_BIN:-$DEEPEN_HOME/build/deepen}
  deepen_log "teacher cache: $bin cache $*"
  if [[ ${DEEPEN_DRY_RUN:-0} == 1 ]]; then deepen_log "dry run (DEEPEN_DRY_RUN=1): nothing started"; return 0; fi
  if [[ ! -x $bin ]]; then deepen_log "$bin: not an executable (set DEEPEN_BIN or build first)"; return 2; fi
  "$bin" cache "$@"
}

# Runs one deepen job step on the whole allocation: deepen_run_job CONFIG [deepen arguments...], or
# deepen_run_job group GROUP_FILE [deepen group arguments...] for runs sharing one teacher (the
# layout, run count and job folder then come from `deepen group FILE --print-job`).
deepen_run_job() {
  local config=$1; shift
  local dry=${DEEPEN_DRY_RUN:-0}
  local bin=${DEEPEN_BIN:-$DEEPEN_HOME/build/deepen}
  local group=""
  if [[ $config == group ]]; then
    group=${1:-}; shift
    if [[ -z $group || ! -f $group ]]; then deepen_log "group ${group:-(none)}: no such group file"; return 2; fi
  else
    if [[ -z $config ]]; then deepen_log "usage: sbatch $0 CONFIG.toml [--set section.key=value ...]"; return 2; fi
    if [[ ! -f $config ]]; then deepen_log "$config: no such config file"; return 2; fi
  fi
  if [[ -z ${SLURM_JOB_NODELIST:-} || -z ${SLURM_NTASKS:-} ]]; then
    deepen_log "SLURM_JOB_NODELIST and SLURM_NTASKS are not set: submit with sbatch, or set them for a dry run"
    return 2
  fi

  local -a nodes counts
  mapfile -t nodes < <(deepen_expand_nodelist "$SLURM_JOB_NODELIST")
  if ((${#nodes[@]} == 0)); then deepen_log "cannot expand SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST"; return 2; fi
  mapfile -t counts < <(deepen_tasks_per_node "${#nodes[@]}" "$SLURM_NTASKS")
  local ntasks=$SLURM_NTASKS
  local pipelines stages students order runs=1 run_dir=${DEEPEN_RUN_DIR:-} device backend
  if [[ -n $group ]]; then
    local info
    if ! info=$("$bin" group "$group" --print-job "$@"); then deepen_log "$group: deepen group --print-job failed"; return 2; fi
    read -r pipelines stages students runs order run_dir device backend <<< "$info"
    config=$group
  else
    pipelines=$(deepen_config_value "$config" parallel teacher_pipelines 1 "$@")
    stages=$(deepen_config_value "$config" parallel teacher_stages 1 "$@")
    students=$(deepen_config_value "$config" parallel students 1 "$@")
    order=$(deepen_config_value "$config" parallel rank_order roles "$@")
    # A run from a teacher cache (distill.source = "cache") has no teacher ranks: world = students.
    if [[ $(deepen_config_value "$config" distill source teacher "$@") == cache ]]; then
      pipelines=0 stages=0 order=roles
    fi
  fi
  if [[ $order != roles && $order != pipelines ]]; then
    deepen_log "$config: parallel.rank_order: must be \"roles\" | \"pipelines\", got \"$order\""
    return 2
  fi
  if ! (((pipelines >= 1 && stages >= 1 || pipelines + stages == 0) && students >= 1)); then
    deepen_log "$config: parallel.teacher_pipelines, teacher_stages and students must be >= 1, got $pipelines, $stages, $students"
    return 2
  fi
  local teacher_ranks=$((pipelines * stages))
  if ((teacher_ranks + runs * students != ntasks)); then
    if ((runs > 1)); then
      deepen_log "$config: teacher_pipelines * teacher_stages + runs * students = $pipelines * $stages + $runs * $students = $((teacher_ranks + runs * students)) ranks, but the allocation has $ntasks tasks (SLURM_NTASKS)"
    else
      deepen_log "$config: parallel.teacher_pipelines * teacher_stages + students = $pipelines * $stages + $students = $((teacher_ranks + students)) ranks, but the allocation has $ntasks tasks (SLURM_NTASKS)"
    fi
    return 2
  fi

  if [[ -z $run_dir ]]; then
    run_dir=$(deepen_config_value "$config" run out_dir "" "$@")
    [[ -z $run_dir ]] && run_dir="runs/$(basename "$config" .toml)"
  fi
  local coordinator=${nodes[0]}
  [[ -n ${DEEPEN_COORDINATOR_PORT:-} ]] && coordinator+=":$DEEPEN_COORDINATOR_PORT"
  local secret_file=$run_dir/control/job_secret
  # The job's exit code as the coordinator saw every rank leave (launch/job_control.h): the
  # launcher's own status does not carry it (mpirun's is its first non-zero rank's, 1 after a
  # signal; a group's runs leave with codes of their own).
  local exit_file=$run_dir/control/exit_code
  local sub=${DEEPEN_CMD:-train}
  local -a gpu_sets=()
  if deepen_gpu_job; then
    if [[ -n $group ]]; then
      # Run 0's settings stand for every run: runs sharing a teacher share run.device and the backend.
      [[ $device == auto ]] && gpu_sets+=(--set run.device=cuda)
      [[ $device == cpu ]] && deepen_log "warning: GPU job, but $group's runs ask for run.device = \"cpu\""
      [[ $backend == auto ]] && gpu_sets+=(--set parallel.backend=nccl)
    else
      mapfile -t gpu_sets < <(deepen_gpu_settings "$config" "$@")
    fi
    deepen_log "GPU job: each rank computes on its own GPU over NCCL (${gpu_sets[*]:-as the config says}); DEEPEN_GPU=0 turns this off"
  fi
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

  deepen_log "job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}): $ntasks ranks on ${#nodes[@]} nodes (${nodes[*]})"
  deepen_log "run dir $run_dir; coordinator $coordinator; job secret $secret_file (mode 0600)"
  # The rank map: block distribution puts ranks 0..c0-1 on the first node, and so on.
  local rank=0 n i role first_role warned
  local -a node_of_rank=()
  for ((n = 0; n < ${#nodes[@]}; n++)); do
    first_role=""; warned=0
    for ((i = 0; i < ${counts[n]:-0}; i++, rank++)); do
      role=$(deepen_role_of "$rank" "$pipelines" "$stages" "$students" "$order" "$runs")
      echo "rank $rank -> ${nodes[n]} ($role)"
      node_of_rank[rank]=${nodes[n]}
      [[ -z $first_role ]] && first_role=${role%% *}
      # Roles order: a node should hold one role (one node cannot keep them apart: no warning then).
      # The pipelines order mixes them on purpose; its check follows below.
      if [[ $order == roles && ${role%% *} != "$first_role" ]] && ((!warned && ${#nodes[@]} > 1)); then
        deepen_log "warning: node ${nodes[n]} holds both teacher and student ranks; make teacher ranks ($teacher_ranks) a multiple of the tasks per node, or set parallel.rank_order = \"pipelines\" with tasks per node a multiple of $((stages + students / pipelines)) (teacher_stages + students per pipeline)"
        warned=1
      fi
    done
  done
  if ((rank != ntasks)); then
    deepen_log "tasks per node (${counts[*]}) add up to $rank, not SLURM_NTASKS = $ntasks"
    return 2
  fi
  # Pipelines order: each pipeline's students belong on the node of its last stage (the logits
  # then stay inside the node), as dist/rank_layout.h's check_placement warns too.
  if [[ $order == pipelines ]] && ((${#nodes[@]} > 1)); then
    local per=$((runs * (students / pipelines))) t last away s
    for ((t = 0; t < pipelines; t++)); do
      last=$((t * (stages + per) + stages - 1)); away=""
      for ((s = 1; s <= per; s++)); do
        [[ ${node_of_rank[last + s]} != "${node_of_rank[last]}" ]] && away+=" $((last + s))"
      done
      if [[ -n $away ]]; then
        deepen_log "warning: pipeline $t's students (ranks${away}) are not on ${node_of_rank[last]} with its last stage (rank $last): their logits cross the network; make the tasks per node a multiple of $((stages + per)) (teacher_stages + students per pipeline)"
      fi
    done
  fi

  local -a cmd
  if [[ ${DEEPEN_LAUNCHER:-srun} == mpirun ]]; then
    # Open MPI's mpirun reads the allocation from Slurm. Its default ends the job at a rank's first
    # non-zero exit: every rank has checkpointed and left the control plane by then (they exit
    # together after a final barrier, once rank 0 has written the job's exit code), and a rank killed
    # by a signal must end the job (with orte_abort_on_non_zero_status 0 mpirun waited forever after
    # one). Each rank is bound to its --cpus-per-task cores (PE=): a plain --bind-to core would pin
    # all of a rank's threads to one core. overload-allowed: a node may declare more CPUs than it
    # has cores (then ranks share).
    cmd=(mpirun -np "$ntasks" --map-by "ppr:${counts[0]}:node:PE=${SLURM_CPUS_PER_TASK:-1}"
         --bind-to core:overload-allowed
         -x DEEPEN_COORDINATOR -x DEEPEN_JOB_SECRET_FILE -x DEEPEN_RUN_DIR -x DEEPEN_EXIT_CODE_FILE -x PATH -x LD_LIBRARY_PATH
         -x NCCL_DEBUG)
  else
    # No --kill-on-bad-exit: exit code 3 is a clean requeue stop, and a rank that finishes its
    # checkpoint first must not get the others killed. Real failures are the watchdog's job.
    cmd=(srun --mpi=pmix --kill-on-bad-exit=0 --distribution=block:block --cpu-bind=cores --export=ALL)
  fi
  if [[ -n $group ]]; then
    cmd+=("$bin" group "$group" "${gpu_sets[@]}" "$@")  # each run's folder is in its own config
  else
    cmd+=("$bin" "$sub" "$config" --set "run.out_dir=$run_dir" "${gpu_sets[@]}" "$@")
  fi
  echo "env: DEEPEN_COORDINATOR=$coordinator DEEPEN_JOB_SECRET_FILE=$secret_file DEEPEN_RUN_DIR=$run_dir"
  # NCCL's settings as the ranks get them (NCCL_SOCKET_IFNAME decides the network NCCL tries first).
  echo "nccl env: $(env | grep '^NCCL_' | sort | paste -sd ' ')"
  echo "command: ${cmd[*]}"

  if [[ $dry == 1 ]]; then
    deepen_log "dry run (DEEPEN_DRY_RUN=1): nothing started, no secret written"
    return 0
  fi
  if [[ ! -x $bin ]]; then deepen_log "$bin: not an executable (set DEEPEN_BIN or build first)"; return 2; fi
  mkdir -p "$run_dir"
  deepen_make_secret "$secret_file"
  rm -f "$exit_file"
  export DEEPEN_COORDINATOR=$coordinator DEEPEN_JOB_SECRET_FILE=$secret_file DEEPEN_RUN_DIR=$run_dir
  export DEEPEN_EXIT_CODE_FILE=$exit_file

  # Slurm's --signal=B:USR1@120 reaches only this shell: forward it (and SIGTERM) to the launcher,
  # which forwards to every rank; the ranks agree on a stop step, checkpoint and exit 3. mpirun
  # answers a SIGTERM by killing the ranks about 2 s later (mid-checkpoint at scale), so it gets
  # SIGUSR1 for both: to deepen's ranks the two mean the same coordinated stop.
  local term_as=TERM
  [[ ${DEEPEN_LAUNCHER:-srun} == mpirun ]] && term_as=USR1
  DEEPEN_GOT_SIGNAL=""
  "${cmd[@]}" &
  local child=$!
  trap 'DEEPEN_GOT_SIGNAL=USR1; deepen_log "SIGUSR1: asking the ranks for a coordinated stop"; kill -USR1 '"$child"' 2>/dev/null' USR1
  trap 'DEEPEN_GOT_SIGNAL=TERM; deepen_log "SIGTERM: asking the ranks for a coordinated stop"; kill -'"$term_as"' '"$child"' 2>/dev/null' TERM
  local rc
  while :; do
    wait "$child"; rc=$?
    kill -0 "$child" 2>/dev/null || break  # else a trapped signal interrupted wait: wait again
  done
  wait "$child" 2>/dev/null; rc=$?  # the launcher's own status (the loop's may be 128 + signal)
  trap - USR1 TERM
  # The ranks' own code, when rank 0 saw them all leave, says more than the launcher's status.
  if [[ -s $exit_file ]]; then
    local job_rc
    job_rc=$(<"$exit_file")
    if [[ $job_rc =~ ^[0-9]+$ ]] && ((job_rc != rc)); then
      deepen_log "the launcher returned $rc; the ranks left with exit code $job_rc (the coordinator's record, $exit_file)"
      rc=$job_rc
    fi
  fi

  if ((rc == 5)); then
    # The divergence guard rolled back (guard.action = "rollback"): the next start resumes from the
    # last good checkpoint with a lowered LR (guard.jsonl); the guard itself bounds how often.
    if ((${SLURM_RESTART_COUNT:-0} >= ${DEEPEN_MAX_RESTARTS:-50})); then
      deepen_log "the divergence guard rolled back; ${SLURM_RESTART_COUNT:-0} restarts already (DEEPEN_MAX_RESTARTS), not requeueing"
    else
      deepen_log "the divergence guard rolled back; requeueing job ${SLURM_JOB_ID} (it resumes from the last good checkpoint in $run_dir with a lower LR)"
      scontrol requeue "$SLURM_JOB_ID"
    fi
  elif ((rc == 3)); then
    local restarts=${SLURM_RESTART_COUNT:-0}
    if [[ $DEEPEN_GOT_SIGNAL == TERM ]]; then
      # scancel or preemption: cancelled jobs stay cancelled, preempted ones Slurm requeues itself.
      deepen_log "stopped at a checkpoint after SIGTERM; not requeueing (Slurm decides)"
    elif ((restarts >= ${DEEPEN_MAX_RESTARTS:-50})); then
      deepen_log "stopped at a checkpoint; $restarts restarts already (DEEPEN_MAX_RESTARTS), not requeueing"
    else
      deepen_log "stopped at a checkpoint; requeueing job ${SLURM_JOB_ID} (it resumes from $run_dir)"
      scontrol requeue "$SLURM_JOB_ID"
    fi
  elif ((rc == 4)); then
    # The divergence guard stopped a run (a group: that run left, and every other finished): the same
    # start would diverge the same way. guard.jsonl in its folder says where; lower its LR to retry.
    deepen_log "the divergence guard stopped a run (its guard.jsonl says where; lower its LR to retry); not requeueing"
  elif ((rc == 6)) && [[ $DEEPEN_GOT_SIGNAL == TERM ]]; then
    # Slurm itself is ending the job: it found a node not responding (NODE_FAIL, which it requeues
    # itself), or it was cancelled. Probing now would find every node gone with the allocation.
    deepen_log "a rank went silent (exit code 6) and Slurm is ending the job (SIGTERM: a node failure it noticed, or scancel); not requeueing (Slurm decides)"
  elif ((rc == 6)); then
    # A rank or the coordinator went silent (launch: kExitUnreachable): a node lost or cut off. Which
    # nodes of the allocation cannot run a job step now, named and left out of the rerun.
    local lost
    lost=$(deepen_unreachable_nodes "${nodes[@]}" | paste -sd, -)
    if [[ -n $lost && $lost == $(deepen_unreachable_nodes_all "${nodes[@]}") ]]; then
      deepen_log "no node of this job can run a job step (the allocation is ending?); requeueing without excluding any"
      lost=""
    elif [[ -n $lost ]]; then
      deepen_log "node(s) $lost of this job cannot run a job step (lost, or cut off the network)"
    else
      deepen_log "every node of this job runs a job step again (a link came back?)"
    fi
    if ((${SLURM_RESTART_COUNT:-0} >= ${DEEPEN_MAX_RESTARTS:-50})); then
      deepen_log "a rank went silent; ${SLURM_RESTART_COUNT:-0} restarts already (DEEPEN_MAX_RESTARTS), not requeueing"
    else
      # Excluded while the job waits, so the rerun lands on the nodes left (or waits for others).
      [[ -n $lost ]] && scontrol update jobid="$SLURM_JOB_ID" ExcNodeList="$lost" 2>/dev/null
      deepen_log "a rank went silent (exit code 6); requeueing job ${SLURM_JOB_ID}${lost:+ without $lost} (it resumes from $run_dir)"
      scontrol requeue "$SLURM_JOB_ID"
    fi
  elif ((rc != 0)); then
    deepen_log "ranks failed with exit code $rc (see the abort message above); not requeueing"
  fi
  return "$rc"
}

# The nodes (arguments) as deepen_unreachable_nodes lists them when none answers: all of them.
deepen_unreachable_nodes_all() { printf '%s\n' "$@" | sort | paste -sd, -; }

# The nodes (arguments) that cannot run a one-task job step within DEEPEN_NODE_PROBE_S seconds
# (default 20), one per line: a node whose slurmd is gone or that the network no longer reaches.
deepen_unreachable_nodes() {
  local n
  for n in "$@"; do
    (timeout "${DEEPEN_NODE_PROBE_S:-20}" srun --overlap --nodes=1 --ntasks=1 --nodelist="$n" --time=1 true \
       > /dev/null 2>&1 || echo "$n") &
  done | sort
  wait
}

# Finds the checkout: DEEPEN_HOME, else this file's folder's parent, else the submit folder (sbatch
# runs a copy of the script from its spool, so $0 says nothing about where deepen is).
deepen_find_home() {
  local d
  for d in "${DEEPEN_HOME:-}" "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." 2>/dev/null && pwd)" "${SLURM_SUBMIT_DIR:-}"; do
    if [[ -n $d && -f $d/slurm/lib.sh ]]; then echo "$d"; return 0; fi
  done
  return 1
}
