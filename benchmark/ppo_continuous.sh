#!/usr/bin/env bash
# Sweep ppo_continuous.py over MuJoCo envs x presets x seeds (docs/sweeps.md; --help lists the options).
# The engine, benchmark/sweep.py, runs under SWEEP_PYTHON, else .venv/bin/python, else PYTHON, else python3.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${SWEEP_PYTHON:-$root/.venv/bin/python}"
[[ -x $python ]] || python="${PYTHON:-python3}"
exec "$python" "$root/benchmark/sweep.py" ppo_continuous "$@"
