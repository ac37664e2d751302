"""Tests for benchmark/profile_atari.py (where a ppo_atari.py iteration's time goes) on a CPU at a tiny size, and its
one-line errors (its --script-paths runs in tests/test_gpu_lease.py's dry run). Nothing here is timed."""

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
        assert re.search(re.escape(phase) + r".* \| [\d.]+ \|", text), phase
    # one prediction per (rollout, update) pair: 2 rollouts x 1 update on a CPU without compile
    predictions = re.findall(r"^\| eager(?:, 2 halves)? \| eager, Adam foreach \| ([\d,]+) \|", text, re.M)
    assert len(predictions) == 2 and all(int(p.replace(",", "")) > 0 for p in predictions)


def test_profile_atari_bad_options_are_one_line_errors():
    """--num-envs 0 crashed ale-py with a segmentation fault and --repeats 0 ended in a traceback."""
    script = os.path.join(ROOT, "benchmark", "profile_atari.py")
    for args, words in [
        (["--num-envs", "0"], "--num-envs must be at least 2"),
        (["--host-only", "--repeats", "0"], "--repeats must be at least 1"),
    ]:
        res = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2, res.stdout + res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], res.stderr
