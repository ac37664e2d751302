"""Where a CPU run's time goes, part by part: one steady iteration of ppo_continuous.py or ppo_atari.py at CleanRL's
settings, broken into the env's own step, the wrappers and normalisation, the policy step, the host<->tensor copies,
the loop's remainder, and the update's gather, forward, backward, clip_grad_norm_ and Adam step.

    python dev/profile_cpu.py continuous                 # HalfCheetah-v5, 1 env x 2048 steps, 32 minibatches x 10
    python dev/profile_cpu.py atari                      # Breakout, 8 envs x 128 steps, 4 minibatches x 4 epochs
    taskset -c 1 python dev/profile_cpu.py both --iterations 4 --out profile_cpu.md   # on one core
    python dev/profile_cpu.py continuous -- --network-arch 256,256   # after --: the script's own flags

As dev/profile_atari.py does, each part is the script's own code: its envs, Agent and ppo_loss, and the policy_step,
backward, update (and ppo_atari.py's receive) functions of its main block compiled from the script's source; the
rollout loop, the advantages and the epoch loop around them are the training loop's, re-created here with a clock
read between statements. The layers the loop calls into are wrapped with clocks in place (the vector env, each env's
wrapper chain, MuJoCo's env step and its physics call, the running statistics, ale-py's recv, the loss, the backward
function, clip_grad_norm_, Adam's step and zero_grad), so each part's own time is its clock less its callees'.

A few splits cannot be clocked inside the script's calls and are timed alone on the same inputs, --calls times each:
the policy network's forward pass against the whole policy step (the rest is the sampling), the host<->tensor
conversions in HostEnvs.step, and ALE's emulator alone (4 frames a step) against AtariVectorEnv's step (its C++
preprocessing). Runs on the CPU only, with the threads the script would take (one for ppo_continuous.py's small MLP).
The first --warmup iterations are not counted; the figures are means over the --iterations after them, and the plain
line is the same loop's iterations with every clock off (the clocks' cost is the difference). Not re-created: the
per-iteration logging, the checkpoint and the end-of-iteration sync (compare the predicted SPS with a real run's).
"""

from __future__ import annotations

import argparse
import ast
import collections
import inspect
import os
import statistics
import sys
import time
import types

import numpy as np
import torch
import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmark"), os.path.join(ROOT, "dev")]
import speed  # noqa: E402  (the tables' machine header and markdown)

import gpu_utils  # noqa: E402
import run_utils  # noqa: E402

CPU = torch.device("cpu")
perf = time.perf_counter


class Clock:
    """Seconds and calls per name; ``wrap`` puts a clock around a callable; off, the wrappers only call through."""

    def __init__(self):
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter = collections.Counter()
        self.on = True

    def wrap(self, name: str, fn):
        def clocked(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            t0 = perf()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += perf() - t0
                self.calls[name] += 1

        return clocked

    def add(self, name: str, seconds: float, calls: int = 1) -> None:
        if self.on:
            self.seconds[name] += seconds
            self.calls[name] += calls

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def from_script(script: types.ModuleType, name: str, **scope):
    """The function ``name`` of ``script``'s main block, compiled from its source with ``scope`` over the module's
    globals (as dev/profile_atari.py's from_script, for either script)."""
    tree = ast.parse(inspect.getsource(script))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    module = types.ModuleType(f"{script.__name__}_{name}")
    module.__dict__.update({**vars(script), **scope, "__name__": module.__name__})
    sys.modules[module.__name__] = module
    exec(compile(ast.Module(body=[node], type_ignores=[]), script.__file__, "exec"), module.__dict__)
    return getattr(module, name)


def mean_seconds(fn, calls: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    t0 = perf()
    for _ in range(calls):
        fn()
    return (perf() - t0) / calls


def clocked_update(script, clock: Clock, agent, optimizer, params, buffers: dict, a, minibatch_size: int):
    """The script's backward and update, compiled from its source, with clocks around the loss (the forward pass),
    the backward function, the micro-batch splitter, zero_grad, clip_grad_norm_ and Adam's step."""
    loss_fn = clock.wrap("forward", script.ppo_loss)
    backward = clock.wrap("backward+", from_script(script, "backward", agent=agent, loss_fn=loss_fn, args=a))
    # the fourth argument: zero_grad (up to 50d115b) or the parameters (after)
    fourth = list(inspect.signature(gpu_utils.MicroBatches).parameters)[3]
    splitter = gpu_utils.MicroBatches(backward, a.micro_batch, minibatch_size, params if fourth == "params" else None)
    if fourth != "params":
        splitter.zero_grad = optimizer.zero_grad
    optimizer.zero_grad = clock.wrap("zero_grad", optimizer.zero_grad)
    optimizer.step = clock.wrap("Adam step", optimizer.step)
    clip = clock.wrap("clip_grad_norm_", torch.nn.utils.clip_grad_norm_)
    nn = types.SimpleNamespace(utils=types.SimpleNamespace(clip_grad_norm_=clip))
    scope = dict(optimizer=optimizer, micro_batches=clock.wrap("micro-batches+", splitter), params=params, args=a)
    scope |= dict(distributed=False, world_size=1, nn=nn)
    return clock.wrap("update+", from_script(script, "update", **buffers, **scope))


def epochs(update, clock: Clock, batch_size: int, minibatch_size: int, a) -> None:
    """The training loop's epochs: a permutation each, its minibatch slices, the statistics summed on the device."""
    t0 = perf()
    for _epoch in range(a.update_epochs):
        perm = torch.randperm(batch_size)
        stats = None
        for mb_inds in perm.split(minibatch_size):
            mb_stats = update(mb_inds)
            stats = stats or {name: torch.zeros_like(value) for name, value in mb_stats.items()}
            torch._foreach_add_(list(stats.values()), list(mb_stats.values()))
    clock.add("update total", perf() - t0)


def update_rows(clock: Clock, n: int, minibatches: int) -> list[tuple[str, float, float]]:
    """(part, ms per minibatch, ms per iteration) of the update, each part's own time."""
    s = collections.defaultdict(float, {k: v / n for k, v in clock.seconds.items()})  # per iteration
    parts = {
        "gather the minibatch, normalise advantages": s["update+"]
        - s["zero_grad"]
        - s["micro-batches+"]
        - s["clip_grad_norm_"]
        - s["Adam step"],
        "forward: ppo_loss (both networks, the loss)": s["forward"],
        "backward": s["backward+"] - s["forward"],
        "zero_grad(set_to_none=True)": s["zero_grad"],
        "clip_grad_norm_": s["clip_grad_norm_"],
        "Adam step (fused)": s["Adam step"],
        "micro-batch splitter": s["micro-batches+"] - s["backward+"],
        "epoch loop: randperm, split, stats sums": s["update total"] - s["update+"],
    }
    return [(name, sec * 1000 / minibatches, sec * 1000) for name, sec in parts.items()]


def table(title: str, rows, iteration_s: float, unit: str, per: float) -> list[str]:
    """Rows of (part, seconds per iteration): per ``unit`` (``per`` of them an iteration) and the share."""
    body = [
        [name, f"{sec / per * (1e6 if unit.startswith('us') else 1e3):,.1f}", f"{sec * 1000:,.1f}"]
        for name, sec in rows
    ]
    for row, (_, sec) in zip(body, rows):
        row.append(f"{sec / iteration_s:.1%}")
    return [f"**{title}**", "", *speed.md_table(["part", unit, "ms / iteration", "share"], body), ""]


def continuous(o, script_args: list[str]) -> tuple[str, list[str]]:
    import continuous_envs
    import ppo_continuous as script

    a = tyro.cli(script.Args, args=script_args)
    with run_utils.one_line_errors():
        script.resolve_args(a)
        script.validate(a, evaluating=False)
        run_utils.check({"--sim mjx is not a CPU profile": a.sim == "cpu", "--subproc: not profiled": not a.subproc})
    hidden = script.hidden_sizes(a.network_arch)
    threads = 1 if max(hidden) < 256 and a.preset is None and not a.num_threads else None  # the script's rule
    threads = threads or gpu_utils.thread_budget(a.num_threads).threads
    gpu_utils.limit_threads(threads)
    torch.manual_seed(a.seed)
    n, T = a.num_envs, a.num_steps
    batch_size, mbs = n * T, int(a.minibatch_size)
    clock = Clock()
    envs = continuous_envs.HostEnvs([script.make_env(a.env_id, i) for i in range(n)], False, a.gamma, CPU)
    obs_dim, act_dim = envs.obs_dim, envs.act_dim
    agent = script.Agent(obs_dim, act_dim, hidden, a.amp)
    params = list(agent.parameters())
    learning_rate = torch.tensor(a.learning_rate, dtype=torch.float64)
    optimizer = torch.optim.Adam(params, lr=learning_rate, eps=1e-5, fused=True)
    policy_step = from_script(script, "policy_step", agent=agent)
    obs = torch.zeros((T, n, obs_dim))
    actions = torch.zeros((T, n, act_dim))
    rewards, dones = torch.zeros((T, n)), torch.zeros((T, n))
    logprobs, values, advantages, returns = (torch.zeros((T, n)) for _ in range(4))
    buffers = dict(b_obs=obs.view(-1, obs_dim), b_actions=actions.view(-1, act_dim), b_logprobs=logprobs.view(-1))
    buffers |= dict(b_values=values.view(-1), b_advantages=advantages.view(-1), b_returns=returns.view(-1))
    update = clocked_update(script, clock, agent, optimizer, params, buffers, a, mbs)

    # the layers of an env step, outermost first
    envs.step = clock.wrap("HostEnvs.step", envs.step)
    envs.obs_rms.normalize = clock.wrap("obs normalize", envs.obs_rms.normalize)
    envs.ret_rms.update = clock.wrap("ret_rms update", envs.ret_rms.update)
    envs.envs.step = clock.wrap("SyncVectorEnv.step", envs.envs.step)
    for env in envs.envs.envs:
        env.step = clock.wrap("wrappers", env.step)
        env.unwrapped.step = clock.wrap("mujoco env", env.unwrapped.step)
        physics = env.unwrapped._step_mujoco_simulation
        env.unwrapped._step_mujoco_simulation = clock.wrap("physics", physics)

    state = {"next_obs": envs.reset(seed=a.seed), "next_done": torch.zeros(n), "global_step": 0}

    def iteration():
        """The training loop's iteration (rollout, advantages, epochs) with a clock between its statements."""
        t_start = perf()
        noise = torch.randn((T, n, act_dim))
        clock.add("noise draw", perf() - t_start)
        next_obs, next_done = state["next_obs"], state["next_done"]
        with torch.no_grad():
            t_loop = perf()
            for step in range(T):
                t0 = perf()
                state["global_step"] += n
                obs[step] = next_obs
                dones[step] = next_done
                t1 = perf()
                action = policy_step(next_obs, noise[step])
                t2 = perf()
                actions[step] = action
                t3 = perf()
                next_obs, reward, next_done = envs.step(actions[step], agent.value, state["global_step"])
                t4 = perf()
                rewards[step] = reward
                t5 = perf()
                clock.add("storage writes", (t1 - t0) + (t3 - t2) + (t5 - t4))
                clock.add("policy step", t2 - t1)
            clock.add("rollout loop", perf() - t_loop)
            t0 = perf()
            values.view(-1).copy_(agent.value(obs.view(-1, obs_dim)))
            logprobs.view(-1).copy_(agent.policy(obs.view(-1, obs_dim)).log_density(noise.view(-1, act_dim)))
            next_value = agent.value(next_obs)
            gae = script.compute_gae(rewards, values, dones, next_value, next_done, a.gamma, a.gae_lambda)
            advantages.copy_(gae[0])
            returns.copy_(gae[1])
            clock.add("advantages", perf() - t0)
        epochs(update, clock, batch_size, mbs, a)
        state["next_obs"], state["next_done"] = next_obs, next_done
        clock.add("iteration", perf() - t_start)

    plain, iters = run_iterations(iteration, clock, o)
    s = collections.defaultdict(float, {k: v / iters for k, v in clock.seconds.items()})

    # timed alone: the forward pass against the policy step; HostEnvs.step's conversions
    x, z = state["next_obs"], torch.randn(n, act_dim)
    with torch.no_grad():
        forward = mean_seconds(lambda: agent.mean(x), o.calls)
        whole = mean_seconds(lambda: policy_step(x, z), o.calls)
    low, high = envs.low, envs.high
    acts = torch.zeros(n, act_dim)
    to_numpy = mean_seconds(lambda: np.clip(acts.cpu().numpy(), low, high), o.calls)
    host = np.zeros(n * obs_dim + 2 * n)
    sizes = [n * obs_dim, n, n]
    to_tensor = mean_seconds(
        lambda: (
            torch.as_tensor(np.zeros(n), dtype=torch.float32),  # the rewards
            torch.from_numpy(host.astype(np.float32)).to(CPU, non_blocking=True).split(sizes),
        ),
        o.calls,
    )
    conversions = (to_numpy + to_tensor) * T  # per iteration
    envs.close()

    host_own = s["HostEnvs.step"] - s["SyncVectorEnv.step"] - s["obs normalize"] - s["ret_rms update"]
    policy_forward = min(forward / whole, 1.0) * s["policy step"]
    rollout = [
        ("MuJoCo physics (mj_step x frame_skip, mj_rnePostConstraint)", s["physics"]),
        ("gymnasium's HalfCheetah step less physics (obs, reward, checks)", s["mujoco env"] - s["physics"]),
        ("gym.make's wrappers and DropInfo", s["wrappers"] - s["mujoco env"]),
        ("SyncVectorEnv.step less the envs", s["SyncVectorEnv.step"] - s["wrappers"]),
        ("HostEnvs: obs normalisation (RunningMeanStd)", s["obs normalize"]),
        ("HostEnvs: return statistics (ret_rms.update)", s["ret_rms update"]),
        ("HostEnvs: actions to numpy, results to tensors (timed alone)", min(conversions, host_own)),
        ("HostEnvs: the rest (numpy bookkeeping, clipping, episode sums)", max(0.0, host_own - conversions)),
        ("policy step: actor forward (timed alone, as a share)", policy_forward),
        ("policy step: the rest (sampling, no_grad, call)", s["policy step"] - policy_forward),
        ("storage writes (obs, dones, actions, rewards rows)", s["storage writes"]),
        (
            "loop remainder (for, clocks, Python glue)",
            s["rollout loop"] - s["storage writes"] - s["policy step"] - s["HostEnvs.step"],
        ),
    ]
    after = [("noise draw", s["noise draw"]), ("values, log-probs and GAE of the batch", s["advantages"])]
    steps = batch_size
    title = f"ppo_continuous.py {a.env_id}: {n} env x {T} steps, {a.num_minibatches} minibatches of {mbs}, "
    title += f"{a.update_epochs} epochs, {threads} torch thread(s)"
    lines = summary_lines(s["iteration"], plain, steps, s["rollout loop"], s["update total"])
    lines += table("rollout, per env step", rollout, s["iteration"], "us / env step", steps)
    lines += table("once per iteration", after, s["iteration"], "ms", 1)
    minibatches = a.update_epochs * a.num_minibatches
    lines += update_table(clock, iters, minibatches, s["iteration"])
    lines += [f"Timed alone: actor forward {forward * 1e6:.1f} us of a {whole * 1e6:.1f} us policy step; "]
    lines[-1] += f"actions to numpy {to_numpy * 1e6:.1f} us, results to tensors {to_tensor * 1e6:.1f} us per step."
    return title, lines + [""]


def update_table(clock: Clock, iters: int, minibatches: int, iteration_s: float) -> list[str]:
    rows = update_rows(clock, iters, minibatches)
    body = [
        [name, f"{per_mb:,.3f}", f"{per_it:,.1f}", f"{per_it / 1000 / iteration_s:.1%}"]
        for name, per_mb, per_it in rows
    ]
    header = ["part", "ms / minibatch", "ms / iteration", "share"]
    return [f"**update, {minibatches} minibatches**", "", *speed.md_table(header, body), ""]


def summary_lines(iteration_s: float, plain: float, steps: int, rollout_s: float, update_s: float) -> list[str]:
    return [
        f"One iteration: {iteration_s * 1000:,.0f} ms clocked, {plain * 1000:,.0f} ms plain (clocks off): "
        f"{steps / plain:,.0f} SPS predicted without logging. Rollout loop {rollout_s / iteration_s:.0%}, "
        f"update {update_s / iteration_s:.0%} of the clocked iteration.",
        "",
    ]


def run_iterations(iteration, clock: Clock, o) -> tuple[float, int]:
    """--warmup iterations, then --iterations clocked, then as many plain: (median plain seconds, clocked count)."""
    for _ in range(o.warmup):
        iteration()
    clock.reset()
    for _ in range(o.iterations):
        iteration()
    clock.on = False
    plain = []
    for _ in range(o.iterations):
        t0 = perf()
        iteration()
        plain.append(perf() - t0)
    clock.on = True
    return statistics.median(plain), o.iterations


def atari(o, script_args: list[str]) -> tuple[str, list[str]]:
    import gymnasium as gym
    import profile_atari  # its storage and its env groups (with the script's receive)
    from ale_py import ALEInterface, LoggerMode, roms

    import ppo_atari as script

    cleanrl = ["--env-id", "ALE/Breakout-v5", "--num-envs", "8", "--num-steps", "128", "--num-minibatches", "4"]
    a = tyro.cli(script.Args, args=[*cleanrl, "--update-epochs", "4", *script_args])  # the flags given win
    with run_utils.one_line_errors():
        script.validate(a, 1)
        run_utils.check({"--compile and --cudagraphs are not profiled here": not (a.compile or a.cudagraphs)})
    threads = gpu_utils.thread_budget(a.num_threads).threads
    gpu_utils.limit_threads(threads)
    env_threads = min(a.env_threads or threads, a.num_envs)
    groups = 2 if a.overlap_envs and a.num_envs >= 2 else 1
    torch.manual_seed(a.seed)
    n, T = a.num_envs, a.num_steps
    batch_size, mbs = n * T, a.minibatch_size
    clock = Clock()
    probe = script.make_envs(a.env_id, n, env_threads, a.max_episode_frames)
    num_actions, obs_shape = probe.single_action_space.n, probe.single_observation_space.shape
    # the envs alone: one vector step of all envs on the script's env threads, random actions
    rng = np.random.default_rng(0)
    probe.reset(seed=0)
    env_alone = mean_seconds(lambda: probe.step(rng.integers(0, num_actions, n)), o.calls // 10 or 1)
    probe.close()
    memory_format = torch.channels_last if a.channels_last else torch.preserve_format
    agent = script.Agent(num_actions, a.amp).to(CPU, memory_format=memory_format)
    params = list(agent.parameters())
    optimizer = torch.optim.Adam(params, lr=torch.tensor(a.learning_rate, dtype=torch.float64), eps=1e-5, fused=True)
    b = profile_atari.storage(a, obs_shape, CPU)
    flat = {k: v for k, v in b.items() if k.startswith("b_")}
    update = clocked_update(script, clock, agent, optimizer, params, flat, a, mbs)
    env_rows, envs, receive = profile_atari.env_groups(a, groups, env_threads, b, agent, CPU)
    for group in envs:
        group.recv = clock.wrap("recv", group.recv)
        group.send = clock.wrap("send", group.send)
    receive = clock.wrap("receive+", receive)
    policy_step = from_script(script, "policy_step", agent=agent)
    obs, actions, logprobs, values, next_obs = (b[k] for k in ("obs", "actions", "logprobs", "values", "next_obs"))

    def iteration():
        """The training loop's iteration: the groups take turns (one plays while the policy acts on the other)."""
        t_start = perf()
        b["host_dones"][0] = b["host_dones"][T]
        playing = collections.deque()
        for step in range(T):
            for group, rows in enumerate(env_rows):
                t0 = perf()
                obs[step, rows] = next_obs[rows]
                t1 = perf()
                out = policy_step(next_obs[rows])
                t2 = perf()
                actions[step, rows], logprobs[step, rows], values[step, rows] = out
                t3 = perf()
                host_actions = actions[step, rows].cpu().numpy()
                t4 = perf()
                envs[group].send(host_actions)
                playing.append((step, group))
                clock.add("storage writes", (t1 - t0) + (t3 - t2))
                clock.add("policy step", t2 - t1)
                clock.add("actions to numpy", t4 - t3)
                if len(playing) == len(env_rows):
                    receive(*playing.popleft())
        while playing:
            receive(*playing.popleft())
        clock.add("rollout loop", perf() - t_start)
        t0 = perf()
        with torch.no_grad():
            next_value = agent(next_obs)[1]
        dones = b["host_dones"].to(CPU)
        rewards = b["host_rewards"].to(CPU)
        gae = script.compute_gae(rewards, values, dones[:-1], next_value, dones[-1], a.gamma, a.gae_lambda)
        b["advantages"].copy_(gae[0])
        b["returns"].copy_(gae[1])
        clock.add("advantages", perf() - t0)
        epochs(update, clock, batch_size, mbs, a)
        clock.add("iteration", perf() - t_start)

    plain, iters = run_iterations(iteration, clock, o)
    s = collections.defaultdict(float, {k: v / iters for k, v in clock.seconds.items()})
    for group in envs:
        group.close()

    # timed alone: the network against the policy step on one group's rows; ALE's emulator, 4 frames a step
    x = next_obs[env_rows[0]]
    with torch.no_grad():
        forward = mean_seconds(lambda: agent(x), o.calls // 10 or 1)
        whole = mean_seconds(lambda: policy_step(x), o.calls // 10 or 1)
    ale = ALEInterface()
    ALEInterface.setLoggerMode(LoggerMode.Error)
    ale.setInt("random_seed", 0)
    ale.setFloat("repeat_action_probability", 0.25)
    ale.loadROM(roms.get_rom_path(gym.spec(a.env_id).kwargs["game"]))
    moves = ale.getMinimalActionSet()

    def emulate():
        move = moves[rng.integers(len(moves))]
        for _ in range(4):
            ale.act(move)
        if ale.game_over():
            ale.reset_game()

    emulation = mean_seconds(emulate, o.calls)
    per_env_alone = env_alone * min(env_threads, n) / n  # CPU seconds of one env's step in the vector env
    policy_forward = min(forward / whole, 1.0) * s["policy step"]
    rollout = [
        ("envs: recv (waiting for the env threads' step: ALE and its C++ preprocessing)", s["recv"]),
        ("envs: send (with fewer cores than threads, the env threads' work lands here too)", s["send"]),
        ("receive less recv: obs copy to the tensor, EpisodeTracker, rewards/dones rows", s["receive+"] - s["recv"]),
        ("policy step: Nature CNN forward (timed alone, as a share)", policy_forward),
        ("policy step: the rest (Gumbel sampling, log-softmax, gather)", s["policy step"] - policy_forward),
        ("actions to numpy (.cpu().numpy())", s["actions to numpy"]),
        ("storage writes (obs rows, actions, log-probs, values)", s["storage writes"]),
        (
            "loop remainder (for, deque, clocks)",
            s["rollout loop"]
            - s["receive+"]
            - s["send"]
            - s["policy step"]
            - s["actions to numpy"]
            - s["storage writes"],
        ),
    ]
    after = [("values, GAE (rewards, dones to tensors)", s["advantages"])]
    title = f"ppo_atari.py {a.env_id}: {n} envs x {T} steps in {groups} group(s) on {env_threads} env thread(s), "
    title += f"{a.num_minibatches} minibatches of {mbs}, {a.update_epochs} epochs, {threads} torch thread(s)"
    lines = summary_lines(s["iteration"], plain, batch_size, s["rollout loop"], s["update total"])
    lines += table("rollout, per agent step (one env's step)", rollout, s["iteration"], "us / agent step", batch_size)
    lines += table("once per iteration", after, s["iteration"], "ms", 1)
    lines += update_table(clock, iters, a.update_epochs * a.num_minibatches, s["iteration"])
    lines += [
        f"Timed alone: the envs, {n} in one AtariVectorEnv on {env_threads} thread(s), {env_alone * 1000:.2f} ms a "
        f"vector step ({n / env_alone:,.0f} agent steps/s; {per_env_alone * 1e6:.0f} us of CPU per agent step), of "
        f"which ALE's emulator alone (4 frames, no preprocessing) {emulation * 1e6:.0f} us; the CNN's forward "
        f"{forward * 1e3:.2f} ms of a {whole * 1e3:.2f} ms policy step on {x.shape[0]} observations."
    ]
    return title, lines + [""]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=["continuous", "atari", "both"])
    p.add_argument("--iterations", type=int, default=3, help="clocked iterations, and as many plain ones (3)")
    p.add_argument("--warmup", type=int, default=1, help="iterations before the clocks count (1)")
    p.add_argument("--calls", type=int, default=2000, help="calls of each part timed alone (2000; Atari's: a tenth)")
    p.add_argument("--out", default="", help="also write the markdown to this file")
    o = p.parse_args(argv)
    if o.iterations < 1 or o.warmup < 0 or o.calls < 10:
        p.error("--iterations must be at least 1, --warmup at least 0 and --calls at least 10")
    if o.task == "both" and script_args:
        p.error("flags for the script after -- need one task")
    body = []
    for name in ["continuous", "atari"] if o.task == "both" else [o.task]:
        print(f"[profile] {name} ...", flush=True)
        title, lines = (continuous if name == "continuous" else atari)(o, script_args)
        body += [f"## {title}", "", *lines]
    info = speed.machine_info() | {"torch threads": str(torch.get_num_threads())}
    text = speed.document("Where a CPU run's time goes", info, "", body)
    print("\n" + text)
    if o.out:
        with open(o.out, "w") as f:
            f.write(text)
        print(f"wrote {o.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
