"""bench/simcluster.py and bench/cluster.py's simulated rows, as far as they go without root:
the refusal, what each replica is told, and the cost model's held-out check. The simulation
itself (cgroups, namespaces) needs root and is never run by the tests."""

from __future__ import annotations

import pytest

from bench import cluster as cluster_bench
from bench import simcluster
from trainer.distribute.cluster import ClusterShape, Task
from trainer.placement import Placement, cost


def test_without_root_it_refuses_saying_why(monkeypatch):
    monkeypatch.setattr(simcluster.os, "geteuid", lambda: 1000)
    with pytest.raises(simcluster.NotAvailable, match="needs root"):
        simcluster.check_available()
    with pytest.raises(simcluster.NotAvailable, match="needs root"):
        simcluster.SimulatedCluster(
            ClusterShape(workers=1, ps=1), simcluster.Budget(0.5)
        ).__enter__()


def test_each_replica_is_a_host_of_its_own_at_vertexs_port():
    shape = ClusterShape(workers=2, ps=1)
    sim = simcluster.SimulatedCluster(shape, simcluster.Budget(0.25, link_mbit=500))
    addresses = sim.addresses
    assert addresses is not None
    assert [addresses[t] for t in shape.tasks()] == [
        f"10.77.0.{i}:2222" for i in range(1, len(shape.tasks()) + 1)
    ]
    words = sim.prefix(Task("worker", 1))
    assert words[-4:] == ["ip", "netns", "exec", sim.namespace(Task("worker", 1))]
    assert sim.group("cpu", Task("worker", 1)) in words
    assert sim.group("cpuacct", Task("worker", 1)) in words
    env = sim.environment({"no_proxy": "example.com"})
    assert env["TF_NUM_INTRAOP_THREADS"] == "1"
    assert env["no_proxy"].split(",")[0] == "example.com"
    assert "10.77.0.4" in env["no_proxy"].split(",")


def test_without_links_the_replicas_keep_loopback_and_get_only_cpu_groups():
    sim = simcluster.SimulatedCluster(ClusterShape(workers=1, ps=1), simcluster.Budget(0.5))
    assert sim.addresses is None
    assert "netns" not in sim.prefix(Task("chief"))
    lone = simcluster.SimulatedCluster(ClusterShape(), simcluster.Budget(0.5, link_mbit=100))
    assert lone.addresses is None  # one process: no server, no link


def test_the_link_keeps_a_vertex_workers_compute_to_network_ratio():
    assert simcluster.vertex_link_mbit(8) == simcluster.VERTEX_LINK_MBIT
    assert simcluster.vertex_link_mbit(0.25) == pytest.approx(500)


@pytest.mark.parametrize(
    "bad", [dict(cores=0), dict(cores=0.5, link_mbit=0), dict(cores=0.5, threads=0)]
)
def test_bad_budgets_are_refused(bad):
    with pytest.raises(ValueError):
        simcluster.Budget(**bad)


def _row(workers: int, placement: str, params: cost.CostParams) -> dict:
    """A simulated row whose examples/s is the model's own prediction with `params`."""
    row = {
        "workers": workers,
        "ps": 1 if workers and placement != cluster_bench.SYNCHRONOUS else 0,
        "placement": placement if workers else "single process",
        "steps_per_job": 800 * max(workers, 1),
        "budget_steps": 800 * max(workers, 1),
        "batch_size": 256,
        "steps_per_loop": 100,
        "chunk_secs": 1.0,
        "subnetwork_bytes": list(cost.CENSUS_SUBNETWORK_BYTES),
        "optimizer_slots": 2,
        "cores": None,
        "replica_cores": 0.25,
        "eval_loss": 0.26,
        "test_accuracy": 0.877,
        "wall_s": 100.0,
    }
    if placement == cluster_bench.SYNCHRONOUS:
        row["examples_per_s"], row["job_steps_per_s"] = 9000.0 * workers, 30.0
        return row
    p = cost.predict(cost.ClusterJob.from_row(row), params)
    row["examples_per_s"], row["job_steps_per_s"] = p.examples_per_s, p.job_steps_per_s
    return row


def test_the_cost_model_is_fitted_on_some_rows_and_checked_on_the_others():
    truth = cost.PRIOR
    rows = [_row(0, "replication", truth)] + [
        _row(w, p.value, truth) for w in (1, 2, 4, 8) for p in Placement
    ]
    rows.append(_row(2, cluster_bench.SYNCHRONOUS, truth))
    cluster_bench.fit_held_out(rows, {0, 1, 2})
    held_out = [r for r in rows if r.get("held_out")]
    assert sorted({r["workers"] for r in held_out}) == [4, 8]
    assert all(r["held_out"] is False for r in rows if r["workers"] in (1, 2) and r["ps"])
    assert "predicted_examples_per_s" not in rows[-1]  # synchronous: not the model's kind
    # The rows follow the model exactly: no error; held-out rows 1.5 times faster: 1/3.
    assert cluster_bench.held_out_error(rows) == pytest.approx(0.0, abs=1e-3)
    for row in held_out:
        row["examples_per_s"] *= 1.5
    assert cluster_bench.held_out_error(rows) == pytest.approx(1 / 3, abs=1e-3)
    assert rows[0]["per_worker_efficiency"] == pytest.approx(1.0)
    table = cluster_bench.simulated_table(rows)
    assert "held out" in table and "*" in table


def test_each_cluster_is_compared_with_one_process_of_its_step_budget():
    rows = [_row(0, "replication", cost.PRIOR), _row(2, "replication", cost.PRIOR)]
    reference = dict(rows[1], workers=0, reference=True, test_accuracy=0.870)
    del reference["replica_cores"]
    rows.append(reference)
    cluster_bench.fit_held_out(rows, {0, 2})
    assert "per_worker_efficiency" not in reference  # not a row of the cluster's budget
    lines = cluster_bench.simulated_table(rows).splitlines()
    two = next(line for line in lines if line.startswith("replication"))
    assert "+0.0070" in two  # 0.877 against the reference's 0.870
    assert len([line for line in lines if line.startswith(("replication", "single"))]) == 2


def test_a_fixed_job_is_timed_against_one_worker_and_one_replica_sized_process():
    def row(workers: int, placement: str, training: float, wall: float, loss: float) -> dict:
        return {
            "scaling": "fixed job",
            "workers": workers,
            "placement": placement if workers else "single process",
            "setup_s": 10.0,
            "first_step_s": 5.0,
            "training_s": training,
            "ending_s": 3.0,
            "wall_s": wall,
            "eval_loss": loss,
        }

    rows = [
        row(0, "replication", 40.0, 60.0, 0.250),
        row(1, "replication", 44.0, 66.0, 0.250),
        row(4, "replication", 22.0, 33.0, 0.255),
        row(4, "round_robin", 30.0, 50.0, 0.245),
        {"scaling": "weak", "workers": 8, "placement": "replication"},  # not of this table
    ]
    lines = cluster_bench.fixed_job_table(rows).splitlines()
    four = next(line for line in lines if line.startswith("replication") and " 4 " in line)
    # 2x one worker's training and wall time, 1.82x the single process's; loss 2% above it
    assert four.split()[-6:] == ["2.00", "2.00", "1.82", "1.82", "0.2550", "+2.0%"]
    robin = next(line for line in lines if line.startswith("round_robin"))
    # its ending and wall time, and no one-worker round-robin run to compare with
    assert robin.split()[5:9] == ["3.0", "50.0", "-", "-"]
    assert not any(line.startswith("replication") and " 8 " in line for line in lines)
