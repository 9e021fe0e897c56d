"""This replica's role and its cluster, from Vertex AI's `TF_CONFIG` (or `CLUSTER_SPEC`).

`parse(tf_config, cluster_spec)` is the one function that turns those variables into a frozen
`Cluster`; it fails with an `InputError` naming the bad key. Vertex's shapes (as Vertex AI
documents them for custom training): `cluster` holds `chief` (legacy: `master`), `worker` and
`ps`; the evaluator is never in `cluster` and only its `task` says `evaluator`; `task.trial` is a
string under hyperparameter tuning. `CLUSTER_SPEC` carries the same pools as `workerpool0..3`.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from trainer.errors import InputError

CHIEF, WORKER, PS, EVALUATOR = "chief", "worker", "ps", "evaluator"
# Vertex AI's roles by pool: workerPoolSpecs[i] holds the replicas of POOL_ROLES[i], named
# workerpool<i> in TF_CONFIG (the local cluster and deploy/ read them here too).
POOL_ROLES = (CHIEF, WORKER, PS, EVALUATOR)
_ROLES = POOL_ROLES
_ALIASES = {"master": CHIEF}
_POOLS = {f"workerpool{i}": role for i, role in enumerate(POOL_ROLES)}
# What a pool of a CustomJobSpec runs: exactly one of these.
TASK_SPECS = ("pythonPackageSpec", "containerSpec")


def task_spec_key(pool: dict, where: str) -> str:
    """Which of TASK_SPECS the pool `where` (e.g. "workerPoolSpecs[0]") has; InputError
    unless exactly one, a mapping."""
    found = [key for key in TASK_SPECS if key in pool]
    if len(found) != 1 or not isinstance(pool[found[0]], dict):
        raise InputError(
            f"{where} needs exactly one of pythonPackageSpec (the sdist on a prebuilt image) or "
            f"containerSpec (the trainer's image, --image_uri), as a mapping; it has "
            f"{' and '.join(found) or 'neither'}."
        )
    return found[0]


@dataclasses.dataclass(frozen=True)
class Task:
    """One replica: its role (`chief`, `worker`, `ps`, `evaluator`) and index in the role."""

    role: str
    index: int = 0

    def __post_init__(self):
        if self.role not in POOL_ROLES:
            raise ValueError(f"role {self.role!r} is not one of {', '.join(POOL_ROLES)}.")
        if self.index < 0 or (self.role in (CHIEF, EVALUATOR) and self.index != 0):
            raise ValueError(
                f"{self.role} index ({self.index}) must be 0"
                + ("" if self.role in (CHIEF, EVALUATOR) else " or more")
                + "."
            )

    @property
    def label(self) -> str:
        """How output lines of this task are prefixed: `chief`, `worker 0`, `evaluator`."""
        return self.role if self.role in (CHIEF, EVALUATOR) else f"{self.role} {self.index}"

    @property
    def pool(self) -> int:
        """The position of this task's pool in `workerPoolSpecs`."""
        return POOL_ROLES.index(self.role)


@dataclasses.dataclass(frozen=True)
class ClusterShape:
    """How many replicas of each role: always one chief, `workers`, `ps`, maybe an evaluator."""

    workers: int = 0
    ps: int = 0
    evaluator: bool = False

    def __post_init__(self):
        for name in ("workers", "ps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"`{name}` ({value!r}) must be an integer >= 0.")

    @property
    def is_single_process(self) -> bool:
        """Only a chief: like a single-replica Vertex job, it gets no TF_CONFIG."""
        return self.workers == 0 and self.ps == 0 and not self.evaluator

    def tasks(self) -> tuple[Task, ...]:
        """Every task, in pool order: chief, workers, ps, evaluator."""
        return (
            (Task(CHIEF),)
            + tuple(Task(WORKER, i) for i in range(self.workers))
            + tuple(Task(PS, i) for i in range(self.ps))
            + ((Task(EVALUATOR),) if self.evaluator else ())
        )


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The cluster (addresses per job) and this replica's place in it.

    Without `TF_CONFIG` the replica is a chief with no cluster: it trains alone.
    """

    task_type: str = CHIEF
    task_index: int = 0
    jobs: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    trial: str | None = None
    rpc_layer: str = "grpc"

    @property
    def is_chief(self) -> bool:
        """The replica that coordinates training and alone writes the final artifacts."""
        return self.task_type == CHIEF

    @property
    def is_distributed(self) -> bool:
        return bool(self.jobs.get(WORKER) or self.jobs.get(PS))

    @property
    def has_ps(self) -> bool:
        return bool(self.jobs.get(PS))

    @property
    def num_workers(self) -> int:
        return len(self.jobs.get(WORKER, ()))

    @property
    def num_ps(self) -> int:
        return len(self.jobs.get(PS, ()))

    def address(self, task_type: str, index: int) -> str:
        return self.jobs[task_type][index]

    def replicas(self) -> list[tuple[str, int, str]]:
        """(type, index, address) of every replica in the cluster (the evaluator is not)."""
        return [(t, i, a) for t in (CHIEF, WORKER, PS) for i, a in enumerate(self.jobs.get(t, ()))]

    def servers(self) -> list[tuple[str, int, str]]:
        """(type, index, address) of every worker and ps: what a chief waits for."""
        return [(t, i, a) for t in (WORKER, PS) for i, a in enumerate(self.jobs.get(t, ()))]

    def cluster_spec(self):
        import tensorflow as tf

        return tf.train.ClusterSpec({k: list(v) for k, v in self.jobs.items() if v})

    def resolver(self):
        """A cluster resolver for tf.distribute (Vertex sets no rpc_layer: gRPC)."""
        import tensorflow as tf

        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            self.cluster_spec(),
            task_type=self.task_type,
            task_id=self.task_index,
            rpc_layer=self.rpc_layer,
        )


def parse(tf_config: str | None, cluster_spec: str | None = None) -> Cluster:
    """The cluster described by `TF_CONFIG`, else by `CLUSTER_SPEC`, else none."""
    if tf_config and tf_config.strip():
        return _parse_tf_config(_load("TF_CONFIG", tf_config), "TF_CONFIG")
    if cluster_spec and cluster_spec.strip():
        return _parse_cluster_spec(_load("CLUSTER_SPEC", cluster_spec))
    return Cluster()


def _load(name: str, text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{name} is not valid JSON ({e}): {text[:200]!r}.") from None
    if not isinstance(value, dict):
        raise InputError(
            f"{name} must be a JSON object with 'cluster' and 'task'; got {type(value).__name__}."
        )
    return value


def _parse_tf_config(config: dict, name: str) -> Cluster:
    raw_jobs = config.get("cluster")
    raw_jobs = {} if raw_jobs is None else raw_jobs
    if not isinstance(raw_jobs, dict):
        raise InputError(f"{name}['cluster'] must be an object of job name -> addresses.")
    jobs: dict[str, tuple[str, ...]] = {}
    for job, addresses in raw_jobs.items():
        role = _ALIASES.get(job, job)
        if role not in (CHIEF, WORKER, PS):
            raise InputError(
                f"{name}['cluster'] has an unknown job {job!r}; expected chief "
                "(or master), worker, ps. The evaluator is not part of the "
                "cluster."
            )
        jobs[role] = _addresses(f"{name}['cluster']['{job}']", addresses)
    if len(jobs.get(CHIEF, ())) > 1:
        raise InputError(
            f"{name}['cluster']['chief'] has {len(jobs[CHIEF])} addresses; a "
            "cluster has one chief (workerPoolSpecs[0].replicaCount must be 1)."
        )
    task = config.get("task") or {}
    if not isinstance(task, dict):
        raise InputError(f"{name}['task'] must be an object with 'type' and 'index'.")
    raw_type = task.get("type")
    task_type = _ALIASES.get(raw_type, raw_type) if isinstance(raw_type, str) else raw_type
    if task_type not in _ROLES:
        raise InputError(
            f"{name}['task']['type'] is {raw_type!r}; expected one of chief, "
            "master, worker, ps, evaluator."
        )
    index = task.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise InputError(f"{name}['task']['index'] is {index!r}; expected an integer >= 0.")
    if task_type != EVALUATOR:
        size = len(jobs.get(task_type, ()))
        if index >= size:
            raise InputError(
                f"{name}['task'] is {task_type} {index}, but "
                f"{name}['cluster'] has {size} {task_type} address(es)."
            )
    if jobs and CHIEF not in jobs:
        raise InputError(
            f"{name}['cluster'] has no 'chief' (or 'master'): Vertex puts the "
            "first worker pool there; add it."
        )
    trial = task.get("trial")
    return Cluster(
        task_type=task_type,
        task_index=index,
        jobs=jobs,
        trial=str(trial) if trial not in (None, "") else None,
        rpc_layer=config.get("rpc_layer") or "grpc",
    )


def _parse_cluster_spec(spec: dict) -> Cluster:
    pools = spec.get("cluster") or {}
    if not isinstance(pools, dict):
        raise InputError("CLUSTER_SPEC['cluster'] must be an object of workerpoolN -> addresses.")
    unknown = sorted(set(pools) - set(_POOLS))
    if unknown:
        raise InputError(
            f"CLUSTER_SPEC['cluster'] has unknown pools {unknown}; expected "
            "workerpool0..workerpool3."
        )
    task = spec.get("task") or {}
    task_type = task.get("type") if isinstance(task, dict) else None
    if task_type not in _POOLS:
        raise InputError(
            f"CLUSTER_SPEC['task']['type'] is {task_type!r}; expected workerpool0..workerpool3."
        )
    cluster = {
        _POOLS[pool]: addresses for pool, addresses in pools.items() if _POOLS[pool] != EVALUATOR
    }
    return _parse_tf_config(
        {
            "cluster": cluster,
            "task": {
                "type": _POOLS[task["type"]],
                "index": task.get("index", 0),
                "trial": task.get("trial"),
            },
        },
        "CLUSTER_SPEC",
    )


def _addresses(key: str, value) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise InputError(f"{key} must be a list of 'host:port' strings; got {value!r}.")
    for address in value:
        host, _, port = str(address).rpartition(":")
        if not isinstance(address, str) or not host or not port.isdigit():
            raise InputError(f"{key} has {address!r}; expected 'host:port'.")
    return tuple(value)


Replica = tuple[str, int, str]  # (type, index, address), as `Cluster.replicas()` lists them


def unanswered(replicas: Iterable[Replica]) -> list[Replica]:
    """Those of `replicas` that do not accept a connection on their address now."""
    return [replica for replica in replicas if not is_listening(replica[2])]


def never_answered(replicas: Sequence[Replica], timeout_secs: float) -> str:
    """What a replica says of the peers that never answered within `timeout_secs`: who (the
    chief by its address, others by role, index and address), the flag, and what to check."""
    names = ", ".join(
        f"the chief at {address}" if role == CHIEF else f"{role} {index} ({address})"
        for role, index, address in replicas
    )
    one = len(replicas) == 1
    chief = any(role == CHIEF for role, _, _ in replicas)
    return (
        f"{names} never answered in {timeout_secs:.0f} s (--cluster_timeout_secs). Check that "
        f"{'it is' if one else 'they are'} running (see {'its' if one else 'their'} logs) and "
        f"that {'its port is' if one else 'their ports are'} reachable from this replica, or "
        "raise --cluster_timeout_secs"
        + (
            " if the chief takes longer to start (with parameter servers it answers once its "
            "input is checked)."
            if chief
            else "."
        )
    )


def wait_for_servers(cluster: Cluster, *, timeout_secs: float, poll_secs: float = 0.5) -> None:
    """Blocks until every worker and ps accepts connections (replicas start in any order);
    raises TimeoutError naming the ones that never did (`never_answered`)."""
    deadline = time.monotonic() + timeout_secs
    waiting = cluster.servers()
    while waiting := unanswered(waiting):
        if time.monotonic() > deadline:
            raise TimeoutError(never_answered(waiting, timeout_secs))
        time.sleep(poll_secs)


class ChiefWatch:
    """Whether this replica's chief is there, for the replicas that wait on it (workers and
    parameter servers under a coordinator, the evaluator): it must answer on its `TF_CONFIG`
    address within `timeout_secs` of the watch's start (with parameter servers it opens its
    port once its input is checked), and once seen may be gone for at most `grace_secs`
    (Vertex restarts a failed replica under the same address).

    Example::

        watch = ChiefWatch(cluster, timeout_secs=600, grace_secs=120)
        while not watch.gone():  # raises TimeoutError if the chief never answers
            time.sleep(2)
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        timeout_secs: float,
        grace_secs: float,
        probe: Callable[[str], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.address = cluster.address(CHIEF, 0)
        self.timeout_secs = timeout_secs
        self.grace_secs = grace_secs
        self._probe = probe or is_listening
        self._clock = clock
        self._started = clock()
        self._seen = False
        self._gone_since: float | None = None

    @property
    def seen(self) -> bool:
        """Whether the chief has answered at least once since the watch began."""
        return self._seen

    def gone(self) -> bool:
        """Looks for the chief once: False while it answers, may still come, or may come back;
        True once it has been gone `grace_secs` after answering.

        Raises:
            TimeoutError: it never answered in `timeout_secs`, naming it and the flag.
        """
        now = self._clock()
        if self._probe(self.address):
            self._seen, self._gone_since = True, None
            return False
        if not self._seen:
            if now - self._started > self.timeout_secs:
                raise TimeoutError(never_answered([(CHIEF, 0, self.address)], self.timeout_secs))
            return False
        self._gone_since = self._gone_since if self._gone_since is not None else now
        return now - self._gone_since > self.grace_secs


def is_listening(address: str, timeout: float = 1.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False
