"""Files on local disk or in Cloud Storage (`gs://bucket/path`) for `deploy/`, behind four
functions.

`gs://` goes through google-cloud-storage, which honours `STORAGE_EMULATOR_HOST` (so tests run
against a local emulator) and needs no TensorFlow: submitting and publishing never load it.
A `.gz` file is inflated by the trainer's inflater (`trainer/input/gzipped.py`, which loads no
TensorFlow), so that both take and refuse the same files.
The trainer reads and lists through `tf.io.gfile` instead (`trainer/storage/files.py`,
`trainer/input/files.py`), the filesystem its tf.data pipelines and checkpoints use; what a
path names is decided in one place for both (`trainer/storage/paths.py`). Local writes are atomic (a
temporary file, then a rename), and a Cloud Storage object only appears once its upload is
complete, so readers never see half a file.
"""

from __future__ import annotations

import fnmatch
import glob
import io
import os
import tempfile

from deploy.cloud.api import DeployError
from trainer.storage.paths import GCS_PREFIX, is_gcs, split_gcs


def _client(client=None):
    if client is not None:
        return client
    from google.cloud import storage  # type: ignore[attr-defined]  # a namespace package

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project="emulator", credentials=AnonymousCredentials())
    return storage.Client()


def read_bytes(uri: str, *, client=None) -> bytes:
    """The whole file; `.gz` files are decompressed by the trainer's reader, gzip members one
    after another, zero bytes between them being padding (DeployError when one is cut short
    or corrupt: never part of it read as if whole). A file that is not there raises
    FileNotFoundError, in a bucket as on disk."""
    if is_gcs(uri):
        from google.api_core import exceptions

        bucket, name = split_gcs(uri)
        try:
            data = _client(client).bucket(bucket).blob(name).download_as_bytes()
        except exceptions.NotFound:
            raise FileNotFoundError(f"{uri} does not exist") from None
    else:
        with open(uri, "rb") as f:
            data = f.read()
    if not uri.endswith(".gz"):
        return data
    # Inflated by the trainer's inflater, so that a file batch prediction takes is one training
    # takes, and one it refuses (cut short, corrupt) is refused by both.
    from trainer.input import gzipped

    try:
        return b"".join(gzipped.inflate(io.BytesIO(data)))
    except gzipped.Cut as e:
        raise DeployError(
            f"{uri} {e}: a copy or a writer that was interrupted? Copy or write the file "
            "again, or leave it out."
        ) from None


def write_bytes(uri: str, data: bytes, *, client=None) -> None:
    """Writes the whole file at once: readers see the old state or the complete new file."""
    if is_gcs(uri):
        bucket, name = split_gcs(uri)
        _client(client).bucket(bucket).blob(name).upload_from_string(data)
        return
    directory = os.path.dirname(os.path.abspath(uri))
    os.makedirs(directory, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(temp, 0o644)  # mkstemp makes it private; outputs are ordinary files
        os.replace(temp, uri)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise


def upload_file(path: str, uri: str, *, client=None) -> None:
    """Copies a local file to `uri` (gs:// or local)."""
    with open(path, "rb") as f:
        write_bytes(uri, f.read(), client=client)


def expand(uris: list[str], *, client=None) -> list[str]:
    """Each URI or glob (`*`, `?`, `[...]`) expanded to the sorted files it matches; fails
    naming the first pattern that matches nothing."""
    files: list[str] = []
    for pattern in uris:
        matches = _glob_gcs(pattern, client) if is_gcs(pattern) else _glob_local(pattern)
        if not matches:
            raise FileNotFoundError(f"'{pattern}' matches no file. Check the path or the glob.")
        files.extend(matches)
    return files


def _glob_local(pattern: str) -> list[str]:
    return sorted(p for p in glob.glob(pattern) if os.path.isfile(p))


def _glob_gcs(pattern: str, client) -> list[str]:
    bucket, name = split_gcs(pattern)
    prefix = name.split("*")[0].split("?")[0].split("[")[0]
    blobs = _client(client).list_blobs(bucket, prefix=prefix)
    return sorted(
        f"{GCS_PREFIX}{bucket}/{b.name}"
        for b in blobs
        if fnmatch.fnmatchcase(b.name, name) and not b.name.endswith("/")
    )
