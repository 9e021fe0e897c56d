"""A real Cloud Storage stand-in for tests: gcp-storage-emulator on loopback behind mitmproxy.

TensorFlow's `gs://` filesystem only talks to `https://www.googleapis.com` (hard-coded), so a
test run starts two processes:

- `python -m tests.gcs_emulator`: gcp-storage-emulator in memory on a free loopback port, with
  the fixes libcurl's uploads need (see that module);
- `mitmdump -s tests/gcs_proxy.py`: an HTTPS proxy that terminates TLS for the Google storage
  hosts with a CA it generates in a temporary confdir, and forwards to the emulator.

`GcsServer.env()` is everything a process needs to use them (TensorFlow through the proxy,
google-cloud-storage straight to the emulator). A local-cluster test gives each task
(chief, workers, ps) `gcs.env(task_env)` plus its own TF_CONFIG: `no_proxy` keeps the
cluster's gRPC out of the proxy. Use the session fixture `gcs` (registered in
`tests/conftest.py`); it stops both processes when the session ends, pass or fail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FAKE_TOKEN = "test-token"
PROJECT = "test-project"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(process: subprocess.Popen) -> str:
    """The start of the process's command line (past the launcher)."""
    args = process.args
    if not isinstance(args, list):
        return str(args)
    if args[1:3] == ["-c", _LAUNCHER]:
        args = args[4:]
    return " ".join(map(str, args[:3]))


def _wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"{_command(process)} exited ({process.returncode}) during "
                f"start-up:\n{log.read_text()[-3000:]}"
            )
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{_command(process)} did not listen on {port} in {timeout} s:\n"
                f"{log.read_text()[-3000:]}"
            )
        time.sleep(0.05)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


# Run in the child before the real program: asks for SIGTERM when the test process dies (even
# by SIGKILL), so no emulator or proxy outlives a killed test run, then execs the program. A
# launcher rather than Popen's preexec_fn: with a preexec_fn Popen forks, and a fork while
# this process's gRPC threads (the BigQuery client's) are busy can abort the child.
_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('the test process is gone')\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def _start(command: list[str], log: Path) -> subprocess.Popen:
    """Starts `command` from the repo root, its output in `log`; on Linux it gets SIGTERM
    when this process dies."""
    if sys.platform.startswith("linux"):
        command = [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *command]
    return subprocess.Popen(
        command,
        cwd=REPO,
        stdout=open(log, "w"),  # noqa: SIM115 (the process owns it)
        stderr=subprocess.STDOUT,
    )


def _mitmdump() -> str:
    """mitmdump of this interpreter's environment (the venv's bin/), else from PATH."""
    here = Path(sys.executable).parent / "mitmdump"
    found = str(here) if here.exists() else shutil.which("mitmdump")
    if not found:
        raise RuntimeError("mitmdump not found: install the test extra (pip install -e '.[test]').")
    return found


@dataclasses.dataclass(frozen=True)
class GcsServer:
    """The running emulator and proxy, and how to reach them."""

    emulator_port: int
    proxy_port: int
    ca_file: Path
    workdir: Path
    startup_seconds: float

    @property
    def emulator_url(self) -> str:
        return f"http://127.0.0.1:{self.emulator_port}"

    def env(self, base: dict | None = None) -> dict:
        """Environment for a process that uses `gs://` here: TensorFlow goes through the
        proxy (the only route to its hard-coded endpoints) and trusts the proxy's CA;
        google-cloud-storage goes straight to the emulator. `no_proxy` keeps loopback traffic
        (a cluster's gRPC, the emulator itself) out of the proxy."""
        env = dict(os.environ if base is None else base)
        env.update(
            https_proxy=f"http://127.0.0.1:{self.proxy_port}",
            HTTPS_PROXY=f"http://127.0.0.1:{self.proxy_port}",
            no_proxy="127.0.0.1,localhost",
            NO_PROXY="127.0.0.1,localhost",
            CURL_CA_BUNDLE=str(self.ca_file),
            NO_GCE_CHECK="true",
            GOOGLE_AUTH_TOKEN_FOR_TESTING=FAKE_TOKEN,
            STORAGE_EMULATOR_HOST=self.emulator_url,
            # A dead route fails in seconds rather than after TF's ten default retries.
            GCS_RETRY_CONFIG_MAX_RETRIES="2",
        )
        return env

    def client(self):
        """A google-cloud-storage client on the emulator, to check what landed in a bucket."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage  # type: ignore[attr-defined]  # a namespace package

        os.environ["STORAGE_EMULATOR_HOST"] = self.emulator_url
        return storage.Client(project=PROJECT, credentials=AnonymousCredentials())

    def new_bucket(self, prefix: str = "test") -> str:
        """Creates a bucket with a fresh name; returns the name."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.client().create_bucket(name)
        return name

    def object_names(self, bucket: str, prefix: str = "") -> list[str]:
        return sorted(b.name for b in self.client().list_blobs(bucket, prefix=prefix))


@contextlib.contextmanager
def running_gcs() -> Iterator[GcsServer]:
    """Starts the emulator and the proxy; stops both on exit, whatever happened."""
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="gcs-emulator-"))
    emulator_port, proxy_port = free_port(), free_port()
    processes: list[subprocess.Popen] = []
    try:
        emulator_log = workdir / "emulator.log"
        processes.append(
            _start(
                [sys.executable, "-m", "tests.gcs_emulator", f"--port={emulator_port}"],
                emulator_log,
            )
        )
        proxy_log = workdir / "proxy.log"
        confdir = workdir / "mitmproxy"
        proxy = [
            _mitmdump(),
            "--quiet",
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            str(proxy_port),
            "--set",
            f"confdir={confdir}",
            # Never resolve or dial the real hosts: the addon picks the upstream.
            "--set",
            "connection_strategy=lazy",
            "--set",
            "upstream_cert=false",
            # libcurl sends some uploads chunked *and* with a Content-Length; the emulator
            # wrapper de-chunks them.
            "--set",
            "validate_inbound_headers=false",
            "-s",
            str(REPO / "tests" / "gcs_proxy.py"),
            "--set",
            f"gcs_emulator=127.0.0.1:{emulator_port}",
        ]
        processes.append(_start(proxy, proxy_log))
        _wait_for_port(emulator_port, processes[0], emulator_log, timeout=30)
        _wait_for_port(proxy_port, processes[1], proxy_log, timeout=30)
        yield GcsServer(
            emulator_port=emulator_port,
            proxy_port=proxy_port,
            ca_file=confdir / "mitmproxy-ca-cert.pem",
            workdir=workdir,
            startup_seconds=time.monotonic() - started,
        )
    finally:
        for process in reversed(processes):
            _stop(process)
        shutil.rmtree(workdir, ignore_errors=True)


_outside: dict[str, str] | None = None  # os.environ before the `gcs` fixture changed it


def outside_environment() -> dict[str, str]:
    """This process's environment without the `gcs` fixture's proxy and CA: for processes
    that reach the real internet (pip), which the proxy would intercept."""
    return dict(os.environ if _outside is None else _outside)


@pytest.fixture(scope="session")
def gcs() -> Iterator[GcsServer]:
    """The emulator and proxy for the whole session; this process's own TensorFlow uses them
    too (its GCS filesystem reads these variables on first use)."""
    global _outside
    with running_gcs() as server:
        saved = _outside = dict(os.environ)
        os.environ.update(server.env())
        try:
            yield server
        finally:
            os.environ.clear()
            os.environ.update(saved)
            _outside = None


@pytest.fixture
def bucket(gcs: GcsServer) -> str:
    """A fresh, empty bucket."""
    return gcs.new_bucket()
