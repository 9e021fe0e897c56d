"""How this replica takes part in training: the tf.distribute strategy for its cluster, the
server loop of workers and parameter servers, and which errors mean a lost replica.

- Parameter servers in the cluster: the chief runs `ParameterServerStrategy` with a
  `ClusterCoordinator` and schedules work on the workers (`loops.CoordinatedLoop`); workers
  and ps run a TensorFlow server (`serve`) until the chief is gone. Updates are asynchronous.
- Workers without ps: every worker (the chief included) runs the trainer under
  `MultiWorkerMirroredStrategy`: synchronous all-reduce.
- Several GPUs on one machine: `MirroredStrategy`; else the default strategy.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import re
import select
import signal
import sys
import threading
import time
from typing import NoReturn

import tensorflow as tf
from absl import logging

from trainer.distribute import cluster as cluster_lib
from trainer.distribute import preemption
from trainer.distribute.cluster import Cluster
from trainer.errors import TrainingError
from trainer.placement import Assignment, PlacementStrategy, ps_for_variable
from trainer.search.iteration import Layout

_CHIEF_DEVICE = "/job:chief/replica:0/task:0/device:CPU:0"
# How long the main thread blocks at most in a wait, so that it runs signal handlers.
SIGNAL_CHECK_SECS = 0.25


@dataclasses.dataclass
class Runtime:
    """The strategy this replica trains under, and what placement and the cluster imply."""

    cluster: Cluster
    strategy: tf.distribute.Strategy
    placement: PlacementStrategy
    coordinator: tf.distribute.coordinator.ClusterCoordinator | None = None
    _anchors: dict[int, tf.Variable] = dataclasses.field(default_factory=dict)

    @property
    def is_chief(self) -> bool:
        return self.cluster.is_chief

    @property
    def num_workers(self) -> int:
        """Workers that train (under the coordinator: the worker tasks; else replicas' hosts)."""
        if self.coordinator is not None:
            return self.cluster.num_workers
        return 1 + self.cluster.num_workers if self.cluster.is_distributed else 1

    def worker_name(self, index: int) -> str:
        if self.coordinator is not None:
            return f"worker {index}"
        return "chief" if index == 0 else f"worker {index - 1}"

    @property
    def checkpoint_options(self) -> tf.train.CheckpointOptions | None:
        """Under parameter servers, the chief writes every shard itself: where a variable lives
        does not decide which machine's disk (or credentials) a checkpoint needs."""
        if self.coordinator is None:
            return None
        return tf.train.CheckpointOptions(experimental_io_device=_CHIEF_DEVICE)

    def assignment(self, num_subnetworks: int) -> Assignment:
        return self.placement.assign(
            num_workers=max(self.num_workers, 1), num_subnetworks=num_subnetworks
        )

    def layout(self, num_subnetworks: int) -> Layout:
        if self.coordinator is None:
            return Layout()

        def subnetwork_scope(index: int):
            group = self.placement.ps_group(
                num_ps=self.cluster.num_ps, num_subnetworks=num_subnetworks, subnetwork=index
            )
            return self._on_ps_group(group) if group else contextlib.nullcontext()

        return Layout(
            units=self.assignment(num_subnetworks).distinct,
            subnetwork_scope=subnetwork_scope,
            shared_bookkeeping=True,
        )

    @contextlib.contextmanager
    def _on_ps_group(self, group: tuple[int, ...]):
        """Creates variables on the servers of `group`, each by a stable hash of its name."""
        anchors = self._ps_anchors()
        created: collections.Counter[str] = collections.Counter()

        def creator(next_creator, **kwargs):
            name = str(kwargs.get("name") or "variable")
            created[name] += 1
            kwargs["colocate_with"] = anchors[ps_for_variable(group, f"{name}/{created[name]}")]
            return next_creator(**kwargs)

        with tf.variable_creator_scope(creator):
            yield

    def _ps_anchors(self) -> dict[int, tf.Variable]:
        """One tiny variable on each parameter server, to colocate others with."""
        if not self._anchors:
            with self.strategy.scope():
                for _ in range(self.cluster.num_ps):
                    anchor = tf.Variable(0, dtype=tf.int8, trainable=False, name="ps_anchor")
                    self._anchors[tf.DeviceSpec.from_string(anchor.device).task] = anchor
        return self._anchors


def make_runtime(cluster: Cluster, placement: PlacementStrategy, *, timeout_secs: float) -> Runtime:
    """The strategy for this (training) replica. A chief with parameter servers waits, up to
    `timeout_secs`, for every server of the cluster to listen; a synchronous replica as long
    for every other one to join, and ends the process (exit 1, one line) if they do not
    (`_join_synchronous_cluster`).

    Raises:
        TrainingError: a chief with parameter servers, naming the servers that never came."""
    if cluster.has_ps:
        try:
            cluster_lib.wait_for_servers(cluster, timeout_secs=timeout_secs)
        except TimeoutError as e:
            raise TrainingError(str(e)) from None
        strategy = tf.distribute.ParameterServerStrategy(cluster.resolver())
        _recognize_lost_worker_errors()
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        logging.info(
            "Connected to %d workers and %d parameter servers; placement: %s.",
            cluster.num_workers,
            cluster.num_ps,
            placement.name,
        )
        return Runtime(cluster, strategy, placement, coordinator)
    if cluster.is_distributed:  # round_robin without ps: refused as bad input (job/job.py)
        strategy = _join_synchronous_cluster(cluster, timeout_secs=timeout_secs)
        logging.info("MultiWorkerMirroredStrategy over %d replicas.", strategy.num_replicas_in_sync)
        return Runtime(cluster, strategy, placement)
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        strategy = tf.distribute.MirroredStrategy()
        logging.info("MirroredStrategy over %d GPUs.", len(gpus))
    else:
        strategy = tf.distribute.get_strategy()
    return Runtime(cluster, strategy, placement)


def _join_synchronous_cluster(cluster: Cluster, *, timeout_secs: float) -> tf.distribute.Strategy:
    """`MultiWorkerMirroredStrategy` over the chief and the workers once every one has joined;
    if they have not within `timeout_secs`, or joining failed, it ends the process (`_stop`)
    with exit code 1 and one line naming the replicas that never answered, or saying what
    else went wrong and what to do.

    Without the coordination service. With it (TF 2.17's default), joining waits for every
    replica inside one C++ call that holds the GIL (`TFE_EnableCollectiveOps`), where no Python
    code runs, no signal handler either, and the chief's wait has no deadline (the service's
    `cluster_register_timeout` bounds only a replica's own registration); and the service
    installs a SIGTERM handler of its own (a preemption notifier for TensorFlow's
    `PreemptionCheckpointHandler`, not used here) that only logs the signal: a waiting replica
    ignored SIGTERM for minutes. Without it the strategy watches its peers with its own health
    check, whose first all-reduce waits for every replica with the GIL released: the strategy is
    created in a helper thread while the main thread keeps the deadline, and SIGTERM stays with
    `preemption.watch`'s handler, there and during training.

    On a timeout the helper thread stays blocked in that all-reduce and this replica's server
    runs: the process ends past the interpreter's teardown, as `serve`'s does (see there).
    """
    from tensorflow.python.eager import context

    context.context().configure_coordination_service(service_type="")  # "": none
    joined: dict[str, object] = {}

    def join() -> None:
        try:
            joined["strategy"] = tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=cluster.resolver()
            )
        except Exception as e:  # noqa: BLE001 (reported by the main thread)
            joined["error"] = e

    logging.info("Waiting up to %.0f s for the other synchronous replicas.", timeout_secs)
    helper = threading.Thread(target=join, name="join the synchronous cluster", daemon=True)
    helper.start()
    # In slices: SIGTERM can land on one of TensorFlow's threads, and then a main thread
    # blocked in one long join runs no handler until it wakes (seen: a chief told to stop in
    # its wait kept waiting out its --cluster_timeout_secs).
    deadline = time.monotonic() + timeout_secs
    while helper.is_alive() and (left := deadline - time.monotonic()) > 0:
        helper.join(min(left, SIGNAL_CHECK_SECS))
    if helper.is_alive() or "error" in joined:
        me = (cluster.task_type, cluster.task_index)
        missing = cluster_lib.unanswered(r for r in cluster.replicas() if r[:2] != me)
        if missing:
            _stop(1, cluster_lib.never_answered(missing, timeout_secs))
        if helper.is_alive():
            _stop(
                1,
                "the synchronous replicas all answer but did not all join in "
                f"{timeout_secs:.0f} s (--cluster_timeout_secs). Check that every address "
                "in TF_CONFIG is this job's replica (not another program on that port), that "
                "every replica has the same cluster in TF_CONFIG, and that none stopped before "
                "joining (their logs); then restart the job.",
            )
        error = joined["error"]
        _stop(
            1,
            f"joining the synchronous cluster failed ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:200]}). Check this replica's TF_CONFIG and that its "
            f"port ({cluster.address(cluster.task_type, cluster.task_index)}) is free on this "
            "machine, then restart the replica.",
        )
    strategy = joined["strategy"]
    assert isinstance(strategy, tf.distribute.Strategy)
    return strategy


def _stop(code: int, message: str | None = None) -> NoReturn:
    """Ends the process now with `code`, after `training stopped: MESSAGE` on stderr if given.

    Past the interpreter's teardown (`os._exit`): a started TensorFlow server cannot be
    stopped (its `stop()` is unimplemented), and tearing down the runtime under its running
    gRPC threads took 1.5-2 s on a loaded 2-core machine and once hung for more than 30 s in
    CI, where Vertex would have waited on the replica."""
    if message is not None:
        print(f"training stopped: {message}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# -- workers and parameter servers under a coordinator -------------------------------------------
def serve(
    cluster: Cluster, *, timeout_secs: float, grace_secs: float, poll_secs: float = 2.0
) -> NoReturn:
    """Runs this worker's or ps's TensorFlow server until the chief is done, then ends the
    process with exit code 0, or `preemption.exit_code` (143, 130) when a signal stopped it
    before then, or 1 when the chief never came.

    The chief must answer within `timeout_secs` (`--cluster_timeout_secs`); it opens its port
    once it has checked its input, so that wait covers its data scan. A chief that then goes
    away and restarts (Vertex restarts a failed replica under the same name) comes back within
    `grace_secs`, and this server keeps serving it; after that long without a chief, the job is
    over. SIGTERM (or SIGINT) ends it at once: with 0 when the chief answered once and is gone
    now (Vertex and the local launcher stop the others once the chief has exited); while the
    chief runs, or before it ever answered (its data scan), it is this replica that is stopped
    (a Spot VM preempted), and a non-zero code has Vertex restart it (the chief reschedules a
    lost worker's chunks; a lost ps stops the chief, whose restart finds it again).

    It ends the process past the interpreter's teardown (`_stop`): this server cannot be
    stopped.
    """
    server = tf.distribute.Server(
        cluster.cluster_spec(),
        job_name=cluster.task_type,
        task_index=cluster.task_index,
        protocol=cluster.rpc_layer,
        start=True,
    )
    received: list[int] = []
    wake_read, wake_write = os.pipe()

    def handle(signum, frame):
        # No lock here (not even an Event's): the handler runs in the main thread, between
        # two of its bytecodes, maybe while that thread holds the very lock.
        received.append(signum)
        os.write(wake_write, b"!")

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handle)
    logging.info("%s %d serving at %s.", cluster.task_type, cluster.task_index, server.target)
    chief = cluster_lib.ChiefWatch(cluster, timeout_secs=timeout_secs, grace_secs=grace_secs)
    while not received:
        select.select([wake_read], [], [], poll_secs)  # a signal ends the wait at once
        if received:
            break
        try:
            seen = chief.seen
            gone = chief.gone()
            if chief.seen and not seen:
                logging.info("The chief answers at %s.", chief.address)
            if gone:
                logging.info(
                    "The chief (%s) has been gone for %.0f s: done.", chief.address, grace_secs
                )
                break
        except TimeoutError as e:
            _stop(1, str(e))
    code = 0
    if received:
        name = signal.Signals(received[0]).name
        if chief.seen and not cluster_lib.is_listening(chief.address):
            logging.info("%s after the chief had gone: the job is over.", name)
        else:
            code = preemption.exit_code(received[0])
            logging.info(
                "%s %d: %s while the chief %s (preemption?): exit code %d, to be restarted.",
                cluster.task_type,
                cluster.task_index,
                name,
                "runs" if chief.seen else "has not answered yet",
                code,
            )
    logging.info("%s %d stops.", cluster.task_type, cluster.task_index)
    _stop(code)


# -- lost replicas ----------------------------------------------------------------------------
LOST_REPLICA_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError)


def _lost_tasks(error: Exception) -> list[tuple[str, str]]:
    return sorted(set(re.findall(r"/job:(\w+)/replica:\d+/task:(\d+)", str(error))))


# What a chunk's error says when its worker is gone but the error does not name it: its
# inputs (the worker's iterator) no longer resolve.
_LOST_WORKER_TEXTS = (
    "primary device is not remote",
    "unknown device",
    "unable to find the relevant tensor remote_handle",
)


def lost_workers_only(error: Exception) -> bool:
    """Whether the chief trains on through a chunk's error: a worker is lost and no parameter
    server is. The coordinator retries most such chunks itself but passes some on in a race
    (an error without the worker's name), and cancels queued chunks along with them."""
    jobs = {job for job, _ in _lost_tasks(error)}
    if "ps" in jobs:
        return False
    if isinstance(error, tf.errors.CancelledError):
        return True
    if isinstance(error, tf.errors.InvalidArgumentError):
        return any(text in str(error).lower() for text in _LOST_WORKER_TEXTS)
    return isinstance(error, LOST_REPLICA_ERRORS) and "worker" in jobs


def _recognize_lost_worker_errors() -> None:
    """Makes ClusterCoordinator take a chunk that failed with one of `_LOST_WORKER_TEXTS` (and
    names no ps) for its worker's failure, as it does when the text names the worker.

    Without it (TF 2.17's `_is_worker_failure` wants "/job:worker" in the text), a worker
    SIGKILLed between two chunks fails the next ones with "Primary device is not remote", and
    the coordinator passes each on as an error instead of waiting for the worker to come back:
    a cascade that cancels every queued chunk and can leave it waiting on them forever. This
    patches a private function; where it is missing, the coordinator keeps its own rule."""
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    own = getattr(cluster_coordinator, "_is_worker_failure", None)
    if own is None or getattr(own, "recognizes_lost_worker_texts", False):
        return

    def is_worker_failure(error) -> bool:
        return own(error) or (
            isinstance(error, tf.errors.InvalidArgumentError) and lost_workers_only(error)
        )

    setattr(is_worker_failure, "recognizes_lost_worker_texts", True)  # noqa: B010 (a function)
    cluster_coordinator._is_worker_failure = is_worker_failure  # pylint: disable=protected-access


def lost_replica(error: Exception) -> TrainingError:
    """The clear error for a cluster member gone in mid-training (workers are replaced by the
    coordinator; a lost parameter server takes the variables with it)."""
    tasks = [t for t in _lost_tasks(error) if t[0] != "chief"]  # the chief is the one asking
    # A lost ps fails the workers' steps too: name the cause.
    tasks = [t for t in tasks if t[0] == "ps"] or tasks
    who = ", ".join(f"{job} {index}" for job, index in tasks) or "a replica"
    return TrainingError(
        f"Training stopped: {who} became unreachable ({type(error).__name__}: "
        f"{str(error).splitlines()[0][:200]}). A parameter server holds the model's variables: "
        "restart the lost replica and then the chief, and training resumes from the last "
        "checkpoint."
    )
