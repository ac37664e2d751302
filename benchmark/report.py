"""Summarise training runs from their TensorBoard event files: tables beside published scores, learning curves, each
run's segments (one per process) and training statistics (docs/sweeps.md#reports); per task a 95% bootstrap interval
of the mean over seeds, and across tasks the interquartile mean of reference-normalised scores and the probability of
beating the reference, as Agarwal et al. (NeurIPS 2021) report scores (docs/results.md).

    python benchmark/report.py runs/ --out benchmark/results/
    python benchmark/report.py runs/ --out benchmark/results/NAME/ --csv   # and each run's scalars as CSV
    python benchmark/report.py benchmark/results/NAME/scalars/ --out benchmark/results/NAME/  # the same from them
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import io
import itertools
import math
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sweep import Parser, SweepError, count, make_dir, one_line_errors, parse_run_name  # one-line errors; run names

import run_utils  # in the repository root, which importing sweep puts on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))

RETURN_TAG = "charts/episodic_return"
EPISODES_TAG = "charts/episodes"  # dqn_snake_vec: how many games each logged return is the mean of (else one)
SPS_TAG = "charts/SPS"
STAT_TAGS = {  # what a shortfall is read against, as means over each tenth of a run's budget
    "losses/entropy": "entropy",
    "losses/clipfrac": "clipfrac",
    "losses/approx_kl": "approx KL",
    "losses/value_loss": "value loss",
    "losses/td_loss": "TD loss",
    "losses/explained_variance": "explained variance",
    "losses/q_values": "Q-values",
    "charts/epsilon": "epsilon",
    "charts/learning_rate": "learning rate",
}
DASH = "-"
SMOOTH = 20  # episodes in the curves' moving average
Scalars = dict[str, list[tuple[int, float, float]]]  # tag -> [(step, wall time, value)]
# A run's scalars CSV (--csv writes <run>.csv.gz, a seventh of the event files' size; an unzipped one reads the same):
# per process, in its event files' order, its texts (tag text:<name>, step 0, the text in the text column), every
# scalar event the report keeps (a redone one left out), in the order logged, then one process:end row, its last step
# and wall time counting the redone events. A value is the shortest text of its float32 (TensorBoard keeps scalars as
# float32, so it reads back exactly), a wall time to the millisecond: 40% less to keep than full reprs.
CSV_HEADER = ["process", "tag", "step", "wall_time", "value", "text"]
CSV_TEXTS = ("hyperparameters", "device")  # the texts a run is rebuilt from
CSV_END = "process:end"


@dataclass
class Segment:  # one process's part of a run (a fresh start or a --resume): one event file
    device: str
    start_step: int
    last_step: int = 0  # the last step it logged and kept
    lost_steps: int = 0  # steps it logged past the next segment's start: lost with the process and done again
    wall_time: float = 0.0
    sps: float | None = None
    episodes: int = 0


@dataclass
class Run:
    path: str
    name: str
    env: str
    exp: str
    seed: int
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the steps the episodes ended at
    returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0))  # games behind each return (1, or a window's)
    last_step: int = 0
    wall_time: float = 0.0  # the segments' summed, not the time between a stop and its resume
    last_event: float = 0.0
    sps_by_device: dict[str, float] = field(default_factory=dict)  # median per device, in the order they ran
    segments: list[Segment] = field(default_factory=list)
    stats: dict[str, np.ndarray] = field(default_factory=dict)  # STAT_TAGS tag -> (n, 2) array of (step, value)
    total_timesteps: int | None = None
    iteration_steps: int = 0  # num_envs x num_steps: a run may end at the last whole iteration below its total
    checkpoint: str | None = None
    checkpoint_status: str | None = None  # as run_utils.CHECKPOINT_STATUSES
    checkpoint_step: int = 0
    live: bool = False  # a process holds runs/<run>/.lock: it trains now

    @property
    def episodes(self) -> int:
        return int(self.counts.sum())

    def final_return(self, last_n: int) -> float | None:
        return mean_of_last(self.returns, self.counts, last_n)

    def status(self, now: float, recent_s: float, long: bool = False) -> str:
        """done | stopped | diverged | running | stale, with how far it got (``long``: and what to do about it)."""
        step, total = max(self.last_step, self.checkpoint_step), self.total_timesteps
        at = f"{math.floor(100.0 * step / total)}%" if total else f"step {step:,}"
        resume = f"resume with --resume {self.checkpoint}" if self.checkpoint else ""
        if self.live:  # trains now, whatever its last checkpoint said (a resumed run's says stopped until its next)
            return f"running ({at})"
        if self.checkpoint_status == "finished":
            return "done"
        if self.checkpoint_status == "stopped":
            return f"stopped at {at} ({resume})" if long else f"stopped ({at})"
        if self.checkpoint_status == "diverged":  # its checkpoint holds the last finite weights
            kept = f"NaN or infinite weights; its checkpoint keeps step {self.checkpoint_step:,}"
            return f"diverged at {at} ({kept})" if long else f"diverged ({at})"
        if self.checkpoint_status is None and total and self.last_step + self.iteration_steps > total - 1:
            return "done"  # no checkpoint to ask: it reached its last whole iteration
        if now - self.last_event < recent_s:
            return f"running ({at})"
        if not long:
            return f"stale ({at})"
        hint = "crashed or killed?" + (f"; {resume}" if resume else "")
        return f"stale at {at}: no event for {fmt_time(now - self.last_event)} ({hint})"


def read_event_file(file: str) -> tuple[Scalars, dict[str, str]]:
    """One event file's scalars and texts (tag -> text): the one reader of TensorBoard files (speed.py's, tune.py's)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(file, size_guidance={"scalars": 0, "tensors": 0}).Reload()  # every event (0: no limit)
    tags = acc.Tags()
    scalars = {tag: [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)] for tag in tags["scalars"]}
    texts = {}
    for tag in tags["tensors"]:
        values = acc.Tensors(tag)[0].tensor_proto.string_val
        if values:
            texts[tag.removesuffix("/text_summary")] = values[0].decode(errors="replace")
    return {tag: events for tag, events in scalars.items() if events}, texts


def mean_of_last(returns: np.ndarray, counts: np.ndarray, last_n: int) -> float | None:
    """The mean return of the last ``last_n`` episodes (None without one); a return logged as the mean of several
    games (``counts``) counts as that many, the oldest of them cut to fit."""
    later = np.cumsum(counts[::-1])[::-1] - counts  # the games that ended after each
    weights = np.clip(last_n - later, 0, counts)
    return float(np.dot(weights, returns) / weights.sum()) if len(returns) else None


@dataclass
class Process:  # what one process logged: one event file, or its rows in a run's scalars CSV
    scalars: Scalars
    texts: dict[str, str]
    last_step: int = 0  # its last step and its last event's wall time (its file's time if it logged no scalar),
    last_time: float = 0.0  # counting the events a later process redid, which a CSV leaves out


def device_name(texts: dict[str, str], tags) -> str:
    gpu = any(tag.startswith("gpu/") or tag == "memory/peak_allocated_mib" for tag in tags)
    return texts.get("device", "").strip() or ("GPU (name not logged)" if gpu else "not logged")


def run_name(path: str) -> str:  # a run folder's name, or its scalars CSV's without .csv(.gz)
    name = os.path.basename(os.path.normpath(path))
    return name.removesuffix(".gz").removesuffix(".csv") if os.path.isfile(path) else name


def open_csv(path: str):  # a scalars CSV for reading, gzipped or not
    return gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")


def load_run(path: str, csv_dir: str | None = None) -> Run | None:
    """A run folder's (or a scalars CSV's, as --csv writes them) segments, returns, SPS, statistics and status; None
    for one not named as a run. ``csv_dir``: also write the run's scalars CSV there."""
    from_csv, name = os.path.isfile(path), run_name(path)
    parsed = parse_run_name(name)
    if parsed is None:
        return None
    run = Run(path, name, *parsed[:3])
    if from_csv:
        assemble_run(run, read_scalars_csv(path), csv_dir)
        # no checkpoint and no lock beside a CSV: its status comes from its steps against its total (done at its last
        # whole iteration), else from its last event's age, as for a run folder without a checkpoint
        return run
    processes = []
    for file in sorted(os.path.join(path, f) for f in os.listdir(path) if f.startswith("events.out.tfevents")):
        scalars, texts = read_event_file(file)
        events = [e for tag_events in scalars.values() for e in tag_events]
        last_time = max((e[1] for e in events), default=0.0) or os.path.getmtime(file)  # died before its first scalar
        processes.append(Process(scalars, texts, max((e[0] for e in events), default=0), last_time))
    assemble_run(run, processes, csv_dir)
    read_checkpoint(run)
    run.live = run_utils.run_is_live(path)
    return run


def assemble_run(run: Run, processes: list[Process], csv_dir: str | None = None) -> None:
    """The run's figures from what its processes logged, in their files' order (``csv_dir``: and its scalars CSV)."""
    parts = [p for p in processes if p.scalars]  # not one that died at once
    events = [[e for tag_events in p.scalars.values() for e in tag_events] for p in parts]
    # a resumed process starts at its checkpoint's step: steps give the order, clocks only break ties
    order = sorted(range(len(parts)), key=lambda i: min((e[0], e[1]) for e in events[i]))
    starts = [min(e[0] for e in events[i]) for i in order]
    returns, sps, stats, kept_of = [], {}, {}, {}
    for i, start, keep_until in zip(order, starts, [*starts[1:], math.inf]):  # what came later was lost and redone
        p = parts[i]
        kept = {tag: [e for e in tag_events if e[0] <= keep_until] for tag, tag_events in p.scalars.items()}
        kept = kept_of[id(p)] = {tag: tag_events for tag, tag_events in kept.items() if tag_events}
        kept_events = [e for tag_events in kept.values() for e in tag_events]  # its first event at least
        seg = Segment(device_name(p.texts, p.scalars), start)
        seg.lost_steps = max(0, p.last_step - keep_until)
        seg.last_step = max(e[0] for e in kept_events)
        seg.wall_time = max(e[1] for e in kept_events) - min(e[1] for e in kept_events)
        run.last_event = max(run.last_event, p.last_time)  # a crash's last words count for "stale"
        counts = {e[0]: e[2] for e in kept.get(EPISODES_TAG, [])}  # logged at the same step as the mean
        seg_returns = [(e[0], e[2], counts.get(e[0], 1)) for e in kept.get(RETURN_TAG, [])]
        returns += seg_returns
        seg.episodes = int(sum(games for *_, games in seg_returns))
        if kept.get(SPS_TAG):
            seg.sps = float(np.median([e[2] for e in kept[SPS_TAG]]))
            sps.setdefault(seg.device, []).extend(e[2] for e in kept[SPS_TAG])
        for tag in STAT_TAGS.keys() & kept.keys():
            stats.setdefault(tag, []).extend((e[0], e[2]) for e in kept[tag])
        run.segments.append(seg)
    for p in processes:  # also one that died at once: its budget puts it in its group's row
        hparams = parse_hparams(p.texts.get("hyperparameters", ""))
        if hparams.get("total_timesteps", "").isdecimal():
            run.total_timesteps = int(hparams["total_timesteps"])
        envs, steps = hparams.get("num_envs", ""), hparams.get("num_steps", "1")  # DQN: one step per iteration
        if envs.isdecimal() and steps.isdecimal():
            run.iteration_steps = int(envs) * int(steps)
    returns.sort(key=lambda r: r[0])  # stable: episodes that ended at the same step keep their order
    run.steps, run.returns, run.counts = np.array(returns, dtype=np.float64).reshape(-1, 3).T
    run.stats = {tag: np.array(sorted(values), dtype=np.float64) for tag, values in stats.items()}
    run.sps_by_device = {device: float(np.median(values)) for device, values in sps.items()}
    run.last_step = max((seg.last_step for seg in run.segments), default=0)
    run.wall_time = sum(seg.wall_time for seg in run.segments)
    run.last_event = run.last_event or max((p.last_time for p in processes), default=0.0)
    if csv_dir:
        write_scalars_csv(os.path.join(csv_dir, f"{run.name}.csv.gz"), processes, kept_of)


def write_scalars_csv(path: str, processes: list[Process], kept_of: dict[int, Scalars]) -> None:
    """The run's scalars CSV (CSV_HEADER), gzipped: what load_run rebuilds the same run from."""
    rows = []
    for n, p in enumerate(processes, 1):
        kept = kept_of.get(id(p), {})
        texts = {tag: p.texts[tag] for tag in CSV_TEXTS if tag in p.texts}
        if device_name(p.texts, kept) != device_name(p.texts, p.scalars):  # named by GPU samples that were redone
            texts["device"] = device_name(p.texts, p.scalars)
        rows += [[n, f"text:{tag}", 0, "", "", text] for tag, text in texts.items()]
        rows += [
            [n, tag, step, f"{t:.3f}", str(np.float32(v)), ""] for tag, events in kept.items() for step, t, v in events
        ]
        rows.append([n, CSV_END, p.last_step, f"{p.last_time:.3f}", "", ""])
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    writer.writerows(rows)
    with open(path + ".tmp", "wb") as f:  # mtime 0 and no name in the header: the same scalars, the same bytes
        f.write(gzip.compress(text.getvalue().encode(), compresslevel=9, mtime=0))
    os.replace(path + ".tmp", path)  # never half a file, even when it rewrites the CSV it was read from


def is_scalars_csv(path: str) -> bool:
    try:
        with open_csv(path) as f:
            return f.readline().rstrip("\r\n") == ",".join(CSV_HEADER)
    except (OSError, UnicodeDecodeError, EOFError):
        return False


def read_scalars_csv(path: str) -> list[Process]:
    """The processes of a run's scalars CSV, as write_scalars_csv wrote them."""
    processes: dict[int, Process] = {}
    with open_csv(path) as f:
        reader = csv.reader(f)
        next(reader, None)  # the header
        try:
            for n, tag, step, wall_time, value, text in reader:
                p = processes.setdefault(int(n), Process({}, {}))
                if tag.startswith("text:"):
                    p.texts[tag.removeprefix("text:")] = text
                elif tag == CSV_END:
                    p.last_step, p.last_time = int(step), float(wall_time)
                else:
                    event = (int(step), float(wall_time), float(np.float32(value)))  # as the event file has it
                    p.scalars.setdefault(tag, []).append(event)
        except ValueError as exc:  # a cell that is not a number, a row of another length
            raise SweepError(f"{path}, line {reader.line_num}: not a scalars CSV row ({exc})") from None
    return [processes[n] for n in sorted(processes)]


def parse_hparams(text: str) -> dict[str, str]:
    """The CleanRL-style "|param|value|" table the scripts log as the "hyperparameters" text."""
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()]
    return {c[0]: c[1] for c in cells if len(c) == 2 and c[0] and not set(c[0]) <= set("-:")}


def read_checkpoint(run: Run) -> None:
    """Status, step and total from the run's checkpoint.pt (as data only); an unreadable one leaves the status to the
    event files."""
    path = os.path.join(run.path, "checkpoint.pt")
    if not os.path.isfile(path):
        return
    try:
        ckpt = run_utils.read_checkpoint(path)
    except (OSError, run_utils.CheckpointError) as exc:  # not one to --resume from either
        print(f"warning: {exc}; status from the event files", file=sys.stderr)
        return
    run.checkpoint = path
    status = ckpt.get("status")
    run.checkpoint_status = status if status in run_utils.CHECKPOINT_STATUSES else None
    run.checkpoint_step = int(ckpt.get("global_step") or 0)
    total = (ckpt.get("args") or {}).get("total_timesteps")
    if isinstance(total, int) and total > 0:
        run.total_timesteps = total


@dataclass
class Reference:  # a published score
    score: str
    source: str
    their_env: str  # the environment they measured on, e.g. BreakoutNoFrameskip-v4
    protocol: str
    url: str
    ours: bool  # measured on the env we run (their_env is ours)


def load_references(path: str) -> dict[str, list[Reference]]:
    """env tag (ALE_Breakout-v5) -> references, comparable ones first, from a CSV with env, score, source[,
    their_env, protocol, url]; an empty path: none. A missing file or column raises (OSError, ValueError)."""
    refs: dict[str, list[Reference]] = {}
    if not path:
        return refs
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [column for column in ("env", "score", "source") if column not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"no {', '.join(missing)} column in its header")
        for row in reader:
            env = (row["env"] or "").strip()
            if env and not env.startswith("#"):
                cells = [(row.get(k) or "").strip() for k in ("score", "source", "their_env", "protocol", "url")]
                tag, theirs = env.replace("/", "_"), cells[2] or env
                ref = Reference(*cells[:2], theirs, *cells[3:], ours=theirs.replace("/", "_") == tag)
                refs.setdefault(tag, []).append(ref)
    return {env: sorted(rs, key=lambda r: not r.ours) for env, rs in refs.items()}


def fmt(x: float | None, digits: int = 0) -> str:  # a number with thousands separators, "-" for none (speed.py too)
    return DASH if x is None or not math.isfinite(x) else f"{x:,.{digits}f}"


def fmt_time(seconds: float) -> str:
    h, rem = divmod(int(round(seconds)), 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


def fmt_steps(step: float) -> str:  # 2.5M, 640k, 900
    return f"{step / 1e6:.3g}M" if step >= 1e6 else f"{step / 1e3:.3g}k" if step >= 1e3 else f"{step:.3g}"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    cell = lambda c: str(c).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]


def device_cells(runs: list[Run]) -> tuple[str, str]:
    """The SPS and device cells: one figure and name, or one per device ("4,059 / 370"), means of the runs' medians."""
    devices = list(dict.fromkeys(seg.device for r in runs for seg in r.segments))
    by_device = [[r.sps_by_device[d] for r in runs if d in r.sps_by_device] for d in devices]
    sps = " / ".join(fmt(float(np.mean(v)) if v else None) for v in by_device)
    return sps or DASH, " / ".join(devices) or DASH


# Scores as the field reports them since Agarwal et al., "Deep Reinforcement Learning at the Edge of the Statistical
# Precipice" (NeurIPS 2021): per task a bootstrap interval of the mean over seeds; across tasks the interquartile mean
# (IQM) of normalised scores with a stratified bootstrap interval, and a probability of improvement. Written here in
# numpy, not imported from their library rliable: rliable 1.2 is an sdist only and requires arch (which pulls
# statsmodels), pandas, seaborn, absl-py and scipy, none of which the project needs otherwise (scipy comes only with
# the mjx extra), for a trimmed mean and a percentile bootstrap of a few lines each. The definitions are rliable's:
# IQM = scipy.stats.trim_mean(scores, 0.25) over every run of every task, the percentile method (its default), the
# tasks as strata. Each interval draws from a generator seeded with BOOTSTRAP_SEED: the same runs give the same report.
BOOTSTRAP_SEED = 0
BOOTSTRAP_REPS = 10_000
CI_LEVEL = 0.95


def iqm(scores: np.ndarray) -> np.ndarray:
    """The interquartile mean along the last axis: the mean of what is left once the lowest and the highest int(n / 4)
    values are cut (scipy.stats.trim_mean(scores, 0.25, axis=-1), rliable's aggregate_iqm)."""
    x = np.sort(np.asarray(scores, dtype=np.float64), axis=-1)
    cut = int(0.25 * x.shape[-1])
    return x[..., cut : x.shape[-1] - cut].mean(axis=-1)


def stratified_bootstrap(tasks: list[np.ndarray], statistic, reps: int, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """``statistic`` over ``reps`` resamples, each drawing every task's scores with replacement from that task's own
    (as many as it has): a task keeps its number of seeds and never lends one to another. ``statistic`` takes one
    (reps, seeds) array per task and returns one value per resample."""
    rng = np.random.default_rng(seed)
    return statistic([t[rng.integers(0, len(t), size=(reps, len(t)))] for t in map(np.asarray, tasks)])


def percentile_interval(samples: np.ndarray, level: float = CI_LEVEL) -> tuple[float, float]:
    """The bootstrap distribution's central ``level`` (the percentile method)."""
    lo, hi = np.percentile(samples, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def mean_interval(scores: list[float], reps: int) -> tuple[float, float] | None:
    """The 95% bootstrap interval of the mean over seeds; None for fewer than two (nothing to resample)."""
    if len(scores) < 2:
        return None
    return percentile_interval(stratified_bootstrap([np.asarray(scores)], lambda s: s[0].mean(axis=1), reps))


def prob_above(tasks: list[np.ndarray], refs: list[float]) -> np.ndarray:
    """Per resample, the fraction of each task's runs that score above its reference (a tie counts half), averaged
    over tasks: rliable's probability of improvement with the reference one fixed number per task."""
    return np.mean([np.mean((x > ref) + 0.5 * (x == ref), axis=-1) for x, ref in zip(tasks, refs)], axis=0)


AGGREGATES = [  # of one (resamples, seeds) array of normalised scores per task: the reference is 1 in each
    lambda tasks: iqm(np.concatenate(tasks, axis=-1)),
    lambda tasks: prob_above(tasks, [1.0] * len(tasks)),
]


def fmt_interval(interval: tuple[float, float] | None, digits: int = 1) -> str:
    return DASH if interval is None else f"{fmt(interval[0], digits)} to {fmt(interval[1], digits)}"


def numeric_reference(refs: list[Reference], random: float = 0.0) -> tuple[Reference, float] | None:
    """The reference a task is normalised by: the first listed (one measured on our env where there is one) whose
    score is a number above ``random``, the score normalised to 0 (one at or below it leaves nothing to divide by)."""
    for ref in refs:
        with contextlib.suppress(ValueError):
            value = float(ref.score.replace(",", ""))
            if value > random and math.isfinite(value):
                return ref, value
    return None


def load_random_scores(path: str) -> dict[str, float]:
    """env tag (ALE_Breakout-v5) -> a random policy's score, from a CSV with env and score (random_scores.py writes
    it); an empty path: none. A missing file or column raises (OSError, ValueError)."""
    if not path:
        return {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not {"env", "score"} <= set(reader.fieldnames or []):
            raise ValueError("no env and score columns in its header")
        return {row["env"].strip().replace("/", "_"): float(row["score"]) for row in reader if row["env"].strip()}


def normalise(scores: np.ndarray, reference: float, random_score: float | None) -> np.ndarray:
    """0 a random policy's score (none: 0), 1 the reference's."""
    zero = random_score or 0.0
    return (scores - zero) / (reference - zero)


def seed_groups(runs: list[Run]):
    """(exp, env, budget, its runs): a row per script, env and budget (runs sorted so): a 1M run's return is not a 10M
    run's."""
    for (exp, env, total), members in itertools.groupby(runs, lambda r: (r.exp, r.env, r.total_timesteps)):
        yield exp, env, total, list(members)


def group_table(
    runs: list[Run],
    refs: dict[str, list[Reference]],
    last_n: int,
    now: float,
    recent: float,
    reps: int = BOOTSTRAP_REPS,
):
    rows = []
    for exp, env, total, group in seed_groups(runs):
        finals = [f for f in (r.final_return(last_n) for r in group) if f is not None]
        ret = fmt(float(np.mean(finals)), 1) if finals else DASH
        if len(finals) > 1:
            ret += f" ± {fmt(float(np.std(finals, ddof=1)), 1)}"
        if len(finals) < len(group):
            ret += f" ({len(finals)}/{len(group)} runs with episodes)"
        lo, hi = min(r.last_step for r in group), max(r.last_step for r in group)
        steps = (f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}") + (f" of {total:,}" if total else "")
        wall = fmt_time(float(np.mean([r.wall_time for r in group])))
        ref = "; ".join(f"{r.score} ({r.source}{'' if r.ours else ', ' + r.their_env})" for r in refs.get(env, []))
        ci = fmt_interval(mean_interval(finals, reps))  # beside the reference: does it fall inside?
        states = ", ".join(sorted({r.status(now, recent) for r in group}))
        rows.append([exp, env, str(len(group)), ret, steps, wall, *device_cells(group), ref or DASH, ci, states])
    header = ["script (exp_name)", "env", "seeds", f"return, last {last_n} episodes (mean ± std)", "steps reached"]
    ci_header = f"{CI_LEVEL:.0%} CI of the mean (bootstrap over seeds)"
    return md_table([*header, "wall time", "SPS", "device", "reference", ci_header, "status"], rows)


def aggregate_section(
    runs: list[Run], refs: dict[str, list[Reference]], randoms: dict[str, float], last_n: int, reps: int
) -> list[str]:
    """Each task's normalised scores, beside the reference and its protocol and the random policy's score, then per
    script the IQM of its runs' normalised scores and how often a run beats the reference, each with a stratified
    bootstrap interval. A script whose every task has a random score: (score - random) / (reference - random); else
    score / reference, the random policy taken as 0."""
    groups = {}  # exp -> [(env, budget, scores)]
    for exp, env, total, group in seed_groups(runs):
        scores = np.array([f for f in (r.final_return(last_n) for r in group) if f is not None])
        if len(scores):
            groups.setdefault(exp, []).append((env, f"{fmt_steps(total)} steps" if total else "", scores))
    tasks, no_ref = {}, []  # exp -> [(env, budget, scores, reference, its value, random score or None)]
    for exp, members in groups.items():
        with_random = all(env in randoms for env, *_ in members)  # one normalisation for all of a script's tasks
        for env, budget, scores in members:
            random_score = randoms[env] if with_random else None
            found = numeric_reference(refs.get(env, []), random_score or 0.0)
            if found:
                tasks.setdefault(exp, []).append((env, budget, scores, *found, random_score))
            else:
                no_ref.append(f"{env} ({exp})")
    if not tasks:
        return ["", "## Across tasks", "", "No task with a score has a numeric reference score: no aggregate."]
    intro = (
        "As Agarwal et al. (NeurIPS 2021, rliable) report scores. Normalised score: (a run's score − a random "
        "policy's) ÷ (the reference score − a random policy's), so 0 is a random policy and 1 the reference on every "
        f"task; a run's score is its last {last_n} episodes' mean, as above; the reference is the first listed for the "
        "env with a score above the random policy's (one measured on our env where there is one), shown here with its "
        "protocol; the random policy's score is ours, on our env (--random, benchmark/random_scores.py: uniform "
        "random actions, 100 episodes). A script with a task that has no random score is normalised by the reference "
        "alone (score ÷ reference, the random policy taken as 0, shown -; a reference must be positive). A task is a "
        "row of the table above "
        "(script, env, budget), its runs counted where they stand, finished or not. IQM: the mean of the middle half "
        "of all of a script's runs' normalised scores (25% cut at each end). P(run > reference mean): per task, the "
        "fraction of our runs that score above the reference's published mean (a tie counts half), averaged over "
        "tasks. The references publish no per-seed scores (a mean, at best ± the std of 3 seeds), so this is not "
        "rliable's chance that our run beats a reference run: the reference's seed-to-seed spread is left out, and "
        "the figure says how often our runs beat the published number. "
        f"{CI_LEVEL:.0%} CIs: percentile bootstrap, {reps:,} resamples (--bootstrap-reps), generator seed "
        f"{BOOTSTRAP_SEED}; across tasks stratified (each task's seeds resampled within that task, the reference held "
        "fixed). With a handful of seeds a percentile interval is narrower than a true 95% one (it never reaches past "
        "the lowest and highest seed); a task with one seed has none (-)."
    )
    task_rows, agg_rows = [], []
    for exp, members in tasks.items():
        for env, budget, scores, ref, value, random_score in members:
            ours = fmt(float(np.mean(scores)), 1) + (
                f" ± {fmt(float(np.std(scores, ddof=1)), 1)}" if len(scores) > 1 else ""
            )
            measured = "" if ref.ours else f", {ref.their_env}"
            ratios = normalise(scores, value, random_score)
            above = np.sum(scores > value) + 0.5 * np.sum(scores == value)
            task_rows.append(
                [f"{env} ({', '.join(filter(None, [exp, budget]))})", len(scores), ours]
                + [fmt_interval(mean_interval(list(scores), reps)), f"{ref.score} ({ref.source}{measured})"]
                + [ref.protocol or DASH, DASH if random_score is None else fmt(random_score, 1)]
                + [f"{np.mean(ratios):.2f}", fmt_interval(mean_interval(list(ratios), reps), 2)]
                + [f"{above:g} of {len(scores)}"]
            )
        strata = [normalise(scores, value, random_score) for *_, scores, _, value, random_score in members]
        one_each = all(len(t) == 1 for t in strata)  # nothing to resample: no interval
        cells = []
        for stat in AGGREGATES:
            point = float(stat([t[None, :] for t in strata])[0])
            interval = None if one_each else percentile_interval(stratified_bootstrap(strata, stat, reps))
            cells += [f"{point:.2f}", fmt_interval(interval, 2)]
        names = ", ".join(" ".join(filter(None, [env, budget])) for env, budget, *_ in members)
        agg_rows.append([exp, f"{len(members)} ({names})", sum(len(t) for t in strata), *cells])
    ci = f"{CI_LEVEL:.0%} CI"
    task_header = ["task", "seeds", f"ours, last {last_n} episodes (mean ± std)", ci, "reference", "its protocol"]
    task_header += ["random policy", "ours, normalised (mean)", ci, "runs above the reference mean"]
    agg_header = ["script", "tasks", "runs", "IQM of the normalised scores", ci, "P(run > reference mean)", ci]
    lines = [
        "",
        "## Across tasks",
        "",
        intro,
        "",
        *md_table(task_header, task_rows),
        "",
        *md_table(agg_header, agg_rows),
    ]
    if no_ref:
        lines += ["", "Left out, no numeric reference score above the random policy's: " + ", ".join(no_ref) + "."]
    return lines


def run_table(runs: list[Run], last_n: int, now: float, recent: float) -> list[str]:
    rows = []
    for r in runs:
        last = r.returns[-last_n:]  # ± its standard error: how far one seed's mean may sit from its expectation
        one_each = len(last) > 1 and r.counts.max() == 1  # a mean over a window's games has no spread to read
        se = f" ± {fmt(float(np.std(last, ddof=1) / np.sqrt(len(last))), 1)}" if one_each else ""
        ret = fmt(r.final_return(last_n), 1) + se
        sps, device = device_cells([r])
        rows.append([r.name, r.episodes, ret, f"{r.last_step:,}", fmt_time(r.wall_time), sps, device])
        rows[-1].append(r.status(now, recent, long=True))
    header = ["run", "episodes", f"return, last {last_n} episodes (± standard error)", "steps", "wall time", "SPS"]
    return md_table([*header, "device", "status"], rows)


def segments_section(runs: list[Run]) -> list[str]:
    """One row per process of each run continued with --resume, in the order they ran."""
    rows = [
        [r.name, i, s.device, f"{s.start_step:,}–{s.last_step:,}", fmt_time(s.wall_time), fmt(s.sps)]
        + [s.episodes, f"{s.lost_steps:,}" if s.lost_steps else DASH]
        for r in runs
        if len(r.segments) > 1
        for i, s in enumerate(r.segments, 1)
    ]
    if not rows:
        return []
    intro = (
        "Runs continued with --resume: one row per process. Steps a process logged after the checkpoint that the next "
        "one resumed from were lost with it and done again (redone); they are left out of every figure."
    )
    header = ["run", "segment", "device", "steps", "wall time", "SPS", "episodes", "redone"]
    return ["", "## Segments", "", intro, "", *md_table(header, rows)]


def band_means(values: np.ndarray, edges: np.ndarray) -> list[float | None]:
    """The mean of the (step, value[, weight]) rows in each band (lo, hi] of ``edges``; None for a band with none."""
    weights = values[:, 2] if values.shape[1] > 2 else np.ones(len(values))
    means = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (values[:, 0] > lo) & (values[:, 0] <= hi)
        means.append(float(np.average(values[inside, 1], weights=weights[inside])) if inside.any() else None)
    return means


def stats_section(runs: list[Run]) -> list[str]:
    """Per run, the means of the return and of each statistic it logged over each tenth of its budget, up to the
    step it reached: the curve's shape and what the losses did meanwhile."""
    lines = []
    for r in runs:
        tags = [tag for tag in STAT_TAGS if tag in r.stats]
        total = r.total_timesteps or r.last_step
        if not tags or r.last_step <= 0:
            continue
        edges = np.linspace(0, total, 11)
        edges = edges[: int(np.searchsorted(edges, r.last_step)) + 1]  # the bands the run has reached
        if r.last_step + max(r.iteration_steps, 1) <= edges[-1]:  # short of its band's end by an iteration or more
            edges[-1] = r.last_step
        columns = [band_means(np.column_stack([r.steps, r.returns, r.counts]), edges)]
        columns += [band_means(r.stats[tag], edges) for tag in tags]
        rows = []
        for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
            cells = [fmt(columns[0][i], 1)] + [DASH if c[i] is None else f"{c[i]:.3g}" for c in columns[1:]]
            rows.append([f"{fmt_steps(lo)}-{fmt_steps(hi)}", *cells])
        lines += ["", f"{r.name}:", "", *md_table(["steps", "return", *(STAT_TAGS[tag] for tag in tags)], rows)]
    intro = (
        "Means over each tenth of a run's budget (its last band ends where the run stands): the episodic return of the "
        f"games that ended in it, and each statistic as the script logged it ({', '.join(STAT_TAGS)})."
    )
    return ["", "## Training statistics", "", intro, *lines] if lines else []


def references_section(envs: list[str], refs: dict[str, list[Reference]]) -> list[str]:
    rows = [
        [env, r.score, f"[{r.source}]({r.url})" if r.url else r.source]
        + ["same as ours" if r.ours else f"{r.their_env} (not ours)", r.protocol or DASH]
        for env in envs
        for r in refs.get(env, [])
    ]
    if not rows:
        return ["## References", "", "No published reference for these envs in the references file.", ""]
    return ["## References", "", *md_table(["env", "score", "source", "measured on", "protocol"], rows), ""]


def curve_on_grid(runs: list[Run], grid: np.ndarray, smooth: int) -> np.ndarray:
    """One row per run: its return, a trailing mean over up to ``smooth`` episodes (a logged mean of several games
    counts as that many), interpolated onto ``grid``; NaN outside the steps it covered."""
    rows = np.full((len(runs), len(grid)), np.nan)
    for row, r in zip(rows, runs):
        if r.episodes:
            games = np.cumsum(np.insert(r.counts, 0, 0.0))  # the games ended by each logged return
            csum = np.cumsum(np.insert(r.returns * r.counts, 0, 0.0))
            start = np.maximum(0, games[1:] - smooth)
            trailing = (csum[1:] - np.interp(start, games, csum)) / (games[1:] - start)
            inside = (grid >= r.steps[0]) & (grid <= r.steps[-1])
            row[inside] = np.interp(grid[inside], r.steps, trailing)
    return rows


def curve_groups(runs: list[Run]) -> dict[str, list[Run]]:
    """An env's lines by name: one per script and budget, as the table's rows (the budget named where a script has
    several)."""
    keys = sorted({(r.exp, r.total_timesteps or 0) for r in runs})
    groups = {}
    for exp, total in keys:
        several = sum(other == exp for other, _ in keys) > 1
        name = f"{exp}, {fmt_steps(total)} steps" if several and total else exp
        groups[name] = [r for r in runs if (r.exp, r.total_timesteps or 0) == (exp, total)]
    return groups


def plot_env(env: str, runs: list[Run], out_dir: str, smooth: int) -> str | None:
    """The env's PNG: each script's mean over seeds, solid where every seed has data, with a min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    max_step = max((r.steps[-1] for r in runs if r.episodes), default=0)
    if max_step <= 0:
        return None
    grid = np.linspace(0, max_step, 200)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, members in curve_groups(runs).items():
        ys = curve_on_grid(members, grid, smooth)
        n = sum(r.episodes > 0 for r in members)
        with warnings.catch_warnings():  # a grid point no seed reached is a NaN, not a warning
            warnings.simplefilter("ignore", RuntimeWarning)
            mean, lo, hi = np.nanmean(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)
        every_seed = np.sum(~np.isnan(ys), 0) == n
        (line,) = ax.plot(grid, np.where(every_seed, mean, np.nan), label=f"{name} ({n} seed{'s' if n != 1 else ''})")
        ax.plot(grid, np.where(every_seed, np.nan, mean), color=line.get_color(), linestyle="--", linewidth=1)
        ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_title(f"{env}: mean over seeds, min-max band", fontsize=10)
    ax.set(xlabel="agent steps", ylabel=f"episodic return ({smooth}-episode moving avg)")
    ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, f"curve_{re.sub(r'[^A-Za-z0-9._-]', '_', env)}.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs_dir", help="the folder of the run folders (runs/)")
    p.add_argument("--out", help="folder for report.md and the PNGs (default: the runs folder)")
    p.add_argument("--refs", default=os.path.join(HERE, "reference_scores.csv"), help="reference scores ('': none)")
    p.add_argument(
        "--random",
        default=os.path.join(HERE, "random_scores.csv"),
        help="a random policy's score per env, the 0 of the normalised scores (random_scores.py writes it; '': none)",
    )
    p.add_argument("--last-n", type=count(1), default=100, help="episodes averaged at the end of each run")
    p.add_argument("--running-window", type=float, default=600, help="seconds after its last event a run is running")
    p.add_argument("--no-plots", action="store_true", help="write the tables only")
    p.add_argument(
        "--csv",
        action="store_true",
        help="also write OUT/scalars/<run>.csv.gz, each run's scalars and texts: the runs folder of the same report",
    )
    p.add_argument(
        "--bootstrap-reps", type=count(1), default=BOOTSTRAP_REPS, help="resamples behind each 95%% interval"
    )
    a = p.parse_args(argv)
    if not os.path.isdir(a.runs_dir):
        raise SweepError(f"runs directory '{a.runs_dir}' not found; pass the folder the scripts wrote (runs/)")
    a.out = a.out or a.runs_dir  # where the user stands, as the runs are: never the checkout unless asked
    print(f"[report] the runs in {os.path.abspath(a.runs_dir)}; report.md to {os.path.abspath(a.out)}", flush=True)
    try:
        refs = load_references(a.refs)
    except (OSError, ValueError) as exc:  # a mistyped --refs must not turn into "no published reference"
        why = "no such file" if isinstance(exc, FileNotFoundError) else exc
        raise SweepError(f"--refs {a.refs!r}: {why}; pass a CSV with env, score and source, or --refs ''") from None
    try:
        randoms = load_random_scores(a.random)
    except (OSError, ValueError) as exc:
        why = "no such file" if isinstance(exc, FileNotFoundError) else exc
        raise SweepError(f"--random {a.random!r}: {why}; pass a CSV with env and score, or --random ''") from None
    walk = [(d, files) for d, _, files in os.walk(a.runs_dir)]
    folders = sorted(d for d, files in walk if any(f.startswith("events.out") for f in files))
    names = {os.path.basename(os.path.normpath(d)) for d in folders}
    # --csv's scalars (gzipped, or unzipped by a user), or other CSVs
    csvs = [os.path.join(d, f) for d, files in walk for f in files if f.endswith((".csv", ".csv.gz"))]
    # a run's event files win over its CSV (a report that wrote its CSVs into the runs folder reads the events again)
    paths = folders + sorted(c for c in csvs if run_name(c) not in names and is_scalars_csv(c))
    if not any(parse_run_name(run_name(path)) for path in paths):
        raise SweepError(
            f"no run folders named env__exp__seed__timestamp with event files (or their --csv scalars) under "
            f"'{a.runs_dir}'"
        )
    make_dir(a.out, "--out")
    csv_dir = make_dir(os.path.join(a.out, "scalars"), "--out") if a.csv else None
    loaded = {d: load_run(d, csv_dir) for d in paths}
    runs = sorted(
        (r for r in loaded.values() if r), key=lambda r: (r.exp, r.env, r.total_timesteps or 0, r.seed, r.name)
    )
    now = time.time()
    # a seed per script and env: the run that got furthest (a seed restarted after a stop before its first checkpoint
    # left an earlier folder); the per-run table lists them all
    furthest = {(r.exp, r.env, r.total_timesteps, r.seed): r for r in sorted(runs, key=lambda r: (r.last_step, r.name))}
    seeds = [r for r in runs if furthest[r.exp, r.env, r.total_timesteps, r.seed] is r]
    tables = [*group_table(seeds, refs, a.last_n, now, a.running_window, a.bootstrap_reps), ""]
    if len(seeds) < len(runs):
        tables += [
            f"{len(runs) - len(seeds)} run folders repeat a seed of their group, which counts its furthest run",
            "",
        ]
    tables += ["Per run:", ""]
    tables += [
        *run_table(runs, a.last_n, now, a.running_window),
        *aggregate_section(seeds, refs, randoms, a.last_n, a.bootstrap_reps),
    ]
    tables += [*segments_section(runs), *stats_section(runs), ""]
    table = "\n".join([*tables, *references_section(sorted({r.env for r in runs}), refs)]) + "\n"
    generated = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = [f"# Results from `{a.runs_dir}`", "", f"Generated {generated}.", "", table]
    body += [] if a.no_plots else ["## Learning curves\n"]
    for env in [] if a.no_plots else sorted({r.env for r in runs}):
        path = plot_env(env, [r for r in seeds if r.env == env], a.out, SMOOTH)
        body.append(f"![{env}]({os.path.basename(path)})\n" if path else f"{env}: no episodes yet\n")
    skipped = sorted(d for d, run in loaded.items() if run is None)
    if skipped:
        body.append("Skipped (name not env__exp__seed__timestamp): " + ", ".join(skipped) + "\n")
    Path(a.out, "report.md").write_text("\n".join(body))
    print(table + f"wrote {os.path.join(a.out, 'report.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
