"""Shared pytest setup: skip `@pytest.mark.gpu` tests when CUDA is absent, keep wandb offline."""

import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
