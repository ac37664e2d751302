"""A run's lifecycle for every training script: run flags, one-line errors, checkpoints, the run folder's lock, stop
signals, TensorBoard and W&B, config, progress, the end of a run. Importing it has no side effects."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import functools
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

import gpu_utils

try:
    import fcntl
except ImportError:  # Windows: no locks
    fcntl = None

CHECKPOINT_STATUSES = ("running", "stopped", "finished", "diverged")  # diverged: NaN weights came after it
RUN_LOCK = ".lock"  # the file in a run folder that a live run holds locked (flock)
TRAINING_KEYS = {"optimizer", "iteration", "global_step", "rng", "run_name"}  # what --resume needs


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message is one line that says what to do."""


class RunInUse(ValueError):
    """Another live process trains in this run folder."""


# ---------------------------------------------------------------- arguments
@dataclasses.dataclass
class RunArgs:
    """How and where a run runs, the same flags in every script: ``--resume`` takes these from the command line and
    the rest of a script's ``Args`` (what the run is) from the checkpoint."""

    gpu: str = "auto"
    """auto (a GPU when there is one, unless the script finds the CPU faster for this run and says so at start), true
    (a GPU or an error), false (CPU), or a GPU index N / cuda:N"""
    cuda_offset: int | None = None
    """first GPU of the rotation (None: the CUDA_OFFSET environment variable, else 0)"""
    session: int = 0
    """run number of a sweep; with --gpu auto/true, runs rotate over the GPUs as (cuda_offset + session) % num_gpus"""
    tf32: bool = True
    """allow TF32 matmuls and convolutions on GPUs that support them"""
    num_threads: int = 0
    """CPU threads (0: the CPUs this run may use, capped by SLURM_CPUS_PER_TASK and OMP_NUM_THREADS)"""
    track: bool = False
    """mirror the TensorBoard logs to Weights and Biases"""
    wandb_project_name: str = "gpu-rl"
    """the wandb project name"""
    wandb_entity: str | None = None
    """the entity (team) of the wandb project"""
    capture_video: bool = False
    """record env 0's episodes to videos/<run_name> on a capped cubic schedule (episodes 0, 1, 8, 27, ..., 729, then
    every 1000th; a resumed leg's to videos/<run_name>/resumed-at-step-<N>)"""
    progress_bar: bool = True
    """show a progress bar (off: a progress line each iteration or log window; ppo_atari.py: each 10th iteration)"""
    checkpoint_every: int = 100
    """write runs/<run_name>/checkpoint.pt every this many iterations (0: only at the end and on a stopping signal)"""
    resume: str | None = None
    """checkpoint.pt of a stopped run to continue (same run dir, settings and total steps)"""
    save_model: bool = False
    """save the final model (and what playing it needs) to runs/<run_name>/<exp_name>.model"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint or saved model without training and print the mean and std of the episodic return"""
    eval_episodes: int = 10
    """episodes for --eval-checkpoint (one per env, played in parallel)"""
    compile: bool = False
    """torch.compile the action step and the loss (the first iterations then take a minute or more)"""
    cudagraphs: bool = False
    """CUDA graphs: each minibatch update (PPO) or whole training step (Snake) as one captured graph, and the action
    step compiled in mode reduce-overhead where no graph holds it; said at start; implies --compile"""
    amp: bool = False
    """bf16 autocast for the network's hidden layers (outputs, log-probs, values, Q-values and losses stay fp32)"""
    micro_batch: str = "auto"
    """rows per backward pass: auto (the whole minibatch, halved on CUDA out-of-memory) or N"""


RUN_FLAGS = {f.name for f in dataclasses.fields(RunArgs)}  # what --resume takes from the command line
STOP_SIGNALS = [signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])]


def on_stop_signals(handler: Callable[[int, object], None]) -> None:
    """``handler`` answers Ctrl-C, kill, scancel and a closed terminal; but a SIGHUP that `nohup` ignores stays so."""
    for sig in STOP_SIGNALS:
        if sig in (signal.SIGINT, signal.SIGTERM) or signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, handler)


def stop_in_one_line() -> None:
    """Until ``stop_on_signals``, a stop signal or a closed stdout (``| head``) ends the process at once with one line
    and status 128 + the signal: not a traceback, nor a KeyboardInterrupt's C++ abort in MuJoCo's callback."""

    def stop(signum: int, why: str) -> None:
        remove_made_run_dirs()  # a stop while the run opens: its folder goes again
        sys.stdout.flush()
        print(f"stopped on {why}: nothing was written", file=sys.stderr, flush=True)
        os._exit(128 + signum)  # not sys.exit: an exception cannot cross the C++ frames a signal may arrive in

    on_stop_signals(lambda signum, frame: stop(signum, signal.Signals(signum).name))
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # `| tee run.log` shows each line as it comes, not 8 KB later
    sys.stdout = StdoutGuard(sys.stdout, lambda: stop(signal.SIGPIPE, "a closed stdout"))


class StdoutGuard:
    """``sys.stdout`` whose reader may go away (``| head``, a closed terminal): the write that finds it gone calls
    ``on_close`` once, and the rest goes to os.devnull (a bare print would raise BrokenPipeError mid-run)."""

    def __init__(self, stream, on_close: Callable[[], None]) -> None:
        self.stream = stream
        self.on_close = on_close
        self.gone = False

    def write(self, text: str) -> int:
        self._guard(self.stream.write, text)
        return len(text)

    def flush(self) -> None:
        self._guard(self.stream.flush)

    def _guard(self, method: Callable, *args) -> None:
        try:
            method(*args)
            return
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.EIO):  # a pipe without a reader, a closed terminal; else not ours
                raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())  # the buffered rest too, flushed at exit
        if not self.gone:
            self.gone = True
            self.on_close()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """A ValueError or FileNotFoundError inside ends the process with one ``error: ...`` line, status 2."""
    try:
        yield
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def check(conditions: dict[str, bool]) -> None:
    """Raise ValueError with the message (the key) of the first condition that does not hold."""
    failed = [message for message, ok in conditions.items() if not ok]
    if failed:
        raise ValueError(failed[0])


def shared_checks(args, one_process: bool = False) -> dict[str, bool]:
    """The one-line error of each setting the scripts share, for the fields ``args`` has; ``one_process``: a script
    without torchrun."""
    fields = vars(args)
    every = args.checkpoint_every
    world = int(os.environ.get("WORLD_SIZE", "1"))
    script = os.path.basename(sys.argv[0])
    several_gpus = "for several GPUs, run several seeds at once with benchmark/sweep.py"
    gpu_utils.thread_budget(args.num_threads)  # raises the one-line error of a --num-threads out of range
    micro = args.micro_batch.strip().lower()
    rows = [micro] if micro.isdecimal() and int(micro) >= 1 else []
    checks = {
        f"--seed must be from 0 to 2**32 - 1, got {args.seed}": 0 <= args.seed < 2**32,  # numpy's seeding: no other
        "--resume needs a checkpoint's path, got an empty one": args.resume != "",
        "--eval-checkpoint needs a checkpoint's path, got an empty one": args.eval_checkpoint != "",
        "--resume trains and --eval-checkpoint evaluates: pass one": not (args.resume and args.eval_checkpoint),
        "--eval-checkpoint runs in one process: start it with python, not torchrun": not (
            args.eval_checkpoint and world > 1
        ),
        f"{script} runs in one process: start it with python, not torchrun ({several_gpus})": not (
            one_process and world > 1
        ),
        f"--learning-rate must be at least 0, got {args.learning_rate}": args.learning_rate >= 0,
        f"--max-grad-norm must be positive, got {args.max_grad_norm}": args.max_grad_norm > 0,
        f"--eval-episodes must be at least 1, got {args.eval_episodes}": args.eval_episodes >= 1,
        f"--checkpoint-every must be at least 0 (0: only at the end and on a stop), got {every}": every >= 0,
        f"--exp-name names the run's folder: give one without '/', got {args.exp_name!r}": (
            args.exp_name.strip() != "" and "/" not in args.exp_name
        ),
        f"--micro-batch {args.micro_batch!r} must be 'auto' or a positive integer": micro in ("auto", *rows),
    }
    if "gae_lambda" not in fields:
        return checks
    checks |= {
        f"--gae-lambda must be in [0, 1], got {args.gae_lambda}": 0.0 <= args.gae_lambda <= 1.0,
        f"--gamma must be in [0, 1], got {args.gamma}": 0.0 <= args.gamma <= 1.0,
        f"--clip-coef must be positive, got {args.clip_coef}": args.clip_coef > 0,
        f"--ent-coef must be at least 0, got {args.ent_coef}": args.ent_coef >= 0,
        f"--vf-coef must be at least 0, got {args.vf_coef}": args.vf_coef >= 0,
        f"--target-kl must be positive (or left unset), got {args.target_kl}": (
            args.target_kl is None or args.target_kl > 0
        ),
    }
    size = fields.get("minibatch_size")
    if isinstance(size, int) or (isinstance(size, str) and size.isdecimal()):  # one advantage has no std (NaN)
        one_row = "--norm-adv normalises each minibatch's advantages and needs 2 rows or more"
        checks[f"{one_row}; use a larger minibatch or --no-norm-adv"] = not args.norm_adv or int(size) >= 2
    return checks


def select_device(args, prefer_cpu: str = "") -> tuple[torch.device, str]:
    """The device of --gpu, --session, --cuda-offset and why, made current, with TF32 (--tf32) and cuDNN's modes
    (--torch-deterministic) set; --gpu auto: the CPU if ``prefer_cpu`` says why it is faster."""
    if args.gpu == "auto" and prefer_cpu:
        device, why = torch.device("cpu"), f"--gpu auto: {prefer_cpu}"
    else:
        device, why = gpu_utils.select_device(args.gpu, args.session, args.cuda_offset)
    graphs = "--cudagraphs needs a CUDA device; drop it or use --gpu true on a GPU machine"
    check({graphs: not args.cudagraphs or device.type == "cuda"})
    if device.type == "cuda":
        torch.cuda.set_device(device)
    gpu_utils.enable_tf32(args.tf32, args.torch_deterministic)
    return device, why


def print_config(
    args, given: dict, resumed: bool, runtime_flags: set, total_steps: int, sources: dict | None = None
) -> None:
    """Print the run's settings with their sources (checkpoint, ``sources`` such as a preset, derived, command line,
    default), and say when --total-timesteps is rounded down to ``total_steps``, whole iterations."""
    defaults = type(args)()
    print("config:")
    for key, value in vars(args).items():
        if key in runtime_flags or key not in given:
            continue
        source = (sources or {}).get(key) or ("checkpoint" if resumed else "")
        if not source:
            typed = "default" if given[key] == getattr(defaults, key) else "command line"
            source = typed if value == given[key] else "derived"
        print(f"  {key:<26} {value!s:<18} ({source})")
    if total_steps < args.total_timesteps:
        print(f"note: {total_steps:,} steps: --total-timesteps rounded down to whole iterations")


def resume_command(path: str) -> str:
    """This process's command with ``--resume path`` (its own dropped), started by this Python (or torchrun with as
    many processes), so that it works when pasted."""
    words = []
    argv = iter(sys.argv[1:])
    for word in argv:
        if word == "--resume":
            next(argv, None)
        elif not word.startswith("--resume="):
            words.append(word)
    on_path = shutil.which("python")  # `python` where it is this interpreter (an active venv); else its full path
    same = on_path is not None and os.path.realpath(on_path) == os.path.realpath(sys.executable)
    launcher = ["python" if same else sys.executable]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if world > 1:  # torchrun: its processes each continue their own random state, so as many again
        launcher = ["torchrun", f"--nproc-per-node={local}", *([f"--nnodes={world // local}"] if world > local else [])]
    return shlex.join([*launcher, sys.argv[0], *words, "--resume", path])


def print_device(device: torch.device, why: str, amp: bool, share: gpu_utils.CpuShare, envs: str) -> None:
    """The start-up lines: device and why, TF32, bf16's cost here, CPU threads and what the envs step on (``envs``)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32  # as select_device set it
    print(f"device: {device} ({why}){', TF32 on' if tf32 else ''}")
    note = gpu_utils.bf16_note(device) if amp else ""
    if note:
        print(note)
    print(f"threads: {share.threads} ({share.why}): {torch.get_num_threads()} torch, {envs}")


# ---------------------------------------------------------------- checkpoints
def read_checkpoint(path: str | os.PathLike, script: str = "training") -> dict:
    """The dict a script saved at ``path``, read as data only (``weights_only``); errors are one line."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        what = "is a folder" if os.path.isdir(path) else "does not exist"
        raise FileNotFoundError(f"checkpoint {path!r} {what}; pass the path of a checkpoint.pt or .model file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable or unsafe file gets the same one-line answer
        raise CheckpointError(
            f"cannot read checkpoint {path!r} ({type(exc).__name__}: {gpu_utils.first_line(exc)}); it is cut short or "
            "damaged, not a file a script of this repository wrote, or it holds more than data"
        ) from None
    shape = isinstance(ckpt, dict) and isinstance(ckpt.get("model"), dict) and isinstance(ckpt.get("args"), dict)
    if not shape or not isinstance(ckpt.get("global_step", 0), int):  # what every reader takes for granted
        raise CheckpointError(
            f"{path!r} is not a {script} checkpoint (its model, args or step); use one a script wrote"
        )
    return ckpt


def load_checkpoint(path: str, script: str, training: bool = False) -> dict:
    """A checkpoint.pt or .model file that ``script`` wrote; ``training``: it must hold what --resume needs."""
    ckpt = read_checkpoint(path, script)
    written_by = ckpt.get("script")
    if written_by != script:
        by = f"was written by {written_by}.py" if written_by else "names no script"
        raise CheckpointError(f"{path!r} {by}, not {script}.py; use a checkpoint {script}.py wrote")
    if training and not TRAINING_KEYS <= set(ckpt):
        raise CheckpointError(f"{path!r} holds no training state (a --save-model file?); resume from a checkpoint.pt")
    return ckpt


def resume(args, script: str, runtime_flags: set) -> dict | None:
    """--resume's checkpoint (None without the flag), its run's settings put into ``args`` (saying which typed ones it
    overrides); ``runtime_flags``, how and where to run, stay the command line's."""
    if not args.resume:
        return None
    ckpt = load_checkpoint(args.resume, script, training=True)
    settings = {k: v for k, v in ckpt["args"].items() if k not in runtime_flags and hasattr(args, k)}
    # the flags on the command line, read from it: a typed value may equal the default (--no-x is x's)
    given = {w[2:].split("=")[0].replace("-", "_").removeprefix("no_") for w in sys.argv[1:] if w.startswith("--")}
    typed = [k for k, v in settings.items() if k in given and getattr(args, k) != v]
    if typed and os.environ.get("RANK", "0") == "0":  # said once under torchrun
        flags = ", ".join(f"--{k.replace('_', '-')} {getattr(args, k)} (the run's {settings[k]})" for k in typed)
        print(f"note: --resume continues the run with its own settings, not {flags}; start a new run to change them")
    vars(args).update(settings)
    return ckpt


def exit_if_done(ckpt: dict | None, num_iterations: int, path: str | None, is_main: bool = True) -> None:
    """A resumed run that has reached its total: say so, mark its checkpoint finished, and exit 0."""
    if ckpt is None or ckpt["iteration"] < num_iterations:
        return
    if is_main:
        if ckpt.get("status") != "finished":  # stopped in its last iteration by older code, say
            save_checkpoint(path, **(ckpt | {"status": "finished"}))
        print(
            f"nothing to do: {path} is a finished run (step {ckpt['global_step']}: it has reached its total); "
            f"evaluate it with --eval-checkpoint {path}, or start a new run to train longer"
        )
    sys.exit(0)


def load_states(modules: dict, ckpt: dict, path: str, device: torch.device | None = None, rank: int = 0) -> None:
    """Load ``ckpt``'s states into ``modules`` (key -> module, optimizer or env), or exit with one line; with ``device``
    (--resume) the random state too, said once. An optimizer keeps this run's lr tensor and its flags."""
    try:
        for key, module in modules.items():
            own = [dict(group) for group in getattr(module, "param_groups", [])]
            module.load_state_dict(ckpt[key])
            for group, mine in zip(getattr(module, "param_groups", []), own):
                kept = ("lr", "capturable", "fused", "foreach", "differentiable")
                group.update({name: mine[name] for name in kept if name in mine})
    except (RuntimeError, ValueError, KeyError) as exc:
        print(f"error: {path!r} does not fit the network/env ({gpu_utils.first_line(exc, 120)})", file=sys.stderr)
        sys.exit(2)
    if device is not None:
        gpu_utils.set_rng_state(ckpt["rng"][rank], device)
        if rank == 0:
            print(f"resumed {path} at step {ckpt['global_step']} (iteration {ckpt['iteration']})")


def mark_diverged(path: str) -> str:
    """Mark the checkpoint at ``path`` diverged (its weights are the last finite ones); what the error line says."""
    if not os.path.exists(path):
        return "no checkpoint had been written yet"
    try:
        ckpt = read_checkpoint(path)
    except ValueError as exc:
        return f"{path} could not be marked diverged ({gpu_utils.first_line(exc, 120)})"
    if not save_checkpoint(path, **(ckpt | dict(status="diverged"))):
        return f"{path} could not be marked diverged"
    return f"{path} keeps the last finite ones"


# ---------------------------------------------------------------- the run folder's lock
MADE_RUN_DIRS: list[str] = []
"""The run folder this process made, until ``open_run`` has opened the run in it: a stop or an error before then removes
it again, so that "nothing was written" holds (no folder left with a lock and no checkpoint)."""


def remove_made_run_dirs() -> None:
    for run_dir in MADE_RUN_DIRS:
        shutil.rmtree(run_dir, ignore_errors=True)


def new_run_dir(name: str) -> str:
    """Make runs/``name`` and return its name, or the next free second's when a run started in the same second."""
    prefix, stamp = name.rsplit("__", 1)
    second = int(stamp)
    try:
        os.makedirs("runs", exist_ok=True)
        while True:
            try:  # made or refused at once: two runs starting together cannot both take one name
                made = f"{prefix}__{second}"
                os.mkdir(os.path.join("runs", made))
                MADE_RUN_DIRS.append(os.path.join("runs", made))
                return made
            except FileExistsError:
                second += 1
    except OSError as exc:  # a read-only folder, a file named runs
        raise ValueError(f"cannot make runs/{name} here ({exc.strerror}); start the run in a writable folder") from None


def lock_run_dir(run_dir: str | os.PathLike) -> int | None:
    """Hold ``<run_dir>/.lock`` while this process lives (no second process writes there): the descriptor to keep, or
    None where locks do not work; ``RunInUse`` when another process holds it."""
    os.makedirs(run_dir, exist_ok=True)
    path = Path(run_dir, RUN_LOCK)
    fd = gpu_utils.open_own_file(path, os.O_RDWR | os.O_CREAT) if fcntl else None
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
    """True while a process holds ``<run_dir>/.lock``: the run is training now (the OS frees a killed run's lock)."""
    fd = gpu_utils.open_own_file(Path(run_dir, RUN_LOCK), os.O_RDONLY) if fcntl else None
    if fd is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError as exc:
        return isinstance(exc, BlockingIOError)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the run: its folder, logs, stop flag and end
STOP: list[str] = []
"""The stop signals received since ``stop_on_signals``: a run stops after the iteration in which this list fills."""


def stop_on_signals(is_main: bool = True) -> list[str]:
    """From now on a stop signal or a closed stdout asks the run to stop after this iteration, with a checkpoint;
    returns the list that fills with their names (``STOP``)."""

    def on_signal(signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if not STOP and is_main:  # os.write: a print here could re-enter one the signal interrupted
            os.write(2, f"{name}: stopping after this iteration, with a checkpoint\n".encode())
        STOP.append(name)

    on_stop_signals(on_signal)
    if isinstance(sys.stdout, StdoutGuard):  # the list's method, not a closure: sys.stdout outlives the run
        sys.stdout.on_close = functools.partial(STOP.append, "a closed stdout")
    return STOP


def open_run(
    run_name: str, args, device: torch.device, step: int, ckpt: dict | None, is_main: bool = True
) -> tuple[str, SummaryWriter | None, list[str]]:
    """The run's folder (runs/<run_name>, or the resumed checkpoint's) with its lock, its logs (the main process's
    TensorBoard writer, and W&B with --track; None elsewhere), and from now on a stop signal stops the run after its
    iteration, with a checkpoint (``stop_on_signals``'s list). Until then a stop ends the process at once and leaves no
    new folder. A folder in use or not writable: one line, exit 2, and no new folder either."""
    try:
        run_dir = run_folder(run_name, args.resume, is_main)
        writer = open_logs(run_dir, args, device, step, ckpt and ckpt["wandb_id"]) if is_main else None
    except (ValueError, OSError) as exc:  # W&B's init, say, in a folder it cannot write
        remove_made_run_dirs()
        message = str(exc)
        if isinstance(exc, OSError):
            where = f": {exc.filename}" if exc.filename else ""
            message = f"cannot open the run ({exc.strerror or exc}{where}); start it in a writable folder"
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    stop = stop_on_signals(is_main)
    MADE_RUN_DIRS.clear()  # the run is open: from now on a stop keeps it, with a checkpoint
    return run_dir, writer, stop


def run_folder(run_name: str, resume: str | None, is_main: bool = True) -> str:
    """The checkpoint's folder on --resume, else a new runs/<run_name>; the main process holds its lock."""
    if resume:
        run_dir = os.path.dirname(resume) or "."
    elif is_main:
        run_dir = os.path.join("runs", new_run_dir(run_name))
    else:
        run_dir = os.path.join("runs", run_name)
    if is_main:
        lock_run_dir(run_dir)
    return run_dir


def open_logs(run_dir: str, args, device: torch.device, step: int, wandb_id: str | None = None) -> SummaryWriter:
    """TensorBoard's writer in ``run_dir`` with the run's hyperparameters and device (and, with --track, a W&B run
    that mirrors it: ``wandb_id`` continues a resumed run's)."""
    if args.track:
        import wandb

        name = os.path.basename(os.path.normpath(run_dir))
        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=name,
            save_code=True,
            resume="allow",
            id=wandb_id,
        )
    try:
        if not os.access(run_dir, os.W_OK):  # else TensorBoard's writer thread fails too, with a traceback of its own
            raise PermissionError(errno.EACCES, "not writable")
        writer = SummaryWriter(run_dir)
    except OSError as exc:  # a read-only copy of a run, say
        raise ValueError(f"cannot write the run's logs in {run_dir} ({exc.strerror}); use a writable copy") from None
    WANDB_ID[os.path.abspath(run_dir)] = wandb_id
    table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + table)
    writer.add_text("device", gpu_utils.device_label(device), step)  # a resumed run may move
    return writer


WANDB_ID: dict[str, str | None] = {}
"""A resumed run's W&B id by its folder (``open_logs``): a leg without --track keeps it for the next one with it."""


def wandb_id(previous: str | None) -> str | None:
    """The W&B run to continue on --resume: this leg's with --track, else the one the checkpoint kept."""
    wandb = sys.modules.get("wandb")
    return wandb.run.id if wandb is not None and wandb.run is not None else previous


def log_machine(writer, step: int, cpu_share: gpu_utils.CpuShare, monitor: gpu_utils.GPUMonitor) -> None:
    """Take this run's share of the CPUs anew (another run may have started or ended), then log the GPU's use since
    the last call and the torch threads (``writer`` None: a torchrun process other than the first)."""
    if cpu_share.update() and writer is not None:
        print(f"threads: {cpu_share.threads} ({cpu_share.why})")
    scalars = monitor.collect() | {"threads/torch": torch.get_num_threads()}
    for key, value in scalars.items() if writer is not None else ():
        writer.add_scalar(key, value, step)


def save_checkpoint(path: str | os.PathLike, **state) -> bool:
    """Write ``state`` to ``path`` atomically (an interrupted save keeps the previous file). A failed write (a full
    disk) is one error line, and the run goes on with its last checkpoint; returns whether it was written. A
    checkpoint whose status is "stopped" says how to continue it."""
    run_dir = os.path.dirname(os.path.abspath(path))
    state = dict(run_name=os.path.basename(run_dir), wandb_id=wandb_id(WANDB_ID.get(run_dir))) | state
    for group in state.get("optimizer", {}).get("param_groups", []):  # a float, whatever tensor the run anneals
        group["lr"] = float(group["lr"])
    tmp = f"{path}.tmp"
    try:
        torch.save(state, tmp)
    except (OSError, RuntimeError) as exc:  # torch reports a failed write as a RuntimeError of its C++ stream
        Path(tmp).unlink(missing_ok=True)
        kept = "the previous one is kept" if os.path.exists(path) else "none was written"
        print(
            f"error: cannot write {path} ({gpu_utils.first_line(exc, 120)}; is the disk full?); {kept}", file=sys.stderr
        )
        return False
    os.replace(tmp, path)
    if state.get("status") == "stopped":
        why = (STOP or ["a signal to another process"])[0]
        out = sys.stderr if getattr(sys.stdout, "gone", False) else sys.stdout  # where it is read
        print(
            f"stopping on {why}: checkpoint at step {state['global_step']}; continue with: {resume_command(path)}",
            file=out,
        )
    return True


def end_run(
    writer, run_dir: str, step: int, total_steps: int, started: float, diverged: bool, model: dict | None = None
) -> None:
    """The end of a run: ``model`` (--save-model's state, with the script and args) saved to <exp_name>.model unless
    the run diverged, the peak GPU memory, the done line, the logs closed; stop signals ignored from here (a SIGTERM
    in the teardown would end a finished run with 143). Diverged: the checkpoint marked so, one error line, status 1.
    ``writer`` None: a torchrun process other than the first, which writes nothing."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if writer is not None and model is not None and not diverged:
        model_path = os.path.join(run_dir, f"{model['args']['exp_name']}.model")
        if save_checkpoint(model_path, **model):
            print(f"model saved to {model_path}")
    if writer is not None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            peak = torch.cuda.max_memory_allocated() / 2**20
            writer.add_scalar("memory/peak_allocated_mib", peak, step)
            print(f"peak allocated {peak:.1f} MiB (allocator, no CUDA context)")
        elapsed = time.time() - started
        print(f"done: step {step}/{total_steps} in {elapsed:.1f}s, run dir {run_dir}")
        writer.close()
        wandb = sys.modules.get("wandb")
        if wandb is not None and wandb.run is not None:
            wandb.finish(exit_code=int(diverged))
        if diverged:
            kept = mark_diverged(os.path.join(run_dir, "checkpoint.pt"))
            error = f"error: the update diverged by step {step} (NaN or infinite weights, not saved); {kept}; "
            print(error + "start again with a lower --learning-rate or --max-grad-norm", file=sys.stderr)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # skip the teardown, where gloo's threads can abort a process
        atexit.register(exit_now, int(diverged))
    if diverged:
        sys.exit(1)


def exit_now(status: int) -> None:
    """Flush the output and end the process, skipping the interpreter's teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


# ---------------------------------------------------------------- videos
def video_folder(run_dir: str, start_step: int) -> str:
    """videos/<run name> beside runs/; a resumed leg's games count from 0 again, so they go to
    videos/<run name>/resumed-at-step-<N>, where none overwrites an earlier video."""
    run_dir = os.path.abspath(run_dir)
    folder = os.path.join(os.path.dirname(os.path.dirname(run_dir)), "videos", os.path.basename(run_dir))
    return os.path.join(folder, f"resumed-at-step-{start_step}") if start_step else folder


class VideoRecorder:
    """Env 0's games to videos/<run name>/episode-<k>.mp4 beside runs/: games 0, 1, 8, 27, ..., 729, every 1000th."""

    def __init__(self, run_dir: str, start_step: int, fps: int):
        self.folder = video_folder(run_dir, start_step)
        self.fps = fps
        self.frames = []
        self.episode = 0
        os.makedirs(self.folder, exist_ok=True)

    def add(self, frame: np.ndarray, game_over: bool) -> str | None:
        """Add env 0's frame after this step ((H, W, 3) uint8); returns the video's path when a recorded game ends."""
        episode = self.episode
        recorded = round(episode ** (1 / 3)) ** 3 == episode if episode < 1000 else episode % 1000 == 0
        if recorded:
            self.frames.append(frame)
        self.episode += game_over
        if not (game_over and self.frames):
            return None
        return self.write(f"episode-{episode}.mp4")

    def close(self) -> str | None:
        """At the end (or a stop): the recorded game still being played, if any, to episode-<k>-unfinished.mp4."""
        return self.write(f"episode-{self.episode}-unfinished.mp4") if self.frames else None

    def write(self, name: str) -> str | None:
        """The recorded frames to <folder>/``name``; None, with a warning, when ffmpeg fails (a Ctrl-C stops it too)."""
        path = os.path.join(self.folder, name)
        try:
            from moviepy import ImageSequenceClip  # slow import, only needed with --capture-video

            ImageSequenceClip(self.frames, fps=self.fps).write_videofile(path, logger=None)
        except (OSError, RuntimeError) as exc:
            print(f"warning: video {path} not written ({gpu_utils.first_line(exc)}); the run goes on", file=sys.stderr)
            path = None
        self.frames = []
        wandb = sys.modules.get("wandb")
        if path and wandb is not None and wandb.run is not None:  # W&B shows it; TensorBoard does not show mp4 files
            wandb.log({"videos": wandb.Video(path)}, commit=False)
        return path
