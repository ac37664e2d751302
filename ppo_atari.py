# PPO with the Nature DQN ConvNet on ALE v5 Atari games, CleanRL style, built to keep a GPU busy.
# Usage: python ppo_atari.py --env-id ALE/Breakout-v5 --gae-lambda 0.7 (N GPUs: torchrun --nproc-per-node N)
import collections
import os
import random
import sys
import time
from dataclasses import dataclass

import ale_py  # importing it registers the ALE/<Game>-v5 ids with gymnasium
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
import tyro
from tqdm import tqdm

import gpu_utils
import run_utils


@dataclass
# RunArgs: the flags of how and where it runs (--gpu, --resume, --cudagraphs, ...)
class Args(run_utils.RunArgs):
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (runs/<env>__<exp_name>__<seed>__<unix time>)"""
    seed: int = 1
    """seed of the experiment, 0 to 2**30 - 1 (rank r under torchrun samples with seed + r)"""
    torch_deterministic: bool = True
    """deterministic cuDNN algorithms (and no cuDNN benchmark mode)"""

    # Algorithm specific arguments
    env_id: str = "ALE/Breakout-v5"
    """any ALE/<Game>-v5 id"""
    env_threads: int = 0
    """threads stepping the envs (0: the run's CPU threads; at most one per env), split in halves"""
    overlap_envs: bool = True
    """step the envs in two halves: one half's envs play while the policy acts on the other's"""
    max_episode_frames: int = 108_000
    """emulator frames after which a game is truncated (not over); v5's 108,000 is 30 minutes"""
    channels_last: bool = True
    """conv weights and stored observations channels-last (NHWC), faster in oneDNN and cuDNN"""
    total_timesteps: int = 10_000_000
    """total agent steps over all envs and processes; an agent step is 4 frames (frameskip 4)"""
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
    """rows per minibatch, dividing num_envs * num_steps; ignored when --num-minibatches is set"""
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
    """Raise ValueError with the one-line message of the first setting that cannot work; for
    training, fill in the minibatch size and count per process (--num-minibatches wins)."""
    env_id = args.env_id
    hint = "import ale_py, gymnasium as g; print([e for e in g.registry if e.startswith('ALE/')])"
    unknown = f'unknown env id {env_id!r}, not ALE/<Game>-v5; list valid ids: python -c "{hint}"'
    ale_v5 = env_id in gym.envs.registry and env_id[:4] == "ALE/" and env_id[-3:] == "-v5"
    sizes = [args.num_envs, args.num_steps, args.update_epochs, args.max_episode_frames]
    run_utils.check(
        {
            unknown: ale_v5,
            f"--seed must be from 0 to 2**30 - 1, got {args.seed}": 0 <= args.seed < 2**30,
            f"--env-threads must be at least 0, got {args.env_threads}": args.env_threads >= 0,
            "--num-envs, --num-steps, --update-epochs and --max-episode-frames must be at least 1": min(sizes) >= 1,
        }
    )
    batch_size = args.num_envs * args.num_steps  # per process
    # an evaluation plays --eval-episodes games: it has no batch (a BatchSizeError)
    if not args.eval_checkpoint:
        args.minibatch_size = gpu_utils.choose_batch_size(batch_size, args.minibatch_size, parts=args.num_minibatches)
        args.num_minibatches = batch_size // args.minibatch_size
    one_batch = f"--total-timesteps must be at least one batch ({batch_size * world_size} agent steps)"
    enough = args.total_timesteps >= batch_size * world_size or bool(args.eval_checkpoint)
    run_utils.check(run_utils.shared_checks(args) | {one_batch: enough})


# ---------------------------------------------------------------- environment
def make_envs(env_id: str, num_envs: int, threads: int, max_frames: int):
    """ALE v5's settings in ale-py's threaded C++ vector env. Raw rewards and game-over terminals
    (EpisodeTracker makes PPO's); SameStep autoreset: a game's last obs is in info["final_obs"]."""
    return ale_py.AtariVectorEnv(
        gym.spec(env_id).kwargs["game"],
        num_envs,
        repeat_action_probability=0.25,
        full_action_space=False,
        num_threads=min(threads, num_envs),
        autoreset_mode="SameStep",
        frameskip=4,
        maxpool=True,
        img_height=84,
        img_width=84,
        grayscale=True,
        stack_num=4,
        noop_max=30,
        use_fire_reset=True,
        episodic_life=False,
        life_loss_info=False,
        reward_clipping=False,
        max_num_frames_per_episode=max_frames,
    )


class EpisodeTracker:
    """Full-game accounting, as CleanRL's EpisodicLifeEnv, ClipRewardEnv and RecordEpisodeStatistics
    do one env at a time. ``step`` returns rewards clipped to [-1, 1], the learning dones (a lost
    life is one), which games ended, and each env's raw score over all lives and length so far."""

    def __init__(self, num_envs: int, lives: np.ndarray):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.lives = np.array(lives)

    def step(self, rewards, terminated, truncated, lives):
        game_over = terminated | truncated
        life_lost = (lives < self.lives) & ~game_over
        # after a game over these are the new game's lives (SameStep reset)
        self.lives = np.array(lives)
        scores = self.returns + rewards
        lengths = self.lengths + 1
        self.returns = np.where(game_over, 0.0, scores)
        self.lengths = np.where(game_over, 0, lengths)
        clipped = np.clip(rewards, -1, 1).astype(np.float32)
        return clipped, game_over | life_lost, game_over, scores, lengths


def agent_view(obs: np.ndarray) -> np.ndarray:
    """The last frame of one env's stack as the agent sees it, doubled to 168x168 RGB (video)."""
    return np.repeat(np.repeat(obs[-1], 2, 0), 2, 1)[..., None].repeat(3, -1)


# ---------------------------------------------------------------- network
def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, num_actions: int, amp: bool = False):
        super().__init__()
        # bf16 for the convolutional trunk only: heads, log-probs and values stay fp32
        self.amp = amp
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
        """uint8 observations (B, 4, 84, 84) -> (logits, value), scaled to [0, 1] here."""
        with torch.autocast(x.device.type, torch.bfloat16, enabled=self.amp):
            hidden = self.network(x.float() / 255.0)
        hidden = hidden.float()
        return self.actor(hidden), self.critic(hidden).squeeze(-1)


# ---------------------------------------------------------------- algorithm
class Categorical:
    """The policy: CleanRL's Categorical(logits=...), for the rollout, the loss and the evaluation alike. Its sample
    is the Gumbel-max trick, the argmax of the logits plus Gumbel noise: no host sync, unlike torch.multinomial."""

    def __init__(self, logits):
        self.logits = logits
        self.log_probs = torch.log_softmax(logits, -1)  # of every action

    def sample(self):
        gumbel = -(-torch.rand_like(self.logits).log()).log()
        return (self.logits + gumbel).argmax(-1)

    def log_prob(self, actions):  # actions of any batch shape that broadcasts against the logits' (torch's rule)
        actions, log_probs = torch.broadcast_tensors(actions.long().unsqueeze(-1), self.log_probs)
        return log_probs.gather(-1, actions[..., :1]).squeeze(-1)

    def entropy(self):  # a masked action (a -inf logit) adds 0, not 0 * -inf = NaN: clamped as torch's is
        finite = self.log_probs.clamp(min=torch.finfo(self.log_probs.dtype).min)
        return -(self.log_probs.exp() * finite).sum(-1)


# the rollout and the loss disagree when an iteration's first minibatch's ratios, before any step, are off by more than
# this (root mean square). Rounding on the CPU, the largest over whole runs (dev/ratio_rounding.py): fp32 7e-7, bf16
# (--amp) 9.6e-7 here and 5.7e-5 in ppo_continuous. Wrong scripts measured 0.028 to 0.18 (#59, #63: an acting copy
# never synced, a log-std head for the loss alone)
RATIO_ERROR_WARNING = 1e-3


def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """GAE of a (T, N) rollout (dones[t] = 1: obs[t] starts an episode) -> (advantages, returns)"""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    deltas = rewards + gamma * torch.cat([values[1:], next_value[None]]) * nextnonterminal - values
    discounts = gamma * gae_lambda * nextnonterminal
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        advantages[t] = lastgaelam = deltas[t] + discounts[t] * lastgaelam
    return advantages, advantages + values


def ppo_loss(agent, obs, actions, logprobs, advantages, returns, values, args: Args):
    """Clipped PPO loss over a (micro-)batch whose advantages are already normalised. Returns (loss,
    statistics by name), each a mean over the rows."""
    clip_coef = args.clip_coef
    logits, newvalue = agent(obs)
    pi = Categorical(logits)
    entropy = pi.entropy().mean()
    logratio = pi.log_prob(actions) - logprobs
    ratio = logratio.exp()
    clipped_ratio = ratio.clamp(1 - clip_coef, 1 + clip_coef)
    pg_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio).mean()
    if args.clip_vloss:
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
            # the first minibatch's must be 0: the rollout and the loss agree
            "ratio_mse": ((ratio - 1) ** 2).mean(),
        }
    return pg_loss - args.ent_coef * entropy + v_loss * args.vf_coef, stats


@torch.no_grad()
def final_values(agent, final_obs, truncated, terminated, device) -> np.ndarray:
    """V(last obs) of each game the frame cap cut short (0 elsewhere): its reward bootstraps."""
    cut = np.flatnonzero(np.logical_and(truncated, np.logical_not(terminated)))
    values = np.zeros(len(truncated), dtype=np.float32)
    if len(cut):
        cut_obs = torch.as_tensor(np.asarray(final_obs)[cut], device=device)
        values[cut] = agent(cut_obs)[1].cpu().numpy()
    return values


def memory_estimate(agent, obs, actions, logprobs, values, minibatch_size: int, cudagraphs: bool):
    """The device memory a run needs: the network and Adam, a minibatch, the rollout storage (half again for its
    gathered minibatch copies) and a minibatch's activations (docs/devices-threads-memory.md)."""
    return gpu_utils.estimate_memory(
        agent,
        batch_bytes=minibatch_size * (obs[0, 0].nbytes + 5 * 4),
        rollout_bytes=sum(t.nbytes for t in (obs, actions, logprobs, values)) * 3 // 2,
        example_input=obs[0, :2],
        batch_size=minibatch_size,
        cudagraphs=cudagraphs,
    )


@torch.no_grad()
def evaluate(envs, act, device, seed: int) -> np.ndarray:
    """Play one full game in every env and return each env's first score: averaging games as they
    finish would favour short ones (an env can finish two before a long one ends elsewhere)."""
    obs, info = envs.reset(seed=seed)
    tracker = EpisodeTracker(envs.num_envs, info["lives"])
    first_scores = np.full(envs.num_envs, np.nan)
    while np.isnan(first_scores).any():
        action = act(torch.as_tensor(obs, device=device)).cpu().numpy()
        obs, reward, terminated, truncated, info = envs.step(action)
        _, _, game_over, scores, _ = tracker.step(reward, terminated, truncated, info["lives"])
        first_scores = np.where(game_over & np.isnan(first_scores), scores, first_scores)
    return first_scores


def evaluate_checkpoint(args: Args) -> None:
    """--eval-checkpoint: play one game in each of --eval-episodes envs with the checkpoint's policy (sampled), print
    the mean score and exit; its game is the checkpoint's, the rest the command line's."""
    ckpt = run_utils.load_checkpoint(args.eval_checkpoint, "ppo_atari")
    args.env_id = ckpt["args"]["env_id"]
    validate(args, world_size=1)
    device, _ = run_utils.select_device(args)
    threads = gpu_utils.thread_budget(args.num_threads).threads
    gpu_utils.limit_threads(threads)
    torch.manual_seed(args.seed)
    envs = make_envs(args.env_id, args.eval_episodes, threads, args.max_episode_frames)
    agent = Agent(envs.single_action_space.n, args.amp).to(device)
    run_utils.load_states({"model": agent}, ckpt, args.eval_checkpoint)
    scores = evaluate(envs, lambda x: Categorical(agent(x)[0]).sample(), device, args.seed)
    print(f"eval {args.env_id}: mean return {scores.mean():.2f} +- {scores.std():.2f} over {len(scores)} episodes")
    sys.exit(0)


if __name__ == "__main__":
    # ---------------- arguments and their checks
    run_utils.stop_in_one_line()  # until the run has a folder: a stop signal ends the process at once, in one line
    args = tyro.cli(Args)
    given = dict(vars(args))  # as typed, before the checks fill in the minibatch fields
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    distributed = world_size > 1
    is_main = rank == 0
    with run_utils.one_line_errors():
        if args.eval_checkpoint:  # play its policy, print the mean score and exit
            evaluate_checkpoint(args)
        ckpt = run_utils.resume(args, "ppo_atari", RUNTIME_FLAGS)
        if ckpt and len(ckpt["rng"]) != world_size:
            raise ValueError(f"the checkpoint is from {len(ckpt['rng'])} processes; resume with as many")
        validate(args, world_size)
        device, device_why = run_utils.select_device(args)
    batch_size = args.num_envs * args.num_steps  # per process
    args.batch_size = batch_size * world_size
    args.num_iterations = args.total_timesteps // args.batch_size
    run_utils.exit_if_done(ckpt, args.num_iterations, args.resume, is_main)

    # ---------------- device, threads, seeds
    if distributed:
        cuda = device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    cpu_share = gpu_utils.take_cpu_share(args.num_threads)  # threads capped, a share of the CPUs among live runs
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed)  # the same model in every process
    env_threads = min(args.env_threads or cpu_share.threads, args.num_envs)
    # two halves of the envs take turns: one plays (C++ threads) while the policy acts on the other
    num_groups = 2 if args.overlap_envs and args.num_envs >= 2 else 1
    bounds = [g * args.num_envs // num_groups for g in range(num_groups + 1)]
    env_rows = [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]
    total_steps = args.num_iterations * args.batch_size
    if is_main:
        why = device_why + (f"; {world_size} processes" if distributed else "")
        stepping = f"{env_threads} stepping the {args.num_envs} envs in {num_groups} group(s)"
        run_utils.print_device(device, why, args.amp, cpu_share, stepping)
        run_utils.print_config(args, given, bool(ckpt), RUNTIME_FLAGS, total_steps=total_steps)

    # ---------------- logging: the first process writes the logs and checkpoints
    start_step = ckpt["global_step"] if ckpt else 0
    run_name = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_name = ckpt["run_name"] if ckpt else run_name
    # from here on a stop signal stops the run after its iteration, with a checkpoint
    run_dir, writer, stop = run_utils.open_run(run_name, args, device, start_step, ckpt, is_main)
    show_bar = args.progress_bar and is_main
    pbar = tqdm(total=total_steps, initial=start_step, disable=not show_bar, unit_scale=True)
    monitor = gpu_utils.GPUMonitor(device).start()

    # ---------------- envs and network
    group_threads = max(1, env_threads // num_groups)
    group_sizes = [rows.stop - rows.start for rows in env_rows]
    env_groups = [make_envs(args.env_id, size, group_threads, args.max_episode_frames) for size in group_sizes]
    memory_format = torch.channels_last if args.channels_last else torch.preserve_format
    agent = Agent(env_groups[0].single_action_space.n, args.amp)
    agent = agent.to(device, memory_format=memory_format)
    params = list(agent.parameters())
    # Adam's learning rate as a device tensor, annealed in place: no re-capture of a CUDA graph. float64 on the CPU,
    # where the fused Adam then computes exactly as with a float; float32 for CUDA's fused kernel
    lr_dtype = torch.float64 if device.type == "cpu" else torch.float32
    learning_rate = torch.tensor(args.learning_rate, dtype=lr_dtype, device=device)
    use_graph = args.cudagraphs and not distributed  # a graph cannot hold torchrun's all_reduce
    optimizer = optim.Adam(params, lr=learning_rate, eps=1e-5, fused=True, capturable=use_graph)
    torch.manual_seed(args.seed + rank)
    start_iteration = ckpt["iteration"] + 1 if ckpt else 1
    global_step = start_step
    states = {"model": agent, "optimizer": optimizer}  # the run's states: saved in every checkpoint, loaded on --resume
    if ckpt:
        run_utils.load_states(states, ckpt, args.resume, device=device, rank=rank)

    @torch.no_grad()
    def policy_step(x):
        """The rollout's step for uint8 observations: a sampled action, its log-probability, the value."""
        logits, value = agent(x)
        pi = Categorical(logits)
        action = pi.sample()
        return action, pi.log_prob(action), value

    # --compile, --cudagraphs: the same step compiled (and then replayed as CUDA graphs)
    act = gpu_utils.compile_policy(policy_step, args.compile, args.cudagraphs)
    loss_fn = torch.compile(ppo_loss) if args.compile or args.cudagraphs else ppo_loss

    # ---------------- storage: the rollout on the device; rewards and dones on the host
    obs_shape = env_groups[0].single_observation_space.shape
    rollout_shape = (args.num_steps, args.num_envs)
    obs = torch.zeros(rollout_shape + obs_shape, dtype=torch.uint8, device=device)
    if args.channels_last:  # stored NHWC: minibatches reach the convolutions without a copy
        obs = obs.movedim(2, -1).contiguous().movedim(-1, 2)
    actions = torch.zeros(rollout_shape, dtype=torch.long, device=device)
    logprobs = torch.zeros(rollout_shape, device=device)
    values = torch.zeros(rollout_shape, device=device)
    advantages = torch.zeros(rollout_shape, device=device)
    returns = torch.zeros(rollout_shape, device=device)
    next_obs = torch.zeros((args.num_envs,) + obs_shape, dtype=torch.uint8, device=device)
    # flat views: the update gathers its minibatches from the same addresses every iteration
    b_obs = obs.view((batch_size,) + obs_shape)
    b_actions = actions.view(-1)
    b_logprobs = logprobs.view(-1)
    b_values = values.view(-1)
    b_advantages = advantages.view(-1)
    b_returns = returns.view(-1)
    pin = device.type == "cuda"  # pinned host memory: one asynchronous copy to the device
    host_obs = torch.zeros((args.num_envs,) + obs_shape, dtype=torch.uint8, pin_memory=pin)
    host_obs_np = host_obs.numpy()  # the envs write their observations here
    host_rewards = torch.zeros(rollout_shape, pin_memory=pin)
    host_dones = torch.zeros((args.num_steps + 1, args.num_envs), pin_memory=pin)
    rewards_np = host_rewards.numpy()  # numpy views: a tenth of torch's cost per row written
    dones_np = host_dones.numpy()
    memory = memory_estimate(agent, obs, actions, logprobs, values, args.minibatch_size, use_graph)
    if is_main:
        print(memory)
        writer.add_scalar("memory/estimated_mib", memory.total / 2**20, start_step)

    def backward(minibatch, weight=1.0):
        """The PPO loss's gradients over a minibatch (``weight``: its share of a split one); its statistics by name."""
        loss, stats = loss_fn(agent, *minibatch, args)
        (loss * weight).backward()
        return stats

    # --micro-batch: the same gradients from backward passes over slices of the minibatch, halved on CUDA out of memory
    micro_batches = gpu_utils.MicroBatches(backward, args.micro_batch, args.minibatch_size, params)

    def update(mb_inds):
        """One minibatch's gradient step, without a host sync: --cudagraphs captures it as one CUDA graph."""
        mb_advantages = b_advantages[mb_inds]
        if args.norm_adv:  # over the whole minibatch, before any split into micro-batches
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
        minibatch = (
            b_obs[mb_inds],
            b_actions[mb_inds],
            b_logprobs[mb_inds],
            mb_advantages,
            b_returns[mb_inds],
            b_values[mb_inds],
        )
        optimizer.zero_grad(set_to_none=True)
        stats = micro_batches(minibatch)  # backward(minibatch), or over slices of it
        if distributed:  # average the gradients over the processes, one flat all_reduce
            grads = [p.grad for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            torch._foreach_copy_(grads, torch._utils._unflatten_dense_tensors(flat / world_size, grads))
        nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
        return stats

    # --cudagraphs: the whole update step as one CUDA graph, replayed for every minibatch
    update_step = gpu_utils.CudaGraph(update, enabled=use_graph, name="update")
    if args.cudagraphs and distributed and is_main:  # a capture says so itself ("update: one CUDA graph")
        print("update: eager (torchrun's all_reduce)")

    # ---------------- training loop
    env_seed = (args.seed * 10_000 + (start_iteration - 1) * 7919) % 2**30  # new games on resume
    env_seed += rank * args.num_envs
    trackers = []
    for rows, envs in zip(env_rows, env_groups):  # env i gets seed + i
        host_obs_np[rows], info = envs.reset(seed=env_seed + rows.start)
        trackers.append(EpisodeTracker(rows.stop - rows.start, info["lives"]))
    next_obs.copy_(host_obs, non_blocking=True)
    recent_scores = collections.deque(maxlen=20)
    recorder = run_utils.VideoRecorder(run_dir, start_step, fps=15) if args.capture_video and is_main else None

    def receive(step, group):
        """The envs of ``group`` finish the step they were sent: its results go to row ``step`` of the rollout.
        Returns the games that ended, as (score over all lives, length)."""
        rows = env_rows[group]
        host_obs_np[rows], reward, terminated, truncated, info = env_groups[group].recv()
        next_obs[rows].copy_(host_obs[rows], non_blocking=True)
        clipped, learn_done, over, scores, lengths = trackers[group].step(reward, terminated, truncated, info["lives"])
        rewards_np[step, rows] = clipped
        dones_np[step + 1, rows] = learn_done
        # a game cut short by the frame cap: its reward bootstraps from V(last obs)
        if truncated.any():
            cut = final_values(agent, info["final_obs"], truncated, terminated, device)
            rewards_np[step, rows] += args.gamma * cut
        if recorder is not None and group == 0:  # a game's last frame, not the next game's first
            frame = info["final_obs"][0] if over[0] else host_obs_np[0]
            recorder.add(agent_view(frame), bool(over[0]))
        return list(zip(scores[over].tolist(), lengths[over].tolist()))

    started = time.time()
    diverged = False  # NaN or infinite weights after an update: the run stops without saving them
    ratio_warned = False  # the rollout/loss check's one warning has been said
    for iteration in range(start_iteration, args.num_iterations + 1):
        iteration_start = time.perf_counter()
        frac = 1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0
        lr_now = frac * args.learning_rate
        learning_rate.fill_(lr_now)
        host_dones[0] = host_dones[args.num_steps]  # whether the first observation starts a game
        games = []  # (score over all lives, length) of each game that ended in this rollout
        playing = collections.deque()  # (step, group) of the actions the envs are playing
        for step in range(args.num_steps):
            for group, rows in enumerate(env_rows):
                obs[step, rows] = next_obs[rows]
                actions[step, rows], logprobs[step, rows], values[step, rows] = act(next_obs[rows])
                # .cpu() also waits for the copy from host_obs: the envs may overwrite those rows
                env_groups[group].send(actions[step, rows].cpu().numpy())
                playing.append((step, group))
                if len(playing) == num_groups:  # the other group's envs keep playing meanwhile
                    games += receive(*playing.popleft())
        while playing:
            games += receive(*playing.popleft())
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

        # ---------------- logging: the scalars pulled to the host at once, by name, one sync per iteration
        del stats["ratio_mse"]  # not its mean over the minibatches: the first minibatch's RMS
        stats["initial_ratio_error"] = first_ratio_mse.sqrt()
        stats["explained_variance"] = (1 - (returns - values).var() / returns.var()).nan_to_num(0.0, neginf=0.0)
        scalars = {f"losses/{name}": value for name, value in stats.items()}
        stop_now = torch.tensor([float(bool(stop))], device=device)
        if distributed:  # every process stops at the same iteration when any got a signal
            dist.all_reduce(stop_now)
        scalars["stopping"] = stop_now[0]
        # whether the weights are finite rides along: checked before a checkpoint could save them
        scalars["weights_finite"] = torch.stack([p.isfinite().all() for p in params]).all().float()
        scalars = dict(zip(scalars, torch.stack(list(scalars.values())).tolist()))
        diverged = not scalars["weights_finite"]
        stopping = bool(scalars["stopping"])
        ratio_error = scalars["losses/initial_ratio_error"]
        if ratio_error > RATIO_ERROR_WARNING and not ratio_warned and is_main:  # every iteration, said once
            ratio_warned = True
            print(
                f"warning: iteration {iteration}: the loss scores the rollout's actions {ratio_error:.3g} apart from "
                f"the rollout's policy before any step (RMS of ratio - 1 > {RATIO_ERROR_WARNING}): sample them in the "
                "rollout and score them in ppo_loss with one distribution (Categorical)"
            )
        sps = args.batch_size / (time.perf_counter() - iteration_start)
        recent_scores.extend(score for score, _ in games)
        if is_main:
            for score, length in games:
                writer.add_scalar("charts/episodic_return", score, global_step)
                writer.add_scalar("charts/episodic_length", length, global_step)
            writer.add_scalar("charts/learning_rate", lr_now, global_step)
            for key in scalars:
                if key.startswith("losses/"):
                    writer.add_scalar(key, scalars[key], global_step)
            writer.add_scalar("memory/micro_batch", micro_batches.rows, global_step)
            if iteration > start_iteration:  # the first iteration is warm-up (compilation, capture)
                writer.add_scalar("charts/SPS", sps, global_step)
        run_utils.log_machine(writer, global_step, cpu_share, monitor)
        finished = iteration == args.num_iterations
        score_text = f"return {np.mean(recent_scores):.1f}" if recent_scores else "return -"
        pbar.set_postfix_str(f"SPS={sps:,.0f} {score_text}", refresh=False)
        pbar.update(global_step - pbar.n)
        if is_main and not args.progress_bar and (iteration % 10 == 0 or finished):
            print(f"iteration {iteration}/{args.num_iterations}: step {global_step}, SPS {sps:,.0f}, {score_text}")
        if diverged:  # the checkpoint on disk keeps the last finite weights
            break
        on_schedule = args.checkpoint_every and iteration % args.checkpoint_every == 0
        if on_schedule or stopping or finished:
            rng = [gpu_utils.rng_state(device)] * world_size
            if distributed:  # each process's RNG state in rank 0's file: each continues its own
                dist.all_gather_object(rng, rng[0])
            if is_main:
                run_utils.save_checkpoint(
                    os.path.join(run_dir, "checkpoint.pt"),
                    script="ppo_atari",
                    args=vars(args),
                    status="finished" if finished else "stopped" if stopping else "running",
                    rng=rng,
                    iteration=iteration,
                    global_step=global_step,
                    **{key: state.state_dict() for key, state in states.items()},
                )
        if stopping:
            break

    # ---------------- end of the run
    if recorder is not None:  # the game it was recording when the run ended or stopped
        recorder.close()
    pbar.close()
    for envs in env_groups:
        envs.close()
    monitor.close()
    cpu_share.close()  # its CPUs to the other live runs
    # wait for rank 0's files: gloo aborts a process that exits right after a collective
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    # --save-model: the final weights and what playing them needs
    model = dict(script="ppo_atari", args=vars(args), model=agent.state_dict())
    model = model if args.save_model and iteration == args.num_iterations else None
    run_utils.end_run(writer, run_dir, global_step, total_steps, started, diverged, model)
