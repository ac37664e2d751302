"""A ppo_continuous.py checkpoint's return split into its env's reward terms (issue #65).

Gymnasium's MuJoCo v5 envs report each term of their reward in the step's info (reward_forward, reward_ctrl,
reward_survive, reward_contact, ...). This plays --episodes episodes of a checkpoint's policy with sampled actions,
as the training episodes that CleanRL's protocol scores were played (--mean-actions: the evaluation's), and prints
the mean per episode of the return and of each term: what a term the v4 env did not have (Humanoid-v5's contact
cost) takes from a score set against a v4 figure.

    python benchmark/reward_terms.py runs/Humanoid-v5__ppo_continuous__1__<time>/checkpoint.pt --episodes 20
"""

from __future__ import annotations

import argparse
import os
import sys

import gymnasium as gym
import numpy as np
import torch
from sweep import Parser, SweepError, count, one_line_errors  # one-line errors; puts the root on sys.path

import continuous_envs  # noqa: E402
import run_utils  # noqa: E402
from ppo_continuous import Agent, hidden_sizes  # noqa: E402  (the script's network)


@torch.no_grad()
def play(ckpt: dict, path: str, env_id: str, episodes: int, seed: int, mean_actions: bool) -> list[dict[str, float]]:
    """Per episode: its return, its length and the sum of each info["reward_*"] term. Episode i resets with seed + i;
    the sampled actions' noise comes from torch's generator, seeded with seed."""
    env = gym.make(env_id)
    space = env.action_space
    agent = Agent(env.observation_space.shape[0], space.shape[0], hidden_sizes(ckpt["args"]["network_arch"]))
    run_utils.load_states({"model": agent}, ckpt, path)
    obs_rms = continuous_envs.RunningMeanStd(state=ckpt["obs_rms"])
    torch.manual_seed(seed)
    played = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        sums, done = {"return": 0.0, "length": 0.0}, False
        while not done:
            policy = agent.policy(torch.as_tensor(obs_rms.normalize(obs[None], False), dtype=torch.float32))
            actions = policy.mean if mean_actions else policy.sample(torch.randn_like(policy.mean))
            obs, reward, terminated, truncated, info = env.step(np.clip(actions[0].numpy(), space.low, space.high))
            sums["return"] += float(reward)
            sums["length"] += 1
            for term, value in info.items():
                if term.startswith("reward_"):
                    sums[term] = sums.get(term, 0.0) + float(value)
            done = terminated or truncated
        played.append(sums)
    env.close()
    return played


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a ppo_continuous.py checkpoint.pt (or --save-model file)")
    p.add_argument("--env-id", help="the env to play (default: the checkpoint's)")
    p.add_argument("--episodes", type=count(1), default=20, help="episodes to play (default 20)")
    p.add_argument("--seed", type=int, default=1, help="episode i resets with seed + i; the actions' noise (default 1)")
    p.add_argument("--mean-actions", action="store_true", help="play the policy's mean actions, not sampled ones")
    a = p.parse_args(argv)
    try:
        ckpt = run_utils.load_checkpoint(a.checkpoint, "ppo_continuous")
    except (OSError, run_utils.CheckpointError) as exc:
        raise SweepError(f"{exc}") from None
    env_id = a.env_id or ckpt["args"]["env_id"]
    torch.set_num_threads(1)  # a 64x64 network, one env: threads only wait on each other
    try:
        played = play(ckpt, a.checkpoint, env_id, a.episodes, a.seed, a.mean_actions)
    except gym.error.Error as exc:
        raise SweepError(f"--env-id: cannot make {env_id!r} ({exc}); pass a gymnasium env id") from None
    actions = "mean" if a.mean_actions else "sampled"
    print(
        f"{os.path.basename(os.path.dirname(os.path.abspath(a.checkpoint)))} on {env_id}: {a.episodes} episodes, "
        f"{actions} actions, seed {a.seed}"
    )
    print("| per episode | mean | std |\n|---|---|---|")
    for term in played[0]:
        values = np.array([episode.get(term, 0.0) for episode in played])
        print(f"| {term} | {values.mean():,.2f} | {values.std(ddof=1) if len(values) > 1 else 0.0:,.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
