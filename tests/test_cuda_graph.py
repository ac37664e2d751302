"""gpu_utils.CudaGraph: a whole training step (forward, backward, clipping, Adam) captured once and replayed."""

import contextlib

import pytest
import torch
import torch.nn as nn

import gpu_utils


def make_step(device, capturable):
    """A tiny regression model and its whole update as one function of tensors, as the scripts write theirs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
    params = list(model.parameters())
    lr = torch.tensor(1e-2, device=device)
    optimizer = torch.optim.Adam(params, lr=lr, eps=1e-5, fused=True, capturable=capturable)
    data_x = torch.randn(64, 8, device=device)
    data_y = data_x.sum(-1, keepdim=True).sin()

    def update(rows):
        optimizer.zero_grad(set_to_none=True)
        loss = ((model(data_x[rows]) - data_y[rows]) ** 2).mean()
        loss.backward()
        nn.utils.clip_grad_norm_(params, 0.5, foreach=True)
        optimizer.step()
        return loss.detach()

    return model, optimizer, update


def train(device, enabled, steps=12):
    model, optimizer, update = make_step(device, capturable=enabled)
    step = gpu_utils.CudaGraph(update, enabled=enabled, warmup=2, name="update")
    generator = torch.Generator().manual_seed(1)
    losses = []
    for i in range(steps):
        optimizer.param_groups[0]["lr"].fill_(1e-2 * (1 - i / steps))  # annealed in place: no re-capture
        rows = torch.randperm(64, generator=generator)[:16].to(device)
        losses.append(step(rows).clone())
    return model, torch.stack(losses).cpu(), step


def test_disabled_runs_the_same_function_eagerly_on_every_call():
    calls = []

    def fn(x):
        calls.append(x.clone())
        return x * 2

    step = gpu_utils.CudaGraph(fn, enabled=False)
    first = step(torch.ones(3))
    second = step(torch.full((3,), 5.0))
    assert len(calls) == 2 and step.graph is None
    assert torch.equal(first, torch.full((3,), 2.0)), "an eager output is not overwritten by the next call"
    assert torch.equal(second, torch.full((3,), 10.0))


def test_disabled_step_trains_and_equals_the_plain_loop():
    model, losses, _ = train("cpu", enabled=False)
    assert losses[-3:].mean() < losses[:3].mean()
    reference, optimizer, update = make_step("cpu", capturable=False)
    generator = torch.Generator().manual_seed(1)
    for i in range(12):
        optimizer.param_groups[0]["lr"].fill_(1e-2 * (1 - i / 12))
        update(torch.randperm(64, generator=generator)[:16])
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_captured_step_matches_the_eager_one_and_replays():
    eager_model, eager_losses, _ = train("cuda", enabled=False)
    graph_model, graph_losses, step = train("cuda", enabled=True)
    assert step.graph is not None, "captured after the warm-up calls"
    torch.testing.assert_close(graph_losses, eager_losses, rtol=1e-4, atol=1e-5)
    for a, b in zip(graph_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


class FailingCapture:
    """Stand-ins for torch.cuda's streams and graphs on the CPU: the warm-up calls run, the capture raises, as CUDA
    does when the captured function makes a host sync."""

    class Stream:
        def wait_stream(self, other):
            pass

    class CUDAGraph:
        def replay(self):
            raise AssertionError("a failed capture is never replayed")

    @staticmethod
    def stream(stream):
        return contextlib.nullcontext()

    @staticmethod
    def current_stream():
        return FailingCapture.Stream()

    @staticmethod
    def graph(graph):  # fails before the step runs: on a GPU a capture only records kernels, so it changes nothing
        raise RuntimeError("operation not permitted when stream is capturing\nCUDA kernel errors might be ...")


def test_every_warm_up_runs_on_one_side_stream(monkeypatch):
    """cuBLAS keeps a workspace for each stream it runs on and never frees it: a new stream per warm-up call took one
    more each time (runs with graphs peaked about 230 MiB above their estimate on an H200)."""
    made = []

    class Stream(FailingCapture.Stream):
        def __init__(self):
            made.append(self)

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", FailingCapture.stream)
    monkeypatch.setattr(torch.cuda, "current_stream", FailingCapture.current_stream)
    monkeypatch.setattr(gpu_utils.CudaGraph, "warmup_stream", None, raising=False)
    steps = [gpu_utils.CudaGraph(lambda x: x + 1, warmup=3) for _ in range(2)]
    for step in steps:
        for _ in range(3):
            torch.testing.assert_close(step(torch.ones(2)), torch.full((2,), 2.0))
    assert len(made) == 1


def test_a_failed_capture_says_so_once_and_runs_the_step_eagerly(monkeypatch, capsys):
    for name in ("Stream", "CUDAGraph", "stream", "current_stream", "graph"):
        monkeypatch.setattr(torch.cuda, name, getattr(FailingCapture, name))
    monkeypatch.setattr(gpu_utils.CudaGraph, "warmup_stream", None)  # the stand-in's, not kept past this test
    model, losses, step = train("cpu", enabled=True, steps=6)
    out = capsys.readouterr().out
    assert out.count("CUDA graph capture failed") == 1
    assert (
        "update: eager (CUDA graph capture failed: RuntimeError: operation not permitted when stream is capturing)"
        in out
    )
    assert step.graph is None and not step.enabled and step.failure.startswith("RuntimeError: operation not")
    # every one of the 6 steps ran for real (2 warm-up calls, the failed capture's call, 3 eager ones): the same
    # weights and losses as a loop that never tried a graph
    eager_model, eager_losses, _ = train("cpu", enabled=False, steps=6)
    assert torch.equal(losses, eager_losses)
    for a, b in zip(model.parameters(), eager_model.parameters()):
        assert torch.equal(a, b)


class RecordingCapture(FailingCapture):
    """Stand-ins that let the capture run its function eagerly on the CPU (CUDA would only record its kernels) and
    call ``on_capture`` first, with ``capturing`` true meanwhile, as torch.cuda.is_current_stream_capturing is."""

    on_capture = None
    capturing = False

    class CUDAGraph:
        def replay(self):
            pass

    @staticmethod
    @contextlib.contextmanager
    def graph(graph):
        RecordingCapture.on_capture()
        RecordingCapture.capturing = True
        try:
            yield
        finally:
            RecordingCapture.capturing = False

    @staticmethod
    def is_current_stream_capturing():
        return RecordingCapture.capturing


def test_an_out_of_memory_back_off_during_the_warm_up_leaves_adams_state_made_eagerly(monkeypatch):
    """Three halvings on the first minibatch of a fresh run: before, each failed attempt used up a warm-up call, no
    eager step completed before the capture, and the graph recorded Adam's lazy creation of its state (every replay
    would have zeroed its moments and step count)."""
    for name in ("Stream", "CUDAGraph", "stream", "current_stream", "graph", "is_current_stream_capturing"):
        monkeypatch.setattr(torch.cuda, name, getattr(RecordingCapture, name))
    monkeypatch.setattr(gpu_utils.CudaGraph, "warmup_stream", None)
    model, optimizer, _ = make_step("cpu", capturable=False)
    params = list(model.parameters())
    attempts = []

    def loss_of(x, y):
        attempts.append(len(x))
        if len(x) > 2:  # the device holds 2 rows at most
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return ((model(x) - y) ** 2).mean()

    states_at_capture = []
    RecordingCapture.on_capture = lambda: states_at_capture.append(len(optimizer.state))
    data_x = torch.randn(16, 8)
    data_y = data_x.sum(-1, keepdim=True)

    def backward(rows, weight):
        (loss_of(*rows) * weight).backward()
        return {}

    micro = gpu_utils.MicroBatches(backward, "auto", 16, params)

    def update(rows):  # as the scripts compose it: the back-off inside the step, before the optimizer's
        optimizer.zero_grad(set_to_none=True)
        micro((data_x[rows], data_y[rows]))
        optimizer.step()
        return torch.zeros(())

    step = gpu_utils.CudaGraph(update, warmup=3, name="update")
    for _ in range(5):
        step(torch.arange(16))
    assert micro.rows == 2 and states_at_capture == [len(params)], (micro.rows, states_at_capture)


def test_a_warm_up_call_that_raised_is_not_counted(monkeypatch):
    """Only a warm-up call that returned counts: an error in one (an out-of-memory error outside a back-off, say)
    leaves the step's state as it was, and the capture must come after ``warmup`` steps that ran."""
    for name in ("Stream", "CUDAGraph", "stream", "current_stream", "graph", "is_current_stream_capturing"):
        monkeypatch.setattr(torch.cuda, name, getattr(RecordingCapture, name))
    monkeypatch.setattr(gpu_utils.CudaGraph, "warmup_stream", None)
    ran = []
    RecordingCapture.on_capture = lambda: ran.append("capture")

    def fn(x):
        if len(ran) < 2:
            ran.append("raised")
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        ran.append("ran")
        return x + 1

    step = gpu_utils.CudaGraph(fn, warmup=2)
    for _ in range(5):
        with contextlib.suppress(torch.cuda.OutOfMemoryError):
            step(torch.ones(2))
    assert ran[:5] == ["raised", "raised", "ran", "ran", "capture"], ran


def test_an_out_of_memory_error_while_a_graph_captures_is_not_retried_there(monkeypatch):
    """A capture records kernels without running them: an out-of-memory error in it fails the capture (the step then
    runs eagerly, where the back-off halves it), never a halving and an empty_cache() in the middle of the capture."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))

    def backward(rows, weight):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    micro = gpu_utils.MicroBatches(backward, "auto", 8, [])
    with pytest.raises(torch.cuda.OutOfMemoryError):
        micro((torch.arange(8),))
    assert micro.rows == 8 and emptied == []
