"""Where one ppo_atari.py iteration spends its time: each phase of the script's own code timed alone, for each way
the script runs it.

    python dev/profile_atari.py                                     # the device ppo_atari.py would pick
    python dev/profile_atari.py --gpu true --out benchmark/results  # any of ppo_atari.py's flags sets the run

Each phase is ppo_atari.py's own code: its make_envs (atari_envs'), Rollout, AsyncRollout, Agent and ppo_loss, and
the policy and update steps of its main block, compiled here from the script's source (they are not importable).

  env      AtariVectorEnv.step alone, random actions (the raw ceiling)
  policy   the observations to the device, the policy step, the actions back to the host
  rollout  Rollout.collect, per vector step: in one group (--no-overlap-envs), in two halves that take turns (the
           default), and --async-envs N/2
  update   one iteration: update_epochs x num_minibatches calls of update_step

each eager and compiled as the device runs it best: --compile on a CPU, --compile --cudagraphs on CUDA (the update one
CUDA graph per minibatch step).
Per-step figures are means after 5 warm-up steps (resets included); the rollout and the update are medians over
--iterations after the first; CUDA is synchronised before a clock is read. The last table predicts SPS as batch /
(num_steps x rollout + update) for each pairing, beside the env's ceiling.
"""

from __future__ import annotations

import argparse
import ast
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


def storage(a, device: torch.device):
    """The script's rollout storage: on the device obs, actions, logprobs, values, next_obs; on the host rewards and
    dones (the numpy views its rollouts write)."""
    shape = (a.num_steps, a.num_envs)
    obs = torch.zeros((*shape, 4, 84, 84), dtype=torch.uint8, device=device)
    if a.channels_last:
        obs = obs.movedim(2, -1).contiguous().movedim(-1, 2)
    actions = torch.zeros(shape, dtype=torch.long, device=device)
    logprobs, values = torch.zeros(shape, device=device), torch.zeros(shape, device=device)
    next_obs = torch.zeros((a.num_envs, 4, 84, 84), dtype=torch.uint8, device=device)
    rewards, dones = np.zeros(shape, np.float32), np.zeros((shape[0] + 1, shape[1]), np.float32)
    return obs, actions, logprobs, values, next_obs, rewards, dones


def rollouts(a, threads: int, buffers, pin: bool) -> tuple[dict[str, object], list]:
    """Each way the script collects a rollout, with envs of its own as the script makes them; and those envs."""
    n, half = a.num_envs, a.num_envs // 2
    envs = [ppo_atari.make_envs(a, n, threads), ppo_atari.make_envs(a, n, threads, half)]
    envs += [ppo_atari.make_envs(a, size, max(1, threads // 2)) for size in (half, n - half)]
    collectors = {
        "one group": ppo_atari.Rollout(envs[:1], [slice(0, n)], 1, buffers, pin),
        "two halves": ppo_atari.Rollout(envs[2:], [slice(0, half), slice(half, n)], 1, buffers, pin),
        f"--async-envs {half}": ppo_atari.AsyncRollout(envs[1], 1, buffers),
    }
    return collectors, envs


def time_update(a, agent, loss_fn, batch: dict, graph: bool, iterations: int, device) -> float:
    """ms of one iteration's update as the script runs it (its update_step), with a fresh Adam as the script makes
    it, so that each variant starts from the same weights' state."""
    params = list(agent.parameters())
    learning_rate = gpu_utils.learning_rate_tensor(a.learning_rate, device)
    optimizer = torch.optim.Adam(params, lr=learning_rate, eps=1e-5, fused=True, capturable=graph)
    micro = gpu_utils.MicroBatch(a.minibatch_size)
    mb_loss = from_script("mb_loss", loss_fn=loss_fn, agent=agent, args=a)
    scope = dict(optimizer=optimizer, args=a, mb_loss=mb_loss, micro=micro, params=params, distributed=False)
    step = gpu_utils.CudaGraph(from_script("update_step", **scope, **batch), enabled=graph, name="update", micro=micro)
    size = a.num_envs * a.num_steps

    def iteration():
        for _epoch in range(a.update_epochs):
            b_inds = torch.randperm(size, device=device)
            for start in range(0, size, a.minibatch_size):
                step(b_inds[start : start + a.minibatch_size])

    return statistics.median(timed(iteration, iterations - 1, device, warmup=1)) * 1000


def time_variant(a, compiled: bool, graphs: bool, agent, host_obs, collectors, batch, o, device):
    """One way the script runs (eager, --compile, --compile --cudagraphs): ms of its policy step, of each rollout
    per vector step, and of its update."""
    policy_step = from_script("policy_step", agent=agent)
    captured = "loss" if graphs else ""  # the update's graph holds the loss, as in the script
    policy_step, loss_fn = gpu_utils.compile_steps(policy_step, ppo_atari.ppo_loss, compiled, graphs, captured, False)
    bootstrap = from_script("bootstrap", agent=agent, args=a, device=device)
    next_obs = host_obs.to(device)

    def act():
        next_obs.copy_(host_obs, non_blocking=True)
        policy_step(next_obs)[0].cpu()

    def collect(rollout):
        return statistics.median(timed(lambda: rollout.collect(policy_step, bootstrap), o.iterations - 1, device, 1))

    policy = statistics.fmean(timed(act, o.steps, device)) * 1000
    rollouts_ms = {how: collect(rollout) * 1000 / a.num_steps for how, rollout in collectors.items()}
    return policy, rollouts_ms, time_update(a, agent, loss_fn, batch, graphs, o.iterations, device)


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
        device, _ = run_utils.select_device(a)
    gpu_utils.enable_tf32(a.tf32, a.torch_deterministic)
    threads = gpu_utils.thread_budget(a.num_threads).threads
    gpu_utils.limit_threads(threads)
    torch.manual_seed(a.seed)
    cuda = device.type == "cuda"
    envs = ppo_atari.make_envs(a, a.num_envs, threads)
    agent = ppo_atari.Agent(envs.single_action_space.n, a.amp).to(device, memory_format=torch.channels_last)
    host_obs = torch.as_tensor(envs.reset(seed=1)[0])
    host_obs = host_obs.pin_memory() if cuda else host_obs
    actions = np.random.default_rng(0).integers(0, envs.single_action_space.n, (o.steps + 5, a.num_envs))
    step = iter(actions)
    env_ms = statistics.fmean(timed(lambda: envs.step(next(step)), o.steps, torch.device("cpu"))) * 1000
    envs.close()
    rows = [(f"env: AtariVectorEnv.step, {a.num_envs} envs, {threads} threads", env_ms, "ms / vector step")]
    buffers = storage(a, device)
    collectors, rollout_envs = rollouts(a, threads, buffers, cuda)
    names = ("obs", "actions", "logprobs", "values")
    batch = {f"b_{name}": x.reshape((-1, *x.shape[2:])) for name, x in zip(names, buffers)}
    batch |= {"b_advantages": torch.randn_like(batch["b_values"]), "b_returns": torch.randn_like(batch["b_values"])}
    variants = {"eager": (False, False)} | (
        {} if o.no_compile else {GRAPH: (True, True)} if cuda else {"--compile": (True, False)}
    )
    predicted = []
    for name, (compiled, graphs) in variants.items():
        print(f"[profile] {name} ...", flush=True)
        policy_ms, rollout_ms, update_ms = time_variant(
            a, compiled, graphs, agent, host_obs, collectors, batch, o, device
        )
        update = f"update ({name}), {a.num_minibatches} x {a.update_epochs} minibatches"
        rows += [(f"policy ({name}): copy in, act, actions out", policy_ms, "ms / vector step")]
        rows += [(f"rollout, {how} ({name})", ms, "ms / vector step") for how, ms in rollout_ms.items()]
        rows += [(update, update_ms, "ms / iteration")]
        predicted += [(f"{how} ({name})", update, a.num_steps * ms, update_ms) for how, ms in rollout_ms.items()]
    for envs in rollout_envs:
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
