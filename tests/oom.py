"""An out-of-memory GPU, simulated on any machine: `python -c INJECT <layer> <limit> <script> args...` runs the script
as __main__ with torch.nn.<layer>.forward raising torch.cuda.OutOfMemoryError on more than <limit> rows while
gradients are on (the update), never in the no-grad rollout."""

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
