"""ppo_atari.py's envs: ALE v5 games in ale-py's C++ vector env, and the full-game accounting its PPO loop needs.

``make_envs`` builds one ``ale_py.AtariVectorEnv`` with v5's settings (sticky actions 0.25, the minimal action set,
frameskip 4 with a max-pool, 84x84 grayscale, a stack of 4 frames, 0 to 29 no-op frames, FIRE on reset, a frame cap)
and same-step auto-reset, stepped by C++ threads; raw rewards and game-over terminals come out of it.
``EpisodeTracker`` turns them into what PPO learns from (rewards clipped to [-1, 1], a lost life as a done) and what
a run logs (each game's score over all its lives and its length), as CleanRL's ``EpisodicLifeEnv``,
``ClipRewardEnv`` and ``RecordEpisodeStatistics`` wrappers do one env at a time. ``agent_view`` draws a video frame.
Importing this module registers the ALE/<Game>-v5 ids with gymnasium (ale-py does) and has no other side effects.
"""

import ale_py  # importing it registers the ALE/<Game>-v5 ids with gymnasium
import gymnasium as gym
import numpy as np


def make_envs(args, num_envs: int, env_threads: int, batch_size: int = 0):
    """ale-py's C++ vector env stepped by threads: v5 semantics, raw rewards, game-over terminals, SameStep autoreset
    (the last observation of a finished game is in info["final_obs"]). ``args``: the run's settings, of which its
    ``env_id`` and ``max_episode_frames``. ``batch_size`` < num_envs: reset and recv hand back the first batch_size
    envs to finish, named by info["env_id"] (0: every env, in order)."""
    return ale_py.AtariVectorEnv(
        gym.spec(args.env_id).kwargs["game"],
        num_envs,
        batch_size=batch_size,
        repeat_action_probability=0.25,
        full_action_space=False,
        num_threads=min(env_threads, num_envs),
        autoreset_mode="SameStep",
        frameskip=4,
        maxpool=True,
        img_height=84,
        img_width=84,
        grayscale=True,
        stack_num=4,
        noop_max=30,
        use_fire_reset=True,
        episodic_life=False,
        life_loss_info=False,
        reward_clipping=False,
        max_num_frames_per_episode=args.max_episode_frames,
    )


class EpisodeTracker:
    """Full-game accounting, vectorised. `step` returns rewards clipped to [-1, 1], the learning dones (a lost life is
    one), which games ended (terminated or truncated), and every env's raw score over all lives and length in agent
    steps so far: a finished game's result where it ended. ``rows``: the envs the results are of (default: all)."""

    def __init__(self, num_envs: int, lives: np.ndarray):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.lives = np.array(lives)

    def step(self, rewards, terminated, truncated, lives, rows=slice(None)):
        game_over = terminated | truncated
        life_lost = (lives < self.lives[rows]) & ~game_over
        self.lives[rows] = lives  # after a game over these are the new game's lives (SameStep reset)
        scores = self.returns[rows] + rewards
        lengths = self.lengths[rows] + 1
        self.returns[rows] = np.where(game_over, 0.0, scores)
        self.lengths[rows] = np.where(game_over, 0, lengths)
        clipped = np.clip(rewards, -1, 1).astype(np.float32)
        return clipped, game_over | life_lost, game_over, scores, lengths


def agent_view(obs: np.ndarray) -> np.ndarray:
    """The last frame of one env's stack as the agent sees it, doubled to 168x168 RGB for a video."""
    return np.repeat(np.repeat(obs[-1], 2, 0), 2, 1)[..., None].repeat(3, -1)
