"""End to end: `python -m trainer.task` as a real process on real files."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import tensorflow as tf

from tests.support import (
    ABSL_PREFIX,
    FAST_FLAGS,
    env_without_tensorflow,
    load_report,
    make_data,
    predict_csv,
    run_task,
    scalars,
    task_env,
)


def test_every_head_trains_exports_and_reports(any_head, tmp_path):
    kind, data = any_head
    job = tmp_path / "job"
    result = run_task(
        [
            f"--train_data={data.train}",
            f"--eval_data={data.eval}",
            "--label_column=target",
            f"--job_dir={job}",
            *FAST_FLAGS,
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = load_report(job)
    assert report["status"] == "complete"
    assert report["head"] == kind
    assert [r["iteration"] for r in report["iterations"]] == [0, 1]
    for record in report["iterations"]:
        names = [c["name"] for c in record["candidates"]]
        assert record["chosen"] in names
        for candidate in record["candidates"]:
            assert candidate["objective"] is not None and candidate["eval"]["loss"] > 0
    members = report["architecture"]["members"]
    assert members and all({"iteration", "builder", "key"} <= set(m) for m in members)
    # the leaderboard: every candidate of every iteration, ranked by eval loss, with its size
    board = report["leaderboard"]
    assert len(board) == sum(len(r["candidates"]) for r in report["iterations"])
    losses = [row["eval"]["loss"] for row in board]
    assert losses == sorted(losses) and [row["rank"] for row in board] == list(
        range(1, len(board) + 1)
    )
    assert all(row["parameters"] > 0 and row["training_seconds"] > 0 for row in board)
    assert sum(row["chosen"] for row in board) == len(report["iterations"])
    assert (job / "report.png").read_bytes().startswith(b"\x89PNG")
    assert (job / "model" / "saved_model.pb").exists()
    # where the time went: the imports before the job, its input, its first step, its ending
    timing = report["timing"]
    assert all(timing[k] > 0 for k in ("startup_seconds", "input_seconds", "ending_seconds"))
    assert timing["input_seconds"] < timing["first_step_seconds"]  # both from the job's start
    # TensorBoard: a run per candidate name and per builder across iterations, and the path
    logs = job / "logs"
    assert {p.name for p in logs.iterdir()} == {"candidates", "subnetworks", "chosen"}
    ends = list(np.cumsum([r["steps"] for r in report["iterations"]]))
    chosen = [
        next(c for c in r["candidates"] if c["name"] == r["chosen"]) for r in report["iterations"]
    ]
    path = scalars(logs / "chosen")["eval/loss"]
    assert path == [(e, pytest.approx(c["eval"]["loss"], rel=1e-5)) for e, c in zip(ends, chosen)]
    grown = scalars(logs / "candidates" / report["iterations"][1]["candidates"][1]["name"])
    training = [step for step, _ in grown["train/adanet_objective"]]
    assert training[0] <= ends[0] < training[-1] == ends[1]  # one curve over both iterations
    assert [s for s, _ in grown["eval/loss"]] == ends
    assert "final ensemble" in result.stdout and "exported model" in result.stdout
    assert "steps/s" in result.stderr and "left" in result.stderr
    # plain lines in a log: no absl prefixes, no other package's warnings
    assert not ABSL_PREFIX.search(result.stderr), result.stderr[-3000:]
    assert "Warning" not in result.stderr, result.stderr[-3000:]

    # calibrated on the rows the search chose on (the default search selects on held-out rows)
    fitted = report["calibration"]
    if kind == "regression":
        assert fitted["method"] == "none" and not (job / "calibration.png").exists()
    else:
        assert fitted["method"] in ("temperature", "none") and fitted["fitted_temperature"] > 0
        assert fitted["eval"]["after"]["loss"] == pytest.approx(report["final"]["metrics"]["loss"])
        assert (job / "calibration.png").read_bytes().startswith(b"\x89PNG")
        assert ("decision" in fitted) == (kind == "binary")

    outputs, targets = predict_csv(job / "model", data.eval)
    metrics, constant = report["final"]["metrics"], report["final"]["constant"]
    assert metrics["loss"] < 0.5 * constant["loss"] and "warning" not in report["final"]
    assert "a constant prediction" in result.stdout and "WARNING" not in result.stdout
    if kind == "regression":
        predicted = outputs["predictions"].numpy()
        mse = float(np.mean((predicted - np.array(targets, float)) ** 2))
        assert mse == pytest.approx(metrics["mse"], rel=1e-4)
        assert constant["mse"] == pytest.approx(np.var(np.array(targets, float)), rel=1e-4)
        assert mse < 0.1 * constant["mse"]
    else:
        _, counts = np.unique(targets, return_counts=True)
        assert constant["accuracy"] == pytest.approx(counts.max() / len(targets))
        probabilities = outputs["probabilities"].numpy()
        np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
        classes = [c.decode() for c in outputs["classes"].numpy()]
        accuracy = float(np.mean(np.array(classes) == np.array(targets)))
        assert accuracy == pytest.approx(metrics["accuracy"], abs=1e-6)
        assert accuracy > (0.9 if kind == "binary" else 0.8)


@pytest.mark.slow
def test_a_model_worse_than_a_constant_on_its_eval_rows_is_reported(binary_data, tmp_path):
    """Eval rows whose labels are the training rows' rule reversed: the model, right on the
    training rows, is wrong on them, worse than a constant; the job still completes and says so
    in report.json, the log and the table."""
    flipped = tmp_path / "flipped.csv"
    with open(binary_data.eval) as src, open(flipped, "w", newline="") as dst:
        rows = list(csv.reader(src))
        swap = {"yes": "no", "no": "yes"}
        csv.writer(dst).writerows([rows[0], *[[*r[:-1], swap[r[-1]]] for r in rows[1:]]])
    job = tmp_path / "job"
    args = [f"--train_data={binary_data.train}", f"--eval_data={flipped}", "--label_column=target"]
    result = run_task([*args, f"--job_dir={job}", *FAST_FLAGS])
    assert result.returncode == 0, result.stderr[-3000:]
    final = load_report(job)["final"]
    assert final["metrics"]["auc"] < 0.2 and final["metrics"]["loss"] > final["constant"]["loss"]
    assert "no better than always predicting those rows' own class frequencies" in final["warning"]
    assert "WARNING: The exported model's loss" in result.stdout
    assert "no better than always predicting" in result.stderr


@pytest.mark.slow
def test_rerun_of_a_finished_job_changes_nothing(binary_data, tmp_path):
    job = tmp_path / "job"
    args = [
        f"--train_data={binary_data.train}",
        f"--eval_data={binary_data.eval}",
        "--label_column=target",
        f"--job_dir={job}",
        *FAST_FLAGS,
    ]
    assert run_task(args).returncode == 0
    record = (job / "checkpoints" / "iteration-1.json").read_text()
    pb = (job / "model" / "saved_model.pb").stat().st_mtime_ns
    again = run_task(args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "Resuming" in again.stderr
    assert "Iteration 0: training" not in again.stderr
    assert (job / "checkpoints" / "iteration-1.json").read_text() == record
    assert (job / "model" / "saved_model.pb").stat().st_mtime_ns == pb


@pytest.mark.slow
def test_more_iterations_extend_a_finished_job(binary_data, tmp_path):
    job = tmp_path / "job"
    args = [
        f"--train_data={binary_data.train}",
        f"--eval_data={binary_data.eval}",
        "--label_column=target",
        f"--job_dir={job}",
        "--max_iteration_steps=100",
        "--batch_size=32",
    ]
    assert run_task(args + ["--max_iterations=1"]).returncode == 0
    first = (job / "checkpoints" / "iteration-0.json").read_text()
    result = run_task(args + ["--max_iterations=2"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert (job / "checkpoints" / "iteration-0.json").read_text() == first
    assert len(load_report(job)["iterations"]) == 2


@pytest.mark.slow
def test_changed_search_flags_are_refused_on_resume(binary_data, tmp_path):
    job = tmp_path / "job"
    args = [
        f"--train_data={binary_data.train}",
        "--label_column=target",
        f"--job_dir={job}",
        "--max_iterations=1",
        "--max_iteration_steps=50",
    ]
    assert run_task(args).returncode == 0
    result = run_task(args + ["--generator=cross"])
    assert result.returncode == 2
    assert "--job_dir" in result.stderr and "generator" in result.stderr


def test_a_users_own_generator_trains_from_the_command_line(binary_data, tmp_path):
    """examples/wide_generator.py, named as --generator=package.module:Class beside a
    built-in, gets --layer_size and proposes its candidates (tests/model/test_registry.py:
    how a resume tells it from another generator)."""
    job = tmp_path / "job"
    args = [
        f"--train_data={binary_data.train}",
        "--label_column=target",
        f"--job_dir={job}",
        "--generator=linear,examples.wide_generator:WideGenerator",
        "--layer_size=8",
        "--max_iterations=1",
        "--max_iteration_steps=30",
        "--batch_size=32",
        "--bags=1",
        "--feature_importance_rows=0",
    ]
    result = run_task(args)
    assert result.returncode == 0, result.stderr[-3000:]
    names = " ".join(c["name"] for c in load_report(job)["iterations"][0]["candidates"])
    assert all(f"_{n}_" in names for n in ("linear", "wide_8", "wide_16")), names


@pytest.mark.slow
def test_hypertune_metric_is_reported(binary_data, tmp_path):
    metric_file = tmp_path / "hypertune" / "output.metrics"
    env = task_env()
    env["CLOUD_ML_HP_METRIC_FILE"] = str(metric_file)
    result = run_task(
        [
            f"--train_data={binary_data.train}",
            "--label_column=target",
            f"--job_dir={tmp_path / 'job'}",
            "--max_iterations=1",
            "--max_iteration_steps=50",
        ],
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = metric_file.read_text().strip().splitlines()
    reported = json.loads(lines[-1])
    accuracy = load_report(tmp_path / "job")["final"]["metrics"]["accuracy"]
    assert float(reported["accuracy"]) == pytest.approx(accuracy)


@pytest.mark.slow
def test_tfrecord_input(tmp_path):
    data = make_data(tmp_path, "binary", n_train=600, n_eval=200)
    paths = []
    for split, source in (("train", data.train), ("eval", data.eval)):
        path = tmp_path / f"{split}.tfrecord"
        with open(source) as f, tf.io.TFRecordWriter(str(path)) as writer:
            for row in csv.DictReader(f):
                feature = {
                    "x1": tf.train.Feature(float_list=tf.train.FloatList(value=[float(row["x1"])])),
                    "x2": tf.train.Feature(float_list=tf.train.FloatList(value=[float(row["x2"])])),
                    "color": tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[row["color"].encode()])
                    ),
                    "target": tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[row["target"].encode()])
                    ),
                }
                writer.write(
                    tf.train.Example(
                        features=tf.train.Features(feature=feature)
                    ).SerializeToString()
                )
        paths.append(path)
    job = tmp_path / "job"
    result = run_task(
        [
            f"--train_data={paths[0]}",
            f"--eval_data={paths[1]}",
            "--label_column=target",
            f"--job_dir={job}",
            *FAST_FLAGS,
        ]
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert load_report(job)["final"]["metrics"]["accuracy"] > 0.85


@pytest.mark.parametrize("selection", ["train", pytest.param("holdout", marks=pytest.mark.slow)])
def test_evaluator_selection_with_every_strategy_and_ensembler(binary_data, tmp_path, selection):
    job = tmp_path / "job"
    result = run_task(
        [
            f"--train_data={binary_data.train}",
            f"--eval_data={binary_data.eval}",
            "--label_column=target",
            f"--job_dir={job}",
            "--max_iterations=2",
            "--max_iteration_steps=150",
            "--batch_size=32",
            "--generator=dnn",
            "--ensemble_strategies=grow,all,solo",
            "--ensemblers=complexity_regularized,mean",
            "--mixture_weight_type=matrix",
            "--learn_mixture_weights",
            "--adanet_lambda=0.01",
            "--adanet_beta=0.001",
            "--use_bias",
            "--warm_start_mixture_weights",
            f"--selection={selection}",
            "--selection_margin=0",  # the lowest objective (the margin's own test is below)
            "--force_grow",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = load_report(job)
    last = report["iterations"][1]
    names = [c["name"] for c in last["candidates"]]
    assert names[0] == "previous_ensemble"
    assert {
        "grow_dnn_1x64_mean",
        "all_complexity_regularized",
        "solo_dnn_2x64_complexity_regularized",
    } <= set(names)
    assert last["selection"] == selection
    eligible = [c for c in last["candidates"] if c["name"] != "previous_ensemble"]
    best = min(eligible, key=lambda c: c["objective"])
    assert last["chosen"] == best["name"]  # force_grow: never the previous ensemble
    assert best["standard_error"] == 0.0
    if selection == "holdout":  # the objective is the eval loss plus the penalty
        for candidate in eligible:
            if candidate["name"].endswith("_mean"):
                assert candidate["objective"] == pytest.approx(candidate["eval"]["loss"], rel=1e-4)
    weights = report["architecture"]["mixture_weights"]
    if report["architecture"]["ensembler"] == "complexity_regularized":
        assert weights["type"] == "matrix" and "bias" in weights


@pytest.mark.slow
def test_holdout_selection_keeps_the_simplest_candidate_within_the_margin(binary_data, tmp_path):
    """The one-standard-error rule, as the records show it: every candidate's objective has
    the standard error of its gap to the lowest, and the choice is the simplest candidate
    within --selection_margin of them (the previous ensemble first)."""
    job = tmp_path / "job"
    margin = 3.0  # wide, so that the rule decides on this small table
    result = run_task(
        [
            f"--train_data={binary_data.train}",
            "--label_column=target",
            f"--job_dir={job}",
            *FAST_FLAGS,
            "--max_iterations=3",
            "--selection=holdout",
            f"--selection_margin={margin}",
            "--patience=0",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = load_report(job)
    assert report["config"]["selection_margin"] == margin
    assert len(report["iterations"]) == 3 and report["early_stop"] is None
    for record in report["iterations"]:
        candidates = record["candidates"]
        complexity = {s["name"]: s["complexity"] for s in record["subnetworks"]}
        parameters = {s["name"]: s["parameters"] for s in record["subnetworks"]}
        lowest = min(c["objective"] for c in candidates)
        for candidate in candidates:
            error = candidate["standard_error"]
            assert error is not None and error >= 0
            assert (error == 0) == (candidate["objective"] == lowest)
        within = [c for c in candidates if c["objective"] <= lowest + margin * c["standard_error"]]

        def simplicity(c, complexity=complexity, parameters=parameters):
            return (
                c["name"] != "previous_ensemble",
                sum(complexity.get(m, 0.0) for m in c["members"]),
                sum(parameters.get(m, 0) for m in c["members"]),
            )

        chosen = next(c for c in candidates if c["name"] == record["chosen"])
        assert chosen in within
        assert simplicity(chosen) == min(simplicity(c) for c in within)
    assert " ± " in result.stdout


@pytest.mark.slow
def test_the_search_ends_once_it_stops_growing(binary_data, tmp_path):
    """--patience=1: a margin so wide that the previous ensemble is always within it makes
    iteration 1 keep it, so iterations 2 and 3 never run, on a rerun either."""
    job = tmp_path / "job"
    args = [
        f"--train_data={binary_data.train}",
        "--label_column=target",
        f"--job_dir={job}",
        *FAST_FLAGS,
        "--max_iterations=4",
        "--selection=holdout",
        "--selection_margin=1000",
        "--patience=1",
    ]
    result = run_task(args)
    assert result.returncode == 0, result.stderr[-3000:]
    report = load_report(job)
    assert [r["chosen"] for r in report["iterations"]][1:] == ["previous_ensemble"]
    assert report["early_stop"] == {"patience": 1, "skipped_iterations": [2, 3]}
    assert "iteration 1 kept the previous ensemble (--patience=1)" in result.stderr
    assert "early stop (--patience=1): the search stopped growing, iterations 2, 3 " in (
        result.stdout
    )
    assert report["status"] == "complete"
    again = run_task(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Iteration 2: training" not in again.stderr
    assert len(load_report(job)["iterations"]) == 2


@pytest.mark.slow
def test_unknown_hypertune_metric_fails_before_training(binary_data, tmp_path):
    env = task_env()
    env["CLOUD_ML_TRIAL_ID"] = "3"
    result = run_task(
        [
            f"--train_data={binary_data.train}",
            "--label_column=target",
            f"--job_dir={tmp_path / 'job'}",
            "--hypertune_metric=mse",
        ],
        env=env,
    )
    assert result.returncode == 2
    assert "--hypertune_metric=mse is not an eval metric of a binary head" in result.stderr
    assert not (tmp_path / "job").exists()


def test_help_lists_the_flags_and_succeeds(tmp_path):
    result = run_task(["--help"], env=env_without_tensorflow(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--max_iteration_steps" in result.stdout and "--placement" in result.stdout


@pytest.mark.parametrize(
    "args, says",
    [
        (["--batch_size=abc"], "flag --batch_size=abc: invalid literal for int()"),
        (["--no_such_flag=1"], "Unknown command line flag 'no_such_flag'"),
        (["train.csv"], "unexpected arguments ['train.csv']; all options are --flags."),
        (["--max_iterations=0"], "error: --max_iterations (0) must be >= 1."),
    ],
)
def test_flags_that_cannot_be_parsed_or_break_their_rule_exit_2_in_one_line(args, says, tmp_path):
    """Bad input like any other (absl's own parser exited 1 with "FATAL Flags parsing error"),
    answered before TensorFlow loads."""
    result = run_task(args, env=env_without_tensorflow(tmp_path), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert says in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_an_evaluator_started_after_the_job_evaluates_each_finished_iteration(
    binary_data, tmp_path
):
    """The chief dropped the iterations' checkpoints: the evaluator evaluates each chosen
    ensemble from its frozen checkpoint, once (a second evaluator adds nothing)."""
    job = tmp_path / "job"
    args = [
        f"--train_data={binary_data.train}",
        f"--eval_data={binary_data.eval}",
        "--label_column=target",
        f"--job_dir={job}",
        *FAST_FLAGS,
    ]
    assert run_task(args).returncode == 0
    evaluator = task_env(
        TF_CONFIG=json.dumps(
            {"cluster": {"chief": ["127.0.0.1:2222"]}, "task": {"type": "evaluator", "index": 0}}
        )
    )
    result = run_task(args, env=evaluator)
    assert result.returncode == 0, result.stderr[-3000:]
    report = load_report(job)
    for record in report["iterations"]:
        t = record["iteration"]
        [evaluation] = json.loads((job / "eval" / f"iteration-{t}.json").read_text())
        assert evaluation["checkpoint"] == str(job / "checkpoints" / f"frozen-{t}" / "ensemble")
        assert evaluation["step"] == record["steps"]
        [(name, metrics)] = evaluation["candidates"].items()
        assert name == record["chosen"] and 0.5 < metrics["accuracy"] <= 1
        # on the eval data, which the search (selecting on its own hold-out) never saw
        assert evaluation["examples"] == 500
        evaluated = scalars(job / "logs" / "candidates" / name)["evaluator/loss"]
        first = sum(r["steps"] for r in report["iterations"][:t])
        assert (first + record["steps"], pytest.approx(metrics["loss"])) in evaluated
    assert metrics == pytest.approx(report["final"]["metrics"], abs=1e-4)  # the last: exported
    assert "the job is complete after 2 evaluations" in result.stderr
    again = run_task(args, env=evaluator)
    assert "the job is complete after 0 evaluations" in again.stderr


@pytest.mark.slow
def test_an_evaluator_beside_a_lone_chief_evaluates_until_the_job_is_complete(
    binary_data, tmp_path
):
    """A chief with no workers or ps runs no TensorFlow server (Vertex pools 0 and 3 alone,
    `deploy.launch --evaluator`): the evaluator must not wait for its port, and ends with the
    job. The chief is held (SIGSTOP) from its first checkpoint until the evaluator has looked
    at the unfinished job, so the evaluator waits past --cluster_timeout_secs for it."""
    import signal
    import subprocess
    import sys

    from deploy.local.cluster import free_ports
    from tests.support import REPO, wait_for

    job = tmp_path / "job"
    args = [
        f"--train_data={binary_data.train}",
        f"--eval_data={binary_data.eval}",
        "--label_column=target",
        f"--job_dir={job}",
        "--max_iterations=1",
        "--max_iteration_steps=400",
        "--batch_size=32",
        "--steps_per_loop=25",
        "--checkpoint_every_secs=1",
        "--bags=1",
        "--cluster_timeout_secs=1",
    ]
    cluster = {"chief": [f"127.0.0.1:{free_ports(1)[0]}"]}

    def start(role: str) -> subprocess.Popen:
        config = {"cluster": cluster, "task": {"type": role, "index": 0}}
        with open(tmp_path / f"{role}.log", "w") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "trainer.task", *args],
                cwd=REPO,
                env=task_env(TF_CONFIG=json.dumps(config)),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def said(role: str) -> str:
        return (tmp_path / f"{role}.log").read_text()

    chief = start("chief")
    evaluator = None
    try:
        state = job / "checkpoints" / "iteration-0" / "checkpoint"
        wait_for(lambda: state.exists() or chief.poll() is not None, 240, "a checkpoint")
        assert chief.poll() is None, said("chief")[-3000:]
        chief.send_signal(signal.SIGSTOP)
        evaluator = start("evaluator")
        looked = "Evaluator: iteration 0 step"  # (an evaluation: the job was not complete)
        wait_for(
            lambda: looked in said("evaluator") or evaluator.poll() is not None,
            240,
            "the evaluator's first look at the unfinished job",
        )
        chief.send_signal(signal.SIGCONT)
        assert chief.wait(timeout=240) == 0, said("chief")[-3000:]
        code = evaluator.wait(timeout=120)
    finally:
        for process in (chief, evaluator):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert code == 0, said("evaluator")[-3000:]
    assert "Evaluator: the job is complete after" in said("evaluator")
    assert (job / "eval" / "iteration-0.json").exists()


@pytest.mark.slow  # trains a model: ~14 s on 2 cores
def test_test_data_is_scored_once_by_the_exported_model(binary_data, tmp_path):
    """--test_data: checked by the scan, never read by the search, scored by the exported
    model: on the eval file itself its metrics are the eval metrics."""
    job = tmp_path / "job"
    args = [
        f"--train_data={binary_data.train}",
        f"--eval_data={binary_data.eval}",
        f"--test_data={binary_data.eval}",
        "--label_column=target",
        f"--job_dir={job}",
    ]
    result = run_task([*args, *FAST_FLAGS])
    assert result.returncode == 0, result.stderr[-3000:]
    report = load_report(job)
    test, final = report["test"], report["final"]
    assert test["test_data"] == str(binary_data.eval) and test["examples"] == final["examples"]
    assert test["metrics"] == pytest.approx(final["metrics"], rel=1e-6)
    assert f"exported model on the test data {binary_data.eval}" in result.stdout
    summary = json.loads((job / "schema.json").read_text())["input"]
    assert summary["test"]["rows"] == final["examples"]


def test_test_data_without_a_model_column_stops_before_training(binary_data, tmp_path):
    bad = tmp_path / "test.csv"
    with open(binary_data.eval) as src:
        rows = list(csv.reader(src))
    with open(bad, "w", newline="") as dst:
        csv.writer(dst).writerows([r[1:] for r in rows])
    job = tmp_path / "job"
    result = run_task(
        [
            f"--train_data={binary_data.train}",
            f"--test_data={bad}",
            "--label_column=target",
            f"--job_dir={job}",
            *FAST_FLAGS,
        ]
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "--test_data" in result.stderr and str(bad) in result.stderr
    assert not (job / "schema.json").exists()
