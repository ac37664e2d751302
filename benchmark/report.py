"""Summarise training runs from their TensorBoard event files: a markdown table and one learning-curve PNG per env.

    python benchmark/report.py runs/ --out benchmark/results/

Run directories are named ``{env_tag}__{exp_name}__{seed}__{timestamp}`` (the scripts' run_name); runs are grouped
by (exp_name, env). Per group the table gives: the mean +- sample std over seeds of each run's mean return over its
last 100 episodes (``charts/episodic_return``), steps reached (largest global_step logged, in agent steps), wall
time (first to last event of each process, summed), SPS (median of the logged ``charts/SPS``), the device, the
run's status, and published reference scores from ``benchmark/reference_scores.csv``; a References section lists
each env's references side by side with the environment they were measured on and their protocol, so a reader can
see which one is comparable (ALE v5 with sticky actions is not NoFrameskip-v4). No wandb needed. (dqn_snake_vec.py
logs ``charts/episodic_return`` as the mean over the games that ended in each log interval, so for Snake "last 100
episodes" means the last 100 logged points.)

Segments: every process writes its own event file, so a run continued with --resume (maybe on another machine) has
one file per part. Each file is a segment, named by the "device" text the scripts log at its start (older files
without it: "GPU (name not logged)" when they hold GPU samples). Segments are ordered by the step they start at (wall
time breaks ties: machines' clocks may disagree). A segment's events after the step the next one resumed from are
dropped: that work was lost with the process (a crash after the last checkpoint) and done again.
The wall time leaves out the gaps between segments; a run whose segments ran on different devices gets one SPS per
device, and a Segments section lists every part.

Training statistics: per run, the means over each tenth of its budget, up to where it stands, of the return and of
the logged entropy, clipfrac, approx KL, value loss and explained variance (DQN: TD loss, Q-values, epsilon) and
learning rate: what a score short of a reference is read against (the curve's shape, an entropy collapse, updates
that stopped moving the policy).

Status: a run's ``checkpoint.pt`` says how it stands (the scripts write "running" periodically, "stopped" when a
signal stopped them, "finished" at the end, "diverged" on NaN or infinite weights, keeping the last finite ones):
finished is "done", stopped is "stopped at X%" with the --resume command, diverged is "diverged at X%". A run
whose process holds its folder's lock (runs/<run>/.lock) is "running"; else one whose checkpoint says running (or
that has none) is "running" while its events are recent (--running-window) and "stale" after that: a crashed or
killed run also leaves "running" behind.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run_utils.py lives in the repo root, next to the training scripts
    sys.path.insert(0, ROOT)

from sweep import parse_run_name  # noqa: E402  (the run-id convention <env>__<exp>__<seed>__<time>, as in sweeps)

import run_utils  # noqa: E402

RETURN_TAG = "charts/episodic_return"
SPS_TAG = "charts/SPS"
# what a shortfall is read against: the training statistics, as means over each tenth of a run's budget
STAT_TAGS = {
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
STAT_BANDS = 10
HERE = os.path.dirname(os.path.abspath(__file__))
DASH = "-"


@dataclass
class Segment:
    """One process's part of a run (a fresh start or a --resume): one event file."""

    file: str
    device: str
    start_step: int  # the step it started (or resumed) at
    last_step: int = 0  # the last step it logged and kept
    lost_steps: int = 0  # steps it logged past the next segment's start: lost with the process and done again
    first_event: float = math.inf
    last_event: float = -math.inf
    sps: float | None = None
    episodes: int = 0

    @property
    def wall_time(self) -> float:
        return max(0.0, self.last_event - self.first_event)


@dataclass
class Run:
    path: str
    name: str
    env: str
    exp: str
    seed: int
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0))  # episode end steps
    returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    last_step: int = 0
    wall_time: float = 0.0
    last_event: float = 0.0
    sps: float | None = None  # median of every kept SPS sample
    sps_by_device: dict[str, float] = field(default_factory=dict)  # median per device, in the order they ran
    segments: list[Segment] = field(default_factory=list)
    total_timesteps: int | None = None
    iteration_steps: int = 0  # num_envs x num_steps: a run may stop at the last whole iteration below the total
    checkpoint: str | None = None  # path of checkpoint.pt, when the run has one
    checkpoint_status: str | None = None  # running | stopped | finished | diverged, as the checkpoint says
    checkpoint_step: int = 0
    live: bool = False  # a process holds runs/<run>/.lock: it trains now (run_utils.run_is_live)
    stats: dict[str, np.ndarray] = field(default_factory=dict)  # STAT_TAGS tag -> (n, 2) array of (step, value)

    @property
    def episodes(self) -> int:
        return len(self.returns)

    @property
    def devices(self) -> list[str]:
        return list(dict.fromkeys(seg.device for seg in self.segments if seg.last_step >= seg.start_step))

    def final_return(self, last_n: int) -> float | None:
        return float(np.mean(self.returns[-last_n:])) if len(self.returns) else None

    def final_return_se(self, last_n: int) -> float | None:
        """Standard error of final_return: how far one seed's last-N mean may sit from its own expectation."""
        last = self.returns[-last_n:]
        return float(np.std(last, ddof=1) / np.sqrt(len(last))) if len(last) > 1 else None

    def status(self, now: float, recent_s: float, long: bool = False) -> str:
        """done | stopped (X%) | diverged (X%) | running (X%) | stale (X%); long: with the --resume command, the
        diverged run's checkpoint step or the event age."""
        step, total = max(self.last_step, self.checkpoint_step), self.total_timesteps
        at = f"{math.floor(100.0 * step / total)}%" if total else f"step {step:,}"
        resume = f"resume with --resume {self.checkpoint}" if self.checkpoint else ""
        if self.checkpoint_status == "finished":
            return "done"
        if self.checkpoint_status == "stopped":
            return f"stopped at {at} ({resume})" if long else f"stopped ({at})"
        if self.checkpoint_status == "diverged":  # NaN or infinite weights; the checkpoint holds the last finite ones
            kept = f"NaN or infinite weights; its checkpoint keeps step {self.checkpoint_step:,}"
            return f"diverged at {at} ({kept})" if long else f"diverged ({at})"
        if self.live:  # its process holds the run folder's lock, whatever its checkpoint or its last event says
            return f"running ({at})"
        if self.checkpoint_status is None and total and self.last_step + self.iteration_steps > max(total - 1, 0):
            return "done"  # no checkpoint to ask: it reached its last whole iteration
        if now - self.last_event < recent_s:
            return f"running ({at})"
        if not long:
            return f"stale ({at})"
        hint = "crashed or killed?" + (f"; {resume}" if resume else "")
        return f"stale at {at}: no event for {fmt_time(now - self.last_event)} ({hint})"


def read_checkpoint(run: Run) -> None:
    """Status, step and total from runs/<run_name>/checkpoint.pt, read as data only (``run_utils.read_checkpoint``:
    a pickle that would run code is refused); torch is imported only when there is one."""
    path = os.path.join(run.path, "checkpoint.pt")
    if not os.path.isfile(path):
        return
    run.checkpoint = path
    try:
        ckpt = run_utils.read_checkpoint(path)
    except (OSError, run_utils.CheckpointError) as exc:  # an unreadable checkpoint leaves the status to the events
        print(f"warning: {exc}; status from the event files", file=sys.stderr)
        return
    status = ckpt.get("status")
    run.checkpoint_status = status if status in run_utils.CHECKPOINT_STATUSES else None
    run.checkpoint_step = int(ckpt.get("global_step") or 0)
    total = (ckpt.get("args") or {}).get("total_timesteps")
    if isinstance(total, int) and total > 0:
        run.total_timesteps = total


def find_run_dirs(root: str) -> list[str]:
    dirs = []
    for dirpath, _dirnames, filenames in os.walk(root):
        if any(f.startswith("events.out.tfevents") for f in filenames):
            dirs.append(dirpath)
    return sorted(dirs)


def parse_hparams(text: str) -> dict[str, str]:
    """Parse the CleanRL-style "|param|value|" markdown table written with add_text("hyperparameters")."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] and not set(cells[0]) <= set("-:"):
            out[cells[0]] = cells[1]
    return out


def read_event_file(file: str) -> tuple[dict[str, list[tuple[int, float, float]]], dict[str, str]]:
    """One event file's scalars (tag -> [(step, wall_time, value)]) and texts (tag -> text)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(file, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {tag: [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)] for tag in tags.get("scalars", [])}
    texts = {}
    for tag in tags.get("tensors", []):
        try:
            texts[tag.removesuffix("/text_summary")] = acc.Tensors(tag)[0].tensor_proto.string_val[0].decode()
        except (IndexError, UnicodeDecodeError):
            continue
    return {tag: events for tag, events in scalars.items() if events}, texts


def segment_device(scalars: dict, texts: dict[str, str]) -> str:
    if texts.get("device"):
        return texts["device"].strip()
    if any(tag.startswith("gpu/") or tag == "memory/peak_allocated_mib" for tag in scalars):
        return "GPU (name not logged)"
    return "not logged"


def first_step(scalars: dict[str, list[tuple[int, float, float]]]) -> int:
    """The step an event file starts at: the fresh start's 0, or the step of the checkpoint it resumed from."""
    return min(e[0] for events in scalars.values() for e in events)


def load_run(path: str) -> Run | None:
    name = os.path.basename(os.path.normpath(path))
    parsed = parse_run_name(name)
    if parsed is None:
        return None
    env, exp, seed, _ = parsed
    run = Run(path, name, env, exp, seed)
    parts = []
    for name in sorted(f for f in os.listdir(path) if f.startswith("events.out.tfevents")):
        scalars, texts = read_event_file(os.path.join(path, name))
        if scalars:  # a process that died before its first log leaves an empty file
            parts.append((name, scalars, texts))
    # in the order they ran: a resumed process starts at its checkpoint's step, so steps give the order; wall clocks
    # only break ties, as two machines' clocks may disagree by hours
    parts.sort(key=lambda part: (first_step(part[1]), min(e[1] for events in part[1].values() for e in events)))
    starts = [first_step(scalars) for _, scalars, _ in parts]
    returns, sps_all, sps_device, stats = [], [], {}, {}
    for i, (name, scalars, texts) in enumerate(parts):
        # the next segment resumed from a checkpoint at its start step: what this one logged after that was lost
        keep_until = starts[i + 1] if i + 1 < len(parts) else None
        seg = Segment(name, segment_device(scalars, texts), starts[i])
        if keep_until is not None:
            seg.lost_steps = max(0, max(e[0] for events in scalars.values() for e in events) - keep_until)
        for tag, events in scalars.items():
            kept = [e for e in events if keep_until is None or e[0] <= keep_until]
            run.last_event = max(run.last_event, max(e[1] for e in events))  # a crash's last words count for "stale"
            if not kept:
                continue
            seg.first_event = min(seg.first_event, min(e[1] for e in kept))
            seg.last_event = max(seg.last_event, max(e[1] for e in kept))
            seg.last_step = max(seg.last_step, max(e[0] for e in kept))
            if tag == RETURN_TAG:
                returns += [(e[0], e[2]) for e in kept]
                seg.episodes = len(kept)
            elif tag == SPS_TAG:
                seg.sps = float(np.median([e[2] for e in kept]))
                sps_all += [e[2] for e in kept]
                sps_device.setdefault(seg.device, []).extend(e[2] for e in kept)
            elif tag in STAT_TAGS:
                stats.setdefault(tag, []).extend((e[0], e[2]) for e in kept)
        run.segments.append(seg)
        for tag, text in texts.items():
            if tag == "hyperparameters":
                read_hparams(run, text)
    if returns:
        returns.sort(key=lambda r: r[0])  # stable: episodes that ended at the same step keep their order
        run.steps = np.array([r[0] for r in returns], dtype=np.float64)
        run.returns = np.array([r[1] for r in returns], dtype=np.float64)
    run.stats = {tag: np.array(sorted(values), dtype=np.float64) for tag, values in stats.items()}
    if sps_all:
        run.sps = float(np.median(sps_all))
        run.sps_by_device = {device: float(np.median(values)) for device, values in sps_device.items()}
    run.last_step = max((seg.last_step for seg in run.segments), default=0)
    run.wall_time = sum(seg.wall_time for seg in run.segments)  # not the hours between a stop and its resume
    read_checkpoint(run)
    run.live = run_utils.run_is_live(path)
    return run


def read_hparams(run: Run, text: str) -> None:
    """total_timesteps and the steps of one iteration from the "hyperparameters" table the scripts log."""
    hparams = parse_hparams(text)
    total = hparams.get("total_timesteps")
    if total and total.lstrip("-").isdigit():
        run.total_timesteps = int(total)
    envs, steps = hparams.get("num_envs", ""), hparams.get("num_steps", "1")  # DQN: one step per iteration
    if envs.isdigit() and steps.isdigit():
        run.iteration_steps = int(envs) * int(steps)


@dataclass
class Reference:
    score: str
    source: str  # short name, e.g. "SLM-Lab v5 benchmark"
    their_env: str = ""  # the environment they measured on, e.g. BreakoutNoFrameskip-v4
    protocol: str = ""  # steps, sticky actions or not, how the score is averaged, seeds
    url: str = ""


def load_references(path: str) -> dict[str, list[Reference]]:
    """env tag (ALE_Breakout-v5) -> references, from a CSV with env, score, source[, their_env, protocol, url];
    an empty path: none. A missing file or header column raises (FileNotFoundError, ValueError)."""
    refs: dict[str, list[Reference]] = {}
    if not path:
        return refs
    if not os.path.isfile(path):
        raise FileNotFoundError("no such file")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [column for column in ("env", "score", "source") if column not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"no {', '.join(missing)} column in its header")
        for row in reader:
            env = (row.get("env") or "").strip()
            if env and not env.startswith("#"):
                cells = {k: (row.get(k) or "").strip() for k in ("score", "source", "their_env", "protocol", "url")}
                cells["their_env"] = cells["their_env"] or env
                refs.setdefault(env.replace("/", "_"), []).append(Reference(**cells))
    return refs


def same_env(env: str, ref: Reference) -> bool:
    return ref.their_env.replace("/", "_") == env


def references_section(envs: list[str], refs: dict[str, list[Reference]]) -> list[str]:
    """Each env's references side by side: which environment each was measured on, and its protocol."""
    lines = ["## References", ""]
    rows = []
    for env in envs:
        for r in sorted(refs.get(env, []), key=lambda r: not same_env(env, r)):  # comparable ones first
            where = "same as ours" if same_env(env, r) else f"{r.their_env} (not ours)"
            source = f"[{r.source}]({r.url})" if r.url else r.source
            rows.append(f"| {env} | {r.score} | {source} | {where} | {r.protocol or DASH} |")
    if not rows:
        return [*lines, "No published reference for these envs in the references file.", ""]
    return [*lines, "| env | score | source | measured on | protocol |", "|---|---|---|---|---|", *rows, ""]


def fmt_num(x: float | None, digits: int = 1) -> str:
    if x is None or not math.isfinite(x):
        return DASH
    return f"{x:,.{digits}f}"


def fmt_time(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def group_stats(runs: list[Run], last_n: int) -> dict:
    finals = [r.final_return(last_n) for r in runs]
    finals = [f for f in finals if f is not None]
    sps = [r.sps for r in runs if r.sps is not None]
    devices = list(dict.fromkeys(d for r in runs for d in r.devices))
    sps_by_device = {d: [r.sps_by_device[d] for r in runs if d in r.sps_by_device] for d in devices}
    return {
        "n": len(runs),
        "n_with_episodes": len(finals),
        "mean": float(np.mean(finals)) if finals else None,
        "std": float(np.std(finals, ddof=1)) if len(finals) > 1 else (0.0 if finals else None),
        "steps_min": min(r.last_step for r in runs),
        "steps_max": max(r.last_step for r in runs),
        "wall_mean": float(np.mean([r.wall_time for r in runs])),
        "sps": float(np.mean(sps)) if sps else None,
        "devices": devices,
        "sps_by_device": {d: float(np.mean(v)) for d, v in sps_by_device.items() if v},  # mean over seeds
    }


def device_cells(devices: list[str], sps: float | None, sps_by_device: dict[str, float]) -> tuple[str, str]:
    """The SPS and device cells: one number and one name, or one of each per device ("4,059 / 370")."""
    if len(devices) <= 1:
        return fmt_num(sps, 0), devices[0] if devices else DASH
    return " / ".join(fmt_num(sps_by_device.get(d), 0) for d in devices), " / ".join(devices)


def curve_on_grid(runs: list[Run], grid: np.ndarray, smooth: int) -> np.ndarray:
    """One row per run: its (smoothed) episodic return interpolated onto grid, NaN outside the steps it covered."""
    rows = []
    for r in runs:
        row = np.full(len(grid), np.nan)
        if r.episodes:
            k = max(1, min(smooth, r.episodes))
            csum = np.cumsum(np.insert(r.returns, 0, 0.0))
            ma = np.empty(r.episodes)
            idx = np.arange(r.episodes)
            lo = np.maximum(0, idx - k + 1)
            ma[:] = (csum[idx + 1] - csum[lo]) / (idx + 1 - lo)  # trailing mean over up to k episodes
            inside = (grid >= r.steps[0]) & (grid <= r.steps[-1])
            row[inside] = np.interp(grid[inside], r.steps, ma)
        rows.append(row)
    return np.array(rows)


def plot_env(env: str, groups: dict[str, list[Run]], out_dir: str, grid_points: int, smooth: int) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    max_step = max((r.steps[-1] for runs in groups.values() for r in runs if r.episodes), default=0)
    if max_step <= 0:
        return None
    grid = np.linspace(0, max_step, grid_points)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for exp, runs in sorted(groups.items()):
        ys = curve_on_grid(runs, grid, smooth)
        if np.all(np.isnan(ys)):
            continue
        with np.errstate(all="ignore"), _quiet_nan_warnings():
            mean, lo, hi = np.nanmean(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)
        n = sum(r.episodes > 0 for r in runs)
        all_seeds = np.sum(~np.isnan(ys), 0) == n  # solid where every seed has data, dashed where some stopped
        (line,) = ax.plot(grid, np.where(all_seeds, mean, np.nan), label=f"{exp} ({n} seed{'s' if n != 1 else ''})")
        ax.plot(grid, np.where(all_seeds, np.nan, mean), color=line.get_color(), linestyle="--", linewidth=1)
        ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_title(f"{env}: mean over seeds, min-max band", fontsize=10)
    ax.set_xlabel("agent steps")
    ax.set_ylabel(f"episodic return ({smooth}-episode moving avg)")
    ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, f"curve_{re.sub(r'[^A-Za-z0-9._-]', '_', env)}.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


class _quiet_nan_warnings:
    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("ignore", category=RuntimeWarning)

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def segments_section(runs: list[Run]) -> list[str]:
    """One row per process of each run that was continued with --resume, in the order they ran."""
    if not runs:
        return []
    lines = [
        "",
        "## Segments",
        "",
        "Runs continued with --resume: one row per process. Steps a process logged after the checkpoint that the next "
        "one resumed from were lost with it and done again (redone); they are left out of every figure.",
        "",
        "| run | segment | device | steps | wall time | SPS | episodes | redone |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        for i, seg in enumerate(r.segments, 1):
            lines.append(
                f"| {r.name} | {i} | {seg.device} | {seg.start_step:,}–{seg.last_step:,} | {fmt_time(seg.wall_time)} "
                f"| {fmt_num(seg.sps, 0)} | {seg.episodes} | {f'{seg.lost_steps:,}' if seg.lost_steps else DASH} |"
            )
    return lines


def fmt_steps(step: float) -> str:
    """Steps in a band's label: 2.5M, 640k, 900."""
    if step >= 1e6:
        return f"{step / 1e6:.3g}M"
    return f"{step / 1e3:.3g}k" if step >= 1e3 else f"{step:.3g}"


def band_means(values: np.ndarray, edges: np.ndarray) -> list[float | None]:
    """The mean of the values logged at steps in each band (lo, hi] of ``edges``; None for a band with none."""
    means = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (values[:, 0] > lo) & (values[:, 0] <= hi) if len(values) else np.zeros(0, dtype=bool)
        means.append(float(values[inside, 1].mean()) if inside.any() else None)
    return means


def stats_section(runs: list[Run]) -> list[str]:
    """Per run, the means of its training statistics (those of STAT_TAGS it logged) and of its episodic return over
    each tenth of its budget, up to the step it reached: the shape of the curve and what the losses did meanwhile,
    which is what a score short of a reference is read against."""
    lines = []
    for r in runs:
        tags = [tag for tag in STAT_TAGS if tag in r.stats]
        total = r.total_timesteps or r.last_step
        if not tags or total <= 0 or r.last_step <= 0:
            continue
        edges = np.linspace(0, total, STAT_BANDS + 1)
        edges = edges[: int(np.searchsorted(edges, r.last_step)) + 1]  # the bands the run has reached
        if r.last_step + max(r.iteration_steps, 1) <= edges[-1]:  # short of its band's end by an iteration or more
            edges[-1] = r.last_step
        returns = np.column_stack([r.steps, r.returns]) if r.episodes else np.zeros((0, 2))
        columns = [band_means(returns, edges)] + [band_means(r.stats[tag], edges) for tag in tags]
        lines += [
            "",
            f"{r.name}:",
            "",
            "| steps | return | " + " | ".join(STAT_TAGS[tag] for tag in tags) + " |",
            "|---" * (len(tags) + 2) + "|",
        ]
        for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
            cells = [fmt_num(columns[0][i])] + [DASH if c[i] is None else f"{c[i]:.3g}" for c in columns[1:]]
            lines.append(f"| {fmt_steps(lo)}-{fmt_steps(hi)} | " + " | ".join(cells) + " |")
    if not lines:
        return []
    intro = (
        f"Means over each tenth of a run's budget (its last band ends where the run stands): the episodic return "
        f"of the games that ended in it, and each statistic as the script logged it ({', '.join(STAT_TAGS)})."
    )
    return ["", "## Training statistics", "", intro, *lines]


def build_report(runs: list[Run], refs: dict, last_n: int, now: float, recent_s: float) -> str:
    by_group: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        by_group.setdefault((r.exp, r.env), []).append(r)
    lines = [
        "| script (exp_name) | env | seeds | return, last "
        f"{last_n} episodes (mean ± std) | steps reached | wall time | SPS | device | reference | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (exp, env), group in sorted(by_group.items()):
        s = group_stats(group, last_n)
        if s["mean"] is None:
            ret = DASH
        elif s["n_with_episodes"] > 1:
            ret = f"{fmt_num(s['mean'])} ± {fmt_num(s['std'])}"
        else:
            ret = fmt_num(s["mean"])
        if s["n_with_episodes"] < s["n"]:
            ret += f" ({s['n_with_episodes']}/{s['n']} runs with episodes)"
        steps = f"{s['steps_min']:,}" if s["steps_min"] == s["steps_max"] else f"{s['steps_min']:,}–{s['steps_max']:,}"
        ref = "; ".join(
            f"{r.score} ({r.source}{'' if same_env(env, r) else ', ' + r.their_env})"
            for r in sorted(refs.get(env, []), key=lambda r: not same_env(env, r))
        )
        states = sorted({r.status(now, recent_s) for r in group})
        sps, device = device_cells(s["devices"], s["sps"], s["sps_by_device"])
        lines.append(
            f"| {exp} | {env} | {s['n']} | {ret} | {steps} | {fmt_time(s['wall_mean'])} | {sps} | {device} "
            f"| {ref or DASH} | {', '.join(states)} |"
        )
    lines += [
        "",
        "Per run:",
        "",
        f"| run | episodes | return, last {last_n} episodes (± standard error) | steps | wall time | SPS | device "
        "| status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ordered = sorted(runs, key=lambda r: (r.exp, r.env, r.seed, r.name))
    for r in ordered:
        sps, device = device_cells(r.devices, r.sps, r.sps_by_device)
        se = r.final_return_se(last_n)
        ret = fmt_num(r.final_return(last_n)) + ("" if se is None else f" ± {fmt_num(se)}")
        lines.append(
            f"| {r.name} | {r.episodes} | {ret} | {r.last_step:,} | "
            f"{fmt_time(r.wall_time)} | {sps} | {device} | {r.status(now, recent_s, long=True)} |"
        )
    lines += segments_section([r for r in ordered if len(r.segments) > 1])
    lines += stats_section(ordered)
    lines += ["", *references_section(sorted({r.env for r in runs}), refs)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs_dir", help="folder holding run directories (e.g. runs/)")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="output folder for report.md and PNGs")
    p.add_argument(
        "--refs", default=os.path.join(HERE, "reference_scores.csv"), help="reference scores CSV ('' for none)"
    )
    p.add_argument("--last-n", type=int, default=100, help="episodes averaged at the end of each run")
    p.add_argument("--smooth", type=int, default=20, help="episodes in the curves' moving average")
    p.add_argument("--grid-points", type=int, default=200, help="points of the common step grid for curves")
    p.add_argument(
        "--running-window", type=float, default=600, help="seconds since the last event within which a run is running"
    )
    p.add_argument("--no-plots", action="store_true", help="write the table only")
    p.add_argument("--filter", default="", help="only runs whose directory name contains this text")
    args = p.parse_args(argv)

    if not os.path.isdir(args.runs_dir):
        print(
            f"error: runs directory '{args.runs_dir}' not found; pass the folder the scripts wrote (runs/)",
            file=sys.stderr,
        )
        return 2
    if args.last_n < 1 or args.smooth < 1 or args.grid_points < 2:
        print("error: --last-n and --smooth must be >= 1 and --grid-points >= 2", file=sys.stderr)
        return 2
    try:
        refs = load_references(args.refs)
    except (OSError, ValueError) as exc:  # a mistyped --refs must not turn into "no published reference"
        print(
            f"error: --refs {args.refs!r}: {exc}; pass a CSV with env, score and source columns, or --refs ''",
            file=sys.stderr,
        )
        return 2
    runs, skipped = [], []
    for d in find_run_dirs(args.runs_dir):
        if args.filter and args.filter not in os.path.basename(d):
            continue
        run = load_run(d)
        (runs if run else skipped).append(run or d)
    if not runs:
        print(
            f"error: no run directories named env__exp__seed__timestamp with event files under '{args.runs_dir}'",
            file=sys.stderr,
        )
        return 2

    os.makedirs(args.out, exist_ok=True)
    table = build_report(runs, refs, args.last_n, time.time(), args.running_window)
    body = [
        f"# Results from `{args.runs_dir}`",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
    ]
    body += [table]
    if not args.no_plots:
        by_env: dict[str, dict[str, list[Run]]] = {}
        for r in runs:
            by_env.setdefault(r.env, {}).setdefault(r.exp, []).append(r)
        body.append("## Learning curves\n")
        for env, groups in sorted(by_env.items()):
            path = plot_env(env, groups, args.out, args.grid_points, args.smooth)
            body.append(f"![{env}]({os.path.basename(path)})\n" if path else f"{env}: no episodes yet\n")
    if skipped:
        body.append("Skipped (name not env__exp__seed__timestamp): " + ", ".join(sorted(skipped)) + "\n")
    report_path = os.path.join(args.out, "report.md")
    with open(report_path, "w") as f:
        f.write("\n".join(body))
    print(table, end="")
    print(f"wrote {report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
