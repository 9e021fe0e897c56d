"""A Vertex AI CustomJob from config.yaml and the job options: the spec resolved (`resolve`:
images, the sdist, the output directory, the extra args, the options) and checked
(`checks.py`), staged (the sdist built only when a pool runs it, after every check), shown
(`--dry_run`) or created (`submit`). deploy.tune and deploy.pipeline stage their jobs here
too (`stage` takes the job to make of the resolved spec)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from deploy.cloud import api, storage
from deploy.vertex.checks import check_job, check_pool, image_warnings
from deploy.vertex.estimate import estimate, shape_of
from deploy.vertex.job_options import (
    SCHEDULING_KEYS,
    SPEC_KEYS,
    JobOptions,
    apply_options,
    fill_project,
    use_images,
)
from deploy.vertex.job_spec import CONFIG, load_config, task_spec
from deploy.vertex.sdist import build_sdist, upload_request
from trainer.storage import paths

_PLACEHOLDER_PACKAGE = "x.tar.gz"


class Job(Protocol):
    """A job request built from a resolved CustomJobSpec (a CustomJob, a tuning job)."""

    def body(self) -> dict: ...

    def request(self, cloud: api.Cloud) -> api.ApiRequest: ...


@dataclasses.dataclass(frozen=True)
class Submission:
    """A CustomJob to create: its name and its resolved CustomJobSpec (REST JSON)."""

    display_name: str
    spec: dict

    def body(self) -> dict:
        """The CustomJob exactly as the client library sends it (int64 values as strings,
        default values left out).

        Raises:
            DeployError: a field the CustomJob message does not have, named.
        """
        return api.canonical(
            "CustomJob", {"displayName": self.display_name, "jobSpec": self.spec}, "the CustomJob"
        )

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


def resolve(
    spec: dict,
    *,
    package_uri: str | None,
    output_dir: str | None = None,
    extra_args: Sequence[str] = (),
    options: JobOptions = JobOptions(),
    cloud: api.Cloud | None = None,
) -> dict:
    """The spec with the project in its images' `PROJECT` placeholder, the images of
    `--image_uri`, the sdist in every pythonPackageSpec pool, the output directory, the extra
    args and the job options, checked.

    Args:
        spec: a CustomJobSpec (config.yaml's).
        package_uri: the uploaded sdist (None if no pool runs it: all are containerSpec).
        output_dir: the base output directory (overrides the spec's).
        extra_args: trainer flags appended to every pool's args.
        options: job options from the command line (override the spec's).
        cloud: the job's project and region (a bare TensorBoard id and the images'
            `PROJECT` placeholder need them).

    Raises:
        DeployError: naming the key and value: a key deploy.submit does not take, a pool
            without exactly one of pythonPackageSpec and containerSpec, a pythonPackageSpec
            pool without `package_uri`, a bad URI, image (a placeholder left in it),
            service account, TensorBoard or network name, an unknown scheduling strategy or
            GPU, a GPU count without a type, a GPU the machine type cannot take, a malformed
            or reserved environment variable.
    """
    unknown = sorted(set(spec) - SPEC_KEYS) + sorted(
        f"scheduling.{k}" for k in set(spec.get("scheduling", {})) - SCHEDULING_KEYS
    )
    if unknown:
        raise api.DeployError(
            f"config key '{unknown[0]}' is not supported by deploy.submit "
            f"(it takes {', '.join(sorted(SPEC_KEYS))}; scheduling takes "
            f"{', '.join(sorted(SCHEDULING_KEYS))}); use the printed gcloud command for it."
        )
    spec = copy.deepcopy(spec)
    pools = spec["workerPoolSpecs"]
    for index, pool in enumerate(pools):
        if pool:  # not a skipped pool
            fill_project(task_spec(pool, f"workerPoolSpecs[{index}]"), cloud)
    use_images(pools, options.image_uris)
    for index, pool in enumerate(pools):
        if not pool:
            continue
        task = task_spec(pool, f"workerPoolSpecs[{index}]")
        if "pythonPackageSpec" in pool:
            if package_uri is None:
                raise api.DeployError(
                    f"workerPoolSpecs[{index}] runs the sdist (pythonPackageSpec): pass "
                    "--staging_uri=gs://YOUR_BUCKET/dist, where it is uploaded, or run the "
                    "pool on the trainer's image (--image_uri)."
                )
            task["packageUris"] = [package_uri]
        task["args"] = list(task.get("args", [])) + list(extra_args)
    if output_dir:
        spec["baseOutputDirectory"] = {"outputUriPrefix": api.gcs_uri("--output_dir", output_dir)}
    prefix = spec.get("baseOutputDirectory", {}).get("outputUriPrefix", "")
    if not prefix or "gs://BUCKET/" in prefix:
        raise api.DeployError(
            f"the output directory is {prefix!r}; pass --output_dir=gs://YOUR_BUCKET/runs/NAME."
        )
    apply_options(spec, options, cloud)
    check_job(spec, cloud)
    for index, pool in enumerate(spec["workerPoolSpecs"]):
        if pool:
            check_pool(pool, f"workerPoolSpecs[{index}]")
    return spec


def needs_package(spec: dict) -> bool:
    """Whether a pool of the spec runs the sdist (a pythonPackageSpec), so it must be built."""
    return any(pool and "pythonPackageSpec" in pool for pool in spec["workerPoolSpecs"])


J = TypeVar("J", bound=Job)


@dataclasses.dataclass(frozen=True)
class Staged(Generic[J]):
    """The sdist built (not yet uploaded), where it goes, and the job that runs it; no sdist
    (None) when every pool runs an image of its own (containerSpec)."""

    sdist: str | None
    package_uri: str | None
    job: J


def stage(
    cloud: api.Cloud,
    make: Callable[[dict], J],
    *,
    staging_uri: str | None = None,
    config: str = CONFIG,
    output_dir: str | None = None,
    extra_args: Sequence[str] = (),
    options: JobOptions = JobOptions(),
    dist_dir: str | None = None,
    today: datetime.date | None = None,
) -> Staged[J]:
    """Checks everything, then builds the sdist: the job of config.yaml (and the options) is
    made and its body checked with a placeholder package before the build, so bad input fails
    before any work; then again with the real package URI. No sdist is built when no pool
    runs it (all are containerSpec). A prebuilt image past or near its end of availability
    gets a warning on stderr (`image_warnings`), once.

    Args:
        cloud: the project, region and API endpoint.
        make: the job of a resolved CustomJobSpec (a Submission; deploy.tune's tuning job).
        staging_uri: gs:// folder the sdist goes to (needed only if a pool runs it).
        config, output_dir, extra_args, options: as `resolve` takes them.
        dist_dir: where the sdist is built (default: a temporary folder).
        today: the date the images' end of availability is judged by (default: the clock's).

    Returns:
        What was built and where it goes (None, None without an sdist), and the job.

    Raises:
        DeployError: bad input, before the build.
    """
    staging = None if staging_uri is None else api.gcs_uri("--staging_uri", staging_uri).rstrip("/")
    spec = load_config(config)

    def resolved(package_uri: str | None) -> dict:
        return resolve(
            spec,
            package_uri=package_uri,
            output_dir=output_dir,
            extra_args=extra_args,
            options=options,
            cloud=cloud,
        )

    def job_of(resolved_spec: dict) -> J:
        job = make(resolved_spec)
        job.body()  # the client library's own check of every field
        return job

    checked = resolved(f"{staging}/{_PLACEHOLDER_PACKAGE}" if staging else None)
    job = job_of(checked)
    for line in image_warnings(checked, today=today or datetime.date.today()):
        print(f"warning: {line}", file=sys.stderr)
    if not needs_package(checked):
        return Staged(None, None, job)
    sdist = build_sdist(dist_dir or tempfile.mkdtemp(prefix="trainer-sdist-"))
    package_uri = f"{staging}/{os.path.basename(sdist)}"
    return Staged(sdist, package_uri, job_of(resolved(package_uri)))


def send_or_show(staged: Staged, cloud: api.Cloud, *, dry_run: bool, out) -> None:
    """Prints the upload (if there is an sdist) and the job's request (dry run), or uploads
    the sdist."""
    sdist, package_uri = staged.sdist, staged.package_uri
    if dry_run:
        uploads = [upload_request(sdist, package_uri)] if sdist and package_uri else []
        api.show([*uploads, staged.job.request(cloud)], out)
    elif sdist and package_uri:
        storage.upload_file(sdist, package_uri)


def create_job(cloud: api.Cloud, submission: Submission):
    """Creates the CustomJob (the body `--dry_run` prints) and returns without waiting."""
    from google.cloud import aiplatform_v1

    return cloud.job_client().create_custom_job(
        parent=cloud.parent,
        custom_job=aiplatform_v1.CustomJob.from_json(json.dumps(submission.body())),
    )


def submit(
    cloud: api.Cloud,
    *,
    staging_uri: str | None = None,
    display_name: str,
    output_dir: str | None = None,
    extra_args: Sequence[str] = (),
    options: JobOptions = JobOptions(),
    config: str = CONFIG,
    dist_dir: str | None = None,
    dry_run: bool = False,
    out=None,
):
    """Builds and uploads the trainer sdist (unless every pool runs an image of its own), then
    creates the CustomJob of `config`.

    Args:
        cloud: the project, region and API endpoint.
        staging_uri: gs:// folder the sdist is uploaded to (needed only if a pool runs it).
        display_name: the job's name.
        output_dir: the job's base output directory (overrides config.yaml's).
        extra_args: trainer flags appended to every pool's args.
        options: TensorBoard, service account, scheduling, GPUs, environment, images
            (override config.yaml's).
        config: the CustomJobSpec in YAML.
        dist_dir: where the sdist and the resolved spec are written (default: a temporary
            folder).
        dry_run: print the requests and the gcloud equivalent; send nothing.
        out: where the dry run prints (default: stdout).

    Returns:
        The created CustomJob (the client library's message, not waited for); None for a
        dry run.

    Raises:
        DeployError: a bad config, URI, key or option, before anything is built or sent.
    """
    out = out or sys.stdout
    shape = shape_of(config) if dry_run else None
    dist_dir = dist_dir or tempfile.mkdtemp(prefix="trainer-sdist-")
    staged = stage(
        cloud,
        lambda spec: Submission(display_name, spec),
        staging_uri=staging_uri,
        config=config,
        output_dir=output_dir,
        extra_args=extra_args,
        options=options,
        dist_dir=dist_dir,
    )
    submission = staged.job
    spec_path = os.path.join(dist_dir, f"custom-job-{api.file_stem(display_name)}.yaml")
    write_yaml(spec_path, submission.body()["jobSpec"])
    send_or_show(staged, cloud, dry_run=dry_run, out=out)
    print(
        f"# equivalent gcloud command (spec in {spec_path}):\n"
        f"{submission.gcloud(cloud, spec_path)}",
        file=out,
    )
    if shape is not None:
        pools = submission.spec["workerPoolSpecs"]
        trainer_args = task_spec(pools[0]).get("args", [])
        worker_pool = pools[1] if shape.workers and len(pools) > 1 and pools[1] else pools[0]
        machine = worker_pool.get("machineSpec", {}).get("machineType")
        lines = estimate(shape, trainer_args, machine_type=machine)
        print("\n".join(f"# {line}" for line in lines), file=out)
    return None if dry_run else create_job(cloud, submission)


def write_yaml(path: str, spec: dict) -> None:
    import yaml

    storage.write_bytes(path, yaml.safe_dump(spec, sort_keys=False).encode())


def job_dirs(spec: dict) -> tuple[str, str]:
    """(job dir, model dir) of the trainer on Vertex AI, from the chief's args (its package's
    or its container's) and the base output directory, as the trainer resolves them
    (`trainer.storage.paths.OutputDirs`, with Vertex AI's AIP_CHECKPOINT_DIR and AIP_MODEL_DIR
    under the base: `<base>/checkpoints`, `<base>/model`). Cloud Storage FUSE paths
    (/gcs/BUCKET/...) are given as gs:// URIs.

    Raises:
        DeployError: the job dir is not in Cloud Storage, so no step could read the report.
    """
    task = task_spec(spec["workerPoolSpecs"][0], "workerPoolSpecs[0]")
    flags = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("job_dir", "checkpoint_dir", "model_dir"):
        flags.add_argument(f"--{flag}")
    args, _ = flags.parse_known_args(task.get("args", []))
    base = spec["baseOutputDirectory"]["outputUriPrefix"]
    outputs = paths.OutputDirs.resolve(
        job_dir=args.job_dir,
        checkpoint_dir=args.checkpoint_dir,
        model_dir=args.model_dir,
        aip_checkpoint_dir=paths.join(base, "checkpoints"),
        aip_model_dir=paths.join(base, "model"),
    )
    job_dir, model_dir = paths.as_gcs(outputs.job_dir), paths.as_gcs(outputs.model_dir)
    for flag, path in (("--job_dir", job_dir), ("--model_dir", model_dir)):
        if not path.startswith("gs://"):
            raise api.DeployError(
                f"{flag} ({path!r}) is not in Cloud Storage: the pipeline reads the job's "
                "report and model from there; pass gs://BUCKET/... or /gcs/BUCKET/... ."
            )
    return job_dir, model_dir
