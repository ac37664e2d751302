"""Tests for benchmark/report.py on synthetic TensorBoard runs and checkpoints, and for the reference scores file."""

import contextlib
import csv
import gzip
import io
import math
import os
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import save_checkpoint_with_code

torch = pytest.importorskip("torch")
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmark")
sys.path.insert(0, BENCH)
import random_scores  # noqa: E402
import report as rep  # noqa: E402

sys.path.remove(BENCH)


def write_run(root, name, returns=(), return_steps=None, sps=(), sps_steps=None, total=None, t0=1000.0, dt=1.0):
    """Write one synthetic run; returns at steps return_steps (default 100, 200, ...), wall times t0 + k * dt."""
    w = SummaryWriter(os.path.join(root, name))
    if total is not None:
        w.add_text("hyperparameters", f"|param|value|\n|-|-|\n|total_timesteps|{total}|\n|seed|1|")
    k = 0
    return_steps = return_steps or [100 * (i + 1) for i in range(len(returns))]
    for step, value in zip(return_steps, returns):
        w.add_scalar("charts/episodic_return", value, step, walltime=t0 + k * dt)
        k += 1
    sps_steps = sps_steps or [1000 * (i + 1) for i in range(len(sps))]
    for step, value in zip(sps_steps, sps):
        w.add_scalar("charts/SPS", value, step, walltime=t0 + k * dt)
        k += 1
    w.close()


def write_checkpoint(run_dir, status, global_step, total):
    """The checkpoint contract of the scripts: status, global_step, iteration, args (with total_timesteps)."""
    state = {"model": {}, "status": status, "global_step": global_step, "iteration": global_step // 100}
    state["args"] = {"total_timesteps": total, "num_envs": 1}
    torch.save(state, os.path.join(run_dir, "checkpoint.pt"))


def run_report(*args):
    """report.py's main in this process: (returncode, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        returncode = rep.main(list(map(str, args)))
    return SimpleNamespace(returncode=returncode, stdout=out.getvalue(), stderr=err.getvalue())


def table_row(text, *cells):
    rows = [line for line in text.splitlines() if all(f"| {c} |" in line for c in cells)]
    assert len(rows) == 1, (cells, text)
    return [c.strip() for c in rows[0].strip().strip("|").split("|")]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    runs = tmp / "runs"
    # Two finished Breakout seeds: 150 episodes each, last-100 means 99.5 and 109.5 -> 104.5 +- 7.1 (ddof=1).
    write_run(
        runs,
        "ALE_Breakout-v5__ppo_atari__1__1700000000",
        returns=list(range(150)),
        sps=[100, 200, 900],
        sps_steps=[5000, 10000, 15000],
        total=15000,
        dt=1.0,
    )
    write_run(
        runs,
        "ALE_Breakout-v5__ppo_atari__2__1700000001",
        returns=[i + 10 for i in range(150)],
        sps=[300, 300, 300],
        sps_steps=[5000, 10000, 15000],
        total=15000,
        dt=1.0,
    )
    # A run in progress: 5,000 of 100,000 steps, events written in the last minute, 30 episodes.
    now = time.time()
    write_run(
        runs,
        "ALE_Pong-v5__ppo_atari__1__1700000002",
        returns=[-21.0] * 10 + [-20.0] * 20,
        sps=[50],
        sps_steps=[5000],
        total=100000,
        t0=now - 60,
        dt=1.0,
    )
    # A run with no finished episode yet (only SPS logged).
    write_run(
        runs,
        "HalfCheetah-v5__ppo_continuous_heavy__1__1700000003",
        sps=[1234, 1234],
        sps_steps=[8192, 16384],
        total=1000000,
        t0=now - 30,
    )
    # Not a run directory name: skipped.
    write_run(runs, "scratch", returns=[1.0])
    refs = tmp / "refs.csv"
    refs.write_text(
        "env,score,source,their_env,protocol\n"
        "ALE/Breakout-v5,274.8,test paper,BreakoutNoFrameskip-v4,v4 protocol\n"
        "ALE/Breakout-v5,326.5,test lab,,v5 protocol\n"
        "HalfCheetah-v5,1442.6,test cleanrl,HalfCheetah-v4,\n"
    )
    out = tmp / "out"
    res = run_report(runs, "--out", out, "--refs", refs)
    assert res.returncode == 0, res.stderr
    return res, out


def test_report_group_numbers(report):
    res, out = report
    text = (out / "report.md").read_text()
    assert text.count("| ppo_atari | ALE_Breakout-v5 |") == 1
    row = table_row(text, "ppo_atari", "ALE_Breakout-v5")
    # script, env, seeds, return, steps, wall, SPS, device, reference, status
    assert row[2] == "2"
    assert row[3] == "104.5 ± 7.1"
    assert row[4] == "15,000 of 15,000"
    assert row[5] == "2m32s"  # 150 returns + 3 SPS events one second apart: 152 s
    assert row[6] == "250"  # mean over seeds of the median SPS (200 and 300)
    assert row[7] == "not logged"  # no "device" text and no GPU samples in these event files
    assert row[8] == "326.5 (test lab); 274.8 (test paper, BreakoutNoFrameskip-v4)"  # the comparable one first
    assert row[-1] == "done"  # the last column (the CI column sits before it)
    assert res.stdout.splitlines()[1].startswith("| script")  # below the line naming the folders


def test_report_in_progress_and_no_episodes(report):
    _, out = report
    text = (out / "report.md").read_text()
    pong = table_row(text, "ppo_atari", "ALE_Pong-v5")
    assert pong[3] == f"{(-21 * 10 - 20 * 20) / 30:,.1f}"  # fewer than 100 episodes: mean of all 30
    assert pong[4] == "5,000 of 100,000"
    assert pong[-1] == "running (5%)"
    assert pong[8] == "-"
    cheetah = table_row(text, "ppo_continuous_heavy", "HalfCheetah-v5")
    assert cheetah[3].startswith("- (0/1 runs")
    assert cheetah[4] == "16,384 of 1,000,000"
    assert cheetah[6] == "1,234"
    assert cheetah[8] == "1442.6 (test cleanrl, HalfCheetah-v4)"
    per_run = table_row(text, "HalfCheetah-v5__ppo_continuous_heavy__1__1700000003")
    assert per_run[1] == "0" and per_run[2] == "-"
    seed2 = table_row(text, "ALE_Breakout-v5__ppo_atari__2__1700000001")
    # one seed's last 100 returns, 60..159: std 29.01 (ddof=1), so a standard error of 2.9 beside the mean
    assert seed2[2] == "109.5 ± 2.9"
    assert "scratch" in text.split("Skipped")[1]


def test_report_references_side_by_side(report):
    """Each env's references in one section: the env each was measured on (ours or not) and the protocol."""
    _, out = report
    refs = (out / "report.md").read_text().split("## References")[1].split("## Learning curves")[0]
    assert table_row(refs, "ALE_Breakout-v5", "274.8")[2:] == [
        "test paper",
        "BreakoutNoFrameskip-v4 (not ours)",
        "v4 protocol",
    ]
    assert table_row(refs, "ALE_Breakout-v5", "326.5")[2:] == ["test lab", "same as ours", "v5 protocol"]
    assert table_row(refs, "HalfCheetah-v5", "1442.6")[3:] == ["HalfCheetah-v4 (not ours)", "-"]
    assert "ALE_Pong-v5" not in refs  # no reference for Pong in this file


def test_report_curves(report):
    _, out = report
    assert (out / "curve_ALE_Breakout-v5.png").stat().st_size > 1000
    assert (out / "curve_ALE_Pong-v5.png").stat().st_size > 1000
    assert not (out / "curve_HalfCheetah-v5.png").exists()  # no episodes: no curve, a note instead
    assert "HalfCheetah-v5: no episodes yet" in (out / "report.md").read_text()


def test_report_errors(tmp_path):
    res = run_report(tmp_path / "nope", "--out", tmp_path / "o")
    assert res.returncode == 2
    assert res.stderr.startswith("error: runs directory") and res.stderr.count("\n") == 1
    (tmp_path / "empty").mkdir()
    res = run_report(tmp_path / "empty", "--out", tmp_path / "o")
    assert res.returncode == 2 and res.stderr.startswith("error: no run folders")


def test_report_refuses_a_references_file_it_cannot_use(tmp_path):
    """Before: a mistyped --refs (or a CSV without the columns) gave a report that said 'No published reference'."""
    runs = tmp_path / "runs"
    write_run(runs, "Hopper-v5__ppo_continuous__1__1700000000", returns=[1.0], return_steps=[100], t0=time.time())
    (tmp_path / "other.csv").write_text("game,points\nHopper-v5,3000\n")
    for refs, words in [
        (tmp_path / "typo.csv", "no such file"),
        (tmp_path / "other.csv", "no env, score, source column"),
    ]:
        res = run_report(runs, "--out", tmp_path / "o", "--refs", refs)
        assert res.returncode == 2 and res.stderr.startswith(f"error: --refs '{refs}': {words}"), res.stderr
        assert res.stderr.count("\n") == 1 and not (tmp_path / "o").exists()
    res = run_report(runs, "--out", tmp_path / "o", "--refs", "", "--no-plots")  # none, on purpose
    assert res.returncode == 0, res.stderr
    assert "No published reference" in (tmp_path / "o" / "report.md").read_text()


def test_report_curve_interpolation():
    import numpy as np

    a = rep.Run("a", "a", "E", "x", 1, steps=np.array([0.0, 100.0]), returns=np.array([0.0, 10.0]), counts=np.ones(2))
    b = rep.Run("b", "b", "E", "x", 2, steps=np.array([0.0, 50.0]), returns=np.array([2.0, 2.0]), counts=np.ones(2))
    ys = rep.curve_on_grid([a, b], np.array([0.0, 50.0, 100.0]), smooth=1)
    assert np.allclose(ys[0], [0, 5, 10])
    assert np.allclose(ys[1, :2], [2, 2]) and np.isnan(ys[1, 2])  # b has not reached step 100


def test_report_done_at_last_whole_iteration(tmp_path):
    """10,000 steps in iterations of 4 x 1,024: a finished run stops at 8,192 and is 'done', not 'stale (81%)'."""
    for seed, last in ((1, 8192), (2, 4096)):
        w = SummaryWriter(str(tmp_path / "runs" / f"HalfCheetah-v5__ppo_continuous__{seed}__1700000000"))
        w.add_text("hyperparameters", "|param|value|\n|-|-|\n|total_timesteps|10000|\n|num_envs|4|\n|num_steps|1024|")
        for step in range(1024, last + 1, 1024):
            w.add_scalar("charts/episodic_return", 1.0, step, walltime=1000.0 + step)
        w.close()
    res = run_report(tmp_path / "runs", "--out", tmp_path / "out")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "out" / "report.md").read_text()
    assert table_row(text, "HalfCheetah-v5__ppo_continuous__1__1700000000")[-1] == "done"
    # no checkpoint and no event for a long time: not "running", and not "stopped" (nothing says a signal did it)
    assert table_row(text, "HalfCheetah-v5__ppo_continuous__2__1700000000")[-1].startswith("stale at 40%: no event for")


def test_report_status_from_checkpoints(tmp_path):
    """The checkpoint's status wins over the event files: stopped, finished, diverged, running (recent or stale)."""
    runs, now = tmp_path / "runs", time.time()
    cases = {  # name: (checkpoint status, its global_step, events' last step, events' age in s)
        "ALE_Pong-v5__ppo_atari__1__1700000000": ("stopped", 4000, 4000, 5),
        "ALE_Pong-v5__ppo_atari__2__1700000000": ("finished", 9900, 9900, 5),  # finished below the total: still done
        "ALE_Pong-v5__ppo_atari__3__1700000000": ("running", 2000, 2000, 5),
        "ALE_Pong-v5__ppo_atari__4__1700000000": ("running", 3000, 3100, 7200),  # crashed: the checkpoint never knew
        "ALE_Pong-v5__ppo_atari__5__1700000000": ("running", 10000, 10000, 7200),  # crashed after the last iteration
        "ALE_Pong-v5__ppo_atari__6__1700000000": ("diverged", 5000, 6000, 7200),  # not "stale": it will not go on
    }
    for name, (status, ckpt_step, last_step, age) in cases.items():
        write_run(runs, name, returns=[1.0], return_steps=[last_step], t0=now - age)
        write_checkpoint(runs / name, status, ckpt_step, 10000)
    res = run_report(runs, "--out", tmp_path / "out", "--no-plots")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "out" / "report.md").read_text()
    status = {name: table_row(text, name)[-1] for name in cases}
    ckpt = os.path.join(str(runs), "ALE_Pong-v5__ppo_atari__1__1700000000", "checkpoint.pt")
    assert status["ALE_Pong-v5__ppo_atari__1__1700000000"] == f"stopped at 40% (resume with --resume {ckpt})"
    assert status["ALE_Pong-v5__ppo_atari__2__1700000000"] == "done"
    assert status["ALE_Pong-v5__ppo_atari__3__1700000000"] == "running (20%)"
    stale = status["ALE_Pong-v5__ppo_atari__4__1700000000"]
    assert stale.startswith("stale at 31%: no event for 2h00m (crashed or killed?; resume with --resume ")
    assert status["ALE_Pong-v5__ppo_atari__5__1700000000"].startswith("stale at 100%")
    diverged = "diverged at 60% (NaN or infinite weights; its checkpoint keeps step 5,000)"
    assert status["ALE_Pong-v5__ppo_atari__6__1700000000"] == diverged
    group = table_row(text, "ppo_atari", "ALE_Pong-v5")[-1]  # the group table: short forms
    assert group == "diverged (60%), done, running (20%), stale (100%), stale (31%), stopped (40%)"


def test_report_never_runs_code_in_a_checkpoint(tmp_path):
    """A checkpoint.pt whose pickle would run code (make a folder) is read as data only: the report warns in one
    line, takes the status from the event files, and the code never runs."""
    name = "ALE_Pong-v5__ppo_atari__1__1700000000"
    runs = tmp_path / "runs"
    write_run(runs, name, returns=[1.0], return_steps=[2000], total=10000, t0=time.time() - 5)
    marker = tmp_path / "the_payload_ran"
    save_checkpoint_with_code(runs / name / "checkpoint.pt", marker, status="finished", global_step=10000)
    res = run_report(runs, "--out", tmp_path / "out", "--no-plots")
    assert res.returncode == 0, res.stderr
    assert not marker.exists()
    (warning,) = [line for line in res.stderr.splitlines() if "checkpoint" in line]
    assert warning.startswith("warning: ") and "holds more than data" in warning and "status from the event" in warning
    assert table_row((tmp_path / "out" / "report.md").read_text(), name)[-1] == "running (20%)"


def test_report_stale_runs_without_a_usable_checkpoint_or_events(tmp_path):
    """A stale run whose checkpoint cannot be read is not told to resume from it; a run that died before its first
    scalar (its event file holds the hyperparameters only) is stale since its file was written, not since 1970."""
    runs, hours_ago = tmp_path / "runs", time.time() - 7200
    write_run(
        runs, "ALE_Pong-v5__ppo_atari__1__1700000000", returns=[1.0], return_steps=[2000], total=10000, t0=hours_ago
    )
    (runs / "ALE_Pong-v5__ppo_atari__1__1700000000" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    write_run(runs, "ALE_Pong-v5__ppo_atari__2__1700000000", total=10000)
    for f in (runs / "ALE_Pong-v5__ppo_atari__2__1700000000").iterdir():
        os.utime(f, (hours_ago, hours_ago))
    res = run_report(runs, "--out", tmp_path / "out", "--no-plots")
    assert res.returncode == 0, res.stderr
    first = table_row(res.stdout, "ALE_Pong-v5__ppo_atari__1__1700000000")[-1]
    assert first == "stale at 20%: no event for 2h00m (crashed or killed?)"
    second = table_row(res.stdout, "ALE_Pong-v5__ppo_atari__2__1700000000")[-1]
    assert second == "stale at 0%: no event for 2h00m (crashed or killed?)"  # its budget from its text


def test_report_shows_a_live_run_as_running(tmp_path):
    """A run whose process holds runs/<run>/.lock trains now, however long ago its last event was (a slow first
    iteration, a long evaluation) and whatever its last checkpoint says: "running", not "stale" or "stopped"; without
    the lock the same run is stale."""
    import run_utils

    name = "ALE_Pong-v5__ppo_atari__1__1700000000"
    runs = tmp_path / "runs"
    write_run(runs, name, returns=[1.0], return_steps=[2000], t0=time.time() - 7200)
    write_checkpoint(runs / name, "running", 2000, 10000)

    def report_while_live():  # the run's process holds runs/<run>/.lock meanwhile
        fd = run_utils.lock_run_dir(runs / name)
        try:
            return run_report(runs, "--out", tmp_path / "out", "--no-plots")
        finally:
            os.close(fd)

    res = report_while_live()
    assert res.returncode == 0, res.stderr
    assert table_row((tmp_path / "out" / "report.md").read_text(), name)[-1] == "running (20%)"
    res = run_report(runs, "--out", tmp_path / "out", "--no-plots")
    assert table_row((tmp_path / "out" / "report.md").read_text(), name)[-1].startswith("stale at 20%")
    # resumed from a stopped checkpoint, it trains again before its next checkpoint says so: running, not stopped
    write_checkpoint(runs / name, "stopped", 2000, 10000)
    res = report_while_live()
    assert table_row((tmp_path / "out" / "report.md").read_text(), name)[-1] == "running (20%)"


def write_segment(run_dir, start, returns, sps, t0, device=None, gpu_samples=False):
    """One process's event file, as the scripts write it: the memory estimate (and the device) at the step it started
    from, then returns and SPS as (step, value); an event's wall time is t0 plus a second per 10 steps from start."""
    w = SummaryWriter(str(run_dir))
    w.add_scalar("memory/estimated_mib", 160.0, start, walltime=t0)
    if device:
        w.add_text("device", device, start, walltime=t0)
    events = [("charts/episodic_return", step, v) for step, v in returns] + [("charts/SPS", step, v) for step, v in sps]
    events += [("gpu/util_mean", step, 90.0) for step, _ in sps] if gpu_samples else []
    for tag, step, value in sorted(events, key=lambda e: e[1]):
        w.add_scalar(tag, value, step, walltime=t0 + (step - start) / 10)
    w.close()


def test_report_joins_a_run_resumed_on_other_machines(tmp_path):
    """Three processes, one event file each: the first on a GPU that did not log its name, then a CPU that crashed
    300 steps after its last checkpoint, then the CPU again from that checkpoint, hours later. Figures come from the
    kept steps only, the wall time leaves out the gaps, and SPS is given per device."""
    run_dir = tmp_path / "runs" / "ALE_Breakout-v5__ppo_atari__1__1700000000"
    cpu = "CPU Test Model, 2 cores"
    write_segment(
        run_dir, 0, [(100 * k, 1.0) for k in range(1, 11)], [(500, 1000.0), (1000, 1000.0)], 1000.0, gpu_samples=True
    )
    # crashed at 1,500; its checkpoint was at 1,200: the returns and SPS after 1,200 are lost (and worth 100 each)
    write_segment(
        run_dir,
        1000,
        [(1100, 100.0), (1200, 100.0), (1300, 100.0), (1400, 100.0), (1500, 100.0)],
        [(1100, 80.0), (1500, 100.0)],
        5000.0,
        device=cpu,
    )
    write_segment(run_dir, 1200, [(100 * k, 2.0) for k in range(13, 21)], [(2000, 50.0)], 20000.0, device=cpu)
    write_checkpoint(run_dir, "stopped", 2000, 4000)
    res = run_report(tmp_path / "runs", "--out", tmp_path / "out")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "out" / "report.md").read_text()
    row = table_row(text, "ppo_atari", "ALE_Breakout-v5")
    assert row[3] == f"{(10 * 1 + 2 * 100 + 8 * 2) / 20:.1f}"  # 20 kept games; the 3 lost ones are not counted
    assert row[4] == "2,000 of 4,000"
    assert row[5] == "3m20s"  # 100 s + 20 s kept + 80 s, not the hours between the processes
    assert row[6:8] == ["1,000 / 65", f"GPU (name not logged) / {cpu}"]  # median per device: CPU [80, 50]
    assert row[-1] == "stopped (50%)"
    per_run = table_row(text.split("## Segments")[0], run_dir.name)
    kept = "11.3 ± 6.8"  # the 20 kept games' mean and standard error (std 30.3 / sqrt(20))
    assert per_run[1:7] == ["20", kept, "2,000", "3m20s", "1,000 / 65", f"GPU (name not logged) / {cpu}"]
    segments = text.split("## Segments")[1].split("## References")[0]
    seg = [table_row(segments, run_dir.name, str(i)) for i in (1, 2, 3)]
    assert seg[0][2:] == ["GPU (name not logged)", "0–1,000", "1m40s", "1,000", "10", "-"]
    assert seg[1][2:] == [cpu, "1,000–1,200", "0m20s", "80", "2", "300"]
    assert seg[2][2:] == [cpu, "1,200–2,000", "1m20s", "50", "8", "-"]


def test_report_orders_segments_by_step_not_by_a_machines_clock(tmp_path):
    """A run crashed at step 1,000 after its checkpoint at 800 and was resumed on a machine whose clock is an hour
    behind: its events carry earlier wall times, yet it ran later. The resumed part (800 to 2,000) is kept and the
    first machine's 200 steps after the checkpoint are the lost ones, whatever the clocks say."""
    run_dir = tmp_path / "runs" / "ALE_Breakout-v5__ppo_atari__1__1700000000"
    write_segment(run_dir, 0, [(100 * k, 1.0) for k in range(1, 11)], [(1000, 100.0)], 10000.0, device="first")
    write_segment(run_dir, 800, [(100 * k, 2.0) for k in range(9, 21)], [(2000, 50.0)], 10000.0 - 3600, device="second")
    res = run_report(tmp_path / "runs", "--out", tmp_path / "out", "--no-plots")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "out" / "report.md").read_text()
    assert table_row(text, "ppo_atari", "ALE_Breakout-v5")[4] == "2,000"
    segments = text.split("## Segments")[1].split("## References")[0]
    assert table_row(segments, run_dir.name, "1")[2:4] == ["first", "0–800"]
    assert table_row(segments, run_dir.name, "1")[-1] == "200"  # logged after the checkpoint at 800: done again
    assert table_row(segments, run_dir.name, "2")[2:4] == ["second", "800–2,000"]


def test_report_training_statistics_per_tenth_of_the_budget(tmp_path):
    """A shortfall is read against the curve's shape and the losses: per run, the means of the return and of each
    logged statistic over each tenth of the budget (here 100 of 1,000 steps), up to where the run stands (450, an
    iteration of 50 short of its band's end), without the steps a crashed process logged after its last checkpoint."""
    run_dir = tmp_path / "runs" / "ALE_Pong-v5__ppo_atari__1__1700000000"
    first = SummaryWriter(str(run_dir))
    first.add_text("hyperparameters", "|param|value|\n|-|-|\n|total_timesteps|1000|\n|num_envs|5|\n|num_steps|10|")
    for step in range(50, 451, 50):  # crashes after 450; the next process resumes from the checkpoint at 300
        first.add_scalar("losses/entropy", step / 50, step, walltime=1000.0 + step)
    for step, score in [(30, 1.0), (90, 3.0), (120, 10.0), (420, -50.0)]:
        first.add_scalar("charts/episodic_return", score, step, walltime=1000.0 + step)
    first.close()
    second = SummaryWriter(str(run_dir))
    second.add_scalar("memory/estimated_mib", 160.0, 300, walltime=9000.0)  # logged at the step it resumed from
    for step in (350, 400, 450):
        second.add_scalar("losses/entropy", 100.0, step, walltime=9000.0 + step)
    second.close()
    res = run_report(tmp_path / "runs", "--out", tmp_path / "out", "--no-plots")
    assert res.returncode == 0, res.stderr
    section = (tmp_path / "out" / "report.md").read_text().split("## Training statistics")[1].split("## References")[0]
    assert "| steps | return | entropy |" in section  # only the statistics the run logged
    rows = [line for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert rows == [
        "| 0-100 | 2.0 | 1.5 |",
        "| 100-200 | 10.0 | 3.5 |",
        "| 200-300 | - | 5.5 |",  # the first process's up to the step the second resumed from
        "| 300-400 | - | 100 |",
        "| 400-450 | - | 100 |",  # the lost game at 420 and the lost entropies 7, 8, 9 are left out
    ]


def test_report_single_process_run_has_no_segments_section(report):
    text = (report[1] / "report.md").read_text()
    assert "## Segments" not in text


def test_reference_scores_file():
    """Published results only, each with its source, the env it was measured on, a protocol and an address."""
    with open(os.path.join(BENCH, "reference_scores.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["score"] and r["source"] and r["their_env"] and r["protocol"] for r in rows)
    assert all(r["url"].startswith("https://") for r in rows)
    assert not [r for r in rows if "target" in r["source"].lower() or "target" in r["protocol"].lower()]
    for r in rows:
        float(r["score"])
    slm = {r["env"]: float(r["score"]) for r in rows if r["source"].startswith("SLM-Lab")}
    assert slm["ALE/Breakout-v5"] == 326.47 and slm["ALE/Qbert-v5"] == 15460.48 and len(slm) == 8
    assert all(r["their_env"] == r["env"] for r in rows if r["source"].startswith("SLM-Lab"))  # the same v5 envs
    v4 = [r for r in rows if "NoFrameskip-v4" in r["their_env"]]
    assert v4 and all("no sticky actions" in r["protocol"] for r in v4)


def test_report_counts_a_restarted_seed_once(tmp_path):
    """A seed started again (its first folder stopped before any checkpoint) left two folders: they counted as two
    seeds in the group's mean, std and curve. Now the group takes the one that got furthest; the per-run table keeps
    both."""
    runs = tmp_path / "runs"
    write_run(runs, "Hopper-v5__ppo_continuous__1__1000", returns=[5.0] * 3)  # stopped early, then started again
    write_run(runs, "Hopper-v5__ppo_continuous__1__2000", returns=[100.0] * 20)
    write_run(runs, "Hopper-v5__ppo_continuous__2__1000", returns=[200.0] * 20)
    res = run_report(runs, "--out", tmp_path / "out", "--refs", "", "--last-n", 10, "--no-plots")
    assert res.returncode == 0, res.stderr
    row = table_row(res.stdout, "ppo_continuous", "Hopper-v5")
    assert row[2] == "2" and row[3] == "150.0 ± 70.7" and row[4] == "2,000", row
    assert "1 run folders repeat a seed of their group, which counts its furthest run" in res.stdout
    assert "| Hopper-v5__ppo_continuous__1__1000 |" in res.stdout  # still in the per-run table


def test_report_puts_each_budget_in_a_row_of_its_own(tmp_path):
    """Before: a 1,000-step and a 2,000-step run of one env shared a row, one mean over both, "steps 1,000–2,000".
    A folder of the same seed and budget that died before its first scalar still counts in its row's seed."""
    runs = tmp_path / "runs"
    write_run(runs, "Hopper-v5__ppo_continuous__1__1000", returns=[10.0] * 10, total=1000)
    write_run(runs, "Hopper-v5__ppo_continuous__2__1000", returns=[30.0] * 20, total=2000)
    write_run(runs, "Hopper-v5__ppo_continuous__2__900", total=2000)  # its hyperparameters text only
    res = run_report(runs, "--out", tmp_path / "out", "--refs", "", "--last-n", 10, "--no-plots")
    assert res.returncode == 0, res.stderr
    short, long = table_row(res.stdout, "Hopper-v5", "10.0"), table_row(res.stdout, "Hopper-v5", "30.0")
    assert short[3:5] == ["10.0", "1,000 of 1,000"] and long[3:5] == ["30.0", "2,000 of 2,000"]
    assert "1 run folders repeat a seed of their group" in res.stdout
    seeds = [rep.load_run(str(path)) for path in sorted(runs.iterdir())[:2]]
    assert {name: [r.seed for r in group] for name, group in rep.curve_groups(seeds).items()} == {
        "ppo_continuous, 1k steps": [1],
        "ppo_continuous, 2k steps": [2],
    }  # the curves too (before: one line, "ppo_continuous (2 seeds)")


def test_report_weighs_window_means_by_their_games(tmp_path):
    """dqn_snake_vec logs one mean over the games that ended in each log window, with their number (charts/episodes).
    Before, each window counted as one episode: the last 100 "episodes" of a run of 3 windows were all of them."""
    run_dir = tmp_path / "runs" / "Snake5x5__dqn_snake_vec__1__1700000000"
    w = SummaryWriter(str(run_dir))
    w.add_text("hyperparameters", "|param|value|\n|-|-|\n|total_timesteps|10000|")
    for step, mean, games in [(400, -1.0, 500), (800, 1.0, 200), (3000, 5.0, 20)]:
        w.add_scalar("charts/episodic_return", mean, step, walltime=1000.0 + step)
        w.add_scalar("charts/episodes", games, step, walltime=1000.0 + step)
        w.add_scalar("charts/epsilon", 0.1, step, walltime=1000.0 + step)
    w.close()
    res = run_report(tmp_path / "runs", "--out", tmp_path / "out", "--refs", "", "--last-n", 100, "--no-plots")
    assert res.returncode == 0, res.stderr
    mean = (20 * 5.0 + 80 * 1.0) / 100  # the last window's 20 games and 80 of the one before
    assert table_row(res.stdout, "dqn_snake_vec", "Snake5x5")[3] == f"{mean:.1f}"
    row = table_row(res.stdout, "Snake5x5__dqn_snake_vec__1__1700000000")
    assert row[1:3] == ["720", f"{mean:.1f}"]  # 720 games; no standard error from means over windows
    stats = (tmp_path / "out" / "report.md").read_text().split("## Training statistics")[1]
    assert f"| 0-1k | {(500 * -1.0 + 200 * 1.0) / 700:.1f} | 0.1 |" in stats  # weighted by games in a tenth too
    run = rep.load_run(str(run_dir))
    curve = rep.curve_on_grid([run], np.array([3000.0]), smooth=100)
    assert curve[0, 0] == pytest.approx(mean)


def test_report_writes_where_the_user_stands(tmp_path):
    """Issue #54: from a folder outside the checkout, the report went to the checkout's benchmark/results/. Now it goes
    to the runs folder it reads (--out picks another), and its first line names both."""
    write_run(tmp_path / "runs", "Pendulum-v1__where54__1__1700000000", returns=[-1000.0, -900.0], total=400)
    cmd = [sys.executable, os.path.join(BENCH, "report.py"), "runs", "--no-plots"]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.splitlines()[0] == f"[report] the runs in {tmp_path / 'runs'}; report.md to {tmp_path / 'runs'}"
    assert "where54" in (tmp_path / "runs" / "report.md").read_text()


def test_iqm_by_hand():
    """The interquartile mean cuts int(n / 4) values at each end and averages the rest (rliable's aggregate_iqm)."""
    scores = np.array([10.0, 0.0, 3.0, 100.0, 5.0, 1.0, 7.0, 2.0])  # sorted 0 1 | 2 3 5 7 | 10 100
    assert rep.iqm(scores) == pytest.approx((2 + 3 + 5 + 7) / 4)
    assert rep.iqm(np.array([1.0, 2.0, 3.0, 4.0, 100.0])) == pytest.approx(3.0)  # int(5 / 4) = 1 cut at each end
    assert rep.iqm(np.array([1.0, 2.0, 9.0])) == pytest.approx(4.0)  # under 4 values nothing is cut: the mean
    assert np.allclose(rep.iqm(np.array([scores, scores + 1])), [4.25, 5.25])  # per row of a (resamples, runs) array


def test_iqm_matches_scipys_trimmed_mean():
    stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(3).normal(size=(4, 37))
    assert np.allclose(rep.iqm(x), stats.trim_mean(x, 0.25, axis=-1))


def test_bootstrap_interval_contains_the_mean_and_shrinks_with_more_seeds():
    three = [90.0, 100.0, 110.0]
    lo3, hi3 = rep.mean_interval(three, reps=10_000)
    lo30, hi30 = rep.mean_interval(three * 10, reps=10_000)  # the same spread over ten times the seeds
    assert lo3 < 100.0 < hi3 and lo30 < 100.0 < hi30
    assert (hi30 - lo30) < 0.5 * (hi3 - lo3)  # about 1 / sqrt(10) as wide
    assert rep.mean_interval(three, reps=10_000) == (lo3, hi3)  # a fixed generator seed: the same interval again
    assert rep.mean_interval([42.0], reps=10_000) is None  # one seed: nothing to resample


def test_stratified_bootstrap_resamples_within_each_task():
    """Each task's resamples draw from its own scores only, as many as it has: a task whose seeds all scored 5 keeps
    5 in every resample, and a task's scores never turn up in another's."""
    tasks = [np.full(3, 5.0), np.array([100.0, 200.0, 300.0]), np.array([7.0])]
    samples = rep.stratified_bootstrap(tasks, lambda s: s, reps=1000)
    assert [s.shape for s in samples] == [(1000, 3), (1000, 3), (1000, 1)]
    assert np.all(samples[0] == 5.0) and np.all(samples[2] == 7.0)
    assert np.all(np.isin(samples[1], tasks[1])) and len(np.unique(samples[1].mean(axis=1))) > 3  # it does resample
    # a constant task's IQM is its value in every resample; the probability of beating a fixed reference too
    iqm, above = rep.AGGREGATES
    assert np.all(rep.stratified_bootstrap([np.full(4, 0.8)], iqm, reps=100) == 0.8)
    assert np.all(rep.stratified_bootstrap([np.full(4, 0.8), np.full(2, 1.2)], above, reps=100) == 0.5)


def test_report_across_tasks_section(tmp_path):
    """Per task a bootstrap interval beside the reference and its protocol; per script the IQM of the scores divided
    by the reference and P(run > reference mean), with stratified intervals; one-seed tasks get "-"."""
    runs = tmp_path / "runs"
    for seed, score in [(1, 1000.0), (2, 2000.0), (3, 3000.0)]:  # ÷ 2000: 0.5, 1 (a tie), 1.5
        write_run(runs, f"Hopper-v5__ppo_continuous__{seed}__1700000000", returns=[score] * 10, total=1000)
    write_run(runs, "Walker2d-v5__ppo_continuous__1__1700000000", returns=[500.0] * 10, total=1000)  # ÷ 1000: 0.5
    write_run(runs, "Walker2d-v5__ppo_other__1__1700000000", returns=[1500.0] * 10, total=1000)
    write_run(runs, "InvertedPendulum-v5__ppo_continuous__1__1700000000", returns=[900.0] * 10, total=1000)
    refs = tmp_path / "refs.csv"
    refs.write_text(
        "env,score,source,their_env,protocol\nHopper-v5,2000,test cleanrl,Hopper-v4,p-hopper\n"
        "Walker2d-v5,1000,test lab,,p-walker\n"
    )
    args = ["--refs", refs, "--random", "", "--last-n", 10, "--no-plots", "--bootstrap-reps", 2000]
    res = run_report(runs, "--out", tmp_path / "out", *args)
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "out" / "report.md").read_text()
    hopper = table_row(text, "ppo_continuous", "Hopper-v5")  # the table of rows: the interval beside the reference
    assert hopper[8:] == ["2000 (test cleanrl, Hopper-v4)", "1,000.0 to 3,000.0", "done"]  # 1/27 of means at each end
    assert table_row(text, "ppo_continuous", "Walker2d-v5")[9] == "-"  # one seed: no interval
    section = text.split("## Across tasks")[1].split("## References")[0]
    assert "normalised by the reference alone" in section and "2,000 resamples" in section
    assert "P(run > reference mean)" in section and "seed-to-seed spread is left out" in section
    task = table_row(section, "Hopper-v5 (ppo_continuous, 1k steps)")
    assert task[1:] == [
        "3",
        "2,000.0 ± 1,000.0",
        "1,000.0 to 3,000.0",
        "2000 (test cleanrl, Hopper-v4)",
        "p-hopper",
    ] + [
        "-",  # no random score: none subtracted
        "1.00",
        "0.50 to 1.50",
        "1.5 of 3",
    ]
    walker = table_row(section, "Walker2d-v5 (ppo_continuous, 1k steps)")
    assert walker[3] == "-" and walker[5:] == ["p-walker", "-", "0.50", "-", "0 of 1"]
    # IQM of 0.5, 0.5, 1, 1.5: the middle two, 0.75; P: Hopper 1.5 of 3, Walker 0 of 1, averaged: 0.25
    agg = table_row(section, "ppo_continuous", "4")
    assert agg[1] == "2 (Hopper-v5 1k steps, Walker2d-v5 1k steps)"
    assert agg[3] == "0.75" and agg[5] == "0.25"
    lo, hi = (float(x) for x in agg[4].split(" to "))
    assert lo <= 0.75 <= hi and lo < hi
    assert table_row(section, "ppo_other", "1")[3:] == ["1.50", "-", "1.00", "-"]  # every task one seed: no interval
    left_out = "Left out, no numeric reference score above the random policy's: InvertedPendulum-v5 (ppo_continuous)."
    assert left_out in section
    again = run_report(runs, "--out", tmp_path / "again", *args)
    assert again.returncode == 0
    assert (tmp_path / "again" / "report.md").read_text().split("## Across tasks")[1] == text.split("## Across tasks")[
        1
    ]


def test_report_normalises_by_a_random_policys_score(tmp_path):
    """Issue #65: where every task of a script has a random policy's score, (score - random) / (reference - random):
    0 is a random policy and 1 the reference, and a negative reference counts (CleanRL's Pusher, -40.38, which a
    ratio cannot use). A script with a task without one divides by the reference alone, all its tasks alike."""
    runs = tmp_path / "runs"
    for seed, score in [(1, 1100.0), (2, 2000.0), (3, 2900.0)]:  # (x - 200) / 1,800: 0.5, 1 (a tie), 1.5
        write_run(runs, f"Hopper-v5__ppo_continuous__{seed}__1700000000", returns=[score] * 10, total=1000)
    for seed, score in [(1, -95.0), (2, -18.0)]:  # (x + 150) / 110: 0.5, 1.2
        write_run(runs, f"Pusher-v5__ppo_continuous__{seed}__1700000000", returns=[score] * 10, total=1000)
    write_run(runs, "Hopper-v5__ppo_other__1__1700000000", returns=[1000.0] * 10, total=1000)  # ÷ 2,000: 0.5
    write_run(runs, "Walker2d-v5__ppo_other__1__1700000000", returns=[1500.0] * 10, total=1000)  # ÷ 1,000: 1.5
    refs, randoms = tmp_path / "refs.csv", tmp_path / "random.csv"
    refs.write_text("env,score,source\nHopper-v5,2000,test\nPusher-v5,-40,test\nWalker2d-v5,1000,test\n")
    randoms.write_text("env,score,std_error\nHopper-v5,200,1.5\nPusher-v5,-150,0.5\n")
    args = ["--refs", refs, "--random", randoms, "--last-n", 10, "--no-plots", "--bootstrap-reps", 500]
    res = run_report(runs, "--out", tmp_path / "out", *args)
    assert res.returncode == 0, res.stderr
    section = (tmp_path / "out" / "report.md").read_text().split("## Across tasks")[1].split("## References")[0]
    hopper = table_row(section, "Hopper-v5 (ppo_continuous, 1k steps)")
    assert hopper[6:8] == ["200.0", "1.00"] and hopper[9] == "1.5 of 3"
    pusher = table_row(section, "Pusher-v5 (ppo_continuous, 1k steps)")
    assert pusher[4] == "-40 (test)" and pusher[6:8] == ["-150.0", "0.85"] and pusher[9] == "1 of 2"
    # IQM of 0.5, 0.5, 1, 1.2, 1.5: one cut at each end, (0.5 + 1 + 1.2) / 3 = 0.9; P: (1.5 / 3 + 1 / 2) / 2 = 0.5
    agg = table_row(section, "ppo_continuous", "5")
    assert agg[1] == "2 (Hopper-v5 1k steps, Pusher-v5 1k steps)" and agg[3] == "0.90" and agg[5] == "0.50"
    # ppo_other's Walker2d has no random score: both its tasks divide by the reference, Hopper's random unused
    assert table_row(section, "Hopper-v5 (ppo_other, 1k steps)")[6:8] == ["-", "0.50"]
    assert table_row(section, "Walker2d-v5 (ppo_other, 1k steps)")[6:8] == ["-", "1.50"]
    assert table_row(section, "ppo_other", "2")[3] == "1.00"
    assert "Left out" not in section
    (tmp_path / "bad.csv").write_text("game,points\nHopper-v5,3\n")
    for path, words in [(tmp_path / "typo.csv", "no such file"), (tmp_path / "bad.csv", "no env and score columns")]:
        res = run_report(runs, "--out", tmp_path / "o", "--refs", refs, "--random", path)
        assert res.returncode == 2 and res.stderr.startswith(f"error: --random '{path}': {words}"), res.stderr
        assert res.stderr.count("\n") == 1


def test_random_scores_feed_the_report(tmp_path, capsys):
    """random_scores.py plays uniform random actions: InvertedPendulum pays 1 a step, so each return is its episode's
    length, here a few steps before the pole falls; the same seed gives the same CSV, which report.py reads."""
    out = tmp_path / "random.csv"
    args = ["--envs", "InvertedPendulum-v5", "--episodes", 5, "--seed", 3]
    assert random_scores.main([*map(str, args), "--out", str(out)]) == 0
    with open(out, newline="") as f:
        (row,) = list(csv.DictReader(f))
    returns = random_scores.random_returns("InvertedPendulum-v5", 5, 3)
    assert all(r == int(r) and 1 <= r < 100 for r in returns)  # one per step, the pole down long before 1,000
    assert row["env"] == "InvertedPendulum-v5" and row["episodes"] == "5" and float(row["score"]) == np.mean(returns)
    assert "uniform random actions" in row["protocol"]
    first = out.read_bytes()
    assert random_scores.main([*map(str, args), "--out", str(out)]) == 0 and out.read_bytes() == first
    assert rep.load_random_scores(str(out)) == {"InvertedPendulum-v5": np.mean(returns)}
    # another env measured into the same file adds its row and keeps the others (the default file holds them all)
    assert random_scores.main(["--envs", "Pendulum-v1", "--episodes", "2", "--out", str(out)]) == 0
    assert set(rep.load_random_scores(str(out))) == {"InvertedPendulum-v5", "Pendulum-v1"}
    assert random_scores.main([*map(str, args), "--out", str(out)]) == 0  # measured again: its row replaced
    assert out.read_text().count("InvertedPendulum-v5") == 1
    capsys.readouterr()
    assert random_scores.main(["--envs", "NoSuchEnv-v9", "--out", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --envs: cannot make 'NoSuchEnv-v9'") and err.count("\n") == 1


def test_report_across_tasks_without_references(report, tmp_path):
    """No reference for any task: the section says so in one line; the fixture's references give Breakout's two
    seeds a ratio to the first listed, the comparable one (326.5, measured on our env)."""
    write_run(tmp_path / "runs", "Hopper-v5__ppo_continuous__1__1700000000", returns=[1.0] * 3)
    res = run_report(tmp_path / "runs", "--out", tmp_path / "out", "--refs", "", "--no-plots")
    assert res.returncode == 0, res.stderr
    assert "No task with a score has a numeric reference score: no aggregate." in res.stdout
    section = (report[1] / "report.md").read_text().split("## Across tasks")[1].split("## References")[0]
    breakout = table_row(section, "ALE_Breakout-v5 (ppo_atari, 15k steps)")
    assert breakout[4] == "326.5 (test lab)" and breakout[6:8] == ["-", f"{104.5 / 326.5:.2f}"]
    assert "ALE_Pong-v5 (ppo_atari)" in section.split("Left out")[1]  # no reference for Pong in the fixture's file


def report_body(out):
    """report.md from its first table on: the title names the folder read, the next line the time."""
    text = (out / "report.md").read_text()
    return re.sub(r"no event for \S+", "no event for T", text[text.index("| script") :])  # read a second apart


def test_report_rebuilds_from_its_scalars_csv(tmp_path):
    """Issue #65: --csv keeps each run's scalars and texts in OUT/scalars/<run>.csv.gz (a gzipped CSV, about a
    seventh of the event files' size), from which the same report is rebuilt without the event files: every table,
    the resumed run's segments and its redone steps included. A CSV a user unzipped reads the same."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    for seed, returns in [(1, [0.1 * i for i in range(120)]), (2, [3.0 + 0.7 * i for i in range(120)])]:
        name = f"Hopper-v5__ppo_continuous__{seed}__1700000000"
        write_run(runs, name, returns=returns, sps=[100.5, 99.25], sps_steps=[6000, 12000], total=12000)
    # seed 3 crashed at 1,500 after its checkpoint at 1,200 and was resumed on a GPU that did not log its name
    resumed = runs / "Hopper-v5__ppo_continuous__3__1700000000"
    hparams = "|param|value|\n|-|-|\n|total_timesteps|2000|\n|num_envs|2|\n|num_steps|50|"
    for start, last, t0, device in [(0, 1500, 1000.0, "CPU A"), (1200, 2000, 9000.0, None)]:
        w = SummaryWriter(str(resumed))
        w.add_text("hyperparameters", hparams)
        if device:
            w.add_text("device", device, start)
        for step in range(start, last + 1, 100):
            tags = {"charts/episodic_return": step / 7, "losses/entropy": 1 / (step + 3), "charts/SPS": 900.0 + step}
            tags.update({"gpu/util_mean": 90.0} if device is None else {})
            for tag, value in tags.items():
                w.add_scalar(tag, value, step, walltime=t0 + step / 10)
        w.close()
    write_run(runs, "Hopper-v5__ppo_continuous__4__1700000000", total=2000)  # died before its first scalar
    refs = tmp_path / "refs.csv"
    refs.write_text("env,score,source\nHopper-v5,10,test\n")
    args = ["--refs", refs, "--no-plots", "--bootstrap-reps", 200]
    assert run_report(runs, "--out", out, "--csv", *args).returncode == 0
    files = sorted(f.name for f in (out / "scalars").iterdir())
    assert files == [f"Hopper-v5__ppo_continuous__{seed}__1700000000.csv.gz" for seed in (1, 2, 3, 4)]
    res = run_report(out / "scalars", "--out", tmp_path / "again", "--csv", *args)
    assert res.returncode == 0, res.stderr
    assert report_body(tmp_path / "again") == report_body(out)
    for section in ("| script", "## Across tasks", "## Segments", "## Training statistics"):
        assert section in report_body(out)
    segments = report_body(out).split("## Segments")[1]
    assert table_row(segments, resumed.name, "1")[2:4] == ["CPU A", "0–1,200"]
    assert table_row(segments, resumed.name, "1")[-1] == "300"  # the redone steps, from the CSV too
    assert table_row(segments, resumed.name, "2")[2:4] == ["GPU (name not logged)", "1,200–2,000"]
    for f in files:  # a CSV rebuilds the CSV it came from, byte for byte (no time stamp in the gzip header)
        assert (tmp_path / "again" / "scalars" / f).read_bytes() == (out / "scalars" / f).read_bytes()
    unzipped = tmp_path / "unzipped"
    unzipped.mkdir()
    for f in files:
        (unzipped / f.removesuffix(".gz")).write_bytes(gzip.decompress((out / "scalars" / f).read_bytes()))
    res = run_report(unzipped, "--out", tmp_path / "plain", *args)
    assert res.returncode == 0 and report_body(tmp_path / "plain") == report_body(out)
    # beside the run folders (--csv without --out writes RUNS/scalars/), a run's event files win over its CSV
    res = run_report(runs, "--csv", *args)
    assert res.returncode == 0 and report_body(runs) == report_body(out) and (runs / "scalars" / files[0]).is_file()
    assert run_report(runs, *args).returncode == 0 and report_body(runs) == report_body(out)
    bad = tmp_path / "bad" / files[0].removesuffix(".gz")
    bad.parent.mkdir()
    bad.write_text("process,tag,step,wall_time,value,text\n1,charts/SPS,100,1000.0,fast,\n")
    res = run_report(bad.parent, "--out", tmp_path / "o", *args)
    why = "could not convert string to float: 'fast'"
    assert res.returncode == 2 and res.stderr == f"error: {bad}, line 2: not a scalars CSV row ({why})\n"

    with gzip.open(out / "scalars" / f"{resumed.name}.csv.gz", "rt", newline="") as f:
        reader = csv.reader(f)
        assert next(reader) == ["process", "tag", "step", "wall_time", "value", "text"]
        rows = list(reader)
    texts = {(row[0], row[1]): row[5] for row in rows if row[1].startswith("text:")}
    assert texts == {
        ("1", "text:hyperparameters"): hparams,
        ("1", "text:device"): "CPU A",
        ("2", "text:hyperparameters"): hparams,
    }
    # each process's last step and wall time, the redone events counted: the redone steps and a run's age
    assert [row[:5] for row in rows if row[1] == "process:end"] == [
        ["1", "process:end", "1500", "1150.000", ""],
        ["2", "process:end", "2000", "9200.000", ""],
    ]
    scalars = {}
    for n, tag, step, wall_time, value, _ in rows:
        if not tag.startswith(("text:", "process:")):
            scalars.setdefault((int(n), tag), []).append((int(step), float(wall_time), float(np.float32(value))))
    # every event the event files hold, each value exactly (a float32 as TensorBoard keeps it) and its wall time to the
    # millisecond, but those after the step the next process resumed from
    event_files = sorted(f for f in os.listdir(resumed) if f.startswith("events.out"))
    for n, (file, keep_until) in enumerate(zip(event_files, [1200, math.inf]), 1):
        for tag, events in rep.read_event_file(str(resumed / file))[0].items():
            kept = [(step, float(f"{t:.3f}"), value) for step, t, value in events if step <= keep_until]
            assert scalars.pop((n, tag)) == kept, (n, tag)
    assert scalars == {}
