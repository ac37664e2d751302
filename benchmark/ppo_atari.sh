#!/usr/bin/env bash
# Sweep ppo_atari.py over ALE v5 games x seeds, spread over the GPUs (see benchmark/common.sh).
#
#   benchmark/ppo_atari.sh --dry-run                         # 8 games x 3 seeds, print commands only
#   benchmark/ppo_atari.sh --games "Breakout Pong" --seeds "1 2" -- --total-timesteps 2000000
#   ALL_GAMES=1 JOBS_PER_GPU=2 benchmark/ppo_atari.sh --track     # all 57 games, 2 runs per GPU
#   benchmark/ppo_atari.sh --all --slurm --partition gpu --gpus-per-run 1 --cpus-per-run 8 --time 24:00:00
#                                                            # 171 runs as one SLURM job array
#
# Each game's --gae-lambda comes from benchmark/atari_lambdas.csv; `--gae-lambda X` after `--` (or the
# GAE_LAMBDA variable) overrides it for every game.
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DEFAULT_GAMES="Breakout Pong Qbert MsPacman Seaquest SpaceInvaders BeamRider Enduro"
GAMES="${GAMES:-}"
ALL_GAMES="${ALL_GAMES:-0}"
GAE_LAMBDA="${GAE_LAMBDA:-}"
LAMBDA_CSV="${LAMBDA_CSV:-$SWEEP_REPO_ROOT/benchmark/atari_lambdas.csv}"

usage() {
  cat <<EOF
usage: benchmark/ppo_atari.sh [--games "G1 G2"] [--all] [common options] [-- ppo_atari.py args]
  --games "..."   games by ALE name without prefix/suffix (env GAMES; default: $DEFAULT_GAMES)
  --all           all 57 games in benchmark/atari_lambdas.csv (env ALL_GAMES=1)
  --gae-lambda X  same lambda for every game instead of the per-game table (env GAE_LAMBDA)
EOF
  sweep_common_help
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    --games)
      [[ $# -ge 2 ]] || sweep_die "--games needs a value"
      GAMES="$2"
      shift 2
      ;;
    --all)
      ALL_GAMES=1
      shift
      ;;
    --gae-lambda)
      [[ $# -ge 2 ]] || sweep_die "--gae-lambda needs a value"
      GAE_LAMBDA="$2"
      shift 2
      ;;
    *)
      sweep_parse_common "$@"
      shift "$SWEEP_SHIFT"
      ;;
  esac
done

[[ -f "$LAMBDA_CSV" ]] || sweep_die "lambda table $LAMBDA_CSV not found"

csv_lambda() { awk -F, -v g="$1" 'NR > 1 && $1 == g { print $2; exit }' "$LAMBDA_CSV"; }

if [[ -z "$GAMES" ]]; then
  if [[ "$ALL_GAMES" == 1 ]]; then
    GAMES="$(awk -F, 'NR > 1 && $1 != "" { printf "%s ", $1 }' "$LAMBDA_CSV")"
  else
    GAMES="$DEFAULT_GAMES"
  fi
fi
if sweep_passthrough_has --gae-lambda; then
  GAE_LAMBDA="" # the pass-through value is used as given
fi
sweep_passthrough_has --env-id && sweep_die "choose games with --games before --, not --env-id after it"
EXP_NAME="$(sweep_passthrough_value --exp-name)"
EXP_NAME="${EXP_NAME:-ppo_atari}" # the script's default, the second part of its run names

for game in $GAMES; do
  game="${game#ALE/}"
  game="${game%-v5}"
  lam_args=()
  lam_note="lambda=as-passed"
  if ! sweep_passthrough_has --gae-lambda; then
    if [[ -n "$GAE_LAMBDA" ]]; then
      lam="$GAE_LAMBDA"
      lam_note="lambda=$lam"
    else
      lam="$(csv_lambda "$game")"
      if [[ -z "$lam" ]]; then
        lam=0.95
        echo "[sweep] note: $game is not in $(basename "$LAMBDA_CSV"); using lambda 0.95" >&2
      fi
      lam_note="lambda=$lam"
    fi
    lam_args=(--gae-lambda "$lam")
  fi
  for seed in $SEEDS; do
    sweep_add "ALE/${game}-v5 seed=$seed $lam_note" "ALE_${game}-v5__${EXP_NAME}__$seed" ppo_atari.py \
      --env-id "ALE/${game}-v5" \
      ${lam_args[@]+"${lam_args[@]}"} --seed "$seed"
  done
done

sweep_run ppo_atari
