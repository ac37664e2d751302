"""Fast CPU tests for ppo_atari.py --async-envs (ppo_atari.AsyncRollout): per-env rollout storage against a log of
what each env played, GAE on that storage against a per-env computation, a short run with resume, and the one-line
errors for bad values."""

import glob
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FrameLog, assert_one_line_error, atari_storage, run_in_process, scalars

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "ppo_atari.py")
sys.path.insert(0, str(ROOT))
import ppo_atari  # noqa: E402

ASYNC = ["--num-envs", "4", "--async-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
ASYNC += ["--no-progress-bar", "--env-threads", "1", "--max-episode-frames", "200"]  # games cut after 50 agent steps


def run(args, cwd, timeout=180):
    env = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, SCRIPT, *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


class FakeAsyncEnv:
    """ale-py's async contract on a virtual clock: reset() and recv() hand back the batch_size envs that finish
    first (info["env_id"]), send() acts on exactly the envs of the last recv(). Env e needs speeds[e] per step, so a
    slow env lags and the others' columns fill first. Rewards -2..2 (clipping shows), a life lost every 4 steps, env e's
    game over after 9 + e steps, cut short by the frame cap (truncated) in odd envs, with SameStep resets."""

    def __init__(self, num_envs, batch_size, speeds):
        self.num_envs = num_envs
        self.batch_size = batch_size
        self.speeds = speeds
        self.clock = 0.0
        self.results = {}  # env -> (finish time, obs, reward, terminated, truncated, lives, final_obs)
        self.t = np.zeros(num_envs, dtype=int)  # steps into the current game
        self.total = np.zeros(num_envs, dtype=int)
        self.ids = None

    def _obs(self, e):
        return np.full((4, 84, 84), (self.total[e] * 31 + e * 7) % 256, dtype=np.uint8)

    def reset(self, seed=None):
        for e in range(self.num_envs):
            self.results[e] = (3.0 + 0.01 * e, self._obs(e), 0, False, False, 3, None)
        obs, _, _, _, info = self.recv()
        return obs, info

    def send(self, actions):
        assert actions.shape == (self.batch_size,) and actions.dtype == np.int64
        for e, action in zip(self.ids, actions):
            self.t[e] += 1
            self.total[e] += 1
            reward = (self.total[e] + action) % 5 - 2
            over = self.t[e] == 9 + e
            final = self._obs(e) if over else None
            if over:
                self.t[e] = 0
                self.total[e] += 1000  # the new game's first observation differs from the last one
            lives = 3 - self.t[e] // 4
            terminated, truncated = over and e % 2 == 0, over and e % 2 == 1
            self.results[e] = (self.clock + self.speeds[e], self._obs(e), reward, terminated, truncated, lives, final)

    def recv(self):
        ids = sorted(self.results, key=lambda e: (self.results[e][0], e))[: self.batch_size]
        self.clock = max([self.clock] + [self.results[e][0] for e in ids])
        self.ids = np.array(ids)
        _, obs, reward, terminated, truncated, lives, final = zip(*[self.results.pop(e) for e in ids])
        final_obs = np.stack([np.zeros((4, 84, 84), np.uint8) if f is None else f for f in final])
        info = {"env_id": self.ids, "lives": np.array(lives, dtype=np.int32), "final_obs": final_obs}
        return np.stack(obs), np.array(reward, dtype=np.float64), np.array(terminated), np.array(truncated), info


class Spy:
    """Wraps a vector env and logs, for each env, the steps it played in order: the observation acted on, the
    action, log-prob and value the policy gave, which collect() sent it (epoch), and what came back (raw reward,
    terminated, truncated, lives, last observation of a game the frame cap cut) with the epoch it came back in."""

    def __init__(self, envs):
        self.envs = envs
        self.num_envs = envs.num_envs
        self.log = [[] for _ in range(envs.num_envs)]
        self.current = [None] * envs.num_envs  # the observation each env is at
        self.first_lives = {}
        self.pending = {}
        self.policy = {}  # env -> (log-prob, value) that act() gave for its next action
        self.epoch = 0
        self.ids = None

    def _arrive(self, obs, info, reward=None, terminated=None, truncated=None):
        self.ids = info["env_id"]
        for i, e in enumerate(self.ids):
            if e in self.pending:
                step = self.pending.pop(e)
                final = info.get("final_obs")
                step |= dict(reward=float(reward[i]), terminated=bool(terminated[i]), truncated=bool(truncated[i]))
                step |= dict(lives=int(info["lives"][i]), final_obs=None if final is None else final[i].copy())
                step |= dict(next_obs=obs[i].copy(), back=self.epoch)
                self.log[e].append(step)
            else:  # a reset's first observation
                self.first_lives[e] = int(info["lives"][i])
            self.current[e] = obs[i].copy()

    def reset(self, seed):
        obs, info = self.envs.reset(seed=seed)
        self._arrive(obs, info)
        return obs, info

    def send(self, actions):
        for e, action in zip(self.ids, actions):
            logprob, value = self.policy.pop(e)
            self.pending[e] = dict(obs=self.current[e], action=int(action), logprob=logprob, value=value)
            self.pending[e]["epoch"] = self.epoch
        self.envs.send(actions)

    def recv(self):
        obs, reward, terminated, truncated, info = self.envs.recv()
        self._arrive(obs, info, reward, terminated, truncated)
        return obs, reward, terminated, truncated, info


def learning_dones(spy, e):
    """Whether each observation env e acted on starts a new episode (a game over or a lost life before it), and the
    same for the observation after each step."""
    before, after, lives = [], [], spy.first_lives[e]
    done = 0.0
    for step in spy.log[e]:
        before.append(done)
        over = step["terminated"] or step["truncated"]
        done = float(over or step["lives"] < lives)
        lives = step["lives"]
        after.append(done)
    return before, after


def games(spy, e, epoch):
    """(score over all lives, length) of each game env e ended in steps that came back during collect `epoch`."""
    ended, score, length = [], 0.0, 0
    for step in spy.log[e]:
        score, length = score + step["reward"], length + 1
        if step["terminated"] or step["truncated"]:
            if step["back"] == epoch:
                ended.append((score, length))
            score, length = 0.0, 0
    return ended


CUT_VALUE = 0.5  # the bootstrap below: gamma * V(last obs) of a game the frame cap cut


def bootstrap(final_obs, truncated, terminated):
    return np.where(truncated & ~terminated, CUT_VALUE, 0.0).astype(np.float32)


def collect_and_check(envs, num_steps, epochs, seed=0, gamma=0.9, gae_lambda=0.8):
    """Run AsyncRollout.collect `epochs` times on a spied env and check every rollout against the spy's log."""
    spy = Spy(envs)
    n = envs.num_envs
    storage = atari_storage(num_steps, n)
    obs, actions, logprobs, values, next_obs, rewards, dones = storage
    rollout = ppo_atari.AsyncRollout(spy, 1, storage)
    rng = np.random.default_rng(seed)

    def act(batch_obs):  # the observations that recv() handed back, on the device
        action = rng.integers(0, 4, len(batch_obs))
        logprob, value = rng.random(len(batch_obs)).astype(np.float32), rng.random(len(batch_obs)).astype(np.float32)
        spy.policy |= {e: (lp, v) for e, lp, v in zip(spy.ids, logprob, value)}
        return torch.as_tensor(action), torch.as_tensor(logprob), torch.as_tensor(value)

    discarded = []
    for epoch in range(epochs):
        spy.epoch = epoch
        assert rollout.collect(act, bootstrap) == []
        discarded.append(rollout.discarded)
        next_value = torch.rand(n)
        adv, ret = ppo_atari.compute_gae(
            torch.as_tensor(rewards),
            values,
            torch.as_tensor(dones[:-1]),
            next_value,
            torch.as_tensor(dones[-1]),
            gamma,
            gae_lambda,
        )
        for e in range(n):
            log = spy.log[e]
            mine = [i for i, step in enumerate(log) if step["epoch"] == epoch]
            stored = mine[:num_steps]  # the env's first num_steps steps acted on in this collect, in order
            assert stored == list(range(stored[0], stored[0] + num_steps)), (e, mine)
            before, after = learning_dones(spy, e)
            steps = [log[i] for i in stored]
            for t, step in enumerate(steps):
                assert np.array_equal(obs[t, e].numpy(), step["obs"]), (e, t)
                assert actions[t, e] == step["action"] and logprobs[t, e] == step["logprob"]
                assert values[t, e] == step["value"]
                cut = CUT_VALUE if step["truncated"] and not step["terminated"] else 0.0
                assert rewards[t, e] == np.float32(np.clip(step["reward"], -1, 1)) + cut, (e, t)
                assert dones[t + 1, e] == after[stored[t]]
            assert dones[0, e] == before[stored[0]]
            assert np.array_equal(next_obs[e].numpy(), steps[-1]["next_obs"])
            # GAE over env e's own steps, one after the other
            advantage = 0.0
            expected = []
            for t in reversed(range(num_steps)):
                following = next_value[e].item() if t == num_steps - 1 else steps[t + 1]["value"]
                nonterminal = 1.0 - after[stored[t]]
                reward = float(rewards[t, e])  # checked against the log above
                delta = reward + gamma * following * nonterminal - steps[t]["value"]
                advantage = delta + gamma * gae_lambda * nonterminal * advantage
                expected.insert(0, advantage)
            np.testing.assert_allclose(adv[:, e].numpy(), expected, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(ret[:, e].numpy(), np.array(expected) + values[:, e].numpy(), rtol=1e-5)
        expected_games = sorted(g for e in range(n) for g in games(spy, e, epoch))
        assert sorted(rollout.games) == expected_games
        played = sum(step["back"] == epoch for e in range(n) for step in spy.log[e])
        assert rollout.discarded == pytest.approx(1 - n * num_steps / played)
    return spy, discarded


def test_fake_async_env_every_env_stores_its_own_steps_in_order():
    """A slow env (env 1) makes the others' columns fill first: they keep playing unstored until env 1's is full,
    and the steps in flight across an update are never stored."""
    envs = FakeAsyncEnv(5, 2, speeds=[1.0, 2.7, 1.0, 1.3, 1.1])
    spy, discarded = collect_and_check(envs, num_steps=12, epochs=4)
    assert min(discarded) > 0.2  # env 1 is 2.7 times slower: the others overrun their columns
    assert any(step["truncated"] for e in range(5) for step in spy.log[e])  # the frame-cap bootstrap was exercised
    assert any(step["terminated"] for e in range(5) for step in spy.log[e])
    stale = [step for e in range(5) for step in spy.log[e] if step["back"] > step["epoch"]]
    assert stale  # steps sent in one collect that came back in the next: played, not stored (checked above)


def test_a_recorded_game_ends_on_its_own_last_frame():
    """Before: the frame recorded at a game over was the observation recv() handed back, which SameStep auto-reset
    makes the next game's first; a game's last frame is in info["final_obs"]."""
    spy = Spy(FakeAsyncEnv(3, 2, speeds=[1.0, 1.4, 1.2]))
    num_steps = 30
    rollout = ppo_atari.AsyncRollout(spy, 1, atari_storage(num_steps, 3))

    def act(batch_obs):
        spy.policy |= {e: (0.0, 0.0) for e in spy.ids}
        return torch.zeros(len(batch_obs), dtype=torch.long), torch.zeros(len(batch_obs)), torch.zeros(len(batch_obs))

    recorder = FrameLog()
    assert rollout.collect(act, bootstrap, recorder) == []
    steps = spy.log[0]  # env 0's steps that came back, stored or not, in order
    assert len(recorder.frames) == len(steps) >= num_steps
    for (frame, game_over), step in zip(recorder.frames, steps):
        assert game_over == (step["terminated"] or step["truncated"])
        expected = step["final_obs"] if game_over else step["next_obs"]
        assert np.array_equal(frame, ppo_atari.agent_view(expected))
    assert sum(game_over for _, game_over in recorder.frames) >= 3


def test_ale_async_env_every_env_stores_its_own_steps_in_order():
    args = ppo_atari.Args(max_episode_frames=200)  # 50 agent steps: games are cut short within the test
    envs = ppo_atari.make_envs(args, 4, 1, batch_size=2)
    spy, discarded = collect_and_check(envs, num_steps=24, epochs=3)
    assert 0 < max(discarded) < 0.5
    assert any(step["truncated"] for e in range(4) for step in spy.log[e])
    envs.close()


def test_async_run_logs_learns_on_policy_and_resumes(tmp_path):
    out = run([*ASYNC, "--total-timesteps", "256", "--checkpoint-every", "1"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "4 envs in one group; the policy acts on the first 2 to finish" in out.stdout
    (run_dir,) = glob.glob(str(tmp_path / "runs" / "*"))
    tags = scalars(run_dir)
    assert [s for s, _ in tags["charts/SPS"]] == [256]
    assert tags["charts/episodic_return"] and max(v for _, v in tags["charts/episodic_length"]) <= 50
    assert all(0 <= v < 1 for _, v in tags["charts/discarded_steps"])
    # every stored step was acted on by the policy the update starts from: the first minibatch's ratio is 1
    assert max(v for _, v in tags["losses/initial_ratio_error"]) < 1e-6
    ckpt_path = Path(run_dir) / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    assert ckpt["args"]["async_envs"] == 2 and ckpt["global_step"] == 256
    ckpt["args"]["total_timesteps"] = 384  # continue for one more iteration
    torch.save(ckpt, ckpt_path)
    out = run(["--resume", str(ckpt_path), "--no-progress-bar"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "done: step 384/384 in" in out.stdout and "the policy acts on the first 2 to finish" in out.stdout
    assert len(glob.glob(str(tmp_path / "runs" / "*"))) == 1
    assert [s for s, _ in scalars(run_dir)["charts/learning_rate"]][-1] == 384


@pytest.mark.parametrize("value", ["4", "5", "-1"])
def test_bad_async_envs_gives_one_line_error(value, tmp_path):
    out = run_in_process(SCRIPT, [*ASYNC, "--async-envs", value, "--total-timesteps", "256"], tmp_path)
    assert_one_line_error(out, f"--async-envs {value}", "--num-envs - 1")


def test_async_torchrun_two_processes_gloo(tmp_path):
    """Each process fills its own rollout from its own async envs; only the update's gradients are shared."""
    env = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", SCRIPT, *ASYNC]
    cmd += ["--num-steps", "16", "--total-timesteps", "128", "--gpu", "false"]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert "done: step 128/128 in" in out.stdout  # 2 processes x 4 envs x 16 steps per iteration
