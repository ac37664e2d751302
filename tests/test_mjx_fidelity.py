"""benchmark/mjx_fidelity.py: the checkpoints it reads as data only, the state classes it samples and the rule that
picks each task's fast setting (docs/mjx.md, "Fast physics"). The classes are checked on gymnasium's env alone, with
a few states each; the one run that builds MJX worlds is `slow` (a compile of a minute on a busy core)."""

import csv
import importlib.util
import io
import sys
import tokenize
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import save_checkpoint_with_code

import run_utils

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmark"))
import mjx_fidelity  # noqa: E402

sys.path.remove(str(ROOT / "benchmark"))
HAS_MJX = all(importlib.util.find_spec(name) is not None for name in ("jax", "mujoco.mjx"))


# ---------------------------------------------------------------- checkpoints: data, never code
def test_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path, capsys):
    """Before: the tool read checkpoints with torch.load(weights_only=False), so unpickling this one created the
    folder ``marker``: a checkpoint was code there."""
    path, marker = tmp_path / "checkpoint.pt", tmp_path / "marker"
    save_checkpoint_with_code(path, marker, script="ppo_continuous", obs_rms=([0.0] * 4, [1.0] * 4, 1.0))
    with pytest.raises(run_utils.CheckpointError, match="holds more than data"):
        mjx_fidelity.load_policy(str(path))
    assert not marker.exists()
    with pytest.raises(SystemExit) as refused:
        mjx_fidelity.main(["--env-id", "InvertedPendulum-v5", "--checkpoint", f"InvertedPendulum-v5={path}"])
    assert "\n" not in str(refused.value) and "holds more than data" in str(refused.value)
    assert not marker.exists()


def test_no_python_file_loads_a_checkpoint_with_code_allowed():
    """No ``weights_only=False`` in any tracked or new Python file's code (strings and comments may name it)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if any(
            part.startswith(".") or part in ("runs", "wandb", "node_modules") for part in path.relative_to(ROOT).parts
        ):
            continue
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline) if t.string.strip()]
        for a, b, c in zip(tokens, tokens[1:], tokens[2:]):
            if (a.string, b.string, c.string) == ("weights_only", "=", "False"):
                found.append(f"{path.relative_to(ROOT)}:{a.start[0]}")
    assert found == []


def test_a_ppo_continuous_checkpoint_acts_as_its_actor(tmp_path):
    """The format ppo_continuous.py saves (a state dict, obs_rms as lists of floats) reads as data: the policy is
    the actor's tanh MLP on the normalised observation (std ~0 here, so the action is the mean)."""
    torch.manual_seed(0)
    obs_dim, act_dim = 4, 1
    model = {
        "actor_mean.0.weight": torch.randn(8, obs_dim),
        "actor_mean.0.bias": torch.randn(8),
        "actor_mean.2.weight": torch.randn(act_dim, 8),
        "actor_mean.2.bias": torch.randn(act_dim),
        "actor_logstd": torch.full((1, act_dim), -30.0),
    }
    mean, var = [0.1, -0.2, 0.3, 0.0], [2.0, 0.5, 1.0, 4.0]
    run_utils.save_checkpoint(tmp_path / "checkpoint.pt", script="ppo_continuous", args={}, model=model,
                              obs_rms=(mean, var, 100.0), global_step=1)  # fmt: skip
    act = mjx_fidelity.load_policy(str(tmp_path / "checkpoint.pt"))
    obs = np.array([0.5, -1.0, 2.0, 0.0])
    x = torch.as_tensor((obs - mean) / np.sqrt(np.array(var) + 1e-8), dtype=torch.float32)
    expected = torch.tanh(x @ model["actor_mean.0.weight"].T + model["actor_mean.0.bias"])
    expected = expected @ model["actor_mean.2.weight"].T + model["actor_mean.2.bias"]
    np.testing.assert_allclose(act(obs, np.random.default_rng(0)), expected.numpy(), rtol=1e-6)


# ---------------------------------------------------------------- the classes of states
def test_replaying_a_step_with_mujoco_is_gymnasiums_step_bit_for_bit():
    """The limits and knife-edge classes are found by replaying steps with MuJoCo (ctrl, frame_skip mj_steps, an
    mj_forward before each to read its constraints): that must be gymnasium's step exactly."""
    for env_id in ("Hopper-v5", "InvertedPendulum-v5"):
        states = mjx_fidelity.rollout(env_id, mjx_fidelity.bang_bang_policy, 40, seed=3)
        after, _ = mjx_fidelity.replay(env_id, states)
        np.testing.assert_array_equal(after, mjx_fidelity.gymnasium_step(env_id, states)[3])


def test_each_class_holds_the_states_it_names():
    n = 16
    hopper, reached = mjx_fidelity.sample_classes("Hopper-v5", n, stride=5, seed=0)
    assert set(hopper) == {"random", "bang-bang", "sinusoid", "high-velocity", "limits", "fallen", "knife-edge"}
    assert reached == dict.fromkeys(hopper, True) | {"fallen": False}  # a fall ends Hopper's episode by default
    assert all(len(states["action"]) == n for states in hopper.values())
    low, high = -np.ones(3), np.ones(3)
    assert np.isin(hopper["bang-bang"]["action"], [-1, 1]).all() and np.all(hopper["random"]["action"] <= high)
    assert mjx_fidelity.replay("Hopper-v5", hopper["limits"])[1].all()
    assert mjx_fidelity.fallen("Hopper-v5", hopper["fallen"]).all()
    assert not any(mjx_fidelity.fallen("Hopper-v5", hopper[name]).any() for name in ("random", "knife-edge"))
    speed = {name: np.abs(states["qvel"]).max(axis=1) for name, states in hopper.items()}
    assert speed["high-velocity"].min() >= np.median(speed["random"])
    assert np.all(hopper["random"]["action"] >= low)
    # knife-edge: gymnasium's own step ends within 1e-11 of a threshold, on either side of it
    _, _, terminated, after = mjx_fidelity.gymnasium_step("Hopper-v5", hopper["knife-edge"])
    assert np.abs(mjx_fidelity.margins("Hopper-v5", after)).min(axis=1).max() <= 1e-11
    assert 0 < terminated.sum() < n

    pendulum, reached = mjx_fidelity.sample_classes("InvertedPendulum-v5", n, stride=5, seed=0)
    assert "fallen" not in pendulum and all(reached.values())  # a fallen pole always ends the episode
    assert mjx_fidelity.replay("InvertedPendulum-v5", pendulum["limits"])[1].all()
    assert np.abs(pendulum["limits"]["qpos"][:, 0]).max() > 0.99  # the cart at the end of its rail...
    assert np.abs(pendulum["limits"]["qpos"][:, 1]).max() < 0.2  # ...with the pole still up
    _, _, terminated, after = mjx_fidelity.gymnasium_step("InvertedPendulum-v5", pendulum["knife-edge"])
    assert np.abs(np.abs(after[:, 1]) - 0.2).max() <= 1e-11 and 0 < terminated.sum() < len(terminated)

    cheetah, reached = mjx_fidelity.sample_classes("HalfCheetah-v5", n, stride=5, seed=0)
    assert "knife-edge" not in cheetah and reached["fallen"]  # it never terminates: on its back it steps on
    assert (np.cos(cheetah["fallen"]["qpos"][:, 2]) < 0).all()


def test_the_rule_compares_fast_with_exact_against_exact_with_gymnasium():
    reference = {"states": 10, "obs mean": 1e-6, "obs p99": 1e-5, "obs max": 2e-5, "reward mean": 0.0}
    reference |= {"reward p99": 1e-6, "reward max": 1e-6, "terminations differ": 3}
    same = reference | dict.fromkeys(mjx_fidelity.FIGURES, 0)
    assert mjx_fidelity.failures(same, reference, knife=False) == []
    assert mjx_fidelity.failures(same | {"obs mean": 1.0}, reference, knife=False) == []  # p99 and max decide
    assert mjx_fidelity.failures(same | {"obs max": 3e-5}, reference, knife=False) == ["obs max 3e-05 > 2e-05"]
    flipped = same | {"terminations differ": 1}
    assert mjx_fidelity.failures(flipped, reference, knife=False) == ["1 terminations differ (> 0)"]
    assert mjx_fidelity.failures(same | {"terminations differ": 3}, reference, knife=True) == []
    assert mjx_fidelity.failures(same | {"terminations differ": 4}, reference, knife=True) == [
        "4 terminations differ (> 3)"
    ]
    # the cheapest from which every dearer grid point passes: a lucky pass below a failure does not count
    assert mjx_fidelity.choose({"8,16": [], "4,8": [], "2,4": ["limits: ..."], "1,4": []}) == "4,8"
    assert mjx_fidelity.choose({"8,16": ["limits: ..."], "4,8": []}) == "none"


@pytest.mark.slow
@pytest.mark.skipif(not HAS_MJX, reason='needs the mjx extra: pip install -e ".[mjx]"')
def test_a_tiny_run_writes_its_tables_and_leaves_fast_physics_as_it_was(tmp_path, monkeypatch):
    """One grid point on InvertedPendulum, 8 states a class: every class in the CSV, fast against exact with its
    verdict, and FAST_PHYSICS untouched after the run (before, the tool left its last grid point in it)."""
    import mjx_envs

    before = {env_id: dict(setting) for env_id, setting in mjx_envs.FAST_PHYSICS.items()}
    monkeypatch.chdir(tmp_path)
    mjx_fidelity.main(["--env-id", "InvertedPendulum-v5", "--states", "8", "--grid", "1,4", "--seconds", "0.01",
                       "--rounds", "1", "--out", "out.md", "--csv", "out.csv"])  # fmt: skip
    assert mjx_envs.FAST_PHYSICS == before
    rows = list(csv.DictReader(open("out.csv")))
    classes = {"random", "bang-bang", "sinusoid", "drift", "high-velocity", "limits", "knife-edge"}
    assert {row["class"] for row in rows} == classes
    compared = [row for row in rows if row["setting"] == "1,4" and row["compared"] == "fast vs exact"]
    assert {row["class"] for row in compared} == classes and {row["passes"] for row in compared} <= {"yes", "no"}
    assert {row["compared"] for row in rows} == {"exact vs gymnasium", "fast vs exact", "fast vs gymnasium"}
    assert "InvertedPendulum-v5: chosen" in open("out.md").read()
