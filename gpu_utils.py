"""The machine, for every training script: device choice and rotation, TF32, RNG state, CPU threads and shares,
batch sizes, memory estimates, out-of-memory back-off, CUDA graphs and GPU monitoring (docs/devices-threads-memory.md).
Importing it has no side effects; ``python gpu_utils.py`` prints what this machine offers.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn


class DeviceError(ValueError):
    """A device request that this machine cannot satisfy; the message is one line that says what to change."""


class BatchSizeError(ValueError):
    """A batch size that does not divide the total batch; the message lists valid sizes near the request."""


def first_line(exc: BaseException, width: int = 200) -> str:
    """An exception's first line, at most ``width`` characters, for a one-line message; its type's name without one."""
    text = str(exc).strip()
    return text.splitlines()[0][:width] if text else type(exc).__name__


def rotate(session: int, cuda_offset: int, device_count: int) -> int:
    """Return the GPU index for run number ``session``: ``(cuda_offset + session) % device_count``.

    4 sessions on 2 GPUs land on 0, 1, 0, 1; offset 4 on 8 GPUs puts sessions 0..3 on GPUs 4..7.
    """
    if device_count < 1:
        raise DeviceError("no GPU to rotate over: device_count must be at least 1")
    if session < 0 or cuda_offset < 0:
        raise DeviceError(f"session ({session}) and cuda offset ({cuda_offset}) must be >= 0")
    return (cuda_offset + session) % device_count


def _env_int(name: str, default: int) -> int:
    """Read an integer environment variable, with a one-line error when it is not an integer."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise DeviceError(f"environment variable {name}={value!r} must be an integer") from None


def select_device(gpu: str = "auto", session: int = 0, cuda_offset: int | None = None) -> tuple[torch.device, str]:
    """``--gpu`` (auto, true, false, N or cuda:N) as a ``torch.device`` and the reason, in one line.

    auto and true rotate: GPU ``rotate(session + LOCAL_RANK, cuda_offset or $CUDA_OFFSET, count)``, except inside a
    SLURM job given GPUs, where process LOCAL_RANK takes visible GPU LOCAL_RANK. A request this machine cannot meet,
    or two torchrun processes on one GPU (which NCCL refuses), is a ``DeviceError``.
    """
    if session < 0 or (cuda_offset is not None and cuda_offset < 0):  # on the CPU too: a sweep's typo shows at once
        raise DeviceError(
            f"--session {session} and --cuda-offset {cuda_offset} must be at least 0 (or the offset unset)"
        )
    if isinstance(gpu, bool):  # never let False become device 0
        gpu = "true" if gpu else "false"
    text = str(gpu).strip().lower()
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", 1)
    if text in ("false", "cpu", "no"):
        return torch.device("cpu"), f"--gpu {gpu}"
    if text in ("auto", "true", "cuda", "gpu", "yes"):
        if count == 0:
            if text == "auto":
                return torch.device("cpu"), "--gpu auto, no GPU here"
            raise DeviceError(
                f"--gpu {gpu} asks for a GPU but CUDA is not available here; use --gpu auto or --gpu false"
            )
        if local_world > count:
            raise DeviceError(
                f"torchrun starts {local_world} processes on this node but it has {count} GPU(s): two would share one "
                f"GPU, which NCCL refuses; use --nproc-per-node {count} or --gpu false"
            )
        if os.environ.get("SLURM_JOB_ID") and os.environ.get("CUDA_VISIBLE_DEVICES"):
            index = local_rank % count
            why = f"SLURM job {os.environ['SLURM_JOB_ID']} owns GPUs {os.environ['CUDA_VISIBLE_DEVICES']}"
            return torch.device("cuda", index), f"--gpu {text}, {why}: visible GPU {index} of {count}"
        offset = _env_int("CUDA_OFFSET", 0) if cuda_offset is None else cuda_offset
        index = rotate(session + local_rank, offset, count)
        rank = f" + local rank {local_rank}" if local_world > 1 else ""
        return torch.device("cuda", index), f"--gpu {text}, session {session}{rank} + offset {offset} of {count} GPUs"
    index_text = text.removeprefix("cuda:")
    if not index_text.isdecimal():
        raise DeviceError(f"--gpu {gpu!r} is not understood; use auto, true, false, a GPU index N or cuda:N")
    index = int(index_text)
    if index >= count:
        have = "no GPU" if count == 0 else f"{count} GPU{'s' if count > 1 else ''} (0..{count - 1})"
        raise DeviceError(f"--gpu {gpu} asks for GPU {index} but this machine has {have}; pick another or auto")
    if local_world > 1:
        raise DeviceError(f"--gpu {gpu} would put all {local_world} torchrun processes on GPU {index}; use --gpu auto")
    return torch.device("cuda", index), f"--gpu {gpu}"


def device_label(device: torch.device) -> str:
    """What a run trains on, in a few words, for its event file: the GPU's name, or the CPU's model and how many CPUs
    the run may use. A run resumed on another machine logs its own, so a report can tell the parts apart."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    return f"CPU{' ' + model if model else ''}, {available_cpus()} cores"


def bf16_note(device: torch.device, cpuinfo: str = "/proc/cpuinfo") -> str:
    """Why ``--amp`` will be slow here, or "": a CPU without bf16 instructions (x86's ``avx512_bf16`` or ``amx_bf16``)
    emulates bf16, far slower than fp32. GPUs, and CPUs whose flags cannot be read, get ""."""
    if device.type != "cpu" or not os.path.exists(cpuinfo):
        return ""
    with open(cpuinfo) as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), None)
    if flags is None or {"avx512_bf16", "amx_bf16"} & set(flags):
        return ""
    return "amp: this CPU has no bf16 instructions (avx512_bf16, amx_bf16), so bf16 is emulated: drop --amp for speed"


def enable_tf32(enabled: bool = True, deterministic: bool = False) -> bool:
    """Allow TF32 matmuls and convolutions on GPUs of compute capability 8 or more; return whether TF32 is on.
    cuDNN's benchmark mode is on with CUDA unless ``deterministic``: it may pick a non-deterministic algorithm."""
    has_cuda = torch.cuda.is_available()
    torch.backends.cudnn.benchmark = bool(has_cuda and not deterministic)
    torch.backends.cudnn.deterministic = bool(deterministic)
    supported = has_cuda and torch.cuda.get_device_capability()[0] >= 8
    on = bool(enabled and supported)
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")
    return on


def rng_state(device: torch.device) -> dict:
    """The random state a checkpoint keeps: torch's CPU generator and, on a GPU, that device's. These are all a run
    draws from after its start (python's and numpy's are seeded once; environments keep their own)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore what :func:`rng_state` returned; a GPU state is restored only onto a GPU."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on, sorted (its affinity mask where the OS has one, else all the machine's)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def available_cpus() -> int:
    """How many CPUs this process may run on (see ``allowed_cpus``)."""
    return len(allowed_cpus())


@dataclass(frozen=True)
class ThreadBudget:
    """How many CPU threads one run may use, and what decided it."""

    threads: int
    why: str


def thread_budget(requested: int = 0) -> ThreadBudget:
    """The CPU threads one run should use: ``requested`` (``--num-threads``) when given, else the CPUs it may run on
    (its affinity, which ``taskset`` and schedulers set), capped by ``SLURM_CPUS_PER_TASK`` and ``OMP_NUM_THREADS``;
    ``why`` names the variable that capped it, or the first one set (an explicit budget either way)."""
    most = 4 * (os.cpu_count() or 1)  # beyond, threads only slow torch down; at 100,000 the OS refuses them
    if not 0 <= requested <= most:
        raise ValueError(f"--num-threads must be 0 (automatic) or 1 to {most} (4 per CPU), got {requested}")
    if requested:
        return ThreadBudget(requested, "--num-threads")
    threads, why = available_cpus(), "CPU affinity"
    for var in ("SLURM_CPUS_PER_TASK", "OMP_NUM_THREADS"):
        head = os.environ.get(var, "").split(",")[0].strip()  # OMP_NUM_THREADS=4,2: 4 at the outer level
        value = int(head) if head.isdecimal() else 0
        if 0 < value < threads or (value and why == "CPU affinity"):  # set: an explicit budget, never above
            threads, why = min(value, threads), var
    return ThreadBudget(max(1, threads), why)


def split_cpus(cpus: Sequence[int], parts: int) -> list[list[int]]:
    """Split ``cpus`` into ``parts`` disjoint contiguous groups whose sizes differ by at most one and that together
    are all of ``cpus`` (runs at once each get their own cores). With more parts than CPUs, part i gets
    ``[cpus[i % len(cpus)]]``."""
    if parts < 1 or not cpus:
        raise ValueError(f"split_cpus needs at least one part and one CPU, got {parts} parts of {list(cpus)}")
    cpus = list(cpus)
    if parts > len(cpus):
        return [[cpus[i % len(cpus)]] for i in range(parts)]
    size, extra = divmod(len(cpus), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [cpus[bounds[i] : bounds[i + 1]] for i in range(parts)]


def _pin(cpus: Sequence[int]) -> None:
    """Pin every thread of this process (torch's and the environments' workers too) to ``cpus``, where possible."""
    if not hasattr(os, "sched_setaffinity"):
        return
    tasks = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]
    for tid in tasks:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # the thread has ended meanwhile
            pass


class CpuShare:
    """This run's share of the CPUs among the runs live on the machine, for runs started by hand.

    Each run holds a lock file (``fcntl.flock``) in a private per-user directory while it lives, so a killed run
    frees its place without cleanup. The constructor, then ``update()`` at most once every ``interval`` seconds,
    counts the live runs in order of start and takes this run's part of ``split_cpus``: torch threads (at most
    ``max_torch_threads``) and CPU affinity. Inert when the budget is explicit (``--num-threads``, the thread
    variables, a narrower affinity), without ``fcntl``, or, saying so, when the directory is not private to this user.
    """

    def __init__(
        self,
        budget: ThreadBudget,
        directory: str | Path | None = None,
        interval: float = 1.0,
        max_torch_threads: int | None = None,
    ) -> None:
        self.threads, self.why = budget.threads, budget.why
        self.interval = interval
        self.max_torch_threads = max_torch_threads or budget.threads  # a small MLP runs fastest on one
        self.cpus = allowed_cpus()
        self._pid = os.getpid()
        self._next_update = 0.0
        self._part = self.cpus
        self._file = None
        try:
            import fcntl
        except ImportError:  # Windows: no flock, no affinity
            return
        if budget.why != "CPU affinity" or len(self.cpus) < (os.cpu_count() or 1) or not hasattr(os, "getuid"):
            return  # an explicit budget wins
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        default = Path(runtime, "gpu-rl") if runtime else Path(f"/tmp/gpu-rl-{os.getuid()}")
        self.directory = Path(directory or default)
        name = f"{time.time_ns():020d}-{self._pid}"
        problem = _private_directory(self.directory)
        try:
            if not problem:  # lock under a name the others skip, then rename: no run ever sees it unlocked
                self._file = open(self.directory / f"{name}.new", "w")
                fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.path = self.directory / f"{name}.lock"
                os.rename(self.directory / f"{name}.new", self.path)
        except OSError as exc:
            problem = f"cannot use {self.directory}: {exc.strerror or type(exc).__name__}"
            (self.directory / f"{name}.new").unlink(missing_ok=True)  # a file system without locks: nothing left
            self._file = None
        if problem:  # a run never fails for want of a share: it keeps its budget, alone
            print(f"threads: no CPU share with other runs ({problem})")
            return
        os.register_at_fork(after_in_child=self._forget)  # a forked worker must not hold or release the lock
        self.update()  # this run's share from its first step on

    def _forget(self) -> None:
        if self._file is not None:
            self._file.close()  # closes the child's copy only: the parent's lock stays held
            self._file = None

    def live_runs(self) -> list[Path]:
        """The lock files of the live runs, oldest first; dead runs' files are removed."""
        import fcntl

        live = [self.path]  # this run counts even if something removed its file
        for path in self.directory.glob("*.lock"):
            fd = open_own_file(path, os.O_RDONLY) if path != self.path else None
            if fd is None:  # this run's, or not a run's: a FIFO, a link, another user's file
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                path.unlink(missing_ok=True)  # we could lock it: its run is gone
            except BlockingIOError:
                live.append(path)
            except OSError:  # removed by another run meanwhile
                pass
            finally:
                os.close(fd)
        return sorted(live)

    def update(self) -> bool:
        """Take this run's share of the CPUs, at most once every ``interval`` seconds; True when it changed."""
        now = time.monotonic()
        if self._file is None or now < self._next_update or os.getpid() != self._pid:
            return False
        self._next_update = now + self.interval
        live = self.live_runs()
        rank = live.index(self.path)
        cpus = split_cpus(self.cpus, len(live))[rank]
        if cpus == self._part:
            return False
        self._part = cpus
        self.threads = len(cpus)
        self.why = f"run {rank + 1} of {len(live)} live runs: CPUs {cpus}" if len(live) > 1 else "alone: all its CPUs"
        torch.set_num_threads(min(self.threads, self.max_torch_threads))
        _pin(cpus)
        return True

    def close(self) -> None:
        """Leave the machine to the other runs (a killed run's place is freed by the OS instead)."""
        if self._file is not None and os.getpid() == self._pid:
            self.path.unlink(missing_ok=True)
            self._file.close()
            self._file = None


def _private_directory(path: Path) -> str:
    """Make ``path`` (mode 0700) where it is missing. "" when it is a directory of this user's that no one else may
    write to, else why not, in a few words: a predictable name in /tmp can be made first by another user."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot use {path}: {exc.strerror or type(exc).__name__}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory"
    if info.st_uid != os.getuid():
        return f"{path} belongs to another user"
    if info.st_mode & 0o022:
        return f"{path} is writable by other users"
    return ""


def open_own_file(path: str | Path, flags: int) -> int | None:
    """A descriptor of ``path`` when it is a regular file of this user's, else None: a FIFO, a device, a symbolic
    link or another user's file is never opened for real (O_NONBLOCK keeps a FIFO from blocking the open)."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
        os.close(fd)
        return None
    return fd


def limit_threads(num_threads: int = 1) -> None:
    """Cap OpenMP/MKL/BLAS threads (inherited by env workers: call it before making them) and torch's threads to
    ``num_threads``; torch's inter-op pool gets one thread, as the scripts run one op at a time."""
    if num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ[var] = str(num_threads)
    torch.set_num_threads(num_threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only settable once, before any inter-op work; a second call keeps the first setting
        pass


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n``, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def choose_batch_size(
    total: int, requested: int | str = "auto", target: int | None = None, parts: int | None = None
) -> int:
    """A minibatch size that divides ``total``: ``total / parts`` (``--num-minibatches``) when given, else
    ``requested`` (``--minibatch-size``), where "auto" is the largest divisor not above ``target``. A
    ``BatchSizeError`` names the flag and lists valid values."""
    if total < 1:
        raise BatchSizeError(f"the total batch must be at least 1, got {total}")
    divisors_of_total = divisors(total)
    if parts is not None:
        if parts < 1 or total % parts:
            valid = ", ".join(map(str, divisors_of_total[:12]))
            raise BatchSizeError(
                f"--num-minibatches {parts} cannot split the total batch {total} (envs x steps) evenly; valid: {valid}"
            )
        return total // parts
    if isinstance(requested, str):
        text = requested.strip().lower()
        if text == "auto":
            limit = total if target is None else max(2, target)  # a minibatch of one row normalises nothing
            return max(d for d in divisors_of_total if d <= limit)
        if not text.isdecimal():
            raise BatchSizeError(f"--minibatch-size {requested!r} must be 'auto' or a positive integer")
        requested = int(text)
    if requested < 1 or total % requested != 0:
        near = sorted(divisors_of_total, key=lambda d: (abs(d - requested), d))[:6]
        relation = "is larger than" if requested > total else "does not divide"
        raise BatchSizeError(
            f"--minibatch-size {requested} {relation} the total batch {total} (envs x steps); valid sizes near it: "
            + ", ".join(str(d) for d in sorted(near))
        )
    return requested


def parse_micro_batch(text: str, rows: int) -> int:
    """``--micro-batch``: ``auto`` is the whole minibatch of ``rows`` (a run that fits pays nothing), else N >= 1."""
    value = text.strip().lower()
    if value == "auto":
        return rows
    if not value.isdecimal() or int(value) < 1:
        raise BatchSizeError(f"--micro-batch {text!r} must be 'auto' or a positive integer")
    return min(int(value), rows)


CUDA_CONTEXT_BYTES = 500 * 2**20
"""Typical memory the CUDA context and kernels take on a GPU outside PyTorch's allocator."""

CUBLAS_WORKSPACE_BYTES = 64 * 2**20
"""cuBLAS and cuBLASLt workspaces of one CUDA stream, taken from PyTorch's allocator. A run with CUDA graphs holds
three: the default stream's, the warm-up stream's and the graph's own."""

_OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "rmsprop": 1, "sgd_momentum": 1, "sgd": 0}


@dataclass
class MemoryEstimate:
    """Estimated device memory of a training run, in bytes. ``total`` is what PyTorch's allocator will hold at its
    peak (compare ``torch.cuda.max_memory_allocated()``); the CUDA context and kernels lie outside it."""

    weights: int
    gradients: int
    optimizer_state: int
    batch: int
    rollout: int
    activations: int
    cuda_context: int
    workspace: int = 0
    parameters: int = 0  # the model's, for the printout

    @property
    def total(self) -> int:
        """Allocator bytes: every part except the CUDA context."""
        data = self.batch + self.rollout + self.activations + self.workspace
        return self.weights + self.gradients + self.optimizer_state + data

    def __str__(self) -> str:
        rows = [
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("optimizer state", self.optimizer_state),
            ("minibatch data", self.batch),
            ("rollout storage", self.rollout),
            ("activations", self.activations),
            ("cuBLAS workspace", self.workspace),
            ("total (allocator)", self.total),
        ]
        lines = [f"memory estimate ({self.parameters:,} parameters)", "-" * 32]
        lines += [f"{name:<18}{nbytes / 2**20:>11.2f} MiB" for name, nbytes in rows]
        if self.cuda_context:
            lines.append(f"{'+ CUDA context':<18}{self.cuda_context / 2**20:>11.2f} MiB (outside the allocator)")
        return "\n".join(lines)


def free_memory(
    device: torch.device,
    meminfo: str = "/proc/meminfo",
    cgroup: str = "/sys/fs/cgroup",
    proc_cgroup: str = "/proc/self/cgroup",
) -> int | None:
    """Bytes a new allocation on ``device`` can take now, or None where it cannot be read: CUDA's free memory, or on
    the CPU ``MemAvailable`` lowered to what the cgroup (v2) limits of this process's cgroup and its ancestors leave."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open(meminfo) as f:
            kib = next((int(line.split()[1]) for line in f if line.startswith("MemAvailable:")), None)
    except OSError:
        return None
    if kib is None:
        return None
    free = kib * 1024
    try:
        with open(proc_cgroup) as f:
            own = next((line.strip()[3:] for line in f if line.startswith("0::")), "/")
    except OSError:
        own = "/"
    directory = Path(cgroup, own.lstrip("/"))
    for level in [directory, *directory.parents]:  # a job's limit binds its steps too
        try:
            with open(level / "memory.max") as f:
                limit = f.read().strip()
            with open(level / "memory.current") as f:
                used = int(f.read().strip())
            if limit.isdecimal():
                free = min(free, max(0, int(limit) - used))
        except (OSError, ValueError):
            pass
        if level == Path(cgroup):
            break
    return free


def _activation_bytes(model: nn.Module, example_input: torch.Tensor | tuple, batch_size: int) -> int:
    """Sum the output sizes of every leaf module over one no-grad forward pass, scaled to ``batch_size`` rows."""
    total = 0

    def hook(_module: nn.Module, _inputs: object, output: object) -> None:
        nonlocal total
        for out in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(out, torch.Tensor):
                total += out.numel() * out.element_size()

    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    rows = max(1, inputs[0].shape[0]) if inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].dim() else 1
    return total * batch_size // rows


def estimate_memory(
    model: nn.Module,
    optimizer: str = "adam",
    batch_bytes: int = 0,
    rollout_bytes: int = 0,
    activation_bytes: int | None = None,
    example_input: torch.Tensor | tuple | None = None,
    batch_size: int = 1,
    cudagraphs: bool = False,
) -> MemoryEstimate:
    """Estimate the device memory a run needs: weights, gradients, optimizer state, data, activations, context.

    Without ``activation_bytes``, activations are the leaf modules' outputs over one no-grad forward of
    ``example_input``, scaled to ``batch_size`` rows. The cuBLAS workspaces and the CUDA context count only when the
    weights are on a GPU; cuDNN's autotuning workspaces (taken from free memory, at each new shape) do not.
    """
    key = optimizer.lower()
    if key not in _OPTIMIZER_STATES:
        raise ValueError(f"unknown optimizer {optimizer!r}; use one of {', '.join(_OPTIMIZER_STATES)}")
    weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    if activation_bytes is None:
        activation_bytes = 0 if example_input is None else _activation_bytes(model, example_input, batch_size)
    on_gpu = any(t.is_cuda for t in model.parameters())
    return MemoryEstimate(
        weights=weights,
        gradients=trainable,
        optimizer_state=_OPTIMIZER_STATES[key] * trainable,
        batch=batch_bytes,
        rollout=rollout_bytes,
        activations=activation_bytes,
        cuda_context=CUDA_CONTEXT_BYTES if on_gpu else 0,
        workspace=CUBLAS_WORKSPACE_BYTES * (3 if cudagraphs else 1) if on_gpu else 0,
        parameters=sum(p.numel() for p in model.parameters()),
    )


@dataclass
class MicroBatch:
    """Rows per backward pass (``--micro-batch``), halved by ``halve_on_oom``; ``backoffs``: (rows tried, rows now)."""

    rows: int
    backoffs: list[tuple[int, int]] = field(default_factory=list)


def halve_on_oom(step: Callable, micro: MicroBatch, *args):
    """``step(*args)``, again with half the micro-batch on each CUDA out-of-memory, down to one row; says the rows it
    settled on. ``step`` must start from cleared gradients and split its minibatch into ``micro.rows`` rows."""
    tried = micro.rows
    while True:
        try:
            out = step(*args)
            break
        except torch.cuda.OutOfMemoryError:
            if micro.rows == 1:
                raise
        # outside the except block, so the traceback no longer holds the failed attempt's tensors
        micro.rows //= 2
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if micro.rows != tried:
        print(f"micro-batch: CUDA out of memory at {tried} rows, now {micro.rows} rows per backward pass")
        micro.backoffs.append((tried, micro.rows))
    return out


def learning_rate_tensor(learning_rate: float, device: torch.device) -> torch.Tensor:
    """A learning rate for Adam as a device tensor, annealed in place with ``fill_``, so a captured update needs no
    re-capture. float64 on the CPU, where the fused Adam then computes exactly as with a Python float; float32 for
    CUDA's fused kernel."""
    return torch.tensor(learning_rate, dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)


def compile_policy(policy: Callable, compile: bool, cudagraphs: bool) -> Callable:
    """``--compile``: torch.compile the action step; ``--cudagraphs``: in mode reduce-overhead, torch.compile's CUDA
    graphs, one per batch shape, each call a new step (the rollout copies the outputs before the next call)."""
    if not (compile or cudagraphs):
        return policy
    compiled = torch.compile(policy, mode="reduce-overhead" if cudagraphs else "default")

    def marked(*args):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args)

    return marked if cudagraphs else compiled


def all_reduce_gradients(parameters: Sequence[nn.Parameter], world_size: int) -> None:
    """Average the gradients of ``parameters`` over the processes of a torchrun job, in one flat all_reduce."""
    import torch.distributed as dist

    grads = [p.grad for p in parameters]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    torch._foreach_copy_(grads, torch._utils._unflatten_dense_tensors(flat / world_size, grads))


Tensors = torch.Tensor | tuple[torch.Tensor, ...] | dict[str, torch.Tensor]  # what a captured step returns


class CudaGraph:
    """Run ``fn`` as one CUDA graph: LeanRL's whole-update capture (tensordict's ``CudaGraphModule``) in a few lines.

    The first ``warmup`` calls run ``fn`` eagerly (and for real) on one shared side stream, so cuBLAS, the allocator
    and the optimizer's state settle; the next captures it on static copies of its arguments, and every call from
    then on copies its arguments in and replays. So ``fn`` takes tensors of fixed shapes, makes no host sync and
    returns tensors that the next call overwrites (clone what you keep); an optimizer inside needs
    ``capturable=True`` and ``zero_grad(set_to_none=True)`` first. Each replay advances the default CUDA generator;
    other generators are not tracked. Disabled, or after a failed capture (said once), every call runs ``fn``
    eagerly: the run goes on, slower.
    """

    warmup_stream: torch.cuda.Stream | None = None  # one for all: cuBLAS keeps a workspace per stream, never freed

    def __init__(
        self,
        fn: Callable[..., Tensors],
        enabled: bool = True,
        warmup: int = 3,
        name: str = "step",
    ):
        self.fn = fn
        self.enabled = enabled
        self.warmup = warmup
        self.name = name
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_args: tuple[torch.Tensor, ...] = ()
        self.static_out: Tensors | None = None
        self.failure = ""  # why the capture failed, when it did

    def __call__(self, *args: torch.Tensor) -> Tensors:
        if not self.enabled:
            return self.fn(*args)
        if self.graph is None and self.calls < self.warmup:
            self.calls += 1
            if CudaGraph.warmup_stream is None:
                CudaGraph.warmup_stream = torch.cuda.Stream()
            side = CudaGraph.warmup_stream
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = self.fn(*args)
            torch.cuda.current_stream().wait_stream(side)
            return out
        if self.graph is None:
            self.static_args = tuple(arg.clone() for arg in args)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):  # records the kernels without running them: the replay below runs them
                    self.static_out = self.fn(*self.static_args)
            except Exception as exc:  # noqa: BLE001 - any failure to capture: the same step, eagerly
                self.failure = f"{type(exc).__name__}: {first_line(exc)}"
                print(f"{self.name}: eager (CUDA graph capture failed: {self.failure})")
                self.enabled = False
                self.static_args = ()
                return self.fn(*args)
            self.graph = graph
        else:
            for static, arg in zip(self.static_args, args, strict=True):
                static.copy_(arg)
        self.graph.replay()
        return self.static_out


class GPUMonitor:
    """Sample GPU utilization and memory at ``1/interval`` Hz in a background thread (NVML via nvidia-ml-py), for
    ``collect()``'s mean and peak since its last call: PPO's bursts of rollout and update escape one-second snapshots.
    Nothing is sampled on the CPU, without NVML, or (said once) where NVML cannot sample the device."""

    def __init__(self, device: torch.device | str, interval: float = 0.1) -> None:
        self.device = torch.device(device)
        self.interval = interval
        self.note = ""  # why nothing is sampled, when it is not
        self._samples: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handle = None

    def start(self) -> GPUMonitor:
        """Start sampling (nothing on CPU or without NVML); returns self. ``with GPUMonitor(...)`` calls it."""
        if self.device.type != "cuda":
            return self
        try:
            import pynvml  # provided by nvidia-ml-py, an optional dependency
        except ImportError:
            return self
        try:
            pynvml.nvmlInit()
            self._nvml = pynvml
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self._handle = _nvml_handle(pynvml, str(torch.cuda.get_device_properties(index).uuid))
            self._sample()  # fails here, once, when this device cannot be sampled
        except Exception as exc:  # monitoring is a nicety, never a reason to fail a run
            self.note = f"GPU monitor: NVML cannot sample {self.device} ({type(exc).__name__}: {exc}); no gpu/* logs"
            print(self.note)
            return self
        self._thread = threading.Thread(target=self._run, name="GPUMonitor", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> tuple[float, float]:
        util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
        used = self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used / 2**20
        return float(util), float(used)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sample = self._sample()
            except Exception as exc:
                self.note = f"GPU monitor: sampling stopped ({type(exc).__name__}: {exc})"
                print(self.note)
                return
            with self._lock:
                self._samples.append(sample)
            self._stop.wait(self.interval)

    def collect(self) -> dict[str, float]:
        """Mean and peak utilization (%) and memory used (MiB) since the last call; ``{}`` when not sampling."""
        with self._lock:
            samples, self._samples = self._samples, []
        if not samples:
            return {}
        utils = [s[0] for s in samples]
        mems = [s[1] for s in samples]
        return {
            "gpu/util_mean": sum(utils) / len(utils),
            "gpu/util_peak": max(utils),
            "gpu/mem_mean_mib": sum(mems) / len(mems),
            "gpu/mem_peak_mib": max(mems),
        }

    def __enter__(self) -> GPUMonitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the sampling thread and release NVML."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass


def _nvml_handle(pynvml, uuid: str):
    """The NVML handle of the GPU (or MIG instance) with this CUDA UUID (torch gives it without the GPU- prefix)."""
    bare = uuid.removeprefix("GPU-").removeprefix("MIG-")
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        nvml_uuid = pynvml.nvmlDeviceGetUUID(handle)
        nvml_uuid = nvml_uuid.decode() if isinstance(nvml_uuid, bytes) else nvml_uuid
        if nvml_uuid.removeprefix("GPU-") == bare:
            return handle
    return pynvml.nvmlDeviceGetHandleByUUID(f"MIG-{bare}")  # not a whole GPU: a MIG instance, or an error


def describe(sessions: int = 4) -> str:
    """A readable report of what this machine offers and where ``sessions`` runs would rotate."""
    lines = [f"torch {torch.__version__}", f"CUDA available: {torch.cuda.is_available()}"]
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    lines.append(f"GPU count: {count}")
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        major, minor = props.major, props.minor
        lines.append(
            f"  cuda:{i} {props.name}  {props.total_memory / 2**30:.1f} GiB  compute capability {major}.{minor}"
            f"  TF32 {'applies' if major >= 8 else 'does not apply'}"
        )
    offset = _env_int("CUDA_OFFSET", 0)
    if count:
        placement = ", ".join(f"{s}->cuda:{rotate(s, offset, count)}" for s in range(sessions))
        lines.append(f"CUDA_OFFSET={offset}: sessions {placement}")
    else:
        lines.append("no GPU: every session runs on the CPU")
    budget = thread_budget()
    lines.append(f"CPU threads for one run: {budget.threads} ({budget.why}; os.cpu_count() = {os.cpu_count()})")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    try:
        print(describe(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdecimal() else 4))
    except DeviceError as exc:  # CUDA_OFFSET=x, say
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
