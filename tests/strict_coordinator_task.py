"""`trainer.task` whose ClusterCoordinator passes the first lost-worker error on to the chief
instead of retrying that chunk itself, as it does in a race (a chunk error without the worker's
name, e.g. "Primary device is not remote"); it cancels the queued chunks with it and handles
later errors as usual. The chief's own recovery (CoordinatedLoop) must carry training on.

    python -m tests.strict_coordinator_task [trainer.task flags]
"""

from tensorflow.python.distribute.coordinator import cluster_coordinator

from trainer import task

_is_worker_failure = cluster_coordinator._is_worker_failure  # pylint: disable=protected-access
_passed_on: list[Exception] = []


def _pass_on_the_first(error) -> bool:
    if _is_worker_failure(error) and not _passed_on:
        _passed_on.append(error)
        return False
    return _is_worker_failure(error)


if __name__ == "__main__":
    cluster_coordinator._is_worker_failure = _pass_on_the_first  # pylint: disable=protected-access
    task.run()
