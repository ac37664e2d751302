"""The machine for every training script: devices, TF32, RNG state, CPU threads and shares, batch sizes, memory, CUDA
graphs, GPU monitoring (docs/devices-threads-memory.md). No import side effects; ``python gpu_utils.py`` reports."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn

try:
    import fcntl
except ImportError:  # Windows: no flock, no affinity
    fcntl = None


class DeviceError(ValueError):
    """A device request that this machine cannot satisfy; the message is one line that says what to change."""


class BatchSizeError(ValueError):
    """A batch size that does not divide the total batch; the message lists valid sizes near the request."""


def first_line(exc: BaseException, width: int = 200) -> str:
    """An exception's first line, at most ``width`` characters, for a one-line message; its type's name without one."""
    text = str(exc).strip()
    return text.splitlines()[0][:width] if text else type(exc).__name__


def rotate(session: int, cuda_offset: int, device_count: int) -> int:
    """The GPU of run number ``session``: ``(cuda_offset + session) % device_count`` (4 sessions, 2 GPUs: 0, 1, 0, 1)"""
    if device_count < 1:
        raise DeviceError("no GPU to rotate over: device_count must be at least 1")
    if session < 0 or cuda_offset < 0:
        raise DeviceError(f"session ({session}) and cuda offset ({cuda_offset}) must be >= 0")
    return (cuda_offset + session) % device_count


def _env_int(name: str, default: int) -> int:
    """An integer environment variable, or a one-line error."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise DeviceError(f"environment variable {name}={value!r} must be an integer") from None


def select_device(gpu: str = "auto", session: int = 0, cuda_offset: int | None = None) -> tuple[torch.device, str]:
    """``--gpu`` (auto, true, false, N or cuda:N) as a device, and why in one line. auto and true rotate: GPU
    ``rotate(session + LOCAL_RANK, cuda_offset or $CUDA_OFFSET, count)``, but in a SLURM job given GPUs, visible GPU
    LOCAL_RANK. A request this machine cannot meet, or two torchrun processes on one GPU, is a ``DeviceError``."""
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
    """What a run trains on, for its event file (each leg logs its own): the GPU's name, or the CPU's and its cores."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    return f"CPU{' ' + model if model else ''}, {available_cpus()} cores"


def bf16_note(device: torch.device, cpuinfo: str = "/proc/cpuinfo") -> str:
    """Why ``--amp`` is slow here, or "": an x86 CPU without ``avx512_bf16`` or ``amx_bf16`` emulates bf16 (slowly)."""
    if device.type != "cpu" or not os.path.exists(cpuinfo):
        return ""
    with open(cpuinfo) as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), None)
    if flags is None or {"avx512_bf16", "amx_bf16"} & set(flags):
        return ""
    return "amp: this CPU has no bf16 instructions (avx512_bf16, amx_bf16), so bf16 is emulated: drop --amp for speed"


def enable_tf32(enabled: bool = True, deterministic: bool = False) -> bool:
    """TF32 matmuls and convolutions on GPUs of compute capability 8+ (returns whether on); cuDNN's benchmark mode
    with CUDA unless ``deterministic`` (it may pick a non-deterministic algorithm)."""
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
    """What a checkpoint keeps of the random state: torch's CPU generator and, on a GPU, that device's."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore ``rng_state``'s state; a GPU state only onto a GPU."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on, sorted (its affinity mask, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def available_cpus() -> int:
    """How many CPUs this process may run on."""
    return len(allowed_cpus())


@dataclass(frozen=True)
class ThreadBudget:
    """How many CPU threads one run may use, and what decided it."""

    threads: int
    why: str


def thread_budget(requested: int = 0) -> ThreadBudget:
    """The CPU threads of one run: ``requested`` (``--num-threads``), else its CPU affinity capped by
    ``SLURM_CPUS_PER_TASK`` and ``OMP_NUM_THREADS`` (``why``: the variable that capped it, or the first one set)."""
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
    """``cpus`` in ``parts`` disjoint contiguous groups whose sizes differ by at most one (more parts than CPUs: part i
    gets ``[cpus[i % len(cpus)]]``)."""
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
    if not os.path.isdir("/proc/self/task"):
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # the thread has ended meanwhile
            pass


class CpuShare:
    """This run's share of the CPUs among the live runs started by hand. Each holds a lock file (``flock``) in a private
    per-user directory, freed by the OS when it dies. The constructor, then ``update()`` at most every ``interval`` s,
    takes this run's part of ``split_cpus`` over the live runs in order of start: torch threads (at most
    ``max_torch_threads``) and affinity. Inert under an explicit budget, or (said) an unsafe directory."""

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
        if fcntl is None or budget.why != "CPU affinity" or len(self.cpus) < (os.cpu_count() or 1):
            return  # an explicit budget wins
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        self.directory = Path(directory or (Path(runtime, "gpu-rl") if runtime else f"/tmp/gpu-rl-{os.getuid()}"))
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
        """Take this run's share of the CPUs, at most once every ``interval`` s; True when it changed."""
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


def take_cpu_share(
    requested: int = 0, max_torch_threads: int | None = None, env_threads: int | None = None
) -> CpuShare:
    """This run's CPU threads: ``thread_budget(requested)``, with OpenMP/MKL and torch capped to it (torch also at
    ``max_torch_threads``, the variables env subprocesses inherit at ``env_threads``), and its share among live runs."""
    budget = thread_budget(requested)
    torch_threads = min(budget.threads, max_torch_threads or budget.threads)
    limit_threads(env_threads or torch_threads)
    torch.set_num_threads(torch_threads)
    return CpuShare(budget, max_torch_threads=torch_threads)


def _private_directory(path: Path) -> str:
    """Make ``path`` (mode 0700) if missing; "" if it is this user's directory that no one else may write to, else why
    not (a predictable name in /tmp can be made first by another user)."""
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
    """A descriptor of ``path`` when it is a regular file of this user's, else None (never a FIFO, device or link)."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        return None
    return fd


def limit_threads(num_threads: int = 1) -> None:
    """Cap OpenMP/MKL/BLAS threads (call it before env workers inherit them) and torch's at ``num_threads``; torch's
    inter-op pool gets one (the scripts run one op at a time)."""
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
    """A minibatch size that divides ``total``: ``total / parts`` (``--num-minibatches``), else ``requested``
    (``--minibatch-size``; "auto": the largest divisor up to ``target``). A ``BatchSizeError`` lists valid values."""
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


CUDA_CONTEXT_BYTES = 500 * 2**20  # typical memory of the CUDA context and kernels, outside PyTorch's allocator
CUBLAS_WORKSPACE_BYTES = 64 * 2**20  # one stream's cuBLAS(Lt) workspaces; CUDA graphs: 3 (default, warm-up, graph)

_OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "rmsprop": 1, "sgd_momentum": 1, "sgd": 0}


@dataclass
class MemoryEstimate:
    """Estimated device memory of a run, in bytes; ``total``: the allocator's peak (``max_memory_allocated()``)."""

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
        names = {"batch": "minibatch data", "rollout": "rollout storage", "workspace": "cuBLAS workspace"}
        shown = [f.name for f in fields(self) if f.name not in ("cuda_context", "parameters")]
        rows = [(names.get(name, name.replace("_", " ")), getattr(self, name)) for name in shown]
        rows.append(("total (allocator)", self.total))
        lines = [f"memory estimate ({self.parameters:,} parameters)"]
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
    """Bytes a new allocation on ``device`` can take now, or None if unknown: CUDA's free memory, or ``MemAvailable``
    lowered to what the cgroup (v2) limits of this process's cgroup and its ancestors leave."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    lines = Path(meminfo).read_text().splitlines() if os.path.exists(meminfo) else []
    kib = [int(line.split()[1]) for line in lines if line.startswith("MemAvailable:")]
    if not kib:
        return None
    free = kib[0] * 1024
    lines = Path(proc_cgroup).read_text().splitlines() if os.path.exists(proc_cgroup) else []
    directory = Path(cgroup, next((line[3:] for line in lines if line.startswith("0::")), "/").lstrip("/"))
    for level in [directory, *directory.parents]:  # a job's limit binds its steps too
        try:
            limit = (level / "memory.max").read_text().strip()
            if limit.isdecimal():
                free = min(free, max(0, int(limit) - int((level / "memory.current").read_text())))
        except (OSError, ValueError):
            pass
        if level == Path(cgroup):
            break
    return free


def _activation_bytes(model: nn.Module, example_input: torch.Tensor | tuple, batch_size: int) -> int:
    """The leaf modules' output bytes over one no-grad forward pass, scaled to ``batch_size`` rows."""
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
    """The device memory a run needs; activations (without ``activation_bytes``) measured on ``example_input``. The
    cuBLAS workspaces and CUDA context count when the weights are on a GPU; cuDNN's autotuning workspaces do not."""
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


class MicroBatches:
    """``backward(rows, weight)`` over slices of a minibatch's tensors, each weighted by its share of the rows: the
    whole minibatch's gradients and statistics. --micro-batch: "auto" (one slice) or N rows. On CUDA out-of-memory the
    gradients of ``params`` (every parameter the backward passes reach, whatever optimizers step them) are cleared, the
    rows halve (down to one, said once) and the minibatch starts over; not while a CUDA graph captures, which the
    error fails instead (the step then runs eagerly, and halves here)."""

    def __init__(self, backward: Callable, micro_batch: str, minibatch_rows: int, params: Sequence[torch.Tensor]):
        text = micro_batch.strip().lower()
        self.backward = backward
        self.rows = minibatch_rows if text == "auto" else min(int(text), minibatch_rows)
        self.params = list(params)
        self.backoffs: list[tuple[int, int]] = []  # (rows tried, rows now) of each back-off

    def __call__(self, minibatch: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        tried = self.rows
        while True:
            try:
                stats = self.slices(minibatch)
                break
            except torch.cuda.OutOfMemoryError:
                capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
                if self.rows == 1 or capturing:
                    raise
            # outside the except block, so the traceback no longer holds the failed attempt's tensors
            for p in self.params:
                p.grad = None
            self.rows //= 2
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        if self.rows != tried:
            print(f"micro-batch: CUDA out of memory at {tried} rows, now {self.rows} rows per backward pass")
            self.backoffs.append((tried, self.rows))
        return stats

    def slices(self, minibatch: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        total = len(minibatch[0])
        if self.rows >= total:  # one slice, the whole minibatch: no slicing, no weighted sums (0.06 ms on a CPU)
            return self.backward(minibatch, 1.0)
        stats = {}
        for start in range(0, total, self.rows):
            rows = [t[start : start + self.rows] for t in minibatch]
            weight = len(rows[0]) / total
            part = self.backward(rows, weight)
            stats = {name: stats.get(name, 0) + value * weight for name, value in part.items()}
        return stats


def compile_policy(policy: Callable, compile: bool, cudagraphs: bool) -> Callable:
    """--compile: torch.compile the action step; --cudagraphs: mode reduce-overhead (CUDA graphs, one per shape), each
    call a new step (the caller copies the outputs before the next)."""
    if not (compile or cudagraphs):
        return policy
    compiled = torch.compile(policy, mode="reduce-overhead" if cudagraphs else "default")

    def marked(*args):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args)

    return marked if cudagraphs else compiled


Tensors = torch.Tensor | tuple[torch.Tensor, ...] | dict[str, torch.Tensor]  # what a captured step returns


class CudaGraph:
    """``fn`` as one CUDA graph (LeanRL's whole-update capture): ``warmup`` eager calls on one shared side stream, then
    a capture on static copies of the arguments, then each call copies its arguments in and replays. So ``fn`` takes
    tensors of fixed shapes, makes no host sync, and its outputs are overwritten by the next call; an optimizer inside
    needs ``capturable=True``. Disabled, or after a failed capture (said once), ``fn`` runs eagerly."""

    warmup_stream: torch.cuda.Stream | None = None  # one for all: cuBLAS keeps a workspace per stream, never freed

    def __init__(self, fn: Callable[..., Tensors], enabled: bool = True, warmup: int = 3, name: str = "step"):
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
            if CudaGraph.warmup_stream is None:
                CudaGraph.warmup_stream = torch.cuda.Stream()
            side = CudaGraph.warmup_stream
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = self.fn(*args)
            torch.cuda.current_stream().wait_stream(side)
            # only a call that returned is a warm-up: the capture must find the state an eager step makes (Adam's)
            self.calls += 1
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
            print(f"{self.name}: one CUDA graph")  # captured: said once, as a failed capture is
        else:
            for static, arg in zip(self.static_args, args, strict=True):
                static.copy_(arg)
        self.graph.replay()
        return self.static_out


class GPUMonitor:
    """GPU utilization and memory sampled every ``interval`` s in a thread (NVML, nvidia-ml-py) for ``collect()``'s
    mean and peak since its last call (PPO's bursts escape one-second snapshots). Samples nothing on the CPU, without
    NVML, or (said once) where NVML cannot sample the device."""

    def __init__(self, device: torch.device | str, interval: float = 0.1) -> None:
        self.device = torch.device(device)
        self.interval = interval
        self.samples: deque[tuple[float, float]] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> GPUMonitor:
        """Start sampling (nothing on the CPU or without NVML); returns self."""
        if self.device.type != "cuda":
            return self
        try:
            import pynvml  # nvidia-ml-py, an optional dependency
        except ImportError:
            return self
        try:
            pynvml.nvmlInit()
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            handle = _nvml_handle(pynvml, str(torch.cuda.get_device_properties(index).uuid))

            def sample() -> tuple[float, float]:
                util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                return float(util), pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20

            sample()  # fails here, once, when this device cannot be sampled
        except Exception as exc:  # monitoring is a nicety, never a reason to fail a run
            print(f"GPU monitor: NVML cannot sample {self.device} ({type(exc).__name__}: {exc}); no gpu/* logs")
            return self
        self._thread = threading.Thread(target=self._run, args=(sample,), name="GPUMonitor", daemon=True)
        self._thread.start()
        return self

    def _run(self, sample: Callable[[], tuple[float, float]]) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(sample())
            except Exception as exc:
                print(f"GPU monitor: sampling stopped ({type(exc).__name__}: {exc})")
                return
            self._stop.wait(self.interval)

    def collect(self) -> dict[str, float]:
        """Mean and peak utilization (%) and memory used (MiB) since the last call; ``{}`` when not sampling."""
        samples = [self.samples.popleft() for _ in range(len(self.samples))]  # the thread appends meanwhile
        if not samples:
            return {}
        utils, mems = zip(*samples)
        return {
            "gpu/util_mean": sum(utils) / len(utils),
            "gpu/util_peak": max(utils),
            "gpu/mem_mean_mib": sum(mems) / len(mems),
            "gpu/mem_peak_mib": max(mems),
        }

    def close(self) -> None:
        """Stop sampling (NVML is released at exit)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


def _nvml_handle(pynvml, uuid: str):
    """The NVML handle of the GPU or MIG instance of this CUDA UUID (torch's lacks the GPU- prefix)."""
    bare = uuid.removeprefix("GPU-").removeprefix("MIG-")
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        nvml_uuid = pynvml.nvmlDeviceGetUUID(handle)
        nvml_uuid = nvml_uuid.decode() if isinstance(nvml_uuid, bytes) else nvml_uuid
        if nvml_uuid.removeprefix("GPU-") == bare:
            return handle
    return pynvml.nvmlDeviceGetHandleByUUID(f"MIG-{bare}")  # not a whole GPU: a MIG instance, or an error


def describe(sessions: int = 4) -> str:
    """What this machine offers, and where ``sessions`` runs would rotate."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    lines = [f"torch {torch.__version__}", f"CUDA available: {torch.cuda.is_available()}", f"GPU count: {count}"]
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        memory = f"{props.total_memory / 2**30:.1f} GiB"
        lines.append(f"  cuda:{i} {props.name}  {memory}  compute capability {props.major}.{props.minor}")
    offset = _env_int("CUDA_OFFSET", 0)
    placement = (
        ", ".join(f"{s}->cuda:{rotate(s, offset, count)}" for s in range(sessions)) if count else "all on the CPU"
    )
    budget = thread_budget()
    lines.append(f"CUDA_OFFSET={offset}: sessions {placement}")
    lines.append(f"CPU threads for one run: {budget.threads} ({budget.why}; os.cpu_count() = {os.cpu_count()})")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    try:
        print(describe(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdecimal() else 4))
    except DeviceError as exc:  # CUDA_OFFSET=x, say
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
