"""Throughput table: steady-state SPS of each script at its defaults and at one heavier setting, plus env ceilings.

    python benchmark/throughput.py                 # a few minutes on a small CPU machine
    python benchmark/throughput.py --scale 10      # longer runs (use on a GPU machine)

Each training run gets a fixed step budget (iterations x batch, times --scale) in a temporary folder; its SPS is
the median of the ``charts/SPS`` values it logged after the first one (the scripts log SPS per iteration after
warm-up), falling back to the last "SPS" the script printed. Ceilings: raw ``ale_py.AtariVectorEnv`` agent
steps/s with random actions (v5 settings), and raw ``VecSnake`` env steps/s with random actions on the device.
Writes ``benchmark/results/throughput_<host>_<date>.md`` with the machine described at the top.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@dataclass
class Setting:
    group: str
    label: str
    script: str
    args: list[str]
    batch: int  # agent steps per iteration (vector step for Snake)
    iters: int  # iterations at --scale 1; at least 2 are run since the scripts log SPS from the second one on
    gpu_only: bool = False  # skipped without CUDA unless --heavy-on-cpu (64-env Atari PPO: minutes per iteration)


BREAKOUT, CHEETAH = ["--env-id", "ALE/Breakout-v5"], ["--env-id", "HalfCheetah-v5"]
SNAKE_256 = ["--learning-starts", "2560", "--log-every", "6400"]  # learning on after 10 vector steps
SNAKE_4096 = ["--num-envs", "4096", "--learning-starts", "40960", "--log-every", "40960"]
TRAINING = [
    Setting("ppo_atari", "defaults (16 envs, Breakout)", "ppo_atari.py", BREAKOUT, 16 * 128, 3),
    Setting("ppo_atari", "64 envs", "ppo_atari.py", [*BREAKOUT, "--num-envs", "64"], 64 * 128, 2, gpu_only=True),
    Setting("ppo_continuous", "defaults (HalfCheetah-v5)", "ppo_continuous.py", CHEETAH, 2048, 6),
    Setting("ppo_continuous", "--preset heavy", "ppo_continuous.py", [*CHEETAH, "--preset", "heavy"], 32 * 256, 2),
    Setting("dqn_snake_vec", "defaults (256 games, 10x10)", "dqn_snake_vec.py", SNAKE_256, 256, 150),
    Setting("dqn_snake_vec", "4096 games", "dqn_snake_vec.py", SNAKE_4096, 4096, 60),
]


def machine_info() -> dict[str, str]:
    import torch

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    gpu = "none"
    if torch.cuda.is_available():
        gpu = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    info = {
        "host": socket.gethostname(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "CPU": f"{cpu}, {os.cpu_count()} logical cores",
        "GPU": gpu,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    try:
        import ale_py

        info["ale-py"] = ale_py.__version__
    except ImportError:
        pass
    if hasattr(os, "getloadavg"):
        info["load average at start (1/5/15 min)"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return info


def machine_line() -> str:
    """machine_info() on one line, for the per-script benchmarks' output."""
    return "; ".join(f"{key}: {value}" for key, value in machine_info().items())


def read_sps(run_dir: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    if "charts/SPS" not in acc.Tags().get("scalars", []):
        return []
    return [e.value for e in sorted(acc.Scalars("charts/SPS"), key=lambda e: e.step)]


def run_training(script: str, args: list[str], steps: int, timeout: float, extra: list[str]) -> dict:
    tmp = tempfile.mkdtemp(prefix="throughput_")
    cmd = [sys.executable, os.path.join(ROOT, script), *args, "--total-timesteps", str(steps)]
    cmd += ["--no-progress-bar", *extra]
    env = dict(os.environ, WANDB_MODE="disabled")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    note = ""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the scripts stop cleanly on SIGTERM and close their event files
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        note = f"stopped at the {timeout:.0f} s limit"
    wall = time.perf_counter() - t0
    sps_values: list[float] = []
    for d in sorted(os.listdir(os.path.join(tmp, "runs"))) if os.path.isdir(os.path.join(tmp, "runs")) else []:
        sps_values = read_sps(os.path.join(tmp, "runs", d))
    if len(sps_values) > 1:
        sps, source = float(np.median(sps_values[1:])), f"median of {len(sps_values) - 1} logged (first dropped)"
    elif sps_values:
        sps, source = sps_values[0], "1 logged value"
    else:
        printed = re.findall(r"SPS[:=]\s*([\d,]+(?:\.\d+)?)", out or "")
        sps, source = (float(printed[-1].replace(",", "")), "printed") if printed else (None, "none")
    if proc.returncode not in (0, None) and not note:
        last = [line for line in (out or "").strip().splitlines() if line.strip()][-1:]
        note = f"exit {proc.returncode}: {last[0][:100] if last else ''}"
    shutil.rmtree(tmp, ignore_errors=True)
    return {"sps": sps, "wall": wall, "source": source, "note": note}


def atari_ceiling(num_envs: int, seconds: float) -> float:
    import ale_py

    env = ale_py.AtariVectorEnv("breakout", num_envs, repeat_action_probability=0.25, reward_clipping=False)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    n_actions = env.single_action_space.n
    for _ in range(10):
        env.step(rng.integers(0, n_actions, num_envs))
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.step(rng.integers(0, n_actions, num_envs))
        steps += num_envs
    rate = steps / (time.perf_counter() - t0)
    env.close()
    return rate


def snake_ceiling(num_envs: int, seconds: float, device: str) -> float:
    import torch

    sys.path.insert(0, ROOT)
    from dqn_snake_vec import VecSnake

    env = VecSnake(num_envs, 10, 10, device=device, seed=0)
    env.reset()
    gen = torch.Generator(device).manual_seed(0)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(5):
        env.step(torch.randint(0, 4, (num_envs,), device=device, generator=gen))
    sync()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            env.step(torch.randint(0, 4, (num_envs,), device=device, generator=gen))
        sync()
        steps += 10 * num_envs
    return steps / (time.perf_counter() - t0)


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=1.0, help="multiply every training step budget (GPU: try 10)")
    p.add_argument("--timeout", type=float, default=240, help="seconds before a training run is stopped (SIGTERM)")
    p.add_argument("--ceiling-seconds", type=float, default=5, help="seconds per ceiling measurement")
    p.add_argument("--only", default="ppo_atari,ppo_continuous,dqn_snake_vec,ceilings", help="comma-separated parts")
    p.add_argument("--heavy-on-cpu", action="store_true", help="also run the GPU-only heavy rows without a GPU")
    p.add_argument("--gpu", default="auto", help="--gpu passed to every script (auto, true, false, N)")
    p.add_argument("--note", default="", help="line added under the machine description (e.g. other load)")
    p.add_argument("--host", default=os.environ.get("HOST_LABEL", ""), help="machine name for the file name")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args()
    if args.scale <= 0 or args.timeout <= 0 or args.ceiling_seconds <= 0:
        print("error: --scale, --timeout and --ceiling-seconds must be positive", file=sys.stderr)
        return 2
    parts = set(args.only.split(","))
    known = {"ppo_atari", "ppo_continuous", "dqn_snake_vec", "ceilings"}
    if not parts <= known:
        print(f"error: --only takes a comma-separated subset of {','.join(sorted(known))}", file=sys.stderr)
        return 2

    info = machine_info()
    rows = []
    import torch

    has_gpu = torch.cuda.is_available() and args.gpu != "false"
    for t in TRAINING:
        group, label, script, script_args = t.group, t.label, t.script, t.args
        if group not in parts:
            continue
        steps = t.batch * max(2, round(t.iters * args.scale))
        cmd = " ".join([script, *script_args, "--total-timesteps", str(steps)])
        if t.gpu_only and not has_gpu and not args.heavy_on_cpu:
            print(f"[throughput] {script} {label}: skipped (no GPU; --heavy-on-cpu runs it)", flush=True)
            rows.append((f"{script}: {label}", f"`{cmd}`", "-", "-", "-", "skipped without a GPU (--heavy-on-cpu)"))
            continue
        print(f"[throughput] {script} {label}: {steps:,} steps ...", flush=True)
        r = run_training(script, script_args, steps, args.timeout, ["--gpu", args.gpu])
        print(f"[throughput]   SPS {fmt(r['sps'])} ({r['source']}), {r['wall']:.0f} s {r['note']}", flush=True)
        rows.append((f"{script}: {label}", f"`{cmd}`", f"{r['wall']:.0f}", fmt(r["sps"]), r["source"], r["note"]))

    if "ceilings" in parts:
        for n in (16, 64):
            print(f"[throughput] AtariVectorEnv breakout x{n} random actions ...", flush=True)
            rate = atari_ceiling(n, args.ceiling_seconds)
            rows.append(
                (
                    f"ceiling: AtariVectorEnv, {n} envs",
                    "breakout, v5 settings, random actions",
                    f"{args.ceiling_seconds:.0f}",
                    fmt(rate),
                    "agent steps/s",
                    "",
                )
            )
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and args.gpu != "false" else [])
        for device in devices:
            sizes = (256, 4096, 65536) + ((1 << 20,) if device == "cuda" else ())
            for n in sizes:
                print(f"[throughput] VecSnake 10x10 x{n} on {device} ...", flush=True)
                try:
                    rate, note = snake_ceiling(n, args.ceiling_seconds, device), ""
                except Exception as exc:  # noqa: BLE001 - report and go on
                    rate, note = None, f"{type(exc).__name__}: {str(exc)[:80]}"
                rows.append(
                    (
                        f"ceiling: VecSnake 10x10, {n:,} games, {device}",
                        "random actions",
                        f"{args.ceiling_seconds:.0f}",
                        fmt(rate),
                        "env steps/s",
                        note,
                    )
                )

    if hasattr(os, "getloadavg"):
        info["load average at end (1/5/15 min)"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = ["# Throughput", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    if args.note:
        lines.append(f"- note: {args.note}")
    lines += [
        f"- step budget scale {args.scale:g}, training runs stopped after {args.timeout:.0f} s",
        "",
        "SPS = agent (env) steps per second with learning on, from the run's `charts/SPS` after warm-up; "
        "ceilings step the environments alone with random actions.",
        "",
        "| what | command / setting | wall s | SPS | SPS from | note |",
        "|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    host = re.sub(r"[^A-Za-z0-9._-]", "_", args.host or info["host"])
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"throughput_{host}_{time.strftime('%Y-%m-%d', time.gmtime())}.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
