"""`config.yaml`: the Vertex AI CustomJobSpec that `gcloud ai custom-jobs create --config`
takes, read once for both the local launcher (`deploy/launch.py`: pool sizes, the chief's args
and module, `read_job_config`) and the Vertex jobs (`custom_job.py`: the spec it sends,
`load_config`). Every shape error names the file and the pool."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import yaml

from deploy.cloud import api
from trainer.distribute.cluster import POOL_ROLES, ClusterShape, task_spec_key
from trainer.errors import InputError


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """What the launcher takes from a Vertex CustomJobSpec."""

    shape: ClusterShape
    args: tuple[str, ...]
    module: str | None  # pool 0's pythonPackageSpec.pythonModule (None for a containerSpec)


def _replica_count(pool: dict, position: int, path: str) -> int:
    """A pool's replicaCount (Vertex writes int64 as a string in JSON; a stated pool without
    a count has one replica, as in gcloud's --worker-pool-spec)."""
    if not pool:
        return 0
    value = pool.get("replicaCount", 1)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(
            f"{path}: workerPoolSpecs[{position}].replicaCount ({value!r}) must be an integer >= 0."
        )
    return value


def _task_spec(pool: dict, position: int, path: str) -> dict:
    """The pool's pythonPackageSpec or containerSpec (exactly one must be there)."""
    return pool[task_spec_key(pool, f"{path}: workerPoolSpecs[{position}]")]


def _pool_args(spec: dict, path: str) -> tuple[str, ...]:
    args = spec.get("args") or []
    if not isinstance(args, list) or any(isinstance(a, (dict, list)) for a in args):
        raise InputError(f"{path}: workerPoolSpecs[0] args ({args!r}) must be a list of strings.")
    return tuple(str(a) for a in args)


def _load_yaml(path: str) -> object:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"--config={path}: no such file.") from None
    except OSError as e:
        raise InputError(f"--config={path}: cannot read it ({e.strerror}).") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InputError(f"--config={path}: not valid YAML ({e}).") from None


def _worker_pool_specs(spec: object, path: str) -> list[dict]:
    """The workerPoolSpecs list of a CustomJobSpec, checked for shape."""
    if isinstance(spec, dict) and "jobSpec" in spec and "workerPoolSpecs" not in spec:
        raise InputError(
            f"{path}: this is a CustomJob, not a CustomJobSpec; gcloud's --config "
            "takes the spec: move the contents of jobSpec to the top level."
        )
    if not isinstance(spec, dict) or not isinstance(spec.get("workerPoolSpecs"), list):
        raise InputError(
            f"{path}: not a Vertex AI CustomJobSpec: it needs a top-level "
            "`workerPoolSpecs` list (pools [0] chief, [1] workers, [2] ps, "
            "[3] evaluator)."
        )
    pools = spec["workerPoolSpecs"]
    if not 1 <= len(pools) <= len(POOL_ROLES):
        raise InputError(
            f"{path}: workerPoolSpecs has {len(pools)} pools; Vertex takes 1 to "
            f"{len(POOL_ROLES)} (chief, workers, ps, evaluator)."
        )
    for position, pool in enumerate(pools):
        if pool is not None and not isinstance(pool, dict):
            raise InputError(
                f"{path}: workerPoolSpecs[{position}] must be a mapping "
                "(`{}` for an unused pool)."
            )
    return [pool or {} for pool in pools] + [{}] * (len(POOL_ROLES) - len(pools))


def load_job_spec(path: str) -> dict:
    """The CustomJobSpec in a YAML file, checked for shape.

    Args:
        path: a local YAML file, e.g. the repository's `config.yaml`.

    Returns:
        The spec as plain JSON values (YAML anchors expanded into independent copies).

    Raises:
        InputError: the file is missing, not YAML, or not a CustomJobSpec (no
            `workerPoolSpecs` list of 1 to 4 mappings).
    """
    spec = _load_yaml(path)
    _worker_pool_specs(spec, path)
    return json.loads(json.dumps(spec))


def read_job_config(path: str) -> JobConfig:
    """What the local launcher takes from a CustomJobSpec in YAML (`config.yaml`).

    Args:
        path: the YAML file.

    Returns:
        The pool sizes as a `ClusterShape`, and pool 0's args and Python module.

    Raises:
        InputError: the file is missing, not YAML, not a CustomJobSpec, a pool has a bad
            replicaCount or not exactly one of pythonPackageSpec and containerSpec, or its
            chief pool does not have exactly one replica.
    """
    pools = _worker_pool_specs(load_job_spec(path), path)
    counts = [_replica_count(pool, i, path) for i, pool in enumerate(pools)]
    if counts[0] != 1:
        raise InputError(
            f"{path}: workerPoolSpecs[0].replicaCount ({counts[0]}) must be 1: "
            "pool 0 is the chief, and a job has exactly one."
        )
    for position, pool in enumerate(pools):
        if pool:
            _task_spec(pool, position, path)
    chief_spec = _task_spec(pools[0], 0, path)
    return JobConfig(
        shape=ClusterShape(workers=counts[1], ps=counts[2], evaluator=counts[3] >= 1),
        args=_pool_args(chief_spec, path),
        module=chief_spec.get("pythonModule"),
    )


# The checkout this package runs from (deploy/vertex/ is two folders below it).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


CONFIG = os.path.join(REPO, "config.yaml")


def load_config(path: str = CONFIG) -> dict:
    """config.yaml as plain JSON values (`load_job_spec`, as the local launcher reads it), its
    errors the deploy commands' DeployError.

    Raises:
        DeployError: the file is missing, not YAML or not a CustomJobSpec.
    """
    try:
        return load_job_spec(path)
    except InputError as e:
        raise api.DeployError(str(e)) from None


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
