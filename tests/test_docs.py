"""The README and docs/ stay usable: every relative link points at a file (and heading) that exists, the README
stays short, and it keeps the two commands verbatim (.ci/run reads the test command from it)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

TRAIN_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -e . && "
    ".venv/bin/python ppo_atari.py --env-id ALE/Breakout-v5 --gae-lambda 0.7"
)
TEST_COMMAND = (
    'python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e ".[test]" && '
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
