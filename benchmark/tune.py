"""Hyperparameter studies on Optuna (docs/tuning.md): `tune.py SCRIPT ...` starts or continues a study whose trials
run in the sweep engine's slots, each trial its script once per env and seed; `tune.py attach` adds a worker (each
task of a SLURM job array is one); `tune.py report` writes the best trials with their commands, and the plots."""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import glob
import math
import os
import re
import shlex
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

try:
    import optuna
except ModuleNotFoundError:
    sys.exit("error: optuna is missing; install the tuner's extra: pip install -e '.[tune]'")

import report  # noqa: E402  (the one reader of run folders)
import sweep  # noqa: E402  (slots, the launcher, SLURM; puts the repo root on sys.path)
from sweep import Field, SweepError  # noqa: E402

import gpu_utils  # noqa: E402

# fields the tuner sets, with what to use instead, and fields that say how a run goes rather than what it learns
SET_BY_TUNER = {"seed": "--seeds", "env_id": "--envs", "exp_name": "--study-name", "resume": "a rerun of the study"}
SET_BY_TUNER |= {"session": "--jobs-per-gpu", "eval_checkpoint": "the script itself"}
NOT_TUNABLE = {*SET_BY_TUNER, "gpu", "cuda_offset", "eval_episodes", "track", "wandb_project_name", "wandb_entity"}
NOT_TUNABLE |= {"capture_video", "progress_bar", "checkpoint_every", "total_timesteps", "num_threads"}
HEARTBEAT_S = 60.0  # how often a tuner stamps its running trials (user attribute tune:heartbeat)
ALL_FAILED = 3  # failed trials, and not one complete or pruned: the command is wrong, and the tuner stops
say = functools.partial(print, "[tune]", flush=True)


def convert(text: str, f: Field, what: str) -> object:
    kinds = {"bool": lambda t: {"true": True, "false": False}[t.lower()], "int": int, "float": float, "str": str}
    try:
        value = kinds[f.kind](text.strip())
        if f.kind == "float" and not math.isfinite(value):  # NaN or infinite: no range to draw from, nor a value
            raise ValueError
    except (KeyError, ValueError):
        raise SweepError(f"{what}: {f.flag} takes a value of type {f.kind}, not '{text}'") from None
    if f.choices and value not in f.choices:  # refused here, not by each trial's run
        raise SweepError(f"{what}: {f.flag} takes one of {', '.join(map(str, f.choices))}, not '{text}'")
    return value


def parse_param(spec: str, fields: dict[str, Field], script: str):
    """``NAME=LOW:HIGH[:log|:STEP]`` or ``NAME=a,b,c`` (``a|b`` for choices with commas) -> (the flag without --, an
    Optuna distribution, which checks the range)."""
    name, _, text = spec.partition("=")
    f = sweep.find_field(name.strip(), fields, script)
    what, key = f"--param {spec}", f.flag[2:].replace("-", "_")
    if key in NOT_TUNABLE:
        instead = f"; use {SET_BY_TUNER[key]}" if key in SET_BY_TUNER else ""
        raise SweepError(f"{what}: {f.flag} is not searched{instead}")
    if "|" in text or ":" not in text:
        choices = [convert(word, f, what) for word in text.split("|" if "|" in text else ",")]
        if len(choices) < 2 or len(set(choices)) != len(choices):
            raise SweepError(f"{what}: give two or more different choices, e.g. {f.flag[2:]}=a,b (or a|b)")
        return f.flag[2:], optuna.distributions.CategoricalDistribution(choices)
    low, high, *rest = text.split(":")
    if f.kind not in ("int", "float") or len(rest) > 1:
        raise SweepError(f"{what}: write LOW:HIGH, LOW:HIGH:log or LOW:HIGH:STEP for a number, or a,b for choices")
    step = convert(rest[0], f, what) if rest and rest != ["log"] else 1 if f.kind == "int" else None
    kind = optuna.distributions.IntDistribution if f.kind == "int" else optuna.distributions.FloatDistribution
    low, high = convert(low, f, what), convert(high, f, what)  # outside the try: their errors say it once
    try:
        return f.flag[2:], kind(low, high, log=rest == ["log"], step=step)
    except ValueError as exc:  # Optuna's check of the range
        raise SweepError(f"{what}: {exc}") from None


def parse_enqueue(text: str, space: dict, fields: dict[str, Field], script: str) -> dict[str, object]:
    """``defaults`` (the script's defaults of the searched flags) or ``NAME=VALUE ...``: a trial to run first."""
    values = {}
    for word in list(space) if text == "defaults" else text.split():
        name, _, value = word.partition("=")
        f = sweep.find_field(name, fields, script)
        values[f.flag[2:]] = convert(value, f, f"--enqueue {text}") if value else f.default
    unsearched = sorted(values.keys() - space.keys())  # Optuna would drop them: the trial would run the defaults
    if unsearched:
        flag = unsearched[0]
        raise SweepError(f"--enqueue {text}: {flag} is not searched (no --param); pass it after -- to set it for all")
    for name, dist in space.items():
        value = values.get(name)
        if hasattr(dist, "choices"):
            inside = value in dist.choices
        else:
            inside = value is not None and dist.low <= value <= dist.high
        if value is None and text == "defaults":  # a field whose default is set from others (a preset's, say)
            raise SweepError(f'--enqueue defaults: {name} has no default of its own; give it: --enqueue "{name}=..."')
        if not inside:
            raise SweepError(f"--enqueue {text}: give each searched flag a value in its space, not {name}={value}")
    return values


def value_args(config: dict, values: dict) -> list[str]:
    """A trial's values as the script's flags (--no-anneal-lr for a false bool), then the study's fixed arguments."""
    words = []
    for name, value in values.items():
        if isinstance(value, bool):  # only a bool field's values are bools
            words.append(f"--{name}" if value else f"--no-{name}")
        else:
            words += [f"--{name}", repr(value) if isinstance(value, float) else str(value)]
    return words + config["args"]


@dataclass
class TrialRun:
    """One run (env x seed) of a trial: its command, log and folder, and the returns in its event files."""

    env: str | None
    args: list[str]  # the script and its arguments
    log: str
    pattern: str  # a glob of its run folder, with its runs/
    resume: str | None = None
    run_dir: str | None = None
    proc: object = None
    outcome: str = ""  # finished, stopped, or why it failed; "" before it ended
    returns: list = field(default_factory=list)  # (step, return, games it is the mean of) as logged, in order
    last_step: int = 0
    status: str | None = None  # its checkpoint's
    sizes: tuple = ()  # the event files' sizes when last read

    def read(self) -> None:
        """Its folder through report.load_run again when its event files grew (a resumed run has one per process)."""
        self.run_dir = self.run_dir or max(glob.glob(self.pattern), default=None)
        files = sorted(glob.glob(os.path.join(self.run_dir, "events.out.tfevents.*"))) if self.run_dir else []
        if files and tuple(map(os.path.getsize, files)) != self.sizes:
            self.sizes, run = tuple(map(os.path.getsize, files)), report.load_run(self.run_dir)
            self.returns = list(zip(run.steps.tolist(), run.returns.tolist(), run.counts.tolist()))
            self.last_step = run.last_step
            self.status = run.checkpoint_status

    def ended(self, stopping: bool) -> str:
        """Its outcome once its process exited: finished as its checkpoint says, stopped by a signal, or failed."""
        self.sizes = ()  # its last checkpoint came after its last event
        self.read()
        if self.status == "finished" or stopping:
            return "finished" if self.status == "finished" else "stopped"
        with open(self.log, errors="replace") as log:  # the script's one-line error says what to change
            said = [line.strip() for line in log if line.startswith("error:")]
        why = f"{said[-1]}; " if said else ""
        return f"a run exited with code {self.proc.returncode} ({why}checkpoint {self.status}): see {self.log}"


def trial_value(config: dict, runs: list[TrialRun], until: float = math.inf) -> tuple[float | None, dict[str, float]]:
    """The value on the episodes that ended by step ``until``, and each env's raw score (the mean over seeds); None
    while a run has no finished episode."""
    scores: dict[str, list[float]] = {}
    for r in runs:
        kept = np.array([(v, games) for step, v, games in r.returns if step <= until]).reshape(-1, 2)
        if not len(kept):
            return None, {}
        scores.setdefault(r.env or "its env", []).append(report.mean_of_last(*kept.T, config["last_episodes"]))
    score = {env: sum(v) / len(v) for env, v in scores.items()}
    value = sum(normalised(s, config["references"].get(env, 1.0)) for env, s in score.items()) / len(score)
    return value, score


def normalised(score: float, reference: float | list[float]) -> float:
    """``score`` over its env's reference: the published mean, or [it, a random policy's score] as the report
    normalises (0 a random policy, 1 the reference)."""
    mean, zero = reference if isinstance(reference, list) else (reference, None)
    return float(report.normalise(score, mean, zero))


def open_storage(url: str):  # a journal file (a path) or an RDB URL (sqlite:///path, postgresql://...)
    if "://" not in url and os.path.isfile(url):
        with open(url, "rb") as f:
            if f.read(16) == b"SQLite format 3\x00":  # read as a journal, it would hold no study
                raise SweepError(f"{url} is an SQLite database, not a journal: pass --storage sqlite:///{url}")
    try:
        if "://" not in url or url.startswith("sqlite:///"):  # a file: its folder may be new
            os.makedirs(os.path.dirname(url.removeprefix("sqlite:///")) or ".", exist_ok=True)
        if "://" in url:
            timeout = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
            return optuna.storages.RDBStorage(url, engine_kwargs=timeout)
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(url))
    except Exception as exc:  # noqa: BLE001 - a bad URL, a missing driver, no server: one line naming the storage
        raise SweepError(f"cannot open storage {url}: {gpu_utils.first_line(exc)}") from None


def literal(node: ast.expr) -> object:
    """A literal, or a ``dict(key=literal, ...)`` call, in a script's source (its PRESETS table, say)."""
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "dict" and not node.args:
        return {k.arg: literal(k.value) for k in node.keywords}
    if isinstance(node, ast.Dict):
        return {literal(k): literal(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)


def script_tables(script: str) -> dict[str, dict]:
    """The script's module-level DEFAULTS and PRESETS (ppo_continuous.py fills unset sizes from them), as data."""
    tables = {}
    for node in ast.parse(Path(sweep.REPO_ROOT, script).read_text()).body:
        names = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        for name in [n for n in names if n in ("DEFAULTS", "PRESETS")]:
            with contextlib.suppress(ValueError, TypeError, SyntaxError):  # not data: left out
                tables[name] = literal(node.value)
    return tables


def first_update(config: dict) -> int | None:
    """The agent step of a run's first update, the smallest over the searched space: the first rollout's size (envs x
    steps per env, from the flags after --, else the script's defaults or its preset's) for PPO, learning_starts for
    DQN. None where the script has neither."""
    script, args = config["script"], config["args"]
    fields = sweep.script_fields(script)
    space = dict(parse_param(spec, fields, script) for spec in config["params"])
    tables = script_tables(script)

    def smallest(name: str, preset: object) -> int | None:
        flag = name.replace("_", "-")
        if flag in space:
            return min(space[flag].choices) if hasattr(space[flag], "choices") else space[flag].low
        given = sweep.flag_value(args, f"--{flag}")
        if given is not None:
            return int(given) if given.isdecimal() else None
        table = tables.get("PRESETS", {}).get(preset) or tables.get("DEFAULTS", {})
        return fields[name].default if fields[name].default is not None else table.get(name)

    if "learning_starts" in fields:
        return smallest("learning_starts", None)
    if not {"num_envs", "num_steps"} <= fields.keys():
        return None
    preset = sweep.flag_value(args, "--preset") or getattr(fields.get("preset"), "default", None)
    presets = space["preset"].choices if "preset" in space else [preset]
    sizes = [(smallest("num_envs", p), smallest("num_steps", p)) for p in presets]
    return min((envs * steps for envs, steps in sizes if envs and steps), default=None)


def report_steps(config: dict) -> list[int]:  # where a trial reports its value so far (the last: its value)
    interval = config["total_timesteps"] // config["reports"]
    return [interval * k for k in range(1, config["reports"])] if interval else []


def load_study(storage, name: str, config: dict | None, worker: int = 0):
    """The study ``name`` and its config: the stored one, which ``config`` (when given) must match but for --trials,
    or ``config`` for a new study; its TPE sampler (docs/tuning.md#the-search-space) and its pruner."""
    try:  # report and attach load it: create_study appends a record to a journal even for a study that exists
        if config is None and name not in optuna.get_all_study_names(storage):
            raise SweepError(f"no study {name} in this storage; start it with benchmark/tune.py SCRIPT ...")
        if config is None:
            study = optuna.load_study(study_name=name, storage=storage)
        else:
            study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True)
    except ValueError as exc:  # a damaged journal's JSON, say
        raise SweepError(f"cannot read study {name} from its storage: {gpu_utils.first_line(exc)}") from None
    stored = study.user_attrs.get("tune:config") or config
    if stored is None:
        raise SweepError(f"study {name} was not started by benchmark/tune.py (it has no tune:config); use another")
    stored = {"work_dir": sweep.REPO_ROOT, **stored}  # a study started before its runs went where the user stands
    for key in [k for k in config or {} if k != "trials" and stored.get(k) != config[k]]:
        raise SweepError(f"study {name} has {key} {stored[key]!r}, not {config[key]!r}; keep it or use a new name")
    if config is not None and study.user_attrs.get("tune:config") != config:
        study.set_user_attr("tune:config", config)  # a new study's, or a new --trials
    config = config or stored
    seed = config["sampler_seed"]  # each worker and restart seeds anew: a rerun would draw the same points again
    seed = None if seed is None else (seed + 1000 * worker + len(study.trials)) % 2**32
    startup = min(10, max(2, config["trials"] // 3))  # random trials before TPE models the results
    study.sampler = optuna.samplers.TPESampler(n_startup_trials=startup, seed=seed, constant_liar=True)
    total, warmup = config["total_timesteps"], int(config["prune_warmup"] * config["total_timesteps"])
    first = next((step for step in report_steps(config) if step >= warmup), total)
    if config["pruner"] == "median":
        study.pruner = optuna.pruners.MedianPruner(n_startup_trials=config["prune_startup"], n_warmup_steps=warmup)
    elif config["pruner"] == "hyperband":
        study.pruner = optuna.pruners.HyperbandPruner(first, max_resource=total)
    else:
        study.pruner = optuna.pruners.NopPruner()
    return study, config


def counted(trials) -> int:
    """The trials that count towards --trials: all but the waiting ones and the failed ones queued again."""
    continued = {t.user_attrs.get("tune:continues") for t in trials}
    return sum(t.state.name != "WAITING" and not (t.state.name == "FAIL" and t.number in continued) for t in trials)


def all_failed(trials) -> bool:
    """ALL_FAILED trials failed (not counting those queued again) and none completed or was pruned."""
    continued = {t.user_attrs.get("tune:continues") for t in trials}
    failed = sum(t.state.name == "FAIL" and t.number not in continued for t in trials)
    return failed >= ALL_FAILED and not any(t.state.name in ("COMPLETE", "PRUNED") for t in trials)


def requeue(study, t, reason: str = "") -> bool:
    """Queue trial ``t``'s values again, to continue its runs; one that still runs (its tuner died) is first marked
    FAIL with ``reason``. False when it ended meanwhile (another tuner got there first)."""
    try:
        if t.state.name == "RUNNING":
            study._storage.set_trial_user_attr(t._trial_id, "tune:end", reason)
            study.tell(t.number, state=t.state.FAIL)
    except (ValueError, RuntimeError):
        return False
    origin = t.user_attrs.get("tune:origin", t.number)
    study.enqueue_trial(t.params, user_attrs={"tune:origin": origin, "tune:continues": t.number})
    return True


def recover_stale(study, stale_after: float) -> None:
    """Queue again the RUNNING trials whose tuner is gone: no tune.py has its pid on this host (Linux), or its
    heartbeat is older than ``stale_after`` seconds."""
    for t in [t for t in study.get_trials(deepcopy=False) if t.state.name == "RUNNING"]:
        host, pid = t.user_attrs.get("tune:host"), t.user_attrs.get("tune:pid")
        beat = t.user_attrs.get("tune:heartbeat") or t.datetime_start.timestamp()
        try:
            alive = b"tune.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            alive = not os.path.isdir("/proc/self")  # no /proc: taken for alive
        gone = host == socket.gethostname() and pid is not None and not alive
        if (gone or time.time() - beat > stale_after) and requeue(study, t, "stale: its tuner died"):
            say(f"trial {t.number} was left RUNNING by a tuner that died ({host} pid {pid}): queued again")


class Worker:
    """Runs trials of one study here, a thread per slot taking one trial at a time, until the study has its trials or
    a signal stops it. A trial's runs (envs x seeds) run together on its slot's GPU and share its CPUs."""

    def __init__(self, study, config: dict, a: argparse.Namespace, log_dir: str) -> None:
        self.study, self.config, self.log_dir, self.stale_after = study, config, log_dir, a.stale_after
        self.runs_dir = os.path.join(config["work_dir"], "runs")  # the study's, wherever this worker was started
        self.slots, self.pin = sweep.make_slots(a, config["args"])
        self.python, self.lock = sweep.runs_python(), threading.Lock()
        self.space = dict(
            parse_param(p, sweep.script_fields(config["script"]), config["script"]) for p in config["params"]
        )
        task = os.environ.get("SLURM_ARRAY_TASK_ID")
        self.worker = f"slurm {os.environ.get('SLURM_ARRAY_JOB_ID')}_{task}" if task else f"local pid {os.getpid()}"

    def run(self) -> str:  # the slots' threads until they end (this thread takes the signals): why it stopped, or ""
        self.stopper, self.failure = sweep.Stopper(), ""
        threads = [threading.Thread(target=self.loop, args=(slot,)) for slot in self.slots]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            time.sleep(0.5)
        return self.failure or ("stopped" if self.stopper.stopping else "")

    def loop(self, slot: sweep.Slot) -> None:
        try:
            self.trials(slot)
        except Exception as exc:  # a storage error, say: the tuner stops (its trials are queued again), not as if done
            self.failure = self.failure or f"{type(exc).__name__}: {str(exc).strip()[:200]}"
            self.stopper.stop()

    def trials(self, slot: sweep.Slot) -> None:
        """One slot's trials, one after the other; each ends complete, pruned, failed (tune:end says why), or queued
        again when the tuner stops."""
        while not self.stopper.stopping:
            with self.lock:  # one ask at a time: two threads must not take the same queued trial
                recover_stale(self.study, self.stale_after)
                if counted(self.study.get_trials(deepcopy=False)) >= self.config["trials"]:
                    return
                trial = self.study.ask(self.space)  # a queued trial's values, else the sampler's
            state, result = self.run_trial(trial, slot)
            if state == "stopped" and requeue(self.study, self.study._storage.get_trial(trial._trial_id), result):
                say(f"trial {trial.number} stopped with the tuner: queued again, to continue its runs")
            elif state == "complete":
                self.study.tell(trial, result)
                best = self.study.best_trial
                say(f"trial {trial.number} complete: {result:.4g} (best: trial {best.number}, {best.value:.4g})")
            elif state in ("pruned", "fail"):
                trial.set_user_attr("tune:end", result)
                self.study.tell(trial, state=optuna.trial.TrialState[state.upper()])
                say(f"trial {trial.number} FAILED: {result}" if state == "fail" else f"trial {trial.number} {result}")
                if state == "fail" and all_failed(self.study.get_trials(deepcopy=False)):  # not burn every trial
                    self.failure = self.failure or f"its first {ALL_FAILED} trials failed, the last: {result}"
                    self.stopper.stop()

    def run_trial(self, trial, slot: sweep.Slot) -> tuple[str, object]:
        """Run the trial's runs in ``slot``: (complete, value), (pruned or fail, why) or (stopped, why)."""
        origin = trial.user_attrs.get("tune:origin", trial.number)
        attrs = {"tune:host": socket.gethostname(), "tune:pid": os.getpid(), "tune:worker": self.worker}
        for key, value in {**attrs, "tune:origin": origin, "tune:heartbeat": time.time()}.items():
            trial.set_user_attr(key, value)
        continues = trial.user_attrs.get("tune:continues")
        text = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
        say(f"trial {trial.number} start{'' if continues is None else f' (continues trial {continues})'}: {text}")
        try:
            runs = self.trial_runs(origin, trial.params, continues is not None)
        except ValueError as exc:  # a run it continues cannot go on
            return "fail", str(exc)
        end = self.watch(trial, runs, slot)
        if self.stopper.stopping and not all(r.outcome == "finished" for r in runs):
            return "stopped", "stopped with its tuner; queued again"
        value, scores = trial_value(self.config, runs)
        if end or value is None:
            return "pruned" if end.startswith("pruned") else "fail", end or "a run finished without a finished episode"
        trial.set_user_attr("tune:scores", scores)
        trial.set_user_attr("tune:run_dirs", [os.path.relpath(r.run_dir, self.config["work_dir"]) for r in runs])
        return "complete", value

    def watch(self, trial, runs: list[TrialRun], slot: sweep.Slot) -> str:
        """Start the runs in ``slot``; report the trial's value at each report step they all passed; SIGTERM them when
        it is pruned or one fails. Why the trial ended early, or ""."""
        for r, cpus in zip(runs, gpu_utils.split_cpus(slot.cpus, len(runs))):
            if not r.outcome and not self.stopper.stopping:  # on the slot's GPU, and CPUs of its own
                command = slot.command([self.python, *r.args, *(["--resume", r.resume] if r.resume else [])])
                r.proc = sweep.start_run(command, cpus, self.pin, r.log, self.config["work_dir"])
                self.stopper.started(r.proc)
        end, reported, beat = "", set(), time.time()
        while any(r.proc is not None and not r.outcome for r in runs):
            for r in [r for r in runs if r.proc is not None and not r.outcome]:
                r.outcome = "" if r.proc.poll() is None else r.ended(self.stopper.stopping or bool(end))
                end = end or ("" if r.outcome in ("", "finished", "stopped") else r.outcome)
                r.read()
            reached = min(math.inf if r.outcome == "finished" else r.last_step for r in runs)
            for step in [s for s in report_steps(self.config) if s <= reached and s not in reported]:
                value, _ = trial_value(self.config, runs, step)
                if end or value is None:
                    break
                reported.add(step)
                trial.report(value, step)
                if trial.should_prune():
                    end = f"pruned at step {step:,}"
                    say(f"trial {trial.number} is pruned at step {step:,}: {value:.4g} (its runs get SIGTERM)")
                    break
            for r in [r for r in runs if end and r.proc is not None and not r.outcome]:
                r.proc.terminate()  # SIGTERM: they write their checkpoints and free the slot
            if time.time() - beat > HEARTBEAT_S:
                beat = time.time()
                trial.set_user_attr("tune:heartbeat", beat)
            time.sleep(0.5)
        return end

    def trial_runs(self, origin: int, values: dict, continues: bool) -> list[TrialRun]:
        """The trial's runs; a trial queued again continues them: from their checkpoints, or as they finished."""
        exp = f"{self.study.study_name}_t{origin:03d}"
        runs = []
        for env in self.config["envs"] or [None]:
            for seed in self.config["seeds"]:
                script = os.path.join(sweep.REPO_ROOT, self.config["script"])  # the runs start in the work dir
                args = [script, *(["--env-id", env] if env else []), "--seed", seed, "--exp-name", exp]
                log = os.path.join(self.log_dir, "logs", f"t{origin:03d}_{(env or 'run').replace('/', '_')}_{seed}.log")
                pattern = os.path.join(self.runs_dir, f"{(env or '*').replace('/', '_')}__{exp}__{seed}__*")
                runs.append(TrialRun(env, args + value_args(self.config, values), log, pattern))
                if continues:
                    runs[-1].read()
                    d = sweep.decide_resume(self.runs_dir, os.path.basename(runs[-1].run_dir or "").rsplit("__", 1)[0])
                    if d.action in ("live", "error") or d.note.startswith("diverged"):
                        raise ValueError(f"its run cannot continue: {d.note}")
                    runs[-1].outcome = "finished" if d.action == "skip" else ""
                    runs[-1].resume = d.checkpoint if d.action == "resume" else None
        return runs


def write_report(study, config: dict, storage: str, out_dir: str) -> None:
    """The best trials as a table with their commands, printed and in report.md, beside history.png, importances.png
    and intermediate.png (each trial's curve as the pruner saw it)."""
    import matplotlib

    matplotlib.use("Agg")  # files, no window
    trials = study.trials  # one snapshot: a live study's trials change between two reads
    states = [t.state.name for t in trials]
    again = len(states) - states.count("WAITING") - counted(trials)
    counts = ", ".join(f"{states.count(s)} {s.lower()}" for s in ("COMPLETE", "PRUNED", "RUNNING", "WAITING"))
    counts = f"{len(states)} trials: {counts}, {states.count('FAIL') - again} failed, {again} stopped and queued again"
    best = sorted((t for t in trials if t.state.name == "COMPLETE"), key=lambda t: -t.value)[:10]
    names = [spec.split("=")[0].strip().removeprefix("--").replace("_", "-") for spec in config["params"]]  # Optuna's
    env, seed = (config[k][0] if len(config[k]) == 1 else None for k in ("envs", "seeds"))
    where = (["--env-id", env] if env else []) + (["--seed", seed] if seed else [])
    rows = []
    for rank, t in enumerate(best, 1):
        command = shlex.join(["python", config["script"], *where, *value_args(config, t.params)])
        cells = [f"{t.params[n]:.4g}" if isinstance(t.params[n], float) else t.params[n] for n in names]
        rows.append([rank, t.number, f"{t.value:.4g}", *cells, f"`{command}`"])
    table = report.md_table(["rank", "trial", "value", *names, "command"], rows)
    say(f"study {study.study_name}: {counts}; the best trials:\n" + "\n".join(table))
    os.makedirs(out_dir, exist_ok=True)
    plot = optuna.visualization.matplotlib
    evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    plots = {"history": plot.plot_optimization_history, "intermediate": plot.plot_intermediate_values}
    plots["importances"] = lambda study: plot.plot_param_importances(study, evaluator=evaluator)
    figures = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the plots are experimental
        for name, draw in plots.items():
            try:
                draw(study).figure.savefig(os.path.join(out_dir, f"{name}.png"), dpi=90, bbox_inches="tight")
                figures.append(f"![{name}]({name}.png)")
            except (ValueError, RuntimeError) as exc:  # importances need two complete trials
                say(f"no {name}.png: {exc}")
    about = f"`{config['script']}` with `{shlex.join(config['args'])}`, seeds {' '.join(config['seeds'])}; {counts}."
    text = [f"# Study {study.study_name}", "", about, f"Storage: `{storage}`.", "", *table, "", *figures]
    Path(out_dir, "report.md").write_text("\n".join(text) + "\n")
    say(f"report: {os.path.join(out_dir, 'report.md')}, {len(figures)} plots")


def argument_files(argv: list[str]) -> list[str]:
    """Each @FILE before -- replaced by its lines, one argument a line (blank lines skipped), a -- and the runs'
    arguments included: a study's whole command can live in a file."""
    words = []
    for word in argv:
        if not word.startswith("@") or "--" in words:
            words.append(word)
            continue
        try:
            lines = Path(word[1:]).read_text().splitlines()
        except OSError as exc:
            raise SweepError(f"cannot read the arguments file {word[1:]}: {exc.strerror}") from None
        words += argument_files([line.strip() for line in lines if line.strip()])
    return words


def build_parser() -> sweep.Parser:
    p = sweep.Parser(prog="benchmark/tune.py", allow_abbrev=False)
    p.description = "Search hyperparameters with Optuna. Arguments after -- go to every run; @FILE reads more."
    p.add_argument("script", help="the training script (ppo_continuous.py, ...), or attach (join a study) or report")
    p.add_argument("--study-name", required=True, help="the same name and storage continue a study")
    p.add_argument("--storage", help="a journal file or an RDB URL (default runs/tune/<study>/study.journal)")
    p.add_argument("--log-dir", help="the runs' logs and the report (default runs/tune/<study>)")
    p.add_argument("--out", help="where report writes report.md and the PNGs (default: the log dir)")
    p.add_argument("--stale-after", type=sweep.count(2 * HEARTBEAT_S, float), default=600, help="stale after (seconds)")
    s = p.add_argument_group("a new study")
    s.add_argument("--param", action="append", default=[], metavar="NAME=SPEC", help="NAME=LOW:HIGH[:log|:STEP], a,b")
    s.add_argument("--trials", type=sweep.count(1), default=20, help="trials in the study (default 20)")
    s.add_argument("--envs", default="", help="env ids: each trial runs on each (default: the script's)")
    s.add_argument("--seeds", default="1", help='seeds: each trial runs with each (default "1")')
    s.add_argument("--enqueue", action="append", default=[], metavar="VALUES", help='"defaults" or "NAME=VALUE ..."')
    s.add_argument("--sampler-seed", type=int, help="seed of the sampler, Optuna's TPE (default: none)")
    s.add_argument("--last-episodes", type=sweep.count(1), default=100, help="episodes averaged per run (100)")
    s.add_argument("--pruner", choices=("median", "hyperband", "none"), default="median")
    s.add_argument("--reports", type=sweep.count(1), default=10, help="reports of the value per run (10)")
    s.add_argument("--prune-warmup", type=float, default=0.3, help="no pruning before this part of a run (0.3)")
    s.add_argument("--prune-startup", type=sweep.count(0), default=5, help="complete trials before median pruning (5)")
    # default None, not False: sweep.check_modes takes any other value for the option given
    s.add_argument("--dry-run", action="store_true", default=None, help="with --slurm: print the sbatch script")
    s.add_argument("--workers", type=sweep.count(1), default=2, help="SLURM array tasks (default 2)")
    sweep.add_run_options(p, "task")
    return p


def make_config(a: argparse.Namespace, passthrough: list[str], work_dir: str) -> tuple[dict, list[dict]]:
    """The study's settings (its user attribute tune:config) and its --enqueue'd trials, checked."""
    fields = sweep.script_fields(a.script)
    space = dict(parse_param(spec, fields, a.script) for spec in a.param)
    if not a.param or len(space) != len(a.param):
        raise SweepError("give each searched flag once: --param NAME=SPEC, e.g. --param learning-rate=1e-4:1e-3:log")
    for word in [w.split("=")[0] for w in passthrough if w.startswith("--")]:
        key = word[2:].replace("-", "_")
        if key in SET_BY_TUNER or word[2:] in space:
            raise SweepError(f"{word} after -- is set by the tuner; use {SET_BY_TUNER.get(key, '--param')}")
    sweep.check_flags(passthrough, fields, a.script)  # else every trial's runs would fail on a typo
    envs = a.envs.split()
    if envs and "env_id" not in fields:
        raise SweepError(f"{a.script} has no --env-id: leave out --envs")
    unknown = sweep.unknown_env_ids(envs)
    if unknown:
        raise SweepError(f"unknown env id {unknown[0]} for {a.script}; use gymnasium's ids, e.g. --envs Hopper-v5")
    published, references = report.load_references(os.path.join(BENCH, "reference_scores.csv")), {}
    randoms = report.load_random_scores(os.path.join(BENCH, "random_scores.csv"))
    tags = {env: env.replace("/", "_") for env in envs}  # as run names and the CSVs spell them
    with_random = all(tag in randoms for tag in tags.values())  # one normalisation for all, as the report's
    for env in envs if len(envs) > 1 else []:  # each env's score over its mean published one (less a random policy's)
        scores = [float(r.score) for r in published.get(tags[env], [])]
        mean = sum(scores) / len(scores) if scores else -math.inf
        zero = randoms[tags[env]] if with_random else 0.0
        if mean <= zero:
            above = "a random policy's" if with_random else "0"
            raise SweepError(f"no reference score for {env} above {above} in benchmark/reference_scores.csv")
        references[env] = [mean, zero] if with_random else mean
    total = sweep.flag_value(passthrough, "--total-timesteps") or getattr(fields.get("total_timesteps"), "default", "")
    if not str(total).isdecimal():
        raise SweepError(f"give --total-timesteps after -- as a whole number, not {total}")
    if not 0 <= a.prune_warmup < 1:
        raise SweepError(f"--prune-warmup is a part of each run, in [0, 1); got {a.prune_warmup}")
    config = {"script": a.script, "params": a.param, "envs": envs, "seeds": sweep.parse_seeds(a.seeds)}
    config |= {"args": passthrough, "total_timesteps": int(total), "references": references, "work_dir": work_dir}
    kept = ("last_episodes", "reports", "pruner", "prune_warmup", "prune_startup", "sampler_seed", "trials")
    config |= {key: getattr(a, key) for key in kept}
    return config, [parse_enqueue(text, space, fields, a.script) for text in a.enqueue]


@sweep.one_line_errors
def main(argv: list[str] | None = None) -> int:
    argv = argument_files(list(sys.argv[1:] if argv is None else argv))
    cut = argv.index("--") if "--" in argv else len(argv)
    passthrough = sweep.dashed(argv[cut + 1 :])
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    a = build_parser().parse_args(argv[:cut])
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]*(_[A-Za-z0-9.-]+)*", a.study_name):
        raise SweepError(f"--study-name '{a.study_name}': use letters, digits, '.', '-' and single '_'")
    # the runs, their logs and the study go where the user stands, as a script's runs/ does (docs/tuning.md)
    work_dir = os.path.abspath(a.work_dir or os.getcwd())
    log_dir = os.path.abspath(a.log_dir or os.path.join(work_dir, "runs", "tune", a.study_name))
    if a.out:  # now, not after the study
        sweep.make_dir(a.out, "--out")
    storage = a.storage or os.path.join(log_dir, "study.journal")
    storage = re.sub(r"^sqlite:///(?=[^/])", f"sqlite:///{os.getcwd()}/", storage)  # absolute, for SLURM tasks
    storage = storage if "://" in storage else os.path.abspath(storage)
    sweep.check_modes(a, (*sweep.SLURM_ONLY, "dry_run"))  # a study here has no dry run
    file = storage.removeprefix("sqlite:///") if "://" not in storage or storage.startswith("sqlite:///") else None
    if a.script in ("attach", "report") and file and not os.path.isfile(file):  # nothing to join: make no file
        raise SweepError(f"no study file {file}; give the --storage the study was started with")
    if a.script in ("attach", "report") and a.work_dir:
        raise SweepError(f"--work-dir is the study's: {a.script} uses the folder it was started with; drop it")
    config, enqueued = (None, None) if a.script in ("attach", "report") else make_config(a, passthrough, work_dir)
    if a.slurm:  # a job array of --workers tasks, each `tune.py attach` on the study
        attach = [sys.executable, os.path.join(BENCH, "tune.py"), "attach", "--study-name", a.study_name]
        attach += ["--storage", storage, "--log-dir", log_dir, "--stale-after", str(a.stale_after)]
        note = f"each task: one more worker on study {a.study_name}"
        args = (a.workers, log_dir, a, shlex.join(attach), note, work_dir)
        script = sweep.sbatch_script(f"tune-{a.study_name}", *args)
    if a.slurm and a.dry_run:
        sweep.submit(script, os.path.join(log_dir, "tune.sbatch"), a.sbatch_args, True)
        return 0
    storage_obj = open_storage(storage)
    if enqueued is not None and a.study_name not in optuna.get_all_study_names(storage_obj):
        earlier = glob.glob(os.path.join(work_dir, "runs", f"*__{a.study_name}_t[0-9]*__*"))
        if earlier:
            raise SweepError(f"runs/ holds runs of an earlier study {a.study_name} ({earlier[0]}): use a new name")
        for values in enqueued:  # run first
            load_study(storage_obj, a.study_name, config)[0].enqueue_trial(values)
    study, config = load_study(storage_obj, a.study_name, config, int(os.environ.get("SLURM_ARRAY_TASK_ID") or 0))
    if a.script == "report":
        say(
            f"report of study {a.study_name} (runs in {config['work_dir']}/runs) to {os.path.abspath(a.out or log_dir)}"
        )
        write_report(study, config, storage, os.path.abspath(a.out or log_dir))
        return 0
    runs = f"{config['trials']} trials of {config['script']} write {config['work_dir']}/runs; logs in {log_dir}"
    say(f"study {a.study_name} in {storage}: {runs}")
    update = first_update(config)
    if update is not None and update >= config["total_timesteps"]:  # issue #54: eight trials all scored -1,130.9
        total = f"{config['total_timesteps']:,}"
        say(
            f"note: each run's first update comes at step {update:,}, when its budget of {total} steps is spent: every "
            "episode the objective reads is played before it, so every trial scores the same; give -- "
            f"--total-timesteps more than {update:,}"
        )
    if a.slurm:
        sweep.make_dir(work_dir, "--work-dir")  # the tasks start there
        sweep.submit(script, os.path.join(log_dir, "tune.sbatch"), a.sbatch_args, False)
        say(f"when it ends: python benchmark/tune.py report --study-name {a.study_name} --storage {storage}")
        return 0
    stopped = Worker(study, config, a, log_dir).run()
    if stopped:
        continues = f"the same command (or tune.py attach --study-name {a.study_name} ...) continues the study"
        if stopped != "stopped":
            mend = "rerun the same command once its cause is mended, or a changed command under a new --study-name"
            raise SweepError(f"the tuner failed ({stopped}); {mend} (a study keeps its settings)")
        say(f"stopped: {continues}")
        return 130
    if any(t.state.name == "RUNNING" for t in study.trials):
        say("this worker is done; trials still run elsewhere: `tune.py report` when they end")
    else:
        write_report(study, config, storage, log_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
