"""The fakes' schema check: config.yaml against CustomJobSpec, and the validator itself."""

from __future__ import annotations

import pytest

from deploy.vertex import job_spec
from tests.deploy import discovery

SPEC = "GoogleCloudAiplatformV1CustomJobSpec"


def test_config_yaml_is_a_valid_custom_job_spec():
    assert discovery.validate(job_spec.load_config(), SPEC) == []


@pytest.mark.parametrize(
    "spec, problem",
    [
        ({"workerPoolSpecs": [{"machine_spec": {}}]}, "machine_spec: unknown field"),
        ({"workerPoolSpecs": [{"replicaCount": "two"}]}, "replicaCount: expected string (int64)"),
        ({"workerPoolSpecs": [{"replicaCount": True}]}, "replicaCount: expected string (int64)"),
        ({"workerPoolSpecs": {"machineSpec": {}}}, "workerPoolSpecs: expected a list"),
        ({"scheduling": {"timeout": "1h"}}, "timeout: expected string (google-duration)"),
        ({"scheduling": {"strategy": "CHEAPEST"}}, "is not one of"),
        ({"workerPoolSpecs": [{"diskSpec": {"bootDiskSizeGb": 1.5}}]}, "expected integer"),
    ],
)
def test_validator_reports_what_is_wrong(spec, problem):
    problems = discovery.validate(spec, SPEC)
    assert len(problems) == 1 and problem in problems[0], problems


def test_output_only_fields_are_refused_in_requests():
    problems = discovery.validate(
        {"displayName": "j", "state": "JOB_STATE_RUNNING", "jobSpec": {}},
        "GoogleCloudAiplatformV1CustomJob",
    )
    assert problems == ["body.state: output-only field in a request"]


@pytest.mark.parametrize(
    "method, path, method_id",
    [
        ("POST", "/v1/projects/p/locations/r/customJobs", "customJobs.create"),
        ("POST", "/v1/projects/p/locations/r/models:upload", "models.upload"),
        ("POST", "/v1/projects/p/locations/r/endpoints/1:deployModel", "endpoints.deployModel"),
        ("GET", "/v1/projects/p/locations/r/endpoints/1/operations/2", "endpoints.operations.get"),
        ("DELETE", "/v1/projects/p/locations/r/models/1", "models.delete"),
    ],
)
def test_requests_are_routed_by_the_discovery_document(method, path, method_id):
    found = discovery.route(method, path)
    assert found is not None and found[0] == f"aiplatform.projects.locations.{method_id}"


def test_unknown_calls_have_no_route():
    assert discovery.route("POST", "/v1/projects/p/locations/r/models:teleport") is None
