"""deploy/serving/signature.py: the serving signature read from saved_model.pb without TensorFlow
agrees with what TensorFlow itself loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.cloud import api
from deploy.serving import signature


def save_tiny_model(path: Path) -> Path:
    """A SavedModel whose `serving_default` takes a number and a string, like an export."""
    import tensorflow as tf

    class Tiny(tf.Module):
        @tf.function(
            input_signature=[
                {
                    "age": tf.TensorSpec([None], tf.float32, name="age"),
                    "workclass": tf.TensorSpec([None], tf.string, name="workclass"),
                }
            ]
        )
        def serve(self, features):
            p = tf.sigmoid(features["age"] / 50.0)
            return {
                "probabilities": tf.stack([1.0 - p, p], axis=-1),
                "classes": features["workclass"],
                "class_ids": tf.cast(p > 0.5, tf.int64),
            }

    model = Tiny()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})
    return path


def test_the_signature_matches_tensorflows(tmp_path):
    import tensorflow as tf

    path = save_tiny_model(tmp_path / "model")
    found = signature.read(str(path))

    loaded = tf.saved_model.load(str(path)).signatures["serving_default"]
    inputs = loaded.structured_input_signature[1]
    assert {k: v.dtype for k, v in found.inputs.items()} == {
        k: s.dtype.name for k, s in inputs.items()
    }
    assert {k: v.dtype for k, v in found.outputs.items()} == {
        k: s.dtype.name for k, s in loaded.structured_outputs.items()
    }
    # The graph tensor, as saved_model_cli shows it.
    assert found.inputs["workclass"] == signature.Tensor("serving_default_workclass:0", "string")


def test_a_missing_or_broken_model_is_a_named_error(tmp_path):
    with pytest.raises(api.DeployError, match=r"cannot read .*saved_model.pb"):
        signature.read(str(tmp_path / "nothing"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "saved_model.pb").write_bytes(b"\x0a\xff\xff\xff")
    with pytest.raises(api.DeployError, match="not a SavedModel"):
        signature.read(str(tmp_path / "broken"))
