# PPO on Atari (ALE v5) with the Nature ConvNet, CleanRL style, built to keep one GPU (or a CPU) busy.
# Envs step in ale-py's C++ vector env (threads, no Python loop over envs); rollout storage lives on the device.
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from typing import Literal

import ale_py  # importing it registers the ALE/<Game>-v5 ids with gymnasium
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
import tyro
from PIL import Image
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

import gpu_utils


@dataclass
class Args:
    """PPO on ALE v5 Atari games. charts/SPS = agent steps per second (all processes) over the latest iteration,
    rollout + update, logged from the second iteration after start or resume (the first is warm-up)."""

    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (process rank r under torchrun uses seed + r)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    gpu: str = "auto"
    """auto (a GPU if there is one), true (a GPU or an error), false (CPU), or a GPU index N / cuda:N"""
    cuda_offset: int | None = None
    """first GPU of the rotation (None: env CUDA_OFFSET, else 0)"""
    session: int = 0
    """run number; runs rotate over the GPUs as (cuda_offset + session) % num_gpus"""
    tf32: bool = True
    """allow TF32 matmuls/convolutions on GPUs that support them"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "gpu-rl"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record videos of env 0 to videos/<run_name> (ale backend: the agent's 84x84 view; gymnasium: RGB frames)"""
    progress_bar: bool = True
    """show a progress bar with steps, SPS and recent return"""
    checkpoint_every: int = 100
    """write runs/<run_name>/checkpoint.pt every this many iterations (0: only at the end and on SIGINT/SIGTERM)"""
    resume: str | None = None
    """path of a checkpoint.pt to continue the same run (same run dir, hyperparameters and total steps)"""
    save_model: bool = False
    """save the final model to runs/<run_name>/<exp_name>.model"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint or saved model without training, print mean and std of the episodic return"""
    eval_episodes: int = 10
    """number of full-game episodes for --eval-checkpoint"""
    compile: bool = False
    """torch.compile the policy step and the loss"""
    cudagraphs: bool = False
    """capture the rollout policy step in a CUDA graph (torch.compile mode='reduce-overhead'; CUDA only)"""
    amp: bool = False
    """bf16 autocast for the network's forward passes"""
    channels_last: bool = True
    """keep conv weights and stored observations channels-last (NHWC), which oneDNN (CPU) and cuDNN run faster"""

    # Algorithm specific arguments
    env_id: str = "ALE/Breakout-v5"
    """any ALE/<Game>-v5 id"""
    env_backend: Literal["ale", "gymnasium"] = "ale"
    """ale: ale-py's threaded C++ AtariVectorEnv; gymnasium: SyncVectorEnv of gym.make envs (for debugging)"""
    env_threads: int = 0
    """threads stepping the ale envs (0: one per CPU core, at most one per env)"""
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
RUNTIME_KEYS = {"gpu", "cuda_offset", "session", "tf32", "track", "wandb_project_name", "wandb_entity", "resume"}
RUNTIME_KEYS |= {"progress_bar", "checkpoint_every", "save_model", "compile", "cudagraphs", "amp", "env_threads"}
RUNTIME_KEYS |= {"capture_video", "eval_checkpoint", "eval_episodes", "env_backend", "channels_last"}


def make_gym_env(env_id: str, video_folder: str | None = None):
    """A gymnasium ALE v5 env, preprocessed in Python (no OpenCV) like AtariVectorEnv: up to 30 no-op starts, FIRE on
    reset where the game needs it, frameskip 4 with a max over the last two frames, 84x84 grayscale, 4-frame stack."""

    class Preprocess(gym.Wrapper):
        def __init__(self, env):
            super().__init__(env)
            self.observation_space = gym.spaces.Box(0, 255, (84, 84), np.uint8)
            self.fire = env.unwrapped.get_action_meanings()[1] == "FIRE"

        def frame(self, a, b):
            return np.asarray(Image.fromarray(np.maximum(a, b)).resize((84, 84), Image.BILINEAR))

        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            for action in [0] * int(self.np_random.integers(0, 31)) + [1] * self.fire:
                obs, _, terminated, truncated, info = self.env.step(action)
                if terminated or truncated:
                    obs, info = self.env.reset()
            return self.frame(obs, obs), info

        def step(self, action):
            total, frames = 0.0, []
            for _ in range(4):
                obs, reward, terminated, truncated, info = self.env.step(action)
                total, frames = total + reward, (frames + [obs])[-2:]
                if terminated or truncated:
                    break
            return self.frame(frames[0], frames[-1]), total, terminated, truncated, info

    kwargs = dict(frameskip=1, repeat_action_probability=0.25, full_action_space=False, obs_type="grayscale")
    env = gym.make(env_id, render_mode="rgb_array" if video_folder else None, **kwargs)
    if video_folder:
        env = gym.wrappers.RecordVideo(env, video_folder)
    return gym.wrappers.FrameStackObservation(Preprocess(env), 4)


def make_envs(args, num_envs: int, video_folder: str | None):
    """Vector env, v5 semantics, raw rewards, game-over terminals, SameStep autoreset; video_folder: gymnasium only."""
    if args.env_backend == "ale":
        return ale_py.AtariVectorEnv(
            gym.spec(args.env_id).kwargs["game"], num_envs, repeat_action_probability=0.25, full_action_space=False,
            num_threads=args.env_threads or min(num_envs, os.cpu_count() or 1), autoreset_mode="SameStep", frameskip=4,
            maxpool=True, img_height=84, img_width=84, grayscale=True, stack_num=4, noop_max=30, use_fire_reset=True,
            episodic_life=False, life_loss_info=False, reward_clipping=False, max_num_frames_per_episode=108000,
        )  # fmt: skip
    thunks = [lambda i=i: make_gym_env(args.env_id, video_folder if i == 0 else None) for i in range(num_envs)]
    return gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


class EpisodeTracker:
    """Full-game accounting. `step` returns (rewards clipped to [-1, 1], learning dones (a lost life is one), finished
    games as (env index, raw return over all lives, length in agent steps))."""

    def __init__(self, num_envs: int, lives: np.ndarray):
        self.returns, self.lengths = np.zeros(num_envs, dtype=np.float64), np.zeros(num_envs, dtype=np.int64)
        self.lives = np.array(lives)

    def step(self, rewards, terminated, truncated, lives):
        lives, game_over = np.array(lives), np.logical_or(terminated, truncated)
        life_lost = (lives < self.lives) & ~game_over
        self.lives = lives  # after a game over these are the new game's lives (SameStep reset)
        self.returns, self.lengths = self.returns + rewards, self.lengths + 1
        finished = [(int(i), float(self.returns[i]), int(self.lengths[i])) for i in np.flatnonzero(game_over)]
        self.returns[game_over], self.lengths[game_over] = 0.0, 0
        return np.clip(rewards, -1.0, 1.0).astype(np.float32), game_over | life_lost, finished


class AgentViewRecorder:
    """Writes env 0's games as the agent sees them (last frame of the stack) on a capped cubic schedule."""

    def __init__(self, folder: str):
        self.folder, self.frames, self.episode = folder, [], 0
        os.makedirs(folder, exist_ok=True)

    def add(self, frame: np.ndarray, game_over: bool) -> str | None:
        ep = self.episode
        if (round(ep ** (1 / 3)) ** 3 == ep) if ep < 1000 else ep % 1000 == 0:
            self.frames.append(np.repeat(np.repeat(frame, 2, 0), 2, 1)[..., None].repeat(3, -1))
        self.episode += game_over
        if not (game_over and self.frames):
            return None
        from moviepy import ImageSequenceClip  # slow import, only needed with --capture-video

        path, frames, self.frames = os.path.join(self.folder, f"episode-{ep}.mp4"), self.frames, []
        ImageSequenceClip(frames, fps=15).write_videofile(path, logger=None)
        return path


def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """GAE over a (T, N) rollout; dones[t] = 1 when obs[t] starts a new episode. Returns (advantages, returns)."""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    deltas = rewards + gamma * torch.cat([values[1:], next_value[None]]) * nextnonterminal - values
    advantages, lastgaelam = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        advantages[t] = lastgaelam = deltas[t] + gamma * gae_lambda * nextnonterminal[t] * lastgaelam
    return advantages, advantages + values


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU(),
        )  # fmt: skip
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def forward(self, x):
        """uint8 observations (B, 4, 84, 84) -> (logits, value); the scaling to [0, 1] happens here."""
        hidden = self.network(x.float() / 255.0)
        return self.actor(hidden).float(), self.critic(hidden).float().squeeze(-1)


def load_checkpoint(path: str) -> dict:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist; pass the path of a checkpoint.pt or .model file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ValueError(f"cannot read checkpoint {path!r} ({type(exc).__name__}); is it a ppo_atari file?") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "args" not in ckpt:
        raise ValueError(f"{path!r} is not a ppo_atari checkpoint (no model/args); use one this script wrote")
    return ckpt


if __name__ == "__main__":
    args = tyro.cli(Args)
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    distributed, is_main = world_size > 1, rank == 0
    try:
        ckpt = load_checkpoint(args.resume) if args.resume else None
        if ckpt is not None:
            if not {"optimizer", "iteration", "global_step", "rng", "run_name"} <= set(ckpt):
                raise ValueError(f"{args.resume!r} holds no training state (a --save-model file?); use a checkpoint.pt")
            vars(args).update({k: v for k, v in ckpt["args"].items() if k not in RUNTIME_KEYS and hasattr(args, k)})
        eval_ckpt = load_checkpoint(args.eval_checkpoint) if args.eval_checkpoint else None
        args.env_id = eval_ckpt["args"].get("env_id", args.env_id) if eval_ckpt else args.env_id
        if args.env_id not in gym.envs.registry or args.env_id[:4] != "ALE/" or args.env_id[-3:] != "-v5":
            hint = "import ale_py, gymnasium as g; print([e for e in g.envs.registry if e.startswith('ALE/')])"
            raise ValueError(f'unknown env id {args.env_id!r}, not ALE/<Game>-v5; list valid ids: python -c "{hint}"')
        if not 0.0 <= args.gae_lambda <= 1.0:
            raise ValueError(f"--gae-lambda {args.gae_lambda} must be in [0, 1]")
        if args.num_envs < 1 or args.num_steps < 1 or args.update_epochs < 1:
            raise ValueError("--num-envs, --num-steps and --update-epochs must be at least 1")
        batch_size = args.num_envs * args.num_steps  # per process
        if args.num_minibatches is not None:
            if args.num_minibatches < 1 or batch_size % args.num_minibatches:
                valid = ", ".join(str(d) for d in gpu_utils.divisors(batch_size)[:12])
                raise ValueError(f"--num-minibatches {args.num_minibatches} does not divide the batch {batch_size} "
                                 f"(num_envs * num_steps); valid: {valid}")  # fmt: skip
            args.minibatch_size = batch_size // args.num_minibatches
        try:
            args.minibatch_size = gpu_utils.choose_batch_size(batch_size, args.minibatch_size)
        except gpu_utils.BatchSizeError as exc:
            raise ValueError(f"--minibatch-size: {exc} (num_envs * num_steps)") from None
        args.num_minibatches = batch_size // args.minibatch_size
        if args.total_timesteps < batch_size * world_size:
            raise ValueError(f"--total-timesteps must be at least one batch ({batch_size * world_size} agent steps)")
        device = gpu_utils.select_device(args.gpu, args.session, args.cuda_offset)
        if args.cudagraphs and device.type != "cuda":
            raise ValueError("--cudagraphs needs a CUDA device; drop it or use --gpu true")
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

    if device.type == "cuda":
        torch.cuda.set_device(device)
    gpu_utils.enable_tf32(args.tf32)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    args.batch_size = batch_size * world_size
    args.num_iterations = args.total_timesteps // args.batch_size
    env_tag = args.env_id.replace("/", "_")
    run_name = ckpt["run_name"] if ckpt else f"{env_tag}__{args.exp_name}__{args.seed}__{int(time.time())}"

    # seeding: the model starts from the base seed on every process (identical copies); everything after differs by rank
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # ---------------- env, agent (training, or evaluation of --eval-checkpoint) ----------------
    video_dir = f"videos/{run_name}" if args.capture_video and is_main and eval_ckpt is None else None
    envs = make_envs(args, min(args.num_envs, args.eval_episodes) if eval_ckpt else args.num_envs, video_dir)
    memory_format = torch.channels_last if args.channels_last else torch.preserve_format
    agent = Agent(envs.single_action_space.n).to(device, memory_format=memory_format)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    try:
        if eval_ckpt or ckpt:
            agent.load_state_dict((eval_ckpt or ckpt)["model"])
        if ckpt and not eval_ckpt:
            optimizer.load_state_dict(ckpt["optimizer"])
    except (RuntimeError, KeyError, TypeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0][:150]
        print(f"error: {args.eval_checkpoint or args.resume!r} does not fit the network/env ({first})", file=sys.stderr)
        sys.exit(2)
    start_iteration, global_step = (ckpt["iteration"] + 1, ckpt["global_step"]) if ckpt else (1, 0)

    @torch.no_grad()
    def policy_step(x):
        with torch.autocast(device.type, torch.bfloat16, enabled=args.amp):
            logits, value = agent(x)
        logp_all = torch.log_softmax(logits, -1)
        action = (logits - (-torch.rand_like(logits).log()).log()).argmax(-1)  # Gumbel-max sample, no host sync
        return action, logp_all.gather(-1, action[:, None]).squeeze(-1), value

    def ppo_loss(mb_obs, mb_actions, mb_logprobs, mb_adv, mb_returns, mb_values):
        with torch.autocast(device.type, torch.bfloat16, enabled=args.amp):
            logits, newvalue = agent(mb_obs)
        logp_all = torch.log_softmax(logits, -1)
        entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
        logratio = logp_all.gather(-1, mb_actions[:, None]).squeeze(-1) - mb_logprobs
        ratio = logratio.exp()
        with torch.no_grad():
            old_approx_kl, approx_kl = (-logratio).mean(), ((ratio - 1) - logratio).mean()
            clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
        if args.norm_adv:
            mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
        pg_loss = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)).mean()
        if args.clip_vloss:
            v_clipped = mb_values + torch.clamp(newvalue - mb_values, -args.clip_coef, args.clip_coef)
            v_loss = 0.5 * torch.max((newvalue - mb_returns) ** 2, (v_clipped - mb_returns) ** 2).mean()
        else:
            v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()
        loss = pg_loss - args.ent_coef * entropy + v_loss * args.vf_coef
        return loss, torch.stack([v_loss, pg_loss, entropy, old_approx_kl, approx_kl, clipfrac]).detach()

    if args.compile or args.cudagraphs:
        policy_step = torch.compile(policy_step, mode="reduce-overhead" if args.cudagraphs else None)
    if args.compile:
        ppo_loss = torch.compile(ppo_loss)

    if eval_ckpt is not None:
        obs, info = envs.reset(seed=args.seed)
        tracker, scores = EpisodeTracker(envs.num_envs, info["lives"]), []
        while len(scores) < args.eval_episodes:
            action = policy_step(torch.as_tensor(obs, device=device))[0]
            obs, reward, terminated, truncated, info = envs.step(action.cpu().numpy())
            scores += [ret for _, ret, _ in tracker.step(reward, terminated, truncated, info["lives"])[2]]
        mean, std = np.mean(scores[: args.eval_episodes]), np.std(scores[: args.eval_episodes])
        print(f"eval {args.env_id}: mean_return={mean:.2f} std_return={std:.2f} over {args.eval_episodes} episodes")
        envs.close()
        sys.exit(0)

    # ---------------- logging ----------------
    if is_main:
        if args.track:
            import wandb

            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                       config=vars(args), name=run_name, save_code=True, monitor_gym=True, resume="allow",
                       id=ckpt.get("wandb_id") if ckpt else None)  # fmt: skip
        writer = SummaryWriter(f"runs/{run_name}")
        table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)

    torch.manual_seed(args.seed + rank)
    if ckpt is not None and is_main:
        random.setstate(ckpt["rng"]["python"])
        np.random.set_state(ckpt["rng"]["numpy"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and ckpt["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)

    # ---------------- storage: rollout on the device, pinned host staging buffers ----------------
    obs_shape = envs.single_observation_space.shape
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=torch.uint8, device=device)
    if args.channels_last:  # stored NHWC, so minibatches reach the convolutions without a layout copy
        obs = obs.movedim(2, -1).contiguous().movedim(-1, 2)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs, values = torch.zeros((2, args.num_steps, args.num_envs), device=device)
    pin = device.type == "cuda"
    # host side: obs staging buffer (pinned, one non_blocking copy per step); rewards/dones copied once per iteration
    host_obs = torch.empty((args.num_envs,) + obs_shape, dtype=torch.uint8, pin_memory=pin)
    host_rd = torch.zeros((2, args.num_steps + 1, args.num_envs), dtype=torch.float32, pin_memory=pin)

    if is_main:
        rollout_bytes = sum(t.numel() * t.element_size() for t in (obs, actions, logprobs, values)) * 3 // 2
        mb_bytes = args.minibatch_size * (int(np.prod(obs_shape)) + 5 * 4)
        est = gpu_utils.estimate_memory(agent, "adam", mb_bytes, rollout_bytes, None, obs[0, :2], args.minibatch_size)
        print(f"{sum(p.numel() for p in agent.parameters()):,} parameters on {device}, {world_size} process(es)\n{est}")
        writer.add_scalar("memory/estimated_mib", est.total / 2**20, global_step)

    stop = []  # name of a signal that asked to stop; the current iteration finishes and a checkpoint is written
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.append(signal.Signals(signum).name))

    def save_checkpoint(iteration, status):
        path = f"runs/{run_name}/checkpoint.pt"
        rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        rng["cuda"] = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        state = dict(model=agent.state_dict(), optimizer=optimizer.state_dict(), iteration=iteration, rng=rng)
        state.update(global_step=global_step, args=vars(args), run_name=run_name)
        state["wandb_id"] = wandb.run.id if args.track else None
        state["status"] = status  # running (periodic), stopped (by a signal) or finished
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)

    # ---------------- training ----------------
    env_seed = args.seed * 10_000 + rank * args.num_envs + (start_iteration - 1) * 7919  # new games after resume
    host_obs_np, host_rd_np = host_obs.numpy(), host_rd.numpy()
    host_obs_np[:], info = envs.reset(seed=env_seed)
    next_obs = host_obs.to(device, non_blocking=True, copy=True)
    tracker = EpisodeTracker(args.num_envs, info["lives"])
    recorder = AgentViewRecorder(video_dir) if video_dir and args.env_backend == "ale" else None
    recent_returns, iteration, stopping = [], start_iteration - 1, False
    total = args.num_iterations * args.batch_size
    pbar = tqdm(total=total, initial=global_step, disable=not (args.progress_bar and is_main), unit="step")
    monitor = gpu_utils.GPUMonitor(device).start()
    for iteration in range(start_iteration, args.num_iterations + 1):
        iteration_start = time.perf_counter()
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / args.num_iterations) * args.learning_rate
        finished = []
        host_rd[1, 0] = host_rd[1, args.num_steps]  # carry next_done into step 0
        for step in range(args.num_steps):
            obs[step] = next_obs
            if args.cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            actions[step], logprobs[step], values[step] = policy_step(next_obs)
            # .cpu() waits for this step's H2D copy too, so host_obs is free to overwrite with the new observations
            host_obs_np[:], reward, terminated, truncated, info = envs.step(actions[step].cpu().numpy())
            next_obs.copy_(host_obs, non_blocking=True)
            clipped, done, games = tracker.step(reward, terminated, truncated, info["lives"])
            host_rd_np[0, step], host_rd_np[1, step + 1] = clipped, done
            finished += games
            if recorder is not None:
                video = recorder.add(host_obs_np[0, -1], bool(terminated[0] or truncated[0]))
                if video and args.track:
                    wandb.log({"videos": wandb.Video(video)}, commit=False)
        global_step += args.batch_size
        rd = host_rd.to(device, non_blocking=True)
        rewards, dones, next_done = rd[0, :-1], rd[1, :-1], rd[1, -1]

        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=args.amp):
            next_value = agent(next_obs)[1].float()
        advantages, returns = compute_gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)

        batch = [x.reshape((batch_size,) + x.shape[2:]) for x in (obs, actions, logprobs, advantages, returns, values)]
        for _epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device)
            stats = torch.zeros(6, device=device)
            for start in range(0, batch_size, args.minibatch_size):
                mb = b_inds[start : start + args.minibatch_size]
                loss, mb_stats = ppo_loss(*(x[mb] for x in batch))
                optimizer.zero_grad(set_to_none=False)
                loss.backward()
                if distributed:  # average gradients over processes, one flat all_reduce per minibatch
                    grads = [p.grad for p in agent.parameters()]
                    flat = torch.cat([g.reshape(-1) for g in grads])
                    dist.all_reduce(flat)
                    torch._foreach_copy_(grads, torch._utils._unflatten_dense_tensors(flat / world_size, grads))
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                stats += mb_stats
            stats /= args.num_minibatches
            if args.target_kl is not None:  # one sync per epoch, only when --target-kl is set
                kl = stats[4:5].clone()
                if distributed:
                    dist.all_reduce(kl)
                if kl.item() / world_size > args.target_kl:
                    break

        # ---------------- once per iteration: pull scalars to the host ----------------
        explained_var = (1 - (returns - values).var() / returns.var()).nan_to_num(0.0)
        stop_now = torch.tensor([float(bool(stop))], device=device)
        if distributed:  # every process stops at the same iteration when any got a signal
            dist.all_reduce(stop_now)
        *losses, stopping = torch.cat([stats, explained_var[None], stop_now]).tolist()
        elapsed = time.perf_counter() - iteration_start
        if is_main:
            for _, ret, length in finished:
                writer.add_scalar("charts/episodic_return", ret, global_step)
                writer.add_scalar("charts/episodic_length", length, global_step)
                recent_returns = (recent_returns + [ret])[-20:]
            names = "value_loss policy_loss entropy old_approx_kl approx_kl clipfrac explained_variance".split()
            scalars = {"charts/learning_rate": optimizer.param_groups[0]["lr"], **monitor.collect()}
            for key, value in {**scalars, **{f"losses/{n}": v for n, v in zip(names, losses)}}.items():
                writer.add_scalar(key, value, global_step)
            sps, recent = args.batch_size / elapsed, np.mean(recent_returns) if recent_returns else float("nan")
            if iteration > start_iteration:  # the first iteration after start/resume is warm-up (compile, caches)
                writer.add_scalar("charts/SPS", sps, global_step)
                pbar.set_postfix(SPS=f"{sps:,.0f}", ret=f"{recent:.1f}" if recent_returns else "-")
            pbar.update(args.batch_size)
            if not args.progress_bar and (iteration % 10 == 0 or iteration == args.num_iterations):
                print(f"iteration {iteration}/{args.num_iterations} step={global_step} SPS={sps:,.0f} ret={recent:.1f}")
            if (args.checkpoint_every and iteration % args.checkpoint_every == 0) or stopping:
                save_checkpoint(iteration, "stopped" if stopping else "running")
            if stopping:
                print(
                    f"stopping on {(stop or ['a signal to another process'])[0]}: checkpoint at step {global_step}; "
                    f"continue with: python {sys.argv[0]} --resume runs/{run_name}/checkpoint.pt"
                )
        if stopping:
            break

    pbar.close()
    monitor.close()
    if distributed:  # gradient averaging keeps every process's copy of the weights identical; check it once
        checksum = torch.stack([p.detach().double().sum() for p in agent.parameters()]).sum().reshape(1)
        gathered = [torch.zeros_like(checksum) for _ in range(world_size)]
        dist.all_gather(gathered, checksum)
        if is_main:
            print(f"weights identical on all {world_size} processes: {all(torch.equal(g, checksum) for g in gathered)}")
    if is_main:
        if not stopping and args.num_iterations >= start_iteration:
            save_checkpoint(iteration, "finished")
        if args.save_model:
            model_path = f"runs/{run_name}/{args.exp_name}.model"
            torch.save({"model": agent.state_dict(), "args": vars(args)}, model_path)
            print(f"model saved to {model_path}")
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device) / 2**20
            writer.add_scalar("memory/peak_allocated_mib", peak, global_step)
            print(f"peak allocated {peak:.1f} MiB (estimate {est.total / 2**20:.1f} MiB)")
        print(f"done: global_step={global_step} iterations={iteration}/{args.num_iterations} run={run_name}")
        writer.close()
    envs.close()
    if distributed:
        # wait (GIL released) until rank 0 has written its files: exiting straight after the all_gather lets a gloo
        # worker thread free the gathered tensors during interpreter shutdown, which aborts the process
        dist.barrier()
        dist.destroy_process_group()
