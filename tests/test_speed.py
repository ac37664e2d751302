"""Tests for benchmark/speed.py: the SPS reader, the launcher, the tables, each mode's rows, one real tiny run of each
script and baseline, and fake runs (a few lines that write an event file) where a test is about the tool rather than
a script. The modes run in this process. Nothing here is timed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FAKE_RUN

torch = pytest.importorskip("torch")
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmark")
sys.path.insert(0, BENCH)
import speed  # noqa: E402

sys.path.remove(BENCH)

# the smallest settings that still log SPS (two iterations or log windows): (steps per iteration, arguments)
TINY = {
    "ppo_atari.py": (8, "--env-id ALE/Pong-v5 --num-envs 1 --num-steps 8 --minibatch-size 8 --update-epochs 1"),
    "ppo_continuous.py": (80, "--num-steps 64 --num-minibatches 2 --update-epochs 1"),  # asks 160 steps, makes 128
    "dqn_snake_vec.py": (64, "--num-envs 16 --learning-starts 32 --log-every 64 --batch-size 16"),
    "benchmark/baseline_ppo.py": (32, "--env-id ALE/Pong-v5 --num-envs 1 --num-steps 32 --update-epochs 1"),
    "benchmark/baseline_ppo.py ": (64, "--env-id HalfCheetah-v5 --num-steps 64 --num-minibatches 2 --update-epochs 1"),
}


def fake(tmp_path, *args: str) -> speed.Setting:
    script = tmp_path / "fake.py"
    script.write_text(FAKE_RUN)
    return speed.Setting([str(script), *args], 1, 2)


def cli(monkeypatch, capsys, *args):
    """speed.py's main in this process, as the command line would start it: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", [os.path.join(BENCH, "speed.py"), *map(str, args)])
    rc = speed.main()
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_read_metrics(tmp_path):
    """SPS: median of charts/SPS; GPU utilisation over the steps that have an SPS; memory: the last values."""
    w = SummaryWriter(str(tmp_path / "runs" / "run"))
    w.add_scalar("memory/estimated_mib", 100.0, 0)
    for step, util, peak in [(1, 0, 10), (2, 50, 90), (3, 70, 95), (4, 60, 80)]:
        w.add_scalar("gpu/util_mean", util, step)
        w.add_scalar("gpu/util_peak", peak, step)
    for step, sps, share in [(2, 100, 0.2), (3, 300, 0.4), (4, 200, 0.3)]:  # step 1 is the warm-up iteration: no SPS
        w.add_scalar("charts/SPS", sps, step)
        w.add_scalar("charts/update_share", share, step)
    w.add_scalar("memory/peak_allocated_mib", 150.0, 4)
    w.add_scalar("threads/torch", 3, 4)
    w.close()
    expected = {"steps": 4, "sps": 200, "util_mean": 60, "util_peak": 95, "peak_mib": 150, "estimated_mib": 100}
    expected["threads"] = 3
    assert speed.read_metrics(str(tmp_path / "runs")) == pytest.approx(expected | {"update_share": 0.3})
    w = SummaryWriter(str(tmp_path / "cpu"))
    w.add_scalar("charts/SPS", 5.0, 1)
    w.close()
    m = speed.read_metrics(str(tmp_path / "cpu"))
    assert m["sps"] == 5 and m["util_mean"] is None and m["peak_mib"] is None and m["update_share"] is None


def test_tables_show_failures_as_failures_and_rates_against_a_baseline():
    kw = {"steps": 1000, "wall": 2.0, "cpu_s": 3.0, "util_mean": 50, "util_peak": 90, "peak_mib": 300}
    ok = speed.Result("python a.py", sps=1234.4, estimated_mib=200, **kw)
    bad = speed.Result("python b.py", "failed (exit 2)", steps=100, wall=1.0, cpu_s=0.05, tail="boom")
    late = speed.Result("python c.py", "timed out after 5 s", sps=999.0, steps=100, wall=5.0, cpu_s=0.022)
    lines = speed.results_table([ok, bad, late])
    assert lines[2] == "| `python a.py` | 1,000 | 2 | 1,234 SPS | 3.00 | 50% / 90% | 300 / 200 | ok |"
    assert lines[3].endswith("| - | - | - | - | failed (exit 2) |")  # no CPU cost of steps it did not make
    assert lines[4].endswith("| - | - | - | - | timed out after 5 s |") and "999" not in lines[4]  # never a number
    assert "\n".join(speed.failures([ok, bad, late])).count("the end of its output") == 1
    assert "boom" in speed.failures([bad])
    assert "| 1,234 SPS (2.00x) |" in speed.results_table([ok], base=617.2)[2]
    # a column for the update's share only where a run logged one; a failed run's is not shown
    shared = speed.results_table([speed.Result("python d.py", sps=10.0, update_share=0.42, **kw), bad])
    assert "| update share |" in shared[0] and "| 42% |" in shared[2]
    assert shared[3].endswith("| - | - | - | - | - | failed (exit 2) |")


def test_runs_at_once_ok_failed_and_timed_out(tmp_path):
    """Each run in a folder of its own: a fake run's SPS comes back with the line its failed graph capture printed;
    a failed run shows its exit code and last words, a run past its time is stopped and shows as timed out."""
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    runs = [fake(tmp_path, "1234"), fake(tmp_path, "5", "3"), speed.Setting([str(sleeper)], 1, 2)]
    ok, failed, late = speed.run_settings(runs, 1.0, timeout=5)
    assert ok.ok and ok.sps == 1234.0 and ok.cpu_s is None  # runs at once: no CPU time each
    assert ok.steps == 3  # the last step it logged, not the 2 asked
    assert ok.warning == "update: eager (CUDA graph capture failed: RuntimeError: boom)"
    row = speed.results_table([ok])[2]
    assert row.endswith("| 1,234 SPS | - | - | - | ok; update: eager (CUDA graph capture failed: RuntimeError: boom) |")
    assert failed.status == "failed (exit 3)" and failed.sps is None and "last words, exit 3" in failed.tail
    assert late.status == "timed out after 5 s" and late.sps is None and late.wall < 40


def test_thread_variables_by_hand_pinned_and_by_default(tmp_path):
    """By default a run is told this tool's thread budget; pinned, its CPUs'; by hand, no thread variable at all."""
    (alone,) = speed.run_settings([fake(tmp_path, "1")], 1.0, 60)
    (pinned,) = speed.run_settings([fake(tmp_path, "1")], 1.0, 60, cpus=[[speed.gpu_utils.allowed_cpus()[0]]])
    (by_hand,) = speed.run_settings([fake(tmp_path, "1")], 1.0, 60, by_hand=True)
    assert alone.threads == speed.gpu_utils.thread_budget().threads and alone.cpu_s > 0
    assert pinned.threads == 1 and by_hand.threads == 0


def test_tiny_run_of_each_script_and_baseline():
    """Each script and both baselines run through the tool at once, and their SPS comes back from their event files."""
    settings = [speed.Setting([script.strip(), *args.split()], batch, 2) for script, (batch, args) in TINY.items()]
    for setting, res in zip(settings, speed.run_settings(settings, 1.0, timeout=300)):
        assert res.ok and res.sps > 0, (setting.shown(1.0), res.status, res.tail)
        assert res.steps == (128 if setting.args[0] == "ppo_continuous.py" else setting.steps(1.0))  # done, not asked
        assert res.util_mean is None and res.peak_mib is None  # CPU runs log no GPU figures


def test_baseline_without_stable_baselines3_says_what_to_install(tmp_path):
    """CleanRL's Atari wrappers come from stable-baselines3, as in CleanRL: without it, a line says what to install."""
    argv = ["baseline_ppo.py", "--total-timesteps", "0"]  # were it to start anyway, it would end at once
    hide = f"import runpy, sys; sys.modules['stable_baselines3'] = None; sys.argv = {argv!r}; "
    code = hide + f"runpy.run_path({os.path.join(BENCH, 'baseline_ppo.py')!r}, run_name='__main__')"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("error: ") and "pip install -e '.[baseline]'" in res.stderr


def test_baseline_refuses_an_unknown_env_id_in_one_line(tmp_path):
    argv = [sys.executable, os.path.join(BENCH, "baseline_ppo.py"), "--env-id", "Nope-v0"]
    res = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path)
    assert (
        res.returncode == 2
        and res.stderr == "error: unknown env id 'Nope-v0'; use an ALE/<Game>-v5 id or a MuJoCo one\n"
    )
    assert not (tmp_path / "runs").exists()


def test_bad_input_one_line_errors(monkeypatch, capsys):
    for args, words in [
        (["table", "--scale", "0"], "--scale: must be a number of at least 0.01"),
        (["run", "nosuch.py", "--steps", "5"], "not found"),
        (["compare", "bogus"], "invalid choice"),
        (["table", "--", "--x"], "for `run` only"),
        (["table", "--budget-minutes", "-1"], "--budget-minutes: must be a number of at least 0"),
        (["nope"], "invalid choice"),
    ]:
        rc, _, err = cli(monkeypatch, capsys, *args)
        assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and words in err, err


def test_compare_rows_are_matched(monkeypatch, capsys):
    """Ours at the baseline's batch, minibatch and epochs: the same steps for every row."""
    rc, out, _ = cli(monkeypatch, capsys, "compare", "atari", "--dry-run", "--iterations", "3")
    assert rc == 0
    base, cleanrl, defaults, *flags = out.splitlines()
    assert base == "python benchmark/baseline_ppo.py --env-id ALE/Breakout-v5 --total-timesteps 3072"
    assert cleanrl.endswith("--num-envs 8 --num-minibatches 4 --total-timesteps 3072 --no-progress-bar")  # 8 x 128 x 3
    assert defaults.endswith("--env-id ALE/Breakout-v5 --total-timesteps 6144 --no-progress-bar")
    assert [f.split("--num-minibatches 4 ")[1] for f in flags] == [
        "--compile --total-timesteps 3072 --no-progress-bar",
        "--amp --total-timesteps 3072 --no-progress-bar",
    ]
    rc, out, _ = cli(monkeypatch, capsys, "compare", "continuous", "--dry-run", "--only", "baseline")
    assert out.splitlines() == [
        "python benchmark/baseline_ppo.py --env-id HalfCheetah-v5 --total-timesteps 10240",
        "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmark/baseline_ppo.py --env-id HalfCheetah-v5 "
        "--total-timesteps 10240",
    ]


def test_gpu_profile_rows(monkeypatch, capsys):
    rc, out, _ = cli(monkeypatch, capsys, "table", "--profile", "gpu", "--dry-run")
    rows = out.splitlines()
    assert rc == 0 and sum("AtariVectorEnv" in r for r in rows) == 3  # 16, 64, 128 envs
    assert sum("VecSnake" in r for r in rows) == 6  # 2^12 ... 2^22, every other power; sparse on this CPU
    training = [r for r in rows if r.startswith("python ")]
    assert len(training) == 4 + 5 + 9 and all("--gpu true" in r for r in training)
    for flags in ("--compile --cudagraphs", "--amp", "--preset beast --subproc", "--preset heavy"):
        assert any(flags in r for r in training), flags
    assert sum("--num-envs 4096" in r for r in training) == 3 and sum("--env-mode dense" in r for r in training) == 3
    assert training[0].startswith("python ppo_atari.py --env-id ALE/Breakout-v5 --gpu true --compile")
    assert training[0].endswith("--total-timesteps 51200 --no-progress-bar")  # 25 iterations of 16 x 128
    assert [r for r in rows if "MJX" in r] == ["ceiling: MJX HalfCheetah-v5, 4,096 worlds, cpu, impl=jax: 2 s"]


def test_mjx_ceiling_is_skipped_with_its_reason_without_jax(monkeypatch):
    """Without the mjx extra the MJX row says what to install and the table goes on; the other rows run."""
    monkeypatch.setitem(sys.modules, "jax", None)  # as if jax were not installed
    res = speed.ceiling(*speed.mjx_row(0.1, 4, "cpu"))
    assert res.status.startswith("skipped: MJX envs need jax") and "pip install" in res.status and res.sps is None
    assert speed.results_table([res])[2].endswith(f"| - | - | - | {res.status} |")


@pytest.mark.slow
def test_mjx_ceiling_steps_the_worlds():
    """The worlds of ppo_continuous.py --sim mjx stepped alone on JAX's CPU device (the first step compiles)."""
    pytest.importorskip("jax")
    res = speed.ceiling(*speed.mjx_row(0.2, 4, "cpu", "InvertedPendulum-v5"))
    assert res.ok and res.sps > 0 and res.unit == "env steps/s", res.status
    assert res.what == "ceiling: MJX InvertedPendulum-v5, 4 worlds, cpu, impl=jax"


def test_table_of_ceilings_and_a_training_run(monkeypatch, capsys, tmp_path):
    """The CPU table through to its file: Atari, Snake and MuJoCo (in and out of process) stepped alone and one real
    training run, the machine and the command above them."""
    only = ["--only", "ceiling", "HalfCheetah-v5 --total"]  # the ceilings and ppo_continuous.py's defaults
    sizes = ["--atari-envs", 2, "--snake-sizes", 64, "--mujoco-envs", 1, "--seconds", 0.2, "--scale", 0.1]
    rc, out, _ = cli(monkeypatch, capsys, "table", "--profile", "cpu", *only, *sizes, "--out", tmp_path, "--note", "t")
    assert rc == 0, out
    (report,) = tmp_path.glob("throughput_cpu_*.md")
    text = report.read_text()
    assert "- command: `python benchmark/speed.py table --profile cpu --only ceiling" in text and "- note: t" in text
    assert "- CPU: " in text and "- load average at end" in text
    for what in ["AtariVectorEnv Breakout, 2 envs", "VecSnake 10x10, 64 games, cpu, sparse", "HalfCheetah-v5, 1 envs"]:
        assert f"| ceiling: {what}" in text, what
    assert "HalfCheetah-v5, 1 envs, AsyncVectorEnv (subprocesses)" in text and "failed" not in text
    (row,) = [line for line in text.splitlines() if line.startswith("| `python ppo_continuous.py")]
    assert "--total-timesteps 4096 " in row and " SPS | " in row and row.endswith("| ok |")


def test_run_mode_writes_its_table(monkeypatch, capsys, tmp_path):
    script = fake(tmp_path).args[0]
    rc, out, _ = cli(monkeypatch, capsys, "run", script, "--steps", 100, "--out", tmp_path, "--", "7", "3")
    assert rc == 1
    (report,) = tmp_path.glob("run_*.md")
    text = report.read_text()
    assert f"- command: `python benchmark/speed.py run {script} --steps 100" in text
    assert "--total-timesteps 100` | 100 |" in text and "| failed (exit 3)" in text and "last words, exit 3" in text


def test_a_table_is_written_where_the_user_stands(tmp_path):
    """Issue #54: from a folder outside the checkout, `speed.py table` wrote its file into the checkout's
    benchmark/results/. Now it writes into the folder it is started from (--out picks another) and says so first."""
    cmd = [sys.executable, os.path.join(BENCH, "speed.py"), "table", "--profile", "cpu", "--only", "no-such-row"]
    res = subprocess.run([*cmd, "--host", "where54"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[0] == f"[speed] table: its file goes to {tmp_path}", res.stdout
    (written,) = tmp_path.glob("throughput_cpu_where54_*.md")
    assert f"wrote {written}" in res.stdout
    assert not list(Path(BENCH, "results").glob("throughput_cpu_where54_*.md"))
