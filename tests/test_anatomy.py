"""The three scripts share one anatomy (docs/anatomy.md): learn one file and you know all three.

Static checks on the source: the same sections in the same order, the shared Args fields first in one order with a
docstring on every field, the same runtime flags, the same helpers, log keys, messages and checkpoint keys, no
`# fmt: skip` packing, and a ceiling on the training loop.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ["ppo_atari.py", "ppo_continuous.py", "dqn_snake_vec.py"]
SHARED_FIELDS = ["exp_name", "seed", "torch_deterministic", "gpu", "cuda_offset", "session", "tf32", "num_threads"]
SHARED_FIELDS += ["track", "wandb_project_name", "wandb_entity", "capture_video", "progress_bar", "checkpoint_every"]
SHARED_FIELDS += ["resume", "save_model", "eval_checkpoint", "eval_episodes", "compile", "cudagraphs", "amp"]
SHARED_FIELDS += ["micro_batch"]
# what --resume takes from the command line in every script (how and where to run, not what to learn)
SHARED_RUNTIME = set(SHARED_FIELDS) - {"exp_name", "seed", "torch_deterministic"}
SECTIONS = ["environment", "network", "algorithm", "checkpoint and evaluation"]
MAIN_SECTIONS = ["arguments and their checks", "device, threads, seeds", "logging", "env and network", "storage"]
MAIN_SECTIONS += ["training loop", "logging", "end of the run"]
HELPERS = ["layer_init", "load_weights", "save_checkpoint", "weights_finite", "mark_diverged"]
HELPERS += ["load_checkpoint", "evaluate"]
LOG_KEYS = ["charts/episodic_return", "charts/SPS", "charts/learning_rate", "memory/estimated_mib"]
LOG_KEYS += ["memory/peak_allocated_mib", "memory/micro_batch", "threads/torch"]
MESSAGES = [
    "device: ",
    "threads: ",
    "config:",
    "compile: the action step and the loss, mode ",
    "resumed ",
    "stopping on ",
]
MESSAGES += ["continue with: python {sys.argv[0]} --resume runs/{run_name}/checkpoint.pt", "model saved to "]
MESSAGES += ["peak allocated ", "(allocator, no CUDA context)", "done: step ", "run dir runs/{run_name}"]
MESSAGES += ["micro-batch: CUDA out of memory at ", 'amp_note = gpu_utils.bf16_note(device) if args.amp else ""']
MESSAGES += ["error: the update diverged by step ", "keeps the last finite ones", "no checkpoint had been written yet"]
MESSAGES += ["nothing to do: {args.resume} is a finished run (step ", "or start a new run to train longer"]
# The training loop (rollout, advantages or targets, update, logging, checkpoint) is what a reader must hold in mind
# at once: CleanRL's ppo_atari.py loop is about 100 lines. Ours carry resume, stop signals, OOM back-off, torchrun
# and the CUDA-graph update too; the ceiling keeps headroom so that no one packs lines to fit under it.
LOOP_CEILING = 160


def source(script: str) -> str:
    return (ROOT / script).read_text()


def args_fields(tree: ast.Module) -> list[tuple[str, bool]]:
    """(name, has a docstring) of each Args field, in order."""
    (args,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Args"]
    fields = []
    for node, after in zip(args.body, args.body[1:] + [None]):
        if isinstance(node, ast.AnnAssign):
            documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            fields.append((node.target.id, documented and isinstance(after.value.value, str)))
    return fields


@pytest.mark.parametrize("script", SCRIPTS)
def test_header_sections_and_one_main_block(script):
    text = source(script)
    first, second = text.splitlines()[:2]
    assert first.startswith("# ") and second.startswith("# Usage: python "), "a two-line header: what, then how"
    top = re.findall(r"^# -{10,} (.+)$", text, flags=re.M)
    assert top == SECTIONS
    assert text.count('\nif __name__ == "__main__":\n') == 1
    main = text.split('\nif __name__ == "__main__":\n')[1]
    inner = [name.split(":")[0] for name in re.findall(r"^ {4,8}# -{10,} (.+)$", main, flags=re.M)]
    assert [name for name in inner if name in MAIN_SECTIONS] == MAIN_SECTIONS, inner
    tree = ast.parse(text)
    functions = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert "main" not in functions, "the run reads straight through in the module-level block"
    assert all(name in functions for name in HELPERS if not (name == "layer_init" and script == "dqn_snake_vec.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_shared_args_come_first_in_one_order_and_every_field_has_a_docstring(script):
    fields = args_fields(ast.parse(source(script)))
    assert [name for name, _ in fields[: len(SHARED_FIELDS)]] == SHARED_FIELDS
    assert [name for name, documented in fields if not documented] == []


@pytest.mark.parametrize("script", SCRIPTS)
def test_same_runtime_flags_log_keys_and_messages(script):
    text = source(script)
    tree = ast.parse(text)
    namespace = {}
    for node in tree.body:  # RUNTIME_FLAGS is built by plain set literals: evaluate just those statements
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id == "RUNTIME_FLAGS":
            exec(compile(ast.Module([node], []), script, "exec"), namespace)
    assert SHARED_RUNTIME <= namespace["RUNTIME_FLAGS"]
    arg_names = {name for name, _ in args_fields(tree)}
    assert namespace["RUNTIME_FLAGS"] <= arg_names, "a runtime flag that is not an Args field"
    # a key is written whole, or its chart name is (dqn_snake_vec builds "charts/<name>" from a table)
    assert [key for key in LOG_KEYS if f'"{key}"' not in text and f'"{key.split("/")[1]}"' not in text] == []
    assert [message for message in MESSAGES if message not in text] == []
    # each process names its machine, so a report can tell apart the parts of a run resumed elsewhere
    assert 'writer.add_text("device", gpu_utils.device_label(device), global_step)' in text
    for key in ["model", "optimizer", "args", "iteration", "global_step", "rng", "run_name", "status", "script"]:
        assert re.search(rf"\b{key}=", text), f"checkpoint key {key}"
    assert "wandb_id=" in text
    # the checkpoint names the script that wrote it, and a file of another script is refused by that name
    name = script[: -len(".py")]
    assert f'script="{name}"' in text
    assert f"not {name}.py; use a checkpoint {name}.py wrote" in text
    # hand-started runs share the CPUs; a tracked run closes its wandb run
    assert "gpu_utils.CpuShare(threads" in text and "cpu_share.update()" in text and "cpu_share.close()" in text
    assert "wandb.finish(exit_code=int(diverged))" in text  # a diverged run shows as failed in W&B


@pytest.mark.parametrize("script", SCRIPTS)
def test_formatted_without_packing_and_a_loop_that_fits(script):
    text = source(script)
    assert "fmt: skip" not in text and "fmt: off" not in text, "ruff format the script instead of packing lines"
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^ {4}# -{10,} training loop", line))
    end = next(i for i, line in enumerate(lines) if re.match(r"^ {4}# -{10,} end of the run", line))
    assert end - start <= LOOP_CEILING, f"{script}'s training loop has {end - start} lines, over {LOOP_CEILING}"


def test_one_video_recorder_shape_and_enum_like_flags_typed_as_literal():
    def recorder(script):
        tree = ast.parse(source(script))
        (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "VideoRecorder"]
        return ast.unparse(node)

    # Atari and Snake write videos with the same class (copied: each script stands alone), fed (frame, game_over)
    assert recorder("ppo_atari.py") == recorder("dqn_snake_vec.py")
    # a flag with a fixed set of choices is a Literal, so that tyro lists them in --help and refuses anything else
    annotations = [node for node in ast.walk(ast.parse(source("dqn_snake_vec.py"))) if isinstance(node, ast.AnnAssign)]
    snake_fields = {node.target.id: ast.unparse(node.annotation) for node in annotations}
    assert snake_fields["env_mode"].startswith("Literal[") and snake_fields["buffer_device"].startswith("Literal[")
