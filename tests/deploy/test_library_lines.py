"""The local launcher keeps TensorFlow's own log lines out of the console: which lines those
are, on lines a real cluster printed (a chief, a worker; TensorFlow 2.17)."""

from __future__ import annotations

from deploy.local.library_lines import LibraryLines

WORKER = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795830783.957702   29617 grpc_server_lib.cc:464] Started server with target: grpc://127.0.0.1:53231
worker 0 serving at grpc://127.0.0.1:53231.
I0000 00:00:1795830786.305220   29658 eager_service_impl.cc:356] SessionOptions: device_count {
  key: "CPU"
  value: 1
}
device_count {
  key: "GPU"
  value: 0
}
allow_soft_placement: true
experimental {
  collective_group_leader: "/job:ps/replica:0/task:0"
}

The chief answers at 127.0.0.1:59431.
2026-11-28 01:53:20.664063: E tensorflow/core/framework/function_handle_cache.cc:31] Failed
worker 0 stops.
"""
CHIEF = """\
Connected to 2 workers and 1 parameter servers; placement: replication.
E0000 00:00:1795830786.357574   29615 context.cc:904] Failed to remove function remotely
Additional GRPC error information from remote target /job:ps/replica:0/task:0 while calling
:{"created":"@1795830786.354776118","description":"Error received from peer","grpc_status":14}
This could happen if the remote target has been disconnected from the client.
Iteration 0: training 2 subnetworks ['dnn_0x64', 'dnn_1x64'] and 2 candidate ensembles.
INFO:tensorflow:ClusterCoordinator destructor: stopping cluster
ClusterCoordinator destructor: stopping cluster
model: /tmp/lc/model
"""


def _ours(text: str) -> list[str]:
    lines = LibraryLines()
    return [line for line in text.splitlines() if not lines.is_library(line)]


def test_only_the_trainers_own_lines_are_left():
    assert _ours(WORKER) == [
        "worker 0 serving at grpc://127.0.0.1:53231.",
        "The chief answers at 127.0.0.1:59431.",
        "worker 0 stops.",
    ]
    assert _ours(CHIEF) == [
        "Connected to 2 workers and 1 parameter servers; placement: replication.",
        "Iteration 0: training 2 subnetworks ['dnn_0x64', 'dnn_1x64'] and 2 candidate ensembles.",
        "ClusterCoordinator destructor: stopping cluster",
        "model: /tmp/lc/model",  # a line like a protocol buffer's field, after ours: ours
    ]
