"""deploy.submit: the resolved spec, the job options, the sdist upload and the CustomJob the
client library sends (checked by the fake service against the published schema)."""

from __future__ import annotations

import concurrent.futures
import datetime
import io
import json
import subprocess
import sys
import tarfile

import pytest

from deploy import submit
from deploy.cloud import api
from deploy.vertex import checks, custom_job, estimate, job_options, job_spec, sdist
from deploy.vertex.job_options import JobOptions
from tests.deploy import discovery
from tests.deploy.job_configs import (
    CLOUD,
    GPU_IMAGE,
    IMAGE,
    PLACEHOLDER,
    PREBUILT,
    PREBUILT_GPU,
    as_package,
    package_config,
)
from tests.support import REPO
from trainer.distribute.cluster import ClusterShape
from trainer.placement import Placement, cost

SPEC = "GoogleCloudAiplatformV1CustomJobSpec"
PACKAGE = "gs://test-bucket/dist/trainer-0.1.0.tar.gz"


def test_config_yaml_runs_the_trainers_image_in_the_project_of_the_job():
    config = job_spec.load_config()
    pools = config["workerPoolSpecs"]
    assert [p["containerSpec"]["imageUri"] for p in pools] == [PLACEHOLDER] * 4
    assert not custom_job.needs_package(config)
    spec = custom_job.resolve(
        config,
        package_uri=None,  # no pool runs the sdist
        output_dir="gs://test-bucket/runs/a",
        extra_args=["--train_data=x"],
        cloud=CLOUD,
    )
    pools = spec["workerPoolSpecs"]
    assert [p["replicaCount"] for p in pools] == [1, 2, 1, 1]  # chief, workers, ps, evaluator
    assert all(set(p["containerSpec"]) == {"imageUri", "args"} for p in pools)
    assert [p["containerSpec"]["imageUri"] for p in pools] == [IMAGE] * 4
    assert all(
        p["containerSpec"]["args"]
        == [
            "--placement=replication",
            "--max_iterations=3",
            "--max_iteration_steps=750",
            "--train_data=x",
        ]
        for p in pools
    )
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": "gs://test-bucket/runs/a"}
    assert discovery.validate(spec, SPEC) == []
    body = custom_job.Submission("job", spec).body()
    assert discovery.validate(body, "GoogleCloudAiplatformV1CustomJob") == []


def test_resolved_package_spec_has_the_package_in_every_pool_and_stays_valid():
    spec = custom_job.resolve(
        as_package(job_spec.load_config()),
        package_uri=PACKAGE,
        output_dir="gs://test-bucket/runs/a",
        extra_args=["--train_data=x"],
    )
    pools = spec["workerPoolSpecs"]
    assert all(p["pythonPackageSpec"]["packageUris"] == [PACKAGE] for p in pools)
    assert all(p["pythonPackageSpec"]["args"][-1] == "--train_data=x" for p in pools)
    assert all(p["pythonPackageSpec"]["executorImageUri"] == PREBUILT for p in pools)
    assert custom_job.needs_package(spec)
    assert discovery.validate(spec, SPEC) == []
    body = custom_job.Submission("job", spec).body()
    assert discovery.validate(body, "GoogleCloudAiplatformV1CustomJob") == []
    with pytest.raises(api.DeployError, match=r"workerPoolSpecs\[0\] runs the sdist .* --staging"):
        custom_job.resolve(
            as_package(job_spec.load_config()), package_uri=None, output_dir="gs://b/runs/a"
        )


@pytest.mark.parametrize(
    "image, project, expected",
    [
        (PLACEHOLDER, "my-project", IMAGE),
        ("europe-docker.pkg.dev/PROJECT/x/trainer-cpu@sha256:" + "a" * 64, "other-1",
         "europe-docker.pkg.dev/other-1/x/trainer-cpu@sha256:" + "a" * 64),
        ("gcr.io/PROJECT/trainer", "my-project", "gcr.io/my-project/trainer"),
        # only the segment right after the host is the placeholder
        ("eu.gcr.io/team/project/trainer:1", "my-project", "eu.gcr.io/team/project/trainer:1"),
        (IMAGE, "other-1", IMAGE),
    ],
)  # fmt: skip
def test_the_project_placeholder_of_an_image_is_the_jobs_project(image, project, expected):
    spec = job_spec.load_config()
    spec["workerPoolSpecs"][0]["containerSpec"]["imageUri"] = image
    resolved = custom_job.resolve(
        spec, package_uri=None, output_dir="gs://b/runs/a", cloud=api.Cloud(project=project)
    )
    assert resolved["workerPoolSpecs"][0]["containerSpec"]["imageUri"] == expected
    assert resolved["workerPoolSpecs"][1]["containerSpec"]["imageUri"] == PLACEHOLDER.replace(
        "PROJECT", project
    )


@pytest.mark.parametrize(
    "cloud",
    [None, api.Cloud(project="123456789012")],  # no project; a number, not an id
    ids=["no project", "project number"],
)
def test_a_placeholder_left_in_an_image_names_the_fix(cloud):
    with pytest.raises(api.DeployError) as raised:
        custom_job.resolve(
            job_spec.load_config(), package_uri=None, output_dir="gs://b/runs/a", cloud=cloud
        )
    assert str(raised.value) == (
        f"workerPoolSpecs[0].containerSpec.imageUri ({PLACEHOLDER!r}) still holds the "
        "placeholder PROJECT, which deploy.submit fills in with --project only when that is a "
        "project id (not a number): pass --project=YOUR_PROJECT_ID, or --image_uri=IMAGE, or "
        'write your image into config.yaml (build and push it first: docs/deploy.md, "Custom '
        'containers").'
    )
    # --image_uri replaces the placeholder's image
    spec = custom_job.resolve(
        job_spec.load_config(),
        package_uri=None,
        output_dir="gs://b/runs/a",
        options=JobOptions(image_uris=("eu.gcr.io/p/trainer:1",)),
        cloud=cloud,
    )
    assert {p["containerSpec"]["imageUri"] for p in spec["workerPoolSpecs"]} == {
        "eu.gcr.io/p/trainer:1"
    }
    # a registry's host:port is not a pool
    spec = custom_job.resolve(
        job_spec.load_config(),
        package_uri=None,
        output_dir="gs://b/runs/a",
        options=JobOptions(image_uris=("localhost:5000/trainer:1",)),
        cloud=cloud,
    )
    assert {p["containerSpec"]["imageUri"] for p in spec["workerPoolSpecs"]} == {
        "localhost:5000/trainer:1"
    }


@pytest.mark.parametrize(
    "image, machine, gpu_image",
    [
        # the trainer's CPU build of a tag: its GPU build of the same tag
        (IMAGE, "n1-standard-8", GPU_IMAGE),
        ("eu.gcr.io/p/trainer-cpu", "g2-standard-8", "eu.gcr.io/p/trainer-gpu"),
        ("localhost:5000/trainer-cpu:dev", "n1-standard-8", "localhost:5000/trainer-gpu:dev"),
        # a digest names one build, and any other image has no known twin: as named
        (f"eu.gcr.io/p/trainer-cpu@sha256:{'0' * 64}", "n1-standard-8", None),
        (GPU_IMAGE, "n1-standard-8", None),
        ("eu.gcr.io/p/mine:1", "n1-standard-8", None),
        ("eu.gcr.io/p/trainer-cpu-old:1", "n1-standard-8", None),
    ],
)
def test_a_gpu_pool_runs_the_gpu_twin_of_the_trainers_image(image, machine, gpu_image):
    spec = job_spec.load_config()
    spec["workerPoolSpecs"][0]["containerSpec"]["imageUri"] = image
    accelerator = "NVIDIA_TESLA_T4" if machine.startswith("n1-") else "NVIDIA_L4"
    resolved = custom_job.resolve(
        spec,
        package_uri=None,
        output_dir="gs://b/runs/a",
        options=JobOptions(
            machine_types=(f"chief:{machine}",), accelerators=(f"chief:{accelerator}",)
        ),
        cloud=CLOUD,
    )
    chief, workers, _, _ = resolved["workerPoolSpecs"]
    assert chief["containerSpec"]["imageUri"] == (gpu_image or image)
    assert workers["containerSpec"]["imageUri"] == IMAGE  # no GPU: the CPU build


def test_a_gpu_pool_runs_the_gpu_twin_of_a_prebuilt_image():
    spec = custom_job.resolve(
        as_package(job_spec.load_config()),
        package_uri=PACKAGE,
        output_dir="gs://b/runs/a",
        options=JobOptions(machine_types=("n1-standard-8",), accelerators=("NVIDIA_TESLA_T4",)),
    )
    images = [p["pythonPackageSpec"]["executorImageUri"] for p in spec["workerPoolSpecs"]]
    assert images == [PREBUILT_GPU, PREBUILT_GPU, PREBUILT, PREBUILT]


def _set(path: str, value):
    """A change of config.yaml's spec: `value` at a dotted path (`[i]` indexes a pool)."""

    def change(spec):
        *parents, last = path.replace("[", ".").replace("]", "").split(".")
        node = spec
        for key in parents:
            node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
        node[last] = value

    return change


def _keep(spec):
    pass


@pytest.mark.parametrize(
    "change, options, message",
    [
        (lambda s: s.pop("baseOutputDirectory"), JobOptions(), "pass --output_dir"),
        (_set("persistentResourceId", "x"), JobOptions(), "config key 'persistentResourceId'"),
        (_set("scheduling.priority", 1), JobOptions(), "config key 'scheduling.priority'"),
        (
            lambda s: s["workerPoolSpecs"][1].pop("containerSpec"),
            JobOptions(),
            "workerPoolSpecs[1] needs exactly one of pythonPackageSpec (the sdist on a prebuilt "
            "image) or containerSpec (the trainer's image, --image_uri), as a mapping; it has "
            "neither.",
        ),
        (
            _set("workerPoolSpecs[2].pythonPackageSpec", {"executorImageUri": PREBUILT}),
            JobOptions(),
            "workerPoolSpecs[2] needs exactly one of pythonPackageSpec",
        ),
        # images
        (
            _set("workerPoolSpecs[3].containerSpec.imageUri", "trainer latest"),
            JobOptions(),
            "workerPoolSpecs[3].containerSpec.imageUri ('trainer latest') is not an image "
            "reference",
        ),
        (
            _keep,
            JobOptions(image_uris=(f"worker:{PLACEHOLDER}",)),
            f"--image_uri=worker:{PLACEHOLDER}: PROJECT is config.yaml's placeholder; name the "
            "image you pushed",
        ),
        (_keep, JobOptions(image_uris=("worker:trainer latest",)), "('trainer latest')"),
        (_keep, JobOptions(image_uris=("gpu:eu.gcr.io/p/mine:1",)), "'gpu' is not a pool"),
        (
            _set("workerPoolSpecs[1].containerSpec.command", "python -m trainer.task"),
            JobOptions(),
            "workerPoolSpecs[1].containerSpec.command ('python -m trainer.task') must be a list",
        ),
        (
            _set("workerPoolSpecs[0].containerSpec.env", [{"name": "AIP_MODEL_DIR"}]),
            JobOptions(),
            "AIP_MODEL_DIR is set by Vertex AI",
        ),
        # scheduling
        (_set("scheduling.strategy", "CHEAP"), JobOptions(), "scheduling.strategy ('CHEAP')"),
        (_keep, JobOptions(strategy="preemptible"), "scheduling.strategy ('PREEMPTIBLE')"),
        (_set("scheduling.timeout", "1h"), JobOptions(), "scheduling.timeout ('1h')"),
        (_keep, JobOptions(timeout="1 hour"), "--timeout ('1 hour') must be a whole number"),
        (_set("scheduling.disableRetries", "yes"), JobOptions(), "disableRetries ('yes')"),
        # service account, TensorBoard, network
        (_keep, JobOptions(service_account="me@gmail.com"), "serviceAccount ('me@gmail.com')"),
        (
            _keep,
            JobOptions(tensorboard="my-board", service_account="t@p-1.iam.gserviceaccount.com"),
            "tensorboard ('my-board') is not a Vertex AI TensorBoard",
        ),
        (
            _keep,
            JobOptions(
                tensorboard="projects/p/locations/europe-west4/tensorboards/7",
                service_account="t@p-1.iam.gserviceaccount.com",
            ),
            "is in europe-west4, the job in us-central1",
        ),
        (_keep, JobOptions(tensorboard="7"), "needs a service account"),
        (_keep, JobOptions(network="default"), "network ('default') is not a VPC network"),
        (_keep, JobOptions(reserved_ip_ranges=("r1",)), "reservedIpRanges (r1) are ranges"),
        (_set("reservedIpRanges", "r1"), JobOptions(), "must be a list of IP range names"),
        # accelerators
        (
            _set("workerPoolSpecs[0].machineSpec.acceleratorType", "NVIDIA_T4"),
            JobOptions(),
            "workerPoolSpecs[0].machineSpec.acceleratorType ('NVIDIA_T4') is not a Vertex AI GPU",
        ),
        (
            _keep,
            JobOptions(accelerators=("TPU_V3:8",)),
            "acceleratorType ('TPU_V3') is not a Vertex AI GPU",
        ),
        (
            _set("workerPoolSpecs[2].machineSpec.acceleratorCount", 2),
            JobOptions(),
            "workerPoolSpecs[2].machineSpec.acceleratorCount (2) has no acceleratorType",
        ),
        (
            _keep,
            JobOptions(accelerators=("NVIDIA_TESLA_T4",)),
            "workerPoolSpecs[0]: machine type 'n2-standard-8' cannot take NVIDIA_TESLA_T4",
        ),
        (
            _keep,
            JobOptions(accelerators=("chief:NVIDIA_L4",), machine_types=("chief:n1-standard-8",)),
            "machine type 'n1-standard-8' cannot take NVIDIA_L4",
        ),
        (_keep, JobOptions(accelerators=("NVIDIA_TESLA_T4:two",)), "the count ('two')"),
        (_keep, JobOptions(accelerators=("gpu:NVIDIA_TESLA_T4",)), "'gpu' is not a pool"),
        # environment
        (_keep, JobOptions(env=("TF_CONFIG={}",)), "TF_CONFIG is set by Vertex AI"),
        (_keep, JobOptions(env=("chief:AIP_MODEL_DIR=x",)), "AIP_MODEL_DIR is set by Vertex"),
        (_keep, JobOptions(env=("MY-VAR=1",)), "env entry {'name': 'MY-VAR', 'value': '1'}"),
        (_keep, JobOptions(env=("NOVALUE",)), "--env=NOVALUE must be NAME=VALUE"),
    ],
)
def test_bad_specs_and_options_fail_naming_the_value(change, options, message):
    spec = job_spec.load_config()
    change(spec)
    with pytest.raises(api.DeployError) as raised:
        custom_job.resolve(
            spec,
            package_uri=PACKAGE,
            output_dir="gs://test-bucket/runs/a" if "baseOutputDirectory" in spec else None,
            options=options,
            cloud=CLOUD,
        )
    assert message in str(raised.value)


def test_image_uri_runs_the_package_pools_as_containers_of_the_trainers_image():
    config = as_package(job_spec.load_config())
    spec = custom_job.resolve(
        config,
        package_uri=None,  # no pool runs the sdist
        output_dir="gs://test-bucket/runs/a",
        extra_args=["--train_data=x"],
        options=JobOptions(
            image_uris=(GPU_IMAGE, f"ps:{IMAGE}", f"evaluator:{IMAGE}"),
            machine_types=("n1-standard-8",),
            accelerators=("NVIDIA_TESLA_T4",),
            env=("DATA_VERSION=7",),
        ),
    )
    pools = spec["workerPoolSpecs"]
    assert not [p for p in pools if "pythonPackageSpec" in p]
    assert not custom_job.needs_package(spec)
    containers = [p["containerSpec"] for p in pools]
    assert [c["imageUri"] for c in containers] == [GPU_IMAGE, GPU_IMAGE, IMAGE, IMAGE]
    args = config["workerPoolSpecs"][0]["pythonPackageSpec"]["args"] + ["--train_data=x"]
    assert all(c["args"] == args for c in containers)
    assert all(c["env"] == [{"name": "DATA_VERSION", "value": "7"}] for c in containers)
    assert not [c for c in containers if "command" in c]  # the entry point runs trainer.task
    assert pools[0]["machineSpec"]["acceleratorType"] == "NVIDIA_TESLA_T4"
    assert discovery.validate(spec, SPEC) == []
    body = custom_job.Submission("job", spec).body()
    assert discovery.validate(body, "GoogleCloudAiplatformV1CustomJob") == []


def test_container_pools_keep_their_command_and_may_mix_with_a_package_pool():
    spec = job_spec.load_config()
    chief, workers, ps, evaluator = spec["workerPoolSpecs"]
    evaluator["containerSpec"]["command"] = ["python", "-m", "my_eval"]
    ps["pythonPackageSpec"] = {  # pools may mix: the ps runs the sdist
        "executorImageUri": PREBUILT,
        "pythonModule": "trainer.task",
        "args": ps.pop("containerSpec")["args"],
    }
    resolved = custom_job.resolve(
        spec,
        package_uri=PACKAGE,
        output_dir="gs://test-bucket/runs/a",
        extra_args=["--a=1"],
        cloud=CLOUD,
    )
    chief, workers, ps, evaluator = resolved["workerPoolSpecs"]
    assert chief["containerSpec"]["imageUri"] == IMAGE
    assert chief["containerSpec"]["args"][-1] == "--a=1"
    assert evaluator["containerSpec"]["command"] == ["python", "-m", "my_eval"]
    assert ps["pythonPackageSpec"]["packageUris"] == [PACKAGE]
    assert ps["pythonPackageSpec"]["args"][-1] == "--a=1"
    assert "packageUris" not in chief["containerSpec"]
    assert custom_job.needs_package(resolved)
    assert discovery.validate(resolved, SPEC) == []
    with pytest.raises(api.DeployError, match=r"workerPoolSpecs\[2\] runs the sdist"):
        custom_job.resolve(
            spec, package_uri=None, output_dir="gs://test-bucket/runs/a", cloud=CLOUD
        )


def test_image_uri_keeps_another_python_module_as_the_containers_command():
    spec = as_package(job_spec.load_config())
    spec["workerPoolSpecs"][3]["pythonPackageSpec"]["pythonModule"] = "trainer.evaluate"
    resolved = custom_job.resolve(
        spec,
        package_uri=None,
        output_dir="gs://test-bucket/runs/a",
        options=JobOptions(image_uris=(IMAGE,)),
    )
    commands = [p["containerSpec"].get("command") for p in resolved["workerPoolSpecs"]]
    assert commands == [None, None, None, ["python", "-m", "trainer.evaluate"]]


def test_a_prebuilt_image_in_a_container_pool_is_warned_about_too():
    spec = custom_job.resolve(
        job_spec.load_config(),
        package_uri=None,
        output_dir="gs://test-bucket/runs/a",
        options=JobOptions(image_uris=(f"evaluator:{PREBUILT}",)),
        cloud=CLOUD,
    )
    (warning,) = checks.image_warnings(spec, today=datetime.date(2026, 11, 27))
    assert warning.startswith(f"workerPoolSpecs[3]: {PREBUILT} (TensorFlow 2.17 training, CPU)")


def test_output_dir_must_be_a_bucket():
    with pytest.raises(api.DeployError, match=r"--output_dir \('/local/dir'\) must be a Cloud"):
        custom_job.resolve(job_spec.load_config(), package_uri=PACKAGE, output_dir="/local/dir")


def test_a_field_the_client_library_does_not_know_fails_before_sending():
    spec = custom_job.resolve(
        job_spec.load_config(), package_uri=None, output_dir="gs://test-bucket/runs/a", cloud=CLOUD
    )
    spec["workerPoolSpecs"][0]["machineSpec"]["acceleratorTyp"] = "NVIDIA_TESLA_T4"
    with pytest.raises(api.DeployError, match='no field named "acceleratorTyp"'):
        custom_job.Submission("job", spec).body()


OPTIONS = JobOptions(
    tensorboard="123",
    service_account="trainer@my-project.iam.gserviceaccount.com",
    network="projects/12345/global/networks/vpc-1",
    reserved_ip_ranges=("vertex-range-a", "vertex-range-b"),
    enable_web_access=True,
    strategy="spot",
    timeout="2h",
    max_wait_duration="30m",
    restart_job_on_worker_restart=True,
    disable_retries=False,
    machine_types=("n1-standard-8",),
    accelerators=("NVIDIA_TESLA_T4", "worker:NVIDIA_TESLA_T4:2"),
    env=("DATA_VERSION=7", "chief:DATA_VERSION=8", "ps:GRPC_VERBOSITY=ERROR"),
)


def test_options_land_in_the_spec_where_vertex_reads_them():
    spec = custom_job.resolve(
        job_spec.load_config(),
        package_uri=None,
        output_dir="gs://test-bucket/runs/a",
        options=OPTIONS,
        cloud=CLOUD,
    )
    assert spec["tensorboard"] == "projects/my-project/locations/us-central1/tensorboards/123"
    assert spec["serviceAccount"] == "trainer@my-project.iam.gserviceaccount.com"
    assert spec["network"] == "projects/12345/global/networks/vpc-1"
    assert spec["reservedIpRanges"] == ["vertex-range-a", "vertex-range-b"]
    assert spec["enableWebAccess"] is True
    assert spec["scheduling"] == {
        "timeout": "7200s",  # the flag wins over config.yaml's 86400s
        "strategy": "SPOT",
        "maxWaitDuration": "1800s",
        "restartJobOnWorkerRestart": True,
    }
    chief, workers, ps, evaluator = spec["workerPoolSpecs"]
    assert chief["machineSpec"] == {
        "machineType": "n1-standard-8",
        "acceleratorType": "NVIDIA_TESLA_T4",
        "acceleratorCount": 1,
    }
    assert workers["machineSpec"]["acceleratorCount"] == 2
    assert "acceleratorType" not in ps["machineSpec"] | evaluator["machineSpec"]
    assert ps["machineSpec"]["machineType"] == "n2-standard-4"  # not a training pool
    images = [p["containerSpec"]["imageUri"] for p in spec["workerPoolSpecs"]]
    assert images == [GPU_IMAGE, GPU_IMAGE, IMAGE, IMAGE]  # the GPU pools run the GPU build
    envs = [p["containerSpec"].get("env") for p in spec["workerPoolSpecs"]]
    assert envs == [
        [{"name": "DATA_VERSION", "value": "8"}],  # the chief's own value replaces the default
        [{"name": "DATA_VERSION", "value": "7"}],
        [{"name": "DATA_VERSION", "value": "7"}, {"name": "GRPC_VERBOSITY", "value": "ERROR"}],
        [{"name": "DATA_VERSION", "value": "7"}],
    ]
    assert discovery.validate(spec, SPEC) == []


def test_options_from_config_yaml_are_kept_and_checked(tmp_path):
    spec = job_spec.load_config()
    spec["serviceAccount"] = "123-compute@developer.gserviceaccount.com"
    spec["scheduling"].update(strategy="FLEX_START", maxWaitDuration="600s", disableRetries=True)
    spec["workerPoolSpecs"][3]["machineSpec"] = {
        "machineType": "g2-standard-8",
        "acceleratorType": "NVIDIA_L4",  # the count defaults to 1
    }
    spec["workerPoolSpecs"][3]["containerSpec"]["imageUri"] = "eu.gcr.io/p/mine:1"
    resolved = custom_job.resolve(
        spec, package_uri=None, output_dir="gs://test-bucket/runs/a", cloud=CLOUD
    )
    evaluator = resolved["workerPoolSpecs"][3]
    assert evaluator["machineSpec"]["acceleratorCount"] == 1
    assert evaluator["containerSpec"]["imageUri"] == "eu.gcr.io/p/mine:1"  # no known twin
    assert resolved["scheduling"]["strategy"] == "FLEX_START"
    assert discovery.validate(resolved, SPEC) == []


def test_the_strategies_and_gpus_are_the_published_schemas():
    schema = discovery.document()["schemas"]
    strategies = schema["GoogleCloudAiplatformV1Scheduling"]["properties"]["strategy"]["enum"]
    assert set(job_options.STRATEGIES) == set(strategies) - {"STRATEGY_UNSPECIFIED"}
    accelerators = schema["GoogleCloudAiplatformV1MachineSpec"]["properties"]["acceleratorType"]
    assert set(checks.GPUS) == {a for a in accelerators["enum"] if a.startswith("NVIDIA_")}


def test_the_fake_reads_the_client_librarys_enum_numbers_as_names():
    from google.cloud import aiplatform_v1

    spot = int(aiplatform_v1.Scheduling.Strategy.SPOT)
    t4 = int(aiplatform_v1.AcceleratorType.NVIDIA_TESLA_T4)
    body = {
        "jobSpec": {
            "scheduling": {"strategy": spot},
            "workerPoolSpecs": [{"machineSpec": {"acceleratorType": t4}}],
        },
        "labels": {"team": "x"},
    }
    named = discovery.enum_names(body, "GoogleCloudAiplatformV1CustomJob")
    assert named["jobSpec"]["scheduling"]["strategy"] == "SPOT"
    assert named["jobSpec"]["workerPoolSpecs"][0]["machineSpec"] == {
        "acceleratorType": "NVIDIA_TESLA_T4"
    }
    assert named["labels"] == {"team": "x"}
    unknown = discovery.enum_names(
        {"jobSpec": {"scheduling": {"strategy": 999}}}, "GoogleCloudAiplatformV1CustomJob"
    )
    assert discovery.validate(unknown, "GoogleCloudAiplatformV1CustomJob") == [
        "body.jobSpec.scheduling.strategy: expected string, got 999"
    ]


@pytest.mark.parametrize("job_options", [JobOptions(), OPTIONS], ids=["config", "options"])
def test_submit_of_a_package_config_uploads_the_sdist_and_sends_the_dry_run_body(
    cloud_sdk, gcs, tmp_path, job_options
):
    fake, cloud = cloud_sdk
    options: dict = dict(
        staging_uri="gs://test-bucket/dist",
        config=package_config(tmp_path),
        display_name="census",
        output_dir="gs://test-bucket/runs/1",
        extra_args=["--max_iterations=1"],
        options=job_options,
        dist_dir=str(tmp_path),
    )
    printed = io.StringIO()
    assert custom_job.submit(cloud, dry_run=True, out=printed, **options) is None
    assert fake.requests == [], "a dry run sent a request"
    text = printed.getvalue()
    dry = json.loads(text[: text.index("\n]\n") + 2])
    assert "gcloud ai custom-jobs create --project=my-project --region=us-central1" in text
    after = text[text.index("\n]\n") + 3 :].splitlines()
    assert after[0].startswith("# equivalent gcloud command") and after[1].startswith("gcloud ")
    assert all(line.startswith("# ") for line in after[2:]), "the estimate is a comment"
    pools = dry[1]["body"]["jobSpec"]["workerPoolSpecs"]
    assert [line[2:] for line in after[2:]] == estimate.estimate(
        job_spec.read_job_config(job_spec.CONFIG).shape,
        pools[0]["pythonPackageSpec"]["args"],
        machine_type=pools[1]["machineSpec"]["machineType"],  # the workers'
    )

    job = custom_job.submit(cloud, out=io.StringIO(), **options)
    assert job.name.startswith("projects/my-project/locations/us-central1/customJobs/")
    assert job.job_spec.scheduling.timeout.total_seconds() == (
        7200 if job_options.timeout else 86400
    )
    blob = gcs.bucket("test-bucket").get_blob("dist/trainer-0.1.0.tar.gz")
    assert blob is not None and blob.size == (tmp_path / "trainer-0.1.0.tar.gz").stat().st_size
    # The fake got, field for field, what the dry run printed, and found it valid.
    assert fake.bodies("customJobs.create") == [dry[1]["body"]]
    sent = dry[1]["body"]["jobSpec"]
    if job_options.strategy:
        assert sent["tensorboard"] == "projects/my-project/locations/us-central1/tensorboards/123"
        assert sent["scheduling"]["strategy"] == "SPOT"
        assert sent["serviceAccount"] == OPTIONS.service_account
        assert sent["workerPoolSpecs"][1]["machineSpec"]["acceleratorCount"] == 2
        assert sent["workerPoolSpecs"][0]["pythonPackageSpec"]["env"] == [
            {"name": "DATA_VERSION", "value": "8"}
        ]
    else:
        assert set(sent) == {"workerPoolSpecs", "baseOutputDirectory", "scheduling"}
    assert dry[1]["url"] == cloud.url("projects/my-project/locations/us-central1/customJobs")
    written = job_spec.load_config(str(tmp_path / "custom-job-census.yaml"))
    assert discovery.validate(written, SPEC) == []


def test_image_warnings_name_the_pools_and_the_date():
    spec = custom_job.resolve(
        as_package(job_spec.load_config()),
        package_uri=PACKAGE,
        output_dir="gs://test-bucket/runs/a",
        options=JobOptions(machine_types=("n1-standard-8",), accelerators=("NVIDIA_TESLA_T4",)),
    )
    spec["workerPoolSpecs"][3]["pythonPackageSpec"]["executorImageUri"] = "eu.gcr.io/p/mine:1"
    day = datetime.date(2026, 11, 27)
    warnings = checks.image_warnings(spec, today=day)
    assert [w.split(" (")[0] for w in warnings] == [
        f"workerPoolSpecs[0], workerPoolSpecs[1]: {PREBUILT_GPU}",  # the GPU pools' twin image
        f"workerPoolSpecs[2]: {PREBUILT}",  # the ps; the evaluator's custom image: no warning
    ]
    assert all("reached its end of availability on 2026-07-11" in w for w in warnings)
    assert checks.image_warnings(spec, today=datetime.date(2025, 12, 1)) == []


def test_submit_warns_on_stderr_of_an_image_past_its_end_of_availability(
    cloud_sdk, gcs, tmp_path, capsys
):
    fake, cloud = cloud_sdk
    old = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-15.py310:latest"  # ended 2025-11-14
    config = package_config(tmp_path, old)
    expected = (
        "warning: workerPoolSpecs[0], workerPoolSpecs[1], workerPoolSpecs[2], "
        f"workerPoolSpecs[3]: {old} (TensorFlow 2.15 training, CPU) reached its end of "
        "availability on 2025-11-14: no job can use it."
    )
    dry_run = [
        "--project=my-project",
        f"--api_endpoint={cloud.api_endpoint}",
        "--staging_uri=gs://test-bucket/dist",
        "--output_dir=gs://test-bucket/runs/1",
        f"--config={config}",
        f"--dist_dir={tmp_path / 'dry'}",
        "--dry_run",
    ]
    assert submit.main(dry_run) == 0
    printed = capsys.readouterr()
    assert printed.err.startswith(expected) and printed.err.count("warning:") == 1
    assert printed.out.startswith("[")  # the requests on stdout, as before

    job = custom_job.submit(
        cloud,
        staging_uri="gs://test-bucket/dist",
        display_name="old",
        output_dir="gs://test-bucket/runs/1",
        config=config,
        dist_dir=str(tmp_path / "real"),
        out=io.StringIO(),
    )
    assert capsys.readouterr().err.startswith(expected)
    assert job.name.startswith("projects/my-project/locations/us-central1/customJobs/")
    (sent,) = fake.bodies("customJobs.create")
    chief = sent["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]
    assert chief["executorImageUri"] == old  # warned, not changed: the page's dates may move


def test_submit_of_config_yaml_runs_the_image_in_the_project_and_builds_no_sdist(
    cloud_sdk, gcs, tmp_path, capsys
):
    fake, cloud = cloud_sdk
    dist = tmp_path / "dist"
    other = "eu.gcr.io/p/evaluator:2"
    dry_run = [  # config.yaml as shipped, and no --staging_uri: nothing to upload
        "--project=my-project",
        f"--api_endpoint={cloud.api_endpoint}",
        "--output_dir=gs://test-bucket/runs/1",
        f"--dist_dir={dist}",
        f"--image_uri=evaluator:{other}",
        "--accelerator=worker:NVIDIA_TESLA_T4",
        "--machine_type=worker:n1-standard-8",
        "--dry_run",
    ]
    assert submit.main(dry_run) == 0
    printed = capsys.readouterr()
    assert printed.err == ""  # the trainer's images: nothing to warn about
    (request,) = json.loads(printed.out[: printed.out.index("\n]\n") + 2])  # no upload
    pools = request["body"]["jobSpec"]["workerPoolSpecs"]
    assert [p["containerSpec"]["imageUri"] for p in pools] == [IMAGE, GPU_IMAGE, IMAGE, other]
    assert "# a cluster of 2 workers" in printed.out or "# one machine is faster" in printed.out
    assert sorted(p.name for p in dist.iterdir()) == ["custom-job-adanet-census.yaml"]
    # The resolved spec gcloud is pointed at runs as is: the project filled in, no BUCKET.
    written = job_spec.load_config(str(dist / "custom-job-adanet-census.yaml"))
    assert written == request["body"]["jobSpec"]
    assert "PROJECT" not in json.dumps(written) and "BUCKET" not in json.dumps(written)

    job = custom_job.submit(
        cloud,
        display_name="containers",
        output_dir="gs://test-bucket/runs/1",
        options=JobOptions(image_uris=(f"evaluator:{other}",)),
        dist_dir=str(tmp_path / "real"),
        out=io.StringIO(),
    )
    assert job.name.startswith("projects/my-project/locations/us-central1/customJobs/")
    (sent,) = fake.bodies("customJobs.create")
    images = [p["containerSpec"]["imageUri"] for p in sent["jobSpec"]["workerPoolSpecs"]]
    assert images == [IMAGE, IMAGE, IMAGE, other]
    assert list(gcs.bucket("test-bucket").list_blobs(prefix="dist/")) == [], "an sdist went up"
    assert not list((tmp_path / "real").glob("*.tar.gz")), "an sdist was built"


def test_a_package_config_without_staging_uri_stops_before_the_build(tmp_path, capsys):
    dist = tmp_path / "dist"
    argv = [
        "--project=my-project",
        "--output_dir=gs://test-bucket/runs/1",
        f"--config={package_config(tmp_path)}",
        f"--dist_dir={dist}",
        "--dry_run",
    ]
    assert submit.main(argv) == 2
    assert capsys.readouterr().err == (
        "error: workerPoolSpecs[0] runs the sdist (pythonPackageSpec): pass "
        "--staging_uri=gs://YOUR_BUCKET/dist, where it is uploaded, or run the pool on the "
        "trainer's image (--image_uri).\n"
    )
    assert not dist.exists(), "an sdist was built"
    # Every pool on an image: no sdist, so no --staging_uri needed.
    assert submit.main([*argv, f"--image_uri={IMAGE}"]) == 0
    assert sorted(p.name for p in dist.iterdir()) == ["custom-job-adanet-census.yaml"]


def test_image_uri_and_an_optional_staging_uri_are_job_flags():
    p = api.parser("x")
    job_options.add_job_flags(p, display_name="d")
    args = p.parse_args([f"--image_uri={IMAGE}", f"--image_uri=ps:{GPU_IMAGE}"])
    assert job_options.job_options(args).image_uris == (IMAGE, f"ps:{GPU_IMAGE}")
    assert args.staging_uri is None


@pytest.mark.parametrize("module", ["deploy.submit", "deploy.tune", "deploy.pipeline"])
def test_every_job_command_takes_image_uri(module):
    help_text = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert help_text.returncode == 0, help_text.stderr
    assert "--image_uri" in help_text.stdout and "--staging_uri" in help_text.stdout


def test_command_line_help_and_bad_input():
    help_text = subprocess.run(
        [sys.executable, "-m", "deploy.submit", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert help_text.returncode == 0 and "--staging_uri" in help_text.stdout
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.submit",
            "--project=my-project",
            "--staging_uri=/tmp/x",
            "--dry_run",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert "--staging_uri ('/tmp/x') must be a Cloud Storage URI" in bad.stderr


def test_command_line_options_fail_before_the_build(tmp_path):
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.submit",
            "--project=my-project",
            "--staging_uri=gs://b/dist",
            "--output_dir=gs://b/runs/1",
            f"--dist_dir={tmp_path}",
            "--machine_type=n1-standard-8",
            "--accelerator=NVIDIA_T4:1",
            "--dry_run",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.startswith(
        "error: workerPoolSpecs[0].machineSpec.acceleratorType ('NVIDIA_T4') is not a Vertex AI GPU"
    )
    assert list(tmp_path.iterdir()) == [], "an sdist was built"


def test_command_line_flags_become_job_options():
    p = api.parser("x")
    job_options.add_job_flags(p, display_name="d")
    args = p.parse_args(
        [
            "--staging_uri=gs://b/d",
            "--tensorboard=123",
            "--service_account=a@p.iam.gserviceaccount.com",
            "--strategy=SPOT",
            "--timeout=2h",
            "--restart_job_on_worker_restart",
            "--accelerator=NVIDIA_TESLA_T4",
            "--accelerator=worker:NVIDIA_TESLA_T4:2",
            "--machine_type=n1-standard-8",
            "--env=A=1",
            "--env=chief:A=2",
            "--reserved_ip_range=r1",
            "--reserved_ip_range=r2",
        ]
    )
    assert job_options.job_options(args) == JobOptions(
        tensorboard="123",
        service_account="a@p.iam.gserviceaccount.com",
        strategy="SPOT",
        timeout="2h",
        restart_job_on_worker_restart=True,
        accelerators=("NVIDIA_TESLA_T4", "worker:NVIDIA_TESLA_T4:2"),
        machine_types=("n1-standard-8",),
        env=("A=1", "chief:A=2"),
        reserved_ip_ranges=("r1", "r2"),
    )


def test_dry_run_estimate_of_config_yaml_says_what_the_cost_model_predicts():
    config = job_spec.read_job_config(job_spec.CONFIG)
    lines = estimate.estimate(config.shape, config.args, machine_type="n1-standard-8")
    p = cost.predict(
        cost.ClusterJob(
            placement=Placement.REPLICATION,
            workers=2,
            ps=1,
            batch_size=256,
            chunks=cost.Chunks(
                steps_per_loop=100, chunk_secs=estimate.TRAINER_DEFAULTS["chunk_secs"], budget=750
            ),
            subnetwork_bytes=cost.CENSUS_SUBNETWORK_BYTES,
            replica_cores=8,
        ),
        cost.SIMULATED_PARAMS,
    )
    assert "a host of its own per replica" in lines[0]
    assert "n1-standard-8's 8 vCPUs per replica" in lines[1]
    assert lines[2].startswith(
        f"2 workers, 1 ps, replication, batch 256, chunks of ~{p.steps_per_chunk:,.0f} steps: "
        f"~{p.examples_per_s:,.0f} examples/s, per-worker efficiency "
        f"{p.per_worker_efficiency:.2f} (one process: ~{p.baseline_examples_per_s:,.0f} examples/s"
    )
    assert lines[3].startswith("an iteration's 750 steps per job: ~")
    assert lines[4] == f"a cluster of 2 workers trains ~{p.speedup:.1f}x one process."
    # Efficiency and the verdict do not depend on the machine; examples/s do.
    unknown = estimate.estimate(config.shape, config.args, machine_type="custom")
    assert "one core per replica" in unknown[1] and unknown[4] == lines[4]


@pytest.mark.parametrize(
    "machine_type, vcpus",
    [("n1-standard-8", 8), ("n2-highmem-16", 16), ("e2-standard-4", 4), ("a2-highgpu-1g", None),
     (None, None)],
)  # fmt: skip
def test_a_machine_types_vcpus_come_from_its_name(machine_type, vcpus):
    assert estimate.machine_vcpus(machine_type) == vcpus


@pytest.mark.parametrize(
    "shape, args, verdict",
    [
        # Two round-robin workers: one of them trains every subnetwork, as one process does.
        (ClusterShape(workers=2, ps=1), ["--placement=round_robin"], "drop the workers."),
        # Every step moving the variables through one server saturates it.
        (
            ClusterShape(workers=32, ps=1),
            ["--steps_per_loop", "1", "--chunk_secs=1e-6", "--batch_size=8", "--optimizer=sgd"],
            "drop the workers.",
        ),
        (ClusterShape(workers=8, ps=2), ["--batch_size=256"], "a cluster of 8 workers trains ~"),
        (ClusterShape(), ["--max_iteration_steps=500"], "an iteration's 500 steps: ~"),
        (ClusterShape(workers=2), [], "the cost model covers parameter servers only."),
        (ClusterShape(workers=2, ps=1), ["--batch_size=x"], "invalid int value: 'x'"),
        (ClusterShape(workers=2, ps=1), ["--placement=ring"], "invalid choice: 'ring'"),
        (ClusterShape(workers=2, ps=1), ["--batch_size=0"], "batch_size (0) must be >= 1."),
    ],
)
def test_dry_run_estimate_verdicts(shape, args, verdict):
    assert verdict in estimate.estimate(shape, args)[-1]


def test_the_estimates_trainer_defaults_are_those_absl_parses():
    from trainer import task

    trainers = {name: task.FLAGS[name].default for name in estimate.ESTIMATED_FLAGS}
    assert trainers == estimate.TRAINER_DEFAULTS


def test_a_display_name_never_names_a_path_outside_the_dist_dir(tmp_path, capsys):
    """Before: `--display_name=../../x` wrote custom-job-../../x.yaml, two folders up."""
    dist = tmp_path / "a" / "dist"
    args = [
        "--project=my-project",
        "--output_dir=gs://test-bucket/runs/1",
        f"--dist_dir={dist}",
        "--display_name=../../escaped census",
        "--dry_run",
    ]
    assert submit.main(args) == 0
    assert sorted(p.name for p in dist.iterdir()) == ["custom-job-escaped-census.yaml"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    assert '"displayName": "../../escaped census"' in capsys.readouterr().out


def test_two_sdist_builds_of_one_checkout_at_once_both_succeed(tmp_path):
    """setup.py sdist writes its release tree in the checkout: unlocked, two builds at once
    tore it down under each other ('No such file or directory: trainer-0.1.0/...')."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        built = list(pool.map(sdist.build_sdist, [str(tmp_path / "a"), str(tmp_path / "b")]))
    for archive in built:
        with tarfile.open(archive) as tar:
            assert any(n.endswith("trainer/task.py") for n in tar.getnames())
