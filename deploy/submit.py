"""Submit training: build the sdist, upload it to a bucket, and create a Vertex AI CustomJob
from `config.yaml` (chief, worker, ps and evaluator pools, a base output directory).

    python -m deploy.submit --project=P --staging_uri=gs://B/dist \\
        --output_dir=gs://B/runs/census-1 --extra_args=--train_data=gs://B/data/train.csv

Every pool's `packageUris` becomes the uploaded sdist; `--output_dir` sets
`baseOutputDirectory`; `--extra_args` are appended to every pool's args. The resolved spec is
written next to the sdist, and the equivalent `gcloud ai custom-jobs create` command printed.
`--dry_run` also prints, after the requests, the cost model's estimate of the job's training
speed (`trainer/placement/cost.py`) as `#` comment lines.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from deploy import api, storage
from trainer import job_spec
from trainer.errors import InputError
from trainer.local_cluster import ClusterShape
from trainer.placement import Placement, cost

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "config.yaml")
_SPEC_KEYS = {"workerPoolSpecs", "baseOutputDirectory", "scheduling"}
_SCHEDULING_KEYS = {"timeout", "restartJobOnWorkerRestart"}
_DURATION = re.compile(r"^(\d+)s$")
# The trainer's defaults of the flags the estimate reads (trainer/task.py, trainer/config.py),
# kept here so that a dry run does not load TensorFlow; a test checks that they agree.
TRAINER_DEFAULTS: dict[str, Any] = {
    "placement": "replication",
    "batch_size": 256,
    "steps_per_loop": 100,
    "chunk_secs": 1.0,
    "max_iteration_steps": 750,
    "optimizer": "adam",
}


@dataclasses.dataclass(frozen=True)
class Submission:
    """A CustomJob to create: its name and its resolved CustomJobSpec (REST JSON)."""

    display_name: str
    spec: dict

    def body(self) -> dict:
        """The CustomJob as the REST API takes it (int64 replica counts as strings)."""
        spec = copy.deepcopy(self.spec)
        for pool in spec["workerPoolSpecs"]:
            if "replicaCount" in pool:
                pool["replicaCount"] = api.int64(pool["replicaCount"])
        return {"displayName": self.display_name, "jobSpec": spec}

    def request(self, cloud: api.Cloud) -> api.ApiRequest:
        return api.ApiRequest("POST", cloud.url(f"{cloud.parent}/customJobs"), self.body())

    def gcloud(self, cloud: api.Cloud, config_path: str) -> str:
        """The equivalent gcloud command, reading the resolved spec from `config_path`."""
        return shlex.join(
            [
                "gcloud",
                "ai",
                "custom-jobs",
                "create",
                f"--project={cloud.project}",
                f"--region={cloud.region}",
                f"--display-name={self.display_name}",
                f"--config={config_path}",
            ]
        )


def load_config(path: str = CONFIG) -> dict:
    """config.yaml as plain JSON values, read as the local launcher reads it
    (`trainer.job_spec`).

    Raises:
        DeployError: the file is missing, not YAML or not a CustomJobSpec.
    """
    try:
        return job_spec.load_job_spec(path)
    except InputError as e:
        raise api.DeployError(str(e)) from None


def resolve(
    spec: dict, *, package_uri: str, output_dir: str | None = None, extra_args: Sequence[str] = ()
) -> dict:
    """The spec with the sdist in every pool, the output directory and the extra args."""
    unknown = sorted(set(spec) - _SPEC_KEYS) + sorted(
        f"scheduling.{k}" for k in set(spec.get("scheduling", {})) - _SCHEDULING_KEYS
    )
    if unknown:
        raise api.DeployError(
            f"config key '{unknown[0]}' is not supported by deploy.submit "
            f"(it takes {', '.join(sorted(_SPEC_KEYS))}); use the printed "
            "gcloud command for it."
        )
    spec = copy.deepcopy(spec)
    for index, pool in enumerate(spec["workerPoolSpecs"]):
        if not pool:
            continue  # a skipped pool
        package = pool.get("pythonPackageSpec")
        if package is None:
            raise api.DeployError(
                f"workerPoolSpecs[{index}] has no pythonPackageSpec; "
                "deploy.submit runs the trainer package in every pool."
            )
        package["packageUris"] = [package_uri]
        package["args"] = list(package.get("args", [])) + list(extra_args)
    if output_dir:
        spec["baseOutputDirectory"] = {"outputUriPrefix": api.gcs_uri("--output_dir", output_dir)}
    prefix = spec.get("baseOutputDirectory", {}).get("outputUriPrefix", "")
    if not prefix or "gs://BUCKET/" in prefix:
        raise api.DeployError(
            f"the output directory is {prefix!r}; pass --output_dir=gs://YOUR_BUCKET/runs/NAME."
        )
    return spec


def build_sdist(dist_dir: str) -> str:
    """Runs `python setup.py sdist --formats=gztar` and returns the archive's path."""
    os.makedirs(dist_dir, exist_ok=True)
    before = set(glob.glob(os.path.join(dist_dir, "*.tar.gz")))
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


def create_job(cloud: api.Cloud, submission: Submission, *, staging_uri: str):
    """Creates the CustomJob through the SDK and returns without waiting for it (the SDK
    insists on a staging bucket even though nothing else is staged)."""
    from google.cloud import aiplatform

    # compat.types sets its modules at import time (the API version's), out of mypy's sight.
    from google.cloud.aiplatform.compat.types import custom_job as custom_job_types  # type: ignore[attr-defined]

    cloud.init_sdk()
    spec = submission.spec
    pools = [
        custom_job_types.WorkerPoolSpec.from_json(json.dumps(pool))
        for pool in spec["workerPoolSpecs"]
    ]
    job = aiplatform.CustomJob(
        display_name=submission.display_name,
        worker_pool_specs=pools,
        base_output_dir=spec["baseOutputDirectory"]["outputUriPrefix"],
        staging_bucket=staging_uri,
    )
    scheduling = spec.get("scheduling", {})
    job.submit(
        timeout=_seconds(scheduling.get("timeout")),
        restart_job_on_worker_restart=bool(scheduling.get("restartJobOnWorkerRestart")),
    )
    return job


def _seconds(duration: str | None) -> int | None:
    if duration is None:
        return None
    match = _DURATION.match(str(duration))
    if not match:
        raise api.DeployError(
            f"scheduling.timeout ({duration!r}) must be whole seconds, like 86400s."
        )
    return int(match.group(1))


def submit(
    cloud: api.Cloud,
    *,
    staging_uri: str,
    display_name: str,
    output_dir: str | None = None,
    extra_args: Sequence[str] = (),
    config: str = CONFIG,
    dist_dir: str | None = None,
    dry_run: bool = False,
    out=None,
):
    """Builds and uploads the trainer sdist, then creates the CustomJob of `config`.

    Args:
        cloud: the project, region and API endpoint.
        staging_uri: gs:// folder the sdist is uploaded to.
        display_name: the job's name.
        output_dir: the job's base output directory (overrides config.yaml's).
        extra_args: trainer flags appended to every pool's args.
        config: the CustomJobSpec in YAML.
        dist_dir: where the sdist is built (default: a temporary folder).
        dry_run: print the requests and the gcloud equivalent; send nothing.
        out: where the dry run prints (default: stdout).

    Returns:
        The SDK's CustomJob (created, not waited for); None for a dry run.

    Raises:
        DeployError: a bad config, URI or key, before anything is uploaded or sent.
    """
    out = out or sys.stdout
    api.gcs_uri("--staging_uri", staging_uri)
    spec = load_config(config)
    shape = _shape(config) if dry_run else None
    dist_dir = dist_dir or tempfile.mkdtemp(prefix="trainer-sdist-")
    resolve(
        spec,
        package_uri=f"{staging_uri.rstrip('/')}/x.tar.gz",
        output_dir=output_dir,
        extra_args=extra_args,
    )  # fails on bad input before the build
    sdist = build_sdist(dist_dir)
    package_uri = f"{staging_uri.rstrip('/')}/{os.path.basename(sdist)}"
    submission = Submission(
        display_name,
        resolve(spec, package_uri=package_uri, output_dir=output_dir, extra_args=extra_args),
    )
    spec_path = os.path.join(dist_dir, f"custom-job-{display_name}.yaml")
    _write_yaml(spec_path, submission.spec)
    requests = [upload_request(sdist, package_uri), submission.request(cloud)]
    if dry_run:
        api.show(requests, out)
    else:
        storage.upload_file(sdist, package_uri)
    print(
        f"# equivalent gcloud command (spec in {spec_path}):\n"
        f"{submission.gcloud(cloud, spec_path)}",
        file=out,
    )
    if shape is not None:
        trainer_args = submission.spec["workerPoolSpecs"][0]["pythonPackageSpec"]["args"]
        print("\n".join(f"# {line}" for line in estimate(shape, trainer_args)), file=out)
    return None if dry_run else create_job(cloud, submission, staging_uri=staging_uri)


def estimate(shape: ClusterShape, trainer_args: Sequence[str]) -> list[str]:
    """The cost model's estimate of a job's training speed, in lines of text.

    Args:
        shape: the job's workers and parameter servers (config.yaml's pools [1] and [2]).
        trainer_args: the chief's args; --placement, --batch_size, --steps_per_loop,
            --chunk_secs, --max_iteration_steps and --optimizer are read, the trainer's
            defaults otherwise.

    Returns:
        What the model predicts (with its assumptions) and a one-line verdict.
    """
    flags = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    flags.add_argument("--placement", choices=[p.value for p in Placement])
    flags.add_argument("--batch_size", type=int)
    flags.add_argument("--steps_per_loop", type=int)
    flags.add_argument("--chunk_secs", type=float)
    flags.add_argument("--max_iteration_steps", type=int)
    flags.add_argument("--optimizer", choices=sorted(cost.OPTIMIZER_SLOTS))
    flags.set_defaults(**TRAINER_DEFAULTS)
    try:
        args, _ = flags.parse_known_args(list(trainer_args))
    except argparse.ArgumentError as e:
        return [f"no estimate of the training speed: {e}."]
    head = [
        "estimate of the training speed (trainer/placement/cost.py, fitted on a local cluster):",
        "it assumes one machine per replica (machine types are not modelled) and the default "
        "search's model on census.",
    ]
    if shape.workers and not shape.ps:
        return head + [
            f"{shape.workers} workers without parameter servers train synchronously "
            "(MultiWorkerMirroredStrategy); the cost model covers parameter servers only."
        ]
    try:
        job = cost.ClusterJob(
            placement=Placement(args.placement),
            workers=shape.workers,
            ps=shape.ps,
            batch_size=args.batch_size,
            chunks=cost.Chunks(args.steps_per_loop, args.chunk_secs, args.max_iteration_steps),
            subnetwork_bytes=cost.CENSUS_SUBNETWORK_BYTES,
            optimizer_slots=cost.OPTIMIZER_SLOTS[args.optimizer],
        )
    except ValueError as e:
        return [f"no estimate of the training speed: {e}"]
    p = cost.predict(job)
    one = f"one process: ~{p.baseline_examples_per_s:,.0f} examples/s"
    steps = args.max_iteration_steps
    one_iteration = f"~{steps / p.baseline_job_steps_per_s:,.1f} s"
    if not shape.workers:
        return head + [f"{one}; an iteration's {steps:,} steps: {one_iteration} of training."]
    return head + [
        f"{shape.workers} workers, {shape.ps} ps, {args.placement}, batch {args.batch_size}, "
        f"chunks of ~{p.steps_per_chunk:,.0f} steps: ~{p.examples_per_s:,.0f} examples/s, "
        f"per-worker efficiency {p.per_worker_efficiency:.2f} ({one}; bottleneck: "
        f"{p.bottleneck}).",
        f"an iteration's {steps:,} steps per job: ~{steps / p.job_steps_per_s:,.1f} s of "
        f"training (one process: {one_iteration}).",
        (
            f"a cluster of {shape.workers} workers trains ~{p.speedup:.1f}x one process."
            if p.speedup >= 1
            else f"one machine is faster ({p.speedup:.2f}x): drop the workers."
        ),
    ]


def _shape(config: str) -> ClusterShape:
    try:
        return job_spec.read_job_config(config).shape
    except InputError as e:
        raise api.DeployError(str(e)) from None


def _write_yaml(path: str, spec: dict) -> None:
    import yaml

    storage.write_bytes(path, yaml.safe_dump(spec, sort_keys=False).encode())


def _run(argv: list[str] | None) -> int:
    p = api.parser(__doc__.split("\n\n")[0])
    api.add_cloud_flags(p)
    p.add_argument("--staging_uri", required=True, help="gs:// folder for the sdist.")
    p.add_argument("--display_name", default="adanet-census", help="The job's display name.")
    p.add_argument("--output_dir", help="gs:// base output directory (baseOutputDirectory).")
    p.add_argument(
        "--extra_args",
        action="append",
        default=[],
        help="An argument appended to every pool's args (repeat the flag).",
    )
    p.add_argument("--config", default=CONFIG, help="The CustomJobSpec in YAML.")
    p.add_argument(
        "--dist_dir",
        default=os.path.join(REPO, "dist"),
        help="Where the sdist and the resolved spec are written.",
    )
    args = p.parse_args(argv)
    job = submit(
        api.cloud_from(args),
        staging_uri=args.staging_uri,
        display_name=args.display_name,
        output_dir=args.output_dir,
        extra_args=args.extra_args,
        config=args.config,
        dist_dir=args.dist_dir,
        dry_run=args.dry_run,
    )
    if job is not None:
        print(job.resource_name)
    return 0


main = api.main_of(_run)

if __name__ == "__main__":
    sys.exit(main())
