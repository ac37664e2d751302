"""How decided is a Pong policy? The analysis behind this folder's README (Pong's shortfall): play one game in each of
8 envs with actions sampled from a ppo_atari.py network, as in training, and print the scores, the mean entropy of the
6-way action distribution, and the mean entropy over the 3 paddle moves when each is merged with its FIRE twin (NOOP
and FIRE, RIGHT and RIGHTFIRE, LEFT and LEFTFIRE): how decided the policy is about the paddle's move. Then the same 8
games' seeds with the likeliest action always taken: what the network's preferences score without the sampling.

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


def play(agent, greedy: bool) -> dict:
    """One game in each env (the same seeds every call); sampled actions as in training, or the likeliest."""
    envs = ppo_atari.make_envs(ppo_atari.Args(env_id="ALE/Pong-v5"), NUM_ENVS, env_threads=1)
    obs, info = envs.reset(seed=12345)
    tracker = ppo_atari.EpisodeTracker(NUM_ENVS, info["lives"])
    playing = np.ones(NUM_ENVS, bool)  # each env counts until its first game ends
    scores, full, merged, likeliest = [], [], [], []
    with torch.no_grad():
        while playing.any():
            logits, _ = agent(torch.as_tensor(obs))
            probs = torch.softmax(logits, -1)
            moves = torch.stack([probs[:, a] + probs[:, b] for a, b in TWINS], -1)
            live = torch.as_tensor(playing)
            full.append(entropy(probs)[live])
            merged.append(entropy(moves)[live])
            likeliest.append(moves.max(-1).values[live])
            actions = probs.argmax(-1) if greedy else torch.distributions.Categorical(probs=probs).sample()
            obs, reward, terminated, truncated, info = envs.step(actions.numpy())
            _, _, game_over, game_scores, _ = tracker.step(reward, terminated, truncated, info["lives"])
            scores += [float(game_scores[i]) for i in np.flatnonzero(game_over & playing)]
            playing &= ~game_over
    envs.close()
    return {
        "scores": sorted(scores),
        "steps": sum(len(x) for x in full),
        "full": torch.cat(full).mean().item(),
        "merged": torch.cat(merged).mean().item(),
        "likeliest": torch.cat(likeliest).mean().item(),
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ckpt = ppo_atari.load_checkpoint(sys.argv[1])
    agent = ppo_atari.Agent(6)
    agent.load_state_dict(ckpt["model"])
    for greedy in (False, True):
        r = play(agent, greedy)
        how = "likeliest action" if greedy else "sampled actions"
        print(
            f"{how}: {len(r['scores'])} games, {r['steps']} agent steps: {r['scores']}, mean {np.mean(r['scores']):.1f}"
        )
        print(f"  entropy over the 6 actions: {r['full']:.3f} (maximum {np.log(6):.3f})")
        print(f"  entropy over the 3 paddle moves, twins merged: {r['merged']:.3f} (maximum {np.log(3):.3f})")
        print(f"  probability of the likeliest move: {r['likeliest']:.3f} on average")
