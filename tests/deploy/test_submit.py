"""deploy.submit: the resolved spec, the sdist upload and the CustomJob the SDK creates."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from deploy import api, submit
from tests.deploy import discovery
from tests.support import REPO
from trainer import job_spec
from trainer.local_cluster import ClusterShape
from trainer.placement import Placement, cost

SPEC = "GoogleCloudAiplatformV1CustomJobSpec"
PACKAGE = "gs://test-bucket/dist/trainer-0.1.0.tar.gz"


def test_resolved_spec_has_the_package_in_every_pool_and_stays_valid():
    spec = submit.resolve(
        submit.load_config(),
        package_uri=PACKAGE,
        output_dir="gs://test-bucket/runs/a",
        extra_args=["--train_data=x"],
    )
    pools = spec["workerPoolSpecs"]
    assert [p["replicaCount"] for p in pools] == [1, 2, 1, 1]  # chief, workers, ps, evaluator
    assert all(p["pythonPackageSpec"]["packageUris"] == [PACKAGE] for p in pools)
    assert all(p["pythonPackageSpec"]["args"][-1] == "--train_data=x" for p in pools)
    assert spec["baseOutputDirectory"] == {"outputUriPrefix": "gs://test-bucket/runs/a"}
    assert discovery.validate(spec, SPEC) == []
    body = submit.Submission("job", spec).body()
    assert discovery.validate(body, "GoogleCloudAiplatformV1CustomJob") == []


@pytest.mark.parametrize(
    "change, output_dir, message",
    [
        (lambda s: None, None, "pass --output_dir"),  # config.yaml still says gs://BUCKET/
        (lambda s: s.update(tensorboard="x"), "gs://b/o", "config key 'tensorboard'"),
        (lambda s: s["scheduling"].update(strategy="SPOT"), "gs://b/o", "'scheduling.strategy'"),
        (
            lambda s: s["workerPoolSpecs"][1].pop("pythonPackageSpec"),
            "gs://b/o",
            "workerPoolSpecs[1] has no pythonPackageSpec",
        ),
        (lambda s: None, "/local/dir", "--output_dir ('/local/dir') must be a Cloud Storage URI"),
    ],
)
def test_bad_specs_fail_naming_the_problem(change, output_dir, message):
    spec = submit.load_config()
    change(spec)
    with pytest.raises(
        api.DeployError,
        match=message.replace("(", r"\(")
        .replace(")", r"\)")
        .replace("[", r"\[")
        .replace("]", r"\]"),
    ):
        submit.resolve(spec, package_uri=PACKAGE, output_dir=output_dir)


def test_submit_uploads_the_sdist_and_the_sdk_sends_the_dry_run_body(cloud_sdk, gcs, tmp_path):
    fake, cloud = cloud_sdk
    options: dict = dict(
        staging_uri="gs://test-bucket/dist",
        display_name="census",
        output_dir="gs://test-bucket/runs/1",
        extra_args=["--max_iterations=1"],
        dist_dir=str(tmp_path),
    )
    printed = io.StringIO()
    assert submit.submit(cloud, dry_run=True, out=printed, **options) is None
    assert fake.requests == [], "a dry run sent a request"
    text = printed.getvalue()
    dry = json.loads(text[: text.index("\n]\n") + 2])
    assert "gcloud ai custom-jobs create --project=my-project --region=us-central1" in text
    after = text[text.index("\n]\n") + 3 :].splitlines()
    assert after[0].startswith("# equivalent gcloud command") and after[1].startswith("gcloud ")
    assert all(line.startswith("# ") for line in after[2:]), "the estimate is a comment"
    assert [line[2:] for line in after[2:]] == submit.estimate(
        job_spec.read_job_config(submit.CONFIG).shape,
        dry[1]["body"]["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]["args"],
    )

    job = submit.submit(cloud, out=io.StringIO(), **options)
    assert job.resource_name.startswith("projects/my-project/locations/us-central1/customJobs/")
    blob = gcs.bucket("test-bucket").get_blob("dist/trainer-0.1.0.tar.gz")
    assert blob is not None and blob.size == (tmp_path / "trainer-0.1.0.tar.gz").stat().st_size
    assert fake.bodies("customJobs.create") == [dry[1]["body"]]
    assert dry[1]["url"] == cloud.url("projects/my-project/locations/us-central1/customJobs")
    written = submit.load_config(str(tmp_path / "custom-job-census.yaml"))
    assert discovery.validate(written, SPEC) == []


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


def test_dry_run_estimate_of_config_yaml_says_what_the_cost_model_predicts():
    config = job_spec.read_job_config(submit.CONFIG)
    lines = submit.estimate(config.shape, config.args)
    p = cost.predict(
        cost.ClusterJob(
            placement=Placement.REPLICATION,
            workers=2,
            ps=1,
            batch_size=256,
            chunks=cost.Chunks(
                steps_per_loop=100, chunk_secs=submit.TRAINER_DEFAULTS["chunk_secs"], budget=750
            ),
            subnetwork_bytes=cost.CENSUS_SUBNETWORK_BYTES,
        )
    )
    assert "one machine per replica (machine types are not modelled)" in lines[1]
    assert lines[2].startswith(
        f"2 workers, 1 ps, replication, batch 256, chunks of ~{p.steps_per_chunk:,.0f} steps: "
        f"~{p.examples_per_s:,.0f} examples/s, per-worker efficiency "
        f"{p.per_worker_efficiency:.2f} (one process: ~{p.baseline_examples_per_s:,.0f} examples/s"
    )
    assert lines[3].startswith("an iteration's 750 steps per job: ~")
    assert lines[4] == f"a cluster of 2 workers trains ~{p.speedup:.1f}x one process."


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
    assert verdict in submit.estimate(shape, args)[-1]


def test_the_estimates_trainer_defaults_are_the_trainers():
    from trainer import task

    trainers = {name: task.FLAGS[name].default for name in submit.TRAINER_DEFAULTS}
    assert trainers == submit.TRAINER_DEFAULTS
