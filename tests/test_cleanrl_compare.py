"""Tests for benchmark/cleanrl_compare.py without CleanRL: the alternating order of the rounds, the ratios and medians
of the table, the steady SPS read from an event file, and the one-line errors when the CleanRL side is missing."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmark")
sys.path.insert(0, BENCH)
import cleanrl_compare as cc  # noqa: E402

sys.path.remove(BENCH)
SCRIPT = os.path.join(BENCH, "cleanrl_compare.py")


def test_rounds_alternate():
    """Ours first in odd rounds, CleanRL's first in even ones."""
    assert [cc.round_order(r) for r in (1, 2, 3, 4)] == [
        ("ours", "CleanRL"),
        ("CleanRL", "ours"),
        ("ours", "CleanRL"),
        ("CleanRL", "ours"),
    ]


def test_summary_best_median_and_ratios():
    """Best and median of each side (failed runs, None, left out) and ours / CleanRL's of each."""
    s = cc.summary([1200.0, 1000.0, None, 1100.0], [800.0, 1000.0])
    assert s["ours_best"] == 1200.0 and s["theirs_best"] == 1000.0
    assert s["ours_median"] == 1100.0 and s["theirs_median"] == 900.0
    assert s["ratio_best"] == pytest.approx(1.2)
    assert s["ratio_median"] == pytest.approx(1100 / 900)
    empty = cc.summary([None], [500.0])
    assert empty["ours_best"] is None and empty["ratio_best"] is None and empty["ratio_median"] is None
    assert cc.ratio(1.0, 0.0) is None and cc.times(None) == cc.DASH and cc.times(1.234) == "1.23x"


def test_wall_sps_only_for_finished_runs():
    run = cc.Run("ours", ["x"], wall=4.0, steps=8192)
    assert run.ok and run.wall_sps == 2048
    assert cc.Run("ours", ["x"], wall=4.0, steps=8192, status="failed (exit 1)").wall_sps is None


def test_steady_sps_from_event_times(tmp_path):
    """Steps between consecutive per-iteration events over their wall-time difference, the first iteration's own
    time left out (its event has no predecessor), the median of the rest; charts/SPS's median beside it."""
    writer = SummaryWriter(str(tmp_path / "runs" / "run"))
    times = [100.0, 103.0, 104.0, 105.0, 105.5]  # iterations of 2048 steps ending at these wall times
    for i, t in enumerate(times, start=1):
        writer.add_scalar(cc.ITERATION_TAG, 3e-4, i * 2048, walltime=t)
        if i > 1:
            writer.add_scalar("charts/SPS", 1000.0 * i, i * 2048, walltime=t)
    writer.close()
    steady, logged = cc.steady_sps(str(tmp_path / "runs"))
    assert steady == pytest.approx(2048.0)  # rates 682.7, 2048, 2048, 4096
    assert logged == pytest.approx(3500.0)  # median of 2000, 3000, 4000, 5000
    assert cc.steady_sps(str(tmp_path / "nothing")) == (None, None)


def test_tasks_use_cleanrl_settings():
    """CleanRL's defaults on both sides: 1 x 2048 and 8 x 128, with 32 x 10 and 4 x 4 minibatches x epochs; our
    atari flags spelled out (our defaults differ), CleanRL's video, tracking and model saving off."""
    t = cc.tasks(None, None)
    cont, atari = t["continuous"], t["atari"]
    assert cont.batch == 2048 and cont.our_env == "HalfCheetah-v5" and cont.their_env == "HalfCheetah-v4"
    assert "--no-save-model" in cont.theirs and "--no-capture-video" in cont.theirs and "--no-track" in cont.theirs
    for args in (atari.ours, atari.theirs):
        flags = " ".join(args)
        assert "--num-envs 8 --num-steps 128 --num-minibatches 4 --update-epochs 4" in flags
    assert atari.batch == 8 * 128 and atari.their_env == "BreakoutNoFrameskip-v4"
    assert cc.tasks("Hopper-v5", "Hopper-v4")["continuous"].ours[2] == "Hopper-v5"


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--cleanrl-python", "/nonexistent/python"], "error: no CleanRL Python at /nonexistent/python"),
        (["--cleanrl-dir", "/nonexistent/cleanrl"], "error: no CleanRL folder at /nonexistent/cleanrl"),
        (["--task", "atari", "--steps", "1000"], "error: --steps must be at least 2048 for atari"),
    ],
)
def test_missing_cleanrl_is_one_error_line(tmp_path, args, expected):
    """A missing CleanRL side or a bad budget: one ``error:`` line on stderr, exit 2, nothing run."""
    cleanrl = tmp_path / "cleanrl"
    cleanrl.mkdir()
    for script in ("ppo_continuous_action.py", "ppo_atari.py"):
        (cleanrl / script).write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("CLEANRL_DIR", "CLEANRL_PYTHON")}
    env |= {"CLEANRL_DIR": str(cleanrl), "CLEANRL_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), done.stderr
    assert "[compare]" not in done.stdout


def test_missing_cleanrl_script(tmp_path):
    done = subprocess.run(
        [sys.executable, SCRIPT, "--task", "continuous", "--cleanrl-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no ") and "ppo_continuous_action.py" in lines[0]
