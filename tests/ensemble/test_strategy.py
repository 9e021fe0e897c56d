"""Truth tables for the ensemble strategies and candidate de-duplication."""

import pytest

from trainer.ensemble import strategy as st


def as_rows(specs):
    return [(s.name, s.keep_previous, s.new_subnetworks) for s in specs]


@pytest.mark.parametrize(
    "new, expected",
    [
        (["a"], [("grow_a", True, ("a",))]),
        (["a", "b"], [("grow_a", True, ("a",)), ("grow_b", True, ("b",))]),
        (
            ["b", "a", "c"],
            [("grow_b", True, ("b",)), ("grow_a", True, ("a",)), ("grow_c", True, ("c",))],
        ),
    ],
)
def test_grow_strategy(new, expected):
    assert as_rows(st.GrowStrategy().candidates(new)) == expected


@pytest.mark.parametrize(
    "new, expected",
    [
        (["a"], [("all", True, ("a",))]),
        (["a", "b"], [("all", True, ("a", "b"))]),
        (["b", "a", "c"], [("all", True, ("b", "a", "c"))]),
    ],
)
def test_all_strategy(new, expected):
    assert as_rows(st.AllStrategy().candidates(new)) == expected


@pytest.mark.parametrize(
    "new, expected",
    [
        (["a"], [("solo_a", False, ("a",))]),
        (["a", "b"], [("solo_a", False, ("a",)), ("solo_b", False, ("b",))]),
    ],
)
def test_solo_strategy(new, expected):
    assert as_rows(st.SoloStrategy().candidates(new)) == expected


@pytest.mark.parametrize("strategy", [st.GrowStrategy(), st.SoloStrategy()])
def test_one_per_subnetwork_strategies_give_nothing_for_no_subnetworks(strategy):
    assert strategy.candidates([]) == []


def test_all_strategy_rejects_no_new_subnetworks():
    with pytest.raises(ValueError, match="no new subnetwork"):
        st.AllStrategy().candidates([])


def test_candidate_spec_needs_a_new_subnetwork():
    with pytest.raises(ValueError, match="'x'"):
        st.CandidateSpec("x", True, ())


def test_registry_names():
    assert set(st.STRATEGIES) == {"grow", "all", "solo"}
    for name, strategy in st.STRATEGIES.items():
        assert strategy.name == name
    assert isinstance(st.STRATEGIES["grow"], st.GrowStrategy)
    assert isinstance(st.STRATEGIES["all"], st.AllStrategy)
    assert isinstance(st.STRATEGIES["solo"], st.SoloStrategy)


G, A, S = st.GrowStrategy(), st.AllStrategy(), st.SoloStrategy()


@pytest.mark.parametrize(
    "strategies, new, has_previous, expected_names",
    [
        # Iteration 0: no previous ensemble, so grow_x, solo_x (and all, for one subnetwork)
        # are the same membership; the first strategy's name wins.
        ([G], ["a", "b"], False, ["grow_a", "grow_b"]),
        ([G, S], ["a", "b"], False, ["grow_a", "grow_b"]),
        ([S, G], ["a", "b"], False, ["solo_a", "solo_b"]),
        ([G, A], ["a"], False, ["grow_a"]),
        ([A, G], ["a"], False, ["all"]),
        ([G, A, S], ["a", "b"], False, ["grow_a", "grow_b", "all"]),
        ([S, A], ["a", "b"], False, ["solo_a", "solo_b", "all"]),
        # Later iterations: keeping the previous members makes a different membership.
        ([G, S], ["a", "b"], True, ["grow_a", "grow_b", "solo_a", "solo_b"]),
        ([S, G], ["a"], True, ["solo_a", "grow_a"]),
        ([G, A, S], ["a", "b"], True, ["grow_a", "grow_b", "all", "solo_a", "solo_b"]),
        # All with one subnetwork is grow with that subnetwork, in any iteration.
        ([G, A], ["a"], True, ["grow_a"]),
        ([A, S], ["a"], True, ["all", "solo_a"]),
        # The same strategy twice adds nothing.
        ([G, G], ["a", "b"], True, ["grow_a", "grow_b"]),
        ([], ["a"], True, []),
    ],
)
def test_candidate_specs_dedup(strategies, new, has_previous, expected_names):
    specs = st.candidate_specs(strategies, new, has_previous=has_previous)
    assert [s.name for s in specs] == expected_names


def test_candidate_specs_keeps_specs_unchanged():
    specs = st.candidate_specs([G, S], ["a"], has_previous=True)
    assert as_rows(specs) == [("grow_a", True, ("a",)), ("solo_a", False, ("a",))]


def test_candidate_specs_membership_ignores_order():
    class Reversed(st.Strategy):
        name = "reversed"

        def candidates(self, new_subnetworks):
            return [st.CandidateSpec("rev", True, tuple(reversed(new_subnetworks)))]

    specs = st.candidate_specs([A, Reversed()], ["a", "b"], has_previous=True)
    assert [s.name for s in specs] == ["all"]
