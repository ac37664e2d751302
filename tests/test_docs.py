"""The README and docs/ stay usable: every relative link points at a file (and heading) that exists, every command
that runs one of the three scripts uses flags the script has, the README stays short, and it keeps the two commands
verbatim (.ci/run reads the test command from it), each script's page explains every TensorBoard key the script
logs and no other, and docs/anatomy.md lists the shared flags as --help does."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

TRAIN_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -e . && "
    ".venv/bin/python ppo_atari.py --env-id ALE/Breakout-v5 --gae-lambda 0.7"
)
TEST_COMMAND = (
    'python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e ".[test,mjx]" && '
    ".venv/bin/python -m pytest -q -n auto"
)

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")  # [text](target), not images
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def links(text: str) -> list[str]:
    """The link targets of a markdown page, outside code blocks and code spans."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return LINK.findall(prose)


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for line in FENCE.sub("", text).splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match:
            title = match.group(1).strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not ours to check
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved.read_text()):
            broken.append(f"{target} (no heading #{anchor} in {resolved.name})")
    return broken


def test_every_relative_link_points_at_something_that_exists():
    assert (ROOT / "docs").is_dir()
    broken = {str(page.relative_to(ROOT)): broken_links(page) for page in PAGES}
    assert {page: bad for page, bad in broken.items() if bad} == {}


def test_the_link_check_catches_a_missing_file_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Some Title (with `code`)\n")
    page.write_text(
        "[ok](other.md#some-title-with-code) [gone](missing.md) [bad](other.md#nope) "
        "`[span](missing.md)` [web](https://example.com)\n```\n[fenced](missing.md)\n```\n"
    )
    assert broken_links(page) == ["missing.md (no such file)", "other.md#nope (no heading #nope in other.md)"]


def test_readme_is_short_and_keeps_both_commands_verbatim():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines; move detail to docs/"
    assert TRAIN_COMMAND in lines
    marker = lines.index("<!-- test-command -->")
    assert lines[marker + 1] == "```bash"
    assert lines[marker + 2] == TEST_COMMAND


def test_ci_reads_the_test_command_from_the_readme():
    """.ci/run's own awk line, run on the README, gives the test command."""
    ci = (ROOT / ".ci" / "run").read_text()
    awk = re.search(r"cmd=\$\(awk '([^']*)' README.md\)", ci)
    assert awk, ".ci/run no longer reads its command with awk from README.md; update this test"
    res = subprocess.run(["awk", awk.group(1), "README.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert res.stdout.strip() == TEST_COMMAND


SCRIPTS = ["ppo_atari.py", "ppo_continuous.py", "dqn_snake_vec.py"]
# a script's name (not bench_ppo_atari.py or the like), then the words after it up to a table cell's end, a code
# span's end or a shell operator
CALL = re.compile(r"(?<![\w.-])((?:ppo_atari|ppo_continuous|dqn_snake_vec)\.py)((?:[ \t]+[^\s`|;&)]+)*)")


def script_flags(script: str) -> set[str]:
    """The flags tyro makes of the script's Args fields: --field-name, and --no-field-name for a bool."""
    tree = ast.parse((ROOT / script).read_text())
    (args,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Args"]
    body = args.body
    if "run_utils.RunArgs" in [ast.unparse(base) for base in args.bases]:  # the run's flags, shared by every script
        shared = ast.parse((ROOT / "run_utils.py").read_text())
        (run_args,) = [node for node in shared.body if isinstance(node, ast.ClassDef) and node.name == "RunArgs"]
        body = run_args.body + body
    flags = {"--help"}
    for node in body:
        if isinstance(node, ast.AnnAssign):
            name = node.target.id.replace("_", "-")
            flags.add(f"--{name}")
            if ast.unparse(node.annotation) == "bool":
                flags.add(f"--no-{name}")
    return flags


def unknown_flags(text: str, flags: dict[str, set[str]]) -> list[str]:
    """`script --flag` of every call in a page whose flag the script does not have. A wrapper's own flags come
    before a bare `--` (speed.py run ppo_atari.py --steps N -- --env-id ...): only the words after it count then."""
    text = text.replace("\\\n", " ")  # a shell line continued with a backslash
    unknown = []
    for line in text.splitlines():
        for script, rest in CALL.findall(line.split(" # ")[0]):
            words = rest.split()
            words = words[words.index("--") + 1 :] if "--" in words else words
            # --flag, --flag=value, or a flag that ends a clause in prose or a table cell ("--cudagraphs, 4,096 games")
            named = [word.split("=")[0].rstrip(",.:") for word in words if word.startswith("--")]
            unknown += [f"{script} {flag}" for flag in named if flag not in flags[script]]
    return unknown


def test_every_documented_call_of_a_script_uses_flags_it_has():
    flags = {script: script_flags(script) for script in SCRIPTS}
    # a results folder records the commands of its day (benchmark/results/*/): a flag removed since (--async-envs)
    # stays in the record; the pages and the benchmark scripts must use today's flags
    tools = [page for page in (ROOT / "benchmark").rglob("*.md") if "results" not in page.relative_to(ROOT).parts]
    pages = PAGES + sorted(tools) + sorted((ROOT / "benchmark").glob("*.sh"))
    calls = sum(len(CALL.findall(page.read_text())) for page in pages)
    assert calls > 50  # the pattern still finds the calls
    unknown = {str(page.relative_to(ROOT)): unknown_flags(page.read_text(), flags) for page in pages}
    assert {page: bad for page, bad in unknown.items() if bad} == {}


def test_the_flag_check_catches_a_renamed_flag():
    flags = {script: script_flags(script) for script in SCRIPTS}
    assert {"--gae-lambda", "--no-anneal-lr", "--compile"} <= flags["ppo_atari.py"]
    text = (
        "python ppo_atari.py --env-id ALE/Pong-v5 --gae-lamda 0.85   # --not-checked in a comment\n"
        "| `ppo_continuous.py --preset beast` | --not-a-call |\n"
        "python benchmark/bench_ppo_atari.py --iterations 5\n"
        "python benchmark/speed.py run dqn_snake_vec.py --steps 4096 -- --num-env 256 \\\n    --height 8\n"
        "torchrun --nproc-per-node 2 ppo_atari.py --no-overlap-envs --overlap --seed=3 --sed=3\n"
    )
    assert unknown_flags(text, flags) == [
        "ppo_atari.py --gae-lamda",
        "dqn_snake_vec.py --num-env",
        "ppo_atari.py --overlap",
        "ppo_atari.py --sed",
    ]


METRIC = re.compile(r"\b(?:charts|losses|memory|gpu|threads)/\w+")
LOSS_FUNCTION = {"ppo_atari.py": "ppo_loss", "ppo_continuous.py": "ppo_loss", "dqn_snake_vec.py": "td_loss"}


def logged_keys(script: str) -> set[str]:
    """The TensorBoard keys a script writes that its source names: whole keys in the script and the shared modules,
    and losses/<name> for each statistic its loss returns by name, less those the main block deletes
    (del stats["x"]), plus those it adds (stats["x"] = ...)."""
    text = (ROOT / script).read_text()
    shared = (ROOT / "run_utils.py").read_text() + (ROOT / "gpu_utils.py").read_text()
    tree = ast.parse(text)
    (loss,) = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == LOSS_FUNCTION[script]]
    names = {key.value for node in ast.walk(loss) if isinstance(node, ast.Dict) for key in node.keys if key}
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, (ast.Delete, ast.Assign)) else []
        named = {
            t.slice.value
            for t in targets
            if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == "stats"
        }
        names = names - named if isinstance(node, ast.Delete) else names | named
    return set(METRIC.findall(text + shared)) | {f"losses/{name}" for name in names}


def metrics_section(page: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    assert "\n## Logged metrics\n" in text, f"docs/{page} has no '## Logged metrics' section"
    return text.split("\n## Logged metrics\n")[1].split("\n## ")[0]


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_page_explains_every_key_it_logs_and_no_other(script):
    keys = logged_keys(script)
    assert {"charts/SPS", "losses/initial_ratio_error" if "ppo" in script else "losses/td_loss"} <= keys
    section = metrics_section(script.replace(".py", ".md"))
    assert sorted(key for key in keys if f"`{key}`" not in section) == [], "keys the page does not explain"
    source = (ROOT / script).read_text()
    documented = set(METRIC.findall(section))
    # a key the script builds from a name (Snake's f"charts/{chart}") is in its source as that quoted name
    unknown = [key for key in documented if key not in keys and f'"{key.split("/")[1]}"' not in source]
    assert sorted(unknown) == [], "keys the page explains that the script does not log"


def run_args_flags() -> list[str]:
    """run_utils.RunArgs' flags in the order --help lists them."""
    tree = ast.parse((ROOT / "run_utils.py").read_text())
    (run_args,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "RunArgs"]
    return [f"--{node.target.id.replace('_', '-')}" for node in run_args.body if isinstance(node, ast.AnnAssign)]


def test_anatomy_lists_the_shared_flags_as_help_does():
    """docs/anatomy.md names the shared flags (run_utils.RunArgs) in --help's order, all of them and no other."""
    text = " ".join((ROOT / "docs" / "anatomy.md").read_text().split())
    listed = text.split("in the same order and wording:")[1].split("; then each script's own")[0]
    assert re.findall(r"`(--[\w-]+)`", listed) == run_args_flags()


def run_worked_example(
    tmp_path, heading: str, script: str, args: list[str], hunks: int = 2, prefix: tuple = ()
) -> subprocess.CompletedProcess:
    """``script`` with the diff under ``heading`` in docs/anatomy.md applied (by git apply), run from ``tmp_path``
    with this checkout's modules (``prefix``: interpreter arguments before the script)."""
    section = (ROOT / "docs" / "anatomy.md").read_text().split(f"## {heading}", 1)[1]
    diff = section.split("```diff\n", 1)[1].split("```", 1)[0]
    assert 1 <= diff.count("@@ -") <= hunks, f"the worked example is at most {hunks} hunks"
    (tmp_path / script).write_text((ROOT / script).read_text())
    (tmp_path / "example.diff").write_text(f"--- a/{script}\n+++ b/{script}\n{diff}")
    subprocess.run(["git", "apply", "example.diff"], cwd=tmp_path, check=True, capture_output=True)
    env = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, *prefix, script, "--no-progress-bar", "--gpu", "false", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


def test_the_kl_penalty_example_applies_and_runs(tmp_path):
    args = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1"]
    args += ["--total-timesteps", "64", "--kl-coef", "0.5"]
    res = run_worked_example(tmp_path, "Changing the algorithm: a KL penalty", "ppo_atari.py", args)
    assert res.returncode == 0 and "warning" not in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    assert "kl_coef                    0.5" in res.stdout  # the config lists it, from the command line


def test_the_state_dependent_log_std_example_applies_and_keeps_the_rollout_and_the_loss_together(tmp_path):
    """Two hunks in Agent: the rollout, the loss and the evaluation take it from Agent.policy, so the first
    minibatches' ratios stay 1 up to rounding (before #59, 5 hunks, and an edit of the network and loss alone
    sampled the rollout from the old log-std without a word)."""
    from helpers import scalars

    args = ["--env-id", "Pendulum-v1", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "1"]
    heading = "Changing the network: a state-dependent log-std"
    res = run_worked_example(tmp_path, heading, "ppo_continuous.py", [*args, "--total-timesteps", "256"])
    assert res.returncode == 0 and "warning" not in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    errors = [value for _, value in scalars(run_dir)["losses/initial_ratio_error"]]
    assert len(errors) == 4 and max(errors) < 1e-6, errors


def test_the_critic_optimizer_example_applies_and_its_state_survives_a_resume(tmp_path):
    """A separate critic optimizer in at most 4 hunks: the run saves and loads it with the other states (one list of
    them), so a resumed run continues its Adam state rather than restarting it (#63: save and load each listed the
    optimizer by hand, and a resume silently restarted the new one)."""
    import torch
    from helpers import SIGNAL_IN_SETUP  # SIGTERM as the set-up ends: the run stops after its first iteration

    heading = "Changing the optimizer: a separate critic optimizer"
    args = ["--env-id", "Pendulum-v1", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2"]
    args += ["--total-timesteps", "256", "--checkpoint-every", "0", "--save-model"]
    stopped = run_worked_example(tmp_path, heading, "ppo_continuous.py", args, hunks=4, prefix=("-c", SIGNAL_IN_SETUP))
    assert stopped.returncode == 0 and "stopping on SIGTERM" in stopped.stdout, stopped.stdout[-2000:]
    (ckpt_path,) = (tmp_path / "runs").glob("*/checkpoint.pt")
    first = torch.load(ckpt_path, weights_only=True)
    critic_steps = {float(s["step"]) for s in first["critic_optimizer"]["state"].values()}
    assert critic_steps == {4.0}, critic_steps  # 2 epochs x 2 minibatches
    env = dict(os.environ, WANDB_MODE="offline", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "ppo_continuous.py", "--no-progress-bar", "--gpu", "false", "--resume", str(ckpt_path)]
    resumed = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0 and "warning" not in resumed.stdout, resumed.stdout[-2000:] + resumed.stderr
    last = torch.load(ckpt_path, weights_only=True)
    for key in ("optimizer", "critic_optimizer"):  # 4 iterations x 4 steps: each continued its own state
        assert {float(s["step"]) for s in last[key]["state"].values()} == {16.0}, key
    critic = [name for name in last["model"] if name.startswith("critic.")]
    assert len(last["critic_optimizer"]["state"]) == len(critic)
    assert len(last["optimizer"]["state"]) == len(last["model"]) - len(critic)
