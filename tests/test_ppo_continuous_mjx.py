"""ppo_continuous.py --sim mjx: the same PPO loop on MJX worlds (mjx_envs.py), here on JAX's CPU device. One-line
errors in-process; a short InvertedPendulum run that learns as the gymnasium envs do; stop and resume. The runs need
the mjx extra (`pip install -e ".[mjx]"`) and skip without it; JAX keeps what it compiles in ~/.cache/gpu-rl/jax, so
a second run on one machine starts in seconds instead of about half a minute."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import tyro
from helpers import scalars

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import continuous_envs  # noqa: E402
import mjx_envs  # noqa: E402
import ppo_continuous as pc  # noqa: E402

NEEDS_MJX = pytest.mark.skipif(bool(mjx_envs.missing_extra()), reason=mjx_envs.missing_extra() or "")
# 16 worlds and rollouts of 128 steps, the 2,048 steps per iteration of the defaults: on the 2-core VM (2026-11-26,
# shared with other work) seeds 1-3 reached a 20-episode mean of 900 at 48.6k, 47.1k and 50.0k steps and 1,000 by
# 81,920, against 49.7k, 47.5k and 47.8k with --sim cpu and the same flags
WORLDS = ["--sim", "mjx", "--env-id", "InvertedPendulum-v5", "--num-envs", "16", "--num-steps", "128"]


def run(tmp_path, *args, timeout=600):
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "ppo_continuous.py"), "--no-progress-bar", *map(str, args)]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--env-id", "Pendulum-v1"], "--sim mjx has HalfCheetah-v5, Hopper-v5, Walker2d-v5, InvertedPendulum-v5"),
        (["--env-id", "Hopper-v5", "--subproc"], "drop --subproc and --capture-video"),
        (["--env-id", "Hopper-v5", "--capture-video"], "drop --subproc and --capture-video"),
    ],
)
def test_what_mjx_worlds_cannot_do_is_one_line_error(argv, words):
    args = tyro.cli(pc.Args, args=["--sim", "mjx", *argv])
    pc.resolve_args(args)
    with pytest.raises(ValueError, match=words) as info:
        pc.validate(args, evaluating=False)
    assert "\n" not in str(info.value)


def test_without_the_extra_the_run_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(mjx_envs, "missing_extra", lambda impl="jax": 'MJX envs need jax: pip install -e ".[mjx]"')
    args = tyro.cli(pc.Args, args=["--sim", "mjx", "--env-id", "Hopper-v5"])
    pc.resolve_args(args)
    with pytest.raises(ValueError, match=r'--sim mjx: MJX envs need jax: pip install -e "\.\[mjx\]"'):
        pc.validate(args, evaluating=False)


@NEEDS_MJX
def test_worlds_that_cannot_run_here_are_refused_before_the_run_writes_anything(tmp_path):
    """Before: the worlds were built after the run had made its folder, so a refusal of this machine's JAX (a jaxlib
    that can hang on the CPU, no CUDA plugin for the GPU) left an empty run in runs/ behind its one-line error."""
    patched = "import runpy, sys, mjx_envs; mjx_envs.cpu_deadlock_risk = lambda version: True; "
    patched += "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    argv = [str(ROOT / "ppo_continuous.py"), *WORLDS, "--total-timesteps", "2048", "--gpu", "false"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", patched, *argv], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode == 2 and "can hang MJX on the CPU" in res.stderr, res.stdout + res.stderr
    assert not (tmp_path / "runs").exists()


class NaNWorlds:
    """Two worlds as MJXVectorEnv returns them: world 0 ends in a non-finite observation (InvertedPendulum's rule
    terminates it, with a finite reward), world 1 is cut short by the time limit."""

    num_envs = 2
    single_action_space = pc.gym.spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)
    single_observation_space = pc.gym.spaces.Box(-np.inf, np.inf, (2,), dtype=np.float32)

    def reset(self, seed):
        return torch.zeros(2, 2), {}

    def step(self, action):
        final_obs = torch.tensor([[float("nan"), float("nan")], [0.5, -0.5]])
        episode = {"r": torch.tensor([3.0, 4.0]), "l": torch.tensor([3, 4], dtype=torch.int32)}
        done = torch.tensor([True, True])
        info = {"final_obs": final_obs, "episode": episode, "_episode": done}
        return (
            torch.zeros(2, 2),
            torch.tensor([1.0, 1.0]),
            torch.tensor([True, False]),
            torch.tensor([False, True]),
            info,
        )


def test_a_world_that_ends_in_a_non_finite_observation_keeps_its_reward_finite():
    """Before: DeviceEnvs multiplied every world's bootstrap value by its mask, and NaN * 0 is NaN: one world that
    terminated in a NaN observation made its reward NaN, and so the GAE and the whole update."""
    envs = continuous_envs.DeviceEnvs(NaNWorlds(), 0.99, torch.device("cpu"))
    envs.reset(seed=0)
    value = lambda obs: obs.sum(1) * 0.0 + 2.0  # noqa: E731 - a critic: NaN for a NaN observation, else 2
    _, rewards, dones = envs.step(torch.zeros(2, 1), value, global_step=2)
    # each reward scaled (its return's std is tiny: clipped to 10); world 1's bootstraps from its last observation
    assert rewards.tolist() == pytest.approx([10.0, 10.0 + 0.99 * 2.0])
    assert dones.tolist() == [1.0, 1.0]


@NEEDS_MJX
@pytest.mark.slow
def test_inverted_pendulum_learns_on_mjx_worlds(tmp_path):
    """The loop that learns on gymnasium's envs learns on the worlds: the mean of 20 consecutive episodes reaches
    900 within 65,536 steps (see WORLDS for the figures this setting gave)."""
    res = run(tmp_path, *WORLDS, "--total-timesteps", 65536)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    steps, returns = np.array(scalars(run_dir)["charts/episodic_return"]).T
    assert (np.diff(steps) >= 0).all() and steps[-1] <= 65536  # logged at the step each episode ended
    rolling = np.convolve(returns, np.ones(20) / 20, mode="valid")
    assert rolling.max() >= 900, f"best 20-episode mean {rolling.max():.1f}"
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    mean, var, count = saved["obs_rms"]  # the statistics kept on the device, saved as floats
    assert len(mean) == 4 and count == pytest.approx(16 * (65536 // 16 + 1), rel=1e-6)


@NEEDS_MJX
def test_a_stopped_mjx_run_resumes_with_its_statistics(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "ppo_continuous.py"), "--no-progress-bar", *WORLDS, "--total-timesteps", "204800"],
        cwd=tmp_path,
        env={**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("iteration 2/"):
            proc.send_signal(signal.SIGTERM)
            break
    out = "".join(lines) + proc.stdout.read()
    assert proc.wait(timeout=300) == 0 and "stopping on SIGTERM" in out, out[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["status"] == "stopped" and ckpt["args"]["sim"] == "mjx"
    ckpt["args"]["total_timesteps"] = ckpt["global_step"] + 2048  # one more iteration
    torch.save(ckpt, run_dir / "checkpoint.pt")
    res = run(tmp_path, "--resume", run_dir / "checkpoint.pt")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"resumed {run_dir / 'checkpoint.pt'} at step {ckpt['global_step']}" in res.stdout
    resumed = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert resumed["status"] == "finished" and resumed["obs_rms"][2] > ckpt["obs_rms"][2]  # the statistics went on
