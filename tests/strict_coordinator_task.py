"""`trainer.task` whose ClusterCoordinator passes a lost worker's errors on to the chief
instead of retrying them itself, as it can in a race (an error it does not classify as a
worker failure). The chief's own recovery (CoordinatedLoop) must then carry training on.

    python -m tests.strict_coordinator_task [trainer.task flags]
"""

from tensorflow.python.distribute.coordinator import cluster_coordinator

from trainer import task

if __name__ == "__main__":
    cluster_coordinator._is_worker_failure = lambda error: False  # pylint: disable=protected-access
    task.run()
