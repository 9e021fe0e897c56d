"""The cost model of parameter-server training: predictions that behave, and a fit that recovers
the parameters its own predictions were made with. Pure arithmetic: no TensorFlow."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from trainer.placement import Placement
from trainer.placement.cost import (
    CENSUS_SUBNETWORK_BYTES,
    DEFAULT_PARAMS,
    PRIOR,
    Chunks,
    ClusterJob,
    CostParams,
    fit,
    predict,
)

REPLICATION, ROUND_ROBIN = Placement.REPLICATION, Placement.ROUND_ROBIN


def job(steps_per_loop: int = 100, **changes) -> ClusterJob:
    base = ClusterJob(
        placement=REPLICATION,
        workers=1,
        ps=1,
        batch_size=64,
        chunks=Chunks(steps_per_loop),
        subnetwork_bytes=CENSUS_SUBNETWORK_BYTES,
    )
    return dataclasses.replace(base, **changes)


def examples_per_s(**changes) -> float:
    return predict(job(**changes)).examples_per_s


def test_one_process_is_the_compute_bound_step():
    p = DEFAULT_PARAMS
    one = predict(job(workers=0, ps=0, batch_size=256))
    step_s = p.compute_s_per_example * 256 + p.step_overhead_s
    assert one.examples_per_s == pytest.approx(256 / step_s)
    assert one.job_steps_per_s == pytest.approx(1 / step_s)
    assert one.per_worker_efficiency == pytest.approx(1.0) and one.speedup == pytest.approx(1.0)


@pytest.mark.parametrize("placement", [REPLICATION, ROUND_ROBIN])
def test_one_worker_with_a_huge_chunk_approaches_one_process(placement):
    bound = predict(job(placement=placement, steps_per_loop=10**9))
    assert bound.per_worker_efficiency == pytest.approx(1.0, abs=1e-6)
    assert bound.bottleneck == "compute"
    every_step = predict(job(placement=placement, steps_per_loop=1))
    assert every_step.per_worker_efficiency < bound.per_worker_efficiency


@pytest.mark.parametrize("workers", [0, 1, 4])
def test_a_host_of_its_own_with_a_quarter_core_does_everything_four_times_slower(workers):
    """A simulated host's CPU budget scales every time of the model alike (each is CPU work
    there): examples/s fall by the budget, efficiency and the bottleneck stay."""
    whole = predict(job(workers=workers, ps=int(workers > 0)))
    quarter = predict(job(workers=workers, ps=int(workers > 0), replica_cores=0.25))
    assert quarter.examples_per_s == pytest.approx(whole.examples_per_s / 4)
    assert quarter.per_worker_efficiency == pytest.approx(whole.per_worker_efficiency)
    assert quarter.bottleneck == whole.bottleneck


def test_a_host_per_process_and_one_shared_machine_exclude_each_other():
    with pytest.raises(ValueError, match="exclude each other"):
        job(cores=2, replica_cores=0.5)
    with pytest.raises(ValueError, match="replica_cores"):
        job(replica_cores=0.0)


def test_chunks_last_about_chunk_secs_at_the_rate_they_give():
    timed = predict(job(chunks=Chunks(100, chunk_secs=0.5), workers=4))
    worker_steps_per_s = timed.examples_per_s / 64 / 4
    assert timed.steps_per_chunk == pytest.approx(0.5 * worker_steps_per_s)
    assert timed.steps_per_chunk > 100
    assert timed.examples_per_s > predict(job(workers=4)).examples_per_s
    # Never fewer than steps_per_loop, and never more than the budget split over the workers.
    assert predict(job(chunks=Chunks(100, chunk_secs=1e-6), workers=4)).steps_per_chunk == 100
    capped = predict(job(chunks=Chunks(100, chunk_secs=0.5, budget=800), workers=16))
    assert capped.steps_per_chunk == 50


@pytest.mark.parametrize("placement", [REPLICATION, ROUND_ROBIN])
def test_more_of_what_helps_is_never_slower(placement):
    grid = dict(placement=placement, workers=8, steps_per_loop=10)
    base = examples_per_s(**grid)
    assert examples_per_s(**{**grid, "steps_per_loop": 100}) >= base
    assert examples_per_s(**{**grid, "ps": 4}) >= base
    assert examples_per_s(**{**grid, "batch_size": 256}) >= base
    bigger = tuple(10 * b for b in CENSUS_SUBNETWORK_BYTES)
    assert examples_per_s(**{**grid, "subnetwork_bytes": bigger}) <= base
    assert examples_per_s(**{**grid, "cores": 2}) <= base


def test_replication_scales_until_the_servers_are_saturated():
    counts = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    rates = [predict(job(workers=n, steps_per_loop=10)) for n in counts]
    assert all(b.examples_per_s >= a.examples_per_s * (1 - 1e-9) for a, b in zip(rates, rates[1:]))
    assert all(
        b.per_worker_efficiency <= a.per_worker_efficiency + 1e-9 for a, b in zip(rates, rates[1:])
    )
    assert rates[0].bottleneck == "compute" and rates[-1].bottleneck == "parameter servers"
    # Saturated: the servers' bandwidth over the bytes a step moves.
    bandwidth = DEFAULT_PARAMS.ps_bandwidth_bytes_per_s
    step_bytes = 2 * 3 * sum(CENSUS_SUBNETWORK_BYTES) / 10
    assert rates[-1].examples_per_s == pytest.approx(64 * bandwidth / step_bytes)


def test_workers_sharing_two_cores_never_beat_two_processes():
    for placement, workers in itertools.product([REPLICATION, ROUND_ROBIN], [1, 2, 4, 8]):
        shared = predict(job(placement=placement, workers=workers, cores=2))
        assert shared.job_steps_per_s <= 2 * shared.baseline_job_steps_per_s
    alone = predict(job(workers=1))
    assert predict(job(workers=1, cores=64)) == alone


def test_round_robin_steps_are_cheaper_but_replication_finishes_the_iteration_sooner():
    k = len(CENSUS_SUBNETWORK_BYTES)
    replication = predict(job(workers=k + 1))
    round_robin = predict(job(workers=k + 1, placement=ROUND_ROBIN))
    # Every round-robin step trains one job; every replication step trains all of them.
    assert round_robin.examples_per_s > replication.examples_per_s
    assert round_robin.job_steps_per_s < replication.job_steps_per_s
    # One worker trains everything either way; with two, one of them still trains every
    # subnetwork, so the iteration is no faster.
    assert predict(job(placement=ROUND_ROBIN)) == predict(job())
    two = predict(job(workers=2, placement=ROUND_ROBIN))
    assert two.job_steps_per_s == pytest.approx(predict(job()).job_steps_per_s)
    assert two.examples_per_s == pytest.approx(2 * predict(job()).examples_per_s)


def test_round_robin_counts_the_steps_of_merged_units():
    # 4 workers, k = 4: ensemble, subnetworks 0+3, 1, 2; each unit runs the budget once.
    four = predict(job(workers=4, placement=ROUND_ROBIN))
    assert four.examples_per_s == pytest.approx(4 * 64 * four.job_steps_per_s)
    # 7 workers: a full block, then a second ensemble worker and one that trains every
    # subnetwork. Each job still gets the budget once, the two ensemble workers share theirs,
    # and a step of the last worker advances four jobs: fewer worker steps than 5 budgets.
    five = predict(job(workers=5, placement=ROUND_ROBIN))
    seven = predict(job(workers=7, placement=ROUND_ROBIN))
    assert seven.job_steps_per_s > five.job_steps_per_s
    assert 2 * 64 * seven.job_steps_per_s < seven.examples_per_s < 5 * 64 * seven.job_steps_per_s


TRUE = CostParams(
    compute_s_per_example=1.2e-5,
    step_overhead_s=4e-4,
    chunk_latency_s=6e-3,
    ps_bandwidth_bytes_per_s=8e7,
    input_share=0.4,
)


def synthetic_rows(params: CostParams) -> list[dict]:
    """Rows as bench/cluster.py writes them, measured by the model itself."""
    shapes = [(0, REPLICATION, 0)] + [
        (w, p, ps) for w in (1, 2, 5, 8) for p in (REPLICATION, ROUND_ROBIN) for ps in (1, 2)
    ]
    rows = []
    for (workers, placement, ps), batch, steps_per_loop, cores in zip(
        shapes,
        itertools.cycle([32, 256, 64]),
        itertools.cycle([1, 20, 100, 5]),
        itertools.cycle([None, 2]),
    ):
        one = job(
            placement=placement,
            workers=workers,
            ps=ps,
            batch_size=batch,
            chunks=Chunks(steps_per_loop, budget=2000),
            cores=cores,
        )
        rows.append(
            {
                "workers": workers,
                "ps": ps,
                "placement": placement.value if workers else "single process",
                "batch_size": batch,
                "steps_per_job": 2000,
                "steps_per_loop": steps_per_loop,
                "subnetwork_bytes": list(one.subnetwork_bytes),
                "optimizer_slots": one.optimizer_slots,
                "cores": cores,
                "examples_per_s": predict(one, params).examples_per_s,
            }
        )
    return rows


def test_fit_recovers_the_parameters_of_its_own_predictions():
    fitted = fit(synthetic_rows(TRUE))
    for field in dataclasses.fields(CostParams)[:-1]:
        assert getattr(fitted, field.name) == pytest.approx(getattr(TRUE, field.name), rel=0.02)
    # Only round-robin's slowest unit tells the input's share apart: the prior (0.3) keeps
    # part of its pull.
    assert abs(fitted.input_share - TRUE.input_share) < abs(PRIOR.input_share - TRUE.input_share)


def test_fit_holds_what_the_rows_cannot_tell_apart_at_the_prior():
    # One batch size: compute per example and overhead per step trade off against each other.
    rows = [r for r in synthetic_rows(TRUE) if r["batch_size"] == 64]
    fitted = fit(rows)
    for row in rows:
        one = ClusterJob.from_row(row)
        assert predict(one, fitted).examples_per_s == pytest.approx(row["examples_per_s"], rel=0.05)
    assert fit(rows, prior=PRIOR) == fitted


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match=r"chunk_latency_s \(0\) must be > 0"):
        dataclasses.replace(TRUE, chunk_latency_s=0)
    with pytest.raises(ValueError, match=r"input_share \(1\) must be in \[0, 1\)"):
        dataclasses.replace(TRUE, input_share=1)
    with pytest.raises(ValueError, match=r"ps \(0\) must be >= 1 with 2 workers"):
        job(workers=2, ps=0)
    with pytest.raises(ValueError, match=r"steps_per_loop \(0\) must be >= 1"):
        Chunks(0)
    with pytest.raises(ValueError, match=r"chunk_secs \(0\) must be > 0"):
        Chunks(chunk_secs=0)
    with pytest.raises(ValueError, match=r"lacks \['steps_per_job', 'steps_per_loop'"):
        ClusterJob.from_row({"workers": 1, "ps": 1, "placement": "replication", "batch_size": 8})
    with pytest.raises(ValueError, match="at least one row with examples_per_s"):
        fit([{"examples_per_s": None}])


def test_a_unit_of_one_subnetwork_still_pays_for_the_whole_input():
    """The input's share of an example's work is paid by every unit: with it a unit that
    trains a small part of the model costs more than that part of a whole step."""
    one = job(workers=5, placement=ROUND_ROBIN)
    without = predict(one, dataclasses.replace(TRUE, input_share=0.0))
    with_input = predict(one, TRUE)
    assert with_input.baseline_examples_per_s == pytest.approx(without.baseline_examples_per_s)
    assert with_input.job_steps_per_s < 0.9 * without.job_steps_per_s
