"""The sweep engine behind benchmark/ppo_atari.sh, ppo_continuous.sh and dqn_snake.sh (each is `exec python
benchmark/sweep.py <grid> "$@"`). One code path decides, locally and under SLURM, what a run does.

    python benchmark/sweep.py ppo_atari --games "Breakout Pong" --seeds "1 2" --dry-run -- --total-timesteps 2000000
    python benchmark/sweep.py dqn_snake --slurm --partition gpu --gpus-per-run 1 --cpus-per-run 8
    python benchmark/sweep.py task LOG_DIR/dqn_snake.json 3     # what SLURM array task 3 runs (the sbatch line)

Run ids: a run of a sweep is ``<env_tag>__<exp_name>__<seed>`` (:func:`run_id`); the training scripts name its
directory ``runs/<run_id>__<unix time>`` (:func:`parse_run_name` reads one back; benchmark/report.py uses it too).

Local sweeps: run i gets session i (``--session i``); the script's gpu_utils.select_device puts it on GPU
``gpu_utils.rotate(i, CUDA_OFFSET, n_gpus)``, and this engine computes the same GPU to keep at most JOBS_PER_GPU runs
on each GPU at once (one queue per GPU; without GPUs one queue of JOBS). ``-- --gpu N`` puts every run on GPU N (one
queue of JOBS_PER_GPU), ``-- --gpu false`` on the CPU (:func:`gpu_choice`). Slot s of the C = lanes x slots slots gets
CPU group s of ``gpu_utils.split_cpus(sweep CPUs, C)`` (or windows of --cpus-per-run CPUs), runs there with
OMP_NUM_THREADS = MKL_NUM_THREADS = its CPUs, pinned with ``taskset -c`` where taskset works.

SLURM (--slurm): one sbatch script, a job array with task i = run i, and a JSON spec of the runs next to it; the
task line is ``python benchmark/sweep.py task SPEC $SLURM_ARRAY_TASK_ID``, so resume/skip and signal forwarding are
the code below in both modes.

--resume-existing (:func:`decide_resume`): a run whose process still trains (it holds ``runs/<run>/.lock``) is left
alone (live); else the newest ``runs/<run_id>__*`` with a checkpoint.pt decides: finished -> skip, running/stopped ->
continue with ``--resume``, none -> start fresh, unreadable (or holding more than data:
``run_utils.read_checkpoint``) -> the run fails with why.
SIGTERM/SIGINT to the engine: every started run gets SIGTERM (it finishes its iteration, writes checkpoint.pt and
exits), no further run starts, and the engine waits for them; the summary says what stopped. A run that gets it while
it starts (before the script's handler exists) dies with rc 143 and no new checkpoint: stopped before its first
checkpoint, not failed (:func:`early_stop_note`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import asdict, dataclass

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # gpu_utils.py and run_utils.py live in the repo root, next to the training scripts
    sys.path.insert(0, REPO_ROOT)

import gpu_utils  # noqa: E402
import run_utils  # noqa: E402

RUN_NAME_RE = re.compile(r"^(?P<env>.+?)__(?P<exp>.+)__(?P<seed>-?\d+)__(?P<ts>\d+)$")
GRIDS = ("ppo_atari", "ppo_continuous", "dqn_snake")
ATARI_GAMES = "Breakout Pong Qbert MsPacman Seaquest SpaceInvaders BeamRider Enduro"
MUJOCO_ENVS = "HalfCheetah-v5 Hopper-v5 Walker2d-v5 Ant-v5 Humanoid-v5 InvertedPendulum-v5"
MUJOCO_MORE = "Swimmer-v5 Reacher-v5 Pusher-v5 InvertedDoublePendulum-v5 HumanoidStandup-v5"
PRESETS = ("default", "fast", "heavy", "beast")
SLURM_VALUE_RE = re.compile(r"[A-Za-z0-9._:,+=@-]*")  # with fullmatch: "$" would let a last newline through
SLURM_PATH_RE = re.compile(r"[A-Za-z0-9._/+=:@,-]+")
LIST_OPTIONS = ("--games", "--envs", "--presets", "--sizes", "--num-envs", "--seeds")  # white space separates items
# the variables a sweep reads: their text reaches run names, commands, logs and the sbatch script
SWEEP_VARIABLES = ("GAMES", "ENVS", "PRESETS", "SIZES", "NUM_ENVS", "SEEDS", "GAE_LAMBDA", "CPUS_PER_RUN", "LOG_DIR")
SWEEP_VARIABLES += ("JOBS_PER_GPU", "JOBS", "SWEEP_CPUS", "NUM_GPUS", "CUDA_OFFSET", "PYTHON", "LAMBDA_CSV")
LIST_VARIABLES = ("GAMES", "ENVS", "PRESETS", "SIZES", "NUM_ENVS", "SEEDS")
SPLIT_IN_TWO = "which would split a command line (or a line of the sbatch script) in two; remove it"


class SweepError(ValueError):
    """Bad input to a sweep; the message is one line that says what to change (printed as ``error: ...``, exit 2)."""


def note(text: str) -> None:
    print(f"[sweep] note: {text}", file=sys.stderr, flush=True)


def say(text: str) -> None:
    print(text, flush=True)


def stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def control_character(text: str, separators: bool = False) -> str | None:
    """The first control character of ``text`` (a newline, a carriage return, an escape...), or None; with
    ``separators`` (a list of items), white space such as a newline between two games is allowed."""
    for c in text:
        if unicodedata.category(c) == "Cc" and not (separators and c.isspace()):
            return c
    return None


def refuse_control_characters(
    options: Sequence[str], passthrough: Sequence[str], sbatch_args: Sequence[str] | None, track: bool
) -> None:
    """What a user gives becomes run names, command lines, log lines and lines of the sbatch script, where a newline
    would start a command of its own: a SweepError naming the first argument or variable with a control character."""
    for words, where in ((options, ""), (passthrough, " after --"), (sbatch_args or [], " after --sbatch-args")):
        for prev, word in zip([None, *words], words):
            flag = word.split("=", 1)[0] if word.startswith("--") else prev if prev and prev.startswith("-") else None
            c = control_character(word, separators=not where and flag in LIST_OPTIONS)
            if c is not None:
                name = f"{flag}{where}" if flag and not control_character(flag) else f"argument{where}"
                raise SweepError(f"{name} {word!r} holds a control character ({c!r}), {SPLIT_IN_TWO}")
    variables = SWEEP_VARIABLES + (("WANDB_PROJECT_NAME", "WANDB_ENTITY") if track else ())
    for var in variables:
        value = os.environ.get(var, "")
        c = control_character(value, separators=var in LIST_VARIABLES)
        if c is not None:
            raise SweepError(f"{var} {value!r} holds a control character ({c!r}), {SPLIT_IN_TWO}")


# ---------------------------------------------------------------- run ids


def run_id(env_tag: str, exp_name: str, seed: int | str) -> str:
    """The id of one run of a sweep: ``<env_tag>__<exp_name>__<seed>`` ("/" in an env id becomes "_")."""
    return f"{env_tag.replace('/', '_')}__{exp_name}__{seed}"


def parse_run_name(name: str) -> tuple[str, str, int, int] | None:
    """(env_tag, exp_name, seed, unix time) of a run directory name ``<run_id>__<time>``, or None for other names."""
    m = RUN_NAME_RE.match(name)
    if not m:
        return None
    return m.group("env"), m.group("exp"), int(m.group("seed")), int(m.group("ts"))


def run_dirs(runs_dir: str, rid: str) -> list[str]:
    """Directories ``<runs_dir>/<rid>__<digits>``, newest first (by the unix time in the name, then mtime)."""
    if not os.path.isdir(runs_dir):
        return []
    found = []
    for name in os.listdir(runs_dir):
        parsed = parse_run_name(name)
        path = os.path.join(runs_dir, name)
        if parsed and name == f"{rid}__{parsed[3]}" and os.path.isdir(path):
            found.append((parsed[3], os.path.getmtime(path), path))
    return [path for *_, path in sorted(found, reverse=True)]


# ---------------------------------------------------------------- --resume-existing


@dataclass(frozen=True)
class Decision:
    """What --resume-existing does with one run: action is fresh, resume, skip, live (its process trains now) or
    error."""

    action: str
    checkpoint: str | None
    note: str


def decide_resume(runs_dir: str, rid: str) -> Decision:
    """A run whose process still trains in one of its ``<runs_dir>/<rid>__*`` folders (``run_utils.run_is_live``) is
    live: neither a second writer in its folder nor a second copy of it. Else the newest folder holding a checkpoint.pt
    decides: finished or diverged -> skip, running/stopped (or an unknown status) -> resume from it, none -> fresh,
    unreadable -> error (never a silent fresh start)."""
    dirs = run_dirs(runs_dir, rid)
    live = [d for d in dirs if run_utils.run_is_live(d)]
    if live:  # e.g. an array resubmitted while its old tasks run, or a sweep started twice
        holder = os.path.join(live[0], run_utils.RUN_LOCK)
        return Decision("live", None, f"{live[0]} is training now (its process holds {holder}); not started twice")
    without = [d for d in dirs if not os.path.isfile(os.path.join(d, "checkpoint.pt"))]
    with_ckpt = [d for d in dirs if d not in without]
    if not with_ckpt:
        text = "no earlier run with a checkpoint"
        if without:
            text += f" ({len(without)} run dir(s) without one, e.g. {without[0]})"
        return Decision("fresh", None, text)
    path = os.path.join(with_ckpt[0], "checkpoint.pt")
    try:  # as data only, as the scripts read it: a file they would refuse is never resumed
        ckpt = run_utils.read_checkpoint(path)
    except (OSError, run_utils.CheckpointError) as exc:  # the reader's message is one line
        return Decision("error", path, f"{exc}; move it away to start the run afresh")
    status = ckpt.get("status")
    step = ckpt.get("global_step")
    total = (ckpt.get("args") or {}).get("total_timesteps")
    where = f"step {step:,}" if isinstance(step, int) else "unknown step"
    if isinstance(total, int):
        where += f" of {total:,}"
    others = f"; {len(dirs) - 1} other run dir(s) for it" if len(dirs) > 1 else ""
    if status == "finished":
        return Decision("skip", path, f"finished at {where}: {path}{others}")
    if status == "diverged":  # NaN or infinite weights after this checkpoint: the same settings would repeat it
        again = "not resumed, it would likely diverge again; start it anew with other settings"
        return Decision("skip", path, f"diverged after its checkpoint at {where} ({again}): {path}{others}")
    if status not in run_utils.CHECKPOINT_STATUSES:
        return Decision("resume", path, f"checkpoint without a known status ({status!r}) at {where}: {path}{others}")
    return Decision("resume", path, f"{status} at {where}: {path}{others}")


# ---------------------------------------------------------------- grids


@dataclass(frozen=True)
class Run:
    """One run of a sweep: a label for people, its run id, and the training script with its arguments."""

    label: str
    run_id: str
    args: tuple[str, ...]


def has_flag(args: Sequence[str], flag: str) -> bool:
    """True when ``args`` hold ``flag`` as "--flag value" or "--flag=value"."""
    return any(a == flag or a.startswith(flag + "=") for a in args)


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value ``args`` give to ``flag`` (the last one when given twice), or None."""
    value = None
    for prev, a in zip([None, *args], args):
        if prev == flag:
            value = a
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def parse_seeds(text: str) -> list[str]:
    seeds = text.split()
    for seed in seeds:
        if not re.fullmatch(r"-?\d+", seed):
            raise SweepError(f"seed '{seed}' is not an integer; use --seeds \"1 2 3\"")
    return seeds


def atari_lambdas(csv_path: str) -> dict[str, str]:
    """game -> gae_lambda text from benchmark/atari_lambdas.csv (its rows, in order)."""
    if not os.path.isfile(csv_path):
        raise SweepError(f"lambda table {csv_path} not found")
    with open(csv_path, newline="") as f:
        return {row["game"]: row["gae_lambda"] for row in csv.DictReader(f) if row.get("game")}


def unknown_env_ids(env_ids: Sequence[str]) -> list[str]:
    """The ids that gymnasium does not know: a typo caught before a sweep starts runs that would each stop at once."""
    import ale_py  # noqa: F401  (importing it registers the ALE/<Game>-v5 ids)
    import gymnasium as gym

    return [env_id for env_id in env_ids if env_id not in gym.registry]


def atari_grid(
    games: Sequence[str], seeds: Sequence[str], passthrough: Sequence[str], gae_lambda: str = "", csv_path: str = ""
) -> list[Run]:
    """Games x seeds of ppo_atari.py. Each game's --gae-lambda comes from the table, ``gae_lambda`` overrides it for
    every game, and a --gae-lambda after -- is used as given."""
    if has_flag(passthrough, "--env-id"):
        raise SweepError("choose games with --games before --, not --env-id after it")
    unknown = unknown_env_ids([f"ALE/{game.removeprefix('ALE/').removesuffix('-v5')}-v5" for game in games])
    if unknown:
        raise SweepError(f'unknown game {unknown[0]}; name games as ALE spells them, e.g. --games "Breakout MsPacman"')
    table = atari_lambdas(csv_path or os.path.join(REPO_ROOT, "benchmark", "atari_lambdas.csv"))
    exp_name = flag_value(passthrough, "--exp-name") or "ppo_atari"
    runs = []
    for game in games:
        game = game.removeprefix("ALE/").removesuffix("-v5")
        lam_args: tuple[str, ...] = ()
        lam_note = "lambda=as-passed"
        if not has_flag(passthrough, "--gae-lambda"):
            lam = gae_lambda or table.get(game, "")
            if not lam:
                lam = "0.95"
                note(f"{game} is not in {os.path.basename(csv_path or 'atari_lambdas.csv')}; using lambda 0.95")
            lam_note = f"lambda={lam}"
            lam_args = ("--gae-lambda", lam)
        for seed in seeds:
            env_id = f"ALE/{game}-v5"
            args = ("ppo_atari.py", "--env-id", env_id, *lam_args, "--seed", seed)
            runs.append(Run(f"{env_id} seed={seed} {lam_note}", run_id(env_id, exp_name, seed), args))
    return runs


def continuous_grid(
    envs: Sequence[str], presets: Sequence[str], seeds: Sequence[str], passthrough: Sequence[str]
) -> list[Run]:
    """Envs x presets x seeds of ppo_continuous.py; each preset gets its own --exp-name (ppo_continuous_fast, ...)."""
    if has_flag(passthrough, "--preset"):
        raise SweepError("choose presets with --presets before --, not --preset after it")
    if has_flag(passthrough, "--env-id"):
        raise SweepError("choose envs with --envs before --, not --env-id after it")
    unknown = unknown_env_ids(envs)
    if unknown:
        raise SweepError(f'unknown env id {unknown[0]}; use gymnasium\'s ids, e.g. --envs "HalfCheetah-v5 Hopper-v5"')
    runs = []
    for env_id in envs:
        for preset in presets:
            if preset not in PRESETS:
                raise SweepError(f"unknown preset '{preset}' (use default, fast, heavy or beast)")
            preset_args: tuple[str, ...] = () if preset == "default" else ("--preset", preset)
            exp_name = flag_value(passthrough, "--exp-name")
            if exp_name is None:
                exp_name = "ppo_continuous" if preset == "default" else f"ppo_continuous_{preset}"
                preset_args += ("--exp-name", exp_name)
            for seed in seeds:
                args = ("ppo_continuous.py", "--env-id", env_id, *preset_args, "--seed", seed)
                runs.append(Run(f"{env_id} {preset} seed={seed}", run_id(env_id, exp_name, seed), args))
    return runs


def snake_grid(
    sizes: Sequence[str], num_envs: Sequence[str], seeds: Sequence[str], passthrough: Sequence[str]
) -> list[Run]:
    """Board sizes ("N" or "HxW") x numbers of games x seeds of dqn_snake_vec.py; each number of games gets its own
    --exp-name (dqn_snake_vec_n256, ...)."""
    for flag in ("--height", "--width", "--num-envs"):
        if has_flag(passthrough, flag):
            raise SweepError(f"set board sizes and game counts with --sizes/--num-envs before --, not {flag} after it")
    runs = []
    for size in sizes:
        m = re.fullmatch(r"(\d+)x(\d+)|(\d+)", size)
        if not m:
            raise SweepError(f"board size '{size}' is not N or HxW (e.g. 10 or 8x12)")
        h, w = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(3))
        if min(int(h), int(w)) < 3:  # dqn_snake_vec.py would refuse it: each run would stop at once
            raise SweepError(f"board size '{size}' is below 3 x 3, the smallest Snake board")
        for n in num_envs:
            if not n.isdigit() or int(n) < 1:
                raise SweepError(f"num_envs '{n}' is not a positive integer")
            exp_name = flag_value(passthrough, "--exp-name")
            name_args: tuple[str, ...] = ()
            if exp_name is None:
                exp_name = f"dqn_snake_vec_n{n}"
                name_args = ("--exp-name", exp_name)
            for seed in seeds:
                args = ("dqn_snake_vec.py", "--height", h, "--width", w, "--num-envs", n, *name_args, "--seed", seed)
                runs.append(Run(f"Snake{h}x{w} n={n} seed={seed}", run_id(f"Snake{h}x{w}", exp_name, seed), args))
    return runs


# ---------------------------------------------------------------- devices, slots and CPUs


def parse_cpu_list(text: str) -> list[int]:
    """ "0-3,8,10-14:2" -> [0, 1, 2, 3, 8, 10, 12, 14] (taskset's syntax)."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        if not m:
            raise SweepError(f"--cpus (SWEEP_CPUS) '{text}' is not a CPU list such as 0-7 or 0,2,4")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3) or 1)
        if hi < lo or step < 1:
            raise SweepError(f"--cpus (SWEEP_CPUS) '{text}' is not a CPU list such as 0-7 or 0,2,4")
        out.extend(range(lo, hi + 1, step))
    return out


def cpu_ranges(cpus: Sequence[int]) -> str:
    """[0, 1, 2, 3, 8, 10, 11] -> "0-3,8,10-11"."""
    parts: list[str] = []
    start = prev = None
    for c in [*cpus, None]:
        if c is not None and prev is not None and c == prev + 1:
            prev = c
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = c
    return ",".join(parts)


def detect_gpus(environ: dict[str, str]) -> int:
    """GPUs the runs will see: NUM_GPUS, else the CUDA_VISIBLE_DEVICES entries, else torch's count."""
    if environ.get("NUM_GPUS", "") != "":
        value = environ["NUM_GPUS"]
        if not value.isdigit():
            raise SweepError(f"NUM_GPUS must be a non-negative integer, got '{value}'")
        return int(value)
    if "CUDA_VISIBLE_DEVICES" in environ:
        visible = environ["CUDA_VISIBLE_DEVICES"].strip()
        return 0 if not visible or visible.startswith("-") else len(visible.split(","))
    import torch  # already loaded by gpu_utils

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_of(session: int, n_gpus: int, cuda_offset: int, fixed_gpu: int | None = None) -> str:
    """Where run ``session`` trains: "cuda:<fixed_gpu>", "cuda:<gpu_utils.rotate(...)>" or "cpu"."""
    if fixed_gpu is not None:
        return f"cuda:{fixed_gpu}"
    return f"cuda:{gpu_utils.rotate(session, cuda_offset, n_gpus)}" if n_gpus else "cpu"


def gpu_choice(text: str | None, n_gpus: int) -> tuple[int, int | None]:
    """(GPUs the runs use, the one GPU every run takes or None) for the ``--gpu`` given after -- (None: not given),
    read as gpu_utils.select_device reads it: auto/true rotate over the ``n_gpus``, false/cpu puts every run on the
    CPU, N or cuda:N every run on GPU N."""
    word = (text or "auto").strip().lower()
    if word in ("auto", "true", "cuda", "gpu", "yes"):
        return n_gpus, None
    if word in ("false", "cpu", "no"):
        return 0, None
    index = word.removeprefix("cuda:")
    if not re.fullmatch(r"[0-9]+", index):
        raise SweepError(f"--gpu {text!r} after -- is not understood; use auto, true, false, a GPU index N or cuda:N")
    if int(index) >= n_gpus:
        have = f"{n_gpus} GPUs (0..{n_gpus - 1})" if n_gpus > 1 else "GPU 0 only" if n_gpus else "no GPU"
        raise SweepError(
            f"--gpu {text} after -- asks for GPU {index} but the sweep sees {have} (NUM_GPUS, else "
            "CUDA_VISIBLE_DEVICES); name a GPU it sees, or leave --gpu out"
        )
    return n_gpus, int(index)


def slot_cpus(cpus: Sequence[int], slots: int, per_run: int | None = None) -> list[list[int]]:
    """The CPUs of each of ``slots`` slots: ``gpu_utils.split_cpus`` (disjoint groups, sizes within one), or with
    ``per_run`` a window of that many CPUs per slot, slot s from position s * per_run, wrapping round the list."""
    if per_run is None:
        return gpu_utils.split_cpus(cpus, slots)
    p = len(cpus)
    if per_run >= p:
        return [list(cpus) for _ in range(slots)]
    return [[cpus[(s * per_run + j) % p] for j in range(per_run)] for s in range(slots)]


def taskset_works(cpu: int) -> bool:
    if shutil.which("taskset") is None:
        return False
    return subprocess.run(["taskset", "-c", str(cpu), "true"], capture_output=True).returncode == 0


def slot_prefix(cpus: Sequence[int], pin: bool) -> list[str]:
    """The words before a run's command: its thread variables and, when pinned, ``taskset -c LIST``."""
    k = str(len(cpus))
    words = [f"OMP_NUM_THREADS={k}", f"MKL_NUM_THREADS={k}"]
    return words + (["taskset", "-c", cpu_ranges(cpus)] if pin else [])


def run_command(
    python: str, run: Run, session: int | None, tail: Sequence[str], resume: str | None = None
) -> list[str]:
    """``python SCRIPT ARGS [--session i] TAIL [--resume CKPT]``; TAIL holds --cuda-offset, --track and the
    arguments after --. SLURM tasks have no session (SLURM gives each its GPUs)."""
    cmd = [python, *run.args]
    if session is not None:
        cmd += ["--session", str(session)]
    cmd += list(tail)
    if resume:
        cmd += ["--resume", resume]
    return cmd


def start_run(
    command: Sequence[str], cpus: Sequence[int], pin: bool, log, die_with_parent: bool = False
) -> subprocess.Popen:
    """Start one run in its slot from the repo root: OMP_NUM_THREADS = MKL_NUM_THREADS = its CPUs, pinned there with
    ``taskset -c`` when ``pin``, stdout and stderr to the open file ``log``, in its own session (a Ctrl-C at the
    terminal reaches the engine, which passes on one SIGTERM). With ``die_with_parent`` (Linux) the run also gets
    SIGTERM when the engine dies, even by SIGKILL, so that it writes its checkpoint instead of running on unwatched.
    Raises OSError when the interpreter or taskset cannot be started."""
    env = {**os.environ, "OMP_NUM_THREADS": str(len(cpus)), "MKL_NUM_THREADS": str(len(cpus))}
    launch = slot_prefix(cpus, pin)[2:] + list(command)  # taskset (if pinned) and the command; variables in env
    return subprocess.Popen(
        launch,
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=term_with_parent(os.getpid()) if die_with_parent else None,
    )


def term_with_parent(parent: int):
    """A preexec_fn asking Linux to send the child SIGTERM when ``parent`` dies (prctl PR_SET_PDEATHSIG), or None
    where prctl is missing. libc is looked up here, in the parent: the child only makes the call."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def planned_slots(lanes_of: Sequence[int], slots: int) -> list[int]:
    """The slot each run would take if runs ended in the order they started (the dry run's guess): run i on lane g
    takes slot g * slots + (its place in lane g) % slots. Runs with lane -1 (not run) get -1."""
    count: dict[int, int] = {}
    out = []
    for lane in lanes_of:
        if lane < 0:
            out.append(-1)
            continue
        out.append(lane * slots + count.get(lane, 0) % slots)
        count[lane] = count.get(lane, 0) + 1
    return out


def log_name(index: int, label: str) -> str:
    return f"{index:03d}_{re.sub(r'[^A-Za-z0-9._=-]', '_', label)}.log"


# ---------------------------------------------------------------- running runs and forwarding signals


SIGTERM_RC = 128 + signal.SIGTERM  # a process that SIGTERM killed, as a shell reports it


def early_stop_note(resume: str | None) -> str:
    """What a run that SIGTERM killed while it started (rc 143: the scripts handle the signal only once they train)
    left, and what --resume-existing does with it: no checkpoint of this process, so afresh, or its old one again."""
    if resume:
        return f"stopped before its first checkpoint; {resume} is as it was and --resume-existing continues from it"
    return "stopped before its first checkpoint; --resume-existing starts it afresh"


class Stopper:
    """Forwards SIGTERM/SIGINT to every started run (it checkpoints and exits) and remembers that the sweep stops."""

    def __init__(self) -> None:
        self.stopping = False
        self.procs: list[subprocess.Popen] = []

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)

    def stop(self, signum: int = signal.SIGTERM, frame: object = None) -> None:
        self.stopping = True
        for proc in list(self.procs):
            self.term(proc)

    def started(self, proc: subprocess.Popen) -> None:
        self.procs.append(proc)
        if self.stopping:  # the signal came while it was starting
            self.term(proc)

    @staticmethod
    def term(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass


@dataclass
class Slot:
    """One place for a run on a lane (GPU): its global number (lane * slots + place), CPUs and current run."""

    index: int
    cpus: list[int]
    proc: subprocess.Popen | None = None
    session: int = -1


def run_local(
    name: str,
    runs: Sequence[Run],
    commands: Sequence[list[str]],
    devices: Sequence[str],
    lanes_of: Sequence[int],
    decisions: Sequence[Decision | None],
    slot_sets: Sequence[list[int]],
    slots: int,
    pin: bool,
    log_dir: str,
) -> int:
    """Run the sweep here: a queue per lane (GPU) with ``slots`` slots; returns 0, 1 (a run failed) or 130 (stopped
    by a signal). Writes LOG_DIR/NNN_<label>.log per run and LOG_DIR/summary.txt."""
    os.makedirs(log_dir, exist_ok=True)
    say(f"[sweep] logs in {log_dir}")
    logs = [os.path.join(log_dir, log_name(i, run.label)) for i, run in enumerate(runs)]
    result: dict[int, str] = {}
    queues: dict[int, list[int]] = {}
    for i, run in enumerate(runs):
        d = decisions[i]
        if d and d.action == "skip":
            result[i] = "skipped"
            say(f"[sweep] skip   [session {i}] {run.label}: {d.note}")
        elif d and d.action == "live":
            result[i] = "live"
            say(f"[sweep] live   [session {i}] {run.label}: {d.note}")
        elif d and d.action == "error":
            with open(logs[i], "w") as f:
                f.write(f"error: --resume-existing: {d.note}\n")
            result[i] = "bad-checkpoint"
            say(f"[sweep] FAILED [session {i}] {run.label}: {d.note}")
        else:
            if d and d.action == "resume":
                say(f"[sweep] resume [session {i}] {run.label}: {d.note}")
            queues.setdefault(lanes_of[i], []).append(i)
    lane_slots = {g: [Slot(g * slots + j, list(slot_sets[g * slots + j])) for j in range(slots)] for g in queues}
    stopper = Stopper()
    stopper.install()
    start_s = time.time()
    while True:
        busy = False
        for g, queue in queues.items():
            for slot in lane_slots[g]:
                if slot.proc is not None and slot.proc.poll() is not None:
                    finish(slot, runs, logs, result, stopper.stopping, flag_value(commands[slot.session], "--resume"))
                    slot.proc = None
                if slot.proc is None and queue and not stopper.stopping:
                    i = queue.pop(0)
                    prefix = slot_prefix(slot.cpus, pin)
                    say(f"[sweep] start  [session {i}] {devices[i]} cpus {cpu_ranges(slot.cpus)}: {runs[i].label}")
                    with open(logs[i], "w") as log:
                        log.write(f"# {stamp()} slot {slot.index}: {shlex.join(prefix + commands[i])}\n")
                        log.flush()
                        try:
                            slot.proc = start_run(commands[i], slot.cpus, pin, log)
                        except OSError as exc:  # the interpreter (PYTHON) or taskset cannot be started
                            first = (prefix[2:] + commands[i])[0]  # taskset when pinned, else the interpreter
                            log.write(f"error: cannot start {first}: {exc}\n")
                            result[i] = "127"
                            say(f"[sweep] FAILED (rc=127) {log_name(i, runs[i].label)[:-4]}: see {logs[i]}")
                            continue
                    slot.session = i
                    stopper.started(slot.proc)
                busy = busy or slot.proc is not None
        if not busy and (stopper.stopping or not any(queues.values())):
            break
        time.sleep(0.2)
    return summarize(name, runs, devices, logs, result, time.time() - start_s, stopper.stopping, log_dir)


def finish(
    slot: Slot, runs: Sequence[Run], logs: Sequence[str], result: dict[int, str], stopping: bool, resume: str | None
) -> None:
    """Record how the run in ``slot`` ended (``resume``: the checkpoint it started from, if any)."""
    i, rc = slot.session, slot.proc.returncode
    if rc < 0:  # killed by a signal: the shell's convention
        rc = 128 - rc
    base = os.path.basename(logs[i]).removesuffix(".log")
    if stopping and rc == 0:
        result[i] = "stopped"
        say(f"[sweep] stopped       {base}: checkpoint written; continue with --resume-existing")
    elif stopping and rc == SIGTERM_RC:  # our SIGTERM came while it started, before the script could handle it
        result[i] = "stopped early"
        say(f"[sweep] stopped       {base}: {early_stop_note(resume)}")
    else:
        result[i] = str(rc)
        say(f"[sweep] done   (rc=0) {base}" if rc == 0 else f"[sweep] FAILED (rc={rc}) {base}: see {logs[i]}")


def summarize(
    name: str,
    runs: Sequence[Run],
    devices: Sequence[str],
    logs: Sequence[str],
    result: dict[int, str],
    seconds: float,
    interrupted: bool,
    log_dir: str,
) -> int:
    counts = {"ok": 0, "failed": 0, "stopped": 0, "not started": 0, "skipped": 0, "live": 0}
    lines = [f"sweep {name}: {len(runs)} runs, {seconds:.0f} s"]
    for i, run in enumerate(runs):
        rc = result.get(i, "not-run")
        if rc == "0":
            counts["ok"] += 1
        elif rc == "skipped":
            counts["skipped"] += 1
        elif rc == "live":
            counts["live"] += 1
            lines.append(f"live [session {i}] {run.label}: training in another process, left alone")
        elif rc == "stopped":
            counts["stopped"] += 1
            lines.append(f"stopped [session {i}] {run.label}: {logs[i]}")
        elif rc == "stopped early":
            counts["stopped"] += 1
            lines.append(f"stopped before its first checkpoint [session {i}] {run.label}: {logs[i]}")
        elif rc == "not-run":
            counts["not started"] += 1
            lines.append(f"not started [session {i}] {run.label}")
        else:
            counts["failed"] += 1
            lines.append(f"FAILED (rc={rc}) [session {i}] {devices[i]} {run.label}: {logs[i]}")
    total = f"{counts['ok']} ok, {counts['failed']} failed"
    for key in ("stopped", "not started"):
        if counts[key]:
            total += f", {counts[key]} {key}"
    if counts["skipped"]:
        total += f", {counts['skipped']} skipped (finished or diverged before)"
    if counts["live"]:
        total += f", {counts['live']} live (training in another process)"
    lines.append(total)
    if interrupted:
        lines.append(
            "interrupted: stopped runs wrote runs/<run>/checkpoint.pt; run the same command with --resume-existing "
            "to continue them and start the rest (afresh for those stopped before their first checkpoint)"
        )
    summary = os.path.join(log_dir, "summary.txt")
    with open(summary, "w") as f:
        f.write("\n".join(lines) + "\n")
    say(f"[sweep] summary ({summary}):")
    for line in lines:
        say(f"[sweep]   {line}")
    if interrupted:
        return 130
    return 1 if counts["failed"] else 0


# ---------------------------------------------------------------- SLURM


def slurm_spec(name: str, runs: Sequence[Run], python: str, tail: Sequence[str], log_dir: str, resume: bool) -> dict:
    """What the array tasks run, saved as LOG_DIR/<name>.json: the runs (label, run id, script and arguments, log
    file), the runs' interpreter, the arguments every run gets (``tail``) and the --resume-existing default."""
    return {
        "name": name,
        "repo": REPO_ROOT,
        "python": python,
        "log_dir": log_dir,
        "resume_existing": resume,
        "tail": list(tail),
        "runs": [{**asdict(run), "args": list(run.args), "log": log_name(i, run.label)} for i, run in enumerate(runs)],
    }


def comment(text: str) -> str:
    """``# text`` as one line of a shell script: control characters are written as escapes (``\\n``), so no text
    a user gave can end the comment and start a command."""
    return "# " + "".join(c.encode("unicode_escape").decode() if control_character(c) else c for c in text)


def sbatch_directives(name: str, array: str, log_dir: str, opts: dict[str, str | None]) -> list[str]:
    """The #SBATCH lines of a job array ``array`` (e.g. "0-7%2") named ``name``: SLURM's output to
    LOG_DIR/slurm/%A_%a.out, SIGTERM 120 s before the time limit, and the options of ``opts`` (partition, time,
    gpus_per_run, cpus_per_run, mem, account) that are set."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --array={array}"]
    lines += [f"#SBATCH --output={log_dir}/slurm/%A_%a.out", "#SBATCH --signal=B:TERM@120"]
    for key, flag in (("partition", "partition"), ("time", "time")):
        if opts.get(key):
            lines.append(f"#SBATCH --{flag}={opts[key]}")
    if opts.get("gpus_per_run") and opts["gpus_per_run"] != "0":
        lines.append(f"#SBATCH --gres=gpu:{opts['gpus_per_run']}")
    for key, flag in (("cpus_per_run", "cpus-per-task"), ("mem", "mem"), ("account", "account")):
        if opts.get(key):
            lines.append(f"#SBATCH --{flag}={opts[key]}")
    return lines


def sbatch_script(name: str, spec_path: str, spec: dict, opts: dict[str, str | None], engine_python: str) -> str:
    """The job array's sbatch script: #SBATCH lines, the runs as comments, and one task line that calls this
    engine (``sweep.py task SPEC $SLURM_ARRAY_TASK_ID``). What a user gave is checked (``check_slurm_options``),
    quoted, or inside a comment."""
    n = len(spec["runs"])
    array = f"0-{n - 1}" + (f"%{opts['max_parallel']}" if opts.get("max_parallel") else "")
    lines = sbatch_directives(name, array, spec["log_dir"], opts)
    lines += [
        "#",
        f"# {name} sweep: {n} runs as one SLURM job array, written by benchmark/sweep.py on {stamp()}.",
        "# Task i runs run i of the spec below in the repo root, logs to LOG_DIR/<NNN_label>.log (runs go to runs/ as",
        "# in a local sweep) with OMP_NUM_THREADS = MKL_NUM_THREADS = the CPUs SLURM gave it (--cpus-per-task).",
        "# scancel (or the time limit: --signal=B:TERM@120) sends SIGTERM: the engine passes it to the run, which",
        "# finishes its iteration, writes runs/<run>/checkpoint.pt and exits; the engine waits for it.",
        "# RESUME_EXISTING=1 (--resume-existing): a task first looks for its run's newest checkpoint and skips",
        "# (finished) or continues (--resume) it, else starts fresh; to continue a stopped sweep, run the sweep",
        "# command again with --resume-existing, or: RESUME_EXISTING=1 sbatch THIS_FILE",
        comment(
            f"RESUME_EXISTING defaults to {int(spec['resume_existing'])} here; every run also gets: "
            f"{shlex.join(spec['tail'])}"
        ),
        "#",
    ]
    for i, run in enumerate(spec["runs"]):
        lines.append(comment(f"task {i}: {run['label']}: {shlex.join(run['args'])}"))
    lines += [
        "set -u",
        f"cd {shlex.quote(spec['repo'])} || exit 2",
        f"exec {shlex.quote(engine_python)} benchmark/sweep.py task {shlex.quote(spec_path)} "
        '"${SLURM_ARRAY_TASK_ID:-}"',
    ]
    return "\n".join(lines) + "\n"


def check_slurm_options(opts: dict[str, str | None], log_dir: str) -> None:
    for path in (log_dir, REPO_ROOT):
        if not SLURM_PATH_RE.fullmatch(path):
            raise SweepError(
                f"--slurm needs paths without spaces, % or quotes (SLURM's --output); '{path}' has some: pass --log-dir"
            )
    for key in ("partition", "time", "mem", "account"):
        if opts.get(key) and not SLURM_VALUE_RE.fullmatch(opts[key]):
            raise SweepError(f"SLURM option value '{opts[key]}' has spaces or odd characters")
    gpus = opts.get("gpus_per_run")
    if gpus and not gpus.isdigit():
        raise SweepError(f"--gpus-per-run must be a non-negative integer, got '{gpus}'")
    cap = opts.get("max_parallel")
    if cap and (not cap.isdigit() or int(cap) < 1):
        raise SweepError(f"--max-parallel must be a positive integer, got '{cap}'")
    mem = opts.get("mem")
    if mem and not re.fullmatch(r"\d+[KMGTkmgt]?", mem):
        raise SweepError(f"--mem '{mem}' is not a size such as 16G or 16000 (megabytes)")


def submit_slurm(
    name: str, runs: Sequence[Run], python: str, tail: Sequence[str], opts: dict, log_dir: str, dry_run: bool
) -> int:
    """Write LOG_DIR/<name>.json (the runs) and LOG_DIR/<name>.sbatch and submit it (with dry_run: print them)."""
    check_slurm_options(opts, log_dir)
    if opts.get("gpus_per_run") and int(opts["gpus_per_run"]) > 1:
        note(
            f"--gpus-per-run {opts['gpus_per_run']}: each run uses the first GPU it sees; one run on several GPUs is "
            "benchmark/slurm/ppo_atari_multinode.sbatch"
        )
    if os.environ.get("CUDA_OFFSET"):
        note("CUDA_OFFSET is ignored under --slurm: each task uses the GPUs SLURM gives it")
    sbatch_args = opts.get("sbatch_args") or []
    if not opts.get("gpus_per_run") and not any(re.match(r"--(gres|gpus)", a) for a in sbatch_args):
        note("no --gpus-per-run: the runs get a GPU only where the partition gives one by default")
    spec = slurm_spec(name, runs, python, tail, log_dir, bool(opts.get("resume_existing")))
    spec_path = os.path.join(log_dir, f"{name}.json")
    script_path = os.path.join(log_dir, f"{name}.sbatch")
    script = sbatch_script(name, spec_path, spec, opts, os.path.abspath(sys.executable))
    cmd = ["sbatch", "--parsable", *sbatch_args, script_path]
    cap = f", at most {opts['max_parallel']} at once" if opts.get("max_parallel") else ""
    say(f"[sweep] {name}: {len(runs)} runs as one SLURM job array (task i = run i){cap}; logs in {log_dir}")
    if dry_run:
        say(f"[sweep] dry run: would write {script_path} (and its runs, {spec_path}) and run: {shlex.join(cmd)}")
        sys.stdout.write(script)
        say("[sweep] dry run: nothing was submitted")
        return 0
    if shutil.which("sbatch") is None:
        raise SweepError(
            "sbatch not found: --slurm submits to a SLURM cluster; run this where sbatch works (a login node), or "
            "try a local test cluster: benchmark/slurm/local_cluster.sh start"
        )
    os.makedirs(os.path.join(log_dir, "slurm"), exist_ok=True)
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)
    with open(script_path, "w") as f:
        f.write(script)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        out = "; ".join((res.stdout + res.stderr).strip().splitlines())
        print(
            f"error: sbatch failed (rc={res.returncode}): {out}; fix what sbatch names and run the sweep again "
            f"(the script is {script_path})",
            file=sys.stderr,
        )
        return 1
    job = res.stdout.strip().splitlines()[-1].split(";")[0]
    with open(os.path.join(log_dir, "submissions.txt"), "a") as f:
        f.write(f"{stamp()} {job} {shlex.join(cmd)}\n")
    say(f"[sweep] submitted job array {job} ({len(runs)} tasks); watch: squeue -j {job}; stop: scancel {job}")
    say("[sweep] after a stop, the same command with --resume-existing continues each unfinished run")
    return 0


def slurm_cpus(environ: dict[str, str]) -> int:
    """The CPUs SLURM gave this task (SLURM_CPUS_PER_TASK, else SLURM_JOB_CPUS_PER_NODE such as "2(x1)"), else the
    CPUs this process may use."""
    for var in ("SLURM_CPUS_PER_TASK", "SLURM_JOB_CPUS_PER_NODE"):
        m = re.match(r"\d+", environ.get(var, ""))
        if m and int(m.group()) > 0:
            return int(m.group())
    return gpu_utils.available_cpus()


def run_task(spec_path: str, index_text: str) -> int:
    """One SLURM array task: decide --resume-existing, set the thread variables, run, forward SIGTERM, wait."""
    if not index_text:
        raise SweepError("submit this script with sbatch; it is a job array (SLURM_ARRAY_TASK_ID is unset)")
    with open(spec_path) as f:
        spec = json.load(f)
    n = len(spec["runs"])
    if not index_text.isdigit() or int(index_text) >= n:
        raise SweepError(f"this sweep has runs 0-{n - 1}, not {index_text}")
    i = int(index_text)
    entry = spec["runs"][i]
    run = Run(entry["label"], entry["run_id"], tuple(entry["args"]))
    log = open(os.path.join(spec["log_dir"], entry["log"]), "a")
    os.dup2(log.fileno(), 1)  # from here on, this task's output (and its run's) is the run's log
    os.dup2(log.fileno(), 2)
    os.chdir(spec["repo"])
    cpus = slurm_cpus(dict(os.environ))
    env = {k: v for k, v in os.environ.items() if k != "CUDA_OFFSET"}  # SLURM gives the task its GPUs
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(cpus)
    job = f"{os.environ.get('SLURM_ARRAY_JOB_ID', '?')}_{i} (job {os.environ.get('SLURM_JOB_ID', '?')})"
    say(
        f"# {stamp()} slurm job {job} on {socket.gethostname()}: {cpus} CPUs (OMP_NUM_THREADS={cpus} "
        f"MKL_NUM_THREADS={cpus}), CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}"
    )
    resume = None
    if os.environ.get("RESUME_EXISTING", "1" if spec["resume_existing"] else "0") == "1":
        d = decide_resume("runs", run.run_id)
        if d.action in ("skip", "live"):
            say(f"[sweep] {d.action}: {d.note}")
            return 0
        if d.action == "error":
            say(f"[sweep] FAILED: --resume-existing: {d.note}")
            return 2
        say(f"[sweep] resume: {d.note}" if d.action == "resume" else f"[sweep] fresh start: {d.note}")
        resume = d.checkpoint if d.action == "resume" else None
    cmd = run_command(spec["python"], run, None, spec["tail"], resume)
    say(f"# {stamp()} {shlex.join(cmd)}")
    stopper = Stopper()
    stopper.install()
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
    stopper.started(proc)
    while proc.poll() is None:
        time.sleep(0.2)
    rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    if stopper.stopping and rc == 0:
        say(
            f"# {stamp()} stopped by SIGTERM with its checkpoint written; resubmit the sweep with --resume-existing "
            "to continue"
        )
        return SIGTERM_RC
    if stopper.stopping and rc == SIGTERM_RC:  # the SIGTERM came while it started, before the script could handle it
        say(f"# {stamp()} stopped by SIGTERM while it started: {early_stop_note(resume)}")
        return SIGTERM_RC
    say(f"# {stamp()} exit code {rc}")
    return rc


# ---------------------------------------------------------------- command line


class Parser(argparse.ArgumentParser):
    """argparse whose errors are a SweepError (one line, ``error: ...``, exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        m = re.match(r"argument (\S+?)(?:/\S+)?: expected one argument", message)
        raise SweepError(f"{m.group(1)} needs a value" if m else message)


LOCAL_ONLY = ("jobs_per_gpu", "jobs", "cpus")
SLURM_ONLY = ("partition", "time", "gpus_per_run", "mem", "max_parallel", "account", "sbatch_args")


def build_parser(grid: str) -> Parser:
    env = os.environ.get
    p = Parser(
        prog=f"benchmark/{grid}.sh",
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"Sweep {grid} runs (engine: benchmark/sweep.py). Arguments after -- go to every run.",
        epilog="Environment: NUM_GPUS (override the GPU count), CUDA_OFFSET (first GPU), PYTHON (interpreter "
        "of the runs), SWEEP_PYTHON (of the engine), WANDB_PROJECT_NAME / WANDB_ENTITY (with --track).",
    )
    g = p.add_argument_group("grid")
    if grid == "ppo_atari":
        g.add_argument("--games", default=env("GAMES", ""), help=f"ALE games (env GAMES; default: {ATARI_GAMES})")
        g.add_argument(
            "--all",
            action="store_true",
            default=env("ALL_GAMES") == "1",
            help="all 57 games in benchmark/atari_lambdas.csv (env ALL_GAMES=1)",
        )
        g.add_argument(
            "--gae-lambda",
            default=env("GAE_LAMBDA", ""),
            help="same lambda for every game instead of the per-game table (env GAE_LAMBDA)",
        )
    elif grid == "ppo_continuous":
        g.add_argument("--envs", default=env("ENVS", ""), help=f"gymnasium env ids (env ENVS; default: {MUJOCO_ENVS})")
        g.add_argument(
            "--all", action="store_true", default=env("ALL_ENVS") == "1", help=f"also {MUJOCO_MORE} (env ALL_ENVS=1)"
        )
        g.add_argument(
            "--presets",
            default=env("PRESETS", "default fast heavy beast"),
            help="any of: default fast heavy beast (env PRESETS)",
        )
    else:
        g.add_argument("--sizes", default=env("SIZES", "10 20"), help="board sizes, N or HxW (env SIZES)")
        g.add_argument("--num-envs", default=env("NUM_ENVS", "256 4096"), help="games per run (env NUM_ENVS)")
    c = p.add_argument_group("common")
    c.add_argument(
        "--dry-run",
        action="store_true",
        help="print every command with its device, CPUs and threads (with --slurm: the sbatch script)",
    )
    c.add_argument("--track", action="store_true", help="pass --track (and WANDB_PROJECT_NAME / WANDB_ENTITY) on")
    c.add_argument("--seeds", default=env("SEEDS", "1 2 3"), help='seeds (env SEEDS; default "1 2 3")')
    c.add_argument(
        "--resume-existing",
        action="store_true",
        help="skip runs whose newest run dir has a finished checkpoint, continue (--resume) running/stopped "
        "ones, leave runs still training (live) alone, start the others; under --slurm each task decides when it "
        "starts",
    )
    c.add_argument(
        "--cpus-per-run",
        default=env("CPUS_PER_RUN", ""),
        help="CPUs and OMP/MKL threads per run (env CPUS_PER_RUN; default: the sweep's CPUs / runs at once; "
        "under --slurm: sbatch --cpus-per-task)",
    )
    c.add_argument("--log-dir", default=env("LOG_DIR", ""), help="per-run logs and summary (env LOG_DIR)")
    lo = p.add_argument_group("local runs")
    lo.add_argument("--jobs-per-gpu", help="runs sharing one GPU at once (env JOBS_PER_GPU, default 1)")
    lo.add_argument("--jobs", help="runs at once on a machine without GPUs (env JOBS, default 1)")
    lo.add_argument("--cpus", help="CPUs the sweep may use, e.g. 0-15 (env SWEEP_CPUS; default: all it may use)")
    s = p.add_argument_group("SLURM (one job array, one task per run; needs sbatch)")
    s.add_argument("--slurm", action="store_true", help="write the sbatch script and submit it (--dry-run: print it)")
    s.add_argument("--partition", help="sbatch --partition")
    s.add_argument("--time", help="sbatch --time per run, e.g. 24:00:00")
    s.add_argument("--gpus-per-run", help="sbatch --gres=gpu:N (a run uses the first GPU it sees)")
    s.add_argument("--mem", help="sbatch --mem per run, e.g. 32G")
    s.add_argument("--max-parallel", help="at most N runs at once (the array's %%N throttle)")
    s.add_argument("--account", help="sbatch --account")
    s.add_argument(
        "--sbatch-args",
        metavar="ARG...",
        help="every word after it, up to --, goes to sbatch unchanged (put it last), e.g. --qos=high",
    )
    return p


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str], list[str] | None]:
    """(sweep options, arguments after --, words after --sbatch-args or None)."""
    argv = list(argv)
    passthrough: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    sbatch = None
    if "--sbatch-args" in argv:
        cut = argv.index("--sbatch-args")
        argv, sbatch = argv[:cut], argv[cut + 1 :]
        if not sbatch:
            raise SweepError(
                "--sbatch-args needs sbatch options after it (e.g. --sbatch-args --qos=high), last before --"
            )
    return argv, passthrough, sbatch


def positive(value: str, what: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise SweepError(f"{what} must be a positive integer, got '{value}'")
    return int(value)


def build_runs(grid: str, a: argparse.Namespace, seeds: list[str], passthrough: list[str]) -> list[Run]:
    if grid == "ppo_atari":
        csv_path = os.environ.get("LAMBDA_CSV") or os.path.join(REPO_ROOT, "benchmark", "atari_lambdas.csv")
        games = a.games.split()
        if not games:
            games = list(atari_lambdas(csv_path)) if a.all else ATARI_GAMES.split()
        gae = "" if has_flag(passthrough, "--gae-lambda") else a.gae_lambda
        return atari_grid(games, seeds, passthrough, gae, csv_path)
    if grid == "ppo_continuous":
        envs = a.envs.split() or (MUJOCO_ENVS + (" " + MUJOCO_MORE if a.all else "")).split()
        return continuous_grid(envs, a.presets.split(), seeds, passthrough)
    return snake_grid(a.sizes.split(), a.num_envs.split(), seeds, passthrough)


def default_python() -> str:
    python = os.environ.get("PYTHON", "")
    if python:
        return python
    return ".venv/bin/python" if os.access(os.path.join(REPO_ROOT, ".venv", "bin", "python"), os.X_OK) else "python"


def abs_python(python: str) -> str:
    """The runs' interpreter as an absolute path (a relative path is relative to the repo root)."""
    if os.path.isabs(python):
        return python
    if "/" in python:
        return os.path.join(REPO_ROOT, python)
    found = shutil.which(python)
    if not found:
        raise SweepError(f"python interpreter '{python}' not found on PATH; set PYTHON=/path/to/python")
    return found


def sweep_main(grid: str, argv: Sequence[str]) -> int:
    options, passthrough, sbatch_args = split_argv(argv)
    parser = build_parser(grid)
    a, unknown = parser.parse_known_args(options)
    if unknown:
        raise SweepError(f"unknown option '{unknown[0]}' (see --help; arguments for the training script go after --)")
    a.sbatch_args = sbatch_args
    refuse_control_characters(options, passthrough, sbatch_args, a.track)
    given_local = [k for k in LOCAL_ONLY if getattr(a, k) is not None]
    given_slurm = [k for k in SLURM_ONLY if getattr(a, k) is not None]
    if a.slurm and given_local:
        raise SweepError(
            f"--{given_local[0].replace('_', '-')} is for local sweeps; under --slurm use --max-parallel (runs at "
            "once) and --cpus-per-run (CPUs per run)"
        )
    if not a.slurm and given_slurm:
        flag = "--" + given_slurm[0].replace("_", "-")
        raise SweepError(f"{flag} is an option for SLURM sweeps; add --slurm (or drop {flag})")
    jobs_per_gpu = positive(a.jobs_per_gpu or os.environ.get("JOBS_PER_GPU") or "1", "JOBS_PER_GPU")
    jobs = positive(a.jobs or os.environ.get("JOBS") or "1", "JOBS")
    per_run = positive(a.cpus_per_run, "--cpus-per-run (CPUS_PER_RUN)") if a.cpus_per_run else None
    if has_flag(passthrough, "--seed"):
        raise SweepError('--seed after -- would give every run the same seed; use --seeds "1 2 3"')
    if has_flag(passthrough, "--resume"):
        raise SweepError("--resume after -- would make every run continue one checkpoint; use --resume-existing")
    if has_flag(passthrough, "--session"):
        raise SweepError(
            "--session after -- would give every run the same session (and GPU); the sweep numbers its runs itself: "
            "shift them with CUDA_OFFSET, or put them all on one GPU with -- --gpu N"
        )
    runs = build_runs(grid, a, parse_seeds(a.seeds), passthrough)
    if not runs:
        raise SweepError("nothing to run (empty list of envs, seeds or settings)")
    log_dir = (
        os.path.abspath(a.log_dir)
        if a.log_dir
        else os.path.join(REPO_ROOT, "runs", "sweep_logs", f"{grid}_{time.strftime('%Y%m%d-%H%M%S')}")
    )
    track: list[str] = []
    if a.track:
        track = ["--track"]
        for var, flag in (("WANDB_PROJECT_NAME", "--wandb-project-name"), ("WANDB_ENTITY", "--wandb-entity")):
            if os.environ.get(var):
                track += [flag, os.environ[var]]
    python = default_python()

    if a.slurm:
        opts = {k: getattr(a, k) for k in SLURM_ONLY}
        opts["cpus_per_run"] = a.cpus_per_run or None
        opts["resume_existing"] = a.resume_existing
        return submit_slurm(grid, runs, abs_python(python), track + passthrough, opts, log_dir, a.dry_run)

    # the plan follows what the runs will do: their --cuda-offset and --gpu after --, else CUDA_OFFSET and rotation
    offset_source = "--cuda-offset" if has_flag(passthrough, "--cuda-offset") else "CUDA_OFFSET"
    offset_text = flag_value(passthrough, "--cuda-offset") or os.environ.get("CUDA_OFFSET", "")
    if offset_text and not re.fullmatch(r"[0-9]+", offset_text):
        raise SweepError(f"{offset_source} must be a non-negative integer, got '{offset_text}'")
    offset = int(offset_text or 0)
    n_gpus, fixed_gpu = gpu_choice(flag_value(passthrough, "--gpu"), detect_gpus(dict(os.environ)))
    tail = ["--cuda-offset", offset_text] if offset_text and not has_flag(passthrough, "--cuda-offset") else []
    tail += track + passthrough
    if fixed_gpu is not None:  # one queue, on the GPU that --gpu N names
        lanes, slots = 1, jobs_per_gpu
    elif n_gpus:  # one queue per GPU
        lanes, slots = n_gpus, jobs_per_gpu
    else:
        lanes, slots = 1, jobs
    concurrency = lanes * slots

    allowed = gpu_utils.allowed_cpus()
    cpus = allowed
    cpu_text = a.cpus or os.environ.get("SWEEP_CPUS", "")
    if cpu_text:
        cpus = parse_cpu_list(cpu_text)
        bad = [c for c in cpus if c not in allowed]
        if bad and a.dry_run:
            note(f"--cpus {cpu_text} includes CPUs this process may not use ({cpu_ranges(bad)}); a real run stops")
        elif bad:
            raise SweepError(
                f"--cpus {cpu_text} includes CPUs this process may not use: {cpu_ranges(bad)} "
                f"(allowed: {cpu_ranges(allowed)})"
            )
    p = len(cpus)
    if per_run is not None and per_run > p:
        note(f"--cpus-per-run {per_run} but the sweep has {p} CPUs; each run gets {p}")
        per_run = p
    slot_sets = slot_cpus(cpus, concurrency, per_run)
    pin = taskset_works(allowed[0])
    sizes = sorted({len(s) for s in slot_sets})
    k_text = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    k_max = per_run or max(1, p // concurrency)
    share = f"; {concurrency} runs x {k_max} > {p} CPUs, so runs share cores" if concurrency * k_max > p else ""
    rule = (
        "the run in slot s gets CPU group s (gpu_utils.split_cpus)"
        if per_run is None
        else (f"the run in slot s gets CPUs s*{per_run} to s*{per_run}+{per_run - 1} of the list")
    )

    decisions: list[Decision | None] = [None] * len(runs)
    if a.resume_existing:
        decisions = [decide_resume(os.path.join(REPO_ROOT, "runs"), run.run_id) for run in runs]
        decisions = [relative_decision(d) for d in decisions]
    commands, devices, lanes_of = [], [], []
    rotating = n_gpus > 0 and fixed_gpu is None
    for i, run in enumerate(runs):
        d = decisions[i]
        commands.append(run_command(python, run, i, tail, d.checkpoint if d and d.action == "resume" else None))
        devices.append(device_of(i, n_gpus, offset, fixed_gpu))
        skipped = d is not None and d.action in ("skip", "live", "error")
        lanes_of.append(-1 if skipped else (gpu_utils.rotate(i, offset, n_gpus) if rotating else 0))

    per_gpu = f"jobs_per_gpu={jobs_per_gpu}" if n_gpus else f"jobs={jobs}"
    gpus = f"gpus={n_gpus}" + (f" (every run on cuda:{fixed_gpu}: --gpu after --)" if fixed_gpu is not None else "")
    say(
        f"[sweep] {grid}: {len(runs)} runs, {gpus} cuda_offset={offset} {per_gpu} -> up to {concurrency} at "
        f"once; cwd {REPO_ROOT}"
    )
    pin_note = "pinned with taskset" if pin else "not pinned (taskset is missing or does not work here)"
    say(
        f"[sweep] threads: {p} CPUs ({cpu_ranges(cpus)}) for {concurrency} runs at once -> {k_text} per run "
        f"(OMP_NUM_THREADS = MKL_NUM_THREADS = its CPUs), {pin_note}; {rule}{share}"
    )
    if a.dry_run:
        slot_of = planned_slots(lanes_of, slots)
        for i, run in enumerate(runs):
            d = decisions[i]
            if d and d.action in ("skip", "live", "error"):
                say(f"[{d.action} {i}] {run.label}: {d.note}")
                continue
            if d and d.action == "resume":
                say(f"[resume {i}] {run.label}: {d.note}")
            say(f"[session {i}] {devices[i]}: {shlex.join(slot_prefix(slot_sets[slot_of[i]], pin) + commands[i])}")
        say(
            "[sweep] dry run: nothing was started (cpus shown for runs ending in the order they start; a freed slot "
            "goes to the next run)"
        )
        return 0
    return run_local(grid, runs, commands, devices, lanes_of, decisions, slot_sets, slots, pin, log_dir)


def relative_decision(d: Decision) -> Decision:
    """Paths relative to the repo root (where the runs start), as users read them."""
    checkpoint = os.path.relpath(d.checkpoint, REPO_ROOT) if d.checkpoint else None
    return Decision(d.action, checkpoint, d.note.replace(os.path.join(REPO_ROOT, ""), ""))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = f"usage: benchmark/sweep.py {{{','.join(GRIDS)}}} [options] [-- run args] | task SPEC INDEX"
    try:
        if argv and argv[0] == "task":
            if len(argv) != 3:
                raise SweepError("task needs the spec file and the task index: sweep.py task SPEC INDEX")
            return run_task(argv[1], argv[2])
        if not argv or argv[0] not in GRIDS:
            if argv and argv[0] in ("-h", "--help"):
                print(usage)
                return 0
            raise SweepError(f"name the grid first: {usage.removeprefix('usage: ')}")
        return sweep_main(argv[0], argv[1:])
    except (SweepError, gpu_utils.DeviceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
