"""deploy.cloud.storage: a .gz file is read as the trainer reads it, local and gs://."""

from __future__ import annotations

import gzip

import pytest

from deploy.cloud import api, storage
from trainer.input import blocks

_TEXT = b"age,workclass\n25,Private\n38,Self-emp\n"
_MEMBER = gzip.compress(_TEXT)


@pytest.mark.parametrize(
    "data",
    [
        _MEMBER,
        _MEMBER + b"\0" * 512,  # zero padding after the member (tape and block writers)
        _MEMBER + b"\0" * 3 + _MEMBER,  # two members, padding between them
        b"\0" * 4 + _MEMBER,  # zero bytes before the first member
        b"\0" * 8,
        b"",
        _MEMBER[:-3],  # cut short in the trailer
        _MEMBER[:12],  # cut short in the first line
        _MEMBER + b"not gzip",
        _MEMBER + b"\x1f",  # a next member cut short in its header
    ],
    ids=[
        "whole",
        "padded",
        "padded-between",
        "padded-before",
        "only-zeros",
        "empty",
        "cut",
        "cut-early",
        "garbage-after",
        "cut-second",
    ],
)
def test_a_gz_file_is_taken_or_refused_as_the_trainer_takes_it(tmp_path, data):
    """`read_bytes` and the trainer's reader (`blocks.line_chunks`) agree on every .gz file:
    the same text, or both refuse it (zero bytes before the first member were refused by
    `gzip` here and read by the trainer)."""
    path = tmp_path / "in.csv.gz"
    path.write_bytes(data)
    try:
        text = b"\n".join(chunk for chunk, _ in blocks.line_chunks(str(path)))
    except blocks.TruncatedInput:
        with pytest.raises(api.DeployError, match=f"^{path} .*gzip stream.*interrupted"):
            storage.read_bytes(str(path))
    else:
        assert storage.read_bytes(str(path)).removesuffix(b"\n") == text


def test_a_padded_gz_object_is_read_whole_and_a_cut_one_refused(gcs):
    bucket = gcs.bucket("test-bucket")
    bucket.blob("in/padded.jsonl.gz").upload_from_string(_MEMBER + b"\0" * 512 + _MEMBER)
    bucket.blob("in/cut.jsonl.gz").upload_from_string(_MEMBER[:-3])
    assert storage.read_bytes("gs://test-bucket/in/padded.jsonl.gz") == _TEXT * 2
    with pytest.raises(
        api.DeployError, match="^gs://test-bucket/in/cut.jsonl.gz ends before its gzip stream"
    ):
        storage.read_bytes("gs://test-bucket/in/cut.jsonl.gz")
