#!/usr/bin/env bash
# The GPU checks of this project on one GPU machine, in steps that each fit a short remote call. Logs and tables go
# to $LOGS (default /tmp/gpu_check); `collect DIR` copies them out. Steps run in the order given:
#
#   dev/gpu_check.sh env              # GPU, CPU, compiler and Python headers (torch.compile needs both)
#   dev/gpu_check.sh before c9316f8   # HERE, not on the GPU machine (it needs git): the old scripts of that
#                                     # commit into .ab/before (git-excluded; carry .ab), for `ab`
#   dev/gpu_check.sh ab               # old (.ab/before) and new code interleaved at the same settings
#                                     # (benchmark/speed.py ab), started detached: the same-lease A/B table
#   dev/gpu_check.sh table            # the one-GPU throughput table, started detached (it outlives the call)
#   dev/gpu_check.sh wait 500         # wait for the detached jobs (ab, table, atari), at most 500 s, and show
#                                     # their state (atari: each run's newest "iteration" line: step, SPS)
#   dev/gpu_check.sh profile tests    # benchmark/profile_atari.py, then pytest -m gpu
#   dev/gpu_check.sh collect "$OUT"   # copy logs and tables to a folder
#   dev/gpu_check.sh train            # start a full ppo_atari.py run detached (RUN_ARGS; default Breakout)
#   dev/gpu_check.sh atari "Breakout Pong"
#                                     # full-budget Atari runs (issue #10), detached: copies the committed
#                                     # partial runs benchmark/results/atari_gpu/runs/* into runs/ (never over
#                                     # one there), prints the sweep's dry run (what starts, what resumes),
#                                     # then starts benchmark/ppo_atari.sh --resume-existing on those games
#   dev/gpu_check.sh stop "$OUT"      # stop train and the atari sweep (SIGTERM: runs write checkpoint.pt),
#                                     # bring back logs and run folders as 15 MiB parts:
#                                     # cat run.tar.part-* | tar x (train), cat atari.tar.part-* | tar x
#                                     # (atari, in the repo root: runs/ and the run logs in atari/); then
#                                     # --resume / atari again to continue
#
# Knobs: LOGS, PYTHON (default python3), TABLE_ARGS (extra arguments for `speed.py table`), AB_ARGS (extra arguments
# for `speed.py ab`, e.g. --only ppo_atari --rounds 3), TEST_WORKERS (pytest-xdist
# workers for `tests`, default 4; 0 runs them one by one), RUN_ARGS (ppo_atari.py arguments for `train`).
# For `atari`: ATARI_ARGS (extra ppo_atari.py arguments after --compile --cudagraphs --save-model --no-progress-bar),
# ATARI_DRY_RUN=1 (copy the runs and print the dry run, start nothing), JOBS_PER_GPU (runs at once on the GPU,
# default 2), SEEDS (default 1). The sweep's logs go to $LOGS/atari.log and $LOGS/atari/, its exit code to
# $LOGS/atari.done, its pid to $LOGS/atari.pid.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
LOGS=${LOGS:-/tmp/gpu_check}
PY=${PYTHON:-python3}
[[ $PY == */* && $PY != /* ]] && PY=$PWD/$PY  # steps may run from another folder
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 WANDB_MODE=${WANDB_MODE:-offline}
export MUJOCO_GL=disable  # nothing here renders, and "egl" without libEGL (as on the GPU machine) breaks import mujoco

die() {
  echo "error: $*" >&2
  exit 2
}

step_env() {
  {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
    echo "cpus: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
    echo "gcc: $(command -v gcc || echo MISSING) $(gcc --version 2>/dev/null | head -1)"
    local inc
    inc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    if [[ -f $inc/Python.h ]]; then echo "Python.h: $inc/Python.h"; else echo "Python.h: MISSING in $inc"; fi
    "$PY" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
    "$PY" gpu_utils.py 4
  } 2>&1 | tee "$LOGS/env.txt"
}

detach() {  # JOB COMMAND...: setsid puts it in its own session, so it runs on after the call that started it returns
  local job=$1
  shift
  rm -f "$LOGS/$job.done"
  : >"$LOGS/$job.log"  # a job counts as started once its log exists (see step_wait)
  # shellcheck disable=SC2016  # the wrapper expands its own arguments
  setsid nohup bash -c 'log=$1 done=$2; shift 2; "$@" >"$log" 2>&1 </dev/null; echo $? >"$done"' "$job" \
    "$LOGS/$job.log" "$LOGS/$job.done" "$@" >/dev/null 2>&1 </dev/null &
  echo "$job started (pid $!), log $LOGS/$job.log"
}

step_table() {
  # shellcheck disable=SC2086  # TABLE_ARGS is a list of words
  detach table "$PY" benchmark/speed.py table --profile gpu --out "$LOGS" --host gpu ${TABLE_ARGS:-}
}

step_before() {  # on the development machine: the old scripts, which the GPU machine (no git history) cannot copy out
  "$PY" benchmark/speed.py before "$1" .ab/before || exit 2
  local exclude
  exclude=$(git rev-parse --git-path info/exclude)
  grep -qx '/.ab/' "$exclude" 2>/dev/null || echo '/.ab/' >>"$exclude"
  echo "before: .ab/before is git-excluded; name .ab in the GPU call's carry"
}

step_ab() {
  [[ -f .ab/before/REF ]] || die "ab: no .ab/before here; run \`dev/gpu_check.sh before REF\` first and carry .ab"
  # shellcheck disable=SC2086  # AB_ARGS is a list of words
  detach ab "$PY" benchmark/speed.py ab --before .ab/before --profile gpu --out "$LOGS" --host gpu ${AB_ARGS:-}
}

# A detached job (ab, table, atari) counts as started when $LOGS/JOB.log exists and as finished when JOB.done does.
step_wait() {
  local limit=$1 t0=$SECONDS job pending pid
  [[ $limit =~ ^[0-9]+$ ]] || die "wait needs a number of seconds, got '$limit'"
  local jobs=()
  for job in ab table atari; do [[ -f $LOGS/$job.log ]] && jobs+=("$job"); done
  if ((${#jobs[@]} == 0)); then
    echo "no detached job (ab, table, atari) was started in $LOGS"
    return
  fi
  while :; do
    pending=0
    for job in "${jobs[@]}"; do [[ -f $LOGS/$job.done ]] || pending=1; done
    ((pending && SECONDS - t0 < limit)) || break
    sleep "$((limit - (SECONDS - t0) < 5 ? limit - (SECONDS - t0) : 5))"
  done
  for job in "${jobs[@]}"; do
    if [[ -f $LOGS/$job.done ]]; then
      echo "$job finished, exit $(cat "$LOGS/$job.done")"
    elif [[ $job == atari ]] && pid=$(cat "$LOGS/atari.pid" 2>/dev/null) && ! kill -0 "$pid" 2>/dev/null; then
      echo "atari is not running (pid $pid) and wrote no exit code"
    else
      echo "$job still running"
    fi
    tail -n 5 "$LOGS/$job.log"
    [[ $job == atari ]] && atari_progress
  done
}

atari_progress() {  # each run's newest "iteration" line: its step and SPS
  local f line
  for f in "$LOGS"/atari/*.log; do
    [[ -f $f ]] || continue
    line=$(grep -v '^#' "$f" | grep iteration | tail -n 1)
    echo "  $(basename "$f" .log): ${line:-no iteration line yet}"
  done
}

step_profile() {
  "$PY" benchmark/profile_atari.py --device cuda --out "$LOGS" 2>&1 | tee "$LOGS/profile.log"
}

step_tests() {
  local workers=${TEST_WORKERS:-4} xdist=()
  ((workers > 0)) && xdist=(-n "$workers")
  "$PY" -m pytest -m gpu -p no:cacheprovider "${xdist[@]}" -q tests 2>&1 | tee "$LOGS/pytest_gpu.txt"
}

step_collect() {
  local dest=$1
  mkdir -p "$dest"
  cp "$LOGS"/*.md "$LOGS"/*.txt "$LOGS"/*.log "$dest"/ 2>/dev/null
  ls -la "$dest"
}

step_train() {
  mkdir -p "$LOGS/train"
  local root=$PWD
  # shellcheck disable=SC2086
  (cd "$LOGS/train" && setsid nohup "$PY" "$root/ppo_atari.py" --no-progress-bar \
    ${RUN_ARGS:---env-id ALE/Breakout-v5 --gae-lambda 0.7 --compile --cudagraphs} >"$LOGS/train.log" 2>&1 < /dev/null &)
  echo "training started, log $LOGS/train.log"
}

step_atari() {
  local games=$1 src name
  [[ -n ${games// /} ]] || die "atari needs games, e.g. atari \"Breakout Pong\""
  local pid
  if [[ ! -f $LOGS/atari.done ]] && pid=$(cat "$LOGS/atari.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; then
    die "the atari sweep is already running (pid $pid, log $LOGS/atari.log); stop it first"
  fi
  # (1) the committed partial runs: --resume-existing continues them from their checkpoint.pt
  mkdir -p runs
  for src in benchmark/results/atari_gpu/runs/*/; do
    [[ -d $src ]] || continue
    name=$(basename "$src")
    if [[ -e runs/$name ]]; then
      echo "atari: kept runs/$name (already there; not overwritten)"
    else
      cp -r "${src%/}" "runs/$name" && echo "atari: copied benchmark/results/atari_gpu/runs/$name -> runs/$name"
    fi
  done
  # (2) the dry run, with the same settings as the real sweep: which runs start, which resume, which are finished
  local sweep=(env JOBS_PER_GPU="${JOBS_PER_GPU:-2}" SEEDS="${SEEDS:-1}" PYTHON="$PY" SWEEP_PYTHON="$PY"
    LOG_DIR="$LOGS/atari" bash benchmark/ppo_atari.sh --games "$games" --resume-existing)
  local run_args=(--compile --cudagraphs --save-model --no-progress-bar)
  # shellcheck disable=SC2206  # ATARI_ARGS is a list of words
  run_args+=(${ATARI_ARGS:-})
  "${sweep[@]}" --dry-run -- "${run_args[@]}" 2>&1 | tee "$LOGS/atari_dry_run.txt"
  ((PIPESTATUS[0] == 0)) || die "atari: the sweep's dry run failed (above); nothing was started"
  if [[ ${ATARI_DRY_RUN:-0} == 1 ]]; then
    echo "atari: ATARI_DRY_RUN=1, nothing was started"
    return
  fi
  # (3) the sweep, detached (like step_table); the wrapper records the sweep's pid (for stop) and its exit code
  rm -f "$LOGS/atari.done" "$LOGS/atari.pid"
  : >"$LOGS/atari.log"  # a job counts as started once its log exists (see step_wait)
  # shellcheck disable=SC2016  # the wrapper expands its own arguments
  setsid nohup bash -c 'log=$1 done=$2 pidfile=$3; shift 3
    "$@" >"$log" 2>&1 </dev/null &
    echo $! >"$pidfile"; wait $!; echo $? >"$done"' atari "$LOGS/atari.log" "$LOGS/atari.done" "$LOGS/atari.pid" \
    "${sweep[@]}" -- "${run_args[@]}" >/dev/null 2>&1 </dev/null &
  local t0=$SECONDS
  while [[ ! -s $LOGS/atari.pid ]] && ((SECONDS - t0 < 10)); do sleep 0.2; done
  echo "atari sweep started (pid $(cat "$LOGS/atari.pid" 2>/dev/null)), log $LOGS/atari.log, run logs $LOGS/atari/"
}

step_stop() {
  local dest=$1 pid
  mkdir -p "$dest"
  if [[ -f $LOGS/train.log ]]; then  # `train` was started here
    pid=$(pgrep -f "ppo_atari.py --no-progress-bar" | head -1)
    if [[ -n $pid ]]; then
      kill -TERM "$pid"
      while kill -0 "$pid" 2>/dev/null; do sleep 1; done  # it finishes the iteration and writes checkpoint.pt
    fi
    tail -n 4 "$LOGS/train.log"
    cp "$LOGS/train.log" "$dest/"
    (cd "$LOGS/train" && tar cf - runs | split -b 15M - "$dest/run.tar.part-")
  fi
  [[ -f $LOGS/atari.log ]] && stop_atari "$dest"
  [[ -f $LOGS/train.log || -f $LOGS/atari.log ]] || echo "nothing to stop: neither train nor atari was started in $LOGS"
  ls -la "$dest"
}

stop_atari() {
  local dest=$1 pid t0=$SECONDS
  pid=$(cat "$LOGS/atari.pid" 2>/dev/null)
  # only the sweep this script started: its pid, still alive, still the atari sweep (ppo_atari.sh execs
  # benchmark/sweep.py ppo_atari, which passes SIGTERM to every run and waits for their checkpoints)
  if [[ ! -f $LOGS/atari.done && -n $pid ]] && kill -0 "$pid" 2>/dev/null &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -Eq 'ppo_atari\.sh|sweep\.py ppo_atari'; then
    echo "atari: stopping the sweep (pid $pid): each run finishes its iteration and writes checkpoint.pt"
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null && ((SECONDS - t0 < 420)); do sleep 1; done
    while [[ ! -f $LOGS/atari.done ]] && ((SECONDS - t0 < 425)); do sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && echo "atari: WARNING: the sweep still runs after $((SECONDS - t0)) s; copying anyway"
  fi
  [[ -f $LOGS/atari.done ]] && echo "atari: sweep ended, exit $(cat "$LOGS/atari.done")"
  tail -n 12 "$LOGS/atari.log"
  cp "$LOGS/atari.log" "$dest/"
  # one archive for the run folders and the sweep's per-run logs (atari/): a call brings back at most 8 files
  local dirs=(runs/ALE_*__ppo_atari__*) logs=()
  [[ -d $LOGS/atari ]] && logs=(-C "$LOGS" atari)
  [[ -e ${dirs[0]} ]] || dirs=()
  if ((${#dirs[@]} + ${#logs[@]})); then
    tar cf - "${dirs[@]}" "${logs[@]}" | split -b 15M - "$dest/atari.tar.part-"
    echo "atari: ${#dirs[@]} run folder(s) and the run logs (atari/) in $dest/atari.tar.part-*" \
      "(in the repo root: cat atari.tar.part-* | tar x)"
  else
    echo "atari: no runs/ALE_*__ppo_atari__* and no run logs to bring back"
  fi
}

while (($#)); do
  case $1 in
    env | ab | table | profile | tests | train) "step_$1" ;;
    wait | collect | stop | atari | before)
      if [[ -z ${2:-} ]]; then
        case $1 in
          wait) die "wait needs a number of seconds, e.g. wait 500" ;;
          atari) die "atari needs games, e.g. atari \"Breakout Pong\"" ;;
          before) die "before needs a commit, e.g. before c9316f8" ;;
          *) die "$1 needs a folder, e.g. $1 \"\$OUT\"" ;;
        esac
      fi
      "step_$1" "$2"
      shift
      ;;
    *)
      steps="env, before REF, ab, table, wait N, profile, tests, collect DIR, train, atari GAMES, stop DIR"
      die "unknown step '$1' ($steps)"
      ;;
  esac
  shift
done
