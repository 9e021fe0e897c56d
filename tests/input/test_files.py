"""Finding input files and checking formats and headers before any row is read."""

import bz2
import gzip

import pytest
import tensorflow as tf

from tests.input.support import write, write_tfrecord
from trainer.errors import InputError
from trainer.input import files
from trainer.input.formats.base import BYTES, FLOAT, INT64

FLAG = "--train_data"


def open_error(pattern):
    with pytest.raises(InputError) as info:
        files.open_source(pattern, flag=FLAG)
    message = str(info.value)
    assert message.startswith(FLAG)
    return message


def test_globs_and_lists_in_order(tmp_path):
    b = write(tmp_path, "part-b.csv", "x,y\n3,1\n")
    a = write(tmp_path, "part-a.csv", "x,y\n1,0\n")
    write(tmp_path, "other.txt", "not data")
    source = files.open_source(f"{tmp_path / 'part-*.csv'}, {b}", flag=FLAG)
    assert source.files == (a, b, b)
    assert (source.format.name, source.columns) == ("csv", ("x", "y"))


def test_header_of_gzip_and_byte_order_mark_and_spaces(tmp_path):
    path = tmp_path / "a.csv.gz"
    with gzip.open(path, "wb") as f:
        f.write("x, city ,y\r\n1,a,0\n".encode("utf-8-sig"))
    assert files.open_source(str(path), flag=FLAG).columns == ("x", "city", "y")


def test_tfrecord_feature_names_and_types(tmp_path):
    path = write_tfrecord(
        tmp_path / "a.tfrecord.gz",
        [{"age": 1.5, "city": b"paris", "y": 1}, {"city": b"oslo", "y": 0, "n": 3}],
        tf.io.TFRecordOptions(compression_type="GZIP"),
    )
    source = files.open_source(path, flag=FLAG)
    assert source.format.name == "tfrecord"
    assert source.columns == ("age", "city", "n", "y")
    assert source.feature_types == (FLOAT, BYTES, INT64, INT64)


def test_empty_file(tmp_path):
    path = write(tmp_path, "a.csv", "")
    assert f"{path} is empty" in open_error(path)


@pytest.mark.parametrize("name", ["missing.csv", "no_such_dir/train.csv", "*.tsv"])
def test_nothing_matches(tmp_path, name):
    assert "matches no file" in open_error(str(tmp_path / name))


@pytest.mark.parametrize("pattern", ["", " , "])
def test_no_files_given(pattern):
    assert "is empty" in open_error(pattern)


def test_directory_is_not_a_file(tmp_path):
    (tmp_path / "dir.csv").mkdir()
    assert "matches no file" in open_error(str(tmp_path / "dir.csv"))


def test_gzip_name_on_plain_text(tmp_path):
    path = write(tmp_path, "a.csv.gz", "x,y\n1,0\n")
    message = open_error(path)
    assert "cannot read" in message and path in message


@pytest.mark.parametrize("suffix", [".csv.bz2", ".csv.xz", ".csv.zst", ".zip", ".tgz"])
def test_other_compressions_are_named(tmp_path, suffix):
    path = write(tmp_path, f"a{suffix}", "x,y\n1,0\n")
    message = open_error(path)
    assert path in message and "compress it with gzip" in message


@pytest.mark.parametrize(
    "name, data, hint",
    [
        # (mtime=0: the same bytes, so the same test ids, in every pytest-xdist process)
        (
            "a.csv",
            gzip.compress(b"x,y\n1,0\n", mtime=0),
            "It starts like a gzip file: name it *.gz.",
        ),
        ("b.csv", bz2.compress(b"x,y\n1,0\n" * 50), "It starts like a bzip2 file"),
    ],
    ids=["gzip", "bzip2"],
)
def test_a_compressed_file_named_csv_says_what_it_is(tmp_path, name, data, hint):
    path = tmp_path / name
    path.write_bytes(data)
    message = open_error(str(path))
    assert "cannot read" in message and hint in message


def test_binary_file_named_csv(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes(b"\xff\xfe\x00\x81\x00garbage")
    assert "cannot read" in open_error(str(path))


@pytest.mark.parametrize("header", ["x,x,y", "x,,y"])
def test_bad_header(tmp_path, header):
    path = write(tmp_path, "a.csv", header + "\n1,2,3\n")
    assert "empty or repeated column names" in open_error(path)


def test_mismatched_headers(tmp_path):
    a = write(tmp_path, "a.csv", "x,y\n1,0\n")
    b = write(tmp_path, "b.csv", "x,z\n1,0\n")
    message = open_error(f"{a},{b}")
    assert b in message and a in message
    assert "['x', 'z']" in message and "['x', 'y']" in message


def test_mixing_csv_and_tfrecord(tmp_path):
    a = write(tmp_path, "a.csv", "x,y\n1,0\n")
    b = write_tfrecord(tmp_path / "b.tfrecord", [{"x": 1, "y": 0}])
    assert "mixes TFRecord and CSV" in open_error(f"{a},{b}")


def test_corrupt_tfrecord(tmp_path):
    path = write(tmp_path, "a.tfrecord", "x,y\n" + "1,0\n" * 20)
    assert "cannot read" in open_error(path)


def test_feature_with_two_types(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [{"x": 1, "y": 0}, {"x": 1.5, "y": 1}])
    assert "feature 'x' is a int64_list in some records and a float_list" in open_error(path)


def test_require_names_the_missing_columns(tmp_path):
    source = files.open_source(write(tmp_path, "a.csv", "x,y\n1,0\n"), flag="--eval_data")
    with pytest.raises(InputError, match=r"--eval_data: column\(s\) \['c'\] are missing"):
        source.require(["x", "c"], what="the training data has them")


def test_files_no_csv_reader_takes_are_named_in_one_short_line(tmp_path):
    """Issue 43: a CR-only file gave a 32,464-character line, a .tar.gz one of NUL bytes."""
    import io
    import tarfile

    mac = tmp_path / "mac.csv"
    mac.write_bytes(b"x,y\r" + b"1,0\r" * 5000)
    message = open_error(str(mac))
    assert "ends its lines with a carriage return alone" in message and len(message) < 400
    archive = tmp_path / "data.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        member = tarfile.TarInfo("train.csv")
        member.size = 8
        tar.addfile(member, io.BytesIO(b"x,y\n1,0\n"))
    message = open_error(str(archive))
    assert "is a tar archive (its first member: 'train.csv'); extract it" in message
    assert "\x00" not in message and len(message) < 400
    endless = tmp_path / "one-line.csv"
    endless.write_bytes(b"x," * (3 << 20))  # 6 MB without a line end
    assert "is longer than 4 MB: not a CSV header row" in open_error(str(endless))
    windows = write(tmp_path, "crlf.csv", "x,y\r\n1,0\r\n")  # CRLF is read
    assert files.open_source(windows, flag=FLAG).columns == ("x", "y")
