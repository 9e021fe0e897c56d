"""Real multi-process clusters on loopback: `python -m trainer.task` as chief, workers, ps and
evaluator, each with its own TF_CONFIG (deploy.local.cluster.LocalCluster), on the
census data.

Every test writes each task's prefixed output to a log file, has a timeout, and stops every
process when it ends, pass or fail (LocalCluster's context manager).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from deploy.local.cluster import LocalCluster, free_ports
from tests.support import REPO, env_without_tensorflow, run_task, task_env
from trainer.distribute.cluster import ClusterShape, Task

BUDGET = 600
ARGS = (
    "--generator=dnn",
    "--max_iterations=2",
    f"--max_iteration_steps={BUDGET}",
    "--checkpoint_every_secs=1",
    "--server_grace_secs=30",
    "--cluster_timeout_secs=120",
)
MIN_ACCURACY = 0.83  # census: 0.76 by predicting the majority class; ~0.85 after 2 x 600 steps


class Job:
    """A local cluster running the trainer with a job dir and a log file."""

    def __init__(
        self,
        tmp_path: Path,
        shape: ClusterShape,
        *extra: str,
        job_dir: str | None = None,
        env: dict | None = None,
        module: str = "trainer.task",
    ):
        self.dir = tmp_path / "job"
        self.log_path = tmp_path / "cluster.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 (closed in __exit__)
        self.cluster = LocalCluster(
            shape,
            module=module,
            cwd=REPO,
            sink=self.log,
            env=env,
            grace=10,
            args=(f"--job_dir={job_dir or self.dir}",) + ARGS + extra,
        )

    def __enter__(self) -> Job:
        self.cluster.start()
        return self

    def __exit__(self, *exc):
        self.cluster.stop()
        self.log.close()
        if exc[0] is not None:  # show what the processes said, the chief's last words first
            print("The chief's last lines:", *self.chief_tail(), sep="\n")
            print(self.log_path.read_text()[-20000:])

    def chief_tail(self, lines: int = 40) -> list[str]:
        """The chief's last lines, without TensorFlow's per-function gRPC clean-up noise."""
        noise = (
            "Failed to remove function",
            "Additional GRPC error",
            "This could happen if",
            ':{"created"',
            "Reduce to /device",
            "Sharding callback",
        )
        said = [line for line in self.cluster.output("chief") if not any(n in line for n in noise)]
        return said[-lines:]

    def wait_for_line(self, role: str, text: str, timeout: float = 240, index: int = 0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.cluster.output(role, index)):
                return
            if role == "chief" and self.cluster.process("chief").poll() is not None:
                raise AssertionError(f"the chief exited before printing {text!r}")
            time.sleep(0.2)
        raise AssertionError(f"{role} {index} never printed {text!r}")

    def wait_for_file(self, path: Path, timeout: float = 240):
        deadline = time.monotonic() + timeout
        while not path.exists():
            assert time.monotonic() < deadline, f"{path} never appeared"
            time.sleep(0.2)

    def finish_with_evaluator(self) -> dict:
        """Waits for a successful chief and for the evaluator to see the job complete."""
        assert self.cluster.wait(timeout=400) == 0
        self.wait_for_line("evaluator", "the job is complete", timeout=60)
        return self.report()

    def report(self) -> dict:
        return json.loads((self.dir / "report.json").read_text())


def assert_trained(report: dict, iterations: int = 2) -> None:
    """Complete, every new subnetwork trained its full budget, and the model is good."""
    assert report["status"] == "complete"
    assert len(report["iterations"]) == iterations
    for record in report["iterations"]:
        assert record["steps"] >= BUDGET
        assert all(s["steps"] >= BUDGET for s in record["subnetworks"]), record["subnetworks"]
    assert report["final"]["metrics"]["accuracy"] >= MIN_ACCURACY


def steps_by_unit(record: dict) -> dict[str, dict[str, int]]:
    return {u["unit"]: u["steps_by_worker"] for u in record["placement"]}


def test_a_small_parameter_server_cluster_trains_and_exports(tmp_path):
    """A cluster end to end, quickly (the slow tests below train longer, with more roles): a
    chief, a worker and a parameter server train one short iteration and export the model."""
    steps = 100
    with Job(
        tmp_path,
        ClusterShape(workers=1, ps=1),
        "--max_iterations=1",
        f"--max_iteration_steps={steps}",
    ) as job:
        if job.cluster.network == "private":  # where one can be made (and the slow test below)
            _assert_servers_listen_in_the_private_namespace_alone(job)
        assert job.cluster.wait(timeout=300) == 0
        report = job.report()
    assert report["status"] == "complete"
    [record] = report["iterations"]
    assert all(s["steps"] >= steps for s in record["subnetworks"]), record["subnetworks"]
    assert set(report["input"]["readers"]) == {"worker 0"}
    assert (job.dir / "model" / "saved_model.pb").exists()


@pytest.mark.slow
def test_round_robin_with_parameter_servers_and_an_evaluator(tmp_path):
    shape = ClusterShape(workers=2, ps=2, evaluator=True)
    with Job(tmp_path, shape, "--placement=round_robin") as job:
        report = job.finish_with_evaluator()
    assert_trained(report)
    for record in report["iterations"]:
        # AdaNet's assignment for 2 workers, k = 2: worker 0 the ensemble, worker 1 both
        # subnetworks; each really ran only its own unit.
        units = {u["unit"]: u for u in record["placement"]}
        assert set(units) == {"ensemble", "subnetworks 0,1"}
        assert units["ensemble"]["assigned_to"] == ["worker 0"]
        assert set(units["ensemble"]["steps_by_worker"]) == {"worker 0"}
        assert units["subnetworks 0,1"]["assigned_to"] == ["worker 1"]
        assert set(units["subnetworks 0,1"]["steps_by_worker"]) == {"worker 1"}
        assert units["subnetworks 0,1"]["steps_by_worker"]["worker 1"] >= BUDGET
        # The cost model's word: each job trains its whole budget on about one worker.
        assert "--placement=replication would end sooner" in record["placement_note"]
        # Each subnetwork's variables on its own parameter server (k = 2 subnetworks, 2 ps).
        names = [s["name"] for s in record["subnetworks"]]
        assert units["subnetworks 0,1"]["subnetwork_variables_on_ps"] == {
            names[0]: [0],
            names[1]: [1],
        }
    # The evaluator, outside the cluster, evaluated both iterations: periodic checkpoints (from
    # any step, a subnetwork perhaps still untrained) and last the frozen chosen ensemble, with
    # the metrics the chief recorded for it on the same eval rows.
    for record in report["iterations"]:
        t = record["iteration"]
        evaluations = json.loads((job.dir / "eval" / f"iteration-{t}.json").read_text())
        assert all(e["iteration"] == t for e in evaluations)
        assert all(0 <= m["accuracy"] <= 1 for e in evaluations for m in e["candidates"].values())
        *periodic, last = evaluations
        assert last["checkpoint"] == str(job.dir / "checkpoints" / f"frozen-{t}" / "ensemble")
        assert last["subnetwork_steps"] == {s["name"]: s["steps"] for s in record["subnetworks"]}
        [(name, metrics)] = last["candidates"].items()
        assert name == record["chosen"]
        chosen = next(c for c in record["candidates"] if c["name"] == name)
        assert metrics == pytest.approx(chosen["eval"], abs=1e-4)
        for e in periodic:
            assert set(e["subnetwork_steps"]) == set(last["subnetwork_steps"])
            assert e["step"] <= record["steps"]
    # Each worker read its own half of the census rows (one file: split by line number).
    readers = report["input"]["readers"]
    assert set(readers) == {"worker 0", "worker 1"}
    assert "is 0 modulo 2" in readers["worker 0"]["rows"]
    assert "is 1 modulo 2" in readers["worker 1"]["rows"]
    # Workers and ps ended cleanly when the chief was done.
    for role, count in (("worker", 2), ("ps", 2)):
        for i in range(count):
            assert job.cluster.process(role, i).wait(timeout=30) == 0


@pytest.mark.slow
def test_replication_with_parameter_servers_and_an_evaluator(tmp_path):
    """Both workers train everything, their chunks' changes added by the outer step (delayed
    Nesterov momentum), which counts every chunk."""
    shape = ClusterShape(workers=2, ps=1, evaluator=True)
    flags = ("--placement=replication", "--outer_momentum=0.9", "--outer_learning_rate=0.7")
    with Job(tmp_path, shape, *flags) as job:
        report = job.finish_with_evaluator()
    assert_trained(report)
    for record in report["iterations"]:
        [unit] = record["placement"]
        assert unit["unit"] == "everything"
        assert unit["assigned_to"] == ["worker 0", "worker 1"]
        by_worker = unit["steps_by_worker"]
        assert set(by_worker) == {"worker 0", "worker 1"}  # both trained, asynchronously
        assert sum(by_worker.values()) >= BUDGET
        assert unit["outer_arrivals"] >= 2
    assert all(r["placement_note"] is None for r in report["iterations"])
    assert list((job.dir / "eval").glob("iteration-*.json"))


@pytest.mark.slow
def test_multi_worker_mirrored_without_parameter_servers(tmp_path):
    with Job(tmp_path, ClusterShape(workers=1)) as job:
        assert job.cluster.wait(timeout=400) == 0
        assert job.cluster.process("worker", 0).wait(timeout=60) == 0
        report = job.report()
    assert_trained(report)
    for record in report["iterations"]:
        # Synchronous: both replicas ran every step of everything.
        assert steps_by_unit(record) == {"everything": {"chief": BUDGET, "worker 0": BUDGET}}
    assert set(report["input"]["readers"]) == {"chief", "worker 0"}  # each its own half
    # Only the chief wrote artifacts: nothing but its own files in the job dir.
    assert sorted(p.name for p in job.dir.iterdir()) == [
        "checkpoints",
        "feature_importance.png",
        "logs",
        "model",
        "model.json",
        "report.json",
        "report.png",
        "run.json",
        "schema.json",
    ]


@pytest.mark.slow
def test_round_robin_needs_parameter_servers(tmp_path):
    with Job(tmp_path, ClusterShape(workers=1), "--placement=round_robin") as job:
        assert job.cluster.wait(timeout=120) == 2
        assert any(
            "--placement=round_robin needs parameter servers" in line
            for line in job.cluster.output("chief")
        )
    assert not (job.dir / "run.json").exists()


# -- faults ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_rejoins(tmp_path):
    shape = ClusterShape(workers=2, ps=1)
    # Longer iterations: the coordinator reconnects to a restarted worker after gRPC's
    # reconnect backoff (10-25 s here), and the worker then rebuilds its dataset.
    with Job(
        tmp_path,
        shape,
        "--placement=replication",
        "--max_iterations=3",
        "--max_iteration_steps=3000",
    ) as job:
        job.wait_for_line("chief", "iteration 0 step")
        job.cluster.process("worker", 1).send_signal(signal.SIGKILL)
        job.cluster.process("worker", 1).wait(timeout=30)
        job.cluster.restart("worker", 1)
        job.wait_for_line("chief", "Worker /job:worker/replica:0/task:1 has been recovered")
        assert job.cluster.wait(timeout=500) == 0
        report = job.report()
    assert_trained(report, iterations=3)
    # The restarted worker rejoined: it trained again after the iteration it was killed in.
    later = [r["placement"][0]["steps_by_worker"] for r in report["iterations"][1:]]
    assert any(steps.get("worker 1", 0) > 0 for steps in later), later


@pytest.mark.slow
def test_a_lost_round_robin_worker_is_taken_over(tmp_path):
    """Worker 1 (both subnetworks) dies for good: after --stall_secs the idle ensemble worker
    trains its share, so no subnetwork is left untrained and the chief does not hang."""
    shape = ClusterShape(workers=2, ps=1)
    with Job(tmp_path, shape, "--placement=round_robin", "--stall_secs=10") as job:
        job.wait_for_line("chief", "iteration 0 step")
        job.cluster.process("worker", 1).send_signal(signal.SIGKILL)
        assert job.cluster.wait(timeout=400) == 0
        report = job.report()
        assert any("idle workers take over" in line for line in job.cluster.output("chief"))
    assert_trained(report)
    last = steps_by_unit(report["iterations"][-1])
    assert last["subnetworks 0,1"].get("worker 0", 0) > 0  # taken over
    assert "worker 1" not in last["subnetworks 0,1"]


@pytest.mark.slow
def test_a_lost_worker_error_passed_on_by_the_coordinator_is_trained_through(tmp_path):
    """When the coordinator passes a lost worker's chunk error on to the chief (a race),
    the chief schedules its steps again and the job completes."""
    with Job(
        tmp_path,
        ClusterShape(workers=2, ps=1),
        "--placement=replication",
        module="tests.strict_coordinator_task",
    ) as job:
        job.wait_for_line("chief", "iteration 0 step")
        job.cluster.process("worker", 1).send_signal(signal.SIGKILL)
        assert job.cluster.wait(timeout=400) == 0
        report = job.report()
        assert any(
            "A chunk failed with a lost worker" in line for line in job.cluster.output("chief")
        )
    assert_trained(report)


@pytest.mark.slow
def test_a_restarted_chief_resumes_without_losing_finished_work(tmp_path):
    shape = ClusterShape(workers=2, ps=1)
    with Job(tmp_path, shape, "--placement=replication") as job:
        record = job.dir / "checkpoints" / "iteration-0.json"
        job.wait_for_file(record)
        # The index a checkpoint manager writes last: iteration 1 has a whole checkpoint (its
        # progress line comes just before the save, so killing on the line could beat it).
        job.wait_for_file(job.dir / "checkpoints" / "iteration-1" / "checkpoint")
        finished = record.read_bytes()
        job.cluster.process("chief").send_signal(signal.SIGKILL)
        job.cluster.process("chief").wait(timeout=30)
        job.cluster.restart("chief")
        assert job.cluster.wait(timeout=400) == 0
        chief = "\n".join(job.cluster.output("chief"))
        report = job.report()
    assert "iterations 0..0 are finished" in chief
    assert "Iteration 1: resumed from" in chief
    assert record.read_bytes() == finished  # the finished iteration was not redone
    assert_trained(report)


@pytest.mark.slow
def test_a_lost_parameter_server_stops_the_chief_and_a_restart_resumes(tmp_path):
    shape = ClusterShape(workers=2, ps=1)
    with Job(tmp_path, shape, "--placement=replication") as job:
        job.wait_for_file(job.dir / "checkpoints" / "iteration-0.json")
        job.wait_for_line("chief", "iteration 1 step")
        job.cluster.process("ps", 0).send_signal(signal.SIGKILL)
        assert job.cluster.wait(timeout=300) == 1
        assert any(
            "ps 0 became unreachable" in line and "resumes from the last checkpoint" in line
            for line in job.cluster.output("chief")
        )
        job.cluster.restart("ps", 0)
        job.cluster.restart("chief")
        assert job.cluster.wait(timeout=400) == 0
        chief = "\n".join(job.cluster.output("chief"))
        report = job.report()
    assert "iterations 0..0 are finished" in chief
    assert_trained(report)


@pytest.mark.slow
def test_a_cluster_writes_its_checkpoints_to_cloud_storage(tmp_path, gcs, bucket):
    """The chief writes every checkpoint (the io device), wherever a variable lives; only it
    needs the storage settings, and nothing lands on local disks."""
    with Job(
        tmp_path,
        ClusterShape(workers=2, ps=1),
        "--checkpoint_every_secs=600",  # the iterations' saves alone (periodic ones: 97 s, not 50)
        job_dir=f"gs://{bucket}/job",
        env=gcs.env(task_env()),
    ) as job:
        assert job.cluster.wait(timeout=400) == 0
    names = gcs.object_names(bucket, "job/")
    for name in (
        "job/report.json",
        "job/model/saved_model.pb",
        "job/checkpoints/iteration-0.json",
        "job/checkpoints/iteration-1.json",
        "job/checkpoints/frozen-1/ensemble.index",
    ):
        assert name in names
    report = json.loads(gcs.client().bucket(bucket).blob("job/report.json").download_as_text())
    assert_trained(report)
    assert not job.dir.exists()


@pytest.mark.slow  # checked by the small cluster's test above wherever a namespace can be made
def test_tensorflow_servers_listen_in_the_private_namespace_alone(tmp_path, private_network):
    with Job(tmp_path, ClusterShape(workers=1, ps=1)) as job:
        assert job.cluster.network == "private"
        _assert_servers_listen_in_the_private_namespace_alone(job)


def _assert_servers_listen_in_the_private_namespace_alone(job: Job) -> None:
    """TensorFlow's servers bind every interface (its address in TF_CONFIG notwithstanding);
    a local cluster's are in a network namespace with only loopback, not on this machine's."""
    from tests.deploy.test_local_cluster import interfaces, listening

    for role in ("worker", "ps"):
        job.wait_for_line(role, "serving at", timeout=120)
        port = int(job.cluster.addresses[Task(role)].rsplit(":", 1)[1])
        pid = job.cluster.process(role).pid
        assert listening(port, pid) in (["0.0.0.0"], ["::"]), role  # every interface...
        assert interfaces(pid) == ["lo"]  # ...of a namespace with loopback alone
        assert listening(port) == [], f"{role}'s server is on this machine's network"


# -- roles from TF_CONFIG, in single processes ------------------------------------------------
@pytest.mark.slow
def test_a_chief_whose_servers_never_start_stops_with_their_names(tmp_path):
    ports = free_ports(3)
    config = {
        "cluster": {
            "chief": [f"127.0.0.1:{ports[0]}"],
            "worker": [f"127.0.0.1:{ports[1]}"],
            "ps": [f"127.0.0.1:{ports[2]}"],
        },
        "task": {"type": "chief", "index": 0},
    }
    result = run_task(
        [f"--job_dir={tmp_path / 'job'}", "--cluster_timeout_secs=2"],
        env=task_env(TF_CONFIG=json.dumps(config)),
        timeout=120,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert (
        f"training stopped: worker 0 (127.0.0.1:{ports[1]}), ps 0 (127.0.0.1:{ports[2]}) never "
        "answered in 2 s (--cluster_timeout_secs)" in result.stderr
    )
    assert not (tmp_path / "job").exists()


def test_a_malformed_tf_config_stops_every_role_before_any_work(tmp_path):
    bad = json.dumps({"cluster": {"chief": ["127.0.0.1:1"]}, "task": {"type": "boss"}})
    env = env_without_tensorflow(tmp_path, TF_CONFIG=bad)  # answered before TensorFlow loads
    result = run_task([f"--job_dir={tmp_path / 'job'}"], env=env, timeout=120)
    assert result.returncode == 2
    assert "TF_CONFIG['task']['type'] is 'boss'" in result.stderr
    assert not (tmp_path / "job").exists()
