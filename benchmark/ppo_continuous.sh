#!/usr/bin/env bash
# Sweep ppo_continuous.py over MuJoCo v5 envs x presets x seeds, spread over the GPUs (see benchmark/common.sh).
#
#   benchmark/ppo_continuous.sh --dry-run                               # 6 envs x 4 settings x 3 seeds
#   benchmark/ppo_continuous.sh --envs "HalfCheetah-v5" --presets "default heavy" -- --total-timesteps 1000000
#   ALL_ENVS=1 JOBS_PER_GPU=4 benchmark/ppo_continuous.sh --presets beast --track
#
# Preset "default" runs the script's own defaults (no --preset flag). Each setting gets its own
# --exp-name (ppo_continuous, ppo_continuous_fast, ...) so benchmark/report.py keeps them apart.
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DEFAULT_ENVS="HalfCheetah-v5 Hopper-v5 Walker2d-v5 Ant-v5 Humanoid-v5 InvertedPendulum-v5"
MORE_ENVS="Swimmer-v5 Reacher-v5 Pusher-v5 InvertedDoublePendulum-v5 HumanoidStandup-v5"
ENVS="${ENVS:-}"
ALL_ENVS="${ALL_ENVS:-0}"
PRESETS="${PRESETS:-default fast heavy beast}"

usage() {
  cat <<USAGE
usage: benchmark/ppo_continuous.sh [--envs "E1 E2"] [--all] [--presets "P1 P2"] [common options] [-- script args]
  --envs "..."     gymnasium env ids (env ENVS; default: $DEFAULT_ENVS)
  --all            also $MORE_ENVS (env ALL_ENVS=1)
  --presets "..."  any of: default fast heavy beast (env PRESETS; default: $PRESETS)
USAGE
  sweep_common_help
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    --envs | --presets)
      [[ $# -ge 2 ]] || sweep_die "$1 needs a value"
      if [[ "$1" == --envs ]]; then ENVS="$2"; else PRESETS="$2"; fi
      shift 2
      ;;
    --all)
      ALL_ENVS=1
      shift
      ;;
    *)
      sweep_parse_common "$@"
      shift "$SWEEP_SHIFT"
      ;;
  esac
done

if [[ -z "$ENVS" ]]; then
  ENVS="$DEFAULT_ENVS"
  [[ "$ALL_ENVS" == 1 ]] && ENVS="$ENVS $MORE_ENVS"
fi
sweep_passthrough_has --preset && sweep_die "choose presets with --presets before --, not --preset after it"
sweep_passthrough_has --env-id && sweep_die "choose envs with --envs before --, not --env-id after it"

for env_id in $ENVS; do
  for preset in $PRESETS; do
    case "$preset" in
      default) preset_args=() ;;
      fast | heavy | beast) preset_args=(--preset "$preset") ;;
      *) sweep_die "unknown preset '$preset' (use default, fast, heavy or beast)" ;;
    esac
    exp_name="$(sweep_passthrough_value --exp-name)"
    if [[ -z "$exp_name" ]]; then
      exp_name=ppo_continuous
      [[ "$preset" == default ]] || exp_name="ppo_continuous_$preset"
      preset_args+=(--exp-name "$exp_name")
    fi
    for seed in $SEEDS; do
      sweep_add "$env_id $preset seed=$seed" "${env_id//\//_}__${exp_name}__$seed" ppo_continuous.py --env-id "$env_id" \
        ${preset_args[@]+"${preset_args[@]}"} --seed "$seed"
    done
  done
done

sweep_run ppo_continuous
