"""mjx_envs: gymnasium v5's MuJoCo tasks stepping as one batch on a JAX device (here JAX's CPU device).

The rules are checked against gymnasium itself: the tasks' arguments and defaults against its constructors, each
step against its envs in lockstep (the same states and actions, hundreds of them, falls and time limits included),
the reset noise against its resets. Tests that build worlds need the mjx extra (`pip install -e ".[mjx]"`) and are
skipped with that reason without it. The first build of a task's step compiles for one to three minutes on two
busy cores (JAX keeps it in ~/.cache/gpu-rl/jax: seconds the next time); the tests that step physics are `slow`.
"""

import dataclasses
import importlib.metadata
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import mjx_envs
from mjx_envs import TASKS, MJXEnvError, MJXVectorEnv

ROOT = Path(__file__).resolve().parents[1]
HAS_MJX = all(importlib.util.find_spec(name) is not None for name in ("jax", "mujoco.mjx"))
needs_mjx = pytest.mark.skipif(not HAS_MJX, reason='needs the mjx extra: pip install -e ".[mjx]"')
JAXLIB = importlib.metadata.version("jaxlib") if HAS_MJX else ""
# the tests that step worlds on JAX's CPU device skip a jaxlib whose CPU kernels can hang there
safe_cpu_jaxlib = pytest.mark.skipif(
    HAS_MJX and mjx_envs.cpu_deadlock_risk(JAXLIB),
    reason=f'jaxlib {JAXLIB} can hang on the CPU (docs/mjx.md): pip install -e ".[mjx]"',
)

# lockstep sizes: 16 worlds x 40 steps = 640 compared states per task; a 15-step time limit makes truncations
WORLDS = 16
STEPS = 40
TIME_LIMIT = 15


def gymnasium_class(env_id: str) -> type:
    module, name = gym.spec(env_id).entry_point.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("env_id", TASKS)
def test_task_arguments_defaults_and_xml_are_gymnasiums(env_id):
    ours = {field.name: field.default for field in dataclasses.fields(TASKS[env_id])}
    parameters = inspect.signature(gymnasium_class(env_id).__init__).parameters
    theirs = {name: p.default for name, p in parameters.items() if name not in ("self", "kwargs")}
    theirs.pop("default_camera_config")  # rendering only
    assert ours == theirs
    env = gym.make(env_id)
    assert mjx_envs.gymnasium_xml_path(ours["xml_file"]) == Path(env.unwrapped.fullpath)
    assert gym.spec(env_id).max_episode_steps == 1000  # what max_episode_steps=None reads


def test_bad_requests_get_one_line_errors_that_say_what_to_do(monkeypatch):
    with pytest.raises(MJXEnvError, match="no MJX version of 'Ant-v5': choose one of HalfCheetah-v5"):
        MJXVectorEnv("Ant-v5", 4)
    with pytest.raises(MJXEnvError, match="Hopper-v5 takes no argument ctrl_cost: it takes ctrl_cost_weight"):
        MJXVectorEnv("Hopper-v5", 4, ctrl_cost=0.1)
    with pytest.raises(MJXEnvError, match="impl must be 'jax'"):
        MJXVectorEnv("Hopper-v5", 4, impl="cuda")

    # without the extras: the hint to install them, and JAX was told not to preallocate before any import
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    present = importlib.util.find_spec
    monkeypatch.setattr(
        mjx_envs.importlib.util, "find_spec", lambda name: None if name in ("jax", "mujoco.mjx") else present(name)
    )
    with pytest.raises(ImportError) as missing:
        MJXVectorEnv("Hopper-v5", 4)
    assert str(missing.value) == 'MJX envs need jax and mujoco.mjx: pip install -e ".[mjx]" (Python >= 3.11)'
    assert mjx_envs.os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    found = object()
    monkeypatch.setattr(mjx_envs.importlib.util, "find_spec", lambda name: None if name == "warp" else found)
    with pytest.raises(ImportError) as missing:
        MJXVectorEnv("Hopper-v5", 4, impl="warp")
    assert str(missing.value) == """impl='warp' needs warp-lang: pip install -e ".[mjx,warp]\""""


def test_jaxlib_versions_whose_cpu_kernels_can_hang_are_named():
    risky = ["0.10.0", "0.10.2", "0.10.2.dev20260101", "0.11.0"]
    safe = ["0.9.2", "0.9.0.1", "0.11.1", "0.11.2", "0.12.0.1"]
    assert [mjx_envs.cpu_deadlock_risk(version) for version in risky + safe] == [True] * 4 + [False] * 5


@needs_mjx
def test_a_jaxlib_that_can_hang_on_the_cpu_is_refused_with_what_to_install(monkeypatch):
    monkeypatch.setattr(mjx_envs.importlib.metadata, "version", lambda name: "0.10.2")
    with pytest.raises(MJXEnvError, match=r"jaxlib 0.10.2 can hang MJX on the CPU .*pip install 'jax>=0.9.2,<0.10'"):
        MJXVectorEnv("Hopper-v5", 4, device="cpu")


def test_model_paths_resolve_as_gymnasiums(tmp_path, monkeypatch):
    """Before: "~/hopper.xml" was looked for in gymnasium's assets folder (gymnasium expands the user's home)."""
    expand_model_path = importlib.import_module("gymnasium.envs.mujoco.mujoco_env").expand_model_path
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    source = mjx_envs.gymnasium_xml_path("hopper.xml")
    (tmp_path / "hopper.xml").write_text(source.read_text())
    for name in ("hopper.xml", "~/hopper.xml", "./hopper.xml", str(tmp_path / "hopper.xml")):
        assert mjx_envs.gymnasium_xml_path(name).resolve() == Path(expand_model_path(name)).resolve(), name


@needs_mjx
def test_every_bit_of_a_seed_counts_and_a_negative_one_is_refused():
    """Before: JAX (without x64) kept a seed's low 32 bits, so seed 5 and 2**32 + 5 started the same worlds, and -1
    the same as 2**32 - 1; gymnasium takes any integer from 0 up, and refuses a negative one."""
    env = MJXVectorEnv("InvertedPendulum-v5", WORLDS, seed=5, device="cpu", max_episode_steps=TIME_LIMIT)
    five = env.reset()[0]
    np.testing.assert_array_equal(env.reset(seed=5)[0].numpy(), five.numpy())
    for other in (2**32 + 5, 2**63 + 5, 2**64 - 1):
        assert not torch.equal(env.reset(seed=other)[0], five), other
    assert not torch.equal(env.reset(seed=2**64 - 1)[0], env.reset(seed=2**32 - 1)[0])
    twin = MJXVectorEnv("InvertedPendulum-v5", WORLDS, seed=2**32 + 5, device="cpu", max_episode_steps=TIME_LIMIT)
    np.testing.assert_array_equal(twin.reset()[0].numpy(), env.reset(seed=2**32 + 5)[0].numpy())
    # gymnasium's vector reset takes options too (its wrappers pass options=None); these tasks have none
    np.testing.assert_array_equal(env.reset(seed=5, options=None)[0].numpy(), five.numpy())
    with pytest.raises(MJXEnvError, match="reset takes no options"):
        env.reset(options={"noise": 0})
    for bad in (-1, 2**64, 1.5):
        with pytest.raises(MJXEnvError, match="seed must be an integer from 0"):
            env.reset(seed=bad)
    with pytest.raises(MJXEnvError, match="seed must be an integer from 0"):
        MJXVectorEnv("InvertedPendulum-v5", WORLDS, seed=-1, device="cpu")


def test_importing_the_module_imports_no_jax():
    code = "import sys, mjx_envs; assert 'jax' not in sys.modules and 'mujoco.mjx' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


@needs_mjx
def test_mujoco_warns_once_and_writes_no_log_file(tmp_path):
    """Before: each MJXVectorEnv of HalfCheetah printed MuJoCo 4.0's warning of a deprecated attribute in
    gymnasium's half_cheetah.xml and appended it to MUJOCO_LOG.TXT in the working directory."""
    code = (
        "import mjx_envs\nfor seed in (1, 2):\n    mjx_envs.MJXVectorEnv('HalfCheetah-v5', 2, seed=seed, device='cpu')"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("settotalmass") == 1, res.stderr
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


# ---------------------------------------------------------------- against gymnasium, step by step
@needs_mjx
@safe_cpu_jaxlib
@pytest.mark.slow
@pytest.mark.parametrize("env_id", TASKS)
def test_steps_match_gymnasium_from_the_same_states_and_actions(env_id):
    """16 gymnasium envs and 16 MJX worlds in lockstep: before each step the worlds take the gymnasium envs' states
    (a quarter of them given an extra velocity kick, in both, for states a random policy seldom reaches), then both
    step with the same actions (beyond the control range too: MuJoCo clamps, the control cost does not). The
    observation each step ends in, the reward, the flags, the per-step terms and each finished episode's return and
    length agree, to float32 physics' precision."""
    env = MJXVectorEnv(env_id, WORLDS, seed=1, device="cpu", max_episode_steps=TIME_LIMIT)
    env.reset()
    same_step = gym.vector.AutoresetMode.SAME_STEP
    reference = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id, max_episode_steps=TIME_LIMIT)] * WORLDS, autoreset_mode=same_step
    )
    reference.reset(seed=2)
    rng = np.random.default_rng(3)
    low, high = reference.single_action_space.low, reference.single_action_space.high
    episode_return = np.zeros(WORLDS)
    episode_length = np.zeros(WORLDS, dtype=int)
    terminations = truncations = clipped_velocities = 0
    single = gym.make(env_id)
    single.reset(seed=0)
    assert env.info_names == sorted(single.step(single.action_space.sample())[4])  # gymnasium's per-step info keys
    for _ in range(STEPS):
        for world in reference.envs:
            data = world.unwrapped.data
            if rng.random() < 0.25:
                world.unwrapped.set_state(data.qpos.copy(), data.qvel + rng.normal(0.0, 4.0, data.qvel.shape))
        qpos = np.stack([world.unwrapped.data.qpos for world in reference.envs])
        qvel = np.stack([world.unwrapped.data.qvel for world in reference.envs])
        clipped_velocities += int((np.abs(qvel) > 10).sum())
        env.set_state(torch.as_tensor(qpos), torch.as_tensor(qvel))
        action = rng.uniform(1.3 * low, 1.3 * high, size=(WORLDS, len(low))).astype(np.float32)

        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(action))
        expected_obs, expected_reward, expected_terminated, expected_truncated, expected_info = reference.step(action)

        done = expected_terminated | expected_truncated
        final = expected_info.get("final_info", {})
        expected_final_obs = np.stack(
            [expected_info["final_obs"][i] if done[i] else expected_obs[i] for i in range(WORLDS)]
        )
        np.testing.assert_allclose(info["final_obs"].numpy(), expected_final_obs, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(reward.numpy(), expected_reward, rtol=0, atol=1e-4)
        np.testing.assert_array_equal(terminated.numpy(), expected_terminated)
        np.testing.assert_array_equal(truncated.numpy(), expected_truncated)
        # gymnasium moves a finished step's terms to final_info and puts the reset's in their place; ours keep them
        for name in env.info_names:
            absent = np.full(WORLDS, np.nan)  # a key only the finished (or only the going) worlds have
            expected = np.where(done, final.get(name, absent), expected_info.get(name, absent))
            np.testing.assert_allclose(info[name].numpy(), expected, rtol=2e-3, atol=2e-3, err_msg=name)

        episode_return += expected_reward
        episode_length += 1
        np.testing.assert_array_equal(info["_episode"].numpy(), done)
        np.testing.assert_allclose(info["episode"]["r"].numpy()[done], episode_return[done], rtol=0, atol=1e-3)
        np.testing.assert_array_equal(info["episode"]["l"].numpy()[done], episode_length[done])
        episode_return[done] = 0.0
        episode_length[done] = 0
        terminations += int(expected_terminated.sum())
        truncations += int((expected_truncated & ~expected_terminated).sum())
    assert truncations > 0  # time-limit ends were among the compared steps
    if env_id != "HalfCheetah-v5":  # the others fall (or drop the pole): falls were compared too
        assert terminations > 0
    if env_id in ("Hopper-v5", "Walker2d-v5"):  # their observations clip velocities at 10: that was compared
        assert clipped_velocities > 0


@needs_mjx
@safe_cpu_jaxlib
@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["Hopper-v5", "Walker2d-v5"])
def test_health_at_the_edges_of_its_ranges_is_gymnasiums(env_id):
    """States at the edges of the health ranges, which random play seldom reaches: heights around 0.7 and 0.8 (and
    Walker2d's 2.0), angles around 0.2 and 1.0, and velocities beyond the observation's clip of 10 and Hopper's state
    range of 100 (over qpos[2:] and the unclipped qvel); one step of each, against gymnasium's."""
    reference = [gym.make(env_id, max_episode_steps=TIME_LIMIT) for _ in range(WORLDS)]
    for world in reference:
        world.reset(seed=0)
    model = reference[0].unwrapped.model
    qpos = np.tile(reference[0].unwrapped.init_qpos, (2 * WORLDS, 1))
    qvel = np.zeros((2 * WORLDS, model.nv))
    qpos[:16, 1] = [0.65, 0.69, 0.71, 0.75, 0.79, 0.81, 1.95, 1.99, 2.01, 2.1, 1.25, 1.25, 1.25, 1.25, 1.25, 1.25]
    qpos[10:16, 2] = [-1.05, -0.99, 0.99, 1.05, 0.25, -0.25]
    for row, dof in enumerate(range(WORLDS, 2 * WORLDS)):
        qvel[dof, row % model.nv] = [5, 15, 50, 99, 101, 150, 300, -150][row % 8]
    env = MJXVectorEnv(env_id, WORLDS, seed=1, device="cpu", max_episode_steps=TIME_LIMIT)
    env.reset()
    action = np.zeros((WORLDS, model.nu), np.float32)
    terminations = 0
    for rows in (slice(0, WORLDS), slice(WORLDS, 2 * WORLDS)):
        for world, world_qpos, world_qvel in zip(reference, qpos[rows], qvel[rows]):
            world.unwrapped.set_state(world_qpos, world_qvel)
        env.set_state(torch.as_tensor(qpos[rows]), torch.as_tensor(qvel[rows]))
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(action))
        expected = [world.step(world_action) for world, world_action in zip(reference, action)]
        np.testing.assert_array_equal(terminated.numpy(), [x[2] for x in expected])
        np.testing.assert_allclose(reward.numpy(), [x[1] for x in expected], rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(info["final_obs"].numpy(), [x[0] for x in expected], rtol=2e-3, atol=2e-3)
        terminations += int(terminated.sum())
    assert 0 < terminations < 2 * WORLDS


@needs_mjx
@safe_cpu_jaxlib
@pytest.mark.slow
def test_a_fall_in_the_last_step_is_both_terminated_and_truncated_as_in_gymnasium():
    """gymnasium's TimeLimit truncates at the limit whatever the env says: a fall in the last step is both."""
    env = MJXVectorEnv("InvertedPendulum-v5", WORLDS, seed=1, device="cpu", max_episode_steps=TIME_LIMIT)
    env.reset()
    same_step = gym.vector.AutoresetMode.SAME_STEP
    reference = gym.vector.SyncVectorEnv(
        [lambda: gym.make("InvertedPendulum-v5", max_episode_steps=TIME_LIMIT)] * WORLDS, autoreset_mode=same_step
    )
    reference = gym.wrappers.vector.RecordEpisodeStatistics(reference)
    reference.reset(seed=0)
    action = np.zeros((WORLDS, 1), np.float32)
    for step in range(TIME_LIMIT):
        worlds = reference.env.envs
        qpos = np.stack([world.unwrapped.data.qpos for world in worlds])
        qvel = np.stack([world.unwrapped.data.qvel for world in worlds])
        if step == TIME_LIMIT - 1:  # half the poles fall in the last step
            qpos[: WORLDS // 2, 1] = 0.199
            qvel[: WORLDS // 2, 1] = 5.0
        for world, world_qpos, world_qvel in zip(worlds, qpos, qvel):
            world.unwrapped.set_state(world_qpos, world_qvel)
        env.set_state(torch.as_tensor(qpos), torch.as_tensor(qvel))
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(action))
        _, expected_reward, expected_terminated, expected_truncated, expected_info = reference.step(action)
        np.testing.assert_array_equal(terminated.numpy(), expected_terminated)
        np.testing.assert_array_equal(truncated.numpy(), expected_truncated)
    assert terminated[: WORLDS // 2].all() and truncated.all()
    np.testing.assert_array_equal(info["_episode"].numpy(), expected_info["_episode"])
    np.testing.assert_allclose(info["episode"]["r"].numpy(), expected_info["episode"]["r"], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(info["episode"]["l"].numpy(), expected_info["episode"]["l"])


@needs_mjx
@safe_cpu_jaxlib
@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["HalfCheetah-v5", "InvertedPendulum-v5"])
def test_a_world_whose_state_goes_bad_is_rescued_as_mujoco_does(env_id):
    """MuJoCo's mj_step resets a world (mj_resetData) whose qpos or qvel is NaN or beyond 1e10 before it steps, or
    whose accelerations are, and steps on from there; gymnasium's envs inherit it. Before: an MJX world kept the
    NaN (HalfCheetah: NaN observations and rewards until the time limit) or blew up to 1e23."""
    reference = [gym.make(env_id, max_episode_steps=TIME_LIMIT) for _ in range(WORLDS)]
    for seed, world in enumerate(reference):
        world.reset(seed=seed)
    qpos = np.stack([world.unwrapped.data.qpos for world in reference])
    qvel = np.stack([world.unwrapped.data.qvel for world in reference])
    qvel[:4, 0] = [np.nan, np.inf, -1e11, 1e9]  # 1e9: a sane start, its accelerations beyond 1e10
    qpos[4, 1] = np.nan
    qpos[5, 0] = 2e10
    for world, world_qpos, world_qvel in zip(reference, qpos, qvel):
        world.unwrapped.set_state(world_qpos, world_qvel)
    env = MJXVectorEnv(env_id, WORLDS, seed=1, device="cpu", max_episode_steps=TIME_LIMIT)
    env.reset()
    env.set_state(torch.as_tensor(qpos), torch.as_tensor(qvel))
    rng = np.random.default_rng(0)
    low, high = reference[0].action_space.low, reference[0].action_space.high
    going = np.ones(WORLDS, bool)
    for step in range(2):  # the rescue, then a step on from it (of the worlds that did not end)
        action = rng.uniform(low, high, size=(WORLDS, len(low))).astype(np.float32)
        if step == 0:  # a NaN control: MuJoCo zeroes all the world's controls, and it steps on (before: MJX reset it)
            action[6], action[7, 0] = np.nan, np.nan
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(action))
        expected = [world.step(world_action) for world, world_action in zip(reference, action)]
        expected_obs = np.stack([x[0] for x in expected])
        final_obs = info["final_obs"].numpy()
        np.testing.assert_allclose(final_obs[going], expected_obs[going], rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(reward.numpy()[going], np.array([x[1] for x in expected])[going], atol=1e-4)
        np.testing.assert_array_equal(terminated.numpy()[going], np.array([x[2] for x in expected])[going])
        assert np.isfinite(final_obs[:8]).all() and np.isfinite(reward.numpy()[8:]).all()  # a NaN action's cost: NaN
        going &= ~terminated.numpy()


# ---------------------------------------------------------------- auto-reset and episode accounting
@needs_mjx
@safe_cpu_jaxlib
@pytest.mark.slow
def test_autoreset_keeps_every_worlds_episode_accounting_and_is_reproducible():
    """InvertedPendulum (the pole falls within a few steps; 15-step limit) with random actions: each world's episode
    return and length are its own rewards and steps since its last end, an ended world restarts in the same step
    (its next observation is a fresh start, its final one shows the fall), and the same seed repeats it all."""
    env = MJXVectorEnv("InvertedPendulum-v5", WORLDS, seed=5, device="cpu", max_episode_steps=TIME_LIMIT)
    twin = MJXVectorEnv("InvertedPendulum-v5", WORLDS, seed=5, device="cpu", max_episode_steps=TIME_LIMIT)
    assert MJXVectorEnv("InvertedPendulum-v5", WORLDS, device="cpu").max_episode_steps == 1000  # the registry's
    with pytest.raises(MJXEnvError, match="call reset"):
        env.step(torch.zeros(WORLDS, 1))
    obs, info = env.reset()
    with pytest.raises(MJXEnvError, match=r"action has shape \(16, 2\); expected \(16, 1\)"):
        env.step(torch.zeros(WORLDS, 2))
    assert (obs.dtype, obs.device, obs.shape, info) == (torch.float32, torch.device("cpu"), (WORLDS, 4), {})
    np.testing.assert_array_equal(twin.reset()[0].numpy(), obs.numpy())
    assert not torch.equal(twin.reset(seed=6)[0], obs)  # another seed, another start
    twin.reset(seed=5)
    generator = torch.Generator().manual_seed(0)
    running_return = torch.zeros(WORLDS)
    running_length = torch.zeros(WORLDS, dtype=torch.int32)
    terminations = truncations = 0
    for _ in range(STEPS):
        action = torch.rand(WORLDS, 1, generator=generator) * 6 - 3
        obs, reward, terminated, truncated, info = env.step(action)
        twin_obs, twin_reward, *_ = twin.step(action)
        assert torch.equal(obs, twin_obs) and torch.equal(reward, twin_reward)
        assert (reward.dtype, terminated.dtype, truncated.dtype) == (torch.float32, torch.bool, torch.bool)
        assert obs.untyped_storage().data_ptr() == reward.untyped_storage().data_ptr()  # one buffer from JAX

        done = terminated | truncated
        running_return += reward
        running_length += 1
        assert torch.equal(info["_final_obs"], done) and torch.equal(info["_episode"], done)
        torch.testing.assert_close(info["episode"]["r"], running_return, rtol=0, atol=1e-5)
        assert torch.equal(info["episode"]["l"], running_length) and info["episode"]["l"].dtype == torch.int32
        assert torch.equal(truncated, running_length == TIME_LIMIT)
        assert torch.equal(reward, (~terminated).float())  # 1 per step until the pole falls, 0 on the fall
        final_obs = info["final_obs"]
        assert torch.equal(terminated, final_obs[:, 1].abs() > 0.2)  # the fall shows in the final observation
        assert torch.equal(final_obs[~done], obs[~done])
        assert (obs[done].abs() <= 0.01).all()  # ended worlds start again: gymnasium's reset noise, scale 0.01
        assert (obs[done] != final_obs[done]).any(dim=1).all()
        running_return[done] = 0.0
        running_length[done] = 0
        terminations += int(terminated.sum())
        truncations += int((truncated & ~terminated).sum())
    assert terminations > WORLDS and truncations > 0, (terminations, truncations)


@needs_mjx
@safe_cpu_jaxlib
def test_the_physics_multiplies_in_float32_on_every_device():
    """JAX's GPU default multiplies float32 matrices in TF32; the compiled step and reset ask for float32 in each of
    their products (precision HIGHEST), fixed when jit traces them, so the run pays nothing per step for it."""
    import jax.numpy as jnp

    env = MJXVectorEnv("InvertedPendulum-v5", 2, device="cpu")
    env.reset()
    action = jnp.zeros((2, 1), jnp.float32)
    step = re.findall(r"precision = \[(\w+), (\w+)\]", env._step_fn.lower(env._state, env._key, action).as_text())
    reset = re.findall(r"precision = \[(\w+), (\w+)\]", env._reset_fn.lower(env._key).as_text())  # may have none
    assert len(step) > 10 and {p for pair in step + reset for p in pair} == {"HIGHEST"}


# ---------------------------------------------------------------- physics="fast"
def test_a_physics_setting_other_than_exact_or_fast_is_one_line():
    """Refused before JAX is imported, with the values to choose from; so is "fast" for a task without a measured
    fast setting (it would not be what the name promises)."""
    with pytest.raises(MJXEnvError) as bad:
        MJXVectorEnv("Hopper-v5", 4, physics="quick")
    assert str(bad.value) == (
        "physics must be 'exact' (gymnasium's XML as it ships) or 'fast' (docs/mjx.md), not 'quick'"
    )
    with pytest.raises(MJXEnvError) as unmeasured:
        MJXVectorEnv("Walker2d-v5", 4, physics="fast")
    assert str(unmeasured.value) == (
        "physics='fast' is measured for HalfCheetah-v5, Hopper-v5 and InvertedPendulum-v5 only: use 'exact' for "
        "Walker2d-v5 (docs/mjx.md)"
    )


def test_physics_options_hands_out_a_copy_that_leaves_fast_physics_as_it_was(monkeypatch):
    """Before: physics_options returned FAST_PHYSICS's own dict, so a caller that changed what it got changed the
    setting of every world built after it (benchmark/mjx_fidelity.py did)."""
    env_id = next(iter(mjx_envs.FAST_PHYSICS))
    monkeypatch.setitem(mjx_envs.FAST_PHYSICS, env_id, dict(mjx_envs.FAST_PHYSICS[env_id]))  # restored after
    before = dict(mjx_envs.FAST_PHYSICS[env_id])
    handed_out = mjx_envs.physics_options(env_id, "fast")
    assert handed_out == before
    handed_out["iterations"] = 1
    handed_out["disableflags"] = 1
    assert mjx_envs.FAST_PHYSICS[env_id] == before
    assert mjx_envs.physics_options(env_id, "fast") == before
    mjx_envs.physics_options(env_id, "exact")["iterations"] = 1
    assert mjx_envs.physics_options(env_id, "exact") == {}


def test_fast_physics_is_refused_where_a_world_steps_on_from_states_the_defaults_end():
    """The fast setting was measured on the states a task reaches with its defaults. A Hopper that steps on once
    fallen (terminate_when_unhealthy=False) or stays healthy beyond the default ranges reaches states where the
    cap departs from exact (docs/mjx.md): refused in one line that says what to change, before JAX is imported.
    Narrower ranges end episodes sooner, so they reach fewer states, and are accepted."""
    with pytest.raises(MJXEnvError) as fallen:
        MJXVectorEnv("Hopper-v5", 4, physics="fast", terminate_when_unhealthy=False)
    assert str(fallen.value) == (
        "physics='fast' is measured on the states Hopper-v5 reaches with its default health rules, not with "
        "terminate_when_unhealthy=False: drop it or use physics='exact' (docs/mjx.md)"
    )
    with pytest.raises(MJXEnvError, match=r"not with healthy_angle_range=\(-1.0, 1.0\): drop it or use"):
        MJXVectorEnv("Hopper-v5", 4, physics="fast", healthy_angle_range=(-1.0, 1.0))
    narrower = mjx_envs.make_task("Hopper-v5", healthy_angle_range=(-0.1, 0.1), healthy_z_range=(0.8, 2.0))
    assert mjx_envs.physics_options("Hopper-v5", "fast", narrower) == mjx_envs.FAST_PHYSICS["Hopper-v5"]
    unhealthy = mjx_envs.make_task("Hopper-v5", terminate_when_unhealthy=False)
    assert mjx_envs.physics_options("Hopper-v5", "exact", unhealthy) == {}  # exact is gymnasium's: any arguments


@needs_mjx
@pytest.mark.parametrize("env_id", mjx_envs.FAST_PHYSICS)
def test_fast_physics_sets_fewer_solver_iterations_on_the_model_and_exact_keeps_the_xmls(env_id):
    import mujoco

    xml = mujoco.MjModel.from_xml_path(str(mjx_envs.gymnasium_xml_path(TASKS[env_id]().xml_file))).opt
    exact = MJXVectorEnv(env_id, 2, device="cpu").mj_model.opt
    fast = MJXVectorEnv(env_id, 2, device="cpu", physics="fast").mj_model.opt
    names = ("iterations", "ls_iterations", "disableflags", "solver", "integrator", "timestep", "jacobian")
    assert [getattr(exact, name) for name in names] == [getattr(xml, name) for name in names]
    assert (exact.iterations, exact.ls_iterations) == (100, 50)  # gymnasium's XMLs: MuJoCo's defaults
    setting = mjx_envs.FAST_PHYSICS[env_id]
    assert (fast.iterations, fast.ls_iterations) == (setting["iterations"], setting["ls_iterations"])
    assert fast.iterations < exact.iterations
    assert (fast.timestep, fast.integrator, fast.solver) == (xml.timestep, xml.integrator, xml.solver)
    assert fast.disableflags == xml.disableflags | setting.get("disableflags", 0)  # flags add to the XML's


@needs_mjx
@safe_cpu_jaxlib
@pytest.mark.slow
def test_fast_physics_stays_close_to_exact_over_one_step_from_the_same_states():
    """32 states of a Hopper rollout in gymnasium (random actions; falls included), each with the solver's warm
    start as the rollout left it: one step of fast worlds against exact worlds and gymnasium, the same actions.
    benchmark/mjx_fidelity.py measures it over thousands of states (docs/mjx.md)."""
    reference = gym.make("Hopper-v5").unwrapped
    reference.reset(seed=0)
    rng = np.random.default_rng(0)
    states, expected = {"qpos": [], "qvel": [], "qacc_warmstart": [], "action": []}, []
    while len(expected) < 32:
        for name in ("qpos", "qvel", "qacc_warmstart"):
            states[name].append(getattr(reference.data, name).copy())
        states["action"].append(rng.uniform(-1, 1, 3).astype(np.float32))
        expected.append(reference.step(states["action"][-1])[:3])
        if expected[-1][2]:
            reference.reset(seed=len(expected))
    batch = {name: torch.as_tensor(np.stack(values)) for name, values in states.items()}
    results = {}
    for physics in ("exact", "fast"):
        env = MJXVectorEnv("Hopper-v5", 32, seed=1, device="cpu", physics=physics)
        env.reset()
        env.set_state(batch["qpos"], batch["qvel"], batch["qacc_warmstart"])
        _, reward, terminated, _, info = env.step(batch["action"])
        results[physics] = (info["final_obs"].numpy(), reward.numpy(), terminated.numpy())
    gym_obs, gym_reward, gym_terminated = (np.array(x) for x in zip(*expected))
    assert 0 < gym_terminated.sum() < 32  # falls were compared
    for obs, reward, terminated in results.values():
        np.testing.assert_allclose(obs, gym_obs, rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(reward, gym_reward, rtol=0, atol=1e-3)
        np.testing.assert_array_equal(terminated, gym_terminated)
    np.testing.assert_allclose(results["fast"][0], results["exact"][0], rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------- reset noise
@needs_mjx
@safe_cpu_jaxlib
@pytest.mark.parametrize("env_id", TASKS)
def test_reset_noise_follows_gymnasiums_distribution(env_id):
    """4,096 MJX starts against 1,024 of gymnasium's own (qpos and qvel noise, x included): same distributions by a
    two-sample Kolmogorov-Smirnov test, inside gymnasium's bounds, every world its own draw, a seed repeats them."""
    stats = pytest.importorskip("scipy.stats")
    kwargs = {} if env_id == "InvertedPendulum-v5" else {"exclude_current_positions_from_observation": False}
    env = MJXVectorEnv(env_id, 4096, seed=7, device="cpu", **kwargs)
    ours = env.reset()[0].numpy().astype(np.float64)
    assert len(np.unique(ours, axis=0)) == len(ours)
    np.testing.assert_array_equal(env.reset(seed=7)[0].numpy(), ours)
    reference = gym.make(env_id, **kwargs)
    theirs = np.stack([reference.reset(seed=i)[0] for i in range(1024)])
    nq = reference.unwrapped.model.nq
    init = np.concatenate([reference.unwrapped.init_qpos, reference.unwrapped.init_qvel])
    scale = TASKS[env_id]().reset_noise_scale
    for part, columns in (("qpos", slice(0, nq)), ("qvel", slice(nq, None))):
        our_noise = (ours - init)[:, columns].ravel()
        their_noise = (theirs - init)[:, columns].ravel()
        result = stats.ks_2samp(our_noise, their_noise)
        assert result.pvalue > 1e-3, f"{part} noise: {result}"
        if part == "qpos" or env_id != "HalfCheetah-v5":  # uniform on [-scale, scale]
            assert np.abs(our_noise).max() <= scale * (1 + 1e-6)
        else:  # HalfCheetah's qvel: scale * standard normal
            assert 0.95 < our_noise.std() / scale < 1.05


# ---------------------------------------------------------------- MuJoCo Warp
@needs_mjx
@safe_cpu_jaxlib
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("warp") is None, reason='needs warp-lang: pip install -e ".[mjx,warp]"')
def test_warp_implementation_matches_the_jax_one():
    """impl="warp" on Warp's CPU device (its kernels compile for minutes the first time, then load from
    ~/.cache/gpu-rl/warp): the same starts as impl="jax" for a seed, and from the same states and actions the same
    steps (HalfCheetah: contacts in Warp's shared contact buffer), flags and auto-resets included."""
    warp_env = MJXVectorEnv("HalfCheetah-v5", 8, seed=1, device="cpu", impl="warp", max_episode_steps=5)
    jax_env = MJXVectorEnv("HalfCheetah-v5", 8, seed=1, device="cpu", impl="jax", max_episode_steps=5)
    torch.testing.assert_close(warp_env.reset()[0], jax_env.reset()[0], rtol=0, atol=0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(8):
        qpos = 0.2 * torch.randn(8, 9, generator=generator)
        qvel = 2.0 * torch.randn(8, 9, generator=generator)
        warp_env.set_state(qpos, qvel)
        jax_env.set_state(qpos, qvel)
        action = torch.rand(8, 6, generator=generator) * 2 - 1
        warp_result = warp_env.step(action)
        jax_result = jax_env.step(action)
        torch.testing.assert_close(warp_result[4]["final_obs"], jax_result[4]["final_obs"], rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(warp_result[1], jax_result[1], rtol=1e-3, atol=1e-3)
        assert torch.equal(warp_result[3], jax_result[3])  # truncated at the same steps
        torch.testing.assert_close(warp_result[0], jax_result[0], rtol=2e-3, atol=2e-3)  # resets: the same draws


# ---------------------------------------------------------------- on a GPU
@needs_mjx
@pytest.mark.gpu
def test_on_a_gpu_results_stay_on_the_device_and_match_gymnasium():
    """HalfCheetah on cuda: every result a CUDA tensor, actions read from CUDA memory, JAX not holding most of the
    card, and from 64 states of a gymnasium rollout and its actions the GPU's steps match gymnasium's."""
    reference = gym.make("HalfCheetah-v5")
    reference.reset(seed=0)
    rng = np.random.default_rng(0)
    qpos, qvel, actions, expected_obs, expected_reward = [], [], [], [], []
    for _ in range(64):
        qpos.append(reference.unwrapped.data.qpos.copy())
        qvel.append(reference.unwrapped.data.qvel.copy())
        actions.append(rng.uniform(-1, 1, 6).astype(np.float32))
        obs, reward, *_ = reference.step(actions[-1])
        expected_obs.append(obs)
        expected_reward.append(reward)
    env = MJXVectorEnv("HalfCheetah-v5", 64, seed=1, device="cuda")
    assert mjx_envs.os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    env.reset()
    env.set_state(torch.as_tensor(np.stack(qpos), device="cuda"), torch.as_tensor(np.stack(qvel), device="cuda"))
    obs, reward, terminated, truncated, info = env.step(torch.as_tensor(np.stack(actions), device="cuda"))
    for tensor in (obs, reward, terminated, truncated, info["final_obs"], info["episode"]["r"]):
        assert tensor.device == torch.device("cuda", torch.cuda.current_device())
    np.testing.assert_allclose(obs.cpu().numpy(), np.stack(expected_obs), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(reward.cpu().numpy(), expected_reward, rtol=0, atol=1e-3)
    free, total = torch.cuda.mem_get_info(env.device)
    assert free > 0.5 * total  # JAX took what it needs, not 75% of the card up front
