#!/usr/bin/env bash
# Sweep dqn_snake_vec.py over board sizes x numbers of games x seeds (docs/sweeps.md; --help lists the options).
exec bash "$(dirname "${BASH_SOURCE[0]}")/sweep.sh" dqn_snake "$@"
