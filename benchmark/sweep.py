"""The sweep engine behind benchmark/ppo_atari.sh, ppo_continuous.sh and dqn_snake.sh (docs/sweeps.md): a grid of runs
of one training script, run here in slots (each with its GPU, CPUs and threads) or as a SLURM job array whose task i
runs `sweep.py task SPEC i`. A signal to the engine reaches every run, which writes its checkpoint and exits."""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import difflib
import functools
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # gpu_utils.py and run_utils.py (they load torch, 2 s: imported where needed)
    sys.path.insert(0, REPO_ROOT)

ATARI_GAMES = "Breakout Pong Qbert MsPacman Seaquest SpaceInvaders BeamRider Enduro"
MUJOCO_ENVS = "HalfCheetah-v5 Hopper-v5 Walker2d-v5 Ant-v5 Humanoid-v5 InvertedPendulum-v5"
MUJOCO_MORE = "Swimmer-v5 Reacher-v5 Pusher-v5 InvertedDoublePendulum-v5 HumanoidStandup-v5"
LISTS = ("--games", "--envs", "--presets", "--sizes", "--num-envs", "--seeds")  # white space separates items
# flags after -- that the sweep sets itself, and what to use instead
SET_BY_SWEEP = {"--seed": "--seeds", "--resume": "--resume-existing", "--session": "slots"}
SET_BY_SWEEP["--cuda-offset"] = "CUDA_OFFSET"
GRID_FLAGS = {
    "ppo_atari": {"--env-id": "--games"},
    "ppo_continuous": {"--env-id": "--envs", "--preset": "--presets"},
    "dqn_snake": {"--height": "--sizes", "--width": "--sizes", "--num-envs": "--num-envs"},
}
SLURM_ONLY = ("partition", "time", "gpus_per_run", "mem", "max_parallel", "account", "sbatch_args")
SLURM_VALUE_RE = re.compile(r"[A-Za-z0-9._:,+=@-]+")  # with fullmatch: "$" would let a last newline through
SLURM_PATH_RE = re.compile(r"[A-Za-z0-9._/+=:@,-]+")
SIGTERM_RC = 128 + signal.SIGTERM  # a process that SIGTERM killed, as a shell reports it
say = functools.partial(print, flush=True)


class SweepError(ValueError):
    """Bad input: one line that says what to change (printed as ``error: ...``, exit 2)."""


def make_dir(path: str, flag: str) -> str:
    """``path``, made if it is missing; one that cannot be a folder (a file's name, say) is an error naming ``flag``."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise SweepError(f"{flag} {path}: cannot make this folder ({exc.strerror}); pass another") from None
    return path


def check_words(words: Sequence[str], where: str = "") -> None:
    """What a user gives reaches command lines, logs and sbatch scripts, where a control character such as a newline
    would start a command: refused, naming its flag. A list (--games ...) may hold newlines between its items."""
    for prev, word in zip(["", *words], words):
        flag = word.split("=")[0] if word.startswith("--") else prev if prev.startswith("--") else "argument"
        text = " ".join(word.split()) if not where and flag in LISTS else word
        c = next((c for c in text if unicodedata.category(c) == "Cc"), None)
        if c is not None:
            raise SweepError(f"{flag}{where} {word!r} holds a control character ({c!r}); remove it")


def dashed(words: Sequence[str]) -> list[str]:
    """The arguments for the runs with each flag's name in dashes: the scripts take --gae_lambda too, and the sweep's
    and the tuner's checks then see every spelling of a flag they set or read."""
    return [re.sub(r"^--[^=]+", lambda m: m[0].replace("_", "-"), w) if w.startswith("--") else w for w in words]


class Field(NamedTuple):  # a field of the script's Args
    flag: str
    kind: str  # float, int, bool or str
    default: object
    choices: tuple | None = None  # a Literal's values


def class_fields(path: Path, name: str) -> list[ast.AnnAssign]:
    """The annotated fields of ``class name`` in the source at ``path``, after those of its bases that live in the
    same file or a module of the repo root (``run_utils.RunArgs``)."""
    classes = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name]
    if not classes:
        return []
    fields = []
    for base in classes[0].bases:
        module, _, base_name = ast.unparse(base).rpartition(".")
        base_path = Path(REPO_ROOT, f"{module}.py") if module else path
        if base_path.is_file():
            fields += class_fields(base_path, base_name)
    return fields + [n for n in classes[0].body if isinstance(n, ast.AnnAssign)]


def script_fields(script: str) -> dict[str, Field]:
    """The fields of ``class Args`` in the script's source, inherited ones too, by name (nothing is imported)."""
    path = Path(REPO_ROOT, script)
    if not script.endswith(".py") or not path.is_file():
        raise SweepError(f"no training script {script} in {REPO_ROOT}; name one, e.g. ppo_continuous.py")
    fields = {}
    for node in class_fields(path, "Args"):
        default = None
        with contextlib.suppress(ValueError):  # none, or an expression such as the script's file name: None
            default = ast.literal_eval(node.value)
        annotation = ast.unparse(node.annotation)
        literal = re.search(r"Literal\[(.*?)\]", annotation)
        choices = tuple(ast.literal_eval(f"({literal[1]},)")) if literal else None
        kinds = [k for k in ("bool", "float", "int") if re.search(rf"\b{k}\b", annotation)]
        kind = "str" if choices or not kinds else kinds[0]
        fields[node.target.id] = Field("--" + node.target.id.replace("_", "-"), kind, default, choices)
    if not fields:
        raise SweepError(f"{script} has no `class Args`; the tools read a script's flags from it")
    return fields


def find_field(name: str, fields: dict[str, Field], script: str) -> Field:
    """The field a flag names (dashes or underscores, with or without --); a typo gets the nearest names."""
    key = name.removeprefix("--").replace("-", "_")
    if key not in fields:
        near = [fields[n].flag for n in difflib.get_close_matches(key, list(fields), n=2)]
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        raise SweepError(f"{script} has no flag --{key.replace('_', '-')}{hint}")
    return fields[key]


def check_flags(words: Sequence[str], fields: dict[str, Field], script: str) -> None:
    """Each --flag in ``words`` (what follows --) names one of the script's ``fields`` (``--no-x`` too): a typo is one
    line here, with the nearest names, not an error in every run."""
    for word in [w.split("=")[0] for w in words if w.startswith("--")]:
        if word[2:].replace("-", "_").removeprefix("no_") not in fields:
            find_field(word, fields, script)


def run_id(env_tag: str, exp_name: str, seed: int | str) -> str:
    """``<env_tag>__<exp_name>__<seed>``, the scripts' run name without its unix time ("/" becomes "_")."""
    return f"{env_tag.replace('/', '_')}__{exp_name}__{seed}"


def parse_run_name(name: str) -> tuple[str, str, int, int] | None:
    """(env_tag, exp_name, seed, unix time) of a run folder's name, or None for other names."""
    m = re.match(r"^(.+?)__(.+)__(-?\d+)__(\d+)$", name)
    return (m[1], m[2], int(m[3]), int(m[4])) if m else None


class Decision(NamedTuple):
    action: str  # what --resume-existing does with a run: fresh, resume (from checkpoint), skip, live or error
    checkpoint: str | None
    note: str


def decide_resume(runs_dir: str, rid: str) -> Decision:
    """A run whose process still trains in one of its folders (``run_utils.run_is_live``) is live: not started twice.
    Else the newest folder with a checkpoint.pt decides: finished or diverged -> skip, running or stopped -> resume,
    none -> fresh, unreadable or holding more than data -> error (never a silent fresh start)."""
    import run_utils

    names = os.listdir(runs_dir) if os.path.isdir(runs_dir) else []
    times = {n: n[len(rid) + 2 :] for n in names if n.startswith(rid + "__") and n[len(rid) + 2 :].isdecimal()}
    dirs = [os.path.join(runs_dir, n) for n in sorted(times, key=lambda n: -int(times[n]))]
    live = [d for d in dirs if run_utils.run_is_live(d)]
    if live:
        return Decision("live", None, f"{live[0]} is training now (its process holds its {run_utils.RUN_LOCK})")
    path = next((p for p in (os.path.join(d, "checkpoint.pt") for d in dirs) if os.path.isfile(p)), None)
    if path is None:
        return Decision("fresh", None, "no earlier run with a checkpoint")
    try:  # as data only, as the scripts read it
        ckpt = run_utils.read_checkpoint(path)
    except (OSError, run_utils.CheckpointError) as exc:
        return Decision("error", path, f"{exc}; move it away to start the run afresh")
    status, step, total = ckpt.get("status"), ckpt.get("global_step"), ckpt["args"].get("total_timesteps")
    where = f"step {step:,}" if isinstance(step, int) else "an unknown step"
    where += f" of {total:,}" if isinstance(total, int) else ""
    if status == "diverged":  # NaN or infinite weights: the same settings would likely diverge again
        return Decision("skip", path, f"diverged after {where}; start it anew with other settings: {path}")
    return Decision("skip" if status == "finished" else "resume", path, f"{status} at {where}: {path}")


class Run(NamedTuple):
    label: str  # for people
    run_id: str
    args: tuple[str, ...]  # the training script and its arguments


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value ``args`` give ``flag`` ("--flag value" or "--flag=value"; the last one), or None."""
    value = None
    for prev, word in zip([None, *args], args):
        if prev == flag:
            value = word
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return value


def parse_seeds(text: str) -> list[str]:
    """--seeds' integers, as words ("01" is "1"), each once."""
    for seed in [s for s in text.split() if not re.fullmatch(r"-?\d+", s)]:
        raise SweepError(f"seed '{seed}' is not an integer; use --seeds \"1 2 3\"")
    seeds = [str(int(s)) for s in text.split()]
    for seed in [s for s, n in Counter(seeds).items() if n > 1]:  # its runs would share one run folder
        raise SweepError(f"--seeds names seed {seed} twice; name each seed once")
    return seeds


def unknown_env_ids(env_ids: Sequence[str]) -> list[str]:
    """The ids gymnasium does not know: a typo stops the sweep before it starts runs that would each fail."""
    import ale_py  # noqa: F401  (registers the ALE/<Game>-v5 ids)
    import gymnasium as gym

    return [env_id for env_id in env_ids if env_id not in gym.registry]


def grid_runs(grid: str, a: argparse.Namespace, passthrough: Sequence[str]) -> list[Run]:
    """The grid's settings x seeds (docs/sweeps.md): games with their lambdas, envs x presets or board sizes x numbers
    of games, each preset and number of games its own --exp-name (ppo_continuous_fast, dqn_snake_vec_n256)."""
    exp = flag_value(passthrough, "--exp-name")
    settings = []  # (label, env tag, exp name, script and arguments)
    if grid == "ppo_atari":
        with open(os.path.join(REPO_ROOT, "benchmark", "atari_lambdas.csv"), newline="") as f:
            table = {row["game"]: row["gae_lambda"] for row in csv.DictReader(f)}
        for game in table if a.all else [g.removeprefix("ALE/").removesuffix("-v5") for g in a.games.split()]:
            given = flag_value(passthrough, "--gae-lambda") is not None
            lam = [] if given else ["--gae-lambda", table.get(game, "0.95")]
            args = ["ppo_atari.py", "--env-id", f"ALE/{game}-v5", *lam]
            settings.append((f"{args[2]} lambda={lam[1] if lam else 'as-passed'}", args[2], exp or grid, args))
    elif grid == "ppo_continuous":
        envs = a.envs.split() + (MUJOCO_MORE.split() if a.all else [])
        for env_id, preset in itertools.product(envs, a.presets.split()):
            if preset not in ("default", "fast", "heavy", "beast", "worlds"):
                raise SweepError(f"unknown preset '{preset}' (use default, fast, heavy, beast or worlds)")
            if preset == "worlds" and flag_value(passthrough, "--sim") != "mjx":  # the script would refuse each run
                raise SweepError("preset worlds is 4,096 envs for --sim mjx: add -- --sim mjx, or use another preset")
            name = exp or ("ppo_continuous" if preset == "default" else f"ppo_continuous_{preset}")
            args = ["ppo_continuous.py", "--env-id", env_id, "--exp-name", name, "--preset", preset]
            settings.append((f"{env_id} {preset}", env_id, name, args[:-2] if preset == "default" else args))
    else:
        for size, n in itertools.product(a.sizes.split(), a.num_envs.split()):
            m = re.fullmatch(r"(\d+)x(\d+)|(\d+)", size)
            h, w = (m[1] or m[3], m[2] or m[3]) if m else ("0", "0")
            if min(int(h), int(w)) < 3:  # dqn_snake_vec.py would refuse it
                raise SweepError(f"board size '{size}' is not N or HxW of at least 3 x 3 (e.g. 10 or 8x12)")
            if not n.isdecimal() or int(n) < 1:
                raise SweepError(f"num_envs '{n}' is not a positive integer")
            name = exp or f"dqn_snake_vec_n{n}"
            args = ["dqn_snake_vec.py", "--height", h, "--width", w, "--num-envs", n, "--exp-name", name]
            settings.append((f"Snake{h}x{w} n={n}", f"Snake{h}x{w}", name, args))
    unknown = unknown_env_ids([tag for _, tag, _, _ in settings]) if grid != "dqn_snake" else []
    if unknown:
        raise SweepError(f"unknown env id {unknown[0]}; use gymnasium's ids, e.g. ALE/Pong-v5 (game Pong), Hopper-v5")
    seeds = parse_seeds(a.seeds)
    runs = [Run(f"{s[0]} seed={n}", run_id(s[1], s[2], n), (*s[3], "--seed", n)) for s in settings for n in seeds]
    repeated = [rid for rid, n in Counter(r.run_id for r in runs).items() if n > 1]
    if repeated:  # two runs would write one run's folder
        once = "name each game, env, setting and seed once (--seeds ...)"
        raise SweepError(f"the sweep lists run {repeated[0]} twice; {once}")
    return runs


def cpu_ranges(cpus: Sequence[int]) -> str:
    """[0, 1, 2, 3, 8, 10, 11] -> "0-3,8,10-11"."""
    starts = [c for i, c in enumerate(cpus) if i == 0 or cpus[i - 1] != c - 1]
    ends = [c for i, c in enumerate(cpus) if i == len(cpus) - 1 or cpus[i + 1] != c + 1]
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in zip(starts, ends))


@dataclass
class Slot:
    """A place for one run at a time: its GPU (None: the CPU), its CPUs, and the run in it."""

    gpu: int | None
    cpus: list[int]
    proc: subprocess.Popen | None = None
    run: int = -1

    @property
    def device(self) -> str:
        return "cpu" if self.gpu is None else f"cuda:{self.gpu}"

    def command(self, command: list[str]) -> list[str]:
        """A run's command on this slot's GPU (--gpu N; on the CPU as it is)."""
        if self.gpu is None or flag_value(command, "--gpu") == str(self.gpu):
            return command
        return [*command, "--gpu", str(self.gpu)]


def slot_gpus(passthrough: Sequence[str]) -> list[int | None]:
    """The GPUs the runs go to, as their --gpu after -- says: every GPU there is (NUM_GPUS, else torch's count, which
    follows CUDA_VISIBLE_DEVICES) in turn from CUDA_OFFSET on, the one GPU of --gpu N, or the CPU (None)."""
    import torch

    gpus = os.environ.get("NUM_GPUS") or str(torch.cuda.device_count() if torch.cuda.is_available() else 0)
    offset = os.environ.get("CUDA_OFFSET") or "0"
    for name, value in (("NUM_GPUS", gpus), ("CUDA_OFFSET", offset)):
        if not value.isdecimal():
            raise SweepError(f"{name} must be a non-negative integer, got '{value}'")
    word = (flag_value(passthrough, "--gpu") or "auto").lower()
    if word in ("auto", "true", "cuda", "gpu", "yes"):
        return [(int(offset) + g) % int(gpus) for g in range(int(gpus))] or [None]
    if word in ("false", "cpu", "no"):
        return [None]
    if not word.removeprefix("cuda:").isdecimal() or int(word.removeprefix("cuda:")) >= int(gpus):
        raise SweepError(f"--gpu {word} after -- is not auto, true, false or one of the {gpus} GPUs (N or cuda:N)")
    return [int(word.removeprefix("cuda:"))]


def make_slots(a: argparse.Namespace, passthrough: Sequence[str]) -> tuple[list[Slot], bool]:
    """--jobs-per-gpu slots per GPU (--jobs on the CPU) in turn over the GPUs, each with its CPUs as
    docs/sweeps.md#thread-budget says, and whether runs are pinned (where taskset works, and not in a SLURM task)."""
    import gpu_utils

    gpus = slot_gpus(passthrough)
    count = len(gpus) * ((a.jobs or 1) if gpus == [None] else (a.jobs_per_gpu or 1))
    cpus = gpu_utils.allowed_cpus()
    taskset = shutil.which("taskset") is not None
    pin = taskset and subprocess.run(["taskset", "-c", str(cpus[0]), "true"]).returncode == 0
    if os.environ.get("SLURM_JOB_ID"):
        cpus, pin = cpus[: slurm_cpus()], False
    groups = gpu_utils.split_cpus(cpus, count)
    if a.cpus_per_run:  # windows of k CPUs, wrapping round
        k = min(a.cpus_per_run, len(cpus))
        groups = [[cpus[(s * k + j) % len(cpus)] for j in range(k)] for s in range(count)]
    sizes = "-".join(sorted({str(len(group)) for group in groups}, key=int))
    share = ", sharing cores" if count * max(map(len, groups)) > len(cpus) else ""
    say(f"[sweep] {count} runs at once on CPUs {cpu_ranges(cpus)}: {sizes} each{share}, {'' if pin else 'not '}pinned")
    return [Slot(gpus[s % len(gpus)], group) for s, group in enumerate(groups)], pin


def slot_prefix(cpus: Sequence[int], pin: bool) -> list[str]:
    """The words before a run's command: its thread variables and, when pinned, ``taskset -c LIST``."""
    threads = [f"OMP_NUM_THREADS={len(cpus)}", f"MKL_NUM_THREADS={len(cpus)}"]
    return threads + ["taskset", "-c", cpu_ranges(cpus)] if pin else threads


def start_run(command: list[str], cpus: Sequence[int], pin: bool, log_path: str, cwd: str) -> subprocess.Popen:
    """Start one run in the folder ``cwd`` (it writes cwd/runs/, as a script started there by hand does) on ``cpus``
    (as many OMP and MKL threads, pinned with taskset when ``pin``), its output appended to ``log_path`` after a line
    with the time and the whole command, in its own session (a Ctrl-C reaches the engine, which passes one SIGTERM on).
    On Linux it gets SIGTERM when the thread that started it ends, even by SIGKILL, and so writes its checkpoint.
    Raises OSError when the command cannot start."""
    env = {**os.environ, "OMP_NUM_THREADS": str(len(cpus)), "MKL_NUM_THREADS": str(len(cpus))}
    parent = os.getpid()

    def term_with_parent() -> None:  # in the child: prctl(PR_SET_PDEATHSIG, SIGTERM)
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signal.SIGTERM)

    prefix = slot_prefix(cpus, pin)  # thread variables (set in env), then taskset when pinned
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: {shlex.join(prefix + command)}\n")
        log.flush()
        return subprocess.Popen(
            prefix[2:] + command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=term_with_parent if sys.platform.startswith("linux") else None,
        )


class Stopper:
    """Passes SIGTERM/SIGINT on to every started run (it checkpoints and exits) and remembers that the sweep stops."""

    def __init__(self) -> None:
        self.stopping = False
        self.procs: list[subprocess.Popen] = []
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)

    def stop(self, *_: object) -> None:
        self.stopping = True
        for proc in self.procs:
            proc.terminate()  # SIGTERM unless it ended: it writes its checkpoint and exits

    def started(self, proc: subprocess.Popen) -> None:
        self.procs.append(proc)
        if self.stopping:  # the signal came while it started
            proc.terminate()


def outcome(rc: int, stopping: bool, resumed: str | None, finished: bool) -> tuple[str, str]:
    """(ok, failed or stopped; why) of a run that exited with ``rc``, its newest checkpoint ``finished`` or not (a run
    that ended as the sweep stopped). A SIGTERM that comes while the script still imports (before its handler exists)
    kills it with 143 and no new checkpoint: stopped, not failed."""
    rc = 128 - rc if rc < 0 else rc
    if stopping and rc == 0 and not finished:
        return "stopped", "its checkpoint is written; --resume-existing continues it"
    if stopping and rc == SIGTERM_RC:
        then = f"{resumed} is as it was" if resumed else "--resume-existing starts it afresh"
        return "stopped", f"before its first checkpoint; {then}"
    return ("ok", "exit code 0") if rc == 0 else ("failed", f"exit code {rc}")


def log_name(i: int, label: str) -> str:
    return f"{i:03d}_{re.sub(r'[^A-Za-z0-9._=-]', '_', label)}.log"


def plan(
    runs: list[Run], python: str, tail: list[str], resume_existing: bool, work_dir: str
) -> tuple[list[list[str]], dict]:
    """Each run's command, its script by its path in the checkout (under --resume-existing with --resume from its
    checkpoint, a path from ``work_dir``, where the runs start), and (skipped, live or failed; why) of each run not to
    start."""
    commands, results = [], {}
    for i, run in enumerate(runs):
        d = decide_resume(os.path.join(work_dir, "runs"), run.run_id) if resume_existing else None
        resume = ["--resume", os.path.relpath(d.checkpoint, work_dir)] if d and d.action == "resume" else []
        commands.append([python, os.path.join(REPO_ROOT, run.args[0]), *run.args[1:], *tail, *resume])
        if d and d.action != "fresh":
            say(f"[sweep] {d.action} [run {i}] {run.label}: {d.note.replace(work_dir + os.sep, '')}")
        if d and d.action in ("skip", "live", "error"):
            results[i] = ({"skip": "skipped", "live": "live", "error": "failed"}[d.action], d.note)
    return commands, results


def run_local(
    runs: list[Run], commands: list, slots: list[Slot], pin: bool, logs: list, results: dict, work_dir: str, summary=""
) -> int:
    """Run the queue in the slots, each run in ``work_dir``, each freed slot taking the next run, each run's output
    appended to its log; the summary (also to the file ``summary``); 0, 1 (a run failed) or 130 (stopped by a
    signal)."""
    queue = [i for i in range(len(runs)) if i not in results]
    stopper, started = Stopper(), time.time()
    runs_dir = os.path.join(work_dir, "runs")
    while queue and not stopper.stopping or any(s.proc for s in slots):
        for slot in slots:
            if slot.proc is not None and slot.proc.poll() is not None:
                resumed = flag_value(commands[slot.run], "--resume")
                rid = runs[slot.run].run_id  # did it end as the stop came? its newest checkpoint says
                finished = stopper.stopping and decide_resume(runs_dir, rid).note.startswith("finished")
                results[slot.run] = outcome(slot.proc.returncode, stopper.stopping, resumed, finished)
                status, why = results[slot.run]
                say(f"[sweep] {status} [run {slot.run}] {runs[slot.run].label}: {why}")
                slot.proc = None
            if slot.proc is None and queue and not stopper.stopping:
                i = slot.run = queue.pop(0)
                say(f"[sweep] start [run {i}] {slot.device} cpus {cpu_ranges(slot.cpus)}: {runs[i].label}")
                try:
                    slot.proc = start_run(slot.command(commands[i]), slot.cpus, pin, logs[i], work_dir)
                    stopper.started(slot.proc)
                except OSError as exc:  # the interpreter (PYTHON) or taskset cannot start
                    results[i] = ("failed", f"cannot start: {exc}")
        time.sleep(0.2)
    lines = [f"{len(runs)} runs in {time.time() - started:.0f} s"]
    for i, run in enumerate(runs):
        status, why = results.get(i, ("not started", "the sweep stopped first"))
        log = f"; log {logs[i]}" if os.path.exists(logs[i]) else ""  # none for a run that never started
        lines += [] if status in ("ok", "skipped") else [f"{status} [run {i}] {run.label}: {why}{log}"]
    counts = Counter(results.get(i, ("not started",))[0] for i in range(len(runs)))
    lines.append(", ".join(f"{counts[k]} {k}" for k in ("ok", "failed", "stopped", "not started", "skipped", "live")))
    if stopper.stopping:
        lines.append("stopped: the same command with --resume-existing continues the stopped runs and starts the rest")
    say("\n".join(f"[sweep] {line}" for line in lines))
    if summary:
        Path(summary).write_text("\n".join(lines) + "\n")
    return 130 if stopper.stopping else 1 if counts["failed"] else 0


def sbatch_script(
    name: str, tasks: int, log_dir: str, a: argparse.Namespace, command: str, note: str, work_dir: str
) -> str:
    """A job array of ``tasks`` tasks that each run ``command`` in ``work_dir``: its output to LOG_DIR/slurm, SIGTERM
    120 s before the time limit, and the SLURM options given, checked (they reach the script as they are)."""
    for path in (log_dir, REPO_ROOT, work_dir):
        if not SLURM_PATH_RE.fullmatch(path):
            raise SweepError(f"--slurm needs paths without spaces, % or quotes; '{path}' has some (pass --log-dir)")
    for flag, value in (("--partition", a.partition), ("--time", a.time), ("--account", a.account)):
        if value is not None and not SLURM_VALUE_RE.fullmatch(value):
            raise SweepError(f"{flag} '{value}' has spaces or odd characters")
    if a.mem is not None and not re.fullmatch(r"\d+[KMGTkmgt]?", a.mem):
        raise SweepError(f"--mem '{a.mem}' is not a size such as 16G or 16000 (megabytes)")
    throttle = f"%{a.max_parallel}" if a.max_parallel else ""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --array=0-{tasks - 1}{throttle}"]
    lines += [f"#SBATCH --output={log_dir}/slurm/%A_%a.out", "#SBATCH --signal=B:TERM@120"]
    gres = f"gpu:{a.gpus_per_run}" if a.gpus_per_run else None
    options = {"partition": a.partition, "time": a.time, "gres": gres, "cpus-per-task": a.cpus_per_run, "mem": a.mem}
    lines += [f"#SBATCH --{flag}={value}" for flag, value in {**options, "account": a.account}.items() if value]
    lines += [f"# {note}", "set -u", f"cd {shlex.quote(work_dir)} || exit 2", f"exec {command}"]
    return "\n".join(lines) + "\n"


def submit(script: str, path: str, sbatch_args: Sequence[str], dry_run: bool) -> None:
    """Write the sbatch script to ``path`` and submit it, saying the job id (the dry run prints it)."""
    cmd = ["sbatch", "--parsable", *sbatch_args, path]
    if dry_run:
        say(f"[dry run] would write {path} and run: {shlex.join(cmd)}\n{script}[dry run] nothing was submitted")
        return
    if shutil.which("sbatch") is None:
        raise SweepError("sbatch not found: --slurm submits to a SLURM cluster (or try dev/local_cluster.sh start)")
    os.makedirs(os.path.join(os.path.dirname(path), "slurm"), exist_ok=True)
    Path(path).write_text(script)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        why = "; ".join((res.stdout + res.stderr).strip().splitlines())
        raise SweepError(f"sbatch failed (rc={res.returncode}): {why}; fix it and run again (script: {path})")
    job = res.stdout.strip().splitlines()[-1].split(";")[0]
    say(f"[sweep] submitted job array {job}; watch: squeue -j {job}; stop: scancel {job}")


def submit_sweep(
    grid: str, runs: list[Run], python: str, tail: list[str], a: argparse.Namespace, log_dir: str, work_dir: str
) -> int:
    """LOG_DIR/<grid>.json holds the runs; LOG_DIR/<grid>.sbatch is a job array whose task i runs run i in
    ``work_dir``."""
    if not a.gpus_per_run and not any(w.startswith(("--gres", "--gpus")) for w in a.sbatch_args):
        say("[sweep] note: no --gpus-per-run: the runs get a GPU only where the partition gives one by default")
    spec_path = os.path.join(log_dir, f"{grid}.json")
    entries = [{**r._asdict(), "args": [*r.args, *tail], "log": log_name(i, r.label)} for i, r in enumerate(runs)]
    spec = {"python": python, "log_dir": log_dir, "resume_existing": a.resume_existing, "work_dir": work_dir}
    task = shlex.join([sys.executable, os.path.abspath(__file__), "task", spec_path]) + ' "${SLURM_ARRAY_TASK_ID:-}"'
    note = f"task i runs run i of {spec_path}; RESUME_EXISTING=1 sbatch THIS_FILE continues a stopped sweep"
    for i, (run, entry) in enumerate(zip(runs, entries)):
        say(f"[task {i}] {run.label}: {shlex.join(entry['args'])}")
    if not a.dry_run:
        make_dir(work_dir, "--work-dir")
        make_dir(log_dir, "--log-dir")
        Path(spec_path).write_text(json.dumps({**spec, "runs": entries}, indent=1))
    script = sbatch_script(grid, len(runs), log_dir, a, task, note, work_dir)
    submit(script, os.path.join(log_dir, f"{grid}.sbatch"), a.sbatch_args, a.dry_run)
    return 0


def slurm_cpus() -> int:
    """The CPUs SLURM gave this task (SLURM_CPUS_PER_TASK, else SLURM_JOB_CPUS_PER_NODE such as "2(x1)")."""
    for var in ("SLURM_CPUS_PER_TASK", "SLURM_JOB_CPUS_PER_NODE"):
        m = re.match(r"[1-9]\d*", os.environ.get(var, ""))
        if m:
            return int(m[0])
    import gpu_utils

    return gpu_utils.available_cpus()


def run_task(spec_path: str, index: str) -> int:
    """SLURM array task ``index``: its run as a sweep of one run, on the CPUs SLURM gave the task and the GPU it gave
    (no --gpu); the --resume-existing decision is taken now (RESUME_EXISTING=1 asks for it too)."""
    import gpu_utils

    try:
        spec = json.loads(Path(spec_path).read_text())
    except (OSError, ValueError) as exc:  # its sweep's log dir moved, or a broken file
        raise SweepError(f"cannot read the sweep's runs from {spec_path} ({exc}); submit the sweep again") from None
    if not index.isdecimal() or int(index) >= len(spec["runs"]):
        raise SweepError(f"task '{index}' is not one of 0-{len(spec['runs']) - 1}: submit the script with sbatch")
    entry = spec["runs"][int(index)]
    run = Run(entry["label"], entry["run_id"], tuple(entry["args"]))
    resume = spec["resume_existing"] or os.environ.get("RESUME_EXISTING") == "1"
    work_dir = spec.get("work_dir", REPO_ROOT)  # a sweep submitted before runs started where the user stands
    commands, results = plan([run], spec["python"], [], resume, work_dir)
    slot = Slot(None, gpu_utils.allowed_cpus()[: slurm_cpus()])
    log = os.path.join(spec["log_dir"], entry["log"])
    return run_local([run], commands, [slot], False, [log], results, work_dir)


class Parser(argparse.ArgumentParser):  # its errors are one line: a SweepError
    def error(self, message: str) -> None:  # type: ignore[override]
        raise SweepError(message + ("; arguments for the runs go after --" if "unrecognized" in message else ""))


def count(minimum: float, kind: type = int):
    """An argparse type: a number of ``kind`` (int or float) of at least ``minimum``."""

    def parse(text: str):
        with contextlib.suppress(ValueError):
            value = kind(text)
            if value >= minimum:  # not NaN
                return value
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"must be {what} of at least {minimum:g}, got '{text}'")

    return parse


def add_run_options(p: argparse.ArgumentParser, per: str) -> None:
    p.add_argument("--work-dir", help="the folder the runs start in, and write runs/ into (default: this one)")
    g = p.add_argument_group("runs at once here (on the CPUs this process may use: taskset -c LIST picks them)")
    g.add_argument("--jobs-per-gpu", type=count(1), help="runs sharing one GPU at once (default 1)")
    g.add_argument("--jobs", type=count(1), help="runs at once without GPUs (default 1)")
    g.add_argument("--cpus-per-run", type=count(1), help="CPUs and threads per run (default: CPUs / runs at once)")
    g = p.add_argument_group(f"SLURM (a job array; --cpus-per-run is --cpus-per-task; per {per})")
    g.add_argument("--slurm", action="store_true", help="write the sbatch script and submit it")
    g.add_argument("--partition", help="sbatch --partition")
    g.add_argument("--time", help="sbatch --time, e.g. 24:00:00")
    g.add_argument("--gpus-per-run", type=count(0), help="sbatch --gres=gpu:N")
    g.add_argument("--mem", help="sbatch --mem, e.g. 32G")
    g.add_argument("--max-parallel", type=count(1), help=f"at most N {per}s at once (the array's %%N)")
    g.add_argument("--account", help="sbatch --account")
    g.add_argument("--sbatch-args", nargs=argparse.REMAINDER, default=[], help="words for sbatch (put it last)")


def check_modes(a: argparse.Namespace, only: Sequence[str] = SLURM_ONLY) -> None:
    if a.slurm and (a.jobs or a.jobs_per_gpu):
        raise SweepError("--jobs and --jobs-per-gpu are for runs here; under --slurm use --max-parallel")
    for option in [f for f in only if getattr(a, f) not in (None, [])][:1] if not a.slurm else []:
        raise SweepError(f"--{option.replace('_', '-')} is a SLURM option; add --slurm (or drop it)")


def build_parser(grid: str) -> Parser:
    p = Parser(prog=f"benchmark/{grid}.sh", allow_abbrev=False, description="Arguments after -- go to every run.")
    if grid == "ppo_atari":
        p.add_argument("--games", default=ATARI_GAMES, help=f"ALE games (default: {ATARI_GAMES})")
        p.add_argument("--all", action="store_true", help="all 57 games of benchmark/atari_lambdas.csv")
    elif grid == "ppo_continuous":
        p.add_argument("--envs", default=MUJOCO_ENVS, help=f"gymnasium env ids (default: {MUJOCO_ENVS})")
        p.add_argument("--all", action="store_true", help=f"also {MUJOCO_MORE}")
        p.add_argument("--presets", default="default fast heavy beast", help="any of: default fast heavy beast worlds")
    else:
        p.add_argument("--sizes", default="10 20", help="board sizes, N or HxW (default: 10 20)")
        p.add_argument("--num-envs", default="256 4096", help="games per run (default: 256 4096)")
    p.add_argument("--seeds", default="1 2 3", help='seeds (default "1 2 3")')
    p.add_argument("--dry-run", action="store_true", help="print every run's command, device, CPUs and threads")
    p.add_argument("--track", action="store_true", help="pass --track (and WANDB_PROJECT_NAME / WANDB_ENTITY) on")
    p.add_argument("--resume-existing", action="store_true", help="skip finished and live runs, continue stopped ones")
    p.add_argument("--log-dir", help="per-run logs and summary (default runs/sweep_logs/<grid>_<time>)")
    add_run_options(p, "run")
    return p


def runs_python() -> str:
    """The runs' interpreter: PYTHON, else the repo's .venv, else python3 on PATH; absolute (SLURM nodes need it)."""
    venv = os.path.join(REPO_ROOT, ".venv", "bin", "python")
    python = os.environ.get("PYTHON") or (venv if os.path.exists(venv) else "python3")
    found = os.path.join(REPO_ROOT, python) if "/" in python else shutil.which(python)
    if not found:
        raise SweepError(f"python interpreter '{python}' not found on PATH; set PYTHON=/path/to/python")
    return found


def sweep_main(grid: str, argv: list[str]) -> int:
    cut = argv.index("--") if "--" in argv else len(argv)
    argv, tail = argv[:cut], dashed(argv[cut + 1 :])
    a = build_parser(grid).parse_args(argv)
    check_modes(a)
    check_words(argv)
    check_words(tail, " after --")
    for flag, instead in {**SET_BY_SWEEP, **GRID_FLAGS[grid]}.items():
        if flag_value(tail, flag) is not None:
            raise SweepError(f"{flag} after -- is set by the sweep; use {instead}")
    runs = grid_runs(grid, a, tail)
    if not runs:
        raise SweepError("nothing to run (an empty list of envs, seeds or settings)")
    check_flags(tail, script_fields(runs[0].args[0]), runs[0].args[0])
    for flag, var in (("--wandb-entity", "WANDB_ENTITY"), ("--wandb-project-name", "WANDB_PROJECT_NAME")):
        if a.track and os.environ.get(var):
            check_words([flag, os.environ[var]], f" ({var})")
            tail = [flag, os.environ[var], *tail]
    tail = ["--track", *tail] if a.track else tail
    python = runs_python()
    # the runs start where the user stands, as a script started by hand does: their runs/ is this folder's
    work_dir = os.path.abspath(a.work_dir or os.getcwd())
    log_dir = os.path.abspath(a.log_dir or f"{work_dir}/runs/sweep_logs/{grid}_{time.strftime('%Y%m%d-%H%M%S')}")
    say(f"[sweep] {grid}: {len(runs)} runs write {work_dir}/runs; logs in {log_dir}")
    if a.slurm:
        return submit_sweep(grid, runs, python, tail, a, log_dir, work_dir)
    slots, pin = make_slots(a, tail)
    say(f"[sweep] {grid}: the scripts of {REPO_ROOT} on {', '.join(sorted({s.device for s in slots}))}")
    commands, results = plan(runs, python, tail, a.resume_existing, work_dir)
    if not a.dry_run:
        make_dir(work_dir, "--work-dir")
        make_dir(log_dir, "--log-dir")
        logs = [os.path.join(log_dir, log_name(i, run.label)) for i, run in enumerate(runs)]
        return run_local(runs, commands, slots, pin, logs, results, work_dir, os.path.join(log_dir, "summary.txt"))
    for k, i in enumerate([i for i in range(len(runs)) if i not in results]):
        slot = slots[k % len(slots)]  # as if the runs ended in the order they started
        say(f"[run {i}] {slot.device}: {shlex.join(slot_prefix(slot.cpus, pin) + slot.command(commands[i]))}")
    say("[dry run] nothing was started")
    return 0


def one_line_errors(main: Callable[..., int]) -> Callable[..., int]:
    """A tool's ``main`` (sweep, tune, speed and the developers'): bad input, a SweepError, is one ``error:`` line and
    exit 2; a Ctrl-C that reaches it is one line and exit 130; never a traceback."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except SweepError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return wrapped


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["task"] and len(argv) == 3:
        return run_task(argv[1], argv[2])
    if not argv or argv[0] not in GRID_FLAGS:
        raise SweepError(f"name the grid first: benchmark/sweep.py {{{','.join(GRID_FLAGS)}}} [options] [-- run args]")
    return sweep_main(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
