# PPO for continuous control (Gaussian policy, MuJoCo, any Box action env), CleanRL style, GPU presets.
# Usage: python ppo_continuous.py --env-id HalfCheetah-v5      python ppo_continuous.py --preset heavy
import collections
import os
import signal
import time
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from tqdm import tqdm

import continuous_envs
import gpu_utils
import mjx_envs
import run_utils


@dataclass
# RunArgs: how and where it runs (--gpu, --resume, --cudagraphs, ...)
class Args(run_utils.RunArgs):
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (runs/<env>__<exp_name>__<seed>__<unix time>)"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """deterministic cuDNN algorithms (and no cuDNN benchmark mode)"""
    checkpoint_every: int = 50
    """write runs/<run_name>/checkpoint.pt every this many iterations (0: at the end or a stop)"""

    # Algorithm specific arguments
    env_id: str = "HalfCheetah-v5"
    """any gymnasium env id with a continuous (Box) action space"""
    preset: Literal["fast", "heavy", "beast", "worlds"] | None = None
    """GPU-heavy settings (see PRESETS; worlds: for --sim mjx); flags you pass still win"""
    sim: Literal["cpu", "mjx"] = "cpu"
    """where the physics runs: cpu (gymnasium's MuJoCo envs) or mjx (the envs as one batch of worlds
    on the device: HalfCheetah, Hopper, Walker2d, InvertedPendulum v5; pip install -e ".[mjx]")"""
    mjx_impl: Literal["jax", "warp"] = "jax"
    """MJX's backend with --sim mjx: jax (any JAX device) or warp (NVIDIA GPUs; the warp extra)"""
    physics: Literal["exact", "fast"] = "exact"
    """the MJX worlds' solver with --sim mjx: exact (gymnasium's XML settings) or fast (fewer solver
    iterations per task, chosen by one-step errors, checked by learning: docs/mjx.md#fast-physics-physicsfast)"""
    subproc: bool = False
    """step the envs in subprocesses (AsyncVectorEnv, forkserver); default in-process"""
    total_timesteps: int = 1000000
    """total agent steps (env steps summed over all envs)"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int | None = None
    """the number of parallel environments (default 1; a preset sets it)"""
    num_steps: int | None = None
    """steps per env per rollout, independent of --num-envs (default 2048; a preset sets it)"""
    anneal_lr: bool = True
    """linearly anneal the learning rate to 0 over the run"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation, in [0, 1]"""
    minibatch_size: str | None = None
    """rows per minibatch dividing envs x steps, or auto (largest <= the preset's or total/32)"""
    num_minibatches: int | None = None
    """the number of minibatches (default 32); an alternative to --minibatch-size"""
    update_epochs: int | None = None
    """the K epochs to update the policy (default 10; a preset sets it)"""
    network_arch: str | None = None
    """the actor's and critic's hidden sizes, comma-separated (default 64,64; a preset sets it)"""
    norm_adv: bool = True
    """normalize advantages per minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """use a clipped loss for the value function"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """stop the update epochs of an iteration once the approximate KL exceeds this"""


# flags that --resume takes from the command line; every other Args field comes from the checkpoint
RUNTIME_FLAGS = run_utils.RUN_FLAGS | {"subproc", "mjx_impl"}
DEFAULTS = dict(num_envs=1, num_steps=2048, num_minibatches=32, update_epochs=10, network_arch="64,64")
PRESETS = {  # envs, steps per env, minibatch size, epochs, hidden sizes
    "fast": dict(num_envs=16, num_steps=256, minibatch_size="2048", update_epochs=15, network_arch="512,512"),
    "heavy": dict(num_envs=32, num_steps=256, minibatch_size="4096", update_epochs=20, network_arch="1024,512,256"),
    "beast": dict(num_envs=64, num_steps=512, minibatch_size="8192", update_epochs=30, network_arch="1024,512,512,256"),
    # many worlds, short rollouts: as MuJoCo Playground's PPO runs them (H200: 93% of physics' rate)
    "worlds": dict(num_envs=4096, num_steps=32, minibatch_size="16384", update_epochs=4, network_arch="256,256"),
}
LOG_2PI_HALF = float(0.5 * np.log(2 * np.pi))


def resolve_args(args: Args) -> dict[str, str]:
    """Fill the unset (None) fields from the preset, then DEFAULTS, and the minibatch size that
    follows; a flag passed at all (even at its default) wins. Returns each setting's source."""
    preset = PRESETS.get(args.preset, {})
    unset = f"preset {args.preset}" if preset else "default"  # the source of a setting not passed
    keys = ("num_envs", "num_steps", "update_epochs", "network_arch")
    not_passed = [key for key in keys if getattr(args, key) is None]
    sources = {key: unset if key in not_passed else "command line" for key in keys}
    vars(args).update({key: preset.get(key, DEFAULTS[key]) for key in not_passed})
    counts = (args.num_envs, args.num_steps, args.update_epochs)
    positive = f"--num-envs, --num-steps and --update-epochs must be at least 1, got {counts}"
    not_both = "pass either --minibatch-size or --num-minibatches, not both"
    both = args.num_minibatches is not None and args.minibatch_size is not None
    run_utils.check({positive: min(counts) >= 1, not_both: not both})
    total = args.num_envs * args.num_steps
    if args.num_minibatches is not None or (args.minibatch_size is None and not preset):
        nmb = DEFAULTS["num_minibatches"] if args.num_minibatches is None else args.num_minibatches
        sources["num_minibatches"] = "default" if args.num_minibatches is None else "command line"
        sources["minibatch_size"] = "derived"
        args.minibatch_size = str(gpu_utils.choose_batch_size(total, parts=nmb))
    else:
        # a size dividing the total, 'auto', or the preset's (else the largest divisor below it)
        default_size = max(2, total // DEFAULTS["num_minibatches"])
        target = int(preset["minibatch_size"]) if preset else default_size
        requested = "auto" if args.minibatch_size is None else args.minibatch_size
        size = gpu_utils.choose_batch_size(total, requested, target=target)
        if args.minibatch_size is None:
            sources["minibatch_size"] = unset + ("" if size == target else ", auto")
        elif requested.strip().lower() == "auto":
            sources["minibatch_size"] = f"auto, <= {target}"
        else:
            sources["minibatch_size"] = "command line"
        args.minibatch_size = str(size)
        sources["num_minibatches"] = "derived"
    args.num_minibatches = total // int(args.minibatch_size)
    return sources


def validate(args: Args, evaluating: bool) -> None:
    """Raise ValueError with the one-line message of the first setting that cannot work."""
    hidden_sizes(args.network_arch)
    video = args.capture_video and args.sim == "cpu" and not evaluating
    act_space = continuous_envs.action_space(args.env_id, video=video)
    kind = type(act_space).__name__
    box = f"{args.env_id} has a {kind} action space; use a continuous (Box) one, e.g. Pendulum-v1"
    run_utils.check({box: isinstance(act_space, gym.spaces.Box)})
    batch_size = args.num_envs * args.num_steps
    enough = f"--total-timesteps {args.total_timesteps} is less than one batch ({batch_size} = envs x steps)"
    worlds = f"--sim mjx has {', '.join(mjx_envs.TASKS)}, not {args.env_id}; use --sim cpu for it"
    mjx_only = "--sim mjx steps every env on the device: drop --subproc and --capture-video"
    physics = "--physics fast is for --sim mjx's worlds: add --sim mjx, or drop it"
    preset = "--preset worlds is 4,096 envs for --sim mjx: add --sim mjx, or use another preset"
    checks = {
        # before "enough": worlds sets the batch
        preset: args.preset != "worlds" or args.sim == "mjx",
        physics: args.physics == "exact" or args.sim == "mjx",
        enough: evaluating or args.total_timesteps >= batch_size,
    }
    if args.sim == "mjx" and not evaluating:  # the extra, before the run writes anything
        extra = mjx_envs.missing_extra(args.mjx_impl)
        checks[worlds] = args.env_id in mjx_envs.TASKS
        checks[mjx_only] = not (args.subproc or args.capture_video)
        checks[f"--sim mjx: {extra}"] = not extra
    run_utils.check(run_utils.shared_checks(args, one_process=True) | checks)


def hidden_sizes(arch: str) -> list[int]:
    sizes = [int(s) if s.strip().isdecimal() else 0 for s in arch.split(",") if s.strip()]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--network-arch {arch!r}: use comma-separated positive sizes, e.g. 64,64")
    return sizes


# ---------------------------------------------------------------- environment
# One env as CleanRL makes it; continuous_envs applies CleanRL's wrappers to all envs at once.
def make_env(env_id, idx, capture_video=False, video_folder="", in_subprocess=False):
    parent = os.getpid()

    def thunk():
        # a worker leaves the stop signals (sent to the process group) to the parent: it ends its
        # iteration, saves its checkpoint, closes the workers (AsyncVectorEnv calls one thunk here)
        if in_subprocess and os.getpid() != parent:
            for sig in run_utils.STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
        continuous_envs.warn_once_per_process(env_id)
        env = gym.make(env_id, render_mode="rgb_array" if capture_video and idx == 0 else None)
        if capture_video and idx == 0:
            env = continuous_envs.RecordVideo(env, video_folder)  # a failed write: a warning
        if len(env.observation_space.shape or ()) != 1:
            env = gym.wrappers.FlattenObservation(env)
        return continuous_envs.DropInfo(env)

    return thunk


# ---------------------------------------------------------------- network
def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim, hidden, out_dim, out_std):
    layers = []
    last = in_dim
    for h in hidden:
        layers += [layer_init(nn.Linear(last, h)), nn.Tanh()]
        last = h
    return nn.Sequential(*layers, layer_init(nn.Linear(last, out_dim), std=out_std))


class Agent(nn.Module):
    def __init__(self, obs_dim, act_dim, hidden, amp: bool = False):
        super().__init__()
        # bf16 for the hidden layers only: output layers, log-probs and values stay fp32
        self.amp = amp
        self.critic = mlp(obs_dim, hidden, 1, out_std=1.0)
        self.actor_mean = mlp(obs_dim, hidden, act_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def run(self, layers: nn.Sequential, x):
        *hidden_layers, output_layer = layers
        with torch.autocast(x.device.type, torch.bfloat16, enabled=self.amp):
            for layer in hidden_layers:
                x = layer(x)
        return output_layer(x.float())

    def forward(self, norm_obs):  # normalised observations -> (action means, values)
        return self.mean(norm_obs), self.value(norm_obs)

    # the rollout and the loss both use it: the same precision in the ratio
    def mean(self, norm_obs):
        return self.run(self.actor_mean, norm_obs)

    def value(self, norm_obs):
        return self.run(self.critic, norm_obs).view(-1)


# ---------------------------------------------------------------- algorithm
def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """GAE over a (T, N) rollout (dones[t] = 1: obs[t] starts an episode): (advantages, returns)"""
    nextnonterminal = 1.0 - torch.cat([dones[1:], next_done[None]])
    deltas = rewards + gamma * torch.cat([values[1:], next_value[None]]) * nextnonterminal - values
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        lastgaelam = deltas[t] + gamma * gae_lambda * nextnonterminal[t] * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def ppo_loss(agent, obs, actions, logprobs, advantages, returns, values, args: Args):
    """Clipped PPO loss of a (micro-)batch, advantages normalised: (loss, {name: mean over rows})"""
    clip_coef = args.clip_coef
    logstd = agent.actor_logstd
    z = (actions - agent.mean(obs)) * torch.exp(-logstd)
    newlogprob = (-0.5 * z.pow(2) - logstd).sum(1) - LOG_2PI_HALF * actions.shape[1]
    # state-independent std: the same for every sample
    entropy = (logstd + 0.5 + LOG_2PI_HALF).sum()
    newvalue = agent.value(obs)
    logratio = newlogprob - logprobs
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
            # the first minibatch's must be 0: rollout and loss agree
            "ratio_mse": ((ratio - 1) ** 2).mean(),
        }
    return pg_loss - args.ent_coef * entropy + v_loss * args.vf_coef, stats


# ---------------------------------------------------------------- checkpoint and evaluation
@torch.no_grad()
def evaluate(ckpt: dict, hidden: list[int], args: Args) -> np.ndarray:
    """Each env's first return, playing the checkpoint's mean actions in --eval-episodes envs
    (averaging episodes in the order they end would favour short ones)."""
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, i) for i in range(args.eval_episodes)])
    action_space = envs.single_action_space
    agent = Agent(envs.single_observation_space.shape[0], action_space.shape[0], hidden)
    run_utils.load_states({"model": agent}, ckpt, args.eval_checkpoint)
    obs_rms = continuous_envs.RunningMeanStd(state=ckpt["obs_rms"])
    obs, _ = envs.reset(seed=args.seed)
    returns = np.zeros(envs.num_envs)
    finished = np.zeros(envs.num_envs, dtype=bool)
    while not finished.all():
        actions = agent.mean(torch.as_tensor(obs_rms.normalize(obs, False), dtype=torch.float32))
        actions = np.clip(actions.numpy(), action_space.low, action_space.high)
        obs, reward, terminated, truncated, _ = envs.step(actions)
        returns += reward * ~finished
        finished |= terminated | truncated
    return returns


if __name__ == "__main__":
    # ---------------- arguments and their checks
    run_utils.stop_in_one_line()  # until the run starts
    args = tyro.cli(Args)
    given = dict(vars(args))  # as typed, before the preset and the checkpoint fill in the rest
    with run_utils.one_line_errors():
        ckpt = run_utils.load_checkpoint(args.resume, "ppo_continuous", training=True) if args.resume else None
        eval_ckpt = run_utils.load_checkpoint(args.eval_checkpoint, "ppo_continuous") if args.eval_checkpoint else None
        if eval_ckpt:  # its network, no training sizes; the seed and episodes from the command line
            args.env_id = eval_ckpt["args"]["env_id"]
            args.network_arch = eval_ckpt["args"]["network_arch"]
            for key in ("preset", "num_envs", "num_steps", "minibatch_size", "num_minibatches"):
                setattr(args, key, None)
        if ckpt:  # the run's settings; how and where it runs comes from the command line
            run_utils.resume_args(args, ckpt, RUNTIME_FLAGS)
        sources = {} if ckpt else resolve_args(args)
        validate(args, evaluating=eval_ckpt is not None)
        hidden = hidden_sizes(args.network_arch)
        batch_size = args.num_envs * args.num_steps
        minibatch_size = int(args.minibatch_size)
        micro = gpu_utils.MicroBatch(gpu_utils.parse_micro_batch(args.micro_batch, minibatch_size))
        num_iterations = args.total_timesteps // batch_size
        # a small MLP runs faster on the CPU: a host<->device round trip per env step costs more
        small = max(hidden) < 256 and args.preset is None and args.sim == "cpu"
        why = f"network {args.network_arch} is small (< 256 units), so CPU; --gpu true forces GPU"
        device, device_why = run_utils.select_device(args, prefer_cpu=why if small else "")
        threads = gpu_utils.thread_budget(args.num_threads)
    run_utils.exit_if_done(ckpt, num_iterations, args.resume)

    # ---------------- device, threads, seeds
    tf32 = gpu_utils.enable_tf32(args.tf32, args.torch_deterministic)
    # one torch thread runs a small MLP fastest; env subprocesses inherit the thread variables: 1
    one_thread = small and device.type == "cpu" and not args.num_threads
    torch_threads = 1 if one_thread else threads.threads
    gpu_utils.limit_threads(1 if args.subproc else torch_threads)
    torch.set_num_threads(torch_threads)
    run_utils.seed(args.seed)
    if eval_ckpt:
        run_utils.end_evaluation(args.env_id, evaluate(eval_ckpt, hidden, args))
    # registers this run among the live ones and takes its share of the CPUs
    cpu_share = gpu_utils.CpuShare(threads, max_torch_threads=torch_threads)
    env_threads = "1 in each env subprocess" if args.subproc else "the envs step in this process"
    run_utils.print_device(device, device_why, tf32, args.amp, cpu_share, env_threads)
    total_steps = num_iterations * batch_size
    run_utils.print_config(args, given, ckpt is not None, RUNTIME_FLAGS, total_steps, sources)

    # ---------------- logging
    start_step = ckpt["global_step"] if ckpt else 0
    run_name = ckpt["run_name"] if ckpt else run_utils.new_run_name(args.env_id, args)
    # MJX's worlds first: a jaxlib that refuses the device writes no run
    with run_utils.one_line_errors():
        worlds = None
        if args.sim == "mjx":
            placed = dict(seed=args.seed, device=device, impl=args.mjx_impl, physics=args.physics)
            worlds = mjx_envs.MJXVectorEnv(args.env_id, args.num_envs, **placed)
        run_dir = run_utils.run_folder(run_name, args.resume)
        writer = run_utils.open_logs(run_dir, args, device, start_step, ckpt and ckpt["wandb_id"])
    pbar = tqdm(total=total_steps, initial=start_step, disable=not args.progress_bar, unit_scale=True)
    monitor = gpu_utils.GPUMonitor(device).start()

    # ---------------- env and network (continuous_envs clips, normalises, bootstraps time limits)
    if worlds is not None:  # every env a world of one batch on the device
        envs = continuous_envs.DeviceEnvs(worlds, args.gamma, device, ckpt)
    else:
        videos = run_utils.video_folder(run_dir, start_step)
        fns = [make_env(args.env_id, i, args.capture_video, videos, args.subproc) for i in range(args.num_envs)]
        envs = continuous_envs.HostEnvs(fns, args.subproc, args.gamma, device, ckpt)
    obs_dim, act_dim = envs.obs_dim, envs.act_dim
    agent = Agent(obs_dim, act_dim, hidden, args.amp).to(device)
    params = list(agent.parameters())  # listed once: the clipping runs every minibatch
    learning_rate = gpu_utils.learning_rate_tensor(args.learning_rate, device)  # annealed in place
    use_graph = args.cudagraphs and micro.rows >= minibatch_size  # a graph holds no split minibatch
    optimizer = optim.Adam(params, lr=learning_rate, eps=1e-5, fused=True, capturable=use_graph)
    start_iteration = ckpt["iteration"] + 1 if ckpt else 1
    global_step = start_step
    if ckpt:
        run_utils.load_states({"model": agent, "optimizer": optimizer}, ckpt, args.resume, device=device)

    @torch.no_grad()
    def policy_step(norm_obs, scaled_noise):  # the rollout's actions: the means plus Gaussian noise
        return agent.mean(norm_obs) + scaled_noise

    policy_step = gpu_utils.compile_policy(policy_step, args.compile, args.cudagraphs)
    loss_fn = torch.compile(ppo_loss) if args.compile or args.cudagraphs else ppo_loss

    # ---------------- storage: the rollout on the device
    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs, act_dim), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros_like(rewards)
    # the update's inputs keep their addresses across iterations: a captured graph reads them
    logprobs = torch.zeros_like(rewards)
    values = torch.zeros_like(rewards)
    advantages = torch.zeros_like(rewards)
    returns = torch.zeros_like(rewards)
    b_obs = obs.view(-1, obs_dim)
    b_actions = actions.view(-1, act_dim)
    b_logprobs = logprobs.view(-1)
    b_values = values.view(-1)
    b_advantages = advantages.view(-1)
    b_returns = returns.view(-1)
    transition_bytes = (obs_dim + act_dim + 5) * 4
    memory = gpu_utils.estimate_memory(
        agent,
        batch_bytes=minibatch_size * transition_bytes,
        rollout_bytes=batch_size * transition_bytes,
        example_input=torch.zeros(1, obs_dim, device=device),
        batch_size=minibatch_size,
        cudagraphs=use_graph,
    )
    print(memory)
    writer.add_scalar("memory/estimated_mib", memory.total / 2**20, start_step)

    def update_step(mb_inds):
        """One minibatch step (micro-batches' losses, backward, clipping, Adam) without a host sync,
        so that --cudagraphs captures it as one CUDA graph."""
        optimizer.zero_grad(set_to_none=True)
        mb_advantages = b_advantages[mb_inds]
        if args.norm_adv:  # over the whole minibatch, before it is split into micro-batches
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
        stats = {}
        # their gradients add up to the minibatch's
        for start in range(0, len(mb_inds), micro.rows):
            mb = mb_inds[start : start + micro.rows]
            mb_adv = mb_advantages[start : start + micro.rows]
            loss, mb_stats = loss_fn(
                agent, b_obs[mb], b_actions[mb], b_logprobs[mb], mb_adv, b_returns[mb], b_values[mb], args
            )
            weight = len(mb) / len(mb_inds)
            (loss * weight).backward()
            stats = {name: stats.get(name, 0) + value * weight for name, value in mb_stats.items()}
        nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
        return stats

    update_step = gpu_utils.CudaGraph(update_step, enabled=use_graph, name="update")
    if args.cudagraphs and not use_graph:  # a capture says so itself ("update: one CUDA graph")
        print(f"update: eager (--micro-batch {micro.rows} splits the minibatch)")

    # ---------------- training loop
    next_obs = envs.reset(seed=args.seed + (start_iteration - 1) * args.num_envs)
    next_done = torch.zeros(args.num_envs, device=device)
    recent_returns = collections.deque(maxlen=20)
    stop = run_utils.stop_on_signals()
    started = time.time()
    diverged = False  # NaN or infinite weights after an update: the run stops without saving them
    for iteration in range(start_iteration, num_iterations + 1):
        iteration_start = time.perf_counter()
        frac = 1.0 - (iteration - 1.0) / num_iterations if args.anneal_lr else 1.0
        lr_now = frac * args.learning_rate
        learning_rate.fill_(lr_now)
        noise = torch.randn((args.num_steps, args.num_envs, act_dim), device=device)
        with torch.no_grad():
            std = agent.actor_logstd.exp()  # once per rollout: the policy does not change during it
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                dones[step] = next_done
                actions[step] = policy_step(next_obs, std * noise[step])
                next_obs, rewards[step], next_done = envs.step(actions[step], agent.value, global_step)

            # ---------------- advantages: values and log-probs in one batched pass each
            b_values.copy_(agent.value(b_obs))
            next_value = agent.value(next_obs)
            log_density = (-0.5 * noise.pow(2) - agent.actor_logstd).sum(-1)
            logprobs.copy_(log_density - LOG_2PI_HALF * act_dim)
            gae = compute_gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)
            advantages.copy_(gae[0])
            returns.copy_(gae[1])
        # the update's share of the iteration is logged: the rollout's queued device work ends here
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rollout_seconds = time.perf_counter() - iteration_start

        # ---------------- update: shuffle once per epoch, then minibatch slices of the permutation
        first_ratio_mse = None  # of the first minibatch, before any step
        for _epoch in range(args.update_epochs):
            perm = torch.randperm(batch_size, device=device)
            stats = None  # the sums over the epoch's minibatches, then their means
            for mb_inds in perm.split(minibatch_size):
                mb_stats = gpu_utils.halve_on_oom(update_step, micro, mb_inds)
                if first_ratio_mse is None:  # cloned: a captured graph overwrites its outputs
                    first_ratio_mse = mb_stats["ratio_mse"].clone()
                stats = stats or {name: torch.zeros_like(value) for name, value in mb_stats.items()}
                torch._foreach_add_(list(stats.values()), list(mb_stats.values()))
            stats = {name: total / args.num_minibatches for name, total in stats.items()}
            # a sync an epoch
            if args.target_kl is not None and stats["approx_kl"].item() > args.target_kl:
                break

        # ---------------- logging: one pull of scalars to the host per iteration
        # its mean over the minibatches is not logged: the first minibatch's RMS is
        del stats["ratio_mse"]
        stats["initial_ratio_error"] = first_ratio_mse.sqrt()
        explained_var = 1 - (returns - values).var() / returns.var()
        stats["explained_variance"] = explained_var.nan_to_num(0.0, neginf=0.0)
        # whether the weights are finite rides along, checked before a checkpoint could save them
        *losses, finite = torch.stack([*stats.values(), run_utils.weights_finite(params)]).tolist()
        diverged = not finite
        iteration_seconds = time.perf_counter() - iteration_start
        sps = batch_size / iteration_seconds
        for step, episodic_return, length in envs.finished():  # at the step each episode ended
            writer.add_scalar("charts/episodic_return", episodic_return, step)
            writer.add_scalar("charts/episodic_length", length, step)
            recent_returns.append(episodic_return)
        writer.add_scalar("charts/learning_rate", lr_now, global_step)
        for name, value in zip(stats, losses):
            writer.add_scalar(f"losses/{name}", value, global_step)
        writer.add_scalar("memory/micro_batch", micro.rows, global_step)
        if iteration > start_iteration:  # the first iteration is warm-up (compilation, capture)
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("charts/update_share", 1 - rollout_seconds / iteration_seconds, global_step)
        run_utils.log_machine(writer, global_step, cpu_share, monitor)
        score_text = f"return {np.mean(recent_returns):.1f}" if recent_returns else "return -"
        progress_line = f"iteration {iteration}/{num_iterations}"
        run_utils.show_progress(pbar, global_step, sps, score_text, progress_line)
        # its losses are logged above; the checkpoint on disk keeps the last finite weights
        if diverged:
            break
        stopping = bool(stop)
        finished = iteration == num_iterations
        scheduled = args.checkpoint_every and iteration % args.checkpoint_every == 0
        if scheduled or stopping or finished:
            run_utils.save_checkpoint(
                os.path.join(run_dir, "checkpoint.pt"),
                script="ppo_continuous",
                args=vars(args),
                status="finished" if finished else "stopped" if stopping else "running",
                model=agent.state_dict(),
                optimizer=optimizer.state_dict(),
                rng=[gpu_utils.rng_state(device)],
                iteration=iteration,
                global_step=global_step,
                **envs.state(),  # the observation and reward statistics
            )
        if stopping:
            break

    # ---------------- end of the run
    if args.save_model and not diverged and iteration == num_iterations:
        model_path = os.path.join(run_dir, f"{args.exp_name}.model")
        # the statistics it saw
        model = dict(model=agent.state_dict(), obs_rms=envs.obs_rms.state())
        if run_utils.save_checkpoint(model_path, script="ppo_continuous", args=vars(args), **model):
            print(f"model saved to {model_path}")
    pbar.close()
    envs.close()
    run_utils.end_run(writer, run_dir, global_step, total_steps, started, diverged)
