# PPO for continuous control (Gaussian policy), CleanRL style, with GPU-heavy presets.
# Usage: python ppo_continuous.py --env-id HalfCheetah-v5      python ppo_continuous.py --preset heavy
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

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
    """auto: GPU only for a preset or a network with >= 256 hidden units, else CPU; true: force GPU; false; N"""
    cuda_offset: int | None = None
    """first GPU index for rotation (None: env CUDA_OFFSET or 0)"""
    session: int = 0
    """run number, rotated over the visible GPUs"""
    tf32: bool = True
    """allow TF32 matmuls on GPU"""
    track: bool = False
    """if toggled, mirror TensorBoard to Weights and Biases"""
    wandb_project_name: str = "gpu-rl"
    """the wandb project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record videos of env 0 to videos/<run_name>"""
    progress_bar: bool = True
    """show a tqdm progress bar with steps, SPS and recent return"""
    checkpoint_every: int = 50
    """write runs/<run_name>/checkpoint.pt every N iterations (0: only on SIGINT/SIGTERM)"""
    resume: str | None = None
    """path of a checkpoint.pt to continue (same run, same total; training flags come from the checkpoint)"""
    save_model: bool = False
    """save the final model (with its observation-normalisation statistics) to runs/<run_name>/<exp_name>.model"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint or .model file (deterministic mean action) instead of training"""
    eval_episodes: int = 10
    """episodes for --eval-checkpoint"""
    compile: bool = False
    """torch.compile the PPO loss (actor and critic forward included); compiling takes a minute or more"""
    cudagraphs: bool = False
    """with --compile on CUDA, use CUDA graphs (compile mode reduce-overhead)"""
    amp: bool = False
    """bf16 autocast in the update"""
    torch_threads: int = 0
    """torch CPU threads (0: 1 thread for networks under 256 units, else all cores)"""
    env_id: str = "HalfCheetah-v5"
    """any gymnasium env id with a continuous (Box) action space"""
    preset: Literal["fast", "heavy", "beast"] | None = None
    """GPU-heavy settings (see PRESETS); flags you pass explicitly still win"""
    total_timesteps: int = 1000000
    """total agent steps (env steps summed over all envs)"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int | None = None
    """parallel envs (default 1; preset sets it)"""
    num_steps: int | None = None
    """steps per env per rollout, independent of --num-envs (default 2048; preset sets it)"""
    anneal_lr: bool = True
    """linearly anneal the learning rate to 0"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int | None = None
    """minibatches per epoch (default 32); alternative to --batch-size"""
    batch_size: str | None = None
    """minibatch size dividing num_envs*num_steps, or auto (largest divisor <= the preset size or total/32)"""
    update_epochs: int | None = None
    """epochs per update (default 10; preset sets it)"""
    network_arch: str | None = None
    """hidden sizes of the actor and critic MLPs, comma-separated (default 64,64; preset sets it)"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """use a clipped value loss"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """stop the update epochs early when the approximate KL exceeds this"""
    subproc: bool = False
    """step envs in subprocesses (AsyncVectorEnv, forkserver); default in-process"""


DEFAULTS = dict(num_envs=1, num_steps=2048, num_minibatches=32, update_epochs=10, network_arch="64,64")
PRESETS = {  # n_envs, n_steps, minibatch size, epochs, network
    "fast": dict(num_envs=16, num_steps=256, batch_size="2048", update_epochs=15, network_arch="512,512"),
    "heavy": dict(num_envs=32, num_steps=256, batch_size="4096", update_epochs=20, network_arch="1024,512,256"),
    "beast": dict(num_envs=64, num_steps=512, batch_size="8192", update_epochs=30, network_arch="1024,512,512,256"),
}
LOG_2PI_HALF = float(0.5 * np.log(2 * np.pi))


def resolve_args(args: Args) -> tuple[Args, dict[str, str]]:
    """Fill unset (None) fields from the preset, then DEFAULTS; a flag passed at all (even at its default) wins."""
    preset, source = PRESETS.get(args.preset, {}), {}
    for key in ("num_envs", "num_steps", "update_epochs", "network_arch"):
        source[key] = "explicit" if getattr(args, key) is not None else f"preset {args.preset}" if preset else "default"
        if getattr(args, key) is None:
            setattr(args, key, preset.get(key, DEFAULTS[key]))
    if args.num_envs < 1 or args.num_steps < 1 or args.update_epochs < 1:
        raise ValueError("--num-envs, --num-steps and --update-epochs must be at least 1")
    if not 0.0 <= args.gae_lambda <= 1.0:
        raise ValueError(f"--gae-lambda must be in [0, 1], got {args.gae_lambda}")
    total = args.num_envs * args.num_steps
    if args.batch_size is not None and args.num_minibatches is not None:
        raise ValueError("pass either --batch-size or --num-minibatches, not both")
    if args.num_minibatches is not None or (args.batch_size is None and not preset):
        nmb = DEFAULTS["num_minibatches"] if args.num_minibatches is None else args.num_minibatches
        if nmb < 1 or total % nmb:
            raise ValueError(f"--num-minibatches {nmb} does not divide the total batch {total} (num envs x num steps)")
        source["batch_size"] = "default" if args.num_minibatches is None else "explicit"
        args.batch_size = str(total // nmb)
    else:  # an integer dividing the total, 'auto', or the preset's size (the largest divisor below it if that fails)
        target = int(preset["batch_size"]) if preset else total // DEFAULTS["num_minibatches"]
        size = gpu_utils.choose_batch_size(total, "auto" if args.batch_size is None else args.batch_size, target=target)
        if args.batch_size is None:
            source["batch_size"] = f"preset {args.preset}" + ("" if size == target else ", auto")
        else:
            source["batch_size"] = f"auto, <= {target}" if args.batch_size.strip().lower() == "auto" else "explicit"
        args.batch_size = str(size)
    args.num_minibatches = total // int(args.batch_size)
    return args, source


def hidden_sizes(arch: str) -> list[int]:
    sizes = [int(s) if s.strip().isdecimal() else 0 for s in arch.split(",") if s.strip()]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--network-arch {arch!r} must be comma-separated positive sizes, e.g. 64,64")
    return sizes


def make_env(env_id, idx, capture_video, run_name, in_subprocess):
    def thunk():
        if in_subprocess:  # the parent handles Ctrl-C and closes the workers
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        env = gym.make(env_id, render_mode="rgb_array" if capture_video and idx == 0 else None)
        if capture_video and idx == 0:
            env = gym.wrappers.RecordVideo(env, f"videos/{run_name}")
        if len(env.observation_space.shape or ()) != 1:
            env = gym.wrappers.FlattenObservation(env)
        return DropInfo(env)

    return thunk


class DropInfo(gym.Wrapper):
    """Drop the per-step info dict (MuJoCo's reward terms): batching it costs more than the rest of a vector step."""

    def step(self, action):
        return *self.env.step(action)[:4], {}


class RunningMeanStd:
    """Running mean/variance on the host (numpy, float64), parallel-update formula as gymnasium's wrappers."""

    def __init__(self, shape=()):
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4

    def update(self, x):
        b_count = x.shape[0]
        b_mean = x.sum(0) / b_count  # sum/count: np.mean and np.var cost more than the update itself on tiny batches
        b_var = np.square(x - b_mean).sum(0) / b_count
        delta, tot = b_mean - self.mean, self.count + b_count
        self.mean = self.mean + delta * (b_count / tot)
        self.var = (self.var * self.count + b_var * b_count + delta**2 * (self.count * b_count / tot)) / tot
        self.count = tot


class ObsNormalizer(nn.Module):
    """Observation-normalisation statistics as buffers, so they are saved and loaded with the model."""

    def __init__(self, obs_dim):
        super().__init__()
        self.register_buffer("mean", torch.zeros(obs_dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(obs_dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    def forward(self, obs):
        return ((obs - self.mean) / torch.sqrt(self.var + 1e-8)).clamp(-10.0, 10.0).float()

    def load_rms(self, rms: RunningMeanStd):
        self.mean.copy_(torch.from_numpy(np.asarray(rms.mean)))
        self.var.copy_(torch.from_numpy(np.asarray(rms.var)))
        self.count.fill_(rms.count)


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim, hidden, out_dim, out_std):
    layers, last = [], in_dim
    for h in hidden:
        layers += [layer_init(nn.Linear(last, h)), nn.Tanh()]
        last = h
    return nn.Sequential(*layers, layer_init(nn.Linear(last, out_dim), std=out_std))


class Agent(nn.Module):
    def __init__(self, obs_dim, act_dim, hidden):
        super().__init__()
        self.obs_norm = ObsNormalizer(obs_dim)
        self.critic = mlp(obs_dim, hidden, 1, out_std=1.0)
        self.actor_mean = mlp(obs_dim, hidden, act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def forward(self, norm_obs):  # normalised observations -> action mean, value
        return self.actor_mean(norm_obs), self.critic(norm_obs)

    def act(self, raw_obs):  # raw observations -> deterministic (mean) actions, with the saved statistics
        return self.actor_mean(self.obs_norm(raw_obs))


def ppo_loss(agent, args, obs, actions, logprobs, advantages, returns, values):
    mean, logstd = agent.actor_mean(obs), agent.actor_logstd
    z = (actions - mean) * torch.exp(-logstd)
    newlogprob = (-0.5 * z.pow(2) - logstd).sum(1) - LOG_2PI_HALF * actions.shape[1]
    entropy = (logstd + 0.5 + LOG_2PI_HALF).sum()  # state-independent std: same for every sample
    newvalue = agent.critic(obs).view(-1)
    logratio = newlogprob - logprobs
    ratio = logratio.exp()
    if args.norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef))
    pg_loss = pg_loss.mean()
    if args.clip_vloss:
        v_clipped = values + torch.clamp(newvalue - values, -args.clip_coef, args.clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    loss = pg_loss - args.ent_coef * entropy + v_loss * args.vf_coef
    return loss, (pg_loss, v_loss, entropy, logratio, ratio)


@torch.no_grad()
def ppo_stats(args, pg_loss, v_loss, entropy, logratio, ratio):
    """Logged diagnostics, computed only for the last minibatch of each epoch (no host sync per minibatch)."""
    clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
    return torch.stack([pg_loss, v_loss, entropy, (-logratio).mean(), ((ratio - 1) - logratio).mean(), clipfrac])


def clip_grad_norm(grads, max_norm):
    """nn.utils.clip_grad_norm_ in three foreach ops (its Python overhead is large next to a 64x64 MLP)."""
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))


def load_checkpoint(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        assert isinstance(ckpt, dict) and "agent" in ckpt
        ckpt["args"] = {k: v for k, v in ckpt["args"].items() if k in Args.__dataclass_fields__}
    except Exception:
        raise ValueError(f"{path} is not a ppo_continuous.py checkpoint or model file") from None
    return ckpt


@torch.no_grad()
def evaluate(args):
    ckpt = load_checkpoint(args.eval_checkpoint)
    saved = Args(**ckpt["args"])
    env = make_env(saved.env_id, 0, False, "", False)()
    agent = Agent(env.observation_space.shape[0], env.action_space.shape[0], hidden_sizes(saved.network_arch))
    agent.load_state_dict(ckpt["agent"])
    returns, (obs, _) = [], env.reset(seed=args.seed)
    while len(returns) < args.eval_episodes:
        ep_return, done = 0.0, False
        while not done:
            action = agent.act(torch.from_numpy(np.asarray(obs, dtype=np.float64))[None])[0].numpy()
            obs, reward, term, trunc, _ = env.step(np.clip(action, env.action_space.low, env.action_space.high))
            ep_return, done = ep_return + float(reward), term or trunc
        returns.append(ep_return)
        obs, _ = env.reset()
    env.close()
    print(f"eval {saved.env_id}: mean return {np.mean(returns):.2f} +- {np.std(returns):.2f} ({len(returns)} episodes)")
    return returns


def main(args: Args):
    if args.eval_checkpoint:
        return evaluate(args)
    ckpt = load_checkpoint(args.resume) if args.resume else None
    if ckpt:
        if "optimizer" not in ckpt:
            raise ValueError(f"{args.resume} is a model file, not a training checkpoint; resume needs checkpoint.pt")
        args = Args(**{**ckpt["args"], "resume": args.resume, "progress_bar": args.progress_bar})
        source = dict.fromkeys(("num_envs", "num_steps", "update_epochs", "network_arch", "batch_size"), "checkpoint")
    else:
        args, source = resolve_args(args)
    hidden = hidden_sizes(args.network_arch)
    try:
        gym.spec(args.env_id)
    except gym.error.Error:
        raise ValueError(f"unknown env id {args.env_id!r}; try HalfCheetah-v5, Hopper-v5 or Pendulum-v1") from None
    with gym.make(args.env_id) as probe:
        act_space = probe.action_space
    if not isinstance(act_space, gym.spaces.Box):
        kind = type(act_space).__name__
        raise ValueError(f"{args.env_id} has a {kind} action space; use a continuous (Box) one, e.g. Pendulum-v1")
    batch, minibatch = args.num_envs * args.num_steps, int(args.batch_size)
    num_iterations = args.total_timesteps // batch
    if num_iterations < 1:
        raise ValueError(f"--total-timesteps {args.total_timesteps} is less than one batch ({batch} = envs x steps)")

    # device: a small MLP runs faster on the CPU (per-step host<->device copies cost more than the compute saves)
    if args.gpu == "auto" and args.preset is None and max(hidden) < 256:
        device = torch.device("cpu")
        why = f"--gpu auto: network {args.network_arch} is small (< 256 units), CPU is faster; --gpu true forces GPU"
    else:
        device = gpu_utils.select_device(args.gpu, args.session, args.cuda_offset)
        why = f"--gpu {args.gpu}" + (", no GPU available" if device.type == "cpu" and args.gpu == "auto" else "")
    if args.cudagraphs and device.type != "cuda":
        raise ValueError("--cudagraphs needs a GPU; drop it or use --gpu true on a CUDA machine")
    tf32 = gpu_utils.enable_tf32(args.tf32) if device.type == "cuda" else False
    env_tag = args.env_id.replace("/", "_")
    run_name = ckpt["run_name"] if ckpt else f"{env_tag}__{args.exp_name}__{args.seed}__{int(time.time())}"
    print(f"device: {device} ({why}){', TF32 on' if tf32 else ''}")
    print(f"config: env {args.env_id}, preset {args.preset}, {args.total_timesteps} steps, {num_iterations} iterations")
    for key, value in source.items():
        print(f"  {key:<14} {getattr(args, key):<18} ({value})")
    print(f"  total batch    {batch:<18} ({args.num_minibatches} minibatches), subproc {args.subproc}")

    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                   config=vars(args), name=run_name, monitor_gym=True, save_code=True, resume="allow",
                   id=ckpt.get("wandb_id") if ckpt else None)  # fmt: skip
    writer = SummaryWriter(f"runs/{run_name}")
    table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.capture_video and not os.environ.get("DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")  # headless MuJoCo rendering
    # env setup: episode statistics, action clipping, obs/reward normalisation (+-10) are done here, vectorised
    fns = [make_env(args.env_id, i, args.capture_video, run_name, args.subproc) for i in range(args.num_envs)]
    mode = gym.vector.AutoresetMode.SAME_STEP  # final obs of a truncated episode is bootstrapped with the critic
    if args.subproc:
        gpu_utils.limit_threads(1)  # before the workers start: one BLAS/OpenMP thread each
        envs = gym.vector.AsyncVectorEnv(fns, context="forkserver", autoreset_mode=mode, copy=False)
    else:
        envs = gym.vector.SyncVectorEnv(fns, autoreset_mode=mode, copy=False)
    torch.set_num_threads(args.torch_threads or (1 if max(hidden) < 256 and device.type == "cpu" else os.cpu_count()))
    obs_dim, act_dim = int(np.prod(envs.single_observation_space.shape)), envs.single_action_space.shape[0]
    act_low, act_high = envs.single_action_space.low, envs.single_action_space.high
    agent = Agent(obs_dim, act_dim, hidden).to(device)
    params = list(agent.parameters())  # listed once: clip_grad_norm runs every minibatch
    optimizer = torch.optim.Adam(params, lr=args.learning_rate, eps=1e-5, fused=True)
    loss_fn = torch.compile(ppo_loss, mode="reduce-overhead" if args.cudagraphs else None) if args.compile else ppo_loss
    # the host keeps the observation statistics (cheap per step) and copies them into agent.obs_norm on save
    obs_rms, ret_rms, start_iteration, global_step = RunningMeanStd(obs_dim), RunningMeanStd(), 1, 0
    if ckpt:
        agent.load_state_dict(ckpt["agent"])
        optimizer.load_state_dict(ckpt["optimizer"])
        obs_rms.mean, obs_rms.var = agent.obs_norm.mean.cpu().numpy().copy(), agent.obs_norm.var.cpu().numpy().copy()
        obs_rms.count = agent.obs_norm.count.item()
        ret_rms.mean, ret_rms.var, ret_rms.count = ckpt["ret_rms"]
        start_iteration, global_step = ckpt["iteration"] + 1, ckpt["global_step"]
        random.setstate(ckpt["rng"]["python"])
        np.random.set_state(tuple(ckpt["rng"]["numpy"]))
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and ckpt["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)
        print(f"resumed {args.resume} at step {global_step} (iteration {start_iteration - 1} of {num_iterations})")
    nb, example = (obs_dim + act_dim + 5) * 4, torch.zeros(1, obs_dim, device=device)  # nb: bytes per transition
    estimate = gpu_utils.estimate_memory(
        agent, batch_bytes=minibatch * nb, rollout_bytes=batch * nb, example_input=example, batch_size=minibatch
    )
    print(estimate)
    writer.add_scalar("memory/estimated_mib", estimate.total / 2**20, global_step)

    # rollout storage: observations are normalised on the host (into a pinned buffer on GPU), the rest on device
    obs_host = torch.zeros((args.num_steps, args.num_envs, obs_dim), pin_memory=device.type == "cuda")
    obs_buf = obs_host if device.type == "cpu" else torch.zeros_like(obs_host, device=device)
    obs_np = obs_host.numpy()
    actions = torch.zeros((args.num_steps, args.num_envs, act_dim), device=device)
    rewards, dones = np.zeros((2, args.num_steps, args.num_envs), dtype=np.float32)

    def normalize(obs, update):
        obs = np.asarray(obs, dtype=np.float64).reshape(len(obs), -1)
        if update:
            obs_rms.update(obs)
        return np.clip((obs - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10.0, 10.0)

    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.append(signum))
    monitor = gpu_utils.GPUMonitor(device).start()  # samples GPU utilisation; a no-op on CPU
    pbar = tqdm(total=args.total_timesteps, initial=global_step, disable=not args.progress_bar, unit="step")
    next_obs_n = normalize(envs.reset(seed=args.seed + (start_iteration - 1) * args.num_envs)[0], True)
    next_done, ep_length = np.zeros(args.num_envs, dtype=np.float32), np.zeros(args.num_envs, dtype=np.int64)
    ep_return, discounted = np.zeros(args.num_envs), np.zeros(args.num_envs)
    recent, iteration_times, train_start = [], [], time.time()
    for iteration in range(start_iteration, num_iterations + 1):
        t0 = time.time()
        if args.anneal_lr:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / num_iterations) * args.learning_rate
        noise = torch.randn((args.num_steps, args.num_envs, act_dim), device=device)
        with torch.no_grad():
            std = agent.actor_logstd.exp()
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs_np[step], dones[step] = next_obs_n, next_done
                obs_t = obs_host[step] if device.type == "cpu" else obs_buf[step].copy_(obs_host[step], True)
                actions[step] = agent.actor_mean(obs_t) + std * noise[step]
                action = np.clip(actions[step].cpu().numpy(), act_low, act_high)
                next_obs, reward, term, trunc, infos = envs.step(action)
                done = np.logical_or(term, trunc)
                ep_return, ep_length, discounted = ep_return + reward, ep_length + 1, discounted * args.gamma + reward
                ret_rms.update(discounted)
                rewards[step] = np.clip(reward / np.sqrt(ret_rms.var + 1e-8), -10.0, 10.0)
                next_obs_n, next_done = normalize(next_obs, True), done.astype(np.float32)
                if done.any():
                    bootstrap = np.nonzero(trunc & ~term)[0]
                    if len(bootstrap):  # time limit: the episode did not end, bootstrap from its final observation
                        final = normalize(np.stack([infos["final_obs"][i] for i in bootstrap]), False)
                        v = agent.critic(torch.as_tensor(final, dtype=torch.float32, device=device)).view(-1)
                        rewards[step, bootstrap] += args.gamma * v.cpu().numpy()
                    for i in np.nonzero(done)[0]:
                        writer.add_scalar("charts/episodic_return", ep_return[i], global_step)
                        writer.add_scalar("charts/episodic_length", ep_length[i], global_step)
                        recent = (recent + [float(ep_return[i])])[-20:]
                    ep_return[done], ep_length[done], discounted[done] = 0.0, 0, 0.0

            # values and log-probs in one batched pass each (the policy did not change during the rollout)
            b_obs = obs_buf.view(-1, obs_dim)
            values = agent.critic(b_obs).view(args.num_steps, args.num_envs).cpu().numpy()
            next_value = agent.critic(torch.as_tensor(next_obs_n, dtype=torch.float32, device=device))
            next_value = next_value.view(-1).cpu().numpy()
            logprobs = (-0.5 * noise.pow(2) - agent.actor_logstd).sum(-1) - LOG_2PI_HALF * act_dim
            advantages, lastgaelam = np.zeros_like(rewards), 0.0
            for t in reversed(range(args.num_steps)):
                nextnonterminal = 1.0 - (next_done if t == args.num_steps - 1 else dones[t + 1])
                nextvalues = next_value if t == args.num_steps - 1 else values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        t_rollout = time.time() - t0
        # update: shuffle once per epoch, then contiguous minibatch slices
        b_data = [b_obs, actions.view(-1, act_dim), logprobs.view(-1)]
        b_data += [torch.from_numpy(x.reshape(-1)).to(device) for x in (advantages, returns, values)]
        stats = []
        for _epoch in range(args.update_epochs):
            perm = torch.randperm(batch, device=device)
            shuffled = [x[perm] for x in b_data]
            for start in range(0, batch, minibatch):
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
                    loss, aux = loss_fn(agent, args, *[x[start : start + minibatch] for x in shuffled])
                optimizer.zero_grad()
                loss.backward()
                clip_grad_norm([p.grad for p in params], args.max_grad_norm)
                optimizer.step()
            stats.append(ppo_stats(args, *aux))
            if args.target_kl is not None and stats[-1][4].item() > args.target_kl:
                break
        iteration_times.append(time.time() - t0)
        sps, var_y = int(batch / iteration_times[-1]), np.var(returns)
        names = ("policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl")
        scalars = {f"losses/{name}": value for name, value in zip(names, stats[-1].tolist())}
        scalars["losses/clipfrac"] = torch.stack(stats)[:, 5].mean().item()
        scalars["losses/explained_variance"] = np.nan if var_y == 0 else 1 - np.var(returns - values) / var_y
        scalars |= {"charts/learning_rate": optimizer.param_groups[0]["lr"], **monitor.collect()}
        if iteration > start_iteration:  # the first iteration after a start or resume is warm-up
            scalars["charts/SPS"] = sps
        for key, value in scalars.items():
            writer.add_scalar(key, value, global_step)
        pbar.update(batch)
        pbar.set_postfix(SPS=sps, ret=f"{np.mean(recent):.1f}" if recent else "-")
        if not args.progress_bar:
            ret = f", return {np.mean(recent):.1f}" if recent else ""
            timing = f"rollout {t_rollout:.2f}s, update {iteration_times[-1] - t_rollout:.2f}s"
            print(f"iteration {iteration}/{num_iterations}: step {global_step}, SPS {sps} ({timing}){ret}", flush=True)
        if stop or (args.checkpoint_every and iteration % args.checkpoint_every == 0) or iteration == num_iterations:
            agent.obs_norm.load_rms(obs_rms)
            np_rng = [s.tolist() if isinstance(s, np.ndarray) else s for s in np.random.get_state()]  # weights_only
            cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
            rng = dict(python=random.getstate(), numpy=np_rng, torch=torch.get_rng_state(), cuda=cuda_rng)
            state = dict(agent=agent.state_dict(), optimizer=optimizer.state_dict(), args=asdict(args), rng=rng)
            state.update(run_name=run_name, iteration=iteration, global_step=global_step)
            state["ret_rms"] = (float(ret_rms.mean), float(ret_rms.var), float(ret_rms.count))
            state["wandb_id"] = wandb.run.id if args.track else None
            state["status"] = "stopped" if stop else "finished" if iteration == num_iterations else "running"
            path = f"runs/{run_name}/checkpoint.pt"
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)  # atomic: an interrupted save keeps the previous checkpoint
            if stop:
                print(
                    f"stopping on {signal.Signals(stop[0]).name}: checkpoint at step {global_step}; "
                    f"continue with: python {sys.argv[0]} --resume {path}"
                )
                break

    pbar.close()
    steady = iteration_times[1:] or iteration_times  # the first iteration includes warm-up
    if steady:
        print(f"SPS: {batch * len(steady) / sum(steady):.0f} (agent steps/s, first iteration excluded)")
    print(f"mean return of recent episodes: {np.mean(recent) if recent else float('nan'):.2f} at step {global_step}")
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**20
        writer.add_scalar("memory/peak_allocated_mib", peak, global_step)
        print(f"peak allocated {peak:.1f} MiB (estimated {estimate.total / 2**20:.1f} MiB)")
    if args.save_model and not stop:  # an interrupted run keeps its checkpoint.pt (eval accepts it too)
        model_path = f"runs/{run_name}/{args.exp_name}.model"
        torch.save(dict(agent=agent.state_dict(), args=asdict(args), run_name=run_name), model_path)
        print(f"model saved to {model_path}")
    monitor.close()
    envs.close()
    writer.close()
    print(f"wall time {time.time() - train_start:.1f}s, run dir runs/{run_name}")


if __name__ == "__main__":
    try:
        main(tyro.cli(Args))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
