"""Tests for the sweep engine benchmark/sweep.py and its wrappers (benchmark/ppo_atari.sh, ppo_continuous.sh,
dqn_snake.sh): the grids, GPU rotation, slots and thread budgets, --resume-existing, the local job queue with signal
forwarding, the dry run, and the SLURM job-array script (run here without SLURM; tests/test_slurm.py submits it to a
live cluster). Most tests call the engine's functions; a few run the wrappers end to end."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys

import pytest
from helpers import SNAKE_LONGER, save_checkpoint_with_code, wait_for

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmark")
sys.path.insert(0, BENCH)
import sweep  # noqa: E402

sys.path.remove(BENCH)
import gpu_utils  # noqa: E402
import run_utils  # noqa: E402

SESSION_RE = re.compile(r"^\[session (\d+)\] (cpu|cuda:\d+): (.*)$")
# variables a sweep reads; a test must not inherit them from the shell that runs pytest
SWEEP_ENV = ("CUDA_OFFSET", "CUDA_VISIBLE_DEVICES", "JOBS", "JOBS_PER_GPU", "SWEEP_CPUS", "CPUS_PER_RUN", "SEEDS")
SWEEP_ENV += ("LOG_DIR", "NUM_GPUS", "RESUME_EXISTING", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "GAMES", "ALL_GAMES")
SWEEP_ENV += ("GAE_LAMBDA", "ENVS", "ALL_ENVS", "PRESETS", "SIZES", "NUM_ENVS", "PYTHON", "SWEEP_PYTHON")
LINUX_AFFINITY = hasattr(os, "sched_getaffinity") and os.path.exists("/proc/self/status")
PIN = LINUX_AFFINITY and sweep.taskset_works(min(os.sched_getaffinity(0)))


def sweep_env(env=None):
    full = {k: v for k, v in os.environ.items() if k not in SWEEP_ENV and not k.startswith("SLURM_")}
    full.update({"NUM_GPUS": "2", "CUDA_OFFSET": "1", "PYTHON": "python", "SWEEP_PYTHON": sys.executable})
    full.update(env or {})
    return full


def run_wrapper(script, *args, env=None, check=True, repo=ROOT, timeout=60):
    cmd = ["bash", os.path.join(repo, "benchmark", script), *map(str, args)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=sweep_env(env), cwd=repo)
    if check:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


@pytest.fixture
def engine(monkeypatch, capsys):
    """Call ``sweep.main`` in this process; each call sees a clean sweep environment (2 GPUs, CUDA_OFFSET=1) plus
    the variables it is given. Returns (rc, stdout, stderr)."""

    def call(*argv, **env):
        for key in SWEEP_ENV:
            monkeypatch.delenv(key, raising=False)
        for key, value in {"NUM_GPUS": "2", "CUDA_OFFSET": "1", "PYTHON": "python", **env}.items():
            monkeypatch.setenv(key, value)
        rc = sweep.main([str(a) for a in argv])
        out = capsys.readouterr()
        return rc, out.out, out.err

    return call


def dry_runs(out):
    """(session, device, thread variables, taskset CPUs or None, command) of every run a --dry-run prints."""
    found = []
    for line in out.splitlines():
        m = SESSION_RE.match(line)
        if m:
            words = shlex.split(m.group(3))
            env = {}
            while words and re.match(r"^[A-Z_]+=", words[0]):
                key, value = words.pop(0).split("=", 1)
                env[key] = value
            cpus = None
            if words and words[0] == "taskset":
                cpus, words = words[2], words[3:]
            found.append((int(m.group(1)), m.group(2), env, cpus, words))
    return found


def flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def mini_repo(dest):
    """Copy the scripts and benchmark/ to dest, whose runs/ then holds only this test's runs (for --resume-existing)."""
    for name in ("ppo_atari.py", "ppo_continuous.py", "dqn_snake_vec.py", "gpu_utils.py", "run_utils.py"):
        shutil.copy(os.path.join(ROOT, name), dest)
    shutil.copytree(BENCH, dest / "benchmark", ignore=shutil.ignore_patterns("results", "__pycache__"))
    return dest


def fake_checkpoint(repo, run_id, status, step, total, stamp=1700000000):
    """A checkpoint.pt as the training scripts write it (only the keys --resume-existing reads)."""
    run_dir = repo / "runs" / f"{run_id}__{stamp}"
    run_dir.mkdir(parents=True)
    ckpt = {"model": {}, "args": {"total_timesteps": total}, "status": status, "global_step": step}
    ckpt["run_name"] = run_dir.name
    torch.save(ckpt, run_dir / "checkpoint.pt")
    return run_dir


def load_checkpoint(path):
    return run_utils.read_checkpoint(path)


# ---------------------------------------------------------------- run ids and grids


def test_run_id_round_trip():
    rid = sweep.run_id("ALE/Pong-v5", "ppo_atari", 3)
    assert rid == "ALE_Pong-v5__ppo_atari__3"
    assert sweep.parse_run_name(f"{rid}__1700000000") == ("ALE_Pong-v5", "ppo_atari", 3, 1700000000)
    assert sweep.parse_run_name("Hopper-v5__ppo_continuous_fast__-1__5") == ("Hopper-v5", "ppo_continuous_fast", -1, 5)
    assert sweep.parse_run_name("sweep_logs") is None and sweep.parse_run_name(rid) is None


def test_atari_grid_lambdas_and_overrides():
    runs = sweep.atari_grid(sweep.ATARI_GAMES.split(), ["1"], [])
    lam = {flag(r.args, "--env-id"): flag(r.args, "--gae-lambda") for r in runs}
    assert len(lam) == 8
    assert lam["ALE/Breakout-v5"] == "0.70" and lam["ALE/Pong-v5"] == "0.85"
    assert lam["ALE/Qbert-v5"] == "0.95" and lam["ALE/MsPacman-v5"] == "0.85" and lam["ALE/Enduro-v5"] == "0.95"
    assert runs[0].run_id == "ALE_Breakout-v5__ppo_atari__1" and runs[0].label == "ALE/Breakout-v5 seed=1 lambda=0.70"
    # a sweep flag sets every game; a pass-through flag is used as given (no second --gae-lambda)
    assert {flag(r.args, "--gae-lambda") for r in sweep.atari_grid(["Pong", "Qbert"], ["1"], [], "0.8")} == {"0.8"}
    runs = sweep.atari_grid(["ALE/Breakout-v5"], ["1", "2"], ["--gae-lambda", "0.5", "--exp-name", "x"])
    assert all("--gae-lambda" not in r.args for r in runs) and runs[1].run_id == "ALE_Breakout-v5__x__2"
    with pytest.raises(sweep.SweepError, match="--games"):
        sweep.atari_grid(["Pong"], ["1"], ["--env-id", "ALE/Pong-v5"])


def test_atari_lambda_table():
    import csv

    with open(os.path.join(BENCH, "atari_lambdas.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 57 and len({r["game"] for r in rows}) == 57
    assert all(0 <= float(r["gae_lambda"]) <= 1 and r["status"] in ("published", "default") for r in rows)
    assert all(r["gae_lambda"] == "0.95" for r in rows if r["status"] == "default")


def test_continuous_and_snake_grids():
    runs = sweep.continuous_grid(["Hopper-v5"], ["default", "heavy"], ["1", "2", "3"], [])
    assert [flag(r.args, "--exp-name") for r in runs] == ["ppo_continuous"] * 3 + ["ppo_continuous_heavy"] * 3
    assert [r.args.count("--preset") for r in runs] == [0, 0, 0, 1, 1, 1]
    assert runs[3].run_id == "Hopper-v5__ppo_continuous_heavy__1"
    runs = sweep.snake_grid(["10", "8x12"], ["64"], ["1"], [])
    assert [(flag(r.args, "--height"), flag(r.args, "--width")) for r in runs] == [("10", "10"), ("8", "12")]
    assert [r.run_id for r in runs] == ["Snake10x10__dqn_snake_vec_n64__1", "Snake8x12__dqn_snake_vec_n64__1"]
    for call, hint in [
        (lambda: sweep.snake_grid(["ten"], ["8"], ["1"], []), "board size 'ten'"),
        (lambda: sweep.snake_grid(["10", "2x8"], ["8"], ["1"], []), "board size '2x8' is below 3 x 3"),
        (lambda: sweep.snake_grid(["6"], ["8"], ["1"], ["--num-envs", "3"]), "--sizes/--num-envs"),
        (lambda: sweep.continuous_grid(["Hopper-v5"], ["huge"], ["1"], []), "unknown preset 'huge'"),
        (lambda: sweep.continuous_grid(["Hopper-v5"], ["fast"], ["1"], ["--env-id=Hopper-v5"]), "--envs"),
        # a typo stops the sweep before it starts runs that would each stop at once
        (lambda: sweep.continuous_grid(["Hoper-v5"], ["default"], ["1"], []), "unknown env id Hoper-v5"),
        (lambda: sweep.atari_grid(["Pong", "Breakuot"], ["1"], []), "unknown game ALE/Breakuot-v5"),
    ]:
        with pytest.raises(sweep.SweepError, match=re.escape(hint)):
            call()


# ---------------------------------------------------------------- devices, slots, CPUs and threads


def test_device_rotation_matches_the_scripts():
    assert [sweep.device_of(s, 2, 1) for s in range(4)] == ["cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert all(sweep.device_of(s, 8, 4) == f"cuda:{gpu_utils.rotate(s, 4, 8)}" for s in range(10))
    assert sweep.device_of(3, 0, 0) == "cpu"
    assert sweep.detect_gpus({"NUM_GPUS": "3"}) == 3
    assert (
        sweep.detect_gpus({"CUDA_VISIBLE_DEVICES": "2,5"}) == 2 and sweep.detect_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    )


def test_cpu_lists():
    assert sweep.parse_cpu_list("0-3,8,10-14:2") == [0, 1, 2, 3, 8, 10, 12, 14]
    assert sweep.cpu_ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    for bad in ("0-x", "3-1", "", "1,,2"):
        with pytest.raises(sweep.SweepError, match="is not a CPU list"):
            sweep.parse_cpu_list(bad)


def test_slot_cpus_thread_budgets():
    cpus = list(range(8))
    # the default: gpu_utils.split_cpus, disjoint groups covering the CPUs
    assert sweep.slot_cpus(cpus, 4) == gpu_utils.split_cpus(cpus, 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    three = sweep.slot_cpus(cpus, 3)
    assert sorted(c for g in three for c in g) == cpus and {len(g) for g in three} == {2, 3}
    # an explicit budget: windows of that many CPUs, in the list's order (holes kept), wrapping round
    assert sweep.slot_cpus(cpus, 2, 3) == [[0, 1, 2], [3, 4, 5]]
    assert sweep.slot_cpus([0, 2, 4, 6], 2) == [[0, 2], [4, 6]]
    assert sweep.slot_cpus([0, 1], 4) == [[0], [1], [0], [1]]  # more runs than CPUs: shared round-robin
    assert sweep.slot_cpus(cpus, 2, 8) == [cpus, cpus]
    assert sweep.slot_prefix([4, 5, 6], True) == ["OMP_NUM_THREADS=3", "MKL_NUM_THREADS=3", "taskset", "-c", "4-6"]
    assert sweep.slot_prefix([4], False) == ["OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1"]
    # the dry run's guess: per lane, slots in turn; runs that do not run take none
    assert sweep.planned_slots([1, 0, 1, 0, 1, -1, 0], 2) == [2, 0, 3, 1, 2, -1, 0]


def test_dry_run_thread_budget(engine):
    # 2 GPUs x 2 runs each on 8 CPUs: the first four runs (two per GPU) get disjoint pairs covering all 8
    rc, out, _ = engine("dqn_snake", "--dry-run", "--seeds", "1 2", "--jobs-per-gpu", "2", SWEEP_CPUS="0-7")
    runs = dry_runs(out)
    assert rc == 0 and "8 CPUs (0-7) for 4 runs at once -> 2 per run" in out
    assert {e["OMP_NUM_THREADS"] for _, _, e, _, _ in runs} == {"2"}
    if PIN:
        first = [set(sweep.parse_cpu_list(cpus)) for _, _, _, cpus, _ in runs[:4]]
        assert set().union(*first) == set(range(8)) and all(len(c) == 2 for c in first)
        for gpu in ("cuda:0", "cuda:1"):  # the two runs sharing a GPU do not share cores
            mine = [set(sweep.parse_cpu_list(c)) for _, dev, _, c, _ in runs[:4] if dev == gpu]
            assert len(mine) == 2 and not mine[0] & mine[1]
    else:
        assert "not pinned" in out
    # more runs at once than CPUs: one thread each, with the note; too many CPUs per run: each gets them all
    rc, out, _ = engine("dqn_snake", "--dry-run", "--seeds", "1", "--cpus", "0-1", "--jobs", "4", NUM_GPUS="0")
    assert {e["OMP_NUM_THREADS"] for _, _, e, _, _ in dry_runs(out)} == {"1"} and "runs share cores" in out
    rc, out, err = engine("dqn_snake", "--dry-run", "--seeds", "1", "--cpus-per-run", "16", SWEEP_CPUS="0-7")
    assert "--cpus-per-run 16 but the sweep has 8 CPUs" in err
    assert {e["OMP_NUM_THREADS"] for _, _, e, _, _ in dry_runs(out)} == {"8"}


# ---------------------------------------------------------------- the dry run and bad input


@pytest.mark.parametrize("script", ["ppo_atari.sh", "ppo_continuous.sh", "dqn_snake.sh"])
def test_wrapper_dry_run_rotation_and_passthrough(script):
    res = run_wrapper(script, "--dry-run", "--seeds", "1 2", "--track", "--", "--total-timesteps", "1000", "--foo=bar")
    runs = dry_runs(res.stdout)
    assert len(runs) >= 4 and [s for s, *_ in runs] == list(range(len(runs)))
    for s, dev, env, _cpus, cmd in runs:
        assert dev == f"cuda:{gpu_utils.rotate(s, 1, 2)}"  # the placement the script itself will pick
        assert cmd[0] == "python" and int(flag(cmd, "--session")) == s and flag(cmd, "--cuda-offset") == "1"
        assert cmd[-4:] == ["--track", "--total-timesteps", "1000", "--foo=bar"]
        assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"]
    assert "dry run: nothing was started" in res.stdout
    assert "gpus=2" in res.stdout and "up to 2 at once" in res.stdout


def test_dry_run_options_and_environment(engine):
    rc, out, _ = engine("dqn_snake", "--dry-run", "--seeds", "1", JOBS_PER_GPU="3", CUDA_OFFSET="0")
    assert rc == 0 and "up to 6 at once" in out
    runs = dry_runs(out)
    assert [dev for s, dev, *_ in runs] == [f"cuda:{s % 2}" for s in range(len(runs))]
    assert all("--cuda-offset" in cmd for *_, cmd in runs)  # set in the environment: passed on
    rc, out, _ = engine("dqn_snake", "--dry-run", "--seeds", "1", NUM_GPUS="0", JOBS="2")
    assert "up to 2 at once" in out and {dev for _, dev, *_ in dry_runs(out)} == {"cpu"}
    rc, out, _ = engine("dqn_snake", "--dry-run", "--seeds", "1", "--", "--gpu", "false")
    assert {dev for _, dev, *_ in dry_runs(out)} == {"cpu"}
    rc, out, _ = engine("ppo_atari", "--dry-run", "--all", "--seeds", "1")
    assert len(dry_runs(out)) == 57
    rc, out, _ = engine("ppo_continuous", "--dry-run", "--seeds", "7", PRESETS="fast", ENVS="Ant-v5")
    ((_, _, _, _, cmd),) = dry_runs(out)
    assert flag(cmd, "--preset") == "fast" and flag(cmd, "--seed") == "7"


def test_dry_run_plans_the_gpu_the_runs_are_given(engine):
    """The plan (devices, runs at once per GPU) follows what the runs will do with the --gpu and --cuda-offset given
    after --: --gpu N puts every run on GPU N, JOBS_PER_GPU at a time, not one per GPU on GPUs they never use."""
    rc, out, err = engine("dqn_snake", "--dry-run", "--seeds", "1 2", "--", "--gpu", "1")  # NUM_GPUS=2
    assert rc == 0, err
    assert {dev for _, dev, *_ in dry_runs(out)} == {"cuda:1"} and "up to 1 at once" in out
    rc, out, _ = engine("dqn_snake", "--dry-run", "--seeds", "1", "--jobs-per-gpu", "2", "--", "--gpu=cuda:0")
    assert {dev for _, dev, *_ in dry_runs(out)} == {"cuda:0"} and "up to 2 at once" in out
    for word in ("cpu", "No"):  # the words the scripts read as the CPU
        rc, out, _ = engine("dqn_snake", "--dry-run", "--seeds", "1", "--", "--gpu", word)
        assert {dev for _, dev, *_ in dry_runs(out)} == {"cpu"}, word
    rc, out, _ = engine("dqn_snake", "--dry-run", "--seeds", "1", "--", "--cuda-offset", "1", CUDA_OFFSET="")
    runs = dry_runs(out)
    assert [dev for _, dev, *_ in runs] == [f"cuda:{gpu_utils.rotate(s, 1, 2)}" for s, *_ in runs]
    assert all(cmd.count("--cuda-offset") == 1 for *_, cmd in runs)
    for args, text in [
        (["--", "--gpu", "2"], "--gpu 2 after -- asks for GPU 2 but the sweep sees 2 GPUs"),
        (["--", "--gpu", "fast"], "--gpu 'fast' after -- is not understood"),
        (["--", "--cuda-offset", "-1"], "--cuda-offset must be a non-negative integer"),
        (["--", "--session", "3"], "--session after --"),
    ]:
        rc, out, err = engine("dqn_snake", "--dry-run", "--seeds", "1", *args)
        assert rc == 2 and err.startswith("error: ") and text in err and err.count("\n") == 1, (args, err)


def test_bad_input_is_one_error_line(engine):
    for args, env, text in [
        (["ppo_atari", "--bogus"], {}, "unknown option '--bogus'"),
        (["ppo_continuous"], {"JOBS_PER_GPU": "0"}, "JOBS_PER_GPU must be a positive integer"),
        (["ppo_atari", "--", "--seed", "3"], {}, "--seeds"),
        (["dqn_snake", "--", "--resume", "x.pt"], {}, "--resume-existing"),
        (["dqn_snake", "--cpus-per-run", "two"], {}, "must be a positive integer, got 'two'"),
        (["dqn_snake", "--cpus", "0-x"], {}, "is not a CPU list"),
        (["dqn_snake", "--cpus-per-run"], {}, "--cpus-per-run needs a value"),
        (["dqn_snake", "--seeds", "one"], {}, "seed 'one' is not an integer"),
        (["dqn_snake"], {"CUDA_OFFSET": "x"}, "CUDA_OFFSET must be a non-negative integer"),
        (["nope"], {}, "name the grid first"),
    ]:
        rc, out, err = engine(*args, "--dry-run", **env)
        assert rc == 2 and err.startswith("error: ") and text in err and err.count("\n") == 1, (args, err)


def test_bad_input_through_a_wrapper():
    res = run_wrapper("dqn_snake.sh", "--dry-run", "--cpus-per-run", check=False)
    assert res.returncode == 2 and res.stderr == "error: --cpus-per-run needs a value\n"
    res = run_wrapper("ppo_atari.sh", "--dry-run", "--bogus", check=False)
    assert res.returncode == 2 and res.stderr.startswith("error: unknown option '--bogus'")


# ---------------------------------------------------------------- --resume-existing


def test_decide_resume(tmp_path):
    runs = str(tmp_path / "runs")
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
    diverged = fake_checkpoint(tmp_path, "Ant-v5__ppo_continuous__1", "diverged", 30, 100)
    bad = tmp_path / "runs" / "Walker2d-v5__ppo_continuous__1__1700000000"
    bad.mkdir()
    (bad / "checkpoint.pt").write_bytes(b"not a checkpoint")
    ids = ["Snake6x6__dqn_snake_vec_n8__1", "Snake6x6__dqn_snake_vec_n8__2", "ALE_Pong-v5__ppo_atari__1"]
    ids += ["Hopper-v5__ppo_continuous__1", "Walker2d-v5__ppo_continuous__1", "Ant-v5__ppo_continuous__1"]
    got = [sweep.decide_resume(runs, rid) for rid in ids]
    assert [d.action for d in got] == ["skip", "resume", "resume", "fresh", "error", "skip"]
    assert "finished at step 100 of 100" in got[0].note
    assert got[1].checkpoint == str(stopped / "checkpoint.pt") and "stopped at step 40 of 100" in got[1].note
    assert got[2].checkpoint == str(running / "checkpoint.pt") and "1 other run dir" in got[2].note
    assert got[3].checkpoint is None
    assert (
        got[4].checkpoint.endswith("checkpoint.pt") and "cannot read" in got[4].note and "move it away" in got[4].note
    )
    assert got[5].checkpoint == str(diverged / "checkpoint.pt")  # its settings made NaN weights: not again
    assert "diverged after its checkpoint at step 30 of 100" in got[5].note and "other settings" in got[5].note


def test_dry_run_resume_existing(tmp_path):
    repo = mini_repo(tmp_path)
    done = fake_checkpoint(repo, "Snake6x6__dqn_snake_vec_n8__1", "finished", 100, 100)
    stopped = fake_checkpoint(repo, "Snake6x6__dqn_snake_vec_n8__2", "stopped", 40, 100)
    res = run_wrapper(
        "dqn_snake.sh",
        "--dry-run",
        "--resume-existing",
        "--sizes",
        "6",
        "--num-envs",
        "8",
        "--seeds",
        "1 2 3",
        env={"NUM_GPUS": "0"},
        repo=repo,
    )
    assert f"[skip 0] Snake6x6 n=8 seed=1: finished at step 100 of 100: runs/{done.name}/checkpoint.pt" in res.stdout
    # where a resumed run continues from, before its command
    assert f"[resume 1] Snake6x6 n=8 seed=2: stopped at step 40 of 100: runs/{stopped.name}/checkpoint.pt" in res.stdout
    runs = {s: cmd for s, _, _, _, cmd in dry_runs(res.stdout)}
    assert sorted(runs) == [1, 2]
    assert flag(runs[1], "--resume") == f"runs/{stopped.name}/checkpoint.pt"  # relative to the repo root (cwd)
    assert "--resume" not in runs[2]


def test_resume_existing_never_runs_code_in_a_checkpoint(tmp_path):
    """A checkpoint.pt whose pickle would run code (here: make a folder) is read as data only, like the scripts read
    it: --resume-existing fails that run with a one-line reason, and the code never runs."""
    repo = mini_repo(tmp_path)
    run_dir = fake_checkpoint(repo, "Snake6x6__dqn_snake_vec_n8__1", "stopped", 40, 100)
    marker = tmp_path / "the_payload_ran"
    save_checkpoint_with_code(run_dir / "checkpoint.pt", marker, status="stopped", global_step=40)
    d = sweep.decide_resume(str(repo / "runs"), "Snake6x6__dqn_snake_vec_n8__1")
    assert not marker.exists()
    assert d.action == "error" and "\n" not in d.note and "holds more than data" in d.note and "move it" in d.note
    res = run_wrapper(
        "dqn_snake.sh",
        *("--dry-run", "--resume-existing", "--sizes", "6", "--num-envs", "8", "--seeds", "1"),
        env={"NUM_GPUS": "0"},
        repo=repo,
    )
    assert not marker.exists()
    (line,) = [line for line in res.stdout.splitlines() if line.startswith("[error 0]")]
    assert f"runs/{run_dir.name}/checkpoint.pt" in line and "holds more than data" in line
    assert not dry_runs(res.stdout)  # nothing starts from it


def test_resume_existing_leaves_a_live_run_alone(tmp_path):
    """A run whose process still trains (it holds runs/<run>/.lock, as the scripts do) is neither resumed into its
    own folder by a second writer nor started again: --resume-existing says it is live and leaves it, in the dry run
    and in a real sweep; once the lock is released it resumes as usual."""
    repo = mini_repo(tmp_path)
    rid = "Snake6x6__dqn_snake_vec_n8__1"
    run_dir = fake_checkpoint(repo, rid, "running", 40, 100)
    starting = repo / "runs" / "Snake6x6__dqn_snake_vec_n8__2__1700000000"  # a fresh run before its first checkpoint
    locks = [run_utils.lock_run_dir(run_dir), run_utils.lock_run_dir(starting)]
    sizes = ("--sizes", "6", "--num-envs", "8", "--seeds", "1 2", "--resume-existing")
    try:
        d = sweep.decide_resume(str(repo / "runs"), rid)
        assert d.action == "live" and str(run_dir) in d.note and "training now" in d.note, d
        assert sweep.decide_resume(str(repo / "runs"), "Snake6x6__dqn_snake_vec_n8__2").action == "live"
        res = run_wrapper("dqn_snake.sh", "--dry-run", *sizes, env={"NUM_GPUS": "0"}, repo=repo)
        assert f"[live 0] Snake6x6 n=8 seed=1: runs/{run_dir.name} is training now" in res.stdout
        assert "[live 1] Snake6x6 n=8 seed=2" in res.stdout and not dry_runs(res.stdout)
        logs = tmp_path / "logs"
        env = {"NUM_GPUS": "0", "PYTHON": "false", "LOG_DIR": str(logs)}  # a run that started would fail
        res = run_wrapper("dqn_snake.sh", *sizes, env=env, repo=repo)
        assert f"live   [session 0] Snake6x6 n=8 seed=1: runs/{run_dir.name} is training now" in res.stdout
        assert "0 ok, 0 failed, 2 live (training in another process)" in (logs / "summary.txt").read_text()
    finally:
        for fd in locks:
            os.close(fd)
    assert sweep.decide_resume(str(repo / "runs"), rid).action == "resume"


# ---------------------------------------------------------------- local runs: queue, pinning, signals

FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for python: records start/end per session, its CPUs and threads, fails session 3
s=""; prev=""
for a in "$@"; do [[ "$prev" == --session ]] && s="$a"; prev="$a"; done
cpus=$(awk '/^Cpus_allowed_list:/ { print $2 }' /proc/self/status)
echo "start $s $(date +%s.%N) $cpus $OMP_NUM_THREADS $MKL_NUM_THREADS" >> "$FAKE_LOG"
sleep 0.4
echo "end $s $(date +%s.%N)" >> "$FAKE_LOG"
[[ "$s" == 3 ]] && { echo "boom" >&2; exit 3; }
exit 0
"""


def test_local_queue_jobs_per_gpu_pinning_and_failures(tmp_path):
    fake = tmp_path / "fakepython"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / "fake.log"
    allowed = sorted(os.sched_getaffinity(0)) if LINUX_AFFINITY else [0]
    env = {"PYTHON": str(fake), "FAKE_LOG": str(log), "JOBS_PER_GPU": "2", "LOG_DIR": str(tmp_path / "logs")}
    res = run_wrapper(
        "dqn_snake.sh", "--sizes", "10", "--num-envs", "8", "--seeds", "1 2 3 4 5 6 7 8", env=env, check=False
    )
    assert res.returncode == 1, res.stdout + res.stderr
    rows = [line.split() for line in log.read_text().splitlines()]
    start = {int(r[1]): (float(r[2]), r[3:]) for r in rows if r[0] == "start"}
    end = {int(r[1]): float(r[2]) for r in rows if r[0] == "end"}
    assert sorted(start) == list(range(8)) and sorted(end) == list(range(8))  # the failure did not stop the sweep
    for gpu in (0, 1):
        mine = [s for s in range(8) if (1 + s) % 2 == gpu]
        peak = max(sum(start[o][0] <= start[s][0] < end[o] for o in mine) for s in mine)
        assert peak == 2, (gpu, start, end)  # JOBS_PER_GPU=2: two at once per GPU, never more
    groups = gpu_utils.split_cpus(allowed, 4)
    for s, (t0, (cpus, omp, mkl)) in start.items():
        assert omp == mkl and int(omp) in {len(g) for g in groups}
        if PIN:
            assert sweep.parse_cpu_list(cpus) in groups
            for o, (t1, (other, _, _)) in start.items():  # ran at the same time: no shared core (when there are enough)
                if o != s and t1 <= t0 < end[o] and len(allowed) >= 4:
                    assert not set(sweep.parse_cpu_list(cpus)) & set(sweep.parse_cpu_list(other)), (s, o)
    summary = (tmp_path / "logs" / "summary.txt").read_text()
    assert "7 ok, 1 failed" in summary
    assert "FAILED (rc=3) [session 3] cuda:0 Snake10x10 n=8 seed=4" in summary and "FAILED" in res.stdout
    failed_log = (tmp_path / "logs" / "003_Snake10x10_n=8_seed=4.log").read_text()
    assert "boom" in failed_log and failed_log.startswith("# ") and " slot " in failed_log.splitlines()[0]
    if PIN:
        assert "MKL_NUM_THREADS=" in failed_log.splitlines()[0] and " taskset -c " in failed_log.splitlines()[0]


def test_real_sweep_refuses_cpus_it_may_not_use(tmp_path, engine):
    rc, _, err = engine("dqn_snake", "--seeds", "1", NUM_GPUS="0", SWEEP_CPUS="0-4095", LOG_DIR=str(tmp_path / "l"))
    assert rc == 2 and "includes CPUs this process may not use" in err
    assert not (tmp_path / "l").exists()


def test_local_sweep_stop_and_resume_existing(tmp_path):
    """A local sweep stopped with SIGTERM leaves a checkpoint; the same command with --resume-existing finishes it,
    skipping a run that had finished before."""
    repo = mini_repo(tmp_path)
    done = fake_checkpoint(repo, "Snake5x5__dqn_snake_vec_n8__1", "finished", 40000, 40000)
    logs = tmp_path / "logs"
    env = sweep_env({"PYTHON": sys.executable, "NUM_GPUS": "0", "LOG_DIR": str(logs)})
    args = [
        "bash",
        str(repo / "benchmark" / "dqn_snake.sh"),
        "--sizes",
        "5",
        "--num-envs",
        "8",
        "--seeds",
        "1 2",
        "--resume-existing",
        "--cpus-per-run",
        "1",
        "--",
        *SNAKE_LONGER,
        "--no-progress-bar",
    ]
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
    assert "0 ok, 0 failed, 1 stopped, 1 skipped (finished or diverged before)" in summary, summary
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
    assert "1 ok, 0 failed, 1 skipped (finished or diverged before)" in res.stdout
    assert list((repo / "runs").glob("Snake5x5__dqn_snake_vec_n8__2__*")) == [run_dir]  # continued, not restarted
    final = load_checkpoint(run_dir / "checkpoint.pt")
    assert final["status"] == "finished" and final["global_step"] == 40000
    assert (
        f"--resume runs/{run_dir.name}/checkpoint.pt"
        in (tmp_path / "logs2" / "001_Snake5x5_n=8_seed=2.log").read_text()
    )


STARTING_PYTHON = """#!/usr/bin/env bash
# stands in for python while it imports torch: no SIGTERM handler yet, so a stop kills it (rc 143), no checkpoint
echo "starting" >> "$FAKE_LOG"
exec sleep 60
"""


def test_a_stop_while_a_run_starts_is_not_a_failure(tmp_path):
    """Ctrl-C right after a sweep started a run reaches it before the script has its SIGTERM handler (it is still
    importing): it dies with rc 143 and no checkpoint. That run was stopped, not failed, and --resume-existing starts
    it afresh."""
    repo = mini_repo(tmp_path)
    fake = tmp_path / "fakepython"
    fake.write_text(STARTING_PYTHON)
    fake.chmod(0o755)
    fake_log, logs = tmp_path / "fake.log", tmp_path / "logs"
    env = sweep_env({"PYTHON": str(fake), "FAKE_LOG": str(fake_log), "NUM_GPUS": "0", "LOG_DIR": str(logs)})
    args = ["bash", str(repo / "benchmark" / "dqn_snake.sh"), "--sizes", "6", "--num-envs", "8", "--seeds", "1"]
    proc = subprocess.Popen(args, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: fake_log.exists(), 60, "the run to start")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert "FAILED" not in out and "stopped before its first checkpoint" in out, out
    summary = (logs / "summary.txt").read_text()
    assert "0 ok, 0 failed, 1 stopped" in summary and "stopped before its first checkpoint" in summary, summary
    res = run_wrapper(
        "dqn_snake.sh",
        *("--dry-run", "--resume-existing", "--sizes", "6", "--num-envs", "8", "--seeds", "1"),
        env={"NUM_GPUS": "0"},
        repo=repo,
    )
    ((_, _, _, _, cmd),) = dry_runs(res.stdout)
    assert "--resume" not in cmd  # afresh


# ---------------------------------------------------------------- SLURM job array script (no SLURM needed)


def slurm_script(out):
    """The sbatch script a --dry-run --slurm prints."""
    lines = out.splitlines()
    first = lines.index("#!/bin/bash")
    last = next(i for i, line in enumerate(lines) if line.startswith("[sweep] dry run: nothing was submitted"))
    return "\n".join(lines[first:last]) + "\n"


def test_slurm_dry_run_script(engine):
    rc, out, err = engine(
        "ppo_atari",
        "--dry-run",
        "--slurm",
        "--games",
        "Pong Breakout",
        "--seeds",
        "1 2",
        "--track",
        "--partition",
        "gpu",
        "--time",
        "1-00:00:00",
        "--gpus-per-run",
        "1",
        "--cpus-per-run",
        "8",
        "--mem",
        "32G",
        "--max-parallel",
        "3",
        "--account",
        "rl-lab",
        "--log-dir",
        "/tmp/sw",
        "--sbatch-args",
        "--qos=high",
        "--comment",
        "two words",
        "--",
        "--total-timesteps",
        "1000",
        PYTHON=sys.executable,
    )
    assert rc == 0, err
    script = slurm_script(out)
    assert [line for line in script.splitlines() if line.startswith("#SBATCH ")] == [
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
    assert "run: sbatch --parsable --qos=high --comment 'two words' /tmp/sw/ppo_atari.sbatch" in out
    # the task line calls this engine with the task id; the runs are listed for the reader
    assert script.splitlines()[-1] == (
        f"exec {sys.executable} benchmark/sweep.py task /tmp/sw/ppo_atari.json " + '"${SLURM_ARRAY_TASK_ID:-}"'
    )
    assert f"cd {ROOT} || exit 2" in script
    assert (
        "# task 0: ALE/Pong-v5 seed=1 lambda=0.85: ppo_atari.py --env-id ALE/Pong-v5 --gae-lambda 0.85 --seed 1"
        in script
    )
    assert "--track --total-timesteps 1000" in script and "--session" not in script and "--cuda-offset" not in script
    assert "CUDA_OFFSET is ignored under --slurm" in err  # the fixture sets CUDA_OFFSET=1
    if shutil.which("shellcheck"):
        check = subprocess.run(["shellcheck", "-"], input=script, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout
    # defaults: no throttle, no resources
    rc, out, _ = engine(
        "ppo_continuous",
        "--dry-run",
        "--slurm",
        "--envs",
        "Hopper-v5",
        "--presets",
        "fast",
        "--seeds",
        "1",
        PYTHON=sys.executable,
    )
    script = slurm_script(out)
    assert "#SBATCH --array=0-0\n" in script and "#SBATCH --gres" not in script and "#SBATCH --cpus" not in script


def test_slurm_bad_input(engine):
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
    ]:
        rc, _, err = engine("dqn_snake", "--dry-run", "--seeds", "1", *args, PYTHON=sys.executable)
        assert rc == 2 and err.splitlines()[-1].startswith("error: ") and text in err, (args, err)
        assert err.count("error: ") == 1, err
    rc, _, err = engine("dqn_snake", "--dry-run", "--slurm", PYTHON="no-such-python-xyz")
    assert rc == 2 and "python interpreter 'no-such-python-xyz' not found" in err


def test_control_characters_are_refused(engine, tmp_path):
    """A newline in an argument or a variable would end a line of the sbatch script (or of a run's command, name or
    log) and start a command of its own: every sweep refuses it in one line naming where it came from."""
    flag_file = tmp_path / "flag"
    payload = f"x\ntouch {flag_file} #"
    slurm = ["ppo_atari", "--games", "Pong", "--seeds", "1", "--slurm", "--dry-run"]
    for args, env, named in [
        ([*slurm, "--", "--exp-name", payload], {}, "--exp-name"),
        ([*slurm, "--", f"--exp-name={payload}"], {}, "--exp-name"),
        ([*slurm, "--track"], {"WANDB_ENTITY": payload}, "WANDB_ENTITY"),
        ([*slurm, "--track"], {"WANDB_PROJECT_NAME": payload}, "WANDB_PROJECT_NAME"),
        (slurm, {"GAE_LAMBDA": payload}, "GAE_LAMBDA"),
        ([*slurm, "--gae-lambda", payload], {}, "--gae-lambda"),
        ([*slurm, "--log-dir", f"{tmp_path}\n"], {}, "--log-dir"),
        ([*slurm, "--partition", "gpu\n"], {}, "--partition"),
        ([*slurm, "--sbatch-args", "--comment", payload], {}, "--comment"),
        (["dqn_snake", "--dry-run", "--seeds", "1", "--", "--exp-name", "a\rb"], {}, "--exp-name"),  # local too
        (["dqn_snake", "--dry-run", "--seeds", "1", "--", "\x1b[2J"], {}, "argument after --"),
    ]:
        rc, out, err = engine(*args, PYTHON=sys.executable, **env)
        assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, (args, env, err)
        assert named in err and "control character" in err, (args, env, err)
        assert "#!/bin/bash" not in out and not dry_runs(out)
    assert not flag_file.exists()
    # lists split on white space: games one per line are as good as on one line
    rc, out, err = engine("ppo_atari", "--dry-run", "--games", "Pong\nBreakout", "--seeds", "1\n2", NUM_GPUS="0")
    assert rc == 0 and len(dry_runs(out)) == 4, err


def test_sbatch_script_keeps_user_text_out_of_its_commands(tmp_path):
    """Whatever reaches the sbatch script, it stays in its comments or inside quotes: a spec whose label, arguments
    and tail hold newlines writes a script that, run by bash, runs none of them."""
    flag_file = tmp_path / "flag"
    payload = f"x\ntouch {flag_file} #"
    run = sweep.Run(f"label {payload}", "run__x__1", ("dqn_snake_vec.py", "--exp-name", payload))
    spec = sweep.slurm_spec("dqn_snake", [run], sys.executable, ["--track", "--wandb-entity", payload], "/tmp/l", True)
    script = sweep.sbatch_script("dqn_snake", "/tmp/l/dqn_snake.json", spec, {}, sys.executable)
    lines = script.splitlines()
    body = lines[: lines.index("set -u")]
    assert all(line.startswith("#") for line in body), script
    assert len(lines) == len(body) + 3  # set -u, cd, exec: nothing else runs
    (tmp_path / "x.sbatch").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    subprocess.run(["bash", str(tmp_path / "x.sbatch")], env=env, capture_output=True, timeout=120)
    assert not flag_file.exists()


TASK_PYTHON = """#!/usr/bin/env bash
# stands in for python in a SLURM task: a training run is recorded
echo "args: $*" >> "$FAKE_LOG"
echo "threads: OMP=$OMP_NUM_THREADS MKL=$MKL_NUM_THREADS" >> "$FAKE_LOG"
if [[ -n "${FAKE_STARTING:-}" ]]; then  # still importing: no SIGTERM handler, so a stop kills it
  echo "waiting" >> "$FAKE_LOG"
  exec sleep 60
fi
if [[ -n "${FAKE_WAIT:-}" ]]; then
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
    fake.write_text(TASK_PYTHON)
    fake.chmod(0o755)
    logs = tmp_path / "logs"
    # a stand-in sbatch: the sweep really writes its spec and script, submits, and records the submission
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/usr/bin/env bash\necho "$@" > "$(dirname "$0")/sbatch.args"\necho 4242\n')
    (bin_dir / "sbatch").chmod(0o755)
    env = {"PYTHON": str(fake), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    res = run_wrapper(
        "dqn_snake.sh",
        "--slurm",
        "--sizes",
        "6",
        "--num-envs",
        "8",
        "--seeds",
        "1 2 3",
        "--log-dir",
        logs,
        "--",
        "--total-timesteps",
        "500",
        env=env,
        repo=repo,
    )
    assert "submitted job array 4242 (3 tasks)" in res.stdout
    script = logs / "dqn_snake.sbatch"
    assert (bin_dir / "sbatch.args").read_text() == f"--parsable {script}\n"
    assert " 4242 sbatch --parsable " in (logs / "submissions.txt").read_text()
    assert json.loads((logs / "dqn_snake.json").read_text())["python"] == str(fake)
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
    assert (
        "args: dqn_snake_vec.py --height 6 --width 6 --num-envs 8 --exp-name dqn_snake_vec_n8 --seed 2 "
        "--total-timesteps 500\n" in calls
    )
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

    # SIGTERM while the run starts (before its handler): stopped before its first checkpoint, not a failure
    fake_log.unlink()
    proc = task(2, wait=True, FAKE_STARTING="1")
    try:
        wait_for(lambda: fake_log.exists() and "waiting" in fake_log.read_text(), 60, "the stand-in run")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = (logs / "002_Snake6x6_n=8_seed=3.log").read_text()
    last = log.rstrip().splitlines()[-1]
    assert "stopped before its first checkpoint" in last and "--resume-existing starts it afresh" in last, log
