#!/usr/bin/env bash
# Sweep dqn_snake_vec.py over board sizes x numbers of parallel games x seeds, spread over the GPUs. The engine is
# benchmark/sweep.py (--help lists every option; the queue, thread budgets, --resume-existing, signals and SLURM).
#
#   benchmark/dqn_snake.sh --dry-run                                    # 10x10 and 20x20, 256 and 4096 games
#   benchmark/dqn_snake.sh --sizes "10 8x12" --num-envs "256 65536" --seeds "1 2" -- --total-timesteps 2000000
#
# A size is "N" (N x N board) or "HxW". Each num_envs value gets its own --exp-name (dqn_snake_vec_n256, ...) so
# benchmark/report.py keeps them apart; the board size is already in the run name (Snake10x10). Grid variables:
# SIZES, NUM_ENVS. The engine's interpreter: SWEEP_PYTHON, else .venv/bin/python, else PYTHON, else python3.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${SWEEP_PYTHON:-}"
[[ -z $python && -x $root/.venv/bin/python ]] && python="$root/.venv/bin/python"
python="${python:-${PYTHON:-python3}}"
[[ $python == */* && $python != /* && ! -e $python ]] && python="$root/$python"  # relative to the repo root
exec "$python" "$root/benchmark/sweep.py" dqn_snake "$@"
