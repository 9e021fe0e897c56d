"""The schema's rules (kinds, encodings, the label's head), its widths and its JSON form; pure
functions of what the scan counted, tested without files. `tests/input/test_scan.py` tests
them through real files."""

import json

import numpy as np
import pytest
import tensorflow as tf

from trainer.errors import InputError
from trainer.input import schema as S
from trainer.input.features import Preprocessor

HeadType = S.HeadType
CHOICES = S.ColumnChoices("y")


# -- kinds ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "numbers, not_numbers, kind",
    [
        (10, 0, S.Kind.NUMERIC),
        (0, 0, S.Kind.NUMERIC),
        (95, 5, S.Kind.NUMERIC),
        (94, 6, S.Kind.CATEGORICAL),
        (0, 3, S.Kind.CATEGORICAL),
    ],
)
def test_kind_from_counts(numbers, not_numbers, kind):
    assert S.infer_kind("x", CHOICES, numbers=numbers, not_numbers=not_numbers) is kind


def test_flags_decide_the_kind():
    choices = S.ColumnChoices("y", numeric=("n",), categorical=("c",))
    assert S.infer_kind("n", choices, numbers=1, not_numbers=50) is S.Kind.NUMERIC
    assert S.infer_kind("c", choices, numbers=50, not_numbers=0) is S.Kind.CATEGORICAL


# -- label and head ---------------------------------------------------------------------------
def label(distinct, head=None, *, numbers=True, integral=True, mean=0.0, std=1.0):
    return S.infer_label(
        "y", head, distinct=distinct, all_numbers=numbers, all_integral=integral, mean=mean, std=std
    )


@pytest.mark.parametrize(
    "distinct, numbers, integral, head, classes",
    [
        ({"no": 1, "yes": 2}, False, False, HeadType.BINARY, ("no", "yes")),
        (
            {"red": 1, "green": 1, "blue": 2},
            False,
            False,
            HeadType.MULTICLASS,
            ("blue", "green", "red"),
        ),
        ({"0": 1, "1": 2}, True, True, HeadType.BINARY, ("0", "1")),
        (
            {str(i): 1 for i in range(10)},
            True,
            True,
            HeadType.MULTICLASS,
            tuple(str(i) for i in range(10)),
        ),
    ],
)
def test_classification_heads(distinct, numbers, integral, head, classes):
    got = label(distinct, numbers=numbers, integral=integral)
    assert (got.head, got.classes) == (head, classes)


@pytest.mark.parametrize(
    "distinct, integral",
    [({str(i): 1 for i in range(11)}, True), ({"0.5": 1, "1.5": 1}, False), (None, True)],
)
def test_regression_heads(distinct, integral):
    got = label(distinct, integral=integral, mean=2.5, std=0.0)
    assert got.head is HeadType.REGRESSION and got.mean == 2.5 and got.std == 1.0


def test_head_override_and_its_errors():
    assert label({"0": 1, "1": 1, "2": 1}, HeadType.REGRESSION).head is HeadType.REGRESSION
    assert label({"a": 1, "b": 1}, HeadType.MULTICLASS, numbers=False).classes == ("a", "b")
    with pytest.raises(InputError, match="--head=binary needs exactly 2.*--head=multiclass"):
        label({"a": 1, "b": 1, "c": 1}, HeadType.BINARY, numbers=False)
    with pytest.raises(InputError, match="1 distinct value"):
        label({"a": 5}, numbers=False)
    with pytest.raises(InputError, match="more than 1000 distinct values"):
        label(None, numbers=False)
    with pytest.raises(InputError, match="learns at most 1000 classes"):
        label(None, HeadType.MULTICLASS)


# -- encodings --------------------------------------------------------------------------------
def test_small_vocabularies_are_one_hot_large_ones_embedded():
    small = S.categorical_column("c", [("a", 3), ("b", 1)], count_error=0, choices=CHOICES)
    assert (small.encoding, small.width, small.size) == (S.Encoding.ONE_HOT, 3, 3)
    values = [(f"v{i}", 1) for i in range(100_000)]
    big = S.categorical_column("id", values, count_error=0, choices=CHOICES)
    assert big.encoding is S.Encoding.EMBEDDING and big.width == 0
    assert (big.size, big.embedding_dim) == (100_001, 16)
    assert (
        S.categorical_column("c", values[:65], count_error=0, choices=CHOICES).embedding_dim == 16
    )  # 1.6 * 66^0.56 = 16.6
    assert (
        S.categorical_column(
            "c", values[:65], count_error=0, choices=S.ColumnChoices("y", one_hot_max_size=8)
        ).embedding_dim
        == 16
    )
    assert (
        S.categorical_column(
            "c", values[:20], count_error=0, choices=S.ColumnChoices("y", one_hot_max_size=8)
        ).embedding_dim
        == round(1.6 * 21**0.56)
        == 9
    )


def test_vocabulary_cap_keeps_the_most_frequent():
    choices = S.ColumnChoices("y", max_vocabulary_size=2)
    column = S.categorical_column(
        "x", [("top", 3), ("mid", 2), ("rare", 1)], count_error=0, choices=choices
    )
    assert column.vocabulary == ("top", "mid") and column.counts == (3, 2)


def test_all_missing_numeric_column_is_an_error():
    with pytest.raises(InputError, match="'x' has no values.*--ignore_columns=x"):
        S.numeric_column(
            "x",
            count=0,
            missing=5,
            mean=0.0,
            std=0.0,
            minimum=0.0,
            maximum=0.0,
            sample=np.zeros(0),
            num_bins=4,
        )


def test_dense_width_and_embedded_columns():
    schema = S.Schema(
        (
            S.NumericColumn("n", 0.0, 1.0, (1.0, 2.0, 4.0)),
            S.NumericColumn("m", 0.0, 1.0),
            S.CategoricalColumn("c", ("a", "b", "c")),
            S.CategoricalColumn("id", ("u", "v"), encoding=S.Encoding.EMBEDDING, embedding_dim=3),
        ),
        S.Label("y", HeadType.BINARY, ("0", "1")),
    )
    assert schema.dense_width == (1 + 2) + 1 + (3 + 1)
    assert schema.plain_positions == (0, 3, 4, 5, 6, 7)  # not n's two bins
    dense = Preprocessor(schema)(
        {
            "n": tf.constant([3.0]),
            "m": tf.constant([-2.0]),
            "c": tf.constant(["b"]),
            "id": tf.constant(["u"]),
        }
    )["dense"]
    plain = tf.gather(dense, schema.plain_positions, axis=1).numpy()
    np.testing.assert_array_equal(plain, [[3.0, -2.0, 0.0, 1.0, 0.0, 0.0]])
    assert schema.embedded == (S.Embedded("id", 3, 3),)
    assert schema.bytes_per_example() == 4 * 8 + 8 + 8


@pytest.mark.parametrize(
    "choices, message",
    [
        (dict(num_bins=-1), "--num_bins"),
        (dict(max_vocabulary_size=0), "--max_vocabulary_size"),
        (dict(one_hot_max_size=0), "--one_hot_max_size"),
        (dict(embedding_dim=0), "--embedding_dim"),
    ],
)
def test_bad_encoding_flags(choices, message):
    with pytest.raises(InputError, match=message):
        S.ColumnChoices("y", **choices)


def test_quantile_edges_bin_the_rest_of_a_dominated_column():
    # 92% zeros: the quantiles of all values are 0,0,0,0,8; the non-zero values are binned
    # by their own quantiles.
    values = np.array([0.0] * 92 + [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    edges = S.quantile_edges(values, 4)
    expected = np.unique(
        np.concatenate([[0.0, 8.0], np.quantile(np.arange(1.0, 9.0), np.linspace(0, 1, 5))])
    )
    np.testing.assert_allclose(edges, expected)
    assert list(edges) == sorted(set(edges))


@pytest.mark.parametrize(
    "values, num_bins, edges",
    [
        ([1.0, 2.0, 3.0], 0, ()),
        ([1.0, 2.0, 3.0], 1, (1.0, 3.0)),
        ([4.0, 4.0, 4.0], 3, ()),  # constant: no bins
        ([1.0, 1.0, 1.0, 7.0], 2, (1.0, 7.0)),
    ],
)
def test_quantile_edges_small_cases(values, num_bins, edges):
    assert S.quantile_edges(np.array(values), num_bins) == edges


@pytest.mark.parametrize(
    "edges, num_bins, width", [((), 0, 1), ((0.0, 1.0), 1, 2), ((0.0, 1.0, 5.0), 2, 3)]
)
def test_numeric_width(edges, num_bins, width):
    column = S.NumericColumn("x", 0.0, 1.0, edges)
    assert column.num_bins == num_bins
    assert column.width == width


# -- JSON -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "label",
    [
        S.Label("y", HeadType.BINARY, ("no", "yes")),
        S.Label("y", HeadType.MULTICLASS, ("0", "1", "2")),
        S.Label("y", HeadType.REGRESSION, mean=3.25, std=0.1 + 0.2),
    ],
)
def test_schema_json_round_trip(label):
    schema = S.Schema(
        (
            S.NumericColumn("age", 38.58164675532078, 13.640223092304275, (0.1, 28.0, 37.0)),
            S.CategoricalColumn("city", ("paris", "", "NA"), (5, 3, 1)),
            S.CategoricalColumn("id", ("u1", "u2"), (2, 1), S.Encoding.EMBEDDING, 4, 1),
            S.NumericColumn("flat", 1.0, 1.0, count=9, missing=1, min=1.0, max=1.0),
        ),
        label,
        {"train": {"rows": 10}},
    )
    text = schema.to_json()
    json.loads(text)
    again = S.Schema.from_json(text)
    assert again == schema
    first = again.columns[0]
    assert isinstance(first, S.NumericColumn) and isinstance(first.edges, tuple)
    assert again.label.head is label.head
    assert again.to_json() == text
    assert again.summary == {"train": {"rows": 10}}


def test_a_schema_of_another_version_is_refused():
    text = json.dumps({"version": 1, "columns": [], "label": {}})
    with pytest.raises(InputError, match="another version of this trainer.*new --job_dir"):
        S.Schema.from_json(text, path="job/schema.json")


def test_json_names_kinds():
    schema = S.Schema(
        (S.NumericColumn("n", 0.0, 1.0), S.CategoricalColumn("c", ("a",))),
        S.Label("y", HeadType.BINARY, ("0", "1")),
    )
    data_ = json.loads(schema.to_json())
    assert [c["kind"] for c in data_["columns"]] == ["numeric", "categorical"]
    assert data_["label"]["head"] == "binary"


def test_dates_and_near_unique_columns_are_warned_of_with_the_fix():
    dates = [f"2023-{m:02d}-{d:02d}" for m in range(1, 13) for d in range(1, 29)]
    (warning,) = S.column_warnings("signup", dates, distinct=336, rows=3000, exact=True)
    assert warning.startswith("column 'signup' looks like dates (e.g. '2023-01-01')")
    assert "336 values in 3,000 rows, 8.9 each" in warning
    assert "--ignore_columns=signup" in warning
    for stamps in (
        ["2005-01-13 09:00:00", "2024-03-01T09:00Z", "2024-03-01 09:00:00.5 +01:00"] * 10,
        [f"{m}/{d}/2024" for m in range(1, 13) for d in range(1, 5)],
    ):
        assert (
            "looks like dates"
            in S.column_warnings("t", stamps, distinct=40, rows=90, exact=True)[0]
        )
    ids = [f"C{i:06d}" for i in range(200)]
    (warning,) = S.column_warnings("id", ids, distinct=5000, rows=5000, exact=False)
    assert warning == (
        "column 'id' is nearly unique per row (5,000+ values in 5,000 rows, 1.0 each): an id or "
        "free text, which a model can only memorise; drop it with --ignore_columns=id."
    )
    # Categories seen a few times each, or few of them, or mostly not dates: no warning.
    assert S.column_warnings("zip", ids, distinct=1000, rows=3000, exact=True) == []
    assert S.column_warnings("d", dates[:10], distinct=10, rows=10, exact=True) == []
    mixed = dates[:5] + [f"x{i}" for i in range(45)]
    assert S.column_warnings("m", mixed, distinct=50, rows=500, exact=True) == []
