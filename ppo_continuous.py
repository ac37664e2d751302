# PPO for continuous control (Gaussian policy, MuJoCo and any Box action env), CleanRL style, with GPU-heavy presets.
# Usage: python ppo_continuous.py --env-id HalfCheetah-v5        python ppo_continuous.py --preset heavy
import os
import signal
import time
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

import continuous_envs
import gpu_utils
import mjx_envs
import run_utils


@dataclass
class Args(run_utils.RunArgs):  # RunArgs: the flags of how and where it runs (--gpu, --resume, --cudagraphs, ...)
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (runs/<env>__<exp_name>__<seed>__<unix time>)"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """deterministic cuDNN algorithms (and no cuDNN benchmark mode)"""
    checkpoint_every: int = 50
    """write runs/<run_name>/checkpoint.pt every this many iterations (0: only at the end and on a stopping signal)"""

    # Algorithm specific arguments
    env_id: str = "HalfCheetah-v5"
    """any gymnasium env id with a continuous (Box) action space"""
    preset: Literal["fast", "heavy", "beast", "worlds"] | None = None
    """GPU-heavy settings (see PRESETS; worlds: for --sim mjx); flags you pass explicitly still win"""
    sim: Literal["cpu", "mjx"] = "cpu"
    """where the physics runs: cpu (gymnasium's MuJoCo envs), or mjx (all envs as one batch of worlds on the device
    through MJX: HalfCheetah, Hopper, Walker2d and InvertedPendulum v5; pip install -e ".[mjx]")"""
    mjx_impl: Literal["jax", "warp"] = "jax"
    """MJX's implementation with --sim mjx: jax (any JAX device) or warp (MuJoCo Warp kernels, NVIDIA GPUs; the warp
    extra)"""
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
    """rows per minibatch dividing num_envs * num_steps, or auto (the largest divisor <= the preset's or total/32)"""
    num_minibatches: int | None = None
    """the number of minibatches (default 32); an alternative to --minibatch-size"""
    update_epochs: int | None = None
    """the K epochs to update the policy (default 10; a preset sets it)"""
    network_arch: str | None = None
    """hidden sizes of the actor and critic MLPs, comma-separated (default 64,64; a preset sets it)"""
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
    # thousands of worlds and short rollouts, as MuJoCo Playground's PPO runs them (H200: 93% of the physics' rate)
    "worlds": dict(num_envs=4096, num_steps=32, minibatch_size="16384", update_epochs=4, network_arch="256,256"),
}
LOG_2PI_HALF = float(0.5 * np.log(2 * np.pi))


def resolve_args(args: Args) -> dict[str, str]:
    """Fill the unset (None) fields from the preset, then DEFAULTS, and the minibatch size that follows; a flag passed
    at all (even at its default) wins. Returns where each of these settings came from, for the config print."""
    preset = PRESETS.get(args.preset, {})
    unset = f"preset {args.preset}" if preset else "default"  # where a setting that was not passed comes from
    keys = ("num_envs", "num_steps", "update_epochs", "network_arch")
    sources = {key: unset if getattr(args, key) is None else "command line" for key in keys}
    vars(args).update({key: preset.get(key, DEFAULTS[key]) for key in keys if getattr(args, key) is None})
    counts = (args.num_envs, args.num_steps, args.update_epochs)
    sized = args.minibatch_size is not None
    run_utils.check(
        {
            f"--num-envs, --num-steps and --update-epochs must be at least 1, got {counts}": min(counts) >= 1,
            "pass either --minibatch-size or --num-minibatches, not both": args.num_minibatches is None or not sized,
        }
    )
    total = args.num_envs * args.num_steps
    if args.num_minibatches is not None or (args.minibatch_size is None and not preset):
        nmb = DEFAULTS["num_minibatches"] if args.num_minibatches is None else args.num_minibatches
        sources["num_minibatches"] = "default" if args.num_minibatches is None else "command line"
        sources["minibatch_size"] = "derived"
        args.minibatch_size = str(gpu_utils.choose_batch_size(total, parts=nmb))
    else:  # an integer dividing the total, 'auto', or the preset's size (the largest divisor below it if that fails)
        target = int(preset["minibatch_size"]) if preset else max(2, total // DEFAULTS["num_minibatches"])
        requested = "auto" if args.minibatch_size is None else args.minibatch_size
        size = gpu_utils.choose_batch_size(total, requested, target=target)
        if args.minibatch_size is None:
            sources["minibatch_size"] = f"preset {args.preset}" + ("" if size == target else ", auto")
        else:
            sources["minibatch_size"] = f"auto, <= {target}" if requested.strip().lower() == "auto" else "command line"
        args.minibatch_size = str(size)
        sources["num_minibatches"] = "derived"
    args.num_minibatches = total // int(args.minibatch_size)
    return sources


def validate(args: Args, evaluating: bool) -> None:
    """Raise ValueError with the one-line message of the first setting that cannot work."""
    hidden_sizes(args.network_arch)
    act_space = continuous_envs.action_space(
        args.env_id, video=args.capture_video and args.sim == "cpu" and not evaluating
    )
    if not isinstance(act_space, gym.spaces.Box):
        kind = type(act_space).__name__
        raise ValueError(f"{args.env_id} has a {kind} action space; use a continuous (Box) one, e.g. Pendulum-v1")
    batch_size = args.num_envs * args.num_steps
    enough = f"--total-timesteps {args.total_timesteps} is less than one batch ({batch_size} = envs x steps)"
    worlds = f"--sim mjx has {', '.join(mjx_envs.TASKS)}, not {args.env_id}; use --sim cpu for it"
    mjx_only = "--sim mjx steps every env on the device: drop --subproc and --capture-video"
    preset = "--preset worlds is 4,096 envs for --sim mjx: add --sim mjx, or use --preset fast, heavy or beast"
    checks = {
        preset: args.preset != "worlds" or args.sim == "mjx",  # before "enough": worlds sets the batch
        enough: evaluating or args.total_timesteps >= batch_size,
    }
    if args.sim == "mjx" and not evaluating:  # the extra, before the run writes anything
        extra = mjx_envs.missing_extra(args.mjx_impl)
        checks |= {worlds: args.env_id in mjx_envs.TASKS, mjx_only: not (args.subproc or args.capture_video)}
        checks |= {f"--sim mjx: {extra}": not extra}
    run_utils.check(run_utils.shared_checks(args, one_process=True) | checks)


def hidden_sizes(arch: str) -> list[int]:
    sizes = [int(s) if s.strip().isdecimal() else 0 for s in arch.split(",") if s.strip()]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--network-arch {arch!r} must be comma-separated positive sizes, e.g. 64,64")
    return sizes


# ---------------------------------------------------------------- environment
# One env as CleanRL makes it; continuous_envs applies CleanRL's wrappers to all envs at once (HostEnvs, DeviceEnvs).
def make_env(env_id, idx, capture_video, video_folder, in_subprocess):
    parent = os.getpid()

    def thunk():
        # a worker leaves the stop signals, which reach the whole process group, to the parent: it ends its iteration,
        # saves its checkpoint and closes the workers. AsyncVectorEnv also calls one thunk in the parent.
        if in_subprocess and os.getpid() != parent:
            for sig in run_utils.STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
        continuous_envs.warn_once_per_process(env_id)
        env = gym.make(env_id, render_mode="rgb_array" if capture_video and idx == 0 else None)
        if capture_video and idx == 0:
            env = continuous_envs.RecordVideo(env, video_folder)  # gymnasium's, a failed write a warning
        if len(env.observation_space.shape or ()) != 1:
            env = gym.wrappers.FlattenObservation(env)
        return DropInfo(env)

    return thunk


class DropInfo(gym.Wrapper):
    """Drop the per-step info dict (MuJoCo's reward terms): batching it costs more than the rest of a vector step."""

    def step(self, action):
        return *self.env.step(action)[:4], {}


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
        self.amp = amp  # bf16 for the hidden layers only: output layers, log-probs and values stay fp32
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

    def mean(self, norm_obs):  # the rollout and the loss both use it: the same precision on both sides of the ratio
        return self.run(self.actor_mean, norm_obs)

    def value(self, norm_obs):
        return self.run(self.critic, norm_obs).view(-1)


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
    logstd = agent.actor_logstd
    z = (actions - agent.mean(obs)) * torch.exp(-logstd)
    newlogprob = (-0.5 * z.pow(2) - logstd).sum(1) - LOG_2PI_HALF * actions.shape[1]
    entropy = (logstd + 0.5 + LOG_2PI_HALF).sum()  # state-independent std: the same for every sample
    newvalue = agent.value(obs)
    logratio = newlogprob - logprobs
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


# ---------------------------------------------------------------- checkpoint and evaluation
def load_checkpoint(path: str, training: bool = False) -> dict:
    """A checkpoint.pt or .model file this script wrote (run_utils.load_checkpoint; older files of another script
    have no --network-arch), with its observation statistics where the oldest files kept them in the model."""
    ckpt = run_utils.load_checkpoint(path, "ppo_continuous", lambda args: "network_arch" in args, training)
    if "obs_norm.mean" in ckpt["model"]:
        ckpt["obs_rms"] = [ckpt["model"].pop(f"obs_norm.{name}") for name in ("mean", "var", "count")]
    return ckpt


@torch.no_grad()
def evaluate(envs, agent, obs_rms, seed: int) -> np.ndarray:
    """Play one episode in every env with the mean actions and return each env's first return (averaging episodes in
    the order they end would favour short ones)."""
    obs, _ = envs.reset(seed=seed)
    returns = np.zeros(envs.num_envs)
    finished = np.zeros(envs.num_envs, dtype=bool)
    low, high = envs.single_action_space.low, envs.single_action_space.high
    while not finished.all():
        norm_obs = torch.as_tensor(obs_rms.normalize(obs, False), dtype=torch.float32)
        obs, reward, terminated, truncated, _ = envs.step(np.clip(agent.mean(norm_obs).numpy(), low, high))
        returns += reward * ~finished
        finished |= terminated | truncated
    return returns


if __name__ == "__main__":
    # ---------------- arguments and their checks
    run_utils.stop_in_one_line()  # until the run starts
    args = tyro.cli(Args)
    given = dict(vars(args))  # as typed, before the preset and the checkpoint fill in the rest
    with run_utils.one_line_errors():
        ckpt = load_checkpoint(args.resume, training=True) if args.resume else None
        eval_ckpt = load_checkpoint(args.eval_checkpoint) if args.eval_checkpoint else None
        if eval_ckpt:  # the network to load, no training sizes; the seed and episodes come from the command line
            args.env_id = eval_ckpt["args"]["env_id"]
            args.network_arch = eval_ckpt["args"]["network_arch"]
            args.preset = args.num_envs = args.num_steps = args.minibatch_size = args.num_minibatches = None
        if ckpt:  # the run's settings; how and where it runs comes from the command line
            run_utils.resume_args(args, ckpt, RUNTIME_FLAGS)
        sources = {} if ckpt else resolve_args(args)
        validate(args, evaluating=eval_ckpt is not None)
        hidden = hidden_sizes(args.network_arch)
        batch_size = args.num_envs * args.num_steps
        minibatch_size = int(args.minibatch_size)
        micro = gpu_utils.MicroBatch(gpu_utils.parse_micro_batch(args.micro_batch, minibatch_size))
        num_iterations = args.total_timesteps // batch_size
        # a small MLP runs faster on the CPU: one host<->device round trip per env step costs more than the GPU saves
        small = max(hidden) < 256 and args.preset is None and args.sim == "cpu"
        why = f"network {args.network_arch} is small (< 256 units), CPU is faster; --gpu true forces GPU"
        device, device_why = run_utils.select_device(args, prefer_cpu=why if small else "")
        threads = gpu_utils.thread_budget(args.num_threads)
    run_utils.exit_if_done(ckpt, num_iterations, args.resume)

    # ---------------- device, threads, seeds
    tf32 = gpu_utils.enable_tf32(args.tf32, args.torch_deterministic)
    # one torch thread runs a small MLP fastest; env subprocesses inherit the thread variables: one thread each
    torch_threads = 1 if small and device.type == "cpu" and not args.num_threads else threads.threads
    gpu_utils.limit_threads(1 if args.subproc else torch_threads)
    torch.set_num_threads(torch_threads)
    run_name = ckpt["run_name"] if ckpt else run_utils.new_run_name(args.env_id, args)
    run_utils.seed(args.seed)
    if eval_ckpt:
        envs = gym.vector.SyncVectorEnv([make_env(args.env_id, i, False, "", False) for i in range(args.eval_episodes)])
        agent = Agent(envs.single_observation_space.shape[0], envs.single_action_space.shape[0], hidden, args.amp)
        run_utils.load_states({"model": agent}, eval_ckpt, args.eval_checkpoint)
        returns = evaluate(envs, agent, continuous_envs.RunningMeanStd(state=eval_ckpt["obs_rms"]), args.seed)
        run_utils.end_evaluation(args.env_id, returns)
    # registers this run among the live ones (not for --eval-checkpoint) and takes its share of the CPUs
    cpu_share = gpu_utils.CpuShare(threads, max_torch_threads=torch_threads)
    env_threads = "1 in each env subprocess" if args.subproc else "the envs step in this process"
    run_utils.print_device(device, device_why, tf32, args.amp, cpu_share, env_threads)
    header = f"config: {num_iterations} iterations of {batch_size} steps ({args.num_minibatches} minibatches)"
    run_utils.print_config(args, given, ckpt is not None, RUNTIME_FLAGS, sources, header)

    # ---------------- logging
    start_step = ckpt["global_step"] if ckpt else 0
    total_steps = num_iterations * batch_size
    with run_utils.one_line_errors():  # MJX's worlds first: a jaxlib that refuses this device writes no run folder
        placed = dict(seed=args.seed, device=device, impl=args.mjx_impl)
        worlds = mjx_envs.MJXVectorEnv(args.env_id, args.num_envs, **placed) if args.sim == "mjx" else None
        run = run_utils.Run(args, "ppo_continuous", run_name, ckpt, device, cpu_share, total_steps, start_step)

    # ---------------- env and network: clipping, normalisation and the time-limit bootstrap in continuous_envs
    if worlds is not None:  # every env a world of one batch on the device
        envs = continuous_envs.DeviceEnvs(worlds, args.gamma, device, ckpt)
    else:
        fns = [
            make_env(args.env_id, i, args.capture_video, run.video_folder, args.subproc) for i in range(args.num_envs)
        ]
        envs = continuous_envs.HostEnvs(fns, args.subproc, args.gamma, device, ckpt)
    obs_dim, act_dim = envs.obs_dim, envs.act_dim
    agent = Agent(obs_dim, act_dim, hidden, args.amp).to(device)
    params = list(agent.parameters())  # listed once: the clipping runs every minibatch
    learning_rate = gpu_utils.learning_rate_tensor(args.learning_rate, device)  # annealed in place
    use_graph = args.cudagraphs and micro.rows >= minibatch_size  # a graph cannot hold a split minibatch
    optimizer = torch.optim.Adam(params, lr=learning_rate, eps=1e-5, fused=True, capturable=use_graph)
    start_iteration = ckpt["iteration"] + 1 if ckpt else 1
    global_step = start_step
    if ckpt:
        run_utils.resume_states({"model": agent, "optimizer": optimizer}, ckpt, args.resume, device, num_iterations)

    @torch.no_grad()
    def policy_step(norm_obs, scaled_noise):  # the rollout's actions: the policy's means plus Gaussian noise
        return agent.mean(norm_obs) + scaled_noise

    captured = "loss" if use_graph else ""  # the update's own graph holds the loss's kernels
    policy_step, loss_fn = gpu_utils.compile_steps(policy_step, ppo_loss, args.compile, args.cudagraphs, captured)

    def mb_loss(*data):  # the loss of the rows of one (micro-)batch
        return loss_fn(agent, *data, args.clip_coef, args.ent_coef, args.vf_coef, args.clip_vloss)

    # ---------------- storage: the rollout on the device
    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs, act_dim), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    # the update's inputs keep their addresses from one iteration to the next (a captured graph reads them there)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros_like(logprobs)
    advantages = torch.zeros_like(logprobs)
    returns = torch.zeros_like(logprobs)
    b_obs = obs.view(-1, obs_dim)
    b_actions = actions.view(-1, act_dim)
    b_logprobs, b_values, b_advantages, b_returns = (x.view(-1) for x in (logprobs, values, advantages, returns))
    nb = (obs_dim + act_dim + 5) * 4  # bytes per transition
    example = torch.zeros(1, obs_dim, device=device)
    est = gpu_utils.estimate_memory(
        agent, "adam", minibatch_size * nb, batch_size * nb, None, example, minibatch_size, use_graph
    )
    run.note_estimate(est, global_step)

    def update_step(mb_inds):
        """One minibatch step on the rows `mb_inds` of the rollout: loss, backward, clipping, Adam. No host sync, so
        that under --cudagraphs it runs as one captured CUDA graph; elsewhere it runs eagerly."""
        optimizer.zero_grad(set_to_none=True)
        mb_advantages = b_advantages[mb_inds]
        if args.norm_adv:  # over the whole minibatch, before it is split into micro-batches
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
        data = (b_obs[mb_inds], b_actions[mb_inds], b_logprobs[mb_inds], mb_advantages)
        data += (b_returns[mb_inds], b_values[mb_inds])
        stats = gpu_utils.accumulate_gradients(mb_loss, data, micro, params)
        gpu_utils.clip_grad_norm([p.grad for p in params], args.max_grad_norm)
        optimizer.step()
        return stats

    split = f"--micro-batch {micro.rows} splits the minibatch's {minibatch_size} rows"
    holds = "one CUDA graph per minibatch step (forward, backward, clipping, Adam)"
    update_step = gpu_utils.CudaGraph.requested(
        update_step, args.cudagraphs, {split: micro.rows < minibatch_size}, "update", holds, micro=micro
    )

    # ---------------- training loop
    next_obs = envs.reset(seed=args.seed + (start_iteration - 1) * args.num_envs)
    next_done = torch.zeros(args.num_envs, device=device)
    diverged = False  # NaN or infinite weights after an update: the run stops without saving them
    for iteration in range(start_iteration, num_iterations + 1):
        iteration_start = time.perf_counter()
        lr_now = args.learning_rate
        if args.anneal_lr:
            lr_now = (1.0 - (iteration - 1.0) / num_iterations) * args.learning_rate
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
            for step, episodic_return, length in envs.finished():
                run.log_episode(episodic_return, length, step)

            # ---------------- advantages: values and log-probs in one batched pass each (the policy did not change)
            b_values.copy_(agent.value(b_obs))
            next_value = agent.value(next_obs)
            logprobs.copy_((-0.5 * noise.pow(2) - agent.actor_logstd).sum(-1) - LOG_2PI_HALF * act_dim)
            gae = compute_gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)
            advantages.copy_(gae[0])
            returns.copy_(gae[1])

        # ---------------- update: shuffle once per epoch, then contiguous minibatch slices of the permutation
        first_ratio_mse = None  # of the first minibatch, before any step
        for _epoch in range(args.update_epochs):
            perm = torch.randperm(batch_size, device=device)
            stats = None  # the sums over the epoch's minibatches, then their means
            for mb_inds in perm.split(minibatch_size):
                mb_stats = update_step(mb_inds)
                run.report_micro_batch(micro, global_step)
                if first_ratio_mse is None:  # cloned: a captured graph overwrites its outputs
                    first_ratio_mse = mb_stats["ratio_mse"].clone()
                stats = stats or {name: torch.zeros_like(value) for name, value in mb_stats.items()}
                torch._foreach_add_(list(stats.values()), list(mb_stats.values()))
            stats = {name: total / args.num_minibatches for name, total in stats.items()}
            if args.target_kl is not None and stats["approx_kl"].item() > args.target_kl:  # one sync per epoch
                break

        # ---------------- logging: one pull of scalars to the host per iteration
        del stats["ratio_mse"]  # its mean over the minibatches is not logged: the first minibatch's RMS is
        stats["initial_ratio_error"] = first_ratio_mse.sqrt()
        stats["explained_variance"] = (1 - (returns - values).var() / returns.var()).nan_to_num(0.0, neginf=0.0)
        # the weights are checked before a checkpoint could save them
        *pulled, finite = torch.stack([*stats.values(), run_utils.weights_finite(params)]).tolist()
        diverged = not finite
        scalars = {"charts/learning_rate": lr_now} | {f"losses/{name}": value for name, value in zip(stats, pulled)}
        seconds = time.perf_counter() - iteration_start
        run.log_window(iteration, num_iterations, global_step, batch_size, seconds, scalars)
        if diverged:  # its non-finite losses are logged above; the checkpoint on disk keeps the last finite weights
            break
        stopping = bool(run.stop)
        finished = iteration == num_iterations
        if (args.checkpoint_every and iteration % args.checkpoint_every == 0) or stopping or finished:
            state = dict(model=agent.state_dict(), optimizer=optimizer.state_dict(), rng=[gpu_utils.rng_state(device)])
            state |= dict(iteration=iteration, global_step=global_step, **envs.state())
            run.checkpoint(state, finished, stopping)
        if stopping:
            break

    # ---------------- end of the run
    if not diverged and iteration == num_iterations:
        run.save_model(dict(model=agent.state_dict(), obs_rms=envs.obs_rms.state()))
    run.close(global_step, diverged)
    envs.close()
    run.exit(diverged, global_step)
