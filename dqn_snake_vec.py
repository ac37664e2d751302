# Double DQN on N Snake games that live as tensors on one device (a GPU when there is one).
# Usage: python dqn_snake_vec.py          python dqn_snake_vec.py --num-envs 4096 --gpu true
import itertools
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from tqdm import tqdm

import gpu_utils
import run_utils
from snake_env import VecSnake, snake_view


@dataclass
# RunArgs: how and where it runs (--gpu, --resume, --cudagraphs, ...)
class Args(run_utils.RunArgs):
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (runs/Snake<H>x<W>__<exp_name>__<seed>__<unix time>)"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """deterministic cuDNN algorithms (and no cuDNN benchmark mode)"""
    checkpoint_every: int = 10_000
    """iterations between writes of runs/<run_name>/checkpoint.pt (0: at the end and on a stop)"""

    # Algorithm specific arguments
    num_envs: int = 256
    """the number of Snake games stepped together on the device"""
    height: int = 10
    """board height (cells, at least 3)"""
    width: int = 10
    """board width (cells, at least 3)"""
    env_mode: Literal["auto", "dense", "sparse", "fused"] = "auto"
    """dense (no host sync; GPU default), sparse (only the boards that need it; CPU default), fused
    (dense's games, torch.compiled into a few kernels) or auto"""
    total_timesteps: int = 5_000_000
    """total env steps (summed over all games); an iteration is one step of every game"""
    learning_rate: float = 5e-4
    """the learning rate of the Adam optimizer"""
    buffer_size: int = 500_000
    """the replay memory size in transitions"""
    buffer_device: Literal["auto", "cpu"] = "auto"
    """where the replay memory lives: auto (the training device) or cpu (pinned host memory)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    n_step: int = 3
    """n-step returns (1: plain one-step TD)"""
    tau: float = 0.005
    """target network update rate (1.0: hard copy)"""
    target_network_frequency: int = 1
    """the number of gradient updates between target network updates"""
    batch_size: int = 256
    """the batch size of samples from the replay memory"""
    updates_per_step: int = 1
    """gradient updates per iteration (replay ratio = updates_per_step * batch_size / num_envs)"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.02
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.2
    """the fraction of `total_timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 20_000
    """env steps (summed over games) collected before learning starts, also after a resume"""
    max_grad_norm: float = 10.0
    """the maximum norm for the gradient clipping"""
    log_every: int = 25_600
    """env steps between scalar logs (whole iterations); charts/SPS: env steps/s in that window
    (acting only, before --learning-starts)"""
    eval_epsilon: float = 0.0
    """epsilon of the --eval-checkpoint policy"""


# flags that --resume takes from the command line; every other Args field comes from the checkpoint
RUNTIME_FLAGS = run_utils.RUN_FLAGS | {"env_mode", "log_every", "buffer_device", "eval_epsilon"}


def validate(args: Args, device: torch.device | None = None) -> None:
    """Raise ValueError with the one-line message of the first setting that cannot work; with a
    device, also of a replay memory or an n-step ring larger than the free memory."""
    h, w, n, buffer_size = args.height, args.width, args.num_envs, args.buffer_size
    frequency, fraction = args.target_network_frequency, args.exploration_fraction
    updates, starts = args.updates_per_step, args.learning_starts
    epsilons = (args.start_e, args.end_e, args.eval_epsilon)
    # each epsilon on its own: min() and max() of them skip a NaN
    epsilons_ok = all(0 <= epsilon <= 1 for epsilon in epsilons)
    run_utils.check(
        {
            f"--height and --width must be at least 3, got {h} x {w}": min(h, w) >= 3,
            f"--num-envs must be at least 1, got {n}": n >= 1,
            f"--total-timesteps must be at least --num-envs ({n})": args.total_timesteps >= n,
            f"--n-step must be at least 1, got {args.n_step}": args.n_step >= 1,
            f"--gamma must be in (0, 1], got {args.gamma}": 0 < args.gamma <= 1,
            f"--tau must be in (0, 1], got {args.tau}": 0 < args.tau <= 1,
            f"--batch-size must be at least 1, got {args.batch_size}": args.batch_size >= 1,
            f"--buffer-size ({buffer_size}) must hold at least --batch-size and --num-envs": (
                buffer_size >= max(args.batch_size, n)
            ),
            f"--updates-per-step must be at least 0, got {updates}": updates >= 0,
            f"--target-network-frequency must be at least 1, got {frequency}": frequency >= 1,
            f"--exploration-fraction must be in (0, 1], got {fraction}": 0 < fraction <= 1,
            f"--start-e, --end-e and --eval-epsilon must be in [0, 1], got {epsilons}": epsilons_ok,
            f"--learning-starts must be at least 0, got {starts}": starts >= 0,
            f"--log-every must be at least 1 env step, got {args.log_every}": args.log_every >= 1,
        }
        | run_utils.shared_checks(args, one_process=True)
    )
    if device is None or args.eval_checkpoint:  # an evaluation makes neither
        return
    # two uint8 observations a transition: the replay memory grows with the board's area; the n-step
    # ring holds n transitions of every game on the training device, beside the replay memory when
    # it is there too. Free memory None: unknown
    replay_device = torch.device("cpu") if args.buffer_device == "cpu" else device
    replay_gib = buffer_size * ReplayBuffer.transition_bytes((4, h, w)) / 2**30
    ring_gib = args.n_step * n * ReplayBuffer.transition_bytes((4, h, w)) / 2**30
    free = {where: gpu_utils.free_memory(where) for where in (replay_device, device)}
    free_gib = {where: math.inf if size is None else size / 2**30 for where, size in free.items()}
    replay_free = free_gib[replay_device]
    ring_free = free_gib[device] - (replay_gib if replay_device == device else 0)
    run_utils.check(
        {
            f"--buffer-size {buffer_size} on {h}x{w} boards needs {replay_gib:.1f} GiB of replay "
            f"memory, more than the {replay_free:.1f} GiB free on {replay_device}"
            "; lower --buffer-size or the board size": replay_gib <= replay_free,
            f"--n-step {args.n_step} with --num-envs {n} on {h}x{w} boards needs {ring_gib:.1f} "
            f"GiB for the n-step ring, more than the {ring_free:.1f} GiB free on {device} "
            "besides the replay memory; lower --n-step or --num-envs": ring_gib <= ring_free,
        }
    )


# ---------------------------------------------------------------- environment
# snake_env: VecSnake (N games as tensors on the training device, stepped together), snake_view


# ---------------------------------------------------------------- network
class QNetwork(nn.Module):
    """3x3 conv 32, 3x3 conv 32 stride 2, FC 256, one Q-value per action. Input: uint8 planes."""

    def __init__(self, height, width, num_actions=4, planes=4, amp: bool = False):
        super().__init__()
        # bf16 for the trunk only: Q-values (so targets, argmaxes, the loss) stay fp32
        self.amp = amp
        # head, body and food planes are 0/1; scale the body-order plane (ages up to H*W) to [0, 1]
        scale = torch.tensor([1.0, 1.0, 1.0, 1.0 / min(height * width, 255)])
        self.register_buffer("scale", scale.view(1, 4, 1, 1))
        flat = 32 * ((height + 1) // 2) * ((width + 1) // 2)
        self.network = nn.Sequential(
            nn.Conv2d(planes, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(flat, 256),
            nn.ReLU(),
            nn.Linear(256, num_actions),
        )

    def forward(self, x):
        *trunk, head = self.network
        x = x.float() * self.scale
        with torch.autocast(x.device.type, torch.bfloat16, enabled=self.amp):
            for layer in trunk:
                x = layer(x)
        return head(x.float())


def epsilon_greedy(q_values, epsilon):
    """The greedy action, or with probability epsilon (a float or a device scalar) a random one."""
    explore = torch.rand(q_values.shape[0], device=q_values.device) < epsilon
    random_actions = torch.randint(0, 4, explore.shape, device=q_values.device)
    return torch.where(explore, random_actions, q_values.argmax(1))


# ---------------------------------------------------------------- algorithm
class NStep:
    """Ring of the last n steps of N games; once full, each push emits the n-step transition that
    started n-1 pushes ago: R = sum_k gamma^k r_k up to the first step that ended the episode, the
    true observation after that step, whether it was a termination, and the discount gamma^(steps
    used). The slot is a device counter: a push makes no host sync, so a CUDA graph can hold it."""

    def __init__(self, n, gamma, num_envs, obs_shape, device):
        self.n = n
        self.gamma = gamma
        self.t = 0  # steps pushed so far, on the host: the ring fills once, then every push emits
        self.slot = torch.zeros(1, dtype=torch.long, device=device)  # where the next push writes
        self.obs = torch.zeros(n, num_envs, *obs_shape, dtype=torch.uint8, device=device)
        self.next_obs = torch.zeros_like(self.obs)
        self.actions = torch.zeros(n, num_envs, dtype=torch.long, device=device)
        self.rewards = torch.zeros(n, num_envs, device=device)
        self.terminated = torch.zeros(n, num_envs, dtype=torch.bool, device=device)
        self.ended = torch.zeros_like(self.terminated)
        self.fields = (self.obs, self.actions, self.rewards, self.next_obs, self.terminated, self.ended)
        self._steps = torch.arange(n, device=device)
        self._discounts = gamma ** torch.arange(n, device=device, dtype=torch.float32)
        self._games = torch.arange(num_envs, device=device)

    def push(self, obs, actions, rewards, next_obs, terminated, ended):
        """Add one step (next_obs: the true observation after it); returns an n-step batch, or None
        while filling."""
        newest = self.slot.clone()
        for store, value in zip(self.fields, (obs, actions, rewards, next_obs, terminated, ended)):
            store.index_copy_(0, newest, value.unsqueeze(0))
        self.slot.add_(1).remainder_(self.n)  # now the oldest step in the ring
        self.t += 1
        if self.t < self.n:
            return None
        # the ring's slots from the oldest step to the newest
        order = (self.slot + self._steps) % self.n
        rewards_k = self.rewards.index_select(0, order)
        ended_k = self.ended.index_select(0, order)
        running = (ended_k.cumsum(0) - ended_k.long()) == 0  # no episode end before step k
        ret = (running * self._discounts.unsqueeze(1) * rewards_k).sum(0)
        # the window's last step: its first episode end, else the newest step
        last = torch.where(ended_k.any(0), ended_k.long().argmax(0), self.n - 1)
        # each game's slot of that step: one gather of the observations after it
        last_slots = (order[last], self._games)
        first = order[:1]
        obs0 = self.obs.index_select(0, first).squeeze(0)
        actions0 = self.actions.index_select(0, first).squeeze(0)
        disc = self.gamma ** (last + 1.0)
        return obs0, actions0, ret, self.next_obs[last_slots], self.terminated[last_slots], disc


class ReplayBuffer:
    """Preallocated replay memory of uint8 observations on the training device, or in pinned host
    memory (device cpu) with batches copied to target without blocking. The write position and the
    size are device tensors: adding and sampling make no host sync, so a CUDA graph holds them."""

    def __init__(self, capacity, obs_shape, device, target):
        self.capacity = capacity
        self.device = device
        self.target = target
        self.ptr = torch.zeros((), dtype=torch.long, device=device)  # the next row to write
        self.size = torch.zeros((), dtype=torch.long, device=device)
        self.pin = device.type == "cpu" and target.type == "cuda"
        kw = dict(device=device, pin_memory=self.pin)
        self.obs = torch.zeros(capacity, *obs_shape, dtype=torch.uint8, **kw)
        self.next_obs = torch.zeros(capacity, *obs_shape, dtype=torch.uint8, **kw)
        self.actions = torch.zeros(capacity, dtype=torch.long, **kw)
        self.rewards = torch.zeros(capacity, **kw)
        self.discounts = torch.zeros(capacity, **kw)
        self.terminated = torch.zeros(capacity, dtype=torch.bool, **kw)
        self.fields = (self.obs, self.actions, self.rewards, self.next_obs, self.terminated, self.discounts)

    @staticmethod
    def transition_bytes(obs_shape) -> int:
        """Two uint8 observations, an int64 action, float32 reward and discount, a bool."""
        return 2 * int(np.prod(obs_shape)) + 8 + 4 + 4 + 1

    def add(self, *batch):
        """Add rows of (obs, actions, rewards, next_obs, terminated, discounts), wrapping around."""
        n = batch[0].shape[0]
        idx = (torch.arange(n, device=self.device) + self.ptr) % self.capacity
        for store, value in zip(self.fields, batch):
            store.index_copy_(0, idx, value.to(self.device))
        self.ptr.add_(n).remainder_(self.capacity)
        self.size.add_(n).clamp_(max=self.capacity)

    def sample(self, batch_size, generator=None):
        """A uniform batch (with replacement), on the training device. 62 random bits modulo the
        size: uniform to within size / 2^62, and the size may stay on the device."""
        bits = torch.randint(0, 2**62, (batch_size,), device=self.device, generator=generator)
        idx = bits % self.size
        out = [store[idx] for store in self.fields]
        return [t.pin_memory().to(self.target, non_blocking=True) for t in out] if self.pin else out


def td_loss(q_network, target_network, obs, actions, rewards, next_obs, terminated, discounts):
    """Double DQN Huber loss over a (micro-)batch: the online network picks the next action, the
    target network rates it. Returns (loss, statistics by name)."""
    with torch.no_grad():
        next_actions = q_network(next_obs).argmax(1, keepdim=True)
        next_q = target_network(next_obs).gather(1, next_actions).squeeze(1)
        td_target = rewards + discounts * next_q * (~terminated)
    q = q_network(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
    loss = F.smooth_l1_loss(q, td_target)
    return loss, {"td_loss": loss.detach(), "q_values": q.detach().mean()}


@torch.no_grad()
def evaluate(q_network, args: Args, device):
    """Play one game on each of --eval-episodes boards and return each board's first (return, score,
    final length): averaging games in the order they end would favour short ones."""
    env = VecSnake(args.eval_episodes, args.height, args.width, device=device, seed=args.seed, mode=args.env_mode)
    obs = env.reset()
    finished = torch.zeros(env.n, dtype=torch.bool, device=env.device)
    stats = torch.zeros(3, env.n, device=env.device)
    while not bool(finished.all()):
        actions = epsilon_greedy(q_network(obs), args.eval_epsilon)
        obs, _, terminated, truncated, info = env.step(actions)
        new = (terminated | truncated) & ~finished
        ended_stats = torch.stack([info[k].float() for k in ("episode_return", "score", "length")])
        stats = torch.where(new, ended_stats, stats)
        finished |= new
    return stats.cpu().numpy()


def evaluate_checkpoint(args: Args) -> None:
    """--eval-checkpoint: play one game on each of --eval-episodes boards with the checkpoint's policy (at
    --eval-epsilon), print the mean return, score and length, and exit; the board is the checkpoint's."""
    ckpt = run_utils.load_checkpoint(args.eval_checkpoint, "dqn_snake_vec")
    args.height = ckpt["args"]["height"]
    args.width = ckpt["args"]["width"]
    device, _ = run_utils.select_device(args)
    validate(args)
    gpu_utils.limit_threads(gpu_utils.thread_budget(args.num_threads).threads)
    torch.manual_seed(args.seed)
    q_network = QNetwork(args.height, args.width, amp=args.amp).to(device)
    run_utils.load_states({"model": q_network}, ckpt, args.eval_checkpoint)
    returns, scores, lengths = evaluate(q_network, args, device)
    board = f"Snake{args.height}x{args.width}"
    print(
        f"eval {board}: mean return {returns.mean():.2f} +- {returns.std():.2f} over {len(returns)} episodes"
        f" (mean score {scores.mean():.2f}, mean length {lengths.mean():.2f})"
    )
    sys.exit(0)


def memory_estimate(q_network, target_network, env, nstep, rb, args: Args, use_graph: bool):
    """Device memory: the Q-network, Adam, the target network, games, the n-step ring, the replay
    memory unless on the host; activations of 3 forwards of a batch or of acting on every game."""
    resident = [*target_network.parameters(), *env._bufs, env.ages, nstep.obs, nstep.next_obs]
    resident += rb.fields if rb.device == rb.target else ()
    # a step's observations (uint8), food draw
    fused = env.n * env.hw * (2 * 4 + 4) if env.mode == "fused" else 0
    return gpu_utils.estimate_memory(
        q_network,
        batch_bytes=args.batch_size * ReplayBuffer.transition_bytes(nstep.obs.shape[2:]),
        rollout_bytes=sum(t.nbytes for t in resident) + fused,
        example_input=nstep.obs[0, :1],
        batch_size=max(3 * args.batch_size, env.n),
        cudagraphs=use_graph,
    )


def graph_blocker(args: Args, env_mode: str, replay_on_host: bool) -> str:
    """Why the acting and training steps cannot be a CUDA graph each: each needs the host in it ("" if they can)."""
    frequency = args.target_network_frequency
    blockers = {
        "--buffer-device cpu puts the replay memory on the host": replay_on_host,
        f"--env-mode {env_mode}: only the fused step updates games in place": env_mode != "fused",
        "--target-network-frequency above 1 counts the updates on the host": frequency != 1,
    }
    return next((why for why, blocks in blockers.items() if blocks), "")


if __name__ == "__main__":
    # ---------------- arguments and their checks
    run_utils.stop_in_one_line()  # until the run has a folder: a stop signal ends the process at once, in one line
    args = tyro.cli(Args)
    given = dict(vars(args))
    with run_utils.one_line_errors():
        if args.eval_checkpoint:  # play its greedy policy, print the mean return and exit
            evaluate_checkpoint(args)
        ckpt = run_utils.resume(args, "dqn_snake_vec", RUNTIME_FLAGS)
        device, device_why = run_utils.select_device(args)
        validate(args, device)
    num_iterations = args.total_timesteps // args.num_envs
    run_utils.exit_if_done(ckpt, num_iterations, args.resume)

    # ---------------- device, threads, seeds
    cpu_share = gpu_utils.take_cpu_share(args.num_threads)  # threads capped, a share of the CPUs among live runs
    n, h, w = args.num_envs, args.height, args.width
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    total_steps = num_iterations * n
    run_utils.print_device(device, device_why, args.amp, cpu_share, "the games are torch ops too")
    run_utils.print_config(args, given, ckpt is not None, RUNTIME_FLAGS, total_steps)

    # ---------------- logging
    start_iteration = ckpt["iteration"] if ckpt else 0
    global_step = start_iteration * n
    run_name = f"Snake{h}x{w}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_name = ckpt["run_name"] if ckpt else run_name
    # from here on a stop signal stops the run after its iteration, with a checkpoint
    run_dir, writer, stop = run_utils.open_run(run_name, args, device, global_step, ckpt)
    pbar = tqdm(total=total_steps, initial=global_step, disable=not args.progress_bar, unit_scale=True)
    monitor = gpu_utils.GPUMonitor(device).start()

    # ---------------- env and network
    env_mode = "fused" if args.cudagraphs and args.env_mode == "auto" else args.env_mode
    # on a GPU the fused step draws from the device's default generator, which a CUDA graph advances
    fused_on_gpu = env_mode == "fused" and device.type == "cuda"
    generator = torch.cuda.default_generators[device.index] if fused_on_gpu else None
    env = VecSnake(n, h, w, device=device, seed=args.seed, generator=generator, mode=env_mode)
    obs = env.reset()
    q_network = QNetwork(h, w, amp=args.amp).to(device)
    target_network = QNetwork(h, w, amp=args.amp).to(device)
    target_network.load_state_dict(q_network.state_dict())
    params = list(q_network.parameters())
    target_params = list(target_network.parameters())
    buffer_device = torch.device("cpu") if args.buffer_device == "cpu" else device
    blocker = graph_blocker(args, env.mode, replay_on_host=buffer_device != device)
    use_graph = args.cudagraphs and not blocker
    optimizer = torch.optim.Adam(params, lr=args.learning_rate, fused=True, capturable=use_graph)
    # the run's states: saved in every checkpoint, loaded on --resume (the replay memory starts empty: --learning-starts
    # counts again)
    states = dict(model=q_network, target_network=target_network, optimizer=optimizer, env=env)
    if ckpt:
        run_utils.load_states(states, ckpt, args.resume, device=device)
        obs = env.observe()

    @torch.no_grad()
    def greedy_step(obs, epsilon):
        return epsilon_greedy(q_network(obs), epsilon)

    # --compile, --cudagraphs: the same step compiled; inside a captured step it compiles in mode default
    act = gpu_utils.compile_policy(greedy_step, args.compile or args.cudagraphs, args.cudagraphs and not use_graph)
    loss_fn = torch.compile(td_loss) if args.compile or args.cudagraphs else td_loss

    # ---------------- storage: replay memory (on the host with --buffer-device cpu), n-step ring
    rb = ReplayBuffer(args.buffer_size, (4, h, w), buffer_device, device)
    nstep = NStep(args.n_step, args.gamma, n, (4, h, w), device)
    memory = memory_estimate(q_network, target_network, env, nstep, rb, args, use_graph)
    print(memory)
    writer.add_scalar("memory/estimated_mib", memory.total / 2**20, global_step)
    # the per-episode means logged: info key -> chart
    episode_charts = dict(episode_return="episodic_return", episode_length="episodic_length")
    episode_charts |= dict(score="score", length="snake_length")
    # what a log window adds up on the device (no host copy until the window's end): games ended, the sums of the
    # episode charts' keys over them, and the TD loss, mean Q-value and number of the updates
    totals = {name: torch.zeros((), device=device) for name in ["episodes", *episode_charts]}
    totals |= {name: torch.zeros((), device=device) for name in ["td_loss", "q_values", "updates"]}
    epsilon_t = torch.zeros((), device=device)  # a device scalar: no recompiles, no host copy
    # gradient updates so far, on the host (so a graph needs frequency 1); on a resume, Adam's count
    past_updates = int(optimizer.state[params[0]]["step"]) if optimizer.state else 0
    update_count = itertools.count(past_updates + 1)

    def collect(obs, epsilon):
        """Act on every game, step them all, store the step in the n-step ring and its transitions in the replay
        memory; no host sync. Returns the next observations, game 0's last observation and whether its game ended."""
        actions = act(obs, epsilon)
        next_obs, rewards, terminated, truncated, info = env.step(actions)
        ended = terminated | truncated
        transitions = nstep.push(obs, actions, rewards, info["final_obs"], terminated, ended)
        if transitions is not None:
            rb.add(*transitions)
        ended_f = ended.float()
        episodes = torch.stack([ended_f, *(info[key] * ended_f for key in episode_charts)])
        torch._foreach_add_([totals["episodes"], *(totals[key] for key in episode_charts)], list(episodes.sum(1)))
        return next_obs, info["final_obs"][0], ended[0]

    def backward(samples, weight=1.0):
        """The TD loss's gradients over a replay batch (``weight``: its share of a split one); its statistics."""
        loss, stats = loss_fn(q_network, target_network, *samples)
        (loss * weight).backward()
        return stats

    # --micro-batch: the same gradients from backward passes over slices of the batch, halved on CUDA out of memory
    micro_batches = gpu_utils.MicroBatches(backward, args.micro_batch, args.batch_size, params)

    def train():
        """One TD update from a replay batch, then the target network a step toward the Q-network; no host sync."""
        samples = rb.sample(args.batch_size)
        optimizer.zero_grad(set_to_none=True)
        stats = micro_batches(samples)  # backward(samples), or over slices of them
        nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
        one_update = torch.ones_like(stats["td_loss"])
        update_totals = [totals["td_loss"], totals["q_values"], totals["updates"]]
        torch._foreach_add_(update_totals, [stats["td_loss"], stats["q_values"], one_update])
        if next(update_count) % args.target_network_frequency == 0:
            with torch.no_grad():
                torch._foreach_lerp_(target_params, params, args.tau)

    # --cudagraphs: the acting step and the training step as a CUDA graph each; the first captures once the n-step
    # ring is full (until then its push emits nothing on the host's count)
    collect_step = gpu_utils.CudaGraph(collect, enabled=use_graph, warmup=max(3, args.n_step), name="acting step")
    train_step = gpu_utils.CudaGraph(train, enabled=use_graph, name="training step")
    if args.cudagraphs and blocker:  # a capture says so itself ("training step: one CUDA graph")
        print(f"training step: eager ({blocker})")

    # ---------------- training loop: an iteration steps every game once, then updates the Q-network
    log_interval = max(1, args.log_every // n)
    learning_starts_at = start_iteration + -(-args.learning_starts // n)
    if learning_starts_at >= num_iterations:  # on purpose in tests' and speed tools' env-only runs
        late = f"{learning_starts_at * n:,}"
        print(f"note: learning starts at step {late}, after the run's end: it only acts")
    exploration_steps = max(args.exploration_fraction * args.total_timesteps, 1)
    recorder = run_utils.VideoRecorder(run_dir, global_step, fps=10) if args.capture_video else None
    # game 0's observation after each step of this log window, and whether its game ended
    video = []
    diverged = False  # NaN or infinite weights after an update: the run stops without saving them
    started = time.time()
    window_start = time.perf_counter()
    last_log_iteration = iteration = start_iteration
    while iteration < num_iterations:
        decayed = args.start_e + (args.end_e - args.start_e) * global_step / exploration_steps
        epsilon = max(args.end_e, decayed)
        epsilon_t.fill_(epsilon)
        # learning starts once the replay memory holds a batch: of every game, this leg's steps but the first n - 1,
        # which only fill the n-step ring
        stored = n * max(0, iteration - start_iteration - (args.n_step - 1))
        learning = iteration >= learning_starts_at and stored >= args.batch_size
        obs, final_obs, ended = collect_step(obs, epsilon_t)  # act, step every game, store the step
        if learning:
            for _ in range(args.updates_per_step):
                train_step()  # a TD update from a replay batch
        if recorder is not None:  # the frames stay on the device until the window's one host copy
            video.append((final_obs.clone(), ended.clone()))
        iteration += 1
        global_step += n

        # ---------------- logging: one host pull of scalars per log window, by name (a checkpoint ends one)
        stopping = bool(stop)
        finished = iteration == num_iterations
        save_now = (args.checkpoint_every and iteration % args.checkpoint_every == 0) or stopping or finished
        if iteration % log_interval == 0 or save_now:
            # the weights are checked before a checkpoint could save them
            finite = torch.stack([p.isfinite().all() for p in params]).all().float()
            window = dict(zip([*totals, "weights_finite"], torch.stack([*totals.values(), finite]).tolist()))
            diverged = not window["weights_finite"]
            logs = {"charts/epsilon": epsilon, "charts/learning_rate": args.learning_rate}
            text = f"eps {epsilon:.2f}, return -"
            # charts/episodes: the games the means are over, by which a report weighs windows
            if window["episodes"]:
                for key, chart in episode_charts.items():
                    logs[f"charts/{chart}"] = window[key] / window["episodes"]
                logs["charts/episodes"] = window["episodes"]
                text = f"eps {epsilon:.2f}, return {logs['charts/episodic_return']:.2f}"
                text += f", length {logs['charts/snake_length']:.1f}"
            if window["updates"]:
                logs["losses/td_loss"] = window["td_loss"] / window["updates"]
                logs["losses/q_values"] = window["q_values"] / window["updates"]
            logs["memory/micro_batch"] = micro_batches.rows
            sps = (iteration - last_log_iteration) * n / (time.perf_counter() - window_start)
            # the first window is warm-up (compiling, capture)
            if last_log_iteration > start_iteration:
                logs["charts/SPS"] = sps
            for key, value in logs.items():
                writer.add_scalar(key, value, global_step)
            run_utils.log_machine(writer, global_step, cpu_share, monitor)
            pbar.set_postfix_str(f"SPS={sps:,.0f} {text}", refresh=False)
            pbar.update(global_step - pbar.n)
            if not args.progress_bar:
                print(f"iteration {iteration}/{num_iterations}: step {global_step}, SPS {sps:,.0f}, {text}")
            if video:
                frames = torch.stack([frame for frame, _ in video]).cpu().numpy()
                game_overs = torch.stack([end for _, end in video]).tolist()
                for frame, game_over in zip(frames, game_overs):
                    recorder.add(snake_view(frame), game_over)
                video.clear()
            torch._foreach_zero_(list(totals.values()))
            window_start = time.perf_counter()
            last_log_iteration = iteration
        # its non-finite losses are logged above; the checkpoint keeps the last finite weights
        if diverged:
            break
        if save_now:
            run_utils.save_checkpoint(
                os.path.join(run_dir, "checkpoint.pt"),
                script="dqn_snake_vec",
                args=vars(args),
                status="finished" if finished else "stopped" if stopping else "running",
                rng=[gpu_utils.rng_state(device)],
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
    monitor.close()
    cpu_share.close()  # its CPUs to the other live runs
    model = dict(script="dqn_snake_vec", args=vars(args), model=q_network.state_dict())
    model = model if args.save_model and iteration == num_iterations else None  # --save-model
    run_utils.end_run(writer, run_dir, global_step, total_steps, started, diverged, model)
