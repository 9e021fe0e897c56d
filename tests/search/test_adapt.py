"""Defaults that follow the data (trainer/search/adapt.py)."""

from __future__ import annotations

import pytest

from tests.support import load_report, make_data, parsed_flags, run_task, task_env
from trainer import model, task
from trainer.ensemble import Selection
from trainer.errors import InputError
from trainer.input.schema import HeadType
from trainer.search import adapt


@pytest.mark.parametrize(
    "rows, expected", [(120, 16), (383, 32), (600, 64), (1_300, 128), (29_000, 256), (10, 10)]
)
def test_batch_size_gives_about_8_batches_per_epoch_within_its_bounds(rows, expected):
    assert adapt.batch_size(rows, default=256) == expected


def test_iteration_steps_cap_the_epochs_per_iteration():
    assert adapt.iteration_steps(120, 16, default=750) == 225  # 30 epochs of 7.5 batches
    assert adapt.iteration_steps(29_000, 256, default=750) == 750  # the default: ~6.6 epochs


def _config(args: list[str]):
    with parsed_flags(["--train_data=x.csv", "--label_column=y", *args]) as f:
        return task.build_config(f)


def test_defaults_left_to_the_data_are_chosen_for_a_small_table():
    config, changes = adapt.resolve(_config([]), rows=383, head=HeadType.BINARY)
    assert config.train.batch_size == 32
    assert config.search.max_iteration_steps == 360  # ceil(30 * 383 / 32)
    assert config.search.selection is Selection.HOLDOUT
    assert config.search.patience == 1
    assert config.search.generator == _config([]).search.generator  # a binary table
    assert config.bags == 1  # the default search's k-head members are not bagged
    assert set(changes) == {"batch_size", "max_iteration_steps", "selection", "patience"}
    # from 1,000 rows the hold-out is large enough to let a search of plain networks go on
    # one more iteration, alone, and from 10,000 rows run them all; k-head members stop at once
    larger, larger_changes = adapt.resolve(_config([]), rows=1_347, head=HeadType.MULTICLASS)
    assert larger.search.patience == 1 and "k-head members" in larger_changes["patience"]["why"]
    nets, nets_changes = adapt.resolve(
        _config(["--generator=dnn,cross"]), rows=1_347, head=HeadType.MULTICLASS
    )
    assert nets.search.patience == 2
    assert "stops growing for 2 iterations" in nets_changes["patience"]["why"]
    largest, _ = adapt.resolve(_config([]), rows=10_000, head=HeadType.MULTICLASS)
    assert largest.search.patience == 1
    nets_largest, _ = adapt.resolve(
        _config(["--generator=dnn,cross"]), rows=10_000, head=HeadType.MULTICLASS
    )
    assert nets_largest.search.patience == 0
    assert larger.bags == 1 and "bags" not in larger_changes
    assert larger.search.selection is Selection.HOLDOUT
    assert (
        changes["batch_size"]["default"] == 256
        and "383 training rows" in changes["batch_size"]["why"]
    )


def test_a_large_table_keeps_the_defaults():
    flags_config = _config(["--generator=dnn,cross"])
    config, changes = adapt.resolve(flags_config, rows=100_000, head=HeadType.REGRESSION)
    assert config == flags_config and changes == {}


def test_a_search_with_trees_chooses_on_held_out_rows_at_any_size():
    config, changes = adapt.resolve(_config([]), rows=100_000, head=HeadType.REGRESSION)
    assert config.search.selection is Selection.HOLDOUT
    assert "fitted member" in changes["selection"]["why"]
    assert list(changes) == ["selection", "patience"]  # and k-head members: patience 1


def test_a_small_regression_table_gets_the_linear_model_among_its_candidates():
    config, changes = adapt.resolve(_config([]), rows=331, head=HeadType.REGRESSION)
    proposed = model.parts(config.search.generator)
    assert [type(g) for g in proposed] == [
        model.TreesGenerator,
        model.KHeadGenerator,
        model.LinearGenerator,
    ]
    assert changes["generator"]["value"] == "trees,kheads,linear"
    assert changes["generator"]["default"] == "trees,kheads"
    # a generator the user named is kept, and one that has the linear model is not doubled
    kept, changes = adapt.resolve(_config(["--generator=dnn"]), 331, HeadType.REGRESSION)
    assert model.parts(kept.search.generator) == (model.DNNGenerator(),)
    assert "generator" not in changes
    linear = _config(["--generator=cross,linear"]).search.generator
    assert adapt.with_linear(linear) is linear


NETS = ["--generator=dnn,cross"]  # a search without k-head members


@pytest.mark.parametrize(
    "args, one_machine, expected, why",
    [
        ([], True, 1, None),  # the default search's k-head members are ensembles already
        (NETS, True, 5, "fewer than 1,000 training rows"),
        (NETS, False, 1, None),  # a cluster trains one search
        ([*NETS, "--holdout_fraction=0.3"], True, 3, "3 disjoint hold-outs"),
        # with --eval_data too: each bag selects on its own hold-out
        ([*NETS, "--eval_data=e.csv", "--holdout_fraction=0.5"], True, 2, "2 disjoint hold-outs"),
        ([*NETS, "--time_budget_secs=50"], True, 2, "20 s each in the 50 s budget"),
        ([*NETS, "--time_budget_secs=10"], True, 1, None),
        (["--bags=2"], True, 2, None),  # the user's
    ],
)
def test_bags_follow_the_rows_the_hold_outs_the_budget_and_the_machine(
    args, one_machine, expected, why
):
    config, changes = adapt.resolve(
        _config(args), rows=383, head=HeadType.BINARY, shape=adapt.Shape(one_machine=one_machine)
    )
    assert config.bags == expected
    if why:
        assert why in changes["bags"]["why"]
    else:
        assert "bags" not in changes


def test_more_bags_than_disjoint_hold_outs_are_refused_before_any_work():
    refused = r"--bags=11 with --holdout_fraction=0.1.*at most --bags=10"
    with pytest.raises(InputError, match=refused):
        _config(["--bags=11"])
    with pytest.raises(InputError, match=r"--bags \(0\) must be >= 1"):
        _config(["--bags=0"])
    with pytest.raises(InputError, match=refused):  # its bags select on hold-outs too
        _config(["--bags=11", "--eval_data=e.csv"])


def test_flags_the_user_set_are_kept():
    flags_config = _config(
        ["--batch_size=32", "--selection=moving_average", "--patience=0", "--bags=1"]
    )
    config, changes = adapt.resolve(flags_config, rows=383, head=HeadType.BINARY)
    assert config.train.batch_size == 32
    assert config.search.selection is Selection.MOVING_AVERAGE
    assert config.search.patience == 0
    assert set(changes) == {"max_iteration_steps"}
    assert config.search.max_iteration_steps == 360  # 30 epochs at the user's batch size


def test_a_batch_larger_than_the_table_is_refused_naming_both():
    with pytest.raises(InputError, match=r"--batch_size=512 is larger than the 200 training rows"):
        adapt.resolve(_config(["--batch_size=512"]), rows=200, head=HeadType.BINARY)


def test_synchronous_replicas_get_a_batch_they_split_evenly():
    """Three replicas (a chief and two workers under MultiWorkerMirroredStrategy) cannot split
    256 examples: left to the data, the batch becomes 255; set by the user, it is refused
    before any work, naming sizes that split (TensorFlow's own error came after the scan)."""
    config, changes = adapt.resolve(
        _config([]), rows=100_000, head=HeadType.BINARY, shape=adapt.Shape(replicas=3)
    )
    assert config.train.batch_size == 255
    assert "a multiple of the 3 synchronous replicas" in changes["batch_size"]["why"]
    adapt.check_global_batch(_config([]), 3)  # left to the data: resolve rounds it
    adapt.check_global_batch(_config(["--batch_size=255"]), 3)
    adapt.check_global_batch(_config(["--batch_size=256"]), 1)
    with pytest.raises(InputError, match=r"--batch_size=256 .* 3 synchronous .*=255 or 258"):
        adapt.check_global_batch(_config(["--batch_size=256"]), 3)
    small, _ = adapt.resolve(
        _config([]), rows=120, head=HeadType.BINARY, shape=adapt.Shape(replicas=5)
    )
    assert small.train.batch_size == 15  # 16 rounded down to 5 replicas' multiple


@pytest.mark.slow
def test_a_table_smaller_than_the_default_batch_trains_with_the_adapted_defaults(tmp_path):
    """Before: 150 rows, batch 256, every in-memory epoch empty: the job never ended."""
    data = make_data(tmp_path, "multiclass", n_train=150, n_eval=60)
    job = tmp_path / "job"
    result = run_task(
        [f"--train_data={data.train}", "--label_column=target", f"--job_dir={job}", "--bags=1"],
        env=task_env(),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = load_report(job)
    assert report["adapted"]["batch_size"]["value"] == 16
    assert report["adapted"]["selection"]["value"] == "holdout"
    assert report["config"]["batch_size"] == 16
    assert all(
        r["steps"] == report["adapted"]["max_iteration_steps"]["value"]
        for r in report["iterations"]
    )
    assert "--batch_size=16 (" in result.stderr
