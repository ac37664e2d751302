#!/usr/bin/env bash
# Sweep ppo_atari.py over ALE v5 games x seeds (docs/sweeps.md; --help lists the options).
exec bash "$(dirname "${BASH_SOURCE[0]}")/sweep.sh" ppo_atari "$@"
