"""The TF_CONFIG / CLUSTER_SPEC parser on Vertex-shaped and malformed inputs."""

import json

import pytest

from trainer.distribute import cluster as cluster_lib
from trainer.distribute.environment import Environment
from trainer.errors import InputError

CLUSTER = {
    "chief": ["cmle-training-workerpool0-ab-0:2222"],
    "worker": ["cmle-training-workerpool1-ab-0:2222", "cmle-training-workerpool1-ab-1:2222"],
    "ps": ["cmle-training-workerpool2-ab-0:2222"],
}


def tf_config(task, cluster=CLUSTER, **extra):
    return json.dumps(
        {
            "cluster": cluster,
            "task": task,
            "environment": "cloud",
            "job": {"worker_pool_specs": []},
            **extra,
        }
    )


def test_no_tf_config_is_a_lone_chief():
    cluster = cluster_lib.parse(None)
    assert cluster.is_chief and not cluster.is_distributed and not cluster.has_ps
    assert cluster_lib.parse("  ") == cluster


@pytest.mark.parametrize(
    "task,chief,role",
    [
        ({"type": "chief", "index": 0}, True, "chief"),
        ({"type": "master", "index": 0}, True, "chief"),
        ({"type": "worker", "index": 1, "trial": "3", "cloud": "x"}, False, "worker"),
        ({"type": "ps", "index": 0}, False, "ps"),
        ({"type": "evaluator", "index": 0}, False, "evaluator"),
    ],
)
def test_vertex_roles(task, chief, role):
    cluster = cluster_lib.parse(tf_config(task))
    assert (cluster.is_chief, cluster.task_type, cluster.task_index) == (chief, role, task["index"])
    assert cluster.has_ps and cluster.num_workers == 2 and cluster.num_ps == 1
    assert cluster.trial == task.get("trial")


def test_legacy_master_job_is_the_chief():
    jobs = {"master": ["m:2222"], "worker": ["w:2222"]}
    cluster = cluster_lib.parse(tf_config({"type": "master", "index": 0}, jobs))
    assert cluster.is_chief and cluster.jobs == {"chief": ("m:2222",), "worker": ("w:2222",)}
    assert not cluster.has_ps and cluster.is_distributed


def test_ports_are_read_from_the_spec():
    cluster = cluster_lib.parse(tf_config({"type": "worker", "index": 1}))
    assert cluster.address("worker", 1) == "cmle-training-workerpool1-ab-1:2222"
    assert [s[:2] for s in cluster.servers()] == [("worker", 0), ("worker", 1), ("ps", 0)]
    spec = cluster.cluster_spec().as_dict()
    assert spec["ps"] == CLUSTER["ps"] and "evaluator" not in spec


def test_cluster_spec_variable_is_read_without_tf_config():
    spec = {
        "cluster": {
            "workerpool0": ["c:1"],
            "workerpool1": ["w0:1", "w1:1"],
            "workerpool2": ["p:1"],
            "workerpool3": ["e:1"],
        },
        "task": {"type": "workerpool1", "index": 1, "trial": 7},
    }
    cluster = cluster_lib.parse(None, json.dumps(spec))
    assert (cluster.task_type, cluster.task_index, cluster.trial) == ("worker", 1, "7")
    assert cluster.jobs == {"chief": ("c:1",), "worker": ("w0:1", "w1:1"), "ps": ("p:1",)}
    evaluator = cluster_lib.parse(None, json.dumps({**spec, "task": {"type": "workerpool3"}}))
    assert evaluator.task_type == "evaluator" and "evaluator" not in evaluator.jobs


def test_tf_config_wins_over_cluster_spec():
    cluster = cluster_lib.parse(tf_config({"type": "ps", "index": 0}), "{not json")
    assert cluster.task_type == "ps"


@pytest.mark.parametrize(
    "text,message",
    [
        ("{nope", "TF_CONFIG is not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (tf_config({"type": "wrker", "index": 0}), r"TF_CONFIG\['task'\]\['type'\] is 'wrker'"),
        (tf_config({"index": 0}), r"\['task'\]\['type'\] is None"),
        (tf_config({"type": "worker", "index": 2}), r"worker 2, but TF_CONFIG\['cluster'\] has 2"),
        (tf_config({"type": "worker", "index": -1}), r"\['index'\] is -1"),
        (tf_config({"type": "worker", "index": "0"}), r"\['index'\] is '0'"),
        (
            tf_config({"type": "chief", "index": 0}, {**CLUSTER, "evaluator": ["e:1"]}),
            r"unknown job 'evaluator'",
        ),
        (
            tf_config({"type": "chief", "index": 0}, {**CLUSTER, "worker": "w:1"}),
            r"\['cluster'\]\['worker'\] must be a list",
        ),
        (
            tf_config({"type": "chief", "index": 0}, {**CLUSTER, "ps": ["no-port"]}),
            r"\['cluster'\]\['ps'\] has 'no-port'; expected 'host:port'",
        ),
        (
            tf_config({"type": "chief", "index": 0}, {**CLUSTER, "chief": ["a:1", "b:1"]}),
            "one chief",
        ),
        (
            tf_config({"type": "worker", "index": 0}, {"worker": ["w:1"], "ps": ["p:1"]}),
            "has no 'chief'",
        ),
        (json.dumps({"cluster": [], "task": {"type": "chief"}}), r"\['cluster'\] must be"),
        (json.dumps({"cluster": {}, "task": "chief"}), r"\['task'\] must be an object"),
    ],
)
def test_malformed_tf_config_names_the_bad_key(text, message):
    with pytest.raises(InputError, match=message):
        cluster_lib.parse(text)


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"cluster": {"workerpool9": ["a:1"]}, "task": {"type": "workerpool0"}}, "workerpool9"),
        (
            {"cluster": {"workerpool0": ["a:1"]}, "task": {"type": "chief"}},
            r"CLUSTER_SPEC\['task'\]\['type'\] is 'chief'",
        ),
    ],
)
def test_malformed_cluster_spec_names_the_bad_key(spec, message):
    with pytest.raises(InputError, match=message):
        cluster_lib.parse(None, json.dumps(spec))


def test_environment_carries_the_cluster():
    environment = Environment.from_environ(
        {"TF_CONFIG": tf_config({"type": "ps", "index": 0}), "CLOUD_ML_TRIAL_ID": "2"}
    )
    assert environment.cluster.task_type == "ps" and environment.is_tuning


def test_waiting_for_servers_names_the_missing_ones():
    cluster = cluster_lib.parse(
        tf_config(
            {"type": "chief", "index": 0},
            {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:1"]},
        )
    )
    with pytest.raises(
        TimeoutError,
        match=r"worker 0 \(127.0.0.1:1\), ps 0 .*"
        "--cluster_timeout_secs",
    ):
        cluster_lib.wait_for_servers(cluster, timeout_secs=0.3, poll_secs=0.1)
