"""Tests for the sweep scripts (benchmark/ppo_atari.sh, ppo_continuous.sh, dqn_snake.sh and benchmark/common.sh):
--dry-run placement and thread budgets, the local job queue, --resume-existing, and the SLURM job-array script
(run here without SLURM; tests/test_slurm.py submits it to a live cluster)."""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys

import pytest
from helpers import wait_for

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmark")
SESSION_RE = re.compile(r"^\[session (\d+)\] (cpu|cuda:\d+): (.*)$")
# variables a sweep sets itself; a test must not inherit them from the shell that runs pytest
SWEEP_ENV = ("CUDA_OFFSET", "CUDA_VISIBLE_DEVICES", "JOBS", "JOBS_PER_GPU", "SWEEP_CPUS", "CPUS_PER_RUN", "SEEDS")
SWEEP_ENV += ("LOG_DIR", "NUM_GPUS", "RESUME_EXISTING", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
LINUX_AFFINITY = hasattr(os, "sched_getaffinity") and os.path.exists("/proc/self/status")


def taskset_works():
    if shutil.which("taskset") is None or not LINUX_AFFINITY:
        return False
    cpu = str(min(os.sched_getaffinity(0)))
    return subprocess.run(["taskset", "-c", cpu, "true"], capture_output=True).returncode == 0


PIN = taskset_works()


def sweep_env(env=None):
    full = {k: v for k, v in os.environ.items() if k not in SWEEP_ENV and not k.startswith("SLURM_")}
    full.update({"NUM_GPUS": "2", "CUDA_OFFSET": "1", "JOBS_PER_GPU": "1", "PYTHON": "python"})
    full.update(env or {})
    return full


def sweep(script, *args, env=None, check=True, repo=ROOT, timeout=60):
    cmd = ["bash", os.path.join(repo, "benchmark", script), *map(str, args)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=sweep_env(env), cwd=repo)
    if check:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


def split_prefix(words):
    """'OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 taskset -c 0-1 python x.py' -> ({OMP..., MKL...}, '0-1', [python, x.py])."""
    env = {}
    while words and re.match(r"^[A-Z_]+=", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    cpus = None
    if words and words[0] == "taskset":
        assert words[1] == "-c"
        cpus, words = words[2], words[3:]
    return env, cpus, words


def sessions(res):
    """(session, device, command without the thread prefix) of every run a --dry-run prints."""
    return [(s, dev, cmd) for s, dev, _env, _cpus, cmd in dry_runs(res)]


def dry_runs(res):
    out = []
    for line in res.stdout.splitlines():
        m = SESSION_RE.match(line)
        if m:
            env, cpus, cmd = split_prefix(shlex.split(m.group(3)))
            out.append((int(m.group(1)), m.group(2), env, cpus, cmd))
    return out


def flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def cpu_set(text):
    """'0-2,5' -> {0, 1, 2, 5}"""
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def mini_repo(dest):
    """Copy the scripts and benchmark/ to dest, whose runs/ then holds only this test's runs (for --resume-existing)."""
    for name in ("ppo_atari.py", "ppo_continuous.py", "dqn_snake_vec.py", "gpu_utils.py"):
        shutil.copy(os.path.join(ROOT, name), dest)
    shutil.copytree(BENCH, dest / "benchmark", ignore=shutil.ignore_patterns("results", "__pycache__"))
    return dest


def fake_checkpoint(repo, run_id, status, step, total, stamp=1700000000):
    """A checkpoint.pt as the training scripts write it (only the keys --resume-existing reads)."""
    run_dir = repo / "runs" / f"{run_id}__{stamp}"
    run_dir.mkdir(parents=True)
    ckpt = {"args": {"total_timesteps": total}, "status": status, "global_step": step, "run_name": run_dir.name}
    torch.save(ckpt, run_dir / "checkpoint.pt")
    return run_dir


def load_checkpoint(path):
    return torch.load(path, map_location="cpu", weights_only=False)


# ---------------------------------------------------------------- local mode: placement and pass-through


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
    # pass-through flags that would turn every run of the sweep into the same run
    for script, args, hint in [
        ("ppo_atari.sh", ["--", "--seed", "3"], "--seeds"),
        ("dqn_snake.sh", ["--", "--resume", "x.pt"], "--resume-existing"),
        ("ppo_atari.sh", ["--", "--env-id", "ALE/Pong-v5"], "--games"),
        ("ppo_continuous.sh", ["--", "--env-id=Hopper-v5"], "--envs"),
    ]:
        res = sweep(script, "--dry-run", *args, check=False)
        assert res.returncode == 2 and res.stderr.startswith("error: ") and hint in res.stderr, res.stderr
        assert res.stderr.count("\n") == 1


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


# ---------------------------------------------------------------- local mode: thread budget


def budgets(res):
    return {s: (env, cpus) for s, _dev, env, cpus, _cmd in dry_runs(res)}


def test_dry_run_thread_budget_cpu_machine():
    # 8 CPUs, no GPU, 3 runs at once: 2 CPUs each; slots 0, 1, 2 then slot 0 again (runs ending in start order)
    env = {"NUM_GPUS": "0", "JOBS": "3", "SWEEP_CPUS": "0-7"}
    res = sweep("ppo_atari.sh", "--dry-run", "--games", "Pong Breakout", "--seeds", "1 2", env=env)
    b = budgets(res)
    assert len(b) == 4
    assert all(e == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"} for e, _ in b.values())
    assert "8 CPUs (0-7) for 3 runs at once -> 2 per run" in res.stdout
    if PIN:
        assert [b[s][1] for s in range(4)] == ["0-1", "2-3", "4-5", "0-1"]
        assert "pinned with taskset" in res.stdout
    else:
        assert all(cpus is None for _, cpus in b.values()) and "not pinned" in res.stdout
    # an explicit budget wins; a CPU list with holes is used in its order
    res = sweep("dqn_snake.sh", "--dry-run", "--seeds", "1", "--cpus-per-run", "3", env={**env, "JOBS": "2"})
    b = budgets(res)
    assert {e["OMP_NUM_THREADS"] for e, _ in b.values()} == {"3"}
    if PIN:
        assert [b[s][1] for s in range(2)] == ["0-2", "3-5"]
    res = sweep("dqn_snake.sh", "--dry-run", "--seeds", "1", env={**env, "JOBS": "2", "SWEEP_CPUS": "0,2,4,6"})
    if PIN:
        assert [budgets(res)[s][1] for s in range(2)] == ["0,2", "4,6"]


def test_dry_run_thread_budget_gpu_machine():
    # 2 GPUs x 2 runs each on 8 CPUs: the first four runs (two per GPU) get disjoint pairs covering all 8
    res = sweep("dqn_snake.sh", "--dry-run", "--seeds", "1 2", env={"JOBS_PER_GPU": "2", "SWEEP_CPUS": "0-7"})
    runs = dry_runs(res)
    assert {e["OMP_NUM_THREADS"] for _, _, e, _, _ in runs} == {"2"}
    if PIN:
        first = [cpu_set(cpus) for _, _, _, cpus, _ in runs[:4]]
        assert all(len(c) == 2 for c in first)
        assert set().union(*first) == set(range(8))  # disjoint and covering
        for gpu in ("cuda:0", "cuda:1"):  # the two runs sharing a GPU do not share cores
            mine = [cpu_set(cpus) for _, dev, _, cpus, _ in runs[:4] if dev == gpu]
            assert len(mine) == 2 and not mine[0] & mine[1]


def test_dry_run_thread_budget_oversubscribed():
    # more runs at once than CPUs: one thread each, cores shared round-robin
    res = sweep("dqn_snake.sh", "--dry-run", "--seeds", "1 2", "--cpus", "0-1", env={"NUM_GPUS": "0", "JOBS": "4"})
    runs = dry_runs(res)
    assert {e["OMP_NUM_THREADS"] for _, _, e, _, _ in runs} == {"1"}
    assert "runs share cores" in res.stdout
    if PIN:
        assert [cpus for _, _, _, cpus, _ in runs[:4]] == ["0", "1", "0", "1"]
    # asking for more CPUs per run than the sweep has: each run gets them all, with a note
    res = sweep("dqn_snake.sh", "--dry-run", "--seeds", "1", "--cpus-per-run", "16", env={"SWEEP_CPUS": "0-7"})
    assert "--cpus-per-run 16 but the sweep has 8 CPUs" in res.stderr
    assert {e["OMP_NUM_THREADS"] for _, _, e, _, _ in dry_runs(res)} == {"8"}


def test_thread_budget_bad_input(tmp_path):
    for args, env, text in [
        (["--cpus-per-run", "0"], {}, "--cpus-per-run (CPUS_PER_RUN) must be a positive integer"),
        (["--cpus-per-run", "two"], {}, "must be a positive integer, got 'two'"),
        (["--cpus", "0-x"], {}, "is not a CPU list"),
        ([], {"SWEEP_CPUS": "3-1"}, "is not a CPU list"),
        (["--cpus-per-run"], {}, "--cpus-per-run needs a value"),
    ]:
        res = sweep("dqn_snake.sh", "--dry-run", *args, env=env, check=False)
        assert res.returncode == 2 and res.stderr.startswith("error: ") and text in res.stderr, res.stderr
    # a real sweep refuses CPUs it may not use (a dry run only notes it)
    env = {"SWEEP_CPUS": "0-4095", "LOG_DIR": str(tmp_path / "logs"), "NUM_GPUS": "0"}
    res = sweep("dqn_snake.sh", "--seeds", "1", "--sizes", "6", "--num-envs", "8", env=env, check=False)
    assert res.returncode == 2 and "includes CPUs this process may not use" in res.stderr
    assert not (tmp_path / "logs").exists()


AFFINITY_PYTHON = """#!/usr/bin/env bash
# stands in for python: records the CPUs and thread variables the run got, and when it ran
s=""; prev=""
for a in "$@"; do [[ "$prev" == --session ]] && s="$a"; prev="$a"; done
cpus=$(awk '/^Cpus_allowed_list:/ { print $2 }' /proc/self/status)
echo "start $s $(date +%s.%N) $cpus $OMP_NUM_THREADS $MKL_NUM_THREADS" >> "$FAKE_LOG"
sleep 0.$((3 + s % 4))
echo "end $s $(date +%s.%N) $cpus $OMP_NUM_THREADS $MKL_NUM_THREADS" >> "$FAKE_LOG"
"""


@pytest.mark.skipif(not PIN, reason="needs Linux CPU affinity and a working taskset")
def test_sweep_pins_concurrent_runs_to_their_own_cores(tmp_path):
    fake = tmp_path / "fakepython"
    fake.write_text(AFFINITY_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / "fake.log"
    allowed = sorted(os.sched_getaffinity(0))
    jobs = min(2, len(allowed))
    k = len(allowed) // jobs
    env = {
        "PYTHON": str(fake),
        "FAKE_LOG": str(log),
        "NUM_GPUS": "0",
        "JOBS": str(jobs),
        "LOG_DIR": str(tmp_path / "l"),
    }
    sweep("dqn_snake.sh", "--sizes", "6", "--num-envs", "8", "--seeds", "1 2 3 4 5 6", env=env)
    rows = [line.split() for line in log.read_text().splitlines()]
    start = {int(r[1]): (float(r[2]), cpu_set(r[3]), r[4], r[5]) for r in rows if r[0] == "start"}
    end = {int(r[1]): float(r[2]) for r in rows if r[0] == "end"}
    assert sorted(start) == list(range(6))
    for s, (t0, cpus, omp, mkl) in start.items():
        assert len(cpus) == k and cpus <= set(allowed) and omp == mkl == str(k)
        for o, (t1, other, _, _) in start.items():
            if o != s and t1 <= t0 < end[o]:  # ran at the same time: no shared core
                assert not cpus & other, (s, o, cpus, other)
        header = next((tmp_path / "l").glob(f"{s:03d}_*.log")).read_text().splitlines()[0]
        assert f"OMP_NUM_THREADS={k} MKL_NUM_THREADS={k} taskset -c " in header


WRAPPER_PYTHON = """#!{python}
# Reports, from inside the process that becomes the training run, the CPUs it may use, its thread variables
# and the threads torch picks there; then turns into the real interpreter running the training script.
import os, sys, time
import torch
print(f"budget: pid={{os.getpid()}} cpus={{sorted(os.sched_getaffinity(0))}} "
      f"OMP_NUM_THREADS={{os.environ.get('OMP_NUM_THREADS')}} MKL_NUM_THREADS={{os.environ.get('MKL_NUM_THREADS')}} "
      f"torch_threads={{torch.get_num_threads()}} t={{time.time()}}", flush=True)
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


@pytest.mark.skipif(not PIN, reason="needs Linux CPU affinity and a working taskset")
def test_two_real_concurrent_runs_report_their_budget(tmp_path):
    """Two tiny dqn_snake_vec.py runs at once: each sees only its own cores and threads, and both finish."""
    repo = mini_repo(tmp_path)
    wrapper = tmp_path / "wrapper-python"
    wrapper.write_text(WRAPPER_PYTHON.format(python=sys.executable))
    wrapper.chmod(0o755)
    allowed = sorted(os.sched_getaffinity(0))
    k = max(1, len(allowed) // 2)
    env = {"PYTHON": str(wrapper), "NUM_GPUS": "0", "JOBS": "2", "LOG_DIR": str(tmp_path / "logs")}
    tiny = ["--total-timesteps", "64", "--learning-starts", "32", "--batch-size", "16", "--buffer-size", "512"]
    res = sweep("dqn_snake.sh", "--sizes", "6", "--num-envs", "8", "--seeds", "1 2", "--", *tiny, "--no-progress-bar",
                env=env, repo=repo, timeout=240)  # fmt: skip
    assert "2 ok, 0 failed" in res.stdout
    seen = {}
    for s in (0, 1):
        text = next((tmp_path / "logs").glob(f"{s:03d}_*.log")).read_text()
        m = re.search(r"budget: pid=\d+ cpus=\[([\d, ]+)\] OMP_NUM_THREADS=(\d+) MKL_NUM_THREADS=(\d+) "
                      r"torch_threads=(\d+) t=([\d.]+)", text)  # fmt: skip
        assert m, text
        cpus = {int(c) for c in m.group(1).split(",")}
        assert len(cpus) == k and [int(m.group(i)) for i in (2, 3, 4)] == [k, k, k], text
        threads = re.search(r"threads: (\d+) torch", text)  # the script's own report, where it prints one
        if threads:
            assert int(threads.group(1)) == k, text
        seen[s] = (cpus, float(m.group(5)))
    if len(allowed) >= 2:
        assert not seen[0][0] & seen[1][0]  # their own cores
    assert abs(seen[0][1] - seen[1][1]) < 30  # started together (JOBS=2), not one after the other
    for seed in (1, 2):  # the training runs themselves ran to the end
        (run_dir,) = (repo / "runs").glob(f"Snake6x6__dqn_snake_vec_n8__{seed}__*")
        ckpt = load_checkpoint(run_dir / "checkpoint.pt")
        assert ckpt["status"] == "finished" and ckpt["global_step"] == 64


# ---------------------------------------------------------------- --resume-existing


def status(repo, *run_ids):
    cmd = [sys.executable, os.path.join(BENCH, "slurm", "checkpoint_status.py"), "--runs-dir", str(repo / "runs")]
    res = subprocess.run([*cmd, *run_ids], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return [line.split("\t") for line in res.stdout.splitlines()]


def test_checkpoint_status_decisions(tmp_path):
    fake_checkpoint(tmp_path, "Snake6x6__dqn_snake_vec_n8__1", "finished", 100, 100)
    stopped = fake_checkpoint(tmp_path, "Snake6x6__dqn_snake_vec_n8__2", "stopped", 40, 100)
    # the newest dir has no checkpoint (a run that died at start): the older one with a checkpoint decides
    (tmp_path / "runs" / "Snake6x6__dqn_snake_vec_n8__2__1700000099").mkdir()
    # an older finished run and a newer running one: the newest decides
    fake_checkpoint(tmp_path, "ALE_Pong-v5__ppo_atari__1", "finished", 10, 10, stamp=1700000001)
    running = fake_checkpoint(tmp_path, "ALE_Pong-v5__ppo_atari__1", "running", 5, 10, stamp=1700000002)
    # names that only start like a run id belong to other runs (seed 11, exp ppo_continuous_fast)
    fake_checkpoint(tmp_path, "Hopper-v5__ppo_continuous__11", "stopped", 1, 10)
    fake_checkpoint(tmp_path, "Hopper-v5__ppo_continuous_fast__1", "stopped", 1, 10)
    bad = tmp_path / "runs" / "Walker2d-v5__ppo_continuous__1__1700000000"
    bad.mkdir()
    (bad / "checkpoint.pt").write_bytes(b"not a checkpoint")
    ids = ["Snake6x6__dqn_snake_vec_n8__1", "Snake6x6__dqn_snake_vec_n8__2", "ALE_Pong-v5__ppo_atari__1"]
    rows = status(tmp_path, *ids, "Hopper-v5__ppo_continuous__1", "Walker2d-v5__ppo_continuous__1")
    assert [r[0] for r in rows] == ["skip", "resume", "resume", "fresh", "error"]
    assert [r[1] for r in rows][:2] == ["Snake6x6__dqn_snake_vec_n8__1", "Snake6x6__dqn_snake_vec_n8__2"]
    assert "finished at step 100 of 100" in rows[0][3]
    assert rows[1][2] == str(stopped / "checkpoint.pt") and "stopped at step 40 of 100" in rows[1][3]
    assert rows[2][2] == str(running / "checkpoint.pt") and "1 other run dir" in rows[2][3]
    assert rows[3][2] == "-"
    assert rows[4][2].endswith("checkpoint.pt") and "cannot read" in rows[4][3] and "move it away" in rows[4][3]
    res = subprocess.run([sys.executable, os.path.join(BENCH, "slurm", "checkpoint_status.py"), "a/b"],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 2 and res.stderr.startswith("error: run id 'a/b'")


def test_dry_run_resume_existing(tmp_path):
    repo = mini_repo(tmp_path)
    done = fake_checkpoint(repo, "Snake6x6__dqn_snake_vec_n8__1", "finished", 100, 100)
    stopped = fake_checkpoint(repo, "Snake6x6__dqn_snake_vec_n8__2", "stopped", 40, 100)
    env = {"PYTHON": sys.executable, "NUM_GPUS": "0"}
    res = sweep("dqn_snake.sh", "--dry-run", "--resume-existing", "--sizes", "6", "--num-envs", "8", "--seeds", "1 2 3",
                env=env, repo=repo)  # fmt: skip
    assert f"[skip 0] Snake6x6 n=8 seed=1: finished at step 100 of 100: runs/{done.name}/checkpoint.pt" in res.stdout
    # where a resumed run continues from, before its command
    assert f"[resume 1] Snake6x6 n=8 seed=2: stopped at step 40 of 100: runs/{stopped.name}/checkpoint.pt" in res.stdout
    runs = {s: cmd for s, _, cmd in sessions(res)}
    assert sorted(runs) == [1, 2]
    assert flag(runs[1], "--resume") == f"runs/{stopped.name}/checkpoint.pt"  # relative to the repo root (cwd)
    assert "--resume" not in runs[2]


def test_local_sweep_stop_and_resume_existing(tmp_path):
    """A local sweep stopped with SIGTERM leaves a checkpoint; the same command with --resume-existing finishes it,
    skipping a run that had finished before."""
    repo = mini_repo(tmp_path)
    done = fake_checkpoint(repo, "Snake5x5__dqn_snake_vec_n8__1", "finished", 40000, 40000)
    logs = tmp_path / "logs"
    env = sweep_env({"PYTHON": sys.executable, "NUM_GPUS": "0", "JOBS": "1", "LOG_DIR": str(logs)})
    # env steps only (learning would start after the end): a few seconds, far more than the time a TERM takes
    args = ["bash", str(repo / "benchmark" / "dqn_snake.sh"), "--sizes", "5", "--num-envs", "8", "--seeds", "1 2",
            "--resume-existing", "--cpus-per-run", "1", "--", "--total-timesteps", "40000", "--learning-starts",
            "100000000", "--buffer-size", "20000", "--checkpoint-every", "100", "--no-progress-bar"]  # fmt: skip
    proc = subprocess.Popen(args, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log = logs / "001_Snake5x5_n=8_seed=2.log"
        first = repo / "runs"  # the first periodic checkpoint (100 of 5000 iterations) shows the run is going
        wait_for(lambda: list(first.glob("Snake5x5__dqn_snake_vec_n8__2__*/checkpoint.pt")), 120, "a checkpoint")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    summary = (logs / "summary.txt").read_text()
    assert "0 ok, 0 failed, 1 stopped, 1 skipped (finished before)" in summary, summary
    assert "--resume-existing" in summary
    (run_dir,) = (repo / "runs").glob("Snake5x5__dqn_snake_vec_n8__2__*")
    ckpt = load_checkpoint(run_dir / "checkpoint.pt")
    assert ckpt["status"] == "stopped" and 0 < ckpt["global_step"] < 40000
    assert "stopping on SIGTERM" in log.read_text()

    env["LOG_DIR"] = str(tmp_path / "logs2")
    res = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"skip   [session 0] Snake5x5 n=8 seed=1: finished at step 40,000 of 40,000: runs/{done.name}" in res.stdout
    assert "resume [session 1] Snake5x5 n=8 seed=2: stopped at step" in res.stdout
    assert "1 ok, 0 failed, 1 skipped (finished before)" in res.stdout
    assert list((repo / "runs").glob("Snake5x5__dqn_snake_vec_n8__2__*")) == [run_dir]  # continued, not restarted
    final = load_checkpoint(run_dir / "checkpoint.pt")
    assert final["status"] == "finished" and final["global_step"] == 40000
    assert (
        f"--resume runs/{run_dir.name}/checkpoint.pt"
        in (tmp_path / "logs2" / "001_Snake5x5_n=8_seed=2.log").read_text()
    )


# ---------------------------------------------------------------- SLURM job array script (no SLURM needed)


def slurm_script(res):
    """The sbatch script a --dry-run --slurm prints."""
    lines = res.stdout.splitlines()
    first = lines.index("#!/bin/bash")
    last = next(i for i, line in enumerate(lines) if line.startswith("[sweep] dry run: nothing was submitted"))
    return "\n".join(lines[first:last]) + "\n"


def script_runs(script):
    """{task: (ARGS words, RUN_ID, LOG)} from the script's run_args case statement."""
    found = re.findall(r"^    (\d+)\) # .*\n      ARGS=\((.*)\)\n      RUN_ID=(\S+) LOG=(\S+) ;;$", script, re.M)
    return {int(i): (shlex.split(a), shlex.split(r)[0], shlex.split(g)[0]) for i, a, r, g in found}


def test_slurm_dry_run_script():
    env = {"PYTHON": sys.executable}
    res = sweep("ppo_atari.sh", "--dry-run", "--slurm", "--games", "Pong Breakout", "--seeds", "1 2", "--track",
                "--partition", "gpu", "--time", "1-00:00:00", "--gpus-per-run", "1", "--cpus-per-run", "8",
                "--mem", "32G", "--max-parallel", "3", "--account", "rl-lab", "--log-dir", "/tmp/sw",
                "--sbatch-args", "--qos=high", "--comment", "two words", "--", "--total-timesteps", "1000",
                env=env)  # fmt: skip
    script = slurm_script(res)
    header = [line for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert header == [
        "#SBATCH --job-name=ppo_atari",
        "#SBATCH --array=0-3%3",
        "#SBATCH --output=/tmp/sw/slurm/%A_%a.out",
        "#SBATCH --signal=B:TERM@120",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=1-00:00:00",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --mem=32G",
        "#SBATCH --account=rl-lab",
    ]
    assert "run: sbatch --parsable --qos=high --comment two\\ words /tmp/sw/ppo_atari.sbatch" in res.stdout
    assert f"PYTHON={shlex.quote(sys.executable)}\n" in script and os.path.isabs(sys.executable)
    assert f"REPO={ROOT}\n" in script and "LOG_DIR=/tmp/sw\n" in script
    assert "TAIL=( --track --total-timesteps 1000 )" in script
    assert 'RESUME_EXISTING="${RESUME_EXISTING:-0}"' in script
    # the same runs, logs and order as the local sweep, without --session/--cuda-offset (SLURM places the GPUs)
    local = sessions(sweep("ppo_atari.sh", "--dry-run", "--games", "Pong Breakout", "--seeds", "1 2", "--track", "--",
                           "--total-timesteps", "1000"))  # fmt: skip
    runs = script_runs(script)
    assert sorted(runs) == [0, 1, 2, 3]
    for s, _dev, cmd in local:
        want = [w for i, w in enumerate(cmd[1:]) if w not in ("--session", "--cuda-offset")
                and cmd[i] not in ("--session", "--cuda-offset")]  # fmt: skip
        assert runs[s][0] + ["--track", "--total-timesteps", "1000"] == want
    assert runs[0][1:] == ("ALE_Pong-v5__ppo_atari__1", "000_ALE_Pong-v5_seed=1_lambda=0.85.log")
    assert runs[3][1:] == ("ALE_Breakout-v5__ppo_atari__2", "003_ALE_Breakout-v5_seed=2_lambda=0.70.log")
    assert "--session" not in script and "--cuda-offset" not in script
    assert "CUDA_OFFSET is ignored under --slurm" in res.stderr  # sweep() sets CUDA_OFFSET=1
    if shutil.which("shellcheck"):
        check = subprocess.run(["shellcheck", "-"], input=script, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout
    # defaults: no throttle, no resources, relative PYTHON made absolute from the repo root
    res = sweep("ppo_continuous.sh", "--dry-run", "--slurm", "--envs", "Hopper-v5", "--presets", "fast", "--seeds",
                "1", env={"PYTHON": ".venv/bin/python"})  # fmt: skip
    script = slurm_script(res)
    assert "#SBATCH --array=0-0\n" in script and "#SBATCH --gres" not in script
    assert "#SBATCH --cpus-per-task" not in script
    assert f"PYTHON={ROOT}/.venv/bin/python\n" in script
    assert script_runs(script)[0][1] == "Hopper-v5__ppo_continuous_fast__1"


def test_slurm_bad_input():
    env = {"PYTHON": sys.executable}
    for args, text in [
        (["--partition", "gpu"], "--partition is an option for SLURM sweeps; add --slurm"),
        (["--slurm", "--jobs", "2"], "--jobs is for local sweeps; under --slurm use --max-parallel"),
        (["--slurm", "--max-parallel", "0"], "--max-parallel must be a positive integer"),
        (["--slurm", "--gpus-per-run", "one"], "--gpus-per-run must be a non-negative integer"),
        (["--slurm", "--mem", "lots"], "--mem 'lots' is not a size"),
        (["--slurm", "--partition", "a b"], "has spaces or odd characters"),
        (["--slurm", "--log-dir", "/tmp/with space"], "needs paths without spaces"),
        (["--slurm", "--sbatch-args"], "--sbatch-args needs sbatch options after it"),
        (["--slurm", "--sbatch-args", "--", "--total-timesteps", "5"], "--sbatch-args needs sbatch options"),
        (["--slurm", "--time"], "--time needs a value"),
    ]:
        res = sweep("dqn_snake.sh", "--dry-run", "--seeds", "1", *args, env=env, check=False)
        assert res.returncode == 2 and res.stderr.startswith("error: ") and text in res.stderr, (args, res.stderr)
        assert res.stderr.count("\n") == 1, res.stderr
    res = sweep("dqn_snake.sh", "--dry-run", "--slurm", env={"PYTHON": "no-such-python-xyz"}, check=False)
    assert res.returncode == 2 and "python interpreter 'no-such-python-xyz' not found" in res.stderr


TASK_PYTHON = """#!/usr/bin/env bash
# stands in for python in a SLURM task: the checkpoint lookup runs for real, a training run is recorded
if [[ "$1" == benchmark/slurm/checkpoint_status.py ]]; then exec {python} "$@"; fi
echo "args: $*" >> "$FAKE_LOG"
echo "threads: OMP=$OMP_NUM_THREADS MKL=$MKL_NUM_THREADS" >> "$FAKE_LOG"
if [[ -n "${{FAKE_WAIT:-}}" ]]; then
  trap 'echo "got TERM" >> "$FAKE_LOG"; sleep 0.5; echo "checkpoint written" >> "$FAKE_LOG"; exit 0' TERM
  echo "waiting" >> "$FAKE_LOG"
  for _ in $(seq 600); do sleep 0.1; done
  exit 5
fi
"""


def test_slurm_task_script_without_slurm(tmp_path):
    """Run the generated array-task script with bash, as slurmd would (SLURM_* set), with a stand-in python."""
    (tmp_path / "repo").mkdir()
    repo = mini_repo(tmp_path / "repo")
    fake = tmp_path / "fakepython"
    fake.write_text(TASK_PYTHON.format(python=shlex.quote(sys.executable)))
    fake.chmod(0o755)
    logs = tmp_path / "logs"
    res = sweep("dqn_snake.sh", "--dry-run", "--slurm", "--sizes", "6", "--num-envs", "8", "--seeds", "1 2 3",
                "--log-dir", logs, "--", "--total-timesteps", "500", env={"PYTHON": str(fake)}, repo=repo)  # fmt: skip
    script = tmp_path / "sweep.sbatch"
    script.write_text(slurm_script(res))
    logs.mkdir()
    fake_log = tmp_path / "fake.log"

    def task(i, wait=False, **env):
        full = sweep_env({"FAKE_LOG": str(fake_log), "SLURM_ARRAY_JOB_ID": "77", "SLURM_JOB_ID": f"10{i}", **env})
        if i is not None:
            full["SLURM_ARRAY_TASK_ID"] = str(i)
        if wait:
            full["FAKE_WAIT"] = "1"
            return subprocess.Popen(["bash", str(script)], env=full, cwd=tmp_path, start_new_session=True)
        return subprocess.run(
            ["bash", str(script)], env=full, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )

    res = task(None)
    assert res.returncode == 2 and "submit this script with sbatch" in res.stderr
    res = task(7)
    assert res.returncode == 2 and "this sweep has runs 0-2, not 7" in res.stderr
    res = task(1, SLURM_CPUS_PER_TASK="3")
    assert res.returncode == 0, res.stderr
    calls = fake_log.read_text()
    assert "args: dqn_snake_vec.py --height 6 --width 6 --num-envs 8 --exp-name dqn_snake_vec_n8 --seed 2 " \
           "--total-timesteps 500\n" in calls  # fmt: skip
    assert "threads: OMP=3 MKL=3" in calls
    log = (logs / "001_Snake6x6_n=8_seed=2.log").read_text()
    assert "slurm job 77_1 (job 101)" in log and "3 CPUs (OMP_NUM_THREADS=3 MKL_NUM_THREADS=3)" in log
    assert "exit code 0" in log and f"{repo}" not in calls  # ran in the repo root: paths are relative

    # --resume-existing, decided by the task when it starts
    fake_log.unlink()
    fake_checkpoint(repo, "Snake6x6__dqn_snake_vec_n8__1", "finished", 500, 500)
    stopped = fake_checkpoint(repo, "Snake6x6__dqn_snake_vec_n8__2", "stopped", 200, 500)
    assert task(0, RESUME_EXISTING="1").returncode == 0
    assert not fake_log.exists()  # finished: nothing ran
    assert "[sweep] skip: finished at step 500 of 500" in (logs / "000_Snake6x6_n=8_seed=1.log").read_text()
    assert task(1, RESUME_EXISTING="1", SLURM_JOB_CPUS_PER_NODE="2(x1)").returncode == 0
    calls = fake_log.read_text()
    assert f"--resume runs/{stopped.name}/checkpoint.pt\n" in calls and "threads: OMP=2 MKL=2" in calls
    assert "[sweep] resume: stopped at step 200 of 500" in (logs / "001_Snake6x6_n=8_seed=2.log").read_text()

    # SIGTERM to the batch shell only (`scancel --batch`, the time-limit warning): passed on, waited for
    for whole_group in (False, True):  # True: every process of the task, as a plain `scancel` does
        fake_log.unlink()
        proc = task(2, wait=True)
        try:
            wait_for(lambda: fake_log.exists() and "waiting" in fake_log.read_text(), 60, "the stand-in run")
            if whole_group:
                os.killpg(proc.pid, signal.SIGTERM)
            else:
                proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 143
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        calls = fake_log.read_text()
        assert "got TERM" in calls and calls.endswith("checkpoint written\n"), calls
        log = (logs / "002_Snake6x6_n=8_seed=3.log").read_text()
        assert log.rstrip().endswith("resubmit the sweep with --resume-existing to continue"), log
