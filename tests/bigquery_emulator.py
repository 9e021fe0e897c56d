"""A local BigQuery for tests: bqemulator (PyPI, 1.4.0), a DuckDB-backed emulator that serves
the REST API and the Storage Read API over gRPC, talked to by the real Google client libraries.

It runs as its own process from its own virtual environment, `.venv/bqemulator` (made by
`make test`): bqemulator requires cryptography>=46.0.7 while mitmproxy, which the GCS tests
use, requires cryptography<44.1 on Python 3.11, so pip cannot put both in one environment
(and bqemulator's protobuf 6 would not suit TensorFlow 2.17 either). The trainer finds it through
`BIGQUERY_STORAGE_EMULATOR_HOST` (read in trainer/distribute/environment.py); the tests load tables
through the REST API with google-cloud-bigquery.

Limits of the emulator found here (November 2026):
- It needs DuckDB's spatial extension, which DuckDB downloads at run time; offline it does
  not start. The PyPI package duckdb-extension-spatial ships the file for DuckDB 1.5.5, so
  the environment pins duckdb==1.5.5 and `start` installs the file into a private HOME.
- A read session splits a table into streams only from 1 MB of Arrow data (smaller tables
  get one stream, as BigQuery does), into at most 10, of equal row counts.
- Sessions never expire (`expire_time` unset, `estimated_row_count` 0), and live in the
  process's memory: they are gone when the emulator restarts.
- NUMERIC columns made by a query come back as decimal128(18, 3), not BigQuery's (38, 9).
- There is no IAM: every caller may read every table, so a permission error cannot be
  provoked; the tests answer CreateReadSession with PERMISSION_DENIED from a gRPC server
  of their own instead.
- It does not tag JSON and GEOGRAPHY columns with Arrow extension names as BigQuery does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.support import REPO

VENV = REPO / ".venv" / "bqemulator"
PROJECT = "test-project"
# Installs the spatial extension shipped on PyPI into DuckDB's extension dir (under HOME).
_INSTALL_SPATIAL = """
import pathlib, duckdb, duckdb_extension_spatial as ext
path = next(pathlib.Path(ext.__file__).parent.glob("extensions/v*/spatial.duckdb_extension"))
duckdb.connect().execute(f"INSTALL '{path}'")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Emulator:
    rest: str  # http://127.0.0.1:PORT
    grpc: str  # 127.0.0.1:PORT
    project: str = PROJECT

    def env(self) -> dict[str, str]:
        """What a trainer process needs to read this emulator's tables."""
        return {"BIGQUERY_STORAGE_EMULATOR_HOST": self.grpc, "CLOUD_ML_PROJECT_ID": self.project}

    def client(self):
        """google-cloud-bigquery's REST client on the emulator."""
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import bigquery

        return bigquery.Client(
            project=self.project,
            credentials=AnonymousCredentials(),
            client_options=ClientOptions(api_endpoint=self.rest),
        )

    def query(self, sql: str) -> None:
        self.client().query(sql).result()

    def uri(self, dataset_table: str) -> str:
        return f"bq://{self.project}.{dataset_table}"


@contextlib.contextmanager
def start(tmp: Path):
    """A running emulator (its log in `tmp`), stopped on exit."""
    executable = VENV / "bin" / "bqemulator"
    if not executable.exists():
        raise RuntimeError(
            f"{executable} is missing: run `make .venv/bqemulator/.installed` (make test does)."
        )
    home = tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HOME=str(home))
    subprocess.run(
        [str(VENV / "bin" / "python"), "-c", _INSTALL_SPATIAL], env=env, check=True, timeout=60
    )
    rest, grpc = _free_port(), _free_port()
    with open(tmp / "bqemulator.log", "w") as log:
        process = subprocess.Popen(
            [
                str(executable),
                "start",
                f"--rest-port={rest}",
                f"--grpc-port={grpc}",
                "--ephemeral",
                f"--project={PROJECT}",
                "--log-level=warning",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{rest}/healthz", timeout=1)
                    break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        log_text = (tmp / "bqemulator.log").read_text()[-2000:]
                        raise RuntimeError(f"bqemulator did not start: {log_text}") from None
                    time.sleep(0.2)
            yield Emulator(f"http://127.0.0.1:{rest}", f"127.0.0.1:{grpc}")
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
