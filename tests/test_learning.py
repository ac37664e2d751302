"""Learning checks: short fixed-seed runs that must actually learn, with assertions on the logged curves. A test that
only checks the exit code passes with a broken GAE or a broken TD target; these do not. Checked by planting each bug
once on a 2-core CPU: GAE's recursion run forward in time, best 20-episode mean 32.9 (fails; 2026-11-23); the TD
target bootstrapping only at game over, best average length 7.1 on 8x8 against a bar of 9 (fails; 2026-11-26).
Subtler bugs learn too well to show here: GAE without the episode-end mask and a target network frozen at its initial
weights both still passed, so the GAE hand computations in test_ppo_atari.py / test_ppo_continuous.py and the n-step
tests carry those. Each run is stopped as soon as its curve passes the bar: under a minute or two each on two cores.
Marked `slow`: CI runs them (plain `pytest`); `pytest -m "not slow"` skips them while you work."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import scalars

ROOT = Path(__file__).resolve().parents[1]


def curves_of(cwd) -> dict[str, np.ndarray]:
    """Every scalar the run in ``cwd`` has logged so far, as (step, value) rows by tag (empty before its folder)."""
    run_dirs = list((Path(cwd) / "runs").glob("*"))
    if not run_dirs:
        return {}
    return {tag: np.array(points) for tag, points in scalars(run_dirs[0]).items()}


def train(script, args, cwd, tag, reached):
    """Run ``script`` with ``args`` and return its curves. The run is stopped (SIGTERM: it checkpoints and exits 0)
    as soon as ``reached`` holds for the (step, value) rows of ``tag`` logged so far: the step budget bounds a run
    that does not learn, and one that learns ends early. The assertions read the curves, not how the run ended."""
    env = dict(os.environ, WANDB_MODE="offline", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(ROOT / script), "--no-progress-bar", "--seed", "1", *map(str, args)]
    with open(Path(cwd) / "out.log", "w+") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 900
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(2)
                curves = curves_of(cwd)
                if tag in curves and reached(curves[tag]):
                    proc.send_signal(signal.SIGTERM)
                    break
            returncode = proc.wait(timeout=max(0, deadline - time.monotonic()) + 60)
        finally:
            proc.kill()  # nothing once it has exited
        log.seek(0)
        text = log.read()
    assert returncode == 0, text[-4000:]  # also for a signal that came after the run's end: it ignores it
    return curves_of(cwd)


def best_rolling_mean(curve: np.ndarray, window: int = 20) -> float:
    """The best mean of ``window`` consecutive logged values (-inf while fewer were logged)."""
    if len(curve) < window:
        return -np.inf
    return np.convolve(curve[:, 1], np.ones(window) / window, mode="valid").max()


@pytest.mark.slow
def test_ppo_continuous_balances_the_inverted_pendulum(tmp_path):
    """InvertedPendulum-v5 pays 1 per step up to 1000: the mean of 20 consecutive episodes reaches 900 within 100k
    steps (here, seeds 1-3 passed 950 at 40k-44k steps). 40 iterations of the default 2048 steps."""
    args = ["--env-id", "InvertedPendulum-v5", "--total-timesteps", 81920]
    curves = train("ppo_continuous.py", args, tmp_path, "charts/episodic_return", lambda c: best_rolling_mean(c) >= 900)
    steps, returns = curves["charts/episodic_return"].T
    best = best_rolling_mean(curves["charts/episodic_return"])  # the mean of 20 consecutive episodes
    assert steps[-1] <= 100_000 and best >= 900, f"best 20-episode mean {best:.1f}"


@pytest.mark.slow
def test_dqn_snake_learns_to_eat(tmp_path):
    """Snake on 8x8 starts at length 3 and grows by one per food: the average final length of the games in a log
    window reaches 9 (6 foods a game) within 200k env steps. 128 games, 2 updates of 256 per vector step (replay
    ratio 4), epsilon annealed over the first 30k steps. On the 2-core VM (2026-11-26, one core and one thread a run),
    seeds 1 and 2 passed 9 at 153.6k and 140.8k steps and reached 12.9 and 12.0 by 200k; with the TD target's mask
    inverted (bootstrapping only at game over) seed 1's best was 7.1. The 10x10 board this test used before passed 8
    only in its last log window."""
    args = ["--height", 8, "--width", 8, "--num-envs", 128, "--updates-per-step", 2, "--learning-rate", 1e-3]
    args += ["--tau", 0.01, "--learning-starts", 5000, "--exploration-fraction", 0.15]
    args += ["--total-timesteps", 200_000, "--log-every", 12_800]
    curves = train("dqn_snake_vec.py", args, tmp_path, "charts/snake_length", lambda c: c[:, 1].max() >= 9)
    steps, lengths = curves["charts/snake_length"].T
    assert steps[-1] <= 200_000 and lengths.max() >= 9, f"best average length {lengths.max():.1f}"
