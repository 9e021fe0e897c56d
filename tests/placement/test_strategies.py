"""Placement truth tables: AdaNet's round-robin assignment and ps groups, and replication."""

import itertools

import pytest

from trainer.placement import (
    Placement,
    ReplicationStrategy,
    RoundRobinStrategy,
    Unit,
    ps_for_variable,
)

E = Unit(ensemble=True, subnetworks=())


def S(*subnetworks):
    return Unit(ensemble=False, subnetworks=subnetworks)


def ALL(k):
    return Unit(ensemble=True, subnetworks=tuple(range(k)))


# AdaNet's documented assignment for k = 3 (adanet.distributed.RoundRobinStrategy), extended
# to 8 workers, and the same rule for k = 1 and k = 5.
ROUND_ROBIN = {
    (1, 1): [ALL(1)],
    (2, 1): [E, S(0)],
    (3, 1): [E, S(0), E],
    (4, 1): [E, S(0), E, S(0)],
    (5, 1): [E, S(0), E, S(0), E],
    (6, 1): [E, S(0), E, S(0), E, S(0)],
    (7, 1): [E, S(0), E, S(0), E, S(0), E],
    (8, 1): [E, S(0), E, S(0), E, S(0), E, S(0)],
    (1, 3): [ALL(3)],
    (2, 3): [E, S(0, 1, 2)],
    (3, 3): [E, S(0, 2), S(1)],
    (4, 3): [E, S(0), S(1), S(2)],
    (5, 3): [E, S(0), S(1), S(2), E],
    (6, 3): [E, S(0), S(1), S(2), E, S(0, 1, 2)],
    (7, 3): [E, S(0), S(1), S(2), E, S(0, 2), S(1)],
    (8, 3): [E, S(0), S(1), S(2), E, S(0), S(1), S(2)],
    (1, 5): [ALL(5)],
    (2, 5): [E, S(0, 1, 2, 3, 4)],
    (3, 5): [E, S(0, 2, 4), S(1, 3)],
    (4, 5): [E, S(0, 3), S(1, 4), S(2)],
    (5, 5): [E, S(0, 4), S(1), S(2), S(3)],
    (6, 5): [E, S(0), S(1), S(2), S(3), S(4)],
    (7, 5): [E, S(0), S(1), S(2), S(3), S(4), E],
    (8, 5): [E, S(0), S(1), S(2), S(3), S(4), E, S(0, 1, 2, 3, 4)],
}


@pytest.mark.parametrize("workers,k", sorted(ROUND_ROBIN))
def test_round_robin_assignment(workers, k):
    assignment = RoundRobinStrategy().assign(num_workers=workers, num_subnetworks=k)
    assert list(assignment.units) == ROUND_ROBIN[(workers, k)]


@pytest.mark.parametrize("workers,k", list(itertools.product(range(1, 9), (1, 3, 5))))
@pytest.mark.parametrize("strategy", [ReplicationStrategy(), RoundRobinStrategy()])
def test_no_job_is_left_untrained(strategy, workers, k):
    """AdaNet's drop_remainder hang: some subnetwork with no worker. Never here."""
    units = strategy.assign(num_workers=workers, num_subnetworks=k).units
    assert len(units) == workers
    assert any(u.ensemble for u in units)
    assert set().union(*(u.subnetworks for u in units)) == set(range(k))


@pytest.mark.parametrize("workers,k", list(itertools.product(range(1, 9), (1, 3, 5))))
def test_replication_gives_every_worker_everything(workers, k):
    assignment = ReplicationStrategy().assign(num_workers=workers, num_subnetworks=k)
    assert assignment.distinct == (ALL(k),)
    assert assignment.workers_of(ALL(k)) == tuple(range(workers))


def test_assignment_indexes_distinct_units():
    assignment = RoundRobinStrategy().assign(num_workers=8, num_subnetworks=3)
    assert assignment.distinct == (E, S(0), S(1), S(2))
    assert [assignment.unit_index(w) for w in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert assignment.workers_of(S(1)) == (2, 6)


# (ps, k) -> the ps group of each subnetwork.
PS_GROUPS = {
    (1, 1): [(0,)],
    (1, 3): [(0,), (0,), (0,)],
    (2, 3): [(0,), (1,), (0,)],
    (3, 3): [(0,), (1,), (2,)],
    (4, 3): [(0, 3), (1,), (2,)],
    (6, 3): [(0, 3), (1, 4), (2, 5)],
    (5, 5): [(0,), (1,), (2,), (3,), (4,)],
    (3, 5): [(0,), (1,), (2,), (0,), (1,)],
}


@pytest.mark.parametrize("ps,k", sorted(PS_GROUPS))
def test_round_robin_ps_groups(ps, k):
    groups = [
        RoundRobinStrategy().ps_group(num_ps=ps, num_subnetworks=k, subnetwork=s) for s in range(k)
    ]
    assert groups == PS_GROUPS[(ps, k)]


def test_replication_spreads_variables_over_all_ps():
    assert ReplicationStrategy().ps_group(num_ps=3, num_subnetworks=2, subnetwork=1) is None


def test_variables_are_spread_in_a_group_by_a_stable_hash():
    names = [f"t0_dnn_1x64/dense_{i}/kernel" for i in range(40)]
    servers = [ps_for_variable((1, 4), n) for n in names]
    assert set(servers) == {1, 4}
    assert servers == [ps_for_variable((1, 4), n) for n in names]  # stable


@pytest.mark.parametrize(
    "bad", [dict(num_workers=0, num_subnetworks=3), dict(num_workers=2, num_subnetworks=0)]
)
def test_bad_counts_are_rejected(bad):
    with pytest.raises(ValueError, match="must be >= 1"):
        RoundRobinStrategy().assign(**bad)


def test_units_describe_themselves():
    assert ALL(3).describe(3) == "everything"
    assert E.describe(3) == "ensemble"
    assert S(0, 2).describe(3) == "subnetworks 0,2"
    assert S(1).describe(3) == "subnetwork 1"
    with pytest.raises(ValueError):
        Unit(ensemble=False, subnetworks=())


def test_placement_names_match_the_flag():
    assert Placement("round_robin").strategy().name == "round_robin"
    assert Placement("replication").strategy().name == "replication"
