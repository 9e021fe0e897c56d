"""The preprocessing layer: widths, standardisation, missing values and unknown categories."""

import numpy as np
import pytest
import tensorflow as tf

from trainer import schema as S
from trainer.features import Preprocessor

LABEL = S.Label("y", S.HeadType.BINARY, ("0", "1"))


def encode(schema, **features):
    tensors = {k: tf.constant(v) for k, v in features.items()}
    return Preprocessor(schema)(tensors).numpy()


def test_width_equals_input_dim():
    schema = S.Schema((S.NumericColumn("a", 1.0, 2.0, (0.0, 1.0, 5.0)),
                       S.CategoricalColumn("c", ("x", "y")),
                       S.NumericColumn("b", 0.0, 1.0)), LABEL)
    out = encode(schema, a=np.array([1.0, 2.0, 3.0], np.float32),
                 c=np.array(["x", "y", "q"]), b=np.array([0.0, 1.0, 2.0], np.float32))
    assert out.shape == (3, schema.input_dim) == (3, 3 + 3 + 1)
    assert out.dtype == np.float32


def test_standardisation_and_piecewise_linear_encoding():
    # bins [0, 5), [5, 15), [15, 20]
    schema = S.Schema((S.NumericColumn("a", 10.0, 4.0, (0.0, 5.0, 15.0, 20.0)),), LABEL)
    out = encode(schema, a=np.array([10.0, 2.0, 18.0, 25.0, -1.0, 5.0], np.float32))
    np.testing.assert_allclose(out[:, 0], [0.0, -2.0, 2.0, 3.75, -2.75, -1.25])
    np.testing.assert_allclose(out[:, 1:], [[1.0, 0.5, 0.0],
                                            [0.4, 0.0, 0.0],
                                            [1.0, 1.0, 0.6],
                                            [1.0, 1.0, 1.0],
                                            [0.0, 0.0, 0.0],
                                            [1.0, 0.0, 0.0]], rtol=1e-6, atol=1e-7)


def test_numeric_without_bins_is_one_value():
    schema = S.Schema((S.NumericColumn("a", 1.0, 0.5),), LABEL)
    out = encode(schema, a=np.array([2.0], np.float32))
    np.testing.assert_allclose(out, [[2.0]])


@pytest.mark.parametrize("missing", [np.nan, np.inf, -np.inf])
def test_missing_numeric_becomes_mean(missing):
    schema = S.Schema((S.NumericColumn("a", 3.0, 2.0, (1.0, 4.0, 6.0)),), LABEL)
    out = encode(schema, a=np.array([missing, 5.0], np.float32))
    np.testing.assert_allclose(out[:, 0], [0.0, 1.0])
    # the mean's position in the bins
    np.testing.assert_allclose(out[:, 1:], [[2.0 / 3.0, 0.0], [1.0, 0.5]], rtol=1e-6)


def test_categories_one_hot_and_unknown_goes_to_oov_slot():
    schema = S.Schema((S.CategoricalColumn("c", ("red", "green", "blue")),), LABEL)
    out = encode(schema, c=np.array(["green", " blue ", "purple", "", "red"]))
    np.testing.assert_array_equal(out, [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1],
                                        [0, 0, 0, 1], [1, 0, 0, 0]])


def test_empty_vocabulary_is_all_oov():
    schema = S.Schema((S.CategoricalColumn("c", ()),), LABEL)
    np.testing.assert_array_equal(encode(schema, c=np.array(["", "a"])), [[1], [1]])


def test_columns_in_schema_order_regardless_of_dict_order():
    schema = S.Schema((S.CategoricalColumn("c", ("x",)), S.NumericColumn("a", 0.0, 1.0)),
                      LABEL)
    out = Preprocessor(schema)({"a": tf.constant([7.0]), "c": tf.constant(["x"])}).numpy()
    np.testing.assert_array_equal(out, [[1, 0, 7]])


def test_input_signature():
    schema = S.Schema((S.NumericColumn("a", 0.0, 1.0), S.CategoricalColumn("c", ("x",))),
                      LABEL)
    signature = Preprocessor(schema).input_signature()
    assert list(signature) == ["a", "c"]
    assert signature["a"].dtype == tf.float32 and signature["c"].dtype == tf.string
    assert signature["a"].shape.as_list() == [None]


def test_encodes_inferred_schema_of_training_data():
    where = S.Locator(["t.csv"], [0], np.arange(2, 8))
    raw = {"n": np.array(["1", "2", "3", "", "4", "5"]),
           "c": np.array(["a", "b", "a", "a", "c", "b"]),
           "y": np.array(["0", "1", "0", "1", "0", "1"])}
    schema = S.Schema(S.infer_columns(raw, S.ColumnChoices("y", num_bins=2), where), LABEL)
    numbers = np.array([1, 2, 3, np.nan, 4, 5], np.float32)
    out = encode(schema, n=numbers, c=raw["c"])
    assert out.shape == (6, schema.input_dim)
    standardised = out[:, 0]
    assert standardised[3] == 0.0  # missing -> mean -> 0
    present = np.delete(standardised, 3)
    np.testing.assert_allclose(present.mean(), 0.0, atol=1e-6)
    np.testing.assert_allclose(present.std(), 1.0, rtol=1e-5)
