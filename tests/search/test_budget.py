"""--time_budget_secs: the search ends, with an exported model, within the budget."""

from __future__ import annotations

import json
import time

import pytest

from tests.support import load_report, run_in_process, run_task
from trainer.search import budget as budget_lib
from trainer.search.record import Seconds


class _Record:
    """The part of an IterationRecord the budget reads."""

    def __init__(self, total: float, selection: float):
        self.seconds = Seconds(
            total=total, training=0.0, first_step=0.0, selection_and_freeze=selection
        )


def test_iteration_zero_always_starts_and_a_later_one_when_half_of_the_last_fits(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    budget = budget_lib.TimeBudget(60.0, started=100.0)  # ends at 160, reserve 3 s
    assert budget.may_start(0, [])
    now[0] = 150.0  # 10 s left, 7 s after the reserve
    assert budget.may_start(1, [_Record(total=14.0, selection=1.0)])  # half: 7 s
    assert not budget.may_start(1, [_Record(total=14.2, selection=1.0)])
    now[0] = 200.0  # overrun: nothing but iteration 0 starts
    assert budget.may_start(0, []) and not budget.may_start(2, [_Record(1.0, 1.0)])


def test_a_fitted_member_may_take_half_of_what_is_left_before_the_reserve(monkeypatch):
    now = [10.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    budget = budget_lib.TimeBudget(100.0, started=0.0)  # reserve 5 s: 85 s left before it
    assert budget.fit_deadline() == pytest.approx(10.0 + 42.5)
    now[0] = 99.0  # inside the reserve: no time (the fit grows one check's rounds)
    assert budget.fit_deadline() == 99.0


def test_training_stops_when_selection_and_the_reserve_are_all_that_fit(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    budget = budget_lib.TimeBudget(100.0, started=0.0)  # reserve 5 s (5%)
    records = [_Record(total=20.0, selection=4.0)]
    now[0] = 90.0
    assert not budget.training_over(records)
    now[0] = 91.0  # 9 s left = reserve + the last selection
    assert budget.training_over(records)
    now[0] = 92.0  # before any iteration has measured its selection: a guess
    assert not budget.training_over([])  # 8 s left > 5 s reserve + 2 s guess


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_budget_that_is_not_positive_is_refused(value, binary_data, tmp_path):
    code, stderr = run_in_process(
        [
            f"--train_data={binary_data.train}",
            "--label_column=target",
            f"--job_dir={tmp_path / 'job'}",
            f"--time_budget_secs={value}",
        ]
    )
    assert code == 2 and f"--time_budget_secs ({float(value)}) must be > 0" in stderr


@pytest.mark.slow
def test_a_search_longer_than_its_budget_ends_within_it_with_a_model(binary_data, tmp_path):
    job = tmp_path / "job"
    seconds = 30.0
    started = time.monotonic()
    result = run_task(
        [
            f"--train_data={binary_data.train}",
            f"--eval_data={binary_data.eval}",
            "--label_column=target",
            f"--job_dir={job}",
            "--max_iterations=20",
            "--max_iteration_steps=1000000",  # far more than 30 s of training
            "--batch_size=32",
            f"--time_budget_secs={seconds}",  # the default search: trees' fit included
        ]
    )
    wall = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    report = load_report(job)
    assert report["status"] == "complete" and (job / "model" / "saved_model.pb").exists()
    cut = report["budget"]["cut_iterations"]
    assert cut and all(c["steps"] < c["planned_steps"] == 1_000_000 for c in cut.values())
    assert len(report["iterations"]) + len(report["budget"]["skipped_iterations"]) == 20
    # The process, start-up and exit included, ends near its budget (exit is not planned).
    assert wall < seconds + 5.0, (
        f"{wall:.1f} s: {json.dumps(report['budget'])}\n{result.stderr[-3000:]}"
    )
    assert "time budget 30 s: cut iteration 0 at" in result.stdout
