"""Reading CSV and TFRecord input, and every bad input failing with a clear InputError."""

import gzip

import numpy as np
import pytest
import tensorflow as tf

from trainer import data
from trainer import schema as S
from trainer.errors import InputError

FLAG = "--train_data"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def write_tfrecord(path, records, options=None):
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for record in records:
            feature = {}
            for key, value in record.items():
                if isinstance(value, bytes):
                    feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
                elif isinstance(value, int):
                    feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
                elif isinstance(value, list):
                    feature[key] = tf.train.Feature(
                        float_list=tf.train.FloatList(value=value))
                else:
                    feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())
    return str(path)


def columns(table):
    return {k: v.tolist() for k, v in table.columns.items()}


# -- reading ----------------------------------------------------------------------------------
def test_read_csv(tmp_path):
    path = write(tmp_path, "a.csv", "x, city ,y\n1, paris,0\n2.5,rome,1\n")
    table = data.read(path, flag=FLAG)
    assert columns(table) == {"x": ["1", "2.5"], "city": ["paris", "rome"], "y": ["0", "1"]}
    assert table.num_rows == 2
    assert table.where(1) == f"{path} line 3"


def test_read_csv_skips_blank_lines_and_keeps_true_line_numbers(tmp_path):
    path = write(tmp_path, "a.csv", "x,y\r\n1,0\r\n\r\n   \r\n2,1\r\n")
    table = data.read(path, flag=FLAG)
    assert columns(table) == {"x": ["1", "2"], "y": ["0", "1"]}
    assert table.where(1) == f"{path} line 5"


def test_read_csv_quoted_commas(tmp_path):
    path = write(tmp_path, "a.csv", 'name,y\n"Smith, J",1\n')
    assert columns(data.read(path, flag=FLAG))["name"] == ["Smith, J"]


def test_read_gzip_csv(tmp_path):
    path = tmp_path / "a.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("x,y\n1,0\n2,1\n")
    assert columns(data.read(str(path), flag=FLAG)) == {"x": ["1", "2"], "y": ["0", "1"]}


def test_read_glob_in_sorted_order_with_per_file_lines(tmp_path):
    b = write(tmp_path, "part-b.csv", "x,y\n3,1\n4,0\n")
    a = write(tmp_path, "part-a.csv", "x,y\n1,0\n2,1\n")
    write(tmp_path, "other.txt", "not data")
    table = data.read(str(tmp_path / "part-*.csv"), flag=FLAG)
    assert columns(table)["x"] == ["1", "2", "3", "4"]
    assert table.where(0) == f"{a} line 2"
    assert table.where(3) == f"{b} line 3"


def test_read_comma_list(tmp_path):
    a = write(tmp_path, "a.csv", "x,y\n1,0\n")
    b = write(tmp_path, "b.csv", "x,y\n2,1\n3,0\n")
    table = data.read(f"{b}, {a}", flag=FLAG)
    assert columns(table)["x"] == ["2", "3", "1"]
    assert table.where(2) == f"{a} line 2"


def test_header_only_file_among_others_keeps_locations_right(tmp_path):
    a = write(tmp_path, "a.csv", "x,y\n")
    b = write(tmp_path, "b.csv", "x,y\n7,1\n")
    table = data.read(f"{a},{b}", flag=FLAG)
    assert columns(table)["x"] == ["7"]
    assert table.where(0) == f"{b} line 2"


def test_read_tfrecord(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [
        {"age": 1.5, "city": b"paris", "y": 1},
        {"age": 2.0, "city": b"rome", "y": 0},
        {"city": b"oslo", "y": 1},  # age missing
    ])
    table = data.read(path, flag=FLAG)
    assert list(table.columns) == ["age", "city", "y"]
    assert columns(table) == {"age": ["1.5", "2.0", ""], "city": ["paris", "rome", "oslo"],
                              "y": ["1", "0", "1"]}
    assert table.where(2) == f"{path} record 3"


def test_read_gzip_tfrecord(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord.gz", [{"x": 3, "y": b"a"}],
                          tf.io.TFRecordOptions(compression_type="GZIP"))
    assert columns(data.read(path, flag=FLAG)) == {"x": ["3"], "y": ["a"]}


def test_tfrecord_schema_inference(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord",
                          [{"x": float(i), "c": b"ab"[i % 2:i % 2 + 1], "y": i % 2}
                           for i in range(6)])
    schema = data.schema_from(data.read(path, flag=FLAG), S.ColumnChoices("y"), source=path)
    assert schema.label.head is S.HeadType.BINARY
    assert [c.kind for c in schema.columns] == [S.Kind.CATEGORICAL, S.Kind.NUMERIC]


# -- bad input --------------------------------------------------------------------------------
def read_error(pattern):
    with pytest.raises(InputError) as info:
        data.read(pattern, flag=FLAG)
    message = str(info.value)
    assert message.startswith(FLAG)
    return message


def test_empty_file(tmp_path):
    path = write(tmp_path, "a.csv", "")
    assert f"{path} is empty" in read_error(path)


def test_header_only(tmp_path):
    path = write(tmp_path, "a.csv", "x,y\n")
    assert f"{path} holds no data rows" in read_error(path)


def test_file_not_found(tmp_path):
    path = str(tmp_path / "missing.csv")
    assert f"'{path}' matches no file" in read_error(path)


def test_directory_not_found(tmp_path):
    path = str(tmp_path / "no_such_dir" / "train.csv")
    assert "matches no file" in read_error(path)


def test_gzip_name_on_plain_text(tmp_path):
    path = write(tmp_path, "a.csv.gz", "x,y\n1,0\n")
    message = read_error(path)
    assert "cannot read" in message and path in message


def test_glob_matching_nothing(tmp_path):
    write(tmp_path, "a.csv", "x,y\n1,0\n")
    pattern = str(tmp_path / "*.tsv")
    assert f"'{pattern}' matches no file" in read_error(f"{tmp_path / 'a.csv'},{pattern}")


@pytest.mark.parametrize("pattern", ["", " , "])
def test_no_files_given(pattern):
    assert "is empty" in read_error(pattern)


def test_directory_is_not_a_file(tmp_path):
    (tmp_path / "dir.csv").mkdir()
    assert "matches no file" in read_error(str(tmp_path / "dir.csv"))


def test_wrong_field_count(tmp_path):
    path = write(tmp_path, "a.csv", "x,y\n1,0\n2,1,5\n")
    message = read_error(path)
    assert f"{path} line 3 has 3 fields, the header has 2" in message


@pytest.mark.parametrize("header", ["x,x,y", "x,,y"])
def test_bad_header(tmp_path, header):
    path = write(tmp_path, "a.csv", header + "\n1,2,3\n")
    assert "empty or repeated column names" in read_error(path)


def test_mismatched_headers(tmp_path):
    a = write(tmp_path, "a.csv", "x,y\n1,0\n")
    b = write(tmp_path, "b.csv", "x,z\n1,0\n")
    message = read_error(f"{a},{b}")
    assert b in message and a in message
    assert "['x', 'z']" in message and "['x', 'y']" in message


def test_mixing_csv_and_tfrecord(tmp_path):
    a = write(tmp_path, "a.csv", "x,y\n1,0\n")
    b = write_tfrecord(tmp_path / "b.tfrecord", [{"x": 1, "y": 0}])
    assert "mixes TFRecord and CSV" in read_error(f"{a},{b}")


def test_binary_file_named_csv(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes(b"\xff\xfe\x00\x81\x00garbage")
    assert "cannot read" in read_error(str(path))


def test_corrupt_tfrecord(tmp_path):
    path = write(tmp_path, "a.tfrecord", "x,y\n" + "1,0\n" * 20)
    assert "cannot read" in read_error(path)


def test_truncated_tfrecord(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [{"y": i} for i in range(3)])
    with open(path, "rb") as f:
        content = f.read()
    with open(path, "wb") as f:
        f.write(content[:-5])
    assert "cannot read" in read_error(path)


def test_tfrecord_feature_with_several_values(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [{"x": [1.0, 2.0], "y": 1}])
    assert "holds 2 values" in str(pytest.raises(InputError, data.read, path, flag=FLAG).value)


# -- typed examples and labels ----------------------------------------------------------------
TRAIN = "x,c,y\n1,a,0\n3,b,1\n,a,1.0\n"


def train_schema(tmp_path, text=TRAIN, **choices):
    path = write(tmp_path, "train.csv", text)
    return data.schema_from(data.read(path, flag=FLAG), S.ColumnChoices("y", **choices),
                            source=path)


def eval_examples(tmp_path, schema, text):
    path = write(tmp_path, "eval.csv", text)
    return data.examples_from(data.read(path, flag="--eval_data"), schema, flag="--eval_data")


def test_examples_are_typed(tmp_path):
    schema = train_schema(tmp_path)
    examples = eval_examples(tmp_path, schema, "y,c,x\n1.0, b ,2\n0,z,\n")
    np.testing.assert_array_equal(examples.features["x"], np.array([2.0, np.nan], np.float32))
    assert examples.features["x"].dtype == np.float32
    assert examples.features["c"].tolist() == ["b", "z"]
    assert examples.labels.tolist() == [1, 0]
    assert examples.labels.dtype == np.int64
    assert len(examples) == 2


def test_regression_labels_are_float32(tmp_path):
    schema = train_schema(tmp_path, "x,y\n1,0.5\n2,1.5\n3,2.25\n")
    examples = eval_examples(tmp_path, schema, "x,y\n1,7.5\n")
    assert examples.labels.dtype == np.float32
    assert examples.labels.tolist() == [7.5]


def test_unknown_eval_label(tmp_path):
    schema = train_schema(tmp_path)
    with pytest.raises(InputError) as info:
        eval_examples(tmp_path, schema, "x,c,y\n1,a,0\n1,a,2\n")
    message = str(info.value)
    assert message.startswith("--eval_data")
    assert "'2'" in message and "eval.csv line 3" in message and "['0', '1']" in message


@pytest.mark.parametrize("bad", ["", "?"])
def test_empty_eval_label(tmp_path, bad):
    schema = train_schema(tmp_path)
    with pytest.raises(InputError, match="--eval_data: label column 'y' is empty at .*line 3"):
        eval_examples(tmp_path, schema, f"x,c,y\n1,a,0\n1,a,{bad}\n")


@pytest.mark.parametrize("bad", ["nan", "inf", "abc"])
def test_bad_eval_regression_label(tmp_path, bad):
    schema = train_schema(tmp_path, "x,y\n1,0.5\n2,1.5\n3,2.25\n")
    with pytest.raises(InputError, match=f"--eval_data: .*'{bad}' at .*eval.csv line 2"):
        eval_examples(tmp_path, schema, f"x,y\n1,{bad}\n")


def test_non_numeric_value_in_numeric_eval_column(tmp_path):
    schema = train_schema(tmp_path)
    with pytest.raises(InputError) as info:
        eval_examples(tmp_path, schema, "x,c,y\n1,a,0\n2,a,1\nseven,b,0\n")
    message = str(info.value)
    assert "'x'" in message and "'seven'" in message
    assert "eval.csv line 4" in message


def test_non_numeric_value_in_numeric_train_column_names_file_and_line(tmp_path):
    with pytest.raises(InputError) as info:
        train_schema(tmp_path, "x,c,y\n1,a,0\n2,b,1\n3.5.1,a,0\n", numeric=("x",))
    assert "train.csv line 4" in str(info.value) and "'3.5.1'" in str(info.value)


@pytest.mark.parametrize("text, missing", [("x,y\n1,0\n", "['c']"), ("x,c\n1,a\n", "['y']")])
def test_eval_missing_a_column(tmp_path, text, missing):
    schema = train_schema(tmp_path)
    with pytest.raises(InputError) as info:
        eval_examples(tmp_path, schema, text)
    assert str(info.value).startswith(f"--eval_data: column(s) {missing} are missing")


def test_eval_label_canonical_numbers(tmp_path):
    schema = train_schema(tmp_path, "x,y\n1,0\n2,1\n3,1\n")
    examples = eval_examples(tmp_path, schema, "x,y\n1,1.0\n2,0.0\n3,1\n")
    assert examples.labels.tolist() == [1, 0, 1]


def test_split_holdout_is_a_seeded_partition(tmp_path):
    examples = data.Examples({"x": np.arange(20.0)}, np.arange(20))
    train, held = data.split_holdout(examples, 0.25, seed=3)
    assert len(held) == 5 and len(train) == 15
    assert sorted(train.labels.tolist() + held.labels.tolist()) == list(range(20))
    np.testing.assert_array_equal(train.features["x"], train.labels.astype(float))
    again = data.split_holdout(examples, 0.25, seed=3)[1]
    np.testing.assert_array_equal(again.labels, held.labels)
    other = data.split_holdout(examples, 0.25, seed=4)[1]
    assert other.labels.tolist() != held.labels.tolist()


def test_csv_with_utf8_byte_order_mark(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes("y,x\n1,2\n0,3\n".encode("utf-8-sig"))
    assert list(data.read(str(path), flag=FLAG).columns) == ["y", "x"]
