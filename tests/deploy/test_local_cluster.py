"""trainer.local_cluster: a cluster of real processes running `tests.cluster_task`, a
stand-in for the trainer that starts in milliseconds. Every test stops what it started,
pass or fail."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from deploy.local import cluster as local_cluster
from deploy.local import network
from deploy.local.cluster import LocalCluster
from deploy.local.network import PrivateNetworkUnavailable
from tests.support import DUMMY_TASK as DUMMY
from tests.support import REPO, is_alive, wait_for
from trainer.distribute.cluster import ClusterShape, Task
from trainer.errors import InputError

pytestmark = pytest.mark.timeout(30)

FULL = ClusterShape(workers=2, ps=1, evaluator=True)
LABELS = ["chief", "worker 0", "worker 1", "ps 0", "evaluator"]


# -- helpers ----------------------------------------------------------------------------------


def env_line(lines: list[str]) -> dict:
    """The last `env {...}` line a cluster_task printed, decoded (TF_CONFIG parsed too)."""
    found = [json.loads(line[4:]) for line in lines if line.startswith("env ")]
    assert found, f"no env line in {lines}"
    env = found[-1]
    for key in ("TF_CONFIG", "CLUSTER_SPEC"):
        env[key] = json.loads(env[key]) if env[key] else None
    return env


def ready_count(cluster: LocalCluster, task: Task) -> int:
    return cluster.output(task.role, task.index).count("ready")


def all_ready(cluster: LocalCluster) -> bool:
    return all(ready_count(cluster, t) >= 1 for t in cluster.shape.tasks())


def listening(port: int, pid: int | str = "self") -> list[str]:
    """The local addresses with a socket listening on `port`, in the network namespace of
    process `pid` (default: this one's, the machine's), as the kernel lists them."""
    found = []
    for family, table in ((socket.AF_INET, "tcp"), (socket.AF_INET6, "tcp6")):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                host, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # TCP_LISTEN
                    raw = bytes.fromhex(host)  # 32-bit words in the host's (little-endian) order
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                    found.append(socket.inet_ntop(family, words))
    return sorted(found)


def interfaces(pid: int) -> list[str]:
    """The network interfaces of process `pid`'s network namespace."""
    lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    return sorted(line.split(":")[0].strip() for line in lines)


@pytest.fixture
def make_cluster():
    """LocalCluster factory running the dummy task; stops every cluster at teardown."""
    clusters = []

    def make(shape: ClusterShape, *args: str, **kwargs) -> LocalCluster:
        kwargs.setdefault("sink", None)
        kwargs.setdefault("grace", 2.0)
        cluster = LocalCluster(shape, module=DUMMY, args=args, cwd=REPO, **kwargs)
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        try:
            cluster.stop()
        finally:  # even if stop() is broken, nothing outlives the test
            for task in cluster.shape.tasks():
                with contextlib.suppress(RuntimeError):
                    process = cluster.process(task.role, task.index)
                    if process.poll() is None:
                        process.kill()
                        process.wait()


# -- what each process is told: pure functions ------------------------------------------------

ADDRESSES = {
    Task("chief"): "h:1",
    Task("worker", 0): "h:2",
    Task("worker", 1): "h:3",
    Task("ps", 0): "h:4",
    Task("evaluator"): "h:5",
}


@pytest.mark.parametrize(
    "task, expected_task",
    [
        (Task("chief"), {"type": "chief", "index": 0}),
        (Task("worker", 1), {"type": "worker", "index": 1}),
        (Task("ps", 0), {"type": "ps", "index": 0}),
        (Task("evaluator"), {"type": "evaluator", "index": 0}),
    ],
)
def test_tf_config_has_vertex_shape_and_no_evaluator_in_cluster(task, expected_task):
    assert local_cluster.tf_config(ADDRESSES, task) == {
        "cluster": {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]},
        "task": expected_task,
        "environment": "cloud",
    }


def test_tf_config_omits_empty_roles():
    config = local_cluster.tf_config({Task("chief"): "h:1", Task("ps", 0): "h:4"}, Task("ps", 0))
    assert config["cluster"] == {"chief": ["h:1"], "ps": ["h:4"]}


@pytest.mark.parametrize(
    "task, pool",
    [(Task("chief"), 0), (Task("worker", 1), 1), (Task("ps", 0), 2), (Task("evaluator"), 3)],
)
def test_cluster_spec_keys_pools_by_position(task, pool):
    assert local_cluster.cluster_spec(ADDRESSES, task) == {
        "cluster": {
            "workerpool0": ["h:1"],
            "workerpool1": ["h:2", "h:3"],
            "workerpool2": ["h:4"],
            "workerpool3": ["h:5"],
        },
        "environment": "cloud",
        "task": {"type": f"workerpool{pool}", "index": task.index},
    }


@pytest.mark.parametrize(
    "before, after",
    [
        (None, "127.0.0.1,localhost"),
        ("", "127.0.0.1,localhost"),
        ("example.com", "example.com,127.0.0.1,localhost"),
        ("localhost, .corp", "localhost,.corp,127.0.0.1"),
    ],
)
def test_no_proxy_gets_loopback_appended(before, after):
    assert local_cluster.with_loopback_no_proxy(before) == after


def test_lone_chief_environment_drops_inherited_cluster_variables():
    env = local_cluster.task_environment(
        {"TF_CONFIG": "{}", "CLUSTER_SPEC": "{}", "A": "1"}, None, Task("chief")
    )
    assert "TF_CONFIG" not in env and "CLUSTER_SPEC" not in env
    assert env["A"] == "1" and env["GRPC_FAIL_FAST"] == "use_caller"


def test_free_ports_are_distinct_and_bindable():
    ports = local_cluster.free_ports(8)
    assert len(set(ports)) == 8
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda: Task("master"), ValueError),
        (lambda: Task("chief", 1), ValueError),
        (lambda: Task("worker", -1), ValueError),
        (lambda: ClusterShape(workers=-1), InputError),
        (lambda: ClusterShape(ps=1.5), InputError),  # type: ignore[arg-type]
    ],
)
def test_bad_tasks_and_shapes_are_refused(make, error):
    with pytest.raises(error):
        make()


def test_tasks_come_in_pool_order():
    assert [t.label for t in FULL.tasks()] == LABELS


# -- a real cluster through the Python API ----------------------------------------------------


def test_every_role_gets_its_tf_config_and_a_free_port(make_cluster):
    base = dict(os.environ, no_proxy="example.com", TF_CONFIG="inherited")
    cluster = make_cluster(FULL, "--listen", "--sleep=-1", env=base)
    cluster.start()
    wait_for(lambda: all_ready(cluster), what="every task listening on its port")

    envs = {t: env_line(cluster.output(t.role, t.index)) for t in FULL.tasks()}
    addresses = [cluster.addresses[t] for t in FULL.tasks()]
    assert len(set(addresses)) == len(addresses), "ports must be distinct"
    cluster_part = {"chief": addresses[:1], "worker": addresses[1:3], "ps": addresses[3:4]}
    for task, env in envs.items():
        assert env["role"] == task.role and env["index"] == task.index
        assert env["TF_CONFIG"] == {
            "cluster": cluster_part,
            "environment": "cloud",
            "task": {"type": task.role, "index": task.index},
        }
        assert env["CLUSTER_SPEC"]["cluster"]["workerpool3"] == addresses[4:]
        assert env["CLUSTER_SPEC"]["task"] == {
            "type": f"workerpool{task.pool}",
            "index": task.index,
        }
        assert env["GRPC_FAIL_FAST"] == "use_caller"
        assert env["no_proxy"] == "example.com,127.0.0.1,localhost"
        assert env["pid"] == cluster.process(task.role, task.index).pid


def test_a_caller_places_every_task_at_its_own_address_and_prefix(make_cluster):
    """As bench/simcluster.py does: each task at the address it was given (own port here; a
    namespace of its own there), started behind the caller's words (there: its CPU group and
    namespace; here `env`, which sets one variable the stand-in prints and execs it)."""
    ports = local_cluster.free_ports(len(FULL.tasks()))
    given = {t: f"127.0.0.1:{p}" for t, p in zip(FULL.tasks(), ports)}
    cluster = make_cluster(
        FULL,
        "--listen",
        "--sleep=-1",
        addresses=given,
        prefix=lambda task: ["env", f"no_proxy=placed {task.label}"],
    )
    cluster.start()
    wait_for(lambda: all_ready(cluster), what="every task listening on its given port")

    assert cluster.network == local_cluster.CALLER
    assert cluster.addresses == given
    for task in FULL.tasks():
        env = env_line(cluster.output(task.role, task.index))
        assert env["no_proxy"] == f"placed {task.label}"
        assert env["pid"] == cluster.process(task.role, task.index).pid  # env execs
        assert env["CLUSTER_SPEC"]["cluster"][f"workerpool{task.pool}"][task.index] == given[task]


def test_addresses_must_name_every_task_and_no_other():
    some = {Task("chief"): "h:1", Task("worker", 0): "h:2"}
    with pytest.raises(ValueError, match="the cluster's tasks are"):
        LocalCluster(ClusterShape(workers=2), addresses=some)


def test_the_tasks_listen_where_only_the_cluster_reaches_them(make_cluster, private_network):
    """Like TensorFlow's servers, the stand-ins listen on every interface; in the cluster's
    private network namespace that is loopback alone, and on this machine nothing."""
    sink = io.StringIO()
    cluster = make_cluster(FULL, "--listen", "--sleep=-1", sink=sink)
    cluster.start()
    wait_for(lambda: all_ready(cluster), what="every task listening on its port")
    assert (cluster.requested_network, cluster.network) == ("auto", "private")
    assert "[launch] network: private" in sink.getvalue()
    for task, address in cluster.addresses.items():
        port, pid = int(address.rsplit(":", 1)[1]), cluster.process(task.role, task.index).pid
        assert listening(port, pid) == ["0.0.0.0"], task
        assert interfaces(pid) == ["lo"]
        assert listening(port) == [], f"{task.label} is reachable from this machine's network"
    # All in one namespace: they reach each other on loopback.
    namespaces = {
        os.readlink(f"/proc/{cluster.process(t.role, t.index).pid}/ns/net") for t in FULL.tasks()
    }
    assert len(namespaces) == 1 and namespaces != {os.readlink("/proc/self/ns/net")}


@pytest.mark.parametrize(
    "args, env, why",
    [
        ((), {}, None),
        (("--job_dir=runs/x", "--train_data=/gcs/b/d.csv"), {"HOME": "/root"}, None),
        (("--job_dir=gs://b/x",), {}, "--job_dir=gs://b/x is in Cloud Storage or BigQuery"),
        (("--train_data=bq://p.d.t",), {}, "--train_data=bq://p.d.t is in Cloud Storage or"),
        (("--experiment=e",), {}, "--experiment=e logs to Vertex AI Experiments"),
        ((), {"AIP_MODEL_DIR": "gs://b/m"}, "AIP_MODEL_DIR=gs://b/m is in Cloud Storage"),
        ((), {"AIP_EXPERIMENT_NAME": "e"}, "AIP_EXPERIMENT_NAME logs to Vertex AI Experiments"),
    ],
)
def test_what_needs_the_network(args, env, why):
    found = network.network_needs(args, env)
    if why is None:
        assert found is None
    else:
        assert found is not None and found.startswith(why)


def test_a_job_that_needs_the_network_runs_on_the_machines_network_and_is_warned(make_cluster):
    sink = io.StringIO()
    cluster = make_cluster(ClusterShape(workers=1), "--job_dir=gs://b/x", "--sleep=-1", sink=sink)
    assert (cluster.requested_network, cluster.network) == ("auto", None)  # (not started)
    cluster.start()
    assert (cluster.requested_network, cluster.network) == ("auto", "host")
    said = sink.getvalue()
    assert "warning: network: this machine's, as --job_dir=gs://b/x is in Cloud Storage" in said
    assert "listen on every interface (0.0.0.0), unauthenticated" in said


def test_without_namespaces_the_cluster_runs_on_the_machines_network_or_refuses(
    make_cluster, monkeypatch, tmp_path
):
    monkeypatch.setenv("PATH", str(tmp_path))  # no unshare, no nsenter
    sink = io.StringIO()
    cluster = make_cluster(ClusterShape(workers=1), "--sleep=-1", sink=sink)
    cluster.start()
    assert cluster.network == "host"
    assert "no private network namespace (util-linux's unshare and nsenter" in sink.getvalue()
    with pytest.raises(PrivateNetworkUnavailable, match="no private network namespace for the"):
        make_cluster(ClusterShape(workers=1), "--sleep=-1", network="private").start()


def test_a_namespace_that_never_gets_ready_is_given_up_saying_so(
    make_cluster, monkeypatch, private_network
):
    monkeypatch.setattr(network, "_HOLD_NAMESPACE", "import time; time.sleep(60)")
    monkeypatch.setattr(network, "NAMESPACE_START_SECS", 0.5)
    started = time.monotonic()
    with pytest.raises(
        PrivateNetworkUnavailable, match="the namespace's holder gave no word in 0.5 s"
    ):
        make_cluster(ClusterShape(workers=1), "--sleep=-1", network="private").start()
    assert time.monotonic() - started < 10  # not the holder's 60 s


def test_a_stopped_cluster_starts_nothing_again(make_cluster):
    """Its private network ends with it: a task restarted after stop() would run nowhere (or,
    without the namespace, on this machine's network)."""
    cluster = make_cluster(ClusterShape(workers=1), "--sleep=-1")
    cluster.start()
    cluster.stop()
    with pytest.raises(RuntimeError, match="the cluster is stopped"):
        cluster.restart("worker", 0)
    with pytest.raises(RuntimeError, match="the cluster is stopped"):
        cluster.start()


def test_chief_and_evaluator_alone_still_get_tf_config(make_cluster):
    cluster = make_cluster(ClusterShape(evaluator=True), "--sleep=-1")
    cluster.start()
    wait_for(lambda: all_ready(cluster), what="chief and evaluator")
    evaluator = env_line(cluster.output("evaluator"))["TF_CONFIG"]
    assert evaluator["cluster"] == {"chief": [cluster.addresses[Task("chief")]]}
    assert evaluator["task"] == {"type": "evaluator", "index": 0}


def test_lone_chief_runs_without_tf_config(make_cluster):
    cluster = make_cluster(ClusterShape(), env=dict(os.environ, TF_CONFIG='{"x": 1}'))
    cluster.start()
    assert cluster.wait(timeout=10) == 0
    cluster.stop()
    env = env_line(cluster.output("chief"))
    assert env["TF_CONFIG"] is None and env["CLUSTER_SPEC"] is None
    assert env["GRPC_FAIL_FAST"] == "use_caller"
    assert cluster.addresses == {}


@pytest.mark.parametrize("code", [0, 3, 17])
def test_wait_returns_the_chiefs_exit_code(make_cluster, code):
    cluster = make_cluster(ClusterShape(workers=1), f"--exit_code={code}")
    cluster.start()
    assert cluster.wait(timeout=10) == code


def test_wait_times_out_while_the_chief_runs(make_cluster):
    cluster = make_cluster(ClusterShape(), "--sleep=-1")
    cluster.start()
    with pytest.raises(TimeoutError):
        cluster.wait(timeout=0.3)


def test_stop_ends_every_process(make_cluster):
    cluster = make_cluster(FULL, "--sleep=0.3")
    cluster.start()
    assert cluster.wait(timeout=10) == 0
    processes = [cluster.process(t.role, t.index) for t in FULL.tasks()]
    assert all(p.poll() is None for p in processes[1:]), "servers run until stopped"
    cluster.stop()
    assert not [p.pid for p in processes if is_alive(p.pid)]
    assert all(p.returncode == -signal.SIGTERM for p in processes[1:])


def test_processes_ignoring_sigterm_are_killed_after_the_grace_period(make_cluster):
    cluster = make_cluster(
        ClusterShape(workers=1, ps=1), "--ignore_sigterm", "--sleep=-1", grace=0.5
    )
    cluster.start()
    wait_for(lambda: all_ready(cluster), what="all tasks")
    started = time.monotonic()
    cluster.stop()
    assert time.monotonic() - started < 3
    assert [cluster.process(t.role, t.index).returncode for t in cluster.shape.tasks()] == [
        -signal.SIGKILL
    ] * 3


def test_output_is_collected_per_task_with_stderr_merged(make_cluster):
    sink = io.StringIO()
    cluster = make_cluster(ClusterShape(workers=1, ps=1), "--stderr", "--sleep=0.2", sink=sink)
    cluster.start()
    cluster.wait(timeout=10)
    cluster.stop()
    assert "worker 0 on stderr" in cluster.output("worker", 0)
    assert "ps 0 on stderr" in cluster.output("ps", 0)
    assert "[chief] chief 0 on stderr" in sink.getvalue().splitlines()


def test_a_failed_worker_is_reported_and_the_chief_goes_on(make_cluster):
    sink = io.StringIO()
    cluster = make_cluster(
        ClusterShape(workers=1, ps=1),
        "--others_exit=5",
        "--others_sleep=0.1",
        "--sleep=1.5",
        "--exit_code=0",
        sink=sink,
    )
    cluster.start()
    assert cluster.wait(timeout=10) == 0
    log = sink.getvalue()
    assert "[launch] worker 0 failed with code 5 before the chief ended" in log
    assert "[launch] ps 0 failed with code 5 before the chief ended" in log


def test_a_killed_worker_restarts_on_the_same_port(make_cluster):
    sink = io.StringIO()
    cluster = make_cluster(ClusterShape(workers=1, ps=1), "--listen", "--sleep=-1", sink=sink)
    cluster.start()
    wait_for(lambda: all_ready(cluster), what="all tasks listening")
    worker = Task("worker", 0)
    before = env_line(cluster.output("worker", 0))
    old = cluster.process("worker", 0)
    old.send_signal(signal.SIGKILL)
    assert old.wait(5) == -signal.SIGKILL
    wait_for(
        lambda: "worker 0 failed with code -9 (SIGKILL)" in sink.getvalue(),
        what="the failure report",
    )

    new = cluster.restart("worker", 0)
    wait_for(lambda: ready_count(cluster, worker) == 2, what="the restarted worker listening")
    after = env_line(cluster.output("worker", 0))
    assert new.pid != old.pid and after["pid"] == new.pid
    assert after["TF_CONFIG"] == before["TF_CONFIG"]
    assert after["CLUSTER_SPEC"] == before["CLUSTER_SPEC"]
    assert cluster.process("chief").poll() is None, "the chief was left alone"


def test_restart_stops_a_running_task_first(make_cluster):
    cluster = make_cluster(ClusterShape(ps=1), "--sleep=-1")
    cluster.start()
    old = cluster.process("ps", 0)
    new = cluster.restart("ps", 0)
    assert old.poll() == -signal.SIGTERM and new.poll() is None


def test_unknown_task_is_a_clear_error(make_cluster):
    cluster = make_cluster(ClusterShape(workers=1))
    with pytest.raises(KeyError, match="worker 3 is not in this cluster"):
        cluster.output("worker", 3)
    with pytest.raises(RuntimeError, match="call start"):
        cluster.process("worker", 0)
