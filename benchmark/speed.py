"""How fast the scripts run, measured one way, with the machine and the command named on every table
(docs/performance.md#the-tools; dev/speed_dev.py has the developers' tables).

    python benchmark/speed.py run ppo_atari.py --steps 6144 -- --env-id ALE/Pong-v5   # one setting, one SPS
    python benchmark/speed.py compare atari --repeats 2   # ours against the CleanRL-style baseline (or continuous)
    python benchmark/speed.py table                       # this machine's throughput table -> benchmark/results/
    python benchmark/speed.py table --profile gpu         # the one-GPU table (~8 min)
    python benchmark/speed.py ceiling --mujoco-envs 64 --mjx-envs 4096   # the environments alone
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import resource
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch  # loaded by gpu_utils anyway

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [p for p in (HERE, ROOT) if p not in sys.path]
import report  # noqa: E402  (the one reader of event files)
import sweep  # noqa: E402  (the one launcher of runs)
from report import DASH, fmt, md_table  # noqa: E402
from sweep import Parser, count  # noqa: E402  (one-line errors, as the sweep's)
from sweep import SweepError as UsageError  # noqa: E402

import gpu_utils  # noqa: E402

OURS = ("ppo_atari.py", "ppo_continuous.py", "dqn_snake_vec.py")
BREAKOUT, CHEETAH = ["--env-id", "ALE/Breakout-v5"], ["--env-id", "HalfCheetah-v5"]
GRAPHS = ["--compile", "--cudagraphs"]


@dataclass
class Setting:
    """A script and its arguments, run for max(2, round(iters * scale)) iterations of ``batch`` steps."""

    args: list[str]  # the script (relative to the repository root, or absolute), then its arguments
    batch: int  # steps per iteration (per log window: dqn_snake_vec.py)
    iters: int
    env: dict[str, str] = field(default_factory=dict)  # variables set for the run

    def steps(self, scale: float) -> int:
        return self.batch * max(2, round(self.iters * scale))  # SPS is logged from the second iteration on

    def argv(self, scale: float) -> list[str]:
        quiet = ["--no-progress-bar"] if os.path.basename(self.args[0]) in OURS else []
        return [*self.args, "--total-timesteps", str(self.steps(scale)), *quiet]

    def shown(self, scale: float) -> str:
        return "".join(f"{k}={v} " for k, v in self.env.items()) + "python " + shlex.join(self.argv(scale))


@dataclass
class Result:
    what: str  # the command, or the ceiling
    status: str = "ok"  # ok | failed (exit N) | timed out after N s | skipped: ... | k of n runs failed: ...
    sps: float | None = None
    unit: str = "SPS"
    steps: int | None = None
    wall: float | None = None
    cpu_s: float | None = None  # user + system CPU seconds of the process
    util_mean: float | None = None
    util_peak: float | None = None
    peak_mib: float | None = None
    estimated_mib: float | None = None
    threads: int | None = None  # the run's last threads/torch: its share of the CPUs
    update_share: float | None = None  # the median of charts/update_share (ppo_continuous): the update's time share
    tail: str = ""  # the end of its output, when not ok
    warning: str = ""  # what it could not do as asked (a CUDA graph capture that failed)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.sps is not None


def read_metrics(folder: str) -> dict[str, float | None]:
    """From the event files under ``folder``: the steps done (the last logged), SPS (the median of charts/SPS), the
    GPU utilisation at the steps with an SPS (not the warm-up's), the median update share (ppo_continuous logs one),
    and the last memory and thread figures."""
    scalars: dict[str, dict[int, float]] = {}
    for path, _, files in os.walk(folder):
        for file in sorted(f for f in files if f.startswith("events.out.tfevents")):
            for tag, events in report.read_event_file(os.path.join(path, file))[0].items():
                scalars.setdefault(tag, {}).update((step, value) for step, _, value in events)
    sps = scalars.get("charts/SPS", {})

    def steady(tag: str) -> list[float]:
        values = scalars.get(tag, {})
        return [v for step, v in values.items() if step in sps] or list(values.values())

    def last(tag: str) -> float | None:
        values = scalars.get(tag)
        return values[max(values)] if values else None

    util, peak, threads = steady("gpu/util_mean"), steady("gpu/util_peak"), last("threads/torch")
    share = steady("charts/update_share")
    return {
        "steps": max(max(values) for values in scalars.values()) if scalars else None,  # done: whole iterations
        "sps": statistics.median(sps.values()) if sps else None,
        "util_mean": statistics.fmean(util) if util else None,
        "util_peak": max(peak) if peak else None,
        "peak_mib": last("memory/peak_allocated_mib"),
        "estimated_mib": last("memory/estimated_mib"),
        "threads": None if threads is None else int(threads),
        "update_share": statistics.median(share) if share else None,
    }


def run_settings(settings: list[Setting], scale: float, timeout: float, cpus=None, by_hand=False) -> list[Result]:
    """Start every setting at once, each in a temporary folder of its own, through sweep.start_run: with this tool's
    thread budget, or pinned to its CPUs in ``cpus``, or (``by_hand``) without thread variables as a user starts it.
    Past ``timeout`` seconds a run gets SIGTERM, 30 s later its group SIGKILL. Its folder is removed after."""
    runs, start = [], time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    budget = gpu_utils.allowed_cpus()[: gpu_utils.thread_budget().threads]
    with contextlib.ExitStack() as folders:  # each removed at the end, a Ctrl-C's included
        for s, pinned in zip(settings, cpus or [None] * len(settings)):
            tmp = folders.enter_context(tempfile.TemporaryDirectory(prefix="speed_", ignore_cleanup_errors=True))
            unset = ["--unset=OMP_NUM_THREADS", "--unset=MKL_NUM_THREADS"] if by_hand else []
            variables = [f"{k}={v}" for k, v in {"WANDB_MODE": "disabled", **s.env}.items()]
            argv = [os.path.join(ROOT, s.args[0]), *s.argv(scale)[1:]]
            command = ["env", *unset, f"--chdir={tmp}", *variables, sys.executable, *argv]
            proc = sweep.start_run(command, pinned or budget, pinned is not None, os.path.join(tmp, "log"), tmp)
            runs.append((Result(s.shown(scale), steps=s.steps(scale)), tmp, proc))
        try:
            for res, _, proc in runs:  # a wall time is when its wait ended: for runs at once, an upper bound
                try:
                    proc.wait(max(0.0, start + timeout - time.perf_counter()))
                except subprocess.TimeoutExpired:
                    res.status = f"timed out after {timeout:.0f} s"
                    stop(proc)
                res.wall = time.perf_counter() - start
        except BaseException:  # Ctrl-C reaches only this tool: the runs have sessions of their own
            for _, _, proc in runs:
                stop(proc, wait=False)
            raise
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime  # all the runs': one's when alone
        for res, tmp, proc in runs:
            res.cpu_s = cpu_s if len(runs) == 1 else None
            rc = proc.returncode
            if res.status == "ok" and rc:
                res.status = f"failed (exit {rc})" if rc > 0 else f"killed by {signal.Signals(-rc).name}"
            elif res.status == "ok":
                res.__dict__.update(read_metrics(os.path.join(tmp, "runs")))
                res.status = "ok" if res.sps is not None else "no charts/SPS logged (budget below two iterations?)"
            log = Path(tmp, "log").read_text(errors="replace").splitlines()[1:]  # below the command line
            lines = [line.rstrip() for line in log if line.strip()]
            res.tail = "" if res.ok else "\n".join(lines[-6:])
            res.warning = "; ".join(line.strip() for line in lines if "(CUDA graph capture failed" in line)
    return [res for res, _, _ in runs]


def stop(proc: subprocess.Popen, wait: bool = True) -> None:
    """SIGTERM to the run's process group, SIGKILL 30 s later if it still runs."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
        if wait:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def measure(settings: list[Setting], a, repeats: int = 1, budget_minutes: float = 0) -> list[Result]:
    """Each setting alone, ``repeats`` rounds interleaved (a drift of the machine touches every setting alike), its
    result the median of its runs' SPS and CPU time. No run starts in the minute before ``budget_minutes``."""
    deadline = time.perf_counter() + budget_minutes * 60 if budget_minutes else float("inf")
    runs: list[list[Result]] = [[] for _ in settings]
    for round_ in range(repeats):
        for s, done in zip(settings, runs):
            left = deadline - time.perf_counter()
            if left < 60:  # too late for its warm-up
                done.append(Result(s.shown(a.scale), f"skipped: past --budget-minutes {budget_minutes:g}"))
                continue
            print(f"[speed] round {round_ + 1}/{repeats}: {s.shown(a.scale)} ...", flush=True)
            done += run_settings([s], a.scale, min(a.timeout, left))
            print(f"[speed]   {fmt(done[-1].sps)} SPS" if done[-1].ok else f"[speed]   {done[-1].status}", flush=True)
    results = []
    for done in runs:
        ok = [r for r in done if r.ok]
        res = ok[0] if ok else done[0]
        if ok:
            res.sps = statistics.median(r.sps for r in ok)
            res.cpu_s = statistics.median(r.cpu_s for r in ok)
        if ok and len(ok) < len(done):
            failed = "; ".join(sorted({r.status for r in done if not r.ok}))
            res.status = f"{len(done) - len(ok)} of {len(done)} runs failed: {failed}"
        res.tail = "\n".join(r.tail for r in done if r.tail)
        results.append(res)
    return results


def env_rate(envs, actions, seconds: float) -> float:
    """Env steps/s of a vector env stepped with ``actions[i]`` (64 batches in turn) for ``seconds`` after 10 warm-up
    steps, to its last result on the host: the mean over the whole time, resets included. The envs are closed after."""
    envs.reset()
    for i in range(10):
        last = envs.step(actions[i])
    float(last[0].sum())
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        last = envs.step(actions[steps % 64])
        steps += 1
    float(last[0].sum())
    rate = steps * len(actions[0]) / (time.perf_counter() - t0)
    getattr(envs, "close", lambda: None)()  # VecSnake holds no process or device buffer to free
    return rate


def atari_row(seconds: float, n: int) -> tuple:
    """ppo_atari.make_envs' Breakout (the script's envs) on every allowed CPU."""
    threads = gpu_utils.available_cpus()

    def rate() -> float:
        import ppo_atari

        envs = ppo_atari.make_envs("ALE/Breakout-v5", n, threads, ppo_atari.Args().max_episode_frames)
        actions = np.random.default_rng(0).integers(0, envs.single_action_space.n, (64, n))
        return env_rate(envs, actions, seconds)

    return f"ceiling: AtariVectorEnv Breakout, {n} envs, {threads} threads", "agent steps/s", rate


def mujoco_row(seconds: float, n: int, subproc: bool) -> tuple:
    """ppo_continuous.py's HalfCheetah-v5 vector env, in process or (--subproc) in subprocesses."""

    def rate() -> float:
        from continuous_envs import vector_env
        from ppo_continuous import make_env

        envs = vector_env([make_env("HalfCheetah-v5", i, False, "", subproc) for i in range(n)], subproc)
        space = envs.single_action_space
        actions = np.random.default_rng(0).uniform(space.low, space.high, (64, n, *space.shape))
        return env_rate(envs, actions.astype(np.float32), seconds)

    what = f"ceiling: HalfCheetah-v5, {n} envs, {'AsyncVectorEnv (subprocesses)' if subproc else 'SyncVectorEnv'}"
    return what, "agent steps/s", rate


def snake_row(seconds: float, n: int, device: str, mode: str) -> tuple:
    """snake_env.VecSnake (dqn_snake_vec.py's games), 10x10 boards."""

    def rate() -> float:
        from snake_env import VecSnake

        generator = torch.Generator(device).manual_seed(0)
        actions = torch.randint(0, 4, (64, n), device=device, generator=generator)
        return env_rate(VecSnake(n, 10, 10, device=device, seed=0, mode=mode), actions, seconds)

    return f"ceiling: VecSnake 10x10, {n:,} games, {device}, {mode}", "env steps/s", rate


def mjx_row(seconds: float, n: int, device: str, env_id: str = "HalfCheetah-v5", impl: str = "jax") -> tuple:
    """mjx_envs.MJXVectorEnv's worlds (ppo_continuous.py --sim mjx) with random actions drawn by torch on their
    device; the row's wall time holds the build and the first step's compilation (or cache load, docs/mjx.md)."""

    def rate() -> float:
        import mjx_envs  # jax and mujoco-mjx are an extra: without them, an ImportError skips the row

        envs = mjx_envs.MJXVectorEnv(env_id, n, seed=0, device=device, impl=impl)
        space = envs.single_action_space
        low, high = (torch.as_tensor(x, device=envs.device) for x in (space.low, space.high))
        return env_rate(envs, low + (high - low) * torch.rand((64, n, *low.shape), device=envs.device), seconds)

    return f"ceiling: MJX {env_id}, {n:,} worlds, {device}, impl={impl}", "env steps/s", rate


def ceiling(what: str, unit: str, rate) -> Result:
    """One ceiling: ``rate()`` measured; a failure is a row of the table, not the end of it, and a missing package
    (an ImportError) skips it with the reason."""
    print(f"[speed] {what} ...", flush=True)
    t0 = time.perf_counter()
    try:
        res = Result(what, sps=rate(), unit=unit)
    except ImportError as exc:
        res = Result(what, f"skipped: {exc}", unit=unit)
    except Exception as exc:  # noqa: BLE001
        res = Result(what, f"failed: {type(exc).__name__}: {exc}"[:150], unit=unit)
    res.wall = time.perf_counter() - t0
    print(f"[speed]   {fmt(res.sps)} {unit}" if res.ok else f"[speed]   {res.status}", flush=True)
    return res


def ceilings(a, device: str) -> list[tuple]:
    """(what, unit, rate) of each ceiling the options ask for: VecSnake dense and fused on CUDA, sparse on a CPU
    (each device's default in dqn_snake_vec.py; fused on a CPU compiles for a minute and runs slower)."""
    rows = [atari_row(a.seconds, n) for n in a.atari_envs]
    modes = ["dense", "fused"] if device == "cuda" else ["sparse"]
    rows += [snake_row(a.seconds, n, device, mode) for n in a.snake_sizes for mode in modes]
    rows += [mujoco_row(a.seconds, n, subproc) for n in a.mujoco_envs for subproc in (False, True)]
    return rows + [mjx_row(a.seconds, n, device, a.mjx_env_id, a.mjx_impl) for n in a.mjx_envs]


def machine_info() -> dict[str, str]:
    """The machine, in one place: every table this tool writes starts with it."""
    cpu = gpu_utils.device_label(torch.device("cpu")).removeprefix("CPU ")  # "<model>, N cores" this process may use
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "host": socket.gethostname(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "CPU": f"{cpu} allowed to this process, {os.cpu_count()} logical cores in all",
        "GPU": ", ".join(gpus) or "none",
        "torch": torch.__version__ + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else ""),
        "python": platform.python_version(),
        "load average at start (1/5/15 min)": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def results_table(results: list[Result], base: float | None = None) -> list[str]:
    """One row per result; with ``base``, each rate also as a ratio to it. The update's share of the time has a
    column where a run logged one."""
    shares = any(r.update_share is not None for r in results)
    rows = []
    for r in results:
        rate = f"{fmt(r.sps)} {r.unit}" + (f" ({r.sps / base:.2f}x)" if base else "") if r.ok else DASH
        cpu = fmt(r.cpu_s / r.steps * 1000, 2) if r.ok and r.cpu_s and r.steps else DASH  # steps done, not asked
        util = DASH if r.util_mean is None else f"{r.util_mean:.0f}% / {r.util_peak:.0f}%"
        memory = f"{fmt(r.peak_mib)} / {fmt(r.estimated_mib)}" if r.peak_mib or r.estimated_mib else DASH
        what = f"`{r.what}`" if " python " in f" {r.what}" else r.what
        status = f"{r.status}; {r.warning}" if r.warning else r.status
        share = [DASH if r.update_share is None or not r.ok else f"{r.update_share:.0%}"] if shares else []
        rows.append([what, fmt(r.steps), fmt(r.wall), rate, cpu, util, *share, memory, status])
    header = ["what", "steps", "wall s", "rate" + (" (x baseline)" if base else ""), "CPU s / 1k steps"]
    header += ["GPU util mean / peak", *(["update share"] if shares else []), "peak / est. MiB", "status"]
    return md_table(header, rows)


def failures(results: list[Result]) -> list[str]:
    lines = []
    for r in results:
        if r.tail:
            lines += ["", f"{r.what}: {r.status}; the end of its output:", "", "```", r.tail, "```"]
    return lines


def document(title: str, info: dict[str, str], note: str, body: list[str]) -> str:
    command = shlex.join(["python", os.path.relpath(os.path.abspath(sys.argv[0]), ROOT), *sys.argv[1:]])
    lines = [f"# {title}", "", f"- command: `{command}`", *[f"- {k}: {v}" for k, v in info.items()]]
    lines += [f"- note: {note}"] if note else []
    lines.append("- load average at end (1/5/15 min): " + " / ".join(f"{x:.2f}" for x in os.getloadavg()))
    return "\n".join([*lines, "", *body]) + "\n"


def emit(text: str, a, stem: str) -> None:
    print("\n" + text, end="")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        host = re.sub(r"[^A-Za-z0-9._-]", "_", a.host)
        path = os.path.join(a.out, f"{stem}_{host}_{time.strftime('%Y-%m-%d', time.gmtime())}.md")
        Path(path).write_text(text)
        print(f"wrote {path}")


def snake(n: int, windows: int, flags: tuple[str, ...] = ()) -> Setting:
    """dqn_snake_vec.py learning from its 10th vector step, SPS logged every 50 vector steps."""
    args = ["dqn_snake_vec.py", "--num-envs", str(n), "--learning-starts", str(10 * n), "--log-every", str(50 * n)]
    return Setting([*args, *flags], 50 * n, windows)


def profile(name: str, cuda: bool) -> list[Setting]:
    """The training runs of a table: each script's defaults on a CPU; on one GPU, the rows behind the targets first;
    for `compare`, ours and the baseline at matched batch, minibatch and epochs, one iteration each (--iterations)."""
    baseline = "benchmark/baseline_ppo.py"
    if name == "continuous":
        base = Setting([baseline, *CHEETAH], 2048, 1)
        one_thread = Setting(base.args, 2048, 1, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})  # torch reads both
        return [base, one_thread, Setting(["ppo_continuous.py", *CHEETAH], 2048, 1)]
    if name == "atari":
        cleanrl = ["ppo_atari.py", *BREAKOUT, "--num-envs", "8", "--num-minibatches", "4"]  # CleanRL's: minibatch 256
        rows = [Setting([baseline, *BREAKOUT], 1024, 1), Setting(cleanrl, 1024, 1)]
        rows.append(Setting(["ppo_atari.py", *BREAKOUT], 2048, 1))
        return rows + [Setting([*cleanrl, *f], 1024, 1) for f in ([GRAPHS] if cuda else [["--compile"], ["--amp"]])]
    if name == "cpu":
        cheetah = ["ppo_continuous.py", *CHEETAH]
        atari, heavy = Setting(["ppo_atari.py", *BREAKOUT], 2048, 3), Setting([*cheetah, "--preset", "heavy"], 8192, 2)
        return [atari, Setting(cheetah, 2048, 6), heavy, snake(256, 6), snake(4096, 3)]
    gpu = ["--gpu", "true"]
    atari = [["--compile"], GRAPHS, [], ["--amp"]]
    atari = [Setting(["ppo_atari.py", *BREAKOUT, *gpu, *flags], 2048, 25) for flags in atari]
    presets = [(["beast", "--subproc"], 32768, 4), (["beast"], 32768, 4), (["fast"], 4096, 8), (["heavy"], 8192, 6)]
    cont = [Setting(["ppo_continuous.py", *CHEETAH, *gpu, "--preset", *p], batch, n) for p, batch, n in presets]
    cont.append(Setting(["ppo_continuous.py", *CHEETAH, *gpu], 2048, 6))
    # the whole step as one graph (fused env) beside the dense env with the action step and loss compiled alone
    dqn = [(*gpu, *GRAPHS), (*gpu,), (*gpu, *GRAPHS, "--env-mode", "dense")]
    return atari + cont[:2] + [snake(n, 8, flags) for n in (4096, 256, 65536) for flags in dqn] + cont[2:]


def selected(what: str, only: list[str] | None) -> bool:
    return not only or any(o in what for o in only)


def run_mode(a, passthrough: list[str]) -> int:
    """`table`: the environments alone and the profile's training runs; `ceiling`: the former only; `compare`: the
    latter, --repeats rounds interleaved, with each rate as a ratio to the best baseline's; `run`: one script."""
    cuda = torch.cuda.is_available()
    rows = ceilings(a, "cuda" if cuda else "cpu") if a.mode in ("table", "ceiling") else []
    settings = profile(a.profile, cuda) if a.mode in ("table", "compare") else []
    if a.mode == "run":
        script = a.script if os.path.exists(a.script) else os.path.join(ROOT, a.script)
        if not os.path.isfile(script):
            raise UsageError(f"script '{a.script}' not found (give a path, or one of {', '.join(OURS)})")
        settings = [Setting([os.path.relpath(script, ROOT), *passthrough], 1, a.steps)]
    rows = [row for row in rows if selected(row[0], a.only)]
    settings = [s for s in settings if selected(s.shown(a.scale), a.only)]
    if a.dry_run:
        print("\n".join([f"{what}: {a.seconds:g} s" for what, _, _ in rows] + [s.shown(a.scale) for s in settings]))
        return 0
    info = machine_info()
    results = [ceiling(*row) for row in rows] + measure(settings, a, a.repeats, a.budget_minutes)
    bases = [r.sps for r in results if "benchmark/baseline_ppo.py" in r.what and r.ok]
    body = [
        f"Rows `{a.profile}`, step budgets x{a.scale:g}, medians of {a.repeats} interleaved round(s), runs stopped "
        f"after {a.timeout:.0f} s, none started after {a.budget_minutes:g} min (0: no limit). SPS: agent (env) steps "
        "per second with learning on; CPU s: user + system seconds of the process per 1,000 steps.",
        "",
        *results_table(results, max(bases, default=None)),
        *failures(results),
    ]
    titles = {"table": "Throughput", "ceiling": "Environment ceilings", "run": "Speed of one run"}
    title = titles.get(a.mode, f"Speed against the baseline: {a.profile}")
    stem = {"table": f"throughput_{a.profile}", "compare": f"compare_{a.profile}"}.get(a.mode, a.mode)
    emit(document(title, info, a.note, body), a, stem)
    return 0 if all(r.ok or r.status.startswith("skipped") for r in results) else 1


def parser() -> Parser:
    p = Parser(prog="speed.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True, parser_class=Parser)
    r = sub.add_parser("run", help="one script for a fixed step budget; arguments after -- go to the script")
    r.add_argument("script", help="ppo_atari.py, ppo_continuous.py, dqn_snake_vec.py or a baseline's path")
    r.add_argument("--steps", type=count(1), required=True, help="--total-timesteps for the run")
    m = sub.add_parser("compare", help="ours against the CleanRL-style baseline at matched settings")
    m.add_argument("which", choices=["atari", "continuous"])
    m.add_argument("--iterations", type=count(1), default=5, help="iterations per run (the first is warm-up)")
    m.add_argument("--repeats", type=count(1), default=1, help="interleaved rounds of every setting")
    t = sub.add_parser("table", help="the throughput table: the ceilings and the profile's training runs")
    t.add_argument("--profile", choices=["cpu", "gpu"], help="the rows (default: gpu where CUDA is present)")
    t.add_argument("--scale", type=count(0.01, float), default=1.0, help="multiply every step budget")
    t.add_argument("--budget-minutes", type=count(0, float), help="start no run after this long (8 gpu, 0 cpu: none)")
    c = sub.add_parser("ceiling", help="the table's ceilings only")
    for sp in (t, c):
        sp.add_argument("--seconds", type=count(0.1, float), help="seconds per ceiling (default 5 cpu, 2 gpu)")
        sp.add_argument("--atari-envs", type=count(1), nargs="*", help="AtariVectorEnv sizes")
        sp.add_argument("--snake-sizes", type=count(1), nargs="*", help="VecSnake sizes")
        sp.add_argument("--mujoco-envs", type=count(1), nargs="*", default=[], help="HalfCheetah vector envs")
        sp.add_argument("--mjx-envs", type=count(1), nargs="*", help="MJX worlds (default: 4096 gpu, none cpu)")
        sp.add_argument("--mjx-env-id", default="HalfCheetah-v5", help="the MJX task (docs/mjx.md)")
        sp.add_argument("--mjx-impl", choices=["jax", "warp"], default="jax", help="MJX's implementation")
    for sp in (r, m, t, c):
        sp.add_argument("--only", nargs="*", help="rows whose command or name contains one of these")
        sp.add_argument("--dry-run", action="store_true", help="print the rows, run nothing")
        sp.add_argument("--timeout", type=count(1, float), default=240, help="seconds before a run is stopped")
        sp.add_argument("--out", default="." if sp is t else "", help="folder for the table (table: this one)")
        sp.add_argument("--note", default="", help="a line under the machine (e.g. other load)")
        sp.add_argument("--host", default=os.environ.get("HOST_LABEL", socket.gethostname()), help="name in files")
    return p


@sweep.one_line_errors
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    argv, passthrough = argv[:cut], argv[cut + 1 :]
    a = parser().parse_args(argv)
    if passthrough and a.mode != "run":
        raise UsageError("arguments after -- are for `run` only")
    if getattr(a, "out", None):  # now, not after the measuring
        a.out = os.path.abspath(sweep.make_dir(a.out, "--out"))
    if not a.dry_run:
        where = f"its file goes to {a.out}" if a.out else "the table is printed only (--out DIR writes it there)"
        print(f"[speed] {a.mode}: {where}", flush=True)
    gpu = torch.cuda.is_available() if getattr(a, "profile", None) is None else a.profile == "gpu"
    defaults = {"profile": "gpu" if gpu else "cpu", "seconds": 2 if gpu else 5, "budget_minutes": 8 if gpu else 0}
    defaults |= {"atari_envs": [16, 64, 128] if gpu else [16, 64]}
    defaults |= {"snake_sizes": [2**k for k in range(12, 23, 2)] if gpu else [256, 4096, 65536]}
    defaults |= {"mjx_envs": [4096] if gpu else [], "repeats": 1, "scale": 1.0}
    if a.mode == "compare":
        defaults |= {"profile": a.which, "scale": a.iterations, "budget_minutes": 0}
    if a.mode == "run":
        defaults |= {"profile": a.script, "budget_minutes": 0}
    for name, value in defaults.items():
        if getattr(a, name, None) is None:
            setattr(a, name, value)
    return run_mode(a, passthrough)


if __name__ == "__main__":
    sys.exit(main())
