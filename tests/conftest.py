"""Shared pytest setup: skip `@pytest.mark.gpu` tests when CUDA is absent, keep wandb offline, keep the runs the
tests start out of the CPU share of the user's own live runs (gpu_utils.CpuShare), and give each pytest-xdist worker
cores of its own."""

import os
import shutil
import tempfile

import pytest
import torch

import gpu_utils

# Under `pytest -n N` each worker (and every run it starts) gets its own 1/N of the CPUs: a run sizes its threads to
# the CPUs it may use, so the N workers' runs fill the machine once instead of N times over
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKER and WORKERS > 1 and hasattr(os, "sched_setaffinity"):
    mine = gpu_utils.split_cpus(gpu_utils.allowed_cpus(), WORKERS)[int(WORKER[2:])]
    os.sched_setaffinity(0, mine)
    torch.set_num_threads(len(mine))  # torch sized its pool when it loaded, to every CPU

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
