"""The `cloud` extra: the training install leaves out the Vertex AI SDK and the BigQuery
Storage client (their newest releases need a newer protobuf than TensorFlow 2.17 allows); a
job that needs one without it is refused at start, naming the extra."""

from __future__ import annotations

import importlib.util
import re
from importlib import metadata

import pytest

from trainer import errors
from trainer.errors import InputError
from trainer.input.formats import bigquery
from trainer.reporting import experiments


@pytest.fixture
def missing(monkeypatch):
    """Makes the modules added to the returned set look not installed."""
    absent: set[str] = set()
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if any(name == m or name.startswith(m + ".") for m in absent):
            return None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return absent


def test_an_installed_module_passes_and_a_missing_one_names_the_extra(missing):
    errors.require("json", distribution="json", needed_by="--flag")
    with pytest.raises(InputError, match=r"--flag needs a-dist, which is not installed"):
        errors.require("no_such_module_here", distribution="a-dist", needed_by="--flag")
    # this environment's TensorFlow named beside the extra, so that pip keeps its protobuf
    pin = re.escape(f'pip install "tensorflow-cpu=={metadata.version("tensorflow-cpu")}"')
    with pytest.raises(InputError, match=pin + r' "trainer\[cloud\]"'):
        errors.require("no_such_package.sub", distribution="a-dist", needed_by="--flag")


def test_an_experiment_without_the_vertex_ai_sdk_is_refused(missing):
    missing.add("google.cloud.aiplatform")
    with pytest.raises(InputError, match=r"--experiment=census needs the Vertex AI SDK"):
        experiments.resolve(
            experiment="census", run=None, project="my-project", region=None, api_endpoint=None
        )


def test_a_bigquery_table_without_the_storage_client_is_refused(missing):
    missing.add("google.cloud.bigquery_storage_v1")
    with pytest.raises(
        InputError, match=r"--train_data=bq://my-project\.d\.t \(a BigQuery table\) needs"
    ):
        bigquery.Table.parse("bq://my-project.d.t", flag="--train_data", default_project=None)
    missing.clear()
    table = bigquery.Table.parse("bq://my-project.d.t", flag="--train_data", default_project=None)
    assert str(table) == "bq://my-project.d.t"
