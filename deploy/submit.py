"""Submit training: create a Vertex AI CustomJob from `config.yaml` (chief, worker, ps and
evaluator pools, a base output directory) and the job options on the command line, building and
uploading the trainer's sdist first when a pool runs it.

    python -m deploy.submit --project=P --output_dir=gs://B/runs/census-1 \\
        --extra_args=--train_data=gs://B/data/train.csv
    python -m deploy.submit --project=P --output_dir=gs://B/runs/census-1 \\
        --image_uri=us-central1-docker.pkg.dev/P/adanet/trainer-cpu:0.2.0
    python -m deploy.submit --project=P --staging_uri=gs://B/dist \\
        --output_dir=gs://B/runs/census-1 --config=my-package-job.yaml

A pool runs either the trainer's own image (`containerSpec`, built from
`deploy/container/Dockerfile`, whose entry point is `python -m trainer.task`: config.yaml's
pools, `us-central1-docker.pkg.dev/PROJECT/adanet/trainer-cpu:0.1.0`) or the sdist on a prebuilt
image (`pythonPackageSpec`: its `packageUris` become the sdist uploaded to `--staging_uri`).
A literal `PROJECT` segment right after the registry host of a config's `imageUri` is the
placeholder of the project the image was pushed to: it becomes `--project` when that is a
project id, as Artifact Registry's paths name it (with a project number the command stops and
asks for the image).
`--image_uri=[POOL:]IMAGE` runs the pools (default: all) as containerSpec pools of IMAGE
instead. When no pool runs the sdist none is built or uploaded, and `--staging_uri` may be left
out. `--output_dir` sets `baseOutputDirectory`; `--extra_args` are appended to every pool's
args. Job options come from config.yaml (as `gcloud ai custom-jobs create --config` takes them)
or flags, which win: a Vertex TensorBoard (`tensorboard`, with `serviceAccount`), `network`,
`enableWebAccess`, `scheduling` (`strategy` such as SPOT or FLEX_START, `timeout`,
`maxWaitDuration`, `restartJobOnWorkerRestart`, `disableRetries`), and per pool a machine
type, GPUs and environment variables. A pool with a GPU runs the GPU twin of its image: the
prebuilt tf-gpu image of the same version for tf-cpu, the trainer's `trainer-gpu` build of the
same tag for `trainer-cpu`; any other image stays as named. All of it is checked before
anything is built or sent. The resolved spec is written to `--dist_dir`, and the equivalent
`gcloud ai custom-jobs create` command printed. A pool whose prebuilt image is past its end of
availability, or within six months of it (`deploy/vertex/images.py`), gets a warning on stderr
naming the date and what to use instead. `--dry_run` also prints, after the requests, the cost
model's estimate of the job's training speed (`trainer/placement/cost.py`) as `#` comment
lines.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
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

from deploy.vertex import api, images, job_spec, storage
from trainer.distribute.cluster import POOL_ROLES, TASK_SPECS, ClusterShape, task_spec_key
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
# What a pool runs: the sdist on a prebuilt image, or an image of its own.
# An image reference as Docker reads it: a lowercase registry host and path, then a tag or a
# digest (a placeholder such as PROJECT, in capitals, is not one).
_IMAGE_URI = re.compile(
    r"^[a-z0-9]+([.-][a-z0-9]+)*(:\d+)?(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)+"
    r"(:\w[\w.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)
# The module the trainer image's entry point runs (deploy/container/Dockerfile).
IMAGE_MODULE = "trainer.task"
# config.yaml's image: the placeholder of the project it was pushed to, right after the host.
PROJECT_PLACEHOLDER = "PROJECT"
_PLACEHOLDER_IMAGE = re.compile(rf"^(?P<host>[^/]+)/{PROJECT_PLACEHOLDER}/")
_PROJECT_ID = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
# The trainer's CPU build (docs/deploy.md#custom-containers) and its GPU twin, of one tag.
_TRAINER_CPU = re.compile(r"^(?P<path>.+/trainer)-cpu(?P<tag>:[\w.-]+)?$")
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
    (chief and worker), `env` (`NAME=VALUE`) and `image_uris` (an image built from
    `deploy/container/Dockerfile`) to every pool.
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
    image_uris: tuple[str, ...] = ()  # [POOL:]IMAGE: run the pool as a containerSpec


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
    (`deploy.vertex.job_spec`).

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
    pools = spec["workerPoolSpecs"]
    for index, pool in enumerate(pools):
        if pool:  # not a skipped pool
            _fill_project(task_spec(pool, f"workerPoolSpecs[{index}]"), cloud)
    _use_images(pools, options.image_uris)
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
    _apply_options(spec, options, cloud)
    _check_job(spec, cloud)
    for index, pool in enumerate(spec["workerPoolSpecs"]):
        if pool:
            _check_pool(pool, f"workerPoolSpecs[{index}]")
    return spec


def task_spec(pool: dict, where: str = "the pool") -> dict:
    """What a pool runs: its pythonPackageSpec (the sdist on a prebuilt image) or its
    containerSpec (an image whose entry point runs the trainer), whichever it has.

    Raises:
        DeployError: the pool has neither or both, or it is not a mapping.
    """
    return pool[task_key(pool, where)]


def task_key(pool: dict, where: str = "the pool") -> str:
    """Which of TASK_SPECS the pool has (`task_spec`'s key): the rule the local cluster
    reads config.yaml by (`trainer.distribute.cluster.task_spec_key`), as a DeployError."""
    try:
        return task_spec_key(pool, where)
    except InputError as e:
        raise api.DeployError(str(e)) from None


def needs_package(spec: dict) -> bool:
    """Whether a pool of the spec runs the sdist (a pythonPackageSpec), so it must be built."""
    return any(pool and "pythonPackageSpec" in pool for pool in spec["workerPoolSpecs"])


def _fill_project(task: dict, cloud: api.Cloud | None) -> None:
    """A containerSpec's `HOST/PROJECT/...` image with the job's project in the placeholder,
    when `--project` is a project id (Artifact Registry's paths name the id, not the number);
    left as it is otherwise, for `_check_container` to refuse."""
    image = task.get("imageUri")
    if cloud is not None and isinstance(image, str) and _PROJECT_ID.match(cloud.project):
        task["imageUri"] = _PLACEHOLDER_IMAGE.sub(rf"\g<host>/{cloud.project}/", image, count=1)


def _use_images(pools: list, values: Sequence[str]) -> None:
    """`--image_uri=[POOL:]IMAGE`: the pools become containerSpec pools of IMAGE with their
    args and environment (the image's entry point is `python -m trainer.task`; another
    pythonModule becomes the container's command)."""
    for value in values:
        chosen, image = _pools_of("--image_uri", value, pools, training=False)
        if _PLACEHOLDER_IMAGE.match(image):
            raise api.DeployError(
                f"--image_uri={value}: {PROJECT_PLACEHOLDER} is config.yaml's placeholder; name "
                "the image you pushed, as in --image_uri=us-central1-docker.pkg.dev/"
                "YOUR_PROJECT/adanet/trainer-cpu:0.1.0."
            )
        for pool in chosen:
            package = pool.pop("pythonPackageSpec", None)
            container = pool.setdefault("containerSpec", {})
            if package is not None:
                container.update({k: package[k] for k in ("args", "env") if k in package})
                module = package.get("pythonModule", IMAGE_MODULE)
                if module != IMAGE_MODULE:
                    container["command"] = ["python", "-m", module]
            container["imageUri"] = image


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
            env = task_spec(pool).setdefault("env", [])
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
    if colon and head.isalpha() and head.islower() and not re.match(r"\d+/", rest):  # host:port/
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
    """A pool's GPUs (type, count, machine type; its image's GPU twin follows), image, args
    and environment."""
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
        _use_gpu_twin(pool)
    kind = next(key for key in TASK_SPECS if key in pool)
    task = pool[kind]
    if kind == "containerSpec":
        _check_container(task, f"{where}.containerSpec")
    for entry in task.get("env", []):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not _ENV_NAME.match(name) or set(entry) - {"name", "value"}:
            raise api.DeployError(
                f"{where}.{kind}.env entry {entry!r} must be {{name: NAME, value: "
                "VALUE}} with a NAME of letters, digits and underscores (--env=NAME=VALUE)."
            )
        if _RESERVED_ENV.match(name):
            raise api.DeployError(
                f"{where}: environment variable {name} is set by Vertex AI on every replica; "
                "choose another name."
            )
        entry["value"] = str(entry.get("value", ""))


def _use_gpu_twin(pool: dict) -> None:
    """A GPU pool's image as its GPU build: the prebuilt tf-gpu image of a tf-cpu one, the
    trainer's `trainer-gpu` of a `trainer-cpu` image of the same tag (not of a digest, which
    names one build). Any other image has no known twin and stays as named."""
    package = pool.get("pythonPackageSpec", {})
    executor = package.get("executorImageUri")
    if isinstance(executor, str) and _CPU_IMAGE.match(executor):
        package["executorImageUri"] = executor.replace("/tf-cpu.", "/tf-gpu.", 1)
    container = pool.get("containerSpec", {})
    image = container.get("imageUri")
    trainer = _TRAINER_CPU.match(image) if isinstance(image, str) else None
    if trainer:
        container["imageUri"] = f"{trainer.group('path')}-gpu{trainer.group('tag') or ''}"


def _check_container(container: dict, where: str) -> None:
    """A containerSpec's image (a real reference, not a placeholder), command and args."""
    image = container.get("imageUri")
    if isinstance(image, str) and _PLACEHOLDER_IMAGE.match(image):
        raise api.DeployError(
            f"{where}.imageUri ({image!r}) still holds the placeholder {PROJECT_PLACEHOLDER}, "
            "which deploy.submit fills in with --project only when that is a project id (not "
            "a number): pass --project=YOUR_PROJECT_ID, or --image_uri=IMAGE, or write your "
            'image into config.yaml (build and push it first: docs/deploy.md, "Custom '
            'containers").'
        )
    if not isinstance(image, str) or not _IMAGE_URI.match(image):
        raise api.DeployError(
            f"{where}.imageUri ({image!r}) is not an image reference (a lowercase "
            "REGISTRY/PATH[:TAG|@sha256:DIGEST], such as us-central1-docker.pkg.dev/"
            "my-project/adanet/trainer-cpu:0.1.0): build and push the trainer's image "
            "(deploy/container/Dockerfile) and give its URI (--image_uri)."
        )
    for key in ("command", "args"):
        value = container.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise api.DeployError(f"{where}.{key} ({value!r}) must be a list of strings.")


def image_warnings(spec: dict, *, today: datetime.date) -> list[str]:
    """A warning for each prebuilt image of the spec's pools (an executor image, or a
    container's image) that is past its end of availability on `today`, or within six months
    of it, naming the pools that use it (`deploy.vertex.images.warning`); none for images with time
    left or custom ones."""
    pools_of: dict[str, list[str]] = {}
    for index, pool in enumerate(spec.get("workerPoolSpecs", [])):
        task = task_spec(pool, f"workerPoolSpecs[{index}]") if pool else {}
        uri = task.get("executorImageUri") or task.get("imageUri")
        if isinstance(uri, str) and uri:
            pools_of.setdefault(uri, []).append(f"workerPoolSpecs[{index}]")
    found = ((pools, images.warning(uri, today=today)) for uri, pools in pools_of.items())
    return [f"{', '.join(pools)}: {text}" for pools, text in found if text]


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
    """The flags of the job's config, package, images and options (deploy.submit's,
    deploy.tune's, deploy.pipeline's)."""
    p.add_argument(
        "--staging_uri",
        help="gs:// folder the sdist is uploaded to; needed only if a pool runs it "
        "(pythonPackageSpec), not for config.yaml's containerSpec pools.",
    )
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
    job.add_argument(
        "--image_uri",
        action="append",
        default=[],
        help="[POOL:]IMAGE: run the pools (default: every pool) as containerSpec pools of "
        "the trainer's image built from deploy/container/Dockerfile, with their args and env, "
        "instead of config.yaml's image (its PROJECT placeholder is filled with --project); "
        "no sdist is built when no pool needs it. Repeat the flag: "
        "--image_uri=.../trainer-gpu:0.1.0 --image_uri=ps:.../trainer-cpu:0.1.0.",
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
        image_uris=tuple(args.image_uri),
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
