"""Schema inference from small CSV files, the schema's JSON form, and its statistics."""

import json

import numpy as np
import pytest

from trainer import data
from trainer import schema as S
from trainer.errors import InputError

HeadType = S.HeadType


def write_csv(tmp_path, header, rows, name="train.csv"):
    path = tmp_path / name
    lines = [",".join(header)] + [",".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def infer(tmp_path, header, rows, label="y", **choices):
    path = write_csv(tmp_path, header, rows)
    table = data.read(path, flag="--train_data")
    return data.schema_from(table, S.ColumnChoices(label, **choices), source=path)


def by_name(schema):
    return {c.name: c for c in schema.columns}


# -- column kinds -----------------------------------------------------------------------------
def test_numeric_and_categorical_inference(tmp_path):
    schema = infer(tmp_path, ["age", "city", "code", "y"],
                   [[30, "paris", 1, 0], [40, "rome", 2, 1], [50, "paris", "x1", 0],
                    [60.5, "oslo", 3, 1]])
    cols = by_name(schema)
    assert schema.feature_names == ("age", "city", "code")
    assert cols["age"].kind is S.Kind.NUMERIC
    assert cols["city"].kind is S.Kind.CATEGORICAL
    assert cols["code"].kind is S.Kind.CATEGORICAL  # 25% non-numbers: categories
    assert cols["age"].mean == pytest.approx(45.125)
    assert cols["age"].std == pytest.approx(np.std([30, 40, 50, 60.5]))


@pytest.mark.parametrize("missing", ["", "?", "NA", "nan", "null", "None"])
def test_missing_tokens_keep_a_column_numeric(tmp_path, missing):
    schema = infer(tmp_path, ["x", "y"], [[1, 0], [missing, 1], [3, 0], [5, 1]])
    column = by_name(schema)["x"]
    assert column.kind is S.Kind.NUMERIC
    assert column.mean == pytest.approx(3.0)  # missing values are not counted
    assert column.std == pytest.approx(np.std([1, 3, 5]))


def test_override_numeric_looking_column_as_categorical(tmp_path):
    schema = infer(tmp_path, ["zip", "y"], [[75001, 0], [75002, 1], [75001, 0]],
                   categorical=("zip",))
    column = by_name(schema)["zip"]
    assert column.kind is S.Kind.CATEGORICAL
    assert column.vocabulary == ("75001", "75002")


def test_override_numeric_with_a_bad_value_names_file_and_line(tmp_path):
    with pytest.raises(InputError) as info:
        infer(tmp_path, ["x", "y"], [[1, 0], [2, 1], ["abc", 0]], numeric=("x",))
    message = str(info.value)
    assert "'x'" in message and "'abc'" in message
    assert "train.csv line 4" in message


def test_ignore_drops_columns(tmp_path):
    schema = infer(tmp_path, ["id", "x", "y"], [["a", 1, 0], ["b", 2, 1]], ignore=("id",))
    assert schema.feature_names == ("x",)


def test_mostly_numeric_column_with_a_typo_is_an_error(tmp_path):
    rows = [[i, i % 2] for i in range(30)]
    rows[17][0] = "1O"  # letter O
    with pytest.raises(InputError) as info:
        infer(tmp_path, ["x", "y"], rows)
    message = str(info.value)
    assert "'1O'" in message
    assert "train.csv line 19" in message
    assert "--categorical_columns=x" in message


def test_typo_check_can_be_overridden(tmp_path):
    rows = [[i, i % 2] for i in range(30)]
    rows[17][0] = "1O"
    schema = infer(tmp_path, ["x", "y"], rows, categorical=("x",))
    assert by_name(schema)["x"].kind is S.Kind.CATEGORICAL


def test_all_missing_numeric_column_is_an_error(tmp_path):
    with pytest.raises(InputError, match="'x' has no values.*--ignore_columns=x"):
        infer(tmp_path, ["x", "z", "y"], [["", 1, 0], ["NA", 2, 1]])


@pytest.mark.parametrize("choices, match", [
    (dict(label=""), "--label_column is required"),
    (dict(label="target"), "--label_column='target' is not a column"),
    (dict(label="y", numeric=("q",)), r"--numeric_columns names unknown column\(s\) \['q'\]"),
    (dict(label="y", categorical=("q",)), "--categorical_columns names unknown"),
    (dict(label="y", ignore=("q",)), "--ignore_columns names unknown"),
    (dict(label="y", ignore=("y",)), "--ignore_columns names the label column 'y'"),
    (dict(label="y", numeric=("a",), categorical=("a",)), r"\['a'\] are in both"),
])
def test_bad_column_choices(tmp_path, choices, match):
    path = write_csv(tmp_path, ["a", "b", "y"], [[1, "u", 0], [2, "v", 1]])
    table = data.read(path, flag="--train_data")
    label = choices.pop("label")
    with pytest.raises(InputError, match=match) as info:
        data.schema_from(table, S.ColumnChoices(label, **choices), source=path)
    if "unknown" in match or "not a column" in match:
        assert "a, b, y" in str(info.value)  # lists the columns the data has


def test_no_feature_columns_is_an_error(tmp_path):
    with pytest.raises(InputError, match="no feature columns besides the label 'y'"):
        infer(tmp_path, ["x", "y"], [[1, 0], [2, 1]], ignore=("x",))


# -- label and head ---------------------------------------------------------------------------
@pytest.mark.parametrize("labels, head, classes", [
    (["yes", "no", "yes"], HeadType.BINARY, ("no", "yes")),
    (["<=50K", ">50K", "<=50K"], HeadType.BINARY, ("<=50K", ">50K")),
    (["red", "green", "blue", "red"], HeadType.MULTICLASS, ("blue", "green", "red")),
    (["0", "1", "1"], HeadType.BINARY, ("0", "1")),
    (["1", "1.0", "0", "0.0"], HeadType.BINARY, ("0", "1")),
    (["-1", "1"], HeadType.BINARY, ("-1", "1")),
    (["0", "1", "2"], HeadType.MULTICLASS, ("0", "1", "2")),
    ([str(i) for i in range(10)], HeadType.MULTICLASS, tuple(str(i) for i in range(10))),
    (["2.0", "0", "1", "2"], HeadType.MULTICLASS, ("0", "1", "2")),
])
def test_classification_head_inference(tmp_path, labels, head, classes):
    schema = infer(tmp_path, ["x", "y"], [[i, v] for i, v in enumerate(labels)])
    assert schema.label.head is head
    assert schema.label.classes == classes
    assert schema.label.logits_dimension == (1 if head is HeadType.BINARY else len(classes))


@pytest.mark.parametrize("labels", [
    [str(i) for i in range(11)],  # more than 10 distinct integers
    ["0.5", "1.5"],  # two values, not integers
    ["1.25", "2", "3.5"],
])
def test_regression_head_inference(tmp_path, labels):
    schema = infer(tmp_path, ["x", "y"], [[i, v] for i, v in enumerate(labels)])
    numbers = np.array(labels, dtype=float)
    assert schema.label.head is HeadType.REGRESSION
    assert schema.label.classes == ()
    assert schema.label.mean == pytest.approx(numbers.mean())
    assert schema.label.std == pytest.approx(numbers.std())
    assert schema.label.logits_dimension == 1


@pytest.mark.parametrize("labels, head, expected_head, classes", [
    (["0", "1", "2"], HeadType.REGRESSION, HeadType.REGRESSION, ()),
    (["a", "b"], HeadType.MULTICLASS, HeadType.MULTICLASS, ("a", "b")),
    (["0.5", "1.5", "0.5"], HeadType.BINARY, HeadType.BINARY, ("0.5", "1.5")),
])
def test_head_override(tmp_path, labels, head, expected_head, classes):
    schema = infer(tmp_path, ["x", "y"], [[i, v] for i, v in enumerate(labels)], head=head)
    assert schema.label.head is expected_head
    assert schema.label.classes == classes


def test_binary_override_with_three_classes_is_an_error(tmp_path):
    with pytest.raises(InputError, match="--head=binary needs exactly 2.*--head=multiclass"):
        infer(tmp_path, ["x", "y"], [[1, "a"], [2, "b"], [3, "c"]], head=HeadType.BINARY)


def test_regression_override_on_text_labels_names_the_row(tmp_path):
    with pytest.raises(InputError, match="'b' at .*train.csv line 3"):
        infer(tmp_path, ["x", "y"], [[1, "1"], [2, "b"]], head=HeadType.REGRESSION)


def test_single_class_is_an_error(tmp_path):
    with pytest.raises(InputError, match="1 distinct value"):
        infer(tmp_path, ["x", "y"], [[1, "a"], [2, "a"]])


@pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-inf", "NA"])
def test_non_finite_numeric_labels_are_errors(tmp_path, bad):
    with pytest.raises(InputError) as info:
        infer(tmp_path, ["x", "y"], [[1, "0"], [2, "1"], [3, bad], [4, "0"]])
    assert "train.csv line 4" in str(info.value)
    assert "'y'" in str(info.value)


@pytest.mark.parametrize("labels", [["0", "1", ""], ["a", "", "b"], ["1.5", "?", "2.5"]])
def test_empty_labels_are_errors(tmp_path, labels):
    with pytest.raises(InputError, match="label column 'y' is empty at .*train.csv line"):
        infer(tmp_path, ["x", "y"], [[i, v] for i, v in enumerate(labels)])


def test_label_whitespace_does_not_change_the_head(tmp_path):
    schema = infer(tmp_path, ["x", "y"], [[1, "yes "], [2, "no"], [3, "yes"]])
    assert schema.label.classes == ("no", "yes")
    assert schema.label.head is HeadType.BINARY


# -- statistics -------------------------------------------------------------------------------
def test_quantile_edges():
    numbers = np.arange(1.0, 101.0)
    column = S._numeric("x", numbers, num_bins=4)
    np.testing.assert_allclose(column.edges, np.quantile(numbers, [0, 0.25, 0.5, 0.75, 1]))
    assert column.edges[0] == 1.0 and column.edges[-1] == 100.0
    assert column.num_bins == 4
    assert column.width == 1 + 4


def test_quantile_edges_ignore_missing():
    numbers = np.array([3.0, np.nan, 1.0, 2.0, np.inf, 4.0, 5.0])
    column = S._numeric("x", numbers, num_bins=2)
    assert column.edges == (1.0, 3.0, 5.0)


def test_quantile_edges_bin_the_rest_of_a_dominated_column():
    # 92% zeros: the quantiles of all values are 0,0,0,0,8; the non-zero values are binned
    # by their own quantiles.
    values = np.array([0.0] * 92 + [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    edges = S.quantile_edges(values, 4)
    expected = np.unique(np.concatenate([[0.0, 8.0],
                                         np.quantile(np.arange(1.0, 9.0), np.linspace(0, 1, 5))]))
    np.testing.assert_allclose(edges, expected)
    assert list(edges) == sorted(set(edges))


@pytest.mark.parametrize("values, num_bins, edges", [
    ([1.0, 2.0, 3.0], 0, ()),
    ([1.0, 2.0, 3.0], 1, (1.0, 3.0)),
    ([4.0, 4.0, 4.0], 3, ()),  # constant: no bins
    ([1.0, 1.0, 1.0, 7.0], 2, (1.0, 7.0)),
])
def test_quantile_edges_small_cases(values, num_bins, edges):
    assert S.quantile_edges(np.array(values), num_bins) == edges


@pytest.mark.parametrize("edges, num_bins, width", [((), 0, 1), ((0.0, 1.0), 1, 2),
                                                    ((0.0, 1.0, 5.0), 2, 3)])
def test_numeric_width(edges, num_bins, width):
    column = S.NumericColumn("x", 0.0, 1.0, edges)
    assert column.num_bins == num_bins
    assert column.width == width


def test_constant_column_has_unit_std():
    column = S._numeric("x", np.array([4.0, 4.0, 4.0]), num_bins=2)
    assert column.mean == 4.0
    assert column.std == 1.0
    assert column.width == 1


def test_num_bins_from_choices(tmp_path):
    schema = infer(tmp_path, ["x", "y"], [[i, i % 2] for i in range(20)], num_bins=5)
    column = by_name(schema)["x"]
    np.testing.assert_allclose(column.edges, np.quantile(np.arange(20.0), np.linspace(0, 1, 6)))


def test_vocabulary_ordered_by_frequency_then_name():
    values = np.array(["b", "c", "a", "c", "b", "c", "d", " a"])
    column = S._categorical("x", values, max_size=1000)
    # c:3, a:2 (after stripping), b:2, d:1
    assert column.vocabulary == ("c", "a", "b", "d")
    assert column.width == 5


def test_vocabulary_cap_keeps_the_most_frequent():
    values = np.array(["rare", "top", "top", "top", "mid", "mid"])
    assert S._categorical("x", values, max_size=2).vocabulary == ("top", "mid")


def test_max_vocabulary_size_from_choices(tmp_path):
    rows = [[c, 0] for c in "aaabbc"] + [["d", 1]]
    schema = infer(tmp_path, ["x", "y"], rows, max_vocabulary_size=2)
    assert by_name(schema)["x"].vocabulary == ("a", "b")


def test_input_dim_sums_widths():
    schema = S.Schema(
        (S.NumericColumn("n", 0.0, 1.0, (1.0, 2.0, 4.0)), S.NumericColumn("m", 0.0, 1.0),
         S.CategoricalColumn("c", ("a", "b", "c"))),
        S.Label("y", HeadType.BINARY, ("0", "1")))
    assert schema.input_dim == (1 + 2) + 1 + (3 + 1)


# -- JSON -------------------------------------------------------------------------------------
@pytest.mark.parametrize("label", [
    S.Label("y", HeadType.BINARY, ("no", "yes")),
    S.Label("y", HeadType.MULTICLASS, ("0", "1", "2")),
    S.Label("y", HeadType.REGRESSION, mean=3.25, std=0.1 + 0.2),
])
def test_schema_json_round_trip(label):
    schema = S.Schema(
        (S.NumericColumn("age", 38.58164675532078, 13.640223092304275, (0.1, 28.0, 37.0)),
         S.CategoricalColumn("city", ("paris", "", "NA")),
         S.NumericColumn("flat", 1.0, 1.0)),
        label)
    text = schema.to_json()
    json.loads(text)
    again = S.Schema.from_json(text)
    assert again == schema
    assert isinstance(again.columns[0].edges, tuple)
    assert again.label.head is label.head
    assert again.to_json() == text


def test_inferred_schema_round_trips(tmp_path):
    schema = infer(tmp_path, ["age", "city", "y"],
                   [[30, "paris", "a"], [41.5, "rome", "b"], ["", "paris", "c"]])
    assert S.Schema.from_json(schema.to_json()) == schema


def test_json_names_kinds():
    schema = S.Schema((S.NumericColumn("n", 0.0, 1.0), S.CategoricalColumn("c", ("a",))),
                      S.Label("y", HeadType.BINARY, ("0", "1")))
    data_ = json.loads(schema.to_json())
    assert [c["kind"] for c in data_["columns"]] == ["numeric", "categorical"]
    assert data_["label"]["head"] == "binary"
