"""The flags' table (trainer/flags.py): one definition read by absl, the config and deploy."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import pytest
from absl import flags as absl_flags

from tests.support import REPO
from trainer import flags
from trainer.errors import InputError
from trainer.flags import AT_LEAST_0, AT_LEAST_1, FRACTION, POSITIVE, Range
from trainer.placement import Placement


@pytest.mark.parametrize(
    "rule, words, inside, outside",
    [
        (POSITIVE, "> 0", [1e-9, 3], [0, -1, math.nan, -math.inf]),
        (AT_LEAST_0, ">= 0", [0, 2.5], [-1e-9, math.nan]),
        (AT_LEAST_1, ">= 1", [1, 10**9], [0, 0.5]),
        (FRACTION, "in [0, 1)", [0, 0.999], [1, -0.1, math.nan]),
        (Range(low=0, high=1, low_open=True, high_open=True), "in (0, 1)", [0.5], [0, 1]),
        (Range(high=8), "<= 8", [-3, 8], [8.5]),
    ],
)
def test_a_range_says_its_rule_and_holds_what_it_says(rule, words, inside, outside):
    assert str(rule) == words
    assert all(v in rule for v in inside)
    assert not any(v in rule for v in outside)
    assert True not in rule and "1" not in rule  # neither a bool nor text is a number


@pytest.mark.parametrize("flag", flags.FLAGS, ids=lambda f: f.name)
def test_every_default_is_accepted_by_its_own_rule(flag):
    assert flag.accepts(flag.default)
    assert flag.kind in ("str", "int", "float", "bool", "enum", "list")
    assert (flag.kind == "enum") == bool(flag.choices)


def test_absl_gets_each_flag_as_the_table_defines_it():
    defined = absl_flags.FlagValues()
    flags.define(defined)
    assert set(defined) == set(flags.BY_NAME)
    for flag in flags.FLAGS:
        assert defined[flag.name].default == flag.default
        assert defined[flag.name].help.endswith(flag.help)  # absl puts an enum's choices first
        if flag.kind == "enum":
            assert tuple(defined[flag.name].parser.enum_values) == flag.choices  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("patience", -1, "--patience (-1) must be >= 0 (0: run every iteration)."),
        ("learning_rate", 0.0, "--learning_rate (0.0) must be > 0."),
        ("holdout_fraction", 1.0, "--holdout_fraction (1.0) must be in (0, 1)."),
        ("mixture_learning_rate", -0.1, "--mixture_learning_rate (-0.1) must be > 0."),
        ("optimizer", "adamw", "--optimizer (adamw) must be one of adam, sgd, rmsprop, adagrad."),
    ],
)
def test_a_value_out_of_range_is_named_with_its_rule(name, value, message):
    with pytest.raises(InputError) as raised:
        flags.check({name: value})
    assert str(raised.value) == message


def test_unset_optional_flags_pass():
    flags.check({"time_budget_secs": None, "mixture_learning_rate": None})


@dataclasses.dataclass(frozen=True)
class _Options:
    """A config dataclass as trainer/config.py declares one."""

    steps: int = flags.field("max_iteration_steps")
    placement: Placement = flags.field("placement", Placement)
    name: str = "not a flag"

    def __post_init__(self):
        flags.check_fields(self)


def test_a_flag_field_takes_the_flags_default_value_and_rule():
    assert _Options() == _Options(steps=750, placement=Placement.REPLICATION)
    values = {"max_iteration_steps": 20, "placement": "round_robin", "seed": 1}
    assert flags.fields_of(_Options, values) == {"steps": 20, "placement": Placement.ROUND_ROBIN}
    with pytest.raises(InputError, match=r"^--max_iteration_steps \(0\) must be >= 1\.$"):
        _Options(steps=0)


def test_the_ensembles_choices_are_spelled_as_trainer_ensemble_spells_them():
    from trainer import ensemble

    assert flags.BY_NAME["selection"].choices == tuple(s.value for s in ensemble.Selection)
    assert flags.BY_NAME["mixture_weight_type"].choices == tuple(
        t.value for t in ensemble.MixtureWeightType
    )


def test_the_run_configuration_checks_its_own_flag_fields():
    from trainer.config import DistributionConfig, ImportanceOptions, TrainOptions

    with pytest.raises(InputError, match=r"--batch_size \(0\) must be >= 1\."):
        TrainOptions(batch_size=0)
    with pytest.raises(InputError, match=r"--stall_secs \(0\) must be > 0\."):
        DistributionConfig(stall_secs=0)
    assert ImportanceOptions().rows == flags.BY_NAME["feature_importance_rows"].default


def test_deploy_reads_the_flags_without_loading_tensorflow():
    code = "import sys, deploy.tune; print(sorted(m for m in sys.modules if 'tensorflow' in m))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
