"""Submit training: build the sdist, upload it to a bucket, and create a Vertex AI CustomJob
from `config.yaml` (chief, worker, ps and evaluator pools, a base output directory) and the job
options on the command line.

    python -m deploy.submit --project=P --staging_uri=gs://B/dist \\
        --output_dir=gs://B/runs/census-1 --extra_args=--train_data=gs://B/data/train.csv

Every pool's `packageUris` becomes the uploaded sdist; `--output_dir` sets
`baseOutputDirectory`; `--extra_args` are appended to every pool's args. Job options come from
config.yaml (as `gcloud ai custom-jobs create --config` takes them) or flags, which win: a
Vertex TensorBoard (`tensorboard`, with `serviceAccount`), `network`, `enableWebAccess`,
`scheduling` (`strategy` such as SPOT or FLEX_START, `timeout`, `maxWaitDuration`,
`restartJobOnWorkerRestart`, `disableRetries`), and per pool a machine type, GPUs (a pool with
a GPU runs the prebuilt tf-gpu image of the same version) and environment variables. All of it
is checked before anything is built or sent. The resolved spec is written next to the sdist,
and the equivalent `gcloud ai custom-jobs create` command printed. `--dry_run` also prints,
after the requests, the cost model's estimate of the job's training speed
(`trainer/placement/cost.py`) as `#` comment lines.
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
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from deploy import api, storage
from trainer.distribute.local import job_spec
from trainer.distribute.local.cluster import POOL_ROLES, ClusterShape
from trainer.errors import InputError
from trainer.placement import Placement, cost

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "config.yaml")
_SPEC_KEYS = {
    "workerPoolSpecs",
    "baseOutputDirectory",
    "scheduling",
    "tensorboard",
    "serviceAccount",
    "network",
    "enableWebAccess",
}
_SCHEDULING_KEYS = {
    "timeout",
    "maxWaitDuration",
    "restartJobOnWorkerRestart",
    "disableRetries",
    "strategy",
}
# Scheduling.strategy of the published v1 schema, less STRATEGY_UNSPECIFIED (a test compares).
STRATEGIES = ("ON_DEMAND", "LOW_COST", "STANDARD", "SPOT", "FLEX_START")
# The GPUs of MachineSpec.acceleratorType (the schema's TPU_* types need TPU images). The first
# five attach to N1 machine types; the others come with their own series (a2, a3, a4, g2, g4).
N1_GPUS = (
    "NVIDIA_TESLA_K80",
    "NVIDIA_TESLA_P100",
    "NVIDIA_TESLA_V100",
    "NVIDIA_TESLA_P4",
    "NVIDIA_TESLA_T4",
)
GPUS = N1_GPUS + (
    "NVIDIA_TESLA_A100",
    "NVIDIA_A100_80GB",
    "NVIDIA_L4",
    "NVIDIA_H100_80GB",
    "NVIDIA_H100_MEGA_80GB",
    "NVIDIA_H200_141GB",
    "NVIDIA_B200",
    "NVIDIA_GB200",
    "NVIDIA_RTX_PRO_6000",
)
# Machine series that take no GPU at all.
_GPU_FREE_SERIES = {"e2", "n2", "n2d", "n4", "c2", "c2d", "c3", "c3d", "c4", "t2d", "m1", "m2"}
_CPU_IMAGE = re.compile(r"^(?P<repo>[a-z0-9-]+-docker\.pkg\.dev/vertex-ai/training/)tf-cpu\.")
_DURATION = re.compile(r"^\d+(\.\d{1,9})?s$")
_FLAG_DURATION = re.compile(r"^(\d+)([smhd]?)$")
_SERVICE_ACCOUNT = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}@([a-z0-9-]+\.)*gserviceaccount\.com$")
_TENSORBOARD = re.compile(r"^projects/[^/]+/locations/(?P<region>[a-z0-9-]+)/tensorboards/\d+$")
_NETWORK = re.compile(r"^projects/\d+/global/networks/[a-z]([-a-z0-9]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by Vertex on every replica; a job that sets them would mislead the trainer.
_RESERVED_ENV = re.compile(r"^(TF_CONFIG|CLUSTER_SPEC|AIP_\w*|CLOUD_ML_\w*)$")
_PLACEHOLDER_PACKAGE = "x.tar.gz"
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
class JobOptions:
    """Job options from the command line; each overrides config.yaml's value.

    Per-pool values are `[POOL:]VALUE` strings, POOL one of chief, worker, ps, evaluator:
    `machine_types` and `accelerators` (`TYPE[:COUNT]`) default to the pools that train
    (chief and worker), `env` (`NAME=VALUE`) to every pool.
    """

    # The job
    tensorboard: str | None = None  # a resource name, or a TensorBoard id in the job's region
    service_account: str | None = None
    network: str | None = None
    enable_web_access: bool = False
    # Scheduling
    strategy: str | None = None
    timeout: str | None = None  # 3600, 3600s, 60m, 24h, 2d
    max_wait_duration: str | None = None
    restart_job_on_worker_restart: bool = False
    disable_retries: bool = False
    # Pools
    machine_types: tuple[str, ...] = ()
    accelerators: tuple[str, ...] = ()
    env: tuple[str, ...] = ()


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


def load_config(path: str = CONFIG) -> dict:
    """config.yaml as plain JSON values, read as the local launcher reads it
    (`trainer.distribute.local.job_spec`).

    Raises:
        DeployError: the file is missing, not YAML or not a CustomJobSpec.
    """
    try:
        return job_spec.load_job_spec(path)
    except InputError as e:
        raise api.DeployError(str(e)) from None


def resolve(
    spec: dict,
    *,
    package_uri: str,
    output_dir: str | None = None,
    extra_args: Sequence[str] = (),
    options: JobOptions = JobOptions(),
    cloud: api.Cloud | None = None,
) -> dict:
    """The spec with the sdist in every pool, the output directory, the extra args and the
    job options, checked.

    Args:
        spec: a CustomJobSpec (config.yaml's).
        package_uri: the uploaded sdist.
        output_dir: the base output directory (overrides the spec's).
        extra_args: trainer flags appended to every pool's args.
        options: job options from the command line (override the spec's).
        cloud: the job's project and region (a bare TensorBoard id needs them).

    Raises:
        DeployError: naming the key and value: a key deploy.submit does not take, a pool
            without the trainer package, a bad URI, service account, TensorBoard or network
            name, an unknown scheduling strategy or GPU, a GPU count without a type, a GPU the
            machine type cannot take, a malformed or reserved environment variable.
    """
    unknown = sorted(set(spec) - _SPEC_KEYS) + sorted(
        f"scheduling.{k}" for k in set(spec.get("scheduling", {})) - _SCHEDULING_KEYS
    )
    if unknown:
        raise api.DeployError(
            f"config key '{unknown[0]}' is not supported by deploy.submit "
            f"(it takes {', '.join(sorted(_SPEC_KEYS))}; scheduling takes "
            f"{', '.join(sorted(_SCHEDULING_KEYS))}); use the printed gcloud command for it."
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
    _apply_options(spec, options, cloud)
    _check_job(spec, cloud)
    for index, pool in enumerate(spec["workerPoolSpecs"]):
        if pool:
            _check_pool(pool, f"workerPoolSpecs[{index}]")
    return spec


def _apply_options(spec: dict, options: JobOptions, cloud: api.Cloud | None) -> None:
    if options.tensorboard:
        spec["tensorboard"] = _tensorboard_name(options.tensorboard, cloud)
    for key, value in (
        ("serviceAccount", options.service_account),
        ("network", options.network),
        ("enableWebAccess", options.enable_web_access or None),
    ):
        if value is not None:
            spec[key] = value
    scheduling = {
        "strategy": options.strategy and options.strategy.upper(),
        "timeout": options.timeout and _flag_duration("--timeout", options.timeout),
        "maxWaitDuration": options.max_wait_duration
        and _flag_duration("--max_wait_duration", options.max_wait_duration),
        "restartJobOnWorkerRestart": options.restart_job_on_worker_restart or None,
        "disableRetries": options.disable_retries or None,
    }
    for key, value in scheduling.items():
        if value is not None:
            spec.setdefault("scheduling", {})[key] = value
    pools = spec["workerPoolSpecs"]
    for value in options.machine_types:
        chosen, machine_type = _pools_of("--machine_type", value, pools, training=True)
        for pool in chosen:
            pool.setdefault("machineSpec", {})["machineType"] = machine_type
    for value in options.accelerators:
        chosen, accelerator = _pools_of("--accelerator", value, pools, training=True)
        kind, _, count = accelerator.partition(":")
        if count and not count.isdigit():
            raise api.DeployError(
                f"--accelerator={value}: the count ({count!r}) must be a whole number, "
                "as in --accelerator=NVIDIA_TESLA_T4:2."
            )
        for pool in chosen:
            machine = pool.setdefault("machineSpec", {})
            machine["acceleratorType"] = kind.upper()
            machine["acceleratorCount"] = int(count or 1)
    for value in options.env:
        name, equals, env_value = value.partition("=")
        if not equals:
            raise api.DeployError(f"--env={value} must be NAME=VALUE or POOL:NAME=VALUE.")
        chosen, named = _pools_of("--env", name, pools, training=False)
        for pool in chosen:
            env = pool["pythonPackageSpec"].setdefault("env", [])
            env[:] = [e for e in env if e.get("name") != named] + [
                {"name": named, "value": env_value}
            ]


def _pools_of(flag: str, value: str, pools: list, *, training: bool) -> tuple[list[dict], str]:
    """The pools a `[POOL:]VALUE` flag names (default: the training pools, or all), and VALUE."""
    head, colon, rest = value.partition(":")
    if colon and head in POOL_ROLES:
        pool = pools[POOL_ROLES.index(head)] if POOL_ROLES.index(head) < len(pools) else {}
        if not pool:
            raise api.DeployError(f"{flag}={value}: config.yaml has no {head} pool.")
        return [pool], rest
    if colon and head.isalpha() and head.islower():
        raise api.DeployError(
            f"{flag}={value}: {head!r} is not a pool; use one of {', '.join(POOL_ROLES)}."
        )
    chosen = pools[:2] if training else pools
    return [p for p in chosen if p], value


def _tensorboard_name(value: str, cloud: api.Cloud | None) -> str:
    if value.isdigit() and cloud is not None:
        return cloud.resource("tensorboards", value)
    return value


def _flag_duration(flag: str, value: str) -> str:
    match = _FLAG_DURATION.match(value.strip())
    if not match:
        raise api.DeployError(
            f"{flag} ({value!r}) must be a whole number of seconds, minutes, hours or days: "
            "3600, 3600s, 60m, 24h, 2d."
        )
    scale = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    return f"{int(match.group(1)) * scale}s"


def _check_job(spec: dict, cloud: api.Cloud | None) -> None:
    """The job-level options (from config.yaml or flags), each named with its value."""
    scheduling = spec.get("scheduling", {})
    if not isinstance(scheduling, dict):
        raise api.DeployError(f"scheduling ({scheduling!r}) must be a mapping.")
    strategy = scheduling.get("strategy")
    if strategy is not None and strategy not in STRATEGIES:
        raise api.DeployError(
            f"scheduling.strategy ({strategy!r}) is not a Vertex AI scheduling strategy; "
            f"choose from {', '.join(STRATEGIES)} (--strategy)."
        )
    for key in ("timeout", "maxWaitDuration"):
        value = scheduling.get(key)
        if value is not None and not _DURATION.match(str(value)):
            raise api.DeployError(
                f"scheduling.{key} ({value!r}) must be a duration in seconds, like 86400s."
            )
    flags = {
        "scheduling.restartJobOnWorkerRestart": scheduling.get("restartJobOnWorkerRestart"),
        "scheduling.disableRetries": scheduling.get("disableRetries"),
        "enableWebAccess": spec.get("enableWebAccess"),
    }
    for key, value in flags.items():
        if value is not None and not isinstance(value, bool):
            raise api.DeployError(f"{key} ({value!r}) must be true or false.")
    account = spec.get("serviceAccount")
    if account is not None and not _SERVICE_ACCOUNT.match(str(account)):
        raise api.DeployError(
            f"serviceAccount ({account!r}) is not a service account email such as "
            "trainer@MY_PROJECT.iam.gserviceaccount.com (--service_account)."
        )
    tensorboard = spec.get("tensorboard")
    if tensorboard is not None:
        match = _TENSORBOARD.match(str(tensorboard))
        if not match:
            raise api.DeployError(
                f"tensorboard ({tensorboard!r}) is not a Vertex AI TensorBoard: give its id or "
                "projects/PROJECT/locations/REGION/tensorboards/ID (--tensorboard)."
            )
        if cloud is not None and match.group("region") != cloud.region:
            raise api.DeployError(
                f"tensorboard ({tensorboard!r}) is in {match.group('region')}, the job in "
                f"{cloud.region}: Vertex AI needs them in one region (--region)."
            )
        if account is None:
            raise api.DeployError(
                f"tensorboard ({tensorboard!r}) needs a service account that may write to it "
                "and to the output bucket: pass --service_account=NAME@PROJECT.iam."
                "gserviceaccount.com."
            )
    network = spec.get("network")
    if network is not None and not _NETWORK.match(str(network)):
        raise api.DeployError(
            f"network ({network!r}) is not a VPC network name such as "
            "projects/PROJECT_NUMBER/global/networks/NAME (--network)."
        )


def _check_pool(pool: dict, where: str) -> None:
    """A pool's GPUs (type, count, machine type; the image follows) and environment."""
    machine = pool.get("machineSpec", {})
    kind, count = machine.get("acceleratorType"), machine.get("acceleratorCount")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise api.DeployError(
            f"{where}.machineSpec.acceleratorCount ({count!r}) must be a whole number."
        )
    if count and kind is None:
        raise api.DeployError(
            f"{where}.machineSpec.acceleratorCount ({count}) has no acceleratorType: name the "
            f"GPU (--accelerator=NVIDIA_TESLA_T4:{count})."
        )
    if kind is not None:
        if kind not in GPUS:
            raise api.DeployError(
                f"{where}.machineSpec.acceleratorType ({kind!r}) is not a Vertex AI GPU; "
                f"choose from {', '.join(GPUS)}."
            )
        machine.setdefault("acceleratorCount", 1)
        if machine["acceleratorCount"] < 1:
            raise api.DeployError(
                f"{where}.machineSpec.acceleratorCount ({count}) must be at least 1 with "
                f"acceleratorType {kind}."
            )
        machine_type = str(machine.get("machineType", ""))
        series = machine_type.split("-")[0]
        if (kind in N1_GPUS) != (series == "n1") or series in _GPU_FREE_SERIES:
            needs = "an n1-* machine type" if kind in N1_GPUS else "its own machine series"
            raise api.DeployError(
                f"{where}: machine type {machine_type!r} cannot take {kind} ({kind} needs "
                f"{needs}, e.g. {'n1-standard-8' if kind in N1_GPUS else 'a2-, a3-, g2-'}); "
                "set machineSpec.machineType or --machine_type."
            )
        package = pool["pythonPackageSpec"]
        image = _CPU_IMAGE.match(package.get("executorImageUri", ""))
        if image:  # the prebuilt CPU image of a version has a GPU twin
            package["executorImageUri"] = package["executorImageUri"].replace(
                "/tf-cpu.", "/tf-gpu.", 1
            )
    for entry in pool["pythonPackageSpec"].get("env", []):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not _ENV_NAME.match(name) or set(entry) - {"name", "value"}:
            raise api.DeployError(
                f"{where}.pythonPackageSpec.env entry {entry!r} must be {{name: NAME, value: "
                "VALUE}} with a NAME of letters, digits and underscores (--env=NAME=VALUE)."
            )
        if _RESERVED_ENV.match(name):
            raise api.DeployError(
                f"{where}: environment variable {name} is set by Vertex AI on every replica; "
                "choose another name."
            )
        entry["value"] = str(entry.get("value", ""))


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


J = TypeVar("J", bound=Job)


@dataclasses.dataclass(frozen=True)
class Staged(Generic[J]):
    """The sdist built (not yet uploaded), where it goes, and the job that runs it."""

    sdist: str
    package_uri: str
    job: J


def stage(
    cloud: api.Cloud,
    make: Callable[[dict], J],
    *,
    staging_uri: str,
    config: str = CONFIG,
    output_dir: str | None = None,
    extra_args: Sequence[str] = (),
    options: JobOptions = JobOptions(),
    dist_dir: str | None = None,
) -> Staged[J]:
    """Checks everything, then builds the sdist: the job of config.yaml (and the options) is
    made and its body checked with a placeholder package before the build, so bad input fails
    before any work; then again with the real package URI.

    Args:
        cloud: the project, region and API endpoint.
        make: the job of a resolved CustomJobSpec (a Submission; deploy.tune's tuning job).
        staging_uri: gs:// folder the sdist goes to.
        config, output_dir, extra_args, options: as `resolve` takes them.
        dist_dir: where the sdist is built (default: a temporary folder).

    Returns:
        What was built and where it goes, and the job.

    Raises:
        DeployError: bad input, before the build.
    """
    api.gcs_uri("--staging_uri", staging_uri)
    spec = load_config(config)

    def job_of(package_uri: str) -> J:
        job = make(
            resolve(
                spec,
                package_uri=package_uri,
                output_dir=output_dir,
                extra_args=extra_args,
                options=options,
                cloud=cloud,
            )
        )
        job.body()  # the client library's own check of every field
        return job

    job_of(f"{staging_uri.rstrip('/')}/{_PLACEHOLDER_PACKAGE}")
    sdist = build_sdist(dist_dir or tempfile.mkdtemp(prefix="trainer-sdist-"))
    package_uri = f"{staging_uri.rstrip('/')}/{os.path.basename(sdist)}"
    return Staged(sdist, package_uri, job_of(package_uri))


def send_or_show(staged: Staged, cloud: api.Cloud, *, dry_run: bool, out) -> None:
    """Prints the upload and the job's request (dry run), or uploads the sdist."""
    if dry_run:
        api.show([upload_request(staged.sdist, staged.package_uri), staged.job.request(cloud)], out)
    else:
        storage.upload_file(staged.sdist, staged.package_uri)


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
    staging_uri: str,
    display_name: str,
    output_dir: str | None = None,
    extra_args: Sequence[str] = (),
    options: JobOptions = JobOptions(),
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
        options: TensorBoard, service account, scheduling, GPUs, environment (override
            config.yaml's).
        config: the CustomJobSpec in YAML.
        dist_dir: where the sdist is built (default: a temporary folder).
        dry_run: print the requests and the gcloud equivalent; send nothing.
        out: where the dry run prints (default: stdout).

    Returns:
        The created CustomJob (the client library's message, not waited for); None for a
        dry run.

    Raises:
        DeployError: a bad config, URI, key or option, before anything is built or sent.
    """
    out = out or sys.stdout
    shape = _shape(config) if dry_run else None
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
    spec_path = os.path.join(dist_dir, f"custom-job-{display_name}.yaml")
    write_yaml(spec_path, submission.body()["jobSpec"])
    send_or_show(staged, cloud, dry_run=dry_run, out=out)
    print(
        f"# equivalent gcloud command (spec in {spec_path}):\n"
        f"{submission.gcloud(cloud, spec_path)}",
        file=out,
    )
    if shape is not None:
        pools = submission.spec["workerPoolSpecs"]
        trainer_args = pools[0]["pythonPackageSpec"]["args"]
        worker_pool = pools[1] if shape.workers and len(pools) > 1 and pools[1] else pools[0]
        machine = worker_pool.get("machineSpec", {}).get("machineType")
        lines = estimate(shape, trainer_args, machine_type=machine)
        print("\n".join(f"# {line}" for line in lines), file=out)
    return None if dry_run else create_job(cloud, submission)


def machine_vcpus(machine_type: str | None) -> int | None:
    """The vCPUs a Compute Engine machine type's name gives (`n1-standard-8`: 8), or None."""
    match = re.fullmatch(r"[a-z0-9]+-[a-z]+-(\d+)", machine_type or "")
    return int(match.group(1)) if match else None


def estimate(
    shape: ClusterShape, trainer_args: Sequence[str], *, machine_type: str | None = None
) -> list[str]:
    """The cost model's estimate of a job's training speed, in lines of text.

    Args:
        shape: the job's workers and parameter servers (config.yaml's pools [1] and [2]).
        trainer_args: the chief's args; --placement, --batch_size, --steps_per_loop,
            --chunk_secs, --max_iteration_steps and --optimizer are read, the trainer's
            defaults otherwise.
        machine_type: the workers' machine type (its vCPUs scale the examples/s; efficiency
            and speedup do not depend on them).

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
    vcpus = machine_vcpus(machine_type)
    cores = (
        f"{machine_type}'s {vcpus} vCPUs per replica, each counted as one core of the fit (an "
        "upper bound: a small model keeps few cores busy)"
        if vcpus
        else "one core per replica (no machine type with a vCPU count)"
    )
    head = [
        "estimate of the training speed (trainer/placement/cost.py, fitted on a simulated "
        "cluster, a host of its own per replica: bench/cluster.py --simulate):",
        f"examples/s for {cores}; the default search's model on census.",
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
            replica_cores=vcpus or 1,
        )
    except ValueError as e:
        return [f"no estimate of the training speed: {e}"]
    p = cost.predict(job, cost.SIMULATED_PARAMS)
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


def write_yaml(path: str, spec: dict) -> None:
    import yaml

    storage.write_bytes(path, yaml.safe_dump(spec, sort_keys=False).encode())


def add_job_flags(p: argparse.ArgumentParser, *, display_name: str) -> None:
    """The flags of the job's package, config and options (deploy.submit's, deploy.tune's)."""
    p.add_argument("--staging_uri", required=True, help="gs:// folder for the sdist.")
    p.add_argument("--display_name", default=display_name, help="The job's display name.")
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
    job = p.add_argument_group("job options (override config.yaml's)")
    job.add_argument(
        "--tensorboard",
        help="Vertex AI TensorBoard: an id in --region or projects/P/locations/R/tensorboards/ID "
        "(needs --service_account); the job gets AIP_TENSORBOARD_LOG_DIR.",
    )
    job.add_argument("--service_account", help="The job's service account email.")
    job.add_argument("--network", help="projects/PROJECT_NUMBER/global/networks/NAME to peer.")
    job.add_argument(
        "--enable_web_access", action="store_true", help="Interactive shells on the replicas."
    )
    job.add_argument("--strategy", help=f"Scheduling strategy: {', '.join(STRATEGIES)}.")
    job.add_argument("--timeout", help="The job's time limit: 3600, 3600s, 60m, 24h, 2d.")
    job.add_argument(
        "--max_wait_duration", help="How long to wait for resources (FLEX_START), as --timeout."
    )
    job.add_argument(
        "--restart_job_on_worker_restart",
        action="store_true",
        help="Restart every replica when one restarts.",
    )
    job.add_argument(
        "--disable_retries", action="store_true", help="Fail the job instead of retrying it."
    )
    for flag, example, default in (
        ("machine_type", "n1-standard-8", "chief and worker"),
        ("accelerator", "NVIDIA_TESLA_T4:1", "chief and worker"),
        ("env", "NAME=VALUE", "every"),
    ):
        job.add_argument(
            f"--{flag}",
            action="append",
            default=[],
            help=f"[POOL:]{example}, POOL one of {', '.join(POOL_ROLES)} (default: the "
            f"{default} pools); repeat the flag.",
        )


def job_options(args: argparse.Namespace) -> JobOptions:
    return JobOptions(
        tensorboard=args.tensorboard,
        service_account=args.service_account,
        network=args.network,
        enable_web_access=args.enable_web_access,
        strategy=args.strategy,
        timeout=args.timeout,
        max_wait_duration=args.max_wait_duration,
        restart_job_on_worker_restart=args.restart_job_on_worker_restart,
        disable_retries=args.disable_retries,
        machine_types=tuple(args.machine_type),
        accelerators=tuple(args.accelerator),
        env=tuple(args.env),
    )


def job_arguments(args: argparse.Namespace) -> dict:
    """The keyword arguments of `submit` (and `deploy.tune.tune`) that `add_job_flags` and
    `api.add_cloud_flags` parsed, the cloud among them."""
    return dict(
        cloud=api.cloud_from(args),
        staging_uri=args.staging_uri,
        display_name=args.display_name,
        output_dir=args.output_dir,
        extra_args=args.extra_args,
        options=job_options(args),
        config=args.config,
        dist_dir=args.dist_dir,
        dry_run=args.dry_run,
    )


def _run(argv: list[str] | None) -> int:
    p = api.parser(__doc__.split("\n\n")[0])
    api.add_cloud_flags(p)
    add_job_flags(p, display_name="adanet-census")
    job = submit(**job_arguments(p.parse_args(argv)))
    if job is not None:
        print(job.name)
    return 0


main = api.main_of(_run)

if __name__ == "__main__":
    sys.exit(main())
