"""A resolved CustomJobSpec checked before anything is built or sent: the job-level options
(`check_job`: scheduling, durations, service account, TensorBoard, network) and each pool
(`check_pool`: machine type, GPUs and the GPU twin of its image, environment, image URI), each
error naming the key and its value; `image_warnings` for prebuilt images past or near their
end of availability."""

from __future__ import annotations

import datetime
import re

from deploy.cloud import api
from deploy.vertex import images
from deploy.vertex.job_options import PLACEHOLDER_IMAGE, PROJECT_PLACEHOLDER, STRATEGIES
from deploy.vertex.job_spec import task_spec
from trainer.distribute.cluster import TASK_SPECS

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


# The trainer's CPU build (docs/deploy.md#custom-containers) and its GPU twin, of one tag.
_TRAINER_CPU = re.compile(r"^(?P<path>.+/trainer)-cpu(?P<tag>:[\w.-]+)?$")


_DURATION = re.compile(r"^\d+(\.\d{1,9})?s$")


_SERVICE_ACCOUNT = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}@([a-z0-9-]+\.)*gserviceaccount\.com$")


_TENSORBOARD = re.compile(r"^projects/[^/]+/locations/(?P<region>[a-z0-9-]+)/tensorboards/\d+$")


_NETWORK = re.compile(r"^projects/\d+/global/networks/[a-z]([-a-z0-9]*[a-z0-9])?$")


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# Set by Vertex on every replica; a job that sets them would mislead the trainer.
_RESERVED_ENV = re.compile(r"^(TF_CONFIG|CLUSTER_SPEC|AIP_\w*|CLOUD_ML_\w*)$")


def check_job(spec: dict, cloud: api.Cloud | None) -> None:
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
    ranges = spec.get("reservedIpRanges")
    if ranges is not None:
        if not isinstance(ranges, list) or not all(isinstance(r, str) and r for r in ranges):
            raise api.DeployError(
                f"reservedIpRanges ({ranges!r}) must be a list of IP range names "
                "(--reserved_ip_range)."
            )
        if network is None:
            raise api.DeployError(
                f"reservedIpRanges ({', '.join(ranges)}) are ranges of a VPC network: give it "
                "with --network=projects/PROJECT_NUMBER/global/networks/NAME."
            )


def check_pool(pool: dict, where: str) -> None:
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
    if isinstance(image, str) and PLACEHOLDER_IMAGE.match(image):
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
