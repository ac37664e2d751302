"""Tests for benchmark/'s sweep scripts: --dry-run and scheduling (report.py and speed.py have their own files)."""

import os
import re
import shlex
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmark")
SESSION_RE = re.compile(r"^\[session (\d+)\] (cpu|cuda:\d+): (.*)$")


# ---------------------------------------------------------------- sweep scripts


def sweep(script, *args, env=None, check=True):
    full_env = {k: v for k, v in os.environ.items() if k not in ("CUDA_OFFSET", "CUDA_VISIBLE_DEVICES", "JOBS")}
    full_env.update({"NUM_GPUS": "2", "CUDA_OFFSET": "1", "JOBS_PER_GPU": "1", "PYTHON": "python"})
    full_env.update(env or {})
    res = subprocess.run(
        ["bash", os.path.join(BENCH, script), *args], capture_output=True, text=True, timeout=60, env=full_env
    )
    if check:
        assert res.returncode == 0, res.stderr
    return res


def sessions(res):
    out = []
    for line in res.stdout.splitlines():
        m = SESSION_RE.match(line)
        if m:
            out.append((int(m.group(1)), m.group(2), shlex.split(m.group(3))))
    return out


def flag(cmd, name):
    return cmd[cmd.index(name) + 1]


@pytest.mark.parametrize("script", ["ppo_atari.sh", "ppo_continuous.sh", "dqn_snake.sh"])
def test_dry_run_rotation_and_passthrough(script):
    res = sweep(script, "--dry-run", "--seeds", "1 2", "--", "--total-timesteps", "1000", "--foo=bar")
    runs = sessions(res)
    assert len(runs) >= 4
    assert [s for s, _, _ in runs] == list(range(len(runs)))
    sys.path.insert(0, ROOT)
    try:
        import gpu_utils
    finally:
        sys.path.remove(ROOT)
    for s, dev, cmd in runs:
        assert dev == f"cuda:{(1 + s) % 2}"  # (CUDA_OFFSET + session) % n_gpus
        assert dev == f"cuda:{gpu_utils.rotate(s, 1, 2)}"  # the placement the script itself will pick
        assert cmd[0] == "python"
        assert int(flag(cmd, "--session")) == s
        assert flag(cmd, "--cuda-offset") == "1"
        assert cmd[-3:] == ["--total-timesteps", "1000", "--foo=bar"]
        assert "--track" not in cmd
    assert "dry run: nothing was started" in res.stdout
    assert "gpus=2" in res.stdout and "up to 2 at once" in res.stdout
    res = sweep(script, "--dry-run", "--seeds", "1", "--track", env={"JOBS_PER_GPU": "3", "CUDA_OFFSET": "0"})
    assert "up to 6 at once" in res.stdout
    runs = sessions(res)
    assert all("--track" in cmd for _, _, cmd in runs)
    assert [dev for s, dev, _ in runs] == [f"cuda:{s % 2}" for s in range(len(runs))]


def test_dry_run_cpu_only():
    res = sweep("dqn_snake.sh", "--dry-run", "--seeds", "1", env={"NUM_GPUS": "0", "JOBS": "2"})
    assert "up to 2 at once" in res.stdout
    assert {dev for _, dev, _ in sessions(res)} == {"cpu"}
    res = sweep("dqn_snake.sh", "--dry-run", "--seeds", "1", "--", "--gpu", "false")
    assert {dev for _, dev, _ in sessions(res)} == {"cpu"}


def test_atari_lambda_lookup():
    runs = sessions(sweep("ppo_atari.sh", "--dry-run", "--seeds", "1"))
    lam = {flag(c, "--env-id"): flag(c, "--gae-lambda") for _, _, c in runs}
    assert len(lam) == 8
    assert lam["ALE/Breakout-v5"] == "0.70" and lam["ALE/Pong-v5"] == "0.85"
    assert lam["ALE/Qbert-v5"] == "0.95" and lam["ALE/MsPacman-v5"] == "0.85"
    assert lam["ALE/Enduro-v5"] == "0.95"
    # overrides: a sweep flag sets every game, a pass-through flag is used as given (no second --gae-lambda)
    runs = sessions(sweep("ppo_atari.sh", "--dry-run", "--seeds", "1", "--gae-lambda", "0.8"))
    assert {flag(c, "--gae-lambda") for _, _, c in runs} == {"0.8"}
    runs = sessions(sweep("ppo_atari.sh", "--dry-run", "--games", "Breakout", "--", "--gae-lambda", "0.5"))
    assert all(c.count("--gae-lambda") == 1 and flag(c, "--gae-lambda") == "0.5" for _, _, c in runs)
    runs = sessions(sweep("ppo_atari.sh", "--dry-run", "--all", "--seeds", "1"))
    assert len(runs) == 57


def test_atari_lambda_table():
    import csv

    with open(os.path.join(BENCH, "atari_lambdas.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 57 and len({r["game"] for r in rows}) == 57
    assert all(0 <= float(r["gae_lambda"]) <= 1 and r["status"] in ("published", "default") for r in rows)
    assert all(r["gae_lambda"] == "0.95" for r in rows if r["status"] == "default")


def test_sweep_names_and_grid():
    runs = sessions(sweep("ppo_continuous.sh", "--dry-run", "--envs", "Hopper-v5", "--presets", "default heavy"))
    assert len(runs) == 6
    names = [flag(c, "--exp-name") for _, _, c in runs]
    assert names == ["ppo_continuous"] * 3 + ["ppo_continuous_heavy"] * 3
    assert [c.count("--preset") for _, _, c in runs] == [0, 0, 0, 1, 1, 1]
    runs = sessions(sweep("dqn_snake.sh", "--dry-run", "--sizes", "10 8x12", "--num-envs", "64", "--seeds", "1"))
    assert [(flag(c, "--height"), flag(c, "--width")) for _, _, c in runs] == [("10", "10"), ("8", "12")]
    assert {flag(c, "--exp-name") for _, _, c in runs} == {"dqn_snake_vec_n64"}


def test_sweep_bad_input():
    res = sweep("ppo_atari.sh", "--dry-run", "--bogus", check=False)
    assert res.returncode == 2 and res.stderr.startswith("error: unknown option '--bogus'")
    res = sweep("dqn_snake.sh", "--dry-run", "--sizes", "ten", check=False)
    assert res.returncode == 2 and "board size" in res.stderr
    res = sweep("ppo_continuous.sh", "--dry-run", env={"JOBS_PER_GPU": "0"}, check=False)
    assert res.returncode == 2 and "JOBS_PER_GPU" in res.stderr


FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for python: records start/end per session, fails session 3
s=""; prev=""
for a in "$@"; do [[ "$prev" == --session ]] && s="$a"; prev="$a"; done
echo "start $s $(date +%s.%N)" >> "$FAKE_LOG"
sleep 0.4
echo "end $s $(date +%s.%N)" >> "$FAKE_LOG"
[[ "$s" == 3 ]] && { echo "boom" >&2; exit 3; }
exit 0
"""


def test_sweep_runs_jobs_per_gpu_and_failures(tmp_path):
    fake = tmp_path / "fakepython"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / "fake.log"
    env = {"PYTHON": str(fake), "FAKE_LOG": str(log), "JOBS_PER_GPU": "2", "LOG_DIR": str(tmp_path / "logs")}
    res = sweep("dqn_snake.sh", "--sizes", "10", "--num-envs", "8", "--seeds", "1 2 3 4 5 6 7 8", env=env, check=False)
    assert res.returncode == 1, res.stdout + res.stderr
    events = [line.split() for line in log.read_text().splitlines()]
    start = {int(s): float(t) for kind, s, t in events if kind == "start"}
    end = {int(s): float(t) for kind, s, t in events if kind == "end"}
    assert sorted(start) == list(range(8)) and sorted(end) == list(range(8))  # the failure did not stop the sweep
    for gpu in (0, 1):
        mine = [s for s in range(8) if (1 + s) % 2 == gpu]
        peak = max(sum(start[o] <= start[s] < end[o] for o in mine) for s in mine)
        assert peak == 2, (gpu, start, end)  # JOBS_PER_GPU=2: two at once per GPU, never more
    summary = (tmp_path / "logs" / "summary.txt").read_text()
    assert "7 ok, 1 failed" in summary
    assert "FAILED (rc=3) [session 3] cuda:0 Snake10x10 n=8 seed=4" in summary
    assert "FAILED" in res.stdout
    failed_log = [p for p in (tmp_path / "logs").iterdir() if p.name.startswith("003_")][0]
    assert "boom" in failed_log.read_text()
