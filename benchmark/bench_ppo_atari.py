"""Print SPS of ppo_atari.py against a straightforward CleanRL-style baseline over a short fixed budget.

SPS here = agent steps per second between the end of the first (warm-up) iteration and the end of the last one,
read from the wall-clock times of the `charts/learning_rate` TensorBoard events that both scripts write once per
iteration; the same ruler for both scripts. Configurations: CleanRL settings (--num-envs 8 --num-minibatches 4,
minibatch 256) for both scripts, ppo_atari.py defaults (16 envs, minibatch 256), and then on a CPU ppo_atari.py with
--compile and with --amp, on a GPU with --compile --cudagraphs. Runs are interleaved over --repeats rounds to
spread machine noise.

    python benchmark/bench_ppo_atari.py --iterations 5 --repeats 2
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import tyro
from throughput import machine_line

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Args:
    env_id: str = "ALE/Breakout-v5"
    """game to step"""
    iterations: int = 5
    """PPO iterations per run (the first is warm-up and not timed)"""
    repeats: int = 1
    """rounds of all configurations (interleaved)"""
    only: str | None = None
    """comma-separated subset of configuration names to run"""
    skip_baseline: bool = False
    """do not run the baseline"""


def sps_from_run(cwd: Path) -> float:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (run_dir,) = (cwd / "runs").iterdir()
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    events = acc.Scalars("charts/learning_rate")
    first, last = events[0], events[-1]
    return (last.step - first.step) / (last.wall_time - first.wall_time)


if __name__ == "__main__":
    args = tyro.cli(Args)
    import torch

    ours, base = str(ROOT / "ppo_atari.py"), str(ROOT / "benchmark" / "baseline_ppo_atari.py")
    common = ["--env-id", args.env_id, "--no-progress-bar", "--checkpoint-every", "0"]
    cleanrl = ["--num-envs", "8", "--num-minibatches", "4"]
    configs = {
        "baseline (CleanRL settings)": (base, ["--env-id", args.env_id, *cleanrl], 1024),
        "ppo_atari (CleanRL settings)": (ours, [*common, *cleanrl], 1024),
        "ppo_atari (defaults)": (ours, common, 2048),
    }
    if not torch.cuda.is_available():  # torch.compile (inductor, C++ kernels), and bf16 autocast (CPU-dependent)
        configs["ppo_atari (CleanRL settings) --compile"] = (ours, [*common, *cleanrl, "--compile"], 1024)
        configs["ppo_atari (defaults) --compile"] = (ours, [*common, "--compile"], 2048)
        configs["ppo_atari (CleanRL settings) --amp"] = (ours, [*common, *cleanrl, "--amp"], 1024)
    if torch.cuda.is_available():
        configs["ppo_atari (CleanRL settings) --compile --cudagraphs"] = (
            ours,
            [*common, *cleanrl, "--compile", "--cudagraphs"],
            1024,
        )
        configs["ppo_atari (defaults) --compile --cudagraphs"] = (ours, [*common, "--compile", "--cudagraphs"], 2048)
    if args.skip_baseline:
        configs.pop("baseline (CleanRL settings)")
    if args.only:
        configs = {k: v for k, v in configs.items() if k in args.only.split(",")}
    print(f"machine: {machine_line()}")
    results, cpu_cost = {name: [] for name in configs}, {name: [] for name in configs}
    for round_ in range(args.repeats):
        for name, (script, flags, batch) in configs.items():
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [sys.executable, script, *flags, "--total-timesteps", str(batch * args.iterations)]
                start = time.time()
                with open(os.path.join(tmp, "log.txt"), "w+") as log:
                    proc = subprocess.Popen(cmd, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, text=True)
                    _, status, usage = os.wait4(proc.pid, 0)
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    log.seek(0)
                    if proc.returncode != 0:
                        print(f"{name}: failed\n{log.read()[-2000:]}")
                        continue
                sps = sps_from_run(Path(tmp))
                cpu = (usage.ru_utime + usage.ru_stime) / (batch * args.iterations) * 1000
                results[name].append(sps)
                cpu_cost[name].append(cpu)
                rel = " ".join(cmd[1:]).replace(str(ROOT) + "/", "")
                print(
                    f"round {round_ + 1}: {name:<52} SPS {sps:>7,.0f}  CPU-s/1k steps {cpu:6.2f}  "
                    f"({time.time() - start:.0f}s wall)  {rel}",
                    flush=True,
                )
    print(f"load average at end: {os.getloadavg()}")
    print("\nmedians over rounds: SPS (agent steps/s, warm-up iteration excluded) and CPU seconds per 1000 agent")
    print("steps (user+sys of the whole process incl. startup; less sensitive to other load than SPS)")
    have_base = bool(results.get("baseline (CleanRL settings)"))
    base_sps = statistics.median(results["baseline (CleanRL settings)"]) if have_base else None
    base_cpu = statistics.median(cpu_cost["baseline (CleanRL settings)"]) if have_base else None
    for name, values in results.items():
        if not values:
            continue
        med, cpu = statistics.median(values), statistics.median(cpu_cost[name])
        ratio = f"  {med / base_sps:.2f}x baseline SPS" if base_sps else ""
        if base_cpu:
            ratio += f", {base_cpu / cpu:.2f}x less CPU per step"
        print(f"{name:<52} SPS {med:>7,.0f}  CPU-s/1k {cpu:6.2f}{ratio}")
