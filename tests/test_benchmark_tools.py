"""Tests for the GPU-session tools: benchmark/profile_atari.py (where an iteration's time goes) on a CPU at a tiny
size, and dev/gpu_check.sh's handling of its steps (its atari step runs the sweep engine's dry run for real).
Nothing here is timed."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

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


def test_gpu_check_refuses_an_unknown_step():
    res = subprocess.run(
        ["bash", os.path.join(ROOT, "dev", "gpu_check.sh"), "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LOGS": "/tmp/gpu_check_test"},
    )
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0
    assert "unknown step 'nope'" in res.stderr and "collect DIR" in res.stderr


# ---------------------------------------------------------------- gpu_check.sh atari / wait / stop
# The atari step writes into <repo>/runs/, so these tests run a throwaway copy of the scripts (the scripts find the
# repo root from their own location); nothing here trains or signals a process it did not start.
SCRIPTS = ["dev/gpu_check.sh", "benchmark/ppo_atari.sh", "benchmark/sweep.py", "benchmark/atari_lambdas.csv"]
SCRIPTS += ["gpu_utils.py", "run_utils.py"]  # the sweep engine imports them
BREAKOUT_RUN = "ALE_Breakout-v5__ppo_atari__1__123"
PONG_RUN = "ALE_Pong-v5__ppo_atari__1__50"


def _repo_copy(tmp_path):
    repo = tmp_path / "repo"
    for name in SCRIPTS:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), repo / name)
    return repo


def _gpu_check(repo, logs, *steps, **env):
    unset = {"JOBS_PER_GPU", "SEEDS", "ATARI_ARGS", "ATARI_DRY_RUN", "SWEEP_PYTHON", "CUDA_OFFSET"}
    base = {k: v for k, v in os.environ.items() if k not in unset}
    env = {**base, "LOGS": str(logs), "PYTHON": sys.executable, "NUM_GPUS": "1", **env}
    cmd = ["bash", str(repo / "dev" / "gpu_check.sh"), *steps]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_gpu_check_atari_dry_run_seeds_runs_and_shows_what_resumes(tmp_path):
    import torch

    repo, logs = _repo_copy(tmp_path), tmp_path / "logs"
    committed = repo / "benchmark" / "results" / "atari_gpu" / "runs"
    (committed / BREAKOUT_RUN).mkdir(parents=True)
    ckpt = {"model": {}, "args": {"total_timesteps": 10_000_000}, "status": "stopped", "global_step": 2_150_400}
    torch.save(ckpt, committed / BREAKOUT_RUN / "checkpoint.pt")
    (committed / BREAKOUT_RUN / "events.out.tfevents.1").write_text("events")
    (committed / PONG_RUN).mkdir()
    (committed / PONG_RUN / "note.txt").write_text("committed")
    (repo / "runs" / PONG_RUN).mkdir(parents=True)  # a run already here (say, from an earlier call) stays as it is
    (repo / "runs" / PONG_RUN / "note.txt").write_text("local")

    res = _gpu_check(repo, logs, "atari", "Breakout Pong", ATARI_DRY_RUN="1")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = res.stdout
    # (1) the committed run was copied, the one already in runs/ was not overwritten
    assert (repo / "runs" / BREAKOUT_RUN / "checkpoint.pt").read_bytes() == (
        committed / BREAKOUT_RUN / "checkpoint.pt"
    ).read_bytes()
    assert (repo / "runs" / BREAKOUT_RUN / "events.out.tfevents.1").read_text() == "events"
    assert (repo / "runs" / PONG_RUN / "note.txt").read_text() == "local"
    assert f"copied benchmark/results/atari_gpu/runs/{BREAKOUT_RUN}" in out and f"kept runs/{PONG_RUN}" in out
    # (2) the dry run: Breakout continues its checkpoint, Pong starts fresh, both with the GPU flags; 1 seed, 2 per GPU
    commands = [line for line in out.splitlines() if line.startswith("[session ")]
    assert len(commands) == 2, out
    breakout, pong = commands
    assert "--env-id ALE/Breakout-v5" in breakout and "--env-id ALE/Pong-v5" in pong
    assert f"--resume runs/{BREAKOUT_RUN}/checkpoint.pt" in breakout and "--resume" not in pong
    resume = "[resume 0] ALE/Breakout-v5 seed=1 lambda=0.70: stopped at step 2,150,400 of 10,000,000: "
    assert f"{resume}runs/{BREAKOUT_RUN}/checkpoint.pt" in out.splitlines(), out  # where it continues from
    for line in commands:
        assert "--seed 1" in line
        for flag in ["--compile", "--cudagraphs", "--save-model", "--no-progress-bar"]:
            assert f" {flag}" in line, (flag, line)
    assert "jobs_per_gpu=2" in out
    assert (logs / "atari_dry_run.txt").read_text().count("[session ") == 2
    # (3) ATARI_DRY_RUN=1: nothing started
    for name in ["atari.log", "atari.done", "atari.pid"]:
        assert not (logs / name).exists(), name
    assert not (logs / "atari").exists()


def test_gpu_check_atari_without_games_is_a_one_line_error(tmp_path):
    for steps in [["atari"], ["atari", ""]]:
        res = subprocess.run(
            ["bash", os.path.join(ROOT, "dev", "gpu_check.sh"), *steps],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "LOGS": str(tmp_path)},
        )
        assert res.returncode == 2 and res.stderr.strip().count("\n") == 0, res.stderr
        assert "atari needs games" in res.stderr and "unknown step" not in res.stderr


def test_gpu_check_wait_reports_every_started_job_and_each_runs_newest_iteration(tmp_path):
    logs = tmp_path / "logs"
    (logs / "atari").mkdir(parents=True)
    (logs / "table.log").write_text("table is measuring\n")  # started, no table.done: still running
    (logs / "atari.log").write_text("[sweep] summary\n")
    (logs / "atari.done").write_text("0\n")
    (logs / "atari" / "000_ALE_Breakout-v5_seed=1_lambda=0.70.log").write_text(
        "# slot 0: ppo_atari.py --env-id ALE/Breakout-v5\n"
        "iteration 10/1220: step 81920, SPS 5,000\n"
        "iteration 20/1220: step 163840, SPS 6,000\n"
        "episodic return 12\n"
    )
    (logs / "atari" / "001_ALE_Pong-v5_seed=1_lambda=0.95.log").write_text("# slot 1: ppo_atari.py\n")
    res = subprocess.run(
        ["bash", os.path.join(ROOT, "dev", "gpu_check.sh"), "wait", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LOGS": str(logs)},
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "table still running" in out and "atari finished, exit 0" in out
    assert "000_ALE_Breakout-v5_seed=1_lambda=0.70: iteration 20/1220: step 163840, SPS 6,000" in out
    assert "iteration 10/1220" not in out
    assert "001_ALE_Pong-v5_seed=1_lambda=0.95: no iteration line yet" in out


STUB_SWEEP = r"""#!/usr/bin/env bash
# a stand-in for benchmark/ppo_atari.sh: records how it was started, then runs until TERM (or 60 s)
if [[ " $* " == *" --dry-run "* ]]; then echo "[stub] dry run: $*"; exit 0; fi
mkdir -p "$LOG_DIR"
printf '%s\n' "JOBS_PER_GPU=$JOBS_PER_GPU" "SEEDS=$SEEDS" "PYTHON=$PYTHON" "LOG_DIR=$LOG_DIR" "$@" >"$LOG_DIR/args.txt"
echo "# slot 0: ppo_atari.py --env-id ALE/Breakout-v5" >"$LOG_DIR/000_ALE_Breakout-v5.log"
stop() {
  echo "iteration 30/1220: step 245760, SPS 7,000" >>"$LOG_DIR/000_ALE_Breakout-v5.log"
  echo "checkpoint" >"runs/ALE_Breakout-v5__ppo_atari__1__123/checkpoint.pt"
  echo "[stub] stopped"
  exit 130
}
trap stop TERM
echo "[stub] running"
for ((i = 0; i < 600; i++)); do sleep 0.1; done
"""


def test_gpu_check_atari_starts_the_sweep_detached_and_stop_brings_its_runs_back(tmp_path):
    repo, logs, dest = _repo_copy(tmp_path), tmp_path / "logs", tmp_path / "out"
    (repo / "benchmark" / "ppo_atari.sh").write_text(STUB_SWEEP)
    run = repo / "benchmark" / "results" / "atari_gpu" / "runs" / BREAKOUT_RUN
    run.mkdir(parents=True)
    big = os.urandom(1 << 20) * 17  # 17 MiB: two parts of at most 15 MiB
    (run / "events.out.tfevents.1").write_bytes(big)
    args = "--total-timesteps 10000000"
    try:
        res = _gpu_check(repo, logs, "atari", "Breakout", ATARI_ARGS=args)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert "[stub] dry run: --games Breakout --resume-existing --dry-run -- --compile" in res.stdout
        pid = int((logs / "atari.pid").read_text())
        for _ in range(100):
            if (logs / "atari" / "args.txt").exists() and "[stub] running" in (logs / "atari.log").read_text():
                break
            time.sleep(0.1)
        recorded = (logs / "atari" / "args.txt").read_text().splitlines()
        assert recorded == [
            "JOBS_PER_GPU=2",
            "SEEDS=1",
            f"PYTHON={sys.executable}",
            f"LOG_DIR={logs / 'atari'}",
            *"--games Breakout --resume-existing -- --compile --cudagraphs --save-model --no-progress-bar".split(),
            *args.split(),
        ]
        assert not (logs / "atari.done").exists()
        again = _gpu_check(repo, logs, "atari", "Breakout")
        assert again.returncode == 2 and "already running" in again.stderr

        res = _gpu_check(repo, logs, "stop", str(dest))
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    finally:  # never leave the stub running, whatever failed
        pid_file = logs / "atari.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text())
            try:
                if os.readlink(f"/proc/{pid}/cwd") == str(repo):
                    os.kill(pid, signal.SIGTERM)
            except (FileNotFoundError, ProcessLookupError):
                pass
    assert (logs / "atari.done").read_text().strip() == "130"
    assert "[stub] stopped" in (dest / "atari.log").read_text()
    parts = sorted(dest.glob("atari.tar.part-*"))
    assert len(parts) == 2 and all(p.stat().st_size <= 16 << 20 for p in parts), parts
    restore = tmp_path / "restore"
    restore.mkdir()
    subprocess.run(f"cat {dest}/atari.tar.part-* | tar xf -", shell=True, cwd=restore, check=True)
    assert (restore / "runs" / BREAKOUT_RUN / "checkpoint.pt").read_text() == "checkpoint\n"
    assert (restore / "runs" / BREAKOUT_RUN / "events.out.tfevents.1").read_bytes() == big
    assert "iteration 30/1220" in (restore / "atari" / "000_ALE_Breakout-v5.log").read_text()  # run logs in the tar
    assert sorted(p.name for p in dest.iterdir()) == ["atari.log", *(p.name for p in parts)]  # few files come back


def test_gpu_check_before_then_ab_runs_old_against_new(tmp_path):
    """`before REF` copies that commit's scripts into .ab/before (git-excluded, so only `carry` takes it to the GPU
    machine); `ab` starts speed.py ab on them, detached, and `wait` reports it."""
    repo = tmp_path / "repo"
    for name in ["dev/gpu_check.sh", "benchmark/speed.py", *speed_ab_scripts()]:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), repo / name)
    git = lambda *args: subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)  # noqa: E731
    assert git("init", "-q").returncode == 0
    git("add", ".")
    assert git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "old").returncode == 0
    old = git("rev-parse", "--short", "HEAD").stdout.strip()
    logs = tmp_path / "logs"
    res = _gpu_check(repo, logs, "ab")
    assert res.returncode == 2 and "run `dev/gpu_check.sh before REF` first" in res.stderr
    res = _gpu_check(repo, logs, "before", "no-such-ref")
    assert res.returncode == 2 and "before: 'no-such-ref' is not a commit here" in res.stderr
    res = _gpu_check(repo, logs, "before", "HEAD")
    assert res.returncode == 0, res.stderr
    assert (repo / ".ab" / "before" / "REF").read_text().strip() == old
    assert sorted(os.listdir(repo / ".ab" / "before")) == sorted(["REF", *speed_ab_scripts()])
    assert git("status", "--porcelain").stdout == ""  # excluded: it never enters a commit
    res = _gpu_check(repo, logs, "ab", "wait", "100", AB_ARGS="--force-cpu --dry-run --only ppo_atari/eager")
    assert res.returncode == 0, res.stderr
    assert "ab finished, exit 0" in res.stdout
    log = (logs / "ab.log").read_text()
    assert f"  before: python {repo}/.ab/before/ppo_atari.py --env-id ALE/Breakout-v5 --gpu false" in log


def speed_ab_scripts():
    sys.path.insert(0, os.path.join(ROOT, "benchmark"))
    try:
        import speed
    finally:
        sys.path.pop(0)
    return list(speed.AB_SCRIPTS)
