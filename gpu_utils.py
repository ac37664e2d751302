"""Small GPU helpers shared by the training scripts.

Device choice (``auto``/``true``/``false``/index) and rotation of runs across GPUs, TF32, thread limits,
batch-size choice, memory estimates, out-of-memory-safe micro-batching and a sampling GPU monitor.
Importing this module has no side effects. ``python gpu_utils.py`` prints what this machine offers.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn


class DeviceError(ValueError):
    """A device request that this machine cannot satisfy; the message is one line that says what to change."""


class BatchSizeError(ValueError):
    """A batch size that does not divide the total batch; the message lists valid sizes near the request."""


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


def select_device(gpu: str = "auto", session: int = 0, cuda_offset: int | None = None) -> torch.device:
    """Turn the text a user typed for ``--gpu`` into a ``torch.device``.

    ``auto``: a GPU when there is one, else the CPU. ``true``: a GPU or a ``DeviceError``. ``false``: the CPU.
    ``N`` or ``cuda:N``: exactly GPU N, or a ``DeviceError`` naming how many GPUs exist. With ``auto``/``true``
    the index is ``rotate(session, cuda_offset, count)``; ``cuda_offset`` defaults to the ``CUDA_OFFSET``
    environment variable (0 when unset) and, under torchrun, ``LOCAL_RANK`` is added to ``session``.
    """
    if isinstance(gpu, bool):  # never let False become device 0
        gpu = "true" if gpu else "false"
    text = str(gpu).strip().lower()
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if text in ("false", "cpu", "no"):
        return torch.device("cpu")
    if text in ("auto", "true", "cuda", "gpu", "yes"):
        if count == 0:
            if text == "auto":
                return torch.device("cpu")
            raise DeviceError("--gpu true asks for a GPU but CUDA is not available here; use --gpu auto or --gpu false")
        offset = _env_int("CUDA_OFFSET", 0) if cuda_offset is None else cuda_offset
        index = rotate(session + _env_int("LOCAL_RANK", 0), offset, count)
        return torch.device("cuda", index)
    index_text = text.removeprefix("cuda:")
    if not index_text.isdigit():
        raise DeviceError(f"--gpu {gpu!r} is not understood; use auto, true, false, a GPU index N or cuda:N")
    index = int(index_text)
    if index >= count:
        have = "no GPU" if count == 0 else f"{count} GPU{'s' if count > 1 else ''} (0..{count - 1})"
        raise DeviceError(f"--gpu {gpu} asks for GPU {index} but this machine has {have}; pick another or auto")
    return torch.device("cuda", index)


def enable_tf32(enabled: bool = True) -> bool:
    """Allow TF32 matmul and cuDNN on GPUs of compute capability 8 or more; return whether TF32 is now on.

    Also sets ``torch.set_float32_matmul_precision("high")`` and turns on ``cudnn.benchmark`` when CUDA is present.
    """
    has_cuda = torch.cuda.is_available()
    if has_cuda:
        torch.backends.cudnn.benchmark = True
    supported = has_cuda and torch.cuda.get_device_capability()[0] >= 8
    on = bool(enabled and supported)
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")
    return on


def limit_threads(num_threads: int = 1) -> None:
    """Cap OpenMP/MKL/BLAS threads (inherited by subprocesses) and torch's own threads to ``num_threads``.

    Call before starting environment workers: N workers each spawning one thread per core is a thread storm.
    """
    if num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ[var] = str(num_threads)
    torch.set_num_threads(num_threads)


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n``, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def choose_batch_size(total: int, requested: int | str = "auto", target: int | None = None) -> int:
    """Return a minibatch size that divides ``total``.

    ``requested="auto"`` picks the largest divisor of ``total`` not above ``target`` (``target`` defaults to
    ``total``). An explicit size that does not divide ``total`` raises ``BatchSizeError`` listing valid sizes.
    """
    if total < 1:
        raise BatchSizeError(f"the total batch must be at least 1, got {total}")
    divisors_of_total = divisors(total)
    if isinstance(requested, str):
        text = requested.strip().lower()
        if text == "auto":
            limit = total if target is None else max(1, target)
            return max(d for d in divisors_of_total if d <= limit)
        if not text.isdigit():
            raise BatchSizeError(f"batch size {requested!r} must be 'auto' or a positive integer")
        requested = int(text)
    if requested < 1 or total % requested != 0:
        near = sorted(divisors_of_total, key=lambda d: (abs(d - requested), d))[:6]
        raise BatchSizeError(
            f"batch size {requested} does not divide the total batch {total}; valid sizes near it: "
            + ", ".join(str(d) for d in sorted(near))
        )
    return requested


CUDA_CONTEXT_BYTES = 500 * 2**20
"""Typical memory the CUDA context and kernels take on the device before any tensor (about 300-600 MiB)."""

_OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "rmsprop": 1, "sgd_momentum": 1, "sgd": 0}


@dataclass
class MemoryEstimate:
    """Estimated device memory of a training run, in bytes."""

    weights: int
    gradients: int
    optimizer_state: int
    batch: int
    rollout: int
    activations: int
    cuda_context: int

    @property
    def total(self) -> int:
        """Sum of every part."""
        return (
            self.weights
            + self.gradients
            + self.optimizer_state
            + self.batch
            + self.rollout
            + self.activations
            + self.cuda_context
        )

    def __str__(self) -> str:
        rows = [
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("optimizer state", self.optimizer_state),
            ("minibatch data", self.batch),
            ("rollout storage", self.rollout),
            ("activations", self.activations),
            ("CUDA context", self.cuda_context),
            ("total", self.total),
        ]
        lines = ["memory estimate", "-" * 32]
        lines += [f"{name:<18}{nbytes / 2**20:>11.2f} MiB" for name, nbytes in rows]
        return "\n".join(lines)


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
) -> MemoryEstimate:
    """Estimate the device memory a run needs: weights, gradients, optimizer state, data, activations, context.

    ``optimizer`` is one of adam, adamw, rmsprop, sgd_momentum, sgd (its state holds 2, 2, 1, 1, 0 copies of the
    trainable weights). When ``activation_bytes`` is None and ``example_input`` is given, activations are measured
    from one no-grad forward pass (leaf-module output sizes) scaled to ``batch_size`` rows; autograd keeps about
    that much for backward. The CUDA context is counted only when the model's weights are on a GPU.
    """
    key = optimizer.lower()
    if key not in _OPTIMIZER_STATES:
        raise ValueError(f"unknown optimizer {optimizer!r}; use one of {', '.join(_OPTIMIZER_STATES)}")
    weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    if activation_bytes is None:
        activation_bytes = 0 if example_input is None else _activation_bytes(model, example_input, batch_size)
    return MemoryEstimate(
        weights=weights,
        gradients=trainable,
        optimizer_state=_OPTIMIZER_STATES[key] * trainable,
        batch=batch_bytes,
        rollout=rollout_bytes,
        activations=activation_bytes,
        cuda_context=CUDA_CONTEXT_BYTES if any(t.is_cuda for t in model.parameters()) else 0,
    )


def backward_in_chunks(
    loss_fn: Callable[[int, int], torch.Tensor],
    batch_size: int,
    chunk_size: int,
    parameters: list[torch.nn.Parameter] | None = None,
) -> int:
    """Backpropagate a minibatch in chunks so the accumulated gradient equals the full-minibatch gradient.

    ``loss_fn(start, end)`` returns the mean loss over rows ``[start, end)``; each chunk's loss is weighted by
    its share of the minibatch before ``backward``, so the summed gradients equal those of one full backward.
    On ``torch.cuda.OutOfMemoryError`` the gradients of ``parameters`` are zeroed, the chunk size is halved and
    the minibatch is redone. Returns the chunk size it settled on (pass it back in next time).
    """
    chunk = max(1, min(chunk_size, batch_size))
    while True:
        try:
            for start in range(0, batch_size, chunk):
                end = min(start + chunk, batch_size)
                (loss_fn(start, end) * ((end - start) / batch_size)).backward()
            return chunk
        except torch.cuda.OutOfMemoryError:
            if chunk == 1:
                raise
            if parameters is not None:
                for p in parameters:
                    p.grad = None
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            chunk = max(1, chunk // 2)


class GPUMonitor:
    """Sample GPU utilization and memory at ``1/interval`` Hz in a background thread (NVML via nvidia-ml-py).

    PPO alternates bursts of rollout and update, which one-second snapshots miss. ``collect()`` returns the mean
    and peak since the previous call. On CPU, or without NVML, it starts no thread and ``collect()`` returns ``{}``.
    """

    def __init__(self, device: torch.device | str, interval: float = 0.1) -> None:
        self.device = torch.device(device)
        self.interval = interval
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

            pynvml.nvmlInit()
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(_physical_index(index))
            self._nvml = pynvml
        except Exception:  # no NVML: monitoring is a nicety, never a reason to fail a run
            return self
        self._thread = threading.Thread(target=self._run, name="GPUMonitor", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
                used = self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used / 2**20
            except Exception:
                return
            with self._lock:
                self._samples.append((float(util), float(used)))
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


def _physical_index(index: int) -> int:
    """Map a torch device index to the NVML index, honouring CUDA_VISIBLE_DEVICES when it lists plain integers."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if ids and all(v.isdigit() for v in ids) and index < len(ids):
        return int(ids[index])
    return index


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
    lines.append(f"CPU threads torch uses: {torch.get_num_threads()} (os.cpu_count() = {os.cpu_count()})")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    print(describe(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 4))
