"""The sweep engine benchmark/sweep.py and its wrappers (ppo_atari.sh, ppo_continuous.sh, dqn_snake.sh): grids, the
slots (GPUs, CPUs, threads), --resume-existing, the local queue with its signals and summary, the dry run, bad input,
and the SLURM job array run here by bash with stand-ins for python and sbatch (tests/test_slurm.py submits to a live
cluster). Most tests call the engine in this process; the ones that start runs or signal it run it as a process."""

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from helpers import SNAKE_LONGER, SNAKE_LONGER_STEPS, save_checkpoint_with_code, wait_for

torch = pytest.importorskip("torch")
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmark"))
import sweep  # noqa: E402

sys.path.remove(os.path.join(ROOT, "benchmark"))  # not pop(0): importing sweep put the repo root first
import gpu_utils  # noqa: E402
import ppo_continuous as pc  # noqa: E402
import run_utils  # noqa: E402

RUN_RE = re.compile(r"^\[run (\d+)\] (cpu|cuda:\d+): (.*)$")
SWEEP_ENV = ("CUDA_OFFSET", "CUDA_VISIBLE_DEVICES", "NUM_GPUS", "RESUME_EXISTING", "PYTHON", "SWEEP_PYTHON")
SWEEP_ENV += ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "WANDB_ENTITY", "WANDB_PROJECT_NAME")
CPUS = sorted(os.sched_getaffinity(0))
PIN = subprocess.run(["taskset", "-c", str(CPUS[0]), "true"], capture_output=True).returncode == 0
SNAKE = ["--sizes", "5", "--num-envs", "8"]


def sweep_env(**env):
    """This environment less the variables a sweep reads, with 2 GPUs from CUDA_OFFSET 1, plus ``env``."""
    full = {k: v for k, v in os.environ.items() if k not in SWEEP_ENV and not k.startswith("SLURM_")}
    return {**full, "NUM_GPUS": "2", "CUDA_OFFSET": "1", "PYTHON": "python3", "SWEEP_PYTHON": sys.executable, **env}


def wrapper(script, *args, repo=ROOT, **env):
    """Run a sweep script as a user does; returns the finished process."""
    cmd = ["bash", os.path.join(repo, "benchmark", script), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=sweep_env(**env), cwd=repo)


@pytest.fixture
def engine(monkeypatch, capsys):
    """Call ``sweep.main`` in this process with a sweep environment; returns (rc, stdout, stderr)."""

    def call(*argv, **env):
        for key, value in sweep_env(**env).items():
            monkeypatch.setenv(key, value)
        for key in [k for k in SWEEP_ENV if k not in sweep_env(**env)]:
            monkeypatch.delenv(key, raising=False)
        rc = sweep.main([str(a) for a in argv])
        out = capsys.readouterr()
        return rc, out.out, out.err

    return call


def planned(out):
    """(run, device, thread variables, taskset CPUs or None, command) of each run a dry run prints."""
    found = []
    for m in filter(None, map(RUN_RE.match, out.splitlines())):
        words = shlex.split(m[3])
        env = dict(words.pop(0).split("=", 1) for _ in range(2))
        cpus = words[2] if words[0] == "taskset" else None
        found.append((int(m[1]), m[2], env, cpus, words[3:] if cpus else words))
    return found


def flag(cmd, name):
    return cmd[len(cmd) - 1 - cmd[::-1].index(name) + 1]


def one_error(rc, err, *words):
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, err


def mini_repo(dest):
    """The scripts and benchmark/ in ``dest``, whose runs/ then holds this test's runs only."""
    dest.mkdir()
    # the scripts and every module beside them (gpu_utils.py, run_utils.py, the env modules) that they import
    for name in sorted(name for name in os.listdir(ROOT) if name.endswith(".py")):
        os.symlink(os.path.join(ROOT, name), dest / name)
    (dest / "benchmark").mkdir()
    for name in ("sweep.py", "sweep.sh", "dqn_snake.sh", "atari_lambdas.csv"):
        os.symlink(os.path.join(ROOT, "benchmark", name), dest / "benchmark" / name)
    return dest


def fake_checkpoint(repo, run_id, status, step, total, stamp=1700000000):
    """A checkpoint.pt with the keys --resume-existing reads, as the scripts write it."""
    run_dir = repo / "runs" / f"{run_id}__{stamp}"
    run_dir.mkdir(parents=True)
    ckpt = {"model": {}, "args": {"total_timesteps": total}, "status": status, "global_step": step}
    torch.save(ckpt, run_dir / "checkpoint.pt")
    return run_dir


def fake_python(tmp_path, body):
    """An executable that stands in for python: ``body`` in bash, with $FAKE_LOG to write to."""
    path = tmp_path / "fakepython"
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)
    return path


# ---------------------------------------------------------------- grids


def test_run_names_round_trip():
    rid = sweep.run_id("ALE/Pong-v5", "ppo_atari", 3)
    assert rid == "ALE_Pong-v5__ppo_atari__3"
    assert sweep.parse_run_name(f"{rid}__1700000000") == ("ALE_Pong-v5", "ppo_atari", 3, 1700000000)
    assert sweep.parse_run_name("Hopper-v5__ppo_continuous_fast__-1__5") == ("Hopper-v5", "ppo_continuous_fast", -1, 5)
    assert sweep.parse_run_name("sweep_logs") is None and sweep.parse_run_name(rid) is None


def test_grids(engine):
    rc, out, err = engine("ppo_atari", "--dry-run", "--seeds", "1 2", NUM_GPUS="0")
    runs = planned(out)
    assert rc == 0 and len(runs) == 16, err
    lambdas = {flag(cmd, "--env-id"): flag(cmd, "--gae-lambda") for *_, cmd in runs}
    assert (
        lambdas["ALE/Breakout-v5"] == "0.70" and lambdas["ALE/Pong-v5"] == "0.85" and lambdas["ALE/Enduro-v5"] == "0.95"
    )
    assert [flag(cmd, "--seed") for *_, cmd in runs[:2]] == ["1", "2"]
    rc, out, _ = engine("ppo_atari", "--dry-run", "--all", "--seeds", "1", NUM_GPUS="0")
    assert len(planned(out)) == 57
    # a --gae-lambda after -- is used as given, for every game
    rc, out, _ = engine(
        "ppo_atari", "--dry-run", "--games", "Pong ALE/Qbert-v5", "--seeds", "1", "--", "--gae-lambda", "0.5"
    )
    assert [cmd.count("--gae-lambda") for *_, cmd in planned(out)] == [1, 1]
    rc, out, _ = engine(
        "ppo_continuous", "--dry-run", "--envs", "Hopper-v5", "--presets", "default heavy", "--seeds", "1"
    )
    ((_, _, _, _, default), (_, _, _, _, heavy)) = planned(out)
    assert flag(default, "--exp-name") == "ppo_continuous" and "--preset" not in default
    assert flag(heavy, "--exp-name") == "ppo_continuous_heavy" and flag(heavy, "--preset") == "heavy"
    # every preset the script has, worlds (--sim mjx) included; it was refused as unknown
    presets = typing.get_args(typing.get_args(typing.get_type_hints(pc.Args)["preset"])[0])
    grid = ["ppo_continuous", "--dry-run", "--envs", "Hopper-v5", "--presets", " ".join(presets), "--seeds", "1"]
    rc, out, _ = engine(*grid, "--", "--sim", "mjx")
    assert rc == 0 and [flag(cmd, "--preset") for *_, cmd in planned(out)] == list(presets)
    # without --sim mjx the script refuses worlds: the sweep says so before any run starts (before: all failed)
    one_error(*engine(*grid)[::2], "preset worlds is 4,096 envs for --sim mjx: add -- --sim mjx")
    rc, out, _ = engine("dqn_snake", "--dry-run", "--sizes", "10 8x12", "--num-envs", "64", "--seeds", "1")
    assert [(flag(c, "--height"), flag(c, "--width"), flag(c, "--exp-name")) for *_, c in planned(out)] == [
        ("10", "10", "dqn_snake_vec_n64"),
        ("8", "12", "dqn_snake_vec_n64"),
    ]
    # lists split on white space: items one per line are as good as on one line
    rc, out, _ = engine("dqn_snake", "--dry-run", "--sizes", "6\n7", "--num-envs", "8", "--seeds", "1\n2")
    assert rc == 0 and len(planned(out)) == 4


def test_atari_lambda_table():
    import csv

    with open(os.path.join(ROOT, "benchmark", "atari_lambdas.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 57 and len({r["game"] for r in rows}) == 57
    assert all(0 <= float(r["gae_lambda"]) <= 1 and r["status"] in ("published", "default") for r in rows)
    assert all(r["gae_lambda"] == "0.95" for r in rows if r["status"] == "default")


# ---------------------------------------------------------------- slots: GPUs, CPUs and threads


def test_dry_run_places_runs_on_gpus_and_cpus(engine):
    # 2 GPUs from CUDA_OFFSET 1, 2 runs on each: slots in turn over the GPUs, each with its own CPUs
    rc, out, err = engine(
        "dqn_snake", "--dry-run", "--sizes", "6", "--num-envs", "8", "--seeds", "1 2 3 4 5", "--jobs-per-gpu", "2"
    )
    runs = planned(out)
    assert rc == 0 and [dev for _, dev, *_ in runs] == ["cuda:1", "cuda:0"] * 2 + ["cuda:1"], err
    assert all(
        flag(cmd, "--gpu") == dev[5:] and env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"]
        for _, dev, env, _, cmd in runs
    )
    groups = gpu_utils.split_cpus(CPUS, 4)
    assert [int(env["OMP_NUM_THREADS"]) for _, _, env, _, _ in runs[:4]] == [len(g) for g in groups]
    if PIN:  # the four slots' CPUs: disjoint groups, the fifth run takes the first slot's again
        assert [cpus for *_, cpus, _ in runs] == [sweep.cpu_ranges(g) for g in groups] + [sweep.cpu_ranges(groups[0])]
    assert f"4 runs at once on CPUs {sweep.cpu_ranges(CPUS)}" in out
    # --cpus-per-run: windows of that many CPUs, as many threads, wrapping round the CPUs
    rc, out, _ = engine("dqn_snake", "--dry-run", "--seeds", "1", "--jobs", "3", "--cpus-per-run", "1", NUM_GPUS="0")
    assert {env["OMP_NUM_THREADS"] for _, _, env, _, _ in planned(out)} == {"1"} and "3 runs at once" in out
    if PIN:
        assert [cpus for *_, cpus, _ in planned(out)[:3]] == [str(CPUS[s % len(CPUS)]) for s in range(3)]
    # what the runs are given after --: every run on GPU N, or on the CPU
    rc, out, _ = engine("dqn_snake", "--dry-run", "--seeds", "1 2", "--jobs-per-gpu", "2", "--", "--gpu", "0")
    assert {dev for _, dev, *_ in planned(out)} == {"cuda:0"} and "2 runs at once" in out
    assert all(cmd.count("--gpu") == 1 for *_, cmd in planned(out))
    for word in ("false", "cpu"):
        rc, out, _ = engine("dqn_snake", "--dry-run", "--seeds", "1", "--", "--gpu", word)
        assert {dev for _, dev, *_ in planned(out)} == {"cpu"} and all(c.count("--gpu") == 1 for *_, c in planned(out))
    assert sweep.cpu_ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


@pytest.mark.parametrize("script", ["ppo_atari.sh", "ppo_continuous.sh", "dqn_snake.sh"])
def test_wrapper_dry_run(script):
    res = wrapper(
        script, "--dry-run", "--seeds", "1 2", "--track", "--", "--total-timesteps", "1000", WANDB_ENTITY="me"
    )
    runs = planned(res.stdout)
    assert res.returncode == 0 and len(runs) >= 4, res.stderr
    for i, dev, _, _, cmd in runs:
        assert dev == ("cuda:1", "cuda:0")[i % 2] and cmd[0] == shlex.split(shlex.quote(cmd[0]))[0]
        assert cmd[-7:] == ["--track", "--wandb-entity", "me", "--total-timesteps", "1000", "--gpu", dev[5:]]
    assert res.stdout.rstrip().endswith("[dry run] nothing was started")


def test_bad_input_is_one_error_line(engine, tmp_path):
    for args, env, words in [
        (["ppo_atari", "--bogus"], {}, ["unrecognized arguments: --bogus", "after --"]),
        (["ppo_atari", "--", "--seed", "3"], {}, ["--seed after -- is set by the sweep", "--seeds"]),
        (["ppo_atari", "--", "--env-id=ALE/Pong-v5"], {}, ["--env-id", "--games"]),
        (["ppo_atari", "--", "--env_id=ALE/Pong-v5"], {}, ["--env-id", "--games"]),  # the scripts take it too
        (["dqn_snake", "--", "--num_envs", "3"], {}, ["--num-envs after --"]),
        (["ppo_continuous", "--", "--preset", "fast"], {}, ["--preset", "--presets"]),
        (["dqn_snake", "--", "--resume", "x.pt"], {}, ["--resume-existing"]),
        (["dqn_snake", "--", "--num-envs", "3"], {}, ["--num-envs after --"]),
        (["dqn_snake", "--jobs", "0"], {}, ["--jobs: must be an integer of at least 1, got '0'"]),
        (["dqn_snake", "--cpus-per-run"], {}, ["--cpus-per-run: expected one argument"]),
        (["dqn_snake", "--seeds", "one"], {}, ["seed 'one' is not an integer"]),
        (["dqn_snake", "--sizes", "2x8"], {}, ["board size '2x8'", "3 x 3"]),
        (["dqn_snake", "--sizes", "ten"], {}, ["board size 'ten'"]),
        (["dqn_snake", "--num-envs", "0"], {}, ["num_envs '0'"]),
        (["dqn_snake", "--num-envs", "²"], {}, ["num_envs '²'"]),  # a digit to isdigit(), not to int(): a traceback
        (["dqn_snake"], {"NUM_GPUS": "²"}, ["NUM_GPUS must be a non-negative integer"]),
        (["ppo_continuous", "--presets", "huge"], {}, ["unknown preset 'huge'"]),
        (["ppo_continuous", "--envs", "Hoper-v5"], {}, ["unknown env id Hoper-v5"]),
        (["ppo_atari", "--games", "Pong Breakuot"], {}, ["unknown env id ALE/Breakuot-v5"]),
        (["dqn_snake"], {"CUDA_OFFSET": "x"}, ["CUDA_OFFSET must be a non-negative integer"]),
        (["dqn_snake", "--", "--gpu", "2"], {}, ["--gpu 2 after -- is not", "2 GPUs"]),
        (["dqn_snake", "--", "--gpu", "fast"], {}, ["--gpu fast"]),
        # a typo after --: before, every run started and failed with exit 2
        (["dqn_snake", "--", "--learning-rat", "0.1"], {}, ["dqn_snake_vec.py has no flag --learning-rat", "did you"]),
        (["dqn_snake"], {"PYTHON": "no-such-python-xyz"}, ["python interpreter 'no-such-python-xyz' not found"]),
        (["nope"], {}, ["name the grid first"]),
        # a game, env, setting or seed listed twice: two runs would write one run's folder (and resume it twice)
        (["ppo_atari", "--games", "Pong Breakout ALE/Pong-v5"], {}, ["ALE_Pong-v5__ppo_atari__1 twice"]),
        (["dqn_snake", "--sizes", "10 10x10"], {}, ["Snake10x10__dqn_snake_vec_n256__1 twice"]),
        (["ppo_continuous", "--seeds", "1 2 1"], {}, ["twice", "--seeds"]),
    ]:
        one_error(*engine(args[0], "--dry-run", *args[1:], **env)[::2], *words)
    (tmp_path / "bad.json").write_text("{")
    for spec in ("none.json", "bad.json"):  # a SLURM task whose sweep file is gone or broken
        one_error(*engine("task", tmp_path / spec, "0")[::2], "cannot read the sweep's runs", spec)
    res = wrapper("dqn_snake.sh", "--dry-run", "--cpus-per-run")
    assert res.returncode == 2 and res.stderr == "error: argument --cpus-per-run: expected one argument\n"


def test_control_characters_are_refused(engine, tmp_path):
    """A newline in what a user gives would end a line of the sbatch script (or of a run's command or log) and start
    a command of its own: every sweep refuses it in one line naming where it came from."""
    payload = f"x\ntouch {tmp_path / 'flag'} #"
    slurm = ["ppo_atari", "--games", "Pong", "--seeds", "1", "--slurm", "--dry-run"]
    for args, env, named in [
        ([*slurm, "--", "--exp-name", payload], {}, "--exp-name after --"),
        ([*slurm, "--", f"--exp-name={payload}"], {}, "--exp-name after --"),
        ([*slurm, "--track"], {"WANDB_ENTITY": payload}, "--wandb-entity (WANDB_ENTITY)"),
        ([*slurm, "--log-dir", f"{tmp_path}\n"], {}, "--log-dir"),
        ([*slurm, "--partition", "gpu\n"], {}, "--partition"),
        ([*slurm, "--sbatch-args", "--comment", payload], {}, "--comment"),
        (["dqn_snake", "--dry-run", "--seeds", "1", "--", "--exp-name", "a\rb"], {}, "--exp-name after --"),
        (["dqn_snake", "--dry-run", "--seeds", "1", "--", "\x1b[2J"], {}, "argument after --"),
    ]:
        rc, out, err = engine(*args, **env)
        one_error(rc, err, named, "control character")
        assert "#!/bin/bash" not in out and not planned(out)
    assert not (tmp_path / "flag").exists()


# ---------------------------------------------------------------- --resume-existing


def test_an_output_folder_that_is_a_file_is_one_line(tmp_path, engine, capsys):
    """Before: a FileExistsError traceback from the sweep's --log-dir, report.py's and speed.py's --out (speed's after
    all its measuring). tune.py's --out: tests/test_tune.py."""
    taken = tmp_path / "a_file"
    taken.write_text("")
    rc, _, err = engine("dqn_snake", *SNAKE, "--seeds", "1", "--log-dir", taken, "--", "--total-timesteps", "64")
    one_error(rc, err, f"--log-dir {taken}: cannot make this folder")
    sys.path.insert(0, os.path.join(ROOT, "benchmark"))
    try:
        import report
        import speed
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmark"))
    with SummaryWriter(str(tmp_path / "runs" / "Snake5x5__dqn_snake_vec__1__1700000000")) as writer:
        writer.add_scalar("charts/episodic_return", 1.0, 8)
    for main, argv in [(report.main, [tmp_path / "runs"]), (speed.main, ["ceiling", "--snake-sizes", "64"])]:
        assert main([*map(str, argv), "--out", str(taken)]) == 2
        one_error(2, capsys.readouterr().err, f"--out {taken}: cannot make this folder")


def test_decide_resume(tmp_path):
    runs = str(tmp_path / "runs")
    fake_checkpoint(tmp_path, "Snake6x6__n8__1", "finished", 100, 100)
    stopped = fake_checkpoint(tmp_path, "Snake6x6__n8__2", "stopped", 40, 100)
    (tmp_path / "runs" / "Snake6x6__n8__2__1700000099").mkdir()  # a newer run that died before its checkpoint
    fake_checkpoint(tmp_path, "Pong__ppo__1", "finished", 10, 10, stamp=1700000001)
    running = fake_checkpoint(tmp_path, "Pong__ppo__1", "running", 5, 10, stamp=1700000002)  # the newest decides
    fake_checkpoint(tmp_path, "Hopper__ppo__11", "stopped", 1, 10)  # names that only start like the run's
    fake_checkpoint(tmp_path, "Hopper__ppo_fast__1", "stopped", 1, 10)
    diverged = fake_checkpoint(tmp_path, "Ant__ppo__1", "diverged", 30, 100)
    (tmp_path / "runs" / "Walker__ppo__1__1700000000").mkdir()
    (tmp_path / "runs" / "Walker__ppo__1__1700000000" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    ids = ["Snake6x6__n8__1", "Snake6x6__n8__2", "Pong__ppo__1", "Hopper__ppo__1", "Walker__ppo__1", "Ant__ppo__1"]
    got = [sweep.decide_resume(runs, rid) for rid in ids]
    assert [d.action for d in got] == ["skip", "resume", "resume", "fresh", "error", "skip"]
    assert "finished at step 100 of 100" in got[0].note
    assert got[1].checkpoint == str(stopped / "checkpoint.pt") and "stopped at step 40 of 100" in got[1].note
    assert got[2].checkpoint == str(running / "checkpoint.pt")
    assert "cannot read" in got[4].note and "move it away" in got[4].note and "\n" not in got[4].note
    assert got[5].checkpoint == str(diverged / "checkpoint.pt") and "other settings" in got[5].note
    # a checkpoint whose pickle would run code is read as data only: an error, and the code never runs
    marker = tmp_path / "the_payload_ran"
    save_checkpoint_with_code(stopped / "checkpoint.pt", marker, status="stopped", global_step=40)
    d = sweep.decide_resume(runs, "Snake6x6__n8__2")
    assert d.action == "error" and "holds more than data" in d.note and not marker.exists()
    # a run whose process holds its folder's lock trains now: live, whatever its checkpoint says
    fd = run_utils.lock_run_dir(running)
    try:
        d = sweep.decide_resume(runs, "Pong__ppo__1")
        assert d.action == "live" and str(running) in d.note
    finally:
        os.close(fd)
    assert sweep.decide_resume(runs, "Pong__ppo__1").action == "resume"
    # a foreign file with the keys but not their types: an error line (before: AttributeError, a traceback)
    for odd in ({"model": {}, "args": ["ppo.py", "--seed", "1"]}, {"model": {}, "args": {}, "global_step": "abc"}):
        torch.save(odd, stopped / "checkpoint.pt")
        d = sweep.decide_resume(runs, "Snake6x6__n8__2")
        assert d.action == "error" and "is not a training checkpoint (its model, args or step)" in d.note


def test_resume_existing_in_a_sweep(tmp_path, engine, monkeypatch):
    """The dry run and a real sweep act on each run's decision: finished skipped, stopped continued with --resume
    (a path from the folder the runs start in), a live run left alone, a bad checkpoint a failure, the rest
    afresh."""
    monkeypatch.chdir(tmp_path)  # where the user stands: its runs/
    done = fake_checkpoint(tmp_path, "Snake6x6__dqn_snake_vec_n8__1", "finished", 100, 100)
    stopped = fake_checkpoint(tmp_path, "Snake6x6__dqn_snake_vec_n8__2", "stopped", 40, 100)
    live = fake_checkpoint(tmp_path, "Snake6x6__dqn_snake_vec_n8__3", "running", 40, 100)
    (fake_checkpoint(tmp_path, "Snake6x6__dqn_snake_vec_n8__4", "stopped", 40, 100) / "checkpoint.pt").write_text("x")
    args = ["dqn_snake", "--sizes", "6", "--num-envs", "8", "--seeds", "1 2 3 4 5", "--resume-existing"]
    fd = run_utils.lock_run_dir(live)
    try:
        rc, out, err = engine(*args, "--dry-run", NUM_GPUS="0")
        assert rc == 0, err
        assert f"[sweep] skip [run 0] Snake6x6 n=8 seed=1: finished at step 100 of 100: runs/{done.name}/" in out
        assert f"[sweep] resume [run 1] Snake6x6 n=8 seed=2: stopped at step 40 of 100: runs/{stopped.name}/" in out
        assert "[sweep] live [run 2]" in out and "[sweep] error [run 3]" in out
        runs = {i: cmd for i, _, _, _, cmd in planned(out)}
        assert sorted(runs) == [1, 4] and "--resume" not in runs[4]
        assert flag(runs[1], "--resume") == f"runs/{stopped.name}/checkpoint.pt"
        # a real sweep: the runs that start fail at once (PYTHON=false); the summary counts each kind
        rc, out, err = engine(*args, "--log-dir", tmp_path / "logs", NUM_GPUS="0", PYTHON="false")
        summary = (tmp_path / "logs" / "summary.txt").read_text()
        assert rc == 1 and "0 ok, 3 failed, 0 stopped, 0 not started, 1 skipped, 1 live" in summary, out + err
        assert "[run 2] Snake6x6 n=8 seed=3" in summary and "cannot read" in summary
    finally:
        os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the sweep's Stopper took them
        signal.signal(signal.SIGINT, signal.default_int_handler)


# ---------------------------------------------------------------- local runs: the queue, pinning, signals


def test_local_queue_jobs_per_gpu_pinning_and_failures(tmp_path):
    """8 runs, 2 GPUs x 2 slots: never more than 2 at once on a GPU, each slot pinned to its CPUs with as many
    threads; a failed run does not stop the others, and the summary names it."""
    log = tmp_path / "fake.log"
    fake = fake_python(tmp_path, FAKE_RUN)
    res = wrapper(
        "dqn_snake.sh",
        *SNAKE,
        "--seeds",
        "1 2 3 4 5 6 7 8",
        "--jobs-per-gpu",
        "2",
        "--log-dir",
        tmp_path / "logs",
        PYTHON=str(fake),
        FAKE_LOG=str(log),
    )
    assert res.returncode == 1, res.stdout + res.stderr
    rows = [line.split() for line in log.read_text().splitlines()]
    start = {int(r[1]): (float(r[2]), r[3], r[4], r[5], r[6]) for r in rows if r[0] == "start"}
    end = {int(r[1]): float(r[2]) for r in rows if r[0] == "end"}
    assert sorted(start) == sorted(end) == list(range(1, 9))  # the failure did not stop the sweep
    for gpu in ("0", "1"):
        mine = [s for s in start if start[s][1] == gpu]
        assert len(mine) == 4 and max(sum(start[o][0] <= start[s][0] < end[o] for o in mine) for s in mine) == 2
    groups = gpu_utils.split_cpus(CPUS, 4)
    for _, _, cpus, omp, mkl in start.values():
        assert omp == mkl and int(omp) in {len(g) for g in groups}
        assert not PIN or [int(c) for c in re.split("[-,]", cpus)][0] in {g[0] for g in groups}
    summary = (tmp_path / "logs" / "summary.txt").read_text()
    assert "7 ok, 1 failed" in summary and "failed [run 3] Snake5x5 n=8 seed=4: exit code 3; log " in summary
    failed_log = (tmp_path / "logs" / "003_Snake5x5_n=8_seed=4.log").read_text()
    assert failed_log.startswith("# ") and "boom" in failed_log and "MKL_NUM_THREADS=" in failed_log.splitlines()[0]


FAKE_RUN = """# a run: records its seed, GPU, CPUs and threads; seed 4 fails
seed=""; gpu=""; prev=""
for a in "$@"; do [[ $prev == --seed ]] && seed=$a; [[ $prev == --gpu ]] && gpu=$a; prev=$a; done
cpus=$(awk '/^Cpus_allowed_list:/ { print $2 }' /proc/self/status)
echo "start $seed $(date +%s.%N) $gpu $cpus $OMP_NUM_THREADS $MKL_NUM_THREADS" >> "$FAKE_LOG"
sleep 0.3
echo "end $seed $(date +%s.%N)" >> "$FAKE_LOG"
[[ $seed == 4 ]] && { echo boom; exit 3; }
exit 0
"""


def stopped_sweep(args, env, started, what, cwd=None):
    """Start a sweep and SIGTERM it once ``started()`` holds: (its exit code, its stdout)."""
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        wait_for(started, 120, what)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    return proc.returncode, out


def test_local_sweep_stop_and_resume_existing(tmp_path):
    """SIGTERM to a sweep: its run writes a checkpoint and the sweep says so; the same command with
    --resume-existing skips the run that had finished and continues the stopped one in its folder to the end."""
    repo = mini_repo(tmp_path / "repo")
    done = fake_checkpoint(repo, "Snake5x5__dqn_snake_vec_n8__1", "finished", 800, 800)
    args = ["bash", "benchmark/dqn_snake.sh", *SNAKE, "--seeds", "1 2", "--resume-existing", "--log-dir"]
    env = sweep_env(NUM_GPUS="0", PYTHON=sys.executable)
    written = "runs/Snake5x5__dqn_snake_vec_n8__2__*/checkpoint.pt"
    rc, out = stopped_sweep(
        [*args, "logs", "--", *SNAKE_LONGER], env, lambda: list(repo.glob(written)), written, cwd=repo
    )
    summary = (repo / "logs" / "summary.txt").read_text()
    assert rc == 130 and "0 ok, 0 failed, 1 stopped, 0 not started, 1 skipped" in summary, out
    assert "its checkpoint is written" in summary and "--resume-existing continues" in summary
    (run_dir,) = repo.glob("runs/Snake5x5__dqn_snake_vec_n8__2__*")
    stopped = run_utils.read_checkpoint(run_dir / "checkpoint.pt")
    assert stopped["status"] == "stopped" and 0 < stopped["global_step"] < SNAKE_LONGER_STEPS
    res = subprocess.run(
        [*args, "logs2", "--", *SNAKE_LONGER], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"skip [run 0] Snake5x5 n=8 seed=1: finished at step 800 of 800: runs/{done.name}" in res.stdout
    assert f"resume [run 1] Snake5x5 n=8 seed=2: stopped at step {stopped['global_step']:,}" in res.stdout
    assert list(repo.glob("runs/Snake5x5__dqn_snake_vec_n8__2__*")) == [run_dir]  # continued, not restarted
    assert run_utils.read_checkpoint(run_dir / "checkpoint.pt")["status"] == "finished"


STARTING = """# a run still importing torch: no SIGTERM handler yet, so a stop kills it (rc 143) before any checkpoint
echo "started" >> "$FAKE_LOG"
exec sleep 60
"""


def test_a_stop_while_a_run_starts_is_not_a_failure(tmp_path):
    log = tmp_path / "fake.log"
    args = ["bash", os.path.join(ROOT, "benchmark", "dqn_snake.sh"), *SNAKE, "--seeds", "1 2", "--jobs", "1"]
    args += ["--log-dir", tmp_path]
    env = sweep_env(NUM_GPUS="0", PYTHON=str(fake_python(tmp_path, STARTING)), FAKE_LOG=str(log))
    rc, out = stopped_sweep(args, env, log.exists, "the run to start")
    summary = (tmp_path / "summary.txt").read_text()
    assert rc == 130 and "0 ok, 0 failed, 1 stopped, 1 not started" in summary, out
    assert ": before its first checkpoint; --resume-existing starts it afresh" in summary
    # no log to point to (before: "not started [run 1] ...: ; log <a file that does not exist>")
    assert "not started [run 1] Snake5x5 n=8 seed=2: the sweep stopped first\n" in summary


ENDING = """# a run that finished as the sweep stopped: its checkpoint says finished, and it exits 0
trap 'kill $!; exit 0' TERM
echo "started" >> "$FAKE_LOG"
sleep 60 & wait
"""


def test_a_run_that_finished_as_the_sweep_stopped_is_ok(tmp_path):
    """Before: every run that exited 0 after the stop was reported stopped, "its checkpoint is written;
    --resume-existing continues it", though --resume-existing would skip it as finished."""
    repo = mini_repo(tmp_path / "repo")
    fake_checkpoint(repo, "Snake5x5__dqn_snake_vec_n8__1", "finished", 800, 800)
    log = tmp_path / "fake.log"
    args = ["bash", "benchmark/dqn_snake.sh", *SNAKE, "--seeds", "1", "--log-dir", "logs"]
    env = sweep_env(NUM_GPUS="0", PYTHON=str(fake_python(tmp_path, ENDING)), FAKE_LOG=str(log))
    rc, out = stopped_sweep(args, env, log.exists, "the run to start", cwd=repo)
    assert rc == 130 and "ok [run 0] Snake5x5 n=8 seed=1: exit code 0" in out, out


# ---------------------------------------------------------------- SLURM: the job array's script, run here


def test_slurm_dry_run_script(engine):
    rc, out, err = engine(
        *("ppo_atari", "--dry-run", "--slurm", "--games", "Pong Breakout", "--seeds", "1 2", "--track"),
        *("--partition", "gpu", "--time", "1-00:00:00", "--gpus-per-run", "1", "--cpus-per-run", "8", "--mem", "32G"),
        *("--max-parallel", "3", "--account", "rl-lab", "--log-dir", "/tmp/sw"),
        *("--sbatch-args", "--qos=high", "--comment", "two words", "--", "--total-timesteps", "1000"),
        *("--exp-name", "$(touch pwned)"),  # reaches the runs' JSON file, never the script
    )
    assert rc == 0, err
    script = out[out.index("#!/bin/bash") : out.index("[dry run] nothing was submitted")]
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
    engine_path = os.path.join(ROOT, "benchmark", "sweep.py")
    task = f'exec {sys.executable} {engine_path} task /tmp/sw/ppo_atari.json "${{SLURM_ARRAY_TASK_ID:-}}"'
    assert script.splitlines()[-3:] == ["set -u", f"cd {os.getcwd()} || exit 2", task]  # where the user stands
    assert "pwned" not in script and "two words" not in script
    pong = "ppo_atari.py --env-id ALE/Pong-v5 --gae-lambda 0.85 --seed 1 --track --total-timesteps 1000 --exp-name"
    assert f"[task 0] ALE/Pong-v5 lambda=0.85 seed=1: {pong}" in out
    assert not os.path.exists("/tmp/sw/ppo_atari.json")
    if subprocess.run(["which", "shellcheck"], capture_output=True).returncode == 0:
        check = subprocess.run(["shellcheck", "-"], input=script, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout
    rc, out, _ = engine(
        "ppo_continuous", "--dry-run", "--slurm", "--envs", "Hopper-v5", "--presets", "fast", "--seeds", "1"
    )
    assert "#SBATCH --array=0-0\n" in out and "#SBATCH --gres" not in out and "no --gpus-per-run" in out
    for args, words in [
        (["--partition", "gpu"], ["--partition is a SLURM option; add --slurm"]),
        (["--slurm", "--jobs", "2"], ["--jobs and --jobs-per-gpu are for runs here", "--max-parallel"]),
        (["--slurm", "--max-parallel", "0"], ["--max-parallel: must be an integer of at least 1"]),
        (["--slurm", "--gpus-per-run", "one"], ["--gpus-per-run: must be an integer of at least 0"]),
        (["--slurm", "--mem", "lots"], ["--mem 'lots' is not a size"]),
        (["--slurm", "--partition", "a b"], ["--partition 'a b' has spaces"]),
        (["--slurm", "--log-dir", "/tmp/with space"], ["--slurm needs paths without spaces"]),
    ]:
        one_error(*engine("dqn_snake", "--dry-run", "--seeds", "1", *args)[::2], *words)


TASK_RUN = """# a run in a SLURM task: records its arguments and threads; FAKE_WAIT: trains until SIGTERM
echo "args: $* threads: $OMP_NUM_THREADS $MKL_NUM_THREADS" >> "$FAKE_LOG"
if [[ -n ${FAKE_STARTING:-} ]]; then  # still importing: no SIGTERM handler yet
  echo "waiting" >> "$FAKE_LOG"
  echo "starting" >> "$FAKE_LOG"
  exec sleep 60
fi
if [[ -n ${FAKE_WAIT:-} ]]; then
  trap 'echo "got TERM" >> "$FAKE_LOG"; sleep 0.3; echo "checkpoint written" >> "$FAKE_LOG"; exit 0' TERM
  echo "waiting" >> "$FAKE_LOG"
  for _ in $(seq 600); do sleep 0.1; done
fi
"""


def test_slurm_task_script_without_slurm(tmp_path):
    """The array's script run by bash as slurmd runs it (SLURM_* set), with a stand-in python and sbatch: each task
    runs its run in the repo root with SLURM's CPUs as threads, decides --resume-existing when it starts, and passes
    SIGTERM on to its run (which checkpoints) and waits for it, also when it comes while the run starts."""
    repo = mini_repo(tmp_path / "repo")
    bin_dir, fake_log, logs = tmp_path / "bin", tmp_path / "fake.log", tmp_path / "logs"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/usr/bin/env bash\necho "$@" > "$(dirname "$0")/sbatch.args"\necho 4242\n')
    (bin_dir / "sbatch").chmod(0o755)
    fake = fake_python(tmp_path, TASK_RUN)
    path = f"{bin_dir}:{os.environ['PATH']}"
    res = wrapper(
        "dqn_snake.sh",
        "--slurm",
        *SNAKE,
        "--seeds",
        "1 2 3",
        "--log-dir",
        logs,
        "--",
        "--total-timesteps",
        "500",
        repo=repo,
        PYTHON=str(fake),
        PATH=path,
    )
    assert res.returncode == 0 and "submitted job array 4242" in res.stdout, res.stderr
    script = logs / "dqn_snake.sbatch"
    assert (bin_dir / "sbatch.args").read_text() == f"--parsable {script}\n"
    assert json.loads((logs / "dqn_snake.json").read_text())["python"] == str(fake)

    def task(i, wait=False, **env):
        """Run task ``i`` as slurmd would; its output (SLURM's .out file) is the process's stdout."""
        full = sweep_env(FAKE_LOG=str(fake_log), SLURM_JOB_ID="101", SLURM_ARRAY_TASK_ID=i, **env)
        if wait:
            full["FAKE_WAIT"] = "1"
            return subprocess.Popen(
                ["bash", script], env=full, stdout=subprocess.PIPE, text=True, start_new_session=True
            )
        return subprocess.run(["bash", script], env=full, capture_output=True, text=True, timeout=120)

    res = task("", SLURM_CPUS_PER_TASK="3")
    assert res.returncode == 2 and "submit the script with sbatch" in res.stderr
    fake_checkpoint(repo, "Snake5x5__dqn_snake_vec_n8__1", "finished", 500, 500)
    stopped = fake_checkpoint(repo, "Snake5x5__dqn_snake_vec_n8__2", "stopped", 200, 500)
    res = task("0", RESUME_EXISTING="1")
    assert res.returncode == 0 and not fake_log.exists()  # finished: nothing ran
    assert "[sweep] skip [run 0] Snake5x5 n=8 seed=1: finished at step 500 of 500" in res.stdout
    res = task("1", RESUME_EXISTING="1", SLURM_JOB_CPUS_PER_NODE="2(x1)")
    cpus = min(2, len(os.sched_getaffinity(0)))  # SLURM's 2, within the CPUs this test may use (pytest -n pins)
    assert res.returncode == 0 and "[sweep] resume [run 0] Snake5x5 n=8 seed=2: stopped at step 200" in res.stdout
    assert fake_log.read_text() == (
        f"args: {repo}/dqn_snake_vec.py --height 5 --width 5 --num-envs 8 --exp-name dqn_snake_vec_n8 --seed 2 "
        f"--total-timesteps 500 --resume runs/{stopped.name}/checkpoint.pt threads: {cpus} {cpus}\n"
    )
    log = (logs / "001_Snake5x5_n=8_seed=2.log").read_text()  # in the repo root: paths are relative to it
    assert log.startswith("# ") and f"OMP_NUM_THREADS={cpus} MKL_NUM_THREADS={cpus} {fake}" in log.splitlines()[0]

    # SIGTERM to the batch shell only (as `scancel --batch` and the time limit's warning send it): passed on to the
    # run, which checkpoints, and waited for; then a SIGTERM that comes while the run still starts
    fake_log.unlink()
    for env, ends in [({}, "got TERM\ncheckpoint written\n"), ({"FAKE_STARTING": "1"}, "starting\n")]:
        proc = task("2", wait=True, SLURM_CPUS_PER_TASK="1", **env)
        try:
            wait_for(lambda: fake_log.exists() and "waiting" in fake_log.read_text(), 60, "the stand-in run")
            proc.send_signal(signal.SIGTERM)
            out = proc.communicate(timeout=60)[0]
        finally:
            with contextlib.suppress(ProcessLookupError):  # the task ended, with its run
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 130 and fake_log.read_text().endswith(ends), out
        assert "0 ok, 0 failed, 1 stopped" in out and "threads: 1 1" in fake_log.read_text()
        assert ("before its first checkpoint" in out) == bool(env), out
        fake_log.unlink()


def test_a_killed_engines_runs_get_sigterm(tmp_path):
    """The engine (or the tuner) dies by SIGKILL: its runs get SIGTERM and so write
    their checkpoints instead of training on with nobody to read them."""
    done, started = tmp_path / "checkpoint", tmp_path / "started"
    child = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: (open({str(done)!r}, 'w'), sys.exit(0)))\n"
        f"open({str(started)!r}, 'w')\ntime.sleep(60)"
    )
    parent = (
        f"import sys, time\nsys.path.insert(0, {os.path.join(ROOT, 'benchmark')!r})\nimport sweep\n"
        f"sweep.start_run([sys.executable, '-c', {child!r}], [0], False, {str(tmp_path / 'log')!r}, "
        f"{str(tmp_path)!r})\ntime.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent])
    try:
        wait_for(started.exists, 30, "the run to start")
        proc.kill()
        wait_for(done.exists, 10, "the run's checkpoint on SIGTERM")
    finally:
        proc.kill()
        proc.wait()


def test_a_sweep_writes_its_runs_where_the_user_stands(tmp_path):
    """Issue #54: started from a folder outside the checkout, the sweep's runs wrote runs/ into the checkout (they
    started in its root), where `benchmark/report.py runs/` from that folder then found nothing. Now the runs start
    where the user stands (--work-dir picks another folder), as a script started by hand does, and the first line
    names the folder."""
    env = sweep_env(NUM_GPUS="0", PYTHON=sys.executable)
    args = ["bash", os.path.join(ROOT, "benchmark", "dqn_snake.sh"), *SNAKE, "--seeds", "1", "--", "--exp-name"]
    args += ["where54", "--total-timesteps", "400", "--learning-starts", "100000000", "--buffer-size", "800"]
    res = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[0].startswith(f"[sweep] dqn_snake: 1 runs write {tmp_path}/runs; logs in "), res
    (run_dir,) = tmp_path.glob("runs/Snake5x5__where54__1__*")
    assert run_utils.read_checkpoint(run_dir / "checkpoint.pt")["status"] == "finished"
    assert list(tmp_path.glob("runs/sweep_logs/dqn_snake_*/summary.txt"))
    assert not list(Path(ROOT, "runs").glob("Snake5x5__where54__*"))  # nothing in the checkout
    other = tmp_path / "other"
    res = subprocess.run([*args[:8], "--work-dir", other, "--dry-run"], cwd=tmp_path, env=env, capture_output=True)
    assert res.returncode == 0 and f"1 runs write {other}/runs".encode() in res.stdout.splitlines()[0], res
