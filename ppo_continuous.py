# PPO for continuous control (Gaussian policy, MuJoCo, any Box action env), CleanRL style, GPU presets.
# Usage: python ppo_continuous.py --env-id HalfCheetah-v5      python ppo_continuous.py --preset heavy
import collections
import contextlib
import logging
import os
import random
import signal
import sys
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
    iterations per task, chosen by one-step errors on classes of states; learning checked at HalfCheetah's earlier
    8,16 and Hopper's 4,8: docs/mjx.md#fast-physics-physicsfast)"""
    subproc: bool = False
    """step the envs in subprocesses (AsyncVectorEnv, forkserver); default in-process"""
    compile_update: Literal["auto", "on", "off"] = "auto"
    """torch.compile each whole minibatch update on the CPU, forward to Adam's step (about 15 s to compile, then half
    the update's time); auto: on when the run has enough minibatch steps to pay for it (the start of the run says)"""
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
RUNTIME_FLAGS = run_utils.RUN_FLAGS | {"subproc", "mjx_impl", "compile_update"}
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
    graphs = "--compile-update on and --cudagraphs each make the update one step (compiled, a CUDA graph): pass one"
    checks = {
        graphs: not (args.compile_update == "on" and args.cudagraphs),
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
def make_env(env_id, idx, capture_video=False, run_dir="", start_step=0, in_subprocess=False):
    parent = os.getpid()

    def thunk():
        # a worker leaves the stop signals (sent to the process group) to the parent: it ends its
        # iteration, saves its checkpoint, closes the workers (AsyncVectorEnv calls one thunk here)
        if in_subprocess and os.getpid() != parent:
            for sig in run_utils.STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
        continuous_envs.warn_once_per_process(env_id)
        env = gym.make(env_id, render_mode="rgb_array" if capture_video and idx == 0 else None)
        if capture_video and idx == 0:  # to videos/<run name>; a failed write is a warning
            env = continuous_envs.RecordVideo(env, run_utils.video_folder(run_dir, start_step))
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
        # no autocast context at all without --amp: entering a disabled one costs more than a layer (5 us)
        with torch.autocast(x.device.type, torch.bfloat16) if self.amp else contextlib.nullcontext():
            for layer in hidden_layers:
                x = layer(x)
        return output_layer(x.float())

    def forward(self, norm_obs):  # normalised observations -> (action means, values)
        return self.mean(norm_obs), self.value(norm_obs)

    def policy(self, norm_obs):
        """The Gaussian over actions that the rollout samples, the loss scores and the evaluation plays (its mean)."""
        return Gaussian(self.mean(norm_obs), self.actor_logstd)

    def mean(self, norm_obs):
        return self.run(self.actor_mean, norm_obs)

    def value(self, norm_obs):
        return self.run(self.critic, norm_obs).view(-1)


# ---------------------------------------------------------------- algorithm
class Gaussian:
    """The policy: CleanRL's Normal(mean, exp(logstd)) over actions, its log-probabilities summed over the action's
    dimensions, for the rollout, the loss and the evaluation alike. ``logstd`` broadcasts against ``mean``: one per
    action dimension (a parameter, as CleanRL's) or one per state (an output of the network)."""

    def __init__(self, mean, logstd):
        self.mean = mean
        self.logstd = logstd

    def sample(self, noise):
        """The actions mean + std * ``noise`` (standard normal); their log-probabilities are ``log_density(noise)``,
        which a round trip through the actions would only round."""
        return self.mean + self.logstd.exp() * noise

    def log_prob(self, actions):
        return self.log_density((actions - self.mean) * torch.exp(-self.logstd))

    def log_density(self, z):  # of the actions whose standardised values (sample's noise) are z
        return (-0.5 * z.pow(2) - self.logstd).sum(-1) - LOG_2PI_HALF * z.shape[-1]

    def entropy(self):
        return (self.logstd + 0.5 + LOG_2PI_HALF).sum(-1)


# the rollout and the loss disagree when an iteration's first minibatch's ratios, before any step, are off by more than
# this (root mean square). Rounding on the CPU, the largest over whole runs (dev/ratio_rounding.py): fp32 7e-7,
# bf16 (--amp) 5.7e-5. Wrong scripts measured 0.028 to 0.18 (#59, #63: an acting copy never synced, a log-std
# head for the loss alone)
RATIO_ERROR_WARNING = 1e-3


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
    pi = agent.policy(obs)
    newlogprob = pi.log_prob(actions)
    entropy = pi.entropy().mean()
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


# a compiled update step saved 0.59 ms of 1.12 a minibatch step (HalfCheetah's 64 rows, 64,64 MLPs, one core of the
# 2-core Intel VM) and took 15 to 18 s to compile there (5 s with inductor's cache): 50,000 steps save about 30 s
COMPILE_UPDATE_STEPS = 50_000


def compile_update_choice(setting: str, device: torch.device, update_steps: int) -> tuple[bool, str]:
    """--compile-update: whether to compile the whole update step, and why (the start of the run prints it)."""
    if setting == "off":
        return False, "--compile-update off"
    if setting == "on":
        return True, "--compile-update on"
    if device.type != "cpu":  # --cudagraphs captures the update on a GPU (and says so); a compiled one is unmeasured
        return False, ""
    pays = update_steps >= COMPILE_UPDATE_STEPS
    verdict = "pay for" if pays else f"are fewer than the {COMPILE_UPDATE_STEPS:,} that pay for"
    flag = "--compile-update off" if pays else "--compile-update on"
    why = (
        f"--compile-update auto: {update_steps:,} minibatch steps {verdict} about 15 s of compilation; {flag} to change"
    )
    return pays, why


def memory_estimate(agent, obs_dim: int, act_dim: int, batch_size: int, minibatch_size: int, cudagraphs: bool):
    """The device memory a run needs: the network and Adam, a minibatch, the rollout storage and a minibatch's
    activations (docs/devices-threads-memory.md)."""
    transition_bytes = (obs_dim + act_dim + 5) * 4
    return gpu_utils.estimate_memory(
        agent,
        batch_bytes=minibatch_size * transition_bytes,
        rollout_bytes=batch_size * transition_bytes,
        example_input=torch.zeros(1, obs_dim, device=next(agent.parameters()).device),
        batch_size=minibatch_size,
        cudagraphs=cudagraphs,
    )


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
        actions = agent.policy(torch.as_tensor(obs_rms.normalize(obs, False), dtype=torch.float32)).mean
        actions = np.clip(actions.numpy(), action_space.low, action_space.high)
        obs, reward, terminated, truncated, _ = envs.step(actions)
        returns += reward * ~finished
        finished |= terminated | truncated
    return returns


def evaluate_checkpoint(args: Args) -> None:
    """--eval-checkpoint: play one episode in each of --eval-episodes envs with the checkpoint's mean actions, print
    the mean return and exit; its env and network are the checkpoint's, the seed and episodes the command line's."""
    ckpt = run_utils.load_checkpoint(args.eval_checkpoint, "ppo_continuous")
    args.env_id = ckpt["args"]["env_id"]
    args.network_arch = ckpt["args"]["network_arch"]
    for key in ("preset", "num_envs", "num_steps", "minibatch_size", "num_minibatches"):  # no training sizes
        setattr(args, key, None)
    resolve_args(args)
    validate(args, evaluating=True)
    gpu_utils.limit_threads(gpu_utils.thread_budget(args.num_threads).threads)
    returns = evaluate(ckpt, hidden_sizes(args.network_arch), args)
    print(f"eval {args.env_id}: mean return {returns.mean():.2f} +- {returns.std():.2f} over {len(returns)} episodes")
    sys.exit(0)


if __name__ == "__main__":
    # ---------------- arguments and their checks
    run_utils.stop_in_one_line()  # until the run has a folder: a stop signal ends the process at once, in one line
    args = tyro.cli(Args)
    given = dict(vars(args))  # as typed, before the preset and the checkpoint fill in the rest
    with run_utils.one_line_errors():
        if args.eval_checkpoint:  # play its policy's mean actions, print the mean return and exit
            evaluate_checkpoint(args)
        ckpt = run_utils.resume(args, "ppo_continuous", RUNTIME_FLAGS)  # the run's settings, not a preset's
        sources = {} if ckpt else resolve_args(args)
        validate(args, evaluating=False)
        hidden = hidden_sizes(args.network_arch)
        batch_size = args.num_envs * args.num_steps
        minibatch_size = int(args.minibatch_size)
        num_iterations = args.total_timesteps // batch_size
        # a small MLP runs faster on the CPU: a host<->device round trip per env step costs more
        small = max(hidden) < 256 and args.preset is None and args.sim == "cpu"
        why = f"network {args.network_arch} is small (< 256 units), so CPU; --gpu true forces GPU"
        device, device_why = run_utils.select_device(args, prefer_cpu=why if small else "")
    run_utils.exit_if_done(ckpt, num_iterations, args.resume)

    # ---------------- device, threads, seeds
    # one torch thread runs a small MLP fastest; env subprocesses inherit the thread variables: 1
    one_thread = small and device.type == "cpu" and not args.num_threads
    env_threads = 1 if args.subproc else None
    cpu_share = gpu_utils.take_cpu_share(args.num_threads, 1 if one_thread else None, env_threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    env_text = "1 in each env subprocess" if args.subproc else "the envs step in this process"
    run_utils.print_device(device, device_why, args.amp, cpu_share, env_text)
    total_steps = num_iterations * batch_size
    run_utils.print_config(args, given, ckpt is not None, RUNTIME_FLAGS, total_steps, sources)

    # ---------------- logging
    start_step = ckpt["global_step"] if ckpt else 0
    run_name = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_name = ckpt["run_name"] if ckpt else run_name
    worlds = None
    if args.sim == "mjx":  # MJX's worlds first: a jaxlib that refuses the device writes no run
        placed = dict(seed=args.seed, device=device, impl=args.mjx_impl, physics=args.physics)
        with run_utils.one_line_errors():
            worlds = mjx_envs.MJXVectorEnv(args.env_id, args.num_envs, **placed)
    # from here on a stop signal stops the run after its iteration, with a checkpoint
    run_dir, writer, stop = run_utils.open_run(run_name, args, device, start_step, ckpt)
    pbar = tqdm(total=total_steps, initial=start_step, disable=not args.progress_bar, unit_scale=True)
    monitor = gpu_utils.GPUMonitor(device).start()

    # ---------------- env and network (continuous_envs clips, normalises, bootstraps time limits)
    if worlds is not None:  # every env a world of one batch on the device
        envs = continuous_envs.DeviceEnvs(worlds, args.gamma, device)
    else:
        video = (args.capture_video, run_dir, start_step)  # env 0's episodes to videos/<run name>
        fns = [make_env(args.env_id, i, *video, args.subproc) for i in range(args.num_envs)]
        envs = continuous_envs.HostEnvs(fns, args.subproc, args.gamma, device)
    obs_dim, act_dim = envs.obs_dim, envs.act_dim
    agent = Agent(obs_dim, act_dim, hidden, args.amp).to(device)
    params = list(agent.parameters())  # listed once: the clipping runs every minibatch
    # Adam's learning rate as a device tensor, annealed in place: no re-capture of a CUDA graph. float64 on the CPU,
    # where the fused Adam then computes exactly as with a float; float32 for CUDA's fused kernel
    lr_dtype = torch.float64 if device.type == "cpu" else torch.float32
    learning_rate = torch.tensor(args.learning_rate, dtype=lr_dtype, device=device)
    optimizer = optim.Adam(params, lr=learning_rate, eps=1e-5, fused=True, capturable=args.cudagraphs)
    # the run's states, each saved in every checkpoint and loaded on --resume: networks, optimizers, normalisers
    states = {"model": agent, "optimizer": optimizer, "obs_rms": envs.obs_rms, "ret_rms": envs.ret_rms}
    start_iteration = ckpt["iteration"] + 1 if ckpt else 1
    global_step = start_step
    if ckpt:
        run_utils.load_states(states, ckpt, args.resume, device=device)

    @torch.no_grad()
    def policy_step(norm_obs, noise):
        """The rollout's step: actions sampled from the policy with standard normal ``noise``."""
        return agent.policy(norm_obs).sample(noise)

    @torch.no_grad()
    def rollout_log_probs(norm_obs, noise):
        """The rollout's log-probabilities in one batched pass after it: the policy's density of the noise that sampled
        each action (the same policy, not a few small ops a step)."""
        return agent.policy(norm_obs).log_density(noise)

    # --compile, --cudagraphs: the same step compiled (and then replayed as CUDA graphs)
    act = gpu_utils.compile_policy(policy_step, args.compile, args.cudagraphs)
    # compiled as the step is: in bf16, compiled and eager code round apart (#63: a false warning of 2.1e-3)
    log_probs_of = torch.compile(rollout_log_probs) if args.compile or args.cudagraphs else rollout_log_probs
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
    memory = memory_estimate(agent, obs_dim, act_dim, batch_size, minibatch_size, args.cudagraphs)
    print(memory)
    writer.add_scalar("memory/estimated_mib", memory.total / 2**20, start_step)

    def backward(minibatch, weight=1.0):
        """The PPO loss's gradients over a minibatch (``weight``: its share of a split one); its statistics by name."""
        loss, stats = loss_fn(agent, *minibatch, args)
        (loss * weight).backward()
        return stats

    # --micro-batch: the same gradients from backward passes over slices of the minibatch, halved on CUDA out of memory
    micro_batches = gpu_utils.MicroBatches(backward, args.micro_batch, minibatch_size, params)

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
        nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
        return stats

    # --compile-update (the CPU): the whole update step compiled, backward included (dynamo traces .backward() with
    # trace_autograd_ops); auto when its minibatch steps save more than its compilation costs, said in one line
    update_steps = (num_iterations - start_iteration + 1) * args.update_epochs * args.num_minibatches
    compiled, why = compile_update_choice(args.compile_update, device, update_steps)
    if why:
        print(f"update: {'compiled' if compiled else 'eager'} ({why})")
    if compiled:
        torch._dynamo.config.trace_autograd_ops = True
        # Adam's step names itself for the profiler, which a compiled graph drops; dynamo's warning of it is noise here
        logging.getLogger("torch._dynamo.variables.ctx_manager").addFilter(lambda r: "Profiler" not in str(r.msg))
        update = torch.compile(update)
    # --cudagraphs: the whole update step as one CUDA graph, replayed for every minibatch
    update_step = gpu_utils.CudaGraph(update, enabled=args.cudagraphs, name="update")

    # ---------------- training loop
    next_obs = envs.reset(seed=args.seed + (start_iteration - 1) * args.num_envs)
    next_done = torch.zeros(args.num_envs, device=device)
    recent_returns = collections.deque(maxlen=20)
    started = time.time()
    diverged = False  # NaN or infinite weights after an update: the run stops without saving them
    ratio_warned = False  # the rollout/loss check's one warning has been said
    for iteration in range(start_iteration, num_iterations + 1):
        iteration_start = time.perf_counter()
        frac = 1.0 - (iteration - 1.0) / num_iterations if args.anneal_lr else 1.0
        lr_now = frac * args.learning_rate
        learning_rate.fill_(lr_now)
        noise = torch.randn((args.num_steps, args.num_envs, act_dim), device=device)  # the rollout's, at once
        with torch.no_grad():
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                dones[step] = next_done
                actions[step] = act(next_obs, noise[step])
                next_obs, rewards[step], next_done = envs.step(actions[step], agent.value, global_step)

            # ---------------- advantages: the values and log-probs in one batched pass each
            b_values.copy_(agent.value(b_obs))
            b_logprobs.copy_(log_probs_of(b_obs, noise.view(-1, act_dim)))
            next_value = agent.value(next_obs)
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
                mb_stats = update_step(mb_inds)
                if first_ratio_mse is None:  # cloned: a captured graph overwrites its outputs
                    first_ratio_mse = mb_stats["ratio_mse"].clone()
                stats = stats or {name: torch.zeros_like(value) for name, value in mb_stats.items()}
                torch._foreach_add_(list(stats.values()), list(mb_stats.values()))
            stats = {name: total / args.num_minibatches for name, total in stats.items()}
            # a sync an epoch
            if args.target_kl is not None and stats["approx_kl"].item() > args.target_kl:
                break

        # ---------------- logging: the scalars pulled to the host at once, by name, one sync per iteration
        # its mean over the minibatches is not logged: the first minibatch's RMS is
        del stats["ratio_mse"]
        stats["initial_ratio_error"] = first_ratio_mse.sqrt()
        explained_var = 1 - (returns - values).var() / returns.var()
        stats["explained_variance"] = explained_var.nan_to_num(0.0, neginf=0.0)
        scalars = {f"losses/{name}": value for name, value in stats.items()}
        # whether the weights are finite rides along, checked before a checkpoint could save them
        scalars["weights_finite"] = torch.stack([p.isfinite().all() for p in params]).all().float()
        scalars = dict(zip(scalars, torch.stack(list(scalars.values())).tolist()))
        diverged = not scalars["weights_finite"]
        ratio_error = scalars["losses/initial_ratio_error"]
        if ratio_error > RATIO_ERROR_WARNING and not ratio_warned:  # every iteration, said once
            ratio_warned = True
            print(
                f"warning: iteration {iteration}: the loss scores the rollout's actions {ratio_error:.3g} apart from "
                f"the rollout's policy before any step (RMS of ratio - 1 > {RATIO_ERROR_WARNING}): sample them in the "
                "rollout and score them in ppo_loss with one distribution (Agent.policy)"
            )
        iteration_seconds = time.perf_counter() - iteration_start
        sps = batch_size / iteration_seconds
        for step, episodic_return, length in envs.finished():  # at the step each episode ended
            writer.add_scalar("charts/episodic_return", episodic_return, step)
            writer.add_scalar("charts/episodic_length", length, step)
            recent_returns.append(episodic_return)
        writer.add_scalar("charts/learning_rate", lr_now, global_step)
        for key in scalars:
            if key.startswith("losses/"):
                writer.add_scalar(key, scalars[key], global_step)
        writer.add_scalar("memory/micro_batch", micro_batches.rows, global_step)
        if iteration > start_iteration:  # the first iteration is warm-up (compilation, capture)
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("charts/update_share", 1 - rollout_seconds / iteration_seconds, global_step)
        run_utils.log_machine(writer, global_step, cpu_share, monitor)
        score_text = f"return {np.mean(recent_returns):.1f}" if recent_returns else "return -"
        pbar.set_postfix_str(f"SPS={sps:,.0f} {score_text}", refresh=False)
        pbar.update(global_step - pbar.n)
        if not args.progress_bar:
            print(f"iteration {iteration}/{num_iterations}: step {global_step}, SPS {sps:,.0f}, {score_text}")
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
                rng=[gpu_utils.rng_state(device)],
                iteration=iteration,
                global_step=global_step,
                **{key: state.state_dict() for key, state in states.items()},
            )
        if stopping:
            break

    # ---------------- end of the run
    pbar.close()
    envs.close()
    monitor.close()
    cpu_share.close()  # its CPUs to the other live runs
    # --save-model: the final weights and the observation statistics they saw
    model = dict(script="ppo_continuous", args=vars(args), model=agent.state_dict(), obs_rms=envs.obs_rms.state_dict())
    model = model if args.save_model and iteration == num_iterations else None
    run_utils.end_run(writer, run_dir, global_step, total_steps, started, diverged, model)
