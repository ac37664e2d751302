"""How fast mjx_envs.MJXVectorEnv builds, compiles and steps: the ceiling of physics on the device, no learning.

    python benchmark/mjx_speed.py                                       # HalfCheetah-v5, 64 and 1,024 worlds
    python benchmark/mjx_speed.py --env-id Hopper-v5 --num-envs 4096 --device cuda --steps 200
    python benchmark/mjx_speed.py --cold                                # a fresh compilation cache: first compile

For each number of worlds: ``build`` (model onto the device), ``first`` (first reset and step: JAX compiles them,
or loads them from its on-disk cache, ~/.cache/gpu-rl/jax), ``again`` (the same for a second env: new jitted
functions, traced again, whose compiled code JAX finds in the disk cache: what a second run pays), then ``--steps``
steps with random actions drawn on the env's device by torch (a policy's place), timed to the last result: env steps
per second (worlds x steps / s). ``--cold`` points JAX at an empty cache folder for this process, so ``first`` is a
first compile. Prints one table
row per setting, with the machine, JAX's version and the load average beside it (other processes share a CPU).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import mjx_envs  # noqa: E402


def first_step(env_id: str, num_envs: int, device: str | None, impl: str) -> tuple[mjx_envs.MJXVectorEnv, float, float]:
    """A new env, its first reset and step: (env, seconds to build, seconds to the first step's result)."""
    start = time.perf_counter()
    env = mjx_envs.MJXVectorEnv(env_id, num_envs, seed=0, device=device, impl=impl)
    built = time.perf_counter()
    env.reset()
    obs = env.step(random_action(env))[0]
    float(obs.sum())  # the result on the host: compiled (or loaded) and stepped
    return env, built - start, time.perf_counter() - built


def random_action(env: mjx_envs.MJXVectorEnv) -> torch.Tensor:
    """Uniform in the control range, drawn by torch on the env's device (where a policy would act)."""
    low = torch.as_tensor(env.single_action_space.low, device=env.device)
    high = torch.as_tensor(env.single_action_space.high, device=env.device)
    return low + (high - low) * torch.rand((env.num_envs, len(low)), device=env.device)


def measure(env_id: str, num_envs: int, steps: int, device: str | None, impl: str) -> dict:
    env, build, first = first_step(env_id, num_envs, device, impl)
    env.close()
    # a second env has new jitted functions: JAX traces them again and finds the compiled code in its disk cache
    env, _, again = first_step(env_id, num_envs, device, impl)
    start = time.perf_counter()
    for _ in range(steps):
        obs = env.step(random_action(env))[0]
    float(obs.sum())
    sps = num_envs * steps / (time.perf_counter() - start)
    env.close()
    return dict(build=build, first=first, again=again, sps=sps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="HalfCheetah-v5", choices=list(mjx_envs.TASKS))
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--steps", type=int, default=50, help="timed steps per setting, after the first")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: JAX's default device)")
    parser.add_argument("--impl", default="jax", choices=["jax", "warp"])
    parser.add_argument("--cold", action="store_true", help="compile into an empty cache (a first compile)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mjx-speed-cold-") as empty_cache:
        if args.cold:
            os.environ["JAX_COMPILATION_CACHE_DIR"] = empty_cache  # read by JAX when it loads, in the first env
        table(args)


def table(args: argparse.Namespace) -> None:
    import jax

    print(f"# {platform.node()}, {os.cpu_count()} CPUs, jax {jax.__version__}, python {platform.python_version()}")
    print("| env | impl | device | worlds | build s | first reset+step s | again, cached s | env steps/s | load avg |")
    print("|-|-|-|-|-|-|-|-|-|")
    for num_envs in args.num_envs:
        row = measure(args.env_id, num_envs, args.steps, args.device, args.impl)
        device = args.device or jax.devices()[0].platform
        cells = [args.env_id, args.impl, device, num_envs, f"{row['build']:.1f}", f"{row['first']:.1f}"]
        cells += [f"{row['again']:.1f}"]
        cells += [f"{row['sps']:,.0f}", f"{os.getloadavg()[0]:.1f}"]
        print("| " + " | ".join(str(cell) for cell in cells) + " |", flush=True)


if __name__ == "__main__":
    main()
