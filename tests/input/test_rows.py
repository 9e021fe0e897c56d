"""Reading files as blocks of rows that know their file and line, and parsing a block whole:
both readers agree, every line is accounted for, and each value is typed by its column's
role."""

import gzip

import numpy as np
import pytest
import tensorflow as tf

from tests.input.support import write, write_tfrecord
from trainer.input import blocks, files, rows
from trainer.input.rows import Columns


def read_all(source, *, in_process=True):
    """[(file index, line, text)] of every row, in order."""
    dataset = source.blocks(
        source.indexed_files(), parallel=1, deterministic=True, in_process=in_process
    )
    out = []
    for file, line, text in dataset:
        out += list(
            zip(file.numpy().tolist(), line.numpy().tolist(), [t.decode() for t in text.numpy()])
        )
    return out


@pytest.mark.parametrize("in_process", [True, False])
def test_rows_know_their_file_and_line(tmp_path, in_process):
    a = write(tmp_path, "a.csv", "x,y\r\n1,0\r\n\r\n2,1\r\n")
    b = tmp_path / "b.csv.gz"
    with gzip.open(b, "wt") as f:
        f.write("x,y\n3,1\n4,0")  # no final line end
    source = files.open_source(f"{a},{b}", flag="--train_data")
    assert read_all(source, in_process=in_process) == [
        (0, 2, "1,0"),
        (0, 3, ""),
        (0, 4, "2,1"),
        (1, 2, "3,1"),
        (1, 3, "4,0"),
    ]


def test_the_chunked_reader_matches_textlinedataset_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(blocks, "CHUNK_BYTES", 64)  # many chunks, lines cut anywhere
    lines = [f"{i},{'x' * (i % 17)},{i % 3}" for i in range(500)]
    path = tmp_path / "a.csv.gz"
    with gzip.open(path, "wb") as f:  # two gzip members, as `cat a.gz b.gz` makes
        f.write(("x,c,y\n" + "\n".join(lines[:200]) + "\n").encode())
    with gzip.open(tmp_path / "b.gz", "wb") as f:
        f.write(("\n".join(lines[200:]) + "\r\n").encode())
    path.write_bytes(path.read_bytes() + (tmp_path / "b.gz").read_bytes())
    source = files.open_source(str(path), flag="--train_data")
    chunked = read_all(source)
    assert chunked == read_all(source, in_process=False)
    assert [text for _, _, text in chunked] == lines
    assert [line for _, line, _ in chunked] == list(range(2, 502))


def test_tfrecord_rows_are_numbered_records(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [{"y": i} for i in range(3)])
    source = files.open_source(path, flag="--train_data")
    assert [(f, n) for f, n, _ in read_all(source)] == [(0, 1), (0, 2), (0, 3)]


def parse(tmp_path, text, columns, name="a.csv"):
    source = files.open_source(write(tmp_path, name, text), flag="--train_data")
    file, line, body = next(
        iter(source.blocks(source.indexed_files(), parallel=1, deterministic=True))
    )
    return rows.RowParser(source, columns).parse(file, line, body)


@pytest.fixture(params=["row regex", "field by field"])
def row_checks(request, monkeypatch):
    """Lines checked by one regular expression per row, as narrow tables are, or split and
    checked field by field, as tables wider than `_ROW_REGEX_FIELDS` are."""
    if request.param == "field by field":
        monkeypatch.setattr(rows, "_ROW_REGEX_FIELDS", 0)
    return request.param


def test_numbers_missing_values_and_text(tmp_path, row_checks):
    text = (
        "n,c,y\n"
        "1.5, paris ,yes\n"  # plain numbers: the fast path
        "?,rome,no\n"  # a missing token: parsed as text
        ' 2e3 ,"Smith, J",yes\n'
        "abc,oslo,no\n"  # not a number
        "inf,x,yes\n"  # not finite: missing
        ',"say ""hi""",no\n'
    )
    parsed = parse(tmp_path, text, Columns(("n",), ("c",), "y"))
    np.testing.assert_array_equal(
        parsed.numeric["n"].numpy(),
        np.array([1.5, np.nan, 2000, np.nan, np.nan, np.nan], np.float32),
    )
    assert parsed.not_a_number["n"].numpy().tolist() == [False, False, False, True, False, False]
    assert [c.decode() for c in parsed.categorical["c"].numpy()] == [
        "paris",
        "rome",
        "Smith, J",
        "oslo",
        "x",
        'say "hi"',
    ]
    assert not parsed.malformed.numpy().any()
    reasons = rows.feature_reasons(parsed).numpy()
    assert reasons.tolist() == [0, 0, 0, rows.NOT_A_NUMBER, 0, 0]


def test_malformed_and_blank_lines(tmp_path, row_checks):
    parsed = parse(
        tmp_path,
        'x,y\n1,0\n2,1,5\n\n   \n3\n"open,1\n4,"bad"quote\n5,1\n',
        Columns(("x",), (), "y"),
    )
    assert parsed.line.numpy().tolist() == list(range(2, 10))
    assert parsed.blank.numpy().tolist() == [False, False, True, True, False, False, False, False]
    assert parsed.malformed.numpy().tolist() == [False, True, False, False, True, True, True, False]
    assert parsed.numeric["x"].numpy()[[0, 7]].tolist() == [1.0, 5.0]


def test_both_row_checks_agree_on_every_kind_of_field(monkeypatch):
    """The field-by-field check of wide rows takes and refuses exactly the lines the row
    regular expression does."""
    kinds = ["1.5", " 2e3 ", "", "NA", "abc", '"q"', '"a,b"', '"say ""hi"""', 'x"y', '"open',
             '"a"b', "-.5", "1e", '""', '"', "+7 "]  # fmt: skip
    generator = np.random.default_rng(0)
    width, numeric_at = 5, {0, 2, 3}
    lines = [",".join(generator.choice(kinds, width)) for _ in range(3000)]
    lines += [",".join(generator.choice(kinds, width + d)) for d in (-1, 1) for _ in range(50)]
    text = tf.constant(lines)

    def checks():
        plain = rows._plain_rows(text, width, numeric_at).numpy()
        return plain, rows._well_formed_rows(text, width).numpy()

    by_row = checks()
    monkeypatch.setattr(rows, "_ROW_REGEX_FIELDS", 0)
    by_field = checks()
    for row, field in zip(by_row, by_field):
        different = [line for line, a, b in zip(lines, row, field) if a != b]
        assert different == []
    assert 0.01 < np.mean(by_row[0]) < np.mean(by_row[1]) < 0.9


@pytest.mark.parametrize(
    "labels, texts, numbers",
    [
        (["1", "1.0", " 0 ", "2.50"], ["1", "1", "0", "2.50"], [1, 1, 0, 2.5]),
        (["yes", "", "?", "nan"], ["yes", "", "?", "nan"], [np.nan, np.nan, np.nan, np.nan]),
    ],
)
def test_labels_as_canonical_text_and_numbers(tmp_path, labels, texts, numbers):
    parsed = parse(
        tmp_path, "x,y\n" + "".join(f"1,{v}\n" for v in labels), Columns(("x",), (), "y")
    )
    assert [t.decode() for t in parsed.label_text.numpy()] == texts
    np.testing.assert_array_equal(parsed.label_value.numpy(), numbers)


def test_label_reasons(tmp_path):
    parsed = parse(
        tmp_path, "x,y\n1,a\n1,\n1,?\n1,inf\n1,2\n1,NA\n1, null\n1,NAN\n", Columns(("x",), (), "y")
    )
    assert rows.label_reasons(parsed, regression=False).numpy().tolist() == [
        0,
        rows.LABEL_MISSING,
        rows.LABEL_MISSING,
        rows.LABEL_NOT_FINITE,
        0,
        rows.LABEL_MISSING,
        rows.LABEL_MISSING,
        rows.LABEL_NOT_FINITE,  # not a token: a number, not finite
    ]
    assert rows.label_reasons(parsed, regression=True).numpy().tolist() == [
        rows.LABEL_NOT_A_NUMBER,
        rows.LABEL_MISSING,
        rows.LABEL_MISSING,
        rows.LABEL_NOT_FINITE,
        0,
        rows.LABEL_MISSING,
        rows.LABEL_MISSING,
        rows.LABEL_NOT_FINITE,
    ]


def test_tfrecord_parse(tmp_path):
    path = write_tfrecord(
        tmp_path / "a.tfrecord",
        [
            {"n": 1.5, "t": b"2.5", "c": 7, "y": b"a"},
            {"t": b"?", "c": 8, "y": b"b"},  # n missing
            {"n": [1.0, 2.0], "t": b"x", "c": 9, "y": b"a"},  # n has two values
        ],
    )
    source = files.open_source(path, flag="--train_data")
    file, line, text = next(
        iter(source.blocks(source.indexed_files(), parallel=1, deterministic=True))
    )
    parsed = rows.RowParser(source, Columns(("n", "t"), ("c",), "y")).parse(file, line, text)
    np.testing.assert_array_equal(parsed.numeric["n"].numpy()[:2], [1.5, np.nan])
    np.testing.assert_array_equal(parsed.numeric["t"].numpy(), [2.5, np.nan, np.nan])
    assert parsed.not_a_number["t"].numpy().tolist() == [False, False, False]  # malformed row
    assert [c.decode() for c in parsed.categorical["c"].numpy()] == ["7", "8", "9"]
    assert parsed.malformed.numpy().tolist() == [False, False, True]


def test_first_where_is_safe_on_empty_blocks():
    mask = tf.constant([False, True, True])
    assert [v.numpy() for v in rows.first_where(mask, tf.constant([5, 6, 7]))] == [6]
    assert [
        v.numpy() for v in rows.first_where(tf.zeros([0], tf.bool), tf.zeros([0], tf.int64))
    ] == [0]
