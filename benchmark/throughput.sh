#!/usr/bin/env bash
# The throughput table of this machine: `python benchmark/speed.py table` (see its --help), written to
# benchmark/results/throughput_<profile>_<host>_<date>.md. The profile is gpu when CUDA is present, else cpu.
#
#   benchmark/throughput.sh                              # a few minutes on a 2-core CPU machine
#   benchmark/throughput.sh --profile gpu                # the one-GPU table with its targets (about 8 minutes)
#   BUDGET_SCALE=0.5 benchmark/throughput.sh --note "other jobs running"
#
# Knobs: BUDGET_SCALE (multiplies every run's step budget, default 1), RUN_TIMEOUT (seconds before a run is
# stopped, default 240), HOST_LABEL (machine name in the file name), PYTHON. Other arguments go to speed.py table.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
exec "$PYTHON" benchmark/speed.py table --scale "${BUDGET_SCALE:-1}" --timeout "${RUN_TIMEOUT:-240}" "$@"
