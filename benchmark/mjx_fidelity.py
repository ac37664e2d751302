"""One step of mjx_envs' physics="fast" against "exact" and against gymnasium's MuJoCo, and what it saves (#53).

    python benchmark/mjx_fidelity.py --env-id HalfCheetah-v5 Hopper-v5 --states 1024 \\
        --checkpoint HalfCheetah-v5=runs/<run>/checkpoint.pt Hopper-v5=runs/<run>/checkpoint.pt --out README.md

Trajectories of a chaotic system diverge whatever the solver (HalfCheetah from a 1e-7 perturbation within a dozen
steps), so this compares what can be compared: single steps from the same states. For each task it plays gymnasium
v5's own env with a random policy (and a trained one, given --checkpoint) and keeps --states states (qpos, qvel and
the solver's warm start, every --stride steps) with the action taken there. Every state is then stepped once, with
that action, by gymnasium's env (float64 MuJoCo, the XML's solver), by MJX worlds with the XML's solver ("exact") and
by MJX worlds with each (iterations, ls_iterations) of --grid set on the model as physics="fast" sets FAST_PHYSICS.
Per pair it reports the observation's error (per state the largest over its entries; mean and max over states), the
reward's, and the share of states whose termination agrees. Then each setting's env steps/s: the same worlds from
their reset, random actions, the settings taking --rounds turns of --seconds (the median). The chosen setting per task
is the cheapest (fewest iterations; Euler's damping off counts as cheaper) whose mean errors against gymnasium stay
within --tolerance times the exact setting's and whose terminations agree with gymnasium's as often as the exact
setting's do, less --term-slack. Settings without Euler's damping are tried only on tasks that integrate with Euler.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import gymnasium as gym
import mujoco
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import mjx_envs  # noqa: E402

# iterations,ls_iterations[,noeulerdamp] to try as physics="fast"; the XMLs' own are MuJoCo's defaults, 100,50
GRID = ["8,16", "4,8", "2,4", "1,4", "4,8,noeulerdamp"]


def load_policy(path: str):
    """ppo_continuous.py's checkpoint as a function obs -> action: its actor (Linear and tanh layers, read from the
    state dict, so this file needs no copy of the script) on normalised observations, sampled with its std."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    model = ckpt["model"]
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


def sample_states(env_id: str, policy, n: int, stride: int, seed: int) -> dict[str, np.ndarray]:
    """n states of gymnasium's env under ``policy`` (None: random actions), one every ``stride`` steps, each with
    the action taken there: qpos, qvel, qacc_warmstart, action."""
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    keep: dict[str, list] = {"qpos": [], "qvel": [], "qacc_warmstart": [], "action": []}
    step = 0
    while len(keep["action"]) < n:
        action = env.action_space.sample() if policy is None else policy(obs, rng)
        if step % stride == 0:
            data = env.unwrapped.data
            for name in ("qpos", "qvel", "qacc_warmstart"):
                keep[name].append(getattr(data, name).copy())
            keep["action"].append(action)
        obs, _, terminated, truncated, _ = env.step(action)
        step += 1
        if terminated or truncated:
            obs, _ = env.reset()
    return {name: np.stack(values) for name, values in keep.items()}


def gymnasium_step(env_id: str, states: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each state stepped once by gymnasium's env: (obs, reward, terminated)."""
    env = gym.make(env_id).unwrapped
    env.reset(seed=0)
    results = []
    for qpos, qvel, warm, action in zip(states["qpos"], states["qvel"], states["qacc_warmstart"], states["action"]):
        env.set_state(qpos, qvel)
        env.data.qacc_warmstart[:] = warm
        obs, reward, terminated, *_ = env.step(action)
        results.append((obs, reward, terminated))
    obs, reward, terminated = zip(*results)
    return np.stack(obs), np.array(reward), np.array(terminated)


def mjx_step(env_id: str, physics: str, sets: dict[str, dict]) -> tuple[dict, object, float]:
    """Each set of states stepped once by MJX worlds of ``physics`` (one world a state; all sets the same size).
    Returns ({set: (obs, reward, terminated)}, the worlds, the seconds of their build, compile and first steps)."""
    n = len(next(iter(sets.values()))["action"])
    t0 = time.perf_counter()
    env = mjx_envs.MJXVectorEnv(env_id, n, seed=0, device="cpu", physics=physics)
    env.reset()
    results = {}
    for name, states in sets.items():
        env.set_state(*(torch.as_tensor(states[k]) for k in ("qpos", "qvel", "qacc_warmstart")))
        _, reward, terminated, _, info = env.step(torch.as_tensor(states["action"]))
        results[name] = (info["final_obs"].numpy(), reward.numpy(), terminated.numpy())  # obs: a reset's, if it ended
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


def errors(a, b) -> dict[str, float]:
    """One step's errors between two results (obs, reward, terminated) of the same states."""
    obs = np.abs(a[0].astype(np.float64) - b[0]).max(axis=1)
    reward = np.abs(a[1].astype(np.float64) - b[1])
    return {"obs mean": obs.mean(), "obs max": obs.max(), "reward mean": reward.mean(), "reward max": reward.max(),
            "terminations agree": float((a[2] == b[2]).mean())}  # fmt: skip


def acceptable(fast: dict, exact: dict, tolerance: float, term_slack: float) -> bool:
    """Whether fast-vs-gymnasium errors (all states) stay near exact-vs-gymnasium's."""
    near = all(fast[k] <= tolerance * exact[k] for k in ("obs mean", "reward mean"))
    return near and fast["terminations agree"] >= exact["terminations agree"] - term_slack


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


def measure(env_id: str, a, policies: dict) -> tuple[list[list[str]], str]:
    """The task's rows of the table and its chosen setting ("exact" when no grid point is acceptable)."""
    sets = {name: sample_states(env_id, policy, a.states, a.stride, a.seed) for name, policy in policies.items()}
    gym_results = {name: gymnasium_step(env_id, s) for name, s in sets.items()}
    euler = gym.make(env_id).unwrapped.model.opt.integrator == mujoco.mjtIntegrator.mjINT_EULER  # the damping's
    grid = [setting for setting in a.grid if euler or "noeulerdamp" not in setting]
    runs, envs = {}, {}
    for setting in ["exact", *grid]:
        # the grid point under test, as the task's fast setting: physics="fast" reads FAST_PHYSICS at build time
        mjx_envs.FAST_PHYSICS[env_id] = {} if setting == "exact" else options(setting)
        results, envs[setting], build = mjx_step(env_id, "exact" if setting == "exact" else "fast", sets)
        runs[setting] = results, {"build s": build}
        print(f"{env_id} {setting}: built and stepped in {build:.0f} s", flush=True)
    for setting, rate in speeds(envs, a.seconds, a.rounds).items():
        runs[setting][1]["steps/s"] = rate
    for results in [gym_results, *(r for r, _ in runs.values())]:  # every policy's states together
        results["all"] = tuple(np.concatenate([results[name][i] for name in sets]) for i in range(3))
    reference = errors(runs["exact"][0]["all"], gym_results["all"])
    fit = [
        s
        for s in grid
        if acceptable(errors(runs[s][0]["all"], gym_results["all"]), reference, a.tolerance, a.term_slack)
    ]
    chosen = min(fit, key=cost, default="exact")
    rows, exact_rate = [], runs["exact"][1]["steps/s"]
    for setting, (results, speed) in runs.items():
        pairs = [("exact", "gymnasium")] if setting == "exact" else [("fast", "exact"), ("fast", "gymnasium")]
        rate = f"{speed['steps/s']:,.0f} ({speed['steps/s'] / exact_rate:.2f}x)"
        label = "XML (100,50)" if setting == "exact" else setting + (" (chosen)" if setting == chosen else "")
        for name in [*sets, "all"]:
            found = {"exact": runs["exact"][0][name], "fast": results[name], "gymnasium": gym_results[name]}
            for x, y in pairs:
                e = errors(found[x], found[y])
                figures = [f"{e[k]:.2g}" for k in ("obs mean", "obs max", "reward mean", "reward max")]
                figures.append(f"{e['terminations agree']:.2%}")
                rows.append([env_id, label, name, f"{x} vs {y}", *figures, rate, f"{speed['build s']:.0f}"])
    return rows, chosen


def machine() -> str:
    import jax

    cpu = next((line.split(":")[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    versions = (
        f"torch {torch.__version__}, jax {jax.__version__}, mujoco {mujoco.__version__}, gymnasium {gym.__version__}"
    )
    return (
        f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, {versions}; load average at the end {load}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", nargs="+", default=["HalfCheetah-v5", "Hopper-v5"], choices=list(mjx_envs.TASKS))
    p.add_argument("--checkpoint", nargs="*", default=[], help="ENV_ID=PATH: a ppo_continuous.py checkpoint")
    p.add_argument("--states", type=int, default=1024, help="states per policy (one MJX world each)")
    p.add_argument("--stride", type=int, default=5, help="gymnasium steps between kept states")
    p.add_argument("--grid", nargs="+", default=GRID, help="iterations,ls_iterations[,noeulerdamp] to try")
    p.add_argument("--seconds", type=float, default=3.0, help="each turn of a setting's speed measurement")
    p.add_argument("--rounds", type=int, default=3, help="turns of each setting's speed measurement (the median)")
    p.add_argument("--tolerance", type=float, default=3.0, help="fast's mean errors within this times exact's")
    p.add_argument("--term-slack", type=float, default=0.005, help="share of terminations fast may agree less")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the results (markdown) here")
    a = p.parse_args()
    checkpoints = dict(item.split("=", 1) for item in a.checkpoint)
    header = ["task", "iterations,ls", "states", "compared", "obs err mean", "obs err max", "reward err mean"]
    header += ["reward err max", "terminations agree", "env steps/s (vs exact)", "build s"]
    rows, chosen = [], {}
    for env_id in a.env_id:
        policies = {"random": None} | ({"trained": load_policy(checkpoints[env_id])} if env_id in checkpoints else {})
        task_rows, chosen[env_id] = measure(env_id, a, policies)
        rows += task_rows
        print(f"{env_id}: chosen iterations,ls_iterations = {chosen[env_id]}", flush=True)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    picked = "; ".join(f"{env_id} {setting}" for env_id, setting in chosen.items())
    rule = f"cheapest whose mean errors against gymnasium are within {a.tolerance:g}x the exact setting's and whose"
    rule += f" terminations agree with gymnasium's at most {a.term_slack:.1%} of states less often"
    text = "\n".join([*lines, "", f"Chosen ({rule}): {picked}.", "", f"Machine: {machine()}.", ""])
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(f"`python {' '.join(sys.argv)}`\n\n{text}")


if __name__ == "__main__":
    main()
