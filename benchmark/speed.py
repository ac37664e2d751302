"""How fast the gpu-rl scripts run, measured one way, with the machine and the command named on every table.

    python benchmark/speed.py run ppo_atari.py --steps 6144 -- --env-id ALE/Pong-v5   # one setting, one SPS
    python benchmark/speed.py ceiling --atari-envs 16 64 --snake-sizes 4096 65536     # the environments alone
    python benchmark/speed.py ceiling --atari-envs --snake-sizes --mujoco-envs 64     # MuJoCo, in and out of process
    python benchmark/speed.py compare atari --repeats 2       # ours against the CleanRL-style baseline
    python benchmark/speed.py table                           # throughput table -> benchmark/results/
    python benchmark/speed.py table --profile gpu             # the one-GPU table with its targets (~8 min, H100)
    python benchmark/speed.py ab --before c9316f8             # old and new code, interleaved, at the profile's rows
    python benchmark/speed.py before c9316f8 .ab/before       # that commit's scripts in a folder, for ab --before
    python benchmark/speed.py concurrency --copies 1 2 4      # 1, 2, 4 copies at once: total SPS vs one alone
    python benchmark/speed.py concurrency --by-hand           # the same, started as a user would: no pinning

Training runs get a fixed step budget (--total-timesteps) in a temporary folder and are stopped with SIGTERM past
--timeout. SPS is read one way: the median of the run's ``charts/SPS`` TensorBoard scalars (every script, the
baselines too, logs it per iteration or log window after a warm-up one). GPU runs add ``gpu/util_mean`` (mean over
the iterations that have an SPS), ``gpu/util_peak`` (max), ``memory/peak_allocated_mib`` and
``memory/estimated_mib``. A run that fails, times out or logs no SPS shows as such with the last lines of its
stderr, never as a number. Ceilings step the environments alone with random actions: ``ale_py.AtariVectorEnv``
with the v5 settings of ppo_atari.make_envs (agent steps/s) and dqn_snake_vec.VecSnake (env steps/s).
"""

from __future__ import annotations

import argparse
import atexit
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
import gpu_utils  # noqa: E402  (the scripts' CPU detection and thread budgets, one copy)

THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "SLURM_CPUS_PER_TASK",
)
OURS = ("ppo_atari.py", "ppo_continuous.py", "dqn_snake_vec.py")
DASH = "-"


# ---------------------------------------------------------------- settings and results


@dataclass
class Setting:
    """One script at one setting. Budget: max(min_iters, round(iters * scale)) iterations of `batch` steps."""

    key: str  # short id used by --only and by the targets
    label: str
    script: str  # path relative to the repository root
    args: list[str]
    batch: int  # steps per iteration (per log window for dqn_snake_vec.py)
    iters: int
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables
    min_iters: int = 2  # the scripts log SPS from the second iteration (window) on

    def steps(self, scale: float) -> int:
        return self.batch * max(self.min_iters, round(self.iters * scale))

    def argv(self, scale: float) -> list[str]:
        extra = ["--no-progress-bar"] if os.path.basename(self.script) in OURS else []
        return [self.script, *self.args, "--total-timesteps", str(self.steps(scale)), *extra]

    def shown(self, scale: float) -> str:
        prefix = "".join(f"{k}={v} " for k, v in self.env.items())
        return prefix + "python " + shlex.join(self.argv(scale))


@dataclass
class Result:
    label: str
    how: str  # the command, or what a ceiling stepped
    status: str = "ok"  # ok | failed (exit N) | timed out after N s | no charts/SPS logged | skipped: ...
    sps: float | None = None
    unit: str = "SPS"
    steps: int | None = None
    wall: float | None = None
    n_sps: int = 0
    cpu_s: float | None = None  # user + system CPU seconds of the process
    util_mean: float | None = None
    util_peak: float | None = None
    peak_mib: float | None = None
    estimated_mib: float | None = None
    threads: int | None = None  # the run's last `threads/torch` (its share of the CPUs)
    tail: str = ""  # last lines of stderr when not ok
    warning: str = ""  # what the run said it could not do as asked (a CUDA graph capture that failed, say)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.sps is not None


def read_metrics(run_dir: str) -> dict[str, float | int | None]:
    """SPS and GPU figures from one run's TensorBoard events (the one way this tool reads SPS)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags().get("scalars", []))

    def series(tag: str) -> dict[int, float]:
        return {e.step: e.value for e in acc.Scalars(tag)} if tag in tags else {}

    sps, util, peak = series("charts/SPS"), series("gpu/util_mean"), series("gpu/util_peak")
    threads = series("threads/torch")
    steady = [v for step, v in util.items() if step in sps] or list(util.values())
    steady_peak = [v for step, v in peak.items() if step in sps] or list(peak.values())
    memory = {tag: series(tag) for tag in ("memory/peak_allocated_mib", "memory/estimated_mib")}
    last = {tag: values[max(values)] if values else None for tag, values in memory.items()}
    return {
        "sps": statistics.median(sps.values()) if sps else None,
        "n_sps": len(sps),
        "util_mean": statistics.fmean(steady) if steady else None,
        "util_peak": max(steady_peak) if steady_peak else None,
        "peak_mib": last["memory/peak_allocated_mib"],
        "estimated_mib": last["memory/estimated_mib"],
        "threads": int(threads[max(threads)]) if threads else None,
    }


def find_run_dir(root: str) -> str | None:
    for dirpath, _, files in sorted(os.walk(os.path.join(root, "runs"))):
        if any(f.startswith("events.out.tfevents") for f in files):
            return dirpath
    return None


def last_lines(path: str, n: int = 6) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [line.rstrip() for line in f if line.strip()]
    except OSError:
        return ""
    return "\n".join(lines[-n:])


# ---------------------------------------------------------------- running scripts


def launch(
    setting: Setting, scale: float, cores: list[int] | None, by_hand: bool = False
) -> tuple[list[str], dict[str, str], str]:
    """The command, its environment and how it reads; with `cores`, pinned with taskset and told k threads; by hand,
    without any thread variable (as a user starts it in a terminal)."""
    cmd = [sys.executable, os.path.join(ROOT, setting.script), *setting.argv(scale)[1:]]
    env, shown = {**os.environ, "WANDB_MODE": "disabled", **setting.env}, setting.shown(scale)
    if by_hand:
        env = {k: v for k, v in env.items() if k not in THREAD_VARS}
    if cores is not None:
        k, listed = str(len(cores)), ",".join(map(str, cores))
        env.update(OMP_NUM_THREADS=k, MKL_NUM_THREADS=k)
        cmd = ["taskset", "-c", listed, *cmd]
        shown = f"OMP_NUM_THREADS={k} MKL_NUM_THREADS={k} taskset -c {listed} {shown}"
    return cmd, env, shown


class Run:
    """One script started in its own temporary folder (and process group); poll() until it has ended."""

    def __init__(
        self, setting: Setting, scale: float, timeout: float, cores: list[int] | None = None, by_hand: bool = False
    ):
        self.setting, self.scale, self.timeout = setting, scale, timeout
        self.tmp = tempfile.mkdtemp(prefix="speed_")
        cmd, env, self.how = launch(setting, scale, cores, by_hand)
        with open(os.path.join(self.tmp, "stdout"), "w") as out, open(os.path.join(self.tmp, "stderr"), "w") as err:
            self.proc = subprocess.Popen(cmd, cwd=self.tmp, env=env, stdout=out, stderr=err, start_new_session=True)
        self.start, self.stop_sent, self.kill_at = time.perf_counter(), False, None
        self.wall = self.status = self.usage = None

    def poll(self) -> bool:
        """True once the process has ended; past the timeout it gets SIGTERM (the scripts stop cleanly), 30 s later
        SIGKILL for its whole process group."""
        if self.status is not None:
            return True
        pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
        now = time.perf_counter()
        if pid:
            self.wall, self.status, self.usage = now - self.start, status, usage
            self.proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait again
            return True
        if not self.stop_sent and now - self.start > self.timeout:
            self._signal(signal.SIGTERM)
            self.stop_sent, self.kill_at = True, now + 30
        elif self.kill_at is not None and now > self.kill_at:
            self._signal(signal.SIGKILL)
            self.kill_at = None
        return False

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def result(self) -> Result:
        rc = self.proc.returncode
        res = Result(self.setting.label, self.how, steps=self.setting.steps(self.scale), wall=self.wall)
        res.cpu_s = self.usage.ru_utime + self.usage.ru_stime
        run_dir = find_run_dir(self.tmp)
        if self.stop_sent:
            res.status = f"timed out after {self.timeout:.0f} s"
        elif rc != 0:
            res.status = f"failed (exit {rc})" if rc > 0 else f"killed by {signal.Signals(-rc).name}"
        elif run_dir is None:
            res.status = "no event file written"
        if run_dir is not None and res.status == "ok":
            for key, value in read_metrics(run_dir).items():
                setattr(res, key, value)
            if res.sps is None:
                res.status = "no charts/SPS logged (budget below two iterations?)"
        if res.status != "ok":
            res.tail = last_lines(os.path.join(self.tmp, "stderr")) or last_lines(os.path.join(self.tmp, "stdout"))
        with open(os.path.join(self.tmp, "stdout"), errors="replace") as f:  # its SPS is not the graph's: say so
            res.warning = "; ".join(line.strip() for line in f if "(CUDA graph capture failed" in line)
        shutil.rmtree(self.tmp, ignore_errors=True)
        return res


def run_together(runs: list[Run]) -> list[Result]:
    try:
        while not all([r.poll() for r in runs]):  # a list, so every run is polled each round
            time.sleep(0.05)
    except BaseException:  # Ctrl-C reaches only this tool: the runs have process groups of their own
        for r in runs:
            if r.status is None:
                r._signal(signal.SIGTERM)
        raise
    return [r.result() for r in runs]


def run_setting(setting: Setting, scale: float, timeout: float, cores: list[int] | None = None) -> Result:
    return run_together([Run(setting, scale, timeout, cores)])[0]


# ---------------------------------------------------------------- ceilings


def atari_env(num_envs: int, threads: int, env_id: str = "ALE/Breakout-v5", batch_size: int = 0):
    """ppo_atari.make_envs itself: the ale-py vector env with the v5 settings the runs use."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    import ppo_atari

    return ppo_atari.make_envs(ppo_atari.Args(env_id=env_id), num_envs, threads, batch_size)


def atari_ceiling(
    num_envs: int, threads: int, seconds: float, env_id: str = "ALE/Breakout-v5", batch_size: int = 0
) -> float:
    """AtariVectorEnv agent steps/s with random actions; ``batch_size`` B below num_envs: the asynchronous mode of
    ppo_atari.py --async-envs B, each step acting on the first B envs to finish."""
    import numpy as np

    env = atari_env(num_envs, threads, env_id, batch_size)
    actions = np.random.default_rng(0).integers(0, env.single_action_space.n, (64, batch_size or num_envs))
    return host_env_rate(env, actions, seconds)


def host_env_rate(envs, actions, seconds: float) -> float:
    """Agent steps/s of a host vector env stepped with ``actions`` (64 rows, cycled) for ``seconds`` after 10 warm-up
    steps: the mean over the whole time, resets included. Closes the env."""
    envs.reset(seed=0)
    num_envs = len(actions[0])
    for i in range(10):
        envs.step(actions[i])
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        envs.step(actions[steps // num_envs % 64])
        steps += num_envs
    rate = steps / (time.perf_counter() - t0)
    envs.close()
    return rate


def snake_ceiling(num_envs: int, device: str, seconds: float, mode: str = "dense", compiled: bool = False) -> float:
    """VecSnake 10x10 env steps/s with random actions: the median of 16-step windows (CUDA synchronised);
    ``compiled``: its step through torch.compile (default mode), which fuses the step's elementwise kernels."""
    import torch

    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from dqn_snake_vec import VecSnake

    env = VecSnake(num_envs, 10, 10, device=device, seed=0, mode=mode)
    env.reset()
    if compiled:
        env.step = torch.compile(env.step)
    gen = torch.Generator(device).manual_seed(0)
    actions = torch.randint(0, 4, (16, num_envs), device=device, generator=gen)  # drawn once, cycled
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for i in range(10):
        env.step(actions[i])
    sync()
    rates, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(rates) < 3:
        t0 = time.perf_counter()
        for i in range(16):
            env.step(actions[i])
        sync()
        rates.append(16 * num_envs / (time.perf_counter() - t0))
    return statistics.median(rates)


def mujoco_ceiling(env_id: str, num_envs: int, subproc: bool, seconds: float) -> float:
    """ppo_continuous.py's vector env (Sync, or Async in subprocesses) agent steps/s with random actions."""
    import gymnasium as gym
    import numpy as np

    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from ppo_continuous import make_env

    fns = [make_env(env_id, i, False, "", subproc) for i in range(num_envs)]
    mode = gym.vector.AutoresetMode.SAME_STEP
    vector = gym.vector.AsyncVectorEnv if subproc else gym.vector.SyncVectorEnv
    envs = vector(fns, autoreset_mode=mode, copy=False, **({"context": "forkserver"} if subproc else {}))
    low, high = envs.single_action_space.low, envs.single_action_space.high
    actions = np.random.default_rng(0).uniform(low, high, (64, num_envs, len(low))).astype(np.float32)
    return host_env_rate(envs, actions, seconds)


def measure_ceiling(label: str, how: str, unit: str, fn, *args) -> Result:
    print(f"[speed] {label} ...", flush=True)
    t0 = time.perf_counter()
    try:
        rate, status = fn(*args), "ok"
    except Exception as exc:  # noqa: BLE001 - a failed measurement is a row, not the end of the table
        rate, status = None, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
    res = Result(label, how, status=status, sps=rate, unit=unit, wall=time.perf_counter() - t0)
    print(f"[speed]   {fmt(rate)} {unit}" if rate else f"[speed]   {status}", flush=True)
    return res


def atari_row(n: int, threads: int, seconds: float, batch_size: int = 0) -> Result:
    label = f"ceiling: AtariVectorEnv Breakout, {n} envs, {threads} threads"
    label += f", async batches of {batch_size}" if batch_size else ""
    how = "random actions, v5 settings"
    return measure_ceiling(
        label, how, "agent steps/s", atari_ceiling, n, threads, seconds, "ALE/Breakout-v5", batch_size
    )


def snake_row(n: int, device: str, mode: str, seconds: float, compiled: bool = False) -> Result:
    label = f"ceiling: VecSnake 10x10, {n:,} games, {device}, {mode}" + (", step compiled" if compiled else "")
    return measure_ceiling(label, "random actions", "env steps/s", snake_ceiling, n, device, seconds, mode, compiled)


def mujoco_row(env_id: str, n: int, subproc: bool, seconds: float) -> Result:
    label = f"ceiling: {env_id}, {n} envs, {'AsyncVectorEnv (subprocesses)' if subproc else 'SyncVectorEnv'}"
    how = "random actions, ppo_continuous.make_env"
    return measure_ceiling(label, how, "agent steps/s", mujoco_ceiling, env_id, n, subproc, seconds)


# ---------------------------------------------------------------- the machine and the tables


def machine_info() -> dict[str, str]:
    """The machine, in one place: every table this tool writes starts with it."""
    import torch

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    info = {
        "host": socket.gethostname(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "CPU": f"{cpu}, {os.cpu_count()} logical cores, {gpu_utils.available_cpus()} allowed to this process",
        "GPU": ", ".join(gpus) or "none",
        "torch": torch.__version__ + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else ""),
        "python": platform.python_version(),
    }
    try:
        import ale_py

        info["ale-py"] = ale_py.__version__
    except ImportError:
        pass
    if hasattr(os, "getloadavg"):
        info["load average at start (1/5/15 min)"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return info


def fmt(x: float | None, digits: int = 0) -> str:
    return DASH if x is None else f"{x:,.{digits}f}"


def md_table(header: str, rows: list[list[str]]) -> list[str]:
    """A markdown table; header: the column names joined by " | "."""
    cell = lambda c: str(c).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    return [f"| {header} |", "|" + "---|" * len(header.split(" | "))] + [
        "| " + " | ".join(cell(c) for c in row) + " |" for row in rows
    ]


def results_table(results: list[Result]) -> list[str]:
    rows = []
    for r in results:
        util = f"{r.util_mean:.0f}% / {r.util_peak:.0f}%" if r.util_mean is not None else DASH
        mem = f"{fmt(r.peak_mib)} / {fmt(r.estimated_mib)}" if r.peak_mib or r.estimated_mib else DASH
        rate = f"{fmt(r.sps)} {r.unit}" if r.ok else DASH
        how = f"`{r.how}`" if r.how.startswith(("python", "OMP")) else r.how
        status = f"{r.status}; {r.warning}" if r.warning else r.status
        rows.append([r.label, how, fmt(r.steps) if r.steps else DASH, fmt(r.wall), rate, util, mem, status])
    header = "what | command / setting | steps | wall s | rate | GPU util mean / peak | peak / est. MiB | status"
    return md_table(header, rows)


def failures(results: list[Result]) -> list[str]:
    lines = []
    for r in results:
        if r.tail:
            lines += ["", f"{r.label}: {r.status}; last lines of its stderr:", "", "```", r.tail, "```"]
    return lines


def document(title: str, info: dict[str, str], note: str, body: list[str]) -> str:
    command = shlex.join(["python", os.path.relpath(os.path.abspath(sys.argv[0]), ROOT), *sys.argv[1:]])
    lines = [f"# {title}", "", f"- command: `{command}`"] + [f"- {k}: {v}" for k, v in info.items()]
    if note:
        lines.append(f"- note: {note}")
    if hasattr(os, "getloadavg"):
        lines.append("- load average at end (1/5/15 min): " + " / ".join(f"{x:.2f}" for x in os.getloadavg()))
    return "\n".join([*lines, "", *body]) + "\n"


def emit(text: str, out_dir: str, stem: str, host: str) -> None:
    print("\n" + text, end="")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", host)
        path = os.path.join(out_dir, f"{stem}_{safe}_{time.strftime('%Y-%m-%d', time.gmtime())}.md")
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path}")


# ---------------------------------------------------------------- profiles for `table`

BREAKOUT, CHEETAH = ["--env-id", "ALE/Breakout-v5"], ["--env-id", "HalfCheetah-v5"]
PRESET_BATCH = {"fast": 16 * 256, "heavy": 32 * 256, "beast": 64 * 512}


def snake(key: str, label: str, n: int, windows: int, flags: list[str]) -> Setting:
    """dqn_snake_vec.py with learning on from the 10th vector step, SPS logged every 50 vector steps."""
    size = ["--num-envs", str(n)] if n != 256 else []  # 256: the default
    args = [*size, "--learning-starts", str(10 * n), "--log-every", str(50 * n), *flags]
    return Setting(key, label, "dqn_snake_vec.py", args, 50 * n, windows)


def cpu_profile() -> list[Setting]:
    heavy = [*CHEETAH, "--preset", "heavy"]
    return [
        Setting("ppo_atari/defaults", "ppo_atari.py defaults (16 envs, Breakout)", "ppo_atari.py", BREAKOUT, 2048, 3),
        Setting("ppo_continuous/defaults", "ppo_continuous.py defaults", "ppo_continuous.py", CHEETAH, 2048, 6),
        Setting("ppo_continuous/heavy", "ppo_continuous.py --preset heavy", "ppo_continuous.py", heavy, 8192, 2),
        snake("dqn_snake_vec/defaults", "dqn_snake_vec.py defaults (256 games, 10x10)", 256, 6, []),
        snake("dqn_snake_vec/4096", "dqn_snake_vec.py --num-envs 4096", 4096, 3, []),
    ]


def gpu_profile(force_cpu: bool) -> list[Setting]:
    """The one-GPU table, rows behind targets first (past --budget-minutes the last ones are skipped)."""
    gpu = ["--gpu", "false" if force_cpu else "true"]
    atari, cont, dqn = [], [], {}
    for flags in ([], ["--compile"], ["--compile", "--cudagraphs"], ["--amp"]):
        name = " ".join(flags) or "eager"
        label = f"ppo_atari.py defaults (16 envs, Breakout), {name}"
        atari.append(Setting(f"ppo_atari/{name}", label, "ppo_atari.py", [*BREAKOUT, *gpu, *flags], 2048, 25))
    fastest_async = ["--compile", "--cudagraphs", "--async-envs", "8"]
    label = f"ppo_atari.py defaults (16 envs, Breakout), {' '.join(fastest_async)}"
    args = [*BREAKOUT, *gpu, *fastest_async]
    atari.append(Setting("ppo_atari-async/fastest", label, "ppo_atari.py", args, 2048, 25))
    for flags, batch, iters in [
        (["--preset", "beast"], 32768, 4),
        (["--preset", "beast", "--subproc"], 32768, 4),
        ([], 2048, 6),
        (["--preset", "fast"], 4096, 8),
        (["--preset", "heavy"], 8192, 6),
    ]:
        name = " ".join(flags) or "defaults"
        label = f"ppo_continuous.py {name} (HalfCheetah-v5)"
        cont.append(
            Setting(f"ppo_continuous/{name}", label, "ppo_continuous.py", [*CHEETAH, *gpu, *flags], batch, iters)
        )
    for n in (4096, 256, 65536):
        what = "defaults (256 games)" if n == 256 else f"--num-envs {n}"
        dqn[n] = [
            snake(f"dqn_snake_vec/{n}/{name}", f"dqn_snake_vec.py {what}, {name}", n, 8, [*gpu, *flags])
            for name, flags in [
                ("eager", []),
                ("--compile --cudagraphs", ["--compile", "--cudagraphs"]),
                # the step as before the whole-step graph: dense env, compiled pieces with graphs of their own
                ("--compile --cudagraphs --env-mode dense", ["--compile", "--cudagraphs", "--env-mode", "dense"]),
            ]
        ]
    return atari + cont[:2] + dqn[4096] + cont[2:] + dqn[256] + dqn[65536]


def gpu_targets(results: dict[str, Result]) -> list[str]:
    """The GPU issue's targets, each printed as a ratio of what was measured (none of them is a test)."""

    def best(prefix: str) -> Result | None:
        ok = [r for k, r in results.items() if k.startswith(prefix) and r.ok]
        return max(ok, key=lambda r: r.sps) if ok else None

    lines = ["## Targets (GPU issue)", ""]
    atari, ceiling = best("ppo_atari/"), results.get("ceiling/atari/16")
    if atari:
        line = f"- ppo_atari.py defaults, fastest flags ({atari.label}): {fmt(atari.sps)} SPS = "
        line += f"{atari.sps / 10_000:.2f}x the 10,000 SPS target"
        if ceiling and ceiling.ok:
            line += f"; {atari.sps / ceiling.sps:.0%} of the raw AtariVectorEnv ceiling at 16 envs (aim >= 85%)"
        line += (
            f"; {atari.sps / 6809:.2f}x LeanRL's published 6,809 SPS (pytorch-labs/LeanRL README, 'Speed-ups' "
            "table: ppo_atari_envpool_torchcompile.py, compile + cudagraphs, on an H100 node)"
        )
        lines.append(line)
    else:
        lines.append("- ppo_atari.py >= 10,000 SPS: not measured")
    atari_async, ceiling = results.get("ppo_atari-async/fastest"), results.get("ceiling/atari-async/16")
    if atari_async and atari_async.ok:
        line = f"- ppo_atari.py --async-envs 8 ({atari_async.label}): {fmt(atari_async.sps)} SPS"
        if ceiling and ceiling.ok:
            line += f" = {atari_async.sps / ceiling.sps:.0%} of the same envs' async ceiling ({fmt(ceiling.sps)})"
        lines.append(line)
    beast = best("ppo_continuous/--preset beast")
    lines.append(
        f"- ppo_continuous.py --preset beast: {fmt(beast.sps)} SPS = {beast.sps / 20_000:.2f}x the 20,000 "
        f"SPS target ({beast.label})"
        if beast
        else "- ppo_continuous.py --preset beast: not measured"
    )
    snakes = [r for k, r in results.items() if k.startswith(("ceiling/snake/", "ceiling/snake-fused/")) and r.ok]
    if snakes:
        top = max(snakes, key=lambda r: r.sps)
        lines.append(
            f"- VecSnake raw: best {fmt(top.sps)} env steps/s = {top.sps / 1e9:.2f}x the 1e9 target ({top.label})"
        )
    else:
        lines.append("- VecSnake raw >= 1e9 env steps/s: not measured")
    dqn = best("dqn_snake_vec/4096/")
    lines.append(
        f"- dqn_snake_vec.py --num-envs 4096, learning on: {fmt(dqn.sps)} env steps/s = {dqn.sps / 1e6:.2f}x "
        f"the 1,000,000 target ({dqn.label})"
        if dqn
        else "- dqn_snake_vec.py at 4096 games: not measured"
    )
    pairs = [r for r in results.values() if r.ok and r.peak_mib and r.estimated_mib]
    outside = [
        f"{r.label} ({r.peak_mib / r.estimated_mib:.2f}x)"
        for r in pairs
        if not 0.5 <= r.peak_mib / r.estimated_mib <= 2
    ]
    if pairs:
        lines.append(
            f"- memory estimate within 2x of the measured peak: {len(pairs) - len(outside)} of {len(pairs)} "
            f"runs" + (f"; outside: {'; '.join(outside)}" if outside else "")
        )
    else:
        lines.append("- memory estimates within 2x of the measured peak: no run logged both (GPU runs only)")
    return lines


# ---------------------------------------------------------------- the modes


def cmd_run(a, passthrough: list[str]) -> int:
    script = a.script if os.path.exists(a.script) else os.path.join(ROOT, a.script)
    if not os.path.isfile(script):
        raise UsageError(f"script '{a.script}' not found (give a path, or one of {', '.join(OURS)})")
    rel = os.path.relpath(os.path.abspath(script), ROOT)
    setting, info = Setting("run", rel, rel, passthrough, a.steps, 1, min_iters=1), machine_info()
    res = run_setting(setting, 1.0, a.timeout)
    body = [*results_table([res]), *failures([res])]
    emit(document("Speed of one run", info, a.note, body), a.out, "run", a.host)
    return 0 if res.ok else 1


def cmd_ceiling(a, _passthrough) -> int:
    threads, info = a.threads or gpu_utils.available_cpus(), machine_info()
    results = [atari_row(n, threads, a.seconds) for n in a.atari_envs]
    results += [snake_row(n, a.device, a.snake_mode, a.seconds) for n in a.snake_sizes]
    results += [snake_row(n, a.device, a.snake_mode, a.seconds, compiled=True) for n in a.compiled_snake_sizes]
    results += [mujoco_row(a.mujoco_env, n, subproc, a.seconds) for n in a.mujoco_envs for subproc in (False, True)]
    emit(document("Environment ceilings", info, a.note, results_table(results)), a.out, "ceiling", a.host)
    return 0 if all(r.ok for r in results) else 1


def compare_settings(which: str, cuda: bool) -> list[Setting]:
    """Ours and the CleanRL-style baseline at matched settings (same batch, minibatch and epochs); one iteration
    each, scaled by --iterations."""
    if which == "continuous":
        base, one = "benchmark/baseline_ppo_continuous.py", {"OMP_NUM_THREADS": "1"}
        return [
            Setting("baseline", "baseline (CleanRL-style), torch default threads", base, CHEETAH, 2048, 1),
            Setting("baseline/1", "baseline (CleanRL-style), 1 torch thread", base, CHEETAH, 2048, 1, env=one),
            Setting("ppo_continuous", "ppo_continuous.py defaults", "ppo_continuous.py", CHEETAH, 2048, 1),
        ]
    cleanrl = [*BREAKOUT, "--num-envs", "8", "--num-minibatches", "4"]  # CleanRL's ppo_atari.py: minibatch 256
    rows = [
        Setting(
            "baseline",
            "baseline (CleanRL-style, 8 envs, minibatch 256)",
            "benchmark/baseline_ppo_atari.py",
            BREAKOUT,
            1024,
            1,
        ),
        Setting("ppo_atari/cleanrl", "ppo_atari.py, CleanRL settings", "ppo_atari.py", cleanrl, 1024, 1),
        Setting(
            "ppo_atari/defaults", "ppo_atari.py defaults (16 envs, minibatch 256)", "ppo_atari.py", BREAKOUT, 2048, 1
        ),
    ]
    for flags in [["--compile", "--cudagraphs"]] if cuda else [["--compile"], ["--amp"]]:
        name = " ".join(flags)
        label = f"ppo_atari.py, CleanRL settings, {name}"
        rows.append(Setting(f"ppo_atari/cleanrl {name}", label, "ppo_atari.py", [*cleanrl, *flags], 1024, 1))
    return rows


def cmd_compare(a, _passthrough) -> int:
    import torch

    settings = compare_settings(a.which, torch.cuda.is_available())
    settings = [s for s in settings if selected(s.key, s.label, a.only)]
    scale = a.iterations  # every setting here has iters=1: the budget is a.iterations iterations of its batch
    if a.dry_run:
        print("\n".join(f"{s.label}: {s.shown(scale)}" for s in settings))
        return 0
    runs: dict[str, list[Result]] = {s.key: [] for s in settings}
    info = machine_info()
    for round_ in range(a.repeats):  # interleaved: every setting once per round spreads the machine's noise
        for s in settings:
            print(f"[speed] round {round_ + 1}/{a.repeats}: {s.label} ...", flush=True)
            res = run_setting(s, scale, a.timeout)
            print(f"[speed]   {fmt(res.sps)} SPS" if res.ok else f"[speed]   {res.status}", flush=True)
            runs[s.key].append(res)
    med = {
        k: statistics.median([r.sps for r in rs if r.ok]) if any(r.ok for r in rs) else None for k, rs in runs.items()
    }
    cpu = {
        k: statistics.median([r.cpu_s / r.steps * 1000 for r in rs if r.ok]) if any(r.ok for r in rs) else None
        for k, rs in runs.items()
    }
    bases = [k for k in med if k.startswith("baseline") and med[k]]
    best_base = max(bases, key=lambda k: med[k]) if bases else None
    rows = []
    for s in settings:
        ratio = f"{med[s.key] / med[best_base]:.2f}x" if med[s.key] and best_base else DASH
        cpu_ratio = f"{cpu[best_base] / cpu[s.key]:.2f}x" if cpu[s.key] and best_base else DASH
        n_ok = sum(r.ok for r in runs[s.key])
        status = "ok" if n_ok == a.repeats else f"{a.repeats - n_ok} of {a.repeats} failed"
        sps = f"{fmt(med[s.key])} ({n_ok})"
        rows.append([s.label, f"`{s.shown(scale)}`", sps, ratio, fmt(cpu[s.key], 2), cpu_ratio, status])
    header = "setting | command | SPS, median (runs) | x best baseline | CPU s / 1k steps | less CPU than it | status"
    body = [
        f"Medians over {a.repeats} interleaved round(s); SPS from each run's `charts/SPS` (warm-up iteration "
        "excluded); CPU s = user + system seconds of the whole process per 1,000 agent steps.",
        "",
        *md_table(header, rows),
        *failures([r for rs in runs.values() for r in rs]),
    ]
    emit(
        document(f"Speed against the baseline: {a.which}", info, a.note, body),
        a.out,
        f"compare_{a.which}",
        a.host,
    )
    return 0 if all(med.values()) else 1


AB_SCRIPTS = ("ppo_atari.py", "ppo_continuous.py", "dqn_snake_vec.py", "gpu_utils.py")
AB_KEYS = {  # rows of the profile that old code runs too (flags it has), the speed issues' rows first
    "gpu": [
        "ppo_atari/--compile --cudagraphs",
        "ppo_continuous/--preset beast",
        "dqn_snake_vec/4096/--compile --cudagraphs",
        "ppo_atari/eager",
        "dqn_snake_vec/65536/--compile --cudagraphs",
    ],
    "cpu": ["ppo_atari/defaults", "ppo_continuous/defaults", "dqn_snake_vec/defaults"],
}


def before_code(before: str) -> tuple[str, str]:
    """The folder of the old scripts (and gpu_utils.py, which they import from beside them) and what it is: a folder
    as given (its REF file, written by `speed.py before REF FOLDER`, names the commit), or a git commit of this
    repository, copied out with `git archive` into a temporary folder."""
    if os.path.isdir(before):  # made by `speed.py before` or `dev/gpu_lease.py prepare` (export_before)
        missing = [f for f in AB_SCRIPTS if not os.path.isfile(os.path.join(before, f))]
        if missing:
            raise UsageError(
                f"--before {before}: no {', '.join(missing)} there; fill it with `speed.py before REF {before}` "
                "(git archive REF of the scripts and gpu_utils.py)"
            )
        ref_file = os.path.join(before, "REF")
        ref = "not recorded"
        if os.path.isfile(ref_file):
            with open(ref_file) as f:
                ref = f.read().strip()
        return before, f"folder {before} (commit {ref})"
    commit = resolve_commit(before)
    if not commit:
        raise UsageError(
            f"--before {before}: neither a folder nor a commit of this repository (give a folder made by "
            "`speed.py before REF FOLDER`, or a commit where git and the history are at hand)"
        )
    folder = tempfile.mkdtemp(prefix="speed_before_")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the copy lives as long as this tool
    export_before(commit, folder)
    return folder, f"commit {commit}"


def resolve_commit(ref: str) -> str:
    """The short hash of commit ``ref`` of this repository, or "" when it is none (or git is not at hand)."""
    resolve = ["git", "-C", ROOT, "rev-parse", "--short", "--verify", "--quiet", f"{ref}^{{commit}}"]
    try:
        return subprocess.run(resolve, capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:  # no git
        return ""


def export_before(commit: str, folder: str) -> None:
    """Copy ``commit``'s scripts and gpu_utils.py into ``folder`` with `git archive` and name the commit in its REF
    file (`ab --before` on a commit, `before`, and `dev/gpu_lease.py prepare` for the GPU machine, which has no
    history)."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", commit, *AB_SCRIPTS], capture_output=True)
    if archive.returncode != 0:
        raise UsageError(f"before: git archive of {commit} failed: {archive.stderr.decode().strip().splitlines()[-1]}")
    os.makedirs(folder, exist_ok=True)
    subprocess.run(["tar", "x", "-C", folder], input=archive.stdout, check=True)
    with open(os.path.join(folder, "REF"), "w") as f:
        f.write(commit + "\n")


def cmd_before(a, _passthrough) -> int:
    commit = resolve_commit(a.ref)
    if not commit:
        raise UsageError(f"before: '{a.ref}' is not a commit here")
    shutil.rmtree(a.folder, ignore_errors=True)
    export_before(commit, a.folder)
    print(f"before: the scripts of commit {commit} in {a.folder}")
    return 0


def cmd_ab(a, _passthrough) -> int:
    """Old and new code at the same settings, interleaved on one machine: each round runs every setting twice, old
    then new in rounds 1, 3, ... and new then old in rounds 2, 4, ..., so a drift of the machine's speed touches
    both alike."""
    gpu = a.profile == "gpu"
    profile = {s.key: s for s in (gpu_profile(a.force_cpu) if gpu else cpu_profile())}
    settings = [profile[k] for k in AB_KEYS[a.profile] if selected(k, profile[k].label, a.only)]
    folder, what = before_code(a.before)
    pairs = [
        (s, replace(s, script=os.path.join(os.path.abspath(folder), os.path.basename(s.script)))) for s in settings
    ]
    if a.dry_run:
        for new, old in pairs:
            print(f"{new.label}:\n  before: {old.shown(a.scale)}\n  after:  {new.shown(a.scale)}")
        return 0
    info = machine_info()
    deadline = time.perf_counter() + a.budget_minutes * 60 if a.budget_minutes else float("inf")
    runs: dict[str, dict[str, list[Result]]] = {s.key: {"before": [], "after": []} for s in settings}
    for round_ in range(a.rounds):
        for new, old in pairs:
            if deadline - time.perf_counter() < 60:  # past --budget-minutes no pair starts; a started one finishes
                continue
            order = [("before", old), ("after", new)]
            for which, s in order if round_ % 2 == 0 else order[::-1]:
                print(f"[speed] round {round_ + 1}/{a.rounds}, {which}: {s.label} ...", flush=True)
                res = run_setting(s, a.scale, a.timeout)
                print(f"[speed]   {fmt(res.sps)} SPS" if res.ok else f"[speed]   {res.status}", flush=True)
                runs[new.key][which].append(res)
    rows = []
    for new in settings:
        cells, medians = [], {}
        for which in ("before", "after"):
            ok = [r for r in runs[new.key][which] if r.ok]
            medians[which] = statistics.median(r.sps for r in ok) if ok else None
            util = [r.util_mean for r in ok if r.util_mean is not None]
            each = ", ".join(fmt(r.sps) if r.ok else r.status for r in runs[new.key][which]) or "not run"
            each += "".join(f"; {w}" for w in sorted({r.warning for r in runs[new.key][which] if r.warning}))
            shown = f"{fmt(medians[which])} ({each})"
            cells.append(shown + (f"; GPU {statistics.fmean(util):.0f}%" if util else ""))
        before, after = medians["before"], medians["after"]
        ratio = f"**{after / before:.2f}x**" if before and after else DASH
        rows.append([new.label, f"`{new.shown(a.scale)}`", *cells, ratio])
    header = "setting | command (after; before: the same with the old script) | before: SPS median (each run) | "
    header += "after: SPS median (each run) | after / before"
    all_results = [r for both in runs.values() for rs in both.values() for r in rs]
    body = [
        f"Before: {what}. After: this checkout. {a.rounds} round(s), interleaved: each round runs every setting with "
        "the old code and the new, old first in odd rounds and new first in even ones (the first round is round 1). "
        "SPS: the median of each run's `charts/SPS` after warm-up; GPU: the mean of its `gpu/util_mean`.",
        "",
        *md_table(header, rows),
        *failures(all_results),
    ]
    emit(document("Before and after, same machine", info, a.note, body), a.out, f"ab_{a.profile}", a.host)
    return 0 if all(r.ok for r in all_results) and all_results else 1


def cmd_table(a, _passthrough) -> int:
    import torch

    gpu, cuda = a.profile == "gpu", torch.cuda.is_available() and not a.force_cpu
    settings = gpu_profile(a.force_cpu) if gpu else cpu_profile()
    threads = gpu_utils.available_cpus()
    atari_envs = a.atari_envs or ([16, 64, 128] if gpu else [16, 64])
    device = "cuda" if cuda else "cpu"
    snake_sizes = a.snake_sizes or ([2**k for k in range(12, 23)] if gpu else [256, 4096, 65536])
    mode = "dense" if gpu else "auto"
    ceilings = [
        (f"ceiling/atari/{n}", f"AtariVectorEnv {n} envs", lambda n=n: atari_row(n, threads, a.seconds))
        for n in atari_envs
    ]
    if gpu:  # the envs of ppo_atari.py --async-envs 8: 16 envs, each step acting on the first 8 to finish
        ceilings.append(
            ("ceiling/atari-async/16", "AtariVectorEnv 16 envs, async 8", lambda: atari_row(16, threads, a.seconds, 8))
        )
    ceilings += [
        (f"ceiling/snake/{n}", f"VecSnake {n}", lambda n=n: snake_row(n, device, mode, a.seconds)) for n in snake_sizes
    ]
    if gpu:  # the fused step beside the dense one, size by size
        ceilings += [
            (f"ceiling/snake-fused/{n}", f"VecSnake fused {n}", lambda n=n: snake_row(n, device, "fused", a.seconds))
            for n in snake_sizes
        ]
    ceilings = [c for c in ceilings if selected(c[0], c[1], a.only)]
    settings = [s for s in settings if selected(s.key, s.label, a.only)]
    if a.dry_run:
        lines = [f"{label}: {a.seconds:g} s" for _, label, _ in ceilings]
        print("\n".join(lines + [f"{s.label}: {s.shown(a.scale)}" for s in settings]))
        return 0
    info = machine_info()
    deadline = time.perf_counter() + a.budget_minutes * 60 if a.budget_minutes else float("inf")
    results: dict[str, Result] = {}
    for key, _, measure in ceilings:
        results[key] = measure()
    for s in settings:
        left = deadline - time.perf_counter()
        if left < 60:  # a run started now could not finish its warm-up inside the budget
            skipped = f"skipped: past --budget-minutes {a.budget_minutes:g}"
            results[s.key] = Result(s.label, s.shown(a.scale), status=skipped)
            continue
        print(f"[speed] {s.label}: {s.steps(a.scale):,} steps ...", flush=True)
        results[s.key] = res = run_setting(s, a.scale, min(a.timeout, left))
        print(f"[speed]   {fmt(res.sps)} SPS, {res.wall:.0f} s" if res.ok else f"[speed]   {res.status}", flush=True)
    note = "; ".join(filter(None, [a.note, "--force-cpu: the GPU rows ran on the CPU" if a.force_cpu and gpu else ""]))
    within = (
        f", the table held to {a.budget_minutes:g} min (no run starts in its last minute)" if a.budget_minutes else ""
    )
    body = [
        f"Profile `{a.profile}`, step budgets x{a.scale:g}, runs stopped after {a.timeout:.0f} s{within}. Rate: "
        "SPS = agent (env) steps per second with learning on, the median of the run's `charts/SPS` after warm-up; "
        "ceilings step the environments alone with random actions.",
        "",
        *results_table(list(results.values())),
        *failures(list(results.values())),
    ]
    if gpu:
        body += ["", *gpu_targets(results)]
    emit(document("Throughput", info, note, body), a.out, f"throughput_{a.profile}", a.host)
    return 0 if all(r.ok for r in results.values()) else 1


CONCURRENCY = {  # short CPU settings; dqn_snake_vec.py's are those of the "started by hand" issue
    "ppo_atari": Setting(
        "ppo_atari",
        "ppo_atari.py Pong, 4 envs x 128 steps, minibatch 128",
        "ppo_atari.py",
        ["--env-id", "ALE/Pong-v5", "--num-envs", "4", "--num-steps", "128", "--minibatch-size", "128"],
        512,
        8,
    ),
    "dqn_snake_vec": Setting(
        "dqn_snake_vec",
        "dqn_snake_vec.py on the CPU, learning from step 10,000, SPS per 12,800 steps",
        "dqn_snake_vec.py",
        ["--learning-starts", "10000", "--log-every", "12800", "--gpu", "false", "--checkpoint-every", "0"],
        12800,
        5,
    ),
    "ppo_continuous": Setting(
        "ppo_continuous", "ppo_continuous.py defaults (HalfCheetah-v5)", "ppo_continuous.py", CHEETAH, 2048, 6
    ),
    "ppo_continuous_heavy": Setting(  # for a GPU machine: runs sharing one GPU
        "ppo_continuous_heavy",
        "ppo_continuous.py --preset heavy",
        "ppo_continuous.py",
        ["--preset", "heavy"],
        PRESET_BATCH["heavy"],
        6,
    ),
}


def concurrency_target(copies: int, gpu: bool) -> tuple[str, float] | None:
    """The thread-budget issue's targets: on the 2-core machine 2 copies >= 1.0x and 4 >= 0.9x one run alone; on a
    GPU machine (JOBS_PER_GPU=2 and 4) more total SPS than one run."""
    if copies == 1:
        return None
    return (">", 1.0) if gpu else {2: (">=", 1.0), 4: (">=", 0.9)}.get(copies)


def cmd_concurrency(a, _passthrough) -> int:
    import torch

    unknown = set(a.scripts) - set(CONCURRENCY)
    if unknown:
        raise UsageError(f"--scripts takes {', '.join(CONCURRENCY)}; got {', '.join(sorted(unknown))}")
    if not a.by_hand and not shutil.which("taskset"):
        raise UsageError("taskset (util-linux) not found: it pins each copy; install it or pass --by-hand")
    allowed = gpu_utils.allowed_cpus()
    plan = []
    for name in a.scripts:
        for copies in a.copies:
            budgets = [None] * copies if a.by_hand else gpu_utils.split_cpus(allowed, copies)
            plan.append((CONCURRENCY[name], copies, budgets))
    if a.dry_run:
        for s, copies, budgets in plan:
            print(f"{s.label}, {copies} at once:")
            print("\n".join(f"  {launch(s, a.scale, cores, a.by_hand)[2]}" for cores in budgets))
        return 0
    gpu, rows, alone, all_results, info = torch.cuda.is_available(), [], {}, [], machine_info()
    if a.by_hand and len(allowed) < (os.cpu_count() or 1):
        print(f"[speed] warning: this tool may use only CPUs {allowed}: the runs see a fixed budget, not by hand")
    for s, copies, budgets in plan:
        print(f"[speed] {s.label}: {copies} at once, {s.steps(a.scale):,} steps each ...", flush=True)
        results = run_together([Run(s, a.scale, a.timeout, cores, a.by_hand) for cores in budgets])
        all_results += results
        ok = all(r.ok for r in results)
        total = sum(r.sps for r in results) if ok else None
        if copies == 1:
            alone[s.key] = total
        ratio = total / alone[s.key] if ok and alone.get(s.key) else None
        target, shown_target = concurrency_target(copies, gpu), DASH
        if target:
            met = ratio is not None and (ratio > target[1] if target[0] == ">" else ratio >= target[1])
            shown_target = f"{target[0]} {target[1]:.2f}x: " + ("met" if met else "not met")
        cores = (
            "by hand; last threads/torch " + " / ".join(DASH if r.threads is None else str(r.threads) for r in results)
            if a.by_hand
            else "; ".join(",".join(map(str, c)) for c in budgets)
        )
        status = "ok" if ok else "; ".join(sorted({r.status for r in results if not r.ok}))
        rows.append(
            [
                s.label,
                str(copies),
                cores,
                " / ".join(fmt(r.sps) if r.ok else DASH for r in results),
                fmt(total),
                f"{ratio:.2f}x" if ratio else DASH,
                " / ".join(fmt(r.util_mean) if r.util_mean is not None else DASH for r in results),
                shown_target,
                status,
            ]
        )
        print(f"[speed]   total {fmt(total)} SPS" + (f", {ratio:.2f}x one alone" if ratio else ""), flush=True)
    header = "script | copies | cores per copy | per-copy SPS | total SPS | x one alone | GPU util % | target | status"
    rule = (
        "started by hand: no pinning, no thread variables; each run shares the CPUs with the live ones itself "
        "(gpu_utils.CpuShare), its last share shown as threads/torch"
        if a.by_hand
        else "copy s pinned with `taskset -c` to CPU group s of gpu_utils.split_cpus(allowed CPUs, C) "
        "(core s % P when C > P), OMP_NUM_THREADS = MKL_NUM_THREADS = the group's size"
    )
    body = [
        f"Copies run at once, each with the same step budget (x{a.scale:g}); {rule}. Total SPS = sum of the "
        "copies' median `charts/SPS`. Targets (thread-budget issue): on the 2-core development machine 2 copies "
        ">= 1.0x and 4 copies >= 0.9x one run alone; on a GPU machine more total SPS than one run.",
        "",
        *md_table(header, rows),
        *failures(all_results),
    ]
    stem = "concurrency_by_hand" if a.by_hand else "concurrency"
    emit(document("Concurrent runs", info, a.note, body), a.out, stem, a.host)
    return 0 if all(r.ok for r in all_results) else 1


def selected(key: str, label: str, only: list[str] | None) -> bool:
    return not only or any(o in key or o in label for o in only)


# ---------------------------------------------------------------- command line


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise UsageError(f"{message} (see {self.prog} --help)")


def positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def parser() -> Parser:
    p = Parser(prog="speed.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True, parser_class=Parser)

    def common(sp, out_default=""):
        sp.add_argument("--timeout", type=positive(float), default=240, help="seconds before a run is stopped")
        sp.add_argument("--out", default=out_default, help="folder for the markdown file (empty: print only)")
        sp.add_argument("--note", default="", help="a line added under the machine (e.g. other load)")
        sp.add_argument("--host", default=os.environ.get("HOST_LABEL", socket.gethostname()), help="name in files")

    r = sub.add_parser("run", help="one script for a fixed step budget; arguments after -- go to the script")
    r.add_argument("script", help="ppo_atari.py, ppo_continuous.py, dqn_snake_vec.py or a baseline's path")
    r.add_argument("--steps", type=positive(int), required=True, help="--total-timesteps for the run")
    common(r)

    c = sub.add_parser("ceiling", help="AtariVectorEnv and VecSnake steps/s with random actions")
    c.add_argument("--atari-envs", type=positive(int), nargs="*", default=[16, 64])
    c.add_argument("--threads", type=positive(int), default=None, help="AtariVectorEnv threads (default: all)")
    c.add_argument("--snake-sizes", type=positive(int), nargs="*", default=[256, 4096, 65536])
    c.add_argument("--device", default="cpu", help="VecSnake device: cpu, cuda, cuda:N")
    c.add_argument(
        "--mode", dest="snake_mode", default="dense", choices=["auto", "dense", "sparse", "fused"], help="VecSnake mode"
    )
    c.add_argument("--compiled-snake-sizes", type=positive(int), nargs="*", default=[], help="VecSnake, step compiled")
    c.add_argument("--mujoco-envs", type=positive(int), nargs="*", default=[], help="MuJoCo vector env sizes")
    c.add_argument("--mujoco-env", default="HalfCheetah-v5", help="MuJoCo env id for --mujoco-envs")
    c.add_argument("--seconds", type=positive(float), default=3, help="seconds per measurement")
    common(c)

    m = sub.add_parser("compare", help="ours against the CleanRL-style baseline at matched settings")
    m.add_argument("which", choices=["atari", "continuous"])
    m.add_argument("--iterations", type=positive(int), default=5, help="iterations per run (the first is warm-up)")
    m.add_argument("--repeats", type=positive(int), default=1, help="interleaved rounds of every setting")
    m.add_argument("--only", nargs="*", help="settings whose key or label contains one of these")
    m.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    common(m)

    e = sub.add_parser("before", help="copy a commit's scripts into a folder for `ab --before FOLDER`")
    e.add_argument("ref", help="a commit of this repository")
    e.add_argument("folder", help="where the scripts go (emptied first)")

    b = sub.add_parser("ab", help="old and new code at the same settings, interleaved on this machine")
    b.add_argument(
        "--before", required=True, help="the old code: a folder (speed.py before REF FOLDER) or a git commit"
    )
    b.add_argument(
        "--profile",
        choices=["cpu", "gpu"],
        help="whose rows: "
        + "; ".join(f"{k}: {', '.join(v)}" for k, v in AB_KEYS.items())
        + " (default: gpu with CUDA)",
    )
    b.add_argument("--force-cpu", action="store_true", help="run the GPU profile's rows on the CPU (for tests)")
    b.add_argument("--rounds", type=positive(int), default=2, help="interleaved rounds of old and new")
    b.add_argument("--scale", type=positive(float), default=1.0, help="multiply every step budget")
    b.add_argument("--budget-minutes", type=float, default=0, help="start no old/new pair after this (0: no limit)")
    b.add_argument("--only", nargs="*", help="rows whose key or label contains one of these")
    b.add_argument("--dry-run", action="store_true", help="print both commands of every row, run nothing")
    common(b, os.path.join(HERE, "results"))

    t = sub.add_parser("table", help="the throughput table, written to benchmark/results/")
    t.add_argument(
        "--profile",
        choices=["cpu", "gpu"],
        help="cpu: short CPU table; gpu: the one-GPU table with targets (default: gpu when CUDA is present)",
    )
    t.add_argument("--force-cpu", action="store_true", help="run the GPU profile's rows on the CPU (for tests)")
    t.add_argument("--scale", type=positive(float), default=1.0, help="multiply every step budget")
    t.add_argument(
        "--budget-minutes",
        type=float,
        default=None,
        help="stop starting runs after this long (default: 8 for the gpu profile, none for cpu)",
    )
    t.add_argument("--seconds", type=positive(float), default=None, help="seconds per ceiling (default 5 cpu, 2 gpu)")
    t.add_argument("--atari-envs", type=positive(int), nargs="*", help="AtariVectorEnv sizes (default per profile)")
    t.add_argument("--snake-sizes", type=positive(int), nargs="*", help="VecSnake sizes (default per profile)")
    t.add_argument("--only", nargs="*", help="rows whose key or label contains one of these")
    t.add_argument("--dry-run", action="store_true", help="print the rows and commands, run nothing")
    common(t, os.path.join(HERE, "results"))

    k = sub.add_parser("concurrency", help="1, 2, 4 copies at once: total SPS against one run alone")
    k.add_argument("--copies", type=positive(int), nargs="+", default=[1, 2, 4])
    k.add_argument(
        "--scripts",
        nargs="+",
        default=["ppo_atari", "dqn_snake_vec", "ppo_continuous"],
        help=", ".join(CONCURRENCY) + " (default: the first three; ppo_continuous_heavy is for a GPU)",
    )
    k.add_argument("--scale", type=positive(float), default=1.0, help="multiply every step budget")
    k.add_argument(
        "--by-hand",
        "--no-budget",
        action="store_true",
        help="started by hand: no pinning, no thread variables (each run shares the CPUs itself)",
    )
    k.add_argument("--dry-run", action="store_true", help="print the commands of each copy, run nothing")
    common(k)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    try:
        a = parser().parse_args(argv)
        if passthrough and a.mode != "run":
            raise UsageError("arguments after -- are for `run` only")
        if a.mode in ("table", "ab"):
            import torch

            a.profile = a.profile or ("gpu" if torch.cuda.is_available() else "cpu")
            gpu = a.profile == "gpu"
            a.budget_minutes = (8 if gpu else 0) if a.budget_minutes is None else a.budget_minutes
            if a.mode == "table":
                a.seconds = a.seconds or (2 if gpu else 5)
            if a.budget_minutes < 0:
                raise UsageError("--budget-minutes must be >= 0 (0: no limit)")
        if a.mode == "concurrency" and 1 not in a.copies:
            a.copies = [1, *a.copies]  # the ratio needs one run alone
        modes = {
            "run": cmd_run,
            "ceiling": cmd_ceiling,
            "compare": cmd_compare,
            "ab": cmd_ab,
            "before": cmd_before,
            "table": cmd_table,
            "concurrency": cmd_concurrency,
        }
        return modes[a.mode](a, passthrough)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the runs this tool started were sent SIGTERM", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
