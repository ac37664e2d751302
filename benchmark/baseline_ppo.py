"""Speed baseline: CleanRL's PPO as a reader knows it, standing alone (nothing imported from this project), not for
training; docs/performance.md#the-tools says what it keeps of CleanRL and what changed to run here.

    python benchmark/baseline_ppo.py --env-id ALE/Breakout-v5   # CleanRL's ppo_atari.py
    python benchmark/baseline_ppo.py --env-id HalfCheetah-v5    # CleanRL's ppo_continuous_action.py
"""

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
from PIL import Image
from torch.distributions.categorical import Categorical
from torch.distributions.normal import Normal
from torch.utils.tensorboard import SummaryWriter

try:
    from stable_baselines3.common import atari_wrappers
except ModuleNotFoundError:
    sys.exit("error: the baseline needs stable-baselines3 (CleanRL's Atari wrappers): pip install -e '.[baseline]'")

gym.register_envs(__import__("ale_py"))  # registers the ALE/<Game>-v5 ids


@dataclass
class Args:
    """Fields left unset (None) take the defaults of the CleanRL script the env id picks: ATARI or MUJOCO below."""

    env_id: str = "ALE/Breakout-v5"  # an ALE/<Game>-v5 id (ppo_atari.py) or a MuJoCo one (ppo_continuous_action.py)
    exp_name: str | None = None  # the name of this experiment
    seed: int = 1  # seed of the experiment
    cuda: bool | None = None  # use CUDA when available
    total_timesteps: int | None = None  # total agent steps
    learning_rate: float | None = None  # the learning rate of the optimizer
    num_envs: int | None = None  # the number of parallel environments
    num_steps: int | None = None  # the number of steps to run in each environment per policy rollout
    gamma: float = 0.99  # the discount factor gamma
    gae_lambda: float = 0.95  # the lambda for the general advantage estimation
    num_minibatches: int | None = None  # the number of mini-batches
    update_epochs: int | None = None  # the K epochs to update the policy
    clip_coef: float | None = None  # the surrogate clipping coefficient
    ent_coef: float | None = None  # coefficient of the entropy
    vf_coef: float = 0.5  # coefficient of the value function
    max_grad_norm: float = 0.5  # the maximum norm for the gradient clipping


# each CleanRL script's defaults, for the fields left unset (None)
ATARI = dict(exp_name="baseline_ppo_atari", cuda=True, total_timesteps=10_000_000, learning_rate=2.5e-4, num_envs=8)
ATARI |= dict(num_steps=128, num_minibatches=4, update_epochs=4, clip_coef=0.1, ent_coef=0.01)
MUJOCO = dict(exp_name="baseline_ppo_continuous", cuda=False, total_timesteps=1_000_000, learning_rate=3e-4)
MUJOCO |= dict(num_envs=1, num_steps=2048, num_minibatches=32, update_epochs=10, clip_coef=0.2, ent_coef=0.0)


def resize(obs):
    """84x84, bilinear with Pillow (CleanRL's gymnasium ResizeObservation: OpenCV's INTER_AREA)."""
    return np.asarray(Image.fromarray(obs).resize((84, 84), Image.BILINEAR))


def make_env(env_id, gamma):
    def thunk():
        if not env_id.startswith("ALE/"):
            env = gym.make(env_id)
            env = gym.wrappers.FlattenObservation(env)
            env = gym.wrappers.RecordEpisodeStatistics(env)
            env = gym.wrappers.ClipAction(env)
            env = gym.wrappers.NormalizeObservation(env)
            env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
            env = gym.wrappers.NormalizeReward(env, gamma=gamma)
            return gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        env = gym.make(env_id, frameskip=1, obs_type="grayscale")  # v5: sticky actions 0.25, minimal action set
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = atari_wrappers.NoopResetEnv(env, noop_max=30)
        env = atari_wrappers.MaxAndSkipEnv(env, skip=4)
        env = atari_wrappers.EpisodicLifeEnv(env)
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = atari_wrappers.FireResetEnv(env)
        env = atari_wrappers.ClipRewardEnv(env)
        env = gym.wrappers.TransformObservation(env, resize, gym.spaces.Box(0, 255, (84, 84), np.uint8))
        return gym.wrappers.FrameStackObservation(env, 4)

    return thunk


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(inputs, outputs, std):
    return nn.Sequential(
        layer_init(nn.Linear(inputs, 64)),
        nn.Tanh(),
        layer_init(nn.Linear(64, 64)),
        nn.Tanh(),
        layer_init(nn.Linear(64, outputs), std=std),
    )


class Agent(nn.Module):
    """Atari: the Nature ConvNet with a policy (Categorical) and a value head. MuJoCo: 64-64 tanh MLPs for the
    action's mean and the value, and a learned log std (Normal)."""

    def __init__(self, envs, atari):
        super().__init__()
        self.atari = atari
        if atari:
            self.network = nn.Sequential(
                layer_init(nn.Conv2d(4, 32, 8, stride=4)),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
                layer_init(nn.Linear(64 * 7 * 7, 512)),
                nn.ReLU(),
            )
            self.actor = layer_init(nn.Linear(512, envs.single_action_space.n), std=0.01)
            self.critic = layer_init(nn.Linear(512, 1), std=1)
        else:
            obs_dim, act_dim = np.prod(envs.single_observation_space.shape), np.prod(envs.single_action_space.shape)
            self.network = nn.Identity()
            self.actor = mlp(obs_dim, act_dim, 0.01)
            self.critic = mlp(obs_dim, 1, 1.0)
            self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def get_value(self, x):
        return self.critic(self.network(x / 255.0 if self.atari else x))

    def get_action_and_value(self, x, action=None):
        hidden = self.network(x / 255.0 if self.atari else x)
        if self.atari:
            probs = Categorical(logits=self.actor(hidden))
        else:
            action_mean = self.actor(hidden)
            probs = Normal(action_mean, self.actor_logstd.expand_as(action_mean).exp())
        if action is None:
            action = probs.sample()
        logprob, entropy = probs.log_prob(action), probs.entropy()
        if not self.atari:  # one Normal per action dimension
            logprob, entropy = logprob.sum(1), entropy.sum(1)
        return action, logprob, entropy, self.critic(hidden)


if __name__ == "__main__":
    args = tyro.cli(Args)
    if args.env_id not in gym.envs.registry:  # before anything is written
        print(f"error: unknown env id {args.env_id!r}; use an ALE/<Game>-v5 id or a MuJoCo one", file=sys.stderr)
        sys.exit(2)
    atari = args.env_id.startswith("ALE/")
    for name, value in (ATARI if atari else MUJOCO).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
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
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, args.gamma)] * args.num_envs, autoreset_mode=autoreset)
    agent = Agent(envs, atari).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    global_step = 0
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs, next_done = torch.Tensor(next_obs).to(device), torch.zeros(args.num_envs).to(device)
    for iteration in range(1, args.num_iterations + 1):
        iteration_start = time.time()
        optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step], logprobs[step] = action, logprob
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)
            final = infos.get("final_info", {})  # SameStep autoreset: the ended episode's info
            for i in np.flatnonzero(final.get("_episode", [])):
                writer.add_scalar("charts/episodic_return", final["episode"]["r"][i], global_step)
                writer.add_scalar("charts/episodic_length", final["episode"]["l"][i], global_step)

        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
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
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape)
        b_actions = b_actions.long() if atari else b_actions
        b_logprobs, b_advantages, b_returns, b_values = (x.reshape(-1) for x in (logprobs, advantages, returns, values))
        b_inds = np.arange(args.batch_size)
        for _epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                newvalue = newvalue.view(-1)
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
        if iteration > 1:  # the first iteration is warm-up
            writer.add_scalar("charts/SPS", sps, global_step)
        print(f"iteration {iteration} global_step={global_step} SPS={sps:.0f}")
    envs.close()
    writer.close()
