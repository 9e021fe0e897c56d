"""The job options: each one's flag (`add_job_flags`, shared by deploy.submit, deploy.tune and
deploy.pipeline), its field of `JobOptions`, and where it goes in the CustomJobSpec
(`apply_options`, `use_images`); config.yaml's keys that deploy.submit takes (`SPEC_KEYS`,
`SCHEDULING_KEYS`). A new Vertex job option is written here alone (its value's check, if it
needs one, in `checks.py`)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Sequence

from deploy.cloud import api
from deploy.vertex.job_spec import CONFIG, REPO, task_spec
from trainer.distribute.cluster import POOL_ROLES

SPEC_KEYS = {
    "workerPoolSpecs",
    "baseOutputDirectory",
    "scheduling",
    "tensorboard",
    "serviceAccount",
    "network",
    "reservedIpRanges",
    "enableWebAccess",
}
SCHEDULING_KEYS = {
    "timeout",
    "maxWaitDuration",
    "restartJobOnWorkerRestart",
    "disableRetries",
    "strategy",
}


# Scheduling.strategy of the published v1 schema, less STRATEGY_UNSPECIFIED (a test compares).
STRATEGIES = ("ON_DEMAND", "LOW_COST", "STANDARD", "SPOT", "FLEX_START")


# The module the trainer image's entry point runs (deploy/container/Dockerfile).
IMAGE_MODULE = "trainer.task"


# config.yaml's image: the placeholder of the project it was pushed to, right after the host.
PROJECT_PLACEHOLDER = "PROJECT"


PLACEHOLDER_IMAGE = re.compile(rf"^(?P<host>[^/]+)/{PROJECT_PLACEHOLDER}/")


_PROJECT_ID = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")


_FLAG_DURATION = re.compile(r"^(\d+)([smhd]?)$")


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
    reserved_ip_ranges: tuple[str, ...] = ()  # names of ranges reserved in `network`
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


def fill_project(task: dict, cloud: api.Cloud | None) -> None:
    """A containerSpec's `HOST/PROJECT/...` image with the job's project in the placeholder,
    when `--project` is a project id (Artifact Registry's paths name the id, not the number);
    left as it is otherwise, for `_check_container` to refuse."""
    image = task.get("imageUri")
    if cloud is not None and isinstance(image, str) and _PROJECT_ID.match(cloud.project):
        task["imageUri"] = PLACEHOLDER_IMAGE.sub(rf"\g<host>/{cloud.project}/", image, count=1)


def use_images(pools: list, values: Sequence[str]) -> None:
    """`--image_uri=[POOL:]IMAGE`: the pools become containerSpec pools of IMAGE with their
    args and environment (the image's entry point is `python -m trainer.task`; another
    pythonModule becomes the container's command)."""
    for value in values:
        chosen, image = _pools_of("--image_uri", value, pools, training=False)
        if PLACEHOLDER_IMAGE.match(image):
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


def apply_options(spec: dict, options: JobOptions, cloud: api.Cloud | None) -> None:
    if options.tensorboard:
        spec["tensorboard"] = _tensorboard_name(options.tensorboard, cloud)
    for key, value in (
        ("serviceAccount", options.service_account),
        ("network", options.network),
        ("reservedIpRanges", list(options.reserved_ip_ranges) or None),
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
        "--reserved_ip_range",
        action="append",
        default=[],
        help="The name of an IP range reserved in --network for the job's replicas (repeat "
        "the flag); without it Vertex picks any range of the network.",
    )
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
        reserved_ip_ranges=tuple(args.reserved_ip_range),
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
