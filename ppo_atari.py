# PPO with the Nature DQN ConvNet on ALE v5 Atari games, CleanRL style, built to keep one GPU (or a CPU) busy.
# Usage: python ppo_atari.py --env-id ALE/Breakout-v5 --gae-lambda 0.7      (torchrun --nproc-per-node N for N GPUs)
import collections
import os
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.distributions import Categorical

import gpu_utils
import run_utils
from atari_envs import EpisodeTracker, agent_view, make_envs


@dataclass
class Args(run_utils.RunArgs):  # RunArgs: the flags of how and where it runs (--gpu, --resume, --cudagraphs, ...)
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (runs/<env>__<exp_name>__<seed>__<unix time>)"""
    seed: int = 1
    """seed of the experiment, 0 to 2**30 - 1 (process rank r under torchrun uses seed + r for sampling)"""
    torch_deterministic: bool = True
    """deterministic cuDNN algorithms (and no cuDNN benchmark mode)"""

    # Algorithm specific arguments
    env_id: str = "ALE/Breakout-v5"
    """any ALE/<Game>-v5 id"""
    env_threads: int = 0
    """threads stepping the ale envs (0: the run's CPU threads, at most one per env), split between the halves"""
    overlap_envs: bool = True
    """step the envs in two halves, so that one half's envs play while the policy acts on the other half's"""
    async_envs: int = 0
    """asynchronous envs: the policy acts on the first N envs to finish a step while the others play, and each env
    fills its own num_steps rows of the rollout (0: off; 1 <= N < num_envs; --overlap-envs then has no effect)"""
    max_episode_frames: int = 108_000
    """emulator frames after which a game is cut short (truncated, not over); v5's 108,000 is 30 minutes"""
    channels_last: bool = True
    """keep conv weights and stored observations channels-last (NHWC), which oneDNN (CPU) and cuDNN run faster"""
    total_timesteps: int = 10_000_000
    """total agent steps over all envs and processes; one agent step is 4 emulator frames (frameskip 4)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 16
    """the number of parallel game environments (per process under torchrun)"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """linearly anneal the learning rate to 0 over the run"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation, in [0, 1]"""
    minibatch_size: int = 256
    """rows per minibatch (must divide num_envs * num_steps); ignored when --num-minibatches is set"""
    num_minibatches: int | None = None
    """the number of minibatches (CleanRL style); overrides --minibatch-size"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """normalize advantages per minibatch"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """use a clipped loss for the value function"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """stop the update epochs of an iteration once the approximate KL exceeds this"""


# flags that --resume takes from the command line; every other Args field comes from the checkpoint
RUNTIME_FLAGS = run_utils.RUN_FLAGS | {"env_threads", "channels_last", "overlap_envs"}


def validate(args: Args, world_size: int) -> None:
    """Raise ValueError with the one-line message of the first setting that cannot work; for training, fill in the
    minibatch size and count per process (--num-minibatches, when given, wins: CleanRL's way to size them)."""
    hint = "import ale_py, gymnasium as g; print([e for e in g.envs.registry if e.startswith('ALE/')])"
    sizes = [args.num_envs, args.num_steps, args.update_epochs, args.max_episode_frames]
    run_utils.check(
        {
            f'unknown env id {args.env_id!r}, not ALE/<Game>-v5; list valid ids: python -c "{hint}"': (
                args.env_id in gym.envs.registry and args.env_id[:4] == "ALE/" and args.env_id[-3:] == "-v5"
            ),
            f"--seed must be from 0 to 2**30 - 1, got {args.seed}": 0 <= args.seed < 2**30,
            f"--env-threads must be at least 0 (0: the run's CPU threads), got {args.env_threads}": (
                args.env_threads >= 0
            ),
            "--num-envs, --num-steps, --update-epochs and --max-episode-frames must be at least 1": min(sizes) >= 1,
            f"--async-envs {args.async_envs}: 0 (off), or a batch from 1 to --num-envs - 1 ({args.num_envs - 1})": (
                args.async_envs == 0 or 1 <= args.async_envs < args.num_envs
            ),
        }
    )
    batch_size = args.num_envs * args.num_steps  # per process
    if not args.eval_checkpoint:  # an evaluation plays --eval-episodes games: it has no batch (a BatchSizeError)
        args.minibatch_size = gpu_utils.choose_batch_size(batch_size, args.minibatch_size, parts=args.num_minibatches)
        args.num_minibatches = batch_size // args.minibatch_size
    one_batch = f"--total-timesteps must be at least one batch ({batch_size * world_size} agent steps)"
    enough = args.total_timesteps >= batch_size * world_size or bool(args.eval_checkpoint)
    run_utils.check(run_utils.shared_checks(args) | {one_batch: enough})


# ---------------------------------------------------------------- environment
class Rollout:
    """The envs in two halves (one group without --overlap-envs) that take turns: the policy acts on one half's
    observations while the other half's envs play (C++ threads). ``collect`` fills the (num_steps, num_envs) rollout
    step by step; ``games`` holds the (score, length) of the games that ended in it."""

    def __init__(self, env_groups, env_rows, seed: int, storage, pin: bool):
        self.envs = env_groups
        self.rows = env_rows
        # device: obs, actions, logprobs, values (T, N) and next_obs (N); host: rewards (T, N) and dones (T + 1, N)
        self.obs, self.actions, self.logprobs, self.values, self.next_obs, self.rewards, self.dones = storage
        self.num_steps = self.rewards.shape[0]
        # observations staged in pinned memory: one copy to the device per group and step
        self.host_obs = torch.empty(self.next_obs.shape, dtype=torch.uint8, pin_memory=pin)
        self.host_obs_np = self.host_obs.numpy()
        self.trackers = []
        for rows, envs in zip(env_rows, env_groups):  # env i gets seed + i
            self.host_obs_np[rows], info = envs.reset(seed=seed + rows.start)
            self.trackers.append(EpisodeTracker(rows.stop - rows.start, info["lives"]))
        self.next_obs.copy_(self.host_obs, non_blocking=True)
        self.games = []

    def collect(self, act, bootstrap, recorder=None) -> list[str]:
        """Play num_steps steps of every env; returns the paths of the videos written. act(device obs) -> (actions,
        log-probs, values); bootstrap(final_obs, truncated, terminated) -> gamma * V(final obs) where the frame cap
        cut a game short, else 0."""
        self.dones[0] = self.dones[self.num_steps]  # whether the first observation starts an episode
        playing = collections.deque()  # (step, group) of the actions the envs are playing
        videos = []
        self.games = []  # (score over all lives, length) of each game that ends, in the order of (step, env)
        for step in range(self.num_steps):
            for group, rows in enumerate(self.rows):
                self.obs[step, rows] = self.next_obs[rows]
                self.actions[step, rows], self.logprobs[step, rows], self.values[step, rows] = act(self.next_obs[rows])
                # .cpu() waits for this group's copy to the device too, so its host_obs rows are free to overwrite
                self.envs[group].send(self.actions[step, rows].cpu().numpy())
                playing.append((step, group))
                if len(playing) == len(self.rows):  # the other group's envs keep playing meanwhile
                    videos += self.receive(*playing.popleft(), bootstrap, recorder)
        while playing:
            videos += self.receive(*playing.popleft(), bootstrap, recorder)
        return [video for video in videos if video]

    def receive(self, step, group, bootstrap, recorder) -> list[str | None]:
        """The envs of ``group`` finish the step they were sent: store its results in row ``step``."""
        rows = self.rows[group]
        self.host_obs_np[rows], reward, terminated, truncated, info = self.envs[group].recv()
        self.next_obs[rows].copy_(self.host_obs[rows], non_blocking=True)
        clipped, learn_done, over, scores, lengths = self.trackers[group].step(
            reward, terminated, truncated, info["lives"]
        )
        self.rewards[step, rows] = clipped
        self.dones[step + 1, rows] = learn_done
        self.games += zip(scores[over].tolist(), lengths[over].tolist())  # received in (step, group) order
        if truncated.any():  # a game cut short by the frame cap: its reward bootstraps from V(last obs)
            self.rewards[step, rows] += bootstrap(info["final_obs"], truncated, terminated)
        if recorder is None or group != 0:
            return []
        frame = info["final_obs"][0] if over[0] else self.host_obs_np[0]  # a game's last frame, not the next's first
        return [recorder.add(agent_view(frame), bool(over[0]))]


class AsyncRollout:
    """--async-envs: one vector env of N envs whose recv() hands back the first B to finish a step (make_envs with
    batch_size B), so the policy acts on those B while the other N - B play. Each env fills its own column of the
    (num_steps, N) rollout in the order it played, with its done flags, so compute_gae runs on it unchanged. ale-py's
    send() acts on exactly the envs of the last recv(), so N - B envs always play: the steps of full columns and
    those acted on by the previous policy are played but not stored (``discarded``: their share). Why, and what it
    costs: docs/ppo_atari.md#asynchronous-envs. ``games``: (score, length) of the games that ended, stored or not.
    """

    def __init__(self, envs, seed: int, storage):
        self.envs = envs
        # device: obs, actions, logprobs, values (T, N) and next_obs (N); host: rewards (T, N) and dones (T + 1, N)
        self.obs, self.actions, self.logprobs, self.values, self.next_obs, self.rewards, self.dones = storage
        self.num_steps = self.rewards.shape[0]
        num_envs = envs.num_envs
        self.held_obs, info = envs.reset(seed=seed)  # env i gets seed + i; the first B resets come back here
        self.held_ids = info["env_id"]
        self.tracker = EpisodeTracker(num_envs, np.zeros(num_envs, dtype=info["lives"].dtype))
        self.tracker.lives[self.held_ids] = info["lives"]  # the others' lives come with their resets from recv()
        self.playing = np.zeros(num_envs, dtype=bool)  # an action is in flight
        self.storing = np.zeros(num_envs, dtype=bool)  # and its step goes to row count[e] of the rollout
        self.count = np.zeros(num_envs, dtype=np.int64)  # steps stored this rollout
        self.obs_done = np.zeros(num_envs, dtype=np.float32)  # the latest observation starts a new episode
        self.games = []
        self.discarded = 0.0

    def collect(self, act, bootstrap, recorder=None) -> list[str]:
        """Play until every env has stored num_steps steps; returns the paths of the videos written. act(device obs)
        -> (actions, log-probs, values); bootstrap(final_obs, truncated, terminated) -> gamma * V(final obs) where the
        frame cap cut a game short, else 0."""
        device = self.obs.device
        self.count[:] = 0  # the steps still in flight were sent when their envs' columns were full: none is stored
        self.games = []
        videos = []
        played = 0
        while True:
            ids = self.held_ids
            x = torch.as_tensor(self.held_obs).to(device)
            action, logprob, value = act(x)
            self.envs.send(action.cpu().numpy())
            self.playing[ids] = True
            self.storing[ids] = self.count[ids] < self.num_steps
            keep = np.flatnonzero(self.storing[ids])
            env = ids[keep]
            row = self.count[env]
            first = env[row == 0]
            self.dones[0, first] = self.obs_done[first]  # whether an env's first stored observation starts an episode
            at_row, at_env, pick = torch.as_tensor(np.stack([row, env, keep])).to(device)  # one copy to the device
            for storage, new in zip((self.obs, self.actions, self.logprobs, self.values), (x, action, logprob, value)):
                storage[at_row, at_env] = new[pick]
            obs, reward, terminated, truncated, info = self.envs.recv()
            ids = info["env_id"]
            self.held_obs, self.held_ids = obs, ids
            fresh = ~self.playing[ids]  # a reset's first observation, not a step
            self.tracker.lives[ids[fresh]] = info["lives"][fresh]
            done = np.flatnonzero(~fresh)
            env = ids[done]
            self.playing[env] = False
            played += len(done)
            clipped, learn_done, over, scores, lengths = self.tracker.step(
                reward[done], terminated[done], truncated[done], info["lives"][done], rows=env
            )
            self.obs_done[env] = learn_done
            self.games += zip(scores[over].tolist(), lengths[over].tolist())
            if recorder is not None and (env == 0).any():
                k = int(np.argmax(env == 0))
                frame = info["final_obs"][done[k]] if over[k] else obs[done[k]]  # a game's last frame, not the next's
                videos.append(recorder.add(agent_view(frame), bool(over[k])))
            stored = np.flatnonzero(self.storing[env])
            env, pos = env[stored], done[stored]
            row = self.count[env]
            self.rewards[row, env] = clipped[stored]
            if truncated[pos].any():  # a game cut short by the frame cap: its reward bootstraps from V(last obs)
                self.rewards[row, env] += bootstrap(info["final_obs"][pos], truncated[pos], terminated[pos])
            self.dones[row + 1, env] = learn_done[stored]
            self.count[env] += 1
            self.storing[env] = False
            full = self.count[env] == self.num_steps
            if full.any():  # the observation after the env's last stored step: GAE bootstraps from its value
                self.next_obs[torch.as_tensor(env[full], device=device)] = torch.as_tensor(obs[pos[full]]).to(device)
            if (self.count == self.num_steps).all():
                break
        self.discarded = 1.0 - self.count.sum() / max(played, 1)
        return [video for video in videos if video]


# ---------------------------------------------------------------- network
def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, num_actions: int, amp: bool = False):
        super().__init__()
        self.amp = amp  # bf16 for the convolutional trunk only: heads, log-probs and values stay fp32
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
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def forward(self, x):
        """uint8 observations (B, 4, 84, 84) -> (logits, value); the scaling to [0, 1] happens here."""
        with torch.autocast(x.device.type, torch.bfloat16, enabled=self.amp):
            hidden = self.network(x.float() / 255.0)
        hidden = hidden.float()
        return self.actor(hidden), self.critic(hidden).squeeze(-1)


# ---------------------------------------------------------------- algorithm
def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """GAE over a (T, N) rollout; dones[t] = 1 when obs[t] starts a new episode. Returns (advantages, returns)."""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    deltas = rewards + gamma * torch.cat([values[1:], next_value[None]]) * nextnonterminal - values
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        advantages[t] = lastgaelam = deltas[t] + gamma * gae_lambda * nextnonterminal[t] * lastgaelam
    return advantages, advantages + values


def ppo_loss(agent, obs, actions, logprobs, advantages, returns, values, clip_coef, ent_coef, vf_coef, clip_vloss):
    """Clipped PPO loss over a (micro-)batch whose advantages are already normalised. Returns (loss, statistics by
    name), each a mean over the rows."""
    logits, newvalue = agent(obs)
    logp_all = torch.log_softmax(logits, -1)
    entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    logratio = logp_all.gather(-1, actions[:, None]).squeeze(-1) - logprobs
    ratio = logratio.exp()
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    if clip_vloss:
        v_clipped = values + torch.clamp(newvalue - values, -clip_coef, clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    with torch.no_grad():
        stats = {
            "value_loss": v_loss.detach(),
            "policy_loss": pg_loss.detach(),
            "entropy": entropy.detach(),
            "old_approx_kl": (-logratio).mean(),
            "approx_kl": ((ratio - 1) - logratio).mean(),
            "clipfrac": ((ratio - 1.0).abs() > clip_coef).float().mean(),
            "ratio_mse": ((ratio - 1) ** 2).mean(),  # the first minibatch's must be 0: the rollout and the loss agree
        }
    return pg_loss - ent_coef * entropy + v_loss * vf_coef, stats


@torch.no_grad()
def final_values(agent, final_obs, truncated, terminated, device) -> np.ndarray:
    """V(last observation) of each game that the frame cap cut short (0 elsewhere): its reward bootstraps from it."""
    cut = np.flatnonzero(np.logical_and(truncated, np.logical_not(terminated)))
    values = np.zeros(len(truncated), dtype=np.float32)
    if len(cut):
        values[cut] = agent(torch.as_tensor(np.asarray(final_obs)[cut], device=device))[1].cpu().numpy()
    return values


# ---------------------------------------------------------------- checkpoint and evaluation
def load_checkpoint(path: str, training: bool = False) -> dict:
    """A checkpoint.pt or .model file this script wrote (run_utils.load_checkpoint; older files of another script
    have no ALE/<Game>-v5 env id)."""
    return run_utils.load_checkpoint(
        path, "ppo_atari", lambda args: str(args.get("env_id")).startswith("ALE/"), training
    )


@torch.no_grad()
def evaluate(envs, act, device, seed: int) -> np.ndarray:
    """Play one full game in every env and return each env's first score. Averaging games in the order they finish
    would favour short games (an env can finish two short games before a long one ends elsewhere)."""
    obs, info = envs.reset(seed=seed)
    tracker = EpisodeTracker(envs.num_envs, info["lives"])
    first_scores = np.full(envs.num_envs, np.nan)
    while np.isnan(first_scores).any():
        obs, reward, terminated, truncated, info = envs.step(act(torch.as_tensor(obs, device=device)).cpu().numpy())
        _, _, game_over, scores, _ = tracker.step(reward, terminated, truncated, info["lives"])
        first_scores = np.where(game_over & np.isnan(first_scores), scores, first_scores)
    return first_scores


if __name__ == "__main__":
    # ---------------- arguments and their checks
    run_utils.stop_in_one_line()  # until the run starts
    args = tyro.cli(Args)
    given = dict(vars(args))  # as typed, before the checks fill in the minibatch fields
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    distributed = world_size > 1
    is_main = rank == 0
    with run_utils.one_line_errors():
        ckpt = load_checkpoint(args.resume, training=True) if args.resume else None
        if ckpt:
            run_utils.resume_args(args, ckpt, RUNTIME_FLAGS)
            if len(ckpt["rng"]) != world_size:
                raise ValueError(f"the checkpoint is from {len(ckpt['rng'])} processes; resume with as many")
        eval_ckpt = load_checkpoint(args.eval_checkpoint) if args.eval_checkpoint else None
        args.env_id = eval_ckpt["args"]["env_id"] if eval_ckpt else args.env_id
        validate(args, world_size)
        batch_size = args.num_envs * args.num_steps  # per process
        micro = gpu_utils.MicroBatch(gpu_utils.parse_micro_batch(args.micro_batch, args.minibatch_size))
        device, device_why = run_utils.select_device(args)
        threads = gpu_utils.thread_budget(args.num_threads)
    args.batch_size = batch_size * world_size
    args.num_iterations = args.total_timesteps // args.batch_size
    run_utils.exit_if_done(ckpt, args.num_iterations, args.resume, is_main)

    # ---------------- device, threads, seeds
    tf32 = gpu_utils.enable_tf32(args.tf32, args.torch_deterministic)
    gpu_utils.limit_threads(threads.threads)
    cpu_share = gpu_utils.CpuShare(threads)  # registers this run among the live ones and takes its share of the CPUs
    env_threads = min(args.env_threads or cpu_share.threads, args.num_envs)  # shared by the two halves of the envs
    if distributed:
        cuda = device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    run_name = ckpt["run_name"] if ckpt else run_utils.new_run_name(args.env_id, args)
    run_utils.seed(args.seed, offset=rank)  # the same model in every process; the rest differs by rank
    if eval_ckpt:
        envs = make_envs(args, args.eval_episodes, threads.threads)
        agent = Agent(envs.single_action_space.n, args.amp).to(device)
        run_utils.load_states({"model": agent}, eval_ckpt, args.eval_checkpoint)
        scores = evaluate(envs, lambda x: Categorical(logits=agent(x)[0]).sample(), device, args.seed)
        run_utils.end_evaluation(args.env_id, scores)
    # two halves of the envs take turns: one half's envs play (C++ threads) while the policy acts on the other half's
    num_groups = 2 if args.overlap_envs and args.num_envs >= 2 and not args.async_envs else 1
    bounds = [g * args.num_envs // num_groups for g in range(num_groups + 1)]
    env_rows = [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]
    if is_main:
        processes = f"; {world_size} processes" if distributed else ""
        halves = "two halves that overlap with the policy's work" if num_groups == 2 else "one group"
        if args.async_envs:
            halves = f"one group; the policy acts on the first {args.async_envs} to finish (--overlap-envs: no effect)"
        stepping = f"{env_threads} stepping the {args.num_envs} envs in {halves}"
        run_utils.print_device(device, device_why + processes, tf32, args.amp, cpu_share, stepping)
        run_utils.print_config(args, given, ckpt is not None, RUNTIME_FLAGS, {}, "config:")

    # ---------------- logging
    start_step = ckpt["global_step"] if ckpt else 0
    total_steps = args.num_iterations * args.batch_size
    with run_utils.one_line_errors():  # another process may be training in this run folder
        run = run_utils.Run(args, "ppo_atari", run_name, ckpt, device, cpu_share, total_steps, start_step, is_main, 10)

    # ---------------- env and network
    group_threads = max(1, env_threads // num_groups)
    env_groups = [make_envs(args, rows.stop - rows.start, group_threads, args.async_envs) for rows in env_rows]
    memory_format = torch.channels_last if args.channels_last else torch.preserve_format
    agent = Agent(env_groups[0].single_action_space.n, args.amp).to(device, memory_format=memory_format)
    params = list(agent.parameters())
    learning_rate = gpu_utils.learning_rate_tensor(args.learning_rate, device)  # annealed in place
    use_graph = args.cudagraphs and not distributed and micro.rows >= args.minibatch_size
    optimizer = optim.Adam(params, lr=learning_rate, eps=1e-5, fused=True, capturable=use_graph)
    torch.manual_seed(args.seed + rank)
    start_iteration = ckpt["iteration"] + 1 if ckpt else 1
    global_step = start_step
    if ckpt:
        states = {"model": agent, "optimizer": optimizer}
        run_utils.resume_states(states, ckpt, args.resume, device, args.num_iterations, rank)

    @torch.no_grad()
    def policy_step(x):
        logits, value = agent(x)
        logp_all = torch.log_softmax(logits, -1)
        action = (logits - (-torch.rand_like(logits).log()).log()).argmax(-1)  # Gumbel-max sample, no host sync
        return action, logp_all.gather(-1, action[:, None]).squeeze(-1), value

    captured = "loss" if use_graph else ""  # the update's own graph holds the loss's kernels
    policy_step, loss_fn = gpu_utils.compile_steps(
        policy_step, ppo_loss, args.compile, args.cudagraphs, captured, is_main
    )

    def bootstrap(final_obs, truncated, terminated):  # gamma * V(last obs) of the games the frame cap cut short
        return args.gamma * final_values(agent, final_obs, truncated, terminated, device)

    def mb_loss(*data):  # the loss of the rows of one (micro-)batch
        return loss_fn(agent, *data, args.clip_coef, args.ent_coef, args.vf_coef, args.clip_vloss)

    # ---------------- storage: the rollout on the device; rewards and dones on the host, moved once per iteration
    obs_shape = env_groups[0].single_observation_space.shape
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=torch.uint8, device=device)
    if args.channels_last:  # stored NHWC, so minibatches reach the convolutions without a layout copy
        obs = obs.movedim(2, -1).contiguous().movedim(-1, 2)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    advantages = torch.zeros((args.num_steps, args.num_envs), device=device)
    returns = torch.zeros((args.num_steps, args.num_envs), device=device)
    next_obs = torch.zeros((args.num_envs,) + obs_shape, dtype=torch.uint8, device=device)
    # flat views of the storage: the update gathers its minibatches from the same addresses every iteration
    b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values = (
        x.reshape((batch_size,) + x.shape[2:]) for x in (obs, actions, logprobs, advantages, returns, values)
    )
    pin = device.type == "cuda"
    # dones[t] = 1 when obs[t] starts a new episode; dones[num_steps]: the next rollout's first
    host_rewards = torch.zeros((args.num_steps, args.num_envs), dtype=torch.float32, pin_memory=pin)
    host_dones = torch.zeros((args.num_steps + 1, args.num_envs), dtype=torch.float32, pin_memory=pin)
    rollout_bytes = sum(t.numel() * t.element_size() for t in (obs, actions, logprobs, values)) * 3 // 2
    mb_bytes = args.minibatch_size * (int(np.prod(obs_shape)) + 5 * 4)
    est = gpu_utils.estimate_memory(
        agent, "adam", mb_bytes, rollout_bytes, None, obs[0, :2], args.minibatch_size, use_graph
    )
    run.note_estimate(est, global_step)

    def update_step(mb):
        """One minibatch step on the rows `mb` (loss, backward, clipping, Adam), with no host sync: --cudagraphs
        captures it as one CUDA graph."""
        optimizer.zero_grad(set_to_none=True)
        mb_advantages = b_advantages[mb]
        if args.norm_adv:  # over the whole minibatch, before it is split into micro-batches
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
        data = (b_obs[mb], b_actions[mb], b_logprobs[mb], mb_advantages, b_returns[mb], b_values[mb])
        stats = gpu_utils.accumulate_gradients(mb_loss, data, micro, params)
        if distributed:  # average gradients over processes, one flat all_reduce per minibatch
            gpu_utils.all_reduce_gradients(params, world_size)
        nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
        return stats

    blockers = {"torchrun: the gradients' all_reduce runs between backward and Adam": distributed}
    blockers[f"--micro-batch {micro.rows} splits the minibatch's {args.minibatch_size} rows"] = not use_graph
    holds = "one CUDA graph per minibatch step (forward, backward, clipping, Adam)"
    update_step = gpu_utils.CudaGraph.requested(
        update_step, args.cudagraphs, blockers, "update", holds, is_main, micro=micro
    )

    # ---------------- training loop
    env_seed = (args.seed * 10_000 + (start_iteration - 1) * 7919) % 2**30 + rank * args.num_envs  # new games on resume
    storage = (obs, actions, logprobs, values, next_obs, host_rewards.numpy(), host_dones.numpy())
    if args.async_envs:  # one vector env that hands back the first envs to finish; it resets them itself
        rollout = AsyncRollout(env_groups[0], env_seed, storage)
    else:
        rollout = Rollout(env_groups, env_rows, env_seed, storage, pin)
    recorder = run_utils.VideoRecorder(run.video_folder, fps=15) if args.capture_video and is_main else None
    diverged = False  # NaN or infinite weights after an update: the run stops without saving them
    for iteration in range(start_iteration, args.num_iterations + 1):
        iteration_start = time.perf_counter()
        lr_now = args.learning_rate
        if args.anneal_lr:
            lr_now = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate
        learning_rate.fill_(lr_now)
        for video in rollout.collect(policy_step, bootstrap, recorder):  # the videos of env 0 it wrote
            run.log_video(video)
        global_step += args.batch_size

        # ---------------- advantages
        with torch.no_grad():
            next_value = agent(next_obs)[1]
        rewards = host_rewards.to(device, non_blocking=True)
        dones = host_dones.to(device, non_blocking=True)
        gae = compute_gae(rewards, values, dones[:-1], next_value, dones[-1], args.gamma, args.gae_lambda)
        advantages.copy_(gae[0])
        returns.copy_(gae[1])

        # ---------------- update
        first_ratio_mse = None  # of the first minibatch, before any step
        for _epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device)
            stats = None  # the sums over the epoch's minibatches, then their means
            for start in range(0, batch_size, args.minibatch_size):
                mb_stats = update_step(b_inds[start : start + args.minibatch_size])
                run.report_micro_batch(micro, global_step)
                if first_ratio_mse is None:  # cloned: a captured graph overwrites its outputs
                    first_ratio_mse = mb_stats["ratio_mse"].clone()
                stats = stats or {name: torch.zeros_like(value) for name, value in mb_stats.items()}
                torch._foreach_add_(list(stats.values()), list(mb_stats.values()))
            stats = {name: total / args.num_minibatches for name, total in stats.items()}
            if args.target_kl is not None:  # one sync per epoch, only when --target-kl is set
                kl = stats["approx_kl"].clone()
                if distributed:
                    dist.all_reduce(kl)
                if kl.item() / world_size > args.target_kl:
                    break

        # ---------------- logging: one pull of scalars to the host per iteration
        del stats["ratio_mse"]  # its mean over the minibatches is not logged: the first minibatch's RMS is
        stats["initial_ratio_error"] = first_ratio_mse.sqrt()
        stats["explained_variance"] = (1 - (returns - values).var() / returns.var()).nan_to_num(0.0, neginf=0.0)
        stop_now = torch.tensor([float(bool(run.stop))], device=device)
        if distributed:  # every process stops at the same iteration when any got a signal
            dist.all_reduce(stop_now)
        # whether the weights are finite rides along, checked before a checkpoint could save them (all processes agree)
        pulled = torch.stack([*stats.values(), stop_now[0], run_utils.weights_finite(params)]).tolist()
        *losses, stopping, finite = pulled
        diverged = not finite
        for score, length in rollout.games:
            run.log_episode(score, length, global_step)
        scalars = {"charts/learning_rate": lr_now} | {f"losses/{name}": value for name, value in zip(stats, losses)}
        if args.async_envs:  # the share of the steps played that the update did not get
            scalars["charts/discarded_steps"] = rollout.discarded
        seconds = time.perf_counter() - iteration_start
        run.log_window(iteration, args.num_iterations, global_step, args.batch_size, seconds, scalars)
        if diverged:  # its non-finite losses are logged above; the checkpoint on disk keeps the last finite weights
            break
        finished = iteration == args.num_iterations
        if (args.checkpoint_every and iteration % args.checkpoint_every == 0) or stopping or finished:
            rng = [gpu_utils.rng_state(device)] * world_size
            if distributed:  # every process's RNG state goes into rank 0's file, so each continues its own on --resume
                dist.all_gather_object(rng, rng[0])
            state = dict(model=agent.state_dict(), optimizer=optimizer.state_dict(), rng=rng)
            run.checkpoint(state | dict(iteration=iteration, global_step=global_step), finished, bool(stopping))
        if stopping:
            break

    # ---------------- end of the run
    if not diverged and iteration == args.num_iterations:
        run.save_model(dict(model=agent.state_dict()))
    if recorder is not None:  # the game it was recording when the run ended or stopped
        run.log_video(recorder.close())
    run.close(global_step, diverged)
    for envs in env_groups:
        envs.close()
    if distributed:
        # wait for rank 0's files: exiting right after the last collective aborts in gloo's threads at shutdown
        dist.barrier()
        dist.destroy_process_group()
    run.exit(diverged, global_step)
