"""Our PPO scripts against CleanRL's own, unmodified, at CleanRL's settings: runs alternating round by round, each
side's wall SPS (process start to exit) and steady SPS, their ratios, and each side's share of its env's own rate.

    python benchmark/cleanrl_compare.py                               # both tasks, 2 rounds, 40,960 steps a run
    python benchmark/cleanrl_compare.py --task continuous --repeats 3 --out cmp.md
    taskset -c 1 python benchmark/cleanrl_compare.py --steps 8192 --repeats 1   # a smoke run on one core
    python benchmark/cleanrl_compare.py --task atari -- --no-overlap-envs    # after --: flags for our script

The settings are CleanRL's defaults. continuous: ppo_continuous.py on HalfCheetah-v5 against ppo_continuous_action.py
on HalfCheetah-v4 (1 env x 2,048 steps, 32 minibatches, 10 epochs: our defaults too); atari: ppo_atari.py on
ALE/Breakout-v5 against CleanRL's ppo_atari.py on BreakoutNoFrameskip-v4 (8 envs x 128 steps, 4 minibatches, 4
epochs). Each run starts in a temporary folder of its own (its runs/ goes there, removed after), with WANDB_MODE
disabled; the odd rounds start ours first, the even rounds CleanRL's.

- wall SPS: the steps done over the wall time from the process's start to its exit (imports, env setup and the first
  iteration included); the table gives the best and the median over the rounds, and ours / CleanRL's of each.
- steady SPS: the median over iterations 2, 3, ... of the steps of an iteration over the time between two
  consecutive per-iteration scalars (charts/learning_rate) in the run's event file, the same for both scripts.
  (CleanRL's own charts/SPS is the mean since its start, the first iteration included, so it is not read.)
- env rate: each side's env stack as its script builds it, stepped alone with random actions for --env-seconds in a
  subprocess of that side's Python: ours continuous_envs.HostEnvs over ppo_continuous.make_env (the clipping and
  normalisation that CleanRL's wrappers do, vectorised, with the actions and results as torch tensors on the CPU)
  and ppo_atari.make_envs (ale_py's AtariVectorEnv, as many threads as CPUs
  here, at most one per env); CleanRL's the make_env thunks of its own scripts in a gymnasium SyncVectorEnv. A side's
  share is its steady SPS over its env rate. For continuous the raw HalfCheetah (gym.make, no wrappers) is stepped
  too, v4 and v5 in our venv and v4 in CleanRL's: v4 against v5 is fair when those rates agree.

Setup of the CleanRL side (outside this repository, nothing of CleanRL's is kept here). CleanRL's scripts use
gymnasium 0.29's API (gymnasium.wrappers.TransformObservation's old signature, FrameStack, final_info), which has no
v5 MuJoCo envs; ale-py 0.8.1 with shimmy registers BreakoutNoFrameskip-v4 there, and its ROMs are imported from a
later ale-py wheel (which bundles them):

    git clone https://github.com/vwxyzjn/cleanrl /tmp/cleanrl-src      # or any copy of the repository
    mkdir -p /work/cleanrl/cleanrl_utils && cd /tmp/cleanrl-src
    cp cleanrl/ppo_continuous_action.py cleanrl/ppo_atari.py /work/cleanrl/
    cp cleanrl_utils/atari_wrappers.py /work/cleanrl/cleanrl_utils/ && touch /work/cleanrl/cleanrl_utils/__init__.py
    git rev-parse HEAD > /work/cleanrl/COMMIT                          # the table names it
    python3 -m venv /work/cleanrl-venv && /work/cleanrl-venv/bin/pip install torch==2.13.0   # the CPU wheel
    /work/cleanrl-venv/bin/pip install "gymnasium[mujoco]==0.29.1" "numpy<2" tyro tensorboard ale-py==0.8.1 \\
        shimmy==1.3.0 opencv-python-headless torch==2.13.0
    pip download --no-deps -d /tmp/ale ale-py==0.9.0 && unzip -q /tmp/ale/*.whl 'ale_py/roms/*' -d /tmp/ale
    /work/cleanrl-venv/bin/ale-import-roms /tmp/ale/ale_py/roms

--cleanrl-dir (or CLEANRL_DIR) and --cleanrl-python (or CLEANRL_PYTHON) point elsewhere. Compare on one quiet
machine only: a second process on the same cores moves single runs by 10-25% (docs/performance.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import report  # noqa: E402  (the one reader of event files)
from report import DASH, fmt, md_table  # noqa: E402
from sweep import Parser, SweepError, count, one_line_errors  # noqa: E402  (one-line errors, as the other tools)

DEFAULT_DIR, DEFAULT_PYTHON = "/work/cleanrl", "/work/cleanrl-venv/bin/python"
SIDES = ("ours", "CleanRL")
ITERATION_TAG = "charts/learning_rate"  # logged once per iteration by both sides' scripts, the first included
VERSIONS = "import json, sys\n" + "\n".join(
    f"try:\n    import {m}; v['{m}'] = {m}.__version__\nexcept Exception as e:\n    v['{m}'] = 'missing'"
    for m in ("torch", "gymnasium", "numpy", "mujoco", "ale_py")
)
VERSIONS = "v = {}\n" + VERSIONS + "\nv['python'] = sys.version.split()[0]\nprint(json.dumps(v))"


@dataclass
class Task:
    """One comparison: our script and CleanRL's at the same batch, minibatches and epochs."""

    name: str
    batch: int  # steps per iteration
    ours: list[str]  # the script (relative to ROOT) and its arguments, without the step budget
    theirs: list[str]  # the script (relative to the CleanRL folder) and its arguments, without the step budget
    our_env: str
    their_env: str
    num_envs: int


def tasks(our_env: str | None, their_env: str | None) -> dict[str, Task]:
    cheetah, cheetah4 = our_env or "HalfCheetah-v5", their_env or "HalfCheetah-v4"
    breakout, breakout4 = our_env or "ALE/Breakout-v5", their_env or "BreakoutNoFrameskip-v4"
    quiet = ["--no-progress-bar", "--checkpoint-every", "0"]  # 0: one checkpoint, at the end
    off = ["--no-capture-video", "--no-track"]
    atari = ["--num-envs", "8", "--num-steps", "128", "--num-minibatches", "4", "--update-epochs", "4"]
    return {
        "continuous": Task(
            "continuous",
            2048,
            ["ppo_continuous.py", "--env-id", cheetah, *quiet],
            ["ppo_continuous_action.py", "--env-id", cheetah4, *off, "--no-save-model"],
            cheetah,
            cheetah4,
            1,
        ),
        "atari": Task(
            "atari",
            1024,
            ["ppo_atari.py", "--env-id", breakout, *atari, *quiet],
            ["ppo_atari.py", "--env-id", breakout4, *atari, *off],
            breakout,
            breakout4,
            8,
        ),
    }


@dataclass
class Run:
    side: str
    command: list[str]
    wall: float | None = None
    steps: int | None = None
    steady: float | None = None  # median steady SPS (event times)
    logged: float | None = None  # the median of the run's own charts/SPS (ours: per iteration; CleanRL's: cumulative)
    status: str = "ok"
    tail: str = ""

    @property
    def wall_sps(self) -> float | None:
        return self.steps / self.wall if self.ok else None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.wall is not None and bool(self.steps)


@dataclass
class Side:
    runs: list[Run] = field(default_factory=list)
    env_rate: float | None = None
    env_what: str = ""


def round_order(round_number: int) -> tuple[str, str]:
    """Which side starts first in round ``round_number`` (1-based): ours in odd rounds, CleanRL's in even ones."""
    return SIDES if round_number % 2 == 1 else SIDES[::-1]


def median_or_none(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summary(ours: list[float | None], theirs: list[float | None]) -> dict[str, float | None]:
    """Best and median of each side's rates (failed runs: None, left out) and ours / CleanRL's of each."""
    best = [max((v for v in side if v is not None), default=None) for side in (ours, theirs)]
    med = [median_or_none(side) for side in (ours, theirs)]
    return {
        "ours_best": best[0],
        "theirs_best": best[1],
        "ours_median": med[0],
        "theirs_median": med[1],
        "ratio_best": ratio(*best),
        "ratio_median": ratio(*med),
    }


def steady_sps(folder: str, tag: str = ITERATION_TAG) -> tuple[float | None, float | None]:
    """(steady SPS, the median of charts/SPS) of the run under ``folder``: the steady SPS is the median over
    iterations 2, 3, ... of (steps between two consecutive ``tag`` events) / (their wall times' difference)."""
    events: dict[int, float] = {}
    logged: list[float] = []
    for path, _, files in os.walk(folder):
        for file in sorted(f for f in files if f.startswith("events.out.tfevents")):
            scalars = report.read_event_file(os.path.join(path, file))[0]
            events.update((step, wall) for step, wall, _ in scalars.get(tag, []))
            logged += [value for _, _, value in scalars.get(report.SPS_TAG, [])]
    steps = sorted(events)
    rates = [(b - a) / (events[b] - events[a]) for a, b in zip(steps, steps[1:]) if events[b] > events[a]]
    return median_or_none(rates), median_or_none(logged)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the run's process group, SIGKILL 30 s later if it still runs."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_once(side: str, command: list[str], batch: int, total: int, timeout: float) -> Run:
    """``command`` in a fresh temporary folder: its wall time from the start of the process to its exit, and what
    its event files under runs/ say."""
    run = Run(side, command)
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="cleanrl_compare_", ignore_cleanup_errors=True) as tmp:
        log_path = os.path.join(tmp, "log")
        with open(log_path, "w") as log:
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                command, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    run.status = f"timed out after {timeout:.0f} s"
                    stop(proc)
            except BaseException:  # a Ctrl-C: the run has a session of its own
                stop(proc)
                raise
            wall = time.perf_counter() - t0
        lines = [line.rstrip() for line in Path(log_path).read_text(errors="replace").splitlines() if line.strip()]
        if run.status == "ok" and proc.returncode:
            run.status = f"failed (exit {proc.returncode})"
        if run.status == "ok":
            run.wall, run.steps = wall, total // batch * batch
            run.steady, run.logged = steady_sps(os.path.join(tmp, "runs"))
            if run.steady is None:
                run.status = "no per-iteration scalars logged (fewer than two iterations?)"
        run.tail = "" if run.ok else "\n".join(lines[-8:])
    return run


ENV_PROBE = r"""
import importlib.util, json, os, sys, time
import numpy as np
kind, env_id, n, seconds, where = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
import gymnasium as gym
if kind == "raw":
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(n)])
elif kind == "cleanrl":
    script = "ppo_continuous_action.py" if where.endswith("continuous") else "ppo_atari.py"
    folder = where.rsplit(":", 1)[0]
    sys.path.insert(0, folder)  # cleanrl_utils
    spec = importlib.util.spec_from_file_location("cleanrl_script", os.path.join(folder, script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    extra = (0.99,) if script == "ppo_continuous_action.py" else ()
    envs = gym.vector.SyncVectorEnv([module.make_env(env_id, i, False, "probe", *extra) for i in range(n)])
else:
    sys.path.insert(0, where)
    if kind == "ours-continuous":  # HostEnvs: CleanRL's clipping and normalisation, vectorised; torch in and out
        import torch
        from continuous_envs import HostEnvs
        from ppo_continuous import make_env
        torch.set_num_threads(1)
        host = HostEnvs([make_env(env_id, i) for i in range(n)], False, 0.99, torch.device("cpu"))
        zeros = lambda x: torch.zeros(len(x))
        class Envs:
            single_action_space = host.envs.single_action_space
            reset = lambda self, seed: host.reset(seed)
            step = lambda self, actions: host.step(torch.from_numpy(actions), zeros, 0)
            close = lambda self: host.close()
        envs = Envs()
    else:
        import ppo_atari
        threads = min(n, len(os.sched_getaffinity(0)))
        envs = ppo_atari.make_envs(env_id, n, threads, ppo_atari.Args().max_episode_frames)
space = envs.single_action_space
rng = np.random.default_rng(0)
if isinstance(space, gym.spaces.Discrete):
    actions = rng.integers(0, space.n, (64, n))
else:
    actions = rng.uniform(space.low, space.high, (64, n, *space.shape)).astype(np.float32)
envs.reset(seed=0)
for i in range(10):
    envs.step(actions[i])
steps, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < seconds:
    envs.step(actions[steps % 64])
    steps += 1
rate = steps * n / (time.perf_counter() - t0)
envs.close()
print(json.dumps({"rate": rate}))
"""


def env_rate(python: str, kind: str, env_id: str, n: int, seconds: float, where: str) -> tuple[float | None, str]:
    """Env steps/s of one env stack (``kind``: raw, cleanrl, ours-continuous, ours-atari) stepped alone with random
    actions for ``seconds`` after 10 warm-up steps, resets included, in a subprocess of ``python``; or (None, why)."""
    command = [python, "-c", ENV_PROBE, kind, env_id, str(n), str(seconds), where]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with tempfile.TemporaryDirectory(prefix="cleanrl_compare_env_", ignore_cleanup_errors=True) as tmp:
        try:
            done = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=seconds + 120)
        except subprocess.TimeoutExpired:
            return None, "timed out"
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines or not lines[-1].startswith("{"):
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return None, f"failed: {why}"[:200]
    return json.loads(lines[-1])["rate"], "ok"


def versions(python: str) -> dict[str, str]:
    try:
        done = subprocess.run([python, "-c", VERSIONS], capture_output=True, text=True, timeout=120)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return {}


def shown(v: dict[str, str]) -> str:
    return ", ".join(f"{k} {v.get(k, '?')}" for k in ("python", "torch", "gymnasium", "numpy", "mujoco", "ale_py"))


def cpu_info() -> tuple[str, str]:
    """The CPU's model and its AVX-512 / AMX flags, from /proc/cpuinfo."""
    model, flags = "", []
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                if key.strip() == "flags":
                    flags = value.split()
                    break
    wide = sorted(f for f in flags if f.startswith(("avx512", "amx")))
    return model or platform.processor() or "unknown", " ".join(wide) or "none (no AVX-512, no AMX)"


def our_commit() -> str:
    """This checkout's commit, and whether the scripts differ from it."""
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        git = ["git", "-C", ROOT]
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(
                [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
            )
            return "commit " + head.stdout.strip() + (" with uncommitted changes" if dirty.stdout.strip() else "")
    return "not a git checkout"


def cleanrl_commit(folder: str) -> str:
    path = os.path.join(folder, "COMMIT")
    if os.path.exists(path):
        return Path(path).read_text().strip() or "unknown"
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        done = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if done.returncode == 0:
            return done.stdout.strip()
    return "unknown (no COMMIT file or git checkout in the CleanRL folder)"


def check_setup(a, names: list[str], all_tasks: dict[str, Task]) -> None:
    """One error line that says how to set the CleanRL side up, when a piece of it is missing."""
    how = "set it up as this script's docstring says (python benchmark/cleanrl_compare.py --help)"
    if not os.path.isdir(a.cleanrl_dir):
        raise SweepError(f"no CleanRL folder at {a.cleanrl_dir}: pass --cleanrl-dir or set CLEANRL_DIR, or {how}")
    for name in names:
        script = os.path.join(a.cleanrl_dir, all_tasks[name].theirs[0])
        if not os.path.isfile(script):
            raise SweepError(f"no {script}: copy CleanRL's cleanrl/{all_tasks[name].theirs[0]} there, or {how}")
    if not (os.path.isfile(a.cleanrl_python) and os.access(a.cleanrl_python, os.X_OK)):
        raise SweepError(
            f"no CleanRL Python at {a.cleanrl_python}: pass --cleanrl-python or set CLEANRL_PYTHON, or {how}"
        )


def times(v: float | None) -> str:
    return DASH if v is None else f"{v:.2f}x"


def percent(v: float | None) -> str:
    return DASH if v is None else f"{v:.0%}"


def table(name: str, t: Task, sides: dict[str, Side]) -> list[str]:
    ours, theirs = sides["ours"], sides["CleanRL"]
    wall = summary([r.wall_sps for r in ours.runs], [r.wall_sps for r in theirs.runs])
    steady = summary([r.steady for r in ours.runs], [r.steady for r in theirs.runs])
    rows = []
    for label, side, key in (("ours", ours, "ours"), ("CleanRL", theirs, "theirs")):
        ok = sum(r.ok for r in side.runs)
        rows.append(
            [
                f"{label} ({t.our_env if label == 'ours' else t.their_env})",
                f"{ok}/{len(side.runs)}",
                fmt(wall[f"{key}_best"]),
                fmt(wall[f"{key}_median"]),
                fmt(steady[f"{key}_best"]),
                fmt(steady[f"{key}_median"]),
                fmt(side.env_rate),
                percent(ratio(median_or_none(r.steady for r in side.runs), side.env_rate)),
            ]
        )
    rows.append(
        [
            "ours / CleanRL",
            "",
            times(wall["ratio_best"]),
            times(wall["ratio_median"]),
            times(steady["ratio_best"]),
            times(steady["ratio_median"]),
            times(ratio(ours.env_rate, theirs.env_rate)),
            "",
        ]
    )
    header = ["side", "runs ok", "wall SPS best", "wall SPS median", "steady SPS best", "steady SPS median"]
    header += ["env rate", "steady / env rate"]
    return [f"### {name}: {t.num_envs} env(s) x {t.batch // t.num_envs} steps", "", *md_table(header, rows)]


def main_inner(argv: list[str]) -> int:
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    else:
        extra = []
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=["continuous", "atari", "both"], default="both")
    p.add_argument("--repeats", type=count(1), default=2, help="rounds; each runs both sides once (default 2)")
    p.add_argument("--steps", type=count(1), default=40960, help="--total-timesteps of every run (default 40960)")
    p.add_argument("--env-id", help="our env id instead of HalfCheetah-v5 / ALE/Breakout-v5 (one --task)")
    p.add_argument("--cleanrl-env-id", help="CleanRL's env id instead of HalfCheetah-v4 / BreakoutNoFrameskip-v4")
    p.add_argument("--cleanrl-dir", default=os.environ.get("CLEANRL_DIR", DEFAULT_DIR))
    p.add_argument("--cleanrl-python", default=os.environ.get("CLEANRL_PYTHON", DEFAULT_PYTHON))
    p.add_argument("--env-seconds", type=count(0.1, float), default=5.0, help="seconds each env rate steps (5)")
    p.add_argument("--timeout", type=count(1, float), default=1800.0, help="seconds before a run is stopped (1800)")
    p.add_argument("--out", help="also write the markdown to this file")
    a = p.parse_args(argv)
    names = ["continuous", "atari"] if a.task == "both" else [a.task]
    if a.task == "both" and (a.env_id or a.cleanrl_env_id):
        raise SweepError("--env-id and --cleanrl-env-id need one --task (continuous or atari)")
    all_tasks = tasks(a.env_id, a.cleanrl_env_id)
    for name in names:
        if a.steps < 2 * all_tasks[name].batch:
            raise SweepError(f"--steps must be at least {2 * all_tasks[name].batch} for {name} (two iterations)")
    check_setup(a, names, all_tasks)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_start = os.getloadavg()
    ours_py, theirs_py = sys.executable, a.cleanrl_python
    commands = {}
    for name in names:
        t = all_tasks[name]
        steps = ["--total-timesteps", str(a.steps)]
        commands[name] = {
            "ours": [ours_py, os.path.join(ROOT, t.ours[0]), *t.ours[1:], *steps, *extra],
            "CleanRL": [theirs_py, os.path.join(a.cleanrl_dir, t.theirs[0]), *t.theirs[1:], *steps],
        }
    results = {name: {side: Side() for side in SIDES} for name in names}
    for round_number in range(1, a.repeats + 1):
        for name in names:
            for side in round_order(round_number):
                print(f"[compare] round {round_number}/{a.repeats}, {name}, {side} ...", flush=True)
                run = run_once(side, commands[name][side], all_tasks[name].batch, a.steps, a.timeout)
                results[name][side].runs.append(run)
                if run.ok:
                    line = f"{run.wall:.1f} s, wall SPS {fmt(run.wall_sps)}, steady SPS {fmt(run.steady)}"
                    print(f"[compare]   {line} (its own charts/SPS median {fmt(run.logged)})", flush=True)
                else:
                    print(f"[compare]   {run.status}\n{run.tail}", flush=True)
    fairness = []
    for name in names:
        t = all_tasks[name]
        kind = "ours-continuous" if name == "continuous" else "ours-atari"
        probes = {"ours": (ours_py, kind, t.our_env, ROOT), "CleanRL": (theirs_py, "cleanrl", t.their_env, "")}
        for side, (python, k, env_id, where) in probes.items():
            where = where or f"{a.cleanrl_dir}:{name}"
            print(f"[compare] env rate: {name}, {side} ({env_id}, {t.num_envs} envs) ...", flush=True)
            rate, status = env_rate(python, k, env_id, t.num_envs, a.env_seconds, where)
            results[name][side].env_rate = rate
            results[name][side].env_what = status
            print(f"[compare]   {fmt(rate)} env steps/s" if rate else f"[compare]   {status}", flush=True)
        if name == "continuous":  # is v4 against v5 fair? the raw envs, no wrappers
            ids = sorted({t.our_env, t.their_env, "HalfCheetah-v4", "HalfCheetah-v5"})
            for label, python, gymnasium in (("our", ours_py, 1), ("CleanRL's", theirs_py, 0)):
                for env_id in ids if gymnasium else [i for i in ids if not i.endswith("-v5")]:  # 0.29: no v5
                    rate, status = env_rate(python, "raw", env_id, t.num_envs, a.env_seconds, "")
                    fairness.append([f"{label} venv", env_id, fmt(rate) if rate else status])

    model, flags = cpu_info()
    ours_v, theirs_v = versions(ours_py), versions(theirs_py)
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    lines = [
        "# Our PPO scripts against CleanRL's",
        "",
        f"- command: `{shlex.join(['python', os.path.relpath(os.path.abspath(sys.argv[0]), ROOT), *sys.argv[1:]])}`",
        f"- date: {started}; host: {platform.node()}",
        f"- CPU: {model}; {len(cpus)} of {os.cpu_count()} logical cores allowed to this process ({cpus})",
        f"- CPU flags: {flags}",
        f"- ours: {shown(ours_v)} ({ours_py}); scripts in {ROOT} ({our_commit()})",
        f"- CleanRL: {shown(theirs_v)} ({theirs_py})",
        f"- CleanRL commit: {cleanrl_commit(a.cleanrl_dir)} ({a.cleanrl_dir}, its scripts unmodified)",
        f"- rounds: {a.repeats}, alternating (odd: ours first); {a.steps:,} steps per run",
        "- load average at start / end (1 min): " + f"{load_start[0]:.2f} / {os.getloadavg()[0]:.2f}",
        "",
    ]
    for name in names:
        t = all_tasks[name]
        lines += table(name, t, results[name]) + [""]
        lines += [
            f"- ours: `{shlex.join(commands[name]['ours'])}`",
            f"- CleanRL: `{shlex.join(commands[name]['CleanRL'])}`",
        ]
        for side in SIDES:
            runs = results[name][side].runs
            walls = ", ".join(f"{r.wall:.1f}" if r.ok else r.status for r in runs)
            lines.append(f"- {side} runs, wall s: {walls}; env rate: {results[name][side].env_what}")
        lines.append("")
    if fairness:
        lines += ["### HalfCheetah v4 against v5: the raw env (gym.make, no wrappers), 1 env, env steps/s", ""]
        lines += md_table(["venv", "env", "env steps/s"], fairness) + [""]
    lines += [
        "wall SPS: steps / (process start to exit). steady SPS: the median over iterations 2, 3, ... of steps per "
        "second between consecutive per-iteration event times. env rate: each side's env stack alone, random "
        "actions; steady / env rate: the median steady SPS over it.",
        "",
    ]
    for name in names:
        for side in SIDES:
            for r in results[name][side].runs:
                if r.tail:
                    lines += [f"{name}, {side}: {r.status}; the end of its output:", "", "```", r.tail, "```", ""]
    text = "\n".join(lines)
    print("\n" + text)
    if a.out:
        Path(a.out).write_text(text)
        print(f"wrote {a.out}")
    failed = any(not r.ok for sides in results.values() for s in sides.values() for r in s.runs)
    return 1 if failed else 0


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    return main_inner(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
