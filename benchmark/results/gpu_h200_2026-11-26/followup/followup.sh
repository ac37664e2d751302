#!/bin/bash
# One-off second call of the 2026-11-26 H200 lease: the five gpu tests that failed, after their fixes (-rP keeps the
# peaks and estimates they print); beast --subproc new, old, new; the MJX ceiling with float32 physics.
out=$1; gpu=${2:-true}; steps=${3:-98304}
timeout -s INT 65 python3 -m pytest -m gpu -p no:cacheprovider -q -rP -n 5 --dist load \
  "tests/test_gpu_scripts.py::test_ppo_continuous_preset_on_gpu[fast-paths]" \
  "tests/test_gpu_scripts.py::test_ppo_atari_on_gpu[fast-paths]" \
  "tests/test_dqn_snake_vec.py::test_fused_step_plays_the_same_games_as_the_dense_step[cuda-4096-10-10-20]" \
  "tests/test_gpu_scripts.py::test_dqn_snake_on_gpu[fast-paths]" \
  "tests/test_mjx_envs.py::test_on_a_gpu_results_stay_on_the_device_and_match_gymnasium" ${DRY:+--collect-only} \
  > "$out/pytest_rerun.txt" 2>&1
echo "pytest: exit $?"
i=0
for script in ppo_continuous.py .lease/before/ppo_continuous.py ppo_continuous.py; do
  i=$((i + 1))
  python3 benchmark/speed.py run "$script" --steps "$steps" --timeout 45 --out "$out/beast$i" \
    -- --env-id HalfCheetah-v5 --gpu "$gpu" --preset beast --subproc ${DRY:+--num-envs 2 --num-steps 8 --network-arch 8} \
    > "$out/beast$i.log" 2>&1
  echo "beast $i ($script): exit $?"
done
timeout 45 python3 benchmark/speed.py ceiling --only MJX --mjx-envs ${DRY:+16} ${DRY:-4096} --out "$out/mjx" > "$out/mjx.log" 2>&1
echo "mjx ceiling: exit $?"
