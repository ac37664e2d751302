"""continuous_envs.py against CleanRL's ppo_continuous_action.py: HostEnvs processes observations
and rewards as CleanRL's per-env wrapper stack does (gymnasium's ClipAction, NormalizeObservation, NormalizeReward,
each clipped to +-10) for as long as no episode ends; at an episode's end it differs by design (docs/ppo_continuous.md,
items 6-8): a time limit bootstraps from the critic's value of the true last observation (this file checks that only
a time limit does), the discounted return of the reward scale restarts at every end (gymnasium's restarts at a
termination only), and the last observation of an episode does not enter the statistics. DeviceEnvs (--sim mjx)
computes what HostEnvs computes from the same worlds. CPU only, a few seconds (the MJX test: about 20 s)."""

import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmark"))
pytest.importorskip("stable_baselines3", reason="benchmark/baseline_ppo.py needs it: pip install -e '.[test]'")
import baseline_ppo  # noqa: E402  (CleanRL's PPO as a reader knows it, its make_env among it)

import continuous_envs  # noqa: E402
import mjx_envs  # noqa: E402

GAMMA = 0.99
CPU = torch.device("cpu")


def host_envs(env_fns):
    return continuous_envs.HostEnvs(env_fns, False, GAMMA, CPU)


def test_host_envs_process_as_cleanrls_wrappers_while_no_episode_ends():
    mode = gym.vector.AutoresetMode.SAME_STEP
    reference = gym.vector.SyncVectorEnv([baseline_ppo.make_env("Pendulum-v1", GAMMA)], autoreset_mode=mode)
    envs = host_envs([lambda: continuous_envs.DropInfo(gym.make("Pendulum-v1"))])
    expected, _ = reference.reset(seed=3)
    # gymnasium keeps Pendulum's statistics in float32 (the observations' dtype), HostEnvs in float64: the first
    # observations, which differ from the mean by 1e-4 of themselves, keep fewer digits there
    np.testing.assert_allclose(envs.reset(seed=3).numpy(), expected, rtol=1e-3)
    rng = np.random.default_rng(0)
    for step in range(150):  # Pendulum's time limit is 200 steps
        action = rng.normal(size=(1, 1)) * 3.0  # beyond the bounds of +-2: clipped on both sides
        expected, reward, terminated, truncated, _ = reference.step(action)
        obs, rewards, dones = envs.step(torch.as_tensor(action, dtype=torch.float32), None, step)
        np.testing.assert_allclose(obs.numpy(), expected, rtol=1e-3, atol=1e-5)
        np.testing.assert_allclose(rewards.numpy(), reward, rtol=1e-5)
        assert not (dones.any() or terminated.any() or truncated.any())


@pytest.mark.parametrize("env_id, limit", [("Pendulum-v1", 7), ("Hopper-v5", 25)])
def test_only_a_time_limit_bootstraps_from_the_true_last_observation(env_id, limit):
    """Two HostEnvs in lockstep, one with a critic of 0: their rewards differ by gamma times the critic's value of the
    episode's last observation (normalised, frozen statistics) where a time limit ended it, and nowhere else; a plain
    vector env of the same seeds says how each episode ended and what it returned."""
    make = lambda: continuous_envs.DropInfo(gym.make(env_id, max_episode_steps=limit))  # noqa: E731
    plain = gym.vector.SyncVectorEnv([make] * 3, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs, zero = host_envs([make] * 3), host_envs([make] * 3)
    plain.reset(seed=5)
    envs.reset(seed=5)
    zero.reset(seed=5)
    weights = torch.linspace(-1.0, 1.0, envs.obs_dim)
    seen = []

    def critic(norm_obs):  # records what it is asked to value
        seen.append(norm_obs.clone())
        return norm_obs @ weights + 1.0

    rng = np.random.default_rng(1)
    raw_returns, returns, ends = np.zeros(3), [], {"terminated": 0, "truncated": 0}
    for step in range(80):
        action = rng.uniform(-2.0, 2.0, size=(3, envs.act_dim))
        _, raw_reward, terminated, truncated, info = plain.step(np.clip(action, envs.low, envs.high))
        action = torch.as_tensor(action, dtype=torch.float32)
        seen.clear()
        _, rewards, dones = envs.step(action, critic, step)
        _, zero_rewards, _ = zero.step(action, lambda obs: torch.zeros(len(obs)), step)
        cut = np.nonzero(truncated & ~terminated)[0]
        bootstrap = np.zeros(3)
        if len(cut):
            final = envs.obs_rms.normalize(np.stack([info["final_obs"][i] for i in cut]), False)
            (valued,) = seen  # one batched call, on the last observations of the envs cut short
            np.testing.assert_allclose(valued.numpy(), final, atol=1e-6)
            bootstrap[cut] = GAMMA * (torch.as_tensor(final, dtype=torch.float32) @ weights + 1.0).numpy()
        else:
            assert seen == []
        np.testing.assert_allclose((rewards - zero_rewards).numpy(), bootstrap, atol=1e-5)
        np.testing.assert_array_equal(dones.numpy(), terminated | truncated)
        raw_returns += raw_reward
        returns += list(raw_returns[terminated | truncated])
        raw_returns[terminated | truncated] = 0.0
        ends["terminated"] += int(terminated.sum())
        ends["truncated"] += int((truncated & ~terminated).sum())
    assert ends["truncated"] > 0 and (env_id == "Pendulum-v1" or ends["terminated"] > 0)
    logged = [episode[1] for episode in envs.finished()]
    np.testing.assert_allclose(logged, returns)  # charts/episodic_return: the raw rewards, not the scaled ones


@pytest.mark.slow
@pytest.mark.skipif(bool(mjx_envs.missing_extra()), reason=mjx_envs.missing_extra() or "")
def test_device_envs_process_mjx_worlds_as_host_envs_do():
    """DeviceEnvs (statistics and results on the device) against HostEnvs' numpy code fed the same worlds' outputs:
    observations, scaled and bootstrapped rewards, dones and the logged episodes agree to float32 rounding."""
    worlds, limit = 8, 7  # a short time limit: truncations and Hopper's falls within 40 steps
    a, b = (mjx_envs.MJXVectorEnv("Hopper-v5", worlds, seed=5, device=CPU, max_episode_steps=limit) for _ in "ab")

    class AsGymnasium:  # the MJX worlds through gymnasium's vector API in numpy, as HostEnvs reads it
        def reset(self, seed):
            return b.reset(seed=seed)[0].numpy(), {}

        def step(self, action):
            obs, reward, terminated, truncated, info = b.step(torch.as_tensor(action))
            done = (terminated | truncated).numpy()
            final = np.empty(worlds, dtype=object)
            for i in np.nonzero(done)[0]:
                final[i] = info["final_obs"][i].numpy()
            return obs.numpy(), reward.double().numpy(), terminated.numpy(), truncated.numpy(), {"final_obs": final}

    host = object.__new__(continuous_envs.HostEnvs)  # its __init__ builds gymnasium envs: its state set by hand
    host.envs, host.gamma, host.device = AsGymnasium(), GAMMA, CPU
    host.low, host.high = b.single_action_space.low, b.single_action_space.high
    host.obs_dim, host.act_dim = b.single_observation_space.shape[0], b.single_action_space.shape[0]
    host.obs_rms, host.ret_rms = continuous_envs.RunningMeanStd(host.obs_dim), continuous_envs.RunningMeanStd(())
    host.discounted, host.episode_return = np.zeros(worlds), np.zeros(worlds)
    host.episode_length, host.episodes = np.zeros(worlds, dtype=np.int64), []
    device = continuous_envs.DeviceEnvs(a, GAMMA, CPU)
    weights = torch.linspace(-1.0, 1.0, host.obs_dim)
    critic = lambda obs: obs @ weights  # noqa: E731
    torch.testing.assert_close(device.reset(seed=9), host.reset(seed=9))
    generator = torch.Generator().manual_seed(0)
    for step in range(40):
        action = torch.randn(worlds, host.act_dim, generator=generator) * 1.5
        for got, expected in zip(device.step(action, critic, step), host.step(action, critic, step)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    from_device, from_host = device.finished(), host.finished()
    assert len(from_device) == len(from_host) > worlds
    assert [(s, n) for s, _, n in from_device] == [(s, int(n)) for s, _, n in from_host]
    np.testing.assert_allclose([r for _, r, _ in from_device], [r for _, r, _ in from_host], rtol=1e-5)
