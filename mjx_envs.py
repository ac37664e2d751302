"""gymnasium v5's MuJoCo tasks as one batch of worlds stepping on a JAX device through MJX, handed to torch.

``MJXVectorEnv("HalfCheetah-v5", 4096)`` steps 4,096 HalfCheetah worlds at once with ``jax.vmap`` of
``mujoco.mjx.step`` (``impl="jax"`` on any JAX device, the CPU included; ``impl="warp"``: MuJoCo Warp's kernels on
an NVIDIA GPU). It behaves as a gymnasium vector env in ``AutoresetMode.SAME_STEP`` whose observations, rewards
and flags are torch tensors on the env's device, passed from JAX through DLPack without a copy or a host round trip.

The tasks keep gymnasium v5's semantics: its own XML files (read from the installed gymnasium), frame skip, reward
terms and weights, health and termination rules, observation layout, reset noise, the registry's 1,000-step time
limit, reported as truncation, and MuJoCo's reset of a world whose state goes NaN or huge. ``docs/mjx.md`` maps
every rule to gymnasium's source and lists what differs (the physics is float32; the random streams are JAX's, not
numpy's).

Needs the ``mjx`` extra (``pip install -e ".[mjx]"``; ``".[mjx,warp]"`` for ``impl="warp"``). Importing this module
imports neither JAX nor MJX and has no side effects: the first ``MJXVectorEnv`` tells JAX not to preallocate GPU
memory, points JAX's compilation cache and Warp's kernel cache at ``~/.cache/gpu-rl`` (unless set already), and
imports them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import io
import os
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import continuous_envs

INSTALL_HINT = 'pip install -e ".[mjx]" (Python >= 3.11)'
WARP_INSTALL_HINT = 'pip install -e ".[mjx,warp]"'


class MJXEnvError(ValueError):
    """A request the MJX envs cannot serve (unknown task or argument, wrong device); the message says what to do."""


def cache_dir() -> Path:
    """Where compiled code is kept between runs: ``$XDG_CACHE_HOME/gpu-rl`` (``~/.cache/gpu-rl`` by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpu-rl"


# ---------------------------------------------------------------- the tasks, as gymnasium v5 defines them
# Each task is a frozen dataclass whose fields are the gymnasium v5 constructor's arguments that shape the
# simulation (rendering ones aside), with gymnasium's defaults; tests/test_mjx_envs.py checks them against
# gymnasium's signatures. Its methods are the rules of gymnasium's step/_get_obs/reset_model for one world,
# written with jax.numpy (they run inside jax.vmap).


def _jnp():
    import jax.numpy as jnp

    return jnp


@dataclasses.dataclass(frozen=True)
class HalfCheetahV5:
    """gymnasium/envs/mujoco/half_cheetah_v5.py (HalfCheetahEnv): run forward; never terminates."""

    xml_file: str = "half_cheetah.xml"
    frame_skip: int = 5
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 0.1
    reset_noise_scale: float = 0.1
    exclude_current_positions_from_observation: bool = True

    def reset_velocity(self, key, nv: int):
        """reset_model: ``qvel = init_qvel + reset_noise_scale * standard_normal(nv)`` (init_qvel is zero)."""
        import jax

        return self.reset_noise_scale * jax.random.normal(key, (nv,))

    def observation(self, qpos, qvel):
        """_get_obs: qpos without x (by default), then qvel unclipped."""
        position = qpos[1:] if self.exclude_current_positions_from_observation else qpos
        return _jnp().concatenate([position, qvel])

    def evaluate(self, init_qpos, x_before, qpos, qvel, action, dt):
        """step and _get_rew: reward = forward_reward_weight * x_velocity - ctrl_cost_weight * sum(action**2)."""
        jnp = _jnp()
        x_velocity = (qpos[0] - x_before) / dt
        forward_reward = self.forward_reward_weight * x_velocity
        ctrl_cost = self.ctrl_cost_weight * jnp.sum(jnp.square(action))
        reward = forward_reward - ctrl_cost
        info = {"x_position": qpos[0], "x_velocity": x_velocity, "reward_forward": forward_reward}
        info["reward_ctrl"] = -ctrl_cost
        return reward, jnp.zeros((), bool), info


def _uniform(key, n: int, scale: float):
    import jax

    return jax.random.uniform(key, (n,), minval=-scale, maxval=scale)


class _Walker:
    """Hopper's and Walker2d's shared rules; each task's dataclass holds its own fields (gymnasium's defaults)."""

    def reset_velocity(self, key, nv: int):
        """reset_model: ``qvel = init_qvel + uniform(-reset_noise_scale, reset_noise_scale, nv)``."""
        return _uniform(key, nv, self.reset_noise_scale)

    def observation(self, qpos, qvel):
        """_get_obs: qpos without x (by default), then qvel clipped to [-10, 10]."""
        jnp = _jnp()
        position = qpos[1:] if self.exclude_current_positions_from_observation else qpos
        return jnp.concatenate([position, jnp.clip(qvel, -10.0, 10.0)])

    def walker_evaluate(self, healthy_state, init_qpos, x_before, qpos, qvel, action, dt):
        """step, _get_rew and is_healthy; ``healthy_state``: Hopper's state-range test (Walker2d has none)."""
        jnp = _jnp()
        z, angle = qpos[1], qpos[2]
        min_z, max_z = self.healthy_z_range
        min_angle, max_angle = self.healthy_angle_range
        is_healthy = healthy_state & (min_z < z) & (z < max_z) & (min_angle < angle) & (angle < max_angle)
        x_velocity = (qpos[0] - x_before) / dt
        forward_reward = self.forward_reward_weight * x_velocity
        healthy_reward = is_healthy * self.healthy_reward  # v5: no survival reward on the step that falls
        ctrl_cost = self.ctrl_cost_weight * jnp.sum(jnp.square(action))
        reward = forward_reward + healthy_reward - ctrl_cost
        terminated = ~is_healthy & self.terminate_when_unhealthy
        info = {"x_position": qpos[0], "z_distance_from_origin": qpos[1] - init_qpos[1], "x_velocity": x_velocity}
        info |= {"reward_forward": forward_reward, "reward_ctrl": -ctrl_cost, "reward_survive": healthy_reward}
        return reward, terminated, info


@dataclasses.dataclass(frozen=True)
class HopperV5(_Walker):
    """gymnasium/envs/mujoco/hopper_v5.py (HopperEnv): hop forward; terminates when unhealthy."""

    xml_file: str = "hopper.xml"
    frame_skip: int = 4
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 1e-3
    healthy_reward: float = 1.0
    terminate_when_unhealthy: bool = True
    healthy_state_range: tuple[float, float] = (-100.0, 100.0)
    healthy_z_range: tuple[float, float] = (0.7, float("inf"))
    healthy_angle_range: tuple[float, float] = (-0.2, 0.2)
    reset_noise_scale: float = 5e-3
    exclude_current_positions_from_observation: bool = True

    def evaluate(self, init_qpos, x_before, qpos, qvel, action, dt):
        """is_healthy adds: every entry of state_vector()[2:] (qpos[2:], then qvel unclipped) in the open range."""
        jnp = _jnp()
        state = jnp.concatenate([qpos, qvel])[2:]
        min_state, max_state = self.healthy_state_range
        healthy_state = jnp.all((min_state < state) & (state < max_state))
        return self.walker_evaluate(healthy_state, init_qpos, x_before, qpos, qvel, action, dt)


@dataclasses.dataclass(frozen=True)
class Walker2dV5(_Walker):
    """gymnasium/envs/mujoco/walker2d_v5.py (Walker2dEnv): walk forward; terminates when unhealthy."""

    xml_file: str = "walker2d_v5.xml"
    frame_skip: int = 4
    forward_reward_weight: float = 1.0
    ctrl_cost_weight: float = 1e-3
    healthy_reward: float = 1.0
    terminate_when_unhealthy: bool = True
    healthy_z_range: tuple[float, float] = (0.8, 2.0)
    healthy_angle_range: tuple[float, float] = (-1.0, 1.0)
    reset_noise_scale: float = 5e-3
    exclude_current_positions_from_observation: bool = True

    def evaluate(self, init_qpos, x_before, qpos, qvel, action, dt):
        healthy_state = _jnp().ones((), bool)  # Walker2d has no state range: height and angle only
        return self.walker_evaluate(healthy_state, init_qpos, x_before, qpos, qvel, action, dt)


@dataclasses.dataclass(frozen=True)
class InvertedPendulumV5:
    """gymnasium/envs/mujoco/inverted_pendulum_v5.py (InvertedPendulumEnv): keep the pole up; 1 per step."""

    xml_file: str = "inverted_pendulum.xml"
    frame_skip: int = 2
    reset_noise_scale: float = 0.01

    def reset_velocity(self, key, nv: int):
        """reset_model: ``qvel = init_qvel + uniform(-reset_noise_scale, reset_noise_scale, nv)``."""
        return _uniform(key, nv, self.reset_noise_scale)

    def observation(self, qpos, qvel):
        """_get_obs: qpos (cart, hinge), then qvel."""
        return _jnp().concatenate([qpos, qvel])

    def evaluate(self, init_qpos, x_before, qpos, qvel, action, dt):
        """step: terminated when the observation is not finite or the pole leans past 0.2 rad; reward 1 until then."""
        jnp = _jnp()
        observation = self.observation(qpos, qvel)
        terminated = ~jnp.all(jnp.isfinite(observation)) | (jnp.abs(observation[1]) > 0.2)
        reward = 1.0 - terminated
        return reward, terminated, {"reward_survive": reward}


TASKS: dict[str, type] = {
    "HalfCheetah-v5": HalfCheetahV5,
    "Hopper-v5": HopperV5,
    "Walker2d-v5": Walker2dV5,
    "InvertedPendulum-v5": InvertedPendulumV5,
}


# ---------------------------------------------------------------- physics="fast": the solver's settings per task
# gymnasium's XMLs leave MuJoCo's Newton solver at 100 iterations and 50 line-search iterations. In float32 its
# tolerance (1e-8) is not always reached, so some worlds run on with no visible change, and under jax.vmap every
# world waits for the slowest. The fast setting caps them: mjOption fields set on the model before mjx.put_model, per
# task the cheapest whose one step departs from exact's no more than exact's departs from gymnasium's (p99 and max)
# on every class of states the task reaches with its default arguments: limits active, knife-edge, fast, fallen
# where it steps on (benchmark/mjx_fidelity.py; the table, the rule and what was not measured: docs/mjx.md, "Fast
# physics"). A task without an entry has no setting that passed.
FAST_PHYSICS: dict[str, dict[str, int]] = {
    "HalfCheetah-v5": {"iterations": 6, "ls_iterations": 12},  # 4,8 moved a bang-bang state's velocity by 4.4
    "Hopper-v5": {"iterations": 4, "ls_iterations": 8},  # 3,6 moved states with a joint limit active by 1.4e-3
    "InvertedPendulum-v5": {"iterations": 2, "ls_iterations": 4},  # 1,4 moved the cart at the rail's end by 1.3e-2
}
PHYSICS = ("exact", "fast")


def physics_options(env_id: str, physics: str, task: Any = None) -> dict[str, int]:
    """The mjOption fields ``physics`` sets on ``env_id``'s model, a dict of the caller's own: none for "exact" (the
    XML as gymnasium ships it), FAST_PHYSICS's for "fast". ``task``: the rules the worlds will follow (make_task's),
    for "fast" only with health rules that end every episode the defaults end."""
    if physics not in PHYSICS:
        raise MJXEnvError(
            f"physics must be 'exact' (gymnasium's XML as it ships) or 'fast' (docs/mjx.md), not {physics!r}"
        )
    if physics == "exact":
        return {}
    if env_id not in FAST_PHYSICS:
        *others, last = FAST_PHYSICS
        measured = f"{', '.join(others)} and {last}" if others else last
        raise MJXEnvError(f"physics='fast' is measured for {measured} only: use 'exact' for {env_id} (docs/mjx.md)")
    beyond = _beyond_default_health(task) if task is not None else []
    if beyond:
        raise MJXEnvError(
            f"physics='fast' is measured on the states {env_id} reaches with its default health rules, not with "
            f"{', '.join(beyond)}: drop it or use physics='exact' (docs/mjx.md)"
        )
    return dict(FAST_PHYSICS[env_id])  # a copy: a caller's change must not reach the worlds built after it


def _beyond_default_health(task) -> list[str]:
    """The task's arguments that let a world step on from states its defaults end (a fallen Hopper): a fast cap
    passed on the states the defaults reach can depart from exact there, as Hopper's 4,8 did on fallen states."""
    default = type(task)()
    beyond = []
    if getattr(default, "terminate_when_unhealthy", False) and not task.terminate_when_unhealthy:
        beyond.append("terminate_when_unhealthy=False")
    for field in dataclasses.fields(task):
        if field.name.startswith("healthy_") and field.name.endswith("_range"):
            (low, high), (default_low, default_high) = getattr(task, field.name), getattr(default, field.name)
            if low < default_low or high > default_high:  # a narrower range ends episodes sooner: fewer states
                beyond.append(f"{field.name}={getattr(task, field.name)!r}")
    return beyond


def make_task(env_id: str, **task_kwargs: Any):
    """The task's rules with gymnasium's defaults, overridden by ``task_kwargs`` as ``gym.make(env_id, **kw)``."""
    if env_id not in TASKS:
        raise MJXEnvError(f"no MJX version of {env_id!r}: choose one of {', '.join(TASKS)}")
    task_type = TASKS[env_id]
    names = {field.name for field in dataclasses.fields(task_type)}
    unknown = sorted(set(task_kwargs) - names)
    if unknown:
        raise MJXEnvError(f"{env_id} takes no argument {', '.join(unknown)}: it takes {', '.join(sorted(names))}")
    return task_type(**task_kwargs)


def gymnasium_xml_path(xml_file: str) -> Path:
    """The model file as MujocoEnv's expand_model_path resolves ``xml_file``: a path starting with "/" or "." as
    it is, one starting with "~" in the user's home, a bare name in gymnasium's own assets."""
    if xml_file.startswith(("/", ".")):
        return Path(xml_file)
    if xml_file.startswith("~"):
        return Path(xml_file).expanduser()
    return Path(gym.__file__).parent / "envs" / "mujoco" / "assets" / xml_file


# ---------------------------------------------------------------- JAX and MJX, imported on first use
def missing_extra(impl: str = "jax") -> str:
    """What to install for MJX worlds of ``impl``, or "" when it is installed; imports neither JAX nor MJX."""
    missing = [name for name in ("jax", "mujoco.mjx") if importlib.util.find_spec(name) is None]
    if missing:
        return f"MJX envs need {' and '.join(missing)}: {INSTALL_HINT}"
    if impl == "warp" and importlib.util.find_spec("warp") is None:
        return f"impl='warp' needs warp-lang: {WARP_INSTALL_HINT}"
    return ""


def _import_mjx(impl: str):
    """Import JAX and MJX with GPU preallocation off and the compilation caches on disk; one-line errors."""
    if impl not in ("jax", "warp"):
        raise MJXEnvError(f"impl must be 'jax' (any JAX device) or 'warp' (MuJoCo Warp, NVIDIA GPUs), not {impl!r}")
    # Both must be set before JAX creates its GPU client and before Warp initialises: torch shares the GPU, so
    # JAX takes memory as it needs it instead of 75% of the card up front.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("WARP_CACHE_PATH", str(cache_dir() / "warp"))
    if missing_extra(impl):
        raise ImportError(missing_extra(impl))
    import jax

    # mujoco.mjx prints a line when warp-lang is absent; absent is fine for impl="jax"
    with contextlib.redirect_stdout(io.StringIO()):
        from mujoco import mjx
    if jax.config.jax_compilation_cache_dir is None:  # JAX_COMPILATION_CACHE_DIR, when set, wins
        jax.config.update("jax_compilation_cache_dir", str(cache_dir() / "jax"))
    if impl == "warp":
        import warp

        if getattr(warp.config, "log_level", None) == warp.LOG_INFO:  # not a level the user chose
            warp.config.log_level = warp.LOG_WARNING  # not a line per kernel module it compiles or loads
    return jax, mjx


def cpu_deadlock_risk(jaxlib_version: str) -> bool:
    """Whether this jaxlib's CPU LAPACK kernels can hang MJX: 0.10.0 to 0.11.0 split a batched factorization (the
    Cholesky of MJX's Newton solver, one per world) over XLA's CPU thread pool and block a pool thread waiting for
    the parts; with two such calls on two cores nothing is left to run them (seen with 0.10.2 after 1 to 120 steps
    of 1,024 worlds). 0.9 does not split; 0.11.1 builds it out."""
    release = tuple(int(part) for part in re.findall(r"\d+", jaxlib_version)[:3])
    return (0, 10, 0) <= release < (0, 11, 1)


def _seed_key(jax, seed):
    """JAX's key of ``seed``, every bit of it: ``jax.random.key`` keeps only the low 32 bits of a seed unless x64 is
    on, which made seed 5 and 2**32 + 5 one stream. The same key as ``jax.random.key(seed)`` below 2**32."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise MJXEnvError(f"seed must be an integer from 0 to 2**64 - 1 (gymnasium's are from 0), not {seed!r}")
    high, low = divmod(int(seed), 2**32)
    return jax.random.wrap_key_data(np.array([high, low], dtype=np.uint32), impl="threefry2x32")


def _jax_device(jax, device: str | torch.device | None):
    """The JAX device for a torch device (None: JAX's default, its GPU when it has one)."""
    if device is None:
        return jax.devices()[0]
    device = torch.device(device)
    if device.type == "cpu":
        return jax.devices("cpu")[0]
    if device.type != "cuda":
        raise MJXEnvError(f"MJX envs run on a CUDA GPU or the CPU, not {device}")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        hint = "install JAX's CUDA plugin (pip install 'jax[cuda12]') or run on the CPU"
        raise MJXEnvError(f"JAX has no GPU backend for {device}: {hint}") from None
    index = torch.cuda.current_device() if device.index is None else device.index
    for gpu in gpus:
        if gpu.local_hardware_id == index:
            return gpu
    raise MJXEnvError(f"JAX sees GPUs {[gpu.local_hardware_id for gpu in gpus]}, not cuda:{index}")


def _torch_device(jax_device) -> torch.device:
    if jax_device.platform == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", jax_device.local_hardware_id)


# ---------------------------------------------------------------- the vector env
class MJXVectorEnv:
    """``num_envs`` worlds of one gymnasium v5 MuJoCo task, stepped as one batch on a JAX device.

    A gymnasium vector env in ``AutoresetMode.SAME_STEP`` whose results are torch tensors on ``self.device``:
    ``reset(seed)`` returns ``(obs, {})`` and ``step(action)`` returns ``(obs, reward, terminated, truncated,
    info)``: obs ``(num_envs, obs_dim)`` float32, reward ``(num_envs,)`` float32, terminated and truncated
    ``(num_envs,)`` bool. A world whose episode ended in this step is reset in the same step: ``obs`` is its new
    episode's first observation and ``info["final_obs"]`` the observation the episode ended in (for bootstrapping
    a truncated episode; rows of worlds that did not end repeat ``obs``). ``info["episode"]`` holds ``"r"``
    (float32, the undiscounted return) and ``"l"`` (int32, steps) of each world's episode so far, final where
    ``info["_episode"]`` is set. The other info keys are gymnasium's per-step terms (``x_velocity``,
    ``reward_forward``, ``reward_ctrl``, ...) as float32 tensors. Tensors are views of a buffer that is never
    reused: keep them or write to them as you like.

    ``action``: a ``(num_envs, act_dim)`` torch tensor on ``self.device`` (or an array) passed to MuJoCo unclipped,
    as gymnasium does: MuJoCo clamps the control to ``ctrlrange`` and the control cost sees the action as given.
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        seed: int = 0,
        device: str | torch.device | None = None,
        impl: str = "jax",
        physics: str = "exact",
        max_episode_steps: int | None = None,
        naconmax: int | None = None,
        njmax: int | None = None,
        **task_kwargs: Any,
    ):
        """Build the worlds and compile nothing yet (the first ``reset``/``step`` compiles, or loads the cache).

        env_id: ``HalfCheetah-v5``, ``Hopper-v5``, ``Walker2d-v5`` or ``InvertedPendulum-v5``.
        seed: the key of the reset noise; ``reset(seed=...)`` replaces it.
        device: a torch device (``"cuda"``, ``"cuda:1"``, ``"cpu"``) or None for JAX's default device.
        impl: ``"jax"`` (any JAX device) or ``"warp"`` (MuJoCo Warp; NVIDIA GPUs, or Warp's CPU device).
        physics: ``"exact"`` (the XML's solver settings, as gymnasium steps it) or ``"fast"`` (FAST_PHYSICS: fewer
            solver iterations, chosen per task by one-step errors; docs/mjx.md).
        max_episode_steps: the time limit, reported as truncation; None: gymnasium's registry (1,000).
        naconmax, njmax: MuJoCo Warp's contact buffer for all worlds and constraint rows per world (impl="warp");
            None: the bounds MJX's JAX implementation computes for the model, times ``num_envs`` for naconmax.
        task_kwargs: gymnasium's constructor arguments (``ctrl_cost_weight=0.2``, ``reset_noise_scale=...``).
        """
        self.task = make_task(env_id, **task_kwargs)
        options = physics_options(env_id, physics, self.task)
        if num_envs < 1:
            raise MJXEnvError(f"num_envs must be at least 1, not {num_envs}")
        if max_episode_steps is None:
            max_episode_steps = gym.spec(env_id).max_episode_steps
        if max_episode_steps < 1:
            raise MJXEnvError(f"max_episode_steps must be at least 1, not {max_episode_steps}")
        jax, mjx = _import_mjx(impl)
        import mujoco

        self.env_id = env_id
        self.num_envs = num_envs
        self.impl = impl
        self.physics = physics
        self.max_episode_steps = int(max_episode_steps)
        self._jax = jax
        self._jax_device = _jax_device(jax, device)
        self.device = _torch_device(self._jax_device)
        if impl == "warp" and self._jax_device.platform not in ("gpu", "cpu"):
            raise MJXEnvError(f"impl='warp' runs on an NVIDIA GPU or the CPU, not {self._jax_device}")
        jaxlib_version = importlib.metadata.version("jaxlib")
        if impl == "jax" and self._jax_device.platform == "cpu" and cpu_deadlock_risk(jaxlib_version):
            fix = "pip install 'jax>=0.9.2,<0.10' (Python 3.11) or 'jax>=0.11.1'"
            raise MJXEnvError(f"jaxlib {jaxlib_version} can hang MJX on the CPU (see docs/mjx.md): {fix}")

        xml_path = gymnasium_xml_path(self.task.xml_file)
        if not xml_path.is_file():
            raise MJXEnvError(f"no MuJoCo model at {xml_path}")
        continuous_envs.warn_once_per_process()  # gymnasium's half_cheetah.xml: one warning, no MUJOCO_LOG.TXT
        self.mj_model = mujoco.MjModel.from_xml_path(str(xml_path))
        opt = self.mj_model.opt  # set before put_model and the rescue state below: every step sees it
        for name, value in options.items():
            setattr(opt, name, opt.disableflags | value if name == "disableflags" else value)  # flags add to the XML's
        self.dt = self.mj_model.opt.timestep * self.task.frame_skip  # MujocoEnv.dt
        with jax.default_device(self._jax_device):
            self._build(jax, mjx, naconmax, njmax)
            self._key = jax.device_put(_seed_key(jax, seed), self._jax_device)

        # MujocoEnv._set_action_space: a float32 box over the actuators' control ranges
        low, high = self.mj_model.actuator_ctrlrange.copy().astype(np.float32).T
        self.single_action_space = gym.spaces.Box(low=low, high=high, dtype=np.float32)
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (self.obs_dim,), dtype=np.float32)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self._state = None  # (data, episode_return, episode_length) of every world, after the first reset
        self._in_flight: list[torch.Tensor] = []  # torch tensors JAX may still be reading

    def _build(self, jax, mjx, naconmax, njmax):
        """Put the model on the device and jit reset, step and set_state for all worlds."""
        import mujoco

        jnp = jax.numpy
        nq, nv, nu = self.mj_model.nq, self.mj_model.nv, self.mj_model.nu
        n = self.num_envs
        task = self.task
        frame_skip = task.frame_skip
        max_steps = self.max_episode_steps
        dt = self.dt
        device = self._jax_device
        mj_model = self.mj_model
        if self.impl == "warp":
            # Warp keeps one contact buffer for all worlds and fixed constraint rows per world; JAX's own static
            # bounds for this model are what every world can need.
            bounds = mjx.make_data(mj_model, impl="jax", device=jax.devices("cpu")[0])._impl
            naconmax = naconmax or n * max(1, bounds.contact.dist.shape[0])
            njmax = njmax or max(1, bounds.efc_J.shape[0])
            model = mjx.put_model(mj_model, device=device, impl="warp")
            data0 = mjx.make_data(mj_model, device=device, impl="warp", naconmax=naconmax, njmax=njmax)
        else:
            model = mjx.put_model(mj_model, device=device, impl="jax")
            data0 = mjx.make_data(model, device=device, impl="jax")
        init_qpos = jnp.asarray(mj_model.qpos0, dtype=jnp.float32)  # MjData's qpos after mj_resetData

        def reset_world(key):
            """MujocoEnv.reset: mj_resetData, then reset_model's noise on qpos (uniform) and qvel (per task)."""
            key_qpos, key_qvel = jax.random.split(key)
            qpos = init_qpos + _uniform(key_qpos, nq, task.reset_noise_scale)
            qvel = task.reset_velocity(key_qvel, nv)
            # data0 is MjData after mj_resetData: zero time, controls and warm start; set_state's mj_forward is
            # left to the next step, which computes it first (an observation needs only qpos and qvel)
            return data0.replace(qpos=qpos, qvel=qvel), task.observation(qpos, qvel)

        rescue = _mujoco_rescue(mj_model)

        def is_bad(x):
            """MuJoCo's mju_isBad over an array: any entry NaN or beyond mjMAXVAL (1e10) either way."""
            return ~jnp.all(jnp.abs(x) <= mujoco.mjMAXVAL)

        def mj_step(data):
            """One mj_step with MuJoCo's own rescue: a world whose qpos or qvel (mj_checkPos, mj_checkVel) or whose
            accelerations (mj_checkAcc) are bad is reset (mj_resetData, its control zero) and steps on from there."""
            stepped = mjx.step(model, data)
            if rescue is None:  # the model disables it (mjDSBL_AUTORESET)
                return stepped
            bad = is_bad(data.qpos) | is_bad(data.qvel) | is_bad(stepped.qacc)
            rescued = {name: jnp.where(bad, value, getattr(stepped, name)) for name, value in rescue.items()}
            return stepped.replace(**rescued)

        limited = jnp.asarray(mj_model.actuator_ctrllimited, dtype=bool)
        ctrl_low = jnp.where(limited, jnp.asarray(mj_model.actuator_ctrlrange[:, 0]), -jnp.inf)
        ctrl_high = jnp.where(limited, jnp.asarray(mj_model.actuator_ctrlrange[:, 1]), jnp.inf)

        def physics_step(data, action):
            """MujocoEnv.do_simulation: ctrl = action, then frame_skip mj_steps. As MuJoCo's mj_fwdActuation, a control
            still bad once clamped (NaN) sets all the world's controls to zero (MuJoCo warns; MJX would go NaN)."""
            bad_ctrl = is_bad(jnp.clip(action, ctrl_low, ctrl_high))
            data = data.replace(ctrl=jnp.where(bad_ctrl, jnp.zeros_like(action), action))
            return jax.lax.fori_loop(0, frame_skip, lambda _, d: mj_step(d), data)

        def world_step(data, action, key, episode_return, episode_length):
            x_before = data.qpos[0]
            data = physics_step(data, action)
            obs = task.observation(data.qpos, data.qvel)
            reward, terminated, info = task.evaluate(init_qpos, x_before, data.qpos, data.qvel, action, dt)
            episode_return = episode_return + reward
            episode_length = episode_length + 1
            truncated = episode_length >= max_steps  # TimeLimit: elapsed steps >= max_episode_steps
            done = terminated | truncated
            reset_data, reset_obs = reset_world(key)
            data = data.where(done, reset_data)
            next_obs = jnp.where(done, reset_obs, obs)
            outputs = [next_obs, obs, reward, terminated, truncated, episode_return, episode_length]
            outputs += [info[name] for name in sorted(info)]
            carry = (data, jnp.where(done, 0.0, episode_return), jnp.where(done, 0, episode_length))
            return carry, outputs

        def step(state, key, action):
            data, episode_return, episode_length = state
            key, reset_key = jax.random.split(key)
            keys = jax.random.split(reset_key, n)
            state, outputs = jax.vmap(world_step)(data, action, keys, episode_return, episode_length)
            return state, key, _pack(jnp, outputs)

        def reset(key):
            key, reset_key = jax.random.split(key)
            data, obs = jax.vmap(reset_world)(jax.random.split(reset_key, n))
            zeros = jnp.zeros(n, jnp.float32)
            return (data, zeros, jnp.zeros(n, jnp.int32)), key, _pack(jnp, [obs])

        def set_state(state, qpos, qvel, qacc_warmstart):
            data, episode_return, episode_length = state
            warm = data.qacc_warmstart if qacc_warmstart is None else qacc_warmstart
            return (data.replace(qpos=qpos, qvel=qvel, qacc_warmstart=warm), episode_return, episode_length)

        # JAX's GPU default multiplies float32 matrices in TF32 (10-bit mantissas): on an H200 (2026-11-26) that moved
        # HalfCheetah's velocities up to 2% from gymnasium's in one step. The physics multiplies in float32, as CPUs do:
        # the precision is fixed when jit traces (each product's own), so a step pays nothing for it at run time.
        def float32(fn):
            def call(*args):
                with jax.default_matmul_precision("float32"):
                    return fn(*args)

            return call

        # the state's buffers are donated: a step updates the worlds in place instead of allocating new ones
        self._step_fn = jax.jit(float32(step), donate_argnums=0)
        self._reset_fn = jax.jit(float32(reset))
        self._set_state_fn = jax.jit(set_state, donate_argnums=0)
        # the observation's size and gymnasium's per-step info keys (sorted, as world_step packs them), from shapes
        qpos, qvel, action = (jax.ShapeDtypeStruct((size,), jnp.float32) for size in (nq, nv, nu))
        self.obs_dim = jax.eval_shape(task.observation, qpos, qvel).shape[0]
        x_before = jax.ShapeDtypeStruct((), jnp.float32)
        _, _, info = jax.eval_shape(lambda *x: task.evaluate(init_qpos, *x, dt), x_before, qpos, qvel, action)
        self.info_names = sorted(info)
        obs_size = n * self.obs_dim
        self._step_sizes = [obs_size, obs_size] + [n] * (5 + len(self.info_names))

    # -------------------------------------------------------------- the gymnasium vector API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[torch.Tensor, dict]:
        """Reset every world (gymnasium's noise, fresh per world); ``seed`` (0 to 2**64 - 1) restarts the key.
        ``options``: gymnasium's argument, which these tasks take none of. Returns (obs, {})."""
        if options:
            raise MJXEnvError(f"reset takes no options: these tasks' resets have none, not {options!r}")
        if seed is not None:
            self._key = self._jax.device_put(_seed_key(self._jax, seed), self._jax_device)
        self._state, self._key, flat = self._reset_fn(self._key)
        obs = self._to_torch(flat).view(self.num_envs, self.obs_dim)
        self._in_flight = []
        return obs, {}

    def step(self, action) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Step every world by one action (``frame_skip`` physics steps); see the class for what comes back."""
        if self._state is None:
            raise MJXEnvError("call reset() before step()")
        in_flight = []
        action = self._to_jax(action, (self.num_envs, self.single_action_space.shape[0]), "action", in_flight)
        self._state, self._key, flat = self._step_fn(self._state, self._key, action)
        parts = self._to_torch(flat).split(self._step_sizes)
        self._in_flight = in_flight  # torch now waits for this step: the tensors of earlier calls may go
        obs, final_obs = (part.view(self.num_envs, self.obs_dim) for part in parts[:2])
        reward, terminated, truncated, episode_return, episode_length = parts[2:7]
        terminated = terminated.bool()
        truncated = truncated.bool()
        done = terminated | truncated
        info: dict[str, Any] = dict(zip(self.info_names, parts[7:]))
        info |= {"final_obs": final_obs, "_final_obs": done}
        info |= {"episode": {"r": episode_return, "l": episode_length.to(torch.int32)}, "_episode": done}
        return obs, reward, terminated, truncated, info

    def set_state(self, qpos, qvel, qacc_warmstart=None) -> None:
        """Set every world's qpos ``(num_envs, nq)`` and qvel ``(num_envs, nv)``, as MujocoEnv.set_state does for
        one; other state (the episode counters, the solver's warm start) stays. ``qacc_warmstart`` ``(num_envs, nv)``:
        MjData's warm start of the solver too, to step from a recorded state as its own run stepped from it (with
        few solver iterations the warm start shows in the step)."""
        if self._state is None:
            raise MJXEnvError("call reset() before set_state()")
        nv = self.mj_model.nv
        qpos = self._to_jax(qpos, (self.num_envs, self.mj_model.nq), "qpos", self._in_flight)
        qvel = self._to_jax(qvel, (self.num_envs, nv), "qvel", self._in_flight)
        if qacc_warmstart is not None:
            qacc_warmstart = self._to_jax(qacc_warmstart, (self.num_envs, nv), "qacc_warmstart", self._in_flight)
        self._state = self._set_state_fn(self._state, qpos, qvel, qacc_warmstart)

    def close(self) -> None:
        """Drop the worlds (the device memory goes back to JAX's allocator)."""
        self._state = None
        self._in_flight = []

    # -------------------------------------------------------------- between torch and JAX
    def _to_torch(self, array) -> torch.Tensor:
        # torch hands its current stream to JAX's __dlpack__, so on a GPU torch waits for the step without the
        # host waiting; on the CPU this waits for the step, as any read of its results must
        return torch.from_dlpack(array)

    def _to_jax(self, x, shape: tuple[int, ...], name: str, in_flight: list[torch.Tensor]):
        if isinstance(x, torch.Tensor):
            if x.device != self.device:
                raise MJXEnvError(f"{name} is on {x.device}; this env runs on {self.device}")
            x = x.detach().to(torch.float32).contiguous()
            array = self._jax.dlpack.from_dlpack(x)
            # JAX reads torch's memory when the step runs, on its own stream: the tensor stays referenced until
            # torch has waited for a result that depends on it
            in_flight.append(x)
        else:
            array = self._jax.device_put(np.asarray(x, dtype=np.float32), self._jax_device)
        if tuple(array.shape) != shape:
            raise MJXEnvError(f"{name} has shape {tuple(array.shape)}; expected {shape}")
        return array


def _mujoco_rescue(mj_model) -> dict[str, np.ndarray] | None:
    """The state mj_step leaves a world in when it resets it (mj_resetData, then the step: from qpos0 at rest,
    the control zero), the same for every world; None where the model turns the reset off (mjDSBL_AUTORESET)."""
    import mujoco

    if mj_model.opt.disableflags & mujoco.mjtDisableBit.mjDSBL_AUTORESET:
        return None
    data = mujoco.MjData(mj_model)
    mujoco.mj_step(mj_model, data)
    names = ("qpos", "qvel", "act", "ctrl", "qacc", "qacc_warmstart", "time")
    return {name: np.asarray(getattr(data, name), dtype=np.float32) for name in names}


def _pack(jnp, outputs: list) -> Any:
    """One flat float32 buffer of every output, so that one DLPack hand-over per call brings them all to torch."""
    return jnp.concatenate([jnp.ravel(output).astype(jnp.float32) for output in outputs])
