"""Tests for the developers' speed tools: dev/speed_dev.py (old code against new, runs at once, a commit's scripts in
a folder) on fake runs, and dev/profile_atari.py's one-line errors (its whole run on a CPU is part of
tests/test_gpu_lease.py's dry run). Nothing here is timed."""

import os
import subprocess
import sys

import pytest
from helpers import FAKE_RUN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "dev"))
import profile_atari  # noqa: E402
import speed_dev  # noqa: E402

sys.path.remove(os.path.join(ROOT, "dev"))


def code_folder(folder, sps: float):
    """A folder of the scripts `ab` needs, each a fake run that logs ``sps``."""
    folder.mkdir()
    for name in speed_dev.AB_SCRIPTS:
        (folder / name).write_text(FAKE_RUN)
    (folder / "SPS").write_text(str(sps))
    return folder


def test_ab_interleaves_old_and_new_code(tmp_path, monkeypatch, capsys):
    """Each row with the old scripts (a folder) and the new, the old first in odd rounds; each side's median, each
    run's SPS and their ratio, here known exactly: the old code logs 1,234 SPS and the new 2,468."""
    old = code_folder(tmp_path / "old", 1234)
    (old / "REF").write_text("abc1234\n")
    monkeypatch.setattr(speed_dev.speed, "ROOT", str(code_folder(tmp_path / "new", 2468)))
    args = ["ab", "--before", old, "--profile", "cpu", "--only", "HalfCheetah-v5 --total", "--rounds", "2"]
    assert speed_dev.main([*map(str, args), "--out", str(tmp_path), "--note", "test"]) == 0
    started = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("[speed] round")]
    assert started == [
        "[speed] round 1/2, before",
        "[speed] round 1/2, after",
        "[speed] round 2/2, after",
        "[speed] round 2/2, before",
    ]
    (report,) = tmp_path.glob("ab_cpu_*.md")
    text = report.read_text()
    assert f"Before: folder {old} (commit abc1234). After: this checkout. 2 round(s)" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| `python ppo_continuous.py")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    graph = "; update: eager (CUDA graph capture failed: RuntimeError: boom)"  # what a run could not do, beside it
    assert cells[1:] == [f"1,234 (1,234, 1,234){graph}", f"2,468 (2,468, 2,468){graph}", "**2.00x**"]


def test_ab_refuses_a_folder_without_the_scripts_and_reads_a_commit(tmp_path, capsys):
    assert speed_dev.main(["ab", "--before", str(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no ppo_atari.py, ppo_continuous.py, dqn_snake_vec.py, gpu_utils.py there" in err
    assert speed_dev.main(["ab", "--before", "no-such-commit-or-folder", "--dry-run"]) == 2
    assert "neither a folder nor a commit of this repository" in capsys.readouterr().err
    if subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("no git history here")
    speed_dev.export_before("HEAD", str(tmp_path / "head"))  # what gpu_lease.py prepare writes to .lease/before
    # the scripts with every module beside them that they import (run_utils.py, the env modules), as HEAD has them
    head = subprocess.run(["git", "-C", ROOT, "ls-tree", "--name-only", "HEAD"], capture_output=True, text=True)
    modules = [name for name in head.stdout.split() if name.endswith(".py")]
    assert {*speed_dev.AB_SCRIPTS, "run_utils.py", "snake_env.py"} <= set(modules)
    assert sorted(os.listdir(tmp_path / "head")) == sorted(["REF", *modules])
    capsys.readouterr()
    assert speed_dev.main(["ab", "--before", "HEAD", "--dry-run"]) == 0
    before, after = capsys.readouterr().out.splitlines()[:2]
    assert before.startswith("before: python /") and "/speed_before_" in before and "/ppo_atari.py --env-id" in before
    assert after == "after:  python ppo_atari.py --env-id ALE/Breakout-v5 --total-timesteps 6144 --no-progress-bar"


def test_concurrency_by_hand_and_pinned(tmp_path, monkeypatch, capsys):
    """Copies at once: started by hand they get no thread variable; pinned, their own CPUs' count. The total is the
    sum of the copies' SPS, set against one run alone and the target."""
    script = tmp_path / "fake.py"
    script.write_text(FAKE_RUN)
    monkeypatch.setitem(speed_dev.CONCURRENCY, "fake", speed_dev.Setting([str(script), "100"], 1, 2))
    for pin, threads in (([], "0 / 0"), (["--pin"], "1 / 1" if len(speed_dev.gpu_utils.allowed_cpus()) > 1 else None)):
        args = ["concurrency", "--scripts", "fake", "--copies", "2", *pin, "--out", str(tmp_path)]
        assert speed_dev.main(args) == 0
        (report,) = tmp_path.glob(f"concurrency{'_pinned' if pin else ''}_*.md")
        text = report.read_text()
        assert ("each pinned to its CPUs" if pin else "started by hand: no pinning, no thread variables") in text
        rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| fake |")]
        one, two = [[c.strip() for c in row] for row in rows]
        assert one[1:5] == ["1", "100", "100", "1.00x"] and one[6] == "-"
        assert two[1:5] == ["2", "100 / 100", "200", "2.00x"] and two[6] == ">= 1.00x: met"
        assert threads is None or two[5] == threads
    assert speed_dev.main(["concurrency", "--scripts", "nope"]) == 2
    assert "--scripts takes ppo_atari, dqn_snake_vec" in capsys.readouterr().err


def test_profile_atari_bad_options_are_one_line_errors(capsys):
    """--num-envs 0 crashed ale-py with a segmentation fault and --steps 3 ended in a traceback."""
    for args, words in [
        (["--num-envs", "0"], "--num-envs, --num-steps, --update-epochs and --max-episode-frames must be at least 1"),
        (["--steps", "3"], "--steps must be at least 6"),
        (["--num-envs", "1", "--minibatch-size", "64"], "--num-envs must be at least 2"),
    ]:
        with pytest.raises(SystemExit) as ended:
            profile_atari.main(args)
        assert ended.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], lines


def test_profile_atari_times_the_scripts_own_steps_and_they_compile():
    """The policy step comes from ppo_atari.py's main block and compiles: dynamo finds its globals (with them only in
    a dict named after ppo_atari, it looked in the ppo_atari module and failed: 'no attribute agent')."""
    import torch

    agent = profile_atari.ppo_atari.Agent(4)
    policy_step = torch.compile(profile_atari.from_script("policy_step", agent=agent), backend="eager")
    action, logprob, value = policy_step(torch.zeros((3, 4, 84, 84), dtype=torch.uint8))
    assert action.shape == logprob.shape == value.shape == (3,) and logprob.le(0).all()


def test_profile_atari_rollout_and_update_run_the_scripts_functions():
    """The rollout in two halves steps the envs with the script's receive (its globals all found) and fills the
    script's storage; the script's update_step takes a minibatch and changes the weights."""
    import torch

    a = profile_atari.tyro.cli(profile_atari.ppo_atari.Args, args=["--num-envs", "2", "--num-steps", "4"])
    a.minibatch_size = 8
    device = torch.device("cpu")
    agent = profile_atari.ppo_atari.Agent(4)
    buffers = profile_atari.storage(a, (4, 84, 84), device)
    env_rows, envs, receive = profile_atari.env_groups(a, 2, 2, buffers, agent, device)
    policy_step = profile_atari.from_script("policy_step", agent=agent)
    profile_atari.collect(a, env_rows, envs, receive, policy_step, buffers)
    for group in envs:
        group.close()
    assert env_rows == [slice(0, 1), slice(1, 2)] and buffers["obs"].any() and buffers["values"].ne(0).all()
    before = [p.detach().clone() for p in agent.parameters()]
    loss_fn = profile_atari.ppo_atari.ppo_loss
    assert profile_atari.time_update(a, agent, loss_fn, buffers, False, 2, device) > 0
    assert any(not torch.equal(p, q) for p, q in zip(before, agent.parameters()))
