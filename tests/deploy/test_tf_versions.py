"""A model exported by the trainer (TensorFlow 2.17) loads and predicts the same under
TensorFlow 2.15 (the newest standard Vertex AI prediction image, `tf2-cpu.2-15`) and under the
newest TensorFlow release, each in its own cached venv."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from tests.deploy import venvs

# Runs inside the other venv: only TensorFlow, nothing from this repository.
PREDICT = """
import json, sys
import tensorflow as tf
fn = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
instances = json.load(open(sys.argv[2]))
_, specs = fn.structured_input_signature
feeds = {n: tf.constant([x[n] for x in instances], dtype=s.dtype) for n, s in specs.items()}
outputs = {k: v.numpy().tolist() for k, v in fn(**feeds).items()}
outputs["classes"] = [c.decode() for c in outputs["classes"]]
print(json.dumps({"version": tf.__version__, "outputs": outputs}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("version", ["2.15.1", "latest"])
def test_exported_model_predicts_the_same_under(
    version, census_model, predictor, census_rows, tmp_path
):
    python = venvs.tf_venv(version)
    (tmp_path / "instances.json").write_text(json.dumps(census_rows))
    result = subprocess.run(
        [str(python), "-c", PREDICT, census_model, str(tmp_path / "instances.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (
        f"TensorFlow {version} cannot serve the model:\n{result.stderr[-4000:]}"
    )
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    if version != "latest":
        assert answer["version"] == version
    expected = predictor.predict(census_rows)
    got = answer["outputs"]
    assert got["classes"] == [e["classes"] for e in expected]
    assert got["class_ids"] == [e["class_ids"] for e in expected]
    for name in ("probabilities", "logits"):
        np.testing.assert_allclose(
            got[name],
            [e[name] for e in expected],
            atol=1e-5,
            err_msg=f"{name} under TensorFlow {answer['version']}",
        )


@pytest.mark.slow  # trains a small model with two date columns, then TensorFlow 2.15 serves it
def test_a_model_with_dates_and_missing_indicators_predicts_the_same_under_2_15(tmp_path):
    """The date parsing (regular expressions, substrings, integer calendar arithmetic) and the
    missing indicators are ops TensorFlow 2.15 has: the model serves raw date text there."""
    from deploy.serving.instances import Predictor
    from tests.input.test_dates import _dated_rows, _write
    from tests.support import FAST_FLAGS, run_task

    rows = _dated_rows(1500, 1)
    for i in range(0, len(rows), 7):
        rows[i]["x"] = ""  # a missing number: the column gets an indicator
    train = _write(rows, tmp_path / "train.csv", "csv")
    job = tmp_path / "job"
    result = run_task(
        [f"--train_data={train}", "--label_column=target", f"--job_dir={job}", *FAST_FLAGS]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    schema = json.loads((job / "schema.json").read_text())
    assert [c.get("indicator") for c in schema["columns"] if c["name"] == "x"] == [True]
    instances = [
        {"signup": "2024-03-02", "last_seen": "2024-03-01T02:00:00Z", "x": 0.5},
        {"signup": "not a date", "last_seen": "2024-03-01 14:00", "x": float("nan")},
    ]
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    python = venvs.tf_venv("2.15.1")
    served = subprocess.run(
        [str(python), "-c", PREDICT, str(job / "model"), str(tmp_path / "instances.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert served.returncode == 0, served.stderr[-4000:]
    answer = json.loads(served.stdout.strip().splitlines()[-1])
    assert answer["version"] == "2.15.1"
    expected = Predictor(str(job / "model")).predict(instances)
    np.testing.assert_allclose(
        answer["outputs"]["probabilities"], [e["probabilities"] for e in expected], atol=1e-5
    )
