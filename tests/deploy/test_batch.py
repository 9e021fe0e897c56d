"""deploy.batch: the local twin's output layout and error handling, gs:// in and out, and the
Vertex BatchPredictionJob the SDK creates."""

from __future__ import annotations

import csv
import fnmatch
import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from deploy import batch
from deploy.batch_prediction import convert as batch_convert
from deploy.batch_prediction import local as batch_local
from deploy.batch_prediction import output
from deploy.batch_prediction import vertex as batch_vertex
from deploy.cloud import api
from deploy.serving.instances import NUMBER
from tests.support import REPO, task_env


def _assert_same_predictions(got: list[dict], expected: list[dict]) -> None:
    """Equal classes; probabilities equal up to float32 rounding (batch sizes differ)."""
    assert [g["classes"] for g in got] == [e["classes"] for e in expected]
    np.testing.assert_allclose(
        [g["probabilities"] for g in got],
        [e["probabilities"] for e in expected],
        rtol=1e-5,
        atol=1e-7,
    )


def _write_jsonl(path, rows, bad_lines=()):
    lines = [json.dumps(r) for r in rows]
    for index, text in bad_lines:
        lines.insert(index, text)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_jsonl_bad_lines_are_reported_and_the_rest_predicted(tmp_path, predictor, census_rows):
    rows = census_rows[:20]
    wrong_type = dict(rows[0], age="forty")
    source = _write_jsonl(
        tmp_path / "in.jsonl", rows, bad_lines=[(3, "{not json"), (7, json.dumps(wrong_type))]
    )
    result = batch_local.predict_local(
        model_dir="",
        sources=[source],
        predictor=predictor,
        output_prefix=str(tmp_path / "out"),
        batch_size=8,
        num_shards=3,
        model_name="census",
    )
    assert os.path.basename(result.output_dir).startswith("prediction-census-")
    names = sorted(os.listdir(result.output_dir))
    assert names == [
        "prediction.errors_stats-00000-of-00001",
        *[f"prediction.results-0000{i}-of-00003" for i in range(3)],
    ]
    results, errors = output.read_results(result.output_dir)
    assert [r["instance"] for r in results] == rows  # in input order, none lost
    _assert_same_predictions([r["prediction"] for r in results], predictor.predict(rows))
    assert [e["error"]["message"] for e in errors] == [
        f"{source}:4: the line is not JSON (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)).",
        f"{source}:8: field 'age' must be a number or null, got 'forty'.",
    ]
    assert errors[0]["instance"] == "{not json" and errors[1]["instance"] == wrong_type
    assert (result.num_predictions, result.num_errors) == (20, 2)


def test_jsonl_lines_that_break_a_json_parser_are_errors_and_the_rest_predicted(
    tmp_path, predictor, census_rows
):
    """Lines Python's json module fails on (nesting past its recursion limit, an integer of
    over 4,300 digits), takes though they are not JSON (NaN), or parses into what no tensor
    holds (a lone surrogate) are error records like any bad line (each aborted the run with
    a traceback and nothing written)."""
    rows = census_rows[:12]
    deep = [  # parsed, or not, depending on the stack; written back or given as text
        json.dumps(dict(rows[0], age="AGE")).replace('"AGE"', "[" * n + "]" * n)
        for n in range(940, 1000, 5)
    ]
    bad = [
        ("[" * 100_000, "the line nests arrays or objects too deeply to parse"),
        ('{"age": 1' + "0" * 5000 + "}", "the line holds an integer of 5001 digits"),
        (json.dumps(dict(rows[0], sex="\ud800")), "field 'sex' is '\\ud800', which holds a lone"),
        (json.dumps(dict(rows[0], age=float("inf"))), "the line holds Infinity, which is not JSON"),
        ('{"age": -1e400}', "the line holds the number -1e400, beyond a 64-bit float"),
    ]
    lines = [text for text, _ in bad] + deep
    source = _write_jsonl(
        tmp_path / "in.jsonl", rows, bad_lines=[(2 * i + 1, text) for i, text in enumerate(lines)]
    )
    result = batch_local.predict_local(
        model_dir="",
        sources=[source],
        predictor=predictor,
        output_prefix=str(tmp_path / "out"),
        batch_size=4,
    )
    results, errors = output.read_results(result.output_dir)
    assert [r["instance"] for r in results] == rows
    assert (result.num_predictions, result.num_errors) == (len(rows), len(lines))
    messages = [e["error"]["message"] for e in errors]
    for (line, (_, reason)), message in zip(enumerate(bad), messages):
        assert message.startswith(f"{source}:{2 * line + 2}: {reason}"), message
    assert all(f"{source}:" in m for m in messages[len(bad) :])


def test_csv_with_an_excluded_label_and_bad_rows(tmp_path, predictor, census_rows):
    header = [*census_rows[0], "income_bracket"]
    path = tmp_path / "in.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for row in census_rows[:10]:
            writer.writerow([*row.values(), "<=50K"])
        writer.writerow(["1", "2"])  # line 12: too few fields
        writer.writerow(["x", *list(census_rows[0].values())[1:], "<=50K"])  # line 13
    result = batch_local.predict_local(
        model_dir="",
        sources=[str(path)],
        predictor=predictor,
        output_prefix=str(tmp_path / "out"),
        instances_format="csv",
        excluded_fields=["income_bracket"],
    )
    results, errors = output.read_results(result.output_dir)
    assert [r["instance"] for r in results] == census_rows[:10]
    assert [e["error"]["message"].split(": ", 1) for e in errors] == [
        [f"{path}:12", "2 fields, the header has 15 (quote values that contain commas)"],
        [f"{path}:13", "field 'age' must be a number or empty, got 'x'."],
    ]


def test_csv_files_with_other_column_orders_describe_bad_rows_with_their_own_header(
    tmp_path, predictor, census_rows
):
    """Files whose headers order the columns differently are read in groups, one per header;
    a bad row is described with its own file's header (it was the last file's, so a bad row
    of the first file was shown with its values under other columns' names)."""
    header = list(census_rows[0])
    bad = {**census_rows[0], "age": "x"}
    files = {  # line 2 of a.csv is bad
        "a.csv": (header, [bad, *census_rows[1:3]]),
        "b.csv": (header[::-1], census_rows[3:6]),
    }
    paths = []
    for name, (columns, rows) in files.items():
        with open(tmp_path / name, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(columns)
            writer.writerows([[row[c] for c in columns] for row in rows])
        paths.append(str(tmp_path / name))
    result = batch_local.predict_local(
        model_dir="",
        sources=paths,
        predictor=predictor,
        output_prefix=str(tmp_path / "out"),
        instances_format="csv",
    )
    results, errors = output.read_results(result.output_dir)
    assert [r["instance"] for r in results] == census_rows[1:6]
    (error,) = errors
    assert (
        error["error"]["message"]
        == f"{paths[0]}:2: field 'age' must be a number or empty, got 'x'."
    )
    assert error["instance"] == {k: str(v) for k, v in bad.items()}


def test_gcs_in_and_out_through_the_emulator(gcs, tmp_path, predictor, census_rows):
    bucket = gcs.bucket("test-bucket")
    for part in range(2):
        bucket.blob(f"in/part-{part}.jsonl").upload_from_string(
            "".join(json.dumps(r) + "\n" for r in census_rows[part * 5 : part * 5 + 5])
        )
    bucket.blob("in/other.txt").upload_from_string("not an input")
    result = batch_local.predict_local(
        model_dir="",
        sources=["gs://test-bucket/in/*.jsonl"],
        output_prefix="gs://test-bucket/out",
        predictor=predictor,
    )
    assert result.output_dir.startswith("gs://test-bucket/out/prediction-model-")
    results, errors = output.read_results(result.output_dir)
    assert [r["instance"] for r in results] == census_rows[:10] and errors == []


def test_nothing_is_written_for_bad_arguments(tmp_path, predictor):
    with pytest.raises(api.DeployError, match="--instances_format \\('parquet'\\)"):
        batch_local.predict_local(
            model_dir="",
            sources=["x"],
            output_prefix=str(tmp_path / "o"),
            instances_format="parquet",
            predictor=predictor,
        )
    with pytest.raises(FileNotFoundError, match="matches no file"):
        batch_local.predict_local(
            model_dir="",
            sources=[str(tmp_path / "none-*.jsonl")],
            output_prefix=str(tmp_path / "o"),
            predictor=predictor,
        )
    source = tmp_path / "in.jsonl"
    source.write_text("{}\n")
    for name in ("x/../../../escaped", "..", "a/b", ""):  # was written outside the prefix
        with pytest.raises(api.DeployError, match="--model_name .* letters, digits"):
            batch_local.predict_local(
                model_dir="",
                sources=[str(source)],
                output_prefix=str(tmp_path / "o"),
                model_name=name,
                predictor=predictor,
            )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def _cut_gz(path: Path, text: str, keep: float) -> str:
    """`text` gzipped into `path`, of which only the first `keep` part of the bytes is kept."""
    data = gzip.compress(text.encode())
    path.write_bytes(data[: int(len(data) * keep)])
    return str(path)


@pytest.mark.parametrize(
    "instances_format, keep",
    [("csv", 0.5), ("jsonl", 0.5), ("csv", 0.01)],
    ids=["csv", "jsonl", "csv-header"],
)
def test_a_gz_file_cut_short_stops_the_run_naming_it(
    tmp_path, census_model, census_rows, capsys, instances_format, keep
):
    """A .gz file that ends before its gzip stream does (an interrupted copy) is an error
    naming it, with exit 2 and nothing written; it was predicted as far as it went, with 0
    errors."""
    rows = census_rows * 40
    if instances_format == "csv":
        lines = [",".join(rows[0]), *(",".join(map(str, r.values())) for r in rows)]
    else:
        lines = [json.dumps(r) for r in rows]
    text = "\n".join(lines) + "\n"
    whole = _cut_gz(tmp_path / f"whole.{instances_format}.gz", text, 1.0)
    cut = _cut_gz(tmp_path / f"cut.{instances_format}.gz", text, keep)
    out = tmp_path / "out"
    code = batch.main(
        [
            "local",
            f"--model_dir={census_model}",
            f"--source={whole},{cut}",
            f"--instances_format={instances_format}",
            f"--output_prefix={out}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: --source: ") and cut in last, err
    # Cut in its header (csv-header), the file stops the run where the header is read.
    assert "ends before its gzip stream does" in last, err
    assert not out.exists() or os.listdir(out) == []


@pytest.mark.parametrize(
    "header, message",
    [
        (b"HEADER,age", r"the header of \S+a.csv has empty or repeated column names"),
        (b"HEADER,col\xff", r"cannot read \S+a.csv as CSV text \('utf-8' codec"),
        (b"", r"\S+a.csv is empty; a CSV file needs a header row"),
    ],
    ids=["repeated", "not-utf8", "empty"],
)
def test_a_csv_header_is_read_as_the_trainer_reads_it(
    tmp_path, predictor, census_rows, header, message
):
    """The header of a local batch prediction's CSV file is read by the trainer's reader,
    with its checks: a column named twice (each row's second value was predicted, silently)
    or a header that is not UTF-8 stops the run naming the file, with nothing written."""
    values = ",".join(map(str, census_rows[0].values()))
    text = header.replace(b"HEADER", ",".join(census_rows[0]).encode())
    path = tmp_path / "a.csv"
    path.write_bytes(text + f"\n{values},25\n".encode() if text else b"")
    with pytest.raises(api.DeployError, match=f"^--source: {message}"):
        batch_local.predict_local(
            model_dir="",
            sources=[str(path)],
            predictor=predictor,
            output_prefix=str(tmp_path / "out"),
            instances_format="csv",
            excluded_fields=["col\ufffd"],
        )
    assert not (tmp_path / "out").exists()


def test_a_csv_gz_cut_short_is_not_converted_for_a_vertex_job(gcs, predictor):
    header, *rows = _census_csv_lines(200)
    data = gzip.compress("\n".join([header, *rows]).encode())
    gcs.bucket("test-bucket").blob("in/a.csv.gz").upload_from_string(data[: len(data) // 2])
    csv_job = _csv_job(["gs://test-bucket/in/a.csv.gz"])
    with pytest.raises(
        api.DeployError, match="gs://test-bucket/in/a.csv.gz ends before its gzip stream"
    ):
        batch_convert.convert(csv_job, predictor.fields)
    assert _objects(gcs, "out/") == {}


_KILLED_RUN = """
import sys, time
from deploy.batch_prediction.output import Output
output = Output(sys.argv[1], "killed", 2)
output.add_results(0, b"{}\\n", 1)
print("writing", flush=True)
time.sleep(60)
"""


def test_the_temporary_dir_of_a_killed_run_is_removed_by_the_next_one(
    tmp_path, predictor, census_rows
):
    """A run killed with SIGKILL leaves its temporary dir (it used to stay for ever): the
    next run with the same output prefix removes it, and those of runs still going (their
    lock held) or that may be (unlocked but changed within the hour) are kept."""
    out = tmp_path / "out"
    killed = subprocess.Popen(
        [sys.executable, "-c", _KILLED_RUN, str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        env=task_env(),
    )
    try:
        assert killed.stdout is not None and killed.stdout.readline() == b"writing\n"
    finally:
        killed.kill()
        killed.wait(timeout=30)
    (left,) = out.glob(".tmp-prediction-killed-*")
    live = output.Output(str(out), "live", 1)  # a run going on in this process
    unlocked_old, unlocked_new = out / ".tmp-prediction-old-1", out / ".tmp-prediction-new-1"
    for directory in (unlocked_old, unlocked_new):
        directory.mkdir()
        (directory / "prediction.results-00000-of-00001").write_text("")
    hours_ago = time.time() - 2 * 3600
    for path in (unlocked_old / "prediction.results-00000-of-00001", unlocked_old):
        os.utime(path, (hours_ago, hours_ago))
    source = _write_jsonl(tmp_path / "in.jsonl", census_rows[:3])
    try:
        result = batch_local.predict_local(
            model_dir="", sources=[source], predictor=predictor, output_prefix=str(out)
        )
        assert not left.exists() and not unlocked_old.exists()
        assert Path(live.temp_dir).exists() and unlocked_new.exists()
        assert sorted(os.listdir(result.output_dir)) == [
            "prediction.errors_stats-00000-of-00001",
            "prediction.results-00000-of-00001",
        ]  # no lock file published
    finally:
        live.discard()
    assert sorted(p.name for p in out.iterdir()) == [
        unlocked_new.name,
        os.path.basename(result.output_dir),
    ]


def test_the_temporary_dir_of_a_run_on_another_host_is_kept_until_an_hour_old(
    tmp_path, predictor, census_rows
):
    """A lock is only seen by the machine that holds it: a dir whose lock file names another
    host (an output prefix on NFS or a /gcs/ mount shared by several machines) is its run's
    while anything in it changed within the hour, whether or not its lock looks free here (it
    was removed as dead), and removed once unchanged for an hour."""
    out = tmp_path / "out"
    elsewhere = json.dumps({**output._lock_owner(), "host": "another-host", "pid": 1})
    recent, old = out / ".tmp-prediction-recent-1", out / ".tmp-prediction-old-1"
    for directory in (recent, old):
        directory.mkdir(parents=True)
        (directory / "prediction.results-00000-of-00001").write_text("")
        (directory / ".lock").write_text(elsewhere)  # not locked: as it looks from here
    hours_ago = time.time() - 2 * 3600
    for path in [*old.iterdir(), old]:
        os.utime(path, (hours_ago, hours_ago))
    source = _write_jsonl(tmp_path / "in.jsonl", census_rows[:3])
    result = batch_local.predict_local(
        model_dir="", sources=[source], predictor=predictor, output_prefix=str(out)
    )
    assert sorted(p.name for p in out.iterdir()) == [
        recent.name,
        os.path.basename(result.output_dir),
    ]


def test_vertex_job_through_the_sdk_matches_the_dry_run(cloud_sdk):
    fake, cloud = cloud_sdk
    model = fake.add_model(cloud.parent, "m")
    job = batch_vertex.VertexBatchJob(
        display_name="census-batch",
        model=model.rsplit("/", 1)[1],
        sources=("gs://test-bucket/in/*.jsonl",),
        output_prefix="gs://test-bucket/out",
        max_replica_count=4,
    )
    created = batch_vertex.submit_vertex(cloud, job)
    assert created.name.startswith(f"{cloud.parent}/batchPredictionJobs/")
    assert fake.bodies("batchPredictionJobs.create") == [job.request(cloud).body]


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(sources=("data/in.jsonl",)), "--source"),
        (dict(output_prefix="out"), "--output_prefix"),
        (dict(instances_format="tf-record"), "--instances_format"),
        (dict(starting_replica_count=5), "below --starting_replica_count"),
    ],
)
def test_bad_vertex_jobs_fail_before_any_request(changes, message):
    options = dict(
        display_name="b", model="1", sources=("gs://b/in.jsonl",), output_prefix="gs://b/out"
    )
    with pytest.raises(api.DeployError, match=message):
        batch_vertex.VertexBatchJob(**{**options, **changes})


def test_a_csv_job_is_not_sent_as_csv(cloud_sdk):
    fake, cloud = cloud_sdk
    job = batch_vertex.VertexBatchJob(
        display_name="b",
        model="1",
        sources=("gs://b/in.csv",),
        output_prefix="gs://b/out",
        instances_format="csv",
    )
    with pytest.raises(api.DeployError, match="convert them first"):
        batch_vertex.submit_vertex(cloud, job)
    assert fake.requests == []


# CSV sources for a Vertex job: converted to JSON Lines objects in the bucket first -----------


def _census_csv_lines(count: int) -> list[str]:
    """The header and the first `count` rows of the census test file, as text."""
    from trainer.input.files import CENSUS_TEST

    with gzip.open(CENSUS_TEST, "rt") as f:
        return [line.rstrip("\n") for _, line in zip(range(count + 1), f)]


def _csv_job(
    sources, *, model="1", excluded_fields=("income_bracket",), model_dir=None
) -> batch_convert.ConvertedVertexJob:
    job = batch_vertex.VertexBatchJob(
        display_name="census-csv",
        model=model,
        sources=tuple(sources),
        output_prefix="gs://test-bucket/out",
        instances_format="csv",
    )
    return batch_convert.ConvertedVertexJob.of(
        job, excluded_fields=excluded_fields, model_dir=model_dir
    )


def _objects(gcs, prefix: str) -> dict[str, str]:
    return {b.name: b.download_as_text() for b in gcs.list_blobs("test-bucket", prefix=prefix)}


def test_vertex_csv_job_reads_jsonl_objects_converted_in_the_bucket(
    cloud_sdk, gcs, census_model, predictor, census_rows
):
    fake, cloud = cloud_sdk
    header, *rows = _census_csv_lines(20)
    bad_age = "x" + rows[3][rows[3].index(",") :]
    bucket = gcs.bucket("test-bucket")
    bucket.blob("in/a.csv").upload_from_string(
        "\n".join([header, *rows[:3], bad_age, *rows[3:10]]) + "\n"
    )  # bad_age: line 5
    bucket.blob("in/b.csv.gz").upload_from_string(
        gzip.compress("\n".join([header, *rows[10:20], "1,2"]).encode())
    )  # "1,2": line 12
    # The fake keeps the artifactUri as given: here the local export (TensorFlow reads a
    # gs:// one natively; tests/storage/test_gcs.py covers that route).
    model = fake.add_model(cloud.parent, "census", artifact_uri=census_model)
    csv_job = _csv_job(["gs://test-bucket/in/*.csv", "gs://test-bucket/in/*.csv.gz"], model=model)

    conversion, created = batch_convert.submit_vertex_converted(cloud, csv_job)

    directory = csv_job.instances_dir
    assert directory.startswith("gs://test-bucket/out/instances-")
    prefix = directory.removeprefix("gs://test-bucket/") + "/"
    objects = _objects(gcs, prefix)
    assert sorted(objects) == [
        prefix + "00000-a.jsonl",
        prefix + "00001-b.jsonl",
        prefix + "conversion.errors_stats",
    ]
    converted = [
        json.loads(line)
        for name in sorted(objects)
        if name.endswith(".jsonl")
        for line in objects[name].splitlines()
    ]
    assert converted == census_rows[:20]  # in order, the label dropped, the bad rows out
    kinds = predictor.fields.kinds
    assert all(sorted(row) == sorted(kinds) for row in converted)
    assert all(
        isinstance(row[name], float if kind == NUMBER else str)
        for row in converted
        for name, kind in kinds.items()
    )
    errors = [json.loads(line) for line in objects[prefix + "conversion.errors_stats"].splitlines()]
    assert [e["error"]["message"] for e in errors] == [
        "gs://test-bucket/in/a.csv:5: field 'age' must be a number or empty, got 'x'.",
        "gs://test-bucket/in/b.csv.gz:12: 2 fields, the header has 15 (quote values that "
        "contain commas)",
    ]
    assert errors[0]["instance"]["age"] == "x" and "income_bracket" not in errors[0]["instance"]
    assert (conversion.num_rows, conversion.num_errors) == (20, 2)
    assert conversion.summary() == (
        f"converted for the model: 20 instances, 2 with errors (listed in {directory}/"
        f"conversion.errors_stats); 2 .jsonl file(s) in {directory}/"
    )

    # A GET on the model for its artifactUri, then the job, over exactly the converted files:
    # what a dry run prints.
    requests = csv_job.requests(cloud)
    assert [(r.method, fake.url + r.path) for r in fake.requests] == [
        (r.method, r.url) for r in requests
    ]
    assert created.name.startswith(f"{cloud.parent}/batchPredictionJobs/")
    (body,) = fake.bodies("batchPredictionJobs.create")
    assert body == requests[-1].body
    assert body["inputConfig"] == {
        "instancesFormat": "jsonl",
        "gcsSource": {"uris": [f"{directory}/*.jsonl"]},
    }
    pattern = f"{prefix}*.jsonl"
    assert [n for n in objects if fnmatch.fnmatchcase(n, pattern)] == [
        prefix + "00000-a.jsonl",
        prefix + "00001-b.jsonl",
    ]


@pytest.mark.parametrize(
    "text, excluded, message",
    [
        ("", ["income_bracket"], "a.csv is empty: it needs a header row"),
        (
            "HEADER_WITHOUT_AGE",
            ["income_bracket"],
            "the header has no column age; the model takes age, capital_gain, ",
        ),
        ("HEADER", ["income_bracket", "age"], "no column age once --excluded_fields drops it"),
        (
            "HEADER",
            [],
            "the header names income_bracket, which the model does not take; drop it "
            "with --excluded_fields=income_bracket",
        ),
        (
            "ROWS_ONLY",
            ["income_bracket"],
            r"the first line \(25,Private,226802,.*\) names none "
            "of the model's columns; it must be a header row",
        ),
        (
            "HEADER\nx,1,2\n",
            ["income_bracket"],
            r"no instance of gs://test-bucket/in/a.csv fits "
            r"the model \(gs://test-bucket/in/a.csv:2: 3 "
            r"fields",
        ),
    ],
)
def test_bad_csv_fails_before_anything_is_written(gcs, predictor, text, excluded, message):
    header, *rows = _census_csv_lines(3)
    text = (
        text.replace("HEADER_WITHOUT_AGE", header.replace("age,", "", 1))
        .replace("HEADER", header)
        .replace("ROWS_ONLY", "\n".join(rows))
    )
    gcs.bucket("test-bucket").blob("in/a.csv").upload_from_string(text)
    csv_job = _csv_job(["gs://test-bucket/in/a.csv"], excluded_fields=excluded)
    with pytest.raises(api.DeployError, match=message):
        batch_convert.convert(csv_job, predictor.fields)
    assert _objects(gcs, "out/") == {}


def test_a_bad_header_stops_the_job_before_any_write_or_request(cloud_sdk, gcs, census_model):
    fake, cloud = cloud_sdk
    header, *rows = _census_csv_lines(3)
    bucket = gcs.bucket("test-bucket")
    bucket.blob("in/a.csv").upload_from_string("\n".join([header, *rows]))
    bucket.blob("in/b.csv").upload_from_string("\n".join([header.replace("age,", ""), *rows]))
    csv_job = _csv_job(["gs://test-bucket/in/*.csv"], model_dir=census_model)
    with pytest.raises(api.DeployError, match="b.csv: the header has no column age"):
        batch_convert.submit_vertex_converted(cloud, csv_job)
    assert _objects(gcs, "out/") == {} and fake.requests == []


def test_command_line_dry_run_of_a_csv_job_reads_writes_and_sends_nothing(cloud_sdk, gcs):
    fake, cloud = cloud_sdk
    gcs.bucket("test-bucket").blob("in/a.csv").upload_from_string("not,a,census,header\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.batch",
            "vertex",
            "--project=my-project",
            "--model=7",
            f"--api_endpoint={fake.url}",
            "--source=gs://test-bucket/in/*.csv",
            "--output_prefix=gs://test-bucket/out",
            "--instances_format=csv",
            "--excluded_fields=income_bracket",
            "--dry_run",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )  # the emulator's address in the environment
    assert result.returncode == 0, result.stderr
    get_model, create_job = json.loads(result.stdout)
    model = "projects/my-project/locations/us-central1/models/7"
    assert get_model == {"method": "GET", "url": f"{fake.url}/v1/{model}", "body": None}
    body = create_job["body"]
    assert body["model"] == model
    (uri,) = body["inputConfig"].pop("gcsSource")["uris"]
    assert body["inputConfig"] == {"instancesFormat": "jsonl"}
    assert re.fullmatch(r"gs://test-bucket/out/instances-[0-9_T]+Z/\*\.jsonl", uri)
    directory = uri.removesuffix("/*.jsonl")
    assert (
        f"would convert each CSV file of gs://test-bucket/in/*.csv to {directory}/NNNNN-NAME.jsonl"
    ) in result.stderr
    assert f"in {directory}/conversion.errors_stats" in result.stderr
    assert fake.requests == [] and list(_objects(gcs, "")) == ["in/a.csv"]


@pytest.mark.slow
@pytest.mark.parametrize("as_is", [False, True])
def test_command_line_dry_run_of_a_jsonl_job(as_is):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploy.batch",
            "vertex",
            "--project=my-project",
            "--model=7",
            "--source=gs://b/a.jsonl",
            "--output_prefix=gs://b/out",
            "--dry_run",
            *(["--send_as_is"] if as_is else []),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    *get_model, request = json.loads(result.stdout)
    source = request["body"]["inputConfig"]["gcsSource"]["uris"]
    if as_is:
        assert get_model == [] and source == ["gs://b/a.jsonl"]
    else:  # the model's artifactUri is read, and the job reads the converted files
        assert [r["method"] for r in get_model] == ["GET"]
        assert re.fullmatch(r"gs://b/out/instances-[0-9_TZ]+/\*\.jsonl", source[0]), source
        assert "would convert each JSON Lines file of gs://b/a.jsonl" in result.stderr
    assert request["body"]["inputConfig"]["instancesFormat"] == "jsonl"


@pytest.mark.parametrize("flags", [["--model_dir=gs://b/model"], ["--instances_format=csv"]])
def test_send_as_is_takes_no_conversion_flags(capsys, flags):
    code = batch.main(
        [
            "vertex",
            "--project=my-project",
            "--model=7",
            "--source=gs://b/a.jsonl",
            "--output_prefix=gs://b/out",
            "--send_as_is",
            *flags,
            "--dry_run",
        ]
    )
    assert code == 2
    assert "--send_as_is sends JSON Lines files or a table unconverted" in capsys.readouterr().err


def test_csv_text_that_needs_escaping_and_bytes_that_are_not_utf8(tmp_path, predictor, census_rows):
    """Most rows are written by TensorFlow; a row whose text needs JSON escaping is written
    by Python, and a byte that is not UTF-8 becomes U+FFFD: every line is valid JSON."""
    header = list(census_rows[0])
    odd = {1: 'Say "hi"', 2: "back\\slash", 3: "tab\there"}
    path = tmp_path / "in.csv"
    lines = [",".join(header)]
    for i, row in enumerate(census_rows[:6]):
        values = [str(v) for v in row.values()]
        if i in odd:
            values[1] = '"' + odd[i].replace('"', '""') + '"'
        lines.append(",".join(values))
    path.write_bytes(("\n".join(lines) + "\n").encode().replace(b"Private", b"Priv\xffate"))
    result = batch_local.predict_local(
        model_dir="",
        sources=[str(path)],
        predictor=predictor,
        output_prefix=str(tmp_path / "out"),
        instances_format="csv",
        batch_size=4,
        num_shards=2,
    )
    text = b"".join(Path(f).read_bytes() for f in result.result_files).decode("utf-8")
    records = [json.loads(line) for line in text.splitlines()]
    assert result.num_predictions == len(records) == 6 and result.num_errors == 0
    workclass = {r["instance"]["fnlwgt"]: r["instance"]["workclass"] for r in records}
    for i, value in odd.items():
        assert workclass[census_rows[i]["fnlwgt"]] == value
    assert any("\ufffd" in w for w in workclass.values())  # the byte that is not UTF-8
    # batch k went to file k mod 2: rows 0-3 to the first file, 4-5 to the second
    first = [
        json.loads(line)["instance"]["fnlwgt"]
        for line in Path(result.result_files[0]).read_text().splitlines()
    ]
    assert first == [r["fnlwgt"] for r in census_rows[:4]]


# Keys and fields (Vertex's instanceConfig) ----------------------------------------------------
def _keyed_csv(path, census_rows, count: int) -> list[str]:
    """A CSV of `count` census rows with an id column first and the label last; the ids."""
    ids = [f"row-{i:03d}" for i in range(count)]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", *census_rows[0], "income_bracket"])
        for key, row in zip(ids, census_rows[:count]):
            writer.writerow([key, *row.values(), "<=50K"])
    return ids


def test_a_key_comes_back_on_every_line_in_place_of_the_instance(tmp_path, predictor, census_rows):
    ids = _keyed_csv(tmp_path / "in.csv", census_rows, 30)
    jsonl = _write_jsonl(
        tmp_path / "in.jsonl",
        [{"id": i, **row} for i, row in enumerate(census_rows[:30])],
        bad_lines=[(5, json.dumps(census_rows[0]))],  # line 6: no id
    )
    expected = predictor.predict(census_rows[:30])
    outputs = {}
    for name, source, kind, fields in (
        ("csv", str(tmp_path / "in.csv"), "csv", dict(excluded_fields=["income_bracket"])),
        ("jsonl", jsonl, "jsonl", dict(included_fields=list(census_rows[0]))),
    ):
        result = batch_local.predict_local(
            model_dir="",
            sources=[source],
            predictor=predictor,
            output_prefix=str(tmp_path / name),
            instances_format=kind,
            key_field="id",
            batch_size=8,
            **fields,
        )
        outputs[name] = output.read_results(result.output_dir)
    results, errors = outputs["csv"]
    assert all(set(r) == {"key", "prediction"} for r in results)
    assert [r["key"] for r in results] == ids  # a CSV key is its text
    _assert_same_predictions([r["prediction"] for r in results], expected)
    assert errors == []
    results, errors = outputs["jsonl"]
    assert [r["key"] for r in results] == list(range(30))  # a JSON key keeps its type
    _assert_same_predictions([r["prediction"] for r in results], expected)
    assert [e["error"]["message"] for e in errors] == [f"{jsonl}:6: no field 'id' (--key_field)."]


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            dict(included_fields=["age"], excluded_fields=["income_bracket"]),
            "--included_fields and --excluded_fields are exclusive",
        ),
        (dict(key_field="id", included_fields=["id", "age"]), "leave it out of --included_fields"),
        (dict(key_field="row_id"), "no column row_id (--key_field)"),
        (dict(included_fields=["age"]), "workclass once --included_fields drops them"),
    ],
)
def test_fields_that_cannot_work_fail_before_anything_is_written(
    tmp_path, predictor, census_rows, fields, message
):
    _keyed_csv(tmp_path / "in.csv", census_rows, 3)
    with pytest.raises(api.DeployError, match=re.escape(message)):
        batch_local.predict_local(
            model_dir="",
            sources=[str(tmp_path / "in.csv")],
            predictor=predictor,
            output_prefix=str(tmp_path / "out"),
            instances_format="csv",
            **fields,
        )
    assert not (tmp_path / "out").exists()


def test_a_vertex_job_with_a_key_and_explanations_sends_the_key_for_the_job_to_take_out(
    cloud_sdk, gcs, census_model, census_rows
):
    fake, cloud = cloud_sdk
    header, *rows = _census_csv_lines(5)
    gcs.bucket("test-bucket").blob("in/a.csv").upload_from_string(
        "\n".join([f"id,{header}", *(f"k{i},{row}" for i, row in enumerate(rows))]) + "\n"
    )
    model = fake.add_model(cloud.parent, "census", artifact_uri=census_model)
    job = batch_vertex.VertexBatchJob(
        display_name="census-keys",
        model=model.rsplit("/", 1)[1],
        sources=("gs://test-bucket/in/a.csv",),
        output_prefix="gs://test-bucket/out",
        instances_format="csv",
        explain=True,
    )
    converted = batch_convert.ConvertedVertexJob.of(
        job, excluded_fields=["income_bracket"], key_field="id"
    )
    batch_convert.submit_vertex_converted(cloud, converted)
    prefix = converted.instances_dir.removeprefix("gs://test-bucket/") + "/"
    (name,) = [n for n in _objects(gcs, prefix) if n.endswith(".jsonl")]
    sent = [json.loads(line) for line in _objects(gcs, prefix)[name].splitlines()]
    assert [row.pop("id") for row in sent] == ["k0", "k1", "k2", "k3", "k4"]
    assert sent == census_rows[:5]  # the rest is the model's instance
    (body,) = fake.bodies("batchPredictionJobs.create")  # validated by the discovery document
    assert body["instanceConfig"] == {"keyField": "id"}
    assert body["generateExplanation"] is True  # the explanations a published --explain model gives


def test_array_lines_are_the_values_of_the_included_fields_in_order(
    tmp_path, predictor, census_model, census_rows
):
    """Vertex orders an array instance by includedFields: an array line is read as those
    fields' values; without them, or with a key (an array has no field), it is refused."""
    names = list(predictor.fields.kinds)
    rows = census_rows[:3]
    (tmp_path / "in.jsonl").write_text(
        "\n".join(json.dumps([r[n] for n in names]) for r in rows) + "\n[1, 2]\n"
    )

    def run(**config):
        result = batch_local.predict_local(
            model_dir=census_model,
            sources=[str(tmp_path / "in.jsonl")],
            output_prefix=str(tmp_path / "out"),
            predictor=predictor,
            **config,
        )
        return output.read_results(result.output_dir)

    results, errors = run(included_fields=names)
    expected = predictor.predict([{n: r[n] for n in names} for r in rows])
    np.testing.assert_allclose(
        [r["prediction"]["probabilities"] for r in results],
        [p["probabilities"] for p in expected],
        rtol=1e-6,
    )
    assert [e["error"]["message"].split(": ", 1)[1] for e in errors] == [
        f"2 values, but --included_fields names {len(names)} ({', '.join(names)})."
    ]
    results, errors = run()
    assert (
        results == []
        and "name its values, in order, with --included_fields" in (errors[0]["error"]["message"])
    )
    results, errors = run(key_field="id")
    assert "an array instance has no field 'id' (--key_field)" in errors[0]["error"]["message"]
