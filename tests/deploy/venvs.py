"""Cached virtual environments with one TensorFlow release each, for the compatibility tests.

They live under `.cache/venvs/` in the repository (gitignored) and are built once: Python 3.11
(TensorFlow 2.15 supports 3.9-3.11) and `tensorflow-cpu` from the package index.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

from deploy import local_run
from tests.gcs import outside_environment
from tests.support import REPO

CACHE = REPO / ".cache" / "venvs"


def python311() -> str:
    """A Python 3.11 interpreter (`deploy.local_run.find_python`'s), or the test is skipped."""
    try:
        return local_run.find_python("3.11")
    except local_run.LocalRunError:
        pytest.skip("needs python3.11 on PATH: TensorFlow 2.15 supports Python 3.9-3.11")


def tf_venv(version: str) -> Path:
    """The venv with `tensorflow-cpu==version` ("latest": the newest release); its python."""
    root = CACHE / f"tf-{version}"
    python = root / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    # pytest-xdist runs tests in several processes: one builds a venv while the others wait.
    with open(CACHE / f"tf-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and _imports_tensorflow(python):
            return python
        shutil.rmtree(root, ignore_errors=True)
        new_venv(root)
        spec = "tensorflow-cpu" if version == "latest" else f"tensorflow-cpu=={version}"
        result = pip_install(python, "--quiet", spec)
        assert result.returncode == 0, f"pip install {spec} failed:\n{result.stderr[-3000:]}"
        return python


def new_venv(root: Path) -> Path:
    """A Python 3.11 venv at `root`; its python."""
    subprocess.run([python311(), "-m", "venv", str(root)], check=True)
    return root / "bin" / "python"


def pip_install(python: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m pip install ARGS` with the environment from before the session's `gcs`
    fixture: its proxy intercepts HTTPS with its own certificate authority, which pip rightly
    refuses for the package index."""
    return subprocess.run(
        [str(python), "-m", "pip", "install", *args],
        capture_output=True,
        text=True,
        timeout=1200,
        env=outside_environment(),
    )


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
