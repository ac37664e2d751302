# DQN on N Snake games that live as tensors on one device (GPU when present) and step together.
# Double DQN, target network (hard or Polyak), Huber loss, linear epsilon, optional n-step returns.
import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

import gpu_utils


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    gpu: str = "auto"
    """auto (a GPU when present), true (a GPU or an error), false (CPU), N or cuda:N (exactly that GPU)"""
    cuda_offset: int | None = None
    """first GPU index for --gpu auto/true rotation (default: the CUDA_OFFSET environment variable, else 0)"""
    session: int = 0
    """run number; with --gpu auto/true the GPU is (cuda_offset + session) % device count"""
    tf32: bool = True
    """allow TF32 matmuls and convolutions on GPUs that have them"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "gpu-rl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record episodes of game 0 to `videos/<run_name>` (every --video-every iterations)"""
    video_every: int = 5000
    """record game 0's next episode every this many iterations (with --capture-video; host syncs while armed)"""
    num_threads: int = 0
    """torch CPU threads (0: leave torch's default)"""

    # Snake
    num_envs: int = 256
    """the number of Snake games stepped together on the device"""
    height: int = 10
    """board height (cells, at least 3)"""
    width: int = 10
    """board width (cells, at least 3)"""
    env_mode: str = "auto"
    """VecSnake mode: dense (no host sync; GPU default), sparse (only the boards that need it; CPU default), auto"""

    # DQN
    total_timesteps: int = 5_000_000
    """total env steps (summed over all games)"""
    learning_rate: float = 5e-4
    """the learning rate of the Adam optimizer"""
    buffer_size: int = 500_000
    """the replay memory size in transitions"""
    buffer_device: str = "auto"
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
    """gradient updates per vector step (replay ratio = updates_per_step * batch_size / num_envs)"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.02
    """the ending epsilon for exploration"""
    exploration_fraction: float = 0.2
    """the fraction of `total_timesteps` it takes from start-e to go end-e"""
    learning_starts: int = 20_000
    """env steps (summed over games) collected before learning starts, also after a resume"""
    max_grad_norm: float = 10.0
    """gradient clipping norm"""

    # speed, saving, logging
    compile: bool = False
    """torch.compile the network update and action selection"""
    cudagraphs: bool = False
    """capture the update in CUDA graphs (torch.compile mode reduce-overhead); ignored on CPU"""
    amp: bool = False
    """bf16 autocast for the network on GPU; ignored on CPU"""
    log_every: int = 25_600
    """env steps between scalar logs (whole iterations); charts/SPS: env steps/s with learning on in that window"""
    checkpoint_every: int = 10_000
    """iterations (vector steps) between checkpoints (0: only at the end and on SIGINT/SIGTERM)"""
    resume: str | None = None
    """checkpoint path to resume from (same run directory, same total)"""
    save_model: bool = False
    """save the Q-network to runs/<run_name>/<exp_name>.model at the end"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint or saved model greedily and exit, no training"""
    eval_episodes: int = 10
    """episodes for --eval-checkpoint (one game per episode, played in parallel)"""
    eval_epsilon: float = 0.0
    """epsilon of the evaluation policy"""
    progress_bar: bool = True
    """show a tqdm progress bar"""


UP, RIGHT, DOWN, LEFT = 0, 1, 2, 3


class VecSnake:
    """N Snake games of H x W cells as tensors on one device, stepped together without Python loops.

    ``ages`` (N, H*W + 1): 0 empty, tail 1 ... head = length; the extra last column is a wall that every off-board
    move lands on. Actions are absolute (0 up, 1 right, 2 down, 3 left; reversing into the neck goes straight).
    Eating: +1 and grow by one. Wall or body (the cell the tail leaves is free): -1, game over, the board as before
    the move. A full board wins; 2*H*W steps without food truncate. Finished games restart in place (uniform start
    and food); ``info["final_obs"]`` is the true last observation. ``mode``: dense (masks over every board, no host
    sync; GPU default) or sparse (only the boards that need food or a reset; CPU default).
    """

    def __init__(self, num_envs, height=10, width=10, device="cpu", seed=0, generator=None, mode="auto"):
        if height < 3 or width < 3:
            raise ValueError(f"the board must be at least 3 x 3, got {height} x {width}")
        if mode not in ("auto", "dense", "sparse"):
            raise ValueError(f"mode must be auto, dense or sparse, got {mode!r}")
        self.n, self.h, self.w, self.hw = num_envs, height, width, height * width
        self.device = torch.device(device)
        self.gen = generator if generator is not None else torch.Generator(self.device).manual_seed(seed)
        self.mode = ("dense" if self.device.type == "cuda" else "sparse") if mode == "auto" else mode
        # the smallest integer type that holds the longest snake (int8 on boards up to 125 cells)
        self.dtype = torch.int8 if self.hw < 2**7 - 1 else torch.int16 if self.hw < 2**15 - 1 else torch.int32
        kw, hw, w = dict(device=self.device), self.hw, self.w
        # NEXT[cell, action]: the cell the head moves to, or hw (the wall cell) off the board
        r, c = torch.arange(hw) // w, torch.arange(hw) % w
        nxt = [torch.where(r > 0, r * w + c - w, hw), torch.where(c < w - 1, r * w + c + 1, hw)]
        nxt += [torch.where(r < self.h - 1, r * w + c + w, hw), torch.where(c > 0, r * w + c - 1, hw)]
        self._next = torch.stack(nxt, 1).to(self.device)
        # TURN[direction, action]: the action taken, with a reverse into the neck replaced by going straight
        self._turn_table = torch.tensor([[a if a != (d + 2) % 4 else d for a in range(4)] for d in range(4)], **kw)
        starts = []  # every valid start: head cell, heading, the 3 body cells head first, the same 3 sorted
        for d, (dr, dc) in enumerate([(-1, 0), (0, 1), (1, 0), (0, -1)]):
            for r, c in (divmod(cell, w) for cell in range(hw)):
                if 0 <= r - 2 * dr < self.h and 0 <= c - 2 * dc < w:
                    cells = [(r - k * dr) * w + c - k * dc for k in range(3)]
                    starts.append([cells[0], d, *cells, *sorted(cells)])
        self._starts = torch.tensor(starts, **kw)
        self._start_ages = torch.tensor([[3, 2, 1]], dtype=self.dtype, **kw)
        self.ages = torch.zeros(self.n, hw + 1, dtype=self.dtype, **kw)
        self.ages[:, hw] = torch.iinfo(self.dtype).max
        self.board = self.ages[:, :hw]  # view of the real cells
        z = torch.zeros(self.n, dtype=torch.long, **kw)
        self.head, self.direction, self.food = z.clone(), z.clone(), z.clone()
        self.length = torch.zeros(self.n, dtype=self.dtype, **kw)
        self.since_food, self.score, self.ep_len = z.int(), z.int(), z.int()
        self.ep_return = torch.zeros(self.n, **kw)
        # 4 plane-major observation buffers used in turn (final and next, two steps deep): no allocation per step,
        # and only the head and food marks of the buffer's last use need clearing
        self._bufs = [torch.zeros(4, self.n, hw, dtype=torch.uint8, **kw) for _ in range(4)]
        self._row_base = torch.arange(self.n, **kw) * hw
        self._marks = [(self._row_base, self._row_base) for _ in range(4)]  # where each buffer has head and food
        self._turn = 0

    def reset(self):
        """Start every game afresh; returns the observation (N, 4, H, W) uint8."""
        self._reset_games(torch.ones(self.n, dtype=torch.bool, device=self.device))
        self._turn ^= 1
        return self.observe(2 * self._turn + 1)

    def observe(self, k=None, food_visible=None):
        """(N, 4, H, W) uint8 planes: head, body (head included), food, ages; a view of a fresh buffer or of ``k``."""
        head, food = self._row_base + self.head, self._row_base + self.food  # flat cells of each plane
        if k is None:
            buf = torch.zeros(4, self.n, self.hw, dtype=torch.uint8, device=self.device)
        else:
            buf = self._bufs[k]
            buf[0].view(-1).index_fill_(0, self._marks[k][0], 0)
            buf[2].view(-1).index_fill_(0, self._marks[k][1], 0)
            self._marks[k] = head, food
        buf[3].copy_(self.board if self.hw < 256 else self.board.clamp(max=255))
        torch.clamp(buf[3], max=1, out=buf[1])
        buf[0].view(-1).index_fill_(0, head, 1)
        if food_visible is None:
            buf[2].view(-1).index_fill_(0, food, 1)
        else:
            buf[2].view(-1).index_put_((food,), food_visible.to(torch.uint8))
        return buf.view(4, self.n, self.h, self.w).transpose(0, 1)

    def step(self, actions):
        """Advance every game one step. Returns next_obs, reward, terminated, truncated, info: final_obs (before any
        reset), score (food eaten), length, episode_return, episode_length, as at the end of this step.
        Observations are views of buffers that the env reuses two steps later: clone them to keep them longer.
        """
        a = self._turn_table[self.direction, actions]
        nxt = self._next[self.head, a]
        cell = self.ages.gather(1, nxt.unsqueeze(1)).squeeze(1)
        dead = cell > 1  # the wall cell, or the body; age 1 is the tail, which moves on unless the snake eats
        alive = ~dead
        eat = nxt == self.food  # food is never on the snake, so an eating move is always legal
        self.length += eat
        self.board.sub_((alive ^ eat).to(self.dtype).unsqueeze(1)).clamp_min_(0)  # the tail advances
        self.ages.scatter_(1, nxt.unsqueeze(1), torch.where(alive, self.length, cell).unsqueeze(1))
        self.head = torch.where(alive, nxt, self.head)
        self.direction = torch.where(alive, a, self.direction)
        self.since_food.add_(1).mul_(~eat)
        self.ep_len += 1
        win = self.length == self.hw
        terminated = dead | win
        truncated = (self.since_food >= 2 * self.hw) & alive
        reward = eat.float() - dead.float()
        self.score += eat
        self.ep_return += reward
        self._place_food(eat & ~win)
        self._turn ^= 1
        info = dict(score=self.score, length=self.length, episode_return=self.ep_return, episode_length=self.ep_len)
        info = {k: v.clone() for k, v in info.items()} | dict(final_obs=self.observe(2 * self._turn, food_visible=~win))
        self._reset_games(terminated | truncated)
        return self.observe(2 * self._turn + 1), reward, terminated, truncated, info

    def _set(self, mask, rows, **values):
        """Set state of the games in ``mask`` (dense: every game through ``torch.where``; sparse: the ``rows``)."""
        for key, value in values.items():
            if self.mode == "dense":
                setattr(self, key, torch.where(mask, value, getattr(self, key)))
            else:
                getattr(self, key)[rows] = value

    def _place_food(self, mask):
        """Put food on a uniformly random empty cell of every game where ``mask`` is set."""
        rows = slice(None) if self.mode == "dense" else mask.nonzero().squeeze(1)
        board = self.board[rows]
        if len(board):
            scores = torch.rand(len(board), self.hw, device=self.device, generator=self.gen).masked_fill_(board > 0, -1)
            self._set(mask, rows, food=scores.argmax(1))

    def _reset_games(self, done):
        """Restart the games where ``done``: a uniformly random start, food on a uniformly random other cell."""
        rows = slice(None) if self.mode == "dense" else done.nonzero().squeeze(1)
        m = self.n if self.mode == "dense" else len(rows)
        if m == 0:
            return
        free = self.hw - 3
        pick = torch.randint(0, len(self._starts) * free, (m,), device=self.device, generator=self.gen)
        start = self._starts[pick // free]
        food = pick % free  # the food is the k-th cell not on the snake: skip the sorted body cells
        for j in (5, 6, 7):
            food += food >= start[:, j]
        if self.mode == "dense":
            self.board.mul_((~done).unsqueeze(1))
            self.ages.scatter_add_(1, start[:, 2:5], self._start_ages * done.unsqueeze(1))
        else:
            self.board[rows] = 0
            self.ages[rows.unsqueeze(1), start[:, 2:5]] = self._start_ages
        new = dict(head=start[:, 0], direction=start[:, 1], food=food, length=3, since_food=0, score=0, ep_len=0)
        self._set(done, rows, ep_return=0.0, **new)

    def set_game(self, i, body, direction, food):
        """Put game ``i`` in a given state (tests, demos): ``body`` lists (row, col) cells head first."""
        self.board[i] = 0
        for k, (r, c) in enumerate(body):
            self.board[i, r * self.w + c] = len(body) - k
        self.head[i], self.direction[i] = body[0][0] * self.w + body[0][1], direction
        self.food[i] = food[0] * self.w + food[1]
        self.length[i], self.since_food[i], self.score[i], self.ep_len[i], self.ep_return[i] = len(body), 0, 0, 0, 0

    def render(self, i=0, obs=None, cell=16):
        """RGB uint8 (H*cell, W*cell, 3) frame of game ``i`` (``obs`` or the current state): head yellow, food red."""
        planes = (self.observe() if obs is None else obs)[i].cpu().numpy().astype(np.float32)
        ages, body = planes[3], planes[1] > 0
        img = np.full((self.h, self.w, 3), (30, 30, 40), dtype=np.uint8)
        img[body] = (20, 0, 40)
        img[body, 1] = (90 + 140 * ages[body] / max(ages.max(), 1)).astype(np.uint8)
        img[planes[2] > 0] = (230, 40, 40)
        img[planes[0] > 0] = (250, 220, 40)
        return np.kron(img, np.ones((cell, cell, 1), dtype=np.uint8))

    _state_names = ("ages", "head", "direction", "food", "length", "since_food", "score", "ep_len", "ep_return")

    def state_dict(self):
        return {k: getattr(self, k).cpu() for k in self._state_names} | {"generator": self.gen.get_state()}

    def load_state_dict(self, state):
        for k in self._state_names:
            getattr(self, k).copy_(state[k])
        self.gen.set_state(state["generator"])


class QNetwork(nn.Module):
    """Small ConvNet: 3x3 conv 32, 3x3 conv 32 stride 2, FC 256, one Q-value per action. Input: uint8 planes."""

    def __init__(self, height, width, num_actions=4, planes=4):
        super().__init__()
        # head, body and food planes are 0/1; the body-order plane holds ages up to H*W: scale it to [0, 1]
        self.register_buffer("scale", torch.tensor([1.0, 1.0, 1.0, 1.0 / min(height * width, 255)]).view(1, 4, 1, 1))
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
        return self.network(x.float() * self.scale)


def epsilon_greedy(q_values, epsilon):
    """The greedy action, or a uniformly random one with probability ``epsilon`` (a float or a device scalar)."""
    explore = torch.rand(q_values.shape[0], device=q_values.device) < epsilon
    return torch.where(explore, torch.randint(0, 4, explore.shape, device=q_values.device), q_values.argmax(1))


class NStep:
    """Ring of the last n steps of N games; once full, each push emits the n-step transition that started n-1 pushes
    ago: R = sum_k gamma^k r_k up to the first step that ended the episode, the true observation after that step,
    whether it was a termination, and the bootstrap discount gamma^(steps used)."""

    def __init__(self, n, gamma, num_envs, obs_shape, device):
        self.n, self.gamma, self.t = n, gamma, 0
        kw = dict(device=device)
        self.obs, self.next_obs = (torch.zeros(n, num_envs, *obs_shape, dtype=torch.uint8, **kw) for _ in range(2))
        self.actions, self.rewards = torch.zeros(n, num_envs, dtype=torch.long, **kw), torch.zeros(n, num_envs, **kw)
        self.terminated, self.ended = (torch.zeros(n, num_envs, dtype=torch.bool, **kw) for _ in range(2))

    def push(self, obs, actions, rewards, next_obs, terminated, ended):
        """Add one step (next_obs: the true observation after it); returns an n-step batch, or None while filling."""
        j = self.t % self.n
        self.obs[j], self.next_obs[j], self.actions[j] = obs, next_obs, actions
        self.rewards[j], self.terminated[j], self.ended[j] = rewards, terminated, ended
        self.t += 1
        if self.t < self.n:
            return None
        first = self.t % self.n  # the oldest step in the ring; j is the newest
        ret, running = torch.zeros_like(rewards), torch.ones_like(ended)  # running: no end seen yet
        nxt, term, disc = self.next_obs[j], self.terminated[j], torch.full_like(rewards, self.gamma**self.n)
        for k in range(self.n):
            i = (first + k) % self.n
            ret += running * self.gamma**k * self.rewards[i]
            stop = running & self.ended[i]
            nxt = torch.where(stop.view(-1, 1, 1, 1), self.next_obs[i], nxt)
            term = torch.where(stop, self.terminated[i], term)
            disc = torch.where(stop, self.gamma ** (k + 1), disc)
            running &= ~self.ended[i]
        return self.obs[first].clone(), self.actions[first].clone(), ret, nxt, term, disc


class ReplayBuffer:
    """Preallocated replay memory of uint8 observations on the training device, or in pinned host memory
    (``device`` cpu) with sampled batches moved to ``target`` by non-blocking copies."""

    def __init__(self, capacity, obs_shape, device, target):
        self.capacity, self.device, self.target, self.ptr, self.size = capacity, device, target, 0, 0
        self.pin = device.type == "cpu" and target.type == "cuda"
        kw = dict(device=device, pin_memory=self.pin)
        self.obs, self.next_obs = (torch.zeros(capacity, *obs_shape, dtype=torch.uint8, **kw) for _ in range(2))
        self.actions = torch.zeros(capacity, dtype=torch.long, **kw)
        self.rewards, self.discounts = torch.zeros(capacity, **kw), torch.zeros(capacity, **kw)
        self.terminated = torch.zeros(capacity, dtype=torch.bool, **kw)
        self.fields = (self.obs, self.actions, self.rewards, self.next_obs, self.terminated, self.discounts)

    def add(self, *batch):
        """Add a batch of transitions (obs, actions, rewards, next_obs, terminated, discounts), wrapping around."""
        n = batch[0].shape[0]
        idx = (torch.arange(n, device=self.device) + self.ptr) % self.capacity
        for store, value in zip(self.fields, batch):
            store.index_copy_(0, idx, value.to(self.device))
        self.ptr = (self.ptr + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size, generator=None):
        idx = torch.randint(0, self.size, (batch_size,), device=self.device, generator=generator)
        out = [store[idx] for store in self.fields]
        return [t.pin_memory().to(self.target, non_blocking=True) for t in out] if self.pin else out


def load_checkpoint(path, what="checkpoint"):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} {path} not found; pass the path of a checkpoint.pt or .model file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ValueError(f"{what} {path} could not be read ({type(exc).__name__}); not a dqn_snake_vec file?") from None
    if not isinstance(ckpt, dict) or "q_network" not in ckpt or "args" not in ckpt:
        raise ValueError(f"{what} {path} is not a dqn_snake_vec checkpoint (no q_network/args)")
    return ckpt


def validate(args):
    h, w, n, bs, buf = args.height, args.width, args.num_envs, args.batch_size, args.buffer_size
    where, mode = args.buffer_device, args.env_mode
    for bad, message in [
        (h < 3 or w < 3, f"--height and --width must be at least 3, got {h} x {w}"),
        (n < 1, f"--num-envs must be at least 1, got {n}"),
        (args.total_timesteps < n, f"--total-timesteps must be at least --num-envs ({n})"),
        (args.n_step < 1, f"--n-step must be at least 1, got {args.n_step}"),
        (not 0 < args.gamma <= 1 or not 0 < args.tau <= 1, "--gamma and --tau must be in (0, 1]"),
        (bs < 1 or buf < max(bs, n), f"--buffer-size ({buf}) must hold at least --batch-size and --num-envs"),
        (args.updates_per_step < 0, "--updates-per-step must be at least 0"),
        (args.target_network_frequency < 1, "--target-network-frequency must be at least 1"),
        (where not in ("auto", "cpu"), f"--buffer-device must be auto or cpu, got {where!r}"),
        (not 0 < args.exploration_fraction <= 1, "--exploration-fraction must be in (0, 1]"),
        (args.eval_episodes < 1, "--eval-episodes must be at least 1"),
        (mode not in ("auto", "dense", "sparse"), f"--env-mode must be auto, dense or sparse, got {mode!r}"),
    ]:
        if bad:
            raise ValueError(message)


RUNTIME_FLAGS = ("gpu", "cuda_offset", "session", "tf32", "track", "progress_bar", "compile", "cudagraphs", "amp")
RUNTIME_FLAGS += ("checkpoint_every", "log_every", "resume", "save_model", "num_threads", "capture_video", "env_mode")


def resume_args(args, saved):
    """Take the checkpointed run's settings, except how and where it runs; the board and game count must match."""
    for key in ("height", "width", "num_envs", "n_step"):
        if saved.get(key) != getattr(args, key):
            raise ValueError(f"--resume: checkpoint has {key}={saved.get(key)}, not {getattr(args, key)}")
    for key, value in saved.items():
        if key not in RUNTIME_FLAGS and hasattr(args, key):
            setattr(args, key, value)


def evaluate(args, ckpt, device):
    """Greedy (epsilon --eval-epsilon) play of --eval-episodes games in parallel; one episode each."""
    h, w = ckpt["args"]["height"], ckpt["args"]["width"]
    q_network = QNetwork(h, w).to(device)
    try:
        q_network.load_state_dict(ckpt["q_network"])
    except RuntimeError as exc:
        raise ValueError(f"{args.eval_checkpoint} does not fit the Q-network ({str(exc).splitlines()[0]})") from None
    n = args.eval_episodes
    env = VecSnake(n, h, w, device=device, seed=args.seed, mode=args.env_mode)
    obs, finished = env.reset(), torch.zeros(n, dtype=torch.bool, device=device)
    stats = torch.zeros(3, n, device=device)  # return, score and final length of each game's first episode
    while not bool(finished.all()):
        with torch.no_grad():
            obs, _, terminated, truncated, info = env.step(epsilon_greedy(q_network(obs), args.eval_epsilon))
        new = (terminated | truncated) & ~finished
        stats = torch.where(new, torch.stack([info[k].float() for k in ("episode_return", "score", "length")]), stats)
        finished |= new
    r, scores, lengths = stats.cpu().numpy()
    print(
        f"eval Snake{h}x{w}: mean_return={r.mean():.2f} std_return={r.std():.2f} "
        f"mean_score={scores.mean():.2f} mean_length={lengths.mean():.2f} over {n} episodes"
    )


if __name__ == "__main__":
    args = tyro.cli(Args)
    try:
        validate(args)
        device = gpu_utils.select_device(args.gpu, args.session, args.cuda_offset)
        cuda = device.type == "cuda"
        ckpt = load_checkpoint(args.resume, "--resume checkpoint") if args.resume else None
        if ckpt is not None:
            resume_args(args, ckpt["args"])
        if args.num_threads > 0:
            gpu_utils.limit_threads(args.num_threads)
        if cuda:
            torch.cuda.set_device(device)
        gpu_utils.enable_tf32(args.tf32)
        for flag in ("cudagraphs", "amp"):
            if getattr(args, flag) and not cuda:
                print(f"note: --{flag} applies on a GPU only; ignored on {device}")
        torch.manual_seed(args.seed)
        np.random.seed(args.seed)
        torch.backends.cudnn.deterministic = args.torch_deterministic
        if args.eval_checkpoint:
            evaluate(args, load_checkpoint(args.eval_checkpoint, "--eval-checkpoint"), device)
            sys.exit(0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

    n, h, w = args.num_envs, args.height, args.width
    run_name = ckpt["run_name"] if ckpt else f"Snake{h}x{w}__{args.exp_name}__{args.seed}__{int(time.time())}"
    from torch.utils.tensorboard import SummaryWriter

    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True, config=vars(args),
                   name=run_name, save_code=True, id=(ckpt or {}).get("wandb_id"), resume="allow")  # fmt: skip
    writer = SummaryWriter(f"runs/{run_name}")
    table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)

    # ---------------- env, networks, replay ----------------
    env = VecSnake(n, h, w, device=device, seed=args.seed, mode=args.env_mode)
    obs = env.reset()
    q_network, target_network = QNetwork(h, w).to(device), QNetwork(h, w).to(device)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    buffer_device = torch.device("cpu") if args.buffer_device == "cpu" else device
    rb = ReplayBuffer(args.buffer_size, (4, h, w), buffer_device, device)
    nstep = NStep(args.n_step, args.gamma, n, (4, h, w), device)
    num_iterations, start_iteration = args.total_timesteps // n, 0
    stateful = dict(q_network=q_network, target_network=target_network, optimizer=optimizer, env=env)  # checkpointed
    if ckpt is not None:
        for key, module in stateful.items():
            module.load_state_dict(ckpt[key])
        obs = env.observe()
        torch.set_rng_state(ckpt["rng"])
        if cuda and ckpt.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(ckpt["cuda_rng"], device)
        start_iteration = ckpt["iteration"]
        print(f"resumed {run_name} at step {ckpt['global_step']} (the replay memory starts empty)")

    # on the device besides the Q-network and Adam: replay (unless on the host), target net, env and n-step obs
    resident = [*target_network.parameters(), *env._bufs, env.ages, nstep.obs, nstep.next_obs]
    resident += rb.fields if buffer_device == device else ()
    batch_bytes, rollout_bytes = args.batch_size * (8 * h * w + 17), sum(t.nbytes for t in resident)
    est = gpu_utils.estimate_memory(q_network, "adam", batch_bytes, rollout_bytes, None, obs[:1], 3 * args.batch_size)
    print(est)
    writer.add_scalar("memory/estimated_mib", est.total / 2**20, 0)

    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp and cuda)

    def update(obs, actions, rewards, next_obs, terminated, discounts):
        with torch.no_grad(), autocast:
            next_actions = q_network(next_obs).argmax(1, keepdim=True)  # Double DQN: online net picks,
            next_q = target_network(next_obs).gather(1, next_actions).squeeze(1).float()  # target net rates
        td_target = rewards + discounts * next_q * (~terminated)
        with autocast:
            q = q_network(obs).gather(1, actions.unsqueeze(1)).squeeze(1).float()
        loss = F.smooth_l1_loss(q, td_target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
        optimizer.step()
        return loss.detach(), q.detach().mean()

    def act(obs, epsilon):
        with torch.no_grad(), autocast:
            return epsilon_greedy(q_network(obs), epsilon)

    if args.compile or (args.cudagraphs and cuda):
        mode = "reduce-overhead" if args.cudagraphs and cuda else None
        update, act = torch.compile(update, mode=mode), torch.compile(act, mode=mode)
    target_params, online_params = list(target_network.parameters()), list(q_network.parameters())
    epsilon_t = torch.zeros((), device=device)

    stop = {"signal": None}
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.update(signal=signal.Signals(signum).name))

    def save_checkpoint(iteration, status):
        path = f"runs/{run_name}/checkpoint.pt"
        state = {key: module.state_dict() for key, module in stateful.items()}
        state.update(iteration=iteration, global_step=iteration * n, args=vars(args), run_name=run_name,
                     rng=torch.get_rng_state(), cuda_rng=torch.cuda.get_rng_state(device) if cuda else None,
                     wandb_id=wandb.run.id if args.track else None, status=status)  # fmt: skip
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
        return path

    from tqdm import tqdm

    log_interval = max(1, args.log_every // n)
    learning_starts_iteration = start_iteration + -(-args.learning_starts // n)
    exploration_steps = max(args.exploration_fraction * args.total_timesteps, 1)  # linear epsilon decay
    pbar = tqdm(total=num_iterations * n, initial=start_iteration * n, disable=not args.progress_bar, unit="step",
                unit_scale=True, dynamic_ncols=True)  # fmt: skip
    # info key -> chart name of the per-episode means logged; ep_stats: finished episodes, then their sums
    episode_charts = dict(episode_return="episodic_return", episode_length="episodic_length", score="score")
    episode_charts["length"] = "snake_length"
    ep_stats = torch.zeros(5, device=device)
    train_stats = torch.zeros(3, device=device)  # updates, td loss, q-value
    video_state, frames = "off", []
    monitor = gpu_utils.GPUMonitor(device).start()
    t_log, last_log_iteration, iteration, num_updates = time.perf_counter(), start_iteration, start_iteration, 0
    while iteration < num_iterations:
        epsilon = max(args.end_e, args.start_e + (args.end_e - args.start_e) * iteration * n / exploration_steps)
        actions = act(obs, epsilon_t.fill_(epsilon))  # a device scalar: no recompiles, no host copy
        next_obs, rewards, terminated, truncated, info = env.step(actions)
        ended = terminated | truncated
        batch = nstep.push(obs, actions, rewards, info["final_obs"], terminated, ended)
        if batch is not None:
            rb.add(*batch)
        endf = ended.float()
        ep_stats += torch.stack([endf, *(info[k] * endf for k in episode_charts)]).sum(1)
        if args.capture_video:
            if video_state == "off" and iteration % args.video_every == 0:
                video_state = "armed"  # record game 0's next episode from its first frame
            if video_state == "on":
                frames.append(env.render(0, info["final_obs"]))
            if video_state == "armed" and bool(ended[0]):
                video_state, frames = "on", [env.render(0, next_obs)]
            elif video_state == "on" and bool(ended[0]):
                from moviepy import ImageSequenceClip

                os.makedirs(f"videos/{run_name}", exist_ok=True)
                path = f"videos/{run_name}/step{(iteration + 1) * n}.mp4"
                ImageSequenceClip(frames, fps=10).write_videofile(path, logger=None)
                if args.track:
                    wandb.log({"videos": wandb.Video(path)}, commit=False)
                video_state, frames = "off", []
        obs = next_obs
        iteration += 1
        if iteration >= learning_starts_iteration and rb.size >= args.batch_size:
            for _ in range(args.updates_per_step):
                loss, q_mean = update(*rb.sample(args.batch_size))
                train_stats += torch.stack([torch.ones_like(loss), loss, q_mean])
                num_updates += 1
                if num_updates % args.target_network_frequency == 0:
                    with torch.no_grad():
                        torch._foreach_lerp_(target_params, online_params, args.tau)

        if iteration % log_interval == 0 or iteration == num_iterations or stop["signal"]:
            global_step = iteration * n
            (count, *sums), (ups, loss, q_mean) = ep_stats.tolist(), train_stats.tolist()
            sps = (iteration - last_log_iteration) * n / (time.perf_counter() - t_log)
            logs = {"charts/SPS": sps, "charts/epsilon": epsilon, "charts/learning_rate": args.learning_rate}
            if count:
                logs.update({f"charts/{key}": value / count for key, value in zip(episode_charts.values(), sums)})
            if ups:
                logs.update({"losses/td_loss": loss / ups, "losses/q_values": q_mean / ups})
            for key, value in {**logs, **monitor.collect()}.items():
                writer.add_scalar(key, value, global_step)
            postfix = f"SPS={sps:,.0f} eps={epsilon:.2f}"
            if count:
                postfix += f" score={logs['charts/score']:.2f} length={logs['charts/snake_length']:.1f}"
            pbar.update(global_step - pbar.n)
            pbar.set_postfix_str(postfix, refresh=False)
            if not args.progress_bar:
                print(f"step={global_step} {postfix}")
            ep_stats.zero_()
            train_stats.zero_()
            t_log, last_log_iteration = time.perf_counter(), iteration
        if stop["signal"]:
            path = save_checkpoint(iteration, "stopped")
            print(
                f"stopping on {stop['signal']}: checkpoint at step {iteration * n}; "
                f"continue with: python {sys.argv[0]} --resume {path}"
            )
            break
        if args.checkpoint_every and iteration % args.checkpoint_every == 0:
            save_checkpoint(iteration, "running")

    pbar.close()
    if not stop["signal"]:
        save_checkpoint(iteration, "finished")
        if args.save_model:
            path = f"runs/{run_name}/{args.exp_name}.model"
            torch.save(dict(q_network=q_network.state_dict(), args=vars(args), run_name=run_name), path)
            print(f"model saved to {path}")
    if cuda:
        peak = torch.cuda.max_memory_allocated(device) / 2**20
        writer.add_scalar("memory/peak_allocated_mib", peak, iteration * n)
        print(f"peak GPU memory allocated: {peak:.1f} MiB (estimate {est.total / 2**20:.1f} MiB)")
    monitor.close()
    writer.close()
    if args.track:
        wandb.finish()
