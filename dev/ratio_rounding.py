"""The rollout/loss safety net's rounding: losses/initial_ratio_error of correct scripts, path by path, over whole runs.

    python dev/ratio_rounding.py                          # the CPU paths, HalfCheetah and Breakout (~15 min, 2 cores)
    python dev/ratio_rounding.py --device cuda --out DIR  # the GPU paths: TF32 on and off, --amp, --cudagraphs
    python dev/ratio_rounding.py --only continuous-fp32 atari-amp --steps-scale 0.25

Before any update step the policy is the rollout's, so the first minibatch's ratios are 1 up to rounding; each PPO
script warns once when their RMS passes RATIO_ERROR_WARNING (issue #63). A correct script must never warn, on any
path, late in training too (the policy's std shrinks there and scales up the means' rounding). This tool runs each
path as a user would (the script's own command line, in a temp folder), reads every iteration's
losses/initial_ratio_error from the event files and prints a markdown table: the max, the median, the iteration of
the max, the threshold and its margin. A path that warns is a finding. --resume rows stop a run after its first
iteration (SIGTERM at the end of its set-up) and resume it: cuDNN may choose other algorithms after a resume.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "benchmark"), ROOT]
import report  # noqa: E402  (the one reader of event files)

# what a run stopped after its first iteration runs under: SIGTERM when its set-up ends (the GPU monitor starts)
STOP_AFTER_SET_UP = """
import os, runpy, signal, sys
import gpu_utils
start = gpu_utils.GPUMonitor.start
def signalled(self):
    os.kill(os.getpid(), signal.SIGTERM)
    return start(self)
gpu_utils.GPUMonitor.start = signalled
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

CONTINUOUS = ["ppo_continuous.py", "--env-id", "HalfCheetah-v5", "--checkpoint-every", "0"]
ATARI = ["ppo_atari.py", "--env-id", "ALE/Breakout-v5", "--num-envs", "8", "--num-minibatches", "4"]
# name -> (command, agent steps at --steps-scale 1, devices): CleanRL's settings; steps enough for the std to shrink
PATHS = {
    "continuous-fp32": (CONTINUOUS, 204_800, ("cpu", "cuda")),
    "continuous-amp": ([*CONTINUOUS, "--amp"], 204_800, ("cpu", "cuda")),
    "continuous-compile": ([*CONTINUOUS, "--compile"], 204_800, ("cpu", "cuda")),
    "continuous-amp-compile": ([*CONTINUOUS, "--amp", "--compile"], 204_800, ("cpu", "cuda")),
    "continuous-cudagraphs": ([*CONTINUOUS, "--cudagraphs"], 204_800, ("cuda",)),
    "continuous-amp-cudagraphs": ([*CONTINUOUS, "--amp", "--cudagraphs"], 204_800, ("cuda",)),
    "continuous-no-tf32": ([*CONTINUOUS, "--no-tf32"], 204_800, ("cuda",)),
    "continuous-micro-batch-16": ([*CONTINUOUS, "--micro-batch", "16"], 102_400, ("cpu", "cuda")),
    "continuous-resume": (CONTINUOUS, 61_440, ("cpu", "cuda")),
    "continuous-preset-fast": ([*CONTINUOUS, "--preset", "fast"], 131_072, ("cpu", "cuda")),
    "atari-fp32": (ATARI, 40_960, ("cpu", "cuda")),
    "atari-amp": ([*ATARI, "--amp"], 40_960, ("cpu", "cuda")),
    "atari-compile": ([*ATARI, "--compile"], 40_960, ("cuda",)),
    "atari-cudagraphs": ([*ATARI, "--compile", "--cudagraphs"], 40_960, ("cuda",)),
    "atari-amp-cudagraphs": ([*ATARI, "--amp", "--compile", "--cudagraphs"], 40_960, ("cuda",)),
    "atari-no-tf32": ([*ATARI, "--no-tf32"], 40_960, ("cuda",)),
    "atari-resume": (ATARI, 20_480, ("cpu", "cuda")),
}


def measure(name: str, device: str, scale: float, timeout: float) -> dict:
    """Run path ``name`` from a temp folder; its initial_ratio_error per iteration and whether it warned."""
    command, steps, _ = PATHS[name]
    script, *args = command
    steps = max(int(steps * scale), 4096)
    args = [
        *args,
        "--total-timesteps",
        str(steps),
        "--no-progress-bar",
        "--gpu",
        "true" if device == "cuda" else "false",
    ]
    env = dict(os.environ, WANDB_MODE="offline", PYTHONPATH=ROOT)
    out = ""
    started = time.time()
    with tempfile.TemporaryDirectory() as cwd:
        legs = [["-c", STOP_AFTER_SET_UP]] if name.endswith("-resume") else []
        legs.append([])
        rc = 0
        for prefix in legs:
            resume = glob.glob(os.path.join(cwd, "runs", "*", "checkpoint.pt"))
            cmd = [
                sys.executable,
                *prefix,
                os.path.join(ROOT, script),
                *args,
                *(["--resume", resume[0]] if resume else []),
            ]
            res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
            out += res.stdout
            rc = rc or res.returncode
        errors = []  # every leg's, in the order written
        for file in sorted(glob.glob(os.path.join(cwd, "runs", "*", "events.out.tfevents.*")), key=os.path.getmtime):
            errors += [value for *_, value in report.read_event_file(file)[0].get("losses/initial_ratio_error", [])]
    warned = [line for line in out.splitlines() if line.startswith("warning: ") and "rollout's" in line]
    return dict(name=name, rc=rc, errors=errors, warned=warned, seconds=time.time() - started, steps=steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--only", nargs="*", help="these paths only (default: every path of --device)")
    parser.add_argument("--steps-scale", type=float, default=1.0, help="scale every path's agent steps")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    parser.add_argument("--seconds", type=float, help="start no path after this many seconds (a lease's part)")
    parser.add_argument("--out", help="write the table to OUT/ratio_rounding.md too")
    a = parser.parse_args()
    unknown = sorted(set(a.only or []) - set(PATHS))
    if unknown:
        parser.error(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}")
    names = a.only or [name for name, (_, _, devices) in PATHS.items() if a.device in devices]
    import torch

    import ppo_atari
    import ppo_continuous

    thresholds = {"continuous": ppo_continuous.RATIO_ERROR_WARNING, "atari": ppo_atari.RATIO_ERROR_WARNING}
    rows = []
    started = time.monotonic()
    for name in names:
        if a.seconds and time.monotonic() - started > a.seconds:
            rows.append(f"| {name} | skipped: --seconds {a.seconds:.0f} were up |" + " |" * 9)
            continue
        result = measure(name, a.device, a.steps_scale, a.timeout)
        errors = result["errors"]
        threshold = thresholds[name.split("-")[0]]
        worst = max(errors) if errors else float("nan")
        print(f"{name}: rc {result['rc']}, {len(errors)} iterations, max {worst:.3g}", flush=True)
        rows.append(
            f"| {name} | {result['steps']:,} | {len(errors)} | {worst:.2e} | "
            f"{statistics.median(errors) if errors else float('nan'):.2e} | "
            f"{1 + errors.index(worst) if errors else '-'} | {threshold:g} | {threshold / worst:,.0f}x | "
            f"{'**yes**' if result['warned'] else 'no'} | {result['rc']} | {result['seconds']:.0f} |"
        )
    machine = torch.cuda.get_device_name() if a.device == "cuda" else platform.processor() or platform.machine()
    lines = [
        f"# initial_ratio_error by path ({a.device}: {machine}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d')})",
        "",
        f"`python dev/ratio_rounding.py --device {a.device} --steps-scale {a.steps_scale}`",
        "",
        "| path | agent steps | iterations | max | median | iteration of max | threshold | margin | warned | rc | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "ratio_rounding.md"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
