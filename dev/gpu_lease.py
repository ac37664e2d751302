"""One GPU lease, one call: every GPU check of this project, the most important first, inside 8 minutes.

    python dev/gpu_lease.py prepare                      # here: old code, wheels, flag and size checks
    source .whl/on-device.sh && python3 dev/gpu_lease.py run --out "$OUT"     # the call (CONTRIBUTING.md)
    python dev/gpu_lease.py run --dry-run --out /tmp/lease --before DIR        # here: tiny sizes on the CPU

`prepare` copies commit 7351b50's scripts (the last measured on a GPU) into .lease/before and the GPU machine's
wheels into .whl/, both git-ignored, parses every run's flags with its script's own Args, old and new, and checks
that the call carries at most 64 MiB. `run` starts the parts one after another, each a process of its own with a
time limit (past it: SIGINT, a kill 15 s later) that keeps the later parts a share of --seconds, so a part that fails
or overruns leaves the others, and time running out cuts the last runs of a part, not whole parts. Each part writes
a file under --out (a call brings back at most 8):

    facts     the GPU, the CPUs, torch, the compiler and Python's headers (torch.compile needs both)    machine.txt
    tests     pytest -m gpu: every gpu-marked test                                                       pytest_gpu.txt
    ratio     dev/ratio_rounding.py: the rollout/loss check's rounding, TF32 on/off, bf16, graphs (#63)  lease.log
    ab        new and old code, group by group, at the settings of the speed targets                    ab.md
    ceilings  VecSnake dense and fused at 2^16, 2^20, 2^22 games; the envs of each run alone             ceilings.md
    profile   dev/profile_atari.py: the update's ms per iteration, every phase of the script's code     profile_*.md
    mjx       --sim mjx (#53): worlds alone, exact and fast, the XLA flag; PPO SPS, update's share    mjx.md
    learn     only asked for (--parts learn --env-id E...): the targets, 3 seeds a task for 300 s       learn.md

then summary.md (printed last): each target with its figure and ratio; the parts' output goes to lease.log. Where
the limits come from: CONTRIBUTING.md. `mjx` keeps no time of its own: it gets what the others leave, or a second call
of its own (`--parts mjx`).
"""

from __future__ import annotations

import argparse
import functools
import glob
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from statistics import fmean, stdev

import tyro

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "benchmark"), os.path.join(ROOT, "dev")]
import speed  # noqa: E402  (Setting, run_settings, the ceilings and tables: one way to read a rate)
import speed_dev  # noqa: E402  (the old code's export)
from speed import UsageError, fmt  # noqa: E402  (its Parser turns a bad argument into one: one line, exit 2)

BEFORE_REF = "7351b50"  # the last commit measured on a GPU (two H100 leases, 2026-11-23)
BEFORE = os.path.join(ROOT, ".lease", "before")
ATARI_WHEELS = ("gymnasium", "farama_notifications", "ale_py", "tyro", "docstring_parser", "typeguard", "shtab")
CARRY_LIMIT = 64 * 2**20  # one call: tracked files, untracked files git does not ignore, carried paths
GRACE_S = 15  # after SIGINT, the seconds a part has to write what it has
TIME_UP = 75  # a part's exit status when its time cut its last runs and every other was measured
SKIPPED = "skipped: the part's time was up"  # the status of a run that its part's time cut
# (part, its output, the most seconds it may take, the seconds kept for it while the parts before it run)
PARTS = [("facts", "machine.txt", 30, 10), ("tests", "pytest_gpu.txt", 170, 60), ("ratio", "lease.log", 90, 30)]
PARTS += [("ab", "lease.log", 240, 100)]
PARTS += [("ceilings", "lease.log", 75, 45), ("profile", "lease.log", 55, 45), ("mjx", "lease.log", 240, 0)]
PARTS += [("learn", "lease.log", 400, 0)]  # a call of its own: not in the default --parts
# the rollout/loss safety net's rounding on the GPU (#63, #66): TF32 on and off, bf16, the captured update, a resume
RATIO_GPU = ["--device", "cuda", "--steps-scale", "0.25", "--only", "atari-fp32", "atari-no-tf32", "atari-amp"]
RATIO_GPU += ["atari-amp-cudagraphs", "continuous-fp32", "continuous-amp", "continuous-amp-cudagraphs", "atari-resume"]
RATIO_DRY = ["--device", "cpu", "--steps-scale", "0.001", "--only", "continuous-fp32"]
LEARN_S, LEARN_MARGIN_S = 300, 15  # each seed's wall time; after it, its last iteration and checkpoint
EVAL_S, EVAL_POINTS, EVAL_EPISODES = 30, 10, 10  # then the evaluations of its checkpoint copies: time, points, episodes
TARGETS = {"HalfCheetah-v5": 1442.64, "Hopper-v5": 2382.86}  # CleanRL's ppo_continuous_action.py: v4, 1M steps
WITHIN_S = {"HalfCheetah-v5": 60, "Hopper-v5": 180}  # #53: each seed past its target within this wall time
# the learn runs: 1,024 worlds x 8 steps, Brax's 32 minibatches x 8 epochs (CPU: both targets by 2.1M steps), and
# each minibatch step a CUDA graph: eager, six runs at once made 1,300-2,600 SPS each and Hopper only 0.4M steps in
# 300 s (gpu_h200_2026-11-26_lease3); Hopper's three alone, captured, 1.12M (gpu_h200_2026-11-27_hopper)
LEARN = "--sim mjx --preset worlds --num-envs 1024 --num-steps 8 --num-minibatches 32 --update-epochs 8".split()
LEARN += ["--gpu", "true", "--compile", "--cudagraphs"]  # after --env-id E
MJX_TINY = "--env-id InvertedPendulum-v5 --sim mjx --gpu false --num-envs 16".split()
MJX_TINY += "--num-steps 8 --minibatch-size 64 --update-epochs 1".split()  # the dry run's MJX runs
TRITON = "--xla_gpu_triton_gemm_any=true"  # MJX's performance guide: about +30% on GPUs (docs/mjx.md)
FACTS = """date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
echo "CPUs: $(nproc --all),$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"; echo "gcc: $(gcc --version | head -1)"
"$0" -c 'import os, sysconfig; h = os.path.join(sysconfig.get_paths()["include"], "Python.h"); print("Python.h:", h,
"present" if os.path.isfile(h) else "MISSING (torch.compile needs it)")'; "$0" gpu_utils.py 4"""
# the dry run on a CPU: each script's steps per iteration (log window: dqn_snake_vec.py) and tiny sizes, and the flags
# (with how many values follow) its runs leave out: the compiler takes minutes there and CUDA graphs need CUDA (the
# flag check still parses them)
TINY = {
    "ppo_atari.py": (128, "--num-steps 8 --minibatch-size 64 --update-epochs 1".split()),
    "ppo_continuous.py": (128, "--num-envs 1 --num-steps 128 --num-minibatches 2 --update-epochs 1".split()),
    "dqn_snake_vec.py": (64, "--num-envs 16 --learning-starts 32 --log-every 64 --batch-size 16".split()),
}
GPU_ONLY = {"--compile": 0, "--cudagraphs": 0, "--env-mode": 1}


def training_runs(before: str) -> dict[str, speed.Setting]:
    """The before/after runs by key, in the order they run, the targets' first: each group's new code, then its old
    (one round; a group's runs follow each other), Snake at 4,096 games dense beside fused, and 65,536 games last."""
    fast = ["--gpu", "true", "--compile", "--cudagraphs"]
    atari = speed.Setting(["ppo_atari.py", "--env-id", "ALE/Breakout-v5", *fast], 2048, 10)
    beast = speed.Setting(
        ["ppo_continuous.py", *speed.CHEETAH, "--gpu", "true", "--preset", "beast", "--subproc"], 32768, 3
    )
    runs = {"ppo_atari/after": atari, "ppo_atari/before": atari}
    fused, dense = (*fast, "--env-mode", "fused"), (*fast, "--env-mode", "dense")  # 7351b50: dense, no --env-mode
    runs |= {"dqn4096/fused": speed.snake(4096, 4, fused), "dqn4096/before": speed.snake(4096, 4, fast)}
    runs |= {"dqn4096/dense": speed.snake(4096, 4, dense), "beast/after": beast, "beast/before": beast}
    runs |= {"dqn65536/fused": speed.snake(65536, 4, fused), "dqn65536/dense": speed.snake(65536, 4, dense)}
    runs |= {"dqn65536/before": speed.snake(65536, 4, fast)}
    for key, s in runs.items():
        if key.endswith("/before"):
            runs[key] = replace(s, args=[os.path.join(before, s.args[0]), *s.args[1:]])
    return runs


def mjx_runs() -> dict[str, speed.Setting]:
    """ppo_continuous.py on HalfCheetah's MJX worlds (--preset worlds) with the update as a CUDA graph (#53): fast
    physics at 4,096 and 16,384 worlds, the learn runs' settings (LEARN: 256 minibatch steps per 8,192 env steps,
    where the update's share matters most), then the exact physics at 4,096 (65,959 SPS on the H200 of 2026-11-26).
    Each row's update share is the median of the run's charts/update_share."""
    worlds = ["ppo_continuous.py", *speed.CHEETAH, "--sim", "mjx", "--preset", "worlds", "--gpu", "true", *speed.GRAPHS]
    fast = speed.Setting([*worlds, "--physics", "fast"], 4096 * 32, 10)
    wide = speed.Setting([*fast.args, "--num-envs", "16384"], 16384 * 32, 5)
    learn = speed.Setting(["ppo_continuous.py", *speed.CHEETAH, *LEARN, "--physics", "fast"], 1024 * 8, 40)
    runs = {"mjx/fast-graphs": fast, "mjx/fast-graphs/16384": wide, "mjx/learn-fast": learn}
    return runs | {"mjx/worlds-graphs": replace(fast, args=worlds)}


def tiny(setting: speed.Setting) -> speed.Setting:
    """The dry run's CPU version of a run: --gpu false, the tiny sizes instead of its own, no GPU_ONLY flags."""
    steps, flags = TINY[os.path.basename(setting.args[0])]
    drop, args, skip = GPU_ONLY | dict.fromkeys(flags[::2], 1), [], 0
    for arg in setting.args:
        if skip or arg in drop:
            skip = skip - 1 if skip else drop[arg]
        else:
            args.append("false" if args[-1:] == ["--gpu"] else arg)
    return replace(setting, args=[*args, *flags], batch=steps, iters=2)


def check_flags(before: str) -> list[str]:
    """Parse every run's arguments with its own script's Args (tyro), the old code's and the new: a flag a script
    lacks shows here, not on the GPU machine. Returns the commands that do not parse."""
    modules, bad = {}, []
    for s in [*training_runs(before).values(), *mjx_runs().values()]:
        path = os.path.join(ROOT, s.args[0])
        if path not in modules:  # under a name of its own; its `import gpu_utils` finds the one beside it
            folder, ours = os.path.dirname(path), sys.modules.pop("gpu_utils")
            sys.path.insert(0, folder)
            try:
                name = f"lease{len(modules)}_{os.path.basename(path)[:-3]}"
                spec = importlib.util.spec_from_file_location(name, path)
                modules[path] = sys.modules[name] = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(modules[path])
            finally:
                sys.path.remove(folder)
                sys.modules["gpu_utils"] = ours
        try:
            tyro.cli(modules[path].Args, args=s.argv(1.0)[1:])
        except SystemExit:
            bad.append(s.shown(1.0))
    return bad


# ---------------------------------------------------------------- the parts


def part_ab(o) -> int:
    """Every run once, one after another; the table is rewritten after each, so a part cut off keeps what it measured.
    The dry run checks every run's flags, then runs each new script once, tiny, all at once (the runs of the same
    script differ in GPU flags and sizes, which the flag check covers)."""
    runs, info, results = training_runs(o.before), speed.machine_info(), {}
    if o.dry_run:
        bad = check_flags(o.before)
        if bad:
            print("error: flags their script lacks: " + "; ".join(bad), file=sys.stderr)
            return 2
        runs = {key: tiny(s) for key, s in runs.items()}
        new = sorted([s for key, s in runs.items() if not key.endswith("/before")], key=lambda s: len(s.args))
        fullest = list({s.args[0]: s for s in new}.values())  # each script once, at its setting with the most flags
        done = speed.run_settings(fullest, 1.0, 300)
        results = {key: done[fullest.index(s)] for key, s in runs.items() if s in fullest}
    deadline = time.monotonic() + o.seconds
    for key, s in [] if o.dry_run else runs.items():
        left = deadline - time.monotonic()
        if left < 30:  # a compiled run needs about 20 s before its first SPS
            results[key] = speed.Result(s.shown(1.0), SKIPPED)
        else:
            results[key] = speed.run_settings([s], 1.0, min(120, left - 5))[0]
        write(o, "ab", f"Before ({BEFORE_REF}) and after, same lease", info, results)
    write(o, "ab", f"Before ({BEFORE_REF}) and after, same lease", info, results)
    return part_exit(results)


def part_ceilings(o) -> int:
    """The envs alone, what the targets need first: VecSnake at 2^22 games (the 1e9 target), beast's 64 MuJoCo envs
    in subprocesses, ppo_atari's 16 Atari envs, then VecSnake at 2^20, 2^16 and 4,096
    games (dqn_snake_vec.py's target size). Dense and fused; on a CPU no fused step (its compile takes a minute)."""
    seconds, device = (0.3, "cpu") if o.dry_run else (1.5, "cuda")
    atari, mujoco = (4, 1) if o.dry_run else (16, 64)
    modes = ["dense"] if o.dry_run else ["dense", "fused"]
    big, small = ([64], [128]) if o.dry_run else ([2**16, 2**20, 2**22], [4096])

    def snake(sizes):
        return [(f"snake-{mode}/{n}", speed.snake_row(seconds, n, device, mode)) for n in sizes for mode in modes]

    measures = [*snake(big[-1:]), ("mujoco", speed.mujoco_row(seconds, mujoco, True))]
    measures += [("atari", speed.atari_row(seconds, atari))]
    deadline, info, results = time.monotonic() + o.seconds, speed.machine_info(), {}
    for key, row in measures + snake(big[-2::-1] + small):
        if deadline - time.monotonic() < 10:
            break
        results[key] = speed.ceiling(*row)
        write(o, "ceilings", "Environment ceilings, same lease", info, results)
    return part_exit(results) if results else 1


def worlds_rate(n: int, device: str, physics: str, seconds: float, env_id: str, xla_flags: str) -> float:
    """Env steps/s of n MJX worlds with random actions (speed.env_rate), in a process of its own: JAX reads XLA_FLAGS
    once, when it starts (and its compilation cache keys on them)."""
    code = "import sys, torch, mjx_envs, speed\nn, device, physics, seconds, env_id = sys.argv[1:]\n"
    code += "envs = mjx_envs.MJXVectorEnv(env_id, int(n), device=device, physics=physics)\n"
    code += "space = envs.single_action_space\n"
    code += "low, high = (torch.as_tensor(x, device=envs.device) for x in (space.low, space.high))\n"
    code += "actions = low + (high - low) * torch.rand((64, int(n), *low.shape), device=envs.device)\n"
    code += "print(speed.env_rate(envs, actions, float(seconds)))\n"
    argv = [sys.executable, "-c", code, str(n), device, physics, str(seconds), env_id]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "benchmark")])}
    env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {xla_flags}".strip()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError((done.stderr.strip() or f"exit {done.returncode}").splitlines()[-1])
    return float(done.stdout.split()[-1])


def part_mjx(o) -> int:
    """--sim mjx (#53): HalfCheetah's worlds alone, exact against fast physics at 4,096, 16,384 and 65,536 worlds,
    without and with TRITON in XLA_FLAGS, and ppo_continuous.py on them (mjx_runs), the most telling first; each row's
    wall time holds JAX's compilation. The dry run: 16 InvertedPendulum worlds on the CPU, exact, and fast with the
    flag, and one tiny learning run on them. Without the mjx extra every row says so, and the part is not a failure."""
    import mjx_envs

    if o.dry_run:
        runs = {"mjx/fast": speed.Setting(["ppo_continuous.py", *MJX_TINY, "--physics", "fast"], 128, 2)}
        order = ["mjx-env/16", "mjx/fast", "mjx-env/16/fast/triton"]
    else:  # mjx-env/<worlds>[/fast][/triton]: a ceiling; the others, runs
        runs, exact, fast = mjx_runs(), ["mjx-env/4096", "mjx-env/16384"], ["mjx-env/4096/fast", "mjx-env/16384/fast"]
        order = [exact[0], fast[0], "mjx/fast-graphs", "mjx/learn-fast", exact[1], fast[1], "mjx/fast-graphs/16384"]
        order += [f"{key}/triton" for key in fast + exact]
        order += ["mjx-env/65536/fast", "mjx-env/65536", "mjx-env/65536/fast/triton", "mjx-env/65536/triton"]
        order.append("mjx/worlds-graphs")
    deadline, info, results = time.monotonic() + o.seconds, speed.machine_info(), {}
    missing = mjx_envs.missing_extra()
    seconds, device, env_id = (0.3, "cpu", "InvertedPendulum-v5") if o.dry_run else (1.5, "cuda", "HalfCheetah-v5")
    for key in order:
        left = deadline - time.monotonic()
        physics, flags = "fast" if "/fast" in key else "exact", TRITON if "/triton" in key else ""
        n = 0 if key in runs else int(key.split("/")[1])
        what = runs[key].shown(1.0) if key in runs else f"ceiling: MJX {env_id}, {n:,} worlds, {device}, {physics}"
        what += f", XLA_FLAGS={flags}" if flags else ""
        if missing:
            results[key] = speed.Result(what, f"skipped: {missing}")
        elif left < 30:  # a compilation alone takes longer
            results[key] = speed.Result(what, SKIPPED)
        elif key in runs:
            results[key] = speed.run_settings([runs[key]], 1.0, min(150, left - 5))[0]
        else:
            rate = functools.partial(worlds_rate, n, device, physics, seconds, env_id, flags)
            results[key] = speed.ceiling(what, "env steps/s", rate)
        write(o, "mjx", "--sim mjx: MJX worlds alone, exact and fast physics, PPO on them, same lease", info, results)
    return 0 if missing else part_exit(results)


def part_learn(o) -> int:
    """#53's learning targets: seeds 1-3 of ppo_continuous.py with LEARN on each --env-id, all at once on the GPU, each
    sent SIGTERM at LEARN_S s of wall time (it checkpoints, logs and ends; constant learning rate: no step budget ends
    it). Each run's checkpoint (every 2 iterations) is copied as it changes; then EVAL_POINTS of the copies, the last
    included, are evaluated on gymnasium's own env (--eval-checkpoint on the CPU: EVAL_EPISODES episodes, the mean
    actions). The returns a run logs lag its policy by a whole episode of every world: 4.1M steps at 4,096 worlds.
    learn.md: each seed's evaluated return against TARGETS, met if past it within WITHIN_S; learn_curve.csv: every
    evaluation; learn_events.tar.gz: the runs' event files (a call brings back 8 files). Dry run: MJX_TINY, no target,
    the runs stopped once each has 3 copies."""
    tasks = ["InvertedPendulum-v5"] if o.dry_run else o.env_id
    budget = min(LEARN_S, o.seconds - LEARN_MARGIN_S - EVAL_S)
    runs = {}  # (env id, seed): (its folder, its process)
    for env_id in tasks:
        for seed in (1, 2, 3):  # in this part's process group: its limit stops them too
            argv = [sys.executable, os.path.join(ROOT, "ppo_continuous.py")]
            argv += MJX_TINY if o.dry_run else ["--env-id", env_id, *LEARN]
            argv += ["--physics", o.physics]
            argv += ["--seed", str(seed), "--total-timesteps", str(10**9), "--no-anneal-lr"]  # the wall time ends it
            argv += ["--checkpoint-every", "2", "--no-progress-bar"]
            folder = os.path.join(o.work, f"{env_id}-{seed}")
            os.makedirs(folder)
            runs[env_id, seed] = folder, subprocess.Popen(argv, cwd=folder)
    start = time.time()
    copies = {key: [] for key in runs}  # each run's checkpoint copies: (path, s since the start)
    n = 3 if o.dry_run else EVAL_POINTS  # the last copy and every k-th before it: at most n
    while time.time() < start + budget and any(proc.poll() is None for _, proc in runs.values()):
        for key, (folder, _) in runs.items():
            copy_checkpoint(folder, copies[key], start)
        if o.dry_run and min(map(len, copies.values())) >= n:  # the dry run checks the path, not the learning
            break
        time.sleep(1)
    for _, proc in runs.values():
        proc.send_signal(signal.SIGTERM)  # nothing for a run that has ended
    for _, proc in runs.values():
        try:
            proc.wait(LEARN_MARGIN_S - 5)
        except subprocess.TimeoutExpired:
            proc.kill()
    for key, (folder, _) in runs.items():
        copy_checkpoint(folder, copies[key], start)  # the one written at the SIGTERM
    picked = {key: taken[::-1][:: max(1, math.ceil(len(taken) / n))][::-1] for key, taken in copies.items()}
    curve = evaluations({path: when for taken in picked.values() for path, when in taken})
    points = {key: [curve[path] for path, _ in taken if curve[path][2] is not None] for key, taken in picked.items()}
    rows, csv, summary = [], ["env_id,seed,wall_s,global_step,eval_return"], []
    for env_id in tasks:
        target, done = None if o.dry_run else TARGETS[env_id], []
        for seed in (1, 2, 3):
            csv += [f"{env_id},{seed},{when:.1f},{step},{ret:.2f}" for when, step, ret in points[env_id, seed]]
            figures = learned(points[env_id, seed], target)
            # figures[5]: the wall time of the first evaluation past the target
            in_time = target is not None and figures[5] is not None and figures[5] <= WITHIN_S[env_id]
            met = speed.DASH if target is None else "yes" if in_time else "no"
            cells = [fmt(x, 1 if i == 3 else 0) for i, x in enumerate(figures)]
            folder, proc = runs[env_id, seed]
            names = [os.path.basename(run) for run in glob.glob(os.path.join(folder, "runs", "*"))]
            name = names[0] if names else f"no run folder (exit {proc.returncode})"
            rows.append([f"{env_id} seed {seed}", name, *cells, met])
            done += [figures] if figures[3] is not None else []
        spread = [f"{fmt(fmean(c), d)} ± {fmt(stdev(c) if c[1:] else 0, d)}" for c, d in zip(zip(*done), (0, 0, 0, 1))]
        met = speed.DASH if target is None else "yes" if done and fmean(f[3] for f in done) >= target else "no"
        rows.append([f"{env_id} mean ± std", f"{len(done)} seeds", *(spread or [speed.DASH] * 4), "-", "-", met])
        goal = "none (dry run)"
        if target is not None:
            goal = f">= {fmt(target, 2)} (CleanRL, v4, 1M steps) within {WITHIN_S[env_id]} s"
        for r in rows[-4:]:  # the seeds' rows and their mean
            label = f"{env_id}, {budget:.0f} s: {r[0].removeprefix(env_id + ' ')}"
            summary.append([label, f"{r[5]} eval return", goal, "-", r[-1], "-", "-"])
    with open(os.path.join(o.out, "learn_curve.csv"), "w") as f:
        f.write("\n".join(csv) + "\n")
    with tarfile.open(os.path.join(o.out, "learn_events.tar.gz"), "w:gz") as tar:
        for file in glob.glob(os.path.join(o.work, "*", "runs", "*", "events.out.tfevents*")):
            tar.add(file, os.path.join(*file.split(os.sep)[-2:]))  # <run>/<event file>
    header = ["", "run", "steps", "wall s", "SPS (steps / wall s)", "eval return", "past target at step", "at s", "met"]
    note = f"each run's checkpoint evaluated on gymnasium's env ({EVAL_EPISODES} episodes, mean actions) at up to "
    within = ", ".join(f"{task} {s} s" for task, s in WITHIN_S.items())
    note += f"{EVAL_POINTS} points; met: an evaluation passed the target within the task's time ({within})"
    command = shlex.join([*(MJX_TINY if o.dry_run else ["--env-id", "E", *LEARN]), "--physics", o.physics])
    title = f"`ppo_continuous.py {command}`, E = {', '.join(tasks)}: seeds 1, 2, 3 at once, {budget:.0f} s each"
    with open(os.path.join(o.out, "learn.md"), "w") as f:
        f.write(speed.document(title, speed.machine_info(), note, speed.md_table(header, rows)))
    with open(os.path.join(o.work, "learn.json"), "w") as f:
        json.dump(summary, f)
    return 0 if all(points.values()) else 1  # every run has an evaluated checkpoint


def copy_checkpoint(folder: str, taken: list, start: float) -> None:
    """Copy the checkpoint of the run in ``folder`` into it when it is newer than the last copy in ``taken``, and add
    the copy (path, s since ``start``) to ``taken``."""
    for ckpt in glob.glob(os.path.join(folder, "runs", "*", "checkpoint.pt")):  # written whole, then renamed
        when = os.path.getmtime(ckpt) - start
        if not taken or when > taken[-1][1]:
            taken.append((os.path.join(folder, f"copy{len(taken)}.pt"), when))
            shutil.copy(ckpt, taken[-1][0])


def evaluations(copies: dict[str, float]) -> dict[str, tuple]:
    """Each checkpoint copy (path: s since the start) as (s, global step, mean return over EVAL_EPISODES episodes of
    gymnasium's env or None), from ppo_continuous.py --eval-checkpoint on the CPU, one process per core."""
    import run_utils

    deadline = time.time() + EVAL_S

    def evaluate(path: str) -> tuple:
        argv = [sys.executable, os.path.join(ROOT, "ppo_continuous.py"), "--eval-checkpoint", path, "--gpu", "false"]
        argv += ["--eval-episodes", str(EVAL_EPISODES)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        try:
            out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=deadline - time.time()).stdout
        except (subprocess.TimeoutExpired, ValueError):  # ValueError: the deadline has passed
            out = ""
        found = re.search(r"mean return (-?[\d.]+) \+-", out)
        step = run_utils.read_checkpoint(path)["global_step"]
        return copies[path], step, float(found[1]) if found else None

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return dict(zip(copies, pool.map(evaluate, copies)))


def learned(points: list[tuple], target: float | None) -> list:
    """A run's [steps, wall s, SPS, evaluated return, the step and s of the first evaluation past ``target``] at its
    last evaluated point (Nones without one); ``points``: (s, step, return) in time order."""
    if not points:
        return [None] * 6
    when, step, ret = points[-1]
    passed = [(at_step, at) for at, at_step, value in points if target is not None and value >= target]
    return [step, when, step / when, ret, *(passed[0] if passed else (None, None))]


def write(o, name: str, title: str, info: dict, results: dict[str, speed.Result]) -> None:
    """The part's table (name.md under --out) and its figures for the summary in --work: each run's rate
    (name.json) and the GPU's mean busy share while it ran (name_util.json)."""
    note = "dry run: tiny sizes on the CPU, without --compile, --cudagraphs, --env-mode" if o.dry_run else ""
    table = [*speed.results_table(list(results.values())), *speed.failures(list(results.values()))]
    with open(os.path.join(o.out, f"{name}.md"), "w") as f:
        f.write(speed.document(title, info, note, table))
    with open(os.path.join(o.work, f"{name}.json"), "w") as f:
        json.dump({key: r.sps if r.ok else None for key, r in results.items()}, f)
    with open(os.path.join(o.work, f"{name}_util.json"), "w") as f:
        json.dump({key: r.util_mean for key, r in results.items() if r.ok}, f)


# ---------------------------------------------------------------- the call


def part_exit(results: dict[str, speed.Result]) -> int:
    """A part's exit status: 0 when every run was measured, TIME_UP when the part's time cut the last ones and every
    other was measured, else 1."""
    if all(r.ok for r in results.values()):
        return 0
    return TIME_UP if all(r.ok or r.status == SKIPPED for r in results.values()) else 1


def run_part(name: str, argv: list[str], limit: float, output: str) -> str:
    """One part in a process group of its own, its output appended to ``output``; past ``limit`` seconds it gets
    SIGINT (pytest prints its summary, the speed runs get SIGTERM and the tables are written), GRACE_S later SIGKILL."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:  # else the part inherits it ignored (a background job)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    with open(output, "a") as out:
        out.write(f"===== {name}, at most {limit:.0f} s: {shlex.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return f"cut off at its limit of {limit:.0f} s"
    if rc == TIME_UP:
        return "ok, the last runs skipped: the part's time was up"
    return "ok" if rc == 0 else f"failed (exit {rc})"


def cmd_run(o) -> int:
    start = time.monotonic()
    o.out, o.before = os.path.abspath(o.out), os.path.abspath(o.before)  # the parts run in the repository's root
    if "ab" in o.parts and not os.path.isfile(os.path.join(o.before, "REF")):  # the one part that runs the old code
        raise UsageError(f"no old code in {o.before}: run `python dev/gpu_lease.py prepare` here and carry .lease")
    os.makedirs(o.out, exist_ok=True)
    os.environ.update(WANDB_MODE="offline", PYTHONUNBUFFERED="1", MUJOCO_GL=os.environ.get("MUJOCO_GL", "disable"))
    if o.dry_run:  # one thread per process: on a busy CPU, OpenMP's spinning workers only burn time
        os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    work = tempfile.mkdtemp(prefix="gpu_lease_")
    me = [sys.executable, os.path.abspath(__file__), "part", "--out", o.out, "--work", work, "--before", o.before]
    me += ["--dry-run"] if o.dry_run else []
    # the dry run collects one test file (the whole suite's collection takes a CPU long, and CI collects it anyway)
    tests = ["-p", "no:cacheprovider", "-v", "-n", "0" if o.dry_run else "12"]  # -v: a test its limit cut is named
    tests.append("tests/test_cuda_graph.py" if o.dry_run else "tests")
    profile = "--gpu true --steps 150"
    if o.dry_run:
        profile = "--gpu false --no-compile --num-envs 2 --num-steps 8 --minibatch-size 8 --steps 12 --iterations 2"
    commands = {
        "facts": ["bash", "-c", FACTS, sys.executable],
        "tests": [sys.executable, "-m", "pytest", "-m", "gpu", "--dist", "load", *tests],
        "ratio": [sys.executable, "dev/ratio_rounding.py", *(RATIO_DRY if o.dry_run else RATIO_GPU)],  # to lease.log
        "ab": [*me, "ab"],
        "mjx": [*me, "mjx"],
        "learn": [*me, "learn", "--physics", o.physics, "--env-id", *o.env_id],
        "ceilings": [*me, "ceilings"],
        "profile": [sys.executable, "dev/profile_atari.py", *profile.split(), "--out", o.out],
    }
    statuses, parts = [], [part for part in PARTS if part[0] in o.parts]
    for i, (name, output, cap, _) in enumerate(parts):
        kept = sum(floor for *_, floor in parts[i + 1 :]) + 5  # for the parts after it, and 5 s for the summary
        limit = min(cap, o.seconds - (time.monotonic() - start) - kept)
        if limit < 15:
            statuses.append([name, "skipped: the call's time was up", "0", "-"])
            continue
        timed = name in ("ab", "ceilings", "mjx", "learn", "ratio")  # the parts that keep to --seconds
        argv = commands[name] + (["--seconds", f"{limit - GRACE_S:.0f}"] if timed else [])
        print(f"[lease] {name}: at most {limit:.0f} s ...", flush=True)
        t0 = time.monotonic()
        status = run_part(name, argv, limit, os.path.join(o.out, output))
        statuses.append([name, status, f"{time.monotonic() - t0:.0f}", f"{limit:.0f}"])
        print(f"[lease] {name}: {status}, {statuses[-1][2]} s", flush=True)
    text = summary(o, work, statuses, time.monotonic() - start)
    shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(o.out, "summary.md"), "w") as f:
        f.write(text)
    print("\n" + text, end="")
    return 0 if all(status.startswith("ok") for _, status, _, _ in statuses) else 1


def profiled_update(out: str) -> tuple[str, float | None]:
    """profile_atari.py's update row: the one of --compile --cudagraphs (on a GPU), else its first (eager, on a CPU).
    Returns (phase, ms per iteration)."""
    for name in ("profile_atari_cuda.md", "profile_atari_cpu.md"):
        if os.path.isfile(os.path.join(out, name)):
            with open(os.path.join(out, name)) as f:
                rows = re.findall(r"^\| (update \([^|]*?) \| ([\d.]+) \|", f.read(), re.M)
            if rows:
                phase, ms = next((row for row in rows if "--cudagraphs" in row[0]), rows[0])
                return phase, float(ms)
    return "update (not profiled)", None


def summary(o, work: str, statuses: list[list[str]], wall: float) -> str:
    """Each speed target beside its figure and their ratio (>= 1 meets it), the share of the env's own rate it
    reached and the old code's figure; then every new run against its group's old one, and each part's status."""
    ab, env = {}, {}
    for figures, name in ((ab, "ab"), (env, "ceilings"), (ab, "mjx")):
        if os.path.isfile(os.path.join(work, f"{name}.json")):
            with open(os.path.join(work, f"{name}.json")) as f:
                figures.update(json.load(f))
    env |= {key: rate for key, rate in ab.items() if key.startswith("mjx-env/")}  # the mjx part's ceilings
    snakes = {key: rate for key, rate in env.items() if key.startswith("snake-") and rate}
    busy = {}  # the mjx part's runs: the GPU's mean utilisation, % (write's mjx_util.json)
    if os.path.isfile(os.path.join(work, "mjx_util.json")):
        with open(os.path.join(work, "mjx_util.json")) as f:
            busy = json.load(f)
    best = max(snakes, key=snakes.get, default="none")
    phase, ms = profiled_update(o.out)

    def old(key: str) -> float | None:  # its group's old-code run (7351b50 has only dense Snake)
        return ab.get(key.split("/")[0] + "/before")

    def row(figure, key, target, goal, env_rate=None, measured=None, unit="SPS"):
        """goal: the target's number (an ms figure meets it from below, a rate from above)."""
        measured = measured or ab.get(key)
        if not measured:
            return [figure, "not measured", target, *[speed.DASH] * 4]
        ratio = goal / measured if unit.startswith("ms") else measured / goal
        shown = f"{fmt(measured, 1 if unit.startswith('ms') else 0)} {unit}"
        of_env = f"{measured / env_rate:.0%}" if env_rate else speed.DASH
        vs_old = f"{measured / old(key):.2f}x" if old(key) else speed.DASH
        return [figure, shown, target, f"{ratio:.2f}", "yes" if ratio >= 1 else "no", of_env, vs_old]

    atari, dqn = "ppo_atari.py --compile --cudagraphs", "dqn_snake_vec.py --compile --cudagraphs, 4,096 games"
    worlds = "ppo_continuous.py --sim mjx --preset worlds --compile --cudagraphs, HalfCheetah"
    ten_k, one_m, mujoco = ">= 10,000 SPS", ">= 1,000,000 SPS", env.get("mujoco")
    beast = f">= 20,000 SPS or >= 90% of the MuJoCo ceiling ({fmt(mujoco)})"
    beast_goal = min(20_000, 0.9 * mujoco) if mujoco else 20_000  # meeting either target meets it
    # #53's: the worlds alone, fast, with or without the XLA flag; PPO on >= 4,096 worlds with the GPU >= 70% busy
    alone = "MJX HalfCheetah worlds alone, 16,384 fast worlds (best of with and without the XLA flag)"
    fastest_worlds = max(env.get("mjx-env/16384/fast") or 0, env.get("mjx-env/16384/fast/triton") or 0)
    ppo_mjx, pct = ">= 250,000 SPS", "% busy"
    rows = [
        row(atari, "ppo_atari/after", ten_k, 1e4, env.get("atari")),
        row(f"PPO {phase}", "", "<= 25 ms / iteration", 25, measured=ms, unit="ms / iteration"),
        row("ppo_continuous.py --preset beast --subproc", "beast/after", beast, beast_goal, mujoco),
        row(f"VecSnake, best ceiling ({best})", "", ">= 1e9", 1e9, measured=snakes.get(best), unit="env steps/s"),
        row(f"{dqn}, fused", "dqn4096/fused", one_m, 1e6, env.get("snake-fused/4096")),
        row(f"{dqn}, dense", "dqn4096/dense", one_m, 1e6, env.get("snake-dense/4096")),
        row(alone, "", ">= 500,000 env steps/s", 5e5, measured=fastest_worlds, unit="env steps/s"),
        row(f"{worlds}, 4,096 worlds", "mjx/worlds-graphs", ppo_mjx, 2.5e5, env.get("mjx-env/4096")),
        row(f"{worlds}, 4,096 fast worlds", "mjx/fast-graphs", ppo_mjx, 2.5e5, env.get("mjx-env/4096/fast")),
        row(f"{worlds}, 16,384 fast worlds", "mjx/fast-graphs/16384", ppo_mjx, 2.5e5, env.get("mjx-env/16384/fast")),
        row(f"{worlds}, 4,096 fast worlds: GPU busy", "", ">= 70%", 70, measured=busy.get("mjx/fast-graphs"), unit=pct),
    ]
    if os.path.isfile(os.path.join(work, "learn.json")):  # the learn part's rows
        with open(os.path.join(work, "learn.json")) as f:
            rows += json.load(f)
    changes = [[key, f"{sps / old(key):.2f}x"] for key, sps in ab.items() if "before" not in key and sps and old(key)]
    dry = " (dry run: tiny sizes on the CPU, the figures mean nothing)" if o.dry_run else ""
    header = "figure | measured | target | ratio (>= 1 meets it) | met | of the env's own rate | after / before"
    took = f"the parts took {wall:.0f} s of {o.seconds:.0f}"
    lines = [f"# GPU lease: summary{dry}", "", f"- GPU: {speed.machine_info()['GPU']}; CPUs: {os.cpu_count()}; {took}"]
    lines += ["", *speed.md_table(header.split(" | "), rows), ""]
    lines += [*speed.md_table(["run (ab.md)", f"after / before ({BEFORE_REF})"], changes), ""]
    return "\n".join([*lines, *speed.md_table(["part", "status", "seconds", "limit s"], statuses)]) + "\n"


# ---------------------------------------------------------------- here, before the call


def wheels_for(names: list[str], atari_only: bool) -> list[str]:
    """The kit's wheels a call carries: all of them, or only ppo_atari.py's (a training call carrying a run)."""
    return sorted(name for name in names if not atari_only or name.split("-")[0] in ATARI_WHEELS)


def cmd_prepare(o) -> int:
    commit = speed_dev.resolve_commit(o.ref)
    if not commit:
        raise UsageError(f"'{o.ref}' is not a commit here (the old code needs this checkout's history)")
    if not os.path.isdir(os.path.join(o.kit, "wheels")):
        raise UsageError(f"no wheel kit at {o.kit} (its folder holds wheels/ and on-device.sh; give it with --kit)")
    shutil.rmtree(BEFORE, ignore_errors=True)
    speed_dev.export_before(commit, BEFORE)
    wheels = os.path.join(ROOT, ".whl")
    shutil.rmtree(wheels, ignore_errors=True)
    os.makedirs(wheels)
    for name in wheels_for(os.listdir(os.path.join(o.kit, "wheels")), o.atari_only):
        shutil.copy(os.path.join(o.kit, "wheels", name), wheels)
    shutil.copy(os.path.join(o.kit, "on-device.sh"), wheels)
    git = ["git", "-C", ROOT]  # .whl and .lease are in .gitignore: what the call carries never enters a commit
    files = subprocess.check_output([*git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"], text=True)
    files = [os.path.join(ROOT, f) for f in files.split("\0") if f]
    carry = [".whl", ".lease", *o.carry]
    for path in carry:
        files += [os.path.join(folder, f) for folder, _, names in os.walk(os.path.join(ROOT, path)) for f in names]
    carried = sum(os.path.getsize(f) for f in files if os.path.isfile(f))
    print(
        f"prepare: {commit}'s scripts in .lease/before, {len(os.listdir(wheels)) - 1} wheels in .whl/; the call "
        f"carries {carried / 2**20:.1f} MiB of {CARRY_LIMIT / 2**20:.0f} MiB, with {' '.join(carry)}"
    )
    if carried > CARRY_LIMIT:
        raise UsageError(f"the call would carry {carried / 2**20:.1f} MiB, over {CARRY_LIMIT / 2**20:.0f} MiB")
    bad = check_flags(BEFORE)
    if bad:
        raise UsageError("flags their script lacks: " + "; ".join(bad))
    print("prepare: every run's flags parse with its script's Args, the old code's and the new")
    return 0


@speed.sweep.one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = speed.Parser(prog="gpu_lease.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True, parser_class=speed.Parser)
    pre = sub.add_parser("prepare", help="here, before the call: the old code, the wheels, flag and size checks")
    pre.add_argument("--ref", default=BEFORE_REF, help="the old code's commit")
    pre.add_argument("--kit", default=os.path.join(ROOT, "..", "shared", "gpu"), help="the wheel kit's folder")
    pre.add_argument("--atari-only", action="store_true", help="only the wheels ppo_atari.py needs (a training call)")
    pre.add_argument("--carry", nargs="*", default=[], help="more paths the call carries (a run: runs/<run>)")
    run = sub.add_parser("run", help="on the GPU machine: the parts, inside --seconds")
    names = [name for name, *_ in PARTS]
    run.add_argument("--parts", nargs="+", choices=names, default=names[:-1], help="only these; learn only when named")
    part = sub.add_parser("part", help="one part (run starts them)")
    part.add_argument("name", choices=["ab", "ceilings", "mjx", "learn"])
    part.add_argument("--work", required=True, help="the folder of the figures the summary reads")
    for sp in (run, part):
        sp.add_argument("--out", required=True, help="the folder of the files that come back ($OUT)")
        sp.add_argument("--before", default=BEFORE, help="the old code's folder (prepare writes it)")
        sp.add_argument("--seconds", type=float, default=450, help="the time of all parts (of the part, for part)")
        sp.add_argument("--env-id", nargs="+", choices=[*TARGETS], default=["HalfCheetah-v5"], help="learn's tasks")
        sp.add_argument("--physics", choices=["exact", "fast"], default="fast", help="learn's MJX worlds (#53)")
        sp.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, to check every command")
    o = p.parse_args(argv)
    if o.mode == "prepare":
        return cmd_prepare(o)
    parts = {"ab": part_ab, "ceilings": part_ceilings, "mjx": part_mjx, "learn": part_learn}
    return cmd_run(o) if o.mode == "run" else parts[o.name](o)


if __name__ == "__main__":
    sys.exit(main())
