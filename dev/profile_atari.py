"""Where one ppo_atari.py iteration spends its time: each phase timed alone, with the variants a faster loop could use.

    python benchmark/profile_atari.py                                # the device ppo_atari.py would pick
    python benchmark/profile_atari.py --device cuda --out benchmark/results

Phases (ppo_atari.py's own Agent, ppo_loss, make_envs and gpu_utils.accumulate_gradients; its policy step is copied):
  env        AtariVectorEnv.step alone, random actions: ms per vector step (the raw ceiling)
  policy     pinned host->device copy of the observations, the policy step, the actions back to the host
  rollout    both in turn, as ppo_atari.py does (sequential), and in two halves of N/2 envs that overlap: one half's
             envs step (C++ threads, GIL released) while the policy acts on the other half
  update     one iteration's update (num_minibatches x update_epochs steps: loss, backward, clipping, Adam), with
             Adam's foreach or fused kernels, eager or with the loss compiled, and on CUDA as ppo_atari.py
             --cudagraphs runs it: each minibatch step one CUDA graph (--script-paths: only the script's own paths)
  host       --host-only: the rollout's host work alone, on the CPU (no env, no network): the recorded results of
             real env steps replayed through ppo_atari.py's per-step bookkeeping (copied: staging copy, episode
             accounting, reward/done buffers, the truncation check, the action copy back), timed per vector step and
             counted in Python lines and calls into C per vector step, figures that do not depend on the load
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

import gymnasium as gym
import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import gpu_utils  # noqa: E402
from ppo_atari import Agent, Args, EpisodeTracker, make_envs, ppo_loss  # noqa: E402  (registers the ALE ids)

GRAPH_UPDATE = "one CUDA graph per minibatch step: compiled loss, Adam fused capturable"  # --cudagraphs' update


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


def record_env_results(a: Args, steps: int) -> tuple[dict, list[tuple]]:
    """Reset and `steps` vector steps of random actions: what the host work gets from the envs."""
    envs = make_envs(a, a.num_envs, 1)
    _, info = envs.reset(seed=1)
    rng = np.random.default_rng(0)
    results = [envs.step(rng.integers(0, envs.single_action_space.n, a.num_envs)) for _ in range(steps)]
    envs.close()
    return info, results


def host_work(
    a: Args, first_info: dict, results: list[tuple], groups: int, count_calls: bool
) -> tuple[float, int, int]:
    """ppo_atari.py's host work for len(results) vector steps in `groups` groups (copied from its loop, without the
    network: the truncated games' values are zeros here). Returns (seconds, Python lines run, calls into C), the two
    counts only with count_calls: counting slows the run, so the timed runs do not count."""
    n = a.num_envs
    rows = [slice(g * n // groups, (g + 1) * n // groups) for g in range(groups)]
    obs_shape = results[0][0].shape[1:]
    host_obs = torch.empty((n, *obs_shape), dtype=torch.uint8)
    next_obs = torch.empty((n, *obs_shape), dtype=torch.uint8)
    actions = torch.zeros((len(results), n), dtype=torch.long)
    host_rewards = np.zeros((len(results), n), dtype=np.float32)
    host_dones = np.zeros((len(results) + 1, n), dtype=np.float32)
    game_over = np.zeros((len(results), n), dtype=bool)
    game_scores = np.zeros((len(results), n))
    game_lengths = np.zeros((len(results), n), dtype=np.int64)
    trackers = [EpisodeTracker(r.stop - r.start, first_info["lives"][r]) for r in rows]
    host_obs_np = host_obs.numpy()
    # each group's slice of every result, cut before the clock starts (the envs hand each group its own arrays)
    sliced = [[(o[r], rw[r], te[r], tr[r], {"lives": i["lives"][r]}) for r in rows] for o, rw, te, tr, i in results]
    lines = 0
    c_calls = 0

    def count_lines(frame, event, arg):  # Python lines run (a loop over finished games shows here)
        nonlocal lines
        lines += event == "line"
        return count_lines

    def count_c_calls(frame, event, arg):  # calls into C: numpy, torch, builtins
        nonlocal c_calls
        c_calls += event == "c_call"

    start = time.perf_counter()
    sys.settrace(count_lines if count_calls else None)
    sys.setprofile(count_c_calls if count_calls else None)
    for t, step_results in enumerate(sliced):
        for g, r in enumerate(rows):
            actions[t, r].cpu().numpy()  # the actions back to the host, as the policy's step ends
            host_obs_np[r], reward, terminated, truncated, info = step_results[g]
            next_obs[r].copy_(host_obs[r], non_blocking=True)
            outcome = trackers[g].step(reward, terminated, truncated, info["lives"])
            host_rewards[t, r], host_dones[t + 1, r], game_over[t, r], game_scores[t, r], game_lengths[t, r] = outcome
            if truncated.any():
                host_rewards[t, r] += a.gamma * np.zeros(r.stop - r.start, dtype=np.float32)
    sys.setprofile(None)
    sys.settrace(None)
    return time.perf_counter() - start, lines, c_calls


def host_only(o) -> int:
    a = Args(env_id=o.env_id, num_envs=o.num_envs, num_steps=o.num_steps)
    info, results = record_env_results(a, o.steps)
    print(f"[profile] host work alone, {a.num_envs} envs, {o.steps} recorded vector steps, {o.repeats} repeats")
    for groups in (1, 2):
        timed = [host_work(a, info, results, groups, count_calls=False)[0] for _ in range(o.repeats + 1)][1:]
        _, lines, c_calls = host_work(a, info, results, groups, count_calls=True)  # after the warm-up's lazy set-up
        us = min(timed) / o.steps * 1e6  # the fastest repeat: the least disturbed by other load
        counts = f"{lines / o.steps:.2f} Python lines, {c_calls / o.steps:.2f} calls into C"
        print(f"[profile] host work, {groups} group(s): {us:.1f} us / vector step (fastest repeat); {counts} / step")
    return 0


def time_update(agent, loss_fn, fused: bool, batch, a: Args, iterations: int, cudagraphs: bool, graph: bool) -> float:
    """One iteration's update as ppo_atari.py runs it; a fresh Adam so each variant starts from the same state.
    ``graph``: each minibatch step (loss, backward, clipping, Adam) as one CUDA graph (gpu_utils.CudaGraph, Adam
    capturable with a device learning rate), as ppo_atari.py --cudagraphs runs it."""
    params = list(agent.parameters())
    b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values = batch
    device = b_obs.device
    lr = torch.tensor(a.learning_rate, device=device) if graph else a.learning_rate
    optimizer = torch.optim.Adam(params, lr=lr, eps=1e-5, fused=fused or None, capturable=graph)
    n = len(b_obs)

    def mb_loss(*data):
        return loss_fn(agent, *data, a.clip_coef, a.ent_coef, a.vf_coef, a.clip_vloss)

    def minibatch_step(mb):
        optimizer.zero_grad(set_to_none=True)
        adv = b_advantages[mb]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        data = (b_obs[mb], b_actions[mb], b_logprobs[mb], adv, b_returns[mb], b_values[mb])
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        mb_stats, _ = gpu_utils.accumulate_gradients(mb_loss, data, a.minibatch_size, params)
        torch.nn.utils.clip_grad_norm_(params, a.max_grad_norm)
        optimizer.step()
        return mb_stats

    step = gpu_utils.CudaGraph(minibatch_step, enabled=graph, name="update")
    times = []
    for _ in range(iterations):
        sync(device)
        t0 = time.perf_counter()
        stats = torch.zeros(7, device=device)
        for _epoch in range(a.update_epochs):
            b_inds = torch.randperm(n, device=device)
            for start in range(0, n, a.minibatch_size):
                stats += step(b_inds[start : start + a.minibatch_size])
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
    p.add_argument("--host-only", action="store_true", help="time the rollout's host work alone on the CPU")
    p.add_argument("--repeats", type=int, default=20, help="repeats of the host work timing (--host-only)")
    p.add_argument(
        "--script-paths",
        action="store_true",
        help="only what ppo_atari.py runs: eager, and --compile --cudagraphs (the update as one CUDA graph)",
    )
    o = p.parse_args()
    checks = {  # the one-line error for each condition that must hold (ale-py crashes on 0 envs)
        f"--env-id {o.env_id!r} is not an ALE/<Game>-v5 id": o.env_id.startswith("ALE/") and o.env_id in gym.registry,
        f"--num-envs must be at least 2 (two halves are timed), got {o.num_envs}": o.num_envs >= 2,
        "--num-steps, --minibatch-size and --repeats must be at least 1": (
            min(o.num_steps, o.minibatch_size, o.repeats) >= 1
        ),
        f"--steps must be at least 6 (the first 5 are warm-up), got {o.steps}": o.steps >= 6,
        f"--iterations must be at least 2 (the first is warm-up), got {o.iterations}": o.iterations >= 2,
        f"--device {o.device} needs CUDA, which is not available here; use auto or cpu": (
            o.device in ("auto", "cpu") or torch.cuda.is_available()
        ),
    }
    failed = [message for message, ok in checks.items() if not ok]
    try:
        if failed:
            raise ValueError(failed[0])
        gpu = {"auto": "auto", "cuda": "true", "cpu": "false"}.get(o.device, o.device)
        device, _ = gpu_utils.select_device(gpu)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if o.host_only:
        return host_only(o)
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
    if o.script_paths:  # ppo_atari.py's own: eager, and --compile (with --cudagraphs on CUDA)
        variants = [v for v in variants if v[0] in ("eager", "compile reduce-overhead" if cuda else "compile")]
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
    # (name, loss, Adam fused, loss compiled with CUDA graphs, the minibatch step as one CUDA graph)
    update_variants = [("eager, Adam foreach", ppo_loss, False, False, False)]
    if cuda:
        update_variants.append(("eager, Adam fused", ppo_loss, True, False, False))
    if not o.no_compile:
        update_variants.append(("compiled loss, Adam foreach", torch.compile(ppo_loss), False, False, False))
        if cuda:
            update_variants.append(("compiled loss, Adam fused", torch.compile(ppo_loss), True, False, False))
            cg_loss = torch.compile(ppo_loss, mode="reduce-overhead")
            update_variants.append(("compiled reduce-overhead loss, Adam foreach", cg_loss, False, True, False))
            update_variants.append(("compiled reduce-overhead loss, Adam fused", cg_loss, True, True, False))
            update_variants.append((GRAPH_UPDATE, torch.compile(ppo_loss), True, False, True))
    if o.script_paths:  # eager (fused Adam, as on a CPU too) and what --cudagraphs runs
        graph = [v for v in update_variants if v[0] == GRAPH_UPDATE]
        update_variants = [("eager, Adam fused", ppo_loss, True, False, False), *graph]
    update_ms = {}
    for name, loss_fn, fused, cg, graph in update_variants:
        update_ms[name] = row(
            f"update ({name}), {batch_size // a.minibatch_size} x {a.update_epochs} minibatches",
            time_update(agent, loss_fn, fused, batch, a, o.iterations, cg, graph),
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
