"""Fast CPU tests for ppo_atari.py: GAE, full-game return accounting, logging, determinism, checkpoint/resume,
evaluation, torchrun on gloo and the one-line errors for bad input."""

import glob
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_micro_batches_match, assert_one_line_error, run_in_process, scalars

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "ppo_atari.py")
sys.path.insert(0, str(ROOT))
import gpu_utils  # noqa: E402
import ppo_atari  # noqa: E402  (importing must have no side effects)
import run_utils  # noqa: E402

TINY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1", "--no-progress-bar"]
TINY += ["--env-threads", "1"]


def env_vars():
    env = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run(args, cwd, timeout=180, script=SCRIPT, prefix=()):
    cmd = [sys.executable, *prefix, *([script] if script else []), *args]
    return subprocess.run(cmd, cwd=cwd, env=env_vars(), capture_output=True, text=True, timeout=timeout)


def device_text(event_file):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(event_file)
    acc.Reload()
    return acc.Tensors("device/text_summary")[0].tensor_proto.string_val[0].decode()


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """Two iterations on Breakout (64 agent steps) that save a model and a checkpoint."""
    cwd = tmp_path_factory.mktemp("base")
    out = run([*TINY, "--total-timesteps", "64", "--save-model", "--checkpoint-every", "1"], cwd)
    assert out.returncode == 0, out.stderr
    (run_dir,) = glob.glob(str(cwd / "runs" / "*"))
    return cwd, Path(run_dir), out


def test_compute_gae_matches_hand_computation():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    values = torch.tensor([[0.5, 0.2], [0.4, 0.3], [0.6, 0.1]])
    dones = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # env 0 ends after t=0, env 1 after t=1 and t=2
    next_value, next_done = torch.tensor([0.7, 0.9]), torch.tensor([0.0, 1.0])
    adv, ret = ppo_atari.compute_gae(rewards, values, dones, next_value, next_done, gamma=0.9, gae_lambda=0.8)
    # env 0: A2 = 1 + .9*.7 - .6; A1 = (0 + .9*.6 - .4) + .72*A2; A0 = 1 - .5 (episode ends)
    # env 1: A2 = 1 - .1 (ends); A1 = 1 - .3 (ends); A0 = (0 + .9*.3 - .2) + .72*A1
    expected = torch.tensor([[0.5, 0.07 + 0.72 * 0.7], [0.14 + 0.72 * 1.03, 0.7], [1.03, 0.9]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + values)


def test_full_game_return_spans_lives():
    tracker = ppo_atari.EpisodeTracker(2, np.array([3, 2]))
    f, t = False, True
    steps = [  # rewards, terminated, truncated, lives (after a game over: the new game's lives, SameStep autoreset)
        ([5, 0], [f, f], [f, f], [3, 2]),
        ([-2, 7], [f, f], [f, f], [2, 2]),  # env 0 loses a life
        ([10, 0], [f, f], [f, f], [2, 1]),  # env 1 loses a life
        ([1, 3], [t, f], [f, f], [3, 1]),  # env 0 game over
        ([0, 0], [f, f], [f, t], [3, 2]),  # env 1 truncated
    ]
    dones, clipped, finished = [], [], []
    for r, te, tr, lives in steps:
        c, d, over, scores, lengths = tracker.step(np.array(r), np.array(te), np.array(tr), np.array(lives))
        clipped.append(c.tolist())
        dones.append(d.tolist())
        finished += [(int(i), float(scores[i]), int(lengths[i])) for i in np.flatnonzero(over)]
    assert dones == [[f, f], [t, f], [f, t], [t, f], [f, t]]
    assert clipped == [[1, 0], [-1, 1], [1, 0], [1, 1], [0, 0]]
    assert finished == [(0, 14.0, 4), (1, 10.0, 5)]  # raw score over all lives, length in agent steps


def test_two_iterations_write_expected_keys(base_run):
    cwd, run_dir, out = base_run
    tags = scalars(run_dir)
    for key in ["charts/SPS", "charts/learning_rate", "losses/value_loss", "losses/policy_loss", "losses/entropy"]:
        assert key in tags, key
    for key in [
        "losses/approx_kl",
        "losses/old_approx_kl",
        "losses/clipfrac",
        "losses/explained_variance",
        "threads/torch",
    ]:
        assert key in tags, key
    assert [s for s, _ in tags["charts/learning_rate"]] == [32, 64]
    assert [s for s, _ in tags["charts/SPS"]] == [64]  # warm-up iteration not counted
    assert "memory estimate" in out.stdout and "1,686,693 parameters" in out.stdout and "device: cpu" in out.stdout
    # where each setting came from: typed, or filled in from another (num_minibatches 2 -> minibatch_size 16)
    assert re.search(r"num_minibatches\s+2\s+\(command line\)", out.stdout)
    assert re.search(r"minibatch_size\s+16\s+\(derived\)", out.stdout)
    assert re.search(r"clip_coef\s+0.1\s+\(default\)", out.stdout)
    assert (run_dir / "checkpoint.pt").exists() and (run_dir / "ppo_atari.model").exists()
    for name in ["checkpoint.pt", "ppo_atari.model"]:  # each file names the script that wrote it
        assert torch.load(run_dir / name, weights_only=True)["script"] == "ppo_atari", name


def test_explained_variance_of_returns_that_do_not_vary_is_zero(tmp_path):
    """Before: with --gamma 0 and no point scored, every return is 0, Var(returns) is 0, and 1 - x / 0 was logged as
    -3.4e38 (nan_to_num of -inf), which wrecks any mean over the run."""
    out = run([*TINY, "--total-timesteps", "64", "--gamma", "0"], tmp_path)
    assert out.returncode == 0, out.stderr
    tags = scalars(glob.glob(str(tmp_path / "runs" / "*"))[0])
    assert [value for _, value in tags["losses/explained_variance"]] == [0.0, 0.0]


def test_episodic_return_logged(tmp_path):
    out = run([*TINY, "--total-timesteps", "512", "--num-steps", "128", "--num-minibatches", "1"], tmp_path)
    assert out.returncode == 0, out.stderr
    tags = scalars(glob.glob(str(tmp_path / "runs" / "*"))[0])
    # a random policy's Breakout game has 5 lives and lasts about 120+ agent steps; a life alone is ~25
    assert tags["charts/episodic_length"] and min(v for _, v in tags["charts/episodic_length"]) > 60


def test_same_seed_same_first_iteration_losses(base_run, tmp_path):
    out = run([*TINY, "--total-timesteps", "64"], tmp_path)
    assert out.returncode == 0, out.stderr
    first, second = scalars(base_run[1]), scalars(glob.glob(str(tmp_path / "runs" / "*"))[0])
    for key in ["losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/approx_kl"]:
        assert first[key][0] == second[key][0], key


def test_sigterm_checkpoint_then_resume_reaches_total(tmp_path):
    total = 32 * 60
    cmd = [sys.executable, SCRIPT, *TINY, "--total-timesteps", str(total), "--checkpoint-every", "1"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env_vars(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 120
    while not glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt")) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "stopping on SIGTERM" in stdout
    (ckpt_path,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    ckpt = run_utils.read_checkpoint(ckpt_path)
    assert ckpt["global_step"] < total and set(ckpt["rng"][0]) == {"torch", "cuda"}  # one entry per process
    assert ckpt["status"] == "stopped" and f"--resume runs/{ckpt['run_name']}/checkpoint.pt" in stdout
    out = run(["--resume", ckpt_path, "--no-progress-bar"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"done: step {total}/{total} in" in out.stdout
    assert len(glob.glob(str(tmp_path / "runs" / "*"))) == 1  # same run dir
    steps = [s for s, _ in scalars(Path(ckpt_path).parent)["charts/learning_rate"]]
    assert steps[-1] == total and len(set(steps)) == 60
    assert run_utils.read_checkpoint(ckpt_path)["status"] == "finished"
    # one event file per process, each naming the machine it ran on (a resume may run elsewhere)
    events = sorted(glob.glob(str(Path(ckpt_path).parent / "events.out.tfevents*")))
    assert len(events) == 2 and [device_text(f) for f in events] == [gpu_utils.device_label(torch.device("cpu"))] * 2


# runs the script as __main__, then writes this process's final weights where the test reads them
KEEP_WEIGHTS = """
import os, runpy, sys, torch
sys.argv = sys.argv[1:]
run = runpy.run_path(sys.argv[0], run_name="__main__")
torch.save(run["agent"].state_dict(), f"weights_{os.environ['RANK']}.pt")
"""
TORCHRUN = ["-m", "torch.distributed.run", "--nproc_per_node", "2"]
TORCHRUN_ARGS = [*TINY, "--gpu", "false", "--checkpoint-every", "1"]


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory):
    """Two processes on gloo, 2 iterations of 2 processes x 2 envs x 16 steps, each keeping its final weights."""
    cwd = tmp_path_factory.mktemp("torchrun")
    (cwd / "keep_weights.py").write_text(KEEP_WEIGHTS)
    prefix = [*TORCHRUN, "keep_weights.py", SCRIPT]
    out = run([*TORCHRUN_ARGS, "--total-timesteps", "128"], cwd, prefix=prefix, script="")
    assert out.returncode == 0, out.stderr
    return cwd, out


def test_torchrun_two_processes_gloo(torchrun_run):
    cwd, out = torchrun_run
    assert "done: step 128/128 in" in out.stdout  # 2 processes x 2 envs x 16 steps per iteration
    assert len(glob.glob(str(cwd / "runs" / "*"))) == 1  # only rank 0 logs


def test_torchrun_gradient_averaging_keeps_every_process_identical(torchrun_run):
    cwd, _ = torchrun_run
    first, second = (torch.load(cwd / f"weights_{rank}.pt") for rank in range(2))
    initial = ppo_atari.Agent(4).state_dict()
    for key, weight in first.items():
        assert torch.equal(weight, second[key]), key  # different envs and noise, the same averaged gradients
    assert not all(torch.equal(weight, initial[key]) for key, weight in first.items())  # and they did learn


@pytest.fixture(scope="module")
def bad_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad") / "other.pt"
    torch.save({"weights": [1, 2, 3]}, path)
    wrong = path.parent / "wrong.pt"  # this script's, with weights of another network and no training state
    torch.save(
        {"model": {"fc.weight": torch.zeros(2)}, "args": {"env_id": "ALE/Breakout-v5"}, "script": "ppo_atari"}, wrong
    )
    other = path.parent / "continuous.model"  # a saved model from before the script key: no longer read
    torch.save({"model": {}, "args": {"env_id": "Hopper-v5", "network_arch": "64,64"}}, other)
    named = path.parent / "snake.model"  # another script's, naming itself
    torch.save({"model": {}, "args": {"env_id": "ALE/Breakout-v5"}, "script": "dqn_snake_vec"}, named)
    return path, wrong, other, named


BAD_INPUT_BASE = ["--num-envs", "2", "--num-steps", "16", "--total-timesteps", "64", "--no-progress-bar"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--env-id", "ALE/NoSuchGame-v5"], "list valid ids"),
        (["--env-id", "CartPole-v1"], "unknown env id"),
        (["--gae-lambda", "1.5"], "--gae-lambda"),
        (["--gamma", "2"], "--gamma must be in [0, 1], got 2.0"),
        (["--clip-coef", "-1"], "--clip-coef must be positive"),
        (["--ent-coef", "-0.01"], "--ent-coef must be at least 0, got -0.01"),
        (["--vf-coef", "nan"], "--vf-coef must be at least 0, got nan"),  # min() of the two coefficients skipped it
        (["--max-grad-norm", "-1"], "--max-grad-norm must be positive"),  # would flip the gradients
        (["--target-kl", "-1"], "--target-kl must be positive"),  # would stop every update after one epoch
        (["--env-threads", "-3"], "--env-threads must be at least 0"),
        (["--seed", "-1"], "--seed must be from 0 to 2**30 - 1, got -1"),  # was numpy's traceback
        (["--seed", str(2**30)], "--seed must be from 0 to 2**30 - 1"),
        (["--minibatch-size", "7"], "valid sizes near it"),
        (
            ["--num-minibatches", "5"],
            "--num-minibatches 5 cannot split the total batch 32 (envs x steps) evenly; valid: 1, 2, 4",
        ),
        (["--gpu", "true"], "CUDA is not available"),
        (["--gpu", "3"], "asks for GPU 3"),
        (["--resume", "WRONG"], "holds no training state"),
        (["--eval-checkpoint", "OTHER"], "names no script, not ppo_atari.py"),
        (["--eval-checkpoint", "NAMED"], "was written by dqn_snake_vec.py, not ppo_atari.py"),
    ],
)
def test_bad_input_gives_one_line_error(args, needle, tmp_path, bad_checkpoint):
    """Refused before a run starts, so in this process (helpers.run_in_process); a fresh interpreter refuses the
    checkpoint that does not fit below."""
    if args[:1] == ["--gpu"] and torch.cuda.device_count() > (0 if args[1] == "true" else 3):
        pytest.skip("this machine can satisfy the request")
    files = dict(zip(["BAD", "WRONG", "OTHER", "NAMED"], map(str, bad_checkpoint)))
    args = [files.get(a, a) for a in args]
    base = BAD_INPUT_BASE
    if "--minibatch-size" not in args and "--num-minibatches" not in args:
        base = [*base, "--minibatch-size", "16"]
    assert_one_line_error(run_in_process(SCRIPT, [*base, *args], tmp_path), needle)


def test_a_large_seed_runs_and_resumes(tmp_path):
    """Before: env i was seeded with seed * 10,000 + i (+ 7,919 per iteration on --resume), past the int32 that ale-py
    takes from --seed 214,749 on (or on the resume of a long run with a smaller one): a bare TypeError at start."""
    out = run([*TINY, "--total-timesteps", "32", "--seed", str(2**30 - 1), "--checkpoint-every", "1"], tmp_path)
    assert out.returncode == 0, out.stderr
    (path,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    ckpt = torch.load(path, weights_only=True)
    ckpt["iteration"] = 10**6  # a long run's resume: the seeds of its new games move on 7,919 per iteration
    ckpt["args"]["total_timesteps"] = 32 * (10**6 + 1)
    torch.save(ckpt, path)
    out = run(["--resume", path, "--checkpoint-every", "0", "--no-progress-bar"], tmp_path, timeout=60)
    assert out.returncode == 0 and "resumed" in out.stdout, out.stderr[-2000:]


def test_a_checkpoint_that_does_not_fit_is_one_line_error(tmp_path, bad_checkpoint):
    """Found out when the weights load, after the checks: in a fresh interpreter."""
    args = [*BAD_INPUT_BASE, "--minibatch-size", "16", "--eval-checkpoint", str(bad_checkpoint[1])]
    assert_one_line_error(run(args, tmp_path, timeout=120), "does not fit")


def test_a_recorded_game_still_playing_when_the_run_ends_is_written_too(tmp_path):
    """Before: it was dropped, and a short run with --capture-video left an empty videos folder."""
    out = run([*TINY, "--total-timesteps", "32", "--capture-video"], tmp_path)  # Breakout's first game lasts longer
    assert out.returncode == 0, out.stderr
    videos = glob.glob(str(tmp_path / "videos" / "*" / "*.mp4"))
    assert [os.path.basename(v) for v in videos] == ["episode-0-unfinished.mp4"] and os.path.getsize(videos[0]) > 0


def test_video_recorder_writes_first_game(tmp_path):
    recorder = run_utils.VideoRecorder(str(tmp_path / "runs" / "a-run"), start_step=0, fps=15)
    stacks = np.random.default_rng(0).integers(0, 255, (10, 4, 84, 84), dtype=np.uint8)
    frames = [ppo_atari.agent_view(stack) for stack in stacks]
    assert frames[0].shape == (168, 168, 3) and np.array_equal(frames[0][::2, ::2, 1], stacks[0, -1])
    paths = [recorder.add(frame, game_over=i == 9) for i, frame in enumerate(frames)]
    assert paths[:9] == [None] * 9 and paths[9].endswith("episode-0.mp4") and os.path.getsize(paths[9]) > 0
    assert recorder.add(frames[0], game_over=True) is not None  # episode 1 is on the cubic schedule too
    assert recorder.add(frames[0], game_over=True) is None  # episode 2 is not


# ---------------------------------------------------------------- the trust review's defects


class FakeGames:
    """A vector env whose env i plays games of the lengths in games[i], in turn, scoring 1 point per step."""

    def __init__(self, games):
        self.games = games
        self.num_envs = len(games)
        self.played = [0] * self.num_envs
        self.t = np.zeros(self.num_envs, dtype=int)

    def obs(self):
        return np.zeros((self.num_envs, 4, 84, 84), dtype=np.uint8)

    def reset(self, seed=None):
        return self.obs(), {"lives": np.ones(self.num_envs)}

    def step(self, actions):
        self.t += 1
        lengths = [g[min(p, len(g) - 1)] for g, p in zip(self.games, self.played)]
        over = self.t >= np.array(lengths)
        for i in np.flatnonzero(over):
            self.played[i] += 1
            self.t[i] = 0
        return (
            self.obs(),
            np.ones(self.num_envs),
            over,
            np.zeros(self.num_envs, bool),
            {"lives": np.ones(self.num_envs)},
        )


def test_evaluate_counts_each_envs_first_game():
    # env 0 plays short games, env 1 one long game: the old "first N games to finish" would count env 0 twice
    envs = FakeGames([[2, 2, 2, 2, 2], [9], [3, 50]])
    scores = ppo_atari.evaluate(envs, lambda x: torch.zeros(len(x), dtype=torch.long), torch.device("cpu"), seed=0)
    assert scores.tolist() == [2.0, 9.0, 3.0] and scores.mean() == pytest.approx(14 / 3)


def test_time_limit_bootstraps_from_the_final_observation():
    """A game cut short by the frame cap (truncated, not over) is a done for GAE, but its reward carries
    gamma * V(last observation): the game did not end there."""
    envs = ppo_atari.make_envs("ALE/Breakout-v5", 2, threads=1, max_frames=200)  # 50 agent steps
    agent = ppo_atari.Agent(envs.single_action_space.n)
    torch.nn.init.constant_(agent.critic.bias, 3.0)  # a value far from 0, so a missing bootstrap shows
    obs, info = envs.reset(seed=1)
    steps = 0
    truncated = np.zeros(2, dtype=bool)
    while not truncated.any() and steps < 60:
        obs, reward, terminated, truncated, info = envs.step(np.zeros(2, dtype=np.int64))
        steps += 1
    assert truncated.all() and not terminated.any() and steps == 50
    values = ppo_atari.final_values(agent, info["final_obs"], truncated, terminated, torch.device("cpu"))
    with torch.no_grad():
        expected = agent(torch.as_tensor(info["final_obs"]))[1].numpy()
    np.testing.assert_allclose(values, expected, rtol=1e-6)
    assert not np.allclose(expected, agent(torch.as_tensor(obs))[1].detach().numpy())  # not the new game's obs
    cut_and_over = ppo_atari.final_values(agent, info["final_obs"], truncated, np.array([True, False]), "cpu")
    assert cut_and_over[0] == 0.0 and cut_and_over[1] == pytest.approx(expected[1])  # a real game over: no bootstrap
    envs.close()


def test_time_limited_run_reports_cut_games(tmp_path):
    out = run([*TINY, "--total-timesteps", "256", "--num-steps", "64", "--max-episode-frames", "200"], tmp_path)
    assert out.returncode == 0, out.stderr
    lengths = [v for _, v in scalars(glob.glob(str(tmp_path / "runs" / "*"))[0])["charts/episodic_length"]]
    assert lengths and max(lengths) <= 50


def test_amp_keeps_the_first_minibatch_ratio_at_one(tmp_path):
    out = run([*TINY, "--total-timesteps", "64", "--amp"], tmp_path)
    assert out.returncode == 0, out.stderr
    note = gpu_utils.bf16_note(torch.device("cpu"))  # this CPU's: said at start where bf16 is emulated
    assert (note in out.stdout) if note else ("amp: " not in out.stdout)
    errors = [v for _, v in scalars(glob.glob(str(tmp_path / "runs" / "*"))[0])["losses/initial_ratio_error"]]
    assert len(errors) == 2 and max(errors) < 1e-6


def test_torchrun_resume_restores_every_process_rng(torchrun_run, tmp_path):
    """Sampling noise and shuffles consume the same random numbers every iteration, so a run stopped after 2 of 3
    iterations and resumed must end with the RNG states of the run that went straight through, on every process."""
    (tmp_path / "full").mkdir()
    assert run([*TORCHRUN_ARGS, "--total-timesteps", "192"], tmp_path / "full", prefix=TORCHRUN).returncode == 0
    (done,) = glob.glob(str(torchrun_run[0] / "runs" / "*" / "checkpoint.pt"))  # 2 iterations of 128 steps
    ckpt = torch.load(done, weights_only=True)
    ckpt["args"]["total_timesteps"] = 192  # continue the run for one more iteration
    part = tmp_path / "part" / "runs" / ckpt["run_name"] / "checkpoint.pt"
    part.parent.mkdir(parents=True)
    torch.save(ckpt, part)
    out = run(["--resume", part, "--gpu", "false", "--no-progress-bar"], tmp_path / "part", prefix=TORCHRUN)
    assert out.returncode == 0, out.stderr
    (full,) = glob.glob(str(tmp_path / "full" / "runs" / "*" / "checkpoint.pt"))
    rng_full = torch.load(full, weights_only=True)["rng"]
    rng_part = torch.load(part, weights_only=True)["rng"]
    assert len(rng_full) == len(rng_part) == 2 and not torch.equal(rng_full[0]["torch"], rng_full[1]["torch"])
    for rank in range(2):
        assert torch.equal(rng_full[rank]["torch"], rng_part[rank]["torch"]), f"rank {rank}"


def test_micro_batches_give_the_full_minibatch_gradient():
    """ppo_atari's update_step splits a minibatch into micro-batches of --micro-batch rows, each loss weighted by its
    share of the rows before backward: the gradients and statistics add up to the whole minibatch's, up to float
    rounding (here 24 rows in micro-batches of 5: the last one is shorter)."""
    torch.manual_seed(0)
    agent = ppo_atari.Agent(4)
    params = list(agent.parameters())
    args = ppo_atari.Args(clip_coef=0.1, ent_coef=0.01, vf_coef=0.5, clip_vloss=True)
    n = 24
    batch = (
        torch.randint(0, 255, (n, 4, 84, 84), dtype=torch.uint8),
        torch.randint(0, 4, (n,)),
        torch.log(torch.full((n,), 0.25)) + 0.1 * torch.randn(n),
        torch.randn(n),
        torch.randn(n),
        torch.randn(n),
    )

    def loss(*rows):
        return ppo_atari.ppo_loss(agent, *rows, args)

    assert_micro_batches_match(loss, batch, params, 5, atol=1e-5)


def test_a_micro_batched_run_learns_as_the_whole_minibatch_run(base_run, tmp_path):
    """The run's own update with --micro-batch 5 (minibatches of 16 rows: 5 + 5 + 5 + 1) logs the same losses and ends
    with the same weights as base_run's whole minibatches, up to float rounding."""
    out = run([*TINY, "--total-timesteps", "64", "--save-model", "--micro-batch", "5"], tmp_path)
    assert out.returncode == 0, out.stderr
    (run_dir,) = glob.glob(str(tmp_path / "runs" / "*"))
    micro, whole = scalars(run_dir), scalars(base_run[1])
    assert {value for _, value in micro["memory/micro_batch"]} == {5}
    assert {value for _, value in whole["memory/micro_batch"]} == {16}
    for key in ["losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/approx_kl"]:
        np.testing.assert_allclose([v for _, v in micro[key]], [v for _, v in whole[key]], rtol=1e-3, atol=1e-6)
    model = torch.load(Path(run_dir) / "ppo_atari.model", weights_only=True)["model"]
    for key, weight in torch.load(base_run[1] / "ppo_atari.model", weights_only=True)["model"].items():
        torch.testing.assert_close(model[key], weight, atol=1e-4, rtol=1e-3)


# ---------------------------------------------------------------- the overlapped rollout (issue #22)


def test_two_halves_play_the_same_games_as_one_vector_env():
    """The overlapped rollout steps two vector envs of N/2 in turn (send one half, take the other's results); with the
    same actions every env must see exactly what it sees in one vector env of N: observations, rewards, game overs,
    frame-cap cuts with their last observations, lives, and so the same learning dones and finished games."""
    whole = ppo_atari.make_envs("ALE/Breakout-v5", 4, threads=1, max_frames=400)  # 100 agent steps: some are cut
    halves = [ppo_atari.make_envs("ALE/Breakout-v5", 2, threads=1, max_frames=400) for _ in range(2)]
    rows = [slice(0, 2), slice(2, 4)]
    obs, info = whole.reset(seed=123)
    trackers = [ppo_atari.EpisodeTracker(4, info["lives"]), []]
    half_obs = np.zeros_like(obs)
    for r, envs in zip(rows, halves):
        half_obs[r], half_info = envs.reset(seed=123 + r.start)
        trackers[1].append(ppo_atari.EpisodeTracker(2, half_info["lives"]))
    assert np.array_equal(obs, half_obs)
    rng = np.random.default_rng(0)
    cut = 0
    halves[1].send(np.zeros(2, dtype=np.int64))  # the pipeline's state mid-rollout: half 1 is already playing
    next_actions = np.zeros(4, dtype=np.int64)
    for _ in range(160):
        action = next_actions
        obs, reward, terminated, truncated, info = whole.step(action)
        expected = trackers[0].step(reward, terminated, truncated, info["lives"])
        halves[0].send(action[rows[0]])
        results = {1: halves[1].recv(), 0: halves[0].recv()}  # half 1 was sent first, half 0 while it played
        next_actions = rng.integers(0, 4, 4)
        halves[1].send(next_actions[rows[1]])
        for g in (0, 1):
            h_obs, h_reward, h_terminated, h_truncated, h_info = results[g]
            r = rows[g]
            assert np.array_equal(h_obs, obs[r]) and np.array_equal(h_reward, reward[r])
            assert np.array_equal(h_terminated, terminated[r]) and np.array_equal(h_truncated, truncated[r])
            if h_truncated.any():
                assert np.array_equal(h_info["final_obs"][h_truncated], info["final_obs"][r][h_truncated])
            got = trackers[1][g].step(h_reward, h_terminated, h_truncated, h_info["lives"])
            for want, have in zip(expected, got):
                assert np.array_equal(want[r], have)
        cut += int(truncated.sum())
    assert cut > 0  # the frame cap was exercised
    for envs in [whole, *halves]:
        envs.close()


# runs the script as __main__ with a video recorder that keeps each frame it is given (with whether it ended a game)
# and the first vector env made (env group 0, whose env 0 is recorded) keeping what each recv() handed back:
# observations, game overs and last observations; both go to recorded.npz
KEEP_FRAMES = """
import runpy, sys, ale_py, numpy as np, run_utils
frames, results = [], []
class Recorder:
    def __init__(self, *args, **kwargs):
        pass
    def add(self, frame, game_over):
        frames.append((frame.copy(), game_over))
    def close(self):
        return None
class Logged(ale_py.AtariVectorEnv):
    made = 0
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.logged = Logged.made == 0
        Logged.made += 1
    def recv(self):
        obs, reward, terminated, truncated, info = super().recv()
        if self.logged:
            final_obs = info["final_obs"][0] if "final_obs" in info else np.zeros_like(obs[0])
            results.append((obs[0].copy(), bool(terminated[0] or truncated[0]), np.array(final_obs)))
        return obs, reward, terminated, truncated, info
run_utils.VideoRecorder = Recorder
ale_py.AtariVectorEnv = Logged
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
np.savez(
    "recorded.npz",
    frames=np.array([f for f, _ in frames]),
    frame_over=np.array([o for _, o in frames]),
    obs=np.array([r[0] for r in results]),
    over=np.array([r[1] for r in results]),
    final_obs=np.array([r[2] for r in results]),
)
"""


def test_a_recorded_game_ends_on_its_own_last_frame(tmp_path):
    """Before: the frame recorded at a game over was the observation after the step, which SameStep auto-reset makes
    the next game's first; a game's last frame is in info["final_obs"]. A run of 25 steps of 2 envs in two halves,
    games cut short after 10 agent steps: env 0's frames are its observations, its two games' last frames their own."""
    (tmp_path / "keep_frames.py").write_text(KEEP_FRAMES)
    args = [*TINY, "--num-steps", "25", "--total-timesteps", "50", "--max-episode-frames", "40", "--capture-video"]
    out = run(args, tmp_path, prefix=["keep_frames.py"])
    assert out.returncode == 0, out.stderr
    assert "2 envs in 2 group(s)" in out.stdout
    got = np.load(tmp_path / "recorded.npz")
    assert len(got["frames"]) == len(got["obs"]) == 25
    assert got["frame_over"].tolist() == got["over"].tolist()
    ends = 0
    for frame, over, after, final_obs in zip(got["frames"], got["over"], got["obs"], got["final_obs"]):
        expected = final_obs if over else after
        assert np.array_equal(frame, ppo_atari.agent_view(expected))
        ends += over
        if over:  # the two differ, so the check above tells them apart
            assert not np.array_equal(frame, ppo_atari.agent_view(after))
    assert ends == 2


def test_overlapped_rollout_keeps_the_games_and_the_learning(tmp_path):
    """At the same seed the overlapped and sequential rollouts play the same games (the CPU's random stream gives the
    two halves the rows of the whole batch's noise): identical episodes, weights equal up to float rounding (the
    policy runs on batches of N/2 rows)."""
    args = [*TINY, "--num-envs", "4", "--num-steps", "64", "--total-timesteps", "512", "--max-episode-frames", "200"]
    result = {}
    for flag in ["--overlap-envs", "--no-overlap-envs"]:
        (tmp_path / flag).mkdir()
        out = run([*args, flag, "--save-model"], tmp_path / flag)
        assert out.returncode == 0, out.stderr
        (run_dir,) = glob.glob(str(tmp_path / flag / "runs" / "*"))
        tags = scalars(run_dir)
        model = torch.load(Path(run_dir) / "ppo_atari.model", weights_only=True)["model"]
        result[flag] = (tags["charts/episodic_return"], tags["charts/episodic_length"], model, out.stdout)
    overlapped, sequential = result["--overlap-envs"], result["--no-overlap-envs"]
    assert "4 envs in 2 group(s)" in overlapped[3] and "4 envs in 1 group(s)" in sequential[3]
    assert len(overlapped[0]) > 4 and overlapped[:2] == sequential[:2]  # the same games, step for step
    for key, weight in sequential[2].items():
        torch.testing.assert_close(overlapped[2][key], weight, atol=1e-4, rtol=1e-3)


@pytest.mark.gpu
def test_captured_update_learns_as_the_eager_one(tmp_path):
    """--cudagraphs captures each minibatch step (forward, backward, clipping, Adam) as one CUDA graph; after a few
    iterations its weights must equal the eager update's (--compile, the same compiled loss) up to float rounding:
    capturable Adam computes its bias corrections on the device in float32."""
    args = [*TINY, "--num-envs", "8", "--total-timesteps", "512", "--gpu", "true", "--save-model"]  # 4 iterations
    models = {}
    for flag in ["--compile", "--cudagraphs"]:
        (tmp_path / flag).mkdir()
        out = run([*args, flag], tmp_path / flag, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "update: eager" not in out.stdout, out.stdout  # --cudagraphs: captured, no fallback said
        assert ("update: one CUDA graph" in out.stdout) == (flag == "--cudagraphs"), out.stdout
        (path,) = glob.glob(str(tmp_path / flag / "runs" / "*" / "ppo_atari.model"))
        models[flag] = torch.load(path, weights_only=True)["model"]
    for key, weight in models["--compile"].items():
        torch.testing.assert_close(models["--cudagraphs"][key], weight, atol=1e-4, rtol=1e-3)


# runs the script as __main__ with Adam.step raising a CUDA out-of-memory error once, in process RANK 1 only: after
# the gradients' all_reduce, where a retry would issue one all_reduce more than the other process
OOM_IN_ADAM_STEP = """
import os, runpy, sys, torch
step = torch.optim.Adam.step
calls = []
def failing_step(self, *args, **kwargs):
    calls.append(1)
    if os.environ["RANK"] == "1" and len(calls) == 1:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected in Adam.step)")
    return step(self, *args, **kwargs)
torch.optim.Adam.step = failing_step
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_torchrun_out_of_memory_after_the_all_reduce_is_not_retried(tmp_path):
    """The back-off retries what precedes the gradients' all_reduce (the forward and backward passes), never the
    all_reduce itself: a retry there issued one collective more in one process than in the other ("Received data size
    doesn't match expected size", SIGABRT on gloo; a hang or wrong sums on NCCL). An out-of-memory error in Adam's
    step is the error it is, in the process it happened in."""
    (tmp_path / "oom_in_step.py").write_text(OOM_IN_ADAM_STEP)
    prefix = [*TORCHRUN, "oom_in_step.py", SCRIPT]
    out = run([*TORCHRUN_ARGS, "--total-timesteps", "128"], tmp_path, prefix=prefix, script="", timeout=120)
    assert out.returncode != 0
    assert "CUDA out of memory (injected in Adam.step)" in out.stderr, out.stderr[-3000:]
    assert "micro-batch: CUDA out of memory" not in out.stdout, "an error past the all_reduce was retried"
    assert "doesn't match expected size" not in out.stderr and "SIGABRT" not in out.stderr, out.stderr[-3000:]


def test_torchrun_prints_progress_lines_from_the_first_process_only(torchrun_run):
    """Without a progress bar each iteration's line comes once, from rank 0 (every other rank printed it too)."""
    _, out = torchrun_run
    assert out.stdout.count("iteration 2/2: step 128") == 1, out.stdout


def test_a_rollout_that_acts_with_a_copy_never_synced_warns_once_naming_the_iteration(tmp_path):
    """The rollout acts with a copy of the agent that no update reaches: iteration 1's ratios are 1 (the copy still
    equals the agent), the later ones are not. Before #63 only the first iteration was checked: no warning."""
    text = Path(SCRIPT).read_text()
    params_line = "    params = list(agent.parameters())\n"
    step_line = "        logits, value = agent(x)\n"
    assert params_line in text and step_line in text
    text = text.replace(params_line, params_line + "    actor = __import__('copy').deepcopy(agent)\n")
    (tmp_path / "edited.py").write_text(text.replace(step_line, "        logits, value = actor(x)\n"))
    args = [*TINY, "--total-timesteps", "96", "--learning-rate", "2.5e-3"]
    res = run(args, tmp_path, script=str(tmp_path / "edited.py"))
    assert res.returncode == 0, res.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    errors = [value for _, value in scalars(run_dir)["losses/initial_ratio_error"]]
    assert errors[0] < 1e-6 and min(errors[1:]) > ppo_atari.RATIO_ERROR_WARNING, errors
    warnings = [line for line in res.stdout.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: iteration 2: "), res.stdout
    assert "one distribution (Categorical)" in warnings[0]


@pytest.mark.parametrize("shape", [(5, 6), (3, 4, 6), (6,)])
def test_categorical_matches_torch_on_masked_logits_and_batched_shapes(shape):
    """ppo_atari.Categorical against torch.distributions.Categorical: log_prob, entropy and the sample's support, with
    an action masked by a -inf logit (a common hack) and actions of any batch shape. Before #63: entropy NaN where a
    logit is -inf, and log_prob of a 2-D batch of actions the wrong shape."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(shape, generator=generator) * 3
    logits[..., 2] = -float("inf")
    ours, theirs = ppo_atari.Categorical(logits), torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(ours.entropy(), theirs.entropy())
    assert ours.entropy().isfinite().all()
    actions = theirs.sample((7,))  # (7, *batch): a batch of actions broadcast against the logits' batch
    torch.testing.assert_close(ours.log_prob(actions), theirs.log_prob(actions))
    torch.testing.assert_close(ours.log_prob(actions[0]), theirs.log_prob(actions[0]))
    torch.manual_seed(0)
    drawn = torch.stack([ours.sample() for _ in range(200)])
    assert drawn.shape == (200, *shape[:-1]) and not (drawn == 2).any()
    probs = torch.nn.functional.one_hot(drawn, shape[-1]).float().mean(0)
    torch.testing.assert_close(probs, theirs.probs, atol=0.15, rtol=0)
