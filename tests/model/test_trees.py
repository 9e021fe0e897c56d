"""The boosted-tree member (trainer/model/trees.py) and the k-head member
(trainer/model/kheads.py): the compiled trees score as the library does, to float rounding,
the member keeps its trees through a checkpoint, and the search keeps whichever member the
table favours; the exported mixed model serves the same in TensorFlow 2.15."""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

from tests.support import load_report, run_task, write_csv
from trainer.input.features import encoded
from trainer.input.schema import HeadType, Label
from trainer.model import FitRows, Inputs, KHeadBuilder, Subnetwork, TreesBuilder
from trainer.model.heads import Head
from trainer.model.trees import PATIENCE_ROUNDS, Forest, fold_of, raw_scores

FEATURES = 6


def _rows(rng, n: int) -> np.ndarray:
    x = rng.normal(size=(n, FEATURES))
    x[rng.random(x.shape) < 0.1] = np.nan  # missing values, each side learned per split
    return x


def _targets(rng, x: np.ndarray, kind: str) -> np.ndarray:
    a, b = np.nan_to_num(x[:, 0]), np.nan_to_num(x[:, 1], nan=2.0)
    if kind == "binary":
        return (a + 0.5 * rng.normal(size=len(x)) > 0).astype(int)
    if kind == "multiclass":
        return (a > 0).astype(int) + (b > 0.5)
    return np.square(np.nan_to_num(x[:, 2])) + b + rng.normal(size=len(x))


@pytest.mark.parametrize("kind", ["binary", "multiclass", "regression"])
def test_compiled_trees_score_as_the_library_does(kind):
    rng = np.random.default_rng(0)
    x = _rows(rng, 3000)
    model = (
        HistGradientBoostingRegressor(max_iter=40, random_state=0)
        if kind == "regression"
        else HistGradientBoostingClassifier(max_iter=40, random_state=0)
    )
    model.fit(x, _targets(rng, x, kind))
    logits = model.n_trees_per_iteration_
    forest = Forest.of(model).padded(trees=40 * logits, nodes=40 * logits * 61 + 1)
    test = _rows(rng, 2000)
    # Values exactly on each split's threshold, and either side of it by one float step.
    splits = np.flatnonzero(np.isfinite(forest.threshold))
    for row, node in enumerate(splits[:600]):
        step = [0.0, -1.0, 1.0][row % 3]
        threshold = forest.threshold[node]
        test[row, forest.feature[node]] = np.nextafter(threshold, threshold + step)
    arrays = {k: tf.constant(v) for k, v in vars(forest).items()}
    got = raw_scores(arrays, tf.constant(test), logits).numpy()
    np.testing.assert_allclose(got, model._raw_predict(test), rtol=0, atol=1e-5)
    assert np.isnan(test).any()


def _label(kind: str) -> Label:
    head = {"binary": HeadType.BINARY, "regression": HeadType.REGRESSION}[kind]
    classes = ("no", "yes") if kind == "binary" else ()
    return Label("y", head, classes=classes, mean=1.0, std=2.0)


def test_a_fitted_tree_member_is_cross_fitted_and_keeps_its_trees_through_a_checkpoint(tmp_path):
    """Each row's training score is the forest fitted without its fold; elsewhere the member
    is the mean of the forests; a member rebuilt from its builder reads the same trees."""
    rng = np.random.default_rng(1)
    x = np.nan_to_num(_rows(rng, 2000)).astype(np.float32)
    x64 = x.astype(np.float64)
    y = _targets(rng, x64, "binary")
    builder = TreesBuilder(max_trees=30, folds=3)

    def member():
        return Subnetwork(
            builder, inputs=Inputs(FEATURES), logits_dimension=1, seed=0, name="t0_trees"
        )

    fitted = member()
    losses = Head(_label("binary")).target_losses
    report = builder.fit(fitted.body, FitRows(x64, y, None, False, 3, losses))
    assert report["rows"] == 2000 and report["folds"] == 3
    assert fitted.dense_variables == []  # nothing for the optimizer
    folds = fold_of(x64, 3)
    assert sorted(np.bincount(folds)) == pytest.approx([667, 667, 667], abs=60)
    library = [
        HistGradientBoostingClassifier(max_iter=30, random_state=3 + k)
        .fit(x[folds != k], y[folds != k])
        ._raw_predict(x64)[:, 0]
        for k in range(3)
    ]
    features = encoded(tf.constant(x))
    _, served = fitted(features)
    _, held_out = fitted(features, training=True)
    np.testing.assert_allclose(served[:, 0], np.mean(library, axis=0), atol=1e-5)
    own = np.choose(folds, library)
    np.testing.assert_allclose(held_out[:, 0], own, atol=1e-5)
    tf.train.Checkpoint(m=fitted.checkpoint_variables()).write(str(tmp_path / "ck"))
    restored = member()
    tf.train.Checkpoint(m=restored.checkpoint_variables()).read(
        str(tmp_path / "ck")
    ).assert_consumed()
    np.testing.assert_array_equal(restored(features)[1].numpy(), served.numpy())


def test_each_training_row_gets_the_scores_of_the_forest_that_left_it_out_for_every_class():
    """Training rows walk their own held-out forest alone: one tree per class and round,
    the forests side by side; the mean of the forests elsewhere."""
    rng = np.random.default_rng(5)
    x64 = np.nan_to_num(_rows(rng, 900)).astype(np.float32).astype(np.float64)
    y = _targets(rng, x64, "multiclass")
    builder = TreesBuilder(max_trees=15, folds=3)
    layer = builder.build_member(input_dim=x64.shape[1], logits_dimension=3, seed=0)
    losses = Head(Label("y", HeadType.MULTICLASS, classes=("a", "b", "c"))).target_losses
    rounds = builder.fit(layer, FitRows(x64, y, None, False, 3, losses))["rounds"]
    folds = fold_of(x64, 3)
    library = [
        HistGradientBoostingClassifier(max_iter=rounds, random_state=3 + k)
        .fit(x64[folds != k], y[folds != k])
        ._raw_predict(x64)
        for k in range(3)
    ]
    held_out = layer(tf.constant(x64), training=True).numpy()
    np.testing.assert_allclose(held_out, np.stack(library)[folds, np.arange(len(y))], atol=1e-5)
    np.testing.assert_allclose(layer(tf.constant(x64)).numpy(), np.mean(library, 0), atol=1e-5)


def test_multiclass_heads_are_mixed_as_the_mean_of_their_probabilities():
    head = Head(Label("y", HeadType.MULTICLASS, classes=("a", "b", "c")))
    heads = tf.constant(np.random.default_rng(3).normal(size=(5, 4, 3)) * 3, tf.float32)
    mixed = tf.nn.softmax(head.mean_of_heads(heads)).numpy()
    np.testing.assert_allclose(mixed, tf.reduce_mean(tf.nn.softmax(heads), 1), rtol=1e-5)


@pytest.mark.parametrize("kind", ["binary", "regression"])
def test_a_k_head_member_hands_the_ensemble_the_mean_of_its_heads(kind):
    head = Head(_label(kind))
    builder = KHeadBuilder(2, layer_size=16, heads_count=4)
    net = Subnetwork(
        builder,
        inputs=Inputs(FEATURES),
        logits_dimension=1,
        seed=0,
        name="k",
        mean_of_heads=head.mean_of_heads,
    )
    features = encoded(tf.constant(np.random.default_rng(2).normal(size=(7, FEATURES)), tf.float32))
    last, logits, heads = net.forward(features)
    assert tuple(last.shape) == (7, 16) and tuple(heads.shape) == (7, 4, 1)
    if kind == "binary":  # the logit of the mean probability
        mean = tf.reduce_mean(tf.sigmoid(heads[:, :, 0]), axis=1).numpy()
        np.testing.assert_allclose(tf.sigmoid(logits[:, 0]).numpy(), mean, rtol=1e-5)
    else:
        np.testing.assert_allclose(logits[:, 0], tf.reduce_mean(heads[:, :, 0], 1), rtol=1e-5)
    assert len(net.dense_variables) == 1 + 2 * 2 + 2  # scaling, 2 layers, the heads


def _table(path, kind: str, n: int = 2000):
    """A step function of two columns (trees' table: 16 stripes of x1, flipped by the sign
    of x2 + 0.3) or a smooth one (networks')."""
    rng = np.random.default_rng(5)
    x1, x2 = rng.uniform(-2, 2, n), rng.uniform(-2, 2, n)
    if kind == "steps":
        score = 3.0 * (2 * (np.floor(x1 * 4) % 2) - 1) * np.sign(x2 + 0.3)
    else:
        score = 2.0 * np.sin(x1) + 1.5 * x2
    label = np.where(score + 0.4 * rng.normal(size=n) > 0, "yes", "no")
    rows = [[f"{a:.5f}", f"{b:.5f}", y] for a, b, y in zip(x1, x2, label)]
    return write_csv(path, ["x1", "x2", "target"], rows)


def _search(tmp_path, kind: str, *flags: str):
    """A search of trees and k-head members on `_table(kind)`: (its job dir, its stderr)."""
    data = _table(tmp_path / "train.csv", kind)
    job = tmp_path / "job"
    args = [f"--train_data={data}", "--label_column=target", f"--job_dir={job}"]
    result = run_task([*args, "--generator=trees,kheads", "--bags=1", *flags])
    assert result.returncode == 0, result.stderr[-3000:]
    return job, result.stderr


@pytest.mark.parametrize(
    "kind, kept", [("steps", "trees_"), pytest.param("smooth", "kheads_", marks=pytest.mark.slow)]
)
def test_the_search_keeps_the_member_the_table_favours(tmp_path, kind, kept):
    job, log = _search(tmp_path, kind, "--max_iterations=1", "--max_iteration_steps=400")
    report = load_report(job)
    (member,) = report["architecture"]["members"]
    assert member["builder"].startswith(kept), report["iterations"][0]
    assert "fitted t0_trees_200x31" in log


PREDICT = """
import json, sys
import tensorflow as tf
fn = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
rows = json.load(open(sys.argv[2]))
out = fn(x1=tf.constant([r[0] for r in rows]), x2=tf.constant([r[1] for r in rows]))
print(json.dumps({"version": tf.__version__, "logits": out["logits"].numpy().tolist()}))
"""


@pytest.mark.slow
def test_a_mixed_model_of_trees_and_k_heads_serves_the_same_in_tf_2_15(tmp_path):
    from tests.deploy import venvs

    job, _ = _search(
        tmp_path, "steps", "--max_iterations=2", "--force_grow", "--max_iteration_steps=200"
    )
    members = [m["builder"] for m in load_report(job)["architecture"]["members"]]
    assert any(m.startswith("trees_") for m in members), members
    assert any(m.startswith("kheads_") for m in members), members
    rows = [[float(a), float(b)] for a, b in np.random.default_rng(9).uniform(-2, 2, (300, 2))]
    rows[:4] = [[0.25, 0.0], [0.0, -0.3], [1.5, 5.0], [-9.0, 9.0]]  # on the steps, outside
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    serve = tf.saved_model.load(str(job / "model")).signatures["serving_default"]
    here = serve(
        x1=tf.constant([r[0] for r in rows], tf.float32),
        x2=tf.constant([r[1] for r in rows], tf.float32),
    )["logits"].numpy()
    python = venvs.tf_venv("2.15.1")
    other = subprocess.run(
        [str(python), "-c", PREDICT, str(job / "model"), str(tmp_path / "rows.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert other.returncode == 0, other.stderr[-4000:]
    answer = json.loads(other.stdout.strip().splitlines()[-1])
    assert answer["version"] == "2.15.1"
    np.testing.assert_allclose(answer["logits"], here, atol=1e-5)


def test_the_fold_models_stop_where_the_out_of_fold_loss_is_lowest_or_the_deadline_falls():
    """Cross-validated early stopping: every fold model cut to the rounds whose summed loss
    on the left-out folds is lowest, the same trees as the library's fit of that many rounds;
    past the deadline one check's rounds grow, and the report says the budget stopped it."""
    rng = np.random.default_rng(4)
    # float32 values, as the member's inputs are (a Keras layer casts its input to float32)
    x64 = np.nan_to_num(_rows(rng, 600)).astype(np.float32).astype(np.float64)
    y = (rng.uniform(size=600) < 0.5).astype(np.int64)  # noise: more rounds only overfit
    builder = TreesBuilder(max_trees=200, folds=3)
    layer = builder.build_member(input_dim=x64.shape[1], logits_dimension=1, seed=0)
    losses = Head(_label("binary")).target_losses
    report = builder.fit(layer, FitRows(x64, y, None, False, 3, losses))
    assert report["rounds"] < 20 and report["grown"] < 200 and "stopped" not in report
    folds = fold_of(x64, 3)
    library = [
        HistGradientBoostingClassifier(max_iter=report["rounds"], random_state=3 + k)
        .fit(x64[folds != k], y[folds != k])
        ._raw_predict(x64)[:, 0]
        for k in range(3)
    ]
    served = layer(tf.constant(x64)).numpy()[:, 0]
    np.testing.assert_allclose(served, np.mean(library, axis=0), atol=1e-5)
    assert layer.parameters < 3 * 20 * 3 * 31  # the fitted trees alone, not the capacity

    signal = (x64[:, 0] > 0).astype(np.int64)  # learnable: the loss keeps falling for a while
    late = FitRows(x64, signal, None, False, 3, losses, deadline=time.monotonic() - 1)
    stopped = builder.fit(layer, late)
    assert stopped["grown"] == PATIENCE_ROUNDS and stopped["stopped"] == "the time budget"
