"""ppo_continuous.py: presets and explicit overrides, batch sizes, short runs, normalisation stats in saved models,
resume, subprocess envs, and one-line errors. CPU only, tiny budgets."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import tyro

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "ppo_continuous.py")
sys.path.insert(0, str(ROOT))
import ppo_continuous as pc  # noqa: E402

torch.set_num_threads(1)
ENV = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TINY = ["--no-progress-bar", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2", "--gpu", "false"]


def run(tmp_path, *args, timeout=120):
    cmd = [sys.executable, SCRIPT, *map(str, args)]
    return subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=timeout)


def parse(*argv):
    return pc.resolve_args(tyro.cli(pc.Args, args=list(argv)))


def run_dir(tmp_path):
    (path,) = (tmp_path / "runs").iterdir()
    return path


def assert_one_line_error(res, *words):
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert "Traceback" not in res.stderr


# ---------------------------------------------------------------- presets and batch sizes (in-process)


def test_defaults():
    args, source = parse()
    assert (args.num_envs, args.num_steps, args.update_epochs, args.network_arch) == (1, 2048, 10, "64,64")
    assert (args.batch_size, args.num_minibatches) == ("64", 32)
    assert set(source.values()) == {"default"}


@pytest.mark.parametrize(
    "preset,expected",
    [
        ("fast", (16, 256, "2048", 15, "512,512", 2)),
        ("heavy", (32, 256, "4096", 20, "1024,512,256", 2)),
        ("beast", (64, 512, "8192", 30, "1024,512,512,256", 4)),
    ],
)
def test_preset_expansion(preset, expected):
    args, source = parse("--preset", preset)
    got = (args.num_envs, args.num_steps, args.batch_size, args.update_epochs, args.network_arch, args.num_minibatches)
    assert got == expected
    assert all(v == f"preset {preset}" for v in source.values())


def test_explicit_flags_override_preset_even_at_default_values():
    # --num-envs 1 and --update-epochs 10 are the script defaults: passed explicitly they still beat the preset
    args, source = parse("--preset", "heavy", "--num-envs", "1", "--update-epochs", "10", "--network-arch", "32")
    assert (args.num_envs, args.update_epochs, args.network_arch) == (1, 10, "32")
    assert source["num_envs"] == source["update_epochs"] == source["network_arch"] == "explicit"
    assert args.num_steps == 256 and source["num_steps"] == "preset heavy"
    # the preset's 4096 no longer divides 1 x 256: the largest divisor below it is taken
    assert args.batch_size == "256" and "auto" in source["batch_size"]
    args, source = parse("--preset", "fast", "--num-minibatches", "8")
    assert (args.batch_size, args.num_minibatches, source["batch_size"]) == ("512", 8, "explicit")


def test_batch_size_auto_and_explicit():
    args, _ = parse("--batch-size", "auto")
    assert args.batch_size == "64"  # largest divisor of 2048 <= 2048/32
    args, _ = parse("--preset", "fast", "--num-envs", "12", "--batch-size", "auto")
    assert args.batch_size == "1536" and args.num_minibatches == 2  # 12*256 = 3072: largest divisor <= 2048
    args, _ = parse("--num-steps", "100", "--num-envs", "3", "--batch-size", "75")
    assert (args.batch_size, args.num_minibatches) == ("75", 4)


def test_batch_size_error():
    with pytest.raises(ValueError, match="valid sizes") as info:
        parse("--batch-size", "100")
    message = str(info.value)  # printed by __main__ as one "error: ..." line, exit code 2
    assert "\n" not in message and "100" in message and "2048" in message and "64, 128" in message


def test_discrete_env_gives_one_line_error(tmp_path):
    assert_one_line_error(run(tmp_path, "--env-id", "CartPole-v1"), "CartPole-v1", "Discrete", "continuous")


@pytest.mark.parametrize(
    "argv,error,match",
    [
        (["--env-id", "NoSuchEnv-v9"], ValueError, "unknown env id"),
        (["--gae-lambda", "1.5"], ValueError, "gae-lambda"),
        (["--network-arch", "64,x"], ValueError, "network-arch"),
        (["--num-minibatches", "3"], ValueError, "does not divide"),
        (["--batch-size", "64", "--num-minibatches", "32"], ValueError, "not both"),
        (["--env-id", "Pendulum-v1", "--total-timesteps", "100"], ValueError, "less than one batch"),
        (["--eval-checkpoint", "missing.pt"], FileNotFoundError, "missing.pt"),
        (["--resume", "missing.pt"], FileNotFoundError, "missing.pt"),
    ],
)
def test_bad_inputs_raise_before_training(tmp_path, monkeypatch, argv, error, match):
    monkeypatch.chdir(tmp_path)  # the script's __main__ turns these into one "error: ..." line and exit code 2
    with pytest.raises(error, match=match):
        pc.main(tyro.cli(pc.Args, args=argv))
    assert not (tmp_path / "runs").exists()


def test_gpu_true_without_cuda_and_garbage_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--gpu true"):
            pc.main(tyro.cli(pc.Args, args=["--env-id", "Pendulum-v1", "--gpu", "true"]))
    (tmp_path / "bad.pt").write_text("not a checkpoint")
    for flag in ("--resume", "--eval-checkpoint"):
        with pytest.raises(ValueError, match="not a ppo_continuous.py checkpoint"):
            pc.main(tyro.cli(pc.Args, args=[flag, "bad.pt"]))


def test_obs_normalizer_matches_host_statistics():
    rms = pc.RunningMeanStd((5,))
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(4, 5)) for _ in range(20)]
    for b in batches:
        rms.update(b)
    seen = np.concatenate(batches)  # running statistics equal the statistics of everything seen
    assert np.allclose(rms.mean, seen.mean(0), atol=1e-4) and np.allclose(rms.var, seen.var(0), rtol=1e-3)
    x = rng.normal(3.0, 2.0, size=(1000, 5))
    norm = pc.ObsNormalizer(5)
    norm.load_rms(rms)
    host = np.clip((x - rms.mean) / np.sqrt(rms.var + 1e-8), -10, 10).astype(np.float32)
    assert np.array_equal(norm(torch.from_numpy(x)).numpy(), host)


# ---------------------------------------------------------------- short runs


@pytest.fixture(scope="module")
def pendulum_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("pendulum")
    res = run(tmp_path, "--env-id", "Pendulum-v1", "--total-timesteps", "256", *TINY, "--save-model")
    assert res.returncode == 0, res.stderr
    return tmp_path, res


def test_pendulum_run_logs_and_saves(pendulum_run):
    tmp_path, res = pendulum_run
    assert "device: cpu (--gpu false)" in res.stdout and "memory estimate" in res.stdout
    assert re.search(r"num_steps\s+64\s+\(explicit\)", res.stdout)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir(tmp_path)))
    acc.Reload()
    keys = set(acc.Tags()["scalars"])
    assert {"charts/episodic_return", "charts/SPS", "charts/learning_rate", "losses/value_loss"} <= keys
    assert acc.Scalars("charts/SPS")[-1].step == 256
    assert (run_dir(tmp_path) / "checkpoint.pt").exists() and (run_dir(tmp_path) / "ppo_continuous.model").exists()


def test_normalisation_stats_survive_save_load_eval(pendulum_run, monkeypatch, capsys):
    tmp_path, _ = pendulum_run
    model = run_dir(tmp_path) / "ppo_continuous.model"
    saved = torch.load(model, weights_only=True)
    agent = pc.Agent(3, 1, [64, 64])
    agent.load_state_dict(saved["agent"])
    # 256 observed transitions + 1 reset observation went into the statistics
    assert agent.obs_norm.count.item() == pytest.approx(257, abs=1e-3)
    assert agent.obs_norm.mean.abs().sum() > 0 and not torch.allclose(
        agent.obs_norm.var, torch.ones(3, dtype=torch.float64)
    )
    obs = torch.tensor([[0.5, -0.5, 3.0], [-1.0, 0.0, -6.0]], dtype=torch.float64)
    with torch.no_grad():
        actions = agent.act(obs)
        again = pc.Agent(3, 1, [64, 64])
        again.load_state_dict(torch.load(run_dir(tmp_path) / "checkpoint.pt", weights_only=True)["agent"])
        assert torch.equal(again.act(obs), actions)  # checkpoint and model file hold the same policy
        fresh = pc.Agent(3, 1, [64, 64])
        fresh.load_state_dict({k: v for k, v in saved["agent"].items() if not k.startswith("obs_norm.")}, strict=False)
        assert not torch.allclose(fresh.act(obs), actions)  # so the statistics matter
    # the script's eval path uses the saved statistics: it acts exactly like the loaded agent above
    monkeypatch.chdir(tmp_path)
    returns = pc.main(tyro.cli(pc.Args, args=["--eval-checkpoint", str(model), "--eval-episodes", "1", "--seed", "7"]))
    assert "mean return" in capsys.readouterr().out
    env = pc.gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=7)
    total, done = 0.0, False
    while not done:
        with torch.no_grad():
            action = agent.act(torch.from_numpy(obs.astype(np.float64))[None])[0].numpy()
        obs, reward, term, trunc, _ = env.step(action.clip(-2.0, 2.0))
        total, done = total + float(reward), term or trunc
    assert returns == [pytest.approx(total)]


def test_resume_after_sigterm_reaches_same_total(tmp_path):
    total = 32 * 15
    args = ["--env-id", "Pendulum-v1", "--total-timesteps", total, "--no-progress-bar", "--num-steps", "32"]
    args += ["--num-minibatches", "1"]
    args += ["--update-epochs", "1", "--gpu", "false", "--checkpoint-every", "0", "--save-model"]
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, *map(str, args)], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, text=True
    )
    for line in proc.stdout:
        if line.startswith("iteration 3/"):
            proc.send_signal(signal.SIGTERM)
            break
    out = line + proc.stdout.read()
    assert proc.wait(timeout=60) == 0
    assert "stopping on SIGTERM" in out and "--resume" in out, out
    ckpt_path = run_dir(tmp_path) / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    stopped = ckpt["global_step"]
    assert 3 * 32 <= stopped < total and ckpt["iteration"] * 32 == stopped and ckpt["status"] == "stopped"
    assert not (run_dir(tmp_path) / "ppo_continuous.model").exists()

    res = run(tmp_path, "--resume", ckpt_path, "--no-progress-bar")
    assert res.returncode == 0, res.stderr
    assert f"resumed {ckpt_path}" in res.stdout and f"at step {stopped}" in res.stdout
    assert f"iteration 15/15: step {total}" in res.stdout
    assert len(list((tmp_path / "runs").iterdir())) == 1  # same run directory
    final = torch.load(run_dir(tmp_path) / "ppo_continuous.model", weights_only=True)
    # statistics carried over: every transition of both legs + one reset observation per leg
    assert final["agent"]["obs_norm.count"].item() == pytest.approx(total + 2, abs=1e-3)
    assert final["args"]["total_timesteps"] == total
    assert torch.load(ckpt_path, weights_only=True)["status"] == "finished"


def _descendants(pid):
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *_descendants(child)]
    return found


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_mujoco_subproc_run_closes_workers(tmp_path):
    # a MuJoCo v5 env, stepped in 2 subprocesses, under --gpu auto (the small MLP stays on the CPU)
    args = ["--env-id", "InvertedPendulum-v5", "--total-timesteps", 64 * 2 * 4, *TINY[:-2], "--num-envs", "2"]
    args += ["--subproc"]
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, *map(str, args)],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = set()
    while proc.poll() is None:
        seen.update(_descendants(proc.pid))
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert "subproc True" in out and "iteration 4/4: step 512" in out
    assert "--gpu auto: network 64,64 is small" in out  # with the reason printed
    assert len(seen) >= 2, "expected env worker processes"  # forkserver + 2 workers
    deadline = time.time() + 10
    while any(_alive(p) for p in seen) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in seen), "env worker processes outlived the run"


def test_clip_grad_norm_matches_torch():
    torch.manual_seed(0)
    grads = [torch.randn(64, 17) * 3, torch.randn(64), torch.randn(1, 6)]
    expected = [g.clone() for g in grads]
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in expected]
    for p, g in zip(params, expected):
        p.grad = g
    torch.nn.utils.clip_grad_norm_(params, 0.5)
    pc.clip_grad_norm(grads, 0.5)
    for g, e in zip(grads, expected):
        assert torch.allclose(g, e, atol=1e-7)
