"""Where one ppo_atari.py iteration spends its time: each phase of the script's own code timed alone, for each way
the script runs it.

    python dev/profile_atari.py                                     # the device ppo_atari.py would pick
    python dev/profile_atari.py --gpu true --out benchmark/results  # any of ppo_atari.py's flags sets the run

Each phase is ppo_atari.py's own code: its make_envs, EpisodeTracker, Agent and ppo_loss, and the policy_step,
receive, backward and update functions of its main block, compiled here from the script's source (they are not
importable); the rollout loop around them is the training loop's, re-created here.

  env      AtariVectorEnv.step alone, random actions (the raw ceiling)
  policy   the observations to the device, the policy step, the actions back to the host
  rollout  the training loop's rollout, per vector step: in one group (--no-overlap-envs) and in two halves that take
           turns (the default)
  update   one iteration: update_epochs x num_minibatches calls of update

each eager and compiled as the device runs it best: --compile on a CPU, --compile --cudagraphs on CUDA (the update one
CUDA graph per minibatch step).
Per-step figures are means after 5 warm-up steps (resets included); the rollout and the update are medians over
--iterations after the first; CUDA is synchronised before a clock is read. The last table predicts SPS as batch /
(num_steps x rollout + update) for each pairing, beside the env's ceiling.
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
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmark")]
import speed  # noqa: E402  (the tables' machine header and markdown)

import gpu_utils  # noqa: E402
import ppo_atari  # noqa: E402
import run_utils  # noqa: E402

GRAPH = "--compile --cudagraphs"
WAYS = {"one group": 1, "two halves": 2}  # the rollouts timed: their rows' names and how many groups take turns


def from_script(name: str, **scope):
    """The function ``name`` of ppo_atari.py's main block, compiled from the script's source with ``scope`` as its
    globals (the main block's variables it reads): the profile times the script's code, not a copy of it."""
    tree = ast.parse(inspect.getsource(ppo_atari))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    module = types.ModuleType(f"ppo_atari_{name}")  # a module of its own: torch.compile looks its globals up there
    module.__dict__.update({**vars(ppo_atari), **scope, "__name__": module.__name__})
    sys.modules[module.__name__] = module
    exec(compile(ast.Module(body=[node], type_ignores=[]), ppo_atari.__file__, "exec"), module.__dict__)
    return getattr(module, name)


def timed(fn, calls: int, device: torch.device, warmup: int = 5) -> list[float]:
    """Seconds of each call of ``fn`` after ``warmup`` calls, CUDA synchronised."""
    times = []
    for _ in range(warmup + calls):
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return times[warmup:]


def storage(a, obs_shape: tuple, device: torch.device) -> dict[str, torch.Tensor]:
    """The script's rollout storage, by the names its main block gives it: on the device the rollout and its flat
    views (random advantages and returns for the update), pinned on the host (CUDA) what the envs write."""
    pin = device.type == "cuda"
    shape = (a.num_steps, a.num_envs)
    obs = torch.zeros(shape + obs_shape, dtype=torch.uint8, device=device)
    if a.channels_last:
        obs = obs.movedim(2, -1).contiguous().movedim(-1, 2)
    rollout = {
        "obs": obs,
        "actions": torch.zeros(shape, dtype=torch.long, device=device),
        "logprobs": torch.zeros(shape, device=device),
        "values": torch.zeros(shape, device=device),
        "advantages": torch.randn(shape, device=device),
        "returns": torch.randn(shape, device=device),
    }
    flat = {f"b_{name}": x.view((-1, *x.shape[2:])) for name, x in rollout.items()}
    host_obs = torch.zeros((a.num_envs,) + obs_shape, dtype=torch.uint8, pin_memory=pin)
    host = {
        "next_obs": torch.zeros((a.num_envs,) + obs_shape, dtype=torch.uint8, device=device),
        "host_obs": host_obs,
        "host_obs_np": host_obs.numpy(),
        "host_rewards": torch.zeros(shape, pin_memory=pin),
        "host_dones": torch.zeros((a.num_steps + 1, a.num_envs), pin_memory=pin),
    }
    host |= {"rewards_np": host["host_rewards"].numpy(), "dones_np": host["host_dones"].numpy()}  # receive's views
    return rollout | flat | host


def env_groups(a, groups: int, threads: int, buffers: dict, agent, device):
    """The script's envs in ``groups`` groups that take turns, made and reset as its main block does, and its receive
    for them: (env_rows, env_groups, receive)."""
    bounds = [g * a.num_envs // groups for g in range(groups + 1)]
    env_rows = [slice(start, stop) for start, stop in zip(bounds, bounds[1:])]
    sizes = [rows.stop - rows.start for rows in env_rows]
    envs = [ppo_atari.make_envs(a.env_id, n, max(1, threads // groups), a.max_episode_frames) for n in sizes]
    trackers = []
    for rows, group in zip(env_rows, envs):
        buffers["host_obs_np"][rows], info = group.reset(seed=a.seed + rows.start)
        trackers.append(ppo_atari.EpisodeTracker(rows.stop - rows.start, info["lives"]))
    buffers["next_obs"].copy_(buffers["host_obs"])
    scope = dict(env_groups=envs, env_rows=env_rows, trackers=trackers, recorder=None)
    receive = from_script("receive", **buffers, **scope, agent=agent, args=a, device=device)
    return env_rows, envs, receive


def collect(a, env_rows, envs, receive, policy_step, b: dict) -> None:
    """One rollout as the script's training loop collects it: each group acts on its rows while the other plays."""
    obs, actions, logprobs, values, next_obs = (
        b[name] for name in ("obs", "actions", "logprobs", "values", "next_obs")
    )
    b["host_dones"][0] = b["host_dones"][a.num_steps]
    playing = collections.deque()
    for step in range(a.num_steps):
        for group, rows in enumerate(env_rows):
            obs[step, rows] = next_obs[rows]
            actions[step, rows], logprobs[step, rows], values[step, rows] = policy_step(next_obs[rows])
            envs[group].send(actions[step, rows].cpu().numpy())
            playing.append((step, group))
            if len(playing) == len(env_rows):
                receive(*playing.popleft())
    while playing:
        receive(*playing.popleft())


def time_update(a, agent, loss_fn, buffers: dict, graph: bool, iterations: int, device) -> float:
    """ms of one iteration's update as the script runs it (its update, through its micro-batches and its CUDA graph),
    with a fresh Adam as the script makes it, so that each variant starts from the same weights' state."""
    params = list(agent.parameters())
    learning_rate = torch.tensor(a.learning_rate, dtype=torch.float64 if device.type == "cpu" else torch.float32)
    optimizer = torch.optim.Adam(params, lr=learning_rate.to(device), eps=1e-5, fused=True, capturable=graph)
    backward = from_script("backward", agent=agent, loss_fn=loss_fn, args=a)
    micro_batches = gpu_utils.MicroBatches(backward, a.micro_batch, a.minibatch_size, params)
    scope = dict(optimizer=optimizer, micro_batches=micro_batches, params=params, distributed=False, world_size=1)
    update = from_script("update", **buffers, **scope, args=a)
    update_step = gpu_utils.CudaGraph(update, enabled=graph, name="update")
    size = a.num_envs * a.num_steps

    def iteration():
        for _epoch in range(a.update_epochs):
            b_inds = torch.randperm(size, device=device)
            for start in range(0, size, a.minibatch_size):
                update_step(b_inds[start : start + a.minibatch_size])

    return statistics.median(timed(iteration, iterations - 1, device, warmup=1)) * 1000


def time_variant(a, compiled: bool, graphs: bool, agent, host_obs, ways: dict, buffers: dict, o, device):
    """One way the script runs (eager, --compile, --compile --cudagraphs): ms of its policy step, of each rollout
    per vector step, and of its update."""
    policy_step = gpu_utils.compile_policy(from_script("policy_step", agent=agent), compiled, graphs)
    loss_fn = torch.compile(ppo_atari.ppo_loss) if compiled or graphs else ppo_atari.ppo_loss
    next_obs = host_obs.to(device)

    def act():
        next_obs.copy_(host_obs, non_blocking=True)
        policy_step(next_obs)[0].cpu()

    def rollout_ms(way) -> float:
        times = timed(lambda: collect(a, *way, policy_step, buffers), o.iterations - 1, device, warmup=1)
        return statistics.median(times) * 1000 / a.num_steps

    policy = statistics.fmean(timed(act, o.steps, device)) * 1000
    rollouts = {how: rollout_ms(way) for how, way in ways.items()}
    return policy, rollouts, time_update(a, agent, loss_fn, buffers, graphs, o.iterations, device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="vector steps per env and policy measurement (>= 6)")
    p.add_argument("--iterations", type=int, default=4, help="rollouts and updates per measurement (>= 2)")
    p.add_argument("--no-compile", action="store_true", help="eager only (quick, and on a CPU)")
    p.add_argument("--out", default="", help="folder for profile_atari_<device>.md (empty: print only)")
    o, script_args = p.parse_known_args(argv)
    a = tyro.cli(ppo_atari.Args, args=script_args)
    with run_utils.one_line_errors():  # exit 2 with the first check's line
        ppo_atari.validate(a, 1)
        run_utils.check(
            {
                f"--steps must be at least 6 (5 are warm-up), got {o.steps}": o.steps >= 6,
                f"--iterations must be at least 2 (the first is warm-up), got {o.iterations}": o.iterations >= 2,
                f"--num-envs must be at least 2 (two halves are timed), got {a.num_envs}": a.num_envs >= 2,
            }
        )
        device, _ = run_utils.select_device(a)  # and TF32, as the script sets it
    threads = gpu_utils.thread_budget(a.num_threads).threads
    gpu_utils.limit_threads(threads)
    threads = min(a.env_threads or threads, a.num_envs)  # the envs' threads, as the script counts them
    torch.manual_seed(a.seed)
    cuda = device.type == "cuda"
    envs = ppo_atari.make_envs(a.env_id, a.num_envs, threads, a.max_episode_frames)
    memory_format = torch.channels_last if a.channels_last else torch.preserve_format
    agent = ppo_atari.Agent(envs.single_action_space.n, a.amp).to(device, memory_format=memory_format)
    host_obs = torch.as_tensor(envs.reset(seed=1)[0])
    host_obs = host_obs.pin_memory() if cuda else host_obs
    actions = np.random.default_rng(0).integers(0, envs.single_action_space.n, (o.steps + 5, a.num_envs))
    step = iter(actions)
    env_ms = statistics.fmean(timed(lambda: envs.step(next(step)), o.steps, torch.device("cpu"))) * 1000
    buffers = storage(a, envs.single_observation_space.shape, device)
    envs.close()
    rows = [(f"env: AtariVectorEnv.step, {a.num_envs} envs, {threads} threads", env_ms, "ms / vector step")]
    ways = {how: env_groups(a, groups, threads, buffers, agent, device) for how, groups in WAYS.items()}
    variants = {"eager": (False, False)} | (
        {} if o.no_compile else {GRAPH: (True, True)} if cuda else {"--compile": (True, False)}
    )
    predicted = []
    for name, (compiled, graphs) in variants.items():
        print(f"[profile] {name} ...", flush=True)
        policy_ms, rollout_ms, update_ms = time_variant(a, compiled, graphs, agent, host_obs, ways, buffers, o, device)
        update = f"update ({name}), {a.num_minibatches} x {a.update_epochs} minibatches"
        rows += [(f"policy ({name}): copy in, act, actions out", policy_ms, "ms / vector step")]
        rows += [(f"rollout, {how} ({name})", ms, "ms / vector step") for how, ms in rollout_ms.items()]
        rows += [(update, update_ms, "ms / iteration")]
        predicted += [(f"{how} ({name})", update, a.num_steps * ms, update_ms) for how, ms in rollout_ms.items()]
    for _, groups, _ in ways.values():
        for envs in groups:
            envs.close()
    size, ceiling = a.num_envs * a.num_steps, a.num_envs / env_ms * 1000
    predictions = []
    for rollout, update, rollout_ms, update_ms in predicted:
        sps = size / (rollout_ms + update_ms) * 1000
        share = rollout_ms / (rollout_ms + update_ms)
        predictions.append([rollout, update, f"{sps:,.0f}", f"{sps / ceiling:.0%}", f"{share:.0%}"])
    title = f"Where a ppo_atari.py iteration goes: {a.env_id}, {a.num_envs} envs x {a.num_steps} steps, minibatch "
    title += f"{a.minibatch_size}, {a.update_epochs} epochs"
    info = speed.machine_info() | {"device": f"{gpu_utils.device_label(device)}; CPU threads: {threads}"}
    body = [
        *speed.md_table(["phase", "ms", "per"], [[name, f"{ms:.3f}", unit] for name, ms, unit in rows]),
        "",
        f"Env ceiling: {ceiling:,.0f} agent steps/s. Predicted SPS = {size} / ({a.num_steps} x rollout + update):",
        "",
        *speed.md_table(["rollout", "update", "predicted SPS", "of the ceiling", "rollout share"], predictions),
    ]
    text = speed.document(title, info, "", body)
    print("\n" + text)
    if o.out:
        os.makedirs(o.out, exist_ok=True)
        path = os.path.join(o.out, f"profile_atari_{device.type}.md")
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
