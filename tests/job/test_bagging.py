"""Bagging (trainer/job/bagging.py): K searches on their own hold-outs and seeds, served as one
model."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tests.support import (
    FAST_FLAGS,
    load_report,
    make_data,
    parsed_flags,
    predict_csv,
    run_task,
    task_env,
)
from trainer import task
from trainer.config import BAG_SEED_STRIDE
from trainer.distribute.cluster import CHIEF, PS, WORKER, Cluster
from trainer.errors import InputError
from trainer.evaluation import importance
from trainer.input.schema import HeadType, Label
from trainer.job import job as job_lib
from trainer.model.heads import Head
from trainer.serving import bagged

QUICK = ["--max_iterations=1", "--max_iteration_steps=60", "--feature_importance_repeats=1"]


def _outputs(**values):
    return {k: tf.constant(v, tf.float32) for k, v in values.items()}


def test_the_mean_of_classifiers_is_their_mean_probability_and_its_logits_give_it_back():
    binary = Head(Label("y", HeadType.BINARY, ("no", "yes")))
    mean = bagged.bagged_outputs(
        binary,
        [
            _outputs(probabilities=[[0.9, 0.1], [0.2, 0.8]]),
            _outputs(probabilities=[[0.5, 0.5], [0.0, 1.0]]),
        ],
    )
    np.testing.assert_allclose(mean["probabilities"], [[0.7, 0.3], [0.1, 0.9]], atol=1e-6)
    np.testing.assert_allclose(tf.sigmoid(mean["logits"][:, 0]), [0.3, 0.9], atol=1e-6)
    assert mean["classes"].numpy().tolist() == [b"no", b"yes"]

    three = Head(Label("y", HeadType.MULTICLASS, ("a", "b", "c")))
    mean = bagged.bagged_outputs(
        three,
        [_outputs(probabilities=[[0.6, 0.3, 0.1]]), _outputs(probabilities=[[0.0, 0.2, 0.8]])],
    )
    np.testing.assert_allclose(mean["probabilities"], [[0.3, 0.25, 0.45]], atol=1e-6)
    np.testing.assert_allclose(tf.nn.softmax(mean["logits"]), [[0.3, 0.25, 0.45]], atol=1e-6)
    assert mean["classes"].numpy().tolist() == [b"c"]


def test_two_regressions_serve_their_mean_prediction_on_the_heads_scale():
    head = Head(Label("y", HeadType.REGRESSION, mean=2.0, std=4.0))
    mean = bagged.bagged_outputs(
        head, [_outputs(predictions=[10.0, -2.0]), _outputs(predictions=[6.0, 0.0])]
    )
    np.testing.assert_allclose(mean["predictions"], [8.0, -1.0], atol=1e-6)
    np.testing.assert_allclose(mean["logits"][:, 0], [1.5, -0.75], atol=1e-6)  # (8 - 2) / 4


def test_three_or_more_regressions_drop_each_rows_highest_and_lowest_prediction():
    head = Head(Label("y", HeadType.REGRESSION, mean=0.0, std=1.0))
    bags = [[1.0, 5.0], [2.0, -40.0], [90.0, 6.0], [3.0, 7.0], [4.0, 5.0]]
    served = bagged.bagged_outputs(head, [_outputs(predictions=p) for p in bags])
    # Row 0 drops 1 and 90 (mean of 2, 3, 4); row 1 drops -40 and 7 (mean of 5, 6, 5).
    np.testing.assert_allclose(served["predictions"], [3.0, 16 / 3], atol=1e-5)
    # Ties: one copy of the extreme goes, the other stays.
    three = bagged.trimmed_mean(tf.constant([[1.0], [1.0], [4.0]]))
    np.testing.assert_allclose(three, [1.0], atol=1e-6)


def test_the_mean_importance_of_the_bags_averages_each_column_over_them():
    def one(drops: dict[str, list[float]], rows: int) -> dict:
        columns = [
            {"column": c, "mean_drop": float(np.mean(d)), "std_drop": 0.0, "drops": d}
            for c, d in drops.items()
        ]
        return {
            "metric": "auc",
            "baseline": 0.9,
            "rows": rows,
            "weighted": False,
            "repeats": 2,
            "seed": 1,
            "columns": columns,
            "seconds": 1.0,
        }

    mean = importance.mean_of(
        [
            one({"a": [0.1, 0.3], "b": [0.0, 0.0]}, 30),
            None,
            one({"a": [0.0, 0.0], "b": [0.2, 0.4]}, 20),
        ]
    )
    assert mean is not None
    assert [c["column"] for c in mean["columns"]] == ["b", "a"]  # 0.15 against 0.1
    assert mean["columns"][0]["mean_drop"] == pytest.approx(0.15)
    assert mean["columns"][1]["drops"] == [0.1, 0.3, 0.0, 0.0]
    assert (mean["rows"], mean["models"]) == (50, 2)
    assert "the mean of 2 bags" in importance.summary(mean)
    assert importance.mean_of([None, None]) is None


def test_bags_on_a_cluster_are_refused_before_the_input_is_read(tmp_path):
    with parsed_flags(
        [
            f"--train_data={tmp_path}/missing.csv",
            "--label_column=y",
            f"--job_dir={tmp_path}/job",
            "--bags=3",
        ]
    ) as f:
        config = task.build_config(f)
    cluster = Cluster(
        CHIEF, 0, {CHIEF: ("localhost:1",), WORKER: ("localhost:2",), PS: ("localhost:3",)}
    )
    with pytest.raises(InputError, match=r"--bags=3 trains its bags one after the other"):
        job_lib.run(config, cluster)
    assert not (tmp_path / "job").exists()


def _bagged_job(
    tmp_path, kind: str, n_train: int, n_eval: int, *flags: str, eval_data: bool = False
):
    """A bagged job on generated rows (evaluated on the eval rows with `eval_data`, else on
    hold-outs): its data, job dir, flags and trainer process."""
    data = make_data(tmp_path, kind, n_train=n_train, n_eval=n_eval)
    job = tmp_path / "job"
    args = [f"--train_data={data.train}", "--label_column=target", f"--job_dir={job}", *flags]
    if eval_data:
        args.append(f"--eval_data={data.eval}")
    result = run_task([*args, *QUICK], env=task_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return data, job, [*args, *QUICK], result


def _outputs_of_bags(job, csv_path, bags: int) -> tuple[dict, list[dict]]:
    """The bagged model's outputs on a CSV file's rows, and each bag's."""
    bagged, _ = predict_csv(job / "model", csv_path)
    return bagged, [predict_csv(job / "bags" / str(b) / "model", csv_path)[0] for b in range(bags)]


def test_two_bags_serve_their_mean_and_are_scored_out_of_bag(tmp_path):
    """Bagging end to end, quickly (the slow test below has three bags and a resume)."""
    data, job, args, result = _bagged_job(
        tmp_path, "binary", 400, 50, "--bags=2", "--decision_objective=f1"
    )
    report = load_report(job)
    assert [b["bag"] for b in report["bags"]] == [0, 1]
    # each bag calibrated on its own fold; the threshold chosen on their pooled predictions
    calibration = report["calibration"]
    assert all("fitted_temperature" in c for c in calibration["bags"])
    assert calibration["decision"]["chosen_on_rows"] == "out of bag"
    threshold = calibration["decision"]["threshold"]
    assert report["final"]["examples"] == sum(b["examples"] for b in report["bags"])
    assert "bagged model (2 bags) on out of bag" in result.stdout
    assert (job / "report.png").read_bytes().startswith(b"\x89PNG")  # each bag's path
    # The out-of-bag metrics come from the predictions each bag saved of its fold; without
    # them (a bag of an older version), a resume predicts the folds again: the same metrics.
    for b in (0, 1):
        (job / "bags" / str(b) / "eval_predictions.npz").unlink()
    again = run_task(args, env=task_env(), timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Bag 2 of 2: done before" in again.stderr
    final = load_report(job)["final"]
    assert final["examples"] == report["final"]["examples"]
    for name, value in report["final"]["metrics"].items():
        assert final["metrics"][name] == pytest.approx(value, rel=1e-6), name
    bagged, each = _outputs_of_bags(job, data.train, 2)
    mean = np.mean([o["probabilities"].numpy() for o in each], axis=0)
    np.testing.assert_allclose(bagged["probabilities"].numpy(), mean, atol=1e-5)
    assert len({o["probabilities"].numpy().tobytes() for o in each}) == 2  # two other models
    positive = np.array([c.decode() for c in bagged["classes"].numpy()]) == "yes"
    np.testing.assert_array_equal(positive, bagged["probabilities"].numpy()[:, 1] > threshold)


@pytest.mark.slow
def test_a_bagged_job_serves_the_mean_of_its_bags_and_scores_them_out_of_bag(tmp_path):
    data, job, args, result = _bagged_job(tmp_path, "binary", 400, 50, "--bags=3")
    report = load_report(job)

    bags = report["bags"]
    assert [b["bag"] for b in bags] == [0, 1, 2]
    assert [b["seed"] for b in bags] == [42, 42 + BAG_SEED_STRIDE, 42 + 2 * BAG_SEED_STRIDE]
    for b in bags:
        own = load_report(job / "bags" / str(b["bag"]))
        assert own["final"]["metrics"] == b["metrics"]
        assert (job / "bags" / str(b["bag"]) / "model" / "saved_model.pb").exists()
    # Disjoint hold-outs: the out-of-bag rows are every bag's hold-out, each counted once.
    assert report["final"]["examples"] == sum(b["examples"] for b in bags)
    assert report["final"]["eval_data"].startswith("out of bag: 30% of the training rows")
    assert "fold 1" in bags[1]["eval_data"] and "fold" not in bags[0]["eval_data"]
    assert report["feature_importance"]["models"] == 3
    assert "bagged model (3 bags) on out of bag" in result.stdout

    bagged, each = _outputs_of_bags(job, data.train, 3)
    mean = np.mean([o["probabilities"].numpy() for o in each], axis=0)
    np.testing.assert_allclose(bagged["probabilities"].numpy(), mean, atol=1e-5)
    assert set(bagged) == set(each[0])  # the same outputs as one search's export
    assert len({o["probabilities"].numpy().tobytes() for o in each}) == 3  # three other models

    # A resume keeps the finished bags and trains only what is missing.
    shutil.rmtree(job / "bags" / "2")
    shutil.rmtree(job / "model")
    again = run_task(args, env=task_env(), timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Bag 1 of 3: done before" in again.stderr and "Bag 2 of 3: done before" in again.stderr
    assert f"Bag 3 of 3: seed {42 + 2 * BAG_SEED_STRIDE}" in again.stderr
    resumed = load_report(job)
    assert [b["metrics"] for b in resumed["bags"][:2]] == [b["metrics"] for b in bags[:2]]
    assert (job / "model" / "saved_model.pb").exists()


@pytest.mark.slow
def test_more_iterations_grow_every_bag_and_export_the_bagged_model_again(tmp_path):
    """Issue 28, finding 1, bagged: a complete bag whose search may go further is resumed,
    not reported as done, and the bagged model is exported again from the grown bags."""
    data, job, args, _ = _bagged_job(tmp_path, "binary", 300, 50, "--bags=2", "--force_grow")
    grown = [a for a in args if a != "--max_iterations=1"] + ["--max_iterations=2"]
    again = run_task(grown, env=task_env(), timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "done before" not in again.stderr
    stamps = [
        json.loads((job / "bags" / str(b) / "model.json").read_text())["source"] for b in (0, 1)
    ]
    assert [s["iterations"] for s in stamps] == [2, 2]
    assert json.loads((job / "model.json").read_text())["source"] == {
        "bags": stamps,
        "calibration": "temperature",
        "decision_objective": "",
    }
    bagged, each = _outputs_of_bags(job, data.train, 2)
    mean = np.mean([o["probabilities"].numpy() for o in each], axis=0)
    np.testing.assert_allclose(bagged["probabilities"].numpy(), mean, atol=1e-5)
    # Resumed once more with the same flags: every bag is done, nothing is exported again.
    model = (job / "model" / "saved_model.pb").stat().st_mtime_ns
    once_more = run_task(grown, env=task_env(), timeout=300)
    assert once_more.returncode == 0, once_more.stderr[-3000:]
    assert "Bag 1 of 2: done before" in once_more.stderr
    assert (job / "model" / "saved_model.pb").stat().st_mtime_ns == model


@pytest.mark.slow
def test_a_bagged_regression_on_eval_data_is_scored_as_one_model_on_it(tmp_path):
    data = make_data(tmp_path, "regression", n_train=300, n_eval=80)
    data, job, _, _ = _bagged_job(
        tmp_path, "regression", 300, 80, f"--eval_data={data.eval}", "--bags=3"
    )
    report = load_report(job)
    assert report["final"]["examples"] == 80 and report["final"]["eval_data"] == str(data.eval)
    assert [b["examples"] for b in report["bags"]] == [80, 80, 80]  # every bag on the eval data
    assert not list(job.glob("bags/*/eval_predictions.npz"))  # kept for hold-outs alone

    bagged, each = _outputs_of_bags(job, data.eval, 3)
    predictions = bagged["predictions"].numpy()
    middle = np.sort([o["predictions"].numpy() for o in each], axis=0)[1]  # 3 bags: trimmed
    np.testing.assert_allclose(predictions, middle, rtol=1e-5, atol=1e-5)
    labels = np.array(predict_csv(job / "model", data.eval)[1], float)
    mse = float(np.mean((predictions - labels) ** 2))
    assert report["final"]["metrics"]["mse"] == pytest.approx(mse, rel=1e-4)


@pytest.mark.slow
def test_a_job_begun_as_one_search_resumes_as_one_when_the_default_would_bag_it(tmp_path):
    """A job dir written before --bags existed (or with --bags=1) holds one search's
    iterations: a resume with the default must not start bags beside them."""
    data = make_data(tmp_path, "binary", n_train=300, n_eval=50)
    job = tmp_path / "job"
    args = [f"--train_data={data.train}", "--label_column=target", f"--job_dir={job}"]
    # a search the default bags (k-head members are not bagged); then FAST_FLAGS without --bags
    args.append("--generator=dnn,cross")
    one = [f for f in FAST_FLAGS if f != "--bags=1"]
    first = run_task([*args, *FAST_FLAGS, "--max_iterations=1"], env=task_env())
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_task([*args, *one], env=task_env(), timeout=300)  # 2 iterations, no --bags
    assert again.returncode == 0, again.stderr[-3000:]
    assert "it resumes as one (no bags)" in again.stderr
    report = load_report(job)
    assert "bags" not in report and len(report["iterations"]) == 2
    assert not (job / "bags").exists()
