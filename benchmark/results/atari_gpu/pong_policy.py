"""How decided is a Pong policy? The analysis behind this folder's README (Pong's shortfall): play one game in each of
8 envs with ppo_atari.py's `evaluate`, actions sampled from the network as in training, and print the scores, the mean
entropy of the 6-way action distribution, and the mean entropy over the 3 paddle moves when each is merged with its
FIRE twin (NOOP and FIRE, RIGHT and RIGHTFIRE, LEFT and LEFTFIRE): how decided the policy is about the paddle's move.
Then the same 8 games' seeds with the likeliest action always taken: what the network's preferences score without the
sampling. The entropies average every step `evaluate` plays, until the last of the 8 first games ends.

    python benchmark/results/atari_gpu/pong_policy.py benchmark/results/atari_gpu/runs/<Pong run>/ppo_atari.model
"""

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
import ppo_atari  # noqa: E402

NUM_ENVS = 8
TWINS = ((0, 1), (2, 4), (3, 5))  # NOOP/FIRE, RIGHT/RIGHTFIRE, LEFT/LEFTFIRE in Pong's minimal action set


def entropy(probs: torch.Tensor) -> torch.Tensor:
    return -(probs * probs.clamp_min(1e-12).log()).sum(-1)


def recording_policy(agent: ppo_atari.Agent, greedy: bool, record: dict):
    """An `act` for ppo_atari.evaluate that also records, each step, the entropies and the likeliest move's chance."""

    def act(obs: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(agent(obs)[0], -1)
        moves = torch.stack([probs[:, a] + probs[:, b] for a, b in TWINS], -1)
        record["full"].append(entropy(probs))
        record["merged"].append(entropy(moves))
        record["likeliest"].append(moves.max(-1).values)
        return probs.argmax(-1) if greedy else torch.distributions.Categorical(probs=probs).sample()

    return act


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.manual_seed(0)
    agent = ppo_atari.Agent(6)
    agent.load_state_dict(ppo_atari.load_checkpoint(sys.argv[1])["model"])
    envs = ppo_atari.make_envs(ppo_atari.Args(env_id="ALE/Pong-v5"), NUM_ENVS, env_threads=1)
    for greedy in (False, True):
        record = {"full": [], "merged": [], "likeliest": []}
        scores = ppo_atari.evaluate(envs, recording_policy(agent, greedy, record), torch.device("cpu"), seed=12345)
        full, merged, likeliest = (torch.cat(record[key]).mean().item() for key in ("full", "merged", "likeliest"))
        how = "likeliest action" if greedy else "sampled actions"
        print(f"{how}: {len(record['full'])} vector steps, scores {sorted(scores.tolist())}, mean {scores.mean():.1f}")
        print(f"  entropy over the 6 actions: {full:.3f} (maximum {np.log(6):.3f})")
        print(f"  entropy over the 3 paddle moves, twins merged: {merged:.3f} (maximum {np.log(3):.3f})")
        print(f"  probability of the likeliest move: {likeliest:.3f} on average")
