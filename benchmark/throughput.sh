#!/usr/bin/env bash
# Measure steady-state SPS of ppo_atari.py, ppo_continuous.py and dqn_snake_vec.py (defaults and one heavier
# setting each) and the raw env ceilings, and write benchmark/results/throughput_<host>_<date>.md.
#
#   benchmark/throughput.sh                         # a few minutes on a 2-core CPU machine
#   BUDGET_SCALE=10 benchmark/throughput.sh         # 10x the step budgets (GPU machines)
#   benchmark/throughput.sh --only ceilings --note "measured while other jobs ran"
#
# Knobs: BUDGET_SCALE (multiplies each run's step budget, default 1), RUN_TIMEOUT (seconds before a run is
# stopped, default 240), CEILING_SECONDS (per ceiling, default 5), HOST_LABEL (machine name in the file name),
# PYTHON. Any other arguments go to benchmark/throughput.py (see --help there).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
exec "$PYTHON" benchmark/throughput.py --scale "${BUDGET_SCALE:-1}" --timeout "${RUN_TIMEOUT:-240}" \
  --ceiling-seconds "${CEILING_SECONDS:-5}" "$@"
