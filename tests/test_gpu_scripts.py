"""GPU runs of the three scripts (CUDA only; skipped without it): a tiny budget on the GPU, plain and with
--compile --cudagraphs --amp, checking that the run used the GPU, finished, and logged what a GPU run logs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import scalars

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.gpu
FAST_PATHS = ["--compile", "--cudagraphs", "--amp"]


def run(script, args, cwd):
    env = dict(
        os.environ, WANDB_MODE="offline", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, str(ROOT / script), "--no-progress-bar", *map(str, args)]
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


def scalar_tags(cwd):
    (run_dir,) = (Path(cwd) / "runs").iterdir()
    tags = scalars(run_dir)
    # the allocator estimate against the allocator's peak (the CUDA context is in neither): within 2x
    estimate, peak = tags["memory/estimated_mib"][-1][1], tags["memory/peak_allocated_mib"][-1][1]
    assert estimate / 2 <= peak <= 2 * estimate, f"peak {peak:.1f} MiB vs estimate {estimate:.1f} MiB"
    return set(tags)


@pytest.mark.parametrize("extra", [[], FAST_PATHS], ids=["eager", "fast-paths"])
def test_ppo_atari_on_gpu(tmp_path, extra):
    args = ["--num-envs", 8, "--num-steps", 32, "--num-minibatches", 2, "--update-epochs", 1, "--gpu", "true"]
    out = run("ppo_atari.py", [*args, "--total-timesteps", 768, *extra], tmp_path)
    assert "device: cuda" in out and "peak allocated" in out
    assert "done: step 768/768 in" in out
    tags = scalar_tags(tmp_path)
    assert {"charts/SPS", "losses/value_loss", "memory/estimated_mib", "memory/peak_allocated_mib"} <= tags


@pytest.mark.parametrize("extra", [[], FAST_PATHS], ids=["eager", "fast-paths"])
def test_ppo_continuous_preset_on_gpu(tmp_path, extra):
    # --gpu auto puts a preset on the GPU; the preset's minibatch (2048) shrinks to the 256-step batch
    args = ["--env-id", "HalfCheetah-v5", "--preset", "fast", "--num-envs", 4, "--num-steps", 64, "--update-epochs", 2]
    out = run("ppo_continuous.py", [*args, "--total-timesteps", 768, *extra], tmp_path)
    assert "device: cuda" in out and "peak allocated" in out
    assert {"charts/SPS", "losses/value_loss", "memory/peak_allocated_mib"} <= scalar_tags(tmp_path)


@pytest.mark.parametrize("extra", [[], FAST_PATHS, ["--buffer-device", "cpu"]], ids=["eager", "fast-paths", "host"])
def test_dqn_snake_on_gpu(tmp_path, extra):
    args = ["--num-envs", 512, "--batch-size", 256, "--buffer-size", 16384, "--learning-starts", 2048, "--gpu", "true"]
    out = run("dqn_snake_vec.py", [*args, "--log-every", 2048, "--total-timesteps", 8192, *extra], tmp_path)
    assert "device: cuda" in out and "peak allocated" in out
    assert {"charts/SPS", "losses/td_loss", "memory/peak_allocated_mib"} <= scalar_tags(tmp_path)


def test_cudagraphs_alone_compiles_with_cuda_graphs_on_the_chosen_gpu(tmp_path):
    """--cudagraphs alone captures the update (and implies --compile), and ppo_continuous sets its CUDA device."""
    import torch

    gpu = torch.cuda.device_count() - 1  # the last GPU: a script that forgot set_device would also touch GPU 0
    args = ["--env-id", "Pendulum-v1", "--preset", "fast", "--num-envs", 2, "--num-steps", 64, "--update-epochs", 1]
    out = run("ppo_continuous.py", [*args, "--total-timesteps", 256, "--cudagraphs", "--gpu", gpu], tmp_path)
    assert f"device: cuda:{gpu}" in out and "update: one CUDA graph" in out


def test_ppo_atari_run_from_a_cpu_checkpoint_continues_on_the_gpu(tmp_path):
    """The full-budget runs move between machines (benchmark/results/atari_gpu): a checkpoint written on a CPU
    (no CUDA generator state) resumes on the GPU with the speed flags, reaches its total and keeps one run dir."""
    import torch

    args = ["--num-envs", 8, "--num-steps", 32, "--num-minibatches", 2, "--update-epochs", 1, "--checkpoint-every", 1]
    out = run("ppo_atari.py", [*args, "--total-timesteps", 512, "--gpu", "false"], tmp_path)
    assert "device: cpu" in out
    (ckpt_path,) = (tmp_path / "runs").glob("*/checkpoint.pt")
    ckpt = torch.load(ckpt_path, weights_only=True)
    assert ckpt["rng"][0]["cuda"] is None
    ckpt["args"]["total_timesteps"] = 1024  # two more iterations, as a stopped run would have left
    ckpt["status"] = "stopped"
    torch.save(ckpt, ckpt_path)
    out = run("ppo_atari.py", ["--resume", ckpt_path, "--gpu", "true", *FAST_PATHS], tmp_path)
    assert "device: cuda" in out and "done: step 1024/1024 in" in out
    ckpt = torch.load(ckpt_path, weights_only=True)
    assert ckpt["status"] == "finished" and ckpt["global_step"] == 1024 and ckpt["rng"][0]["cuda"] is not None
    assert len(list((tmp_path / "runs").iterdir())) == 1


def test_snake_training_step_as_one_cuda_graph_learns_as_the_eager_step(tmp_path):
    """--cudagraphs captures the whole training step (act, the fused env step, n-step, replay, TD update, target)
    once and replays it; with the same compiled kernels run eagerly (--compile, the same fused env) the weights after
    a few dozen updates are the same up to float rounding."""
    import torch

    args = ["--num-envs", 256, "--batch-size", 64, "--buffer-size", 8192, "--learning-starts", 1024, "--gpu", "true"]
    args += ["--env-mode", "fused", "--total-timesteps", 256 * 40, "--log-every", 2560, "--save-model"]
    weights = {}
    for name, flags in [("eager", ["--compile"]), ("graph", ["--cudagraphs"])]:
        cwd = tmp_path / name
        cwd.mkdir()
        out = run("dqn_snake_vec.py", [*args, *flags], cwd)
        if name == "graph":  # the acting step too, captured once the n-step ring is full (#59)
            assert "training step: one CUDA graph" in out and "acting step: one CUDA graph" in out
        (model,) = (cwd / "runs").glob("*/dqn_snake_vec.model")
        weights[name] = torch.load(model, weights_only=True)["model"]
    for key, eager in weights["eager"].items():
        torch.testing.assert_close(weights["graph"][key], eager, rtol=1e-4, atol=1e-5, msg=key)


def test_a_minibatch_split_into_micro_batches_is_one_cuda_graph_and_learns_as_the_eager_one(tmp_path):
    """Since #59 a graph holds the backward passes of a split minibatch (before, --micro-batch below the minibatch kept
    the update eager): --cudagraphs --micro-batch 48 (backward passes of 48, 48, 32 rows) learns the weights that
    --compile learns with the same micro-batches, up to float rounding."""
    import torch

    args = ["--env-id", "Pendulum-v1", "--preset", "fast", "--num-envs", 2, "--num-steps", 64, "--update-epochs", 2]
    args += ["--minibatch-size", 128, "--micro-batch", 48, "--total-timesteps", 384, "--no-tf32", "--save-model"]
    models = {}
    for flag in ["--compile", "--cudagraphs"]:
        (tmp_path / flag).mkdir()
        out = run("ppo_continuous.py", [*args, flag, "--gpu", "true"], tmp_path / flag)
        assert ("update: one CUDA graph" in out) == (flag == "--cudagraphs"), out[-2000:]
        (model,) = (tmp_path / flag / "runs").glob("*/ppo_continuous.model")
        models[flag] = torch.load(model, weights_only=True)["model"]
    for key, weight in models["--compile"].items():
        torch.testing.assert_close(models["--cudagraphs"][key], weight, atol=1e-5, rtol=1e-4, msg=key)


# a CPU run that leaves a checkpoint, then its resume on the GPU for a few more iterations: (the CPU run's arguments,
# the resumed run's total steps, what the script prints when its update is one CUDA graph)
RESUMES = {
    "ppo_atari.py": (
        ["--num-envs", 8, "--num-steps", 32, "--num-minibatches", 2, "--update-epochs", 2, "--total-timesteps", 512],
        1024,
        "update: one CUDA graph",
    ),
    "ppo_continuous.py": (
        ["--env-id", "Pendulum-v1", "--preset", "fast", "--num-envs", 2, "--num-steps", 64, "--num-minibatches", 2]
        + ["--update-epochs", 2, "--total-timesteps", 256],
        512,
        "update: one CUDA graph",
    ),
    "dqn_snake_vec.py": (
        ["--num-envs", 256, "--batch-size", 64, "--buffer-size", 8192, "--learning-starts", 1024]
        + ["--log-every", 2560, "--total-timesteps", 256 * 8],
        256 * 24,
        "training step: one CUDA graph",
    ),
}


@pytest.mark.parametrize("script", RESUMES)
def test_a_cpu_checkpoint_resumes_with_cudagraphs_and_its_update_is_captured(tmp_path, script):
    """A run stopped on a CPU continues on a GPU with --cudagraphs. Its checkpoint's optimizer says capturable=False;
    loaded as it is, the capture fails ("<name>: eager (CUDA graph capture failed: ...)") and the run goes on slower
    with only that line to say so. The resumed run's optimizer is capturable and its update (Snake: its training
    step) is one graph."""
    import torch

    args, total, captured = RESUMES[script]
    run(script, [*args, "--gpu", "false", "--checkpoint-every", 1], tmp_path)
    (ckpt_path,) = (tmp_path / "runs").glob("*/checkpoint.pt")
    ckpt = torch.load(ckpt_path, weights_only=True)
    assert ckpt["optimizer"]["param_groups"][0]["capturable"] is False  # as a CPU run writes it
    ckpt["args"]["total_timesteps"] = total  # more iterations, as a stopped run would have left
    ckpt["status"] = "stopped"
    torch.save(ckpt, ckpt_path)
    out = run(script, ["--resume", ckpt_path, "--gpu", "true", "--cudagraphs"], tmp_path)
    assert "device: cuda" in out and captured in out
    assert "CUDA graph capture failed" not in out, out[-2000:]
    ckpt = torch.load(ckpt_path, weights_only=True)
    assert ckpt["status"] == "finished" and ckpt["global_step"] == total
    assert ckpt["optimizer"]["param_groups"][0]["capturable"] is True
    assert len(list((tmp_path / "runs").iterdir())) == 1
