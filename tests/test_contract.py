"""The contract every script shares (issue #26), one parametrised test per clause over ppo_atari.py, ppo_continuous.py
and dqn_snake_vec.py: bad input is one `error: ...` line (exit 2, no traceback), `--eval-checkpoint` reads both a
checkpoint.pt and a --save-model file, and another script's checkpoint is refused by the name of the script that wrote
it. One tiny CPU run per script (module-scoped) serves every test. A command line that ends before a run starts (bad
input, nothing to do) runs in this process (helpers.run_in_process), each script's once in a fresh interpreter too.
Script-specific checks stay in each script's file."""

import functools
import glob
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import SIGNAL_IN_SETUP, assert_one_line_error, at_update_prefix, oom_prefix, run_in_process, scalars

import run_utils

ROOT = Path(__file__).resolve().parents[1]

# the smallest CPU budget each script's own tests use, one run that saves a model and a checkpoint
TINY = {
    "ppo_atari": ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1"]
    + ["--env-threads", "1", "--total-timesteps", "64", "--checkpoint-every", "1"]
    + ["--max-episode-frames", "100"],  # a frame cap at agent step 25: the fingerprint holds its bootstrap and a game
    "ppo_continuous": ["--env-id", "Pendulum-v1", "--num-steps", "64", "--num-minibatches", "2"]
    + ["--update-epochs", "1", "--gpu", "false", "--total-timesteps", "256"],  # Pendulum's time limit at step 200
    "dqn_snake_vec": ["--num-envs", "32", "--batch-size", "32", "--buffer-size", "4096", "--learning-starts", "128"]
    + ["--log-every", "256", "--height", "6", "--width", "6", "--num-threads", "1", "--total-timesteps", "256"],
}
EVAL = {  # the eval line's environment name after the run above
    "ppo_atari": "ALE/Breakout-v5",
    "ppo_continuous": "Pendulum-v1",
    "dqn_snake_vec": "Snake6x6",
}
SCRIPTS = list(TINY)


def script_env() -> dict:
    """A script's environment here: W&B offline, one thread, this checkout importable."""
    env = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run(script, args, cwd, timeout=240):
    cmd = [sys.executable, str(ROOT / f"{script}.py"), "--no-progress-bar", *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=script_env(), capture_output=True, text=True, timeout=timeout)


def start(script, args, cwd, **popen) -> subprocess.Popen:
    """``run``'s command as a process to signal or read while it runs: its stdout a text pipe, ``popen`` passed on."""
    cmd = [sys.executable, str(ROOT / f"{script}.py"), "--no-progress-bar", *map(str, args)]
    return subprocess.Popen(cmd, cwd=cwd, env=script_env(), stdout=subprocess.PIPE, text=True, **popen)


def cli(script, args, cwd):
    """The script's command line in this process: for one that ends before a run starts (helpers.run_in_process)."""
    return run_in_process(ROOT / f"{script}.py", ["--no-progress-bar", *args], cwd)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """Each script's run directory after one tiny run with --save-model (computed once per script, on demand)."""
    runs = {}

    def get(script):
        if script not in runs:
            cwd = tmp_path_factory.mktemp(script)
            res = run(script, [*TINY[script], "--save-model"], cwd)
            assert res.returncode == 0, res.stderr[-2000:]
            (run_dir,) = glob.glob(str(cwd / "runs" / "*"))
            runs[script] = Path(run_dir)
        return runs[script]

    return get


@pytest.mark.parametrize("script", SCRIPTS)
def test_bad_input_is_one_line_error_in_a_fresh_interpreter(script, tmp_path):
    """The tests below refuse their input in this process; here a new interpreter does, where a warning printed at
    import or by a library's C code would reach stderr beside the error line."""
    assert_one_line_error(run(script, [*TINY[script], "--learning-rate", "-1"], tmp_path), "--learning-rate")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag", ["--resume", "--eval-checkpoint"])
def test_missing_file_is_one_line_error(script, flag, tmp_path):
    assert_one_line_error(cli(script, [flag, "missing.pt"], tmp_path), "missing.pt", "does not exist")
    (tmp_path / "a_run").mkdir()  # a run's folder, not its checkpoint.pt: before, it "did not exist"
    assert_one_line_error(
        cli(script, [flag, "a_run"], tmp_path), "'a_run' is a folder; pass the path of a checkpoint.pt"
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag", ["--resume", "--eval-checkpoint"])
def test_a_file_that_is_no_checkpoint_is_one_line_error(script, flag, tmp_path):
    torch.save({"weights": [1, 2, 3]}, tmp_path / "garbage.pt")
    assert_one_line_error(cli(script, [flag, "garbage.pt"], tmp_path), f"not a {script} checkpoint")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--learning-rate", "-1", ["--learning-rate must be at least 0, got -1.0"]),  # was torch's bare traceback
        ("--checkpoint-every", "-1", ["--checkpoint-every must be at least 0", "got -1"]),  # was: every iteration
        ("--seed", str(2**32), ["--seed must be from 0 to 2**", "got 4294967296"]),  # was numpy's bare traceback
        # was "cannot make runs/... here; start the run in a writable folder", after the device lines
        ("--exp-name", "a/b", ["--exp-name names the run's folder: give one without '/', got 'a/b'"]),
        ("--exp-name", "", ["--exp-name names the run's folder"]),  # was a folder named Pendulum-v1____1__<time>
    ],
)
def test_settings_shared_by_every_script_are_checked_the_same_way(script, flag, value, words, tmp_path):
    assert_one_line_error(cli(script, [*TINY[script], flag, value], tmp_path), *words)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_resume_with_eval_checkpoint_is_one_line_error(script, finished, tmp_path):
    """Before: a finished run's --resume said 'nothing to do' and did not evaluate; an unfinished one's was ignored."""
    run_dir = finished(script)
    args = ["--resume", run_dir / "checkpoint.pt", "--eval-checkpoint", run_dir / f"{script}.model"]
    assert_one_line_error(cli(script, args, tmp_path), "--resume trains and --eval-checkpoint evaluates: pass one")


@pytest.mark.parametrize("script", SCRIPTS)
def test_eval_checkpoint_under_torchrun_is_one_line_error(script, finished, tmp_path, monkeypatch):
    """Before: every process of the job evaluated the file, each printing its own result line."""
    args = ["--eval-checkpoint", finished(script) / f"{script}.model"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert_one_line_error(cli(script, args, tmp_path), "--eval-checkpoint runs in one process: start it with python")


@pytest.mark.parametrize("script", ["ppo_continuous", "dqn_snake_vec"])
def test_a_script_without_a_torchrun_mode_under_torchrun_is_one_line_error(script, tmp_path, monkeypatch):
    """Before: each process acted as the only one; each printed the config, the second found the run folder in use,
    and torchrun stopped the first with a traceback. ppo_atari.py has a torchrun mode."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    res = cli(script, TINY[script], tmp_path)
    assert_one_line_error(res, f"{script}.py runs in one process: start it with python, not torchrun")
    assert not (tmp_path / "runs").exists()


def test_a_run_folder_that_cannot_be_written_is_one_line_error(tmp_path):
    """Before: resuming a read-only copy of a run ended in TensorBoard's OSError traceback."""

    read_only = "def refuse(*args, **kwargs):\n    raise OSError(30, 'Read-only file system')\n"
    read_only += "import runpy, sys, run_utils\nrun_utils.SummaryWriter = refuse\nsys.argv = sys.argv[1:]\n"
    read_only += "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    res = run_with(["-c", read_only], "ppo_continuous", TINY["ppo_continuous"], tmp_path)
    assert_one_line_error(res, "cannot write the run's logs in runs/Pendulum-v1__ppo_continuous__1__")
    assert "(Read-only file system); use a writable copy" in res.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_eval_saved_model_and_checkpoint(script, finished, tmp_path):
    run_dir = finished(script)
    for path in [run_dir / f"{script}.model", run_dir / "checkpoint.pt"]:
        assert run_utils.read_checkpoint(path)["script"] == script  # each file names the script that wrote it
        res = run(script, ["--eval-checkpoint", path, "--eval-episodes", "2"], tmp_path)
        assert res.returncode == 0, res.stderr[-2000:]
        assert f"eval {EVAL[script]}: mean return" in res.stdout and "+-" in res.stdout, res.stdout
        assert "over 2 episodes" in res.stdout, res.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_ctrl_c_during_eval_checkpoint_is_one_line(script, finished, tmp_path):
    """Ctrl-C while --eval-checkpoint evaluates: one line and status 130. Before: a KeyboardInterrupt traceback, and
    a C++ abort ("libc++abi: terminating") when it arrived inside MuJoCo's warning callback while envs were made."""
    interrupt = "import os, runpy, signal, sys, run_utils\nload = run_utils.load_states\n"
    interrupt += "def load_then_ctrl_c(*args):\n    load(*args)\n    os.kill(os.getpid(), signal.SIGINT)\n"
    interrupt += "run_utils.load_states = load_then_ctrl_c\nsys.argv = sys.argv[1:]\n"
    interrupt += "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    res = run_with(["-c", interrupt], script, ["--eval-checkpoint", finished(script) / "checkpoint.pt"], tmp_path)
    assert res.returncode == 130, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == "stopped on SIGINT: nothing was written", res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "eval " not in res.stdout
    assert not (tmp_path / "runs").exists()


def test_a_run_whose_stdout_closes_stops_with_its_checkpoint(tmp_path):
    """`python ppo_continuous.py ... | head`: the run's output comes line by line, and once its reader has gone the
    run stops as on a signal, with its checkpoint and the command that continues it on stderr. Before: output in 8 KB
    blocks, then a BrokenPipeError traceback from a print mid-run, and no checkpoint. One script: run_utils's."""
    args = [*TINY["ppo_continuous"][:-1], "25600"]  # 400 iterations: far more than it makes before the reader goes
    proc = start("ppo_continuous", args, tmp_path, stderr=subprocess.PIPE)
    for line in proc.stdout:
        if line.startswith("iteration 1/"):
            break
    proc.stdout.close()  # the reader goes, as `head` does
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, stderr[-2000:]
    assert "Traceback" not in stderr and "stopping on a closed stdout: checkpoint at step " in stderr, stderr[-2000:]
    (checkpoint,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    assert run_utils.read_checkpoint(checkpoint)["status"] == "stopped"


def test_a_closed_terminal_stops_a_run_with_its_checkpoint_and_each_stop_is_said_at_once(tmp_path):
    """SIGHUP (the terminal or ssh session closed) stops a run as Ctrl-C does, and the first stop signal is answered at
    once on stderr, not only when the iteration ends. Before: SIGHUP killed the run with no checkpoint."""
    proc = start("ppo_continuous", [*TINY["ppo_continuous"][:-1], "25600"], tmp_path, stderr=subprocess.PIPE)
    for line in proc.stdout:
        if line.startswith("iteration 1/"):
            proc.send_signal(signal.SIGHUP)
            break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert "SIGHUP: stopping after this iteration, with a checkpoint\n" in err, err[-2000:]
    assert "stopping on SIGHUP: checkpoint at step " in out, out[-2000:]
    (checkpoint,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    assert run_utils.read_checkpoint(checkpoint)["status"] == "stopped"


def test_a_run_started_with_nohup_outlives_its_terminal(tmp_path):
    """`nohup python ppo_continuous.py ... &`: the SIGHUP it was told to ignore stays ignored (the run goes on), while
    SIGTERM still stops it with its checkpoint."""
    nohup = functools.partial(signal.signal, signal.SIGHUP, signal.SIG_IGN)
    proc = start("ppo_continuous", [*TINY["ppo_continuous"][:-1], "25600"], tmp_path, preexec_fn=nohup)
    seen = []
    for line in proc.stdout:
        seen += [line] if line.startswith("iteration ") else []
        if len(seen) == 1:
            proc.send_signal(signal.SIGHUP)
        if len(seen) == 3:  # two iterations after the SIGHUP: it goes on
            proc.send_signal(signal.SIGTERM)
            break
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0 and "stopping on SIGTERM" in out and "SIGHUP" not in out, out[-2000:]


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_stop_after_the_end_of_a_run_leaves_it_finished(script, tmp_path):
    """A SIGTERM that comes after the done line (a sweep stopped as the run ended) is ignored: the run's work is done.
    Before: in the interpreter's teardown (0.7 s here) it killed the finished run, status -15, which a sweep reported
    as a run stopped before its first checkpoint (a CI failure of tests/test_sweeps.py, 2026-11-27)."""
    proc = start(script, TINY[script], tmp_path, stderr=subprocess.PIPE)
    for line in proc.stdout:
        if line.startswith("done: "):
            time.sleep(0.05)  # into the teardown
            proc.send_signal(signal.SIGTERM)
            break
    err = proc.communicate(timeout=120)[1]
    # 0.05 s may still be before Run.exit under load (closing the logs and envs): the handler then notes a stop that
    # nothing reads, and the run ends as it would have
    assert proc.returncode == 0, err[-2000:]
    (checkpoint,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    assert run_utils.read_checkpoint(checkpoint)["status"] == "finished"


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path, monkeypatch):
    """Two new runs with the same env, exp_name and seed in one second: the second takes the next second's name.
    Before: it was refused as 'in use by a live run', or wrote into the first one's folder once that had ended."""
    monkeypatch.chdir(tmp_path)
    names = [run_utils.new_run_dir("Pendulum-v1__ppo_continuous__1__1795748268") for _ in range(3)]
    assert names == [f"Pendulum-v1__ppo_continuous__1__{1795748268 + k}" for k in range(3)]
    assert sorted(os.listdir("runs")) == names


def test_a_new_run_where_no_runs_folder_can_be_made_is_one_line(tmp_path):
    """Before: a NotADirectoryError (or a read-only file system's OSError) traceback from the run folder's lock."""
    (tmp_path / "runs").write_text("not a folder")
    res = run("ppo_continuous", TINY["ppo_continuous"], tmp_path)
    assert_one_line_error(
        res, "cannot make runs/Pendulum-v1__ppo_continuous__1__", "start the run in a writable folder"
    )


def test_the_continue_with_command_of_a_torchrun_job_is_a_torchrun_command(monkeypatch):
    """Before: `python ppo_atari.py ... --resume ...`, which one process cannot resume (the checkpoint holds each
    process's random state): 'the checkpoint is from 2 processes; resume with as many'."""
    monkeypatch.setattr(sys, "argv", ["ppo_atari.py", "--env-id", "ALE/Pong-v5", "--resume", "old.pt"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    expected = "torchrun --nproc-per-node=2 ppo_atari.py --env-id ALE/Pong-v5 --resume runs/r/checkpoint.pt"
    assert run_utils.resume_command("runs/r/checkpoint.pt") == expected
    monkeypatch.setenv("WORLD_SIZE", "4")  # two nodes of two
    assert run_utils.resume_command("c.pt").startswith("torchrun --nproc-per-node=2 --nnodes=2 ppo_atari.py ")


@pytest.mark.parametrize("script", SCRIPTS)
def test_eval_checkpoint_ignores_the_training_sizes(script, finished, tmp_path):
    """An evaluation plays --eval-episodes games: --num-envs and --total-timesteps that could not train do not stop
    it. Before, ppo_atari said `--minibatch-size 256 does not divide the total batch 384` or `--total-timesteps must
    be at least one batch`."""
    sizes = ["--num-envs", "3", "--total-timesteps", "10"]
    # and a rollout that no minibatch count divides: before, ppo_continuous said "--num-minibatches 32 cannot split
    # the total batch 300 (envs x steps) evenly"
    sizes += [] if script == "dqn_snake_vec" else ["--num-steps", "100"]
    res = run(
        script, ["--eval-checkpoint", finished(script) / "checkpoint.pt", "--eval-episodes", "1", *sizes], tmp_path
    )
    assert res.returncode == 0 and f"eval {EVAL[script]}: mean return" in res.stdout, res.stderr[-2000:]


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag", ["--resume", "--eval-checkpoint"])
def test_an_empty_checkpoint_path_is_one_line(script, flag, tmp_path):
    """`--resume "$CKPT"` with CKPT unset. Before: an empty path counted as none, and a new run (10M steps for
    ppo_atari) started."""
    assert_one_line_error(cli(script, [flag, ""], tmp_path), f"{flag} needs a checkpoint's path, got an empty one")


def test_a_checkpoint_cut_short_says_so(finished, tmp_path):
    """Before: 'cannot read checkpoint ... (OSError); it is not a file a script of this repository wrote', of a file
    the script had written itself, cut short by a full disk or a copy stopped halfway."""
    whole = (finished("ppo_continuous") / "checkpoint.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(whole[: len(whole) // 2])
    res = cli("ppo_continuous", ["--eval-checkpoint", tmp_path / "cut.pt"], tmp_path)
    assert_one_line_error(res, "cannot read checkpoint", "it is cut short or damaged")


class OneFrameGame(gym.Env):
    """A game that ends at its first step and renders a black frame: a video of one game without a renderer."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,))
    action_space = gym.spaces.Box(-1.0, 1.0, (1,))
    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}
    render_mode = "rgb_array"

    def reset(self, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 0.0, True, False, {}

    def render(self):
        return np.zeros((16, 16, 3), np.uint8)


def test_a_video_ffmpeg_cannot_write_is_a_warning_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    """A Ctrl-C to the process group stops ffmpeg mid-write: the video is dropped with a warning, and the run goes on
    to stop cleanly with its checkpoint. Before: moviepy's OSError (Broken pipe) ended the run without one, in all
    three scripts (run_utils.VideoRecorder; ppo_continuous's gymnasium RecordVideo)."""
    import moviepy

    import continuous_envs

    def broken_pipe(*args, **kwargs):
        raise OSError(32, "Broken pipe")

    monkeypatch.setattr(moviepy.ImageSequenceClip, "write_videofile", broken_pipe)
    recorder = run_utils.VideoRecorder(str(tmp_path / "runs" / "atari"), start_step=0, fps=15)
    assert recorder.add(np.zeros((16, 16, 3), np.uint8), game_over=True) is None  # game 0: recorded, then written
    assert recorder.frames == [] and recorder.episode == 1
    assert "warning: video " in capsys.readouterr().err
    env = continuous_envs.RecordVideo(OneFrameGame(), str(tmp_path / "mujoco"), lambda game: game == 0)
    env.reset(seed=0)
    env.step(np.zeros(1, np.float32))
    env.reset(seed=1)  # the next game: the last one's video is written, and fails
    assert not env.recording and env.recorded_frames == []
    assert "warning: video rl-video-episode-0.mp4 not written (" in capsys.readouterr().err
    env.close()


@pytest.mark.parametrize("reader, writer", [(r, w) for r in SCRIPTS for w in SCRIPTS if r != w])
@pytest.mark.parametrize("file", ["checkpoint.pt", "model"])
def test_another_scripts_file_names_the_script_that_wrote_it(reader, writer, file, finished, tmp_path):
    path = finished(writer) / (f"{writer}.model" if file == "model" else file)
    flag = "--resume" if file == "checkpoint.pt" else "--eval-checkpoint"
    res = cli(reader, [flag, path], tmp_path)
    assert_one_line_error(res, f"was written by {writer}.py, not {reader}.py")
    assert not (tmp_path / "runs").exists()


BATCH = {"ppo_atari": 32, "ppo_continuous": 64, "dqn_snake_vec": 32}  # agent steps per iteration of TINY


@pytest.mark.parametrize("script", SCRIPTS)
def test_sigterm_checkpoint_then_resume_reaches_total(script, tmp_path):
    env = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    args = [*TINY[script], "--total-timesteps", "10000000", "--log-every", "32"][
        : None if script == "dqn_snake_vec" else -2
    ]
    cmd = [sys.executable, str(ROOT / f"{script}.py"), "--no-progress-bar", *args]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if sum(ln.startswith("iteration ") for ln in lines) >= 3:
            proc.send_signal(signal.SIGTERM)
            break
    out = "".join(lines) + proc.stdout.read()
    assert proc.wait(timeout=120) == 0, out[-2000:]
    assert "stopping on SIGTERM" in out, out[-2000:]
    (ckpt_path,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    ckpt = run_utils.read_checkpoint(ckpt_path)
    stopped = ckpt["global_step"]
    assert ckpt["status"] == "stopped" and 0 < stopped < 10000000
    # the same command with --resume: the flags of how it runs (--track, --save-model, ...) come along; and this
    # Python, which a bare `python` is not where the venv is not active (before: always `python`)
    on_path = shutil.which("python")
    python = "python" if on_path and os.path.realpath(on_path) == os.path.realpath(sys.executable) else sys.executable
    resume = [python, str(ROOT / f"{script}.py"), "--no-progress-bar", *args, "--resume"]
    assert f"continue with: {shlex.join(resume)} runs/{ckpt['run_name']}/checkpoint.pt\n" in out, out
    total = stopped + 4 * BATCH[script]
    ckpt["args"]["total_timesteps"] = total  # shorten the run so the test stays fast
    torch.save(ckpt, ckpt_path)
    log_every = ["--log-every", "32"] if script == "dqn_snake_vec" else []  # a runtime flag: not kept in the run
    elsewhere = tmp_path / "elsewhere"  # resumed from another folder: it still continues the run's own folder
    elsewhere.mkdir()
    res = run(script, ["--resume", ckpt_path, *log_every], elsewhere)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"at step {stopped}" in res.stdout and f"step {total}, SPS" in res.stdout, res.stdout
    assert len(glob.glob(str(tmp_path / "runs" / "*"))) == 1  # the same run directory
    assert not (elsewhere / "runs").exists()  # before: a second run folder there, the logs split between the two
    assert run_utils.read_checkpoint(ckpt_path)["status"] == "finished"
    steps = [step for step, _ in scalars(Path(ckpt_path).parent)["charts/learning_rate"]]  # every iteration, both legs
    assert steps == list(range(steps[0], total + 1, BATCH[script])), steps  # no gap, no repeat


# the layer that runs out of memory above how many rows, the update's rows, and the micro-batch the back-off reaches
OOM = {
    "ppo_atari": ("Conv2d", 5, 16, 4),
    "ppo_continuous": ("Linear", 10, 32, 8),
    "dqn_snake_vec": ("Conv2d", 10, 32, 8),
}


@pytest.mark.parametrize("script", SCRIPTS)
def test_out_of_memory_halves_the_micro_batch_and_keeps_learning_the_same(script, finished, tmp_path):
    layer, limit, rows, micro = OOM[script]
    env = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    models = {}
    for name, prefix, extra in [("oom", oom_prefix(layer, limit), []), ("micro", [], ["--micro-batch", str(micro)])]:
        (tmp_path / name).mkdir()
        cmd = [sys.executable, *prefix, str(ROOT / f"{script}.py"), "--no-progress-bar", *TINY[script], "--save-model"]
        res = subprocess.run(cmd + extra, cwd=tmp_path / name, env=env, capture_output=True, text=True, timeout=240)
        assert res.returncode == 0, res.stderr[-2000:]
        (run_dir,) = glob.glob(str(tmp_path / name / "runs" / "*"))
        models[name] = torch.load(Path(run_dir) / f"{script}.model", weights_only=True)["model"]
        if name == "oom":
            assert f"CUDA out of memory at {rows} rows, now {micro} rows per backward pass" in res.stdout
            if script != "dqn_snake_vec":
                assert {value for _, value in scalars(run_dir)["memory/micro_batch"]} == {micro}
    whole = torch.load(finished(script) / f"{script}.model", weights_only=True)["model"]
    for key, weight in whole.items():
        assert torch.equal(models["oom"][key], models["micro"][key]), key  # the same micro-batches, same numbers
        if script != "dqn_snake_vec":
            torch.testing.assert_close(models["oom"][key], weight, atol=1e-5, rtol=1e-4)  # = the whole minibatch's


BLOWUP = "1e12"  # a learning rate that turns every script's weights to NaN or inf within a few updates


def all_finite(state: dict) -> bool:
    return all(torch.isfinite(value).all() for value in state.values() if value.is_floating_point())


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_diverged_run_stops_and_keeps_its_last_finite_checkpoint(script, finished, tmp_path):
    """Before: the run went on to its end with NaN weights, saved them over the last good checkpoint, and exited 0."""
    ckpt = run_utils.read_checkpoint(finished(script) / "checkpoint.pt")
    assert all_finite(ckpt["model"])
    ckpt["args"]["learning_rate"] = float(BLOWUP)  # what a run started with --learning-rate 1e12 would hold
    ckpt["optimizer"]["param_groups"][0]["lr"] = float(BLOWUP)
    ckpt["args"]["total_timesteps"] = ckpt["global_step"] + 16 * BATCH[script]
    ckpt_path = tmp_path / "runs" / ckpt["run_name"] / "checkpoint.pt"
    ckpt_path.parent.mkdir(parents=True)
    torch.save(ckpt, ckpt_path)
    res = run(script, ["--resume", ckpt_path, "--checkpoint-every", "1", "--save-model"], tmp_path)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    error = res.stderr.strip().splitlines()[-1]
    assert error.startswith("error: the update diverged by step "), res.stderr[-2000:]
    assert f"runs/{ckpt['run_name']}/checkpoint.pt keeps the last finite ones" in error
    assert "lower --learning-rate" in error and "Traceback" not in res.stderr
    diverged_by = int(error.split("diverged by step ")[1].split()[0])
    kept = run_utils.read_checkpoint(ckpt_path)  # written before the divergence, never after
    assert ckpt["global_step"] <= kept["global_step"] < diverged_by and all_finite(kept["model"])
    assert kept["status"] == "diverged"  # so that a report or a sweep's --resume-existing can tell
    assert not (ckpt_path.parent / f"{script}.model").exists()
    loss = "losses/td_loss" if script == "dqn_snake_vec" else "losses/value_loss"
    assert not math.isfinite(scalars(ckpt_path.parent)[loss][-1][1])  # the diverged update's losses are in the logs


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_run_that_diverges_before_its_first_checkpoint_says_so(script, device, tmp_path):
    # --checkpoint-every 0: only at the end and on a stop (the last flag given wins over TINY's); on a GPU the
    # captured update (Snake: training step) must stop the same way
    gpu = ["--gpu", "true", "--cudagraphs"] if device == "cuda" else []
    args = [*TINY[script], "--checkpoint-every", "0", "--learning-rate", BLOWUP, "--save-model", *gpu]
    res = run(script, args, tmp_path)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    error = res.stderr.strip().splitlines()[-1]
    assert error.startswith("error: the update diverged by step ") and "no checkpoint had been written yet" in error
    assert glob.glob(str(tmp_path / "runs" / "*" / "events.*"))  # the logs stay
    assert not glob.glob(str(tmp_path / "runs" / "*" / "*.pt")) + glob.glob(str(tmp_path / "runs" / "*" / "*.model"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_resuming_a_finished_run_does_nothing(script, finished, tmp_path):
    """Before: it built the envs and network, added an empty event file (an empty segment in the report) and said
    'done ... 0 SPS'."""
    ckpt = run_utils.read_checkpoint(finished(script) / "checkpoint.pt")
    run_dir = tmp_path / "runs" / ckpt["run_name"]
    run_dir.mkdir(parents=True)
    torch.save(ckpt, run_dir / "checkpoint.pt")
    written = (run_dir / "checkpoint.pt").stat().st_mtime_ns
    res = cli(script, ["--resume", run_dir / "checkpoint.pt"], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith(f"nothing to do: {run_dir / 'checkpoint.pt'} is a finished run (step "), res.stdout
    assert "--eval-checkpoint" in res.stdout and res.stderr == ""
    assert sorted(path.name for path in run_dir.iterdir()) == ["checkpoint.pt"]  # no event file, no other file
    assert (run_dir / "checkpoint.pt").stat().st_mtime_ns == written


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_stop_during_the_set_up_after_the_run_folder_exists_stops_with_a_checkpoint(script, tmp_path):
    """Once the run has a folder, a stop signal stops it as in the loop: after the first iteration, with a checkpoint
    to continue from. Before: "stopped on SIGTERM: nothing was written", status 143, and a folder left with its lock
    and an event file."""
    res = run_with(["-c", SIGNAL_IN_SETUP], script, [*TINY[script], "--checkpoint-every", "0"], tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "nothing was written" not in res.stderr
    assert f"stopping on SIGTERM: checkpoint at step {BATCH[script]}; continue with: " in res.stdout, res.stdout
    (ckpt_path,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    assert run_utils.read_checkpoint(ckpt_path)["status"] == "stopped"


# `python -c CLOSES <script> args...` runs the script as __main__ and says when its CPU share and GPU monitor close
CLOSES = """
import runpy, sys
import gpu_utils
for cls in (gpu_utils.CpuShare, gpu_utils.GPUMonitor):
    def closing(self, close=cls.close, name=cls.__name__):
        print(f"{name} closed", flush=True)
        return close(self)
    cls.close = closing
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_run_leaves_its_cpu_share_and_gpu_monitor_before_its_end(script, tmp_path):
    """A finished run hands its CPUs back to the other live runs and stops sampling the GPU before its W&B upload and
    teardown (before: it held both until the process exited)."""
    res = run_with(["-c", CLOSES], script, TINY[script], tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lines = res.stdout.splitlines()
    done = next(i for i, line in enumerate(lines) if line.startswith("done: step "))
    assert "CpuShare closed" in lines[:done] and "GPUMonitor closed" in lines[:done], res.stdout[-2000:]


# the first update step of a TINY run's last iteration: 2 iterations of 2 minibatches (ppo_continuous: 4, past
# Pendulum's time limit, so that the fingerprint holds the bootstrap and the episode accounting); Snake learns in
# iterations 5-8
LAST_ITERATION_UPDATE = {"ppo_atari": 3, "ppo_continuous": 7, "dqn_snake_vec": 4}


def run_with(prefix, script, args, cwd):
    """``run`` with interpreter arguments before the script's path (helpers.at_update_prefix)."""
    cmd = [sys.executable, *prefix, str(ROOT / f"{script}.py"), "--no-progress-bar", *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=script_env(), capture_output=True, text=True, timeout=240)


def test_track_mirrors_to_wandb_and_a_resume_continues_the_same_wandb_run(tmp_path):
    """--track (W&B offline in tests): the W&B run's id goes into the checkpoint, and --resume --track continues that
    W&B run (the same id) rather than starting another; the mirrored config holds the run's settings. One script: the
    W&B calls are run_utils' (open_logs, save_checkpoint), the same for all three."""
    script = "ppo_continuous"
    pytest.importorskip("wandb")
    res = run_with(at_update_prefix("sigterm", 1), script, [*TINY[script], "--track"], tmp_path)  # a mid-run stop
    assert res.returncode == 0 and "stopping on SIGTERM" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    (ckpt_path,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    wandb_id = run_utils.read_checkpoint(ckpt_path)["wandb_id"]
    assert wandb_id and glob.glob(str(tmp_path / "wandb" / f"offline-run-*-{wandb_id}" / "run-*.wandb"))
    assert f"--track --resume runs/{Path(ckpt_path).parent.name}/checkpoint.pt\n" in res.stdout  # continue with: ...
    # a leg without --track keeps the id for the next with it (before: it wrote None, and the W&B run was lost)
    res = run_with(at_update_prefix("sigterm", 1), script, ["--resume", ckpt_path], tmp_path)
    assert res.returncode == 0 and "stopping on SIGTERM" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    assert run_utils.read_checkpoint(ckpt_path)["wandb_id"] == wandb_id
    res = run(script, ["--resume", ckpt_path, "--track"], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    ckpt = run_utils.read_checkpoint(ckpt_path)
    assert ckpt["status"] == "finished" and ckpt["wandb_id"] == wandb_id
    legs = sorted(glob.glob(str(tmp_path / "wandb" / "offline-run-*")))
    assert len(legs) == 2 and all(leg.endswith(f"-{wandb_id}") for leg in legs), legs
    (records,) = glob.glob(str(Path(legs[-1]) / "run-*.wandb"))  # what a `wandb sync` uploads: the config is in it
    assert b"total_timesteps" in Path(records).read_bytes()


@pytest.mark.parametrize("script", ["ppo_atari", "ppo_continuous"])
def test_a_run_that_crashes_keeps_the_logs_it_wrote(script, tmp_path):
    """A crash (here at the second iteration's first update, a bug, say) is a traceback and exit 1, and keeps the
    TensorBoard points the run wrote before it (the writer flushes only every 120 s while it runs)."""
    res = run_with(at_update_prefix("crash", 3), script, [*TINY[script], "--checkpoint-every", "0"], tmp_path)
    assert res.returncode == 1 and "injected crash" in res.stderr, res.stderr[-2000:]
    (run_dir,) = glob.glob(str(tmp_path / "runs" / "*"))
    assert [step for step, _ in scalars(run_dir)["charts/learning_rate"]] == [BATCH[script]]


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_stop_in_the_last_iteration_finishes_the_run(script, tmp_path):
    """Before: the PPO scripts wrote status 'stopped' at 100% of the steps, and every resume or sweep relaunched it."""
    res = run_with(
        at_update_prefix("sigterm", LAST_ITERATION_UPDATE[script]), script, [*TINY[script], "--save-model"], tmp_path
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (run_dir,) = glob.glob(str(tmp_path / "runs" / "*"))
    ckpt = torch.load(Path(run_dir) / "checkpoint.pt", weights_only=True)
    assert ckpt["status"] == "finished" and ckpt["global_step"] == int(
        TINY[script][TINY[script].index("--total-timesteps") + 1]
    )
    assert "continue with" not in res.stdout  # nothing is left to continue
    assert (Path(run_dir) / f"{script}.model").exists()  # a run that reached its total saves its model


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_run_stopped_at_its_total_by_older_code_is_finished_on_resume(script, finished, tmp_path):
    ckpt = torch.load(finished(script) / "checkpoint.pt", weights_only=True)
    ckpt["status"] = "stopped"  # what a stop in the last iteration wrote before
    run_dir = tmp_path / "runs" / ckpt["run_name"]
    run_dir.mkdir(parents=True)
    torch.save(ckpt, run_dir / "checkpoint.pt")
    res = cli(script, ["--resume", run_dir / "checkpoint.pt"], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "nothing to do" in res.stdout and "reached its total" in res.stdout, res.stdout
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["status"] == "finished"
    assert sorted(path.name for path in run_dir.iterdir()) == ["checkpoint.pt"]  # no event file


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_diverged_run_whose_checkpoint_became_unreadable_says_so_in_one_line(script, finished, tmp_path):
    """Before: marking the checkpoint diverged raised a traceback after the run's error."""
    ckpt = torch.load(finished(script) / "checkpoint.pt", weights_only=True)
    ckpt["args"]["learning_rate"] = float(BLOWUP)
    ckpt["optimizer"]["param_groups"][0]["lr"] = float(BLOWUP)
    ckpt["args"]["total_timesteps"] = ckpt["global_step"] + 16 * BATCH[script]
    ckpt_path = tmp_path / "runs" / ckpt["run_name"] / "checkpoint.pt"
    ckpt_path.parent.mkdir(parents=True)
    torch.save(ckpt, ckpt_path)
    res = run_with(at_update_prefix("garble", 1), script, ["--resume", ckpt_path, "--checkpoint-every", "0"], tmp_path)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the update diverged by step "), res.stderr[-2000:]
    assert "could not be marked diverged" in lines[0], lines[0]


@pytest.mark.parametrize("script", ["ppo_atari", "ppo_continuous"])
def test_norm_adv_with_one_row_minibatches_is_one_line_error(script, tmp_path):
    """Before: the std of one advantage is NaN, and the run stopped as diverged."""
    one_row = ["--num-minibatches", str(BATCH[script])]  # the last flag given wins over TINY's
    res = cli(script, [*TINY[script], *one_row], tmp_path)
    assert_one_line_error(res, "--norm-adv", "--no-norm-adv")
    assert not (tmp_path / "runs").exists()
    one_batch = ["--total-timesteps", str(BATCH[script])]
    res = run(script, [*TINY[script], *one_row, "--no-norm-adv", *one_batch], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_optimizers_capturable_flag_follows_the_run_not_the_checkpoint(script, finished, tmp_path):
    """Before: ppo_atari and dqn_snake_vec kept the checkpoint's flag, so a CPU checkpoint resumed with --cudagraphs
    never captured its update (capturable False), and a GPU one resumed on the CPU stepped a capturable Adam."""
    ckpt = torch.load(finished(script) / "checkpoint.pt", weights_only=True)
    assert ckpt["optimizer"]["param_groups"][0]["capturable"] is False
    ckpt["optimizer"]["param_groups"][0]["capturable"] = True  # as a --cudagraphs run on a GPU writes it
    ckpt["args"]["total_timesteps"] = ckpt["global_step"] + BATCH[script]
    ckpt_path = tmp_path / "runs" / ckpt["run_name"] / "checkpoint.pt"
    ckpt_path.parent.mkdir(parents=True)
    torch.save(ckpt, ckpt_path)
    res = run(script, ["--resume", ckpt_path], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    resumed = torch.load(ckpt_path, weights_only=True)
    assert resumed["global_step"] > ckpt["global_step"] and resumed["status"] == "finished"
    assert resumed["optimizer"]["param_groups"][0]["capturable"] is False  # this run's: on the CPU, no graph


# ---------------------------------------------------------------- the numbers of a tiny run, held across refactors
FINGERPRINTS = ROOT / "tests" / "fingerprints.json"
UNTIMED = ("charts/SPS", "charts/update_share", "threads/", "memory/", "gpu/")  # values that depend on the machine


def fingerprint(run_dir: Path, script: str) -> dict:
    """What a TINY run computed: every tensor of its final checkpoint (weights, optimizer, RNG and env state) and of
    its saved model, by SHA-256 of the bytes and by float64 sum and norm, and every logged scalar that is not a
    timing (losses, returns, learning rate, ...)."""
    import hashlib

    tensors = {}

    def walk(prefix, value):
        if isinstance(value, torch.Tensor):
            data = value.detach().contiguous().reshape(-1)  # 1-d: a 0-d tensor cannot be viewed as bytes
            as_float = data.double() if data.dtype != torch.bool else data.to(torch.float64)
            tensors[prefix] = {
                "sha256": hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest(),
                "sum": float(as_float.sum()),
                "norm": float(as_float.norm()),
            }
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}/{key}", item)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(f"{prefix}/{i}", item)

    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    for key in ["model", "optimizer", "rng", "target_network", "env", "obs_rms", "ret_rms"]:
        if key in ckpt:
            walk(f"checkpoint/{key}", ckpt[key])
    walk("model", torch.load(run_dir / f"{script}.model", weights_only=True)["model"])
    logged = sorted(scalars(run_dir).items())
    return {
        "tensors": tensors,
        "scalars": {tag: [list(p) for p in points] for tag, points in logged if not tag.startswith(UNTIMED)},
    }


def machine() -> dict:
    """What decides a run's kernels on the CPU: torch's version, the kernels torch dispatches to (AVX512, AVX2, ...,
    which ATEN_CPU_CAPABILITY may lower) and the CPU's vector instruction sets, which oneDNN's convolutions choose
    from (ONEDNN_MAX_CPU_ISA may cap them). The CPU's model name alone is not enough: two "AMD EPYC" generations,
    one with AVX-512 and one without, round the same run differently."""
    flags = []
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    vector = sorted(flag for flag in flags if flag.startswith(("avx", "amx", "fma")))
    return {
        "torch": torch.__version__,
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "isa": " ".join(vector),
        "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
    }


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_tiny_run_computes_the_stored_numbers(script, finished):
    """The same seed gives the same numbers, before and after any refactor: bitwise where torch's version, its CPU
    kernels and the CPU's instruction sets are those that stored tests/fingerprints.json (``machine``), within a tight
    tolerance elsewhere (another instruction set rounds differently: checked with ATEN_CPU_CAPABILITY=avx2
    ONEDNN_MAX_CPU_ISA=AVX2, and with default and SSE41, on an AVX-512 CPU). A change to what a run computes (the
    loss, the advantages, an env rule) fails here; when it is meant, store the new numbers with
    `UPDATE_FINGERPRINTS=1 pytest tests/test_contract.py -k tiny_run` and say why in the commit."""
    import json

    got = fingerprint(finished(script), script)
    stored = json.loads(FINGERPRINTS.read_text()) if FINGERPRINTS.exists() else {}
    if os.environ.get("UPDATE_FINGERPRINTS"):
        stored = stored if stored.get("machine") == machine() else {"machine": machine()}
        stored[script] = got
        FINGERPRINTS.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    expected = stored[script]
    assert sorted(got["tensors"]) == sorted(expected["tensors"])
    assert sorted(got["scalars"]) == sorted(expected["scalars"])
    if stored["machine"] == machine():
        changed = [
            name for name, value in got["tensors"].items() if value["sha256"] != expected["tensors"][name]["sha256"]
        ]
        assert changed == [], f"{len(changed)} tensors differ bitwise, e.g. {changed[:5]}"
        assert got["scalars"] == expected["scalars"]
        return
    for name, value in got["tensors"].items():  # another machine: the same numbers up to rounding
        for stat in ("sum", "norm"):
            assert value[stat] == pytest.approx(expected["tensors"][name][stat], rel=1e-4, abs=1e-5), (name, stat)
    for tag, events in got["scalars"].items():
        assert [step for step, _ in events] == [step for step, _ in expected["scalars"][tag]], tag
        values = [value for _, value in expected["scalars"][tag]]
        assert [value for _, value in events] == pytest.approx(values, rel=1e-4, abs=1e-5, nan_ok=True), tag


# `python -c IN_WANDB_INIT <what> <script> args...` runs the script as __main__ with a stand-in for wandb whose init,
# called by run_utils.open_run under --track, either sends the process SIGTERM (what) = "stop", or raises
# PermissionError as wandb does in a folder it cannot write (what = "unwritable")
IN_WANDB_INIT = """
import os, runpy, signal, sys, time, types
what = sys.argv.pop(1)
def init(**kwargs):
    if what == "stop":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    raise PermissionError(13, "Permission denied", os.path.join(os.getcwd(), "wandb"))
sys.modules["wandb"] = types.SimpleNamespace(init=init, run=None)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_stop_while_the_run_opens_its_logs_leaves_nothing_behind(script, tmp_path):
    """A stop while the run opens its folder and logs (W&B's init can take seconds) ends the run at once, saying that
    nothing was written, and so nothing is left: no run folder with a lock and no checkpoint. Before #63 the folder and
    its .lock stayed behind."""
    res = run_with(["-c", IN_WANDB_INIT, "stop"], script, [*TINY[script], "--track"], tmp_path)
    assert res.returncode == 143, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == "stopped on SIGTERM: nothing was written", res.stderr[-2000:]
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_a_folder_the_run_cannot_write_its_logs_in_is_one_line(tmp_path):
    """An OSError while the run opens its logs (W&B refusing an unwritable folder; as root a test cannot make one) is
    one error line that says what to change, exit 2, and leaves no run folder. Before #63: a traceback."""
    res = run_with(
        ["-c", IN_WANDB_INIT, "unwritable"], "ppo_continuous", [*TINY["ppo_continuous"], "--track"], tmp_path
    )
    assert_one_line_error(res, "Permission denied", "writable")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
