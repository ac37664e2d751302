"""Shared pytest setup: skip `@pytest.mark.gpu` tests when CUDA is absent, keep wandb offline, keep the runs the
tests start out of the CPU share of the user's own live runs (gpu_utils.CpuShare), and give each pytest-xdist worker
cores of its own."""

import os
import shutil
import tempfile

import pytest

# Under `pytest -n N` each worker (and every run it starts) gets its own 1/N of the CPUs: a run sizes its threads to
# the CPUs it may use, so the N workers' runs fill the machine once instead of N times over. Set before torch loads:
# its OpenMP pool takes its size from the affinity then.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKER and WORKERS > 1 and hasattr(os, "sched_setaffinity"):
    cpus = sorted(os.sched_getaffinity(0))
    k = int(WORKER[2:])
    if WORKERS <= len(cpus):  # contiguous groups whose sizes differ by at most one
        os.sched_setaffinity(0, cpus[k * len(cpus) // WORKERS : (k + 1) * len(cpus) // WORKERS])
    else:  # more workers than CPUs: round robin
        os.sched_setaffinity(0, [cpus[k % len(cpus)]])

import torch  # noqa: E402

os.environ.setdefault("WANDB_MODE", "offline")
# CpuShare counts the live runs in $XDG_RUNTIME_DIR/gpu-rl: a folder of the tests' own, so that a training run left
# going on this machine neither halves the threads a test expects nor loses threads to the tests' runs
RUNTIME_DIR = tempfile.mkdtemp(prefix="gpu-rl-tests-")
os.environ["XDG_RUNTIME_DIR"] = RUNTIME_DIR


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(RUNTIME_DIR, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
