"""ppo_continuous.py's envs as its PPO loop steps them: CleanRL's wrappers for continuous control, vectorised.

CleanRL's ``ppo_continuous_action.py`` wraps each env in ``ClipAction``, ``NormalizeObservation`` and
``NormalizeReward`` (each clipped to +-10). Here the same processing runs once over all envs of a batch:

- ``HostEnvs`` (``--sim cpu``): gymnasium's vector envs (in-process or ``--subproc``), with the running statistics
  on the host in float64 and the results copied to the training device in one transfer per step;
- ``DeviceEnvs`` (``--sim mjx``): ``mjx_envs.MJXVectorEnv``'s worlds, with the statistics and every result on the
  device, so that a step makes no host sync.

Both bootstrap the reward of an episode that its time limit cut short from the critic's value of its last
observation, count each episode's return and length, and keep their statistics in the checkpoint (``state()``), so
a resumed run and a loaded model see what training saw. Importing this module has no side effects.
"""

import os
import sys

import gymnasium as gym
import numpy as np
import torch

import gpu_utils

_WARNED: set[str] = set()  # the MuJoCo warnings this process has printed


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"MuJoCo warning: {message}", file=sys.stderr)


def is_mujoco(env_id: str) -> bool:
    """Whether gymnasium's ``env_id`` runs on MuJoCo: only then is MuJoCo imported, and MUJOCO_GL read."""
    return "mujoco" in str(gym.spec(env_id).entry_point)


def warn_once_per_process(env_id: str | None = None) -> None:
    """Make MuJoCo print each distinct warning once in this process, on stderr, instead of at every model it compiles
    and into MUJOCO_LOG.TXT in the working directory: gymnasium's half_cheetah.xml warns of a deprecated attribute
    (MuJoCo 4.0), once for each of a run's thousands of envs. ``env_id``: nothing for an env without MuJoCo."""
    if env_id is not None and not is_mujoco(env_id):
        return
    import mujoco  # here, not at the top: importing it reads MUJOCO_GL, which action_space sets first for a video

    mujoco.set_mju_user_warning(_warn_once)


class RecordVideo(gym.wrappers.RecordVideo):
    """gymnasium's RecordVideo whose failed write is a warning, not an exception out of the env's step: a Ctrl-C to
    the process group stops ffmpeg too, and the run must still stop cleanly with its checkpoint."""

    def stop_recording(self) -> None:
        try:
            super().stop_recording()
        except (OSError, RuntimeError) as exc:
            reason = gpu_utils.first_line(exc)
            print(f"warning: video {self._video_name}.mp4 not written ({reason}); the run goes on", file=sys.stderr)
            self.recorded_frames = []
            self.recording = False
            self._video_name = None


class DropInfo(gym.Wrapper):
    """Drop the per-step info dict (MuJoCo's reward terms): batching it costs more than the rest of a vector step."""

    def step(self, action):
        return *self.env.step(action)[:4], {}


def action_space(env_id: str, video: bool = False) -> gym.Space:
    """The action space of one ``env_id`` env. With ``video`` it first renders a frame, as --capture-video will, so
    that a missing renderer (pygame for the classic-control envs, an OpenGL for MuJoCo) is a one-line ValueError before
    the run writes anything rather than a traceback at its first reset. An unknown id is a ValueError too."""
    if env_id.startswith("ALE/"):  # ale_py registers its games only when imported: ppo_atari.py does
        raise ValueError(f"{env_id} is an Atari game, with discrete actions: ppo_atari.py trains it")
    if env_id not in gym.envs.registry:
        raise ValueError(f"unknown env id {env_id!r}; try HalfCheetah-v5, Hopper-v5 or Pendulum-v1")
    mujoco_env = is_mujoco(env_id)
    if video and mujoco_env and not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")  # headless MuJoCo rendering, for the run's video env too (made later)
    try:
        if mujoco_env:
            import mujoco  # here: importing it reads MUJOCO_GL, set above for a video

            mujoco.set_mju_user_warning(lambda message: None)  # silent: an error line may follow; the envs warn once
        with gym.make(env_id, render_mode="rgb_array" if video else None) as env:
            if video:
                env.reset(seed=0)
                env.render()
            return env.action_space
    except Exception as exc:  # noqa: BLE001 - gymnasium's DependencyNotInstalled, MuJoCo's GL errors, ...
        reason = gpu_utils.first_line(exc)
        if mujoco_env and os.environ.get("MUJOCO_GL"):  # MuJoCo's renderer, chosen at its import
            reason += f", with MUJOCO_GL={os.environ['MUJOCO_GL']}: unset it, or set one this machine has"
        if video:
            raise ValueError(f"--capture-video: {env_id} cannot render here ({reason}); drop --capture-video") from None
        raise ValueError(f"{env_id} cannot be made here ({reason})") from None


class RunningMeanStd:
    """Running mean and variance in float64, with the parallel-update formula of gymnasium's wrappers: numpy arrays
    on the host, or tensors on ``device``. Its (mean, var, count) go into checkpoints and saved models, so a loaded
    policy sees what it saw in training."""

    def __init__(self, shape=(), state=None, device=None):  # state: the (mean, var, count) of a checkpoint
        self.device = device
        mean, var, count = (np.zeros(shape), np.ones(shape), 1e-4) if state is None else state
        self.mean = self.array(mean)
        self.var = self.array(var)
        self.count = float(count)

    def array(self, x):
        if self.device is None:
            return np.asarray(x, dtype=np.float64)
        return torch.as_tensor(x, dtype=torch.float64, device=self.device)

    def state_dict(self) -> tuple:  # floats and lists of floats: exact, and torch.load(weights_only=True) reads them
        return self.mean.tolist(), self.var.tolist(), float(self.count)

    def load_state_dict(self, state) -> None:  # a checkpoint's, as a network's (run_utils.load_states)
        mean, var, count = state
        self.mean, self.var, self.count = self.array(mean), self.array(var), float(count)

    def update(self, x):
        b_count = x.shape[0]
        b_mean = x.sum(0) / b_count  # sum/count: np.mean and np.var cost more than the update itself on tiny batches
        b_var = ((x - b_mean) ** 2).sum(0) / b_count
        delta = b_mean - self.mean
        tot = self.count + b_count
        self.mean = self.mean + delta * (b_count / tot)
        self.var = (self.var * self.count + b_var * b_count + delta**2 * (self.count * b_count / tot)) / tot
        self.count = tot

    def normalize(self, obs, update: bool):
        """Observations normalised with the statistics (clipped to +-10), updating them first when ``update``."""
        obs = self.array(obs).reshape(len(obs), -1)
        if update:
            self.update(obs)
        return ((obs - self.mean) / (self.var + 1e-8) ** 0.5).clip(-10.0, 10.0)


def vector_env(env_fns, subproc: bool):
    """gymnasium's vector env over ``env_fns``, in this process or (``subproc``) each env in its own process."""
    mode = gym.vector.AutoresetMode.SAME_STEP  # a truncated episode's final obs is bootstrapped with the critic
    if subproc:  # forkserver: a clean process, not a fork of the training process
        return gym.vector.AsyncVectorEnv(env_fns, context="forkserver", autoreset_mode=mode, copy=False)
    return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=mode, copy=False)


class HostEnvs:
    """gymnasium's vector envs as the PPO loop steps them (CleanRL's wrappers, vectorised here): actions clipped to
    the action space; observations normalised by running statistics and rewards divided by the running std of the
    discounted return, both clipped to +-10, the statistics on the host in float64; the reward of an episode that
    its time limit cut short bootstraps from the value of its last observation. Results are tensors on ``device``."""

    def __init__(self, env_fns, subproc: bool, gamma: float, device: torch.device):
        self.envs = envs = vector_env(env_fns, subproc)
        self.gamma = gamma
        self.device = device
        self.low, self.high = envs.single_action_space.low, envs.single_action_space.high
        self.obs_dim = obs_dim = int(np.prod(envs.single_observation_space.shape))
        self.act_dim = envs.single_action_space.shape[0]
        self.obs_rms = RunningMeanStd(obs_dim)  # cheap per step on the host
        self.ret_rms = RunningMeanStd(())
        self.discounted = np.zeros(envs.num_envs)  # the discounted return whose std scales the rewards
        self.episode_return = np.zeros(envs.num_envs)
        self.episode_length = np.zeros(envs.num_envs, dtype=np.int64)
        self.episodes = []  # (global step, return, length) of the episodes that ended

    def reset(self, seed: int) -> torch.Tensor:
        obs = self.obs_rms.normalize(self.envs.reset(seed=seed)[0], True)
        return torch.as_tensor(obs, dtype=torch.float32).to(self.device)

    def step(self, actions: torch.Tensor, value, global_step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Step every env by the policy's ``actions``; returns the next observations, the scaled rewards and the
        dones. ``value``: the critic, for the time-limit bootstrap."""
        action = np.clip(actions.cpu().numpy(), self.low, self.high)
        next_obs, reward, terminated, truncated, infos = self.envs.step(action)
        done = np.logical_or(terminated, truncated)
        self.episode_return += reward
        self.episode_length += 1
        self.discounted = self.discounted * self.gamma + reward
        self.ret_rms.update(self.discounted)
        rewards = torch.as_tensor(np.clip(reward / np.sqrt(self.ret_rms.var + 1e-8), -10.0, 10.0), dtype=torch.float32)
        next_obs_n = self.obs_rms.normalize(next_obs, True)
        if done.any():  # the ends of episodes: a few steps in a thousand, so not a cost of every step
            cut = np.nonzero(truncated & ~terminated)[0]
            if len(cut):  # a time limit, not the end of the episode: bootstrap from its last observation
                final = self.obs_rms.normalize(np.stack([infos["final_obs"][i] for i in cut]), False)
                final = torch.as_tensor(final, dtype=torch.float32, device=self.device)
                rewards[cut] += self.gamma * value(final).cpu()
            for i in np.nonzero(done)[0]:
                self.episodes.append((global_step, self.episode_return[i], self.episode_length[i]))
            self.episode_return[done] = 0.0
            self.episode_length[done] = 0
            self.discounted[done] = 0.0
        # side by side in one copy to the device, not three: on a GPU each small copy costs about as much as a big one
        host = np.concatenate([next_obs_n.ravel(), rewards.numpy(), done], dtype=np.float32)
        sizes = [next_obs_n.size, len(done), len(done)]
        next_obs_n, rewards, dones = torch.from_numpy(host).to(self.device, non_blocking=True).split(sizes)
        return next_obs_n.view(-1, self.obs_dim), rewards, dones

    def finished(self) -> list[tuple[int, float, int]]:
        """(global step, return, length) of the episodes that ended since the last call."""
        episodes, self.episodes = self.episodes, []
        return episodes

    def close(self) -> None:
        self.envs.close()


class DeviceEnvs:
    """MJX worlds (--sim mjx, mjx_envs.MJXVectorEnv) as the PPO loop steps them: HostEnvs' processing, with the
    statistics and every result on the device, so that a step makes no host sync. The time-limit bootstrap values
    every world's final observation and keeps the values of the worlds cut short."""

    def __init__(self, envs, gamma: float, device: torch.device):
        self.envs = envs
        self.gamma = gamma
        self.low = torch.as_tensor(envs.single_action_space.low, device=device)
        self.high = torch.as_tensor(envs.single_action_space.high, device=device)
        self.obs_dim = envs.single_observation_space.shape[0]
        self.act_dim = envs.single_action_space.shape[0]
        self.obs_rms = RunningMeanStd(self.obs_dim, device=device)
        self.ret_rms = RunningMeanStd((), device=device)
        self.discounted = torch.zeros(envs.num_envs, dtype=torch.float64, device=device)
        self.episodes = []  # each step's (global step, done, return, length), on the device until finished()

    def reset(self, seed: int) -> torch.Tensor:
        return self.obs_rms.normalize(self.envs.reset(seed=seed)[0], True).float()

    def step(self, actions: torch.Tensor, value, global_step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        next_obs, reward, terminated, truncated, info = self.envs.step(actions.clamp(self.low, self.high))
        done = terminated | truncated
        self.discounted = self.discounted * self.gamma + reward
        self.ret_rms.update(self.discounted)
        rewards = (reward / (self.ret_rms.var + 1e-8) ** 0.5).clip(-10.0, 10.0).float()
        next_obs_n = self.obs_rms.normalize(next_obs, True).float()
        final = self.obs_rms.normalize(info["final_obs"], False).float()
        # where, not a product by the mask: a world that ended in a non-finite observation has a NaN value (NaN * 0)
        rewards += torch.where(truncated & ~terminated, self.gamma * value(final), 0.0)
        self.discounted = self.discounted * ~done
        self.episodes.append((global_step, done, info["episode"]["r"], info["episode"]["l"]))
        return next_obs_n, rewards, done.float()

    def finished(self) -> list[tuple[int, float, int]]:
        """(global step, return, length) of the episodes that ended since the last call, in one copy to the host."""
        if not self.episodes:
            return []
        steps, done, returns, lengths = zip(*self.episodes)
        self.episodes = []
        t, world = torch.stack(done).nonzero(as_tuple=True)
        returns = torch.stack(returns)[t, world].tolist()
        lengths = torch.stack(lengths)[t, world].tolist()
        return [(steps[i], r, n) for i, r, n in zip(t.tolist(), returns, lengths)]

    def close(self) -> None:
        self.envs.close()
