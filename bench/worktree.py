"""A temporary checkout of another commit, for benchmarks that run an older trainer beside
this one in the same session."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def checkout(commit: str, prefix: str = "bench-worktree-") -> Iterator[str]:
    """A detached git worktree of `commit` (its path), removed afterwards."""
    path = tempfile.mkdtemp(prefix=prefix)
    git = ["git", "-C", ROOT, "worktree"]
    subprocess.run([*git, "add", "--detach", path, commit], check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run([*git, "remove", "--force", path], check=True, capture_output=True)
