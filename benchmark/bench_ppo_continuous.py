"""Speed of ppo_continuous.py: SPS at the defaults against the common single-file baseline, and SPS per preset.

    python benchmark/bench_ppo_continuous.py                          # defaults vs baseline, then every preset
    python benchmark/bench_ppo_continuous.py --presets heavy --preset-iterations 3
    python benchmark/bench_ppo_continuous.py --presets none           # only defaults vs baseline

Each run gets a fixed budget of whole iterations in a temporary folder and prints "SPS: N" (agent steps per
second over the iterations after the first, which includes warm-up); this script collects those. The baseline
(benchmark/baseline_ppo_continuous.py, CleanRL ppo_continuous_action.py style) runs at its own settings: 1 env,
2048 steps, 32 minibatches, 10 epochs, torch's default thread count, and again with one torch thread.
On a GPU, GPU utilisation (mean and peak, sampled every 0.1 s by gpu_utils.GPUMonitor) is shown per run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from throughput import machine_line  # noqa: E402

import gpu_utils  # noqa: E402

PRESET_BATCH = {"fast": 16 * 256, "heavy": 32 * 256, "beast": 64 * 512}


def run_one(label, cmd, extra_env, monitor):
    env = {**os.environ, "WANDB_MODE": "disabled", **extra_env}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.time()
        res = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.time() - start
    gpu = monitor.collect()
    match = re.search(r"^SPS: (\d+)", res.stdout, re.MULTILINE)
    if res.returncode != 0 or not match:
        print(f"{label}: failed (exit {res.returncode})\n{res.stderr[-2000:]}", file=sys.stderr)
        return None, wall, gpu
    return int(match.group(1)), wall, gpu


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--iterations", type=int, default=4, help="iterations of 2048 steps for defaults/baseline")
    parser.add_argument("--preset-iterations", type=int, default=2, help="iterations per preset run")
    parser.add_argument("--presets", nargs="+", default=["fast", "heavy", "beast"], help="or: none")
    parser.add_argument("--gpu", default="auto", help="--gpu for the preset runs (defaults run with --gpu auto)")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--extra", default="", help="extra flags for ppo_continuous.py runs, e.g. '--compile'")
    opts = parser.parse_args()

    device = gpu_utils.select_device(opts.gpu)
    print(f"machine: {machine_line()}; benchmark device: {device}")

    py, script = sys.executable, os.path.join(ROOT, "ppo_continuous.py")
    steps = opts.iterations * 2048
    common = ["--env-id", opts.env_id, "--no-progress-bar", "--checkpoint-every", "0", *opts.extra.split()]
    runs = []
    if not opts.skip_baseline:
        baseline = [py, os.path.join(HERE, "baseline_ppo_continuous.py"), "--env-id", opts.env_id]
        baseline += ["--total-timesteps", str(steps)]
        runs.append(("baseline (CleanRL-style), torch default threads", steps, baseline, {}))
        runs.append(("baseline (CleanRL-style), 1 torch thread", steps, baseline, {"OMP_NUM_THREADS": "1"}))
    runs.append(("ppo_continuous.py defaults", steps, [py, script, *common, "--total-timesteps", str(steps)], {}))
    for preset in [p for p in opts.presets if p != "none"]:
        budget = opts.preset_iterations * PRESET_BATCH[preset]
        cmd = [py, script, *common, "--preset", preset, "--gpu", opts.gpu, "--total-timesteps", str(budget)]
        runs.append((f"ppo_continuous.py --preset {preset}", budget, cmd, {}))

    rows = []
    with gpu_utils.GPUMonitor(device) as monitor:
        for label, budget, cmd, extra_env in runs:
            print(f"running: {label} ({budget} steps) ...", flush=True)
            sps, wall, gpu = run_one(label, cmd, extra_env, monitor)
            rows.append((label, budget, sps, wall, gpu))
            print(f"  SPS {sps}, wall {wall:.1f}s", flush=True)

    base = [r[2] for r in rows if r[0].startswith("baseline") and r[2]]
    best_base = max(base) if base else None
    print(f"\nenv {opts.env_id}; load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| run | steps | SPS | vs best baseline | wall s | GPU util mean / peak |")
    print("|---|---|---|---|---|---|")
    for label, budget, sps, wall, gpu in rows:
        ratio = f"{sps / best_base:.2f}x" if sps and best_base else "-"
        util = f"{gpu['gpu/util_mean']:.0f}% / {gpu['gpu/util_peak']:.0f}%" if gpu else "-"
        print(f"| {label} | {budget} | {sps if sps else 'failed'} | {ratio} | {wall:.1f} | {util} |")


if __name__ == "__main__":
    main()
