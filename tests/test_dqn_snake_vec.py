"""Tests for dqn_snake_vec.py and its games (snake_env.py): Snake rules cell by cell, resets, a plain-Python
reference, replay, n-step, runs."""

import glob
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque

import pytest
import torch
from helpers import assert_micro_batches_match, assert_one_line_error, at_update_prefix, run_in_process, scalars

import run_utils

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "dqn_snake_vec.py")
sys.path.insert(0, ROOT)
from dqn_snake_vec import NStep, QNetwork, ReplayBuffer  # noqa: E402
from snake_env import DOWN, LEFT, RIGHT, UP, VecSnake  # noqa: E402

torch.set_num_threads(1)
# the rules hold in every mode; fused runs its one function eagerly here (compiled in test_fused_step_*)
MODES = ["sparse", "dense", "fused"]
MOVES = {UP: (-1, 0), RIGHT: (0, 1), DOWN: (1, 0), LEFT: (0, -1)}


def body_of(env, i):
    """Snake cells of game i as (row, col), head first (sorted by age)."""
    ages = env.board[i].tolist()
    cells = sorted((a, k) for k, a in enumerate(ages) if a > 0)
    return [divmod(k, env.w) for _, k in reversed(cells)]


def game(h, w, body, direction, food, mode="sparse", n=1):
    env = VecSnake(n, h, w, seed=0, mode=mode, compile=False)
    env.reset()
    for i in range(n):
        env.set_game(i, body, direction, food)
    return env


def act(env, *actions):
    return env.step(torch.tensor(actions, dtype=torch.long))


def planes(obs, i, env):
    """(head, body, food, order) of game i as nested lists of rows."""
    return [obs[i, p].tolist() for p in range(4)]


# ---------------------------------------------------------------- rules, cell by cell


@pytest.mark.parametrize("mode", MODES)
def test_move_turn_and_observation(mode):
    env = game(5, 5, [(2, 2), (2, 1), (2, 0)], RIGHT, (0, 4), mode)
    obs, reward, term, trunc, info = act(env, RIGHT)
    assert body_of(env, 0) == [(2, 3), (2, 2), (2, 1)]
    assert (reward.item(), term.item(), trunc.item(), int(env.food[0])) == (0.0, False, False, 4)
    head, body, food, order = planes(obs, 0, env)
    assert head[2][3] == 1 and sum(map(sum, head)) == 1
    assert food[0][4] == 1 and sum(map(sum, food)) == 1
    assert [order[2][c] for c in range(5)] == [0, 1, 2, 3, 0] and sum(map(sum, order)) == 6
    assert [body[2][c] for c in range(5)] == [0, 1, 1, 1, 0] and sum(map(sum, body)) == 3
    assert torch.equal(obs, info["final_obs"])
    act(env, UP)
    assert body_of(env, 0) == [(1, 3), (2, 3), (2, 2)] and int(env.direction[0]) == UP


@pytest.mark.parametrize("mode", MODES)
def test_eat_grow_and_tail_follows(mode):
    env = game(5, 5, [(2, 2), (2, 1), (2, 0)], RIGHT, (2, 3), mode)
    obs, reward, term, _, info = act(env, RIGHT)
    assert reward.item() == 1.0 and not term.item()
    assert body_of(env, 0) == [(2, 3), (2, 2), (2, 1), (2, 0)]  # the tail stays on the eating step
    assert (int(env.length[0]), int(info["score"][0]), int(info["length"][0])) == (4, 1, 4)
    food = int(env.food[0])
    assert env.board[0, food] == 0  # new food on an empty cell
    assert obs[0, 2].reshape(-1)[food] == 1
    env.food[0] = 0  # keep it out of the way: (0, 0)
    act(env, RIGHT)
    assert body_of(env, 0) == [(2, 4), (2, 3), (2, 2), (2, 1)]  # now the tail follows
    act(env, DOWN)
    assert body_of(env, 0) == [(3, 4), (2, 4), (2, 3), (2, 2)]


@pytest.mark.parametrize("mode", MODES)
def test_wall_death_returns_terminal_board_and_resets(mode):
    env = game(5, 5, [(2, 4), (2, 3), (2, 2)], RIGHT, (0, 0), mode)
    before = env.observe().clone()
    obs, reward, term, trunc, info = act(env, RIGHT)
    assert (reward.item(), term.item(), trunc.item()) == (-1.0, True, False)
    assert torch.equal(info["final_obs"], before)  # the board as it was before the fatal move
    assert int(info["length"][0]) == 3 and int(info["episode_length"][0]) == 1 and info["episode_return"][0] == -1
    assert len(body_of(env, 0)) == 3 and int(env.ep_len[0]) == 0 and float(env.ep_return[0]) == 0.0
    assert torch.equal(obs, env.observe())  # the next observation is the new game's


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "body,direction,action",
    [
        ([(0, 2), (1, 2), (2, 2)], UP, UP),
        ([(2, 0), (2, 1), (2, 2)], LEFT, LEFT),
        ([(4, 1), (3, 1), (2, 1)], DOWN, DOWN),
    ],
)
def test_every_wall_kills(mode, body, direction, action):
    env = game(5, 5, body, direction, (0, 4), mode)
    _, reward, term, _, _ = act(env, action)
    assert reward.item() == -1.0 and term.item()


@pytest.mark.parametrize("mode", MODES)
def test_self_collision(mode):
    # head (1,1) came from (1,2); moving down hits (2,1), which is not the tail (2,0)
    env = game(5, 5, [(1, 1), (1, 2), (2, 2), (2, 1), (2, 0)], LEFT, (4, 4), mode)
    _, reward, term, _, info = act(env, DOWN)
    assert (reward.item(), term.item(), int(info["length"][0])) == (-1.0, True, 5)


@pytest.mark.parametrize("mode", MODES)
def test_moving_into_the_leaving_tail_is_legal(mode):
    env = game(5, 5, [(1, 1), (1, 2), (2, 2), (2, 1)], LEFT, (4, 4), mode)
    _, reward, term, _, _ = act(env, DOWN)
    assert (reward.item(), term.item()) == (0.0, False)
    assert body_of(env, 0) == [(2, 1), (1, 1), (1, 2), (2, 2)]


@pytest.mark.parametrize("mode", MODES)
def test_reverse_action_continues_straight(mode):
    env = game(5, 5, [(2, 2), (2, 1), (2, 0)], RIGHT, (0, 0), mode)
    act(env, LEFT)
    assert body_of(env, 0) == [(2, 3), (2, 2), (2, 1)] and int(env.direction[0]) == RIGHT
    env = game(5, 5, [(2, 2), (3, 2), (4, 2)], UP, (0, 0), mode)
    act(env, DOWN)
    assert body_of(env, 0) == [(1, 2), (2, 2), (3, 2)]


@pytest.mark.parametrize("mode", MODES)
def test_win_on_full_board(mode):
    path = [(2, 1), (2, 0), (1, 0), (1, 1), (1, 2), (0, 2), (0, 1), (0, 0)]  # 8 of 9 cells, head first
    env = game(3, 3, path, RIGHT, (2, 2), mode)
    obs, reward, term, trunc, info = act(env, RIGHT)
    assert (reward.item(), term.item(), trunc.item(), int(info["length"][0])) == (1.0, True, False, 9)
    final = info["final_obs"][0]
    assert final[1].sum() == 9 and final[2].sum() == 0 and final[0][2][2] == 1 and final[3].max() == 9
    assert len(body_of(env, 0)) == 3  # a new game started


@pytest.mark.parametrize("mode", MODES)
def test_truncation_after_2hw_steps_without_food(mode):
    env = game(5, 5, [(1, 1), (1, 2), (2, 2)], LEFT, (4, 4), mode)
    loop = [DOWN, RIGHT, UP, LEFT]  # circles a 2x2 block: each move enters the cell the tail leaves
    for t in range(1, 51):
        before = body_of(env, 0)
        obs, reward, term, trunc, info = act(env, loop[(t - 1) % 4])
        assert not term.item() and reward.item() == 0.0
        if t < 50:
            assert not trunc.item() and len(before) == 3
    assert trunc.item() and int(info["episode_length"][0]) == 50
    final = info["final_obs"][0]
    assert final[1].sum() == 3 and final[2][4][4] == 1  # the true last board, not the reset one
    assert int(env.ep_len[0]) == 0


@pytest.mark.parametrize("mode", MODES)
def test_reset_of_one_game_leaves_the_others_untouched(mode):
    n = 8
    envs = []
    for crash in (True, False):
        env = VecSnake(n, 6, 6, seed=3, mode=mode, compile=False)
        env.reset()
        for i in range(n):
            env.set_game(i, [(2, 2), (2, 1), (2, 0)], RIGHT, (5, 5))
        if crash:
            env.set_game(3, [(2, 5), (2, 4), (2, 3)], RIGHT, (5, 5))
        envs.append(env)
    outs = [act(env, *[RIGHT] * n) for env in envs]
    assert outs[0][2][3].item() and not outs[1][2][3].item()
    others = [i for i in range(n) if i != 3]
    for name in VecSnake._state_names:
        assert torch.equal(getattr(envs[0], name)[others], getattr(envs[1], name)[others]), name
    assert torch.equal(outs[0][0][others], outs[1][0][others])


@pytest.mark.parametrize("mode", MODES)
def test_food_is_uniform_over_empty_cells(mode):
    env = game(3, 4, [(1, 1), (1, 2), (2, 2)], LEFT, (1, 0), mode, n=2000)
    _, reward, *_ = act(env, *[LEFT] * env.n)  # every snake eats and grows to 4 cells; new food goes elsewhere
    assert reward.eq(1).all()
    counts = torch.bincount(env.food, minlength=env.hw)
    snake = [1 * 4 + 0, 1 * 4 + 1, 1 * 4 + 2, 2 * 4 + 2]
    assert counts[snake].sum() == 0
    free = [k for k in range(env.hw) if k not in snake]
    assert counts[free].min() > 2000 / 8 * 0.7 and counts[free].max() < 2000 / 8 * 1.3


def test_starts_are_uniform_and_valid():
    env = VecSnake(4000, 4, 5, seed=1)
    env.reset()
    heads = torch.bincount(env.direction, minlength=4)
    assert heads.min() > 4000 / 4 * 0.8
    for i in range(50):
        body = body_of(env, i)
        dr, dc = MOVES[int(env.direction[i])]
        assert body == [(body[0][0] - k * dr, body[0][1] - k * dc) for k in range(3)]
        assert env.board[i, env.food[i]] == 0


@pytest.mark.parametrize("h,w,dtype", [(5, 25, torch.int8), (12, 12, torch.int16)])
def test_grid_dtype_and_invariants_on_bigger_boards(h, w, dtype):
    env = VecSnake(16, h, w, seed=2)
    env.reset()
    assert env.ages.dtype == dtype
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        obs, *_ = env.step(torch.randint(0, 4, (16,), generator=gen))
        for i in range(16):
            ages = sorted(a for a in env.board[i].tolist() if a > 0)
            assert ages == list(range(1, int(env.length[i]) + 1)) and env.board[i, env.food[i]] == 0
        assert torch.equal(obs[:, 3].reshape(16, -1), env.board.to(torch.uint8))


# ---------------------------------------------------------------- plain-Python reference


class RefSnake:
    """Plain-Python Snake with the same rules; food and start positions are read from the vector env."""

    def __init__(self, h, w, body, direction, food):
        self.h, self.w = h, w
        self.body, self.direction, self.food = deque(body), direction, food
        self.since_food, self.score, self.steps = 0, 0, 0

    def step(self, action):
        if (action + 2) % 4 == self.direction:
            action = self.direction
        dr, dc = MOVES[action]
        r, c = self.body[0][0] + dr, self.body[0][1] + dc
        self.steps += 1
        self.since_food += 1
        if not (0 <= r < self.h and 0 <= c < self.w):
            return -1.0, True, False
        eat = (r, c) == self.food
        if not eat:
            tail = self.body.pop()
        if (r, c) in self.body:
            if not eat:
                self.body.append(tail)
            return -1.0, True, False
        self.body.appendleft((r, c))
        self.direction = action
        if eat:
            self.score += 1
            self.since_food = 0
            if len(self.body) == self.h * self.w:
                return 1.0, True, False
            self.food = None  # the env chooses
            return 1.0, False, False
        return 0.0, False, self.since_food >= 2 * self.h * self.w

    def ages(self):
        grid = [0] * (self.h * self.w)
        for k, (r, c) in enumerate(self.body):
            grid[r * self.w + c] = len(self.body) - k
        return grid


def ref_from_env(env, i):
    body = body_of(env, i)
    dr, dc = MOVES[int(env.direction[i])]
    assert len(body) == 3 and body == [(body[0][0] - k * dr, body[0][1] - k * dc) for k in range(3)]
    food = divmod(int(env.food[i]), env.w)
    assert food not in body
    return RefSnake(env.h, env.w, body, int(env.direction[i]), food)


@pytest.mark.parametrize(
    "device,mode,h,w",
    [
        ("cpu", "sparse", 5, 5),
        ("cpu", "dense", 4, 6),
        pytest.param("cuda", "dense", 5, 5, marks=pytest.mark.gpu),
        pytest.param("cuda", "sparse", 4, 6, marks=pytest.mark.gpu),
    ],
)
def test_matches_plain_python_reference(device, mode, h, w):
    n, steps = 24, 1200
    env = VecSnake(n, h, w, device=device, seed=7, mode=mode)
    env.reset()
    refs = [ref_from_env(env, i) for i in range(n)]
    rng = torch.Generator().manual_seed(11)
    random_actions = torch.randint(0, 4, (steps, n), generator=rng).tolist()
    greedy_draw = torch.rand(steps, n, generator=rng).tolist()
    counts = dict(eat=0, die=0, trunc=0, win=0)
    for t in range(steps):
        actions = []
        for i, ref in enumerate(refs):  # mostly head for the food, so snakes grow long and crowd the board
            a = random_actions[t][i]
            if greedy_draw[t][i] < 0.7:
                (hr, hc), (fr, fc) = ref.body[0], ref.food
                a = DOWN if fr > hr else UP if fr < hr else RIGHT if fc > hc else LEFT
            actions.append(a)
        obs, reward, term, trunc, info = env.step(torch.tensor(actions, device=device))
        final = info["final_obs"]
        for i, ref in enumerate(refs):
            r, te, tr = ref.step(actions[i])
            assert (reward[i].item(), term[i].item(), trunc[i].item()) == (r, te, tr), (t, i)
            if ref.food is None:  # the env placed new food: it must be on an empty cell of the reference board
                ref.food = divmod(int(env.food[i]), w)
                assert ref.food not in ref.body
            expected = ref.ages()
            assert final[i, 3].reshape(-1).tolist() == expected, (t, i)
            assert int(info["score"][i]) == ref.score and int(info["episode_length"][i]) == ref.steps
            counts["eat"] += r > 0
            counts["die"] += r < 0
            counts["trunc"] += tr
            counts["win"] += te and r > 0
            if te or tr:
                refs[i] = ref = ref_from_env(env, i)
            else:
                assert final[i, 0].reshape(-1).argmax().item() == ref.body[0][0] * w + ref.body[0][1]
            assert obs[i, 3].reshape(-1).tolist() == ref.ages()
            assert obs[i, 2].reshape(-1).argmax().item() == ref.food[0] * w + ref.food[1]
    assert counts["eat"] > 300 and counts["die"] > 100, counts


@pytest.mark.parametrize(
    "device,n,h,w,longest_at_least",
    [("cpu", 48, 5, 6, 15), pytest.param("cuda", 4096, 10, 10, 20, marks=pytest.mark.gpu)],
)
def test_fused_step_plays_the_same_games_as_the_dense_step(device, n, h, w, longest_at_least):
    """The compiled fused step against the dense torch code, from the same state for thousands of steps: the same
    observations, rewards, ends, episode results and state, bit for bit, with snakes that grow long (truncation and
    winning are in the rules tests above, which run the fused step's function too)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    reference = VecSnake(n, h, w, device=device, seed=5, mode="dense")
    fused = VecSnake(n, h, w, device=device, seed=5, mode="fused")
    assert torch.equal(reference.reset(), fused.reset())
    rng = torch.Generator(device).manual_seed(2)
    counts = torch.zeros(3, dtype=torch.long, device=device)  # food eaten, deaths, the longest snake
    for t in range(3000):
        head_row, head_col = reference.head // w, reference.head % w
        food_row, food_col = reference.food // w, reference.food % w
        toward_food = torch.where(
            food_row != head_row,
            torch.where(food_row > head_row, DOWN, UP),
            torch.where(food_col > head_col, RIGHT, LEFT),
        )
        random_actions = torch.randint(0, 4, (n,), device=device, generator=rng)
        greedy = torch.rand(n, device=device, generator=rng) < 0.8  # mostly toward the food: long snakes
        actions = torch.where(greedy, toward_food, random_actions)
        expected, got = reference.step(actions), fused.step(actions)
        for name, a, b in zip(["next_obs", "reward", "terminated", "truncated"], expected, got):
            assert torch.equal(a, b), (t, name)
        for key in expected[4]:
            assert torch.equal(expected[4][key], got[4][key]), (t, key)
        for key in VecSnake._state_names:
            assert torch.equal(getattr(reference, key), getattr(fused, key)), (t, key)
        counts[:2] += torch.stack([expected[1].eq(1).sum(), expected[1].eq(-1).sum()])
        counts[2] = torch.maximum(counts[2], expected[4]["length"].max())
    eaten, died, longest = counts.tolist()
    # some snakes filled half the small board; on 10x10 the greedy play runs into itself sooner (23 cells at most on
    # the H200 lease of 2026-11-26, which matched bit for bit for all 3,000 steps)
    assert eaten > 50 * n and died > 10 * n and longest >= longest_at_least, counts


# ---------------------------------------------------------------- replay and n-step


def test_replay_buffer_wraps_around():
    rb = ReplayBuffer(5, (4, 2, 2), torch.device("cpu"), torch.device("cpu"))
    for start in (0, 3):
        vals = torch.arange(start, start + 3)
        obs = vals.view(3, 1, 1, 1).expand(3, 4, 2, 2).to(torch.uint8)
        rb.add(obs, vals, vals.float(), obs + 100, vals > 4, torch.full((3,), 0.9))
    assert rb.rewards.tolist() == [5.0, 1.0, 2.0, 3.0, 4.0]
    assert rb.obs[:, 0, 0, 0].tolist() == [5, 1, 2, 3, 4] and rb.next_obs[0, 0, 0, 0] == 105
    assert rb.terminated.tolist() == [True, False, False, False, False]
    assert (int(rb.ptr), int(rb.size)) == (1, 5)
    obs, actions, rewards, next_obs, term, disc = rb.sample(64, torch.Generator().manual_seed(0))
    assert torch.equal(obs[:, 0, 0, 0].long(), actions) and torch.equal(rewards, actions.float())
    assert set(actions.tolist()) <= {1, 2, 3, 4, 5}


def test_nstep_targets_by_hand():
    gamma, nstep = 0.5, NStep(3, 0.5, 2, (4, 1, 1), torch.device("cpu"))
    rewards = [[1, 1], [2, 1], [4, 1], [8, 1], [16, 1]]
    terminated = [[False, False], [True, False], [False, False], [False, False], [False, False]]
    truncated = [[False, False], [False, False], [False, True], [False, False], [False, False]]
    out = []
    for t in range(5):
        obs = torch.tensor([10 * t, 10 * t + 1], dtype=torch.uint8).view(2, 1, 1, 1).expand(2, 4, 1, 1)
        term, trunc = torch.tensor(terminated[t]), torch.tensor(truncated[t])
        out.append(
            nstep.push(obs, torch.tensor([t, t]), torch.tensor(rewards[t]).float(), obs + 100, term, term | trunc)
        )
    assert out[0] is None and out[1] is None
    # (start step, env) -> (return, next_obs value, terminated, discount), computed by hand
    expected = {
        (0, 0): (1 + gamma * 2, 110, True, gamma**2),  # env 0 terminates at step 1
        (0, 1): (1 + gamma + gamma**2, 121, False, gamma**3),  # env 1 truncates at step 2: bootstrap
        (1, 0): (2, 110, True, gamma),
        (1, 1): (1 + gamma, 121, False, gamma**2),
        (2, 0): (4 + gamma * 8 + gamma**2 * 16, 140, False, gamma**3),  # the new episode, full n steps
        (2, 1): (1, 121, False, gamma),
    }
    for start in range(3):
        obs, actions, ret, nxt, term, disc = out[start + 2]
        for e in range(2):
            want = expected[(start, e)]
            got = (ret[e].item(), int(nxt[e, 0, 0, 0]), term[e].item(), disc[e].item())
            assert got == pytest.approx(want), (start, e)
            assert int(obs[e, 0, 0, 0]) == 10 * start + e and actions[e].item() == start


def test_one_step_returns_are_plain_td():
    nstep = NStep(1, 0.9, 2, (4, 1, 1), torch.device("cpu"))
    obs = torch.zeros(2, 4, 1, 1, dtype=torch.uint8)
    term = torch.tensor([True, False])
    out = nstep.push(obs, torch.tensor([1, 2]), torch.tensor([1.0, -1.0]), obs + 7, term, term)
    assert out[2].tolist() == [1.0, -1.0] and out[4].tolist() == [True, False]
    assert out[5].tolist() == pytest.approx([0.9, 0.9]) and int(out[3][1, 0, 0, 0]) == 7


def test_qnetwork_and_render_shapes():
    env = VecSnake(3, 6, 7, seed=0)
    obs = env.reset()
    assert obs.shape == (3, 4, 6, 7) and obs.dtype == torch.uint8
    assert QNetwork(6, 7)(obs).shape == (3, 4)
    frame = env.render(1, cell=4)
    assert frame.shape == (24, 28, 3) and frame.dtype.name == "uint8"
    head = int(env.head[1])
    assert tuple(frame[(head // 7) * 4, (head % 7) * 4]) == (250, 220, 40)


# ---------------------------------------------------------------- the script


def run(args, cwd, timeout=240):
    env = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1")
    cmd = [sys.executable, SCRIPT, "--num-threads", "1", "--no-progress-bar", *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def refuse(args, cwd):
    """The command line of ``run`` in this process (helpers.run_in_process): for input refused before a run starts."""
    return run_in_process(SCRIPT, ["--num-threads", "1", "--no-progress-bar", *args], cwd)


SMALL = ["--num-envs", 32, "--batch-size", 32, "--buffer-size", 4096, "--learning-starts", 128, "--log-every", 256]


def test_short_training_run_logs_saves_and_evaluates(tmp_path):
    args = [*SMALL, "--total-timesteps", 1024, "--save-model", "--height", 6, "--width", 6]
    res = run(args + ["--capture-video"], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "memory estimate" in res.stdout
    (run_dir,) = glob.glob(str(tmp_path / "runs" / "Snake6x6__dqn_snake_vec__1__*"))
    tags = scalars(run_dir)
    for key in ["charts/SPS", "charts/episodic_return", "charts/episodic_length", "charts/score", "charts/epsilon"]:
        assert key in tags, key
    assert "losses/td_loss" in tags and "losses/q_values" in tags and "memory/estimated_mib" in tags
    assert max(step for step, _ in tags["charts/SPS"]) == 1024
    model = os.path.join(run_dir, "dqn_snake_vec.model")
    assert os.path.isfile(model) and os.path.isfile(os.path.join(run_dir, "checkpoint.pt"))
    for path in (model, os.path.join(run_dir, "checkpoint.pt")):  # each file names the script that wrote it
        assert torch.load(path, weights_only=True)["script"] == "dqn_snake_vec"
    videos = tmp_path / "videos" / os.path.basename(run_dir)
    assert (videos / "episode-0.mp4").is_file() and (videos / "episode-1.mp4").is_file()  # the cubic schedule
    res = run(["--eval-checkpoint", model, "--eval-episodes", 5], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "eval Snake6x6: mean return" in res.stdout and "over 5 episodes" in res.stdout


def test_fused_env_mode_trains_exactly_as_dense_on_the_cpu(tmp_path):
    """--env-mode fused plays dense's games (on the CPU from the same generator), so a run learns the same weights."""
    args = [*SMALL, "--total-timesteps", 1024, "--save-model", "--height", 5, "--width", 5]
    weights = {}
    for mode in ("dense", "fused"):
        (tmp_path / mode).mkdir()
        res = run([*args, "--env-mode", mode], tmp_path / mode)
        assert res.returncode == 0, res.stderr[-2000:]
        (model,) = glob.glob(str(tmp_path / mode / "runs" / "*" / "dqn_snake_vec.model"))
        weights[mode] = torch.load(model, weights_only=True)["model"]
    assert all(torch.equal(weights["dense"][key], weights["fused"][key]) for key in weights["dense"])


def test_sigterm_checkpoint_then_resume_reaches_the_total(tmp_path):
    env = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1")
    cmd = [sys.executable, SCRIPT, "--num-threads", "1", "--no-progress-bar", *map(str, SMALL)]
    proc = subprocess.Popen(
        cmd + ["--total-timesteps", "10000000", "--log-every", "64"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines, deadline = [], time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if sum(ln.startswith("iteration ") for ln in lines) >= 3:
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, "".join(lines) + out
    assert "stopping on SIGTERM" in out
    (ckpt_path,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    ckpt = run_utils.read_checkpoint(ckpt_path)
    k = ckpt["iteration"]
    assert k >= 6 and ckpt["global_step"] == 32 * k and ckpt["status"] == "stopped"
    assert f"--resume runs/{ckpt['run_name']}/checkpoint.pt" in out
    ckpt["args"]["total_timesteps"] = 32 * (k + 4)  # shorten the run so the test stays fast
    torch.save(ckpt, ckpt_path)
    res = run(["--resume", ckpt_path, "--num-envs", 8, "--learning-rate", 1.0, "--batch-size", 256], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"at step {32 * k}" in res.stdout and f"step {32 * (k + 4)}, SPS" in res.stdout
    assert re.search(r"learning_rate\s+0.0005\s+\(checkpoint\)", res.stdout)
    note = "note: --resume continues the run with its own settings, not --num-envs 8 (the run's 32), --learning-rate"
    assert note in res.stdout  # before: the typed flags were dropped without a word
    assert "--batch-size 256 (the run's 32)" in res.stdout  # typed, though the default: before, taken as not typed
    final = run_utils.read_checkpoint(ckpt_path)
    assert final["iteration"] == k + 4 and final["status"] == "finished"
    assert len(glob.glob(str(tmp_path / "runs" / "*"))) == 1  # the same run directory


def test_a_resumed_run_keeps_the_phase_of_its_target_network_updates(tmp_path):
    """--target-network-frequency 2 with --tau 1: the target is a copy of the Q-network after every 2nd gradient update,
    counted over the whole run. So at the end it equals the Q-network exactly when the run's update count (Adam's step)
    is even. Before: a resumed leg counted its updates from 1 again, a shift by the first leg's 3."""
    env = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1")
    args = [*SMALL, "--height", 6, "--width", 6, "--total-timesteps", 256, "--target-network-frequency", 2, "--tau", 1]
    cmd = [sys.executable, *at_update_prefix("sigterm", 3), SCRIPT, "--num-threads", "1", "--no-progress-bar"]
    res = subprocess.run([*cmd, *map(str, args)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0 and "stopping on SIGTERM" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    (ckpt_path,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    ckpt = run_utils.read_checkpoint(ckpt_path)
    assert int(ckpt["optimizer"]["state"][0]["step"]) == 3  # the third training step's update, then the stop
    ckpt["args"]["total_timesteps"] = 32 * (ckpt["iteration"] + 9)  # learning again from 4 iterations on: 5 updates
    torch.save(ckpt, ckpt_path)
    res = run(["--resume", ckpt_path], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    final = run_utils.read_checkpoint(ckpt_path)
    updates = int(final["optimizer"]["state"][0]["step"])
    copied = all(torch.equal(final["target_network"][k], final["model"][k]) for k in final["model"])
    assert updates == 8 and copied  # updates 2, 4, 6 and 8 copied it; 8 was the last


def test_a_resumed_run_writes_its_videos_beside_the_earlier_ones(tmp_path):
    """Before: the resumed leg counted game 0's episodes from 0 again and wrote episode-0.mp4 and episode-1.mp4 over
    the first leg's videos of those games. Now each resumed leg has a folder of its own."""
    args = ["--num-envs", 8, "--batch-size", 8, "--buffer-size", 64, "--learning-starts", 10**6, "--log-every", 64]
    args += ["--height", 5, "--width", 5, "--capture-video"]
    res = run([*args, "--total-timesteps", 96], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    (ckpt_path,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.pt"))
    first = {path: open(path, "rb").read() for path in glob.glob(str(tmp_path / "videos" / "*" / "*.mp4"))}
    assert {os.path.basename(path) for path in first} == {"episode-0.mp4", "episode-1.mp4"}
    ckpt = run_utils.read_checkpoint(ckpt_path)
    ckpt["args"]["total_timesteps"] = 320
    torch.save(ckpt | {"status": "stopped"}, ckpt_path)
    res = run(["--resume", ckpt_path, "--capture-video"], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert all(open(path, "rb").read() == video for path, video in first.items())
    resumed = glob.glob(str(tmp_path / "videos" / "*" / f"resumed-at-step-{ckpt['global_step']}" / "*.mp4"))
    assert {os.path.basename(path) for path in resumed} >= {"episode-0.mp4", "episode-1.mp4"}


def test_a_replay_memory_larger_than_the_free_memory_is_refused_at_start(tmp_path):
    """The replay memory grows with the board's area: one that cannot fit is a one-line error before anything is
    allocated (it was a traceback from the allocator, or, short of that, a process killed as the memory filled)."""
    import gpu_utils

    free = gpu_utils.free_memory(torch.device("cpu"))
    if free is None:
        pytest.skip("the free memory cannot be read here")
    transitions = 4 * free // (2 * 4 * 10 * 10 + 17)  # four times what fits: the allocator refuses it outright
    res = refuse(["--buffer-size", transitions, "--total-timesteps", 1024], tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --buffer-size {transitions} on 10x10 boards needs "), lines
    assert "GiB free on cpu; lower --buffer-size" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_an_n_step_ring_larger_than_the_free_memory_is_refused_at_start(tmp_path):
    """The n-step ring holds 2 x n x N observations on the training device: one that cannot fit was a traceback from
    the allocator after the run folder had been made."""
    import gpu_utils

    if gpu_utils.free_memory(torch.device("cpu")) is None:
        pytest.skip("the free memory cannot be read here")
    res = refuse(["--n-step", 10**9, "--total-timesteps", 1024, "--gpu", "false"], tmp_path)
    assert_one_line_error(res, "error: --n-step 1000000000 with --num-envs 256 on 10x10 boards needs ")
    assert "GiB free on cpu besides the replay memory; lower --n-step or --num-envs" in res.stderr
    assert not (tmp_path / "runs").exists()


def test_bad_input_is_one_line_error(tmp_path):
    res = run(["--height", 2], tmp_path)  # in a fresh interpreter; the other cases below raise in this process
    assert_one_line_error(res, "error: --height and --width must be at least 3")
    res = refuse(["--env-mode", "bogus"], tmp_path)  # a Literal flag: tyro refuses it and names the choices
    assert res.returncode == 2 and "'bogus'" in res.stderr and "'sparse'" in res.stderr
    assert_one_line_error(refuse(["--seed", -1], tmp_path), "error: --seed must be from 0 to 2**32 - 1, got -1")


@pytest.mark.parametrize(
    "changes,needle",
    [
        (dict(tau=0.0), r"--tau must be in \(0, 1\], got 0.0"),
        (dict(n_step=0), "--n-step"),
        (dict(buffer_size=16), "--buffer-size"),
        (dict(batch_size=0), "--batch-size must be at least 1, got 0"),
        (dict(gamma=1.5), r"--gamma must be in \(0, 1\], got 1.5"),
        (dict(updates_per_step=-1), "--updates-per-step must be at least 0, got -1"),
        (dict(target_network_frequency=0), "--target-network-frequency must be at least 1, got 0"),
        (dict(exploration_fraction=2.0), r"--exploration-fraction must be in \(0, 1\], got 2.0"),
        (dict(learning_rate=-1e-3), "--learning-rate must be at least 0"),
        (dict(max_grad_norm=-1.0), "--max-grad-norm must be positive"),
        (dict(start_e=2.0), r"--start-e, --end-e and --eval-epsilon must be in \[0, 1\], got \(2.0"),
        (dict(eval_epsilon=-0.1), "--eval-epsilon"),
        (dict(learning_starts=-5), "--learning-starts must be at least 0"),
        (dict(log_every=0), "--log-every must be at least 1"),
        (dict(checkpoint_every=-1), "--checkpoint-every must be at least 0"),
        # NaN fails every comparison: min() and max() of the three epsilons skipped a NaN that was not the first
        (dict(end_e=float("nan")), r"--start-e, --end-e and --eval-epsilon must be in \[0, 1\], got \(1.0, nan"),
        (dict(eval_epsilon=float("nan")), r"--start-e, --end-e and --eval-epsilon must be in \[0, 1\]"),
        # numpy's generator takes seeds in [0, 2**32): others were a traceback from run_utils.seed
        (dict(seed=-1), r"--seed must be from 0 to 2\*\*32 - 1, got -1"),
        (dict(seed=2**32), r"--seed must be from 0 to 2\*\*32 - 1, got 4294967296"),
    ],
)
def test_bad_arguments_are_rejected(changes, needle):
    import dataclasses

    from dqn_snake_vec import Args, validate

    with pytest.raises(ValueError, match=needle):
        validate(dataclasses.replace(Args(), **changes))


def test_bad_checkpoints_are_rejected_in_one_line(tmp_path):
    (tmp_path / "bogus.pt").write_text("not a checkpoint")
    torch.save({"weights": {}}, tmp_path / "other.pt")
    # a file that names no script (an older format) or another script is refused by that name, board size or not
    torch.save({"model": {}, "args": {"height": 10, "width": 10}}, tmp_path / "unnamed.model")
    torch.save({"model": {}, "args": {"height": 10, "width": 10}, "script": "ppo_continuous"}, tmp_path / "named.model")
    expected = {
        "bogus.pt": "cannot read checkpoint",
        "other.pt": "is not a dqn_snake_vec checkpoint",
        "missing.pt": "does not exist",
        "unnamed.model": "names no script, not dqn_snake_vec.py",
        "named.model": "was written by ppo_continuous.py, not dqn_snake_vec.py",
    }
    for name, words in expected.items():
        for flag in ("--eval-checkpoint", "--resume"):
            assert_one_line_error(refuse([flag, tmp_path / name], tmp_path), words)


# ---------------------------------------------------------------- the trust review's defects


def test_amp_runs_the_trunk_in_bf16_and_keeps_q_values_fp32():
    from dqn_snake_vec import QNetwork

    net = QNetwork(6, 6, amp=True)
    seen = []
    net.network[0].register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    q = net(VecSnake(8, 6, 6, seed=0).reset())
    assert seen == [torch.bfloat16]  # the convolutions run in bf16 ...
    assert q.dtype == torch.float32  # ... but TD targets and greedy argmaxes see fp32 Q-values


def _replay_batch(n=40, h=6, w=6):
    env = VecSnake(n, h, w, seed=0)
    obs = env.reset()
    actions = torch.randint(0, 4, (n,))
    next_obs, rewards, terminated, _, _ = env.step(actions)
    return obs, actions, rewards, next_obs.clone(), terminated, torch.full((n,), 0.99**3)


def test_micro_batches_give_the_full_batch_gradient():
    from dqn_snake_vec import QNetwork, td_loss

    torch.manual_seed(0)
    q_network, target_network = QNetwork(6, 6), QNetwork(6, 6)
    batch = _replay_batch()

    def loss(*rows):
        return td_loss(q_network, target_network, *rows)

    assert_micro_batches_match(loss, batch, list(q_network.parameters()), 6, atol=1e-6)


def test_cudagraphs_on_cpu_is_a_one_line_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    res = refuse(["--cudagraphs", "--gpu", "false"], tmp_path)
    assert res.returncode == 2 and res.stderr.startswith("error: --cudagraphs needs a CUDA device"), res.stderr


def test_memory_estimate_counts_the_acting_forward_over_every_game(tmp_path):
    """Acting runs the Q-network over all N games at once: with N above three training batches its activations set
    the peak (on an H100, 65,536 games peaked at 3.5x an estimate sized by the training batch alone)."""

    def activations_mib(num_envs):
        args = ["--num-envs", num_envs, "--batch-size", 32, "--learning-starts", 10**6, "--log-every", num_envs]
        res = run([*args, "--total-timesteps", 2 * num_envs], tmp_path)
        assert res.returncode == 0, res.stderr[-2000:]
        return float(re.search(r"activations\s+([\d.]+) MiB", res.stdout).group(1))

    small, large = activations_mib(32), activations_mib(1536)  # rows: max(3 x 32, 32) = 96, then 1536
    assert large / small == pytest.approx(1536 / 96, rel=0.02)


def test_games_resume_on_another_device_type_with_new_random_games():
    """A CUDA generator's state (16 bytes) does not fit a CPU generator (5,056 bytes), nor the other way round: a run
    moved between a GPU and a CPU keeps its boards and continues with new random draws. Before: 'RNG state is wrong
    size', which the resume turned into 'does not fit the network'."""
    env = VecSnake(8, 6, 6, seed=0)
    env.reset()
    state = env.state_dict() | {"generator": torch.zeros(16, dtype=torch.uint8)}  # as a CUDA generator saves it
    moved = VecSnake(8, 6, 6, seed=1)
    moved.load_state_dict(state)
    assert torch.equal(moved.ages, env.ages) and torch.equal(moved.head, env.head)
    again = VecSnake(8, 6, 6, seed=2)
    again.load_state_dict(state)
    assert torch.equal(again.gen.get_state(), moved.gen.get_state())  # the new draws follow from the checkpoint


def test_a_run_says_when_it_rounds_its_total_and_when_it_will_not_learn(tmp_path):
    """Before: --total-timesteps 100 on 8 games made 96 steps, and a --learning-starts past the end made a run that
    never learned, both without a word (the rounding line comes from run_utils.print_config: every script's)."""
    res = run(
        ["--height", 5, "--width", 5, "--num-envs", 8, "--total-timesteps", 100, "--learning-starts", 1000], tmp_path
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "note: 96 steps: --total-timesteps rounded down to whole iterations" in res.stdout
    assert "note: learning starts at step 1,000, after the run's end: it only acts" in res.stdout
    res = run(["--height", 5, "--width", 5, "--num-envs", 8, "--total-timesteps", 96, "--learning-starts", 8], tmp_path)
    assert res.returncode == 0 and "note:" not in res.stdout, res.stdout[-2000:]
