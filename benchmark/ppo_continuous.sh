#!/usr/bin/env bash
# Sweep ppo_continuous.py over MuJoCo v5 envs x presets x seeds, spread over the GPUs. The engine is
# benchmark/sweep.py (--help lists every option; the queue, thread budgets, --resume-existing, signals and SLURM).
#
#   benchmark/ppo_continuous.sh --dry-run                               # 6 envs x 4 settings x 3 seeds
#   benchmark/ppo_continuous.sh --envs "HalfCheetah-v5" --presets "default heavy" -- --total-timesteps 1000000
#   ALL_ENVS=1 JOBS_PER_GPU=4 benchmark/ppo_continuous.sh --presets beast --track
#
# Preset "default" runs the script's own defaults (no --preset flag). Each setting gets its own --exp-name
# (ppo_continuous, ppo_continuous_fast, ...) so benchmark/report.py keeps them apart. Grid variables: ENVS,
# ALL_ENVS=1, PRESETS. The engine's interpreter: SWEEP_PYTHON, else .venv/bin/python, else PYTHON, else python3.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${SWEEP_PYTHON:-}"
[[ -z $python && -x $root/.venv/bin/python ]] && python="$root/.venv/bin/python"
python="${python:-${PYTHON:-python3}}"
[[ $python == */* && $python != /* && ! -e $python ]] && python="$root/$python"  # relative to the repo root
exec "$python" "$root/benchmark/sweep.py" ppo_continuous "$@"
