"""gpu_utils: device choice and rotation, batch sizes, memory estimates, micro-batching, the GPU monitor."""

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import gpu_utils
import run_utils
from gpu_utils import BatchSizeError, DeviceError, choose_batch_size, rotate, select_device

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_gpus(monkeypatch):
    """Pretend this machine has `n` GPUs (torch.device objects for cuda:i need no real GPU)."""

    def fake(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    for var in ("CUDA_OFFSET", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    return fake


def device(*args, **kwargs) -> torch.device:
    chosen, why = select_device(*args, **kwargs)
    assert why and "\n" not in why  # every choice comes with a one-line reason the scripts print
    return chosen


def test_rotate_round_robin_and_offset():
    assert [rotate(s, 0, 2) for s in range(4)] == [0, 1, 0, 1]
    assert [rotate(s, 4, 8) for s in range(4)] == [4, 5, 6, 7]
    assert [rotate(s, 1, 2) for s in range(3)] == [1, 0, 1]
    assert rotate(9, 3, 4) == 0
    with pytest.raises(DeviceError):
        rotate(0, 0, 0)


def test_select_device_without_cuda(fake_gpus):
    fake_gpus(0)
    assert device("auto") == torch.device("cpu")
    assert device("false") == torch.device("cpu")
    assert device(False) == torch.device("cpu")  # False is never device 0
    for bad in ("true", "0", "cuda:0", "cuda:7"):
        with pytest.raises(DeviceError) as err:
            select_device(bad)
        assert "\n" not in str(err.value)
    for gpu in ("true", "cuda"):  # the words as typed (before: --gpu cuda was said as --gpu true)
        with pytest.raises(DeviceError, match=f"^--gpu {gpu} asks for a GPU but CUDA is not available"):
            select_device(gpu)
    with pytest.raises(DeviceError, match="no GPU"):
        select_device("cuda:7")
    for session, offset in [(-1, None), (0, -2)]:  # refused on the CPU too, not only where a GPU is rotated to
        with pytest.raises(DeviceError, match="must be at least 0"):
            select_device("auto", session, offset)


def test_device_label_names_the_gpu_or_the_cpu_and_its_cores(monkeypatch):
    cpu = gpu_utils.device_label(torch.device("cpu"))
    assert cpu.startswith("CPU") and cpu.endswith(f", {gpu_utils.available_cpus()} cores") and "\n" not in cpu
    if os.path.exists("/proc/cpuinfo"):  # Linux: the model name is there
        assert len(cpu) > len(f"CPU, {gpu_utils.available_cpus()} cores")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: f"Fake GPU {d.index}")
    assert gpu_utils.device_label(torch.device("cuda", 1)) == "Fake GPU 1"


def test_select_device_with_faked_gpus(fake_gpus, monkeypatch):
    fake_gpus(2)
    assert [device("auto", session=s) for s in range(4)] == [torch.device("cuda", i) for i in (0, 1, 0, 1)]
    assert device("true", session=0, cuda_offset=1) == torch.device("cuda", 1)
    assert device("1") == torch.device("cuda", 1)
    assert device("cuda:0") == torch.device("cuda", 0)
    assert device(False) == torch.device("cpu")
    assert device("false") == torch.device("cpu")
    with pytest.raises(DeviceError) as err:
        select_device("cuda:7")
    assert str(err.value) == "--gpu cuda:7 asks for GPU 7 but this machine has 2 GPUs (0..1); pick another or auto"
    with pytest.raises(DeviceError, match="not understood"):
        select_device("banana")


def test_select_device_offset_env_and_local_rank(fake_gpus, monkeypatch):
    fake_gpus(8)
    monkeypatch.setenv("CUDA_OFFSET", "4")
    assert [device("auto", session=s).index for s in range(4)] == [4, 5, 6, 7]
    assert device("auto", session=0, cuda_offset=2).index == 2  # explicit offset beats the env var
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert device("auto", session=0).index == 7  # offset 4 + rank 3
    assert device("auto", session=1).index == 0  # wraps around
    monkeypatch.setenv("CUDA_OFFSET", "x")
    with pytest.raises(DeviceError, match="CUDA_OFFSET"):
        select_device("auto")


def test_torchrun_never_puts_two_processes_on_one_gpu(fake_gpus, monkeypatch):
    fake_gpus(2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    placed = set()
    for rank in range(2):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        placed.add(device("auto").index)
    assert placed == {0, 1}
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # 4 processes on 2 GPUs: rank 2 would wrap onto GPU 0
    with pytest.raises(DeviceError, match="4 processes on this node but it has 2 GPU"):
        select_device("auto")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(DeviceError, match="would put all 2 torchrun processes on GPU 1"):
        select_device("1")  # an explicit index ignores LOCAL_RANK
    assert device("false") == torch.device("cpu")  # gloo on CPU: any number of processes


def test_slurm_task_uses_its_own_gpus(fake_gpus, monkeypatch):
    fake_gpus(2)  # SLURM gave this task 2 GPUs: CUDA_VISIBLE_DEVICES lists them, torch sees them as 0 and 1
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    monkeypatch.setenv("CUDA_OFFSET", "1")
    chosen, why = select_device("auto", session=3)  # a sweep's session and offset would rotate: not under SLURM
    assert chosen == torch.device("cuda", 0) and "SLURM job 42" in why
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert device("true", session=3) == torch.device("cuda", 1)


def test_choose_batch_size():
    assert gpu_utils.divisors(12) == [1, 2, 3, 4, 6, 12] and gpu_utils.divisors(1) == [1]
    assert choose_batch_size(2048, "auto", target=256) == 256
    assert choose_batch_size(2048, "auto") == 2048
    assert choose_batch_size(1000, "auto", target=300) == 250
    assert choose_batch_size(12, "auto", target=5) == 4
    # never one row where two fit (before: ppo_continuous --num-steps 32 --minibatch-size auto took 1, which
    # --norm-adv then refused)
    assert choose_batch_size(32, "auto", target=32 // 32) == 2 and choose_batch_size(3, "auto", target=1) == 1
    assert choose_batch_size(4096, 512) == 512
    assert choose_batch_size(4096, "1024") == 1024
    with pytest.raises(BatchSizeError) as err:
        choose_batch_size(2048, 300)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        "--minibatch-size 300 does not divide the total batch 2048 (envs x steps); valid sizes near it:"
    )
    assert "256" in message and "512" in message and "300" not in message.split(":")[1]
    with pytest.raises(BatchSizeError, match="'auto' or a positive integer"):
        choose_batch_size(64, "big")
    # a size above the whole batch says so (ppo_atari.py --num-envs 1 --num-steps 16 at the default 256)
    with pytest.raises(BatchSizeError) as err:
        choose_batch_size(16 * 16, 512)
    assert str(err.value).startswith(
        "--minibatch-size 512 is larger than the total batch 256 (envs x steps); valid sizes near it:"
    )
    # a count of minibatches (--num-minibatches) wins over the size, and must divide the batch
    assert choose_batch_size(2048, 300, parts=8) == 256 and choose_batch_size(2048, parts=1) == 2048
    for parts in (0, 3):
        with pytest.raises(
            BatchSizeError,
            match=rf"^--num-minibatches {parts} cannot split the total batch 2048 \(envs x steps\) evenly; valid: ",
        ):
            choose_batch_size(2048, parts=parts)


def nature_convnet(num_actions: int) -> nn.Module:
    """The Nature DQN trunk with policy and value heads, as ppo_atari.py builds it."""
    trunk = nn.Sequential(
        nn.Conv2d(4, 32, 8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 512),
        nn.ReLU(),
    )

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.network, self.actor, self.critic = trunk, nn.Linear(512, num_actions), nn.Linear(512, 1)

        def forward(self, x):
            hidden = self.network(x)
            return self.actor(hidden), self.critic(hidden)

    return Net()


def test_estimate_memory_nature_convnet_exact_weights():
    model = nature_convnet(num_actions=4)
    # conv1 + conv2 + conv3 + fc + actor + critic, weights and biases, counted by hand
    params = (32 * 4 * 8 * 8 + 32) + (64 * 32 * 4 * 4 + 64) + (64 * 64 * 3 * 3 + 64) + (3136 * 512 + 512)
    params += (512 * 4 + 4) + (512 + 1)
    assert params == 1_686_693
    est = gpu_utils.estimate_memory(model, "adam", batch_bytes=1000, rollout_bytes=2000)
    assert est.weights == params * 4
    assert est.gradients == params * 4
    assert est.optimizer_state == 2 * params * 4
    assert est.cuda_context == 0 and est.workspace == 0  # the model is on the CPU: no CUDA context, no cuBLAS
    assert est.total == 4 * params * 4 + 1000 + 2000
    on_gpu = gpu_utils.MemoryEstimate(1, 2, 3, 4, 5, 6, cuda_context=gpu_utils.CUDA_CONTEXT_BYTES, workspace=7)
    assert on_gpu.total == 28  # the allocator's share (cuBLAS workspace included), as max_memory_allocated counts
    assert "outside the allocator" in str(on_gpu) and "cuBLAS workspace" in str(on_gpu)
    assert gpu_utils.estimate_memory(model, "sgd").optimizer_state == 0
    text = str(est)
    assert "weights" in text and "total" in text and "MiB" in text


def test_estimate_memory_measures_activations():
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))
    est = gpu_utils.estimate_memory(model, example_input=torch.zeros(2, 10), batch_size=64)
    assert est.activations == 64 * (20 + 20 + 5) * 4  # each leaf module's output, float32, 64 rows
    assert gpu_utils.estimate_memory(model, activation_bytes=123).activations == 123
    with pytest.raises(ValueError, match="unknown optimizer"):
        gpu_utils.estimate_memory(model, "lbfgs")


def test_micro_batches_halve_until_the_backward_passes_fit(capsys):
    """Backward passes that run out of memory above 4 rows: the micro-batch halves 32 -> 16 -> 8 -> 4, the minibatch
    starts over each time (from cleared gradients), the back-off is said once and kept for the log."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    x, y = torch.randn(37, 8), torch.randn(37, 1)
    ((model(x) - y) ** 2).mean().backward()
    full = [p.grad.clone() for p in model.parameters()]
    tried = []

    def backward(rows, weight):
        tried.append(len(rows[0]))
        if len(rows[0]) > 4:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        (((model(rows[0]) - rows[1]) ** 2).mean() * weight).backward()
        return {"rows": torch.tensor(float(len(rows[0])))}

    micro = gpu_utils.MicroBatches(backward, "32", 37, list(model.parameters()))
    model.zero_grad(set_to_none=True)
    stats = micro((x, y))
    assert tried[:4] == [32, 16, 8, 4] and micro.rows == 4 and micro.backoffs == [(32, 4)]
    assert stats["rows"] == pytest.approx(9 * 4 * 4 / 37 + 1 / 37)  # each slice's statistics weighted by its rows
    assert capsys.readouterr().out == "micro-batch: CUDA out of memory at 32 rows, now 4 rows per backward pass\n"
    for g_full, p in zip(full, model.parameters()):  # the slices done before each OOM were thrown away
        torch.testing.assert_close(p.grad, g_full, atol=1e-6, rtol=1e-5)
    model.zero_grad(set_to_none=True)
    micro((x, y))
    assert micro.backoffs == [(32, 4)] and capsys.readouterr().out == ""  # it fits now: nothing more said

    def always_oom(rows, weight):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    with pytest.raises(torch.cuda.OutOfMemoryError):  # one row that does not fit is a real error
        gpu_utils.MicroBatches(always_oom, "auto", 8, list(model.parameters()))((x[:8],))


def run_args(**changes) -> argparse.Namespace:
    """The settings run_utils.shared_checks reads, valid unless ``changes`` say otherwise."""
    args = dict(seed=1, resume=None, eval_checkpoint=None, learning_rate=1e-3, max_grad_norm=0.5, eval_episodes=1)
    args |= dict(checkpoint_every=1, exp_name="x", micro_batch="auto", num_threads=0)
    return argparse.Namespace(**(args | changes))


def test_micro_batches_auto_is_the_whole_minibatch_and_n_at_most_it():
    def backward(rows, weight):
        return {}

    assert gpu_utils.MicroBatches(backward, "auto", 256, []).rows == 256
    assert gpu_utils.MicroBatches(backward, "64", 256, []).rows == 64
    assert gpu_utils.MicroBatches(backward, " 1000 ", 256, []).rows == 256
    for bad in ("0", "-3", "half", "²"):  # refused before a run starts, with the other shared settings
        with pytest.raises(ValueError, match="--micro-batch"):
            run_utils.check(run_utils.shared_checks(run_args(micro_batch=bad)))


def test_compile_policy_leaves_an_eager_policy_alone():
    def policy(x):
        return x + 1

    assert gpu_utils.compile_policy(policy, compile=False, cudagraphs=False) is policy


def test_enable_tf32_and_limit_threads_on_cpu(monkeypatch):
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        monkeypatch.setenv(var, "")  # limit_threads sets them: restored after the test, not leaked into later ones
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_utils.enable_tf32(True) is False
    assert torch.backends.cuda.matmul.allow_tf32 is False
    threads = torch.get_num_threads()
    try:
        gpu_utils.limit_threads(1)
        assert torch.get_num_threads() == 1
        assert os.environ["OMP_NUM_THREADS"] == "1" and os.environ["MKL_NUM_THREADS"] == "1"
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(ValueError):
        gpu_utils.limit_threads(0)


def test_cudnn_benchmark_only_without_determinism(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    try:
        assert gpu_utils.enable_tf32(True, deterministic=True) is True
        assert torch.backends.cudnn.benchmark is False and torch.backends.cudnn.deterministic is True
        gpu_utils.enable_tf32(True, deterministic=False)
        assert torch.backends.cudnn.benchmark is True and torch.backends.cudnn.deterministic is False
    finally:
        monkeypatch.undo()
        gpu_utils.enable_tf32(False)


def test_rng_state_round_trip_and_gpu_state_on_cpu():
    device = torch.device("cpu")
    torch.manual_seed(5)
    state = gpu_utils.rng_state(device)
    first = torch.rand(3)
    gpu_utils.set_rng_state(state, device)
    assert torch.equal(torch.rand(3), first)
    assert state["cuda"] is None
    # a checkpoint written on a GPU resumes on a CPU: the CPU generator continues, the GPU state is left alone
    gpu_utils.set_rng_state({"torch": state["torch"], "cuda": torch.zeros(16, dtype=torch.uint8)}, device)
    assert torch.equal(torch.rand(3), first)


def test_thread_budget(monkeypatch):
    for var in ("SLURM_CPUS_PER_TASK", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7}, raising=False)
    assert gpu_utils.thread_budget() == gpu_utils.ThreadBudget(8, "CPU affinity")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3}, raising=False)  # taskset -c 2,3
    assert gpu_utils.thread_budget() == gpu_utils.ThreadBudget(2, "CPU affinity")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "6")
    assert gpu_utils.thread_budget() == gpu_utils.ThreadBudget(6, "SLURM_CPUS_PER_TASK")
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")  # nested OpenMP syntax: the outer level counts
    assert gpu_utils.thread_budget() == gpu_utils.ThreadBudget(4, "OMP_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "32")  # a variable above the affinity does not raise the budget
    assert gpu_utils.thread_budget().threads == 6
    monkeypatch.setenv("OMP_NUM_THREADS", "0")  # nonsense values are ignored, never 0 threads
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "garbage")
    assert gpu_utils.thread_budget().threads == 16
    assert gpu_utils.thread_budget(3) == gpu_utils.ThreadBudget(3, "--num-threads")  # the flag wins
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(), raising=False)
    assert gpu_utils.thread_budget().threads == 1
    with pytest.raises(ValueError, match="--num-threads"):
        gpu_utils.thread_budget(-1)
    with pytest.raises(ValueError, match="--num-threads must be 0 .automatic. or 1 to "):  # before: a segfault
        gpu_utils.thread_budget(100_000)


def test_split_cpus_gives_disjoint_groups_covering_the_cpus():
    for cpus in ([0, 1], list(range(7)), [2, 3, 5, 8, 9, 10, 11, 12]):
        for parts in range(1, len(cpus) + 1):
            groups = gpu_utils.split_cpus(cpus, parts)
            assert len(groups) == parts
            assert sum(groups, []) == cpus  # contiguous, disjoint, all of them, in order
            assert max(map(len, groups)) - min(map(len, groups)) <= 1
    assert gpu_utils.split_cpus([4, 5, 6], 2) == [[4, 5], [6]]
    assert gpu_utils.split_cpus([0, 1], 5) == [[0], [1], [0], [1], [0]]  # more parts than CPUs: round robin
    with pytest.raises(ValueError):
        gpu_utils.split_cpus([0, 1], 0)
    with pytest.raises(ValueError):
        gpu_utils.split_cpus([], 2)


@pytest.fixture
def eight_cpus(monkeypatch):
    """A machine of 8 CPUs, no explicit budget; records the threads and CPUs each share sets instead of setting them."""
    for var in ("SLURM_CPUS_PER_TASK", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    applied = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: applied.append(("threads", n)))
    monkeypatch.setattr(gpu_utils, "_pin", lambda cpus: applied.append(("cpus", list(cpus))))
    return applied


def test_cpu_share_live_runs_get_disjoint_shares_of_all_cores(eight_cpus, tmp_path):
    shares = [gpu_utils.CpuShare(gpu_utils.thread_budget(), tmp_path, interval=0)]
    assert shares[0].update() is False and shares[0].threads == 8  # alone: keeps every core, nothing changed
    for runs in (2, 3):  # a second, then a third run starts: it takes its share at once, the others at their update
        shares.append(gpu_utils.CpuShare(gpu_utils.thread_budget(), tmp_path, interval=0))
        assert f"of {runs} live runs" in shares[-1].why and shares[-1].update() is False
        assert all(share.update() for share in shares[:-1])
        parts = [share._part for share in shares]
        assert sorted(sum(parts, [])) == list(range(8))  # disjoint, and together all the cores
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
        assert all(share.threads == len(share._part) and f"of {runs} live runs" in share.why for share in shares)
    assert ("cpus", shares[2]._part) in eight_cpus and ("threads", shares[2].threads) in eight_cpus
    for share in shares[1:]:
        share.close()
    assert shares[0].update() is True and shares[0].threads == 8 and shares[0].why == "alone: all its CPUs"
    shares[0].close()
    assert list(tmp_path.iterdir()) == []


def test_cpu_share_frees_a_killed_runs_place(eight_cpus, tmp_path):
    code = (
        "import os, sys, time, gpu_utils; os.cpu_count = lambda: len(os.sched_getaffinity(0));"  # even under taskset
        " share = gpu_utils.CpuShare(gpu_utils.thread_budget(), sys.argv[1]); print('ready', flush=True);"
        " time.sleep(60)"
    )
    other = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert other.stdout.readline().strip() == "ready"
        share = gpu_utils.CpuShare(gpu_utils.thread_budget(), tmp_path, interval=0)
        assert share.threads == 4 and len(share.live_runs()) == 2
        other.kill()  # SIGKILL: no cleanup, the OS drops its flock
        other.wait()
        assert share.update() is True and share.threads == 8 and share.why == "alone: all its CPUs"
        assert [path.name for path in tmp_path.iterdir()] == [share.path.name]  # the dead run's file is gone
        share.close()
    finally:
        other.kill()
        other.wait()


def test_cpu_share_a_run_started_beside_live_ones_takes_its_share_at_once(eight_cpus, tmp_path):
    """Before its first iteration: two runs started together would otherwise each spend it on every core. A small
    MLP's one torch thread stays one; an older run's share shrinks at its next update."""
    older = gpu_utils.CpuShare(gpu_utils.thread_budget(), tmp_path, interval=0)
    assert (older.threads, older.why) == (8, "CPU affinity") and eight_cpus == []  # alone: nothing changed
    newer = gpu_utils.CpuShare(gpu_utils.thread_budget(), tmp_path, interval=0, max_torch_threads=1)
    assert (newer.threads, newer.why) == (4, "run 2 of 2 live runs: CPUs [4, 5, 6, 7]")
    assert eight_cpus == [("threads", 1), ("cpus", [4, 5, 6, 7])]  # set before the run's first step
    assert (
        older.update() is True
        and older._part == [0, 1, 2, 3]
        and eight_cpus[-2:] == [("threads", 4), ("cpus", [0, 1, 2, 3])]
    )
    newer.close()
    older.close()


def test_cpu_share_never_overrides_an_explicit_budget(eight_cpus, tmp_path, monkeypatch):
    other = gpu_utils.CpuShare(gpu_utils.thread_budget(), tmp_path)  # another run started by hand is live
    budgets = [gpu_utils.thread_budget(3)]  # --num-threads
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    budgets.append(gpu_utils.thread_budget())
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    budgets.append(gpu_utils.thread_budget())
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3}, raising=False)  # a sweep's taskset -c 2,3
    budgets.append(gpu_utils.thread_budget())
    for budget in budgets:
        share = gpu_utils.CpuShare(budget, tmp_path, interval=0)
        assert share.update() is False and (share.threads, share.why) == (budget.threads, budget.why)
        share.close()
    assert eight_cpus == [] and len(list(tmp_path.iterdir())) == 1  # nothing set, nothing registered
    other.close()


def test_cpu_share_update_is_rate_limited(eight_cpus, tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(gpu_utils.time, "monotonic", lambda: clock[0])
    share = gpu_utils.CpuShare(gpu_utils.thread_budget(), tmp_path)
    assert share.update() is False  # alone: looked, nothing to change
    other = gpu_utils.CpuShare(gpu_utils.thread_budget(), tmp_path)
    clock[0] += 0.5
    assert share.update() is False and share.threads == 8  # not yet looked again
    clock[0] += 0.6
    assert share.update() is True and share.threads == 4
    other.close()
    share.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_cpu_share_forked_worker_neither_holds_nor_releases_the_lock(eight_cpus, tmp_path):
    share = gpu_utils.CpuShare(gpu_utils.thread_budget(), tmp_path, interval=0)
    pid = os.fork()
    if pid == 0:  # an environment worker forked by the run: closing its share must leave the run registered
        share.close()
        os._exit(0 if share._file is None and share.update() is False else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert share.live_runs() == [share.path]  # still locked by this run: not taken for a dead run's
    share.close()


def test_gpu_monitor_is_inert_on_cpu():
    monitor = gpu_utils.GPUMonitor("cpu", interval=0.01).start()
    assert monitor._thread is None
    assert monitor.collect() == {}
    monitor.close()


class FakeNVML:
    """Two NVML GPUs in PCI order; CUDA (torch) sees them in the other order, by UUID."""

    class Rates:
        def __init__(self, gpu):
            self.gpu = gpu

    class Memory:
        used = 1024 * 2**20

    def __init__(self, supported=True):
        self.uuids = ["GPU-aaaa-1111", "GPU-bbbb-2222"]
        self.supported = supported
        self.queried = []

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, handle):
        return self.uuids[handle].encode()

    def nvmlDeviceGetHandleByUUID(self, uuid):
        raise RuntimeError(f"no device {uuid}")

    def nvmlDeviceGetUtilizationRates(self, handle):
        if not self.supported:
            raise RuntimeError("Not Supported")
        self.queried.append(handle)
        return self.Rates(70 + handle)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self.Memory()


def fake_cuda_uuid(monkeypatch, uuids):
    class Props:
        def __init__(self, uuid):
            self.uuid = uuid

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props(uuids[i]))


def test_gpu_monitor_finds_the_nvml_device_by_uuid(monkeypatch):
    nvml = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    fake_cuda_uuid(monkeypatch, ["bbbb-2222", "aaaa-1111"])  # cuda:0 is NVML's device 1 (e.g. CUDA_DEVICE_ORDER)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb-2222,GPU-aaaa-1111")  # UUIDs: no index to map
    monitor = gpu_utils.GPUMonitor("cuda:0", interval=0.01).start()
    time.sleep(0.1)
    stats = monitor.collect()
    monitor.close()
    assert set(nvml.queried) == {1} and stats["gpu/util_peak"] == 71 and stats["gpu/mem_peak_mib"] == 1024


def test_gpu_monitor_says_once_when_it_cannot_sample(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(supported=False))  # e.g. a MIG instance
    fake_cuda_uuid(monkeypatch, ["aaaa-1111"])
    monitor = gpu_utils.GPUMonitor("cuda:0", interval=0.01).start()
    assert monitor._thread is None and monitor.collect() == {}
    out = capsys.readouterr().out
    assert out.count("NVML cannot sample cuda:0") == 1 and "Not Supported" in out


def test_cli_prints_machine_report(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "gpu_utils.py"), "4"], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    assert "CUDA available" in out and "GPU count" in out


def test_import_has_no_side_effects(tmp_path):
    code = (
        "import os, torch; n = torch.get_num_threads(); import gpu_utils; "
        "print(n == torch.get_num_threads(), 'OMP_NUM_THREADS' in os.environ)"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=tmp_path
    )
    assert out.stdout.split() == ["True", "False"]


@pytest.mark.gpu
def test_select_device_true_and_tf32_on_gpu():
    gpu = device("true")
    assert gpu.type == "cuda"
    major = torch.cuda.get_device_capability(gpu)[0]
    assert gpu_utils.enable_tf32(True) is (major >= 8)
    gpu_utils.enable_tf32(False)


@pytest.mark.gpu
def test_gpu_monitor_samples_on_gpu():
    pytest.importorskip("pynvml")
    gpu = device("true")
    monitor = gpu_utils.GPUMonitor(gpu, interval=0.02).start()
    x = torch.randn(2048, 2048, device=gpu)
    for _ in range(50):
        x = x @ x
        x = x / x.norm()
    torch.cuda.synchronize()
    time.sleep(0.2)
    stats = monitor.collect()
    monitor.close()
    assert set(stats) == {"gpu/util_mean", "gpu/util_peak", "gpu/mem_mean_mib", "gpu/mem_peak_mib"}
    assert stats["gpu/mem_peak_mib"] > 0


@pytest.mark.gpu
def test_memory_estimate_bounds_real_peak(monkeypatch):
    """The estimate leaves out cuDNN's autotuning, whose trial workspaces peaked at 360 MiB against 163 estimated on
    an H200 (2026-11-26): device("true") turns it on for the tests after it, so this one turns it off."""
    gpu = device("true")
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    before = torch.cuda.memory_allocated(gpu)  # what earlier tests in this process still hold
    model = nature_convnet(4).to(gpu)
    opt = torch.optim.Adam(model.parameters())
    x = torch.zeros(256, 4, 84, 84, device=gpu)
    est = gpu_utils.estimate_memory(model, "adam", batch_bytes=x.numel() * 4, example_input=x[:2], batch_size=256)
    torch.cuda.reset_peak_memory_stats(gpu)
    logits, value = model(x)
    (logits.sum() + value.sum()).backward()
    opt.step()
    peak = torch.cuda.max_memory_allocated(gpu) - before
    assert est.cuda_context == gpu_utils.CUDA_CONTEXT_BYTES
    assert est.workspace == gpu_utils.CUBLAS_WORKSPACE_BYTES
    assert est.total / 2 <= peak <= 2 * est.total  # allocator against allocator, within 2x


@pytest.mark.gpu
def test_memory_estimate_with_cuda_graphs_bounds_real_peak():
    """A training step captured as one CUDA graph: the estimate adds the warm-up stream's and the capture's cuBLAS
    workspaces (runs with graphs peaked about 230 MiB above an estimate without them on an H200)."""
    gpu = device("true")
    model = nature_convnet(4).to(gpu)
    opt = torch.optim.Adam(model.parameters(), capturable=True)
    x = torch.zeros(256, 4, 84, 84, device=gpu)
    est = gpu_utils.estimate_memory(
        model, optimizer="adam", batch_bytes=x.numel() * 4, example_input=x[:2], batch_size=256, cudagraphs=True
    )
    torch.cuda.reset_peak_memory_stats(gpu)

    def train_step(x):
        opt.zero_grad(set_to_none=True)
        logits, value = model(x)
        (logits.sum() + value.sum()).backward()
        opt.step()
        return value

    step = gpu_utils.CudaGraph(train_step)
    for _ in range(5):
        step(x)
    torch.cuda.synchronize(gpu)
    peak = torch.cuda.max_memory_allocated(gpu)
    assert step.graph is not None
    assert est.workspace == 3 * gpu_utils.CUBLAS_WORKSPACE_BYTES
    assert est.total / 2 <= peak <= 2 * est.total


@pytest.mark.parametrize(
    "flags, slow",
    [
        ("fpu sse2 avx avx2 fma", True),  # AVX2 only: bf16 emulated
        ("fpu avx2 avx512f avx512_bf16", False),
        ("fpu avx2 amx_bf16 amx_tile", False),
    ],
)
def test_bf16_note_names_cpus_without_bf16_instructions(tmp_path, flags, slow):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    note = gpu_utils.bf16_note(torch.device("cpu"), str(cpuinfo))
    assert (note.startswith("amp: this CPU has no bf16 instructions") and "drop --amp" in note) if slow else note == ""
    assert gpu_utils.bf16_note(torch.device("cuda", 0), str(cpuinfo)) == ""  # GPUs: no opinion here
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")  # no x86 flags line: nothing to say
    assert gpu_utils.bf16_note(torch.device("cpu"), str(arm)) == ""
    assert gpu_utils.bf16_note(torch.device("cpu"), str(tmp_path / "missing")) == ""


def test_free_memory_reads_memavailable_and_the_cgroup_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n")
    cpu = torch.device("cpu")
    no_cgroup = tmp_path / "none"
    assert gpu_utils.free_memory(cpu, str(meminfo), str(no_cgroup)) == 20000000 * 1024  # MemAvailable, not MemFree
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("8589934592\n")  # a container limited to 8 GiB that uses 3 GiB
    (cgroup / "memory.current").write_text(f"{3 * 2**30}\n")
    assert gpu_utils.free_memory(cpu, str(meminfo), str(cgroup)) == 5 * 2**30
    (cgroup / "memory.max").write_text("max\n")  # no limit
    assert gpu_utils.free_memory(cpu, str(meminfo), str(cgroup)) == 20000000 * 1024
    assert gpu_utils.free_memory(cpu, str(tmp_path / "missing"), str(cgroup)) is None


def test_cpu_share_runs_without_a_share_where_its_directory_is_unusable(eight_cpus, tmp_path, capsys):
    """Before: XDG_RUNTIME_DIR=/proc/self ended the run in a FileNotFoundError traceback, and a directory made by
    someone else (or writable by others) was used as it was."""
    world_writable = tmp_path / "open"
    world_writable.mkdir()
    world_writable.chmod(0o777)
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "file").write_text("")
    cases = {"/proc/self/gpu-rl": "cannot use", world_writable: "writable by other users"}
    cases |= {tmp_path / "link": "not a directory", tmp_path / "file": "cannot use"}
    if os.geteuid() == 0:  # a directory another user made first, to crash, hang or starve this user's runs
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        cases[theirs] = "belongs to another user"
    for directory, why in cases.items():
        share = gpu_utils.CpuShare(gpu_utils.thread_budget(), directory, interval=0)
        assert share.update() is False and (share.threads, share.why) == (8, "CPU affinity"), directory
        lines = capsys.readouterr().out.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("threads: no CPU share with other runs (") and why in lines[0]
        share.close()
    assert eight_cpus == []  # nothing set


def test_cpu_share_leaves_no_file_where_locks_fail(eight_cpus, tmp_path, capsys, monkeypatch):
    """Before: a file system without locks (ENOLCK) kept a <time>-<pid>.new file for every run started there."""
    import errno
    import fcntl

    monkeypatch.setattr(fcntl, "flock", lambda *args: (_ for _ in ()).throw(OSError(errno.ENOLCK, "No locks")))
    share = gpu_utils.CpuShare(gpu_utils.thread_budget(), tmp_path, interval=0)
    assert "threads: no CPU share with other runs (cannot use" in capsys.readouterr().out
    assert share.update() is False and list(tmp_path.iterdir()) == []


def test_cpu_share_opens_only_regular_lock_files_of_its_own(eight_cpus, tmp_path):
    """Before: a FIFO named *.lock hung every new run in live_runs()."""
    os.mkfifo(tmp_path / "0-fifo.lock")
    (tmp_path / "1-dir.lock").mkdir()
    (tmp_path / "2-link.lock").symlink_to(tmp_path / "0-fifo.lock")
    code = (
        "import os, sys, gpu_utils; os.cpu_count = lambda: len(os.sched_getaffinity(0));"
        " share = gpu_utils.CpuShare(gpu_utils.thread_budget(), sys.argv[1], interval=0);"
        " print(len(share.live_runs()), share.threads == len(os.sched_getaffinity(0)))"
    )
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.split() == ["1", "True"], res.stdout + res.stderr  # alone, not hung


def test_odd_digits_in_flags_and_variables_are_one_line_errors_or_ignored(fake_gpus, monkeypatch):
    """Before: '²' passed str.isdigit() and int() raised 'invalid literal for int()' (a traceback in describe())."""
    fake_gpus(2)
    with pytest.raises(DeviceError, match="not understood"):
        select_device("²")
    with pytest.raises(BatchSizeError, match="'auto' or a positive integer"):
        choose_batch_size(12, "²")
    with pytest.raises(ValueError, match="--micro-batch"):
        run_utils.check(run_utils.shared_checks(run_args(micro_batch="²")))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "²")
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    assert gpu_utils.thread_budget() == gpu_utils.ThreadBudget(8, "CPU affinity")


def test_free_memory_reads_this_processs_own_cgroup_and_its_ancestors(tmp_path):
    """Before: only the mount's root was read, which on a host without a cgroup namespace (a SLURM job, systemd-run
    -p MemoryMax) has no memory.max: the job's limit was ignored."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable:   20000000 kB\n")
    root = tmp_path / "cgroup"
    step = root / "job_7" / "step_0"
    step.mkdir(parents=True)
    (step / "memory.max").write_text("max\n")  # the step has no limit of its own; its job has 8 GiB, 3 GiB used
    (step / "memory.current").write_text(f"{2 * 2**30}\n")
    (root / "job_7" / "memory.max").write_text(f"{8 * 2**30}\n")
    (root / "job_7" / "memory.current").write_text(f"{3 * 2**30}\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/job_7/step_0\n")
    assert gpu_utils.free_memory(torch.device("cpu"), str(meminfo), str(root), str(proc)) == 5 * 2**30


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_checkpoint_that_cannot_be_written_keeps_the_previous_one_and_leaves_no_partial_file(tmp_path, capsys):
    """Before: a full disk left a partial checkpoint.pt.tmp holding the space, and a RuntimeError ('enforce fail at
    inline_container.cc') that does not say why ended a stopping run with a traceback."""
    path = tmp_path / "checkpoint.pt"
    assert run_utils.save_checkpoint(path, model={"w": torch.zeros(4)}, status="running") is True
    tmp = tmp_path / "checkpoint.pt.tmp"
    tmp.symlink_to("/dev/full")  # every write: ENOSPC, as on a full disk
    state = dict(model={"w": torch.ones(4)}, optimizer={"param_groups": []}, iteration=2, global_step=256)
    assert run_utils.save_checkpoint(path, status="stopped", **state) is False  # one line, no traceback
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot write {path} (") and "previous one is kept" in err[0]
    assert "continue with" not in out  # a stop whose checkpoint was not written offers no command
    assert torch.load(path)["status"] == "running" and not os.path.lexists(tmp)
    # --save-model's file likewise (before: a traceback and a partial .model file), where none was written before
    (tmp_path / "x.model.tmp").symlink_to("/dev/full")
    assert run_utils.save_checkpoint(tmp_path / "x.model", model={"w": torch.ones(4)}) is False
    assert "none was written" in capsys.readouterr().err
    assert not os.path.lexists(tmp_path / "x.model") and not os.path.lexists(tmp_path / "x.model.tmp")


@pytest.fixture
def stop_handlers():
    """Restores the stop signals' handlers and run_utils.STOP after a test that lets run_utils take them."""
    handlers = {sig: signal.getsignal(sig) for sig in run_utils.STOP_SIGNALS}
    yield
    run_utils.STOP.clear()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def test_stop_on_signals_turns_a_signal_into_a_stop_request(stop_handlers, capfd):
    stop = run_utils.stop_on_signals(is_main=True)
    assert not stop
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.01)
    assert stop == ["SIGTERM"]  # the process lives on: the run stops after its iteration, with a checkpoint
    assert capfd.readouterr().err == "SIGTERM: stopping after this iteration, with a checkpoint\n"


def test_run_folder_is_new_and_locked_or_the_checkpoints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = run_utils.run_folder("Env__x__1__100", None)
    assert run_dir == os.path.join("runs", "Env__x__1__100") and run_utils.run_is_live(run_dir)
    assert run_utils.run_folder("Env__x__1__100", None) == os.path.join("runs", "Env__x__1__101")  # taken: next second
    assert run_utils.run_folder("ignored", os.path.join("old", "checkpoint.pt")) == "old"
    with pytest.raises(ValueError, match="is in use by a live run"):  # no second process writes into a live run
        run_utils.run_folder("ignored", os.path.join(run_dir, "checkpoint.pt"))
    assert run_utils.run_folder("Env__x__1__100", None, is_main=False) == run_dir  # torchrun: the main process's


def test_open_logs_then_end_run_closes_them_and_ignores_stop_signals(tmp_path, capsys, stop_handlers):
    from helpers import scalars

    args = argparse.Namespace(track=False, seed=1)
    writer = run_utils.open_logs(str(tmp_path), args, torch.device("cpu"), 0)
    writer.add_scalar("charts/x", 1.0, 0)
    run_utils.end_run(writer, str(tmp_path), 10, 10, time.time(), diverged=False)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # a SIGTERM in the teardown cannot fail a finished run
    assert capsys.readouterr().out.startswith("done: step 10/10 in ") and "charts/x" in scalars(tmp_path)


def test_end_run_of_a_diverged_run_marks_its_checkpoint_and_exits_1(tmp_path, capsys, stop_handlers):
    ckpt = dict(script="s", args={}, model={"w": torch.ones(1)}, status="running", global_step=5)
    run_utils.save_checkpoint(tmp_path / "checkpoint.pt", **ckpt)
    writer = run_utils.open_logs(str(tmp_path), argparse.Namespace(track=False), torch.device("cpu"), 0)
    with pytest.raises(SystemExit) as end:
        run_utils.end_run(writer, str(tmp_path), 8, 10, time.time(), diverged=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert end.value.code == 1 and len(err) == 1 and err[0].startswith("error: the update diverged by step 8")
    assert run_utils.read_checkpoint(tmp_path / "checkpoint.pt")["status"] == "diverged"


def test_load_states_on_resume_keeps_this_runs_learning_rate_and_restores_the_rng(capsys):
    torch.manual_seed(0)
    saved = nn.Linear(3, 2)
    rng = gpu_utils.rng_state(torch.device("cpu"))
    draw = torch.rand(3)
    optimizer = torch.optim.Adam(saved.parameters(), lr=0.3)
    ckpt = dict(model=saved.state_dict(), optimizer=optimizer.state_dict(), rng=[rng], global_step=7, iteration=2)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    run_utils.load_states({"model": model, "optimizer": optimizer}, ckpt, "ck.pt", device=torch.device("cpu"))
    assert torch.equal(model.weight, saved.weight) and optimizer.param_groups[0]["lr"] == 0.1
    assert torch.equal(torch.rand(3), draw) and capsys.readouterr().out == "resumed ck.pt at step 7 (iteration 2)\n"
    with pytest.raises(SystemExit) as end:  # a checkpoint of another network: one line, exit 2
        run_utils.load_states({"model": nn.Linear(4, 2)}, ckpt, "ck.pt")
    err = capsys.readouterr().err.strip().splitlines()
    assert end.value.code == 2 and len(err) == 1 and err[0].startswith("error: 'ck.pt' does not fit the network/env")


def test_a_thread_variable_as_large_as_the_machine_is_still_an_explicit_budget(eight_cpus, tmp_path, monkeypatch):
    """Before: OMP_NUM_THREADS=8 on 8 CPUs (a sweep of one run sets it so) counted as no budget: the run registered
    and shrank beside runs started by hand, though an explicit budget always wins (docs/devices-threads-memory.md)."""
    other = gpu_utils.CpuShare(gpu_utils.thread_budget(), tmp_path)  # a run started by hand is live
    for var, value in (("OMP_NUM_THREADS", "8"), ("SLURM_CPUS_PER_TASK", "32")):
        monkeypatch.setenv(var, value)
        budget = gpu_utils.thread_budget()
        assert budget == gpu_utils.ThreadBudget(8, var)  # never above the CPUs it may use
        share = gpu_utils.CpuShare(budget, tmp_path, interval=0)
        assert share.update() is False and (share.threads, share.why) == (8, var)
        share.close()
        monkeypatch.delenv(var)
    assert eight_cpus == [] and len(list(tmp_path.iterdir())) == 1  # nothing set, nothing registered
    other.close()


def test_cli_says_a_bad_cuda_offset_in_one_line(tmp_path):
    """Before: CUDA_OFFSET=x python gpu_utils.py ended in a DeviceError traceback."""
    env = dict(os.environ, CUDA_OFFSET="x")
    res = subprocess.run([sys.executable, str(ROOT / "gpu_utils.py")], capture_output=True, text=True, env=env)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "error: environment variable CUDA_OFFSET='x' must be an integer"
    ], res.stderr


def test_a_back_off_clears_the_gradients_of_every_parameter_it_was_given():
    """A separate critic optimizer (a common CleanRL hack): the back-off must clear the critic's gradients too, not
    only those of the optimizer it was once handed (#63: it called ``optimizer.zero_grad``, so the critic's slices
    done before the out-of-memory error stayed in its gradients and were added twice)."""
    torch.manual_seed(0)
    actor, critic = nn.Linear(4, 2), nn.Linear(4, 1)
    x = torch.randn(16, 4)

    def loss(rows):
        return actor(rows).pow(2).mean() + critic(rows).pow(2).mean()

    loss(x).backward()
    full = [p.grad.clone() for p in [*actor.parameters(), *critic.parameters()]]
    for p in [*actor.parameters(), *critic.parameters()]:
        p.grad = None
    tried = []

    def backward(rows, weight):
        tried.append(len(rows[0]))
        if len(tried) == 2:  # the second slice of 8 does not fit: the first slice's gradients must go
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        (loss(rows[0]) * weight).backward()
        return {}

    params = [*actor.parameters(), *critic.parameters()]
    gpu_utils.MicroBatches(backward, "8", 16, params)((x,))
    assert tried == [8, 8, 4, 4, 4, 4]
    for g_full, p in zip(full, params):
        torch.testing.assert_close(p.grad, g_full, atol=1e-6, rtol=1e-5)
