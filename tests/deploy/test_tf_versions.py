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
