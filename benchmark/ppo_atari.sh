#!/usr/bin/env bash
# Sweep ppo_atari.py over ALE v5 games x seeds, spread over the GPUs. The engine is benchmark/sweep.py (--help lists
# every option; the queue, thread budgets, --resume-existing, signals and SLURM are there).
#
#   benchmark/ppo_atari.sh --dry-run                         # 8 games x 3 seeds, print commands only
#   benchmark/ppo_atari.sh --games "Breakout Pong" --seeds "1 2" -- --total-timesteps 2000000
#   ALL_GAMES=1 JOBS_PER_GPU=2 benchmark/ppo_atari.sh --track     # all 57 games, 2 runs per GPU
#   benchmark/ppo_atari.sh --all --slurm --partition gpu --gpus-per-run 1 --cpus-per-run 8 --time 24:00:00
#                                                            # 171 runs as one SLURM job array
#
# Each game's --gae-lambda comes from benchmark/atari_lambdas.csv (LAMBDA_CSV); `--gae-lambda X` (or GAE_LAMBDA)
# sets it for every game, and `--gae-lambda X` after `--` is used as given. Grid variables: GAMES, ALL_GAMES=1.
# The engine runs under SWEEP_PYTHON, else the repo's .venv/bin/python, else PYTHON (the runs' interpreter), else
# python3: it imports gpu_utils, so it needs torch.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${SWEEP_PYTHON:-}"
[[ -z $python && -x $root/.venv/bin/python ]] && python="$root/.venv/bin/python"
python="${python:-${PYTHON:-python3}}"
[[ $python == */* && $python != /* && ! -e $python ]] && python="$root/$python"  # relative to the repo root
exec "$python" "$root/benchmark/sweep.py" ppo_atari "$@"
