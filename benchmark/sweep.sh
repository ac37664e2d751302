#!/usr/bin/env bash
# The wrappers' launcher: benchmark/sweep.py under SWEEP_PYTHON, else .venv/bin/python, else PYTHON, else python3.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${SWEEP_PYTHON:-$root/.venv/bin/python}"
[[ -x $python ]] || python="${PYTHON:-python3}"
exec "$python" "$root/benchmark/sweep.py" "$@"
