#!/usr/bin/env bash
# Sweep dqn_snake_vec.py over board sizes x numbers of games x seeds (docs/sweeps.md; --help lists the options).
# The engine, benchmark/sweep.py, runs under SWEEP_PYTHON, else .venv/bin/python, else PYTHON, else python3.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${SWEEP_PYTHON:-$root/.venv/bin/python}"
[[ -x $python ]] || python="${PYTHON:-python3}"
exec "$python" "$root/benchmark/sweep.py" dqn_snake "$@"
