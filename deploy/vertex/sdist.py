"""The trainer's sdist, built from this checkout for the pools that run it
(`pythonPackageSpec` on a prebuilt image), and its upload to Cloud Storage.

`setup.py sdist` writes its release tree and `trainer.egg-info` in the checkout itself, so two
builds at once (two `deploy.submit`s, a notebook and a shell) would tear each other's tree
down: builds of one checkout take turns, by a lock on a file beside the checkout's temporary
files."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

from deploy.cloud import api, storage
from deploy.vertex.job_spec import REPO


def build_sdist(dist_dir: str) -> str:
    """Runs `python setup.py sdist --formats=gztar` and returns the archive's path."""
    os.makedirs(dist_dir, exist_ok=True)
    before = set(glob.glob(os.path.join(dist_dir, "*.tar.gz")))
    with _one_build_at_a_time():
        result = subprocess.run(
            [sys.executable, "setup.py", "sdist", "--formats=gztar", f"--dist-dir={dist_dir}"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
    if result.returncode:
        raise RuntimeError(f"setup.py sdist failed:\n{result.stderr[-3000:]}")
    built = sorted(set(glob.glob(os.path.join(dist_dir, "*.tar.gz"))) - before) or sorted(
        glob.glob(os.path.join(dist_dir, "trainer-*.tar.gz"))
    )
    return built[-1]


def upload_request(sdist: str, package_uri: str) -> api.ApiRequest:
    """The Cloud Storage upload (the body is the archive's bytes, shown by its path)."""
    bucket, name = storage.split_gcs(package_uri)
    return api.ApiRequest(
        "POST",
        f"https://storage.googleapis.com/upload/storage/v1/b/{bucket}"
        f"/o?uploadType=multipart&name={name}",
        {"file": sdist},
    )


@contextlib.contextmanager
def _one_build_at_a_time() -> Iterator[None]:
    """Holds this checkout's build lock (released by the kernel if the process dies)."""
    name = hashlib.sha256(REPO.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"trainer-sdist-{name}.lock")
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
