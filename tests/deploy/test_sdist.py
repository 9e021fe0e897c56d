"""The sdist Vertex AI installs: into a fresh venv that already has TensorFlow (as the prebuilt
training image does), it installs nothing that replaces TensorFlow, and the trainer runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy import venvs
from tests.support import REPO

# Distributions the prebuilt image provides with TensorFlow; the sdist must not bring its own.
TENSORFLOW_STACK = re.compile(
    r"^(tensorflow|tf[-_]|keras|numpy|protobuf|ml[-_]dtypes|h5py)", re.IGNORECASE
)


@pytest.mark.slow
def test_sdist_installs_beside_tensorflow_and_runs(tmp_path):
    tf_python = venvs.tf_venv("latest")  # within the trainer's TensorFlow range (>=2.17,<2.22)
    built = subprocess.run(
        [sys.executable, "setup.py", "sdist", "--formats=gztar", f"--dist-dir={tmp_path / 'dist'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("trainer-*.tar.gz")

    image = _venv_beside(tf_python, tmp_path / "image")
    install = venvs.pip_install(image, str(sdist))
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    installed = _installed(install.stdout)
    assert "trainer-0.1.0" in installed
    assert not [d for d in installed if TENSORFLOW_STACK.match(d)], installed

    help_run = subprocess.run(
        [str(image), "-m", "trainer.task", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert help_run.returncode == 0, help_run.stderr[-3000:]
    assert "--max_iteration_steps" in help_run.stdout
    where = subprocess.run(
        [str(image), "-c", "import trainer; print(trainer.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert str(tmp_path / "image") in where.stdout  # the installed copy, not the repo's


def _venv_beside(tf_python: Path, root: Path) -> Path:
    """A fresh venv that sees the TensorFlow venv's packages (a .pth file), as an image's
    Python sees its preinstalled TensorFlow."""
    python = venvs.new_venv(root)
    site = subprocess.run(
        [str(tf_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(own, "preinstalled_tensorflow.pth").write_text(site + "\n")
    return python


def _installed(pip_output: str) -> list[str]:
    lines = [line for line in pip_output.splitlines() if line.startswith("Successfully installed")]
    return lines[-1].split()[2:] if lines else []
