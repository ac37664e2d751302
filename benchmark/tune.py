"""Hyperparameter studies on Optuna for the training scripts: trials run in parallel through the sweep engine's slots
(N per GPU, each with its CPUs), or as a SLURM job array whose tasks all attach to one study.

    python benchmark/tune.py ppo_continuous.py --study-name hopper --envs Hopper-v5 --trials 16 --jobs 2 \\
        --param gae-lambda=0.8:0.99 --param learning-rate=1e-4:1e-3:log -- --total-timesteps 200000
    python benchmark/tune.py ppo_continuous.py --study-name hopper ... --slurm --workers 8 --cpus-per-run 4
    python benchmark/tune.py attach --study-name hopper      # one more worker on an existing study (SLURM tasks)
    python benchmark/tune.py report --study-name hopper      # best trials, importances, history (PNGs + markdown)

A parameter is any field of the script's Args: ``NAME=LOW:HIGH`` (uniform; an int field samples ints),
``NAME=LOW:HIGH:log``, ``NAME=LOW:HIGH:STEP``, or choices ``NAME=a,b,c`` (``NAME='64,64|256,256'`` when a value
has commas). A trial runs the script once per env and seed with the trial's values. Its objective is the mean of the
last --last-episodes episodes' returns (``charts/episodic_return`` in the run's TensorBoard event file) at the end of
each run; with several envs each env's score is first normalised to (score - LO) / (HI - LO) (--score-range, else
LO = 0 and HI = the env's reference score in benchmark/reference_scores.csv), then all are averaged.

Pruning: the tuner tails each run's event file as it grows and reports the same objective, on the returns so far,
at --reports evenly spaced steps; Optuna's median or Hyperband pruner compares it with the other trials, and a pruned
trial's runs get SIGTERM (each writes its checkpoint and logs, and frees its slot).

The study lives in its storage (--storage: a journal file, the default, or an RDB URL such as sqlite:///study.db or
postgresql://...), with its settings (the study's user attribute ``tune:config``): running the same command again,
or ``attach``, continues it. A trial whose run crashed is marked FAIL with the reason (``tune:end``). A trial in
flight when its tuner stops (SIGTERM, Ctrl-C, a SLURM time limit), or left RUNNING by a tuner that died (its pid is
gone on this host, or no heartbeat for --stale-after seconds), is marked FAIL and re-queued: the re-queued trial
has the same values and continues the same runs from their checkpoints (``--resume``).
"""

from __future__ import annotations

import argparse
import ast
import csv
import difflib
import glob
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

BENCH = os.path.dirname(os.path.abspath(__file__))
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import sweep  # noqa: E402  (puts the repo root on sys.path: gpu_utils, run_utils)

import gpu_utils  # noqa: E402
import run_utils  # noqa: E402

REPO_ROOT = sweep.REPO_ROOT
RUNS_DIR = os.path.join(REPO_ROOT, "runs")
RETURN_TAG = "charts/episodic_return"
STUDY_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*(_[A-Za-z0-9.-]+)*$")
# fields the tuner sets itself, or that say how rather than what a run trains
NOT_TUNABLE = {"exp_name", "seed", "env_id", "session", "cuda_offset", "resume", "eval_checkpoint", "eval_episodes"}
NOT_TUNABLE |= {"track", "wandb_project_name", "wandb_entity", "capture_video", "progress_bar", "checkpoint_every"}
NOT_PASSED = {"seed": "--seeds", "env_id": "--envs", "exp_name": "--study-name", "resume": "a rerun of the study"}
NOT_PASSED |= {"session": "--jobs-per-gpu", "eval_checkpoint": "the script itself"}
HEARTBEAT_S = 60.0  # how often a tuner stamps its running trials (user attribute tune:heartbeat)
POLL_S = 1.0
SLURM_OPTIONS = ("partition", "time", "gpus_per_run", "mem", "max_parallel", "account")
KIND_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "text"}


class TuneError(ValueError):
    """Bad input; the message is one line that says what to change (printed as ``error: ...``, exit 2)."""


def say(text: str) -> None:
    print(f"[tune] {text}", flush=True)


# ---------------------------------------------------------------- the script's Args


@dataclass(frozen=True)
class Field:
    """One field of a script's Args: its kind (float, int, bool or str), its Literal choices, and its default."""

    name: str
    kind: str
    choices: tuple | None = None
    default: object = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def script_fields(script: str) -> dict[str, Field]:
    """The fields of ``class Args`` in the script, read from its source (nothing is imported)."""
    path = os.path.join(REPO_ROOT, script)
    if not script.endswith(".py") or not os.path.isfile(path):
        raise TuneError(f"no training script {script} in {REPO_ROOT}; name one, e.g. ppo_continuous.py")
    tree = ast.parse(open(path).read(), path)
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Args"]
    if not found:
        raise TuneError(f"{script} has no `class Args`; tune.py tunes scripts whose flags come from one")
    fields = {}
    for node in found[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        annotation = ast.unparse(node.annotation)
        try:
            default = ast.literal_eval(node.value) if node.value is not None else None
        except ValueError:  # an expression such as the script's file name
            default = None
        choices = None
        literal = re.search(r"Literal\[(.*?)\]", annotation)
        if literal:
            choices = tuple(ast.literal_eval(f"({literal.group(1)},)"))
        kind = next((k for k in ("bool", "float", "int") if re.search(rf"\b{k}\b", annotation)), "str")
        fields[node.target.id] = Field(node.target.id, "str" if choices else kind, choices, default)
    return fields


def find_field(name: str, fields: dict[str, Field], script: str) -> Field:
    """The field a flag name (dashes or underscores, with or without --) names; a typo gets the nearest names."""
    key = name.removeprefix("--").replace("-", "_")
    if key in fields:
        return fields[key]
    near = difflib.get_close_matches(key, list(fields), n=2)
    hint = f" (did you mean {' or '.join(fields[n].flag for n in near)}?)" if near else ""
    raise TuneError(f"{script} has no flag --{key.replace('_', '-')}{hint}")


# ---------------------------------------------------------------- the search space


@dataclass(frozen=True)
class Param:
    """One searched flag: a range (low, high, log scale or step) or a list of choices."""

    name: str  # the flag without --, as Optuna and the reports show it: learning-rate
    field: Field
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple | None = None
    spec: str = ""  # the NAME=... text it came from


def convert(text: str, f: Field, what: str) -> object:
    """A value of the field's kind from its text: 3e-4 for a float, 128 for an int, true/false for a bool."""
    text = text.strip()
    try:
        if f.kind == "bool":
            if text.lower() not in ("true", "false"):
                raise ValueError
            value: object = text.lower() == "true"
        elif f.kind == "int":
            value = int(text)
        elif f.kind == "float":
            value = float(text)
        else:
            value = text
    except ValueError:
        raise TuneError(f"{what}: {f.flag} takes {KIND_WORDS[f.kind]}, not '{text}'") from None
    if f.choices and value not in f.choices:
        raise TuneError(f"{what}: {f.flag} takes one of {', '.join(map(str, f.choices))}, not '{text}'")
    return value


def parse_param(spec: str, fields: dict[str, Field], script: str) -> Param:
    if "=" not in spec:
        raise TuneError(f"--param {spec}: write NAME=LOW:HIGH[:log|:STEP] or NAME=a,b,c, e.g. gae-lambda=0.8:0.99")
    name, text = (part.strip() for part in spec.split("=", 1))
    f = find_field(name, fields, script)
    what = f"--param {spec}"
    if f.name in NOT_TUNABLE:
        instead = NOT_PASSED.get(f.name)
        raise TuneError(f"{what}: {f.flag} is not a hyperparameter" + (f"; use {instead}" if instead else ""))
    name = f.flag[2:]
    if "|" in text or ":" not in text:  # choices
        words = text.split("|") if "|" in text else text.split(",")
        choices = tuple(convert(word, f, what) for word in words)
        if len(choices) < 2 or len(set(choices)) != len(choices):
            raise TuneError(f"{what}: give two or more different choices, e.g. {name}=a,b (or a|b)")
        return Param(name, f, choices=choices, spec=f"{name}={text}")
    if f.kind not in ("int", "float"):
        raise TuneError(
            f"{what}: {f.flag} is a {f.kind} flag; give choices, e.g. {name}="
            + "|".join(map(str, f.choices or (("true", "false") if f.kind == "bool" else ("a", "b"))))
        )
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise TuneError(f"{what}: write LOW:HIGH, LOW:HIGH:log or LOW:HIGH:STEP")
    low, high = (convert(part, f, what) for part in parts[:2])
    log = len(parts) == 3 and parts[2] == "log"
    step = convert(parts[2], f, what) if len(parts) == 3 and not log else None
    if not low < high:
        raise TuneError(f"{what}: LOW must be below HIGH")
    if log and low <= 0:
        raise TuneError(f"{what}: a log scale needs LOW > 0")
    if step is not None and (step <= 0 or log):
        raise TuneError(f"{what}: STEP must be positive (and cannot go with log)")
    return Param(name, f, low, high, log, step, spec=f"{name}={text}")


def suggest(trial, p: Param) -> object:
    if p.choices is not None:
        return trial.suggest_categorical(p.name, list(p.choices))
    if p.field.kind == "int":
        return trial.suggest_int(p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    return trial.suggest_float(p.name, p.low, p.high, step=p.step, log=p.log)


def in_space(p: Param, value: object) -> bool:
    if p.choices is not None:
        return value in p.choices
    return p.low <= value <= p.high


def flag_args(f: Field, value: object) -> list[str]:
    """The words that pass ``value`` to the script: --no-anneal-lr for a false bool, floats in full precision."""
    if f.kind == "bool":
        return [f.flag if value else "--no-" + f.flag[2:]]
    return [f.flag, repr(value) if isinstance(value, float) else str(value)]


def parse_enqueue(text: str, params: list[Param], fields: dict[str, Field], script: str) -> dict[str, object]:
    """``defaults`` (the script's defaults of the searched flags) or ``NAME=VALUE NAME=VALUE`` for the searched
    flags: a trial to run first."""
    by_name = {p.name: p for p in params}
    values = {}
    if text.strip() == "defaults":
        for p in params:
            if p.field.default is None:
                raise TuneError(f"--enqueue defaults: {p.field.flag} has no fixed default in {script}; give its value")
            values[p.name] = p.field.default
    else:
        for word in text.split():
            name, _, value = word.partition("=")
            f = find_field(name, fields, script)
            p = by_name.get(f.flag[2:])
            if p is None or not value:
                raise TuneError(f"--enqueue {text}: give NAME=VALUE for searched flags ({', '.join(by_name)})")
            values[p.name] = convert(value, f, f"--enqueue {text}")
    for name, value in values.items():
        if not in_space(by_name[name], value):
            raise TuneError(f"--enqueue {text}: {name}={value} is outside its search space {by_name[name].spec}")
    missing = [name for name in by_name if name not in values]
    if missing:
        raise TuneError(f"--enqueue {text}: give every searched flag (missing: {', '.join(missing)})")
    return values


# ---------------------------------------------------------------- the objective: returns read as the event file grows


class RunReturns:
    """The finished episodes' returns of one run folder, read as its TensorBoard event files grow (each file is
    tailed: a read picks up only what was written since the last). A resumed run has one file per process; what a
    process logged past the first scalar step of the next one (work redone after a crash) is dropped, as
    benchmark/report.py does."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self._loaders: dict[str, object] = {}
        self._returns: dict[str, list[tuple[int, float]]] = {}
        self._first: dict[str, int] = {}
        self.last_step = 0  # the highest step of any scalar: how far the run has come

    def update(self) -> None:
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat.proto.event_pb2 import Event

        names = sorted(n for n in os.listdir(self.run_dir) if n.startswith("events.out.tfevents"))
        for name in names:
            if name not in self._loaders:
                self._loaders[name] = RawEventFileLoader(os.path.join(self.run_dir, name))
                self._returns[name] = []
            for record in self._loaders[name].Load():
                event = Event.FromString(record)
                scalars = [v for v in event.summary.value if v.HasField("simple_value")]
                if not scalars:  # texts such as the hyperparameters table, logged at step 0
                    continue
                self._first.setdefault(name, event.step)
                self.last_step = max(self.last_step, event.step)
                for value in scalars:
                    if value.tag == RETURN_TAG:
                        self._returns[name].append((event.step, value.simple_value))

    def returns(self, until: int | None = None) -> list[float]:
        """Returns of the episodes that ended at or before step ``until`` (all when None), in order."""
        parts = sorted(self._first, key=lambda name: (self._first[name], name))
        kept: list[tuple[int, float]] = []
        for i, name in enumerate(parts):
            cut = self._first[parts[i + 1]] if i + 1 < len(parts) else None
            kept += [r for r in self._returns[name] if cut is None or r[0] <= cut]
        kept.sort(key=lambda r: r[0])
        return [value for step, value in kept if until is None or step <= until]


def last_mean(returns: Sequence[float], last_n: int) -> float | None:
    return float(sum(returns[-last_n:]) / len(returns[-last_n:])) if returns else None


def reference_ranges(envs: Sequence[str], given: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    """LO and HI of each env's normalised score: --score-range, else 0 and the mean of the env's published scores in
    benchmark/reference_scores.csv."""
    refs: dict[str, list[float]] = {}
    with open(os.path.join(BENCH, "reference_scores.csv"), newline="") as f:
        for row in csv.DictReader(f):
            refs.setdefault(row["env"], []).append(float(row["score"]))
    ranges = {}
    for env in envs:
        if env in given:
            ranges[env] = given[env]
        elif env in refs:
            ranges[env] = (0.0, sum(refs[env]) / len(refs[env]))
        else:
            raise TuneError(f"no reference score for {env} to normalise it by; give --score-range {env}=LO:HI")
    return ranges


def normalise(score: float, env: str | None, ranges: dict[str, list[float]]) -> float:
    if env not in ranges:
        return score
    lo, hi = ranges[env]
    return (score - lo) / (hi - lo)


# ---------------------------------------------------------------- the study and its storage


def storage_url(text: str) -> str:
    """An RDB URL as given, with a relative SQLite path made absolute; else a journal file's absolute path."""
    if "://" not in text:
        return os.path.abspath(text)
    m = re.match(r"^sqlite:///(?!/)(.+)$", text)
    return f"sqlite:///{os.path.abspath(m.group(1))}" if m else text


def open_storage(url: str):
    import optuna

    try:
        if "://" not in url:
            from optuna.storages.journal import JournalFileBackend

            os.makedirs(os.path.dirname(url), exist_ok=True)
            return optuna.storages.JournalStorage(JournalFileBackend(url))
        kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite:") else {}
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except ImportError as exc:
        raise TuneError(f"storage {url.split('://')[0]}: {exc}; install its driver (e.g. psycopg2-binary)") from None
    except Exception as exc:  # noqa: BLE001 - a bad URL, an unreachable server: one line that names the storage
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise TuneError(f"cannot open storage {url}: {first}") from None


def make_sampler(config: dict, worker_index: int, trials_so_far: int):
    """Optuna's sampler for one worker. With --sampler-seed, each worker and each restart of a study gets its own
    seed (seed + 1000 x worker + trials so far): a rerun would otherwise draw the same points again."""
    import optuna

    seed = config["sampler_seed"]
    seed = None if seed is None else seed + 1000 * worker_index + trials_so_far
    if config["sampler"] == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    startup = min(10, max(2, config["trials"] // 3))  # random trials before TPE models the results
    return optuna.samplers.TPESampler(n_startup_trials=startup, seed=seed, constant_liar=True)


def report_steps(config: dict) -> list[int]:
    """The steps at which a trial reports its objective so far (not the last: that is the trial's value)."""
    interval = config["total_timesteps"] // config["reports"]
    return [interval * k for k in range(1, config["reports"])] if interval else []


def make_pruner(config: dict):
    import optuna

    total = config["total_timesteps"]
    warmup = int(config["prune_warmup"] * total)
    if config["pruner"] == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=config["prune_startup"], n_warmup_steps=warmup)
    if config["pruner"] == "hyperband":
        steps = report_steps(config) or [total]
        first = next((s for s in steps if s >= warmup), steps[-1])
        return optuna.pruners.HyperbandPruner(min_resource=first, max_resource=total, reduction_factor=3)
    return optuna.pruners.NopPruner()


def load_study(storage, name: str, config: dict | None, worker_index: int = 0):
    """The study ``name`` in ``storage``: created with ``config`` when new; else its stored config, which must
    match ``config`` (when given) except for the number of trials."""
    import optuna

    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        if config is None:
            raise TuneError(f"no study {name} in this storage; start it with benchmark/tune.py SCRIPT ...") from None
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)
    stored = study.user_attrs.get("tune:config")
    if stored is None:
        if config is None:
            raise TuneError(f"study {name} was not made by tune.py (no tune:config); start a new study")
        study.set_user_attr("tune:config", config)
        stored = config
    elif config is not None:
        for key, value in config.items():
            if key != "trials" and stored.get(key) != value:
                raise TuneError(
                    f"study {name} was started with {key} = {stored.get(key)!r}, not {value!r}; run it with the "
                    "same settings to continue it, or give a new --study-name"
                )
        if stored["trials"] != config["trials"]:
            study.set_user_attr("tune:config", config)
        stored = config
    study.sampler = make_sampler(stored, worker_index, len(study.get_trials(deepcopy=False)))
    study.pruner = make_pruner(stored)
    return study, stored


def counted(trials) -> int:
    """The study's trials that count towards --trials: all but the failed ones a re-queued trial continues."""
    from optuna.trial import TrialState

    continued = {t.user_attrs.get("tune:continues") for t in trials}
    return sum(1 for t in trials if not (t.state == TrialState.FAIL and t.number in continued))


def requeue(study, frozen, reason: str) -> int | None:
    """Mark a RUNNING trial FAIL with ``reason`` and queue a trial with its values that continues its runs (and
    keeps its reported values). Returns the new trial's number, or None when another tuner got there first."""
    import optuna
    from optuna.trial import TrialState

    try:
        study._storage.set_trial_user_attr(frozen._trial_id, "tune:end", reason)
        study.tell(frozen.number, state=TrialState.FAIL)
    except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
        return None  # finished meanwhile, by its own tuner or another one
    origin = frozen.user_attrs.get("tune:origin", frozen.number)
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.WAITING,
            params=frozen.params,
            distributions=frozen.distributions,
            user_attrs={"tune:origin": origin, "tune:continues": frozen.number},
            intermediate_values=frozen.intermediate_values,
        )
    )
    trials = study.get_trials(deepcopy=False)
    return next(t.number for t in trials if t.user_attrs.get("tune:continues") == frozen.number)


def tuner_alive(pid: int) -> bool:
    """True when ``pid`` is a live tune.py process on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"tune.py" in f.read()
    except OSError:
        return True  # no /proc: a live pid is taken for the tuner


def recover_stale(study, stale_after: float) -> list[str]:
    """Re-queue (``requeue``) the RUNNING trials whose tuner is gone: its pid is dead on this host, or it stamped
    no heartbeat for ``stale_after`` seconds. Returns a line per trial re-queued."""
    from optuna.trial import TrialState

    host, now, lines = socket.gethostname(), time.time(), []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        attrs = t.user_attrs
        beat = attrs.get("tune:heartbeat") or (t.datetime_start.timestamp() if t.datetime_start else now)
        who = f"{attrs.get('tune:host', '?')} pid {attrs.get('tune:pid', '?')}"
        if attrs.get("tune:host") == host and attrs.get("tune:pid") and not tuner_alive(attrs["tune:pid"]):
            why = f"its tuner ({who}) is gone"
        elif now - beat > stale_after:
            why = f"no heartbeat from its tuner ({who}) for {now - beat:.0f} s"
        else:
            continue
        new = requeue(study, t, f"stale: {why}")
        if new is not None:
            lines.append(f"trial {t.number} was left RUNNING ({why}): marked FAIL, continued as trial {new}")
    return lines


# ---------------------------------------------------------------- one worker: trials in slots


@dataclass
class TrialRun:
    """One run (env x seed) of a trial: its command, log, run folder and process."""

    env: str | None
    seed: str
    exp: str  # the trial's --exp-name: <study>_t<first trial number>
    run: sweep.Run
    log: str
    resume: str | None = None
    run_dir: str | None = None
    dirs_before: set = field(default_factory=set)
    proc: object = None
    slot: sweep.Slot | None = None
    reader: RunReturns | None = None
    signalled: bool = False  # the tuner sent it SIGTERM (pruned, or the tuner stops)
    outcome: str = ""  # finished, stopped, or why it failed; empty while queued or running

    @property
    def pattern(self) -> str:
        tag = self.env.replace("/", "_") if self.env else "*"
        return f"{tag}__{self.exp}__{self.seed}__*"


@dataclass
class ActiveTrial:
    """A trial this worker runs: its runs, the steps it reported, and whether it was pruned or failed."""

    trial: object  # optuna.Trial
    runs: list[TrialRun]
    reported: set = field(default_factory=set)  # steps whose objective the study has
    pruned_at: int | None = None
    failed: str = ""


def checkpoint_status(run_dir: str | None) -> str | None:
    path = os.path.join(run_dir, "checkpoint.pt") if run_dir else ""
    if not path or not os.path.isfile(path):
        return None
    try:
        return run_utils.read_checkpoint(path).get("status")
    except (ValueError, FileNotFoundError):
        return None


def last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def value_args(config: dict, values: dict) -> list[str]:
    """A trial's values as the script's flags, then the study's fixed arguments."""
    fields = script_fields(config["script"])
    words = []
    for name, value in values.items():
        words += flag_args(find_field(name, fields, config["script"]), value)
    return words + list(config["args"])


def trial_command(config: dict, values: dict, env: str | None = None, seed: str | None = None) -> list[str]:
    """The command that reruns a trial's run: the env and seed when given, the values, the fixed arguments."""
    words = ["python", config["script"]]
    if env:
        words += ["--env-id", env]
    if seed is not None:
        words += ["--seed", seed]
    return words + value_args(config, values)


class Worker:
    """Runs trials of one study in this process's slots until the study has its trials or a signal stops it."""

    def __init__(
        self,
        study,
        config: dict,
        slots: list[sweep.Slot],
        slots_per_lane: int,
        gpus: int,
        pin: bool,
        python: str,
        log_dir: str,
        stale_after: float,
        worker: str,
    ) -> None:
        self.study, self.config, self.slots = study, config, slots
        self.slots_per_lane, self.gpus, self.pin = slots_per_lane, gpus, pin
        self.python, self.log_dir, self.stale_after, self.worker = python, log_dir, stale_after, worker
        fields = script_fields(config["script"])
        self.params = [parse_param(spec, fields, config["script"]) for spec in config["params"]]
        self.steps = report_steps(config)
        self.active: list[ActiveTrial] = []
        self.stopper = sweep.Stopper()
        self.exhausted = False  # the study has all its trials: ask for no more
        self.last_beat = self.last_stale_check = 0.0

    # -- trials

    def open_trial(self) -> ActiveTrial | None:
        import optuna

        trials = self.study.get_trials(deepcopy=False)
        waiting = any(t.state == optuna.trial.TrialState.WAITING for t in trials)
        if not waiting and counted(trials) >= self.config["trials"]:
            self.exhausted = True
            return None
        trial = self.study.ask()
        values = {p.name: suggest(trial, p) for p in self.params}
        origin = trial.user_attrs.get("tune:origin", trial.number)
        for key, value in (
            ("tune:host", socket.gethostname()),
            ("tune:pid", os.getpid()),
            ("tune:worker", self.worker),
            ("tune:heartbeat", int(time.time())),
        ):
            trial.set_user_attr(key, value)
        at = ActiveTrial(trial, [])
        exp = f"{self.study.study_name}_t{origin:03d}"
        for env in self.config["envs"] or [None]:
            for seed in self.config["seeds"]:
                args = [self.config["script"], *(["--env-id", env] if env else []), "--seed", seed, "--exp-name", exp]
                label = f"t{origin:03d}_{env.replace('/', '_') if env else 'run'}_seed{seed}"
                log = os.path.join(self.log_dir, "logs", f"{label}.log")
                run = sweep.Run(label, exp, tuple(args + value_args(self.config, values)))
                at.runs.append(TrialRun(env, seed, exp, run, log))
        continues = trial.user_attrs.get("tune:continues")
        if continues is not None:  # a re-queued trial: its runs continue, its reported values stay
            at.reported = set(self.study._storage.get_trial(trial._trial_id).intermediate_values)
            self.resume_runs(at)
        text = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
        again = f" (continues trial {continues}'s runs)" if continues is not None else ""
        say(f"trial {trial.number} start{again}: {text}")
        self.active.append(at)
        return at

    def resume_runs(self, at: ActiveTrial) -> None:
        """A re-queued trial: each run continues from its run folder's checkpoint, is read as it is when finished,
        or starts anew when it never wrote a checkpoint."""
        for r in at.runs:
            dirs = sorted(glob.glob(os.path.join(RUNS_DIR, r.pattern)), reverse=True)
            parsed = sweep.parse_run_name(os.path.basename(dirs[0])) if dirs else None
            if not parsed:
                continue
            decision = sweep.decide_resume(RUNS_DIR, sweep.run_id(parsed[0], parsed[1], parsed[2]))
            if decision.action == "resume":
                r.resume, r.run_dir = decision.checkpoint, os.path.dirname(decision.checkpoint)
            elif decision.action == "skip" and checkpoint_status(os.path.dirname(decision.checkpoint)) == "finished":
                r.run_dir, r.outcome = os.path.dirname(decision.checkpoint), "finished"
                r.reader = RunReturns(r.run_dir)
            elif decision.action != "fresh":
                self.fail(at, f"run {r.run.label} cannot continue: {decision.note}")

    def start(self, at: ActiveTrial, r: TrialRun, slot: sweep.Slot) -> None:
        lane = slot.index // self.slots_per_lane
        command = sweep.run_command(self.python, r.run, lane if self.gpus else None, [], r.resume)
        if not r.resume:
            r.dirs_before = set(glob.glob(os.path.join(RUNS_DIR, r.pattern)))
        os.makedirs(os.path.dirname(r.log), exist_ok=True)
        with open(r.log, "a") as log:
            prefix = sweep.slot_prefix(slot.cpus, self.pin)
            log.write(f"# {sweep.stamp()} trial {at.trial.number} slot {slot.index}: {shlex.join(prefix + command)}\n")
            log.flush()
            try:
                r.proc = sweep.start_run(command, slot.cpus, self.pin, log, die_with_parent=True)
            except OSError as exc:
                log.write(f"error: cannot start {command[0]}: {exc}\n")
                r.outcome = f"run {r.run.label} could not start: {exc}"
                self.fail(at, r.outcome)
                return
        r.slot, slot.proc = slot, r.proc
        self.stopper.started(r.proc)

    def ended(self, at: ActiveTrial, r: TrialRun) -> None:
        """A run's process exited: decide its outcome from its exit code and checkpoint."""
        rc = r.proc.returncode if r.proc.returncode >= 0 else 128 - r.proc.returncode
        r.slot.proc, r.slot = None, None
        self.find_run_dir(r)
        status = checkpoint_status(r.run_dir)
        if status == "finished":
            r.outcome = "finished"
        elif r.signalled or self.stopper.stopping:
            r.outcome = "stopped"
        elif status == "diverged":
            r.outcome = f"run {r.run.label} diverged (NaN or infinite weights): see {r.log}"
        elif rc == 0:
            r.outcome = f"run {r.run.label} was stopped from outside before its end (checkpoint: {status})"
        else:
            r.outcome = f"run {r.run.label} exited with code {rc}: {last_line(r.log)} (log {r.log})"
        if r.outcome not in ("finished", "stopped"):
            self.fail(at, r.outcome)
        if r.reader:
            r.reader.update()

    def find_run_dir(self, r: TrialRun) -> None:
        if r.run_dir is None:
            new = sorted(set(glob.glob(os.path.join(RUNS_DIR, r.pattern))) - r.dirs_before)
            if new:
                r.run_dir = new[-1]
        if r.run_dir and r.reader is None:
            r.reader = RunReturns(r.run_dir)

    def fail(self, at: ActiveTrial, why: str) -> None:
        """The trial fails (the first reason counts): its other runs stop or never start."""
        at.failed = at.failed or why
        self.stop_trial(at)

    def stop_trial(self, at: ActiveTrial) -> None:
        """SIGTERM to the trial's live runs (each checkpoints and exits); its queued runs never start."""
        for r in at.runs:
            if r.proc is not None and r.proc.poll() is None:
                r.signalled = True
                sweep.Stopper.term(r.proc)
            elif r.proc is None and not r.outcome:
                r.outcome = "not started"

    def value(self, at: ActiveTrial, until: int | None) -> tuple[float | None, dict[str, float]]:
        """The objective over the trial's runs on the episodes that ended by ``until`` (all when None), and each
        env's raw score (the mean over seeds); None while a run has no finished episode."""
        scores: dict[str, list[float]] = {}
        normalised = []
        for r in at.runs:
            score = last_mean(r.reader.returns(until), self.config["last_episodes"]) if r.reader else None
            if score is None:
                return None, {}
            scores.setdefault(r.env or "default env", []).append(score)
            normalised.append(normalise(score, r.env, self.config["score_ranges"]))
        return sum(normalised) / len(normalised), {env: sum(v) / len(v) for env, v in scores.items()}

    def progress(self, at: ActiveTrial) -> None:
        """Report the objective at each report step all the trial's runs have passed; prune when told to."""
        for r in at.runs:
            if r.proc is not None and r.outcome == "":
                self.find_run_dir(r)
            if r.reader and r.outcome == "":
                r.reader.update()
        if at.pruned_at is not None or at.failed:
            return
        done = {"finished": math.inf}
        reached = min(done.get(r.outcome, r.reader.last_step if r.reader else 0) for r in at.runs)
        for step in self.steps:
            if step > reached or step in at.reported:
                continue
            value, _ = self.value(at, step)
            if value is None:
                continue
            at.trial.report(value, step)
            at.reported.add(step)
            if at.trial.should_prune():
                at.pruned_at = step
                say(f"trial {at.trial.number} pruned at step {step:,}: {value:.4g} (its runs get SIGTERM)")
                self.stop_trial(at)
                return

    def close(self, at: ActiveTrial) -> None:
        """All the trial's runs have ended: tell the study how the trial ended."""
        import optuna

        self.active.remove(at)
        try:
            self.tell(at)
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError) as exc:  # another tuner took it as stale
            say(f"trial {at.trial.number} was ended meanwhile by another tuner ({exc}); its result is not recorded")

    def tell(self, at: ActiveTrial) -> None:
        from optuna.trial import TrialState

        number = at.trial.number
        if at.pruned_at is not None:
            at.trial.set_user_attr("tune:end", f"pruned at step {at.pruned_at}")
            self.study.tell(at.trial, state=TrialState.PRUNED)
        elif at.failed:
            at.trial.set_user_attr("tune:end", at.failed)
            self.study.tell(at.trial, state=TrialState.FAIL)
            say(f"trial {number} FAILED: {at.failed}")
        elif all(r.outcome == "finished" for r in at.runs):
            value, scores = self.value(at, None)
            if value is None:
                at.trial.set_user_attr("tune:end", "a run finished without a finished episode")
                self.study.tell(at.trial, state=TrialState.FAIL)
                say(f"trial {number} FAILED: a run finished without a finished episode")
            else:
                at.trial.set_user_attr("tune:scores", scores)
                at.trial.set_user_attr("tune:run_dirs", [os.path.relpath(r.run_dir, REPO_ROOT) for r in at.runs])
                self.study.tell(at.trial, value)
                best = self.study.best_trial
                say(f"trial {number} complete: {value:.4g} (best: trial {best.number}, {best.value:.4g})")
        else:  # the tuner stops: the runs wrote their checkpoints; a re-queued trial continues them
            frozen = self.study._storage.get_trial(at.trial._trial_id)
            new = requeue(self.study, frozen, "stopped with its tuner; continued by a re-queued trial")
            say(f"trial {number} stopped with the tuner; its runs continue as trial {new} when the study resumes")

    # -- the loop

    def run(self) -> int:
        for line in recover_stale(self.study, self.stale_after):
            say(line)
        self.stopper.install()
        while True:
            for at in list(self.active):
                for r in at.runs:
                    if r.proc is not None and r.slot is not None and r.proc.poll() is not None:
                        self.ended(at, r)
                    elif r.proc is None and not r.outcome and self.stopper.stopping:
                        r.outcome = "not started"
                self.progress(at)
                if all(r.outcome for r in at.runs):
                    self.close(at)
            now = time.time()
            if now - self.last_beat > HEARTBEAT_S:
                self.last_beat = now
                for at in self.active:
                    try:
                        at.trial.set_user_attr("tune:heartbeat", int(now))
                    except Exception:  # noqa: BLE001 - ended meanwhile by another tuner: close() says so
                        pass
            if not self.stopper.stopping:
                self.fill_slots()
            if not self.active and (self.stopper.stopping or self.exhausted):
                break
            time.sleep(POLL_S)
        return 130 if self.stopper.stopping else 0

    def fill_slots(self) -> None:
        for slot in self.slots:
            if slot.proc is not None:
                continue
            queued = [
                (at, r)
                for at in self.active
                if not at.failed and at.pruned_at is None
                for r in at.runs
                if r.proc is None and not r.outcome
            ]
            if not queued and not self.exhausted:
                if time.time() - self.last_stale_check > HEARTBEAT_S:  # a worker that died elsewhere
                    self.last_stale_check = time.time()
                    for line in recover_stale(self.study, self.stale_after):
                        say(line)
                at = self.open_trial()
                queued = [(at, r) for r in at.runs if not r.outcome] if at and not at.failed else []
            if not queued:
                return
            self.start(*queued[0], slot)


# ---------------------------------------------------------------- the report


def best_table(study, config: dict, top: int) -> tuple[list[str], list[str]]:
    """The best complete trials as a markdown table (value, per-env scores, values, command) and as plain lines."""
    from optuna.trial import TrialState

    done = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: -t.value)[:top]
    names = [spec.split("=")[0] for spec in config["params"]]
    several = len(config["envs"]) > 1
    envs = config["envs"] if several else []
    head = ["rank", "trial", "value", *envs, *names, "command"]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    plain = []
    one_env = config["envs"][0] if len(config["envs"]) == 1 else None
    one_seed = config["seeds"][0] if len(config["seeds"]) == 1 else None
    for rank, t in enumerate(done, 1):
        scores = t.user_attrs.get("tune:scores", {})
        cells = [str(rank), str(t.number), f"{t.value:.4g}", *(f"{scores.get(e, float('nan')):.1f}" for e in envs)]
        cells += [f"{t.params[n]:.4g}" if isinstance(t.params[n], float) else str(t.params[n]) for n in names]
        command = shlex.join(trial_command(config, t.params, one_env, one_seed))
        md.append("| " + " | ".join(cells + [f"`{command}`"]) + " |")
        plain.append(f"{rank:>2}. trial {t.number:<4} {t.value:<10.4g} {command}")
    return md, plain


def write_report(study, config: dict, storage: str, out_dir: str, top: int = 10) -> str:
    """Print the best trials; write report.md with history.png, importances.png and intermediate.png in out_dir."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.trial import TrialState

    os.makedirs(out_dir, exist_ok=True)
    trials = study.get_trials(deepcopy=False)
    by_state = {s: sum(1 for t in trials if t.state == s) for s in TrialState}
    continued = {t.user_attrs.get("tune:continues") for t in trials}
    requeued = sum(1 for t in trials if t.state == TrialState.FAIL and t.number in continued)
    counts = (
        f"{len(trials)} trials: {by_state[TrialState.COMPLETE]} complete, {by_state[TrialState.PRUNED]} pruned, "
        f"{by_state[TrialState.FAIL] - requeued} failed, {requeued} stopped and continued by a re-queued trial, "
        f"{by_state[TrialState.RUNNING]} running, {by_state[TrialState.WAITING]} waiting"
    )
    md_table, plain = best_table(study, config, top)
    say(f"study {study.study_name}: {counts}")
    if plain:
        envs, seeds = config["envs"], config["seeds"]
        if len(envs) > 1 or len(seeds) > 1:
            runs = f"--env-id {' / '.join(envs) or '(its default)'} x --seed {' / '.join(seeds)}"
            say(f"each trial ran its command with {runs}")
        say("best trials (value, command):")
        for line in plain:
            print(f"  {line}", flush=True)
    written = []
    importances: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the plots are marked experimental
        plots = [("history.png", optuna.visualization.matplotlib.plot_optimization_history)]
        plots.append(("intermediate.png", optuna.visualization.matplotlib.plot_intermediate_values))
        if by_state[TrialState.COMPLETE] >= 2:
            try:
                evaluator = optuna.importance.PedAnovaImportanceEvaluator()
                importances = optuna.importance.get_param_importances(study, evaluator=evaluator)
                plots.append(("importances.png", optuna.visualization.matplotlib.plot_param_importances))
            except (ValueError, RuntimeError) as exc:
                say(f"no parameter importances: {exc}")
        for name, plot in plots:
            try:
                ax = plot(study, evaluator=evaluator) if name == "importances.png" else plot(study)
            except (ValueError, RuntimeError) as exc:
                say(f"no {name}: {exc}")
                continue
            ax.figure.set_size_inches(7, 4.5)
            ax.figure.savefig(os.path.join(out_dir, name), dpi=90, bbox_inches="tight")
            plt.close(ax.figure)
            written.append(name)
    lines = [f"# Study {study.study_name}", ""]
    lines += [
        f"`{config['script']}` on {', '.join(config['envs']) or 'its default env'}, seed"
        f"{'s' * (len(config['seeds']) > 1)} {' '.join(config['seeds'])}; {counts}. Storage "
        f"`{storage.replace(REPO_ROOT + os.sep, '')}`; written {sweep.stamp()} on "
        f"{socket.gethostname()}.",
        "",
    ]
    ranges = config["score_ranges"]
    norm = ""
    if ranges:
        norm = (
            " normalised per env as (score - LO) / (HI - LO) ("
            + ", ".join(f"{env}: {lo:g} to {hi:g}" for env, (lo, hi) in ranges.items())
            + "),"
        )
    lines += [
        f"Objective: each run's mean return over its last {config['last_episodes']} episodes (`{RETURN_TAG}`),"
        f"{norm} averaged over the trial's runs. Search space: "
        + ", ".join(f"`{spec}`" for spec in config["params"])
        + f". Fixed arguments: `{shlex.join(config['args']) or 'none'}`. Sampler {config['sampler']}, pruner "
        f"{config['pruner']} (from {config['prune_warmup']:.0%} of the run, on reports every "
        f"{config['total_timesteps'] // config['reports']:,} steps).",
        "",
    ]
    lines += ["## Best trials", "", *md_table, ""]
    if importances:
        lines += [
            "## Parameter importances",
            "",
            f"Optuna's PED-ANOVA on the {by_state[TrialState.COMPLETE]} "
            "complete trials: how much of the spread of their values each parameter explains (rough with "
            "few trials).",
            "",
            "| parameter | importance |",
            "|---|---|",
        ]
        lines += [f"| {name} | {value:.3f} |" for name, value in importances.items()]
        lines += ["", "![importances](importances.png)", ""]
    if "history.png" in written:
        lines += ["## Optimisation history", "", "![history](history.png)", ""]
    if "intermediate.png" in written:
        lines += ["## Learning curves as the pruner saw them", "", "![intermediate values](intermediate.png)", ""]
    lines += ["## All trials", "", "| trial | state | value | values | end |", "|---|---|---|---|---|"]
    for t in trials:
        value = f"{t.value:.4g}" if t.value is not None else ""
        values = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in t.params.items())
        lines.append(f"| {t.number} | {t.state.name} | {value} | {values} | {t.user_attrs.get('tune:end', '')} |")
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    say(f"report: {path} ({', '.join(written) or 'no plots'})")
    return path


# ---------------------------------------------------------------- command line


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise TuneError(message)


def add_runtime_options(p: argparse.ArgumentParser) -> None:
    """Where this worker runs its trials: the options of a local sweep."""
    g = p.add_argument_group("slots (as in benchmark/sweep.py)")
    g.add_argument("--jobs", type=int, help="runs at once on a machine without GPUs (default 1)")
    g.add_argument("--jobs-per-gpu", type=int, help="runs sharing one GPU at once (default 1)")
    g.add_argument("--cpus", help="CPUs the tuner may use, e.g. 0-15 (default: all it may use)")
    g.add_argument("--cpus-per-run", type=int, help="CPUs and threads per run (default: the CPUs / runs at once)")
    g.add_argument(
        "--stale-after",
        type=float,
        default=600.0,
        help="seconds without a heartbeat after which another tuner's RUNNING trial is re-queued",
    )


def add_study_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--study-name", required=True, help="the study's name; the same name and storage continue it")
    p.add_argument(
        "--storage",
        help="journal file or RDB URL (sqlite:///tune.db, postgresql://...; default: runs/tune/<study>/study.journal)",
    )
    p.add_argument("--log-dir", help="runs' logs and the report (default runs/tune/<study>)")


def build_parser() -> Parser:
    p = Parser(
        prog="benchmark/tune.py SCRIPT",
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Search a training script's hyperparameters with Optuna. Arguments after -- go to every run.",
    )
    p.add_argument("script", help="ppo_continuous.py, ppo_atari.py or dqn_snake_vec.py")
    add_study_options(p)
    s = p.add_argument_group("search")
    s.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=SPEC",
        help="a searched flag: NAME=LOW:HIGH, NAME=LOW:HIGH:log, NAME=LOW:HIGH:STEP or NAME=a,b,c",
    )
    s.add_argument("--trials", type=int, default=20, help="trials in the study (default 20)")
    s.add_argument("--envs", default="", help="env ids, each run of a trial on each (default: the script's)")
    s.add_argument("--seeds", default="1", help='seeds, each run of a trial with each (default "1")')
    s.add_argument(
        "--enqueue",
        action="append",
        default=[],
        metavar="VALUES",
        help='a trial to run first: "defaults" or "NAME=VALUE ..." (when the study is created)',
    )
    s.add_argument("--sampler", choices=("tpe", "random"), default="tpe", help="Optuna's sampler (default tpe)")
    s.add_argument("--sampler-seed", type=int, help="seed of the sampler (default: none)")
    o = p.add_argument_group("objective and pruning")
    o.add_argument("--last-episodes", type=int, default=100, help="episodes averaged per run (default 100)")
    o.add_argument(
        "--score-range",
        action="append",
        default=[],
        metavar="ENV=LO:HI",
        help="normalise ENV's score to (score - LO) / (HI - LO) (with several envs)",
    )
    o.add_argument("--pruner", choices=("median", "hyperband", "none"), default="median")
    o.add_argument("--reports", type=int, default=10, help="reports of the objective per run (default 10)")
    o.add_argument("--prune-warmup", type=float, default=0.3, help="no pruning before this part of a run (0.3)")
    o.add_argument("--prune-startup", type=int, default=5, help="complete trials before the median pruner prunes")
    add_runtime_options(p)
    sl = p.add_argument_group("SLURM (a job array of workers on one study)")
    sl.add_argument("--dry-run", action="store_true", help="print the plan (with --slurm: the sbatch script)")
    sl.add_argument("--slurm", action="store_true", help="submit --workers array tasks; each runs `tune.py attach`")
    sl.add_argument("--workers", type=int, default=2, help="array tasks (default 2)")
    for name, text in (
        ("--partition", "sbatch --partition"),
        ("--time", "sbatch --time per task"),
        ("--gpus-per-run", "--gres=gpu:N per task"),
        ("--mem", "sbatch --mem per task"),
        ("--max-parallel", "tasks at once (the array's %%N)"),
        ("--account", "sbatch --account"),
    ):
        sl.add_argument(name, help=text)
    sl.add_argument("--sbatch-args", nargs=argparse.REMAINDER, default=[], help="words for sbatch (put it last)")
    return p


def read_args_files(argv: Sequence[str]) -> list[str]:
    """@FILE words replaced by the file's words (one argument a line; blank lines and # comments skipped): a
    study's settings kept in a file."""
    out: list[str] = []
    for word in argv:
        if word.startswith("@") and len(word) > 1:
            try:
                with open(word[1:]) as f:
                    out += [line.strip() for line in f if line.strip() and not line.strip().startswith("#")]
            except OSError as exc:
                raise TuneError(f"cannot read the arguments file {word[1:]}: {exc.strerror}") from None
        else:
            out.append(word)
    return out


def check_passthrough(args: Sequence[str], fields: dict[str, Field], params: list[Param], script: str) -> None:
    searched = {p.field.name for p in params}
    for word in args:
        if not word.startswith("--"):
            continue
        name = word[2:].split("=")[0]
        key = name.replace("-", "_")
        if key not in fields and key.startswith("no_") and fields.get(key[3:], Field("", "")).kind == "bool":
            key = key[3:]
        f = find_field(key, fields, script)
        if f.name in NOT_PASSED:
            raise TuneError(f"--{name} after --: the tuner sets it; use {NOT_PASSED[f.name]}")
        if f.name in searched:
            raise TuneError(f"--{name} after -- is also searched with --param; drop one of them")


def make_config(a: argparse.Namespace, passthrough: list[str]) -> tuple[dict, list[Param], list[dict]]:
    fields = script_fields(a.script)
    if not a.param:
        raise TuneError("nothing to search: add --param NAME=SPEC, e.g. --param learning-rate=1e-4:1e-3:log")
    params = [parse_param(spec, fields, a.script) for spec in a.param]
    if len({p.name for p in params}) != len(params):
        raise TuneError("a flag is given twice with --param")
    if any(p.field.name == "total_timesteps" for p in params):
        raise TuneError(
            "--total-timesteps cannot be searched (the pruner compares trials at equal steps); set it after --"
        )
    check_passthrough(passthrough, fields, params, a.script)
    envs = a.envs.split()
    if envs and "env_id" not in fields:
        raise TuneError(f"{a.script} has no --env-id; drop --envs")
    if envs:
        unknown = sweep.unknown_env_ids(envs)
        if unknown:
            raise TuneError(f"unknown env id {unknown[0]}; use gymnasium's ids, e.g. --envs Hopper-v5")
    seeds = sweep.parse_seeds(a.seeds)
    for value, what in ((a.trials, "--trials"), (a.reports, "--reports"), (a.last_episodes, "--last-episodes")):
        if value < 1:
            raise TuneError(f"{what} must be at least 1, got {value}")
    if not 0 <= a.prune_warmup < 1:
        raise TuneError(f"--prune-warmup is a part of the run in [0, 1), got {a.prune_warmup}")
    given = {}
    for text in a.score_range:
        m = re.fullmatch(r"(.+)=(-?[\d.eE+-]+):(-?[\d.eE+-]+)", text)
        try:
            lo, hi = float(m.group(2)), float(m.group(3))
        except (AttributeError, ValueError):
            raise TuneError(f"--score-range {text}: write ENV=LO:HI, e.g. Hopper-v5=0:3000") from None
        if m.group(1) not in envs or not lo < hi:
            raise TuneError(f"--score-range {text}: ENV must be one of --envs and LO below HI")
        given[m.group(1)] = (lo, hi)
    ranges = reference_ranges(envs, given) if len(envs) > 1 else given
    total = sweep.flag_value(passthrough, "--total-timesteps")
    total = int(total) if total and total.isdigit() else fields.get("total_timesteps", Field("", "")).default
    if not isinstance(total, int):
        raise TuneError(f"{a.script} has no --total-timesteps default; set one after --")
    config = {
        "script": a.script,
        "params": [p.spec for p in params],
        "envs": envs,
        "seeds": seeds,
        "args": passthrough,
        "total_timesteps": total,
        "last_episodes": a.last_episodes,
        "score_ranges": {env: list(r) for env, r in ranges.items()},
        "reports": a.reports,
        "pruner": a.pruner,
        "prune_warmup": a.prune_warmup,
        "prune_startup": a.prune_startup,
        "sampler": a.sampler,
        "sampler_seed": a.sampler_seed,
        "trials": a.trials,
    }
    enqueued = [parse_enqueue(text, params, fields, a.script) for text in a.enqueue]
    return config, params, enqueued


def make_slots(a: argparse.Namespace) -> tuple[list[sweep.Slot], int, int, bool]:
    """This worker's slots as a local sweep makes them: (slots, slots per lane, GPUs, pinned). In a SLURM task,
    the task's CPUs, unpinned (SLURM pins where its task plugin does)."""
    n_gpus = sweep.detect_gpus(dict(os.environ))
    if sweep.flag_value(a.passthrough, "--gpu") == "false":
        n_gpus = 0
    per_lane = (a.jobs_per_gpu or 1) if n_gpus else (a.jobs or 1)
    if per_lane < 1:
        raise TuneError("--jobs and --jobs-per-gpu must be at least 1")
    lanes = max(n_gpus, 1)
    allowed = gpu_utils.allowed_cpus()
    cpus = sweep.parse_cpu_list(a.cpus) if a.cpus else allowed
    bad = [c for c in cpus if c not in allowed]
    if bad:
        raise TuneError(f"--cpus {a.cpus} has CPUs this process may not use: {sweep.cpu_ranges(bad)}")
    pin = sweep.taskset_works(cpus[0])
    if os.environ.get("SLURM_JOB_ID"):
        cpus, pin = cpus[: sweep.slurm_cpus(dict(os.environ))], False
    per_run = min(a.cpus_per_run, len(cpus)) if a.cpus_per_run else None
    sets = sweep.slot_cpus(cpus, lanes * per_lane, per_run)
    return [sweep.Slot(i, list(s)) for i, s in enumerate(sets)], per_lane, n_gpus, pin


def study_paths(a: argparse.Namespace) -> tuple[str, str]:
    if not STUDY_NAME_RE.match(a.study_name) or "__" in a.study_name:
        raise TuneError(f"--study-name '{a.study_name}': use letters, digits, '.', '-' and single '_'")
    log_dir = os.path.abspath(a.log_dir) if a.log_dir else os.path.join(RUNS_DIR, "tune", a.study_name)
    storage = storage_url(a.storage) if a.storage else os.path.join(log_dir, "study.journal")
    return log_dir, storage


def work(a: argparse.Namespace, study, config: dict, storage: str, log_dir: str) -> int:
    slots, per_lane, gpus, pin = make_slots(a)
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    worker = f"slurm {os.environ.get('SLURM_ARRAY_JOB_ID')}_{task}" if task else "local"
    sizes = sorted({len(s.cpus) for s in slots})
    say(
        f"study {study.study_name} in {storage}: {config['trials']} trials of {config['script']}, "
        f"{len(slots)} runs at once ({'GPUs ' + str(gpus) if gpus else 'CPU'}, {sizes[-1]} CPUs each, "
        f"{'pinned' if pin else 'not pinned'}); logs in {log_dir}"
    )
    python = sweep.abs_python(sweep.default_python())
    w = Worker(study, config, slots, per_lane, gpus, pin, python, log_dir, a.stale_after, worker)
    rc = w.run()
    if rc:
        where = "" if storage == os.path.join(log_dir, "study.journal") else f" --storage {storage}"
        attach = f"benchmark/tune.py attach --study-name {study.study_name}{where}"
        say(f"stopped: run the same command (or `{attach}`) to continue")
        return rc
    from optuna.trial import TrialState

    busy = study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
    if busy:
        say(f"this worker is done; {len(busy)} trials run or wait elsewhere: `tune.py report` when they end")
        return 0
    write_report(study, config, storage, log_dir)
    return 0


def submit_slurm(a: argparse.Namespace, storage: str, log_dir: str) -> int:
    opts = {key: getattr(a, key) for key in SLURM_OPTIONS}
    opts["cpus_per_run"] = str(a.cpus_per_run) if a.cpus_per_run else None
    sweep.check_slurm_options(opts, log_dir)
    if a.workers < 1:
        raise TuneError(f"--workers must be at least 1, got {a.workers}")
    array = f"0-{a.workers - 1}" + (f"%{opts['max_parallel']}" if opts.get("max_parallel") else "")
    attach = [
        sweep.abs_python(sys.executable),
        os.path.join(BENCH, "tune.py"),
        "attach",
        "--study-name",
        a.study_name,
        "--storage",
        storage,
        "--log-dir",
        log_dir,
        "--stale-after",
        str(a.stale_after),
    ]
    if a.jobs:
        attach += ["--jobs", str(a.jobs)]
    lines = sweep.sbatch_directives(f"tune-{a.study_name}", array, log_dir, opts)
    lines += [
        "#",
        f"# {a.workers} workers of Optuna study {a.study_name}, written by benchmark/tune.py on {sweep.stamp()}.",
        "# Each task attaches to the study and runs trials until it has all of them; its runs go to runs/ and",
        "# their logs to the log dir. SIGTERM (scancel, the time limit) stops the task's runs with their checkpoints",
        "# and re-queues its trials; submit this file again (or more tasks) to continue the study.",
        "set -u",
        f"cd {shlex.quote(REPO_ROOT)} || exit 2",
        f"exec {shlex.join(attach)}",
    ]
    script = "\n".join(lines) + "\n"
    path = os.path.join(log_dir, "tune.sbatch")
    cmd = ["sbatch", "--parsable", *a.sbatch_args, path]
    if a.dry_run:
        say(f"dry run: would write {path} and run: {shlex.join(cmd)}")
        sys.stdout.write(script)
        return 0
    if shutil.which("sbatch") is None:
        raise TuneError("sbatch not found: --slurm submits to a SLURM cluster (try benchmark/slurm/local_cluster.sh)")
    os.makedirs(os.path.join(log_dir, "slurm"), exist_ok=True)
    with open(path, "w") as f:
        f.write(script)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        out = "; ".join((res.stdout + res.stderr).strip().splitlines())
        raise TuneError(f"sbatch failed (rc={res.returncode}): {out}; fix it and run again (the script is {path})")
    job = res.stdout.strip().splitlines()[-1].split(";")[0]
    say(f"submitted job array {job} ({a.workers} workers on study {a.study_name}); watch: squeue -j {job}")
    say(f"when it ends: python benchmark/tune.py report --study-name {a.study_name} --storage {storage}")
    return 0


def quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def main_study(argv: list[str]) -> int:
    passthrough: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    a = build_parser().parse_args(argv)
    a.passthrough = passthrough
    config, params, enqueued = make_config(a, passthrough)
    log_dir, storage = study_paths(a)
    slurm_only = [k for k in SLURM_OPTIONS if getattr(a, k)] + (["sbatch_args"] if a.sbatch_args else [])
    if slurm_only and not a.slurm:
        flag = "--" + slurm_only[0].replace("_", "-")
        raise TuneError(f"{flag} is an option for SLURM studies; add --slurm (or drop {flag})")
    if a.dry_run and a.slurm:  # the sbatch script, without creating the study
        return submit_slurm(a, storage, log_dir)
    if a.dry_run:
        slots, _, gpus, pin = make_slots(a)
        say(f"dry run: {a.trials} trials of {a.script}, {len(slots)} runs at once; study {a.study_name} in {storage}")
        for p in params:
            say(f"  {p.spec}")
        env = "<env>" if config["envs"] else None
        words = trial_command({**config, "params": [], "args": []}, {}, env, "<seed>")
        for p in params:
            words += [f"--[no-]{p.name}"] if p.field.kind == "bool" else [f"--{p.name}", f"<{p.name}>"]
        say("each run: " + " ".join(words + config["args"]))
        return 0
    import optuna  # noqa: F401  (an ImportError here says what to install)

    quiet_optuna()
    storage_obj = open_storage(storage)
    fresh = a.study_name not in optuna.get_all_study_names(storage_obj)
    if fresh:
        earlier = glob.glob(os.path.join(RUNS_DIR, f"*__{a.study_name}_t[0-9]*__*"))
        if earlier:
            raise TuneError(
                f"runs/ holds runs of an earlier study named {a.study_name} (e.g. {earlier[0]}); "
                "give a new --study-name or move them"
            )
    study, config = load_study(storage_obj, a.study_name, config)
    if fresh:
        for values in enqueued:
            study.enqueue_trial(values)
    elif enqueued:
        say("--enqueue is applied when a study is created; this one exists, so it is ignored")
    if a.slurm:
        return submit_slurm(a, storage, log_dir)
    return work(a, study, config, storage, log_dir)


def existing_storage(a: argparse.Namespace) -> tuple[str, str, object]:
    """(log dir, storage, opened storage) of a study that must exist already (attach, report)."""
    log_dir, storage = study_paths(a)
    if "://" not in storage and not os.path.isfile(storage):
        raise TuneError(f"no study journal {storage}; give the --storage the study was started with")
    quiet_optuna()
    return log_dir, storage, open_storage(storage)


def attach_parser() -> Parser:
    p = Parser(prog="benchmark/tune.py attach", description="Run trials of an existing study here.")
    add_study_options(p)
    add_runtime_options(p)
    return p


def report_parser() -> Parser:
    p = Parser(prog="benchmark/tune.py report", description="The best trials, importances and history of a study.")
    add_study_options(p)
    p.add_argument("--out", help="where report.md and the PNGs go (default: the study's log dir)")
    p.add_argument("--top", type=int, default=10, help="best trials in the table (default 10)")
    return p


def main_attach(argv: list[str]) -> int:
    a = attach_parser().parse_args(argv)
    log_dir, storage, storage_obj = existing_storage(a)
    task = int(os.environ.get("SLURM_ARRAY_TASK_ID", "0") or 0)
    study, config = load_study(storage_obj, a.study_name, None, worker_index=task)
    a.passthrough = config["args"]
    return work(a, study, config, storage, log_dir)


def main_report(argv: list[str]) -> int:
    a = report_parser().parse_args(argv)
    log_dir, storage, storage_obj = existing_storage(a)
    study, config = load_study(storage_obj, a.study_name, None)
    write_report(study, config, storage, os.path.abspath(a.out) if a.out else log_dir, a.top)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = read_args_files(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "attach":
            return main_attach(argv[1:])
        if argv and argv[0] == "report":
            return main_report(argv[1:])
        if not argv or argv[0] in ("-h", "--help"):
            build_parser().print_help()
            return 0
        return main_study(argv)
    except ModuleNotFoundError as exc:
        print(f"error: {exc.name} is missing; install the tuner's extra: pip install -e '.[tune]'", file=sys.stderr)
        return 2
    except (TuneError, sweep.SweepError, gpu_utils.DeviceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
