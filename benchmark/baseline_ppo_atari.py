"""Speed baseline: a straightforward single-file PPO on Atari in the style of CleanRL's ppo_atari.py.

gymnasium SyncVectorEnv over gym.make ALE v5 envs (Python loop over envs), float32 rollout storage, per-step host
copies of observations, rewards and dones, Categorical sampling. The same network, losses and hyperparameters as
ppo_atari.py; the frame preprocessing comes from ppo_atari.make_gym_env (v5 semantics, no OpenCV), plus the usual
episodic-life and reward-clipping wrappers. Used only by bench_ppo_atari.py; not a training script to rely on.
"""

import os
import random
import sys
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ppo_atari import Agent, make_gym_env  # noqa: E402


@dataclass
class Args:
    exp_name: str = "baseline_ppo_atari"
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    cuda: bool = True
    """use CUDA when available"""
    env_id: str = "ALE/Breakout-v5"
    """the id of the environment"""
    total_timesteps: int = 10_000_000
    """total agent steps"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""


class EpisodicLifeEnv(gym.Wrapper):
    """Lost life = terminal for learning; the game is only reset when it is really over (SB3 semantics)."""

    def __init__(self, env):
        super().__init__(env)
        self.lives, self.was_real_done = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.was_real_done = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.was_real_done:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, _, _, info = self.env.step(0)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


def make_env(env_id):
    def thunk():
        env = gym.wrappers.RecordEpisodeStatistics(make_gym_env(env_id))
        return gym.wrappers.ClipReward(EpisodicLifeEnv(env), -1, 1)

    return thunk


if __name__ == "__main__":
    args = tyro.cli(Args)
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    run_name = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    writer = SummaryWriter(f"runs/{run_name}")
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    autoreset = gym.vector.AutoresetMode.SAME_STEP  # as gymnasium < 1.0, which CleanRL was written for
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id) for _ in range(args.num_envs)], autoreset_mode=autoreset)
    agent = Agent(envs.single_action_space.n).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs)).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    global_step, start_time = 0, time.time()
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs, next_done = torch.Tensor(next_obs).to(device), torch.zeros(args.num_envs).to(device)
    for iteration in range(1, args.num_iterations + 1):
        iteration_start = time.time()
        optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                logits, value = agent(next_obs)
                probs = Categorical(logits=logits)
                action = probs.sample()
                values[step] = value.flatten()
            actions[step], logprobs[step] = action, probs.log_prob(action)
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)
            final = infos.get("final_info", {})  # SameStep autoreset: the ended episode's info
            for i in np.flatnonzero(final.get("_episode", [])):
                writer.add_scalar("charts/episodic_return", final["episode"]["r"][i], global_step)
                writer.add_scalar("charts/episodic_length", final["episode"]["l"][i], global_step)

        with torch.no_grad():
            next_value = agent(next_obs)[1].reshape(1, -1)
            advantages = torch.zeros_like(rewards).to(device)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal, nextvalues = 1.0 - next_done, next_value
                else:
                    nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs, b_actions = logprobs.reshape(-1), actions.reshape(-1)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        b_inds = np.arange(args.batch_size)
        for _epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]
                logits, newvalue = agent(b_obs[mb_inds])
                probs = Categorical(logits=logits)
                newlogprob, entropy = probs.log_prob(b_actions.long()[mb_inds]), probs.entropy()
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - logratio).mean()
                mb_advantages = b_advantages[mb_inds]
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()
                v_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                v_clipped = b_values[mb_inds] + torch.clamp(
                    newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef
                )
                v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_returns[mb_inds]) ** 2).mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
        writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
        writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
        sps = args.batch_size / (time.time() - iteration_start)
        if iteration > 1:
            writer.add_scalar("charts/SPS", sps, global_step)
        print(f"iteration {iteration} global_step={global_step} SPS={sps:.0f}")
    envs.close()
    writer.close()
