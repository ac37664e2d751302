"""Helpers shared by the test files: a simulated out-of-memory GPU, the micro-batch gradient check, waiting for a
condition, and reading a run's logged scalars.

An out-of-memory GPU on any machine: `python -c INJECT <layer> <limit> <script> args...` runs the script as
__main__ with torch.nn.<layer>.forward raising torch.cuda.OutOfMemoryError on more than <limit> rows while gradients
are on (the update), never in the no-grad rollout."""

import contextlib
import io
import os
import runpy
import signal
import subprocess
import sys
import time

# dqn_snake_vec.py on 8 games taking env steps only (learning would start after the end), with a checkpoint every 10
# iterations: the sweep and SLURM stop tests signal it once its first checkpoint is written. 5,000 iterations take
# about 5 s on one core, far longer than a SIGTERM or scancel takes to arrive; 100 iterations (0.9 s) were not: on a
# fast machine the run ended first, or was ending when the signal killed it (CI, 2026-11-27)
SNAKE_LONGER_STEPS = 40_000
SNAKE_LONGER = f"--total-timesteps {SNAKE_LONGER_STEPS} --learning-starts 100000000 --buffer-size 800".split()
SNAKE_LONGER += ["--checkpoint-every", "10"]

# `python -c SIGNAL_IN_SETUP <script> args...` runs the script as __main__ and sends itself SIGTERM when the run starts
# its GPU monitor: during the set-up, after the run's folder, lock and event file exist, before the first iteration
SIGNAL_IN_SETUP = """
import os, runpy, signal, sys
import gpu_utils
start = gpu_utils.GPUMonitor.start
def signalled(self):
    os.kill(os.getpid(), signal.SIGTERM)
    return start(self)
gpu_utils.GPUMonitor.start = signalled
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


INJECT = """
import runpy, sys, torch
layer = getattr(torch.nn, sys.argv.pop(1))
limit = int(sys.argv.pop(1))
forward = layer.forward
def limited(self, x):
    if torch.is_grad_enabled() and x.shape[0] > limit:
        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (injected above {limit} rows)")
    return forward(self, x)
layer.forward = limited
sys.argv[0] = sys.argv.pop(1)
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def oom_prefix(layer: str, limit: int) -> list[str]:
    """Interpreter arguments to put before the script's path."""
    return ["-c", INJECT, layer, str(limit)]


def assert_micro_batches_match(loss, batch, params, micro_batch: int, atol: float) -> None:
    """The scripts' micro-batch loop (ppo_atari's update_step) over chunks of ``micro_batch`` rows, each loss weighted
    by its share of the rows, gives the whole batch's stats and gradients, up to float rounding (``loss(*rows)``
    returns (loss, stats by name))."""
    import torch

    full_loss, full_stats = loss(*batch)
    full_loss.backward()
    full = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    rows = len(batch[0])
    stats = {}
    for start in range(0, rows, micro_batch):
        chunk = [t[start : start + micro_batch] for t in batch]
        chunk_loss, chunk_stats = loss(*chunk)
        weight = len(chunk[0]) / rows
        (chunk_loss * weight).backward()
        stats = {name: stats.get(name, 0) + value * weight for name, value in chunk_stats.items()}
    assert rows > micro_batch, "the batch must split into several micro-batches"
    torch.testing.assert_close(stats, full_stats, atol=atol, rtol=1e-5)
    for g, p in zip(full, params):
        torch.testing.assert_close(p.grad, g, atol=atol, rtol=1e-4)


def wait_for(predicate, timeout, what):
    """Poll ``predicate`` every 0.1 s; an AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def scalars(path: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Every point of every scalar tag logged in ``path`` (a run folder, all its event files, or one event file), as
    (step, value) pairs in the order written, by tag. No sampling: TensorBoard's default keeps at most 10,000 points a
    tag. A fresh read each call, so it also reads a run that is still writing (the points flushed so far)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(event.step, event.value) for event in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def run_in_process(script, args, cwd) -> subprocess.CompletedProcess:
    """A training script's command line run in this process (as ``__main__``, by runpy) from ``cwd``, its exit status
    and output returned as a subprocess's: for input it refuses, or a run it finds nothing to do for, before a run
    starts. A fresh interpreter spends about 2 CPU-seconds importing torch and the rest; this, about 0.05 s. A command
    line that gets past the checks raises AssertionError instead of training here (its threads, seeds and signal
    handlers would stay in this process): start that one with subprocess. Each script's own file keeps a case in a
    fresh interpreter too, where output at import time would show."""
    import gpu_utils

    def past_the_checks(*args, **kwargs):  # every script's first call once its input is accepted (eval's too)
        raise AssertionError(f"{script} {' '.join(command[1:])} got past its checks: run it in a subprocess")

    command = [str(script), *map(str, args)]
    stdout, stderr = io.StringIO(), io.StringIO()
    argv, here, limit_threads = sys.argv, os.getcwd(), gpu_utils.limit_threads
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}  # run_utils.stop_in_one_line's
    sys.argv, gpu_utils.limit_threads = command, past_the_checks
    status = 0
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        sys.argv, gpu_utils.limit_threads = argv, limit_threads
        os.chdir(here)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess(command, status, stdout.getvalue(), stderr.getvalue())


def assert_one_line_error(res, *words):
    """A script's run refused its input: exit 2, one `error: ...` line on stderr holding each of ``words``, no
    traceback."""
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert "Traceback" not in res.stderr


# `python -c AT_UPDATE <action> <n> <script> args...` runs the script as __main__ and, at the n-th call of its update
# step (the gpu_utils.CudaGraph that every script trains through: a PPO minibatch step, a Snake training step; not
# Snake's acting step), does
# <action> first: "sigterm" sends this process SIGTERM (a stop that arrives during that iteration); "garble"
# overwrites every runs/*/checkpoint.pt with bytes that are no checkpoint; "crash" raises a RuntimeError (a bug, say)
AT_UPDATE = """
import glob, os, runpy, signal, sys
import gpu_utils
action = sys.argv.pop(1)
when = int(sys.argv.pop(1))
call = gpu_utils.CudaGraph.__call__
calls = []
def counted(self, *args):
    if self.name == "acting step":
        return call(self, *args)
    calls.append(1)
    if len(calls) == when and action == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    if len(calls) == when and action == "garble":
        for path in glob.glob("runs/*/checkpoint.pt"):
            with open(path, "wb") as f:
                f.write(b"no checkpoint")
    if len(calls) == when and action == "crash":
        raise RuntimeError("injected crash")
    return call(self, *args)
gpu_utils.CudaGraph.__call__ = counted
sys.argv[0] = sys.argv.pop(1)
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def at_update_prefix(action: str, call: int) -> list[str]:
    """Interpreter arguments to put before the script's path (see AT_UPDATE)."""
    return ["-c", AT_UPDATE, action, str(call)]


class RunsCode:
    """A pickle payload: unpickling it calls ``os.mkdir(marker)``, as a tampered checkpoint could run any code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.mkdir, (self.marker,))


def save_checkpoint_with_code(path, marker, **state) -> None:
    """A checkpoint.pt with the keys a script writes (``state``) and a payload that creates the folder ``marker``
    when the file is unpickled with code allowed (torch.load with weights_only off)."""
    import torch

    torch.save({"model": {}, "args": {}, **state, "note": RunsCode(str(marker))}, path)


# A stand-in for a training script, for tests of the speed tools rather than of a script: it writes an event file as
# the scripts do (charts/SPS from the second logged step on: the number in a file SPS beside it, else its first
# argument; threads/torch: the OMP_NUM_THREADS it was given, 0 without one), prints the line a failed CUDA graph
# capture prints, and exits with its second argument when that is a number. tensorboard alone, no torch: it starts
# in a fraction of a second.
FAKE_RUN = """
import os, sys, time
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter
sps_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "SPS")
sps = float(open(sps_file).read()) if os.path.exists(sps_file) else float(sys.argv[1])
code = int(sys.argv[2]) if sys.argv[2:3] and sys.argv[2].isdigit() else 0
writer = EventFileWriter("runs/Fake-v0__fake__1__1")
threads = float(os.environ.get("OMP_NUM_THREADS", "0"))
for step, tag, value in [(1, "threads/torch", threads), (2, "charts/SPS", sps), (3, "charts/SPS", sps)]:
    summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
    writer.add_event(Event(step=step, wall_time=time.time(), summary=summary))
writer.close()
print("update: eager (CUDA graph capture failed: RuntimeError: boom)")
print(f"the fake run's last words, exit {code}", file=sys.stderr)
sys.exit(code)
"""
