"""Every command the docs show runs as written, as far as it can here: for each `python -m
MODULE [COMMAND]` in a code block of README.md and docs/*.md, `--help` exits 0 and names every
flag the docs give it (a renamed or removed flag fails here, not in a user's shell)."""

from __future__ import annotations

import functools
import re
import subprocess
import sys

import pytest

from tests.support import REPO, task_env

PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
FENCED = re.compile(r"^```[a-z]*\n(.*?)^```", re.M | re.S)
COMMAND = re.compile(r"python -m ((?:trainer|deploy)\.\w+)((?: [a-z_]+)?)(.*)")
FLAG = re.compile(r"(?<!\S)--([a-z][a-z0-9_]*)")  # a flag of its own, not --x=--y's value
HELP_FLAG = re.compile(r"--([a-z][a-z0-9_]*)")
# Commands whose first word after the module is a command of their own.
SUBCOMMANDS = {"deploy.batch", "deploy.publish"}


def _documented() -> dict[tuple[str, str], set[str]]:
    """{(module, command or ""): the flags the docs give it}, from every page's code blocks,
    lines continued with a backslash joined; flags after ` -- ` are another program's."""
    found: dict[tuple[str, str], set[str]] = {}
    for page in PAGES:
        for block in FENCED.findall(page.read_text(encoding="utf-8")):
            for line in block.replace("\\\n", " ").splitlines():
                match = COMMAND.search(line.split("#", 1)[0])
                if not match:
                    continue
                module, command, rest = match.groups()
                command = command.strip() if module in SUBCOMMANDS else ""
                if module not in SUBCOMMANDS:
                    rest = match.group(2) + rest
                flags = FLAG.findall(rest.split(" -- ", 1)[0])
                found.setdefault((module, command), set()).update(flags)
    return found


DOCUMENTED = _documented()


@functools.cache
def _help(module: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *([command] if command else []), "--help"],
        cwd=REPO,
        env=task_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_docs_show_the_commands():
    modules = {module for module, _ in DOCUMENTED}
    assert {"trainer.task", "deploy.launch", "deploy.submit", "deploy.serve"} <= modules
    assert ("deploy.batch", "local") in DOCUMENTED and ("deploy.publish", "deploy") in DOCUMENTED


@pytest.mark.parametrize("command", sorted(DOCUMENTED), ids=lambda c: " ".join(filter(None, c)))
def test_each_documented_command_takes_its_documented_flags(command):
    result = _help(*command)
    assert result.returncode == 0, result.stderr[-2000:]
    shown = set(HELP_FLAG.findall(result.stdout))
    missing = sorted(DOCUMENTED[command] - shown - {"help"})
    assert not missing, f"python -m {' '.join(command)} has no flag {missing}"
