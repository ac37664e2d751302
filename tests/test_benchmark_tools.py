"""Tests for the GPU-session tools: benchmark/profile_atari.py (where an iteration's time goes) on a CPU at a tiny
size, and benchmark/gpu_check.sh's handling of its steps. Nothing here is timed."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_profile_atari_times_every_phase_and_predicts_sps(tmp_path):
    args = ["--device", "cpu", "--no-compile", "--num-envs", 2, "--num-steps", 8, "--minibatch-size", 8]
    cmd = [sys.executable, os.path.join(ROOT, "benchmark", "profile_atari.py"), *map(str, args)]
    cmd += ["--steps", "12", "--iterations", "2", "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    text = (tmp_path / "profile_atari_cpu.md").read_text()
    for phase in [
        "env: AtariVectorEnv.step, 2 envs",
        "policy (eager)",
        "rollout, sequential (eager)",
        "rollout, 2 overlapped halves of 1 envs (eager)",
        "update (eager, Adam foreach), 2 x 4 minibatches",
    ]:
        assert re.search(re.escape(phase) + r".* \| [\d.]+ \|", text), phase  # fmt: skip
    # one prediction per (rollout, update) pair: 2 rollouts x 1 update on a CPU without compile
    predictions = re.findall(r"^\| eager(?:, 2 halves)? \| eager, Adam foreach \| ([\d,]+) \|", text, re.M)
    assert len(predictions) == 2 and all(int(p.replace(",", "")) > 0 for p in predictions)


def test_gpu_check_refuses_an_unknown_step():
    res = subprocess.run(["bash", os.path.join(ROOT, "benchmark", "gpu_check.sh"), "nope"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "LOGS": "/tmp/gpu_check_test"})  # fmt: skip
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0
    assert "unknown step 'nope'" in res.stderr and "collect DIR" in res.stderr
