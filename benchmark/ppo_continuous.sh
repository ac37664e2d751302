#!/usr/bin/env bash
# Sweep ppo_continuous.py over MuJoCo envs x presets x seeds (docs/sweeps.md; --help lists the options).
exec bash "$(dirname "${BASH_SOURCE[0]}")/sweep.sh" ppo_continuous "$@"
