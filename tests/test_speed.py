"""Tests for benchmark/speed.py: the SPS reader, the thread-budget rule, the tables, and real tiny runs on the CPU.

No test here times anything: the runs are there to show that each mode runs each script and reads its SPS back.
"""

import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmark")
sys.path.insert(0, BENCH)
import speed  # noqa: E402

import gpu_utils  # noqa: E402  (speed puts the repository root on the path)

sys.path.remove(BENCH)

# the smallest settings that still log SPS at least once (two iterations or log windows)
TINY = {
    "ppo_atari.py": (
        16,
        [
            "--env-id",
            "ALE/Pong-v5",
            "--num-envs",
            "1",
            "--num-steps",
            "8",
            "--minibatch-size",
            "8",
            "--update-epochs",
            "1",
        ],
    ),
    "ppo_continuous.py": (128, ["--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "1"]),
    "dqn_snake_vec.py": (
        320,
        ["--num-envs", "16", "--learning-starts", "32", "--log-every", "64", "--batch-size", "16"],
    ),
    "benchmark/baseline_ppo_atari.py": (
        64,
        ["--env-id", "ALE/Pong-v5", "--num-envs", "1", "--num-steps", "32", "--update-epochs", "1"],
    ),
    "benchmark/baseline_ppo_continuous.py": (
        128,
        ["--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "1"],
    ),
}


def tiny(script, extra=(), steps=None):
    budget, args = TINY[script]
    return speed.Setting("tiny", f"{script} (tiny)", script, [*args, *extra], steps or budget, 1, min_iters=1)


def cli(*args, timeout=120):
    cmd = [sys.executable, os.path.join(BENCH, "speed.py"), *map(str, args)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def test_read_metrics(tmp_path):
    """SPS: median of charts/SPS; GPU utilisation over the steps that have an SPS; memory: the last values."""
    w = SummaryWriter(str(tmp_path / "run"))
    w.add_scalar("memory/estimated_mib", 100.0, 0)
    for step, util, peak in [(1, 0, 10), (2, 50, 90), (3, 70, 95), (4, 60, 80)]:
        w.add_scalar("gpu/util_mean", util, step)
        w.add_scalar("gpu/util_peak", peak, step)
    for step, sps in [(2, 100), (3, 300), (4, 200)]:  # step 1 is the warm-up iteration: no SPS
        w.add_scalar("charts/SPS", sps, step)
    w.add_scalar("memory/peak_allocated_mib", 150.0, 4)
    w.close()
    m = speed.read_metrics(str(tmp_path / "run"))
    expected = {"sps": 200, "n_sps": 3, "util_mean": 60, "util_peak": 95, "peak_mib": 150, "estimated_mib": 100}
    assert m == {**expected, "threads": None}
    w = SummaryWriter(str(tmp_path / "cpu"))
    w.add_scalar("charts/SPS", 5.0, 1)
    w.close()
    m = speed.read_metrics(str(tmp_path / "cpu"))
    assert m["sps"] == 5 and m["util_mean"] is None and m["peak_mib"] is None


def test_by_hand_launch_has_no_thread_variables(monkeypatch):
    for var in speed.THREAD_VARS:
        monkeypatch.setenv(var, "1")
    setting = speed.CONCURRENCY["dqn_snake_vec"]
    cmd, env, shown = speed.launch(setting, 1.0, None, by_hand=True)
    assert not set(speed.THREAD_VARS) & set(env) and "taskset" not in cmd and shown == setting.shown(1.0)
    assert "--log-every 12800" in shown and "--learning-starts 10000" in shown and "--gpu false" in shown  # the issue's
    cmd, env, shown = speed.launch(setting, 1.0, [0])  # pinned: told its threads
    assert cmd[:3] == ["taskset", "-c", "0"] and env["OMP_NUM_THREADS"] == "1"


def test_tables_show_failures_as_failures():
    ok = speed.Result(
        "a", "python a.py", sps=1234.4, steps=100, wall=2.0, util_mean=50, util_peak=90, peak_mib=300, estimated_mib=200
    )
    bad = speed.Result("b", "python b.py", status="failed (exit 2)", sps=None, steps=100, wall=1.0, tail="boom")
    late = speed.Result("c", "python c.py", status="timed out after 5 s", sps=999.0, steps=100, wall=5.0)
    lines = speed.results_table([ok, bad, late])
    assert lines[2] == "| a | `python a.py` | 100 | 2 | 1,234 SPS | 50% / 90% | 300 / 200 | ok |"
    assert lines[3].endswith("| - | - | - | failed (exit 2) |")
    assert "999" not in lines[4] and lines[4].endswith("| timed out after 5 s |")  # never a number
    assert "\n".join(speed.failures([ok, bad, late])).count("last lines of its stderr") == 1
    assert "boom" in speed.failures([bad])


def test_a_run_whose_graph_capture_failed_says_so_beside_its_sps(tmp_path):
    """A run that fell back from a CUDA graph (gpu_utils.CudaGraph prints why) keeps its SPS, and the table's status
    says that the figure is not the graph's."""
    script = tmp_path / "fake.py"
    script.write_text(
        "from torch.utils.tensorboard import SummaryWriter\n"
        "print('update: eager (CUDA graph capture failed: RuntimeError: boom)')\n"
        "writer = SummaryWriter('runs/fake')\n"
        "writer.add_scalar('charts/SPS', 500.0, 1)\n"
        "writer.close()\n"
    )
    res = speed.run_setting(speed.Setting("fake", "fake", str(script), [], 10, 1), 1.0, timeout=120)
    assert res.ok and res.sps == 500.0
    assert res.warning == "update: eager (CUDA graph capture failed: RuntimeError: boom)"
    row = speed.results_table([res])[2]
    assert row.endswith("| 500 SPS | - | - | ok; update: eager (CUDA graph capture failed: RuntimeError: boom) |")


@pytest.mark.parametrize("script", list(TINY))
def test_tiny_run_of_each_script(script):
    """Each script and each baseline runs through the tool and its SPS comes back from its event file."""
    res = speed.run_setting(tiny(script), 1.0, timeout=120)
    assert res.ok, (res.status, res.tail)
    assert res.sps > 0 and res.n_sps >= 1 and res.cpu_s > 0
    assert res.util_mean is None and res.peak_mib is None  # CPU runs log no GPU figures


def test_failed_and_timed_out_runs(tmp_path):
    res = speed.run_setting(tiny("ppo_continuous.py", ["--env-id", "NoSuchEnv-v0"]), 1.0, timeout=120)
    assert res.status.startswith("failed (exit") and res.sps is None and "NoSuchEnv" in res.tail
    res = speed.run_setting(tiny("dqn_snake_vec.py", steps=10**9), 1.0, timeout=2)
    assert res.status == "timed out after 2 s" and res.sps is None
    out = cli("run", "ppo_continuous.py", "--steps", 100, "--out", tmp_path, "--", "--env-id", "NoSuchEnv-v0")
    assert out.returncode == 1, out.stderr
    (report,) = tmp_path.glob("run_*.md")
    text = report.read_text()
    assert "- command: `python benchmark/speed.py run ppo_continuous.py" in text and "- CPU: " in text
    assert "| failed (exit" in text and "last lines of its stderr" in text


def test_bad_input_one_line_errors():
    for args, words in [
        (["table", "--scale", "0"], "must be positive"),
        (["concurrency", "--scripts", "nope"], "--scripts takes"),
        (["run", "nosuch.py", "--steps", "5"], "not found"),
        (["compare", "bogus"], "invalid choice"),
        (["table", "--", "--x"], "for `run` only"),
        (["nope"], "invalid choice"),
    ]:
        res = cli(*args)
        assert res.returncode == 2 and res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
        assert words in res.stderr and "Traceback" not in res.stderr


def test_atari_ceiling_uses_ppo_atari_settings():
    """The ceiling's env and ppo_atari.make_envs give the same frames for the same seed and actions."""
    import numpy as np

    sys.path.insert(0, ROOT)
    try:
        import ppo_atari
    finally:
        sys.path.remove(ROOT)
    ours = ppo_atari.make_envs(ppo_atari.Args(env_id="ALE/Breakout-v5"), num_envs=2, env_threads=1)
    ceiling = speed.atari_env(2, 1)
    obs_a, _ = ours.reset(seed=3)
    obs_b, _ = ceiling.reset(seed=3)
    actions = np.random.default_rng(0).integers(0, 4, (40, 2))
    for a in actions:
        assert np.array_equal(obs_a, obs_b)
        obs_a, obs_b = ours.step(a)[0], ceiling.step(a)[0]
    ours.close()
    ceiling.close()
    assert speed.atari_ceiling(2, 1, 0.2) > 0


NEEDS_TASKSET = pytest.mark.skipif(not shutil.which("taskset"), reason="needs taskset (util-linux) to pin copies")


@NEEDS_TASKSET
def test_concurrency_dry_run_budgets():
    res = cli("concurrency", "--dry-run", "--copies", "2", "4", "--scripts", "ppo_atari")
    assert res.returncode == 0, res.stderr
    lines = [line.strip() for line in res.stdout.splitlines() if line.startswith("  ")]
    allowed = gpu_utils.allowed_cpus()
    expected = [c for n in (1, 2, 4) for c in gpu_utils.split_cpus(allowed, n)]  # 1 is added: the ratio's base
    assert len(lines) == 7
    for line, cores in zip(lines, expected):
        k = len(cores)
        assert line.startswith(f"OMP_NUM_THREADS={k} MKL_NUM_THREADS={k} taskset -c {','.join(map(str, cores))} ")
        assert "--env-id ALE/Pong-v5 --num-envs 4 --num-steps 128 --minibatch-size 128" in line
    res = cli("concurrency", "--dry-run", "--copies", "2", "--scripts", "dqn_snake_vec", "--by-hand")
    assert res.returncode == 0 and "taskset" not in res.stdout and "OMP_NUM_THREADS" not in res.stdout


@NEEDS_TASKSET
def test_concurrency_tiny(tmp_path):
    res = cli("concurrency", "--scripts", "ppo_atari", "--copies", "2", "--scale", "0.1", "--out", tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    (report,) = tmp_path.glob("concurrency_*.md")
    text = report.read_text()
    assert "- CPU: " in text and "- command: `python benchmark/speed.py concurrency" in text
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| ppo_atari.py")]
    assert [r[1].strip() for r in rows] == ["1", "2"]
    one, two = rows
    assert one[5].strip() == "1.00x" and one[7].strip() == "-"
    per_copy = [float(x.replace(",", "")) for x in two[3].split(" / ")]
    assert len(per_copy) == 2 and abs(sum(per_copy) - float(two[4].replace(",", ""))) <= 2  # total = sum (rounding)
    ratio = float(two[5].strip().rstrip("x"))
    assert two[7].strip() == f">= 1.00x: {'met' if ratio >= 1.0 else 'not met'}"


def test_compare_settings_are_matched():
    res = cli("compare", "atari", "--dry-run", "--iterations", "3")
    assert res.returncode == 0, res.stderr
    cmds = dict(line.split(": ", 1) for line in res.stdout.splitlines())
    base = cmds["baseline (CleanRL-style, 8 envs, minibatch 256)"]
    assert base == "python benchmark/baseline_ppo_atari.py --env-id ALE/Breakout-v5 --total-timesteps 3072"
    ours = cmds["ppo_atari.py, CleanRL settings"]
    assert "--num-envs 8 --num-minibatches 4 --total-timesteps 3072" in ours  # 8 x 128 x 3 iterations, as the baseline
    res = cli("compare", "continuous", "--dry-run", "--only", "baseline")
    assert res.stdout.splitlines() == [
        "baseline (CleanRL-style), torch default threads: python benchmark/baseline_ppo_continuous.py --env-id "
        "HalfCheetah-v5 --total-timesteps 10240",
        "baseline (CleanRL-style), 1 torch thread: OMP_NUM_THREADS=1 python benchmark/baseline_ppo_continuous.py "
        "--env-id HalfCheetah-v5 --total-timesteps 10240",
    ]


def test_gpu_profile_rows():
    res = cli("table", "--profile", "gpu", "--force-cpu", "--dry-run")
    assert res.returncode == 0, res.stderr
    rows = res.stdout.splitlines()
    assert sum(r.startswith("AtariVectorEnv") for r in rows) == 4  # 16, 64, 128 envs, and 16 in async batches of 8
    assert sum(r.startswith("VecSnake") for r in rows) == 2 * 11  # 2^12 ... 2^22, dense and fused
    assert sum(r.startswith("VecSnake fused") for r in rows) == 11
    training = [r for r in rows if ": python " in r]
    assert len(training) == 5 + 5 + 9
    assert sum("--async-envs 8" in r for r in training) == 1
    assert all("--gpu false" in r for r in training)  # --force-cpu
    for flags in ("--compile --cudagraphs", "--amp", "--preset beast --subproc", "--preset fast", "--preset heavy"):
        assert any(flags in r for r in training), flags
    assert sum("--num-envs 4096" in r for r in training) == 3 and sum("--num-envs 65536" in r for r in training) == 3
    assert sum("--env-mode dense" in r for r in training) == 3
    res = cli("table", "--profile", "gpu", "--dry-run", "--only", "ppo_atari/eager")
    assert res.stdout.splitlines() == [
        "ppo_atari.py defaults (16 envs, Breakout), eager: python ppo_atari.py --env-id ALE/Breakout-v5 --gpu true "
        "--total-timesteps 51200 --no-progress-bar"
    ]


def test_gpu_targets_as_ratios():
    r = lambda label, sps, **kw: speed.Result(label, "", sps=sps, **kw)  # noqa: E731
    results = {
        "ceiling/atari/16": r("ceiling", 10_000.0),
        "ceiling/snake/4096": r("snake small", 2e8),
        "ceiling/snake/65536": r("snake big", 5e8),
        "ppo_atari/eager": r("eager", 4_000.0, peak_mib=100, estimated_mib=80),
        "ppo_atari/--compile --cudagraphs": r("cudagraphs", 8_000.0, peak_mib=500, estimated_mib=100),
        "dqn_snake_vec/4096/eager": r("dqn", 2e6, status="timed out after 240 s"),  # not ok: not counted
        "ceiling/atari-async/16": r("async ceiling", 12_000.0),
        "ppo_atari-async/fastest": r("async", 9_000.0),
    }
    text = "\n".join(speed.gpu_targets(results))
    assert "(cudagraphs): 8,000 SPS = 0.80x the 10,000 SPS target; 80% of the raw AtariVectorEnv ceiling" in text
    assert "1.17x LeanRL's published 6,809 SPS (pytorch-labs/LeanRL README" in text
    assert "- ppo_atari.py --async-envs 8 (async): 9,000 SPS = 75% of the same envs' async ceiling (12,000)" in text
    assert "VecSnake raw: best 500,000,000 env steps/s = 0.50x the 1e9 target (snake big)" in text
    assert "--preset beast: not measured" in text and "at 4096 games: not measured" in text
    assert "within 2x of the measured peak: 1 of 2 runs; outside: cudagraphs (5.00x)" in text


def test_gpu_profile_on_cpu_tiny(tmp_path):
    """The GPU table forced onto the CPU with tiny budgets: ceilings, one training row, the targets section."""
    res = cli(
        "table",
        "--profile",
        "gpu",
        "--force-cpu",
        "--only",
        "ceiling",
        "dqn_snake_vec/256/eager",
        "--atari-envs",
        "2",
        "--snake-sizes",
        "64",
        "128",
        "--seconds",
        "0.2",
        "--scale",
        "0.25",
        "--budget-minutes",
        "0",
        "--out",
        tmp_path,
        "--note",
        "test",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    (report,) = tmp_path.glob("throughput_gpu_*.md")
    text = report.read_text()
    assert "- note: test; --force-cpu: the GPU rows ran on the CPU" in text
    assert (
        "| ceiling: AtariVectorEnv Breakout, 2 envs, " in text and "| ceiling: VecSnake 10x10, 128 games, cpu" in text
    )
    row = [line for line in text.splitlines() if line.startswith("| dqn_snake_vec.py defaults (256 games), eager")]
    assert len(row) == 1 and row[0].endswith("| ok |") and " SPS |" in row[0]
    assert "## Targets (GPU issue)" in text and "x the 1e9 target (ceiling: VecSnake 10x10, " in text
    assert "- ppo_atari.py >= 10,000 SPS: not measured" in text


def test_ceiling_mode_steps_every_kind_of_env(tmp_path):
    """`ceiling` runs (its --mode option once overwrote the subcommand's name) for Atari, Snake and MuJoCo, in and
    out of process, and writes its table."""
    args = ["--atari-envs", 2, "--threads", 1, "--snake-sizes", 64, "--mujoco-envs", 2, "--seconds", 0.3]
    res = cli("ceiling", *args, "--out", tmp_path, "--host", "t", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    for row in ["AtariVectorEnv Breakout, 2 envs", "VecSnake 10x10, 64 games, cpu, dense", "HalfCheetah-v5, 2 envs"]:
        assert row in res.stdout
    assert "SyncVectorEnv" in res.stdout and "AsyncVectorEnv (subprocesses)" in res.stdout
    assert "failed" not in res.stdout
    assert len(list(tmp_path.glob("ceiling_t_*.md"))) == 1


def test_concurrency_by_hand_tiny(tmp_path):
    """Started by hand: the copies get no thread variable (the cli sets OMP_NUM_THREADS=1) and share the CPUs
    themselves, so one run alone logs every allowed CPU as its threads."""
    args = ["--by-hand", "--scripts", "ppo_atari", "--copies", "2", "--scale", "0.1", "--out", tmp_path]
    res = cli("concurrency", *args, timeout=400)  # a run alone takes every core: slow on a loaded machine
    assert res.returncode == 0, res.stdout + res.stderr
    (report,) = tmp_path.glob("concurrency_by_hand_*.md")
    text = report.read_text()
    assert "started by hand: no pinning, no thread variables" in text
    header = next(line for line in text.splitlines() if line.startswith("| script"))
    columns = [h.strip() for h in header.split("|")[1:-1]]
    assert columns[:6] == ["script", "copies", "cores per copy", "per-copy SPS", "total SPS", "x one alone"]
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| ppo_atari.py")]
    assert [r[1].strip() for r in rows] == ["1", "2"]
    one, two = rows
    assert one[2].strip() == f"by hand; last threads/torch {gpu_utils.available_cpus()}" and one[5].strip() == "1.00x"
    assert len(two[2].split(" / ")) == 2 and two[5].strip().endswith("x")


def test_ab_interleaves_old_and_new_code(tmp_path):
    """`ab` runs each row with the old scripts (a folder) and the new, alternating which goes first, and reads each
    run's SPS: the old copy here logs a fixed charts/SPS, so its median and the ratio are known exactly."""
    before = tmp_path / "before"
    before.mkdir()
    for name in speed.AB_SCRIPTS:
        shutil.copy(os.path.join(ROOT, name), before / name)
    script = before / "ppo_continuous.py"
    source = script.read_text()
    assert source.count('scalars["charts/SPS"] = sps') == 1
    script.write_text(source.replace('scalars["charts/SPS"] = sps', 'scalars["charts/SPS"] = 1234.0'))
    (before / "REF").write_text("abc1234\n")
    only = ["--only", "ppo_continuous/defaults", "--rounds", "2", "--scale", "0.3"]
    res = cli("ab", "--before", before, "--profile", "cpu", *only, "--out", tmp_path, "--note", "test", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    started = [line for line in res.stdout.splitlines() if line.startswith("[speed] round")]
    assert [line.split(":")[0] for line in started] == [
        "[speed] round 1/2, before",
        "[speed] round 1/2, after",
        "[speed] round 2/2, after",
        "[speed] round 2/2, before",
    ]
    (report,) = tmp_path.glob("ab_cpu_*.md")
    text = report.read_text()
    assert f"Before: folder {before} (commit abc1234). After: this checkout. 2 round(s)" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| ppo_continuous.py defaults |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "1,234 (1,234, 1,234)"
    after = float(cells[3].split(" (")[0].replace(",", ""))  # the new code's real SPS, shown rounded
    assert after > 0 and abs(float(cells[4].strip("*x")) - after / 1234) <= 0.01


def test_ab_bad_before_and_git_commit(tmp_path):
    res = cli("ab", "--before", tmp_path, "--dry-run")
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "no ppo_atari.py, ppo_continuous.py, dqn_snake_vec.py, gpu_utils.py there" in res.stderr
    res = cli("ab", "--before", "no-such-commit-or-folder", "--dry-run")
    assert res.returncode == 2 and "neither a folder nor a commit of this repository" in res.stderr
    if subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("no git history here")
    res = cli("ab", "--before", "HEAD", "--profile", "gpu", "--force-cpu", "--dry-run")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "ppo_atari.py defaults (16 envs, Breakout), --compile --cudagraphs:"
    assert lines[1].startswith("  before: python /") and "/speed_before_" in lines[1]
    assert lines[2].startswith("  after:  python ppo_atari.py --env-id ALE/Breakout-v5 --gpu false --compile")
    folder = lines[1].split("python ")[1].split("/ppo_atari.py")[0]
    assert not os.path.exists(folder)  # the copied commit is removed when the tool ends
