# PPO on Atari (ALE v5) with the Nature ConvNet, CleanRL style, built to keep one GPU (or a CPU) busy.
# Envs step in ale-py's C++ vector env (threads, no Python loop over envs); rollout storage lives on the device.
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro

import gpu_utils


@dataclass
class Args:
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
    wandb_project_name: str = "cleanRL"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record videos of env 0 to videos/<run_name> (ale backend: the agent's 84x84 view; gymnasium: RGB frames)"""
    progress_bar: bool = True
    """show a progress bar with steps, SPS and recent return"""
    checkpoint_every: int = 100
    """write runs/<run_name>/checkpoint.pt every this many iterations (0: only on SIGINT/SIGTERM)"""
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
    """keep conv weights channels-last (NHWC), which oneDNN (CPU) and cuDNN run faster"""

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


HELP_SPS = "charts/SPS = agent steps per second (all processes) over the latest iteration, rollout + update, "
HELP_SPS += "logged from the second iteration after start or resume (the first is warm-up)."
Args.__doc__ = "PPO on ALE v5 Atari games. " + HELP_SPS
RUNTIME_KEYS = {"gpu", "cuda_offset", "session", "tf32", "track", "wandb_project_name", "wandb_entity", "resume"}
RUNTIME_KEYS |= {"progress_bar", "checkpoint_every", "save_model", "compile", "cudagraphs", "amp", "env_threads"}
RUNTIME_KEYS |= {"capture_video", "eval_checkpoint", "eval_episodes", "env_backend", "channels_last"}


def game_name(env_id: str) -> str:
    """Map an `ALE/<Game>-v5` id to the ROM name AtariVectorEnv takes (ALE/MsPacman-v5 -> ms_pacman)."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    spec = gym.envs.registry.get(env_id)
    if spec is None or not env_id.startswith("ALE/") or not env_id.endswith("-v5"):
        raise ValueError(
            f'unknown env id {env_id!r}; use ALE/<Game>-v5, list valid ids with: python -c "import ale_py, gymnasium '
            "as g; g.register_envs(ale_py); print([e for e in g.envs.registry if e.startswith('ALE/') and "
            "e.endswith('-v5')])\""
        )
    return spec.kwargs["game"]


def make_gym_env(env_id: str, video_folder: str | None = None):
    """One gymnasium ALE v5 env with v5 preprocessing done in Python (no OpenCV): up to 30 no-op starts, FIRE on
    reset where the game needs it, frameskip 4 with a max over the last two frames, 84x84 grayscale, 4-frame stack."""
    import ale_py
    import gymnasium as gym
    from PIL import Image

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

    gym.register_envs(ale_py)
    kwargs = dict(frameskip=1, repeat_action_probability=0.25, full_action_space=False, obs_type="grayscale")
    env = gym.make(env_id, render_mode="rgb_array" if video_folder else None, **kwargs)
    if video_folder:
        env = gym.wrappers.RecordVideo(env, video_folder)
    return gym.wrappers.FrameStackObservation(Preprocess(env), 4)


def make_envs(args, num_envs: int, run_name: str, capture_video: bool):
    """Vector env with v5 semantics that reports raw (unclipped) rewards and terminates only at game over.

    Autoreset is SameStep: after a game ends, the returned observation already starts the next game.
    """
    game = game_name(args.env_id)
    if args.env_backend == "ale":
        import ale_py

        threads = args.env_threads or min(num_envs, os.cpu_count() or 1)
        return ale_py.AtariVectorEnv(
            game, num_envs, num_threads=threads, repeat_action_probability=0.25, full_action_space=False,
            autoreset_mode="SameStep", frameskip=4, maxpool=True, img_height=84, img_width=84, grayscale=True,
            stack_num=4, noop_max=30, use_fire_reset=True, episodic_life=False, life_loss_info=False,
            reward_clipping=False, max_num_frames_per_episode=108000,
        )  # fmt: skip
    import gymnasium as gym

    def thunk(idx):
        return lambda: make_gym_env(args.env_id, f"videos/{run_name}" if capture_video and idx == 0 else None)

    mode = gym.vector.AutoresetMode.SAME_STEP
    return gym.vector.SyncVectorEnv([thunk(i) for i in range(num_envs)], autoreset_mode=mode)


class EpisodeTracker:
    """Full-game accounting on the host: clipped rewards and life-loss dones for learning, raw scores for logging.

    `step` returns (clipped rewards, learning dones, finished games as (env index, raw return, length in agent steps)).
    A lost life is a learning done, but the logged episode runs on until the game is over.
    """

    def __init__(self, num_envs: int, lives: np.ndarray):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.lives = np.asarray(lives).copy()

    def step(self, rewards, terminated, truncated, lives):
        rewards = np.asarray(rewards, dtype=np.float64)
        game_over = np.logical_or(terminated, truncated)
        life_lost = (np.asarray(lives) < self.lives) & ~game_over
        self.lives = np.asarray(lives).copy()  # after a game over these are the new game's lives (SameStep reset)
        self.returns += rewards
        self.lengths += 1
        finished = [(int(i), float(self.returns[i]), int(self.lengths[i])) for i in np.flatnonzero(game_over)]
        self.returns[game_over] = 0.0
        self.lengths[game_over] = 0
        return np.clip(rewards, -1.0, 1.0).astype(np.float32), game_over | life_lost, finished


class AgentViewRecorder:
    """Writes env 0's games as the agent sees them (last frame of the stack) on a capped cubic schedule."""

    def __init__(self, folder: str):
        self.folder, self.frames, self.episode = folder, [], 0
        os.makedirs(folder, exist_ok=True)

    def add(self, frame: np.ndarray, game_over: bool) -> str | None:
        ep = self.episode
        record = (round(ep ** (1 / 3)) ** 3 == ep) if ep < 1000 else ep % 1000 == 0
        if record:
            self.frames.append(np.repeat(np.repeat(frame, 2, 0), 2, 1)[..., None].repeat(3, -1))
        if not game_over:
            return None
        path, self.episode = None, ep + 1
        if self.frames:
            from moviepy import ImageSequenceClip

            path = os.path.join(self.folder, f"episode-{ep}.mp4")
            ImageSequenceClip(self.frames, fps=15).write_videofile(path, logger=None)
            self.frames = []
        return path


def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """GAE over a (T, N) rollout. dones[t] = 1 when obs[t] starts a new episode (the step before it ended).

    Returns (advantages, returns), both (T, N).
    """
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal, nextvalues = 1.0 - next_done, next_value
        else:
            nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, num_actions: int):
        super().__init__()
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
        raise ValueError(
            f"checkpoint {path!r} is not a ppo_atari checkpoint (no model/args); use one this script wrote"
        )
    return ckpt


def load_weights(agent: nn.Module, ckpt: dict, path: str) -> None:
    try:
        agent.load_state_dict(ckpt["model"])
    except (RuntimeError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0][:150]
        raise ValueError(f"checkpoint {path!r} does not fit this network/env ({first})") from None


if __name__ == "__main__":
    args = tyro.cli(Args, description=Args.__doc__)
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    try:
        ckpt = None
        if args.resume:
            ckpt = load_checkpoint(args.resume)
            if not {"optimizer", "iteration", "global_step", "rng", "run_name"} <= set(ckpt):
                raise ValueError(
                    f"{args.resume!r} holds no training state (a --save-model file?); resume from a checkpoint.pt"
                )
            for key, value in ckpt["args"].items():
                if key not in RUNTIME_KEYS and hasattr(args, key):
                    setattr(args, key, value)
        game_name(args.env_id)  # unknown ids fail here, before anything starts
        if not 0.0 <= args.gae_lambda <= 1.0:
            raise ValueError(f"--gae-lambda {args.gae_lambda} must be in [0, 1]")
        if args.num_envs < 1 or args.num_steps < 1 or args.update_epochs < 1:
            raise ValueError("--num-envs, --num-steps and --update-epochs must be at least 1")
        batch_size = args.num_envs * args.num_steps  # per process
        if args.num_minibatches is not None:
            if args.num_minibatches < 1 or batch_size % args.num_minibatches:
                valid = [d for d in range(1, batch_size + 1) if batch_size % d == 0]
                raise ValueError(
                    f"--num-minibatches {args.num_minibatches} does not divide the batch {batch_size} "
                    f"(num_envs * num_steps); valid: {', '.join(map(str, valid[:12]))}"
                )
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
        eval_ckpt = load_checkpoint(args.eval_checkpoint) if args.eval_checkpoint else None
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

    if device.type == "cuda":
        torch.cuda.set_device(device)
    gpu_utils.enable_tf32(args.tf32)
    distributed = world_size > 1
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    args.batch_size = batch_size * world_size
    args.num_iterations = args.total_timesteps // args.batch_size
    is_main = rank == 0

    # seeding: the model starts from the base seed on every process; everything after it differs by rank
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    # ---------------- evaluation only ----------------
    if eval_ckpt is not None:
        for key in ("env_id",):
            setattr(args, key, eval_ckpt["args"].get(key, args.env_id))
        envs = make_envs(args, min(args.num_envs, args.eval_episodes), "eval", False)
        agent = Agent(envs.single_action_space.n).to(device)
        try:
            load_weights(agent, eval_ckpt, args.eval_checkpoint)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        agent.eval()
        obs, info = envs.reset(seed=args.seed)
        tracker, scores = EpisodeTracker(envs.num_envs, info["lives"]), []
        while len(scores) < args.eval_episodes:
            with torch.no_grad():
                logits, _ = agent(torch.as_tensor(obs, device=device))
                action = torch.distributions.Categorical(logits=logits).sample().cpu().numpy()
            obs, reward, terminated, truncated, info = envs.step(action)
            scores += [ret for _, ret, _ in tracker.step(reward, terminated, truncated, info["lives"])[2]]
        scores = np.array(scores[: args.eval_episodes])
        mean, std = scores.mean(), scores.std()
        print(f"eval {args.env_id}: mean_return={mean:.2f} std_return={std:.2f} over {len(scores)} episodes")
        envs.close()
        sys.exit(0)

    # ---------------- logging ----------------
    env_tag = args.env_id.replace("/", "_")
    run_name = ckpt["run_name"] if ckpt else f"{env_tag}__{args.exp_name}__{args.seed}__{int(time.time())}"
    writer = None
    if is_main:
        from torch.utils.tensorboard import SummaryWriter

        if args.track:
            import wandb

            wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                       config=vars(args), name=run_name, save_code=True, monitor_gym=True, resume="allow",
                       id=ckpt.get("wandb_id") if ckpt else None)  # fmt: skip
        writer = SummaryWriter(f"runs/{run_name}")
        table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)

    # ---------------- env, agent, storage ----------------
    envs = make_envs(args, args.num_envs, run_name, args.capture_video and is_main)
    num_actions = envs.single_action_space.n
    agent = Agent(num_actions).to(
        device, memory_format=torch.channels_last if args.channels_last else torch.preserve_format
    )
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    start_iteration, global_step = 1, 0
    if ckpt is not None:
        try:
            load_weights(agent, ckpt, args.resume)
            optimizer.load_state_dict(ckpt["optimizer"])
        except (ValueError, KeyError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        start_iteration, global_step = ckpt["iteration"] + 1, ckpt["global_step"]
    if distributed:
        for p in agent.parameters():
            dist.broadcast(p.data, 0)
    torch.manual_seed(args.seed + rank)
    if ckpt is not None and is_main:
        random.setstate(ckpt["rng"]["python"])
        np.random.set_state(ckpt["rng"]["numpy"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and ckpt["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)
    obs_shape = envs.single_observation_space.shape
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)
    pin = device.type == "cuda"
    # host side: obs staging buffer (pinned, one non_blocking copy per step); rewards/dones copied once per iteration
    host_obs = torch.empty((args.num_envs,) + obs_shape, dtype=torch.uint8, pin_memory=pin)
    host_rd = torch.zeros((2, args.num_steps + 1, args.num_envs), dtype=torch.float32, pin_memory=pin)
    next_obs = torch.zeros((args.num_envs,) + obs_shape, dtype=torch.uint8, device=device)

    if is_main:
        rollout_bytes = sum(t.numel() * t.element_size() for t in (obs, actions, logprobs, values)) * 3 // 2
        mb_bytes = args.minibatch_size * (int(np.prod(obs_shape)) + 5 * 4)
        example = torch.zeros((2,) + obs_shape, dtype=torch.uint8, device=device)
        est = gpu_utils.estimate_memory(agent, "adam", mb_bytes, rollout_bytes, None, example, args.minibatch_size)
        print(f"{sum(p.numel() for p in agent.parameters()):,} parameters on {device}, {world_size} process(es)")
        print(est)
        writer.add_scalar("memory/estimated_mib", est.total / 2**20, global_step)

    def policy_step(x):
        with torch.autocast(device.type, torch.bfloat16, enabled=args.amp):
            logits, value = agent(x)
        logp_all = torch.log_softmax(logits, -1)
        action = (logits - (-torch.rand_like(logits).log()).log()).argmax(-1)  # Gumbel-max sample, no host sync
        return action, logp_all.gather(-1, action[:, None]).squeeze(-1), value

    def ppo_loss(mb_obs, mb_actions, mb_logprobs, mb_advantages, mb_returns, mb_values):
        with torch.autocast(device.type, torch.bfloat16, enabled=args.amp):
            logits, newvalue = agent(mb_obs)
        logp_all = torch.log_softmax(logits, -1)
        newlogprob = logp_all.gather(-1, mb_actions[:, None]).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
        logratio = newlogprob - mb_logprobs
        ratio = logratio.exp()
        with torch.no_grad():
            old_approx_kl, approx_kl = (-logratio).mean(), ((ratio - 1) - logratio).mean()
            clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
        if args.norm_adv:
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
        pg_loss = torch.max(
            -mb_advantages * ratio, -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        ).mean()
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

    stop = {"signal": None}

    def on_signal(signum, frame):
        stop["signal"] = signal.Signals(signum).name

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    def save_checkpoint(iteration):
        path = f"runs/{run_name}/checkpoint.pt"
        rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        rng["cuda"] = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        state = {"model": agent.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration}
        state.update(global_step=global_step, args=vars(args), rng=rng, run_name=run_name)
        state["wandb_id"] = wandb.run.id if args.track else None
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
        return path

    # ---------------- training ----------------
    from tqdm import tqdm

    env_seed = args.seed * 10_000 + rank * args.num_envs + (start_iteration - 1) * 7919  # new games after resume
    np_obs, info = envs.reset(seed=env_seed)
    tracker = EpisodeTracker(args.num_envs, info["lives"])
    recorder = AgentViewRecorder(f"videos/{run_name}") if args.capture_video and is_main else None
    recorder = recorder if args.env_backend == "ale" else None
    host_obs_np, host_rd_np = host_obs.numpy(), host_rd.numpy()
    host_obs_np[:] = np_obs
    next_obs.copy_(host_obs, non_blocking=True)
    recent_returns, iteration, stop_now = [], start_iteration - 1, torch.zeros(1, device=device)
    show_bar = args.progress_bar and is_main
    pbar = tqdm(total=args.num_iterations * args.batch_size, initial=global_step, disable=not show_bar, unit="step")
    monitor = gpu_utils.GPUMonitor(device).__enter__()
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
            with torch.no_grad():
                action, logprob, value = policy_step(next_obs)
            actions[step], logprobs[step], values[step] = action, logprob, value
            # .cpu() waits for this step's H2D copy too, so host_obs is free to overwrite below
            np_obs, reward, terminated, truncated, info = envs.step(action.cpu().numpy())
            clipped, done, games = tracker.step(reward, terminated, truncated, info["lives"])
            host_rd_np[0, step], host_rd_np[1, step + 1] = clipped, done
            host_obs_np[:] = np_obs
            next_obs.copy_(host_obs, non_blocking=True)
            finished += games
            if recorder is not None:
                video = recorder.add(np_obs[0, -1], bool(terminated[0] or truncated[0]))
                if video and args.track:
                    wandb.log({"videos": wandb.Video(video)}, commit=False)
        global_step += args.batch_size
        rd = host_rd.to(device, non_blocking=True)
        rewards, dones, next_done = rd[0, :-1], rd[1, :-1], rd[1, -1]

        with torch.no_grad():
            with torch.autocast(device.type, torch.bfloat16, enabled=args.amp):
                next_value = agent(next_obs)[1].float()
            advantages, returns = compute_gae(
                rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda
            )

        b_obs = obs.reshape((-1,) + obs_shape)
        b_logprobs, b_actions, b_values = logprobs.reshape(-1), actions.reshape(-1), values.reshape(-1)
        b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)
        stats = torch.zeros(6, device=device)
        for _epoch in range(args.update_epochs):
            b_inds = torch.randperm(batch_size, device=device)
            epoch_stats = torch.zeros(6, device=device)
            for start in range(0, batch_size, args.minibatch_size):
                mb = b_inds[start : start + args.minibatch_size]
                loss, mb_stats = ppo_loss(b_obs[mb], b_actions[mb], b_logprobs[mb], b_advantages[mb], b_returns[mb],
                                          b_values[mb])  # fmt: skip
                optimizer.zero_grad(set_to_none=False)
                loss.backward()
                if distributed:  # average gradients over processes, one flat all_reduce per minibatch
                    grads = [p.grad for p in agent.parameters()]
                    flat = torch.cat([g.reshape(-1) for g in grads])
                    dist.all_reduce(flat)
                    flat /= world_size
                    for g, new in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
                        g.copy_(new)
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                epoch_stats += mb_stats
            stats = epoch_stats / args.num_minibatches
            if args.target_kl is not None:  # one sync per epoch, only when --target-kl is set
                kl = stats[4:5].clone()
                if distributed:
                    dist.all_reduce(kl)
                    kl /= world_size
                if kl.item() > args.target_kl:
                    break

        # ---------------- once per iteration: pull scalars to the host ----------------
        y_pred, y_true = b_values, b_returns
        explained_var = 1 - (y_true - y_pred).var() / y_true.var()
        v_loss, pg_loss, entropy, old_kl, approx_kl, clipfrac, explained_var = torch.cat(
            [stats, explained_var.nan_to_num(0.0)[None]]
        ).tolist()
        stop_now = torch.tensor([1.0 if stop["signal"] else 0.0], device=device)
        if distributed:  # every process stops at the same iteration when any got a signal
            dist.all_reduce(stop_now)
        elapsed = time.perf_counter() - iteration_start
        if is_main:
            for _, ret, length in finished:
                writer.add_scalar("charts/episodic_return", ret, global_step)
                writer.add_scalar("charts/episodic_length", length, global_step)
                recent_returns = (recent_returns + [ret])[-20:]
            lr = optimizer.param_groups[0]["lr"]
            scalars = {"charts/learning_rate": lr, "losses/value_loss": v_loss, "losses/policy_loss": pg_loss}
            scalars.update({"losses/entropy": entropy, "losses/old_approx_kl": old_kl, "losses/approx_kl": approx_kl})
            scalars.update({"losses/clipfrac": clipfrac, "losses/explained_variance": explained_var})
            for key, value in {**scalars, **monitor.collect()}.items():
                writer.add_scalar(key, value, global_step)
            if iteration > start_iteration:  # the first iteration after start/resume is warm-up (compile, caches)
                sps = args.batch_size / elapsed
                writer.add_scalar("charts/SPS", sps, global_step)
                pbar.set_postfix(SPS=f"{sps:,.0f}", ret=f"{np.mean(recent_returns):.1f}" if recent_returns else "-")
            pbar.update(args.batch_size)
            if not args.progress_bar and (iteration % 10 == 0 or iteration == args.num_iterations):
                recent = np.mean(recent_returns) if recent_returns else float("nan")
                sps = args.batch_size / elapsed
                print(
                    f"iteration {iteration}/{args.num_iterations} step={global_step} SPS={sps:,.0f} return={recent:.1f}"
                )
            if (args.checkpoint_every and iteration % args.checkpoint_every == 0) or stop_now.item():
                save_checkpoint(iteration)
        if stop_now.item():
            if is_main:
                print(
                    f"stopping on {stop['signal'] or 'a signal to another process'}: checkpoint at step {global_step}"
                )
            break

    pbar.close()
    monitor.__exit__(None, None, None)
    if distributed:  # gradient averaging keeps every process's copy of the weights identical; check it once
        checksum = torch.stack([p.detach().double().sum() for p in agent.parameters()]).sum().reshape(1)
        gathered = [torch.zeros_like(checksum) for _ in range(world_size)]
        dist.all_gather(gathered, checksum)
        in_sync = all(torch.equal(g, gathered[0]) for g in gathered)
        if is_main:
            print(f"weights identical on all {world_size} processes: {in_sync}")
    if is_main:
        if args.checkpoint_every and not stop_now.item() and args.num_iterations >= start_iteration:
            save_checkpoint(iteration)
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
        dist.destroy_process_group()
