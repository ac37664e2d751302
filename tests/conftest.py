"""Shared pytest setup: skip `@pytest.mark.gpu` tests when CUDA is absent, keep wandb offline, and keep the runs the
tests start out of the CPU share of the user's own live runs (gpu_utils.CpuShare)."""

import os
import shutil
import tempfile

import pytest
import torch

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
