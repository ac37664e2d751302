"""Helpers shared by the test files: a simulated out-of-memory GPU and waiting for a condition.

An out-of-memory GPU on any machine: `python -c INJECT <layer> <limit> <script> args...` runs the script as
__main__ with torch.nn.<layer>.forward raising torch.cuda.OutOfMemoryError on more than <limit> rows while gradients
are on (the update), never in the no-grad rollout."""

import time

INJECT = """
import runpy, sys, torch
layer = getattr(torch.nn, sys.argv.pop(1))
limit = int(sys.argv.pop(1))
forward = layer.forward
def limited(self, x):
    if torch.is_grad_enabled() and x.shape[0] > limit:
        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (injected above {limit} rows)")
    return forward(self, x)
layer.forward = limited
sys.argv[0] = sys.argv.pop(1)
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def oom_prefix(layer: str, limit: int) -> list[str]:
    """Interpreter arguments to put before the script's path."""
    return ["-c", INJECT, layer, str(limit)]


def wait_for(predicate, timeout, what):
    """Poll ``predicate`` every 0.1 s; an AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
