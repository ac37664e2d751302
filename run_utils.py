"""The run's lifecycle, written once for every training script: checkpoints, the run folder's lock, stop signals,
TensorBoard and W&B, the config print, and the end of a run.

Each script keeps its algorithm (environment, network, rollout, advantages, loss, update) and calls this module in a
few visible lines for what every run does the same way. Importing it has no side effects.
"""

from __future__ import annotations

import os
from pathlib import Path

import gpu_utils

CHECKPOINT_STATUSES = ("running", "stopped", "finished", "diverged")
"""What a checkpoint's ``status`` says: running (a periodic checkpoint), stopped (on a signal), finished (its total
reached), diverged (NaN or infinite weights came after it; its weights are the last finite ones)."""

RUN_LOCK = ".lock"
"""The file in a run folder that a live run holds locked (``fcntl.flock``) for as long as it trains."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line that says what to do."""


class RunInUse(ValueError):
    """Another live process trains in this run folder."""


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The dict a training script saved at ``path``, read as data only (``torch.load(weights_only=True)``: tensors,
    numbers, strings, lists and dicts; a pickle that would run code is refused). Every reader of checkpoints in the
    repository goes through here. Raises ``FileNotFoundError`` or ``CheckpointError`` with a one-line message."""
    import torch  # imported here: the report and the sweep read checkpoints without needing torch otherwise

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist; pass the path of a checkpoint.pt or .model file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable or unsafe file gets the same one-line answer
        raise CheckpointError(
            f"cannot read checkpoint {path!r} ({type(exc).__name__}); it is not a checkpoint a script of this "
            "repository wrote, or it holds more than data"
        ) from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "args" not in ckpt:
        raise CheckpointError(f"{path!r} is not a training checkpoint (no model/args); use one a script wrote")
    return ckpt


def lock_run_dir(run_dir: str | os.PathLike) -> int | None:
    """Hold ``<run_dir>/.lock`` locked while this process lives, so that no second process writes into a live run's
    folder (a sweep asks ``run_is_live``). Returns the descriptor (keep it open), or None where locks do not work (no
    ``fcntl``, or a lock file that is not this user's regular file). Raises ``RunInUse`` when another process holds
    it."""
    try:
        import fcntl
    except ImportError:
        return None
    os.makedirs(run_dir, exist_ok=True)
    path = Path(run_dir, RUN_LOCK)
    fd = gpu_utils.open_own_file(path, os.O_RDWR | os.O_CREAT)
    if fd is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = f"{os.fspath(run_dir)} is in use by a live run (it holds {path})"
        raise RunInUse(f"{holder}; let it finish or stop it first") from None
    except OSError:
        os.close(fd)
        return None
    return fd


def run_is_live(run_dir: str | os.PathLike) -> bool:
    """True while a process holds ``<run_dir>/.lock`` (``lock_run_dir``): the run is training now. A killed run's
    lock is released by the OS, so a crashed run is never taken for a live one."""
    try:
        import fcntl
    except ImportError:
        return False
    fd = gpu_utils.open_own_file(Path(run_dir, RUN_LOCK), os.O_RDONLY)
    if fd is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False
