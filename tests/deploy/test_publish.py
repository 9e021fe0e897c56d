"""deploy.publish: upload, endpoint, deploy, traffic split and clean-up through the SDK."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deploy import api, publish
from tests.support import REPO


def _deployment(**changes) -> publish.Deployment:
    options = dict(
        model_dir="gs://test-bucket/runs/1/model",
        display_name="census-v1",
        endpoint_name="census",
        machine_type="n2-standard-4",
        max_replica_count=3,
    )
    return publish.Deployment(**{**options, **changes})


def test_publish_sends_the_dry_run_bodies_and_deploys(cloud_sdk):
    fake, cloud = cloud_sdk
    d = _deployment()
    dry = publish.deploy_requests(cloud, d)
    published = publish.publish(cloud, d)

    assert fake.bodies("models.upload") == [dry[0].body]
    assert fake.bodies("endpoints.create") == [dry[2].body]
    # The SDK names the uploaded version (model@1) in the deploy request.
    expected = json.loads(
        json.dumps(dry[3].body).replace(publish.PENDING_MODEL, published.model + "@1")
    )
    assert fake.bodies("endpoints.deployModel") == [expected]
    endpoint = fake.resources[published.endpoint]
    assert endpoint["trafficSplit"] == {published.deployed_model_id: 100}
    resources = endpoint["deployedModels"][0]["dedicatedResources"]
    assert resources["maxReplicaCount"] == 3
    assert fake.resources[published.model]["containerSpec"]["imageUri"] == publish.SERVING_IMAGE


def test_second_model_reuses_the_endpoint_and_splits_traffic_then_cleanup(cloud_sdk):
    fake, cloud = cloud_sdk
    first = publish.publish(cloud, _deployment())
    second = publish.publish(cloud, _deployment(display_name="census-v2", traffic_percentage=30))
    assert second.endpoint == first.endpoint
    assert len(fake.bodies("endpoints.create")) == 1
    assert fake.resources[first.endpoint]["trafficSplit"] == {
        second.deployed_model_id: 30,
        first.deployed_model_id: 70,
    }

    publish.cleanup(cloud, first.endpoint, first.model)
    assert first.endpoint not in fake.resources and first.model not in fake.resources
    assert len(fake.bodies("endpoints.undeployModel")) == 2
    assert second.model in fake.resources  # only the named model is deleted


@pytest.mark.parametrize(
    "current, percentage, expected",
    [
        ({}, 100, {"0": 100}),
        ({"a": 100}, 30, {"0": 30, "a": 70}),
        ({"a": 50, "b": 50}, 25, {"0": 25, "a": 38, "b": 37}),
        ({"a": 90, "b": 10}, 0, {"0": 0, "a": 90, "b": 10}),
        ({"a": 1, "b": 1, "c": 1}, 1, {"0": 1, "a": 33, "b": 33, "c": 33}),
    ],
)
def test_traffic_split_adds_up_to_100(current, percentage, expected):
    split = publish.traffic_split(current, percentage)
    assert split == expected and sum(split.values()) == 100


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(model_dir="runs/1/model"), "--model_dir"),
        (dict(min_replica_count=0), "--min_replica_count"),
        (dict(min_replica_count=4), r"--max_replica_count \(3\) is below"),
        (dict(traffic_percentage=101), "between 0 and 100"),
    ],
)
def test_bad_deployments_fail_before_any_request(changes, message):
    with pytest.raises(api.DeployError, match=message):
        _deployment(**changes)


def test_first_model_on_an_endpoint_needs_all_traffic():
    with pytest.raises(api.DeployError, match="must be 100 for the first model"):
        publish.traffic_split({}, 50)


def test_command_line_dry_run_prints_requests():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.publish",
            "deploy",
            "--project=my-project",
            "--model_dir=gs://b/model",
            "--display_name=m",
            "--endpoint_name=e",
            "--dry_run",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    requests = json.loads(result.stdout)
    assert [r["method"] for r in requests] == ["POST", "GET", "POST", "POST"]
    assert requests[0]["url"] == (
        "https://us-central1-aiplatform.googleapis.com/v1/projects/"
        "my-project/locations/us-central1/models:upload"
    )
    cleanup = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.publish",
            "cleanup",
            "--project=my-project",
            "--endpoint=12",
            "--model=34",
            "--dry_run",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert [r["method"] for r in json.loads(cleanup.stdout)] == ["GET", "POST", "DELETE", "DELETE"]
