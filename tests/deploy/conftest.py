"""Fixtures for the deploy tests: one small census model per session, the local predictor,
a fake Vertex AI service and an in-memory Cloud Storage emulator on loopback ports."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket

import pytest

from tests.deploy.fake_vertex import FakeVertex
from tests.support import run_task

# A tiny census model: a linear candidate, one iteration (about 15 s on 2 cores, once).
CENSUS_FLAGS = [
    "--generator=linear",
    "--max_iterations=1",
    "--max_iteration_steps=300",
    "--batch_size=128",
    "--steps_per_loop=100",
    "--learning_rate=0.05",
    # calibrated, deciding at a threshold of its own: what every deploy test serves (and
    # tests/deploy/test_tf_versions.py loads under TensorFlow 2.15)
    "--selection=holdout",
    "--decision_objective=f1",
]


@pytest.fixture(scope="session")
def census_model(tmp_path_factory) -> str:
    """The exported model dir of a small census run, shared by the whole session: by every
    pytest-xdist process too (the first trains it under a lock in their common temp dir)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the processes' common parent
    job_dir = root / "census" / "job"
    with open(root / "census.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (job_dir / "model" / "saved_model.pb").exists():
            shutil.rmtree(job_dir, ignore_errors=True)
            result = run_task([f"--job_dir={job_dir}", *CENSUS_FLAGS])
            assert result.returncode == 0, result.stderr[-3000:]
    return str(job_dir / "model")


@pytest.fixture(scope="session")
def predictor(census_model):
    from deploy.serving.instances import Predictor

    return Predictor(census_model)


@pytest.fixture(scope="session")
def census_rows() -> list[dict]:
    """The first 50 census test rows as JSON instances (the label dropped)."""
    import csv
    import gzip

    from trainer.input.files import CENSUS_LABEL, CENSUS_TEST

    numeric = {"age", "fnlwgt", "education_num", "capital_gain", "capital_loss", "hours_per_week"}
    with gzip.open(CENSUS_TEST, "rt") as f:
        rows = [r for _, r in zip(range(50), csv.DictReader(f))]
    return [
        {k: float(v) if k in numeric else v for k, v in r.items() if k != CENSUS_LABEL}
        for r in rows
    ]


@pytest.fixture
def cloud_sdk():
    """A fake Vertex AI service and a `deploy.cloud.api.Cloud` pointing at it (anonymous)."""
    from google.auth.credentials import AnonymousCredentials

    from deploy.cloud import api

    with FakeVertex() as fake:
        cloud = api.Cloud(
            project="my-project",
            region="us-central1",
            api_endpoint=fake.url,
            credentials=AnonymousCredentials(),
        )
        yield fake, cloud
        assert fake.problems == [], "the fake service rejected requests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gcs(gcs):
    """The session's Cloud Storage emulator (tests/gcs.py: TensorFlow's gs:// goes through its
    proxy, google-cloud-storage straight to it) with an empty bucket `test-bucket`; yields a
    google-cloud-storage client."""
    client = gcs.client()
    if client.lookup_bucket("test-bucket") is None:
        client.create_bucket("test-bucket")
    for blob in client.list_blobs("test-bucket"):
        blob.delete()
    return client
