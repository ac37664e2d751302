# shellcheck shell=bash disable=SC2034  # SWEEP_SHIFT and friends are read by the sweep scripts
# Shared sweep machinery, sourced by benchmark/ppo_atari.sh, ppo_continuous.sh and dqn_snake.sh.
#
# A sweep script builds its list of runs with `sweep_add LABEL RUN_ID SCRIPT ARG...` and then calls `sweep_run`.
#
# Local mode (the default): each run gets a unique session index (0, 1, 2, ... in the order added) that is passed to
# the script as `--session`; the script's gpu_utils.select_device puts it on GPU (CUDA_OFFSET + session) % n_gpus.
# This file computes the same number so that --dry-run can print where each run lands, and it keeps at most
# JOBS_PER_GPU runs on each GPU at once (one queue per GPU). Without GPUs, JOBS runs go at a time.
#
# Thread budget (local mode): the sweep may use P CPUs (its own affinity); C runs go at once (JOBS, or
# JOBS_PER_GPU x GPUs). Each run gets k = max(1, P / C) CPUs (or --cpus-per-run): the run in slot s (a slot is
# freed when its run ends) gets the k CPUs at positions s*k .. s*k+k-1 of the sweep's CPU list, wrapping around when
# C x k > P (then runs share cores). It runs with OMP_NUM_THREADS=k MKL_NUM_THREADS=k, pinned with `taskset -c` where
# taskset works. Each run's log starts with the exact command, variables and pinning included.
#
# SLURM mode (--slurm): one sbatch script for the whole sweep, a job array with one task per run; task i runs the
# same command as session i (without --session: SLURM gives each task its own GPUs and the script uses the first it
# sees), with OMP_NUM_THREADS from the CPUs SLURM gave the task (--cpus-per-run). See sweep_slurm below.
#
# --resume-existing: a run whose newest run dir (runs/<RUN_ID>__<time>) holds a finished checkpoint is skipped,
# one with a running/stopped checkpoint is continued with --resume, and any other starts fresh
# (benchmark/slurm/checkpoint_status.py decides; under SLURM each task decides when it starts).
#
# Environment variables (all optional):
#   NUM_GPUS       number of GPUs to spread over (default: CUDA_VISIBLE_DEVICES entries, else `nvidia-smi -L`)
#   CUDA_OFFSET    first GPU used by session 0 (default 0)
#   JOBS_PER_GPU   runs sharing one GPU at the same time (default 1)
#   JOBS           runs at the same time on a machine without GPUs (default 1)
#   CPUS_PER_RUN   CPUs (and OMP/MKL threads) per run (default: the sweep's CPUs / runs at once)
#   SWEEP_CPUS     CPU list the sweep may use, e.g. 0-7 or 0,2,4 (default: its own affinity)
#   SEEDS          seeds to run (default "1 2 3")
#   PYTHON         interpreter (default: .venv/bin/python in the repo if present, else python)
#   LOG_DIR        where per-run logs and the summary go (default runs/sweep_logs/<sweep>_<date>)
#   WANDB_PROJECT_NAME / WANDB_ENTITY   passed with --track as --wandb-project-name / --wandb-entity

set -u
set -o pipefail

SWEEP_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

SWEEP_DRY_RUN=0
SWEEP_TRACK=0
SWEEP_SLURM=0
SWEEP_RESUME=0
SWEEP_SHIFT=1
SWEEP_PASSTHROUGH=() # arguments after --, set by the sweep script
SWEEP_SBATCH_ARGS=() # arguments after --sbatch-args, given to sbatch unchanged
SWEEP_LABELS=()
SWEEP_IDS=()
SWEEP_CMDS=()
SWEEP_DEVICES=()
SWEEP_LOCAL_OPTS=() # local-only options given on the command line (an error with --slurm)
SWEEP_SLURM_OPTS=() # SLURM-only options given on the command line (an error without --slurm)
SWEEP_PARTITION=""
SWEEP_TIME=""
SWEEP_GPUS_PER_RUN=""
SWEEP_MEM=""
SWEEP_MAX_PARALLEL=""
SWEEP_ACCOUNT=""
SEEDS="${SEEDS:-1 2 3}"
JOBS_PER_GPU="${JOBS_PER_GPU:-1}"
JOBS="${JOBS:-1}"
CPUS_PER_RUN="${CPUS_PER_RUN:-}"
SWEEP_CPUS="${SWEEP_CPUS:-}"

sweep_die() {
  echo "error: $*" >&2
  exit 2
}

sweep_note() { echo "[sweep] note: $*" >&2; }

sweep_common_help() {
  cat <<'EOF'
Common options:
  --dry-run            print every command with its device, CPUs and threads (with --slurm: the sbatch script);
                       run nothing
  --track              pass --track to every run (wandb; WANDB_PROJECT_NAME / WANDB_ENTITY are passed on too)
  --seeds "1 2 3"      seeds (env SEEDS)
  --resume-existing    skip runs whose newest run dir has a finished checkpoint, continue (--resume) runs with a
                       running/stopped one, start the others; locally and under --slurm (each task decides at start)
  --cpus-per-run N     CPUs and OMP/MKL threads per run (env CPUS_PER_RUN; default: the sweep's CPUs / runs at once;
                       under --slurm: sbatch --cpus-per-task)
  --log-dir DIR        per-run logs and summary (env LOG_DIR)
  -- ARGS...           everything after -- is passed to every run unchanged
Local runs:
  --jobs-per-gpu N     runs sharing one GPU at once (env JOBS_PER_GPU, default 1)
  --jobs N             runs at once on a machine without GPUs (env JOBS, default 1)
  --cpus LIST          CPUs the sweep may use, e.g. 0-15 (env SWEEP_CPUS; default: all it may use)
SLURM (--slurm: submit the sweep as one job array, one task per run; needs sbatch):
  --slurm              write one sbatch script for the sweep and submit it (with --dry-run: print it)
  --partition P        sbatch --partition
  --time T             sbatch --time (per run), e.g. 24:00:00
  --gpus-per-run N     sbatch --gres=gpu:N (a run uses the first GPU it sees; more only for torchrun)
  --mem M              sbatch --mem (per run), e.g. 32G
  --max-parallel N     at most N runs at once (the array's %N throttle)
  --account A          sbatch --account
  --sbatch-args ARG... every word after it, up to --, goes to sbatch unchanged (put it last), e.g. --qos=high
Environment: NUM_GPUS (override GPU count), CUDA_OFFSET (first GPU), PYTHON (interpreter).
EOF
}

# Parse one common option at "$1". Sets SWEEP_SHIFT to the number of words used.
sweep_parse_common() {
  SWEEP_SHIFT=1
  case "$1" in
    --)
      shift
      SWEEP_PASSTHROUGH=("$@") # everything after -- goes to the training script unchanged
      SWEEP_SHIFT=$(($# + 1))
      ;;
    --dry-run) SWEEP_DRY_RUN=1 ;;
    --track) SWEEP_TRACK=1 ;;
    --slurm) SWEEP_SLURM=1 ;;
    --resume-existing) SWEEP_RESUME=1 ;;
    --sbatch-args)
      shift
      local n=0
      while (($#)) && [[ "$1" != -- ]]; do
        SWEEP_SBATCH_ARGS+=("$1")
        shift
        n=$((n + 1))
      done
      ((n)) || sweep_die "--sbatch-args needs sbatch options after it (e.g. --sbatch-args --qos=high), last before --"
      SWEEP_SLURM_OPTS+=(--sbatch-args)
      SWEEP_SHIFT=$((n + 1))
      ;;
    --seeds | --jobs-per-gpu | --jobs | --log-dir | --cpus-per-run | --cpus | --partition | --time | --gpus-per-run | \
      --mem | --max-parallel | --account)
      [[ $# -ge 2 ]] || sweep_die "$1 needs a value"
      [[ "$2" != --* || "$1" == --seeds ]] || sweep_die "$1 needs a value, got the option '$2'"
      case "$1" in
        --seeds) SEEDS="$2" ;;
        --jobs-per-gpu) JOBS_PER_GPU="$2" ;;
        --jobs) JOBS="$2" ;;
        --log-dir) LOG_DIR="$2" ;;
        --cpus-per-run) CPUS_PER_RUN="$2" ;;
        --cpus) SWEEP_CPUS="$2" ;;
        --partition) SWEEP_PARTITION="$2" ;;
        --time) SWEEP_TIME="$2" ;;
        --gpus-per-run) SWEEP_GPUS_PER_RUN="$2" ;;
        --mem) SWEEP_MEM="$2" ;;
        --max-parallel) SWEEP_MAX_PARALLEL="$2" ;;
        --account) SWEEP_ACCOUNT="$2" ;;
      esac
      case "$1" in
        --jobs-per-gpu | --jobs | --cpus) SWEEP_LOCAL_OPTS+=("$1") ;;
        --partition | --time | --gpus-per-run | --mem | --max-parallel | --account) SWEEP_SLURM_OPTS+=("$1") ;;
      esac
      SWEEP_SHIFT=2
      ;;
    *) sweep_die "unknown option '$1' (see --help; arguments for the training script go after --)" ;;
  esac
}

sweep_is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

# Print the number of GPUs the training scripts will see.
sweep_detect_gpus() {
  if [[ -n "${NUM_GPUS:-}" ]]; then
    echo "$NUM_GPUS"
    return
  fi
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    if [[ -z "$CUDA_VISIBLE_DEVICES" || "$CUDA_VISIBLE_DEVICES" == -* ]]; then
      echo 0
    else
      local -a ids
      IFS=, read -r -a ids <<<"$CUDA_VISIBLE_DEVICES"
      echo "${#ids[@]}"
    fi
    return
  fi
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
  else
    echo 0
  fi
}

# Expand a CPU list such as "0-3,8,10-14:2" into "0 1 2 3 8 10 12 14"; return 1 when it is not one.
sweep_expand_cpus() {
  local part lo hi step c out=()
  local -a parts
  IFS=, read -r -a parts <<<"$1"
  ((${#parts[@]})) || return 1
  for part in "${parts[@]}"; do
    if [[ "$part" =~ ^([0-9]+)$ ]]; then
      out+=("$part")
    elif [[ "$part" =~ ^([0-9]+)-([0-9]+)(:([0-9]+))?$ ]]; then
      lo=$((10#${BASH_REMATCH[1]}))
      hi=$((10#${BASH_REMATCH[2]}))
      step=$((10#${BASH_REMATCH[4]:-1}))
      ((lo <= hi && step > 0)) || return 1
      for ((c = lo; c <= hi; c += step)); do out+=("$c"); done
    else
      return 1
    fi
  done
  echo "${out[*]}"
}

# Compress "0 1 2 3 8 10 11" into the taskset list "0-3,8,10-11".
sweep_cpu_ranges() {
  local ranges="" start="" prev="" c
  for c in "$@" ""; do # the empty word closes the last range
    if [[ -n "$c" && -n "$prev" && "$c" -eq $((prev + 1)) ]]; then
      prev=$c
      continue
    fi
    if [[ -n "$start" ]]; then
      ranges+="${ranges:+,}$start"
      [[ "$prev" != "$start" ]] && ranges+="-$prev"
    fi
    start=$c
    prev=$c
  done
  echo "$ranges"
}

# The CPUs this shell may run on, space-separated (its affinity on Linux, else 0 .. ncpu-1).
sweep_allowed_cpus() {
  local list=""
  if [[ -r /proc/self/status ]]; then
    list="$(awk '/^Cpus_allowed_list:/ { print $2 }' /proc/self/status 2>/dev/null)"
  fi
  if [[ -z "$list" ]] && command -v taskset >/dev/null 2>&1; then
    list="$(taskset -cp $$ 2>/dev/null | sed 's/.*: *//')"
  fi
  if [[ -n "$list" ]] && sweep_expand_cpus "$list"; then
    return
  fi
  local n
  n="$(getconf _NPROCESSORS_ONLN 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 1)"
  sweep_is_uint "$n" && ((n > 0)) || n=1
  seq -s ' ' 0 $((n - 1))
}

# True when the pass-through arguments contain the given flag (as "--flag value" or "--flag=value").
sweep_passthrough_has() {
  local a
  for a in ${SWEEP_PASSTHROUGH[@]+"${SWEEP_PASSTHROUGH[@]}"}; do
    [[ "$a" == "$1" || "$a" == "$1="* ]] && return 0
  done
  return 1
}

# Value that the pass-through arguments give to a flag (empty if absent; the last one when given twice).
sweep_passthrough_value() {
  local prev="" a value=""
  for a in ${SWEEP_PASSTHROUGH[@]+"${SWEEP_PASSTHROUGH[@]}"}; do
    if [[ "$prev" == "$1" ]]; then
      value="$a"
    elif [[ "$a" == "$1="* ]]; then
      value="${a#*=}"
    fi
    prev="$a"
  done
  echo "$value"
}

# Refuse pass-through flags that would make the runs of a sweep the same run (each names the sweep option to use).
sweep_passthrough_forbid() {
  sweep_passthrough_has --seed && sweep_die "--seed after -- would give every run the same seed; use --seeds \"1 2 3\""
  sweep_passthrough_has --resume &&
    sweep_die "--resume after -- would make every run continue one checkpoint; use --resume-existing"
  return 0
}

sweep_default_python() {
  if [[ -n "${PYTHON:-}" ]]; then
    echo "$PYTHON"
  elif [[ -x "$SWEEP_REPO_ROOT/.venv/bin/python" ]]; then
    echo ".venv/bin/python"
  else
    echo "python"
  fi
}

# sweep_add LABEL RUN_ID SCRIPT ARG...  RUN_ID is <env_tag>__<exp_name>__<seed>, the start of the run's directory
# name under runs/ (used by --resume-existing). The python interpreter, --session, --cuda-offset, --track and the
# pass-through arguments are added by sweep_run.
sweep_add() {
  local label="$1" run_id="$2"
  shift 2
  local cmd
  printf -v cmd '%q ' "$@"
  SWEEP_LABELS+=("$label")
  SWEEP_IDS+=("$run_id")
  SWEEP_CMDS+=("${cmd% }")
}

# The CPUs of slot $1 when every run gets $2 CPUs from the sweep's list SWEEP_CPU_LIST (wrapping around).
_sweep_slot_cpus() {
  local s="$1" k="$2" p=${#SWEEP_CPU_LIST[@]} j
  local -a mine=()
  if ((k >= p)); then
    mine=("${SWEEP_CPU_LIST[@]}")
  else
    for ((j = 0; j < k; j++)); do mine+=("${SWEEP_CPU_LIST[$(((s * k + j) % p))]}"); done
  fi
  sweep_cpu_ranges "${mine[@]}"
}

# The environment and launcher prefix of a run in slot $1: "OMP_NUM_THREADS=k MKL_NUM_THREADS=k taskset -c LIST".
_sweep_slot_prefix() {
  local cpus
  cpus="$(_sweep_slot_cpus "$1" "$SWEEP_K")"
  local prefix="OMP_NUM_THREADS=$SWEEP_K MKL_NUM_THREADS=$SWEEP_K"
  ((SWEEP_PIN)) && prefix+=" taskset -c $cpus"
  echo "$prefix"
}

# Run one command in slot $4, log to $2, record its exit code in $3 ("stopped" when a TERM stopped it). TERM/INT are
# forwarded to the run so that the training script can write its checkpoint and close its logs.
_sweep_run_one() {
  local cmd="$1" log="$2" rcfile="$3" slot="$4" pid="" rc prefix stopped=0
  trap '' INT
  trap 'stopped=1; [[ -n "$pid" ]] && kill -TERM "$pid" 2>/dev/null' TERM
  prefix="$(_sweep_slot_prefix "$slot")"
  ((stopped)) && return 0 # stopped before it started: the summary lists it as not started
  echo "# $(date -u '+%Y-%m-%dT%H:%M:%SZ') slot $slot: $prefix $cmd" >"$log"
  # shellcheck disable=SC2086  # the prefix is VAR=value words and taskset's arguments, without spaces inside
  env $prefix bash -c "$cmd" >>"$log" 2>&1 </dev/null &
  pid=$!
  ((stopped)) && kill -TERM "$pid" 2>/dev/null
  while :; do
    wait "$pid"
    rc=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  if ((rc > 128)); then # the last wait may have been cut short by the TERM trap: fetch the real exit code
    wait "$pid" 2>/dev/null
    local real=$?
    ((real == 127)) || rc=$real
  fi
  if ((stopped && rc == 0)); then
    echo "stopped" >"$rcfile"
    echo "[sweep] stopped       $(basename "$log" .log): checkpoint written; continue with --resume-existing"
  else
    echo "$rc" >"$rcfile"
    if [[ "$rc" -eq 0 ]]; then
      echo "[sweep] done   (rc=0) $(basename "$log" .log)"
    else
      echo "[sweep] FAILED (rc=$rc) $(basename "$log" .log): see $log"
    fi
  fi
}

# One queue (lane $1, the GPU index or 0) with $2 slots: run the given run indices, each in a free slot. A slot is
# free when its run has written its exit code (or its wrapper is gone).
_sweep_lane() {
  local lane="$1" slots="$2"
  shift 2
  local i j free r
  local -a slot_run=() slot_pid=() pids=()
  for ((j = 0; j < slots; j++)); do
    slot_run[j]=-1
    slot_pid[j]=0
  done
  trap 'for p in ${pids[@]+"${pids[@]}"}; do kill -TERM "$p" 2>/dev/null; done; wait; exit 143' TERM
  trap '' INT
  for i in "$@"; do
    while :; do
      free=-1
      for ((j = 0; j < slots; j++)); do
        r=${slot_run[j]}
        if ((r < 0)) || [[ -e "$SWEEP_STATUS_DIR/$r.rc" ]] || ! kill -0 "${slot_pid[j]}" 2>/dev/null; then
          free=$j
          break
        fi
      done
      ((free >= 0)) && break
      sleep 0.2 # `wait -n` would miss a run that ended just before it was called
    done
    local s=$((lane * slots + free))
    echo "[sweep] start  [session $i] ${SWEEP_DEVICES[$i]} cpus $(_sweep_slot_cpus "$s" "$SWEEP_K"): ${SWEEP_LABELS[$i]}"
    _sweep_run_one "${SWEEP_FULL[$i]}" "${SWEEP_LOGS[$i]}" "$SWEEP_STATUS_DIR/$i.rc" "$s" &
    pids+=($!)
    slot_run[free]=$i
    slot_pid[free]=$!
  done
  wait
}

# Decide, for every run, what --resume-existing does: fills SWEEP_ACTION/SWEEP_CKPT/SWEEP_NOTE (fresh, resume, skip,
# error). Runs checkpoint_status.py once for the whole sweep, in the repo root (where runs/ is).
_sweep_decide_resume() {
  local python="$1" line action id path note i=0
  SWEEP_ACTION=()
  SWEEP_CKPT=()
  SWEEP_NOTE=()
  local out
  out="$(cd "$SWEEP_REPO_ROOT" && "$python" benchmark/slurm/checkpoint_status.py --runs-dir runs "${SWEEP_IDS[@]}")" ||
    sweep_die "--resume-existing: looking for checkpoints with $python benchmark/slurm/checkpoint_status.py failed"
  while IFS=$'\t' read -r action id path note; do
    if ((i >= ${#SWEEP_IDS[@]})) || [[ "$id" != "${SWEEP_IDS[$i]}" ]]; then
      sweep_die "--resume-existing: unexpected answer for run $i from checkpoint_status.py: $action $id"
    fi
    SWEEP_ACTION[i]="$action"
    SWEEP_CKPT[i]="$path"
    SWEEP_NOTE[i]="$note"
    i=$((i + 1))
  done <<<"$out"
  ((i == ${#SWEEP_IDS[@]})) || sweep_die "--resume-existing: checkpoint_status.py answered for $i of ${#SWEEP_IDS[@]} runs"
}

# Absolute path of the interpreter (relative paths are relative to the repo root, as in local mode).
_sweep_abs_python() {
  local python="$1"
  if [[ "$python" == /* ]]; then
    echo "$python"
  elif [[ "$python" == */* ]]; then
    echo "$SWEEP_REPO_ROOT/$python"
  else
    command -v "$python" 2>/dev/null || sweep_die "python interpreter '$python' not found on PATH; set PYTHON=/path/to/python"
  fi
}

sweep_run() {
  local name="$1"
  if ! sweep_is_uint "$JOBS_PER_GPU" || ((JOBS_PER_GPU < 1)); then
    sweep_die "JOBS_PER_GPU must be a positive integer, got '$JOBS_PER_GPU'"
  fi
  if ! sweep_is_uint "$JOBS" || ((JOBS < 1)); then
    sweep_die "JOBS must be a positive integer, got '$JOBS'"
  fi
  if [[ -n "$CPUS_PER_RUN" ]] && { ! sweep_is_uint "$CPUS_PER_RUN" || ((CPUS_PER_RUN < 1)); }; then
    sweep_die "--cpus-per-run (CPUS_PER_RUN) must be a positive integer, got '$CPUS_PER_RUN'"
  fi
  sweep_passthrough_forbid
  local n=${#SWEEP_CMDS[@]}
  ((n > 0)) || sweep_die "nothing to run (empty list of envs, seeds or settings)"

  local python
  python="$(sweep_default_python)"
  local stamp
  stamp="$(date '+%Y%m%d-%H%M%S')"
  if [[ -n "${LOG_DIR:-}" && "$LOG_DIR" != /* ]]; then
    LOG_DIR="$PWD/$LOG_DIR" # relative to where the sweep was started, not the repo root
  fi
  LOG_DIR="${LOG_DIR:-$SWEEP_REPO_ROOT/runs/sweep_logs/${name}_${stamp}}"
  SWEEP_STATUS_DIR="$LOG_DIR/status"

  local i safe
  SWEEP_LOGS=()
  for ((i = 0; i < n; i++)); do
    safe="${SWEEP_LABELS[$i]//[^A-Za-z0-9._=-]/_}"
    SWEEP_LOGS[i]="$LOG_DIR/$(printf '%03d' "$i")_${safe}.log"
  done

  if ((SWEEP_SLURM)); then
    if ((${#SWEEP_LOCAL_OPTS[@]})); then
      sweep_die "${SWEEP_LOCAL_OPTS[0]} is for local sweeps; under --slurm use --max-parallel (runs at once) and" \
        "--cpus-per-run (CPUs per run)"
    fi
    sweep_slurm "$name" "$python"
    return
  fi
  if ((${#SWEEP_SLURM_OPTS[@]})); then
    sweep_die "${SWEEP_SLURM_OPTS[0]} is an option for SLURM sweeps; add --slurm (or drop ${SWEEP_SLURM_OPTS[0]})"
  fi

  local offset="${CUDA_OFFSET:-0}"
  sweep_is_uint "$offset" || sweep_die "CUDA_OFFSET must be a non-negative integer, got '$offset'"
  local n_gpus
  n_gpus="$(sweep_detect_gpus)"
  sweep_is_uint "$n_gpus" || sweep_die "NUM_GPUS must be a non-negative integer, got '$n_gpus'"
  local gpu_value
  gpu_value="$(sweep_passthrough_value --gpu)"
  if [[ "$gpu_value" == "false" ]]; then
    n_gpus=0
  fi

  local extra=()
  if [[ -n "${CUDA_OFFSET:-}" ]] && ! sweep_passthrough_has --cuda-offset; then
    extra+=(--cuda-offset "$offset")
  fi
  if ((SWEEP_TRACK)); then
    extra+=(--track)
    [[ -n "${WANDB_PROJECT_NAME:-}" ]] && extra+=(--wandb-project-name "$WANDB_PROJECT_NAME")
    [[ -n "${WANDB_ENTITY:-}" ]] && extra+=(--wandb-entity "$WANDB_ENTITY")
  fi
  local tail_args=""
  local all_tail=(${extra[@]+"${extra[@]}"} ${SWEEP_PASSTHROUGH[@]+"${SWEEP_PASSTHROUGH[@]}"})
  if ((${#all_tail[@]})); then
    printf -v tail_args ' %q' "${all_tail[@]}"
  fi
  local py_q
  printf -v py_q '%q' "$python"

  # ---- thread budget: P CPUs, C runs at once, k CPUs per run
  local lanes concurrency slots
  if ((n_gpus > 0)); then
    lanes=$n_gpus
    slots=$JOBS_PER_GPU
  else
    lanes=1
    slots=$JOBS
  fi
  concurrency=$((lanes * slots))
  local allowed allowed_first
  allowed="$(sweep_allowed_cpus)"
  allowed_first="${allowed%% *}"
  if [[ -n "$SWEEP_CPUS" ]]; then
    local chosen
    chosen="$(sweep_expand_cpus "$SWEEP_CPUS")" ||
      sweep_die "--cpus (SWEEP_CPUS) '$SWEEP_CPUS' is not a CPU list such as 0-7 or 0,2,4"
    local c bad=()
    for c in $chosen; do [[ " $allowed " == *" $c "* ]] || bad+=("$c"); done
    if ((${#bad[@]})); then
      if ((SWEEP_DRY_RUN)); then
        sweep_note "--cpus $SWEEP_CPUS includes CPUs this process may not use ($(sweep_cpu_ranges "${bad[@]}")); a real run stops"
      else
        # shellcheck disable=SC2086  # a list of integers
        sweep_die "--cpus $SWEEP_CPUS includes CPUs this process may not use: $(sweep_cpu_ranges "${bad[@]}")" \
          "(allowed: $(sweep_cpu_ranges $allowed))"
      fi
    fi
    allowed="$chosen"
  fi
  # shellcheck disable=SC2206  # a list of integers
  SWEEP_CPU_LIST=($allowed)
  local p=${#SWEEP_CPU_LIST[@]}
  if [[ -n "$CPUS_PER_RUN" ]]; then
    SWEEP_K=$CPUS_PER_RUN
    if ((SWEEP_K > p)); then
      sweep_note "--cpus-per-run $CPUS_PER_RUN but the sweep has $p CPUs; each run gets $p"
      SWEEP_K=$p
    fi
  else
    SWEEP_K=$((p / concurrency))
    ((SWEEP_K >= 1)) || SWEEP_K=1
  fi
  SWEEP_PIN=0
  local pin_note="pinned with taskset"
  if command -v taskset >/dev/null 2>&1 && taskset -c "${allowed_first}" true >/dev/null 2>&1; then
    SWEEP_PIN=1
  else
    pin_note="not pinned (taskset is missing or does not work here)"
  fi
  local share_note="" slot_rule="the run in slot s gets CPU s of the list"
  ((SWEEP_K > 1)) && slot_rule="the run in slot s gets CPUs s*$SWEEP_K to s*$SWEEP_K+$((SWEEP_K - 1)) of the list"
  ((concurrency * SWEEP_K > p)) && share_note="; $concurrency runs x $SWEEP_K > $p CPUs, so runs share cores"

  SWEEP_FULL=()
  SWEEP_DEVICES=()
  local -a lane_runs lane_count
  local g
  for ((g = 0; g < lanes; g++)); do
    lane_runs[g]=""
    lane_count[g]=0
  done
  local -a dry_slot=()
  for ((i = 0; i < n; i++)); do
    local dev lane
    if ((n_gpus > 0)); then
      lane=$(((offset + i) % n_gpus))
      dev="cuda:$lane"
    else
      lane=0
      dev="cpu"
    fi
    SWEEP_DEVICES[i]="$dev"
    SWEEP_FULL[i]="$py_q ${SWEEP_CMDS[$i]} --session $i$tail_args"
  done

  if ((SWEEP_RESUME)); then
    _sweep_decide_resume "$python"
    for ((i = 0; i < n; i++)); do
      [[ "${SWEEP_ACTION[$i]}" == resume ]] && SWEEP_FULL[i]+="$(printf ' --resume %q' "${SWEEP_CKPT[$i]}")"
    done
  fi
  for ((i = 0; i < n; i++)); do
    [[ "${SWEEP_ACTION[$i]:-fresh}" == skip || "${SWEEP_ACTION[$i]:-fresh}" == error ]] && continue
    if ((n_gpus > 0)); then lane=$(((offset + i) % n_gpus)); else lane=0; fi
    lane_runs[lane]+=" $i"
    dry_slot[i]=$((lane * slots + lane_count[lane] % slots)) # the slot if runs end in the order they start
    lane_count[lane]=$((lane_count[lane] + 1))
  done

  echo "[sweep] $name: $n runs, gpus=$n_gpus cuda_offset=$offset" \
    "$(if ((n_gpus > 0)); then echo "jobs_per_gpu=$JOBS_PER_GPU"; else echo "jobs=$JOBS"; fi)" \
    "-> up to $concurrency at once; cwd $SWEEP_REPO_ROOT"
  echo "[sweep] threads: $p CPUs ($(sweep_cpu_ranges "${SWEEP_CPU_LIST[@]}")) for $concurrency runs at once ->" \
    "$SWEEP_K per run (OMP_NUM_THREADS=$SWEEP_K MKL_NUM_THREADS=$SWEEP_K), $pin_note; $slot_rule$share_note"
  if ((SWEEP_DRY_RUN)); then
    for ((i = 0; i < n; i++)); do
      [[ "${SWEEP_ACTION[$i]:-fresh}" == resume ]] && echo "[resume $i] ${SWEEP_LABELS[$i]}: ${SWEEP_NOTE[$i]}"
      case "${SWEEP_ACTION[$i]:-fresh}" in
        skip) echo "[skip $i] ${SWEEP_LABELS[$i]}: ${SWEEP_NOTE[$i]}" ;;
        error) echo "[error $i] ${SWEEP_LABELS[$i]}: ${SWEEP_NOTE[$i]}" ;;
        *) echo "[session $i] ${SWEEP_DEVICES[$i]}: $(_sweep_slot_prefix "${dry_slot[$i]}") ${SWEEP_FULL[$i]}" ;;
      esac
    done
    echo "[sweep] dry run: nothing was started (cpus shown for runs ending in the order they start; a freed slot" \
      "goes to the next run)"
    return 0
  fi

  cd "$SWEEP_REPO_ROOT" || sweep_die "cannot cd to $SWEEP_REPO_ROOT"
  mkdir -p "$SWEEP_STATUS_DIR" || sweep_die "cannot create log dir $LOG_DIR"
  echo "[sweep] logs in $LOG_DIR"
  for ((i = 0; i < n; i++)); do
    case "${SWEEP_ACTION[$i]:-fresh}" in
      skip)
        echo "skipped" >"$SWEEP_STATUS_DIR/$i.rc"
        echo "[sweep] skip   [session $i] ${SWEEP_LABELS[$i]}: ${SWEEP_NOTE[$i]}"
        ;;
      error)
        echo "error: --resume-existing: ${SWEEP_NOTE[$i]}" >"${SWEEP_LOGS[$i]}"
        echo "bad-checkpoint" >"$SWEEP_STATUS_DIR/$i.rc"
        echo "[sweep] FAILED [session $i] ${SWEEP_LABELS[$i]}: ${SWEEP_NOTE[$i]}"
        ;;
      resume) echo "[sweep] resume [session $i] ${SWEEP_LABELS[$i]}: ${SWEEP_NOTE[$i]}" ;;
    esac
  done
  local start_s=$SECONDS
  local -a lane_pids=()
  for ((g = 0; g < lanes; g++)); do
    [[ -n "${lane_runs[g]}" ]] || continue
    # shellcheck disable=SC2086  # lane_runs holds space-separated integers
    _sweep_lane "$g" "$slots" ${lane_runs[g]} &
    lane_pids+=($!)
  done
  # shellcheck disable=SC2317,SC2329  # invoked by trap
  _sweep_stop() {
    echo "[sweep] stopping: sending TERM to all runs (they checkpoint and exit)" >&2
    for p in ${lane_pids[@]+"${lane_pids[@]}"}; do kill -TERM "$p" 2>/dev/null; done
    wait
    SWEEP_INTERRUPTED=1
  }
  SWEEP_INTERRUPTED=0
  trap _sweep_stop INT TERM
  wait
  trap - INT TERM

  local ok=0 failed=0 stopped=0 notrun=0 skip=0 rc
  local summary="$LOG_DIR/summary.txt"
  {
    echo "sweep $name: $n runs, $((SECONDS - start_s)) s"
    for ((i = 0; i < n; i++)); do
      if [[ -f "$SWEEP_STATUS_DIR/$i.rc" ]]; then
        rc="$(cat "$SWEEP_STATUS_DIR/$i.rc")"
      else
        rc="not-run"
      fi
      case "$rc" in
        0) ok=$((ok + 1)) ;;
        skipped) skip=$((skip + 1)) ;;
        stopped)
          stopped=$((stopped + 1))
          echo "stopped [session $i] ${SWEEP_LABELS[$i]}: ${SWEEP_LOGS[$i]}"
          ;;
        not-run)
          notrun=$((notrun + 1))
          echo "not started [session $i] ${SWEEP_LABELS[$i]}"
          ;;
        *)
          failed=$((failed + 1))
          echo "FAILED (rc=$rc) [session $i] ${SWEEP_DEVICES[$i]} ${SWEEP_LABELS[$i]}: ${SWEEP_LOGS[$i]}"
          ;;
      esac
    done
    echo "$ok ok, $failed failed$( ((stopped)) && echo ", $stopped stopped")$( ((notrun)) && echo ", $notrun not started")$(
      ((skip)) && echo ", $skip skipped (finished before)"
    )"
    if ((SWEEP_INTERRUPTED)); then
      echo "interrupted: stopped runs wrote runs/<run>/checkpoint.pt; run the same command with --resume-existing" \
        "to continue them and start the rest"
    fi
  } >"$summary"
  echo "[sweep] summary ($summary):"
  sed 's/^/[sweep]   /' "$summary"
  if ((SWEEP_INTERRUPTED)); then
    return 130
  fi
  ((failed == 0)) || return 1
  return 0
}

# ---------------------------------------------------------------- SLURM

# Print the sbatch script of the sweep (a job array, task i = run i) on stdout. Uses LOG_DIR, SWEEP_LOGS, the
# SLURM options and the pass-through arguments; $1 = sweep name, $2 = absolute python.
_sweep_slurm_script() {
  local name="$1" python="$2" n=${#SWEEP_CMDS[@]} i
  local array="0-$((n - 1))"
  [[ -n "$SWEEP_MAX_PARALLEL" ]] && array+="%$SWEEP_MAX_PARALLEL"
  echo "#!/bin/bash"
  echo "#SBATCH --job-name=$name"
  echo "#SBATCH --array=$array"
  echo "#SBATCH --output=$LOG_DIR/slurm/%A_%a.out"
  echo "#SBATCH --signal=B:TERM@120"
  [[ -n "$SWEEP_PARTITION" ]] && echo "#SBATCH --partition=$SWEEP_PARTITION"
  [[ -n "$SWEEP_TIME" ]] && echo "#SBATCH --time=$SWEEP_TIME"
  [[ -n "$SWEEP_GPUS_PER_RUN" && "$SWEEP_GPUS_PER_RUN" != 0 ]] && echo "#SBATCH --gres=gpu:$SWEEP_GPUS_PER_RUN"
  [[ -n "$CPUS_PER_RUN" ]] && echo "#SBATCH --cpus-per-task=$CPUS_PER_RUN"
  [[ -n "$SWEEP_MEM" ]] && echo "#SBATCH --mem=$SWEEP_MEM"
  [[ -n "$SWEEP_ACCOUNT" ]] && echo "#SBATCH --account=$SWEEP_ACCOUNT"
  local sbatch_line=""
  ((${#SWEEP_SBATCH_ARGS[@]})) && printf -v sbatch_line ' %q' "${SWEEP_SBATCH_ARGS[@]}"
  cat <<EOF
#
# $name sweep: $n runs as one SLURM job array, written by benchmark/$name.sh on $(date -u '+%Y-%m-%d %H:%M:%SZ').
# Submitted as: sbatch$sbatch_line THIS_FILE (options on sbatch's command line win over the #SBATCH lines).
# Task i runs run i in the repo root and logs to $LOG_DIR/<i>_<label>.log; TensorBoard runs go to runs/ as in a
# local sweep. The task's threads are the CPUs SLURM gave it (--cpus-per-task): OMP_NUM_THREADS=MKL_NUM_THREADS=that.
# scancel (or the time limit: --signal=B:TERM@120) sends SIGTERM: the run finishes its iteration, writes
# runs/<run>/checkpoint.pt and exits; this script waits for it. RESUME_EXISTING=1 (--resume-existing): a task first
# looks for its run's newest checkpoint and skips (finished) or continues (--resume) it, else starts fresh; to
# continue a stopped sweep, run the sweep command again with --resume-existing, or: RESUME_EXISTING=1 sbatch THIS_FILE
set -u
EOF
  printf 'REPO=%q\n' "$SWEEP_REPO_ROOT"
  printf 'PYTHON=%q\n' "$python"
  printf 'LOG_DIR=%q\n' "$LOG_DIR"
  # shellcheck disable=SC2016  # the script expands it when it runs
  printf 'RESUME_EXISTING="${RESUME_EXISTING:-%q}" # 1: continue or skip runs that have a checkpoint\n' "$SWEEP_RESUME"
  printf 'N_RUNS=%q\n' "$n"
  local tail_q=""
  ((${#SWEEP_TAIL[@]})) && printf -v tail_q ' %q' "${SWEEP_TAIL[@]}"
  echo "TAIL=($tail_q ) # added to every run: --track and the arguments after --"
  echo
  cat <<'EOF'
# run_args I: set ARGS (script and arguments), RUN_ID (runs/<RUN_ID>__<time>) and LOG (log file) of run I
run_args() {
  case "$1" in
EOF
  for ((i = 0; i < n; i++)); do
    printf '    %d) # %s\n' "$i" "${SWEEP_LABELS[$i]}"
    printf '      ARGS=(%s)\n' "${SWEEP_CMDS[$i]}"
    printf '      RUN_ID=%q LOG=%q ;;\n' "${SWEEP_IDS[$i]}" "$(basename "${SWEEP_LOGS[$i]}")"
  done
  echo '    *) return 1 ;;'
  echo '  esac'
  echo '}'
  cat <<'EOF'

stamp() { date -u '+%Y-%m-%dT%H:%M:%SZ'; }
i="${SLURM_ARRAY_TASK_ID:-}"
if [[ -z "$i" ]]; then
  echo "error: submit this script with sbatch; it is a job array (SLURM_ARRAY_TASK_ID is unset)" >&2
  exit 2
fi
if ! run_args "$i"; then
  echo "error: this sweep has runs 0-$((N_RUNS - 1)), not $i" >&2
  exit 2
fi
exec >>"$LOG_DIR/$LOG" 2>&1 || exit 2
cd "$REPO" || exit 2
unset CUDA_OFFSET # SLURM gives the task its GPUs (CUDA_VISIBLE_DEVICES): the run takes the first one it sees

# Thread budget: the CPUs SLURM gave this task (--cpus-per-task), else those of the job on this node.
cpus="${SLURM_CPUS_PER_TASK:-${SLURM_JOB_CPUS_PER_NODE:-}}"
cpus="${cpus%%[!0-9]*}"
[[ -n "$cpus" && "$cpus" -gt 0 ]] || cpus="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
export OMP_NUM_THREADS="$cpus" MKL_NUM_THREADS="$cpus"
echo "# $(stamp) slurm job ${SLURM_ARRAY_JOB_ID:-?}_$i (job ${SLURM_JOB_ID:-?}) on $(hostname):" \
  "$cpus CPUs (OMP_NUM_THREADS=$cpus MKL_NUM_THREADS=$cpus), CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}"

if [[ "$RESUME_EXISTING" == 1 ]]; then
  answer="$("$PYTHON" benchmark/slurm/checkpoint_status.py --runs-dir runs "$RUN_ID")" || {
    echo "[sweep] FAILED: could not look for checkpoints of $RUN_ID"
    exit 2
  }
  IFS=$'\t' read -r action _ checkpoint note <<<"$answer"
  case "$action" in
    skip)
      echo "[sweep] skip: $note"
      exit 0
      ;;
    resume)
      echo "[sweep] resume: $note"
      TAIL+=(--resume "$checkpoint")
      ;;
    fresh) echo "[sweep] fresh start: $note" ;;
    *)
      echo "[sweep] FAILED: --resume-existing: $note"
      exit 2
      ;;
  esac
fi

echo "# $(stamp) $(printf '%q ' "$PYTHON" "${ARGS[@]}" ${TAIL[@]+"${TAIL[@]}"})"
"$PYTHON" "${ARGS[@]}" ${TAIL[@]+"${TAIL[@]}"} </dev/null &
pid=$!
stopping=0
# scancel signals every process of the task, `scancel --batch` and the time-limit warning only this shell: pass
# the signal on in every case and wait until the run has written its checkpoint.
trap 'stopping=1; echo "[sweep] $(stamp) SIGTERM: the run finishes its iteration, checkpoints and exits"; kill -TERM "$pid" 2>/dev/null' TERM INT
while :; do
  wait "$pid"
  rc=$?
  kill -0 "$pid" 2>/dev/null || break
done
if ((rc > 128)); then # the last wait may have been cut short by the trap: fetch the real exit code
  wait "$pid" 2>/dev/null
  real=$?
  ((real == 127)) || rc=$real
fi
if ((stopping && rc == 0)); then
  echo "# $(stamp) stopped by SIGTERM with its checkpoint written; resubmit the sweep with --resume-existing to continue"
  exit 143
fi
echo "# $(stamp) exit code $rc"
exit "$rc"
EOF
}

# Submit the sweep to SLURM (or print the script with --dry-run). $1 = sweep name, $2 = python as configured.
sweep_slurm() {
  local name="$1" python
  python="$(_sweep_abs_python "$2")" || exit 2 # the error is already printed
  local v
  for v in "$LOG_DIR" "$SWEEP_REPO_ROOT"; do
    [[ "$v" =~ ^[A-Za-z0-9._/+=:@,-]+$ ]] ||
      sweep_die "--slurm needs paths without spaces, % or quotes (SLURM's --output); '$v' has some: pass --log-dir"
  done
  for v in "$SWEEP_PARTITION" "$SWEEP_TIME" "$SWEEP_MEM" "$SWEEP_ACCOUNT"; do
    [[ "$v" =~ ^[A-Za-z0-9._:,+=@-]*$ ]] || sweep_die "SLURM option value '$v' has spaces or odd characters"
  done
  [[ -z "$SWEEP_GPUS_PER_RUN" ]] || sweep_is_uint "$SWEEP_GPUS_PER_RUN" ||
    sweep_die "--gpus-per-run must be a non-negative integer, got '$SWEEP_GPUS_PER_RUN'"
  if [[ -n "$SWEEP_MAX_PARALLEL" ]] && { ! sweep_is_uint "$SWEEP_MAX_PARALLEL" || ((SWEEP_MAX_PARALLEL < 1)); }; then
    sweep_die "--max-parallel must be a positive integer, got '$SWEEP_MAX_PARALLEL'"
  fi
  [[ -z "$SWEEP_MEM" || "$SWEEP_MEM" =~ ^[0-9]+[KMGTkmgt]?$ ]] ||
    sweep_die "--mem '$SWEEP_MEM' is not a size such as 16G or 16000 (megabytes)"
  if [[ -n "$SWEEP_GPUS_PER_RUN" ]] && ((SWEEP_GPUS_PER_RUN > 1)); then
    sweep_note "--gpus-per-run $SWEEP_GPUS_PER_RUN: each run uses the first GPU it sees; one run on several GPUs" \
      "is benchmark/slurm/ppo_atari_multinode.sbatch"
  fi
  if [[ -n "${CUDA_OFFSET:-}" ]]; then
    sweep_note "CUDA_OFFSET is ignored under --slurm: each task uses the GPUs SLURM gives it"
  fi
  if [[ -z "$SWEEP_GPUS_PER_RUN" ]] && ! [[ " ${SWEEP_SBATCH_ARGS[*]-} " =~ \ --(gres|gpus) ]]; then
    sweep_note "no --gpus-per-run: the runs get a GPU only where the partition gives one by default"
  fi
  SWEEP_TAIL=()
  if ((SWEEP_TRACK)); then
    SWEEP_TAIL+=(--track)
    [[ -n "${WANDB_PROJECT_NAME:-}" ]] && SWEEP_TAIL+=(--wandb-project-name "$WANDB_PROJECT_NAME")
    [[ -n "${WANDB_ENTITY:-}" ]] && SWEEP_TAIL+=(--wandb-entity "$WANDB_ENTITY")
  fi
  SWEEP_TAIL+=(${SWEEP_PASSTHROUGH[@]+"${SWEEP_PASSTHROUGH[@]}"})

  local n=${#SWEEP_CMDS[@]} script="$LOG_DIR/$name.sbatch"
  local cmd=(sbatch --parsable ${SWEEP_SBATCH_ARGS[@]+"${SWEEP_SBATCH_ARGS[@]}"} "$script")
  local cmd_text
  printf -v cmd_text '%q ' "${cmd[@]}"
  echo "[sweep] $name: $n runs as one SLURM job array (task i = run i)$([[ -n "$SWEEP_MAX_PARALLEL" ]] &&
    echo ", at most $SWEEP_MAX_PARALLEL at once"); logs in $LOG_DIR"
  if ((SWEEP_DRY_RUN)); then
    echo "[sweep] dry run: would write $script and run: ${cmd_text% }"
    _sweep_slurm_script "$name" "$python"
    echo "[sweep] dry run: nothing was submitted"
    return 0
  fi
  command -v sbatch >/dev/null 2>&1 || sweep_die "sbatch not found: --slurm submits to a SLURM cluster; run this" \
    "where sbatch works (a login node), or try a local test cluster: benchmark/slurm/local_cluster.sh start"
  mkdir -p "$LOG_DIR/slurm" || sweep_die "cannot create log dir $LOG_DIR"
  _sweep_slurm_script "$name" "$python" >"$script" || sweep_die "cannot write $script"
  local out rc=0
  out="$("${cmd[@]}" 2>&1)" || rc=$?
  if ((rc != 0)); then
    echo "error: sbatch failed (rc=$rc): ${out//$'\n'/; }; fix what sbatch names and run the sweep again" \
      "(the script is $script)" >&2
    exit 1
  fi
  local job="${out##*$'\n'}"
  job="${job%%;*}"
  echo "$(date -u '+%Y-%m-%dT%H:%M:%SZ') $job ${cmd_text% }" >>"$LOG_DIR/submissions.txt"
  echo "[sweep] submitted job array $job ($n tasks); watch: squeue -j $job; stop: scancel $job"
  echo "[sweep] after a stop, the same command with --resume-existing continues each unfinished run"
}
