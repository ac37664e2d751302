"""A uniform random policy's score per env: the 0 of report.py's normalised scores (issue #65).

Agarwal et al. (NeurIPS 2021, rliable) aggregate tasks by normalised scores, (score - random) / (reference - random),
so that 0 is a random policy and 1 the reference on every task. A reference can be negative (CleanRL's Pusher,
-40.38), where a plain ratio to it means nothing. This plays --episodes episodes of each env with actions drawn
uniformly from its action space (gymnasium's make, no wrapper but its time limit: the raw return the scripts log) and
writes their mean return, its standard error and how it was measured to --out, which report.py reads (--random):
an env measured again replaces its row, the others' rows stay.

    python benchmark/random_scores.py --envs "HalfCheetah-v5 Hopper-v5 Walker2d-v5" --out benchmark/random_scores.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import warnings

import gymnasium as gym
import numpy as np
from sweep import Parser, SweepError, count, one_line_errors  # one-line errors

HERE = os.path.dirname(os.path.abspath(__file__))
MUJOCO = "HalfCheetah-v5 Hopper-v5 Walker2d-v5 InvertedPendulum-v5 Humanoid-v5 Pusher-v5"
HEADER = ["env", "score", "std_error", "episodes", "protocol"]


def random_returns(env_id: str, episodes: int, seed: int) -> list[float]:
    """Each episode's return under uniform random actions; episode i resets with seed + i, the actions' generator is
    the action space's, seeded with seed."""
    if env_id.startswith("ALE/"):
        import ale_py

        gym.register_envs(ale_py)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an old version's deprecation notice
            env = gym.make(env_id)
    except gym.error.Error as exc:
        raise SweepError(f"--envs: cannot make {env_id!r} ({exc}); pass a gymnasium env id") from None
    env.action_space.seed(seed)
    returns = []
    for i in range(episodes):
        env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


@one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", default=MUJOCO, help=f"gymnasium env ids (default: {MUJOCO})")
    p.add_argument("--episodes", type=count(1), default=100, help="episodes per env (default 100)")
    p.add_argument("--seed", type=int, default=0, help="episode i resets with seed + i; the actions' (default 0)")
    p.add_argument("--out", default=os.path.join(HERE, "random_scores.csv"), help="the CSV to write")
    a = p.parse_args(argv)
    rows = {}
    if os.path.isfile(a.out):  # the envs not measured now keep their rows
        with open(a.out, newline="") as f:
            rows = {row[0]: row for row in csv.reader(f) if row and row != HEADER}
    for env_id in a.envs.split():
        returns = np.array(random_returns(env_id, a.episodes, a.seed))
        se = float(np.std(returns, ddof=1) / np.sqrt(len(returns))) if len(returns) > 1 else 0.0
        protocol = f"uniform random actions, mean of {a.episodes} episodes (resets seeded {a.seed}+i), raw return"
        rows[env_id] = [env_id, f"{returns.mean():.2f}", f"{se:.2f}", a.episodes, protocol]
        print(f"{env_id}: {returns.mean():.2f} +- {se:.2f} (standard error, {a.episodes} episodes)", flush=True)
    try:
        with open(a.out, "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(HEADER)
            writer.writerows(rows.values())
    except OSError as exc:
        raise SweepError(f"--out {a.out}: {exc.strerror}; pass a writable path") from None
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
