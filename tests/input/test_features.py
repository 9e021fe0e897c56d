"""The preprocessing layer: widths, standardisation, missing values and unknown categories."""

import numpy as np
import pytest
import tensorflow as tf

from trainer.input import schema as S
from trainer.input.features import Preprocessor, expand

LABEL = S.Label("y", S.HeadType.BINARY, ("0", "1"))


def encode(schema, **features):
    tensors = {k: tf.constant(v) for k, v in features.items()}
    encoded = Preprocessor(schema)(tensors)
    assert set(encoded) == {"dense"}  # no embedded column
    return encoded["dense"].numpy()


def test_width_equals_dense_width():
    schema = S.Schema(
        (
            S.NumericColumn("a", 1.0, 2.0, (0.0, 1.0, 5.0)),
            S.CategoricalColumn("c", ("x", "y")),
            S.NumericColumn("b", 0.0, 1.0),
        ),
        LABEL,
    )
    out = encode(
        schema,
        a=np.array([1.0, 2.0, 3.0], np.float32),
        c=np.array(["x", "y", "q"]),
        b=np.array([0.0, 1.0, 2.0], np.float32),
    )
    assert out.shape == (3, schema.dense_width) == (3, 3 + 3 + 1)
    assert out.dtype == np.float32


def test_standardisation_and_piecewise_linear_encoding():
    # bins [0, 5), [5, 15), [15, 20]
    schema = S.Schema((S.NumericColumn("a", 10.0, 4.0, (0.0, 5.0, 15.0, 20.0)),), LABEL)
    out = encode(schema, a=np.array([10.0, 2.0, 18.0, 25.0, -1.0, 5.0], np.float32))
    np.testing.assert_allclose(out[:, 0], [0.0, -2.0, 2.0, 3.75, -2.75, -1.25])
    np.testing.assert_allclose(
        out[:, 1:],
        [
            [1.0, 0.5, 0.0],
            [0.4, 0.0, 0.0],
            [1.0, 1.0, 0.6],
            [1.0, 1.0, 1.0],
            [0.0, 0.0, 0.0],
            [1.0, 0.0, 0.0],
        ],
        rtol=1e-6,
        atol=1e-7,
    )


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
    np.testing.assert_array_equal(
        out, [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 1], [1, 0, 0, 0]]
    )


def test_empty_vocabulary_is_all_oov():
    schema = S.Schema((S.CategoricalColumn("c", ()),), LABEL)
    np.testing.assert_array_equal(encode(schema, c=np.array(["", "a"])), [[1], [1]])


def test_columns_in_schema_order_regardless_of_dict_order():
    schema = S.Schema((S.CategoricalColumn("c", ("x",)), S.NumericColumn("a", 0.0, 1.0)), LABEL)
    out = Preprocessor(schema)({"a": tf.constant([7.0]), "c": tf.constant(["x"])})["dense"]
    np.testing.assert_array_equal(out, [[1, 0, 7]])


def test_input_signature():
    schema = S.Schema((S.NumericColumn("a", 0.0, 1.0), S.CategoricalColumn("c", ("x",))), LABEL)
    signature = Preprocessor(schema).input_signature()
    assert list(signature) == ["a", "c"]
    assert signature["a"].dtype == tf.float32 and signature["c"].dtype == tf.string
    assert signature["a"].shape.as_list() == [None]


def test_large_vocabularies_become_embedding_ids_and_small_ones_stay_one_hot():
    big = S.CategoricalColumn(
        "id", tuple(f"u{i}" for i in range(100)), encoding=S.Encoding.EMBEDDING, embedding_dim=8
    )
    schema = S.Schema(
        (
            S.CategoricalColumn("c", ("x", "y")),
            big,
            S.NumericColumn("a", 0.0, 1.0),
            S.CategoricalColumn("id2", ("p", "q"), encoding=S.Encoding.EMBEDDING, embedding_dim=2),
        ),
        LABEL,
    )
    encoded = Preprocessor(schema)(
        {
            "c": tf.constant(["y", "z"]),
            "id": tf.constant(["u7", "nope"]),
            "a": tf.constant([1.0, 2.0]),
            "id2": tf.constant(["q", "p"]),
        }
    )
    np.testing.assert_array_equal(encoded["dense"], [[0, 1, 0, 1], [0, 0, 1, 2]])
    np.testing.assert_array_equal(encoded["ids"], [[7, 1], [100, 0]])  # 100: out of vocabulary
    assert schema.dense_width == 4
    assert [(e.name, e.size, e.dim) for e in schema.embedded] == [("id", 101, 8), ("id2", 3, 2)]


def test_encodes_a_schema_from_statistics():
    column = S.numeric_column(
        "n",
        count=5,
        missing=1,
        mean=3.0,
        std=float(np.std([1, 2, 3, 4, 5])),
        minimum=1.0,
        maximum=5.0,
        sample=np.array([1.0, 2, 3, 4, 5]),
        num_bins=2,
    )
    schema = S.Schema((column,), LABEL)
    out = encode(schema, n=np.array([1, 2, 3, np.nan, 4, 5], np.float32))
    assert out.shape == (6, schema.dense_width) == (6, 3)
    standardised = out[:, 0]
    assert standardised[3] == 0.0  # missing -> mean -> 0
    present = np.delete(standardised, 3)
    np.testing.assert_allclose(present.mean(), 0.0, atol=1e-6)
    np.testing.assert_allclose(present.std(), 1.0, rtol=1e-5)


def test_the_compact_half_then_expand_is_the_encoding():
    """What an in-memory table of a large table keeps (`compact`: numbers and indices), encoded
    as it is read (`expand`), is the preprocessor's encoding, bit for bit; other keys pass."""
    schema = S.Schema(
        (
            S.NumericColumn("a", 1.0, 2.0, (0.0, 1.0, 5.0)),
            S.CategoricalColumn("c", ("x", "y")),
            S.CategoricalColumn(
                "e", ("p", "q", "r"), encoding=S.Encoding.EMBEDDING, embedding_dim=2
            ),
            S.NumericColumn("b", 0.0, 1.0),
        ),
        LABEL,
    )
    features = {
        "a": tf.constant([1.0, float("nan"), 7.0, -1.0]),
        "c": tf.constant(["x", "y", "q", " y "]),
        "e": tf.constant(["r", "zz", "p", "q"]),
        "b": tf.constant([0.5, 1.0, float("inf"), 2.0]),
    }
    preprocessor = Preprocessor(schema)
    compact = preprocessor.compact(features)
    assert {k: v.shape for k, v in compact.items()} == {
        "numeric": (4, 2),
        "index": (4, 1),
        "ids": (4, 1),
    }
    expanded = expand(schema, {**compact, "weight": tf.ones([4])})
    encoded = preprocessor(features)
    assert set(expanded) == {"dense", "ids", "weight"}
    np.testing.assert_array_equal(expanded["dense"], encoded["dense"])
    np.testing.assert_array_equal(expanded["ids"], encoded["ids"])
    np.testing.assert_array_equal(expanded["weight"], np.ones(4))


@pytest.mark.parametrize("missing", [np.nan, np.inf])
def test_a_column_with_an_indicator_flags_its_missing_values(missing):
    """Value (at the mean where missing), then the indicator, then the bins."""
    column = S.NumericColumn("a", 3.0, 2.0, (1.0, 4.0, 6.0), missing=5, indicator=True)
    schema = S.Schema((column, S.NumericColumn("b", 0.0, 1.0)), LABEL)
    out = encode(
        schema, a=np.array([missing, 5.0], np.float32), b=np.array([1.0, np.nan], np.float32)
    )
    assert schema.dense_width == column.width + 1 == 5
    np.testing.assert_allclose(out[:, 0], [0.0, 1.0])
    np.testing.assert_allclose(out[:, 1], [1.0, 0.0])  # the indicator
    np.testing.assert_allclose(out[:, 2:4], [[2.0 / 3.0, 0.0], [1.0, 0.5]], rtol=1e-6)
    np.testing.assert_allclose(out[:, 4], [1.0, 0.0])  # b has none: at its mean, unflagged
    assert schema.plain_positions == (0, 1, 4)
    assert schema.indicated_positions == ((0, 1),)


def test_indicators_come_with_missing_training_values_and_survive_schema_json():
    def column(missing, wanted=True):
        return S.numeric_column(
            "a",
            count=10,
            missing=missing,
            mean=0.0,
            std=1.0,
            minimum=-1.0,
            maximum=1.0,
            sample=np.linspace(-1, 1, 10),
            num_bins=2,
            missing_indicator=wanted,
        )

    assert column(3).indicator and not column(0).indicator and not column(3, False).indicator
    schema = S.Schema((column(3), column(0)), LABEL)
    assert S.Schema.from_json(schema.to_json()).columns == schema.columns
    # a schema.json written before indicators existed reads as without them
    import json

    old = json.loads(schema.to_json())
    for c in old["columns"]:
        del c["indicator"]
    read = S.Schema.from_document(old).columns
    assert not any(isinstance(c, S.NumericColumn) and c.indicator for c in read)


def test_a_fitted_member_reads_a_missing_value_as_nan_and_the_others_at_the_mean():
    """Boosted trees route a missing value themselves (NaN); a network reads the mean and the
    indicator."""
    from trainer.model import trees
    from trainer.model.subnetwork import Inputs, Subnetwork

    schema = S.Schema(
        (
            S.NumericColumn("a", 3.0, 2.0, (1.0, 4.0, 6.0), missing=5, indicator=True),
            S.CategoricalColumn("c", ("x", "y")),
            S.NumericColumn("b", 0.0, 1.0, missing=2, indicator=True),
        ),
        LABEL,
    )
    inputs = Inputs(
        schema.dense_width, schema.embedded, schema.plain_positions, schema.indicated_positions
    )
    dense = Preprocessor(schema)(
        {
            "a": tf.constant([np.nan, 5.0]),
            "c": tf.constant(["x", "y"]),
            "b": tf.constant([2.0, np.nan]),
        }
    )
    member = Subnetwork(
        trees.TreesBuilder(max_trees=2), inputs=inputs, logits_dimension=1, seed=1, name="t"
    )
    seen = member.fit_inputs(dense).numpy()
    # plain: a, a's indicator, c's three one-hots, b, b's indicator
    np.testing.assert_array_equal(np.isnan(seen[:, 0]), [True, False])
    np.testing.assert_array_equal(seen[:, 1], [1.0, 0.0])
    np.testing.assert_array_equal(np.isnan(seen[:, 5]), [False, True])
    assert not np.isnan(seen[:, 2:5]).any() and not np.isnan(seen[:, 6]).any()
    assert not np.isnan(dense["dense"].numpy()).any()
