"""Snake throughput: raw VecSnake env steps/s (random actions) and dqn_snake_vec.py training env steps/s.

    python benchmark/bench_snake.py                                  # CPU, and the GPU too when there is one
    python benchmark/bench_snake.py --device cpu --sizes 256 4096 65536 --threads 1 2
    python benchmark/bench_snake.py --device cuda --sizes 4096 65536 1048576 --train-envs 256 4096 65536

Raw: ``VecSnake.step`` on N 10x10 boards with uniformly random actions drawn on the device, timed in windows of
16 steps for --seconds after a warm-up (CUDA synchronised at the end of each window); prints the median window and
the best one (on a shared machine the best shows what the code does when it gets the cores). Training: runs
``dqn_snake_vec.py`` for --train-iterations vector steps with learning on once the replay holds one batch and
reports the median of the ``SPS=`` values it prints after the first (env steps per second with learning on).
Prints figures only; nothing here is a pass/fail test.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from throughput import machine_line  # noqa: E402


def raw_rate(num_envs: int, device: str, seconds: float, height: int, width: int, mode: str) -> tuple[float, float]:
    import torch

    from dqn_snake_vec import VecSnake

    env = VecSnake(num_envs, height, width, device=device, seed=0, mode=mode)
    env.reset()
    gen = torch.Generator(device).manual_seed(0)
    actions = torch.randint(0, 4, (64, num_envs), device=device, generator=gen)  # drawn once, cycled

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for i in range(10):
        env.step(actions[i % 64])
    sync()
    rates, t_end = [], time.perf_counter() + seconds
    while time.perf_counter() < t_end:  # windows of 16 steps: the median is typical, the best is least disturbed
        t0 = time.perf_counter()
        for i in range(16):
            env.step(actions[i])
        sync()
        rates.append(16 * num_envs / (time.perf_counter() - t0))
    return statistics.median(rates), max(rates)


def train_rate(num_envs: int, device: str, iterations: int, threads: int, extra: list[str]) -> tuple[float, str]:
    gpu = "false" if device == "cpu" else device
    log_every = num_envs * max(1, iterations // 8)
    cmd = [sys.executable, os.path.join(ROOT, "dqn_snake_vec.py"), "--gpu", gpu, "--num-envs", str(num_envs)]
    cmd += ["--total-timesteps", str(num_envs * iterations), "--learning-starts", str(num_envs)]
    cmd += ["--log-every", str(log_every), "--no-progress-bar", "--checkpoint-every", "0", *extra]
    if threads:
        cmd += ["--num-threads", str(threads)]
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, env=dict(os.environ, WANDB_MODE="disabled"))
    if res.returncode != 0:
        return float("nan"), res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "failed"
    sps = [float(m.replace(",", "")) for m in re.findall(r"SPS=([\d,]+)", res.stdout)]
    later = sps[1:] or sps
    return (statistics.median(later) if later else float("nan")), " ".join(cmd[1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (CPU, plus the GPU when present)")
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="numbers of games for the raw env rate")
    p.add_argument("--seconds", type=float, default=3.0, help="timing window per raw measurement")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch CPU thread counts to try (CPU)")
    p.add_argument("--height", type=int, default=10)
    p.add_argument("--width", type=int, default=10)
    p.add_argument("--mode", default="auto", help="VecSnake mode: auto, dense or sparse")
    p.add_argument("--train-envs", type=int, nargs="*", default=None, help="num_envs for training runs (none: skip)")
    p.add_argument("--train-iterations", type=int, default=40, help="vector steps per training run")
    p.add_argument("--train-args", default="", help="extra arguments for dqn_snake_vec.py, e.g. '--compile'")
    args = p.parse_args()

    import torch

    devices = [args.device] if args.device != "auto" else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"machine: {machine_line()}", flush=True)
    for device in devices:
        on_gpu = device.startswith("cuda")
        sizes = args.sizes or ([256, 4096, 65536, 262144, 1048576, 4194304] if on_gpu else [256, 4096, 65536])
        for threads in [0] if on_gpu else args.threads:
            if threads:
                torch.set_num_threads(threads)
            for n in sizes:
                median, best = raw_rate(n, device, args.seconds, args.height, args.width, args.mode)
                tag = f"{threads} thread{'s' if threads > 1 else ''}" if threads else device
                print(f"raw   {device:6s} {tag:9s} {args.height}x{args.width} N={n:>9,}: {median / 1e6:8.2f} M steps/s"
                      f" median, {best / 1e6:8.2f} best of 16-step windows", flush=True)  # fmt: skip
        train_envs = args.train_envs if args.train_envs is not None else ([256, 4096, 65536] if on_gpu else [256])
        for n in train_envs:
            for threads in [0] if on_gpu else args.threads:
                sps, cmd = train_rate(n, device, args.train_iterations, threads, args.train_args.split())
                tag = f"{threads} thread{'s' if threads > 1 else ''}" if threads else device
                print(f"train {device:6s} {tag:9s} N={n:>9,}: {sps:12,.0f} env steps/s   ({cmd})", flush=True)


if __name__ == "__main__":
    main()
