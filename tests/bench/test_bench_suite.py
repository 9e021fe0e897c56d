"""bench/suite.py's arithmetic: paired differences (RMSE the other way round), verdicts beyond
two standard errors, normalized scores, and the targets' counts."""

import pytest

from bench import suite

INFO = {"task": "regression", "metric": "rmse", "train_rows": 500}


def runs(table: str, metric: str, scores: dict[str, list[float]], wall: float = 1.0):
    return [
        {
            "table": table,
            "seed": seed,
            "method": method,
            metric: value,
            "wall_s": wall,
            "cpu_s": wall,
            "peak_rss_mb": 100.0,
        }
        for method, values in scores.items()
        for seed, value in enumerate(values, 1)
    ]


def test_a_lower_rmse_is_better_and_a_verdict_needs_two_standard_errors():
    scores = {
        "ours": [1.0, 1.1, 0.9],
        "hgb": [1.2, 1.3, 1.1],
        "lightgbm": [1.0, 1.3, 0.8],
        "linear": [0.5, 0.6, 0.4],
    }
    [row] = suite.summarize(runs("t", "rmse", scores), {"t": INFO})["tables"]
    assert row["versus"]["hgb"]["mean"] == pytest.approx(0.2)  # every seed 0.2 better
    assert row["versus"]["hgb"]["verdict"] == "better"
    assert row["versus"]["lightgbm"]["verdict"] == "level"  # 0, +0.2, -0.1: inside 2 SE
    assert row["versus"]["linear"]["verdict"] == "worse"
    # Per seed: linear best (1), hgb worst (0); ours (1.2 - 1.0) / (1.2 - 0.5) on seed 1.
    assert row["normalized"]["linear"] == 1.0 and row["normalized"]["hgb"] == 0.0
    assert row["normalized"]["ours"] == pytest.approx(0.2 / 0.7)


def test_the_overall_counts_follow_the_targets():
    accuracy = {**INFO, "task": "binary", "metric": "accuracy", "train_rows": 20_000}
    a = runs("a", "accuracy", {m: [0.8, 0.8] for m in suite.METHODS}, wall=20.0)
    b = runs(
        "b",
        "rmse",
        {"ours": [2.0, 2.0], "hgb": [1.0, 1.1], "lightgbm": [1.0, 1.0], "linear": [1.5, 1.5]},
    )
    summary = suite.summarize(a + b, {"a": accuracy, "b": INFO})
    overall = summary["overall"]
    assert (overall["tables"], overall["ours_at_least_hgb"]) == (2, 1)
    assert overall["ours_not_worse_than_hgb"] == 1
    assert overall["ours_worse_than_linear"] == ["b"]
    assert overall["over_10x_hgb_time"] == [] and overall["small_over_15_s"] == []
    assert "| b | regression | 500 | rmse | 2.0000 |" in suite.table(summary)


def test_a_seed_missing_for_one_method_is_left_out_of_the_pairs():
    scores = {m: [0.5, 0.6] for m in suite.METHODS}
    partial = [
        r for r in runs("t", "rmse", scores) if not (r["method"] == "hgb" and r["seed"] == 2)
    ]
    [row] = suite.summarize(partial, {"t": INFO})["tables"]
    assert row["seeds"] == [1]


def test_the_calibration_table_is_the_mean_over_seeds_of_classification_runs_only():
    calibrated = [
        {"table": "churn", "method": "ours", "seed": s, "temperature": t, "ece": e,
         "ece_before": e + 0.01, "log_loss": 0.3, "log_loss_before": 0.31}
        for s, t, e in ((1, 1.2, 0.010), (2, 1.4, 0.020))
    ]  # fmt: skip
    other = [{"table": "wage", "method": "ours", "seed": 1, "rmse": 1.0}]
    tables = {"churn": {"test_rows": 1000}, "wage": {"test_rows": 600}}
    lines = suite.calibration_table(calibrated + other, tables).splitlines()
    assert len(lines) == 3  # the header, its rule and churn's row
    assert lines[2] == "| churn | 1,000 | 2 | 1.300 | 0.0250 | 0.0150 | 0.3100 | 0.3000 |"
    assert suite.calibration_table(other, tables) == ""
