"""The three scripts share one anatomy (docs/anatomy.md): learn one file and you know all three.

Static checks on the source: a two-line header, the module-level sections in order, CleanRL's skeleton in view in
each main block (the arguments, the rollout's loop over steps, the backward pass, the clipping, the optimizer's step,
the checkpoint, the end), the shared Args fields first in one order with a docstring on every field, the same runtime
flags, log keys, messages and checkpoint keys, no `# fmt: skip` packing, and a ceiling on the training loop. What the
runs do (stop, resume, evaluate, errors) is tested by running them: tests/test_contract.py.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ["ppo_atari.py", "ppo_continuous.py", "dqn_snake_vec.py"]
OWN_FIELDS = ["exp_name", "seed", "torch_deterministic"]  # what the run is: each script's own, first in its Args
# how and where to run: run_utils.RunArgs, which every Args subclasses; --resume takes these from the command line
RUN_FIELDS = ["gpu", "cuda_offset", "session", "tf32", "num_threads", "track", "wandb_project_name", "wandb_entity"]
RUN_FIELDS += ["capture_video", "progress_bar", "checkpoint_every", "resume", "save_model", "eval_checkpoint"]
RUN_FIELDS += ["eval_episodes", "compile", "cudagraphs", "amp", "micro_batch"]
SECTIONS = ["environment", "network", "algorithm"]  # each script's module level, in this order
HELPERS = ["validate", "evaluate"]  # each script's own
# CleanRL's skeleton, in this order in every main block: the arguments, the iterations, the loss's backward pass,
# the clipping, the optimizer's step, the checkpoint, the end
SKELETON = ["tyro.cli(Args)", ".backward()", "nn.utils.clip_grad_norm_(", "optimizer.step()"]
SKELETON += ["run_utils.save_checkpoint(", "run_utils.end_run("]
# the messages and log keys a reader expects, in the script or in the shared modules it calls
LOG_KEYS = ["charts/episodic_return", "charts/SPS", "charts/learning_rate", "memory/estimated_mib"]
LOG_KEYS += ["memory/peak_allocated_mib", "memory/micro_batch", "threads/torch"]
MESSAGES = ["device: ", "threads: ", "stopping on ", "; continue with: ", "model saved to ", "peak allocated "]
MESSAGES += ["(allocator, no CUDA context)", "done: step ", "run dir ", "micro-batch: CUDA out of memory at "]
MESSAGES += ["error: the update diverged by step ", "keeps the last finite ones", "no checkpoint had been written yet"]
MESSAGES += ["nothing to do: {path} is a finished run (step ", "or start a new run to train longer"]
SHARED = (ROOT / "run_utils.py").read_text() + (ROOT / "gpu_utils.py").read_text()
# The training loop (rollout, advantages or targets, update, logging, checkpoint) is what a reader must hold in mind
# at once: CleanRL's ppo_atari.py loop is about 100 lines. Ours carry resume, stop signals, OOM back-off, torchrun
# and the two halves of envs too; the ceiling keeps headroom so that no one packs lines to fit under it.
LOOP_CEILING = 160


def source(script: str) -> str:
    return (ROOT / script).read_text()


def class_fields(tree: ast.Module, name: str) -> list[tuple[str, bool]]:
    """(name, has a docstring) of each field of the class ``name``, in order."""
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
    fields = []
    for node, after in zip(cls.body, cls.body[1:] + [None]):
        if isinstance(node, ast.AnnAssign):
            documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            fields.append((node.target.id, documented and isinstance(after.value.value, str)))
    return fields


def args_fields(tree: ast.Module) -> list[tuple[str, bool]]:
    """(name, has a docstring) of each Args field: run_utils.RunArgs' first, then the script's own, in order."""
    return class_fields(ast.parse(source("run_utils.py")), "RunArgs") + class_fields(tree, "Args")


@pytest.mark.parametrize("script", SCRIPTS)
def test_header_sections_and_the_training_loop_in_the_main_block(script):
    text = source(script)
    first, second = text.splitlines()[:2]
    assert first.startswith("# ") and second.startswith("# Usage: python "), "a two-line header: what, then how"
    top = [name.split(":")[0] for name in re.findall(r"^# -{10,} (.+)$", text, flags=re.M)]
    assert [name for name in top if name in SECTIONS] == SECTIONS, top
    assert text.count('\nif __name__ == "__main__":\n') == 1
    main = text.split('\nif __name__ == "__main__":\n')[1]
    positions = [main.find(word) for word in SKELETON]
    assert -1 not in positions, [word for word, at in zip(SKELETON, positions) if at == -1]
    assert positions == sorted(positions), "CleanRL's order: arguments, backward, clipping, step, checkpoint, end"
    if script.startswith("ppo_"):  # the rollout is a loop over steps in view
        assert "for step in range(args.num_steps):" in main
    tree = ast.parse(text)
    functions = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert "main" not in functions, "the run reads straight through in the module-level block"
    assert all(name in functions for name in HELPERS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_shared_args_come_first_in_one_order_and_every_field_has_a_docstring(script):
    tree = ast.parse(source(script))
    (args,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Args"]
    assert [ast.unparse(base) for base in args.bases] == ["run_utils.RunArgs"], "the run's flags are written once"
    assert [name for name, _ in class_fields(ast.parse(source("run_utils.py")), "RunArgs")] == RUN_FIELDS
    own = [name for name, _ in class_fields(tree, "Args") if name not in RUN_FIELDS]  # a run flag's default may differ
    assert own[: len(OWN_FIELDS)] == OWN_FIELDS
    assert [name for name, documented in args_fields(tree) if not documented] == []


@pytest.mark.parametrize("script", SCRIPTS)
def test_same_runtime_flags_lifecycle_calls_log_keys_and_messages(script):
    text = source(script)
    tree = ast.parse(text)
    namespace = {"run_utils": __import__("run_utils")}
    for node in tree.body:  # RUNTIME_FLAGS is built by plain set literals: evaluate just those statements
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id == "RUNTIME_FLAGS":
            exec(compile(ast.Module([node], []), script, "exec"), namespace)
    assert set(RUN_FIELDS) <= namespace["RUNTIME_FLAGS"]
    arg_names = {name for name, _ in args_fields(tree)}
    assert namespace["RUNTIME_FLAGS"] <= arg_names, "a runtime flag that is not an Args field"
    main = text.split('\nif __name__ == "__main__":\n')[1]
    # a key or message is written whole in the script or the shared modules (Snake builds "charts/<name>")
    both = text + SHARED
    assert [key for key in LOG_KEYS if f'"{key}"' not in both and f'"{key.split("/")[1]}"' not in both] == []
    assert [message for message in MESSAGES if message not in both] == []
    # the checkpoint holds what --resume needs; save_checkpoint adds the run's name and W&B id
    for key in ["script", "args", "status", "model", "optimizer", "iteration", "global_step", "rng"]:
        assert re.search(rf"\b{key}=|\"{key}\": ", main), f"checkpoint key {key}"  # a keyword or in `states`
    # the files it writes name the script, and a file of another script is refused by that name
    name = script[: -len(".py")]
    assert f'script="{name}"' in main
    assert f'run_utils.resume(args, "{name}", RUNTIME_FLAGS)' in main
    assert f'run_utils.load_checkpoint(args.eval_checkpoint, "{name}")' in text
    # no script keeps its own copy of what run_utils holds
    tree_names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    copies = {"save_checkpoint", "mark_diverged", "weights_finite", "load_weights", "VideoRecorder"} & tree_names
    assert copies == set()


@pytest.mark.parametrize("script", SCRIPTS)
def test_formatted_without_packing_and_a_loop_that_fits(script):
    text = source(script)
    assert "fmt: skip" not in text and "fmt: off" not in text, "ruff format the script instead of packing lines"
    lines = text.splitlines()
    main = lines.index('if __name__ == "__main__":')
    start = next(i for i in range(main, len(lines)) if re.match(r"^ {4}(for iteration in|while iteration)", lines[i]))
    end = next(i for i, line in enumerate(lines) if re.match(r"^ {4}# -{10,} end of the run", line))
    assert end - start <= LOOP_CEILING, f"{script}'s training loop has {end - start} lines, over {LOOP_CEILING}"


def test_videos_are_written_by_one_recorder_and_enum_like_flags_are_literals():
    # Atari and Snake write videos with the same class, fed (frame, game_over)
    for script in ("ppo_atari.py", "dqn_snake_vec.py"):
        assert "run_utils.VideoRecorder(" in source(script)
    # a flag with a fixed set of choices is a Literal, so that tyro lists them in --help and refuses anything else
    annotations = [node for node in ast.walk(ast.parse(source("dqn_snake_vec.py"))) if isinstance(node, ast.AnnAssign)]
    snake_fields = {node.target.id: ast.unparse(node.annotation) for node in annotations}
    assert snake_fields["env_mode"].startswith("Literal[") and snake_fields["buffer_device"].startswith("Literal[")


def test_every_module_a_script_imports_from_this_repository_is_installed():
    # a script copied to any folder still runs: `pip install -e .` installs each module of ours that it imports
    pyproject = (ROOT / "pyproject.toml").read_text()
    installed = set(re.findall(r'"(\w+)"', re.search(r"^py-modules = \[(.*)\]$", pyproject, flags=re.M).group(1)))
    for script in SCRIPTS:
        tree = ast.parse(source(script))
        imported = {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.level == 0}
        ours = {name for name in imported if (ROOT / f"{name}.py").is_file()}
        assert ours - installed == set(), f"{script} imports {sorted(ours - installed)}: add it to py-modules"


def printable(text: str, templates: list[list[str]]) -> bool:
    """Whether ``text`` can be part of a line that one of ``templates`` prints, at least half of it from the template's
    own words: each template is the literal parts of a printed string, a value of any length between each two."""
    for parts in templates:
        for i, first in enumerate(parts):
            if text in first:
                return True
            for j in range(i + 1, len(parts)):
                suffixes = "|".join(re.escape(first[k:]) for k in range(len(first) + 1))  # the longest first
                prefixes = "|".join(re.escape(parts[j][:k]) for k in range(len(parts[j]), -1, -1))
                middle = "".join(f"(.*?){re.escape(part)}" for part in parts[i + 1 : j])  # the shortest values first
                match = re.fullmatch(f"(?:{suffixes}){middle}(.*?)(?:{prefixes})", text, flags=re.S)
                if match and sum(map(len, match.groups())) <= len(text) / 2:
                    return True
    return False


def test_every_line_a_gpu_test_waits_for_is_one_the_code_prints():
    """The GPU tests run only on a lent GPU: a line they wait for that no code prints any more fails there, a lease
    later (one waited for the compile line that #52 removed). Each literal they look for in a run's output must fit
    a string that the scripts or the shared modules print."""
    templates = []
    for path in ROOT.glob("*.py"):
        for call in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "print"):
                continue
            for node in ast.walk(call):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    templates.append([node.value])
                elif isinstance(node, ast.JoinedStr):
                    parts = [[]]
                    for value in node.values:
                        if isinstance(value, ast.Constant):
                            parts[-1].append(value.value)
                        else:
                            parts.append([])
                    templates.append(["".join(part) for part in parts])
    tree = ast.parse((ROOT / "tests" / "test_gpu_scripts.py").read_text())
    waited = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and getattr(node.comparators[0], "id", "") == "out":
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                waited.append(node.left.value)
            elif isinstance(node.left, ast.JoinedStr):  # f"device: cuda:{gpu}": each literal part
                waited += [v.value for v in node.left.values if isinstance(v, ast.Constant)]
    resumes = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "RESUMES")
    waited += [ast.literal_eval(case.elts[2]) for case in resumes.value.values]
    assert len(waited) > 10
    missing = [text for text in waited if not printable(text, templates)]
    assert missing == [], missing


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_function_of_the_main_block_reads_a_name_it_defines_later(script):
    """A reader meets every name a function of the main block reads before the function: its inputs are its
    arguments or what the lines above made (ppo_atari's receive read three names made 46 to 53 lines below it)."""
    tree = ast.parse(source(script))
    (main,) = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    first_made = {}  # name -> the line the main block first binds it on
    for node in ast.walk(main):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            first_made[node.id] = min(node.lineno, first_made.get(node.id, node.lineno))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first_made[node.name] = min(node.lineno, first_made.get(node.name, node.lineno))
    functions = [node for node in ast.walk(main) if isinstance(node, ast.FunctionDef)]
    assert len(functions) >= 3
    late = []
    for function in functions:
        own = {arg.arg for arg in ast.walk(function.args) if isinstance(arg, ast.arg)}
        own |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in own:
                if first_made.get(node.id, 0) > function.lineno:
                    late.append(f"{function.name} reads {node.id}, made on line {first_made[node.id]}")
    assert late == []
