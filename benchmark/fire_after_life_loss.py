"""Issue #54, item 3: how often an evaluation game of a trained ppo_atari.py model stalls after a lost life.

ppo_atari.py presses FIRE only at a reset (ale-py's use_fire_reset); CleanRL's wrappers press it after every lost
life as well. In Breakout the ball comes back only on FIRE, so a policy that does not press it after a lost life
plays on without a reward until it does, or until the frame cap. This plays one full game in each of --games envs
with the run's ALE v5 settings and sampled actions, as ppo_atari.py's evaluation does, and counts per game the lost
lives, the agent steps from each lost life to the policy's first FIRE and to the next reward, the stretches without
a reward longer than --stall agent steps, and the games cut at the frame cap. docs/ppo_atari.md has the figures.

    python benchmark/fire_after_life_loss.py --games 16 --seed 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import gymnasium as gym
import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from ppo_atari import Agent, make_envs  # noqa: E402  (the script's network and its ALE v5 envs)

MODEL = "benchmark/results/atari_gpu/runs/ALE_Breakout-v5__ppo_atari__1__1795425019/ppo_atari.model"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(ROOT, MODEL), help="a ppo_atari.py model (--save-model)")
    p.add_argument("--env-id", default="ALE/Breakout-v5")
    p.add_argument("--games", type=int, default=16, help="envs, each playing one full game")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--stall", type=int, default=1000, help="agent steps without a reward that count as a stall")
    p.add_argument("--max-frames", type=int, default=108_000, help="the frame cap (ppo_atari.py's default)")
    a = p.parse_args()
    if not os.path.isfile(a.model):
        sys.exit(f"error: no model file {a.model}; pass --model")
    with gym.make(a.env_id) as one:
        meanings = one.unwrapped.get_action_meanings()
    fire = meanings.index("FIRE") if "FIRE" in meanings else None
    agent = Agent(len(meanings))
    agent.load_state_dict(torch.load(a.model, map_location="cpu", weights_only=True)["model"])
    agent.eval()
    torch.set_num_threads(1)  # a small network: the env threads take the other core
    torch.manual_seed(a.seed)
    envs = make_envs(a.env_id, a.games, 2, a.max_frames)
    obs, info = envs.reset(seed=a.seed)
    n = a.games
    lives = np.array(info["lives"])
    done = np.zeros(n, dtype=bool)  # this env's first game is over: its later games are not counted
    score, length, lost, capped = np.zeros(n), np.zeros(n, dtype=int), np.zeros(n, dtype=int), np.zeros(n, dtype=bool)
    since_loss = np.full(n, -1)  # agent steps since the last lost life, -1 while a reward came after it
    since_reward = np.zeros(n, dtype=int)
    to_fire, to_reward, stalls = [], [], np.zeros(n, dtype=int)
    fired = np.ones(n, dtype=bool)  # the policy chose FIRE since the last lost life
    longest = np.zeros(n, dtype=int)  # the longest stretch without a reward, in agent steps
    started = time.time()
    with torch.inference_mode():
        while not done.all():
            logits, _ = agent(torch.as_tensor(obs))
            action = torch.distributions.Categorical(logits=logits).sample().numpy()
            obs, reward, terminated, truncated, info = envs.step(action)
            live = ~done
            game_over = terminated | truncated
            length += live
            score += np.where(live, reward, 0.0)
            since_loss = np.where(live & (since_loss >= 0), since_loss + 1, since_loss)
            first_fire = live & ~fired & (action == fire) if fire is not None else np.zeros(n, dtype=bool)
            to_fire += since_loss[first_fire].tolist()
            fired |= first_fire
            rewarded = live & (reward != 0)
            after_loss = rewarded & (since_loss >= 0)
            to_reward += since_loss[after_loss].tolist()
            since_loss = np.where(after_loss, -1, since_loss)
            since_reward = np.where(rewarded, 0, since_reward + live)
            stalls += live & (since_reward == a.stall + 1)  # counted once per stretch, when it passes --stall
            longest = np.maximum(longest, np.where(live, since_reward, 0))
            life_lost = live & (info["lives"] < lives) & ~game_over
            lost += life_lost
            since_loss = np.where(life_lost, 0, since_loss)
            fired &= ~life_lost
            lives = np.array(info["lives"])
            capped |= live & truncated
            done |= live & game_over
    minutes = (time.time() - started) / 60
    print(
        f"| game | score | agent steps | lives lost | longest stretch without a reward | stalls > {a.stall} | capped |"
    )
    print("|---|---|---|---|---|---|---|")
    for i in range(n):
        print(f"| {i} | {score[i]:.0f} | {length[i]:,} | {lost[i]} | {longest[i]:,} | {stalls[i]} | {capped[i]} |")
    print(f"\n{n} games, seed {a.seed}, {minutes:.1f} min: score {score.mean():.1f} +- {score.std(ddof=1):.1f}")
    print(
        f"lost lives {lost.sum()}; games with a stall > {a.stall} steps: {(stalls > 0).sum()}; capped: {capped.sum()}"
    )
    if to_fire:
        fire_steps = f"median {np.median(to_fire):.0f}, max {max(to_fire)}"
        print(f"agent steps from a lost life to the policy's first FIRE: {fire_steps}")
    if to_reward:
        reward_steps = f"median {np.median(to_reward):.0f}, max {max(to_reward)}"
        print(f"agent steps from a lost life to the next reward: {reward_steps}")
    unanswered = since_loss[since_loss >= 0]  # lost lives that no reward followed before the game ended
    long_waits = sum(t > a.stall for t in to_reward) + (unanswered > a.stall).sum()
    print(f"lost lives followed by more than {a.stall} agent steps without a reward: {long_waits}")
    print(f"lost lives never followed by a reward in their game: {len(unanswered)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
