"""One step of mjx_envs' physics="fast" against "exact" and against gymnasium's MuJoCo, per class of states (#53, #58).

    python benchmark/mjx_fidelity.py --env-id HalfCheetah-v5 Hopper-v5 InvertedPendulum-v5 --states 1024 \\
        --checkpoint Hopper-v5=runs/<run>/checkpoint.pt --out README.md --csv fidelity.csv

Trajectories of a chaotic system diverge whatever the solver (HalfCheetah from a 1e-7 perturbation within a dozen
steps), so this compares what can be compared: single steps from the same states. Each state (qpos, qvel, the
solver's warm start gymnasium's run left, the action taken there) is stepped once by gymnasium's env (float64 MuJoCo,
the XML's solver), by MJX worlds with the XML's solver ("exact") and by MJX worlds with each (iterations,
ls_iterations) of --grid, set as physics="fast" sets FAST_PHYSICS. The states come in classes (CLASSES), each of up
to --states states from gymnasium v5's own env: one class per policy (a random one, bang-bang, sinusoids, a
checkpoint's given --checkpoint, and for InvertedPendulum a balancer that drifts to the rail's end), and from all of
their states pooled, the fastest, those with a joint limit active, fallen ones and knife-edge ones (moved so that
gymnasium's step ends within 1e-11 of a termination threshold).

Per class and pair of settings it reports the distribution over states (mean, p99, max) of the observation's error
(per state the largest over its entries) and the reward's, the terminations that differ, and for fast against exact
the states on which it departs from exact more than exact departs from gymnasium (not in the rule). The rule, per grid
point: on every class the task reaches with its default arguments, fast against exact must not depart more than
exact departs from gymnasium: the p99 and the max of both errors at most exact-vs-gymnasium's, and no termination
differing from exact's, except on knife-edge states, where float32 rounding decides and at most as many may differ
as exact's differ from gymnasium's. The chosen setting is the cheapest (fewest iterations) from which every dearer
grid point passes too; none: the task has no fast setting. Then each setting's env steps/s: the same worlds from
their reset, random actions, the settings taking --rounds turns of --seconds (the median).
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import platform
import sys
import time
from unittest import mock

import gymnasium as gym
import mujoco
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import continuous_envs  # noqa: E402
import mjx_envs  # noqa: E402
import run_utils  # noqa: E402

# iterations,ls_iterations[,noeulerdamp] to try as physics="fast"; the XMLs' own are MuJoCo's defaults, 100,50
GRID = ["16,32", "8,16", "6,12", "4,8", "3,6", "2,4", "1,4"]
KNIFE_EDGE = 1e-11  # gymnasium's margin to a termination threshold, at most, for a knife-edge state
CLASSES = {
    "random": "uniform random actions",
    "bang-bang": "each actuator at an end of its range, switching with probability 1/4 a step",
    "sinusoid": "each actuator a sine over its range, period 5 to 40 steps and phase drawn per episode",
    "trained": "the --checkpoint policy, sampled with its std",
    "drift": "InvertedPendulum: an LQR balancer whose cart target walks to a rail end and past it",
    "high-velocity": "the pooled states (every policy's, every step) with the largest |qvel| entry",
    "limits": "pooled states with a joint limit active at some substep of their step",
    "fallen": "HalfCheetah on its back (episodes started flipped); Hopper unhealthy (terminate_when_unhealthy=False)",
    "knife-edge": "pooled states moved in height or angle so that gymnasium's step ends <= 1e-11 from a threshold",
}
STATE_KEYS = ("qpos", "qvel", "qacc_warmstart", "action")
FIGURES = ["obs mean", "obs p99", "obs max", "reward mean", "reward p99", "reward max", "terminations differ"]
COLUMNS = ["task", "setting", "class", "reached", "compared", "states", *FIGURES, "states worse", "passes"]
COLUMNS += ["steps/s", "vs exact", "build s"]


# ---------------------------------------------------------------- policies: factory(env, rng) -> act(obs, t)
def load_policy(path: str):
    """ppo_continuous.py's checkpoint, read as data only (run_utils.read_checkpoint: no pickled code runs), as a
    function (obs, rng) -> action: its actor (Linear and tanh layers, read from the state dict, so this file needs no
    copy of the script) on normalised observations, sampled with its std."""
    ckpt = run_utils.load_checkpoint(path, "ppo_continuous")
    model = ckpt["model"]
    if "actor_logstd" not in model or "obs_rms" not in ckpt:
        raise run_utils.CheckpointError(f"{path!r} holds no actor or observation statistics; use a checkpoint.pt")
    mean, var, _ = (np.asarray(x, dtype=np.float64) for x in ckpt["obs_rms"])
    layers = sorted({int(key.split(".")[1]) for key in model if key.startswith("actor_mean.")})
    std = model["actor_logstd"].exp().numpy()[0]

    def act(obs, rng):
        x = torch.as_tensor(np.clip((obs - mean) / np.sqrt(var + 1e-8), -10, 10), dtype=torch.float32)
        for i, layer in enumerate(layers):
            x = x @ model[f"actor_mean.{layer}.weight"].T + model[f"actor_mean.{layer}.bias"]
            x = torch.tanh(x) if i < len(layers) - 1 else x
        return (x.numpy() + std * rng.standard_normal(std.shape)).astype(np.float32)

    return act


def random_policy(env, rng):
    low, high = env.action_space.low, env.action_space.high
    return lambda obs, t: rng.uniform(low, high).astype(np.float32)


def bang_bang_policy(env, rng):
    low, high = env.action_space.low, env.action_space.high
    side = rng.integers(0, 2, low.shape).astype(bool)

    def act(obs, t):
        side[rng.random(low.shape) < 0.25] ^= True
        return np.where(side, high, low).astype(np.float32)

    return act


def sinusoid_policy(env, rng):
    low, high = env.action_space.low, env.action_space.high
    period, phase = rng.uniform(5, 40, low.shape), rng.uniform(0, 2 * np.pi, low.shape)
    return lambda obs, t: ((low + high) / 2 + (high - low) / 2 * np.sin(2 * np.pi * t / period + phase)).astype(
        np.float32
    )


@functools.cache
def lqr_gain(env_id: str) -> np.ndarray:
    """The discrete LQR gain of the task linearised at its reset state (the pole up) over one env step (the control
    held for frame_skip physics steps), by central differences with MuJoCo (mjd_transitionFD refuses RK4); the
    Riccati equation solved by iteration (no SciPy here). For a model whose qpos is its tangent (nq = nv)."""
    model, frame_skip = model_of(env_id)
    data = mujoco.MjData(model)
    nq, nu = model.nq, model.nu

    def step(state, control):
        data.qpos[:], data.qvel[:], data.ctrl[:], data.qacc_warmstart[:] = state[:nq], state[nq:], control, 0
        mujoco.mj_step(model, data, frame_skip)
        return np.concatenate([data.qpos, data.qvel])

    state, control, eps = np.concatenate([model.qpos0, np.zeros(model.nv)]), np.zeros(nu), 1e-6
    a = np.stack([step(state + eps * e, control) - step(state - eps * e, control) for e in np.eye(len(state))], 1)
    b = np.stack([step(state, control + eps * e) - step(state, control - eps * e) for e in np.eye(nu)], 1)
    a, b = a / (2 * eps), b / (2 * eps)
    q, r = np.diag([1.0, 10.0, 0.1, 0.1]), np.eye(nu)
    p = q
    for _ in range(5000):
        gain = np.linalg.solve(r + b.T @ p @ b, b.T @ p @ a)
        p = q + a.T @ p @ (a - b @ gain)
    return gain


def drift_policy(env, rng):
    """A balancer (LQR on InvertedPendulum's [qpos, qvel] observation) whose cart target walks from the start to a
    rail end and past it, 0.01 to 0.05 m a step (up to 1.25 m/s), with a little action noise: the rail's end in
    normal play."""
    gain = lqr_gain(env.spec.id)
    low, high = env.action_space.low, env.action_space.high
    side, speed, end = rng.choice([-1.0, 1.0]), rng.uniform(0.01, 0.05), rng.uniform(0.9, 1.3)

    def act(obs, t):
        target = np.zeros_like(obs)
        target[0] = side * min(end, speed * t)
        noise = 0.1 * rng.standard_normal(low.shape)
        return np.clip(-gain @ (obs - target) + noise, low, high).astype(np.float32)

    return act


def flip_start(env, rng):
    """HalfCheetah's episode started on its back (rooty turned by pi, lifted 0.3 m): it never terminates, so a
    world that falls over steps on from such states with the defaults."""
    qpos, qvel = env.unwrapped.data.qpos.copy(), env.unwrapped.data.qvel.copy()
    qpos[1] += 0.3
    qpos[2] += np.pi
    env.unwrapped.set_state(qpos, qvel)


# ---------------------------------------------------------------- sampling the classes
def rollout(env_id: str, make_policy, steps: int, seed: int, start=None, **task_kwargs) -> dict[str, np.ndarray]:
    """``steps`` steps of gymnasium's env under ``make_policy(env, rng)`` (a fresh policy each episode), every
    state with the action taken there; ``start(env, rng)``: a change to each episode's first state."""
    env = gym.make(env_id, **task_kwargs)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    if start:
        start(env, rng)
        obs = env.unwrapped._get_obs()
    act, t = make_policy(env, rng), 0
    keep: dict[str, list] = {name: [] for name in STATE_KEYS}
    for _ in range(steps):
        action = np.asarray(act(obs, t), dtype=np.float32)
        data = env.unwrapped.data
        for name in STATE_KEYS[:3]:
            keep[name].append(getattr(data, name).copy())
        keep["action"].append(action)
        obs, _, terminated, truncated, _ = env.step(action)
        t += 1
        if terminated or truncated:
            obs, _ = env.reset()
            if start:
                start(env, rng)
                obs = env.unwrapped._get_obs()
            act, t = make_policy(env, rng), 0
    return {name: np.stack(values) for name, values in keep.items()}


def take(states: dict, index) -> dict[str, np.ndarray]:
    return {name: values[index] for name, values in states.items()}


def join(*sets: dict) -> dict[str, np.ndarray]:
    return {name: np.concatenate([s[name] for s in sets]) for name in STATE_KEYS}


@functools.cache
def model_of(env_id: str):
    env = gym.make(env_id).unwrapped
    return env.model, env.frame_skip


def replay(env_id: str, states: dict) -> tuple[np.ndarray, np.ndarray]:
    """Each state's step as gymnasium's do_simulation takes it (ctrl = action, frame_skip mj_steps, from the same
    warm start), with MuJoCo: (qpos after it, whether a joint limit was active at some physics step of it)."""
    model, frame_skip = model_of(env_id)
    data = mujoco.MjData(model)
    after, limit = np.empty_like(states["qpos"]), np.zeros(len(states["qpos"]), bool)
    for i in range(len(states["qpos"])):
        data.qpos[:], data.qvel[:] = states["qpos"][i], states["qvel"][i]
        data.qacc_warmstart[:], data.ctrl[:] = states["qacc_warmstart"][i], states["action"][i]
        for _ in range(frame_skip):
            mujoco.mj_forward(model, data)  # the constraints this physics step sees; the step is unchanged by it
            limit[i] |= bool(np.any(data.efc_type[: data.nefc] == mujoco.mjtConstraint.mjCNSTR_LIMIT_JOINT))
            mujoco.mj_step(model, data)
        after[i] = data.qpos
    return after, limit


def edges(env_id: str) -> list[tuple[int, float, int]]:
    """The task's termination thresholds on a qpos entry: (index, threshold, +1 where healthy above it, -1 below)."""
    if env_id == "InvertedPendulum-v5":
        return [(1, -0.2, 1), (1, 0.2, -1)]  # terminated when abs(qpos[1]) > 0.2
    task = mjx_envs.make_task(env_id)
    found = []
    for index, name in ((1, "healthy_z_range"), (2, "healthy_angle_range")):
        low, high = getattr(task, name, (-np.inf, np.inf))
        found += [(index, x, side) for x, side in ((low, 1), (high, -1)) if np.isfinite(x)]
    return found


def margins(env_id: str, qpos: np.ndarray) -> np.ndarray:
    """(states, edges): how far each state is inside each threshold (negative: beyond it)."""
    return np.stack([side * (qpos[:, index] - x) for index, x, side in edges(env_id)], axis=1)


def fallen(env_id: str, states: dict) -> np.ndarray:
    """States a healthy world never steps from: HalfCheetah on its back, Hopper and Walker2d unhealthy."""
    if env_id == "HalfCheetah-v5":
        return np.cos(states["qpos"][:, 2]) < 0
    task = mjx_envs.make_task(env_id)
    inside = (margins(env_id, states["qpos"]) > 0).all(axis=1)
    if hasattr(task, "healthy_state_range"):
        low, high = task.healthy_state_range
        rest = np.concatenate([states["qpos"], states["qvel"]], axis=1)[:, 2:]
        inside &= ((low < rest) & (rest < high)).all(axis=1)
    return ~inside


def moved_to_edge(env_id: str, state: dict, edge: tuple[int, float, int], guess: float) -> dict | None:
    """``state`` (one) with qpos[index] moved by bisection so that its step ends within KNIFE_EDGE / 100 of the
    edge's threshold (replayed with MuJoCo), starting from a bracket around ``guess``; None where none is found."""
    index, x, side = edge

    def margin(offset):
        moved = dict(state, qpos=state["qpos"].copy())
        moved["qpos"][0, index] += offset
        return side * (replay(env_id, moved)[0][0, index] - x), moved

    widths = [w for w in (1e-4, 1e-3, 1e-2) if margin(guess - w)[0] * margin(guess + w)[0] <= 0]
    if not widths:  # a contact that comes or goes within the step: no crossing near the guess
        return None
    low, high = guess - widths[0], guess + widths[0]
    low_inside = margin(low)[0] > 0
    for _ in range(200):
        middle = (low + high) / 2
        value, moved = margin(middle)
        if abs(value) <= KNIFE_EDGE / 100:
            return moved
        if middle in (low, high):  # float64's resolution of the offset
            return None
        low, high = (middle, high) if (value > 0) == low_inside else (low, middle)
    return None


def knife_edge(env_id: str, pool: dict, after: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """Up to n pooled states (``after``: their qpos after their step), each moved along the qpos entry of the
    threshold its step ends nearest (the others at least 1e-3 inside; its start still healthy), kept where
    gymnasium's own step from it then ends within KNIFE_EDGE of the threshold."""
    found = margins(env_id, after)
    nearest = np.abs(found).argmin(axis=1)
    others_inside = np.array([np.delete(row, k).min(initial=np.inf) > 1e-3 for row, k in zip(found, nearest)])
    order = [i for i in np.argsort(np.abs(found[np.arange(len(found)), nearest])) if others_inside[i]]
    kept = []
    for i in order:
        if len(kept) == n:
            break
        edge = edges(env_id)[nearest[i]]
        guess = -edge[2] * found[i, nearest[i]]  # moving the entry by d moves it after the step by about d
        moved = moved_to_edge(env_id, take(pool, slice(i, i + 1)), edge, guess)
        if moved is not None and not fallen(env_id, moved).any():
            kept.append(moved)
    if not kept:
        return take(pool, slice(0, 0))
    kept = join(*kept)
    return take(kept, np.abs(margins(env_id, gymnasium_step(env_id, kept)[3])).min(axis=1) <= KNIFE_EDGE)


def sample_classes(env_id: str, n: int, stride: int, seed: int, trained=None) -> tuple[dict, dict[str, bool]]:
    """Every class of the task with up to n states: ({class: states}, {class: reached with the default args})."""
    factories = {"random": random_policy, "bang-bang": bang_bang_policy, "sinusoid": sinusoid_policy}
    if trained is not None:
        factories["trained"] = lambda env, rng: lambda obs, t: trained(obs, rng)
    if env_id == "InvertedPendulum-v5":
        factories["drift"] = drift_policy
    # the drift's rollout runs six times as long: only the end of its episodes has the cart at the rail's end
    runs = {
        name: rollout(env_id, make, n * stride * (6 if name == "drift" else 1), seed + k)
        for k, (name, make) in enumerate(factories.items())
    }
    classes = {name: take(run, slice(0, n * stride, stride)) for name, run in runs.items()}
    pool = join(*runs.values())
    rng = np.random.default_rng(seed)
    speed = np.abs(pool["qvel"]).max(axis=1)
    classes["high-velocity"] = take(pool, np.argsort(speed)[::-1][:n])
    after, limit = replay(env_id, pool)
    classes["limits"] = take(pool, np.sort(rng.permutation(np.flatnonzero(limit))[:n]))
    reached = dict.fromkeys(classes, True)
    if env_id != "InvertedPendulum-v5":  # its pole past 0.2 rad always ends the episode
        flipped = env_id == "HalfCheetah-v5"
        kwargs = {} if flipped else {"terminate_when_unhealthy": False}
        start = flip_start if flipped else None
        down = join(*(rollout(env_id, factories[name], n * stride // 3, seed + 10 + k, start, max_episode_steps=200,
                              **kwargs)
                      for k, name in enumerate(("random", "bang-bang", "sinusoid"))))  # fmt: skip
        classes["fallen"] = take(down, np.sort(rng.permutation(np.flatnonzero(fallen(env_id, down)))[:n]))
        reached["fallen"] = flipped  # HalfCheetah never terminates; Hopper and Walker2d end there by default
    if edges(env_id):
        classes["knife-edge"] = knife_edge(env_id, pool, after, n)
        reached["knife-edge"] = True
    return {name: states for name, states in classes.items() if len(states["action"])}, reached


# ---------------------------------------------------------------- stepping them
def gymnasium_step(env_id: str, states: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each state stepped once by gymnasium's env: (obs, reward, terminated, qpos after)."""
    env = gym.make(env_id).unwrapped
    env.reset(seed=0)
    results = []
    for qpos, qvel, warm, action in zip(*(states[name] for name in STATE_KEYS)):
        env.set_state(qpos, qvel)
        env.data.qacc_warmstart[:] = warm
        obs, reward, terminated, *_ = env.step(action)
        results.append((obs, reward, terminated, env.data.qpos.copy()))
    obs, reward, terminated, after = zip(*results)
    return np.stack(obs), np.array(reward), np.array(terminated), np.stack(after)


def mjx_step(env_id: str, physics: str, sets: dict[str, dict], n: int) -> tuple[dict, object, float]:
    """Each set of up to n states stepped once by n MJX worlds of ``physics`` (a smaller set repeats its states).
    Returns ({set: (obs, reward, terminated)}, the worlds, the seconds of their build, compile and steps)."""
    t0 = time.perf_counter()
    env = mjx_envs.MJXVectorEnv(env_id, n, seed=0, device="cpu", physics=physics)
    env.reset()
    results = {}
    for name, states in sets.items():
        size = len(states["action"])
        batch = take(states, np.resize(np.arange(size), n))
        env.set_state(*(torch.as_tensor(batch[k]) for k in STATE_KEYS[:3]))
        _, reward, terminated, _, info = env.step(torch.as_tensor(batch["action"]))
        # final_obs: the observation the step ended in, also where the world was reset after it
        results[name] = tuple(x.numpy()[:size] for x in (info["final_obs"], reward, terminated))
    return results, env, time.perf_counter() - t0


def speeds(envs: dict, seconds: float, rounds: int) -> dict[str, float]:
    """Each setting's env steps/s from its worlds' reset with random actions: the median of ``rounds`` turns of
    ``seconds``, the settings taking turns, so that a shared machine's load falls on all of them alike."""
    rates = {setting: [] for setting in envs}
    generator = torch.Generator().manual_seed(0)
    for env in envs.values():
        env.reset(seed=1)
    for _ in range(rounds):
        for setting, env in envs.items():
            low, high = (torch.as_tensor(x) for x in (env.single_action_space.low, env.single_action_space.high))
            steps, start = 0, time.perf_counter()
            while steps < 1 or time.perf_counter() - start < seconds:
                env.step(low + (high - low) * torch.rand((env.num_envs, *low.shape), generator=generator))
                steps += 1
            rates[setting].append(env.num_envs * steps / (time.perf_counter() - start))
    return {setting: float(np.median(found)) for setting, found in rates.items()}


# ---------------------------------------------------------------- the figures and the rule
def obs_error(a, b) -> np.ndarray:
    """Per state, the observation's largest absolute error over its entries."""
    return np.abs(a[0].astype(np.float64) - b[0]).max(axis=1)


def errors(a, b) -> dict[str, float]:
    """One step's errors between two results (obs, reward, terminated, ...) of the same states: the distribution
    over states of the observation's (obs_error) and the reward's, and the count of terminations that differ."""
    found: dict[str, float] = {"states": len(a[0])}
    per_state = {"obs": obs_error(a, b), "reward": np.abs(a[1].astype(np.float64) - b[1])}
    for name, values in per_state.items():
        found |= {f"{name} mean": values.mean(), f"{name} p99": np.percentile(values, 99), f"{name} max": values.max()}
    found["terminations differ"] = int((np.asarray(a[2]) != np.asarray(b[2])).sum())
    return found


def failures(fast_vs_exact: dict, exact_vs_gymnasium: dict, knife: bool) -> list[str]:
    """What breaks the rule on one class (empty: it passes): fast may not depart from exact more than exact
    departs from gymnasium, in the p99 and the max of either error; and it may flip none of exact's terminations,
    on knife-edge states no more than exact's own differ from gymnasium's."""
    broken = [
        f"{key} {fast_vs_exact[key]:.2g} > {exact_vs_gymnasium[key]:.2g}"
        for key in ("obs p99", "obs max", "reward p99", "reward max")
        if fast_vs_exact[key] > exact_vs_gymnasium[key]
    ]
    allowed = exact_vs_gymnasium["terminations differ"] if knife else 0
    if fast_vs_exact["terminations differ"] > allowed:
        broken.append(f"{fast_vs_exact['terminations differ']} terminations differ (> {allowed})")
    return broken


def choose(verdicts: dict[str, list[str]]) -> str:
    """The cheapest grid point from which every dearer one passes too ("none" when the dearest fails)."""
    chosen = "none"
    for setting in sorted(verdicts, key=cost, reverse=True):
        if verdicts[setting]:
            break
        chosen = setting
    return chosen


def options(setting: str) -> dict[str, int]:
    """A grid point as FAST_PHYSICS's entry: "4,8" -> iterations 4, ls_iterations 8; ",noeulerdamp": Euler's
    implicit damping off (MJX's guide; it spares a factorization per step)."""
    iterations, ls_iterations, *flags = setting.split(",")
    found = {"iterations": int(iterations), "ls_iterations": int(ls_iterations)}
    if "noeulerdamp" in flags:
        found["disableflags"] = int(mujoco.mjtDisableBit.mjDSBL_EULERDAMP)
    return found


def cost(setting: str) -> tuple:
    """A grid point's cost, for choosing: fewer iterations (then line-search iterations) never cost more, and
    without Euler's damping a step spares a factorization. Timing on a shared CPU is too noisy to rank them."""
    found = options(setting)
    return found["iterations"], found["ls_iterations"], "disableflags" not in found


def measure(env_id: str, a, trained) -> tuple[list[dict], str]:
    """The task's rows (one per setting, class and pair compared) and its chosen setting ("none": no fast one)."""
    sets, reached = sample_classes(env_id, a.states, a.stride, a.seed, trained)
    print(f"{env_id}: " + ", ".join(f"{name} {len(s['action'])}" for name, s in sets.items()), flush=True)
    gym_results = {name: gymnasium_step(env_id, s) for name, s in sets.items()}
    euler = model_of(env_id)[0].opt.integrator == mujoco.mjtIntegrator.mjINT_EULER  # the damping's
    grid = [setting for setting in a.grid if euler or "noeulerdamp" not in setting]
    runs, envs, builds = {}, {}, {}
    for setting in ["exact", *grid]:
        # the grid point under test as the task's fast setting, for these worlds only: FAST_PHYSICS is as it was after
        with mock.patch.dict(mjx_envs.FAST_PHYSICS, {} if setting == "exact" else {env_id: options(setting)}):
            runs[setting], envs[setting], builds[setting] = mjx_step(
                env_id, "exact" if setting == "exact" else "fast", sets, a.states
            )
        print(f"{env_id} {setting}: built and stepped in {builds[setting]:.0f} s", flush=True)
    rates = speeds(envs, a.seconds, a.rounds)
    rows, verdicts = [], {}
    for setting in runs:
        verdicts[setting] = []
        for name in sets:
            reference = errors(runs["exact"][name], gym_results[name])
            pairs = {"exact vs gymnasium": reference} if setting == "exact" else {}
            if setting != "exact":
                fast = errors(runs[setting][name], runs["exact"][name])
                # not in the rule (a state whose float32 rounding happens to match float64's would decide it): the
                # states on which fast departs from exact more than exact departs from gymnasium, #58's count
                departs = obs_error(runs[setting][name], runs["exact"][name])
                fast["states worse"] = int((departs > obs_error(runs["exact"][name], gym_results[name])).sum())
                broken = failures(fast, reference, name == "knife-edge")
                if reached[name]:
                    verdicts[setting] += [f"{name}: {b}" for b in broken]
                pairs["fast vs exact"] = fast | {"passes": "n/a" if not reached[name] else "no" if broken else "yes"}
                pairs["fast vs gymnasium"] = errors(runs[setting][name], gym_results[name])
            for pair, figures in pairs.items():
                rows.append({"task": env_id, "setting": setting, "class": name, "reached": reached[name],
                             "compared": pair, **figures, "steps/s": rates[setting],
                             "vs exact": rates[setting] / rates["exact"], "build s": builds[setting]})  # fmt: skip
    verdicts.pop("exact")
    for setting, broken in verdicts.items():
        print(f"{env_id} {setting}: " + ("passes" if not broken else "fails: " + "; ".join(broken)), flush=True)
    return rows, choose(verdicts)


def markdown(rows: list[dict], chosen: dict[str, str]) -> str:
    """Per task: exact against gymnasium per class, then fast against exact per setting and class, and the choice."""
    figure = FIGURES
    lines = ["Classes: " + "; ".join(f"{name}: {what}" for name, what in CLASSES.items()) + ".", ""]
    for env_id in chosen:
        mine = [row for row in rows if row["task"] == env_id]
        header = ["setting", "class", "reached by default", "states", "compared", *figure, "states worse", "passes"]
        header.append("env steps/s")
        lines += [f"### {env_id}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in mine:
            if row["compared"] == "fast vs gymnasium":
                continue
            label = row["setting"] + (" (chosen)" if row["setting"] == chosen[env_id] else "")
            cells = [label, row["class"], "yes" if row["reached"] else "no", str(row["states"]), row["compared"]]
            cells += [f"{row[k]:.2g}" if k != "terminations differ" else str(row[k]) for k in figure]
            cells += [str(row.get("states worse", "")), row.get("passes", "")]
            cells.append(f"{row['steps/s']:,.0f} ({row['vs exact']:.2f}x)")
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", f"{env_id}: chosen {chosen[env_id]}.", ""]
    return "\n".join(lines)


def machine() -> str:
    import importlib.metadata

    import jax

    cpu = next((line.split(":")[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    versions = f"torch {torch.__version__}, jax {jax.__version__}, mujoco {mujoco.__version__}, mujoco-mjx "
    versions += f"{importlib.metadata.version('mujoco-mjx')}, gymnasium {gym.__version__}"
    mine = len(os.sched_getaffinity(0))
    python = f"Python {platform.python_version()}"
    return f"{os.cpu_count()} CPUs ({cpu}), {mine} for this run; {python}, {versions}; load average at the end {load}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", nargs="+", default=list(mjx_envs.FAST_PHYSICS), choices=list(mjx_envs.TASKS))
    p.add_argument("--checkpoint", nargs="*", default=[], help="ENV_ID=PATH: a ppo_continuous.py checkpoint")
    p.add_argument("--states", type=int, default=1024, help="states per class at most (one MJX world each)")
    p.add_argument("--stride", type=int, default=5, help="gymnasium steps between a policy's kept states")
    p.add_argument("--grid", nargs="+", default=GRID, help="iterations,ls_iterations[,noeulerdamp] to try")
    p.add_argument("--seconds", type=float, default=3.0, help="each turn of a setting's speed measurement")
    p.add_argument("--rounds", type=int, default=3, help="turns of each setting's speed measurement (the median)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the tables (markdown) here")
    p.add_argument("--csv", help="write every row (fast against gymnasium too) here")
    a = p.parse_args(argv)
    continuous_envs.warn_once_per_process()  # gymnasium's half_cheetah.xml: one warning, no MUJOCO_LOG.TXT
    checkpoints = dict(item.split("=", 1) for item in a.checkpoint)
    try:  # every checkpoint read (as data) before the first world is built: a bad one is one line, at once
        trained = {env_id: load_policy(path) for env_id, path in checkpoints.items()}
    except (run_utils.CheckpointError, FileNotFoundError) as exc:
        sys.exit(f"mjx_fidelity: {exc}")
    rows, chosen = [], {}
    for env_id in a.env_id:
        task_rows, chosen[env_id] = measure(env_id, a, trained.get(env_id))
        rows += task_rows
        print(f"{env_id}: chosen iterations,ls_iterations = {chosen[env_id]}", flush=True)
    text = markdown(rows, chosen) + f"\nMachine: {machine()}.\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(f"`python {' '.join(sys.argv)}`\n\n{text}")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS, restval="")
            writer.writeheader()
            writer.writerows({k: f"{v:.3g}" if isinstance(v, float) else v for k, v in row.items()} for row in rows)


if __name__ == "__main__":
    main()
