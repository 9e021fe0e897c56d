"""Cached virtual environments with one TensorFlow release each, for the compatibility tests.

They live under `.cache/venvs/` in the repository (gitignored) and are built once: Python 3.11
(TensorFlow 2.15 supports 3.9-3.11) and `tensorflow-cpu` from the package index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

CACHE = REPO / ".cache" / "venvs"


def python311() -> str:
    """A Python 3.11 interpreter (this one's base if it is 3.11), or the test is skipped."""
    candidates = [
        Path(sys.base_prefix) / "bin" / "python3.11",
        shutil.which("python3.11"),
        "/root/.pyenv/shims/python3.11",
    ]
    for candidate in candidates:
        if candidate and os.path.exists(candidate):
            return str(candidate)
    pytest.skip("needs python3.11 on PATH: TensorFlow 2.15 supports Python 3.9-3.11")


def tf_venv(version: str) -> Path:
    """The venv with `tensorflow-cpu==version` ("latest": the newest release); its python."""
    root = CACHE / f"tf-{version}"
    python = root / "bin" / "python"
    if python.exists() and _imports_tensorflow(python):
        return python
    shutil.rmtree(root, ignore_errors=True)
    new_venv(root)
    spec = "tensorflow-cpu" if version == "latest" else f"tensorflow-cpu=={version}"
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", spec], capture_output=True, text=True
    )
    assert result.returncode == 0, f"pip install {spec} failed:\n{result.stderr[-3000:]}"
    return python


def new_venv(root: Path) -> Path:
    """A Python 3.11 venv at `root` with pip upgraded, as the Makefile does for `.venv`: the pip
    that Python 3.11 bundles checks certificates against certifi only, so behind a proxy with
    its own certificate authority every index but the local ones fails; newer pip uses the
    system's trust store. Returns its python."""
    subprocess.run([python311(), "-m", "venv", str(root)], check=True)
    python = root / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    return python


def _imports_tensorflow(python: Path) -> bool:
    return (
        subprocess.run([str(python), "-c", "import tensorflow"], capture_output=True).returncode
        == 0
    )


def tf_version(python: Path) -> str:
    return (
        subprocess.run(
            [str(python), "-c", "import tensorflow as tf; print(tf.__version__)"],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .split()[-1]
    )
