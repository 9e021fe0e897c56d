"""Which cluster errors the chief trains through (a lost worker) and which stop it (a lost
parameter server), on error texts as TensorFlow's remote eager runtime words them."""

from __future__ import annotations

import tensorflow as tf

from trainer.distribute.runtime import lost_replica, lost_workers_only

_GRPC = (
    ':{"created":"@1795318152.8","description":"Error received from peer '
    'ipv4:127.0.0.1:47873","grpc_message":"Socket closed","grpc_status":14}'
)


def _error(kind, remote: str | None, text: str = "Socket closed"):
    where = (
        (
            f"\nAdditional GRPC error information from remote target {remote} while calling "
            "/tensorflow.eager.EagerService/RunComponentFunction:\n" + _GRPC
        )
        if remote
        else ""
    )
    return kind(None, None, f"{text}{where} [Op:__inference_chunk_1234]")


WORKER = "/job:worker/replica:0/task:1"
PS = "/job:ps/replica:0/task:0"


CHIEF = "/job:chief/replica:0/task:0"


def test_a_lost_worker_is_trained_through():
    assert lost_workers_only(_error(tf.errors.UnavailableError, WORKER))
    assert lost_workers_only(_error(tf.errors.AbortedError, WORKER))
    copy = f"Failed copying input tensor from {CHIEF}/device:CPU:0 to {WORKER}/device:CPU:0"
    assert lost_workers_only(_error(tf.errors.UnavailableError, None, copy))


def test_a_chunk_whose_worker_inputs_are_gone_is_trained_through():
    """The texts the coordinator itself takes for a lost worker, but only when they name the
    worker; seen without it when a worker was SIGKILLed between two chunks."""
    assert lost_workers_only(
        _error(tf.errors.InvalidArgumentError, None, "Primary device is not remote")
    )
    assert not lost_workers_only(
        _error(tf.errors.InvalidArgumentError, None, "Incompatible shapes: [64,3] vs. [64,4]")
    )


def test_a_lost_parameter_server_is_not():
    assert not lost_workers_only(_error(tf.errors.UnavailableError, PS))
    both = _error(tf.errors.UnavailableError, WORKER, f"Recv from {PS} failed")
    assert not lost_workers_only(both)


def test_an_error_naming_no_task_is_not():
    assert not lost_workers_only(_error(tf.errors.UnavailableError, None))


def test_chunks_cancelled_after_a_worker_error_are_rescheduled_unless_a_ps_is_named():
    cancelled = tf.errors.CancelledError(
        None, None, "The corresponding function is cancelled. Please reschedule the function."
    )
    assert lost_workers_only(cancelled)
    assert lost_workers_only(_error(tf.errors.CancelledError, WORKER))
    assert not lost_workers_only(_error(tf.errors.CancelledError, PS))


def test_the_stop_message_names_the_parameter_server_alone():
    both = _error(tf.errors.UnavailableError, WORKER, f"Recv from {PS} failed")
    message = str(lost_replica(both))
    assert "ps 0 became unreachable" in message and "worker 1" not in message
    assert "restart the lost replica and then the chief" in message
    assert "worker 1 became unreachable" in str(
        lost_replica(_error(tf.errors.UnavailableError, WORKER))
    )
    copy = f"Failed copying input tensor from {CHIEF}/device:CPU:0 to {WORKER}/device:CPU:0"
    assert "Training stopped: worker 1 became" in str(
        lost_replica(_error(tf.errors.UnavailableError, None, copy))
    )


def test_the_coordinator_takes_a_nameless_lost_worker_error_for_a_worker_failure(monkeypatch):
    """So that it waits for the worker to come back instead of passing each of its chunks on
    to the chief (a cascade of cancelled chunks that could leave the chief waiting)."""
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    from trainer.distribute import runtime as distributed

    own = cluster_coordinator._is_worker_failure
    monkeypatch.setattr(cluster_coordinator, "_is_worker_failure", own)  # restored after
    nameless = _error(tf.errors.InvalidArgumentError, None, "Primary device is not remote")
    assert not own(nameless)  # TensorFlow's own rule wants the worker named
    distributed._recognize_lost_worker_errors()
    distributed._recognize_lost_worker_errors()  # once is enough; a second call adds nothing
    assert cluster_coordinator._is_worker_failure(nameless)
    assert cluster_coordinator._is_worker_failure(_error(tf.errors.UnavailableError, WORKER))
    assert not cluster_coordinator._is_worker_failure(_error(tf.errors.UnavailableError, PS))
    assert not cluster_coordinator._is_worker_failure(
        _error(tf.errors.InvalidArgumentError, None, "Incompatible shapes: [64,3] vs. [64,4]")
    )
