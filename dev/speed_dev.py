"""The developers' speed tables, built on benchmark/speed.py: old code against new on one machine, and runs at once.

    python dev/speed_dev.py ab --before c9316f8            # old and new code, interleaved, at the table's rows
    python dev/speed_dev.py concurrency --copies 1 2 4     # copies at once, started by hand: total SPS vs one alone

A speed change is judged on one machine: two machines' CPUs differ by up to 1.6x. `ab` runs each row of the
profile with the old scripts and with this checkout, the old first in odd rounds and the new first in even ones, so
that a drift of the machine touches both alike. `concurrency` starts C copies of a setting at once as a user would
(no pinning, no thread variables: each run shares the CPUs itself, gpu_utils.CpuShare), or with --pin each on its
own CPUs with OMP_NUM_THREADS set (what the sweep engine does); the target on a CPU machine: 2 copies >= 1.0x and
4 >= 0.9x the SPS of one alone.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmark"))
import speed  # noqa: E402
from speed import DASH, Setting, UsageError, fmt, md_table  # noqa: E402

import gpu_utils  # noqa: E402  (speed put the repository root on the path)

AB_SCRIPTS = ("ppo_atari.py", "ppo_continuous.py", "dqn_snake_vec.py", "gpu_utils.py")
CONCURRENCY = {  # short CPU settings; dqn_snake_vec.py's are those of the "started by hand" issue (#25)
    "ppo_atari": Setting("ppo_atari.py --env-id ALE/Pong-v5 --num-envs 4 --minibatch-size 128".split(), 512, 8),
    "dqn_snake_vec": Setting(
        "dqn_snake_vec.py --learning-starts 10000 --log-every 12800 --gpu false --checkpoint-every 0".split(), 12800, 5
    ),
    "ppo_continuous": Setting(["ppo_continuous.py", *speed.CHEETAH], 2048, 6),
    "ppo_continuous_heavy": Setting(["ppo_continuous.py", *speed.CHEETAH, "--preset", "heavy"], 8192, 6),  # GPU
}


def resolve_commit(ref: str) -> str:
    """The short hash of commit ``ref`` of this repository, or "" when it is none (or git is not at hand)."""
    resolve = ["git", "-C", ROOT, "rev-parse", "--short", "--verify", "--quiet", f"{ref}^{{commit}}"]
    try:
        return subprocess.run(resolve, capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:
        return ""


def export_before(commit: str, folder: str) -> None:
    """Every top-level module of ``commit`` (its scripts and those they import: gpu_utils.py, run_utils.py, the env
    modules) in ``folder`` (git archive), the commit named in its REF file: for a machine without the history (the
    GPU lease's prepare). A script run from there imports its own commit's modules, not the installed ones."""
    listed = subprocess.run(["git", "-C", ROOT, "ls-tree", "--name-only", commit], capture_output=True, text=True)
    modules = [name for name in listed.stdout.split() if name.endswith(".py")] or list(AB_SCRIPTS)
    archive = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", commit, *modules], capture_output=True)
    if archive.returncode != 0:
        raise UsageError(f"git archive of {commit} failed: {archive.stderr.decode().strip().splitlines()[-1]}")
    os.makedirs(folder, exist_ok=True)
    subprocess.run(["tar", "x", "-C", folder], input=archive.stdout, check=True)
    with open(os.path.join(folder, "REF"), "w") as f:
        f.write(commit + "\n")


def before_code(before: str) -> tuple[str, str]:
    """The folder of the old scripts and what it is: a folder as given (its REF names the commit), or a commit of
    this repository copied into a temporary folder for as long as this tool runs."""
    if os.path.isdir(before):
        missing = [f for f in AB_SCRIPTS if not os.path.isfile(os.path.join(before, f))]
        if missing:
            raise UsageError(f"--before {before}: no {', '.join(missing)} there; give a commit, or a folder of one")
        ref = os.path.join(before, "REF")
        commit = open(ref).read().strip() if os.path.isfile(ref) else "not recorded"
        return os.path.abspath(before), f"folder {before} (commit {commit})"
    commit = resolve_commit(before)
    if not commit:
        raise UsageError(f"--before {before}: neither a folder nor a commit of this repository")
    folder = tempfile.mkdtemp(prefix="speed_before_")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    export_before(commit, folder)
    return folder, f"commit {commit}"


def ab_cell(results: list[speed.Result]) -> tuple[float | None, str]:
    """The median SPS of one side's runs of a row, and its cell: the median, each run's SPS or status, warnings."""
    ok = [r.sps for r in results if r.ok]
    median = statistics.median(ok) if ok else None
    each = ", ".join(fmt(r.sps) if r.ok else r.status for r in results)
    warnings = "".join(f"; {w}" for w in sorted({r.warning for r in results if r.warning}))
    return median, f"{fmt(median)} ({each}){warnings}"


def cmd_ab(a) -> int:
    folder, what = before_code(a.before)
    new = [s for s in speed.profile(a.profile, False) if speed.selected(s.shown(a.scale), a.only)]
    old = [replace(s, args=[os.path.join(folder, s.args[0]), *s.args[1:]]) for s in new]
    if a.dry_run:
        print("\n".join(f"before: {o.shown(a.scale)}\nafter:  {n.shown(a.scale)}" for n, o in zip(new, old)))
        return 0
    info = speed.machine_info()
    runs: dict[str, list] = {"before": [[] for _ in new], "after": [[] for _ in new]}
    for round_ in range(a.rounds):
        for i, (before, after) in enumerate(zip(old, new)):
            order = [("before", before), ("after", after)]
            for which, s in order if round_ % 2 == 0 else order[::-1]:
                print(f"[speed] round {round_ + 1}/{a.rounds}, {which}: {s.shown(a.scale)} ...", flush=True)
                runs[which][i] += speed.run_settings([s], a.scale, a.timeout)
    rows = []
    for i, s in enumerate(new):
        (before, before_cell), (after, after_cell) = [ab_cell(runs[which][i]) for which in ("before", "after")]
        ratio = f"**{after / before:.2f}x**" if before and after else DASH
        rows.append([f"`{s.shown(a.scale)}`", before_cell, after_cell, ratio])
    header = ["command (before: the old script's)", "before: SPS median (each run)", "after: SPS median (each run)"]
    results = [r for per_row in runs.values() for rs in per_row for r in rs]
    body = [
        f"Before: {what}. After: this checkout. {a.rounds} round(s), the old code first in odd rounds.",
        "",
        *md_table([*header, "after / before"], rows),
        *speed.failures(results),
    ]
    speed.emit(speed.document("Before and after, same machine", info, a.note, body), a, f"ab_{a.profile}")
    return 0 if results and all(r.ok for r in results) else 1


def cmd_concurrency(a) -> int:
    unknown = set(a.scripts) - set(CONCURRENCY)
    if unknown:
        raise UsageError(f"--scripts takes {', '.join(CONCURRENCY)}; got {', '.join(sorted(unknown))}")
    copies = sorted({1, *a.copies})  # the ratio needs one run alone
    allowed = gpu_utils.allowed_cpus()
    if a.dry_run:
        for name in a.scripts:
            for n in copies:
                cpus = gpu_utils.split_cpus(allowed, n) if a.pin else [None] * n
                shown = CONCURRENCY[name].shown(a.scale)
                print(f"{n} at once: {shown}; " + ", ".join(f"CPUs {c}" if c else "CPUs shared" for c in cpus))
        return 0
    info, rows, results = speed.machine_info(), [], []
    target = {2: 1.0, 4: 0.9}
    for name in a.scripts:
        alone = None
        for n in copies:
            print(f"[speed] {name}: {n} at once ...", flush=True)
            cpus = gpu_utils.split_cpus(allowed, n) if a.pin else None
            done = speed.run_settings([CONCURRENCY[name]] * n, a.scale, a.timeout, cpus, by_hand=not a.pin)
            results += done
            total = sum(r.sps for r in done) if all(r.ok for r in done) else None
            alone = total if n == 1 else alone
            ratio = total / alone if total and alone else None
            met = DASH
            if n in target:
                met = f">= {target[n]:.2f}x: " + ("met" if ratio and ratio >= target[n] else "not met")
            threads = " / ".join(DASH if r.threads is None else str(r.threads) for r in done)
            status = "ok" if total else "; ".join(sorted({r.status for r in done if not r.ok}))
            per_copy = " / ".join(fmt(r.sps) for r in done)
            rows.append([name, n, per_copy, fmt(total), f"{ratio:.2f}x" if ratio else DASH, threads, met, status])
    how = "started by hand: no pinning, no thread variables"
    if a.pin:
        how = "each pinned to its CPUs with OMP_NUM_THREADS set"
    body = [
        f"Copies at once, each with the same step budget (x{a.scale:g}), {how}. Total SPS: the sum of the copies' "
        "median `charts/SPS`; threads/torch: each copy's last share of the CPUs.",
        "",
        *md_table(
            ["script", "copies", "per-copy SPS", "total SPS", "x one alone", "threads/torch", "target", "status"], rows
        ),
        *speed.failures(results),
    ]
    speed.emit(speed.document("Runs at once", info, a.note, body), a, "concurrency_pinned" if a.pin else "concurrency")
    return 0 if all(r.ok for r in results) else 1


@speed.sweep.one_line_errors
def main(argv: list[str] | None = None) -> int:
    p = speed.Parser(prog="speed_dev.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True, parser_class=speed.Parser)
    b = sub.add_parser("ab", help="old and new code at the table's rows, interleaved on this machine")
    b.add_argument("--before", required=True, help="the old code: a git commit, or a folder (gpu_lease.py prepare's)")
    b.add_argument("--profile", choices=["cpu", "gpu"], default="cpu", help="whose rows (speed.py table's)")
    b.add_argument("--rounds", type=speed.count(1), default=2, help="interleaved rounds of old and new")
    b.add_argument("--only", nargs="*", help="rows whose command contains one of these")
    k = sub.add_parser("concurrency", help="1, 2, 4 copies at once: total SPS against one run alone")
    k.add_argument("--copies", type=speed.count(1), nargs="+", default=[1, 2, 4])
    k.add_argument("--scripts", nargs="+", default=list(CONCURRENCY)[:3], help=", ".join(CONCURRENCY))
    k.add_argument("--pin", action="store_true", help="each copy on its own CPUs, as the sweep engine runs them")
    for sp in (b, k):
        sp.add_argument("--scale", type=speed.count(0.01, float), default=1.0, help="multiply every step budget")
        sp.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
        sp.add_argument("--timeout", type=speed.count(1, float), default=240, help="seconds before a run is stopped")
        sp.add_argument("--out", default=os.path.join(ROOT, "benchmark", "results"), help="folder for the table")
        sp.add_argument("--note", default="", help="a line under the machine (e.g. other load)")
        sp.add_argument(
            "--host", default=os.environ.get("HOST_LABEL", speed.socket.gethostname()), help="name in files"
        )
    a = p.parse_args(argv)
    return {"ab": cmd_ab, "concurrency": cmd_concurrency}[a.mode](a)


if __name__ == "__main__":
    sys.exit(main())
