#!/usr/bin/env bash
# Sweep dqn_snake_vec.py over board sizes x numbers of parallel games x seeds, spread over the GPUs
# (see benchmark/common.sh).
#
#   benchmark/dqn_snake.sh --dry-run                                    # 10x10 and 20x20, 256 and 4096 games
#   benchmark/dqn_snake.sh --sizes "10 8x12" --num-envs "256 65536" --seeds "1 2" -- --total-timesteps 2000000
#
# A size is "N" (N x N board) or "HxW". Each num_envs value gets its own --exp-name (dqn_snake_vec_n256, ...)
# so benchmark/report.py keeps them apart; the board size is already in the run name (Snake10x10).
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SIZES="${SIZES:-10 20}"
NUM_ENVS="${NUM_ENVS:-256 4096}"

usage() {
  cat <<USAGE
usage: benchmark/dqn_snake.sh [--sizes "10 20x20"] [--num-envs "256 4096"] [common options] [-- script args]
  --sizes "..."      board sizes, N or HxW (env SIZES; default: $SIZES)
  --num-envs "..."   games stepped together per run (env NUM_ENVS; default: $NUM_ENVS)
USAGE
  sweep_common_help
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    --sizes | --num-envs)
      [[ $# -ge 2 ]] || sweep_die "$1 needs a value"
      if [[ "$1" == --sizes ]]; then SIZES="$2"; else NUM_ENVS="$2"; fi
      shift 2
      ;;
    *)
      sweep_parse_common "$@"
      shift "$SWEEP_SHIFT"
      ;;
  esac
done

for flag in --height --width --num-envs; do
  sweep_passthrough_has "$flag" && sweep_die "set board sizes and game counts with --sizes/--num-envs before --, not $flag after it"
done

for size in $SIZES; do
  if [[ "$size" =~ ^([0-9]+)x([0-9]+)$ ]]; then
    h="${BASH_REMATCH[1]}"
    w="${BASH_REMATCH[2]}"
  elif [[ "$size" =~ ^[0-9]+$ ]]; then
    h="$size"
    w="$size"
  else
    sweep_die "board size '$size' is not N or HxW (e.g. 10 or 8x12)"
  fi
  for n in $NUM_ENVS; do
    sweep_is_uint "$n" || sweep_die "num_envs '$n' is not a positive integer"
    name_args=()
    exp_name="$(sweep_passthrough_value --exp-name)"
    if [[ -z "$exp_name" ]]; then
      exp_name="dqn_snake_vec_n$n"
      name_args=(--exp-name "$exp_name")
    fi
    for seed in $SEEDS; do
      sweep_add "Snake${h}x${w} n=$n seed=$seed" "Snake${h}x${w}__${exp_name}__$seed" dqn_snake_vec.py \
        --height "$h" --width "$w" --num-envs "$n" \
        ${name_args[@]+"${name_args[@]}"} --seed "$seed"
    done
  done
done

sweep_run dqn_snake
