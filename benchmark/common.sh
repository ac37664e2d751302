# shellcheck shell=bash disable=SC2034  # SWEEP_SHIFT and friends are read by the sweep scripts
# Shared sweep machinery, sourced by benchmark/ppo_atari.sh, ppo_continuous.sh and dqn_snake.sh.
#
# A sweep script builds its list of runs with `sweep_add LABEL ARG...` and then calls `sweep_run`.
# Each run gets a unique session index (0, 1, 2, ... in the order added) that is passed to the script as
# `--session`; the script's gpu_utils.select_device puts it on GPU (CUDA_OFFSET + session) % n_gpus. This file
# computes the same number so that --dry-run can print where each run lands, and it keeps at most
# JOBS_PER_GPU runs on each GPU at once (one queue per GPU). Without GPUs, JOBS runs go at a time.
#
# Environment variables (all optional):
#   NUM_GPUS       number of GPUs to spread over (default: CUDA_VISIBLE_DEVICES entries, else `nvidia-smi -L`)
#   CUDA_OFFSET    first GPU used by session 0 (default 0)
#   JOBS_PER_GPU   runs sharing one GPU at the same time (default 1)
#   JOBS           runs at the same time on a machine without GPUs (default 1)
#   SEEDS          seeds to run (default "1 2 3")
#   PYTHON         interpreter (default: .venv/bin/python in the repo if present, else python)
#   LOG_DIR        where per-run logs and the summary go (default runs/sweep_logs/<sweep>_<date>)
#   WANDB_PROJECT_NAME / WANDB_ENTITY   passed with --track as --wandb-project-name / --wandb-entity

set -u
set -o pipefail

SWEEP_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

SWEEP_DRY_RUN=0
SWEEP_TRACK=0
SWEEP_SHIFT=1
SWEEP_PASSTHROUGH=() # arguments after --, set by the sweep script
SWEEP_LABELS=()
SWEEP_CMDS=()
SWEEP_DEVICES=()
SEEDS="${SEEDS:-1 2 3}"
JOBS_PER_GPU="${JOBS_PER_GPU:-1}"
JOBS="${JOBS:-1}"

sweep_die() {
  echo "error: $*" >&2
  exit 2
}

sweep_common_help() {
  cat <<'EOF'
Common options:
  --dry-run            print every command with the device it lands on, run nothing
  --track              pass --track to every run (wandb; WANDB_PROJECT_NAME / WANDB_ENTITY are passed on too)
  --seeds "1 2 3"      seeds (env SEEDS)
  --jobs-per-gpu N     runs sharing one GPU at once (env JOBS_PER_GPU, default 1)
  --jobs N             runs at once on a machine without GPUs (env JOBS, default 1)
  --log-dir DIR        per-run logs and summary (env LOG_DIR)
  -- ARGS...           everything after -- is passed to every run unchanged
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
    --seeds | --jobs-per-gpu | --jobs | --log-dir)
      [[ $# -ge 2 ]] || sweep_die "$1 needs a value"
      case "$1" in
        --seeds) SEEDS="$2" ;;
        --jobs-per-gpu) JOBS_PER_GPU="$2" ;;
        --jobs) JOBS="$2" ;;
        --log-dir) LOG_DIR="$2" ;;
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

# True when the pass-through arguments contain the given flag (as "--flag value" or "--flag=value").
sweep_passthrough_has() {
  local a
  for a in ${SWEEP_PASSTHROUGH[@]+"${SWEEP_PASSTHROUGH[@]}"}; do
    [[ "$a" == "$1" || "$a" == "$1="* ]] && return 0
  done
  return 1
}

# Value that the pass-through arguments give to a flag (empty if absent).
sweep_passthrough_value() {
  local prev="" a
  for a in ${SWEEP_PASSTHROUGH[@]+"${SWEEP_PASSTHROUGH[@]}"}; do
    if [[ "$prev" == "$1" ]]; then
      echo "$a"
      return
    fi
    [[ "$a" == "$1="* ]] && {
      echo "${a#*=}"
      return
    }
    prev="$a"
  done
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

# sweep_add LABEL SCRIPT ARG...  (the python interpreter, --session, --cuda-offset, --track and the
# pass-through arguments are added by sweep_run)
sweep_add() {
  local label="$1"
  shift
  local cmd
  printf -v cmd '%q ' "$@"
  SWEEP_LABELS+=("$label")
  SWEEP_CMDS+=("${cmd% }")
}

# Run one command, log to $2, record its exit code in $3. TERM/INT are forwarded to the run so that the
# training script can write its checkpoint and close its logs.
_sweep_run_one() {
  local cmd="$1" log="$2" rcfile="$3" pid rc
  trap '' INT
  {
    echo "# $(date -u '+%Y-%m-%dT%H:%M:%SZ') $cmd"
  } >"$log"
  bash -c "$cmd" >>"$log" 2>&1 </dev/null &
  pid=$!
  trap 'kill -TERM "$pid" 2>/dev/null' TERM
  wait "$pid"
  rc=$?
  while kill -0 "$pid" 2>/dev/null; do
    wait "$pid"
    rc=$?
  done
  echo "$rc" >"$rcfile"
  if [[ "$rc" -eq 0 ]]; then
    echo "[sweep] done   (rc=0) $(basename "$log" .log)"
  else
    echo "[sweep] FAILED (rc=$rc) $(basename "$log" .log): see $log"
  fi
}

# One queue: run the given run indices with at most $1 at a time.
_sweep_lane() {
  local slots="$1"
  shift
  local running=0 i
  local -a pids=()
  trap 'for p in ${pids[@]+"${pids[@]}"}; do kill -TERM "$p" 2>/dev/null; done; wait; exit 143' TERM
  trap '' INT
  for i in "$@"; do
    if ((running >= slots)); then
      wait -n
      running=$((running - 1))
    fi
    echo "[sweep] start  [session $i] ${SWEEP_DEVICES[$i]}: ${SWEEP_LABELS[$i]}"
    _sweep_run_one "${SWEEP_FULL[$i]}" "${SWEEP_LOGS[$i]}" "$SWEEP_STATUS_DIR/$i.rc" &
    pids+=($!)
    running=$((running + 1))
  done
  wait
}

sweep_run() {
  local name="$1"
  if ! sweep_is_uint "$JOBS_PER_GPU" || ((JOBS_PER_GPU < 1)); then
    sweep_die "JOBS_PER_GPU must be a positive integer, got '$JOBS_PER_GPU'"
  fi
  if ! sweep_is_uint "$JOBS" || ((JOBS < 1)); then
    sweep_die "JOBS must be a positive integer, got '$JOBS'"
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

  SWEEP_FULL=()
  SWEEP_LOGS=()
  SWEEP_DEVICES=()
  local i lanes concurrency
  if ((n_gpus > 0)); then
    lanes=$n_gpus
    concurrency=$((n_gpus * JOBS_PER_GPU))
  else
    lanes=1
    concurrency=$JOBS
  fi
  local -a lane_runs
  for ((g = 0; g < lanes; g++)); do lane_runs[g]=""; done
  for ((i = 0; i < n; i++)); do
    local dev lane safe
    if ((n_gpus > 0)); then
      lane=$(((offset + i) % n_gpus))
      dev="cuda:$lane"
    else
      lane=0
      dev="cpu"
    fi
    SWEEP_DEVICES[i]="$dev"
    SWEEP_FULL[i]="$py_q ${SWEEP_CMDS[$i]} --session $i$tail_args"
    safe="${SWEEP_LABELS[$i]//[^A-Za-z0-9._=-]/_}"
    SWEEP_LOGS[i]="$LOG_DIR/$(printf '%03d' "$i")_${safe}.log"
    lane_runs[lane]+=" $i"
  done

  echo "[sweep] $name: $n runs, gpus=$n_gpus cuda_offset=$offset" \
    "$(if ((n_gpus > 0)); then echo "jobs_per_gpu=$JOBS_PER_GPU"; else echo "jobs=$JOBS"; fi)" \
    "-> up to $concurrency at once; cwd $SWEEP_REPO_ROOT"
  if ((SWEEP_DRY_RUN)); then
    for ((i = 0; i < n; i++)); do
      echo "[session $i] ${SWEEP_DEVICES[$i]}: ${SWEEP_FULL[$i]}"
    done
    echo "[sweep] dry run: nothing was started"
    return 0
  fi

  cd "$SWEEP_REPO_ROOT" || sweep_die "cannot cd to $SWEEP_REPO_ROOT"
  mkdir -p "$SWEEP_STATUS_DIR" || sweep_die "cannot create log dir $LOG_DIR"
  echo "[sweep] logs in $LOG_DIR"
  local start_s=$SECONDS
  local -a lane_pids=()
  local slots=$((n_gpus > 0 ? JOBS_PER_GPU : JOBS))
  for ((g = 0; g < lanes; g++)); do
    [[ -n "${lane_runs[g]}" ]] || continue
    # shellcheck disable=SC2086  # lane_runs holds space-separated integers
    _sweep_lane "$slots" ${lane_runs[g]} &
    lane_pids+=($!)
  done
  # shellcheck disable=SC2317,SC2329  # invoked by trap
  _sweep_stop() {
    echo "[sweep] stopping: sending TERM to all runs (they checkpoint and exit)" >&2
    for p in "${lane_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    wait
    SWEEP_INTERRUPTED=1
  }
  SWEEP_INTERRUPTED=0
  trap _sweep_stop INT TERM
  wait
  trap - INT TERM

  local ok=0 failed=0 rc
  local summary="$LOG_DIR/summary.txt"
  {
    echo "sweep $name: $n runs, $((SECONDS - start_s)) s"
    for ((i = 0; i < n; i++)); do
      if [[ -f "$SWEEP_STATUS_DIR/$i.rc" ]]; then
        rc="$(cat "$SWEEP_STATUS_DIR/$i.rc")"
      else
        rc="not-run"
      fi
      if [[ "$rc" == 0 ]]; then
        ok=$((ok + 1))
      else
        failed=$((failed + 1))
        echo "FAILED (rc=$rc) [session $i] ${SWEEP_DEVICES[$i]} ${SWEEP_LABELS[$i]}: ${SWEEP_LOGS[$i]}"
      fi
    done
    echo "$ok ok, $failed failed"
    if ((SWEEP_INTERRUPTED)); then
      echo "interrupted: runs were stopped early (each wrote runs/<run>/checkpoint.pt; continue one with -- --resume PATH)"
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
