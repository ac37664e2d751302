#!/usr/bin/env bash
# The GPU checks of this project on one GPU machine, in steps that each fit a short remote call. Logs and tables go
# to $LOGS (default /tmp/gpu_check); `collect DIR` copies them out. Steps run in the order given:
#
#   benchmark/gpu_check.sh env              # GPU, CPU, compiler and Python headers (torch.compile needs both)
#   benchmark/gpu_check.sh table            # the one-GPU throughput table, started detached (it outlives the call)
#   benchmark/gpu_check.sh wait 500         # wait for the detached table, at most 500 s
#   benchmark/gpu_check.sh profile tests    # benchmark/profile_atari.py, then pytest -m gpu
#   benchmark/gpu_check.sh collect "$OUT"   # copy logs and tables to a folder
#   benchmark/gpu_check.sh train            # start a full ppo_atari.py run detached (RUN_ARGS; default Breakout)
#   benchmark/gpu_check.sh stop "$OUT"      # stop it (SIGTERM: it writes checkpoint.pt), bring back its run folder
#                                           # as 15 MiB parts: cat run.tar.part-* | tar x; then --resume it
#
# Knobs: LOGS, PYTHON (default python3), TABLE_ARGS (extra arguments for `speed.py table`), TEST_WORKERS (pytest-xdist
# workers for `tests`, default 4; 0 runs them one by one), RUN_ARGS (ppo_atari.py arguments for `train`).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
LOGS=${LOGS:-/tmp/gpu_check}
PY=${PYTHON:-python3}
[[ $PY == */* && $PY != /* ]] && PY=$PWD/$PY  # steps may run from another folder
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 WANDB_MODE=${WANDB_MODE:-offline}
export MUJOCO_GL=disable  # nothing here renders, and "egl" without libEGL (as on the GPU machine) breaks import mujoco

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

step_table() {  # detached: setsid puts it in its own session, so it runs on after the call that started it returns
  rm -f "$LOGS/table.done"
  # shellcheck disable=SC2086
  setsid nohup bash -c "$PY benchmark/speed.py table --profile gpu --out '$LOGS' --host gpu ${TABLE_ARGS:-} \
    >'$LOGS/table.log' 2>&1; echo \$? >'$LOGS/table.done'" >/dev/null 2>&1 < /dev/null &
  echo "table started (pid $!), log $LOGS/table.log"
}

step_wait() {
  local limit=$1 t0=$SECONDS
  while [[ ! -f $LOGS/table.done ]] && ((SECONDS - t0 < limit)); do sleep 5; done
  if [[ -f $LOGS/table.done ]]; then echo "table finished, exit $(cat "$LOGS/table.done")"; else echo "table still running"; fi
  tail -n 5 "$LOGS/table.log"
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

step_stop() {
  local dest=$1 pid
  pid=$(pgrep -f "ppo_atari.py --no-progress-bar" | head -1)
  if [[ -n $pid ]]; then
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 1; done  # it finishes the iteration and writes checkpoint.pt
  fi
  tail -n 4 "$LOGS/train.log"
  mkdir -p "$dest"
  cp "$LOGS/train.log" "$dest/"
  (cd "$LOGS/train" && tar cf - runs | split -b 15M - "$dest/run.tar.part-")
  ls -la "$dest"
}

while (($#)); do
  case $1 in
    env | table | profile | tests | train) "step_$1" ;;
    wait) step_wait "${2:?wait needs a number of seconds}"; shift ;;
    collect) step_collect "${2:?collect needs a folder}"; shift ;;
    stop) step_stop "${2:?stop needs a folder}"; shift ;;
    *) echo "error: unknown step '$1' (env, table, wait N, profile, tests, collect DIR, train, stop DIR)" >&2; exit 2 ;;
  esac
  shift
done
