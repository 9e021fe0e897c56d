"""A missing value is served as it was trained on: JSON null, a field left out and the training
data's missing-value tokens predict, in the local server, local batch prediction (CSV and JSON
Lines) and the exported signature under TensorFlow 2.15 (Vertex's prebuilt prediction image),
exactly what the model makes of the same rows read by the trainer's own reader."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from deploy import predict
from deploy.batch_prediction import convert as batch_convert
from deploy.batch_prediction import local as batch_local
from deploy.batch_prediction import output
from deploy.batch_prediction import vertex as batch_vertex
from deploy.serving.instances import Predictor
from deploy.serving.server import PredictionServer, Routes
from tests.deploy import venvs
from tests.support import REPO, run_task, task_env, write_csv

HEADER = ["x1", "x2", "color", "target"]
# How the training file writes a missing number (the tokens the trainer reads as missing) and
# a missing category (an empty field).
NUMBER_GAPS = ("", "NA", "?", "null")


def _rows(n: int, seed: int) -> list[list[str]]:
    """x1 (mean about 5, missing in a fifth of the rows, written every way), x2, a colour
    (empty in a fifth) and a binary target that depends on all three."""
    rng = np.random.default_rng(seed)
    x1, x2 = 5 + rng.normal(size=n), rng.normal(size=n)
    color = rng.choice(["red", "green", "blue"], size=n)
    score = 1.5 * (x1 - 5) - x2 + np.select([color == "red", color == "green"], [1.0, -1.0], 0.0)
    target = np.where(score + 0.3 * rng.normal(size=n) > 0, "yes", "no")
    rows = []
    for i in range(n):
        a = NUMBER_GAPS[i % 4] if i % 5 == 0 else f"{x1[i]:.4f}"
        c = "" if i % 5 == 3 else str(color[i])
        rows.append([a, f"{x2[i]:.4f}", c, str(target[i])])
    return rows


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A linear model trained on a table with missing numbers and categories; its eval rows."""
    root = tmp_path_factory.mktemp("missing")
    train = write_csv(root / "train.csv", HEADER, _rows(1500, 1))
    rows = _rows(40, 2)
    result = run_task(
        [
            f"--train_data={train}",
            "--label_column=target",
            f"--job_dir={root / 'job'}",
            "--generator=linear",
            "--max_iterations=1",
            "--max_iteration_steps=200",
            "--batch_size=64",
            "--bags=1",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return root, rows


@pytest.fixture(scope="module")
def model(job):
    return Predictor(str(job[0] / "job" / "model"))


def _reference(model: Predictor, rows: list[list[str]]) -> list[float]:
    """The probability of "yes" the signature gives the rows as the trainer's reader parses
    them: every missing-value token a NaN, an empty category ""."""
    import tensorflow as tf

    def number(text: str) -> float:
        return math.nan if text in NUMBER_GAPS else float(text)

    outputs = model.predict_tensors(
        {
            "x1": tf.constant([number(r[0]) for r in rows], tf.float32),
            "x2": tf.constant([number(r[1]) for r in rows], tf.float32),
            "color": tf.constant([r[2] for r in rows]),
        }
    )
    return outputs["probabilities"].numpy()[:, 1].tolist()


def _instances(rows: list[list[str]]) -> list[dict]:
    """The rows as JSON instances, a missing value sent each way a client may send it: null,
    the field left out, a token; the target dropped."""
    instances = []
    for i, (x1, x2, color, _) in enumerate(rows):
        instance: dict = {"x2": float(x2)}
        if x1 not in NUMBER_GAPS:
            instance["x1"] = float(x1)
        elif i % 4 == 0:
            instance["x1"] = None
        elif i % 4 == 1:
            instance["x1"] = x1 or "NA"  # a token, as text
        elif i % 4 == 2:
            instance["x1"] = math.nan  # TensorFlow Serving's form: NaN in the JSON text
        if color or i % 2:
            instance["color"] = color or None
        instances.append(instance)
    return instances


def _yes(predictions: list[dict]) -> list[float]:
    return [p["probabilities"][1] for p in predictions]


def test_every_form_of_a_missing_value_predicts_as_the_trainer_reads_it(job, model):
    _, rows = job
    expected = _reference(model, rows)
    instances = _instances(rows)
    assert any("x1" not in x for x in instances) and any(x.get("x1") is None for x in instances)
    assert any(isinstance(x.get("x1"), float) and math.isnan(x["x1"]) for x in instances)
    assert any("color" not in x for x in instances) and any(
        x.get("color") is None for x in instances
    )
    np.testing.assert_allclose(_yes(model.predict(instances)), expected, atol=1e-6)
    # A missing number is the training mean with its missing indicator set, as the trainer
    # encodes it: not zero.
    schema = json.loads((job[0] / "job" / "schema.json").read_text())
    x1 = next(c for c in schema["columns"] if c["name"] == "x1")
    assert x1["mean"] == pytest.approx(5, abs=0.2) and x1["indicator"]
    base = {"x2": 0.0, "color": "red"}
    (missing,), (at_zero,) = (_yes(model.predict([{**base, **v}])) for v in ({}, {"x1": 0.0}))
    assert abs(missing - at_zero) > 0.1


def test_the_server_and_local_batch_predict_missing_values(job, model, tmp_path):
    root, rows = job
    expected = _reference(model, rows)
    instances = _instances(rows)
    server = PredictionServer(model, routes=Routes(port=0)).start()
    try:
        np.testing.assert_allclose(
            _yes(predict.predict_at_url(server.url, instances)), expected, atol=1e-6
        )
    finally:
        server.shutdown()
        server.server_close()

    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in instances))
    csv_file = write_csv(tmp_path / "rows.csv", HEADER, rows)
    for source, kind, excluded in ((jsonl, "jsonl", []), (csv_file, "csv", ["target"])):
        result = batch_local.predict_local(
            model_dir="",
            predictor=model,
            sources=[str(source)],
            output_prefix=str(tmp_path / kind),
            instances_format=kind,
            excluded_fields=excluded,
            batch_size=16,
        )
        results, errors = output.read_results(result.output_dir)
        assert errors == [], kind
        np.testing.assert_allclose(
            _yes([r["prediction"] for r in results]), expected, atol=1e-6, err_msg=kind
        )
    # The CSV rows come back as JSON: a missing number as null, a missing category as "".
    first = results[0]["instance"]
    assert rows[0][0] == "" and first["x1"] is None and first["color"] == rows[0][2]


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_vertex_jobs_instances_are_converted_as_tensorflow_serving_takes_them(
    job, model, gcs, kind
):
    """Vertex's prebuilt container is TensorFlow Serving, which takes a missing number as NaN
    (null is "not of expected type: float") and needs every input in each instance: CSV rows
    and JSON Lines instances with null, left-out fields and tokens alike are written so."""
    _, rows = job
    if kind == "csv":
        text = "\n".join([",".join(HEADER), *(",".join(r) for r in rows)]) + "\n"
    else:
        text = "".join(json.dumps(x) + "\n" for x in _instances(rows))
        text += '{"x1": "forty"}\nnot json\n'  # listed, never sent
    gcs.bucket("test-bucket").blob(f"in/rows.{kind}").upload_from_string(text)
    vertex_job = batch_vertex.VertexBatchJob(
        display_name="missing",
        model="1",
        sources=(f"gs://test-bucket/in/rows.{kind}",),
        output_prefix="gs://test-bucket/out",
        instances_format=kind,
    )
    converted = batch_convert.ConvertedVertexJob.of(
        vertex_job, excluded_fields=["target"] if kind == "csv" else []
    )
    conversion = batch_convert.convert(converted, model.fields)
    assert (conversion.num_rows, conversion.num_errors) == (len(rows), 0 if kind == "csv" else 2)
    (path,) = conversion.files
    assert path.endswith("00000-rows.jsonl")
    text = gcs.bucket("test-bucket").blob(path.removeprefix("gs://test-bucket/")).download_as_text()
    assert "null" not in text and "NaN" in text
    sent = [json.loads(line) for line in text.splitlines()]
    assert all(sorted(x) == ["color", "x1", "x2"] for x in sent)
    missing = [x for x, r in zip(sent, rows) if r[0] in NUMBER_GAPS]
    assert missing and all(math.isnan(x["x1"]) for x in missing)
    np.testing.assert_allclose(_yes(model.predict(sent)), _reference(model, rows), atol=1e-6)


def _batch_cli(model_dir, source, out, *flags):
    return subprocess.run(
        [sys.executable, "-m", "deploy.batch", "local", f"--model_dir={model_dir}",
         f"--source={source}", f"--output_prefix={out}", "--instances_format=csv",
         "--excluded_fields=target", *flags],
        cwd=REPO, env=task_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_batch_names_the_failed_rows_and_fails_past_the_error_bound(job, tmp_path):
    root, rows = job
    bad = [["forty", *r[1:]] if i % 10 == 0 else r for i, r in enumerate(rows)]  # 4 of 40
    source = write_csv(tmp_path / "bad.csv", HEADER, bad)
    model_dir = root / "job" / "model"

    over = _batch_cli(model_dir, source, tmp_path / "a")
    assert over.returncode == 1, over.stderr
    (line,) = [x for x in over.stderr.splitlines() if x.startswith("error:")]
    assert "4 of 40 rows (10.0%) could not be predicted" in line
    assert "field 'x1' must be a number or empty, got 'forty'" in line
    assert "--max_error_rate=0.01" in line
    summary = json.loads(over.stdout)
    assert (summary["num_predictions"], summary["num_errors"]) == (36, 4)  # written anyway

    within = _batch_cli(model_dir, source, tmp_path / "b", "--max_error_rate=0.2")
    assert within.returncode == 0, within.stderr
    assert "warning: 4 of 40 rows (10.0%) could not be predicted" in within.stderr

    refused = _batch_cli(model_dir, source, tmp_path / "c", "--max_error_rate=5")
    assert refused.returncode == 2
    assert "--max_error_rate (5) must be a share of the rows, 0 to 1." in refused.stderr
    assert not (tmp_path / "c").exists()


def _predict_cli(*flags):
    return subprocess.run(
        [sys.executable, "-m", "deploy.predict", *flags],
        cwd=REPO, env=task_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_predict_says_a_refusal_or_an_absent_server_in_one_line(model, tmp_path):
    instances = tmp_path / "rows.jsonl"
    instances.write_text('\ufeff{"x1": 1, "x2": "two", "color": "red"}\n')  # a BOM, then a row
    server = PredictionServer(model, routes=Routes(port=0)).start()
    try:
        refused = _predict_cli(f"--instances={instances}", f"--local_url={server.url}")
    finally:
        server.shutdown()
        server.server_close()
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "error: 400: instance 0: field 'x2' must be a number or null, got 'two'."
    )
    absent = _predict_cli(f"--instances={instances}", f"--local_url={server.url}")
    assert absent.returncode == 1
    assert len(absent.stderr.strip().splitlines()) == 1
    assert absent.stderr.startswith(f"error: cannot reach {server.url} (")


# Runs in a venv with TensorFlow 2.15 alone: the signature fed as TensorFlow Serving feeds it
# (NaN for a missing number, "" for a missing text).
PREDICT = """
import json, sys
import tensorflow as tf
fn = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
columns = json.load(open(sys.argv[2]))
feeds = {n: tf.constant(v, tf.string if n == "color" else tf.float32) for n, v in columns.items()}
print(json.dumps(fn(**feeds)["probabilities"].numpy()[:, 1].tolist()))
"""


@pytest.mark.slow
def test_tensorflow_2_15_predicts_missing_values_as_the_trainer_reads_them(job, model, tmp_path):
    root, rows = job
    columns = {
        "x1": [math.nan if r[0] in NUMBER_GAPS else float(r[0]) for r in rows],
        "x2": [float(r[1]) for r in rows],
        "color": [r[2] for r in rows],
    }
    (tmp_path / "columns.json").write_text(json.dumps(columns))  # NaN as Python writes it
    result = subprocess.run(
        [str(venvs.tf_venv("2.15.1")), "-c", PREDICT, str(root / "job" / "model"),
         str(tmp_path / "columns.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(got, _reference(model, rows), atol=1e-6)
