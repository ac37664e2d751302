"""Snake as N games on one device: the environment of ``dqn_snake_vec.py``.

``VecSnake(4096, 10, 10, device="cuda")`` holds 4,096 games of Snake on 10 x 10 boards as tensors on one device and
steps them all at once with tensor ops, without a Python loop over the games. It is shaped like a gymnasium vector
env (``reset() -> obs``; ``step(actions) -> obs, reward, terminated, truncated, info``) whose observations, rewards
and flags stay torch tensors on that device; a finished game restarts in the same step, and ``info["final_obs"]``
holds its true last observation.

The rules (``VecSnake``'s docstring has them whole): an action is an absolute direction (``UP``, ``RIGHT``,
``DOWN``, ``LEFT``; reversing into the neck goes straight); food gives +1 and grows the snake by one; the wall or
the body gives -1 and ends the game; a full board wins; 2*H*W steps without food truncate. An observation is four
uint8 planes of H x W: head, body, food and the body's ages.

Three step modes play by the same rules: dense (masks over every board, no host sync; the GPU default), sparse (only
the boards that need food or a restart; the CPU default) and fused (dense's games, from the same random numbers, as
one pure function of the state that ``torch.compile`` turns into a few kernels and a CUDA graph can hold).

``dqn_snake_vec.py`` trains on one ``VecSnake`` (``--env-mode``; ``--cudagraphs`` picks fused), plays
``--eval-checkpoint`` games on another, keeps the games' state (``state_dict``) in its checkpoints and draws its
video frames with ``snake_view``; ``docs/dqn_snake_vec.md`` says more. The module needs only torch and numpy, and
importing it has no side effects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

UP, RIGHT, DOWN, LEFT = 0, 1, 2, 3  # the actions: absolute directions on the board
Mode = Literal["auto", "dense", "sparse", "fused"]
# next_obs, reward, terminated, truncated, info (final_obs, score, length, episode_return, episode_length)
StepResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]


class VecSnake:
    """N Snake games of H x W cells as tensors on one device, stepped together without Python loops.

    ``ages`` (N, H*W + 1): 0 empty, tail 1 ... head = length; the extra last column is a wall that every off-board
    move lands on. Actions are absolute (0 up, 1 right, 2 down, 3 left; reversing into the neck goes straight).
    Eating: +1 and grow by one. Wall or body (the cell the tail leaves is free): -1, game over, the board as before
    the move. A full board wins; 2*H*W steps without food truncate. Finished games restart in place (uniform start
    and food); ``info["final_obs"]`` is the true last observation. ``mode``: dense (masks over every board, no host
    sync; GPU default), sparse (only the boards that need food or a reset; CPU default), or fused: the dense games
    (the same random numbers, so the same games) as one pure function of the state, ``_step_tensors``, that
    torch.compile turns into a few kernels (``compile=False`` runs it eagerly).

    Bytes a fused step moves per game on an H x W board (C = H*W cells; 100 on 10 x 10; ages int8 up to 125 cells):
    the state read and written, 2 x (C + 42) (ages with the wall cell; head, direction and food int64; length int8;
    four int32/float32 counters); the food draw, 2 x 4C (C uniform floats written, then read: the argmax over empty
    cells); the reset draw, 2 x 8; the two observations written, 2 x 4C (final and next, uint8 planes); rewards, ends
    and episode results, about 20. That is about 18C + 120 bytes: 1.9 KB on 10 x 10, of which the observations and
    the food draw are 85%.
    """

    def __init__(
        self,
        num_envs: int,
        height: int = 10,
        width: int = 10,
        device: str | torch.device = "cpu",
        seed: int = 0,
        generator: torch.Generator | None = None,
        mode: Mode = "auto",
        compile: bool = True,
    ) -> None:
        if height < 3 or width < 3:
            raise ValueError(f"the board must be at least 3 x 3, got {height} x {width}")
        if mode not in ("auto", "dense", "sparse", "fused"):
            raise ValueError(f"mode must be auto, dense, sparse or fused, got {mode!r}")
        self.n = num_envs
        self.h, self.w = height, width
        self.hw = height * width
        self.device = torch.device(device)
        self.gen = generator if generator is not None else torch.Generator(self.device).manual_seed(seed)
        self.mode = ("dense" if self.device.type == "cuda" else "sparse") if mode == "auto" else mode
        # the smallest integer type that holds the longest snake (int8 on boards up to 125 cells)
        self.dtype = torch.int8 if self.hw < 2**7 - 1 else torch.int16 if self.hw < 2**15 - 1 else torch.int32
        # NEXT[cell, action]: the cell the head moves to, or H*W (the wall cell) off the board: read from the board's
        # cell numbers framed by the wall cell, shifted one cell up, right, down and left
        grid = torch.full((height + 2, width + 2), self.hw)
        grid[1:-1, 1:-1] = torch.arange(self.hw).view(height, width)
        moves = [grid[:-2, 1:-1], grid[1:-1, 2:], grid[2:, 1:-1], grid[1:-1, :-2]]
        self._next = torch.stack(moves, -1).view(self.hw, 4).to(self.device)
        # TURN[direction, action]: the action taken, with a reverse (d ^ 2) into the neck replaced by going straight
        turn = [[a if a != d ^ 2 else d for a in range(4)] for d in range(4)]
        self._turn_table = torch.tensor(turn, device=self.device)
        starts = []  # every valid start: head cell, heading, the 3 body cells head first, the same 3 sorted
        for d, (dr, dc) in enumerate([(-1, 0), (0, 1), (1, 0), (0, -1)]):
            for r, c in (divmod(cell, width) for cell in range(self.hw)):
                if 0 <= r - 2 * dr < height and 0 <= c - 2 * dc < width:
                    cells = [(r - k * dr) * width + c - k * dc for k in range(3)]
                    starts.append([cells[0], d, *cells, *sorted(cells)])
        self._starts = torch.tensor(starts, device=self.device)
        self._start_ages = torch.tensor([[3, 2, 1]], dtype=self.dtype, device=self.device)
        self._num_picks = len(starts) * (self.hw - 3)  # a reset draws a start and a food cell among the others
        self.ages = torch.zeros(self.n, self.hw + 1, dtype=self.dtype, device=self.device)
        self.ages[:, self.hw] = torch.iinfo(self.dtype).max
        self.board = self.ages[:, : self.hw]  # view of the real cells
        self.head = torch.zeros(self.n, dtype=torch.long, device=self.device)  # flat cell index
        self.direction = torch.zeros(self.n, dtype=torch.long, device=self.device)
        self.food = torch.zeros(self.n, dtype=torch.long, device=self.device)
        self.length = torch.zeros(self.n, dtype=self.dtype, device=self.device)
        self.since_food = torch.zeros(self.n, dtype=torch.int32, device=self.device)
        self.score = torch.zeros(self.n, dtype=torch.int32, device=self.device)
        self.ep_len = torch.zeros(self.n, dtype=torch.int32, device=self.device)
        self.ep_return = torch.zeros(self.n, device=self.device)
        # 4 plane-major observation buffers used in turn (final and next, two steps deep): no allocation per step,
        # and only the head and food marks of the buffer's last use need clearing
        # (fused builds fresh observations instead)
        num_bufs = 0 if self.mode == "fused" else 4
        self._bufs = [torch.zeros(4, self.n, self.hw, dtype=torch.uint8, device=self.device) for _ in range(num_bufs)]
        self._row_base = torch.arange(self.n, device=self.device) * self.hw
        self._marks = [(self._row_base, self._row_base) for _ in range(4)]  # where each buffer has head and food
        self._turn = 0
        self._cells = torch.arange(self.hw, device=self.device)
        # fullgraph: a graph break would leave Python between the kernels, which is what fused removes; static
        # shapes: each board and game count gets its own kernels (dynamo's automatic dynamic shapes failed on a
        # second VecSnake of another size in the same process: "sources must not be empty for symbol")
        fused = self.mode == "fused" and compile
        self._fused = torch.compile(self._step_tensors, fullgraph=True, dynamic=False) if fused else self._step_tensors

    def reset(self) -> torch.Tensor:
        """Start every game afresh; returns the observation (N, 4, H, W) uint8."""
        self._reset_games(torch.ones(self.n, dtype=torch.bool, device=self.device))
        self._turn ^= 1
        return self.observe(None if self.mode == "fused" else 2 * self._turn + 1)

    def observe(self, k: int | None = None, food_visible: torch.Tensor | None = None) -> torch.Tensor:
        """(N, 4, H, W) uint8 planes: head, body (head included), food, ages; a view of a fresh buffer or of ``k``."""
        head = self._row_base + self.head  # flat cells in the planes
        food = self._row_base + self.food
        if k is None:
            buf = torch.zeros(4, self.n, self.hw, dtype=torch.uint8, device=self.device)
        else:
            buf = self._bufs[k]
            buf[0].view(-1).index_fill_(0, self._marks[k][0], 0)
            buf[2].view(-1).index_fill_(0, self._marks[k][1], 0)
            self._marks[k] = head, food
        buf[3].copy_(self.board if self.hw < 256 else self.board.clamp(max=255))
        torch.clamp(buf[3], max=1, out=buf[1])
        buf[0].view(-1).index_fill_(0, head, 1)
        if food_visible is None:
            buf[2].view(-1).index_fill_(0, food, 1)
        else:
            buf[2].view(-1).index_put_((food,), food_visible.to(torch.uint8))
        return buf.view(4, self.n, self.h, self.w).transpose(0, 1)

    def step(self, actions: torch.Tensor) -> StepResult:
        """Advance every game one step. Returns next_obs, reward, terminated, truncated, info: final_obs (before any
        reset), score (food eaten), length, episode_return, episode_length, as at the end of this step.
        Observations are views of buffers that the env reuses two steps later (fused: fresh tensors): clone them to
        keep them longer.
        """
        if self.mode == "fused":  # the random numbers the dense step would draw, in its order: the same games
            food_noise = torch.rand(self.n, self.hw, device=self.device, generator=self.gen)
            reset_pick = torch.randint(0, self._num_picks, (self.n,), device=self.device, generator=self.gen)
            return self._fused(actions, food_noise, reset_pick)
        a = self._turn_table[self.direction, actions]
        nxt = self._next[self.head, a]
        cell = self.ages.gather(1, nxt.unsqueeze(1)).squeeze(1)
        dead = cell > 1  # the wall cell, or the body; age 1 is the tail, which moves on unless the snake eats
        alive = ~dead
        eat = nxt == self.food  # food is never on the snake, so an eating move is always legal
        self.length += eat
        self.board.sub_((alive ^ eat).to(self.dtype).unsqueeze(1)).clamp_min_(0)  # the tail advances
        self.ages.scatter_(1, nxt.unsqueeze(1), torch.where(alive, self.length, cell).unsqueeze(1))
        self.head = torch.where(alive, nxt, self.head)
        self.direction = torch.where(alive, a, self.direction)
        self.since_food.add_(1).mul_(~eat)
        self.ep_len += 1
        win = self.length == self.hw
        terminated = dead | win
        truncated = (self.since_food >= 2 * self.hw) & alive
        reward = eat.float() - dead.float()
        self.score += eat
        self.ep_return += reward
        self._place_food(eat & ~win)
        self._turn ^= 1
        info = dict(score=self.score, length=self.length, episode_return=self.ep_return, episode_length=self.ep_len)
        info = {k: v.clone() for k, v in info.items()} | dict(final_obs=self.observe(2 * self._turn, food_visible=~win))
        self._reset_games(terminated | truncated)
        return self.observe(2 * self._turn + 1), reward, terminated, truncated, info

    def _step_tensors(self, actions: torch.Tensor, food_noise: torch.Tensor, reset_pick: torch.Tensor) -> StepResult:
        """The dense step with its random numbers given, as tensor ops only: no host sync, no Python state, the
        state updated in place (so a CUDA graph can hold it) and fresh observations. Mode fused compiles it."""
        a = self._turn_table[self.direction, actions]
        nxt = self._next[self.head, a]
        cell = self.ages.gather(1, nxt.unsqueeze(1)).squeeze(1)
        dead = cell > 1  # the wall cell, or the body; age 1 is the tail, which moves on unless the snake eats
        alive = ~dead
        eat = nxt == self.food  # food is never on the snake, so an eating move is always legal
        length = self.length + eat
        board = (self.board - (alive ^ eat).to(self.dtype).unsqueeze(1)).clamp_min(0)  # the tail advances
        moved = board.scatter(1, nxt.clamp(max=self.hw - 1).unsqueeze(1), length.unsqueeze(1))  # the new head
        board = torch.where(alive.unsqueeze(1), moved, board)  # a dead snake's board stays as before the move
        head = torch.where(alive, nxt, self.head)
        direction = torch.where(alive, a, self.direction)
        since_food = (self.since_food + 1) * ~eat
        ep_len = self.ep_len + 1
        win = length == self.hw
        terminated = dead | win
        truncated = (since_food >= 2 * self.hw) & alive
        reward = eat.float() - dead.float()
        score = self.score + eat
        ep_return = self.ep_return + reward
        new_food = food_noise.masked_fill(board > 0, -1).argmax(1)  # a uniformly random empty cell
        food = torch.where(eat & ~win, new_food, self.food)
        info = dict(score=score, length=length, episode_return=ep_return, episode_length=ep_len)
        info["final_obs"] = self._planes(head, food, board, ~win)  # a won game's food was eaten
        # finished games restart: a start from the table, food on the k-th of the other cells
        done = terminated | truncated
        free = self.hw - 3
        start = self._starts[reset_pick // free]
        start_food = reset_pick % free
        for j in (5, 6, 7):  # skip the sorted body cells
            start_food = start_food + (start_food >= start[:, j])
        start_board = torch.zeros_like(board).scatter(1, start[:, 2:5], self._start_ages.expand(self.n, 3))
        self.board.copy_(torch.where(done.unsqueeze(1), start_board, board))
        self.head.copy_(torch.where(done, start[:, 0], head))
        self.direction.copy_(torch.where(done, start[:, 1], direction))
        self.food.copy_(torch.where(done, start_food, food))
        self.length.copy_(torch.where(done, 3, length))
        self.since_food.copy_(torch.where(done, 0, since_food))
        self.score.copy_(torch.where(done, 0, score))
        self.ep_len.copy_(torch.where(done, 0, ep_len))
        self.ep_return.copy_(torch.where(done, 0.0, ep_return))
        next_obs = self._planes(self.head, self.food, self.board, torch.ones_like(win))
        return next_obs, reward, terminated, truncated, info

    def _planes(
        self, head: torch.Tensor, food: torch.Tensor, board: torch.Tensor, food_visible: torch.Tensor
    ) -> torch.Tensor:
        """A fresh (N, 4, H, W) uint8 observation from state tensors: what ``observe`` writes into its buffers."""
        planes = [
            self._cells == head.unsqueeze(1),
            board > 0,
            (self._cells == food.unsqueeze(1)) & food_visible.unsqueeze(1),
            board if self.hw < 256 else board.clamp(max=255),  # ages (non-negative) as uint8, as observe does
        ]
        return torch.stack([plane.to(torch.uint8) for plane in planes], 1).view(self.n, 4, self.h, self.w)

    def _set(self, mask: torch.Tensor, rows: torch.Tensor | slice, **values: torch.Tensor | int | float) -> None:
        """Set state of the games in ``mask`` (dense: every game through ``torch.where``; sparse: the ``rows``)."""
        for key, value in values.items():
            if self.mode != "sparse":
                setattr(self, key, torch.where(mask, value, getattr(self, key)))
            else:
                getattr(self, key)[rows] = value

    def _place_food(self, mask: torch.Tensor) -> None:
        """Put food on a uniformly random empty cell of every game where ``mask`` is set."""
        rows = slice(None) if self.mode != "sparse" else mask.nonzero().squeeze(1)
        board = self.board[rows]
        if len(board):
            scores = torch.rand(len(board), self.hw, device=self.device, generator=self.gen).masked_fill_(board > 0, -1)
            self._set(mask, rows, food=scores.argmax(1))

    def _reset_games(self, done: torch.Tensor) -> None:
        """Restart the games where ``done``: a uniformly random start, food on a uniformly random other cell."""
        rows = slice(None) if self.mode != "sparse" else done.nonzero().squeeze(1)
        m = self.n if self.mode != "sparse" else len(rows)
        if m == 0:
            return
        free = self.hw - 3
        pick = torch.randint(0, self._num_picks, (m,), device=self.device, generator=self.gen)
        start = self._starts[pick // free]
        food = pick % free  # the food is the k-th cell not on the snake: skip the sorted body cells
        for j in (5, 6, 7):
            food += food >= start[:, j]
        if self.mode != "sparse":
            self.board.mul_((~done).unsqueeze(1))
            self.ages.scatter_add_(1, start[:, 2:5], self._start_ages * done.unsqueeze(1))
        else:
            self.board[rows] = 0
            self.ages[rows.unsqueeze(1), start[:, 2:5]] = self._start_ages
        new = dict(head=start[:, 0], direction=start[:, 1], food=food, length=3, since_food=0, score=0, ep_len=0)
        self._set(done, rows, ep_return=0.0, **new)

    def set_game(self, i: int, body: Sequence[tuple[int, int]], direction: int, food: tuple[int, int]) -> None:
        """Put game ``i`` in a given state (tests, demos): ``body`` lists (row, col) cells head first."""
        self.board[i] = 0
        for k, (r, c) in enumerate(body):
            self.board[i, r * self.w + c] = len(body) - k
        self.head[i] = body[0][0] * self.w + body[0][1]
        self.direction[i] = direction
        self.food[i] = food[0] * self.w + food[1]
        self.length[i] = len(body)
        for counter in (self.since_food, self.score, self.ep_len, self.ep_return):
            counter[i] = 0

    def render(self, i: int = 0, obs: torch.Tensor | None = None, cell: int = 16) -> np.ndarray:
        """RGB uint8 (H*cell, W*cell, 3) frame of game ``i`` (``obs`` or the current state): head yellow, food red."""
        return snake_view((self.observe() if obs is None else obs)[i].cpu().numpy(), cell)

    _state_names = ("ages", "head", "direction", "food", "length", "since_food", "score", "ep_len", "ep_return")

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The games' state and the generator's, on the CPU: what a checkpoint keeps to continue the same games."""
        return {k: getattr(self, k).cpu() for k in self._state_names} | {"generator": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue the games of ``state_dict()``, on this env's device (the same number of games and board size)."""
        for k in self._state_names:
            getattr(self, k).copy_(state[k])
        saved = state["generator"]
        if saved.numel() == self.gen.get_state().numel():
            self.gen.set_state(saved)
        else:  # another device type's generator (a CPU checkpoint on a GPU, say): new draws, seeded from the old
            self.gen.manual_seed(int.from_bytes(hashlib.sha256(saved.numpy().tobytes()).digest()[:8], "little"))


def snake_view(planes: np.ndarray, cell: int = 16) -> np.ndarray:
    """One game's (4, H, W) observation as an RGB uint8 (H*cell, W*cell, 3) frame: head yellow, food red, the body
    green, brighter towards the head."""
    ages = planes[3].astype(np.float32)
    body = planes[1] > 0
    img = np.full((*body.shape, 3), (30, 30, 40), dtype=np.uint8)
    img[body] = (20, 0, 40)
    img[body, 1] = (90 + 140 * ages[body] / max(ages.max(), 1)).astype(np.uint8)
    img[planes[2] > 0] = (230, 40, 40)
    img[planes[0] > 0] = (250, 220, 40)
    return np.kron(img, np.ones((cell, cell, 1), dtype=np.uint8))
