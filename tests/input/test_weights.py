"""--weight_column: example weights weight the training loss and every eval metric (the
iterations' records, report.json's final metrics, the hypertune metric); the column is no
feature of the exported model; bad weights stop the job before any work, naming the row."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from sklearn import metrics as sk

from tests.support import load_report, run_in_process, write_csv
from trainer.input import files as files_lib
from trainer.input import scan
from trainer.input.options import BadRows
from trainer.input.schema import ColumnChoices, HeadType, Label
from trainer.model.heads import Head, Metrics

HEADER = ["x1", "x2", "color", "w", "target"]
FLAGS = [
    "--label_column=target",
    "--weight_column=w",
    "--generator=linear",
    "--max_iterations=1",
    "--max_iteration_steps=400",
    "--batch_size=64",
    "--learning_rate=0.05",
    "--steps_per_loop=100",
    "--bags=1",  # one search, on the tables below 1,000 rows too
]


def imbalanced_rows(n: int, seed: int, positive_weight: float = 1.0):
    """Binary rows where about 6% are positive ("yes") and the classes overlap: a model of
    the unweighted loss predicts few positives; with the positives weighted up it predicts
    many more. The weight column is `positive_weight` for positives, 1 for negatives."""
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    color = rng.choice(["red", "green", "blue"], size=n)
    score = 1.2 * x1 - 0.6 * x2 + np.where(color == "red", 0.3, 0.0)
    positive = score + 0.8 * rng.normal(size=n) > 2.2
    weight = np.where(positive, positive_weight, 1.0)
    return [
        [f"{a:.4f}", f"{b:.4f}", c, f"{w:g}", "yes" if p else "no"]
        for a, b, c, w, p in zip(x1, x2, color, weight, positive)
    ]


def serve_rows(model_dir, rows) -> dict:
    """The exported model on rows' feature columns only (no weight column)."""
    serve = tf.saved_model.load(str(model_dir)).signatures["serving_default"]
    return serve(
        x1=tf.constant([float(r[0]) for r in rows]),
        x2=tf.constant([float(r[1]) for r in rows]),
        color=tf.constant([r[2] for r in rows]),
    )


def recall_of_yes(model_dir, rows) -> float:
    predicted = serve_rows(model_dir, rows)["classes"].numpy().astype(str)
    actual = np.array([r[4] for r in rows])
    return float(np.mean(predicted[actual == "yes"] == "yes"))


# -- (a) weights change training ------------------------------------------------------------
@pytest.mark.slow
def test_weighting_the_rare_class_up_raises_its_recall(tmp_path):
    eval_rows = imbalanced_rows(2000, 2)
    eval_path = write_csv(tmp_path / "eval.csv", HEADER, eval_rows)
    recalls = {}
    for name, positive_weight in (("plain", 1.0), ("weighted", 15.0)):
        train = write_csv(
            tmp_path / f"{name}.csv", HEADER, imbalanced_rows(3000, 1, positive_weight)
        )
        job = tmp_path / name
        code, stderr = run_in_process(
            [f"--train_data={train}", f"--eval_data={eval_path}", f"--job_dir={job}", *FLAGS]
        )
        assert code == 0, stderr[-3000:]
        recalls[name] = recall_of_yes(job / "model", eval_rows)
    # The same rows, features and seed: only the weights differ. Unweighted, the model
    # predicts "yes" only where it is likely (~0.4 of the positives); weighted 15:1 it
    # predicts "yes" wherever P(yes) > 1/16 (~0.9 of them).
    assert recalls["plain"] < 0.7, recalls
    assert recalls["weighted"] > recalls["plain"] + 0.25, recalls


# -- (b) the metrics are the weighted ones; (d) the model serves without the weight ---------
def test_report_metrics_are_weighted_and_the_model_serves_without_the_weight(tmp_path, monkeypatch):
    train = write_csv(tmp_path / "train.csv", HEADER, imbalanced_rows(2000, 1, 5.0))
    # Eval rows: the first half weighted 0 (they must not count at all), the rest 1, 2 or 3.
    eval_rows = imbalanced_rows(1000, 2)
    rng = np.random.default_rng(3)
    for i, row in enumerate(eval_rows):
        row[3] = "0" if i < 500 else str(rng.integers(1, 4))
    eval_path = write_csv(tmp_path / "eval.csv", HEADER, eval_rows)
    metric_file = tmp_path / "hypertune.metrics"
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(metric_file))
    job = tmp_path / "job"
    code, stderr = run_in_process(
        [
            f"--train_data={train}",
            f"--eval_data={eval_path}",
            f"--job_dir={job}",
            *FLAGS,
            "--max_iteration_steps=200",
            # candidates scored on the eval data (held-out selection would score them on a
            # hold-out of the training rows), so the record and the export can be compared
            "--selection=moving_average",
        ]
    )
    assert code == 0, stderr[-3000:]
    report = load_report(job)
    final = report["final"]

    # (d) The serving signature takes the feature columns only; served without `w`.
    serve = tf.saved_model.load(str(job / "model")).signatures["serving_default"]
    assert set(serve.structured_input_signature[1]) == {"x1", "x2", "color"}
    outputs = serve_rows(job / "model", eval_rows)
    p_yes = outputs["probabilities"].numpy()[:, 1].astype(np.float64)
    y = np.array([r[4] == "yes" for r in eval_rows])
    w = np.array([float(r[3]) for r in eval_rows])

    # (b) report.json's metrics of the exported model are scikit-learn's weighted metrics
    # over the second half alone (the rows weighted 0 change nothing), not the unweighted
    # metrics of all rows.
    kept = slice(500, None)
    expected = {
        "loss": sk.log_loss(y[kept], p_yes[kept], sample_weight=w[kept]),
        "accuracy": sk.accuracy_score(y[kept], p_yes[kept] > 0.5, sample_weight=w[kept]),
        "auc": sk.roc_auc_score(y[kept], p_yes[kept], sample_weight=w[kept]),
    }
    got = final["metrics"]
    assert got["loss"] == pytest.approx(expected["loss"], abs=1e-4)
    assert got["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-9)
    assert got["auc"] == pytest.approx(expected["auc"], abs=1e-3)
    assert final["weight_column"] == "w" and final["weight"] == pytest.approx(w.sum())
    assert final["examples"] == 1000
    unweighted = {"loss": sk.log_loss(y, p_yes), "accuracy": sk.accuracy_score(y, p_yes > 0.5)}
    assert abs(got["loss"] - unweighted["loss"]) > 1e-3, (got, unweighted)
    # The iteration's record (evaluated on the encoded rows, `trainer/evaluation/streaming.py`) says
    # the same of the chosen candidate, and hyperparameter tuning got the weighted accuracy.
    [record] = report["iterations"]
    [chosen] = [c for c in record["candidates"] if c["name"] == record["chosen"]]
    for name in ("loss", "accuracy", "auc"):
        assert chosen["eval"][name] == pytest.approx(got[name], abs=1e-4), name
    reported = json.loads(metric_file.read_text().strip().splitlines()[-1])
    assert float(reported["accuracy"]) == pytest.approx(got["accuracy"])
    # The schema records the weight column and the training rows' mean weight.
    schema = json.loads((job / "schema.json").read_text())
    assert schema["weight"]["name"] == "w"
    train_w = np.array([float(r[3]) for r in imbalanced_rows(2000, 1, 5.0)])
    assert schema["weight"]["mean"] == pytest.approx(train_w.mean())
    assert "w" not in [c["name"] for c in schema["columns"]]


def test_weighted_metrics_match_scikit_learn():
    rng = np.random.default_rng(0)
    n = 3000
    labels = rng.integers(0, 2, n)
    logits = (rng.normal(size=n) + labels)[:, None].astype(np.float32)
    weights = rng.exponential(size=n)
    head = Head(Label("y", HeadType.BINARY, classes=("0", "1")))
    metrics = Metrics(head)
    for part in np.array_split(np.arange(n), 7):  # accumulated over batches
        metrics.update(labels[part], logits[part], weights[part])
    p = 1 / (1 + np.exp(-logits[:, 0].astype(np.float64)))
    result = metrics.result()
    assert result["loss"] == pytest.approx(sk.log_loss(labels, p, sample_weight=weights))
    assert result["accuracy"] == pytest.approx(
        sk.accuracy_score(labels, p > 0.5, sample_weight=weights)
    )
    assert result["auc"] == pytest.approx(
        sk.roc_auc_score(labels, p, sample_weight=weights), abs=1e-4
    )
    assert result != head.metrics(labels, logits)  # the weights matter
    # Weights of 1 are no weights.
    assert head.metrics(labels, logits, np.ones(n)) == head.metrics(labels, logits)
    # Regression: weighted mse and mae.
    regression = Head(Label("y", HeadType.REGRESSION, mean=1.0, std=2.0))
    target = rng.normal(size=n)
    out = regression.metrics(target, logits, weights)
    predicted = logits[:, 0].astype(np.float64) * 2.0 + 1.0
    assert out["mse"] == pytest.approx(
        sk.mean_squared_error(target, predicted, sample_weight=weights)
    )
    assert out["mae"] == pytest.approx(
        sk.mean_absolute_error(target, predicted, sample_weight=weights)
    )


def test_the_loss_is_weighted_per_example():
    head = Head(Label("y", HeadType.MULTICLASS, classes=("a", "b", "c")))
    labels = tf.constant([0, 2, 1], tf.int64)
    logits = tf.constant([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    plain = head.loss(labels, logits).numpy()
    weighted = head.loss(labels, logits, tf.constant([0.0, 2.0, 0.5])).numpy()
    np.testing.assert_allclose(weighted, plain * [0.0, 2.0, 0.5], rtol=1e-6)


# -- (c) bad weights: exit 2 before any work, naming what is wrong --------------------------
def _bad_input_cases(tmp_path):
    rows = imbalanced_rows(60, 1)
    good = write_csv(tmp_path / "good.csv", HEADER, rows)
    negative = [r[:] for r in rows]
    negative[6][3] = "-0.5"
    text = [r[:] for r in rows]
    text[9][3] = "heavy"
    empty = [r[:] for r in rows]
    empty[4][3] = ""
    zeros = [r[:3] + ["0"] + r[4:] for r in rows]
    eval_negative = [r[:] for r in rows]
    eval_negative[11][3] = "-2"
    no_weight = [r[:3] + r[4:] for r in rows]
    no_weight_path = write_csv(tmp_path / "nw.csv", HEADER[:3] + HEADER[4:], no_weight)
    return {
        "negative weight": (
            [f"--train_data={write_csv(tmp_path / 'neg.csv', HEADER, negative)}"],
            "weight column 'w' holds '-0.5' at " + str(tmp_path / "neg.csv") + " line 8",
        ),
        "text weight": (
            [f"--train_data={write_csv(tmp_path / 'text.csv', HEADER, text)}"],
            "weight column 'w' holds 'heavy' at " + str(tmp_path / "text.csv") + " line 11",
        ),
        "missing weight": (
            [f"--train_data={write_csv(tmp_path / 'empty.csv', HEADER, empty)}"],
            "weight column 'w' holds '' at " + str(tmp_path / "empty.csv") + " line 6",
        ),
        "negative weight in eval data": (
            [
                f"--train_data={good}",
                f"--eval_data={write_csv(tmp_path / 'eval.csv', HEADER, eval_negative)}",
            ],
            "--eval_data: weight column 'w' holds '-2' at " + str(tmp_path / "eval.csv"),
        ),
        "all weights zero": (
            [f"--train_data={write_csv(tmp_path / 'zeros.csv', HEADER, zeros)}"],
            "weight column 'w' is 0 in all the training rows",
        ),
        "missing column": (
            [f"--train_data={good}", "--weight_column=weight"],
            "--weight_column='weight' is not a column of",
        ),
        "weight is the label": (
            [f"--train_data={good}", "--weight_column=target"],
            "--weight_column='target' is the label column",
        ),
        "weight is a named feature": (
            [f"--train_data={good}", "--numeric_columns=x1,w"],
            "--numeric_columns names the weight column 'w'",
        ),
        "eval data without the weight": (
            [f"--train_data={good}", f"--eval_data={no_weight_path}"],
            "column(s) ['w'] are missing",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "negative weight",
        "text weight",
        "missing weight",
        "negative weight in eval data",
        "all weights zero",
        "missing column",
        "weight is the label",
        "weight is a named feature",
        "eval data without the weight",
    ],
)
def test_bad_weights_stop_before_any_work(tmp_path, case):
    args, message = _bad_input_cases(tmp_path)[case]
    job = tmp_path / "job"
    named = {a.split("=")[0] for a in args}
    flags = [f for f in FLAGS if f.split("=")[0] not in named]
    code, stderr = run_in_process([*args, *flags, f"--job_dir={job}"])
    assert code == 2, stderr[-2000:]
    assert message in stderr, stderr[-2000:]
    assert not job.exists()


def test_bad_weights_are_skipped_with_bad_rows_skip(tmp_path):
    rows = imbalanced_rows(300, 1, 4.0)
    rows[6][3] = "-0.5"
    rows[20][3] = ""
    rows[30][3] = "inf"
    source = files_lib.open_source(
        str(write_csv(tmp_path / "t.csv", HEADER, rows)), flag="--train_data"
    )
    schema = scan.scan_training(
        source, ColumnChoices("target", weight="w"), bad_rows=BadRows.SKIP, holdout=None
    )
    assert schema.summary["train"]["bad_rows"] == 3
    assert schema.summary["train"]["rows"] == 297
    good = [float(r[3]) for i, r in enumerate(rows) if i not in (6, 20, 30)]
    assert schema.weight is not None and schema.weight.mean == pytest.approx(np.mean(good))
    assert schema.feature_names == ("x1", "x2", "color")


@pytest.mark.slow
def test_a_resume_with_another_weight_column_is_refused(tmp_path):
    train = write_csv(tmp_path / "train.csv", HEADER, imbalanced_rows(400, 1, 3.0))
    job = tmp_path / "job"
    args = [f"--train_data={train}", f"--job_dir={job}", *FLAGS, "--max_iteration_steps=20"]
    code, stderr = run_in_process(args)
    assert code == 0, stderr[-2000:]
    code, stderr = run_in_process([a for a in args if a != "--weight_column=w"])
    assert code == 2 and "weight_column: was 'w', now None" in stderr, stderr[-2000:]


# -- the distributed paths honour the weights -----------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "shape, placement",
    [
        # MultiWorkerMirrored: synchronous replicas (`Iteration._variable_steps`).
        ({"workers": 1}, "replication"),
        # Parameter servers: workers train on their own (`_local_steps`, datasets built on the
        # workers without Python); the evaluator evaluates the checkpoints, weighted.
        ({"workers": 2, "ps": 1, "evaluator": True}, "replication"),
    ],
)
def test_a_cluster_trains_on_the_weights(tmp_path, shape, placement):
    from tests.distribute.test_distributed import Job
    from trainer.distribute.cluster import ClusterShape

    eval_rows = imbalanced_rows(2000, 2)
    eval_path = write_csv(tmp_path / "eval.csv", HEADER, eval_rows)
    train = write_csv(tmp_path / "train.csv", HEADER, imbalanced_rows(3000, 1, 15.0))
    args = [f"--train_data={train}", f"--eval_data={eval_path}", *FLAGS]
    with Job(tmp_path, ClusterShape(**shape), *args, f"--placement={placement}") as job:
        assert job.cluster.wait(timeout=400) == 0
        if shape.get("evaluator"):
            job.wait_for_line("evaluator", "the job is complete", timeout=60)
        report = job.report()
    assert report["status"] == "complete"
    assert report["final"]["weight_column"] == "w"
    # Unweighted, one process reaches a recall of ~0.56 on these rows (test above).
    assert recall_of_yes(job.dir / "model", eval_rows) > 0.85
    if shape.get("evaluator"):
        [evaluation] = json.loads((job.dir / "eval" / "iteration-0.json").read_text())[-1:]
        assert all(0 < m["accuracy"] <= 1 for m in evaluation["candidates"].values())


# -- the weight through the input pipeline --------------------------------------------------
@pytest.mark.parametrize("kind", ["float", "int", "text"])
def test_tfrecord_weights_of_any_feature_type(tmp_path, kind):
    from tests.input.support import write_tfrecord
    from trainer.errors import InputError
    from trainer.input.features import WEIGHT
    from trainer.input.pipeline import Pipeline

    def weight(i, sign=1):
        value = sign * (i % 3)
        return {"float": float(value), "int": int(value), "text": str(value).encode()}[kind]

    records = [{"x": float(i), "w": weight(i), "y": b"ab"[i % 2 : i % 2 + 1]} for i in range(9)]
    path = write_tfrecord(tmp_path / "a.tfrecord", records)
    source = files_lib.open_source(path, flag="--train_data")
    choices = ColumnChoices("y", weight="w")
    schema = scan.scan_training(source, choices, bad_rows=BadRows.ERROR, holdout=None)
    assert schema.feature_names == ("x",) and schema.weight is not None
    assert schema.weight.mean == pytest.approx(1.0)  # 0, 1, 2, 0, 1, 2, ...
    [(features, labels)] = list(Pipeline(source, schema).encoded())
    np.testing.assert_allclose(features[WEIGHT].numpy(), [i % 3 for i in range(9)])
    assert set(features) == {"dense", WEIGHT}
    [(raw, _, weights)] = list(Pipeline(source, schema).raw(with_weight=True))
    assert set(raw) == {"x"}
    np.testing.assert_allclose(weights.numpy(), [i % 3 for i in range(9)])

    records[4]["w"] = weight(2, sign=-1)
    bad = files_lib.open_source(
        write_tfrecord(tmp_path / "b.tfrecord", records), flag="--train_data"
    )
    with pytest.raises(InputError, match=r"weight column 'w' holds .*-2.* record 5"):
        scan.scan_training(bad, choices, bad_rows=BadRows.ERROR, holdout=None)


def test_the_encoded_weights_are_scaled_to_a_mean_of_one_and_bad_ones_skipped(tmp_path):
    from trainer.input.features import WEIGHT
    from trainer.input.pipeline import Pipeline

    rows = imbalanced_rows(200, 1, 9.0)
    rows[3][3] = "-1"
    path = write_csv(tmp_path / "t.csv", HEADER, rows)
    source = files_lib.open_source(str(path), flag="--train_data")
    schema = scan.scan_training(
        source, ColumnChoices("target", weight="w"), bad_rows=BadRows.SKIP, holdout=None
    )
    raw_weights = np.array([float(r[3]) for i, r in enumerate(rows) if i != 3])
    weights = np.concatenate(
        [f[WEIGHT].numpy() for f, _ in Pipeline(source, schema, BadRows.SKIP).encoded()]
    )
    np.testing.assert_allclose(weights, raw_weights / raw_weights.mean(), rtol=1e-6)
    assert weights.mean() == pytest.approx(1.0)
    assert schema.bytes_per_example() == schema.dense_width * 4 + 8 + 4
    # Training batches carry them too, streamed from the files or from memory.
    from trainer.input.pipeline import Selection

    for cache_rows in (None, 199):
        batches = Pipeline(source, schema, BadRows.SKIP).training(
            Selection(), batch_size=16, seed=0, shuffle_buffer=64, cache_rows=cache_rows
        )
        features, labels = next(iter(batches))
        assert features[WEIGHT].shape == labels.shape == (16,)
        scaled = np.unique(raw_weights / raw_weights.mean())  # two values: 1 and 9 scaled
        assert np.isclose(features[WEIGHT].numpy()[:, None], scaled[None]).any(axis=1).all()
