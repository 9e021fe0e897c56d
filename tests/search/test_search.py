"""The search decides on small values only: these tests build no model."""

from __future__ import annotations

import math

import pytest

from tests.support import minimal_record
from trainer import ensemble as ens
from trainer.config import SearchConfig
from trainer.errors import InputError, TrainingError
from trainer.model.dnn import DNNBuilder, DNNGenerator
from trainer.search.record import PREVIOUS_ENSEMBLER, Architecture, CandidateRecord, MemberRecord
from trainer.search.rules import Search


def _search(**changes) -> Search:
    config = dict(
        generator=DNNGenerator(layer_size=8),
        ensemblers=(ens.MeanEnsembler(),),
        strategies=(ens.GrowStrategy(), ens.AllStrategy()),
    )
    return Search(SearchConfig(**{**config, **changes}))


def test_the_first_proposal_grows_from_nothing_and_lists_each_membership_once():
    proposal = _search().propose(0, previous=())
    assert proposal.number == 0
    assert [b.name for b in proposal.builders] == ["dnn_0x8", "dnn_1x8"]
    # Without a previous ensemble, grow's one-subnetwork candidates are not repeated by all.
    memberships = [frozenset(s.new_subnetworks) for s in proposal.specs]
    assert len(memberships) == len(set(memberships))
    assert {"dnn_0x8", "dnn_1x8"} in [set(m) for m in memberships]


def test_a_later_proposal_grows_from_the_previous_members():
    proposal = _search().propose(1, previous=(DNNBuilder(1, 8),))
    assert [b.name for b in proposal.builders] == ["dnn_1x8", "dnn_2x8"]
    assert any(s.keep_previous for s in proposal.specs)


def _chosen(iteration: int, *members: tuple[str, int, str]):
    return minimal_record(
        iteration,
        architecture=Architecture(
            "mean", tuple(MemberRecord(key, it, builder, 1.0) for key, it, builder in members), {}
        ),
    )


def test_members_are_found_again_by_replaying_the_generator():
    records = [
        _chosen(0, ("t0_dnn_1x8", 0, "dnn_1x8")),
        _chosen(1, ("t0_dnn_1x8", 0, "dnn_1x8"), ("t1_dnn_2x8", 1, "dnn_2x8")),
    ]
    assert _search().members(records) == (DNNBuilder(1, 8), DNNBuilder(2, 8))
    assert _search().members([]) == ()


def test_a_member_the_generator_no_longer_proposes_is_a_clear_input_error():
    records = [_chosen(0, ("t0_dnn_1x8", 0, "dnn_1x8"))]
    with pytest.raises(InputError, match=r"dnn_1x8.*generator now proposes.*--job_dir"):
        _search(generator=DNNGenerator(layer_size=16)).members(records)


def test_choose_takes_the_lowest_selectable_objective():
    scores = [
        ens.Score("a", 0.5),
        ens.Score("b", 0.2, diverged=True),
        ens.Score("c", 0.3),
        ens.Score("d", math.nan),
    ]
    assert _search().choose(scores) == 2


def test_choose_fails_when_every_candidate_diverged():
    with pytest.raises(TrainingError):
        _search().choose([ens.Score("a", 0.5, diverged=True), ens.Score("b", math.inf)])


def test_ensembler_is_found_by_name():
    assert _search().ensembler("mean").name == "mean"


def _kept(iteration: int, kept_previous: bool):
    """A record whose choice is the previous ensemble or a grown one."""
    chosen = CandidateRecord(
        "previous_ensemble" if kept_previous else "grow",
        PREVIOUS_ENSEMBLER if kept_previous else "mean",
        (),
        0.5,
        False,
        {},
    )
    return minimal_record(iteration, chosen=chosen.name, candidates=(chosen,))


@pytest.mark.parametrize(
    "patience, kept, over",
    [
        (0, [False, True, True, True], False),  # 0: never over
        (1, [False], False),
        (1, [False, True], True),
        (1, [False, True, False], False),  # it grew again: not over
        (2, [False, True], False),
        (2, [False, True, True], True),
        (2, [True, False, True], False),  # in a row, not in all
        (3, [True, True], False),  # fewer records than the patience
    ],
)
def test_the_search_is_over_once_patience_iterations_in_a_row_kept_the_previous_ensemble(
    patience, kept, over
):
    records = [_kept(t, k) for t, k in enumerate(kept)]
    assert _search(patience=patience).is_over(records) is over
