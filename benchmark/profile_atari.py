"""Where one ppo_atari.py iteration spends its time: each phase timed alone, with the variants a faster loop could use.

    python benchmark/profile_atari.py                                # the device ppo_atari.py would pick
    python benchmark/profile_atari.py --device cuda --out benchmark/results

Phases (ppo_atari.py's own Agent, ppo_loss, make_envs and gpu_utils.accumulate_gradients; its policy step is copied):
  env        AtariVectorEnv.step alone, random actions: ms per vector step (the raw ceiling)
  policy     pinned host->device copy of the observations, the policy step, the actions back to the host
  rollout    both in turn, as ppo_atari.py does (sequential), and in two halves of N/2 envs that overlap: one half's
             envs step (C++ threads, GIL released) while the policy acts on the other half
  update     one iteration's update (num_minibatches x update_epochs steps: loss, backward, clipping, Adam), with
             Adam's foreach or fused kernels, eager or with the loss compiled
Per-step figures are means after 5 warm-up steps (resets included), the update the median of its iterations after
the first; CUDA is synchronised before a clock is read. The last table predicts SPS as
batch / (num_steps x rollout + update) for each pairing, beside the env's ceiling.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import gpu_utils  # noqa: E402
from ppo_atari import Agent, Args, make_envs, ppo_loss  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def mean_ms(times: list[float]) -> float:
    """Mean after 5 warm-up steps: a vector step waits for its slowest env, and the rare slow ones (a game's reset)
    are part of the cost, which a median would hide."""
    return statistics.fmean(times[5:]) * 1000


def make_policy_step(agent):
    @torch.no_grad()
    def policy_step(x):  # as in ppo_atari.py
        logits, value = agent(x)
        logp_all = torch.log_softmax(logits, -1)
        action = (logits - (-torch.rand_like(logits).log()).log()).argmax(-1)
        return action, logp_all.gather(-1, action[:, None]).squeeze(-1), value

    return policy_step


def time_env(envs, steps: int) -> float:
    rng = np.random.default_rng(0)
    n = envs.num_envs
    times = []
    for _ in range(steps):
        a = rng.integers(0, envs.single_action_space.n, n)
        t0 = time.perf_counter()
        envs.step(a)
        times.append(time.perf_counter() - t0)
    return mean_ms(times)


def time_policy(policy_step, host_obs, device, steps: int, cudagraphs: bool) -> float:
    next_obs = host_obs.to(device)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        next_obs.copy_(host_obs, non_blocking=True)
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        action, _, _ = policy_step(next_obs)
        action.cpu().numpy()
        times.append(time.perf_counter() - t0)
    return mean_ms(times)


def time_rollout(envs, policy_step, device, steps: int, cudagraphs: bool, store: torch.Tensor | None = None) -> float:
    """ppo_atari.py's rollout step: copy obs in, act, actions out, env step (sequential)."""
    pin = device.type == "cuda"
    host_obs = torch.empty((envs.num_envs, *envs.single_observation_space.shape), dtype=torch.uint8, pin_memory=pin)
    host_obs.numpy()[:], _ = envs.reset(seed=1)
    next_obs = host_obs.to(device)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        if store is not None:
            store[step % len(store)] = next_obs
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        action, _, _ = policy_step(next_obs)
        host_obs.numpy()[:], *_ = envs.step(action.cpu().numpy())
        next_obs.copy_(host_obs, non_blocking=True)
        times.append(time.perf_counter() - t0)
    sync(device)
    return mean_ms(times)


def time_rollout_halves(halves, policy_step, device, steps: int, cudagraphs: bool) -> float:
    """Two vector envs of N/2: while one half's envs step, the policy acts on the other half's observations (without
    the sequential version's copy into rollout storage: one small device copy per step)."""
    pin = device.type == "cuda"
    shape = halves[0].single_observation_space.shape
    host = [torch.empty((h.num_envs, *shape), dtype=torch.uint8, pin_memory=pin) for h in halves]
    dev = []
    for i, (h, buf) in enumerate(zip(halves, host)):
        buf.numpy()[:], _ = h.reset(seed=1 + i * h.num_envs)
        dev.append(buf.to(device))
    for h, d in zip(halves, dev):  # both halves in flight before the loop
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        h.send(policy_step(d)[0].cpu().numpy())
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for h, buf, d in zip(halves, host, dev):
            buf.numpy()[:], *_ = h.recv()
            d.copy_(buf, non_blocking=True)
            if cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            h.send(policy_step(d)[0].cpu().numpy())  # the other half keeps stepping meanwhile
        times.append(time.perf_counter() - t0)
    for h in halves:
        h.recv()
    sync(device)
    return mean_ms(times)


def time_update(agent, loss_fn, fused: bool, batch, a: Args, iterations: int, cudagraphs: bool) -> float:
    """One iteration's update as ppo_atari.py runs it; a fresh Adam so each variant starts from the same state."""
    params = list(agent.parameters())
    optimizer = torch.optim.Adam(params, lr=a.learning_rate, eps=1e-5, fused=fused or None)
    b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values = batch
    device = b_obs.device
    n = len(b_obs)

    def mb_loss(*data):
        return loss_fn(agent, *data, a.clip_coef, a.ent_coef, a.vf_coef, a.clip_vloss)

    times = []
    for _ in range(iterations):
        sync(device)
        t0 = time.perf_counter()
        stats = torch.zeros(7, device=device)
        for _epoch in range(a.update_epochs):
            b_inds = torch.randperm(n, device=device)
            for start in range(0, n, a.minibatch_size):
                mb = b_inds[start : start + a.minibatch_size]
                adv = b_advantages[mb]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                data = (b_obs[mb], b_actions[mb], b_logprobs[mb], adv, b_returns[mb], b_values[mb])
                if cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                mb_stats, _ = gpu_utils.accumulate_gradients(mb_loss, data, a.minibatch_size, params)
                torch.nn.utils.clip_grad_norm_(params, a.max_grad_norm)
                optimizer.step()
                stats += mb_stats
        stats.tolist()  # the script's one pull per iteration
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) * 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", default="ALE/Breakout-v5")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--minibatch-size", type=int, default=256)
    p.add_argument("--device", default="auto", help="auto, cuda, cpu (as ppo_atari.py's --gpu reads it)")
    p.add_argument("--steps", type=int, default=300, help="vector steps per rollout measurement")
    p.add_argument("--iterations", type=int, default=4, help="updates per measurement (the first is warm-up)")
    p.add_argument("--no-compile", action="store_true", help="eager variants only (quick, and on a CPU)")
    p.add_argument("--no-deterministic", action="store_true", help="as --no-torch-deterministic: cuDNN benchmark mode")
    p.add_argument("--update-only", action="store_true", help="time the update alone (on a rollout of random actions)")
    p.add_argument("--out", default="", help="folder for profile_atari_<device>.md (empty: print only)")
    o = p.parse_args()
    gpu = {"auto": "auto", "cuda": "true", "cpu": "false"}.get(o.device, o.device)
    device, _ = gpu_utils.select_device(gpu)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    gpu_utils.enable_tf32(True, not o.no_deterministic)  # the script's defaults: TF32 on, deterministic cuDNN
    threads = gpu_utils.thread_budget(0).threads
    gpu_utils.limit_threads(threads)
    a = Args(env_id=o.env_id, num_envs=o.num_envs, num_steps=o.num_steps, minibatch_size=o.minibatch_size)
    batch_size = a.num_envs * a.num_steps
    torch.manual_seed(1)
    envs = make_envs(a, a.num_envs, min(threads, a.num_envs))
    envs.reset(seed=1)
    agent = Agent(envs.single_action_space.n).to(device, memory_format=torch.channels_last)
    obs_shape = envs.single_observation_space.shape
    rows: list[tuple[str, float, str]] = []  # (phase, ms, unit)

    def row(name: str, ms: float, unit: str) -> float:
        rows.append((name, ms, unit))
        print(f"[profile] {name}: {ms:.3f} {unit}", flush=True)
        return ms

    env_ms = row(
        f"env: AtariVectorEnv.step, {a.num_envs} envs, {min(threads, a.num_envs)} threads",
        time_env(envs, o.steps),
        "ms / vector step",
    )
    variants = [("eager", make_policy_step(agent), False)]
    if not o.no_compile:
        variants.append(("compile", torch.compile(make_policy_step(agent)), False))
        if cuda:
            variants.append(
                (
                    "compile reduce-overhead",
                    torch.compile(make_policy_step(agent), mode="reduce-overhead"),
                    True,
                )
            )
    host_obs = torch.as_tensor(envs.step(np.zeros(a.num_envs, dtype=np.int64))[0].copy())
    host_obs = host_obs.pin_memory() if cuda else host_obs
    rollout_ms = {}
    store = torch.zeros((a.num_steps, a.num_envs, *obs_shape), dtype=torch.uint8, device=device)
    if o.update_only:  # one eager rollout, only to fill the batch with real frames
        variants = variants[:1]
    for name, step_fn, cg in [] if o.update_only else variants:
        row(
            f"policy ({name}): copy in, act, actions out",
            time_policy(step_fn, host_obs, device, o.steps, cg),
            "ms / vector step",
        )
    for name, step_fn, cg in variants:
        rollout_ms[name] = row(
            f"rollout, sequential ({name})",
            time_rollout(envs, step_fn, device, max(o.steps, a.num_steps), cg, store),
            "ms / vector step",
        )
    envs.close()
    half = a.num_envs // 2
    halves = [make_envs(a, half, min(threads // 2 or 1, half)) for _ in range(0 if o.update_only else 2)]
    for name, step_fn, cg in [] if o.update_only else variants:
        rollout_ms[f"{name}, 2 halves"] = row(
            f"rollout, 2 overlapped halves of {half} envs ({name})",
            time_rollout_halves(halves, step_fn, device, o.steps, cg),
            "ms / vector step",
        )
    for h in halves:
        h.close()

    # a batch of real observations (the last rollout's) with plausible statistics, shuffled as the script does
    g = torch.Generator(device).manual_seed(0)
    b_obs = store.reshape((batch_size, *obs_shape))
    if a.channels_last:
        b_obs = b_obs.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        logits, values = agent(b_obs)
    b_actions = torch.randint(0, logits.shape[-1], (batch_size,), device=device, generator=g)
    b_logprobs = torch.log_softmax(logits, -1).gather(-1, b_actions[:, None]).squeeze(-1)
    b_advantages = torch.randn(batch_size, device=device, generator=g)
    b_returns = values + b_advantages
    batch = (b_obs, b_actions, b_logprobs, b_advantages, b_returns, values)
    update_variants = [("eager, Adam foreach", ppo_loss, False, False)]
    if cuda:
        update_variants.append(("eager, Adam fused", ppo_loss, True, False))
    if not o.no_compile:
        update_variants.append(("compiled loss, Adam foreach", torch.compile(ppo_loss), False, False))
        if cuda:
            update_variants.append(("compiled loss, Adam fused", torch.compile(ppo_loss), True, False))
            cg_loss = torch.compile(ppo_loss, mode="reduce-overhead")
            update_variants.append(("compiled reduce-overhead loss, Adam foreach", cg_loss, False, True))
            update_variants.append(("compiled reduce-overhead loss, Adam fused", cg_loss, True, True))
    update_ms = {}
    for name, loss_fn, fused, cg in update_variants:
        update_ms[name] = row(
            f"update ({name}), {batch_size // a.minibatch_size} x {a.update_epochs} minibatches",
            time_update(agent, loss_fn, fused, batch, a, o.iterations, cg),
            "ms / iteration",
        )

    ceiling = a.num_envs / env_ms * 1000
    lines = [
        f"# Where a ppo_atari.py iteration goes: {a.env_id}, {a.num_envs} envs x {a.num_steps} steps, "
        f"minibatch {a.minibatch_size}, {a.update_epochs} epochs",
        "",
        f"- command: `python {' '.join(sys.argv)}`",
        f"- device: {torch.cuda.get_device_name(device) if cuda else 'cpu'}; CPU threads: {threads}; "
        f"cuDNN {'benchmark mode' if o.no_deterministic else 'deterministic'}; "
        f"torch {torch.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| phase | ms | per |",
        "|---|---|---|",
        *[f"| {name} | {ms:.3f} | {unit} |" for name, ms, unit in rows],
        "",
        f"Env ceiling: {ceiling:,.0f} agent steps/s. "
        f"Predicted SPS = {batch_size} / ({a.num_steps} x rollout + update):",
        "",
        "| rollout | update | predicted SPS | of the ceiling | rollout share |",
        "|---|---|---|---|---|",
    ]
    for r_name, r_ms in rollout_ms.items():
        for u_name, u_ms in update_ms.items():
            total = a.num_steps * r_ms + u_ms
            sps = batch_size / total * 1000
            lines.append(
                f"| {r_name} | {u_name} | {sps:,.0f} | {sps / ceiling:.0%} | {a.num_steps * r_ms / total:.0%} |"
            )
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if o.out:
        os.makedirs(o.out, exist_ok=True)
        tag = "_nondeterministic" if o.no_deterministic else ""
        path = os.path.join(o.out, f"profile_atari_{device.type}{tag}.md")
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
