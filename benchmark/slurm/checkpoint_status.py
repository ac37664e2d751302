"""Say what `--resume-existing` does with each run of a sweep: resume it, skip it (finished) or start it fresh.

    python benchmark/slurm/checkpoint_status.py [--runs-dir runs] RUN_ID [RUN_ID ...]

A sweep run is identified by ``<env_tag>__<exp_name>__<seed>``; the training scripts name its directory
``runs/<RUN_ID>__<unix time>/``. The newest such directory that holds a ``checkpoint.pt`` decides:

- status ``finished``          -> ``skip``   (the run is complete; it is not run again)
- ``running`` or ``stopped``   -> ``resume`` (append ``--resume <path>`` to the run's command)
- no directory with a checkpoint -> ``fresh`` (start the run from scratch)
- a checkpoint that cannot be read -> ``error`` (the run fails with that message rather than silently starting over)

Prints one tab-separated line per RUN_ID: ``action  RUN_ID  checkpoint-path-or-'-'  note``, in the order given.
The sweep scripts (benchmark/common.sh) call this once per local sweep and once per SLURM array task, at the moment
the task starts, so a resubmitted sweep does the right thing per run. torch is imported only when a checkpoint is
found. Exit code 0, or 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

STATUSES = ("running", "stopped", "finished")


def run_dirs(runs_dir: str, run_id: str) -> list[str]:
    """Directories ``<runs_dir>/<run_id>__<digits>``, newest first (by the unix time in the name, then mtime)."""
    if not os.path.isdir(runs_dir):
        return []
    pattern = re.compile(re.escape(run_id) + r"__(\d+)$")
    found = []
    for name in os.listdir(runs_dir):
        m = pattern.match(name)
        path = os.path.join(runs_dir, name)
        if m and os.path.isdir(path):
            found.append((int(m.group(1)), os.path.getmtime(path), path))
    return [path for *_, path in sorted(found, reverse=True)]


def read_checkpoint(path: str) -> dict:
    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except RuntimeError:  # an old (non-zip) file cannot be memory-mapped
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(ckpt, dict) or "args" not in ckpt:
        raise ValueError("not a training checkpoint (no args)")
    return ckpt


def decide(runs_dir: str, run_id: str) -> tuple[str, str, str]:
    """Return (action, checkpoint path or '-', note) for one run."""
    dirs = run_dirs(runs_dir, run_id)
    without = [d for d in dirs if not os.path.isfile(os.path.join(d, "checkpoint.pt"))]
    with_ckpt = [d for d in dirs if d not in without]
    if not with_ckpt:
        note = "no earlier run with a checkpoint"
        if without:
            note += f" ({len(without)} run dir(s) without one, e.g. {without[0]})"
        return "fresh", "-", note
    path = os.path.join(with_ckpt[0], "checkpoint.pt")
    try:
        ckpt = read_checkpoint(path)
    except Exception as exc:  # any unreadable file gets the same one-line answer
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return "error", path, f"cannot read {path} ({type(exc).__name__}: {first}); move it away or fix it"
    status = ckpt.get("status")
    step = ckpt.get("global_step")
    total = (ckpt.get("args") or {}).get("total_timesteps")
    where = f"step {step:,}" if isinstance(step, int) else "unknown step"
    if isinstance(total, int):
        where += f" of {total:,}"
    others = f"; {len(dirs) - 1} other run dir(s) for it" if len(dirs) > 1 else ""
    if status == "finished":
        return "skip", path, f"finished at {where}: {path}{others}"
    if status not in STATUSES:
        return "resume", path, f"checkpoint without a known status ({status!r}) at {where}: {path}{others}"
    return "resume", path, f"{status} at {where}: {path}{others}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-dir", default="runs", help="where the run directories are (default: runs)")
    parser.add_argument("run_ids", nargs="+", metavar="RUN_ID", help="<env_tag>__<exp_name>__<seed>")
    args = parser.parse_args(argv)
    for run_id in args.run_ids:
        if not run_id or "/" in run_id or "\t" in run_id or "\n" in run_id:
            print(f"error: run id {run_id!r} must be <env_tag>__<exp_name>__<seed> without / or tabs", file=sys.stderr)
            return 2
    for run_id in args.run_ids:
        action, path, note = decide(args.runs_dir, run_id)
        print("\t".join((action, run_id, path, note)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
