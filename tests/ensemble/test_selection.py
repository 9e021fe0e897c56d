"""choose(): the lowest finite objective wins; diverged candidates never do."""

import dataclasses
import math

import pytest

from trainer.ensemble.selection import TIE, Score, choose
from trainer.errors import TrainingError

NAN, INF = float("nan"), float("inf")


def scores(*rows):
    """rows: (objective, is_previous, diverged)."""
    return [Score(f"c{i}", obj, prev, div) for i, (obj, prev, div) in enumerate(rows)]


@pytest.mark.parametrize(
    "objective, diverged, selectable",
    [
        (0.5, False, True),
        (-3.0, False, True),
        (0.0, False, True),
        (0.5, True, False),
        (NAN, False, False),
        (INF, False, False),
        (-INF, False, False),
    ],
)
def test_is_selectable(objective, diverged, selectable):
    assert Score("c", objective, diverged=diverged).is_selectable is selectable


@pytest.mark.parametrize(
    "rows, force_grow, expected",
    [
        # lowest objective wins
        ([(0.3, False, False), (0.1, False, False), (0.2, False, False)], False, 1),
        ([(0.3, False, False), (0.2, False, False), (0.1, False, False)], False, 2),
        ([(-1.0, False, False), (0.0, False, False)], False, 0),
        # NaN / inf / -inf objectives never win (AdaNet mapped NaN to -inf and chose it)
        ([(0.5, False, False), (NAN, False, False)], False, 0),
        ([(NAN, False, False), (0.5, False, False)], False, 1),
        ([(-INF, False, False), (0.5, False, False)], False, 1),
        ([(INF, False, False), (0.5, False, False)], False, 1),
        # diverged never wins, even with the best finite objective
        ([(0.5, False, False), (0.01, False, True)], False, 0),
        # previous ensemble wins without force_grow when it is best
        ([(0.1, True, False), (0.2, False, False), (0.3, False, False)], False, 0),
        # force_grow excludes the previous ensemble
        ([(0.1, True, False), (0.2, False, False), (0.3, False, False)], True, 1),
        ([(0.1, True, False), (0.3, False, False), (0.2, False, False)], True, 2),
        # ... unless every new candidate diverged: then the previous one is kept
        ([(0.1, True, False), (NAN, False, False), (0.05, False, True)], True, 0),
        ([(0.9, True, False), (INF, False, False)], True, 0),
        # force_grow with one good new candidate takes it even if much worse
        ([(0.1, True, False), (5.0, False, False), (NAN, False, False)], True, 1),
        # force_grow at iteration 0 (no previous ensemble) is a plain choice
        ([(0.3, False, False), (0.2, False, False)], True, 1),
        # ties: the first of the tied candidates
        ([(0.2, False, False), (0.1, False, False), (0.1, False, False)], False, 1),
        ([(0.1, True, False), (0.1, False, False)], False, 0),
        ([(0.1, True, False), (0.2, False, False), (0.2, False, False)], True, 1),
    ],
)
def test_choose(rows, force_grow, expected):
    assert choose(scores(*rows), force_grow=force_grow) == expected


@pytest.mark.parametrize(
    "rows, force_grow",
    [
        ([(NAN, False, False)], False),
        ([(NAN, False, False), (INF, False, False), (0.1, False, True)], False),
        ([(NAN, True, False), (0.1, False, True)], True),
        ([(0.1, True, True), (-INF, False, False)], False),
        ([], False),
    ],
)
def test_nothing_selectable_raises(rows, force_grow):
    with pytest.raises(TrainingError, match="diverged"):
        choose(scores(*rows), force_grow=force_grow)


def test_error_names_the_candidates():
    rows = [Score("grow_dnn_1x64_mean", NAN), Score("solo_linear_mean", 0.2, diverged=True)]
    with pytest.raises(TrainingError) as info:
        choose(rows, force_grow=False)
    assert "grow_dnn_1x64_mean" in str(info.value)
    assert "solo_linear_mean" in str(info.value)


def test_never_chooses_nan_whatever_its_position():
    for position in range(4):
        objectives = [0.4, 0.3, 0.2, 0.25]
        objectives[position] = NAN
        chosen = choose([Score(f"c{i}", o) for i, o in enumerate(objectives)], force_grow=False)
        assert not math.isnan(objectives[chosen])
        finite = [o for o in objectives if not math.isnan(o)]
        assert objectives[chosen] == min(finite)


# -- the one-standard-error rule --------------------------------------------------------------
def _with_complexity(*rows):
    """rows: (objective, is_previous, complexity)."""
    return [Score(f"c{i}", obj, prev, False, cx) for i, (obj, prev, cx) in enumerate(rows)]


def _errors(count, value):
    return [[0.0 if i == j else value for j in range(count)] for i in range(count)]


@pytest.mark.parametrize(
    "error, margin, expected",
    [
        (0.05, 1.0, 0),  # previous 0.50 within 1 SE (0.05) of the best 0.46: kept
        (0.01, 1.0, 2),  # beyond 1 SE: the best, c2
        (0.05, 0.0, 2),  # margin 0: the lowest objective
        (0.02, 2.0, 0),  # within 2 SE
        (NAN, 1.0, 2),  # unknown error: the lowest objective
    ],
)
def test_the_previous_ensemble_is_kept_unless_a_candidate_beats_it_beyond_the_noise(
    error, margin, expected
):
    rows = _with_complexity((0.50, True, 0.0), (0.48, False, 2.0), (0.46, False, 1.0))
    assert choose(rows, force_grow=False, standard_errors=_errors(3, error), margin=margin) == (
        expected
    )


def test_within_the_margin_the_least_complex_new_candidate_wins():
    rows = _with_complexity((0.47, False, 1.4), (0.48, False, 0.0), (0.46, False, 2.0))
    assert choose(rows, force_grow=False, standard_errors=_errors(3, 0.05), margin=1.0) == 1
    assert choose(rows, force_grow=False, standard_errors=_errors(3, 0.015), margin=1.0) == 0


def test_differences_under_the_tie_floor_keep_the_simplest_however_small_their_error():
    # a table the first member separates: every held-out loss near zero, and so their errors
    rows = _with_complexity((3e-5, True, 0.0), (1e-6, False, 1.0), (2e-6, False, 2.0))
    assert choose(rows, force_grow=False, standard_errors=_errors(3, 1e-6), margin=1.0) == 0
    # beyond the floor the standard error rules again
    rows = _with_complexity((3e-4 + TIE, True, 0.0), (1e-4, False, 1.0), (2e-4, False, 2.0))
    assert choose(rows, force_grow=False, standard_errors=_errors(3, 1e-6), margin=1.0) == 1
    # margin 0 (no rule): the lowest objective, however close
    rows = _with_complexity((3e-5, True, 0.0), (1e-6, False, 1.0), (2e-6, False, 2.0))
    assert choose(rows, force_grow=False, standard_errors=_errors(3, 1e-6), margin=0.0) == 1


def test_force_grow_and_divergence_still_rule_out_candidates_under_the_margin():
    rows = _with_complexity((0.50, True, 0.0), (0.48, False, 0.0), (0.46, False, 1.0))
    errors = _errors(3, 0.1)
    assert choose(rows, force_grow=True, standard_errors=errors, margin=1.0) == 1
    diverged = [*rows[:2], Score("c2", 0.46, diverged=True)]
    assert choose(diverged, force_grow=False, standard_errors=errors, margin=1.0) == 0


def test_at_equal_complexity_the_candidate_with_fewer_parameters_is_simpler():
    # a linear model of the plain columns (11 numbers) against one of their bins (331), both
    # complexity 0: within the margin the smaller wins, beyond it the lower objective
    rows = [
        Score("grow_dnn_0x64", 0.46, complexity=0.0, parameters=331),
        Score("grow_linear", 0.48, complexity=0.0, parameters=11),
        Score("grow_dnn_1x64", 0.47, complexity=1.0, parameters=20_000),
    ]
    assert choose(rows, force_grow=False, standard_errors=_errors(3, 0.05), margin=1.0) == 1
    assert choose(rows, force_grow=False, standard_errors=_errors(3, 0.01), margin=1.0) == 0
    # complexity still comes first: a bigger network of lower complexity is simpler
    rows[1] = Score("grow_linear", 0.48, complexity=1.4, parameters=11)
    assert choose(rows, force_grow=False, standard_errors=_errors(3, 0.05), margin=1.0) == 0


def test_a_simpler_candidate_of_another_complexity_scale_does_not_win_within_the_margin():
    # churn: the trees' held-out loss 0.197, a 2-layer k-head network's 0.227 within one
    # standard error; the network's 1.41 is not "simpler" than a forest's 2.2
    rows = [
        Score("grow_trees", 0.197, complexity=2.2, parameters=90_000, scale="boosted trees"),
        Score("grow_kheads", 0.227, complexity=1.41, parameters=260_000, scale="network"),
        Score("grow_kheads_small", 0.22, complexity=1.0, parameters=250_000, scale="network"),
    ]
    errors = _errors(3, 0.031)
    assert choose(rows, force_grow=False, standard_errors=errors, margin=1.0) == 0
    # the lowest a network: the simpler network within the margin wins, never the trees
    rows[0] = dataclasses.replace(rows[0], objective=0.225, complexity=0.5)
    rows[1] = dataclasses.replace(rows[1], objective=0.2)
    assert choose(rows, force_grow=False, standard_errors=errors, margin=1.0) == 2
    # the previous ensemble is the simplest of every scale
    previous = Score("previous", 0.21, is_previous=True, scale="")
    assert (
        choose([*rows, previous], force_grow=False, standard_errors=_errors(4, 0.031), margin=1.0)
        == 3
    )
